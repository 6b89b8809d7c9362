"""Analytic colliders: signed distance against closed forms, normals against finite
differences of the signed distance, surface velocity against the rigid motion."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tisim.contact.colliders import Collider
from tisim.scene import ColliderConfig


def _make(**kw) -> Collider:
    return Collider.from_config("c", ColliderConfig(**kw))


def _box_sdf(p, b):
    q = np.abs(p) - b
    return np.linalg.norm(np.maximum(q, 0), axis=1) + np.minimum(q.max(axis=1), 0)


def _capped_cylinder_sdf(p, r, half):
    # axis z
    d = np.stack([np.linalg.norm(p[:, :2], axis=1) - r, np.abs(p[:, 2]) - half], axis=1)
    return np.linalg.norm(np.maximum(d, 0), axis=1) + np.minimum(d.max(axis=1), 0)


def _fd_gradient(col, x, t=0.0, eps=1e-6):
    g = np.zeros_like(x)
    for k in range(3):
        e = np.zeros(3)
        e[k] = eps
        g[:, k] = (col.signed_distance(x + e, t)[0] - col.signed_distance(x - e, t)[0]) / (2 * eps)
    return g


CASES = {
    "plane": {"type": "plane", "position": (0.1, -0.2, 0.3), "rotation": (0.0, 0.0, 10.0)},
    "sphere": {"type": "sphere", "position": (0.2, 0.1, -0.1), "radius": 0.4},
    "box": {
        "type": "box",
        "position": (0.1, 0.0, 0.2),
        "half_extents": (0.3, 0.2, 0.4),
        "rotation": (20.0, -35.0, 10.0),
    },
    "cylinder": {
        "type": "cylinder",
        "position": (0.0, 0.1, 0.0),
        "radius": 0.25,
        "axis": (1.0, 1.0, 0.0),
        "length": 0.8,
    },
    "roller": {
        "type": "cylinder",
        "position": (0.0, 0.3, 0.0),
        "radius": 0.2,
        "axis": (0.0, 0.0, 1.0),
    },
}


def _closed_form(kind_kw, x):
    c = np.asarray(kind_kw["position"])
    if kind_kw["type"] == "plane":
        th = math.radians(kind_kw["rotation"][2])
        n = np.array([-math.sin(th), math.cos(th), 0.0])
        return (x - c) @ n
    if kind_kw["type"] == "sphere":
        return np.linalg.norm(x - c, axis=1) - kind_kw["radius"]
    if kind_kw["type"] == "box":
        from tisim.geometry.transforms import euler_xyz_deg

        R = euler_xyz_deg(kind_kw["rotation"])
        return _box_sdf((x - c) @ R, np.asarray(kind_kw["half_extents"]))
    a = np.asarray(kind_kw["axis"], float)
    a /= np.linalg.norm(a)
    # frame with the axis as local z
    u = np.cross(a, [0.0, 0.0, 1.0]) if abs(a[2]) < 0.9 else np.cross(a, [1.0, 0.0, 0.0])
    u /= np.linalg.norm(u)
    w = np.cross(a, u)
    local = np.stack([(x - c) @ u, (x - c) @ w, (x - c) @ a], axis=1)
    return _capped_cylinder_sdf(local, kind_kw["radius"], kind_kw.get("length", math.inf) / 2)


@pytest.mark.parametrize("name", list(CASES))
def test_signed_distance_closed_form(name, rng):
    kw = CASES[name]
    col = _make(**kw)
    x = rng.uniform(-1, 1, size=(400, 3))
    d, n = col.signed_distance(x)
    np.testing.assert_allclose(d, _closed_form(kw, x), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1.0, atol=1e-12)
    assert (d < 0).sum() > 5 and (d > 0).sum() > 5  # both sides sampled (plane, shapes)


@pytest.mark.parametrize("name", list(CASES))
def test_distance_alone_equals_the_signed_distance(name, rng):
    """Collider.distance (detection's test of every surface vertex) gives the signed
    distance's values exactly, also for a collider moving and spinning at time t."""
    kw = dict(CASES[name], velocity=(0.3, -0.2, 0.1), angular_velocity=(0.5, 1.0, -2.0))
    col = _make(**kw)
    x = rng.uniform(-1, 1, size=(400, 3))
    for t in (0.0, 0.37):
        d = col.distance(x, t)
        np.testing.assert_array_equal(d, col.signed_distance(x, t)[0])
        assert (d < 0).sum() > 5 and (d > 0).sum() > 5


@pytest.mark.parametrize("name", list(CASES))
def test_normal_is_gradient_of_signed_distance(name, rng):
    col = _make(**CASES[name])
    x = rng.uniform(-1, 1, size=(600, 3))
    _d, n = col.signed_distance(x)
    g = _fd_gradient(col, x)
    # away from kinks (medial surfaces inside boxes/caps, the cylinder axis) the signed
    # distance is differentiable with |grad| = 1; kinks show up as |fd grad| < 1
    ok = np.abs(np.linalg.norm(g, axis=1) - 1.0) < 1e-6
    g2 = _fd_gradient(col, x, eps=1e-4)
    ok &= np.linalg.norm(g - g2, axis=1) < 1e-5
    assert ok.sum() > 300
    np.testing.assert_allclose(n[ok], g[ok], atol=1e-6)


def test_plane_rotation_sets_incline_angle():
    col = _make(type="plane", rotation=(0.0, 0.0, 10.0))
    _, n = col.signed_distance(np.zeros((1, 3)))
    assert math.degrees(math.acos(n[0, 1])) == pytest.approx(10.0, abs=1e-12)
    assert n[0, 0] < 0  # the incline rises towards +x


def test_velocity_at_matches_rigid_motion():
    kw = {
        "type": "box",
        "position": (0.1, 0.2, 0.0),
        "half_extents": (0.2, 0.1, 0.3),
        "velocity": (0.3, -0.1, 0.2),
        "angular_velocity": (0.5, -1.0, 2.0),
    }
    col = _make(**kw)
    x0 = np.array([[0.3, 0.1, -0.2], [0.0, 0.5, 0.4]])
    t, eps = 0.7, 1e-6

    def material_point(tt):
        # a point attached to the collider: x(t) = c(t) + R(t) R(0)^T (x0 - c(0))
        return col.center(tt) + (x0 - col.center(0.0)) @ (col.orientation(tt) @ col.orientation(0.0).T).T

    v_fd = (material_point(t + eps) - material_point(t - eps)) / (2 * eps)
    np.testing.assert_allclose(col.velocity_at(material_point(t), t), v_fd, atol=1e-7)
    # the attached point keeps its signed distance
    d0 = col.signed_distance(x0, 0.0)[0]
    np.testing.assert_allclose(col.signed_distance(material_point(t), t)[0], d0, atol=1e-12)


def test_roller_spinning_about_its_axis_keeps_its_shape_and_drags():
    col = _make(
        type="cylinder",
        position=(0.0, 0.0, 0.0),
        radius=0.2,
        axis=(0.0, 0.0, 1.0),
        angular_velocity=(0.0, 0.0, -3.0),
    )
    x = np.array([[0.2, 0.0, 0.1], [0.0, 0.2, 0.0]])
    np.testing.assert_allclose(col.signed_distance(x, 1.3)[0], 0.0, atol=1e-14)
    v = col.velocity_at(x, 1.3)
    np.testing.assert_allclose(v, [[0.0, -0.6, 0.0], [0.6, 0.0, 0.0]], atol=1e-14)


# keyframed colliders ----------------------------------------------------------

_POS_KEYS = ((0.2, -0.1, 0.05, 0.0), (0.6, -0.05, 0.05, 0.0), (1.1, -0.05, 0.25, 0.1))


def _smoothstep(s):
    return s * s * (3 - 2 * s), 6 * s * (1 - s)


@pytest.mark.parametrize("mode", ["linear", "smooth"])
def test_position_keyframes_against_closed_form(mode):
    col = _make(type="box", position_keys=_POS_KEYS, interpolation=mode)
    p = np.array([k[1:] for k in _POS_KEYS])
    tk = np.array([k[0] for k in _POS_KEYS])
    # held before the first key and after the last, at rest there
    np.testing.assert_allclose(col.center(0.0), p[0], atol=0)
    np.testing.assert_allclose(col.center(3.0), p[-1], atol=0)
    np.testing.assert_allclose(col.linear_velocity(0.1), 0.0, atol=0)
    np.testing.assert_allclose(col.linear_velocity(2.0), 0.0, atol=0)
    for i, s in [(0, 0.25), (0, 0.5), (1, 0.1), (1, 0.8)]:
        t = tk[i] + s * (tk[i + 1] - tk[i])
        h, dh = (s, 1.0) if mode == "linear" else _smoothstep(s)
        np.testing.assert_allclose(col.center(t), p[i] + h * (p[i + 1] - p[i]), atol=1e-15)
        v = (p[i + 1] - p[i]) * dh / (tk[i + 1] - tk[i])
        np.testing.assert_allclose(col.linear_velocity(t), v, atol=1e-14)
        assert np.linalg.norm(v) > 0.05  # a zero rate must not pass
    # exact at the keys
    for t, q in zip(tk, p):
        np.testing.assert_allclose(col.center(t), q, atol=1e-15)
    if mode == "smooth":  # eases in and out: at rest at every key
        for t in tk:
            np.testing.assert_allclose(col.linear_velocity(t), 0.0, atol=1e-14)


@pytest.mark.parametrize("mode", ["linear", "smooth"])
def test_keyframed_material_velocity_matches_finite_differences(mode):
    """velocity_at against central differences of a point attached to a collider that
    is keyframed in position and rotation (all three Euler angles changing)."""
    col = _make(
        type="box",
        half_extents=(0.2, 0.1, 0.3),
        position_keys=_POS_KEYS,
        rotation_keys=((0.0, 0.0, 0.0, 0.0), (0.5, 30.0, -20.0, 50.0), (1.0, 10.0, 40.0, 200.0)),
        interpolation=mode,
    )
    assert col.is_moving()
    x0 = np.array([[0.3, 0.1, -0.2], [0.0, 0.5, 0.4], [-0.2, -0.1, 0.1]])
    eps = 1e-6

    def material_point(tt):
        R = col.orientation(tt) @ col.orientation(0.0).T
        return col.center(tt) + (x0 - col.center(0.0)) @ R.T

    for t in (0.15, 0.3, 0.45, 0.7, 0.93):  # inside segments (linear has kinks at keys)
        v_fd = (material_point(t + eps) - material_point(t - eps)) / (2 * eps)
        assert np.abs(v_fd).max() > 0.05
        np.testing.assert_allclose(col.velocity_at(material_point(t), t), v_fd, atol=1e-7)
        # spin from dR/dt R^T, skew-symmetric
        dR = (col.orientation(t + eps) - col.orientation(t - eps)) / (2 * eps)
        W = dR @ col.orientation(t).T
        np.testing.assert_allclose(W, -W.T, atol=1e-7)
        np.testing.assert_allclose(col.spin(t), [W[2, 1], W[0, 2], W[1, 0]], atol=1e-7)
        # an attached point keeps its signed distance
        d_t = col.signed_distance(material_point(t), t)[0]
        np.testing.assert_allclose(d_t, col.signed_distance(x0, 0.0)[0], atol=1e-12)


def test_constant_keyframes_do_not_move_and_single_key_is_a_pose():
    col = _make(type="sphere", position_keys=((0.0, 1.0, 2.0, 3.0),))
    assert not col.is_moving()
    np.testing.assert_allclose(col.center(5.0), [1.0, 2.0, 3.0])
    spun = _make(type="cylinder", rotation_keys=((0.0, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 720.0)), interpolation="linear")
    assert spun.is_moving()
    # two full turns about z at a constant rate: 4 pi rad/s
    np.testing.assert_allclose(spun.spin(0.5), [0.0, 0.0, 4 * math.pi], atol=1e-12)


@pytest.mark.parametrize(
    ("kw", "key", "words"),
    [
        ({"position_keys": ((0, 0, 0, 0), (0, 1, 0, 0))}, "position_keys[1]", "strictly increasing"),
        ({"rotation_keys": ((1, 0, 0, 0), (0.5, 1, 0, 0))}, "rotation_keys[1]", "strictly increasing"),
        ({"position_keys": ((0, 0, 0, 0),), "velocity": (0, 1, 0)}, "position_keys", "velocity"),
        ({"rotation_keys": ((0, 0, 0, 0),), "rotation": (0, 0, 5)}, "rotation_keys", "rotation"),
        ({"position_keys": ((0.0, 0, 0),)}, "position_keys[0]", "4 numbers"),
        ({"interpolation": "cubic"}, "interpolation", "'smooth'"),
    ],
)
def test_keyframe_keys_are_validated_in_one_line(kw, key, words):
    from tisim.scene import scene_from_dict

    data = {"objects": {"b": {"generator": "box"}}, "colliders": {"f": {"type": "box", **kw}}}
    with pytest.raises(Exception) as e:
        scene_from_dict(data, "s.toml")
    msg = str(e.value)
    assert "\n" not in msg and f"colliders.f.{key}" in msg and words in msg, msg
