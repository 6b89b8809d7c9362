"""Shell energies: membrane, hinge bending and strain limit against finite differences,
closed-form values and rest-state / rigid-motion invariance.

Meshes are tiny (a 3 x 3-vertex grid, a 5 x 2-vertex strip, one hinge, one
triangle); energy objects are built once per module and reused with ``update``.
Kernels take ndarrays and compile once per process; the last tests check that a
second object of another size compiles nothing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tisim.energies.shell import (
    ShellEnergy,
    StrainLimit,
    dihedral_angles,
    hinges,
    lame_plane_stress,
    shell_rest,
)
from tisim.geometry.generate import cloth_grid
from tisim.testing import check_gradient, check_hessian

YOUNG, POISSON, THICK = 1.0e4, 0.3, 1.0e-2  # Pa, -, m
MU, LAM = (float(v) for v in lame_plane_stress(YOUNG, POISSON))
KB = 0.05  # J, a hinge stiffness of the same order as the membrane terms here


def _rotation(rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _rot_x(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


# ---------------------------------------------------------------------------
# meshes and energy objects (built once)


@pytest.fixture(scope="module")
def grid():
    mesh = cloth_grid((1.0, 1.0), (2, 2), normal="z")  # 9 vertices, 8 faces, 8 hinges
    energy = ShellEnergy.from_material(
        mesh.vertices, mesh.faces, young=YOUNG, poisson=POISSON, thickness=THICK, bending_k=KB
    )
    return mesh.vertices.copy(), mesh.faces.copy(), energy


@pytest.fixture(scope="module")
def strip():
    """A 4 x 1 m strip (10 vertices) and its copy folded by 2 rad about the line x = 0."""
    mesh = cloth_grid((4.0, 1.0), (4, 1), normal="z")
    X = mesh.vertices.copy()
    folded = X.copy()
    right = X[:, 0] > 0.0
    c, s = np.cos(2.0), np.sin(2.0)
    folded[right, 0] = c * X[right, 0]
    folded[right, 2] = s * X[right, 0]
    energy = ShellEnergy.from_material(X, mesh.faces, young=YOUNG, poisson=POISSON, thickness=THICK, bending_k=KB)
    return X, folded, mesh.faces.copy(), energy


# One hinge: edge (0, 1) along x, wings o0 = (0.3, 1, 0) and o1 = (0.6, -0.8, 0):
# A0 = 0.5, A1 = 0.4, |e| = 1, weight 3 |e|^2 / (A0 + A1) = 3 / 0.9.
HINGE_X = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.3, 1.0, 0.0], [0.6, -0.8, 0.0]])
HINGE_F = np.array([[0, 1, 2], [1, 0, 3]])


def _fold(psi: float) -> np.ndarray:
    """The hinge with wing o1 turned by psi about the edge (theta = psi, see test)."""
    x = HINGE_X.copy()
    x[3] = _rot_x(psi) @ x[3]
    return x


@pytest.fixture(scope="module")
def hinge():
    return ShellEnergy.from_material(HINGE_X, HINGE_F, young=YOUNG, poisson=POISSON, thickness=THICK, bending_k=KB)


@pytest.fixture(scope="module")
def strain(grid):
    X, F, energy = grid
    return StrainLimit(len(X), F, energy.rest, kappa=1.0e4)


@pytest.fixture
def membrane_only(grid):
    energy = grid[2]
    energy.update(mu=MU, lam=LAM, bending_k=0.0)
    yield energy
    energy.update(bending_k=KB)


@pytest.fixture
def bending_only(grid):
    energy = grid[2]
    energy.update(mu=0.0, lam=0.0, bending_k=KB)
    yield energy
    energy.update(mu=MU, lam=LAM)


def _check_all(energy, x, *, eps=1e-6, **kw):
    g = check_gradient(energy.energy_np, energy.gradient_np, x, eps=eps, **kw)
    h = check_hessian(energy.gradient_np, energy.hessian_np, x, eps=eps, **kw)
    return g, h


# ---------------------------------------------------------------------------
# topology and rest data


def test_hinges_of_a_grid_are_the_interior_edges(grid):
    X, F, _ = grid
    hg = hinges(F)
    assert hg.shape == (8, 4)  # 16 edges, 8 on the boundary
    windings = {tuple(np.roll(f, k)) for f in F.tolist() for k in range(3)}
    for e0, e1, o0, o1 in hg.tolist():
        assert (e0, e1, o0) in windings and (e1, e0, o1) in windings
    assert np.allclose(dihedral_angles(X, hg), 0.0)
    assert hinges(np.array([[0, 1, 2]])).shape == (0, 4)


def test_rest_data_of_a_flat_grid(grid):
    _X, _F, energy = grid
    rest = energy.rest
    assert np.allclose(rest.area, 1.0 / 8.0)
    assert np.allclose(rest.a_bar @ rest.a_bar_inv, np.eye(2))
    # F = E G is orthonormal at rest: G^T a_bar G = I
    assert np.allclose(np.transpose(rest.frame, (0, 2, 1)) @ rest.a_bar @ rest.frame, np.eye(2))
    assert np.allclose(rest.hinge_weight, 3.0 * rest.edge_length**2 / rest.hinge_area)


# ---------------------------------------------------------------------------
# derivatives against finite differences, away from rest


@pytest.mark.parametrize("seed", [0, 1])
def test_membrane_derivatives(membrane_only, grid, seed):
    X = grid[0]
    rng = np.random.default_rng(seed)
    x = (X @ _rotation(rng).T) * 1.1 + 0.08 * rng.standard_normal(X.shape)
    assert membrane_only.energy_parts(membrane_only._load(x))["bending"] == 0.0
    _check_all(membrane_only, x)


@pytest.mark.parametrize("seed", [2, 3])
def test_bending_derivatives(bending_only, grid, seed):
    X = grid[0]
    rng = np.random.default_rng(seed)
    x = X + 0.15 * rng.standard_normal(X.shape)
    assert bending_only.energy_parts(bending_only._load(x))["membrane"] == 0.0
    _check_all(bending_only, x)


def test_folded_strip_derivatives(strip):
    X, folded, _F, energy = strip
    rng = np.random.default_rng(4)
    x = folded + 0.03 * rng.standard_normal(X.shape)
    parts = energy.energy_parts(energy._load(x))
    assert parts["bending"] > 0.1 * parts["membrane"] > 0.0  # both terms matter here
    _check_all(energy, x)


@pytest.mark.parametrize("psi", [0.0, 1.0, -1.0, np.pi - 0.05, -(np.pi - 0.05)])
def test_hinge_derivatives_flat_folded_and_nearly_closed(hinge, psi):
    # rest angle 0.4 so the gradient is not zero at the flat state either
    hinge.update(rest=replace(hinge.rest, theta_bar=np.array([0.4])))
    try:
        x = _fold(psi)
        assert dihedral_angles(x, hinge.hinge_stencils)[0] == pytest.approx(psi, abs=1e-12)
        check_gradient(hinge.energy_np, hinge.gradient_np, x)
        check_hessian(hinge.gradient_np, hinge.hessian_np, x)
        # the projected (Gauss-Newton) bending Hessian is PSD and rank one
        hinge.local_hessians(hinge._load(x), project_bending=True)
        Hb = hinge.bending_hessians.to_numpy()[0]
        w = np.linalg.eigvalsh(Hb)
        assert w[0] > -1e-12 * w[-1] and w[-2] < 1e-12 * w[-1] and w[-1] > 0.0
    finally:
        hinge.update(rest=replace(hinge.rest, theta_bar=np.zeros(1)))


# ---------------------------------------------------------------------------
# closed-form values


@pytest.mark.parametrize("phi", [0.7, -1.3, 3.0])
def test_hinge_fold_energy(hinge, phi):
    x = _fold(phi)
    assert dihedral_angles(x, hinge.hinge_stencils)[0] == pytest.approx(phi, abs=1e-12)
    parts = hinge.energy_parts(hinge._load(x))
    # a rigid fold: no membrane energy (round-off of O(mu tau A) terms), Psi_b = k phi^2 3|e|^2 / A
    assert abs(parts["membrane"]) < 1e-12 * MU * THICK
    assert parts["bending"] == pytest.approx(KB * phi**2 * 3.0 / 0.9, rel=1e-12)


def test_membrane_uniaxial_stretch_of_one_triangle():
    rng = np.random.default_rng(5)
    R = _rotation(rng)
    tri = np.array([[0.0, 0.0, 0.0], [0.7, 0.1, 0.0], [0.2, 0.5, 0.0]])
    energy = ShellEnergy.from_material(tri @ R.T, np.array([[0, 1, 2]]), young=YOUNG, poisson=POISSON, thickness=THICK)
    assert energy.hinge_count == 0
    area = 0.5 * (0.7 * 0.5 - 0.1 * 0.2)
    for s in (1.3, 0.8):
        x = (tri * np.array([s, 1.0, 1.0])) @ R.T  # stretch along the rest x axis, then rotate
        # hand-derived: C = diag(s^2, 1), ln J = ln s
        psi = THICK * area * (MU / 2 * (s * s - 1.0 - 2.0 * np.log(s)) + LAM / 2 * np.log(s) ** 2)
        xf = energy._load(x)
        assert energy.energy(xf) == pytest.approx(psi, rel=1e-12)
        assert energy.membrane_strain(xf)[0] == pytest.approx(max(s, 1.0), rel=1e-12)


# ---------------------------------------------------------------------------
# rest state and rigid motions


def test_rest_state_is_stress_free_flat_and_curved(grid, strip):
    X, F, energy = grid
    assert abs(energy.energy_np(X)) <= 1e-14 * MU * THICK
    scale = np.abs(energy.gradient_np(X + 0.01 * np.random.default_rng(6).standard_normal(X.shape))).max()
    assert scale > 0.0
    assert np.abs(energy.gradient_np(X)).max() <= 1e-12 * scale
    # curved rest shapes: a bumpy sheet and the folded strip
    Y = X.copy()
    Y[:, 2] = 0.2 * np.sin(3.0 * X[:, 0] + 1.0) * np.cos(2.0 * X[:, 1])
    energy.update(rest=shell_rest(Y, F, energy.hinge_stencils))
    try:
        assert abs(np.degrees(energy.rest.theta_bar)).max() > 5.0  # really curved
        assert abs(energy.energy_np(Y)) <= 1e-14 * MU * THICK
        assert np.abs(energy.gradient_np(Y)).max() <= 1e-12 * scale
        assert energy.energy_np(X) > 0.0  # flattening it costs energy now
    finally:
        energy.update(rest=shell_rest(X, F, energy.hinge_stencils))
    Xs, folded, Fs, es = strip
    es.update(rest=shell_rest(folded, Fs, es.hinge_stencils))
    try:
        assert abs(es.energy_np(folded)) <= 1e-14 * MU * THICK
        assert np.abs(es.gradient_np(folded)).max() <= 1e-12 * scale
        assert es.energy_np(Xs) > 0.0
    finally:
        es.update(rest=shell_rest(Xs, Fs, es.hinge_stencils))


@pytest.mark.parametrize("which", ["shell", "strain"])
def test_rigid_motion_invariance(grid, strain, which):
    X = grid[0]
    energy = grid[2] if which == "shell" else strain
    rng = np.random.default_rng(7)
    if which == "shell":
        x = X + 0.1 * rng.standard_normal(X.shape)
    else:  # inside the active band of the barrier
        x = X * np.array([1.006, 1.0, 1.0]) + 1e-4 * rng.standard_normal(X.shape)
    e0 = energy.energy_np(x)
    g = energy.gradient_np(x)
    assert e0 > 0.0 and np.abs(g).max() > 0.0
    y = x @ _rotation(rng).T + rng.standard_normal(3)
    assert energy.energy_np(y) == pytest.approx(e0, rel=1e-10)
    scale = np.abs(g).max() * (1.0 + np.abs(x).max())
    assert np.abs(g.sum(axis=0)).max() <= 1e-12 * scale  # no net force
    assert np.abs(np.cross(x, g).sum(axis=0)).max() <= 1e-12 * scale  # no net torque


# ---------------------------------------------------------------------------
# strain limiting


def test_strain_limit_zero_below_activation(strain, grid):
    X = grid[0]
    rng = np.random.default_rng(8)
    x = (X * np.array([0.995, 0.997, 1.0]) + 1e-4 * rng.standard_normal(X.shape)) @ _rotation(rng).T
    assert strain.max_stretch(strain._load(x)) < 1.0  # below activation everywhere
    assert strain.energy_np(x) == 0.0
    assert np.all(strain.gradient_np(x) == 0.0)
    assert np.all(strain.hessian_np(x) == 0.0)
    assert strain.feasible(strain._load(x))


def test_strain_limit_grows_without_bound(strain, grid):
    import ipctk

    X = grid[0]
    total_area = 1.0
    values = []
    for k in range(3, 10):
        s = strain.s_max - 10.0**-k
        x = X * np.array([s, 1.0, 1.0])
        xf = strain._load(x)
        assert strain.max_stretch(xf) == pytest.approx(s, rel=1e-12)
        assert strain.feasible(xf)
        # uniaxial: sigma = (s, 1); only sigma_1 is inside the band (b(s_hat, s_hat) = 0)
        expected = 1.0e4 * total_area * ipctk.barrier(strain.s_max - s, strain.s_hat)
        values.append(strain.energy_np(x))
        assert values[-1] == pytest.approx(expected, rel=1e-8)
    assert np.all(np.diff(values) > 0.0) and values[-1] > 5.0 * values[0]
    over = strain._load(X * np.array([strain.s_max + 1e-6, 1.0, 1.0]))
    assert strain.energy(over) == np.inf
    assert not strain.feasible(over) and strain.infeasible_count(over) == len(grid[1])
    assert not strain.feasible_faces(over).any()


@pytest.mark.parametrize(
    "stretch, noise",
    [
        ((1.006, 1.0, 1.0), 1e-4),
        ((1.007, 1.004, 1.0), 1e-4),
        ((1.005, 1.005, 1.0), 0.0),
        ((1.005, 1.005, 1.0), 1e-6),
    ],
    ids=["one-active", "both-active", "isotropic", "near-isotropic"],
)
def test_strain_limit_derivatives(strain, grid, stretch, noise):
    X = grid[0]
    rng = np.random.default_rng(9)
    x = (X * np.array(stretch) + noise * rng.standard_normal(X.shape)) @ _rotation(rng).T
    assert strain.feasible(strain._load(x)) and strain.max_stretch(strain._load(x)) > 1.0
    _check_all(strain, x, eps=1e-7)


# ---------------------------------------------------------------------------
# compile once per process: a second object of another size compiles no kernel


def _compiled_kernel_count() -> int:
    """Kernel instances materialised so far by the shell kernels and Taichi's own
    helper kernels (ndarray fill / copy / numpy transfer)."""
    import taichi._kernels as tk

    from tisim.energies import shell_kernels as K

    return sum(
        len(obj._primal.compiled_kernels) for mod in (K, tk) for obj in vars(mod).values() if hasattr(obj, "_primal")
    )


def _vectors(a: np.ndarray):
    import taichi as ti

    from tisim import backend

    v = ti.Vector.ndarray(3, backend.real(), shape=len(a))
    v.from_numpy(a.astype(backend.np_real()))
    return v


def _exercise_shell(nx: int, ny: int) -> float:
    """Build a ShellEnergy on an nx x ny grid and call every public method with
    caller-created ndarrays; returns the elapsed seconds."""
    import time

    from tisim.energies import shell_kernels as K

    t0 = time.perf_counter()
    mesh = cloth_grid((1.0, 1.0), (nx, ny), normal="z")
    X = mesh.vertices
    energy = ShellEnergy.from_material(X, mesh.faces, young=YOUNG, poisson=POISSON, thickness=THICK, bending_k=KB)
    rng = np.random.default_rng(nx)
    x = _vectors(X + 0.05 * rng.standard_normal(X.shape))
    g = _vectors(np.zeros_like(X))
    parts = energy.energy_parts(x)
    assert parts["membrane"] > 0.0 and parts["bending"] > 0.0
    assert energy.energy(x) == pytest.approx(parts["membrane"] + parts["bending"])
    energy.add_gradient(x, g)
    assert np.abs(g.to_numpy()).max() > 0.0
    K.zero_vectors(g)
    for project in (False, True):
        energy.local_hessians(x, project_bending=project)
    assert energy.membrane_hessians.to_numpy().shape == (len(mesh.faces), 9, 9)
    assert energy.bending_hessians.to_numpy().shape == (energy.hinge_count, 12, 12)
    assert energy.membrane_strain(x).shape == (len(mesh.faces),)
    assert energy.max_stretch(x) > 0.0
    energy.update(rest=shell_rest(X, mesh.faces, energy.hinge_stencils), mu=MU, lam=LAM)
    energy.update(thickness=THICK, bending_k=KB)
    energy.energy_np(X)
    energy.gradient_np(X)
    energy.hessian_np(X)
    energy.hessian_np(X, project_bending=True)
    return time.perf_counter() - t0


def _exercise_strain(nx: int, ny: int) -> float:
    """Build a StrainLimit on an nx x ny grid and call every public method."""
    import time

    t0 = time.perf_counter()
    mesh = cloth_grid((1.0, 1.0), (nx, ny), normal="z")
    X = mesh.vertices
    rest = shell_rest(X, mesh.faces)
    strain = StrainLimit(len(X), mesh.faces, rest, kappa=1.0e4)
    x = _vectors(X * np.array([1.006, 1.002, 1.0]))
    g = _vectors(np.zeros_like(X))
    assert strain.energy(x) > 0.0
    assert strain.energy_parts(x)["strain_limit"] > 0.0
    strain.add_gradient(x, g)
    assert np.abs(g.to_numpy()).max() > 0.0
    strain.local_hessians(x)
    assert strain.hessians.to_numpy().shape == (len(mesh.faces), 9, 9)
    assert strain.infeasible_count(x) == 0 and strain.feasible(x)
    assert strain.feasible_faces(x).all()
    assert strain.membrane_strain(x).shape == (len(mesh.faces),)
    assert strain.max_stretch(x) > 1.0
    strain.update(rest=rest, kappa=2.0e4)
    strain.energy_np(X)
    strain.gradient_np(X)
    strain.hessian_np(X)
    return time.perf_counter() - t0


@pytest.mark.parametrize("exercise", [_exercise_shell, _exercise_strain], ids=["ShellEnergy", "StrainLimit"])
def test_second_instance_compiles_nothing(exercise):
    t_first = exercise(3, 2)  # compiles (or loads) whatever earlier tests did not
    compiled = _compiled_kernel_count()
    assert compiled > 0
    t_second = exercise(6, 5)  # another size: every kernel is reused
    t_third = exercise(2, 7)
    print(f"{exercise.__name__}: first {t_first:.3f} s, second {t_second:.3f} s, third {t_third:.3f} s")
    assert _compiled_kernel_count() == compiled
    assert t_second < 0.5 and t_third < 0.5
