"""Self-contact pairs excluded because they are already in contact at rest.

A user's cloth mesh often has primitives closer than the contact thickness at rest: the
vertex across a sliver triangle and the triangle beyond it, the two sides of a narrow
slit or hole. The barrier cannot start there (it needs every pair farther than the
thickness), and a pair inside its activation distance at rest would push the rest
shape apart. Production cloth codes ignore such pairs; so does this one:

    a point-triangle or edge-edge pair of cloth primitives is excluded when its
    distance in the rest shape is below ``distance`` (the solver passes the barrier's
    activation distance, contact.thickness + contact.dhat).

The pairs are found once, at set-up (a broad phase over the rest shape, then exact
distances), and the solver drops them from every detection, so the start check, the
barrier, friction and CCD all see the same pairs. Pairs with an obstacle are never
excluded, nor pairs between two connected pieces (two cloths, or two layers that are
separate pieces, placed closer than the thickness are refused at the start: nothing
would keep them from passing through each other).

Why it is safe: two surface pieces can only start to intersect through a
point-triangle or edge-edge event (a vertex crossing a triangle, an edge crossing an
edge), and CCD and the barrier prevent those events for every pair that is not
excluded. So any intersection that ever appears is between primitives that were within
``distance`` of each other at rest, and it cannot spread to others: to grow it must
cross a pair that is not excluded. For a sliver, such a crossing is a fold of the
sliver's own neighbourhood, sub-millimetre in size; for a slit, the slit's lips may
overlap each other where they were within ``distance`` (as a real slit in cloth can).
Limitations: two layers of one connected piece that lie within ``distance`` at rest (a
mesh saved folded flat) are excluded too, and may pass through each other there; on a mesh finer than ``distance`` (edges shorter than the thickness plus
dhat) the excluded set covers whole element rings, and folds at the element scale
there go unseen; the contact thickness should then be lowered.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def _canonical_pt(rows: np.ndarray) -> list[tuple]:
    return [(int(r[0]),) + tuple(sorted(int(i) for i in r[1:])) for r in rows]


def _canonical_ee(rows: np.ndarray) -> list[tuple]:
    out = []
    for r in rows:
        a = tuple(sorted((int(r[0]), int(r[1]))))
        b = tuple(sorted((int(r[2]), int(r[3]))))
        out.append(a + b if a <= b else b + a)
    return out


def _pieces(n: int, faces: np.ndarray) -> np.ndarray:
    """(n,) int: the connected piece of each vertex (through shared triangle edges or
    vertices)."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    f = np.asarray(faces, dtype=np.int64)
    r = np.concatenate([f[:, 0], f[:, 1], f[:, 2]])
    c = np.concatenate([f[:, 1], f[:, 2], f[:, 0]])
    A = sp.coo_matrix((np.ones(len(r)), (r, c)), shape=(n, n))
    return connected_components(A, directed=False)[1]


class RestExclusion:
    """The cloth self-contact pairs closer than ``distance`` (m) in the rest shape.

    rest: (n, 3) float rest positions, m; faces: (m, 3) int; edges: (k, 2) int (the
    cloth's own, indices < n). ``count`` is the number of excluded pairs and
    ``min_distance`` the smallest rest distance among them (inf when none).
    ``keep(kind, rows)`` gives a bool mask of the rows (kind "pt" or "ee", int rows of
    4 vertex ids in the solver's numbering) that are not excluded.
    """

    def __init__(self, rest: np.ndarray, faces: np.ndarray, edges: np.ndarray, distance: float):
        import taichi as ti

        from tisim import backend
        from tisim.backend import download, upload
        from tisim.contact.ipc.broad_phase import BroadPhase
        from tisim.geometry.distances import point_triangle_distances, segment_segment_distances

        rest = np.asarray(rest, dtype=np.float64)
        n = len(rest)
        self.distance = float(distance)
        self.vertex_count = n
        self.pt: set[tuple] = set()
        self.ee: set[tuple] = set()
        self.min_distance = np.inf
        self.involved = np.zeros(n, dtype=bool)
        if n == 0 or len(faces) == 0 or not distance > 0:
            return
        bp = BroadPhase(n, np.asarray(faces, np.int64), np.asarray(edges, np.int64), initial_capacity=1024)
        x = ti.Vector.ndarray(3, backend.real(), shape=n)
        upload(x, rest.astype(backend.np_real()))
        n_pt, n_ee = bp.detect(x, self.distance)
        pt_rows, ee_rows = (download(bp.pt)[:n_pt], download(bp.ee)[:n_ee])
        piece = _pieces(n, faces)
        pt_rows = pt_rows[(piece[pt_rows] == piece[pt_rows[:, :1]]).all(axis=1)]
        ee_rows = ee_rows[(piece[ee_rows] == piece[ee_rows[:, :1]]).all(axis=1)]
        for _kind, rows, dist, store, canon in (
            ("pt", pt_rows, point_triangle_distances, self.pt, _canonical_pt),
            ("ee", ee_rows, segment_segment_distances, self.ee, _canonical_ee),
        ):
            if not len(rows):
                continue
            d = dist(*(rest[rows[:, k]] for k in range(4)))
            close = rows[d < self.distance]
            if len(close):
                self.min_distance = min(self.min_distance, float(d[d < self.distance].min()))
                store.update(canon(close))
                self.involved[np.unique(close)] = True
        if self.count:
            log.info(
                "self-contact: %d point-triangle and %d edge-edge pairs closer than %.3g m at rest are "
                "not checked against each other (the smallest at %.3g m)",
                len(self.pt),
                len(self.ee),
                self.distance,
                self.min_distance,
            )

    @property
    def count(self) -> int:
        return len(self.pt) + len(self.ee)

    def keep(self, kind: str, rows: np.ndarray) -> np.ndarray:
        """(len(rows),) bool: False for the excluded pairs among rows (k, 4) int."""
        keep = np.ones(len(rows), dtype=bool)
        if not self.count or not len(rows):
            return keep
        n = self.vertex_count
        cand = np.flatnonzero((rows < n).all(axis=1))
        cand = cand[self.involved[rows[cand]].all(axis=1)]
        if not len(cand):
            return keep
        store, canon = (self.pt, _canonical_pt) if kind == "pt" else (self.ee, _canonical_ee)
        keys = canon(rows[cand])
        keep[cand] = [k not in store for k in keys]
        return keep
