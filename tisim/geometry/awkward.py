"""Awkward cloth meshes of the kinds users bring, made programmatically (for tests and tries).

Each function returns a TriMesh (metres) in the xz plane (y = 0 up to noise), sized
about 0.6 m: an irregular Delaunay disk with sliver triangles, a shirt outline with
0.1 mm slivers, a sheet with round holes and a slit narrower than the contact
thickness, several separate pieces, a bow-tie (two pieces sharing one vertex), a sheet
whose edge lengths grade 10x, and a scan-like noisy sheet; ``sliver_sheet``, a small
square of 0.1 mm slivers (kept out of ``CORPUS``: the remeshing tests' input, too thin for
the default contact thickness). Deterministic (seeded).
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import Delaunay

from tisim.geometry.mesh import TriMesh


def _to_mesh(p2: np.ndarray, tris: np.ndarray, y: np.ndarray | None = None, source: str = "") -> TriMesh:
    """A TriMesh from 2D points (x, z) and triangles, unused points dropped, wound with +y normals."""
    used = np.unique(tris)
    remap = -np.ones(len(p2), dtype=np.int64)
    remap[used] = np.arange(len(used))
    F = remap[tris]
    V = np.zeros((len(used), 3))
    V[:, 0], V[:, 2] = p2[used, 0], p2[used, 1]
    if y is not None:
        V[:, 1] = y[used]
    a, b, c = (V[F[:, k]] for k in range(3))
    flip = np.cross(b - a, c - a)[:, 1] < 0
    F[flip] = F[flip][:, [0, 2, 1]]
    return TriMesh(V, F.astype(np.int64), source=source)


def _delaunay(p2: np.ndarray, keep=None) -> np.ndarray:
    """Delaunay triangles of p2 whose centroid satisfies keep(centroids) (all when None),
    without degenerate (zero-area) ones."""
    tris = Delaunay(p2).simplices.astype(np.int64)
    a, b, c = (p2[tris[:, k]] for k in range(3))
    area = 0.5 * np.abs((b - a)[:, 0] * (c - a)[:, 1] - (b - a)[:, 1] * (c - a)[:, 0])
    ok = area > 1e-14
    if keep is not None:
        ok &= keep((a + b + c) / 3)
    return tris[ok]


def _add_slivers(p2: np.ndarray, tris: np.ndarray, count: int, height: float, rng) -> tuple:
    """Split ``count`` interior triangles (a, b, c) 1-to-3 at a point q ``height`` m off
    the midpoint of ab towards c: (a, b, q) is a sliver ``height`` m high, and q lies
    that close to the triangle on the other side of ab (a pair closer than a contact
    thickness that shares no vertex). Returns (points, triangles)."""
    e = np.sort(tris[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2), axis=1)
    _, inv, counts = np.unique(e, axis=0, return_inverse=True, return_counts=True)
    interior = counts[inv.reshape(-1, 3)] == 2  # (triangles, 3): edge k of the triangle is shared
    order = rng.permutation(len(tris))
    pts, out, used, done = list(p2), tris.tolist(), set(), 0
    for t in order:
        if done == count:
            break
        a_, b_, c_ = tris[t]
        if not interior[t, 0] or used & {a_, b_, c_}:
            continue
        a, b, c = p2[a_], p2[b_], p2[c_]
        m = 0.5 * (a + b)
        nrm = np.array([-(b - a)[1], (b - a)[0]])
        nrm /= np.linalg.norm(nrm)
        if nrm @ (c - m) < 0:
            nrm = -nrm
        q = len(pts)
        pts.append(m + height * nrm)
        out[t] = [a_, b_, q]
        out += [[b_, c_, q], [c_, a_, q]]
        used |= {a_, b_, c_}
        done += 1
    return np.array(pts), np.array(out, dtype=np.int64)


def _jittered(lo, hi, h: float, rng, jitter: float = 0.3) -> np.ndarray:
    x = np.arange(lo[0], hi[0] + 1e-9, h)
    z = np.arange(lo[1], hi[1] + 1e-9, h)
    X, Z = np.meshgrid(x, z, indexing="ij")
    p = np.stack([X.ravel(), Z.ravel()], 1)
    return p + rng.uniform(-jitter * h, jitter * h, p.shape)


def sliver_disk(
    vertex_count: int = 1500, radius: float = 0.3, slivers: int = 12, height: float = 4e-4, seed: int = 0
) -> TriMesh:
    """An irregular Delaunay disk of about ``vertex_count`` vertices with ``slivers``
    sliver triangles ``height`` m high."""
    rng = np.random.default_rng(seed)
    n_b = int(2 * np.sqrt(np.pi * vertex_count))
    th = np.linspace(0, 2 * np.pi, n_b, endpoint=False)
    ring = radius * np.stack([np.cos(th), np.sin(th)], 1)
    # a jittered grid inside the disk: irregular, about vertex_count - n_b points
    h = radius * np.sqrt(np.pi / (vertex_count - n_b))
    p = _jittered((-radius, -radius), (radius, radius), h, rng, jitter=0.4)
    p = p[np.linalg.norm(p, axis=1) < radius - 0.5 * h]
    p2 = np.concatenate([ring, p])
    p2, tris = _add_slivers(p2, _delaunay(p2), slivers, height, rng)
    return _to_mesh(p2, tris, source="sliver_disk")


def _inside(q: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Even-odd ray casting: which points q (k, 2) lie inside the polygon poly (m, 2)."""
    x, y = q[:, 0][:, None], q[:, 1][:, None]
    x0, y0 = poly[:, 0][None], poly[:, 1][None]
    x1, y1 = np.roll(poly[:, 0], -1)[None], np.roll(poly[:, 1], -1)[None]
    cond = (y0 > y) != (y1 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        xc = x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    return ((cond & (x < xc)).sum(axis=1) % 2) == 1


def _resample(poly: np.ndarray, h: float) -> np.ndarray:
    out = []
    for a, b in zip(poly, np.roll(poly, -1, axis=0)):
        k = max(1, int(np.ceil(np.linalg.norm(b - a) / h)))
        out += [a + (b - a) * s for s in np.arange(k) / k]
    return np.array(out)


SHIRT = np.array(
    [
        [-0.12, -0.3],
        [0.12, -0.3],
        [0.12, 0.05],
        [0.22, -0.05],
        [0.3, 0.05],
        [0.15, 0.2],
        [0.05, 0.2],
        [0.0, 0.16],
        [-0.05, 0.2],
        [-0.15, 0.2],
        [-0.3, 0.05],
        [-0.22, -0.05],
        [-0.12, 0.05],
    ]
)


def shirt(h: float = 0.0125, slivers: int = 30, height: float = 1e-4, seed: int = 1) -> TriMesh:
    """A shirt-like outline (about 0.6 m wide) of edge length ~h with ``slivers`` sliver
    triangles ``height`` m high."""
    rng = np.random.default_rng(seed)
    border = _resample(SHIRT, h)
    p = _jittered(SHIRT.min(0), SHIRT.max(0), h, rng)
    ins = _inside(p, SHIRT)
    # keep interior points away from the border
    from scipy.spatial import cKDTree

    far = cKDTree(border).query(p)[0] > 0.5 * h
    p2 = np.concatenate([border, p[ins & far]])
    p2, tris = _add_slivers(p2, _delaunay(p2, lambda c: _inside(c, SHIRT)), slivers, height, rng)
    return _to_mesh(p2, tris, source="shirt")


def holey_sheet(size: float = 0.5, h: float = 0.0125, slit_width: float = 5e-4, seed: int = 2) -> TriMesh:
    """A square sheet with three round holes and a slit ``slit_width`` m wide (its two
    sides closer than a 1 mm contact thickness)."""
    rng = np.random.default_rng(seed)
    half = size / 2
    holes = [(np.array([-0.12, -0.1]), 0.06), (np.array([0.12, -0.08]), 0.04), (np.array([0.0, 0.13]), 0.05)]
    p = _jittered((-half, -half), (half, half), h, rng, jitter=0.2)
    p = p[(np.abs(p) < half - 0.3 * h).all(axis=1)]
    border = _resample(np.array([[-half, -half], [half, -half], [half, half], [-half, half]]), h)
    keep = np.ones(len(p), bool)
    rims = [border]
    for c, r in holes:
        keep &= np.linalg.norm(p - c, axis=1) > r + 0.5 * h
        k = int(2 * np.pi * r / h)
        th = np.linspace(0, 2 * np.pi, k, endpoint=False)
        rims.append(c + r * np.stack([np.cos(th), np.sin(th)], 1))
    # the slit: a thin rectangle from (0.05, -0.22) to (0.2, -0.22), two rows of points
    x0, x1, zc = 0.05, 0.2, -0.22
    keep &= ~((p[:, 0] > x0 - 0.5 * h) & (p[:, 0] < x1 + 0.5 * h) & (np.abs(p[:, 1] - zc) < 0.5 * h))
    xs = np.linspace(x0, x1, int((x1 - x0) / h) + 1)
    rims += [
        np.stack([xs, np.full_like(xs, zc - slit_width / 2)], 1),
        np.stack([xs, np.full_like(xs, zc + slit_width / 2)], 1),
    ]
    p2 = np.concatenate(rims + [p[keep]])

    def solid(cc):
        ok = np.ones(len(cc), bool)
        for c, r in holes:
            ok &= np.linalg.norm(cc - c, axis=1) > r
        ok &= ~((cc[:, 0] > x0) & (cc[:, 0] < x1) & (np.abs(cc[:, 1] - zc) < slit_width / 2))
        return ok

    return _to_mesh(p2, _delaunay(p2, solid), source="holey_sheet")


def _grid(nx: int, nz: int, lo, hi):
    x = np.linspace(lo[0], hi[0], nx)
    z = np.linspace(lo[1], hi[1], nz)
    X, Z = np.meshgrid(x, z, indexing="ij")
    p = np.stack([X.ravel(), Z.ravel()], 1)
    idx = np.arange(nx * nz).reshape(nx, nz)
    a, b, c, d = idx[:-1, :-1].ravel(), idx[1:, :-1].ravel(), idx[1:, 1:].ravel(), idx[:-1, 1:].ravel()
    return p, np.concatenate([np.stack([a, b, c], 1), np.stack([a, c, d], 1)])


def pieces(count: int = 3, n: int = 21, size: float = 0.2, gap: float = 0.03) -> TriMesh:
    """``count`` separate square pieces side by side, ``gap`` m apart."""
    ps, fs, off = [], [], 0
    x0 = -(count * size + (count - 1) * gap) / 2
    for k in range(count):
        lo = (x0 + k * (size + gap), -size / 2)
        p, f = _grid(n, n, lo, (lo[0] + size, size / 2))
        ps.append(p)
        fs.append(f + off)
        off += len(p)
    return _to_mesh(np.concatenate(ps), np.concatenate(fs), source="pieces")


def bow_tie(n: int = 26, size: float = 0.2) -> TriMesh:
    """Two square pieces that share one corner vertex (a non-manifold vertex)."""
    p1, f1 = _grid(n, n, (-size, -size), (0.0, 0.0))
    p2, f2 = _grid(n, n, (0.0, 0.0), (size, size))
    # p2's first vertex (0, 0) is p1's last: merge it
    shared = n * n - 1
    remap = np.arange(n * n) + n * n - 1
    remap[0] = shared
    remap[1:] = np.arange(1, n * n) + n * n - 1
    p = np.concatenate([p1, p2[1:]])
    return _to_mesh(p, np.concatenate([f1, remap[f2]]), source="bow_tie")


def graded_sheet(size: float = 0.5, h_fine: float = 0.006, ratio: float = 10.0, seed: int = 3) -> TriMesh:
    """A square sheet whose edge length grows ``ratio``-fold from one side to the other."""
    rng = np.random.default_rng(seed)
    half = size / 2
    pts = []
    x = -half
    while x <= half + 1e-9:
        s = (x + half) / size
        h = h_fine * ratio**s
        k = max(2, round(size / h) + 1)
        z = np.linspace(-half, half, k)
        pts.append(np.stack([np.full(k, x), z], 1))
        x += h
    p = np.concatenate(pts)
    p[:, 0] = np.clip(p[:, 0], -half, half)
    inner = (np.abs(p) < half - 1e-9).all(axis=1)
    p[inner] += rng.uniform(-0.1, 0.1, (inner.sum(), 2)) * h_fine
    return _to_mesh(p, _delaunay(p), source="graded_sheet")


def scan_sheet(size: float = 0.5, h: float = 0.0135, noise: float = 2e-3, seed: int = 4) -> TriMesh:
    """A scan-like sheet: irregular points, normal noise of ``noise`` m, a few slivers."""
    rng = np.random.default_rng(seed)
    half = size / 2
    p = _jittered((-half, -half), (half, half), h, rng, jitter=0.45)
    p = np.clip(p, -half, half)
    p = np.unique(np.round(p, 9), axis=0)
    p, tris = _add_slivers(p, _delaunay(p), 8, 3e-4, rng)
    y = rng.normal(0.0, noise, len(p))
    return _to_mesh(p, tris, y=y, source="scan_sheet")


def sliver_sheet(size: float = 0.4, h: float = 0.02, slivers: int = 10, height: float = 1e-4, seed: int = 5) -> TriMesh:
    """A jittered square sheet of edge length ~h (about (size / h)^2 vertices) with
    ``slivers`` interior sliver triangles ``height`` m high: small enough for quick
    remeshing tests."""
    rng = np.random.default_rng(seed)
    half = size / 2
    p = _jittered((-half, -half), (half, half), h, rng, jitter=0.25)
    p = p[(np.abs(p) < half - 0.3 * h).all(axis=1)]
    border = _resample(np.array([[-half, -half], [half, -half], [half, half], [-half, half]]), h)
    p2 = np.concatenate([border, p])
    p2, tris = _add_slivers(p2, _delaunay(p2), slivers, height, rng)
    return _to_mesh(p2, tris, source="sliver_sheet")


CORPUS = {
    "sliver_disk": sliver_disk,
    "shirt": shirt,
    "holey_sheet": holey_sheet,
    "pieces": pieces,
    "bow_tie": bow_tie,
    "graded_sheet": graded_sheet,
    "scan_sheet": scan_sheet,
}
