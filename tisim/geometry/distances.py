"""Unsigned distances between mesh primitives in plain numpy, one pair at a time.

For messages and checks outside the solver's hot loops (naming the closest pair of a
start state); the solver's own distances, with derivatives, are Taichi functions in
:mod:`tisim.contact.ipc.distance`. Positions in metres, (3,) arrays.
"""

from __future__ import annotations

import numpy as np


def _closest_on_segment(p, a, b):
    ab = b - a
    L2 = float(ab @ ab)
    if L2 == 0.0:
        return a
    t = min(max(float((p - a) @ ab) / L2, 0.0), 1.0)
    return a + t * ab


def point_triangle_distance(p, a, b, c) -> float:
    """Distance from point p to the triangle (a, b, c), degenerate triangles included."""
    p, a, b, c = (np.asarray(v, dtype=np.float64) for v in (p, a, b, c))
    n = np.cross(b - a, c - a)
    nn = float(n @ n)
    if nn > 0.0:
        # barycentric coordinates of p's projection onto the plane
        q = p - (float((p - a) @ n) / nn) * n
        u = float(np.cross(c - b, q - b) @ n) / nn
        v = float(np.cross(a - c, q - c) @ n) / nn
        if u >= 0.0 and v >= 0.0 and u + v <= 1.0:
            return float(np.linalg.norm(p - q))
    # outside the triangle (or degenerate): the closest point is on an edge
    return min(float(np.linalg.norm(p - _closest_on_segment(p, s, e))) for s, e in ((a, b), (b, c), (c, a)))


def segment_segment_distance(a0, a1, b0, b1) -> float:
    """Distance between the segments (a0, a1) and (b0, b1), parallel and degenerate ones
    included."""
    a0, a1, b0, b1 = (np.asarray(v, dtype=np.float64) for v in (a0, a1, b0, b1))
    d1, d2, r = a1 - a0, b1 - b0, a0 - b0
    a, e, f = float(d1 @ d1), float(d2 @ d2), float(d2 @ r)
    c, b = float(d1 @ r), float(d1 @ d2)
    denom = a * e - b * b
    # the interior candidate (non-parallel segments); the endpoint candidates cover the rest
    cands = []
    if a > 0.0 and e > 0.0 and denom > 1e-14 * a * e:
        s = min(max((b * f - c * e) / denom, 0.0), 1.0)
        t = min(max((b * s + f) / e, 0.0), 1.0)
        s = min(max((b * t - c) / a, 0.0), 1.0)
        cands.append(float(np.linalg.norm(a0 + s * d1 - (b0 + t * d2))))
    for p, (s0, s1) in ((a0, (b0, b1)), (a1, (b0, b1)), (b0, (a0, a1)), (b1, (a0, a1))):
        cands.append(float(np.linalg.norm(p - _closest_on_segment(p, s0, s1))))
    return min(cands)


def _point_segment_many(p, a, b) -> np.ndarray:
    """(k,) distances from points p (k, 3) to segments (a, b) (k, 3) each."""
    ab = b - a
    L2 = np.einsum("ij,ij->i", ab, ab)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(L2 > 0, np.einsum("ij,ij->i", p - a, ab) / L2, 0.0)
    t = np.clip(t, 0.0, 1.0)
    return np.linalg.norm(p - (a + t[:, None] * ab), axis=1)


def point_triangle_distances(p, a, b, c) -> np.ndarray:
    """(k,) ``point_triangle_distance`` of k pairs at once: p, a, b, c (k, 3) arrays."""
    p, a, b, c = (np.asarray(v, dtype=np.float64).reshape(-1, 3) for v in (p, a, b, c))
    n = np.cross(b - a, c - a)
    nn = np.einsum("ij,ij->i", n, n)
    edge = np.minimum(
        np.minimum(_point_segment_many(p, a, b), _point_segment_many(p, b, c)), _point_segment_many(p, c, a)
    )
    ok = nn > 0.0
    out = edge
    if ok.any():
        s = np.einsum("ij,ij->i", p[ok] - a[ok], n[ok]) / nn[ok]
        q = p[ok] - s[:, None] * n[ok]
        u = np.einsum("ij,ij->i", np.cross(c[ok] - b[ok], q - b[ok]), n[ok]) / nn[ok]
        v = np.einsum("ij,ij->i", np.cross(a[ok] - c[ok], q - c[ok]), n[ok]) / nn[ok]
        inside = (u >= 0.0) & (v >= 0.0) & (u + v <= 1.0)
        plane = np.linalg.norm(p[ok] - q, axis=1)
        out = edge.copy()
        out[np.flatnonzero(ok)[inside]] = plane[inside]
    return out


def segment_segment_distances(a0, a1, b0, b1) -> np.ndarray:
    """(k,) ``segment_segment_distance`` of k pairs at once: (k, 3) arrays."""
    a0, a1, b0, b1 = (np.asarray(v, dtype=np.float64).reshape(-1, 3) for v in (a0, a1, b0, b1))
    d1, d2, r = a1 - a0, b1 - b0, a0 - b0
    a = np.einsum("ij,ij->i", d1, d1)
    e = np.einsum("ij,ij->i", d2, d2)
    f = np.einsum("ij,ij->i", d2, r)
    c = np.einsum("ij,ij->i", d1, r)
    b = np.einsum("ij,ij->i", d1, d2)
    denom = a * e - b * b
    out = np.minimum.reduce(
        [
            _point_segment_many(a0, b0, b1),
            _point_segment_many(a1, b0, b1),
            _point_segment_many(b0, a0, a1),
            _point_segment_many(b1, a0, a1),
        ]
    )
    ok = (a > 0.0) & (e > 0.0) & (denom > 1e-14 * a * e)
    if ok.any():
        a_, b_, c_, e_, f_, dn = a[ok], b[ok], c[ok], e[ok], f[ok], denom[ok]
        s = np.clip((b_ * f_ - c_ * e_) / dn, 0.0, 1.0)
        t = np.clip((b_ * s + f_) / e_, 0.0, 1.0)
        s = np.clip((b_ * t - c_) / a_, 0.0, 1.0)
        d = np.linalg.norm(a0[ok] + s[:, None] * d1[ok] - (b0[ok] + t[:, None] * d2[ok]), axis=1)
        out[ok] = np.minimum(out[ok], d)
    return out
