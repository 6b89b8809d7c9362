"""Start-up overlap checks (tisim.startup): the geometry against independent references,
then deep overlaps refused in one line and shallow ones pushed out."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tisim.config import ConfigError
from tisim.model import Model
from tisim.scene import scene_from_dict
from tisim.startup import SHALLOW_FRACTION, check_initial_overlaps, closest_point_on_triangle, points_in_tets


def test_closest_point_on_triangle_matches_ipctk(rng):
    ipctk = pytest.importorskip("ipctk")
    tri = rng.normal(size=(300, 3, 3))
    p = rng.normal(size=(300, 3)) * 2
    q = closest_point_on_triangle(p, tri[:, 0], tri[:, 1], tri[:, 2])
    d = np.linalg.norm(q - p, axis=1)
    ref = np.array([np.sqrt(ipctk.point_triangle_distance(p[k], *tri[k])) for k in range(len(p))])
    assert np.all(ref > 1e-3)  # a zero distance everywhere would pass any check
    np.testing.assert_allclose(d, ref, rtol=1e-9, atol=1e-12)
    # q lies on the triangle: barycentric coordinates in [0, 1]
    e1, e2 = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    lam = np.linalg.lstsq(np.stack([e1[0], e2[0]], 1), q[0] - tri[0, 0], rcond=None)[0]
    assert lam.min() >= -1e-9 and lam.sum() <= 1 + 1e-9


def test_points_in_tets_against_the_box_and_the_ball(rng):
    from tisim.geometry import generate

    box = generate.box((0.6, 0.4, 0.2), (6, 4, 2))
    p = rng.uniform(-0.5, 0.5, size=(2000, 3))
    half = np.array([0.3, 0.2, 0.1])
    q = np.abs(p) - half
    clear = np.abs(q).min(axis=1) > 1e-6  # not on a face
    truth = np.all(q < 0, axis=1)
    got = points_in_tets(p, box.vertices, box.tets)
    assert truth[clear].sum() > 50 and (~truth[clear]).sum() > 50
    np.testing.assert_array_equal(got[clear], truth[clear])
    ball = generate.ball(0.3, 8)
    r = np.linalg.norm(p, axis=1)
    got = points_in_tets(p, ball.vertices, ball.tets)
    assert np.all(got[r < 0.2]) and not np.any(got[r > 0.31])  # a polyhedral ball: a band left out


def _scene(objects: dict, colliders: dict | None = None):
    return scene_from_dict({"objects": objects, "colliders": colliders or {}}, "unit.toml")


def _box(size, translation, **kw):
    return {"generator": "box", "size": list(size), "resolution": [3, 3, 3], "translation": list(translation), **kw}


def test_resting_on_a_surface_is_not_an_overlap():
    sc = _scene(
        {"a": _box((0.2, 0.2, 0.2), (0, 0.1, 0)), "b": _box((0.2, 0.2, 0.2), (0, 0.3, 0))}, {"floor": {"type": "plane"}}
    )
    m = Model.from_scene(sc)
    assert check_initial_overlaps(m) is m


def test_deep_overlap_with_a_collider_is_one_line_with_a_translation_that_clears_it():
    sc = _scene({"a": _box((0.2, 0.2, 0.2), (0, 0.05, 0))}, {"floor": {"type": "plane"}})
    with pytest.raises(ConfigError) as ei:
        check_initial_overlaps(Model.from_scene(sc))
    e = ei.value
    msg = str(e)
    assert "\n" not in msg and msg.startswith("unit.toml: objects.a: ")
    assert "0.05 m inside collider 'floor'" in msg, msg
    assert "--set objects.a.translation=[0,0.1,0]" in msg, msg  # 0.05 up from 0.05, to 4 digits
    # the suggestion does what it says
    fixed = _scene({"a": _box((0.2, 0.2, 0.2), (0, 0.1 + 1e-6, 0))}, {"floor": {"type": "plane"}})
    m = Model.from_scene(fixed)
    assert check_initial_overlaps(m) is m


def test_inside_two_colliders_names_both_and_the_translation_clears_both():
    # a ball between two rollers, as in squeeze-ball with a ball too big for the nip
    rollers = {
        k: {"type": "cylinder", "position": [s * 0.26, 0, 0], "radius": 0.2, "length": 0.5}
        for k, s in (("left", -1), ("right", 1))
    }
    sc = _scene(
        {"ball": {"generator": "ball", "radius": 0.15, "ball_resolution": 5, "translation": [0, 0.2, 0]}}, rollers
    )
    m = Model.from_scene(sc)
    with pytest.raises(ConfigError) as ei:
        check_initial_overlaps(m)
    msg = str(ei.value)
    assert "collider 'left'" in msg and "collider 'right'" in msg, msg
    shift = np.array([float(c) for c in msg.split("translate it by [")[1].split("]")[0].split(",")])
    assert abs(shift[0]) < 1e-6 and shift[1] > 0 and abs(shift[2]) < 1e-6
    x = m.initial_positions + shift
    for c in m.colliders:
        assert c.signed_distance(x)[0].min() >= -1e-9


def test_shallow_overlap_is_pushed_out_with_a_warning(caplog):
    depth = 0.004  # 2% of the 0.2 m box
    assert depth < SHALLOW_FRACTION * 0.2
    sc = _scene(
        {
            "a": _box(
                (0.2, 0.2, 0.2),
                (0, 0.1 - depth, 0),
                handles={"top": {"region_min": [-1, 0.19 - depth, -1], "region_max": [1, 1, 1]}},
            )
        },
        {"floor": {"type": "plane", "rotation": [0, 0, 0]}},
    )
    m = Model.from_scene(sc)
    with caplog.at_level(logging.WARNING, logger="tisim.startup"):
        m2 = check_initial_overlaps(m)
    assert m2 is not m
    shift = m2.initial_positions - m.initial_positions
    np.testing.assert_allclose(shift, np.broadcast_to([0, depth, 0], shift.shape), rtol=1e-3)
    assert m2.initial_positions[:, 1].min() >= 0
    np.testing.assert_allclose(m2.handles[0].rest, m.handles[0].rest + shift[0])  # handles move along
    np.testing.assert_allclose(m2.handles[0].targets(0.0), m2.initial_positions[m2.handles[0].vertices])
    assert m.initial_positions[:, 1].min() < 0  # the original model is untouched
    warn = [r.getMessage() for r in caplog.records]
    assert len(warn) == 1 and "objects.a" in warn[0] and "collider 'floor'" in warn[0], warn


def test_squeezed_between_two_colliders_is_pressed_onto_their_surfaces(caplog):
    # grab's fingers 3 mm inside a 0.1 m cube's sides: no translation clears both
    fingers = {
        k: {"type": "box", "position": [s * 0.057, 0.05, 0], "half_extents": [0.01, 0.04, 0.04]}
        for k, s in (("left", -1), ("right", 1))
    }
    sc = _scene({"cube": _box((0.1, 0.1, 0.1), (0, 0.05, 0), resolution=[6, 6, 6])}, fingers)
    m = Model.from_scene(sc)
    with caplog.at_level(logging.WARNING, logger="tisim.startup"):
        m2 = check_initial_overlaps(m)
    for c in m2.colliders:
        assert c.signed_distance(m2.initial_positions)[0].min() >= -1e-9
        assert c.signed_distance(m.initial_positions)[0].min() < -0.002
    moved = np.linalg.norm(m2.initial_positions - m.initial_positions, axis=1)
    assert 0.0029 < moved.max() < 0.0031 and np.count_nonzero(moved) < len(moved) // 2
    assert "squeezed" in caplog.records[0].getMessage()


def test_objects_inside_each_other():
    # deep: the second box sunk 5 cm into the first
    sc = _scene({"a": _box((0.2, 0.2, 0.2), (0, 0, 0)), "b": _box((0.2, 0.2, 0.2), (0, 0.15, 0))})
    with pytest.raises(ConfigError) as ei:
        check_initial_overlaps(Model.from_scene(sc))
    msg = str(ei.value)
    assert ei.value.key == "objects.b" and "object 'a'" in msg and "0.05 m inside" in msg, msg
    assert "translation=[0,0.2,0]" in msg, msg
    # shallow: 2 mm, pushed up by 2 mm
    sc = _scene({"a": _box((0.2, 0.2, 0.2), (0, 0, 0)), "b": _box((0.2, 0.2, 0.2), (0.05, 0.198, 0))})
    m = Model.from_scene(sc)
    m2 = check_initial_overlaps(m)
    d = m2.initial_positions - m.initial_positions
    sl = m.object_vertex_slices[1]
    np.testing.assert_allclose(d[sl], np.broadcast_to([0, 0.002, 0], d[sl].shape), rtol=1e-3)
    assert not np.any(d[m.object_vertex_slices[0]])
    # a small object entirely inside a big one, in either order
    small, big = _box((0.05, 0.05, 0.05), (0, 0, 0)), _box((0.4, 0.4, 0.4), (0, 0, 0))
    for objs in ({"small": small, "big": big}, {"big": big, "small": small}):
        with pytest.raises(ConfigError, match="inside object"):
            check_initial_overlaps(Model.from_scene(_scene(objs)))


@pytest.mark.slow  # a PD solver build and two frames
def test_shallow_overlap_run_starts_pushed_out_and_completes(demos_dir, tmp_path, caplog):
    # stick-slip's box placed 2 mm into the tilted incline (translation is in its frame)
    from tisim.runner import build, run_scene
    from tisim.scene import load_scene

    sc = load_scene(
        demos_dir / "stick-slip.toml", ["objects.box.translation=[0.0, 0.098, 0.0]", "objects.box.resolution=[2,2,2]"]
    )
    incline = Model.from_scene(sc).colliders[0]
    assert incline.signed_distance(Model.from_scene(sc).initial_positions)[0].min() == pytest.approx(-0.002)
    with caplog.at_level(logging.WARNING, logger="tisim.startup"):
        _, model, _ = build(sc, "cpu", "f64")
    d = incline.signed_distance(model.initial_positions)[0]
    assert d.min() >= 0 and d.min() < 1e-6  # on the incline, not above it
    warn = [r.getMessage() for r in caplog.records if r.name == "tisim.startup"]
    assert len(warn) == 1 and "0.002 m inside collider 'incline'" in warn[0], warn
    res = run_scene(sc, tmp_path / "out", frames=2, progress=False)
    assert res.ended == "completed", res.message
