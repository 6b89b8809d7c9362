"""Tetrahedralize a closed triangle surface with TetGen (PyPI package ``tetgen``).

TetGen aborts the whole process (not a Python exception) on some bad inputs, for
example self-intersecting surfaces, so by default it runs in a child Python
process and a crash there becomes a ``MeshError``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tisim.geometry.mesh import MeshError, TetMesh, TriMesh, tet_signed_volumes

log = logging.getLogger(__name__)

# Quality switches: radius-edge ratio bound and minimum dihedral angle (degrees).
# TetGen's documentation calls 10 degrees a reasonable dihedral bound; tighter
# bounds can make TetGen run for a very long time.
_QUALITY = {"minratio": 1.5, "mindihedral": 10.0}

_CHILD = """
import json, sys
import numpy as np
import tetgen
data = np.load(sys.argv[1])
options = json.loads(sys.argv[3])
try:
    nodes, elems = tetgen.TetGen(data["vertices"], data["faces"]).tetrahedralize(**options)[:2]
except RuntimeError as e:
    sys.stderr.write(" ".join(str(e).split()) + "\\n")
    sys.exit(3)
nodes = np.asarray(nodes, dtype=np.float64)
np.savez(sys.argv[2], nodes=nodes, elems=np.asarray(elems, dtype=np.int64))
"""


def tetrahedralize(
    surface: TriMesh,
    max_volume: float | None = None,
    quality: bool | dict = True,
    *,
    isolated: bool = True,
    timeout: float = 600.0,
) -> TetMesh:
    """Fill a closed triangle surface with tetrahedra.

    surface: a closed, manifold, non-self-intersecting TriMesh (metres); its
    winding does not matter. max_volume: target bound on tet volume in m^3 (None:
    no bound, TetGen only adds the points quality needs); TetGen applies it while
    refining, and its final smoothing can leave a few tets up to about 1.3 times
    larger. quality: ask TetGen for a radius-edge ratio below 1.5 and dihedral
    angles above 10 degrees (switches ``-q1.5/10``); a dict {"minratio": r,
    "mindihedral": deg} sets those two bounds (scene keys
    ``objects.NAME.tet_radius_edge_ratio`` / ``tet_min_dihedral``). isolated: run TetGen in a
    child process so that a crash inside it raises ``MeshError`` instead of
    killing this process (costs about 0.1 to 0.5 s). timeout: seconds before the
    child is stopped.

    Returns a positively oriented TetMesh whose boundary is the input surface
    (TetGen may insert extra points in its triangles for quality) and whose
    ``source`` is the surface's. Deterministic for a given input.

    Raises MeshError naming ``surface.source`` when the surface is open or
    non-manifold, or when TetGen fails.

    Limitations: the surface is not repaired; self-intersections are only
    detected by TetGen failing. With ``isolated=False``, TetGen may write
    ``_skipped.*`` files into the working folder when it fails.
    """
    src = surface.source
    faces = surface.faces
    if len(faces) < 4:
        raise MeshError(f"cannot tetrahedralize a surface of {len(faces)} triangles", src)
    e = np.sort(faces[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2), axis=1)
    _, counts = np.unique(e, axis=0, return_counts=True)
    if np.any(counts == 1):
        raise MeshError(
            f"surface is not closed ({int(np.sum(counts == 1))} boundary edges); "
            "only a closed surface can be filled with tetrahedra",
            src,
        )
    if np.any(counts > 2):
        raise MeshError(
            f"surface is not manifold ({int(np.sum(counts > 2))} edges shared by more than two triangles)",
            src,
        )
    used = np.unique(faces)
    vertices = surface.vertices[used]
    faces = np.searchsorted(used, faces).astype(np.int32)

    # nomergefacet: TetGen would otherwise merge nearly coplanar input triangles
    # and re-triangulate them, moving the surface slightly.
    options: dict = {"quality": bool(quality), "quiet": True, "nomergefacet": True}
    if quality:
        options.update(_QUALITY)
        if isinstance(quality, dict):
            options.update({k: float(v) for k, v in quality.items() if k in _QUALITY})
    if max_volume is not None:
        if not max_volume > 0:
            raise MeshError(f"max_volume must be positive, got {max_volume}", src)
        # TetGen only enforces a volume bound while refining, which is its
        # quality mode; without quality, refine for volume with a loose shape bound.
        options.update(quality=True, maxvolume=float(max_volume), fixedvolume=True)
        options.setdefault("minratio", 10.0)

    if isolated:
        nodes, elems = _run_child(vertices, faces, options, timeout, src)
    else:
        import tetgen

        try:
            nodes, elems = tetgen.TetGen(vertices, faces).tetrahedralize(**options)[:2]
        except RuntimeError as err:
            raise MeshError(f"TetGen failed: {' '.join(str(err).split())}", src) from None
    nodes = np.asarray(nodes, dtype=np.float64)
    elems = np.asarray(elems, dtype=np.int64)
    if len(elems) == 0:
        raise MeshError("TetGen produced no tetrahedra", src)
    # TetGen already returns positive tets in our convention; make sure of it.
    vol = tet_signed_volumes(nodes, elems)
    flip = vol < 0
    if np.any(flip):
        elems[flip, 2], elems[flip, 3] = elems[flip, 3].copy(), elems[flip, 2].copy()
    used = np.unique(elems)
    if len(used) < len(nodes):
        nodes = nodes[used]
        elems = np.searchsorted(used, elems)
    log.debug("TetGen: %d vertices, %d tets from %d triangles", len(nodes), len(elems), len(faces))
    return TetMesh(nodes, elems, source=src)


SLIVER_DIHEDRAL = 5.0  # degrees: a tet whose smallest dihedral angle is below this is a sliver


def min_dihedral_angles(vertices: np.ndarray, tets: np.ndarray) -> np.ndarray:
    """(m,) the smallest of the six dihedral angles of every tet, degrees (a measure of
    its quality: 70.5 for the regular tet, near 0 for a sliver or a needle)."""
    x = np.asarray(vertices, dtype=np.float64)[np.asarray(tets)]
    out = np.full(len(x), 180.0)
    # the dihedral angle at edge (i, j) is between the faces that hold it: (i, j, k), (i, j, l)
    for i, j, k, l in ((0, 1, 2, 3), (0, 2, 1, 3), (0, 3, 1, 2), (1, 2, 0, 3), (1, 3, 0, 2), (2, 3, 0, 1)):
        e = x[:, j] - x[:, i]
        e /= np.maximum(np.linalg.norm(e, axis=1), 1e-300)[:, None]
        a = x[:, k] - x[:, i]
        b = x[:, l] - x[:, i]
        a -= (a * e).sum(1)[:, None] * e
        b -= (b * e).sum(1)[:, None] * e
        c = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-300)
        out = np.minimum(out, np.degrees(np.arccos(np.clip(c, -1.0, 1.0))))
    return out


def warn_slivers(mesh: TetMesh, key: str) -> int:
    """Log one warning when ``mesh`` has slivers (smallest dihedral angle below
    SLIVER_DIHEDRAL degrees), naming ``key``, the count and the worst angle; returns the
    count. Slivers make the elastic solve stiff and invert first under load."""
    ang = min_dihedral_angles(mesh.vertices, mesh.tets)
    bad = int(np.count_nonzero(ang < SLIVER_DIHEDRAL))
    if bad:
        log.warning(
            "%s (%s): %d of %d tets are slivers (smallest dihedral angle %.2g degrees, below %g); "
            "remesh it, or give a closed surface for TetGen to fill",
            key,
            mesh.source,
            bad,
            len(ang),
            float(ang.min()),
            SLIVER_DIHEDRAL,
        )
    return bad


def _run_child(vertices, faces, options, timeout, src):
    with tempfile.TemporaryDirectory(prefix="tisim-tetgen-") as tmp:
        inp, out = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(inp, vertices=vertices, faces=faces)
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD, str(inp), str(out), json.dumps(options)],
                capture_output=True,
                text=True,
                check=False,
                cwd=tmp,  # TetGen drops _skipped.* debug files in the working folder
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise MeshError(f"TetGen did not finish within {timeout:g} s", src) from None
        if proc.returncode != 0 or not out.exists():
            last = [line for line in proc.stderr.splitlines() if line.strip()]
            why = last[-1].strip() if last else f"exit status {proc.returncode}"
            if proc.returncode < 0 or proc.returncode == 134:
                why = f"TetGen crashed ({why}); the surface may intersect itself"
            raise MeshError(f"TetGen failed: {why}", src)
        with np.load(out) as data:
            return data["nodes"], data["elems"]
