"""Embedding a finer level into a coarser one: closest points on a triangle
mesh, the barycentric rows of U, and the direct and composed prolongations
built from them."""

from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp
from scipy.spatial import cKDTree

from tisim.geometry.mesh import MeshError

from .levels import Level
from .prolongation import Prolongation, _face_frames, _with_offsets

log = logging.getLogger(__name__)


# A host triangle whose doubled area is below this fraction of the squared
# bounding-box diagonal has no usable frame; such triangles are never chosen as
# hosts. Far above the round-off of a cross product (~1e-16 relative).
_DEGENERATE_AREA = 1e-14


def _closest_on_triangles(p, a, b, c):
    """Closest points of p on triangles (a, b, c), all (N, 3): barycentric
    weights (N, 3) of (a, b, c), clamped into the triangle. Voronoi-region
    classification (Ericson, Real-Time Collision Detection §5.1.5), vectorised."""
    ab, ac = b - a, c - a
    ap, bp, cp = p - a, p - b, p - c
    d1 = np.einsum("ij,ij->i", ab, ap)
    d2 = np.einsum("ij,ij->i", ac, ap)
    d3 = np.einsum("ij,ij->i", ab, bp)
    d4 = np.einsum("ij,ij->i", ac, bp)
    d5 = np.einsum("ij,ij->i", ab, cp)
    d6 = np.einsum("ij,ij->i", ac, cp)
    va = d3 * d6 - d5 * d4
    vb = d5 * d2 - d1 * d6
    vc = d1 * d4 - d3 * d2
    w = np.empty((len(p), 3))
    with np.errstate(divide="ignore", invalid="ignore"):
        # Interior first; the regions below override it in reverse priority, so
        # the earliest test in Ericson's order wins where several hold.
        s = va + vb + vc
        v_in, w_in = vb / s, vc / s
        w[:] = np.stack([1.0 - v_in - w_in, v_in, w_in], axis=1)
        t = (d4 - d3) / ((d4 - d3) + (d5 - d6))
        m = (va <= 0) & (d4 - d3 >= 0) & (d5 - d6 >= 0)
        w[m] = np.stack([np.zeros(m.sum()), 1.0 - t[m], t[m]], axis=1)
        t = d2 / (d2 - d6)
        m = (vb <= 0) & (d2 >= 0) & (d6 <= 0)
        w[m] = np.stack([1.0 - t[m], np.zeros(m.sum()), t[m]], axis=1)
        m = (d6 >= 0) & (d5 <= d6)
        w[m] = (0.0, 0.0, 1.0)
        t = d1 / (d1 - d3)
        m = (vc <= 0) & (d1 >= 0) & (d3 <= 0)
        w[m] = np.stack([1.0 - t[m], t[m], np.zeros(m.sum())], axis=1)
        m = (d3 >= 0) & (d4 <= d3)
        w[m] = (0.0, 1.0, 0.0)
        m = (d1 <= 0) & (d2 <= 0)
        w[m] = (1.0, 0.0, 0.0)
    # Clamp round-off (a point on an edge can come out at -1e-17) and renormalise.
    w = np.clip(np.nan_to_num(w, nan=1.0 / 3.0), 0.0, 1.0)
    return w / w.sum(axis=1, keepdims=True)


def closest_on_surface(points: np.ndarray, vertices: np.ndarray, faces: np.ndarray, k0: int = 8):
    """For every point, the closest point on the triangle surface (vertices, faces).

    Returns host (N,) int32 face index, bary (N, 3) weights of that face's
    corners, distance (N,) metres. Candidates come from a cKDTree over face
    centroids, k nearest at a time; a point is finished once the k-th
    candidate centroid is farther than its best distance plus the largest
    centroid-to-corner radius (no unchecked triangle can then be closer), so
    the result is the exact closest triangle, not a heuristic. Degenerate
    triangles are never hosts.
    """
    points = np.asarray(points, dtype=np.float64)
    tri = vertices[faces]  # (m, 3, 3)
    diag = float(np.linalg.norm(vertices.max(0) - vertices.min(0))) or 1.0
    area2 = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    valid = np.flatnonzero(area2 > _DEGENERATE_AREA * diag**2)
    if len(valid) == 0:
        raise MeshError("every triangle of the coarse level is degenerate")
    tri = tri[valid]
    centroid = tri.mean(axis=1)
    radius = float(np.linalg.norm(tri - centroid[:, None, :], axis=2).max())
    tree = cKDTree(centroid)
    n = len(points)
    host = np.zeros(n, dtype=np.int64)
    bary = np.zeros((n, 3))
    dist = np.full(n, np.inf)
    todo = np.arange(n)
    k = min(k0, len(valid))
    while todo.size:
        cd, idx = tree.query(points[todo], k=k)
        cd, idx = cd.reshape(len(todo), k), idx.reshape(len(todo), k)
        p = np.repeat(points[todo], k, axis=0)
        t = tri[idx.ravel()]
        w = _closest_on_triangles(p, t[:, 0], t[:, 1], t[:, 2])
        q = np.einsum("ij,ijk->ik", w, t)
        d = np.linalg.norm(p - q, axis=1).reshape(len(todo), k)
        j = np.argmin(d, axis=1)
        rows = np.arange(len(todo))
        better = d[rows, j] < dist[todo]
        sel = todo[better]
        host[sel] = idx[rows, j][better]
        bary[sel] = w.reshape(len(todo), k, 3)[rows, j][better]
        dist[sel] = d[rows, j][better]
        if k == len(valid):
            break
        done = cd[:, -1] - radius >= dist[todo]
        todo = todo[~done]
        k = min(2 * k, len(valid))
    return valid[host].astype(np.int32), bary, dist


def _barycentric_matrix(host, bary, faces, n_coarse) -> sp.csr_matrix:
    n = len(host)
    rows = np.repeat(np.arange(n), 3)
    cols = faces[host].ravel()
    return sp.csr_matrix((bary.ravel(), (rows, cols)), shape=(n, n_coarse))


def _lean_on_every_vertex(points, xc, fc, host, bary, dist) -> int:
    """Re-host fine vertices (in place) so that every coarse vertex of a non-degenerate
    triangle gets a non-zero weight: a coarse vertex that no fine vertex leans on has no
    consistent mass (U^T m = 0) and no influence on P(x), a singular degree of freedom.
    Such vertices appear at the corners of holes, of separate pieces and of bow-ties,
    where the closest points of the fine vertices around land on the coarse triangles'
    edges. The fine vertex nearest to such a corner j (one not needed by another
    corner) is embedded at j itself, in j's largest incident triangle: its rest offset
    X_i - X_j is stored in that triangle's frame, so P(X_coarse) = X_fine still holds
    exactly. Returns the number of vertices re-hosted."""
    n_c = len(xc)
    tri = xc[fc]
    area2 = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    diag = float(np.linalg.norm(xc.max(0) - xc.min(0))) or 1.0
    valid = area2 > _DEGENERATE_AREA * diag**2
    in_valid = np.zeros(n_c, dtype=bool)
    in_valid[fc[valid].ravel()] = True
    w = np.bincount(fc[host].ravel(), weights=bary.ravel(), minlength=n_c)
    tiny = 1e-9
    bare = np.flatnonzero((w <= tiny) & in_valid)
    if not len(bare):
        return 0
    tree = cKDTree(points)
    moved = 0
    for j in bare:
        tris = np.flatnonzero(valid & (fc == j).any(axis=1))
        t = int(tris[np.argmax(area2[tris])])
        k = min(len(points), 32)
        _, idx = tree.query(xc[j], k=k)
        for i in np.atleast_1d(idx):
            old = fc[host[i]]
            # leaving its host must not leave another corner bare
            if all(w[c] - b > tiny or b <= tiny for c, b in zip(old, bary[i])):
                break
        else:
            continue
        w[fc[host[i]]] -= bary[i]
        host[i] = t
        bary[i] = (fc[t] == j).astype(np.float64)
        dist[i] = float(np.linalg.norm(points[i] - xc[j]))
        w[j] += 1.0
        moved += 1
    if moved:
        log.debug("embedding: %d fine vertices re-hosted on coarse corners no other leaned on", moved)
    return moved


def embed(fine_level: Level, coarse_level: Level, *, zero_mean_tangent: bool = False) -> Prolongation:
    """Embed every fine vertex at its closest point on the coarse rest surface.

    The row of U holds the barycentric weights of that point in its host
    triangle (three non-zeros, clamped into the triangle, rows sum to one) and
    the remaining rest offset d_i = X_fine_i - (U X_coarse)_i is stored in the
    host frame (§7), so ``P(X_coarse) = X_fine`` to round-off. When the
    closest point is inside its triangle d is normal to it (t_i = 0); points
    whose closest point lies on a coarse edge or corner (outside the coarse
    boundary, on the convex side of a fold) also get a tangential part.

    zero_mean_tangent: make sum_{i hosted by f} m_i t_i = 0 for every coarse
        face f (m = fine masses), keeping exactness: the mass-weighted mean
        tangential offset of each host is moved into U (it lies in the host's
        plane, so it is a shift of barycentric weights that sum to zero). The
        weights may then leave [0, 1]. The normal part cannot be moved into a
        three-point stencil on the host (its corners span no normal
        direction), so sum m_i gamma_i n_f(x) remains; it is zero on flat
        meshes. See ``build_hierarchy`` for what §5.3 needs.
    """
    xc, fc = coarse_level.vertices, coarse_level.faces
    host, bary, dist = closest_on_surface(fine_level.vertices, xc, fc)
    _lean_on_every_vertex(fine_level.vertices, xc, fc, host, bary, dist)
    if zero_mean_tangent:
        U0 = _barycentric_matrix(host, bary, fc, len(xc))
        p0 = _with_offsets(U0, xc, fc, fine_level.vertices, host, bary, dist)
        m = fine_level.mass
        mf = np.bincount(host, weights=m, minlength=len(fc))
        mu = (
            np.stack(
                [np.bincount(host, weights=m * p0.tangent[:, c], minlength=len(fc)) for c in (0, 1)],
                axis=1,
            )
            / np.maximum(mf, np.finfo(np.float64).tiny)[:, None]
        )
        e, b, _ = _face_frames(xc, fc)
        delta = mu[:, :1] * e + mu[:, 1:] * b  # (m_c, 3) mean tangential offset, world
        # Weights shift (-s-r, s, r) with s (X1-X0) + r (X2-X0) = delta.
        e1 = xc[fc[:, 1]] - xc[fc[:, 0]]
        e2 = xc[fc[:, 2]] - xc[fc[:, 0]]
        g11 = np.einsum("ij,ij->i", e1, e1)
        g12 = np.einsum("ij,ij->i", e1, e2)
        g22 = np.einsum("ij,ij->i", e2, e2)
        r1 = np.einsum("ij,ij->i", e1, delta)
        r2 = np.einsum("ij,ij->i", e2, delta)
        det = g11 * g22 - g12 * g12
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(det > 0, (g22 * r1 - g12 * r2) / det, 0.0)
            r = np.where(det > 0, (g11 * r2 - g12 * r1) / det, 0.0)
        shift = np.stack([-s - r, s, r], axis=1)
        weights = bary + shift[host]
        U = _barycentric_matrix(host, weights, fc, len(xc))
    else:
        U = _barycentric_matrix(host, bary, fc, len(xc))
    return _with_offsets(U, xc, fc, fine_level.vertices, host, bary, dist)


def direct(coarse_level: Level, fine_level: Level) -> Prolongation:
    """Direct prolongation from ``coarse_level`` (level l) to ``fine_level``
    (level L): the finest vertices embedded straight into level l's triangles,
    host offsets recomputed between l and L (§7). Same as
    ``embed(fine_level, coarse_level)``.

    Against the composition of per-level operators: both are partitions of
    unity and both reproduce X_L from X_l exactly, but their linear parts
    differ in general (U_direct has three non-zeros per row; U_12 U_01 has up
    to nine for embeddings and the wide Loop stencil for subdivisions). They
    coincide for midpoint subdivision, where U_12 U_01 is the piecewise-linear
    (barycentric) interpolation of the fine vertices in the coarse triangles.
    """
    return embed(fine_level, coarse_level)


def compose(*prolongations: Prolongation) -> Prolongation:
    """One operator from the first prolongation's coarse level to the last
    one's fine level: linear part U = U_{L-1,L} ... U_{l,l+1} (so V and U^T
    compose exactly), host offsets recomputed between the two end levels
    (every finest vertex is hosted by its closest level-l rest triangle), not
    composed from the per-level offsets (§7). ``compose(P_01, P_12)`` maps
    level 0 to level 2. P(X_0) = X_2 holds to round-off.

    The composed operator differs from the nested application
    P_12(P_01(x)) away from the rest shape unless the per-level offsets vanish
    identically (pure subdivision hierarchies, where they are equal).
    """
    if not prolongations:
        raise ValueError("compose needs at least one prolongation")
    for k in range(len(prolongations) - 1):
        a, b = prolongations[k], prolongations[k + 1]
        if a.fine_count != b.coarse_count or not np.allclose(a.fine_rest, b.coarse_rest):
            raise MeshError(f"prolongation {k + 1} does not start on the level prolongation {k} ends on")
    U = prolongations[0].U
    for p in prolongations[1:]:
        U = p.U @ U
    first, last = prolongations[0], prolongations[-1]
    host, bary, dist = closest_on_surface(last.fine_rest, first.coarse_rest, first.coarse_faces)
    return _with_offsets(U.tocsr(), first.coarse_rest, first.coarse_faces, last.fine_rest, host, bary, dist)
