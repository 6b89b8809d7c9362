"""C-IPC distances, distance types, derivatives, mollifier and closest points against ipctk.

Every @ti.func of tisim.contact.ipc.distance is evaluated in a batch kernel on random
configurations and on degenerate ones, and compared entry by entry with IPC Toolkit
(ipctk 1.6) at 1e-10 relative (f64).

On ties (degenerate configurations with several closest features) the distance type is
not unique: there the test checks that our type is *a* closest feature (ipctk's distance
evaluated with our type equals ipctk's automatic distance) and compares derivatives with
ipctk's for our type.

No ``from __future__ import annotations`` here: Taichi reads the test kernels'
annotations when they are decorated.
"""

import numpy as np
import pytest
import taichi as ti

ipctk = pytest.importorskip("ipctk")

from tisim.contact.ipc import distance as dist

RTOL = 1e-10


@ti.func
def _row3(X: ti.template(), k, i):
    return ti.Vector([X[k, i, 0], X[k, i, 1], X[k, i, 2]])


# Several small kernels rather than one per pair kind: Taichi's compile time grows
# faster than linearly with the size of a kernel.


@ti.kernel
def _types_pt(X: ti.types.ndarray(), types: ti.types.ndarray()):
    for k in range(X.shape[0]):
        p, t0, t1, t2 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        types[k, 0] = dist.point_triangle_distance_type(p, t0, t1, t2)
        types[k, 1] = dist.point_edge_distance_type(p, t0, t1)


@ti.kernel
def _values_pt(
    X: ti.types.ndarray(),
    dtype: ti.types.ndarray(),
    D: ti.types.ndarray(),
    B: ti.types.ndarray(),
):
    for k in range(X.shape[0]):
        p, t0, t1, t2 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        D[k, 2] = dist.point_triangle_distance(p, t0, t1, t2, dtype[k])
        D[k, 3] = dist.point_edge_distance(p, t0, t1)
        D[k, 4] = dist.point_plane_distance(p, t0, t1, t2)
        D[k, 5] = dist.point_line_distance(p, t0, t1)
        b = dist.point_triangle_closest_point(p, t0, t1, t2, dtype[k])
        B[k, 0] = b[0]
        B[k, 1] = b[1]


@ti.kernel
def _grad_pt(
    X: ti.types.ndarray(),
    dtype: ti.types.ndarray(),
    D: ti.types.ndarray(),
    G: ti.types.ndarray(),
):
    for k in range(X.shape[0]):
        p, t0, t1, t2 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        d, g = dist.point_triangle_distance_gradient(p, t0, t1, t2, dtype[k])
        D[k, 1] = d
        for i in range(12):
            G[k, 1, i] = g[i]


@ti.kernel
def _hess_pt(
    X: ti.types.ndarray(),
    dtype: ti.types.ndarray(),
    D: ti.types.ndarray(),
    G: ti.types.ndarray(),
    H: ti.template(),
):
    for k in range(X.shape[0]):
        p, t0, t1, t2 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        for i, j in ti.ndrange(12, 12):
            H[k, i, j] = 0.0
        d, g = dist.point_triangle_distance_hessian_add(p, t0, t1, t2, dtype[k], H, k, 1.0)
        D[k, 0] = d
        for i in range(12):
            G[k, 0, i] = g[i]


@ti.kernel
def _types_ee(X: ti.types.ndarray(), types: ti.types.ndarray()):
    for k in range(X.shape[0]):
        a0, a1, b0, b1 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        types[k, 0] = dist.edge_edge_distance_type(a0, a1, b0, b1)
        types[k, 1] = dist.edge_edge_parallel_distance_type(a0, a1, b0, b1)


@ti.kernel
def _values_ee(
    X: ti.types.ndarray(),
    dtype: ti.types.ndarray(),
    D: ti.types.ndarray(),
    B: ti.types.ndarray(),
):
    for k in range(X.shape[0]):
        a0, a1, b0, b1 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        D[k, 2] = dist.edge_edge_distance(a0, a1, b0, b1, dtype[k])
        D[k, 6] = dist.edge_edge_mollifier_threshold(a0, a1, b0, b1)
        D[k, 7] = dist.edge_edge_cross_squarednorm(a0, a1, b0, b1)
        D[k, 8] = dist.line_line_distance(a0, a1, b0, b1)
        st = dist.edge_edge_closest_point(a0, a1, b0, b1, dtype[k])
        B[k, 0] = st[0]
        B[k, 1] = st[1]


@ti.kernel
def _grad_ee(
    X: ti.types.ndarray(),
    dtype: ti.types.ndarray(),
    D: ti.types.ndarray(),
    G: ti.types.ndarray(),
):
    for k in range(X.shape[0]):
        a0, a1, b0, b1 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        d, g = dist.edge_edge_distance_gradient(a0, a1, b0, b1, dtype[k])
        D[k, 1] = d
        for i in range(12):
            G[k, 1, i] = g[i]


@ti.kernel
def _hess_ee(
    X: ti.types.ndarray(),
    dtype: ti.types.ndarray(),
    D: ti.types.ndarray(),
    G: ti.types.ndarray(),
    H: ti.template(),
):
    for k in range(X.shape[0]):
        a0, a1, b0, b1 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        for i, j in ti.ndrange(12, 12):
            H[k, i, j] = 0.0
        d, g = dist.edge_edge_distance_hessian_add(a0, a1, b0, b1, dtype[k], H, k, 1.0)
        D[k, 0] = d
        for i in range(12):
            G[k, 0, i] = g[i]


@ti.kernel
def _mollifier_ee(
    X: ti.types.ndarray(),
    eps_x: ti.types.ndarray(),
    D: ti.types.ndarray(),
    G: ti.types.ndarray(),
    HM: ti.template(),
):
    for k in range(X.shape[0]):
        a0, a1, b0, b1 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        for i, j in ti.ndrange(12, 12):
            HM[k, i, j] = 0.0
        m, gm = dist.edge_edge_mollifier_hessian_add(a0, a1, b0, b1, eps_x[k], HM, k, 1.0)
        m1, gm1 = dist.edge_edge_mollifier_gradient(a0, a1, b0, b1, eps_x[k])
        D[k, 3] = m
        D[k, 4] = m1
        D[k, 5] = dist.edge_edge_mollifier(a0, a1, b0, b1, eps_x[k])
        for i in range(12):
            G[k, 2, i] = gm[i]
            G[k, 3, i] = gm1[i]


class _Batch:
    """Holds the Hessian fields of the evaluation kernels (allocated once per session)."""

    cap = 512

    def __init__(self):
        self.H = ti.field(ti.f64, (self.cap, 12, 12))
        self.HM = ti.field(ti.f64, (self.cap, 12, 12))


@pytest.fixture(scope="module")
def batch(taichi_backend):
    return _Batch()


def eval_pt(batch, X, forced=None):
    """Types of X (k, 4, 3) and every point-triangle function, at our type or ``forced``."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    k = len(X)
    assert k <= batch.cap
    types = np.zeros((k, 2), np.int32)
    _types_pt(X, types)
    dtype = np.ascontiguousarray(types[:, 0] if forced is None else np.asarray(forced, np.int32))
    D = np.zeros((k, 6))
    G = np.zeros((k, 2, 12))
    B = np.zeros((k, 2))
    _values_pt(X, dtype, D, B)
    _grad_pt(X, dtype, D, G)
    _hess_pt(X, dtype, D, G, batch.H)
    return {"type": types[:, 0], "pe_type": types[:, 1], "D": D, "G": G, "H": batch.H.to_numpy()[:k], "B": B}


def eval_ee(batch, X, forced=None, eps_x=None):
    """Types of X (k, 4, 3) and every edge-edge function, at our type or ``forced``;
    the mollifier with thresholds eps_x (k,) (default 1)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    k = len(X)
    assert k <= batch.cap
    types = np.zeros((k, 2), np.int32)
    _types_ee(X, types)
    dtype = np.ascontiguousarray(types[:, 0] if forced is None else np.asarray(forced, np.int32))
    eps_x = np.ones(k) if eps_x is None else np.ascontiguousarray(eps_x, np.float64)
    D = np.zeros((k, 9))
    G = np.zeros((k, 4, 12))
    B = np.zeros((k, 2))
    _values_ee(X, dtype, D, B)
    _grad_ee(X, dtype, D, G)
    _hess_ee(X, dtype, D, G, batch.H)
    _mollifier_ee(X, eps_x, D, G, batch.HM)
    return {
        "type": types[:, 0],
        "par_type": types[:, 1],
        "D": D,
        "G": G,
        "H": batch.H.to_numpy()[:k],
        "HM": batch.HM.to_numpy()[:k],
        "B": B,
    }


def _close(a, b, scale, rtol=RTOL):
    """|a - b| <= rtol * scale entry-wise, scale the reference's magnitude (>= tiny)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return np.all(np.abs(a - b) <= rtol * max(float(scale), 1e-300))


PT = ipctk.PointTriangleDistanceType
EE = ipctk.EdgeEdgeDistanceType


def _pt_ref(X, t):
    return (
        ipctk.point_triangle_distance(*X, PT(t)),
        ipctk.point_triangle_distance_gradient(*X, PT(t)),
        ipctk.point_triangle_distance_hessian(*X, PT(t)),
    )


def _ee_ref(X, t):
    return (
        ipctk.edge_edge_distance(*X, EE(t)),
        ipctk.edge_edge_distance_gradient(*X, EE(t)),
        ipctk.edge_edge_distance_hessian(*X, EE(t)),
    )


def _check_derivs(res, k, ref, what):
    d_ref, g_ref, H_ref = ref
    scale_d = max(abs(d_ref), 1e-300)
    for col in range(3):
        assert _close(res["D"][k, col], d_ref, scale_d), (what, col, res["D"][k, col], d_ref)
    gs = np.abs(g_ref).max()
    hs = np.abs(H_ref).max()
    assert _close(res["G"][k, 0], g_ref, gs), (what, res["G"][k, 0], g_ref)
    assert _close(res["G"][k, 1], g_ref, gs), (what, res["G"][k, 1], g_ref)
    assert _close(res["H"][k], H_ref, hs), (what, np.abs(res["H"][k] - H_ref).max(), hs)


# ---------------------------------------------------------------------------------
# random configurations


def test_point_triangle_random_matches_ipctk(batch, rng):
    n = 150
    X = rng.normal(size=(n, 4, 3))
    res = eval_pt(batch, X)
    ref_types = np.array([int(ipctk.point_triangle_distance_type(*x)) for x in X])
    np.testing.assert_array_equal(res["type"], ref_types)
    assert len(set(ref_types)) == 7  # every type is exercised
    for k, x in enumerate(X):
        _check_derivs(res, k, _pt_ref(x, ref_types[k]), f"PT {k} type {ref_types[k]}")
        assert _close(res["D"][k, 3], ipctk.point_edge_distance(x[0], x[1], x[2]), res["D"][k, 3])
        assert res["pe_type"][k] == int(ipctk.point_edge_distance_type(x[0], x[1], x[2]))
        assert _close(res["D"][k, 4], ipctk.point_plane_distance(*x), res["D"][k, 4])
        assert _close(res["D"][k, 5], ipctk.point_line_distance(x[0], x[1], x[2]), res["D"][k, 5])
        if ref_types[k] == int(PT.P_T):
            assert _close(res["B"][k], ipctk.point_triangle_closest_point(*x), 1.0)


@pytest.mark.parametrize("dtype", range(7))
def test_point_triangle_every_type_formula_matches_ipctk(batch, rng, dtype):
    """Each type's formula (forced, whatever the closest feature) and its derivatives."""
    X = rng.normal(size=(40, 4, 3))
    res = eval_pt(batch, X, forced=np.full(len(X), dtype))
    for k, x in enumerate(X):
        _check_derivs(res, k, _pt_ref(x, dtype), f"PT forced {dtype}")
    assert np.abs(res["H"]).max() > 0.1  # non-trivial Hessians


def test_edge_edge_random_matches_ipctk(batch, rng):
    n = 200
    X = rng.normal(size=(n, 4, 3))
    # shorten some edges so that endpoint types occur often
    X[: n // 2, 1] = X[: n // 2, 0] + 0.3 * (X[: n // 2, 1] - X[: n // 2, 0])
    res = eval_ee(batch, X)
    ref_types = np.array([int(ipctk.edge_edge_distance_type(*x)) for x in X])
    np.testing.assert_array_equal(res["type"], ref_types)
    assert len(set(ref_types)) == 9
    for k, x in enumerate(X):
        _check_derivs(res, k, _ee_ref(x, ref_types[k]), f"EE {k} type {ref_types[k]}")
        assert _close(res["D"][k, 8], ipctk.line_line_distance(*x), res["D"][k, 8])
        if ref_types[k] == int(EE.EA_EB):
            assert _close(res["B"][k], ipctk.edge_edge_closest_point(*x), 1.0)


@pytest.mark.parametrize("dtype", range(9))
def test_edge_edge_every_type_formula_matches_ipctk(batch, rng, dtype):
    X = rng.normal(size=(40, 4, 3))
    res = eval_ee(batch, X, forced=np.full(len(X), dtype))
    for k, x in enumerate(X):
        _check_derivs(res, k, _ee_ref(x, dtype), f"EE forced {dtype}")
    assert np.abs(res["H"]).max() > 0.1


# ---------------------------------------------------------------------------------
# degenerate configurations


def _pt_degenerate():
    t0, t1, t2 = np.array([0.0, 0, 0]), np.array([1.0, 0, 0]), np.array([0.0, 1, 0])
    n = np.array([0.0, 0, 1])
    c = [
        0.3 * t0 + 0.7 * t1,  # exactly on edge E0
        0.5 * t1 + 0.5 * t2,  # exactly on edge E1 (the hypotenuse)
        t1.copy(),  # on a vertex
        t2 + 0.0,  # on a vertex
        np.array([0.2, 0.3, 0.0]),  # coplanar, inside
        np.array([1.5, 0.5, 0.0]),  # coplanar, outside (edge E1 region)
        np.array([-0.5, -0.5, 0.0]),  # coplanar, outside (vertex t0 region)
        np.array([0.5, -0.7, 0.0]),  # coplanar, outside (edge E0 region)
        np.array([0.5, 0.0, 0.4]),  # above an edge: face / edge region boundary
        np.array([0.0, 0.0, 0.4]),  # above a vertex: face / edge / vertex boundary
        np.array([0.5, 0.5, 0.3]),  # above the hypotenuse
        np.array([-0.3, 0.0, 0.2]),  # on the line of E0 extended: edge / vertex boundary
        0.25 * t0 + 0.25 * t1 + 0.5 * t2 + 1e-9 * n,  # nearly on the face
    ]
    X = [np.stack([p, t0, t1, t2]) for p in c]
    # scaled and moved copies (the formulas must not assume unit size)
    R = np.linalg.qr(np.random.default_rng(7).normal(size=(3, 3)))[0]
    X += [1e-3 * x @ R.T + np.array([0.2, -0.1, 0.05]) for x in X]
    return np.array(X)


def test_point_triangle_degenerate(batch):
    X = _pt_degenerate()
    res = eval_pt(batch, X)
    for k, x in enumerate(X):
        t = int(res["type"][k])
        d_auto = ipctk.point_triangle_distance(*x)
        scale = np.abs(x).max() ** 2
        # our type is a closest feature: same distance as ipctk's own choice
        assert abs(ipctk.point_triangle_distance(*x, PT(t)) - d_auto) <= RTOL * scale, (k, t)
        assert abs(res["D"][k, 0] - d_auto) <= RTOL * scale, (k, res["D"][k, 0], d_auto)
        _d_ref, g_ref, H_ref = _pt_ref(x, t)
        gs = max(np.abs(g_ref).max(), np.sqrt(scale))
        assert _close(res["G"][k, 0], g_ref, gs), (k, t, res["G"][k, 0], g_ref)
        assert _close(res["H"][k], H_ref, np.abs(H_ref).max()), (k, t)
    # unambiguous ones must agree with ipctk's type
    for k in (4, 5, 6, 7, 12):
        assert res["type"][k] == int(ipctk.point_triangle_distance_type(*X[k])), k


def _ee_degenerate():
    rng = np.random.default_rng(3)
    X = [
        # parallel, offset, overlapping in projection
        [[0, 0, 0], [1, 0, 0], [0.3, 0.1, 0.05], [1.6, 0.1, 0.05]],
        # parallel, anti-parallel orientation
        [[0, 0, 0], [1, 0, 0], [1.6, 0.1, 0.0], [0.3, 0.1, 0.0]],
        # parallel, disjoint along the axis (endpoint-endpoint)
        [[0, 0, 0], [1, 0, 0], [1.5, 0.2, 0.1], [2.5, 0.2, 0.1]],
        # collinear, overlapping (distance 0)
        [[0, 0, 0], [1, 0, 0], [0.5, 0, 0], [1.5, 0, 0]],
        # collinear, with a gap
        [[0, 0, 0], [1, 0, 0], [1.25, 0, 0], [2, 0, 0]],
        # coincident endpoints (ea1 == eb0)
        [[0, 0, 0], [1, 0, 0], [1, 0, 0], [1.3, 0.7, 0.2]],
        # crossing (intersecting) edges
        [[0, 0, 0], [1, 0, 0], [0.5, -0.5, 0], [0.5, 0.5, 0]],
        # T-junction: eb0 on the interior of ea
        [[0, 0, 0], [1, 0, 0], [0.4, 0, 0], [0.4, 0.8, 0.3]],
        # endpoint of eb exactly above ea's endpoint
        [[0, 0, 0], [1, 0, 0], [0, 0, 0.3], [0, 0.9, 0.6]],
        # coplanar, non-parallel, not touching
        [[0, 0, 0], [1, 0, 0], [1.2, 0.1, 0], [2, 1, 0]],
        # zero-length edge
        [[0.2, 0.3, 0.1], [0.2, 0.3, 0.1], [0, 0, 0], [1, 0, 0]],
    ]
    X = [np.array(x, float) for x in X]
    R = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    X += [2e-3 * x @ R.T + np.array([0.1, 0.2, -0.3]) for x in X]
    return np.array(X)


def test_edge_edge_degenerate(batch):
    X = _ee_degenerate()
    res = eval_ee(batch, X)
    for k, x in enumerate(X):
        t = int(res["type"][k])
        d_auto = ipctk.edge_edge_distance(*x)
        scale = np.abs(x).max() ** 2
        assert abs(ipctk.edge_edge_distance(*x, EE(t)) - d_auto) <= RTOL * scale, (k, t, d_auto)
        assert abs(res["D"][k, 0] - d_auto) <= RTOL * scale, (k, res["D"][k, 0], d_auto)
        _d_ref, g_ref, H_ref = _ee_ref(x, t)
        gs = max(np.abs(g_ref).max(), np.sqrt(scale))
        assert _close(res["G"][k, 0], g_ref, gs), (k, t)
        assert _close(res["H"][k], H_ref, np.abs(H_ref).max()), (k, t)
    # exactly parallel pairs go through the parallel classification
    for k in (0, 1, 2, 3, 4):
        assert res["type"][k] == res["par_type"][k]
        assert res["type"][k] != int(EE.EA_EB)
    # the parallel classification agrees with ipctk's where the closest pair is unique
    for k in (2, 4):
        assert res["par_type"][k] == int(ipctk.edge_edge_parallel_distance_type(*X[k]))


@pytest.mark.parametrize("angle", [1e-6, 1e-8, 1e-11])
def test_edge_edge_nearly_parallel(batch, angle):
    """Nearly parallel crossing edges: the line-line formula divides by |ea x eb|^2 ~
    angle^2 and loses ~eps/angle of its digits, in ipctk as here. The distance values
    still agree to the conditioning bound, and the mollified distance m(x) d(x), the
    quantity the barrier sees, to 1e-10 once m's x ~ angle^2 factor is applied."""
    base = np.array([[-1.0, 0, 0], [1.0, 0, 0], [-1.0, 0, 0.01], [1.0, 0, 0.01]])
    X = []
    for phase in (0.0, 0.3, -0.45):
        x = base.copy()
        x[2, 1] = -angle + phase * angle
        x[3, 1] = angle + phase * angle
        x[2:, 0] += phase  # shift eb along the axis
        X.append(x)
    X = np.array(X)
    eps_x = np.array([ipctk.edge_edge_mollifier_threshold(*x) for x in X])
    res = eval_ee(batch, X, eps_x=eps_x)
    cond = np.finfo(float).eps / (2 * angle)  # relative error of the normal direction
    for k, x in enumerate(X):
        d_ref = ipctk.edge_edge_distance(*x)
        d = res["D"][k, 0]
        assert abs(d - d_ref) <= max(RTOL, 100 * cond) * d_ref, (k, d, d_ref)
        m_ref = ipctk.edge_edge_mollifier(*x, eps_x[k])
        assert _close(res["D"][k, 3], m_ref, 1.0)
        assert abs(m_ref * d - m_ref * d_ref) <= max(RTOL, 100 * cond * m_ref) * d_ref
        # below the parallel tolerance (sin^2 < 1e-20) the pair is treated as parallel
        if angle**2 < 1e-20:
            assert res["type"][k] == res["par_type"][k]


# ---------------------------------------------------------------------------------
# mollifier


def test_mollifier_matches_ipctk(batch, rng):
    n = 60
    X = rng.normal(size=(n, 4, 3))
    # make half of them nearly parallel so that the mollifier is active
    h = n // 2
    X[:h, 3] = X[:h, 2] + (X[:h, 1] - X[:h, 0]) * rng.uniform(0.5, 2.0, (h, 1))
    X[:h, 3] += 0.01 * rng.normal(size=(h, 3))
    eps_x = np.array([ipctk.edge_edge_mollifier_threshold(*x) for x in X])
    eps_x[: h // 2] *= 50.0  # and some deep inside the mollified zone
    res = eval_ee(batch, X, eps_x=eps_x)
    active = 0
    for k, x in enumerate(X):
        e = eps_x[k]
        thr = ipctk.edge_edge_mollifier_threshold(*x)
        assert _close(res["D"][k, 6], thr, thr)
        assert _close(res["D"][k, 7], ipctk.edge_edge_cross_squarednorm(*x), res["D"][k, 7])
        m = ipctk.edge_edge_mollifier(*x, e)
        gm = ipctk.edge_edge_mollifier_gradient(*x, e)
        Hm = ipctk.edge_edge_mollifier_hessian(*x, e)
        for col in (3, 4, 5):
            assert _close(res["D"][k, col], m, 1.0)
        assert _close(res["G"][k, 2], gm, max(np.abs(gm).max(), 1e-300))
        assert _close(res["G"][k, 3], gm, max(np.abs(gm).max(), 1e-300))
        assert _close(res["HM"][k], Hm, max(np.abs(Hm).max(), 1e-300))
        if m < 1.0:
            active += 1
            assert np.abs(res["HM"][k]).max() > 0
        else:
            assert np.abs(res["G"][k, 2]).max() == 0 and np.abs(res["HM"][k]).max() == 0
    assert active >= h // 2
    # scalar form
    for c, e in [(0.2, 1.0), (0.99, 1.0), (1.5, 1.0), (1e-6, 1e-3)]:
        m, dm, d2m = _mollifier_scalar(c, e)
        assert _close(m, ipctk.edge_edge_mollifier(c, e), 1.0)
        assert _close(dm, ipctk.edge_edge_mollifier_gradient(c, e), 1.0 / e)
        assert _close(d2m, ipctk.edge_edge_mollifier_hessian(c, e), 1.0 / e**2)


@ti.kernel
def _moll_scalar(c: ti.f64, e: ti.f64, out: ti.types.ndarray()):
    m, dm, d2m = dist.mollifier(c, e)
    out[0] = m
    out[1] = dm
    out[2] = d2m


def _mollifier_scalar(c, e):
    out = np.zeros(3)
    _moll_scalar(c, e, out)
    return out
