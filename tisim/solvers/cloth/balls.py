"""Static spheres met by the cloth's triangles exactly: a sphere as its centre, a point
with a contact thickness of its radius plus the scene's.

The distance from a ball of radius R to a triangle T is exactly |c - T| - R, the
point-triangle distance from its centre c less the radius (T and the ball are convex).
So a cloth triangle keeps the contact thickness xi from the sphere exactly when the pair
(c, T) keeps rho = R + xi: the scene's IPC machinery with the centre as one static
obstacle vertex and point-triangle rows (c, T) over the cloth's faces gives the barrier,
its Hessian, friction and CCD with no tessellation (a 2,562-vertex geodesic sphere
before, whose facets also sat up to 0.04% of the radius inside the real surface) and
no sag allowance (the vertex-only terms of :mod:`tisim.contact.ipc.analytic` must meet a
coarse cloth farther out, or its triangles' interiors could cut the curve).

The barrier is kappa_b b(d^2 - rho^2, s_hat_b) on the centre distance d, with the scene's
dhat (s_hat_b = dhat^2 + 2 dhat rho): it reaches from rho + dhat to rho, like the
scene's from xi + dhat to xi. Its stiffness is the scene's kappa times (s_hat /
s_hat_b)^2 (s_hat = dhat^2 + 2 dhat xi): near contact, gap delta = d - rho, both
barriers then push with kappa s_hat^2 / delta, the same force at the same gap, so the
scene's stiffness rules (IPC's start value, doubling at small gaps) apply unchanged;
:meth:`BallPairs.gap` reports the gap as the scene's pairs would, (xi + delta)^2 - xi^2.

Friction: IPC's lagged point-triangle friction over the same rows, with the normal force
-kappa_b db/dd and the pair's coefficient from the centre's (the sphere's mu) and the
triangle's vertices', as for a tessellated collider.

Rows: every detection keeps the faces whose lower bound on the distance from the centre,
|centroid - c| - (largest vertex distance from the centroid) less the sweep's centroid
motion, is under rho + dhat + the detection's inflation; a bound that holds over a
straight sweep too (every point of a triangle is within that radius of its centroid, at
every time of the sweep).
"""

from __future__ import annotations

import math

import numpy as np

from tisim.solvers.cloth.narrow import PairBatch


class BallPairs(PairBatch):
    """The rows, barrier and friction of one static sphere against the cloth's faces: a
    :class:`PairBatch` whose thickness ``xi`` is rho = R + the scene's ``thickness``.

    n: vertex count of the solver's positions; rest: (n, 3) rest positions; centre_index:
    the sphere centre's index among them (a static obstacle vertex); radius, thickness,
    dhat: m; faces: (m, 3) the cloth's faces (indices into the positions)."""

    def __init__(self, n, rest, centre_index: int, radius: float, thickness: float, dhat: float, faces):
        from tisim.contact.ipc.potential import FrictionPotential

        self.centre_index = int(centre_index)
        self.radius = float(radius)
        self.thickness = float(thickness)
        rho = self.radius + self.thickness
        d = float(dhat)
        s_hat, s_hat_b = d * d + 2 * d * self.thickness, d * d + 2 * d * rho
        super().__init__(n, rest, rho, d, kappa_scale=(s_hat / s_hat_b) ** 2)
        self.faces = np.asarray(faces, dtype=np.int64)
        self._face_rows = np.ascontiguousarray(self.faces.T)  # (3, faces): candidate_faces' gathers
        self.friction = FrictionPotential(n, 256)
        self.friction_on = False

    @property
    def rho(self) -> float:
        return self.xi

    # ---------------------------------------------------------------- detection
    def candidate_faces(self, x: np.ndarray, inflation: float, dx: np.ndarray | None = None) -> np.ndarray:
        """Indices of the faces that may come within rho + dhat + inflation of the centre
        at x (n, 3), or anywhere on the sweep x + t dx, t in [0, 1].

        Computed by coordinate rows (3, faces), each sum written out in numpy's order
        for a reduction over three entries ((a + b) + c, the mean that sum over 3, a norm
        the root of its sum of squares) and the largest of three distances as the root of
        the largest square: the values of ``tri.mean(axis=1)`` and
        ``np.linalg.norm(..., axis=2).max(axis=1)`` bit for bit, at a third of the time
        (reductions over axes of length 3 cost numpy more than the arithmetic)."""
        X, F = x.T, self._face_rows
        p = [X[:, F[k]] for k in range(3)]
        cen = ((p[0] + p[1]) + p[2]) / 3
        reach2 = np.maximum(np.maximum(_sq(p[0] - cen), _sq(p[1] - cen)), _sq(p[2] - cen))
        if dx is not None:
            D = dx.T
            q = [p[k] + D[:, F[k]] for k in range(3)]
            cen1 = ((q[0] + q[1]) + q[2]) / 3
            reach2 = np.maximum(reach2, np.maximum(np.maximum(_sq(q[0] - cen1), _sq(q[1] - cen1)), _sq(q[2] - cen1)))
            reach = np.sqrt(reach2) + np.sqrt(_sq(cen1 - cen))
        else:
            reach = np.sqrt(reach2)
        lower = np.sqrt(_sq(cen - X[:, self.centre_index, None])) - reach
        return np.flatnonzero(lower < self.rho + self.dhat + inflation)

    def detect(self, x: np.ndarray, inflation: float, dx: np.ndarray | None = None) -> int:
        """Store the candidate rows (centre, face) for x (and the sweep dx); returns their count."""
        f = self.candidate_faces(x, inflation, dx)
        rows = np.empty((len(f), 4), dtype=np.int32)
        rows[:, 0] = self.centre_index
        rows[:, 1:] = self.faces[f]
        self.store(rows, rows[:0])
        return len(f)

    # ---------------------------------------------------------------- barrier
    def clearance(self, x) -> float:
        """The smallest distance from the sphere's surface to a face at x, m (inf without rows)."""
        return self.min_distance(x) - self.radius

    def gap(self) -> float:
        """The closest face's gap at the last energy evaluation as the scene's pairs give
        theirs, (xi + delta)^2 - xi^2 with delta = d - rho, m^2 (inf without one)."""
        d = self.barrier.last_min_distance
        if not math.isfinite(d):
            return math.inf
        delta = d - self.rho
        return (self.thickness + delta) ** 2 - self.thickness**2

    # ---------------------------------------------------------------- friction
    def update_friction(self, x, kappa: float, vertex_mu) -> None:
        """Lag the friction's normal forces, coefficients and tangents at x."""
        if not self:
            self.friction_on = False
            self.friction.rows = 0
            return
        apt, na_pt, aee, na_ee = self.compact_active(x)
        kb = kappa * self.kappa_scale
        self.friction.update(x, apt, na_pt, aee, na_ee, self.dhat, self.rho, kb, vertex_mu)
        self.friction_on = self.friction.rows > 0

    def friction_energy(self, x, x_ref, eps_v: float, h: float) -> float:
        return self.friction.energy(x, x_ref, eps_v, h) if self.friction_on else 0.0

    def energies(self, x, x_ref, kappa: float, eps_v: float, h: float) -> float:
        """energy(x, kappa) + friction_energy(x, x_ref, eps_v, h), J (one launch where both act)."""
        if not self or not self.friction_on:
            return self.energy(x, kappa) + self.friction_energy(x, x_ref, eps_v, h)
        Eb, Ef = self.barrier.energy_with_friction(
            x, *self._args(), self.dhat, self.xi, kappa * self.kappa_scale, self.friction, x_ref, eps_v, h
        )
        return Eb + Ef

    def add_contact_terms(self, x, x_ref, kappa: float, eps_v: float, h: float, g, unknowns, same_x: bool = False):
        """g += the barrier's and friction's gradients (``add_terms`` then
        ``add_friction_terms``, the gradients in one launch); returns their (hessians,
        stencils, rows), each None where it adds nothing. same_x: x holds what it held at
        the last :meth:`energies` call, over these rows (its active rows are reused)."""
        fr = (self.friction, x_ref, eps_v, h) if self.friction_on else None
        part = self.add_terms(x, kappa, g, unknowns, friction=fr, same_x=same_x)
        if fr is None:
            return part, None
        rows = self.friction.local_hessians(x, x_ref, eps_v, h, True)
        return part, (self.friction.hessians, self.friction.stencils, rows)

    def add_friction_terms(self, x, x_ref, eps_v: float, h: float, g):
        """g += friction's gradient; returns (hessians, stencils, rows) or None."""
        if not self.friction_on:
            return None
        self.friction.add_gradient(x, x_ref, eps_v, h, g)
        rows = self.friction.local_hessians(x, x_ref, eps_v, h, True)
        return self.friction.hessians, self.friction.stencils, rows

    def friction_bound(self) -> float:
        """sum mu lambda over the lagged contacts (N)."""
        from tisim.backend import download

        if not self.friction_on:
            return 0.0
        return float(download(self.friction.coef)[: self.friction.rows].sum())


def _sq(d: np.ndarray) -> np.ndarray:
    """Squared lengths of the columns of d (3, k): (d0^2 + d1^2) + d2^2, numpy's order."""
    return (d[0] * d[0] + d[1] * d[1]) + d[2] * d[2]
