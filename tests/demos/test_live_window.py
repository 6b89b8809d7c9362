"""End to end on a real (virtual) X display: `tisim demo squeeze-ball` in its live window,
poked with random drags, clicks and keys by xdotool for about 20 s
(tools/live_monkey.py), stays open and prints no error or divergence line. Skipped
without Xvfb, xdotool or a Vulkan driver (tools/install_system_deps.sh installs them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def virtual_display():
    if not (shutil.which("Xvfb") and shutil.which("xdotool")):
        pytest.skip("Xvfb and xdotool are not installed (apt-get install xvfb xdotool)")
    from tisim.render import vulkan_available

    if not vulkan_available():
        pytest.skip("no Vulkan driver: GGUI cannot open a window")
    r, w = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(w), "-screen", "0", "1280x1024x24", "-nolisten", "tcp"],
        pass_fds=(w,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(w)
    with os.fdopen(r) as f:
        number = f.readline().strip()
    try:
        yield f":{number}"
    finally:
        xvfb.terminate()
        xvfb.wait(timeout=20)


@pytest.mark.slow
def test_random_input_never_closes_the_live_window(virtual_display, tmp_path):
    env = {**os.environ, "DISPLAY": virtual_display, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "live_monkey.py"),
        "--seconds",
        "20",
        "--seed",
        "3",
        "--",
        sys.executable,
        "-m",
        "tisim",
        "demo",
        "squeeze-ball",
        "--set",
        "objects.ball.ball_resolution=8",
        "--out",
        str(tmp_path / "out"),
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420, cwd=tmp_path, check=False)
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr
