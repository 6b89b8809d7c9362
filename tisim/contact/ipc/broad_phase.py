"""Broad phase: point-triangle and edge-edge candidate pairs from spatial hashes, in Taichi.

Each primitive (vertex, edge, face) gets an axis-aligned box over its vertices at x
(and at x + alpha dx for the swept boxes of CCD), grown by inflation / 2 on every
side, so two boxes overlap whenever the primitives' distance is below ``inflation``
(the solver passes dhat + thickness, the barrier's activation distance).

A pair needs an active vertex (inactive vertices are kinematic obstacles). The
primitives with an active vertex ("dynamic": the cloth's faces and edges) and those
without ("static": an obstacle's faces, edges and vertices) go into two uniform grids,
each stored as a hash table:

- the dynamic grid holds the dynamic faces and edges and is rebuilt on every call;
- the static grid holds the static faces, edges and vertices and is rebuilt only when
  an inactive vertex's box changed (the obstacle moved, or it is swept, or the
  inflation changed: the boxes are compared bit for bit on the device), so a static
  collider mesh is inserted once per run, not once per Newton iteration.

Then only dynamic primitives query: every active vertex the faces of both grids, every
dynamic edge the dynamic edges of larger index and the static edges, and every dynamic
face the static vertices. That finds every pair with an active vertex exactly once, and
an obstacle's thousands of primitives cost neither a per-call insertion nor a query
(a 2,562-vertex sphere under the refine preview's 17 x 17 sheet had made them most of
a detection). A query box is clipped to the static grid's domain before its cells are
visited, so a long swept box costs at most that domain's cells.

A grid is built in two kernels (:mod:`tisim.contact.ipc.hash_grid`). The query runs in
two passes: count each query's pairs, scan the counts, enumerate again and write each pair
at its query's offset plus its rank. A pair is reported only from the one cell that holds
the lower corner of the two boxes' intersection, so each unordered pair appears once
without a global de-duplication, and only when the boxes really overlap (hash
collisions cost time, never pairs). A detection launches four kernels, the host reading
a number back after each of the first three (the statistics, the entries' total, the
pairs' count): the boxes, the grid's two, and the counting pass with its scan, which also
writes the rows when every query's partners were kept and the rows fit the pair arrays;
otherwise a fifth, the writing pass, follows (and a moved obstacle's grid adds three).

No atomic operation sits inside a loop whose trip count differs between threads:
Taichi 1.7.4's SPIR-V code (Vulkan; seen with Mesa's lavapipe) loses some of those
updates (``studies/spirv_loop_atomics.py``), which lost contact pairs there. Atomics run
one per thread in flat loops; per-box and per-query loops only count and store.

The output is deterministic, bit for bit, whatever the thread scheduling: the mean box
size is summed in fixed blocks (not with float atomics), each hash bucket's entries are
sorted after the scatter (so every query enumerates its candidates in a fixed order),
and each pair's row is its query's offset plus its rank. Rows come out grouped by query
primitive: point-triangle rows of the active points in increasing order, then those of
the dynamic faces (with a static vertex) in input order; edge-edge rows by dynamic edge
in input order. A query lists its dynamic-grid partners before its static-grid ones.

Serial parts of kernels (a prefix over blocks, a few scalars) are loops of one trip
under ``ti.loop_config(serialize=True)``: on the CPU backend a parallel loop costs a
thread-pool round trip (about 65 us on the 2-core benchmark machine, however short the
loop), a serialized one nothing; the SPIR-V backends ignore the setting, which changes
nothing for a single trip.

Every kernel takes Taichi ndarrays (no template fields), so each compiles once per
process for all instances, sizes and both precisions' element types, and the offline
cache reuses it across processes.

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.

Limitations: a uniform grid suits meshes of similar edge lengths; a few primitives
with huge (swept) boxes enlarge the dynamic grid's cells (at most
``MAX_CELLS_PER_AXIS`` cells per axis for the largest box), which makes the query
slower but never incomplete.
"""

import logging
import time

import numpy as np
import taichi as ti

from tisim import backend
from tisim.backend import download, upload
from tisim.contact.ipc.hash_grid import _SCAN_BLOCK, _SCAN_SHIFT, _cell_of, _Grid, _hash, _next_pow2, scan, scan_total

log = logging.getLogger(__name__)


@ti.func
def _overlap(lo_a, hi_a, lo_b, hi_b):
    return (
        lo_a[0] <= hi_b[0]
        and lo_b[0] <= hi_a[0]
        and lo_a[1] <= hi_b[1]
        and lo_b[1] <= hi_a[1]
        and lo_a[2] <= hi_b[2]
        and lo_b[2] <= hi_a[2]
    )


@ti.func
def vertex_boxes(
    X: ti.template(),
    DX: ti.template(),
    alpha,
    pad,
    n,
    active: ti.template(),
    lo: ti.template(),
    hi: ti.template(),
    cache_lo: ti.template(),
    cache_hi: ti.template(),
    flags: ti.template(),
):
    """Boxes of the vertices [0, n) (X, DX: vec3 positions and step).

    An inactive vertex whose box differs from its cached one (bit for bit) stores the
    new box in the cache and sets flags[0] = 1: the static grid is stale. The stores of
    1 may race; they all store the same value."""
    ti.loop_config(serialize=True)
    for _ in range(1):
        flags[0] = 0
    for v in range(n):
        a = X[v]
        b = a + alpha * DX[v]
        lv = ti.min(a, b) - pad
        hv = ti.max(a, b) + pad
        lo[v] = lv
        hi[v] = hv
        if active[v] == 0 and ((lv != cache_lo[v]).any() or (hv != cache_hi[v]).any()):
            cache_lo[v] = lv
            cache_hi[v] = hv
            flags[0] = 1


@ti.func
def prim_boxes(
    lo: ti.template(),
    hi: ti.template(),
    faces: ti.template(),
    edges: ti.template(),
    n,
    nf,
    ids: ti.template(),
    count,
    ext: ti.template(),
    block_sums: ti.template(),
    box_blocks: ti.template(),
    stats: ti.template(),
):
    """Boxes of the primitives ids[0 .. count - 1] (box ids: vertex v, face n + f, edge
    n + nf + e) from their vertices' boxes, and their statistics.

    ext: (>= count,) the largest side of each box;
    block_sums: (>= ceil(count / _SCAN_BLOCK),) and box_blocks (same rows, 7) scratch.
    stats: [sum of the boxes' largest sides, the largest side, domain min (3), domain
    max (3)] over the listed boxes. Sums and bounds are taken in fixed blocks,
    then over the blocks in one thread (deterministic rounding, no contended atomics)."""
    for i in range(count):
        b = ids[i]
        if b >= n:
            lb = ti.Vector([0.0, 0.0, 0.0])
            hb = ti.Vector([0.0, 0.0, 0.0])
            if b < n + nf:
                f0, f1, f2 = faces[b - n, 0], faces[b - n, 1], faces[b - n, 2]
                lb = ti.min(lo[f0], lo[f1], lo[f2])
                hb = ti.max(hi[f0], hi[f1], hi[f2])
            else:
                e0, e1 = edges[b - n - nf, 0], edges[b - n - nf, 1]
                lb = ti.min(lo[e0], lo[e1])
                hb = ti.max(hi[e0], hi[e1])
            lo[b] = lb
            hi[b] = hb
            ext[i] = (hb - lb).max()
        else:
            ext[i] = (hi[b] - lo[b]).max()
    n_blocks = (count + _SCAN_BLOCK - 1) >> _SCAN_SHIFT
    for blk in range(n_blocks):
        inf3 = ti.Vector([ti.math.inf, ti.math.inf, ti.math.inf])
        dmin, dmax = inf3, -inf3
        emax = 0.0
        acc = 0.0
        for j in range(blk * _SCAN_BLOCK, ti.min((blk + 1) * _SCAN_BLOCK, count)):
            b = ids[j]
            dmin = ti.min(dmin, lo[b])
            dmax = ti.max(dmax, hi[b])
            emax = ti.max(emax, ext[j])
            acc += ext[j]
        for k in ti.static(range(3)):
            box_blocks[blk, k] = dmin[k]
            box_blocks[blk, 3 + k] = dmax[k]
        box_blocks[blk, 6] = emax
        block_sums[blk] = acc
    ti.loop_config(serialize=True)
    for _ in range(1):  # locals, not in-place updates of stats (see _scan_buckets)
        inf3 = ti.Vector([ti.math.inf, ti.math.inf, ti.math.inf])
        dmin, dmax = inf3, -inf3
        emax = 0.0
        acc = 0.0
        for blk in range(n_blocks):
            for k in ti.static(range(3)):
                dmin[k] = ti.min(dmin[k], box_blocks[blk, k])
                dmax[k] = ti.max(dmax[k], box_blocks[blk, 3 + k])
            emax = ti.max(emax, box_blocks[blk, 6])
            acc += block_sums[blk]
        stats[0] = acc
        stats[1] = emax
        for k in ti.static(range(3)):
            stats[2 + k] = dmin[k]
            stats[5 + k] = dmax[k]


@ti.kernel
def _detection_boxes(
    X: ti.types.ndarray(),
    DX: ti.types.ndarray(),
    alpha: float,
    pad: float,
    n: ti.i32,
    active: ti.types.ndarray(),
    lo: ti.types.ndarray(),
    hi: ti.types.ndarray(),
    cache_lo: ti.types.ndarray(),
    cache_hi: ti.types.ndarray(),
    flags: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    edges: ti.types.ndarray(),
    nf: ti.i32,
    ids: ti.types.ndarray(),
    count: ti.i32,
    ext: ti.types.ndarray(),
    block_sums: ti.types.ndarray(),
    box_blocks: ti.types.ndarray(),
    stats: ti.types.ndarray(),
):
    """A detection's boxes in one launch: the vertices' (``vertex_boxes``), then those of
    the primitives ids[0 .. count - 1] with their statistics (``prim_boxes``)."""
    vertex_boxes(X, DX, alpha, pad, n, active, lo, hi, cache_lo, cache_hi, flags)
    prim_boxes(lo, hi, faces, edges, n, nf, ids, count, ext, block_sums, box_blocks, stats)


@ti.kernel
def _prim_boxes(
    lo: ti.types.ndarray(),
    hi: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    edges: ti.types.ndarray(),
    n: ti.i32,
    nf: ti.i32,
    ids: ti.types.ndarray(),
    count: ti.i32,
    ext: ti.types.ndarray(),
    block_sums: ti.types.ndarray(),
    box_blocks: ti.types.ndarray(),
    stats: ti.types.ndarray(),
):
    """The boxes of the primitives ids[0 .. count - 1] alone (``prim_boxes``: the
    obstacles' grid, rebuilt when they moved)."""
    prim_boxes(lo, hi, faces, edges, n, nf, ids, count, ext, block_sums, box_blocks, stats)


@ti.func
def _visit(
    is_point,
    a0,
    a1,
    box,
    lo_a,
    hi_a,
    stats: ti.template(),
    origin,
    inv_cell,
    buckets: ti.template(),
    entries: ti.template(),
    static_grid: ti.template(),
    lo: ti.template(),
    hi: ti.template(),
    faces: ti.template(),
    edges: ti.template(),
    n,
    nf,
    i,
    query_counts: ti.template(),
    found: ti.template(),
    cap,
    write,
    ee_base,
    pt: ti.template(),
    ee: ti.template(),
    rank,
):
    """Visit the cells of query box (lo_a, hi_a) clipped to the grid's domain,
    stats[2:5] .. stats[5:8], in one grid: count (write = 0, keeping the first cap
    partners in found[i]) or write the pairs of query i (the point a0, or the edge
    (a0, a1) of box id ``box``). Returns the rank after this grid's partners."""
    mask = buckets.shape[0] - 1
    q_lo = ti.max(lo_a, ti.Vector([stats[2], stats[3], stats[4]]))
    q_hi = ti.min(hi_a, ti.Vector([stats[5], stats[6], stats[7]]))
    c0 = _cell_of(q_lo, origin, inv_cell)
    c1 = _cell_of(q_hi, origin, inv_cell)
    if (q_lo > q_hi).any():
        c1 = c0 - 1  # outside the grid's domain: no candidate
    for cx, cy, cz in ti.ndrange((c0[0], c1[0] + 1), (c0[1], c1[1] + 1), (c0[2], c1[2] + 1)):
        h = _hash(cx, cy, cz, mask)
        # a bucket lists its faces, then its edges (from buckets[h, 2]; _sort_buckets)
        k0 = buckets[h, 1]
        k1 = buckets[h, 2]
        if not is_point:
            k0 = buckets[h, 2]
            k1 = buckets[h, 1] + buckets[h, 0]
        for k in range(k0, k1):
            other = entries[k, 0]
            if ti.static(not static_grid):  # a compile-time branch
                if not is_point and other <= box:
                    continue  # each pair of dynamic edges from the smaller one
            # the entry must be this cell (not a hash collision)
            same_cell = entries[k, 1] == cx and entries[k, 2] == cy and entries[k, 3] == cz
            if not same_cell:
                continue
            row = ti.Vector([0, 0, 0, 0])
            if is_point:
                f0, f1, f2 = faces[other - n, 0], faces[other - n, 1], faces[other - n, 2]
                if a0 == f0 or a0 == f1 or a0 == f2:
                    continue
                row = ti.Vector([a0, f0, f1, f2])
            else:
                eb0 = edges[other - n - nf, 0]
                eb1 = edges[other - n - nf, 1]
                if a0 == eb0 or a0 == eb1 or a1 == eb0 or a1 == eb1:
                    continue
                row = ti.Vector([a0, a1, eb0, eb1])
            lo_b = lo[other]
            hi_b = hi[other]
            if not _overlap(lo_a, hi_a, lo_b, hi_b):
                continue
            corner = _cell_of(ti.max(lo_a, lo_b), origin, inv_cell)
            if corner[0] != cx or corner[1] != cy or corner[2] != cz:
                continue  # reported from another cell
            if write != 0:
                if is_point:
                    pt[query_counts[i, 1] + rank] = row
                else:
                    ee[query_counts[i, 1] - ee_base + rank] = row
            elif rank < cap:
                found[i, rank] = other
            rank += 1
    return rank


@ti.func
def _query(i, points: ti.template(), active: ti.template(), edges: ti.template(), n, nf, n_points):
    """Query i: (is a point, the point or the edge's first vertex, the edge's second
    vertex, its box id, whether it visits the obstacles' grid)."""
    is_point = i < n_points
    a0 = 0  # the point, or the edge's vertices
    a1 = 0
    box = 0
    static_too = 1
    if is_point:
        a0 = points[i]
        box = a0
        static_too = active[a0]
    else:
        ei = i - n_points
        a0, a1 = edges[ei, 0], edges[ei, 1]
        box = n + nf + ei
    return is_point, a0, a1, box, static_too


@ti.func
def _write_kept(
    i, is_point, a0, a1, query_counts: ti.template(), found: ti.template(), faces: ti.template(),
    edges: ti.template(), n, nf, ee_base, pt: ti.template(), ee: ti.template(),
):  # fmt: skip
    """Write query i's pairs from the partners the counting pass kept in found[i]."""
    for r in range(query_counts[i, 0]):
        other = found[i, r]
        k = query_counts[i, 1] + r
        if is_point:
            pt[k] = ti.Vector([a0, faces[other - n, 0], faces[other - n, 1], faces[other - n, 2]])
        else:
            ee[k - ee_base] = ti.Vector([a0, a1, edges[other - n - nf, 0], edges[other - n - nf, 1]])


@ti.kernel
def _query_pairs(
    lo: ti.types.ndarray(),
    hi: ti.types.ndarray(),
    points: ti.types.ndarray(),
    active: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    edges: ti.types.ndarray(),
    n: ti.i32,
    nf: ti.i32,
    n_points: ti.i32,
    n_qe: ti.i32,
    d_stats: ti.types.ndarray(),
    d_origin: ti.types.vector(3, float),
    d_inv_cell: float,
    d_buckets: ti.types.ndarray(),
    d_entries: ti.types.ndarray(),
    s_on: ti.i32,
    s_stats: ti.types.ndarray(),
    s_origin: ti.types.vector(3, float),
    s_inv_cell: float,
    s_buckets: ti.types.ndarray(),
    s_entries: ti.types.ndarray(),
    query_counts: ti.types.ndarray(),
    found: ti.types.ndarray(),
    cap: ti.i32,
    write: ti.i32,
    ee_base: ti.i32,
    pt: ti.types.ndarray(),
    ee: ti.types.ndarray(),
    query_blocks: ti.types.ndarray(),
    totals: ti.types.ndarray(),
):
    """The pairs of every query, in two passes.

    Queries: i < n_points the point points[i], then the n_qe dynamic edges [0, n_qe).
    A point visits the dynamic grid's faces and, if active, the static grid's; a dynamic
    edge the dynamic edges of larger index and the static edges. Each grid's visit is
    clipped to its domain, d_stats / s_stats[2:5] .. [5:8] (``_prim_boxes``' statistics
    in the positions' precision: a ``float`` argument is f32 when this module was
    imported before ``ti.init``, and a clip rounded inwards would lose pairs), so an
    obstacle vertex away from the cloth visits no cell. s_on = 0: no static grid.
    write = 0: query_counts[i, 0] = number of pairs of query i, their exclusive scan into
    query_counts[:, 1] and totals = (point-triangle pairs, all pairs). write = 1: the pairs are written, a
    point's at pt[start(i) + rank], an edge's at ee[start(i) - ee_base + rank], where
    ee_base = start(n_points). Each thread enumerates its candidates in a fixed order and
    writes with plain stores: no atomics (Taichi's SPIR-V code loses atomic updates made
    inside run-time loops) and the same rows, in the same order, on every backend and run.

    found (queries, >= cap): the counting pass keeps a query's first ``cap`` partners
    (box ids, in enumeration order) there, and the writing pass copies them instead of
    traversing the grids again; only queries with more partners traverse twice.
    """
    for i in range(n_points + n_qe):
        is_point, a0, a1, box, static_too = _query(i, points, active, edges, n, nf, n_points)
        lo_a = lo[box]
        hi_a = hi[box]
        rank = 0
        if write != 0 and query_counts[i, 0] <= cap:  # the partners kept by the counting pass
            _write_kept(i, is_point, a0, a1, query_counts, found, faces, edges, n, nf, ee_base, pt, ee)
        else:
            for g in ti.static(range(2)):  # the cloth's grid, then the obstacles' grid
                visit = 1
                if ti.static(g == 1):
                    visit = s_on * static_too
                if visit != 0:
                    rank = _visit(
                        is_point, a0, a1, box, lo_a, hi_a, ti.static((d_stats, s_stats)[g]),
                        (d_origin, s_origin)[g], (d_inv_cell, s_inv_cell)[g],
                        ti.static((d_buckets, s_buckets)[g]), ti.static((d_entries, s_entries)[g]), g == 1,
                        lo, hi, faces, edges, n, nf, i, query_counts, found, cap, write, ee_base, pt, ee, rank,
                    )  # fmt: skip
            if write == 0:
                query_counts[i, 0] = rank
    scan(query_counts, query_blocks, query_counts.shape[0] * (1 - write))
    scan_total(query_counts, n_points, totals, 1 - write)
    # The counting pass writes the pairs too when every query's partners were kept and the
    # rows fit the pair arrays (totals[3] = the queries copied, else 0: the host then
    # launches the writing pass): the writing pass's copies, one launch earlier
    ti.loop_config(serialize=True)
    for _ in range(1 - write):
        totals[2] = 0
    for i in range((n_points + n_qe) * (1 - write)):
        if query_counts[i, 0] > cap:
            totals[2] = 1  # (the stores may race; they all store the same value)
    ti.loop_config(serialize=True)
    for _ in range(1 - write):
        totals[3] = 0
        if totals[2] == 0 and totals[0] <= pt.shape[0] and totals[1] - totals[0] <= ee.shape[0]:
            totals[3] = n_points + n_qe
    for i in range(totals[3] * (1 - write)):
        is_point, a0, a1, _box, _static = _query(i, points, active, edges, n, nf, n_points)
        _write_kept(i, is_point, a0, a1, query_counts, found, faces, edges, n, nf, totals[0], pt, ee)


# partners per query kept between the two passes of _query_pairs (a cloth vertex near a
# tessellated sphere has a few; deep in a fold, dozens: those traverse the grids twice)
FOUND_KEPT = 16


class BroadPhase:
    """Point-triangle and edge-edge candidates whose (inflated, optionally swept) boxes overlap.

    vertex_count: n, the number of vertices of the shared position array (cloth and
    obstacle vertices together).
    faces: (nf, 3) int, triangles over those vertices; edges: (ne, 2) int, unique
    undirected edges. Points are the vertices used by a face or an edge.
    vertex_active: (n,) bool; False for kinematic obstacle vertices: a pair whose four
    vertices are all inactive is never reported. None: all active.
    initial_capacity: rows of the pair buffers to start with; they grow before the
    pairs are written when the counting pass finds more, so no pair is ever dropped.

    After ``n_pt, n_ee = bp.detect(x, inflation, dx=None, alpha=1.0)``, ``bp.pt[:n_pt]``
    holds rows (point, t0, t1, t2) and ``bp.ee[:n_ee]`` rows (ea0, ea1, eb0, eb1)
    (``ti.Vector.ndarray(4, ti.i32, capacity)``), each unordered pair once, skipping a
    point on its own triangle and edges that share a vertex, in a deterministic order
    (see the module docstring). Read ``bp.pt`` / ``bp.ee`` after each detect: growth
    replaces the ndarrays. ``last_timings`` holds the build and query wall times
    (seconds) of the last call; ``static_builds`` counts the static grid's (re)builds.

    All storage is Taichi ndarrays and every kernel takes ndarrays, so a new instance
    (any size) compiles nothing.
    """

    def __init__(
        self,
        vertex_count: int,
        faces,
        edges,
        vertex_active=None,
        *,
        initial_capacity: int = 1 << 14,
    ):
        n = int(vertex_count)
        faces = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
        edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        for name, arr in (("faces", faces), ("edges", edges)):
            if arr.size and (arr.min() < 0 or arr.max() >= n):
                raise ValueError(f"{name} index out of range [0, {n})")
        if vertex_active is None:
            vertex_active = np.ones(n, dtype=bool)
        vertex_active = np.asarray(vertex_active, dtype=bool)
        if vertex_active.shape != (n,):
            raise ValueError(f"vertex_active must have shape ({n},), got {vertex_active.shape}")
        if initial_capacity < 1:
            raise ValueError("initial_capacity must be >= 1")
        points = np.unique(np.concatenate([faces.ravel(), edges.ravel()]))
        # dynamic primitives have an active vertex; the edges are kept with the dynamic
        # ones first (stable), so that the dynamic edges are [0, n_qe)
        face_dyn = vertex_active[faces].any(axis=1) if len(faces) else np.zeros(0, bool)
        edge_dyn = vertex_active[edges].any(axis=1) if len(edges) else np.zeros(0, bool)
        edges = np.concatenate([edges[edge_dyn], edges[~edge_dyn]])
        nf, ne = len(faces), len(edges)
        n_de = int(edge_dyn.sum())
        dynamic = np.concatenate([n + np.flatnonzero(face_dyn), n + nf + np.arange(n_de)])
        static = np.concatenate([n + np.flatnonzero(~face_dyn), n + nf + np.arange(n_de, ne)])

        self.vertex_count = n
        self.face_count = nf
        self.edge_count = ne
        self.point_count = len(points)
        self._n_qe = n_de
        self._n_dyn, self._n_static = len(dynamic), len(static)
        real = backend.real()

        def int_array(data: np.ndarray, shape: tuple[int, ...]):
            # Taichi arrays cannot be empty: keep one unused row for empty inputs
            shape = (max(1, shape[0]),) + shape[1:]
            a = ti.ndarray(ti.i32, shape=shape)
            buf = np.zeros(shape, dtype=np.int32)
            buf[: len(data)] = data
            upload(a, buf)
            return a

        self._faces = int_array(faces, (nf, 3))
        self._edges = int_array(edges, (ne, 2))
        self._points = int_array(points, (len(points),))
        self._active = int_array(vertex_active.astype(np.int32), (n,))
        self._dynamic = int_array(dynamic, (len(dynamic),))
        self._static = int_array(static, (len(static),))
        n_boxes = n + nf + ne
        self._lo = ti.Vector.ndarray(3, real, max(1, n_boxes))
        self._hi = ti.Vector.ndarray(3, real, max(1, n_boxes))
        # the inactive vertices' boxes at the last static build (valid once it is built;
        # not NaN for "none yet": Taichi compiles with fast math, where NaN compares equal)
        self._cache_lo = ti.Vector.ndarray(3, real, max(1, n))
        self._cache_hi = ti.Vector.ndarray(3, real, max(1, n))
        self._static_valid = False
        self._flags = ti.ndarray(ti.i32, 1)
        m = max(1, len(dynamic), len(static))
        self._ext = ti.ndarray(real, m)
        self._ext_blocks = ti.ndarray(real, (m + _SCAN_BLOCK - 1) // _SCAN_BLOCK)
        self._box_blocks = ti.ndarray(real, shape=((m + _SCAN_BLOCK - 1) // _SCAN_BLOCK, 7))
        self._stats = ti.ndarray(real, 8)  # the dynamic boxes' statistics
        self._sstats = ti.ndarray(real, 8)  # the static boxes' statistics at their last build
        self._dgrid = _Grid(len(dynamic))
        self._sgrid = _Grid(len(static)) if len(static) else None
        self.static_builds = 0
        # per query (points, dynamic edges): (pair count, start, unused)
        n_queries = max(1, self.point_count + self._n_qe)
        self._query_counts = ti.ndarray(ti.i32, shape=(n_queries, 3))
        # each query's first FOUND_KEPT partners, kept by the counting pass for the writing one
        self._kept = int(FOUND_KEPT)
        self._found = ti.ndarray(ti.i32, shape=(n_queries, max(self._kept, 1)))
        self._query_blocks = ti.ndarray(ti.i32, (n_queries + _SCAN_BLOCK - 1) // _SCAN_BLOCK)
        self._totals = ti.ndarray(ti.i32, 4)  # (point-triangle pairs, all, a query over FOUND_KEPT, copied)
        cap = int(initial_capacity)
        self._alloc_pairs("pt", cap)
        self._alloc_pairs("ee", cap)
        self.n_pt = 0
        self.n_ee = 0
        self.last_timings: dict[str, float] = {}

    def _alloc_pairs(self, kind: str, cap: int) -> None:
        """(Re)allocate the rows of kind pt/ee."""
        setattr(self, kind, ti.Vector.ndarray(4, ti.i32, cap))

    @property
    def capacity(self) -> tuple[int, int]:
        """Rows of the (pt, ee) buffers."""
        return self.pt.shape[0], self.ee.shape[0]

    @property
    def cell_size(self) -> float:
        """The dynamic grid's cell size at the last detect (metres)."""
        return self._dgrid.cell_size

    def _boxes(self, ids, count: int, stats) -> np.ndarray:
        _prim_boxes(
            self._lo, self._hi, self._faces, self._edges, self.vertex_count, self.face_count, ids, count,
            self._ext, self._ext_blocks, self._box_blocks, stats,
        )  # fmt: skip
        return download(stats)

    def detect(self, x, inflation: float, dx=None, alpha: float = 1.0) -> tuple[int, int]:
        """Find the candidate pairs; returns (n_pt, n_ee) and fills ``pt``, ``ee``.

        x: ti.Vector.ndarray(3, real, n), positions in metres (not modified).
        inflation: metres; pairs closer than this (at x, or anywhere between x and
        x + alpha dx when dx is given) are always found (each box grows by inflation/2).
        dx: optional ti.Vector.ndarray(3, real, n), the step direction (metres); the
        boxes then also cover x + alpha dx (swept boxes for CCD).
        """
        if not inflation >= 0:
            raise ValueError(f"inflation must be >= 0, got {inflation}")
        n, nf = self.vertex_count, self.face_count
        for name, a in (("x", x), ("dx", dx)):
            if a is not None and (len(a.shape) != 1 or a.shape[0] < n):
                raise ValueError(
                    f"{name} must be a ti.Vector.ndarray(3, real, n) with n >= {n}, got shape {tuple(a.shape)}"
                )
        t0 = time.perf_counter()
        if dx is None:
            dx, alpha = x, 0.0  # the same compiled kernels, with zero sweep
        self.n_pt = self.n_ee = 0
        if self._n_dyn == 0:
            return 0, 0  # no primitive with an active vertex: no pair
        _detection_boxes(
            x, dx, float(alpha), 0.5 * float(inflation), n, self._active, self._lo, self._hi,
            self._cache_lo, self._cache_hi, self._flags, self._faces, self._edges, nf, self._dynamic,
            self._n_dyn, self._ext, self._ext_blocks, self._box_blocks, self._stats,
        )  # fmt: skip
        st = download(self._stats)
        if not np.all(np.isfinite(st[:8])):
            raise FloatingPointError("broad phase: non-finite positions")
        stale = self._sgrid is not None and (not self._static_valid or int(download(self._flags)[0]) != 0)
        if stale:
            self._static_valid = False  # until this build completes
            sst = self._boxes(self._static, self._n_static, self._sstats)
            if not np.all(np.isfinite(sst[:8])):
                raise FloatingPointError("broad phase: non-finite obstacle positions")
            self._sgrid.build(self._lo, self._hi, self._static, self._n_static, sst, n + nf)
            self._static_valid = True
            self.static_builds += 1
        self._dgrid.build(self._lo, self._hi, self._dynamic, self._n_dyn, st, n + nf)
        t1 = time.perf_counter()
        d, s = self._dgrid, self._sgrid
        args = (
            self._lo, self._hi, self._points, self._active, self._faces, self._edges,
            n, nf, self.point_count, self._n_qe, self._stats, d.origin, d.inv_cell, d.buckets, d.entries,
            int(s is not None), self._sstats, s.origin if s is not None else d.origin,
            s.inv_cell if s is not None else 1.0,
            s.buckets if s is not None else d.buckets,
            s.entries if s is not None else d.entries,
            self._query_counts, self._found, self._kept,
        )  # fmt: skip
        _query_pairs(*args, 0, 0, self.pt, self.ee, self._query_blocks, self._totals)  # count (and copy)
        n_pt, n_all, _over, copied = (int(c) for c in download(self._totals))
        n_ee = n_all - n_pt
        cap_pt, cap_ee = self.capacity
        if n_pt > cap_pt:  # grow (the arrays change size, the kernels do not recompile)
            self._alloc_pairs("pt", _next_pow2(n_pt + n_pt // 2))
        if n_ee > cap_ee:
            self._alloc_pairs("ee", _next_pow2(n_ee + n_ee // 2))
        if n_all and not copied:
            _query_pairs(*args, 1, n_pt, self.pt, self.ee, self._query_blocks, self._totals)  # write
        t2 = time.perf_counter()
        self.n_pt, self.n_ee = n_pt, n_ee
        self.last_timings = {"build": t1 - t0, "query": t2 - t1}
        return n_pt, n_ee

    def pairs_numpy(self) -> tuple[np.ndarray, np.ndarray]:
        """The current pairs as (n_pt, 4) and (n_ee, 4) int arrays (copies; for tests and tools)."""
        return download(self.pt)[: self.n_pt], download(self.ee)[: self.n_ee]
