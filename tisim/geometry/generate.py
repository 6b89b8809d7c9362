"""Procedural meshes for demos and tests."""

from __future__ import annotations

import numpy as np

from tisim.geometry.mesh import MeshError, TetMesh

# The 6 tets of a cube split along its main diagonal 0-7, with corners numbered
# by bits (x, y, z) = (i & 1, i >> 1 & 1, i >> 2 & 1). All six share the
# diagonal, so neighbouring cubes match face to face without alternation.
_CUBE_TETS = np.array(
    [[0, 1, 3, 7], [0, 3, 2, 7], [0, 2, 6, 7], [0, 6, 4, 7], [0, 4, 5, 7], [0, 5, 1, 7]],
    dtype=np.int32,
)


def _five_tets(corner: int) -> np.ndarray:
    """Five tets of a cube: the four corner tets cut off at corners of one parity
    class around a central tet. ``corner`` is 0 or 1 (which parity class is cut)."""
    cut = [c for c in range(8) if bin(c).count("1") % 2 == corner]
    mid = [c for c in range(8) if bin(c).count("1") % 2 != corner]
    return np.array([[c, c ^ 1, c ^ 2, c ^ 4] for c in cut] + [mid], dtype=np.int32)


def box(
    size=(1.0, 1.0, 1.0),
    resolution=(4, 4, 4),
    center=(0.0, 0.0, 0.0),
    tets_per_cell: int = 5,
) -> TetMesh:
    """A box of tetrahedra on a regular grid.

    size: (3,) edge lengths in metres. resolution: (3,) cells along x, y, z.
    center: (3,) centre of the box. tets_per_cell: 5 (alternating split, the
    common choice in the literature: a 65x8x8 bar has 5,346 vertices and 20,800
    tets) or 6 (all cells split along the same diagonal).
    Vertices: prod(resolution + 1); tets: tets_per_cell * prod(resolution).
    """
    if tets_per_cell not in (5, 6):
        raise MeshError(f"tets_per_cell must be 5 or 6, got {tets_per_cell}")
    size = np.asarray(size, dtype=np.float64).reshape(3)
    res = np.asarray(resolution, dtype=np.int64).reshape(3)
    if np.any(size <= 0):
        raise MeshError(f"box size must be positive, got {size.tolist()}")
    if np.any(res < 1):
        raise MeshError(f"box resolution must be at least 1 along each axis, got {res.tolist()}")
    nx, ny, nz = (int(r) for r in res)
    axes = [np.linspace(-s / 2, s / 2, r + 1) for s, r in zip(size, res)]
    gx, gy, gz = np.meshgrid(*axes, indexing="ij")
    vertices = np.stack([gx.ravel(), gy.ravel(), gz.ravel()], axis=1) + np.asarray(center)

    def vid(i, j, k):
        return (i * (ny + 1) + j) * (nz + 1) + k

    i, j, k = np.meshgrid(np.arange(nx), np.arange(ny), np.arange(nz), indexing="ij")
    i, j, k = i.ravel(), j.ravel(), k.ravel()
    corners = np.stack(
        [vid(i + (c & 1), j + (c >> 1 & 1), k + (c >> 2 & 1)) for c in range(8)], axis=1
    )
    if tets_per_cell == 6:
        tets = corners[:, _CUBE_TETS].reshape(-1, 4)
    else:  # alternate the split so that the diagonals of shared faces agree
        parity = (i + j + k) % 2
        tets = np.where(
            (parity == 0)[:, None, None], corners[:, _five_tets(0)], corners[:, _five_tets(1)]
        ).reshape(-1, 4)
    mesh = TetMesh(vertices, tets)
    vol = mesh.signed_volumes()
    flip = vol < 0
    if np.any(flip):  # keep every tet positively oriented
        t = mesh.tets.copy()
        t[flip, 2], t[flip, 3] = mesh.tets[flip, 3], mesh.tets[flip, 2]
        mesh = TetMesh(vertices, t)
    return mesh
