"""Frictional contact in the PD solver against analytic answers (notes §5.4, §5.7-5.9).

The stick-slip scene is demos/stick-slip.toml: a stiff 0.2 m box (E = 10 MPa) resting
on a plane tilted by theta. Coulomb's law makes it stay when mu >= tan(theta) and
slide with acceleration g (sin theta - mu cos theta) otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tisim.model import Model
from tisim.scene import load_scene, scene_from_dict
from tisim.solvers.pd.solver import SolverPD

G = 9.81


def incline_overrides(angle_deg: float) -> list[str]:
    """One override tilts the incline; the box sits in its frame and tilts along."""
    return [f"colliders.incline.rotation=[0.0, 0.0, {angle_deg!r}]"]


def _build(scene):
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    s0 = model.initial_state()
    return model, solver, s0, s0.clone()


def _run(solver, s0, s1, steps, dt=0.01, each=None):
    for _ in range(steps):
        st = solver.step(s0, s1, dt)
        s0, s1 = s1, s0
        if each is not None:
            each(s0, st)
    return s0, s1, st


def _incline(demos_dir, angle, mu, extra=()):
    return load_scene(
        demos_dir / "stick-slip.toml", incline_overrides(angle) + [f"contact.mu={mu}", *extra]
    )


def _frame(angle):
    th = math.radians(angle)
    return np.array([-math.sin(th), math.cos(th), 0.0]), np.array([math.cos(th), math.sin(th), 0.0])


@pytest.mark.parametrize("ncp", ["fischer-burmeister", "min-map"])
def test_static_equilibrium_on_incline(demos_dir, ncp):
    """Sticking box: sum lambda_n = m g cos(theta), |sum lambda_t| = m g sin(theta) (notes §5.7).

    At rest (q = q_n, v_n = 0) the exact global solve gives M (q - q_tilde) / h^2 = -M g =
    sum of internal forces (zero) + contact forces, so the forces balance gravity to the
    residual of the contact solve plus what is left of the elastic settling, which
    backward Euler damps by about 3x every 5 steps (1e-8 relative after 0.6 s).
    """
    angle, mu = 10.0, 0.3
    model, solver, s0, s1 = _build(_incline(demos_dir, angle, mu, [f'contact.ncp="{ncp}"']))
    s0, s1, st = _run(solver, s0, s1, 60)
    n, t = _frame(angle)
    mg = model.mass.sum() * G
    F = solver.contact.total_force()
    assert F @ n == pytest.approx(mg * math.cos(math.radians(angle)), rel=1e-6)
    Ft = F - (F @ n) * n
    assert np.linalg.norm(Ft) == pytest.approx(mg * math.sin(math.radians(angle)), rel=1e-6)
    assert Ft @ t > 0  # friction points up the slope
    v = s0.velocities.mean(axis=0)
    assert abs(v @ t) < 1e-7 and abs(v @ n) < 1e-7
    assert st.n_contacts == 25 and st.max_penetration < 1e-6


def test_impulse_identity_with_contact(demos_dir):
    """After every step M (q - q_tilde) / h^2 summed over vertices equals the total contact
    force (internal forces sum to zero): the multipliers enter the last global solve
    exactly (notes §2.4, §5.4). Checked while the box slides (mu < tan theta)."""
    model, solver, s0, s1 = _build(_incline(demos_dir, 10.0, 0.1))
    h = 0.01
    g = np.asarray(model.gravity)
    m = model.mass[:, None]
    errors = []

    def check(s_prev, s_new):
        q_tilde = s_prev.positions + h * s_prev.velocities + h * h * g
        lhs = (m * (s_new.positions - q_tilde)).sum(axis=0) / h**2
        F = solver.contact.total_force()
        errors.append(np.linalg.norm(lhs - F) / np.linalg.norm(F))

    for _ in range(15):
        prev = s0.clone()
        solver.step(s0, s1, h)
        s0, s1 = s1, s0
        check(prev, s0)
    assert max(errors) < 1e-9, errors
    assert s0.velocities.mean(axis=0) @ _frame(10.0)[1] < -1e-3  # it does slide


def _threshold_run(demos_dir, angle, mu, seconds=2.0, preconditioner="delassus"):
    model, solver, s0, s1 = _build(
        _incline(demos_dir, angle, mu, [f'contact.preconditioner="{preconditioner}"'])
    )
    _, t = _frame(angle)
    c0 = (model.mass[:, None] * s0.positions).sum(0) / model.mass.sum()
    speeds = []
    s0, s1, _ = _run(
        solver,
        s0,
        s1,
        round(seconds / 0.01),
        each=lambda s, st: speeds.append(-(s.velocities.mean(axis=0) @ t)),
    )
    c1 = (model.mass[:, None] * s0.positions).sum(0) / model.mass.sum()
    return float(np.linalg.norm(c1 - c0)), np.asarray(speeds)


@pytest.mark.slow
@pytest.mark.parametrize("angle", [10.0, 20.0])
def test_stick_slip_threshold(demos_dir, angle):
    """notes §5.8 (h = 0.01 s, 10 L-G, 24 CR): mu* + 0.001 stays (the centre moves less
    than 1 mm in 2 s), mu* - 0.001 slides with acceleration g (sin - mu cos)."""
    th = math.radians(angle)
    mu_star = math.tan(th)
    disp, speeds = _threshold_run(demos_dir, angle, mu_star + 0.001)
    assert disp < 1e-3, disp
    assert abs(speeds[-1]) < 1e-6
    disp, speeds = _threshold_run(demos_dir, angle, mu_star - 0.001)
    assert disp > 5e-3
    assert (
        speeds[-1] > speeds[len(speeds) // 2] > speeds[len(speeds) // 4] > 0
    )  # speed keeps growing
    accel = (speeds[-1] - speeds[len(speeds) // 2]) / 1.0
    expected = G * (math.sin(th) - (mu_star - 0.001) * math.cos(th))
    assert accel == pytest.approx(expected, rel=0.1)


def _contact_fixed_point(demos_dir, preconditioner, mu, angle=10.0, iterations=60):
    """Iterate the contact Newton steps against a fixed right-hand side b = A q_n +
    M (q_tilde - q_n) (linear elasticity about the rest state, exact global solves), as the
    PD loop does minus the local step; returns the converged world forces (k, 3)."""
    scene = _incline(
        demos_dir,
        angle,
        mu,
        [f'contact.preconditioner="{preconditioner}"', "contact.cr_iterations=60"],
    )
    model, solver, s0, _ = _build(scene)
    h = 0.01
    g = solver.global_step
    q_n, v_n = s0.positions, s0.velocities
    q_tilde = q_n + h * v_n + h * h * np.asarray(model.gravity)
    b = solver.A @ q_n + model.mass[:, None] * (q_tilde - q_n)
    c = solver.contact
    c.begin_step(q_n, v_n, q_tilde, 0.0, h)
    s = c.force_coefficient(h)
    residuals = []
    for _ in range(iterations):
        q = g.solve(b + s * c.force())
        c.update(q)
        residuals.append(c.stats()["ncp_residual"])
    return c.contacts.to_world(c.lam), residuals


def test_preconditioner_invariance(demos_dir):
    """At convergence lambda does not depend on the preconditioner r, only the speed of
    convergence does (notes §5.9): Delassus vs mass-based r on the box on the incline,
    partly sticking and partly slipping (mu = 0.18, just above tan 10 deg)."""
    a, res_a = _contact_fixed_point(demos_dir, "delassus", 0.18)
    b, res_b = _contact_fixed_point(demos_dir, "mass", 0.18)
    assert res_a[-1] < 1e-12 and res_b[-1] < 1e-12, (res_a[-5:], res_b[-5:])
    assert np.abs(a).max() > 1.0
    np.testing.assert_allclose(a, b, atol=1e-8 * np.abs(a).max())


def test_moving_collider_drags_by_friction():
    """A box on a conveyor (a plane translating in its own plane at 0.5 m/s): kinetic
    friction accelerates it at mu g until it moves with the belt, then it sticks."""
    scene = scene_from_dict(
        {
            "sim": {"dt": 0.01},
            "solver": {"type": "pd", "iterations": 5},
            "contact": {"mu": 0.5},
            "objects": {
                "box": {
                    "generator": "box",
                    "size": [0.2, 0.2, 0.2],
                    "resolution": [3, 3, 3],
                    "youngs_modulus": 1e6,
                    "translation": [0.0, 0.1, 0.0],
                }
            },
            "colliders": {"belt": {"type": "plane", "velocity": [0.5, 0.0, 0.0]}},
        }
    )
    _model, solver, s0, s1 = _build(scene)
    vx = []
    s0, s1, _ = _run(solver, s0, s1, 40, each=lambda s, st: vx.append(s.velocities.mean(axis=0)[0]))
    accel = (vx[5] - vx[1]) / 0.04
    assert accel == pytest.approx(0.5 * G, rel=0.05)
    assert vx[-1] == pytest.approx(0.5, abs=2e-3)
    assert abs(s0.velocities.mean(axis=0)[1]) < 1e-4


def test_stacked_boxes_object_contact():
    """A small box resting on a big one on the floor: the vertex-triangle contacts carry
    the small box's weight and the floor carries both."""
    scene = scene_from_dict(
        {
            "sim": {"dt": 0.01},
            "solver": {"type": "pd", "iterations": 10},
            "contact": {"mu": 0.5},
            "objects": {
                "big": {
                    "generator": "box",
                    "size": [0.2, 0.2, 0.2],
                    "resolution": [2, 2, 2],
                    "youngs_modulus": 1e6,
                    "translation": [0.0, 0.1, 0.0],
                },
                "small": {
                    "generator": "box",
                    "size": [0.1, 0.1, 0.1],
                    "resolution": [2, 2, 2],
                    "youngs_modulus": 1e6,
                    "translation": [0.0, 0.25, 0.0],
                },
            },
            "colliders": {"floor": {"type": "plane"}},
        }
    )
    model, solver, s0, s1 = _build(scene)
    s0, s1, st = _run(solver, s0, s1, 60)
    c = solver.contact
    f = c.force()  # H^T lambda per vertex
    small = model.object_vertex_slices[1]
    m_small = model.mass[small].sum()
    on_small = f[small].sum(axis=0)
    np.testing.assert_allclose(on_small, [0.0, m_small * G, 0.0], atol=1e-5 * m_small * G)
    floor = c.contacts.collider == 0
    F_floor = c.contacts.to_world(c.lam)[floor].sum(axis=0)
    np.testing.assert_allclose(
        F_floor, [0.0, model.mass.sum() * G, 0.0], atol=1e-5 * model.mass.sum() * G
    )
    assert np.any(c.contacts.collider == -1)
    assert st.max_penetration < 1e-5
    assert np.abs(s0.velocities).max() < 1e-5
