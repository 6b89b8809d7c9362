"""Host-side sparse assembly of local element Hessians (numpy, vectorised)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def local_to_coo(H: np.ndarray, stencils: np.ndarray, dof_map: np.ndarray | None = None):
    """COO triplets of a batch of local Hessians.

    H: (k, 3s, 3s) local Hessians over ``s`` vertices. stencils: (k, s) vertex indices
    (-1 for an unused slot). dof_map: (n,) vertex -> system vertex index, -1 for a
    vertex that is not a system unknown (its rows and columns are dropped); None keeps
    the vertex numbering. Returns (rows, cols, vals) over scalar dofs 3 v + axis.
    """
    k, d, _ = H.shape
    s = d // 3
    st = np.asarray(stencils[:k, :s], dtype=np.int64)
    if dof_map is not None:
        st = np.where(st >= 0, dof_map[np.maximum(st, 0)], -1)
    dofs = (3 * st[:, :, None] + np.arange(3)).reshape(k, d)
    dofs = np.where(np.repeat(st, 3, axis=1) >= 0, dofs, -1)
    r = np.broadcast_to(dofs[:, :, None], (k, d, d))
    c = np.broadcast_to(dofs[:, None, :], (k, d, d))
    keep = (r >= 0) & (c >= 0)
    return r[keep], c[keep], H[keep]


class PatternAssembler:
    """Sum COO triplets into a CSR matrix of size (N, N).

    Building a CSR matrix from scratch every Newton iteration spends most of its time
    sorting; ``fixed`` triplets whose (row, col) pattern never changes (elastic
    elements) are mapped to CSR slots once, and later calls only ``bincount`` their
    values. Other triplets (contact) are added as a second, small matrix.
    """

    def __init__(self, size: int, rows: np.ndarray, cols: np.ndarray):
        self.size = size
        key = rows.astype(np.int64) * size + cols
        uniq, self._slot = np.unique(key, return_inverse=True)
        self._rows = (uniq // size).astype(np.int32)
        self._cols = (uniq % size).astype(np.int32)
        m = sp.csr_matrix((np.arange(1, len(uniq) + 1, dtype=np.float64), (self._rows, self._cols)),
                          shape=(size, size))
        m.sort_indices()
        # position of each unique (row, col) in the CSR data array
        order = np.empty(len(uniq), dtype=np.int64)
        order[(m.data - 1).astype(np.int64)] = np.arange(len(uniq))
        self._indptr, self._indices = m.indptr, m.indices
        self._slot = order[self._slot]
        self._nnz = len(uniq)

    def matrix(self, vals: np.ndarray, extra=None, diag: np.ndarray | None = None) -> sp.csr_matrix:
        """CSR from the fixed-pattern values (in the order of the construction's
        triplets), plus ``extra`` = (rows, cols, vals) triplets and a diagonal."""
        data = np.bincount(self._slot, weights=vals, minlength=self._nnz)
        A = sp.csr_matrix((data, self._indices, self._indptr), shape=(self.size, self.size))
        if extra is not None and len(extra[0]):
            A = A + sp.csr_matrix((extra[2], (extra[0], extra[1])), shape=(self.size, self.size))
        if diag is not None:
            A = A + sp.diags(diag, format="csr")
        return A
