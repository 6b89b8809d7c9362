"""The cloth solver's Newton loop: projected Newton on the incremental potential with IPC
contact, one implicit step at a time (:class:`NewtonLoop`), its steps named: the energy,
the gradient and Hessian (elastic terms, then contact), the assembly of the system, the
linear solve, the convergence test, the CCD bound and the line search, the barrier
stiffness's adaptation and the held vertices' settling.

What the steps share lives in a :class:`StepContext` (one per implicit step) and an
:class:`Iterate` (one per Newton iteration); the solver (:class:`SolverCloth`) owns what
outlives a step: its fields, the contact machinery, the barrier stiffness.

References:
    Li et al., "Codimensional Incremental Potential Contact" (C-IPC), SIGGRAPH 2021;
    Li et al., "Incremental Potential Contact", SIGGRAPH 2020.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from tisim.backend import download, upload
from tisim.solvers.cloth.assembly import structural_sum
from tisim.solvers.cloth.terms import _zero

log = logging.getLogger(__name__)

# Newton iterations in a row in which held vertices get less than 1% closer to their
# targets before they are held where they are for the rest of the step
BLOCKED_AFTER = 3
# Friction vertices slower than this many eps_v in a step are still deciding between stick
# and slip: Newton's test holds them to eps_v (see NewtonLoop.converged). Three covers a
# slide that starts from rest and the first steps of its speeding up.
STICK_SLIP_ZONE = 3.0

# what a step of the loop tells the loop to do next
NEXT, CONTINUE, STOP = 0, 1, 2


@dataclass
class StepResult:
    x: np.ndarray  # (nc, 3) cloth positions at the end of the step
    iterations: int
    residual: float  # max |p| / h of the last Newton direction, m/s
    converged: bool
    n_contacts: int
    min_distance: float  # smallest primitive distance minus the thickness, m
    ccd_clamps: int
    max_strain: float
    timings: dict
    kinematic_lag: float  # largest distance of a prescribed vertex from its target, m


@dataclass(eq=False)
class StepContext:
    """What the Newton iterations of one implicit step share.

    Arrays are (n, 3) over the cloth's vertices then the obstacles' (n = nc + no) unless
    said otherwise; positions in m.
    """

    x: np.ndarray  # the current iterate
    x_start: np.ndarray  # the step's start
    x_hat: np.ndarray  # (nc, 3) inertial target
    f_ext: np.ndarray  # (nc, 3) constant external force, N
    h: float  # time step, s
    target: np.ndarray  # prescribed vertices' targets (NaN elsewhere)
    prescribed: np.ndarray  # (n,) bool
    fixed: np.ndarray  # (n,) bool: prescribed and at their targets (not unknowns)
    pulled: np.ndarray  # (n,) bool: prescribed, pulled to their targets by a penalty
    tol_v: float  # convergence tolerance as a velocity, m/s
    max_it: int
    stop_on_decrement: bool
    reuse: int  # Newton iterations an elastic Hessian is kept for
    inflation: float  # dhat + thickness, m
    eps_v: float  # friction smoothing velocity, m/s
    use_friction: bool
    friction_on: bool = False  # friction pairs lagged
    plane_friction: bool = False  # the analytic planes' friction lagged
    pairs: tuple = (0, 0)  # (point-triangle, edge-edge) candidates in the broad phase's buffers
    w_al: float = 0.0  # the held vertices' penalty stiffness, N/m (0 until needed)
    lag_prev: float = 0.0  # the held vertices' largest distance from their targets, m
    stalled: int = 0  # iterations in a row without 1% progress of the held vertices
    last_elastic: float = math.nan  # the elastic term's value in the last energy() call
    # the positions array of the last energy() call that evaluated the barrier (its
    # active pairs are kept: compact_active(same_x=True)); None once x changes in place
    # or a detection replaces the pair buffers
    barrier_at: np.ndarray | None = None
    # the potential at the current x, when known: (value, kappa, w_al, elastic term) of
    # the line search that accepted x, so the next line search starts from it instead of
    # a second evaluation at the same point. A change since then invalidates it: the
    # barrier stiffness, the held vertices' penalty, the elastic term's value at x (the
    # progressive levels' prolongation refreshes its offsets with the gradient, which
    # changes the function), or the friction lag
    E_known: tuple | None = None
    He_kept: sp.csr_matrix | None = None  # a kept elastic Hessian (hessian_reuse > 1)
    kept_for: int = 0
    finishing: bool = False  # converged; the step being taken is the last
    iterations: int = 0
    residual: float = math.inf
    converged: bool = False
    clamps: int = 0  # steps CCD cut short
    prev_min_s: float = math.inf  # the last iterate's smallest squared gap, m^2
    timings: dict = field(
        default_factory=lambda: dict.fromkeys(("contact", "elastic", "assemble", "linear", "ccd", "line_search"), 0.0)
    )  # s

    def reached(self, xx: np.ndarray) -> np.ndarray:
        """(n,) distances of the prescribed vertices from their targets at xx (0 elsewhere), m."""
        d = np.zeros(len(self.prescribed))
        d[self.prescribed] = np.linalg.norm(xx[self.prescribed] - self.target[self.prescribed], axis=1)
        return d


@dataclass(eq=False)
class Iterate:
    """One Newton iteration's system: gradient, Hessian parts, the unknowns, the step."""

    Ee: float  # the elastic term's energy at x, J
    He: sp.spmatrix  # its Hessian over the cloth's dofs
    kept: bool  # He is a kept one (not evaluated at x)
    g: np.ndarray  # (n, 3) gradient of the potential, N
    Hc: sp.spmatrix  # the cloth block's Hessian (elastic + strain limit)
    free: np.ndarray | None = None  # (n,) bool: the unknowns' vertices
    sysvert: np.ndarray | None = None  # (n,) the unknowns' numbers (-1: not an unknown)
    pair_parts: list = field(default_factory=list)  # (local Hessians, stencils, rows) of the pairs
    block_parts: list = field(default_factory=list)  # (cloth vertices, 3 x 3 blocks) of the planes
    # (the planes' friction blocks, friction pair rows)
    friction_parts: tuple = field(default_factory=lambda: ([], []))
    dofs: np.ndarray | None = None  # the unknowns' scalar dofs
    b: np.ndarray | None = None  # the system's right-hand side, -g on dofs
    p: np.ndarray | None = None  # (n, 3) the Newton step, m


class NewtonLoop:
    """One implicit step of :class:`~tisim.solvers.cloth.solver.SolverCloth`, minimised by
    projected Newton (see :meth:`run`). Built per step; reads the solver's state live (the
    barrier stiffness and the hooks the tests set may change during the step)."""

    def __init__(self, solver):
        self.solver = solver

    # ------------------------------------------------------------------ the step
    def run(
        self, xc, x_hat, h, *, f_ext=None, obstacles=None, held=None, tolerance=None, max_iterations=None
    ) -> StepResult:
        """Minimise the incremental potential from ``xc`` (see SolverCloth.solve)."""
        s = self.solver
        c = self.start(xc, x_hat, h, f_ext, obstacles, held, tolerance, max_iterations)
        self.start_friction(c)
        n_lag = max(1, s.contact.friction_iterations)
        lag_tol = s.contact.friction_lag_tolerance
        bound = s._friction_bound(c.friction_on, c.plane_friction)
        for lag in range(n_lag):
            c.E_known = None
            if lag > 0:
                # C-IPC friction lagging: normal forces and tangents from the last solve,
                # displacement still measured from the start of the step
                if not c.converged:
                    break
                # Lagging again is what makes friction see the normal forces of the step's
                # end (a sheet landing on an incline has almost none at its start and slid
                # millimetres before they came); once they settle it changes nothing
                previous, bound = bound, self.lag_friction(c)
                if lag_tol > 0 and abs(bound - previous) <= lag_tol * max(bound, previous):
                    break
                c.converged = False
            self.iterate(c)
        return self.result(c)

    def start(self, xc, x_hat, h, f_ext, obstacles, held, tolerance, max_iterations) -> StepContext:
        """The step's context: the unknowns with the obstacles appended, the targets of the
        prescribed vertices, the tolerances."""
        s = self.solver
        cfg = s.config
        nc, n = s.nc, s.n
        if f_ext is None:
            f_ext = s.cloth_mass[:, None] * s.gravity
        if obstacles is None:
            obs = s.obstacles.positions(0.0, s.model.initial_positions)
            obstacles = (obs, obs)
        obs_start, obs_target = obstacles
        x = np.concatenate([xc, obs_start]) if s.no else xc.copy()
        target = np.full((n, 3), np.nan)
        if s.no:
            target[nc:] = obs_target
        if held is not None and len(held[0]):
            target[held[0]] = held[1]
        prescribed = ~np.isnan(target[:, 0])
        c = StepContext(
            x=x,
            x_start=x.copy(),
            x_hat=x_hat,
            f_ext=f_ext,
            h=h,
            target=target,
            prescribed=prescribed,
            fixed=prescribed,
            pulled=prescribed,
            tol_v=(tolerance if tolerance is not None else cfg.tolerance) * s.bbox_diag,
            max_it=max_iterations or cfg.newton_iterations,
            stop_on_decrement=getattr(cfg, "stop", "max") == "decrement",
            reuse=max(1, int(s.hessian_reuse)),
            inflation=s.contact.dhat + s.contact.thickness,
            eps_v=s.contact.eps_v,
            use_friction=s.contact.friction_iterations > 0,
        )
        # vertices whose target is reached are fixed; the others are pulled by a penalty
        c.fixed = prescribed & (c.reached(x) <= 1e-12 * s.bbox_diag)
        c.pulled = prescribed & ~c.fixed
        c.lag_prev = float(c.reached(x).max(initial=0.0))
        return c

    def start_friction(self, c: StepContext) -> None:
        """The step's first detection; the barrier stiffness when contact begins; friction's
        normal forces and tangents lagged at the start of the step."""
        s = self.solver
        x, nc = c.x, s.nc
        dhat, xi = s.contact.dhat, s.contact.thickness
        upload(s.x, x)
        upload(s.x_ref, x)
        t_ = time.perf_counter()
        n_pt, n_ee = s._detect(c.inflation, at=x)
        planes = s.planes
        near_plane = bool(planes) and planes.active_count(x[:nc], dhat, xi) > 0
        near_narrow = s.narrow is not None and s.narrow.active_count(s.x) > 0
        if s.kappa == 0.0 and (
            n_pt + n_ee or near_plane or near_narrow or any(ball.active_count(s.x) > 0 for ball in s.balls)
        ):
            s._init_kappa(x, c.x_hat, c.f_ext, c.h, n_pt, n_ee)
        if c.use_friction and (n_pt + n_ee) and s.kappa > 0:
            s.friction.update(
                s.x,
                *s.barrier.compact_active(s.x, s.broad.pt, n_pt, s.broad.ee, n_ee, dhat, xi),
                dhat,
                xi,
                s.kappa,
                s.vertex_mu,
            )
        if c.use_friction and planes and s.kappa > 0:
            planes.update_friction(x[:nc], dhat, xi, s.kappa)
        for ball in s.balls:
            if c.use_friction and s.kappa > 0:
                ball.update_friction(s.x, s.kappa, s.vertex_mu)
            else:
                ball.friction_on = False
        c.timings["contact"] += time.perf_counter() - t_
        c.friction_on = c.use_friction and (n_pt + n_ee) > 0 and s.kappa > 0
        c.plane_friction = c.use_friction and bool(planes) and s.kappa > 0
        c.pairs = (n_pt, n_ee)

    def lag_friction(self, c: StepContext) -> float:
        """Friction lagged again at the converged x; returns the new bound sum mu lambda, N."""
        s = self.solver
        x, nc = c.x, s.nc
        dhat, xi = s.contact.dhat, s.contact.thickness
        planes = s.planes
        upload(s.x, x)
        # contacts that began during the step (a landing) get their friction now
        c.friction_on = c.use_friction and sum(c.pairs) > 0 and s.kappa > 0
        c.plane_friction = c.use_friction and bool(planes) and s.kappa > 0
        if c.friction_on:
            s.friction.update(
                s.x,
                *s.barrier.compact_active(
                    s.x, s.broad.pt, c.pairs[0], s.broad.ee, c.pairs[1], dhat, xi, same_x=c.barrier_at is x
                ),
                dhat,
                xi,
                s.kappa,
                s.vertex_mu,
            )
        if c.plane_friction:
            planes.update_friction(x[:nc], dhat, xi, s.kappa, reference=c.x_start[:nc])
        if c.use_friction and s.kappa > 0:
            for ball in s.balls:
                ball.update_friction(s.x, s.kappa, s.vertex_mu)
        return s._friction_bound(c.friction_on, c.plane_friction)

    def iterate(self, c: StepContext) -> None:
        """Newton iterations from c.x until convergence, the iteration cap or a line search
        that finds no decrease."""
        c.He_kept, c.kept_for = None, 0
        c.finishing = False
        for it in range(c.max_it):
            c.iterations += 1
            k = self.elastic_terms(c)
            self.contact_terms(c, k)
            self.assemble(c, k)
            self.linear_solve(c, k)
            action = self.converged(c, k)
            if action == STOP:
                break
            if action == CONTINUE:
                continue
            alpha, toi = self.ccd_bound(c, k)
            action = self.line_search(c, k, alpha, toi, it)
            if action == STOP:
                break

    # ------------------------------------------------------------------ named steps
    def energy(self, c: StepContext, xx: np.ndarray, pairs, elastic=None) -> float:
        """Total incremental potential at xx (n, 3), J; pairs = (n_pt, n_ee) candidates;
        elastic: the elastic term's energy at xx when already known."""
        s = self.solver
        nc, mass, inv_h2, x_hat, f_ext, h = s.nc, s.cloth_mass, 1.0 / (c.h * c.h), c.x_hat, c.f_ext, c.h
        dhat, xi, eps_v, planes = s.contact.dhat, s.contact.thickness, c.eps_v, s.planes
        xcc = xx[:nc]
        E = 0.5 * inv_h2 * float((mass[:, None] * (xcc - x_hat) ** 2).sum()) - float((xcc * f_ext).sum())
        c.last_elastic = s.elastic.evaluate(xcc, energy_only=True)[0] if elastic is None else elastic
        E += c.last_elastic
        if s.strain is not None:
            E += s.strain.energy(xcc)
        upload(s.x, xx)
        c.barrier_at = None
        E_friction = None  # the scene's friction, summed with the barrier where both act
        if sum(pairs) and s.kappa > 0:
            args = (s.x, s.broad.pt, pairs[0], s.broad.ee, pairs[1], dhat, xi, s.kappa)
            if c.friction_on:
                Eb, E_friction = s.barrier.energy_with_friction(*args, s.friction, s.x_ref, eps_v, h)
                E += Eb
            else:
                E += s.barrier.energy(*args)
            c.barrier_at = xx
        if s.narrow and s.kappa > 0:
            E += s.narrow.energy(s.x, s.kappa)
        if s.kappa > 0:
            for ball in s.balls:
                E += ball.energies(s.x, s.x_ref, s.kappa, eps_v, h)
        if c.friction_on:
            E += s.friction.energy(s.x, s.x_ref, eps_v, h) if E_friction is None else E_friction
        if planes and s.kappa > 0:
            E += planes.energy(xcc, dhat, xi, s.kappa)
            if c.plane_friction:
                E += planes.friction_energy(xcc, eps_v, h)
        if c.w_al > 0 and c.pulled.any():
            E += 0.5 * c.w_al * float(((xx[c.pulled] - c.target[c.pulled]) ** 2).sum())
        return E

    def elastic_terms(self, c: StepContext) -> Iterate:
        """The gradient of the inertia, external force and elastic terms at c.x and the
        elastic Hessian (a kept one while hessian_reuse allows), plus the strain limit's
        when it is not folded into the elastic term."""
        s = self.solver
        nc, x, mass = s.nc, c.x, s.cloth_mass
        t_ = time.perf_counter()
        kept = c.He_kept is not None and c.kept_for < c.reuse
        if kept:
            # a kept elastic Hessian (hessian_reuse > 1): the gradient is exact, the
            # step a descent direction (the kept matrix is PSD), the line search as ever
            Ee, ge, _ = s.elastic.evaluate(x[:nc], hessian=False)
            He = c.He_kept
            c.kept_for += 1
        else:
            Ee, ge, He = s.elastic.evaluate(x[:nc], hessian=True)
            if c.reuse > 1:
                c.He_kept, c.kept_for = sp.csr_matrix(He, copy=True), 1
        g = np.zeros((s.n, 3))
        g[:nc] = 1.0 / (c.h * c.h) * mass[:, None] * (x[:nc] - c.x_hat) - c.f_ext + ge
        Hc = He
        if s.strain is not None and not s._strain_folded:
            gs, Hs = s.strain.gradient_hessian(x[:nc])
            if gs is not None:
                g[:nc] += gs
                Hs = Hs.tocoo()
                Hc = structural_sum(sp.csr_matrix(Hc), Hs.row, Hs.col, Hs.data)
        c.timings["elastic"] += time.perf_counter() - t_
        return Iterate(Ee=Ee, He=He, kept=kept, g=g, Hc=Hc)

    def contact_terms(self, c: StepContext, k: Iterate) -> None:
        """The unknowns (free vertices: static obstacles and fixed handles are not, cloth
        first); the barrier's and friction's gradients and local Hessians over the pairs,
        the analytic planes' gradients and vertex blocks."""
        s = self.solver
        nc, n, x, h, eps_v = s.nc, s.n, c.x, c.h, c.eps_v
        dhat, xi, planes, pairs = s.contact.dhat, s.contact.thickness, s.planes, c.pairs
        t_ = time.perf_counter()
        k.free = ~c.fixed
        k.sysvert = np.full(n, -1, dtype=np.int32)
        k.sysvert[k.free] = np.arange(int(k.free.sum()), dtype=np.int32)
        system = s.system
        system.set_unknowns(k.sysvert)
        upload(s.x, x)
        if s.narrow and s.kappa > 0:
            _zero(s.g)
            part = s.narrow.add_terms(s.x, s.kappa, s.g, system.unknowns)
            if part is not None:
                k.pair_parts.append(part)
                k.g += download(s.g)
        for ball in s.balls if s.kappa > 0 else ():
            _zero(s.g)
            # (the line search's last energy, at x, scanned the sphere's rows too)
            same_x = c.barrier_at is x
            part, fpart = ball.add_contact_terms(s.x, s.x_ref, s.kappa, eps_v, h, s.g, system.unknowns, same_x)
            for pp in (part, fpart):
                if pp is not None:
                    k.pair_parts.append(pp)
            if fpart is not None:
                k.friction_parts[1].append((ball.friction, fpart[2]))
            if part is not None or fpart is not None:
                k.g += download(s.g)
        if sum(pairs) and s.kappa > 0:
            _zero(s.g)
            apt, na_pt, aee, na_ee = s.barrier.compact_active(
                s.x, s.broad.pt, pairs[0], s.broad.ee, pairs[1], dhat, xi, same_x=c.barrier_at is x
            )
            fr = (s.friction, s.x_ref, eps_v, h) if c.friction_on else None  # (friction's after, one launch)
            s.barrier.add_gradient(s.x, apt, na_pt, aee, na_ee, dhat, xi, s.kappa, s.g, friction=fr)
            k.g += download(s.g)
            rows = s.barrier.local_hessians(
                s.x, apt, na_pt, aee, na_ee, dhat, xi, s.kappa, True, unknowns=system.unknowns
            )
            k.pair_parts.append((s.barrier.hessians, s.barrier.stencils, rows))
            if c.friction_on:
                rows = s.friction.local_hessians(s.x, s.x_ref, eps_v, h, True)
                k.pair_parts.append((s.friction.hessians, s.friction.stencils, rows))
                k.friction_parts[1].append((s.friction, rows))
        if planes and s.kappa > 0:
            gp, blocks = planes.gradient_hessian(x[:nc], dhat, xi, s.kappa)
            k.g[:nc] += gp
            k.block_parts.append(blocks)
            if c.plane_friction:
                gf, blocks = planes.friction_gradient_hessian(x[:nc], eps_v, h)
                k.g[:nc] += gf
                k.block_parts.append(blocks)
                k.friction_parts[0].append(blocks)
        c.timings["contact"] += time.perf_counter() - t_

    def assemble(self, c: StepContext, k: Iterate) -> None:
        """The Newton system on the unknowns' dofs: the cloth block, the planes' vertex
        blocks, the pairs' local Hessians, the mass and the held vertices' penalty on the
        diagonal; the right-hand side -g."""
        s = self.solver
        nc, n, x, mass = s.nc, s.n, c.x, s.cloth_mass
        inv_h2 = 1.0 / (c.h * c.h)
        t_ = time.perf_counter()
        diag = np.zeros((n, 3))
        diag[:nc] = inv_h2 * mass[:, None]
        # the system is assembled on the unknowns' dofs directly
        dofs = np.flatnonzero(np.repeat(k.free, 3))
        m_sys = len(dofs)
        Hc = sp.csr_matrix(k.Hc)
        if k.free[:nc].all():
            A = _pad(Hc, m_sys)
        else:
            cd = dofs[dofs < 3 * nc]
            A = _pad(Hc[cd][:, cd], m_sys)
        # every structural entry stays (zeros too): the pattern, and with it the
        # linear solver's analysis, changes only with the pairs
        system = s.system
        system.begin(A)
        for vb, B in k.block_parts:
            sv = k.sysvert[vb]
            system.add_vertex_blocks(sv[sv >= 0], B[sv >= 0])
        system.add_pair_batches(k.pair_parts)
        pulled = c.pulled
        if pulled.any():
            if c.w_al == 0.0:
                # stiff enough to dominate every other term acting on those vertices
                c.w_al = 1e4 * max(float(np.abs(system.diagonal()).max(initial=0.0)), float(inv_h2 * mass.max()), 1.0)
            diag[pulled] += c.w_al
            k.g[pulled] += c.w_al * (x[pulled] - c.target[pulled])
        system.add_diagonal(diag.ravel()[dofs])
        k.dofs = dofs
        k.b = -k.g.ravel()[dofs]
        c.timings["assemble"] += time.perf_counter() - t_

    def linear_solve(self, c: StepContext, k: Iterate) -> None:
        """The Newton step k.p from the assembled system."""
        s = self.solver
        t_ = time.perf_counter()
        p = np.zeros(3 * s.n)
        p[k.dofs] = s.linear.solve(s.system, k.b)
        p = p.reshape(s.n, 3)
        if not np.isfinite(p).all():  # (its length is the line search's to cut: a handle's
            # penalty can ask for kilometres that the strain limit then scales down)
            from tisim.solvers.base import StepDiverged

            raise StepDiverged("a Newton step is not finite (NaN or Inf)")
        k.p = p
        c.timings["linear"] += time.perf_counter() - t_

    def converged(self, c: StepContext, k: Iterate) -> int:
        """The convergence test on the step k.p: STOP when converged, CONTINUE to confirm
        with a fresh Hessian, NEXT to take the step (c.finishing: the last one)."""
        s = self.solver
        nc, p, h, mass, free, pulled = s.nc, k.p, c.h, s.cloth_mass, k.free, c.pulled
        tol_v, dofs = c.tol_v, k.dofs
        residual = float(np.abs(p[:nc][free[:nc] & ~pulled[:nc]]).max(initial=0.0)) / h
        c.residual = residual
        # Newton decrement lambda^2 = p^T H p >= sum m |p|^2 / h^2: as a velocity,
        # sqrt(lambda^2 / M) bounds the mass-weighted RMS of p / h
        m_free = float(mass[free[:nc]].sum())
        v_dec = math.sqrt(max(float(k.b @ p.ravel()[dofs]), 0.0) / m_free) if m_free > 0 else 0.0
        small = residual < tol_v or (c.stop_on_decrement and v_dec < tol_v)
        friction_acts = False  # any vertex with a lagged normal force, hence friction
        if small and not pulled.any() and (k.friction_parts[0] or k.friction_parts[1]):
            # Friction in its sticking zone is the stiffest term of the system
            # (2 mu lambda / (eps_v h), largest at zero slip), so near the start of a
            # step p is short even where Coulomb says the cloth slides: the step's
            # shortness is friction's stiffness, not closeness to the minimum. Measure
            # instead the step the same forces would give against inertia alone,
            # q = p + h^2 M^-1 K_f p (see SolverCloth._friction_held_step).
            residual, v_dec, slip, friction_acts = s._friction_held_step(
                p, k.b @ p.ravel()[dofs], free & ~pulled, h, k.friction_parts, c.x[:nc] - c.x_start[:nc], c.eps_v
            )
            c.residual = residual
            # and where friction is still deciding between stick and slip (vertices
            # that moved less than STICK_SLIP_ZONE eps_v h in this step), to its own
            # velocity resolution eps_v: a looser test decides it arbitrarily (a
            # 0.3 m sheet on 30 degrees with mu = 0.55, a = 0.23 m/s^2, stayed put at
            # the 4 mm/s that the tolerance alone allowed). Everywhere else friction
            # is saturated or absent and Newton resolves the slip like any motion;
            # holding every friction vertex to eps_v cost cloth-drape 60-90% more
            # iterations in the buckling tail.
            small = (residual < tol_v or (c.stop_on_decrement and v_dec < tol_v)) and slip < min(tol_v, c.eps_v)
        if not pulled.any() and small:
            if not k.kept:
                c.converged = True
                if not friction_acts:
                    return STOP
                # With friction, the stopping point's error leans one way: Newton
                # comes from the sticking side, so a slide stops short by up to the
                # tolerance, every step (a 1.08 m/s^2 slide came out 4.5% slow).
                # The last step is solved already: take it (CCD and line search as
                # ever), which removes the lean at a line search's cost.
                c.finishing = True
            else:
                # measured with a kept Hessian: confirm with a fresh one at the same
                # x, so that convergence means what it means for plain Newton
                c.He_kept = None
                return CONTINUE
        return NEXT

    def ccd_bound(self, c: StepContext, k: Iterate) -> tuple[float, float]:
        """The largest fraction alpha <= 1 of k.p that keeps the strain limit and is
        collision-free (CCD over the swept pairs, the planes' bound); returns (alpha, the
        time of impact)."""
        s = self.solver
        nc, x, p = s.nc, c.x, k.p
        t_ = time.perf_counter()
        alpha = 1.0
        if s.strain is not None:
            while alpha > 1e-12 and not s.strain.feasible(x[:nc] + alpha * p[:nc]):
                alpha *= 0.5
        upload(s.x, x)
        upload(s.dx, p)
        c.pairs = s._detect(c.inflation, alpha)
        c.barrier_at = None  # the detection replaced the pair buffers: no active list to reuse
        toi = s._ccd(c.pairs)  # a fraction of the full step p
        if s.planes:
            toi = min(toi, s.planes.max_step(x[:nc], p[:nc], s.contact.thickness, s.config.ccd_eta))
        if toi < alpha:
            c.clamps += 1
        alpha = min(alpha, toi)
        c.timings["ccd"] += time.perf_counter() - t_
        return alpha, toi

    def line_search(self, c: StepContext, k: Iterate, alpha: float, toi: float, it: int) -> int:
        """Backtracking from alpha to sufficient decrease (Armijo); on acceptance c.x moves,
        the barrier stiffness adapts and the held vertices settle. Returns STOP or NEXT."""
        s = self.solver
        x, p, g, E0_known = c.x, k.p, k.g, c.E_known
        t_ = time.perf_counter()
        # the elastic energy at x came with its gradient (the same evaluation)
        if E0_known is not None and E0_known[1:] == (s.kappa, c.w_al, k.Ee) and s.reuse_start_energy:
            E0 = E0_known[0]
        else:
            E0 = self.energy(c, x, c.pairs, elastic=k.Ee)
        slope = float((g * p).sum())
        if c.finishing and (slope >= 0 or float(np.abs(p[: s.nc]).max()) < 1e-3 * c.eps_v * c.h):
            return STOP  # a last step under a thousandth of eps_v changes nothing friction resolves
        accepted = False
        for _ in range(s.config.line_search_steps):
            xt = x + alpha * p
            Et = self.energy(c, xt, c.pairs)
            if Et <= E0 + 1e-4 * alpha * min(slope, 0.0) or (slope >= 0 and Et <= E0):
                accepted = True
                break
            alpha *= 0.5
            c.He_kept = None  # backtracked: the kept Hessian no longer models the energy well
        c.timings["line_search"] += time.perf_counter() - t_
        log.debug(
            "newton %d: |p|/h %.3g alpha %.3g (ccd %.3g) E %.6g -> %.6g, %d pairs, kappa %.3g",
            it,
            c.residual,
            alpha,
            toi,
            E0,
            Et,
            sum(c.pairs),
            s.kappa,
        )
        if not accepted:
            log.debug("line search found no decrease at Newton iteration %d", it)
            if c.finishing:
                return STOP
            if c.pulled.any():
                # held vertices that cannot move on: stop pulling (settle_held)
                c.fixed |= c.pulled
                c.pulled[:] = False
                return NEXT
            return STOP
        if s.on_accept is not None:
            s.on_accept(x, xt, p, E0, Et)
        c.x = xt
        # (held vertices being pulled may still be moved below: no reuse then)
        c.E_known = None if c.pulled.any() else (Et, s.kappa, c.w_al, c.last_elastic)
        if c.finishing:
            return STOP
        self.adapt_kappa(c)
        if c.pulled.any():
            self.settle_held(c)
        return NEXT

    def adapt_kappa(self, c: StepContext) -> None:
        """Double the barrier stiffness when a pair keeps closing in (IPC)."""
        s = self.solver
        planes, pairs, xi = s.planes, c.pairs, s.contact.thickness
        if (sum(pairs) or planes or s.narrow or s.balls) and s.kappa > 0:
            # the line search's last energy was evaluated at this x over these pairs;
            # the analytic colliders' gaps count as the pairs' do
            dmin = s.barrier.last_min_distance if sum(pairs) else math.inf
            if planes:
                dmin = min(dmin, planes.min_distance(c.x[: s.nc]))
            gap = dmin * dmin - xi * xi
            if s.narrow:  # the narrow pairs' gap to their own thickness
                gap = min(gap, s.narrow.gap())
            for ball in s.balls:  # a sphere's faces' gap, as the scene's pairs give theirs
                gap = min(gap, ball.gap())
            if gap < 1e-9 * s.bbox_diag**2 and gap < c.prev_min_s:
                s.kappa = min(s.kappa_max, 2 * s.kappa)
            c.prev_min_s = gap

    def settle_held(self, c: StepContext) -> None:
        """Prescribed vertices that reached their targets become fixed; those held off
        their path (a blocked handle) stay where they are."""
        s = self.solver
        x, pulled, target = c.x, c.pulled, c.target
        dist = c.reached(x)
        done = pulled & (dist <= 1e-9 * s.bbox_diag)
        # the penalty leaves a held vertex off its target by its force over w_al
        # (about 1e-9 m in cloth-twist, where 50 iterations did not close it):
        # within the step tolerance, put it there if the move is strain-feasible
        # and collision-free (CCD)
        near = pulled & ~done & (dist <= c.tol_v * c.h)
        if near.any():
            d = np.zeros_like(x)
            d[near] = target[near] - x[near]
            c.barrier_at = None  # (its detection replaces the pair buffers)
            if s._move_is_safe(x, d, c.inflation):
                done |= near
            # its detection replaced the pair buffers: their list covers x -> x + d,
            # so every pair near x, and x once the near vertices move
            c.pairs = s._last_pairs
        if done.any():
            c.barrier_at = None
            x[done] = target[done]
            c.fixed |= done
            pulled &= ~done
        # a prescribed path the strain limit or a contact blocks: the penalised
        # problem's minimum is at the barrier's singularity, where Newton only
        # jitters. After BLOCKED_AFTER iterations without 1% progress the held
        # vertices stay where they are for the rest of the step; the distance
        # left is the step's kinematic_lag
        if pulled.any():
            lag_now = float(dist[pulled].max())
            c.stalled = c.stalled + 1 if lag_now > 0.99 * c.lag_prev else 0
            c.lag_prev = lag_now
            if c.stalled >= BLOCKED_AFTER:
                log.debug("held vertices blocked %.3g m from their targets", lag_now)
                c.fixed |= pulled
                pulled[:] = False

    def result(self, c: StepContext) -> StepResult:
        """Contact statistics at the result (the next step starts from this detection)."""
        s = self.solver
        nc, x = s.nc, c.x
        dhat, xi, planes = s.contact.dhat, s.contact.thickness, s.planes
        upload(s.x, x)
        n_pt, n_ee = s._detect(c.inflation, at=x)
        dmin = math.inf
        n_active = 0
        if n_pt + n_ee:  # (the smallest distance and the active pairs from one pass)
            dmin, n_active = s.barrier.distance_stats(s.x, s.broad.pt, n_pt, s.broad.ee, n_ee, dhat, xi)
        if s.narrow:
            n_active += s.narrow.active_count(s.x)
        for ball in s.balls:
            d_ball, active = ball.distance_stats(s.x)
            n_active += active
            dmin = min(dmin, d_ball - ball.radius)  # (BallPairs.clearance)
        if planes:
            dmin = min(dmin, planes.min_distance(x[:nc]))
            n_active += planes.active_count(x[:nc], dhat, xi)
        lag = float(c.reached(x).max(initial=0.0)) if c.prescribed.any() else 0.0
        s._last_obstacles = x[nc:].copy()
        return StepResult(
            x=x[:nc].copy(),
            iterations=c.iterations,
            residual=c.residual,
            converged=c.converged,
            n_contacts=int(n_active),
            min_distance=dmin - xi if math.isfinite(dmin) else math.nan,
            ccd_clamps=c.clamps,
            max_strain=s.strain.max_stretch(x[:nc]) if s.strain is not None else math.nan,
            timings={name: v * 1e3 for name, v in c.timings.items()},
            kinematic_lag=lag,
        )


def _pad(A: sp.csr_matrix, size: int) -> sp.csr_matrix:
    """A square CSR matrix extended with empty rows and columns to ``size``."""
    if A.shape[0] == size:
        return A
    indptr = np.concatenate([A.indptr, np.full(size - A.shape[0], A.indptr[-1], dtype=A.indptr.dtype)])
    return sp.csr_matrix((A.data, A.indices, indptr), shape=(size, size))


# An inertial motion (velocity times the time step) that moves a vertex further than this
# many times the cloth's size (or than this many metres for a cloth below 1 m) is no motion
# the solver can resolve: its swept boxes hold every pair and CCD crawls over them, and far
# beyond it the squared distances overflow (an initial velocity of 1e170 m/s hung the run
# in CCD). 1e3 is kilometres in one step for any cloth; the adversarial tests move a vertex
# 1 m per step.
MAX_STEP_SIZES = 1e3


def _check_step(d: np.ndarray, what: str, size: float) -> None:
    """Raise StepDiverged when the displacements d (k, 3) are not finite or reach
    MAX_STEP_SIZES times max(size, 1 m)."""
    from tisim.solvers.base import StepDiverged

    limit = MAX_STEP_SIZES * max(size, 1.0)
    if not np.isfinite(d).all():
        raise StepDiverged(f"{what} is not finite (NaN or Inf)")
    big = float(np.abs(d).max(initial=0.0))
    if big >= limit:
        raise StepDiverged(
            f"{what} moves a cloth vertex {big:.3g} m, more than the {limit:.3g} m this solver can resolve in one step"
        )


def _barrier_d2(d: float, dhat: float) -> float:
    """Second derivative of b(d) = -(d - dhat)^2 ln(d / dhat) (host, for one scalar)."""
    r = d - dhat
    return -2 * math.log(d / dhat) - 4 * r / d + r * r / (d * d)
