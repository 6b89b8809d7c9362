"""What the IPC potentials' kernels and classes share: loading a candidate pair and its
distance type, the edge-edge mollifier's eps_x from rest positions, and the growable
per-row Hessian arrays with their PSD projection. Conventions: :mod:`tisim.contact.ipc.potential`.

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import logging

import numpy as np
import taichi as ti

from tisim import backend
from tisim.backend import upload
from tisim.contact.ipc import distance as dist
from tisim.linalg.psd import PSDProjector

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------
# pair helpers shared by the kernels


@ti.func
def _load_pair(k, x: ti.template(), pt: ti.template(), n_pt, ee: ti.template()):
    """(is_ee, vertex indices (4), x0..x3) of row k (PT rows first, then EE rows)."""
    is_ee = k >= n_pt
    idx = ti.Vector([0, 0, 0, 0], ti.i32)
    if is_ee:
        idx = ee[k - n_pt]
    else:
        idx = pt[k]
    return is_ee, idx, x[idx[0]], x[idx[1]], x[idx[2]], x[idx[3]]


@ti.func
def _pair_type(is_ee, x0, x1, x2, x3):
    """(dtype, kind, blocks) of a pair (see distance.point_triangle_stencil)."""
    dtype = 0
    if is_ee:
        dtype = dist.edge_edge_distance_type(x0, x1, x2, x3)
    else:
        dtype = dist.point_triangle_distance_type(x0, x1, x2, x3)
    kind = dist.KIND_PP
    blk = ti.Vector([0, 0, 0, 0, 0, 0], ti.i32)
    if is_ee:
        kind, blk = dist.edge_edge_stencil(dtype)
    else:
        kind, blk = dist.point_triangle_stencil(dtype)
    return dtype, kind, blk


@ti.func
def _eps_x(rest: ti.template(), idx):
    return dist.edge_edge_mollifier_threshold(rest[idx[0]], rest[idx[1]], rest[idx[2]], rest[idx[3]])


@ti.func
def _masked(idx, mask):
    r = ti.Vector([-1, -1, -1, -1], ti.i32)
    for s in ti.static(range(4)):
        if mask[s] != 0:
            r[s] = idx[s]
    return r


# ---------------------------------------------------------------------------------
# per-row output arrays


def _rest_array(rest: np.ndarray | None, n: int):
    """(max(n, 1),) Vector ndarray of 3 holding the rest positions (zeros if None)."""

    arr = ti.Vector.ndarray(3, backend.real(), max(n, 1))
    if rest is not None and n:
        upload(arr, np.ascontiguousarray(rest, dtype=backend.np_real()))
    return arr


class _Rows:
    """Growable per-row output ndarrays: hessians (cap, 12, 12) and stencils (cap)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = 0
        self.hessians = None
        self.stencils = None
        self._psd: PSDProjector | None = None
        self.reserve(capacity)

    def reserve(self, rows: int) -> bool:
        """Make room for ``rows`` rows; True when the arrays were reallocated."""
        if rows <= self.capacity:
            return False

        cap = max(int(rows), 2 * self.capacity, 1)
        self.hessians = ti.ndarray(backend.real(), (cap, 12, 12))
        self.stencils = ti.Vector.ndarray(4, ti.i32, cap)
        self.capacity = cap
        self._on_grow(cap)
        log.debug("%s: room for %d pairs", type(self).__name__, cap)
        return True

    def _on_grow(self, cap: int) -> None:
        pass

    def _project(self, rows: int) -> None:
        if self._psd is None:
            self._psd = PSDProjector(12)
        self._psd.project(self.hessians, rows)

    def _compile_rows(self) -> None:
        if self._psd is None:
            self._psd = PSDProjector(12)
        self._psd.compile(self.hessians)
