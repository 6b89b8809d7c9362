"""The global step of the local-global solver: three interchangeable back-ends.

All of them solve the constant system of notes §2.2 in the notes' scaling,

    A = M' + h^2 sum_i w_i G_i^T G_i = A_hat kron I_3,   M' = (1 + c h) M,

restricted to the free vertices: held vertices (kinematic handles) are
eliminated, A_ff q_f = b_f - A_fp q_p, and A_hat_ff is the only matrix
factored (scalar, n_free x n_free). Inside the iteration they update the
Taichi iterate in place, x_f += A_ff^-1 r_f, where r = b - A x is the residual
assembled by the local step (so held rows never change and the right-hand side
coupling A_fp q_p is implicit in r).

* :class:`GlobalSparseInverse` ("sparse-inverse", notes §2.3): S = L^-1 stored
  as CSR together with S^T as CSR; a solve is a permuted gather, two SpMVs and a
  scatter, all Taichi kernels, x/y/z in one pass.
* :class:`GlobalCholesky` ("cholesky"): the factor's triangular solves on the
  host (CHOLMOD, or the scipy fallback of :mod:`tisim.linalg.cholesky`).
* :class:`GlobalJacobi` ("jacobi"): one Jacobi sweep per global step with
  Chebyshev acceleration across the solver's iterations (Wang 2015), the
  "incomplete solve" the notes compare against.

Host interface for contact (all back-ends, notes' scaling, see
:class:`GlobalStep`): ``solve(rhs)``, ``inverse_columns(B)``,
``sparse_inverse()``, ``factor``, ``contact_scaling = "notes"``.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import scipy.sparse as sp

from tisim.linalg.cholesky import Factor, FactorizationError, factorize
from tisim.linalg.sparse_inverse import SparseInverse, SparseInverseTooLarge, sparse_inverse

log = logging.getLogger(__name__)

__all__ = [
    "GlobalCholesky",
    "GlobalJacobi",
    "GlobalSparseInverse",
    "GlobalStep",
    "build_global_step",
]


class GlobalStep:
    """Base class: the system, the held/free split and the host interface.

    A: (n, n) scalar matrix A_hat (notes' scaling, kg), CSR. held: (h,) indices of
    vertices whose positions are prescribed this step. ordering: fill-reducing
    ordering for factorizations ("auto", "metis", "amd", "natural").

    Host interface (numpy, notes' scaling; used by contact):

    * ``solve(rhs (n, 3)) -> q (n, 3)``: q_f = A_ff^-1 (rhs_f - A_fp q_p) and
      q_p = the held positions last given to :meth:`set_held_positions` (so a
      held row returns its prescribed position, whatever rhs holds there).
    * ``inverse_columns(B (n, k) or (n_free, k) sparse) -> (n, k) dense``:
      A_hat_ff^-1 B_f, zero on held rows (held vertices do not respond to
      forces). Rows of an (n, k) B on held vertices are ignored.
    * ``sparse_inverse() -> (S csr (n_free, n_free), index (n_free,))`` or None,
      with A_hat_ff^-1 = P^T S^T S P and (P x)_i = x[index[i]], where ``index``
      maps each permuted free row to its vertex: ``S @ B[index]`` is Z of notes
      §2.8 for any (n, k) B.
    * ``factor``: the :class:`~tisim.linalg.cholesky.Factor` of A_hat_ff (in
      free-vertex numbering; ``free_index`` maps it to vertices).
    * ``contact_scaling = "notes"``: contact forces enter as A q = b + h^2 H^T lambda.
    """

    name = ""
    contact_scaling = "notes"

    def __init__(self, A: sp.csr_matrix, held: np.ndarray, ordering: str = "auto"):
        A = sp.csr_matrix(A, dtype=np.float64)
        self.A = A
        self.n = A.shape[0]
        self.ordering = ordering
        held = np.unique(np.asarray(held, dtype=np.int64))
        mask = np.ones(self.n, dtype=bool)
        mask[held] = False
        self.held_index = held
        self.free_mask = mask
        self.free_index = np.flatnonzero(mask).astype(np.int32)
        self.n_free = len(self.free_index)
        self._free_pos = np.full(self.n, -1, dtype=np.int64)
        self._free_pos[self.free_index] = np.arange(self.n_free)
        self.A_ff = A[self.free_index][:, self.free_index].tocsc()
        self.A_fp = A[self.free_index][:, held].tocsr()
        self._held_positions = np.zeros((len(held), 3))
        self._factor: Factor | None = None
        self.factor_seconds = 0.0
        self._no_index = np.zeros(0, dtype=np.int32)
        self._no_out = np.zeros((0, 3))
        self.auto_timings_ms: dict | None = None  # set when "auto" chose this back-end
        self.fallback_reason: str | None = None  # set when the sparse inverse did not fit

    # ------------------------------------------------------------------ set-up
    @property
    def factor(self) -> Factor:
        """The Cholesky factor of A_hat_ff (built on first use for back-ends that need none)."""
        if self._factor is None:
            t0 = time.perf_counter()
            self._factor = factorize(self.A_ff, self.ordering)
            self.factor_seconds = time.perf_counter() - t0
        return self._factor

    def set_held_positions(self, positions: np.ndarray) -> None:
        """Prescribed positions (h, 3) of the held vertices (order of ``held_index``), m."""
        self._held_positions = np.asarray(positions, dtype=np.float64).reshape(len(self.held_index), 3)

    def begin_step(self, kernels) -> None:
        """Called once per time step before the iterations."""

    # ------------------------------------------------------------------ iteration (Taichi)
    def gather_target(self, kernels):
        """(index (k,), out (k, 3)): where the local kernel may copy r[index] for this
        back-end's next :meth:`apply` (fused into the same launch); k = 0 if none."""
        return self._no_index, self._no_out

    def apply(self, kernels, gathered: bool = False) -> None:
        """x_f += A_ff^-1 r_f on the kernels' arrays. gathered: r was already copied
        into :meth:`gather_target` (by ``kernels.iterate``)."""
        raise NotImplementedError

    def apply_exact(self, kernels, gathered: bool = False) -> None:
        """Like :meth:`apply` but always an exact solve (used for contact corrections)."""
        self.apply(kernels, gathered=gathered)

    def exact(self) -> bool:
        """Whether :meth:`apply` solves exactly (False for Jacobi)."""
        return True

    # ------------------------------------------------------------------ host interface
    def _solve_free(self, rhs_f: np.ndarray) -> np.ndarray:
        return self.factor.solve(rhs_f)

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        rhs = np.asarray(rhs, dtype=np.float64)
        rf = rhs[self.free_index]
        if len(self.held_index):
            rf = rf - self.A_fp @ self._held_positions
        out = np.empty_like(rhs)
        out[self.free_index] = self._solve_free(rf)
        out[self.held_index] = self._held_positions
        return out

    def _free_rows(self, B) -> sp.csc_matrix:
        B = sp.csc_matrix(B)
        if B.shape[0] == self.n:
            return sp.csc_matrix(B[self.free_index])
        if B.shape[0] == self.n_free:
            return B
        raise ValueError(f"B must have {self.n} or {self.n_free} rows, got {B.shape[0]}")

    def inverse_columns(self, B) -> np.ndarray:
        Bf = self._free_rows(B)
        out = np.zeros((self.n, Bf.shape[1]))
        if Bf.shape[1]:
            out[self.free_index] = self._solve_free(Bf.toarray())
        return out

    def sparse_inverse(self):
        return None

    def column(self, vertex: int) -> np.ndarray:
        """(n,) column of A_hat_ff^-1 for a free vertex, 0 on held vertices."""
        e = np.zeros(self.n_free)
        e[self._free_pos[vertex]] = 1.0
        out = np.zeros(self.n)
        out[self.free_index] = self._solve_free(e)
        return out

    def is_free(self, vertex: int) -> bool:
        return bool(self.free_mask[vertex])

    def info(self) -> dict:
        d = {
            "global_step": self.name,
            "n_free": int(self.n_free),
            "n_held": len(self.held_index),
        }
        if self._factor is not None:
            d.update(
                factor_backend=self._factor.backend,
                ordering=self._factor.ordering,
                nnz_L=int(self._factor.L.nnz),
                factor_seconds=round(self.factor_seconds, 4),
            )
        if self.auto_timings_ms is not None:
            d["auto_ms_per_solve"] = dict(self.auto_timings_ms)
        if getattr(self, "auto_sparse_inverse", None):
            d["auto_sparse_inverse_not_kept"] = dict(self.auto_sparse_inverse)
        if self.fallback_reason is not None:
            d["fallback"] = self.fallback_reason
        return d


class GlobalCholesky(GlobalStep):
    """Triangular solves of the Cholesky factor on the host (one numpy round trip per solve)."""

    name = "cholesky"

    def __init__(self, A, held, ordering="auto", factor: Factor | None = None):
        super().__init__(A, held, ordering)
        if factor is not None:
            self._factor = factor
        else:
            self.factor  # noqa: B018  (factor now: a non-SPD system must fail at start-up)
        self._rf = np.zeros((self.n_free, 3), dtype=np.float64)
        # S = L^-1 of this factor when "auto" built it to time it and the caller keeps it
        # for contact (the Delassus operator needs S whichever back-end solves)
        self._kept_si: SparseInverse | None = None

    def take_sparse_inverse(self) -> SparseInverse | None:
        """The S that "auto" built for this factor, handed over once (then not held here)."""
        si, self._kept_si = self._kept_si, None
        return si

    def gather_target(self, kernels):
        return self.free_index, self._rf

    def apply(self, kernels, gathered: bool = False) -> None:
        if self.n_free == 0:
            return
        if not gathered:
            kernels.gather_residual(self.free_index, self._rf)
        delta = np.ascontiguousarray(self._factor.solve(self._rf))
        kernels.scatter_add_x(self.free_index, delta)


class GlobalSparseInverse(GlobalStep):
    """A_ff^-1 = P^T S^T S P with S = L^-1 (notes §2.3): two Taichi SpMVs per solve.

    memory_limit_mb: raise :class:`~tisim.linalg.sparse_inverse.SparseInverseTooLarge`
    (before building S) when S and S^T would need more.
    """

    name = "sparse-inverse"

    def __init__(
        self,
        A,
        held,
        ordering="auto",
        memory_limit_mb: float | None = None,
        factor: Factor | None = None,
    ):
        from tisim.linalg.spmv import DeviceCSR, device_array

        super().__init__(A, held, ordering)
        if factor is not None:
            self._factor = factor
        f = self.factor
        self.si: SparseInverse = sparse_inverse(f, memory_limit_mb)
        self.S = DeviceCSR(self.si.S)
        self.ST = DeviceCSR(self.si.ST)
        # permuted free row i <-> vertex index[i]
        self.index = np.ascontiguousarray(self.free_index[f.perm], dtype=np.int32)
        self._index_dev = device_array(self.index)

    def gather_target(self, kernels):
        return self._index_dev, kernels.work

    def apply(self, kernels, gathered: bool = False) -> None:
        from tisim.linalg.spmv import gather3, sparse_inverse_apply

        if self.n_free == 0:
            return
        if not gathered:
            gather3(kernels.r, self._index_dev, kernels.work)
        S, ST = self.S, self.ST
        sparse_inverse_apply(
            S.indptr, S.indices, S.data, ST.indptr, ST.indices, ST.data,
            kernels.work, kernels.work2, self._index_dev, kernels.x,
        )  # fmt: skip

    def _solve_free(self, rhs_f: np.ndarray) -> np.ndarray:
        return self.si.solve(rhs_f)

    def sparse_inverse(self):
        return self.si.S, self.index.astype(np.int64)

    def inverse_columns(self, B) -> np.ndarray:
        Bf = self._free_rows(B)
        out = np.zeros((self.n, Bf.shape[1]))
        if Bf.shape[1]:
            Z = self.si.half_columns(Bf)  # Z = S P B: A^-1 B = P^T S^T Z
            y = np.asarray((self.si.ST @ Z).todense())
            out[self.index] = y
        return out

    def info(self) -> dict:
        d = super().info()
        d.update(
            nnz_S=int(self.si.nnz),
            S_mb=round(self.si.memory_mb, 3),
            S_and_ST_mb=round(self.si.memory_both_mb, 3),
            sparse_inverse_seconds=round(self.si.build_seconds, 4),
            max_etree_depth=int(self.si.depth.max(initial=0)),
        )
        return d


class GlobalJacobi(GlobalStep):
    """Jacobi sweeps with Chebyshev acceleration (Wang 2015), no factorization.

    Each call of :meth:`apply` is one sweep x_new = omega (gamma D^-1 r + x -
    x_prev) + x_prev; omega follows Chebyshev's recurrence with spectral radius
    estimate ``rho`` after ``delay`` plain sweeps, restarting every time step.
    The host interface factors A_ff on first use (contact needs exact solves).
    """

    name = "jacobi"

    def __init__(self, A, held, ordering="auto", rho: float = 0.9992, gamma: float = 0.9, delay: int = 10):
        from tisim import backend
        from tisim.linalg.spmv import device_array

        super().__init__(A, held, ordering)
        d = A.diagonal()
        bad = self.free_index[d[self.free_index] <= 0]
        if bad.size:
            raise FactorizationError(
                f"matrix is not positive definite: diagonal entry {int(bad[0])} is "
                f"{d[bad[0]]:.3g} (zero mass or stiffness?)"
            )
        self.rho, self.gamma, self.delay = float(rho), float(gamma), int(delay)
        self.diag = device_array(np.ascontiguousarray(d, dtype=backend.np_real()))
        self._k = 0
        self._omega = 1.0
        self.drag_vertex = -1
        self.drag_add = 0.0

    def exact(self) -> bool:
        return False

    def apply_exact(self, kernels, gathered: bool = False) -> None:
        if self.n_free == 0:  # Jacobi gathers nothing in the local step: r is read here
            return
        rf = np.zeros((self.n_free, 3))
        kernels.gather_residual(self.free_index, rf)
        kernels.scatter_add_x(self.free_index, np.ascontiguousarray(self.factor.solve(rf)))

    def begin_step(self, kernels) -> None:
        self._k = 0
        self._omega = 1.0
        kernels.copy_x_to_prev()

    def apply(self, kernels, gathered: bool = False) -> None:
        self._k += 1
        k, rho2 = self._k, self.rho * self.rho
        if k < self.delay:
            omega = 1.0
        elif k == self.delay:
            omega = 2.0 / (2.0 - rho2)
        else:
            omega = 4.0 / (4.0 - rho2 * self._omega)
        self._omega = omega
        kernels.jacobi_chebyshev(self.diag, self.gamma, omega, self.drag_vertex, self.drag_add)

    def info(self) -> dict:
        d = super().info()
        d.update(chebyshev_rho=self.rho, jacobi_relaxation=self.gamma, chebyshev_delay=self.delay)
        return d


def build_global_step(
    kind: str, A: sp.csr_matrix, held: np.ndarray, config, kernels=None, keep_sparse_inverse: bool = False
) -> GlobalStep:
    """The global step ``kind`` ("sparse-inverse", "cholesky", "jacobi", "auto") for A.

    "auto" factors once, builds S when it fits in ``config.memory_limit_mb``,
    times a few solves of both exact back-ends on ``kernels`` and keeps the
    faster (``info()["auto_ms_per_solve"]`` records the timings); with keep_sparse_inverse, a
    Cholesky winner keeps the S it was timed against for contact (``take_sparse_inverse``),
    which would otherwise build it again. "sparse-inverse" falls back to
    "cholesky" with a warning when S would exceed the memory limit.
    Raises :class:`~tisim.linalg.cholesky.FactorizationError` for a non-SPD system.
    """
    ordering = config.ordering
    if kind == "jacobi":
        return GlobalJacobi(
            A,
            held,
            ordering,
            rho=config.chebyshev_rho,
            gamma=config.jacobi_relaxation,
            delay=config.chebyshev_delay,
        )
    if kind == "cholesky":
        return GlobalCholesky(A, held, ordering)
    if kind not in ("sparse-inverse", "auto"):
        raise ValueError(f"unknown global step {kind!r}")
    chol = GlobalCholesky(A, held, ordering)
    try:
        si = GlobalSparseInverse(A, held, ordering, config.memory_limit_mb, factor=chol.factor)
        si.factor_seconds = chol.factor_seconds
    except SparseInverseTooLarge as e:
        log.warning(
            "global step: %s; falling back to the cholesky back-end (raise solver.memory_limit_mb to allow it)",
            e,
        )
        chol.fallback_reason = str(e)
        return chol
    if kind == "sparse-inverse" or kernels is None:
        return si
    t_si = _time_apply(si, kernels)
    t_ch = _time_apply(chol, kernels)
    best = si if t_si <= t_ch else chol
    best.auto_timings_ms = {
        "sparse-inverse": round(1e3 * t_si, 4),
        "cholesky": round(1e3 * t_ch, 4),
    }
    if best is chol and keep_sparse_inverse:
        chol._kept_si = si.si
    if best is chol:  # record what S cost
        chol.auto_sparse_inverse = {
            k: v for k, v in si.info().items() if k in ("nnz_S", "S_mb", "S_and_ST_mb", "sparse_inverse_seconds")
        }
    log.info(
        "global step auto: sparse-inverse %.3f ms, cholesky %.3f ms per solve -> %s",
        1e3 * t_si,
        1e3 * t_ch,
        best.name,
    )
    return best


def _time_apply(g: GlobalStep, kernels, repeats: int = 7) -> float:
    """Median seconds of one solve on the kernels' fields (with r = 0, so x is unchanged)."""
    import taichi as ti

    kernels.r.fill(0.0)
    g.apply(kernels)  # compile / warm caches
    ti.sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        g.apply(kernels)
        ti.sync()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))
