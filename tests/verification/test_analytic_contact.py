"""Cloth settling on analytic colliders, measured against the shapes themselves: no cloth
vertex ever closer than the contact thickness to the sphere, cylinder or box (distances
from ``Collider.distance``, code the solver does not use), cloth edges and triangles
kept off a box's edges and corners and a cylinder's rims (ipctk over the cloth and the
line sets), and the triangles' interiors kept off a sphere and a cylinder's side (ipctk's
distances to the centre and to the axis). The tessellated colliders this replaces ended 2.0 mm inside a sphere
of radius 3 m and 1.4 mm inside a cylinder of radius 2 m (thickness 1 mm). A sheet too coarse
for the sphere's vertex terms meets its centre (tisim.solvers.cloth.balls): checked alike."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tisim.model import Model
from tisim.scene import scene_from_dict
from tisim.solvers.cloth.solver import SolverCloth
from tisim.testing import ipc_report

XI = 1e-3


def _settle(size, cells, collider, height, steps, dt=0.01):
    """A square sheet (size m, cells x cells) dropped from ``height`` m onto one collider;
    yields (solver, model, state) after every step."""
    obj = {
        "kind": "cloth",
        "generator": "cloth",
        "cloth_size": [size, size],
        "cloth_resolution": [cells, cells],
        "youngs_modulus": 1e5,
        "poisson_ratio": 0.3,
        "thickness": 1e-3,
        "density": 200.0,
        "translation": [0.0, height, 0.0],
    }
    sc = scene_from_dict(
        {
            "solver": {"type": "cloth"},
            "objects": {"c": obj},
            "colliders": {"k": collider},
            "contact": {"thickness": XI, "dhat": 1e-3},
            "sim": {"dt": dt},
        }
    )
    model = Model.from_scene(sc)
    solver = SolverCloth(model, sc.solver)
    assert [c.name for c in solver.analytic_colliders] == ["k"]  # met analytically, not tessellated
    st, spare = model.initial_state(), model.initial_state()
    for _ in range(steps):
        prev = st.clone()
        solver.step(st, spare, dt)
        st, spare = spare, st
        assert st.is_finite()
        yield solver, model, prev, st


def _triangle_gap(c, tri):
    """Smallest distance (m) of the triangles tri (m, 3, 3) to a sphere or to the side of
    a cylinder (its distance from the axis, less the radius), from ipctk's point-triangle
    and edge-edge distances (an independent computation)."""
    import ipctk

    centre = c.center(0.0)
    if c.kind == "sphere":
        return min(math.sqrt(ipctk.point_triangle_distance(centre, *t)) for t in tri) - c.radius
    a = c.orientation(0.0) @ c.axis
    e0, e1 = centre - 100.0 * a, centre + 100.0 * a  # the axis, far beyond the sheet
    best = math.inf
    for t in tri:
        for i in range(3):
            best = min(best, ipctk.edge_edge_distance(e0, e1, t[i], t[(i + 1) % 3]))
    return math.sqrt(best) - c.radius


CASES = {
    # (sheet size, cells, collider, drop height, steps)
    "sphere-r3-sheet-1m": (1.0, 12, {"type": "sphere", "position": [0, -3, 0], "radius": 3.0}, 0.004, 30),
    # a coarse sheet on a small ball (8 cm cells on a 6 cm ball: met by its centre)
    "ball-r0.06-sheet-0.32m": (0.32, 4, {"type": "sphere", "position": [0, -0.06, 0], "radius": 0.06}, 0.004, 30),
    "cylinder-r2-sheet-1m": (
        1.0,
        12,
        {"type": "cylinder", "position": [0, -2, 0], "radius": 2.0, "axis": [1, 0, 0]},
        0.004,
        30,
    ),
}
SLOW_CASES = {
    "sphere-r0.05-sheet-0.1m": (0.1, 10, {"type": "sphere", "position": [0, -0.05, 0], "radius": 0.05}, 0.003, 40),
    "sphere-r3-sheet-3m": (3.0, 24, {"type": "sphere", "position": [0, -3, 0], "radius": 3.0}, 0.006, 40),
    "capped-cylinder-rims-sheet-3m": (
        3.0,
        26,
        {"type": "cylinder", "position": [0, -2, 0], "radius": 2.0, "axis": [0, 0, 1], "length": 1.0},
        0.006,
        30,
    ),
    # a corner straight up (the diagonal (1, 1, 1) turned onto +y), under a triangle's interior
    "box-corner-sheet-0.3m": (
        0.3,
        12,
        {
            "type": "box",
            "position": [0.02, -0.1 * math.sqrt(3), 0.01],
            "half_extents": [0.1] * 3,
            "rotation": [-45.0, 0.0, 35.2643897],
        },
        0.004,
        40,
    ),
    # a ridge: the box's edge along x on top, between two rows of cloth vertices
    "box-edge-sheet-1m": (
        1.0,
        12,
        {
            "type": "box",
            "position": [0.0, -0.2 * math.sqrt(2), 0.03],
            "half_extents": [0.6, 0.2, 0.2],
            "rotation": [45.0, 0.0, 0.0],
        },
        0.004,
        40,
    ),
}


def _check_case(size, cells, collider, height, steps):
    touched = False
    for solver, model, prev, st in _settle(size, cells, collider, height, steps):
        c = solver.analytic_colliders[0]
        xc = st.positions[model.cloth.vertex_slice]
        d = c.distance(xc)
        assert d.min() > 0.99 * XI, d.min()
        # (a curved shape is met a sag allowance farther out, so that the triangles clear it;
        # a sphere met by its centre needs none)
        curved = c.kind in ("sphere", "cylinder") and c in solver.obstacles.analytic
        allowance = solver.planes.shapes[0].r - c.radius if curved else 0.0
        touched |= d.min() < XI + allowance + 2e-3
        if c.kind == "box":
            # cloth vertices, edges and faces against the box's own 12 triangles (ipctk)
            Vb, Fb = c.surface_mesh(0.0)
            nc = len(xc)
            F = np.concatenate([model.cloth.faces, Fb + nc])
            V = np.concatenate([xc, Vb])
            P = np.concatenate([prev.positions[model.cloth.vertex_slice], Vb])
            r = ipc_report(V, F, P, probe=0.01)
            assert not r.intersecting and r.step_free
            assert r.min_distance > 0.99 * XI, r.min_distance
        if c.kind == "cylinder" and math.isfinite(c.length):
            # cloth edges and faces against the rims (the solver's line sets, ipctk)
            V, F, _ = solver.collision_state(st)
            P, _, _ = solver.collision_state(prev)
            assert len(solver.obstacles.line_edges)
            r = ipc_report(V, F, P, edges=solver.edges_all, probe=0.01)
            assert not r.intersecting and r.step_free
            assert r.min_distance > 0.99 * XI, r.min_distance
        if c.kind == "sphere" or (c.kind == "cylinder" and not math.isfinite(c.length)):
            # the triangles' interiors, not only their vertices
            gap = _triangle_gap(c, xc[model.cloth.faces])
            assert gap > 0.99 * XI, gap
    assert touched  # the sheet did reach the shape


@pytest.mark.parametrize("case", list(CASES))
def test_sheet_settles_outside_the_analytic_shape(case):
    _check_case(*CASES[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SLOW_CASES))
def test_sheet_settles_outside_the_analytic_shape_sizes(case):
    _check_case(*SLOW_CASES[case])


def test_coarse_cloth_meets_a_spheres_centre_and_a_moving_one_the_tessellation():
    """A sphere is analytic for a cloth fine against its curvature (sag allowance within
    thickness + dhat); a coarse cloth (7.5 cm cells on a ball of radius 6 cm would float
    2 cm above it) meets its centre, one obstacle vertex (tisim.solvers.cloth.balls),
    and a moving sphere the tessellated shape."""

    def analytic(cells, velocity=(0.0, 0.0, 0.0)):
        obj = {
            "kind": "cloth",
            "generator": "cloth",
            "cloth_size": [0.3, 0.3],
            "cloth_resolution": [cells, cells],
            "translation": [0.0, 0.2, 0.0],
        }
        sc = scene_from_dict(
            {
                "solver": {"type": "cloth"},
                "objects": {"c": obj},
                "colliders": {"ball": {"type": "sphere", "radius": 0.06, "velocity": list(velocity)}},
                "sim": {"dt": 0.01},
            }
        )
        s = SolverCloth(Model.from_scene(sc), sc.solver)
        return [c.name for c in s.analytic_colliders], s.no

    assert analytic(30) == (["ball"], 0)
    names, obstacle_vertices = analytic(4)
    assert names == ["ball"] and obstacle_vertices == 1
    assert analytic(30, (0.0, 0.1, 0.0))[0] == []
