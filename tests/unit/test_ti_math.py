"""tisim.ti_math's software f64 log, atan2, sin and cos (used where SPIR-V has no 64-bit
transcendental instructions) against numpy, evaluated on the CPU backend.

No ``from __future__ import annotations``: the kernel's annotations must be objects."""

import numpy as np
import pytest


@pytest.fixture(scope="module")
def soft(taichi_backend):
    import taichi as ti

    from tisim import ti_math as tm

    @ti.kernel
    def run(
        x: ti.types.ndarray(dtype=ti.f64, ndim=1),
        y: ti.types.ndarray(dtype=ti.f64, ndim=1),
        out: ti.types.ndarray(dtype=ti.f64, ndim=2),
    ):
        for i in range(x.shape[0]):
            out[i, 0] = tm._log_soft(x[i])
            out[i, 1] = tm._atan2_soft(y[i], x[i])
            s, c = tm._sincos_soft(x[i])
            out[i, 2] = s
            out[i, 3] = c
            out[i, 4] = tm.log(ti.abs(x[i]))  # the dispatching versions (ti.* on the CPU)
            out[i, 5] = tm.atan2(y[i], x[i])

    def f(x, y):
        x = np.ascontiguousarray(x, dtype=np.float64)
        y = np.ascontiguousarray(y, dtype=np.float64)
        out = np.zeros((len(x), 6))
        run(x, y, out)
        return out

    return f


def test_log_against_numpy(soft, rng):
    x = np.concatenate(
        [
            np.geomspace(1e-300, 1e300, 2001),
            rng.uniform(0.5, 2.0, 2000),
            1.0 + rng.normal(scale=1e-9, size=100),
            [1.0, 2.0, 0.5, np.sqrt(2.0)],
        ]
    )
    out = soft(x, np.ones_like(x))
    ref = np.log(x)
    err = np.abs(out[:, 0] - ref) / np.maximum(np.abs(ref), 1e-300)
    assert err[np.abs(ref) > 1e-3].max() < 4e-16
    assert np.abs(out[:, 0] - ref).max() < 1e-15 * np.abs(ref).max()  # absolute near log = 0
    np.testing.assert_allclose(out[:, 4], ref, rtol=1e-15)
    special = soft(np.array([0.0, -1.0, np.inf]), np.ones(3))[:, 0]
    assert special[0] == -np.inf and np.isnan(special[1]) and special[2] == np.inf


def test_atan2_against_numpy(soft, rng):
    ang = rng.uniform(-np.pi, np.pi, 4000)
    r = np.geomspace(1e-8, 1e8, 4000)
    x, y = r * np.cos(ang), r * np.sin(ang)
    x = np.concatenate([x, [1.0, -1.0, 0.0, 0.0, 1.0, -1.0, 3.0]])
    y = np.concatenate([y, [0.0, 0.0, 1.0, -1.0, 1.0, -1e-300, -3.0]])
    out = soft(x, y)
    ref = np.arctan2(y, x)
    assert np.abs(out[:, 1] - ref).max() < 4 * np.finfo(float).eps * np.pi
    np.testing.assert_allclose(out[:, 5], ref, rtol=1e-15)


def test_sin_cos_against_numpy(soft, rng):
    # the angles the solvers take (half an atan2); Taichi's fast math may reassociate
    # the two-part reduction, which costs ~|x| ulp further out
    x = np.concatenate([rng.uniform(-4.0, 4.0, 4000), np.arange(-5, 6) * np.pi / 4, [0.0, 1e-300]])
    out = soft(x, np.ones_like(x))
    assert np.abs(out[:, 2] - np.sin(x)).max() < 1e-15
    assert np.abs(out[:, 3] - np.cos(x)).max() < 1e-15
    far = soft(np.array([100.0, -1000.0]), np.ones(2))
    assert np.abs(far[:, 2] - np.sin([100.0, -1000.0])).max() < 1e-12


@pytest.fixture(scope="module")
def polished(taichi_backend):
    """svd_polish on the CPU backend, started from ti.svd in f32 (what SPIR-V's f64 path
    does, where Taichi's 3x3 SVD cannot compile in f64)."""
    import taichi as ti

    from tisim.materials import ti_funcs as mf

    @ti.kernel
    def run(F: ti.types.ndarray(dtype=ti.f64, ndim=3), out: ti.types.ndarray(dtype=ti.f64, ndim=3)):
        for k in range(F.shape[0]):
            A = ti.Matrix([[F[k, i, j] for j in ti.static(range(3))] for i in ti.static(range(3))])
            U0, _S0, V0 = ti.svd(A.cast(ti.f32), ti.f32)
            U, S, V = mf.svd_polish(A, U0.cast(ti.f64), V0.cast(ti.f64))
            for i, j in ti.static(ti.ndrange(3, 3)):
                out[k, i, j] = U[i, j]
                out[k, 3 + i, j] = S[i, j]
                out[k, 6 + i, j] = V[i, j]

    def f(F):
        F = np.ascontiguousarray(F, dtype=np.float64)
        out = np.zeros((len(F), 9, 3))
        run(F, out)
        return out[:, :3], out[:, 3:6], out[:, 6:]

    return f


def test_svd_polish_reaches_f64_round_off(polished, rng):
    F = rng.normal(size=(200, 3, 3))
    F[:50] = np.eye(3) + 0.05 * F[:50]  # near rest
    F[50:60, :, 2] *= -1.0  # inverted
    F[60:70, :, 2] = 1e-3 * F[60:70, :, 2]  # nearly flat
    F[70:75, :, 2] = 0.0  # flat: one zero singular value
    U, S, V = polished(F)
    eye = np.eye(3)
    for k in range(len(F)):
        scale = np.abs(F[k]).max()
        assert np.abs(U[k].T @ U[k] - eye).max() < 1e-13, k
        assert np.abs(V[k].T @ V[k] - eye).max() < 1e-13, k
        assert np.abs(U[k] @ S[k] @ V[k].T - F[k]).max() < 1e-13 * scale, k
        ref = np.linalg.svd(F[k], compute_uv=False)
        assert np.abs(np.sort(np.diag(S[k]))[::-1] - ref).max() < 1e-13 * scale, k
