"""Progressive prolongation on a decimated (non-Loop) hierarchy, where the extrinsic
offsets a(x) of P(x) = U x + a(x) are not zero (notes §2.2-§2.4).

The Loop hierarchies of test_progressive.py have a(x) = 0 at rest, so a refiner that
drops the offsets, or prolongs momentum through P instead of its linear part U, passes
there. Here a closed cloth sphere is decimated, so the fine rest shape differs from
U X_coarse by millimetres, and the expected values come from the rest shapes and rigid
motions (P(R X_c + t) = R X_f + t, the defining properties of the embedding, checked in
test_hierarchy.py), not from P.apply:

* the prolonged shell energy Psi_L(P(x)) is zero with a zero gradient at the coarse rest
  shape, while Psi_L(U x) without the offsets is far from it;
* its gradient is U^T grad Psi_L with the offsets frozen (finite differences);
* the inertial target is P(x_l) + U (x_l - x_l^prev) (the momentum through U): after a
  rigid motion of the coarse level it is R X_f + t + U (x_l - x_l^prev);
* the finer level's initial velocity is U v_coarse, whose momentum equals the coarse
  level's (consistent masses, m_f^T U = m_c^T).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from tisim.progressive import ProgressiveRefiner, ProlongedShell
from tisim.scene import scene_from_dict
from tisim.testing import check_gradient

pytest.importorskip("fast_simplification")

V = np.array([0.1, -0.3, 0.2])
OMEGA = np.array([1.0, 2.0, -0.5])


@pytest.fixture(scope="module")
def refiner(tmp_path_factory):
    sc = scene_from_dict(
        {
            "solver": {"type": "cloth"},
            "sim": {"dt": 0.01},
            "objects": {
                "c": {
                    "kind": "cloth",
                    "generator": "sphere",
                    "radius": 0.1,
                    "sphere_subdivisions": 3,
                    "youngs_modulus": 1e5,
                    "poisson_ratio": 0.3,
                    "thickness": 1e-3,
                    "density": 200.0,
                    "velocity": V.tolist(),
                    "angular_velocity": OMEGA.tolist(),
                }
            },
            "refine": {"levels": 2, "method": "decimate", "coarse_vertices": [60, 120]},
        }
    )
    return ProgressiveRefiner(sc, tmp_path_factory.mktemp("refine"), progress=False, export_meshes=False)


def _parts(refiner):
    H = refiner.hierarchy
    P = H.prolongations[0]
    return P, H.levels[0], H.levels[1]


def test_hierarchy_is_decimated_with_nonzero_offsets(refiner):
    P, coarse, fine = _parts(refiner)
    assert fine.vertex_count > 2 * coarse.vertex_count
    # the linear part alone misses the fine rest shape by millimetres (0.1 m sphere)
    miss = np.linalg.norm(P.U @ coarse.vertices - fine.vertices, axis=1).max()
    assert miss > 1e-3, miss


def test_prolonged_shell_is_at_rest_at_the_coarse_rest_shape(refiner):
    P, coarse, _ = _parts(refiner)
    term = refiner.fine_term()
    ps = ProlongedShell(term, P)
    # a Newton iterate elsewhere first: the offsets must follow the iterate (notes §2.4)
    bent = coarse.vertices @ np.diag([1.0, 1.2, 0.9])
    ps.evaluate(bent, hessian=True)
    E, g, _ = ps.evaluate(coarse.vertices.copy(), hessian=True)
    # without the offsets the same coarse shape bends and stretches the fine sheet
    E_linear = term.evaluate(P.U @ coarse.vertices, energy_only=True, folded=False)[0]
    assert E_linear > 1e-6, E_linear
    assert abs(E) <= 1e-9 * E_linear, (E, E_linear)
    # and the gradient vanishes: the rest state is an equilibrium (a force scale: the
    # gradient the linear prolongation leaves, restricted to the coarse level)
    g_lin = P.U.T @ term.evaluate(P.U @ coarse.vertices, hessian=False, folded=False)[1].reshape(-1, 3)
    assert np.abs(g).max() <= 1e-7 * np.abs(g_lin).max()


def test_prolonged_shell_gradient_with_frozen_offsets(refiner, rng):
    P, coarse, _ = _parts(refiner)
    term = refiner.fine_term()
    ps = ProlongedShell(term, P)
    x0 = coarse.vertices + 2e-3 * rng.normal(size=coarse.vertices.shape)
    a0 = P.offsets(x0)
    _, g0, _ = ps.evaluate(x0, hessian=False)

    def f(x):
        return term.evaluate(P.U @ x + a0, energy_only=True, folded=False)[0]

    check_gradient(
        f,
        lambda x: g0 if np.array_equal(x, x0) else ps.evaluate(x, hessian=False)[1],
        x0,
        eps=1e-7,
        rtol=1e-5,
        rng=1,
        full_max=0,
    )


@pytest.mark.parametrize("gain", [1.0, 0.5])
def test_inertial_target_prolongs_momentum_through_U(refiner, gain):
    P, coarse, fine = _parts(refiner)
    R = Rotation.from_rotvec([0.3, -0.2, 0.5]).as_matrix()
    t = np.array([0.02, -0.01, 0.03])
    xl_prev = coarse.vertices.copy()
    xl = coarse.vertices @ R.T + t
    x_fine = fine.vertices + 1e-3  # this level's own position (used when gain < 1)
    saved = refiner.scene
    try:
        refiner.scene = dataclasses.replace(saved, refine=dataclasses.replace(saved.refine, position_gain=gain))
        got = refiner.inertial_target(P, xl, xl_prev, x_fine)
    finally:
        refiner.scene = saved
    prolonged = fine.vertices @ R.T + t  # P(R X_c + t)
    velocity_part = P.U @ (xl - xl_prev)
    if gain >= 1.0:
        expected = prolonged + velocity_part
    else:
        expected = x_fine + velocity_part + gain * (prolonged - x_fine)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_initial_velocity_is_prolonged_through_U_with_the_coarse_momentum(refiner):
    P, coarse, _ = _parts(refiner)
    v0 = refiner.initial_state(0).v
    v1 = refiner.initial_state(1).v
    # the coarse level spins about its vertex mean c (model._initial_velocity); U is linear
    # with unit row sums, so U v0 = V + omega x (U X_c - c), not the fine level's own spin
    # about its own centre
    m0 = coarse.mass
    c = coarse.vertices.mean(axis=0)
    np.testing.assert_allclose(v0, V + np.cross(OMEGA, coarse.vertices - c), atol=1e-12)
    np.testing.assert_allclose(v1, V + np.cross(OMEGA, P.U @ coarse.vertices - c), atol=1e-12)
    # momentum: consistent masses make the fine level carry the coarse one's
    m1 = refiner.hierarchy.levels[1].mass
    np.testing.assert_allclose((m1[:, None] * v1).sum(0), (m0[:, None] * v0).sum(0), rtol=1e-10, atol=1e-14)
