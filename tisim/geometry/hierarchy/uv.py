"""Texture coordinates carried from a fine level to the coarser levels made
from it by decimation."""

from __future__ import annotations

import numpy as np

from .embedding import closest_on_surface
from .levels import Level


def vertex_uv(level: Level) -> np.ndarray | None:
    """(n, 2) one texture coordinate per vertex of ``level``, or None when it has no
    UVs or has seams (some vertex carries two different UVs on two of its corners).

    An OBJ's ``f v/vt`` corners always come as per-corner UVs (``face_uv``), even
    when every corner of a vertex names the same ``vt``; those fold into one UV per
    vertex, so coarser levels can get UVs interpolated from them."""
    if level.uv is None:
        return None
    if level.face_uv is None:
        return level.uv
    corner = level.uv[level.face_uv].reshape(-1, 2)
    v = level.faces.ravel()
    uv = np.empty((level.vertex_count, 2))
    uv[v] = corner  # every vertex is used by a face
    if np.any(uv[v] != corner):
        return None  # a seam: no single UV per vertex
    return uv


def uv_at(level: Level, uv: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(k, 2) the per-vertex UVs ``uv`` of ``level`` interpolated (barycentric) at the
    closest point of its surface to each of ``points`` (k, 3), metres: exact where
    the UVs are affine over the host triangle (a flat sheet's u = x / size)."""
    h, w, _ = closest_on_surface(points, level.vertices, level.faces)
    return np.einsum("ij,ijk->ik", w, uv[level.faces[h]])
