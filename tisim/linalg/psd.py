"""Batched projection of small symmetric matrices onto the PSD cone, on the device.

``project_psd(A, count)`` replaces each ``A[k]`` (k < count) of a
``ti.ndarray(real, (capacity, d, d))`` by ``V diag(max(lambda, 0)) V^T``, its eigenvalues
clamped at zero (the closest PSD matrix in the Frobenius norm), the projected Newton
step of notes §2.4. Used for the 12 x 12 contact Hessians, the 9 x 9 membrane and the
12 x 12 bending Hessians (any d <= 12; larger d works but costs O(d^3) a sweep).

Method: cyclic Jacobi eigenvalue sweeps, one thread per matrix, with every loop a
run-time loop over array indices (GPU-safe: no shared state between matrices, no
large register arrays, short compile), over the matrix's active rows only (those with
a nonzero entry: a zero row stays zero and changes nothing else, so the result is the
full matrix's bit for bit). The input is first symmetrised; a matrix whose
diagonal dominates its rows (Gershgorin: PSD for sure) is skipped, so is one whose
Cholesky factorisation with a shift of 16 d eps ||A||_F succeeds (PSD to within that
shift: a few hundred flops instead of the sweeps' tens of thousands; the membrane
Hessians, singular along translations, pass it), and one whose Jacobi eigenvalues are
all >= 0 is left bit-for-bit unchanged, so already-PSD inputs never pick up round-off.

Accuracy: sweeps stop when the off-diagonal Frobenius norm falls below
``tol * ||A||_F`` (default 4 machine epsilons of the precision), so the result agrees
with a LAPACK eigen-clamp to ~1e-14 relative in f64.

The kernel takes ndarrays (any dtype, any capacity and d), so it compiles once per
process (and per precision) whatever the number of projectors and matrix sizes.

This module has no ``from __future__ import annotations``: Taichi reads the kernel's
type annotations when it is decorated.

References: Golub & Van Loan, Matrix Computations, §8.5 (cyclic Jacobi, the
symmetric 2 x 2 Schur rotation); Teran et al. 2005 / IPC for per-element PSD projection.
"""

import logging

import numpy as np
import taichi as ti

from tisim.backend import download, upload

log = logging.getLogger(__name__)


@ti.kernel
def _project_psd_kernel(
    A: ti.types.ndarray(ndim=3),
    W: ti.types.ndarray(ndim=3),
    V: ti.types.ndarray(ndim=3),
    R: ti.types.ndarray(ndim=2),
    count: ti.i32,
    dim: ti.i32,
    tol: float,
    chol_shift: float,
    max_sweeps: ti.i32,
):
    # Few, plain loops on purpose: each loop nest costs LLVM compile time.
    for m in range(count):
        # the active rows (R[m, :na]): those with a nonzero entry in the symmetric part.
        # A zero row is an eigenvector of eigenvalue 0, left as it is by every step below
        # (rotations skip zero entries, a zero Cholesky row gets the shift as its pivot),
        # so restricting every loop to the active rows gives the full matrix's result bit
        # for bit, at the cost of the rows that matter: a contact Hessian whose obstacle
        # vertex rows were cleared (zero_fixed) or whose distance type involves two or
        # three of its four vertices has 3 to 9 of its 12
        na = 0
        for i in range(dim):
            R[m, dim + i] = 0
            for j in range(dim):
                if A[m, i, j] + A[m, j, i] != 0.0:
                    R[m, dim + i] = 1
            if R[m, dim + i] != 0:
                R[m, na] = i
                na += 1
        # copy the symmetric part, V = I, and Gershgorin's test (a symmetric matrix
        # whose diagonal dominates every row is PSD: nothing to do)
        dominant = True
        frob2 = 0.0
        for p in range(na):
            i = R[m, p]
            radius = 0.0
            for q in range(na):
                j = R[m, q]
                a = 0.5 * (A[m, i, j] + A[m, j, i])
                W[m, i, j] = a
                V[m, i, j] = 1.0 if i == j else 0.0
                frob2 += a * a
                if j != i:
                    radius += ti.abs(a)
            if W[m, i, i] < radius:
                dominant = False
        if not dominant:
            # Cholesky of W + delta I in W's lower triangle: if it succeeds, A is PSD
            # to within delta (16 d eps ||A||_F, below Jacobi's own round-off on its
            # eigenvalues) and stays as it is; that skips the sweeps for the elastic
            # Hessians, which are PSD away from compression but singular (translations),
            # so Gershgorin's test cannot see it
            delta = chol_shift * ti.sqrt(frob2)
            definite = True
            for pj in range(na):
                if definite:
                    j = R[m, pj]
                    s = W[m, j, j] + delta
                    for pk in range(pj):
                        k = R[m, pk]
                        s -= W[m, j, k] * W[m, j, k]
                    if s <= 0.0:
                        definite = False
                    else:
                        ljj = ti.sqrt(s)
                        for pi in range(pj + 1, na):
                            i = R[m, pi]
                            t = W[m, i, j]
                            for pk in range(pj):
                                k = R[m, pk]
                                t -= W[m, i, k] * W[m, j, k]
                            W[m, i, j] = t / ljj
                        W[m, j, j] = ljj
            if not definite:  # restore the lower triangle for the sweeps
                for pi in range(na):
                    i = R[m, pi]
                    for pj in range(pi + 1):
                        j = R[m, pj]
                        W[m, i, j] = 0.5 * (A[m, i, j] + A[m, j, i])
            dominant = definite
        if not dominant:
            thresh2 = tol * tol * frob2
            tiny = tol * ti.sqrt(frob2) * 1e-3
            for _sweep in range(max_sweeps):
                off2 = 0.0
                for pp in range(na):
                    p = R[m, pp]
                    for pq in range(pp + 1, na):
                        q = R[m, pq]
                        apq = W[m, p, q]
                        off2 += apq * apq
                        if ti.abs(apq) > tiny:
                            # symmetric 2x2 Schur rotation zeroing W[p, q] (G&VL 8.5.2)
                            app = W[m, p, p]
                            aqq = W[m, q, q]
                            tau = (aqq - app) / (2.0 * apq)
                            t = 0.5 / tau  # the limit, where sqrt(1 + tau^2) would overflow
                            if ti.abs(tau) < 1e30:
                                sgn = 1.0 if tau >= 0.0 else -1.0
                                t = sgn / (ti.abs(tau) + ti.sqrt(1.0 + tau * tau))
                            c = 1.0 / ti.sqrt(1.0 + t * t)
                            s = t * c
                            for pk in range(na):
                                k = R[m, pk]
                                if k != p and k != q:
                                    akp = W[m, k, p]
                                    akq = W[m, k, q]
                                    W[m, k, p] = c * akp - s * akq
                                    W[m, p, k] = c * akp - s * akq
                                    W[m, k, q] = s * akp + c * akq
                                    W[m, q, k] = s * akp + c * akq
                                vkp = V[m, k, p]
                                vkq = V[m, k, q]
                                V[m, k, p] = c * vkp - s * vkq
                                V[m, k, q] = s * vkp + c * vkq
                            W[m, p, p] = app - t * apq
                            W[m, q, q] = aqq + t * apq
                            W[m, p, q] = 0.0
                            W[m, q, p] = 0.0
                # off2: the off-diagonal mass at the start of this sweep
                if 2.0 * off2 <= thresh2:
                    break
            negative = False
            for pi in range(na):
                i = R[m, pi]
                if W[m, i, i] < 0.0:
                    negative = True
            if negative:
                for i in range(dim):
                    for j in range(dim):
                        if R[m, dim + i] == 0 or R[m, dim + j] == 0:
                            A[m, i, j] = 0.0  # the full projection's value there
                for pi in range(na):
                    i = R[m, pi]
                    for pj in range(pi, na):
                        j = R[m, pj]
                        acc = 0.0
                        for pk in range(na):
                            k = R[m, pk]
                            acc += ti.max(W[m, k, k], 0.0) * V[m, i, k] * V[m, j, k]
                        A[m, i, j] = acc
                        A[m, j, i] = acc


def default_tolerance() -> float:
    """Relative off-diagonal tolerance of the Jacobi sweeps for the current precision."""
    from tisim import backend

    return 4.0 * float(np.finfo(backend.np_real()).eps)


class PSDProjector:
    """Scratch space for projecting up to ``capacity`` matrices of size ``dim`` at once.

    capacity: number of matrices; dim: their size d (<= 12 in practice).
    Allocates two ``(capacity, d, d)`` ndarrays (work copy and eigenvectors) and the
    active-row lists ``(capacity, 2 d)`` once; grows them geometrically when asked for more.
    """

    def __init__(self, capacity: int, dim: int, *, max_sweeps: int = 30) -> None:
        self.dim = int(dim)
        self.max_sweeps = int(max_sweeps)
        self.capacity = 0
        self.W = None
        self.V = None
        self.R = None
        self.reserve(max(int(capacity), 1))

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` matrices (reallocates, doubling, when needed)."""
        if capacity <= self.capacity:
            return
        from tisim import backend

        new_cap = max(int(capacity), 2 * self.capacity)
        real = backend.real()
        self.W = ti.ndarray(real, (new_cap, self.dim, self.dim))
        self.V = ti.ndarray(real, (new_cap, self.dim, self.dim))
        self.R = ti.ndarray(ti.i32, (new_cap, 2 * self.dim))
        self.capacity = new_cap
        log.debug("PSDProjector scratch: %d matrices of %d x %d", new_cap, self.dim, self.dim)

    def project(self, A, count: int, *, tol: float | None = None) -> None:
        """Project A[k] for k < count in place. A: ti.ndarray(real, (>= count, d, d))."""
        count = int(count)
        if count <= 0:
            return
        shape = tuple(A.shape)
        if len(shape) != 3 or shape[1] != self.dim or shape[2] != self.dim or shape[0] < count:
            raise ValueError(
                f"A has shape {shape}; expected (>= {count}, {self.dim}, {self.dim})"
            )
        self.reserve(count)
        from tisim import backend

        _project_psd_kernel(
            A,
            self.W,
            self.V,
            self.R,
            count,
            self.dim,
            default_tolerance() if tol is None else float(tol),
            16.0 * self.dim * float(np.finfo(backend.np_real()).eps),
            self.max_sweeps,
        )


def project_psd(A, count: int, projector: PSDProjector | None = None) -> PSDProjector:
    """Project ``A[k]`` (k < count) of a ``ti.ndarray(real, (k, d, d))`` onto the PSD cone
    in place; returns the projector (pass it back in to reuse its scratch arrays)."""
    if projector is None or projector.dim != A.shape[1]:
        projector = PSDProjector(max(int(count), 1), A.shape[1])
    projector.project(A, count)
    return projector


# project_psd_numpy's buffers by matrix size d: (capacity, ndarray, projector), kept
# between calls to save the allocations (the kernel itself compiles once anyway).
_numpy_cache: dict[int, tuple] = {}


def project_psd_numpy(mats: np.ndarray) -> np.ndarray:
    """Convenience for tests and scripts: mats (k, d, d) or (d, d) float -> projected
    copy of the same shape (runs the Taichi kernel on ndarrays cached per d)."""
    from tisim import backend

    a = np.asarray(mats, dtype=np.float64)
    single = a.ndim == 2
    if single:
        a = a[None]
    if a.ndim != 3 or a.shape[1] != a.shape[2]:
        raise ValueError(f"expected (k, d, d) or (d, d) matrices, got shape {np.shape(mats)}")
    k, d, _ = a.shape
    if k == 0:
        return a.copy()
    entry = _numpy_cache.get(d)
    if entry is None or entry[0] < k:
        cap = max(k, 2 * entry[0]) if entry is not None else k
        A = ti.ndarray(backend.real(), (cap, d, d))
        entry = (cap, A, entry[2] if entry is not None else PSDProjector(cap, d))
        _numpy_cache[d] = entry
    cap, A, proj = entry
    buf = np.zeros((cap, d, d), dtype=backend.np_real())
    buf[:k] = a
    upload(A, buf)
    proj.project(A, k)
    out = download(A).astype(np.float64)[:k]
    return out[0] if single else out
