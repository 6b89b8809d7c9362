"""The command line as a user meets it: one-line errors with exit code 2, lists, help."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


def tisim(*args, cwd=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "tisim.cli.app", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def tisim_here(*args, timeout=120):
    """``tisim *args`` run in this test process, through the console script's ``main()``:
    what ``tisim()`` gives (exit code, stdout, stderr) without a fresh interpreter's
    start-up: a 4 x 4 cloth of three frames took 5.7-8.0 s as a subprocess, of which its
    frames 0.15 s (the rest: imports, Taichi's front end for every kernel and the cached
    kernels' loads, which this process has already). Only for runs on the session's backend (the CPU in f64): a run asking for
    another arch or precision must be a subprocess. Python's warnings are all printed to the
    captured stderr, as a fresh process prints each the first time (Taichi's own C++ log
    lines are not captured: tests that look for those need ``tisim()``). A run that hangs
    ends this worker after ``timeout`` s (pytest-xdist reports the test as failed)."""
    import contextlib
    import faulthandler
    import io
    import warnings

    from tisim.cli import app as cli

    out, err = io.StringIO(), io.StringIO()

    def show(message, category, filename, lineno, file=None, line=None):
        err.write(warnings.formatwarning(message, category, filename, lineno, line))

    argv, code = sys.argv, 0
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        sys.argv = ["tisim", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            try:
                cli.main()
            except SystemExit as e:  # what the interpreter does with it at exit
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    err.write(f"{e.code}\n")
    finally:
        faulthandler.cancel_dump_traceback_later()
        sys.argv = argv
    return subprocess.CompletedProcess(["tisim", *args], code, out.getvalue(), err.getvalue())


def assert_one_line_error(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_help_is_fast_and_lists_commands():
    r = tisim("--help")
    assert r.returncode == 0
    for cmd in ("run", "demo", "compare", "info"):
        assert cmd in r.stdout


def test_help_text_reads_as_written():
    """Help is plain text: a docstring's line breaks are joined into sentences and
    "[refine]" is printed, not swallowed as rich markup (it was, in Typer's rich mode)."""
    r = tisim("demo", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "A progressive cloth demo (one with a [refine] table) opens its coarse preview" in text
    r = tisim("--help")
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("demo "))
    assert "Run a bundled demo" in line


def test_help_does_not_import_taichi():
    code = "import sys, tisim.cli.app; assert 'taichi' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "args, fragments",
    [
        (
            ("refine", "x.obj", "--levels", "0"),
            ("tisim refine: ", "'--levels'", "greater than or equal to 1", "see tisim refine --help"),
        ),
        (("demo", "cloth-drape", "--frames", "abc"), ("tisim demo: ", "'--frames'", "integer")),
        (("run",), ("tisim run: ", "Missing argument 'scene'")),
        (("run", "a.toml", "--bogus"), ("tisim run: ", "--bogus")),
        (("frobnicate",), ("tisim: ", "No such command 'frobnicate'")),
    ],
)
def test_usage_errors_are_one_line(args, fragments):
    """A bad option value, a missing argument, an unknown option or command: one line
    naming the command and what was wrong, exit code 2 (click printed its 4-line usage
    block: "Usage: ...", "Try ...", a blank line, "Error: ...")."""
    assert_one_line_error(tisim(*args), *fragments)


def test_bare_command_still_shows_help_and_help_exits_0():
    r = tisim()
    assert r.returncode == 2 and "Commands:" in r.stdout + r.stderr, (r.stdout, r.stderr)
    r = tisim("run", "--help")
    assert r.returncode == 0 and "Usage:" in r.stdout and not r.stderr.strip(), r.stderr


def test_missing_scene_file(tmp_path):
    r = tisim("run", str(tmp_path / "nope.toml"))
    assert_one_line_error(r, "nope.toml", "no such scene file")


def test_bad_value_names_file_and_key(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[objects.a]\ngenerator = "box"\ndensity = -3.0\n')
    r = tisim("run", str(p))
    assert_one_line_error(r, "bad.toml", "objects.a.density", "> 0", "-3.0")


def test_bad_override(tmp_path):
    p = tmp_path / "ok.toml"
    p.write_text('[objects.a]\ngenerator = "box"\n')
    r = tisim("run", str(p), "--set", "sim.dt=-1")
    assert_one_line_error(r, "ok.toml", "sim.dt")
    r = tisim("run", str(p), "--set", "novalue")
    assert_one_line_error(r, "KEY=VALUE")


def test_missing_mesh_file(tmp_path):
    """One line naming the scene file, the key and where a relative path was looked for:
    of an object, a cloth object and a mesh collider."""
    p = tmp_path / "m.toml"
    p.write_text('[objects.a]\nmesh = "missing.msh"\n')
    r = tisim_here("run", str(p), "--no-render", "-n", "1")
    assert_one_line_error(r, "m.toml", "objects.a.mesh", "missing.msh", "scene's folder")
    p.write_text('[solver]\ntype = "cloth"\n[objects.c]\nkind = "cloth"\nmesh = "sheet.obj"\n')
    r = tisim_here("run", str(p), "--no-render", "-n", "1")
    assert_one_line_error(r, "m.toml", "objects.c.mesh", "sheet.obj")
    p.write_text('[objects.a]\ngenerator = "box"\n[colliders.rock]\ntype = "mesh"\nmesh = "rock.stl"\n')
    r = tisim_here("run", str(p), "--no-render", "-n", "1")
    assert_one_line_error(r, "m.toml", "colliders.rock.mesh", "rock.stl")


def test_debug_shows_traceback(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[objects.a]\ngenerator = "box"\ndensity = -3.0\n')
    r = tisim("run", str(p), "--debug")
    assert r.returncode == 2  # the user's mistake's exit code, with or without --debug
    assert "Traceback" in r.stderr and "density" in r.stderr.splitlines()[-1]


def test_unknown_demo():
    r = tisim("demo", "no-such-demo")
    assert_one_line_error(r, "no-such-demo")


def test_demo_list_has_descriptions():
    r = tisim("demo", "--list")
    assert r.returncode == 0
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert lines, "no demos listed"
    for ln in lines:
        name, _, desc = ln.partition(" ")
        assert desc.strip(), f"demo {name} has no description"


@pytest.mark.parametrize("arch", ["tpu"])
def test_bad_arch(tmp_path, arch):
    p = tmp_path / "ok.toml"
    p.write_text('[objects.a]\ngenerator = "box"\n')
    r = tisim("run", str(p), "--arch", arch, "--no-render", "-n", "1")
    assert_one_line_error(r, arch)


def _torus_stl(path, R=0.3, r=0.1, nu=32, nv=12):
    """A closed torus surface (axis y), 2 (R + r) across, outward triangles."""
    import numpy as np

    from tisim.geometry.io import save_mesh

    u = np.linspace(0, 2 * np.pi, nu, endpoint=False)[:, None]
    v = np.linspace(0, 2 * np.pi, nv, endpoint=False)[None, :]
    x = np.stack(
        np.broadcast_arrays((R + r * np.cos(v)) * np.cos(u), r * np.sin(v), (R + r * np.cos(v)) * np.sin(u)), -1
    ).reshape(-1, 3)
    i, j = np.meshgrid(np.arange(nu), np.arange(nv), indexing="ij")
    a, b = i * nv + j, (i + 1) % nu * nv + j
    c, d = (i + 1) % nu * nv + (j + 1) % nv, i * nv + (j + 1) % nv
    faces = np.concatenate([np.stack([a, c, b], -1).reshape(-1, 3), np.stack([a, d, c], -1).reshape(-1, 3)])
    save_mesh(path, x, faces)


@pytest.mark.slow  # TetGen and Taichi start-up in a subprocess
def test_object_starting_inside_colliders_is_one_line_and_exit_2(tmp_path, repo_root):
    # the example: an STL torus 0.8 m across in place of squeeze-ball's 0.2 m ball
    _torus_stl(tmp_path / "torus.stl")
    r = tisim(
        "run",
        str(repo_root / "demos" / "squeeze-ball.toml"),
        "--set",
        "objects.ball.mesh=torus.stl",
        "--no-render",
        "-n",
        "1",
        "-q",
        cwd=tmp_path,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr and "diverged" not in r.stderr + r.stdout, r.stderr
    for frag in (
        "objects.ball",
        "inside collider 'left_roller'",
        "inside collider 'right_roller'",
        "translate it by",
        "--set objects.ball.translation=",
    ):
        assert frag in errors[0], errors[0]
    # every other stderr line is a one-line note (the --set note, the TetGen note)
    assert all(
        ln.startswith(("INFO:", "WARNING:", "[Taichi]"))
        for ln in r.stderr.splitlines()
        if ln.strip() and not ln.startswith("error:")
    ), r.stderr


def test_python_m_tisim_is_the_command_line():
    r = subprocess.run([sys.executable, "-m", "tisim", "demo", "--list"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "squeeze-ball" in r.stdout


def test_top_edge_pin_of_a_flat_lying_cloth_is_refused(tmp_path):
    """`pin = "top-edge"` pins the border vertices of largest y: on a cloth lying flat that
    is the whole border (and, before it kept to the border, every vertex: the sheet hung
    frozen in the air for the whole run). One line names the file, the key and the way out."""
    p = tmp_path / "flat.toml"
    p.write_text(
        '[sim]\ndt = 0.01\n[solver]\ntype = "cloth"\n[objects.sheet]\nkind = "cloth"\n'
        'generator = "cloth"\ncloth_size = [0.4, 0.4]\ncloth_resolution = [6, 6]\n'
        'translation = [0.0, 0.5, 0.0]\npin = "top-edge"\n'
    )
    r = tisim_here("run", str(p), "-n", "1", "--no-render", "--out", str(tmp_path / "o"))
    assert_one_line_error(r, "flat.toml", "objects.sheet.pin", "whole border", "x-min")
    p.write_text(p.read_text().replace('"top-edge"', '"x-min"'))
    r = tisim_here("run", str(p), "-n", "1", "--no-render", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr


def test_cloth_in_f32_is_refused_in_one_line():
    """The cloth solver's IPC contact runs in f64 only (tisim.runner.scene_precision: in f32
    cloth-drape met a Newton system no diagonal shift made positive definite, an internal
    error, in its fifth contact frame); asking for f32 names the option, exit code 2."""
    r = tisim("demo", "cloth-drape", "--precision", "f32", "--headless", "--no-render", "-n", "1", "-q")
    assert_one_line_error(r, "--precision", "f64")


def test_scene_precision_keeps_cloth_in_f64(demos_dir):
    """Without --precision a cloth or ADMM scene runs in f64 on any backend (f32 would be
    a GPU's default); other scenes keep what was asked for."""
    from tisim.config import ConfigError
    from tisim.runner import scene_precision
    from tisim.scene import load_scene

    cloth = load_scene(demos_dir / "cloth-drape.toml")
    pd = load_scene(demos_dir / "squeeze-ball.toml")
    assert scene_precision(cloth, None) == "f64"
    assert scene_precision(cloth, "f64") == "f64"
    with pytest.raises(ConfigError, match="f64 only"):
        scene_precision(cloth, "f32")
    assert scene_precision(pd, None) is None
    assert scene_precision(pd, "f32") == "f32"
    admm = load_scene(demos_dir / "spinning-bar.toml")  # f64 by default, f32 when asked
    assert scene_precision(admm, None) == "f64"
    assert scene_precision(admm, "f32") == "f32"


def test_a_negative_video_rate_and_an_unknown_precision_are_one_line_errors(demos_dir):
    """Both reached the video writer or the backend as an internal error (render.fps) or
    were silently run in f64 (a cloth scene with --precision f16)."""
    scene = str(demos_dir / "cloth-drape.toml")
    r = tisim("run", scene, "--headless", "--no-render", "-n", "1", "--set", "render.fps=-1")
    assert_one_line_error(r, "cloth-drape.toml", "render.fps", "> 0")
    r = tisim("run", scene, "--headless", "--no-render", "-n", "1", "--precision", "f16")
    assert_one_line_error(r, "--precision", "f64 or f32", "f16")


@pytest.mark.slow
def test_a_shorter_rerun_leaves_no_frames_of_the_earlier_run(tmp_path, demos_dir):
    """A rerun into the same --out removes the numbered meshes (and frame images) of the
    run before, which a shorter rerun left mixed with its own; a file of the user's stays."""
    out = tmp_path / "o"
    args = (
        "run",
        str(demos_dir / "cloth-drape.toml"),
        "--headless",
        "--no-render",
        "--export-meshes",
        "-q",
        "--set",
        "objects.cloth.cloth_resolution=[4,4]",
        "--out",
        str(out),
    )
    r = tisim_here(*args, "-n", "3")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (out / "meshes").iterdir()) == [f"cloth_{i:05d}.obj" for i in range(4)]
    (out / "meshes" / "my notes.txt").write_text("mine")
    r = tisim_here(*args, "-n", "1")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (out / "meshes").iterdir()) == ["cloth_00000.obj", "cloth_00001.obj", "my notes.txt"]


def test_a_cloth_starting_through_a_collider_names_it(tmp_path):
    """The start-up check names the collider the cloth crosses (it said "an obstacle
    (collider or soft body)"), in one line with the scene file."""
    p = tmp_path / "through.toml"
    p.write_text(
        '[solver]\ntype = "cloth"\n[objects.sheet]\nkind = "cloth"\ngenerator = "cloth"\n'
        'cloth_size = [0.4, 0.4]\ncloth_resolution = [8, 8]\ntranslation = [0.0, 0.3, 0.0]\n'
        '[colliders.ground]\ntype = "plane"\n[colliders.rock]\ntype = "sphere"\n'
        'position = [0.0, 0.3, 0.0]\nradius = 0.1\n'
    )
    r = tisim("run", str(p), "--no-render", "-n", "1")
    assert_one_line_error(r, "through.toml", "the cloth intersects collider 'rock'")


def test_compare_needs_an_integrator_and_runs_each_once(tmp_path):
    """`-i ,` was an internal error (exit 1); `-i admm,admm` ran admm twice into one folder."""
    r = tisim_here("compare", "spinning-bar", "-i", ",", "-n", "1", "--out", str(tmp_path / "c"))
    assert_one_line_error(r, "--integrators", "one or more")
    r = tisim_here("compare", "spinning-bar", "-i", "admm,admm", "-n", "1", "--out", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    assert (r.stdout + r.stderr).count("running spinning-bar with admm") == 1, r.stderr


def test_compare_with_a_diverged_run_writes_everything_and_exits_as_run_does(tmp_path):
    """One integrator diverging (implicit Euler limited to one Newton iteration against a
    tolerance it cannot meet: the runner stops it after 20 unconverged steps, at frame 10)
    exited 0. The other still runs, both keep their frames, the plots and compare.json are
    written, stderr names the diverged integrator, and the exit code is run's (3)."""
    import json

    from tisim.runner import EXIT_DIVERGED

    out = tmp_path / "c"
    r = tisim_here(
        "compare",
        "spinning-bar",
        "-i",
        "implicit-euler,xpbd",
        "-n",
        "12",
        "--out",
        str(out),
        "--set",
        "solver.type=implicit-euler",
        "--set",
        "solver.max_iterations=1",
        "--set",
        "solver.tolerance=1e-300",
        "--set",
        "objects.bar.resolution=[2,1,1]",
    )
    assert r.returncode == EXIT_DIVERGED == 3, (r.returncode, r.stdout, r.stderr)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert errors[0].startswith("error: implicit-euler diverged: ") and "frame 10" in errors[0], errors[0]
    summary = json.loads((out / "compare.json").read_text())
    assert {k: v["ended"] for k, v in summary["integrators"].items()} == {
        "implicit-euler": "diverged",
        "xpbd": "completed",
    }
    rows = {k: (out / k / "stats.csv").read_text().splitlines() for k in ("implicit-euler", "xpbd")}
    assert len(rows["implicit-euler"]) == 1 + 10  # header, frame 0 and the 9 frames before the divergence
    assert len(rows["xpbd"]) == 1 + 13
    for png in ("energy.png", "linear_momentum.png", "angular_momentum.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "implicit-euler   diverged" in r.stdout


def test_compare_with_a_failed_run_runs_the_others_and_exits_1(tmp_path, monkeypatch):
    """An integrator that raises (a bug, not the user's mistake) no longer ends the comparison
    with the runs after it unrun and no compare.json: it is a failed row, the others run, and
    the exit code is run's for an internal error (1). Its folder keeps no earlier comparison's
    stats.csv or run.json."""
    import json

    from typer.testing import CliRunner

    from tisim import runner
    from tisim.cli.app import app

    real_build = runner.build

    def build(scene, *a, **kw):
        if scene.solver.type == "implicit-euler":
            raise RuntimeError("a made-up failure\nover two lines")
        return real_build(scene, *a, **kw)

    monkeypatch.setattr(runner, "build", build)
    out = tmp_path / "c"
    # an earlier comparison's output in the failing integrator's folder: removed, not left
    # to pass for this run's
    stale = out / "implicit-euler"
    stale.mkdir(parents=True)
    for f in ("stats.csv", "run.json"):
        (stale / f).write_text("frame\n0\n1\n" if f == "stats.csv" else "{}")
        os.utime(stale / f, (1e9, 1e9))
    r = CliRunner().invoke(
        app,
        [
            "compare",
            "spinning-bar",
            "-i",
            "implicit-euler,xpbd",
            "-n",
            "2",
            "--out",
            str(out),
            "--set",
            "objects.bar.resolution=[2,1,1]",
        ],
    )
    assert r.exit_code == 1, r.output
    assert not (stale / "run.json").exists()
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [
        "error: implicit-euler failed: RuntimeError: a made-up failure over two lines"
    ], r.stderr
    summary = json.loads((out / "compare.json").read_text())
    assert summary["integrators"]["implicit-euler"]["ended"] == "failed"
    assert summary["integrators"]["xpbd"]["ended"] == "completed"
    assert len((out / "xpbd" / "stats.csv").read_text().splitlines()) == 1 + 3
    assert not (out / "implicit-euler" / "stats.csv").exists() and (out / "energy.png").exists()


QUIET_SCENE = (
    '[sim]\ndt = 0.01\nframes = 1\n[solver]\ntype = "implicit-euler"\nmax_iterations = 1\n'
    'tolerance = 1e-300\n[objects.a]\nmesh = "gone.msh"\n'
)


def _quiet_cases(tmp_path, demos_dir):
    """Per command that takes --quiet: arguments that log an INFO line (a --set note, the
    refine's consistent masses) and, for run, a WARNING too (Newton capped at one iteration)."""
    scene = tmp_path / "q.toml"
    scene.write_text(QUIET_SCENE)
    tiny = tmp_path / "tiny.toml"
    tiny.write_text('[objects.box]\ngenerator = "box"\nresolution = [1, 1, 1]\n')
    return {
        "run": [
            "run",
            str(scene),
            "-n",
            "1",
            "--no-render",
            "--set",
            "objects.a.generator=box",
            "--set",
            "objects.a.resolution=[1,1,1]",
            "--out",
            str(tmp_path / "r"),
        ],
        "demo": [
            "demo",
            "spinning-bar",
            "-n",
            "1",
            "--no-render",
            "--set",
            "objects.bar.generator=ball",
            "--set",
            "objects.bar.ball_resolution=2",
            "--out",
            str(tmp_path / "d"),
        ],
        # the note comes while the runs are planned; the unreachable scheduler ends it there
        "sweep": [
            "sweep",
            str(tiny),
            "--vary",
            "contact.mu=0.1,0.2",
            "--set",
            "objects.box.generator=ball",
            "--scheduler",
            "tcp://127.0.0.1:9",
            "--timeout",
            "1",
            "--out",
            str(tmp_path / "s"),
        ],
        "refine": [
            "refine",
            str(demos_dir / "refine-drape.toml"),
            "-n",
            "1",
            "--levels",
            "2",
            "--no-render",
            "--out",
            str(tmp_path / "f"),
        ],
    }


@pytest.mark.parametrize("command", ["run", "demo", "sweep", "refine"])
def test_quiet_shows_only_warnings_errors_and_the_result(tmp_path, demos_dir, command):
    """--quiet hid the progress bar only: tisim's INFO lines and Taichi's banner still
    reached the terminal. Now only warnings, errors and the result lines do; without
    --quiet the same command prints its INFO line (the case does log one)."""
    args = _quiet_cases(tmp_path, demos_dir)[command]
    loud = tisim(*args, cwd=tmp_path)
    quiet = tisim(*args, "--quiet", cwd=tmp_path)
    assert quiet.returncode == loud.returncode, (quiet.stderr, loud.stderr)
    assert "INFO:" in loud.stderr, loud.stderr
    assert "INFO:" not in quiet.stderr and "[Taichi]" not in quiet.stdout + quiet.stderr, quiet.stdout + quiet.stderr
    # what is left: warnings, errors and the command's own result lines, the same as without --quiet
    assert [ln for ln in quiet.stderr.splitlines() if ln.strip()] == [
        ln for ln in loud.stderr.splitlines() if ln.startswith(("WARNING:", "error:"))
    ]

    def lines(text):  # without the timings, which differ from run to run
        return [re.sub(r"[0-9.]+ (ms|s)\b", "T", ln) for ln in text.splitlines() if ln.strip()]

    assert lines(quiet.stdout) == [ln for ln in lines(loud.stdout) if not ln.startswith("[Taichi]") and "━" not in ln]
    if command == "run":
        assert quiet.returncode == 0 and "WARNING: implicit Euler: Newton did not converge" in quiet.stderr
    if command == "sweep":
        assert quiet.returncode == 2 and "cannot reach the Dask scheduler" in quiet.stderr


def test_quiet_in_process_leaves_the_environment_and_log_level_as_they_were(tmp_path, monkeypatch):
    """--quiet sets TISIM_QUIET and ENABLE_TAICHI_HEADER_PRINT for the processes a command
    starts, and the WARNING level; called in-process (tests, scripts), it restores them."""
    import logging
    import os

    from typer.testing import CliRunner

    from tisim.cli.app import app

    monkeypatch.delenv("TISIM_QUIET", raising=False)
    monkeypatch.setenv("ENABLE_TAICHI_HEADER_PRINT", "True")
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
    r = CliRunner().invoke(app, ["run", str(tmp_path / "nope.toml"), "--quiet"])
    assert r.exit_code == 2 and "no such scene file" in r.stderr, r.output
    assert "TISIM_QUIET" not in os.environ and os.environ["ENABLE_TAICHI_HEADER_PRINT"] == "True"
    assert logging.getLogger().level == logging.INFO


def test_compare_on_a_cloth_scene_says_what_compare_runs(tmp_path, demos_dir):
    """compare put its first integrator (admm) into a cloth scene, and the user read
    "solver.type: cloth objects need solver.type = 'cloth', got 'admm'", a type they never
    set. The cloth solver is the only one that runs cloth, so there is nothing to compare:
    one line naming the scene file, the cloth object and the integrators compare runs,
    before anything is written; -i cloth on a solid scene names the cloth solver."""
    out = tmp_path / "c"
    for args in ([str(demos_dir / "cloth-drape.toml")], ["cloth-on-ball", "-i", "cloth"]):
        r = tisim("compare", *args, "-n", "1", "--out", str(out))
        assert_one_line_error(
            r,
            ".toml: tisim compare compares the solid integrators (admm, implicit-euler, pd, xpbd)",
            "objects.cloth is a cloth",
            "tisim run",
        )
        assert "solver.type" not in r.stderr
    assert not out.exists()
    r = tisim("compare", "spinning-bar", "-i", "admm,cloth", "-n", "1", "--out", str(out))
    assert_one_line_error(
        r,
        "--integrators",
        "'cloth' is the cloth solver, which runs only cloth scenes",
        "admm, implicit-euler, pd, xpbd",
    )
    assert not out.exists()


def test_compare_stops_at_a_ctrl_c_and_still_writes_its_summary(tmp_path, monkeypatch):
    """A Ctrl-C while an integrator sets up (before the runner's own handler) ended the
    comparison with no compare.json; now the integrators after it are "not run", the
    summary is written and the exit code is run's for an interrupt (130)."""
    import json

    from typer.testing import CliRunner

    from tisim import runner
    from tisim.cli.app import app

    def build(scene, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "build", build)
    out = tmp_path / "c"
    r = CliRunner().invoke(app, ["compare", "spinning-bar", "-i", "implicit-euler,xpbd", "-n", "1", "--out", str(out)])
    assert r.exit_code == 130, r.output
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error:")] == [
        "error: implicit-euler interrupted: interrupted before its first frame",
        "error: not run: xpbd",
    ], r.stderr
    ended = {k: v["ended"] for k, v in json.loads((out / "compare.json").read_text())["integrators"].items()}
    assert ended == {"implicit-euler": "interrupted", "xpbd": "not run"}
