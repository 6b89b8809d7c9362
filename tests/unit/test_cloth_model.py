"""Cloth objects in scenes and models: schema, masses, pins, errors."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.config import ConfigError
from tisim.model import Model
from tisim.scene import scene_from_dict


def _scene(**obj):
    o = {
        "kind": "cloth",
        "generator": "cloth",
        "cloth_size": [1.0, 0.5],
        "cloth_resolution": [4, 2],
        "density": 300.0,
        "thickness": 2e-3,
    }
    o.update(obj)
    return scene_from_dict({"solver": {"type": "cloth"}, "objects": {"c": o}})


def test_cloth_mass_is_areal_density_times_area():
    m = Model.from_scene(_scene())
    assert m.cloth is not None and m.element_count == 0
    # 0.5 m^2 at 300 kg/m^3 x 2 mm = 0.6 kg/m^2
    assert m.mass.sum() == pytest.approx(0.5 * 0.6, rel=1e-12)
    assert np.all(m.mass > 0)
    # an interior vertex of a regular grid carries the mass of 6 / 3 = 2 triangles of its cell size
    assert m.cloth.faces.shape == (16, 3) and m.cloth.hinges.shape[1] == 4


def test_plane_stress_parameters_and_bending():
    sc = _scene(youngs_modulus=2e5, poisson_ratio=0.25)
    oc = sc.objects["c"]
    mu, lam = oc.lame_plane_stress
    assert mu == pytest.approx(2e5 / 2.5) and lam == pytest.approx(2e5 * 0.25 / (1 - 0.0625))
    assert oc.plate_bending_stiffness == pytest.approx(2e5 * 8e-9 / (24 * (1 - 0.0625)))
    assert _scene(bending_stiffness=1e-3).objects["c"].plate_bending_stiffness == 1e-3


@pytest.mark.parametrize("pin,count", [("corners", 4), ("x-min", 3), ("x-max", 3), ("z-min", 5)])
def test_pin_presets(pin, count):
    m = Model.from_scene(_scene(pin=pin))
    (h,) = m.handles
    assert len(h.vertices) == count
    x = m.initial_positions[h.vertices]
    if pin == "x-min":
        assert np.allclose(x[:, 0], -0.5)
    if pin == "corners":
        assert set(map(tuple, np.round(np.abs(x[:, [0, 2]]), 9))) == {(0.5, 0.25)}
    assert np.allclose(h.targets(3.0), x)  # pinned: no motion


def test_cloth_errors():
    with pytest.raises(ConfigError, match="generator = 'cloth' needs kind = 'cloth'"):
        scene_from_dict({"objects": {"c": {"generator": "cloth"}}})
    with pytest.raises(ConfigError, match="cloth object takes generator"):
        scene_from_dict({"objects": {"c": {"kind": "cloth", "generator": "box"}}})
    with pytest.raises(ConfigError, match="cloth_resolution"):
        _scene(cloth_resolution=[0, 3])


def test_cloth_needs_the_cloth_solver():
    from tisim.runner import build

    sc = scene_from_dict({"solver": {"type": "pd"}, "objects": {"c": {"kind": "cloth", "generator": "cloth"}}})
    with pytest.raises(ConfigError, match=r"solver.type = 'cloth'"):
        build(sc, "cpu", "f64")


def test_solids_come_first_and_keep_their_indices():
    sc = scene_from_dict(
        {
            "solver": {"type": "cloth"},
            "objects": {
                "sheet": {"kind": "cloth", "generator": "cloth", "cloth_resolution": [2, 2]},
                "box": {"generator": "box", "resolution": [1, 1, 1]},
            },
        }
    )
    m = Model.from_scene(sc)
    assert m.object_names == ("box", "sheet")
    assert m.solid_vertex_count == 8 and m.cloth.offset == 8 and m.cloth.vertex_count == 9
    # the model surface ends with the cloth faces, shifted past the solid's vertices
    assert np.array_equal(m.surface[-len(m.cloth.faces) :], m.cloth.faces + 8)
