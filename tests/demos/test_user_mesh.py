"""A user's own mesh in every bundled demo with solids: `--set objects.NAME.mesh=FILE`
replaces the generator (its keys dropped, `scale` applied), and the demo runs.

Balls become the bundled asset assets/ball_coarse.msh (radius 0.1 m) scaled to the
demo's radius; boxes become a mesh file of the same size written here (a user's
bar), so the demos' handle regions still select vertices.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from tisim.cli.app import demos_dir, list_demos
from tisim.geometry import generate
from tisim.geometry.io import save_mesh
from tisim.runner import run_scene
from tisim.scene import load_scene


def _solid_demos():
    out = []
    for name, _ in list_demos():
        sc = load_scene(demos_dir() / f"{name}.toml")
        if any(o.kind == "solid" and o.generator in ("box", "ball") for o in sc.objects.values()):
            out.append(name)
    return out


SOLID_DEMOS = _solid_demos()


def test_the_solid_demos_are_found():
    assert {"squeeze-ball", "twisting-bar", "grab", "beam"} <= set(SOLID_DEMOS), SOLID_DEMOS


def _user_mesh_overrides(scene, tmp_path) -> tuple[list[str], dict[str, int]]:
    sets, counts = [], {}
    for name, o in scene.objects.items():
        if o.kind != "solid" or o.generator is None:
            continue
        if o.generator == "ball":
            sets += [f'objects.{name}.mesh="assets/ball_coarse.msh"', f"objects.{name}.scale={o.radius / 0.1!r}"]
            counts[name] = 387
        else:
            size = np.asarray(o.size)
            res = np.maximum(1, np.round(2 * size / size.min())).astype(int)
            mesh = generate.box(tuple(size), tuple(int(r) for r in res))
            path = tmp_path / f"{name}.msh"
            save_mesh(path, mesh.vertices, mesh.tets)
            sets.append(f'objects.{name}.mesh="{path}"')
            counts[name] = mesh.vertex_count
    return sets, counts


@pytest.mark.slow  # 1 frame each, but every solver's kernels compile: ~2-50 s a demo alone
@pytest.mark.parametrize("demo", SOLID_DEMOS)
def test_user_mesh_replaces_the_generator_and_the_demo_runs(demo, tmp_path):
    base = load_scene(demos_dir() / f"{demo}.toml")
    sets, counts = _user_mesh_overrides(base, tmp_path)
    scene = load_scene(demos_dir() / f"{demo}.toml", sets)
    for name in counts:
        o = scene.objects[name]
        assert o.generator is None and o.mesh is not None
        assert o.translation == base.objects[name].translation
    res = run_scene(scene, tmp_path / "out", frames=1, progress=False)
    assert res.ended == "completed", res.message
    with open(tmp_path / "out" / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        for k in ("com_x", "com_y", "com_z", "kinetic"):
            assert math.isfinite(float(r[k])), (demo, k, r[k])
        assert float(r["min_volume_ratio"]) > 0, demo
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    for name, n in counts.items():
        assert info["sizes"]["objects"][name]["vertices"] == n, (demo, name)
