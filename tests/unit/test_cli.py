"""The command line as a user meets it: one-line errors with exit code 2, lists, help."""

from __future__ import annotations

import subprocess
import sys

import pytest


def tisim(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "tisim.cli.app", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


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


def test_help_does_not_import_taichi():
    code = "import sys, tisim.cli.app; assert 'taichi' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


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
    p = tmp_path / "m.toml"
    p.write_text('[objects.a]\nmesh = "missing.msh"\n')
    r = tisim("run", str(p), "--no-render", "-n", "1")
    assert_one_line_error(r, "missing.msh")


def test_debug_shows_traceback(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[objects.a]\ngenerator = "box"\ndensity = -3.0\n')
    r = tisim("run", str(p), "--debug")
    assert r.returncode != 0
    assert "Traceback" in r.stderr


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
