"""Hierarchies of the meshes users bring (separate pieces, a bow-tie, holes) build at
the defaults: every coarse vertex gets a fine vertex leaning on it, so consistent masses
are positive, with P(X_coarse) = X_fine and the total mass kept exactly."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.geometry import awkward
from tisim.geometry import hierarchy as hy


@pytest.mark.parametrize("make", [awkward.pieces, awkward.bow_tie, awkward.holey_sheet])
def test_decimated_hierarchy_of_an_awkward_mesh_has_positive_consistent_masses(make):
    m = make()
    fine = hy.Level.from_mesh(m.vertices, m.faces, 0.2)
    H = hy.build_hierarchy(fine, 3)  # the defaults: decimate, consistent masses
    for lvl in range(H.level_count - 1):
        P = H.prolongations[lvl]
        col = np.asarray(P.U.sum(axis=0)).ravel()
        assert col.min() > 0, (lvl, int(np.argmin(col)))
        assert H.levels[lvl].mass.min() > 0
        assert P.rest_error() < 1e-9 * H.finest.diagonal
        assert H.levels[lvl].total_mass == pytest.approx(H.finest.total_mass, rel=1e-12)


def test_a_corner_no_fine_vertex_leans_on_is_rehosted_exactly():
    """Coarse triangle (0, 1, 2) with fine vertices only near the edge (0, 1): corner 2
    gets nothing by closest points; the nearest fine vertex is moved onto it, the
    prolongation still reproduces the fine rest shape."""
    coarse = hy.Level.from_mesh(np.array([[0, 0, 0], [1, 0, 0], [0.5, 0, 1.0]]), np.array([[0, 2, 1]]), 1.0)
    xf = np.array([[0, 0, 0], [1, 0, 0], [0.5, 0.0, 0.01], [0.25, 0, 0.0], [0.6, 0.0, 0.3], [0.4, 0.0, 1.2]])
    fine = hy.Level.from_mesh(xf, np.array([[0, 3, 2], [3, 1, 2], [2, 1, 4], [2, 4, 5], [0, 2, 5]]), 1.0)
    host, bary, dist = hy.closest_on_surface(fine.vertices, coarse.vertices, coarse.faces)
    # corner 2 (column 1 of face (0, 2, 1)) bare, as if every closest point lay on edge 0-1
    bary = np.stack([1 - xf[:, 0], np.zeros(len(xf)), xf[:, 0]], axis=1)
    moved = hy._lean_on_every_vertex(fine.vertices, coarse.vertices, coarse.faces, host, bary, dist)
    assert moved == 1
    U = hy._barycentric_matrix(host, bary, coarse.faces, 3)
    assert np.asarray(U.sum(axis=0)).ravel().min() > 0
    P = hy._with_offsets(U, coarse.vertices, coarse.faces, fine.vertices, host, bary, dist)
    assert np.allclose(P.apply(coarse.vertices), fine.vertices, atol=1e-12)
    assert host[5] == 0 and bary[5].tolist() == [0.0, 1.0, 0.0]  # (0.4, 0, 1.2) is nearest to corner 2


def test_refine_mass_is_a_scene_key():
    from tisim.cli.app import demos_dir
    from tisim.scene import load_scene

    sc = load_scene(demos_dir() / "refine-drape.toml", ["refine.mass=lumped"])
    assert sc.refine.mass == "lumped"


def test_decimated_levels_get_uvs_by_projection_onto_the_finest_mesh():
    """UVs linear in the rest positions (a planar map of the graded sheet) must come out
    exactly that map at every coarse vertex: closest point on the finest mesh, barycentric
    interpolation there (the checker of the preview then matches the finest one's)."""
    m = awkward.graded_sheet()
    uv = np.stack([2.0 * m.vertices[:, 0] + 0.5, -m.vertices[:, 2] + 0.25], axis=1)
    fine = hy.Level.from_mesh(m.vertices, m.faces, 0.2, uv=uv, face_uv=m.faces)
    H = hy.build_hierarchy(fine, 3)
    for lv in H.levels[:-1]:
        assert lv.uv is not None and len(lv.uv) == lv.vertex_count
        expect = np.stack([2.0 * lv.vertices[:, 0] + 0.5, -lv.vertices[:, 2] + 0.25], axis=1)
        # a decimated vertex may lie off the fine sheet's border (the library moves a few):
        # its UV is the closest border point's, so compare where it lies on the sheet
        inside = (np.abs(lv.vertices[:, [0, 2]]) <= 0.25 + 1e-12).all(axis=1)
        assert inside.mean() > 0.9
        np.testing.assert_allclose(lv.uv[inside], expect[inside], atol=1e-9)
