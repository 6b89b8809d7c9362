"""The device side of the local-global solver: :class:`PDKernels` (the arrays of one
model and the kernel calls on them) and the kernels over vertices that the global steps
and the contact coupling use (norms, scaled rows, gathers and scatters, the rank-one drag
correction, Jacobi-Chebyshev sweeps). The local half's kernels are in
:mod:`tisim.solvers.pd.local`, Anderson acceleration's in :mod:`tisim.solvers.pd.anderson`.

This module has no ``from __future__ import annotations``: Taichi reads the
kernels' type annotations when they are decorated.
"""

import numpy as np
import taichi as ti

from tisim.solvers.pd import anderson as _anderson_kernels
from tisim.solvers.pd import local as _local_kernels
from tisim.solvers.pd.anderson import (
    iterate_anderson,
)
from tisim.solvers.pd.local import (
    _FREE,
    _LAM,
    _MASS,
    _MASSC,
    _MU,
    _VOL,
    _WQN,
    _WROT,
    _WVOL,
    ARAP,
    COROTATED,
    NEO_HOOKEAN,
    SYMMETRIC_DIRICHLET,
    SYMMETRIC_GRADIENT,
    _is_f64,
    _np_real,
    iterate,
    iterate_stored,
    iterate_with_energy,
    local_step,
    material_flags,
    nd,
    potential_energy,
    residual,
    row3,
    set_row3,
)

# the loops' mode of the kernels here; see tisim.solvers.pd.local._SERIAL
_SERIAL = False


@ti.kernel
def norm_sq(r: nd) -> float:
    total = 0.0
    ti.loop_config(serialize=_SERIAL)
    for v in range(r.shape[0]):
        total += row3(r, v).norm_sqr()
    return total


@ti.kernel
def add_scaled_rows(r: nd, VF: nd, f: nd, scale: float):
    """r += scale * f on free vertices (f: (n, 3), e.g. contact forces)."""
    ti.loop_config(serialize=_SERIAL)
    for v in range(r.shape[0]):
        if VF[v, _FREE] != 0.0:
            set_row3(r, v, row3(r, v) + scale * row3(f, v))


@ti.kernel
def set_scaled_rows(r: nd, VF: nd, f: nd, scale: float):
    """r = scale * f on free vertices, 0 on held ones."""
    ti.loop_config(serialize=_SERIAL)
    for v in range(r.shape[0]):
        res = ti.Vector([0.0, 0.0, 0.0])
        if VF[v, _FREE] != 0.0:
            res = scale * row3(f, v)
        set_row3(r, v, res)


@ti.kernel
def set_scaled_difference(r: nd, VF: nd, fa: nd, fb: nd, scale: float, gidx: nd, gout: nd):
    """r = scale * (fa - fb) on free vertices, 0 on held ones; then gout[i] = r[gidx[i]]
    (the global step's gather, gidx may be empty)."""
    ti.loop_config(serialize=_SERIAL)
    for v in range(r.shape[0]):
        res = ti.Vector([0.0, 0.0, 0.0])
        if VF[v, _FREE] != 0.0:
            res = scale * (row3(fa, v) - row3(fb, v))
        set_row3(r, v, res)
    ti.loop_config(serialize=_SERIAL)
    for i in range(gidx.shape[0]):
        set_row3(gout, i, row3(r, gidx[i]))


@ti.kernel
def gather_rows(src: nd, index: nd, out: nd):
    """out[i] = src[index[i]]."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(index.shape[0]):
        set_row3(out, i, row3(src, index[i]))


@ti.kernel
def scatter_add_rows(dst: nd, index: nd, delta: nd):
    """dst[index[i]] += delta[i] (index injective)."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(index.shape[0]):
        v = index[i]
        set_row3(dst, v, row3(dst, v) + row3(delta, i))


@ti.kernel
def copy_rows(dst: nd, src: nd):
    ti.loop_config(serialize=_SERIAL)
    for v in range(dst.shape[0]):
        set_row3(dst, v, row3(src, v))


@ti.kernel
def save_row(x: nd, v: ti.i32, saved: nd):
    set_row3(saved, 0, row3(x, v))


@ti.kernel
def rank_one_correction(x: nd, column: nd, v: ti.i32, saved: nd, coef: float):
    """Sherman-Morrison for the drag spring: with y = x[v] - saved (the plain solve's
    displacement of v), x -= column * coef * y."""
    s = coef * (row3(x, v) - row3(saved, 0))
    ti.loop_config(serialize=_SERIAL)
    for i in range(x.shape[0]):
        set_row3(x, i, row3(x, i) - column[i] * s)


@ti.kernel
def jacobi_chebyshev(
    x: nd,
    x_prev: nd,
    r: nd,
    VF: nd,
    diag: nd,
    gamma: float,
    omega: float,
    drag_vertex: ti.i32,
    drag_add: float,
):
    """One Jacobi sweep with relaxation gamma and Chebyshev weight omega (Wang 2015):
    x_new = omega (gamma D^-1 r + x - x_prev) + x_prev on free vertices."""
    for v in range(x.shape[0]):
        if VF[v, _FREE] != 0.0:
            d = diag[v]
            if v == drag_vertex:
                d += drag_add
            xv = row3(x, v)
            xp = row3(x_prev, v)
            set_row3(x_prev, v, xv)
            set_row3(x, v, omega * (gamma * row3(r, v) / d + xv - xp) + xp)


class PDKernels:
    """The arrays of :class:`~tisim.solvers.pd.solver.SolverPD` for one model, and the
    kernel calls on them.

    n vertices, m tets. Per element (EI, EF, Dm_inv, quat): tet vertices,
    incidence slots, material, volume, Lamé parameters, the three weights
    (w_rot: projective rotation term, w_qn: quasi-Newton term, w_vol: projective
    volume constraint) and the rotation warm start (unit quaternion). Per vertex:
    x (the iterate, m), x_tilde (inertial prediction, m), VF (mass_c = (1 + c h) m,
    mass in kg; free: 1.0 unless held), r (residual of the global system, notes'
    scaling: kg m), x_prev (Jacobi-Chebyshev history), work/work2 (permuted
    vectors of the global step); all (n, 3) unless stated.
    """

    def __init__(
        self,
        tets: np.ndarray,
        Dm_inv: np.ndarray,
        volume: np.ndarray,
        material: np.ndarray,
        vertex_count: int,
        volume_constraint: bool,
    ):
        global _SERIAL
        from tisim import backend

        _SERIAL = backend.current().arch == "cpu"
        _local_kernels._SERIAL = _anderson_kernels._SERIAL = _SERIAL
        real = ti.f64 if _is_f64() else ti.f32
        self.np_real = _np_real()
        self.rsq = None  # residuals left on the device (iterate_stored), grown on demand
        self._real = real
        n, m = int(vertex_count), len(tets)
        self.n, self.m = n, m
        present = {int(k) for k in np.unique(material)}
        unknown = present - {ARAP, COROTATED, NEO_HOOKEAN, SYMMETRIC_DIRICHLET, SYMMETRIC_GRADIENT}
        if unknown:
            raise ValueError(f"unsupported material index {sorted(unknown)}")
        self.flags = material_flags(present, volume_constraint)
        self.EI = ti.ndarray(ti.i32, shape=(m, 9))
        self.EF = ti.ndarray(real, shape=(m, 6))
        self.Dm_inv = ti.ndarray(real, shape=(m, 3, 3))
        self.quat = ti.ndarray(real, shape=(m, 4))
        self.contrib = ti.ndarray(real, shape=(4 * m, 3))
        self.inc_ptr = ti.ndarray(ti.i32, shape=n + 1)
        self.VF = ti.ndarray(real, shape=(n, 3))
        self.x = ti.ndarray(real, shape=(n, 3))
        self.x_tilde = ti.ndarray(real, shape=(n, 3))
        self.x_prev = ti.ndarray(real, shape=(n, 3))
        self.r = ti.ndarray(real, shape=(n, 3))
        self.work = ti.ndarray(real, shape=(n, 3))
        self.work2 = ti.ndarray(real, shape=(n, 3))
        self.saved = ti.ndarray(real, shape=(1, 3))
        self.kept = ti.ndarray(real, shape=(n, 3))  # the contact forces iterate() last added
        self._out = np.zeros(1, dtype=self.np_real)  # scalar results besides the return value

        tets = np.asarray(tets, dtype=np.int64)
        # incidence lists: slot of (e, a) in the vertex-sorted order of tets.ravel()
        flat = tets.ravel()
        order = np.argsort(flat, kind="stable")
        slot = np.empty(4 * m, dtype=np.int64)
        slot[order] = np.arange(4 * m)
        ei = np.concatenate([tets, slot.reshape(m, 4), np.asarray(material).reshape(m, 1)], axis=1)
        self.EI.from_numpy(np.ascontiguousarray(ei, dtype=np.int32))
        self._EF = np.zeros((m, 6), dtype=self.np_real)
        self._EF[:, _VOL] = volume
        self.EF.from_numpy(self._EF)
        self.Dm_inv.from_numpy(np.ascontiguousarray(Dm_inv, dtype=self.np_real))
        ptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.bincount(flat, minlength=n), out=ptr[1:])
        self.inc_ptr.from_numpy(ptr)
        self._VF = np.zeros((n, 3), dtype=self.np_real)
        self._VF[:, _FREE] = 1.0
        self.VF.from_numpy(self._VF)
        self.reset_rotations()

    # ------------------------------------------------------------------ set-up
    def reset_rotations(self) -> None:
        q = np.zeros((self.m, 4), dtype=self.np_real)
        q[:, 0] = 1.0
        self.quat.from_numpy(q)

    def set_element_parameters(self, mu, lam, w_rot, w_qn, w_vol) -> None:
        for col, a in ((_MU, mu), (_LAM, lam), (_WROT, w_rot), (_WQN, w_qn), (_WVOL, w_vol)):
            self._EF[:, col] = a
        self.EF.from_numpy(self._EF)

    def set_masses(self, mass_c, mass) -> None:
        self._VF[:, _MASSC] = mass_c
        self._VF[:, _MASS] = mass
        self.VF.from_numpy(self._VF)

    def set_free(self, free_mask: np.ndarray) -> None:
        self._VF[:, _FREE] = np.asarray(free_mask, dtype=bool)
        self.VF.from_numpy(self._VF)

    # ------------------------------------------------------------------ kernels
    def local_step(self, rot_iters: int) -> None:
        local_step(self.EI, self.EF, self.Dm_inv, self.quat, self.x, self.contrib, rot_iters, self.flags)

    def residual(self, A, h2: float, drag_vertex: int, drag_k: float, drag_target) -> float:
        """r = b - A x (A: DeviceCSR); returns ||r||^2."""
        return residual(
            self.inc_ptr,
            self.contrib,
            self.VF,
            self.x_tilde,
            self.x,
            self.r,
            A.indptr,
            A.indices,
            A.data,
            h2,
            drag_vertex,
            drag_k,
            drag_target,
        )

    def iterate(
        self,
        rot_iters: int,
        A,
        h2: float,
        drag_vertex: int,
        drag_k: float,
        drag_target,
        gidx,
        gout,
        force=None,
        force_scale: float = 0.0,
    ) -> float:
        """local_step + residual + gather r[gidx] into gout, in one launch; returns ||r||^2.
        force: contact forces as a (n, 3) Taichi array, added to the residual as
        r += force_scale force and copied into :attr:`kept` (for
        :meth:`set_residual_difference` after the contact update), in the same launch."""
        with_force = force is not None
        return iterate(
            self.EI, self.EF, self.Dm_inv, self.quat, self.x, self.contrib, rot_iters,
            self.inc_ptr, self.VF, self.x_tilde, self.r, A.indptr, A.indices, A.data, h2,
            drag_vertex, drag_k, drag_target, gidx, gout,
            force if with_force else self.r, self.kept if with_force else self.r,
            force_scale, self.flags, with_force,
        )  # fmt: skip

    def iterate_stored(
        self,
        slot: int,
        rot_iters: int,
        A,
        h2: float,
        drag_vertex: int,
        drag_k: float,
        drag_target,
        gidx,
        gout,
        force=None,
        force_scale: float = 0.0,
    ) -> None:
        """:meth:`iterate` with ||r||^2 kept on the device in :attr:`rsq` [slot] (grown to
        hold ``slot``); read them with :meth:`read_rsq`."""
        from tisim import backend

        if self.rsq is None or self.rsq.shape[0] <= slot:
            size = max(16, 2 * (slot + 1))
            self.rsq = ti.ndarray(dtype=backend.real(), shape=size)
        with_force = force is not None
        iterate_stored(
            self.EI, self.EF, self.Dm_inv, self.quat, self.x, self.contrib, rot_iters,
            self.inc_ptr, self.VF, self.x_tilde, self.r, A.indptr, A.indices, A.data, h2,
            drag_vertex, drag_k, drag_target, gidx, gout,
            force if with_force else self.r, self.kept if with_force else self.r,
            force_scale, self.flags, with_force, self.rsq, slot,
        )  # fmt: skip

    def read_rsq(self, count: int) -> np.ndarray:
        """The first ``count`` stored ||r||^2 (one read of the device)."""
        from tisim import backend

        return np.asarray(backend.download(self.rsq, count), dtype=np.float64)

    def iterate_energy(
        self, rot_iters: int, A, h2: float, drag_vertex: int, drag_k: float, drag_target, gidx, gout
    ) -> tuple[float, float]:
        """Like :meth:`iterate`, and the incremental potential at x in the same launch:
        returns (||r||^2, E in J)."""
        rsq = self._iterate(
            iterate_with_energy, rot_iters, A, h2, drag_vertex, drag_k, drag_target, gidx, gout,
            self._out,
        )  # fmt: skip
        return float(rsq), float(self._out[0])

    def iterate_anderson(
        self,
        rot_iters: int,
        A,
        h2,
        drag_vertex,
        drag_k,
        drag_target,
        gidx,
        gout,
        aa,
        slot: int,
        count: int,
        record: int,
    ) -> tuple[float, float, bool]:
        """:func:`anderson_update` (``aa``: :class:`AndersonArrays`) then
        :meth:`iterate_energy`, in one launch; returns (||r||^2, E in J, extrapolated)."""
        rsq = iterate_anderson(
            self.EI, self.EF, self.Dm_inv, self.quat, self.x, self.contrib, rot_iters,
            self.inc_ptr, self.VF, self.x_tilde, self.r, A.indptr, A.indices, A.data, h2,
            drag_vertex, drag_k, drag_target, gidx, gout, aa.AV, aa.H, aa.AS, slot, count,
            record, aa.tikhonov, aa.out, self.flags,
        )  # fmt: skip
        return float(rsq), float(aa.out[0]), bool(aa.out[1] != 0.0)

    def _iterate(self, kernel, rot_iters, A, h2, drag_vertex, drag_k, drag_target, gidx, gout, *out):
        return kernel(
            self.EI,
            self.EF,
            self.Dm_inv,
            self.quat,
            self.x,
            self.contrib,
            rot_iters,
            self.inc_ptr,
            self.VF,
            self.x_tilde,
            self.r,
            A.indptr,
            A.indices,
            A.data,
            h2,
            drag_vertex,
            drag_k,
            drag_target,
            gidx,
            gout,
            *out,
            self.flags,
        )

    def potential_energy(self, rot_iters: int, gravity) -> float:
        return potential_energy(
            self.EI,
            self.EF,
            self.Dm_inv,
            self.quat,
            self.x,
            self.VF,
            rot_iters,
            list(gravity),
            self.flags,
        )

    def residual_norm_sq(self) -> float:
        return norm_sq(self.r)

    def _typed(self, a):
        """A host array as the backend's float type (a kernel compiled for an f64 argument
        would narrow it silently into the f32 arrays); Taichi arrays pass through."""
        if isinstance(a, np.ndarray) and a.dtype != self.np_real:
            return np.ascontiguousarray(a, dtype=self.np_real)
        return a

    def add_to_residual(self, f: np.ndarray, scale: float) -> None:
        add_scaled_rows(self.r, self.VF, self._typed(f), scale)

    def set_residual_difference(self, fa, fb, scale: float, gidx, gout) -> None:
        """r = scale (fa - fb) on free vertices: fa, fb (n, 3) Taichi arrays (device); and
        the gather gout[i] = r[gidx[i]] for the global step (gidx may be empty)."""
        set_scaled_difference(self.r, self.VF, fa, fb, scale, gidx, gout)

    def set_residual(self, f: np.ndarray, scale: float) -> None:
        set_scaled_rows(self.r, self.VF, self._typed(f), scale)

    def gather_residual(self, index: np.ndarray, out: np.ndarray) -> None:
        gather_rows(self.r, index, out)

    def scatter_add_x(self, index: np.ndarray, delta: np.ndarray) -> None:
        scatter_add_rows(self.x, index, self._typed(delta))

    def read_x(self, out: np.ndarray) -> None:
        copy_rows(out, self.x)

    def write_x(self, src: np.ndarray) -> None:
        copy_rows(self.x, self._typed(src))

    def write_x_tilde(self, src: np.ndarray) -> None:
        copy_rows(self.x_tilde, self._typed(src))

    def copy_x_to_prev(self) -> None:
        copy_rows(self.x_prev, self.x)

    def save_vertex(self, v: int) -> None:
        save_row(self.x, v, self.saved)

    def rank_one_correction(self, column, v: int, coef: float) -> None:
        rank_one_correction(self.x, column, v, self.saved, coef)

    def jacobi_chebyshev(self, diag, gamma: float, omega: float, drag_vertex: int, drag_add: float) -> None:
        jacobi_chebyshev(self.x, self.x_prev, self.r, self.VF, diag, gamma, omega, drag_vertex, drag_add)
