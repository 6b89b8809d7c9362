"""The PD demos: run headless for a few frames and check what each one is about."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from tisim.cli.app import demos_dir
from tisim.model import Model
from tisim.runner import run_scene
from tisim.scene import load_scene
from tisim.solvers.pd.solver import SolverPD

PD_DEMOS = ["twisting-bar", "twisting-bar-neohookean", "pulling"]


def read_rows(path):
    with open(path / "stats.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", PD_DEMOS)
def test_demo_header_and_solver(name):
    path = demos_dir() / f"{name}.toml"
    lines = path.read_text().splitlines()
    assert (
        lines[0] == "[scene]"
        and lines[1] == f'name = "{name}"'
        and lines[2].startswith("description = ")
    )
    scene = load_scene(path)
    assert scene.solver.type == "pd" and scene.scene.description


def test_twisting_bar_sizes_of_the_paper():
    """5,346 vertices by default; the 11k and 21k variants of Table 3 through --set."""
    path = demos_dir() / "twisting-bar.toml"
    sizes = {}
    for res in ([65, 8, 8], [92, 10, 10], [105, 13, 13]):
        scene = load_scene(path, [f"objects.bar.resolution={res}"])
        oc = scene.objects["bar"]
        sizes[tuple(res)] = int(np.prod(np.asarray(oc.resolution) + 1))
    assert sizes == {(65, 8, 8): 5346, (92, 10, 10): 11253, (105, 13, 13): 20776}


def test_twisting_bar_twists(tmp_path):
    """The twisted end turns about the bar's axis at the prescribed rate, the fixed end
    stays, and the run records the global step chosen (run.json)."""
    scene = load_scene(
        demos_dir() / "twisting-bar.toml",
        ["objects.bar.resolution=[16,3,3]", "sim.gravity=[0.0, 0.0, 0.0]"],
    )
    res = run_scene(scene, tmp_path / "tb", frames=10, progress=False)
    assert res.ended == "completed", res.message
    info = json.loads((tmp_path / "tb" / "run.json").read_text())["solver_info"]
    assert info["global_step"] in ("sparse-inverse", "cholesky")
    rows = read_rows(tmp_path / "tb")
    assert all(np.isfinite(float(r["potential"])) for r in rows[1:])
    pot = [float(r["potential"]) for r in rows]  # elastic only (no gravity)
    assert pot[0] == pytest.approx(0.0, abs=1e-12)
    assert np.all(np.diff(pot) > 0)  # twisting stores energy


def test_twisting_bar_end_rotation_matches_the_handle():
    scene = load_scene(
        demos_dir() / "twisting-bar-neohookean.toml", ["objects.bar.resolution=[16,3,3]"]
    )
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    a = model.initial_state()
    b = a.clone()
    for _ in range(20):
        solver.step(a, b, scene.sim.dt)
        a, b = b, a
    twist = next(h for h in model.handles if h.name.endswith("twist"))
    x = a.positions[twist.vertices] - twist.center
    x0 = twist.rest - twist.center
    ang = np.arctan2(x[:, 2], x[:, 1]) - np.arctan2(x0[:, 2], x0[:, 1])
    ang = np.angle(np.exp(1j * ang))
    big = np.hypot(x0[:, 1], x0[:, 2]) > 1e-6
    assert np.allclose(ang[big], np.pi * 0.2, atol=1e-6)  # 20 steps of 0.01 s at pi rad/s
    mid = np.abs(model.initial_positions[:, 0]) < 0.05
    assert (
        np.all(np.isfinite(a.positions))
        and np.abs(a.positions[mid] - model.initial_positions[mid]).max() > 1e-3
    )


def test_pulling_release_springs_back(tmp_path):
    """Pulled for 0.5 s, released at 0.6 s: the top moves up while held, then the stiff
    ball recoils towards its rest shape."""
    scene = load_scene(demos_dir() / "pulling.toml", ["objects.ball.ball_resolution=5"])
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    pull = next(h for h in model.handles if h.name.endswith("pull"))
    a = model.initial_state()
    b = a.clone()
    top = []
    for _ in range(90):
        st = solver.step(a, b, scene.sim.dt)
        a, b = b, a
        assert np.all(np.isfinite(a.positions)), st
        top.append(a.positions[pull.vertices, 1].mean())
    rest_top = model.initial_positions[pull.vertices, 1].mean()
    assert top[50] - rest_top == pytest.approx(0.3 * 0.5, rel=1e-9)  # held at its target
    assert top[-1] - rest_top < 0.5 * (top[50] - rest_top)  # recoiled after the release
    assert solver.info()["n_held"] < len(pull.vertices) * 2
