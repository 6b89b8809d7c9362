"""Model building from scenes: merging, transforms, masses, handles."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.config import ConfigError
from tisim.model import Model
from tisim.scene import scene_from_dict


def two_boxes(**over):
    d = {
        "sim": {"gravity": [0, -9.81, 0]},
        "objects": {
            "a": {
                "generator": "box",
                "size": [1, 1, 1],
                "resolution": [2, 2, 2],
                "density": 100.0,
                "youngs_modulus": 1e4,
                "poisson_ratio": 0.25,
                "handles": {"top": {"region_min": [-1, 0.49, -1], "region_max": [1, 1, 1], "velocity": [0, 1, 0]}},
            },
            "b": {
                "generator": "box",
                "size": [0.5, 0.5, 0.5],
                "resolution": [1, 1, 1],
                "density": 200.0,
                "translation": [3, 0, 0],
                "rotation": [0, 0, 90],
                "velocity": [1, 0, 0],
                "material": "arap",
            },
        },
    }
    d.update(over)
    return scene_from_dict(d)


def test_merge_sizes_and_ranges():
    m = Model.from_scene(two_boxes())
    assert m.vertex_count == 27 + 8
    assert m.element_count == 5 * 8 + 5
    assert m.object_vertex_slices[1] == slice(27, 35)
    assert m.object_tet_slices[1] == slice(40, 45)
    assert np.all(m.vertex_object[:27] == 0) and np.all(m.vertex_object[27:] == 1)
    assert m.material_of(0) == "neo-hookean" and m.material_of(1) == "arap"


def test_mass_equals_density_times_volume():
    m = Model.from_scene(two_boxes())
    assert m.mass[:27].sum() == pytest.approx(100.0 * 1.0)
    assert m.mass[27:].sum() == pytest.approx(200.0 * 0.125)
    assert np.all(m.mass > 0)


def test_transform_and_initial_velocity():
    m = Model.from_scene(two_boxes())
    xb = m.initial_positions[27:]
    assert xb.mean(axis=0) == pytest.approx([3, 0, 0])
    assert np.allclose(m.initial_velocities[27:], [1, 0, 0])
    assert np.allclose(m.initial_velocities[:27], 0)
    assert np.all(m.rest.volume > 0)


def test_lame_per_element():
    m = Model.from_scene(two_boxes())
    assert m.element_mu[0] == pytest.approx(1e4 / 2.5)


def test_surface_is_closed_and_outward():
    m = Model.from_scene(two_boxes())
    x = m.initial_positions[m.surface]
    n = np.cross(x[:, 1] - x[:, 0], x[:, 2] - x[:, 0])
    # the divergence theorem: sum over faces of (centroid . n)/6 is the enclosed volume
    vol = np.einsum("ij,ij->", x.mean(axis=1), n) / 6.0
    assert vol == pytest.approx(1.0 + 0.125)


def test_handle_selection_and_motion():
    m = Model.from_scene(two_boxes())
    (h,) = m.handles
    assert len(h.vertices) == 9  # the top layer of a 3x3x3 grid
    assert np.allclose(m.initial_positions[h.vertices][:, 1], 0.5)
    idx, tgt = m.handle_targets(2.0)
    assert np.array_equal(idx, h.vertices)
    assert np.allclose(tgt - m.initial_positions[idx], [0, 2.0, 0])


def test_rotating_handle_keeps_distances():
    d = two_boxes().to_dict()
    hd = d["objects"]["a"]["handles"]["top"]
    hd.update(velocity=[0, 0, 0], angular_velocity=[0, 3.0, 0], stop=1.0, release=5.0)
    m = Model.from_scene(scene_from_dict(d))
    (h,) = m.handles
    t1, t2 = h.targets(1.0), h.targets(2.0)
    assert np.allclose(t1, t2)  # motion stops at `stop`
    c = h.center
    assert np.allclose(np.linalg.norm(t1 - c, axis=1), np.linalg.norm(h.rest - c, axis=1))
    assert not np.allclose(t1, h.rest)
    assert m.handle_targets(6.0)[0].size == 0  # released


def test_handle_selecting_nothing_is_an_error():
    d = two_boxes().to_dict()
    d["objects"]["a"]["handles"]["top"] = {"region_min": [5, 5, 5], "region_max": [6, 6, 6]}
    del d["objects"]["b"]
    with pytest.raises(ConfigError, match="selects no vertex"):
        Model.from_scene(scene_from_dict(d))


def test_object_in_a_collider_frame_sits_on_the_tilted_plane():
    from tisim.geometry.transforms import euler_xyz_deg

    for angle in (10.0, 20.0):
        sc = scene_from_dict(
            {
                "objects": {
                    "box": {
                        "generator": "box",
                        "size": [0.2, 0.2, 0.2],
                        "resolution": [2, 2, 2],
                        "frame": "incline",
                        "translation": [0, 0.1, 0],
                    }
                },
                "colliders": {"incline": {"type": "plane", "rotation": [0, 0, angle]}},
            }
        )
        m = Model.from_scene(sc)
        d, n = m.colliders[0].signed_distance(m.initial_positions)
        assert np.allclose(n[0], euler_xyz_deg([0, 0, angle]) @ [0, 1, 0])
        assert d.min() == pytest.approx(0.0, abs=1e-12)  # bottom face on the plane
        assert d.max() == pytest.approx(0.2)
        assert np.sum(np.isclose(d, 0.0, atol=1e-12)) == 9  # the whole bottom layer


def test_frame_must_name_a_collider():
    with pytest.raises(ConfigError, match=r"objects.box.frame"):
        scene_from_dict({"objects": {"box": {"generator": "box", "frame": "nope"}}})
