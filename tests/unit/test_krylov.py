"""Conjugate Residual and Conjugate Gradient against dense solves."""

from __future__ import annotations

import numpy as np

from tisim.linalg.krylov import conjugate_gradient, conjugate_residual


def _spd(rng, n, cond=100.0):
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return Q @ np.diag(np.geomspace(1.0, cond, n)) @ Q.T


def _indefinite(rng, n):
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    ev = np.concatenate([-np.geomspace(0.5, 5.0, n // 2), np.geomspace(1.0, 20.0, n - n // 2)])
    return Q @ np.diag(ev) @ Q.T


def _check_monotone(res):
    r = np.asarray(res)
    assert np.all(r[1:] <= r[:-1] * (1 + 1e-10)), r


def test_cr_spd_residual_monotone_and_converges(rng):
    n = 30
    K = _spd(rng, n)
    c = rng.normal(size=n)
    out = conjugate_residual(lambda x: K @ x, c, iterations=200, tol=1e-12)
    _check_monotone(out.residuals)
    assert out.converged
    np.testing.assert_allclose(out.x, np.linalg.solve(K, c), rtol=1e-9, atol=1e-10)
    assert out.iterations <= 2 * n


def test_cr_indefinite_residual_monotone_and_converges(rng):
    n = 24
    K = _indefinite(rng, n)
    c = rng.normal(size=n)
    out = conjugate_residual(lambda x: K @ x, c, iterations=400, tol=1e-11)
    _check_monotone(out.residuals)
    assert out.converged, out.residuals[-5:]
    np.testing.assert_allclose(out.x, np.linalg.solve(K, c), rtol=1e-8, atol=1e-9)


def test_cr_fixed_iterations_on_matrix_shaped_vectors(rng):
    # the contact solver passes (k, 3) arrays; inner products run over all entries
    n = 12
    K = _spd(rng, 3 * n, cond=10.0)
    c = rng.normal(size=(n, 3))
    out = conjugate_residual(lambda x: (K @ x.ravel()).reshape(n, 3), c, iterations=5)
    assert out.iterations == 5 and out.x.shape == (n, 3)
    _check_monotone(out.residuals)
    assert out.residuals[-1] < 0.5 * out.residuals[0]


def test_cr_semidefinite_consistent(rng):
    n = 20
    B = rng.normal(size=(n, 12))
    K = B @ B.T  # rank 12
    c = K @ rng.normal(size=n)
    out = conjugate_residual(lambda x: K @ x, c, iterations=100, tol=1e-12)
    _check_monotone(out.residuals)
    assert np.linalg.norm(K @ out.x - c) <= 1e-9 * np.linalg.norm(c)


def test_cg_spd_converges_with_and_without_jacobi(rng):
    n = 40
    K = _spd(rng, n, cond=1e3)
    D = np.diag(rng.uniform(1, 100, n))
    K = D @ K @ D  # badly scaled: Jacobi helps
    c = rng.normal(size=n)
    exact = np.linalg.solve(K, c)
    plain = conjugate_gradient(lambda x: K @ x, c, iterations=500, tol=1e-12)
    jac = conjugate_gradient(lambda x: K @ x, c, iterations=500, tol=1e-12, preconditioner=lambda r: r / np.diag(K))
    for out in (plain, jac):
        assert out.converged
        np.testing.assert_allclose(out.x, exact, rtol=1e-7, atol=1e-9 * np.abs(exact).max())
    assert jac.iterations < plain.iterations


def test_zero_rhs_returns_zero():
    out = conjugate_residual(lambda x: 2 * x, np.zeros(5), iterations=3)
    assert out.converged and out.iterations == 0 and not np.any(out.x)
