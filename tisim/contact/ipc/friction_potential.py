"""IPC's lagged friction potential over batches of candidate pairs (Li et al. 2020 §5):
the kernels and :class:`FrictionPotential`. Argument layouts and conventions:
:mod:`tisim.contact.ipc.potential` (re-exported there); the scalar friction functions
f0, f1: :mod:`tisim.contact.ipc.friction`.

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import logging

import numpy as np
import taichi as ti

from tisim import backend
from tisim.backend import download
from tisim.contact.ipc import barrier as bar
from tisim.contact.ipc import distance as dist
from tisim.contact.ipc import friction as fr
from tisim.contact.ipc.pair_kernels import (
    _eps_x,
    _load_pair,
    _masked,
    _pair_type,
    _rest_array,
    _Rows,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------
# friction kernels


@ti.kernel
def _friction_update(
    x: ti.types.ndarray(),
    rest: ti.types.ndarray(),
    use_rest: ti.i32,
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    dhat: float,
    xi: float,
    kappa: float,
    mu: ti.types.ndarray(),
    coef: ti.types.ndarray(),
    stencil: ti.types.ndarray(),
    weights: ti.types.ndarray(),
    basis: ti.types.ndarray(),
):
    for k in range(n_pt + n_ee):
        coef[k] = 0.0
        stencil[k] = ti.Vector([-1, -1, -1, -1], ti.i32)
        is_ee, idx, x0, x1, x2, x3 = _load_pair(k, x, pt, n_pt, ee)
        dtype, kind, blk = _pair_type(is_ee, x0, x1, x2, x3)
        w, u, v = dist._gather(x0, x1, x2, x3, blk)
        d = dist._reduced_value(kind, w, u, v)
        s, sh = bar.shell_barrier_arguments(d, dhat, xi)
        active = 0.0 < s < sh
        if active and is_ee and use_rest != 0:
            # IPC Toolkit drops friction of mollified (nearly parallel) edge-edge pairs
            if dist.edge_edge_cross_squarednorm(x0, x1, x2, x3) < _eps_x(rest, idx):
                active = False
        if active:
            lam = bar.shell_barrier_force_magnitude(d, dhat, xi, kappa)
            wt = ti.Vector.zero(float, 4)
            nrm = ti.Vector.zero(float, 3)
            hint = ti.Vector.zero(float, 3)
            axis = False
            mu_pair = 0.0
            if is_ee:
                wt, nrm, hint, axis = fr.edge_edge_frame_data(x0, x1, x2, x3, dtype)
                mu_pair = 0.25 * (mu[idx[0]] + mu[idx[1]] + mu[idx[2]] + mu[idx[3]])
            else:
                wt, nrm, hint, axis = fr.point_triangle_frame_data(x0, x1, x2, x3, dtype)
                mu_pair = 0.5 * mu[idx[0]] + (mu[idx[1]] + mu[idx[2]] + mu[idx[3]]) / 6.0
            coef[k] = mu_pair * lam
            weights[k] = wt
            basis[k] = fr.frame_basis(nrm, hint, axis)
            mask = ti.Vector([0, 0, 0, 0], ti.i32)
            for a in ti.static(range(4)):
                if wt[a] != 0.0:
                    mask[a] = 1
            stencil[k] = _masked(idx, mask)


@ti.func
def _tangential(
    k,
    x: ti.template(),
    x_ref: ti.template(),
    stencil: ti.template(),
    weights: ti.template(),
    basis: ti.template(),
):
    """u = T^T sum_i w_i (x_i - x_ref_i) (2, m) of a lagged friction row."""
    sidx = stencil[k]
    wt = weights[k]
    rel = ti.Vector.zero(float, 3)
    for a in ti.static(range(4)):
        if sidx[a] >= 0:
            rel += wt[a] * (x[sidx[a]] - x_ref[sidx[a]])
    return basis[k].transpose() @ rel


@ti.func
def friction_energy_pass(
    x: ti.template(),
    x_ref: ti.template(),
    n,
    eps,
    coef: ti.template(),
    stencil: ti.template(),
    weights: ti.template(),
    basis: ti.template(),
    out: ti.template(),
):
    """out[0] = the friction potential D of the first n lagged pairs (J, unscaled)."""
    out[0] = 0.0
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for k in range(n):
        if coef[k] != 0.0:
            u = _tangential(k, x, x_ref, stencil, weights, basis)
            out[0] += coef[k] * fr.smooth_friction_f0(u.norm(), eps)


@ti.kernel
def _friction_energy(
    x: ti.types.ndarray(),
    x_ref: ti.types.ndarray(),
    n: ti.i32,
    eps: float,
    coef: ti.types.ndarray(),
    stencil: ti.types.ndarray(),
    weights: ti.types.ndarray(),
    basis: ti.types.ndarray(),
    out: ti.types.ndarray(),
):
    """``friction_energy_pass`` in a launch of its own."""
    friction_energy_pass(x, x_ref, n, eps, coef, stencil, weights, basis, out)


@ti.func
def friction_gradient_pass(
    x: ti.template(),
    x_ref: ti.template(),
    n,
    eps,
    coef: ti.template(),
    stencil: ti.template(),
    weights: ti.template(),
    basis: ti.template(),
    g: ti.template(),
):
    """g += dD/dx over the first n lagged pairs (N)."""
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for k in range(n):
        if coef[k] != 0.0:
            u = _tangential(k, x, x_ref, stencil, weights, basis)
            f = coef[k] * fr.smooth_friction_f1_over_x(u.norm(), eps) * (basis[k] @ u)
            sidx = stencil[k]
            wt = weights[k]
            for a in ti.static(range(4)):
                if sidx[a] >= 0:
                    g[sidx[a]] += wt[a] * f


@ti.kernel
def _friction_gradient(
    x: ti.types.ndarray(),
    x_ref: ti.types.ndarray(),
    n: ti.i32,
    eps: float,
    coef: ti.types.ndarray(),
    stencil: ti.types.ndarray(),
    weights: ti.types.ndarray(),
    basis: ti.types.ndarray(),
    g: ti.types.ndarray(),
):
    """``friction_gradient_pass`` in a launch of its own."""
    friction_gradient_pass(x, x_ref, n, eps, coef, stencil, weights, basis, g)


@ti.kernel
def _friction_hessians(
    x: ti.types.ndarray(),
    x_ref: ti.types.ndarray(),
    n: ti.i32,
    eps: float,
    project: ti.i32,
    coef: ti.types.ndarray(),
    stencil: ti.types.ndarray(),
    weights: ti.types.ndarray(),
    basis: ti.types.ndarray(),
    H: ti.types.ndarray(),
    stencils_out: ti.types.ndarray(),
):
    for k in range(n):
        stencils_out[k] = stencil[k]
        if coef[k] == 0.0:
            for i, j in ti.ndrange(12, 12):  # (row k is this thread's: no zeroing pass before)
                H[k, i, j] = 0.0
        else:
            u = _tangential(k, x, x_ref, stencil, weights, basis)
            T = basis[k]
            K = coef[k] * (T @ fr.inner_matrix(u, eps, project != 0) @ T.transpose())
            wt = weights[k]
            for a in range(4):
                for b in range(4):
                    wab = wt[a] * wt[b]
                    for i in range(3):
                        for j in range(3):
                            H[k, 3 * a + i, 3 * b + j] = wab * K[i, j]


class FrictionPotential(_Rows):
    """Lagged smoothed friction over point-triangle and edge-edge pairs (IPC).

    vertex_count: number of vertices n; capacity: initial number of pair rows.
    rest_positions: optional (n, 3) rest shape; when given, edge-edge pairs whose
        mollifier is active (nearly parallel edges) get no friction, as in IPC Toolkit.

    :meth:`update` lags, per pair active in the barrier, the normal force
    lambda = -kappa db/dd (N), the friction coefficient (mean of the two sides' mean
    vertex mu), the tangent basis and the closest-point weights; :meth:`energy`,
    :meth:`add_gradient` and :meth:`local_hessians` then evaluate
    D = sum_k mu_k lambda_k f0(|T_k^T sum_i w_ki (x_i - x_ref_i)|) with eps = eps_v h.
    eps_v (m/s) is the static-friction speed threshold and h (s) the time step.
    """

    def __init__(self, vertex_count: int, capacity: int, rest_positions: np.ndarray | None = None) -> None:
        from tisim import backend

        self.vertex_count = int(vertex_count)
        real = backend.real()
        self._use_rest = rest_positions is not None
        rest = None
        if self._use_rest:
            rest = np.asarray(rest_positions, dtype=np.float64)
            if rest.shape != (self.vertex_count, 3):
                raise ValueError(f"rest_positions has shape {rest.shape}; expected ({self.vertex_count}, 3)")
        self.rest = _rest_array(rest, self.vertex_count)
        self._sum = ti.ndarray(real, 1)
        self.rows = 0
        super().__init__(max(int(capacity), 1))

    def _on_grow(self, cap: int) -> None:
        from tisim import backend

        real = backend.real()
        self.coef = ti.ndarray(real, cap)
        self.lag_stencils = ti.Vector.ndarray(4, ti.i32, cap)
        self.weights = ti.Vector.ndarray(4, real, cap)
        self.basis = ti.Matrix.ndarray(3, 2, real, cap)
        self.rows = 0  # lagged data does not survive a reallocation

    def update(
        self,
        x,
        pt,
        n_pt: int,
        ee,
        n_ee: int,
        dhat: float,
        thickness: float,
        kappa: float,
        vertex_mu,
    ) -> int:
        """Lag normal forces, coefficients, bases and weights at positions x; returns the
        number of pairs with friction. vertex_mu: ti.ndarray(real, n), dimensionless."""
        rows = int(n_pt) + int(n_ee)
        self.reserve(rows)
        self.rows = rows
        if rows == 0:
            return 0
        _friction_update(
            x,
            self.rest,
            int(self._use_rest),
            pt,
            int(n_pt),
            ee,
            int(n_ee),
            float(dhat),
            float(thickness),
            float(kappa),
            vertex_mu,
            self.coef,
            self.lag_stencils,
            self.weights,
            self.basis,
        )
        return int(np.count_nonzero(download(self.coef)[:rows]))

    def compile_kernels(self, x, pt, ee, g, vertex_mu) -> None:
        """Compile every kernel of the friction now (as the barrier's
        :meth:`BarrierPotential.compile_kernels`; x_ref is an array like x); computes
        nothing and keeps the lagged pairs."""
        _friction_update(
            x,
            self.rest,
            int(self._use_rest),
            pt,
            0,
            ee,
            0,
            1.0,
            0.0,
            0.0,
            vertex_mu,
            self.coef,
            self.lag_stencils,
            self.weights,
            self.basis,
        )
        _friction_energy(x, x, 0, 1.0, self.coef, self.lag_stencils, self.weights, self.basis, self._sum)
        _friction_gradient(x, x, 0, 1.0, self.coef, self.lag_stencils, self.weights, self.basis, g)
        _friction_hessians(
            x, x, 0, 1.0, 1, self.coef, self.lag_stencils, self.weights, self.basis, self.hessians, self.stencils
        )
        self._compile_rows()

    def pass_args(self, x_ref, eps_v: float, h: float, out) -> tuple:
        """The arguments of ``friction_energy_pass`` / ``friction_gradient_pass`` after x,
        for a kernel that runs them after another pass (``out``: the sum, or g)."""
        return (x_ref, self.rows, float(eps_v) * float(h), self.coef, self.lag_stencils, self.weights, self.basis, out)

    def energy(self, x, x_ref, eps_v: float, h: float) -> float:
        """D(x) (J) for the lagged pairs, displacements x - x_ref (m; both
        ti.Vector.ndarray(3, real, n))."""
        if self.rows == 0:
            return 0.0
        _friction_energy(
            x,
            x_ref,
            self.rows,
            float(eps_v) * float(h),
            self.coef,
            self.lag_stencils,
            self.weights,
            self.basis,
            self._sum,
        )
        return float(download(self._sum)[0])

    def add_gradient(self, x, x_ref, eps_v: float, h: float, g) -> None:
        """g += dD/dx (N)."""
        if self.rows == 0:
            return
        _friction_gradient(
            x,
            x_ref,
            self.rows,
            float(eps_v) * float(h),
            self.coef,
            self.lag_stencils,
            self.weights,
            self.basis,
            g,
        )

    def local_hessians(self, x, x_ref, eps_v: float, h: float, project: bool) -> int:
        """Fill ``hessians`` / ``stencils`` rows 0..rows-1 (N/m, layout as the barrier's);
        returns the row count. The friction Hessian is PSD by construction;
        ``project`` only clamps its along-slip eigenvalue against round-off."""
        if self.rows == 0:
            return 0
        _friction_hessians(
            x,
            x_ref,
            self.rows,
            float(eps_v) * float(h),
            int(bool(project)),
            self.coef,
            self.lag_stencils,
            self.weights,
            self.basis,
            self.hessians,
            self.stencils,
        )
        return self.rows
