"""Procedural meshes for demos and tests."""

from __future__ import annotations

import numpy as np

from tisim.geometry.mesh import MeshError, TetMesh, TriMesh, tet_signed_volumes

# The 6 tets of a cube split along its main diagonal 0-7, with corners numbered
# by bits (x, y, z) = (i & 1, i >> 1 & 1, i >> 2 & 1). All six share the
# diagonal, so neighbouring cubes match face to face without alternation.
_CUBE_TETS = np.array(
    [[0, 1, 3, 7], [0, 3, 2, 7], [0, 2, 6, 7], [0, 6, 4, 7], [0, 4, 5, 7], [0, 5, 1, 7]],
    dtype=np.int32,
)


def _five_tets(corner: int) -> np.ndarray:
    """Five tets of a cube: the four corner tets cut off at corners of one parity
    class around a central tet. ``corner`` is 0 or 1 (which parity class is cut)."""
    cut = [c for c in range(8) if bin(c).count("1") % 2 == corner]
    mid = [c for c in range(8) if bin(c).count("1") % 2 != corner]
    return np.array([[c, c ^ 1, c ^ 2, c ^ 4] for c in cut] + [mid], dtype=np.int32)


def box(
    size=(1.0, 1.0, 1.0),
    resolution=(4, 4, 4),
    center=(0.0, 0.0, 0.0),
    tets_per_cell: int = 5,
) -> TetMesh:
    """A box of tetrahedra on a regular grid.

    size: (3,) edge lengths in metres. resolution: (3,) cells along x, y, z.
    center: (3,) centre of the box. tets_per_cell: 5 (alternating split, the
    common choice in the literature: a 65x8x8 bar has 5,346 vertices and 20,800
    tets) or 6 (all cells split along the same diagonal).
    Vertices: prod(resolution + 1); tets: tets_per_cell * prod(resolution).
    """
    if tets_per_cell not in (5, 6):
        raise MeshError(f"tets_per_cell must be 5 or 6, got {tets_per_cell}")
    size = np.asarray(size, dtype=np.float64).reshape(3)
    res = np.asarray(resolution, dtype=np.int64).reshape(3)
    if np.any(size <= 0):
        raise MeshError(f"box size must be positive, got {size.tolist()}")
    if np.any(res < 1):
        raise MeshError(f"box resolution must be at least 1 along each axis, got {res.tolist()}")
    nx, ny, nz = (int(r) for r in res)
    axes = [np.linspace(-s / 2, s / 2, r + 1) for s, r in zip(size, res)]
    gx, gy, gz = np.meshgrid(*axes, indexing="ij")
    vertices = np.stack([gx.ravel(), gy.ravel(), gz.ravel()], axis=1) + np.asarray(center)

    def vid(i, j, k):
        return (i * (ny + 1) + j) * (nz + 1) + k

    i, j, k = np.meshgrid(np.arange(nx), np.arange(ny), np.arange(nz), indexing="ij")
    i, j, k = i.ravel(), j.ravel(), k.ravel()
    corners = np.stack([vid(i + (c & 1), j + (c >> 1 & 1), k + (c >> 2 & 1)) for c in range(8)], axis=1)
    if tets_per_cell == 6:
        tets = corners[:, _CUBE_TETS].reshape(-1, 4)
    else:  # alternate the split so that the diagonals of shared faces agree
        parity = (i + j + k) % 2
        tets = np.where((parity == 0)[:, None, None], corners[:, _five_tets(0)], corners[:, _five_tets(1)]).reshape(
            -1, 4
        )
    mesh = TetMesh(vertices, tets)
    vol = mesh.signed_volumes()
    flip = vol < 0
    if np.any(flip):  # keep every tet positively oriented
        t = mesh.tets.copy()
        t[flip, 2], t[flip, 3] = mesh.tets[flip, 3], mesh.tets[flip, 2]
        mesh = TetMesh(vertices, t)
    return mesh


# ---------------------------------------------------------------------------
# Sphere surfaces


def _icosahedron() -> tuple[np.ndarray, np.ndarray]:
    """Unit icosahedron: (12, 3) vertices, (20, 3) outward faces."""
    p = (1.0 + 5.0**0.5) / 2.0
    v = np.array(
        [[-1, p, 0], [1, p, 0], [-1, -p, 0], [1, -p, 0],
         [0, -1, p], [0, 1, p], [0, -1, -p], [0, 1, -p],
         [p, 0, -1], [p, 0, 1], [-p, 0, -1], [-p, 0, 1]],
        dtype=np.float64,
    )  # fmt: skip
    f = np.array(
        [[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11],
         [1, 5, 9], [5, 11, 4], [11, 10, 2], [10, 7, 6], [7, 1, 8],
         [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9],
         [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1]],
        dtype=np.int32,
    )  # fmt: skip
    return v / np.linalg.norm(v, axis=1, keepdims=True), f


def geodesic_sphere(frequency: int) -> TriMesh:
    """Unit sphere triangulated as a class-I geodesic polyhedron.

    Every face of an icosahedron is split into ``frequency**2`` triangles and the
    new vertices are projected onto the unit sphere. Vertices: 10 f^2 + 2; faces:
    20 f^2; outward (counter-clockwise seen from outside). Deterministic.
    """
    f = int(frequency)
    if f < 1:
        raise MeshError(f"geodesic sphere frequency must be at least 1, got {frequency}")
    V, F = _icosahedron()
    # Barycentric lattice (i, j) with i + j <= f on each face; a point is
    # k A + i B + j C with k = f - i - j.
    ii, jj = np.meshgrid(np.arange(f + 1), np.arange(f + 1), indexing="ij")
    keep = ii + jj <= f
    ii, jj = ii[keep], jj[keep]
    kk = f - ii - jj
    local = -np.ones((f + 1, f + 1), dtype=np.int64)
    local[ii, jj] = np.arange(len(ii))
    tri = []
    for i in range(f):
        for j in range(f - i):
            tri.append([local[i, j], local[i + 1, j], local[i, j + 1]])
            if i + j < f - 1:
                tri.append([local[i + 1, j], local[i + 1, j + 1], local[i, j + 1]])
    tri = np.asarray(tri, dtype=np.int64)
    # Points on shared icosahedron edges appear on two faces: identify them by an
    # exact integer key (the lattice coordinates over the icosahedron's vertex ids).
    keys, points = [], []
    for a, b, c in F:
        w = np.stack([kk, ii, jj], axis=1)  # weights of (a, b, c)
        ids = np.array([a, b, c])
        key = np.zeros((len(w), 12), dtype=np.int64)
        for col in range(3):
            key[np.arange(len(w)), ids[col]] = w[:, col]
        keys.append(key)
        points.append(w @ V[[a, b, c]] / f)
    keys = np.concatenate(keys)
    points = np.concatenate(points)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    # Number vertices in order of first appearance so the result does not depend
    # on the key sort order.
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    vid = rank[inverse]
    vertices = points[first[order]]
    vertices /= np.linalg.norm(vertices, axis=1, keepdims=True)
    n_local = len(ii)
    faces = np.concatenate([vid[tri + face * n_local] for face in range(len(F))])
    return TriMesh(vertices, faces)


def icosphere(subdivisions: int = 2) -> TriMesh:
    """Unit sphere from an icosahedron with every edge split ``2**subdivisions``
    times (the geodesic sphere of frequency 2^s). Vertices: 10*4^s + 2; faces:
    20*4^s; outward."""
    s = int(subdivisions)
    if s < 0:
        raise MeshError(f"icosphere subdivisions must be >= 0, got {subdivisions}")
    return geodesic_sphere(2**s)


# ---------------------------------------------------------------------------
# Tet ball by isosurface stuffing on a body-centred cubic lattice

# Warp thresholds of isosurface stuffing, as fractions of the lattice edge
# length: a lattice vertex closer than this to a surface crossing on one of its
# edges is moved onto the surface, so that no element is cut thinner than this.
_ALPHA_LONG = 0.24999
_ALPHA_SHORT = 0.41189


def _bcc_lattice(lo: np.ndarray, hi: np.ndarray, h: float):
    """Body-centred cubic lattice covering [lo, hi] with spacing h.

    Returns (points (p, 3), tets (t, 4), number of black points): black points
    (listed first) on the grid lo + h*(i, j, k), red points at the cube centres; every tet
    joins one black edge (length h) to one red edge (length h) with four short
    edges (length h*sqrt(3)/2).
    """
    n = np.maximum(np.ceil((hi - lo) / h).astype(np.int64), 1)
    nb = n + 1  # black points per axis
    nr = n  # red points per axis
    black = np.stack(np.meshgrid(*[np.arange(k) for k in nb], indexing="ij"), -1).reshape(-1, 3)
    red = np.stack(np.meshgrid(*[np.arange(k) for k in nr], indexing="ij"), -1).reshape(-1, 3)
    points = np.concatenate([lo + h * black, lo + h * (red + 0.5)])
    n_black = len(black)

    def bid(c):
        return (c[..., 0] * nb[1] + c[..., 1]) * nb[2] + c[..., 2]

    def rid(c):
        return n_black + (c[..., 0] * nr[1] + c[..., 1]) * nr[2] + c[..., 2]

    tets = []
    for a in range(3):
        b, c = (a + 1) % 3, (a + 2) % 3
        ea = np.eye(3, dtype=np.int64)[a]
        # Black edges along a whose four surrounding cube centres all exist.
        lo_i = np.zeros(3, dtype=np.int64)
        hi_i = nb.copy()
        hi_i[a] = nb[a] - 1
        lo_i[b] = lo_i[c] = 1
        hi_i[b], hi_i[c] = nb[b] - 1, nb[c] - 1
        grid = np.stack(np.meshgrid(*[np.arange(lo_i[d], hi_i[d]) for d in range(3)], indexing="ij"), -1).reshape(-1, 3)
        if len(grid) == 0:
            continue
        p0, p1 = bid(grid), bid(grid + ea)
        # Cube centre with lower corner at grid + offset; the four cubes around
        # the edge have offsets 0 or -1 along b and c, visited cyclically.
        ring = []
        for ob, oc in ((0, 0), (-1, 0), (-1, -1), (0, -1)):
            off = np.zeros(3, dtype=np.int64)
            off[b], off[c] = ob, oc
            ring.append(rid(grid + off))
        for q in range(4):
            tets.append(np.stack([p0, p1, ring[q], ring[(q + 1) % 4]], axis=1))
    return points, np.concatenate(tets), n_black


def _warp(points, val, e_all, length, alpha, cut):
    """Isosurface stuffing's warp: a lattice vertex with a violated crossing on an adjacent
    edge (closer than alpha times the edge's length) moves to the closest such crossing and
    becomes a surface vertex. Returns (positions, signs of phi with warped vertices 0)."""
    pos = points.copy()
    sa, sb = np.sign(val[e_all[:, 0]]), np.sign(val[e_all[:, 1]])
    crossing = sa * sb < 0
    ec = e_all[crossing]
    inside_first = val[ec[:, 0]] < 0
    a = np.where(inside_first, ec[:, 0], ec[:, 1])
    b = np.where(inside_first, ec[:, 1], ec[:, 0])
    cp = cut(points[a], points[b])
    lc = length[crossing]
    best = np.full(len(points), np.inf)
    target = np.zeros_like(points)
    for end in (a, b):
        d = np.linalg.norm(cp - points[end], axis=1)
        # Few vertices are violated; a plain loop in crossing order keeps the
        # nearest one, the first of equals (the lattice is symmetric), so the
        # result is deterministic.
        for k in np.nonzero(d < alpha[crossing] * lc)[0]:
            v = end[k]
            if d[k] < best[v]:
                best[v] = d[k]
                target[v] = cp[k]
    warped = np.isfinite(best)
    pos[warped] = target[warped]
    sign = np.sign(val).astype(np.int8)
    sign[warped] = 0

    return pos, sign


def _split_cut_tets(tets, signs, cut_id: dict) -> list[list[int]]:
    """The tets of the inside part of lattice tets cut by the surface: one tet, a pyramid
    or a prism per cut tet, by how many of its vertices are inside (sign < 0)."""

    def cid(u, v):
        return cut_id[(u, v) if u < v else (v, u)]

    extra = []
    for t, sg in zip(tets, signs, strict=True):
        m = [int(v) for v, g in zip(t, sg, strict=True) if g < 0]
        z = [int(v) for v, g in zip(t, sg, strict=True) if g == 0]
        p = [int(v) for v, g in zip(t, sg, strict=True) if g > 0]
        if len(m) == 1:  # one inside vertex: a single tet
            extra.append([m[0], *z, *(cid(m[0], q) for q in p)])
        elif len(m) == 2 and len(p) == 1:  # pyramid over quad (m0, m1, c1, c0)
            c0, c1 = cid(m[0], p[0]), cid(m[1], p[0])
            extra.extend(_split_pyramid(z[0], (m[0], m[1], c1, c0)))
        elif len(m) == 2:  # prism with ends (m0, c00, c01) and (m1, c10, c11)
            extra.extend(
                _split_prism(
                    (m[0], cid(m[0], p[0]), cid(m[0], p[1])),
                    (m[1], cid(m[1], p[0]), cid(m[1], p[1])),
                )
            )
        else:  # three inside vertices: prism between them and their crossings
            extra.extend(_split_prism(tuple(m), tuple(cid(v, p[0]) for v in m)))
    return extra


def _isosurface_stuffing(phi, cut, lo, hi, h: float, count_only: bool = False):
    """Tetrahedralize {phi < 0} by isosurface stuffing (Labelle & Shewchuk 2007).

    phi: (p, 3) -> (p,) signed function, negative inside. cut: (a (k,3) inside,
    b (k,3) outside) -> (k, 3) points with phi = 0 on the segments. lo, hi:
    bounding box of the domain, h: lattice spacing (black edge length).
    Returns (vertices (n, 3), tets (m, 4)), or only n when ``count_only``.

    Quadrilaterals left by cutting a lattice tet are split along the diagonal
    through their smallest global vertex id: both tets sharing the quad see the
    same ids, so the mesh is conforming, and a prism split this way never meets
    the cyclic (Schönhardt) diagonal pattern. This replaces the paper's parity
    rule, so its proven dihedral bounds are not claimed; the generator's tests
    measure the angles instead.
    """
    lo = np.asarray(lo, float) - 2 * h
    hi = np.asarray(hi, float) + 2 * h
    points, tets, _ = _bcc_lattice(lo, hi, h)
    val = phi(points)
    # Only tets touching the inside matter.
    tets = tets[np.any(val[tets] <= 0, axis=1)]

    e_all = np.sort(tets[:, [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]].reshape(-1, 2), axis=1)
    # Unique edges through a scalar key: much faster than np.unique(axis=0).
    key = np.sort(e_all[:, 0] * len(points) + e_all[:, 1])
    key = key[np.r_[True, key[1:] != key[:-1]]]
    e_all = np.stack([key // len(points), key % len(points)], axis=1)
    length = np.linalg.norm(points[e_all[:, 1]] - points[e_all[:, 0]], axis=1)
    alpha = np.where(length > 0.95 * h, _ALPHA_LONG, _ALPHA_SHORT)

    pos, sign = _warp(points, val, e_all, length, alpha, cut)

    # Crossings that survive warping, with ids after the lattice points.
    s = sign[e_all]
    live = s[:, 0] * s[:, 1] < 0
    el = e_all[live]
    inside_first = sign[el[:, 0]] < 0
    a = np.where(inside_first, el[:, 0], el[:, 1])
    b = np.where(inside_first, el[:, 1], el[:, 0])
    cut_pos = cut(points[a], points[b])
    n_pts = len(points)
    cut_id = {(int(u), int(v)): n_pts + k for k, (u, v) in enumerate(el)}
    pos = np.concatenate([pos, cut_pos])

    ts = sign[tets]
    n_minus = (ts < 0).sum(1)
    n_plus = (ts > 0).sum(1)
    out = [tets[(n_minus > 0) & (n_plus == 0)]]
    # A tet with all four vertices on the surface lies inside or outside as a
    # whole; its centroid decides.
    zero = (ts == 0).all(1)
    if np.any(zero):
        zt = tets[zero]
        out.append(zt[phi(pos[zt].mean(axis=1)) < 0])

    cut_tets = (n_minus > 0) & (n_plus > 0)
    if count_only:
        # Every live crossing is used by the cut tets around it; lattice points
        # are used by whole tets and, in cut tets, when not outside.
        ct, cs = tets[cut_tets], ts[cut_tets]
        used = np.concatenate([*(o.ravel() for o in out), ct[cs <= 0]])
        return int(np.count_nonzero(np.bincount(used, minlength=len(points)))) + len(el)

    extra = _split_cut_tets(tets[cut_tets], ts[cut_tets], cut_id)
    if extra:
        out.append(np.asarray(extra, dtype=np.int64))
    cells = np.concatenate(out).astype(np.int64)
    # Keep only the points used, in their original order.
    used = np.zeros(len(pos), dtype=bool)
    used[cells.ravel()] = True
    new_id = np.cumsum(used) - 1
    vertices = pos[used]
    cells = new_id[cells]
    vol = tet_signed_volumes(vertices, cells)
    flip = vol < 0
    cells[flip, 2], cells[flip, 3] = cells[flip, 3].copy(), cells[flip, 2].copy()
    return vertices, cells


def _split_pyramid(apex: int, quad: tuple[int, int, int, int]) -> list[list[int]]:
    """Two tets of a pyramid; the base quad (q0, q1, q2, q3) is split along the
    diagonal through its smallest vertex id."""
    q0, q1, q2, q3 = quad
    if min(q0, q2) < min(q1, q3):
        return [[apex, q0, q1, q2], [apex, q0, q2, q3]]
    return [[apex, q0, q1, q3], [apex, q1, q2, q3]]


def _split_prism(bottom: tuple[int, int, int], top: tuple[int, int, int]) -> list[list[int]]:
    """Three tets of a triangular prism with lateral edges bottom[i]-top[i]; each
    lateral quad is split along the diagonal through its smallest vertex id
    (the rule of Dompierre et al. 1999, which always admits a split)."""
    vs = list(bottom) + list(top)
    k = int(np.argmin(vs))
    # Relabel so that the smallest id is a0: rotate, and swap ends if it is on top.
    if k >= 3:
        bottom, top = top, bottom
        k -= 3
    a = [bottom[(k + i) % 3] for i in range(3)]
    b = [top[(k + i) % 3] for i in range(3)]
    # Both quads at a0 are split through a0: tet (a0, b0, b1, b2) leaves a
    # pyramid with apex a0 over quad (a1, a2, b2, b1).
    return [[a[0], b[0], b[1], b[2]], *_split_pyramid(a[0], (a[1], a[2], b[2], b[1]))]


def ball(radius: float = 0.5, resolution: float = 8, center=(0.0, 0.0, 0.0)) -> TetMesh:
    """A solid ball of tetrahedra with roughly uniform quality.

    radius: metres. resolution: lattice cells across the diameter (a float is
    allowed; the lattice spacing is 2*radius/resolution). center: (3,) metres.

    Built by isosurface stuffing on a body-centred cubic lattice: inside lattice
    tets are kept whole, lattice vertices very close to the sphere are moved onto
    it, and tets crossing the sphere are cut at the exact crossings. Every
    boundary vertex lies on the sphere, so the volume falls short of 4/3 pi r^3
    only by the chordal gap of the surface triangles. Deterministic, positively
    oriented. Vertex count ~ 1.04 s^3 + 4.3 s^2 + 1.2 s for s = resolution, within
    a few percent (4: 161 vertices / 552 tets; 8: 821 / 3,480; 17.6493: 6,951 /
    35,568; 23: 15,081 / 79,464; see ``ball_resolution_for_vertices``). Measured
    dihedral angles stay between 20 and 140 degrees for resolutions 2 to 30.

    References: F. Labelle, J. R. Shewchuk, "Isosurface Stuffing: Fast Tetrahedral
    Meshes with Good Dihedral Angles", SIGGRAPH 2007.
    Limitations: quads are split by vertex id instead of the paper's parity rule,
    so the paper's proven angle bounds (10.7 to 164.8 degrees) are not guaranteed.
    """
    r = float(radius)
    res = float(resolution)
    if not r > 0:
        raise MeshError(f"ball radius must be positive, got {radius}")
    if not res >= 1:
        raise MeshError(f"ball resolution must be at least 1, got {resolution}")
    vertices, tets = _ball_stuffing(r, res)
    return TetMesh(vertices + np.asarray(center, dtype=np.float64).reshape(3), tets)


def _ball_stuffing(r: float, resolution: float, count_only: bool = False):
    h = 2.0 * r / resolution

    def phi(x):
        return np.linalg.norm(x, axis=1) - r

    def cut(a, b):
        # Solve |a + t (b - a)| = r for t in (0, 1), a inside, b outside.
        d = b - a
        dd = np.einsum("ij,ij->i", d, d)
        ad = np.einsum("ij,ij->i", a, d)
        aa = np.einsum("ij,ij->i", a, a)
        t = (-ad + np.sqrt(np.maximum(ad * ad - dd * (aa - r * r), 0.0))) / dd
        p = a + t[:, None] * d
        return p * (r / np.linalg.norm(p, axis=1, keepdims=True))

    # A lattice with a black point at the centre keeps the mesh symmetric.
    k = np.ceil(r / h)
    return _isosurface_stuffing(phi, cut, -k * h * np.ones(3), k * h * np.ones(3), h, count_only)


def ball_resolution_for_vertices(target: int) -> float:
    """The ``ball`` resolution whose mesh has the vertex count closest to ``target``.

    Starts from the fitted count 1.0435 s^3 + 4.305 s^2 + 1.174 s (s = resolution)
    and tries resolutions within +-4% of it in 0.5% steps (the count is not monotone
    in s because the lattice meets the sphere differently). Independent of radius.
    Counts vertices without building the tets (17 counts, about 0.1 s each for
    15k vertices on one core).
    """
    n = int(target)
    if n < 15:
        raise MeshError(f"a ball needs at least 15 vertices, asked for {target}")
    roots = np.roots([1.04348763, 4.30532969, 1.17437512, -float(n)])
    s0 = float(max(r.real for r in roots if abs(r.imag) < 1e-9))
    best_s, best_err = s0, np.inf
    for k in range(-8, 9):
        s = round(max(s0 * (1.0 + 0.005 * k), 1.0), 4)
        err = abs(_ball_stuffing(0.5, s, count_only=True) - n)
        if err < best_err:
            best_s, best_err = s, err
    return best_s


# ---------------------------------------------------------------------------
# Cloth

_AXES = {"x": 0, "y": 1, "z": 2}


def cloth_grid(
    size=(1.0, 1.0),
    resolution=(20, 20),
    center=(0.0, 0.0, 0.0),
    normal: str | int = "y",
) -> TriMesh:
    """A flat rectangular sheet of triangles on a regular grid.

    size: (2,) edge lengths in metres along the two in-plane axes taken in x, y, z
    order (normal "y": x then z; "z": x then y; "x": y then z). resolution: (2,)
    cells along those axes. center: (3,) metres. normal: "x" | "y" | "z" (or 0, 1,
    2): the axis the sheet faces; faces are counter-clockwise seen from the +axis
    side. Each cell is split into two triangles with diagonals alternating in a
    checkerboard, so the sheet has no preferred shear direction.
    Vertices: (r0 + 1)(r1 + 1), numbered with the second in-plane axis fastest;
    faces: 2 r0 r1.
    """
    axis = _AXES.get(normal, normal) if isinstance(normal, str) else int(normal)
    if axis not in (0, 1, 2):
        raise MeshError(f"cloth normal must be 'x', 'y' or 'z', got {normal!r}")
    size = np.asarray(size, dtype=np.float64).reshape(2)
    res = np.asarray(resolution, dtype=np.int64).reshape(2)
    if np.any(size <= 0):
        raise MeshError(f"cloth size must be positive, got {size.tolist()}")
    if np.any(res < 1):
        raise MeshError(f"cloth resolution must be at least 1 along each axis, got {res.tolist()}")
    n0, n1 = (int(r) for r in res)
    u_axis, v_axis = [a for a in range(3) if a != axis]
    gu, gv = np.meshgrid(
        np.linspace(-size[0] / 2, size[0] / 2, n0 + 1),
        np.linspace(-size[1] / 2, size[1] / 2, n1 + 1),
        indexing="ij",
    )
    vertices = np.zeros(((n0 + 1) * (n1 + 1), 3))
    vertices[:, u_axis] = gu.ravel()
    vertices[:, v_axis] = gv.ravel()
    vertices += np.asarray(center, dtype=np.float64).reshape(3)

    i, j = np.meshgrid(np.arange(n0), np.arange(n1), indexing="ij")
    i, j = i.ravel(), j.ravel()
    v00 = i * (n1 + 1) + j
    v10, v01, v11 = v00 + (n1 + 1), v00 + 1, v00 + n1 + 2
    even = (i + j) % 2 == 0
    # Counter-clockwise in the (u, v) plane; diagonal v00-v11 on even cells,
    # v10-v01 on odd ones.
    t0 = np.where(even[:, None], np.stack([v00, v10, v11], 1), np.stack([v00, v10, v01], 1))
    t1 = np.where(even[:, None], np.stack([v00, v11, v01], 1), np.stack([v10, v11, v01], 1))
    faces = np.stack([t0, t1], axis=1).reshape(-1, 3)
    # e_u x e_v = +e_axis only when (u, v, axis) is cyclic; otherwise flip.
    if (u_axis + 1) % 3 != v_axis:
        faces = faces[:, [0, 2, 1]]
    return TriMesh(vertices, faces)


def _cloth_axes(normal: str | int) -> tuple[int, int, int]:
    """(normal axis, first in-plane axis, second in-plane axis), as cloth_grid."""
    axis = _AXES.get(normal, normal) if isinstance(normal, str) else int(normal)
    if axis not in (0, 1, 2):
        raise MeshError(f"cloth normal must be 'x', 'y' or 'z', got {normal!r}")
    u_axis, v_axis = [a for a in range(3) if a != axis]
    return axis, u_axis, v_axis


def cloth_rectangle(
    size=(1.0, 1.0),
    resolution=(20, 20),
    center=(0.0, 0.0, 0.0),
    normal: str | int = "y",
):
    """``cloth_grid`` as a ``ClothMesh`` with texture coordinates.

    Arguments and vertex/face layout as ``cloth_grid``. uv: (n, 2) in [0, 1]^2,
    (0, 0) at the corner with the smallest in-plane coordinates, u along the
    first in-plane axis, v along the second; one UV per vertex (face_uv = faces).
    """
    from tisim.geometry.cloth import ClothMesh

    grid = cloth_grid(size, resolution, center, normal)
    n0, n1 = (int(r) for r in np.asarray(resolution, dtype=np.int64).reshape(2))
    i, j = np.meshgrid(np.arange(n0 + 1), np.arange(n1 + 1), indexing="ij")
    uv = np.stack([i.ravel() / n0, j.ravel() / n1], axis=1)
    return ClothMesh(grid.vertices, grid.faces, uv, grid.faces.copy())


def cloth_disc(
    radius: float = 0.5,
    target_edge: float = 0.05,
    seed: int = 0,
    center=(0.0, 0.0, 0.0),
    normal: str | int = "y",
):
    """An unstructured, irregular triangulation of a flat disc (a ``ClothMesh``).

    radius, target_edge: metres. seed: random seed; the same seed gives the same
    mesh. center: (3,) metres. normal: "x" | "y" | "z" (or 0, 1, 2), the axis
    the disc faces; faces are counter-clockwise seen from the +axis side, with
    in-plane axes as in ``cloth_grid``.

    Boundary points sit on the circle at roughly ``target_edge`` spacing with
    angular jitter; interior points are a hexagonal lattice of spacing
    ``target_edge``, rotated by a random angle and jittered by up to 0.2 of the
    spacing, kept at least half a spacing inside the circle. Their Delaunay
    triangulation (scipy) fills the disc (the boundary points are the convex
    hull); slivers made only of boundary points are removed. Edge lengths vary
    around ``target_edge``; no grid direction dominates, which is the point of
    this mesh: a cloth shape the code has never seen. uv: the disc mapped to
    [0, 1]^2 (u, v = (p / radius + 1) / 2 in the in-plane axes), one per vertex.
    """
    from scipy.spatial import Delaunay

    from tisim.geometry.cloth import ClothMesh

    r, h = float(radius), float(target_edge)
    if not r > 0:
        raise MeshError(f"disc radius must be positive, got {radius}")
    if not 0 < h <= r:
        raise MeshError(f"disc target_edge must be in (0, radius], got {target_edge}")
    _axis, u_axis, v_axis = _cloth_axes(normal)
    rng = np.random.default_rng(seed)
    nb = max(8, int(np.ceil(2 * np.pi * r / h)))
    theta = 2 * np.pi * (np.arange(nb) + rng.uniform(-0.25, 0.25, nb)) / nb
    boundary = r * np.stack([np.cos(theta), np.sin(theta)], axis=1)
    k = int(np.ceil(r / h)) + 1
    i, j = np.meshgrid(np.arange(-k, k + 1), np.arange(-2 * k, 2 * k + 1), indexing="ij")
    lattice = np.stack([h * (i + 0.5 * (j % 2)), h * np.sqrt(3) / 2 * j], -1).reshape(-1, 2)
    phi = rng.uniform(0, 2 * np.pi)
    rot = np.array([[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]])
    interior = lattice @ rot.T + rng.uniform(-0.2 * h, 0.2 * h, lattice.shape)
    interior = interior[np.linalg.norm(interior, axis=1) < r - 0.5 * h]
    pts = np.concatenate([boundary, interior])
    tri = Delaunay(pts).simplices.astype(np.int64)
    p = pts[tri]
    e1, e2 = p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]
    area2 = e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0]
    tri[area2 < 0] = tri[area2 < 0][:, [0, 2, 1]]  # counter-clockwise in (u, v)
    # Quality 4 sqrt(3) A / sum(l^2): 1 for equilateral, -> 0 for slivers.
    l2 = sum(np.sum((p[:, a] - p[:, b]) ** 2, axis=1) for a, b in ((0, 1), (1, 2), (2, 0)))
    quality = 2 * np.sqrt(3) * np.abs(area2) / l2
    sliver = (quality < 0.1) & np.all(tri < nb, axis=1)
    tri = tri[~sliver]
    used = np.unique(tri)
    pts, tri = pts[used], np.searchsorted(used, tri)
    vertices = np.zeros((len(pts), 3))
    vertices[:, u_axis], vertices[:, v_axis] = pts[:, 0], pts[:, 1]
    vertices += np.asarray(center, dtype=np.float64).reshape(3)
    if (u_axis + 1) % 3 != v_axis:  # e_u x e_v = -e_axis: flip to face +axis
        tri = tri[:, [0, 2, 1]]
    uv = (pts / r + 1.0) / 2.0
    return ClothMesh(vertices, tri, uv, tri.copy())


def cloth_sphere(radius: float = 0.5, subdivisions: int = 1, center=(0.0, 0.0, 0.0)):
    """A closed spherical shell (a ``ClothMesh`` without UVs): the ``icosphere`` of
    ``subdivisions`` scaled to ``radius`` (m) about ``center`` ((3,) m). Vertices
    10*4^s + 2, faces 20*4^s, outward. Loop subdivision of it (``tisim refine``)
    moves the even vertices inwards, so refined levels are slightly smaller spheres
    that are nested exactly (no boundary)."""
    from tisim.geometry.cloth import ClothMesh

    if not radius > 0:
        raise MeshError(f"sphere shell radius must be > 0, got {radius}")
    m = icosphere(subdivisions)
    return ClothMesh(m.vertices * float(radius) + np.asarray(center, dtype=np.float64), m.faces)
