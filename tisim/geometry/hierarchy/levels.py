"""Resolution levels of a cloth hierarchy: a triangle mesh with lumped vertex
masses and optional texture coordinates."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tisim.geometry.mesh import MeshError, _as_cells, _as_vertices


def lumped_masses(vertices: np.ndarray, faces: np.ndarray, areal_density: float) -> np.ndarray:
    """(n,) lumped vertex masses, kg: a third of every incident triangle's area
    times ``areal_density`` (kg/m^2, density times thickness)."""
    x = np.asarray(vertices, dtype=np.float64)
    f = np.asarray(faces)
    area = 0.5 * np.linalg.norm(np.cross(x[f[:, 1]] - x[f[:, 0]], x[f[:, 2]] - x[f[:, 0]]), axis=1)
    m = np.zeros(len(x))
    np.add.at(m, f.ravel(), np.repeat(area * (float(areal_density) / 3.0), 3))
    return m


@dataclass(frozen=True, eq=False)
class Level:
    """One resolution level of a cloth hierarchy.

    vertices: (n, 3) float64 rest positions, metres. faces: (m, 3) int32,
    counter-clockwise seen from the normal side; every vertex is used by a face.
    mass: (n,) float64 lumped vertex masses, kg, positive.
    uv, face_uv: optional texture coordinates: with ``face_uv`` None, ``uv`` is
    (n, 2), one per vertex; otherwise ``uv`` is (k, 2) and ``face_uv`` (m, 3)
    int32 indexes it per face corner (seams allowed).
    """

    vertices: np.ndarray
    faces: np.ndarray
    mass: np.ndarray
    uv: np.ndarray | None = None
    face_uv: np.ndarray | None = None

    def __post_init__(self):
        v = _as_vertices(self.vertices, None)
        f = _as_cells(self.faces, 3, len(v), "faces", None)
        if len(f) == 0:
            raise MeshError("a level needs at least one triangle")
        used = np.zeros(len(v), dtype=bool)
        used[f.ravel()] = True
        if not used.all():
            raise MeshError(f"vertex {int(np.argmin(used))} is not used by any face")
        m = np.ascontiguousarray(np.asarray(self.mass, dtype=np.float64))
        if m.shape != (len(v),):
            raise MeshError(f"mass must have shape ({len(v)},), got {m.shape}")
        if not np.all(np.isfinite(m)) or np.any(m <= 0):
            bad = int(np.argwhere(~(np.isfinite(m) & (m > 0)))[0, 0])
            raise MeshError(f"vertex {bad} has a non-positive or non-finite mass {m[bad]!r}")
        object.__setattr__(self, "vertices", v)
        object.__setattr__(self, "faces", f)
        object.__setattr__(self, "mass", m)
        if self.uv is None:
            if self.face_uv is not None:
                raise MeshError("face_uv given without uv")
            return
        uv = np.ascontiguousarray(np.asarray(self.uv, dtype=np.float64))
        if uv.ndim != 2 or uv.shape[1] != 2:
            raise MeshError(f"uv must have shape (k, 2), got {uv.shape}")
        if self.face_uv is None:
            if len(uv) != len(v):
                raise MeshError(f"per-vertex uv must have {len(v)} rows, got {len(uv)}")
        else:
            fuv = _as_cells(self.face_uv, 3, len(uv), "face_uvs", None)
            if fuv.shape != f.shape:
                raise MeshError(f"face_uv must have shape {f.shape}, got {fuv.shape}")
            object.__setattr__(self, "face_uv", fuv)
        object.__setattr__(self, "uv", uv)

    @classmethod
    def from_mesh(cls, vertices, faces, areal_density: float, uv=None, face_uv=None) -> Level:
        """A level with lumped masses from triangle areas times ``areal_density``
        (kg/m^2 = density * thickness)."""
        rho = float(areal_density)
        if not np.isfinite(rho) or rho <= 0:
            raise MeshError(f"areal_density must be positive, got {areal_density!r}")
        v = _as_vertices(vertices, None)
        f = _as_cells(faces, 3, len(v), "faces", None)
        return cls(v, f, lumped_masses(v, f, rho), uv, face_uv)

    @property
    def vertex_count(self) -> int:
        return len(self.vertices)

    @property
    def face_count(self) -> int:
        return len(self.faces)

    def areas(self) -> np.ndarray:
        """(m,) rest triangle areas, m^2."""
        x = self.vertices[self.faces]
        return 0.5 * np.linalg.norm(np.cross(x[:, 1] - x[:, 0], x[:, 2] - x[:, 0]), axis=1)

    @property
    def area(self) -> float:
        return float(self.areas().sum())

    @property
    def total_mass(self) -> float:
        return float(self.mass.sum())

    @property
    def areal_density(self) -> float:
        """Total mass over total area, kg/m^2."""
        return self.total_mass / self.area

    @property
    def diagonal(self) -> float:
        """Bounding-box diagonal of the rest shape, metres."""
        return float(np.linalg.norm(self.vertices.max(0) - self.vertices.min(0)))

    def with_mass(self, mass: np.ndarray) -> Level:
        return replace(self, mass=mass)
