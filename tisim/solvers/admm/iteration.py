"""The ADMM iterations of one midpoint step (notes §2.5, §2.7).

Each iteration is the q-step (A q = B with the cached factorization), the
element R-, S- and dual steps in one kernel (which also assembles the element
part of the next B), the proximal step on the contact copy q' and its dual, and
every ``rho_update_interval`` iterations the rebalancing of the penalties
(local levels, residual balancing), which refactors A. The iterations stop when
the primal, dual and stress residuals meet the tolerances, on a non-finite
iterate (keeping the last finite one), or at ``max_iterations``.

:class:`~tisim.solvers.admm.solver.SolverADMM` sets the splitting up before
(``_init_splitting``, the deformation gradients at q^k) and turns the result
into q^{k+1}, the velocity and the StepStats after; the warm-start data stay in
the solver, which this module reads and updates in place.
"""

from __future__ import annotations

import math
import time

import numpy as np


class StepIterations:
    """The working state of the ADMM iterations of one step of ``solver`` from
    (x0, v0) at time t0 over h.

    After :meth:`run`: ``q`` (n, 3) the end-of-step positions (the last finite
    iterate), ``it`` the iterations made, ``converged``, ``nonfinite``, the
    residuals ``rp`` (primal), ``rd`` (dual) and ``rs`` (stress) of the last
    iteration, ``min_det_mid``, ``prox_failed`` (elements whose S-step Newton
    solve stopped unconverged in the last iteration), ``prox_failures`` (summed
    over the iterations), ``timings`` (ms per part) and the held vertices
    ``held``, ``held_x``, ``held_v`` at the end of the step.
    """

    def __init__(self, solver, h: float, x0: np.ndarray, v0: np.ndarray, t0: float):
        s = self.solver = solver
        cfg = self.cfg = solver.config
        self.K = solver._K
        self.h, self.x0 = h, x0
        self.tmid = t0 + 0.5 * h
        self.timings = {"q_step": 0.0, "local": 0.0, "contact": 0.0, "factor": 0.0}
        if cfg.local_rho and s._update_local_rho(allow_lower=True):
            s.rho_levels_changed += 1
        self.held, self.held_x, self.held_v = s.held_vertices(t0 + h)
        tf = time.perf_counter()
        self.fact = s._factorization(h, self.held)
        self.timings["factor"] += 1e3 * (time.perf_counter() - tf)
        z = x0 + h * v0
        fext = s._mass[:, None] * s.model.gravity[None, :]
        if s._grab_force is not None:  # the live window's grab: an external force beside gravity
            fext = fext + s._grab_force
        self.mu_c = s._contact_mu(h)
        self.contact = bool(s._colliders)
        self.qp = self.W = self.mu_col = None
        if self.contact:
            self.qp = z.copy()
            self.qp[self.held] = self.held_x
            self.W = s._W
            self.W[self.held] = 0.0
            self.mu_col = self.mu_c[:, None]
        self.held_term = self.fact.A_fh @ self.held_x if len(self.held) else 0.0
        self.q = z.copy()
        self.q[self.held] = self.held_x
        self.q_last_good = self.q.copy()
        self.rhs = s._rhs
        self.rp = self.rd = self.rs = math.inf
        self.min_det_mid = math.nan
        self.converged = False
        self.nonfinite = False
        self.prox_failed = self.prox_failures = 0
        self.it = 0
        self.base_vertex = s._mass[:, None] * z / (h * h) + 0.5 * fext

    def run(self) -> None:
        """Iterate until converged, non-finite or at the solver's iteration cap."""
        s, cfg = self.solver, self.cfg
        self._vertex_rhs()
        self.K.assemble_rhs(self.rhs, s._topo, s._grad, s._params, s._split)
        for it in range(1, s.max_iterations + 1):
            self.it = it
            if not self._iterate(it):
                break
            if it % cfg.rho_update_interval == 0 and it < s.max_iterations:
                self._rebalance()

    def why(self) -> str:
        """Why the iterations stopped unconverged, for the stall report."""
        s = self.solver
        return (
            f"{'a non-finite iterate' if self.nonfinite else f'{s.max_iterations} iterations'}: primal residual "
            f"{self.rp:.3g}, dual {self.rd:.3g} (tolerance {s.tolerance:.3g})"
            + (f", {self.prox_failed} elements' S-step Newton unconverged" if self.prox_failed else "")
        )

    def _vertex_rhs(self) -> None:
        """The vertex part of B: inertia, half the external force, the contact copy's pull."""
        np.copyto(self.rhs, self.base_vertex, casting="unsafe")
        if self.contact:
            self.rhs[:] += self.mu_col * self.qp - self.W

    def _iterate(self, it: int) -> bool:
        """Iteration ``it``; False when the iterations stop (converged or non-finite)."""
        s, fact, q = self.solver, self.fact, self.q
        # q-step (notes §2.5a): A q = B
        ts = time.perf_counter()
        qf = fact.factor.solve(self.rhs[fact.free].astype(np.float64) - self.held_term)
        q[fact.free] = qf
        self.timings["q_step"] += 1e3 * (time.perf_counter() - ts)
        if not np.all(np.isfinite(qf)):
            self.nonfinite = True
            q[:] = self.q_last_good
            return False
        check = self._local_steps(it)
        if self.contact:
            self._contact_step()
        if s.trace is not None:
            s.trace.append((it, self.rp, self.rd, self.rs, self.min_det_mid, s._rho_factor))
        if s.iteration_callback is not None:
            s.iteration_callback(it, q)
        if not (math.isfinite(self.rp) and math.isfinite(self.rd)) or self.nonfinite:
            self.nonfinite = True
            q[:] = self.q_last_good
            return False
        self.q_last_good[:] = q
        if (
            check
            and self.rp <= s.tolerance
            and self.rd <= s.dual_tolerance
            and self.rs <= s.dual_tolerance
            and self.prox_failed == 0
        ):
            self.converged = True
            return False
        return True

    def _local_steps(self, it: int) -> bool:
        """R-, S- and dual steps (notes §2.5b-d) and the element part of the next
        B; sets the residuals. Returns whether this iteration checks convergence
        (the stress residual is only computed then)."""
        s, K, cfg = self.solver, self.K, self.cfg
        ts = time.perf_counter()
        np.copyto(self.rhs, self.base_vertex, casting="unsafe")
        check = it >= cfg.min_iterations and self.rp <= s.tolerance and self.rd <= s.dual_tolerance
        out = K.iterate(
            s._as_real(self.q),
            self.rhs,
            s._topo,
            s._params,
            s._grad,
            s._split,
            1 if check else 0,
            cfg.prox_newton_iterations,
        )
        self.timings["local"] += 1e3 * (time.perf_counter() - ts)
        vol = max(float(out[K.VOLUME]), 1e-300)
        self.rp = math.sqrt(max(float(out[K.PRIMAL]), 0.0) / vol)
        # RMS rho_i ||dZ_i|| / (w_i k_i): the change of the stress rho dZ relative to the
        # stiffness, the part of the q-step force that has not converged yet
        self.rd = math.sqrt(max(float(out[K.DUAL]), 0.0) / vol)
        self.rs = math.sqrt(float(out[K.STRESS]) / vol) if check else math.inf
        self.min_det_mid = float(out[K.MIN_DET_F])
        self.prox_failed = int(out[K.PROX_FAILED])
        self.prox_failures += self.prox_failed
        if out[K.NONFINITE] > 0:
            self.nonfinite = True
        return check

    def _contact_step(self) -> None:
        """The proximal step on the contact copy q' (notes §2.7), then its dual;
        the gap and the change of q' enter the primal and dual residuals."""
        s, q, mu_col = self.solver, self.q, self.mu_col
        ts = time.perf_counter()
        qp_old = self.qp
        qp = self.qp = s._contact_prox(q, self.W, self.mu_c, self.x0, self.tmid)
        qp[self.held] = q[self.held]
        self.W += mu_col * (q - qp)
        self.rhs[:] += mu_col * qp - self.W
        gap = q - qp
        self.rp = max(self.rp, math.sqrt(float(np.mean(np.einsum("ij,ij->i", gap, gap)))) / s._edge)
        dq = qp - qp_old
        self.rd = max(self.rd, math.sqrt(float(np.mean(np.einsum("ij,ij->i", dq, dq)))) / s._edge)
        self.timings["contact"] += 1e3 * (time.perf_counter() - ts)

    def _rebalance(self) -> None:
        """Raise local penalty levels and balance the residuals (double or halve
        every rho together); when rho changed, refactor A and rebuild B."""
        s, K, cfg = self.solver, self.K, self.cfg
        changed = False
        if cfg.local_rho and s._update_local_rho(allow_lower=False):
            s.rho_levels_changed += 1
            changed = True
        factor = 1.0
        if cfg.adaptive_rho:
            if self.rp > cfg.rho_balance * self.rd:
                factor = 2.0
            elif self.rd > cfg.rho_balance * self.rp:
                factor = 0.5
        new = s._rho_factor * factor
        if factor != 1.0 and cfg.rho_min_scale <= new <= cfg.rho_max_scale:
            s._rho_factor = new
            K.scale_penalties(s._params, factor)
            s._params_np[:, [K.RHO, K.ETA]] *= factor
            changed = True
        if changed:
            tf = time.perf_counter()
            self.fact = s._factorization(self.h, self.held)
            self.timings["factor"] += 1e3 * (time.perf_counter() - tf)
            self.held_term = self.fact.A_fh @ self.held_x if len(self.held) else 0.0
            self._vertex_rhs()  # B depends on rho
            K.assemble_rhs(self.rhs, s._topo, s._grad, s._params, s._split)
