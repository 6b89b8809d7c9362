"""ADMM with an analytic collider active, against the midpoint equations written here.

A bar thrown end-on at a wall (a plane) at 5 m/s, stepped until its end is inside the wall
(the penalty k_c/2 min(0, d)^2 per vertex is active, d = n.(x - p) the signed distance):

* a converged ADMM step satisfies the implicit midpoint rule with the penalty,
      M (q - z)/h^2 + 1/2 grad E(q_mid) + 1/2 k_c min(0, d(q_mid)) n - 1/2 M g = 0,
  with grad E from tisim.materials (numpy, not ADMM's Taichi kernels) and the penalty's
  gradient in closed form, and agrees with the independent Newton solve of the same
  equations (tisim.solvers.admm.energy_momentum.MidpointNewton, scheme "midpoint");
* the energy-momentum scheme's discrete gradient of the penalty satisfies
  sum_a f_a . (x1 - x0) = P(x1) - P(x0) exactly for penetrating states (some vertices
  crossing the surface during the step), P written here.
"""

from __future__ import annotations

import numpy as np
import pytest

from tisim.model import Model
from tisim.scene import scene_from_dict
from tisim.solvers.admm.energy_momentum import MidpointNewton
from tisim.solvers.admm.solver import SolverADMM
from tisim.solvers.baselines.common import ModelEnergy

WALL_P = np.array([-0.55, 0.0, 0.0])
WALL_N = np.array([1.0, 0.0, 0.0])
KC = 2e4


def _scene(tolerance=1e-11):
    return scene_from_dict(
        {
            "sim": {"dt": 0.001, "gravity": [0.0, -9.81, 0.0]},
            "solver": {"type": "admm", "tolerance": tolerance, "max_iterations": 50000},
            "objects": {
                "bar": {
                    "generator": "box",
                    "size": [1.0, 0.2, 0.2],
                    "resolution": [4, 1, 1],
                    "material": "neo-hookean",
                    "youngs_modulus": 1e4,
                    "poisson_ratio": 0.3,
                    "density": 1000.0,
                    "velocity": [-5.0, 0.3, 0.0],
                    "angular_velocity": [0.0, 0.0, 2.0],
                }
            },
            "colliders": {"wall": {"type": "plane", "position": WALL_P.tolist(), "normal": WALL_N.tolist()}},
            "contact": {"stiffness": KC},
        }
    )


def _penalty(x):
    d = (x - WALL_P) @ WALL_N
    return 0.5 * KC * float((np.minimum(d, 0.0) ** 2).sum())


def _penalty_gradient(x):
    d = (x - WALL_P) @ WALL_N
    return KC * np.minimum(d, 0.0)[:, None] * WALL_N


@pytest.fixture(scope="module")
def penetrating():
    """(model, solver, state a) with the bar's end inside the wall at the start of a step."""
    sc = _scene()
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    for _ in range(40):
        solver.step(a, b, sc.sim.dt)
        a, b = b, a
        if ((a.positions - WALL_P) @ WALL_N).min() < -2e-4:
            break
    assert ((a.positions - WALL_P) @ WALL_N).min() < -2e-4
    return sc, model, solver, a


def test_admm_step_is_the_midpoint_rule_with_the_penalty(penetrating):
    sc, model, solver, a = penetrating
    h = sc.sim.dt
    b = model.initial_state()
    st = solver.step(a, b, h)
    assert st.converged
    x0, v0, q = a.positions, a.velocities, b.positions
    xm = 0.5 * (x0 + q)
    assert ((xm - WALL_P) @ WALL_N).min() < 0  # the penalty acts at the midpoint
    energy = ModelEnergy(model)
    z = x0 + h * v0
    inertia = model.mass[:, None] * (q - z) / h**2
    elastic = 0.5 * energy.elastic_gradient(xm)
    contact = 0.5 * _penalty_gradient(xm)
    gravity = -0.5 * model.mass[:, None] * np.array([0.0, -9.81, 0.0])
    scale = np.abs(contact).max()
    assert scale > 1.0  # the penalty force matters (N)
    res = np.abs(inertia + elastic + contact + gravity).max()
    assert res <= 1e-6 * max(scale, np.abs(inertia).max()), (res, scale)
    # the independent Newton solve of the same equations
    newton = MidpointNewton(model, scheme="midpoint", tolerance=1e-13)
    ref = newton.solve(x0, v0, h, float(a.time))
    assert ref.converged
    diag = float(np.linalg.norm(np.ptp(x0, axis=0)))
    assert np.abs(ref.positions - q).max() <= 1e-7 * diag


def test_penalty_discrete_gradient_identity_with_penetrating_states(penetrating, rng):
    _, model, _, a = penetrating
    em = MidpointNewton(model, scheme="energy-momentum")
    energy = ModelEnergy(model)
    x0 = a.positions.copy()
    for trial in range(5):
        # a step that pushes some vertices deeper, pulls some out, moves some along the wall
        x1 = x0 + 1e-3 * rng.standard_normal(x0.shape) + [-1e-3 * trial, 0.0, 0.0]
        d0, d1 = (x0 - WALL_P) @ WALL_N, (x1 - WALL_P) @ WALL_N
        assert (d0 < 0).any() and (d1 < 0).any()
        f = em.penalty_force(x0, x1, 0.0, 1e-3)
        dP = _penalty(x1) - _penalty(x0)
        assert abs(dP) > 1e-6
        assert float((f * (x1 - x0)).sum()) == pytest.approx(dP, rel=1e-10, abs=1e-14)
        # and with the elastic discrete gradient: the whole potential's identity
        fe = em.elastic_force(x0, x1)
        dE = energy.elastic(x1) - energy.elastic(x0)
        assert float(((f + fe) * (x1 - x0)).sum()) == pytest.approx(dP + dE, rel=1e-9)
    # the midpoint scheme's penalty force is the gradient at the midpoint
    mid = MidpointNewton(model, scheme="midpoint")
    x1 = x0 + 1e-3 * rng.standard_normal(x0.shape)
    np.testing.assert_allclose(
        mid.penalty_force(x0, x1, 0.0, 1e-3), _penalty_gradient(0.5 * (x0 + x1)), rtol=1e-12, atol=1e-12
    )


def test_reported_potential_includes_the_penalty_in_closed_form(penetrating):
    """The potential ADMM reports (stats, energy drift) is elastic + gravity + k_c/2 sum
    min(0, d)^2 at a penetrating state, with the penalty written here and the elastic
    energy from tisim.materials."""
    _, model, solver, a = penetrating
    x = a.positions
    energy = ModelEnergy(model)
    P = _penalty(x)
    assert P > 1e-6
    expected = energy.elastic(x) + energy.gravity_energy(x) + P
    assert solver.potential_energy(x, float(a.time)) == pytest.approx(expected, rel=1e-9)
