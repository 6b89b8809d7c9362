"""Intersections of a cloth with itself and with obstacle meshes, for initial states:
edges against triangles with a tolerance, one-line errors naming the first pair.
Plain numpy; nothing here imports Taichi."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tisim.geometry import topology
from tisim.geometry.mesh import MeshError


def _ints(v) -> str:
    """Vertex ids as they appear in messages: "3, 7, 12"."""
    return ", ".join(str(int(i)) for i in v)


class Intersection(NamedTuple):
    """An edge crossing (or touching) a face.

    edge: row of the edge list of the mesh that owns the edge; face: row of the
    face list of the other mesh (or of the same mesh for a self-intersection).
    edge_in_other: False for a cloth edge (against a cloth face, or against an
    ``other`` face), True for an edge of ``other`` against a cloth face.
    """

    edge: int
    face: int
    edge_in_other: bool = False


def find_intersections(x, faces, edges, other=None, *, tol: float | None = None) -> list[Intersection]:
    """Edge-triangle pairs that intersect, for rejecting an initial state.

    x: (n, 3) metres; faces: (m, 3); edges: (e, 2) (e.g. ``ClothMesh.edges``).
    Without ``other``: self-intersections, pairs (cloth edge, cloth face) that
    share no vertex. With ``other = (V (p, 3), F (q, 3))`` (an obstacle; a
    ``TriMesh`` or ``ClothMesh`` works too): only
    pairs between the two meshes, both ways: cloth edges against obstacle faces
    and obstacle edges (rows of ``topology.edges(F)``) against cloth faces
    (``edge_in_other`` True); a triangle pair crosses iff one of these does.

    Candidates come from a k-d tree over edge and face box centres (pairs
    whose centres are closer than the largest two box radii), filtered by
    bounding boxes; each candidate gets an exact-geometry segment-triangle
    test. Touching counts as intersecting: points within ``tol`` (default
    1e-10 of the bounding-box diagonal) of the plane or the triangle are on it,
    so coplanar neighbours of a flat sheet are not reported unless they
    overlap. Returns the pairs sorted by (edge_in_other, edge, face).

    Limitations: candidates use the largest face and edge sizes as the search
    radius, so a mesh mixing tiny and huge elements makes many candidates.
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1, 3)
    faces = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if other is None:
        scale = float(np.linalg.norm(np.ptp(x, axis=0))) if len(x) else 1.0
        t = (1e-10 * scale) if tol is None else float(tol)
        ei, fi = _edge_face_hits(x, edges, x, faces, True, t)
        hits = [Intersection(int(e), int(f)) for e, f in zip(ei, fi, strict=True)]
    else:
        if hasattr(other, "vertices"):  # a TriMesh or ClothMesh
            other = (other.vertices, other.faces)
        ov = np.asarray(other[0], dtype=np.float64).reshape(-1, 3)
        of = np.asarray(other[1], dtype=np.int64).reshape(-1, 3)
        both = np.concatenate([x, ov])
        scale = float(np.linalg.norm(np.ptp(both, axis=0))) if len(both) else 1.0
        t = (1e-10 * scale) if tol is None else float(tol)
        ei, fi = _edge_face_hits(x, edges, ov, of, False, t)
        hits = [Intersection(int(e), int(f)) for e, f in zip(ei, fi, strict=True)]
        oe, cf = _edge_face_hits(ov, topology.edges(of), x, faces, False, t)
        hits += [Intersection(int(e), int(f), True) for e, f in zip(oe, cf, strict=True)]
    return sorted(hits, key=lambda h: (h.edge_in_other, h.edge, h.face))


def check_intersection_free(
    x,
    faces,
    edges,
    *,
    source: str | None = None,
    other=None,
    other_name: str = "the collider",
    tol: float | None = None,
) -> None:
    """Raise MeshError (one line naming ``source`` and the first pair) when
    ``find_intersections`` finds anything; arguments as there."""
    hits = find_intersections(x, faces, edges, other, tol=tol)
    if not hits:
        return
    h = hits[0]
    edges = np.asarray(edges).reshape(-1, 2)
    more = f" ({len(hits)} intersecting edge-face pairs in all)" if len(hits) > 1 else ""
    if other is None:
        e, f = edges[h.edge], np.asarray(faces)[h.face]
        msg = (
            f"the cloth intersects itself: edge {h.edge} (vertices {_ints(e)}) crosses "
            f"face {h.face} (vertices {_ints(f)}){more}"
        )
    elif not h.edge_in_other:
        e = edges[h.edge]
        msg = (
            f"the cloth intersects {other_name}: cloth edge {h.edge} (vertices {_ints(e)}) "
            f"crosses face {h.face} of {other_name}{more}"
        )
    else:
        f = np.asarray(faces)[h.face]
        msg = (
            f"the cloth intersects {other_name}: edge {h.edge} of {other_name} crosses "
            f"cloth face {h.face} (vertices {_ints(f)}){more}"
        )
    raise MeshError(msg, source)


def _edge_face_hits(
    xe: np.ndarray, edges: np.ndarray, xf: np.ndarray, faces: np.ndarray, same: bool, tol: float
) -> tuple[np.ndarray, np.ndarray]:
    """(edge indices, face indices) of intersecting pairs: edges over positions
    ``xe``, faces over ``xf``; ``same`` means one mesh (skip pairs that share a
    vertex)."""
    empty = np.zeros(0, dtype=np.int64)
    if len(edges) == 0 or len(faces) == 0:
        return empty, empty
    from scipy.spatial import cKDTree

    pe = xe[edges]  # (e, 2, 3)
    pf = xf[faces]  # (f, 3, 3)
    elo, ehi = pe.min(axis=1) - tol, pe.max(axis=1) + tol
    flo, fhi = pf.min(axis=1), pf.max(axis=1)
    ec, fc = 0.5 * (elo + ehi), 0.5 * (flo + fhi)
    er = 0.5 * np.linalg.norm(ehi - elo, axis=1)
    fr = 0.5 * np.linalg.norm(fhi - flo, axis=1)
    # Two boxes overlap only if their centres are closer than the sum of their
    # half-diagonals, hence at most er.max() + fr.max() apart.
    pairs = cKDTree(ec).sparse_distance_matrix(
        cKDTree(fc), float(er.max() + fr.max()) * (1 + 1e-12) + tol, output_type="ndarray"
    )
    ei = pairs["i"].astype(np.intp)
    fi = pairs["j"].astype(np.intp)
    for ax in range(3):  # box overlap, one axis at a time on a shrinking set
        keep = (elo[ei, ax] <= fhi[fi, ax]) & (flo[fi, ax] <= ehi[ei, ax])
        ei, fi = ei[keep], fi[keep]
    if same:
        ev, fv = edges[ei], faces[fi]
        keep = ~np.any(ev[:, :, None] == fv[:, None, :], axis=(1, 2))
        ei, fi = ei[keep], fi[keep]
    hit = _segment_triangle(pe[ei, 0], pe[ei, 1], pf[fi, 0], pf[fi, 1], pf[fi, 2], tol)
    order = np.lexsort((fi[hit], ei[hit]))
    return ei[hit][order], fi[hit][order]


def _segment_triangle(p, q, a, b, c, tol: float) -> np.ndarray:
    """(k,) bool: segment pq meets triangle abc (all (k, 3)), within ``tol``.

    Off-plane case: the endpoints' signed distances to the triangle's plane
    bracket 0, and the crossing point lies inside the triangle (distances to the
    three edge lines, measured inward, all >= -tol). Coplanar case (both
    endpoints within tol of the plane): an endpoint inside, a proper crossing of
    a triangle edge, or a point-segment distance <= tol.
    """
    n = np.cross(b - a, c - a)
    nn = np.linalg.norm(n, axis=1)
    ok = nn > 0  # degenerate faces never hit (validation rejects them anyway)
    nhat = n / np.where(ok, nn, 1.0)[:, None]
    dp = _dot(p - a, nhat)
    dq = _dot(q - a, nhat)
    on_p, on_q = np.abs(dp) <= tol, np.abs(dq) <= tol
    coplanar = on_p & on_q
    crosses = ~coplanar & ~((dp > tol) & (dq > tol)) & ~((dp < -tol) & (dq < -tol))
    denom = np.where(dp == dq, 1.0, dp - dq)
    t = np.clip(dp / denom, 0.0, 1.0)
    r = np.where(on_p[:, None], p, np.where(on_q[:, None], q, p + t[:, None] * (q - p)))
    hit = crosses & _inside(r, (a, b, c), nhat, tol)
    if np.any(coplanar):
        s = coplanar
        P, Q, N = p[s], q[s], nhat[s]
        tri = (a[s], b[s], c[s])
        h = _inside(P, tri, N, tol) | _inside(Q, tri, N, tol)
        pq = Q - P
        for k in range(3):
            u, w = tri[k], tri[(k + 1) % 3]
            uw = w - u
            # proper crossing of the segment and the triangle edge in the plane
            s1 = _dot(np.cross(pq, u - P), N)
            s2 = _dot(np.cross(pq, w - P), N)
            s3 = _dot(np.cross(uw, P - u), N)
            s4 = _dot(np.cross(uw, Q - u), N)
            h |= (s1 * s2 < 0) & (s3 * s4 < 0)
            # touching, including collinear overlap, which the signs cannot see
            dmin = np.minimum.reduce(
                [
                    _point_segment(P, u, w),
                    _point_segment(Q, u, w),
                    _point_segment(u, P, Q),
                    _point_segment(w, P, Q),
                ]
            )
            h |= dmin <= tol
        hit[s] = h
    return hit & ok


def _inside(pt: np.ndarray, tri, nhat: np.ndarray, tol: float) -> np.ndarray:
    """(k,) bool: points pt (in the triangle's plane) lie in triangle tri =
    (a, b, c), counter-clockwise about nhat, within tol of its edge lines."""
    d = np.full(len(pt), np.inf)
    for k in range(3):
        u, w = tri[k], tri[(k + 1) % 3]
        e = w - u
        le = np.linalg.norm(e, axis=1)
        inward = np.cross(nhat, e) / np.where(le > 0, le, 1.0)[:, None]
        d = np.minimum(d, _dot(pt - u, inward))
    return d >= -tol


def _dot(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", u, v)


def _point_segment(p, a, b) -> np.ndarray:
    """(k,) distance from points p to segments ab."""
    ab = b - a
    ll = _dot(ab, ab)
    t = np.clip(_dot(p - a, ab) / np.where(ll > 0, ll, 1.0), 0.0, 1.0)
    return np.linalg.norm(p - (a + t[:, None] * ab), axis=1)
