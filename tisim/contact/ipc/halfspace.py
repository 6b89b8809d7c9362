"""Static planes as analytic half-spaces for C-IPC: vertex-plane barrier, CCD and
lagged friction (numpy, vectorised over vertices).

A plane is exact with vertex contacts alone: a triangle whose three vertices are on
the positive side of a plane lies on that side (convexity), so no edge or face test is
needed, and a half-space costs one distance per vertex instead of a tessellated mesh
whose huge triangles would load the broad phase.

Distance d = n.(x - p) (signed); barrier kappa b(s, s_hat) on s = d^2 - xi^2 with
s_hat = dhat^2 + 2 dhat xi, the same convention as the mesh pairs (notes §7).
"""

from __future__ import annotations

import math

import numpy as np


def barrier(s, s_hat):
    """b(s) = -(s - s_hat)^2 ln(s / s_hat) on 0 < s < s_hat, 0 beyond, +inf at s <= 0."""
    s = np.asarray(s, dtype=np.float64)
    out = np.zeros_like(s)
    act = (s > 0) & (s < s_hat)
    r = s[act] - s_hat
    out[act] = -r * r * np.log(s[act] / s_hat)
    out[s <= 0] = np.inf
    return out


def barrier_d1(s, s_hat):
    out = np.zeros_like(s)
    act = (s > 0) & (s < s_hat)
    r = s[act] - s_hat
    out[act] = -2 * r * np.log(s[act] / s_hat) - r * r / s[act]
    return out


def barrier_d2(s, s_hat):
    out = np.zeros_like(s)
    act = (s > 0) & (s < s_hat)
    r = s[act] - s_hat
    ss = s[act]
    out[act] = -2 * np.log(ss / s_hat) - 4 * r / ss + r * r / (ss * ss)
    return out


def _f0(y, eps):
    return np.where(y < eps, -(y**3) / (3 * eps * eps) + y * y / eps + eps / 3, y)


def _f1_over_y(y, eps):
    return np.where(y < eps, -y / (eps * eps) + 2 / eps, 1.0 / np.maximum(y, 1e-300))


class HalfSpaces:
    """Static planes (point, unit normal, friction) met by ``vertex_count`` vertices.

    points, normals: (k, 3). mu: (k,) Coulomb coefficients.
    """

    def __init__(self, points, normals, mu, vertex_count: int):
        self.p = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        n = np.asarray(normals, dtype=np.float64).reshape(-1, 3)
        self.n = n / np.linalg.norm(n, axis=1, keepdims=True) if len(n) else n
        self.mu = np.asarray(mu, dtype=np.float64).reshape(-1)
        self.count = len(self.p)
        self.vertex_count = vertex_count
        # tangent bases, (k, 3, 2)
        T = np.zeros((self.count, 3, 2))
        for i, nn in enumerate(self.n):
            a = np.array([1.0, 0.0, 0.0]) if abs(nn[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
            t1 = np.cross(nn, a)
            t1 /= np.linalg.norm(t1)
            T[i, :, 0], T[i, :, 1] = t1, np.cross(nn, t1)
        self.T = T
        self._offset = (self.p * self.n).sum(axis=1)  # n . p per plane
        self._lam = None  # lagged normal forces (k, v)
        self._xref = None

    def __bool__(self) -> bool:
        return self.count > 0

    def distances(self, x: np.ndarray) -> np.ndarray:
        """(k, v) signed distances of the vertices x (v, 3) to each plane, m."""
        return (np.asarray(x, dtype=np.float64) @ self.n.T - self._offset).T

    def min_distance(self, x) -> float:
        return float(self.distances(x).min()) if self.count else math.inf

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

    def gradient_hessian(self, x, dhat, xi, kappa, hessian=True):
        """Gradient (v, 3) and per-vertex 3x3 PSD Hessians as (vertices, (m, 3, 3))."""
        g = np.zeros_like(x)
        rows, blocks = [], []
        if not self.count:
            return g, (np.zeros(0, np.int64), np.zeros((0, 3, 3)))
        d = self.distances(x)
        s_hat = dhat * dhat + 2 * dhat * xi
        s = d * d - xi * xi
        for k in range(self.count):
            act = np.flatnonzero((d[k] > xi) & (s[k] < s_hat))
            if not act.size:
                continue
            b1 = barrier_d1(s[k, act], s_hat)
            g[act] += (kappa * b1 * 2 * d[k, act])[:, None] * self.n[k]
            if hessian:
                b2 = barrier_d2(s[k, act], s_hat)
                c = kappa * (4 * d[k, act] ** 2 * b2 + 2 * b1)
                c = np.maximum(c, 0.0)  # PSD projection of the rank-one block
                rows.append(act)
                blocks.append(c[:, None, None] * np.outer(self.n[k], self.n[k])[None])
        if not rows:
            return g, (np.zeros(0, np.int64), np.zeros((0, 3, 3)))
        return g, (np.concatenate(rows), np.concatenate(blocks))

    def max_step(self, x, p, xi, eta=0.1) -> float:
        """Largest alpha in (0, 1] keeping every vertex of x + alpha p farther than xi
        from each plane, with a margin: a fraction eta of the gap is kept (as additive CCD)."""
        if not self.count:
            return 1.0
        d = self.distances(x)
        vn = np.einsum("vj,kj->kv", p, self.n)
        closing = vn < 0
        if not closing.any():
            return 1.0
        t = (1 - eta) * (d[closing] - xi) / (-vn[closing])
        return float(min(1.0, max(t.min(), 0.0)))

    # friction ---------------------------------------------------------------
    def update_friction(self, x, dhat, xi, kappa, reference=None) -> None:
        """Lag the normal forces lambda = -kappa db/dd at ``x``; tangential motion is then
        measured from ``reference`` (default: x, the start of the step)."""
        if not self.count:
            return
        d = self.distances(x)
        s_hat = dhat * dhat + 2 * dhat * xi
        s = d * d - xi * xi
        self._lam = np.where((d > xi) & (s < s_hat), -kappa * barrier_d1(s, s_hat) * 2 * d, 0.0)
        self._xref = (x if reference is None else reference).copy()
        # per plane, the vertices with a lagged normal force (the others have no friction)
        self._act = [np.flatnonzero(lam > 0) for lam in self._lam]

    def friction_bound(self) -> float:
        """sum mu lambda over the lagged contacts (N): the most friction they give."""
        if self._lam is None or not self.count:
            return 0.0
        return float((np.asarray(self.mu)[:, None] * self._lam).sum())

    def _u(self, x, k: int):
        """(m, 2) tangential displacements of plane k's vertices with friction."""
        act = self._act[k]
        return (x[act] - self._xref[act]) @ self.T[k]

    def friction_energy(self, x, eps_v, h) -> float:
        if self._lam is None or not self.count:
            return 0.0
        eps = eps_v * h
        E = 0.0
        for k in range(self.count):
            y = np.linalg.norm(self._u(x, k), axis=1)
            E += float((self.mu[k] * self._lam[k, self._act[k]] * _f0(y, eps)).sum())
        return E

    def friction_gradient_hessian(self, x, eps_v, h, hessian=True):
        g = np.zeros_like(x)
        if self._lam is None or not self.count:
            return g, (np.zeros(0, np.int64), np.zeros((0, 3, 3)))
        eps = eps_v * h
        rows, blocks = [], []
        for k in range(self.count):
            act = self._act[k]
            if not act.size:
                continue
            uk = self._u(x, k)  # (m, 2)
            yk = np.linalg.norm(uk, axis=1)
            w = self.mu[k] * self._lam[k, act]
            fy = _f1_over_y(yk, eps)
            g[act] += (w * fy)[:, None] * (uk @ self.T[k].T)
            if hessian:
                yy = yk
                # inner 2x2: f1/y I + (f1' y - f1)/y^3 u u^T (PSD: see IPC); beyond eps only
                # the part across the slip direction remains
                small = yy < eps
                ys = np.maximum(yy, 1e-100)
                with np.errstate(over="ignore", divide="ignore"):
                    coef = np.where(small, -1.0 / (eps * eps * ys), -1.0 / ys**3)
                coef = np.where(yy > 0, coef, 0.0)
                inner = fy[:, None, None] * np.eye(2)[None] + coef[:, None, None] * uk[:, :, None] * uk[:, None, :]
                Tk = self.T[k]
                rows.append(act)
                blocks.append(w[:, None, None] * np.einsum("ia,mab,jb->mij", Tk, inner, Tk))
        if not rows:
            return g, (np.zeros(0, np.int64), np.zeros((0, 3, 3)))
        return g, (np.concatenate(rows), np.concatenate(blocks))
