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


# ---------------------------------------------------------------------------
# Triangle-mesh half-edge topology (cloth): hinges, orientation, manifoldness


def _half_edges(faces: np.ndarray):
    """Directed half-edges of a triangle mesh in face order.

    Returns (he (3m, 2) directed edges (f[k], f[k+1]), opposite (3m,) the face's
    third vertex, face (3m,) owning face, key (3m,) int64 undirected edge key
    lo * n + hi, n).
    """
    f = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    he = f[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2)
    opposite = f[:, [2, 0, 1]].reshape(-1)
    face = np.repeat(np.arange(len(f), dtype=np.int64), 3)
    n = int(f.max()) + 1 if f.size else 0
    key = np.minimum(he[:, 0], he[:, 1]) * n + np.maximum(he[:, 0], he[:, 1])
    return he, opposite, face, key, n


def _edge_groups(key: np.ndarray):
    """Half-edges grouped by undirected edge, keeping face order inside a group.

    Returns (order (3m,) half-edge indices sorted by key, stable; start (g,)
    position in ``order`` where each group starts; count (g,) group sizes).
    """
    order = np.argsort(key, kind="stable")
    ks = key[order]
    first = np.r_[True, ks[1:] != ks[:-1]] if len(ks) else np.zeros(0, dtype=bool)
    start = np.flatnonzero(first)
    count = np.diff(np.r_[start, len(ks)])
    return order, start, count


def edge_face_counts(faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique undirected edges of a triangle mesh and how many faces use each.

    Returns (edges (e, 2) sorted pairs in lexicographic order, counts (e,)):
    1 on the boundary, 2 inside a manifold sheet, 3+ at a non-manifold edge.
    """
    he, _, _, key, _n = _half_edges(faces)
    order, start, count = _edge_groups(key)
    first = he[order[start]]
    return np.sort(first, axis=1).reshape(-1, 2), count


def hinges(faces: np.ndarray, return_faces: bool = False):
    """Bending hinges (interior edges) of a triangle mesh.

    faces: (m, 3) vertex indices, consistently oriented. Returns (h, 4) int64
    rows (e0, e1, o0, o1), one per edge shared by exactly two faces, ordered as
    the rows of ``edges(faces)``: face A = (e0, e1, o0) is the first of the two
    faces (lower index) rotated so that it runs e0 -> e1 in its winding order,
    and face B, consistently oriented, runs e1 -> e0, so B = (e1, e0, o1). The
    normals n_A = (e1 - e0) x (o0 - e0) and n_B = (o1 - e0) x (e1 - e0) (both
    counter-clockwise) give a dihedral angle whose sign does not depend on
    which hinge is looked at. With ``return_faces`` also returns (h, 2) the face
    indices (A, B). Edges of three or more faces are not hinges.
    """
    he, opposite, face, key, _ = _half_edges(faces)
    order, start, count = _edge_groups(key)
    inner = start[count == 2]
    a, b = order[inner], order[inner + 1]
    out = np.stack([he[a, 0], he[a, 1], opposite[a], opposite[b]], axis=1).reshape(-1, 4)
    if return_faces:
        return out, np.stack([face[a], face[b]], axis=1).reshape(-1, 2)
    return out


def consistent_orientation(faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which faces to flip so that every manifold edge is traversed in opposite
    directions by its two faces.

    A face is flipped or not as a 2-colouring of the face adjacency (faces
    joined across edges shared by exactly two faces): two faces that traverse
    their shared edge in the same direction must end in different states. The
    colouring is found at once for all faces as the connected components of the
    "orientation double cover" (a node per face and state), which is what a BFS
    over the faces would visit. In each connected piece the majority keeps its
    winding (ties keep the winding of the piece's lowest-numbered face).

    Returns (flip (m,) bool, non_orientable (m,) bool): faces of a piece that
    admits no consistent orientation (a Moebius strip) are marked in
    ``non_orientable`` and never flipped.
    """
    f = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    m = len(f)
    if m == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    he, _, face, key, _ = _half_edges(f)
    order, start, count = _edge_groups(key)
    inner = start[count == 2]
    a, b = order[inner], order[inner + 1]
    fa, fb = face[a], face[b]
    same = (he[a, 0] == he[b, 0]).astype(np.int64)  # same direction: one of them must flip
    import scipy.sparse.csgraph as csgraph

    rows = np.concatenate([fa, fa + m])
    cols = np.concatenate([fb + m * same, fb + m * (1 - same)])
    g = sp.coo_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(2 * m, 2 * m))
    _, label = csgraph.connected_components(g, directed=False)
    keep_label, flip_label = label[:m], label[m:]
    non_orientable = keep_label == flip_label
    # Each orientable piece has two cover components; the one holding (lowest
    # face, unflipped) has the smaller label, since labels follow node order.
    rep = np.minimum(keep_label, flip_label)
    in_first = keep_label == rep
    n_first = np.bincount(rep, weights=in_first, minlength=2 * m)
    n_all = np.bincount(rep, minlength=2 * m)
    keep_first = n_first >= n_all - n_first
    flip = (in_first != keep_first[rep]) & ~non_orientable
    return flip, non_orientable


def nonmanifold_vertices(faces: np.ndarray) -> np.ndarray:
    """Sorted indices of the vertices whose incident faces form more than one
    fan (two sheets touching at a single vertex, a "bowtie"). Faces count as
    one fan around a vertex when they are joined across edges shared by exactly
    two faces and containing the vertex."""
    f = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    m = len(f)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    import scipy.sparse.csgraph as csgraph

    he, _, _, key, _ = _half_edges(f)
    order, start, count = _edge_groups(key)
    inner = start[count == 2]
    a, b = order[inner], order[inner + 1]
    # Corner ids 3 * face + k: half-edge i = 3 f + k starts at corner i and ends
    # at corner 3 f + (k + 1) % 3.
    a_end = a - a % 3 + (a % 3 + 1) % 3
    b_end = b - b % 3 + (b % 3 + 1) % 3
    same = he[a, 0] == he[b, 0]
    rows = np.concatenate([a, a_end])
    cols = np.concatenate([np.where(same, b, b_end), np.where(same, b_end, b)])
    g = sp.coo_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(3 * m, 3 * m))
    _, label = csgraph.connected_components(g, directed=False)
    vertex = f.reshape(-1)
    pairs = np.unique(vertex * (int(label.max()) + 1) + label)  # distinct (vertex, fan)
    fans = np.bincount(pairs // (int(label.max()) + 1))
    return np.flatnonzero(fans > 1)
