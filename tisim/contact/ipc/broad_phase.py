"""Broad phase: point-triangle and edge-edge candidate pairs from a spatial hash, in Taichi.

Each primitive (vertex, edge, face) gets an axis-aligned box over its vertices at x
(and at x + alpha dx for the swept boxes of CCD), grown by inflation / 2 on every
side, so two boxes overlap whenever the primitives' distance is below ``inflation``
(the solver passes dhat + thickness, the barrier's activation distance).

Faces and edges are inserted into a uniform grid (cell size from the mean box size),
stored as a hash table: each box's cell count, an exclusive scan of the counts, each
box lists its (box, cell) entries at its offset, then one thread per entry counts the
entries per hash bucket (atomics), an exclusive scan over the buckets, and one thread
per entry scatters it with a per-bucket atomic cursor. Then every surface vertex
queries the faces and every edge with an active vertex queries the edges with a larger
index in the cells its box covers (the edges are kept with the active ones first, so an
inactive edge has no partner of larger index to look for, and a static obstacle's
thousands of edges near the cloth cost an insertion but no query), in two passes: count
each query's pairs, scan the counts, enumerate again and write each pair at its query's
offset plus its rank. A pair is reported
only from the one cell that holds the lower corner of the two boxes' intersection, so
each unordered pair appears once without a global de-duplication, and only when the
boxes really overlap (hash collisions cost time, never pairs).

No atomic operation sits inside a loop whose trip count differs between threads:
Taichi 1.7.4's SPIR-V code (Vulkan; seen with Mesa's lavapipe) loses some of those
updates (``tools/spirv_loop_atomics.py``), which lost contact pairs there. Atomics run
one per thread in flat loops; per-box and per-query loops only count and store.

The output is deterministic, bit for bit, whatever the thread scheduling: the mean box
size is summed in fixed blocks (not with float atomics), each hash bucket's entries are
sorted after the scatter (so every query enumerates its candidates in a fixed order),
and each pair's row is its query's offset plus its rank. Rows come out grouped by query
primitive (points in increasing order, then the edges with an active vertex in input
order).

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
with huge (swept) boxes enlarge the cells (at most ``MAX_CELLS_PER_AXIS`` cells per
axis for the largest box), which makes the query slower but never incomplete.
"""

import logging
import time

import numpy as np
import taichi as ti

from tisim import backend
from tisim.backend import download, upload

log = logging.getLogger(__name__)

CELL_SCALE = 2.0  # cell size / mean box size (the largest side of each face and edge box)
MAX_CELLS_PER_AXIS = 16  # the largest box spans at most this many cells per axis
_SCAN_BLOCK = 256  # buckets summed per thread in the prefix sum's first pass
# a power of two: block counts are taken with a shift, because an integer floor division
# in a kernel's serial part is not supported by Taichi's SPIR-V (Vulkan) code generator
_SCAN_SHIFT = 8
assert _SCAN_BLOCK == 1 << _SCAN_SHIFT
_MAX_GRID_CELLS = 1 << 20  # cells per axis over the whole domain (keeps i32 cell ids safe)


@ti.func
def _cell_of(p, origin, inv_cell):
    """Integer grid cell of point p. The same (monotone) formula everywhere, so the cell of
    a point inside a box lies within the box's cell range."""
    return ti.cast(ti.floor((p - origin) * inv_cell), ti.i32)


@ti.func
def _hash(cx, cy, cz, mask):
    # unsigned arithmetic: the products wrap instead of overflowing a signed int
    h = (
        (ti.cast(cx, ti.u32) * ti.u32(73856093))
        ^ (ti.cast(cy, ti.u32) * ti.u32(19349663))
        ^ (ti.cast(cz, ti.u32) * ti.u32(83492791))
    )
    return ti.cast(h & ti.cast(mask, ti.u32), ti.i32)


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


@ti.kernel
def _compute_boxes(
    X: ti.types.ndarray(),
    DX: ti.types.ndarray(),
    alpha: float,
    pad: float,
    faces: ti.types.ndarray(),
    edges: ti.types.ndarray(),
    n: ti.i32,
    nf: ti.i32,
    ne: ti.i32,
    active: ti.types.ndarray(),
    lo: ti.types.ndarray(),
    hi: ti.types.ndarray(),
    relevant: ti.types.ndarray(),
    ext: ti.types.ndarray(),
    block_sums: ti.types.ndarray(),
    box_blocks: ti.types.ndarray(),
    stats: ti.types.ndarray(),
):
    """Boxes of vertices [0, n), faces [n, n + nf), edges [n + nf, n + nf + ne).

    X, DX: (>= n,) vec3 positions and step; ext: (>= nf + ne,) the largest side of each
    face and edge box; block_sums: (>= ceil((nf + ne) / _SCAN_BLOCK),) and box_blocks:
    (>= ceil((n + nf + ne) / _SCAN_BLOCK), 13) scratch.
    stats: [sum of the primitives' largest box side, largest side, domain min (3),
    domain max (3), active domain min (3), active domain max (3)]. The sum is taken in
    fixed blocks (deterministic rounding). The active domain bounds every box of a
    vertex, face or edge with an active vertex; relevant[b] = 1 for such a box and for
    every box that meets the active domain, 0 otherwise: a box of obstacle vertices
    only that lies outside it can be in no pair (a pair needs an active primitive and
    overlapping boxes), so it is neither inserted nor queried.
    """
    for v in range(n):
        a = X[v]
        b = a + alpha * DX[v]
        lo[v] = ti.min(a, b) - pad
        hi[v] = ti.max(a, b) + pad
        relevant[v] = active[v]
    for i in range(nf + ne):
        l = ti.Vector([0.0, 0.0, 0.0])  # noqa: E741
        h = ti.Vector([0.0, 0.0, 0.0])
        act = 0
        if i < nf:
            f0, f1, f2 = faces[i, 0], faces[i, 1], faces[i, 2]
            l = ti.min(lo[f0], lo[f1], lo[f2])
            h = ti.max(hi[f0], hi[f1], hi[f2])
            act = active[f0] + active[f1] + active[f2]
        else:
            e0, e1 = edges[i - nf, 0], edges[i - nf, 1]
            l = ti.min(lo[e0], lo[e1])
            h = ti.max(hi[e0], hi[e1])
            act = active[e0] + active[e1]
        lo[n + i] = l
        hi[n + i] = h
        relevant[n + i] = 1 if act > 0 else 0
        ext[i] = (h - l).max()
    # Bounds in blocks, then over the blocks in one thread: min and max are exact in any
    # order, and no thread waits on an atomic that every other thread also updates (the
    # atomic form cost 5 of a detection's 17 ms with a 64 x 64 sheet and a sphere).
    # Columns: domain min (3), max (3) over the vertex boxes (the face and edge boxes are
    # their unions), active-domain min (3), max (3) over the boxes flagged relevant so far
    # (an active vertex, or a primitive with one), largest primitive box side.
    n_boxes = n + nf + ne
    n_box_blocks = (n_boxes + _SCAN_BLOCK - 1) >> _SCAN_SHIFT
    for b in range(n_box_blocks):
        inf3 = ti.Vector([ti.math.inf, ti.math.inf, ti.math.inf])
        dmin, dmax, amin, amax = inf3, -inf3, inf3, -inf3
        emax = 0.0
        for j in range(b * _SCAN_BLOCK, ti.min((b + 1) * _SCAN_BLOCK, n_boxes)):
            if j < n:
                dmin = ti.min(dmin, lo[j])
                dmax = ti.max(dmax, hi[j])
            else:
                emax = ti.max(emax, ext[j - n])
            if relevant[j] != 0:
                amin = ti.min(amin, lo[j])
                amax = ti.max(amax, hi[j])
        for k in ti.static(range(3)):
            box_blocks[b, k] = dmin[k]
            box_blocks[b, 3 + k] = dmax[k]
            box_blocks[b, 6 + k] = amin[k]
            box_blocks[b, 9 + k] = amax[k]
        box_blocks[b, 12] = emax
    ti.loop_config(serialize=True)
    for _ in range(1):  # locals, not in-place updates of stats (see _scan_buckets)
        inf3 = ti.Vector([ti.math.inf, ti.math.inf, ti.math.inf])
        dmin, dmax, amin, amax = inf3, -inf3, inf3, -inf3
        emax = 0.0
        for b in range(n_box_blocks):
            for k in ti.static(range(3)):
                dmin[k] = ti.min(dmin[k], box_blocks[b, k])
                dmax[k] = ti.max(dmax[k], box_blocks[b, 3 + k])
                amin[k] = ti.min(amin[k], box_blocks[b, 6 + k])
                amax[k] = ti.max(amax[k], box_blocks[b, 9 + k])
            emax = ti.max(emax, box_blocks[b, 12])
        stats[1] = emax
        for k in ti.static(range(3)):
            stats[2 + k] = dmin[k]
            stats[5 + k] = dmax[k]
            stats[8 + k] = amin[k]
            stats[11 + k] = amax[k]
    for b in range(n + nf + ne):
        if relevant[b] == 0:
            dlo = ti.Vector([stats[8], stats[9], stats[10]])
            dhi = ti.Vector([stats[11], stats[12], stats[13]])
            if _overlap(lo[b], hi[b], dlo, dhi):
                relevant[b] = 1
    n_blocks = (nf + ne + _SCAN_BLOCK - 1) >> _SCAN_SHIFT
    for b in range(n_blocks):
        acc = 0.0
        for j in range(b * _SCAN_BLOCK, ti.min((b + 1) * _SCAN_BLOCK, nf + ne)):
            acc += ext[j]
        block_sums[b] = acc
    ti.loop_config(serialize=True)
    for _ in range(1):  # one thread sums the blocks in order (deterministic; SPIR-V has
        # no loop_config(serialize))
        acc = 0.0  # a local running sum (see _scan_buckets)
        for b in range(n_blocks):
            acc += block_sums[b]
        stats[0] = acc


@ti.kernel
def _box_cells(
    lo: ti.types.ndarray(),
    hi: ti.types.ndarray(),
    first: ti.i32,
    count: ti.i32,
    origin: ti.types.vector(3, float),
    inv_cell: float,
    relevant: ti.types.ndarray(),
    cells: ti.types.ndarray(),
    write: ti.i32,
    raw: ti.types.ndarray(),
):
    """The grid cells of boxes first .. first + count - 1, in two passes.

    write = 0: cells[i, 0] = number of cells box first + i covers (0 for a box that is
    not relevant). write = 1, after the exclusive scan of those counts into cells[:, 1]:
    raw[cells[i, 1] + j] = (box, cell x, y, z) for its j-th cell, plain stores at the
    box's offset (no atomics inside the per-box loop)."""
    for i in range(count):
        if relevant[first + i] != 0:
            c0 = _cell_of(lo[first + i], origin, inv_cell)
            c1 = _cell_of(hi[first + i], origin, inv_cell)
            if write == 0:
                span = c1 - c0 + 1
                cells[i, 0] = span[0] * span[1] * span[2]
            else:
                k = cells[i, 1]
                for cx, cy, cz in ti.ndrange((c0[0], c1[0] + 1), (c0[1], c1[1] + 1), (c0[2], c1[2] + 1)):
                    raw[k, 0] = first + i
                    raw[k, 1] = cx
                    raw[k, 2] = cy
                    raw[k, 3] = cz
                    k += 1
        elif write == 0:
            cells[i, 0] = 0


@ti.kernel
def _count_buckets(raw: ti.types.ndarray(), total: ti.i32, buckets: ti.types.ndarray()):
    """buckets[:, 0] = number of entries per hash bucket (one thread per entry)."""
    for j in range(buckets.shape[0]):
        buckets[j, 0] = 0
    mask = buckets.shape[0] - 1
    for e in range(total):
        ti.atomic_add(buckets[_hash(raw[e, 1], raw[e, 2], raw[e, 3], mask), 0], 1)


@ti.kernel
def _scan_buckets(buckets: ti.types.ndarray(), block_sums: ti.types.ndarray()):
    """Exclusive prefix sum buckets[:, 1] = scan(buckets[:, 0]): per-block sums in parallel,
    a serial scan over the (few) blocks, then a parallel add of the block offsets."""
    n = buckets.shape[0]
    n_blocks = (n + _SCAN_BLOCK - 1) >> _SCAN_SHIFT
    for b in range(n_blocks):
        acc = 0
        for j in range(b * _SCAN_BLOCK, ti.min((b + 1) * _SCAN_BLOCK, n)):
            buckets[j, 1] = acc
            acc += buckets[j, 0]
        block_sums[b] = acc
    ti.loop_config(serialize=True)
    for _ in range(1):  # one thread runs the loop inside serially (loop_config(serialize)
        # is not supported by the SPIR-V backends): block b's offset needs blocks < b.
        # The running sum is a local: the in-place form (block_sums[b] += block_sums[b - 1])
        # gave wrong offsets from the fifth block on under Vulkan (lavapipe)
        acc = 0
        for b in range(n_blocks):
            acc += block_sums[b]
            block_sums[b] = acc
    for j in range(n):
        b = j // _SCAN_BLOCK
        if b > 0:
            buckets[j, 1] += block_sums[b - 1]
        buckets[j, 2] = 0  # the fill cursor


@ti.kernel
def _scan_total(a: ti.types.ndarray(), upto: ti.i32, out: ti.types.ndarray()):
    """out[0] = sum of a[:upto, 0] and out[1] = sum of a[:, 0], from the scan in a[:, 1]."""
    ti.loop_config(serialize=True)
    for _ in range(1):
        m = a.shape[0]
        out[0] = a[m - 1, 1] + a[m - 1, 0]
        if upto < m:
            out[0] = a[upto, 1]
        out[1] = a[m - 1, 1] + a[m - 1, 0]


@ti.kernel
def _fill_entries(
    raw: ti.types.ndarray(), total: ti.i32, buckets: ti.types.ndarray(), entries: ti.types.ndarray()
):
    """Scatter the entries into their buckets (one thread per entry, atomic cursors; the
    order within a bucket is fixed afterwards by ``_sort_buckets``)."""
    mask = buckets.shape[0] - 1
    for e in range(total):
        h = _hash(raw[e, 1], raw[e, 2], raw[e, 3], mask)
        k = buckets[h, 1] + ti.atomic_add(buckets[h, 2], 1)
        for c in ti.static(range(4)):
            entries[k, c] = raw[e, c]


@ti.func
def _entry_less(entries: ti.template(), a, b):
    """Lexicographic order of the entry rows a and b (box, cell x, y, z)."""
    less = False
    decided = False
    for c in ti.static(range(4)):
        if not decided and entries[a, c] != entries[b, c]:
            less = entries[a, c] < entries[b, c]
            decided = True
    return less


@ti.kernel
def _sort_buckets(buckets: ti.types.ndarray(), entries: ti.types.ndarray()):
    """Insertion-sort each bucket's entries (a few rows each), so that the order of the
    candidates a query visits does not depend on the scatter's atomic cursors."""
    for h in range(buckets.shape[0]):
        start = buckets[h, 1]
        end = start + buckets[h, 0]
        for k in range(start + 1, end):
            j = k
            # (no `and` in the condition: Taichi's operators do not short-circuit)
            while j > start:
                if not _entry_less(entries, j, j - 1):
                    break
                for c in ti.static(range(4)):
                    tmp = entries[j, c]
                    entries[j, c] = entries[j - 1, c]
                    entries[j - 1, c] = tmp
                j -= 1


@ti.kernel
def _query_pairs(
    lo: ti.types.ndarray(),
    hi: ti.types.ndarray(),
    points: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    edges: ti.types.ndarray(),
    active: ti.types.ndarray(),
    relevant: ti.types.ndarray(),
    n: ti.i32,
    n_points: ti.i32,
    nf: ti.i32,
    ne: ti.i32,
    n_qe: ti.i32,
    origin: ti.types.vector(3, float),
    inv_cell: float,
    buckets: ti.types.ndarray(),
    entries: ti.types.ndarray(),
    query_counts: ti.types.ndarray(),
    found: ti.types.ndarray(),
    cap: ti.i32,
    write: ti.i32,
    ee_base: ti.i32,
    pt: ti.types.ndarray(),
    ee: ti.types.ndarray(),
):
    """Points against faces, edges against edges of larger index, in two passes.

    write = 0: query_counts[i, 0] = number of pairs of query primitive i (points
    [0, n_points), then the first n_qe edges: those with an active vertex). write = 1, after the exclusive scan of those counts into
    query_counts[:, 1]: the pairs are written, a point's at pt[start(i) + rank], an
    edge's at ee[start(i) - ee_base + rank], where ee_base = start(n_points). Each
    thread enumerates its candidates in a fixed order and writes with plain stores: no
    atomics (Taichi's SPIR-V code loses atomic updates made inside run-time loops) and
    the same rows, in the same order, on every backend and run.

    found (queries, >= cap): the counting pass keeps a query's first ``cap`` partners
    (primitive indices, in enumeration order) there, and the writing pass copies them
    instead of traversing the grid again; only queries with more partners traverse twice.
    """
    mask = buckets.shape[0] - 1
    for i in range(n_points + n_qe):
        is_point = i < n_points
        rank = 0
        v = 0
        ea0 = 0
        ea1 = 0
        box = 0
        if is_point:
            v = points[i]
            box = v
        else:
            ea0 = edges[i - n_points, 0]
            ea1 = edges[i - n_points, 1]
            box = n + nf + (i - n_points)
        lo_a = lo[box]
        hi_a = hi[box]
        c0 = _cell_of(lo_a, origin, inv_cell)
        c1 = _cell_of(hi_a, origin, inv_cell)
        if relevant[box] == 0 or (write != 0 and query_counts[i, 0] <= cap):
            c1 = c0 - 1  # an empty range: this box is in no pair (or, writing, counted none)
        if write != 0 and query_counts[i, 0] <= cap:  # the partners kept by the counting pass
            for r in range(query_counts[i, 0]):
                other = found[i, r]
                if is_point:
                    pt[query_counts[i, 1] + r] = ti.Vector(
                        [v, faces[other - n, 0], faces[other - n, 1], faces[other - n, 2]])
                else:
                    ee[query_counts[i, 1] - ee_base + r] = ti.Vector(
                        [ea0, ea1, edges[other - n - nf, 0], edges[other - n - nf, 1]])
        for cx, cy, cz in ti.ndrange((c0[0], c1[0] + 1), (c0[1], c1[1] + 1), (c0[2], c1[2] + 1)):
            h = _hash(cx, cy, cz, mask)
            for k in range(buckets[h, 1], buckets[h, 1] + buckets[h, 0]):
                other = entries[k, 0]
                # the entry must be this cell (not a hash collision) and of the right kind
                same_cell = entries[k, 1] == cx and entries[k, 2] == cy and entries[k, 3] == cz
                if not same_cell:
                    continue
                if is_point:
                    if other >= n + nf:
                        continue  # an edge
                    f0, f1, f2 = faces[other - n, 0], faces[other - n, 1], faces[other - n, 2]
                    if v == f0 or v == f1 or v == f2:
                        continue
                    if active[v] + active[f0] + active[f1] + active[f2] == 0:
                        continue  # obstacle-obstacle
                    lo_b = lo[other]
                    hi_b = hi[other]
                    if not _overlap(lo_a, hi_a, lo_b, hi_b):
                        continue
                    corner = _cell_of(ti.max(lo_a, lo_b), origin, inv_cell)
                    if corner[0] != cx or corner[1] != cy or corner[2] != cz:
                        continue  # reported from another cell
                    if write != 0:
                        pt[query_counts[i, 1] + rank] = ti.Vector([v, f0, f1, f2])
                    elif rank < cap:
                        found[i, rank] = other
                    rank += 1
                else:
                    if other <= box:
                        continue  # a face, or an edge of smaller or equal index
                    eb0 = edges[other - n - nf, 0]
                    eb1 = edges[other - n - nf, 1]
                    if ea0 == eb0 or ea0 == eb1 or ea1 == eb0 or ea1 == eb1:
                        continue
                    if active[ea0] + active[ea1] + active[eb0] + active[eb1] == 0:
                        continue
                    lo_b = lo[other]
                    hi_b = hi[other]
                    if not _overlap(lo_a, hi_a, lo_b, hi_b):
                        continue
                    corner = _cell_of(ti.max(lo_a, lo_b), origin, inv_cell)
                    if corner[0] != cx or corner[1] != cy or corner[2] != cz:
                        continue
                    if write != 0:
                        ee[query_counts[i, 1] - ee_base + rank] = ti.Vector([ea0, ea1, eb0, eb1])
                    elif rank < cap:
                        found[i, rank] = other
                    rank += 1
        if write == 0:
            query_counts[i, 0] = rank


# partners per query kept between the two passes of _query_pairs (a cloth vertex near a
# tessellated sphere has a few; deep in a fold, dozens: those traverse the grid twice)
FOUND_KEPT = 16


def _next_pow2(k: int) -> int:
    return 1 << max(0, int(k - 1).bit_length())


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
    (seconds) of the last call.

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
        # the edges with an active vertex first (stable): an inactive edge then has no
        # partner of larger index, so only the first n_qe edges query
        edge_active = vertex_active[edges].any(axis=1) if len(edges) else np.zeros(0, bool)
        edges = np.concatenate([edges[edge_active], edges[~edge_active]])
        self._n_qe = int(edge_active.sum())

        self.vertex_count = n
        self.face_count = len(faces)
        self.edge_count = len(edges)
        self.point_count = len(points)
        real = backend.real()

        def int_array(data: np.ndarray, shape: tuple[int, ...]):
            # Taichi arrays cannot be empty: keep one unused row for empty inputs
            shape = (max(1, shape[0]),) + shape[1:]
            a = ti.ndarray(ti.i32, shape=shape)
            buf = np.zeros(shape, dtype=np.int32)
            buf[: len(data)] = data
            upload(a, buf)
            return a

        self._faces = int_array(faces, (len(faces), 3))
        self._edges = int_array(edges, (len(edges), 2))
        self._points = int_array(points, (len(points),))
        self._active = int_array(vertex_active.astype(np.int32), (n,))
        n_prims = self.face_count + self.edge_count
        n_boxes = n + n_prims
        self._lo = ti.Vector.ndarray(3, real, max(1, n_boxes))
        self._hi = ti.Vector.ndarray(3, real, max(1, n_boxes))
        self._relevant = ti.ndarray(ti.i32, max(1, n_boxes))
        self._ext = ti.ndarray(real, max(1, n_prims))
        self._ext_blocks = ti.ndarray(real, max(1, (n_prims + _SCAN_BLOCK - 1) // _SCAN_BLOCK))
        self._box_blocks = ti.ndarray(real, shape=(max(1, (n_boxes + _SCAN_BLOCK - 1) // _SCAN_BLOCK), 13))
        self._stats = ti.ndarray(real, 14)
        # Hash table: about 2 buckets per inserted primitive (collisions only cost time);
        # columns (count, start, fill cursor).
        n_buckets = max(1024, _next_pow2(2 * n_prims))
        self._buckets = ti.ndarray(ti.i32, shape=(n_buckets, 3))
        self._block_sums = ti.ndarray(ti.i32, (n_buckets + _SCAN_BLOCK - 1) // _SCAN_BLOCK)
        # per face and edge: (cells covered, first of its raw entries, unused)
        self._cells = ti.ndarray(ti.i32, shape=(max(1, n_prims), 3))
        self._cell_blocks = ti.ndarray(ti.i32, (max(1, n_prims) + _SCAN_BLOCK - 1) // _SCAN_BLOCK)
        self._raw = ti.ndarray(ti.i32, shape=(max(1024, 4 * n_prims), 4))
        self._entries = ti.ndarray(ti.i32, shape=(max(1024, 4 * n_prims), 4))
        self._totals = ti.ndarray(ti.i32, 2)
        # per query primitive (points, then active edges): (pair count, start, unused)
        n_queries = max(1, self.point_count + self._n_qe)
        self._query_counts = ti.ndarray(ti.i32, shape=(n_queries, 3))
        # each query's first FOUND_KEPT partners, kept by the counting pass for the writing one
        self._kept = int(FOUND_KEPT)
        self._found = ti.ndarray(ti.i32, shape=(n_queries, max(self._kept, 1)))
        self._query_blocks = ti.ndarray(ti.i32, (n_queries + _SCAN_BLOCK - 1) // _SCAN_BLOCK)
        cap = int(initial_capacity)
        self._alloc_pairs("pt", cap)
        self._alloc_pairs("ee", cap)
        self.n_pt = 0
        self.n_ee = 0
        self.cell_size = 0.0
        self.last_timings: dict[str, float] = {}

    def _alloc_pairs(self, kind: str, cap: int) -> None:
        """(Re)allocate the rows of kind pt/ee."""
        setattr(self, kind, ti.Vector.ndarray(4, ti.i32, cap))

    @property
    def capacity(self) -> tuple[int, int]:
        """Rows of the (pt, ee) buffers."""
        return self.pt.shape[0], self.ee.shape[0]

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
        n, nf, ne = self.vertex_count, self.face_count, self.edge_count
        for name, a in (("x", x), ("dx", dx)):
            if a is not None and (len(a.shape) != 1 or a.shape[0] < n):
                raise ValueError(
                    f"{name} must be a ti.Vector.ndarray(3, real, n) with n >= {n}, "
                    f"got shape {tuple(a.shape)}"
                )
        t0 = time.perf_counter()
        if dx is None:
            dx, alpha = x, 0.0  # the same compiled kernels, with zero sweep
        n_prims = nf + ne
        _compute_boxes(
            x, dx, float(alpha), 0.5 * float(inflation), self._faces, self._edges,
            n, nf, ne, self._active, self._lo, self._hi, self._relevant, self._ext, self._ext_blocks,
            self._box_blocks, self._stats,
        )  # fmt: skip
        self.n_pt = self.n_ee = 0
        if n_prims == 0 or self.point_count == 0:
            return 0, 0
        st = download(self._stats)
        if not np.all(np.isfinite(st[:8])):
            raise FloatingPointError("broad phase: non-finite positions")
        if not st[8] <= st[11]:
            return 0, 0  # no active vertex: no pair
        mean_ext, max_ext = st[0] / n_prims, st[1]
        domain = float(np.max(st[5:8] - st[2:5]))
        cell = max(CELL_SCALE * mean_ext, max_ext / MAX_CELLS_PER_AXIS, domain / _MAX_GRID_CELLS, 1e-12)
        self.cell_size = cell
        origin = ti.Vector([float(c) for c in st[2:5]])
        inv_cell = 1.0 / cell

        cell_args = (self._lo, self._hi, n, n_prims, origin, inv_cell, self._relevant, self._cells)
        _box_cells(*cell_args, 0, self._raw)  # count
        _scan_buckets(self._cells, self._cell_blocks)
        _scan_total(self._cells, n_prims, self._totals)
        total = int(download(self._totals)[0])
        if total > self._entries.shape[0]:
            self._raw = ti.ndarray(ti.i32, shape=(_next_pow2(total), 4))
            self._entries = ti.ndarray(ti.i32, shape=(_next_pow2(total), 4))
        _box_cells(*cell_args, 1, self._raw)  # list
        _count_buckets(self._raw, total, self._buckets)
        _scan_buckets(self._buckets, self._block_sums)
        _fill_entries(self._raw, total, self._buckets, self._entries)
        _sort_buckets(self._buckets, self._entries)
        t1 = time.perf_counter()
        args = (
            self._lo, self._hi, self._points, self._faces, self._edges, self._active, self._relevant,
            n, self.point_count, nf, ne, self._n_qe, origin, inv_cell, self._buckets, self._entries,
            self._query_counts, self._found, self._kept,
        )  # fmt: skip
        _query_pairs(*args, 0, 0, self.pt, self.ee)  # count
        _scan_buckets(self._query_counts, self._query_blocks)
        _scan_total(self._query_counts, self.point_count, self._totals)
        n_pt, n_all = (int(c) for c in download(self._totals))
        n_ee = n_all - n_pt
        cap_pt, cap_ee = self.capacity
        if n_pt > cap_pt:  # grow (the arrays change size, the kernels do not recompile)
            self._alloc_pairs("pt", _next_pow2(n_pt + n_pt // 2))
        if n_ee > cap_ee:
            self._alloc_pairs("ee", _next_pow2(n_ee + n_ee // 2))
        if n_all:
            _query_pairs(*args, 1, n_pt, self.pt, self.ee)  # write
        t2 = time.perf_counter()
        self.n_pt, self.n_ee = n_pt, n_ee
        self.last_timings = {"build": t1 - t0, "query": t2 - t1}
        return n_pt, n_ee

    def pairs_numpy(self) -> tuple[np.ndarray, np.ndarray]:
        """The current pairs as (n_pt, 4) and (n_ee, 4) int arrays (copies; for tests and tools)."""
        return download(self.pt)[: self.n_pt], download(self.ee)[: self.n_ee]
