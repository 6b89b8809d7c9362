"""Coarser levels by quadric edge-collapse decimation of a fine mesh, and the
clean-up of the needles and slivers it leaves."""

from __future__ import annotations

import logging

import numpy as np

from tisim.geometry.mesh import MeshError
from tisim.geometry.topology import boundary_edges

from .levels import Level
from .uv import uv_at, vertex_uv

log = logging.getLogger(__name__)


# A mesh whose extent across its best-fit plane is at most this fraction of its
# bounding-box diagonal is decimated as exactly flat (see ``_decimation_frame``).
# Covers coordinates rounded to float32 (~6e-8 relative) with margin and is far
# below any relief a cloth has on purpose (1 um on a 1 m sheet).
_FLAT_EXTENT = 1e-6


def _decimation_frame(x: np.ndarray):
    """(y, to_world): the vertices ``x`` (n, 3), metres, centred on their mean,
    rotated onto their principal axes (the smallest last, so a flat mesh's normal
    is the z axis) and scaled to a unit bounding-box diagonal, and the map back.

    Why: Fast-Quadric-Mesh-Simplification's tests are absolute. It solves for the
    optimal collapse point whenever the determinant of the 3x3 quadric is not
    exactly zero, and its error thresholds (1e-9 (iteration + 3)^agg) are in
    squared length units. On a plane through an axis (normal along x, y or z) the
    quadric is exactly singular and an edge collapses to an end or its midpoint at
    zero error; on the same plane turned off the axes (a sheet stood up by a 90
    degree rotation, whose cosine is 6e-17, or tilted by 3 degrees) rounding makes
    the determinant tiny instead of zero, the "optimal" point of the near-singular
    system lands far off in the plane, the collapse is refused as a flip, and
    decimation stalls: a 1,225-vertex square grid turned 3 degrees in its plane and
    stood up, asked for 300 vertices, kept 886. Centring and rotating alone already
    brought that to 311; a mesh flat to ``_FLAT_EXTENT`` of its diagonal also gets
    its out-of-plane coordinate set to exactly zero, so every quadric is exactly
    singular whatever the mesh's orientation (then 308, as lying flat), and the unit scale
    makes the thresholds mean the same for a 10 cm patch and a 10 m sail. The map
    back is a similarity (rotation, scale, shift), so the decimated mesh is valid
    in world coordinates, on the fine mesh's best-fit plane when flat.
    """
    c = x.mean(axis=0)
    _, _, R = np.linalg.svd(x - c, full_matrices=False)  # rows: principal axes
    if np.linalg.det(R) < 0:
        R[2] = -R[2]  # a rotation, not a reflection: faces keep their orientation
    y = (x - c) @ R.T
    scale = float(np.linalg.norm(y.max(axis=0) - y.min(axis=0))) or 1.0
    y /= scale
    if float(np.ptp(y[:, 2])) <= _FLAT_EXTENT:
        y[:, 2] = 0.0

    def to_world(v: np.ndarray) -> np.ndarray:
        return (np.asarray(v, dtype=np.float64) * scale) @ R + c

    return y, to_world


def _manifold(faces: np.ndarray) -> bool:
    """No edge of more than two triangles and no two triangles on the same vertices."""
    e = np.sort(faces[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2), axis=1)
    _, counts = np.unique(e, axis=0, return_counts=True)
    return bool(counts.max(initial=0) <= 2) and len(np.unique(np.sort(faces, axis=1), axis=0)) == len(faces)


def decimate(
    level: Level,
    target_vertices: int,
    *,
    aggressiveness: float = 7.0,
    preserve_border: bool = False,
    areal_density: float | None = None,
) -> Level:
    """A coarser level by quadric edge-collapse decimation (the
    ``fast-simplification`` package, a wrapper of Fast-Quadric-Mesh-Simplification).

    target_vertices: wanted vertex count (the library targets faces; the face
    target is scaled by the mesh's faces-per-vertex ratio and corrected once,
    so the result lands within a few percent). The library may cut a cloth's
    corners and move a few border vertices inwards (measured: up to 4% of the
    side of a 64x64 square decimated to 300 vertices); the embedding keeps
    the fine rest shape exact anyway (tangential offsets). ``preserve_border``
    keeps every border vertex instead (then the border alone bounds how coarse
    the level can get). ``aggressiveness`` is the library's ``agg``; the library
    sees the mesh in its principal frame at unit size (``_decimation_frame``), so
    the result does not depend on how the mesh is turned, placed or scaled. Masses are lumped with
    ``areal_density`` (default: the level's mass/area). UVs: one per vertex (given
    so, or per-corner ones that agree at every vertex, as an OBJ without seams
    loads) are interpolated at the closest fine surface point of every coarse
    vertex (``uv_at``). With seams (a vertex with two different UVs) the coarse
    level gets none (limitation: a coarse triangle may straddle a seam, and
    interpolating across it would smear the texture; a seam-aware transfer would
    have to keep the seam edges through the collapse).
    """
    try:
        import fast_simplification
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise MeshError("decimation needs the 'fast-simplification' package (pip install fast-simplification)") from err
    n = level.vertex_count
    target = int(target_vertices)
    if target < 4 or target >= n:
        raise MeshError(f"cannot decimate a {n}-vertex level to {target_vertices} vertices")
    ratio = level.face_count / n
    x, f = level.vertices, level.faces
    y, to_world = _decimation_frame(x)

    def run(faces_target: int, agg: float = aggressiveness):
        faces_target = int(np.clip(faces_target, 2, level.face_count - 1))
        v, t = fast_simplification.simplify(y, f, target_count=faces_target, agg=agg, preserve_border=preserve_border)
        v = to_world(v)
        t = np.asarray(t, dtype=np.int64)
        t = t[(t[:, 0] != t[:, 1]) & (t[:, 1] != t[:, 2]) & (t[:, 2] != t[:, 0])]
        used = np.unique(t)
        remap = np.full(len(v), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        return np.asarray(v, dtype=np.float64)[used], remap[t]

    v, t = run(round(target * ratio))
    if abs(len(v) - target) > 0.05 * target:
        # Boundary vertices make faces-per-vertex differ between resolutions.
        v, t = run(round(target * ratio * target / max(len(v), 1)))
    if len(t) == 0 or len(v) >= n:
        raise MeshError(f"decimating {n} vertices to {target} failed (got {len(v)} vertices)")
    v, t = collapse_needles(v, t)
    t = flip_slivers(v, t)
    if not _manifold(t):
        # the library can fold a flap of a noisy (scan-like) surface flat onto its
        # neighbour (an edge of three triangles, or two triangles on the same three
        # vertices): a gentler collapse order avoids it
        for agg in (aggressiveness / 2, aggressiveness / 4, 1.0):
            v2, t2 = run(round(target * ratio), agg)
            v2, t2 = collapse_needles(v2, t2)
            t2 = flip_slivers(v2, t2)
            if len(t2) and len(v2) < n and _manifold(t2):
                log.debug("decimation: folded triangles at agg %g; agg %g made a manifold level", aggressiveness, agg)
                v, t = v2, t2
                break
    fine_uv = vertex_uv(level)
    uv = None if fine_uv is None else uv_at(level, fine_uv, v)
    rho = level.areal_density if areal_density is None else float(areal_density)
    coarse = Level.from_mesh(v, t, rho, uv=uv)
    log.debug("decimated %d -> %d vertices (target %d)", n, coarse.vertex_count, target)
    return coarse


def _min_angles(x: np.ndarray, tris: np.ndarray) -> np.ndarray:
    """The smallest interior angle (radians) of each triangle (k, 3)."""
    a, b, c = (x[tris[:, i]] for i in range(3))
    out = np.full(len(tris), np.pi)
    for p, q, r in ((a, b, c), (b, c, a), (c, a, b)):
        u, w = q - p, r - p
        out = np.minimum(out, np.arctan2(np.linalg.norm(np.cross(u, w), axis=1), np.einsum("ij,ij->i", u, w)))
    return out


def collapse_needles(
    x: np.ndarray,
    faces: np.ndarray,
    ratio: float = 0.2,
    max_dihedral_deg: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(vertices, faces) with every edge shorter than ``ratio`` times the median edge
    collapsed where that is safe: the needles quadric decimation leaves in flat regions,
    two vertices a millimetre apart whose triangles put a third vertex that close to a
    triangle it does not share (edge flips cannot help there). An edge (a, b) goes when
    a and b share no neighbour but the edge's own opposite vertices (the surface stays a
    manifold), b is not on the border unless a is and (a, b) is a border edge, the
    triangles around a and b lie within ``max_dihedral_deg`` of one plane (where
    decimation has no curvature to guide it; elsewhere its quadrics placed the vertices
    and a merge would change the surface), and no remaining triangle of b turns over or
    degenerates; b then merges into a, at the midpoint when both are interior or both on
    the border, at a's place otherwise. Vertices are renumbered; unused ones dropped."""
    x = np.array(x, dtype=np.float64)
    faces = np.array(faces, dtype=np.int64)
    alive = np.ones(len(faces), dtype=bool)
    cos_flat = np.cos(np.radians(max_dihedral_deg))

    def edge_lengths(t):
        return np.linalg.norm(x[t[:, [1, 2, 0]]] - x[t], axis=2)

    median = float(np.median(edge_lengths(faces)))
    border = np.zeros(len(x), dtype=bool)
    be = boundary_edges(faces)
    border[be.ravel()] = True
    border_keys = set(map(tuple, np.sort(be, axis=1).tolist()))
    lengths = edge_lengths(faces)
    short = np.argwhere(lengths < ratio * median)
    for f, j in short[np.argsort(lengths[short[:, 0], short[:, 1]], kind="stable")].tolist():
        if not alive[f]:
            continue
        a, b = int(faces[f, j]), int(faces[f, (j + 1) % 3])
        if border[b] and not border[a]:
            a, b = b, a
        if border[b] and tuple(sorted((a, b))) not in border_keys:
            continue  # two border vertices across the interior: would pinch the sheet
        live = np.flatnonzero(alive)
        has_a = np.any(faces[live] == a, axis=1)
        has_b = np.any(faces[live] == b, axis=1)
        shared = live[has_a & has_b]  # the edge's own triangles
        opposite = set(faces[shared].ravel().tolist()) - {a, b}
        nb_a = set(faces[live[has_a]].ravel().tolist()) - {a, b}
        nb_b = set(faces[live[has_b]].ravel().tolist()) - {a, b}
        if nb_a & nb_b != opposite:
            continue  # the link condition: the merge would glue the surface to itself
        around = faces[live[has_a | has_b]]
        nrm = np.cross(x[around[:, 1]] - x[around[:, 0]], x[around[:, 2]] - x[around[:, 0]])
        nrm /= np.maximum(np.linalg.norm(nrm, axis=1), 1e-300)[:, None]
        if float((nrm @ nrm[0]).min()) < cos_flat:
            continue  # curved there
        target = 0.5 * (x[a] + x[b]) if border[a] == border[b] else x[a].copy()
        moved = live[(has_a | has_b) & ~(has_a & has_b)]
        old = faces[moved]
        new = np.where(old == b, a, old)
        p0 = x.copy()
        p0[a] = target
        n_old = np.cross(x[old[:, 1]] - x[old[:, 0]], x[old[:, 2]] - x[old[:, 0]])
        n_new = np.cross(p0[new[:, 1]] - p0[new[:, 0]], p0[new[:, 2]] - p0[new[:, 0]])
        if np.any(np.einsum("ij,ij->i", n_old, n_new) <= 0.05 * np.linalg.norm(n_old, axis=1) ** 2):
            continue  # a triangle would turn over or nearly vanish
        x[a] = target
        faces[moved] = new
        alive[shared] = False
    faces = faces[alive]
    used = np.unique(faces)
    remap = np.full(len(x), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return x[used], remap[faces]


def flip_slivers(
    x: np.ndarray,
    faces: np.ndarray,
    *,
    min_angle_deg: float = 15.0,
    max_dihedral_deg: float = 1.0,
    passes: int = 50,
) -> np.ndarray:
    """Faces improved by Lawson edge flips at thin triangles where the surface is nearly
    flat (vertices unchanged).

    Quadric decimation of a flat region has no error to guide it (every quadric is
    zero there), so it leaves slivers: on a decimated disc, interior triangles 70 mm long
    and 1.2 mm high, whose third vertex then starts within a cloth's contact thickness
    of the neighbouring triangle, an invalid start for the barrier. An interior edge of
    a triangle with an angle below ``min_angle_deg`` is flipped when its two triangles
    are nearly coplanar (normals within ``max_dihedral_deg``, so the surface barely
    changes), the flipped pair keeps their orientation and the flip raises the pair's
    smallest angle (Lawson's criterion); each pass flips a set of edges with no triangle
    in common, worst pairs first, until none is left. Triangles that are not thin stay as
    the decimation made them, and so do slivers along the border (no edge to flip).
    """
    faces = np.array(faces, dtype=np.int64)
    n = len(x)
    limit = np.radians(min_angle_deg)
    cos_dihedral = np.cos(np.radians(max_dihedral_deg))

    def unit_normals(t):
        nrm = np.cross(x[t[:, 1]] - x[t[:, 0]], x[t[:, 2]] - x[t[:, 0]])
        return nrm / np.maximum(np.linalg.norm(nrm, axis=1), 1e-300)[:, None]

    for _ in range(passes):
        m = len(faces)
        side_a = faces.ravel()  # side k = 3 f + j runs from corner j to corner j + 1
        side_b = faces[:, [1, 2, 0]].ravel()
        key = np.minimum(side_a, side_b) * n + np.maximum(side_a, side_b)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        twin = np.flatnonzero(ks[1:] == ks[:-1])  # interior edges: two sides with one key
        s1, s2 = order[twin], order[twin + 1]
        f1, j1, f2, j2 = s1 // 3, s1 % 3, s2 // 3, s2 % 3
        p, q = side_a[s1], side_b[s1]
        ok = (side_a[s2] == q) & (side_b[s2] == p)  # oriented alike
        r = faces[f1, (j1 + 2) % 3]
        s_ = faces[f2, (j2 + 2) % 3]
        old_1 = np.stack([p, q, r], 1)
        old_2 = np.stack([q, p, s_], 1)
        new_1 = np.stack([p, s_, r], 1)
        new_2 = np.stack([s_, q, r], 1)
        n1, n2 = unit_normals(old_1), unit_normals(old_2)
        ok &= np.einsum("ij,ij->i", n1, n2) >= cos_dihedral
        mid = n1 + n2
        ok &= (np.einsum("ij,ij->i", unit_normals(new_1), mid) > 0) & (
            np.einsum("ij,ij->i", unit_normals(new_2), mid) > 0
        )
        old_min = np.minimum(_min_angles(x, old_1), _min_angles(x, old_2))
        ok &= old_min < limit
        ok &= np.minimum(_min_angles(x, new_1), _min_angles(x, new_2)) > old_min + 1e-12
        new_key = np.minimum(r, s_) * n + np.maximum(r, s_)
        at = np.searchsorted(ks, new_key)
        ok &= ks[np.minimum(at, len(ks) - 1)] != new_key  # the new edge must not exist yet
        cand = np.flatnonzero(ok)
        if not len(cand):
            break
        used = np.zeros(m, dtype=bool)
        made: set[int] = set()
        flipped = 0
        for c in cand[np.argsort(old_min[cand], kind="stable")].tolist():
            a, b, k = int(f1[c]), int(f2[c]), int(new_key[c])
            if used[a] or used[b] or k in made:
                continue
            faces[a], faces[b] = new_1[c], new_2[c]
            used[a] = used[b] = True
            made.add(k)
            flipped += 1
        if not flipped:
            break
    return faces
