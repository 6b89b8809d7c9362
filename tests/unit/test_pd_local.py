"""Local step of the PD solver: projections are true minimisers, targets give exact gradients."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize as so
import taichi as ti

from tisim.geometry.transforms import rotation_vector
from tisim.materials import polar_rotation
from tisim.model import Model
from tisim.scene import scene_from_dict
from tisim.solvers.pd.local import fast_rotation, project_unit_determinant
from tisim.solvers.pd.solver import SolverPD, _project_unit_determinant


def taichi_rotations(F: np.ndarray, q0: np.ndarray, iterations: int) -> np.ndarray:
    """fast_rotation on a batch: F (m, 3, 3), q0 (m, 4) -> R (m, 3, 3)."""
    from tisim.materials import ti_funcs as mf

    m = len(F)
    Ff = ti.Matrix.field(3, 3, float, m)
    qf = ti.Vector.field(4, float, m)
    Rf = ti.Matrix.field(3, 3, float, m)
    Ff.from_numpy(F)
    qf.from_numpy(q0)

    @ti.kernel
    def run():
        for e in range(m):
            Rf[e] = mf.quat_to_matrix(fast_rotation(Ff[e], qf[e], iterations))

    run()
    return Rf.to_numpy()


def identity_quats(m):
    q = np.zeros((m, 4))
    q[:, 0] = 1.0
    return q


def brute_force_rotation(F: np.ndarray, starts: int = 12, seed: int = 0) -> tuple[np.ndarray, float]:
    """argmin_R ||F - R||^2 over rotation vectors by BFGS from several starts."""
    rng = np.random.default_rng(seed)

    def f(r):
        return float(np.sum((F - rotation_vector(r)) ** 2))

    best = None
    for _ in range(starts):
        r0 = rng.uniform(-np.pi, np.pi, 3)
        res = so.minimize(f, r0, method="BFGS", options={"gtol": 1e-12})
        if best is None or res.fun < best.fun:
            best = res
    return rotation_vector(best.x), float(best.fun)


def sample_F(rng, count=16):
    """Deformation gradients: mild, large, strongly anisotropic and inverted ones."""
    F = [np.eye(3) + 0.3 * rng.standard_normal((3, 3)) for _ in range(count // 2)]
    F += [
        rotation_vector(rng.uniform(-3, 3, 3))
        @ np.diag(rng.uniform(0.2, 3.0, 3))
        @ rotation_vector(rng.uniform(-3, 3, 3))
        for _ in range(count // 4)
    ]
    inv = [rotation_vector(rng.uniform(-3, 3, 3)) @ np.diag([1.5, 1.0, -0.3]) for _ in range(count // 4)]
    return np.array(F + inv)


def test_rotation_projection_is_the_arap_minimiser(rng):
    """p = R(F) minimises ||F - R||^2 over SO(3): compare with a brute-force optimiser."""
    F = sample_F(rng)
    R = taichi_rotations(F, identity_quats(len(F)), 60)
    for k in range(len(F)):
        assert np.allclose(R[k] @ R[k].T, np.eye(3), atol=1e-12)
        assert np.linalg.det(R[k]) == pytest.approx(1.0, abs=1e-12)
        e_fast = np.sum((F[k] - R[k]) ** 2)
        Rb, e_best = brute_force_rotation(F[k])
        assert e_fast <= e_best + 1e-9 * max(1.0, e_best), k
        assert np.allclose(R[k], Rb, atol=1e-5), k  # the minimiser is unique for these F
    # and it is the SVD answer to round-off
    assert np.allclose(R, polar_rotation(F), atol=1e-12)


def test_rotation_warm_start_converges_quadratically(rng):
    F = sample_F(rng, 40)[:20]  # non-inverted ones
    R0 = polar_rotation(F)
    F2 = F + 0.02 * rng.standard_normal(F.shape)
    q = _quats(R0)
    errs = [np.abs(taichi_rotations(F2, q, it) - polar_rotation(F2)).max() for it in (0, 1, 2)]
    assert errs[0] > 1e-3
    assert errs[1] < 0.1 * errs[0] and errs[1] < 1e-3
    assert errs[2] < 1e-10


def _quats(R):
    from scipy.spatial.transform import Rotation

    q = Rotation.from_matrix(R).as_quat()  # (x, y, z, w)
    return np.concatenate([q[:, 3:], q[:, :3]], axis=1)


def test_unit_determinant_projection_is_the_closest_point(rng):
    """Proj_{det=1}(F) minimises ||F - X||^2 subject to det X = 1 (brute force with SLSQP)."""
    F = np.array([np.eye(3) + 0.25 * rng.standard_normal((3, 3)) for _ in range(6)])
    F = F[np.linalg.det(F) > 0.2]
    P = _project_unit_determinant(F)
    m = len(F)
    Ff = ti.Matrix.field(3, 3, float, m)
    Pf = ti.Matrix.field(3, 3, float, m)
    Ff.from_numpy(F)

    @ti.kernel
    def run():
        for e in range(m):
            Pf[e] = project_unit_determinant(Ff[e], 10)

    run()
    assert np.allclose(Pf.to_numpy(), P, atol=1e-12)
    for k in range(m):
        assert np.linalg.det(P[k]) == pytest.approx(1.0, abs=1e-9)
        cons = {"type": "eq", "fun": lambda x: np.linalg.det(x.reshape(3, 3)) - 1.0}
        res = so.minimize(
            lambda x, f=F[k].ravel(): np.sum((x - f) ** 2),
            P[k].ravel() + 0.05,
            constraints=[cons],
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 500},
        )
        assert np.sum((P[k] - F[k]) ** 2) <= res.fun + 1e-8


def bar_scene(material, handles=True, volume_stiffness=0.0, damping=0.0):
    d = {
        "sim": {"dt": 0.01, "gravity": [0.0, -9.81, 0.0], "damping": damping},
        "solver": {
            "type": "pd",
            "global_step": "cholesky",
            "rotation_iterations": 30,
            "volume_stiffness": volume_stiffness,
        },
        "objects": {
            "bar": {
                "generator": "box",
                "size": [1.0, 0.2, 0.2],
                "resolution": [5, 2, 2],
                "material": material,
                "youngs_modulus": 1e5,
                "poisson_ratio": 0.3,
            }
        },
    }
    if handles:
        d["objects"]["bar"]["handles"] = {"left": {"region_min": [-1, -1, -1], "region_max": [-0.49, 1, 1]}}
    return scene_from_dict(d)


@pytest.mark.parametrize(
    "material,volume",
    [
        ("arap", 0.0),
        ("corotated", 0.0),
        ("neo-hookean", 0.0),
        ("symmetric-dirichlet", 0.0),
        ("symmetric-gradient", 0.0),
        ("arap", 3e4),
    ],
)
def test_residual_is_minus_the_incremental_gradient(material, volume, rng):
    """The local step's targets make r = b - A q equal to -h^2 grad E(q) exactly
    (projective terms by minimality of the projection, quasi-Newton ones by design),
    checked against the numpy gradient built from tisim.materials.first_piola."""
    scene = bar_scene(material, volume_stiffness=volume, damping=0.7)
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    a = model.initial_state()
    a.velocities[:] = 0.3 * rng.standard_normal(a.velocities.shape)
    b = a.clone()
    solver.step(a, b, 0.01)  # sets x_tilde, held set
    x = b.positions + 0.02 * rng.standard_normal(b.positions.shape)
    x[solver._held_idx] = b.positions[solver._held_idx]
    k = solver.kernels
    k.x.from_numpy(x)
    k.local_step(30)
    h = 0.01
    rsq = k.residual(solver._A_dev, h * h, -1, 0.0, [0.0, 0.0, 0.0])
    r = k.r.to_numpy()
    g = solver.incremental_gradient(x)
    assert np.linalg.norm(g) > 1.0  # not a trivial zero
    assert np.allclose(r, -h * h * g, rtol=0, atol=1e-9 * np.abs(h * h * g).max())
    assert rsq == pytest.approx(np.sum(r * r), rel=1e-12)


def test_local_step_with_contact_forces_is_the_momentum_residual(rng):
    """iterate() with contact forces f gives r = b - A q + s f on free vertices (held rows 0),
    ||r||^2 of that, the gather of r, and keeps f: the same as the plain iteration
    followed by adding s f on its own (the path before the fusion), to round-off."""
    import taichi as ti

    scene = bar_scene("neo-hookean", damping=0.3)
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    a = model.initial_state()
    b = a.clone()
    solver.step(a, b, 0.01)  # sets x_tilde, held set
    k = solver.kernels
    x = b.positions + 0.01 * rng.standard_normal(b.positions.shape)
    x[solver._held_idx] = b.positions[solver._held_idx]
    f = rng.standard_normal(x.shape)
    fdev = ti.ndarray(ti.f64, shape=f.shape)
    fdev.from_numpy(f)
    h2 = 1e-4
    gs = solver.global_step
    gidx, gout = gs.gather_target(k)
    k.x.from_numpy(x)
    k.iterate(1, solver._A_dev, h2, -1, 0.0, [0.0, 0.0, 0.0], gidx, gout)
    k.add_to_residual(f, h2)
    r_ref = k.r.to_numpy()
    rsq_ref = k.residual_norm_sq()
    k.x.from_numpy(x)
    k.reset_rotations()
    rsq = k.iterate(1, solver._A_dev, h2, -1, 0.0, [0.0, 0.0, 0.0], gidx, gout, fdev, h2)
    r = k.r.to_numpy()
    assert len(solver._held_idx) and np.all(r[solver._held_idx] == 0.0)
    assert np.abs(r_ref).max() > 1e-6  # a real residual
    np.testing.assert_allclose(r, r_ref, rtol=0, atol=1e-14 * np.abs(r_ref).max())
    assert rsq == pytest.approx(rsq_ref, rel=1e-12)
    np.testing.assert_array_equal(k.kept.to_numpy(), f)
    np.testing.assert_allclose(np.asarray(gout), r[np.asarray(gidx)], rtol=0, atol=0)


@pytest.mark.parametrize("material", ["arap", "corotated", "neo-hookean"])
def test_taichi_energy_matches_numpy(material, rng):
    scene = bar_scene(material, handles=False, volume_stiffness=1e4)
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    x = model.initial_positions + 0.03 * rng.standard_normal(model.initial_positions.shape)
    solver.kernels.x.from_numpy(x)
    solver.kernels.local_step(30)  # rotations converge (the energy kernel warm-starts from them)
    e_ti = solver.kernels.potential_energy(3, model.gravity)
    e_np = solver.potential_energy(x)
    assert abs(solver.elastic_energy(x)) > 1e-3
    assert e_ti == pytest.approx(e_np, rel=1e-10)
    # gravity part: -sum m g.x
    assert solver.potential_energy(x + np.array([0.0, 1.0, 0.0])) - e_np == pytest.approx(
        9.81 * model.mass.sum(), rel=1e-12
    )
