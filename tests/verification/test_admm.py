"""The variational ADMM integrator against what physics says must hold: exact linear
momentum, angular momentum and energy conserved to the tolerance, the fixed point is the
implicit midpoint rule, the q-step is the linear solve of the notes, inversion-free steps,
and clear behaviour on bad input."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from tisim.model import Model
from tisim.scene import MATERIALS, scene_from_dict
from tisim.solvers.admm.config import ADMMConfig
from tisim.solvers.admm.solver import SolverADMM
from tisim.solvers.baselines.common import ModelEnergy


def _bar_scene(
    material="neo-hookean",
    resolution=(4, 1, 1),
    solver=None,
    omega=(1.0, 0.0, 6.0),
    velocity=(0.3, -0.2, 0.1),
    dt=0.01,
    gravity=(0.0, 0.0, 0.0),
    E=1e4,
    **extra,
):
    data = {
        "sim": {"dt": dt, "gravity": list(gravity)},
        "solver": {"type": "admm", **(solver or {})},
        "objects": {
            "bar": {
                "generator": "box",
                "size": [1.0, 0.2, 0.2],
                "resolution": list(resolution),
                "material": material,
                "youngs_modulus": E,
                "poisson_ratio": 0.3,
                "density": 1000.0,
                "angular_velocity": list(omega),
                "velocity": list(velocity),
            }
        },
    }
    data.update(extra)
    return scene_from_dict(data)


def _run(solver, model, steps, dt, record=None):
    a, b = model.initial_state(), model.initial_state()
    stats = []
    for _ in range(steps):
        st = solver.step(a, b, dt)
        a, b = b, a
        stats.append(st)
        if record is not None:
            record(a, st)
    return a, stats


def _momenta(model, state):
    m = model.mass
    p = m @ state.velocities
    L = np.sum(m[:, None] * np.cross(state.positions, state.velocities), axis=0)
    return p, L


@pytest.mark.parametrize("material", MATERIALS)
def test_linear_momentum_exact_even_when_admm_stops_early(material):
    """D_i 1 = 0, so every q-step keeps 1^T M q = 1^T M z and the midpoint recursion
    keeps sum m v: constant to round-off even with 2 ADMM iterations per step
    (far from converged, and still after the stall retry). Bound: 1e-10 of |p| + (total mass x |v| scale)."""
    sc = _bar_scene(
        material,
        solver={
            "max_iterations": 2,
            "tolerance": 1e-12,
            "min_iterations": 1,
            "retry_iteration_factor": 1.0,
            "retry_halvings": 0,
        },
    )  # one cheap retry
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    p0, _ = _momenta(model, model.initial_state())
    scale = float(model.mass.sum()) * float(np.abs(model.initial_velocities).max())
    drift = []
    _state, stats = _run(solver, model, 30, sc.sim.dt, lambda s, st: drift.append(_momenta(model, s)[0]))
    assert all(not st.converged and st.extra["admm_stalled"] == 1.0 for st in stats)  # really stopped early
    assert np.abs(np.array(drift) - p0).max() <= 1e-10 * scale
    assert np.linalg.norm(p0) > 0.1 * scale  # a non-trivial momentum


def _angular_drift(tolerance, steps, material="neo-hookean", resolution=(4, 1, 1)):
    sc = _bar_scene(material, resolution=resolution, solver={"tolerance": tolerance, "max_iterations": 5000})
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    _, L0 = _momenta(model, model.initial_state())
    worst = [0.0]

    def rec(state, st):
        assert st.converged
        worst[0] = max(worst[0], float(np.linalg.norm(_momenta(model, state)[1] - L0)))

    _, stats = _run(solver, model, steps, sc.sim.dt, rec)
    return worst[0] / float(np.linalg.norm(L0)), stats


@pytest.mark.slow
@pytest.mark.parametrize("material", ["neo-hookean", "arap", "symmetric-dirichlet", "symmetric-gradient", "corotated"])
def test_angular_momentum_over_1000_steps(material):
    """Free spinning, vibrating bar at the demo's tolerance (1e-8): |L - L0| / |L0| <= 1e-6
    over 1000 steps (every step converged)."""
    drift, stats = _angular_drift(1e-8, 1000, material)
    assert drift <= 1e-6, drift
    assert max(st.iterations for st in stats) < 5000


def test_angular_momentum_drift_shrinks_with_tolerance():
    """The drift of L is set by the ADMM tolerance: tightening it by 100x twice cuts the
    drift over 150 steps each time (by more than 10x; the integrator itself conserves L)."""
    drifts = [_angular_drift(tol, 150)[0] for tol in (1e-4, 1e-6, 1e-8)]
    assert drifts[0] > 10 * drifts[1] > 100 * drifts[2], drifts
    assert drifts[0] > 1e-9  # the loose tolerance really shows a drift


def test_fixed_point_is_implicit_midpoint():
    """After convergence, M (q - z)/h^2 + 1/2 grad E(q_mid) = 0 (notes §5.3) with grad E from
    tisim.materials (independent of the Taichi kernels), relative to the size of the
    elastic force term."""
    sc = _bar_scene(
        "neo-hookean", resolution=(4, 2, 2), solver={"tolerance": 1e-10, "max_iterations": 20000}, omega=(2.0, 1.0, 8.0)
    )
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    energy = ModelEnergy(model)
    h = sc.sim.dt
    a, b = model.initial_state(), model.initial_state()
    for _ in range(5):  # get a deformed, moving state first
        solver.step(a, b, h)
        a, b = b, a
    st = solver.step(a, b, h)
    assert st.converged
    x0, v0, q = a.positions, a.velocities, b.positions
    z = x0 + h * v0
    inertia = model.mass[:, None] * (q - z) / h**2
    force = 0.5 * energy.elastic_gradient(0.5 * (x0 + q))
    res = np.abs(inertia + force).max()
    assert np.abs(force).max() > 1e-2  # deformed: the elastic term matters
    assert res <= 1e-6 * np.abs(force).max(), (res, np.abs(force).max())
    # and the recursion velocity is the midpoint rule's
    assert np.allclose(b.velocities, 2.0 / h * (q - x0) - v0, atol=1e-12)


def test_q_step_matches_dense_solve(rng):
    """A and B assembled element by element from dense D_i (3 x n) agree with the solver's
    sparse matrix, and its solve agrees with numpy's dense solve, for a random splitting."""
    sc = _bar_scene("arap", resolution=(3, 2, 1), gravity=(0.0, -9.81, 0.0))
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    n, m, h = model.vertex_count, model.element_count, 0.01
    R = np.linalg.qr(rng.standard_normal((m, 3, 3)))[0]
    R *= np.sign(np.linalg.det(R))[:, None, None]
    S = rng.standard_normal((m, 3, 3))
    S = np.eye(3) + 0.1 * (S + S.transpose(0, 2, 1))
    Y = rng.standard_normal((m, 3, 3))
    solver.set_splitting(R, S, Y)
    rho = solver.splitting()["rho"]
    x0 = model.initial_positions + 0.01 * rng.standard_normal((n, 3))
    v0 = rng.standard_normal((n, 3))
    z = x0 + h * v0
    A = np.diag(model.mass / h**2)
    B = model.mass[:, None] * z / h**2 + 0.5 * model.mass[:, None] * np.array([0.0, -9.81, 0.0])
    for e in range(m):
        D = np.zeros((3, n))  # notes §2.3: column a of D_i is grad N_a
        D[:, model.mesh.tets[e]] = model.rest.grad[e].T
        A += rho[e] / 4 * D.T @ D
        J_k = D @ x0  # = F^T
        U, P = R[e].T, R[e] @ S[e] @ R[e].T  # the notes' J = U P is F = R S transposed
        assert np.allclose(U @ P, (R[e] @ S[e]).T)
        B += rho[e] / 2 * D.T @ (U @ P - Y[e].T / rho[e] - 0.5 * J_k)
    assert np.allclose(solver.global_matrix(h).toarray(), A, rtol=1e-12, atol=1e-9)
    q = solver.q_step(x0, v0, h)
    q_ref = np.linalg.solve(A, B)
    assert np.abs(q - q_ref).max() <= 1e-9 * np.abs(q_ref).max()


def test_converged_steps_are_inversion_free_under_strong_compression():
    """A bar thrown end-on at a wall (plane) at 5 m/s: det F > 0 at the midpoint of every
    converged step and at every step's end."""
    sc = _bar_scene(
        "neo-hookean",
        resolution=(4, 1, 1),
        omega=(0.0, 0.0, 0.0),
        velocity=(-5.0, 0.0, 0.0),
        dt=0.001,
        solver={"tolerance": 1e-6},
        colliders={"wall": {"type": "plane", "position": [-0.55, 0.0, 0.0], "normal": [1.0, 0.0, 0.0]}},
        contact={"stiffness": 2e4},
    )
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    _, stats = _run(solver, model, 120, sc.sim.dt)
    assert max(st.n_contacts for st in stats) > 0
    assert all(st.converged for st in stats)
    assert min(st.extra["min_det_mid"] for st in stats) > 0
    assert min(st.extra["min_det"] for st in stats) > 0
    assert min(st.extra["min_det"] for st in stats) < 0.95  # really compressed


def test_nan_input_is_a_clear_error():
    sc = _bar_scene()
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    a.positions[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        solver.step(a, b, 0.01)
    a = model.initial_state()
    with pytest.raises(ValueError, match="time step"):
        solver.step(a, b, 0.0)


def test_stall_is_retried_then_flagged_with_warning(caplog):
    """A huge time step on a stiff, fast-spinning bar with a tiny cap: every step stalls, is
    retried (fresh splitting with 4x the cap: 12 iterations; then two half steps, the first
    of which stalls and is retried afresh: 3 + 12), and is then returned flagged
    (admm_stalled = stall_failed = 1, 3 retries, 3 + 12 + 15 iterations) with one warning
    per step, finite (no NaN), and counted in info()."""
    sc = _bar_scene(
        "neo-hookean",
        E=1e7,
        omega=(0.0, 5.0, 40.0),
        dt=0.5,
        solver={"max_iterations": 3, "tolerance": 1e-12, "warn_every": 1},
    )
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    with caplog.at_level(logging.WARNING, logger="tisim.solvers.admm.solver"):
        state, stats = _run(solver, model, 4, sc.sim.dt)
    assert all(st.extra["admm_stalled"] == 1.0 and st.extra["stall_failed"] == 1.0 and not st.converged for st in stats)
    assert all(st.extra["stall_retries"] == 3.0 and st.iterations == 30 for st in stats)
    assert stats[-1].extra["admm_stalled_total"] == 4.0
    assert sum("did not converge after 3 retries" in r.getMessage() for r in caplog.records) == 4
    assert solver.info()["stalls"] == {"stalled_steps": 4, "retries": 12, "recovered": 0, "failed": 4}
    assert state.is_finite()
    assert all(math.isfinite(st.residual) for st in stats)


def test_config_validation():
    from tisim.config import ConfigError, from_dict

    with pytest.raises(ConfigError, match="tolerance"):
        from_dict(ADMMConfig, {"tolerance": 0.0})
    with pytest.raises(ConfigError, match="min_iterations"):
        ADMMConfig(min_iterations=10, max_iterations=5)
    assert ADMMConfig.accurate().tolerance < ADMMConfig().tolerance < ADMMConfig.realtime().tolerance


@pytest.mark.slow
def test_spinning_bar_energy_admm_bounded_implicit_euler_dissipates():
    """2000 steps of a small free spinning bar: ADMM's total energy stays within 1% of its
    start (the midpoint rule has no numerical damping), backward Euler loses more than 10%."""
    from tisim.solvers.baselines.config import ImplicitEulerConfig
    from tisim.solvers.baselines.implicit_euler import SolverImplicitEuler

    sc = _bar_scene("neo-hookean", resolution=(4, 1, 1), solver={"tolerance": 1e-8}, velocity=(0.0, 0.0, 0.0))
    model = Model.from_scene(sc)
    energy = ModelEnergy(model)
    s0 = model.initial_state()
    E0 = 0.5 * float(model.mass @ (s0.velocities**2).sum(1)) + energy.potential(s0.positions, 0.0)
    out = {}
    for name, solver in (
        ("admm", SolverADMM(model, sc.solver)),
        ("implicit-euler", SolverImplicitEuler(model, ImplicitEulerConfig())),
    ):
        E = []
        _run(
            solver,
            model,
            2000,
            sc.sim.dt,
            lambda s, st: E.append(0.5 * float(model.mass @ (s.velocities**2).sum(1)) + st.potential),
        )
        out[name] = np.array(E)
    assert np.abs(out["admm"] - E0).max() <= 0.01 * E0
    assert out["implicit-euler"][-1] < 0.9 * E0
