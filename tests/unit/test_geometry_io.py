"""Mesh file I/O: round trips, validation errors, repairs, surface tetrahedralization."""

from __future__ import annotations

import logging
from pathlib import Path

import meshio
import numpy as np
import pytest

from tisim.geometry.generate import box, cloth_grid, icosphere
from tisim.geometry.io import (
    load_tet_mesh,
    load_tri_mesh,
    save_mesh,
    supported_extensions,
    validate_tets,
)
from tisim.geometry.mesh import MeshError, TriMesh
from tisim.geometry.topology import surface_triangles

ASSETS = Path(__file__).resolve().parents[2] / "assets"

UNIT_TET = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])


def _closed_volume(vertices: np.ndarray, faces: np.ndarray) -> float:
    """Volume enclosed by an outward-oriented closed triangle surface (divergence theorem)."""
    p = vertices[faces]
    return float(np.einsum("ij,ij->i", p[:, 0], np.cross(p[:, 1], p[:, 2])).sum() / 6.0)


def _write(path: Path, points, cells: list[tuple[str, np.ndarray]]) -> Path:
    meshio.write(path, meshio.Mesh(np.asarray(points, float), cells))
    return path


def _expect_error(fn, path: Path, *words: str) -> MeshError:
    with pytest.raises(MeshError) as info:
        fn(path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    for w in words:
        assert w.lower() in msg.lower(), msg
    return info.value


# ---------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("ext", [".msh", ".vtu", ".vtk", ".mesh", ".node"])
def test_tet_round_trip_preserves_vertices_and_tets(tmp_path, ext):
    m = box((1.0, 0.5, 0.25), (3, 2, 2), center=(0.1, -0.2, 0.3))
    path = tmp_path / f"bar{ext}"
    save_mesh(path, m.vertices, m.tets)
    back = load_tet_mesh(path)
    np.testing.assert_allclose(back.vertices, m.vertices, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(back.tets, m.tets)
    assert back.source == str(path)


def test_tetgen_ele_file_is_read_with_its_node_file(tmp_path):
    m = box((1.0, 1.0, 1.0), (2, 2, 2))
    save_mesh(tmp_path / "cube.node", m.vertices, m.tets)
    assert (tmp_path / "cube.ele").exists()
    back = load_tet_mesh(tmp_path / "cube.ele")
    np.testing.assert_array_equal(back.tets, m.tets)


@pytest.mark.parametrize("ext", [".obj", ".ply", ".off", ".vtu", ".vtk", ".msh"])
def test_triangle_round_trip_preserves_vertices_and_faces(tmp_path, ext):
    c = cloth_grid((1.0, 0.5), (4, 3), center=(0.0, 1.0, 0.0))
    path = tmp_path / f"sheet{ext}"
    save_mesh(path, c.vertices, c.faces)
    back = load_tri_mesh(path)
    np.testing.assert_allclose(back.vertices, c.vertices, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(back.faces, c.faces)


def test_stl_round_trip_preserves_the_triangles_geometrically(tmp_path):
    # STL stores a triangle soup: indices are rebuilt on reading, geometry is kept.
    c = cloth_grid((1.0, 0.5), (4, 3))
    path = tmp_path / "sheet.stl"
    save_mesh(path, c.vertices, c.faces)
    back = load_tri_mesh(path)
    assert back.element_count == c.element_count
    assert back.vertex_count == c.vertex_count

    def tri_set(m):
        p = np.round(m.vertices[m.faces], 6)  # STL stores float32
        return {tuple(sorted(map(tuple, t))) for t in p}

    assert tri_set(back) == tri_set(c)


def test_tets_saved_to_a_surface_format_become_their_boundary(tmp_path):
    nx, ny, nz = 3, 2, 2
    m = box((1.0, 1.0, 1.0), (nx, ny, nz))
    path = tmp_path / "surface.ply"
    save_mesh(path, m.vertices, m.tets)
    s = load_tri_mesh(path)
    assert s.element_count == 4 * (nx * ny + ny * nz + nx * nz)
    assert s.vertex_count == m.vertex_count - (nx - 1) * (ny - 1) * (nz - 1)
    assert _closed_volume(s.vertices, s.faces) == pytest.approx(1.0, rel=1e-12)


def test_save_mesh_leaves_out_unused_vertices_unless_asked(tmp_path):
    # A soft body's surface written with all its positions, as the runner does.
    m = box((1.0, 1.0, 1.0), (2, 2, 2))
    s = surface_triangles(m.tets)
    save_mesh(tmp_path / "a.ply", m.vertices, s)
    a = load_tri_mesh(tmp_path / "a.ply")
    assert a.vertex_count == m.vertex_count - 1  # the centre vertex is interior
    np.testing.assert_allclose(a.vertices[a.faces], m.vertices[s])
    save_mesh(tmp_path / "b.vtu", m.vertices, s, keep_unused_vertices=True)
    assert len(meshio.read(tmp_path / "b.vtu").points) == m.vertex_count


def test_save_mesh_errors_name_the_file(tmp_path):
    m = box()
    _expect_error(lambda p: save_mesh(p, m.vertices, m.tets), tmp_path / "nope" / "a.vtu", "folder")
    _expect_error(lambda p: save_mesh(p, m.vertices, m.tets), tmp_path / "a.xyz", "unknown", ".vtu")
    _expect_error(lambda p: save_mesh(p, m.vertices, m.tets[:, :2]), tmp_path / "a.vtu", "cells")
    _expect_error(lambda p: save_mesh(p, m.vertices[:5], m.tets), tmp_path / "a.vtu", "outside")


# ---------------------------------------------------------------------------
# Validation errors


def test_missing_file(tmp_path):
    _expect_error(load_tet_mesh, tmp_path / "missing.msh", "not found")
    _expect_error(load_tri_mesh, tmp_path / "missing.obj", "not found")


def test_unknown_extension_lists_supported_ones(tmp_path):
    path = tmp_path / "mesh.xyz"
    path.write_text("1 2 3\n")
    err = _expect_error(load_tet_mesh, path, "unknown", ".xyz")
    for ext in (".msh", ".vtu", ".vtk", ".obj", ".ele"):
        assert ext in str(err)
        assert ext in supported_extensions()


@pytest.mark.parametrize(
    "name, contents",
    [
        ("garbage.msh", "this is not gmsh\n1 2 3\n"),
        ("garbage.vtu", "<VTKFile><UnstructuredGrid"),
        ("garbage.vtk", "# vtk DataFile Version 4.2\nnonsense\n"),
        ("garbage.ply", "ply\nformat ascii 1.0\nelement vertex 3\nend_header\n1 2\n"),
    ],
)
def test_corrupt_contents(tmp_path, name, contents):
    path = tmp_path / name
    path.write_text(contents)
    _expect_error(load_tet_mesh, path, "cannot read")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.vtu"
    path.write_text("")
    _expect_error(load_tet_mesh, path, "empty")


def test_file_without_cells_of_the_needed_kind(tmp_path):
    lines = _write(tmp_path / "lines.vtu", UNIT_TET, [("line", np.array([[0, 1], [2, 3]]))])
    _expect_error(load_tet_mesh, lines, "no tetrahedra", "line")
    tets = _write(tmp_path / "tet.vtu", UNIT_TET, [("tetra", np.array([[0, 1, 2, 3]]))])
    _expect_error(load_tri_mesh, tets, "no triangles", "tetra")


def test_nan_and_inf_coordinates(tmp_path):
    pts = UNIT_TET.copy()
    pts[2, 1] = np.nan
    path = _write(tmp_path / "nan.vtu", pts, [("tetra", np.array([[0, 1, 2, 3]]))])
    _expect_error(load_tet_mesh, path, "NaN", "vertex 2")
    pts[2, 1] = np.inf
    path = _write(tmp_path / "inf.vtk", pts, [("triangle", np.array([[0, 1, 2]]))])
    _expect_error(load_tri_mesh, path, "infinite", "vertex 2")


def test_index_out_of_range(tmp_path):
    path = tmp_path / "bad.obj"
    path.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 7\n")
    _expect_error(load_tri_mesh, path, "triangle 0", "outside")


def test_degenerate_tet(tmp_path):
    pts = np.vstack([UNIT_TET, [[0.5, 0.5, 0.0]]])  # vertex 4 in the plane z = 0
    tets = np.array([[0, 1, 2, 3], [0, 1, 2, 4]])
    path = _write(tmp_path / "flat.vtu", pts, [("tetra", tets)])
    _expect_error(load_tet_mesh, path, "degenerate", "tet 1")
    # The tolerance is relative: the same shapes scaled to a micrometre are fine
    # when not flat and still degenerate when flat.
    ok = _write(tmp_path / "tiny.vtu", UNIT_TET * 1e-6, [("tetra", tets[:1])])
    assert load_tet_mesh(ok).signed_volumes()[0] == pytest.approx(1e-18 / 6, rel=1e-12)
    tiny_flat = _write(tmp_path / "tiny_flat.vtu", pts * 1e-6, [("tetra", tets)])
    _expect_error(load_tet_mesh, tiny_flat, "degenerate")


def test_degenerate_triangle(tmp_path):
    pts = np.array([[0.0, 0, 0], [1, 0, 0], [2, 0, 0], [0, 1, 0]])
    path = _write(tmp_path / "line.obj", pts, [("triangle", np.array([[0, 1, 3], [0, 1, 2]]))])
    _expect_error(load_tri_mesh, path, "degenerate", "triangle 1")


def test_unreferenced_vertices_are_dropped_with_a_warning(tmp_path, caplog):
    # Vertices 0 and 5 are unused; the tet uses 1..4.
    pts = np.vstack([[[9.0, 9, 9]], UNIT_TET, [[7.0, 7, 7]]])
    path = _write(tmp_path / "extra.vtu", pts, [("tetra", np.array([[1, 2, 3, 4]]))])
    with caplog.at_level(logging.WARNING, logger="tisim.geometry.io"):
        m = load_tet_mesh(path)
    assert m.vertex_count == 4
    np.testing.assert_array_equal(m.vertices, UNIT_TET)
    np.testing.assert_array_equal(m.tets, [[0, 1, 2, 3]])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("dropped 2 unreferenced vertices" in w and str(path) in w for w in warnings)


def test_inverted_tets_are_reoriented_with_a_warning(tmp_path, caplog):
    m = box((1.0, 1.0, 1.0), (2, 2, 2))
    tets = m.tets.copy()
    flip = np.arange(0, len(tets), 3)  # every third tet inverted
    tets[flip] = tets[flip][:, [1, 0, 2, 3]]
    path = _write(tmp_path / "inverted.msh", m.vertices, [("tetra", tets)])
    with caplog.at_level(logging.WARNING, logger="tisim.geometry.io"):
        back = load_tet_mesh(path)
    assert np.all(back.signed_volumes() > 0)
    assert back.signed_volumes().sum() == pytest.approx(1.0, rel=1e-12)
    # Same tets as sets of vertices, only the order changed.
    np.testing.assert_array_equal(np.sort(back.tets, axis=1), np.sort(m.tets, axis=1))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"re-oriented {len(flip)} inverted tets" in w and str(path) in w for w in warnings)


def test_validate_tets_without_a_file():
    with pytest.raises(MeshError, match="no tetrahedra"):
        validate_tets(UNIT_TET, np.zeros((0, 4), int))
    m = validate_tets(UNIT_TET, [[1, 0, 2, 3]])
    assert m.signed_volumes()[0] == pytest.approx(1 / 6)


def test_quadratic_tets_keep_their_corners(tmp_path):
    mids = [(UNIT_TET[a] + UNIT_TET[b]) / 2 for a, b in [(0, 1), (1, 2), (0, 2), (0, 3), (1, 3), (2, 3)]]
    pts = np.vstack([UNIT_TET, mids])
    path = _write(tmp_path / "p2.vtu", pts, [("tetra10", np.arange(10)[None])])
    m = load_tet_mesh(path)
    # The six edge midpoints are unreferenced once only corners are kept.
    assert m.vertex_count == 4 and m.element_count == 1


# ---------------------------------------------------------------------------
# Surfaces where a solid is needed


def test_surface_file_is_tetrahedralized(tmp_path, caplog):
    s = icosphere(3)
    path = tmp_path / "sphere.obj"
    save_mesh(path, s.vertices, s.faces)
    with caplog.at_level(logging.INFO, logger="tisim.geometry.io"):
        m = load_tet_mesh(path)
    assert any("tetrahedraliz" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    vol = m.signed_volumes()
    assert np.all(vol > 0)
    assert m.source == str(path)
    # TetGen fills exactly the polyhedron (Steiner points on the surface lie in
    # its facets), so the volume equals the surface's to rounding...
    inscribed = _closed_volume(s.vertices, s.faces)
    assert vol.sum() == pytest.approx(inscribed, rel=1e-10)
    # ...which is within the chordal gap of the sphere: the deepest facet of an
    # icosphere(3) is < 1% of the radius below the sphere, so < 3% of volume.
    assert inscribed == pytest.approx(4 / 3 * np.pi, rel=0.03)
    # Every boundary vertex lies on the unit sphere's polyhedron, not inside it.
    bv = np.unique(surface_triangles(m.tets))
    assert np.linalg.norm(m.vertices[bv], axis=1).min() > 0.98


def test_open_surface_cannot_be_filled(tmp_path):
    s = icosphere(1)
    path = tmp_path / "open.obj"
    save_mesh(path, s.vertices, s.faces[:-1])
    _expect_error(load_tet_mesh, path, "not closed", "3 boundary edges")


def test_self_intersecting_surface_is_an_error_not_a_crash(tmp_path):
    # TetGen aborts the process on this input; it runs in a child process.
    s = icosphere(2)
    v = np.concatenate([s.vertices, s.vertices + [0.5, 0.0, 0.0]])
    f = np.concatenate([s.faces, s.faces + s.vertex_count])
    path = tmp_path / "two_spheres.obj"
    save_mesh(path, v, f)
    _expect_error(load_tet_mesh, path, "TetGen")


def test_tetrahedralize_rejects_non_manifold_surfaces():
    from tisim.geometry.tetrahedralize import tetrahedralize

    s = icosphere(1)
    f = np.concatenate([s.faces, s.faces[:1]])  # one triangle twice: 3 edges used 3 times
    with pytest.raises(MeshError, match="not manifold"):
        tetrahedralize(TriMesh(s.vertices, f, source="dup.obj"))


def test_max_volume_bounds_tet_size():
    from tisim.geometry.tetrahedralize import tetrahedralize

    s = icosphere(2)
    coarse = tetrahedralize(s, isolated=False)
    fine = tetrahedralize(s, max_volume=1e-3, isolated=False)
    # TetGen's bound is enforced during refinement; its last smoothing pass may
    # grow a few tets slightly (documented as up to ~1.3x).
    assert fine.signed_volumes().mean() <= 1e-3
    assert fine.signed_volumes().max() <= 1.5e-3
    assert coarse.signed_volumes().max() > 5e-3  # the bound did something
    assert fine.element_count > coarse.element_count
    assert fine.signed_volumes().sum() == pytest.approx(coarse.signed_volumes().sum(), rel=1e-10)


def test_shipped_assets_load():
    ball = load_tet_mesh(ASSETS / "ball_coarse.msh")
    same = load_tet_mesh(ASSETS / "ball_coarse.vtu")
    np.testing.assert_allclose(ball.vertices, same.vertices, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(ball.tets, same.tets)
    assert np.all(ball.signed_volumes() > 0)
    surface = load_tri_mesh(ASSETS / "bunny_like.obj")
    solid = load_tet_mesh(ASSETS / "bunny_like.obj")
    assert np.all(solid.signed_volumes() > 0)
    assert solid.signed_volumes().sum() == pytest.approx(_closed_volume(surface.vertices, surface.faces), rel=1e-9)
    for name in ("bunny_like.obj", "ball_coarse.msh", "ball_coarse.vtu"):
        assert (ASSETS / name).stat().st_size < 500_000
