"""Hyperelastic materials (numpy): derivatives against finite differences, rest-state
invariance, objectivity, isotropy, linearisation, singular-value forms, PSD projection;
then the Taichi @ti.func versions against the numpy ones.

No `from __future__ import annotations` here: the test kernels need their type
annotations as objects, not strings, for Taichi to read them.
"""

import numpy as np
import pytest
import scipy.linalg
from scipy.spatial.transform import Rotation

from tisim import materials
from tisim.materials import (
    MATERIAL_NAMES,
    energy_density,
    energy_density_sigma,
    first_piola,
    gradient_sigma,
    hessian_sigma,
    piola_derivative,
    polar_rotation,
    project_psd,
    rotation_derivative,
    svd_rotation_variant,
)
from tisim.testing import check_gradient, check_hessian

MU, LAM = 3.0e5, 1.2e6  # Pa; nu ~ 0.4


def rotations(count, seed):
    return Rotation.random(count, random_state=seed).as_matrix()


def random_F(rng, scale, count, min_det=0.2):
    """count deformation gradients I + scale * N(0,1) with det >= min_det (resampled)."""
    out = []
    while len(out) < count:
        F = np.eye(3) + scale * rng.standard_normal((3, 3))
        if np.linalg.det(F) >= min_det:
            out.append(F)
    return np.array(out)


def far_F(seed):
    """Large stretches/compressions with a rotation on each side, det > 0."""
    R = rotations(6, seed)
    S = np.array([[2.5, 0.6, 1.3], [0.35, 1.0, 1.8], [3.0, 2.0, 0.5]])
    return np.array([R[2 * k] @ np.diag(S[k]) @ R[2 * k + 1] for k in range(3)])


def point_cases():
    rng = np.random.default_rng(7)
    near = random_F(rng, 0.05, 2)
    mid = random_F(rng, 0.4, 2)
    return {"near": near, "mid": mid, "far": far_F(3)}


CASES = point_cases()


def wrap(name, mu, lam):
    f = lambda x: float(energy_density(name, x, mu, lam))
    g = lambda x: first_piola(name, x, mu, lam)
    h = lambda x: piola_derivative(name, x, mu, lam)
    return f, g, h


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", MATERIAL_NAMES)
def test_gradient_and_hessian_match_finite_differences(name, case):
    f, g, h = wrap(name, MU, LAM)
    for k, F in enumerate(CASES[case]):
        rg = check_gradient(f, g, F, rng=k)
        rh = check_hessian(g, h, F, rng=k)
        # tighter than the default tolerance: the FD error is ~1e-9 relative here
        assert rg.max_rel_error < 1e-7, (name, case, k, rg)
        assert rh.max_rel_error < 1e-7, (name, case, k, rh)


@pytest.mark.parametrize("name", MATERIAL_NAMES)
def test_hessian_at_rest_matches_finite_differences(name):
    # P(I) = 0 (so no gradient check with the nonzero guard here) but dP/dF(I) != 0
    f, g, h = wrap(name, MU, LAM)
    F = rotations(1, 11)[0]
    # near rest psi is a small difference of O(mu + lam) terms: declare that scale
    # so the checker knows the finite differences are round-off there
    check_gradient(f, g, F, require_nonzero=False, value_scale=10 * (MU + LAM))
    with pytest.raises(AssertionError, match="zero"):
        check_gradient(f, g, F, value_scale=10 * (MU + LAM))  # the nonzero guard refuses
    check_hessian(g, h, F)
    check_hessian(g, h, np.eye(3))


@pytest.mark.parametrize("name", ["arap", "corotated", "neo-hookean", "symmetric-dirichlet"])
def test_derivatives_at_inverted_F(name):
    """Energies finite for J < 0 keep correct derivatives there (away from the ARAP kink,
    which needs sigma_1 + sigma_2 = 0: here sigma = (1.4, 0.9, -0.5))."""
    f, g, h = wrap(name, MU, LAM)
    R = rotations(2, 5)
    F = R[0] @ np.diag([1.4, 0.9, -0.5]) @ R[1]
    assert np.linalg.det(F) < 0
    check_gradient(f, g, F)
    check_hessian(g, h, F)


@pytest.mark.parametrize("name", MATERIAL_NAMES)
def test_rest_state_invariance(name):
    R = rotations(20, 1)
    psi = energy_density(name, R, MU, LAM)
    P = first_piola(name, R, MU, LAM)
    # round-off: psi ~ mu * (1e-16 * few), P ~ mu * 1e-15
    assert np.all(np.abs(psi) < 1e-9 * MU), psi
    assert np.all(np.abs(P) < 1e-9 * MU)
    assert energy_density(name, np.eye(3), MU, LAM) == pytest.approx(0.0, abs=1e-12 * MU)
    # away from rest the energy is positive: psi(F) > 0 = psi(R) for a stretch
    assert np.all(energy_density(name, CASES["mid"], MU, LAM) > 0.0)


@pytest.mark.parametrize("name", MATERIAL_NAMES)
def test_objectivity_and_isotropy(name):
    F = np.concatenate([CASES["mid"], CASES["far"]])
    Q = rotations(len(F), 2)
    psi = energy_density(name, F, MU, LAM)
    P = first_piola(name, F, MU, LAM)
    np.testing.assert_allclose(energy_density(name, Q @ F, MU, LAM), psi, rtol=1e-11)
    np.testing.assert_allclose(energy_density(name, F @ Q, MU, LAM), psi, rtol=1e-11)
    # and the stresses transform accordingly: P(QF) = Q P(F), P(FQ) = P(F) Q
    scale = np.abs(P).max()
    np.testing.assert_allclose(first_piola(name, Q @ F, MU, LAM), Q @ P, atol=1e-10 * scale)
    np.testing.assert_allclose(first_piola(name, F @ Q, MU, LAM), P @ Q, atol=1e-10 * scale)


@pytest.mark.parametrize("name", ["corotated", "neo-hookean", "neo-hookean-log", "arap"])
def test_linearisation_is_linear_elasticity(name):
    """dP/dF at F = I equals the isotropic elasticity tensor of (mu, lam):
    C_ijkl = mu (d_ik d_jl + d_il d_jk) + lam d_ij d_kl (lam = 0 for ARAP)."""
    d = np.eye(3)
    lam = 0.0 if name == "arap" else LAM
    C = (
        MU * (np.einsum("ik,jl->ijkl", d, d) + np.einsum("il,jk->ijkl", d, d)) + lam * np.einsum("ij,kl->ijkl", d, d)
    ).reshape(9, 9)
    np.testing.assert_allclose(piola_derivative(name, np.eye(3), MU, LAM), C, atol=1e-9 * LAM)


def test_stable_neo_hookean_formula():
    """The documented formula, evaluated by hand, and its smoothness through J = 0."""
    F = CASES["far"][0]
    J, Ic = np.linalg.det(F), np.sum(F * F)
    lp = LAM + MU
    expect = 0.5 * MU * (Ic - 3) - MU * (J - 1) + 0.5 * lp * (J - 1) ** 2
    assert energy_density("neo-hookean", F, MU, LAM) == pytest.approx(expect, rel=1e-13)
    # flat and inverted: finite energy, stress and Hessian (inversion-safe)
    for s3 in (0.0, -0.3):
        G = np.diag([1.2, 0.8, s3])
        assert np.isfinite(energy_density("neo-hookean", G, MU, LAM))
        assert np.all(np.isfinite(piola_derivative("neo-hookean", G, MU, LAM)))
    f, g, h = wrap("neo-hookean", MU, LAM)
    check_gradient(f, g, np.diag([1.2, 0.8, 0.0]))
    check_hessian(g, h, np.diag([1.2, 0.8, 0.0]))


@pytest.mark.parametrize("name", ["neo-hookean-log", "symmetric-gradient", "symmetric-dirichlet"])
def test_barrier_energies_outside_domain(name):
    flat = np.diag([1.0, 1.0, 0.0])
    assert energy_density(name, flat, MU, LAM) == np.inf
    inv = np.diag([1.0, 1.0, -0.5])
    if name == "symmetric-dirichlet":  # defined through F^-1, finite for J < 0
        assert np.isfinite(energy_density(name, inv, MU, LAM))
    else:
        assert energy_density(name, inv, MU, LAM) == np.inf
        assert np.all(np.isnan(first_piola(name, inv, MU, LAM)))
        assert np.all(np.isnan(piola_derivative(name, inv, MU, LAM)))
    # the barrier grows as J -> 0+
    e = energy_density(name, np.stack([np.diag([1, 1, t]) for t in (1e-1, 1e-3, 1e-6)]), MU, LAM)
    assert np.all(np.diff(e) > 0)
    assert np.isfinite(energy_density(name, np.eye(3), MU, LAM))


def test_batched_parameters_match_per_element_loop():
    F = np.concatenate([CASES["mid"], CASES["far"]])
    mu = np.linspace(1e4, 1e6, len(F))
    lam = np.linspace(5e5, 2e4, len(F))
    for name in MATERIAL_NAMES:
        psi = energy_density(name, F, mu, lam)
        P = first_piola(name, F, mu, lam)
        H = piola_derivative(name, F, mu, lam)
        assert psi.shape == (len(F),) and P.shape == (len(F), 3, 3) and H.shape == (len(F), 9, 9)
        for e in range(len(F)):
            assert psi[e] == pytest.approx(float(energy_density(name, F[e], mu[e], lam[e])), rel=1e-14)
            np.testing.assert_allclose(P[e], first_piola(name, F[e], mu[e], lam[e]), rtol=1e-13, atol=1e-6)
            np.testing.assert_allclose(H[e], piola_derivative(name, F[e], mu[e], lam[e]), rtol=1e-12, atol=1e-5)
    # a single F gives unbatched shapes
    assert energy_density("arap", np.eye(3), MU, LAM).shape == ()
    assert piola_derivative("arap", np.eye(3), MU, LAM).shape == (9, 9)
    with pytest.raises(ValueError):
        energy_density("arap", F, np.ones(2), LAM)
    with pytest.raises(KeyError, match="unknown material"):
        energy_density("rubber", F, MU, LAM)


def test_vec_convention_is_row_major():
    """H[3i + j, 3k + l] = dP_ij / dF_kl: perturbing F[0, 1] moves P along column 1 of H."""
    F = CASES["far"][1]
    H = piola_derivative("neo-hookean", F, MU, LAM)
    E = np.zeros((3, 3))
    E[0, 1] = 1e-6
    dP = (first_piola("neo-hookean", F + E, MU, LAM) - first_piola("neo-hookean", F - E, MU, LAM)) / 2e-6
    np.testing.assert_allclose(H[:, 1], dP.reshape(9), rtol=1e-6, atol=1e-6 * np.abs(H).max())


# ---------------------------------------------------------------------------
# PSD projection


@pytest.mark.parametrize("name", MATERIAL_NAMES)
def test_projected_hessian_is_psd_and_exact_when_already_psd(name):
    F = np.concatenate([CASES["near"], CASES["mid"], CASES["far"], rotations(2, 9)])
    H = piola_derivative(name, F, MU, LAM)
    Hp = piola_derivative(name, F, MU, LAM, project_psd=True)
    scale = np.abs(H).max(axis=(1, 2))
    w = np.linalg.eigvalsh(Hp)
    assert np.all(w >= -1e-10 * scale[:, None])
    np.testing.assert_allclose(Hp, np.swapaxes(Hp, 1, 2), atol=1e-12 * scale.max())
    w0 = np.linalg.eigvalsh(H)
    psd = w0.min(axis=1) >= -1e-12 * scale
    for e in np.flatnonzero(psd):
        np.testing.assert_allclose(Hp[e], H[e], atol=1e-9 * scale[e])
    for e in np.flatnonzero(~psd):
        # Hp - H adds exactly the clamped negative part: PSD, and with rank = #negatives
        D = Hp[e] - H[e]
        wd = np.linalg.eigvalsh(D)
        assert wd.min() >= -1e-9 * scale[e]
        np.testing.assert_allclose(
            np.sort(wd)[::-1][: int((w0[e] < 0).sum())],
            np.sort(-w0[e][w0[e] < 0])[::-1],
            rtol=1e-8,
            atol=1e-9 * scale[e],
        )


def test_some_hessians_are_indefinite_so_projection_is_exercised():
    # stretched corotated/ARAP and compressed stable NH are indefinite
    F = CASES["far"]
    assert np.linalg.eigvalsh(piola_derivative("arap", F, MU, LAM)).min() < 0
    G = np.diag([0.5, 0.5, 0.5])
    assert np.linalg.eigvalsh(piola_derivative("neo-hookean", G, MU, LAM)).min() < 0


def test_project_psd_floor_and_nonfinite_passthrough():
    A = np.diag([3.0, -1.0, 0.5])
    np.testing.assert_allclose(project_psd(A), np.diag([3.0, 0.0, 0.5]), atol=1e-15)
    np.testing.assert_allclose(project_psd(A, floor=1.0), np.diag([3.0, 1.0, 1.0]), atol=1e-14)
    B = np.full((3, 3), np.nan)
    assert np.all(np.isnan(project_psd(np.stack([A, B]))[1]))


# ---------------------------------------------------------------------------
# singular-value forms


@pytest.mark.parametrize("name", MATERIAL_NAMES)
def test_sigma_forms_agree_with_matrix_forms(name):
    F = np.concatenate([CASES["near"], CASES["mid"], CASES["far"]])
    U, s, V = svd_rotation_variant(F)
    np.testing.assert_allclose(
        energy_density_sigma(name, s, MU, LAM),
        energy_density(name, F, MU, LAM),
        rtol=1e-11,
        atol=1e-9,
    )
    # dpsi/dsigma_i = (U^T P V)_ii, and U^T P V is diagonal for an isotropic energy
    P = first_piola(name, F, MU, LAM)
    Pd = np.swapaxes(U, 1, 2) @ P @ V
    scale = np.abs(P).max()
    np.testing.assert_allclose(np.diagonal(Pd, axis1=1, axis2=2), gradient_sigma(name, s, MU, LAM), atol=1e-9 * scale)
    off = Pd - np.einsum("mi,ij->mij", np.diagonal(Pd, axis1=1, axis2=2), np.eye(3))
    assert np.abs(off).max() < 1e-9 * scale


@pytest.mark.parametrize("name", MATERIAL_NAMES)
def test_sigma_derivatives_match_finite_differences(name):
    f = lambda s: float(energy_density_sigma(name, s, MU, LAM))
    g = lambda s: gradient_sigma(name, s, MU, LAM)
    h = lambda s: hessian_sigma(name, s, MU, LAM)
    for s in ([1.3, 0.8, 0.6], [2.5, 1.0, 0.35], [0.9, 0.7, 0.2]):
        check_gradient(f, g, np.array(s))
        check_hessian(g, h, np.array(s))
    check_hessian(g, h, np.ones(3))


def test_sigma_forms_vectorised_and_domain():
    s = np.array([[1.0, 1.0, 1.0], [1.2, 0.9, -0.4]])
    assert np.all(energy_density_sigma("symmetric-gradient", s, MU, LAM) == [0.0, np.inf])
    assert np.all(np.isnan(gradient_sigma("neo-hookean-log", s, MU, LAM)[1]))
    assert np.all(np.isfinite(hessian_sigma("neo-hookean", s, MU, LAM)))
    # ADMM note 2.6: with lam = 0 Neo-Hookean (log) equals SymG up to the constant -3 mu/2 ... + 3mu/2
    s2 = np.array([[1.3, 0.8, 0.6]])
    a = energy_density_sigma("neo-hookean-log", s2, MU, 0.0)
    b = energy_density_sigma("symmetric-gradient", s2, MU, 0.0)
    assert a == pytest.approx(b, rel=1e-13)


# ---------------------------------------------------------------------------
# polar rotation


def test_polar_rotation_properties():
    F = np.concatenate([CASES["mid"], CASES["far"], [np.diag([1.4, 0.9, -0.5])]])
    R = polar_rotation(F)
    np.testing.assert_allclose(R @ np.swapaxes(R, 1, 2), np.broadcast_to(np.eye(3), R.shape), atol=1e-13)
    np.testing.assert_allclose(np.linalg.det(R), 1.0, atol=1e-13)
    S = np.swapaxes(R, 1, 2) @ F
    np.testing.assert_allclose(S, np.swapaxes(S, 1, 2), atol=1e-12)
    for e in range(len(F)):
        if np.linalg.det(F[e]) > 0:
            Rs, _ = scipy.linalg.polar(F[e])
            np.testing.assert_allclose(R[e], Rs, atol=1e-12)
    # for det F < 0 R still maximises tr(R^T F) over SO(3): no random rotation does better
    Fi = F[-1]
    best = np.trace(R[-1].T @ Fi)
    Q = rotations(2000, 4)
    assert np.all(np.einsum("mij,ij->m", Q, Fi) <= best + 1e-12)
    U, s, V = svd_rotation_variant(F)
    np.testing.assert_allclose(U @ (s[:, :, None] * np.swapaxes(V, 1, 2)), F, atol=1e-12)
    assert np.all(s[:, 0] >= s[:, 1]) and np.all(s[:, 1] >= np.abs(s[:, 2]))


def test_rotation_derivative_matches_finite_differences():
    Rf = lambda x: polar_rotation(x)
    dR = lambda x: rotation_derivative(x).reshape(9, 9)
    for F in (CASES["mid"][0], CASES["far"][0], np.diag([1.4, 0.9, -0.5]) @ rotations(1, 3)[0]):
        check_hessian(Rf, dR, F, symmetric=False)


def test_registry():
    assert materials.names() == MATERIAL_NAMES
    from tisim.scene import MATERIALS as SCENE_MATERIALS

    assert set(SCENE_MATERIALS) <= set(materials.names())
    m = materials.get("neo-hookean")
    assert m.name == "neo-hookean" and m.inversion_safe and not m.uses_rotation
    F = CASES["far"]
    np.testing.assert_array_equal(m.energy_density(F, MU, LAM), energy_density("neo-hookean", F, MU, LAM))
    np.testing.assert_array_equal(
        m.piola_derivative(F, MU, LAM, project_psd=True),
        piola_derivative("neo-hookean", F, MU, LAM, project_psd=True),
    )
    assert materials.get("corotated").uses_rotation and materials.get("arap").uses_rotation
    assert materials.get("symmetric-gradient").barrier
    with pytest.raises(KeyError, match="expected one of"):
        materials.get("rubber")


# ---------------------------------------------------------------------------
# Taichi @ti.func versions against the numpy reference (f64, CPU)

import taichi as ti

from tisim import backend
from tisim.materials import ti_funcs as tf

TI_NAMES = (
    "neo-hookean",
    "neo-hookean-log",
    "arap",
    "corotated",
    "symmetric-dirichlet",
    "symmetric-gradient",
)


@pytest.fixture
def ti_f64():
    backend.init("cpu", "f64")  # idempotent; the project conftest may already have done it
    if backend.current().precision != "f64":
        pytest.skip("needs the f64 backend")


@ti.kernel
def _ti_energies(
    F: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    R: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    mu: ti.f64,
    lam: ti.f64,
    psi: ti.types.ndarray(ndim=2),
    P: ti.types.ndarray(dtype=ti.math.mat3, ndim=2),
):
    for e in range(F.shape[0]):
        Fe, Re = F[e], R[e]
        psi[e, 0] = tf.energy_density_nh(Fe, mu, lam)
        P[e, 0] = tf.first_piola_nh(Fe, mu, lam)
        psi[e, 1] = tf.energy_density_nh_log(Fe, mu, lam)
        P[e, 1] = tf.first_piola_nh_log(Fe, mu, lam)
        psi[e, 2] = tf.energy_density_arap(Fe, Re, mu)
        P[e, 2] = tf.first_piola_arap(Fe, Re, mu)
        psi[e, 3] = tf.energy_density_corotated(Fe, Re, mu, lam)
        P[e, 3] = tf.first_piola_corotated(Fe, Re, mu, lam)
        psi[e, 4] = tf.energy_density_symmetric_dirichlet(Fe, mu)
        P[e, 4] = tf.first_piola_symmetric_dirichlet(Fe, mu)
        psi[e, 5] = tf.energy_density_symmetric_gradient(Fe, mu)
        P[e, 5] = tf.first_piola_symmetric_gradient(Fe, mu)


@ti.kernel
def _ti_rotations(
    F: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    guess: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    iterations: ti.i32,
    R_iter: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    R_svd: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    U: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    sigma: ti.types.ndarray(dtype=ti.math.vec3, ndim=1),
    V: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    roundtrip: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
):
    for e in range(F.shape[0]):
        R_iter[e] = tf.polar_rotation(F[e], guess[e], iterations)
        R_svd[e] = tf.polar_rotation_svd(F[e])
        Ue, se, Ve = tf.svd_rotation_variant(F[e])
        U[e], sigma[e], V[e] = Ue, se, Ve
        roundtrip[e] = tf.quat_to_matrix(tf.matrix_to_quat(guess[e]))


def run_rotations(F, guess, iterations):
    F = np.ascontiguousarray(F, dtype=np.float64)
    guess = np.ascontiguousarray(np.broadcast_to(guess, F.shape), dtype=np.float64)
    out = {k: np.zeros_like(F) for k in ("R_iter", "R_svd", "U", "V", "roundtrip")}
    out["sigma"] = np.zeros(F.shape[:1] + (3,))
    _ti_rotations(
        F,
        guess,
        iterations,
        out["R_iter"],
        out["R_svd"],
        out["U"],
        out["sigma"],
        out["V"],
        out["roundtrip"],
    )
    return out


def test_ti_energies_match_numpy(ti_f64):
    inverted = np.array([np.diag([1.4, 0.9, -0.5]) @ rotations(1, 8)[0], np.diag([1.2, 0.8, 0.0])])
    F = np.concatenate([CASES["near"], CASES["mid"], CASES["far"], rotations(2, 12), inverted])
    R = polar_rotation(F)
    psi = np.zeros((len(F), 6))
    P = np.zeros((len(F), 6, 3, 3))
    _ti_energies(F, R, MU, LAM, psi, P)
    valid = np.linalg.det(F) > 0
    for c, name in enumerate(TI_NAMES):
        ref_psi = energy_density(name, F, MU, LAM)
        ref_P = first_piola(name, F, MU, LAM)
        fin = np.isfinite(ref_psi)
        assert np.array_equal(np.isfinite(psi[:, c]), fin), name
        # same formulas in the same precision: agreement to round-off of O(mu + lam) terms
        np.testing.assert_allclose(psi[fin, c], ref_psi[fin], rtol=1e-12, atol=1e-10 * (MU + LAM), err_msg=name)
        ok = fin & (valid | (name in ("neo-hookean", "arap", "corotated")))
        np.testing.assert_allclose(P[ok, c], ref_P[ok], rtol=1e-12, atol=1e-10 * (MU + LAM), err_msg=name)
        if name in ("neo-hookean-log", "symmetric-gradient"):
            assert np.all(psi[~valid, c] == np.inf) and np.all(np.isnan(P[~valid, c]))


def test_ti_rotation_svd_matches_numpy(ti_f64):
    F = np.concatenate([CASES["mid"], CASES["far"], [np.diag([1.4, 0.9, -0.5]) @ rotations(1, 8)[0]]])
    out = run_rotations(F, np.eye(3), 30)
    R = polar_rotation(F)
    _, s_ref, _ = svd_rotation_variant(F)
    # ti.svd (Sifakis et al.'s 3x3 SVD) reaches ~1e-9 in f64, independently of its
    # sweep count (measured 2e-9 on stretches of 2 decades): that bounds these
    np.testing.assert_allclose(out["R_svd"], R, atol=1e-8)
    np.testing.assert_allclose(out["sigma"], s_ref, atol=1e-8 * np.abs(s_ref).max())
    np.testing.assert_allclose(out["U"] @ (out["sigma"][:, :, None] * np.swapaxes(out["V"], 1, 2)), F, atol=1e-8)
    np.testing.assert_allclose(np.linalg.det(out["U"]), 1.0, atol=1e-8)
    np.testing.assert_allclose(np.linalg.det(out["V"]), 1.0, atol=1e-8)
    # the SVD rotation as a warm start: two Newton iterations polish it to round-off
    polished = run_rotations(F, out["R_svd"], 2)["R_iter"]
    np.testing.assert_allclose(polished, R, atol=1e-13)


def _angle_error(R, Rref):
    """Rotation angle of R Rref^T per element, radians (from ||R - Rref||_F = 2 sqrt(2) sin(angle/2),
    accurate for small angles, unlike the arccos of the trace)."""
    d = np.linalg.norm(R - Rref, axis=(1, 2))
    return 2.0 * np.arcsin(np.clip(d / (2.0 * np.sqrt(2.0)), 0.0, 1.0))


def test_ti_polar_rotation_iterative(ti_f64):
    """The SVD-free rotation against the numpy polar rotation.

    Tolerance: near the answer the iteration is Newton on tr(R^T F), so once it
    has converged the error is round-off amplified by the conditioning of R(F),
    ~ machine_eps * sigma_max / (sigma_j + sigma_k) <= 1e-14 for the F here
    (sigma ratios <= 20); we allow 1e-12. Iteration counts: 3 from a warm start
    within 0.1 rad (quadratic convergence: 2e-3 -> 4e-10 -> 5e-15 rad measured),
    10 from arbitrary rotations (5 measured).
    """
    rng = np.random.default_rng(5)
    F = np.concatenate([random_F(rng, 0.5, 40, min_det=0.05), far_F(21), far_F(22)])
    R = polar_rotation(F)
    # far: arbitrary warm starts, including exact half-turns away from the answer
    far = rotations(len(F), 13)
    far[:3] = R[:3] @ np.diag([1.0, -1.0, -1.0])  # critical points of tr(R^T F)
    out = run_rotations(F, far, 10)
    assert _angle_error(out["R_iter"], R).max() < 1e-12
    # near: a warm start 0.1 rad off, as in a solver reusing the last rotation
    near = Rotation.from_rotvec(0.1 * rng.standard_normal((len(F), 3))).as_matrix() @ R
    out = run_rotations(F, near, 3)
    assert _angle_error(out["R_iter"], R).max() < 1e-12
    one = run_rotations(F, near, 1)["R_iter"]
    assert _angle_error(one, R).max() > 1e-6  # one iteration is not enough: the count matters
    # always a proper rotation, whatever the count
    for it in (0, 1, 2):
        Ri = run_rotations(F, far, it)["R_iter"]
        np.testing.assert_allclose(Ri @ np.swapaxes(Ri, 1, 2), np.broadcast_to(np.eye(3), F.shape), atol=1e-14)
        np.testing.assert_allclose(np.linalg.det(Ri), 1.0, atol=1e-14)


def test_ti_polar_rotation_hard_cases(ti_f64):
    Q = rotations(8, 31)
    sig = np.array(
        [
            [1.3, 0.8, 1e-9],  # flattened element
            [1.0, 1e-3, 1e-3],  # nearly a line: R about the long axis ill-conditioned (1/2e-3)
            [1.4, 0.9, -0.5],  # inverted
            [1.0, 1.0, 1.0],  # a pure rotation
        ]
    )
    F = np.array([Q[2 * k] @ np.diag(s) @ Q[2 * k + 1] for k, s in enumerate(sig)])
    cond = sig[:, 0] / (sig[:, 1] + sig[:, 2])
    half_turn = Rotation.from_rotvec([0.0, 0.0, np.pi]).as_matrix()
    R = polar_rotation(F)
    for guess in (np.eye(3), R @ half_turn, rotations(len(F), 40)):
        out = run_rotations(F, guess, 60)
        assert np.all(_angle_error(out["R_iter"], R) < 1e-12 * np.maximum(cond, 1.0)), _angle_error(out["R_iter"], R)
    # the identity start on a half-turn rotation F is a critical point: escaped
    Fh = np.array([half_turn, half_turn @ np.diag([2.0, 0.5, 1.0])])
    out = run_rotations(Fh, np.eye(3), 20)
    np.testing.assert_allclose(out["R_iter"], polar_rotation(Fh), atol=1e-13)
    # scale invariance (tiny and huge F) and F = 0 (returns the guess)
    for scale in (1e-12, 1e9):
        out = run_rotations(scale * F[:1], np.eye(3), 40)
        assert _angle_error(out["R_iter"], R[:1]).max() < 1e-12
    g = rotations(1, 50)
    out = run_rotations(np.zeros((1, 3, 3)), g, 10)
    np.testing.assert_allclose(out["R_iter"], g, atol=1e-15)


def test_ti_polar_rotation_random_batch(ti_f64):
    """Many random F, inverted ones included, from random starts: monotone ascent
    with Newton near the answer converges for all within 60 iterations (measured:
    0.15 % need more than 10, none more than 60 over 20,000). F within 1e-3 of the
    kink (sigma_2 + sigma_3 <= 1e-3 sigma_1) is excluded: R(F) is ill-posed there."""
    rng = np.random.default_rng(9)
    F = np.eye(3) + 0.7 * rng.standard_normal((4000, 3, 3))
    s = np.abs(np.linalg.svd(F)[1])
    ok = (s[:, 1] + s[:, 2]) > 1e-3 * s[:, 0]
    assert (np.linalg.det(F) < 0).sum() > 100  # the batch does exercise inverted F
    R = polar_rotation(F)
    err = _angle_error(run_rotations(F, rotations(len(F), 77), 60)["R_iter"], R)
    cond = s[:, 0] / (s[:, 1] + s[:, 2])
    assert np.all(err[ok] < 1e-13 * cond[ok] + 1e-13), err[ok].max()


def test_ti_quaternion_roundtrip(ti_f64):
    # includes half-turns about each axis and a generic axis (the Shepperd branches)
    rv = np.array([[np.pi, 0, 0], [0, np.pi, 0], [0, 0, np.pi], [1.0, 1.0, 1.0], [0, 0, 0], [2.0, -0.5, 0.3]])
    G = np.concatenate([Rotation.from_rotvec(rv).as_matrix(), rotations(20, 60)])
    out = run_rotations(G, G, 0)
    np.testing.assert_allclose(out["roundtrip"], G, atol=1e-14)
    np.testing.assert_allclose(out["R_iter"], G, atol=1e-14)  # 0 iterations: the guess itself


# ---------------------------------------------------------------------------
# Half-turn guard of the warm-started rotation extraction (issue 12)

from tisim.solvers.pd.local import fast_rotation


@ti.kernel
def _ti_guarded(
    F: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    q0: ti.types.ndarray(dtype=ti.math.vec4, ndim=1),
    iterations: ti.i32,
    guard: ti.i32,
    R: ti.types.ndarray(dtype=ti.math.mat3, ndim=1),
    same: ti.types.ndarray(ndim=1),
    certified: ti.types.ndarray(ndim=1),
):
    """fast_rotation from q0 (guard = 0) or from polar_rotation_guard(F, q0) (guard = 1)."""
    for e in range(F.shape[0]):
        q = q0[e]
        if guard:
            q = tf.polar_rotation_guard(F[e], q0[e])
        same[e] = 1 if (q - q0[e]).norm() == 0.0 else 0
        R[e] = tf.quat_to_matrix(fast_rotation(F[e], q, iterations))
        certified[e] = tf.is_polar_maximum(F[e], tf.quat_to_matrix(q0[e]))


def run_guarded(F, R0, iterations):
    """{"R_bare", "R_guarded": (m, 3, 3), "same": guard kept q0, "certified": q0 passed}."""
    F = np.ascontiguousarray(F, dtype=np.float64)
    q0 = np.ascontiguousarray(
        np.roll(Rotation.from_matrix(np.broadcast_to(R0, F.shape)).as_quat(), 1, axis=1)
    )  # (w, x, y, z)
    out = {}
    for guard, key in ((0, "R_bare"), (1, "R_guarded")):
        out[key] = np.zeros_like(F)
        out["same"] = np.zeros(len(F), dtype=np.int32)
        out["certified"] = np.zeros(len(F), dtype=np.int32)
        _ti_guarded(F, q0, iterations, guard, out[key], out["same"], out["certified"])
    return out


def half_turn_cases(rng, count):
    """F = R S: rotations R about random and coordinate axes by angles spread over
    (0, pi] and crowded towards pi (pi - 10^-k, k = 1..8, and pi itself), times stretches
    S = Q diag(s) Q^T with s in [0.5, 2] (or S = I)."""
    angles = np.concatenate([rng.uniform(0.0, np.pi, count), np.pi - 10.0 ** -np.arange(1, 9), [np.pi] * 4])
    axes = rng.standard_normal((len(angles), 3))
    axes[-4:-1] = np.eye(3)
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    R = Rotation.from_rotvec(angles[:, None] * axes).as_matrix()
    Q = rotations(len(angles), 91)
    s = rng.uniform(0.5, 2.0, (len(angles), 3))
    S = Q @ (s[:, :, None] * np.swapaxes(Q, 1, 2))
    return np.concatenate([R, R @ S]), np.concatenate([np.ones(len(R)), s.max(1) / s.min(1)])


def test_polar_optimality_certificate():
    """numpy twin of the guard: the SVD polar rotation has g = 0 and m >= 0 (inverted F
    included, at the rotation-variant convention); a rotation a half-turn away is a
    critical point (g = 0) with m < 0, and for F a rotation m = 2 cos(angle off)."""
    from tisim.materials.polar import polar_optimality

    rng = np.random.default_rng(3)
    F = np.concatenate([random_F(rng, 0.5, 30), far_F(4), [np.diag([1.4, 0.9, -0.5])]])
    R = polar_rotation(F)
    g, m = polar_optimality(F, R)
    scale = np.linalg.norm(F, axis=(1, 2))
    assert np.abs(g).max(axis=1).max() < 1e-13 * scale.max()
    assert np.all(m >= -1e-13 * scale)
    n = rng.standard_normal((len(F), 3))
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    U, s, _V = svd_rotation_variant(F)
    axis = U[:, :, 0]  # about a singular axis the half-turn is a critical point
    body_axis = (np.swapaxes(R, 1, 2) @ axis[:, :, None])[..., 0]
    bad = R @ Rotation.from_rotvec(np.pi * body_axis).as_matrix()
    g, m = polar_optimality(F, bad)
    assert np.abs(g).max() < 1e-12 * scale.max() and np.all(m < -0.1 * s[:, 1])
    theta = rng.uniform(0.0, np.pi, len(F))
    Rn = Rotation.from_rotvec(theta[:, None] * n).as_matrix()
    _, m = polar_optimality(np.eye(3), Rn)  # F = I, R theta off about n
    np.testing.assert_allclose(m, np.minimum(2 * np.cos(theta), 1 + np.cos(theta)), atol=1e-12)


def test_rotation_guard_near_half_turns(ti_f64):
    """The PD local step's warm-started extraction (fast_rotation) from an identity warm
    start passed through the guard (polar_rotation_guard: kept when it passes the
    second-order test, else replaced by the SVD polar rotation), against the numpy SVD
    polar rotation, for rotations up to and including half-turns, with and without
    stretch. Bare, the iteration stalls at an exact half-turn (off by 2.0 in the diagonal:
    g = 0 at the start); every start it fails from is one the guard rejects, and the
    guarded extraction matches the polar rotation to round-off times max(s) / min(s).
    The guard keeps (bit for bit, no SVD) every start under a quarter-turn off."""
    rng = np.random.default_rng(21)
    F, cond = half_turn_cases(rng, 200)
    R = polar_rotation(F)
    out = run_guarded(F, np.eye(3), 20)
    err = _angle_error(out["R_guarded"], R)
    assert np.all(err < 1e-12 * cond), err.max()
    bare = _angle_error(out["R_bare"], R)
    wrong = bare > 1e-6
    assert np.all(out["certified"][wrong] == 0) and np.all(out["same"][wrong] == 0)
    assert np.array_equal(out["same"], out["certified"])  # replaced exactly when rejected
    # F a rotation: the identity start is m = 2 cos(angle) from the maximum, so it is
    # kept under a quarter-turn and replaced beyond, near half-turns included
    pure = cond == 1.0
    angle = Rotation.from_matrix(F[pure]).magnitude()
    flag = out["certified"][pure]
    assert np.all(flag[angle < np.pi / 2 - 1e-6] == 1)
    assert np.all(flag[angle > np.pi / 2 + 1e-6] == 0)
    # solver-like warm starts (0.1 rad off) are never replaced
    near = Rotation.from_rotvec(0.1 * rng.standard_normal((len(F), 3))).as_matrix() @ R
    out = run_guarded(F, near, 1)
    assert np.all(out["same"] == 1)
    np.testing.assert_array_equal(out["R_guarded"], out["R_bare"])


def test_rotation_guard_from_bad_warm_starts(ti_f64):
    """Warm starts a half-turn (and 1e-4 short of one) away from the answer about each
    singular axis, and random rotations: guarded, the extraction matches the polar
    rotation for stretched, compressed and inverted F."""
    rng = np.random.default_rng(8)
    F = np.concatenate([random_F(rng, 0.5, 40, min_det=0.05), far_F(23), [np.diag([1.4, 0.9, -0.5])]])
    R = polar_rotation(F)
    U, s, _ = svd_rotation_variant(F)
    cond = np.abs(s[:, 0]) / (s[:, 1] + s[:, 2])
    starts = [rotations(len(F), 17)]
    for k in range(3):
        for a in (np.pi, np.pi - 1e-4):
            starts.append(Rotation.from_rotvec(a * U[:, :, k]).as_matrix() @ R)
    for R0 in starts:
        out = run_guarded(F, R0, 20)
        err = _angle_error(out["R_guarded"], R)
        assert np.all(err < 1e-12 * np.maximum(cond, 1.0)), err.max()
