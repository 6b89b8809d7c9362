"""Tests of the derivative checkers themselves: they pass true derivatives and
catch wrong, zero and asymmetric ones."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.testing import CheckResult, check_gradient, check_hessian


def rosen(x):
    x = np.ravel(x)
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))


def rosen_grad(x):
    x = np.ravel(x)
    g = np.zeros_like(x)
    g[:-1] += -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2.0 * (1.0 - x[:-1])
    g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    return g


def rosen_hess(x):
    x = np.ravel(x)
    n = len(x)
    H = np.zeros((n, n))
    i = np.arange(n - 1)
    H[i, i] += 1200.0 * x[:-1] ** 2 - 400.0 * x[1:] + 2.0
    H[i + 1, i + 1] += 200.0
    H[i, i + 1] = H[i + 1, i] = -400.0 * x[:-1]
    return H


X0 = np.array([0.3, -0.7, 1.2, 0.5, -0.1])


def test_true_gradient_and_hessian_pass():
    r = check_gradient(rosen, rosen_grad, X0)
    assert isinstance(r, CheckResult) and r.passed and r.full
    assert r.max_rel_error < 1e-7 and r.analytic_max > 1.0
    h = check_hessian(rosen_grad, rosen_hess, X0)
    assert h.passed and h.max_rel_error < 1e-7


def test_matrix_shaped_x_is_passed_unflattened():
    A = np.array([[2.0, 1.0, 0.0], [0.5, 3.0, -1.0], [0.0, 0.2, 1.5]])

    def f(X):
        assert X.shape == (3, 3)
        return float(np.sum(A * X * X) + np.linalg.det(X))

    def g(X):
        return 2.0 * A * X + np.linalg.det(X) * np.linalg.inv(X).T

    check_gradient(f, g, np.eye(3) + 0.1 * np.arange(9).reshape(3, 3) / 9)


def test_wrong_gradient_is_caught():
    with pytest.raises(AssertionError, match="derivative check FAILED"):
        check_gradient(rosen, lambda x: 1.001 * rosen_grad(x), X0)

    # one wrong component only
    def bad(x):
        g = rosen_grad(x)
        g[3] += 1e-2 * np.abs(g).max()
        return g

    with pytest.raises(AssertionError, match="gradient"):
        check_gradient(rosen, bad, X0)


def test_wrong_gradient_caught_by_random_directions_alone():
    n = 200  # above full_max: only directional derivatives are compared
    x = np.linspace(-1.0, 1.0, n)
    r = check_gradient(rosen, rosen_grad, x)
    assert r.passed and not r.full
    with pytest.raises(AssertionError, match="directional derivative"):
        check_gradient(rosen, lambda y: rosen_grad(y) * (1.0 + 1e-3 * np.sign(y)), x)


def test_zero_gradient_never_passes_where_fd_is_not_zero():
    # even with absurd tolerances a zero analytic gradient is refused
    with pytest.raises(AssertionError, match="numerically\\) zero"):
        check_gradient(rosen, lambda x: np.zeros_like(x), X0, rtol=10.0, atol=1e9)
    with pytest.raises(AssertionError, match="numerically\\) zero"):
        check_gradient(rosen, lambda x: np.zeros_like(x), X0, rtol=10.0, atol=1e9, require_nonzero=False)


def test_require_nonzero_guard_at_critical_point():
    f = lambda x: float(np.sum((np.ravel(x) - 1.0) ** 2))
    g = lambda x: 2.0 * (np.ravel(x) - 1.0)
    x = np.ones(4)
    with pytest.raises(AssertionError, match="require_nonzero"):
        check_gradient(f, g, x)
    r = check_gradient(f, g, x, require_nonzero=False)
    assert r.passed and r.analytic_max == 0.0


def test_no_raise_mode_returns_failed_result():
    r = check_gradient(rosen, lambda x: -rosen_grad(x), X0, raise_on_failure=False)
    assert not r.passed and r.max_rel_error > 1.0 and "gradient" in r.message
    assert "FAILED" in str(r)


def test_wrong_hessian_is_caught():
    def bad(x):
        H = rosen_hess(x)
        H[0, 1] *= 1.01
        H[1, 0] *= 1.01
        return H

    with pytest.raises(AssertionError, match="Hessian"):
        check_hessian(rosen_grad, bad, X0)


def test_zero_hessian_is_caught():
    with pytest.raises(AssertionError, match="numerically\\) zero"):
        check_hessian(rosen_grad, lambda x: np.zeros((5, 5)), X0, rtol=10.0, atol=1e9)
    # linear gradient of a quadratic: constant nonzero Hessian passes, zero one fails
    A = np.diag([1.0, 2.0, 3.0])
    check_hessian(lambda x: A @ x, lambda x: A, np.ones(3))
    with pytest.raises(AssertionError, match="require_nonzero"):
        check_hessian(lambda x: 0.0 * x, lambda x: np.zeros((3, 3)), np.ones(3))


def test_asymmetric_hessian_is_caught():
    A = np.array([[2.0, 1.0], [0.0, 3.0]])  # Jacobian of x -> A x, not a Hessian
    with pytest.raises(AssertionError, match="not symmetric"):
        check_hessian(lambda x: A @ x, lambda x: A, np.ones(2))
    r = check_hessian(lambda x: A @ x, lambda x: A, np.ones(2), symmetric=False)
    assert r.passed


def test_nonfinite_analytic_fails():
    with pytest.raises(AssertionError, match="non-finite"):
        check_gradient(rosen, lambda x: np.full_like(x, np.nan), X0)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError):
        check_gradient(rosen, lambda x: np.zeros(3), X0)
    with pytest.raises(ValueError):
        check_hessian(rosen_grad, lambda x: np.zeros((5, 4)), X0)


def test_default_atol_tracks_roundoff_of_large_values():
    # f has a large constant offset: the round-off estimate must absorb it, and a
    # true gradient must still pass while a 1% error must still fail.
    big = 1e8
    f = lambda x: big + rosen(x)
    r = check_gradient(f, rosen_grad, X0)
    assert r.passed and r.atol > 1e-3
    with pytest.raises(AssertionError):
        check_gradient(f, lambda x: 1.01 * rosen_grad(x), X0)


def test_value_scale_declares_cancellation_noise():
    # f is computed as a difference of large terms: at its minimum the finite
    # differences are pure round-off, which only value_scale can tell the checker
    big = 1e6
    f = lambda x: float((big + np.sum(np.ravel(x) ** 2)) - big)
    g = lambda x: 2.0 * np.ravel(x)
    x = np.zeros(3)
    r = check_gradient(f, g, x, require_nonzero=False, value_scale=big)
    assert r.passed
    with pytest.raises(AssertionError, match="require_nonzero"):
        check_gradient(f, g, x, value_scale=big)
    # away from the minimum the true gradient still passes and a wrong one fails
    y = np.array([1.0, -2.0, 0.5])
    # (a larger step: the round-off of a difference of 1e6-sized values is 1e-10 / eps)
    check_gradient(f, g, y, value_scale=big, eps=1e-3, rtol=1e-3)
    with pytest.raises(AssertionError):
        check_gradient(f, lambda x: 1.1 * np.ravel(x) * 2.0, y, value_scale=big, eps=1e-3, rtol=1e-3)
