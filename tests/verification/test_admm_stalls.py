"""Stalled ADMM steps (issue 12): a step at its iteration cap above the tolerance is never
accepted as it is. It is retried (fresh splitting with more iterations, then two half steps);
a retried step is the step it replaces, to the tolerance; a step that cannot be recovered is
flagged, and the runner ends the run with its own exit status (4), keeping the finished
frames, counting stalls and retries in run.json; the CLI prints them. The S-step's Newton
solve reports its cap upwards instead of returning its last iterate as the prox."""

from __future__ import annotations

import csv
import json
import logging

import numpy as np
import pytest

from tisim.model import Model
from tisim.runner import EXIT_STALLED, run_scene
from tisim.solvers.admm.solver import SolverADMM
from tisim.solvers.admm.verification import spinning_bar


def _steps(solver, model, n, dt):
    a, b = model.initial_state(), model.initial_state()
    stats = []
    for _ in range(n):
        stats.append(solver.step(a, b, dt))
        a, b = b, a
    return a, stats


@pytest.mark.slow
def test_stalled_step_recovered_by_a_fresh_start_is_the_converged_step():
    """Cap 6 at tolerance 1e-9 (warm steps need ~15-30 iterations): steps stall and are
    recovered by the restart with 4x the cap (24 + fresh splitting), no halving. Every step
    ends converged, and the trajectory after 10 steps equals the uncapped run's to 1e-7 of the
    bar's length (both converged to 1e-9 strain: ~1e-8 m). The counts add up."""
    dt = 0.01
    ref_sc = spinning_bar(dt=dt, tolerance=1e-9)
    sc = spinning_bar(dt=dt, tolerance=1e-9, max_iterations=6, retry_halvings=0, retry_iteration_factor=8.0)
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    state, stats = _steps(solver, model, 10, dt)
    ref_state, _ = _steps(SolverADMM(model, ref_sc.solver), model, 10, dt)
    retried = [st.extra["stall_retries"] for st in stats]
    assert all(st.converged and st.extra["stall_failed"] == 0.0 for st in stats)
    assert sum(r > 0 for r in retried) >= 3, retried  # the cap really bites
    counts = solver.info()["stalls"]
    assert counts == {
        "stalled_steps": sum(r > 0 for r in retried),
        "retries": int(sum(retried)),
        "recovered": sum(r > 0 for r in retried),
        "failed": 0,
    }
    assert np.abs(state.positions - ref_state.positions).max() < 1e-7


def test_stalled_step_recovered_by_halving_is_two_half_steps():
    """No extra iterations on retry (factor 1) and a cap the full step cannot meet even from a
    fresh start, but a half step can: the step is done as two half steps, and its result is
    two converged steps of h/2 of an uncapped solver (to 1e-7 of the length)."""
    dt = 0.02
    sc = spinning_bar(dt=dt, tolerance=1e-9, max_iterations=25, retry_iteration_factor=1.0, retry_halvings=2)
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    st = solver.step(a, b, dt)
    assert st.converged and st.extra["stall_retries"] >= 2  # restart, then halving
    ref = SolverADMM(model, spinning_bar(dt=dt / 2, tolerance=1e-9).solver)
    r0, r1 = model.initial_state(), model.initial_state()
    assert ref.step(r0, r1, dt / 2).converged and ref.step(r1, r0, dt / 2).converged
    assert np.abs(b.positions - r0.positions).max() < 1e-7
    assert b.time == r0.time == dt


def test_prox_newton_cap_is_reported_not_accepted(caplog):
    """A Neo-Hookean bar with lam != 0 whose S-step Newton solve may take one iteration:
    the elements' proxes report the cap (prox_failures > 0), so no step counts as converged
    even though the ADMM residuals would pass; with the default cap the same steps converge
    with no prox failure."""
    dt = 0.01
    sc = spinning_bar(
        dt=dt, tolerance=1e-6, max_iterations=40, prox_newton_iterations=1, retry_halvings=0, retry_iteration_factor=1.0
    )
    model = Model.from_scene(sc)
    with caplog.at_level(logging.WARNING, logger="tisim.solvers.admm.solver"):
        _, stats = _steps(SolverADMM(model, sc.solver), model, 2, dt)
    assert all(not st.converged and st.extra["prox_failures"] > 0 for st in stats)
    assert any("S-step Newton unconverged" in r.getMessage() for r in caplog.records)
    ok = spinning_bar(dt=dt, tolerance=1e-6, max_iterations=40)
    _, stats = _steps(SolverADMM(model, ok.solver), model, 2, dt)
    assert all(st.converged and st.extra["prox_failures"] == 0 for st in stats)


def _capped_after(monkeypatch, good_steps: int):
    """From step ``good_steps`` + 1 on, the solver gets a 1-iteration cap and tolerance 1e-15
    (its retries use 4 iterations): that step cannot converge."""
    real = SolverADMM.step
    calls = {"n": 0}

    def step(self, state_in, state_out, dt):
        calls["n"] += 1
        if calls["n"] > good_steps:
            self.max_iterations, self.tolerance, self.dual_tolerance = 1, 1e-15, 1e-15
        return real(self, state_in, state_out, dt)

    monkeypatch.setattr(SolverADMM, "step", step)


def test_run_ends_stalled_with_its_exit_status_and_keeps_frames(monkeypatch, tmp_path):
    """Three frames converge, the fourth stalls for good: the run ends "stalled" (exit status
    4, not the divergence's 3), keeps frames 0-3 in stats.csv, and run.json records the end,
    the message and the stall counts."""
    _capped_after(monkeypatch, 3)
    sc = spinning_bar(dt=0.01, tolerance=1e-6, retry_iteration_factor=4.0, retry_halvings=1)  # the defaults
    res = run_scene(sc, tmp_path / "out", frames=10, progress=False)
    assert res.ended == "stalled" and res.exit_code == EXIT_STALLED == 4
    assert res.frames_done == 3
    assert "stalled at frame 4" in res.message and "3 frames before are kept" in res.message
    with open(tmp_path / "out" / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["frame"]) for r in rows] == [0, 1, 2, 3]
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["ended"] == "stalled" and info["frames_done"] == 3
    assert info["stalls"] == {"stalled_steps": 1, "retries": 3, "recovered": 0, "failed": 1}
    assert info["solver_info"]["stalls"]["failed"] == 1


def test_cli_exit_status_and_summary_for_a_stalled_run(monkeypatch, tmp_path):
    """`tisim run` on a run that stalls at frame 2: exit status 4, the error line on stderr,
    the stall counts on stdout."""
    from typer.testing import CliRunner

    from tisim.cli.app import app

    _capped_after(monkeypatch, 1)
    scene = tmp_path / "bar.toml"
    scene.write_text(
        '[sim]\ndt = 0.01\nframes = 5\ngravity = [0.0, 0.0, 0.0]\n'
        '[solver]\ntype = "admm"\ntolerance = 1e-6\n'
        '[objects.bar]\ngenerator = "box"\nsize = [1.0, 0.2, 0.2]\nresolution = [1, 1, 1]\n'
        'material = "neo-hookean"\nyoungs_modulus = 1e4\ndensity = 1000.0\nangular_velocity = [1.0, 0.0, 6.0]\n'
    )
    r = CliRunner().invoke(
        app, ["run", str(scene), "--headless", "--no-render", "--quiet", "--out", str(tmp_path / "o")]
    )
    assert r.exit_code == 4, r.output
    assert "stalled: 1 frames" in r.output
    assert "stalled steps: 1 (3 retries; 0 recovered, 1 failed)" in r.output
    assert "error: the solver stalled at frame 2" in r.output
