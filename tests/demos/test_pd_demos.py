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
    assert lines[0] == "[scene]" and lines[1] == f'name = "{name}"' and lines[2].startswith("description = ")
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


def _twist_profile(overrides, steps):
    """Cross-section twist angles (rad) along the bar of twisting-bar-neohookean after
    ``steps`` steps: (x of each vertex layer (c,), mean rotation about the bar's axis of
    the layer's off-axis vertices (c,))."""
    scene = load_scene(demos_dir() / "twisting-bar-neohookean.toml", overrides)
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    a = model.initial_state()
    b = a.clone()
    for _ in range(steps):
        st = solver.step(a, b, scene.sim.dt)
        a, b = b, a
        assert np.all(np.isfinite(a.positions)), st
    x0, x = model.initial_positions, a.positions
    ang = np.angle(np.exp(1j * (np.arctan2(x[:, 2], x[:, 1]) - np.arctan2(x0[:, 2], x0[:, 1]))))
    off_axis = np.hypot(x0[:, 1], x0[:, 2]) > 1e-6
    layers = np.unique(np.round(x0[:, 0], 9))
    prof = np.array([ang[off_axis & (np.abs(x0[:, 0] - c) < 1e-9)].mean() for c in layers])
    return layers, prof


def test_twisting_bar_twist_profile_is_linear_when_converged():
    """What the solver computes between the handles: twisted slowly (four 0.05 s steps
    take the end to 0.2 pi rad, while a shear wave crosses the 1 m bar in 0.16 s) the
    bar is near its static state, where a prismatic bar held at both ends twists at a
    uniform rate (Saint-Venant), so each cross-section turns by theta_end (x + 0.5) / L.
    The converged solve (relative residual 1e-3, 200-300 local-global iterations a step)
    follows the line to 0.5 % of theta_end (measured 0.47 %; 0.45 % at 1e-6); the
    handle angles are the prescribed input and are excluded. With the demo's 5
    iterations a step the interior lags far behind the handle (51 % off; 6 % with 50):
    the profile is computed, not copied, and the check sees an unconverged solve."""
    base = ["objects.bar.resolution=[8,2,2]", "sim.gravity=[0.0, 0.0, 0.0]", "sim.dt=0.05"]
    x, prof = _twist_profile(base + ["solver.tolerance=1e-3", "solver.iterations=3000"], 4)
    theta_end = 4 * 0.05 * np.pi  # the handle's prescribed angle (pi rad/s)
    inner = slice(1, -1)
    line = theta_end * (x + 0.5)
    assert np.abs(prof[inner] - line[inner]).max() < 0.01 * theta_end
    assert np.all(np.diff(prof) > 0)
    _, coarse = _twist_profile(base, 4)  # the demo's 5 iterations a step
    assert np.abs(coarse[inner] - line[inner]).max() > 0.1 * theta_end


def test_pulling_release_springs_back(tmp_path):
    """Pulled for 0.5 s, released at 0.6 s: the ball stretches while held (its centre of
    mass follows the pulled top only part of the way: the top is prescribed, the rest is
    computed), then the stiff ball recoils towards its rest shape."""
    scene = load_scene(demos_dir() / "pulling.toml", ["objects.ball.ball_resolution=5"])
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    pull = next(h for h in model.handles if h.name.endswith("pull"))
    a = model.initial_state()
    b = a.clone()
    top, com = [], []
    m = model.mass
    for _ in range(90):
        st = solver.step(a, b, scene.sim.dt)
        a, b = b, a
        assert np.all(np.isfinite(a.positions)), st
        top.append(a.positions[pull.vertices, 1].mean())
        com.append(m @ a.positions[:, 1] / m.sum())
    rest_top = model.initial_positions[pull.vertices, 1].mean()
    rest_com = m @ model.initial_positions[:, 1] / m.sum()
    rise = top[50] - rest_top
    assert 0.05 * rise < com[50] - rest_com < 0.95 * rise  # dragged along and stretched
    assert top[-1] - rest_top < 0.5 * rise  # recoiled after the release
    assert solver.info()["n_held"] < len(pull.vertices) * 2
