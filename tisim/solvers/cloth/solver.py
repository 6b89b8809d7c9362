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

References:
    Li et al., "Codimensional Incremental Potential Contact" (C-IPC), SIGGRAPH 2021;
    Li et al., "Incremental Potential Contact", SIGGRAPH 2020; notes
    ../shared/papers/progressive-dynamics.md, sections 2.4 and 7.

Limitations:
    One-way coupling with soft bodies (the cloth does not push the body back; two-way
    coupling would put the body's elastic energy and the cloth in one Newton solve).
    Static planes, spheres, boxes and cylinders are met analytically by the cloth's
    vertices (their edges and rims as line sets, docs/colliders.md); moving colliders and
    mesh colliders are tessellated. The wind force is
    explicit (held over a step). The Hessian is assembled on the host.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from tisim.backend import download, upload
from tisim.config import ConfigError
from tisim.solvers.base import Solver, StepStats, Tunable
from tisim.solvers.cloth.assembly import DeviceAssembler, SystemAssembler, structural_sum
from tisim.solvers.cloth.wind import Wind

log = logging.getLogger(__name__)

# Newton iterations in a row in which held vertices get less than 1% closer to their
# targets before they are held where they are for the rest of the step
BLOCKED_AFTER = 3
# Friction vertices slower than this many eps_v in a step are still deciding between stick
# and slip: Newton's test holds them to eps_v (see _friction_held_step's caller). Three
# covers a slide that starts from rest and the first steps of its speeding up.
STICK_SLIP_ZONE = 3.0


# --------------------------------------------------------------------------------------
# linear solves


class SPDSolver:
    """Solves A p = b for the Newton system, A symmetric positive definite by construction
    (PSD-projected element Hessians plus the mass matrix): MKL PARDISO when the ``mkl``
    wheel is there, else CHOLMOD (supernodal), else a scipy sparse LU. The symbolic
    analysis is redone only when A's pattern changes.

    PARDISO factorises the cloth's systems about 4x faster than Debian's CHOLMOD with
    OpenBLAS (the 64 x 64 drape's contact systems, 12,675 dofs: 21.5 against 91.2 ms on
    two cores, ``benchmarks/bench_linear.py``) and repeats its bits at any thread count.

    mixed (PARDISO only; ``solver.linear_precision = "mixed"``): factorise in single
    precision, about 1.4x faster, and refine the solution against A in double precision
    (``b - A x`` in float64, the correction from the float32 factor). The result is
    taken when the last correction is below ``REFINED`` of the solution; otherwise, or
    when the float32 factorisation meets a non-positive pivot, the system is factorised
    in double precision. Measured on the 64 x 64 drape: the same Newton iterations,
    contact frames 3-6% faster, residuals about 1e-9 instead of 1e-13. It is not the
    default because it gives up round-off exactness: the progressive levels' centres of
    mass, equal to 1e-15 of the size with double solves, agree to 1e-12 with it.
    """

    SHIFTS = (1e-12, 1e-10, 1e-8, 1e-6, 1e-4)
    REFINED = 1e-3  # |correction| / |x| at which a mixed-precision solution is taken
    REFINE_STEPS = 2

    def __init__(self, backend: str = "auto", mixed: bool = False):
        from tisim.linalg import pardiso
        from tisim.linalg.cholesky import cholmod_available

        self.cholmod = cholmod_available()
        if backend == "auto":
            backend = "pardiso" if pardiso.available() else "cholmod" if self.cholmod else "scipy"
        if backend == "pardiso" and not pardiso.available():
            raise ValueError("linear solver 'pardiso' needs MKL (pip install mkl)")
        if backend == "cholmod" and not self.cholmod:
            raise ValueError("linear solver 'cholmod' needs scikit-sparse")
        self.backend = backend
        self._pardiso = pardiso.Pardiso() if backend == "pardiso" else None
        self._pardiso32 = pardiso.Pardiso(single=True) if backend == "pardiso" and mixed else None
        self.fallbacks = 0  # mixed-precision solves redone in double precision
        self._blocks = pardiso.BlockUpper(3)
        self._triangle = pardiso.UpperTriangle()
        self._factor = None
        self._pattern = None

    def _mixed(self, A: sp.csr_matrix, U: sp.csr_matrix, b: np.ndarray) -> np.ndarray | None:
        """A^-1 b from the float32 factor with iterative refinement in float64, or None
        when it does not settle (see the class docstring)."""
        from tisim.linalg.pardiso import PardisoError

        try:
            self._pardiso32.factorize(U)
        except PardisoError:  # a pivot at round-off (-4, or -13)
            log.debug("float32 factorisation met a non-positive pivot: double precision")
            return None
        return self._refined(A, b)

    def _refined(self, A: sp.csr_matrix, b: np.ndarray) -> np.ndarray | None:
        """The float32 factor's solution of A x = b refined in float64, or None."""
        pd = self._pardiso32
        x = pd.solve(b)
        for _ in range(self.REFINE_STEPS):
            dx = pd.solve(b - A @ x)
            x += dx
            if np.linalg.norm(dx) <= self.REFINED * np.linalg.norm(x):
                return x
        log.debug("mixed-precision refinement did not settle: double precision")
        return None

    def _upper(self, A: sp.csr_matrix):
        """A's upper part for PARDISO: 3 x 3 blocks (BSR; the cloth's systems) when A is
        made of them, else the upper triangle (CSR)."""
        U = self._blocks(A)
        return U if U is not None else self._triangle(A)

    def _factorize(self, A: sp.csc_matrix) -> None:
        from sksparse.cholmod import cholesky

        if self._factor is None:
            self._factor = cholesky(A, ordering_method="amd")
        else:
            self._factor.cholesky_inplace(A)

    def _shifted(self, A, factorize, errors):
        """Factorise A, or A + delta |diag A| for the smallest delta that works.

        PSD-projected blocks plus the mass matrix are SPD in exact arithmetic; with
        entries many orders above the mass (the handles' penalty, barrier blocks at tiny
        gaps) round-off can leave a pivot negative (seen in cloth-twist). The shift
        (Levenberg-Marquardt) keeps the step a descent direction."""
        try:
            factorize(A)
            return
        except errors:
            pass
        d = np.abs(A.diagonal())
        for delta in self.SHIFTS:
            try:
                factorize(A + sp.diags(delta * d, format=A.format))
                log.debug("Newton system not positive definite to round-off: shifted by %g diag", delta)
                return
            except errors:
                continue
        raise np.linalg.LinAlgError("Newton system not positive definite, even shifted by 1e-4 of its diagonal")

    def solve(self, A, b: np.ndarray) -> np.ndarray:
        """A^-1 b. A: the SPD system (scipy sparse), or the ``SystemAssembler`` that holds
        it: then PARDISO in double precision takes its 3 x 3 block upper triangle
        (``block_upper``) and the CSR matrix is not formed unless needed."""
        from tisim.linalg.pardiso import PardisoError

        if not sp.issparse(A):
            system = A
            blocks = system.block_upper() if self.backend == "pardiso" and self._pardiso32 is None else None
            if blocks is not None and blocks.shape[0] > 0:
                try:
                    self._pardiso.factorize(blocks)
                    return self._pardiso.solve(b)
                except PardisoError as e:
                    # a pivot at round-off: with blocks PARDISO reports -4 or -13 (a rank-one
                    # 1e12 block over a massless vertex gave -13); the CSR path below shifts
                    log.debug("block factorisation failed (%s): the CSR matrix, shifted", e)
            A = system.matrix()
        if A.shape[0] == 0:  # every vertex fixed: nothing to solve
            return np.zeros(0)
        if self.backend == "pardiso":
            if self._pardiso32 is not None:
                # (the float32 factorisation takes the CSR triangle: with 3 x 3 blocks it was
                # slower than in double and failed with error -13 on a pinned sheet)
                x = self._mixed(A, self._triangle(A), b)
                if x is not None:
                    return x
                self.fallbacks += 1
            U = self._upper(A)
            # (a shifted A's upper part is made again: a shift is rare). A pivot at round-off
            # is reported as -4 or, depending on how MKL's threads split the work, -13 (seen
            # on the scalar triangle too when the machine was loaded): both are shifted
            self._shifted(A, lambda M: self._pardiso.factorize(U if M is A else self._upper(M)), PardisoError)
            return self._pardiso.solve(b)
        A = sp.csc_matrix(A)
        if self.backend == "cholmod":
            from sksparse.cholmod import CholmodNotPositiveDefiniteError

            from tisim.linalg.pardiso import same_pattern

            A.sort_indices()
            # the symbolic analysis (ordering, elimination tree) is reused for the same pattern
            if not same_pattern(A, self._pattern):
                self._factor = None

            def factorize(M):
                try:
                    self._factorize(M)
                except CholmodNotPositiveDefiniteError:
                    self._factor = None  # a fresh analysis: the failed factor's state is not reused
                    raise

            self._shifted(A, factorize, CholmodNotPositiveDefiniteError)
            self._pattern = (A.indptr.copy(), A.indices.copy()) if self._factor is not None else None
            return self._factor(b)
        import scipy.sparse.linalg as spla

        return spla.spsolve(A, b)


# --------------------------------------------------------------------------------------
# terms


class ShellTerm:
    """The shell's elastic energy on a level's own mesh: membrane + bending.

    The interface every elastic term offers the Newton solver (the progressive driver
    substitutes the finest level's energy through prolongation):
    ``evaluate(x, hessian) -> (energy J, gradient (n, 3), Hessian or None)``, the
    Hessian a PSD scipy sparse matrix over the cloth block's scalar dofs 3 v + axis.
    Membrane Hessians are projected per element; bending uses its Gauss-Newton part
    c grad(theta) grad(theta)^T (PSD by construction; notes §7).

    lumped_bending (``solver.bending_hessian = "lumped"``): a hinge's term c g g^T
    (g = grad theta over (e0, e1, o0, o1)) couples its two opposite vertices, which share
    no face: the only blocks of the Newton matrix outside the membrane's pattern, and on a
    regular sheet most of the factor's fill (64 x 64 vertices: 2.5M factor non-zeros with
    them, 0.95M without; PARDISO 12.3 against 3.4 ms on the bare pattern). Lumped, the
    hinge adds c (g g^T + u u^T) with u = ((g_o1 - g_o0) / 2, (g_o1 - g_o0) / 2, g_o0,
    -g_o1): its (o0, o1) block is zero, and g g^T + u u^T is the sum of two rank-one
    terms each on one of the hinge's faces, (g + u)(g + u)^T / 2 on (e0, e1, o0) and
    (g - u)(g - u)^T / 2 on (e0, e1, o1). It is PSD and above the Gauss-Newton term, so
    every Newton step is still a descent direction; u sums to zero over the hinge like
    g, so rigid translations stay in the matrix's null space (Newton steps keep the
    momentum as before); the gradient and the energy are exact, so the fixed point is
    the same. The decrement is measured in that matrix's metric, which still bounds the
    mass-weighted RMS of the step the solver takes (every term is PSD over M / h^2).
    """

    def __init__(self, vertex_count, faces, hinges, rest, mu, lam, thickness, bending_k, bending=True,
                 lumped_bending=False):
        import taichi as ti

        from tisim import backend
        from tisim.energies.shell import ShellEnergy, shell_rest

        real = backend.real()
        self.n = vertex_count
        hinges = hinges if bending else np.zeros((0, 4), dtype=np.int32)
        self.rest = shell_rest(rest, faces, hinges)
        self.energy_obj = ShellEnergy(vertex_count, faces, hinges, self.rest, mu, lam, thickness,
                                      bending_k if bending else np.zeros(len(hinges)))
        self.x = ti.Vector.ndarray(3, real, shape=max(vertex_count, 1))
        self.g = ti.Vector.ndarray(3, real, shape=max(vertex_count, 1))
        self.faces = faces
        self.hinges = hinges
        self._psd_b = None
        self.gauss_newton_bending = True
        e = self.energy_obj
        parts = [_np(e.face_stencils)] + ([_np(e.hinge_stencils)] if len(hinges) else [])
        self.lumped_bending = bool(lumped_bending)
        couplings = [None, HINGE_LUMPED_COUPLINGS if self.lumped_bending else None][: len(parts)]
        self.assembler = DeviceAssembler(3 * vertex_count, parts, couplings)
        # F-space (6 x 6) membrane Hessians, projected there (see shell_kernels.shell_hessian_f)
        self._hf = ti.ndarray(real, shape=(max(len(faces), 1), 6, 6))
        # per hinge: grad theta (12) and the Gauss-Newton factor c (bending_gauss_newton_factors)
        self._gn = ti.ndarray(real, shape=(max(len(hinges), 1), 13))
        # a strain limit on the same faces whose gradient and F-space Hessian are added
        # here (one projection of the sum); set by the solver, see fold_strain
        self.strain = None
        self._last = None  # the last full evaluation, see remember()
        self._energy_at = None  # (x, E) of the last energy-only evaluation

    def fold_strain(self, strain) -> bool:
        """Take over the gradient and Hessian of ``strain`` (a _StrainTerm on this very
        mesh): the sum of the two F-space Hessians is projected once, which is cheaper
        than two projections and closer to the true Hessian. Returns whether it did."""
        if strain is None or not np.array_equal(np.asarray(strain.faces), np.asarray(self.faces)):
            return False
        self.strain = strain
        return True

    def evaluate(self, x: np.ndarray, hessian: bool = True, energy_only: bool = False, folded: bool = True):
        """(E, g, H) of the shell energy at x; ``folded``: the gradient and Hessian include
        a folded strain limit's (``fold_strain``; its energy is the solver's to add).
        The progressive levels evaluate the finest level's term through prolongation with
        ``folded=False``: the finest level's solver folds its strain limit into this very
        object, and the coarser levels, which have strain limits of their own, must not
        get that one's gradient (without its energy) depending on whether the finest
        level's solver was built yet (a preview then differed by 3.8 mm after 3 frames)."""
        # A Newton step starts where the previous one converged, and the previous one's
        # last (confirming) iteration evaluated the Hessian right there: give it back.
        strain = self.strain if folded else None
        last = self._last
        if last is not None and last[4] == (self.gauss_newton_bending, strain) and np.array_equal(last[0], x):
            return last[1], (None if energy_only else last[2]), (last[3] if hessian and not energy_only else None)
        E, g, H = self._evaluate(x, hessian, energy_only, strain)
        if H is not None:
            self._last = remember(x, E, g, H, (self.gauss_newton_bending, strain))
        return E, g, H

    def _evaluate(self, x: np.ndarray, hessian: bool, energy_only: bool, strain=None):
        from tisim.linalg.psd import project_psd

        upload(self.x, x)
        kept = self._energy_at
        if not energy_only and kept is not None and np.array_equal(kept[0], x):
            E = kept[1]  # the line search's last trial, where this Newton iteration starts
        else:
            E = self.energy_obj.energy(self.x)
        if energy_only:
            self._energy_at = (np.array(x, dtype=np.float64), E)
            return E, None, None
        _zero(self.g)
        self.energy_obj.add_gradient(self.x, self.g)
        st = strain
        strain_on = st is not None and st.active_at(x)
        if strain_on:
            st.obj.add_gradient(self.x, self.g)
        g = download(self.g)[: self.n]
        if not hessian:
            return E, g, None
        from tisim.energies import shell_kernels as K

        e = self.energy_obj
        asm = self.assembler
        # membrane (+ strain limit) F-space Hessians, projected from their eigensystem
        o = st.obj if strain_on else None
        K.shell_hessian_f(self.x, e.faces, e.face_data, e.face_data if o is None else o.face_data, 1,
                          int(strain_on), 0.0 if o is None else o.s_max, 0.0 if o is None else o.s_hat,
                          0.0 if o is None else o._tol, 1, self._hf)
        K.gather_face_hessians(e.face_data, self._hf, *asm.incidence[0], asm.indptr, asm.data)  # (zeroes first)
        if len(self.hinges) and self.gauss_newton_bending:
            K.bending_gauss_newton_factors(self.x, e.hinges, e.hinge_data, len(self.hinges), self._gn)
            K.gather_bending_gauss_newton(self._gn, *asm.incidence[1], asm.data, int(self.lumped_bending))
        elif len(self.hinges):
            if self.lumped_bending:
                raise ValueError("the full bending Hessian needs the hinges' couplings in the pattern "
                                 "(solver.bending_hessian = 'coupled')")
            K.bending_hessian(self.x, e.hinges, e.hinge_data, e.bending_hessians, True)
            self._psd_b = project_psd(e.bending_hessians, len(self.hinges), self._psd_b)
            K.scatter_blocks(e.bending_hessians, len(self.hinges), asm.slots[1], asm.data)
        return E, g, asm.matrix()


# a hinge's local vertices (e0, e1, o0, o1): with the bending Hessian lumped, there is no
# block between o0 and o1 (no shared face)
HINGE_LUMPED_COUPLINGS = ~np.array([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=bool)


def remember(x: np.ndarray, E: float, g: np.ndarray, H: sp.csr_matrix, *extra) -> tuple:
    """(x, E, g, H, *extra) for an elastic term's memo of its last full evaluation: a
    copy of x, and g and H's values made read-only (they are the very arrays handed to
    the caller), so that a caller writing into them fails loudly instead of corrupting
    the memo."""
    x = np.array(x, dtype=np.float64)
    for a in (x, g, H.data):
        a.flags.writeable = False
    return (x, E, g, H, *extra)


def _pad(A: sp.csr_matrix, size: int) -> sp.csr_matrix:
    """A square CSR matrix extended with empty rows and columns to ``size``."""
    if A.shape[0] == size:
        return A
    indptr = np.concatenate([A.indptr, np.full(size - A.shape[0], A.indptr[-1], dtype=A.indptr.dtype)])
    return sp.csr_matrix((A.data, A.indices, indptr), shape=(size, size))


def _zero(a) -> None:
    """a[:] = 0 for a Vector ndarray. (ndarray.fill builds and compiles a fresh Taichi
    kernel on every call: 2.5 ms each, 4 calls per Newton iteration.)"""
    from tisim import backend
    from tisim.energies.shell_kernels import zero_vectors

    if not backend.zero(a):
        zero_vectors(a)


def _np(a) -> np.ndarray:
    """A Taichi field or a numpy array as numpy."""
    return a if isinstance(a, np.ndarray) else download(a)


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


# --------------------------------------------------------------------------------------
# the solver


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
        import taichi as ti

        from tisim import backend
        from tisim.contact.ipc.broad_phase import BroadPhase
        from tisim.contact.ipc.potential import BarrierPotential, FrictionPotential
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
        self.friction = FrictionPotential(self.n, 1024)
        self.x = ti.Vector.ndarray(3, real, shape=self.n)
        self.dx = ti.Vector.ndarray(3, real, shape=self.n)
        self.x_ref = ti.Vector.ndarray(3, real, shape=self.n)
        self.g = ti.Vector.ndarray(3, real, shape=self.n)
        self.vertex_mu = ti.ndarray(real, shape=self.n)
        mu = np.concatenate([cp.vertex_mu, self.obstacles.vertex_mu])
        mu = np.where(np.isnan(mu), self.contact.mu, mu)
        upload(self.vertex_mu, mu.astype(backend.np_real()))

        self.elastic = elastic if elastic is not None else ShellTerm(
            self.nc, cp.faces, cp.hinges, cp.rest, cp.face_mu, cp.face_lam, cp.face_thickness, cp.hinge_k,
            bending=config.bending, lumped_bending=config.bending_hessian == "lumped",
        )
        self.strain = None
        if config.strain_limit > 0:
            from tisim.energies.shell import StrainLimit

            E_t = float(np.mean(2 * cp.face_mu * cp.face_thickness))
            self.strain = _StrainTerm(StrainLimit, self.nc, cp.faces, cp.rest, config.strain_limit,
                                      config.strain_stiffness * E_t, real)
        self._strain_folded = isinstance(self.elastic, ShellTerm) and self.elastic.fold_strain(self.strain)
        # Newton iterations that share one elastic Hessian (the progressive preview sets its own)
        self.hessian_reuse = int(config.hessian_reuse)
        from tisim.contact.ipc.analytic import AnalyticColliders, shape_of

        an = self.obstacles.analytic
        # the static analytic colliders (the name ``planes`` is kept from when only planes were)
        self.planes = AnalyticColliders(
            [shape_of(c, thickness=self.contact.thickness, circumradius=self.circumradius) for c in an],
            [self.contact.mu if c.friction is None else c.friction for c in an], self.nc)
        self.wind = Wind(model.scene.wind, length_scale=_diag(cp.rest))
        self.linear = SPDSolver(mixed=config.linear_precision == "mixed")
        if config.linear_precision == "mixed" and self.linear.backend != "pardiso":
            log.warning("solver.linear_precision = 'mixed' needs MKL PARDISO (pip install mkl); "
                        "the Newton systems are solved in double precision by %s", self.linear.backend)
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
        self.barrier.compile_kernels(self.x, self.broad.pt, self.broad.ee, self.g, self.system.unknowns)
        self.friction.compile_kernels(self.x, self.broad.pt, self.broad.ee, self.g, self.vertex_mu)
        self.system.compile_kernels(self.barrier.hessians, self.barrier.stencils)

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
                check_intersection_free(xc, cp.faces, cp.edges, source=src,
                                        other=(x_obs, obs.faces[rows]), other_name=name)
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
                    raise MeshError(f"the cloth starts inside {c.kind} collider {c.name!r}: move the cloth out of it",
                                    src)
        x = np.concatenate([xc, x_obs]) if self.no else xc
        upload(self.x, x)
        n_pt, n_ee = self._detect(xi + 1e-12)
        if n_pt + n_ee:
            dmin = self.barrier.min_distance(self.x, self.broad.pt, n_pt, self.broad.ee, n_ee)
            if dmin <= xi:
                what, obstacle = self._closest_pair(x, n_pt, n_ee)
                # (an object's own `thickness` key is the shell's, for its mass and bending)
                tail = ("move the cloth away from it" if obstacle else
                        f"{advice}, or set contact.thickness = {0.9 * dmin:.2g} (objects' own `thickness` "
                        f"is the shell's, for mass and bending)")
                raise MeshError(f"{what} start {dmin:.3g} m apart, within the contact thickness {xi:g} m: {tail}",
                                src)

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
        words = [self._describe(ids, "vertex" if len(ids) == 1 else "edge" if len(ids) == 2 else "triangle")
                 for ids in groups]
        return f"{words[0]} and {words[1]}", any(i >= self.nc for i in row)

    def _describe(self, ids: list[int], kind: str) -> str:
        """A primitive given by its vertex ids in the solver's numbering, in words."""
        nc = self.nc
        if all(i < nc for i in ids):
            return f"cloth {kind} " + (str(ids[0]) if len(ids) == 1 else f"({', '.join(map(str, ids))})")
        j = min(ids) - nc
        start = 0
        for c, _, count in self.obstacles.parts:
            if j < start + count:
                break
            start += count
        name = f"collider {c.name!r}" if c is not None else "a soft body's surface"
        local = [i - nc - start for i in ids]
        return (f"vertex {local[0]} of {name}" if len(local) == 1
                else f"a {kind} (vertices {', '.join(map(str, local))}) of {name}")

    # ------------------------------------------------------------------ public
    def inversion_is_divergence(self) -> bool:
        # the scene's solids are stepped by a PD solver: its rule
        return self.solid_solver is None or self.solid_solver.inversion_is_divergence()

    def info(self) -> dict:
        return {
            "linear_solver": self.linear.backend,
            "cloth_vertices": self.nc,
            "obstacle_vertices": self.no,
            "analytic_colliders": [c.name for c in self.obstacles.analytic],
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
        return list(self.obstacles.analytic)

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
            log.warning("cloth: at t = %.3g s held vertices (or a moving obstacle) are %.3g m behind their "
                        "prescribed path: the strain limit (solver.strain_limit = %g) or a contact blocks it; "
                        "stats.csv's kinematic_lag follows it", t1, lag, self.config.strain_limit)
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
    def solve(self, xc, x_hat, h, *, f_ext=None, obstacles=None, held=None, tolerance=None,
              max_iterations=None) -> StepResult:
        """One implicit step: minimise the incremental potential from ``xc``.

        xc: (nc, 3) cloth positions at the start (intersection-free), m. x_hat: (nc, 3)
        inertial target, m. h: time step, s. f_ext: (nc, 3) constant external force, N
        (default gravity). obstacles: (start (no, 3), target (no, 3)) obstacle positions.
        held: (indices (k,), targets (k, 3)) prescribed cloth vertices.
        tolerance: overrides config.tolerance (relative to the scene size per second).
        """
        cfg = self.config
        _check_step(x_hat - xc, "the inertial motion (velocity times the time step)", self.bbox_diag)
        T = {"contact": 0.0, "elastic": 0.0, "assemble": 0.0, "linear": 0.0, "ccd": 0.0, "line_search": 0.0}
        nc, n = self.nc, self.n
        if f_ext is None:
            f_ext = self.cloth_mass[:, None] * self.gravity
        if obstacles is None:
            obs = self.obstacles.positions(0.0, self.model.initial_positions)
            obstacles = (obs, obs)
        obs_start, obs_target = obstacles
        x = np.concatenate([xc, obs_start]) if self.no else xc.copy()
        x_start = x.copy()
        target = np.full((n, 3), np.nan)
        if self.no:
            target[nc:] = obs_target
        if held is not None and len(held[0]):
            target[held[0]] = held[1]
        prescribed = ~np.isnan(target[:, 0])
        tol_v = (tolerance if tolerance is not None else cfg.tolerance) * self.bbox_diag
        max_it = max_iterations or cfg.newton_iterations
        stop_on_decrement = getattr(cfg, "stop", "max") == "decrement"
        reuse = max(1, int(self.hessian_reuse))
        mass = self.cloth_mass
        inv_h2 = 1.0 / (h * h)
        dhat, xi = self.contact.dhat, self.contact.thickness
        inflation = dhat + xi

        # vertices whose target is reached are fixed; the others are pulled by a penalty
        def reached(xx):
            d = np.zeros(n)
            d[prescribed] = np.linalg.norm(xx[prescribed] - target[prescribed], axis=1)
            return d

        fixed = prescribed & (reached(x) <= 1e-12 * self.bbox_diag)
        pulled = prescribed & ~fixed
        lag_prev, stalled = float(reached(x).max(initial=0.0)), 0
        w_al = 0.0

        # friction: lag normal forces and tangents at the start of the step
        upload(self.x, x)
        upload(self.x_ref, x)
        t_ = time.perf_counter()
        n_pt, n_ee = self._detect(inflation, at=x)
        planes = self.planes
        near_plane = bool(planes) and planes.active_count(x[:nc], dhat, xi) > 0
        use_friction = self.contact.friction_iterations > 0
        if self.kappa == 0.0 and (n_pt + n_ee or near_plane):
            self._init_kappa(x, x_hat, f_ext, h, n_pt, n_ee)
        if use_friction and (n_pt + n_ee) and self.kappa > 0:
            self.friction.update(self.x, *self.barrier.compact_active(self.x, self.broad.pt, n_pt, self.broad.ee,
                                                                     n_ee, dhat, xi),
                                 dhat, xi, self.kappa, self.vertex_mu)
        if use_friction and planes and self.kappa > 0:
            planes.update_friction(x[:nc], dhat, xi, self.kappa)
        T["contact"] += time.perf_counter() - t_
        friction_on = use_friction and (n_pt + n_ee) > 0 and self.kappa > 0
        plane_friction = use_friction and bool(planes) and self.kappa > 0
        eps_v = self.contact.eps_v

        last_elastic = [math.nan]  # the elastic term's value in the last energy() call
        # the positions array of the last energy() call that evaluated the barrier (its
        # active pairs are kept: compact_active(same_x=True)); None once x changes in place
        # or a detection replaces the pair buffers
        barrier_at = [None]

        def energy(xx, pairs, elastic=None):
            """Total incremental potential at xx (n, 3); pairs = (n_pt, n_ee) candidates;
            elastic: the elastic term's energy at xx when already known."""
            xcc = xx[:nc]
            E = 0.5 * inv_h2 * float((mass[:, None] * (xcc - x_hat) ** 2).sum()) - float((xcc * f_ext).sum())
            last_elastic[0] = self.elastic.evaluate(xcc, energy_only=True)[0] if elastic is None else elastic
            E += last_elastic[0]
            if self.strain is not None:
                E += self.strain.energy(xcc)
            upload(self.x, xx)
            barrier_at[0] = None
            if sum(pairs) and self.kappa > 0:
                E += self.barrier.energy(self.x, self.broad.pt, pairs[0], self.broad.ee, pairs[1], dhat, xi,
                                         self.kappa)
                barrier_at[0] = xx
            if friction_on:
                E += self.friction.energy(self.x, self.x_ref, eps_v, h)
            if planes and self.kappa > 0:
                E += planes.energy(xcc, dhat, xi, self.kappa)
                if plane_friction:
                    E += planes.friction_energy(xcc, eps_v, h)
            if w_al > 0 and pulled.any():
                E += 0.5 * w_al * float(((xx[pulled] - target[pulled]) ** 2).sum())
            return E

        iterations, residual, converged, clamps = 0, math.inf, False, 0
        prev_min_s = math.inf
        pairs = (n_pt, n_ee)
        n_lag = max(1, self.contact.friction_iterations)
        lag_tol = self.contact.friction_lag_tolerance
        bound = self._friction_bound(friction_on, plane_friction)
        for lag in range(n_lag):
            # the potential at the current x, when known: (value, kappa, w_al, elastic term)
            # of the line search that accepted x, so the next line search starts from it
            # instead of a second evaluation at the same point. A change since then
            # invalidates it: the barrier stiffness, the held vertices' penalty, the elastic
            # term's value at x (the progressive levels' prolongation refreshes its offsets
            # with the gradient, which changes the function), or the friction lag (here)
            E_known = None
            if lag > 0:
                # C-IPC friction lagging: normal forces and tangents from the last solve,
                # displacement still measured from the start of the step
                if not converged:
                    break
                upload(self.x, x)
                # contacts that began during the step (a landing) get their friction now
                friction_on = use_friction and sum(pairs) > 0 and self.kappa > 0
                plane_friction = use_friction and bool(planes) and self.kappa > 0
                if friction_on:
                    self.friction.update(self.x, *self.barrier.compact_active(
                        self.x, self.broad.pt, pairs[0], self.broad.ee, pairs[1], dhat, xi,
                        same_x=barrier_at[0] is x),
                        dhat, xi, self.kappa, self.vertex_mu)
                if plane_friction:
                    planes.update_friction(x[:nc], dhat, xi, self.kappa, reference=x_start[:nc])
                # Lagging again is what makes friction see the normal forces of the step's
                # end (a sheet landing on an incline has almost none at its start and slid
                # millimetres before they came); once they settle it changes nothing
                previous, bound = bound, self._friction_bound(friction_on, plane_friction)
                if lag_tol > 0 and abs(bound - previous) <= lag_tol * max(bound, previous):
                    break
                converged = False
            He_kept, kept_for = None, 0
            finishing = False  # converged; the step being taken is the last
            for it in range(max_it):
                iterations += 1
                # gradient and Hessian --------------------------------------------------
                t_ = time.perf_counter()
                kept = He_kept is not None and kept_for < reuse
                if kept:
                    # a kept elastic Hessian (hessian_reuse > 1): the gradient is exact, the
                    # step a descent direction (the kept matrix is PSD), the line search as ever
                    Ee, ge, _ = self.elastic.evaluate(x[:nc], hessian=False)
                    He = He_kept
                    kept_for += 1
                else:
                    Ee, ge, He = self.elastic.evaluate(x[:nc], hessian=True)
                    if reuse > 1:
                        He_kept, kept_for = sp.csr_matrix(He, copy=True), 1
                g = np.zeros((n, 3))
                g[:nc] = inv_h2 * mass[:, None] * (x[:nc] - x_hat) - f_ext + ge
                Hc = He
                if self.strain is not None and not self._strain_folded:
                    gs, Hs = self.strain.gradient_hessian(x[:nc])
                    if gs is not None:
                        g[:nc] += gs
                        Hs = Hs.tocoo()
                        Hc = structural_sum(sp.csr_matrix(Hc), Hs.row, Hs.col, Hs.data)
                pair_parts = []  # (local Hessians, stencils, rows) of the contact pairs
                block_parts = []  # (cloth vertices, 3 x 3 blocks) of the analytic planes
                friction_parts = ([], 0)  # (the planes' friction blocks, friction pair rows)
                T["elastic"] += time.perf_counter() - t_
                t_ = time.perf_counter()
                # the unknowns: free vertices (static obstacles, fixed handles are not), cloth first
                free = ~fixed
                sysvert = np.full(n, -1, dtype=np.int32)
                sysvert[free] = np.arange(int(free.sum()), dtype=np.int32)
                system = self.system
                system.set_unknowns(sysvert)
                upload(self.x, x)
                if sum(pairs) and self.kappa > 0:
                    _zero(self.g)
                    apt, na_pt, aee, na_ee = self.barrier.compact_active(
                        self.x, self.broad.pt, pairs[0], self.broad.ee, pairs[1], dhat, xi,
                        same_x=barrier_at[0] is x)
                    self.barrier.add_gradient(self.x, apt, na_pt, aee, na_ee, dhat, xi, self.kappa, self.g)
                    if friction_on:
                        self.friction.add_gradient(self.x, self.x_ref, eps_v, h, self.g)
                    g += download(self.g)
                    k = self.barrier.local_hessians(self.x, apt, na_pt, aee, na_ee, dhat, xi, self.kappa, True,
                                                    unknowns=system.unknowns)
                    pair_parts.append((self.barrier.hessians, self.barrier.stencils, k))
                    if friction_on:
                        k = self.friction.local_hessians(self.x, self.x_ref, eps_v, h, True)
                        pair_parts.append((self.friction.hessians, self.friction.stencils, k))
                        friction_parts = (friction_parts[0], k)
                if planes and self.kappa > 0:
                    gp, blocks = planes.gradient_hessian(x[:nc], dhat, xi, self.kappa)
                    g[:nc] += gp
                    block_parts.append(blocks)
                    if plane_friction:
                        gf, blocks = planes.friction_gradient_hessian(x[:nc], eps_v, h)
                        g[:nc] += gf
                        block_parts.append(blocks)
                        friction_parts[0].append(blocks)
                T["contact"] += time.perf_counter() - t_
                t_ = time.perf_counter()
                diag = np.zeros((n, 3))
                diag[:nc] = inv_h2 * mass[:, None]
                # the system is assembled on the unknowns' dofs directly
                dofs = np.flatnonzero(np.repeat(free, 3))
                m_sys = len(dofs)
                Hc = sp.csr_matrix(Hc)
                if free[:nc].all():
                    A = _pad(Hc, m_sys)
                else:
                    cd = dofs[dofs < 3 * nc]
                    A = _pad(Hc[cd][:, cd], m_sys)
                # every structural entry stays (zeros too): the pattern, and with it the
                # linear solver's analysis, changes only with the pairs
                system.begin(A)
                for vb, B in block_parts:
                    sv = sysvert[vb]
                    system.add_vertex_blocks(sv[sv >= 0], B[sv >= 0])
                for H, st, k in pair_parts:
                    system.add_pairs(H, st, k)
                if pulled.any():
                    if w_al == 0.0:
                        # stiff enough to dominate every other term acting on those vertices
                        w_al = 1e4 * max(float(np.abs(system.diagonal()).max(initial=0.0)),
                                         float(inv_h2 * mass.max()), 1.0)
                    diag[pulled] += w_al
                    g[pulled] += w_al * (x[pulled] - target[pulled])
                system.add_diagonal(diag.ravel()[dofs])
                b = -g.ravel()[dofs]
                T["assemble"] += time.perf_counter() - t_
                t_ = time.perf_counter()
                p = np.zeros(3 * n)
                p[dofs] = self.linear.solve(system, b)
                p = p.reshape(n, 3)
                if not np.isfinite(p).all():  # (its length is the line search's to cut: a handle's
                    # penalty can ask for kilometres that the strain limit then scales down)
                    from tisim.solvers.base import StepDiverged

                    raise StepDiverged("a Newton step is not finite (NaN or Inf)")
                T["linear"] += time.perf_counter() - t_

                residual = float(np.abs(p[:nc][free[:nc] & ~pulled[:nc]]).max(initial=0.0)) / h
                # Newton decrement lambda^2 = p^T H p >= sum m |p|^2 / h^2: as a velocity,
                # sqrt(lambda^2 / M) bounds the mass-weighted RMS of p / h
                m_free = float(mass[free[:nc]].sum())
                v_dec = math.sqrt(max(float(b @ p.ravel()[dofs]), 0.0) / m_free) if m_free > 0 else 0.0
                small = residual < tol_v or (stop_on_decrement and v_dec < tol_v)
                friction_acts = False  # any vertex with a lagged normal force, hence friction
                if small and not pulled.any() and (friction_parts[0] or friction_parts[1]):
                    # Friction in its sticking zone is the stiffest term of the system
                    # (2 mu lambda / (eps_v h), largest at zero slip), so near the start of a
                    # step p is short even where Coulomb says the cloth slides: the step's
                    # shortness is friction's stiffness, not closeness to the minimum. Measure
                    # instead the step the same forces would give against inertia alone,
                    # q = p + h^2 M^-1 K_f p (see _friction_held_step).
                    residual, v_dec, slip, friction_acts = self._friction_held_step(
                        p, b @ p.ravel()[dofs], free & ~pulled, h, friction_parts,
                        x[:nc] - x_start[:nc], eps_v)
                    # and where friction is still deciding between stick and slip (vertices
                    # that moved less than STICK_SLIP_ZONE eps_v h in this step), to its own
                    # velocity resolution eps_v: a looser test decides it arbitrarily (a
                    # 0.3 m sheet on 30 degrees with mu = 0.55, a = 0.23 m/s^2, stayed put at
                    # the 4 mm/s that the tolerance alone allowed). Everywhere else friction
                    # is saturated or absent and Newton resolves the slip like any motion;
                    # holding every friction vertex to eps_v cost cloth-drape 60-90% more
                    # iterations in the buckling tail.
                    small = (residual < tol_v or (stop_on_decrement and v_dec < tol_v)) and \
                        slip < min(tol_v, eps_v)
                if not pulled.any() and small:
                    if not kept:
                        converged = True
                        if not friction_acts:
                            break
                        # With friction, the stopping point's error leans one way: Newton
                        # comes from the sticking side, so a slide stops short by up to the
                        # tolerance, every step (a 1.08 m/s^2 slide came out 4.5% slow).
                        # The last step is solved already: take it (CCD and line search as
                        # ever), which removes the lean at a line search's cost.
                        finishing = True
                    else:
                        # measured with a kept Hessian: confirm with a fresh one at the same
                        # x, so that convergence means what it means for plain Newton
                        He_kept = None
                        continue

                # line search: strain feasibility, CCD, backtracking ----------------------
                t_ = time.perf_counter()
                alpha = 1.0
                if self.strain is not None:
                    while alpha > 1e-12 and not self.strain.feasible(x[:nc] + alpha * p[:nc]):
                        alpha *= 0.5
                upload(self.x, x)
                upload(self.dx, p)
                pairs = self._detect(inflation, alpha)
                toi = self._ccd(pairs)  # a fraction of the full step p
                if planes:
                    toi = min(toi, planes.max_step(x[:nc], p[:nc], xi, self.config.ccd_eta))
                if toi < alpha:
                    clamps += 1
                alpha = min(alpha, toi)
                T["ccd"] += time.perf_counter() - t_
                t_ = time.perf_counter()
                # the elastic energy at x came with its gradient (the same evaluation)
                if E_known is not None and E_known[1:] == (self.kappa, w_al, Ee) and self.reuse_start_energy:
                    E0 = E_known[0]
                else:
                    E0 = energy(x, pairs, elastic=Ee)
                slope = float((g * p).sum())
                if finishing and (slope >= 0 or float(np.abs(p[:nc]).max()) < 1e-3 * eps_v * h):
                    break  # a last step under a thousandth of eps_v changes nothing friction resolves
                accepted = False
                for _ in range(cfg.line_search_steps):
                    xt = x + alpha * p
                    Et = energy(xt, pairs)
                    if Et <= E0 + 1e-4 * alpha * min(slope, 0.0) or (slope >= 0 and Et <= E0):
                        accepted = True
                        break
                    alpha *= 0.5
                    He_kept = None  # backtracked: the kept Hessian no longer models the energy well
                T["line_search"] += time.perf_counter() - t_
                log.debug("newton %d: |p|/h %.3g alpha %.3g (ccd %.3g) E %.6g -> %.6g, %d pairs, kappa %.3g",
                          it, residual, alpha, toi, E0, Et, sum(pairs), self.kappa)
                if not accepted:
                    log.debug("line search found no decrease at Newton iteration %d", it)
                    if finishing:
                        break
                    if pulled.any():
                        # held vertices that cannot move on: stop pulling (below)
                        fixed |= pulled
                        pulled[:] = False
                        continue
                    break
                if self.on_accept is not None:
                    self.on_accept(x, xt, p, E0, Et)
                x = xt
                # (held vertices being pulled may still be moved below: no reuse then)
                E_known = None if pulled.any() else (Et, self.kappa, w_al, last_elastic[0])
                if finishing:
                    break
                # adapt the barrier stiffness when a pair keeps closing in (IPC)
                if (sum(pairs) or planes) and self.kappa > 0:
                    # the line search's last energy was evaluated at this x over these pairs;
                    # the analytic colliders' gaps count as the pairs' do
                    dmin = self.barrier.last_min_distance if sum(pairs) else math.inf
                    if planes:
                        dmin = min(dmin, planes.min_distance(x[:nc]))
                    s = dmin * dmin - xi * xi
                    if s < 1e-9 * self.bbox_diag**2 and s < prev_min_s:
                        self.kappa = min(self.kappa_max, 2 * self.kappa)
                    prev_min_s = s
                # prescribed vertices that reached their targets become fixed
                if pulled.any():
                    dist = reached(x)
                    done = pulled & (dist <= 1e-9 * self.bbox_diag)
                    # the penalty leaves a held vertex off its target by its force over w_al
                    # (about 1e-9 m in cloth-twist, where 50 iterations did not close it):
                    # within the step tolerance, put it there if the move is strain-feasible
                    # and collision-free (CCD)
                    near = pulled & ~done & (dist <= tol_v * h)
                    if near.any():
                        d = np.zeros_like(x)
                        d[near] = target[near] - x[near]
                        barrier_at[0] = None  # (its detection replaces the pair buffers)
                        if self._move_is_safe(x, d, inflation):
                            done |= near
                        # its detection replaced the pair buffers: their list covers x -> x + d,
                        # so every pair near x, and x once the near vertices move
                        pairs = self._last_pairs
                    if done.any():
                        barrier_at[0] = None
                        x[done] = target[done]
                        fixed |= done
                        pulled &= ~done
                    # a prescribed path the strain limit or a contact blocks: the penalised
                    # problem's minimum is at the barrier's singularity, where Newton only
                    # jitters. After BLOCKED_AFTER iterations without 1% progress the held
                    # vertices stay where they are for the rest of the step; the distance
                    # left is the step's kinematic_lag
                    if pulled.any():
                        lag_now = float(dist[pulled].max())
                        stalled = stalled + 1 if lag_now > 0.99 * lag_prev else 0
                        lag_prev = lag_now
                        if stalled >= BLOCKED_AFTER:
                            log.debug("held vertices blocked %.3g m from their targets", lag_now)
                            fixed |= pulled
                            pulled[:] = False

        # contact statistics at the result (the next step starts from this detection)
        upload(self.x, x)
        n_pt, n_ee = self._detect(inflation, at=x)
        dmin = math.inf
        n_active = 0
        if n_pt + n_ee:
            dmin = self.barrier.min_distance(self.x, self.broad.pt, n_pt, self.broad.ee, n_ee)
            n_active = self.barrier.active_count(self.x, self.broad.pt, n_pt, self.broad.ee, n_ee, dhat, xi)
        if planes:
            dmin = min(dmin, planes.min_distance(x[:nc]))
            n_active += planes.active_count(x[:nc], dhat, xi)
        lag = float(reached(x).max(initial=0.0)) if prescribed.any() else 0.0
        self._last_obstacles = x[nc:].copy()
        return StepResult(
            x=x[:nc].copy(),
            iterations=iterations,
            residual=residual,
            converged=converged,
            n_contacts=int(n_active),
            min_distance=dmin - xi if math.isfinite(dmin) else math.nan,
            ccd_clamps=clamps,
            max_strain=self.strain.max_stretch(x[:nc]) if self.strain is not None else math.nan,
            timings={k: v * 1e3 for k, v in T.items()},
            kinematic_lag=lag,
        )

    def _friction_bound(self, friction_on: bool, plane_friction: bool) -> float:
        """sum mu lambda over the lagged friction contacts (N): the most friction they give."""
        total = 0.0
        if friction_on and self.friction.rows:
            total += float(download(self.friction.coef)[: self.friction.rows].sum())
        if plane_friction:
            total += self.planes.friction_bound()
        return total

    def _friction_held_step(self, p, p_H_p, free, h, friction_parts, moved, eps_v
                            ) -> tuple[float, float, float, bool]:
        """The Newton convergence measures of a step p with friction's stiffness taken out.

        p: (n, 3) Newton step, m; p_H_p: p^T H p (J); free: (n,) vertices whose step
        counts; friction_parts: (the analytic planes' friction (vertices, 3 x 3 blocks)
        list, the friction pairs' row count in ``self.friction``'s local Hessians).
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
        rows = friction_parts[1]
        if rows:
            H = download(self.friction.hessians)[:rows]
            st = download(self.friction.stencils)[:rows].astype(np.int64)
            ok = st >= 0
            P = np.where(ok[:, :, None], p[np.where(ok, st, 0)], 0.0).reshape(rows, 12)
            HP = np.einsum("kij,kj->ki", H, P).reshape(rows, 4, 3)
            cloth = ok & (st < nc) & (download(self.friction.coef)[:rows] > 0)[:, None]
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
        if (key is not None and last is not None and self.reuse_detection and last[0] == key[0]
                and np.array_equal(last[1], key[1])):
            return self._last_pairs
        self._detected_at = None
        if alpha is None:
            n_pt, n_ee = self.broad.detect(self.x, inflation)
        else:
            n_pt, n_ee = self.broad.detect(self.x, inflation, dx=self.dx, alpha=alpha)
        if not self.self_contact:
            n_pt, n_ee = self._drop_self_pairs(n_pt, n_ee)
        elif self.exclusion is not None and self.exclusion.count:
            n_pt, n_ee = self._drop_self_pairs(n_pt, n_ee, self.exclusion)
        self._last_pairs = (n_pt, n_ee)
        self._detected_at = key
        return n_pt, n_ee

    def _drop_self_pairs(self, n_pt, n_ee, exclusion=None):
        """Keep only pairs that involve an obstacle (self-contact off), or, given a
        RestExclusion, drop the self-contact pairs it excludes (in place, order kept)."""
        nc = self.nc
        out = []
        for kind, f, k in (("pt", self.broad.pt, n_pt), ("ee", self.broad.ee, n_ee)):
            if k == 0:
                out.append(0)
                continue
            rows = download(f)[:k]
            if exclusion is None:
                keep = rows[(rows >= nc).any(axis=1)]
            else:
                mask = exclusion.keep(kind, rows)
                if mask.all():
                    out.append(k)
                    continue
                keep = rows[mask]
            if len(keep):
                buf = download(f)
                buf[: len(keep)] = keep
                upload(f, buf)
            out.append(len(keep))
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
        from tisim.contact.ipc.ccd import max_step

        if not sum(pairs):
            return 1.0
        return float(max_step(self.x, self.dx, self.broad.pt, pairs[0], self.broad.ee, pairs[1],
                              self.contact.thickness))

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
        gb = download(self.g)
        if self.planes:
            gb[:nc] += self.planes.gradient_hessian(x[:nc], dhat, xi, 1.0, hessian=False)[0]
        nb = float((gb * gb).sum())
        k = -float((gb * ge).sum()) / nb if nb > 0 else k_min
        self.kappa = float(min(max(k, k_min), 100.0 * k_min))
        log.debug("barrier stiffness %.3g (range %.3g .. %.3g)", self.kappa, k_min, self.kappa_max)


def _check_start_analytic(xc, faces, edges, shape, c, xi: float, src) -> None:
    """Refuse a cloth (vertices xc (n, 3), faces, edges) that starts inside the analytic
    collider ``c`` (its ``shape``), crosses it, or has a vertex within the thickness xi
    of it: one MeshError line naming the collider."""
    from tisim.geometry.cloth import check_intersection_free
    from tisim.geometry.mesh import MeshError

    name = f"{c.kind} collider {c.name!r}"
    d = c.distance(xc, 0.0)  # from the real surface (a curved shape's is grown: the sag allowance)
    allowance = shape.r - c.radius if shape.kind in ("sphere", "cylinder") else 0.0
    i = int(np.argmin(d - allowance))
    if (d < 0).all():
        raise MeshError(f"the cloth starts inside {name} (every vertex; the deepest {-d.min():.3g} m): "
                        "move the cloth out of it", src)
    j = int(np.argmin(d))
    if d[j] < 0:  # some vertices inside, some outside
        raise MeshError(f"the cloth intersects collider {c.name!r}: cloth vertex {j} is {-d[j]:.3g} m inside "
                        f"the {c.kind}: move the cloth away from it", src)
    if d[i] <= xi + allowance:
        extra = f" plus {allowance:.2g} m for its triangles' sag over the curve" if allowance > 0 else ""
        raise MeshError(f"cloth vertex {i} starts {d[i]:.3g} m from {name}, within the contact thickness "
                        f"{xi:g} m{extra}: move the cloth away from it", src)
    if shape.kind == "sphere":
        # a triangle whose vertices are all outside can still cut a cap off the sphere
        from tisim.geometry.distances import point_triangle_distance

        tri = xc[faces]
        reach = np.linalg.norm(tri - tri.mean(axis=1, keepdims=True), axis=2).max(axis=1)
        near = np.flatnonzero(d[faces].min(axis=1) - reach < 0)
        for f in near:
            if point_triangle_distance(shape.c, *tri[f]) < shape.r:
                raise MeshError(f"the cloth intersects {name}: cloth face {f} (vertices "
                                f"{', '.join(map(str, faces[f]))}) cuts through it: move the cloth away from it",
                                src)
    elif shape.kind in ("box", "cylinder"):
        # a box's edge or a cylinder's rim can pierce a triangle whose vertices are outside
        if shape.kind == "box":
            other = c.surface_mesh(0.0)
        else:
            m = _rim_segments(shape.r, xi)
            extent = 2.0 * float(np.abs(xc - shape.c).max()) + shape.r
            other = c.surface_mesh(0.0, extent=extent, segments=m)
        check_intersection_free(xc, faces, edges, source=src, other=other, other_name=name)


class _StrainTerm:
    """The strain-limit barrier on the level's own membrane (C-IPC), host interface."""

    def __init__(self, cls, n, faces, rest, s_max, stiffness, real):
        import taichi as ti

        from tisim.energies.shell import shell_rest

        self.obj = cls(n, faces, shell_rest(rest, faces), stiffness, s_max=s_max)
        self.n = n
        self.x = ti.Vector.ndarray(3, real, shape=max(n, 1))
        self.g = ti.Vector.ndarray(3, real, shape=max(n, 1))
        self.faces = faces
        self.s_max = s_max
        self.assembler = DeviceAssembler(3 * n, [_np(self.obj.face_stencils)])
        self._hf = ti.ndarray(real, shape=(max(len(faces), 1), 6, 6))
        self._stretch_at = None  # (x, largest stretch) of the last energy() call

    def energy(self, x):
        upload(self.x, x)
        E = self.obj.energy(self.x)
        # the largest stretch came with it: max_stretch / active_at at the same x reuse it
        # (the Newton iteration after an accepted line search starts at its last trial)
        self._stretch_at = (np.array(x, dtype=np.float64), self.obj.last_max_stretch)
        return E

    def gradient_hessian(self, x):
        from tisim.energies import shell_kernels as K

        upload(self.x, x)
        if not self.active(self.x):
            return None, None  # the barrier is inactive on every face: no force, no stiffness
        _zero(self.g)
        o = self.obj
        o.add_gradient(self.x, self.g)
        K.shell_hessian_f(self.x, o.faces, o.face_data, o.face_data, 0, 1, o.s_max, o.s_hat, o._tol, 1, self._hf)
        asm = self.assembler
        K.gather_face_hessians(o.face_data, self._hf, *asm.incidence[0], asm.indptr, asm.data)  # (zeroes first)
        return download(self.g)[: self.n], asm.matrix()

    def active(self, x) -> bool:
        """Whether the barrier acts on some face at positions x (an ndarray)."""
        return bool(self.obj.max_stretch(x) > self.obj.s_max - self.obj.s_hat)

    def active_at(self, x: np.ndarray) -> bool:
        """Whether the barrier acts on some face at positions x (n, 3)."""
        return self.max_stretch(x) > self.obj.s_max - self.obj.s_hat

    def max_stretch(self, x) -> float:
        kept = self._stretch_at
        if kept is not None and np.array_equal(kept[0], x):
            return kept[1]
        upload(self.x, x)
        return float(self.obj.max_stretch(self.x))

    def feasible(self, x) -> bool:
        upload(self.x, x)
        return bool(self.obj.feasible(self.x))


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
        raise StepDiverged(f"{what} moves a cloth vertex {big:.3g} m, more than the {limit:.3g} m "
                           f"this solver can resolve in one step")


def _barrier_d2(d: float, dhat: float) -> float:
    """Second derivative of b(d) = -(d - dhat)^2 ln(d / dhat) (host, for one scalar)."""
    r = d - dhat
    return -2 * math.log(d / dhat) - 4 * r / d + r * r / (d * d)


def _diag(x: np.ndarray) -> float:
    return float(np.linalg.norm(np.ptp(x, axis=0))) if len(x) else 1.0


class _SolidView:
    """The solid part of a combined state, as a State the PD solver can step."""

    def __init__(self, state, ns):
        self.positions = state.positions[:ns]
        self.velocities = state.velocities[:ns]
        self.time = state.time
        self.warm = state.warm.setdefault("solids", {})
        self._state = state

    def __setattr__(self, k, v):
        object.__setattr__(self, k, v)
        if k == "time" and "_state" in self.__dict__:
            self._state.time = v

    def is_finite(self):
        return bool(np.isfinite(self.positions).all() and np.isfinite(self.velocities).all())


def _solid_solver(model, pd_config):
    """A PD solver over the scene's soft bodies alone (the model's first vertices)."""
    import dataclasses

    from tisim.model import Model
    from tisim.solvers.pd.solver import SolverPD

    scene = model.scene
    objs = {k: o for k, o in scene.objects.items() if o.kind == "solid"}
    sub = dataclasses.replace(scene, objects=objs, solver=pd_config)
    return SolverPD(Model.from_scene(sub), pd_config)


class _Obstacles:
    """Kinematic triangle meshes and line sets the cloth meets, and the static analytic
    shapes (``analytic``: planes, spheres, boxes, cylinders; tisim.contact.ipc.analytic).
    Mesh colliders and moving colliders are tessellated; the surfaces of the solids are
    met as they are. A static box's 12 edges and 8 corners and a static capped
    cylinder's rims (polylines) are line sets: the analytic terms keep the cloth's
    vertices off the shape, the line sets its edges and faces off the shape's edges.
    Vertex positions at time t come from the colliders' rigid motion and from the
    solids' current positions."""

    def __init__(self, model, cp, include_solids: bool = True, circumradius: float = 0.0):
        from tisim.contact.ipc.analytic import sag_allowance

        span = _diag(cp.rest)
        contact = model.scene.contact
        xi = contact.thickness
        self.parts = []  # (collider or None, vertex ids into the solid block or None, count)
        self.part_faces = []  # each part's rows of ``faces``, for its name in messages
        faces, mus, off = [], [], 0
        edges = []  # the line sets' edges (no faces)
        self._static = {}  # part index -> its fixed vertices (the line sets)
        mu_default = np.nan
        def fine_enough(c):
            # a cloth coarse against the curvature would float by its sag allowance: it
            # meets the tessellated shape instead, whose facets its triangles rest on
            return c.kind not in ("sphere", "cylinder") or sag_allowance(c.radius, xi, circumradius) <= (
                SAG_LIMIT * (xi + contact.dhat))

        self.analytic = [c for c in model.colliders
                         if c.kind in ANALYTIC_KINDS and not c.is_moving() and fine_enough(c)]
        self.planes = [c for c in self.analytic if c.kind == "plane"]  # (the planes among them)
        nf = 0
        for c in model.colliders:
            if c in self.analytic:
                V, E = _line_set(c, xi)
                if not len(V):
                    continue
                self._static[len(self.parts)] = V
                F = np.zeros((0, 3), np.int64)
                edges.append(E + off)
            else:
                V, F = self._mesh(c, 0.0, span)
            self.part_faces.append(slice(nf, nf + len(F)))
            nf += len(F)
            faces.append(F + off)
            mus.append(np.full(len(V), np.nan if c.friction is None else c.friction))
            self.parts.append((c, None, len(V)))
            off += len(V)
        ns = model.solid_vertex_count
        if include_solids and ns > 0 and model.element_count > 0:
            surf = model.surface[: len(model.surface) - len(model.cloth.faces)]
            ids = np.unique(surf)
            remap = np.full(ns, -1, dtype=np.int64)
            remap[ids] = np.arange(len(ids))
            self.part_faces.append(slice(nf, nf + len(surf)))
            faces.append(remap[surf] + off)
            mus.append(np.full(len(ids), mu_default))
            self.parts.append((None, ids, len(ids)))
            off += len(ids)
        self.vertex_count = off
        self.faces = np.concatenate(faces).astype(np.int32) if faces else np.zeros((0, 3), np.int32)
        self.line_edges = np.concatenate(edges).astype(np.int32) if edges else np.zeros((0, 2), np.int32)
        self.vertex_mu = np.concatenate(mus) if mus else np.zeros(0)
        self.span = span

    _ICO = None

    @classmethod
    def _mesh(cls, c, t, span):
        if c.kind == "plane":
            return c.surface_mesh(t, extent=max(4.0, 3 * span))
        if c.kind == "sphere":
            # a geodesic sphere: even triangles (a UV sphere's slivers at the poles make
            # poor contact primitives); 2,562 vertices, facets within 0.04% of the radius
            if cls._ICO is None:
                from tisim.geometry.generate import icosphere

                ico = icosphere(4)
                cls._ICO = (ico.vertices / np.linalg.norm(ico.vertices, axis=1, keepdims=True), ico.faces)
            V, F = cls._ICO
            return c.center(t) + c.radius * V @ c.orientation(t).T, F
        if c.kind == "cylinder":
            return c.surface_mesh(t, extent=max(4.0, 3 * span), segments=64)
        return c.surface_mesh(t)

    def positions(self, t: float, model_positions: np.ndarray) -> np.ndarray:
        """(vertex_count, 3) obstacle vertices at time t (solids from ``model_positions``)."""
        out = []
        for k, (c, ids, _) in enumerate(self.parts):
            if k in self._static:
                out.append(self._static[k])
            elif c is not None:
                out.append(self._mesh(c, t, self.span)[0])
            else:
                out.append(model_positions[ids])
        return np.concatenate(out) if out else np.zeros((0, 3))


# the stretch assumed for the curved colliders' sag allowance when there is no strain limit
NO_LIMIT_STRETCH = 1.1
# a static sphere or cylinder is analytic while the cloth's sag allowance over it is at
# most this many times the barrier's reach (thickness + dhat); beyond, it is tessellated
SAG_LIMIT = 1.0


def _largest_circumradius(x: np.ndarray, faces: np.ndarray) -> float:
    """The largest circumradius (m) of the triangles faces (m, 3) over x (n, 3)."""
    if not len(faces):
        return 0.0
    t = x[faces]
    a, b, c = (np.linalg.norm(t[:, i] - t[:, j], axis=1) for i, j in ((1, 2), (0, 2), (0, 1)))
    area2 = np.linalg.norm(np.cross(t[:, 1] - t[:, 0], t[:, 2] - t[:, 0]), axis=1)
    ok = area2 > 0  # (a degenerate triangle has no circumcircle; its edges bound it)
    rho = (a * b * c)[ok] / (2 * area2[ok])  # abc / (4 area)
    return float(max(rho.max(initial=0.0), 0.5 * max(a.max(), b.max(), c.max())))


# colliders met analytically when static (tisim.contact.ipc.analytic)
ANALYTIC_KINDS = ("plane", "sphere", "box", "cylinder")
# a capped cylinder's rim polyline keeps within this fraction of the contact thickness
# of the circle (its chords' sagitta), so the line set's guarantee loses at most 1%
RIM_SAGITTA = 0.01
RIM_MAX_SEGMENTS = 8192


def _rim_segments(radius: float, thickness: float) -> int:
    """Segments of a circle of ``radius`` whose chords' sagitta radius (1 - cos(pi / n))
    is at most RIM_SAGITTA * thickness (at least 16, at most RIM_MAX_SEGMENTS)."""
    c = 1.0 - RIM_SAGITTA * thickness / radius
    if c <= -1.0:
        return 16
    return int(min(max(math.ceil(math.pi / math.acos(max(c, -1.0))), 16), RIM_MAX_SEGMENTS))


def _line_set(c, thickness: float) -> tuple[np.ndarray, np.ndarray]:
    """(vertices (k, 3), edges (l, 2)) of a static analytic collider's edges: a box's 12
    edges, a capped cylinder's two rims; none for planes, spheres, unbounded cylinders."""
    from tisim.contact.ipc.analytic import Box, shape_of

    s = shape_of(c)
    if s.kind == "box":
        return s.corners(), Box.edges()
    if s.kind == "cylinder" and s.capped:
        m = _rim_segments(s.r, thickness)
        u = s._perp
        w = np.cross(s.a, u)
        th = 2 * np.pi * np.arange(m) / m
        ring = s.r * (np.cos(th)[:, None] * u + np.sin(th)[:, None] * w)
        V = np.concatenate([s.c + ring - s.half * s.a, s.c + ring + s.half * s.a])
        i = np.arange(m)
        E = np.concatenate([np.stack([i, (i + 1) % m], 1), m + np.stack([i, (i + 1) % m], 1)])
        return V, E
    return np.zeros((0, 3)), np.zeros((0, 2), np.int64)
