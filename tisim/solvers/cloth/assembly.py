"""Host-side sparse assembly of local element Hessians (numpy, vectorised)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tisim import backend
from tisim.backend import download, upload


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


def structural_sum(A: sp.csr_matrix, rows, cols, vals) -> sp.csr_matrix:
    """A plus the triplets (rows, cols, vals), keeping every entry of both patterns, zero
    values included (scipy's sparse sum drops entries that come out zero).

    The Newton system's pattern is then set by the elements and the active contact pairs,
    not by which of their values happen to be zero this iteration (a compressed face's
    clamped out-of-plane modes, a flat sheet's bending blocks), so the linear solver's
    symbolic analysis is reused while the contact pairs stay within the elastic pattern.
    Implemented as a complex sum: every entry carries imaginary part 1, so no sum is zero,
    and the real parts add exactly as real numbers do."""
    n = A.shape[0]
    C = sp.coo_matrix((np.asarray(vals, dtype=np.float64) + 1j, (rows, cols)), shape=A.shape).tocsr()
    Ac = sp.csr_matrix((A.data + 1j, A.indices, A.indptr), shape=(n, n))
    S = Ac + C
    return sp.csr_matrix((np.ascontiguousarray(S.data.real), S.indices, S.indptr), shape=A.shape)


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


class DeviceAssembler:
    """A fixed-pattern CSR matrix whose values are summed on the device.

    parts: list of stencils arrays (k, s) (vertex indices, no -1) of element groups with
    (3 s x 3 s) local Hessians; size: number of scalar dofs (3 n). Each group gets a
    ``slots`` ndarray (k, 3 s, 3 s) of positions in the CSR value array ``data``
    (``ti.ndarray(real, nnz)``); kernels add local Hessians into ``data`` there
    (``shell_kernels.scatter_blocks`` / ``scatter_face_hessians``), and :meth:`matrix`
    reads the nnz values back once. This replaces copying every local Hessian to the host
    (9 x 9 per face, 12 x 12 per hinge) and summing them there with ``bincount``.
    """

    def __init__(self, size: int, parts: list[np.ndarray]):
        import taichi as ti

        from tisim import backend

        triplets = [local_to_coo(np.ones((len(st), 3 * st.shape[1], 3 * st.shape[1])), st) for st in parts]
        rows = np.concatenate([t[0] for t in triplets])
        cols = np.concatenate([t[1] for t in triplets])
        self.pattern = PatternAssembler(size, rows, cols)
        self.size = size
        self.slots = []
        start = 0
        for st in parts:
            k, d = len(st), 3 * st.shape[1]
            sl = self.pattern._slot[start:start + k * d * d].reshape(k, d, d).astype(np.int32)
            start += k * d * d
            a = ti.ndarray(ti.i32, shape=(max(k, 1), d, d))
            upload(a, sl if k else np.full((1, d, d), -1, np.int32))
            self.slots.append(a)
        self.data = ti.ndarray(backend.real(), shape=max(self.pattern._nnz, 1))

    def zero(self) -> None:
        from tisim.energies.shell_kernels import zero_scalars

        if not backend.zero(self.data):
            zero_scalars(self.data)

    def matrix(self) -> sp.csr_matrix:
        """The summed matrix (CSR, sorted indices, float64)."""
        p = self.pattern
        data = download(self.data)[: p._nnz].astype(np.float64, copy=False)
        return sp.csr_matrix((data, p._indices, p._indptr), shape=(self.size, self.size))


class ContactTriplets:
    """COO triplets of local contact Hessians over the Newton system's unknowns, built on
    the device (``assembly_kernels``): per-pair counts, a prefix sum, then each pair
    writes its nonzero entries at its offset (deterministic order).

    n: vertex count. :meth:`set_unknowns` takes the (n,) map vertex -> index among the
    unknowns (-1: not an unknown); rows and columns come out as 3 index + axis.
    """

    def __init__(self, n: int):
        import taichi as ti

        self.n = n
        self.unknowns = ti.ndarray(ti.i32, shape=max(n, 1))
        self._key = None

    def set_unknowns(self, sysvert: np.ndarray) -> None:
        key = sysvert.tobytes()
        if key != self._key:  # unchanged through most Newton iterations
            upload(self.unknowns, np.asarray(sysvert, dtype=np.int32))
            self._key = key

    def triplets(self, H, stencils, rows: int):
        from tisim import backend
        from tisim.solvers.cloth.assembly_kernels import count_entries, emit_coo

        if rows <= 0:
            return None
        counts = np.zeros(rows, dtype=np.int32)
        count_entries(stencils, rows, self.unknowns, counts)
        total = int(counts.sum())
        if total == 0:
            return None
        offsets = np.zeros(rows, dtype=np.int32)
        np.cumsum(counts[:-1], out=offsets[1:])
        r = np.empty(total, dtype=np.int32)
        c = np.empty(total, dtype=np.int32)
        v = np.empty(total, dtype=backend.np_real())
        emit_coo(H, stencils, rows, self.unknowns, offsets, r, c, v)
        return r, c, v
