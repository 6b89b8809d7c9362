"""Backward (implicit) Euler solved by Newton's method: the baseline the variational
integrator is compared with.

Each step minimises the incremental potential (the optimisation form of backward Euler)

    Phi(x) = 1/(2 h^2) ||x - x_hat||_M^2 + E(x) + E_grav(x) + E_pen(x, t + h),
    x_hat = x^k + h v^k,   v^{k+1} = (x^{k+1} - x^k) / h,

over the free vertices (held vertices are set to their targets), with Newton steps
on the projected Hessian M/h^2 + sum_e PSD(H_e) + k n n^T (sparse, assembled in
numpy/scipy, solved by Cholesky) and a backtracking Armijo line search that also
rejects inverted barrier elements (Phi = inf there). Energies and contact
potential are shared with ADMM (:mod:`tisim.solvers.baselines.common`).

References:
    C. Kane, J. E. Marsden, M. Ortiz, M. West, Variational integrators and the Newmark
    algorithm, 2000 (incremental potentials); T. Gast, C. Schroeder, A. Stomakhin,
    C. Jiang, J. Teran, Optimization integrator for large time steps, TVCG 2015;
    A. McAdams et al., Efficient elasticity for character skinning with contact and
    collisions, 2011 (projected per-element Hessians).

Limitations:
    * First order; dissipates energy (numerical damping grows with h), which is what
      the comparison shows. Angular momentum is not conserved exactly either.
    * Newton on the full system: a factorization per iteration (slow for big meshes).
    * Frictionless penalty contact with a Gauss-Newton contact Hessian.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from tisim.linalg.cholesky import FactorizationError, factorize
from tisim.solvers.base import Solver, StepStats
from tisim.solvers.baselines.common import ModelEnergy
from tisim.solvers.baselines.config import ImplicitEulerConfig

log = logging.getLogger(__name__)


class SolverImplicitEuler(Solver):
    """Backward Euler with Newton and line search (see the module doc).

    StepStats: iterations (Newton), residual (max |dx| of the last Newton step / bounding
    diagonal), converged, potential (elastic + gravity + penalty at state_out), and extra
    ``line_search_failures``.
    """

    name = "implicit-euler"

    def __init__(self, model, config: ImplicitEulerConfig | None = None):
        super().__init__(model, config if config is not None else ImplicitEulerConfig())
        self.energy = ModelEnergy(model, self.config.stable_neo_hookean)
        self.mass = np.asarray(model.mass, dtype=np.float64)
        x = model.initial_positions
        self.scale = float(np.linalg.norm(np.ptp(x, axis=0))) if len(x) else 1.0
        self._damping = float(model.scene.sim.damping)
        self._warned = 0

    def _phi(self, x, x_hat, h, t1):
        d = x - x_hat
        inertia = 0.5 / (h * h) * float(np.sum(self.mass[:, None] * d * d))
        e = self.energy.elastic(x)
        if not math.isfinite(e):
            return math.inf
        return inertia + e + self.energy.gravity_energy(x) + self.energy.penalty(x, t1)

    def _newton_system(self, x, x_hat, h: float, t1: float, Mh, free_dof):
        """The Newton system of the incremental potential at x, on the free dofs: (H_ff, g_f)
        with the elastic Hessian projected to PSD, plus M / h^2 and the colliders' penalty."""
        g = (
            self.mass[:, None] * (x - x_hat) / (h * h)
            + self.energy.elastic_gradient(x)
            - self.mass[:, None] * self.energy.gravity[None, :]
        )
        H = self.energy.elastic_hessian(x, project=True)
        if self.energy.colliders:
            gp, Hp = self.energy.penalty_gradient_hessian(x, t1)
            g += gp
            H = H + Hp
        H = H.tocsr()
        H.setdiag(H.diagonal() + Mh)
        return H[free_dof][:, free_dof], g.reshape(-1)[free_dof]

    def step(self, state_in, state_out, dt: float) -> StepStats:
        if not (math.isfinite(dt) and dt > 0):
            raise ValueError(f"implicit Euler step: the time step must be a finite number > 0, got {dt!r}")
        x0 = np.asarray(state_in.positions, dtype=np.float64)
        v0 = np.asarray(state_in.velocities, dtype=np.float64)
        if not (np.all(np.isfinite(x0)) and np.all(np.isfinite(v0))):
            raise ValueError("implicit Euler step: the input state has NaN/inf positions or velocities")
        cfg = self.config
        h = float(dt)
        t1 = float(state_in.time) + h
        n = len(x0)
        held, held_x, held_v = self.held_vertices(t1)
        free = np.ones(n, dtype=bool)
        free[held] = False
        free_dof = np.flatnonzero(np.repeat(free, 3))
        x_hat = x0 + h * v0
        x = x_hat.copy()
        x[held] = held_x
        if not math.isfinite(self.energy.elastic(x)):
            x = x0.copy()  # start from the last (valid) configuration
            x[held] = held_x
        phi = self._phi(x, x_hat, h, t1)
        Mh = np.repeat(self.mass / (h * h), 3)
        converged = False
        res = math.inf
        ls_fail = 0
        t_asm = t_solve = 0.0
        it = 0
        for it in range(1, cfg.max_iterations + 1):  # noqa: B007 (the count is read after the loop)
            ts = time.perf_counter()
            Hff, gf = self._newton_system(x, x_hat, h, t1, Mh, free_dof)
            t_asm += time.perf_counter() - ts
            ts = time.perf_counter()
            try:
                dx = -factorize(Hff).solve(gf)
            except FactorizationError as e:  # cannot happen with PSD projection and M > 0
                log.warning("implicit Euler: %s", e)
                break
            t_solve += time.perf_counter() - ts
            step = np.zeros(3 * n)
            step[free_dof] = dx
            step = step.reshape(n, 3)
            slope = float(gf @ dx)
            alpha = 1.0
            accepted = False
            for _ in range(cfg.line_search_iterations):
                xn = x + alpha * step
                pn = self._phi(xn, x_hat, h, t1)
                if pn <= phi + cfg.armijo * alpha * slope:
                    accepted = True
                    break
                alpha *= 0.5
            res = alpha * float(np.abs(step).max()) / self.scale
            if not accepted:
                ls_fail += 1
                # at round-off level the Newton step cannot decrease Phi any further
                converged = float(np.abs(step).max()) / self.scale <= cfg.tolerance
                break
            x = xn
            phi = pn
            if res <= cfg.tolerance:
                converged = True
                break
        if not converged:
            self._warned += 1
            if self._warned == 1 or self._warned % 50 == 0:
                log.warning(
                    "implicit Euler: Newton did not converge at t=%.6g s (%d iterations, last step %.3g)", t1, it, res
                )
        v1 = (x - x0) / h
        if len(held):
            v1[held] = held_v
        if self._damping > 0:
            v1 /= 1.0 + self._damping * h
        np.copyto(state_out.positions, x)
        np.copyto(state_out.velocities, v1)
        state_out.time = t1
        n_contacts, depth = self.energy.contacts(x, t1)
        return StepStats(
            iterations=it,
            residual=res,
            converged=converged,
            potential=self.energy.potential(x, t1),
            n_contacts=n_contacts,
            max_penetration=depth,
            timings={"assemble": 1e3 * t_asm, "solve": 1e3 * t_solve},
            extra={"line_search_failures": float(ls_fail)},
        )

    def potential_energy(self, positions: np.ndarray) -> float:
        return self.energy.potential(np.asarray(positions, dtype=np.float64), 0.0)

    def info(self) -> dict:
        return {
            "solver": "implicit-euler",
            "tolerance": self.config.tolerance,
            "max_iterations": self.config.max_iterations,
        }
