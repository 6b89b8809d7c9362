"""Write the small meshes the demos may load into assets/ (deterministic).

    python tools/make_assets.py [--out assets]

bunny_like.obj  closed creature-like surface (body, head, two ears, tail), y up,
                feet at y = 0; loaded through load_tet_mesh it is tetrahedralized.
ball_coarse.msh / ball_coarse.vtu  tet ball, radius 0.1 m, from generate.ball.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tisim.geometry.generate import ball, geodesic_sphere
from tisim.geometry.io import save_mesh


def _bump(d: np.ndarray, axis, width: float) -> np.ndarray:
    """Smooth angular bump around unit direction ``axis``: 1 on it, falling off
    like a Gaussian of the angle with standard width ``width`` (radians)."""
    a = np.asarray(axis, dtype=np.float64)
    a /= np.linalg.norm(a)
    angle = np.arccos(np.clip(d @ a, -1.0, 1.0))
    return np.exp(-((angle / width) ** 2))


def bunny_like(frequency: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """A star-shaped 'bunny': a geodesic sphere whose radius depends on direction.

    A radial displacement of a sphere cannot self-intersect, so the result is
    always a closed manifold surface that TetGen can fill. Body ~0.34 m long
    along x, ears up and slightly back. Returns (vertices (n, 3) m, faces (m, 3)).
    """
    s = geodesic_sphere(frequency)
    d = s.vertices
    # Body: an ellipsoid's radial distance, 0.19 x 0.11 x 0.11 m semi-axes.
    semi = np.array([0.19, 0.11, 0.11])
    r = 1.0 / np.sqrt(np.sum((d / semi) ** 2, axis=1))
    r += 0.10 * _bump(d, (0.75, 0.65, 0.0), 0.38)  # head, front and up
    for side in (-1.0, 1.0):  # ears on the head: long and narrow
        r += 0.15 * _bump(d, (0.55, 1.0, 0.22 * side), 0.13)
    r += 0.04 * _bump(d, (-1.0, 0.3, 0.0), 0.25)  # tail
    for side in (-1.0, 1.0):  # haunches and front paws widen the base
        r += 0.035 * _bump(d, (-0.6, -0.6, 0.6 * side), 0.4)
        r += 0.025 * _bump(d, (0.7, -0.7, 0.3 * side), 0.25)
    x = d * r[:, None]
    x[:, 1] -= x[:, 1].min()  # stand on y = 0
    return x, s.faces


def write_obj(path: Path, vertices: np.ndarray, faces: np.ndarray) -> None:
    """Plain OBJ with 6 decimals (meshio's OBJ header holds a timestamp, which
    would make the asset change on every run)."""
    lines = [f"# {path.name}: written by tools/make_assets.py"]
    lines += [f"v {a:.6f} {b:.6f} {c:.6f}" for a, b, c in vertices]
    lines += [f"f {a + 1} {b + 1} {c + 1}" for a, b, c in faces]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "assets")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    v, f = bunny_like()
    write_obj(out / "bunny_like.obj", v, f)
    b = ball(radius=0.1, resolution=6)
    save_mesh(out / "ball_coarse.msh", b.vertices, b.tets)
    save_mesh(out / "ball_coarse.vtu", b.vertices, b.tets)
    for name in ("bunny_like.obj", "ball_coarse.msh", "ball_coarse.vtu"):
        size = (out / name).stat().st_size
        print(f"{out / name}: {size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
