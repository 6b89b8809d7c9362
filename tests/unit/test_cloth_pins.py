"""Pin presets of cloth objects (``tisim.model._pin_vertices``) on sheets that are not
axis-aligned rectangles: the side of the sheet facing the axis, not its one extreme
vertex (a cloth hung from one vertex)."""

from __future__ import annotations

import numpy as np

from tisim.geometry.generate import cloth_disc, cloth_rectangle
from tisim.model import _border_vertices, _pin_vertices


def _rot_z(deg):
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _pins(x, mesh, pin):
    return set(_pin_vertices(x, mesh, pin, _border_vertices(x, mesh)).tolist())


def test_top_edge_of_an_upright_square_is_its_top_row_at_any_small_turn():
    m = cloth_rectangle(size=(1.0, 1.0), resolution=(10, 10), normal="z")  # hanging in the x-y plane
    x0 = np.asarray(m.vertices, float)
    top_row = set(np.flatnonzero(np.isclose(x0[:, 1], x0[:, 1].max())).tolist())
    assert len(top_row) == 11
    assert _pins(x0, m, "top-edge") == top_row  # the clean sheet: as before
    for deg in (-20.0, -3.0, 0.5, 3.0, 20.0):  # turned in its plane: the same side
        x = x0 @ _rot_z(deg).T
        assert _pins(x, m, "top-edge") == top_row, deg
    rng = np.random.default_rng(1)
    x = x0 + rng.uniform(-2e-4, 2e-4, x0.shape)  # a scanned sheet's noise
    assert _pins(x, m, "top-edge") == top_row
    left = set(np.flatnonzero(np.isclose(x0[:, 0], x0[:, 0].min())).tolist())
    assert _pins(x0 @ _rot_z(3.0).T, m, "x-min") == left


def test_top_edge_of_a_hanging_disc_is_its_upper_arc():
    m = cloth_disc(radius=0.5, target_edge=0.05, seed=2, normal="z")
    x = np.asarray(m.vertices, float)
    b = _border_vertices(x, m)
    pins = np.array(sorted(_pins(x, m, "top-edge")))
    # the border vertices within 45 degrees of straight up (the quarter of the rim)
    ang = np.degrees(np.arctan2(x[b, 0], x[b, 1]))
    want = set(b[np.abs(ang) < 44.0].tolist())
    assert want <= set(pins.tolist()) and len(pins) <= len(want) + 2, (len(pins), len(want))
    assert len(pins) > 5 and np.all(x[pins, 1] > 0.5 * np.cos(np.radians(47.0)))


def test_a_sheet_lying_flat_still_selects_its_whole_border():
    """The caller refuses that (test_cli: one line naming the key and the way out)."""
    m = cloth_rectangle(size=(0.4, 0.4), resolution=(6, 6), normal="y")
    x = np.asarray(m.vertices, float)
    assert _pins(x, m, "top-edge") == set(_border_vertices(x, m).tolist())
