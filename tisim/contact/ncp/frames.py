"""Contact sets, contact frames and the contact Jacobian H (notes §2.5).

A contact c relates the positions to a relative contact-point position
``Pi_c q = sum_j w_cj x_{v_cj}`` (vertex-collider: x_v; vertex-triangle:
x_v - sum beta_k x_k). Its three rows of H are n_c^T Pi_c, t_c1^T Pi_c, t_c2^T Pi_c.
Because Pi_c = (scalar weights) kron I_3, H factors as H = F (B^T kron I_3) with the
(n, k) scalar selection matrix B and the block-diagonal frames F; the Delassus
operator then reduces to the k x k scalar matrix B^T A_hat^-1 B (see delassus.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


def tangent_frames(normals: np.ndarray) -> np.ndarray:
    """(k, 3, 3) orthonormal right-handed frames with rows (n, t1, t2), t1 x t2 = n.

    normals: (k, 3) unit vectors. Uses the branch-free basis of Duff et al., "Building
    an orthonormal basis, revisited" (JCGT 2017): smooth except where n_z changes sign,
    and deterministic (warm starts are transferred through world vectors anyway).
    """
    n = np.asarray(normals, dtype=np.float64).reshape(-1, 3)
    nx, ny, nz = n[:, 0], n[:, 1], n[:, 2]
    sign = np.where(nz >= 0, 1.0, -1.0)
    a = -1.0 / (sign + nz)
    b = nx * ny * a
    t1 = np.stack([1.0 + sign * nx * nx * a, sign * b, -sign * nx], axis=1)
    t2 = np.stack([b, sign + ny * ny * a, -ny], axis=1)
    return np.stack([n, t1, t2], axis=1)


@dataclass
class ContactSet:
    """The contacts found by one detection pass, fixed for one time step.

    k contacts; each touches up to 4 vertices.
    vertices: (k, 4) int vertex indices (unused slots repeat the first vertex).
    weights: (k, 4) float scalar weights of Pi_c (unused slots 0); vertex-collider
        (1, 0, 0, 0); vertex-triangle (1, -beta_0, -beta_1, -beta_2).
    frames: (k, 3, 3) rows (normal, t1, t2); the normal points from the obstacle
        towards the vertex (the direction the vertex is pushed).
    gap0: (k,) signed distance at detection, m (negative = penetration).
    point0: (k, 3) Pi_c q_det at detection, m.
    collider: (k,) index into model.colliders, or -1 for object-object contacts.
    mu: (k,) friction coefficient.
    surface_velocity: (k, 3) obstacle velocity at the contact point, m/s (zero for
        object-object contacts, whose relative motion is already in Pi_c).
    key: (k,) int64 identity of the contact for warm starting across steps.
    """

    vertices: np.ndarray
    weights: np.ndarray
    frames: np.ndarray
    gap0: np.ndarray
    point0: np.ndarray
    collider: np.ndarray
    mu: np.ndarray
    surface_velocity: np.ndarray
    key: np.ndarray

    @property
    def count(self) -> int:
        return int(self.vertices.shape[0])

    @property
    def normals(self) -> np.ndarray:
        return self.frames[:, 0, :]

    @classmethod
    def empty(cls) -> ContactSet:
        return cls(
            vertices=np.zeros((0, 4), dtype=np.int64),
            weights=np.zeros((0, 4)),
            frames=np.zeros((0, 3, 3)),
            gap0=np.zeros(0),
            point0=np.zeros((0, 3)),
            collider=np.zeros(0, dtype=np.int64),
            mu=np.zeros(0),
            surface_velocity=np.zeros((0, 3)),
            key=np.zeros(0, dtype=np.int64),
        )

    @classmethod
    def concatenate(cls, parts: list[ContactSet]) -> ContactSet:
        parts = [p for p in parts if p.count]
        if not parts:
            return cls.empty()
        return cls(**{f: np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__})

    def subset(self, mask: np.ndarray) -> ContactSet:
        return ContactSet(**{f: getattr(self, f)[mask] for f in self.__dataclass_fields__})

    def points(self, q: np.ndarray) -> np.ndarray:
        """(k, 3) Pi_c q: the relative contact-point positions for positions q (n, 3)."""
        return np.einsum("kj,kjd->kd", self.weights, q[self.vertices])

    def selection_matrix(self, vertex_count: int) -> sp.csc_matrix:
        """Scalar B (n, k) with B[:, c] the weights of Pi_c, so Pi_c q = (B^T q)[c]."""
        k = self.count
        cols = np.repeat(np.arange(k), 4)
        B = sp.csc_matrix((self.weights.ravel(), (self.vertices.ravel(), cols)), shape=(vertex_count, k))
        B.sum_duplicates()
        B.eliminate_zeros()
        return B

    def jacobian(self, vertex_count: int) -> sp.csr_matrix:
        """H (3k, 3n): row 3c + a is frames[c, a]^T Pi_c, acting on q.ravel() (x, y, z per
        vertex)."""
        k = self.count
        rows = np.broadcast_to(
            (3 * np.arange(k))[:, None, None, None] + np.arange(3)[None, :, None, None],
            (k, 3, 4, 3),
        )
        cols = np.broadcast_to(3 * self.vertices[:, None, :, None] + np.arange(3)[None, None, None, :], (k, 3, 4, 3))
        vals = self.weights[:, None, :, None] * self.frames[:, :, None, :]
        H = sp.csr_matrix((vals.ravel(), (rows.ravel(), cols.ravel())), shape=(3 * k, 3 * vertex_count))
        H.sum_duplicates()
        H.eliminate_zeros()
        return H

    def to_frame(self, world: np.ndarray) -> np.ndarray:
        """(k, 3) world vectors -> (k, 3) components (normal, t1, t2)."""
        return np.einsum("kad,kd->ka", self.frames, world)

    def to_world(self, local: np.ndarray) -> np.ndarray:
        """(k, 3) components (normal, t1, t2) -> (k, 3) world vectors."""
        return np.einsum("kad,ka->kd", self.frames, local)

    def scatter_forces(self, lam: np.ndarray, vertex_count: int) -> np.ndarray:
        """H^T lambda as (n, 3) vertex forces, N, for lam (k, 3) in frame components."""
        f = self.to_world(lam)  # (k, 3)
        out = np.zeros((vertex_count, 3))
        contrib = self.weights[:, :, None] * f[:, None, :]  # (k, 4, 3)
        for d in range(3):
            out[:, d] = np.bincount(self.vertices.ravel(), weights=contrib[:, :, d].ravel(), minlength=vertex_count)
        return out
