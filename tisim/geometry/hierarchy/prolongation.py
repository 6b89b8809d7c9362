"""The shell prolongation operator P(x) = U x + a(x) between two levels: the
sparse intrinsic part U and the extrinsic offsets stored in the frames of coarse
host triangles (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from tisim.geometry.mesh import MeshError

from .levels import Level


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
                f"U has shape {U.shape} but the rest shapes are {self.fine_rest.shape} and {self.coarse_rest.shape}"
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
        return self.gamma[:, None] * n[h] + self.tangent[:, 0:1] * e[h] + self.tangent[:, 1:2] * b[h]

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
