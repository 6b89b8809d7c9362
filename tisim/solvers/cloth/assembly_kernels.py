"""Taichi kernels that turn batches of local contact Hessians into compact COO triplets
over the system's unknowns, on the device.

Local Hessians: ``H`` (k, 12, 12) on ``stencils`` (k,) Vector(4, i32) (-1 for an unused
slot), rows ordered (local vertex, coordinate). ``sysvert`` (n,) i32 maps a vertex to its
index among the unknowns of the Newton system, -1 for a vertex that is not one (a static
obstacle, a handle that has reached its target).

``zero_fixed`` clears the rows and columns of non-unknowns, so that a PSD projection that
follows projects the Hessian restricted to the unknowns (what Newton uses), which is both
cheaper (the Jacobi sweeps skip zero rows) and closer to it than a projection of the full
12 x 12 block followed by dropping rows. ``count_entries`` and ``emit_coo`` write the
entries over unknowns as (row, column, value) at per-pair offsets from a prefix sum:
deterministic order, no atomics, and only what the host needs crosses to it. Every entry
of a block between two unknowns is written, zeros included, so that the system's pattern
depends on the pairs, not on their values (the linear solver's analysis is reused).

This module has no ``from __future__ import annotations``: Taichi reads the kernels' type
annotations when they are decorated.
"""

import taichi as ti


@ti.kernel
def zero_fixed(H: ti.types.ndarray(), stencils: ti.types.ndarray(), rows: ti.i32, sysvert: ti.types.ndarray()):
    for k in range(rows):
        for a in range(4):
            v = stencils[k][a]
            if v >= 0:
                if sysvert[v] < 0:
                    for i in range(3):
                        for j in range(12):
                            H[k, 3 * a + i, j] = 0.0
                            H[k, j, 3 * a + i] = 0.0


@ti.kernel
def count_entries(stencils: ti.types.ndarray(), rows: ti.i32, sysvert: ti.types.ndarray(), counts: ti.types.ndarray()):
    """counts[k] = entries emit_coo writes for pair k: 9 per block between two unknowns."""
    for k in range(rows):
        u = 0
        for a in range(4):
            va = stencils[k][a]
            if va >= 0:
                if sysvert[va] >= 0:
                    u += 1
        counts[k] = 9 * u * u


@ti.kernel
def emit_coo(
    H: ti.types.ndarray(), stencils: ti.types.ndarray(), rows: ti.i32, sysvert: ti.types.ndarray(),
    offsets: ti.types.ndarray(), r: ti.types.ndarray(), c: ti.types.ndarray(), v: ti.types.ndarray(),
):
    for k in range(rows):
        o = offsets[k]
        for a in range(4):
            va = stencils[k][a]
            if va >= 0:
                sa = sysvert[va]
                if sa >= 0:
                    for b in range(4):
                        vb = stencils[k][b]
                        if vb >= 0:
                            sb = sysvert[vb]
                            if sb >= 0:
                                for i in range(3):
                                    for j in range(3):
                                        r[o] = 3 * sa + i
                                        c[o] = 3 * sb + j
                                        v[o] = H[k, 3 * a + i, 3 * b + j]
                                        o += 1
