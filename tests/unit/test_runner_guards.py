"""The runner's divergence guards (issue 13): infinite energy, an inverted element at the end of
a step and a run of capped steps stop a run like a NaN (Diverged, exit code 3, frames kept)
unless the scene sets ``sim.on_divergence = "continue"``; cloth (no tets) skips the inversion check."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

import tisim.runner as runner
from tisim.runner import EXIT_DIVERGED, MAX_CAPPED_STEPS, DivergenceGuards, run_scene
from tisim.scene import scene_from_dict
from tisim.solvers.base import Solver, StepStats


def _scene(on_divergence="stop", frames=30):
    return scene_from_dict(
        {
            "sim": {"dt": 0.01, "frames": frames, "gravity": [0.0, 0.0, 0.0], "on_divergence": on_divergence},
            "solver": {"type": "implicit-euler"},
            "objects": {
                "bar": {
                    "generator": "box",
                    "size": [1.0, 0.2, 0.2],
                    "resolution": [2, 1, 1],
                    "material": "neo-hookean",
                    "youngs_modulus": 1e4,
                    "density": 1000.0,
                }
            },
        }
    )


class _FakeSolver(Solver):
    """Moves the body rigidly; from step ``bad_from`` on it misbehaves as ``mode`` says."""

    name = "fake"

    def __init__(self, model, mode: str, bad_from: int):
        super().__init__(model, None)
        self.mode, self.bad_from, self.k = mode, bad_from, 0

    def step(self, state_in, state_out, dt):
        self.k += 1
        bad = self.k >= self.bad_from
        x = state_in.positions + dt * np.array([0.1, 0.0, 0.0])
        if bad and self.mode == "inversion":
            x = x.copy()
            x[:, 0] = -x[:, 0]  # a mirror image: every tet inverted, energy not reported
        np.copyto(state_out.positions, x)
        np.copyto(state_out.velocities, state_in.velocities)
        state_out.time = state_in.time + dt
        pot = math.inf if bad and self.mode == "energy" else 0.0
        return StepStats(iterations=1, converged=not (bad and self.mode == "capped"), potential=pot)

    def potential_energy(self, positions):
        return 0.0


def _run(monkeypatch, tmp_path, mode, bad_from, on_divergence="stop", frames=30):
    real_build = runner.build

    def build(scene, arch="auto", precision=None):
        info, model, _ = real_build(scene, arch, precision)
        return info, model, _FakeSolver(model, mode, bad_from)

    monkeypatch.setattr(runner, "build", build)
    sc = _scene(on_divergence, frames)
    res = run_scene(sc, tmp_path / mode, progress=False, arch="cpu", precision="f64")
    with open(tmp_path / mode / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    info = json.loads((tmp_path / mode / "run.json").read_text())
    return res, rows, info


@pytest.mark.parametrize("mode, bad_from, word", [("energy", 5, "infinite"), ("inversion", 7, "inverted")])
def test_guard_stops_the_run_and_keeps_frames(monkeypatch, tmp_path, mode, bad_from, word):
    res, rows, info = _run(monkeypatch, tmp_path, mode, bad_from)
    assert res.ended == "diverged" and res.exit_code == EXIT_DIVERGED
    assert f"frame {bad_from}" in res.message and word in res.message
    assert res.frames_done == bad_from - 1
    assert len(rows) == bad_from  # frame 0 and the good frames before
    assert info["ended"] == "diverged" and info["guards"]["on_divergence"] == "stop"


def test_capped_steps_stop_after_a_run(monkeypatch, tmp_path):
    res, rows, info = _run(monkeypatch, tmp_path, "capped", 3, frames=MAX_CAPPED_STEPS + 10)
    stop = 3 + MAX_CAPPED_STEPS - 1
    assert res.ended == "diverged" and res.exit_code == EXIT_DIVERGED
    assert f"frame {stop}" in res.message and "did not converge" in res.message
    assert res.frames_done == stop - 1 and len(rows) == stop
    assert info["guards"]["capped_steps"] == MAX_CAPPED_STEPS


def test_capped_run_resets_on_a_converged_step(rng):
    class _Model:
        element_count = 0

    class _State:
        positions = np.zeros((3, 3))
        time = 0.0

    g = DivergenceGuards(_Model())
    for k in range(3 * MAX_CAPPED_STEPS):
        # every MAX_CAPPED_STEPS-th step converges: never MAX_CAPPED_STEPS in a row
        g.check(_State(), StepStats(converged=(k % (MAX_CAPPED_STEPS - 1) == 0), potential=1.0), k + 1)
    assert g.capped_steps > MAX_CAPPED_STEPS  # counted, but never in one run
    with pytest.raises(runner.Diverged, match="did not converge"):
        for k in range(MAX_CAPPED_STEPS):
            g.check(_State(), StepStats(converged=False, potential=1.0), 100 + k)


def test_continue_runs_on_and_records_the_events(monkeypatch, tmp_path):
    res, _rows, info = _run(monkeypatch, tmp_path, "inversion", 4, on_divergence="continue", frames=12)
    assert res.ended == "completed" and res.exit_code == 0 and res.frames_done == 12
    events = info["guards"]["events"]
    assert [e["cause"] for e in events] == ["inversion"] and events[0]["frame"] == 4


def test_cloth_model_skips_the_inversion_check():
    """A model without tets (cloth): positions are not tets' corners, no det F check."""

    class _Cloth:
        element_count = 0

    class _State:
        positions = np.array([[0.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
        time = 0.1

    g = DivergenceGuards(_Cloth())
    g.check(_State(), StepStats(potential=1.0), 1)  # must not raise
    with pytest.raises(runner.Diverged, match="infinite"):
        g.check(_State(), StepStats(potential=math.inf), 2)


def test_nan_potential_counts_only_after_a_finite_one():
    class _Model:
        element_count = 0

    class _State:
        positions = np.zeros((1, 3))
        time = 0.0

    g = DivergenceGuards(_Model())
    g.check(_State(), StepStats(potential=math.nan), 1)  # a solver that computes no energy
    g.check(_State(), StepStats(potential=2.0), 2)
    with pytest.raises(runner.Diverged, match="NaN"):
        g.check(_State(), StepStats(potential=math.nan), 3)


def test_real_admm_capped_steps_stop_the_run(tmp_path):
    """ADMM with one iteration per step and an unreachable tolerance never converges: its retries
    fail too, and the run stops at the first frame with the stall's exit code 4 (issue 12; before,
    it ran MAX_CAPPED_STEPS unconverged frames and ended "diverged", exit code 3)."""
    sc = scene_from_dict(
        {
            "sim": {"dt": 0.01, "frames": MAX_CAPPED_STEPS + 5, "gravity": [0.0, 0.0, 0.0]},
            "solver": {"type": "admm", "max_iterations": 1, "tolerance": 1e-14},
            "objects": {
                "bar": {
                    "generator": "box",
                    "size": [1.0, 0.2, 0.2],
                    "resolution": [2, 1, 1],
                    "material": "neo-hookean",
                    "youngs_modulus": 1e4,
                    "density": 1000.0,
                    "angular_velocity": [0.0, 0.0, 6.0],
                }
            },
        }
    )
    res = run_scene(sc, tmp_path / "admm", progress=False, arch="cpu", precision="f64")
    assert res.exit_code == runner.EXIT_STALLED and res.ended == "stalled" and res.frames_done == 0
    assert "stalled at frame 1" in res.message and "did not converge" in res.message
