"""The broad phase's uniform hash grid, in Taichi: cells of points, the hash, and the
build of one grid (:class:`_Grid`), in two kernels (see
:mod:`tisim.contact.ipc.broad_phase` for how the grids are used and queried).

A grid is built in passes: each box's cell count, an exclusive scan of the counts, each
box lists its (box, cell) entries at its offset, then one thread per entry counts the
entries per hash bucket (atomics), an exclusive scan over the buckets, one thread per
entry scatters it with a per-bucket atomic cursor, and each bucket's entries are sorted
(so every query enumerates its candidates in a fixed order). The passes before the host
needs a number (the entries' total, to size the arrays) run in one kernel, the rest in a
second: one top-level loop each, in order, as separate kernels ran them (a kernel's
top-level loops, those of the ``ti.func``s it calls at its top level included, run one
after the other), for two launches instead of eight.

No atomic operation sits inside a loop whose trip count differs between threads (see
the broad phase's module docstring), and serial parts are loops of one trip under
``ti.loop_config(serialize=True)``.

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import numpy as np
import taichi as ti

from tisim.backend import download

CELL_SCALE = 2.0  # cell size / mean box size (the largest side of each inserted box)
MAX_CELLS_PER_AXIS = 16  # the largest box spans at most this many cells per axis
_SCAN_BLOCK = 256  # buckets summed per thread in the prefix sum's first pass
# a power of two: block counts are taken with a shift, because an integer floor division
# in a kernel's serial part is not supported by Taichi's SPIR-V (Vulkan) code generator
_SCAN_SHIFT = 8
assert _SCAN_BLOCK == 1 << _SCAN_SHIFT
_MAX_GRID_CELLS = 1 << 20  # cells per axis over the whole domain (keeps i32 cell ids safe)


def _next_pow2(k: int) -> int:
    return 1 << max(0, int(k - 1).bit_length())


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
def scan(a: ti.template(), block_sums: ti.template(), n):
    """Exclusive prefix sum a[:n, 1] = scan(a[:n, 0]), and a[:n, 2] = 0 (a fill cursor):
    per-block sums in parallel, a serial scan over the (few) blocks, then a parallel add
    of the block offsets. n = 0 does nothing (a pass that needs no scan)."""
    n_blocks = (n + _SCAN_BLOCK - 1) >> _SCAN_SHIFT
    for b in range(n_blocks):
        acc = 0
        for j in range(b * _SCAN_BLOCK, ti.min((b + 1) * _SCAN_BLOCK, n)):
            a[j, 1] = acc
            acc += a[j, 0]
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
            a[j, 1] += block_sums[b - 1]
        a[j, 2] = 0


@ti.func
def scan_total(a: ti.template(), upto, out: ti.template(), on):
    """out[0] = sum of a[:upto, 0] and out[1] = sum of a[:, 0], from the scan in a[:, 1]
    (on = 0: nothing)."""
    ti.loop_config(serialize=True)
    for _ in range(on):
        m = a.shape[0]
        out[0] = a[m - 1, 1] + a[m - 1, 0]
        if upto < m:
            out[0] = a[upto, 1]
        out[1] = a[m - 1, 1] + a[m - 1, 0]


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
def _grid_count(
    lo: ti.types.ndarray(),
    hi: ti.types.ndarray(),
    inserted: ti.types.ndarray(),
    count: ti.i32,
    origin: ti.types.vector(3, float),
    inv_cell: float,
    cells: ti.types.ndarray(),
    cell_blocks: ti.types.ndarray(),
    totals: ti.types.ndarray(),
):
    """cells[i, 0] = the number of grid cells box inserted[i] covers (i < count), their
    exclusive scan into cells[:, 1], and totals[0] = their sum."""
    for i in range(count):
        b = inserted[i]
        span = _cell_of(hi[b], origin, inv_cell) - _cell_of(lo[b], origin, inv_cell) + 1
        cells[i, 0] = span[0] * span[1] * span[2]
    scan(cells, cell_blocks, cells.shape[0])
    scan_total(cells, count, totals, 1)


@ti.kernel
def _grid_fill(
    lo: ti.types.ndarray(),
    hi: ti.types.ndarray(),
    inserted: ti.types.ndarray(),
    count: ti.i32,
    origin: ti.types.vector(3, float),
    inv_cell: float,
    cells: ti.types.ndarray(),
    raw: ti.types.ndarray(),
    total: ti.i32,
    buckets: ti.types.ndarray(),
    block_sums: ti.types.ndarray(),
    entries: ti.types.ndarray(),
    first_edge: ti.i32,
):
    """After ``_grid_count``: the (box, cell x, y, z) entries listed, counted per hash
    bucket, scanned, scattered into the buckets and sorted there.

    raw[cells[i, 1] + j] = (box, cell) of box inserted[i]'s j-th cell (plain stores at the
    box's offset: no atomics inside the per-box loop); buckets[:, 0] = entries per bucket
    (one thread per entry, atomics), buckets[:, 1] their exclusive scan; each entry
    scattered into its bucket with an atomic cursor, then each bucket insertion-sorted
    (a few rows each), so that the order of the candidates a query visits does not depend
    on the cursors; finally buckets[h, 2] (the cursor, no longer needed) = the index of
    the bucket's first edge entry (box id >= first_edge): the faces come before it, so a
    point visits only [start, buckets[h, 2]) and an edge only [buckets[h, 2], end)."""
    for i in range(count):
        b = inserted[i]
        c0 = _cell_of(lo[b], origin, inv_cell)
        c1 = _cell_of(hi[b], origin, inv_cell)
        k = cells[i, 1]
        for cx, cy, cz in ti.ndrange((c0[0], c1[0] + 1), (c0[1], c1[1] + 1), (c0[2], c1[2] + 1)):
            raw[k, 0] = b
            raw[k, 1] = cx
            raw[k, 2] = cy
            raw[k, 3] = cz
            k += 1
    for j in range(buckets.shape[0]):
        buckets[j, 0] = 0
    mask = buckets.shape[0] - 1
    for e in range(total):
        ti.atomic_add(buckets[_hash(raw[e, 1], raw[e, 2], raw[e, 3], mask), 0], 1)
    scan(buckets, block_sums, buckets.shape[0])
    for e in range(total):
        h = _hash(raw[e, 1], raw[e, 2], raw[e, 3], mask)
        k = buckets[h, 1] + ti.atomic_add(buckets[h, 2], 1)
        for c in ti.static(range(4)):
            entries[k, c] = raw[e, c]
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
        split = end
        for k in range(start, end):
            if entries[k, 0] >= first_edge and split == end:
                split = k
        buckets[h, 2] = split


class _Grid:
    """One hash grid's storage and build (see the module docstring): ``build`` inserts
    the boxes ids[0 .. count - 1] of the shared lo / hi arrays."""

    def __init__(self, n_ins: int):
        n_ins = max(1, int(n_ins))
        # about 2 buckets per inserted box (collisions only cost time); columns (count,
        # start, fill cursor)
        n_buckets = max(1024, _next_pow2(2 * n_ins))
        self.buckets = ti.ndarray(ti.i32, shape=(n_buckets, 3))
        self._block_sums = ti.ndarray(ti.i32, (n_buckets + _SCAN_BLOCK - 1) // _SCAN_BLOCK)
        # per inserted box: (cells covered, first of its raw entries, unused)
        self._cells = ti.ndarray(ti.i32, shape=(n_ins, 3))
        self._cell_blocks = ti.ndarray(ti.i32, (n_ins + _SCAN_BLOCK - 1) // _SCAN_BLOCK)
        self._raw = ti.ndarray(ti.i32, shape=(max(1024, 4 * n_ins), 4))
        self.entries = ti.ndarray(ti.i32, shape=(max(1024, 4 * n_ins), 4))
        self._totals = ti.ndarray(ti.i32, 2)
        self.origin = ti.Vector([0.0, 0.0, 0.0])
        self.inv_cell = 1.0
        self.cell_size = 0.0

    def build(self, lo, hi, ids, count: int, stats: np.ndarray, first_edge: int) -> None:
        """Insert the count boxes listed in ids; stats: ``_prim_boxes``' statistics of
        those boxes (the cells' size follows their mean largest side); first_edge: the
        smallest edge box id (faces have smaller ids)."""
        mean_ext, max_ext = stats[0] / max(1, count), stats[1]
        domain = float(np.max(stats[5:8] - stats[2:5]))
        cell = max(CELL_SCALE * mean_ext, max_ext / MAX_CELLS_PER_AXIS, domain / _MAX_GRID_CELLS, 1e-12)
        self.cell_size = cell
        self.origin = ti.Vector([float(c) for c in stats[2:5]])
        self.inv_cell = 1.0 / cell
        args = (lo, hi, ids, count, self.origin, self.inv_cell, self._cells)
        _grid_count(*args, self._cell_blocks, self._totals)
        total = int(download(self._totals)[0])
        if total > self.entries.shape[0]:
            self._raw = ti.ndarray(ti.i32, shape=(_next_pow2(total), 4))
            self.entries = ti.ndarray(ti.i32, shape=(_next_pow2(total), 4))
        _grid_fill(*args, self._raw, total, self.buckets, self._block_sums, self.entries, first_edge)
