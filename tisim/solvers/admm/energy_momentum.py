"""Newton solves of one time step of the midpoint family, independent of the ADMM kernels.

Two schemes share the same update (notes §2.4: z = q^k + h v^k, v^{k+1} = 2/h (q^{k+1} - q^k) - v^k)
and differ only in the elastic force evaluated over the step:

* ``"midpoint"``: the implicit midpoint rule, the fixed point ADMM converges to,

      M (q - z)/h^2 + 1/2 grad E((q^k + q)/2) - 1/2 f_ext = 0;

  used by ``studies/midpoint_diagnosis.py`` as an independent reference for the ADMM step
  (numpy energies of :mod:`tisim.materials`, not the Taichi kernels ADMM uses).
* ``"energy-momentum"``: grad E(q_mid) replaced by a discrete gradient in the right
  Cauchy-Green tensor C = F^T F (O. Gonzalez, Exact energy and momentum conserving
  algorithms for general models in nonlinear elasticity, CMAME 2000; J. C. Simo,
  N. Tarnow, The discrete energy-momentum method, ZAMP 1992): per element

      f_a = w F_mid S_algo grad N_a,   F_mid = (F^k + F)/2,
      S_algo = S(C_mid) + beta dC,     S(C) = 2 dpsi/dC,   C_mid = (C^k + C)/2,  dC = C - C^k,
      beta = 2 (psi(F) - psi(F^k) - S(C_mid) : dC / 2) / ||dC||^2,

  so that sum_a f_a . (q - q^k) = E(q) - E(q^k) exactly (the step conserves
  K + E to the solver tolerance) while F_mid S_algo F_mid^T is symmetric (no torque:
  angular momentum exact) and sum_a grad N_a = 0 (linear momentum exact). S(C) is
  evaluated as F_c^{-1} P(F_c) with F_c = C^{1/2} (isotropic energies depend on C only).
  Gravity is linear (its midpoint force is exact); the penalty contact potential gets
  the same discrete gradient per vertex: grad g(x_mid) + (dg - grad g(x_mid).dx) dx / |dx|^2.

The step is solved by a chord Newton method on the free vertices with the matrix
M/h^2 + 1/4 H(q_mid) (H: the elastic Hessian, plus the penalty's Gauss-Newton part),
refactored when the contraction rate falls below 1/4 per iteration, with step halving
when a trial state leaves the energy's domain (inverted barrier element).

Limitations:
    * Numpy on the host (assembly of the 12x12 element Hessians, CHOLMOD): about
      10-50 ms per step for a few thousand tets, not the Taichi kernels of ADMM.
    * The chord matrix neglects the derivative of the correction term beta dC (it is
      O(|dC|^2)), so convergence is linear with a rate O(h^2), not quadratic.
    * Handles and damping inject or remove energy as in ADMM.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from tisim import materials
from tisim.linalg.cholesky import FactorizationError, factorize
from tisim.solvers.baselines.common import ModelEnergy

log = logging.getLogger(__name__)

SCHEMES = ("midpoint", "energy-momentum")


@dataclass
class NewtonResult:
    """Outcome of one Newton step solve."""

    positions: np.ndarray  # (n, 3) q^{k+1}, m
    iterations: int
    residual: float  # max |dx| of the last correction / bounding diagonal
    converged: bool
    factorizations: int


class MidpointNewton:
    """One step of the midpoint rule or of the energy-momentum scheme by chord Newton.

    model: :class:`tisim.model.Model`; scheme: ``"midpoint"`` or ``"energy-momentum"``;
    tolerance: max |dx| / (bounding-box diagonal) at which the iteration stops;
    max_iterations: cap on Newton corrections per step.
    """

    def __init__(self, model, scheme: str = "energy-momentum", tolerance: float = 1e-12, max_iterations: int = 100):
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        self.model = model
        self.scheme = scheme
        self.tolerance = float(tolerance)
        self.max_iterations = int(max_iterations)
        self.energy = ModelEnergy(model)
        self.mass = np.asarray(model.mass, dtype=np.float64)
        self.tets = self.energy.tets
        self.grad = self.energy.grad
        self.w = self.energy.w
        m, n = len(self.tets), model.vertex_count
        # vertex <- (element, corner) incidence: scatters element forces (4m, 3) to vertices (n, 3)
        self._incidence = sp.csr_matrix((np.ones(4 * m), (self.tets.ravel(), np.arange(4 * m))), shape=(n, 4 * m))
        self._wgrad = self.w[:, None, None] * self.grad  # (m, 4, 3)
        x = model.initial_positions
        self.scale = float(np.linalg.norm(np.ptp(x, axis=0))) if len(x) else 1.0
        self._factor = None
        self._factor_key = None
        self._accel: np.ndarray | None = None

    # --------------------------------------------------------------- forces
    def _psi(self, F: np.ndarray) -> np.ndarray:
        out = np.empty(len(F))
        with np.errstate(all="ignore"):
            for name, idx in self.energy.groups:
                out[idx] = materials.energy_density(name, F[idx], self.energy.mu[idx], self.energy.lam[idx])
        return out

    def _piola(self, F: np.ndarray) -> np.ndarray:
        P = np.empty_like(F)
        for name, idx in self.energy.groups:
            P[idx] = materials.first_piola(name, F[idx], self.energy.mu[idx], self.energy.lam[idx])
        return P

    def _scatter(self, P: np.ndarray) -> np.ndarray:
        """sum_e w_e P_e grad N_a as vertex forces (n, 3) (dE/dx for P = dpsi/dF)."""
        f = np.matmul(self._wgrad, np.transpose(P, (0, 2, 1)))  # [e, a, i] = w sum_j P_ij grad_aj
        return self._incidence @ f.reshape(-1, 3)

    def discrete_gradient(self, x0: np.ndarray, x1: np.ndarray, psi0: np.ndarray | None = None) -> np.ndarray:
        """The elastic force of the energy-momentum scheme (n, 3), N: sum_a f_a . (x1 - x0) =
        E(x1) - E(x0) and no net force or torque (see the module doc). inf entries when
        x1 inverts a barrier element. psi0: psi(F(x0)) per element (m,), Pa, if known."""
        F0 = self.energy.F(x0)
        F1 = self.energy.F(x1)
        Fm = 0.5 * (F0 + F1)
        C0 = np.matmul(np.transpose(F0, (0, 2, 1)), F0)
        C1 = np.matmul(np.transpose(F1, (0, 2, 1)), F1)
        Cm = 0.5 * (C0 + C1)
        dC = C1 - C0
        # S(C_mid) = F_c^-1 P(F_c) for any F_c with F_c^T F_c = C_mid and det F_c > 0 (isotropic,
        # frame-indifferent energies depend on C only): F_c = L^T of the Cholesky factor of C_mid
        # (SPD when F0, F1 are nonsingular), cheaper than the square root
        Fc, Fc_inv = _cholesky_upper(Cm)
        S = Fc_inv @ self._piola(Fc)
        S = 0.5 * (S + np.transpose(S, (0, 2, 1)))  # symmetric in exact arithmetic; keeps the torque zero
        with np.errstate(all="ignore"):
            psi0 = self._psi(F0) if psi0 is None else psi0
            dW = self._psi(F1) - psi0
            dC2 = np.sum(dC * dC, axis=(1, 2))
            gap = dW - 0.5 * np.sum(S * dC, axis=(1, 2))
            # psi(F1) - psi(F0) carries a round-off error ~ eps mu whatever dC, which beta dC turns
            # into a stress error ~ eps mu / |dC|; below |dC| ~ 1e-6 the correction itself is
            # O(|dC|^3) ~ 1e-18 in energy, so it is dropped there (the scheme stays consistent)
            small = dC2 <= 1e-12 * np.maximum(1.0, np.sum(Cm * Cm, axis=(1, 2)))
            beta = np.where(small, 0.0, 2.0 * gap / np.where(small, 1.0, dC2))
        S_algo = S + beta[:, None, None] * dC
        return self._scatter(Fm @ S_algo)

    def elastic_force(self, x0: np.ndarray, x1: np.ndarray, psi0: np.ndarray | None = None) -> np.ndarray:
        """The scheme's dE term (n, 3), N: grad E(x_mid) or the discrete gradient."""
        if self.scheme == "midpoint":
            return self._scatter(self._piola(self.energy.F(0.5 * (x0 + x1))))
        return self.discrete_gradient(x0, x1, psi0)

    def penalty_force(self, x0: np.ndarray, x1: np.ndarray, t0: float, t1: float) -> np.ndarray:
        """Contact penalty term (n, 3), N: its gradient at the midpoint, or its discrete gradient."""
        e = self.energy
        if not e.colliders:
            return np.zeros_like(x0)
        tm = 0.5 * (t0 + t1)
        xm = 0.5 * (x0 + x1)
        g, _ = e.penalty_gradient_hessian(xm, tm)
        if self.scheme == "midpoint":
            return g
        dx = x1 - x0
        dg = np.zeros(len(x0))
        for c in e.colliders:
            d1 = c.distance(x1, tm)
            d0 = c.distance(x0, tm)
            dg += 0.5 * e.kc * (np.minimum(d1, 0.0) ** 2 - np.minimum(d0, 0.0) ** 2)
        n2 = np.einsum("ij,ij->i", dx, dx)
        gap = dg - np.einsum("ij,ij->i", g, dx)
        ok = n2 > 1e-24 * self.scale**2
        g[ok] += (gap[ok] / n2[ok])[:, None] * dx[ok]
        return g

    # ---------------------------------------------------------------- solve
    def _matrix(self, xm: np.ndarray, h: float, tm: float, free_dof: np.ndarray):
        e = self.energy
        H = e.elastic_hessian(xm, project=False)
        if e.colliders:
            H = H + e.penalty_gradient_hessian(xm, tm)[1]
        H = (0.25 * H).tocsr()
        H.setdiag(H.diagonal() + np.repeat(self.mass / (h * h), 3))
        A = H[free_dof][:, free_dof]
        try:
            return factorize(A)
        except FactorizationError:
            # an indefinite midpoint Hessian (strongly compressed elements): use its PSD projection
            H = 0.25 * e.elastic_hessian(xm, project=True)
            if e.colliders:
                H = H + 0.25 * e.penalty_gradient_hessian(xm, tm)[1]
            H = H.tocsr()
            H.setdiag(H.diagonal() + np.repeat(self.mass / (h * h), 3))
            return factorize(H[free_dof][:, free_dof])

    def residual(self, x0, v0, x1, h: float, t0: float, psi0: np.ndarray | None = None) -> np.ndarray:
        """M (x1 - z)/h^2 + 1/2 (dE + dg_contact) - 1/2 M g, (n, 3) in N (the step's equations)."""
        z = x0 + h * v0
        r = self.mass[:, None] * (x1 - z) / (h * h)
        r += 0.5 * self.elastic_force(x0, x1, psi0)
        r += 0.5 * self.penalty_force(x0, x1, t0, t0 + h)
        r -= 0.5 * self.mass[:, None] * self.energy.gravity[None, :]
        return r

    def solve(
        self,
        x0: np.ndarray,
        v0: np.ndarray,
        h: float,
        t0: float,
        held: np.ndarray | None = None,
        held_x: np.ndarray | None = None,
        x_start: np.ndarray | None = None,
    ) -> NewtonResult:
        """q^{k+1} of one step from (x0, v0) (n, 3) over h seconds; held vertices are set to held_x."""
        n = len(x0)
        held = np.zeros(0, dtype=np.int64) if held is None else np.asarray(held, dtype=np.int64)
        free = np.ones(n, dtype=bool)
        free[held] = False
        free_dof = np.flatnonzero(np.repeat(free, 3))
        if x_start is not None:
            x = np.array(x_start, dtype=np.float64)
        elif self._accel is not None:
            # the previous step's acceleration: the first guess is O(h^3) off instead of O(h^2)
            x = x0 + h * v0 + 0.5 * h * h * self._accel
        else:
            x = x0 + h * v0
        if len(held):
            x[held] = held_x
        key = (h, held.tobytes())
        if self._factor_key != key:
            self._factor = None
        # the first guess must lie in the energy's domain where the scheme evaluates it:
        # the midpoint (midpoint rule) or x0 and x (energy-momentum)
        for cand in (None, x0 + h * v0, x0.copy()):
            if cand is not None:
                x = cand
                if len(held):
                    x[held] = held_x
            probe = 0.5 * (x0 + x) if self.scheme == "midpoint" else x
            if math.isfinite(self.energy.elastic(probe)):
                break
        nfact = 0
        best = best_before = math.inf
        stagnant = 0
        res = math.inf
        prev = math.inf
        converged = False
        it = 0
        psi0 = self._psi(self.energy.F(x0)) if self.scheme == "energy-momentum" else None
        r = self.residual(x0, v0, x, h, t0, psi0)
        for it in range(1, self.max_iterations + 1):  # noqa: B007 (the count is read after the loop)
            if self._factor is None:
                try:
                    self._factor = self._matrix(0.5 * (x0 + x), h, t0 + 0.5 * h, free_dof)
                except FactorizationError as e:  # no valid start (inverted midpoint): give up the step
                    log.warning("Newton %s step: %s", self.scheme, e)
                    break
                self._factor_key = key
                nfact += 1
                prev = math.inf
            dx = np.zeros(3 * n)
            dx[free_dof] = -self._factor.solve(r.reshape(-1)[free_dof])
            dx = dx.reshape(n, 3)
            alpha = 1.0
            for _ in range(30):
                xn = x + alpha * dx
                rn = self.residual(x0, v0, xn, h, t0, psi0)
                if np.all(np.isfinite(rn)):
                    break
                alpha *= 0.5  # the trial state left the energy's domain
            else:
                break
            x, r = xn, rn
            res = alpha * float(np.abs(dx).max()) / self.scale
            if res <= self.tolerance:
                converged = True
                break
            best = min(best, res)
            stagnant = stagnant + 1 if res > 0.5 * best_before else 0
            best_before = best
            if stagnant >= 5 and best <= 1e3 * self.tolerance:
                # five corrections without halving the step near the tolerance: the round-off
                # floor of the forces (soft, light bodies: small M/h^2) is reached
                converged = True
                break
            if res > 0.25 * prev or alpha < 1.0:
                self._factor = None  # slow contraction: the chord matrix is out of date
            prev = res
        self._accel = 2.0 * (x - x0 - h * v0) / (h * h) if converged else None
        return NewtonResult(x, it, res, converged, nfact)

    def forget(self) -> None:
        """Drop the warm start (previous acceleration) and the chord factorization."""
        self._accel = None
        self._factor = None
        self._factor_key = None


def _cholesky_upper(C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """U = L^T and U^-1 for SPD C (m, 3, 3) = L L^T, in closed form (vectorised over m);
    U^T U = C, det U > 0. NaN where C is not positive definite."""
    with np.errstate(invalid="ignore", divide="ignore"):
        l00 = np.sqrt(C[:, 0, 0])
        l10 = C[:, 1, 0] / l00
        l20 = C[:, 2, 0] / l00
        l11 = np.sqrt(C[:, 1, 1] - l10 * l10)
        l21 = (C[:, 2, 1] - l20 * l10) / l11
        l22 = np.sqrt(C[:, 2, 2] - l20 * l20 - l21 * l21)
        U = np.zeros_like(C)
        U[:, 0, 0], U[:, 0, 1], U[:, 0, 2] = l00, l10, l20
        U[:, 1, 1], U[:, 1, 2] = l11, l21
        U[:, 2, 2] = l22
        Ui = np.zeros_like(C)
        Ui[:, 0, 0] = 1.0 / l00
        Ui[:, 1, 1] = 1.0 / l11
        Ui[:, 2, 2] = 1.0 / l22
        Ui[:, 0, 1] = -l10 / (l00 * l11)
        Ui[:, 1, 2] = -l21 / (l11 * l22)
        Ui[:, 0, 2] = (l10 * l21 - l20 * l11) / (l00 * l11 * l22)
    return U, Ui
