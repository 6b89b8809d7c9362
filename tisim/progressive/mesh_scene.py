"""A default scene around a user's cloth mesh file (``tisim refine MESH``)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def scene_for_mesh(
    mesh_path: Path,
    *,
    drape_on: str = "sphere",
    pin: str | None = None,
    wind: tuple[float, float, float] | None = None,
    frames: int = 100,
) -> str:
    """TOML text of a default scene for a cloth mesh file: the mesh centred and laid
    above a sphere, the ground or a box (or pinned and blown by wind). A mesh lying flat
    with ``pin = "top-edge"`` is stood up (rotated 90 degrees about x) so that it hangs
    from its top edge: lying flat, its whole border is its top edge."""
    from tisim.geometry.cloth import load_cloth_mesh
    from tisim.geometry.transforms import euler_xyz_deg

    m = load_cloth_mesh(str(mesh_path))
    x = m.vertices
    lo, hi = x.min(0), x.max(0)
    size = float(np.linalg.norm(hi - lo))
    if size > 100.0 or size < 0.01:
        # the scene is scaled to the mesh (the obstacles, the contact thickness): a cloth
        # modelled in millimetres becomes a sheet a kilometre wide
        log.warning(
            "%s is %.3g m across (its coordinates are read as metres; the scene, its obstacles and "
            "contact thickness are sized to it): if it is in other units, scale the mesh to metres "
            "(e.g. by 0.001 from millimetres) and rerun",
            mesh_path.name,
            size,
        )
    rotation = None
    if pin == "top-edge" and hi[1] - lo[1] <= 1e-3 * size:
        rotation = (90.0, 0.0, 0.0)
        x = x @ euler_xyz_deg(rotation).T
        lo, hi = x.min(0), x.max(0)
    c = 0.5 * (lo + hi)
    lift = 0.25 * size
    lines = [
        "[scene]",
        f'name = "{mesh_path.stem}"',
        (
            f'description = "{mesh_path.name} draped on {"the ground" if drape_on == "ground" else "a " + drape_on} '
            '(written by tisim refine; edit freely)"'
        ),
        "",
        "[sim]",
        "dt = 0.01",
        f"frames = {frames}",
        "",
        "[solver]",
        'type = "cloth"',
        "",
        "[contact]",
        "mu = 0.2",
        f"dhat = {max(1e-4, 1e-3 * size):.3g}",
        f"thickness = {max(1e-4, 1e-3 * size):.3g}",
        "",
        "[objects.cloth]",
        'kind = "cloth"',
        f'mesh = "{mesh_path.resolve()}"',
        "youngs_modulus = 1e5",
        "poisson_ratio = 0.3",
        "thickness = 1e-3",
        "density = 200.0",
        f"translation = [{-c[0]:.6g}, {-lo[1] + lift + (0.35 * size if drape_on != 'ground' else 0):.6g}, {-c[2]:.6g}]",
    ]
    if rotation is not None:
        lines.append(
            f"rotation = [{rotation[0]:g}, {rotation[1]:g}, {rotation[2]:g}]  # stood up to hang from its top edge"
        )
    if pin:
        lines.append(f'pin = "{pin}"')
    lines.append("")
    if drape_on == "sphere":
        lines += [
            "[colliders.sphere]",
            'type = "sphere"',
            f"position = [0.0, {0.2 * size:.6g}, 0.0]",
            f"radius = {0.2 * size:.6g}",
            "",
        ]
    elif drape_on == "box":
        lines += [
            "[colliders.box]",
            'type = "box"',
            f"position = [0.0, {0.15 * size:.6g}, 0.0]",
            f"half_extents = [{0.15 * size:.6g}, {0.15 * size:.6g}, {0.15 * size:.6g}]",
            "",
        ]
    lines += ["[colliders.ground]", 'type = "plane"', "position = [0.0, 0.0, 0.0]", "normal = [0.0, 1.0, 0.0]", ""]
    if wind:
        lines += ["[wind]", f"velocity = [{wind[0]}, {wind[1]}, {wind[2]}]", "gust = 0.5", ""]
    lines += [
        "[camera]",
        f"position = [{1.2 * size:.6g}, {0.9 * size:.6g}, {1.4 * size:.6g}]",
        f"lookat = [0.0, {0.25 * size:.6g}, 0.0]",
        "",
    ]
    return "\n".join(lines)
