"""Every bundled demo runs headless for a few frames: no error, no NaN, no inverted tet.

Demo-specific physics checks live beside this file (test_*_demos.py).
"""

from __future__ import annotations

import csv
import math

import pytest

from tisim.cli.app import demos_dir, list_demos
from tisim.runner import run_scene
from tisim.scene import load_scene

DEMOS = [name for name, _ in list_demos()]


def test_there_are_demos():
    assert "squeeze-ball" in DEMOS, DEMOS


@pytest.mark.parametrize("name", DEMOS)
def test_demo_runs_a_few_frames(name, tmp_path):
    scene = load_scene(demos_dir() / f"{name}.toml")
    assert scene.scene.description, f"{name}.toml needs a [scene] description"
    res = run_scene(scene, tmp_path / name, frames=3, progress=False)
    assert res.ended == "completed", res.message
    with open(tmp_path / name / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    has_tets = any(o.kind == "solid" for o in scene.objects.values())
    for r in rows:
        for k in ("com_x", "com_y", "com_z", "kinetic") + (("min_volume_ratio",) if has_tets else ()):
            assert math.isfinite(float(r[k])), (name, k, r[k])
        if has_tets:
            assert float(r["min_volume_ratio"]) > 0, (name, r["frame"])
        else:  # a quantity the model does not have is an empty cell, never a made-up number
            assert r["min_volume_ratio"] == "", (name, r["frame"])
