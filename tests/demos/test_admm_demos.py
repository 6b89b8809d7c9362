"""The ADMM demos run headless with their own checks, and the comparison driver works.

Fast tests run a few frames of each demo; the slow ones run the parts that carry the
claims: the ball's high-speed impact and the whole stretch-and-release (no inverted
element in any frame, ADMM converged on every step)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tisim.compare import read_stats
from tisim.runner import run_scene
from tisim.scene import load_scene

DEMOS = ("spinning-bar", "bouncing-ball", "beam", "stretch")


def _run(demos_dir, tmp_path, name, frames, overrides=()):
    sc = load_scene(demos_dir / f"{name}.toml", list(overrides))
    assert sc.solver.type == "admm"
    res = run_scene(sc, tmp_path / name, frames=frames, progress=False, arch="cpu", precision="f64")
    assert res.ended == "completed", res.message
    st = read_stats(tmp_path / name / "stats.csv")
    assert len(st["frame"]) == frames + 1
    for k in ("px", "py", "pz", "lx", "ly", "lz", "kinetic", "com_x", "com_y", "com_z"):
        assert np.all(np.isfinite(st[k])), k  # NaN scan
    rows = slice(1, None)
    assert np.all(st["admm_stalled"][rows] == 0)  # ADMM converged on every step
    assert np.all(st["converged"][rows] == 1)
    assert np.all(st["primal_residual"][rows] <= sc.solver.tolerance)
    assert np.all(st["iterations"][rows] >= 1)
    assert np.all(st["min_volume_ratio"] > 0)  # no inverted element in any frame
    assert np.all(np.isfinite(st["total_energy"]))
    return sc, st, res


@pytest.mark.parametrize("name", DEMOS)
def test_demo_runs_a_few_frames(name, demos_dir, tmp_path):
    sc, _st, _res = _run(demos_dir, tmp_path, name, 3)
    assert sc.scene.description
    info = json.loads((tmp_path / name / "run.json").read_text())
    assert info["solver_info"]["solver"] == "admm"
    assert all(o["kappa"] > 0 for o in info["solver_info"]["objects"].values())


def test_spinning_bar_conserves_momenta(demos_dir, tmp_path):
    """Free bar without gravity: p = 0 to round-off, L and the energy constant over 40 frames
    at the demo's tolerance."""
    _sc, st, _ = _run(demos_dir, tmp_path, "spinning-bar", 40)
    L = np.stack([st["lx"], st["ly"], st["lz"]], 1)
    p = np.stack([st["px"], st["py"], st["pz"]], 1)
    E = st["total_energy"]
    assert np.abs(p).max() < 1e-10 * np.linalg.norm(L[0])
    assert np.linalg.norm(L - L[0], axis=1).max() < 1e-6 * np.linalg.norm(L[0])
    assert np.abs(E - E[0]).max() < 0.01 * E[0]
    assert np.ptp(st["kinetic"]) > 1e-3 * E[0]  # energy really moves between kinetic and elastic


def test_beam_sags_with_stiffness_ordered_deflection(demos_dir, tmp_path):
    """Three cantilevers (kappa = 35, 350, 1400) under gravity: the softer, the lower their
    tip after 25 frames; all steps converge with bounded iterations."""

    sc, st, _res = _run(demos_dir, tmp_path, "beam", 25)
    assert st["iterations"][1:].max() < sc.solver.max_iterations
    info = json.loads((tmp_path / "beam" / "run.json").read_text())
    kappas = {k: v["kappa"] for k, v in info["solver_info"]["objects"].items()}
    assert kappas == pytest.approx({"soft": 35.0, "medium": 350.0, "stiff": 1400.0}, rel=1e-6)
    assert st["com_y"][-1] < st["com_y"][0] - 1e-3


@pytest.mark.slow
def test_bouncing_ball_high_speed_impact(demos_dir, tmp_path):
    """The ball hits the ground at ~4.7 m/s and leaves it again within 120 frames: contacts
    happen, no element inverts in any frame, ADMM converges on every step, and the total
    energy (penalty included) stays within 2%."""
    _sc, st, _ = _run(demos_dir, tmp_path, "bouncing-ball", 120)
    assert st["n_contacts"].max() > 10
    assert st["vcom_y"][1] < -4.0 and st["vcom_y"][-1] > 1.0  # thrown down, bounced up
    assert st["min_volume_ratio"].min() < 0.9  # really squashed
    E = st["total_energy"]
    assert np.abs(E - E[0]).max() < 0.02 * abs(E[0])


@pytest.mark.slow
def test_stretch_release_never_inverts(demos_dir, tmp_path):
    """The whole demo: pulled to 3x, released, the recoil's compression resolved without an
    inverted element in any frame and with ADMM converged on every step."""
    _sc, st, _ = _run(demos_dir, tmp_path, "stretch", 500)
    x_end = st["time"]
    assert x_end[-1] >= 4.99
    assert st["min_volume_ratio"].min() < 0.3  # the recoil really compresses
    E = st["total_energy"]
    after = st["time"] > 2.6  # released and the handles gone: energy is conserved
    assert np.abs(E[after] - E[after][0]).max() < 0.03 * E[after][0]


def test_compare_writes_stats_and_plots(demos_dir, tmp_path):
    from tisim.compare import compare

    sc = load_scene(demos_dir / "spinning-bar.toml", ["objects.bar.resolution=[4,1,1]"])
    out = compare(sc, ["admm", "implicit-euler", "xpbd"], tmp_path / "cmp", frames=4, progress=False)
    assert set(out["integrators"]) == {"admm", "implicit-euler", "xpbd"}
    for name, summary in out["integrators"].items():
        assert summary["ended"] == "completed"
        assert (tmp_path / "cmp" / name / "stats.csv").exists()
        assert summary["frames"] == 4
    for p in out["plots"]:
        assert (tmp_path / "cmp").joinpath(p).stat().st_size > 1000
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["scene"] == "spinning-bar"
    adm, ie = out["integrators"]["admm"], out["integrators"]["implicit-euler"]
    assert adm["linear_momentum_max_drift_rel"] < 1e-10
    assert adm["energy_max_drift_rel"] < ie["energy_max_drift_rel"]  # implicit Euler damps
