"""The Delassus operator W = H A^-1 H^T of the constrained global step (notes §2.7-2.8).

With a lumped mass matrix, A = A_hat kron I_3 and H = F (B^T kron I_3) (see
frames.py), so

    H A^-1 H^T = F ((B^T A_hat^-1 B) kron I_3) F^T,

i.e. the 3k x 3k operator is the k x k scalar matrix W_hat = B^T A_hat^-1 B, dressed
with the contact frames. W_hat is built once per step from the sparse inverse
(Z = S P B, W_hat = Z^T Z, notes §2.8) or from k solves with the factor; each
Newton iteration then only rescales it by the diagonal indicator matrices.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def _positions(perm: np.ndarray, n: int) -> np.ndarray:
    pos = np.full(n, -1, dtype=np.int64)
    pos[np.asarray(perm, dtype=np.int64)] = np.arange(len(perm))
    return pos


def _half_rows(ST: sp.csr_matrix, pos: np.ndarray, B: sp.spmatrix) -> sp.csr_matrix:
    """Z^T = (P B)^T S^T (k, m) as CSR: row j is sum_v B[v, j] (row pos[v] of S^T); held
    vertices (pos -1) contribute nothing."""
    m = ST.shape[0]
    k = B.shape[1]
    Bc = sp.coo_matrix(B)
    ok = pos[Bc.row] >= 0
    Bt = sp.csr_matrix((Bc.data[ok], (Bc.col[ok], pos[Bc.row[ok]])), shape=(k, m))
    return (Bt @ ST).tocsr()


def _unit_rows(ST: sp.csr_matrix, rows: np.ndarray) -> sp.csr_matrix:
    """Z^T for unit columns e_v: the rows ``rows`` (k,) of S^T gathered, an empty row where
    rows[j] is -1 (a held vertex). A row gather, no sparse product."""
    valid = rows >= 0
    Zv = ST[rows[valid]]
    counts = np.zeros(len(rows), dtype=np.int64)
    counts[valid] = np.diff(Zv.indptr)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return sp.csr_matrix((Zv.data, Zv.indices, indptr), shape=(len(rows), ST.shape[1]))


def _packed_half(ST: sp.csr_matrix, pos: np.ndarray, B: sp.spmatrix) -> np.ndarray:
    """Z^T = (P B)^T S^T (k, m) as a dense (k, r) array on its r non-zero columns."""
    Zt = _half_rows(ST, pos, B)
    m = ST.shape[0]
    k = B.shape[1]
    used = np.zeros(m, dtype=bool)
    used[Zt.indices] = True
    cols = np.cumsum(used) - 1
    # the same rows on the compacted columns, densified by scipy in C (zero fill and
    # scatter in one pass; the numpy fancy-index scatter cost more than the product)
    packed = sp.csr_matrix((Zt.data, cols[Zt.indices], Zt.indptr), shape=(k, int(used.sum())))
    return packed.toarray()


def scalar_delassus_sparse_inverse(
    S: sp.spmatrix | None, perm: np.ndarray, B: sp.spmatrix, ST: sp.csr_matrix | None = None
) -> np.ndarray:
    """W_hat = B^T A_hat^-1 B (k, k) from the sparse inverse of the Cholesky factor.

    S: (m, m) S = L^-1 with L L^T = A_hat[perm][:, perm] (m = n, or the number of
    free vertices when held vertices are eliminated); A_hat^-1 = P^T S^T S P with
    (P x)_i = x[perm_i]. perm: (m,) vertex of each permuted row. B: (n, k) sparse;
    rows of vertices not in ``perm`` (held) are ignored. ST: S^T as CSR (pass it to
    avoid a transpose per call; then S may be None).

    Z = S (P B) is sparse (column j of S lives on the elimination-tree path of j),
    but W_hat = Z^T Z is dense across contacts. Z^T = (P B)^T S^T is formed from
    rows of S^T, packed densely on the columns where it is non-zero, and multiplied
    by its transpose with one BLAS product.
    """
    if ST is None:
        ST = sp.csr_matrix(S).T.tocsr()
    Zd = _packed_half(ST, _positions(perm, B.shape[0]), B)
    W = Zd @ Zd.T
    return 0.5 * (W + W.T)


class DelassusBuilder:
    """W_hat = B^T A_hat^-1 B from the sparse inverse, re-using entries between steps.

    For a vertex-collider contact the column of B is the unit vector of its vertex, so
    its entries of W_hat are entries of A_hat^-1 between vertices and do not change
    while A does. The builder keeps A_hat^-1 on the vertices of the last call and only
    forms the rows of vertices new to this step (and of general contacts, e.g.
    vertex-triangle, whose weights change): X = Z_new^T Z, with Z^T's rows gathered from
    S^T (a unit column's row of Z^T is a row of S^T, no sparse product) and Z_new
    densified, one sparse-times-dense product whose cost is nnz(Z) per new row. A
    persistent contact patch, where few rows are new, costs a fraction of a full
    Z^T Z (squeeze-ball: 7.2 -> 2.6 ms median per step, docs/benchmarks.md).

    ST: (m, m) S^T as CSR; perm: (m,) vertex of each permuted row; n: vertex count.
    """

    def __init__(self, ST: sp.csr_matrix, perm: np.ndarray, n: int):
        self.ST = ST
        self.pos = _positions(perm, n)
        self.n = n
        self._vertices = np.zeros(0, dtype=np.int64)
        self._W = np.zeros((0, 0))
        self.last_new_rows = 0

    def scalar(self, B: sp.spmatrix, vertex: np.ndarray | None = None) -> np.ndarray:
        """W_hat (k, k) for B (n, k). vertex: (k,) the vertex of each column of B that is a
        unit vector e_v (vertex-collider contacts), -1 for other columns."""
        k = B.shape[1]
        if vertex is None:
            vertex = np.full(k, -1, dtype=np.int64)
        vertex = np.asarray(vertex, dtype=np.int64)
        simple = vertex >= 0
        uv, inv = np.unique(vertex[simple], return_inverse=True)
        general = np.flatnonzero(~simple)
        nu = len(uv)
        size = nu + len(general)  # rows: the unique vertices, then the general columns
        if len(self._vertices):
            at = np.minimum(np.searchsorted(self._vertices, uv), len(self._vertices) - 1)
            cached = self._vertices[at] == uv
        else:
            at = np.zeros(nu, dtype=np.int64)
            cached = np.zeros(nu, dtype=bool)
        fresh = np.concatenate([np.flatnonzero(~cached), nu + np.arange(len(general))])
        if np.any(cached):
            # one gather of the cached block; the rows and columns of new vertices read
            # some cached entry and are overwritten below (cheaper than gathering the
            # cached ones alone and scattering them into place)
            W_old = self._W[np.ix_(at, at)]
            if size == nu:
                M = W_old
            else:
                M = np.empty((size, size))
                M[:nu, :nu] = W_old
        else:
            M = np.empty((size, size))
        if len(fresh):
            Zt = _unit_rows(self.ST, self.pos[uv])
            if len(general):
                Bg = sp.csc_matrix(B)[:, general]
                Zt = sp.vstack([Zt, _half_rows(self.ST, self.pos, Bg)], format="csr")
            X = np.asarray(Zt @ Zt[fresh].T.toarray()).T  # (fresh, size)
            M[fresh, :] = X
            M[:, fresh] = X.T
        self.last_new_rows = len(fresh)
        self._vertices = uv
        self._W = M[:nu, :nu].copy()
        idx = np.empty(k, dtype=np.int64)
        idx[simple] = inv
        idx[general] = nu + np.arange(len(general))
        if np.array_equal(idx, np.arange(size)):  # contacts already in the rows' order
            return M
        return M[np.ix_(idx, idx)]


def scalar_delassus_columns(inverse_columns, B: sp.spmatrix) -> np.ndarray:
    """W_hat = B^T (A_hat^-1 B) (k, k), with ``inverse_columns(B) -> (n, k)`` dense A_hat^-1 B."""
    X = np.asarray(inverse_columns(sp.csc_matrix(B)))
    W = np.asarray(sp.csr_matrix(B).T @ X)
    return 0.5 * (W + W.T)


def scalar_mass_delassus_diagonal(B: sp.spmatrix, inverse_mass: np.ndarray) -> np.ndarray:
    """diag(B^T M_hat^-1 B) (k,): the scalar diagonal of H M^-1 H^T, 1/kg.

    inverse_mass: (n,) 1/m_v (zero for vertices whose motion is prescribed).
    """
    B = sp.csc_matrix(B)
    return np.asarray(B.multiply(B).T @ inverse_mass).ravel()


class DelassusOperator:
    """The compliance C = scale * H A^-1 H^T of k contacts, applied in frame components.

    W_hat: (k, k) scalar B^T A_hat^-1 B. frames: (k, 3, 3) rows (n, t1, t2).
    scale: what turns A^-1 into the displacement response to a force: h^2 when the
    global matrix is M + h^2 K (notes' scaling, C = h^2 W), 1 when it is M / h^2 + K.
    C maps contact forces (k, 3) in N to contact-point displacements (k, 3) in m.
    """

    def __init__(self, W_hat: np.ndarray, frames: np.ndarray, scale: float):
        self.W_hat = np.ascontiguousarray(W_hat)
        self.frames = frames
        self.scale = float(scale)

    @property
    def count(self) -> int:
        return self.W_hat.shape[0]

    def matvec(self, x: np.ndarray, frames: np.ndarray | None = None) -> np.ndarray:
        """C x for x (k, 3) frame components; returns (k, 3).

        frames: optional (k, 3, 3) replacement frames with the same normals (tangents
        rotated in the tangent plane); C expressed in them is the same operator in
        another orthonormal basis per contact.
        """
        F = self.frames if frames is None else frames
        world = np.einsum("kad,ka->kd", F, x)
        y = self.W_hat @ world
        y *= self.scale
        return np.einsum("kad,kd->ka", F, y)

    def diagonal(self) -> np.ndarray:
        """(k,) the diagonal of C, m/N; equal for the three rows of a contact (orthonormal
        frames)."""
        return self.scale * np.diag(self.W_hat).copy()

    def dense(self) -> np.ndarray:
        """(3k, 3k) C as a dense matrix, rows/cols ordered (contact, component). For tests."""
        k = self.count
        Fb = np.zeros((3 * k, 3 * k))
        for c in range(k):
            Fb[3 * c : 3 * c + 3, 3 * c : 3 * c + 3] = self.frames[c]
        return self.scale * Fb @ np.kron(self.W_hat, np.eye(3)) @ Fb.T

    def subset(self, keep: np.ndarray) -> DelassusOperator:
        return DelassusOperator(self.W_hat[np.ix_(keep, keep)], self.frames[keep], self.scale)
