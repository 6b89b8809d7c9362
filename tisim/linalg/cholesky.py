"""Sparse Cholesky factorization of SPD matrices behind one interface.

CHOLMOD (scikit-sparse) is used when importable; otherwise SuperLU from scipy is
run without pivoting on a symmetrically permuted matrix, which for an SPD matrix
yields the same factor: U = D L^T, so L = U^T D^-1/2.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

log = logging.getLogger(__name__)


class FactorizationError(ValueError):
    """The matrix is not symmetric positive definite (e.g. a zero mass)."""


@lru_cache(maxsize=1)
def cholmod_available() -> bool:
    try:
        import sksparse.cholmod  # noqa: F401

        return True
    except Exception:  # ImportError, or a broken binary build
        return False


@lru_cache(maxsize=1)
def metis_available() -> bool:
    if not cholmod_available():
        return False
    from sksparse.cholmod import analyze

    A = sp.identity(4, format="csc")
    try:
        analyze(A, ordering_method="metis")
        return True
    except Exception:
        return False


@dataclass(eq=False)
class Factor:
    """A Cholesky factor P A P^T = L L^T.

    perm: (n,) int, ``L L^T = A[perm][:, perm]``. L: (n, n) lower-triangular CSC.
    backend: "cholmod" or "scipy". ordering: the fill-reducing ordering used.
    """

    perm: np.ndarray
    L: sp.csc_matrix
    backend: str
    ordering: str
    _cholmod: object = None

    def __post_init__(self):
        if self._cholmod is None:  # triangular solves on the host need CSR copies
            self._lower_csr = self.L.tocsr()
            self._upper_csr = self.L.T.tocsr()

    @property
    def n(self) -> int:
        return self.L.shape[0]

    def solve(self, b: np.ndarray) -> np.ndarray:
        """A^-1 b for b of shape (n,) or (n, k)."""
        if self._cholmod is not None:
            return self._cholmod(b)
        b = np.asarray(b, dtype=np.float64)
        y = b[self.perm]
        y = spla.spsolve_triangular(self._lower_csr, y, lower=True)
        y = spla.spsolve_triangular(self._upper_csr, y, lower=False)
        x = np.empty_like(y)
        x[self.perm] = y
        return x


def _check_matrix(A) -> sp.csc_matrix:
    A = sp.csc_matrix(A, dtype=np.float64)
    if A.shape[0] != A.shape[1]:
        raise FactorizationError(f"matrix must be square, got {A.shape}")
    d = A.diagonal()
    if not np.all(np.isfinite(A.data)):
        raise FactorizationError("matrix has NaN or infinite entries")
    if np.any(d <= 0):
        i = int(np.argmin(d))
        raise FactorizationError(
            f"matrix is not positive definite: diagonal entry {i} is {d[i]:.3g} (zero mass or stiffness?)"
        )
    asym = abs(A - A.T).max() if A.nnz else 0.0
    if asym > 1e-10 * abs(A).max():
        raise FactorizationError(f"matrix is not symmetric (max |A - A^T| = {asym:.3g})")
    return A


def factorize(A, ordering: str = "auto", backend: str = "auto") -> Factor:
    """Factor the SPD matrix ``A`` (n x n, sparse).

    ordering: "auto" (nested dissection through METIS when available, else AMD /
    reverse Cuthill-McKee), "metis", "amd", "rcm" or "natural".
    backend: "auto", "cholmod" or "scipy".
    Raises FactorizationError when A is not SPD.
    """
    A = _check_matrix(A)
    use_cholmod = backend == "cholmod" or (backend == "auto" and cholmod_available())
    if use_cholmod:
        return _factorize_cholmod(A, ordering)
    return _factorize_scipy(A, ordering)


def _factorize_cholmod(A: sp.csc_matrix, ordering: str) -> Factor:
    from sksparse.cholmod import CholmodNotPositiveDefiniteError, cholesky

    method = {
        "auto": "metis" if metis_available() else "amd",
        "metis": "metis",
        "amd": "amd",
        "natural": "natural",
        "rcm": "amd",
    }[ordering]
    try:
        f = cholesky(A, ordering_method=method, mode="simplicial")
        # simplicial LL^T form, L L^T = A[P][:, P]; converting an LDL^T with D <= 0 fails here
        L = f.L().tocsc()
    except CholmodNotPositiveDefiniteError as e:
        raise FactorizationError(f"matrix is not positive definite ({e})") from None
    perm = np.asarray(f.P(), dtype=np.int64)
    _check_pivots(L.diagonal() ** 2, A.diagonal()[perm], perm)
    return Factor(perm=perm, L=L, backend="cholmod", ordering=method, _cholmod=f.solve_A)


# A pivot this small relative to its diagonal entry means the matrix is singular up to
# round-off (a PSD matrix with a null space, e.g. no mass at all): the Schur complements
# of a legitimate A = M + h^2 K never drop below the mass part.
_PIVOT_TOL = 1e-13


def _check_pivots(pivots: np.ndarray, diag: np.ndarray, perm: np.ndarray) -> None:
    bad = np.flatnonzero(~(pivots > _PIVOT_TOL * diag))
    if bad.size:
        i = int(bad[0])
        raise FactorizationError(
            f"matrix is singular or not positive definite: pivot of row {int(perm[i])} is "
            f"{pivots[i]:.3g} against a diagonal entry {diag[i]:.3g} (zero mass, or an "
            f"unconstrained part with no mass?)"
        )


def _factorize_scipy(A: sp.csc_matrix, ordering: str) -> Factor:
    n = A.shape[0]
    if ordering in ("natural",):
        perm = np.arange(n)
        used = "natural"
    else:
        from scipy.sparse.csgraph import reverse_cuthill_mckee

        perm = np.asarray(reverse_cuthill_mckee(A.tocsr(), symmetric_mode=True), dtype=np.int64)
        used = "rcm"
    Ap = A[perm][:, perm].tocsc()
    try:
        lu = spla.splu(Ap, permc_spec="NATURAL", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    except RuntimeError as e:
        raise FactorizationError(f"matrix is singular ({e})") from None
    if not (np.array_equal(lu.perm_r, np.arange(n)) and np.array_equal(lu.perm_c, np.arange(n))):
        raise FactorizationError("SuperLU pivoted; the matrix is not positive definite")
    d = lu.U.diagonal()
    _check_pivots(d, Ap.diagonal(), perm)
    L = (lu.U.T @ sp.diags(1.0 / np.sqrt(d))).tocsc()
    L.sort_indices()
    return Factor(perm=perm, L=L, backend="scipy", ordering=used)
