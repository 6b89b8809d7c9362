"""Procedural meshes: sizes, orientation, conformity, volume, quality."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.geometry.generate import (
    ball,
    ball_resolution_for_vertices,
    box,
    cloth_grid,
    geodesic_sphere,
    icosphere,
)
from tisim.geometry.mesh import MeshError, TetMesh
from tisim.geometry.topology import (
    boundary_edges,
    edges,
    euler_characteristic,
    surface_triangles,
)

# Faces of tet (0,1,2,3), outward for a positive tet.
TET_FACES = np.array([[1, 2, 3], [0, 3, 2], [0, 1, 3], [0, 2, 1]])


def face_counts(tets: np.ndarray) -> np.ndarray:
    """How many tets use each distinct triangle."""
    key = np.sort(tets[:, TET_FACES].reshape(-1, 3), axis=1)
    _, counts = np.unique(key, axis=0, return_counts=True)
    return counts


def dihedral_angles(x: np.ndarray, tets: np.ndarray) -> np.ndarray:
    """(m, 6) interior dihedral angles in degrees."""
    p = x[tets]
    normals = []
    for f in TET_FACES:
        n = np.cross(p[:, f[1]] - p[:, f[0]], p[:, f[2]] - p[:, f[0]])
        normals.append(n / np.linalg.norm(n, axis=1, keepdims=True))
    angles = [
        180.0 - np.degrees(np.arccos(np.clip(np.sum(normals[i] * normals[j], axis=1), -1, 1)))
        for i in range(4)
        for j in range(i + 1, 4)
    ]
    return np.stack(angles, axis=1)


def assert_valid_solid(m: TetMesh) -> None:
    """Positive tets, conforming (no face in more than two tets), closed genus-0 boundary."""
    assert np.all(m.signed_volumes() > 0)
    assert face_counts(m.tets).max() == 2
    s = surface_triangles(m.tets)
    assert len(boundary_edges(s)) == 0
    assert euler_characteristic(s) == 2
    # Every vertex is used.
    assert len(np.unique(m.tets)) == m.vertex_count


# ---------------------------------------------------------------------------
# box


@pytest.mark.parametrize("tets_per_cell", [5, 6])
def test_box_counts_conformity_and_volume(tets_per_cell):
    size, res = np.array([1.0, 0.4, 0.3]), (5, 3, 2)
    nx, ny, nz = res
    m = box(size, res, center=(1.0, 2.0, 3.0), tets_per_cell=tets_per_cell)
    assert m.vertex_count == (nx + 1) * (ny + 1) * (nz + 1)
    assert m.element_count == tets_per_cell * nx * ny * nz
    assert_valid_solid(m)
    counts = face_counts(m.tets)
    boundary = 2 * 2 * (nx * ny + ny * nz + nx * nz)  # two triangles per boundary square
    assert np.sum(counts == 1) == boundary
    # Every face is either on the boundary or shared by exactly two tets.
    assert set(np.unique(counts)) == {1, 2}
    assert m.signed_volumes().sum() == pytest.approx(np.prod(size), rel=1e-12)
    np.testing.assert_allclose(m.vertices.mean(axis=0), [1.0, 2.0, 3.0], atol=1e-12)


def test_box_reference_bar_size():
    m = box((1.0, 0.2, 0.2), (65, 8, 8))
    assert (m.vertex_count, m.element_count) == (5346, 20800)


def test_box_rejects_bad_arguments():
    with pytest.raises(MeshError, match="tets_per_cell"):
        box(tets_per_cell=4)
    with pytest.raises(MeshError, match="size"):
        box(size=(1, 0, 1))
    with pytest.raises(MeshError, match="resolution"):
        box(resolution=(1, 0, 1))


# ---------------------------------------------------------------------------
# ball


@pytest.mark.parametrize("resolution", [2, 3.3, 6, 8, 12.5])
def test_ball_is_valid_with_surface_on_the_sphere(resolution):
    r, c = 0.7, np.array([0.1, -0.2, 0.3])
    m = ball(r, resolution, c)
    assert_valid_solid(m)
    s = surface_triangles(m.tets)
    sv = np.unique(s)
    np.testing.assert_allclose(np.linalg.norm(m.vertices[sv] - c, axis=1), r, rtol=1e-12)
    # Interior vertices are strictly inside.
    inner = np.setdiff1d(np.arange(m.vertex_count), sv)
    assert np.all(np.linalg.norm(m.vertices[inner] - c, axis=1) < r)


@pytest.mark.parametrize("resolution", [4, 8, 16])
def test_ball_volume_within_chordal_gap(resolution):
    """The mesh is the convex polyhedron inscribed in the sphere through its
    boundary vertices. Its volume is sum_t area_t d_t / 3 over boundary triangles
    (d_t: distance from the centre to the triangle's plane), and the missing
    volume, made of caps over the triangles, is at most the sphere's area times
    the deepest cap, 4 pi r^2 max_t (r - d_t)."""
    r = 0.5
    m = ball(r, resolution)
    vol = m.signed_volumes().sum()
    s = surface_triangles(m.tets)
    p = m.vertices[s]
    n = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    area = 0.5 * np.linalg.norm(n, axis=1)
    d = np.einsum("ij,ij->i", p[:, 0], n) / (2 * area)  # signed distance of the plane
    assert np.all(d > 0)  # outward faces of a convex body around the centre
    assert vol == pytest.approx(np.sum(area * d) / 3, rel=1e-12)
    exact = 4 / 3 * np.pi * r**3
    gap = 4 * np.pi * r**2 * np.max(r - d)
    assert 0 < exact - vol <= gap


def test_ball_volume_converges_at_second_order():
    # A facet of diameter ~h (lattice spacing 2r/resolution) sits ~h^2/(8r)
    # below the sphere, so the missing volume is O(h^2): doubling the
    # resolution divides it by about 4 (measured 3.7, 4.0, 4.1 for 4->8->16->32).
    exact = 4 / 3 * np.pi * 0.5**3
    deficit = [exact - ball(0.5, res).signed_volumes().sum() for res in (4, 8, 16)]
    ratios = np.array(deficit[:-1]) / np.array(deficit[1:])
    assert np.all((ratios > 3.0) & (ratios < 5.0)), ratios


def test_ball_quality():
    for resolution in (2, 5, 9.5, 14):
        m = ball(1.0, resolution)
        a = dihedral_angles(m.vertices, m.tets)
        assert a.min() > 15.0, resolution
        assert a.max() < 150.0, resolution


def test_ball_is_deterministic_and_documented_sizes_hold():
    a, b = ball(0.5, 8), ball(0.5, 8)
    np.testing.assert_array_equal(a.vertices, b.vertices)
    np.testing.assert_array_equal(a.tets, b.tets)
    assert (a.vertex_count, a.element_count) == (821, 3480)
    assert ball(0.5, 4).vertex_count == 161
    assert ball(0.5).vertex_count == 821  # default resolution 8
    # Scaling the radius scales the mesh, nothing else.
    np.testing.assert_allclose(ball(2.0, 8).vertices, 4 * a.vertices, rtol=1e-12, atol=1e-12)


def test_ball_resolution_for_vertices_hits_the_target():
    target = 7000  # the headline demo's size
    res = ball_resolution_for_vertices(target)
    n = ball(0.3, res).vertex_count
    assert abs(n - target) / target < 0.02


def test_ball_rejects_bad_arguments():
    with pytest.raises(MeshError, match="radius"):
        ball(radius=0.0)
    with pytest.raises(MeshError, match="resolution"):
        ball(resolution=0.5)
    with pytest.raises(MeshError, match="15"):
        ball_resolution_for_vertices(3)


# ---------------------------------------------------------------------------
# sphere surfaces


@pytest.mark.parametrize("subdivisions", [0, 1, 2, 3])
def test_icosphere(subdivisions):
    s = icosphere(subdivisions)
    assert s.vertex_count == 10 * 4**subdivisions + 2
    assert s.element_count == 20 * 4**subdivisions
    np.testing.assert_allclose(np.linalg.norm(s.vertices, axis=1), 1.0, rtol=1e-14)
    p = s.vertices[s.faces]
    n = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    assert np.all(np.einsum("ij,ij->i", n, p.mean(axis=1)) > 0)  # outward
    assert len(boundary_edges(s.faces)) == 0
    assert euler_characteristic(s.faces) == 2
    # No duplicate vertices along the icosahedron's edges.
    assert len(np.unique(np.round(s.vertices, 12), axis=0)) == s.vertex_count


def test_geodesic_sphere_any_frequency():
    s = geodesic_sphere(5)
    assert (s.vertex_count, s.element_count) == (252, 500)
    assert euler_characteristic(s.faces) == 2
    with pytest.raises(MeshError):
        geodesic_sphere(0)


# ---------------------------------------------------------------------------
# cloth


@pytest.mark.parametrize("normal, axis", [("x", 0), ("y", 1), ("z", 2), (2, 2)])
def test_cloth_grid(normal, axis):
    size, res = (2.0, 0.5), (6, 3)
    c = cloth_grid(size, res, center=(0.3, 1.0, -0.2), normal=normal)
    assert c.vertex_count == 7 * 4
    assert c.element_count == 2 * 6 * 3
    np.testing.assert_allclose(c.vertices[:, axis], [0.3, 1.0, -0.2][axis])
    # In-plane axes in x, y, z order carry the two sizes.
    u, v = [a for a in range(3) if a != axis]
    np.testing.assert_allclose(np.ptp(c.vertices[:, [u, v]], axis=0), size)
    p = c.vertices[c.faces]
    n = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    # Every face points along +axis and the areas add up.
    np.testing.assert_allclose(n[:, axis], np.linalg.norm(n, axis=1), rtol=1e-12)
    assert c.areas().sum() == pytest.approx(size[0] * size[1], rel=1e-12)
    assert euler_characteristic(c.faces) == 1
    assert len(boundary_edges(c.faces)) == 2 * (6 + 3)


def test_cloth_grid_diagonals_alternate():
    c = cloth_grid((1.0, 1.0), (2, 2))
    # 3 x 3 vertices numbered with the second axis fastest (v = 3 i + j), so the
    # centre is vertex 4. Alternating diagonals all meet there ("union jack");
    # equal diagonals would give 0-4, 4-8, 1-3, 5-7 instead.
    e = edges(c.faces)
    d = c.vertices[e[:, 1]] - c.vertices[e[:, 0]]
    diagonal = np.count_nonzero(np.abs(d) > 1e-12, axis=1) == 2
    assert {tuple(int(i) for i in pair) for pair in e[diagonal]} == {(0, 4), (4, 8), (2, 4), (4, 6)}


def test_cloth_grid_rejects_bad_arguments():
    with pytest.raises(MeshError, match="normal"):
        cloth_grid(normal="w")
    with pytest.raises(MeshError, match="resolution"):
        cloth_grid(resolution=(0, 3))
