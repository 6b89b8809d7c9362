"""Batched PSD projection (cyclic Jacobi on the device) against a LAPACK eigen-clamp."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tisim.linalg.psd import PSDProjector, project_psd, project_psd_numpy


def _clamp(A):
    w, V = np.linalg.eigh(A)
    return np.einsum("...ij,...j,...kj->...ik", V, np.maximum(w, 0.0), V)


def _sym(rng, k, d, scale=1.0):
    A = rng.normal(size=(k, d, d)) * scale
    return 0.5 * (A + np.swapaxes(A, 1, 2))


@pytest.mark.parametrize("d", [3, 9, 12])
def test_projection_equals_eigen_clamp(rng, d):
    A = _sym(rng, 64, d)
    # widely spread magnitudes and a few rank-deficient / nearly singular ones
    A[:16] *= np.geomspace(1e-6, 1e6, 16)[:, None, None]
    A[16:20] = np.einsum("kij,klj->kil", A[16:20, :, :2], A[16:20, :, :2]) - np.eye(d) * 1e-3
    P = project_psd_numpy(A)
    R = _clamp(A)
    for k in range(len(A)):
        scale = np.abs(A[k]).max()
        assert np.abs(P[k] - R[k]).max() <= 1e-10 * scale, k
        assert np.linalg.eigvalsh(P[k]).min() >= -1e-12 * scale
        assert np.abs(P[k] - P[k].T).max() == 0.0
    # the inputs were indefinite: the projection changed them
    assert all(np.linalg.eigvalsh(A[k]).min() < 0 for k in range(20))
    assert np.abs(P - A).max() > 0.1


def _hard_cases(rng, d):
    """Spectra that trouble eigensolvers: repeated eigenvalues, a diagonal (already
    split), a rank-1 negative part, extreme scales, a tridiagonal matrix with an
    off-diagonal entry far below round-off, zero rows between nonzero ones."""
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    signs = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
    v = rng.normal(size=d)
    cases = [
        Q @ np.diag(signs) @ Q.T,  # two eigenvalues, each repeated d/2 times
        np.diag(np.linspace(-3.0, 2.0, d)),
        np.eye(d) - 4.0 * np.outer(v, v) / (v @ v),  # one -3, the rest 1
        1e-150 * (Q @ np.diag(np.linspace(-1.0, 1.0, d)) @ Q.T),
        1e150 * (Q @ np.diag(np.linspace(-1.0, 1.0, d)) @ Q.T),
        np.diag(np.linspace(-1.0, 1.0, d)) + 1e-300 * (np.eye(d, k=1) + np.eye(d, k=-1)),
    ]
    gap = np.zeros((d, d))
    keep = np.arange(0, d, 2)
    gap[np.ix_(keep, keep)] = _sym(rng, 1, len(keep))[0]
    cases.append(gap)
    return np.stack([0.5 * (c + c.T) for c in cases])


@pytest.mark.parametrize("d", [1, 2, 6, 12])
def test_hard_spectra_equal_eigen_clamp(rng, d):
    A = _hard_cases(rng, d)
    P = project_psd_numpy(A)
    R = _clamp(A)
    for k in range(len(A)):
        scale = np.abs(A[k]).max()
        assert np.abs(P[k] - R[k]).max() <= 1e-12 * scale, (d, k)
        assert np.all(np.isfinite(P[k]))


def test_psd_inputs_unchanged(rng):
    d = 12
    B = _sym(rng, 40, d)
    A = np.einsum("kij,klj->kil", B, B)  # PSD (some singular: rank-deficient B)
    A[:5] = np.einsum("kij,klj->kil", B[:5, :, :4], B[:5, :, :4])
    A[5] = 0.0
    A[6] = np.diag(np.arange(d, dtype=float))  # diagonally dominant: skipped outright
    P = project_psd_numpy(A)
    # bit-for-bit where every Jacobi eigenvalue came out >= 0; rank-deficient ones may
    # see a round-off negative eigenvalue clamped, a change at round-off level
    assert np.array_equal(P[5:], A[5:])
    assert np.abs(P[:5] - A[:5]).max() <= 1e-12 * np.abs(A[:5]).max()


def test_singular_psd_skipped_and_slightly_indefinite_projected(rng):
    """The Cholesky pre-check: a singular PSD matrix (an elastic Hessian's translation
    null space) is left exactly as it is; one with a negative eigenvalue far below the
    check's shift (16 d eps ||A||) but far above the clamp's test tolerance is not
    mistaken for PSD."""
    d = 9
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    w = np.concatenate([np.zeros(3), rng.uniform(1.0, 10.0, d - 3)])  # 3 zero modes
    A = np.stack([Q @ np.diag(w) @ Q.T, Q @ np.diag(np.where(w == 0, -1e-9, w)) @ Q.T])
    A = 0.5 * (A + np.swapaxes(A, 1, 2))
    P = project_psd_numpy(A)
    assert np.array_equal(P[0], A[0])
    assert np.linalg.eigvalsh(A[1]).min() < -5e-10
    assert np.linalg.eigvalsh(P[1]).min() >= -1e-12 * np.abs(A[1]).max()
    assert np.abs(P[1] - _clamp(A[1])).max() <= 1e-10 * np.abs(A[1]).max()


def test_nonsymmetric_input_is_symmetrised_and_count_respected(rng, taichi_backend):
    import taichi as ti

    d = 6
    A = _sym(rng, 8, d)
    A_ns = A + 1e-9 * rng.normal(size=A.shape)  # assembly round-off: slightly non-symmetric
    F = ti.ndarray(ti.f64, (10, d, d))
    F.from_numpy(np.concatenate([A_ns, np.zeros((2, d, d))]))
    proj = project_psd(F, 5)  # only the first 5
    out = F.to_numpy()
    R = _clamp(0.5 * (A_ns + np.swapaxes(A_ns, 1, 2)))
    assert np.abs(out[:5] - R[:5]).max() <= 1e-10 * np.abs(A).max()
    assert np.array_equal(out[5:8], A_ns[5:])  # rows past the count are untouched
    # the same projector takes a larger batch (no scratch of its own to outgrow)
    G = ti.ndarray(ti.f64, (40, d, d))
    G.from_numpy(_sym(rng, 40, d))
    proj.project(G, 40)
    assert np.linalg.eigvalsh(G.to_numpy()).min() >= -1e-12 * np.abs(G.to_numpy()).max()
    with pytest.raises(ValueError, match="expected"):
        PSDProjector(d + 1).project(G, 4)
    with pytest.raises(ValueError, match="1 to 12"):
        PSDProjector(13)


@pytest.mark.parametrize("slots", [(2,), (0, 3), (1, 2, 3)])
def test_zero_vertex_rows_change_nothing(rng, slots):
    """A contact Hessian whose obstacle vertices' rows were cleared (or whose distance
    involves two or three of its four vertices) is projected over its nonzero rows only:
    the result there equals the projection of the small matrix bit for bit, the zero rows
    stay zero, and both agree with LAPACK's clamp."""
    d = 3 * len(slots)
    small = _sym(rng, 48, d)
    small[:8] = np.einsum("kij,klj->kil", small[:8], small[:8])  # PSD ones: left unchanged
    rows = np.concatenate([3 * s + np.arange(3) for s in slots])
    big = np.zeros((48, 12, 12))
    big[np.ix_(np.arange(48), rows, rows)] = small
    P_small = project_psd_numpy(small)
    P_big = project_psd_numpy(big)
    np.testing.assert_array_equal(P_big[np.ix_(np.arange(48), rows, rows)], P_small)
    rest = np.ones(12, bool)
    rest[rows] = False
    assert not P_big[:, rest, :].any() and not P_big[:, :, rest].any()
    R = _clamp(small)
    assert np.abs(P_small - R).max() <= 1e-10 * np.abs(small).max()


def _compiled_count():
    """Number of compiled instances of the module's kernel (Taichi keeps one per
    distinct argument specialisation in ``Kernel.compiled_kernels``)."""
    from tisim.linalg import psd

    return len(psd._project_psd_kernel._primal.compiled_kernels)


def test_second_projector_compiles_nothing(rng, taichi_backend):
    """ndarray arguments: one compiled kernel serves every projector, capacity and d."""
    import taichi as ti

    d = 12
    A = ti.ndarray(ti.f64, (16, d, d))
    A.from_numpy(_sym(rng, 16, d))
    t0 = time.perf_counter()
    first = PSDProjector(d)
    first.project(A, 16)
    t_first = time.perf_counter() - t0
    count = _compiled_count()
    assert count >= 1
    # a second projector of another size, on another array
    d2 = 9
    B_np = _sym(rng, 50, d2)
    B = ti.ndarray(ti.f64, (50, d2, d2))
    B.from_numpy(B_np)
    t0 = time.perf_counter()
    second = PSDProjector(d2)
    second.project(B, 50)
    proj = project_psd(B, 50, second)  # the convenience wrapper, reusing the projector
    project_psd_numpy(B_np[:7])
    t_second = time.perf_counter() - t0
    assert proj is second
    assert _compiled_count() == count  # nothing new compiled
    assert t_second < 1.0, (t_first, t_second)
    R = _clamp(B_np)
    assert np.abs(B.to_numpy() - R).max() <= 1e-10 * np.abs(B_np).max()
    print(f"PSDProjector first instance {t_first:.3f} s, second {t_second:.4f} s")
