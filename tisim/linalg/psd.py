"""Batched projection of small symmetric matrices onto the PSD cone, on the device.

``project_psd(A, count)`` replaces each ``A[k]`` (k < count) of a
``ti.ndarray(real, (capacity, d, d))`` by ``V diag(max(lambda, 0)) V^T``, its eigenvalues
clamped at zero (the closest PSD matrix in the Frobenius norm), the projected Newton
step of notes §2.4. Used for the 12 x 12 contact Hessians and the 12 x 12 bending Hessians (any d <= 12).

Method: cyclic Jacobi eigenvalue sweeps, one thread per matrix, on a copy of the
matrix's active rows (those with a nonzero entry: a zero row stays zero and changes
nothing else, so the result is the full matrix's) in the thread's local arrays (d <=
``MAX_DIM``; GPU-safe: no shared state between matrices, run-time loops, short
compile). The input is first symmetrised; a matrix whose diagonal dominates its rows
(Gershgorin: PSD for sure) is skipped, so is one whose Cholesky factorisation with a
shift of 16 d eps ||A||_F succeeds (PSD to within that shift: a few hundred flops
instead of the sweeps' tens of thousands; the membrane Hessians, singular along
translations, pass it), and one whose Jacobi eigenvalues are all >= 0 is left
bit-for-bit unchanged, so already-PSD inputs never pick up round-off.

Accuracy: the sweeps stop after the one that starts with the off-diagonal Frobenius norm
below ``tol * ||A||_F`` (default eps^(3/4) of the precision: 1.8e-12 in f64); Jacobi's
quadratic convergence takes that last sweep to round-off, so the result agrees with a
LAPACK eigen-clamp to ~1e-14 relative in f64, as with a tolerance of 4 eps, one sweep
sooner (measured on 3,527 contact Hessians of the drape: 6 -> 5 sweeps median, 4.6e-15
and 4.8e-15 largest relative difference from LAPACK).

The kernel takes ndarrays (any dtype, any capacity and d), so it compiles once per
process (and per precision) whatever the number of projectors and matrix sizes.

This module has no ``from __future__ import annotations``: Taichi reads the kernel's
type annotations when it is decorated.

References: Golub & Van Loan, Matrix Computations, §8.5 (cyclic Jacobi, the
symmetric 2 x 2 Schur rotation); Teran et al. 2005 / IPC for per-element PSD projection.
"""

import numpy as np
import taichi as ti

from tisim.backend import download, upload

MAX_DIM = 12  # the largest matrix the kernel's local scratch holds


@ti.kernel
def _project_psd_kernel(
    A: ti.types.ndarray(ndim=3),
    count: ti.i32,
    dim: ti.i32,
    tol: float,
    chol_shift: float,
    max_sweeps: ti.i32,
):
    # Few, plain loops on purpose: each loop nest costs LLVM compile time. Each thread
    # works on its matrix's active block in local arrays (MAX_DIM^2 each, dynamically
    # indexed): on the CPU they stay in the thread's cache, where the ndarray scratch of
    # earlier versions cost 1.7x the time (3,527 contact Hessians of the 64 x 64 drape:
    # 16.1 -> 9.5 ms).
    for m in range(count):
        # the active rows (idx[:na]): those with a nonzero entry in the symmetric part.
        # A zero row is an eigenvector of eigenvalue 0, left as it is by every step below
        # (rotations skip zero entries, a zero Cholesky row gets the shift as its pivot),
        # so restricting every loop to the active rows gives the full matrix's result,
        # at the cost of the rows that matter: a contact Hessian whose obstacle vertex
        # rows were cleared (zero_fixed) or whose distance type involves two or three of
        # its four vertices has 3 to 9 of its 12
        act = ti.Vector.zero(ti.i32, MAX_DIM)
        idx = ti.Vector.zero(ti.i32, MAX_DIM)
        na = 0
        for i in range(dim):
            for j in range(dim):
                if A[m, i, j] + A[m, j, i] != 0.0:
                    act[i] = 1
            if act[i] != 0:
                idx[na] = i
                na += 1
        # W: the symmetric part of the active block, V = I; Gershgorin's test (a
        # symmetric matrix whose diagonal dominates every row is PSD: nothing to do)
        W = ti.Matrix.zero(float, MAX_DIM, MAX_DIM)
        V = ti.Matrix.zero(float, MAX_DIM, MAX_DIM)
        dominant = True
        frob2 = 0.0
        for p in range(na):
            radius = 0.0
            for q in range(na):
                a = 0.5 * (A[m, idx[p], idx[q]] + A[m, idx[q], idx[p]])
                W[p, q] = a
                V[p, q] = 1.0 if p == q else 0.0
                frob2 += a * a
                if q != p:
                    radius += ti.abs(a)
            if W[p, p] < radius:
                dominant = False
        if not dominant:
            # Cholesky of W + delta I in W's lower triangle: if it succeeds, A is PSD
            # to within delta (16 d eps ||A||_F, below Jacobi's own round-off on its
            # eigenvalues) and stays as it is; that skips the sweeps for the elastic
            # Hessians, which are PSD away from compression but singular (translations),
            # so Gershgorin's test cannot see it
            delta = chol_shift * ti.sqrt(frob2)
            definite = True
            for j in range(na):
                if definite:
                    s = W[j, j] + delta
                    for k in range(j):
                        s -= W[j, k] * W[j, k]
                    if s <= 0.0:
                        definite = False
                    else:
                        ljj = ti.sqrt(s)
                        for i in range(j + 1, na):
                            t = W[i, j]
                            for k in range(j):
                                t -= W[i, k] * W[j, k]
                            W[i, j] = t / ljj
                        W[j, j] = ljj
            if not definite:  # restore the lower triangle for the sweeps
                for p in range(na):
                    for q in range(p + 1):
                        W[p, q] = 0.5 * (A[m, idx[p], idx[q]] + A[m, idx[q], idx[p]])
            dominant = definite
        if not dominant:
            thresh2 = tol * tol * frob2
            tiny = tol * ti.sqrt(frob2) * 1e-3
            for _sweep in range(max_sweeps):
                off2 = 0.0
                for p in range(na):
                    for q in range(p + 1, na):
                        apq = W[p, q]
                        off2 += apq * apq
                        if ti.abs(apq) > tiny:
                            # symmetric 2x2 Schur rotation zeroing W[p, q] (G&VL 8.5.2)
                            app = W[p, p]
                            aqq = W[q, q]
                            tau = (aqq - app) / (2.0 * apq)
                            t = 0.5 / tau  # the limit, where sqrt(1 + tau^2) would overflow
                            if ti.abs(tau) < 1e30:
                                sgn = 1.0 if tau >= 0.0 else -1.0
                                t = sgn / (ti.abs(tau) + ti.sqrt(1.0 + tau * tau))
                            c = 1.0 / ti.sqrt(1.0 + t * t)
                            s = t * c
                            for k in range(na):
                                if k != p and k != q:
                                    akp = W[k, p]
                                    akq = W[k, q]
                                    W[k, p] = c * akp - s * akq
                                    W[p, k] = c * akp - s * akq
                                    W[k, q] = s * akp + c * akq
                                    W[q, k] = s * akp + c * akq
                                vkp = V[k, p]
                                vkq = V[k, q]
                                V[k, p] = c * vkp - s * vkq
                                V[k, q] = s * vkp + c * vkq
                            W[p, p] = app - t * apq
                            W[q, q] = aqq + t * apq
                            W[p, q] = 0.0
                            W[q, p] = 0.0
                # off2: the off-diagonal mass at the start of this sweep (the sweep
                # that finds it below the threshold still rotates: quadratic convergence
                # takes it to round-off)
                if 2.0 * off2 <= thresh2:
                    break
            negative = False
            for p in range(na):
                if W[p, p] < 0.0:
                    negative = True
            if negative:
                for i in range(dim):
                    for j in range(dim):
                        if act[i] == 0 or act[j] == 0:
                            A[m, i, j] = 0.0  # the full projection's value there
                for p in range(na):
                    for q in range(p, na):
                        acc = 0.0
                        for k in range(na):
                            acc += ti.max(W[k, k], 0.0) * V[p, k] * V[q, k]
                        A[m, idx[p], idx[q]] = acc
                        A[m, idx[q], idx[p]] = acc


def default_tolerance() -> float:
    """Relative off-diagonal tolerance of the Jacobi sweeps for the current precision."""
    from tisim import backend

    return float(np.finfo(backend.np_real()).eps) ** 0.75


class PSDProjector:
    """Projects batches of ``dim`` x ``dim`` matrices (dim <= MAX_DIM); any count.

    Holds the settings only: each matrix's scratch lives in its thread's local memory.
    """

    def __init__(self, dim: int, *, max_sweeps: int = 30) -> None:
        if not 1 <= int(dim) <= MAX_DIM:
            raise ValueError(f"PSDProjector: matrices of size 1 to {MAX_DIM}, got {dim}")
        self.dim = int(dim)
        self.max_sweeps = int(max_sweeps)

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
        from tisim import backend

        _project_psd_kernel(
            A,
            count,
            self.dim,
            default_tolerance() if tol is None else float(tol),
            16.0 * self.dim * float(np.finfo(backend.np_real()).eps),
            self.max_sweeps,
        )


def project_psd(A, count: int, projector: PSDProjector | None = None) -> PSDProjector:
    """Project ``A[k]`` (k < count) of a ``ti.ndarray(real, (k, d, d))`` onto the PSD cone
    in place; returns the projector (pass it back in to reuse it)."""
    if projector is None or projector.dim != A.shape[1]:
        projector = PSDProjector(A.shape[1])
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
        entry = (cap, A, entry[2] if entry is not None else PSDProjector(d))
        _numpy_cache[d] = entry
    cap, A, proj = entry
    buf = np.zeros((cap, d, d), dtype=backend.np_real())
    buf[:k] = a
    upload(A, buf)
    proj.project(A, k)
    out = download(A).astype(np.float64)[:k]
    return out[0] if single else out
