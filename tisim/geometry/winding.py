"""Generalized winding numbers of points with respect to a triangle mesh (numpy).

w(p) = sum over triangles of their signed solid angle seen from p, over 4 pi
(Van Oosterom and Strackee's formula for the solid angle). For a closed, consistently
oriented mesh w is 1 inside (-1 when the triangles face inwards) and 0 outside; near
the surface and for open meshes it varies continuously (Jacobson et al. 2013).
"""

from __future__ import annotations

import numpy as np


def winding_numbers(points, vertices, faces, *, chunk: int = 1 << 16) -> np.ndarray:
    """(k,) generalized winding numbers of ``points`` (k, 3) with respect to the
    triangles ``faces`` (m, 3) over ``vertices`` (n, 3)."""
    p = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    tri = np.asarray(vertices, dtype=np.float64)[np.asarray(faces, dtype=np.int64).reshape(-1, 3)]
    out = np.zeros(len(p))
    step = max(1, chunk // max(len(tri), 1))
    for s in range(0, len(p), step):
        a = tri[None, :, 0] - p[s : s + step, None]
        b = tri[None, :, 1] - p[s : s + step, None]
        c = tri[None, :, 2] - p[s : s + step, None]
        la, lb, lc = (np.linalg.norm(v, axis=2) for v in (a, b, c))
        num = np.einsum("kmi,kmi->km", a, np.cross(b, c))
        den = (
            la * lb * lc
            + np.einsum("kmi,kmi->km", a, b) * lc
            + np.einsum("kmi,kmi->km", b, c) * la
            + np.einsum("kmi,kmi->km", c, a) * lb
        )
        out[s : s + step] = 2.0 * np.arctan2(num, den).sum(axis=1) / (4.0 * np.pi)
    return out


def is_closed(faces) -> bool:
    """Whether every edge of the triangles (m, 3) is shared by exactly two of them."""
    f = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    if not len(f):
        return False
    e = np.sort(np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]]), axis=1)
    _, counts = np.unique(e, axis=0, return_counts=True)
    return bool((counts == 2).all())
