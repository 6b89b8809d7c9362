"""Contact detection's test of surface vertices against the analytic colliders on the
device: one launch for the smallest signed distance of every vertex over a few positions,
with the NCP kernels' exact distance formulas (:mod:`tisim.contact.ncp.device_functions`).

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import numpy as np
import taichi as ti

from tisim.contact.ncp.device_functions import (
    _KIND,
    _signed_distance,
    collider_parameters,
    set_serial_loops,
)

# the loops' mode, set by DeviceColliderGaps before its kernel compiles
_SERIAL = False


@ti.kernel
def _min_collider_gaps(
    cp: ti.types.ndarray(ndim=2),
    ncol: ti.i32,
    sv: ti.types.ndarray(ndim=1),
    q0: ti.types.ndarray(ndim=2),
    q1: ti.types.ndarray(ndim=2),
    q2: ti.types.ndarray(ndim=2),
    npos: ti.i32,
    out: ti.types.ndarray(ndim=2),
):
    """out[c, i] = min over the first npos of (q0, q1, q2) of the signed distance of vertex
    sv[i] to collider c (f64 throughout, whatever the backend's precision)."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(sv.shape[0]):
        v = sv[i]
        for c in range(ncol):
            d = _signed_distance(cp, c, q0[v, 0], q0[v, 1], q0[v, 2])
            if npos > 1:
                d = ti.min(d, _signed_distance(cp, c, q1[v, 0], q1[v, 1], q1[v, 2]))
            if npos > 2:
                d = ti.min(d, _signed_distance(cp, c, q2[v, 0], q2[v, 1], q2[v, 2]))
            out[c, i] = d


class DeviceColliderGaps:
    """Contact detection's test of every surface vertex against the analytic colliders
    in one launch: the smallest signed distance of each vertex over a few positions
    (start of step, predictions), the formulas of ``Collider.distance`` (and of the NCP
    kernels' exact gaps), in f64.

    colliders: the model's colliders (no mesh colliders: PD contact does not handle them).
    vertices: (m,) the vertices tested (the surface). ``__call__(positions, t)``:
    positions, a list of 1 to 3 (n, 3) host arrays, m; t, the time (s) the colliders'
    poses are taken at; returns (c, m) distances, m (a buffer re-used by the next call).
    Host arrays go to the kernel as they are (no copy on the CPU backend; one upload
    each on GPU backends, once per detection).
    """

    def __init__(self, colliders, vertices):
        global _SERIAL
        _SERIAL = set_serial_loops()
        self.colliders = tuple(colliders)
        if any(_KIND.get(c.kind, -1) < 0 for c in self.colliders):
            raise ValueError("DeviceColliderGaps handles analytic colliders only")
        self.vertices = np.ascontiguousarray(vertices, dtype=np.int32)
        self.sv = ti.ndarray(ti.i32, shape=max(len(self.vertices), 1))
        if len(self.vertices):
            self.sv.from_numpy(self.vertices)
        self.out = np.empty((len(self.colliders), len(self.vertices)))

    def __call__(self, positions, t: float) -> np.ndarray:
        qs = [np.ascontiguousarray(p, dtype=np.float64) for p in positions]
        if not 1 <= len(qs) <= 3:
            raise ValueError(f"1 to 3 position arrays, got {len(qs)}")
        if len(self.vertices) and len(self.colliders):
            q = qs + [qs[0]] * (3 - len(qs))
            cp = collider_parameters(self.colliders, t)
            _min_collider_gaps(cp, len(self.colliders), self.sv, *q, len(qs), self.out)
        return self.out
