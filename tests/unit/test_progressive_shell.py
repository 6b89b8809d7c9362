"""The prolonged shell's restricted Hessian U3^T H U3 (tisim.progressive.shell) on an
irregular hierarchy: a decimated sphere, whose prolongation has nonzero extrinsic
offsets and an uneven number of coarse hosts per fine vertex. The block-wise map, built
once per pattern, must give scipy's triple product to round-off and the scalar map's
values bit for bit; a pattern without full 3x3 blocks takes the scalar map."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tisim.geometry.generate import icosphere
from tisim.geometry.hierarchy import Level, build_hierarchy


@pytest.fixture(scope="module")
def decimated():
    from tisim import backend
    from tisim.energies.shell import hinges as mesh_hinges
    from tisim.solvers.cloth.solver import ShellTerm

    backend.init("cpu", "f64")
    m = icosphere(3)
    H = build_hierarchy(Level.from_mesh(0.3 * m.vertices, m.faces, 0.2), 2, "decimate", coarse_vertices=(60, 120))
    fine = H.finest
    nf = len(fine.faces)
    hg = mesh_hinges(fine.faces)
    term = ShellTerm(
        fine.vertex_count,
        fine.faces,
        hg,
        fine.vertices,
        np.full(nf, 3e4),
        np.full(nf, 2e4),
        np.full(nf, 1e-3),
        np.full(len(hg), 1e-3),
    )
    return H, term


def _csr(parts, n):
    _, _, apply, indptr, indices = parts
    return lambda data: sp.csr_matrix((apply(data), indices, indptr), shape=(n, n))


def test_block_restriction_matches_scipy_and_the_scalar_map(decimated):
    from tisim.progressive import ProlongedShell
    from tisim.progressive.shell import _restriction_map, _scalar_restriction_map

    H, term = decimated
    P = H.to_finest(0)
    x0 = H.levels[0].vertices
    assert np.abs(P.offsets(x0)).max() > 1e-4  # the irregular case: offsets matter
    rng = np.random.default_rng(5)
    shell = ProlongedShell(term, P)
    U3 = P.U3
    nc = U3.shape[1]
    for _ in range(2):  # the second call reuses the cached map
        x = x0 + 0.01 * rng.standard_normal(x0.shape)
        _, _, C = shell.evaluate(x)
        _, _, Hf = term.evaluate(P.U @ x + shell._a, folded=False)
        Hf = sp.csr_matrix(Hf)
        R = (U3.T @ Hf @ U3).toarray()
        assert np.abs(C.toarray() - R).max() <= 1e-13 * np.abs(R).max()
        block, scalar = _restriction_map(Hf, P.U), _scalar_restriction_map(Hf, P.U)
        Cb, Cs = _csr(block, nc)(Hf.data), _csr(scalar, nc)(Hf.data)
        np.testing.assert_array_equal(Cb.indptr, Cs.indptr)
        np.testing.assert_array_equal(Cb.indices, Cs.indices)
        np.testing.assert_array_equal(Cb.data, Cs.data)  # the same sums in the same order


def test_a_pattern_without_full_blocks_takes_the_scalar_map(decimated):
    from tisim.progressive.shell import _restriction_map

    H, _ = decimated
    P = H.to_finest(0)
    n = 3 * H.finest.vertex_count
    B = sp.random(n, n, density=0.01, random_state=3, format="csr")
    B.sort_indices()
    C = _csr(_restriction_map(B, P.U), P.U3.shape[1])(B.data)
    np.testing.assert_allclose(C.toarray(), (P.U3.T @ B @ P.U3).toarray(), atol=1e-13 * abs(B).max())
