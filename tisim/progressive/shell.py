"""The prolonged elastic term: the finest level's shell energy evaluated at a coarser
level's prolonged positions, with its gradient and restricted Hessian U^T H U.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


class ProlongedShell:
    """Psi_L(P_l(x)): the finest level's shell energy at a level's prolonged positions.

    Offsets a(x) are frozen at the Newton iterate where the gradient and Hessian were
    last evaluated (notes §2.4: keeps the energy consistent with its gradient inside a
    line search); gradient U^T grad Psi_L, Hessian U^T H_L U (PSD since H_L is).
    """

    def __init__(self, fine, P):
        self.fine = fine
        self.P = P
        self._a: np.ndarray | None = None
        self.n = P.coarse_count
        self._restrict = None  # (H's indptr, indices, apply, C's indptr, indices): see _restriction_map
        self._last = None  # the last full evaluation and its offsets (see ShellTerm.evaluate)

    def restrict_hessian(self, Hf: sp.csr_matrix) -> sp.csr_matrix:
        """U3^T Hf U3. The fine Hessian's pattern is fixed (the assembler's), so the
        product is linear in Hf.data, through maps built once (each fine entry
        (3i+a, 3j+b) adds U[i, I] U[j, J] to (3I+a, 3J+b)): two sparse mat-vecs instead
        of two sparse-sparse products with their symbolic passes."""
        r = self._restrict
        if (
            r is None
            or not (r[0] is Hf.indptr or np.array_equal(r[0], Hf.indptr))
            or not (r[1] is Hf.indices or np.array_equal(r[1], Hf.indices))
        ):
            r = self._restrict = _restriction_map(Hf, self.P.U)
        apply, indptr, indices = r[2], r[3], r[4]
        nc = 3 * self.n
        return sp.csr_matrix((apply(Hf.data), indices, indptr), shape=(nc, nc))

    def _prolong(self, x: np.ndarray, refresh: bool) -> np.ndarray:
        if refresh or self._a is None:
            self._a = self.P.offsets(x)
        return self.P.U @ x + self._a

    def exact_energy(self, x: np.ndarray) -> float:
        return float(self.fine.evaluate(self.P.apply(x), energy_only=True, folded=False)[0])

    def evaluate(self, x: np.ndarray, hessian: bool = True, energy_only: bool = False):
        if energy_only:
            return self.fine.evaluate(self._prolong(x, False), energy_only=True, folded=False)[0], None, None
        last = self._last
        if last is not None and np.array_equal(last[0], x):
            # the same iterate as the last full evaluation: its offsets, energy and
            # derivatives, without prolonging, evaluating and restricting again
            self._a = last[4]
            return last[1], last[2], (last[3] if hessian else None)
        y = self._prolong(x, True)
        E, gf, Hf = self.fine.evaluate(y, hessian=hessian, folded=False)
        g = self.P.U.T @ gf
        if not hessian:
            return E, g, None
        H = self.restrict_hessian(Hf)
        from tisim.solvers.cloth.solver import remember

        self._last = remember(x, E, g, H, self._a)
        return E, g, H


def _times_u3(rows: np.ndarray, cols: np.ndarray, U: sp.csr_matrix):
    """The pattern of X U3 for X with entries at (rows, cols), and M with
    (X U3).data = M @ X.data (in the order of the given entries); the result's entries
    sorted row-major. Entry (r, 3j + b) of X adds U[j, J] X[r, 3j + b] to (r, 3J + b)."""
    nc3 = 3 * U.shape[1]
    cnt = np.diff(U.indptr).astype(np.int64)
    v = cols // 3
    reps = cnt[v]
    k = np.repeat(np.arange(len(cols), dtype=np.int64), reps)
    pos = np.repeat(U.indptr[v].astype(np.int64) - np.cumsum(reps) + reps, reps) + np.arange(reps.sum())
    new_c = 3 * U.indices[pos].astype(np.int64) + cols[k] % 3
    key = rows[k] * nc3 + new_c
    uniq, slot = np.unique(key, return_inverse=True)
    M = sp.csr_matrix((U.data[pos], (slot, k)), shape=(len(uniq), len(cols)))
    return M, uniq // nc3, uniq % nc3


def _times_u(rows: np.ndarray, cols: np.ndarray, U: sp.csr_matrix):
    """:func:`_times_u3` on 3x3 blocks: the block pattern of X U for X with blocks at
    (rows, cols) (vertex indices), and M with the blocks of X U = M @ X's blocks (each a
    row of 9 values, in the order given); the result's blocks sorted row-major."""
    nc = U.shape[1]
    cnt = np.diff(U.indptr).astype(np.int64)
    reps = cnt[cols]
    k = np.repeat(np.arange(len(cols), dtype=np.int64), reps)
    pos = np.repeat(U.indptr[cols].astype(np.int64) - np.cumsum(reps) + reps, reps) + np.arange(reps.sum())
    key = rows[k] * nc + U.indices[pos].astype(np.int64)
    uniq, slot = np.unique(key, return_inverse=True)
    M = sp.csr_matrix((U.data[pos], (slot, k)), shape=(len(uniq), len(cols)))
    return M, uniq // nc, uniq % nc


def _restriction_map(Hf: sp.csr_matrix, U: sp.csr_matrix):
    """(Hf.indptr, Hf.indices, apply, indptr, indices) with U3^T Hf U3 =
    CSR((apply(Hf.data), indices, indptr)) for every Hf of this pattern; U: (n_fine,
    n_coarse) weights.

    The shell Hessian's pattern is made of full 3x3 vertex blocks, so the two maps of
    :func:`_scalar_restriction_map` act on blocks instead: one sparse map entry per
    block and prolongation weight, applied to the block's 9 values at once (a sparse
    matrix times a 9-column array), which costs a third to a half of the scalar maps'
    indexing per call. Each entry of the result sums the same products in the same
    order as the scalar maps, so the two agree bit for bit. A pattern that is not made
    of full blocks takes the scalar maps."""
    Hf = sp.csr_matrix(Hf)
    U = sp.csr_matrix(U)
    n = Hf.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(Hf.indptr))
    cols = Hf.indices.astype(np.int64)
    nv = n // 3
    bkey = (rows // 3) * nv + cols // 3
    blocks, blk = np.unique(bkey, return_inverse=True)
    if n % 3 or len(cols) != 9 * len(blocks) or len(np.unique(9 * blk + 3 * (rows % 3) + cols % 3)) != len(cols):
        return _scalar_restriction_map(Hf, U)
    hperm = np.empty(len(cols), dtype=np.int64)  # the 9 values of each block, row-major in the block
    hperm[9 * blk + 3 * (rows % 3) + cols % 3] = np.arange(len(cols))
    M1, tr, tc = _times_u(blocks // nv, blocks % nv, U)  # T = Hf U, by blocks
    M2, cr, cc = _times_u(tc, tr, U)  # T^T U = C^T: blocks (block column of C, block row of C)
    order = np.lexsort((cr, cc))  # C's blocks row-major
    M2 = M2[order]
    bi, bj = cc[order], cr[order]
    nc = U.shape[1]
    per_row = np.bincount(bi, minlength=nc).astype(np.int64)  # blocks in each block row of C
    start = np.concatenate(([0], np.cumsum(per_row)))  # first block of each block row
    p = np.arange(len(bi), dtype=np.int64) - start[bi]  # a block's place in its block row
    a = np.arange(3, dtype=np.int64)
    # the block (I, J)'s value (a, b) goes to row 3I + a of C's CSR, at place 3p + b there
    dest = (
        (9 * start[bi])[:, None, None]
        + (3 * per_row[bi])[:, None, None] * a[None, :, None]
        + (3 * p)[:, None, None]
        + a[None, None, :]
    )
    cperm = np.empty(9 * len(bi), dtype=np.int64)
    cperm[dest.ravel()] = np.arange(9 * len(bi))
    indices = np.empty(9 * len(bi), dtype=np.int32)
    indices[dest.ravel()] = np.broadcast_to((3 * bj)[:, None, None] + a[None, None, :], dest.shape).ravel()
    indptr = np.concatenate(([0], np.cumsum(np.repeat(3 * per_row, 3))))

    def apply(data, M1=M1, M2=M2, hperm=hperm, cperm=cperm):
        c9 = M2 @ (M1 @ np.take(data, hperm).reshape(-1, 9))
        return np.take(c9.ravel(), cperm)

    return Hf.indptr, Hf.indices, apply, indptr, indices


def _scalar_restriction_map(Hf: sp.csr_matrix, U: sp.csr_matrix):
    """:func:`_restriction_map` entry by entry, for any pattern.
    CSR((apply(Hf.data), indices, indptr)) for every Hf of this pattern; U: (n_fine,
    n_coarse) weights.

    apply is two sparse maps, T = Hf U3 and then U3^T T: with a wide prolongation stencil
    (Loop's, ~8 coarse vertices per fine one) a single map from Hf to C would have
    ~64 entries per Hf entry, the two ~8 each."""
    Hf = sp.csr_matrix(Hf)
    U = sp.csr_matrix(U)
    nc3 = 3 * U.shape[1]
    rows = np.repeat(np.arange(Hf.shape[0], dtype=np.int64), np.diff(Hf.indptr))
    cols = Hf.indices.astype(np.int64)
    M1, tr, tc = _times_u3(rows, cols, U)  # T = Hf U3
    M2, cr, cc = _times_u3(tc, tr, U)  # T^T U3 = C^T: entries (column of C, row of C)
    order = np.lexsort((cr, cc))  # C's entries row-major
    M2 = M2[order]
    crow, ccol = cc[order], cr[order]
    indptr = np.zeros(nc3 + 1, dtype=np.int64)
    np.add.at(indptr, crow + 1, 1)

    def apply(data, M1=M1, M2=M2):
        return M2 @ (M1 @ data)

    return Hf.indptr, Hf.indices, apply, np.cumsum(indptr), ccol.astype(np.int32)
