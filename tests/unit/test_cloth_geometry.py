"""Cloth geometry: OBJ/meshio loading with UVs, validation errors and repairs,
hinges and edges, generators, OBJ export, edge-triangle intersections."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import meshio
import numpy as np
import pytest

from tisim.geometry.cloth import (
    ClothMesh,
    check_intersection_free,
    find_intersections,
    load_cloth_mesh,
    save_cloth_obj,
    validate_cloth,
)
from tisim.geometry.generate import cloth_disc, cloth_rectangle, icosphere
from tisim.geometry.io import save_mesh
from tisim.geometry.mesh import MeshError
from tisim.geometry.topology import consistent_orientation, edges, nonmanifold_vertices


def _obj(tmp_path: Path, text: str, name: str = "cloth.obj") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _expect_error(path: Path, *words: str) -> str:
    with pytest.raises(MeshError) as info:
        load_cloth_mesh(path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for w in words:
        assert w.lower() in msg.lower(), msg
    return msg


def _normals(x, faces):
    p = x[faces]
    return np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])


def _rotated(faces) -> np.ndarray:
    """Faces rotated to start at their smallest index (same winding, canonical form)."""
    f = np.asarray(faces)
    k = np.argmin(f, axis=1)[:, None]
    return np.take_along_axis(f, (k + np.arange(3)) % 3, axis=1)


def _corner_uvs(mesh: ClothMesh) -> dict[int, set[tuple[float, float]]]:
    """vertex -> the set of UVs its corners carry (rounded)."""
    out: dict[int, set] = {}
    for fv, ft in zip(mesh.faces, mesh.face_uv, strict=True):
        for v, t in zip(fv, ft, strict=True):
            out.setdefault(int(v), set()).add(tuple(np.round(mesh.uv[t], 9)))
    return out


# A band (open cylinder) of 4 quads around the y axis: 8 vertices, 10 UVs, as
# a texture-mapped tube is stored. Column 0 and column 4 of the UVs are the same
# vertices (the seam), so vertices 1 and 5 carry two UVs each. The last quad
# uses negative (relative) indices; comments, o/g/s/usemtl/mtllib and vn lines
# are there to be ignored.
BAND_OBJ = """# a band with a UV seam
mtllib band.mtl
o band
v 1 0 0
v 0 0 1
v -1 0 0
v 0 0 -1
v 1 1 0
v 0 1 1
v -1 1 0
v 0 1 -1
vt 0.00 0   # seam column, u = 0
vt 0.25 0
vt 0.50 0
vt 0.75 0
vt 1.00 0
vt 0.00 1
vt 0.25 1
vt 0.50 1
vt 0.75 1
vt 1.00 1
vn 0 1 0
g side
usemtl cotton
s 1
f 2/1/1 1/2/1 5/7/1 6/6/1
f 1/2/1 4/3/1 8/8/1 5/7/1
f 4/3/1 3/4/1 7/9/1 8/8/1
f -6/-7/-1 -7/-6/-1 -3/-1/-1 -2/-2/-1
"""


# ---------------------------------------------------------------------------
# Loading and saving


def test_obj_keeps_per_corner_uvs_at_the_seam_and_round_trips(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tisim.geometry.cloth"):
        mesh = load_cloth_mesh(_obj(tmp_path, BAND_OBJ))
    assert "fan-triangulated 4 polygons" in caplog.text
    assert mesh.vertex_count == 8 and mesh.face_count == 8
    assert mesh.uv.shape == (10, 2) and mesh.face_uv.shape == (8, 3)
    # The negative-index quad is vertices 3 2 6 7 (1-based) with UVs 4 5 10 9.
    assert mesh.faces[6:].tolist() == [[2, 1, 5], [2, 5, 6]]
    assert mesh.face_uv[6:].tolist() == [[3, 4, 9], [3, 9, 8]]
    uvs = _corner_uvs(mesh)
    # vertex 1 (file line "v 0 0 1") sits on the seam: u = 0 on one side, 1 on the other
    assert uvs[1] == {(0.0, 0.0), (1.0, 0.0)}
    assert uvs[5] == {(0.0, 1.0), (1.0, 1.0)}
    assert uvs[0] == {(0.25, 0.0)}
    assert mesh.euler_characteristic == 0  # a cylinder
    assert len(mesh.boundary_edges) == 8 and len(mesh.hinges) == 8

    out = tmp_path / "frame.obj"
    moved = mesh.vertices + np.array([0.1, -0.2, 0.3])
    save_cloth_obj(out, moved, mesh)
    back = load_cloth_mesh(out)
    np.testing.assert_allclose(back.vertices, moved, atol=1e-8)
    np.testing.assert_array_equal(back.faces, mesh.faces)
    np.testing.assert_allclose(back.uv[back.face_uv], mesh.uv[mesh.face_uv], atol=1e-9)
    assert _corner_uvs(back)[1] == {(0.0, 0.0), (1.0, 0.0)}


def test_obj_corner_formats_negative_indices_and_polygons(tmp_path):
    square = "v 0 0 0\nv 1 0 0\nv 1 0 1\nv 0 0 1\nv 0.5 0 1.5\n"
    plain = load_cloth_mesh(_obj(tmp_path, square + "f 1 2 3 5 4\n", "a.obj"))
    with_vn = square + "vn 0 1 0\nf 1//1 2//1 3//1 5//1 4//1\n"
    normals = load_cloth_mesh(_obj(tmp_path, with_vn, "b.obj"))
    relative = load_cloth_mesh(_obj(tmp_path, square + "f -5 -4 -3 -1 -2\n", "c.obj"))
    for m in (plain, normals, relative):
        assert m.faces.tolist() == [[0, 1, 2], [0, 2, 4], [0, 4, 3]]  # fan from the first corner
        assert m.uv is None and m.face_uv is None
    # Faces with and without UVs in one file: UVs dropped with a warning, faces kept.
    mixed = square + "vt 0 0\nvt 1 0\nvt 1 1\nf 1/1 2/2 3/3\nf 1 3 4\n"
    m = load_cloth_mesh(_obj(tmp_path, mixed, "d.obj"))
    assert m.uv is None and m.face_count == 2


def test_obj_reader_errors_name_the_file_and_line(tmp_path):
    _expect_error(_obj(tmp_path, "v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 4\n", "a.obj"),
                  "face 0 (line 4)", "vertex 4", "3 vertices")  # fmt: skip
    zero = "v 0 0 0\nv 1 0 0\nv 0 1 0\nf 0 1 2\n"
    _expect_error(_obj(tmp_path, zero, "b.obj"), "line 4", "index 0")
    _expect_error(_obj(tmp_path, "v 0 0 0\nv 1 zero 0\n", "c.obj"), "line 2", "vertex")
    _expect_error(_obj(tmp_path, "v 0 0 0\nv 1 0 0\nv 0 1 0\n", "d.obj"), "no faces")
    _expect_error(_obj(tmp_path, "", "e.obj"), "empty")
    _expect_error(tmp_path / "missing.obj", "not found")
    uv_out = "v 0 0 0\nv 1 0 0\nv 0 1 0\nvt 0 0\nf 1/1 2/1 3/2\n"
    _expect_error(_obj(tmp_path, uv_out, "f.obj"), "face 0 (line 5)", "texture coordinate 2")


@pytest.mark.parametrize("ext", [".ply", ".stl", ".off", ".vtk"])
def test_meshio_formats_load_as_cloth(tmp_path, ext):
    disc = cloth_disc(0.3, 0.06, seed=3)
    path = tmp_path / f"disc{ext}"
    save_mesh(path, disc.vertices, disc.faces)
    back = load_cloth_mesh(path)
    assert back.vertex_count == disc.vertex_count and back.face_count == disc.face_count
    assert back.euler_characteristic == 1
    assert len(back.boundary_edges) == len(disc.boundary_edges)
    # STL stores a triangle soup; meshio merges the corners, so compare geometry.
    assert back.face_areas().sum() == pytest.approx(disc.face_areas().sum(), rel=1e-6)
    if ext != ".stl":
        np.testing.assert_allclose(back.vertices, disc.vertices, atol=1e-6)
        np.testing.assert_array_equal(back.faces, disc.faces)


def test_ply_quads_are_triangulated_and_point_uvs_kept(tmp_path, caplog):
    x = np.array([[0.0, 0, 0], [1, 0, 0], [1, 0, 1], [0, 0, 1], [2, 0, 0], [2, 0, 1]])
    quads = np.array([[0, 3, 2, 1], [1, 2, 5, 4]], dtype=np.int32)
    path = tmp_path / "quads.ply"
    uv = {"s": x[:, 0] / 2, "t": x[:, 2]}
    meshio.write(path, meshio.Mesh(x, [("quad", quads)], point_data=uv))
    with caplog.at_level(logging.INFO, logger="tisim.geometry.cloth"):
        m = load_cloth_mesh(path)
    assert "fan-triangulated 2 polygons" in caplog.text
    assert m.face_count == 4
    np.testing.assert_allclose(m.uv, np.stack([x[:, 0] / 2, x[:, 2]], axis=1))
    np.testing.assert_array_equal(m.face_uv, m.faces)
    assert np.all(_normals(m.vertices, m.faces)[:, 1] > 0)  # wound toward +y, consistently


def test_tet_files_are_not_cloth(tmp_path):
    path = tmp_path / "tet.vtu"
    meshio.write(path, meshio.Mesh(np.eye(4, 3), [("tetra", np.array([[0, 1, 2, 3]]))]))
    _expect_error(path, "volume cells", "tetra")


def test_save_cloth_obj_is_atomic_fast_and_checks_its_input(tmp_path):
    mesh = cloth_rectangle((1.0, 1.0), (63, 63))  # 4096 vertices
    out = tmp_path / "frame.obj"
    out.write_text("old contents")
    save_cloth_obj(out, mesh.vertices, mesh)  # formats the shared UV/face lines once
    t0 = time.perf_counter()
    for _ in range(5):
        save_cloth_obj(out, mesh.vertices, mesh)
    per_frame = (time.perf_counter() - t0) / 5
    assert per_frame < 0.1, per_frame  # a few ms on one core; generous for a busy machine
    assert [p.name for p in tmp_path.iterdir()] == ["frame.obj"]  # no temporary left behind
    text = out.read_text()
    assert text.count("\nv ") == 4096 and text.count("\nvt ") == 4096
    assert text.count("\nf ") == mesh.face_count
    assert re.search(r"\nf \d+/\d+ \d+/\d+ \d+/\d+\n", text)

    bare = ClothMesh(mesh.vertices, mesh.faces)
    save_cloth_obj(tmp_path / "bare.obj", mesh.vertices, bare)
    assert "vt" not in (tmp_path / "bare.obj").read_text()
    np.testing.assert_array_equal(load_cloth_mesh(tmp_path / "bare.obj").faces, mesh.faces)

    with pytest.raises(MeshError, match="shape"):
        save_cloth_obj(out, mesh.vertices[:-1], mesh)
    with pytest.raises(MeshError, match="does not exist"):
        save_cloth_obj(tmp_path / "nope" / "f.obj", mesh.vertices, mesh)


def test_cloth_mesh_constructor_checks_and_from_arrays_flips_uvs():
    r = cloth_rectangle((1.0, 1.0), (2, 2))
    with pytest.raises(MeshError, match="together"):
        ClothMesh(r.vertices, r.faces, r.uv, None)
    with pytest.raises(MeshError, match="face_uv"):
        ClothMesh(r.vertices, r.faces, r.uv, r.face_uv[:-1])
    faces = r.faces.copy()
    faces[[1, 4]] = faces[[1, 4]][:, [1, 0, 2]]
    m = ClothMesh.from_arrays(r.vertices, faces, uv=r.uv, face_uv=faces, source="sheet")
    np.testing.assert_array_equal(_rotated(m.faces), _rotated(r.faces))  # flipped back
    np.testing.assert_array_equal(m.face_uv, m.faces)  # and their UV corners with them


# ---------------------------------------------------------------------------
# Validation: errors and repairs

TRI3 = "v 0 0 0\nv 1 0 0\nv 0 0 1\n"


def _moebius(n: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """A Moebius strip: n quads along a circle, the width direction turning by
    half a turn; the last quad joins side a to side b."""
    t = 2 * np.pi * np.arange(n) / n
    c = np.stack([np.cos(t), np.zeros(n), np.sin(t)], 1)
    w = 0.3 * (np.cos(t / 2)[:, None] * c + np.sin(t / 2)[:, None] * np.array([0, 1, 0]))
    x = np.concatenate([c - w, c + w])  # a_k = k, b_k = n + k
    faces = []
    for k in range(n):
        a0, b0 = k, n + k
        a1, b1 = (k + 1, n + k + 1) if k < n - 1 else (n, 0)  # the twist swaps the sides
        faces += [[a0, b0, b1], [a0, b1, a1]]
    return x, np.array(faces)


def _obj_text(x, faces) -> str:
    v = "".join(f"v {a:.17g} {b:.17g} {c:.17g}\n" for a, b, c in x)
    return v + "".join(f"f {a + 1} {b + 1} {c + 1}\n" for a, b, c in faces)


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("nan", "v 0 0 0\nv nan 0 0\nv 0 0 1\nf 1 2 3\n", ["vertex 1 (line 2)", "NaN"]),
        ("inf", "v 0 0 0\nv 1 0 0\nv 0 0 inf\nf 1 2 3\n", ["vertex 2", "infinite"]),
        ("collinear", "v 0 0 0\nv 1 0 0\nv 2 0 0\nv 0 0 1\nf 1 2 4\nf 1 3 2\n",
         ["face 1 (line 6, vertices 0, 2, 1) is degenerate (area 0 m^2)"]),
        ("repeated", TRI3 + "f 1 2 3\nf 1 2 2\n", ["face 1", "degenerate", "repeated vertex"]),
        ("tiny", TRI3 + "v 1 0 1\nv 1.000001 0 1\nv 1 0 1.000001\nf 1 2 3\nf 4 5 6\n",
         ["face 1", "degenerate", "area 5e-13 m^2"]),
        ("duplicate", TRI3 + "v 1 0 1\nf 1 2 3\nf 2 4 3\nf 3 2 1\n",
         ["face 0 (line 5) and face 2 (line 7) are duplicates", "vertices 0, 1, 2"]),
        ("nonmanifold", TRI3 + "v 0 1 0\nv 0 -1 0\nf 1 2 3\nf 2 1 4\nf 1 2 5\n",
         ["edge (0, 1) is non-manifold", "3 faces", "face 0", "face 1", "face 2"]),
        ("moebius", _obj_text(*_moebius()), ["not orientable", "Moebius"]),
        ("empty", "v 0 0 0\n", ["no faces"]),
    ],
)  # fmt: skip
def test_invalid_cloth_meshes_give_one_line_errors(tmp_path, name, text, words):
    _expect_error(_obj(tmp_path, text, f"{name}.obj"), *words)


def test_validate_cloth_arrays_name_the_source():
    x = np.array([[0.0, 0, 0], [1, 0, 0], [0, 0, 1]])
    with pytest.raises(MeshError, match=r"^sheet: face 1 references vertex 7, outside 0..2$"):
        validate_cloth(x, [[0, 1, 2], [0, 2, 7]], "sheet")
    with pytest.raises(MeshError, match=r"^sheet: contains no triangles"):
        validate_cloth(x, np.zeros((0, 3), int), "sheet")
    with pytest.raises(MeshError, match="vertex 1 has a NaN"):
        validate_cloth(np.array([[0.0, 0, 0], [np.nan, 0, 0], [0, 0, 1]]), [[0, 1, 2]], "s")


def test_inconsistent_orientation_is_fixed_with_a_warning(tmp_path, caplog):
    grid = cloth_rectangle((1.0, 1.0), (4, 4))
    faces = grid.faces.copy()
    wrong = [0, 5, 17]
    faces[wrong] = faces[wrong][:, [0, 2, 1]]
    path = _obj(tmp_path, _obj_text(grid.vertices, faces))
    with caplog.at_level(logging.WARNING, logger="tisim.geometry.cloth"):
        m = load_cloth_mesh(path)
    assert f"{path}: flipped 3 of 32 faces" in caplog.text
    np.testing.assert_array_equal(_rotated(m.faces), _rotated(grid.faces))
    assert np.all(_normals(m.vertices, m.faces)[:, 1] > 0)
    # The majority wins: flip 29 faces instead and the 3 are flipped again.
    x, f, notes = validate_cloth(grid.vertices, grid.faces[:, [0, 2, 1]], "s")
    assert notes == [] and np.all(_normals(x, f)[:, 1] < 0)


def test_orientation_is_fixed_per_connected_piece():
    a = cloth_rectangle((1.0, 1.0), (3, 3))
    b = cloth_rectangle((1.0, 1.0), (3, 3), center=(3.0, 0, 0))
    faces = np.concatenate([a.faces, b.faces[:, [0, 2, 1]] + a.vertex_count])
    faces[2] = faces[2][[0, 2, 1]]  # one wrong face in the first piece
    flip, bad = consistent_orientation(faces)
    assert not bad.any()
    assert np.flatnonzero(flip).tolist() == [2]  # the second piece is consistent as it is
    _, moebius = _moebius()
    flip, bad = consistent_orientation(moebius)
    assert bad.all() and not flip.any()


def test_unreferenced_vertices_dropped_and_bowtie_warned(tmp_path, caplog):
    # Two triangles meeting at vertex 1 only (a bowtie), and an unused vertex 5.
    text = "v 0 0 0\nv 1 0 0\nv 0 0 1\nv 2 0 0\nv 2 0 1\nv 9 9 9\nv 1 0 -1\nf 1 2 3\nf 2 4 5\nf 2 7 4\n"
    with caplog.at_level(logging.WARNING, logger="tisim.geometry.cloth"):
        m = load_cloth_mesh(_obj(tmp_path, text))
    assert "dropped 1 unreferenced vertices" in caplog.text
    assert "1 non-manifold vertices" in caplog.text and "vertex 1 (line 2)" in caplog.text
    assert m.vertex_count == 6
    assert not np.any(np.all(m.vertices == 9.0, axis=1))
    assert m.faces.tolist() == [[0, 1, 2], [1, 3, 4], [1, 5, 3]]
    assert nonmanifold_vertices(m.faces).tolist() == [1]
    assert nonmanifold_vertices(cloth_rectangle((1, 1), (3, 3)).faces).size == 0


# ---------------------------------------------------------------------------
# Topology


def _signed_dihedral(x, h):
    e0, e1, o0, o1 = (x[h[:, k]] for k in range(4))
    na = np.cross(e1 - e0, o0 - e0)
    nb = np.cross(o1 - e0, e1 - e0)
    e = (e1 - e0) / np.linalg.norm(e1 - e0, axis=1, keepdims=True)
    return np.arctan2(np.einsum("ij,ij->i", np.cross(na, nb), e), np.einsum("ij,ij->i", na, nb))


def test_grid_edges_hinges_and_euler_characteristic():
    n0, n1 = 5, 3
    m = cloth_rectangle((1.0, 0.6), (n0, n1))
    n_edges = n0 * (n1 + 1) + (n0 + 1) * n1 + n0 * n1  # two directions + one diagonal a cell
    assert m.edge_count == n_edges
    np.testing.assert_array_equal(m.edges, edges(m.faces))
    assert len(m.boundary_edges) == 2 * (n0 + n1)
    assert m.euler_characteristic == 1
    h, hf = m.hinges, m.hinge_faces
    assert len(h) == n_edges - 2 * (n0 + n1)
    np.testing.assert_array_equal(np.sort(h[:, :2], axis=1), m.edges[m.hinge_edges])
    assert np.all(h[:, 2] != h[:, 3])
    for (e0, e1, o0, o1), (fa, fb) in zip(h, hf, strict=True):
        a, b = m.faces[fa].tolist(), m.faces[fb].tolist()
        k = a.index(e0)  # face A runs e0 -> e1 -> o0, face B runs e1 -> e0 -> o1
        assert a[(k + 1) % 3] == e1 and a[(k + 2) % 3] == o0
        k = b.index(e1)
        assert b[(k + 1) % 3] == e0 and b[(k + 2) % 3] == o1
    # Flat: both hinge normals point the way the sheet faces (+y).
    x = m.vertices
    e0, e1, o0, o1 = (x[h[:, k]] for k in range(4))
    assert np.all(np.cross(e1 - e0, o0 - e0)[:, 1] > 0)
    assert np.all(np.cross(o1 - e0, e1 - e0)[:, 1] > 0)
    # Rolled over a cylinder along z: every bent hinge bends the same way.
    R = 0.5
    bent = np.stack([R * np.sin(x[:, 0] / R), R * np.cos(x[:, 0] / R), x[:, 2]], 1)
    theta = _signed_dihedral(bent, h)
    bent_ones = np.abs(theta) > 1e-9
    # Only the hinges on the rulings (edges along z) bend; the others join
    # faces spanning the same two rulings, which stay coplanar.
    assert bent_ones.sum() == (n0 - 1) * n1
    assert np.all(theta[bent_ones] > 0) or np.all(theta[bent_ones] < 0)
    # The dihedral sign flips with the fold direction.
    theta_up = _signed_dihedral(bent * np.array([1, -1, 1]), h)
    assert np.all(np.sign(theta_up[bent_ones]) == -np.sign(theta[bent_ones]))


# ---------------------------------------------------------------------------
# Generators


def test_cloth_rectangle_has_unit_square_uvs_matching_positions():
    m = cloth_rectangle((2.0, 1.0), (4, 2), center=(0.0, 1.0, 0.0), normal="y")
    assert m.uv.min() == 0.0 and m.uv.max() == 1.0
    np.testing.assert_allclose(m.uv[:, 0], (m.vertices[:, 0] + 1.0) / 2.0)
    np.testing.assert_allclose(m.uv[:, 1], m.vertices[:, 2] + 0.5)
    np.testing.assert_array_equal(m.face_uv, m.faces)


def test_cloth_disc_is_valid_irregular_round_and_reproducible():
    r, h = 0.5, 0.05
    m = cloth_disc(r, h, seed=7, center=(0.0, 1.0, 0.0))
    _x, f, notes = validate_cloth(m.vertices, m.faces, "disc")
    assert notes == []
    np.testing.assert_array_equal(f, m.faces)
    assert m.euler_characteristic == 1  # one disc, no holes
    assert np.all(_normals(m.vertices, m.faces)[:, 1] > 0)  # faces +y
    # Round: the boundary vertices lie on the circle, the area is that of the
    # inscribed polygon (pi r^2 less a chordal gap of order h^2 / r per unit length).
    b = np.unique(m.boundary_edges)
    np.testing.assert_allclose(np.linalg.norm(m.vertices[b] - [0, 1, 0], axis=1), r)
    assert m.face_areas().sum() == pytest.approx(np.pi * r * r, rel=2 * (h / r) ** 2)
    # Irregular: edge lengths spread around the target, no repeated pattern.
    p = m.vertices[m.edges]
    length = np.linalg.norm(p[:, 1] - p[:, 0], axis=1)
    assert 0.7 * h < np.median(length) < 1.3 * h
    assert length.std() / length.mean() > 0.1
    assert len(np.unique(np.round(length, 6))) > 0.9 * len(length)
    # Not slivers: the smallest angle stays well away from zero.
    q = m.vertices[m.faces]
    cosines = [
        np.einsum("ij,ij->i", q[:, (k + 1) % 3] - q[:, k], q[:, (k + 2) % 3] - q[:, k])
        / np.linalg.norm(q[:, (k + 1) % 3] - q[:, k], axis=1)
        / np.linalg.norm(q[:, (k + 2) % 3] - q[:, k], axis=1)
        for k in range(3)
    ]
    assert np.degrees(np.arccos(np.max(cosines))) > 15.0
    assert m.uv.min() >= 0.0 and m.uv.max() <= 1.0
    again = cloth_disc(r, h, seed=7, center=(0.0, 1.0, 0.0))
    np.testing.assert_array_equal(again.vertices, m.vertices)
    np.testing.assert_array_equal(again.faces, m.faces)
    other = cloth_disc(r, h, seed=8, center=(0.0, 1.0, 0.0))
    assert other.vertex_count != m.vertex_count or not np.array_equal(other.vertices, m.vertices)
    assert not find_intersections(m.vertices, m.faces, m.edges)
    z = cloth_disc(r, h, seed=7, normal="z")
    assert np.all(_normals(z.vertices, z.faces)[:, 2] > 0)


# ---------------------------------------------------------------------------
# Intersections


def _brute_force(xe, edges_, xf, faces_, same: bool) -> set[tuple[int, int]]:
    """Every (edge, face) pair tested with IPC Toolkit's predicate (the oracle)."""
    import ipctk

    hits = set()
    for i, (a, b) in enumerate(edges_):
        for j, f in enumerate(faces_):
            if same and (a in f or b in f):
                continue
            if ipctk.is_edge_intersecting_triangle(xe[a], xe[b], xf[f[0]], xf[f[1]], xf[f[2]]):
                hits.add((i, j))
    return hits


def test_no_intersections_on_flat_sheets():
    for m in (cloth_rectangle((1.0, 1.0), (12, 12), center=(0.0, 0.3, 0.0)), cloth_disc(0.4, 0.06)):
        assert find_intersections(m.vertices, m.faces, m.edges) == []
        check_intersection_free(m.vertices, m.faces, m.edges, source="sheet")


def test_planted_self_intersection_matches_brute_force():
    # A horizontal sheet and a vertical one crossing it, in one mesh, in general
    # position (the crossing line misses every vertex of the horizontal sheet).
    a = cloth_rectangle((1.0, 1.0), (5, 5), normal="y")
    b = cloth_rectangle((0.63, 0.41), (3, 2), center=(0.0731, 0.0537, 0.0213), normal="x")
    x = np.concatenate([a.vertices, b.vertices])
    f = np.concatenate([a.faces, b.faces + a.vertex_count])
    e = edges(f)
    hits = find_intersections(x, f, e)
    expected = _brute_force(x, e, x, f, same=True)
    assert len(expected) > 3
    assert {(h.edge, h.face) for h in hits} == expected
    with pytest.raises(MeshError) as info:
        check_intersection_free(x, f, e, source="two.obj")
    msg = str(info.value)
    assert msg.startswith("two.obj: the cloth intersects itself: edge ") and "\n" not in msg
    assert f"({len(hits)} intersecting edge-face pairs in all)" in msg


def test_random_triangle_soup_matches_brute_force(rng):
    # 60 small random triangles in a unit box: generic, many crossings.
    centres = rng.uniform(0, 1, (60, 1, 3))
    x = (centres + rng.normal(0, 0.12, (60, 3, 3))).reshape(-1, 3)
    f = np.arange(180).reshape(60, 3)
    e = edges(f)
    hits = find_intersections(x, f, e)
    expected = _brute_force(x, e, x, f, same=True)
    assert len(expected) > 5
    assert {(h.edge, h.face) for h in hits} == expected


def test_sheet_against_a_sphere_obstacle():
    sphere = icosphere(2)
    V, F = 0.5 * sphere.vertices, sphere.faces
    top = V[:, 1].max()
    above = cloth_rectangle((1.2, 1.2), (9, 9), center=(0.013, top + 1e-3, -0.021))
    assert find_intersections(above.vertices, above.faces, above.edges, other=(V, F)) == []
    check_intersection_free(above.vertices, above.faces, above.edges, other=(V, F))

    cut = cloth_rectangle((1.2, 1.2), (9, 9), center=(0.013, 0.2, -0.021))
    hits = find_intersections(cut.vertices, cut.faces, cut.edges, other=(V, F))
    mine = {(h.edge, h.face) for h in hits if not h.edge_in_other}
    theirs = {(h.edge, h.face) for h in hits if h.edge_in_other}
    assert mine == _brute_force(cut.vertices, cut.edges, V, F, same=False)
    assert theirs == _brute_force(V, edges(F), cut.vertices, cut.faces, same=False)
    assert mine and theirs
    with pytest.raises(MeshError, match=r"^cloth.obj: the cloth intersects the sphere: "):
        check_intersection_free(
            cut.vertices, cut.faces, cut.edges, source="cloth.obj", other=(V, F),
            other_name="the sphere",
        )  # fmt: skip


def test_small_obstacle_through_one_face_is_found_by_its_edges():
    # A pebble piercing the middle of one big triangle: no cloth edge touches it,
    # only the obstacle's edges cross the cloth face.
    x = np.array([[0.0, 0, 0], [1, 0, 0], [0, 0, 1]])
    f = np.array([[0, 2, 1]])
    pebble = icosphere(1)
    V = 0.05 * pebble.vertices + [0.25, 0.0123, 0.25]
    hits = find_intersections(x, f, edges(f), other=(V, pebble.faces))
    assert hits == find_intersections(x, f, edges(f), other=ClothMesh(V, pebble.faces))
    assert hits and all(h.edge_in_other and h.face == 0 for h in hits)
    lifted = V + [0, 0.06, 0]
    assert find_intersections(x, f, edges(f), other=(lifted, pebble.faces)) == []


def test_touching_and_coplanar_overlap_count_as_intersections():
    x = np.array([[0.0, 0, 0], [1, 0, 0], [0, 0, 1], [0.2, 0, 0.2], [0.4, 0, 0.3], [0.3, 0.0, -0.5],
                  [0.3, 0.0, 0.5]])  # fmt: skip
    f = np.array([[0, 2, 1]])
    inside = np.array([[3, 4]])  # coplanar segment lying inside the face
    crossing = np.array([[5, 6]])  # coplanar segment crossing edge 0-1
    assert find_intersections(x, f, inside) == [(0, 0, False)]
    assert find_intersections(x, f, crossing) == [(0, 0, False)]
    y = x.copy()
    y[4] = [0.4, 0.5, 0.3]  # segment starting on the face, leaving it
    assert find_intersections(y, f, inside) == [(0, 0, False)]
    y[3] = [0.2, 1e-6, 0.2]  # now 1 micrometre above
    assert find_intersections(y, f, inside) == []


def test_a_mesh_note_is_told_once_per_file(tmp_path, caplog, monkeypatch):
    """``tisim refine my.obj`` reads the mesh to build its scene and again as that scene's
    mesh, by the name given and by its absolute path: each note reached the terminal
    twice. Now once per file and process (the second time in the debug log); a mesh not
    read from a file is always told."""
    import logging

    from tisim.geometry.cloth import load_cloth_mesh, validate_cloth

    V = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [-1, 0, 0], [0, -1, 0]], float)
    F = np.array([[0, 1, 2], [0, 3, 4]])  # two triangles sharing vertex 0 only
    path = tmp_path / "bow.obj"
    lines = [f"v {a} {b} {c}\n" for a, b, c in V] + [f"f {a + 1} {b + 1} {c + 1}\n" for a, b, c in F]
    path.write_text("".join(lines))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tisim.geometry.cloth"):
        load_cloth_mesh("bow.obj")
        load_cloth_mesh(path)
        assert caplog.text.count("non-manifold vertices") == 1
        validate_cloth(V, F)
        validate_cloth(V, F)
        assert caplog.text.count("non-manifold vertices") == 3


def test_an_unwelded_mesh_is_named_as_such(tmp_path):
    """Two triangles each with their own copies of the shared edge's vertices were
    reported as "the cloth intersects itself"; the error now says what to do."""
    p = tmp_path / "unwelded.obj"
    p.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 1 0 0\nv 1 1 0\nv 0 1 0\nf 1 2 3\nf 4 5 6\n")
    with pytest.raises(
        MeshError,
        match=r"vertex 1 \(line 2\) and vertex 3 \(line 4\) are at the same place "
        r"\(2 such pairs\).*not welded",
    ) as e:
        load_cloth_mesh(p)
    assert "unwelded.obj" in str(e.value)
    # welded, the same sheet loads
    p.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nv 1 1 0\nf 1 2 3\nf 2 4 3\n")
    assert load_cloth_mesh(p).vertex_count == 4
