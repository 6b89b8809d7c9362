"""Collision detection: closest points, collider contacts, vertex-triangle contacts."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.contact.ncp.detection import ContactDetector, point_triangle_closest
from tisim.model import Model
from tisim.scene import scene_from_dict


def _model(objects, colliders=None, contact=None) -> Model:
    data = {"objects": objects, "colliders": colliders or {}, "contact": contact or {}}
    return Model.from_scene(scene_from_dict(data))


def _box_sdf(p, center, half):
    q = np.abs(p - center) - half
    return np.linalg.norm(np.maximum(q, 0), axis=1) + np.minimum(q.max(axis=1), 0)


def test_point_triangle_closest_matches_ipctk(rng):
    ipctk = pytest.importorskip("ipctk")
    k = 2000
    a, b, c = (rng.normal(size=(k, 3)) for _ in range(3))
    p = 1.5 * rng.normal(size=(k, 3))
    cp, bary, region = point_triangle_closest(p, a, b, c)
    d2 = np.array([ipctk.point_triangle_distance(p[i], a[i], b[i], c[i]) for i in range(k)])
    np.testing.assert_allclose(np.sum((p - cp) ** 2, axis=1), d2, rtol=1e-9, atol=1e-12)
    assert np.all(bary >= -1e-12) and np.allclose(bary.sum(axis=1), 1.0)
    np.testing.assert_allclose(cp, bary[:, :1] * a + bary[:, 1:2] * b + bary[:, 2:] * c, atol=1e-12)
    assert set(np.unique(region)) == set(range(7))  # every Voronoi region exercised


def test_box_on_plane_contacts():
    m = _model(
        {
            "box": {
                "generator": "box",
                "size": [0.2, 0.2, 0.2],
                "resolution": [2, 2, 2],
                "translation": [0, 0.1, 0],
            }
        },
        {
            "floor": {"type": "plane"},
            "wall": {"type": "plane", "position": [5, 0, 0], "normal": [-1, 0, 0], "friction": 0.9},
        },
        {"mu": 0.4},
    )
    det = ContactDetector(m, m.scene.contact)
    q = m.initial_positions
    cs = det.detect(q, q, 0.01)
    bottom = np.flatnonzero(np.isclose(q[:, 1], 0.0))
    assert sorted(cs.vertices[:, 0]) == sorted(bottom) and cs.count == 9
    np.testing.assert_allclose(cs.gap0, 0.0, atol=1e-15)
    np.testing.assert_allclose(cs.normals, np.tile([0.0, 1.0, 0.0], (9, 1)))
    np.testing.assert_allclose(cs.mu, 0.4)
    # lifted by 1 mm: no contact at q_n, but the prediction q_tilde reaches the floor
    up = q + [0.0, 1e-3, 0.0]
    assert det.detect(up, up, 0.01).count == 0
    cs2 = det.detect(up, up - [0.0, 2e-3, 0.0], 0.01)
    assert cs2.count == 9 and np.allclose(cs2.gap0, 1e-3)  # linearised at q_n
    # held vertices get no contacts
    held = np.zeros(m.vertex_count, dtype=bool)
    held[bottom[:4]] = True
    assert det.detect(q, q, 0.01, held).count == 5
    # per-collider friction overrides contact.mu
    near_wall = q + [5.0 - 0.1 - 1e-4, 0.5, 0.0]
    cs3 = det.detect(near_wall, near_wall + [2e-4, 0, 0], 0.01)
    assert cs3.count == 9 and np.allclose(cs3.mu, 0.9) and np.all(cs3.collider == 1)


def test_moving_collider_gap_at_end_of_step():
    m = _model(
        {
            "box": {
                "generator": "box",
                "size": [0.2, 0.2, 0.2],
                "resolution": [1, 1, 1],
                "translation": [0, 0.1, 0],
            }
        },
        {"lift": {"type": "plane", "velocity": [0, 0.5, 0], "angular_velocity": [0, 0, 0]}},
    )
    det = ContactDetector(m, m.scene.contact)
    q = m.initial_positions
    h = 0.01
    cs = det.detect(q, q, h)  # the plane reaches y = 0.005 at t = h
    assert cs.count == 4
    np.testing.assert_allclose(cs.gap0, -0.5 * h)
    np.testing.assert_allclose(cs.surface_velocity, np.tile([0, 0.5, 0], (4, 1)))


def test_vertex_triangle_contacts_against_box_sdf(rng):
    half = np.array([0.1, 0.1, 0.1])
    m = _model(
        {
            "big": {"generator": "box", "size": [0.2, 0.2, 0.2], "resolution": [2, 2, 2]},
            "ball": {
                "generator": "ball",
                "radius": 0.06,
                "ball_resolution": 4,
                "translation": [0.08, 0.13, 0.05],
            },
        },
        contact={"margin": 0.03},
    )
    det = ContactDetector(m, m.scene.contact)
    q = m.initial_positions
    cs = det.detect(q, q, 0.01)
    ball = m.object_vertex_slices[1]
    on_ball = (cs.vertices[:, 0] >= ball.start) & (cs.vertices[:, 0] < ball.stop)
    assert on_ball.sum() >= 10 and (~on_ball).sum() >= 1  # both directions of vertex-triangle
    sdf = _box_sdf(q[cs.vertices[on_ball, 0]], np.zeros(3), half)
    assert (sdf < 0).sum() >= 3 and (sdf > 0).sum() >= 3  # penetrating and near-by vertices
    np.testing.assert_allclose(cs.gap0[on_ball], sdf, atol=1e-12)
    # the gap is exactly the linear function n^T Pi q at detection, weights sum to zero
    np.testing.assert_allclose(np.einsum("kd,kd->k", cs.normals, cs.points(q)), cs.gap0, atol=1e-14)
    np.testing.assert_allclose(cs.weights.sum(axis=1), 0.0, atol=1e-14)
    assert np.all(cs.gap0 <= 0.03 + 1e-15)


def test_no_object_contacts_when_disabled_or_single():
    objs = {
        "a": {"generator": "box", "size": [0.2, 0.2, 0.2], "resolution": [2, 2, 2]},
        "b": {
            "generator": "box",
            "size": [0.1, 0.1, 0.1],
            "resolution": [1, 1, 1],
            "translation": [0, 0.14, 0],
        },
    }
    m = _model(objs, contact={"objects": False})
    q = m.initial_positions
    assert ContactDetector(m, m.scene.contact).detect(q, q, 0.01).count == 0
    m2 = _model(objs)
    cs = ContactDetector(m2, m2.scene.contact).detect(q, q, 0.01)
    # b's four bottom corners are 1 cm inside a; a's top centre vertex is 1 cm inside b
    assert cs.count == 5
    np.testing.assert_allclose(cs.gap0, -0.01, atol=1e-12)
    up = np.where(cs.vertices[:, 0] >= m2.object_vertex_slices[1].start, 1.0, -1.0)
    np.testing.assert_allclose(cs.normals, up[:, None] * [0.0, 1.0, 0.0], atol=1e-12)
    assert (up > 0).sum() == 4
    # a single undeformed body has no self-contacts (its own one-ring is excluded)
    m3 = _model({"a": objs["a"]}, contact={"self_collision": True})
    q3 = m3.initial_positions
    assert ContactDetector(m3, m3.scene.contact).detect(q3, q3, 0.01).count == 0


def test_self_collision_finds_folded_surface():
    m = _model(
        {"a": {"generator": "box", "size": [0.4, 0.04, 0.1], "resolution": [16, 2, 4]}},
        contact={"self_collision": True},
    )
    q = m.initial_positions.copy()
    # self-contacts are limited to a quarter edge deep, so a layer's own far side is not one
    assert 0.25 * ContactDetector(m, m.scene.contact).edge_length < 0.04
    # fold the right half (x > 0.05) over the left half (a rotation by pi about z) so
    # that its lower face (now at y = 0.015) sits 5 mm inside the left half (top y = 0.02)
    right = q[:, 0] > 0.05 + 1e-9
    q[right, 0] = 0.1 - q[right, 0]
    q[right, 1] = 0.035 - q[right, 1]
    cs = ContactDetector(m, m.scene.contact).detect(q, q, 0.01)
    assert np.all(cs.collider == -1)
    x = q[cs.vertices[:, 0]]
    # away from the (torn) fold seam, the layers' common rims (coplanar side faces) and ends
    clean = (x[:, 0] < -0.01) & (x[:, 0] > -0.09) & (np.abs(x[:, 2]) < 0.04)
    lower = clean & np.isclose(x[:, 1], 0.015)  # right half's face, inside the left half
    upper = clean & np.isclose(x[:, 1], 0.02)  # left half's face, inside the right half
    assert lower.sum() >= 6 and upper.sum() >= 6
    np.testing.assert_allclose(cs.gap0[lower | upper], -0.005, atol=1e-12)
    np.testing.assert_allclose(cs.normals[lower], np.tile([0, 1.0, 0], (lower.sum(), 1)), atol=1e-12)
    np.testing.assert_allclose(cs.normals[upper], np.tile([0, -1.0, 0], (upper.sum(), 1)), atol=1e-12)
