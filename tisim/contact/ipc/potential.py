"""C-IPC barrier and lagged-friction potentials over batches of candidate pairs (the
friction's kernels and class in :mod:`tisim.contact.ipc.friction_potential`, shared pair
helpers in :mod:`tisim.contact.ipc.pair_kernels`).

The solver's Newton loop calls these classes with device-resident ndarrays:

* ``x``: ``ti.Vector.ndarray(3, real, n)`` positions (m);
* ``pt``: ``ti.Vector.ndarray(4, ti.i32, cap)`` point-triangle rows (p, t0, t1, t2) and
  ``ee``: ``ti.Vector.ndarray(4, ti.i32, cap)`` edge-edge rows (ea0, ea1, eb0, eb1), with
  host counts ``n_pt``, ``n_ee`` (rows past the counts are ignored);
* gradients are *added* into ``g: ti.Vector.ndarray(3, real, n)``;
* local Hessians land in ``hessians: ti.ndarray(real, (cap_total, 12, 12))`` with
  ``stencils: ti.Vector.ndarray(4, ti.i32, cap_total)``: row k is the k-th pair, point-
  triangle pairs first, then edge-edge pairs (row n_pt + j is ee[j]). Stencil slot i
  holds the global vertex of the 12 x 12 block rows 3i..3i+2, or -1 where the pair's
  term does not depend on that vertex (the Hessian's rows and columns there are zero);
  an inactive pair has stencil (-1, -1, -1, -1) and a zero Hessian. Assemble
  ``K[3 s_i + a, 3 s_j + b] += H[k, 3 i + a, 3 j + b]`` over slots with s_i, s_j >= 0.

Barrier (notes §2.4 and §7 "C-IPC constants"), thickness xi and activation distance
dhat in metres, stiffness kappa in J/m^4:

    B(x) = kappa sum_k m_k(x) b(d_k^2 - xi^2, dhat^2 + 2 dhat xi)

with m_k the edge-edge mollifier (m = 1 for point-triangle pairs), eps_x from the rest
positions. An overlapping pair (d <= xi) makes the energy +inf (and contributes no
gradient/Hessian): the solver keeps iterates feasible with CCD.

Friction: see :mod:`tisim.contact.ipc.friction`; lambda_k = -kappa db/dd (d unsquared)
and the pair's mu, tangent basis and closest-point weights are lagged by
:meth:`FrictionPotential.update`.

Every kernel takes its per-object data as ``ti.types.ndarray()`` arguments (dtype and
size left open), so each kernel compiles once per process for all instances, sizes and
both precisions share the offline cache; a second potential compiles nothing.

Energy and gradient sums over pairs and the compaction of active pairs (a shared
counter) run on one thread on the CPU backend (``backend.SERIAL_SUMS``): the same call
gives the same bits and the same pair order at any thread count (the barrier energy's
per-pair values are computed in parallel first, then summed in order). GPU backends keep
them parallel (atomics; reproducible to round-off).

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.

References: Li et al. 2020, "Incremental Potential Contact"; Li et al. 2021,
"Codimensional Incremental Potential Contact"; IPC Toolkit (``BarrierPotential``,
``FrictionPotential``; checked against in tests).

Limitations: pairs sharing a vertex must not be passed (their distance is zero);
duplicate pairs count twice (the broad phase must not repeat pairs). Edge-edge pairs
whose mollifier is active get no friction (like IPC Toolkit: nearly parallel edge
contacts are carried by the point-triangle pairs around them).
"""

import logging
import math

import numpy as np
import taichi as ti

from tisim import backend
from tisim.backend import download
from tisim.contact.ipc import barrier as bar
from tisim.contact.ipc import distance as dist
from tisim.contact.ipc.friction_potential import (  # noqa: F401  (FrictionPotential: part of this module's interface)
    FrictionPotential,
    friction_energy_pass,
    friction_gradient_pass,
)
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
# barrier kernels


@ti.func
def barrier_energy_pass(
    x: ti.template(),
    rest: ti.template(),
    pt: ti.template(),
    n_pt,
    ee: ti.template(),
    n_ee,
    dhat,
    xi,
    out: ti.template(),
    values: ti.template(),
    dsq: ti.template(),
    out_pt: ti.template(),
    out_ee: ti.template(),
    counts: ti.template(),
):
    """out[0] = sum of the pairs' barriers (unscaled by kappa), out[1] = their smallest
    squared distance (the same values as _pair_stats', at no extra pass); the pairs
    with s < s_hat (the only ones with a barrier force or Hessian) copied to the front
    of out_pt / out_ee, in candidate order, counts = (point-triangle, edge-edge) rows.

    The first loop computes each pair's barrier (values[k], -1 for an inactive pair:
    a barrier is >= 0, and Taichi's fast math may drop a NaN test)
    and squared distance (dsq[k]) in parallel; the second sums and compacts them in
    candidate order, on one thread on the CPU backend (backend.SERIAL_SUMS): the same
    additions in the same order as one serial loop over the pairs, at half its time on
    two cores."""
    for k in range(n_pt + n_ee):
        is_ee, idx, x0, x1, x2, x3 = _load_pair(k, x, pt, n_pt, ee)
        _dtype, kind, blk = _pair_type(is_ee, x0, x1, x2, x3)
        w, u, v = dist._gather(x0, x1, x2, x3, blk)
        d = dist._reduced_value(kind, w, u, v)
        dsq[k] = d
        s, sh = bar.shell_barrier_arguments(d, dhat, xi)
        b = -1.0
        if s < sh:
            b = bar.barrier(s, sh)
            if is_ee and s > 0.0:
                b *= dist.edge_edge_mollifier(x0, x1, x2, x3, _eps_x(rest, idx))
        values[k] = b
    out[0] = 0.0
    out[1] = ti.math.inf
    counts[0] = 0
    counts[1] = 0
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for k in range(n_pt + n_ee):
        ti.atomic_min(out[1], dsq[k])
        b = values[k]
        if b >= 0.0:
            out[0] += b
            if k >= n_pt:
                j = ti.atomic_add(counts[1], 1)
                out_ee[j] = ee[k - n_pt]
            else:
                j = ti.atomic_add(counts[0], 1)
                out_pt[j] = pt[k]


@ti.kernel
def _barrier_energy(
    x: ti.types.ndarray(),
    rest: ti.types.ndarray(),
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    dhat: float,
    xi: float,
    out: ti.types.ndarray(),
    values: ti.types.ndarray(),
    dsq: ti.types.ndarray(),
    out_pt: ti.types.ndarray(),
    out_ee: ti.types.ndarray(),
    counts: ti.types.ndarray(),
):
    """``barrier_energy_pass`` in a launch of its own."""
    barrier_energy_pass(x, rest, pt, n_pt, ee, n_ee, dhat, xi, out, values, dsq, out_pt, out_ee, counts)


@ti.func
def barrier_gradient_pass(
    x: ti.template(),
    rest: ti.template(),
    pt: ti.template(),
    n_pt,
    ee: ti.template(),
    n_ee,
    dhat,
    xi,
    kappa,
    g: ti.template(),
):
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for k in range(n_pt + n_ee):
        is_ee, idx, x0, x1, x2, x3 = _load_pair(k, x, pt, n_pt, ee)
        _dtype, kind, blk = _pair_type(is_ee, x0, x1, x2, x3)
        w, u, v = dist._gather(x0, x1, x2, x3, blk)
        d, gy = dist._reduced_gradient(kind, w, u, v)
        s, sh = bar.shell_barrier_arguments(d, dhat, xi)
        if 0.0 < s < sh:
            gd = dist._scatter_gradient(blk, gy)
            gv = kappa * bar.barrier_first_derivative(s, sh) * gd
            mask = dist.stencil_slot_mask(blk)
            if is_ee:
                m, gm = dist.edge_edge_mollifier_gradient(x0, x1, x2, x3, _eps_x(rest, idx))
                if m < 1.0:
                    gv = m * gv + kappa * bar.barrier(s, sh) * gm
                    mask = ti.Vector([1, 1, 1, 1], ti.i32)
            for a in ti.static(range(4)):
                if mask[a] != 0:
                    g[idx[a]] += ti.Vector([gv[3 * a], gv[3 * a + 1], gv[3 * a + 2]])


@ti.kernel
def _barrier_gradient(
    x: ti.types.ndarray(),
    rest: ti.types.ndarray(),
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    dhat: float,
    xi: float,
    kappa: float,
    g: ti.types.ndarray(),
):
    """``barrier_gradient_pass`` in a launch of its own."""
    barrier_gradient_pass(x, rest, pt, n_pt, ee, n_ee, dhat, xi, kappa, g)


@ti.kernel
def _barrier_friction_energy(
    x: ti.types.ndarray(),
    rest: ti.types.ndarray(),
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    dhat: float,
    xi: float,
    out: ti.types.ndarray(),
    values: ti.types.ndarray(),
    dsq: ti.types.ndarray(),
    out_pt: ti.types.ndarray(),
    out_ee: ti.types.ndarray(),
    counts: ti.types.ndarray(),
    x_ref: ti.types.ndarray(),
    n_fr: ti.i32,
    eps: float,
    coef: ti.types.ndarray(),
    stencil: ti.types.ndarray(),
    weights: ti.types.ndarray(),
    basis: ti.types.ndarray(),
    fr_out: ti.types.ndarray(),
):
    """``barrier_energy_pass``, then ``friction_energy_pass`` of the pairs' lagged friction
    (the same sums as the two kernels give, in one launch)."""
    barrier_energy_pass(x, rest, pt, n_pt, ee, n_ee, dhat, xi, out, values, dsq, out_pt, out_ee, counts)
    friction_energy_pass(x, x_ref, n_fr, eps, coef, stencil, weights, basis, fr_out)


@ti.kernel
def _barrier_friction_gradient(
    x: ti.types.ndarray(),
    rest: ti.types.ndarray(),
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    dhat: float,
    xi: float,
    kappa: float,
    g: ti.types.ndarray(),
    x_ref: ti.types.ndarray(),
    n_fr: ti.i32,
    eps: float,
    coef: ti.types.ndarray(),
    stencil: ti.types.ndarray(),
    weights: ti.types.ndarray(),
    basis: ti.types.ndarray(),
    g_fr: ti.types.ndarray(),
):
    """``barrier_gradient_pass`` into g, then ``friction_gradient_pass`` into g_fr (the
    same array: the barrier's gradient, then friction's, added in one launch)."""
    barrier_gradient_pass(x, rest, pt, n_pt, ee, n_ee, dhat, xi, kappa, g)
    friction_gradient_pass(x, x_ref, n_fr, eps, coef, stencil, weights, basis, g_fr)


@ti.kernel
def _barrier_classify(
    x: ti.types.ndarray(),
    rest: ti.types.ndarray(),
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    dhat: float,
    xi: float,
    kappa: float,
    dtypes: ti.types.ndarray(),
    coefs: ti.types.ndarray(),
):
    """First half of the local Hessians: per row the distance type (-1: inactive) and
    the scalar factors (kappa m b', kappa b, kappa m b'', kappa b', m', m'').

    Split from the assembly because Taichi's compile time grows faster than the size
    of a kernel: two halves compile in well under the time of the whole."""
    for k in range(n_pt + n_ee):
        dtypes[k] = -1
        is_ee, idx, x0, x1, x2, x3 = _load_pair(k, x, pt, n_pt, ee)
        dtype, kind, blk = _pair_type(is_ee, x0, x1, x2, x3)
        w, u, v = dist._gather(x0, x1, x2, x3, blk)
        s, sh = bar.shell_barrier_arguments(dist._reduced_value(kind, w, u, v), dhat, xi)
        if 0.0 < s < sh:
            db = bar.barrier_first_derivative(s, sh)
            b = bar.barrier(s, sh)
            m = 1.0
            dm = 0.0
            d2m = 0.0
            if is_ee:
                c = dist.edge_edge_cross_squarednorm(x0, x1, x2, x3)
                m, dm, d2m = dist.mollifier(c, _eps_x(rest, idx))
            dtypes[k] = dtype
            d2b = bar.barrier_second_derivative(s, sh)
            coefs[k] = ti.Vector([kappa * m * db, kappa * b, kappa * m * d2b, kappa * db, dm, d2m])


@ti.kernel
def _barrier_hessians(
    x: ti.types.ndarray(),
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    dtypes: ti.types.ndarray(),
    coefs: ti.types.ndarray(),
    H: ti.types.ndarray(),
    stencils: ti.types.ndarray(),
    sysvert: ti.types.ndarray(),
    restrict: ti.i32,
):
    """Second half: H = kappa [m b' Hd + b Hm + m b'' gd gd^T + b' (gm gd^T + gd gm^T)]
    each row zeroed first by its own thread. restrict != 0: the rows and columns of the
    stencil's vertices with sysvert < 0 (not unknowns of the Newton system) are cleared
    after, so that a projection acts on the Hessian restricted to the unknowns (in the
    same pass: a kernel of its own read the 12 x 12 blocks again)."""
    for k in range(n_pt + n_ee):
        stencils[k] = ti.Vector([-1, -1, -1, -1], ti.i32)
        for i, j in ti.ndrange(12, 12):  # row k is this thread's: zeroed here, not in a pass before
            H[k, i, j] = 0.0
        dtype = dtypes[k]
        if dtype >= 0:
            is_ee, idx, x0, x1, x2, x3 = _load_pair(k, x, pt, n_pt, ee)
            kind = dist.KIND_PP
            blk = ti.Vector([0, 0, 0, 0, 0, 0], ti.i32)
            if is_ee:
                kind, blk = dist.edge_edge_stencil(dtype)
            else:
                kind, blk = dist.point_triangle_stencil(dtype)
            cf = coefs[k]
            dm = cf[4]
            mask = dist.stencil_slot_mask(blk)
            gm = ti.Vector.zero(float, 12)
            if dm != 0.0:  # mollifier active
                _c, gc = dist._mollifier_cross_gradient(x1 - x0, x3 - x2)
                gm = dist._scatter_gradient(dist._mollifier_blocks(), dm * gc)
                mask = ti.Vector([1, 1, 1, 1], ti.i32)
            # pass 0 adds kappa m b' Hess(d), pass 1 kappa b Hess(m) where the mollifier
            # is active: one run-time loop, so the Hessian code is inlined once
            gd = ti.Vector.zero(float, 12)
            w, u, v = dist._gather(x0, x1, x2, x3, blk)
            for pass_ in range(2):
                if pass_ == 0 or dm != 0.0:
                    mode = kind
                    blk_p = blk
                    scale = cf[0]
                    if pass_ == 1:
                        mode = dist.MODE_MOLLIFIER
                        blk_p = dist._mollifier_blocks()
                        w = x1 - x0
                        u = x1 - x0
                        v = x3 - x2
                        scale = cf[1]
                    _d, gy = dist._reduced_hessian_add(mode, w, u, v, blk_p, H, k, scale, dm, cf[5])
                    if pass_ == 0:
                        gd = dist._scatter_gradient(blk, gy)
            for i in range(12):
                for j in range(12):
                    h = cf[2] * gd[i] * gd[j] + cf[3] * (gm[i] * gd[j] + gd[i] * gm[j])
                    H[k, i, j] = H[k, i, j] + h
            st = _masked(idx, mask)
            stencils[k] = st
            if restrict != 0:
                for a in range(4):
                    if st[a] >= 0:
                        if sysvert[st[a]] < 0:
                            for i in range(3):
                                for j in range(12):
                                    H[k, 3 * a + i, j] = 0.0
                                    H[k, j, 3 * a + i] = 0.0


@ti.kernel
def _pair_stats(
    x: ti.types.ndarray(),
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    dhat: float,
    xi: float,
    min_dsq: ti.types.ndarray(),
    active: ti.types.ndarray(),
):
    """Smallest squared distance and number of pairs with s < s_hat (one kernel for
    both: each kernel that classifies pairs costs seconds of compile time)."""
    min_dsq[0] = ti.math.inf
    active[0] = 0
    for k in range(n_pt + n_ee):
        is_ee, _idx, x0, x1, x2, x3 = _load_pair(k, x, pt, n_pt, ee)
        _dtype, kind, blk = _pair_type(is_ee, x0, x1, x2, x3)
        w, u, v = dist._gather(x0, x1, x2, x3, blk)
        d = dist._reduced_value(kind, w, u, v)
        ti.atomic_min(min_dsq[0], d)
        s, sh = bar.shell_barrier_arguments(d, dhat, xi)
        if s < sh:
            active[0] += 1


class BarrierPotential(_Rows):
    """C-IPC barrier potential over point-triangle and edge-edge pairs.

    vertex_count: number of vertices n of the position arrays.
    capacity: initial number of pair rows (n_pt + n_ee) the Hessian arrays can hold;
        grows (doubling) when a call passes more pairs.
    rest_positions: (n, 3) float, metres: rest shape, for the edge-edge mollifier
        thresholds eps_x = 1e-3 |ea_rest|^2 |eb_rest|^2.

    Ndarrays: ``hessians`` (capacity, 12, 12) and ``stencils`` (capacity,) of the last
    :meth:`local_hessians` call (layout in the module docstring).

    Scalars: dhat (m) activation distance between the shells' surfaces, thickness xi (m),
    kappa (J/m^4) barrier stiffness.
    """

    def __init__(self, vertex_count: int, capacity: int, rest_positions: np.ndarray) -> None:
        from tisim import backend

        rest = np.asarray(rest_positions, dtype=np.float64)
        if rest.shape != (int(vertex_count), 3):
            raise ValueError(f"rest_positions has shape {rest.shape}; expected ({int(vertex_count)}, 3)")
        self.vertex_count = int(vertex_count)
        real = backend.real()
        self.rest = _rest_array(rest, self.vertex_count)
        self._sum = ti.ndarray(real, 2)
        self._count = ti.ndarray(ti.i32, 1)
        self.last_min_distance = math.inf  # over the pairs of the last energy call, m
        self._active_of = None  # the arguments of the pass whose active rows _act_* hold
        super().__init__(max(int(capacity), 1))

    def _on_grow(self, cap: int) -> None:
        from tisim import backend

        self._dtypes = ti.ndarray(ti.i32, cap)
        self._coefs = ti.Vector.ndarray(6, backend.real(), cap)

    def _scan(self, x, pt, n_pt: int, ee, n_ee: int, dhat: float, thickness: float, friction=()) -> tuple[float, float]:
        """One pass of ``_barrier_energy`` over the candidates: returns (sum of the pairs'
        unscaled barriers, smallest squared distance) and keeps the active pairs'
        rows in ``_act_pt`` / ``_act_ee`` (``compact_active``), tagged with the call's
        arguments. friction: ``FrictionPotential.pass_args`` of a friction whose energy
        the same launch sums after (``_barrier_friction_energy``)."""
        from tisim import backend

        rows = int(n_pt) + int(n_ee)
        need = max(int(n_pt), int(n_ee), 1)
        if getattr(self, "_act_cap", 0) < need:
            self._act_cap = max(need, 2 * getattr(self, "_act_cap", 0))
            self._act_pt = ti.Vector.ndarray(4, ti.i32, self._act_cap)
            self._act_ee = ti.Vector.ndarray(4, ti.i32, self._act_cap)
            self._act_counts = ti.ndarray(ti.i32, 2)
        if getattr(self, "_scan_cap", 0) < max(rows, 1):
            self._scan_cap = max(rows, 2 * getattr(self, "_scan_cap", 0), 1)
            self._values = ti.ndarray(backend.real(), self._scan_cap)
            self._dsq = ti.ndarray(backend.real(), self._scan_cap)
        self._active_of = None
        if rows == 0:
            self._act_n = (0, 0)
            return 0.0, math.inf
        (_barrier_friction_energy if friction else _barrier_energy)(
            x,
            self.rest,
            pt,
            int(n_pt),
            ee,
            int(n_ee),
            float(dhat),
            float(thickness),
            self._sum,
            self._values,
            self._dsq,
            self._act_pt,
            self._act_ee,
            self._act_counts,
            *friction,
        )
        c = download(self._act_counts)
        self._act_n = (int(c[0]), int(c[1]))
        self._active_of = (pt, int(n_pt), ee, int(n_ee), float(dhat), float(thickness))
        e, dsq = download(self._sum)[:2]
        return float(e), float(dsq)

    def compact_active(self, x, pt, n_pt: int, ee, n_ee: int, dhat: float, thickness: float, *, same_x: bool = False):
        """The candidate pairs within the activation distance at ``x``: (pt, n_pt, ee, n_ee)
        with ndarrays owned by this object (valid until the next call of this or
        :meth:`energy`). Gradients and Hessians of inactive pairs are zero, so computing
        them on these rows alone gives the same result for a fraction of the work
        (candidates are often 10x the active pairs).

        same_x: the caller vouches that ``x`` holds the values it held at the last
        :meth:`energy` call; when that call had these candidates and constants, its
        compaction is returned without another pass (after an accepted line search,
        the next Newton iteration starts where the last energy was evaluated)."""
        kept = self._active_of
        if not (
            same_x
            and kept is not None
            and kept[0] is pt
            and kept[2] is ee
            and (kept[1], *kept[3:]) == (int(n_pt), int(n_ee), float(dhat), float(thickness))
        ):
            self._scan(x, pt, n_pt, ee, n_ee, dhat, thickness)
        return self._act_pt, self._act_n[0], self._act_ee, self._act_n[1]

    def compile_kernels(self, x, pt, ee, g, unknowns=None, friction=None) -> None:
        """Compile every kernel of the barrier now, for arrays like these (x, g:
        ti.Vector.ndarray(3, real, n); pt, ee: candidate rows; unknowns as in
        :meth:`local_hessians`; friction: a FrictionPotential, for the kernels that run
        both): each is launched over zero pairs, which computes
        nothing. Left to the first contact, their compilation stalls that frame by about
        a second (64 x 64 drape, frame 16), a visible freeze in a live view."""
        self._scan(x, pt, 0, ee, 0, 1.0, 0.0)  # allocates the compacted rows and the scratch
        _barrier_energy(
            x,
            self.rest,
            pt,
            0,
            ee,
            0,
            1.0,
            0.0,
            self._sum,
            self._values,
            self._dsq,
            self._act_pt,
            self._act_ee,
            self._act_counts,
        )
        _barrier_gradient(x, self.rest, pt, 0, ee, 0, 1.0, 0.0, 0.0, g)
        if friction is not None:
            fr = friction.pass_args(x, 0.0, 0.0, friction._sum)
            fr = (fr[0], 0, *fr[2:])  # (no rows)
            _barrier_friction_energy(
                x, self.rest, pt, 0, ee, 0, 1.0, 0.0, self._sum, self._values, self._dsq, self._act_pt,
                self._act_ee, self._act_counts, *fr,
            )  # fmt: skip
            _barrier_friction_gradient(x, self.rest, pt, 0, ee, 0, 1.0, 0.0, 0.0, g, *fr[:-1], g)
        _barrier_classify(x, self.rest, pt, 0, ee, 0, 1.0, 0.0, 0.0, self._dtypes, self._coefs)
        _barrier_hessians(
            x,
            pt,
            0,
            ee,
            0,
            self._dtypes,
            self._coefs,
            self.hessians,
            self.stencils,
            self._count if unknowns is None else unknowns,
            0,
        )
        _pair_stats(x, pt, 0, ee, 0, 0.0, 0.0, self._sum, self._count)
        self._compile_rows()

    def energy(self, x, pt, n_pt: int, ee, n_ee: int, dhat: float, thickness: float, kappa: float) -> float:
        """kappa sum_k m_k b(s_k, s_hat) (J); +inf if a pair overlaps (d <= thickness).
        Keeps the pairs' smallest distance at x in ``last_min_distance`` (as
        :meth:`min_distance` gives it) and the active pairs at x for
        :meth:`compact_active` (``same_x``)."""
        e, dsq = self._scan(x, pt, n_pt, ee, n_ee, dhat, thickness)
        if n_pt + n_ee == 0:
            self.last_min_distance = math.inf
            return 0.0
        self.last_min_distance = math.sqrt(max(float(dsq), 0.0))
        return float(kappa) * float(e)

    def add_gradient(
        self, x, pt, n_pt: int, ee, n_ee: int, dhat: float, thickness: float, kappa: float, g, friction=None
    ) -> None:
        """g += dB/dx (N; g a ti.Vector.ndarray(3, real, n)). Overlapping pairs add nothing.
        friction: (FrictionPotential, x_ref, eps_v, h) whose gradient is added after the
        barrier's (``FrictionPotential.add_gradient``), in the same launch."""
        if n_pt + n_ee == 0 or friction is None or friction[0].rows == 0:
            if n_pt + n_ee:
                _barrier_gradient(
                    x, self.rest, pt, int(n_pt), ee, int(n_ee), float(dhat), float(thickness), float(kappa), g
                )
            if friction is not None:
                friction[0].add_gradient(x, *friction[1:], g)
            return
        _barrier_friction_gradient(
            x, self.rest, pt, int(n_pt), ee, int(n_ee), float(dhat), float(thickness), float(kappa), g,
            *friction[0].pass_args(*friction[1:], g),
        )  # fmt: skip

    def energy_with_friction(
        self, x, pt, n_pt: int, ee, n_ee: int, dhat: float, thickness: float, kappa: float, friction, x_ref, eps_v, h
    ) -> tuple[float, float]:
        """(:meth:`energy`, ``friction.energy(x, x_ref, eps_v, h)``), J: both sums in one
        launch where both have pairs."""
        if n_pt + n_ee == 0 or friction.rows == 0:
            return self.energy(x, pt, n_pt, ee, n_ee, dhat, thickness, kappa), friction.energy(x, x_ref, eps_v, h)
        e, dsq = self._scan(x, pt, n_pt, ee, n_ee, dhat, thickness, friction.pass_args(x_ref, eps_v, h, friction._sum))
        self.last_min_distance = math.sqrt(max(float(dsq), 0.0))
        return float(kappa) * float(e), float(download(friction._sum)[0])

    def local_hessians(
        self,
        x,
        pt,
        n_pt: int,
        ee,
        n_ee: int,
        dhat: float,
        thickness: float,
        kappa: float,
        project: bool,
        unknowns=None,
    ) -> int:
        """Fill ``hessians`` / ``stencils`` rows 0..n_pt+n_ee-1 (N/m); returns that count.
        ``project``: clamp each local Hessian's negative eigenvalues to 0.
        ``unknowns``: optional (n,) i32 ndarray, < 0 for vertices that are not unknowns of
        the Newton system (static obstacles): their rows and columns are cleared first, so
        the projection acts on the Hessian restricted to the unknowns."""
        rows = int(n_pt) + int(n_ee)
        if rows == 0:
            return 0
        self.reserve(rows)
        _barrier_classify(
            x,
            self.rest,
            pt,
            int(n_pt),
            ee,
            int(n_ee),
            float(dhat),
            float(thickness),
            float(kappa),
            self._dtypes,
            self._coefs,
        )
        _barrier_hessians(
            x, pt, int(n_pt), ee, int(n_ee), self._dtypes, self._coefs, self.hessians, self.stencils,
            self._count if unknowns is None else unknowns, int(unknowns is not None),
        )  # fmt: skip
        if project:
            self._project(rows)
        return rows

    def min_distance(self, x, pt, n_pt: int, ee, n_ee: int) -> float:
        """Smallest unsigned distance over the pairs (m, not squared); +inf without pairs."""
        if n_pt + n_ee == 0:
            return math.inf
        _pair_stats(x, pt, int(n_pt), ee, int(n_ee), 0.0, 0.0, self._sum, self._count)
        return math.sqrt(max(float(download(self._sum)[0]), 0.0))

    def active_count(self, x, pt, n_pt: int, ee, n_ee: int, dhat: float, thickness: float) -> int:
        """Number of pairs within the activation distance (s < s_hat, overlapping ones included)."""
        return self.distance_stats(x, pt, n_pt, ee, n_ee, dhat, thickness)[1]

    def distance_stats(self, x, pt, n_pt: int, ee, n_ee: int, dhat: float, thickness: float) -> tuple[float, int]:
        """(:meth:`min_distance`, :meth:`active_count`) from one pass."""
        if n_pt + n_ee == 0:
            return math.inf, 0
        _pair_stats(x, pt, int(n_pt), ee, int(n_ee), float(dhat), float(thickness), self._sum, self._count)
        return math.sqrt(max(float(download(self._sum)[0]), 0.0)), int(download(self._count)[0])
