"""The cloth solver's Newton systems solved: :class:`SPDSolver` (PARDISO, CHOLMOD or scipy
behind one call, the symbolic analysis kept while the pattern holds)."""

from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp

log = logging.getLogger(__name__)


class SPDSolver:
    """Solves A p = b for the Newton system, A symmetric positive definite by construction
    (PSD-projected element Hessians plus the mass matrix): MKL PARDISO when the ``mkl``
    wheel is there, else CHOLMOD (supernodal), else a scipy sparse LU. The symbolic
    analysis is redone only when A's pattern changes.

    PARDISO factorises the cloth's systems about 4x faster than Debian's CHOLMOD with
    OpenBLAS (the 64 x 64 drape's contact systems, 12,675 dofs: 21.5 against 91.2 ms on
    two cores, ``benchmarks/bench_linear.py``) and repeats its bits at any thread count.

    mixed (PARDISO only; ``solver.linear_precision = "mixed"``): factorise in single
    precision, about 1.4x faster, and refine the solution against A in double precision
    (``b - A x`` in float64, the correction from the float32 factor). The result is
    taken when the last correction is below ``REFINED`` of the solution; otherwise, or
    when the float32 factorisation meets a non-positive pivot, the system is factorised
    in double precision. Measured on the 64 x 64 drape: the same Newton iterations,
    contact frames 3-6% faster, residuals about 1e-9 instead of 1e-13. It is not the
    default because it gives up round-off exactness: the progressive levels' centres of
    mass, equal to 1e-15 of the size with double solves, agree to 1e-12 with it.
    """

    SHIFTS = (1e-12, 1e-10, 1e-8, 1e-6, 1e-4)
    REFINED = 1e-3  # |correction| / |x| at which a mixed-precision solution is taken
    REFINE_STEPS = 2

    def __init__(self, backend: str = "auto", mixed: bool = False):
        from tisim.linalg import pardiso
        from tisim.linalg.cholesky import cholmod_available

        self.cholmod = cholmod_available()
        if backend == "auto":
            backend = "pardiso" if pardiso.available() else "cholmod" if self.cholmod else "scipy"
        if backend == "pardiso" and not pardiso.available():
            raise ValueError("linear solver 'pardiso' needs MKL (pip install mkl)")
        if backend == "cholmod" and not self.cholmod:
            raise ValueError("linear solver 'cholmod' needs scikit-sparse")
        self.backend = backend
        self._pardiso = pardiso.Pardiso() if backend == "pardiso" else None
        self._pardiso32 = pardiso.Pardiso(single=True) if backend == "pardiso" and mixed else None
        self.fallbacks = 0  # mixed-precision solves redone in double precision
        self._blocks = pardiso.BlockUpper(3)
        self._triangle = pardiso.UpperTriangle()
        self._factor = None
        self._pattern = None

    def _mixed(self, A: sp.csr_matrix, U: sp.csr_matrix, b: np.ndarray) -> np.ndarray | None:
        """A^-1 b from the float32 factor with iterative refinement in float64, or None
        when it does not settle (see the class docstring)."""
        from tisim.linalg.pardiso import PardisoError

        try:
            self._pardiso32.factorize(U)
        except PardisoError:  # a pivot at round-off (-4, or -13)
            log.debug("float32 factorisation met a non-positive pivot: double precision")
            return None
        return self._refined(A, b)

    def _refined(self, A: sp.csr_matrix, b: np.ndarray) -> np.ndarray | None:
        """The float32 factor's solution of A x = b refined in float64, or None."""
        pd = self._pardiso32
        x = pd.solve(b)
        for _ in range(self.REFINE_STEPS):
            dx = pd.solve(b - A @ x)
            x += dx
            if np.linalg.norm(dx) <= self.REFINED * np.linalg.norm(x):
                return x
        log.debug("mixed-precision refinement did not settle: double precision")
        return None

    def _upper(self, A: sp.csr_matrix):
        """A's upper part for PARDISO: 3 x 3 blocks (BSR; the cloth's systems) when A is
        made of them, else the upper triangle (CSR)."""
        U = self._blocks(A)
        return U if U is not None else self._triangle(A)

    def _factorize(self, A: sp.csc_matrix) -> None:
        from sksparse.cholmod import cholesky

        if self._factor is None:
            self._factor = cholesky(A, ordering_method="amd")
        else:
            self._factor.cholesky_inplace(A)

    def _shifted(self, A, factorize, errors):
        """Factorise A, or A + delta |diag A| for the smallest delta that works.

        PSD-projected blocks plus the mass matrix are SPD in exact arithmetic; with
        entries many orders above the mass (the handles' penalty, barrier blocks at tiny
        gaps) round-off can leave a pivot negative (seen in cloth-twist). The shift
        (Levenberg-Marquardt) keeps the step a descent direction."""
        try:
            factorize(A)
            return
        except errors:
            pass
        d = np.abs(A.diagonal())
        for delta in self.SHIFTS:
            try:
                factorize(A + sp.diags(delta * d, format=A.format))
                log.debug("Newton system not positive definite to round-off: shifted by %g diag", delta)
                return
            except errors:
                continue
        raise np.linalg.LinAlgError("Newton system not positive definite, even shifted by 1e-4 of its diagonal")

    def solve(self, A, b: np.ndarray) -> np.ndarray:
        """A^-1 b. A: the SPD system (scipy sparse), or the ``SystemAssembler`` that holds
        it: then PARDISO in double precision takes its 3 x 3 block upper triangle
        (``block_upper``) and the CSR matrix is not formed unless needed."""
        from tisim.linalg.pardiso import PardisoError

        if not sp.issparse(A):
            system = A
            blocks = system.block_upper() if self.backend == "pardiso" and self._pardiso32 is None else None
            if blocks is not None and blocks.shape[0] > 0:
                try:
                    self._pardiso.factorize(blocks)
                    return self._pardiso.solve(b)
                except PardisoError as e:
                    # a pivot at round-off: with blocks PARDISO reports -4 or -13 (a rank-one
                    # 1e12 block over a massless vertex gave -13); the CSR path below shifts
                    log.debug("block factorisation failed (%s): the CSR matrix, shifted", e)
            A = system.matrix()
        if A.shape[0] == 0:  # every vertex fixed: nothing to solve
            return np.zeros(0)
        if self.backend == "pardiso":
            if self._pardiso32 is not None:
                # (the float32 factorisation takes the CSR triangle: with 3 x 3 blocks it was
                # slower than in double and failed with error -13 on a pinned sheet)
                x = self._mixed(A, self._triangle(A), b)
                if x is not None:
                    return x
                self.fallbacks += 1
            U = self._upper(A)
            # (a shifted A's upper part is made again: a shift is rare). A pivot at round-off
            # is reported as -4 or, depending on how MKL's threads split the work, -13 (seen
            # on the scalar triangle too when the machine was loaded): both are shifted
            self._shifted(A, lambda M: self._pardiso.factorize(U if M is A else self._upper(M)), PardisoError)
            return self._pardiso.solve(b)
        A = sp.csc_matrix(A)
        if self.backend == "cholmod":
            from sksparse.cholmod import CholmodNotPositiveDefiniteError

            from tisim.linalg.pardiso import same_pattern

            A.sort_indices()
            # the symbolic analysis (ordering, elimination tree) is reused for the same pattern
            if not same_pattern(A, self._pattern):
                self._factor = None

            def factorize(M):
                try:
                    self._factorize(M)
                except CholmodNotPositiveDefiniteError:
                    self._factor = None  # a fresh analysis: the failed factor's state is not reused
                    raise

            self._shifted(A, factorize, CholmodNotPositiveDefiniteError)
            self._pattern = (A.indptr.copy(), A.indices.copy()) if self._factor is not None else None
            return self._factor(b)
        import scipy.sparse.linalg as spla

        return spla.spsolve(A, b)
