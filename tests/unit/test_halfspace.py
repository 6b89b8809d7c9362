"""Analytic half-spaces (tisim.contact.ipc.halfspace) against closed forms, IPC Toolkit and
finite differences.

The barrier of a vertex at signed distance d from a plane, with thickness xi and
activation distance dhat (C-IPC, notes §7), is written here from the paper, not taken
from the module: b(s) = -(s - s_hat)^2 ln(s / s_hat) on s = d^2 - xi^2, s_hat = dhat^2 +
2 dhat xi. Derivatives are checked by central differences in the barrier band, where the
Hessian's PSD clamp is inactive (near the contact, 4 d^2 b'' + 2 b' > 0), with the
checkers' zero-gradient guard on.
"""

from __future__ import annotations

import numpy as np
import pytest

from tisim.contact.ipc.halfspace import HalfSpaces
from tisim.testing import check_gradient, check_hessian

ipctk = pytest.importorskip("ipctk")

DHAT, XI, KAPPA = 1e-3, 2e-4, 3.0e4


def _planes(mu=(0.4, 0.7)):
    # a tilted floor and a wall, normals not unit on input (the class normalises them)
    points = [[0.0, -0.1, 0.0], [0.3, 0.0, 0.2]]
    normals = [[0.2, 2.0, 0.1], [-1.0, 0.3, 0.0]]
    return HalfSpaces(points, normals, list(mu), vertex_count=6)


def _unit(v):
    v = np.asarray(v, float)
    return v / np.linalg.norm(v)


def _in_band(hs, rng, count=6):
    """Vertices inside the barrier band of plane 0 (gaps xi + 5%..35% of dhat), far from plane 1."""
    n0, p0 = hs.n[0], hs.p[0]
    t1 = hs.T[0, :, 0]
    x = np.empty((count, 3))
    for i in range(count):
        gap = XI + DHAT * rng.uniform(0.05, 0.35)
        x[i] = p0 + gap * n0 + t1 * rng.uniform(-0.05, 0.05) + hs.T[0, :, 1] * rng.uniform(-0.05, 0.05)
    assert (hs.distances(x)[1] > DHAT + XI).all()
    return x


def _b(s, s_hat):
    return -((s - s_hat) ** 2) * np.log(s / s_hat)


def test_distances_match_ipctk_point_plane():
    hs = _planes()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 3))
    d = hs.distances(x)
    for k, (p, nn) in enumerate([([0.0, -0.1, 0.0], [0.2, 2.0, 0.1]), ([0.3, 0.0, 0.2], [-1.0, 0.3, 0.0])]):
        for i in range(6):
            # ipctk's distance is squared and unsigned; the sign from the side of the normal
            d2 = ipctk.point_plane_distance(x[i], np.array(p, float), _unit(nn))
            side = np.sign(np.dot(x[i] - p, nn))
            assert d[k, i] == pytest.approx(side * np.sqrt(d2), rel=1e-12, abs=1e-15)


def test_energy_is_the_c_ipc_barrier_in_closed_form():
    hs = _planes()
    x = _in_band(hs, np.random.default_rng(4))
    # a vertex beyond the band and one on the wall's side inside its band
    x[0] = hs.p[0] + 3 * DHAT * hs.n[0]
    x[1] = hs.p[1] + (XI + 0.5 * DHAT) * hs.n[1]
    # the band ends at a gap of dhat between the surfaces, d = dhat + xi (not d = dhat)
    x[3] = hs.p[0] + (DHAT + 0.5 * XI) * hs.n[0]
    s_hat = DHAT**2 + 2 * DHAT * XI
    expected = 0.0
    for k in range(2):
        for xv in x:
            d = float(np.dot(xv - hs.p[k], hs.n[k]))
            s = d * d - XI * XI
            if s < s_hat:
                expected += KAPPA * _b(s, s_hat)
    assert expected > 0
    assert hs.energy(x[3:4], DHAT, XI, KAPPA) > 0
    assert hs.energy(x, DHAT, XI, KAPPA) == pytest.approx(expected, rel=1e-12)
    # touching (d <= xi) is infinite, whatever the other vertices
    x[2] = hs.p[0] + 0.5 * XI * hs.n[0]
    assert hs.energy(x, DHAT, XI, KAPPA) == np.inf


def test_barrier_gradient_and_hessian_by_finite_differences():
    hs = _planes()
    x0 = _in_band(hs, np.random.default_rng(5))

    def f(x):
        return hs.energy(x, DHAT, XI, KAPPA)

    def g(x):
        return hs.gradient_hessian(x, DHAT, XI, KAPPA, hessian=False)[0]

    def H(x):
        _, (rows, blocks) = hs.gradient_hessian(x, DHAT, XI, KAPPA)
        out = np.zeros((x.size, x.size))
        for r, B in zip(rows, blocks):
            out[3 * r : 3 * r + 3, 3 * r : 3 * r + 3] += B
        return out

    # step 1e-9 m: far below the gaps (>= 5e-5 m), the barrier is smooth there
    check_gradient(f, g, x0, eps=1e-9, rtol=1e-5, rng=1)
    check_hessian(g, H, x0, eps=1e-10, rtol=1e-5, rng=2)


def test_normal_force_is_minus_the_distance_derivative():
    """The lagged normal force lambda of update_friction is -dE/dd of the vertex's barrier."""
    hs = _planes()
    x = _in_band(hs, np.random.default_rng(6), count=3)
    hs.update_friction(x, DHAT, XI, KAPPA)
    s_hat = DHAT**2 + 2 * DHAT * XI
    for i in range(3):
        d = float(hs.distances(x)[0, i])
        e = 1e-10

        def E(dd):
            return KAPPA * _b(dd * dd - XI * XI, s_hat)

        lam_fd = -(E(d + e) - E(d - e)) / (2 * e)
        assert lam_fd > 0
        assert hs._lam[0, i] == pytest.approx(lam_fd, rel=1e-6)
    assert (hs._lam[1] == 0).all()


@pytest.mark.parametrize("regime", ["static", "sliding"])
def test_friction_gradient_and_hessian_by_finite_differences(regime):
    hs = _planes()
    rng = np.random.default_rng(7)
    x_ref = _in_band(hs, rng)
    hs.update_friction(x_ref, DHAT, XI, KAPPA)
    eps_v, h = 1e-3, 1e-2  # eps = eps_v h = 1e-5 m of tangential slip
    eps = eps_v * h
    # tangential displacement y below eps (static, smoothed) or above (sliding); a normal
    # component too (friction sees only the tangential part)
    scale = 0.4 * eps if regime == "static" else 30 * eps
    u = rng.normal(size=(6, 2))
    u *= scale / np.linalg.norm(u, axis=1, keepdims=True) * rng.uniform(0.5, 1.0, size=(6, 1))
    x0 = x_ref + u @ hs.T[0].T + 1e-6 * hs.n[0]

    def f(x):
        return hs.friction_energy(x, eps_v, h)

    def g(x):
        return hs.friction_gradient_hessian(x, eps_v, h, hessian=False)[0]

    def H(x):
        _, (rows, blocks) = hs.friction_gradient_hessian(x, eps_v, h)
        out = np.zeros((x.size, x.size))
        for r, B in zip(rows, blocks):
            out[3 * r : 3 * r + 3, 3 * r : 3 * r + 3] += B
        return out

    # closed form of the friction energy: sum mu lambda f0(|u|), f0 of IPC (eq. 15)
    y = np.linalg.norm(u, axis=1)
    f0 = np.where(y < eps, -(y**3) / (3 * eps**2) + y**2 / eps + eps / 3, y)
    assert f(x0) == pytest.approx(float((0.4 * hs._lam[0] * f0).sum()), rel=1e-12)
    step = 1e-3 * scale
    check_gradient(f, g, x0, eps=step, rtol=1e-5, rng=3)
    check_hessian(g, H, x0, eps=step, rtol=1e-4, rng=4)
    # the sliding force is mu lambda along -u (Coulomb), whatever the slip speed
    if regime == "sliding":
        gv = g(x0)
        np.testing.assert_allclose(np.linalg.norm(gv, axis=1), 0.4 * hs._lam[0], rtol=1e-12)


def test_max_step_keeps_a_tenth_of_the_gap():
    """CCD for planes: on [0, alpha] every vertex stays at d - xi >= eta (d0 - xi), eta = 0.1,
    and alpha is the largest such step (one vertex is exactly at the bound) or 1."""
    hs = _planes()
    rng = np.random.default_rng(8)
    x = _in_band(hs, rng)
    for _trial in range(20):
        p = rng.normal(size=(6, 3)) * 10 ** rng.uniform(-4, -1)
        alpha = hs.max_step(x, p, XI, eta=0.1)
        assert 0 < alpha <= 1
        d0 = hs.distances(x)
        d1 = hs.distances(x + alpha * p)
        # distances are linear in alpha: checking the end of the step covers the interval
        assert (d1 - XI >= 0.1 * (d0 - XI) * (1 - 1e-9)).all()
        if alpha < 1:
            assert np.isclose(d1 - XI, 0.1 * (d0 - XI), rtol=1e-9, atol=0).any()
