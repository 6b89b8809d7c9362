"""The project's lint and format rules (pyproject.toml's [tool.ruff]) hold over the repository:
`make lint` runs the same two commands."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.skip("ruff is not installed (it comes with the test extra: pip install -e '.[test]')")


def test_ruff_check_is_clean():
    r = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_is_applied():
    r = subprocess.run([*_ruff(), "format", "--no-cache", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "run `make lint` (ruff format):\n" + r.stdout[-4000:] + r.stderr[-2000:]
