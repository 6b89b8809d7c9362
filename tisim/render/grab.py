"""The live window's grab tool: the picked point pulls a small region of the mesh through
a damped spring whose force is bounded.

The viewer reports the picked vertex and the cursor's 3D target; :class:`GrabTool` turns
them into external forces (N, per vertex) that the runner hands the solver with
``Solver.set_grab_force`` every frame, so every solver meets them inside its own step
(the cloth's IPC Newton solve included: a constant external force leaves it
intersection-free, because its line search and CCD still hold every contact).

The region: the vertices of the picked object within ``radius`` of the picked vertex,
``radius`` the distance to its ``REGION_VERTICES``-th nearest neighbour, each weighted by
the smooth falloff w(d) = (1 - (d / radius)^2)^2 (1 at the picked vertex, 0 with zero slope
at the rim).

The force on region vertex i, with D = target - x_picked the cursor's pull and
M = sum_j m_j w_j the region's effective mass:

    f_i = (m_i w_i / M) (k clamp(D, reach) - c v_i),   |clamp(D, reach)| <= reach

k the grab stiffness (N/m, on the whole region), c = 2 zeta sqrt(k M) its damping. Every
region vertex gets the acceleration w_i (k D - c v_i) / M, so the region moves as one
piece, fading out at its rim. k is capped at M / h^2 (the panel's value above that acts
as M / h^2), where the explicit spring and damper are still stable. The force is explicit (evaluated at the start of the step),
so it is bounded by construction: |sum f_i| <= k reach + c max|v_i|. With the default
k = 0.5 M / h^2 a step moves a vertex by at most half of ``reach`` (the region's radius)
towards the cursor whatever the drag, and the explicit spring and damper are stable
(k h^2 w_i / M <= 0.5, c h w_i / M <= 1): no drag can throw a vertex through an element
or a collider in one step. Halving k (the runner does so when a grabbed step still fails) halves the
force. Pure numpy; no Taichi.
"""

from __future__ import annotations

import math

import numpy as np

REGION_VERTICES = 10  # the picked vertex's neighbourhood: its 10 nearest vertices
DAMPING_RATIO = 0.7
STIFFNESS_PER_MASS_H2 = 0.5  # default k = 0.5 M / h^2 (M: the region's effective mass)
MAX_STIFFNESS_PER_MASS_H2 = 1.0  # the spring acts with at most k = M / h^2: stable explicitly


def falloff(d: np.ndarray, radius: float) -> np.ndarray:
    """(1 - (d / radius)^2)^2 inside ``radius``, 0 outside: C1, 1 at d = 0."""
    s = np.clip(np.asarray(d, dtype=np.float64) / max(radius, 1e-300), 0.0, 1.0)
    return (1.0 - s * s) ** 2


class GrabTool:
    """Region, weights and bounded spring force of a mouse grab.

    mass: (n,) vertex masses, kg. object_slices: vertex slices of the objects (the region
    stays on the picked vertex's object). stiffness: k in N/m (None: 0.5 M / h^2,
    set at the first grab from the region's mass and the time step).
    """

    def __init__(self, mass: np.ndarray, object_slices=(), *, stiffness: float | None = None):
        self.mass = np.asarray(mass, dtype=np.float64)
        self.object_slices = [s if isinstance(s, slice) else slice(*s) for s in object_slices] or [
            slice(0, len(self.mass))
        ]
        self.stiffness = None if stiffness is None else float(stiffness)
        self.vertex: int | None = None
        self.region = np.zeros(0, dtype=np.int64)
        self.weights = np.zeros(0)
        self.radius = 0.0
        self.target: np.ndarray | None = None
        self.force = np.zeros(3)  # the last total force, N
        self.dt: float | None = None  # the step the force is applied over, s

    @property
    def active(self) -> bool:
        return self.vertex is not None

    def begin(self, vertex: int, positions: np.ndarray, dt: float) -> None:
        """Grab ``vertex``: pick its region in ``positions`` (n, 3) m; dt in s sets the
        default stiffness."""
        x = np.asarray(positions, dtype=np.float64)
        v = int(vertex)
        sl = next((s for s in self.object_slices if s.start <= v < s.stop), slice(0, len(x)))
        ids = np.arange(sl.start, sl.stop)
        d = np.linalg.norm(x[ids] - x[v], axis=1)
        d[~np.isfinite(d)] = np.inf
        k = min(REGION_VERTICES, len(ids) - 1)
        radius = float(np.partition(d, k)[k]) if k > 0 else 0.0
        if not (radius > 0 and math.isfinite(radius)):
            self.region, self.weights, self.radius = np.array([v]), np.ones(1), 0.0
        else:
            inside = d < radius
            self.region = ids[inside]
            self.weights = falloff(d[inside], radius)
            self.radius = radius
        self.vertex = v
        self.target = x[v].copy()
        self.dt = float(dt)
        if self.stiffness is None:
            self.stiffness = STIFFNESS_PER_MASS_H2 * self.effective_mass() / max(dt, 1e-12) ** 2

    def effective_mass(self) -> float:
        """M = sum m_i w_i over the region, kg."""
        return float(self.mass[self.region] @ self.weights) if len(self.region) else 0.0

    def release(self) -> None:
        self.vertex = None
        self.target = None
        self.region = np.zeros(0, dtype=np.int64)
        self.weights = np.zeros(0)
        self.force = np.zeros(3)

    def reach(self) -> float:
        """The largest pull |D| the spring acts on, m: the region's radius (a small
        fraction of the object), or the picked vertex's own scale when alone."""
        return self.radius if self.radius > 0 else 1e-2

    def forces(self, positions: np.ndarray, velocities: np.ndarray) -> np.ndarray | None:
        """(n, 3) external forces in N for the current state, or None when not grabbing."""
        if self.vertex is None or self.target is None or self.stiffness is None:
            return None
        x = np.asarray(positions, dtype=np.float64)
        D = self.target - x[self.vertex]
        if not np.all(np.isfinite(D)):
            return None
        n = float(np.linalg.norm(D))
        r = self.reach()
        if n > r:
            D = D * (r / n)
        M = self.effective_mass()
        if not M > 0:
            return None
        k = self.effective_stiffness()
        c = 2.0 * DAMPING_RATIO * math.sqrt(k * M)
        v = np.asarray(velocities, dtype=np.float64)[self.region]
        v = np.where(np.isfinite(v), v, 0.0)
        f = np.zeros_like(x)
        share = self.mass[self.region] * self.weights / M
        f[self.region] = share[:, None] * (k * D[None, :] - c * v)
        self.force = f[self.region].sum(axis=0)
        return f

    def effective_stiffness(self) -> float:
        """The stiffness the spring acts with, N/m: ``stiffness``, capped at M / h^2 so
        that the explicit spring and damper stay stable at the current step ``dt``."""
        k = float(self.stiffness)
        if self.dt is not None and self.dt > 0:
            k = min(k, MAX_STIFFNESS_PER_MASS_H2 * self.effective_mass() / self.dt**2)
        return k

    def max_force(self, speed: float = 0.0) -> float:
        """The bound on the total force's magnitude, N, for region speeds up to ``speed``."""
        if self.stiffness is None:
            return 0.0
        k = self.effective_stiffness()
        return k * self.reach() + 2.0 * DAMPING_RATIO * math.sqrt(k * self.effective_mass()) * speed
