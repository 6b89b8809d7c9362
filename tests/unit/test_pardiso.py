"""MKL PARDISO behind the cloth's Newton solve, and the system's structural pattern.

PARDISO is checked against a dense solve; its analysis reuse against a fresh solver (bit
for bit: the result must not depend on which matrices came before); its reproducibility
mode across thread counts; the structural sum against scipy's."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tisim.linalg import pardiso
from tisim.solvers.cloth.assembly import structural_sum

needs_mkl = pytest.mark.skipif(not pardiso.available(), reason="MKL PARDISO not installed (pip install mkl)")


def spd_system(n_side=12, seed=0, zero_fraction=0.0):
    """A 2-D-mesh-like SPD matrix over 3 dofs per vertex (a grid Laplacian's pattern in
    3 x 3 blocks, random SPD blocks) and a right-hand side; zero_fraction of the stored
    values set to exactly zero, kept as explicit entries (then no longer SPD: for the
    structural sum only)."""
    rng = np.random.default_rng(seed)
    nv = n_side * n_side
    idx = np.arange(nv).reshape(n_side, n_side)
    pairs = np.concatenate(
        [
            np.stack([idx[:, :-1].ravel(), idx[:, 1:].ravel()], 1),
            np.stack([idx[:-1, :].ravel(), idx[1:, :].ravel()], 1),
            np.stack([idx[:-1, :-1].ravel(), idx[1:, 1:].ravel()], 1),
        ]
    )
    rows, cols, vals = [], [], []
    for a, b in pairs:  # an element Hessian [[K, -K], [-K, K]], K SPD: the sum is PSD
        B = rng.standard_normal((3, 3))
        K = B @ B.T
        for (i, j), s in (((a, a), 1), ((b, b), 1), ((a, b), -1), ((b, a), -1)):
            r, c = np.meshgrid(3 * i + np.arange(3), 3 * j + np.arange(3), indexing="ij")
            rows.append(r.ravel()), cols.append(c.ravel()), vals.append(s * K.ravel())
    n = 3 * nv
    rows.append(np.arange(n)), cols.append(np.arange(n)), vals.append(np.full(n, 0.5))  # mass
    A = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n)).tocsr()
    A.sum_duplicates()
    if zero_fraction:
        off = np.flatnonzero(np.repeat(np.arange(n), np.diff(A.indptr)) != A.indices)
        hit = rng.choice(off, int(zero_fraction * len(off)), replace=False)
        A.data[hit] = 0.0
    b = rng.standard_normal(n)
    return sp.csr_matrix(A), b


@needs_mkl
def test_solution_matches_a_dense_solve():
    A, b = spd_system()
    s = pardiso.Pardiso()
    s.factorize(pardiso.UpperTriangle()(A))
    x = s.solve(b)
    ref = np.linalg.solve(A.toarray(), b)
    assert np.linalg.norm(x - ref) <= 1e-12 * np.linalg.norm(ref)
    X = s.solve(np.stack([b, 2 * b + 1], axis=1))  # several right-hand sides
    ref2 = np.linalg.solve(A.toarray(), 2 * b + 1)
    assert np.linalg.norm(X[:, 1] - ref2) <= 1e-12 * np.linalg.norm(ref2)
    np.testing.assert_allclose(X[:, 0], x, rtol=0, atol=1e-13 * np.abs(x).max())  # blocked: not bitwise


@needs_mkl
def test_single_precision_solves_to_float32_accuracy():
    """iparm[27] = 1: the factor and the solve in float32, the result handed back as float64
    with a residual at float32's level (neither exact nor far off)."""
    A, b = spd_system()
    s = pardiso.Pardiso(single=True)
    s.factorize(pardiso.UpperTriangle()(A))
    x = s.solve(b)
    assert x.dtype == np.float64
    res = np.linalg.norm(A @ x - b) / np.linalg.norm(b)
    assert 1e-12 < res < 1e-4


@needs_mkl
def test_mixed_precision_newton_solve_matches_a_dense_solve():
    """SPDSolver(mixed=True) (solver.linear_precision = "mixed"): a float32 factor refined
    against A in float64 gives the dense solve's answer to 1e-9, without falling back."""
    from tisim.solvers.cloth.solver import SPDSolver

    A, b = spd_system()
    s = SPDSolver("pardiso", mixed=True)
    ref = np.linalg.solve(A.toarray(), b)
    for k in range(2):  # a second matrix of the same pattern reuses the float32 analysis
        x = s.solve(A * (1 + k), b)
        assert np.linalg.norm(x - ref / (1 + k)) <= 1e-9 * np.linalg.norm(ref)
    assert s.fallbacks == 0
    assert s._pardiso32.analysed == 1 and s._pardiso.analysed == 0


@needs_mkl
@pytest.mark.parametrize("case", ["singular in float32", "ill-conditioned"])
def test_mixed_precision_falls_back_to_double_when_float32_is_not_enough(case):
    """A system that float32 cannot factorise (SPD in double, exactly singular once rounded
    to float32) or cannot refine (condition number 1e9, beyond float32's 1e7): the solve
    is redone in double precision and is as accurate as a double-precision solve."""
    from tisim.solvers.cloth.solver import SPDSolver

    rng = np.random.default_rng(1)
    if case == "singular in float32":
        e = 1e-9
        A = np.array([[1.0, 1 - e], [1 - e, 1.0]])
        b = np.array([1.0, 0.0])
    else:
        n = 40
        Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        A = Q @ np.diag(np.logspace(0, -9, n)) @ Q.T
        A = 0.5 * (A + A.T)
        b = rng.standard_normal(n)
    s = SPDSolver("pardiso", mixed=True)
    x = s.solve(sp.csr_matrix(A), b)
    ref = np.linalg.solve(A, b)
    assert s.fallbacks == 1
    assert np.linalg.norm(x - ref) <= 1e-6 * np.linalg.norm(ref)
    # float32 alone fails on the same system, or is far off
    p32 = pardiso.Pardiso(single=True)
    try:
        p32.factorize(pardiso.UpperTriangle()(sp.csr_matrix(A)))
    except pardiso.NotPositiveDefinite:
        return
    assert np.linalg.norm(p32.solve(b) - ref) > 1e-3 * np.linalg.norm(ref)


@needs_mkl
def test_analysis_is_reused_for_the_same_pattern_and_results_do_not_depend_on_it():
    A, b = spd_system()
    A2 = A.copy()
    A2.data = A2.data * (1 + 0.1 * np.sin(np.arange(A2.nnz)))  # same pattern, new values
    A2 = sp.csr_matrix((A2 + A2.T) * 0.5) + sp.identity(A.shape[0], format="csr")
    assert A2.nnz == A.nnz
    s = pardiso.Pardiso()
    for M in (A, A2, A):
        s.factorize(pardiso.UpperTriangle()(M))
        x = s.solve(b)
        fresh = pardiso.Pardiso()
        fresh.factorize(pardiso.UpperTriangle()(M))
        np.testing.assert_array_equal(x, fresh.solve(b))  # history leaves no trace
    assert s.analysed == 1 and s.factored == 3
    B, _ = spd_system(n_side=11, seed=1)  # another pattern: analysed anew
    s.factorize(pardiso.UpperTriangle()(B))
    assert s.analysed == 2


@needs_mkl
def test_factor_nonzeros_are_reported_for_each_pattern():
    """PARDISO writes the factor's size into iparm[17] only when asked (a negative value on
    entry): every analysis asks again, so a reused solver reports the current pattern's
    count, the one a fresh solver reports (it used to keep the first pattern's)."""
    counts = []
    s = pardiso.Pardiso()
    for n in (20, 50, 200):
        T = sp.diags([-np.ones(n - 1), 4 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1], format="csr")
        s.factorize(pardiso.UpperTriangle()(T))
        fresh = pardiso.Pardiso()
        fresh.factorize(pardiso.UpperTriangle()(T))
        assert s.factor_nonzeros == fresh.factor_nonzeros
        counts.append(s.factor_nonzeros)
    # a tridiagonal matrix's factor has no fill: about 2n entries
    assert counts[0] < counts[1] < counts[2]
    assert all(2 * n - 1 <= c <= 2 * n + 2 for n, c in zip((20, 50, 200), counts))


@needs_mkl
def test_reproducible_across_thread_counts():
    """Conditional numerical reproducibility (iparm[33]): one thread and two threads give
    the same bits, and repeated factorisations too."""
    A, b = spd_system(n_side=40, seed=3)
    U = pardiso.UpperTriangle()(A)
    out = []
    for threads in (1, 2, 2, 1):
        s = pardiso.Pardiso(threads=threads)
        s.factorize(U)
        out.append(s.solve(b))
        s.release()
    for x in out[1:]:
        np.testing.assert_array_equal(x, out[0])


@needs_mkl
def test_a_matrix_that_is_not_positive_definite_is_reported():
    A, _ = spd_system()
    bad = A - sp.identity(A.shape[0], format="csr") * (2 * abs(A.diagonal()).max())
    s = pardiso.Pardiso()
    with pytest.raises(pardiso.NotPositiveDefinite):
        s.factorize(pardiso.UpperTriangle()(bad))


def test_structural_sum_keeps_zero_entries_and_adds_exactly():
    A, _ = spd_system(n_side=6, zero_fraction=0.3)
    assert (A.data == 0).any()
    rng = np.random.default_rng(5)
    k = 400
    r = rng.integers(0, A.shape[0], k)
    c = rng.integers(0, A.shape[0], k)
    v = rng.standard_normal(k)
    v[:50] = 0.0  # zero triplets are structure too
    S = structural_sum(A, r, c, v)
    ref = A + sp.coo_matrix((v, (r, c)), shape=A.shape).tocsr()
    np.testing.assert_array_equal(S.toarray(), ref.toarray())  # the same values, bit for bit
    pattern = set(zip(*A.nonzero())) | set(zip(r.tolist(), c.tolist()))
    stored = set(zip(np.repeat(np.arange(S.shape[0]), np.diff(S.indptr)).tolist(), S.indices.tolist()))
    A_stored = set(zip(np.repeat(np.arange(A.shape[0]), np.diff(A.indptr)).tolist(), A.indices.tolist()))
    assert stored == A_stored | set(zip(r.tolist(), c.tolist()))
    assert len(stored) > ref.nnz  # scipy's sum dropped entries that are structure here
    assert pattern <= stored


def test_newton_systems_of_a_falling_sheet_share_one_pattern():
    """The Newton system's pattern follows the elements and the pairs, not the values:
    a sheet falling flat (its bending blocks and compressed faces' clamped modes have
    exact zeros that come and go) is analysed once, then only factorised. Before the
    structural sum every few iterations asked for a new analysis."""
    from tisim import backend

    backend.init("cpu", "f64")
    from tisim.cli.app import demos_dir
    from tisim.runner import build
    from tisim.scene import load_scene

    sc = load_scene(demos_dir() / "cloth-drape.toml", ["objects.cloth.cloth_resolution=[12,12]"])
    _binfo, model, solver = build(sc, "cpu", "f64")
    seen = []
    solve = solver.linear.solve

    def record(system, b):
        A = system.matrix()  # (the solver hands over its SystemAssembler)
        seen.append((A.indptr.copy(), A.indices.copy(), bool((A.data == 0).any())))
        return solve(system, b)

    solver.linear.solve = record
    st, spare = model.initial_state(), model.initial_state()
    for _ in range(6):
        solver.step(st, spare, sc.sim.dt)
        st, spare = spare, st
    assert len(seen) >= 6
    assert any(z for _, _, z in seen)  # zero values were there to be dropped
    for indptr, indices, _ in seen[1:]:
        np.testing.assert_array_equal(indptr, seen[0][0])
        np.testing.assert_array_equal(indices, seen[0][1])


def test_upper_triangle_with_a_kept_mask_equals_scipys():
    A, _ = spd_system(n_side=7, zero_fraction=0.2)  # explicit zeros stay entries
    up = pardiso.UpperTriangle()
    for M in (A, A * 2.0, A):  # the second and third calls reuse the mask
        U = up(M)
        ref = sp.triu(M, format="csr")
        np.testing.assert_array_equal(U.indptr, ref.indptr)
        np.testing.assert_array_equal(U.indices, ref.indices)
        np.testing.assert_array_equal(U.data, ref.data)
    B, _ = spd_system(n_side=5, seed=2)  # another pattern
    np.testing.assert_array_equal(up(B).toarray(), sp.triu(B).toarray())


def test_without_mkl_the_cloth_solver_uses_cholmod(monkeypatch):
    """TISIM_NO_PARDISO (or no mkl wheel): PARDISO is unavailable and the Newton solve
    falls back to CHOLMOD, then scipy, with the same answer."""
    from tisim.linalg.cholesky import cholmod_available
    from tisim.solvers.cloth.solver import SPDSolver

    A, b = spd_system(n_side=6)
    monkeypatch.setenv("TISIM_NO_PARDISO", "1")
    assert not pardiso.available()
    s = SPDSolver()
    assert s.backend == ("cholmod" if cholmod_available() else "scipy")
    with pytest.raises(ValueError, match="pip install mkl"):
        SPDSolver("pardiso")
    x = s.solve(A, b)
    np.testing.assert_allclose(A @ x, b, rtol=0, atol=1e-10 * np.abs(b).max())


def test_mixed_precision_without_mkl_says_so_and_solves_in_double(monkeypatch, caplog):
    """solver.linear_precision = "mixed" without PARDISO: one warning naming the key, and
    the Newton systems solved in double precision by the fallback."""
    import logging

    from tisim.model import Model
    from tisim.scene import scene_from_dict
    from tisim.solvers.cloth.solver import SolverCloth

    monkeypatch.setenv("TISIM_NO_PARDISO", "1")
    cloth = {
        "kind": "cloth",
        "generator": "cloth",
        "cloth_size": [0.2, 0.2],
        "cloth_resolution": [2, 2],
        "youngs_modulus": 1e5,
        "poisson_ratio": 0.3,
        "thickness": 1e-3,
        "density": 200.0,
    }
    sc = scene_from_dict(
        {"solver": {"type": "cloth", "linear_precision": "mixed"}, "objects": {"c": cloth}, "sim": {"dt": 0.01}}, None
    )
    with caplog.at_level(logging.WARNING, logger="tisim.solvers.cloth.solver"):
        solver = SolverCloth(Model.from_scene(sc), sc.solver)
    assert solver.linear.backend != "pardiso" and solver.linear._pardiso32 is None
    assert any("linear_precision" in r.getMessage() for r in caplog.records)


def test_block_upper_holds_the_upper_blocks_of_a_blocked_matrix():
    """BlockUpper: the block upper triangle of a matrix made of whole 3 x 3 blocks (diagonal
    blocks full, row-major within a block), the same as scipy's BSR conversion; a second
    matrix with the same pattern reuses the map; a pattern that is not made of whole blocks
    (an entry taken out) gives None."""
    A, _ = spd_system(n_side=5, seed=3)
    bu = pardiso.BlockUpper(3)
    U = bu(A)
    assert U is not None and U.blocksize == (3, 3)
    ref = sp.bsr_matrix(A, blocksize=(3, 3))
    ref.sort_indices()
    keep = ref.indices >= np.repeat(np.arange(A.shape[0] // 3), np.diff(ref.indptr))
    np.testing.assert_array_equal(U.data, ref.data[keep])
    np.testing.assert_array_equal(U.indices, ref.indices[keep])
    # densely: A's entries whose block column is at or right of their block row, the rest 0
    r, c = np.indices(A.shape)
    np.testing.assert_array_equal(sp.csr_matrix(U).toarray(), np.where(c // 3 >= r // 3, A.toarray(), 0.0))
    B = A.copy()
    B.data = B.data * 2.0 + 1.0
    np.testing.assert_array_equal(bu(B).data, 2.0 * U.data + 1.0)
    C = A.tolil()
    C[0, 4] = 0.0  # keep the value, lose the entry: the (0, 1) block is no longer whole
    C = sp.csr_matrix(C)
    C.eliminate_zeros()
    assert bu(C) is None
    assert pardiso.BlockUpper(3)(sp.csr_matrix(np.eye(4))) is None  # 4 is not a multiple of 3


@needs_mkl
def test_block_input_solves_like_the_triangle():
    """The BSR input (iparm[36] = 3) solves the same system as the CSR triangle, to
    round-off, and a solver switches between the two inputs with a fresh analysis."""
    A, b = spd_system(seed=4)
    ref = np.linalg.solve(A.toarray(), b)
    s = pardiso.Pardiso()
    s.factorize(pardiso.BlockUpper(3)(A))
    x = s.solve(b)
    assert np.linalg.norm(x - ref) <= 1e-12 * np.linalg.norm(ref)
    assert s.factor_nonzeros >= (A.nnz + A.shape[0]) // 2
    s.factorize(pardiso.UpperTriangle()(A))
    assert s.analysed == 2
    assert np.linalg.norm(s.solve(b) - ref) <= 1e-12 * np.linalg.norm(ref)
    s.factorize(pardiso.BlockUpper(3)(A))
    assert s.analysed == 3
    assert np.linalg.norm(s.solve(b) - ref) <= 1e-12 * np.linalg.norm(ref)
