"""The narrow self-contact pairs of a cloth (:class:`~tisim.contact.ipc.exclusion.RestExclusion`):
a second batch of barrier pairs with a contact of their own.

A slit's two lips are closer at rest than the scene's contact reach (thickness + dhat),
so the scene's barrier cannot hold them; left out, they pass through each other once
the sheet folds (a 0.5 mm slit draped on a sphere crossed itself in 13 of 41 frames).
Here they keep a barrier and CCD with the thickness and dhat scaled by the exclusion's
``scale``: each detection of the solver sorts its candidates and stores the narrow ones
in this object's rows; the Newton loop adds their energy, gradient and local Hessians
and bounds its steps by their CCD, like the scene's pairs. They get no friction, and
use the scene's barrier stiffness.
"""

from __future__ import annotations

import math

import numpy as np


class PairBatch:
    """A batch of point-triangle and edge-edge rows with a barrier of its own: thickness
    ``xi`` and activation distance ``dhat`` (m), and its stiffness the scene's kappa times
    ``kappa_scale``. n: vertex count of the solver's positions; rest: (n, 3) rest
    positions (for the edge-edge mollifier). The narrow pairs and a sphere met through its
    centre (:mod:`tisim.solvers.cloth.balls`) are two."""

    def __init__(self, n: int, rest: np.ndarray, xi: float, dhat: float, kappa_scale: float = 1.0):
        import taichi as ti

        from tisim.contact.ipc.potential import BarrierPotential

        self.xi = float(xi)
        self.dhat = float(dhat)
        self.kappa_scale = float(kappa_scale)
        self.barrier = BarrierPotential(n, 256, rest)
        self._cap = 256
        self.pt = ti.Vector.ndarray(4, ti.i32, self._cap)
        self.ee = ti.Vector.ndarray(4, ti.i32, self._cap)
        self.pairs = (0, 0)

    def store(self, pt_rows: np.ndarray, ee_rows: np.ndarray) -> None:
        """The batch's rows, (k, 4) int each."""
        import taichi as ti

        from tisim.backend import upload

        need = max(len(pt_rows), len(ee_rows))
        if need > self._cap:
            self._cap = max(need, 2 * self._cap)
            self.pt = ti.Vector.ndarray(4, ti.i32, self._cap)
            self.ee = ti.Vector.ndarray(4, ti.i32, self._cap)
        for arr, rows in ((self.pt, pt_rows), (self.ee, ee_rows)):
            if len(rows):
                buf = np.zeros((self._cap, 4), dtype=np.int32)
                buf[: len(rows)] = rows
                upload(arr, buf)
        self.pairs = (len(pt_rows), len(ee_rows))

    def __bool__(self) -> bool:
        return sum(self.pairs) > 0

    def _args(self):
        return self.pt, self.pairs[0], self.ee, self.pairs[1]

    def energy(self, x, kappa: float) -> float:
        """The batch's barrier energy at x (J); +inf when a pair overlaps."""
        if not self:
            self.barrier.last_min_distance = math.inf
            return 0.0
        return self.barrier.energy(x, *self._args(), self.dhat, self.xi, kappa * self.kappa_scale)

    def compact_active(self, x, same_x: bool = False):
        """The rows within reach at x (BarrierPotential.compact_active; same_x: x holds
        what it held at the last energy evaluation, over these rows)."""
        return self.barrier.compact_active(x, *self._args(), self.dhat, self.xi, same_x=same_x)

    def add_terms(self, x, kappa: float, g, unknowns, friction=None, same_x: bool = False):
        """g += the barrier's gradient at x; returns (hessians, stencils, rows) of its
        projected local Hessians, or None when no pair is within reach. friction:
        (FrictionPotential, x_ref, eps_v, h) whose gradient is added after the barrier's;
        same_x: as :meth:`compact_active`."""
        if self:
            kb = kappa * self.kappa_scale
            apt, na_pt, aee, na_ee = self.compact_active(x, same_x)
            if na_pt + na_ee:
                self.barrier.add_gradient(x, apt, na_pt, aee, na_ee, self.dhat, self.xi, kb, g, friction=friction)
                rows = self.barrier.local_hessians(x, apt, na_pt, aee, na_ee, self.dhat, self.xi, kb, True, unknowns)
                return self.barrier.hessians, self.barrier.stencils, rows
        if friction is not None:
            friction[0].add_gradient(x, *friction[1:], g)
        return None

    def add_gradient(self, x, kappa: float, g) -> None:
        """g += the barrier's gradient at x."""
        if self:
            self.barrier.add_gradient(x, *self._args(), self.dhat, self.xi, kappa * self.kappa_scale, g)

    def ccd_batch(self) -> tuple:
        """(pt, n_pt, ee, n_ee, thickness): the rows for CCD (``ccd.max_step_two``)."""
        return (*self._args(), self.xi)

    def max_step(self, x, dx) -> float:
        """The batch's CCD bound on the step dx from x (a fraction in (0, 1]); the rows
        must cover the sweep."""
        from tisim.contact.ipc.ccd import max_step

        if not self:
            return 1.0
        return float(max_step(x, dx, *self._args(), self.xi))

    def min_distance(self, x) -> float:
        """The rows' smallest distance at x, m (inf without rows)."""
        if not self:
            return math.inf
        return self.barrier.min_distance(x, *self._args())

    def active_count(self, x) -> int:
        if not self:
            return 0
        return self.barrier.active_count(x, *self._args(), self.dhat, self.xi)

    def distance_stats(self, x) -> tuple[float, int]:
        """(:meth:`min_distance`, :meth:`active_count`) from one pass."""
        if not self:
            return math.inf, 0
        return self.barrier.distance_stats(x, *self._args(), self.dhat, self.xi)

    def gap(self) -> float:
        """d^2 - xi^2 of the closest pair at the last energy evaluation, m^2."""
        d = self.barrier.last_min_distance
        return d * d - self.xi * self.xi if math.isfinite(d) else math.inf


class NarrowPairs(PairBatch):
    """The narrow pairs: thickness and dhat are the scene's times the exclusion's
    ``scale``; the scene's stiffness. n, rest: as :class:`PairBatch`."""

    def __init__(self, n: int, rest: np.ndarray, scale: float, thickness: float, dhat: float):
        super().__init__(n, rest, float(scale) * float(thickness), float(scale) * float(dhat))
