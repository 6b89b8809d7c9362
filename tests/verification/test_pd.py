"""Verification of the real-time PD solver (notes §5.3-5.5): back-ends agree, energy
decreases, momentum is conserved, rest stays rest, handles hold, errors are clear."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from tisim.linalg.cholesky import FactorizationError
from tisim.model import Model
from tisim.scene import scene_from_dict
from tisim.solvers.pd.solver import SolverPD

TWIST = {
    "left": {"region_min": [-1, -1, -1], "region_max": [-0.49, 1, 1]},
    "right": {
        "region_min": [0.49, -1, -1],
        "region_max": [1, 1, 1],
        "angular_velocity": [3.0, 0, 0],
    },
}


def make(
    global_step="cholesky",
    material="arap",
    handles=TWIST,
    gravity=(0.0, -9.81, 0.0),
    resolution=(6, 2, 2),
    E=1e5,
    damping=0.0,
    objects=None,
    colliders=None,
    **solver,
):
    d = {
        "sim": {"dt": 0.01, "gravity": list(gravity), "damping": damping},
        "solver": {"type": "pd", "global_step": global_step, **solver},
        "objects": objects
        or {
            "bar": {
                "generator": "box",
                "size": [1.0, 0.2, 0.2],
                "resolution": list(resolution),
                "material": material,
                "youngs_modulus": E,
                "poisson_ratio": 0.3,
                "density": 1000.0,
                "handles": handles or {},
            }
        },
    }
    if colliders:
        d["colliders"] = colliders
    scene = scene_from_dict(d)
    model = Model.from_scene(scene)
    return SolverPD(model, scene.solver), model


def run(solver, model, frames, state=None):
    a = model.initial_state() if state is None else state
    b = a.clone()
    stats = []
    for _ in range(frames):
        stats.append(solver.step(a, b, 0.01))
        a, b = b, a
    return a, stats


@pytest.mark.parametrize("material", ["arap", "neo-hookean"])
def test_global_step_backends_agree_on_the_converged_frame(material):
    """All back-ends converge to the same frame (1e-8): the exact ones with enough
    iterations, Jacobi-Chebyshev with very many (tolerance-driven)."""
    out = {}
    for gs, extra in [
        ("cholesky", {}),
        ("sparse-inverse", {}),
        ("jacobi", {"chebyshev_rho": 0.99, "iterations": 40000}),
    ]:
        opts = {"iterations": 2000, "tolerance": 1e-11, **extra}
        solver, model = make(gs, material, **opts)
        a, stats = run(solver, model, 2)
        assert stats[-1].converged, (gs, stats[-1].residual, stats[-1].iterations)
        out[gs] = a.positions
        if gs == "jacobi":
            assert stats[-1].iterations > 100  # the incomplete solve needs many more iterations
    scale = np.abs(out["cholesky"]).max()
    assert np.abs(out["sparse-inverse"] - out["cholesky"]).max() <= 1e-8 * scale
    assert np.abs(out["jacobi"] - out["cholesky"]).max() <= 1e-8 * scale


def test_arap_iterations_decrease_the_incremental_potential():
    """Local and global steps each minimise the ARAP surrogate, so E(q^k) never increases."""
    solver, model = make("sparse-inverse", "arap", iterations=40, rotation_iterations=20)
    a, _ = run(solver, model, 3)  # get into a twisted, moving state
    energies = []
    solver.iteration_callback = lambda k, q: energies.append(solver.incremental_potential(q))
    b = a.clone()
    solver.step(a, b, 0.01)
    e = np.array(energies)
    assert len(e) == 40
    assert e[0] - e[-1] > 1e-6  # it does decrease
    assert np.all(np.diff(e) <= 1e-12 * abs(e).max()), np.diff(e).max()


@pytest.mark.parametrize("gs", ["cholesky", "sparse-inverse"])
def test_linear_momentum_is_conserved(gs, rng):
    """No gravity, no handles: G_i 1 = 0 and sum of element forces is zero, so
    sum m v is conserved by every exact global step (notes §5.5) to round-off."""
    solver, model = make(gs, "corotated", handles=None, gravity=(0, 0, 0))
    a = model.initial_state()
    a.velocities[:] = rng.standard_normal(a.velocities.shape) + np.array([1.0, -2.0, 0.5])
    p0 = model.mass @ a.velocities
    b = a.clone()
    scale = model.mass @ np.linalg.norm(a.velocities, axis=1)
    for _ in range(10):
        solver.step(a, b, 0.01)
        a, b = b, a
        p = model.mass @ a.velocities
        assert np.abs(p - p0).max() <= 1e-12 * scale


@pytest.mark.parametrize("gs", ["cholesky", "sparse-inverse", "jacobi"])
@pytest.mark.parametrize("material", ["arap", "neo-hookean"])
def test_rest_state_is_invariant(gs, material):
    solver, model = make(gs, material, handles=None, gravity=(0, 0, 0))
    a, stats = run(solver, model, 5)
    assert np.abs(a.positions - model.initial_positions).max() <= 1e-14
    assert np.abs(a.velocities).max() <= 1e-12
    assert stats[-1].extra["residual_abs"] < 1e-8  # N: round-off of the right-hand side
    assert stats[-1].residual < 1e-3


@pytest.mark.parametrize("gs", ["cholesky", "sparse-inverse", "jacobi"])
def test_handles_are_respected_exactly(gs):
    solver, model = make(gs, "arap")
    a = model.initial_state()
    b = a.clone()
    for _ in range(5):
        solver.step(a, b, 0.01)
        idx, targets = model.handle_targets(b.time)
        assert np.array_equal(b.positions[idx], targets)
        assert np.allclose(b.velocities[idx], (targets - a.positions[idx]) / 0.01, rtol=0, atol=1e-12)
        a, b = b, a
    assert np.abs(a.positions - model.initial_positions).max() > 1e-3  # something moved


def test_zero_mass_is_a_factorization_error():
    solver_cfg = {"type": "pd", "global_step": "cholesky"}
    scene = scene_from_dict({"solver": solver_cfg, "objects": {"b": {"generator": "box", "resolution": [2, 2, 2]}}})
    model = Model.from_scene(scene)
    massless = dataclasses.replace(model, mass=np.zeros_like(model.mass))
    for gs in ("cholesky", "sparse-inverse", "auto", "jacobi"):
        cfg = dataclasses.replace(scene.solver, global_step=gs)
        with pytest.raises(FactorizationError):
            SolverPD(massless, cfg)


def test_memory_limit_falls_back_to_cholesky_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        solver, model = make("sparse-inverse", memory_limit_mb=1e-3)
    assert solver.global_step.name == "cholesky"
    assert any("falling back to the cholesky" in r.getMessage() for r in caplog.records)
    info = solver.info()
    assert info["global_step"] == "cholesky" and "fallback" in info
    run(solver, model, 2)  # and it runs


def test_auto_reports_its_choice():
    solver, _ = make("auto")
    info = solver.info()
    assert info["global_step"] in ("sparse-inverse", "cholesky")
    assert set(info["auto_ms_per_solve"]) == {"sparse-inverse", "cholesky"}
    assert info["ordering"] and info["factor_seconds"] >= 0


@pytest.mark.parametrize("gs", ["cholesky", "sparse-inverse", "jacobi"])
def test_drag_spring_is_implicit_without_refactoring(gs):
    """The drag spring (Sherman-Morrison on exact back-ends, diagonal on Jacobi) converges to
    the minimiser of the incremental potential including the spring k/2 |x_v - t|^2."""
    opts = {"iterations": 3000, "tolerance": 1e-11}
    if gs == "jacobi":
        opts.update(chebyshev_rho=0.99, iterations=40000)
    solver, model = make(gs, "arap", handle_stiffness=1e4, **opts)
    x0 = model.initial_positions
    v = int(np.argmax(x0[:, 1] - np.abs(x0[:, 0]) + 0.01 * x0[:, 2]))  # top, middle of the bar
    target = model.initial_positions[v] + np.array([0.0, 0.1, 0.05])
    solver.set_drag(v, target)
    version = solver._version
    a, stats = run(solver, model, 2)
    assert solver._version == version  # no refactoring
    assert stats[-1].converged
    g = solver.incremental_gradient(a.positions)
    assert np.abs(g).max() <= 1e-6 * model.mass.sum() * 9.81
    assert a.positions[v, 1] > model.initial_positions[v, 1] + 0.01  # pulled up
    solver.set_drag(None)
    run(solver, model, 1, a)


def test_release_refactors_and_frees_the_vertices():
    handles = {
        "left": {"region_min": [-1, -1, -1], "region_max": [-0.49, 1, 1]},
        "pull": {
            "region_min": [0.49, -1, -1],
            "region_max": [1, 1, 1],
            "velocity": [0, 1.0, 0],
            "release": 0.03,
        },
    }
    solver, model = make("sparse-inverse", handles=handles)
    n_held = solver.info()["n_held"]
    a, stats = run(solver, model, 5)
    assert sum(s.extra["refactored"] for s in stats) == 1
    assert solver.info()["n_held"] < n_held
    assert np.abs(a.velocities).max() > 0.1


def test_tolerance_stops_early_and_reports_convergence():
    solver, model = make("cholesky", iterations=500, tolerance=1e-6)
    _, stats = run(solver, model, 3)
    for s in stats:
        assert s.converged and s.residual < 1e-6 and 1 < s.iterations < 500
    solver2, _ = make("cholesky", iterations=2, tolerance=1e-12)
    _, stats2 = run(solver2, model, 1)
    assert not stats2[0].converged and stats2[0].iterations == 2


def test_residual_is_relative_gradient_norm():
    solver, model = make("cholesky", iterations=6)
    res = []
    solver.iteration_callback = lambda k, q: res.append(np.linalg.norm(solver.incremental_gradient(q)))
    a = model.initial_state()
    b = a.clone()
    st = solver.step(a, b, 0.01)
    # the reported value is at the input of the last global step (iterate 5 of 0..5)
    g0 = st.extra["residual_abs"] / st.residual
    assert st.residual == pytest.approx(res[-2] / g0, rel=1e-6)
    # StepStats.potential warm-starts the rotations from the last local step (one
    # Newton turn): its error is second order in the rotation error
    assert st.potential == pytest.approx(solver.potential_energy(b.positions), rel=1e-6)


def test_tunables_refactor():
    solver, model = make("cholesky")
    names = {t.name for t in solver.tunables()}
    assert names == {"dt", "iterations", "stiffness"}
    a, _ = run(solver, model, 2)
    v = solver._version
    solver.set_tunable("stiffness", 10.0)
    assert solver._version == v + 1
    solver.set_tunable("iterations", 3)
    assert solver._version == v + 1 and solver.info()["iterations"] == 3
    solver.set_tunable("dt", 0.005)
    assert solver._version == v + 2
    b = a.clone()
    solver.step(a, b, 0.01)  # the tunable wins over the dt passed in, without refactoring again
    assert b.time == pytest.approx(a.time + 0.005) and solver._version == v + 2
    with pytest.raises(KeyError):
        solver.set_tunable("nope", 1.0)
    # stiffer bar sags less under gravity (free end on a soft bar)
    soft, m1 = make("cholesky", handles={"left": TWIST["left"]}, iterations=20)
    stiff, m2 = make("cholesky", handles={"left": TWIST["left"]}, iterations=20)
    stiff.set_tunable("stiffness", 100.0)
    a1, _ = run(soft, m1, 20)
    a2, _ = run(stiff, m2, 20)
    assert a2.positions[:, 1].min() > a1.positions[:, 1].min()


def test_neo_hookean_quasi_newton_converges_to_a_stationary_point():
    solver, model = make("cholesky", "neo-hookean", iterations=400, tolerance=1e-10)
    a, stats = run(solver, model, 3)
    assert stats[-1].converged
    g = solver.incremental_gradient(a.positions)
    assert np.abs(g).max() <= 1e-7 * model.mass.sum() * 9.81


@pytest.mark.parametrize("gs", ["cholesky", "sparse-inverse", "jacobi"])
def test_host_interface_for_contact(gs, rng):
    """solve / inverse_columns / sparse_inverse in the notes' scaling with handle elimination."""
    import scipy.sparse as sp

    solver, model = make(gs)
    a, _ = run(solver, model, 1)
    g = solver.global_step
    A = g.A.toarray()
    n = model.vertex_count
    held = g.held_index
    free = g.free_index
    rhs = rng.standard_normal((n, 3))
    q = g.solve(rhs)
    idx, targets = model.handle_targets(a.time)  # held positions of the last step
    order = np.argsort(idx)
    assert np.array_equal(held, idx[order])
    assert np.array_equal(q[held], targets[order])
    Aff = A[np.ix_(free, free)]
    ref = np.linalg.solve(Aff, rhs[free] - A[np.ix_(free, held)] @ targets[order])
    assert np.allclose(q[free], ref, rtol=1e-10, atol=1e-12 * abs(ref).max())
    cols = rng.choice(free, 4, replace=False)
    B = sp.csc_matrix((np.ones(4), (cols, np.arange(4))), shape=(n, 4))
    X = g.inverse_columns(B)
    assert np.allclose(X[held], 0.0)
    assert np.allclose(X[free], np.linalg.solve(Aff, B.toarray()[free]), rtol=1e-10, atol=1e-16)
    res = g.sparse_inverse()
    if gs == "sparse-inverse":
        S, index = res
        Z = S @ B.toarray()[index]
        assert np.allclose(Z.T @ Z, B.toarray()[free].T @ np.linalg.solve(Aff, B.toarray()[free]), rtol=1e-10)
    else:
        assert res is None
    assert g.contact_scaling == "notes"


def test_contact_hook_with_a_floor():
    """With a collider, the PD contact module is wired in: a dropped box stops on the floor."""
    objects = {
        "box": {
            "generator": "box",
            "size": [0.2, 0.2, 0.2],
            "resolution": [2, 2, 2],
            "material": "arap",
            "youngs_modulus": 1e5,
            "translation": [0.0, 0.12, 0.0],
            "handles": {},
        }
    }
    colliders = {"floor": {"type": "plane", "position": [0, 0, 0], "normal": [0, 1, 0]}}
    solver, model = make("sparse-inverse", objects=objects, colliders=colliders)
    assert solver.contact is not None
    a, stats = run(solver, model, 30)
    assert max(s.n_contacts for s in stats) > 0
    assert a.positions[:, 1].min() > -0.01
    solver.reset(a)


def test_no_contact_without_colliders():
    solver, _ = make("cholesky")
    assert solver.contact is None
