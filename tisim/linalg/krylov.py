"""Krylov solvers for symmetric systems: Conjugate Residual and Conjugate Gradient.

Both take the matrix as a callable ``matvec(x) -> K x`` so the caller can apply
structured operators (e.g. the indicator-scaled Delassus operator of the contact
solver) without forming them. Vectors may have any shape; inner products are
taken over all entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class KrylovResult:
    """x: the solution estimate (shape of the right-hand side). iterations: products
    with K spent after the initial residual. residuals: ||c - K x_i|| for
    i = 0..iterations (the true recurrence residuals). converged: the relative
    residual reached ``tol``. breakdown: stopped because a step length was undefined."""

    x: np.ndarray
    iterations: int
    residuals: list[float] = field(default_factory=list)
    converged: bool = False
    breakdown: bool = False


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.vdot(a, b))


def conjugate_residual(
    matvec: Callable[[np.ndarray], np.ndarray],
    c: np.ndarray,
    x0: np.ndarray | None = None,
    iterations: int = 10,
    tol: float = 0.0,
) -> KrylovResult:
    """Solve K x = c for symmetric K (possibly semidefinite or indefinite) by Conjugate
    Residual, ``iterations`` products with K at most (notes §2.10, one product per step).

    CR minimises ||c - K x|| over the Krylov space, so the residual norm is
    non-increasing. Stops early when ||r|| <= tol * ||c|| or when r^T K r vanishes
    (possible for indefinite K, and at the exact solution of a semidefinite one).

    References: Y. Saad, Iterative Methods for Sparse Linear Systems, 2nd ed., Alg. 6.20.
    Limitations: no preconditioner; for indefinite K, breakdown (r^T K r = 0 with r != 0)
    ends the iteration early with the best iterate so far.
    """
    c = np.asarray(c, dtype=np.float64)
    x = np.zeros_like(c) if x0 is None else np.array(x0, dtype=np.float64)
    r = c - matvec(x) if x0 is not None else c.copy()
    cnorm = np.linalg.norm(c)
    res = [float(np.linalg.norm(r))]
    out = KrylovResult(x=x, iterations=0, residuals=res)
    if res[0] <= tol * cnorm or res[0] == 0.0:
        out.converged = True
        return out
    p = r.copy()
    s = matvec(r)  # K r
    t = s.copy()  # K p
    rs = _dot(r, s)
    for i in range(iterations):
        tt = _dot(t, t)
        if tt <= 0.0 or rs == 0.0:
            out.breakdown = True
            break
        alpha = rs / tt
        x += alpha * p
        r -= alpha * t
        out.iterations = i + 1
        res.append(float(np.linalg.norm(r)))
        if res[-1] <= tol * cnorm:
            out.converged = True
            break
        if i + 1 == iterations:
            break
        s = matvec(r)
        rs_new = _dot(r, s)
        beta = rs_new / rs
        rs = rs_new
        p = r + beta * p
        t = s + beta * t
    out.x = x
    return out


def conjugate_gradient(
    matvec: Callable[[np.ndarray], np.ndarray],
    c: np.ndarray,
    x0: np.ndarray | None = None,
    iterations: int = 100,
    tol: float = 0.0,
    preconditioner: Callable[[np.ndarray], np.ndarray] | None = None,
) -> KrylovResult:
    """Solve K x = c for symmetric positive definite K by (preconditioned) Conjugate
    Gradient, ``iterations`` products with K at most.

    preconditioner: optional callable applying M^-1 (SPD), e.g. a Jacobi scaling.
    Residuals are the true recurrence residuals ||c - K x_i|| (not monotone for CG).

    References: M. R. Hestenes and E. Stiefel, J. Res. NBS 49 (1952); Saad, Alg. 9.1.
    Limitations: K must be SPD; for semidefinite K use a consistent right-hand side.
    """
    c = np.asarray(c, dtype=np.float64)
    x = np.zeros_like(c) if x0 is None else np.array(x0, dtype=np.float64)
    r = c - matvec(x) if x0 is not None else c.copy()
    cnorm = np.linalg.norm(c)
    res = [float(np.linalg.norm(r))]
    out = KrylovResult(x=x, iterations=0, residuals=res)
    if res[0] <= tol * cnorm or res[0] == 0.0:
        out.converged = True
        return out
    z = preconditioner(r) if preconditioner is not None else r
    p = z.copy()
    rz = _dot(r, z)
    for i in range(iterations):
        Kp = matvec(p)
        pKp = _dot(p, Kp)
        if pKp <= 0.0:
            out.breakdown = True
            break
        alpha = rz / pKp
        x += alpha * p
        r -= alpha * Kp
        out.iterations = i + 1
        res.append(float(np.linalg.norm(r)))
        if res[-1] <= tol * cnorm:
            out.converged = True
            break
        z = preconditioner(r) if preconditioner is not None else r
        rz_new = _dot(r, z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    out.x = x
    return out
