"""The runner: stats.csv rows, run.json, the NaN guard, Ctrl-C, mesh export.

A tiny test-only solver (symplectic Euler under gravity) keeps these tests
independent of the real solvers.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest

from tisim.runner import STATS_COLUMNS, frame_quantities, run_scene
from tisim.scene import scene_from_dict
from tisim.solvers import registry
from tisim.solvers.base import Solver, StepStats


@dataclass(frozen=True, kw_only=True)
class BallisticConfig:
    type: Literal["test-ballistic"] = "test-ballistic"
    blow_up_at: float = -1.0  # time at which to produce NaN (negative: never)
    interrupt_at: float = -1.0


class Ballistic(Solver):
    name = "test-ballistic"

    def step(self, s_in, s_out, dt):
        g = self.model.gravity
        s_out.velocities[:] = s_in.velocities + dt * g
        s_out.positions[:] = s_in.positions + dt * s_out.velocities
        s_out.time = s_in.time + dt
        if 0 <= self.config.blow_up_at <= s_out.time:
            s_out.positions[0, 0] = np.nan
        if 0 <= self.config.interrupt_at <= s_out.time:
            raise KeyboardInterrupt
        return StepStats(
            iterations=1, residual=0.0, potential=self.potential_energy(s_out.positions), extra={"custom": 1.5}
        )

    def potential_energy(self, x):
        return float(-(self.model.mass[:, None] * x * self.model.gravity).sum())


@pytest.fixture(autouse=True, scope="module")
def _register():
    registry.register("test-ballistic", Ballistic, BallisticConfig)
    yield
    registry.unregister("test-ballistic")


def scene(frames=5, **solver):
    return scene_from_dict(
        {
            "scene": {"name": "ballistic"},
            "sim": {"dt": 0.01, "frames": frames, "substeps": 2},
            "solver": {"type": "test-ballistic", **solver},
            "objects": {"b": {"generator": "box", "resolution": [1, 1, 1], "velocity": [1, 0, 0]}},
        }
    )


def read_stats(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_stats_and_run_json(tmp_path):
    res = run_scene(scene(), tmp_path / "o", progress=False)
    assert res.ended == "completed" and res.frames_done == 5 and res.exit_code == 0
    rows = read_stats(tmp_path / "o" / "stats.csv")
    assert len(rows) == 6  # frame 0 (initial state) + 5
    assert list(rows[0].keys())[: len(STATS_COLUMNS)] == STATS_COLUMNS
    assert rows[0]["iterations"] == "0" and rows[0]["residual"] == ""  # not computed -> empty
    last = rows[-1]
    assert float(last["time"]) == pytest.approx(0.1)  # 5 frames x 2 substeps x 0.01
    assert int(last["iterations"]) == 2
    assert float(last["custom"]) == 1.5
    m = 1000.0  # unit box, density 1000
    assert float(last["px"]) == pytest.approx(m * 1.0)
    assert float(last["py"]) == pytest.approx(m * -9.81 * 0.1)
    assert float(last["vcom_y"]) == pytest.approx(-0.981)
    assert float(last["min_volume_ratio"]) == pytest.approx(1.0)
    # symplectic Euler under constant gravity: after N steps of size h the total
    # energy has changed by exactly -m g^2 h^2 N / 2 (the scheme's known error)
    e0, e1 = float(rows[0]["total_energy"]), float(last["total_energy"])
    assert e1 - e0 == pytest.approx(-m * 9.81**2 * 0.01**2 * 10 / 2, rel=1e-9)
    info = json.loads((tmp_path / "o" / "run.json").read_text())
    assert info["ended"] == "completed" and info["frames_done"] == 5
    assert info["sizes"]["vertices"] == 8 and info["sizes"]["tets"] == 5
    assert info["precision"] == "f64" and info["arch"] == "cpu"
    assert info["precision_notes"] == []  # f64 keeps every promise
    assert info["scene"]["sim"]["dt"] == 0.01
    assert info["timings_ms"]["median"] >= 0
    assert info["versions"]["taichi"]


def test_nan_stops_run_and_keeps_frames(tmp_path):
    res = run_scene(scene(frames=10, blow_up_at=0.055), tmp_path / "o", progress=False)
    assert res.ended == "diverged" and res.exit_code == 3
    assert res.frames_done == 2
    assert "frame 3" in res.message and "NaN" in res.message
    rows = read_stats(tmp_path / "o" / "stats.csv")
    assert len(rows) == 3
    assert all(math.isfinite(float(r["com_x"])) for r in rows)
    info = json.loads((tmp_path / "o" / "run.json").read_text())
    assert info["ended"] == "diverged"


def test_ctrl_c_leaves_valid_outputs(tmp_path):
    res = run_scene(scene(frames=10, interrupt_at=0.035), tmp_path / "o", progress=False)
    assert res.ended == "interrupted" and res.exit_code == 130
    rows = read_stats(tmp_path / "o" / "stats.csv")
    assert len(rows) == res.frames_done + 1
    json.loads((tmp_path / "o" / "run.json").read_text())  # valid JSON


def test_frame_quantities_angular_momentum():
    from tisim.model import Model

    sc = scene_from_dict(
        {"objects": {"b": {"generator": "box", "resolution": [2, 2, 2], "angular_velocity": [0, 2.0, 0]}}}
    )
    m = Model.from_scene(sc)
    q = frame_quantities(m, m.initial_positions, m.initial_velocities)
    # L = I w with the lumped-mass inertia about y: sum m (x^2 + z^2)
    x = m.initial_positions
    Iyy = float((m.mass * (x[:, 0] ** 2 + x[:, 2] ** 2)).sum())
    assert q["ly"] == pytest.approx(Iyy * 2.0)
    assert q["lx"] == pytest.approx(0, abs=1e-12) and q["px"] == pytest.approx(0, abs=1e-12)


def test_headless_render_writes_frames_and_video(tmp_path):
    from tisim.render import vulkan_available

    if not vulkan_available():
        pytest.skip("no Vulkan driver: off-screen rendering unavailable (install mesa-vulkan-drivers)")
    import imageio.v3 as iio

    from tisim.render.offscreen import OffscreenRenderer
    from tisim.render.video import FrameWriter

    out = tmp_path / "o"
    sc = scene_from_dict(
        {
            "scene": {"name": "ballistic"},
            "sim": {"dt": 0.02, "frames": 4},
            "solver": {"type": "test-ballistic"},
            "objects": {"b": {"generator": "box", "resolution": [1, 1, 1], "velocity": [2, 0, 0]}},
            "camera": {"position": [0, 0, 4], "lookat": [0, 0, 0]},
            "render": {"width": 96, "height": 64},
        }
    )
    viewer = OffscreenRenderer(FrameWriter(out, fps=10, video_name="ballistic.mp4"))
    res = run_scene(sc, out, viewer=viewer, progress=False)
    pngs = sorted((out / "frames").glob("*.png"))
    assert len(pngs) == 5
    first, last = iio.imread(pngs[0]), iio.imread(pngs[-1])
    assert first.shape[:2] == (64, 96)
    assert np.abs(first.astype(int) - last.astype(int)).sum() > 0  # the box moved
    assert res.video is not None and res.video.exists() and res.video.stat().st_size > 0


def test_substep_stall_flags_are_not_lost():
    from tisim.runner import _accumulate

    agg = StepStats(iterations=0)
    _accumulate(agg, StepStats(iterations=3, extra={"admm_stalled": 1.0, "primal_residual": 1e-3}))
    _accumulate(agg, StepStats(iterations=2, extra={"admm_stalled": 0.0, "primal_residual": 1e-9}))
    assert agg.iterations == 5
    assert agg.extra["admm_stalled"] == 1.0  # any substep stalled -> the frame stalled
    assert agg.extra["primal_residual"] == 1e-9  # last substep's value


@pytest.mark.parametrize(
    "demo, notes",
    [("stick-slip", []), ("squeeze-ball", []), ("spinning-bar", ["conservative"]), ("twisting-bar", [])],
)
def test_precision_notes_say_what_f32_cannot_keep(demos_dir, demo, notes):
    """In f32 the ADMM integrator's guarantees are out of reach (measured, docs/benchmarks.md): a run
    says so in one line at start-up and in run.json; f64 runs and PD scenes carry no note
    (f32 friction matches f64 since the PD residual's difference form: the stick-slip
    verdicts and sliding speed, tests/backends)."""
    from tisim.runner import precision_notes
    from tisim.scene import load_scene

    sc = load_scene(demos_dir / f"{demo}.toml")
    got = precision_notes(sc, "f32")
    assert notes == [w for w in ("friction", "conservative") if any(w in g for g in got)]
    assert all(g.startswith("f32: ") and "--precision f64" in g and "\n" not in g for g in got)
    assert precision_notes(sc, "f64") == []
