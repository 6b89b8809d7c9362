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


class NarrowPairs:
    """Rows and barrier of the narrow pairs. n: vertex count of the solver's positions;
    rest: (n, 3) rest positions (for the edge-edge mollifier); scale: the factor on
    ``thickness`` and ``dhat`` (m)."""

    def __init__(self, n: int, rest: np.ndarray, scale: float, thickness: float, dhat: float):
        import taichi as ti

        from tisim.contact.ipc.potential import BarrierPotential

        self.xi = float(scale) * float(thickness)
        self.dhat = float(scale) * float(dhat)
        self.barrier = BarrierPotential(n, 256, rest)
        self._cap = 256
        self.pt = ti.Vector.ndarray(4, ti.i32, self._cap)
        self.ee = ti.Vector.ndarray(4, ti.i32, self._cap)
        self.pairs = (0, 0)

    def store(self, pt_rows: np.ndarray, ee_rows: np.ndarray) -> None:
        """The narrow rows of a detection, (k, 4) int each."""
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

    def energy(self, x, kappa: float) -> float:
        """Their barrier energy at x (J); +inf when one overlaps."""
        return self.barrier.energy(x, self.pt, self.pairs[0], self.ee, self.pairs[1], self.dhat, self.xi, kappa)

    def add_terms(self, x, kappa: float, g, unknowns):
        """g += their barrier gradient at x; returns (hessians, stencils, rows) of their
        projected local Hessians, or None when none is within its reach."""
        apt, na_pt, aee, na_ee = self.barrier.compact_active(
            x, self.pt, self.pairs[0], self.ee, self.pairs[1], self.dhat, self.xi
        )
        if na_pt + na_ee == 0:
            return None
        self.barrier.add_gradient(x, apt, na_pt, aee, na_ee, self.dhat, self.xi, kappa, g)
        rows = self.barrier.local_hessians(x, apt, na_pt, aee, na_ee, self.dhat, self.xi, kappa, True, unknowns)
        return self.barrier.hessians, self.barrier.stencils, rows

    def max_step(self, x, dx) -> float:
        """Their CCD bound on the step dx from x (a fraction in (0, 1])."""
        from tisim.contact.ipc.ccd import max_step

        if not self:
            return 1.0
        return float(max_step(x, dx, self.pt, self.pairs[0], self.ee, self.pairs[1], self.xi))

    def min_distance(self, x) -> float:
        """Their smallest distance at x, m (inf without pairs)."""
        if not self:
            return math.inf
        return self.barrier.min_distance(x, self.pt, self.pairs[0], self.ee, self.pairs[1])

    def active_count(self, x) -> int:
        if not self:
            return 0
        return self.barrier.active_count(x, self.pt, self.pairs[0], self.ee, self.pairs[1], self.dhat, self.xi)

    def gap(self) -> float:
        """d^2 - xi^2 of the closest pair at the last energy evaluation, m^2."""
        d = self.barrier.last_min_distance
        return d * d - self.xi * self.xi if math.isfinite(d) else math.inf
