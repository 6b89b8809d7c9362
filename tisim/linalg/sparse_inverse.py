"""The sparse inverse of a Cholesky factor, S = L^-1 (notes, §2.3 "Sparse inverse global step").

With the fill-reducing permutation p of a :class:`~tisim.linalg.cholesky.Factor`
(``L L^T = A[p][:, p]``),

    A^-1 x = P^T S^T S P x,    (P x)_i = x[p[i]],

so one solve is ``y = x[p]; y = S^T (S y); out[p] = y``: two sparse
matrix-vector products instead of two triangular solves.

Structure (the notes' Theorem 1): column j of S is structurally non-zero exactly
on the elimination-tree path from j to its root, so nnz(S) = sum_j depth(j),
known from the symbolic factor before S is built. Columns are independent and
are computed in parallel by a Taichi kernel, in place in the CSC arrays of S:
the entry of node i in column j sits at offset depth(j) - depth(i) of the
column, so no search and no per-column workspace is needed.

Functions take and return numpy/scipy objects; only :func:`sparse_inverse`
runs a Taichi kernel (Taichi must be initialised through ``tisim.backend``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from tisim.linalg.cholesky import Factor

log = logging.getLogger(__name__)

__all__ = [
    "SparseInverse",
    "SparseInverseTooLarge",
    "elimination_tree",
    "etree_depths",
    "etree_from_factor",
    "predict_memory_mb",
    "predict_nnz",
    "sparse_inverse",
]


class SparseInverseTooLarge(MemoryError):
    """The predicted size of S exceeds the allowed memory.

    predicted_mb: the predicted memory in MB; limit_mb: the limit; nnz: predicted nnz(S).
    """

    def __init__(self, predicted_mb: float, limit_mb: float, nnz: int):
        self.predicted_mb = predicted_mb
        self.limit_mb = limit_mb
        self.nnz = nnz
        super().__init__(
            f"sparse inverse would need {predicted_mb:.1f} MB (nnz(S) = {nnz:,}) but the limit is {limit_mb:.1f} MB"
        )


def elimination_tree(A) -> np.ndarray:
    """Elimination tree of the symmetric matrix ``A`` (n x n; its upper triangle is read).

    Liu's algorithm with path compression. Returns parent (n,) int64, -1 at roots.
    This is independent of any numerical factor (used to cross-check
    :func:`etree_from_factor`).
    """
    A = sp.csc_matrix(A)
    n = A.shape[0]
    parent = np.full(n, -1, dtype=np.int64)
    ancestor = np.full(n, -1, dtype=np.int64)
    indptr, indices = A.indptr, A.indices
    for j in range(n):
        for i in indices[indptr[j] : indptr[j + 1]]:
            i = int(i)
            # walk from i up to the root of its current subtree, compressing the path to j
            while i != -1 and i < j:
                nxt = ancestor[i]
                ancestor[i] = j
                if nxt == -1:
                    parent[i] = j
                i = nxt
    return parent


def etree_from_factor(L: sp.csc_matrix) -> np.ndarray:
    """Elimination tree from the structure of a Cholesky factor: the parent of j
    is the row of the first sub-diagonal entry of column j of ``L``.

    L: (n, n) lower-triangular CSC with the symbolic structure (explicit zeros
    kept), row indices sorted. Returns parent (n,) int64, -1 at roots.
    """
    L = sp.csc_matrix(L)
    if not L.has_sorted_indices:
        L = L.sorted_indices()
    n = L.shape[0]
    counts = np.diff(L.indptr)
    if np.any(counts < 1) or np.any(L.indices[L.indptr[:-1]] != np.arange(n)):
        raise ValueError("factor column without its diagonal entry first (not a Cholesky factor?)")
    parent = np.full(n, -1, dtype=np.int64)
    has = counts > 1
    parent[has] = L.indices[L.indptr[:-1][has] + 1]
    return parent


def etree_depths(parent: np.ndarray) -> np.ndarray:
    """depth (n,) int64: number of nodes on the path from j to its root, j included.

    Requires parent[j] > j (true for every elimination tree).
    """
    parent = np.asarray(parent, dtype=np.int64)
    n = len(parent)
    if n and np.any((parent != -1) & (parent <= np.arange(n))):
        raise ValueError("not an elimination tree: a parent index is not larger than its child")
    # parents have larger indices: sweep from the roots (high indices) down
    par = parent.tolist()
    d = [1] * n
    for j in range(n - 1, -1, -1):
        p = par[j]
        if p >= 0:
            d[j] = d[p] + 1
    return np.asarray(d, dtype=np.int64)


def predict_nnz(parent: np.ndarray) -> int:
    """nnz(S) = sum of the etree depths (the notes' Theorem 1)."""
    return int(etree_depths(parent).sum())


def predict_memory_mb(nnz: int, n: int, value_bytes: int = 8, index_bytes: int = 4, copies: int = 2) -> float:
    """MB (1e6 bytes) to store ``copies`` CSR copies of an n x n matrix with nnz entries
    (S and S^T are both kept so that neither product is a transposed one)."""
    one = nnz * (value_bytes + index_bytes) + (n + 1) * 8
    return copies * one / 1e6


@dataclass(eq=False)
class SparseInverse:
    """S = L^-1 of a factor ``L L^T = A[perm][:, perm]``, with both orientations stored.

    S: (n, n) lower-triangular CSR. ST: S^T as CSR (i.e. the CSC arrays of S).
    perm: (n,) the factor's permutation. parent/depth: (n,) elimination tree.
    nnz: nnz(S) (equals the predicted sum of depths). build_seconds: wall time.
    """

    S: sp.csr_matrix
    ST: sp.csr_matrix
    perm: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    nnz: int
    build_seconds: float

    @property
    def n(self) -> int:
        return self.S.shape[0]

    @property
    def memory_mb(self) -> float:
        """MB of one copy of S (values + indices + row pointers)."""
        return (self.S.data.nbytes + self.S.indices.nbytes + self.S.indptr.nbytes) / 1e6

    @property
    def memory_both_mb(self) -> float:
        """MB of S and S^T together."""
        return self.memory_mb + (self.ST.data.nbytes + self.ST.indices.nbytes + self.ST.indptr.nbytes) / 1e6

    def solve(self, b: np.ndarray) -> np.ndarray:
        """A^-1 b = P^T S^T S P b on the host, b of shape (n,) or (n, k)."""
        b = np.asarray(b, dtype=np.float64)
        y = self.ST @ (self.S @ b[self.perm])
        out = np.empty_like(y)
        out[self.perm] = y
        return out

    def half_columns(self, B) -> sp.csr_matrix:
        """Z = S P B (sparse), so that B^T A^-1 B = Z^T Z. B: (n, k) sparse or dense."""
        if sp.issparse(B):
            B = sp.csr_matrix(B)[self.perm]
            return sp.csr_matrix(self.S @ B)
        return sp.csr_matrix(self.S @ np.asarray(B)[self.perm])


def _fill_inverse(L, parent, depth, Sp, Si, Sx, entry_parallel: bool | None) -> None:
    """Compute the CSC arrays (Si, Sx) of S = L^-1 in place, level by level of the etree
    (columns depend on their ancestors' columns), with Taichi kernels.

    Every array goes to the device once (on the CPU backend the kernels work on the numpy
    buffers in place); a numpy argument would be copied to a GPU and back at every level
    (81 s instead of 1 s for 7k vertices under Vulkan). entry_parallel: one thread per
    entry of S (:func:`~tisim.linalg.spmv.inverse_entries`; short threads, the GPU
    kernel) or one thread per column (:func:`~tisim.linalg.spmv.inverse_columns`; less
    work, the CPU kernel); None picks by backend.
    """
    from tisim import backend
    from tisim.linalg.spmv import (
        device_array,
        inverse_columns,
        inverse_entries,
        inverse_paths,
        read_back,
    )

    if entry_parallel is None:
        entry_parallel = backend.current().arch != "cpu"
    order = np.argsort(depth, kind="stable").astype(np.int32)
    bounds = np.searchsorted(depth[order], np.arange(1, int(depth.max(initial=0)) + 2))
    Lp, Li, Lx, par, dep, Sp_d, Si_d, Sx_d, order_d = (
        device_array(a)
        for a in (
            np.ascontiguousarray(L.indptr, dtype=np.int32),
            np.ascontiguousarray(L.indices, dtype=np.int32),
            np.ascontiguousarray(L.data, dtype=np.float64),
            parent.astype(np.int32),
            depth.astype(np.int32),
            Sp,
            Si,
            Sx,
            order,
        )
    )
    if entry_parallel:
        inverse_paths(par, dep, Sp_d, Si_d)
        for lev in range(len(bounds) - 1):
            b0, b1 = int(bounds[lev]), int(bounds[lev + 1])
            if b1 > b0:
                inverse_entries(order_d, b0, b1 - b0, lev + 1, Lp, Li, Lx, dep, Sp_d, Si_d, Sx_d)
    else:
        for lev in range(len(bounds) - 1):
            b0, b1 = int(bounds[lev]), int(bounds[lev + 1])
            inverse_columns(order_d, b0, b1, Lp, Li, Lx, par, dep, Sp_d, Si_d, Sx_d)
    read_back(Si_d, Si)
    read_back(Sx_d, Sx)


def sparse_inverse(
    factor: Factor, memory_limit_mb: float | None = None, *, entry_parallel: bool | None = None
) -> SparseInverse:
    """Compute S = L^-1 of ``factor`` explicitly and sparsely.

    The size is predicted from the elimination tree first; when the predicted
    memory of S and S^T (f64 values, int32 indices) exceeds ``memory_limit_mb``,
    :class:`SparseInverseTooLarge` is raised before anything large is allocated.
    entry_parallel: the kernel (see :func:`_fill_inverse`); None picks by backend.
    """
    import time

    t0 = time.perf_counter()
    L = sp.csc_matrix(factor.L, dtype=np.float64)
    if not L.has_sorted_indices:
        L = L.sorted_indices()
    n = L.shape[0]
    parent = etree_from_factor(L)
    depth = etree_depths(parent)
    nnz = int(depth.sum())
    mb = predict_memory_mb(nnz, n)
    if memory_limit_mb is not None and mb > memory_limit_mb:
        raise SparseInverseTooLarge(mb, memory_limit_mb, nnz)
    if nnz >= 2**31:
        raise SparseInverseTooLarge(mb, mb, nnz)  # int32 column indices would overflow
    Sp = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(depth, out=Sp[1:])
    Si = np.empty(nnz, dtype=np.int32)
    Sx = np.empty(nnz, dtype=np.float64)
    _fill_inverse(L, parent, depth, Sp, Si, Sx, entry_parallel)
    if not np.all(np.isfinite(Sx)):
        raise FloatingPointError("sparse inverse has non-finite entries (factor not SPD?)")
    # S is built column by column (CSC); its CSC arrays are exactly S^T in CSR
    indptr = Sp.astype(np.int32) if nnz < 2**31 else Sp
    ST = sp.csr_matrix((Sx, Si, indptr), shape=(n, n))
    S = ST.T.tocsr()  # CSR of S: row i holds the columns whose path contains i
    S.sort_indices()
    dt = time.perf_counter() - t0
    log.info(
        "sparse inverse: n = %d, nnz(S) = %d (%.1f MB for S and S^T), built in %.2f s",
        n,
        nnz,
        mb,
        dt,
    )
    return SparseInverse(
        S=S,
        ST=ST,
        perm=np.asarray(factor.perm, dtype=np.int64),
        parent=parent,
        depth=depth,
        nnz=nnz,
        build_seconds=dt,
    )
