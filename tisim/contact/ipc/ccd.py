"""Additive continuous collision detection (ACCD) as Taichi functions, and the step bound.

A line search of an intersection-free solver (C-IPC) needs the largest step alpha in
(0, 1] such that along x + t dx, t in [0, alpha], no point-triangle or edge-edge pair
comes closer than the thickness xi. Additive CCD (notes §7, "Additive CCD"; Li, Kaufman
and Jiang, "Codimensional Incremental Potential Contact", 2021) answers this per pair
by conservative advancement:

1. subtract the mean displacement of the pair's four vertices (a rigid translation
   changes no distance, and a smaller displacement gives a tighter bound);
2. l_p = |dp| + max_i |dt_i| (point-triangle) or max_i |da_i| + max_j |db_j|
   (edge-edge) bounds how fast the pair's distance can shrink per unit of t;
3. from the current distance d, a step t_l = s (d^2 - xi^2) / ((d + xi) l_p)
   (= s (d - xi) / l_p, s = 0.9 the conservative rescaling) cannot bring the pair
   closer than xi + (1 - s)(d - xi); advance by t_l and repeat;
4. stop once the distance (minus xi) falls below the gap eta (d_0 - xi), eta = 1 - s
   = 0.1, and return the last time whose configuration passed that test.

Every configuration on [0, toi] is then at distance > xi (in exact arithmetic), so
the returned time is a safe step, never the impact time itself. When the iteration
cap is reached the current (safe, smaller) time is returned.

Units: positions and displacements in metres, thickness in metres, times are
fractions of the step (dimensionless).

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.

References: Li, Kaufman, Jiang, "Codimensional Incremental Potential Contact", ACM TOG
40(4), 2021 (Alg. 1, additive CCD); IPC Toolkit's ``AdditiveCCD`` (the test oracle).

Limitations: ACCD is not provably conservative under floating-point rounding (unlike
Tight-Inclusion CCD); the gap and the rescaling make misses very unlikely in f64.
A pair that slides tangentially at a distance just above xi advances in steps of
about (d - xi) / l_p and may hit the iteration cap, which gives a small (but safe)
step. In f32 (GPU) distances below ~1e-4 of the coordinates lose accuracy.
"""

import logging
import time

import taichi as ti

from tisim import backend
from tisim.backend import download
from tisim.contact.ipc.broad_phase import BroadPhase

log = logging.getLogger(__name__)

CONSERVATIVE_RESCALING = 0.9  # s: fraction of the safe advancement taken per iteration
MAX_ITERATIONS = 100_000  # per pair; beyond it the current (safe) time is returned
# Below these squared sines of the angle between two edges (or of a triangle's
# smallest angle) the line-line (plane) distance is ill-conditioned; the endpoint
# (edge) distances give the exact answer for parallel edges (degenerate triangles)
# and an overestimate of at most L * 1e-6 for nearly parallel ones.
_PARALLEL_SIN2 = 1e-12


# --------------------------------------------------------------------------------
# Squared distances (private, no derivatives: the barrier's versions live elsewhere)
# --------------------------------------------------------------------------------


@ti.func
def _point_segment_distance_sq(p, a, b):
    """Squared distance from point p to segment [a, b] (a zero-length segment is a point)."""
    ab = b - a
    l2 = ab.dot(ab)
    t = 0.0
    if l2 > 0:
        t = ti.math.clamp((p - a).dot(ab) / l2, 0.0, 1.0)
    r = p - (a + t * ab)
    return r.dot(r)


@ti.func
def _point_triangle_distance_sq(p, t0, t1, t2):
    """Squared distance from p to the triangle (t0, t1, t2), m^2.

    The minimum of the three edge distances and, when p projects inside the triangle,
    the plane distance: the true distance is always one of these, and each is an
    upper bound, so the minimum is exact (also for degenerate triangles and for points
    on an edge).
    """
    d = ti.min(
        _point_segment_distance_sq(p, t0, t1),
        _point_segment_distance_sq(p, t1, t2),
        _point_segment_distance_sq(p, t2, t0),
    )
    e0 = t1 - t0
    e1 = t2 - t0
    n = e0.cross(e1)
    nn = n.dot(n)
    if nn > _PARALLEL_SIN2 * e0.dot(e0) * e1.dot(e1):
        # the projection of p lies inside iff it is left of all three edges
        inside = (
            e0.cross(p - t0).dot(n) >= 0 and (t2 - t1).cross(p - t1).dot(n) >= 0 and (t0 - t2).cross(p - t2).dot(n) >= 0
        )
        if inside:
            h = (p - t0).dot(n)
            d = ti.min(d, h * h / nn)
    return d


@ti.func
def _edge_edge_distance_sq(a0, a1, b0, b1):
    """Squared distance between segments [a0, a1] and [b0, b1], m^2.

    The minimum of the four endpoint-to-segment distances and, when the closest points
    of the two lines are interior to both segments (lines not parallel), the line-line
    distance (r.n)^2/|n|^2. Exact for parallel edges, crossing edges and degenerate
    (zero-length) edges.
    """
    d = ti.min(
        ti.min(_point_segment_distance_sq(a0, b0, b1), _point_segment_distance_sq(a1, b0, b1)),
        ti.min(_point_segment_distance_sq(b0, a0, a1), _point_segment_distance_sq(b1, a0, a1)),
    )
    ea = a1 - a0
    eb = b1 - b0
    r = a0 - b0
    aa = ea.dot(ea)
    bb = eb.dot(eb)
    n = ea.cross(eb)
    nn = n.dot(n)  # = aa bb - (ea.eb)^2, computed without cancellation
    if nn > _PARALLEL_SIN2 * aa * bb:
        ab = ea.dot(eb)
        ar = ea.dot(r)
        br = eb.dot(r)
        s = (ab * br - bb * ar) / nn
        t = (aa * br - ab * ar) / nn
        if 0 < s and s < 1 and 0 < t and t < 1:
            h = r.dot(n)
            d = ti.min(d, h * h / nn)
    return d


@ti.func
def _pair_distance_sq(a, b, c, d, edge_edge: ti.template()):
    result = 0.0
    if ti.static(edge_edge):
        result = _edge_edge_distance_sq(a, b, c, d)
    else:
        result = _point_triangle_distance_sq(a, b, c, d)
    return result


# --------------------------------------------------------------------------------
# Additive CCD
# --------------------------------------------------------------------------------


@ti.func
def _additive_ccd(a0, b0, c0, d0, da, db, dc, dd, l_p, thickness, t_max, edge_edge: ti.template()):
    """Conservative advancement of one pair along (da, db, dc, dd) (mean already removed).

    Returns (toi, capped): toi = t_max when the pair stays farther than the gap up to
    t_max, 0 when it starts at distance <= thickness; capped = 1 when the iteration
    cap ended the loop.
    """
    # local copies: the arguments may be field entries, which must not move
    a = a0 + 0.0
    b = b0 + 0.0
    c = c0 + 0.0
    d = d0 + 0.0
    s = CONSERVATIVE_RESCALING
    xi2 = thickness * thickness
    toi = t_max
    capped = 0
    gap = 0.0
    t = 0.0
    t_l = 0.0
    it = 0
    # One call site of the distance (the first pass evaluates the start): each call is
    # inlined, and the kernels' compile time grows with their count.
    while True:
        a += t_l * da
        b += t_l * db
        c += t_l * dc
        d += t_l * dd
        d_sq = _pair_distance_sq(a, b, c, d, edge_edge)
        # (d^2 - xi^2)/(d + xi) rather than d - xi: d^2 is what the distance gives;
        # f <= 0 means "at or inside xi" (and avoids 0/0 when d = xi = 0)
        f = d_sq - xi2
        if f > 0:
            f /= ti.sqrt(d_sq) + thickness
        if it == 0:
            if d_sq <= xi2:
                toi = 0.0  # already too close: no step is safe
                break
            if l_p <= 0:
                break  # no relative motion: toi stays t_max
            gap = (1.0 - s) * f  # eta (d_0 - xi)
            if s * f / l_p > t_max:
                # the first advancement already passes t_max (the common case of a
                # candidate that is not approaching): the loop below would take it and
                # stop there with toi = t_max, after a second distance
                break
        else:
            # f <= 0 cannot happen in exact arithmetic (t_l is a lower bound of the time
            # to reach xi); if rounding makes it so, stop at the last safe time.
            if (t > 0 and f < gap) or f <= 0:
                toi = t
                break
            t += t_l
            if t > t_max:
                break  # no impact before t_max: toi stays t_max
            if it > MAX_ITERATIONS:
                toi = t
                capped = 1
                break
        it += 1
        t_l = s * f / l_p  # = s (d - xi) / l_p: cannot reach xi + (1 - s)(d - xi)
    return toi, capped


@ti.func
def point_triangle_ccd_capped(p, t0, t1, t2, dp, dt0, dt1, dt2, thickness, t_max):
    """As :func:`point_triangle_ccd`, also returning 1 when the iteration cap was hit."""
    mean = 0.25 * (dp + dt0 + dt1 + dt2)
    up = dp - mean
    u0 = dt0 - mean
    u1 = dt1 - mean
    u2 = dt2 - mean
    l_p = up.norm() + ti.sqrt(ti.max(u0.norm_sqr(), u1.norm_sqr(), u2.norm_sqr()))
    return _additive_ccd(p, t0, t1, t2, up, u0, u1, u2, l_p, thickness, t_max, False)


@ti.func
def edge_edge_ccd_capped(ea0, ea1, eb0, eb1, dea0, dea1, deb0, deb1, thickness, t_max):
    """As :func:`edge_edge_ccd`, also returning 1 when the iteration cap was hit."""
    mean = 0.25 * (dea0 + dea1 + deb0 + deb1)
    ua0 = dea0 - mean
    ua1 = dea1 - mean
    ub0 = deb0 - mean
    ub1 = deb1 - mean
    l_p = ti.sqrt(ti.max(ua0.norm_sqr(), ua1.norm_sqr())) + ti.sqrt(ti.max(ub0.norm_sqr(), ub1.norm_sqr()))
    return _additive_ccd(ea0, ea1, eb0, eb1, ua0, ua1, ub0, ub1, l_p, thickness, t_max, True)


@ti.func
def point_triangle_ccd(p, t0, t1, t2, dp, dt0, dt1, dt2, thickness, t_max):
    """Safe time of a point p moving by dp against the triangle (t0, t1, t2) moving by dt_i.

    p, t_i, dp, dt_i: 3-vectors, metres; thickness xi >= 0 (metres); t_max in (0, 1].
    Returns toi in [0, t_max]: every configuration x + t dx, t in [0, toi], is farther
    apart than xi; toi = t_max when no approach closer than the gap happens before
    t_max; 0 when the pair starts at distance <= xi.
    """
    toi, _ = point_triangle_ccd_capped(p, t0, t1, t2, dp, dt0, dt1, dt2, thickness, t_max)
    return toi


@ti.func
def edge_edge_ccd(ea0, ea1, eb0, eb1, dea0, dea1, deb0, deb1, thickness, t_max):
    """Safe time of the edges (ea0, ea1) and (eb0, eb1) moving by their vertex displacements.

    Same conventions as :func:`point_triangle_ccd`.
    """
    toi, _ = edge_edge_ccd_capped(ea0, ea1, eb0, eb1, dea0, dea1, deb0, deb1, thickness, t_max)
    return toi


# --------------------------------------------------------------------------------
# Minimum over all pairs
# --------------------------------------------------------------------------------


@ti.kernel
def _max_step_kernel(
    X: ti.types.ndarray(),
    DX: ti.types.ndarray(),
    pt: ti.types.ndarray(),
    n_pt: ti.i32,
    ee: ti.types.ndarray(),
    n_ee: ti.i32,
    thickness: float,
    toi_min: ti.types.ndarray(),
    capped: ti.types.ndarray(),
    pt2: ti.types.ndarray(),
    n_pt2: ti.i32,
    ee2: ti.types.ndarray(),
    n_ee2: ti.i32,
    thickness2: float,
    toi_min2: ti.types.ndarray(),
):
    """toi_min[0] = min(1, min over pairs of their ACCD time); capped[0] = pairs that hit
    the iteration cap. X, DX: (n,) vec3 ndarrays; pt, ee: (m,) vec4 i32 ndarrays. A second
    batch (pt2, ee2 with thickness2; no rows: n_pt2 = n_ee2 = 0) gets its own minimum in
    toi_min2[0], in the same loop (one launch, and the ACCD's code compiled once).

    toi_min is exact and order-independent (a float minimum of per-pair times that do
    not depend on the running bound unless they exceed it); capped may vary between runs.
    """
    toi_min[0] = 1.0
    toi_min2[0] = 1.0
    capped[0] = 0
    n1 = n_pt + n_ee
    for k in range(n1 + n_pt2 + n_ee2):
        # The running minimum is a valid t_max for this pair: a pair that reaches the gap
        # earlier gets the same toi as without the bound, one that does not cannot lower
        # the minimum. A stale read (another thread lowered it meanwhile) is still valid.
        second = k >= n1
        j = k
        t_max = toi_min[0]
        xi = thickness
        is_pt = k < n_pt
        q = ti.Vector([0, 0, 0, 0])
        if second:
            j = k - n1
            t_max = toi_min2[0]
            xi = thickness2
            is_pt = j < n_pt2
            if is_pt:
                q = pt2[j]
            else:
                q = ee2[j - n_pt2]
        elif is_pt:
            q = pt[j]
        else:
            q = ee[j - n_pt]
        toi = t_max
        cap = 0
        i0, i1, i2, i3 = q[0], q[1], q[2], q[3]
        if is_pt:
            toi, cap = point_triangle_ccd_capped(X[i0], X[i1], X[i2], X[i3], DX[i0], DX[i1], DX[i2], DX[i3], xi, t_max)
        else:
            toi, cap = edge_edge_ccd_capped(X[i0], X[i1], X[i2], X[i3], DX[i0], DX[i1], DX[i2], DX[i3], xi, t_max)
        # (only pairs that lower the bound or hit the cap touch the shared cells: an
        # atomic per pair on one cache line costs the threads more than the ACCD)
        if toi < t_max:
            if second:
                ti.atomic_min(toi_min2[0], toi)
            else:
                ti.atomic_min(toi_min[0], toi)
        if cap != 0:
            ti.atomic_add(capped[0], cap)


class _Workspace:
    """The one-element result arrays of :func:`max_step` (the minimum, the capped pairs,
    a second batch's minimum), kept per Taichi runtime."""

    _prog = None
    _arrays: tuple = ()

    @classmethod
    def get(cls) -> tuple:
        prog = ti.lang.impl.get_runtime().prog
        if cls._prog is not prog or not cls._arrays:
            cls._arrays = (ti.ndarray(backend.real(), 1), ti.ndarray(ti.i32, 1), ti.ndarray(backend.real(), 1))
            cls._prog = prog
        return cls._arrays


def _reduce(X, DX, pt, n_pt, ee, n_ee, thickness, out, capped, second=None, out2=None) -> float | tuple:
    """:func:`max_step`'s launch; second: a second batch (pt, n_pt, ee, n_ee, thickness)
    whose minimum goes to out2, both returned then."""
    b = (pt, 0, ee, 0, 1.0) if second is None else second
    _max_step_kernel(
        X, DX, pt, int(n_pt), ee, int(n_ee), float(thickness), out, capped,
        b[0], int(b[1]), b[2], int(b[3]), float(b[4]), _Workspace.get()[2] if out2 is None else out2,
    )  # fmt: skip
    n_capped = int(download(capped)[0])
    if n_capped:
        log.debug("additive CCD: %d pair(s) reached the iteration cap", n_capped)
    alphas = [(float(download(out)[0]), thickness)]
    if second is not None:
        alphas.append((float(download(out2)[0]), b[4]))
    for alpha, xi in alphas:
        if alpha <= 0.0:
            log.warning("CCD: a candidate pair starts at distance <= thickness %.3g m", xi)
    return alphas[0][0] if second is None else (alphas[0][0], alphas[1][0])


def max_step(x, dx, pt, n_pt: int, ee, n_ee: int, thickness: float) -> float:
    """The largest safe step over the given pairs: min over pairs of their ACCD time.

    x, dx: ti.Vector.ndarray(3, real, n), positions and step direction (metres); the
    line search tries x + alpha dx. Neither is modified.
    pt: ti.Vector.ndarray(4, ti.i32, cap) rows (point, t0, t1, t2), the first n_pt used.
    ee: ti.Vector.ndarray(4, ti.i32, cap) rows (ea0, ea1, eb0, eb1), the first n_ee used.
    (``BroadPhase.pt`` / ``.ee`` are such arrays.)
    thickness: minimum separation xi, metres.
    Returns alpha in (0, 1]: 1 when no pair comes closer than its gap during the full
    step. Returns 0 only if some pair already starts at distance <= thickness (an
    invalid start; logged as a warning). The result does not depend on the pair order.
    """
    n_pt, n_ee = int(n_pt), int(n_ee)
    if n_pt > pt.shape[0] or n_ee > ee.shape[0]:
        raise ValueError(f"n_pt={n_pt}, n_ee={n_ee} exceed the pair arrays' rows {pt.shape[0]}, {ee.shape[0]}")
    if x.shape != dx.shape:
        raise ValueError(f"x and dx shapes differ: {tuple(x.shape)} vs {tuple(dx.shape)}")
    out, capped, _ = _Workspace.get()
    return _reduce(x, dx, pt, n_pt, ee, n_ee, thickness, out, capped)


def max_step_two(x, dx, first: tuple, second: tuple) -> tuple[float, float]:
    """:func:`max_step` of two batches of pairs, each (pt, n_pt, ee, n_ee, thickness), in
    one launch: (alpha of the first, alpha of the second)."""
    for pt, n_pt, ee, n_ee, _ in (first, second):
        if int(n_pt) > pt.shape[0] or int(n_ee) > ee.shape[0]:
            raise ValueError(f"n_pt={n_pt}, n_ee={n_ee} exceed the pair arrays' rows {pt.shape[0]}, {ee.shape[0]}")
    if x.shape != dx.shape:
        raise ValueError(f"x and dx shapes differ: {tuple(x.shape)} vs {tuple(dx.shape)}")
    out, capped, out2 = _Workspace.get()
    return _reduce(x, dx, *first, out, capped, second, out2)


class CCD:
    """Broad phase on swept boxes followed by additive CCD: the step bound of a line search.

    vertex_count, faces (nf, 3) int, edges (ne, 2) int, vertex_active (n,) bool: as for
    :class:`BroadPhase` (inactive vertices are kinematic obstacles; obstacle-obstacle
    pairs are skipped).
    thickness: minimum separation xi, metres (C-IPC's codimensional thickness).

    ``ccd.max_step(x, dx)`` returns alpha in (0, 1] such that x + t dx, t in [0, alpha],
    keeps every pair farther apart than xi. ``last_timings`` holds the broad-phase and
    narrow-phase wall times (seconds) of the last call and ``last_counts`` the numbers
    of candidate pairs.
    """

    def __init__(
        self,
        vertex_count: int,
        faces,
        edges,
        vertex_active,
        thickness: float,
        *,
        initial_capacity: int = 1 << 14,
    ):
        if not thickness >= 0:
            raise ValueError(f"thickness must be >= 0, got {thickness}")
        self.thickness = float(thickness)
        self.broad_phase = BroadPhase(vertex_count, faces, edges, vertex_active, initial_capacity=initial_capacity)
        self._out = ti.ndarray(backend.real(), 1)
        self._capped = ti.ndarray(ti.i32, 1)
        self.last_timings: dict[str, float] = {}
        self.last_counts: tuple[int, int] = (0, 0)

    def max_step(self, x, dx) -> float:
        """alpha in (0, 1] (0 only for an invalid start), see :func:`max_step`.

        x, dx: ti.Vector.ndarray(3, real, n)."""
        t0 = time.perf_counter()
        # A pair whose swept boxes stay more than xi apart never comes within xi; the 1%
        # (and 1 nm) margin covers the rounding of x + dx in the box corners.
        inflation = 1.01 * self.thickness + 1e-9
        bp = self.broad_phase
        n_pt, n_ee = bp.detect(x, inflation, dx, 1.0)
        t1 = time.perf_counter()
        alpha = _reduce(x, dx, bp.pt, n_pt, bp.ee, n_ee, self.thickness, self._out, self._capped)
        t2 = time.perf_counter()
        self.last_timings = {"broad_phase": t1 - t0, "narrow_phase": t2 - t1}
        self.last_counts = (n_pt, n_ee)
        return alpha
