"""Sparse inverse S = L^-1 (notes §2.3, §5.1): identity, elimination-tree structure, memory."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tisim.geometry import generate
from tisim.geometry.precompute import gradient_operator, lumped_mass, tet_rest
from tisim.linalg.cholesky import cholmod_available, factorize
from tisim.linalg.sparse_inverse import (
    SparseInverseTooLarge,
    elimination_tree,
    etree_depths,
    etree_from_factor,
    predict_memory_mb,
    predict_nnz,
    sparse_inverse,
)


def system(mesh, h=0.01, E=1e5):
    """The solver's scalar matrix A_hat = M + h^2 sum w G^T G of a tet mesh."""
    rest = tet_rest(mesh)
    n = mesh.vertex_count
    m = lumped_mass(mesh, 1000.0, rest.volume)
    G = gradient_operator(mesh.tets, rest.grad, n)
    w = 2 * E / 2.6 * rest.volume
    return (sp.diags(m) + h * h * (G.T @ sp.diags(np.repeat(w, 3)) @ G)).tocsc()


def random_spd(n=300, seed=3):
    rng = np.random.default_rng(seed)
    B = sp.random(n, n, density=4.0 / n, random_state=rng)
    B = B + B.T
    lap = sp.diags(np.asarray(abs(B).sum(axis=1)).ravel()) - B  # weighted graph Laplacian (PSD)
    return (lap + sp.diags(rng.uniform(0.1, 1.0, n))).tocsc()


MESHES = {
    "bar-5tet": lambda: system(generate.box((1.0, 0.2, 0.2), (12, 3, 3))),
    "cube-6tet": lambda: system(generate.box((1.0, 1.0, 1.0), (5, 5, 5), tets_per_cell=6)),
    "ball": lambda: system(generate.ball(0.5, 6)),
    "stiff-bar": lambda: system(generate.box((1.0, 0.2, 0.2), (10, 2, 2)), E=1e9),
    "random-spd": random_spd,
}
BACKENDS = ["scipy"] + (["cholmod"] if cholmod_available() else [])


@pytest.mark.parametrize("name", sorted(MESHES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_inverse_identity_against_direct_solve(name, backend, rng):
    """P^T S^T S P b = A^-1 b to 1e-10 relative (f64), A^-1 b from a dense direct solve."""
    A = MESHES[name]()
    f = factorize(A, "auto", backend)
    si = sparse_inverse(f)
    b = rng.standard_normal((A.shape[0], 3))
    ref = np.linalg.solve(A.toarray(), b)
    x = si.solve(b)
    assert np.linalg.norm(x - ref) <= 1e-10 * np.linalg.norm(ref)
    # written out with the permutation: y = b[p]; y = S^T S y; x[p] = y
    y = si.ST @ (si.S @ b[f.perm])
    x2 = np.empty_like(y)
    x2[f.perm] = y
    assert np.linalg.norm(x2 - ref) <= 1e-10 * np.linalg.norm(ref)
    # S really is L^-1
    assert np.allclose((si.S @ f.L).toarray(), np.eye(A.shape[0]), atol=1e-10)


@pytest.mark.parametrize("name", sorted(MESHES))
def test_structure_is_the_elimination_tree_paths(name):
    """Column j of S is stored exactly on the etree path of j; nnz = sum of depths;
    every numerically non-zero entry of the dense L^-1 lies on those paths."""
    A = MESHES[name]()
    f = factorize(A)
    si = sparse_inverse(f)
    n = A.shape[0]
    # the etree of the permuted matrix, by Liu's algorithm (independent of the factor)
    parent = elimination_tree(A[f.perm][:, f.perm])
    assert np.array_equal(parent, etree_from_factor(f.L))
    depth = etree_depths(parent)
    assert si.nnz == si.S.nnz == int(depth.sum()) == predict_nnz(parent)
    pattern = np.zeros((n, n), dtype=bool)
    for j in range(n):
        i = j
        while i != -1:
            pattern[i, j] = True
            i = parent[i]
    stored = si.S.toarray() != 0  # numerically non-zero entries
    Sc = si.S.tocsc()
    struct = np.zeros((n, n), dtype=bool)
    for j in range(n):
        struct[Sc.indices[Sc.indptr[j] : Sc.indptr[j + 1]], j] = True
    assert np.array_equal(struct, pattern)
    assert not np.any(stored & ~pattern)
    dense_inv = np.linalg.inv(f.L.toarray())
    tol = 1e-12 * abs(dense_inv).max()
    assert not np.any((abs(dense_inv) > tol) & ~pattern)


def test_depths_of_a_chain_and_a_star():
    chain = np.array([1, 2, 3, -1])
    assert etree_depths(chain).tolist() == [4, 3, 2, 1]
    star = np.array([3, 3, 3, -1])
    assert etree_depths(star).tolist() == [2, 2, 2, 1]
    with pytest.raises(ValueError):
        etree_depths(np.array([-1, 0]))  # a parent with a smaller index is no etree


def test_tridiagonal_inverse_factor_is_dense_lower():
    """A tridiagonal matrix has a chain etree: S is the full lower triangle."""
    n = 12
    A = sp.diags([-np.ones(n - 1), 2.5 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1]).tocsc()
    f = factorize(A, "natural")
    si = sparse_inverse(f)
    assert si.nnz == n * (n + 1) // 2
    assert np.allclose(si.S.toarray(), np.linalg.inv(f.L.toarray()), atol=1e-13)


def test_memory_limit_is_checked_before_building():
    A = MESHES["bar-5tet"]()
    f = factorize(A)
    nnz = predict_nnz(etree_from_factor(f.L))
    mb = predict_memory_mb(nnz, A.shape[0])
    with pytest.raises(SparseInverseTooLarge) as e:
        sparse_inverse(f, memory_limit_mb=0.5 * mb)
    assert e.value.nnz == nnz and e.value.predicted_mb == pytest.approx(mb)
    si = sparse_inverse(f, memory_limit_mb=2 * mb)
    assert si.memory_both_mb <= mb + 1e-3  # the prediction bounds what is stored
    assert si.memory_both_mb == pytest.approx(mb, rel=0.05)


def test_half_columns_give_the_delassus_operator(rng):
    """Z = S P B gives B^T A^-1 B = Z^T Z (notes §2.8)."""
    A = MESHES["ball"]()
    f = factorize(A)
    si = sparse_inverse(f)
    n = A.shape[0]
    cols = rng.choice(n, 7, replace=False)
    B = sp.csr_matrix((rng.standard_normal(7), (cols, np.arange(7))), shape=(n, 7))
    Z = si.half_columns(B)
    W = (Z.T @ Z).toarray()
    ref = B.T.toarray() @ np.linalg.solve(A.toarray(), B.toarray())
    assert np.allclose(W, ref, rtol=1e-10, atol=1e-14 * abs(ref).max())


@pytest.mark.parametrize("name", ["ball", "random-spd"])
def test_entry_parallel_kernel_matches_column_kernel(name):
    """The GPU kernel (one thread per entry of S, used off the CPU backend) gives the same
    S as the CPU kernel (one thread per column) to round-off, and S L = I."""
    A = MESHES[name]()
    f = factorize(A, "auto", BACKENDS[0])
    by_column = sparse_inverse(f, entry_parallel=False)
    by_entry = sparse_inverse(f, entry_parallel=True)
    assert np.array_equal(by_entry.ST.indices, by_column.ST.indices)
    scale = np.abs(by_column.ST.data).max()
    assert np.abs(by_entry.ST.data - by_column.ST.data).max() <= 1e-13 * scale
    assert np.allclose((by_entry.S @ f.L).toarray(), np.eye(A.shape[0]), atol=1e-10)


def test_entry_parallel_kernel_on_a_deep_dense_tree():
    """A dense 420 x 420 factor: its etree is one chain, and the column at depth 420 needs
    ~88k inner iterations in the one-thread-a-column kernel, beyond the 65,535 loop
    iterations Mesa's lavapipe runs per shader invocation (it truncated those columns, so
    W and the squeeze-ball demo were wrong under Vulkan). Each thread of the entry kernel
    runs one column of L; on the CPU both must equal the dense inverse."""
    rng = np.random.default_rng(0)
    n = 420
    M = 0.01 * rng.standard_normal((n, n))
    Ld = np.linalg.cholesky(M @ M.T + np.eye(n))

    class _Factor:
        L = sp.csc_matrix(Ld)
        perm = np.arange(n)

    ref = np.linalg.inv(Ld)
    for entry in (False, True):
        si = sparse_inverse(_Factor, entry_parallel=entry)
        assert si.depth.max() == n
        assert np.abs(si.S.toarray() - ref).max() < 1e-12
