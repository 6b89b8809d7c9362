"""Isotropic hyperelastic energy densities, their stresses and stress derivatives (numpy).

Every function takes deformation gradients F of shape (..., 3, 3) (usually
(m, 3, 3)) and Lamé parameters mu, lam in Pa, each a scalar or an array that
broadcasts to the batch shape (...,). Energy densities psi are in Pa = J/m^3,
first Piola-Kirchhoff stresses P = dpsi/dF in Pa, stress derivatives dP/dF in Pa.

Notation: J = det F, I_C = ||F||_F^2 = tr(F^T F), cof F = dJ/dF = J F^{-T},
R = polar rotation of F (det R = +1, :mod:`tisim.materials.polar`),
sigma = signed singular values (rotation-variant SVD; sigma[2] < 0 iff J < 0).

Energies (psi(I) = 0 and P(I) = 0 for all; psi(R) = 0 and P(R) = 0 for every rotation R):

=====================  ==========================================================
"arap"                 mu ||F - R||_F^2                     (lam is ignored)
"corotated"            mu ||F - R||_F^2 + lam/2 (J - 1)^2
"neo-hookean"          stable Neo-Hookean (Smith, de Goes, Kim 2018), without the
                       log(I_C + 1) term and shifted so that psi(I) = 0:
                       mu/2 (I_C - 3) - mu (J - 1) + lam'/2 (J - 1)^2,  lam' = lam + mu.
                       Equivalently mu/2 (I_C - 3) + lam'/2 (J - alpha)^2 - mu^2/(2 lam')
                       with alpha = 1 + mu/lam'. lam' = lam + mu makes its
                       linearisation at F = I the linear elasticity of (mu, lam).
                       Smooth and finite for every F (inversion-safe).
"neo-hookean-log"      mu/2 (I_C - 3) - mu log J + lam/2 (log J)^2, for J > 0 only
                       (psi = inf, P = dP/dF = nan for J <= 0)
"symmetric-dirichlet"  mu/2 (||F||_F^2 + ||F^{-1}||_F^2) - 3 mu  (inf / nan for J = 0)
"symmetric-gradient"   mu/2 ||F||_F^2 - mu log J - 3 mu / 2, for J > 0 only
                       (inf / nan for J <= 0)
=====================  ==========================================================

dP/dF convention: row-major vectorisation vec(F)[3 i + j] = F[i, j] (numpy
``F.reshape(9)``); ``piola_derivative(...)[..., 3*i + j, 3*k + l] = dP_ij / dF_kl``,
i.e. the Hessian of psi with respect to vec(F). It is symmetric.

References:
    B. Smith, F. de Goes, T. Kim. Stable Neo-Hookean Flesh Simulation. ACM TOG 37(2), 2018.
    B. Smith, F. de Goes, T. Kim. Analytic Eigensystems for Isotropic Distortion Energies.
    ACM TOG 38(1), 2019 (energies in singular values).
"""

from __future__ import annotations

import numpy as np

from tisim.materials.polar import polar_rotation, rotation_derivative

__all__ = [
    "MATERIAL_NAMES",
    "energy_density",
    "energy_density_sigma",
    "first_piola",
    "gradient_sigma",
    "hessian_sigma",
    "piola_derivative",
    "project_psd",
]

MATERIAL_NAMES = (
    "arap",
    "corotated",
    "neo-hookean",
    "neo-hookean-log",
    "symmetric-dirichlet",
    "symmetric-gradient",
)

_I4 = np.eye(9).reshape(3, 3, 3, 3)  # d F_ij / d F_kl
_LEVI = np.zeros((3, 3, 3))
for _a, _b, _c in ((0, 1, 2), (1, 2, 0), (2, 0, 1)):
    _LEVI[_a, _b, _c] = 1.0
    _LEVI[_a, _c, _b] = -1.0


# ---------------------------------------------------------------------------
# batching helpers


def _prep(F, mu, lam):
    F = np.asarray(F, dtype=np.float64)
    if F.ndim < 2 or F.shape[-2:] != (3, 3):
        raise ValueError(f"F must have shape (..., 3, 3), got {F.shape}")
    batch = F.shape[:-2]
    try:
        mu_b = np.broadcast_to(np.asarray(mu, dtype=np.float64), batch).reshape(-1)
        lam_b = np.broadcast_to(np.asarray(lam, dtype=np.float64), batch).reshape(-1)
    except ValueError as exc:
        raise ValueError(
            f"mu {np.shape(mu)} and lam {np.shape(lam)} must be scalars or broadcast to the batch shape {batch}"
        ) from exc
    return F.reshape(-1, 3, 3), mu_b, lam_b, batch


def _prep_sigma(sigma, mu, lam):
    s = np.asarray(sigma, dtype=np.float64)
    if s.ndim < 1 or s.shape[-1] != 3:
        raise ValueError(f"sigma must have shape (..., 3), got {s.shape}")
    batch = s.shape[:-1]
    mu_b = np.broadcast_to(np.asarray(mu, dtype=np.float64), batch).reshape(-1)
    lam_b = np.broadcast_to(np.asarray(lam, dtype=np.float64), batch).reshape(-1)
    return s.reshape(-1, 3), mu_b, lam_b, batch


def _check_name(name: str) -> None:
    if name not in MATERIAL_NAMES:
        raise KeyError(f"unknown material {name!r}: expected one of {', '.join(MATERIAL_NAMES)}")


# ---------------------------------------------------------------------------
# determinant helpers (exact for every F, singular ones included)


def _cofactor(F: np.ndarray) -> np.ndarray:
    """cof F = dJ/dF (m, 3, 3); its columns are cross products of F's columns."""
    c = np.empty_like(F)
    c[:, :, 0] = np.cross(F[:, :, 1], F[:, :, 2])
    c[:, :, 1] = np.cross(F[:, :, 2], F[:, :, 0])
    c[:, :, 2] = np.cross(F[:, :, 0], F[:, :, 1])
    return c


def _det_hessian(F: np.ndarray) -> np.ndarray:
    """d^2 J / dF_ij dF_kl = eps_ikc eps_jld F_cd, shape (m, 3, 3, 3, 3)."""
    return np.einsum("ikc,jld,mcd->mijkl", _LEVI, _LEVI, F, optimize=True)


def _outer(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    return A[:, :, :, None, None] * B[:, None, None, :, :]


def _d_inv_T(A: np.ndarray) -> np.ndarray:
    """d(F^{-T})_ij / dF_kl = -A_il A_kj with A = F^{-T}, shape (m, 3, 3, 3, 3)."""
    return -np.einsum("mil,mkj->mijkl", A, A)


def _inv_T(F: np.ndarray, ok: np.ndarray) -> np.ndarray:
    A = np.full_like(F, np.nan)
    if np.any(ok):
        A[ok] = np.transpose(np.linalg.inv(F[ok]), (0, 2, 1))
    return A


# ---------------------------------------------------------------------------
# per-material kernels on (m, 3, 3) with (m,) parameters


def _psi(name, F, mu, lam):
    J = np.linalg.det(F)
    Ic = np.einsum("mij,mij->m", F, F)
    if name in ("arap", "corotated"):
        D = F - polar_rotation(F)
        psi = mu * np.einsum("mij,mij->m", D, D)
        if name == "corotated":
            psi = psi + 0.5 * lam * (J - 1.0) ** 2
        return psi
    if name == "neo-hookean":
        lp = lam + mu
        return 0.5 * mu * (Ic - 3.0) - mu * (J - 1.0) + 0.5 * lp * (J - 1.0) ** 2
    if name == "symmetric-dirichlet":
        ok = J != 0.0
        A = _inv_T(F, ok)
        psi = 0.5 * mu * (Ic + np.einsum("mij,mij->m", A, A)) - 3.0 * mu
        return np.where(ok, psi, np.inf)
    ok = J > 0.0
    logJ = np.log(np.where(ok, J, 1.0))
    if name == "neo-hookean-log":
        psi = 0.5 * mu * (Ic - 3.0) - mu * logJ + 0.5 * lam * logJ**2
    else:  # symmetric-gradient
        psi = 0.5 * mu * Ic - mu * logJ - 1.5 * mu
    return np.where(ok, psi, np.inf)


def _piola(name, F, mu, lam):
    m3 = mu[:, None, None]
    l3 = lam[:, None, None]
    if name in ("arap", "corotated"):
        # d/dF ||F - R||^2 = 2 (F - R): the dR term vanishes because R^T F is
        # symmetric and R^T dR is skew.
        P = 2.0 * m3 * (F - polar_rotation(F))
        if name == "corotated":
            J = np.linalg.det(F)[:, None, None]
            P = P + l3 * (J - 1.0) * _cofactor(F)
        return P
    J = np.linalg.det(F)
    if name == "neo-hookean":
        lp = l3 + m3
        return m3 * F + (lp * (J[:, None, None] - 1.0) - m3) * _cofactor(F)
    if name == "symmetric-dirichlet":
        ok = J != 0.0
        A = _inv_T(F, ok)
        return m3 * (F - A @ np.transpose(A, (0, 2, 1)) @ A)
    ok = J > 0.0
    A = _inv_T(F, ok)
    logJ = np.log(np.where(ok, J, np.nan))[:, None, None]
    if name == "neo-hookean-log":
        return m3 * F + (l3 * logJ - m3) * A
    return m3 * (F - A)  # symmetric-gradient (A is nan where J <= 0)


def _dpiola(name, F, mu, lam):
    m5 = mu[:, None, None, None, None]
    l5 = lam[:, None, None, None, None]
    if name in ("arap", "corotated"):
        H = 2.0 * m5 * (_I4 - rotation_derivative(F))
        if name == "corotated":
            J = np.linalg.det(F)[:, None, None, None, None]
            C = _cofactor(F)
            H = H + l5 * (_outer(C, C) + (J - 1.0) * _det_hessian(F))
        return H
    J = np.linalg.det(F)
    if name == "neo-hookean":
        C = _cofactor(F)
        lp = l5 + m5
        return m5 * _I4 + lp * _outer(C, C) + (lp * (J[:, None, None, None, None] - 1.0) - m5) * _det_hessian(F)
    if name == "symmetric-dirichlet":
        ok = J != 0.0
        A = _inv_T(F, ok)
        At = np.transpose(A, (0, 2, 1))
        dA = _d_inv_T(A)
        # T = A A^T A; dT = dA (A^T A) + A dA^T A + (A A^T) dA
        AtA = At @ A
        AAt = A @ At
        dT = (
            np.einsum("miakl,maj->mijkl", dA, AtA)
            + np.einsum("mia,mbakl,mbj->mijkl", A, dA, A, optimize=True)
            + np.einsum("mia,majkl->mijkl", AAt, dA)
        )
        return m5 * (_I4 - dT)
    ok = J > 0.0
    A = _inv_T(F, ok)
    dA = _d_inv_T(A)
    if name == "neo-hookean-log":
        logJ = np.log(np.where(ok, J, np.nan))[:, None, None, None, None]
        return m5 * _I4 + l5 * _outer(A, A) + (l5 * logJ - m5) * dA
    return m5 * (_I4 - dA)  # symmetric-gradient


# ---------------------------------------------------------------------------
# public API


def energy_density(name: str, F, mu, lam) -> np.ndarray:
    """Energy density psi(F) in Pa (J/m^3), shape (...,) for F (..., 3, 3).

    name: one of MATERIAL_NAMES; mu, lam: Lamé parameters in Pa, scalars or
    broadcastable to the batch shape. Barrier energies return inf outside their
    domain (see module doc).
    """
    _check_name(name)
    Fm, mu_b, lam_b, batch = _prep(F, mu, lam)
    return _psi(name, Fm, mu_b, lam_b).reshape(batch)


def first_piola(name: str, F, mu, lam) -> np.ndarray:
    """First Piola-Kirchhoff stress P = dpsi/dF in Pa, shape (..., 3, 3)."""
    _check_name(name)
    Fm, mu_b, lam_b, batch = _prep(F, mu, lam)
    return _piola(name, Fm, mu_b, lam_b).reshape(batch + (3, 3))


def piola_derivative(name: str, F, mu, lam, project_psd: bool = False) -> np.ndarray:
    """dP/dF = d^2 psi / dF^2 in Pa, shape (..., 9, 9), row-major vec(F) convention:
    entry [3*i + j, 3*k + l] = dP_ij / dF_kl.

    project_psd: return the positive semi-definite projection instead (each 9x9
    symmetric matrix with its negative eigenvalues set to zero, the nearest PSD
    matrix in the Frobenius norm); equal to the unprojected matrix where that is
    already PSD (up to round-off).
    """
    _check_name(name)
    Fm, mu_b, lam_b, batch = _prep(F, mu, lam)
    H = _dpiola(name, Fm, mu_b, lam_b).reshape(-1, 9, 9)
    H = 0.5 * (H + np.transpose(H, (0, 2, 1)))  # exact in theory; remove round-off asymmetry
    if project_psd:
        H = _project_psd(H)
    return H.reshape(batch + (9, 9))


def _project_psd(H: np.ndarray, floor: float = 0.0) -> np.ndarray:
    out = np.array(H, dtype=np.float64, copy=True)
    finite = np.all(np.isfinite(out), axis=(1, 2))
    if np.any(finite):
        Hs = 0.5 * (out[finite] + np.transpose(out[finite], (0, 2, 1)))
        w, Q = np.linalg.eigh(Hs)
        w = np.maximum(w, floor)
        out[finite] = np.einsum("mik,mk,mjk->mij", Q, w, Q)
    return out


def project_psd(H, floor: float = 0.0) -> np.ndarray:
    """Project symmetric matrices H (..., n, n) onto {eigenvalues >= floor} by
    clamping the eigenvalues of their symmetric part (floor = 0: the nearest PSD
    matrix in the Frobenius norm). Matrices with non-finite entries are returned as is."""
    H = np.asarray(H, dtype=np.float64)
    if H.ndim < 2 or H.shape[-1] != H.shape[-2]:
        raise ValueError(f"H must have shape (..., n, n), got {H.shape}")
    n = H.shape[-1]
    return _project_psd(H.reshape(-1, n, n), floor).reshape(H.shape)


# ---------------------------------------------------------------------------
# singular-value forms psi(F) = psi_hat(sigma), sigma signed (rotation-variant SVD)


def _sigma_terms(s):
    J = np.prod(s, axis=1)
    dJ = np.stack([s[:, 1] * s[:, 2], s[:, 0] * s[:, 2], s[:, 0] * s[:, 1]], axis=1)
    HJ = np.zeros((len(s), 3, 3))
    HJ[:, 0, 1] = HJ[:, 1, 0] = s[:, 2]
    HJ[:, 0, 2] = HJ[:, 2, 0] = s[:, 1]
    HJ[:, 1, 2] = HJ[:, 2, 1] = s[:, 0]
    return J, dJ, HJ


def energy_density_sigma(name: str, sigma, mu, lam) -> np.ndarray:
    """psi as a function of the signed singular values sigma (..., 3) of F, in Pa.

    Equals energy_density(name, U diag(sigma) V^T, mu, lam) for any rotations U, V.
    """
    _check_name(name)
    s, mu, lam, batch = _prep_sigma(sigma, mu, lam)
    J, _, _ = _sigma_terms(s)
    s2 = np.sum(s * s, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if name in ("arap", "corotated"):
            psi = mu * np.sum((s - 1.0) ** 2, axis=1)
            if name == "corotated":
                psi = psi + 0.5 * lam * (J - 1.0) ** 2
        elif name == "neo-hookean":
            psi = 0.5 * mu * (s2 - 3.0) - mu * (J - 1.0) + 0.5 * (lam + mu) * (J - 1.0) ** 2
        elif name == "symmetric-dirichlet":
            psi = np.where(J != 0.0, 0.5 * mu * (s2 + np.sum(1.0 / (s * s), axis=1)) - 3.0 * mu, np.inf)
        else:
            ok = J > 0.0
            logJ = np.log(np.where(ok, J, 1.0))
            if name == "neo-hookean-log":
                psi = 0.5 * mu * (s2 - 3.0) - mu * logJ + 0.5 * lam * logJ**2
            else:
                psi = 0.5 * mu * s2 - mu * logJ - 1.5 * mu
            psi = np.where(ok, psi, np.inf)
    return psi.reshape(batch)


def gradient_sigma(name: str, sigma, mu, lam) -> np.ndarray:
    """d psi_hat / d sigma, shape (..., 3), in Pa (nan outside the energy's domain)."""
    _check_name(name)
    s, mu, lam, batch = _prep_sigma(sigma, mu, lam)
    J, dJ, _ = _sigma_terms(s)
    m1, l1, J1 = mu[:, None], lam[:, None], J[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        if name in ("arap", "corotated"):
            g = 2.0 * m1 * (s - 1.0)
            if name == "corotated":
                g = g + l1 * (J1 - 1.0) * dJ
        elif name == "neo-hookean":
            g = m1 * s + ((l1 + m1) * (J1 - 1.0) - m1) * dJ
        elif name == "symmetric-dirichlet":
            g = np.where(J1 != 0.0, m1 * (s - s**-3), np.nan)
        else:
            ok = J1 > 0.0
            logJ = np.log(np.where(ok, J1, np.nan))
            if name == "neo-hookean-log":
                g = m1 * s + (l1 * logJ - m1) / s
            else:
                g = m1 * (s - 1.0 / s)
            g = np.where(ok, g, np.nan)
    return g.reshape(batch + (3,))


def hessian_sigma(name: str, sigma, mu, lam) -> np.ndarray:
    """d^2 psi_hat / d sigma^2, shape (..., 3, 3), in Pa (nan outside the energy's domain)."""
    _check_name(name)
    s, mu, lam, batch = _prep_sigma(sigma, mu, lam)
    J, dJ, HJ = _sigma_terms(s)
    m2, l2, J2 = mu[:, None, None], lam[:, None, None], J[:, None, None]
    eye = np.eye(3)
    with np.errstate(divide="ignore", invalid="ignore"):
        if name in ("arap", "corotated"):
            H = 2.0 * m2 * np.broadcast_to(eye, (len(s), 3, 3))
            if name == "corotated":
                H = H + l2 * (dJ[:, :, None] * dJ[:, None, :] + (J2 - 1.0) * HJ)
        elif name == "neo-hookean":
            lp = l2 + m2
            H = m2 * eye + lp * dJ[:, :, None] * dJ[:, None, :] + (lp * (J2 - 1.0) - m2) * HJ
        elif name == "symmetric-dirichlet":
            H = m2 * eye * (1.0 + 3.0 * s[:, :, None] ** -4)
            H = np.where(J2 != 0.0, H, np.nan)
        else:
            ok = J2 > 0.0
            inv = 1.0 / s
            if name == "neo-hookean-log":
                logJ = np.log(np.where(ok, J2, np.nan))
                H = eye * (m2 + (m2 - l2 * logJ) * inv[:, :, None] ** 2) + l2 * inv[:, :, None] * inv[:, None, :]
            else:
                H = m2 * eye * (1.0 + inv[:, :, None] ** 2)
            H = np.where(ok, H, np.nan)
    return H.reshape(batch + (3, 3))
