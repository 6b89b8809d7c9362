"""Nonsmooth-Newton frictional contact inside a local-global (PD) solver.

The solver owns the time step and calls (notes §3):

    contact.begin_step(q_n, v_n, q_tilde, t, h)     # detection, warm start
    for k in range(iterations):
        local step; b = ...
        q = global_step.solve(b + s * contact.force())   # s = contact.force_coefficient(h)
        if contact.active:
            contact.update(q)       # (first call: H, d0, W, r) nonsmooth Newton steps on lambda
            q = global_step.solve(b + s * contact.force())
    contact.stats()

Contact forces lambda are Lagrange multipliers in the global step,
A q = b + h^2 H^T lambda (notes §2.4, notes' scaling A = M + h^2 sum w G^T G); lambda
are physical forces in N, frame components (normal, t1, t2) per contact.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
import time
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from tisim.contact.ncp.delassus import (
    DelassusBuilder,
    DelassusOperator,
    scalar_delassus_columns,
    scalar_mass_delassus_diagonal,
)
from tisim.contact.ncp.detection import ContactDetector
from tisim.contact.ncp.frames import ContactSet
from tisim.contact.ncp.functions import (
    friction_residual,
    friction_state,
    ncp_function,
    project_cone,
)
from tisim.linalg.krylov import conjugate_residual

log = logging.getLogger(__name__)

# Rows whose indicator omega is below this are solved directly (notes §2.7): their
# column of the Newton matrix is (numerically) E alone.
_OMEGA_TOL = 1e-10
# Contacts whose compliance is this small relative to the largest cannot move (all
# their vertices are held); they are dropped so the preconditioner stays finite.
_RIGID_TOL = 1e-12
# Inner Newton iterations stop when the NCP residual (root of the merit, m) is below this.
_NEWTON_TOL = 1e-12
# Halvings of the Newton step tried before the step is taken anyway.
_LINE_SEARCH_STEPS = 4


@lru_cache(maxsize=1)
def _numpy_openblas():
    """(get, set) thread-count functions of numpy's bundled OpenBLAS, or None."""
    try:
        libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
        for path in glob.glob(os.path.join(libdir, "*openblas*.so*")):
            lib = ctypes.CDLL(path)
            for get, set_ in (
                ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                ("openblas_get_num_threads", "openblas_set_num_threads"),
            ):
                if hasattr(lib, get) and hasattr(lib, set_):
                    return getattr(lib, get), getattr(lib, set_)
    except OSError:
        pass
    return None


@contextlib.contextmanager
def _single_threaded_blas():
    """Run numpy's BLAS on one thread inside the block.

    The contact solve makes many small products (k x k times k x 3). With several BLAS
    threads each costs a thread wake-up, and the threads keep spinning afterwards,
    taking cores from the Taichi kernels and the factor solves of the global step; on a
    2-core machine this more than doubled the frame time of the squeeze-ball demo.
    """
    fns = _numpy_openblas()
    if fns is None:
        yield
        return
    get, set_ = fns
    old = int(get())
    if old != 1:
        set_(1)
    try:
        yield
    finally:
        if old != 1:
            set_(old)


# Measured on an NVIDIA H200 (CUDA driver 580, Taichi 1.7.4; docs/benchmarks.md, "GPU-class backends"):
# the device update in f32 let the squeeze-ball through the floor (70 mm, det F 0.21), with
# parallel or serial loops and with fast math on or off, while the same kernels agree with
# the CPU in f64 on CUDA and in f32 on the CPU backend and on Vulkan. The cause, found since
# by emulating it on the CPU: Taichi's CUDA JIT compiles every f32 square root to the
# approximate instruction, and the Fischer-Burmeister derivative 1 - a / rho then came out
# about 1e-7 instead of 0 on rows with no force, which the Newton step took as active rows
# of that weight. ncp.fischer_burmeister and device_ncp._ncp now evaluate it without that
# cancellation; until a GPU run confirms the fix, "auto" keeps the host update there.
CUDA_F32_DEVICE_WARNING = (
    'contact.implementation = "device" on CUDA in f32 gave wrong contact on an NVIDIA H200 (the '
    'squeeze-ball fell 70 mm into the floor); its cause is fixed but not yet checked on a GPU: '
    'use --precision f64 or contact.implementation = "host" for results you rely on'
)


def choose_implementation(requested: str, arch: str, precision: str) -> tuple[str, str | None]:
    """(implementation, warning or None) for the contact update: "host" (numpy) or "device"
    (Taichi kernels). "auto" takes the kernels wherever they were measured faster and right:
    the CPU backend (0.74-0.77x the squeeze-ball's frame time) and CUDA in f64; Vulkan keeps
    numpy (Mesa lavapipe's per-launch cost made the kernels 7-30 s a frame), and so does CUDA
    in f32, where the kernels gave wrong contact before the fix above, which no GPU has run
    yet (CUDA_F32_DEVICE_WARNING); asking for "device" there runs them with that warning."""
    if requested not in ("auto", "host", "device"):
        raise ValueError(f"contact implementation must be 'auto', 'host' or 'device', got {requested!r}")
    cuda_f32 = arch == "cuda" and precision == "f32"
    if requested == "auto":
        return ("host" if arch == "vulkan" or cuda_f32 else "device"), None
    if requested == "device" and cuda_f32:
        return "device", CUDA_F32_DEVICE_WARNING
    return requested, None


class PDContact:
    """Signorini-Coulomb contact solved by nonsmooth Newton steps on the multipliers.

    model: :class:`tisim.model.Model`. config: the scene's
    :class:`tisim.scene.ContactConfig` (mu, ncp, preconditioner, cr_iterations,
    margin, objects, self_collision). global_step: the solver's global step, with

    * ``solve(rhs (n, 3)) -> (n, 3)`` (not used here),
    * ``sparse_inverse() -> (S csr, perm)`` with A_hat^-1 = P^T S^T S P, or
      ``inverse_columns(B sparse (n, k)) -> dense (n, k) = A_hat^-1 B``, where
      A = A_hat kron I_3 is the solver's constant global matrix, and
    * ``contact_scaling``: "notes" when A = M + h^2 sum w G^T G (the contact force
      enters as h^2 H^T lambda) or "inertia-over-h2" when A = M / h^2 + sum w G^T G
      (it enters as H^T lambda). Read once per step; default "notes".

    Options (keyword): newton_iterations: Newton steps per ``update`` call (default 3;
    the notes use 1). Later ones re-use the linear response C of the first solve, which
    is exact for fixed b, so they cost CR iterations but no global solve; converging the
    contact subproblem per local-global iteration keeps friction from flipping between
    iterations when the elastic right-hand side changes (a ball drawn between rollers
    stalls and blows up with 1, and a box set on an incline creeps in its first steps).
    Each Newton step is globalised by a backtracking line search on the NCP merit.
    exact_gaps: evaluate collider gaps with the exact signed distance at
    the current iterate rather than its linearisation at q_n (removes the tangent-plane
    error on curved colliders; the Jacobian stays fixed for the step).
    friction_jacobian: "full" (default; keeps the derivative of the disk projection
    for slipping contacts, see :meth:`_newton_step`) or "lagged" (the notes' omega_t = 0,
    E_t = I). band: detection band beyond ``contact.margin`` in mean surface edge
    lengths. sparse_inverse_limit_mb: when the global step has no sparse inverse (the
    "cholesky" back-end), one is built here from its factor for W if it fits.
    held: optional callable t -> (h,) indices of vertices with prescribed motion at t.
    implementation: "host" (numpy) or "device" (the per-iteration update - kinematics,
    NCP rows, CR, line search, force scatter - in Taichi kernels over data uploaded once
    per step, :class:`tisim.contact.ncp.device_ncp.DeviceNCP`; same mathematics, agreement
    to round-off), or "auto" (:func:`choose_implementation`); default: the config's
    ``implementation`` key, else "auto".

    References: notes "Fast But Accurate: A Real-Time Hyperelastic Simulator with Robust
    Frictional Contact" (shared/papers/pd-sparse-inverse-contact.md), §2.4-2.10, §3.
    Limitations: penetration-based (no non-penetration guarantee, notes §6); friction
    uses the proximal stick/slip form with the normal force lagged by one Newton step,
    for both normal NCP functions (the Fischer-Burmeister variant of the friction law
    is not implemented); the Delassus operator is dense across contacts (O(k^2) memory
    and work per step); detection runs once per step (plus the first iterate), so a
    body moving farther than the detection band through a thin obstacle can tunnel.
    """

    def __init__(
        self,
        model,
        config,
        global_step,
        *,
        newton_iterations: int = 3,
        exact_gaps: bool = True,
        friction_jacobian: str = "full",
        band: float = 0.25,
        sparse_inverse_limit_mb: float = 1000.0,
        held: Callable[[float], np.ndarray] | None = None,
        implementation: str | None = None,
    ):
        if implementation is None:
            implementation = getattr(config, "implementation", "auto")
        from tisim import backend

        info = backend.current()
        implementation, self.implementation_warning = choose_implementation(implementation, info.arch, info.precision)
        if self.implementation_warning:
            log.warning("%s", self.implementation_warning)
        self.implementation = implementation
        self._device = None  # DeviceNCP ("device"), made and compiled in prepare()
        self._on_device = False  # this step's problem is loaded on the device
        self._lam_stale = False  # the device's lambda is newer than self._lam
        self._device_stats = False
        self.model = model
        self.config = config
        self.global_step = global_step
        self.detector = ContactDetector(model, config, band=band)
        self.ncp = ncp_function(config.ncp)
        self.newton_iterations = int(newton_iterations)
        self.exact_gaps = bool(exact_gaps)
        if friction_jacobian not in ("full", "lagged"):
            raise ValueError(f"friction_jacobian must be 'full' or 'lagged', got {friction_jacobian!r}")
        self.friction_jacobian = friction_jacobian
        self.vertex_count = model.vertex_count
        self._held = held if held is not None else self._model_held
        mass = np.asarray(model.mass, dtype=np.float64)
        self._inverse_mass = np.where(mass > 0, 1.0 / np.where(mass > 0, mass, 1.0), 0.0)
        self.contacts = ContactSet.empty()
        self.lam = np.zeros((0, 3))
        self._warm_keys = np.zeros(0, dtype=np.int64)
        self._warm_forces = np.zeros((0, 3))
        self._h = 0.0
        self._t_next = 0.0
        self._stats = self._empty_stats()
        self._builder = None
        self._builder_key = None
        self._own_si = None
        self._built = False
        self.sparse_inverse_limit_mb = float(sparse_inverse_limit_mb)
        self.prepare()

    def prepare(self) -> None:
        """Build what W needs that does not change between steps (the sparse inverse of the
        global step's factor when it has none of its own) now rather than at the first
        contact, where it would stall a frame (0.7 s for 7k vertices), and compile the
        device kernels (implementation "device"). After a refactor the new factor is
        picked up lazily at the next contact."""
        if self.implementation == "device" and self._device is None:
            self._make_device().warm_up(len(self.model.colliders))
            cols = self.model.colliders
            if cols and all(c.kind in ("plane", "sphere", "box", "cylinder") for c in cols):
                from tisim.contact.ncp.device_colliders import DeviceColliderGaps

                det = self.detector
                det.collider_gaps = DeviceColliderGaps(cols, det.surface_vertices)
                q = self.model.initial_positions  # compile now, not at the first contact
                det.collider_gaps([q, q, q], 0.0)
        g = self.global_step
        si = getattr(g, "sparse_inverse", None)
        try:
            has_own = si is not None and si() is not None
        except AttributeError:  # a proxy whose global step does not exist yet
            return
        if not has_own:
            self._own_sparse_inverse()

    # ------------------------------------------------------------------ set-up
    def _model_held(self, t: float) -> np.ndarray:
        idx, _ = self.model.handle_targets(t)
        return idx

    @property
    def lam(self) -> np.ndarray:
        """(k, 3) contact forces in frame components (normal, t1, t2), N."""
        if self._lam_stale:
            self._lam = self._device.get_lam()
            self._lam_stale = False
        return self._lam

    @lam.setter
    def lam(self, value: np.ndarray) -> None:
        self._lam = value
        self._lam_stale = False
        if self._on_device:
            self._device.set_lam(value)

    def reset(self) -> None:
        """Forget the warm start (call when the scene is reset)."""
        self._on_device = False
        self.contacts = ContactSet.empty()
        self.lam = np.zeros((0, 3))
        self._warm_keys = np.zeros(0, dtype=np.int64)
        self._warm_forces = np.zeros((0, 3))

    @property
    def active(self) -> bool:
        """Whether this step has contacts (otherwise update() and force() are no-ops)."""
        return self.contacts.count > 0

    def force_coefficient(self, h: float) -> float:
        """s in A q = b + s H^T lambda for the global step's scaling."""
        return 1.0 if self._scaling() == "inertia-over-h2" else h * h

    def _scaling(self) -> str:
        s = getattr(self.global_step, "contact_scaling", "notes")
        if s not in ("notes", "inertia-over-h2"):
            raise ValueError(f"unknown global step scaling {s!r}")
        return s

    @staticmethod
    def _empty_stats() -> dict:
        return {
            "n_contacts": 0,
            "n_touching": 0,
            "max_penetration": 0.0,
            "ncp_residual": 0.0,
            "ms_detect": 0.0,
            "ms_delassus": 0.0,
            "ms_cr": 0.0,
            "cr_iterations": 0,
            "line_search_halvings": 0,
            "delassus_new_rows": 0,
        }

    # ------------------------------------------------------------------ per step
    def begin_step(self, q_n: np.ndarray, v_n: np.ndarray, q_tilde: np.ndarray, t: float, h: float) -> None:
        """Detect contacts for the step t -> t + h and warm-start their forces.

        q_n, v_n, q_tilde: (n, 3) positions (m), velocities (m/s), inertial prediction (m).
        Detection tests q_n and q_tilde (and, at the first :meth:`update`, the first
        global-step iterate); H, d0, W and the preconditioner are built once, at the
        first :meth:`update`, for the final contact set of the step.
        """
        with _single_threaded_blas():
            self._begin_step(q_n, v_n, q_tilde, t, h)

    def _begin_step(self, q_n, v_n, q_tilde, t, h) -> None:
        self._store_warm()
        self._on_device = False
        self._stats = self._empty_stats()
        self._device_stats = False  # the device's statistics are newer than _stats
        self._h = float(h)
        self._t_next = float(t + h)
        self._q_tilde = q_tilde
        self._q_n = q_n
        t0 = time.perf_counter()
        held_idx = np.asarray(self._held(self._t_next), dtype=np.int64)
        held = np.zeros(self.vertex_count, dtype=bool)
        held[held_idx] = True
        self._held_mask = held
        cs = self.detector.detect(q_n, q_tilde, self._t_next, held)
        self._stats["ms_detect"] = 1e3 * (time.perf_counter() - t0)
        self.contacts = cs
        self.lam = self._warm_start(cs) if cs.count else np.zeros((0, 3))
        self._built = False
        self._stats["n_contacts"] = cs.count

    def _build(self, q: np.ndarray) -> None:
        """Re-detect with the first iterate q as a further prediction, then build W and r."""
        t0 = time.perf_counter()
        cs = self.detector.detect(self._q_n, [self._q_tilde, q], self._t_next, self._held_mask)
        if cs.count != self.contacts.count or not np.array_equal(cs.key, self.contacts.key):
            # the new set contains the old one (same tests plus one more): carry lambda by key
            lam = np.zeros((cs.count, 3))
            pos = {int(k_): i for i, k_ in enumerate(cs.key)}
            for i, k_ in enumerate(self.contacts.key):
                j = pos.get(int(k_))
                if j is not None:
                    lam[j] = self.lam[i]
            self.contacts, self.lam = cs, lam
        t1 = time.perf_counter()
        self._stats["ms_detect"] += 1e3 * (t1 - t0)
        cs, h = self.contacts, self._h
        B = cs.selection_matrix(self.vertex_count)
        W_hat = self._scalar_delassus(B, np.where(cs.collider >= 0, cs.vertices[:, 0], -1))
        diag = np.diag(W_hat)
        keep = diag > _RIGID_TOL * max(float(diag.max()), 1e-300)
        if not np.all(keep):
            cs = cs.subset(keep)
            W_hat = W_hat[np.ix_(keep, keep)]
            B = B[:, np.flatnonzero(keep)]
            self.contacts, self.lam = cs, self.lam[keep]
        s = self.force_coefficient(h)
        self.C = DelassusOperator(W_hat, cs.frames, s)
        # complementarity preconditioner (notes §2.9), in compliance units:
        # r_n = h^2 W_jj (m/N) for the normal row, r_t = h W_jj ((m/s)/N) for friction
        self.compliance = self.C.diagonal()  # h^2 W_jj, m/N
        if self.config.preconditioner == "mass":
            # the global matrix's mass term is M (1 + c h) with mass-proportional damping c
            c = float(self.model.scene.sim.damping) if hasattr(self.model, "scene") else 0.0
            inv_m = self._inverse_mass * ~self._held_mask / (1.0 + c * h)
            r = h * h * scalar_mass_delassus_diagonal(B, inv_m)
        else:
            r = self.compliance
        self.r_n = r
        self.r_t = r / h
        self._built = True
        if self.implementation == "device":
            self._load_device(W_hat, s)
        self._stats["ms_delassus"] = 1e3 * (time.perf_counter() - t1)
        if self._builder is not None:
            self._stats["delassus_new_rows"] = int(self._builder.last_new_rows)
        self._stats["n_contacts"] = cs.count

    def _make_device(self):
        if self._device is None:
            from tisim import backend
            from tisim.contact.ncp.device_ncp import DeviceNCP

            self._device = DeviceNCP(
                self.vertex_count,
                ncp=self.config.ncp,
                friction_jacobian=self.friction_jacobian,
                exact_gaps=self.exact_gaps,
                cr_iterations=self.config.cr_iterations,
                dtype=backend.np_real(),
            )
        return self._device

    def _load_device(self, W_hat: np.ndarray, s: float) -> None:
        """Upload this step's problem (contacts, W_hat, preconditioner, lambda)."""
        self._make_device().load(
            self.contacts,
            W_hat,
            self.r_n,
            self.r_t,
            self.compliance,
            s,
            self._h,
            self.lam,
            self.model.colliders,
            self._t_next,
        )
        self._on_device = True

    def _scalar_delassus(self, B, vertex: np.ndarray | None = None) -> np.ndarray:
        """B^T A_hat^-1 B through the sparse inverse: the global step's own when it has one,
        else one computed here once from its Cholesky factor (k columns through S cost a
        sparse gather and one dense product instead of k pairs of triangular solves).
        vertex: (k,) vertex of each unit column of B (vertex-collider contacts), else -1;
        their entries are cached between steps (:class:`DelassusBuilder`)."""
        g = self.global_step
        si = getattr(g, "sparse_inverse", None)
        res = si() if si is not None else None
        if res is not None:
            S, perm = res
            if self._builder is None or self._builder_key is not S:  # S changes only on a refactor
                self._builder = DelassusBuilder(S.T.tocsr(), perm, self.vertex_count)
                self._builder_key = S
        else:
            own = self._own_sparse_inverse()
            if own is None:
                return scalar_delassus_columns(g.inverse_columns, B)
            ST, perm = own
            if self._builder is None or self._builder_key is not ST:
                self._builder = DelassusBuilder(ST, perm, self.vertex_count)
                self._builder_key = ST
        return self._builder.scalar(B, vertex)

    def _own_sparse_inverse(self):
        """(S^T csr, vertex of each permuted row) from the global step's factor, cached per
        factor."""
        g = self.global_step
        try:
            f = g.factor
            free_index = np.asarray(g.free_index, dtype=np.int64)
        except AttributeError:
            return None
        if self._own_si is not None and self._own_si[0] is f:
            return self._own_si[1]
        from tisim.linalg.sparse_inverse import SparseInverseTooLarge, sparse_inverse

        try:
            take = getattr(g, "take_sparse_inverse", None)  # S built by "auto" for this factor
            si = take() if take is not None else None
            if si is None:
                si = sparse_inverse(f, memory_limit_mb=self.sparse_inverse_limit_mb)
        except SparseInverseTooLarge as e:
            log.info("contact: %s; building W with factor solves", e)
            self._own_si = (f, None)
            return None
        val = (si.ST, free_index[si.perm])
        self._own_si = (f, val)
        return val

    def _store_warm(self) -> None:
        if self.contacts.count:
            self._warm_keys = self.contacts.key.copy()
            self._warm_forces = self.contacts.to_world(self.lam)

    def _warm_start(self, cs: ContactSet) -> np.ndarray:
        """Forces of persistent contacts (same vertex and obstacle) carried over in world
        coordinates, re-projected onto the new frames and cone."""
        lam = np.zeros((cs.count, 3))
        if self._warm_keys.size:
            order = np.argsort(self._warm_keys)
            keys = self._warm_keys[order]
            pos = np.clip(np.searchsorted(keys, cs.key), 0, keys.size - 1)
            hit = keys[pos] == cs.key
            if np.any(hit):
                f = self._warm_forces[order[pos[hit]]]
                lam[hit] = np.einsum("kad,kd->ka", cs.frames[hit], f)
                lam = project_cone(lam, cs.mu)
        return lam

    def force(self) -> np.ndarray:
        """H^T lambda as (n, 3) vertex forces, N (zeros when there is no contact)."""
        if not self.contacts.count:
            return np.zeros((self.vertex_count, 3))
        if self._on_device:
            return self._device.force()
        return self.contacts.scatter_forces(self.lam, self.vertex_count)

    def force_device(self):
        """H^T lambda as the device's (n, 3) Taichi array, or None where the forces are
        not on the device (numpy implementation, no contact, or before this step's first
        update has loaded the problem): then use :meth:`force`."""
        if self._on_device and self.contacts.count:
            return self._device.force_device()
        return None

    def update_device(self, q) -> None:
        """:meth:`update` from positions already on the device (a (n, 3) Taichi array of
        the backend's precision, the PD solver's iterate): nothing of size n crosses to
        the host. Only once this step's problem is on the device (:meth:`force_device`
        is not None)."""
        if not self._on_device:
            raise RuntimeError("update_device before the step's contact problem is on the device")
        t0 = time.perf_counter()
        self._update_device(q)
        self._stats["ms_cr"] += 1e3 * (time.perf_counter() - t0)

    # ------------------------------------------------------------------ kinematics
    def kinematics(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gaps d (k,) in m and tangential slip velocities u (k, 2) in m/s at positions q (n, 3).

        d = d0 + n^T (Pi q - Pi q_n) (notes §2.5), or the collider's exact signed
        distance of Pi q when ``exact_gaps``; u = T (Pi (q - q_n) / h - v_obstacle).
        """
        cs = self.contacts
        P = cs.points(q)
        dP = P - cs.point0
        d = cs.gap0 + np.einsum("kd,kd->k", cs.normals, dP)
        if self.exact_gaps:
            for ci in np.unique(cs.collider):
                if ci < 0:
                    continue
                m = cs.collider == ci
                d[m] = self.model.colliders[ci].distance(P[m], self._t_next)
        rel = dP / self._h - cs.surface_velocity
        u = np.einsum("kad,kd->ka", cs.frames[:, 1:, :], rel)
        return d, u

    # ------------------------------------------------------------------ Newton step
    def update(self, q: np.ndarray) -> None:
        """Nonsmooth Newton steps on lambda at the global-step result q (n, 3) (notes §3,
        steps 5.4-5.6): indicators, direct solve of the inactive rows, Conjugate Residual
        on the active rows, line search, cone projection. The first call of a step also
        re-detects with q as a prediction and builds W and the preconditioner."""
        with _single_threaded_blas():
            self._update(q)

    def _update(self, q: np.ndarray) -> None:
        if not self.contacts.count:
            return
        if not self._built:
            self._build(q)
            if not self.contacts.count:
                return
        t0 = time.perf_counter()
        if self._on_device:
            self._update_device(q)
            self._stats["ms_cr"] += 1e3 * (time.perf_counter() - t0)
            return
        d, u = self.kinematics(q)
        for _ in range(self.newton_iterations):
            if self.merit(self.lam, d, u) <= _NEWTON_TOL**2:
                break
            dlam, its = self._newton_step(d, u)
            self._stats["cr_iterations"] += its
            d, u = self._line_search(d, u, dlam)
        self._record(d, u)
        self._stats["ms_cr"] += 1e3 * (time.perf_counter() - t0)

    def _update_device(self, q) -> None:
        self._device.update(q, self.newton_iterations)
        self._lam_stale = True
        self._device_stats = True  # read by stats(), once a step: nothing is read here

    def merit(self, lam: np.ndarray, d: np.ndarray, u: np.ndarray) -> float:
        """Sum of squared NCP residuals in metres at forces lam (k, 3), gaps d, slips u:
        phi(d, r_n lambda_n) for the normal rows and r_t h (lambda_t - Proj(lambda_t -
        u / r_t)) for friction (h u when sticking), the rows the Newton step solves."""
        phi, _, _ = self.ncp(d, self.r_n * lam[:, 0])
        ft = friction_residual(lam[:, 1:], u, self.r_t, self.contacts.mu * np.maximum(lam[:, 0], 0.0))
        ft *= (self.r_t * self._h)[:, None]
        return float(phi @ phi + np.einsum("ka,ka->", ft, ft))

    def _line_search(self, d: np.ndarray, u: np.ndarray, dlam: np.ndarray):
        """Take lambda <- Proj_cone(lambda + alpha dlam) with alpha = 1, 1/2, 1/4, ... (at most
        ``_LINE_SEARCH_STEPS`` halvings) until the merit decreases; return the predicted
        gaps and slips. The prediction is exact for the next global solve (same b): the
        contact points move by C (lambda_new - lambda).

        The full step overshoots when many contacts share one body: each contact's
        stick/slip test uses its own compliance W_jj, larger than its share of the
        body's collective compliance, so a slipping body can flip between slipping
        forwards and backwards without ever testing stick (a conveyor belt at its
        target speed, a ball between rollers). Halving the step lands in between.
        """
        f0 = self.merit(self.lam, d, u)
        alpha = 1.0
        for i in range(_LINE_SEARCH_STEPS + 1):
            new = project_cone(self.lam + alpha * dlam, self.contacts.mu)
            step = new - self.lam
            resp = self.C.matvec(step)
            d1 = d + resp[:, 0]
            u1 = u + resp[:, 1:] / self._h
            if f0 == 0.0 or self.merit(new, d1, u1) < f0 or i == _LINE_SEARCH_STEPS:
                break
            alpha *= 0.5
        self._stats["line_search_halvings"] += i
        self.lam = new
        return d1, u1

    def _newton_step(self, d: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, int]:
        """Delta lambda (k, 3) of one nonsmooth Newton step at gaps d and slips u, and the
        CR iterations spent.

        Rows are expressed in a per-contact tangent basis (e_par, e_perp) aligned with
        the friction trial force y, so that the generalized Jacobian of the disk
        projection is diagonal: for a slipping contact the e_par row puts the force on
        the cone boundary directly (omega = 0, E = 1, as in the notes), and the e_perp
        row keeps the projection's derivative (R / |y|) (I - y y^T / |y|^2), which the
        notes drop. Without it the lagged slip direction oscillates from iteration to
        iteration near the stick-slip threshold, where |u| is small.
        """
        lam, h = self.lam, self._h
        k = len(d)
        res = np.zeros((k, 3))
        omega = np.zeros((k, 3))
        E = np.zeros((k, 3))
        # Signorini row: phi(d, r_n lambda_n); omega = phi_a, E = r_n phi_b (notes §2.6)
        phi, pa, pb = self.ncp(d, self.r_n * lam[:, 0])
        res[:, 0], omega[:, 0], E[:, 0] = phi, pa, self.r_n * pb
        # Coulomb rows (prox form, lagged normal force)
        radius = self.contacts.mu * np.maximum(lam[:, 0], 0.0)
        fs = friction_state(lam[:, 1:], u, self.r_t, radius)
        ny = np.linalg.norm(fs.y, axis=1)
        e_par = np.where((ny > 0)[:, None], fs.y / np.where(ny > 0, ny, 1.0)[:, None], np.array([1.0, 0.0]))
        Q = np.stack([e_par, np.stack([-e_par[:, 1], e_par[:, 0]], axis=1)], axis=1)  # (k, 2, 2) rows
        lt = np.einsum("kab,kb->ka", Q, lam[:, 1:])
        ut = np.einsum("kab,kb->ka", Q, u)
        st = fs.stick
        res[st, 1:] = h * ut[st]  # stick: drive the slip displacement h u to zero
        omega[st, 1:] = 1.0
        sl = ~st
        res[sl, 1] = lt[sl, 0] - radius[sl]  # slip: force on the cone boundary along y
        E[sl, 1] = 1.0
        sp_ = sl & (radius > 0)
        if self.friction_jacobian == "lagged":  # the notes' omega_t = 0, E_t = I for both rows
            res[sp_, 2] = lt[sp_, 1]
            E[sp_, 2] = 1.0
            sp_ = np.zeros_like(sp_)
        scale = ny[sp_] * self.r_t[sp_] * h / radius[sp_]  # row scaling to metres
        res[sp_, 2] = scale * lt[sp_, 1]
        omega[sp_, 2] = 1.0
        E[sp_, 2] = self.r_t[sp_] * h * (ny[sp_] / radius[sp_] - 1.0)
        s0 = sl & ~(radius > 0)  # no normal force: no friction
        res[s0, 2] = lt[s0, 1]
        E[s0, 2] = 1.0
        act = (omega > _OMEGA_TOL).ravel()
        res, omega, E = res.ravel(), omega.ravel(), E.ravel()
        dlam = np.zeros(3 * k)
        ina = ~act
        dlam[ina] = -res[ina] / E[ina]
        its = 0
        if np.any(act):
            C = self.C
            F = self.contacts.frames.copy()
            F[:, 1:, :] = np.einsum("kab,kbd->kad", Q, self.contacts.frames[:, 1:, :])  # (n, e_par, e_perp)
            every = bool(act.all())
            om = omega[act]
            c = -res[act]
            if np.any(dlam[ina]):
                c -= om * C.matvec(dlam.reshape(k, 3), F).ravel()[act]
            eo = E[act] * om
            buf = np.zeros(3 * k)

            def K(x: np.ndarray) -> np.ndarray:
                if every:
                    return om * C.matvec((om * x).reshape(k, 3), F).ravel() + eo * x
                buf[act] = om * x
                return om * C.matvec(buf.reshape(k, 3), F).ravel()[act] + eo * x

            out = conjugate_residual(K, c, iterations=self.config.cr_iterations)
            dlam[act] = om * out.x
            its = out.iterations
        dlam = dlam.reshape(k, 3)
        dlam[:, 1:] = np.einsum("kab,ka->kb", Q, dlam[:, 1:])  # back to (t1, t2)
        return dlam, its

    # ------------------------------------------------------------------ statistics
    def _record(self, d: np.ndarray, u: np.ndarray) -> None:
        lam = self.lam
        cjj = self.compliance
        # natural-map residual with the Delassus diagonal, in metres, so it does not
        # depend on the chosen NCP function or preconditioner
        rn = np.abs(np.minimum(d, cjj * lam[:, 0]))
        ft = friction_residual(lam[:, 1:], u, cjj / self._h, self.contacts.mu * lam[:, 0])
        rt = cjj * np.linalg.norm(ft, axis=1)
        self._stats["ncp_residual"] = float(max(rn.max(), rt.max()))
        self._stats["max_penetration"] = float(max(0.0, -d.min()))
        self._stats["n_touching"] = int(np.count_nonzero(lam[:, 0] > 0))
        self._last_gaps = d

    def stats(self) -> dict:
        """This step's contact statistics.

        n_contacts (pairs in the contact problem), n_touching (lambda_n > 0),
        max_penetration (m, deepest gap among the contacts, predicted for the last global
        solve), ncp_residual (m, largest natural-map residual over the contacts, with the
        Delassus diagonal, independent of the NCP function and preconditioner chosen),
        ms_detect, ms_delassus (W and preconditioner), ms_cr (Newton steps: indicators,
        CR, line search), cr_iterations and line_search_halvings (totals this step),
        delassus_new_rows (rows of W formed this step; the others came from the cache)."""
        if self._device_stats:  # the device counts since this step's load
            dev = self._device
            self._stats.update(dev.statistics(), cr_iterations=dev.cr_total, line_search_halvings=dev.halvings)
            self._device_stats = False
        return dict(self._stats)

    def total_force(self) -> np.ndarray:
        """(3,) sum of the world contact forces on the vertex side of each contact, N (for
        collider contacts: the total force the obstacles exert on the bodies)."""
        if not self.contacts.count:
            return np.zeros(3)
        return self.contacts.to_world(self.lam).sum(axis=0)
