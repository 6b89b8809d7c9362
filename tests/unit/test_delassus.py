"""The Delassus operator H A^-1 H^T against a dense inverse, and the indicator split."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tisim.contact.ncp.delassus import (
    DelassusOperator,
    scalar_delassus_columns,
    scalar_delassus_sparse_inverse,
    scalar_mass_delassus_diagonal,
)
from tisim.contact.ncp.detection import ContactDetector
from tisim.contact.ncp.frames import ContactSet, tangent_frames
from tisim.geometry.precompute import gradient_operator
from tisim.linalg.cholesky import factorize
from tisim.model import Model
from tisim.scene import scene_from_dict

H_STEP = 0.01


@pytest.fixture(scope="module")
def setup():
    """A 3x3x3-cell box resting on a plane, its PD matrix A_hat = M + h^2 sum w G^T G,
    the bottom-face vertex-plane contacts plus two synthetic vertex-triangle contacts."""
    m = Model.from_scene(
        scene_from_dict(
            {
                "objects": {
                    "box": {
                        "generator": "box",
                        "size": [0.3, 0.3, 0.3],
                        "resolution": [3, 3, 3],
                        "translation": [0, 0.15, 0],
                        "youngs_modulus": 1e5,
                    }
                },
                "colliders": {"floor": {"type": "plane"}},
            }
        )
    )
    n = m.vertex_count
    G = gradient_operator(m.mesh.tets, m.rest.grad, n)
    w = np.repeat(2 * m.element_mu * m.rest.volume, 3)
    A = (sp.diags(m.mass) + H_STEP**2 * G.T @ sp.diags(w) @ G).tocsc()
    q = m.initial_positions
    cs = ContactDetector(m, m.scene.contact).detect(q, q, H_STEP)
    rng = np.random.default_rng(3)
    tri = m.surface[[5, 17]]
    v = np.array([0, n - 1])
    beta = rng.dirichlet(np.ones(3), size=2)
    nrm = rng.normal(size=(2, 3))
    nrm /= np.linalg.norm(nrm, axis=1, keepdims=True)
    extra = ContactSet(
        vertices=np.c_[v, tri],
        weights=np.c_[np.ones(2), -beta],
        frames=tangent_frames(nrm),
        gap0=np.zeros(2),
        point0=np.zeros((2, 3)),
        collider=np.full(2, -1),
        mu=np.full(2, 0.3),
        surface_velocity=np.zeros((2, 3)),
        key=np.arange(2),
    )
    cs = ContactSet.concatenate([cs, extra])
    return m, A, cs


def _dense_reference(A, cs, n):
    H = cs.jacobian(n).toarray()
    A3 = np.kron(A.toarray(), np.eye(3))  # q.ravel() is (x, y, z) per vertex
    return H, A3, H @ np.linalg.inv(A3) @ H.T


def test_tangent_frames_orthonormal_right_handed(rng):
    n = rng.normal(size=(1000, 3))
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    n[:3] = [[0, 0, 1], [0, 0, -1], [0, 1, 0]]
    F = tangent_frames(n)
    np.testing.assert_allclose(F @ np.transpose(F, (0, 2, 1)), np.broadcast_to(np.eye(3), F.shape), atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(F), 1.0, atol=1e-12)
    np.testing.assert_allclose(F[:, 0], n)


def test_jacobian_matches_contact_points(setup, rng):
    m, _, cs = setup
    n = m.vertex_count
    q = rng.normal(size=(n, 3))
    H = cs.jacobian(n)
    np.testing.assert_allclose((H @ q.ravel()).reshape(-1, 3), cs.to_frame(cs.points(q)), atol=1e-13)
    lam = rng.normal(size=(cs.count, 3))
    np.testing.assert_allclose(cs.scatter_forces(lam, n).ravel(), H.T @ lam.ravel(), atol=1e-13)


@pytest.mark.parametrize("how", ["sparse-inverse", "columns"])
def test_delassus_matches_dense_inverse(setup, how):
    from tisim.linalg.sparse_inverse import sparse_inverse

    m, A, cs = setup
    n = m.vertex_count
    B = cs.selection_matrix(n)
    f = factorize(A)
    if how == "sparse-inverse":
        si = sparse_inverse(f)
        W_hat = scalar_delassus_sparse_inverse(si.S, si.perm, B)
    else:
        W_hat = scalar_delassus_columns(lambda X: f.solve(X.toarray()), B)
    _, _, W_ref = _dense_reference(A, cs, n)
    C = DelassusOperator(W_hat, cs.frames, H_STEP**2)
    ref = H_STEP**2 * W_ref
    assert cs.count > 10
    np.testing.assert_allclose(C.dense(), ref, atol=1e-12 * np.abs(ref).max())
    x = np.random.default_rng(0).normal(size=(cs.count, 3))
    np.testing.assert_allclose(C.matvec(x).ravel(), ref @ x.ravel(), atol=1e-12 * np.abs(ref).max())
    np.testing.assert_allclose(np.repeat(C.diagonal(), 3), np.diag(ref), rtol=1e-12)


def test_indicator_split(setup, rng):
    """Omega W Omega (W built once) equals J A^-1 J^T with J = Omega H formed directly."""
    m, A, cs = setup
    n = m.vertex_count
    f = factorize(A)
    B = cs.selection_matrix(n)
    C = DelassusOperator(scalar_delassus_columns(lambda X: f.solve(X.toarray()), B), cs.frames, 1.0)
    H, A3, _ = _dense_reference(A, cs, n)
    omega = rng.uniform(0, 2, size=3 * cs.count)
    omega[rng.random(omega.size) < 0.3] = 0.0  # some rows inactive
    J = omega[:, None] * H
    direct = J @ np.linalg.solve(A3, J.T)
    split = omega[:, None] * C.dense() * omega[None, :]
    np.testing.assert_allclose(split, direct, atol=1e-13 * np.abs(direct).max())
    # and matrix-free: Omega C (Omega x)
    x = rng.normal(size=(cs.count, 3))
    om = omega.reshape(-1, 3)
    np.testing.assert_allclose((om * C.matvec(om * x)).ravel(), direct @ x.ravel(), atol=1e-13 * np.abs(direct).max())


def test_mass_delassus_diagonal(setup):
    m, _, cs = setup
    n = m.vertex_count
    H = cs.jacobian(n).toarray()
    Minv = np.repeat(1.0 / m.mass, 3)
    ref = np.diag(H @ (Minv[:, None] * H.T))
    d = scalar_mass_delassus_diagonal(cs.selection_matrix(n), 1.0 / m.mass)
    np.testing.assert_allclose(np.repeat(d, 3), ref, rtol=1e-12)
    # the Delassus diagonal is below the mass-based one: A >= M
    f = factorize(setup[1])
    W_hat = scalar_delassus_columns(lambda X: f.solve(X.toarray()), cs.selection_matrix(n))
    assert np.all(np.diag(W_hat) < d)


@pytest.mark.parametrize("unit_columns", [False, True])
@pytest.mark.parametrize("kind", ["sparse-inverse", "cholesky"])
def test_delassus_with_held_vertices_through_global_step(setup, kind, unit_columns):
    """With held vertices eliminated by the PD global step, W_hat = B_f^T A_ff^-1 B_f; with
    unit_columns the vertex-collider columns are named (their rows of Z^T are gathered from
    S^T, empty for held vertices), else every column is formed as a general one."""
    from tisim.contact.ncp.pd_contact import PDContact
    from tisim.solvers.pd.config import PDConfig
    from tisim.solvers.pd.global_step import build_global_step

    m, A, cs = setup
    n = m.vertex_count
    held = np.arange(0, n, 7)
    g = build_global_step(kind, A.tocsr(), held, PDConfig())
    contact = PDContact(m, m.scene.contact, g)
    B = cs.selection_matrix(n)
    vertex = np.where(cs.collider >= 0, cs.vertices[:, 0], -1) if unit_columns else None
    if unit_columns:
        assert np.isin(vertex, held).any() and (vertex < 0).any()  # held and general columns
    W_hat = contact._scalar_delassus(B, vertex)
    free = np.setdiff1d(np.arange(n), held)
    Af = A.toarray()[np.ix_(free, free)]
    Bf = B.toarray()[free]
    ref = Bf.T @ np.linalg.solve(Af, Bf)
    np.testing.assert_allclose(W_hat, ref, atol=1e-12 * np.abs(ref).max())


def test_auto_choosing_cholesky_hands_its_sparse_inverse_to_contact(setup, monkeypatch):
    """ "auto" builds S to time it; when Cholesky wins and contact needs W, contact takes
    that S instead of building it again (one build, handed over once), and W_hat is
    still B^T A^-1 B."""
    import tisim.linalg.sparse_inverse as sim
    import tisim.solvers.pd.global_step as gsm
    from tisim.contact.ncp.pd_contact import PDContact
    from tisim.solvers.pd.config import PDConfig

    m, A, cs = setup
    n = m.vertex_count
    builds = []
    real = sim.sparse_inverse

    def counted(*a, **kw):
        builds.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(gsm, "sparse_inverse", counted)
    monkeypatch.setattr(sim, "sparse_inverse", counted)
    monkeypatch.setattr(gsm, "_time_apply", lambda g, kernels: 1.0 if g.name == "sparse-inverse" else 0.5)
    g = gsm.build_global_step(
        "auto", A.tocsr(), np.zeros(0, np.int64), PDConfig(), kernels=object(), keep_sparse_inverse=True
    )
    assert g.name == "cholesky" and len(builds) == 1
    contact = PDContact(m, m.scene.contact, g)
    B = cs.selection_matrix(n)
    W_hat = contact._scalar_delassus(B)
    assert len(builds) == 1 and g.take_sparse_inverse() is None  # taken, not held twice
    ref = B.toarray().T @ np.linalg.solve(A.toarray(), B.toarray())
    np.testing.assert_allclose(W_hat, ref, atol=1e-12 * np.abs(ref).max())


def test_delassus_builder_cache_matches_fresh(setup, rng):
    """Across steps with overlapping contact sets, cached entries equal a fresh build."""
    from tisim.contact.ncp.delassus import DelassusBuilder
    from tisim.linalg.sparse_inverse import sparse_inverse

    m, A, _ = setup
    n = m.vertex_count
    si = sparse_inverse(factorize(A))
    builder = DelassusBuilder(si.ST, si.perm, n)
    surface = np.unique(m.surface)
    first = rng.choice(surface, size=30, replace=False)
    second = np.concatenate([first[:20], rng.choice(np.setdiff1d(surface, first), size=10, replace=False)])
    for step, verts in enumerate([first, second, second[::-1], rng.choice(surface, size=25, replace=False)]):
        k = len(verts)
        cols, rows, vals = list(range(k)), list(verts), [1.0] * k
        for j in range(2):  # two vertex-triangle columns: e_v - sum beta e_tri
            tri = m.surface[rng.integers(len(m.surface))]
            v = rng.choice(np.setdiff1d(surface, tri))
            beta = rng.dirichlet(np.ones(3))
            cols += [k + j] * 4
            rows += [v, *tri]
            vals += [1.0, *(-beta)]
        B = sp.csc_matrix((vals, (rows, cols)), shape=(n, k + 2))
        vertex = np.concatenate([verts, [-1, -1]])
        W = builder.scalar(B, vertex)
        ref = scalar_delassus_sparse_inverse(si.S, si.perm, B)
        np.testing.assert_allclose(W, ref, atol=1e-13 * np.abs(ref).max())
        expected_new = {0: k + 2, 1: 10 + 2, 2: 2}.get(step)
        if expected_new is not None:
            assert builder.last_new_rows == expected_new
