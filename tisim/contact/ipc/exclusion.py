"""Self-contact pairs that are already in contact at rest: left out, or given a contact
thickness of their own.

A user's cloth mesh often has primitives closer than the contact's reach at rest: the
vertex across a sliver triangle and the triangle beyond it, the two lips of a narrow
slit or hole. The barrier cannot treat them with the scene's constants: it needs every
pair farther than the thickness at the start, and a pair within its activation distance
at rest would push the rest shape apart. The rule, applied once at set-up to the
point-triangle and edge-edge pairs of cloth primitives whose rest distance is below
``distance`` (the solver passes the barrier's reach, contact.thickness + contact.dhat):

* **neighbours** (a vertex of one primitive is joined by a mesh edge to a vertex of the
  other: the pairs around a sliver, and at a slit's tips) are left out, as production
  cloth codes do. They can only cross by folding their own one-ring, which is smaller
  than the reach;
* **narrow pairs** (farther apart on the mesh: a slit's two lips, the sides of a narrow
  hole) keep a contact of their own: thickness and activation distance both scaled by
  ``scale`` = NARROW_REACH x (their smallest rest distance) / ``distance``, so that at
  rest every narrow pair is outside its barrier's reach, and the barrier and CCD keep
  them from passing through each other as any other pair. One scale for all of them:
  the solver evaluates them as a second batch with scalar constants. They get no
  friction (lips sliding along each other);
* pairs closer than MIN_NARROW x ``distance`` at rest (a mesh saved folded flat onto
  itself, or two parts of one piece touching) are left out too, with a warning: a
  barrier thinner than that is below what the solver resolves in f32.

The pairs are found once (a broad phase over the rest shape, then exact distances);
the solver's one detection per query sorts its candidates with :meth:`classify`, so the
start check, the barrier, friction and CCD all see the same pairs. Pairs with an
obstacle are never touched, nor pairs between two connected pieces (two cloths, or two
layers that are separate pieces, placed closer than the thickness are refused at the
start: nothing would keep them apart).

Why it is safe: two surface pieces can only start to intersect through a point-triangle
or edge-edge event, and CCD and a barrier prevent those for every pair that is not left
out. So an intersection can only appear between neighbours within ``distance`` of each
other at rest (a fold of a sliver's own neighbourhood, under the reach in size) and it
cannot spread, since growing it takes an event on a pair that is not left out.
Limitations: the narrow pairs' barrier is as thin as the narrowest of them allows (one
scale); on a mesh finer than ``distance`` (edges shorter than the thickness plus dhat)
the neighbours left out cover whole element rings, and element-scale folds there go
unseen: lower the contact thickness then.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

# a narrow pair's reach (thickness + dhat) is this fraction of the smallest narrow rest
# distance: at rest each narrow pair is twice its reach away, outside its barrier
NARROW_REACH = 0.5
# narrow pairs closer than this fraction of the reach at rest are left out (2 um at the
# default 1 mm + 1 mm): a thinner barrier is below f32's resolution on a 1 m cloth
MIN_NARROW = 1e-3

KEEP, NARROW, DROP = 0, 1, 2


def _canonical(kind: str, rows: np.ndarray) -> np.ndarray:
    """(k, 4) int64: rows in one order whatever their corners' order (point-triangle:
    the point, then the triangle's sorted vertices; edge-edge: each edge sorted, the
    smaller edge first)."""
    r = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
    if kind == "pt":
        return np.concatenate([r[:, :1], np.sort(r[:, 1:], axis=1)], axis=1)
    a, b = np.sort(r[:, :2], axis=1), np.sort(r[:, 2:], axis=1)
    swap = (a[:, 0] > b[:, 0]) | ((a[:, 0] == b[:, 0]) & (a[:, 1] > b[:, 1]))
    return np.where(swap[:, None], np.concatenate([b, a], axis=1), np.concatenate([a, b], axis=1))


def _keys(canonical: np.ndarray) -> np.ndarray:
    """One opaque 32-byte key per canonical row, for np.isin."""
    return np.ascontiguousarray(canonical, dtype=np.int64).view(np.dtype((np.void, 32))).ravel()


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


def _neighbours(n: int, edges: np.ndarray, rows: np.ndarray, split: int) -> np.ndarray:
    """(len(rows),) bool: whether a vertex of the first primitive (row[:split]) is a
    vertex of, or joined by an edge to a vertex of, the second (row[split:])."""
    import scipy.sparse as sp

    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    A = sp.coo_matrix((np.ones(2 * len(e), bool), (np.r_[e[:, 0], e[:, 1]], np.r_[e[:, 1], e[:, 0]])), shape=(n, n))
    A = (A + sp.identity(n, dtype=bool, format="coo")).tocsr()
    out = np.zeros(len(rows), dtype=bool)
    for a in range(split):
        for b in range(split, rows.shape[1]):
            out |= np.asarray(A[rows[:, a], rows[:, b]]).ravel()
    return out


class RestExclusion:
    """The cloth self-contact pairs closer than ``distance`` (m) in the rest shape,
    sorted into neighbours left out and narrow pairs with a thinner contact.

    rest: (n, 3) float rest positions, m; faces: (m, 3) int; edges: (k, 2) int (the
    cloth's own, indices < n). ``pt`` / ``ee``: the pairs left out (canonical tuples);
    ``narrow_pt`` / ``narrow_ee``: the narrow pairs; ``count``: all of them;
    ``min_distance``: the smallest rest distance among all (inf when none);
    ``narrow_distance``: the smallest among the narrow pairs; ``scale``: the factor on
    the thickness and dhat of the narrow pairs (1 when there are none).
    ``classify(kind, rows)`` sorts rows of a detection.
    """

    def __init__(self, rest: np.ndarray, faces: np.ndarray, edges: np.ndarray, distance: float):
        rest = np.asarray(rest, dtype=np.float64)
        n = len(rest)
        self.distance = float(distance)
        self.vertex_count = n
        self.pt: set[tuple] = set()
        self.ee: set[tuple] = set()
        self.narrow_pt: set[tuple] = set()
        self.narrow_ee: set[tuple] = set()
        self.min_distance = np.inf
        self.narrow_distance = np.inf
        self.scale = 1.0
        self.involved = np.zeros(n, dtype=bool)
        self._keys: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # kind -> (left out, narrow) keys
        if n == 0 or len(faces) == 0 or not distance > 0:
            return
        for kind, rows, d in self._close_pairs(rest, faces, edges):
            self.min_distance = min(self.min_distance, float(d.min()))
            self.involved[np.unique(rows)] = True
            near = _neighbours(n, edges, rows, 1 if kind == "pt" else 2)
            too_close = d < MIN_NARROW * self.distance
            canon = _canonical(kind, rows)
            left_out, narrow = (self.pt, self.narrow_pt) if kind == "pt" else (self.ee, self.narrow_ee)
            left_out.update(map(tuple, canon[near | too_close].tolist()))
            narrow.update(map(tuple, canon[~near & ~too_close].tolist()))
            self._keys[kind] = (_keys(canon[near | too_close]), _keys(canon[~near & ~too_close]))
            if (~near & ~too_close).any():
                self.narrow_distance = min(self.narrow_distance, float(d[~near & ~too_close].min()))
            if (too_close & ~near).any():
                log.warning(
                    "self-contact: %d pairs of the cloth touch at rest (closer than %.2g m) without being "
                    "neighbours on the mesh: they are not checked against each other",
                    int((too_close & ~near).sum()),
                    MIN_NARROW * self.distance,
                )
        if self.narrow_pt or self.narrow_ee:
            self.scale = min(1.0, NARROW_REACH * self.narrow_distance / self.distance)
        if self.count:
            log.info(
                "self-contact: of the pairs closer than %.3g m at rest, %d neighbours are not checked against each "
                "other and %d narrow pairs (from %.3g m apart) get a contact %.3g times as thick",
                self.distance,
                len(self.pt) + len(self.ee),
                len(self.narrow_pt) + len(self.narrow_ee),
                self.narrow_distance,
                self.scale,
            )

    def _close_pairs(self, rest, faces, edges):
        """(kind, rows (k, 4) int, rest distances (k,)) of the same-piece pairs closer
        than ``distance`` at rest, for kind "pt" and "ee"."""
        import taichi as ti

        from tisim import backend
        from tisim.backend import download, upload
        from tisim.contact.ipc.broad_phase import BroadPhase
        from tisim.geometry.distances import point_triangle_distances, segment_segment_distances

        n = len(rest)
        bp = BroadPhase(n, np.asarray(faces, np.int64), np.asarray(edges, np.int64), initial_capacity=1024)
        x = ti.Vector.ndarray(3, backend.real(), shape=n)
        upload(x, rest.astype(backend.np_real()))
        n_pt, n_ee = bp.detect(x, self.distance)
        piece = _pieces(n, faces)
        out = []
        for kind, rows, dist in (
            ("pt", download(bp.pt)[:n_pt], point_triangle_distances),
            ("ee", download(bp.ee)[:n_ee], segment_segment_distances),
        ):
            rows = rows[(piece[rows] == piece[rows[:, :1]]).all(axis=1)]
            if not len(rows):
                continue
            d = dist(*(rest[rows[:, k]] for k in range(4)))
            close = d < self.distance
            if close.any():
                out.append((kind, rows[close].astype(np.int64), d[close]))
        return out

    @property
    def count(self) -> int:
        return len(self.pt) + len(self.ee) + len(self.narrow_pt) + len(self.narrow_ee)

    @property
    def narrow_count(self) -> int:
        return len(self.narrow_pt) + len(self.narrow_ee)

    def classify(self, kind: str, rows: np.ndarray) -> np.ndarray:
        """(len(rows),) uint8 for rows (k, 4) int of a detection (kind "pt" or "ee",
        vertex ids in the solver's numbering): KEEP for a pair of the scene's contact,
        NARROW for a narrow pair, DROP for a pair left out."""
        code = np.full(len(rows), KEEP, dtype=np.uint8)
        if not self.count or not len(rows):
            return code
        n = self.vertex_count
        cand = np.flatnonzero((rows < n).all(axis=1))
        cand = cand[self.involved[rows[cand]].all(axis=1)]
        if not len(cand):
            return code
        if kind not in self._keys:
            return code
        left_out, narrow = self._keys[kind]
        keys = _keys(_canonical(kind, rows[cand]))
        code[cand[np.isin(keys, narrow)]] = NARROW
        code[cand[np.isin(keys, left_out)]] = DROP
        return code

    def keep(self, kind: str, rows: np.ndarray) -> np.ndarray:
        """(len(rows),) bool: True for the rows of the scene's contact (neither left
        out nor narrow)."""
        return self.classify(kind, rows) == KEEP
