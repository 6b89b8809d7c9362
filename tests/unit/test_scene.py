"""Scene parsing, overrides and every kind of scene error."""

from __future__ import annotations

import math

import pytest

from tisim.config import ConfigError
from tisim.scene import apply_overrides, load_scene, parse_override, scene_from_dict

MINIMAL = """
[scene]
name = "unit"
description = "a box"

[sim]
dt = 0.005
frames = 3

[solver]
type = "pd"
iterations = 7

[objects.block]
generator = "box"
size = [1.0, 0.5, 0.5]
resolution = [2, 1, 1]
density = 500.0

[objects.block.handles.left]
region_min = [-1, -1, -1]
region_max = [-0.49, 1, 1]

[colliders.floor]
type = "plane"
position = [0, -1, 0]
"""


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_minimal_scene_parses(tmp_path):
    s = load_scene(write(tmp_path, MINIMAL))
    assert s.name == "unit"
    assert s.sim.dt == 0.005 and s.sim.frames == 3
    assert s.solver.type == "pd" and s.solver.iterations == 7
    assert s.objects["block"].density == 500.0
    assert s.objects["block"].resolution == (2, 1, 1)
    assert s.objects["block"].handles["left"].region_max == (-0.49, 1.0, 1.0)
    assert s.colliders["floor"].type == "plane"
    assert s.contact.mu == 0.3  # default


def test_lame_parameters():
    from tisim.scene import ObjectConfig

    o = ObjectConfig(generator="box", youngs_modulus=1e5, poisson_ratio=0.25)
    mu, lam = o.lame
    assert mu == pytest.approx(1e5 / 2.5)
    assert lam == pytest.approx(1e5 * 0.25 / (1.25 * 0.5))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("contact.mu=0.5", (["contact", "mu"], 0.5)),
        ("objects.ball.mesh=my.msh", (["objects", "ball", "mesh"], "my.msh")),
        ('objects.ball.mesh="a b.msh"', (["objects", "ball", "mesh"], "a b.msh")),
        ("sim.gravity=[0, 0, -9.81]", (["sim", "gravity"], [0, 0, -9.81])),
        ("contact.enabled=false", (["contact", "enabled"], False)),
        ("sim.frames=10", (["sim", "frames"], 10)),
    ],
)
def test_parse_override(text, expected):
    assert parse_override(text) == expected


def test_overrides_apply_and_validate(tmp_path):
    p = write(tmp_path, MINIMAL)
    s = load_scene(
        p,
        [
            "contact.mu=0.7",
            "objects.block.density=250",
            "solver.iterations=3",
            "objects.block.resolution=[3,2,2]",
            "colliders.floor.position=[0,-2,0]",
        ],
    )
    assert s.contact.mu == 0.7
    assert s.objects["block"].density == 250.0
    assert s.solver.iterations == 3
    assert s.objects["block"].resolution == (3, 2, 2)
    assert s.colliders["floor"].position == (0.0, -2.0, 0.0)


def test_override_creates_new_tables():
    d = apply_overrides({"sim": {"dt": 0.1}}, ["colliders.wall.type=plane"])
    assert d["colliders"]["wall"]["type"] == "plane"


@pytest.mark.parametrize(
    "override, key, fragment",
    [
        ("objects.block.density=-1", "objects.block.density", "> 0"),
        ("sim.dt=0", "sim.dt", "> 0"),
        ("sim.dt=-0.01", "sim.dt", "> 0"),
        ("sim.frames=2.5", "sim.frames", "integer"),
        ("objects.block.colour=1", "objects.block.colour", "unknown key"),
        ("contact.mu=\"high\"", "contact.mu", "number"),
        ("contact.ncp=\"newton\"", "contact.ncp", "fischer-burmeister"),
        ("objects.block.material=\"steel\"", "objects.block.material", "neo-hookean"),
        ("objects.block.size=[1,2]", "objects.block.size", "3"),
        ("objects.block.poisson_ratio=0.5", "objects.block.poisson_ratio", "< 0.5"),
        ("solver.type=\"magic\"", "solver.type", "pd"),
        ("solver.iterations=0", "solver.iterations", ">= 1"),
        ("camera.fov=200", "camera.fov", "< 180"),
        ("bogus.x=1", "bogus", "unknown section"),
        ("objects.block.handles.left.velocity=3", "objects.block.handles.left.velocity", "list of 3"),
        ("colliders.floor.type=\"cone\"", "colliders.floor.type", "plane"),
        ("colliders.floor.normal=[0,0,0]", "colliders.floor.normal", "non-zero"),
        # inf passed the range checks: an internal error later, or NaN energies (density)
        ("objects.block.density=inf", "objects.block.density", "finite"),
        ("objects.block.youngs_modulus=1e400", "objects.block.youngs_modulus", "finite"),
        ("contact.mu=inf", "contact.mu", "finite"),
        ("objects.block.translation=[0,-inf,0]", "objects.block.translation[1]", "finite"),
        # the name made paths: '../x' wrote outside the output folder, 'a/b' broke the video
        ("scene.name=\"../../x\"", "scene.name", "without '/'"),
        ("scene.name=\"v2/final\"", "scene.name", "without '/'"),
        ("scene.name=\"..\"", "scene.name", "not '.' or '..'"),
        # the renderer's zero-length vector (an internal error)
        ("camera.lookat=[2.0,1.5,3.0]", "camera.lookat", "other than camera.position"),
        ("camera.up=[0,0,0]", "camera.up", "non-zero"),
    ],
)
def test_scene_errors_name_file_key_and_expectation(tmp_path, override, key, fragment):
    p = write(tmp_path, MINIMAL)
    with pytest.raises(ConfigError) as ei:
        load_scene(p, [override])
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(str(p))
    assert ei.value.key == key
    assert fragment in msg


def test_a_set_naming_no_entry_of_the_file_says_so(tmp_path):
    """A misspelt object in --set made a new, empty object, reported as needing a mesh or
    a generator; a new object or collider given whole is still added."""
    p = write(tmp_path, MINIMAL)
    with pytest.raises(ConfigError, match=r"no such entry in the scene file \(objects: block\)") as ei:
        load_scene(p, ["objects.blok.density=250"])
    assert ei.value.key == "objects.blok" and "\n" not in str(ei.value)
    with pytest.raises(ConfigError, match=r"\(colliders: floor\).*give it type"):
        load_scene(p, ["colliders.flor.position=[0,-2,0]"])
    s = load_scene(p, ['colliders.wall.type="plane"', "colliders.wall.normal=[1,0,0]"])
    assert "wall" in s.colliders


def test_object_needs_mesh_or_generator(tmp_path):
    text = MINIMAL.replace('generator = "box"', "")
    with pytest.raises(ConfigError, match="exactly one of 'mesh'"):
        load_scene(write(tmp_path, text))


def test_handle_needs_a_selection(tmp_path):
    text = MINIMAL.replace("region_min = [-1, -1, -1]\n", "")
    with pytest.raises(ConfigError) as ei:
        load_scene(write(tmp_path, text))
    assert ei.value.key == "objects.block.handles.left"


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="no such scene file"):
        load_scene(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scene(write(tmp_path, "[sim\ndt = 1"))


def test_scene_needs_an_object():
    with pytest.raises(ConfigError, match="at least one object"):
        scene_from_dict({"sim": {"dt": 0.01}})


def test_round_trip_through_dict(tmp_path):
    s = load_scene(write(tmp_path, MINIMAL))
    d = s.to_dict()
    assert d["solver"]["type"] == "pd"
    assert d["objects"]["block"]["handles"]["left"]["release"] == "inf"
    d["objects"]["block"]["handles"]["left"]["release"] = math.inf
    d["objects"]["block"]["handles"]["left"]["stop"] = math.inf
    s2 = scene_from_dict(d)
    assert s2.objects["block"] == s.objects["block"]
    # a time that never comes stays allowed where it is the default
    assert load_scene(write(tmp_path, MINIMAL), ["objects.block.handles.left.release=inf"]) == s
    assert s2.sim == s.sim


def test_relative_mesh_paths_resolve_against_scene_file(tmp_path):
    sub = tmp_path / "scenes"
    sub.mkdir()
    s = load_scene(write(sub, MINIMAL))
    assert s.resolve_path("m.msh") == sub / "m.msh"


# --set objects.NAME.mesh / .generator compose: the last source set wins -----------------
BALL = """
[objects.ball]
generator = "ball"
radius = 0.1
ball_resolution = 6
density = 500.0
translation = [0.0, 0.3, 0.0]
"""


def test_set_mesh_replaces_the_generator_and_drops_its_keys(tmp_path, caplog):
    p = write(tmp_path, BALL)
    with caplog.at_level("INFO", logger="tisim.scene"):
        s = load_scene(p, ['objects.ball.mesh="mine.stl"', "objects.ball.scale=2.0"])
    o = s.objects["ball"]
    assert (o.mesh, o.generator, o.scale) == ("mine.stl", None, 2.0)
    assert o.radius == 0.5 and o.ball_resolution == 8.0  # the ball's keys are gone (defaults)
    assert o.density == 500.0 and o.translation == (0.0, 0.3, 0.0)  # the rest is kept
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "\n" not in notes[0], notes
    for frag in ("objects.ball.mesh", "generator 'ball'", "objects.ball.radius", "objects.ball.ball_resolution"):
        assert frag in notes[0], notes[0]


def test_set_generator_replaces_a_mesh_and_the_last_source_wins(tmp_path):
    p = write(tmp_path, BALL.replace('generator = "ball"\nradius = 0.1\nball_resolution = 6', 'mesh = "a.msh"'))
    s = load_scene(p, ['objects.ball.generator="box"', "objects.ball.size=[0.2,0.1,0.1]"])
    assert s.objects["ball"].mesh is None and s.objects["ball"].generator == "box"
    assert s.objects["ball"].size == (0.2, 0.1, 0.1)
    s = load_scene(p, ['objects.ball.generator="box"', 'objects.ball.mesh="b.obj"'])
    assert (s.objects["ball"].mesh, s.objects["ball"].generator) == ("b.obj", None)


def test_switching_generators_keeps_shared_keys_and_drops_the_others(tmp_path):
    text = BALL.replace('generator = "ball"', 'generator = "box"\nsize = [0.3, 0.2, 0.2]')
    d = apply_overrides(
        {
            "objects": {
                "b": {"generator": "box", "size": [1, 1, 1], "resolution": [2, 2, 2], "radius": 0.2, "density": 3.0}
            }
        },
        ['objects.b.generator="ball"'],
    )
    assert d["objects"]["b"] == {"generator": "ball", "radius": 0.2, "density": 3.0}
    s = load_scene(write(tmp_path, text), ['objects.ball.generator="ball"'])
    assert s.objects["ball"].radius == 0.1  # ball keys already there are kept
    assert s.objects["ball"].size == (1.0, 1.0, 1.0)  # the box's size was dropped


def test_empty_source_removes_the_key(tmp_path):
    p = write(tmp_path, BALL)
    s = load_scene(p, ['objects.ball.generator=""', 'objects.ball.mesh="x.vtu"'])
    assert (s.objects["ball"].mesh, s.objects["ball"].generator) == ("x.vtu", None)
    with pytest.raises(ConfigError, match="exactly one of 'mesh'"):
        load_scene(p, ['objects.ball.generator=""'])


def test_bundled_assets_resolve_from_anywhere(tmp_path):
    s = load_scene(write(tmp_path, BALL), ['objects.ball.mesh="assets/ball_coarse.msh"'])
    found = s.resolve_path(s.objects["ball"].mesh)
    assert found.is_file() and found.name == "ball_coarse.msh"
    assert s.resolve_path("assets/no-such.msh") == tmp_path / "assets" / "no-such.msh"
