"""Mesh topology: boundary surface, boundary edges, edges, adjacency."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

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


def boundary_edges(faces: np.ndarray) -> np.ndarray:
    """(b, 2) directed boundary edges of a triangle mesh: edges used by exactly one
    triangle, in that triangle's winding order (so for a consistently oriented
    sheet they run counter-clockwise around it). Empty for a closed surface.
    Edges used by three or more triangles (non-manifold) are not boundary edges."""
    faces = np.asarray(faces)
    directed = faces[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2)
    key = np.sort(directed, axis=1)
    _, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    return np.ascontiguousarray(directed[counts[inverse.ravel()] == 1]).reshape(-1, 2)


def vertex_adjacency(cells: np.ndarray, vertex_count: int | None = None) -> sp.csr_matrix:
    """(n, n) symmetric boolean adjacency of the mesh graph (vertices joined by an
    edge of a triangle or tet), without the diagonal. ``vertex_count`` defaults to
    max(cells) + 1; pass it when trailing vertices are unreferenced."""
    e = edges(np.asarray(cells))
    n = int(np.max(cells)) + 1 if vertex_count is None else int(vertex_count)
    rows = np.concatenate([e[:, 0], e[:, 1]])
    cols = np.concatenate([e[:, 1], e[:, 0]])
    return sp.csr_matrix((np.ones(len(rows), dtype=bool), (rows, cols)), shape=(n, n))


def euler_characteristic(faces: np.ndarray) -> int:
    """V - E + F of a triangle mesh, counting only referenced vertices
    (2 for a closed surface of genus 0, 1 for a disc)."""
    faces = np.asarray(faces)
    return int(len(np.unique(faces)) - len(edges(faces)) + len(faces))
