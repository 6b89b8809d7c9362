"""Multi-resolution cloth hierarchies and the shell prolongation operator.

A coarse cloth mesh is simulated as a preview and finer levels follow it
(progressive dynamics, note ``progressive-dynamics.md`` §2.1, §2.5, §5.1, §5.3
and §7 "Prolongation of the progressive shell work"). This module builds the
levels (triangle meshes with lumped masses) and the prolongation operators
between them, in plain numpy/scipy:

    P(x) = U x + a(x),      a_i(x) = gamma_i n_h(x) + R_h(x) t_i,

with ``U`` a sparse (n_fine, n_coarse) matrix whose rows sum to one (the
intrinsic part) and ``a`` the extrinsic offset of every fine vertex stored in
the frame of a coarse *host triangle* h: ``n_h`` its unit normal and
``R_h = [e, n x e]`` its tangent frame, ``e`` the normalised host edge x1 - x0.
The rest offsets gamma_i (normal part, metres) and t_i (tangential part, (2,),
metres) are chosen so that P reproduces the finer rest shape exactly.
Velocities prolongate with ``V = U`` and forces restrict with ``U^T`` (offsets
lagged), as in §2.2.

Three ways to get levels:

* ``loop_subdivide`` / ``build_hierarchy(method="loop"|"midpoint")``: nested
  1-to-4 refinement; U is the subdivision matrix and the fine rest shape is
  U X, so the offsets vanish at rest (the host frames are still stored so
  every operator is applied the same way).
* ``decimate`` + ``embed`` / ``build_hierarchy(method="decimate")``: quadric
  edge-collapse decimation (the ``fast-simplification`` package) of a given
  fine mesh; every fine vertex is embedded at its closest point on the coarse
  rest surface (three non-zeros per row of U, §7).
* ``from_meshes``: user-given levels, embedded the same way and checked.

Direct prolongations from level l to the finest level L (what the coarse
preview uses for Psi_L(P_l(x)), §5.9) are built by re-embedding the finest
vertices into level l (``direct``) for unstructured levels, or by composing
the linear parts and recomputing the offsets between l and L (``compose``) for
subdivision levels; see those functions for what agrees and what does not.

Nothing here imports Taichi.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from scipy.spatial import cKDTree

from tisim.geometry.mesh import MeshError, _as_cells, _as_vertices
from tisim.geometry.topology import boundary_edges

log = logging.getLogger(__name__)

__all__ = [
    "DirectProlongation",
    "Hierarchy",
    "Level",
    "Prolongation",
    "build_hierarchy",
    "compose",
    "decimate",
    "direct",
    "embed",
    "from_meshes",
    "identity",
    "lumped_masses",
    "loop_subdivide",
]

# A host triangle whose doubled area is below this fraction of the squared
# bounding-box diagonal has no usable frame; such triangles are never chosen as
# hosts. Far above the round-off of a cross product (~1e-16 relative).
_DEGENERATE_AREA = 1e-14

# Default allowed embedding distance between consecutive levels, as a fraction
# of the finer level's bounding-box diagonal. Measured: a unit sphere decimated
# from 642 to 100 vertices lies within 0.9% of its fine mesh; a square cloth
# decimated to 80-300 vertices within 2-7%, all of it at the corners the
# decimator cuts (interior vertices are exactly on the coarse surface). 10%
# still rejects levels that are plainly different shapes (scaled, shifted,
# another object).
DEFAULT_MAX_DISTANCE = 0.1

# A mesh whose extent across its best-fit plane is at most this fraction of its
# bounding-box diagonal is decimated as exactly flat (see ``_decimation_frame``).
# Covers coordinates rounded to float32 (~6e-8 relative) with margin and is far
# below any relief a cloth has on purpose (1 um on a 1 m sheet).
_FLAT_EXTENT = 1e-6


# ---------------------------------------------------------------------------
# Levels


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
    def from_mesh(
        cls, vertices, faces, areal_density: float, uv=None, face_uv=None
    ) -> Level:
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


# ---------------------------------------------------------------------------
# Prolongation operator


def _face_frames(x: np.ndarray, faces: np.ndarray):
    """Unit edge e = (x1 - x0)/|.|, unit normal n, and b = n x e of every face:
    three (m, 3) arrays. A degenerate face gets zero vectors (its offsets
    collapse to nothing rather than NaN)."""
    p0, p1, p2 = x[faces[:, 0]], x[faces[:, 1]], x[faces[:, 2]]
    e1 = p1 - p0
    c = np.cross(e1, p2 - p0)
    ln = np.linalg.norm(c, axis=1, keepdims=True)
    le = np.linalg.norm(e1, axis=1, keepdims=True)
    tiny = np.finfo(np.float64).tiny
    n = c / np.maximum(ln, tiny)
    e = e1 / np.maximum(le, tiny)
    return e, np.cross(n, e), n


@dataclass(frozen=True, eq=False)
class Prolongation:
    """Shell prolongation P(x) = U x + a(x) from a coarse level to a fine level.

    U: (n_fine, n_coarse) scipy.sparse.csr_matrix, rows sum to one.
    coarse_faces: (m_c, 3) int32, the coarse triangles hosts refer to.
    host: (n_fine,) int32, host triangle of every fine vertex (index into coarse_faces).
    bary: (n_fine, 3) float64, barycentric coordinates of the fine vertex's host
        point in its host triangle (its closest rest point for embeddings; the
        coarse vertex or edge midpoint it refines for subdivisions). For
        embeddings the row of U holds exactly these weights.
    gamma: (n_fine,) float64, metres, normal part of the rest offset
        d_i = X_fine_i - (U X_coarse)_i in the rest host frame.
    tangent: (n_fine, 2) float64, metres, its tangential part (along e, n x e).
    distance: (n_fine,) float64, metres, |X_fine_i - host point| at rest (the
        embedding distance).
    coarse_rest: (n_c, 3), fine_rest: (n_f, 3): the rest shapes, metres.

    Differentiation treats the offsets as constant (§2.2): ``velocity`` is U v,
    ``restrict`` is U^T g and ``restrict_hessian`` is U^T H U.
    """

    U: sp.csr_matrix
    coarse_faces: np.ndarray
    host: np.ndarray
    bary: np.ndarray
    gamma: np.ndarray
    tangent: np.ndarray
    distance: np.ndarray
    coarse_rest: np.ndarray
    fine_rest: np.ndarray

    def __post_init__(self):
        U = sp.csr_matrix(self.U, dtype=np.float64)
        U.sort_indices()
        nf, nc = U.shape
        if self.fine_rest.shape != (nf, 3) or self.coarse_rest.shape != (nc, 3):
            raise MeshError(
                f"U has shape {U.shape} but the rest shapes are {self.fine_rest.shape} "
                f"and {self.coarse_rest.shape}"
            )
        faces = np.asarray(self.coarse_faces, dtype=np.int32)
        host = np.asarray(self.host, dtype=np.int32)
        if host.shape != (nf,) or (nf and (host.min() < 0 or host.max() >= len(faces))):
            raise MeshError(f"host must be ({nf},) indices into {len(faces)} coarse faces")
        for name, shape in (("bary", (nf, 3)), ("gamma", (nf,)), ("tangent", (nf, 2)),
                            ("distance", (nf,))):  # fmt: skip
            value = np.asarray(getattr(self, name), dtype=np.float64)
            if value.shape != shape:
                raise MeshError(f"{name} must have shape {shape}, got {value.shape}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "U", U)
        object.__setattr__(self, "coarse_faces", faces)
        object.__setattr__(self, "host", host)

    @property
    def fine_count(self) -> int:
        return self.U.shape[0]

    @property
    def coarse_count(self) -> int:
        return self.U.shape[1]

    @cached_property
    def U3(self) -> sp.csr_matrix:
        """(3 n_fine, 3 n_coarse) U kron I_3, for vertex-major dofs (3 i + k)."""
        return sp.kron(self.U, sp.identity(3, format="csr"), format="csr")

    def offsets(self, x_coarse: np.ndarray) -> np.ndarray:
        """(n_fine, 3) a(x) = gamma n(x) + R(x) t, metres, with n and R the
        deformed host triangles' unit normal and frame [e, n x e]."""
        x = np.asarray(x_coarse, dtype=np.float64).reshape(self.coarse_count, 3)
        e, b, n = _face_frames(x, self.coarse_faces)
        h = self.host
        return (
            self.gamma[:, None] * n[h]
            + self.tangent[:, 0:1] * e[h]
            + self.tangent[:, 1:2] * b[h]
        )

    def apply(self, x_coarse: np.ndarray) -> np.ndarray:
        """(n_fine, 3) P(x) = U x + a(x), metres, from (n_coarse, 3) positions."""
        x = np.asarray(x_coarse, dtype=np.float64).reshape(self.coarse_count, 3)
        return self.U @ x + self.offsets(x)

    __call__ = apply

    def velocity(self, v_coarse: np.ndarray) -> np.ndarray:
        """(n_fine, 3) V v = U v, m/s (offsets held fixed, §2.2)."""
        v = np.asarray(v_coarse, dtype=np.float64).reshape(self.coarse_count, -1)
        return self.U @ v

    def restrict(self, g_fine: np.ndarray) -> np.ndarray:
        """U^T g: fine forces or gradients back to the coarse level (offsets
        lagged). g: (n_fine,), (n_fine, d) or flat (3 n_fine,) vertex-major;
        the result has the matching coarse layout."""
        g = np.asarray(g_fine, dtype=np.float64)
        if g.ndim == 1 and g.shape[0] == 3 * self.fine_count:
            return (self.U.T @ g.reshape(-1, 3)).ravel()
        return self.U.T @ g

    def restrict_hessian(self, H_fine) -> sp.csr_matrix:
        """U^T H U (sparse). H: (n_fine, n_fine) per-vertex (e.g. a mass matrix)
        or (3 n_fine, 3 n_fine) with vertex-major dofs 3 i + k."""
        H = sp.csr_matrix(H_fine)
        if H.shape == (self.fine_count, self.fine_count):
            U = self.U
        elif H.shape == (3 * self.fine_count, 3 * self.fine_count):
            U = self.U3
        else:
            raise ValueError(
                f"H must be ({self.fine_count}, {self.fine_count}) or "
                f"({3 * self.fine_count}, {3 * self.fine_count}), got {H.shape}"
            )
        return (U.T @ H @ U).tocsr()

    def rest_error(self) -> float:
        """max |P(X_coarse) - X_fine|, metres (round-off for a correct operator)."""
        return float(np.abs(self.apply(self.coarse_rest) - self.fine_rest).max())


# The brief's name for an operator from a level straight to the finest level:
# it has exactly the structure of a one-level operator (U plus host offsets
# recomputed between the two levels), so it is the same class.
DirectProlongation = Prolongation


def _with_offsets(
    U: sp.csr_matrix,
    coarse_rest: np.ndarray,
    coarse_faces: np.ndarray,
    fine_rest: np.ndarray,
    host: np.ndarray,
    bary: np.ndarray,
    distance: np.ndarray,
) -> Prolongation:
    """A Prolongation with rest offsets d = X_fine - U X_coarse expressed in
    the rest host frames, so P(X_coarse) = X_fine to round-off."""
    U = sp.csr_matrix(U)
    d = fine_rest - U @ coarse_rest
    e, b, n = _face_frames(coarse_rest, coarse_faces)
    h = host
    gamma = np.einsum("ij,ij->i", d, n[h])
    tangent = np.stack([np.einsum("ij,ij->i", d, e[h]), np.einsum("ij,ij->i", d, b[h])], axis=1)
    return Prolongation(
        U=U,
        coarse_faces=coarse_faces,
        host=host,
        bary=bary,
        gamma=gamma,
        tangent=tangent,
        distance=distance,
        coarse_rest=coarse_rest,
        fine_rest=fine_rest,
    )


def identity(level: Level) -> Prolongation:
    """P = identity on ``level`` (P_L of the finest level): U = I, zero offsets,
    every vertex hosted at its own corner of its first incident face."""
    n = level.vertex_count
    flat = level.faces.ravel()
    _, first = np.unique(flat, return_index=True)
    host = (first // 3).astype(np.int32)
    bary = np.zeros((n, 3))
    bary[np.arange(n), first % 3] = 1.0
    return _with_offsets(
        sp.identity(n, format="csr"),
        level.vertices,
        level.faces,
        level.vertices,
        host,
        bary,
        np.zeros(n),
    )


# ---------------------------------------------------------------------------
# Closest points on a triangle mesh (embedding)


def _closest_on_triangles(p, a, b, c):
    """Closest points of p on triangles (a, b, c), all (N, 3): barycentric
    weights (N, 3) of (a, b, c), clamped into the triangle. Voronoi-region
    classification (Ericson, Real-Time Collision Detection §5.1.5), vectorised."""
    ab, ac = b - a, c - a
    ap, bp, cp = p - a, p - b, p - c
    d1 = np.einsum("ij,ij->i", ab, ap)
    d2 = np.einsum("ij,ij->i", ac, ap)
    d3 = np.einsum("ij,ij->i", ab, bp)
    d4 = np.einsum("ij,ij->i", ac, bp)
    d5 = np.einsum("ij,ij->i", ab, cp)
    d6 = np.einsum("ij,ij->i", ac, cp)
    va = d3 * d6 - d5 * d4
    vb = d5 * d2 - d1 * d6
    vc = d1 * d4 - d3 * d2
    w = np.empty((len(p), 3))
    with np.errstate(divide="ignore", invalid="ignore"):
        # Interior first; the regions below override it in reverse priority, so
        # the earliest test in Ericson's order wins where several hold.
        s = va + vb + vc
        v_in, w_in = vb / s, vc / s
        w[:] = np.stack([1.0 - v_in - w_in, v_in, w_in], axis=1)
        t = (d4 - d3) / ((d4 - d3) + (d5 - d6))
        m = (va <= 0) & (d4 - d3 >= 0) & (d5 - d6 >= 0)
        w[m] = np.stack([np.zeros(m.sum()), 1.0 - t[m], t[m]], axis=1)
        t = d2 / (d2 - d6)
        m = (vb <= 0) & (d2 >= 0) & (d6 <= 0)
        w[m] = np.stack([1.0 - t[m], np.zeros(m.sum()), t[m]], axis=1)
        m = (d6 >= 0) & (d5 <= d6)
        w[m] = (0.0, 0.0, 1.0)
        t = d1 / (d1 - d3)
        m = (vc <= 0) & (d1 >= 0) & (d3 <= 0)
        w[m] = np.stack([1.0 - t[m], t[m], np.zeros(m.sum())], axis=1)
        m = (d3 >= 0) & (d4 <= d3)
        w[m] = (0.0, 1.0, 0.0)
        m = (d1 <= 0) & (d2 <= 0)
        w[m] = (1.0, 0.0, 0.0)
    # Clamp round-off (a point on an edge can come out at -1e-17) and renormalise.
    w = np.clip(np.nan_to_num(w, nan=1.0 / 3.0), 0.0, 1.0)
    return w / w.sum(axis=1, keepdims=True)


def _closest_on_surface(points: np.ndarray, vertices: np.ndarray, faces: np.ndarray, k0: int = 8):
    """For every point, the closest point on the triangle surface (vertices, faces).

    Returns host (N,) int32 face index, bary (N, 3) weights of that face's
    corners, distance (N,) metres. Candidates come from a cKDTree over face
    centroids, k nearest at a time; a point is finished once the k-th
    candidate centroid is farther than its best distance plus the largest
    centroid-to-corner radius (no unchecked triangle can then be closer), so
    the result is the exact closest triangle, not a heuristic. Degenerate
    triangles are never hosts.
    """
    points = np.asarray(points, dtype=np.float64)
    tri = vertices[faces]  # (m, 3, 3)
    diag = float(np.linalg.norm(vertices.max(0) - vertices.min(0))) or 1.0
    area2 = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    valid = np.flatnonzero(area2 > _DEGENERATE_AREA * diag**2)
    if len(valid) == 0:
        raise MeshError("every triangle of the coarse level is degenerate")
    tri = tri[valid]
    centroid = tri.mean(axis=1)
    radius = float(np.linalg.norm(tri - centroid[:, None, :], axis=2).max())
    tree = cKDTree(centroid)
    n = len(points)
    host = np.zeros(n, dtype=np.int64)
    bary = np.zeros((n, 3))
    dist = np.full(n, np.inf)
    todo = np.arange(n)
    k = min(k0, len(valid))
    while todo.size:
        cd, idx = tree.query(points[todo], k=k)
        cd, idx = cd.reshape(len(todo), k), idx.reshape(len(todo), k)
        p = np.repeat(points[todo], k, axis=0)
        t = tri[idx.ravel()]
        w = _closest_on_triangles(p, t[:, 0], t[:, 1], t[:, 2])
        q = np.einsum("ij,ijk->ik", w, t)
        d = np.linalg.norm(p - q, axis=1).reshape(len(todo), k)
        j = np.argmin(d, axis=1)
        rows = np.arange(len(todo))
        better = d[rows, j] < dist[todo]
        sel = todo[better]
        host[sel] = idx[rows, j][better]
        bary[sel] = w.reshape(len(todo), k, 3)[rows, j][better]
        dist[sel] = d[rows, j][better]
        if k == len(valid):
            break
        done = cd[:, -1] - radius >= dist[todo]
        todo = todo[~done]
        k = min(2 * k, len(valid))
    return valid[host].astype(np.int32), bary, dist


def _barycentric_matrix(host, bary, faces, n_coarse) -> sp.csr_matrix:
    n = len(host)
    rows = np.repeat(np.arange(n), 3)
    cols = faces[host].ravel()
    return sp.csr_matrix((bary.ravel(), (rows, cols)), shape=(n, n_coarse))


def _lean_on_every_vertex(points, xc, fc, host, bary, dist) -> int:
    """Re-host fine vertices (in place) so that every coarse vertex of a non-degenerate
    triangle gets a non-zero weight: a coarse vertex that no fine vertex leans on has no
    consistent mass (U^T m = 0) and no influence on P(x), a singular degree of freedom.
    Such vertices appear at the corners of holes, of separate pieces and of bow-ties,
    where the closest points of the fine vertices around land on the coarse triangles'
    edges. The fine vertex nearest to such a corner j (one not needed by another
    corner) is embedded at j itself, in j's largest incident triangle: its rest offset
    X_i - X_j is stored in that triangle's frame, so P(X_coarse) = X_fine still holds
    exactly. Returns the number of vertices re-hosted."""
    n_c = len(xc)
    tri = xc[fc]
    area2 = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    diag = float(np.linalg.norm(xc.max(0) - xc.min(0))) or 1.0
    valid = area2 > _DEGENERATE_AREA * diag**2
    in_valid = np.zeros(n_c, dtype=bool)
    in_valid[fc[valid].ravel()] = True
    w = np.bincount(fc[host].ravel(), weights=bary.ravel(), minlength=n_c)
    tiny = 1e-9
    bare = np.flatnonzero((w <= tiny) & in_valid)
    if not len(bare):
        return 0
    tree = cKDTree(points)
    moved = 0
    for j in bare:
        tris = np.flatnonzero(valid & (fc == j).any(axis=1))
        t = int(tris[np.argmax(area2[tris])])
        k = min(len(points), 32)
        _, idx = tree.query(xc[j], k=k)
        for i in np.atleast_1d(idx):
            old = fc[host[i]]
            # leaving its host must not leave another corner bare
            if all(w[c] - b > tiny or b <= tiny for c, b in zip(old, bary[i])):
                break
        else:
            continue
        w[fc[host[i]]] -= bary[i]
        host[i] = t
        bary[i] = (fc[t] == j).astype(np.float64)
        dist[i] = float(np.linalg.norm(points[i] - xc[j]))
        w[j] += 1.0
        moved += 1
    if moved:
        log.debug("embedding: %d fine vertices re-hosted on coarse corners no other leaned on", moved)
    return moved


def embed(
    fine_level: Level, coarse_level: Level, *, zero_mean_tangent: bool = False
) -> Prolongation:
    """Embed every fine vertex at its closest point on the coarse rest surface.

    The row of U holds the barycentric weights of that point in its host
    triangle (three non-zeros, clamped into the triangle, rows sum to one) and
    the remaining rest offset d_i = X_fine_i - (U X_coarse)_i is stored in the
    host frame (§7), so ``P(X_coarse) = X_fine`` to round-off. When the
    closest point is inside its triangle d is normal to it (t_i = 0); points
    whose closest point lies on a coarse edge or corner (outside the coarse
    boundary, on the convex side of a fold) also get a tangential part.

    zero_mean_tangent: make sum_{i hosted by f} m_i t_i = 0 for every coarse
        face f (m = fine masses), keeping exactness: the mass-weighted mean
        tangential offset of each host is moved into U (it lies in the host's
        plane, so it is a shift of barycentric weights that sum to zero). The
        weights may then leave [0, 1]. The normal part cannot be moved into a
        three-point stencil on the host (its corners span no normal
        direction), so sum m_i gamma_i n_f(x) remains; it is zero on flat
        meshes. See ``build_hierarchy`` for what §5.3 needs.
    """
    xc, fc = coarse_level.vertices, coarse_level.faces
    host, bary, dist = _closest_on_surface(fine_level.vertices, xc, fc)
    _lean_on_every_vertex(fine_level.vertices, xc, fc, host, bary, dist)
    if zero_mean_tangent:
        U0 = _barycentric_matrix(host, bary, fc, len(xc))
        p0 = _with_offsets(U0, xc, fc, fine_level.vertices, host, bary, dist)
        m = fine_level.mass
        mf = np.bincount(host, weights=m, minlength=len(fc))
        mu = np.stack(
            [np.bincount(host, weights=m * p0.tangent[:, c], minlength=len(fc)) for c in (0, 1)],
            axis=1,
        ) / np.maximum(mf, np.finfo(np.float64).tiny)[:, None]
        e, b, _ = _face_frames(xc, fc)
        delta = mu[:, :1] * e + mu[:, 1:] * b  # (m_c, 3) mean tangential offset, world
        # Weights shift (-s-r, s, r) with s (X1-X0) + r (X2-X0) = delta.
        e1 = xc[fc[:, 1]] - xc[fc[:, 0]]
        e2 = xc[fc[:, 2]] - xc[fc[:, 0]]
        g11 = np.einsum("ij,ij->i", e1, e1)
        g12 = np.einsum("ij,ij->i", e1, e2)
        g22 = np.einsum("ij,ij->i", e2, e2)
        r1 = np.einsum("ij,ij->i", e1, delta)
        r2 = np.einsum("ij,ij->i", e2, delta)
        det = g11 * g22 - g12 * g12
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(det > 0, (g22 * r1 - g12 * r2) / det, 0.0)
            r = np.where(det > 0, (g11 * r2 - g12 * r1) / det, 0.0)
        shift = np.stack([-s - r, s, r], axis=1)
        weights = bary + shift[host]
        U = _barycentric_matrix(host, weights, fc, len(xc))
    else:
        U = _barycentric_matrix(host, bary, fc, len(xc))
    return _with_offsets(U, xc, fc, fine_level.vertices, host, bary, dist)


def direct(coarse_level: Level, fine_level: Level) -> Prolongation:
    """Direct prolongation from ``coarse_level`` (level l) to ``fine_level``
    (level L): the finest vertices embedded straight into level l's triangles,
    host offsets recomputed between l and L (§7). Same as
    ``embed(fine_level, coarse_level)``.

    Against the composition of per-level operators: both are partitions of
    unity and both reproduce X_L from X_l exactly, but their linear parts
    differ in general (U_direct has three non-zeros per row; U_12 U_01 has up
    to nine for embeddings and the wide Loop stencil for subdivisions). They
    coincide for midpoint subdivision, where U_12 U_01 is the piecewise-linear
    (barycentric) interpolation of the fine vertices in the coarse triangles.
    """
    return embed(fine_level, coarse_level)


def compose(*prolongations: Prolongation) -> Prolongation:
    """One operator from the first prolongation's coarse level to the last
    one's fine level: linear part U = U_{L-1,L} ... U_{l,l+1} (so V and U^T
    compose exactly), host offsets recomputed between the two end levels
    (every finest vertex is hosted by its closest level-l rest triangle), not
    composed from the per-level offsets (§7). ``compose(P_01, P_12)`` maps
    level 0 to level 2. P(X_0) = X_2 holds to round-off.

    The composed operator differs from the nested application
    P_12(P_01(x)) away from the rest shape unless the per-level offsets vanish
    identically (pure subdivision hierarchies, where they are equal).
    """
    if not prolongations:
        raise ValueError("compose needs at least one prolongation")
    for k in range(len(prolongations) - 1):
        a, b = prolongations[k], prolongations[k + 1]
        if a.fine_count != b.coarse_count or not np.allclose(a.fine_rest, b.coarse_rest):
            raise MeshError(
                f"prolongation {k + 1} does not start on the level prolongation {k} ends on"
            )
    U = prolongations[0].U
    for p in prolongations[1:]:
        U = p.U @ U
    first, last = prolongations[0], prolongations[-1]
    host, bary, dist = _closest_on_surface(last.fine_rest, first.coarse_rest, first.coarse_faces)
    return _with_offsets(
        U.tocsr(), first.coarse_rest, first.coarse_faces, last.fine_rest, host, bary, dist
    )


# ---------------------------------------------------------------------------
# Subdivision


def _edge_topology(faces: np.ndarray):
    """Unique edges of a triangle mesh and the edge of every face side.

    Returns edges (e, 2) sorted pairs, face_edge (m, 3) with column j the edge
    from corner j to corner j+1, and counts (e,) faces per edge. Raises
    MeshError on an edge shared by more than two faces."""
    sides = faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2)
    key = np.sort(sides, axis=1)
    edges, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    if counts.max() > 2:
        a, b = edges[int(np.argmax(counts))]
        raise MeshError(f"edge ({a}, {b}) is shared by {counts.max()} faces (non-manifold)")
    return edges, inverse.reshape(-1, 3), counts


def _split_faces(faces: np.ndarray, face_edge: np.ndarray, n: int) -> np.ndarray:
    """(4m, 3) faces of the 1-to-4 split; edge e's new vertex is n + e. The
    children of coarse face f are 4f..4f+3 (three corners, then the middle);
    orientation is kept."""
    a, b, c = faces.T
    mab, mbc, mca = (n + face_edge).T
    fine = np.stack(
        [
            np.stack([a, mab, mca], 1),
            np.stack([mab, b, mbc], 1),
            np.stack([mca, mbc, c], 1),
            np.stack([mab, mbc, mca], 1),
        ],
        axis=1,
    )
    return fine.reshape(-1, 3).astype(np.int32)


def _loop_beta(k: np.ndarray) -> np.ndarray:
    """Loop's even-vertex neighbour weight: 3/16 for valence 3, 3/(8k) otherwise."""
    k = np.asarray(k, dtype=np.float64)
    return np.where(k == 3, 3.0 / 16.0, 3.0 / (8.0 * np.maximum(k, 1.0)))


def loop_subdivide(
    level: Level,
    scheme: str = "loop",
    *,
    areal_density: float | None = None,
    corner_angle: float = 30.0,
) -> tuple[Level, Prolongation]:
    """One 1-to-4 subdivision of ``level``: (fine level, prolongation).

    scheme "loop": odd (edge) vertices 3/8, 3/8 on the edge and 1/8, 1/8 on
    the opposite vertices; even vertices 1 - k beta on themselves and beta on
    each of their k neighbours, beta = 3/(8k) for k > 3 and 3/16 for k = 3.
    Boundary: odd 1/2, 1/2; even 3/4 and 1/8, 1/8 on the two boundary
    neighbours; corners kept. scheme "midpoint": odd 1/2, 1/2, even kept
    (linear subdivision). All weights are non-negative.

    A corner is a boundary vertex with one incident face, with other than two
    boundary edges, or where the boundary turns by more than ``corner_angle``
    degrees (so the corners of a square cloth stay put).

    The fine rest shape is U X, so the offsets are zero at rest; every fine
    vertex is still given a host (an incident coarse face for an even vertex,
    a face of its edge for an odd one). Fine vertices: the n coarse ones first,
    then one per edge. Fine faces: 4m, children of face f at 4f..4f+3. UVs are
    carried linearly (edge midpoints), per vertex or per face corner. Fine
    masses are lumped with ``areal_density`` (default: the level's mass/area).
    """
    if scheme not in ("loop", "midpoint"):
        raise ValueError(f"scheme must be 'loop' or 'midpoint', got {scheme!r}")
    x, f = level.vertices, level.faces
    n, m = len(x), len(f)
    edges, face_edge, counts = _edge_topology(f)
    ne = len(edges)
    interior_side = counts[face_edge] == 2  # (m, 3)

    # Odd vertices: every face side contributes half of an interior edge's
    # stencil (each interior edge has two sides), all of a boundary edge's.
    rows_o = np.repeat((n + face_edge).ravel(), 3)
    corner_a = f
    corner_b = np.roll(f, -1, axis=1)
    opposite = np.roll(f, -2, axis=1)
    if scheme == "loop":
        w_end = np.where(interior_side, 3.0 / 16.0, 0.5)
        w_opp = np.where(interior_side, 1.0 / 8.0, 0.0)  # each side has its own opposite vertex
    else:
        w_end = np.where(interior_side, 0.25, 0.5)
        w_opp = np.zeros_like(w_end)
    cols_o = np.stack([corner_a, corner_b, opposite], axis=2).ravel()
    vals_o = np.stack([w_end, w_end, w_opp], axis=2).ravel()

    # Even vertices.
    is_boundary_edge = counts == 1
    bedges = edges[is_boundary_edge]
    bcount = np.bincount(bedges.ravel(), minlength=n)
    on_boundary = bcount > 0
    faces_per_vertex = np.bincount(f.ravel(), minlength=n)
    corner = on_boundary & ((bcount != 2) | (faces_per_vertex == 1))
    # Boundary neighbours of every regular boundary vertex (two of them).
    bb = np.concatenate([bedges, bedges[:, ::-1]])  # (2b, 2) vertex -> neighbour
    bb = bb[np.argsort(bb[:, 0], kind="stable")]
    regular = on_boundary & ~corner
    first_slot = np.searchsorted(bb[:, 0], np.arange(n))
    rb = np.flatnonzero(regular)
    nb1, nb2 = bb[first_slot[rb], 1], bb[first_slot[rb] + 1, 1]
    if len(rb):
        u1 = x[rb] - x[nb1]
        u2 = x[nb2] - x[rb]
        cosang = np.einsum("ij,ij->i", u1, u2) / np.maximum(
            np.linalg.norm(u1, axis=1) * np.linalg.norm(u2, axis=1), np.finfo(float).tiny
        )
        sharp = cosang < np.cos(np.radians(corner_angle))
        corner[rb[sharp]] = True
        keep = ~sharp
        rb, nb1, nb2 = rb[keep], nb1[keep], nb2[keep]
    interior = ~on_boundary
    if scheme == "loop":
        valence = np.bincount(edges.ravel(), minlength=n)
        beta = _loop_beta(valence)
        iv = np.flatnonzero(interior)
        # Neighbour weights of interior vertices through both directions of each edge.
        src = np.concatenate([edges[:, 0], edges[:, 1]])
        dst = np.concatenate([edges[:, 1], edges[:, 0]])
        keep = interior[src]
        rows_e = np.concatenate([iv, src[keep], rb, rb, rb, np.flatnonzero(corner)])
        cols_e = np.concatenate([iv, dst[keep], rb, nb1, nb2, np.flatnonzero(corner)])
        vals_e = np.concatenate(
            [
                1.0 - valence[iv] * beta[iv],
                beta[src[keep]],
                np.full(len(rb), 0.75),
                np.full(len(rb), 0.125),
                np.full(len(rb), 0.125),
                np.ones(int(corner.sum())),
            ]
        )
    else:
        rows_e = cols_e = np.arange(n)
        vals_e = np.ones(n)
    rows = np.concatenate([rows_e, rows_o])
    cols = np.concatenate([cols_e, cols_o])
    U = sp.csr_matrix((np.concatenate([vals_e, vals_o]), (rows, cols)), shape=(n + ne, n))
    xf = U @ x
    ff = _split_faces(f, face_edge, n)

    # Hosts: an incident face for even vertices, a face of the edge for odd ones.
    _, first = np.unique(f.ravel(), return_index=True)
    _, first_e = np.unique(face_edge.ravel(), return_index=True)
    host = np.concatenate([first // 3, first_e // 3]).astype(np.int32)
    bary = np.zeros((n + ne, 3))
    bary[np.arange(n), first % 3] = 1.0
    j = first_e % 3
    bary[n + np.arange(ne), j] = 0.5
    bary[n + np.arange(ne), (j + 1) % 3] = 0.5
    hp = np.einsum("ij,ijk->ik", bary, x[f[host]])
    dist = np.linalg.norm(xf - hp, axis=1)

    uv, fuv = None, None
    if level.uv is not None:
        if level.face_uv is None:
            uv = np.concatenate([level.uv, 0.5 * (level.uv[edges[:, 0]] + level.uv[edges[:, 1]])])
        else:
            uv_edges, uv_face_edge, _ = _edge_topology(level.face_uv)
            uv = np.concatenate(
                [level.uv, 0.5 * (level.uv[uv_edges[:, 0]] + level.uv[uv_edges[:, 1]])]
            )
            fuv = _split_faces(level.face_uv, uv_face_edge, len(level.uv))
    rho = level.areal_density if areal_density is None else float(areal_density)
    fine = Level.from_mesh(xf, ff, rho, uv=uv, face_uv=fuv)
    P = _with_offsets(U, x, f, xf, host, bary, dist)
    return fine, P


# ---------------------------------------------------------------------------
# Decimation


def _vertex_uv(level: Level) -> np.ndarray | None:
    """(n, 2) one texture coordinate per vertex of ``level``, or None when it has no
    UVs or has seams (some vertex carries two different UVs on two of its corners).

    An OBJ's ``f v/vt`` corners always come as per-corner UVs (``face_uv``), even
    when every corner of a vertex names the same ``vt``; those fold into one UV per
    vertex, so coarser levels can get UVs interpolated from them."""
    if level.uv is None:
        return None
    if level.face_uv is None:
        return level.uv
    corner = level.uv[level.face_uv].reshape(-1, 2)
    v = level.faces.ravel()
    uv = np.empty((level.vertex_count, 2))
    uv[v] = corner  # every vertex is used by a face
    if np.any(uv[v] != corner):
        return None  # a seam: no single UV per vertex
    return uv


def _uv_at(level: Level, uv: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(k, 2) the per-vertex UVs ``uv`` of ``level`` interpolated (barycentric) at the
    closest point of its surface to each of ``points`` (k, 3), metres: exact where
    the UVs are affine over the host triangle (a flat sheet's u = x / size)."""
    h, w, _ = _closest_on_surface(points, level.vertices, level.faces)
    return np.einsum("ij,ijk->ik", w, uv[level.faces[h]])


def _decimation_frame(x: np.ndarray):
    """(y, to_world): the vertices ``x`` (n, 3), metres, centred on their mean,
    rotated onto their principal axes (the smallest last, so a flat mesh's normal
    is the z axis) and scaled to a unit bounding-box diagonal, and the map back.

    Why: Fast-Quadric-Mesh-Simplification's tests are absolute. It solves for the
    optimal collapse point whenever the determinant of the 3x3 quadric is not
    exactly zero, and its error thresholds (1e-9 (iteration + 3)^agg) are in
    squared length units. On a plane through an axis (normal along x, y or z) the
    quadric is exactly singular and an edge collapses to an end or its midpoint at
    zero error; on the same plane turned off the axes (a sheet stood up by a 90
    degree rotation, whose cosine is 6e-17, or tilted by 3 degrees) rounding makes
    the determinant tiny instead of zero, the "optimal" point of the near-singular
    system lands far off in the plane, the collapse is refused as a flip, and
    decimation stalls: a 1,225-vertex square grid turned 3 degrees in its plane and
    stood up, asked for 300 vertices, kept 886. Centring and rotating alone already
    brought that to 311; a mesh flat to ``_FLAT_EXTENT`` of its diagonal also gets
    its out-of-plane coordinate set to exactly zero, so every quadric is exactly
    singular whatever the mesh's orientation (then 308, as lying flat), and the unit scale
    makes the thresholds mean the same for a 10 cm patch and a 10 m sail. The map
    back is a similarity (rotation, scale, shift), so the decimated mesh is valid
    in world coordinates, on the fine mesh's best-fit plane when flat.
    """
    c = x.mean(axis=0)
    _, _, R = np.linalg.svd(x - c, full_matrices=False)  # rows: principal axes
    if np.linalg.det(R) < 0:
        R[2] = -R[2]  # a rotation, not a reflection: faces keep their orientation
    y = (x - c) @ R.T
    scale = float(np.linalg.norm(y.max(axis=0) - y.min(axis=0))) or 1.0
    y /= scale
    if float(np.ptp(y[:, 2])) <= _FLAT_EXTENT:
        y[:, 2] = 0.0

    def to_world(v: np.ndarray) -> np.ndarray:
        return (np.asarray(v, dtype=np.float64) * scale) @ R + c

    return y, to_world


def _manifold(faces: np.ndarray) -> bool:
    """No edge of more than two triangles and no two triangles on the same vertices."""
    e = np.sort(faces[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2), axis=1)
    _, counts = np.unique(e, axis=0, return_counts=True)
    return bool(counts.max(initial=0) <= 2) and len(np.unique(np.sort(faces, axis=1), axis=0)) == len(faces)


def decimate(
    level: Level,
    target_vertices: int,
    *,
    aggressiveness: float = 7.0,
    preserve_border: bool = False,
    areal_density: float | None = None,
) -> Level:
    """A coarser level by quadric edge-collapse decimation (the
    ``fast-simplification`` package, a wrapper of Fast-Quadric-Mesh-Simplification).

    target_vertices: wanted vertex count (the library targets faces; the face
    target is scaled by the mesh's faces-per-vertex ratio and corrected once,
    so the result lands within a few percent). The library may cut a cloth's
    corners and move a few border vertices inwards (measured: up to 4% of the
    side of a 64x64 square decimated to 300 vertices); the embedding keeps
    the fine rest shape exact anyway (tangential offsets). ``preserve_border``
    keeps every border vertex instead (then the border alone bounds how coarse
    the level can get). ``aggressiveness`` is the library's ``agg``; the library
    sees the mesh in its principal frame at unit size (``_decimation_frame``), so
    the result does not depend on how the mesh is turned, placed or scaled. Masses are lumped with
    ``areal_density`` (default: the level's mass/area). UVs: one per vertex (given
    so, or per-corner ones that agree at every vertex, as an OBJ without seams
    loads) are interpolated at the closest fine surface point of every coarse
    vertex (``_uv_at``). With seams (a vertex with two different UVs) the coarse
    level gets none (limitation: a coarse triangle may straddle a seam, and
    interpolating across it would smear the texture; a seam-aware transfer would
    have to keep the seam edges through the collapse).
    """
    try:
        import fast_simplification
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise MeshError(
            "decimation needs the 'fast-simplification' package (pip install fast-simplification)"
        ) from err
    n = level.vertex_count
    target = int(target_vertices)
    if target < 4 or target >= n:
        raise MeshError(f"cannot decimate a {n}-vertex level to {target_vertices} vertices")
    ratio = level.face_count / n
    x, f = level.vertices, level.faces
    y, to_world = _decimation_frame(x)

    def run(faces_target: int, agg: float = aggressiveness):
        faces_target = int(np.clip(faces_target, 2, level.face_count - 1))
        v, t = fast_simplification.simplify(
            y, f, target_count=faces_target, agg=agg, preserve_border=preserve_border
        )
        v = to_world(v)
        t = np.asarray(t, dtype=np.int64)
        t = t[(t[:, 0] != t[:, 1]) & (t[:, 1] != t[:, 2]) & (t[:, 2] != t[:, 0])]
        used = np.unique(t)
        remap = np.full(len(v), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        return np.asarray(v, dtype=np.float64)[used], remap[t]

    v, t = run(round(target * ratio))
    if abs(len(v) - target) > 0.05 * target:
        # Boundary vertices make faces-per-vertex differ between resolutions.
        v, t = run(round(target * ratio * target / max(len(v), 1)))
    if len(t) == 0 or len(v) >= n:
        raise MeshError(f"decimating {n} vertices to {target} failed (got {len(v)} vertices)")
    v, t = collapse_needles(v, t)
    t = flip_slivers(v, t)
    if not _manifold(t):
        # the library can fold a flap of a noisy (scan-like) surface flat onto its
        # neighbour (an edge of three triangles, or two triangles on the same three
        # vertices): a gentler collapse order avoids it
        for agg in (aggressiveness / 2, aggressiveness / 4, 1.0):
            v2, t2 = run(round(target * ratio), agg)
            v2, t2 = collapse_needles(v2, t2)
            t2 = flip_slivers(v2, t2)
            if len(t2) and len(v2) < n and _manifold(t2):
                log.debug("decimation: folded triangles at agg %g; agg %g made a manifold level", aggressiveness, agg)
                v, t = v2, t2
                break
    fine_uv = _vertex_uv(level)
    uv = None if fine_uv is None else _uv_at(level, fine_uv, v)
    rho = level.areal_density if areal_density is None else float(areal_density)
    coarse = Level.from_mesh(v, t, rho, uv=uv)
    log.debug("decimated %d -> %d vertices (target %d)", n, coarse.vertex_count, target)
    return coarse


def _min_angles(x: np.ndarray, tris: np.ndarray) -> np.ndarray:
    """The smallest interior angle (radians) of each triangle (k, 3)."""
    a, b, c = (x[tris[:, i]] for i in range(3))
    out = np.full(len(tris), np.pi)
    for p, q, r in ((a, b, c), (b, c, a), (c, a, b)):
        u, w = q - p, r - p
        out = np.minimum(out, np.arctan2(np.linalg.norm(np.cross(u, w), axis=1), np.einsum("ij,ij->i", u, w)))
    return out


def collapse_needles(
    x: np.ndarray, faces: np.ndarray, ratio: float = 0.2, max_dihedral_deg: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(vertices, faces) with every edge shorter than ``ratio`` times the median edge
    collapsed where that is safe: the needles quadric decimation leaves in flat regions,
    two vertices a millimetre apart whose triangles put a third vertex that close to a
    triangle it does not share (edge flips cannot help there). An edge (a, b) goes when
    a and b share no neighbour but the edge's own opposite vertices (the surface stays a
    manifold), b is not on the border unless a is and (a, b) is a border edge, the
    triangles around a and b lie within ``max_dihedral_deg`` of one plane (where
    decimation has no curvature to guide it; elsewhere its quadrics placed the vertices
    and a merge would change the surface), and no remaining triangle of b turns over or
    degenerates; b then merges into a, at the midpoint when both are interior or both on
    the border, at a's place otherwise. Vertices are renumbered; unused ones dropped."""
    x = np.array(x, dtype=np.float64)
    faces = np.array(faces, dtype=np.int64)
    alive = np.ones(len(faces), dtype=bool)
    cos_flat = np.cos(np.radians(max_dihedral_deg))

    def edge_lengths(t):
        return np.linalg.norm(x[t[:, [1, 2, 0]]] - x[t], axis=2)

    median = float(np.median(edge_lengths(faces)))
    border = np.zeros(len(x), dtype=bool)
    be = boundary_edges(faces)
    border[be.ravel()] = True
    border_keys = set(map(tuple, np.sort(be, axis=1).tolist()))
    lengths = edge_lengths(faces)
    short = np.argwhere(lengths < ratio * median)
    for f, j in short[np.argsort(lengths[short[:, 0], short[:, 1]], kind="stable")].tolist():
        if not alive[f]:
            continue
        a, b = int(faces[f, j]), int(faces[f, (j + 1) % 3])
        if border[b] and not border[a]:
            a, b = b, a
        if border[b] and tuple(sorted((a, b))) not in border_keys:
            continue  # two border vertices across the interior: would pinch the sheet
        live = np.flatnonzero(alive)
        has_a = np.any(faces[live] == a, axis=1)
        has_b = np.any(faces[live] == b, axis=1)
        shared = live[has_a & has_b]  # the edge's own triangles
        opposite = set(faces[shared].ravel().tolist()) - {a, b}
        nb_a = set(faces[live[has_a]].ravel().tolist()) - {a, b}
        nb_b = set(faces[live[has_b]].ravel().tolist()) - {a, b}
        if nb_a & nb_b != opposite:
            continue  # the link condition: the merge would glue the surface to itself
        around = faces[live[has_a | has_b]]
        nrm = np.cross(x[around[:, 1]] - x[around[:, 0]], x[around[:, 2]] - x[around[:, 0]])
        nrm /= np.maximum(np.linalg.norm(nrm, axis=1), 1e-300)[:, None]
        if float((nrm @ nrm[0]).min()) < cos_flat:
            continue  # curved there
        target = 0.5 * (x[a] + x[b]) if border[a] == border[b] else x[a].copy()
        moved = live[(has_a | has_b) & ~(has_a & has_b)]
        old = faces[moved]
        new = np.where(old == b, a, old)
        p0 = x.copy()
        p0[a] = target
        n_old = np.cross(x[old[:, 1]] - x[old[:, 0]], x[old[:, 2]] - x[old[:, 0]])
        n_new = np.cross(p0[new[:, 1]] - p0[new[:, 0]], p0[new[:, 2]] - p0[new[:, 0]])
        if np.any(np.einsum("ij,ij->i", n_old, n_new) <= 0.05 * np.linalg.norm(n_old, axis=1) ** 2):
            continue  # a triangle would turn over or nearly vanish
        x[a] = target
        faces[moved] = new
        alive[shared] = False
    faces = faces[alive]
    used = np.unique(faces)
    remap = np.full(len(x), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return x[used], remap[faces]


def flip_slivers(
    x: np.ndarray, faces: np.ndarray, *, min_angle_deg: float = 15.0, max_dihedral_deg: float = 1.0,
    passes: int = 50,
) -> np.ndarray:
    """Faces improved by Lawson edge flips at thin triangles where the surface is nearly
    flat (vertices unchanged).

    Quadric decimation of a flat region has no error to guide it (every quadric is
    zero there), so it leaves slivers: on a decimated disc, interior triangles 70 mm long
    and 1.2 mm high, whose third vertex then starts within a cloth's contact thickness
    of the neighbouring triangle, an invalid start for the barrier. An interior edge of
    a triangle with an angle below ``min_angle_deg`` is flipped when its two triangles
    are nearly coplanar (normals within ``max_dihedral_deg``, so the surface barely
    changes), the flipped pair keeps their orientation and the flip raises the pair's
    smallest angle (Lawson's criterion); each pass flips a set of edges with no triangle
    in common, worst pairs first, until none is left. Triangles that are not thin stay as
    the decimation made them, and so do slivers along the border (no edge to flip).
    """
    faces = np.array(faces, dtype=np.int64)
    n = len(x)
    limit = np.radians(min_angle_deg)
    cos_dihedral = np.cos(np.radians(max_dihedral_deg))

    def unit_normals(t):
        nrm = np.cross(x[t[:, 1]] - x[t[:, 0]], x[t[:, 2]] - x[t[:, 0]])
        return nrm / np.maximum(np.linalg.norm(nrm, axis=1), 1e-300)[:, None]

    for _ in range(passes):
        m = len(faces)
        side_a = faces.ravel()  # side k = 3 f + j runs from corner j to corner j + 1
        side_b = faces[:, [1, 2, 0]].ravel()
        key = np.minimum(side_a, side_b) * n + np.maximum(side_a, side_b)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        twin = np.flatnonzero(ks[1:] == ks[:-1])  # interior edges: two sides with one key
        s1, s2 = order[twin], order[twin + 1]
        f1, j1, f2, j2 = s1 // 3, s1 % 3, s2 // 3, s2 % 3
        p, q = side_a[s1], side_b[s1]
        ok = (side_a[s2] == q) & (side_b[s2] == p)  # oriented alike
        r = faces[f1, (j1 + 2) % 3]
        s_ = faces[f2, (j2 + 2) % 3]
        old_1 = np.stack([p, q, r], 1)
        old_2 = np.stack([q, p, s_], 1)
        new_1 = np.stack([p, s_, r], 1)
        new_2 = np.stack([s_, q, r], 1)
        n1, n2 = unit_normals(old_1), unit_normals(old_2)
        ok &= np.einsum("ij,ij->i", n1, n2) >= cos_dihedral
        mid = n1 + n2
        ok &= (np.einsum("ij,ij->i", unit_normals(new_1), mid) > 0) & (np.einsum("ij,ij->i", unit_normals(new_2), mid) > 0)
        old_min = np.minimum(_min_angles(x, old_1), _min_angles(x, old_2))
        ok &= old_min < limit
        ok &= np.minimum(_min_angles(x, new_1), _min_angles(x, new_2)) > old_min + 1e-12
        new_key = np.minimum(r, s_) * n + np.maximum(r, s_)
        at = np.searchsorted(ks, new_key)
        ok &= ks[np.minimum(at, len(ks) - 1)] != new_key  # the new edge must not exist yet
        cand = np.flatnonzero(ok)
        if not len(cand):
            break
        used = np.zeros(m, dtype=bool)
        made: set[int] = set()
        flipped = 0
        for c in cand[np.argsort(old_min[cand], kind="stable")].tolist():
            a, b, k = int(f1[c]), int(f2[c]), int(new_key[c])
            if used[a] or used[b] or k in made:
                continue
            faces[a], faces[b] = new_1[c], new_2[c]
            used[a] = used[b] = True
            made.add(k)
            flipped += 1
        if not flipped:
            break
    return faces


# ---------------------------------------------------------------------------
# Hierarchies


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """Levels 0 (coarsest) .. L (finest) with their prolongations.

    levels: (L+1) Levels. prolongations: L one-level operators, l -> l+1.
    direct: L+1 operators l -> L (the identity at L), what the coarse preview
    evaluates Psi_L through. method: how it was built. mass: "consistent" or
    "lumped". mass_deviation: per level, max_i |m_i - lumped_i| / lumped_i of
    the masses in use against area-lumped ones (0 for lumped masses and for
    the finest level).
    """

    levels: tuple[Level, ...]
    prolongations: tuple[Prolongation, ...]
    direct: tuple[Prolongation, ...]
    method: str
    mass: str
    mass_deviation: tuple[float, ...]

    @property
    def level_count(self) -> int:
        return len(self.levels)

    @property
    def finest(self) -> Level:
        return self.levels[-1]

    @property
    def coarsest(self) -> Level:
        return self.levels[0]

    def to_finest(self, level: int) -> Prolongation:
        """The direct prolongation P_l from ``level`` to the finest level."""
        return self.direct[level]


def _check_finer(levels: Sequence[Level]) -> None:
    for k in range(1, len(levels)):
        a, b = levels[k - 1].vertex_count, levels[k].vertex_count
        if b <= a:
            raise MeshError(
                f"level {k} ({b} vertices) is not finer than level {k - 1} ({a} vertices)"
            )


def _check_distance(P: Prolongation, k: int, fine: Level, max_distance: float) -> None:
    worst = float(P.distance.max())
    diag = fine.diagonal
    if worst > max_distance * diag:
        raise MeshError(
            f"level {k} is far from level {k - 1}: max embedding distance {worst:.4g} m exceeds "
            f"{max_distance:g} x bounding-box diagonal {diag:.4g} m"
        )


def _finish(
    levels: list[Level],
    prolongations: list[Prolongation | None],
    method: str,
    mass: str,
    rho: float,
    max_distance: float,
    zero_mean_tangent: bool,
    embedded: bool,
) -> Hierarchy:
    """Embed (when ``embedded``), set masses and build the direct operators.
    Works from the finest level down so consistent masses are known on the
    fine side of every embedding."""
    if mass not in ("consistent", "lumped"):
        raise ValueError(f"mass must be 'consistent' or 'lumped', got {mass!r}")
    L = len(levels) - 1
    deviation = [0.0] * (L + 1)
    for lvl in range(L - 1, -1, -1):
        if embedded:
            P = embed(levels[lvl + 1], levels[lvl], zero_mean_tangent=zero_mean_tangent)
            _check_distance(P, lvl + 1, levels[lvl + 1], max_distance)
            prolongations[lvl] = P
        P = prolongations[lvl]
        lumped = lumped_masses(levels[lvl].vertices, levels[lvl].faces, rho)
        if mass == "consistent":
            m = P.restrict(levels[lvl + 1].mass)
            if np.any(m <= 0):
                bad = int(np.argmin(m))
                raise MeshError(
                    f"consistent mass U^T m of level {lvl} vertex {bad} is {m[bad]:.3g} kg "
                    "(no fine vertex leans on it: it lies on degenerate triangles only); "
                    "set refine.mass = \"lumped\""
                )
            deviation[lvl] = float(np.max(np.abs(m - lumped) / lumped))
        else:
            m = lumped
        levels[lvl] = levels[lvl].with_mass(m)
    if mass == "consistent" and L > 0:
        log.info(
            "consistent masses: max relative deviation from area-lumped masses per level %s",
            ", ".join(f"{d:.3g}" for d in deviation),
        )
    if embedded:
        directs = [
            embed(levels[L], levels[lvl], zero_mean_tangent=zero_mean_tangent)
            for lvl in range(L - 1)
        ]
    else:
        directs = [compose(*prolongations[lvl:]) for lvl in range(L - 1)]
    directs += [prolongations[L - 1]] if L > 0 else []
    directs.append(identity(levels[L]))
    return Hierarchy(
        levels=tuple(levels),
        prolongations=tuple(prolongations),
        direct=tuple(directs),
        method=method,
        mass=mass,
        mass_deviation=tuple(deviation),
    )


def from_meshes(
    levels: Sequence[Level],
    *,
    mass: str = "consistent",
    areal_density: float | None = None,
    max_distance: float = DEFAULT_MAX_DISTANCE,
    zero_mean_tangent: bool = False,
) -> Hierarchy:
    """A hierarchy from user-given levels, coarsest first, each embedded in the
    one before (``embed``) and directly in every coarser one (``direct``).

    Raises MeshError (one line) when a level has no more vertices than the one
    before, or when its max embedding distance exceeds ``max_distance`` times
    its bounding-box diagonal (the levels are not the same surface). Masses as
    in ``build_hierarchy``; the finest level keeps its own.
    """
    levels = list(levels)
    if not levels:
        raise MeshError("from_meshes needs at least one level")
    _check_finer(levels)
    rho = levels[-1].areal_density if areal_density is None else float(areal_density)
    return _finish(
        levels,
        [None] * (len(levels) - 1),
        "meshes",
        mass,
        rho,
        max_distance,
        zero_mean_tangent,
        embedded=True,
    )


def decimation_minimum(levels: int, coarse_vertices: int | tuple[int, int] = (300, 1000),
                       min_ratio: float = 2.0) -> int:
    """The fewest finest-level vertices that ``build_hierarchy(method="decimate")`` can
    turn into ``levels`` levels."""
    lo = coarse_vertices if np.isscalar(coarse_vertices) else coarse_vertices[0]
    return int(np.ceil(int(lo) * min_ratio ** (int(levels) - 1)))


def build_hierarchy(
    level: Level,
    levels: int = 3,
    method: str = "decimate",
    coarse_vertices: int | tuple[int, int] = (300, 1000),
    *,
    mass: str = "consistent",
    areal_density: float | None = None,
    max_distance: float = DEFAULT_MAX_DISTANCE,
    zero_mean_tangent: bool = False,
    min_ratio: float = 2.0,
    preserve_border: bool = False,
) -> Hierarchy:
    """A ``levels``-level hierarchy (L = levels - 1).

    method "decimate": ``level`` is the finest level; coarser ones come from
    repeated decimation, the coarsest aiming at n_fine / 4^L vertices clamped
    into ``coarse_vertices`` = (lo, hi) (an int means lo = hi), intermediate
    ones spaced geometrically. Every consecutive pair must differ by at least
    ``min_ratio`` in vertex count, so the fine mesh needs at least
    lo * min_ratio^L vertices; otherwise MeshError naming the counts.
    method "loop" | "midpoint": ``level`` is the coarsest; L subdivisions.

    mass "consistent" (default): the finest level keeps its masses (for
    subdivision, lumped with ``areal_density``) and every coarser level gets
    m_l = U_l^T m_{l+1}, so U^T m_fine = m_coarse holds exactly and the total
    mass is the same on every level (rows of U sum to one); this is what the
    centre-of-mass consistency of §5.3 needs. The masses then differ from
    area-lumped ones (``Hierarchy.mass_deviation``). Loop, midpoint and
    embedding weights are all non-negative, so these masses are positive
    unless a coarse vertex has no fine vertex leaning on it (MeshError). With
    ``zero_mean_tangent`` the weights may be negative (same check).
    mass "lumped": area times ``areal_density`` on every level (totals then
    differ by the area difference between levels).

    §5.3 also needs m_fine^T a(x) = 0. The offsets satisfy it exactly when
    they vanish at rest (subdivision hierarchies, and flat embedded meshes
    whose coarse boundary covers the fine one); ``zero_mean_tangent`` removes
    the tangential part everywhere, exactly (see ``embed``); the normal part
    sum_f (sum_i m_i gamma_i) n_f(x) of curved embedded meshes remains: it
    cannot be removed without losing P(X_coarse) = X_fine.

    areal_density: kg/m^2 for lumped masses (default: ``level``'s mass/area).
    max_distance: embedding distance limit, fraction of the bounding-box diagonal.
    preserve_border: passed to ``decimate`` (keep every border vertex).
    """
    L = int(levels) - 1
    if L < 0:
        raise MeshError(f"a hierarchy needs at least one level, got {levels}")
    rho = level.areal_density if areal_density is None else float(areal_density)
    if method in ("loop", "midpoint"):
        chain = [level]
        prolongations: list[Prolongation | None] = []
        for _ in range(L):
            fine, P = loop_subdivide(chain[-1], method, areal_density=rho)
            chain.append(fine)
            prolongations.append(P)
        return _finish(chain, prolongations, method, mass, rho, max_distance, False, embedded=False)
    if method != "decimate":
        raise ValueError(f"method must be 'decimate', 'loop' or 'midpoint', got {method!r}")
    lo, hi = (coarse_vertices, coarse_vertices) if np.isscalar(coarse_vertices) else coarse_vertices
    lo, hi = int(lo), int(hi)
    n = level.vertex_count
    if L == 0:
        return _finish([level], [], method, mass, rho, max_distance, False, embedded=True)
    need = decimation_minimum(levels, (lo, hi), min_ratio)
    if n < need:
        raise MeshError(
            f"a {levels}-level hierarchy needs a finest mesh of at least {need} vertices "
            f"(coarsest {lo} x {min_ratio:g}^{L}), got {n}; refine.method = \"loop\" makes it the "
            f"preview and subdivides it"
        )
    c0 = float(np.clip(n / 4.0**L, lo, hi))
    c0 = min(c0, n / min_ratio**L)
    targets = [int(round(c0 * (n / c0) ** (k / L))) for k in range(L)]
    chain = [level]
    for k in range(L - 1, -1, -1):
        chain.insert(
            0, decimate(chain[0], targets[k], areal_density=rho, preserve_border=preserve_border)
        )
    _check_finer(chain)
    fine_uv = _vertex_uv(level)
    if fine_uv is not None:  # from the finest mesh itself, not level by level
        chain[:-1] = [replace(c, uv=_uv_at(level, fine_uv, c.vertices)) for c in chain[:-1]]
    return _finish(
        chain, [None] * L, method, mass, rho, max_distance, zero_mean_tangent, embedded=True
    )
