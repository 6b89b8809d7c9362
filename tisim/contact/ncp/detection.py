"""Collision detection for the penetration-based contact solver (numpy/scipy).

Once per time step, surface vertices are tested against

* the analytic colliders (plane, sphere, box, cylinder; possibly moving), using
  their signed distance at the end of the step (time t + h), and
* the surface triangles of the other objects (vertex-triangle; optionally of the
  same object when ``contact.self_collision`` is on), with a broad phase on a
  ``scipy.spatial.cKDTree`` of triangle centroids and an exact point-triangle
  closest point; inside/outside is decided with angle-weighted pseudo-normals.

A pair becomes a contact when its signed distance at the start-of-step positions
q_n or at any of the given predictions (the inertial prediction q_tilde, and the PD
solver's first global-step iterate, which also contains the elastic response) is
below ``contact.margin``. The contact is linearised at q_n (notes §2.5:
d(q) = d0 + n^T Pi (q - q_det) with q_det = q_n): q_n is the last state the contact
solver made (nearly) penetration-free, so its closest point and normal are well
defined, while a prediction of a fast body may lie deep inside an obstacle where the
closest-point normal flips. Testing the predictions as well catches the contacts
the body will make during the step.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy.spatial import cKDTree

from tisim.contact.ncp.frames import ContactSet, tangent_frames

log = logging.getLogger(__name__)

# A contact's key is vertex * _KEY_STRIDE + slot, slot = collider index, or
# _OBJECT_SLOT + other object's index for vertex-triangle contacts.
_KEY_STRIDE = 1 << 16
_OBJECT_SLOT = 1 << 15


def point_triangle_closest(p: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray):
    """Closest points on triangles (a, b, c) to points p, all (k, 3).

    Returns (closest (k, 3), barycentric (k, 3) weights of a, b, c, region (k,) int):
    region 0 = face interior, 1/2/3 = vertex a/b/c, 4/5/6 = edge ab/bc/ca.
    Follows the Voronoi-region test of Ericson, Real-Time Collision Detection, §5.1.5.
    """
    ab, ac, ap = b - a, c - a, p - a
    d1 = np.einsum("kd,kd->k", ab, ap)
    d2 = np.einsum("kd,kd->k", ac, ap)
    bp = p - b
    d3 = np.einsum("kd,kd->k", ab, bp)
    d4 = np.einsum("kd,kd->k", ac, bp)
    cp = p - c
    d5 = np.einsum("kd,kd->k", ab, cp)
    d6 = np.einsum("kd,kd->k", ac, cp)
    vc = d1 * d4 - d3 * d2
    vb = d5 * d2 - d1 * d6
    va = d3 * d6 - d5 * d4
    k = len(p)
    bary = np.zeros((k, 3))
    region = np.full(k, -1, dtype=np.int64)

    def assign(mask, w, code):
        m = mask & (region < 0)
        bary[m] = w[m] if np.ndim(w) == 2 else w
        region[m] = code

    with np.errstate(invalid="ignore", divide="ignore"):
        assign((d1 <= 0) & (d2 <= 0), np.array([1.0, 0.0, 0.0]), 1)
        assign((d3 >= 0) & (d4 <= d3), np.array([0.0, 1.0, 0.0]), 2)
        v = d1 / (d1 - d3)
        assign((vc <= 0) & (d1 >= 0) & (d3 <= 0), np.stack([1 - v, v, 0 * v], 1), 4)
        assign((d6 >= 0) & (d5 <= d6), np.array([0.0, 0.0, 1.0]), 3)
        w = d2 / (d2 - d6)
        assign((vb <= 0) & (d2 >= 0) & (d6 <= 0), np.stack([1 - w, 0 * w, w], 1), 6)
        w2 = (d4 - d3) / ((d4 - d3) + (d5 - d6))
        assign((va <= 0) & ((d4 - d3) >= 0) & ((d5 - d6) >= 0), np.stack([0 * w2, 1 - w2, w2], 1), 5)
        denom = 1.0 / (va + vb + vc)
        vv, ww = vb * denom, vc * denom
        assign(np.ones(k, dtype=bool), np.stack([1 - vv - ww, vv, ww], 1), 0)
    closest = bary[:, 0:1] * a + bary[:, 1:2] * b + bary[:, 2:3] * c
    return closest, bary, region


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.where(n > 0, n, 1.0)


class SurfaceGeometry:
    """Topology of a closed outward-oriented triangle surface for inside/outside tests.

    faces: (f, 3) triangles (global vertex indices). Precomputes the edge list and
    the face -> edge map so that angle-weighted pseudo-normals (Baerentzen and Aanaes,
    IEEE TVCG 2005) can be evaluated at any positions.
    """

    def __init__(self, faces: np.ndarray, vertex_count: int):
        self.faces = np.asarray(faces, dtype=np.int64)
        self.vertex_count = vertex_count
        e = self.faces[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2)  # edges ab, bc, ca
        key = np.sort(e, axis=1)
        uniq, inv = np.unique(key, axis=0, return_inverse=True)
        self.edges = uniq
        self.face_edges = inv.reshape(-1, 3)

    def normals(self, x: np.ndarray):
        """Face unit normals (f, 3), vertex pseudo-normals (n, 3), edge pseudo-normals (e, 3)."""
        a, b, c = (x[self.faces[:, i]] for i in range(3))
        fn = _unit(np.cross(b - a, c - a))

        # interior angles at a, b, c
        def angle(p, q, r):
            u, v = _unit(q - p), _unit(r - p)
            return np.arccos(np.clip(np.einsum("kd,kd->k", u, v), -1.0, 1.0))

        ang = np.stack([angle(a, b, c), angle(b, c, a), angle(c, a, b)], axis=1)
        vn = np.zeros((self.vertex_count, 3))
        en = np.zeros((len(self.edges), 3))
        for d in range(3):
            vn[:, d] = np.bincount(
                self.faces.ravel(),
                weights=(ang * fn[:, d : d + 1]).ravel(),
                minlength=self.vertex_count,
            )
            en[:, d] = np.bincount(self.face_edges.ravel(), weights=np.repeat(fn[:, d], 3), minlength=len(self.edges))
        return fn, _unit(vn), _unit(en)


class ContactDetector:
    """Finds the contacts of one time step.

    model: the :class:`tisim.model.Model` (surface, objects, colliders).
    config: the scene's :class:`tisim.scene.ContactConfig` (mu, margin, objects,
    self_collision). band: extra detection distance as a fraction of the mean surface
    edge length, added to ``config.margin`` (pairs inside the band but not touching
    enter the contact problem with zero force; they catch vertices that the elastic
    response, not predicted by q_tilde, moves into an obstacle within the step).
    """

    def __init__(self, model, config, band: float = 0.0):
        self.model = model
        # collider_gaps(positions, t) -> (c, surface vertices) smallest signed distances over
        # the positions, or None: numpy (set by PDContact to the device's kernel)
        self.collider_gaps = None
        self.config = config
        self.vertex_count = model.vertex_count
        self.surface = np.asarray(model.surface, dtype=np.int64)
        self.surface_vertices = np.unique(self.surface)
        self.vertex_object = np.asarray(model.vertex_object, dtype=np.int64)
        self.surface_object = self.vertex_object[self.surface[:, 0]] if len(self.surface) else np.zeros(0, np.int64)
        self.n_objects = len(model.object_names)
        self.colliders = tuple(model.colliders)
        self.object_contact = bool(config.objects and self.n_objects > 1) or bool(config.self_collision)
        self.geometry = SurfaceGeometry(self.surface, self.vertex_count) if self.object_contact else None
        if config.self_collision and self.object_contact:
            # a vertex never collides with triangles of its own one-ring: those pairs are
            # at distance ~0 by construction
            e = np.sort(self.surface[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2), axis=1)
            e = np.unique(e, axis=0)
            n = self.vertex_count
            ring = np.concatenate(
                [
                    e[:, 0] * n + e[:, 1],
                    e[:, 1] * n + e[:, 0],
                    self.surface_vertices * n + self.surface_vertices,
                ]
            )
            self._ring_keys = np.unique(ring)
        rest = np.asarray(model.initial_positions)
        if len(self.surface):
            el = np.linalg.norm(rest[self.surface] - rest[np.roll(self.surface, 1, axis=1)], axis=2)
            self.edge_length = float(el.mean())
        else:
            self.edge_length = 0.0
        self.margin = float(config.margin) + float(band) * self.edge_length

    def friction_of(self, collider_index: int) -> float:
        f = self.colliders[collider_index].friction
        return float(self.config.mu if f is None else f)

    def detect(self, q_n: np.ndarray, predicted, t_next: float, held: np.ndarray | None = None) -> ContactSet:
        """Contacts for the step ending at time ``t_next``.

        q_n: (n, 3) start-of-step positions, m. predicted: (n, 3) or a list of (n, 3)
        predicted end-of-step positions (q_tilde, iterates), m.
        held: optional (n,) bool of vertices whose motion is prescribed; they get no
        vertex-collider contacts (their row of A^-1 is zero, the contact is void).
        """
        preds = [predicted] if isinstance(predicted, np.ndarray) else list(predicted)
        parts = [self._detect_colliders(q_n, preds, t_next, held)]
        if self.object_contact:
            parts.append(self._detect_objects(q_n, preds, held))
        return ContactSet.concatenate(parts)

    # analytic colliders ------------------------------------------------------
    def _detect_colliders(self, q_n, preds, t_next, held) -> ContactSet:
        sv = self.surface_vertices
        keep = None
        if held is not None:
            keep = ~held[sv]
            sv = sv[keep]
        margin = self.margin
        parts = []
        xn = q_n[sv]
        gaps = None
        if self.collider_gaps is not None and self.colliders:
            gaps = self.collider_gaps([q_n, *preds], t_next)
            if keep is not None:
                gaps = gaps[:, keep]
        else:
            xp = [qp[sv] for qp in preds]
        for ci, col in enumerate(self.colliders):
            # distances of every surface vertex, normals of the candidates only
            if gaps is not None:
                dmin = gaps[ci]
            else:
                dmin = col.distance(xn, t_next)
                for x in xp:
                    dmin = np.minimum(dmin, col.distance(x, t_next))
            cand = dmin <= margin
            if not np.any(cand):
                continue
            v = sv[cand]
            k = len(v)
            xc = xn[cand]
            dn, nn = col.signed_distance(xc, t_next)
            verts = np.repeat(v[:, None], 4, axis=1)
            w = np.zeros((k, 4))
            w[:, 0] = 1.0
            parts.append(
                ContactSet(
                    vertices=verts,
                    weights=w,
                    frames=tangent_frames(nn),
                    gap0=dn,
                    point0=xc,
                    collider=np.full(k, ci, dtype=np.int64),
                    mu=np.full(k, self.friction_of(ci)),
                    surface_velocity=col.velocity_at(xc, t_next),
                    key=v.astype(np.int64) * _KEY_STRIDE + ci,
                )
            )
        return ContactSet.concatenate(parts)

    # other objects' surfaces -------------------------------------------------
    def _object_candidates(self, q_n, preds, held):
        """(vertex, triangle) pairs near enough to touch within the step, with the
        penetration depth allowed and the surface normals (face, vertex, edge); None
        when there are none."""
        F = self.surface
        if len(F) == 0:
            return None
        sv = self.surface_vertices
        tri = q_n[F]  # (f, 3, 3)
        cen = tri.mean(axis=1)
        tri_r = np.linalg.norm(tri - cen[:, None, :], axis=2).max()
        move = max((np.linalg.norm(qp[sv] - q_n[sv], axis=1).max() for qp in preds), default=0.0) if len(sv) else 0.0
        # reach: a triangle whose centroid is farther than this cannot be within
        # margin + motion + one edge of penetration depth of the vertex
        depth = max(self.edge_length, self.margin)
        radius = tri_r + self.margin + 2.0 * move + depth
        tree = cKDTree(cen)
        lists = tree.query_ball_point(q_n[sv], r=radius)
        counts = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        if counts.sum() == 0:
            return None
        pv = np.repeat(sv, counts)
        pt = np.fromiter((j for x in lists for j in x), dtype=np.int64, count=int(counts.sum()))
        vo = self.vertex_object[pv]
        to = self.surface_object[pt]
        same = vo == to
        keep = ~same if self.config.objects else np.zeros(len(pv), dtype=bool)
        fn, vn, en = self.geometry.normals(q_n)
        if self.config.self_collision:
            n = self.vertex_count
            fv = F[pt]
            in_ring = np.zeros(len(pv), dtype=bool)
            for j in range(3):
                in_ring |= np.isin(pv * n + fv[:, j], self._ring_keys)
            # Without its own one-ring, a vertex's closest remaining triangle is not the
            # closest point of the whole surface, so the pseudo-normal sign test is only
            # trusted for surfaces that face each other (as two folded layers do).
            facing = np.einsum("kd,kd->k", vn[pv], fn[pt]) < -0.5
            keep |= same & ~in_ring & facing
        if held is not None:
            keep &= ~(held[pv] & np.all(held[F[pt]], axis=1))
        pv, pt = pv[keep], pt[keep]
        if len(pv) == 0:
            return None
        return pv, pt, depth, (fn, vn, en)

    def _detect_objects(self, q_n, preds, held) -> ContactSet:
        """Surface vertices against other objects' surface triangles (and, with
        self-collision, their own surface beyond the one-ring, where it faces them): the
        closest triangle per vertex, its signed gap and normal by the pseudo-normal test."""
        found = self._object_candidates(q_n, preds, held)
        if found is None:
            return ContactSet.empty()
        pv, pt, depth, (fn, vn, en) = found
        F = self.surface
        p = q_n[pv]
        a, b, c = (q_n[F[pt, i]] for i in range(3))
        cp, bary, region = point_triangle_closest(p, a, b, c)
        dist = np.linalg.norm(p - cp, axis=1)
        # closest triangle per vertex
        order = np.lexsort((dist, pv))
        first = np.ones(len(order), dtype=bool)
        first[1:] = pv[order][1:] != pv[order][:-1]
        sel = order[first]
        pv, pt, cp, bary, region, dist = (
            pv[sel],
            pt[sel],
            cp[sel],
            bary[sel],
            region[sel],
            dist[sel],
        )
        # pseudo-normal of the closest feature decides inside/outside
        pn = fn[pt].copy()
        for code, j in ((1, 0), (2, 1), (3, 2)):
            m = region == code
            pn[m] = vn[F[pt[m], j]]
        for code, j in ((4, 0), (5, 1), (6, 2)):
            m = region == code
            pn[m] = en[self.geometry.face_edges[pt[m], j]]
        diff = q_n[pv] - cp
        sign = np.where(np.einsum("kd,kd->k", diff, pn) < 0, -1.0, 1.0)
        # contact normal: the face normal on the face, else the separation direction
        # (outside) or the pseudo-normal (inside); the gap is then exactly n^T Pi q_n
        normal = np.where(
            (region == 0)[:, None],
            fn[pt],
            np.where(
                (dist > 1e-12 * max(self.edge_length, 1e-30))[:, None] & (sign > 0)[:, None],
                diff / np.where(dist > 0, dist, 1.0)[:, None],
                pn,
            ),
        )
        normal = _unit(normal)
        verts = np.stack([pv, F[pt, 0], F[pt, 1], F[pt, 2]], axis=1)
        w = np.concatenate([np.ones((len(pv), 1)), -bary], axis=1)
        rel_n = np.einsum("kj,kjd->kd", w, q_n[verts])
        gn = np.einsum("kd,kd->k", normal, rel_n)
        gt = gn
        for qp in preds:
            gt = np.minimum(gt, np.einsum("kd,kd->k", normal, np.einsum("kj,kjd->kd", w, qp[verts])))
        # A self-contact deeper than a fraction of an edge is more likely the body's own
        # opposite side (a thin layer) than a penetration.
        same = self.vertex_object[pv] == self.surface_object[pt]
        allowed = np.where(same, 0.25 * self.edge_length, depth)
        cand = (np.minimum(gn, gt) <= self.margin) & (gn > -allowed)
        if not np.any(cand):
            return ContactSet.empty()
        k = int(cand.sum())
        other = self.surface_object[pt[cand]]
        return ContactSet(
            vertices=verts[cand],
            weights=w[cand],
            frames=tangent_frames(normal[cand]),
            gap0=gn[cand],
            point0=rel_n[cand],
            collider=np.full(k, -1, dtype=np.int64),
            mu=np.full(k, float(self.config.mu)),
            surface_velocity=np.zeros((k, 3)),
            key=pv[cand].astype(np.int64) * _KEY_STRIDE + _OBJECT_SLOT + other,
        )
