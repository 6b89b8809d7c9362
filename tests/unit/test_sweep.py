"""``tisim sweep``: a grid of runs on a Dask LocalCluster, its summary, resume and bad input."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest

# An 8-vertex box sliding on a plane. With solver.iterations = 1 and ten substeps a frame,
# tolerance = 1e-300 can never be met: the runner's guard stops the run after 20 capped
# steps in a row, i.e. at frame 2 (a deterministic divergence); tolerance = 0 completes.
TINY = """
[scene]
name = "tiny"

[sim]
dt = 0.002
substeps = 10
frames = 2

[solver]
type = "pd"
iterations = 1
global_step = "cholesky"

[contact]
mu = 0.2

[objects.box]
generator = "box"
size = [0.1, 0.1, 0.1]
resolution = [1, 1, 1]
youngs_modulus = 1e5
translation = [0.0, 0.0505, 0.0]
velocity = [0.5, 0.0, 0.0]

[colliders.ground]
type = "plane"
"""


def tisim(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "tisim.cli.app", *args], capture_output=True, text=True, timeout=timeout
    )


def one_line_error(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture
def tiny(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    return p


def test_parse_vary_ranges_and_lists():
    from tisim.sweep import parse_vary

    v = parse_vary("contact.mu=0.15:0.20:11")
    assert v.key == "contact.mu" and len(v.values) == 11
    assert v.values[0] == 0.15 and v.values[-1] == 0.2 and v.values[1] == 0.155  # no 0.15500000000000003
    assert np.allclose(np.diff(v.values), 0.005)
    assert parse_vary("sim.substeps=1:4:4").values == (1, 2, 3, 4)  # integers stay integers
    assert parse_vary("solver.integrator=midpoint,energy-momentum").values == ("midpoint", "energy-momentum")
    assert parse_vary("colliders.incline.rotation=[0,0,10],[0,0,20]").values == ([0, 0, 10], [0, 0, 20])
    assert parse_vary("objects.box.youngs_modulus=1e5, 2e5").values == (1e5, 2e5)


@pytest.mark.parametrize(
    "text",
    [
        "contact.mu=0.1:0.2",
        "contact.mu=a:0.2:3",
        "contact.mu=0.1:0.2:0",
        "contact.mu=0.1:0.2:2.5",
        "contact.mu",
        "contact.mu=",
        "contact.mu=0.1,,0.2",
        "=0.1,0.2",
        "contact.mu=0.1,0.1",
    ],
)
def test_parse_vary_rejects(text):
    from tisim.config import ConfigError
    from tisim.sweep import parse_vary

    with pytest.raises(ConfigError, match="--vary"):
        parse_vary(text)


def test_failed_run_is_a_row_and_is_retried(tmp_path, tiny):
    """A run that raises on its worker comes back as ended = "failed" with the reason,
    gets a row (no metrics) and is not taken as finished by a rerun."""
    from tisim.sweep import Metric, _row, is_finished, parse_vary, plan, run_task, store

    (run,) = plan(tiny, [parse_vary("objects.box.youngs_modulus=2e5")])
    data = json.loads(json.dumps(run.data))
    del data["objects"]["box"]["generator"]
    data["objects"]["box"]["mesh"] = "no-such-mesh.obj"
    res = run_task(data, str(tiny), 1, "cpu", None)
    assert res["ended"] == "failed" and "no-such-mesh.obj" in res["message"]
    folder = tmp_path / "runs" / run.folder
    store(folder, run, res)
    row = _row(tmp_path, run, [Metric("final_displacement")])
    assert row["ended"] == "failed" and "no-such-mesh.obj" in row["message"]
    assert math.isnan(row["final_displacement"])
    assert not is_finished(folder, run.signature)


@pytest.mark.slow
def test_sweep_on_local_cluster_writes_summary_and_resumes(tmp_path, tiny):
    out = tmp_path / "sw"
    args = [
        "sweep",
        str(tiny),
        "--vary",
        "contact.mu=0.1:0.3:2",
        "--vary",
        "solver.tolerance=0,1e-300",
        "--metric",
        "n_contacts:max",
        "--metric",
        "final_displacement",
        "--workers",
        "2",
        "--out",
        str(out),
    ]
    r = tisim(*args)
    assert r.returncode == 3, r.stderr  # two runs diverged: run's exit code for a divergence
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [
        f"error: 2 of 4 runs did not complete (2 diverged): see {out / 'sweep.csv'}"
    ], r.stderr
    with open(out / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    info = json.loads((out / "sweep.json").read_text())
    assert info["counts"] == {"completed": 2, "diverged": 2}
    assert sorted(info["not_completed"]) == sorted(row["run"] for row in rows if row["ended"] == "diverged")
    assert {(float(r["contact.mu"]), float(r["solver.tolerance"])) for r in rows} == {
        (0.1, 0.0),
        (0.3, 0.0),
        (0.1, 1e-300),
        (0.3, 1e-300),
    }
    png = (out / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for row in rows:
        folder = out / "runs" / row["run"]
        info = json.loads((folder / "run.json").read_text())
        # the override reached the worker's scene, which ran single-threaded
        assert info["scene"]["contact"]["mu"] == float(row["contact.mu"])
        assert info["scene"]["solver"]["tolerance"] == float(row["solver.tolerance"])
        assert info["sweep"]["cpu_threads"] == "1"
        with open(folder / "stats.csv", newline="") as f:
            stats = list(csv.DictReader(f))
        com = np.array([[float(s[f"com_{a}"]) for a in "xyz"] for s in stats])
        if float(row["solver.tolerance"]) == 0.0:
            assert row["ended"] == "completed" and row["frames_done"] == "2", row
            assert len(stats) == 3
            # the metrics are the run's own stats, reduced
            assert float(row["final_displacement"]) == pytest.approx(np.linalg.norm(com[-1] - com[0]), rel=1e-12)
            assert float(row["final_displacement"]) > 1e-4  # it slides (0.5 m/s)
            assert float(row["n_contacts:max"]) == max(float(s["n_contacts"]) for s in stats[1:]) > 0
            assert float(row["frame_ms"]) > 0
        else:
            assert row["ended"] == "diverged" and "did not converge" in row["message"], row
            assert row["frames_done"] == "1"
    again = tisim(*args)
    assert again.returncode == 3, again.stderr  # the same table, the same verdict
    assert "ran 0, skipped 4" in again.stdout
    with open(out / "sweep.csv", newline="") as f:
        assert [r["ended"] for r in csv.DictReader(f)] == [r["ended"] for r in rows]


def test_a_sweep_with_failed_rows_finishes_them_all_and_exits_1(tiny, tmp_path, monkeypatch):
    """It exited 0 whatever its rows did. Every row is still written, one line on stderr
    counts the ones that did not complete, and the exit code is run's: 1 for a failed row
    (a run that raised or was never done: here an in-process cluster without workers).
    A diverged row's 3 (PD held to a tolerance of 1e-300 with one iteration: 20
    unconverged steps, frame 2), its line and sweep.json's counts are checked by
    test_sweep_on_local_cluster_writes_summary_and_resumes."""
    from distributed import LocalCluster
    from typer.testing import CliRunner

    import tisim.sweep as sw
    from tisim.cli.app import app

    monkeypatch.setattr(sw, "NO_WORKERS_TIMEOUT_S", 0.5)
    monkeypatch.setattr(sw, "_POLL_S", 0.5)
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        r = CliRunner().invoke(
            app,
            [
                "sweep",
                str(tiny),
                "--vary",
                "contact.mu=0.1,0.2",
                "--out",
                str(tmp_path / "f"),
                "--scheduler",
                cluster.scheduler_address,
                "-q",
            ],
        )
    assert r.exit_code == 1, r.output
    assert "error: 2 of 2 runs did not complete (2 failed)" in r.stderr, r.stderr
    assert (tmp_path / "f" / "sweep.csv").exists()


# A 3 x 3 sheet above a sphere; at radius 0.2 the sphere reaches through it (a mistake the
# scene's validation cannot see: the cloth solver finds it when it is built).
TINY_CLOTH = """
[sim]
dt = 0.01
frames = 2

[solver]
type = "cloth"

[objects.sheet]
kind = "cloth"
generator = "cloth"
cloth_size = [0.1, 0.1]
cloth_resolution = [2, 2]
youngs_modulus = 1e5
translation = [0.0, 0.2, 0.0]

[colliders.ball]
type = "sphere"
radius = 0.05
"""


def test_a_row_that_fails_on_the_users_mistake_exits_2(tmp_path):
    """A run that raised on the user's mistake (a cloth that starts inside a collider at
    one of the swept values) makes the sweep exit 2, as `tisim run` of that scene would,
    not 1 (an internal failure); the row says why, and the cloth rows' empty volume column
    warns nothing."""
    p = tmp_path / "cloth.toml"
    p.write_text(TINY_CLOTH)
    out = tmp_path / "o"
    r = tisim("sweep", str(p), "--vary", "colliders.ball.radius=0.05,0.2", "--workers", "1", "--out", str(out), "-q")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Warning" not in r.stderr, r.stderr
    with open(out / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["ended"] for row in rows] == ["completed", "failed"]
    assert rows[1]["message"].startswith("MeshError: ") and "intersects collider 'ball'" in rows[1]["message"]
    info = json.loads((out / "runs" / rows[1]["run"] / "run.json").read_text())
    assert info["error"] == "MeshError"


def test_bad_range_is_one_line(tiny):
    one_line_error(
        tisim("sweep", str(tiny), "--vary", "contact.mu=0.15:0.20", "--out", "o"),
        "--vary",
        "malformed range",
        "START:STOP:COUNT",
    )


def test_unknown_key_is_one_line_before_any_run(tiny, tmp_path):
    r = tisim("sweep", str(tiny), "--vary", "contact.muu=0.1,0.2", "--out", str(tmp_path / "o"))
    one_line_error(r, "contact.muu", "unknown key", "tiny.toml")
    assert not (tmp_path / "o").exists()


def test_unknown_arch_is_one_line_before_any_run(tiny, tmp_path):
    """Every run failed with "unknown arch" and the sweep exited 0."""
    r = tisim("sweep", str(tiny), "--vary", "contact.mu=0.1,0.2", "--arch", "metal", "--out", str(tmp_path / "o"))
    one_line_error(r, "--arch", "metal", "cpu")
    assert not (tmp_path / "o").exists()


def test_unreachable_scheduler_is_one_line(tiny):
    r = tisim(
        "sweep",
        str(tiny),
        "--vary",
        "contact.mu=0.1,0.2",
        "--scheduler",
        "tcp://127.0.0.1:9",
        "--timeout",
        "1",
        "--out",
        "o",
    )
    one_line_error(r, "--scheduler", "cannot reach", "tcp://127.0.0.1:9", "1 s")


def test_cluster_without_workers_gives_failed_rows_not_a_hang(tiny, tmp_path, monkeypatch):
    """An existing scheduler (--scheduler) with no worker: the runs become failed rows after
    NO_WORKERS_TIMEOUT_S instead of a sweep that waits forever."""
    from distributed import LocalCluster

    import tisim.sweep as sw

    monkeypatch.setattr(sw, "NO_WORKERS_TIMEOUT_S", 0.5)
    monkeypatch.setattr(sw, "_POLL_S", 0.5)
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        res = sw.sweep(
            tiny,
            [sw.parse_vary("contact.mu=0.1,0.2")],
            tmp_path / "o",
            scheduler=cluster.scheduler_address,
            progress=False,
        )
    assert [r["ended"] for r in res.rows] == ["failed", "failed"]
    assert all("no Dask worker" in r["message"] for r in res.rows)
    with open(tmp_path / "o" / "sweep.csv", newline="") as f:
        assert [r["ended"] for r in csv.DictReader(f)] == ["failed", "failed"]


def test_cloth_in_f32_is_refused_before_any_run(demos_dir, tmp_path):
    """A cloth scene swept in f32 ends with one line naming --precision (the cloth solver
    runs in f64 only, tisim.runner.scene_precision) before anything is launched."""
    r = tisim(
        "sweep",
        str(demos_dir / "cloth-drape.toml"),
        "--vary",
        "contact.mu=0.1,0.2",
        "--precision",
        "f32",
        "--out",
        str(tmp_path / "o"),
    )
    one_line_error(r, "--precision", "f64")
    assert not (tmp_path / "o").exists()
