"""Mesh topology: boundary surface, edges."""

from __future__ import annotations

import numpy as np

# Faces of tet (0,1,2,3) oriented outward for a positively oriented tet.
_TET_FACES = np.array([[1, 2, 3], [0, 3, 2], [0, 1, 3], [0, 2, 1]], dtype=np.int32)


def surface_triangles(tets: np.ndarray) -> np.ndarray:
    """(k, 3) boundary triangles of a positively oriented tet mesh, outward normals
    (counter-clockwise seen from outside)."""
    faces = tets[:, _TET_FACES].reshape(-1, 3)
    key = np.sort(faces, axis=1)
    _, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    return np.ascontiguousarray(faces[counts[inverse.ravel()] == 1])


def surface_vertices(tets: np.ndarray) -> np.ndarray:
    """Sorted indices of the vertices on the boundary surface."""
    return np.unique(surface_triangles(tets))


def edges(cells: np.ndarray) -> np.ndarray:
    """(e, 2) unique undirected edges (sorted pairs) of triangles or tets."""
    k = cells.shape[1]
    pairs = np.array([(a, b) for a in range(k) for b in range(a + 1, k)])
    e = np.sort(cells[:, pairs].reshape(-1, 2), axis=1)
    return np.unique(e, axis=0)
