"""Inverted tets and the PD solver (issue 45): the local step of ARAP, corotated and the
stable neo-Hookean pulls an inverted element back (RECOVERS_INVERSION), so for PD an
inverted tet is not a divergence; the ADMM solver, which guarantees det F > 0, keeps
the check; TetGen's quality keys and the sliver warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tomllib

from tisim import runner
from tisim.runner import DivergenceGuards, build, volume_ratios
from tisim.scene import MATERIALS, scene_from_dict
from tisim.solvers.base import StepStats
from tisim.solvers.pd.solver import RECOVERS_INVERSION


def _scene(material, solver="pd"):
    return scene_from_dict(
        tomllib.loads(f"""
[sim]
dt = 0.01
gravity = [0.0, 0.0, 0.0]
[solver]
type = "{solver}"
[objects.b]
generator = "box"
size = [0.1, 0.1, 0.1]
resolution = [2, 2, 2]
material = "{material}"
youngs_modulus = 1e5
""")
    )


@pytest.mark.parametrize("material", sorted(RECOVERS_INVERSION))
def test_pd_local_step_recovers_an_inverted_tet(material):
    """The box's centre vertex pushed through a face of its tets: a few tets start
    inverted (det F < 0, checked); after 20 steps without gravity every tet has det F > 0."""
    _, model, solver = build(_scene(material), "cpu", "f64")
    assert not solver.inversion_is_divergence()
    st, spare = model.initial_state(), model.initial_state()
    x = st.positions
    c = int(np.argmin(np.linalg.norm(x - x.mean(0), axis=1)))
    x[c] += np.array([0.0, 0.08, 0.0])  # 0.05 m above the centre: through the upper tets
    J0 = volume_ratios(model, x)
    assert J0.min() < 0
    for _ in range(20):
        solver.step(st, spare, 0.01)
        st, spare = spare, st
    assert np.isfinite(st.positions).all()
    assert volume_ratios(model, st.positions).min() > 0


def test_which_solvers_count_an_inverted_tet_as_divergence():
    for m in MATERIALS:
        _, _, s = build(_scene(m), "cpu", "f64")
        assert s.inversion_is_divergence() == (m not in RECOVERS_INVERSION), m
    _, _, s = build(_scene("neo-hookean", "admm"), "cpu", "f64")
    assert s.inversion_is_divergence()


def test_guards_log_an_inverted_tet_once_when_the_solver_recovers_it(caplog):
    class _Model:
        element_count = 1

        class mesh:
            tets = np.array([[0, 1, 2, 3]])

        class rest:
            volume = np.array([1.0 / 6.0])

    class _State:
        positions = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, -1.0]])  # det F = -1
        time = 0.1

    with pytest.raises(runner.Diverged, match="inverted"):
        DivergenceGuards(_Model()).check(_State(), StepStats(potential=1.0), 1)
    g = DivergenceGuards(_Model(), inversion=False)
    with caplog.at_level(logging.INFO, logger="tisim.runner"):
        for k in range(3):
            g.check(_State(), StepStats(potential=1.0), k + 1)
    assert sum("recover inverted tets" in r.message for r in caplog.records) == 1
    assert g.info()["inverted_steps"] == 3 and not g.info()["inversion_is_divergence"]


def test_min_dihedral_angle_and_the_sliver_warning(caplog):
    from tisim.geometry.mesh import TetMesh
    from tisim.geometry.tetrahedralize import min_dihedral_angles, warn_slivers

    regular = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1.0]])
    assert min_dihedral_angles(regular, np.array([[0, 1, 2, 3]]))[0] == pytest.approx(np.degrees(np.arccos(1 / 3)))
    flat = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0.3, 0.3, 0.01]])
    # the dihedral at edge (0, 1): atan(0.01 / 0.3) (the apex over the edge's normal plane)
    assert min_dihedral_angles(flat, np.array([[0, 1, 2, 3]]))[0] < np.degrees(np.arctan(0.01 / 0.3)) + 1e-9
    with caplog.at_level(logging.WARNING):
        assert warn_slivers(TetMesh(flat, np.array([[0, 1, 2, 3]]), source="x.msh"), "objects.b.mesh") == 1
        assert warn_slivers(TetMesh(regular, np.array([[0, 1, 2, 3]])), "objects.b.mesh") == 0
    lines = [r.message for r in caplog.records if "slivers" in r.message]
    assert len(lines) == 1 and "objects.b.mesh" in lines[0] and "x.msh" in lines[0]
