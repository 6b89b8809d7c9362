"""Shared fixtures: Taichi is initialised once (CPU, f64) for the whole session."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# MKL (PARDISO) on one thread in the test processes and the CLI runs they start: the suite
# runs two workers on two cores, and MKL's second thread waits for work by spinning. A
# 40-frame `tisim run` of cloth-drape (2-core AMD EPYC, two runs each) took 15.6-16.3 s of
# CPU with two MKL threads and 11.9-12.6 s with one, in 12.0-12.9 s of wall time either way,
# with the same stats to the last digit; that CPU time is what the other worker wants.
# (Taichi's own threads: below.)
for _name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
# Taichi's CPU backend on one thread too (its loops then compile serial:
# backend.SERIAL_LOOPS), as `tisim run` gives the cloth and ADMM solvers on a 2-core
# machine (runner.scene_threads). Two threads per worker on two workers oversubscribed
# the cores with thread-pool hand-offs: the whole suite, cold kernel cache, 2-core AMD
# EPYC, took 22.6 min of CPU (701 s) with Taichi's default of two threads and 18.5-19.9
# min (575-618 s) with one. The
# parallel loop form is tested where it matters: on Vulkan (tests/backends), and by the
# tests that set their threads (test_backend.py, test_progressive.py, test_taichi_patches.py).
os.environ.setdefault("TI_CPU_MAX_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def taichi_backend():
    from tisim import backend

    info = backend.init("cpu", "f64")
    yield info


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True)
def _chdir_tmp(tmp_path, monkeypatch):
    """Every test runs in its own folder, so nothing (imgui.ini, out/) lands in the tree."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def demos_dir(repo_root):
    return repo_root / "demos"


@pytest.fixture(autouse=True)
def _restore_logging():
    """The CLI's in-process runs (typer's CliRunner) point the root logger at the runner's
    stream, which is closed after the call: put the root logger back after each test, so a
    later test's log records do not meet a closed file."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _restore_taichi_environment():
    """`tisim refine` run in-process (typer's CliRunner) sets TISIM_SERIAL_LOOPS and
    TI_CPU_MAX_NUM_THREADS for the Taichi it would initialise and the processes it starts:
    put them back after each test, so that a later test's child processes do not inherit
    a resumed refine's loop form (a patched child then compiled serial loops where plain
    Taichi could not, test_taichi_patches.py)."""
    keys = ("TISIM_SERIAL_LOOPS", "TI_CPU_MAX_NUM_THREADS")
    saved = {k: os.environ.get(k) for k in keys}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
