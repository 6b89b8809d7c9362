"""Sparse Cholesky behind one interface: CHOLMOD and the scipy fallback."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tisim.geometry import generate
from tisim.geometry.precompute import gradient_operator, lumped_mass, tet_rest
from tisim.linalg.cholesky import FactorizationError, cholmod_available, factorize


def pd_matrix(resolution=(4, 2, 2), h=0.01, mass_scale=1.0):
    """A_hat = M + h^2 G^T W G of a small box (the solver's scalar matrix)."""
    mesh = generate.box((1.0, 0.2, 0.2), resolution)
    rest = tet_rest(mesh)
    n = mesh.vertex_count
    m = lumped_mass(mesh, 1000.0, rest.volume) * mass_scale
    G = gradient_operator(mesh.tets, rest.grad, n)
    w = 2 * 4e4 * rest.volume
    return (sp.diags(m) + h * h * (G.T @ sp.diags(np.repeat(w, 3)) @ G)).tocsc()


BACKENDS = ["scipy"] + (["cholmod"] if cholmod_available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ordering", ["auto", "natural", "amd"])
def test_factor_reproduces_permuted_matrix(backend, ordering):
    A = pd_matrix()
    f = factorize(A, ordering, backend)
    assert f.backend == backend
    L = f.L.toarray()
    assert np.allclose(np.triu(L, 1), 0.0)
    Ap = A.toarray()[np.ix_(f.perm, f.perm)]
    assert np.allclose(L @ L.T, Ap, rtol=0, atol=1e-12 * abs(Ap).max())
    assert sorted(f.perm.tolist()) == list(range(A.shape[0]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_solve_matches_dense(backend, rng):
    A = pd_matrix((5, 2, 3))
    f = factorize(A, "auto", backend)
    b = rng.standard_normal((A.shape[0], 3))
    x = f.solve(b)
    ref = np.linalg.solve(A.toarray(), b)
    assert np.linalg.norm(x - ref) <= 1e-12 * np.linalg.norm(ref)
    x1 = f.solve(b[:, 0])
    assert x1.shape == (A.shape[0],)
    assert np.allclose(x1, ref[:, 0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_mass_is_a_factorization_error(backend):
    # no mass: A = h^2 K is singular (rigid motions are in its null space)
    A = pd_matrix(mass_scale=0.0)
    with pytest.raises(FactorizationError, match=r"positive definite|singular"):
        factorize(A, "auto", backend)


def test_bad_matrices_raise():
    with pytest.raises(FactorizationError, match="square"):
        factorize(sp.csc_matrix(np.ones((2, 3))))
    with pytest.raises(FactorizationError, match="symmetric"):
        factorize(sp.csc_matrix(np.array([[2.0, 1.0], [0.0, 2.0]])))
    with pytest.raises(FactorizationError, match="diagonal entry 1"):
        factorize(sp.csc_matrix(np.diag([1.0, 0.0, 1.0])))
    with pytest.raises(FactorizationError):  # symmetric, positive diagonal, indefinite
        factorize(sp.csc_matrix(np.array([[1.0, 2.0], [2.0, 1.0]])))
