"""Impossible cloth scenes refused through the CLI in one line with exit code 2: a cloth
that starts inside a closed collider (sphere, box, cylinder, closed mesh) or cuts
through one with every vertex outside, and solver values the solver cannot use."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_cli import tisim_here

SHEET = """
[sim]
dt = 0.01
frames = 1
[solver]
type = "cloth"
[objects.sheet]
kind = "cloth"
generator = "cloth"
cloth_size = [{size}, {size}]
cloth_resolution = [{cells}, {cells}]
translation = [0.0, {y}, 0.0]
"""


def _run(tmp_path, collider: str, *sets, size=0.3, cells=4, y=0.0, timeout=300):
    scene = tmp_path / "scene.toml"
    scene.write_text(SHEET.format(size=size, cells=cells, y=y) + collider)
    args = ["run", str(scene), "--no-render", "-q", "-o", str(tmp_path / "out")]
    for s in sets:
        args += ["--set", s]
    return tisim_here(*args, timeout=timeout)


def _one_line(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def _icosphere_obj(path, radius):
    from tisim.geometry.generate import icosphere

    ico = icosphere(2)
    V = radius * ico.vertices / np.linalg.norm(ico.vertices, axis=1, keepdims=True)
    path.write_text(
        "".join(f"v {a:.17g} {b:.17g} {c:.17g}\n" for a, b, c in V)
        + "".join(f"f {i + 1} {j + 1} {k + 1}\n" for i, j, k in ico.faces)
    )


@pytest.mark.parametrize(
    "value,key",
    [
        ("0.5", "solver.strain_limit"),
        ("1", "solver.strain_limit"),
        ("1e300", "solver.strain_stiffness"),
        ("1e-300", "contact.dhat"),
    ],
)
def test_unusable_solver_values_are_refused(tmp_path, value, key):
    # they ended as internal errors (a ValueError, a LinAlgError, a ZeroDivisionError)
    # with exit code 1
    r = _run(tmp_path, "", f"{key}={value}", y=1.0)
    _one_line(r, key)


@pytest.mark.slow  # Taichi starts in a subprocess
@pytest.mark.parametrize(
    "collider",
    [
        '[colliders.ball]\ntype = "sphere"\nradius = 1.0\n',
        '[colliders.crate]\ntype = "box"\nhalf_extents = [1.0, 1.0, 1.0]\nrotation = [10.0, 20.0, 30.0]\n',
        '[colliders.drum]\ntype = "cylinder"\nradius = 1.0\nlength = 2.0\naxis = [1.0, 0.0, 0.0]\n',
        '[colliders.drum]\ntype = "cylinder"\nradius = 1.0\n',
    ],
)
def test_cloth_wholly_inside_an_analytic_collider_is_refused(tmp_path, collider):
    name = collider.split("]")[0].split(".")[1]
    _one_line(_run(tmp_path, collider), f"'{name}'", "inside")


@pytest.mark.slow
def test_cloth_wholly_inside_a_closed_mesh_collider_is_refused(tmp_path):
    _icosphere_obj(tmp_path / "ball.obj", 1.0)
    _one_line(_run(tmp_path, '[colliders.rock]\ntype = "mesh"\nmesh = "ball.obj"\n'), "'rock'", "inside")
    # the same cloth outside that mesh runs
    r = _run(tmp_path, '[colliders.rock]\ntype = "mesh"\nmesh = "ball.obj"\n', y=1.5)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "collider",
    [
        # a sphere's cap through a 1 m triangle whose corners are all outside it
        '[colliders.ball]\ntype = "sphere"\nradius = 0.1\nposition = [0.1, -0.05, -0.1]\n',
        # a box's ridge through the triangles
        (
            '[colliders.ridge]\ntype = "box"\nhalf_extents = [0.3, 0.1, 0.1]\nrotation = [45.0, 0.0, 0.0]\n'
            'position = [0.0, -0.1, 0.0]\n'
        ),
    ],
)
def test_cloth_cutting_through_an_analytic_collider_is_refused(tmp_path, collider):
    name = collider.split("]")[0].split(".")[1]
    _one_line(_run(tmp_path, collider, size=1.0, cells=1), f"'{name}'", "intersects")
