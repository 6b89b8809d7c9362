"""NCP functions for Signorini-Coulomb contact and their generalized Jacobians (numpy).

A complementarity problem 0 <= a  _|_  b >= 0 holds exactly where phi(a, b) = 0 for an
NCP function phi. Each function here returns (phi, phi_a, phi_b) elementwise, with
(phi_a, phi_b) one element of the generalized (Clarke) Jacobian; notes §2.6.

Friction uses the proximal (stick/slip) form of the Coulomb disk,
``phi_t = lambda_t - Proj_{|x| <= mu lambda_n}(lambda_t - u / r_t)``, for either
normal NCP; see :func:`friction_state`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Generalized derivative of Fischer-Burmeister at the kink (0, 0): (1 - alpha, 1 - beta)
# with alpha = beta = 1/sqrt(2), i.e. the limit along the diagonal a = b > 0.
_FB_KINK = 1.0 - 1.0 / np.sqrt(2.0)


def fischer_burmeister(a, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """phi = a + b - sqrt(a^2 + b^2) and its generalized derivatives (phi_a, phi_b).

    a, b: arrays of one shape (same units). phi_a = 1 - a / rho, phi_b = 1 - b / rho
    with rho = sqrt(a^2 + b^2); both lie in [0, 2]. At (0, 0) returns (1 - 1/sqrt 2)
    for both. phi is evaluated as 2ab / (a + b + rho) when a + b > 0 to avoid the
    cancellation of a + b - rho when one argument is much larger than the other, and for
    a > 0 phi_a as (b / rho) (b / (rho + a)) (= (rho - a) / rho, as rho^2 - a^2 = b^2),
    likewise phi_b for b > 0: exactly 0 where the other argument is 0 and accurate to a
    few ulp where it is small, whatever the rounding of rho. 1 - a / rho is neither: with
    CUDA's approximate f32 square root a rho one ulp high made phi_a about 1e-7 on rows
    with no force, which the Newton step then took as active rows of weight 1e-7
    (docs/benchmarks.md, "GPU-class backends").
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    rho = np.hypot(a, b)
    s = a + b
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = np.where(s > 0, 2.0 * a * b / np.where(s > 0, s + rho, 1.0), s - rho)
        kink = rho == 0.0
        safe = np.where(kink, 1.0, rho)
        da = np.where(a > 0, (b / safe) * (b / (safe + np.abs(a))), 1.0 - a / safe)
        db = np.where(b > 0, (a / safe) * (a / (safe + np.abs(b))), 1.0 - b / safe)
        da = np.where(kink, _FB_KINK, da)
        db = np.where(kink, _FB_KINK, db)
    return phi, da, db


def min_map(a, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """phi = min(a, b) and its generalized derivatives: (1, 0) where a <= b (ties pick
    the a-branch, so a touching contact is treated as active), else (0, 1)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    take_a = a <= b
    phi = np.where(take_a, a, b)
    return phi, take_a.astype(np.float64), (~take_a).astype(np.float64)


NCP_FUNCTIONS: dict[str, Callable] = {
    "fischer-burmeister": fischer_burmeister,
    "min-map": min_map,
}


def ncp_function(name: str) -> Callable:
    """The NCP function called ``name`` ("fischer-burmeister" or "min-map")."""
    try:
        return NCP_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown NCP function {name!r}; expected one of {sorted(NCP_FUNCTIONS)}") from None


@dataclass
class FrictionState:
    """Stick/slip classification of the proximal Coulomb friction residual.

    stick: (k,) bool. y: (k, 2) the trial force lambda_t - u / r_t, N.
    radius: (k,) the disk radius mu * lambda_n (lagged normal force), N.
    target: (k, 2) the slip force radius * y / |y| (zero where radius is 0), N.
    """

    stick: np.ndarray
    y: np.ndarray
    radius: np.ndarray
    target: np.ndarray


def friction_state(lam_t: np.ndarray, u: np.ndarray, r_t: np.ndarray, radius: np.ndarray) -> FrictionState:
    """Classify contacts as sticking or slipping (notes §2.6, prox form).

    lam_t: (k, 2) tangential forces, N. u: (k, 2) tangential slip velocities, m/s.
    r_t: (k,) friction preconditioner, (m/s)/N (slip-velocity change per unit force,
    h W_jj). radius: (k,) mu * lambda_n >= 0, N.

    The trial force y = lambda_t - u / r_t is in force units, so the dimensions of the
    notes' ``lambda_t - r_t u`` are made consistent by dividing by r_t (the notes define
    r_t as velocity per force). Stick where |y| <= radius (and radius > 0).
    """
    lam_t = np.asarray(lam_t, dtype=np.float64)
    y = lam_t - u / r_t[:, None]
    ny = np.linalg.norm(y, axis=1)
    stick = (ny <= radius) & (radius > 0)
    scale = np.where(ny > 0, radius / np.where(ny > 0, ny, 1.0), 0.0)
    target = y * scale[:, None]
    return FrictionState(stick=stick, y=y, radius=radius, target=target)


def friction_residual(lam_t: np.ndarray, u: np.ndarray, r_t: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """(k, 2) the proximal Coulomb residual lambda_t - Proj_{|x| <= radius}(lambda_t - u / r_t), N.

    Zero exactly when (u, lambda_t) satisfy Coulomb's law with normal force radius / mu:
    either u = 0 and |lambda_t| <= radius, or lambda_t = -radius u / |u|.
    """
    st = friction_state(lam_t, u, r_t, radius)
    proj = np.where(st.stick[:, None], st.y, st.target)
    return np.asarray(lam_t) - proj


def friction_residual_jacobian(lam_t: np.ndarray, u: np.ndarray, r_t: np.ndarray, radius: np.ndarray):
    """Generalized Jacobian of :func:`friction_residual` w.r.t. lambda_t and u (radius fixed).

    Returns (d_lam (k, 2, 2), d_u (k, 2, 2)). Stick: (0, I / r_t). Slip with radius R:
    d_lam = I - (R / |y|) P and d_u = (R / (|y| r_t)) P with P = I - y y^T / |y|^2.
    """
    st = friction_state(lam_t, u, r_t, radius)
    ny = np.linalg.norm(st.y, axis=1)
    yh = st.y / np.where(ny > 0, ny, 1.0)[:, None]
    P = np.eye(2)[None] - yh[:, :, None] * yh[:, None, :]
    g = np.where(ny > 0, st.radius / np.where(ny > 0, ny, 1.0), 0.0)
    d_lam = np.eye(2)[None] - g[:, None, None] * P
    d_u = (g / r_t)[:, None, None] * P
    d_lam[st.stick] = 0.0
    d_u[st.stick] = np.eye(2)[None] / r_t[st.stick][:, None, None]
    return d_lam, d_u


def project_cone(lam: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """Clamp contact forces (k, 3) = (normal, t1, t2) onto the Coulomb disk cone:
    lambda_n >= 0 and |lambda_t| <= mu lambda_n (the notes' §2.6 practical safeguard).
    Returns a new array."""
    out = np.array(lam, dtype=np.float64)
    out[:, 0] = np.maximum(out[:, 0], 0.0)
    radius = np.asarray(mu) * out[:, 0]
    nt = np.linalg.norm(out[:, 1:], axis=1)
    over = nt > radius
    s = np.where(over, radius / np.where(nt > 0, nt, 1.0), 1.0)
    out[:, 1:] *= s[:, None]
    return out
