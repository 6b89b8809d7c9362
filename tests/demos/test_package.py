"""The built wheel is a real package: demos and assets inside it, `tisim demo` and
`python -m tisim` working from a fresh virtual environment, outside the source tree.

The wheel is built from a copy of the files a release ships (pyproject.toml,
setup.py, README.md, tisim/, demos/, assets/), so nothing else of the tree can
leak in. Dependencies: by default the fresh venv borrows the running
environment's installed packages through a .pth file (seconds, offline) and
installs the wheel itself with --no-deps; TISIM_WHEEL_DEPS=index installs them
from the package index / pip cache as a user's `pip install` does (minutes:
taichi, scipy, matplotlib, ...).
"""

from __future__ import annotations

import csv
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SHIPPED = ("pyproject.toml", "setup.py", "README.md", "tisim", "demos", "assets")


def _run(cmd, cwd, timeout=900):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
def test_wheel_runs_a_demo_from_a_fresh_venv_outside_the_tree(tmp_path, repo_root):
    src = tmp_path / "src"
    src.mkdir()
    for name in SHIPPED:
        p = repo_root / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    pip = [sys.executable, "-m", "pip"]
    _run(pip + ["wheel", "--no-deps", "-q", "-w", tmp_path / "dist", src], tmp_path)
    (wheel,) = (tmp_path / "dist").glob("tisim-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    demos = sorted(p.name for p in (repo_root / "demos").glob("*.toml"))
    for d in demos:
        assert f"tisim/_demos/{d}" in names, d
    assert "tisim/_assets/ball_coarse.msh" in names and "tisim/__main__.py" in names
    assert not any(n.startswith(("demos/", "assets/", "tests/")) for n in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    py = venv / "bin" / "python"
    if os.environ.get("TISIM_WHEEL_DEPS") == "index":
        _run(pip + ["--python", py, "install", "-q", wheel], tmp_path)
    else:
        (purelib,) = (venv / "lib").glob("python3*/site-packages")
        (purelib / "_borrowed_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        _run(pip + ["--python", py, "install", "-q", "--no-deps", wheel], tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = _run([py, "-c", "import tisim, tisim.resources as r; print(tisim.__file__); print(r.demos_dir())"], elsewhere)
    where, demos_dir = (Path(s) for s in r.stdout.split())
    assert venv in where.parents and venv in demos_dir.parents, r.stdout  # not the source tree
    r = _run([py, "-m", "tisim", "demo", "--list"], elsewhere)
    assert "twisting-bar" in r.stdout and "squeeze-ball" in r.stdout
    # a coarser bar: this checks the package, not the solver (the full bar spends ~25 s on its set-up)
    r = _run(
        [
            venv / "bin" / "tisim",
            "demo",
            "twisting-bar",
            "--headless",
            "-n",
            "3",
            "-q",
            "--set",
            "objects.bar.resolution=[16,3,3]",
        ],
        elsewhere,
    )
    assert "completed: 3 frames" in r.stdout, r.stdout
    with open(elsewhere / "out" / "twisting-bar" / "stats.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
