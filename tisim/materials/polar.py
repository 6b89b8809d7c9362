"""Rotation-variant SVD, polar rotation and its derivative (numpy, batched).

Conventions: F has shape (..., 3, 3). The rotation-variant SVD is
F = U diag(sigma) V^T with U, V proper rotations (det +1) and sigma sorted
descending except that the sign of F's determinant is carried by sigma[2]
(sigma[0] >= sigma[1] >= |sigma[2]|). The polar rotation is R = U V^T, the
maximiser of tr(R^T F) over SO(3); for det F > 0 it is the rotation of the
polar decomposition F = R S with S symmetric positive definite.

Limitations: R is not differentiable where sigma[i] + sigma[j] = 0 for some
i != j, i.e. only at inverted configurations (sigma[1] + sigma[2] = 0 needs
sigma[2] < 0) or at F of rank <= 1; there the maximiser of tr(R^T F) is not
unique, R jumps and ARAP/corotated energies have a kink (continuous energy,
discontinuous stress).
"""

from __future__ import annotations

import numpy as np

__all__ = ["polar_optimality", "polar_rotation", "rotation_derivative", "svd_rotation_variant"]


def _batch(F) -> tuple[np.ndarray, tuple[int, ...]]:
    F = np.asarray(F, dtype=np.float64)
    if F.ndim < 2 or F.shape[-2:] != (3, 3):
        raise ValueError(f"F must have shape (..., 3, 3), got {F.shape}")
    return F.reshape(-1, 3, 3), F.shape[:-2]


def svd_rotation_variant(F) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rotation-variant SVD of F (..., 3, 3): returns U (..., 3, 3), sigma (..., 3), V (..., 3, 3)
    with F = U diag(sigma) V^T, det U = det V = +1 and sign(det F) carried by sigma[..., 2]."""
    Fm, batch = _batch(F)
    U, s, Vt = np.linalg.svd(Fm)
    V = np.transpose(Vt, (0, 2, 1)).copy()
    s = s.copy()
    # Flip the last singular vector of whichever factor is a reflection; each flip
    # negates sigma[2], so F = U diag(s) V^T is kept.
    fu = np.linalg.det(U) < 0
    U[fu, :, 2] *= -1.0
    s[fu, 2] *= -1.0
    fv = np.linalg.det(V) < 0
    V[fv, :, 2] *= -1.0
    s[fv, 2] *= -1.0
    return U.reshape(batch + (3, 3)), s.reshape(batch + (3,)), V.reshape(batch + (3, 3))


def polar_rotation(F) -> np.ndarray:
    """Polar rotation R = U V^T (..., 3, 3) of F (..., 3, 3), det R = +1 (see module doc)."""
    U, _, V = svd_rotation_variant(F)
    return U @ np.swapaxes(V, -1, -2)


def polar_optimality(F, R) -> tuple[np.ndarray, np.ndarray]:
    """Optimality certificate of a rotation R (..., 3, 3) for max tr(R^T F) over SO(3)
    (F, R broadcast against each other).

    Returns (g (..., 3), m (...)): g = axial(S - S^T) with S = R^T F, the gradient of
    f(R exp([d]x)) at d = 0 (zero at every critical point), and m the smallest
    eigenvalue of M = tr(S) I - sym(S), the Hessian of -f there. R is the polar
    rotation (the maximiser) exactly when g = 0 and m >= 0 (then M's eigenvalues are
    the pair sums sigma_j + sigma_k of the rotation-variant SVD). A warm-started
    iteration that stalls at a half-turn from the answer has g = 0 and m < 0; one
    started more than a quarter-turn off (F a rotation) has m < 0 too. The Taichi
    guard :func:`tisim.materials.ti_funcs.is_polar_maximum` tests m >= 0.
    """
    F, R = np.broadcast_arrays(np.asarray(F, dtype=np.float64), np.asarray(R, dtype=np.float64))
    Fm, batch = _batch(F)
    Rm, _ = _batch(R)
    S = np.swapaxes(Rm, -1, -2) @ Fm
    g = np.stack([S[:, 2, 1] - S[:, 1, 2], S[:, 0, 2] - S[:, 2, 0], S[:, 1, 0] - S[:, 0, 1]], -1)
    M = np.trace(S, axis1=1, axis2=2)[:, None, None] * np.eye(3) - 0.5 * (S + np.swapaxes(S, 1, 2))
    m = np.linalg.eigvalsh(M)[:, 0]
    return g.reshape(batch + (3,)), m.reshape(batch)


def rotation_derivative(F, *, min_denominator: float = 1e-12) -> np.ndarray:
    """dR/dF of the polar rotation, shape (..., 3, 3, 3, 3), entry [i, j, k, l] = dR_ij / dF_kl.

    With F = U diag(sigma) V^T and M = U^T dF V, dR = U W V^T where W is skew
    with W_ab = (M_ab - M_ba) / (sigma_a + sigma_b). Denominators smaller in
    magnitude than ``min_denominator * max(sigma_0, tiny)`` are clamped there
    (keeping their sign): the derivative is unbounded at those kinks.
    """
    Fm, batch = _batch(F)
    U, s, V = svd_rotation_variant(Fm)
    den = s[:, :, None] + s[:, None, :]
    floor = min_denominator * np.maximum(np.abs(s[:, :1, None]), np.finfo(np.float64).tiny)
    sign = np.where(den < 0, -1.0, 1.0)
    den = np.where(np.abs(den) < floor, sign * floor, den)
    w = 1.0 / den
    w[:, [0, 1, 2], [0, 1, 2]] = 0.0  # diagonal of W is zero anyway (M_aa - M_aa)
    # dR_ij/dF_kl = sum_ab U_ia V_jb w_ab (U_ka V_lb - U_kb V_la)
    t1 = np.einsum("mia,mjb,mab,mka,mlb->mijkl", U, V, w, U, V, optimize=True)
    t2 = np.einsum("mia,mjb,mab,mkb,mla->mijkl", U, V, w, U, V, optimize=True)
    return (t1 - t2).reshape(batch + (3, 3, 3, 3))
