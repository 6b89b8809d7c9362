"""The cloth's elastic sums repeat bit for bit on the CPU backend.

Energies, gradients and the Hessian's CSR values are sums of per-face and per-hinge
terms into shared entries. With parallel atomic adds (the code before
backend.SERIAL_SUMS) their order, and so their rounding, changed from call to call:
on this 64 x 64 sheet about half of 20 repeated evaluations differed in the last bits
of the energy and gradient, and two identical multi-threaded refines drifted apart by
1e-6 m within 30 frames. Now those loops run on one thread on the CPU backend, and the
same call gives the same bits (the whole-run property is checked in
tests/verification/test_progressive.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tisim import backend
from tisim.energies.shell import hinges as mesh_hinges
from tisim.energies.shell import lame_plane_stress
from tisim.geometry.generate import cloth_grid


def test_shell_sums_repeat_bit_for_bit(taichi_backend):
    if not backend.SERIAL_SUMS:
        pytest.skip("parallel atomic sums on GPU backends are reproducible to round-off only")
    from tisim.energies.shell import StrainLimit
    from tisim.solvers.cloth.solver import ShellTerm, _StrainTerm

    m = cloth_grid((1.0, 1.0), (63, 63))
    X, F = np.asarray(m.vertices, float), np.asarray(m.faces)
    mu, lam = lame_plane_stress(1e5, 0.3)
    hg = mesh_hinges(F)
    nf = len(F)
    term = ShellTerm(len(X), F, hg, X, np.full(nf, mu), np.full(nf, lam), np.full(nf, 1e-3), np.full(len(hg), 0.05))
    # stretched by 0.5 % and crumpled: the strain limit (1 %) is active on some faces
    x = X * 1.005 + 1e-3 * np.random.default_rng(0).standard_normal(X.shape)
    strain = _StrainTerm(StrainLimit, len(X), F, X, 1.01, 1e3, term.x.dtype)
    assert term.fold_strain(strain)
    E0, g0, H0 = term.evaluate(x)
    assert strain.active(term.x) and np.isfinite(E0) and np.abs(g0).max() > 0
    for _ in range(16):
        E, g, H = term.evaluate(x)
        assert E == E0
        assert np.array_equal(g, g0)
        assert np.array_equal(H.indices, H0.indices) and np.array_equal(H.data, H0.data)
