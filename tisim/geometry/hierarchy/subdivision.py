"""Nested 1-to-4 refinement (Loop or midpoint) of a level, with the
subdivision matrix as the prolongation's linear part."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tisim.geometry.mesh import MeshError

from .levels import Level
from .prolongation import Prolongation, _with_offsets


def _edge_topology(faces: np.ndarray):
    """Unique edges of a triangle mesh and the edge of every face side.

    Returns edges (e, 2) sorted pairs, face_edge (m, 3) with column j the edge
    from corner j to corner j+1, and counts (e,) faces per edge. Raises
    MeshError on an edge shared by more than two faces."""
    sides = faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2)
    key = np.sort(sides, axis=1)
    edges, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    if counts.max() > 2:
        a, b = edges[int(np.argmax(counts))]
        raise MeshError(f"edge ({a}, {b}) is shared by {counts.max()} faces (non-manifold)")
    return edges, inverse.reshape(-1, 3), counts


def _split_faces(faces: np.ndarray, face_edge: np.ndarray, n: int) -> np.ndarray:
    """(4m, 3) faces of the 1-to-4 split; edge e's new vertex is n + e. The
    children of coarse face f are 4f..4f+3 (three corners, then the middle);
    orientation is kept."""
    a, b, c = faces.T
    mab, mbc, mca = (n + face_edge).T
    fine = np.stack(
        [
            np.stack([a, mab, mca], 1),
            np.stack([mab, b, mbc], 1),
            np.stack([mca, mbc, c], 1),
            np.stack([mab, mbc, mca], 1),
        ],
        axis=1,
    )
    return fine.reshape(-1, 3).astype(np.int32)


def _loop_beta(k: np.ndarray) -> np.ndarray:
    """Loop's even-vertex neighbour weight: 3/16 for valence 3, 3/(8k) otherwise."""
    k = np.asarray(k, dtype=np.float64)
    return np.where(k == 3, 3.0 / 16.0, 3.0 / (8.0 * np.maximum(k, 1.0)))


def loop_subdivide(
    level: Level,
    scheme: str = "loop",
    *,
    areal_density: float | None = None,
    corner_angle: float = 30.0,
) -> tuple[Level, Prolongation]:
    """One 1-to-4 subdivision of ``level``: (fine level, prolongation).

    scheme "loop": odd (edge) vertices 3/8, 3/8 on the edge and 1/8, 1/8 on
    the opposite vertices; even vertices 1 - k beta on themselves and beta on
    each of their k neighbours, beta = 3/(8k) for k > 3 and 3/16 for k = 3.
    Boundary: odd 1/2, 1/2; even 3/4 and 1/8, 1/8 on the two boundary
    neighbours; corners kept. scheme "midpoint": odd 1/2, 1/2, even kept
    (linear subdivision). All weights are non-negative.

    A corner is a boundary vertex with one incident face, with other than two
    boundary edges, or where the boundary turns by more than ``corner_angle``
    degrees (so the corners of a square cloth stay put).

    The fine rest shape is U X, so the offsets are zero at rest; every fine
    vertex is still given a host (an incident coarse face for an even vertex,
    a face of its edge for an odd one). Fine vertices: the n coarse ones first,
    then one per edge. Fine faces: 4m, children of face f at 4f..4f+3. UVs are
    carried linearly (edge midpoints), per vertex or per face corner. Fine
    masses are lumped with ``areal_density`` (default: the level's mass/area).
    """
    if scheme not in ("loop", "midpoint"):
        raise ValueError(f"scheme must be 'loop' or 'midpoint', got {scheme!r}")
    x, f = level.vertices, level.faces
    n = len(x)
    edges, face_edge, counts = _edge_topology(f)
    ne = len(edges)
    rows_o, cols_o, vals_o = _odd_stencil(f, face_edge, counts, n, scheme)
    rows_e, cols_e, vals_e = _even_stencil(x, f, edges, counts, scheme, corner_angle)
    rows = np.concatenate([rows_e, rows_o])
    cols = np.concatenate([cols_e, cols_o])
    U = sp.csr_matrix((np.concatenate([vals_e, vals_o]), (rows, cols)), shape=(n + ne, n))
    xf = U @ x
    ff = _split_faces(f, face_edge, n)
    host, bary, dist = _subdivision_hosts(x, f, face_edge, xf)
    uv, fuv = _subdivided_uv(level, edges)
    rho = level.areal_density if areal_density is None else float(areal_density)
    fine = Level.from_mesh(xf, ff, rho, uv=uv, face_uv=fuv)
    P = _with_offsets(U, x, f, xf, host, bary, dist)
    return fine, P


def _odd_stencil(f: np.ndarray, face_edge: np.ndarray, counts: np.ndarray, n: int, scheme: str):
    """Rows, columns and weights of U for the odd (edge) vertices, fine index n + edge."""
    interior_side = counts[face_edge] == 2  # (m, 3)
    # Odd vertices: every face side contributes half of an interior edge's
    # stencil (each interior edge has two sides), all of a boundary edge's.
    rows_o = np.repeat((n + face_edge).ravel(), 3)
    corner_a = f
    corner_b = np.roll(f, -1, axis=1)
    opposite = np.roll(f, -2, axis=1)
    if scheme == "loop":
        w_end = np.where(interior_side, 3.0 / 16.0, 0.5)
        w_opp = np.where(interior_side, 1.0 / 8.0, 0.0)  # each side has its own opposite vertex
    else:
        w_end = np.where(interior_side, 0.25, 0.5)
        w_opp = np.zeros_like(w_end)
    cols_o = np.stack([corner_a, corner_b, opposite], axis=2).ravel()
    vals_o = np.stack([w_end, w_end, w_opp], axis=2).ravel()
    return rows_o, cols_o, vals_o


def _even_stencil(
    x: np.ndarray, f: np.ndarray, edges: np.ndarray, counts: np.ndarray, scheme: str, corner_angle: float
):
    """Rows, columns and weights of U for the even (coarse) vertices: the Loop
    stencil inside, 3/4 and 1/8, 1/8 along the boundary, corners kept."""
    n = len(x)
    # Even vertices.
    is_boundary_edge = counts == 1
    bedges = edges[is_boundary_edge]
    bcount = np.bincount(bedges.ravel(), minlength=n)
    on_boundary = bcount > 0
    faces_per_vertex = np.bincount(f.ravel(), minlength=n)
    corner = on_boundary & ((bcount != 2) | (faces_per_vertex == 1))
    # Boundary neighbours of every regular boundary vertex (two of them).
    bb = np.concatenate([bedges, bedges[:, ::-1]])  # (2b, 2) vertex -> neighbour
    bb = bb[np.argsort(bb[:, 0], kind="stable")]
    regular = on_boundary & ~corner
    first_slot = np.searchsorted(bb[:, 0], np.arange(n))
    rb = np.flatnonzero(regular)
    nb1, nb2 = bb[first_slot[rb], 1], bb[first_slot[rb] + 1, 1]
    if len(rb):
        u1 = x[rb] - x[nb1]
        u2 = x[nb2] - x[rb]
        cosang = np.einsum("ij,ij->i", u1, u2) / np.maximum(
            np.linalg.norm(u1, axis=1) * np.linalg.norm(u2, axis=1), np.finfo(float).tiny
        )
        sharp = cosang < np.cos(np.radians(corner_angle))
        corner[rb[sharp]] = True
        keep = ~sharp
        rb, nb1, nb2 = rb[keep], nb1[keep], nb2[keep]
    interior = ~on_boundary
    if scheme == "loop":
        valence = np.bincount(edges.ravel(), minlength=n)
        beta = _loop_beta(valence)
        iv = np.flatnonzero(interior)
        # Neighbour weights of interior vertices through both directions of each edge.
        src = np.concatenate([edges[:, 0], edges[:, 1]])
        dst = np.concatenate([edges[:, 1], edges[:, 0]])
        keep = interior[src]
        rows_e = np.concatenate([iv, src[keep], rb, rb, rb, np.flatnonzero(corner)])
        cols_e = np.concatenate([iv, dst[keep], rb, nb1, nb2, np.flatnonzero(corner)])
        vals_e = np.concatenate(
            [
                1.0 - valence[iv] * beta[iv],
                beta[src[keep]],
                np.full(len(rb), 0.75),
                np.full(len(rb), 0.125),
                np.full(len(rb), 0.125),
                np.ones(int(corner.sum())),
            ]
        )
    else:
        rows_e = cols_e = np.arange(n)
        vals_e = np.ones(n)
    return rows_e, cols_e, vals_e


def _subdivision_hosts(x: np.ndarray, f: np.ndarray, face_edge: np.ndarray, xf: np.ndarray):
    """Host face, barycentric coordinates and distance to the host point of
    every fine vertex."""
    n, ne = len(x), len(xf) - len(x)
    # Hosts: an incident face for even vertices, a face of the edge for odd ones.
    _, first = np.unique(f.ravel(), return_index=True)
    _, first_e = np.unique(face_edge.ravel(), return_index=True)
    host = np.concatenate([first // 3, first_e // 3]).astype(np.int32)
    bary = np.zeros((n + ne, 3))
    bary[np.arange(n), first % 3] = 1.0
    j = first_e % 3
    bary[n + np.arange(ne), j] = 0.5
    bary[n + np.arange(ne), (j + 1) % 3] = 0.5
    hp = np.einsum("ij,ijk->ik", bary, x[f[host]])
    dist = np.linalg.norm(xf - hp, axis=1)
    return host, bary, dist


def _subdivided_uv(level: Level, edges: np.ndarray):
    """(uv, face_uv) of the fine level: the coarse UVs and one at every edge
    midpoint, per vertex or per face corner; (None, None) without UVs."""
    uv, fuv = None, None
    if level.uv is not None:
        if level.face_uv is None:
            uv = np.concatenate([level.uv, 0.5 * (level.uv[edges[:, 0]] + level.uv[edges[:, 1]])])
        else:
            uv_edges, uv_face_edge, _ = _edge_topology(level.face_uv)
            uv = np.concatenate([level.uv, 0.5 * (level.uv[uv_edges[:, 0]] + level.uv[uv_edges[:, 1]])])
            fuv = _split_faces(level.face_uv, uv_face_edge, len(level.uv))
    return uv, fuv
