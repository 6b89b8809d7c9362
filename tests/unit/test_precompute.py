"""Rest-shape precomputation against hand-computed tets and linear-field reproduction."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.geometry.generate import ball, box
from tisim.geometry.mesh import MeshError, TetMesh
from tisim.geometry.precompute import (
    deformation_gradients,
    gradient_operator,
    lumped_mass,
    tet_rest,
)

UNIT_TET = TetMesh(np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]), np.array([[0, 1, 2, 3]]))


def test_unit_corner_tet():
    r = tet_rest(UNIT_TET)
    np.testing.assert_array_equal(r.Dm[0], np.eye(3))
    np.testing.assert_allclose(r.Dm_inv[0], np.eye(3), atol=1e-15)
    assert r.volume[0] == pytest.approx(1 / 6, rel=1e-15)
    # N0 = 1 - x - y - z, N1 = x, N2 = y, N3 = z.
    np.testing.assert_allclose(r.grad[0], [[-1, -1, -1], [1, 0, 0], [0, 1, 0], [0, 0, 1]], atol=1e-15)
    np.testing.assert_allclose(r.grad[0].sum(axis=0), 0, atol=1e-15)


def test_scaled_tet_by_hand():
    # Vertices 0, 2 e_x, 3 e_y, 4 e_z: Dm = diag(2, 3, 4), volume 24 / 6 = 4.
    x = np.array([[1.0, 1, 1], [3, 1, 1], [1, 4, 1], [1, 1, 5]])
    r = tet_rest(TetMesh(x, [[0, 1, 2, 3]]))
    np.testing.assert_allclose(r.Dm[0], np.diag([2.0, 3.0, 4.0]))
    np.testing.assert_allclose(r.Dm_inv[0], np.diag([1 / 2, 1 / 3, 1 / 4]))
    assert r.volume[0] == pytest.approx(4.0)
    np.testing.assert_allclose(r.grad[0, 0], [-1 / 2, -1 / 3, -1 / 4])
    m = lumped_mass(TetMesh(x, [[0, 1, 2, 3]]), density=1000.0)
    np.testing.assert_allclose(m, [1000.0] * 4, rtol=1e-15)  # 1000 kg/m^3 * 4 m^3 / 4 each


def test_lumped_mass_each_vertex_gets_a_quarter():
    m = lumped_mass(UNIT_TET, density=600.0)
    np.testing.assert_allclose(m, 600.0 / 6 / 4, rtol=1e-15)
    b = box((1.0, 0.5, 0.2), (4, 3, 2))
    mb = lumped_mass(b, density=np.full(b.element_count, 1200.0))
    assert mb.sum() == pytest.approx(1200.0 * 0.1, rel=1e-12)
    assert mb.min() > 0


@pytest.mark.parametrize("mesh", [box((1.0, 0.6, 0.4), (3, 2, 2)), ball(0.4, 4)], ids=["box", "ball"])
def test_linear_fields_are_reproduced_exactly(mesh, rng):
    A = rng.normal(size=(3, 3)) + 2 * np.eye(3)
    c = rng.normal(size=3)
    x = mesh.vertices @ A.T + c
    r = tet_rest(mesh)
    F = deformation_gradients(x, mesh.tets, r.Dm_inv)
    np.testing.assert_allclose(F, np.broadcast_to(A, F.shape), rtol=0, atol=1e-12)
    # Shape-function gradients sum to zero and reproduce the identity.
    np.testing.assert_allclose(r.grad.sum(axis=1), 0, atol=1e-12)
    X = mesh.vertices[mesh.tets]  # (m, 4, 3)
    np.testing.assert_allclose(np.einsum("eai,eaj->eij", X, r.grad), np.broadcast_to(np.eye(3), F.shape), atol=1e-12)
    G = gradient_operator(mesh.tets, r.grad, mesh.vertex_count)
    assert G.shape == (3 * mesh.element_count, mesh.vertex_count)
    Ft = (G @ x).reshape(-1, 3, 3)
    np.testing.assert_allclose(Ft, np.broadcast_to(A.T, Ft.shape), rtol=0, atol=1e-12)
    # A constant field has zero gradient: every row of G sums to zero.
    np.testing.assert_allclose(G @ np.ones(mesh.vertex_count), 0, atol=1e-12)


def test_volumes_match_the_mesh_and_sum_to_the_box():
    b = box((1.0, 0.5, 0.2), (4, 3, 2))
    r = tet_rest(b)
    np.testing.assert_allclose(r.volume, b.signed_volumes())
    assert r.volume.sum() == pytest.approx(0.1, rel=1e-12)
    np.testing.assert_allclose(r.volume, np.abs(np.linalg.det(r.Dm)) / 6, rtol=1e-12)


def test_tet_rest_rejects_inverted_and_degenerate_tets():
    with pytest.raises(MeshError, match="inverted"):
        tet_rest(TetMesh(UNIT_TET.vertices, [[1, 0, 2, 3]]))
    flat = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0.5, 0.5, 0]])
    with pytest.raises(MeshError, match="degenerate"):
        tet_rest(TetMesh(flat, [[0, 1, 2, 3]]))


def test_volume_ratios_equal_det_f_on_deformed_and_inverted_tets():
    """The runner's smallest det F comes from signed volumes over rest volumes; it must be
    det(Ds Dm^-1) itself, sign included, on a deformed mesh with some tets inverted."""
    from types import SimpleNamespace

    from tisim.runner import volume_ratios

    b = box((1.0, 0.5, 0.2), (4, 3, 2))
    r = tet_rest(b)
    rng = np.random.default_rng(7)
    x = b.vertices @ rng.normal(size=(3, 3)) + rng.normal(scale=0.15, size=b.vertices.shape)
    J_ref = np.linalg.det(deformation_gradients(x, b.tets, r.Dm_inv))
    assert (J_ref < 0).any() and (J_ref > 0).any()  # the check sees both signs
    model = SimpleNamespace(mesh=b, rest=r)
    np.testing.assert_allclose(volume_ratios(model, x), J_ref, rtol=1e-12, atol=1e-12)
