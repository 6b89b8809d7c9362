"""Squared distances between mesh primitives and their exact derivatives, as ``@ti.func``s.

All distances here are *squared* Euclidean distances (m^2), as in IPC Toolkit.
A point-triangle pair has its vertices in the slots (p, t0, t1, t2) and an edge-edge
pair in (ea0, ea1, eb0, eb1); gradients are 12-vectors over those four slots (3 entries
a slot, zeros for slots a distance type does not use) and Hessians 12 x 12 (m^0).

Distance types (the same integer codes as ``ipctk.PointTriangleDistanceType`` /
``EdgeEdgeDistanceType`` / ``PointEdgeDistanceType``) say which features are closest.
Every type reduces to one of three primitives on at most three *difference vectors*
``y_k = x[pos_k] - x[neg_k]``:

* point-point ``PP``:     d = |w|^2
* point-line ``PL``:      d = |w x u|^2 / |u|^2                    (w = p - e0, u = e1 - e0)
* point-plane/line-line:  d = (w . (u x v))^2 / |u x v|^2         (w = p - t0, u = t1 - t0,
  v = t2 - t0 for a point and a triangle's plane; w = ea0 - eb0, u = ea1 - ea0,
  v = eb1 - eb0 for two lines)

The numerators and denominators are polynomials whose pieces are (bi/tri)linear
(cross and triple products), so the gradient and the Hessian in the <= 9 reduced
variables follow from the quotient rule in closed form; the 12-slot derivatives are
``S^T g`` and ``S^T H S`` with the constant +-1 selection matrix S. That keeps every
distance at one inlined copy of the reduced code (the type selects the primitive and
the slots at run time), which keeps Taichi compile times short.

Hessians are *added* into a row of a ``ti.field(real, (k, 12, 12))`` (``out[row, i, j]``)
rather than returned as a 12 x 12 local matrix: a 144-entry local is slow to compile
and heavy in registers on a GPU.

Also here: the edge-edge mollifier of IPC (for nearly parallel edges) with its
derivatives, and the closest-point parameters of each pair.

This module has no ``from __future__ import annotations``: Taichi reads the
``ti.template()`` annotations of the ``@ti.func``s when they are decorated.

References: Li et al. 2020, "Incremental Potential Contact" (distance types, mollifier);
Li et al. 2021, "Codimensional Incremental Potential Contact"; IPC Toolkit (ipctk) for
the conventions and type codes.
"""

import taichi as ti

# Point-triangle distance types (ipctk.PointTriangleDistanceType). Edges: E0 = (t0, t1),
# E1 = (t1, t2), E2 = (t2, t0).
PT_P_T0, PT_P_T1, PT_P_T2, PT_P_E0, PT_P_E1, PT_P_E2, PT_P_T = range(7)
# Edge-edge distance types (ipctk.EdgeEdgeDistanceType).
(
    EE_EA0_EB0,
    EE_EA0_EB1,
    EE_EA1_EB0,
    EE_EA1_EB1,
    EE_EA_EB0,
    EE_EA_EB1,
    EE_EA0_EB,
    EE_EA1_EB,
    EE_EA_EB,
) = range(9)
# Point-edge distance types (ipctk.PointEdgeDistanceType).
PE_P_E0, PE_P_E1, PE_P_E = range(3)

# Reduced primitives.
KIND_PP, KIND_PL, KIND_PLANE = 0, 1, 2
# Not a distance: the mollifier's |ea x eb|^2 through the same derivative code.
MODE_MOLLIFIER = 3

# Mollifier threshold factor of IPC: eps_x = 1e-3 |ea_rest|^2 |eb_rest|^2.
MOLLIFIER_THRESHOLD_SCALE = 1e-3


def _parallel_tolerance() -> float:
    """sin^2 of the angle below which two edges are treated as parallel.

    The interior (line-line) case divides by |ea x eb|^2, whose relative round-off is
    about machine_eps / sin(angle); 1e-20 (angle < 1e-10 rad) in f64 agrees with IPC
    Toolkit's threshold for unit-sized edges, 1e-8 in f32 (angle < 1e-4). The fallback
    (closest endpoint-segment pair) is off by at most ~ |e| sin(angle) there, and the
    mollifier switches edge-edge terms off smoothly long before (sin^2 < 1e-3).
    """
    from tisim import backend

    return 1e-20 if backend.current().precision == "f64" else 1e-8


# ---------------------------------------------------------------------------------
# small helpers


@ti.func
def _pick(x0, x1, x2, x3, s):
    """x_s for a run-time slot s in 0..3 (selects instead of dynamically indexing)."""
    r = x0
    if s == 1:
        r = x1
    elif s == 2:
        r = x2
    elif s == 3:
        r = x3
    return r


@ti.func
def _set_seg(g: ti.template(), k: ti.template(), b):
    """g[3k:3k+3] = b for a compile-time block index k."""
    for i in ti.static(range(3)):
        g[3 * k + i] = b[i]


# ---------------------------------------------------------------------------------
# distance types


@ti.func
def point_edge_distance_type(p, e0, e1):
    """Closest feature of segment (e0, e1) to p: PE_P_E0, PE_P_E1 or PE_P_E (interior).

    A zero-length edge gives PE_P_E0.
    """
    _d, r = _point_segment(p, e0, e1)
    return r


@ti.func
def _point_segment(p, e0, e1):
    """(squared distance, PE type) of p and the segment (e0, e1); the interior case
    uses |w x e|^2 / |e|^2 (no cancellation of |w|^2 - (w.e)^2/|e|^2)."""
    e = e1 - e0
    w = p - e0
    ee = e.dot(e)
    a = w.dot(e)
    d = w.dot(w)
    r = PE_P_E0
    if ee > 0.0 and a > 0.0:
        if a >= ee:
            r = PE_P_E1
            d = (p - e1).norm_sqr()
        else:
            r = PE_P_E
            d = w.cross(e).norm_sqr() / ee
    return d, r


@ti.func
def point_triangle_distance_type(p, t0, t1, t2):
    """Closest feature of triangle (t0, t1, t2) to p (a PT_* code), by the Voronoi
    regions of the vertices, then of the edges, then the face (as in Ericson,
    Real-Time Collision Detection, 5.1.5). A degenerate (zero-area) triangle never
    returns the face type: its closest feature is then a vertex or an edge.
    """
    ab = t1 - t0
    ac = t2 - t0
    ap = p - t0
    d1 = ab.dot(ap)
    d2 = ac.dot(ap)
    bp = p - t1
    d3 = ab.dot(bp)
    d4 = ac.dot(bp)
    cp = p - t2
    d5 = ab.dot(cp)
    d6 = ac.dot(cp)
    vc = d1 * d4 - d3 * d2
    vb = d5 * d2 - d1 * d6
    va = d3 * d6 - d5 * d4
    r = PT_P_T
    if d1 <= 0.0 and d2 <= 0.0:
        r = PT_P_T0
    elif d3 >= 0.0 and d4 <= d3:
        r = PT_P_T1
    elif d6 >= 0.0 and d5 <= d6:
        r = PT_P_T2
    elif vc <= 0.0 and d1 >= 0.0 and d3 <= 0.0:
        r = PT_P_E0
    elif va <= 0.0 and d4 - d3 >= 0.0 and d5 - d6 >= 0.0:
        r = PT_P_E1
    elif vb <= 0.0 and d2 >= 0.0 and d6 <= 0.0:
        r = PT_P_E2
    elif ab.cross(ac).norm_sqr() <= 0.0:
        # zero area, p's projection on the (collinear) triangle: the closest edge wins
        best = ti.math.inf
        for e in range(3):
            a = t0
            b = t1
            if e == 1:
                a = t1
                b = t2
            elif e == 2:
                a = t2
                b = t0
            de, _pe = _point_segment(p, a, b)
            if de < best:
                best = de
                r = PT_P_E0 + e
    return r


@ti.func
def edge_edge_parallel_distance_type(ea0, ea1, eb0, eb1):
    """Type for (nearly) parallel or degenerate edges: the closest of the four
    endpoint-segment pairs (for parallel segments the distance is always attained at
    an endpoint of one of them). Ties go to the first of ea0, ea1, eb0, eb1."""
    # EE type of (role, point-edge type): roles ea0-eb, ea1-eb, eb0-ea, eb1-ea
    table = ti.Vector(
        [
            EE_EA0_EB0, EE_EA0_EB1, EE_EA0_EB,
            EE_EA1_EB0, EE_EA1_EB1, EE_EA1_EB,
            EE_EA0_EB0, EE_EA1_EB0, EE_EA_EB0,
            EE_EA0_EB1, EE_EA1_EB1, EE_EA_EB1,
        ],
        ti.i32,
    )  # fmt: skip
    best = ti.math.inf
    r = EE_EA0_EB0
    for role in range(4):
        p = ea0
        a = eb0
        b = eb1
        if role == 1:
            p = ea1
        elif role >= 2:
            p = eb0 if role == 2 else eb1
            a = ea0
            b = ea1
        d, pe = _point_segment(p, a, b)
        if d < best:
            best = d
            r = table[3 * role + pe]
    return r


@ti.func
def edge_edge_distance_type(ea0, ea1, eb0, eb1):
    """Closest features of segments (ea0, ea1) and (eb0, eb1) (an EE_* code).

    Minimises |ea0 + s u - eb0 - t v|^2 over [0, 1]^2 by clamping s, then t, then s
    again (the classic segment-segment algorithm, e.g. Ericson 5.1.9). The numerators
    of the unconstrained minimiser are evaluated as n.(v x w) and n.(u x w) with
    n = u x v (Lagrange's identity) instead of b e - c d and a e - b d, and the
    denominator as |n|^2 instead of a c - b^2: the latter lose all their digits for
    nearly parallel edges. Edges within the parallel tolerance (sin^2 of the angle
    below ``_parallel_tolerance()``, or of zero length) go to
    :func:`edge_edge_parallel_distance_type`.
    """
    u = ea1 - ea0
    v = eb1 - eb0
    w = ea0 - eb0
    a = u.dot(u)
    b = u.dot(v)
    c = v.dot(v)
    d = u.dot(w)
    n = u.cross(v)
    D = n.dot(n)
    r = EE_EA_EB
    if D <= ti.static(_parallel_tolerance()) * a * c or a <= 0.0 or c <= 0.0:
        r = edge_edge_parallel_distance_type(ea0, ea1, eb0, eb1)
    else:
        e = v.dot(w)
        sN = n.dot(v.cross(w))
        s_side = 2  # 0: s = 0, 1: s = 1, 2: interior
        tN = 0.0
        tD = c
        if sN <= 0.0:
            s_side = 0
            tN = e
        elif sN >= D:
            s_side = 1
            tN = e + b
        else:
            tN = n.dot(u.cross(w))
            tD = D
        t_side = 2
        sn = 0.0  # numerator of s over a when t is clamped
        if tN <= 0.0:
            t_side = 0
            sn = -d  # s for t = 0: minimiser of |w + s u|^2
        elif tN >= tD:
            t_side = 1
            sn = b - d  # s for t = 1: minimiser of |w - v + s u|^2
        if t_side != 2:
            s_side = 2
            if sn <= 0.0:
                s_side = 0
            elif sn >= a:
                s_side = 1
        table = ti.Vector(
            [
                EE_EA0_EB0, EE_EA0_EB1, EE_EA0_EB,
                EE_EA1_EB0, EE_EA1_EB1, EE_EA1_EB,
                EE_EA_EB0, EE_EA_EB1, EE_EA_EB,
            ],
            ti.i32,
        )  # fmt: skip
        r = table[3 * s_side + t_side]
    return r


# ---------------------------------------------------------------------------------
# stencils: type -> (primitive, difference vectors as (pos, neg) slot pairs)


@ti.func
def point_triangle_stencil(dtype):
    """(kind, blocks) of a point-triangle type; slots (p, t0, t1, t2) = 0..3.

    blocks = (pos0, neg0, pos1, neg1, pos2, neg2): difference vector k is
    x[pos_k] - x[neg_k]; an unused block has pos = neg (it then contributes nothing).
    """
    kind = KIND_PP
    blk = ti.Vector([0, 1, 0, 0, 0, 0], ti.i32)
    if dtype == PT_P_T1:
        blk = ti.Vector([0, 2, 0, 0, 0, 0], ti.i32)
    elif dtype == PT_P_T2:
        blk = ti.Vector([0, 3, 0, 0, 0, 0], ti.i32)
    elif dtype == PT_P_E0:
        kind = KIND_PL
        blk = ti.Vector([0, 1, 2, 1, 0, 0], ti.i32)
    elif dtype == PT_P_E1:
        kind = KIND_PL
        blk = ti.Vector([0, 2, 3, 2, 0, 0], ti.i32)
    elif dtype == PT_P_E2:
        kind = KIND_PL
        blk = ti.Vector([0, 3, 1, 3, 0, 0], ti.i32)
    elif dtype == PT_P_T:
        kind = KIND_PLANE
        blk = ti.Vector([0, 1, 2, 1, 3, 1], ti.i32)
    return kind, blk


@ti.func
def edge_edge_stencil(dtype):
    """(kind, blocks) of an edge-edge type; slots (ea0, ea1, eb0, eb1) = 0..3.
    See :func:`point_triangle_stencil` for the block layout."""
    kind = KIND_PP
    blk = ti.Vector([0, 2, 0, 0, 0, 0], ti.i32)
    if dtype == EE_EA0_EB1:
        blk = ti.Vector([0, 3, 0, 0, 0, 0], ti.i32)
    elif dtype == EE_EA1_EB0:
        blk = ti.Vector([1, 2, 0, 0, 0, 0], ti.i32)
    elif dtype == EE_EA1_EB1:
        blk = ti.Vector([1, 3, 0, 0, 0, 0], ti.i32)
    elif dtype == EE_EA_EB0:
        kind = KIND_PL
        blk = ti.Vector([2, 0, 1, 0, 0, 0], ti.i32)
    elif dtype == EE_EA_EB1:
        kind = KIND_PL
        blk = ti.Vector([3, 0, 1, 0, 0, 0], ti.i32)
    elif dtype == EE_EA0_EB:
        kind = KIND_PL
        blk = ti.Vector([0, 2, 3, 2, 0, 0], ti.i32)
    elif dtype == EE_EA1_EB:
        kind = KIND_PL
        blk = ti.Vector([1, 2, 3, 2, 0, 0], ti.i32)
    elif dtype == EE_EA_EB:
        kind = KIND_PLANE
        blk = ti.Vector([0, 2, 1, 0, 3, 2], ti.i32)
    return kind, blk


@ti.func
def _gather(x0, x1, x2, x3, blk):
    """The three difference vectors (w, u, v) of a stencil."""
    w = _pick(x0, x1, x2, x3, blk[0]) - _pick(x0, x1, x2, x3, blk[1])
    u = _pick(x0, x1, x2, x3, blk[2]) - _pick(x0, x1, x2, x3, blk[3])
    v = _pick(x0, x1, x2, x3, blk[4]) - _pick(x0, x1, x2, x3, blk[5])
    return w, u, v


@ti.func
def stencil_slot_mask(blk):
    """4-vector of 0/1: which slots a stencil's difference vectors touch."""
    m = ti.Vector([0, 0, 0, 0], ti.i32)
    for k in ti.static(range(3)):
        if blk[2 * k] != blk[2 * k + 1]:
            for s in ti.static(range(4)):
                if blk[2 * k] == s or blk[2 * k + 1] == s:
                    m[s] = 1
    return m


# ---------------------------------------------------------------------------------
# reduced primitives
#
# Every derivative below is d = N / q with polynomial N and q of (w, u, v):
#   g = (gN - d gq) / q,   H = (HN - g gq^T - gq g^T - d Hq) / q.
# Vectors over (w, u, v) are 9-vectors; Hessian entries are evaluated one at a time
# in run-time loops (``_hessian_entry``), which keeps one small inlined copy of the
# code instead of unrolled 9 x 9 matrix algebra (Taichi compile time).


@ti.func
def _vec(k, w, u, v):
    """w, u or v for a run-time block index k = 0, 1, 2."""
    r = w
    if k == 1:
        r = u
    elif k == 2:
        r = v
    return r


@ti.func
def _cross_sq_entry(A, B, ka, kb, i, j):
    """Entry ((ka, i), (kb, j)) of the Hessian of |A x B|^2 (ka, kb: 0 for A, 1 for B):
    (A,A) 2(|B|^2 I - B B^T), (B,B) 2(|A|^2 I - A A^T), (A,B) 4 A B^T - 2 B A^T - 2(A.B) I,
    (B,A) its transpose (from |A x B|^2 = |A|^2 |B|^2 - (A.B)^2)."""
    dij = 1.0 if i == j else 0.0
    r = 0.0
    if ka == 0 and kb == 0:
        r = 2.0 * (B.dot(B) * dij - B[i] * B[j])
    elif ka == 1 and kb == 1:
        r = 2.0 * (A.dot(A) * dij - A[i] * A[j])
    elif ka == 0:
        r = 4.0 * A[i] * B[j] - 2.0 * A[j] * B[i] - 2.0 * A.dot(B) * dij
    else:
        r = 4.0 * B[i] * A[j] - 2.0 * B[j] * A[i] - 2.0 * A.dot(B) * dij
    return r


@ti.func
def _setup(mode, w, u, v):
    """(N, q, gN, gq, T, t) of a primitive (see module docstring); T = grad t for the
    plane form (t = w.(u x v)) and grad |u x v|^2 for the mollifier."""
    gN = ti.Vector.zero(float, 9)
    gq = ti.Vector.zero(float, 9)
    T = ti.Vector.zero(float, 9)
    N = 0.0
    q = 1.0
    t = 0.0
    if mode == KIND_PP:
        N = w.dot(w)
        _set_seg(gN, 0, 2.0 * w)
    elif mode == KIND_PL:
        # N = |w x u|^2: dN/dw = 2 u x c, dN/du = 2 c x w; q = |u|^2
        c = w.cross(u)
        N = c.dot(c)
        q = u.dot(u)
        _set_seg(gN, 0, 2.0 * u.cross(c))
        _set_seg(gN, 1, 2.0 * c.cross(w))
        _set_seg(gq, 1, 2.0 * u)
    else:
        # t = w.(u x v): dt/dw = n, dt/du = v x w, dt/dv = w x u; q = |n|^2 with
        # dq/du = 2 v x n, dq/dv = 2 n x u (the cross forms keep their digits for
        # nearly parallel u, v, unlike 2|v|^2 u - 2(u.v) v)
        n = u.cross(v)
        _set_seg(T, 1, 2.0 * v.cross(n))
        _set_seg(T, 2, 2.0 * n.cross(u))
        if mode == KIND_PLANE:
            gq = T
            q = n.dot(n)
            t = w.dot(n)
            N = t * t
            _set_seg(T, 0, n)
            _set_seg(T, 1, v.cross(w))
            _set_seg(T, 2, w.cross(u))
            gN = 2.0 * t * T
        else:  # MODE_MOLLIFIER: N = |u x v|^2, q = 1
            N = n.dot(n)
            gN = T
    return N, q, gN, gq, T, t


@ti.func
def _hessian_entry(mode, w, u, v, T, t, ka, kb, i, j, c1, c2):
    """(HN, Hq) at ((ka, i), (kb, j)). For the mollifier, HN = c2 gc gc^T + c1 Hc
    (c1 = m', c2 = m'' at c = |u x v|^2) and Hq = 0."""
    HN = 0.0
    Hq = 0.0
    if mode == KIND_PP:
        if ka == 0 and kb == 0 and i == j:
            HN = 2.0
    elif mode == KIND_PL:
        if ka < 2 and kb < 2:
            HN = _cross_sq_entry(w, u, ka, kb, i, j)
        if ka == 1 and kb == 1 and i == j:
            Hq = 2.0
    elif mode == KIND_PLANE:
        HN = 2.0 * T[3 * ka + i] * T[3 * kb + j]
        if ka != kb and i != j:
            # Hessian of the triple product: d2t / dy_ka,i dy_kb,j = +-eps_ijm z_m with
            # z the third vector, + for cyclic (ka, kb) = (w,u), (u,v), (v,w)
            m = 3 - i - j
            z = _vec(3 - ka - kb, w, u, v)
            levi = ti.cast((i - j) * (j - m) * (m - i), float) * 0.5
            sgn = 1.0 if (kb - ka + 3) % 3 == 1 else -1.0
            HN += 2.0 * t * sgn * levi * z[m]
        if ka > 0 and kb > 0:
            Hq = _cross_sq_entry(u, v, ka - 1, kb - 1, i, j)
    else:
        if ka > 0 and kb > 0:
            HN = c2 * T[3 * ka + i] * T[3 * kb + j]
            HN += c1 * _cross_sq_entry(u, v, ka - 1, kb - 1, i, j)
    return HN, Hq


@ti.func
def _reduced_value(kind, w, u, v):
    """Squared distance of a primitive from its difference vectors (m^2)."""
    d = w.dot(w)
    if kind == KIND_PL:
        c = w.cross(u)
        d = c.dot(c) / u.dot(u)
    elif kind == KIND_PLANE:
        n = u.cross(v)
        t = w.dot(n)
        d = t * t / n.dot(n)
    return d


@ti.func
def _reduced_gradient(kind, w, u, v):
    """(d, g): squared distance and its gradient in the 9 reduced variables (w, u, v)."""
    N, q, gN, gq, _T, _t = _setup(kind, w, u, v)
    d = N / q
    return d, (gN - d * gq) / q


@ti.func
def _reduced_hessian_add(mode, w, u, v, blk, out: ti.template(), row, scale, c1, c2):
    """out[row] += scale * S^T H S (12 x 12) with H the reduced Hessian of the primitive
    ``mode`` and S the stencil's selection; returns (d, g) (value and reduced gradient).

    Plain read-modify-writes: one thread owns a row."""
    N, q, gN, gq, T, t = _setup(mode, w, u, v)
    d = N / q
    g = (gN - d * gq) / q
    for a in range(9):
        ka = a // 3
        pa = blk[2 * ka]
        na = blk[2 * ka + 1]
        if pa != na:
            for b in range(9):
                kb = b // 3
                pb = blk[2 * kb]
                nb = blk[2 * kb + 1]
                if pb != nb:
                    i = a % 3
                    j = b % 3
                    HN, Hq = _hessian_entry(mode, w, u, v, T, t, ka, kb, i, j, c1, c2)
                    h = scale * (HN - g[a] * gq[b] - gq[a] * g[b] - d * Hq) / q
                    out[row, 3 * pa + i, 3 * pb + j] = out[row, 3 * pa + i, 3 * pb + j] + h
                    out[row, 3 * na + i, 3 * nb + j] = out[row, 3 * na + i, 3 * nb + j] + h
                    out[row, 3 * pa + i, 3 * nb + j] = out[row, 3 * pa + i, 3 * nb + j] - h
                    out[row, 3 * na + i, 3 * pb + j] = out[row, 3 * na + i, 3 * pb + j] - h
    return d, g


@ti.func
def _scatter_gradient(blk, gy):
    """12-vector S^T gy of a 9-vector gy in the stencil's reduced variables."""
    g = ti.Vector.zero(float, 12)
    for k in range(3):
        pk = blk[2 * k]
        nk = blk[2 * k + 1]
        if pk != nk:
            for i in range(3):
                g[3 * pk + i] += gy[3 * k + i]
                g[3 * nk + i] -= gy[3 * k + i]
    return g


# ---------------------------------------------------------------------------------
# public distances


@ti.func
def point_point_distance(a, b):
    """|a - b|^2 (m^2)."""
    return (a - b).dot(a - b)


@ti.func
def point_line_distance(p, e0, e1):
    """Squared distance from p to the infinite line through e0, e1 (m^2)."""
    return _reduced_value(KIND_PL, p - e0, e1 - e0, e1 - e0)


@ti.func
def point_plane_distance(p, t0, t1, t2):
    """Squared distance from p to the plane of (t0, t1, t2) (m^2)."""
    return _reduced_value(KIND_PLANE, p - t0, t1 - t0, t2 - t0)


@ti.func
def line_line_distance(ea0, ea1, eb0, eb1):
    """Squared distance between two infinite non-parallel lines (m^2)."""
    return _reduced_value(KIND_PLANE, ea0 - eb0, ea1 - ea0, eb1 - eb0)


@ti.func
def point_edge_distance(p, e0, e1):
    """Squared distance from p to the segment (e0, e1) (m^2)."""
    d, _r = _point_segment(p, e0, e1)
    return d


@ti.func
def point_triangle_distance(p, t0, t1, t2, dtype):
    """Squared distance of p to the triangle as the type ``dtype`` (m^2)."""
    kind, blk = point_triangle_stencil(dtype)
    w, u, v = _gather(p, t0, t1, t2, blk)
    return _reduced_value(kind, w, u, v)


@ti.func
def edge_edge_distance(ea0, ea1, eb0, eb1, dtype):
    """Squared distance between the two segments as the type ``dtype`` (m^2)."""
    kind, blk = edge_edge_stencil(dtype)
    w, u, v = _gather(ea0, ea1, eb0, eb1, blk)
    return _reduced_value(kind, w, u, v)


@ti.func
def point_triangle_distance_gradient(p, t0, t1, t2, dtype):
    """(d, g): squared distance (m^2) and its gradient over (p, t0, t1, t2) (12, m)."""
    kind, blk = point_triangle_stencil(dtype)
    w, u, v = _gather(p, t0, t1, t2, blk)
    d, gy = _reduced_gradient(kind, w, u, v)
    return d, _scatter_gradient(blk, gy)


@ti.func
def edge_edge_distance_gradient(ea0, ea1, eb0, eb1, dtype):
    """(d, g): squared distance (m^2) and its gradient over (ea0, ea1, eb0, eb1) (12, m)."""
    kind, blk = edge_edge_stencil(dtype)
    w, u, v = _gather(ea0, ea1, eb0, eb1, blk)
    d, gy = _reduced_gradient(kind, w, u, v)
    return d, _scatter_gradient(blk, gy)


@ti.func
def stencil_distance_hessian_add(kind, blk, x0, x1, x2, x3, out: ti.template(), row, scale):
    """Add scale * Hessian of a stencil's squared distance into out[row] (12 x 12);
    return (d, g) with g the 12-slot gradient. Used by the batch kernels so that one
    inlined copy serves both pair kinds."""
    w, u, v = _gather(x0, x1, x2, x3, blk)
    d, gy = _reduced_hessian_add(kind, w, u, v, blk, out, row, scale, 0.0, 0.0)
    return d, _scatter_gradient(blk, gy)


@ti.func
def point_triangle_distance_hessian_add(p, t0, t1, t2, dtype, out: ti.template(), row, scale):
    """out[row, :, :] += scale * Hessian of the point-triangle squared distance
    (slots p, t0, t1, t2); returns (d, g) like the gradient function."""
    kind, blk = point_triangle_stencil(dtype)
    return stencil_distance_hessian_add(kind, blk, p, t0, t1, t2, out, row, scale)


@ti.func
def edge_edge_distance_hessian_add(ea0, ea1, eb0, eb1, dtype, out: ti.template(), row, scale):
    """out[row, :, :] += scale * Hessian of the edge-edge squared distance
    (slots ea0, ea1, eb0, eb1); returns (d, g)."""
    kind, blk = edge_edge_stencil(dtype)
    return stencil_distance_hessian_add(kind, blk, ea0, ea1, eb0, eb1, out, row, scale)


# ---------------------------------------------------------------------------------
# edge-edge mollifier


@ti.func
def edge_edge_mollifier_threshold(ea0_rest, ea1_rest, eb0_rest, eb1_rest):
    """eps_x = 1e-3 |ea1 - ea0|^2 |eb1 - eb0|^2 at rest (m^4)."""
    return MOLLIFIER_THRESHOLD_SCALE * (ea1_rest - ea0_rest).norm_sqr() * (eb1_rest - eb0_rest).norm_sqr()


@ti.func
def mollifier(c, eps_x):
    """(m, m', m'') of IPC's edge-edge mollifier at c = |ea x eb|^2 (m^4):
    m = (2 - c/eps_x) c/eps_x for c < eps_x, 1 otherwise."""
    m = 1.0
    dm = 0.0
    d2m = 0.0
    if c < eps_x:
        r = c / eps_x
        m = (2.0 - r) * r
        dm = 2.0 * (1.0 - r) / eps_x
        d2m = -2.0 / (eps_x * eps_x)
    return m, dm, d2m


@ti.func
def edge_edge_cross_squarednorm(ea0, ea1, eb0, eb1):
    """|(ea1 - ea0) x (eb1 - eb0)|^2 (m^4)."""
    return (ea1 - ea0).cross(eb1 - eb0).norm_sqr()


@ti.func
def edge_edge_mollifier(ea0, ea1, eb0, eb1, eps_x):
    """Mollifier value (dimensionless)."""
    m, _dm, _d2m = mollifier(edge_edge_cross_squarednorm(ea0, ea1, eb0, eb1), eps_x)
    return m


@ti.func
def _mollifier_blocks():
    """The mollifier's difference vectors: u = x1 - x0 (block 1), v = x3 - x2 (block 2)."""
    return ti.Vector([0, 0, 1, 0, 3, 2], ti.i32)


@ti.func
def _mollifier_cross_gradient(u, v):
    """(c, gc): c = |u x v|^2 and its gradient over (w, u, v) (9; w block zero),
    dc/du = 2 v x n, dc/dv = 2 n x u with n = u x v."""
    n = u.cross(v)
    gc = ti.Vector.zero(float, 9)
    _set_seg(gc, 1, 2.0 * v.cross(n))
    _set_seg(gc, 2, 2.0 * n.cross(u))
    return n.dot(n), gc


@ti.func
def edge_edge_mollifier_gradient(ea0, ea1, eb0, eb1, eps_x):
    """(m, g): mollifier and its gradient over (ea0, ea1, eb0, eb1) (12, 1/m)."""
    c, gc = _mollifier_cross_gradient(ea1 - ea0, eb1 - eb0)
    m, dm, _d2m = mollifier(c, eps_x)
    return m, _scatter_gradient(_mollifier_blocks(), dm * gc)


@ti.func
def edge_edge_mollifier_hessian_add(ea0, ea1, eb0, eb1, eps_x, out: ti.template(), row, scale):
    """out[row] += scale * Hessian of the mollifier (12 x 12, 1/m^2); returns (m, g).

    Hessian m'' gc gc^T + m' Hc with c = |ea x eb|^2. Nothing is added where the
    mollifier is inactive (c >= eps_x, m = 1)."""
    u = ea1 - ea0
    v = eb1 - eb0
    blk = _mollifier_blocks()
    c, gc = _mollifier_cross_gradient(u, v)
    m, dm, d2m = mollifier(c, eps_x)
    if c < eps_x:
        _reduced_hessian_add(MODE_MOLLIFIER, u, u, v, blk, out, row, scale, dm, d2m)
    return m, _scatter_gradient(blk, dm * gc)


# ---------------------------------------------------------------------------------
# closest points


@ti.func
def point_triangle_closest_point(p, t0, t1, t2, dtype):
    """Barycentric (b1, b2) of the closest point t0 + b1 (t1 - t0) + b2 (t2 - t0) on the
    feature selected by ``dtype`` (not clamped: exact on the feature's own region)."""
    b = ti.Vector([0.0, 0.0])
    if dtype == PT_P_T1:
        b = ti.Vector([1.0, 0.0])
    elif dtype == PT_P_T2:
        b = ti.Vector([0.0, 1.0])
    elif dtype == PT_P_E0:
        e = t1 - t0
        b = ti.Vector([(p - t0).dot(e) / e.dot(e), 0.0])
    elif dtype == PT_P_E1:
        e = t2 - t1
        a = (p - t1).dot(e) / e.dot(e)
        b = ti.Vector([1.0 - a, a])
    elif dtype == PT_P_E2:
        e = t0 - t2
        a = (p - t2).dot(e) / e.dot(e)
        b = ti.Vector([0.0, 1.0 - a])
    elif dtype == PT_P_T:
        e0 = t1 - t0
        e1 = t2 - t0
        r = p - t0
        a00 = e0.dot(e0)
        a01 = e0.dot(e1)
        a11 = e1.dot(e1)
        r0 = e0.dot(r)
        r1 = e1.dot(r)
        # Cramer on the normal equations; det = |e0 x e1|^2 computed without cancellation
        det = e0.cross(e1).norm_sqr()
        b = ti.Vector([(a11 * r0 - a01 * r1) / det, (a00 * r1 - a01 * r0) / det])
    return b


@ti.func
def edge_edge_closest_point(ea0, ea1, eb0, eb1, dtype):
    """(s, t): closest points ea0 + s (ea1 - ea0) and eb0 + t (eb1 - eb0) on the features
    selected by ``dtype``."""
    u = ea1 - ea0
    v = eb1 - eb0
    st = ti.Vector([0.0, 0.0])
    if dtype == EE_EA0_EB1:
        st = ti.Vector([0.0, 1.0])
    elif dtype == EE_EA1_EB0:
        st = ti.Vector([1.0, 0.0])
    elif dtype == EE_EA1_EB1:
        st = ti.Vector([1.0, 1.0])
    elif dtype == EE_EA_EB0:
        st = ti.Vector([(eb0 - ea0).dot(u) / u.dot(u), 0.0])
    elif dtype == EE_EA_EB1:
        st = ti.Vector([(eb1 - ea0).dot(u) / u.dot(u), 1.0])
    elif dtype == EE_EA0_EB:
        st = ti.Vector([0.0, (ea0 - eb0).dot(v) / v.dot(v)])
    elif dtype == EE_EA1_EB:
        st = ti.Vector([1.0, (ea1 - eb0).dot(v) / v.dot(v)])
    elif dtype == EE_EA_EB:
        w = ea0 - eb0
        n = u.cross(v)
        D = n.dot(n)
        st = ti.Vector([n.dot(v.cross(w)) / D, n.dot(u.cross(w)) / D])
    return st
