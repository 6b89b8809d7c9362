"""Intel oneMKL PARDISO for the cloth solver's Newton systems, through ctypes.

Why: on the cloth's Newton systems (2-D meshes, 12k dofs, 0.5M non-zeros) CHOLMOD's
supernodal factorisation (Debian's SuiteSparse with OpenBLAS) runs at about 4 GFlop/s,
and it is more than half of a contact frame; PARDISO's numeric factorisation of the same
matrices takes 21.5 ms against 91.2 (4.25x) on the same two cores (``benchmarks/bench_linear.py``).

The binding is ours and small: symmetric positive definite matrices (``mtype = 2``),
the upper triangle in zero-based CSR, or its 3 x 3 blocks in BSR (``BlockUpper``), and the
three phases kept apart, so that the symbolic analysis (ordering, elimination tree) runs
only when the pattern changes: ``analyse`` (phase 11), ``factorize`` (22), ``solve``
(33), ``release`` (-1).
MKL comes from the ``mkl`` wheel (x86-64 only); without it ``available()`` is False
and the caller uses CHOLMOD.

Reproducibility: ``iparm[33] = 1`` puts PARDISO in MKL's conditional numerical
reproducibility mode, in which the factorisation's sums do not depend on the thread
schedule: measured on the cloth's systems, ten fresh solvers agree bit for bit with two
threads, and one thread gives the same bits as two (without it, two-thread runs differ
in the last bits from run to run). Reruns and resumed refines therefore repeat bit for
bit at any MKL thread count, which CHOLMOD with OpenBLAS does not.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
from functools import lru_cache

import numpy as np
import scipy.sparse as sp

log = logging.getLogger(__name__)


class PardisoError(RuntimeError):
    """PARDISO returned a non-zero error code."""

    def __init__(self, phase: int, code: int):
        self.phase, self.code = phase, code
        super().__init__(f"PARDISO phase {phase} failed with error {code} ({_ERRORS.get(code, 'unknown')})")


class NotPositiveDefinite(PardisoError):
    """Error -4: a zero or negative pivot in the Cholesky factorisation."""


_ERRORS = {
    -1: "input inconsistent",
    -2: "not enough memory",
    -3: "reordering problem",
    -4: "zero pivot, numerical factorization or iterative refinement problem",
    -5: "unclassified internal error",
    -6: "reordering failed",
    -7: "diagonal matrix is singular",
    -8: "32-bit integer overflow",
    -9: "not enough memory for OOC",
    -10: "error opening OOC files",
    -11: "read/write error with OOC files",
    -12: "pardiso_64 called from 32-bit library",
}


def _candidates() -> list[str]:
    """Where the mkl wheel puts libmkl_rt: <prefix>/lib (a venv's or the system's)."""
    out = []
    for prefix in dict.fromkeys([sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(sys.executable))]):
        out += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    return out + ["libmkl_rt.so.2", "libmkl_rt.so"]


@lru_cache(maxsize=1)
def _library():
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            lib.pardiso  # noqa: B018  (raises AttributeError when missing)
        except (OSError, AttributeError):
            continue
        lib.pardiso.restype = None
        try:  # single dynamic library: choose Intel threading explicitly, LP64 integers
            lib.MKL_Set_Interface_Layer.argtypes = [ctypes.c_int]
            lib.MKL_Set_Interface_Layer(0)  # MKL_INTERFACE_LP64
        except AttributeError:
            pass
        log.debug("PARDISO from %s", path)
        return lib
    return None


def available() -> bool:
    """True when MKL's PARDISO can be loaded (the ``mkl`` wheel is installed)."""
    if os.environ.get("TISIM_NO_PARDISO"):
        return False
    return _library() is not None


_INT = np.int32


def same_pattern(A: sp.spmatrix, pattern) -> bool:
    """Whether compressed matrix A has the pattern ``(indptr, indices)`` (None: no)."""
    return (
        pattern is not None
        and A.indptr.shape == pattern[0].shape
        and A.indices.shape == pattern[1].shape
        and np.array_equal(A.indptr, pattern[0])
        and np.array_equal(A.indices, pattern[1])
    )


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


class UpperTriangle:
    """A's upper triangle for PARDISO, the mask of its entries kept for A's pattern: a
    Newton loop whose pattern does not change pays one index comparison and a gather
    per system instead of a triangle extraction and sort (3-9 ms at 12k dofs)."""

    def __init__(self):
        self._key = None  # (A.indptr, A.indices, mask, U.indptr, U.indices)

    def __call__(self, A: sp.csr_matrix) -> sp.csr_matrix:
        A = sp.csr_matrix(A)
        k = self._key
        if k is not None and same_pattern(A, k[:2]):
            return sp.csr_matrix((A.data[k[2]], k[4], k[3]), shape=A.shape)
        if not A.has_sorted_indices:
            A = A.sorted_indices()
        rows = np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))
        mask = np.flatnonzero(A.indices >= rows)
        indptr = np.zeros(A.shape[0] + 1, dtype=_INT)
        np.cumsum(np.bincount(rows[mask], minlength=A.shape[0]), out=indptr[1:])
        indices = A.indices[mask].astype(_INT)
        self._key = (A.indptr.copy(), A.indices.copy(), mask, indptr, indices)
        return sp.csr_matrix((A.data[mask], indices, indptr), shape=A.shape)


def block_upper_map(A: sp.csr_matrix, b: int = 3):
    """Where A's ``b x b`` block upper triangle is: (gather, block indptr, block indices),
    the blocks' values (row-major) being A.data[gather]; (None, None, None) when A's pattern
    is not made of whole blocks. About 4 ms at 12k dofs, 0.4M entries (once per pattern)."""
    n = A.shape[0]
    none = (None, None, None)
    if n == 0 or n % b or A.shape[1] != n or not A.has_sorted_indices:
        return none
    nb = n // b
    ip, ix = A.indptr, A.indices
    count = np.diff(ip).reshape(nb, b)
    # the b rows of a block row hold the same columns, in triples b c, b c + 1, ...
    if (count != count[:, :1]).any() or (count[:, 0] % b).any():
        return none
    which = np.repeat(np.tile(np.arange(b, dtype=np.int8), nb), count.ravel())  # each entry's row in its block
    lead = ix[which == 0]
    for i in range(1, b):
        if not np.array_equal(ix[which == i], lead):
            return none
    triples = lead.reshape(-1, b)
    if (triples[:, 0] % b).any() or not np.array_equal(
        triples - triples[:, :1], np.broadcast_to(np.arange(b), triples.shape)
    ):
        return none
    per_row = count[:, 0] // b  # blocks per block row
    brow = np.repeat(np.arange(nb, dtype=np.int64), per_row)
    bcol = triples[:, 0] // b
    up = np.flatnonzero(bcol >= brow)
    start = np.zeros(nb + 1, dtype=np.int64)
    np.cumsum(per_row, out=start[1:])
    bu = brow[up]
    first = ip[b * bu] + b * (up - start[bu])  # the block's first entry
    row_length = b * per_row[bu]
    gather = (first[:, None] + row_length[:, None] * np.repeat(np.arange(b), b) + np.tile(np.arange(b), b)).ravel()
    indptr = np.zeros(nb + 1, dtype=_INT)
    np.cumsum(np.bincount(bu, minlength=nb), out=indptr[1:])
    return gather, indptr, bcol[up].astype(_INT)


class BlockUpper:
    """A's block upper triangle as ``b x b`` blocks (``sp.bsr_matrix``, row-major blocks)
    for PARDISO's BSR input (``iparm[36] = b``), or None when A's pattern is not made of
    whole ``b x b`` blocks.

    The cloth's Newton systems are: every term couples all three dofs of the vertices it
    touches, and the assembler keeps every structural entry. PARDISO then orders and
    analyses the vertex graph instead of the dof graph, 9x fewer edges: on the drape's
    systems (12k dofs, frames 20-25, 100 systems, 39 patterns) the analysis took 2.7-3.0
    ms against 12.9-14.7 ms in CSR, the factorisation 12.0 against 10.7-11.4 ms, the solve
    2.5 against 2.8 ms (``benchmarks/bench_linear.py`` times both). The map from A's values to
    the blocks is built once per pattern (about as long as the CSR triangle's); then each
    matrix costs one gather.
    """

    def __init__(self, block: int = 3):
        self.block = int(block)
        self._key = None  # (A.indptr, A.indices, gather or None, block indptr, block indices)

    def __call__(self, A: sp.csr_matrix) -> sp.bsr_matrix | None:
        A = sp.csr_matrix(A)
        k = self._key
        if k is None or not same_pattern(A, k[:2]):
            k = self._key = (A.indptr.copy(), A.indices.copy(), *block_upper_map(A, self.block))
        if k[2] is None:
            return None
        b = self.block
        return sp.bsr_matrix((A.data[k[2]].reshape(-1, b, b), k[4], k[3]), shape=A.shape)


class Pardiso:
    """One SPD system pattern at a time: analyse once per pattern, factorise per matrix.
    The matrices come from ``UpperTriangle`` (CSR) or ``BlockUpper`` (BSR).

    threads: MKL threads for every phase (None: MKL's default, the physical cores); the
    results do not depend on it (reproducibility mode, module docstring).
    single: factorise and solve in single precision (``iparm[27] = 1``): the matrix is
    rounded to float32 and ``solve`` returns float64 values of a float32 solution, with
    a relative residual of about 1e-5 on the cloth's systems; the caller refines
    (``SPDSolver``). The factorisation is about 1.4x faster.
    """

    def __init__(self, threads: int | None = None, single: bool = False):
        lib = _library()
        if lib is None:
            raise RuntimeError("MKL PARDISO is not available (pip install mkl)")
        self._lib = lib
        self.threads = None if threads is None else int(threads)
        self._pt = np.zeros(64, dtype=np.int64)  # PARDISO's opaque handle (64 pointers)
        self._iparm = np.zeros(64, dtype=_INT)
        ip = self._iparm
        ip[0] = 1  # these settings, not the defaults
        # minimum-degree ordering: on the drape's Newton systems (12k dofs, frames 33 and 37,
        # interleaved) its analysis takes 13.7 ms against METIS nested dissection's 25.7, the
        # factorisation 16.2 against 19.3 ms, with 1.61M factor non-zeros against 1.63M; the
        # analysis reruns whenever self-contact changes the pattern (247 times in the 469
        # Newton iterations of the 40-frame drape's frames 16-39)
        ip[1] = 0
        ip[7] = 0  # iterative refinement only after perturbed pivots (never for SPD)
        ip[9] = 8  # pivot perturbation 1e-8 (not used for SPD)
        ip[17] = -1  # report the factor's non-zeros in iparm[17]
        ip[26] = 0  # no matrix checker (we build sorted upper-triangular CSR)
        ip[33] = 1  # conditional numerical reproducibility: the same bits at any thread count
        ip[34] = 1  # zero-based indices
        ip[27] = 1 if single else 0  # single precision: a, b, x and the factor in float32
        self.single = bool(single)
        self._real = np.float32 if single else np.float64
        self._n = 0
        self._block = 0  # 0: CSR; b: BSR with b x b blocks (iparm[36])
        self._indptr = None
        self._indices = None
        self._data = None
        self.analysed = 0
        self.factored = 0

    # the C call ------------------------------------------------------------------
    def _call(self, phase: int, b: np.ndarray | None = None, x: np.ndarray | None = None, nrhs: int = 1) -> None:
        err = ctypes.c_int32(0)
        one = ctypes.c_int32(1)
        mtype = ctypes.c_int32(2)
        ph = ctypes.c_int32(phase)
        n = ctypes.c_int32(self._n)
        nr = ctypes.c_int32(nrhs)
        msg = ctypes.c_int32(0)
        perm = np.zeros(max(self._n * max(self._block, 1), 1), dtype=_INT)
        dummy = np.zeros(1, dtype=self._real)
        data = self._data if self._data is not None else dummy
        ia = self._indptr if self._indptr is not None else np.zeros(1, _INT)
        ja = self._indices if self._indices is not None else np.zeros(1, _INT)
        bb = b if b is not None else dummy
        xx = x if x is not None else dummy
        local = self._set_threads()
        try:
            self._lib.pardiso(
                _ptr(self._pt), ctypes.byref(one), ctypes.byref(one), ctypes.byref(mtype), ctypes.byref(ph),
                ctypes.byref(n), _ptr(data), _ptr(ia), _ptr(ja), _ptr(perm), ctypes.byref(nr),
                _ptr(self._iparm), ctypes.byref(msg), _ptr(bb), _ptr(xx), ctypes.byref(err),
            )  # fmt: skip
        finally:
            if local:  # back to MKL's global setting
                self._lib.MKL_Set_Num_Threads_Local(ctypes.c_int(0))
        if err.value != 0:
            cls = NotPositiveDefinite if err.value == -4 else PardisoError
            raise cls(phase, int(err.value))

    def _set_threads(self) -> bool:
        """MKL's thread count for this thread's next calls, when ``threads`` is set."""
        if self.threads is None or not hasattr(self._lib, "MKL_Set_Num_Threads_Local"):
            return False
        self._lib.MKL_Set_Num_Threads_Local(ctypes.c_int(self.threads))
        return True

    # the phases --------------------------------------------------------------------
    @staticmethod
    def _block_of(U) -> int:
        return U.blocksize[0] if U.format == "bsr" else 0

    def analyse(self, U: sp.csr_matrix | sp.bsr_matrix) -> None:
        """Symbolic analysis of U's pattern (the upper triangle, from ``UpperTriangle``, or
        its blocks, from ``BlockUpper``)."""
        if self._indptr is not None:
            self.release()
        self._block = self._block_of(U)
        self._iparm[36] = self._block
        self._n = U.shape[0] // max(self._block, 1)
        self._indptr = np.ascontiguousarray(U.indptr, dtype=_INT)
        self._indices = np.ascontiguousarray(U.indices, dtype=_INT)
        self._data = np.ascontiguousarray(U.data.reshape(-1), dtype=self._real)
        self._iparm[17] = -1  # report this pattern's factor non-zeros (PARDISO overwrites it)
        self._call(11)
        self.analysed += 1

    def factorize(self, U: sp.csr_matrix | sp.bsr_matrix) -> None:
        """Numeric factorisation of U (from ``UpperTriangle`` or ``BlockUpper``), after a
        symbolic analysis when its pattern differs from the last one analysed;
        NotPositiveDefinite on a zero or negative pivot. The analysis depends on the
        pattern alone, so results do not depend on earlier matrices."""
        if self._block_of(U) != self._block or not same_pattern(
            U, None if self._indptr is None else (self._indptr, self._indices)
        ):
            self.analyse(U)
        self._data = np.ascontiguousarray(U.data.reshape(-1), dtype=self._real)
        self._call(22)
        self.factored += 1

    def solve(self, b: np.ndarray) -> np.ndarray:
        """The solution (float64) of the last factorised system for b (n,) or (n, k)."""
        b = np.ascontiguousarray(b, dtype=self._real)
        nrhs = 1 if b.ndim == 1 else b.shape[1]
        if b.ndim == 2:
            b = np.asfortranarray(b)
        x = np.zeros_like(b)
        self._call(33, b, x, nrhs)
        return x.astype(np.float64, copy=False)

    @property
    def factor_nonzeros(self) -> int:
        """The factor's non-zeros (with BSR input: its entries, blocks times b^2)."""
        return int(self._iparm[17]) * max(self._block, 1) ** 2

    def release(self) -> None:
        if self._indptr is not None and self._pt.any():
            self._call(-1)
        self._pt[:] = 0

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass
