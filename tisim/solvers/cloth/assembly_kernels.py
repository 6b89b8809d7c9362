"""Taichi kernels that sum batches of local contact Hessians into the Newton system's CSR
values over the system's unknowns, on the device.

Local Hessians: ``H`` (k, 12, 12) on ``stencils`` (k,) Vector(4, i32) (-1 for an unused
slot), rows ordered (local vertex, coordinate). ``sysvert`` (n,) i32 maps a vertex to its
index among the unknowns of the Newton system, -1 for a vertex that is not one (a static
obstacle, a handle that has reached its target).

``scatter_pairs`` adds every entry between two unknowns into the value array of a CSR
pattern (canonical: sorted, unique column indices per row), found by a binary search in
its row; entries the pattern lacks are only counted per pair, and ``emit_outside`` writes
those as (row, column, value) triplets at per-pair offsets, for the host to merge into the
pattern. Every entry of a block between two unknowns counts, zeros included, so the
system's pattern depends on the pairs, not on their values (the linear solver's analysis
is reused). The sums run on one thread on the CPU backend (``backend.SERIAL_SUMS``: a
fixed order, the same bits in every run), with atomics elsewhere.

Every search is unrolled to a fixed number of halvings: no loop whose trip count differs
between threads encloses or precedes an atomic (Taichi 1.7.4's SPIR-V code loses updates
there, ``studies/spirv_loop_atomics.py``).

This module has no ``from __future__ import annotations``: Taichi reads the kernels' type
annotations when they are decorated.
"""

import taichi as ti

from tisim import backend

SEARCH_STEPS = 16  # halvings of a row search, unrolled: rows of up to 2**16 entries


@ti.func
def _row_position(indptr: ti.template(), indices: ti.template(), r, col):
    """The last position in CSR row r whose column is <= col (the row's start if none),
    by SEARCH_STEPS halvings, unrolled (rows of up to 2**SEARCH_STEPS entries)."""
    lo = indptr[r]
    n = indptr[r + 1] - lo
    for _ in ti.static(range(SEARCH_STEPS)):
        if n > 1:
            half = n >> 1
            if indices[lo + half] <= col:
                lo += half
            n -= half
    return lo


@ti.func
def _block_slots(indptr: ti.template(), indices: ti.template(), r, lo, col):
    """Slots of columns col, col + 1, col + 2 in CSR row r, -1 for those not found
    within j + 1 places after position lo (where col + j sits, when present, if lo is
    _row_position's answer; any lo in the row gives no false slot)."""
    end = indptr[r + 1]
    s = ti.Vector([-1, -1, -1])
    for j in ti.static(range(3)):
        for t in ti.static(range(j + 2)):
            q = lo + t
            if q < end:
                if indices[q] == col + j:
                    s[j] = q
    return s


@ti.func
def _block_row(indptr: ti.template(), indices: ti.template(), sa, i: ti.template(), lo0, col):
    """Slots of row 3 sa + i, columns col .. col + 2, from lo0 = the search's answer in
    row 3 sa: rows of one vertex share their columns in the elastic pattern (full 3 x 3
    blocks), so row i is first tried at lo0's offset, and searched when that misses."""
    r = 3 * sa + i
    s = ti.Vector([-1, -1, -1])
    if ti.static(i == 0):
        s = _block_slots(indptr, indices, r, lo0, col)
    else:
        s = _block_slots(indptr, indices, r, indptr[r] + lo0 - indptr[3 * sa], col)
        if s[0] < 0 or s[1] < 0 or s[2] < 0:
            s = _block_slots(indptr, indices, r, _row_position(indptr, indices, r, col), col)
    return s


@ti.func
def _unknown(stencils: ti.template(), sysvert: ti.template(), k, a):
    """The unknown (system vertex) of pair k's slot a, -1 for none."""
    u = -1
    va = stencils[k][a]
    if va >= 0:
        u = sysvert[va]
    return u


@ti.func
def _pair_entries(
    H: ti.template(),
    stencils: ti.template(),
    sysvert: ti.template(),
    indptr: ti.template(),
    indices: ti.template(),
    k,
    csr: ti.template(),
    r: ti.template(),
    c: ti.template(),
    v: ti.template(),
    o,
    emit: ti.template(),
):
    """Pair k's entries between unknowns: emit = False adds those the pattern holds into
    csr and returns how many it lacks; emit = True writes those it lacks as triplets at
    r, c, v[o], o + 1, ... and returns the next free position."""
    n = o
    for a in range(4):
        sa = _unknown(stencils, sysvert, k, a)
        if sa >= 0:
            for b in range(4):
                sb = _unknown(stencils, sysvert, k, b)
                if sb >= 0:
                    lo0 = _row_position(indptr, indices, 3 * sa, 3 * sb)
                    for i in ti.static(range(3)):
                        s = _block_row(indptr, indices, sa, i, lo0, 3 * sb)
                        for j in ti.static(range(3)):
                            if s[j] >= 0:
                                if ti.static(not emit):
                                    csr[s[j]] += H[k, 3 * a + i, 3 * b + j]
                            else:
                                if ti.static(emit):
                                    r[n] = 3 * sa + i
                                    c[n] = 3 * sb + j
                                    v[n] = H[k, 3 * a + i, 3 * b + j]
                                n += 1
    return n


@ti.kernel
def scatter_pairs(
    H: ti.types.ndarray(),
    stencils: ti.types.ndarray(),
    rows: ti.i32,
    sysvert: ti.types.ndarray(),
    indptr: ti.types.ndarray(),
    indices: ti.types.ndarray(),
    csr: ti.types.ndarray(),
    outside: ti.types.ndarray(),
):
    """csr[slot(3 sa + i, 3 sb + j)] += H[k, 3 a + i, 3 b + j] over the pairs' blocks between
    unknowns sa = sysvert[stencils[k][a]], sb = ...; outside[k] = entries of pair k that
    the pattern lacks (not added)."""
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for k in range(rows):
        outside[k] = _pair_entries(H, stencils, sysvert, indptr, indices, k, csr, csr, csr, csr, 0, False)


@ti.kernel
def scatter_two(
    H: ti.types.ndarray(),
    stencils: ti.types.ndarray(),
    rows: ti.i32,
    H2: ti.types.ndarray(),
    stencils2: ti.types.ndarray(),
    rows2: ti.i32,
    sysvert: ti.types.ndarray(),
    indptr: ti.types.ndarray(),
    indices: ti.types.ndarray(),
    csr: ti.types.ndarray(),
    outside: ti.types.ndarray(),
    outside2: ti.types.ndarray(),
):
    """``scatter_pairs`` of two batches, the first's pairs then the second's (the same
    additions in the same order as two launches), in one launch."""
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for k in range(rows):
        outside[k] = _pair_entries(H, stencils, sysvert, indptr, indices, k, csr, csr, csr, csr, 0, False)
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for k in range(rows2):
        outside2[k] = _pair_entries(H2, stencils2, sysvert, indptr, indices, k, csr, csr, csr, csr, 0, False)


@ti.kernel
def emit_outside(
    H: ti.types.ndarray(),
    stencils: ti.types.ndarray(),
    pairs: ti.types.ndarray(),
    count: ti.i32,
    sysvert: ti.types.ndarray(),
    indptr: ti.types.ndarray(),
    indices: ti.types.ndarray(),
    offsets: ti.types.ndarray(),
    r: ti.types.ndarray(),
    c: ti.types.ndarray(),
    v: ti.types.ndarray(),
):
    """The entries ``scatter_pairs`` counted as outside the pattern, of the pairs listed in
    ``pairs[:count]``, as triplets at ``offsets[q]`` (pair order, then block order)."""
    for q in range(count):
        _pair_entries(H, stencils, sysvert, indptr, indices, pairs[q], v, r, c, v, offsets[q], True)
