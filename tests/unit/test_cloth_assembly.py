"""The cloth solver's elastic Hessian as it assembles it: membrane Hessians projected onto
the PSD cone in F-space (6 x 6) on the device and summed into CSR values there, plus the
Gauss-Newton bending Hessians. Checked against numpy: the raw 9 x 9 Hessians the
energy module computes (themselves checked against finite differences in
test_shell_energy.py), mapped to F-space through D = dF/dx, eigen-clamped by LAPACK,
mapped back and summed with scipy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tisim.energies.shell import hinges as mesh_hinges
from tisim.energies.shell import lame_plane_stress
from tisim.geometry.generate import cloth_grid

YOUNG, POISSON, THICK = 1.0e4, 0.3, 1.0e-2


def _term(X, F, bending=True, lumped=False):
    from tisim.solvers.cloth.solver import ShellTerm

    mu, lam = lame_plane_stress(YOUNG, POISSON)
    m = len(F)
    hg = mesh_hinges(F)
    return ShellTerm(
        len(X),
        F,
        hg,
        X,
        np.full(m, mu),
        np.full(m, lam),
        np.full(m, THICK),
        np.full(len(hg), 0.05),
        bending=bending,
        lumped_bending=lumped,
    )


def _reference(term, x, strain=None):
    """sum_f D_f^T clamp(H_F) D_f + GN bending, all in numpy from the raw 9 x 9 blocks
    (H_F of the membrane plus, when given, the strain limit's)."""
    e = term.energy_obj
    xs = term.x
    xs.from_numpy(x)
    e.local_hessians(xs, project_bending=True)
    H9 = e.membrane_hessians.to_numpy()[: len(term.faces)]
    if strain is not None:
        strain.obj.local_hessians(xs)
        H9 = H9 + strain.obj.hessians.to_numpy()[: len(term.faces)]
    data = e.face_data.to_numpy()
    n = term.n
    rows, cols, vals = [], [], []
    for f, tri in enumerate(term.faces):
        g00, g01, g11 = data[f, 0], data[f, 1], data[f, 2]
        BG = np.array([[-g00, -g01 - g11], [g00, g01], [0.0, g11]])
        D = np.kron(BG.T, np.eye(3))  # (6, 9): F[:, c] = sum_v BG[v, c] x_v
        Dp = np.linalg.pinv(D)
        HF = Dp.T @ H9[f] @ Dp
        HF = 0.5 * (HF + HF.T)
        w, V = np.linalg.eigh(HF)
        Hp = D.T @ (V * np.maximum(w, 0.0)) @ V.T @ D
        dofs = (3 * np.asarray(tri)[:, None] + np.arange(3)).ravel()
        rows.append(np.repeat(dofs, 9)), cols.append(np.tile(dofs, 9)), vals.append(Hp.ravel())
    if len(term.hinges):
        Hb = e.bending_hessians.to_numpy()[: len(term.hinges)]
        for h, hv in enumerate(term.hinges):
            dofs = (3 * np.asarray(hv)[:, None] + np.arange(3)).ravel()
            rows.append(np.repeat(dofs, 12)), cols.append(np.tile(dofs, 12)), vals.append(Hb[h].ravel())
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(3 * n, 3 * n))


@pytest.mark.parametrize("case", ["stretched", "compressed", "irregular"])
def test_projected_elastic_hessian_matches_numpy(case):
    """The device assembly (each vertex sums its own rows, ``shell_kernels.gather_*``)
    against numpy; "irregular": an unstructured disc, vertices of 3 to 8 faces, the
    faces and hinges in no spatial order."""
    if case == "irregular":
        from tisim.geometry.generate import cloth_disc

        mesh = cloth_disc(radius=0.15, target_edge=0.05, seed=3, normal="z")
    else:
        mesh = cloth_grid((0.3, 0.3), (3, 3), normal="z")
    X, F = np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int32)
    rng = np.random.default_rng(7)
    x = X.copy()
    if case == "stretched":
        x[:, 0] *= 1.08
        x += 1e-4 * rng.standard_normal(x.shape)
    elif case == "irregular":  # stretched, sheared and bent out of plane
        x[:, 0] *= 1.05
        x[:, 0] += 0.2 * x[:, 1]
        x[:, 2] += 2.0 * x[:, 0] ** 2 + 1e-3 * rng.standard_normal(len(x))
    else:  # compression and shear: membrane Hessians with negative eigenvalues
        x[:, 0] *= 0.7
        x += 0.01 * rng.standard_normal(x.shape)
    term = _term(X, F)
    _E, _g, H = term.evaluate(x, hessian=True)
    R = _reference(term, x)
    scale = abs(R).max()
    assert abs(H - R).max() <= 1e-10 * scale
    w = np.linalg.eigvalsh(H.toarray())
    assert w.min() >= -1e-9 * scale
    if case == "compressed":  # the projection did something: the raw Hessian is indefinite
        term.energy_obj.local_hessians(term.x, project_bending=True)
        raw9 = term.energy_obj.membrane_hessians.to_numpy()[: len(F)]
        assert min(np.linalg.eigvalsh(h).min() for h in raw9) < -1e-6 * scale


def test_strain_limit_folded_into_the_membrane_projection():
    """With the strain barrier active, its F-space Hessian is added to the membrane's before
    the one projection, and its gradient to the shell's."""
    from tisim.energies.shell import StrainLimit
    from tisim.solvers.cloth.solver import _StrainTerm

    mesh = cloth_grid((0.3, 0.3), (3, 3), normal="z")
    X, F = np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int32)
    rng = np.random.default_rng(3)
    x = X.copy()
    x[:, 0] *= 1.06  # inside the limit 1.1, above the activation 1.0
    x[:, 1] *= 0.9
    x += 1e-4 * rng.standard_normal(x.shape)
    term = _term(X, F)
    E0, g0, _ = term.evaluate(x, hessian=True)
    strain = _StrainTerm(StrainLimit, len(X), F, X, 1.1, 1e3, term.x.dtype)
    assert term.fold_strain(strain)
    gs, _Hs = strain.gradient_hessian(x)
    assert gs is not None and np.abs(gs).max() > 1e-6 * np.abs(g0).max()
    E, g, H = term.evaluate(x, hessian=True)
    assert E == pytest.approx(E0, rel=1e-14)  # the energy stays the shell's alone
    np.testing.assert_allclose(g, g0 + gs, rtol=1e-12, atol=1e-12 * np.abs(g0).max())
    R = _reference(term, x, strain)
    assert abs(H - R).max() <= 1e-10 * abs(R).max()


def _spd_backends():
    from tisim.linalg import pardiso
    from tisim.linalg.cholesky import cholmod_available

    return (["pardiso"] if pardiso.available() else []) + (["cholmod"] if cholmod_available() else [])


@pytest.mark.parametrize("backend", _spd_backends())
def test_newton_solve_survives_a_system_singular_to_round_off(backend):
    """A PSD-projected Hessian whose huge barrier block leaves a pivot at round-off (here
    exactly singular: a rank-one 3 x 3 block over a zero-mass vertex) does not stop the
    step: the solver shifts the diagonal slightly and still returns a descent direction
    that solves the system up to that shift."""
    from tisim.solvers.cloth.solver import SPDSolver

    u = np.array([1.0, -2.0, 0.5])
    k = 1e12
    A = np.eye(6)
    A[3:, 3:] = k * np.outer(u, u)  # PSD, singular
    A[:3, 3:] = A[3:, :3] = 0.0
    b = np.array([1.0, 2.0, 3.0, 1.0, 0.0, -1.0])
    s = SPDSolver(backend)
    assert s.backend == backend
    p = s.solve(sp.csr_matrix(A), b)
    assert np.all(np.isfinite(p))
    assert b @ p > 0  # a descent direction for the gradient -b
    np.testing.assert_allclose(p[:3], b[:3], rtol=1e-9)  # the regular block is solved exactly
    # (A + D) p = b with a diagonal 0 <= D <= 1e-4 |diag A|: r = A p - b = -D p
    r = A @ p - b
    assert np.all(np.abs(r) <= 1e-4 * np.abs(np.diag(A)) * np.abs(p) * (1 + 1e-9) + 1e-12)
    assert np.abs(r[3:]).max() > 0  # the shift was needed (the block is singular)


def _f_hessians(x, faces, membrane, strain, project):
    """shell_hessian_f's (m, 6, 6) F-space Hessians at x (n, 3), and the raw ones of the
    direct formulas (membrane_hessian_f + strain_hessian_f) at the same x."""
    import taichi as ti

    from tisim.backend import download, upload
    from tisim.energies import shell_kernels as K

    m = len(faces)
    xs = ti.Vector.ndarray(3, ti.f64, len(x))
    upload(xs, x)
    out = ti.ndarray(ti.f64, (m, 6, 6))
    raw = ti.ndarray(ti.f64, (m, 6, 6))
    o = strain.obj
    data = membrane.face_data if membrane is not None else o.face_data
    K.shell_hessian_f(
        xs, o.faces, data, o.face_data, int(membrane is not None), 1, o.s_max, o.s_hat, o._tol, int(project), out
    )
    if membrane is not None:
        K.membrane_hessian_f(xs, membrane.faces, membrane.face_data, raw)
    K.strain_hessian_f(xs, o.faces, o.face_data, raw, o.s_max, o.s_hat, o._tol, int(membrane is not None))
    return download(out), download(raw)


@pytest.mark.parametrize("case", ["sheared", "stretched", "compressed", "isotropic", "rest"])
def test_f_hessian_eigensystem_is_the_hessian_and_its_clamp_the_projection(case):
    """The analytic eigensystem of membrane + strain limit (shell_hessian_f) sums back to the
    raw F-space Hessian of the direct formulas, and clamping it equals LAPACK's eigen-clamp
    of that Hessian; also with equal singular values (the divided differences' limits), at
    rest, and for the strain limit alone."""
    from tisim.energies.shell import StrainLimit
    from tisim.solvers.cloth.solver import _StrainTerm

    mesh = cloth_grid((0.3, 0.3), (4, 4), normal="z")
    X, F = np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int32)
    rng = np.random.default_rng(11)
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    x = {
        "sheared": X + 0.02 * rng.standard_normal(X.shape),
        "stretched": X * [1.07, 1.0, 1.0] + 2e-4 * rng.standard_normal(X.shape),
        "compressed": X * [0.7, 1.0, 1.0] + 0.01 * rng.standard_normal(X.shape),
        "isotropic": X * 1.05,  # sigma_1 = sigma_2 on every face, the strain barrier active
        "rest": X.copy(),
    }[case] @ (q * np.sign(np.diag(r))).T
    term = _term(X, F)
    strain = _StrainTerm(StrainLimit, len(X), F, X, 1.1, 1e3, term.x.dtype)
    from tisim.backend import download
    from tisim.energies import shell_kernels as K

    sd = download(strain.obj.face_data)
    ka = float((sd[:, K.S_KAPPA] * sd[:, K.S_AREA]).max())  # the strain barrier's scale, J
    shell_raw = None
    for membrane in (term.energy_obj, None):
        raw_an, raw = _f_hessians(x, F, membrane, strain, project=False)
        proj, _ = _f_hessians(x, F, membrane, strain, project=True)
        shell_raw = raw if shell_raw is None else shell_raw
        # relative to the Hessian's size, or to the barrier's own scale where round-off
        # activates it at rest (sigma = 1 + eps: entries of 1e-14 ka)
        tol = 1e-12 * max(np.abs(raw).max(), ka)
        assert np.abs(raw_an - raw).max() <= tol
        ref = []
        for H in raw:
            w, V = np.linalg.eigh(0.5 * (H + H.T))
            ref.append((V * np.maximum(w, 0.0)) @ V.T)
        assert np.abs(proj - np.array(ref)).max() <= tol
        assert min(np.linalg.eigvalsh(p).min() for p in proj) >= -tol
    if case == "compressed":  # the clamp did something
        assert min(np.linalg.eigvalsh(h).min() for h in shell_raw) < -1e-3 * np.abs(shell_raw).max()


def test_strain_limit_alone_projects_like_numpy():
    """The strain term's own Hessian (when the elastic term is not the level's shell, as in
    the progressive preview): the analytic projection against the numpy reference."""
    from tisim.energies.shell import StrainLimit
    from tisim.solvers.cloth.solver import _StrainTerm

    mesh = cloth_grid((0.3, 0.3), (3, 3), normal="z")
    X, F = np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int32)
    rng = np.random.default_rng(5)
    x = X * [1.06, 0.95, 1.0] + 1e-3 * rng.standard_normal(X.shape)
    strain = _StrainTerm(StrainLimit, len(X), F, X, 1.1, 1e3, _term(X, F).x.dtype)
    gs, Hs = strain.gradient_hessian(x)
    assert gs is not None
    term = _term(X, F)
    term.energy_obj.update(mu=0.0, lam=0.0, bending_k=0.0)
    R = _reference(term, x, strain)  # a zero membrane plus the strain limit
    assert abs(Hs - R).max() <= 1e-10 * abs(R).max()
    assert abs(R).max() > 0


@pytest.mark.parametrize("backend", _spd_backends())
def test_newton_solve_of_an_empty_system(backend):
    """Every vertex fixed (pinned and reached, or static): a 0 x 0 system, no step."""
    from tisim.solvers.cloth.solver import SPDSolver

    p = SPDSolver(backend).solve(sp.csr_matrix((0, 0)), np.zeros(0))
    assert p.shape == (0,)


def _pair_triplets(H, stencils, sysvert):
    """Reference COO triplets of 12 x 12 pair Hessians over the unknowns (numpy)."""
    rows, cols, vals = [], [], []
    for k, st in enumerate(stencils):
        for a in range(4):
            for b in range(4):
                if st[a] < 0 or st[b] < 0 or sysvert[st[a]] < 0 or sysvert[st[b]] < 0:
                    continue
                r = 3 * sysvert[st[a]] + np.arange(3)
                c = 3 * sysvert[st[b]] + np.arange(3)
                rows.append(np.repeat(r, 3)), cols.append(np.tile(c, 3))
                vals.append(H[k, 3 * a : 3 * a + 3, 3 * b : 3 * b + 3].ravel())
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)


@pytest.mark.parametrize("isolated", [False, True])
def test_system_assembler_equals_the_structural_sum(isolated):
    """Contact pair Hessians summed on the device into the elastic pattern (a row search
    per block), entries outside it inserted, plus vertex blocks (repeated vertices) and
    a diagonal: the same pattern, zeros included, and the same values as numpy's COO
    sum (structural_sum), with non-unknown vertices and unused stencil slots dropped.
    ``isolated``: a vertex in no face (its diagonal block is not in the base)."""
    import taichi as ti

    from tisim import backend
    from tisim.solvers.cloth.assembly import SystemAssembler, structural_sum

    mesh = cloth_grid((0.3, 0.3), (4, 4), normal="z")
    X, F = np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int32)
    n = len(X) + (1 if isolated else 0)
    rng = np.random.default_rng(11)
    sysvert = np.arange(n, dtype=np.int32)
    sysvert[[3, 7]] = -1  # two vertices are not unknowns (held)
    sysvert[sysvert >= 0] = np.arange(int((sysvert >= 0).sum()))
    m = int((sysvert >= 0).sum())
    # base: a random symmetric matrix on the faces' pattern, restricted to the unknowns
    r0, c0, v0 = [], [], []
    for f in F:
        for a in f:
            for b in f:
                if sysvert[a] >= 0 and sysvert[b] >= 0:
                    r0.append(np.repeat(3 * sysvert[a] + np.arange(3), 3))
                    c0.append(np.tile(3 * sysvert[b] + np.arange(3), 3))
                    v0.append(rng.standard_normal(9))
    A = sp.csr_matrix((np.concatenate(v0), (np.concatenate(r0), np.concatenate(c0))), shape=(3 * m, 3 * m))
    A.sum_duplicates()
    A.data[::17] = 0.0  # explicit zeros stay entries
    # single entries that make a vertex's three rows differ (the row search's shortcut misses)
    A = structural_sum(
        A, np.array([1, 1, 4, 4, 16, 31]), np.array([6, 7, 9, 10, 2, 32]), np.array([0.5, 0.0, 1.0, 2.0, 3.0, 4.0])
    )
    # pairs: neighbours (inside the pattern), far apart vertices (outside), unused slots
    k = 40
    st = rng.integers(0, n, size=(k, 4)).astype(np.int32)
    st[:10] = F[rng.integers(0, len(F), 10)][:, [0, 1, 2, 0]]
    st[10:15, 3] = -1
    st[15, :] = [0, 3, -1, 7]  # one unknown
    st[17, :] = [0, 1, 5, 6]  # neighbours' blocks right of the ragged rows' extra entries
    if isolated:
        st[16] = [n - 1, 0, 1, 2]
    H = rng.standard_normal((k, 12, 12))
    Hd = ti.ndarray(backend.real(), shape=(k, 12, 12))
    Hd.from_numpy(H)
    Sd = ti.Vector.ndarray(4, ti.i32, shape=k)
    Sd.from_numpy(st)
    verts = np.array([0, 5, 5, 9, n - 1] if isolated else [0, 5, 5, 9])
    blocks = rng.standard_normal((len(verts), 3, 3))
    diag = rng.standard_normal(3 * m)

    asm = SystemAssembler(n)
    asm.set_unknowns(sysvert)
    for _ in range(2):  # the second round reuses the cached pattern
        asm.begin(A)
        sv = sysvert[verts]
        asm.add_vertex_blocks(sv[sv >= 0], blocks[sv >= 0])
        asm.add_pairs(Hd, Sd, k)
        asm.add_diagonal(diag)
        S = asm.matrix()
    r, c, v = _pair_triplets(H, st, sysvert)
    bv = 3 * sysvert[verts][sysvert[verts] >= 0]
    br = (bv[:, None, None] + np.arange(3)[None, :, None] + np.zeros((1, 1, 3), int)).ravel()
    bc = (bv[:, None, None] + np.arange(3)[None, None, :] + np.zeros((1, 3, 1), int)).ravel()
    ii = np.arange(3 * m)
    R = structural_sum(
        A,
        np.concatenate([r, br, ii]),
        np.concatenate([c, bc, ii]),
        np.concatenate([v, blocks[sysvert[verts] >= 0].ravel(), diag]),
    )
    assert S.has_sorted_indices
    np.testing.assert_array_equal(S.indptr, R.indptr)
    np.testing.assert_array_equal(S.indices, R.indices)
    np.testing.assert_allclose(S.data, R.data, rtol=0, atol=1e-14 * np.abs(R.data).max())
    assert S.nnz > A.nnz  # some entries came from outside the base pattern


def test_exact_bending_option_assembles_the_projected_full_hessian():
    """``ShellTerm.gauss_newton_bending = False`` (the bending Hessian with its
    (theta - theta_bar) Hess(theta) term, each hinge's 12 x 12 block projected, summed by
    ``scatter_blocks`` through the slots copied at first use) against numpy: the
    difference from the default Gauss-Newton assembly is sum_h (clamp(H_h) - c g g^T)."""
    mesh = cloth_grid((0.3, 0.3), (3, 3), normal="z")
    X, F = np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int32)
    x = X.copy()
    x[:, 2] += 3.0 * x[:, 0] ** 2 - 2.0 * x[:, 0] * x[:, 1]  # bent: theta far from its rest 0
    term = _term(X, F)
    _, _, H_gn = term.evaluate(x, hessian=True)
    term.gauss_newton_bending = False
    term._last = None
    _, _, H_full = term.evaluate(x, hessian=True)
    e = term.energy_obj
    n3 = 3 * term.n
    diff = np.zeros((n3, n3))
    for project in (False, True):  # the full Hessian, then its Gauss-Newton part
        e.local_hessians(term.x, project_bending=project)
        Hb = e.bending_hessians.to_numpy()[: len(term.hinges)]
        for h, hv in enumerate(term.hinges):
            blk = Hb[h]
            if not project:
                w, V = np.linalg.eigh(0.5 * (blk + blk.T))
                blk = (V * np.maximum(w, 0.0)) @ V.T
            dofs = (3 * np.asarray(hv)[:, None] + np.arange(3)).ravel()
            diff[np.ix_(dofs, dofs)] += blk if not project else -blk
    got = (H_full - H_gn).toarray()
    assert np.abs(diff).max() > 1e-6 * abs(H_gn).max()  # the two assemblies differ here
    np.testing.assert_allclose(got, diff, atol=1e-9 * abs(H_gn).max())


def test_lumped_bending_hessian_drops_the_opposite_vertices_coupling_and_bounds_gauss_newton():
    """``bending_hessian = "lumped"``: each hinge adds c (g g^T + u u^T), u = ((g_o1 - g_o0)
    / 2, (g_o1 - g_o0) / 2, g_o0, -g_o1), against numpy from the hinges' factors (c, g =
    grad theta, checked in the coupled assembly above). Its pattern is the membrane's (no
    block between a hinge's opposite vertices), it lies above the Gauss-Newton Hessian
    (the difference is PSD) and rigid translations stay in the difference's null space
    (Newton steps keep the momentum)."""
    mesh = cloth_grid((0.3, 0.3), (4, 4), normal="z")
    X, F = np.asarray(mesh.vertices, dtype=np.float64), np.asarray(mesh.faces, dtype=np.int32)
    x = X.copy()
    x[:, 2] += 3.0 * x[:, 0] ** 2 - 2.0 * x[:, 0] * x[:, 1]  # bent
    x[:, 0] += 0.05 * np.sin(7.0 * x[:, 1])  # and sheared in plane: no symmetry to hide behind
    coupled, lumped = _term(X, F), _term(X, F, lumped=True)
    _, g_c, H_c = coupled.evaluate(x, hessian=True)
    _, g_l, H_l = lumped.evaluate(x, hessian=True)
    np.testing.assert_array_equal(g_l, g_c)  # the gradient is the exact one in both
    factors = lumped._gn.to_numpy()[: len(lumped.hinges)]
    n3 = 3 * lumped.n
    ref = np.zeros((n3, n3))
    for hv, f in zip(lumped.hinges, factors):
        g = f[:12].reshape(4, 3)
        half = 0.5 * (g[3] - g[2])
        u = np.concatenate([half, half, g[2], -g[3]])
        dofs = (3 * np.asarray(hv)[:, None] + np.arange(3)).ravel()
        ref[np.ix_(dofs, dofs)] += f[12] * np.outer(u, u)
        assert abs(f[12]) > 0 and np.abs(g[2:]).max() > 0
    diff = (H_l - H_c).toarray()
    scale = abs(H_c).max()
    np.testing.assert_allclose(diff, ref, atol=1e-12 * scale)
    assert np.abs(ref).max() > 1e-6 * scale
    # the pattern: the faces' vertex blocks only
    mem = sp.csr_matrix(
        (np.ones(9 * len(F)), (np.repeat(F, 3, axis=1).ravel(), np.tile(F, 3).ravel())), shape=(lumped.n, lumped.n)
    )
    mem.sum_duplicates()
    rows = np.repeat(np.arange(n3), np.diff(H_l.indptr)) // 3
    used = set(zip(rows.tolist(), (H_l.indices // 3).tolist()))
    assert used == set(zip(*mem.nonzero()))
    assert H_l.nnz < H_c.nnz  # the coupled pattern has the opposite vertices' blocks
    # above Gauss-Newton, and blind to rigid translations
    assert np.linalg.eigvalsh(0.5 * (diff + diff.T)).min() > -1e-12 * scale
    for axis in range(3):
        t = np.zeros(n3)
        t[axis::3] = 1.0
        assert np.abs(diff @ t).max() < 1e-12 * scale
    # the full bending Hessian is not assembled into the lumped pattern
    lumped.gauss_newton_bending = False
    lumped._last = None
    with pytest.raises(ValueError, match="coupled"):
        lumped.evaluate(x, hessian=True)


def test_system_block_upper_equals_the_blocks_of_the_matrix():
    """SystemAssembler.block_upper (built at the blocks' level, for PARDISO) holds the
    same blocks, pattern and values bit for bit, as pardiso.BlockUpper of the CSR
    matrix, with contact blocks outside the elastic pattern and without; the solver's
    linear solve of the assembler equals that of the CSR matrix; a base that is not
    made of whole 3 x 3 blocks gives None (the CSR path)."""
    import taichi as ti

    from tisim import backend
    from tisim.linalg import pardiso
    from tisim.solvers.cloth.assembly import SystemAssembler, structural_sum
    from tisim.solvers.cloth.solver import SPDSolver

    mesh = cloth_grid((0.3, 0.3), (4, 4), normal="z")
    F = np.asarray(mesh.faces, dtype=np.int32)
    n = len(mesh.vertices)
    rng = np.random.default_rng(5)
    sysvert = np.arange(n, dtype=np.int32)
    sysvert[[3, 7]] = -1
    sysvert[sysvert >= 0] = np.arange(int((sysvert >= 0).sum()))
    m = int((sysvert >= 0).sum())
    r0, c0, v0 = [], [], []
    for f in F:  # an SPD base: element blocks [[K, -K], [-K, K]] and a mass
        for a in f:
            for b in f:
                if a < b and sysvert[a] >= 0 and sysvert[b] >= 0:
                    B = rng.standard_normal((3, 3))
                    K = B @ B.T
                    for (i, j), sgn in (((a, a), 1), ((b, b), 1), ((a, b), -1), ((b, a), -1)):
                        r0.append(np.repeat(3 * sysvert[i] + np.arange(3), 3))
                        c0.append(np.tile(3 * sysvert[j] + np.arange(3), 3))
                        v0.append(sgn * K.ravel())
    A = sp.csr_matrix((np.concatenate(v0), (np.concatenate(r0), np.concatenate(c0))), shape=(3 * m, 3 * m))
    A.sum_duplicates()
    k = 12
    st = rng.integers(0, n, size=(k, 4)).astype(np.int32)
    st[:4] = F[:4][:, [0, 1, 2, 0]]  # inside the pattern; the others mostly outside
    H = np.zeros((k, 12, 12))
    for q in range(k):  # PSD pair Hessians
        B = rng.standard_normal((12, 12))
        H[q] = B @ B.T
    Hd = ti.ndarray(backend.real(), shape=(k, 12, 12))
    Hd.from_numpy(H)
    Sd = ti.Vector.ndarray(4, ti.i32, shape=k)
    Sd.from_numpy(st)
    asm = SystemAssembler(n)
    asm.set_unknowns(sysvert)
    for pairs in (0, k):
        asm.begin(A)
        asm.add_pairs(Hd, Sd, pairs)
        asm.add_diagonal(np.full(3 * m, 2.0))
        S, U = asm.matrix(), asm.block_upper()
        ref = pardiso.BlockUpper(3)(S)
        assert U is not None and ref is not None
        np.testing.assert_array_equal(U.indptr, ref.indptr)
        np.testing.assert_array_equal(U.indices, ref.indices)
        np.testing.assert_array_equal(U.data, ref.data)
        if pardiso.available():
            b = rng.standard_normal(3 * m)
            x = SPDSolver("pardiso").solve(asm, b)
            np.testing.assert_allclose(x, np.linalg.solve(S.toarray(), b), rtol=1e-9, atol=0)
    assert S.nnz > A.nnz  # the second round had blocks outside the base
    ragged = structural_sum(A, np.array([1]), np.array([6]), np.array([0.5]))
    asm.begin(ragged)
    assert asm.block_upper() is None


def test_block_solve_survives_a_system_singular_to_round_off():
    """The assembler's block path (PARDISO on 3 x 3 blocks) meets the same singular
    system as test_newton_solve_survives_a_system_singular_to_round_off: the failed block
    factorisation falls back to the CSR matrix, shifted, and still gives a descent
    direction that solves the regular block exactly; the next, regular system is solved
    on the blocks again."""
    from tisim.linalg import pardiso
    from tisim.solvers.cloth.assembly import SystemAssembler
    from tisim.solvers.cloth.solver import SPDSolver

    if not pardiso.available():
        pytest.skip("MKL PARDISO not installed")
    u = np.array([1.0, -2.0, 0.5])
    A = np.eye(6)
    A[3:, 3:] = 1e12 * np.outer(u, u)
    r, c = np.indices((6, 6))
    keep = (r // 3) == (c // 3)  # the two diagonal blocks, zeros kept as entries
    base = sp.csr_matrix((A[keep], (r[keep], c[keep])), shape=(6, 6))
    assert base.nnz == 18
    b = np.array([1.0, 2.0, 3.0, 1.0, 0.0, -1.0])
    asm = SystemAssembler(2)
    asm.set_unknowns(np.array([0, 1], dtype=np.int32))
    asm.begin(base)
    assert asm.block_upper() is not None
    s = SPDSolver("pardiso")
    p = s.solve(asm, b)
    assert np.all(np.isfinite(p)) and b @ p > 0
    np.testing.assert_allclose(p[:3], b[:3], rtol=1e-9)
    assert np.abs(A @ p - b)[3:].max() > 0  # shifted
    asm.begin(base)
    asm.add_diagonal(np.ones(6))  # regular now
    p = s.solve(asm, b)
    r = (A + np.eye(6)) @ p - b  # backward stable (cond ~1e12: the residual, not p, is tight)
    assert np.abs(r).max() <= 1e-12 * 1e12 * np.abs(p).max()
    np.testing.assert_allclose(p[:3], b[:3] / 2, rtol=1e-12)
    assert s._pardiso._block == 3  # back on the blocks
