"""Static convex colliders met analytically by C-IPC cloth: planes, spheres, boxes and
cylinders (numpy, vectorised over vertices).

Each shape gives, for a point x, its signed distance d(x) to the solid (negative
inside), the unit normal n = grad d and, outside, the closest point's Jacobian Dq from
which the distance's Hessian K = (I - Dq - n n^T) / d follows (distance to a convex
set: grad d = (x - q) / d). Per cloth vertex and shape the barrier is kappa b(s, s_hat)
on s = d^2 - xi^2 with s_hat = dhat^2 + 2 dhat xi, the convention of the mesh pairs and
of the half-spaces (notes §7), so the shape is met at the thickness xi:

    grad  = kappa b'(s) 2 d n
    Hess  = kappa [(4 d^2 b'' + 2 b') n n^T + 2 d b' K]

K is PSD (the distance to a convex set is convex) with K n = 0, and b' < 0 on the
barrier's support, so the second term is negative semidefinite and orthogonal to n:
the PSD projection of the block is exactly max(4 d^2 b'' + 2 b', 0) kappa n n^T, which
is what the solver assembles (``gradient_hessian(..., project=False)`` gives the exact
block, for the derivative tests).

CCD (``max_step``): along a straight step x + t p, d(t) is convex in t (a convex
function of an affine map). Newton's iteration on d(t) = target from t = 0 therefore
never passes the first root: each tangent line lies below the convex d, so its root
comes no later than d's. It stops where the slope is not negative (d never falls again)
or where the tangent's root lies past t = 1; ``target = xi + eta (d0 - xi)`` keeps a
fraction eta of the gap, as the additive CCD of the mesh pairs does. A plane (d linear)
takes one iteration; a sphere or cylinder a few. A vertex whose distance exceeds the
target by more than |p| is skipped (d is 1-Lipschitz).

What the vertex terms guarantee: every cloth vertex stays farther than xi from the
shape. A flat face cannot reach a cloth triangle's interior without nearing its vertices
as much; a curved one can: for f(x) = |P (x - c)|^2 (P = I: squared distance from a
sphere's centre; P the projection across a cylinder's axis) and a point p = sum l_i v_i
of a triangle with circumcentre o and circumradius rho, the quadratic's identity gives
f(p) = sum l_i f(v_i) - sum l_i |P (v_i - p)|^2 >= min f(v_i) - (rho^2 - |p - o|^2), so
vertices at R + xi + delta from the centre (or axis) keep every point of the triangle at
sqrt((R + xi + delta)^2 - rho^2) or more. ``shape_of`` therefore grows a sphere's or
cylinder's radius by ``sag_allowance`` = sqrt((R + xi)^2 + rho^2) - (R + xi) (about
rho^2 / (2 R)), rho the cloth's largest circumradius: the triangles keep xi from the real
surface. A box's edges and corners and a capped cylinder's rims can reach a triangle's
interior or an edge's middle: the cloth solver adds them as a line set (straight edges
exact; the rims as polylines within 1% of the thickness) to the mesh pipeline's
edge-edge and point-triangle pairs (``_Obstacles`` in the cloth solver).

Limitations: static shapes only (a moving collider is tessellated); the friction's
tangent plane is the closest-point normal's, lagged at the start of each friction pass.
"""

from __future__ import annotations

import math

import numpy as np

from tisim.contact.ipc.halfspace import _f0, _f1_over_y, barrier, barrier_d1, barrier_d2

KINDS = ("plane", "sphere", "box", "cylinder")
_EMPTY_BLOCKS = (np.zeros(0, np.int64), np.zeros((0, 3, 3)))


class _Shape:
    """One static convex shape: ``closest(x)`` -> (d (v,), n (v, 3), Dq (v, 3, 3) or None)."""

    kind = ""

    def distance(self, x: np.ndarray) -> np.ndarray:
        return self.closest(x, jacobian=False)[0]


class Plane(_Shape):
    kind = "plane"

    def __init__(self, point, normal):
        self.p = np.asarray(point, dtype=np.float64)
        n = np.asarray(normal, dtype=np.float64)
        self.n = n / np.linalg.norm(n)
        self._offset = float(self.p @ self.n)

    def distance(self, x):
        return x @ self.n - self._offset

    def closest(self, x, jacobian=True):
        d = self.distance(x)
        n = np.broadcast_to(self.n, x.shape).copy()
        # the closest point moves with x in the plane: Dq = I - n n^T, K = 0
        Dq = np.broadcast_to(np.eye(3) - np.outer(self.n, self.n), (len(x), 3, 3)).copy() if jacobian else None
        return d, n, Dq


class Sphere(_Shape):
    kind = "sphere"

    def __init__(self, center, radius):
        self.c = np.asarray(center, dtype=np.float64)
        self.r = float(radius)

    def distance(self, x):
        return np.linalg.norm(x - self.c, axis=1) - self.r

    def closest(self, x, jacobian=True):
        o = x - self.c
        rr = np.linalg.norm(o, axis=1)
        n = o / np.where(rr > 0, rr, 1.0)[:, None]
        n[rr == 0] = (0.0, 1.0, 0.0)
        Dq = None
        if jacobian:
            P = np.eye(3)[None] - n[:, :, None] * n[:, None, :]
            Dq = np.where(
                (rr > self.r)[:, None, None], (self.r / np.maximum(rr, 1e-300))[:, None, None] * P, np.eye(3)[None]
            )
        return rr - self.r, n, Dq


class Box(_Shape):
    """A solid box: centre, (3, 3) rotation whose columns are its axes, half sizes."""

    kind = "box"

    def __init__(self, center, rotation, half_extents):
        self.c = np.asarray(center, dtype=np.float64)
        self.R = np.asarray(rotation, dtype=np.float64)
        self.h = np.asarray(half_extents, dtype=np.float64)

    def closest(self, x, jacobian=True):
        local = (x - self.c) @ self.R
        q = np.clip(local, -self.h, self.h)
        diff = local - q
        dout = np.linalg.norm(diff, axis=1)
        outside = dout > 0
        inner = np.abs(local) - self.h  # (v, 3) per-slab distances, all <= 0 inside
        k = np.argmax(inner, axis=1)
        d = np.where(outside, dout, inner.max(axis=1))
        nl = np.zeros_like(local)
        nl[outside] = diff[outside] / dout[outside, None]
        ii = np.flatnonzero(~outside)
        nl[ii, k[ii]] = np.where(local[ii, k[ii]] >= 0, 1.0, -1.0)
        n = nl @ self.R.T
        Dq = None
        if jacobian:
            free = (np.abs(local) < self.h).astype(np.float64)  # coordinates the closest point follows
            Dq = np.einsum("ia,va,ja->vij", self.R, free, self.R)
        return d, n, Dq

    def distance(self, x):
        local = np.abs((x - self.c) @ self.R) - self.h
        dout = np.linalg.norm(np.maximum(local, 0.0), axis=1)
        return np.where(dout > 0, dout, local.max(axis=1))

    def corners(self) -> np.ndarray:
        """(8, 3) corners; corner i has sign (-1)^(1 + bit k of i) on axis k."""
        s = np.array([[(i >> k & 1) * 2 - 1 for k in range(3)] for i in range(8)], dtype=np.float64)
        return self.c + (s * self.h) @ self.R.T

    @staticmethod
    def edges() -> np.ndarray:
        """(12, 2) corner pairs that differ on one axis."""
        return np.array([(i, i | 1 << k) for i in range(8) for k in range(3) if not i >> k & 1], dtype=np.int64)


class Cylinder(_Shape):
    """A solid cylinder: centre, unit axis, radius, length (inf: unbounded, no caps)."""

    kind = "cylinder"

    def __init__(self, center, axis, radius, length):
        self.c = np.asarray(center, dtype=np.float64)
        a = np.asarray(axis, dtype=np.float64)
        self.a = a / np.linalg.norm(a)
        self.r = float(radius)
        self.half = 0.5 * float(length)
        self.capped = math.isfinite(self.half)
        ref = np.array([1.0, 0.0, 0.0]) if abs(self.a[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
        u = np.cross(self.a, ref)
        self._perp = u / np.linalg.norm(u)

    def closest(self, x, jacobian=True):
        a = self.a
        o = x - self.c
        s = o @ a
        radial = o - s[:, None] * a
        rr = np.linalg.norm(radial, axis=1)
        u = radial / np.where(rr > 0, rr, 1.0)[:, None]
        u[rr == 0] = self._perp
        dr = rr - self.r
        ds = np.abs(s) - self.half if self.capped else np.full_like(s, -np.inf)
        sa = np.where(s >= 0, 1.0, -1.0)
        out_r, out_s = np.maximum(dr, 0.0), np.maximum(ds, 0.0)
        dout = np.hypot(out_r, out_s)
        outside = dout > 0
        n = (out_r[:, None] * u + (out_s * sa)[:, None] * a) / np.where(outside, dout, 1.0)[:, None]
        side = dr >= ds
        n_in = np.where(side[:, None], u, sa[:, None] * a)
        n = np.where(outside[:, None], n, n_in)
        d = np.where(outside, dout, np.maximum(dr, ds))
        Dq = None
        if jacobian:
            aa = np.outer(a, a)
            P = np.eye(3) - aa
            uu = u[:, :, None] * u[:, None, :]
            rad = np.where(
                (rr > self.r)[:, None, None], (self.r / np.maximum(rr, 1e-300))[:, None, None] * (P[None] - uu), P[None]
            )
            ax = (ds < 0).astype(np.float64)[:, None, None] * aa[None]
            Dq = rad + ax
        return d, n, Dq


def sag_allowance(radius: float, thickness: float, circumradius: float) -> float:
    """How much farther out (m) a curved surface of ``radius`` must be met by triangles'
    vertices so that the triangles (circumradius at most ``circumradius``) keep the
    ``thickness`` from it: sqrt((R + xi)^2 + rho^2) - (R + xi), about rho^2 / (2 R)
    (see the module docstring)."""
    a = float(radius) + float(thickness)
    rho = float(circumradius)
    return rho * rho / (math.sqrt(a * a + rho * rho) + a)


def shape_of(collider, *, thickness: float = 0.0, circumradius: float = 0.0) -> _Shape:
    """The analytic shape of a ``tisim.contact.colliders.Collider`` at t = 0 (static).
    A sphere's or cylinder's radius grows by ``sag_allowance(radius, thickness,
    circumradius)``: met by the vertices of triangles of that circumradius, the real
    surface then keeps the thickness from the triangles too."""
    c, R = collider.center(0.0), collider.orientation(0.0)
    if collider.kind == "plane":
        return Plane(c, R @ collider.normal)
    if collider.kind == "sphere":
        r = collider.radius
        return Sphere(c, r + sag_allowance(r, thickness, circumradius))
    if collider.kind == "box":
        return Box(c, R, collider.half_extents)
    if collider.kind == "cylinder":
        r = collider.radius
        return Cylinder(c, R @ collider.axis, r + sag_allowance(r, thickness, circumradius), collider.length)
    raise ValueError(f"collider {collider.name!r} of kind {collider.kind!r} is not analytic")


def _basis(n: np.ndarray) -> np.ndarray:
    """(v, 3, 2) orthonormal tangent bases of the unit normals n (v, 3)."""
    a = np.where((np.abs(n[:, 0]) < 0.9)[:, None], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0])
    t1 = np.cross(n, a)
    t1 /= np.linalg.norm(t1, axis=1, keepdims=True)
    return np.stack([t1, np.cross(n, t1)], axis=2)


class AnalyticColliders:
    """Static convex shapes (``Plane``, ``Sphere``, ``Box``, ``Cylinder``) met by
    ``vertex_count`` cloth vertices: barrier, lagged friction, CCD bound, distances.

    shapes: the shapes. mu: (k,) their Coulomb coefficients. Positions x are (v, 3)
    metres; dhat, xi (thickness) metres; kappa the barrier stiffness.
    """

    def __init__(self, shapes, mu, vertex_count: int):
        self.shapes = list(shapes)
        self.mu = np.asarray(mu, dtype=np.float64).reshape(-1)
        self.count = len(self.shapes)
        self.vertex_count = vertex_count
        self._lam = None  # per shape: lagged normal forces of its vertices with friction
        self._act = None
        self._T = None  # per shape: (m, 3, 2) tangent bases at the lag
        self._xref = None

    def __bool__(self) -> bool:
        return self.count > 0

    @property
    def planes(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(point, unit normal)] of the planes among the shapes."""
        return [(s.p, s.n) for s in self.shapes if s.kind == "plane"]

    def distances(self, x: np.ndarray) -> np.ndarray:
        """(k, v) signed distances of the vertices x (v, 3) to each shape, m."""
        x = np.asarray(x, dtype=np.float64)
        if not self.count:
            return np.zeros((0, len(x)))
        return np.stack([s.distance(x) for s in self.shapes])

    def min_distance(self, x) -> float:
        return float(self.distances(x).min()) if self.count and len(x) else math.inf

    def active_count(self, x, dhat, xi) -> int:
        if not self.count:
            return 0
        return int((self.distances(x) < dhat + xi).sum())

    def energy(self, x, dhat, xi, kappa) -> float:
        if not self.count:
            return 0.0
        d = self.distances(x)
        d = d[d < dhat + xi]  # the barrier is zero beyond its activation distance
        s_hat = dhat * dhat + 2 * dhat * xi
        s = np.where(d > 0, d * d - xi * xi, -1.0)
        return float(kappa * barrier(s, s_hat).sum())

    def gradient_hessian(self, x, dhat, xi, kappa, hessian=True, project=True):
        """Gradient (v, 3) and per-vertex 3x3 Hessian blocks as (vertices (m,), (m, 3, 3)),
        PSD-projected (``project=False``: the exact blocks, with the curvature term)."""
        x = np.asarray(x, dtype=np.float64)
        g = np.zeros_like(x)
        rows, blocks = [], []
        s_hat = dhat * dhat + 2 * dhat * xi
        for shape in self.shapes:
            act = np.flatnonzero(shape.distance(x) < dhat + xi)
            if not act.size:
                continue
            d, n, Dq = shape.closest(x[act], jacobian=hessian and not project)
            keep = d > xi
            act, d, n = act[keep], d[keep], n[keep]
            if not act.size:
                continue
            s = d * d - xi * xi
            b1 = barrier_d1(s, s_hat)
            g[act] += (kappa * b1 * 2 * d)[:, None] * n
            if hessian:
                b2 = barrier_d2(s, s_hat)
                c = kappa * (4 * d * d * b2 + 2 * b1)
                nn = n[:, :, None] * n[:, None, :]
                if project:
                    B = np.maximum(c, 0.0)[:, None, None] * nn
                else:
                    K = (np.eye(3)[None] - Dq[keep] - nn) / d[:, None, None]
                    B = c[:, None, None] * nn + (kappa * 2 * d * b1)[:, None, None] * K
                rows.append(act)
                blocks.append(B)
        if not rows:
            return g, _EMPTY_BLOCKS
        return g, (np.concatenate(rows), np.concatenate(blocks))

    def max_step(self, x, p, xi, eta=0.1, iterations: int = 40) -> float:
        """Largest alpha in (0, 1] such that every vertex of x + t p, 0 <= t <= alpha,
        stays at least xi + eta (d0 - xi) from every shape (see the module docstring)."""
        if not self.count:
            return 1.0
        x = np.asarray(x, dtype=np.float64)
        p = np.asarray(p, dtype=np.float64)
        plen = np.linalg.norm(p, axis=1)
        toi = 1.0
        for shape in self.shapes:
            d0 = shape.distance(x)
            target = xi + eta * (d0 - xi)
            cand = np.flatnonzero(d0 - plen <= target)
            if not cand.size:
                continue
            if (d0[cand] <= xi).any():
                return 0.0
            xs, ps, tg = x[cand], p[cand], target[cand]
            t = np.zeros(len(cand))
            live = np.ones(len(cand), dtype=bool)
            for _ in range(iterations):
                idx = np.flatnonzero(live)
                if not idx.size:
                    break
                d, n, _ = shape.closest(xs[idx] + t[idx, None] * ps[idx], jacobian=False)
                slope = (n * ps[idx]).sum(axis=1)
                gap = d - tg[idx]
                rising = slope >= 0  # convex: d never falls again on this line
                dt = np.where(rising, np.inf, gap / np.where(rising, -1.0, -slope))
                t_new = t[idx] + dt
                past = t_new >= 1.0
                t[idx[past]] = 1.0
                step = ~past
                t[idx[step]] = np.maximum(t_new[step], t[idx[step]])
                live[idx[past]] = False
                # converged: the remaining gap is a negligible part of the margin
                live[idx[step & (dt <= 1e-9 * np.maximum(t[idx], 1e-300) + 1e-15)]] = False
            toi = min(toi, float(t.min()))
        return float(min(1.0, max(toi, 0.0)))

    # friction ---------------------------------------------------------------
    def update_friction(self, x, dhat, xi, kappa, reference=None) -> None:
        """Lag the normal forces lambda = -kappa db/dd and the tangent planes (of the
        closest points' normals) at ``x``; tangential motion is then measured from
        ``reference`` (default: x, the start of the step)."""
        if not self.count:
            return
        x = np.asarray(x, dtype=np.float64)
        s_hat = dhat * dhat + 2 * dhat * xi
        self._lam, self._act, self._T = [], [], []
        for shape in self.shapes:
            d, n, _ = shape.closest(x, jacobian=False)
            s = d * d - xi * xi
            act = np.flatnonzero((d > xi) & (s < s_hat))
            self._act.append(act)
            self._lam.append(-kappa * barrier_d1(s[act], s_hat) * 2 * d[act])
            self._T.append(_basis(n[act]))
        self._xref = (x if reference is None else reference).copy()

    def friction_bound(self) -> float:
        """sum mu lambda over the lagged contacts (N): the most friction they give."""
        if self._lam is None or not self.count:
            return 0.0
        return float(sum(self.mu[k] * lam.sum() for k, lam in enumerate(self._lam)))

    def _u(self, x, k: int):
        """(m, 2) tangential displacements of shape k's vertices with friction."""
        act = self._act[k]
        return np.einsum("mj,mja->ma", x[act] - self._xref[act], self._T[k])

    def friction_energy(self, x, eps_v, h) -> float:
        if self._lam is None or not self.count:
            return 0.0
        eps = eps_v * h
        E = 0.0
        for k in range(self.count):
            y = np.linalg.norm(self._u(x, k), axis=1)
            E += float((self.mu[k] * self._lam[k] * _f0(y, eps)).sum())
        return E

    def friction_gradient_hessian(self, x, eps_v, h, hessian=True):
        g = np.zeros_like(x)
        if self._lam is None or not self.count:
            return g, _EMPTY_BLOCKS
        eps = eps_v * h
        rows, blocks = [], []
        for k in range(self.count):
            act = self._act[k]
            if not act.size:
                continue
            uk = self._u(x, k)  # (m, 2)
            yk = np.linalg.norm(uk, axis=1)
            w = self.mu[k] * self._lam[k]
            fy = _f1_over_y(yk, eps)
            Tk = self._T[k]
            g[act] += (w * fy)[:, None] * np.einsum("mia,ma->mi", Tk, uk)
            if hessian:
                # inner 2x2: f1/y I + (f1' y - f1)/y^3 u u^T (PSD: see IPC); beyond eps only
                # the part across the slip direction remains
                small = yk < eps
                ys = np.maximum(yk, 1e-100)
                with np.errstate(over="ignore", divide="ignore"):
                    coef = np.where(small, -1.0 / (eps * eps * ys), -1.0 / ys**3)
                coef = np.where(yk > 0, coef, 0.0)
                inner = fy[:, None, None] * np.eye(2)[None] + coef[:, None, None] * uk[:, :, None] * uk[:, None, :]
                rows.append(act)
                blocks.append(w[:, None, None] * np.einsum("mia,mab,mjb->mij", Tk, inner, Tk))
        if not rows:
            return g, _EMPTY_BLOCKS
        return g, (np.concatenate(rows), np.concatenate(blocks))
