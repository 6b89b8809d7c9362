"""Analytic cloth colliders (tisim.contact.ipc.analytic): distances against closed forms,
scipy and ipctk; barrier and friction derivatives against finite differences; the CCD
bound against dense sampling of random straight steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tisim.contact.ipc.analytic import AnalyticColliders, Box, Cylinder, Plane, Sphere
from tisim.geometry.transforms import euler_xyz_deg
from tisim.testing import check_gradient, check_hessian

XI, DHAT = 1e-3, 1e-3
R_BOX = euler_xyz_deg([20.0, -35.0, 50.0])


def _shapes():
    return {
        "plane": Plane([0.1, -0.2, 0.3], [0.3, 1.0, -0.2]),
        "sphere": Sphere([0.2, 0.1, -0.3], 0.7),
        "box": Box([0.1, 0.2, 0.3], R_BOX, [0.4, 0.25, 0.6]),
        "cylinder": Cylinder([0.0, 0.1, 0.0], [0.2, 1.0, 0.3], 0.35, 0.9),
        "cylinder_inf": Cylinder([0.0, 0.1, 0.0], [1.0, 0.2, -0.1], 0.35, math.inf),
    }


def _box_triangles(b: Box):
    V = b.corners()
    # the 12 triangles of the box's 6 faces: on face (axis k, side s) the 4 corners with
    # that bit of their index; split along a diagonal
    T = []
    for k in range(3):
        for side in (0, 1):
            ids = [i for i in range(8) if (i >> k & 1) == side]
            a, b_, c, d = ids  # a square in bit order: a-b-d-c around
            T += [[a, b_, d], [a, d, c]]
    return V, np.array(T)


def test_box_distance_matches_ipctk_point_triangle_outside():
    """Outside the box the distance to the solid is the distance to its surface: the
    smallest ipctk point-triangle distance to the box's 12 triangles."""
    ipctk = pytest.importorskip("ipctk")
    b = _shapes()["box"]
    V, T = _box_triangles(b)
    rng = np.random.default_rng(1)
    x = b.c + rng.uniform(-1.2, 1.2, (400, 3))
    d = b.distance(x)
    d2, n, _ = b.closest(x, jacobian=False)
    np.testing.assert_array_equal(d, d2)
    out = d > 0
    assert out.sum() > 200 and (~out).sum() > 10
    ref = np.array([min(math.sqrt(ipctk.point_triangle_distance(p, *V[t])) for t in T) for p in x])
    np.testing.assert_allclose(d[out], ref[out], rtol=1e-12, atol=1e-14)
    # inside: minus the distance to the surface
    np.testing.assert_allclose(d[~out], -ref[~out], rtol=1e-12, atol=1e-14)
    # the normal points from the closest surface point to x
    q = x[out] - d[out, None] * n[out]
    np.testing.assert_allclose(b.distance(q), 0.0, atol=1e-12)


def test_sphere_and_cylinder_distances_against_closed_forms():
    rng = np.random.default_rng(2)
    sh = _shapes()
    x = rng.uniform(-1.5, 1.5, (500, 3))
    s = sh["sphere"]
    np.testing.assert_allclose(s.distance(x), np.sqrt(((x - s.c) ** 2).sum(1)) - s.r, rtol=0, atol=1e-14)
    for key in ("cylinder", "cylinder_inf"):
        c = sh[key]
        # independent: coordinates in a frame built by scipy's rotation from the axis
        from scipy.spatial.transform import Rotation

        rot, _ = Rotation.align_vectors([c.a], [[0.0, 0.0, 1.0]])
        loc = rot.inv().apply(x - c.c)
        rad = np.hypot(loc[:, 0], loc[:, 1]) - c.r
        ax = np.abs(loc[:, 2]) - c.half
        if math.isfinite(c.half):
            ref = np.where((rad > 0) | (ax > 0), np.hypot(np.maximum(rad, 0), np.maximum(ax, 0)), np.maximum(rad, ax))
        else:
            ref = rad
        np.testing.assert_allclose(c.distance(x), ref, rtol=0, atol=1e-12)
        assert (ref > 0).any() and (ref < 0).any()


def test_distances_agree_with_the_collider_queries():
    """The solver's shapes and ``Collider.distance`` (separate code) agree."""
    from tisim.contact.colliders import Collider
    from tisim.contact.ipc.analytic import shape_of
    from tisim.scene import ColliderConfig

    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 2, (300, 3))
    for cfg in (
        ColliderConfig(type="sphere", position=(0.1, 0.2, 0.3), radius=0.8),
        ColliderConfig(type="box", position=(0.0, 0.3, 0.0), half_extents=(0.5, 0.2, 0.7), rotation=(10.0, 20.0, 30.0)),
        ColliderConfig(
            type="cylinder",
            position=(0.0, 0.0, 0.2),
            axis=(1.0, 1.0, 0.0),
            radius=0.4,
            length=1.2,
            rotation=(0.0, 30.0, 0.0),
        ),
        ColliderConfig(type="cylinder", radius=0.4),
        ColliderConfig(type="plane", normal=(0.0, 1.0, 1.0), rotation=(5.0, 0.0, 0.0)),
    ):
        c = Collider.from_config("c", cfg)
        np.testing.assert_allclose(shape_of(c).distance(x), c.distance(x), rtol=0, atol=1e-12)


def _near_points(shape, rng, k=6, band=(XI + 0.05 * DHAT, XI + 0.95 * DHAT)):
    """k points at distances within ``band`` of the shape (all inside the barrier)."""
    pts = []
    while len(pts) < k:
        y = rng.uniform(-1.5, 1.5, 3)
        d, n, _ = shape.closest(y[None], jacobian=False)
        if d[0] <= 0:
            continue
        q = y - d[0] * n[0]  # the closest surface point
        pts.append(q + rng.uniform(*band) * n[0])
    return np.array(pts)


@pytest.mark.parametrize("key", list(_shapes()))
def test_barrier_gradient_and_hessian_match_finite_differences(key):
    shape = _shapes()[key]
    rng = np.random.default_rng(4)
    x = _near_points(shape, rng)
    # two more vertices outside the band (no force) keep the inactive path honest
    far = _near_points(shape, rng, 2, band=(XI + 2 * DHAT, XI + 3 * DHAT))
    x = np.concatenate([x, far])
    ac = AnalyticColliders([shape], [0.3], len(x))
    kappa = 1e3
    nv = len(x)

    def f(y):
        return ac.energy(y.reshape(-1, 3), DHAT, XI, kappa)

    def g(y):
        return ac.gradient_hessian(y.reshape(-1, 3), DHAT, XI, kappa, hessian=False)[0].ravel()

    def hess(y, project=False):
        _, (rows, B) = ac.gradient_hessian(y.reshape(-1, 3), DHAT, XI, kappa, project=project)
        H = np.zeros((3 * nv, 3 * nv))
        for r, b in zip(rows, B):
            H[3 * r : 3 * r + 3, 3 * r : 3 * r + 3] += b
        return H

    eps = 1e-8  # well inside the band's width of 1e-4..1e-3 m
    check_gradient(f, g, x.ravel(), eps=eps, rtol=1e-5)
    check_hessian(g, hess, x.ravel(), eps=eps, rtol=1e-5)
    assert np.abs(g(x.ravel())[-6:]).max() == 0.0  # the far vertices feel nothing
    # the assembled (projected) blocks are PSD and agree with the exact ones along n
    Hp, He = hess(x.ravel(), True), hess(x.ravel(), False)
    assert np.linalg.eigvalsh(Hp).min() >= -1e-9 * np.abs(Hp).max()
    _, n, _ = shape.closest(x[:1], jacobian=False)
    nn = np.zeros(3 * nv)
    nn[:3] = n[0]
    assert nn @ Hp @ nn == pytest.approx(nn @ He @ nn, rel=1e-10)


@pytest.mark.parametrize("key", ["sphere", "box", "cylinder"])
def test_friction_gradient_and_hessian_match_finite_differences(key):
    shape = _shapes()[key]
    rng = np.random.default_rng(5)
    x0 = _near_points(shape, rng, 5)
    ac = AnalyticColliders([shape], [0.4], len(x0))
    ac.update_friction(x0, DHAT, XI, 1e3)
    assert all(len(a) == 5 for a in ac._act)
    h, eps_v = 0.01, 1e-3
    # displacements on both sides of the smoothing's eps_v h = 1e-5 m
    x = x0 + rng.normal(size=x0.shape) * np.array([[3e-6], [2e-5], [1e-4], [5e-6], [3e-5]])

    def f(y):
        return ac.friction_energy(y.reshape(-1, 3), eps_v, h)

    def g(y):
        return ac.friction_gradient_hessian(y.reshape(-1, 3), eps_v, h, hessian=False)[0].ravel()

    def hess(y):
        _, (rows, B) = ac.friction_gradient_hessian(y.reshape(-1, 3), eps_v, h)
        H = np.zeros((15, 15))
        for r, b in zip(rows, B):
            H[3 * r : 3 * r + 3, 3 * r : 3 * r + 3] += b
        return H

    check_gradient(f, g, x.ravel(), eps=1e-9, rtol=1e-5)
    # the friction Hessian is IPC's PSD one: exact inside the smoothing zone, the part
    # along the slip direction dropped beyond; check the vertices inside the zone
    H = hess(x.ravel())
    for i in (0, 3):
        sl = slice(3 * i, 3 * i + 3)

        def gi(y, i=i):
            z = x.copy()
            z[i] = y
            return g(z.ravel())[3 * i : 3 * i + 3]

        check_hessian(
            gi,
            lambda y, i=i, sl=sl: hess(np.concatenate([x[:i], y[None], x[i + 1 :]]).ravel())[sl, sl],
            x[i],
            eps=1e-10,
            rtol=1e-4,
        )
    assert np.linalg.eigvalsh(H).min() >= -1e-9 * np.abs(H).max()
    # the friction force lies in the tangent plane of the lag's normal
    _, n, _ = shape.closest(x0, jacobian=False)
    gr = g(x.ravel()).reshape(-1, 3)
    np.testing.assert_allclose((gr * n).sum(1), 0.0, atol=1e-12 * np.abs(gr).max())


@pytest.mark.parametrize("key", list(_shapes()))
def test_ccd_bound_never_crosses(key):
    """Random straight steps from points near the shape: along the allowed fraction no
    sampled point comes closer than the kept share of the gap, and the bound is not
    wastefully small (the sampled first crossing of the margin lies just after it)."""
    shape = _shapes()[key]
    rng = np.random.default_rng(6)
    eta = 0.1
    clamped = 0
    for trial in range(60):
        x = _near_points(shape, rng, 4, band=(XI + 1e-4, XI + 2e-2))
        scale = 10 ** rng.uniform(-3, 0)
        p = rng.normal(size=x.shape) * scale
        # aim some steps at the shape
        _, n, _ = shape.closest(x, jacobian=False)
        p[::2] -= 2 * scale * n[::2]
        ac = AnalyticColliders([shape], [0.0], len(x))
        a = ac.max_step(x, p, XI, eta)
        assert 0 < a <= 1
        d0 = shape.distance(x)
        t = np.linspace(0, a, 2001)
        d = np.stack([shape.distance(x + ti * p) for ti in t])
        assert (d >= XI + eta * (d0 - XI) - 1e-12).all(), (trial, d.min())
        if a < 1:
            clamped += 1
            # just beyond the bound some vertex is at the margin (not a needless clamp)
            d_after = shape.distance(x + min(1.0, a * (1 + 1e-6) + 1e-12) * p)
            assert (d_after <= XI + eta * (d0 - XI) + 1e-6 * np.abs(p).max()).any(), trial
    assert clamped > 10


def test_winding_number_tells_inside_from_outside_of_a_closed_mesh():
    """Against the sphere it approximates: 1 inside, 0 outside (away from the surface);
    an open mesh (one face removed) is not closed."""
    from tisim.geometry.generate import icosphere
    from tisim.geometry.winding import is_closed, winding_numbers

    ico = icosphere(2)
    V = ico.vertices / np.linalg.norm(ico.vertices, axis=1, keepdims=True)
    rng = np.random.default_rng(7)
    p = rng.uniform(-1.5, 1.5, (200, 3))
    r = np.linalg.norm(p, axis=1)
    far = np.abs(r - 1) > 0.05  # the facets lie within 1.5% of the radius
    w = winding_numbers(p, V, ico.faces)
    np.testing.assert_allclose(w[far], (r[far] < 1).astype(float), atol=1e-9)
    assert is_closed(ico.faces) and not is_closed(ico.faces[1:])


def test_sag_allowance_keeps_random_triangles_off_the_sphere():
    """Triangles whose vertices sit on the grown sphere keep the thickness from the real
    one (ipctk's point-triangle distance to the centre), and the allowance is tight: an
    equilateral triangle of circumradius rho centred over the centre reaches it."""
    ipctk = pytest.importorskip("ipctk")
    from tisim.contact.ipc.analytic import sag_allowance

    rng = np.random.default_rng(8)
    R, xi = 0.3, 1e-3
    for k in range(300):
        rho = 10 ** rng.uniform(-3, -0.7)
        grown = R + xi + sag_allowance(R, xi, rho)
        # three points on a circle of radius r <= rho on the grown sphere
        n = rng.normal(size=3)
        n /= np.linalg.norm(n)
        u = np.cross(n, [1.0, 0.0, 0.0] if abs(n[0]) < 0.9 else [0.0, 1.0, 0.0])
        u /= np.linalg.norm(u)
        w = np.cross(n, u)
        tight = k % 2 == 0
        r = rho if tight else rho * rng.uniform(0.3, 1.0)
        th = np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3]) if tight else rng.uniform(0, 2 * np.pi, 3)
        tri = math.sqrt(grown**2 - r * r) * n + r * (np.cos(th)[:, None] * u + np.sin(th)[:, None] * w)
        d = math.sqrt(ipctk.point_triangle_distance(np.zeros(3), *tri)) - R
        assert d >= xi * (1 - 1e-9), (d, rho)
        if tight:
            assert d == pytest.approx(xi, rel=1e-6)
