"""Surface extraction, edges, boundary edges, adjacency on meshes with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.geometry.generate import box, cloth_grid, icosphere
from tisim.geometry.topology import (
    boundary_edges,
    edges,
    euler_characteristic,
    surface_triangles,
    surface_vertices,
    vertex_adjacency,
)

UNIT_TET_X = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])


def _enclosed_volume(x, faces):
    p = x[faces]
    return np.einsum("ij,ij->i", p[:, 0], np.cross(p[:, 1], p[:, 2])).sum() / 6.0


def test_single_tet_has_four_outward_faces():
    tets = np.array([[0, 1, 2, 3]])
    s = surface_triangles(tets)
    assert s.shape == (4, 3)
    assert {tuple(sorted(f)) for f in s} == {(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)}
    p = UNIT_TET_X[s]
    n = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    outward = p.mean(axis=1) - UNIT_TET_X.mean(axis=0)
    assert np.all(np.einsum("ij,ij->i", n, outward) > 0)
    np.testing.assert_array_equal(surface_vertices(tets), [0, 1, 2, 3])
    assert len(edges(tets)) == 6


@pytest.mark.parametrize("tets_per_cell", [5, 6])
def test_box_surface(tets_per_cell):
    nx, ny, nz = 4, 3, 2
    m = box((2.0, 1.5, 1.0), (nx, ny, nz), tets_per_cell=tets_per_cell)
    s = surface_triangles(m.tets)
    assert len(s) == 2 * 2 * (nx * ny + ny * nz + nx * nz)
    assert euler_characteristic(s) == 2
    assert len(boundary_edges(s)) == 0  # closed
    # Outward orientation: the divergence theorem gives the box volume.
    assert _enclosed_volume(m.vertices, s) == pytest.approx(3.0, rel=1e-12)
    sv = surface_vertices(m.tets)
    assert len(sv) == m.vertex_count - (nx - 1) * (ny - 1) * (nz - 1)
    on_box = np.any(np.isclose(np.abs(m.vertices), [1.0, 0.75, 0.5]), axis=1)
    np.testing.assert_array_equal(sv, np.nonzero(on_box)[0])


def test_box_edges_satisfy_euler_for_a_solid():
    # A tet mesh of a ball-like solid: V - E + F - T = 1.
    m = box((1.0, 1.0, 1.0), (3, 2, 2))
    faces = np.unique(np.sort(m.tets[:, [[1, 2, 3], [0, 3, 2], [0, 1, 3], [0, 2, 1]]].reshape(-1, 3), 1), axis=0)
    e = edges(m.tets)
    assert m.vertex_count - len(e) + len(faces) - m.element_count == 1
    assert np.all(e[:, 0] < e[:, 1])


def test_boundary_edges_of_triangles():
    one = np.array([[0, 1, 2]])
    np.testing.assert_array_equal(boundary_edges(one), [[0, 1], [1, 2], [2, 0]])
    two = np.array([[0, 1, 2], [0, 2, 3]])  # share edge 0-2
    b = boundary_edges(two)
    assert {tuple(e) for e in b} == {(0, 1), (1, 2), (2, 3), (3, 0)}
    assert len(boundary_edges(icosphere(2).faces)) == 0


def test_cloth_boundary_is_one_counter_clockwise_loop():
    r0, r1 = 5, 3
    c = cloth_grid((1.0, 1.0), (r0, r1), normal="z")
    b = boundary_edges(c.faces)
    assert len(b) == 2 * (r0 + r1)
    # Each boundary vertex starts exactly one edge and ends exactly one.
    np.testing.assert_array_equal(np.sort(b[:, 0]), np.sort(b[:, 1]))
    assert len(np.unique(b[:, 0])) == len(b)
    # Following the edges visits all of them once (a single loop)...
    nxt = dict(zip(b[:, 0].tolist(), b[:, 1].tolist(), strict=True))
    v, seen = int(b[0, 0]), 0
    while True:
        v, seen = nxt[v], seen + 1
        if v == b[0, 0]:
            break
    assert seen == len(b)
    # ...counter-clockwise seen from +z: positive shoelace area = sheet area.
    x, y = c.vertices[b[:, 0], 0], c.vertices[b[:, 0], 1]
    x1, y1 = c.vertices[b[:, 1], 0], c.vertices[b[:, 1], 1]
    assert 0.5 * np.sum(x * y1 - x1 * y) == pytest.approx(1.0, rel=1e-12)


def test_vertex_adjacency():
    tets = np.array([[0, 1, 2, 3]])
    a = vertex_adjacency(tets)
    assert a.shape == (4, 4)
    np.testing.assert_array_equal(a.toarray(), ~np.eye(4, dtype=bool))
    m = box((1.0, 1.0, 1.0), (2, 2, 2))
    a = vertex_adjacency(m.tets, m.vertex_count + 2)
    assert a.shape == (m.vertex_count + 2,) * 2
    assert (a != a.T).nnz == 0
    assert a.diagonal().sum() == 0
    assert a.nnz == 2 * len(edges(m.tets))
    assert a[m.vertex_count].nnz == 0  # the trailing isolated vertices


def test_euler_characteristic_counts_referenced_vertices_only():
    assert euler_characteristic(np.array([[5, 6, 7]])) == 1
    assert euler_characteristic(icosphere(1).faces) == 2
