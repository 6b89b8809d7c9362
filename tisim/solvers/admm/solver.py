"""Variational midpoint integrator for elastodynamics, solved per time step by ADMM.

One step k -> k+1 minimises (notes §2.4)

    1/(2 h^2) ||q - z^k||_M^2 + sum_i w_i psi_i(S_i) + g(q_mid)
    s.t.  F_i(q_mid) = R_i S_i,  R_i in SO(3),  S_i symmetric PSD,

with q_mid = (q^k + q)/2, z^k = q^k + h v^k and g the external potential
(gravity, penalty contact). Its stationary points are the implicit midpoint
rule; velocities follow the midpoint recursion v^{k+1} = 2/h (q^{k+1} - q^k) - v^k.

Stiffness (kappa, lambda of the notes) from each object's Lame parameters
(mu, lam) (``ObjectConfig.lame``, from Young's modulus and Poisson's ratio):

=====================  =======================================  ===================
scene material         energy integrated (zero at rest)         notes' parameters
=====================  =======================================  ===================
arap                   mu ||F - R||^2 = kappa/2 ||S - I||^2     kappa = 2 mu
symmetric-dirichlet    mu/2 (||F||^2 + ||F^-1||^2) - 3 mu       kappa = mu
symmetric-gradient     mu/2 (||F||^2 - 3) - mu log J            kappa = mu
neo-hookean            mu/2 (||F||^2 - 3) - mu log J            kappa = mu, lambda = lam
                       + lam/2 (log J)^2 (the notes' NH; the
                       stable NH of tisim.materials is not used)
corotated              mu ||F - R||^2 + lam/2 (J - 1)^2         not in the notes
=====================  =======================================  ===================

So kappa = 35 for Neo-Hookean/SymG means mu = 35 Pa, e.g. E = 93.33 Pa with
nu = 1/3 (then lam = 4 mu = 4 kappa, the notes' armadillo setting).

ADMM (notes §2.5, §3): the q-step solves A q = B with A = M/h^2 + sum_i rho_i/4
G_i^T G_i (+ mu_v I with contact), factored once per (dt, rho scale, set of held
vertices); the R-step is the proximal Procrustes problem by signed SVD; the
S-step each energy's proximal operator on the PSD cone; then the dual update.
Penalties rho_i = rho_scale * w_i * k_i with k_i the largest eigenvalue of the
energy's Hessian in the singular values at rest (2 mu, 2 mu + 3 lam, 4 mu); with
``adaptive_rho`` all rho_i are doubled or halved together (residual balancing)
and A is refactored. Contact with analytic colliders is a penalty
k_c/2 max(0, -d(x_mid))^2 per vertex and collider (k_c = ``contact.stiffness``),
handled by the proximal step on the copy q' (notes §2.7): along the collider's
normal at the point, which is the exact prox for planes, spheres and cylinder
sides, and for boxes inside one face's region. Held vertices (handles, mouse
drag) are eliminated from the q-step.

Energy behaviour (measured by ``studies/midpoint_diagnosis.py``): the step is the implicit
midpoint rule of the energy that is measured (an independent Newton solve of the midpoint
equations with the numpy energies of :mod:`tisim.materials` gives the same trajectory to the
ADMM tolerance). The midpoint rule is symplectic, but on stiff nonlinear elastodynamics with
h omega_max = O(1) (the spinning bar at h = 0.01 s) its energy error is not bounded: it drifts
upwards at O(h^2) per unit time and blows up (the end-of-step state q^{k+1} = 2 q_mid - q^k
inverts elements while the midpoint stays valid), the weakness of the midpoint rule shown by
Simo and Tarnow (1992) and Gonzalez (2000). ``integrator = "energy-momentum"`` replaces the
step by their discrete-gradient (energy-momentum) step, solved by Newton
(:mod:`tisim.solvers.admm.energy_momentum`): energy conserved to the Newton tolerance, linear
and angular momentum exactly, and no inversion (barrier energies cannot grow without bound).
Every step reports ``energy_drift`` (relative change of the total energy since the first
step, NaN with handles, damping or moving colliders) and the solver warns once when it
exceeds ``drift_warning``.

Stalled steps: a step that reaches ``max_iterations`` above the tolerance (or
whose last iteration had an element S-step Newton solve at its cap, or a non-finite
iterate) is not accepted: it is retried from a fresh splitting (rho back to its start) with
``retry_iteration_factor`` x the cap, then as two half steps (``retry_halvings`` levels).
What still fails is returned flagged (``converged`` False, ``stall_failed`` = 1) and the
runner ends the run with exit status 4. Counts: ``info()["stalls"]`` and run.json.
Verification that a wrong scheme fails: :mod:`tisim.solvers.admm.verification`.

References:
    O. Gonzalez, Exact energy and momentum conserving algorithms for general models in
    nonlinear elasticity, CMAME 190, 2000 (the energy-momentum option);
    Variational elastodynamic simulation with ADMM (algorithm note
    ``shared/papers/admm-variational.md``); S. Boyd et al., Distributed
    Optimization and Statistical Learning via ADMM, 2011 (residual balancing);
    J. C. Simo, N. Tarnow, K. K. Wong, Exact energy-momentum conserving
    algorithms, 1992 (midpoint rule and its momentum maps).

Limitations:
    * No self-collision or object-object contact; contact is a frictionless
      penalty (its stiffness limits the time step, a stiff penalty needs a small h).
    * Neo-Hookean with lam != 0 and corotated leave the convexity assumption of
      the convergence theory (their prox is a damped Newton solve); ARAP and
      corotated only guarantee det >= 0 (the PSD cone), the others det > 0 - at the
      midpoint Jacobian and up to the primal residual, not at q^{k+1} itself.
    * Midpoint rule: angular momentum is conserved to the ADMM tolerance and linear
      momentum exactly (without handles, gravity or contact); the energy is not conserved
      and can drift and blow up on long stiff runs (see above): use a smaller h or the
      energy-momentum option, which runs on the host with Newton (no ADMM, slower per
      step on large meshes).
    * Handles and moving colliders inject energy; mass damping (``sim.damping``)
      scales velocities by 1/(1 + c h) after each step.
    * Iteration counts grow with deformation and stiffness relative to M/h^2
      (hundreds to thousands for stiff, large-deformation steps).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from tisim import backend
from tisim.geometry.precompute import gradient_operator
from tisim.linalg.cholesky import factorize
from tisim.scene import MATERIALS
from tisim.solvers.admm.config import ADMMConfig
from tisim.solvers.admm.iteration import StepIterations
from tisim.solvers.base import Solver, StepStats, Tunable

log = logging.getLogger(__name__)


def midpoint_velocity(q: np.ndarray, x0: np.ndarray, v0: np.ndarray, h: float) -> np.ndarray:
    """v^{k+1} = 2/h (q^{k+1} - q^k) - v^k (n, 3), m/s: the implicit midpoint rule's velocity
    (notes §2.4), not the finite difference (q^{k+1} - q^k)/h, which is first order and
    changes the energy at every step (tests/verification/test_admm_mutations.py)."""
    return 2.0 / h * (q - x0) - v0


def _new_stall_counts() -> dict[str, int]:
    # stalled_steps: steps whose first attempt stalled; retries: further attempts made;
    # recovered: stalled steps a retry converged; failed: steps unconverged after all retries
    return {"stalled_steps": 0, "retries": 0, "recovered": 0, "failed": 0}


@dataclass
class _Factorization:
    key: tuple
    free: np.ndarray  # (n_f,) indices of the unknowns
    held: np.ndarray  # (n_h,) indices of the prescribed vertices
    factor: object  # tisim.linalg.cholesky.Factor of A[free][:, free]
    A_fh: sp.csr_matrix  # A[free][:, held]


class SolverADMM(Solver):
    """ADMM solver of the variational midpoint integrator (see the module doc).

    ``step(state_in, state_out, dt)`` writes q^{k+1} and the midpoint-recursion
    velocity v^{k+1} into ``state_out`` and returns StepStats with iterations,
    residual (primal), converged, potential (elastic + gravity + penalty at
    state_out, J) and extra columns ``primal_residual``, ``dual_residual``,
    ``stress_residual`` (see :class:`ADMMConfig`), ``admm_stalled`` (0/1: unconverged even
    after the retries), ``admm_stalled_total`` (such steps since reset), ``stall_retries``
    (retries this step needed), ``stall_failed`` (= admm_stalled: the runner ends the run on
    it), ``prox_failures`` (element S-steps whose Newton solve stopped unconverged, summed
    over the step's iterations), ``rho_scale`` (global rho
    factor), ``rho_local_max`` (largest local rho raise), ``min_det_mid`` (min det F at
    the midpoint) and ``min_det`` (at state_out), ``energy_drift`` (relative total energy change
    since the first step). With ``integrator = "energy-momentum"`` iterations and residual are
    Newton's and the ADMM columns are replaced by ``factorizations``.
    Warm-start data (R, S, Y per element, W per vertex) stay in the solver; a
    token in ``state.warm["admm"]`` tells whether ``state_in`` is the state the
    solver last produced (otherwise the splitting is re-initialised).
    """

    name = "admm"

    def __init__(self, model, config: ADMMConfig | None = None):
        import taichi as ti

        from tisim.solvers.admm import kernels as K
        from tisim.solvers.admm.prox import rest_stiffness

        super().__init__(model, config if config is not None else ADMMConfig())
        self._K = K
        cfg = self.config
        real = backend.real()
        self._np_real = backend.np_real()
        n, m = model.vertex_count, model.element_count
        self.n, self.m = n, m
        self.tolerance = float(cfg.tolerance)
        self.dual_tolerance = float(cfg.dual_tol)
        self.max_iterations = int(cfg.max_iterations)
        self.rho_scale = float(cfg.rho_scale)

        self._topo = ti.ndarray(ti.i32, shape=(m, 5))
        self._grad = ti.ndarray(real, shape=(m, 4, 3))
        self._grad.from_numpy(np.ascontiguousarray(model.rest.grad, dtype=self._np_real))
        self._params = ti.ndarray(real, shape=(m, K.N_PARAMS))
        self._split = ti.ndarray(ti.types.matrix(3, 3, real), shape=(m, 4))

        self._rest_stiffness = rest_stiffness
        self._G = gradient_operator(model.mesh.tets, model.rest.grad, n).tocsr()
        self._set_materials()
        self.rho_levels_changed = 0

        vol = model.rest.volume
        self._edge = float(np.mean(np.cbrt(6.0 * np.sqrt(2.0) * vol))) if m else 1.0
        self._mass = np.asarray(model.mass, dtype=np.float64)
        if np.any(self._mass <= 0):
            raise ValueError("every vertex needs a positive mass (a vertex belongs to no tet?)")
        scene = model.scene
        self._colliders = list(model.colliders) if scene.contact.enabled else []
        self._kc = float(scene.contact.stiffness)
        self._damping = float(scene.sim.damping)

        self.trace: list | None = None  # set to [] to record (iteration, primal, dual, stress, min det, rho factor)
        # called as f(iteration, q) after each full ADMM iteration (q-, R-, S-, dual steps); tests
        self.iteration_callback = None
        self._fact: _Factorization | None = None
        self._token: int | None = None
        self._counter = 0
        self._W = np.zeros((n, 3))
        self._stalls = _new_stall_counts()
        self._why = ""  # why the last attempt stopped unconverged (for the warnings)
        self._last_time = 0.0
        self._x_scratch = np.zeros((n, 3), dtype=self._np_real)
        self._rhs = np.zeros((n, 3), dtype=self._np_real)
        self._em = None
        if cfg.integrator == "energy-momentum":
            from tisim.solvers.admm.energy_momentum import MidpointNewton

            self._em = MidpointNewton(model, "energy-momentum", cfg.newton_tolerance, cfg.newton_max_iterations)
        self._energy_ref: float | None = None  # total energy the drift is measured from, J
        self._energy_scale = 1.0
        self._drift_warned = False

    # ------------------------------------------------------------------ setup
    def _set_materials(self) -> None:
        model = self.model
        mat = np.asarray(model.element_material, dtype=np.int32)
        w = np.asarray(model.rest.volume, dtype=np.float64)
        # the live panel's "stiffness" scales Young's modulus, i.e. both Lame parameters
        scale = getattr(self, "_stiffness_scale", 1.0)
        mu = scale * np.asarray(model.element_mu, dtype=np.float64)
        lam = scale * np.asarray(model.element_lam, dtype=np.float64)
        k = np.empty(self.m)
        for code, name in enumerate(MATERIALS):
            sel = mat == code
            if np.any(sel):
                k[sel] = self._rest_stiffness(name, mu[sel], lam[sel])
        self._wk = w * k  # the unit of the stress residuals, N m
        self._level = np.zeros(self.m, dtype=np.int64)  # local rho = 2^level * rest rho
        self._rho_factor = 1.0
        topo = np.empty((self.m, 5), dtype=np.int32)
        topo[:, :4] = model.mesh.tets
        topo[:, 4] = mat
        self._topo.from_numpy(topo)
        K = self._K
        params = np.empty((self.m, K.N_PARAMS))
        params[:, K.W] = w
        params[:, K.MU] = mu
        params[:, K.LAM] = lam
        params[:, K.WK] = self._wk
        self._params_np = params
        self._set_rho0()

    def _set_rho0(self) -> None:
        """rho at rho factor 1: rho_scale * w * k * 2^level; rebuilds sum rho/4 G^T G."""
        self._rho0 = self.rho_scale * self._wk * np.exp2(self._level)
        self._apply_rho()
        # sum_i rho0_i/4 G_i^T G_i: the scalar part of A (A is (this) kron I_3)
        d = np.repeat(self._rho0 / 4.0, 3)
        self._L0 = (self._G.T @ sp.diags(d) @ self._G).tocsc()
        self._rho_version = getattr(self, "_rho_version", 0) + 1
        self._fact = None

    def _apply_rho(self) -> None:
        """Upload the element parameters with rho = rho0 * rho factor (resets Taichi's copy of rho)."""
        K = self._K
        rho = self._rho0 * self._rho_factor
        self._params_np[:, K.RHO] = rho
        self._params_np[:, K.ETA] = self.config.eta_fraction * rho
        self._params.from_numpy(self._params_np.astype(self._np_real))

    def _update_local_rho(self, allow_lower: bool) -> bool:
        """Raise rho_i of elements that need it now (compressed barrier elements: see
        ``kernels.stiffness_ratio``), in powers of two of the rest value; with
        ``allow_lower`` (at the start of a step) lower it again once an element needs two
        levels less. Returns whether any rho changed (A is then refactored).

        Why: ADMM on this nonconvex problem cycles when rho_i is below the element's
        curvature or compressive stress; an element squeezed to sigma_3 = 0.4 already
        needs about 4 times its rest-state rho, one at sigma_3 = 0.05 hundreds of times.
        """
        cfg = self.config
        ratio = np.zeros(self.m, dtype=self._np_real)
        self._K.stiffness_ratio(self._topo, self._params, self._split, self.rho_scale, ratio)
        need = np.log2(np.maximum(ratio.astype(np.float64), 1e-300) * cfg.local_rho_threshold)
        target = np.clip(np.ceil(need), 0, cfg.local_rho_max_level).astype(np.int64)
        new = np.maximum(target, self._level)
        if allow_lower:
            new = np.where(target < self._level - 1, target + 1, new)
        if np.array_equal(new, self._level):
            return False
        self._level = new
        self._set_rho0()
        return True

    def _contact_mu(self, h: float) -> np.ndarray:
        if not self._colliders:
            return np.zeros(self.n)
        return self.config.contact_penalty_scale * self._mass / (h * h)

    def _factorization(self, h: float, held: np.ndarray) -> _Factorization:
        key = (h, self._rho_factor, self._rho_version, held.tobytes())
        if self._fact is not None and self._fact.key == key:
            return self._fact
        t0 = time.perf_counter()
        A = self.global_matrix(h)
        mask = np.ones(self.n, dtype=bool)
        mask[held] = False
        free = np.flatnonzero(mask)
        Aff = A[free][:, free]
        A_fh = A[free][:, held].tocsr()
        self._fact = _Factorization(key, free, held, factorize(Aff), A_fh)
        log.debug("ADMM: factored A (%d unknowns) in %.1f ms", len(free), 1e3 * (time.perf_counter() - t0))
        return self._fact

    # --------------------------------------------------------------- helpers
    def _as_real(self, x: np.ndarray) -> np.ndarray:
        if x.dtype == self._np_real and x.flags.c_contiguous:
            return x
        out = self._x_scratch
        np.copyto(out, x, casting="unsafe")
        return out

    def _init_splitting(self, x: np.ndarray) -> None:
        """R, S from the polar decomposition of F(x); Y = w P(F) (the static dual); W = 0."""
        K = self._K
        K.store_deformation_gradients(self._as_real(x), self._topo, self._grad, self._split)
        K.init_splitting(self._topo, self._params, self._split, 1, 1e-6)
        self._W[:] = 0.0

    def _penalty(self, x: np.ndarray, t: float) -> tuple[float, int, float]:
        """Penalty energy (J), vertices in contact and deepest penetration (m) at positions x, time t."""
        e, count, depth = 0.0, 0, 0.0
        for c in self._colliders:
            d = c.distance(x, t)
            pen = np.minimum(d, 0.0)
            e += 0.5 * self._kc * float(pen @ pen)
            inside = d < 0
            count += int(np.count_nonzero(inside))
            if np.any(inside):
                depth = max(depth, float(-d.min()))
        return e, count, depth

    def _elastic_energy(self, x: np.ndarray) -> tuple[float, float]:
        """Elastic energy (J) and min det F at positions x."""
        r = self._K.elastic_energy(self._as_real(x), self._topo, self._grad, self._params)
        return float(r[0]), float(r[1])

    def elastic_forces(self, positions: np.ndarray) -> np.ndarray:
        """-dE/dx (n, 3) in N of the elastic energy ADMM integrates (for tests and diagnostics)."""
        f = np.zeros((self.n, 3), dtype=self._np_real)
        self._K.elastic_forces(self._as_real(positions), self._topo, self._grad, self._params, f)
        return f.astype(np.float64)

    def potential_energy(self, positions: np.ndarray, t: float | None = None) -> float:
        """Elastic + gravity + contact penalty energy in J at ``positions`` (n, 3)."""
        x = np.asarray(positions, dtype=np.float64)
        e, _ = self._elastic_energy(x)
        e -= float(self._mass @ (x @ self.model.gravity))
        e += self._penalty(x, self._last_time if t is None else t)[0]
        return e

    # ----------------------------------------------------------- diagnostics
    def global_matrix(self, h: float) -> sp.csr_matrix:
        """A = M/h^2 + sum_i rho_i/4 G_i^T G_i (+ mu_v I with contact), the scalar n x n
        matrix of the q-step (notes §2.5a; the 3D matrix is A kron I_3)."""
        return (sp.diags(self._mass / (h * h) + self._contact_mu(h)) + self._rho_factor * self._L0).tocsr()

    def splitting(self) -> dict[str, np.ndarray]:
        """The current per-element splitting: R, S, Y (m, 3, 3) and rho (m,)."""
        sp_ = self._split.to_numpy()
        return {
            "R": sp_[:, 0].copy(),
            "S": sp_[:, 1].copy(),
            "Y": sp_[:, 2].copy(),
            "rho": self._params_np[:, self._K.RHO].copy(),
        }

    def set_splitting(self, R: np.ndarray, S: np.ndarray, Y: np.ndarray) -> None:
        """Overwrite the splitting (m, 3, 3) each (tests)."""
        sp_ = self._split.to_numpy()
        sp_[:, 0], sp_[:, 1], sp_[:, 2] = R, S, Y
        self._split.from_numpy(np.ascontiguousarray(sp_, dtype=self._np_real))

    def q_step(self, positions: np.ndarray, velocities: np.ndarray, h: float) -> np.ndarray:
        """One q-step from the current splitting, without contact or handles:
        solves A q = B (notes §2.5a) for q^k = positions, z = q^k + h v^k; returns q (n, 3)."""
        x0 = np.asarray(positions, dtype=np.float64)
        z = x0 + h * np.asarray(velocities, dtype=np.float64)
        K = self._K
        K.store_deformation_gradients(self._as_real(x0), self._topo, self._grad, self._split)
        rhs = np.ascontiguousarray(
            self._mass[:, None] * z / (h * h) + 0.5 * self._mass[:, None] * self.model.gravity[None, :],
            dtype=self._np_real,
        )
        K.assemble_rhs(rhs, self._topo, self._grad, self._params, self._split)
        return factorize(self.global_matrix(h)).solve(rhs.astype(np.float64))

    # ------------------------------------------------------------------ step
    def step(self, state_in, state_out, dt: float) -> StepStats:
        if not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt > 0):
            raise ValueError(f"ADMM step: the time step must be a finite number > 0, got {dt!r}")
        x0 = np.asarray(state_in.positions, dtype=np.float64)
        v0 = np.asarray(state_in.velocities, dtype=np.float64)
        if x0.shape != (self.n, 3) or v0.shape != (self.n, 3):
            raise ValueError(
                f"ADMM step: expected positions and velocities of shape ({self.n}, 3), got {x0.shape} and {v0.shape}"
            )
        if not (np.all(np.isfinite(x0)) and np.all(np.isfinite(v0))):
            bad = np.flatnonzero(~(np.isfinite(x0).all(1) & np.isfinite(v0).all(1)))
            raise ValueError(
                f"ADMM step: the input state has NaN/inf positions or velocities ({bad.size} vertices, first {bad[0]})"
            )
        h = float(dt)
        self._retries_now = 0
        st = self._solve(state_in, state_out, h, x0, v0, 0)
        retries = self._retries_now
        counts = self._stalls
        if retries:
            counts["stalled_steps"] += 1
            counts["retries"] += retries
            counts["recovered"] += int(st.converged)
        if not st.converged:
            counts["failed"] += 1
            log.warning(
                "%s step from t=%.6g s to t=%.6g s did not converge after %d retries (last attempt: %s); "
                "the step is flagged as stalled, not accepted as converged. A smaller sim.dt, a larger "
                "max_iterations or retry_halvings may help.",
                self._method(),
                float(state_in.time),
                float(state_in.time) + h,
                retries,
                self._why,
            )
        st.extra.update(
            {
                "admm_stalled": 0.0 if st.converged else 1.0,
                "admm_stalled_total": float(counts["failed"]),  # since reset (kept right under substeps)
                "stall_retries": float(retries),
                "stall_failed": 0.0 if st.converged else 1.0,
            }
        )
        return self._finish(st, state_in, state_out, x0, v0)

    def _method(self) -> str:
        return "energy-momentum" if self._em is not None else "ADMM"

    def _attempt(self, state_in, state_out, h: float, x0: np.ndarray, v0: np.ndarray) -> StepStats:
        if self._em is not None:
            return self._step_energy_momentum(state_in, state_out, h, x0, v0)
        return self._step_admm(state_in, state_out, h, x0, v0)

    def _restart(self) -> None:
        """Forget the warm start: the next attempt re-initialises the splitting from the polar
        decomposition of q^k with rho back at its start (global factor 1, no local raise), or
        (energy-momentum) drops Newton's warm start and chord matrix."""
        self._token = None
        if self._em is not None:
            self._em.forget()
            return
        self._rho_factor = 1.0
        self._level[:] = 0
        self._set_rho0()

    def _solve(self, state_in, state_out, h: float, x0: np.ndarray, v0: np.ndarray, depth: int) -> StepStats:
        """One step with the stall retries (see :class:`ADMMConfig`): the plain attempt; if it
        stalls, a fresh start with more iterations; if that stalls, two half steps (each
        retried the same way, ``retry_halvings`` levels deep). Returns the stats of the attempt
        that wrote ``state_out``, with iterations and timings summed over all attempts."""
        cfg = self.config
        st = self._attempt(state_in, state_out, h, x0, v0)
        if st.converged or not cfg.retry_stalled:
            return st
        used = [st]
        self._note_retry(
            state_in, h, f"restarting from a fresh splitting with {cfg.retry_iteration_factor:g}x the iteration cap"
        )
        self._restart()
        cap, em_cap = self.max_iterations, (self._em.max_iterations if self._em is not None else 0)
        self.max_iterations = int(math.ceil(cap * cfg.retry_iteration_factor))
        if self._em is not None:
            self._em.max_iterations = int(math.ceil(em_cap * cfg.retry_iteration_factor))
        try:
            st = self._attempt(state_in, state_out, h, x0, v0)
        finally:
            self.max_iterations = cap
            if self._em is not None:
                self._em.max_iterations = em_cap
        used.append(st)
        if not st.converged and depth < cfg.retry_halvings:
            self._note_retry(state_in, h, "as two half steps")
            mid = state_in.clone()
            first = self._solve(state_in, mid, 0.5 * h, x0, v0, depth + 1)
            used.append(first)
            if first.converged:
                st = self._solve(mid, state_out, 0.5 * h, mid.positions, mid.velocities, depth + 1)
                used.append(st)
            else:
                # state_out still holds the restarted attempt; the splitting belongs to the half
                # step, so the next step starts afresh
                self._token = None
                state_out.warm["admm"] = None
                st = StepStats(**{**st.__dict__, "converged": False})
        return _combined(st, used)

    def _note_retry(self, state_in, h: float, how: str) -> None:
        self._retries_now += 1
        n = self._stalls["stalled_steps"] + 1
        if self._retries_now == 1 and (n == 1 or n % self.config.warn_every == 0):
            log.warning(
                "%s step from t=%.6g s (h = %.3g s) stalled (%s); retrying it, %s (%d stalled steps "
                "so far; counted in run.json).",
                self._method(),
                float(state_in.time),
                h,
                self._why,
                how,
                n,
            )
        else:
            log.info(
                "%s step from t=%.6g s (h = %.3g s) still unconverged (%s); retrying it, %s.",
                self._method(),
                float(state_in.time),
                h,
                self._why,
                how,
            )

    def _step_admm(self, state_in, state_out, h: float, x0: np.ndarray, v0: np.ndarray) -> StepStats:
        """One midpoint step by ADMM: the splitting (kept from the previous step
        when ``state_in`` is the state this solver produced), the iterations
        (:class:`~tisim.solvers.admm.iteration.StepIterations`), then q^{k+1},
        the midpoint-recursion velocity and the stats."""
        K = self._K
        t0 = float(state_in.time)
        t1 = t0 + h
        if self._token is None or state_in.warm.get("admm") != self._token:
            self._init_splitting(x0)
        K.store_deformation_gradients(self._as_real(x0), self._topo, self._grad, self._split)
        run = StepIterations(self, h, x0, v0, t0)
        run.run()
        if not run.converged:
            self._why = run.why()

        # q^{k+1}, the midpoint-recursion velocity
        q = run.q
        v1 = midpoint_velocity(q, x0, v0, h)
        if len(run.held):
            v1[run.held] = run.held_v
        if self._damping > 0:
            v1 /= 1.0 + self._damping * h
        np.copyto(state_out.positions, q)
        np.copyto(state_out.velocities, v1)
        state_out.time = t1
        self._last_time = t1
        if run.nonfinite:  # the splitting is unusable: the next step starts afresh
            self._token = None
        else:
            self._counter += 1
            self._token = self._counter
        state_out.warm["admm"] = self._token

        e_el, min_det = self._elastic_energy(q)
        e_pen, n_contacts, depth = self._penalty(q, t1)
        potential = e_el - float(self._mass @ (q @ self.model.gravity)) + e_pen
        return StepStats(
            iterations=run.it,
            residual=run.rp,
            converged=run.converged,
            potential=potential,
            n_contacts=n_contacts,
            max_penetration=depth if self._colliders else math.nan,
            timings=run.timings,
            extra={
                "primal_residual": run.rp,
                "dual_residual": run.rd,
                "stress_residual": run.rs,
                "prox_failures": float(run.prox_failures),
                "rho_scale": self.rho_scale * self._rho_factor,
                "rho_local_max": float(2 ** int(self._level.max())) if self.m else 1.0,
                "min_det_mid": run.min_det_mid,
                "min_det": min_det,
            },
        )

    def _step_energy_momentum(self, state_in, state_out, h: float, x0: np.ndarray, v0: np.ndarray) -> StepStats:
        """One discrete-gradient step (``integrator = "energy-momentum"``) by chord Newton."""
        t0 = float(state_in.time)
        t1 = t0 + h
        if self._token is None or state_in.warm.get("admm") != self._token:
            self._em.forget()
        held, held_x, held_v = self.held_vertices(t1)
        ts = time.perf_counter()
        res = self._em.solve(x0, v0, h, t0, held, held_x)
        solve_ms = 1e3 * (time.perf_counter() - ts)
        q = res.positions
        if not res.converged:
            self._why = (
                f"{res.iterations} Newton iterations: last correction {res.residual:.3g} "
                f"(tolerance {self.config.newton_tolerance:.3g})"
            )
        v1 = midpoint_velocity(q, x0, v0, h)
        if len(held):
            v1[held] = held_v
        if self._damping > 0:
            v1 /= 1.0 + self._damping * h
        np.copyto(state_out.positions, q)
        np.copyto(state_out.velocities, v1)
        state_out.time = t1
        self._last_time = t1
        self._counter += 1
        self._token = self._counter
        state_out.warm["admm"] = self._token
        e_el, min_det = self._elastic_energy(q)
        e_pen, n_contacts, depth = self._penalty(q, t1)
        return StepStats(
            iterations=res.iterations,
            residual=res.residual,
            converged=res.converged,
            potential=e_el - float(self._mass @ (q @ self.model.gravity)) + e_pen,
            n_contacts=n_contacts,
            max_penetration=depth if self._colliders else math.nan,
            timings={"newton": solve_ms},
            extra={
                "factorizations": float(res.factorizations),
                "min_det": min_det,
            },
        )

    def _finish(self, st: StepStats, state_in, state_out, x0: np.ndarray, v0: np.ndarray) -> StepStats:
        """Adds ``energy_drift`` (relative change of the total energy since the reference) to the
        stats and warns once when it passes ``drift_warning``. The reference is the energy of
        the first state stepped from (after a reset, and again after any step with handles,
        damping or moving contact, which change the energy legitimately)."""
        cfg = self.config
        held = self.held_vertices(float(state_out.time))[0]
        kin1 = 0.5 * float(self._mass @ np.einsum("ij,ij->i", state_out.velocities, state_out.velocities))
        e1 = kin1 + st.potential
        closed = len(held) == 0 and self._damping == 0 and not any(c.is_moving() for c in self._colliders)
        if not closed:
            self._energy_ref = None
            st.extra["energy_drift"] = math.nan
            return st
        if self._energy_ref is None:
            kin0 = 0.5 * float(self._mass @ np.einsum("ij,ij->i", v0, v0))
            self._energy_ref = kin0 + self.potential_energy(x0, float(state_in.time))
            self._energy_t0 = float(state_in.time)
            # relative to the energy, or to the kinetic energy when the energy is near zero
            self._energy_scale = max(abs(self._energy_ref), kin0, 1e-300)
        drift = (e1 - self._energy_ref) / self._energy_scale if math.isfinite(e1) else math.inf
        st.extra["energy_drift"] = drift
        if cfg.drift_warning > 0 and not self._drift_warned and not abs(drift) <= cfg.drift_warning:
            self._drift_warned = True
            log.warning(
                "%s: the total energy has drifted by %+.3g%% (%.6g J -> %.6g J) between t=%.4g s and t=%.4g s "
                "(warning threshold %.3g%%). %s",
                "energy-momentum step" if self._em is not None else "ADMM midpoint rule",
                100 * drift if math.isfinite(drift) else math.inf,
                self._energy_ref,
                e1,
                self._energy_t0,
                float(state_out.time),
                100 * cfg.drift_warning,
                "Check the Newton tolerance."
                if self._em is not None
                else "The midpoint rule's energy error is O(h^2) but can grow without bound on stiff nonlinear "
                "runs (Simo-Tarnow): use a smaller sim.dt or solver.integrator = \"energy-momentum\".",
            )
        return st

    def _contact_prox(self, q: np.ndarray, W: np.ndarray, mu: np.ndarray, x0: np.ndarray, tmid: float) -> np.ndarray:
        """q' = argmin g((x0 + q')/2) + mu/2 ||q + W/mu - q'||^2 per vertex (notes §2.7).

        In the midpoint x = (x0 + q')/2 this is argmin k/2 max(0, -d(x))^2 + 2 mu ||x - x_y||^2,
        x_y = (x0 + y)/2, y = q + W/mu: x = x_y - k d(x_y) / (k + 4 mu) n(x_y) where d(x_y) < 0.
        Colliders are applied one after the other.
        """
        y = q + W / mu[:, None]
        xm = 0.5 * (x0 + y)
        k = self._kc
        for c in self._colliders:
            d, nrm = c.signed_distance(xm, tmid)
            pen = d < 0
            if np.any(pen):
                tau = -k * d[pen] / (k + 4.0 * mu[pen])
                xm[pen] += tau[:, None] * nrm[pen]
        return 2.0 * xm - x0

    # ------------------------------------------------------------- interface
    def reset(self, state) -> None:
        state.warm.clear()
        self._token = None
        self._W[:] = 0.0
        self._stalls = _new_stall_counts()
        self._energy_ref = None
        self._drift_warned = False
        if self._em is not None:
            self._em.forget()

    def notify_model_changed(self, what: str) -> None:
        """ "stiffness"/"material": recompute mu, lam, rho and refactor; "dt", "handles",
        anything else: refactor at the next step."""
        if what in ("stiffness", "material", "materials", "all"):
            self._set_materials()
        self._fact = None

    def tunables(self) -> list[Tunable]:
        return [
            Tunable("tolerance", self.tolerance, 1e-10, 1e-2, log=True),
            Tunable("rho_scale", self.rho_scale, 1e-2, 1e3, log=True),
            Tunable("max_iterations", float(self.max_iterations), 1, 10000, log=True),
            # the energy-momentum integrator keeps its own copy of the materials: no slider there
        ] + (
            [Tunable("stiffness", getattr(self, "_stiffness_scale", 1.0), 0.01, 100.0, log=True)]
            if self._em is None
            else []
        )

    def set_tunable(self, name: str, value: float) -> None:
        if name == "tolerance":
            self.tolerance = float(value)
            self.dual_tolerance = float(value)
        elif name == "rho_scale":
            self.rho_scale = float(value)
            self._set_rho0()
        elif name == "max_iterations":
            self.max_iterations = max(1, int(round(value)))
        elif name == "stiffness" and self._em is None:
            value = float(value)
            if not value > 0:
                raise ValueError(f"stiffness must be > 0, got {value}")
            self._stiffness_scale = value
            self.notify_model_changed("stiffness")
        else:
            raise KeyError(name)

    def info(self) -> dict:
        """Parameters for run.json: the notes' kappa/lambda per object, penalties, factorization."""
        model = self.model
        objects = {}
        for i, name in enumerate(model.object_names):
            sl = model.object_tet_slices[i]
            if sl.stop == sl.start:
                continue
            mat = model.material_of(i)
            mu = float(model.element_mu[sl.start])
            lam = float(model.element_lam[sl.start])
            kappa = 2.0 * mu if mat in ("arap", "corotated") else mu
            objects[name] = {
                "material": mat,
                "kappa": kappa,
                "lambda": lam if mat in ("neo-hookean", "corotated") else 0.0,
            }
        return {
            "solver": "admm",
            "integrator": self.config.integrator,
            "objects": objects,
            "tolerance": self.tolerance,
            "dual_tolerance": self.dual_tolerance,
            "max_iterations": self.max_iterations,
            "rho_scale": self.rho_scale * self._rho_factor,
            "contact_stiffness": self._kc if self._colliders else None,
            "factorization": None if self._fact is None else self._fact.factor.backend,
            "retry_iteration_factor": self.config.retry_iteration_factor,
            "retry_halvings": self.config.retry_halvings,
            "stalls": dict(self._stalls),
        }


def _combined(last: StepStats, attempts: list[StepStats]) -> StepStats:
    """The stats of ``last`` (the attempt whose result is in state_out) with iterations and
    timings summed over ``attempts`` (a list that contains it) and the prox failures summed."""
    out = StepStats(**{**last.__dict__, "timings": dict(last.timings), "extra": dict(last.extra)})
    out.iterations = sum(a.iterations for a in attempts)
    out.timings = {}
    for a in attempts:
        for k, v in a.timings.items():
            out.timings[k] = out.timings.get(k, 0.0) + v
    if "prox_failures" in last.extra:
        out.extra["prox_failures"] = float(sum(a.extra.get("prox_failures", 0.0) for a in attempts))
    return out
