"""The per-iteration contact update of :class:`tisim.contact.ncp.pd_contact.PDContact` in
Taichi kernels.

:class:`DeviceNCP` keeps one step's contact problem on the device - contact points
(vertices, weights), frames, gaps, collider poses, the dense scalar Delassus matrix
W_hat (k x k), the preconditioner and the forces lambda - and runs what
``PDContact.update(q)`` does in numpy as kernels over it: the kinematics (gaps d and
slips u from q, exact collider signed distances), the NCP and proximal friction rows
with their generalized Jacobian, the Conjugate Residual solve of the Newton system
with the (indicator-scaled) Delassus operator, the backtracking line search on the
merit, the cone projection and the force scatter H^T lambda into an (n, 3) array.
The mathematics is that of the numpy path, line by line (same friction_jacobian
modes, line-search rule and tolerances), so the two agree to round-off.

Two ways to launch the same functions (:meth:`DeviceNCP.update`):

* staged (GPU backends): one kernel per stage - kinematics and merit, Newton rows and
  CR start, one per CR iteration, the line search (every trial, then the commit) -
  with parallel loops. The host launches every stage of every Newton step and reads
  nothing: the decisions (Newton converged, trial accepted, CR breakdown) are flags in
  the scalar array, and a stage they rule out runs as an empty launch (its loops over
  zero contacts). The CR iteration and halving counts accumulate there too, read once a
  step with the statistics.
* fused (the CPU backend): the whole update in one launch with serial loops, the
  decisions taken on the device. On the CPU a launch and a thread-pool hand-over cost
  more than the work of a contact solve.

Data: per-contact fields (k, 3), (k, 2), (k,), the dense W_hat (k * k) and flat (3 k,)
Newton-system vectors (row 3 c + a for component a = normal, e_par, e_perp of contact
c) live in a :class:`_Storage` sized by a capacity (1024 contacts first, doubling when
a step has more). Kernels compile per storage, so storages are pooled and re-used, never
re-created per step. Positions q and forces H^T lambda are (n, 3) ndarrays. Values
are in the backend's precision; every reduction accumulates in f64, in fixed blocks
and then serially (no atomics), so results are reproducible run to run.

The Taichi functions the kernels chain live in :mod:`tisim.contact.ncp.device_functions`,
the collider gap test of contact detection in :mod:`tisim.contact.ncp.device_colliders`.

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import weakref

import numpy as np
import taichi as ti

from tisim.contact.ncp import device_line_search as trial_search
from tisim.contact.ncp.device_functions import (
    _BLOCK,
    _COLLIDER_WIDTH,
    _CR_TOTAL,
    _F0,
    _GO,
    _HALVINGS,
    _ITS,
    _MAX_PEN,
    _MERIT,
    _N_SCALARS,
    _NCP_RES,
    _PACKED,
    _TOUCHING,
    LINE_SEARCH_STEPS,
    NCP_CODES,
    NEWTON_TOL,
    _apply,
    _clear_rows,
    _copy_state,
    _cr_direction,
    _cr_init,
    _cr_start,
    _cr_step,
    _kinematics,
    _load_matrix,
    _merit,
    _newton_finish,
    _newton_rows,
    _predict,
    _record,
    _scatter,
    _trial,
    collider_parameters,
    set_serial_loops,
)

# the loops' mode of the kernels here, set with the functions' when the first storage is made
_SERIAL = False


@ti.data_oriented
class _Storage:
    """Fields for up to ``cap`` contacts and the fused kernels over them.

    Each kernel chains the functions of device_functions as top-level loops (Taichi runs them in
    order, each in parallel), so one launch does what the numpy path does between two
    decisions of the host. Fields are template arguments, which Taichi launches several
    times faster than ndarray arguments, but kernels compile per _Storage instance
    (tens of seconds on a loaded 2-core machine): storages are pooled per (capacity,
    precision) and re-used by later DeviceNCP objects (:func:`_acquire`), and the NCP
    function, friction Jacobian and exact-gap switches are kernel arguments, not
    compile-time constants. The (n, 3) positions and forces depend on the model and are
    ndarray arguments of the two kernels that use them.
    """

    def __init__(self, cap: int, ncolliders: int, dtype):
        global _SERIAL
        _SERIAL = set_serial_loops()
        self.cap = cap
        self.ncolliders = ncolliders
        self.dtype = dtype
        f, i32, f64 = dtype, ti.i32, ti.f64
        F = ti.field
        self.sc = F(f64, shape=_N_SCALARS)
        self.cparams = F(f, shape=(ncolliders, _COLLIDER_WIDTH))
        self.vert = F(i32, shape=(cap, 4))
        self.wgt = F(f, shape=(cap, 4))
        self.frames = F(f, shape=(cap, 3, 3))
        self.gap0 = F(f, shape=cap)
        self.point0 = F(f, shape=(cap, 3))
        self.collider = F(i32, shape=cap)
        self.mu = F(f, shape=cap)
        self.surf_vel = F(f, shape=(cap, 3))
        self.r_n = F(f, shape=cap)
        self.r_t = F(f, shape=cap)
        self.cjj = F(f, shape=cap)
        self.W = F(f, shape=cap * cap)
        self.lam = F(f, shape=(cap, 3))
        self.d = F(f, shape=cap)
        self.u = F(f, shape=(cap, 2))
        self.d1 = F(f, shape=cap)
        self.u1 = F(f, shape=(cap, 2))
        self.new = F(f, shape=(cap, 3))
        self.dlam = F(f, shape=(cap, 3))
        self.epar = F(f, shape=(cap, 2))
        self.world = [F(f64, shape=cap) for _ in range(3)]
        m = 3 * cap
        for name in ("res", "om", "E", "dl", "c", "x", "r", "p", "s", "t", "step", "resp"):
            setattr(self, name, F(f, shape=m))
        self.act = F(i32, shape=m)
        self.part = F(f64, shape=m // _BLOCK + 1)
        self.ptr = F(i32, shape=4 * cap + 1)
        self.vtx = F(i32, shape=4 * cap)
        self.entry = F(i32, shape=4 * cap)
        self.tf = trial_search.TrialFields(cap, dtype)  # the line search's trials

    @ti.func
    def _merit_at(self, mode, k, h, lam: ti.template(), d: ti.template(), u: ti.template()):
        _merit(mode, k, h, lam, d, u, self.r_n, self.r_t, self.mu, self.part, self.sc)

    @ti.func
    def _gate(self, k):
        """k, or 0 once the Newton loop has converged: a stage launched with 0 runs no
        loop and writes no scalar, so the host launches every stage of every Newton step
        and reads nothing (the staged update)."""
        g = k
        if self.sc[_GO] == 0.0:
            g = 0
        return g

    @ti.func
    def _newton_gate(self, k):
        """After the merit at the start or at a committed step: F0 = merit, and the next
        Newton step runs while the merit is above NEWTON_TOL^2 (the fused loop's test)."""
        for _ in range(1):
            if k > 0:
                f = self.sc[_MERIT]
                self.sc[_F0] = f
                self.sc[_GO] = 1.0 if f > NEWTON_TOL * NEWTON_TOL else 0.0

    @ti.kernel
    def start(self, mode: ti.i32, exact: ti.i32, k: ti.i32, h: float, q: ti.types.ndarray(ndim=2)):
        """Kinematics at q, then the merit there; opens the Newton gate unless converged."""
        _kinematics(
            exact, k, 1.0 / h, q, self.vert, self.wgt, self.frames, self.gap0,
            self.point0, self.collider, self.cparams, self.surf_vel, self.d, self.u,
        )  # fmt: skip
        self._merit_at(mode, k, h, self.lam, self.d, self.u)
        self._newton_gate(k)

    @ti.kernel
    def merit(self, mode: ti.i32, k: ti.i32, h: float):
        self._merit_at(mode, k, h, self.lam, self.d, self.u)

    @ti.func
    def _apply_op(self, op, k, scale, x: ti.template(), out: ti.template()):
        _apply(
            op, k, scale, self.W, self.frames, self.epar, x, self.om, self.E, self.act,
            self.res, self.world[0], self.world[1], self.world[2], out, self.sc,
        )  # fmt: skip

    @ti.kernel
    def newton_begin(self, mode: ti.i32, lagged: ti.i32, k: ti.i32, h: float, scale: float):
        """Newton rows, the CR right-hand side, and CR's start (r = c, s = t = K r)."""
        kk = self._gate(k)
        _newton_rows(
            mode, lagged, kk, h, self.lam, self.d, self.u, self.r_n, self.r_t,
            self.mu, self.res, self.om, self.E, self.act, self.epar, self.dl,
        )  # fmt: skip
        self._apply_op(1, kk, scale, self.dl, self.c)
        _cr_init(3 * kk, self.c, self.x, self.r, self.p, self.part, self.sc)
        self._apply_op(0, kk, scale, self.r, self.s)
        _cr_start(3 * kk, self.r, self.s, self.t, self.part, self.sc)

    @ti.kernel
    def cr_iteration(self, it: ti.i32, k: ti.i32, scale: float):
        """One CR iteration followed by the next direction."""
        kk = self._gate(k)
        m = 3 * kk
        _cr_step(it, m, self.x, self.r, self.p, self.t, self.part, self.sc)
        self._apply_op(0, kk, scale, self.r, self.s)
        _cr_direction(m, self.r, self.s, self.p, self.t, self.part, self.sc)

    @ti.kernel
    def cr_last(self, it: ti.i32, k: ti.i32):
        """The last CR iteration and the Newton direction dlam in (t1, t2); the CR
        iterations spent join sc[_CR_TOTAL]."""
        kk = self._gate(k)
        _cr_step(it, 3 * kk, self.x, self.r, self.p, self.t, self.part, self.sc)
        _newton_finish(kk, self.x, self.om, self.act, self.dl, self.epar, self.dlam)
        for _ in range(1):
            if kk > 0:
                self.sc[_CR_TOTAL] += self.sc[_ITS]

    @ti.kernel
    def line_search(self, mode: ti.i32, k: ti.i32, h: float, scale: float):
        """The backtracking line search with every trial evaluated at once
        (:mod:`~tisim.contact.ncp.device_line_search`), then the chosen trial becomes
        (lambda, d, u) and its merit decides the next Newton step: one launch, nothing
        read."""
        kk = self._gate(k)
        trial_search.trials(kk, self.lam, self.dlam, self.mu, self.frames, self.epar, self.tf)
        trial_search.responses(kk, scale, 1.0 / h, self.W, self.frames, self.epar, self.d, self.u, self.tf)
        trial_search.merits_and_choice(mode, kk, h, self.r_n, self.r_t, self.mu, self.tf, self.sc)
        trial_search.take_chosen(kk, self.tf, self.sc, self.lam, self.d, self.u)
        self._merit_at(mode, kk, h, self.lam, self.d, self.u)
        self._newton_gate(kk)

    @ti.kernel
    def update_all(
        self,
        mode: ti.i32,
        lagged: ti.i32,
        exact: ti.i32,
        k: ti.i32,
        h: float,
        scale: float,
        its: ti.i32,
        newton_iterations: ti.i32,
        q: ti.types.ndarray(ndim=2),
    ):
        """The whole update in one launch, every loop inside one serial loop (the CPU
        backend, where a launch costs more than a small problem's work): the same
        functions, in the order DeviceNCP.update launches them, the host's decisions
        (merit test, line-search acceptance) taken here. sc[_CR_TOTAL], sc[_HALVINGS]
        accumulate the CR iterations and halvings (from zero at the step's unpack)."""
        ti.loop_config(serialize=True)
        for _ in range(1):
            m = 3 * k
            _kinematics(
                exact, k, 1.0 / h, q, self.vert, self.wgt, self.frames, self.gap0,
                self.point0, self.collider, self.cparams, self.surf_vel, self.d, self.u,
            )  # fmt: skip
            for _nt in range(newton_iterations):
                self._merit_at(mode, k, h, self.lam, self.d, self.u)
                f0 = self.sc[_MERIT]
                if f0 <= NEWTON_TOL * NEWTON_TOL:
                    break
                _newton_rows(
                    mode, lagged, k, h, self.lam, self.d, self.u, self.r_n, self.r_t,
                    self.mu, self.res, self.om, self.E, self.act, self.epar, self.dl,
                )  # fmt: skip
                # the CR right-hand side (it = -1), then its iterations; each product
                # K r is followed by CR's start (it = 0) or its next direction
                for it in range(-1, its):
                    if it == -1:
                        self._apply_op(1, k, scale, self.dl, self.c)
                        _cr_init(m, self.c, self.x, self.r, self.p, self.part, self.sc)
                    else:
                        self._apply_op(0, k, scale, self.r, self.s)
                        if it == 0:
                            _cr_start(m, self.r, self.s, self.t, self.part, self.sc)
                        else:
                            _cr_direction(m, self.r, self.s, self.p, self.t, self.part, self.sc)
                        _cr_step(it, m, self.x, self.r, self.p, self.t, self.part, self.sc)
                _newton_finish(k, self.x, self.om, self.act, self.dl, self.epar, self.dlam)
                self.sc[_CR_TOTAL] += self.sc[_ITS]
                alpha = 1.0
                for ls in range(LINE_SEARCH_STEPS + 1):
                    _trial(k, alpha, self.lam, self.dlam, self.mu, self.new, self.step)
                    self._apply_op(2, k, scale, self.step, self.resp)
                    _predict(k, 1.0 / h, self.d, self.u, self.resp, self.d1, self.u1)
                    accept = f0 == 0.0 or ls == LINE_SEARCH_STEPS
                    if not accept:
                        self._merit_at(mode, k, h, self.new, self.d1, self.u1)
                        accept = self.sc[_MERIT] < f0
                    if accept:
                        self.sc[_HALVINGS] += ls
                        break
                    alpha *= 0.5
                _copy_state(k, self.new, self.d1, self.u1, self.lam, self.d, self.u)
            _record(k, 1.0 / h, self.lam, self.d, self.u, self.cjj, self.mu, self.sc)

    @ti.kernel
    def read_scalars(self, out: ti.types.ndarray(ndim=1)):
        """out = sc (a host array): a serial copy, cheaper than a field's to_numpy on the
        CPU backend (22 against 145 us)."""
        ti.loop_config(serialize=_SERIAL)
        for i in range(_N_SCALARS):
            out[i] = self.sc[i]

    @ti.kernel
    def record(self, k: ti.i32, h: float):
        _record(k, 1.0 / h, self.lam, self.d, self.u, self.cjj, self.mu, self.sc)

    @ti.kernel
    def scatter(self, nv: ti.i32, force: ti.types.ndarray(ndim=2)):
        _scatter(nv, self.ptr, self.vtx, self.entry, self.lam, self.frames, self.wgt, force)

    @ti.kernel
    def unpack(
        self,
        k: ti.i32,
        fa: ti.types.ndarray(ndim=2),
        ia: ti.types.ndarray(ndim=2),
        nv: ti.i32,
        ga: ti.types.ndarray(ndim=1),
    ):
        """Per-contact data from one packed float array (k, _PACKED) and one int array
        (k, 5), and the force gather's lists from ga = [ptr (nv + 1), vtx (nv), entry
        (4 k)], laid out by DeviceNCP.load: one launch instead of one copy per field.
        Starts the step's CR-iteration and halving counts at zero."""
        for _ in range(1):
            self.sc[_CR_TOTAL] = 0.0
            self.sc[_HALVINGS] = 0.0
        ti.loop_config(serialize=_SERIAL)
        for i in range(nv + 1):
            self.ptr[i] = ga[i]
        ti.loop_config(serialize=_SERIAL)
        for i in range(nv):
            self.vtx[i] = ga[nv + 1 + i]
        ti.loop_config(serialize=_SERIAL)
        for i in range(4 * k):
            self.entry[i] = ga[2 * nv + 1 + i]
        ti.loop_config(serialize=_SERIAL)
        for i in range(k):
            for j in ti.static(range(4)):
                self.vert[i, j] = ia[i, j]
                self.wgt[i, j] = fa[i, j]
            for a, b in ti.static(ti.ndrange(3, 3)):
                self.frames[i, a, b] = fa[i, 4 + 3 * a + b]
            self.gap0[i] = fa[i, 13]
            self.collider[i] = ia[i, 4]
            self.mu[i] = fa[i, 17]
            self.r_n[i] = fa[i, 21]
            self.r_t[i] = fa[i, 22]
            self.cjj[i] = fa[i, 23]
            for a in ti.static(range(3)):
                self.point0[i, a] = fa[i, 14 + a]
                self.surf_vel[i, a] = fa[i, 18 + a]
                self.lam[i, a] = fa[i, 24 + a]

    @ti.kernel
    def clear_rows(self, nv: ti.i32, force: ti.types.ndarray(ndim=2)):
        _clear_rows(nv, self.vtx, force)


# Free storages by (Taichi runtime, capacity, colliders, precision); a DeviceNCP holds one
# while it lives. The runtime is part of the key: after backend.reset() and a new init the
# old fields are gone.
_POOL: dict = {}


def _runtime_id() -> int:
    from taichi.lang import impl

    return id(impl.get_runtime().prog)


def _acquire(cap: int, ncolliders: int, dtype) -> _Storage:
    key = (_runtime_id(), cap, ncolliders, dtype)
    if not _POOL.get(key):
        import gc

        gc.collect()  # a solver dropped in a reference cycle still holds its storage
    free = _POOL.get(key)
    if free:
        return free.pop()
    st = _Storage(cap, ncolliders, dtype)
    st.runtime = key[0]
    return st


def _release(st: _Storage) -> None:
    _POOL.setdefault((st.runtime, st.cap, st.ncolliders, st.dtype), []).append(st)


def clear_pool() -> None:
    """Drop the pooled storages (call before tearing Taichi down)."""
    _POOL.clear()


class DeviceNCP:
    """One step's contact problem on the device and the kernels of its Newton update.

    vertex_count: n. ncp: "fischer-burmeister" or "min-map". friction_jacobian: "full"
    or "lagged" (see PDContact). exact_gaps: collider gaps by their exact signed
    distance. cr_iterations: Conjugate Residual iterations per Newton step.
    dtype: np.float64 or np.float32 for the per-contact fields (reductions are f64).
    capacity: contacts the first allocation holds (it doubles when a step has more).

    Use: :meth:`load` once per step (after detection and W_hat), then :meth:`update`
    per local-global iteration and :meth:`force` for H^T lambda.

    References: as PDContact (notes §2.6-2.10, §3).
    Limitations: W_hat is dense (k^2 memory, k^2 work per product, one thread per row);
    q arrives and H^T lambda leaves as numpy (n, 3) arrays (the PD solver's interface);
    growing the capacity compiles the kernels again (once per doubling).
    """

    def __init__(
        self,
        vertex_count: int,
        *,
        ncp: str = "fischer-burmeister",
        friction_jacobian: str = "full",
        exact_gaps: bool = True,
        cr_iterations: int = 10,
        dtype=np.float64,
        capacity: int = 1024,
    ):
        if ncp not in NCP_CODES:
            raise ValueError(f"unknown NCP function {ncp!r}; expected one of {sorted(NCP_CODES)}")
        if friction_jacobian not in ("full", "lagged"):
            raise ValueError(f"friction_jacobian must be 'full' or 'lagged', got {friction_jacobian!r}")
        self.n = int(vertex_count)
        self.mode = NCP_CODES[ncp]
        self.lagged = friction_jacobian == "lagged"
        self.exact = bool(exact_gaps)
        self.cr_iterations = int(cr_iterations)
        self.np_dtype = np.dtype(dtype)
        self.ti_dtype = ti.f64 if self.np_dtype == np.float64 else ti.f32
        self.k = 0
        self.h = 0.0
        self.scale = 0.0
        self.st = None
        self._capacity = max(int(capacity), 16)
        self._ncol = 8
        self._nv = 0
        self.q = ti.ndarray(self.ti_dtype, shape=(max(self.n, 1), 3))
        self.force_dev = ti.ndarray(self.ti_dtype, shape=(max(self.n, 1), 3))
        self.force_dev.fill(0)
        self._finalizer = None
        self._force_host = None
        self._force_dev_fresh = False  # force_dev holds H^T lambda of the current lambda
        self._sc_read = None  # the scalars as last read, None once they changed
        self._sc_buf = np.empty(_N_SCALARS)  # read_scalars' target, allocated once

    @property
    def cap(self) -> int:
        return self.st.cap if self.st is not None else 0

    # ------------------------------------------------------------------ storage
    def _ensure(self, k: int, ncol: int) -> None:
        cap = self._capacity
        while cap < k:
            cap *= 2
        while self._ncol < ncol:
            self._ncol *= 2
        if self.st is not None and cap == self.st.cap and self._ncol == self.st.ncolliders:
            return
        self._capacity = cap
        if self._finalizer is not None:
            self._finalizer()  # back to the pool
        self.st = _acquire(cap, self._ncol, self.ti_dtype)
        self._finalizer = weakref.finalize(self, _release, self.st)

    def warm_up(self, ncolliders: int = 0) -> None:
        """Compile the kernels now (launching them on an empty problem) rather than at
        the first contact, where it would stall a frame (seconds; Taichi's offline
        cache keeps them for later processes)."""
        self._ensure(1, ncolliders)
        st, h = self.st, 1.0
        _load_matrix(0, np.zeros((1, 1), dtype=self.np_dtype), st.W)
        st.unpack(
            0, np.zeros((1, _PACKED), dtype=self.np_dtype), np.zeros((1, 5), np.int32), 0,
            np.zeros(1, np.int32),
        )  # fmt: skip
        st.clear_rows(0, self.force_dev)
        st.scatter(0, self.force_dev)
        st.read_scalars(np.empty(_N_SCALARS))
        if _SERIAL:
            st.update_all(self.mode, 0, 0, 0, h, 1.0, 1, 1, self.q)
        else:
            st.start(self.mode, 0, 0, h, self.q)
            st.merit(self.mode, 0, h)
            st.newton_begin(self.mode, 0, 0, h, 1.0)
            st.cr_iteration(0, 0, 1.0)
            st.cr_last(0, 0)
            st.line_search(self.mode, 0, h, 1.0)
            st.record(0, h)
        ti.sync()

    def _put(self, dst, a: np.ndarray, dtype=None) -> None:
        """Copy a (k, ...) host array into the first k rows of a capacity-sized field."""
        dt = self.np_dtype if dtype is None else dtype
        full = np.zeros(dst.shape, dtype=dt)
        if a.size:
            full[: a.shape[0]] = a
        dst.from_numpy(full)

    # ------------------------------------------------------------------ per step
    def load(
        self,
        contacts,
        W_hat: np.ndarray,
        r_n: np.ndarray,
        r_t: np.ndarray,
        compliance: np.ndarray,
        scale: float,
        h: float,
        lam: np.ndarray,
        colliders=(),
        t: float = 0.0,
    ) -> None:
        """Upload one step's contact problem.

        contacts: ContactSet (k contacts). W_hat: (k, k) B^T A_hat^-1 B. r_n (k,) m/N,
        r_t (k,) (m/s)/N: the preconditioner; compliance: (k,) the diagonal of C, m/N.
        scale: s in C = s H A^-1 H^T. h: time step, s. lam: (k, 3) initial forces, N.
        colliders, t: the model's colliders and the time (s) their poses are taken at.
        """
        k = contacts.count
        if self.st is not None and self._nv:
            self.st.clear_rows(self._nv, self.force_dev)  # the previous step's force rows
        self._ensure(k, len(colliders))
        st = self.st
        self.k = k
        self.h = float(h)
        self.scale = float(scale)
        # vertex -> (contact, slot) lists of the force gather, in the order
        # ContactSet.scatter_forces sums (contact, then slot)
        verts = contacts.vertices.ravel()
        order = np.argsort(verts, kind="stable")
        uv, start = np.unique(verts[order], return_index=True)
        nv = len(uv)
        ga = np.concatenate([start, [len(verts)], uv, order]).astype(np.int32)
        if k:
            fa = np.empty((k, _PACKED), dtype=self.np_dtype)
            fa[:, 0:4] = contacts.weights
            fa[:, 4:13] = contacts.frames.reshape(k, 9)
            fa[:, 13] = contacts.gap0
            fa[:, 14:17] = contacts.point0
            fa[:, 17] = contacts.mu
            fa[:, 18:21] = contacts.surface_velocity
            fa[:, 21] = r_n
            fa[:, 22] = r_t
            fa[:, 23] = compliance
            fa[:, 24:27] = np.asarray(lam, dtype=np.float64).reshape(k, 3)
            ia = np.empty((k, 5), dtype=np.int32)
            ia[:, :4] = contacts.vertices
            ia[:, 4] = contacts.collider
            st.unpack(k, fa, ia, nv, ga)
            _load_matrix(k, np.ascontiguousarray(W_hat, dtype=self.np_dtype), st.W)
        self._put(st.cparams, collider_parameters(colliders, t))
        self._nv = nv
        self._lam_changed()

    def set_lam(self, lam: np.ndarray) -> None:
        """Replace the forces (k, 3) frame components, N."""
        self._put(self.st.lam, np.asarray(lam, dtype=np.float64).reshape(-1, 3))
        self._lam_changed()

    def get_lam(self) -> np.ndarray:
        """(k, 3) the forces, N (one device read)."""
        return self.st.lam.to_numpy()[: self.k].astype(np.float64)

    # ------------------------------------------------------------------ kernels
    def _scalars(self) -> np.ndarray:
        """The scalar array (one read, kept until the device's scalars change)."""
        if self._sc_read is None:
            self.st.read_scalars(self._sc_buf)
            self._sc_read = self._sc_buf
        return self._sc_read

    def _scalar(self, slot: int) -> float:
        return float(self._scalars()[slot])

    @property
    def cr_total(self) -> int:
        """CR iterations of this step's updates (since :meth:`load`; read from the device)."""
        return int(self._scalar(_CR_TOTAL)) if self.k else 0

    @property
    def halvings(self) -> int:
        """Line-search halvings of this step's updates (since :meth:`load`)."""
        return int(self._scalar(_HALVINGS)) if self.k else 0

    def _lam_changed(self) -> None:
        self._sc_read = None  # the scalars changed since they were last read
        self._force_host = None
        self._force_dev_fresh = False

    def _q_array(self, q):
        """The positions as a (n, 3) Taichi array of this precision: a Taichi array of that
        type is used as it is (it stays on the device: the PD solver passes its own
        iterate), anything else is copied into self.q."""
        if isinstance(q, ti.Ndarray) and q.dtype == self.ti_dtype and tuple(q.shape) == tuple(self.q.shape):
            return q
        if isinstance(q, ti.Ndarray):
            q = q.to_numpy()
        self.q.from_numpy(np.ascontiguousarray(q, dtype=self.np_dtype))
        return self.q

    def kinematics(self, q) -> float:
        """d, u on the device from positions q (n, 3; numpy or a Taichi array); returns
        the merit there."""
        self.st.start(self.mode, int(self.exact), self.k, self.h, self._q_array(q))
        self._sc_read = None
        return self._scalar(_MERIT)

    def merit(self) -> float:
        """The merit (m^2) at the current (lambda, d, u)."""
        self.st.merit(self.mode, self.k, self.h)
        self._sc_read = None
        return self._scalar(_MERIT)

    def _open(self, f0: float | None = None) -> None:
        """Open the stages' gate from the host (the single-stage methods below, for tests
        and diagnostics); f0: the merit a line search must go below."""
        sc = self.st.sc
        sc[_GO] = 1.0
        if f0 is not None:
            sc[_F0] = float(f0)
        self._sc_read = None

    def _newton_stages(self) -> None:
        st, k = self.st, self.k
        st.newton_begin(self.mode, int(self.lagged), k, self.h, self.scale)
        its = self.cr_iterations
        for i in range(its - 1):
            st.cr_iteration(i, k, self.scale)
        st.cr_last(its - 1, k)

    def newton_step(self) -> int:
        """One Newton direction into the dlam field at the current (lambda, d, u);
        returns the CR iterations spent."""
        self._open()
        self._newton_stages()
        self._sc_read = None
        return int(self._scalar(_ITS))

    def line_search(self, f0: float) -> int:
        """lambda <- Proj(lambda + alpha dlam), alpha = 1, 1/2, ... until the merit drops
        below f0 (at most LINE_SEARCH_STEPS halvings); d, u move to their prediction and
        the merit there is left in the scalars. Returns the halvings."""
        before = self.halvings
        self._open(f0)
        self.st.line_search(self.mode, self.k, self.h, self.scale)
        self._lam_changed()
        return self.halvings - before

    def update(self, q: np.ndarray, newton_iterations: int, fused: bool | None = None) -> None:
        """PDContact.update on the device: kinematics at q (n, 3), then up to
        ``newton_iterations`` Newton steps with line search, then the statistics.

        fused: one launch for the whole update (default on the CPU backend) or one per
        stage (default on GPUs). Either way the decisions (merit test, line-search
        acceptance) are taken on the device and nothing is read: the staged update
        launches every stage of every Newton step, a stage after convergence gated to
        an empty launch (:meth:`_Storage._gate`), and its line search evaluates every
        trial at once. The statistics are read when asked for."""
        if not self.k:
            return
        st = self.st
        if fused is None:
            fused = _SERIAL
        if fused:
            st.update_all(
                self.mode, int(self.lagged), int(self.exact), self.k, self.h, self.scale,
                self.cr_iterations, int(newton_iterations), self._q_array(q),
            )  # fmt: skip
        else:
            st.start(self.mode, int(self.exact), self.k, self.h, self._q_array(q))
            for _ in range(int(newton_iterations)):
                self._newton_stages()
                st.line_search(self.mode, self.k, self.h, self.scale)
            st.record(self.k, self.h)
        self._lam_changed()

    def statistics(self) -> dict:
        """ncp_residual (m), max_penetration (m), n_touching of the last update."""
        s = self._scalars()
        return {
            "ncp_residual": float(s[_NCP_RES]),
            "max_penetration": float(s[_MAX_PEN]),
            "n_touching": int(s[_TOUCHING]),
        }

    def gaps_and_slips(self) -> tuple[np.ndarray, np.ndarray]:
        """(d (k,), u (k, 2)) on the host (for tests)."""
        k = self.k
        return (
            self.st.d.to_numpy()[:k].astype(np.float64),
            self.st.u.to_numpy()[:k].astype(np.float64),
        )

    def direction(self) -> np.ndarray:
        """(k, 3) the last Newton direction (for tests)."""
        return self.st.dlam.to_numpy()[: self.k].astype(np.float64)

    def force_device(self):
        """H^T lambda as a (n, 3) Taichi array of vertex forces, N, on the device (one
        gather kernel when lambda changed; nothing is read)."""
        if not self._force_dev_fresh:
            if self.k:
                self.st.scatter(self._nv, self.force_dev)
            self._force_dev_fresh = True
        return self.force_dev

    def force(self) -> np.ndarray:
        """H^T lambda as (n, 3) vertex forces, N (one gather kernel and one read, cached
        until lambda changes)."""
        if self._force_host is None:
            self._force_host = self.force_device().to_numpy().astype(np.float64, copy=False)
        return self._force_host
