"""Baseline integrators (implicit Euler, XPBD) and the energies they share with ADMM."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.model import Model
from tisim.scene import MATERIALS, scene_from_dict
from tisim.solvers.baselines.common import ModelEnergy
from tisim.solvers.baselines.config import ImplicitEulerConfig, XPBDConfig
from tisim.solvers.baselines.implicit_euler import SolverImplicitEuler
from tisim.testing import check_gradient, check_hessian


def _scene(
    material="neo-hookean",
    solver="implicit-euler",
    gravity=(0.0, -9.81, 0.0),
    velocity=(0.0, 0.0, 0.0),
    omega=(0.0, 0.0, 0.0),
    colliders=None,
    resolution=(3, 1, 1),
    solver_options=None,
):
    data = {
        "sim": {"dt": 0.01, "gravity": list(gravity)},
        "solver": {"type": solver, **(solver_options or {})},
        "objects": {
            "bar": {
                "generator": "box",
                "size": [0.6, 0.2, 0.2],
                "resolution": list(resolution),
                "material": material,
                "youngs_modulus": 1e4,
                "poisson_ratio": 0.3,
                "density": 1000.0,
                "velocity": list(velocity),
                "angular_velocity": list(omega),
            }
        },
    }
    if colliders:
        data["colliders"] = colliders
        data["contact"] = {"stiffness": 1e4}
    return scene_from_dict(data)


def _deformed(model, rng, amount=0.03):
    return model.initial_positions + amount * rng.standard_normal(model.initial_positions.shape)


@pytest.mark.parametrize("material", MATERIALS)
def test_model_energy_derivatives(material, rng):
    """Gradient against central differences of the energy, Hessian (unprojected) against
    central differences of the gradient, with a ground plane cutting the mesh so the
    penalty term is active."""
    sc = _scene(material, colliders={"ground": {"type": "plane", "position": [0.0, -0.05, 0.0]}})
    model = Model.from_scene(sc)
    E = ModelEnergy(model)
    x0 = _deformed(model, rng)
    assert E.contacts(x0, 0.0)[0] > 0

    def f(x):
        return E.elastic(x) + E.gravity_energy(x) + E.penalty(x, 0.0)

    def g(x):
        return E.elastic_gradient(x) - model.mass[:, None] * model.gravity + E.penalty_gradient_hessian(x, 0.0)[0]

    check_gradient(f, g, x0, eps=1e-6, rtol=1e-5)
    check_hessian(
        E.elastic_gradient,
        lambda x: E.elastic_hessian(x, project=False).toarray(),
        x0,
        eps=1e-6,
        rtol=1e-5,
        full_max=0,
        directions=12,
    )


def test_projected_hessian_is_psd(rng):
    sc = _scene("neo-hookean")
    model = Model.from_scene(sc)
    E = ModelEnergy(model)
    x = model.initial_positions.copy()
    x[:, 1] *= 0.4  # squashed: the Neo-Hookean Hessian is indefinite there
    x += 0.01 * rng.standard_normal(x.shape)
    assert np.all(np.linalg.det(E.F(x)) > 0)
    H = E.elastic_hessian(x, project=True).toarray()
    Hu = E.elastic_hessian(x, project=False).toarray()
    assert np.linalg.eigvalsh(H).min() > -1e-8 * np.abs(H).max()
    assert np.linalg.eigvalsh(Hu).min() < -1e-6 * np.abs(Hu).max()  # the projection did something


def test_implicit_euler_free_fall_is_exact():
    """A rigid translation under gravity: backward Euler gives v1 = v0 + h g, x1 = x0 + h v1."""
    sc = _scene(velocity=(0.5, 1.0, 0.0))
    model = Model.from_scene(sc)
    solver = SolverImplicitEuler(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    st = solver.step(a, b, 0.01)
    g = np.array([0.0, -9.81, 0.0])
    assert st.converged
    assert np.allclose(b.velocities, a.velocities + 0.01 * g, atol=1e-9)
    assert np.allclose(b.positions, a.positions + 0.01 * b.velocities, atol=1e-11)


def test_implicit_euler_dissipates_and_keeps_linear_momentum():
    sc = _scene(
        gravity=(0.0, 0.0, 0.0), velocity=(0.3, 0.0, 0.0), omega=(0.0, 0.0, 8.0), solver_options={"tolerance": 1e-9}
    )
    model = Model.from_scene(sc)
    solver = SolverImplicitEuler(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    p0 = model.mass @ a.velocities
    E = []
    for _ in range(40):
        st = solver.step(a, b, 0.01)
        a, b = b, a
        assert st.converged
        E.append(0.5 * float(model.mass @ (a.velocities**2).sum(1)) + st.potential)
    E = np.array(E)
    assert E[-1] < 0.97 * E[0]  # numerical damping
    # Newton's steps sum to zero force (D 1 = 0): momentum to the Newton tolerance
    assert np.abs(model.mass @ a.velocities - p0).max() < 1e-8 * float(model.mass.sum())


def test_implicit_euler_rejects_nan():
    sc = _scene()
    model = Model.from_scene(sc)
    solver = SolverImplicitEuler(model, ImplicitEulerConfig())
    a, b = model.initial_state(), model.initial_state()
    a.velocities[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        solver.step(a, b, 0.01)


def test_tet_colouring_is_valid():
    from tisim.geometry.generate import box
    from tisim.solvers.baselines.xpbd import color_tets

    mesh = box((1.0, 0.5, 0.5), (6, 3, 3))
    order, starts = color_tets(mesh.tets, mesh.vertex_count)
    assert sorted(order.tolist()) == list(range(mesh.element_count))
    for c in range(len(starts) - 1):
        verts = mesh.tets[order[starts[c] : starts[c + 1]]].ravel()
        assert len(np.unique(verts)) == len(verts)  # no shared vertex within a colour
    assert len(starts) - 1 < 40


def test_xpbd_free_fall_matches_substepped_symplectic_euler():
    """No constraint is violated by a rigid translation, so n substeps of symplectic Euler:
    x1 = x0 + h v0 + hs^2 g n(n+1)/2, v1 = v0 + h g."""
    from tisim.solvers.baselines.xpbd import SolverXPBD

    sc = _scene("neo-hookean", solver="xpbd", velocity=(0.2, 0.5, 0.0))
    model = Model.from_scene(sc)
    solver = SolverXPBD(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    solver.step(a, b, 0.01)
    n = XPBDConfig().substeps
    hs = 0.01 / n
    g = np.array([0.0, -9.81, 0.0])
    assert np.allclose(b.velocities, a.velocities + 0.01 * g, atol=1e-9)
    assert np.allclose(b.positions, a.positions + 0.01 * a.velocities + hs**2 * g * n * (n + 1) / 2, atol=1e-11)


@pytest.mark.parametrize("material", MATERIALS)
def test_xpbd_rest_state_is_an_equilibrium(material):
    """Every constraint pair is satisfied (zero force) at rest: nothing moves without gravity."""
    from tisim.solvers.baselines.xpbd import SolverXPBD

    sc = _scene(material, solver="xpbd", gravity=(0.0, 0.0, 0.0))
    model = Model.from_scene(sc)
    solver = SolverXPBD(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    for _ in range(3):
        solver.step(a, b, 0.01)
        a, b = b, a
    assert np.abs(a.positions - model.initial_positions).max() < 1e-10
    assert np.abs(a.velocities).max() < 1e-8


def test_xpbd_restores_a_stretched_bar_and_projects_out_of_the_ground():
    from tisim.solvers.baselines.xpbd import SolverXPBD

    sc = _scene(
        "neo-hookean",
        solver="xpbd",
        gravity=(0.0, 0.0, 0.0),
        colliders={"ground": {"type": "plane", "position": [0.0, -0.1, 0.0]}},
    )
    model = Model.from_scene(sc)
    solver = SolverXPBD(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    a.positions[:, 0] *= 1.2  # stretched along x
    a.positions[0, 1] = -0.101  # a vertex 1 mm below the ground
    L0 = np.ptp(a.positions[:, 0])
    for _ in range(20):
        st = solver.step(a, b, 0.01)
        a, b = b, a
    assert np.ptp(a.positions[:, 0]) < L0  # pulled back towards the rest length
    assert a.positions[:, 1].min() >= -0.1 - 1e-9
    assert st.converged and np.isfinite(st.potential)


@pytest.mark.parametrize("material", MATERIALS)
def test_xpbd_integrates_the_monitored_energy(material, rng):
    """XPBD's constraints are the energy the other integrators use (ModelEnergy) for
    "arap", "corotated" and "neo-hookean" (log barrier): in the small-step limit one XPBD
    substep with one pass moves x by -h^2 M^-1 grad E_c(x) + O(h^4), E_c the constraints'
    energy sum_i C_i^2 / (2 alpha_i), because alpha~ = alpha / h^2 dominates each update.
    So from a deformed state at rest, without gravity, (x1 - x0) / h^2 must equal
    -M^-1 grad E(x0) of the monitored energy. h = 1e-6 s puts the O(h^2) terms and the
    Gauss-Seidel coupling at ~1e-7 relative; the stand-in used for the symmetric energies
    misses by O(1), which integrated_energy() reports."""
    from tisim.solvers.baselines.xpbd import SolverXPBD, integrated_energy

    sc = _scene(
        material,
        solver="xpbd",
        gravity=(0.0, 0.0, 0.0),
        resolution=(2, 1, 1),
        solver_options={"substeps": 1, "iterations": 1},
    )
    model = Model.from_scene(sc)
    solver = SolverXPBD(model, sc.solver)
    a = model.initial_state()
    a.positions[:] = _deformed(model, rng, 0.01)
    b = a.clone()
    h = 1e-6
    solver.step(a, b, h)
    accel = (b.positions - a.positions) / h**2
    expected = -ModelEnergy(model).elastic_gradient(a.positions) / model.mass[:, None]
    err = np.abs(accel - expected).max() / np.abs(expected).max()
    assert np.abs(expected).max() > 1.0  # a real force, m/s^2
    assert solver.integrated_energies() == {material: integrated_energy(material)}
    if integrated_energy(material) == ModelEnergy(model).groups[0][0]:
        assert err < 1e-5, err
    else:
        assert integrated_energy(material) == "xpbd-stable-neo-hookean-stand-in"
        assert err > 1e-2, err


def test_compare_names_the_energies_and_refuses_mixed_ones(tmp_path):
    """tisim compare compares like with like: it names the energy each integrator
    integrates and refuses, before running anything, integrators that disagree (PD
    integrates the stable Neo-Hookean where ADMM integrates the log-barrier one; XPBD has
    only a stand-in for the symmetric energies)."""
    from tisim.compare import compare, integrated_energies, scene_for
    from tisim.config import ConfigError

    nh = _scene("neo-hookean")
    trio = {n: integrated_energies(scene_for(nh, n)) for n in ("admm", "implicit-euler", "xpbd")}
    assert all(e == {"neo-hookean": "neo-hookean-log"} for e in trio.values()), trio
    assert integrated_energies(scene_for(nh, "pd")) == {"neo-hookean": "neo-hookean"}
    stable = integrated_energies(scene_for(nh, "implicit-euler", {"stable_neo_hookean": True}))
    assert stable == {"neo-hookean": "neo-hookean"}
    mixed = "admm: neo-hookean -> neo-hookean-log.*pd: neo-hookean -> neo-hookean"
    with pytest.raises(ConfigError, match=mixed):
        compare(nh, ["admm", "pd"], tmp_path / "a", frames=1, progress=False)
    with pytest.raises(ConfigError, match="stand-in"):
        compare(_scene("symmetric-dirichlet"), ["implicit-euler", "xpbd"], tmp_path / "b", frames=1, progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing ran


@pytest.mark.slow
def test_compare_records_the_energy_in_json_and_table(tmp_path):
    import json

    from tisim.compare import compare, format_table

    sc = _scene("corotated", resolution=(2, 1, 1))
    out = compare(sc, ["implicit-euler", "xpbd"], tmp_path / "c", frames=2, progress=False)
    data = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert data["same_energy"] is True and data["energy"] == {"corotated": "corotated"}
    for name in ("implicit-euler", "xpbd"):
        assert data["integrators"][name]["energy"] == {"corotated": "corotated"}
        assert data["integrators"][name]["ended"] == "completed"
    table = format_table(out)
    assert len(table) == 3 and all(line.endswith("corotated=corotated") for line in table[1:])
