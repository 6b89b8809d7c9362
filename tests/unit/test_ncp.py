"""NCP functions, their generalized Jacobians and the Coulomb friction residual."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.contact.ncp.functions import (
    fischer_burmeister,
    friction_residual,
    friction_residual_jacobian,
    friction_state,
    min_map,
    ncp_function,
    project_cone,
)


def _fd(f, x, eps=1e-7):
    return (f(x + eps) - f(x - eps)) / (2 * eps)


@pytest.mark.parametrize("phi", [fischer_burmeister, min_map])
def test_ncp_derivatives_match_finite_differences(phi, rng):
    a = rng.uniform(-2, 2, 200)
    b = rng.uniform(-2, 2, 200)
    # stay away from the kinks: the origin (FB) and the diagonal a = b (min-map)
    ok = (np.hypot(a, b) > 0.1) & (np.abs(a - b) > 0.05)
    a, b = a[ok], b[ok]
    _, da, db = phi(a, b)
    fa = _fd(lambda x: phi(x, b)[0], a)
    fb = _fd(lambda x: phi(a, x)[0], b)
    np.testing.assert_allclose(da, fa, atol=1e-6)
    np.testing.assert_allclose(db, fb, atol=1e-6)
    assert np.abs(da).max() > 0.1 and np.abs(db).max() > 0.1  # non-trivial derivatives


@pytest.mark.parametrize("name", ["fischer-burmeister", "min-map"])
def test_ncp_zero_set_is_complementarity(name):
    phi = ncp_function(name)
    # complementary pairs -> 0
    for a, b in [(0.0, 3.0), (2.0, 0.0), (0.0, 0.0)]:
        assert abs(phi(np.array(a), np.array(b))[0]) < 1e-15
    # both positive -> positive; one negative -> negative
    assert phi(np.array(1.0), np.array(1.0))[0] > 0.1
    assert phi(np.array(-1.0), np.array(2.0))[0] < -0.1
    assert phi(np.array(2.0), np.array(-0.5))[0] < -0.1


def test_fischer_burmeister_no_cancellation():
    # a + b - sqrt(a^2 + b^2) loses all digits here; 2ab / (a + b + rho) does not
    phi, _, _ = fischer_burmeister(np.array(1e8), np.array(1e-8))
    assert phi == pytest.approx(1e-8, rel=1e-12)


def test_fischer_burmeister_kink_derivative_is_generalized():
    _, da, db = fischer_burmeister(np.array(0.0), np.array(0.0))
    # (1 - alpha, 1 - beta) with alpha^2 + beta^2 <= 1
    assert (1 - da) ** 2 + (1 - db) ** 2 <= 1 + 1e-12


def test_unknown_ncp_name():
    with pytest.raises(ValueError, match="unknown NCP"):
        ncp_function("nope")


def test_friction_residual_zero_exactly_on_coulomb_law():
    r_t = np.array([0.5, 0.5, 0.5])
    R = np.array([2.0, 2.0, 2.0])
    lam = np.array([[0.3, -0.4], [-2.0 * 0.6, -2.0 * 0.8], [0.0, 0.0]])
    u = np.array([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]])
    res = friction_residual(lam, u, r_t, R)
    np.testing.assert_allclose(res, 0.0, atol=1e-14)
    st = friction_state(lam, u, r_t, R)
    assert st.stick.tolist() == [True, False, True]
    # violations: sliding while the force is inside the disk; force outside the disk
    bad = friction_residual(np.array([[0.1, 0.0], [3.0, 0.0]]), np.array([[1.0, 0.0], [0.0, 0.0]]), r_t[:2], R[:2])
    assert np.all(np.linalg.norm(bad, axis=1) > 0.1)


def test_friction_residual_jacobian_matches_finite_differences(rng):
    k = 300
    lam = rng.normal(size=(k, 2))
    u = rng.normal(size=(k, 2))
    r_t = rng.uniform(0.2, 2.0, k)
    R = rng.uniform(0.1, 2.0, k)
    st = friction_state(lam, u, r_t, R)
    ny = np.linalg.norm(st.y, axis=1)
    ok = np.abs(ny - R) > 0.05  # away from the stick/slip switch
    lam, u, r_t, R = lam[ok], u[ok], r_t[ok], R[ok]
    d_lam, d_u = friction_residual_jacobian(lam, u, r_t, R)
    eps = 1e-7
    for j in range(2):
        e = np.zeros(2)
        e[j] = eps
        fl = (friction_residual(lam + e, u, r_t, R) - friction_residual(lam - e, u, r_t, R)) / (2 * eps)
        fu = (friction_residual(lam, u + e, r_t, R) - friction_residual(lam, u - e, r_t, R)) / (2 * eps)
        np.testing.assert_allclose(d_lam[:, :, j], fl, atol=1e-6)
        np.testing.assert_allclose(d_u[:, :, j], fu, atol=1e-6)
    stick = friction_state(lam, u, r_t, R).stick
    assert stick.any() and (~stick).any()  # both branches exercised


def test_project_cone(rng):
    lam = rng.normal(size=(500, 3))
    mu = rng.uniform(0.0, 1.0, 500)
    p = project_cone(lam, mu)
    assert np.all(p[:, 0] >= 0)
    assert np.all(np.linalg.norm(p[:, 1:], axis=1) <= mu * p[:, 0] + 1e-12)
    np.testing.assert_allclose(project_cone(p, mu), p, atol=1e-14)  # idempotent
    inside = (lam[:, 0] > 0) & (np.linalg.norm(lam[:, 1:], axis=1) <= mu * lam[:, 0])
    np.testing.assert_array_equal(p[inside], lam[inside])
    assert (~inside).sum() > 10


def test_fischer_burmeister_derivatives_without_cancellation():
    """phi_a = 1 - a / rho loses every digit when b << a (a / rho rounds to 1) and comes out
    nonzero where it must be 0 when rho is rounded up (CUDA's approximate f32 square root
    did, docs/benchmarks.md "GPU-class backends"). Against 50-digit arithmetic: exactly 0 at b = 0,
    and a few ulp where b / a is 1e-3 .. 1e-9; phi_b likewise with the roles swapped."""
    from decimal import Decimal, getcontext

    from tisim.contact.ncp.functions import fischer_burmeister

    getcontext().prec = 50
    a = np.array([1.0, 2.5e-3, 3.0, 1e-4, 0.7])
    for ratio in (0.0, 1e-3, 1e-6, 1e-9):
        b = a * ratio
        for x, y, col in ((a, b, 1), (b, a, 2)):  # phi_a at (a, b), then phi_b at (b, a)
            got = fischer_burmeister(x, y)[col]
            for g, xa, yb in zip(got, x if col == 1 else y, y if col == 1 else x):
                X, Y = Decimal(float(xa)), Decimal(float(yb))
                rho = (X * X + Y * Y).sqrt()
                exact = float((rho - X) / rho)
                if ratio == 0.0:
                    assert g == 0.0
                else:
                    assert abs(g - exact) <= 4 * np.finfo(float).eps * exact, (xa, yb, g, exact)
