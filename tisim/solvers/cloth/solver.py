"""Cloth and shells: implicit Euler as an incremental potential, minimised by projected
Newton with C-IPC contact, so that no accepted iterate ever intersects.

One step solves

    x+ = argmin_x  1/(2h^2) |x - x_hat|_M^2 - x.f_ext + Psi(x) + S(x) + kappa B(x) + D(x)

with x_hat = x + h v the inertial target, f_ext gravity and wind, Psi the shell energy
(Neo-Hookean membrane + hinge bending), S the strain-limit barrier, B the IPC log barrier
over point-triangle and edge-edge pairs (cloth self-contact, collider meshes, solid
surfaces), D lagged smoothed friction. The progressive driver calls :meth:`solve` with
its own inertial target and elastic term.

Obstacles (colliders as triangle meshes, surfaces of the scene's soft bodies stepped
by a PD solver) and handles are prescribed vertices: each step moves them to their
targets through a stiff penalty in the same Newton solve (the augmented-Lagrangian
treatment of IPC's kinematic boundary conditions), then fixes them, so a moving
obstacle pushes the cloth instead of jumping into it.

Where the parts live: the Newton loop in ``newton.py`` (:class:`NewtonLoop`, its named
steps over a step context), the linear solves in ``linear.py``, the shell and strain-limit
terms in ``terms.py``, the colliders and the soft bodies met as obstacles in
``obstacles.py``; this module builds them and steps the scene. Their names stay
importable from here.

References:
    Li et al., "Codimensional Incremental Potential Contact" (C-IPC), SIGGRAPH 2021;
    Li et al., "Incremental Potential Contact", SIGGRAPH 2020; notes
    ../shared/papers/progressive-dynamics.md, sections 2.4 and 7.

Limitations:
    One-way coupling with soft bodies (the cloth does not push the body back; two-way
    coupling would put the body's elastic energy and the cloth in one Newton solve).
    Static planes, spheres, boxes and cylinders are met analytically by the cloth's
    vertices (their edges and rims as line sets, docs/colliders.md), a sphere by the
    cloth's faces through its centre when the cloth is coarse against it (``balls.py``);
    moving colliders and mesh colliders are tessellated. The wind force is
    explicit (held over a step). The Hessian is assembled on the host.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from tisim.backend import download, upload
from tisim.config import ConfigError
from tisim.solvers.base import Solver, StepStats, Tunable
from tisim.solvers.cloth.assembly import DeviceAssembler, SystemAssembler, structural_sum
from tisim.solvers.cloth.linear import SPDSolver
from tisim.solvers.cloth.newton import (
    BLOCKED_AFTER,
    MAX_STEP_SIZES,
    STICK_SLIP_ZONE,
    NewtonLoop,
    StepResult,
    _barrier_d2,
    _check_step,
    _pad,
)
from tisim.solvers.cloth.obstacles import (
    ANALYTIC_KINDS,
    NO_LIMIT_STRETCH,
    RIM_MAX_SEGMENTS,
    RIM_SAGITTA,
    SAG_LIMIT,
    _check_start_analytic,
    _check_start_ball,
    _diag,
    _largest_circumradius,
    _line_set,
    _Obstacles,
    _rim_segments,
    _solid_solver,
    _SolidView,
)
from tisim.solvers.cloth.terms import (
    HINGE_LUMPED_COUPLINGS,
    ShellTerm,
    StrainTerm,
    _np,
    _StrainTerm,
    _zero,
    remember,
)
from tisim.solvers.cloth.wind import Wind

log = logging.getLogger(__name__)

# names other modules and the tests import from here
__all__ = [
    "ANALYTIC_KINDS",
    "BLOCKED_AFTER",
    "HINGE_LUMPED_COUPLINGS",
    "MAX_STEP_SIZES",
    "NO_LIMIT_STRETCH",
    "RIM_MAX_SEGMENTS",
    "RIM_SAGITTA",
    "SAG_LIMIT",
    "STICK_SLIP_ZONE",
    "DeviceAssembler",
    "NewtonLoop",
    "SPDSolver",
    "ShellTerm",
    "SolverCloth",
    "StepResult",
    "StrainTerm",
    "SystemAssembler",
    "_Obstacles",
    "_SolidView",
    "_StrainTerm",
    "_barrier_d2",
    "_check_start_analytic",
    "_check_start_ball",
    "_check_step",
    "_diag",
    "_largest_circumradius",
    "_line_set",
    "_np",
    "_pad",
    "_rim_segments",
    "_solid_solver",
    "_zero",
    "remember",
    "structural_sum",
]


class SolverCloth(Solver):
    """Implicit-Euler cloth with C-IPC contact (see the module docstring).

    model.cloth holds the shells; the scene's solids are stepped by a PD solver and
    met as moving obstacles; static planes, spheres, boxes and cylinders are analytic
    (tisim.contact.ipc.analytic), the other colliders tessellated into obstacle meshes.
    """

    name = "cloth"
    # A Newton solve that stops at its iteration cap still ends on an intersection-free,
    # strain-feasible iterate (every accepted iterate is): slow, not diverged. It is
    # reported per frame (converged = 0) and never stops the run.
    max_capped_steps = 2**31

    def __init__(self, model, config, *, elastic=None, cloth=None):
        super().__init__(model, config)
        from tisim import backend
        from tisim.geometry.topology import edges as mesh_edges

        cp = cloth if cloth is not None else model.cloth
        if cp is None:
            raise ConfigError("solver.type", "the cloth solver needs at least one object with kind = 'cloth'")
        self.cloth = cp
        self.contact = model.scene.contact
        real = backend.real()
        self.nc = cp.vertex_count
        self.offset = cp.offset

        # soft bodies: a PD solver on a model of the solids alone (their vertices come first)
        self.solid_solver = None
        if model.solid_vertex_count > 0 and cloth is None:
            self.solid_solver = _solid_solver(model, config.solids)

        # obstacles: collider meshes and solid surfaces, after the cloth vertices; curved
        # colliders are met a sag allowance farther out, for the largest triangle the strain
        # limit lets the cloth stretch to (or by NO_LIMIT_STRETCH without a limit)
        stretch = config.strain_limit if config.strain_limit > 0 else NO_LIMIT_STRETCH
        self.circumradius = stretch * _largest_circumradius(cp.rest, cp.faces)
        self.obstacles = _Obstacles(model, cp, include_solids=cloth is None, circumradius=self.circumradius)
        self.no = self.obstacles.vertex_count
        self.n = self.nc + self.no
        faces_all = np.concatenate([cp.faces, self.obstacles.faces + self.nc]).astype(np.int32)
        self.faces_all = faces_all
        edges_all = mesh_edges(faces_all) if len(faces_all) else np.zeros((0, 2), np.int32)
        if len(self.obstacles.line_edges):
            edges_all = np.concatenate([edges_all, self.obstacles.line_edges + self.nc])
        self.edges_all = edges_all
        x0_obs = self._build_contact(model, config, real)

        self.elastic = (
            elastic
            if elastic is not None
            else ShellTerm(
                self.nc,
                cp.faces,
                cp.hinges,
                cp.rest,
                cp.face_mu,
                cp.face_lam,
                cp.face_thickness,
                cp.hinge_k,
                bending=config.bending,
                lumped_bending=config.bending_hessian == "lumped",
            )
        )
        self.strain = None
        if config.strain_limit > 0:
            from tisim.energies.shell import StrainLimit

            E_t = float(np.mean(2 * cp.face_mu * cp.face_thickness))
            self.strain = _StrainTerm(
                StrainLimit, self.nc, cp.faces, cp.rest, config.strain_limit, config.strain_stiffness * E_t, real
            )
        self._strain_folded = isinstance(self.elastic, ShellTerm) and self.elastic.fold_strain(self.strain)
        # Newton iterations that share one elastic Hessian (the progressive preview sets its own)
        self.hessian_reuse = int(config.hessian_reuse)
        self.planes = self._analytic_colliders()
        self.wind = Wind(model.scene.wind, length_scale=_diag(cp.rest))
        self.linear = SPDSolver(mixed=config.linear_precision == "mixed")
        if config.linear_precision == "mixed" and self.linear.backend != "pardiso":
            log.warning(
                "solver.linear_precision = 'mixed' needs MKL PARDISO (pip install mkl); "
                "the Newton systems are solved in double precision by %s",
                self.linear.backend,
            )
        self.system = SystemAssembler(self.n)
        self.reuse_start_energy = True  # False: every line search evaluates its start (tests)
        self.reuse_detection = True  # False: a step's first detection is never the last step's (tests)
        # the scene's scale for tolerances: the cloth's size (a large ground plane or
        # obstacle must not loosen the Newton tolerance)
        self.bbox_diag = max(_diag(cp.rest), 1e-6)
        self.kappa = self.contact.kappa if self.contact.kappa > 0 else 0.0
        self.kappa_max = math.inf
        # observer of the Newton loop (tests): on_accept(x, x_new, p, E, E_new) after each
        # accepted line search, x_new = x + alpha p, with the incremental potential's values
        # the line search compared, before the barrier stiffness adapts
        self.on_accept = None
        self.self_contact = config.self_contact
        self.gravity = np.asarray(model.gravity, dtype=np.float64)
        if cloth is None:
            self.check_start(model.initial_positions[cp.vertex_slice], x0_obs)
        self._stats_total = {"steps": 0, "newton": 0, "ccd_clamps": 0, "max_kinematic_lag": 0.0}
        self._lag_warned = False
        # the contact kernels compile now, not at the first contact (a second's freeze)
        self.barrier.compile_kernels(
            self.x, self.broad.pt, self.broad.ee, self.g, self.system.unknowns, friction=self.friction
        )
        self.friction.compile_kernels(self.x, self.broad.pt, self.broad.ee, self.g, self.vertex_mu)
        self.system.compile_kernels(self.barrier.hessians, self.barrier.stencils)

    def _analytic_colliders(self):
        """The static analytic colliders (the name ``planes`` is kept from when only planes
        were), with the contact thickness and each one's friction coefficient."""
        from tisim.contact.ipc.analytic import AnalyticColliders, shape_of

        an = self.obstacles.analytic
        return AnalyticColliders(
            [shape_of(c, thickness=self.contact.thickness, circumradius=self.circumradius) for c in an],
            [self.contact.mu if c.friction is None else c.friction for c in an],
            self.nc,
        )

    def _build_contact(self, model, config, real) -> np.ndarray:
        """The broad phase over the cloth and the obstacles, the rest-state exclusion, the
        barrier and friction potentials and the device arrays the Newton loop works in.
        Returns the obstacles' positions at t = 0 (no, 3), m."""
        import taichi as ti

        from tisim import backend
        from tisim.contact.ipc.broad_phase import BroadPhase
        from tisim.contact.ipc.potential import BarrierPotential, FrictionPotential

        cp = self.cloth
        faces_all, edges_all = self.faces_all, self.edges_all
        active = np.zeros(self.n, dtype=bool)
        active[: self.nc] = True
        self.broad = BroadPhase(self.n, faces_all, edges_all.astype(np.int32), active)
        # self-contact pairs already within the barrier's reach at rest (slivers, narrow
        # slits) are left out of every detection: start check, barrier, friction, CCD
        self.exclusion = None
        if config.self_contact:
            from tisim.contact.ipc.exclusion import RestExclusion

            self.exclusion = RestExclusion(cp.rest, cp.faces, cp.edges, self.contact.thickness + self.contact.dhat)
        self._last_pairs = (0, 0)  # the counts of the list in the broad phase's buffers
        # (inflation, positions) of the static detection the buffers hold, None after any other
        self._detected_at = None
        self.cloth_mass = np.asarray(cp.mass, dtype=np.float64)
        x0_obs = self.obstacles.positions(0.0, model.initial_positions)
        rest_all = np.concatenate([cp.rest, x0_obs]) if self.no else cp.rest.copy()
        self.barrier = BarrierPotential(self.n, 1024, rest_all)
        # the narrow pairs (a slit's lips): a second batch with a thinner contact
        self.narrow = None
        if self.exclusion is not None and self.exclusion.narrow_count:
            from tisim.solvers.cloth.narrow import NarrowPairs

            c = self.contact
            self.narrow = NarrowPairs(self.n, rest_all, self.exclusion.scale, c.thickness, c.dhat)
        self.friction = FrictionPotential(self.n, 1024)
        # static spheres met by the triangles exactly, each a batch of its own
        from tisim.solvers.cloth.balls import BallPairs

        c = self.contact
        self.balls = [
            BallPairs(self.n, rest_all, self.nc + k, b.radius, c.thickness, c.dhat, cp.faces)
            for b, k in self.obstacles.balls
        ]
        self.x = ti.Vector.ndarray(3, real, shape=self.n)
        self.dx = ti.Vector.ndarray(3, real, shape=self.n)
        self.x_ref = ti.Vector.ndarray(3, real, shape=self.n)
        self.g = ti.Vector.ndarray(3, real, shape=self.n)
        self.vertex_mu = ti.ndarray(real, shape=self.n)
        mu = np.concatenate([cp.vertex_mu, self.obstacles.vertex_mu])
        mu = np.where(np.isnan(mu), self.contact.mu, mu)
        upload(self.vertex_mu, mu.astype(backend.np_real()))
        return x0_obs

    def check_start(self, xc: np.ndarray, x_obs: np.ndarray, advice: str = "separate them") -> None:
        """Refuse a start state that intersects or comes closer than the contact
        thickness: the barrier needs a strictly feasible start. Raises MeshError naming
        the pair (cloth self-intersection, cloth and a collider) and the distance;
        ``advice`` ends the message for two primitives within the thickness."""
        from tisim.geometry.cloth import check_intersection_free
        from tisim.geometry.mesh import MeshError

        cp = self.cloth
        src = self.model.scene.path
        xi = self.contact.thickness
        check_intersection_free(xc, cp.faces, cp.edges, source=src)
        if self.no:
            obs = self.obstacles
            for (c, _, _), rows in zip(obs.parts, obs.part_faces):
                name = f"collider {c.name!r}" if c is not None else "a soft body's surface"
                check_intersection_free(
                    xc, cp.faces, cp.edges, source=src, other=(x_obs, obs.faces[rows]), other_name=name
                )
        for shape, c in zip(self.planes.shapes, self.obstacles.analytic):
            _check_start_analytic(xc, cp.faces, cp.edges, shape, c, xi, src)
        if self.no:
            # a cloth wholly inside a closed tessellated collider crosses nothing: test one
            # vertex (none crosses the surface, checked above)
            from tisim.geometry.winding import is_closed, winding_numbers

            for (c, _, _), rows in zip(self.obstacles.parts, self.obstacles.part_faces):
                if c is None or c in self.obstacles.analytic:
                    continue
                if c.kind == "mesh":
                    F = self.obstacles.faces[rows]
                    inside = is_closed(F) and abs(winding_numbers(xc[:1], x_obs, F)[0]) > 0.5
                else:  # a moving analytic collider, tessellated: its own distance at t = 0
                    inside = bool((c.distance(xc, 0.0) < 0).all())
                if inside:
                    raise MeshError(
                        f"the cloth starts inside {c.kind} collider {c.name!r}: move the cloth out of it", src
                    )
        x = np.concatenate([xc, x_obs]) if self.no else xc
        upload(self.x, x)
        n_pt, n_ee = self._detect(xi + 1e-12)
        for ball, (c, _) in zip(self.balls, self.obstacles.balls):
            _check_start_ball(xc, ball, c, self.x, src)
        narrow = self.narrow
        d = narrow.min_distance(self.x) if narrow is not None else math.inf
        if narrow is not None and d <= narrow.xi:
            raise MeshError(
                f"two parts of the cloth that are narrow at rest (a slit's lips) start {d:.3g} m apart, within "
                f"their own contact thickness {narrow.xi:.3g} m (set from their rest distance): start "
                f"them at least that far apart",
                src,
            )
        if n_pt + n_ee:
            dmin = self.barrier.min_distance(self.x, self.broad.pt, n_pt, self.broad.ee, n_ee)
            if dmin <= xi:
                what, obstacle = self._closest_pair(x, n_pt, n_ee)
                # (an object's own `thickness` key is the shell's, for its mass and bending)
                tail = (
                    "move the cloth away from it"
                    if obstacle
                    else f"{advice}, or set contact.thickness = {0.9 * dmin:.2g} (objects' own `thickness` "
                    f"is the shell's, for mass and bending)"
                )
                raise MeshError(f"{what} start {dmin:.3g} m apart, within the contact thickness {xi:g} m: {tail}", src)

    def _closest_pair(self, x: np.ndarray, n_pt: int, n_ee: int) -> tuple[str, bool]:
        """The closest of the detected pairs at x (n, 3), in words ("cloth vertex 3 and
        a triangle (vertices 10, 11, 12) of collider 'sphere'"), and whether it involves
        an obstacle. For a start-up message: a loop over the few pairs within the
        thickness."""
        from tisim.geometry.distances import point_triangle_distance, segment_segment_distance

        best = (math.inf, None, None)
        for kind, arr, k in (("pt", self.broad.pt, n_pt), ("ee", self.broad.ee, n_ee)):
            for row in download(arr)[:k]:
                a, b, c, d = (x[int(i)] for i in row)
                dist = point_triangle_distance(a, b, c, d) if kind == "pt" else segment_segment_distance(a, b, c, d)
                if dist < best[0]:
                    best = (dist, kind, [int(i) for i in row])
        _, kind, row = best
        if kind is None:
            return "two primitives", False
        groups = [row[:1], row[1:]] if kind == "pt" else [row[:2], row[2:]]
        words = [
            self._describe(ids, "vertex" if len(ids) == 1 else "edge" if len(ids) == 2 else "triangle")
            for ids in groups
        ]
        return f"{words[0]} and {words[1]}", any(i >= self.nc for i in row)

    def _describe(self, ids: list[int], kind: str) -> str:
        """A primitive given by its vertex ids in the solver's numbering, in words."""
        nc = self.nc
        if all(i < nc for i in ids):
            return f"cloth {kind} " + (str(ids[0]) if len(ids) == 1 else f"({', '.join(map(str, ids))})")
        j = min(ids) - nc
        start = 0
        for c, _, count in self.obstacles.parts:  # noqa: B007 (the part found is read after the loop)
            if j < start + count:
                break
            start += count
        name = f"collider {c.name!r}" if c is not None else "a soft body's surface"
        local = [i - nc - start for i in ids]
        return (
            f"vertex {local[0]} of {name}"
            if len(local) == 1
            else f"a {kind} (vertices {', '.join(map(str, local))}) of {name}"
        )

    # ------------------------------------------------------------------ public
    def inversion_is_divergence(self) -> bool:
        # the scene's solids are stepped by a PD solver: its rule
        return self.solid_solver is None or self.solid_solver.inversion_is_divergence()

    def info(self) -> dict:
        return {
            "linear_solver": self.linear.backend,
            "cloth_vertices": self.nc,
            "obstacle_vertices": self.no,
            "analytic_colliders": [c.name for c in self.analytic_colliders],
            "cloth_faces": int(len(self.cloth.faces)),
            "barrier_stiffness": self.kappa,
            "totals": dict(self._stats_total),
        }

    def tunables(self) -> list[Tunable]:
        return [Tunable("contact.mu", float(self.contact.mu), 0.0, 2.0)]

    def set_tunable(self, name: str, value: float) -> None:
        if name != "contact.mu":
            raise KeyError(name)
        import dataclasses

        from tisim import backend

        self.contact = dataclasses.replace(self.contact, mu=float(value))
        mu = np.concatenate([self.cloth.vertex_mu, self.obstacles.vertex_mu])
        upload(self.vertex_mu, np.where(np.isnan(mu), value, mu).astype(backend.np_real()))

    def potential_energy(self, positions: np.ndarray) -> float:
        xc = positions[self.cloth.vertex_slice]
        exact = getattr(self.elastic, "exact_energy", None)
        E = exact(xc) if exact is not None else self.elastic.evaluate(xc, energy_only=True)[0]
        return float(E - (self.cloth_mass[:, None] * xc * self.gravity).sum())

    def collision_state(self, state):
        """The contact surfaces of ``state``, for independent checks: (vertices (n, 3),
        faces (m, 3), planes [(point, unit normal), ...]): cloth vertices first, then the
        obstacle meshes (and line sets: ``edges_all`` holds their edges) where the last
        step left them; planes are analytic, and so are ``analytic_colliders``."""
        obs = state.warm.get("cloth_obstacles")
        if obs is None:
            obs = self.obstacles.positions(state.time, state.positions)
        V = np.concatenate([state.positions[self.cloth.vertex_slice], obs])
        return V, self.faces_all, self.planes.planes

    @property
    def analytic_colliders(self) -> list:
        """The static colliders met analytically (``Collider``s: plane, sphere, box,
        cylinder); ``collision_state`` gives only the planes among them, an independent
        check measures the others with ``Collider.distance``. The box edges and cylinder
        rims are also line sets among the obstacle vertices (``edges_all``)."""
        return list(self.obstacles.analytic) + [b for b, _ in self.obstacles.balls]

    def step(self, state_in, state_out, dt: float) -> StepStats:
        t0 = time.perf_counter()
        sl = self.cloth.vertex_slice
        t1 = state_in.time + dt
        np.copyto(state_out.positions, state_in.positions)
        np.copyto(state_out.velocities, state_in.velocities)
        timings = {}
        if self.solid_solver is not None:
            ns = self.model.solid_vertex_count
            sin, sout = _SolidView(state_in, ns), _SolidView(state_out, ns)
            self.solid_solver.set_grab_force(None if self._grab_force is None else self._grab_force[:ns])
            self.solid_solver.step(sin, sout, dt)
            timings["solids"] = (time.perf_counter() - t0) * 1e3
        obs_start = state_in.warm.get("cloth_obstacles")
        if obs_start is None:
            obs_start = self.obstacles.positions(state_in.time, state_in.positions)
        obs_target = self.obstacles.positions(t1, state_out.positions)
        xc = state_in.positions[sl]
        vc = state_in.velocities[sl]
        x_hat = xc + dt * vc
        f_ext = self.cloth_mass[:, None] * self.gravity
        f_ext = f_ext + self.wind.forces(state_in.time, xc, vc, self.cloth.faces)
        if self._grab_force is not None:  # the live window's grab, met inside the IPC solve
            f_ext = f_ext + self._grab_force[sl]
        idx, tgt = self._held(t1)
        res = self.solve(xc, x_hat, dt, f_ext=f_ext, obstacles=(obs_start, obs_target), held=(idx, tgt))
        state_out.positions[sl] = res.x
        state_out.velocities[sl] = (res.x - xc) / dt
        state_out.time = t1
        state_out.warm["cloth_obstacles"] = self._last_obstacles.copy()
        timings.update(res.timings)
        self._stats_total["steps"] += 1
        self._stats_total["newton"] += res.iterations
        self._stats_total["ccd_clamps"] += res.ccd_clamps
        lag = res.kinematic_lag
        self._stats_total["max_kinematic_lag"] = max(self._stats_total["max_kinematic_lag"], lag)
        if lag > 1e-3 * self.bbox_diag and not self._lag_warned:
            self._lag_warned = True
            log.warning(
                "cloth: at t = %.3g s held vertices (or a moving obstacle) are %.3g m behind their "
                "prescribed path: the strain limit (solver.strain_limit = %g) or a contact blocks it; "
                "stats.csv's kinematic_lag follows it",
                t1,
                lag,
                self.config.strain_limit,
            )
        pot = self.potential_energy(state_out.positions)
        return StepStats(
            iterations=res.iterations,
            residual=res.residual,
            converged=res.converged,
            potential=pot,
            n_contacts=res.n_contacts,
            max_penetration=0.0,
            timings=timings,
            extra={
                "newton_iterations": res.iterations,
                "min_distance": res.min_distance,
                "ccd_clamps": res.ccd_clamps,
                "max_strain": res.max_strain,
                "barrier_stiffness": self.kappa,
                "kinematic_lag": res.kinematic_lag,
            },
        )

    def _held(self, t: float):
        idx, tgt, _ = self.held_vertices(t)
        sl = self.cloth.vertex_slice
        keep = (idx >= sl.start) & (idx < sl.stop)
        return idx[keep] - sl.start, tgt[keep]

    # ------------------------------------------------------------------ Newton
    def solve(
        self, xc, x_hat, h, *, f_ext=None, obstacles=None, held=None, tolerance=None, max_iterations=None
    ) -> StepResult:
        """One implicit step: minimise the incremental potential from ``xc``.

        xc: (nc, 3) cloth positions at the start (intersection-free), m. x_hat: (nc, 3)
        inertial target, m. h: time step, s. f_ext: (nc, 3) constant external force, N
        (default gravity). obstacles: (start (no, 3), target (no, 3)) obstacle positions.
        held: (indices (k,), targets (k, 3)) prescribed cloth vertices.
        tolerance: overrides config.tolerance (relative to the scene size per second).
        """
        _check_step(x_hat - xc, "the inertial motion (velocity times the time step)", self.bbox_diag)
        return NewtonLoop(self).run(
            xc,
            x_hat,
            h,
            f_ext=f_ext,
            obstacles=obstacles,
            held=held,
            tolerance=tolerance,
            max_iterations=max_iterations,
        )

    def _friction_bound(self, friction_on: bool, plane_friction: bool) -> float:
        """sum mu lambda over the lagged friction contacts (N): the most friction they give."""
        total = 0.0
        if friction_on and self.friction.rows:
            total += float(download(self.friction.coef)[: self.friction.rows].sum())
        if plane_friction:
            total += self.planes.friction_bound()
        return total + sum(ball.friction_bound() for ball in self.balls)

    def _friction_held_step(self, p, p_H_p, free, h, friction_parts, moved, eps_v) -> tuple[float, float, float, bool]:
        """The Newton convergence measures of a step p with friction's stiffness taken out.

        p: (n, 3) Newton step, m; p_H_p: p^T H p (J); free: (n,) vertices whose step
        counts; friction_parts: (the analytic planes' friction (vertices, 3 x 3 blocks)
        list, [(a FrictionPotential, its row count in its local Hessians)]).
        moved: (nc, 3) the cloth's displacement since the step's start, m; eps_v: the
        friction smoothing velocity, m/s. Returns, in m/s, (max_i |q_i| / h,
        sqrt((p^T H p + p^T K_f p + h^2 sum_i |K_f p|_i^2 / m_i) / M), the largest
        |q_i| / h over the vertices with friction that moved less than
        STICK_SLIP_ZONE eps_v h), where q = p + h^2 M^-1 K_f p and K_f is the friction
        Hessian at the iterate; and whether any vertex has friction at all.

        Why: (M / h^2 + K_f + K) p = -g, so q is the step that inertia alone would take
        under the forces that friction's stiffness is holding back. The smoothed friction
        f0 is concave in the slip beyond zero (its stiffness falls from 2 mu lambda /
        (eps_v h) at zero slip to nothing at eps_v h), so Newton from a sticking start
        undershoots the slip by up to that stiffness over inertia's, m / h^2: about 40 for
        cloth on a plane at h = 0.01 s, far more than the tolerance leaves. Against
        inertia alone the shortfall is bounded, whatever the friction's state; at a
        solution that sticks or slides q -> 0 with p, so the test still ends there.
        """
        nc = self.nc
        Kp = np.zeros((nc, 3))
        touched = np.zeros(nc, dtype=bool)
        for vb, B in friction_parts[0]:
            Kp[vb] += np.einsum("mij,mj->mi", B, p[vb])
            touched[vb] = True
        for fp, rows in friction_parts[1]:
            if not rows:
                continue
            H = download(fp.hessians)[:rows]
            st = download(fp.stencils)[:rows].astype(np.int64)
            ok = st >= 0
            P = np.where(ok[:, :, None], p[np.where(ok, st, 0)], 0.0).reshape(rows, 12)
            HP = np.einsum("kij,kj->ki", H, P).reshape(rows, 4, 3)
            cloth = ok & (st < nc) & (download(fp.coef)[:rows] > 0)[:, None]
            np.add.at(Kp, st[cloth], HP[cloth])
            touched[st[cloth]] = True
        m = self.cloth_mass
        q = p[:nc] + (h * h / m)[:, None] * Kp
        fc = free[:nc]
        residual = float(np.abs(q[fc]).max(initial=0.0)) / h
        m_free = float(m[fc].sum())
        # sum m |q|^2 / h^2 = sum m |p|^2 / h^2 + 2 p.K_f p + h^2 sum |K_f p|^2 / m, and
        # p^T H p holds the first two terms once each
        hidden = float((p[:nc][fc] * Kp[fc]).sum()) + h * h * float(((Kp[fc] ** 2).sum(axis=1) / m[fc]).sum())
        v_dec = math.sqrt(max(float(p_H_p), 0.0) + hidden) / math.sqrt(m_free) if m_free > 0 else 0.0
        zone = fc & touched
        if moved is not None:
            zone &= np.linalg.norm(moved, axis=1) < STICK_SLIP_ZONE * eps_v * h
        slip = float(np.abs(q[zone]).max(initial=0.0)) / h
        return residual, v_dec, slip, bool(touched.any())

    # ------------------------------------------------------------------ contact helpers
    def _detect(self, inflation: float, alpha: float | None = None, at: np.ndarray | None = None) -> tuple[int, int]:
        """Candidate pairs near self.x (swept along self.dx * alpha when alpha is given).
        at: self.x's values (n, 3), given for a static detection that may repeat the last
        one (a step starts where the last one's statistics detected): then the buffers,
        which still hold that list, are kept."""
        key = None if at is None or alpha is not None else (float(inflation), np.array(at, dtype=np.float64))
        last = self._detected_at
        if (
            key is not None
            and last is not None
            and self.reuse_detection
            and last[0] == key[0]
            and np.array_equal(last[1], key[1])
        ):
            return self._last_pairs
        self._detected_at = None
        if alpha is None:
            n_pt, n_ee = self.broad.detect(self.x, inflation)
        else:
            n_pt, n_ee = self.broad.detect(self.x, inflation, dx=self.dx, alpha=alpha)
        if self.balls:
            x = download(self.x)
            dx = None if alpha is None else alpha * download(self.dx)
            for ball in self.balls:
                ball.detect(x, inflation, dx)
        if not self.self_contact:
            n_pt, n_ee = self._drop_self_pairs(n_pt, n_ee)
        elif self.exclusion is not None and self.exclusion.count:
            n_pt, n_ee = self._drop_self_pairs(n_pt, n_ee, self.exclusion)
        self._last_pairs = (n_pt, n_ee)
        self._detected_at = key
        return n_pt, n_ee

    def _drop_self_pairs(self, n_pt, n_ee, exclusion=None):
        """Keep only pairs that involve an obstacle (self-contact off), or, given a
        RestExclusion, drop the self-contact pairs it leaves out and move its narrow
        pairs to ``self.narrow`` (in place, order kept)."""
        from tisim.contact.ipc.exclusion import KEEP, NARROW

        nc = self.nc
        out, narrow = [], []
        for kind, f, k in (("pt", self.broad.pt, n_pt), ("ee", self.broad.ee, n_ee)):
            narrow.append(np.zeros((0, 4), dtype=np.int32))
            if k == 0:
                out.append(0)
                continue
            rows = download(f)[:k]
            if exclusion is None:
                keep = rows[(rows >= nc).any(axis=1)]
            else:
                code = exclusion.classify(kind, rows)
                narrow[-1] = rows[code == NARROW]
                if (code == KEEP).all():
                    out.append(k)
                    continue
                keep = rows[code == KEEP]
            if len(keep):
                buf = download(f)
                buf[: len(keep)] = keep
                upload(f, buf)
            out.append(len(keep))
        if self.narrow is not None and exclusion is not None:
            self.narrow.store(*narrow)
        return out[0], out[1]

    def _move_is_safe(self, x, d, inflation: float) -> bool:
        """Whether moving x (n, 3) by d (n, 3) keeps the strain limit and is collision-free."""
        nc = self.nc
        if self.strain is not None and not self.strain.feasible(x[:nc] + d[:nc]):
            return False
        upload(self.x, x)
        upload(self.dx, d)
        if self._ccd(self._detect(inflation, 1.0)) < 1.0:
            return False
        planes = self.planes
        return not planes or planes.max_step(x[:nc], d[:nc], self.contact.thickness, self.config.ccd_eta) >= 1.0

    def _ccd(self, pairs) -> float:
        """The CCD bound on the step self.dx from self.x over the narrow pairs, the spheres'
        rows and the scene's ``pairs``: the smallest of their bounds (exact: a minimum of
        per-pair times), two batches a launch."""
        from tisim.contact.ipc.ccd import max_step, max_step_two

        batches = [b.ccd_batch() for b in ([self.narrow] if self.narrow is not None else []) + self.balls if b]
        if sum(pairs):
            batches.append((self.broad.pt, pairs[0], self.broad.ee, pairs[1], self.contact.thickness))
        toi = 1.0
        for i in range(0, len(batches) - 1, 2):
            toi = min(toi, *max_step_two(self.x, self.dx, batches[i], batches[i + 1]))
        if len(batches) % 2:
            toi = min(toi, float(max_step(self.x, self.dx, *batches[-1])))
        return toi

    def _init_kappa(self, x, x_hat, f_ext, h, n_pt, n_ee):
        """IPC's initial barrier stiffness: balance the barrier's gradient against the
        rest of the potential's, clamped to a range set by the average mass; and the cap
        of its later doubling (``contact.kappa_max_ratio`` times the range's minimum)."""
        nc = self.nc
        dhat, xi = self.contact.dhat, self.contact.thickness
        s_hat = dhat * dhat + 2 * dhat * xi
        d0 = (1e-8 * self.bbox_diag + xi) ** 2 - xi * xi
        if d0 >= s_hat:
            d0 = 0.5 * s_hat
        m_avg = float(self.cloth_mass.mean())
        k_min = 1e11 * m_avg / (4 * (d0 + xi * xi) * _barrier_d2(d0, s_hat))
        # IPC's range for the starting value, [k_min, 100 k_min]; the doubling in the
        # Newton loop may go further, up to kappa_max_ratio k_min: IPC's cap of 100 k_min
        # binds for light cloth at impact, whose gaps then shrink to 1e-10..1e-6 m, and a
        # step sliding at such a gap is cut by CCD to a few % of its length (a 65 x 65
        # drape, frames 18-39: 774 against 426 Newton iterations; five frames had reached
        # the limit of 50)
        self.kappa_max = self.contact.kappa_max_ratio * k_min
        ge = np.zeros((self.n, 3))
        ge[:nc] = (x[:nc] - x_hat) * self.cloth_mass[:, None] / (h * h) - f_ext
        ge[:nc] += self.elastic.evaluate(x[:nc], hessian=False)[1]
        _zero(self.g)
        if n_pt + n_ee:
            self.barrier.add_gradient(self.x, self.broad.pt, n_pt, self.broad.ee, n_ee, dhat, xi, 1.0, self.g)
        for ball in self.balls:
            ball.add_gradient(self.x, 1.0, self.g)
        gb = download(self.g)
        if self.planes:
            gb[:nc] += self.planes.gradient_hessian(x[:nc], dhat, xi, 1.0, hessian=False)[0]
        nb = float((gb * gb).sum())
        k = -float((gb * ge).sum()) / nb if nb > 0 else k_min
        self.kappa = float(min(max(k, k_min), 100.0 * k_min))
        log.debug("barrier stiffness %.3g (range %.3g .. %.3g)", self.kappa, k_min, self.kappa_max)
