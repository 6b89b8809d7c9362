"""Real-time local-global (projective dynamics) solver with a sparse-inverse global step."""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import scipy.sparse as sp

from tisim.geometry.precompute import deformation_gradients, gradient_operator
from tisim.scene import MATERIALS
from tisim.solvers.base import Solver, StepStats, Tunable
from tisim.solvers.pd.config import PDConfig

log = logging.getLogger(__name__)

_ROTATION_MATERIALS = ("arap", "corotated")
# materials on which acceleration = "auto" uses Anderson acceleration (see _choose_acceleration)
_ANDERSON_MATERIALS = ("neo-hookean",)
_ENERGY_ROTATION_ITERATIONS = 1  # warm-started from the last local step; energy error ~ (rotation error)^2


# Materials whose local step pulls an inverted element back (det F <= 0 -> > 0): ARAP and
# corotated project onto the polar rotation with det R = +1 (never a reflection), and the
# stable neo-Hookean's target F - (V/w) P(F) is finite there with P pushing J towards 1.
# The log-barrier materials (symmetric-Dirichlet, symmetric-gradient) are infinite at J <= 0.
# tests/unit/test_pd_inversion.py inverts a tet and checks each material.
RECOVERS_INVERSION = frozenset({"arap", "corotated", "neo-hookean"})


class SolverPD(Solver):
    """Backward Euler by local-global iterations with a constant global matrix (notes §2-3).

    Each step minimises the incremental potential
        E(q) = (1 + c h) / (2 h^2) ||q - x_tilde||_M^2 + sum_i V_i psi_i(F_i(q)),
        x_tilde = q_n + h (v_n + h g) / (1 + c h),
    (c = ``sim.damping``, mass-proportional damping integrated implicitly: the
    exact backward-Euler step of M dv/dt = f - c M v) over the free vertices;
    held vertices follow their handles. One iteration is

    * local step (Taichi, parallel over tets): per element a weighted target
      T_e = sum w p. ARAP: p = R(F), the polar rotation (exact minimiser of
      ||F - R||^2 over SO(3)) by a warm-started iterative extraction
      (``tisim.materials.ti_funcs.polar_rotation_quat``, ``rotation_iterations``
      per local step, warm-started from the previous iteration/frame), weight
      2 mu V. Corotated: the ARAP term plus its volume term lam/2 (J-1)^2 as a
      quasi-Newton target. Neo-Hookean (stable NH) and the other hyperelastic
      materials: quasi-Newton target p = F - (V/w) P(F) (notes §2.2), so that
      w G^T (p - G q) = -grad(V psi) exactly and the global step is a
      quasi-Newton step with A standing in for the Hessian; the converged
      solution is the exact backward-Euler step of the material's own energy.
      Optional PD volume-preservation constraint (``volume_stiffness`` > 0):
      w/2 ||F - Proj_{det=1}(F)||^2, w = volume_stiffness V.
    * residual r = b - A q (notes' scaling, kg m), a gather over each vertex's
      incident tets (CSR incidence lists, no atomics, deterministic).
    * global step q_f += A_ff^-1 r_f with A = M (1 + c h) + h^2 sum w G^T G,
      factored once (see :mod:`tisim.solvers.pd.global_step`): "sparse-inverse",
      "cholesky", "jacobi" (Jacobi-Chebyshev) or "auto" (times the two exact ones
      at start-up and keeps the faster).

    Quasi-Newton weights: the global matrix must dominate half the element
    Hessian for the iteration to contract (the spectrum of A^-1 H must lie in
    (0, 2)). Stable NH's rest Hessian has eigenvalues mu (shear) and 4 mu + 3 lam
    (volume), so w = (3 mu + 2 lam) V keeps (4 mu + 3 lam) / (3 mu + 2 lam) < 1.5
    for every Poisson ratio; for corotated the volume term's 3 lam needs
    w_vol = 2 lam V on top of ARAP's 2 mu V. ``weight_scale`` multiplies these.

    Residual (StepStats.residual): ||g|| / (||g_0|| + eps), g = r / h^2 = -grad E (N)
    on the free vertices (with contact, -grad E + H^T lambda: the momentum
    residual), evaluated after each local step (so it is exact for every
    material and free: it is the right-hand side of the global step); g_0 at
    the step's initial guess (x_tilde with held vertices at their
    targets). With a fixed iteration count the reported value is that of the
    last iterate the local step saw (the input of the final global step); with
    ``tolerance`` > 0 the loop stops as soon as it drops below, and the value
    belongs to the returned positions. eps = 1e-12 ||M' x_tilde|| / h^2 is the
    round-off level of the right-hand side, so that a body at rest reports ~0
    rather than round-off divided by round-off. extra["residual_abs"] = ||g|| in N.

    Mouse drag (``set_drag``): an implicit spring of stiffness
    ``handle_stiffness`` (N/m) between the vertex and the target, i.e. the
    system matrix A + h^2 k e_v e_v^T, solved without refactoring by a
    Sherman-Morrison rank-one correction with the column A_ff^-1 e_v (computed
    once per grabbed vertex); the Jacobi back-end adds h^2 k to its diagonal.

    Handles: the held set is evaluated at t + h; when it changes (a release) the
    system is refactored. Held vertices' velocities are (target - q_n) / h.

    Acceleration (``acceleration = "anderson"``, or ``"auto"``, the default: Anderson for
    Neo-Hookean bodies without contact on the CPU, see :meth:`_choose_acceleration`;
    window ``anderson_window``): Anderson
    acceleration of the fixed-point map q -> q + A_ff^-1 r(q) with an energy safeguard
    (see :class:`tisim.solvers.pd.anderson.AndersonSafeguard`): the incremental potential is evaluated in the local step's
    launch, an extrapolation that raises it is replaced by the plain step. Used only with
    an exact global step and in steps without contact. On a small Neo-Hookean twisting
    bar (81 vertices, E = 1e6, nu = 0.4) a step needs 75 iterations where the plain
    iteration needs 983 to reach a relative residual of 1e-8; see benchmarks/twist_accuracy.py
    and studies/convergence_pd.py for the 5k-vertex bar.

    Contact: when the model has colliders or several objects and
    ``scene.contact.enabled``, :class:`tisim.contact.ncp.pd_contact.PDContact` adds
    h^2 H^T lambda to the right-hand side and runs one Newton step per iteration
    (notes §3; a numpy round trip per iteration).

    References:
        Notes "Fast But Accurate: A Real-Time Hyperelastic Simulator with Robust
        Frictional Contact" (shared/papers/pd-sparse-inverse-contact.md), §2.2-2.4, §3.
        S. Bouaziz, S. Martin, T. Liu, L. Kavan, M. Pauly. Projective Dynamics. SIGGRAPH 2014.
        H. Wang. A Chebyshev Semi-Iterative Approach for Accelerating Projective and
        Position-based Dynamics. SIGGRAPH Asia 2015.
        T. Liu, S. Bouaziz, L. Kavan. Quasi-Newton Methods for Real-Time Simulation of
        Hyperelastic Materials. ACM TOG 2017.
        Y. Peng, B. Deng, J. Zhang, F. Geng, W. Qin, L. Liu. Anderson Acceleration for
        Geometry Optimization and Physics Simulation. SIGGRAPH 2018.

    Limitations: the plain iteration has no line search, so the quasi-Newton
    materials are not guaranteed to decrease the energy every iteration (ARAP is:
    local and global steps each minimise it; with Anderson acceleration the safeguard
    backtracks a plain step that raises it); Anderson acceleration is off in steps
    with contact and with the Jacobi global step; barrier materials (symmetric-Dirichlet,
    symmetric-gradient) give NaN once a tet inverts; the global matrix is
    constant, so stiffness or dt changes refactor (about 0.1 s for 5k vertices,
    seconds for 20k with the sparse inverse); rotations are warm-started in the
    solver, not in State.warm (``reset`` forgets them).
    """

    name = "pd"

    def __init__(self, model, config: PDConfig | None = None):
        from tisim import backend
        from tisim.solvers.pd.kernels import PDKernels

        config = config if config is not None else PDConfig()
        super().__init__(model, config)
        backend.current()  # Taichi must be up (initialises the default backend otherwise)
        self._h = float(model.dt)
        self._dt_override: float | None = None  # the viewer's dt tunable, once set
        self._iterations = int(config.iterations)
        self._stiffness = 1.0
        self._damping = float(model.scene.sim.damping)
        self.iteration_callback = None  # f(k, positions (n, 3)) after each global step
        # plain iterations between reads of the residual norm: 1 (every iteration) on the
        # CPU backend, where a read costs nothing; see step()
        self.residual_interval = 1 if backend.current().arch == "cpu" else 8
        n = model.vertex_count
        self.vertex_count = n
        t0 = time.perf_counter()
        self.kernels = PDKernels(
            model.mesh.tets,
            model.rest.Dm_inv,
            model.rest.volume,
            model.element_material,
            n,
            volume_constraint=config.volume_stiffness > 0,
        )
        self._G = gradient_operator(model.mesh.tets, model.rest.grad, n).tocsr()
        self._x_tilde = np.zeros((n, 3))
        self._x0 = np.zeros((n, 3))
        self._xout = np.zeros((n, 3))
        self._held_key: bytes | None = None
        self._held_idx = np.zeros(0, dtype=np.int64)
        self._drag_column = None  # (vertex, system version, column A_ff^-1 e_v, its entry at v)
        self._auto_choice: str | None = None  # what "auto" picked at start-up, kept on refactoring
        self._auto_info: dict = {}
        self._version = 0
        self._global = None
        self._anderson = None
        held, _ = self._held_targets(0.0 + self._h)
        self._held_idx = held
        self._held_key = held.tobytes()
        self._build_system()
        self._acceleration, self._acceleration_reason = self._choose_acceleration()
        if self._acceleration == "anderson":
            from tisim.solvers.pd.anderson import AndersonSafeguard

            self._anderson = AndersonSafeguard(config.anderson_window, n)
        self._setup_seconds = time.perf_counter() - t0

        self.contact = None
        scene = model.scene
        if self._has_contact():
            from tisim.contact.ncp.pd_contact import PDContact

            self.contact = PDContact(
                model,
                scene.contact,
                _GlobalStepProxy(self),
                newton_iterations=scene.contact.newton_iterations,
                friction_jacobian=scene.contact.friction_jacobian,
            )
            if self.contact.implementation == "device":
                self._compile_contact_iteration()

    def _compile_contact_iteration(self) -> None:
        """Translate and compile the local step's contact-force variant now, not in the
        first frame with contact (about 0.2 s there even from Taichi's offline cache): one
        iteration on the rest shape; everything it writes is rewritten by step(), and the
        rotations it warm-starts are reset."""
        k = self.kernels
        x = self.model.initial_positions
        k.write_x(x)
        k.write_x_tilde(x)
        gidx, gout = self._global.gather_target(k)
        k.iterate(1, self._A_dev, self._h**2, -1, 0.0, [0.0, 0.0, 0.0], gidx, gout, k.kept, 0.0)
        k.reset_rotations()

    # ------------------------------------------------------------------ system
    def _choose_acceleration(self) -> tuple[str, str]:
        """("anderson" or "none", why). "auto" picks Anderson where it was measured to pay
        and its safeguard is sound: every element of a quasi-Newton Neo-Hookean material
        (the plain map contracts slowly along shear there; ARAP's plain iteration already
        decreases its energy monotonically, corotated is not measured, and the barrier
        materials' energy is infinite once a tet inverts, which the safeguard cannot
        compare), no contact in the scene (steps with contact run the plain iteration
        anyway, and mixing the two in one run makes its cost per step uneven), an exact
        global step (Jacobi-Chebyshev keeps its own history in x) and the CPU backend in
        f64 (the only one it was timed on; the f32 Tikhonov regularisation is untested at
        this size)."""
        from tisim import backend

        requested = self.config.acceleration
        if requested != "auto":
            return requested, "requested"
        mats = np.unique(np.asarray(self.model.element_material))
        quasi_newton = {MATERIALS.index(k) for k in _ANDERSON_MATERIALS}
        info = backend.current()
        if not set(mats.tolist()) <= quasi_newton:
            return "none", "auto: a material other than " + " / ".join(_ANDERSON_MATERIALS)
        if self._has_contact():
            return "none", "auto: contact"
        if not self._global.exact():
            return "none", "auto: inexact global step (jacobi)"
        if info.arch != "cpu" or info.precision != "f64":
            return "none", f"auto: not timed on {info.arch} {info.precision}"
        return "anderson", "auto: Neo-Hookean, no contact, exact global step, CPU f64"

    def _has_contact(self) -> bool:
        """Whether the scene has contacts to solve (colliders, or objects that meet)."""
        m = self.model
        return (len(m.colliders) > 0 or len(m.object_names) > 1) and m.scene.contact.enabled

    @property
    def global_step(self):
        """The current global-step object (replaced when the system is refactored)."""
        return self._global

    def _element_parameters(self):
        s = self._stiffness
        mu = self.model.element_mu * s
        lam = self.model.element_lam * s
        V = self.model.rest.volume
        mat = self.model.element_material
        rot = np.isin(mat, [MATERIALS.index(k) for k in _ROTATION_MATERIALS])
        corot = mat == MATERIALS.index("corotated")
        ws = self.config.weight_scale
        w_rot = np.where(rot, 2.0 * mu * V, 0.0)
        w_qn = np.where(corot, ws * 2.0 * lam * V, np.where(rot, 0.0, ws * (3.0 * mu + 2.0 * lam) * V))
        w_vol = np.full_like(V, self.config.volume_stiffness * s) * V
        return mu, lam, w_rot, w_qn, w_vol

    def _build_system(self) -> None:
        """Assemble A (notes' scaling) for the current h, stiffness and held set; factor it."""
        from tisim.linalg.cholesky import FactorizationError
        from tisim.linalg.spmv import DeviceCSR
        from tisim.solvers.pd.global_step import build_global_step

        k = self.kernels
        mu, lam, w_rot, w_qn, w_vol = self._element_parameters()
        k.set_element_parameters(mu, lam, w_rot, w_qn, w_vol)
        h = self._h
        mass_c = self.model.mass * (1.0 + self._damping * h)
        k.set_masses(mass_c, self.model.mass)
        w = w_rot + w_qn + w_vol
        W = sp.diags(np.repeat(w, 3))
        A = (sp.diags(mass_c) + (h * h) * (self._G.T @ W @ self._G)).tocsr()
        A.sort_indices()
        self.A = A
        self._A_dev = DeviceCSR(A)
        free = np.ones(self.vertex_count, dtype=bool)
        free[self._held_idx] = False
        if self.config.global_step == "jacobi" and np.any(mass_c[free] <= 0):
            v = int(np.flatnonzero(free & (mass_c <= 0))[0])
            raise FactorizationError(
                f"vertex {v} has no mass: the jacobi global step needs positive masses "
                "(the system would be singular or not diagonally dominant)"
            )
        k.set_free(free)
        t0 = time.perf_counter()
        self._global = None  # release the old S before building the new one
        kind = self.config.global_step
        if kind == "auto" and self._auto_choice is not None:
            kind = self._auto_choice  # do not re-time on every refactoring (handle release, dt, stiffness)
        self._global = build_global_step(
            kind, A, self._held_idx, self.config, k, keep_sparse_inverse=self._has_contact()
        )
        if self.config.global_step == "auto" and self._auto_choice is None:
            self._auto_choice = self._global.name
            gi = self._global.info()
            self._auto_info = {
                k: gi[k] for k in ("auto_ms_per_solve", "auto_sparse_inverse_not_kept", "fallback") if k in gi
            }
        self._build_seconds = time.perf_counter() - t0
        self._version += 1
        self._drag_column = None
        if self._anderson is not None:  # its history belongs to the old system
            self._anderson.clear()
        log.info(
            "pd: system built (%s, n_free = %d) in %.3f s",
            self._global.name,
            self._global.n_free,
            self._build_seconds,
        )

    def _held_targets(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        idx, targets = self.model.handle_targets(t)
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 3))
        u, first = np.unique(idx, return_index=True)  # a vertex in two handles: the first wins
        return u, np.asarray(targets)[first]

    def notify_model_changed(self, what: str) -> None:
        """Refactor after a change of "dt", "stiffness", "handles" (or anything else)."""
        self._build_system()

    # ------------------------------------------------------------------ stepping
    def inversion_is_divergence(self) -> bool:
        """An inverted tet is a passing state, not a divergence, when every material's
        local step recovers it (RECOVERS_INVERSION); the runner still stops on
        non-finite values, an infinite energy and a run of unconverged steps."""
        return not self.model.materials_used <= RECOVERS_INVERSION

    def step(self, state_in, state_out, dt: float) -> StepStats:
        """Advance by dt seconds (by the "dt" tunable instead, once the viewer set it).

        Stats: iterations, residual (see the class docstring), converged, potential
        (elastic + gravity at the new positions, J), timings in ms ("local": local
        step + residual assembly, "global", "contact", "energy", "total"), extra
        ("residual_abs" in N, "refactored"), n_contacts / max_penetration with contact.
        """
        import taichi as ti

        from tisim.solvers.pd.iteration import StepIterations

        k = self.kernels
        h = float(dt) if self._dt_override is None else self._dt_override
        t_start = time.perf_counter()
        t1 = state_in.time + h
        rebuilt, held, targets = self._refactor_if_changed(h, t1)
        q_n = np.asarray(state_in.positions, dtype=np.float64)
        v_n = np.asarray(state_in.velocities, dtype=np.float64)
        self._predict(q_n, v_n, h, held, targets)
        gs = self._global
        drag = self._drag_setup()
        drag_v = drag[0]
        if hasattr(gs, "drag_vertex"):  # Jacobi: the spring goes on its diagonal
            gs.drag_vertex = drag_v
            gs.drag_add = h * h * self.config.handle_stiffness if drag_v >= 0 else 0.0
        gs.begin_step(k)
        t_contact = 0.0
        if self.contact is not None:
            tc = time.perf_counter()
            self.contact.begin_step(q_n, v_n, self._x_tilde, state_in.time, h)
            t_contact += time.perf_counter() - tc
        accel = self._anderson if self._accelerated_step(gs) else None
        if accel is None and self._anderson is not None:
            self._anderson.clear()
        if accel is not None:
            accel.begin()
        loop = StepIterations(self, gs, h, drag, accel)
        loop.t_contact = t_contact
        loop.run()
        k.read_x(self._xout)
        ti.sync()
        np.copyto(state_out.positions, self._xout)
        np.subtract(self._xout, q_n, out=state_out.velocities)
        state_out.velocities /= h
        state_out.time = t1
        return self._step_stats(loop, accel, rebuilt, t_start)

    def _refactor_if_changed(self, h: float, t1: float) -> tuple[bool, np.ndarray, np.ndarray]:
        """Refactor the global step when dt or the held vertices changed; set the held
        vertices' targets at t1. Returns (whether it refactored, held vertices, targets)."""
        held, targets = self._held_targets(t1)
        key = held.tobytes()
        rebuilt = False
        if h != self._h or key != self._held_key:
            why = "dt" if h != self._h else "held vertices"
            self._h = h
            self._held_idx, self._held_key = held, key
            log.info("pd: %s changed, refactoring", why)
            self._build_system()
            rebuilt = True
        self._global.set_held_positions(targets)
        return rebuilt, held, targets

    def _predict(self, q_n: np.ndarray, v_n: np.ndarray, h: float, held, targets) -> None:
        """x_tilde = q_n + h / (1 + c h) (v_n + h (g + a_grab)), the inertial target, and the
        first iterate x_0 (x_tilde with the held vertices at their targets), on the device."""
        c = self._damping
        g = np.asarray(self.model.gravity, dtype=np.float64)
        xt = self._x_tilde
        np.add(v_n, h * g, out=xt)
        a_grab = self.grab_acceleration(self.model.mass)
        if a_grab is not None:  # the live window's grab: an external force beside gravity
            xt += h * a_grab
        xt *= h / (1.0 + c * h)
        xt += q_n
        np.copyto(self._x0, self._x_tilde)
        if held.size:
            self._x0[held] = targets
        self.kernels.write_x_tilde(self._x_tilde)
        self.kernels.write_x(self._x0)

    def _step_stats(self, loop, accel, rebuilt: bool, t_start: float) -> StepStats:
        """The step's statistics (see :meth:`step`); evaluates the potential energy."""
        stats = StepStats()
        stats.iterations = loop.done
        stats.residual = float(loop.res)
        stats.converged = loop.converged
        tp = time.perf_counter()
        stats.potential = float(self.kernels.potential_energy(_ENERGY_ROTATION_ITERATIONS, self.model.gravity))
        stats.timings = {
            "local": 1e3 * loop.t_local,
            "global": 1e3 * loop.t_global,
            "contact": 1e3 * loop.t_contact,
            "energy": 1e3 * (time.perf_counter() - tp),
            "total": 1e3 * (time.perf_counter() - t_start),
        }
        stats.extra = {
            "residual_abs": float(loop.res * (loop.res0 + loop.floor)) if not math.isnan(loop.res0) else math.nan,
            "refactored": 1.0 if rebuilt else 0.0,
        }
        if self._anderson is not None:  # same columns every step (stats.csv); its device
            # work runs in the local step's launch (timings["local"])
            for key_ in ("extrapolated", "rejected", "backtracks"):
                stats.extra["anderson_" + key_] = float(getattr(accel, key_) if accel is not None else 0)
        if self.contact is not None:
            cs = self.contact.stats()
            stats.n_contacts = int(cs.get("n_contacts", 0))
            stats.max_penetration = float(cs.get("max_penetration", math.nan))
            for key_ in ("n_touching", "ncp_residual", "cr_iterations"):
                if key_ in cs:
                    stats.extra[key_] = float(cs[key_])
            for key_ in ("ms_detect", "ms_delassus", "ms_cr"):
                if key_ in cs:
                    stats.timings["contact_" + key_[3:]] = float(cs[key_])
        return stats

    def _accelerated_step(self, gs) -> bool:
        """Anderson acceleration this step: configured, an exact global step (Jacobi-Chebyshev
        keeps its own history in x), and no contact this step (the contact update moves the
        iterate and its forces are not in the energy the safeguard compares)."""
        if self._anderson is None or not gs.exact():
            return False
        return self.contact is None or not self.contact.active

    def _solve(self, gs, drag_v: int, coef: float, column, exact: bool, gathered: bool = False) -> None:
        """x_f += (A + h^2 k e e^T)_ff^-1 r_f (the drag spring by Sherman-Morrison when exact)."""
        k = self.kernels
        sm = column is not None and drag_v >= 0
        if sm:
            k.save_vertex(drag_v)
        if exact:
            gs.apply_exact(k, gathered=gathered)
        else:
            gs.apply(k, gathered=gathered)
        if sm:
            k.rank_one_correction(column, drag_v, coef)

    def _drag_setup(self):
        """(vertex or -1, target (3,), Sherman-Morrison coefficient, column or None)."""
        if self._drag is None:
            return -1, [0.0, 0.0, 0.0], 0.0, None
        v, target = self._drag
        gs = self._global
        if not (0 <= v < self.vertex_count) or not gs.is_free(v):
            return -1, [0.0, 0.0, 0.0], 0.0, None
        kh2 = self.config.handle_stiffness * self._h**2
        col = None
        coef = 0.0
        if gs.exact():
            if self._drag_column is None or self._drag_column[:2] != (v, self._version):
                from tisim import backend
                from tisim.linalg.spmv import device_array

                c = np.ascontiguousarray(gs.column(v), dtype=backend.np_real())
                self._drag_column = (v, self._version, device_array(c), float(c[v]))
            col = self._drag_column[2]
            coef = kh2 / (1.0 + kh2 * self._drag_column[3])
        return v, [float(t) for t in target], coef, col

    def reset(self, state) -> None:
        """Forget warm starts: rotations (identity), contact forces."""
        super().reset(state)
        self.kernels.reset_rotations()
        if self._anderson is not None:
            self._anderson.clear()
        if self.contact is not None and hasattr(self.contact, "reset"):
            self.contact.reset()

    # ------------------------------------------------------------------ energies (numpy)
    def _psi_host(self, F: np.ndarray) -> np.ndarray:
        from tisim.materials import energy_density

        mu, lam, _, _, w_vol = self._element_parameters()
        mat = self.model.element_material
        psi = np.zeros(len(F))
        for i in np.unique(mat):
            sel = mat == i
            psi[sel] = energy_density(MATERIALS[int(i)], F[sel], mu[sel], lam[sel])
        E = self.model.rest.volume * psi
        if self.config.volume_stiffness > 0:
            D = F - _project_unit_determinant(F)
            E = E + 0.5 * w_vol * np.einsum("mij,mij->m", D, D)
        return E

    def elastic_energy(self, positions: np.ndarray) -> float:
        """sum_i V_i psi_i(F_i) (+ the volume constraint's energy), J."""
        F = deformation_gradients(np.asarray(positions, dtype=np.float64), self.model.mesh.tets, self.model.rest.Dm_inv)
        return float(self._psi_host(F).sum())

    def potential_energy(self, positions: np.ndarray) -> float:
        """Elastic + gravitational potential energy in J (gravity: -sum m g.x)."""
        x = np.asarray(positions, dtype=np.float64)
        return self.elastic_energy(x) - float(self.model.mass @ (x @ self.model.gravity))

    def incremental_potential(self, positions: np.ndarray) -> float:
        """E(q) of the last step (J, up to a constant): (1 + c h)/(2 h^2) ||q - x_tilde||_M^2
        + elastic energy (+ drag spring k/2 |q_v - target|^2)."""
        x = np.asarray(positions, dtype=np.float64)
        h = self._h
        d = x - self._x_tilde
        E = 0.5 * (1.0 + self._damping * h) / (h * h) * float(self.model.mass @ np.einsum("ij,ij->i", d, d))
        E += self.elastic_energy(x)
        if self._drag is not None:
            v, t = self._drag
            E += 0.5 * self.config.handle_stiffness * float(np.sum((x[v] - t) ** 2))
        return E

    def incremental_gradient(self, positions: np.ndarray) -> np.ndarray:
        """grad E (n, 3) in N at ``positions`` for the last step, zero on held vertices."""
        from tisim.materials import first_piola

        x = np.asarray(positions, dtype=np.float64)
        h = self._h
        mu, lam, _, _, w_vol = self._element_parameters()
        F = deformation_gradients(x, self.model.mesh.tets, self.model.rest.Dm_inv)
        mat = self.model.element_material
        P = np.zeros_like(F)
        for i in np.unique(mat):
            sel = mat == i
            P[sel] = first_piola(MATERIALS[int(i)], F[sel], mu[sel], lam[sel])
        VP = self.model.rest.volume[:, None, None] * P
        if self.config.volume_stiffness > 0:
            VP = VP + w_vol[:, None, None] * (F - _project_unit_determinant(F))
        # d/dx_a of V psi(F): V P grad_a
        fa = np.einsum("mij,maj->mai", VP, self.model.rest.grad)
        g = np.zeros_like(x)
        np.add.at(g, self.model.mesh.tets.ravel(), fa.reshape(-1, 3))
        g += ((1.0 + self._damping * h) / (h * h)) * self.model.mass[:, None] * (x - self._x_tilde)
        if self._drag is not None:
            v, t = self._drag
            g[v] += self.config.handle_stiffness * (x[v] - t)
        g[self._held_idx] = 0.0
        return g

    # ------------------------------------------------------------------ viewer
    def tunables(self) -> list[Tunable]:
        return [
            Tunable("dt", self._h, 1e-4, 0.05, log=True),
            Tunable("iterations", float(self._iterations), 1, 100),
            Tunable("stiffness", self._stiffness, 0.01, 100.0, log=True),
        ] + ([Tunable("contact.mu", float(self.contact.config.mu), 0.0, 2.0)] if self.contact is not None else [])

    def set_tunable(self, name: str, value: float) -> None:
        """dt (s; refactors now, and step() uses it from then on instead of the dt it is
        passed), iterations, stiffness (scales Young's modulus, i.e. both Lamé parameters;
        refactors), contact.mu (the Coulomb friction of the scene's contacts, from the next
        detection on; colliders with a friction of their own keep it)."""
        if name == "dt":
            value = float(value)
            if not value > 0:
                raise ValueError(f"dt must be > 0, got {value}")
            self._dt_override = value  # from now on step() uses it, whatever dt it is passed
            if value != self._h:
                self._h = value
                self._build_system()
        elif name == "iterations":
            self._iterations = max(1, round(float(value)))
        elif name == "stiffness":
            value = float(value)
            if not value > 0:
                raise ValueError(f"stiffness must be > 0, got {value}")
            if value != self._stiffness:
                self._stiffness = value
                self._build_system()
        elif name == "contact.mu" and self.contact is not None:
            import dataclasses

            value = float(value)
            if not value >= 0:
                raise ValueError(f"contact.mu must be >= 0, got {value}")
            # colliders with their own friction keep it (ContactDetector.friction_of)
            cfg = dataclasses.replace(self.contact.config, mu=value)
            self.contact.config = cfg
            self.contact.detector.config = cfg
        else:
            raise KeyError(name)

    def info(self) -> dict:
        """What run.json records: the global step chosen and its sizes and times."""
        d = dict(self._global.info())
        if self.config.global_step == "auto":
            d["global_step_requested"] = "auto"
            for key, val in self._auto_info.items():
                d.setdefault(key, val)
        d.update(
            solver="pd",
            vertices=int(self.vertex_count),
            tets=int(self.model.element_count),
            iterations=self._iterations,
            dt=self._h,
            stiffness_scale=self._stiffness,
            rotation_iterations=int(self.config.rotation_iterations),
            system_build_seconds=round(self._build_seconds, 4),
            setup_seconds=round(self._setup_seconds, 4),
            contact=self.contact is not None,
            acceleration=self._acceleration,
            acceleration_requested=self.config.acceleration,
            acceleration_reason=self._acceleration_reason,
        )
        if self.contact is not None:
            d["contact_implementation"] = self.contact.implementation
            if self.contact.implementation_warning:
                d["contact_warning"] = self.contact.implementation_warning
        return d


class _GlobalStepProxy:
    """Forwards the host interface to the solver's current global step (which is
    replaced on refactoring), so contact can keep one reference."""

    contact_scaling = "notes"

    def __init__(self, solver: SolverPD):
        self._solver = solver

    def __getattr__(self, name):
        return getattr(self._solver.global_step, name)


def _project_unit_determinant(F: np.ndarray, iterations: int = 10) -> np.ndarray:
    """numpy twin of kernels.project_unit_determinant: closest det = 1 matrix (m, 3, 3)."""
    from tisim.materials import svd_rotation_variant

    U, sig, V = svd_rotation_variant(F)
    s = sig.copy()
    for _ in range(iterations):
        C = s[:, 0] * s[:, 1] * s[:, 2] - 1.0
        g = np.stack([s[:, 1] * s[:, 2], s[:, 0] * s[:, 2], s[:, 0] * s[:, 1]], axis=1)
        gg = np.einsum("ij,ij->i", g, g)
        t = np.where(gg > 0, (np.einsum("ij,ij->i", g, s - sig) - C) / np.where(gg > 0, gg, 1.0), 0.0)
        s = np.where((gg > 0)[:, None], sig + t[:, None] * g, s)
    ok = (np.abs(np.prod(s, axis=1) - 1.0) < 1e-6) & np.all(s > 0, axis=1)
    s[~ok] = 1.0
    return np.einsum("mij,mj,mkj->mik", U, s, V)
