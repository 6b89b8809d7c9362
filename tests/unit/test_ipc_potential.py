"""C-IPC barrier and friction: scalar functions against ipctk, the batch potentials
against finite differences (tisim.testing) and against ipctk's mesh-level
BarrierPotential / FrictionPotential on two nearby cloth patches.

No ``from __future__ import annotations`` here: Taichi reads the test kernels'
annotations when they are decorated.
"""

import time

import numpy as np
import pytest
import taichi as ti

ipctk = pytest.importorskip("ipctk")

from tisim import backend
from tisim.contact.ipc import barrier as bar
from tisim.contact.ipc import distance as dist
from tisim.contact.ipc import friction as fr
from tisim.contact.ipc.potential import BarrierPotential, FrictionPotential
from tisim.testing import check_gradient, check_hessian

RTOL = 1e-10


def _close(a, b, scale, rtol=RTOL):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return np.all(np.abs(a - b) <= rtol * max(float(scale), 1e-300))


# ---------------------------------------------------------------------------------
# scalar functions


@ti.kernel
def _scalars(d: ti.types.ndarray(), dhat: ti.f64, out: ti.types.ndarray()):
    for k in range(d.shape[0]):
        out[k, 0] = bar.barrier(d[k], dhat)
        out[k, 1] = bar.barrier_first_derivative(d[k], dhat)
        out[k, 2] = bar.barrier_second_derivative(d[k], dhat)
        out[k, 3] = fr.smooth_friction_f0(d[k], dhat)
        out[k, 4] = fr.smooth_friction_f1(d[k], dhat)
        out[k, 5] = fr.smooth_friction_f1_over_x(d[k], dhat)
        out[k, 6] = fr.smooth_friction_f2(d[k], dhat)
        out[k, 7] = fr.smooth_friction_f2_x_minus_f1_over_x3(d[k], dhat)


def test_barrier_and_friction_scalars_match_ipctk():
    dhat = 1e-2
    d = np.concatenate([[-1e-3, 0.0], np.geomspace(1e-9, 0.999, 40) * dhat, [dhat, 1.5 * dhat]])
    out = np.zeros((len(d), 8))
    _scalars(d, dhat, out)
    refs = [
        ipctk.barrier,
        ipctk.barrier_first_derivative,
        ipctk.barrier_second_derivative,
        ipctk.smooth_friction_f0,
        ipctk.smooth_friction_f1,
        ipctk.smooth_friction_f1_over_x,
        ipctk.smooth_friction_f2,
        ipctk.smooth_friction_f2_x_minus_f1_over_x3,
    ]
    for col, f in enumerate(refs):
        for k, dk in enumerate(d):
            if col >= 3 and dk <= 0.0:
                continue  # friction functions take y > 0 (f1/y, f2 y - f1 over y^3)
            ref = f(dk, dhat)
            if np.isinf(ref):
                assert np.isinf(out[k, col]) and out[k, col] > 0, (col, dk)
                continue
            assert _close(out[k, col], ref, abs(ref)), (col, dk, out[k, col], ref)
    # non-trivial: the barrier is active and its derivatives have the expected signs
    inside = (d > 0) & (d < dhat)
    assert np.all(out[inside, 0] > 0) and np.all(out[inside, 1] < 0) and np.all(out[inside, 2] > 0)
    assert np.all(out[d >= dhat, :3] == 0)


@ti.kernel
def _shell(dsq: ti.f64, dhat: ti.f64, xi: ti.f64, kappa: ti.f64, out: ti.types.ndarray()):
    s, sh = bar.shell_barrier_arguments(dsq, dhat, xi)
    out[0] = s
    out[1] = sh
    out[2] = bar.shell_barrier_force_magnitude(dsq, dhat, xi, kappa)


def test_shell_barrier_convention():
    """C-IPC: s = d^2 - xi^2, s_hat = dhat^2 + 2 dhat xi, lambda = -kappa b'(s) 2 d; the
    barrier activates at a surface gap of dhat (d = xi + dhat gives s = s_hat)."""
    dhat, xi, kappa = 0.01, 0.002, 7.0
    out = np.zeros(3)
    _shell((xi + dhat) ** 2, dhat, xi, kappa, out)
    assert abs(out[0] - out[1]) < 1e-15 and out[2] == 0.0
    d = xi + 0.3 * dhat
    _shell(d * d, dhat, xi, kappa, out)
    s, sh = d * d - xi * xi, dhat * dhat + 2 * dhat * xi
    assert _close(out[:2], [s, sh], sh)
    lam = -kappa * ipctk.barrier_first_derivative(s, sh) * 2 * d
    assert lam > 0 and _close(out[2], lam, lam)


# ---------------------------------------------------------------------------------
# tangent bases and closest-point weights


@ti.func
def _row3(X: ti.template(), k, i):
    return ti.Vector([X[k, i, 0], X[k, i, 1], X[k, i, 2]])


@ti.kernel
def _frames(
    X: ti.types.ndarray(),
    is_ee: ti.i32,
    T: ti.types.ndarray(),
    W: ti.types.ndarray(),
    types: ti.types.ndarray(),
):
    for k in range(X.shape[0]):
        x0, x1, x2, x3 = _row3(X, k, 0), _row3(X, k, 1), _row3(X, k, 2), _row3(X, k, 3)
        t = 0
        B = ti.Matrix.zero(float, 3, 2)
        w = ti.Vector.zero(float, 4)
        if is_ee:
            t = dist.edge_edge_distance_type(x0, x1, x2, x3)
            B, w = fr.edge_edge_frame(x0, x1, x2, x3, t)
        else:
            t = dist.point_triangle_distance_type(x0, x1, x2, x3)
            B, w = fr.point_triangle_frame(x0, x1, x2, x3, t)
        types[k] = t
        # the standalone bases, slots 1..4: face or edge-edge, point-edge, point-point
        B1 = fr.point_triangle_tangent_basis(x0, x1, x2, x3)
        if is_ee:
            B1 = fr.edge_edge_tangent_basis(x0, x1, x2, x3)
        B2 = fr.point_edge_tangent_basis(x0, x1, x2)
        B3 = fr.point_point_tangent_basis(x0, x1)
        for i, j in ti.ndrange(3, 2):
            T[k, 0, i, j] = B[i, j]
            T[k, 1, i, j] = B1[i, j]
            T[k, 2, i, j] = B2[i, j]
            T[k, 3, i, j] = B3[i, j]
        for i in range(4):
            W[k, i] = w[i]


def _ref_frame_pt(x, t):
    """ipctk's tangent basis and closest point difference for a PT pair of type t."""
    p, t0, t1, t2 = x
    PT = ipctk.PointTriangleDistanceType
    if t == int(PT.P_T):
        b = ipctk.point_triangle_closest_point(p, t0, t1, t2)
        c = t0 + b[0] * (t1 - t0) + b[1] * (t2 - t0)
        return ipctk.point_triangle_tangent_basis(p, t0, t1, t2), p - c
    if t in (int(PT.P_E0), int(PT.P_E1), int(PT.P_E2)):
        e0, e1 = [(t0, t1), (t1, t2), (t2, t0)][t - int(PT.P_E0)]
        a = ipctk.point_edge_closest_point(p, e0, e1)
        return ipctk.point_edge_tangent_basis(p, e0, e1), p - (e0 + a * (e1 - e0))
    v = [t0, t1, t2][t]
    return ipctk.point_point_tangent_basis(p, v), p - v


def test_tangent_frames_match_ipctk(rng):
    X = rng.normal(size=(120, 4, 3))
    TT = np.zeros((len(X), 4, 3, 2))
    W = np.zeros((len(X), 4))
    types = np.zeros(len(X), np.int32)
    _frames(X, 0, TT, W, types)
    T = TT[:, 0]
    for k, x in enumerate(X):
        assert _close(TT[k, 1], ipctk.point_triangle_tangent_basis(*x), 1.0)
        assert _close(TT[k, 2], ipctk.point_edge_tangent_basis(*x[:3]), 1.0)
        P = ipctk.point_point_tangent_basis(*x[:2])
        assert _close(TT[k, 3] @ TT[k, 3].T, P @ P.T, 1.0)
        assert _close(TT[k, 3].T @ TT[k, 3], np.eye(2), 1.0)
    assert len(set(types)) == 7
    for k, x in enumerate(X):
        Tr, rel = _ref_frame_pt(x, types[k])
        assert _close(T[k].T @ T[k], np.eye(2), 1.0)  # orthonormal
        if types[k] == 6:
            assert _close(T[k], Tr, 1.0)  # the face basis exactly
        assert _close(T[k] @ T[k].T, Tr @ Tr.T, 1.0)  # the same tangent plane
        assert _close(W[k] @ x, rel, np.abs(rel).max())  # sum w_i x_i = p - closest
        assert abs(T[k].T @ rel).max() <= 1e-10 * np.linalg.norm(rel)  # normal to contact
        assert W[k, 0] == 1.0 and abs(W[k].sum()) < 1e-14
    _frames(X, 1, TT, W, types)
    T = TT[:, 0]
    assert len(set(types)) >= 6
    for k, x in enumerate(X):
        assert _close(TT[k, 1], ipctk.edge_edge_tangent_basis(*x), 1.0)
        if types[k] == int(ipctk.EdgeEdgeDistanceType.EA_EB):
            assert _close(T[k], ipctk.edge_edge_tangent_basis(*x), 1.0)
            st = ipctk.edge_edge_closest_point(*x)
            rel = ipctk.edge_edge_relative_velocity(*x, st)
            assert _close(W[k] @ x, rel, np.abs(rel).max())
        rel = W[k] @ x
        assert abs(T[k].T @ rel).max() <= 1e-10 * np.linalg.norm(rel)
        assert _close(T[k].T @ T[k], np.eye(2), 1.0)


# ---------------------------------------------------------------------------------
# batch potentials on two cloth patches


def _grid(nx, ny, h):
    xs, ys = np.meshgrid(np.arange(nx) * h, np.arange(ny) * h, indexing="ij")
    V = np.stack([xs.ravel(), ys.ravel(), np.zeros(nx * ny)], 1)
    F = []
    for i in range(nx - 1):
        for j in range(ny - 1):
            a, b, c, d = i * ny + j, (i + 1) * ny + j, (i + 1) * ny + j + 1, i * ny + j + 1
            F += [[a, b, c], [a, c, d]]
    return V, np.array(F)


class Scene:
    """Two 4 x 4 patches 2 cm apart, the upper one turned by a small angle (so that many
    edge pairs are nearly parallel and mollified) and crumpled a little."""

    def __init__(self, rng, angle=0.02, gap=0.02, xi=0.004, dhat=0.03, size=4):
        VA, FA = _grid(size, size, 0.1)
        VB, FB = _grid(size, size, 0.1)
        c, s = np.cos(angle), np.sin(angle)
        VB = VB @ np.array([[c, s, 0], [-s, c, 0], [0, 0, 1]]) + np.array([0.04, 0.03, gap])
        self.rest = np.vstack([VA, VB])
        self.F = np.vstack([FA, FB + len(VA)]).astype(np.int32)
        self.E = ipctk.edges(self.F).astype(np.int32)
        V = self.rest.copy()
        V[:, 2] += 0.004 * rng.uniform(-1, 1, len(V))
        self.V = V
        self.xi, self.dhat = xi, dhat
        n = len(V)
        self.pt = np.array([[v, *f] for v in range(n) for f in self.F if v not in f], np.int32)
        E = self.E
        self.ee = np.array(
            [[*E[i], *E[j]] for i in range(len(E)) for j in range(i + 1, len(E)) if not set(E[i]) & set(E[j])],
            np.int32,
        )
        self.n = n
        self.x = ti.Vector.ndarray(3, ti.f64, n)
        self.g = ti.Vector.ndarray(3, ti.f64, n)
        self.pt_f = ti.Vector.ndarray(4, ti.i32, len(self.pt))
        self.ee_f = ti.Vector.ndarray(4, ti.i32, len(self.ee))
        self.pt_f.from_numpy(self.pt)
        self.ee_f.from_numpy(self.ee)
        self.mesh = ipctk.CollisionMesh(self.rest, self.E, self.F)

    def set_x(self, X):
        self.x.from_numpy(np.ascontiguousarray(np.reshape(X, (self.n, 3))))

    def assemble(self, H, S, rows):
        K = np.zeros((3 * self.n, 3 * self.n))
        for k in range(rows):
            for i in range(4):
                if S[k, i] < 0:
                    assert np.all(H[k, 3 * i : 3 * i + 3] == 0)
                    assert np.all(H[k, :, 3 * i : 3 * i + 3] == 0)
                    continue
                for j in range(4):
                    if S[k, j] >= 0:
                        K[3 * S[k, i] : 3 * S[k, i] + 3, 3 * S[k, j] : 3 * S[k, j] + 3] += H[
                            k, 3 * i : 3 * i + 3, 3 * j : 3 * j + 3
                        ]
        return K


@pytest.fixture(scope="module")
def scene(taichi_backend):
    return Scene(np.random.default_rng(5))


class Pots:
    """One potential of each kind for the module (the kernels take ndarrays, so further
    instances compile nothing: see test_second_instances_compile_nothing)."""

    initial_capacity = 8

    def __init__(self, sc):
        self.barrier = BarrierPotential(sc.n, self.initial_capacity, sc.rest)
        self.friction = FrictionPotential(sc.n, self.initial_capacity, sc.rest)
        self.mu = ti.ndarray(ti.f64, sc.n)
        self.x_ref = ti.Vector.ndarray(3, ti.f64, sc.n)
        self.x_ref.from_numpy(sc.V)


@pytest.fixture(scope="module")
def pots(scene):
    return Pots(scene)


KAPPA = 3.0


def _barrier_fns(sc, pot, kappa=KAPPA):
    args = (sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee), sc.dhat, sc.xi, kappa)

    def energy(X):
        sc.set_x(X)
        return pot.energy(sc.x, *args)

    def grad(X):
        sc.set_x(X)
        sc.g.fill(0.0)
        pot.add_gradient(sc.x, *args, sc.g)
        return sc.g.to_numpy().ravel()

    def hess(X, project=False):
        sc.set_x(X)
        rows = pot.local_hessians(sc.x, *args, project)
        return sc.assemble(pot.hessians.to_numpy(), pot.stencils.to_numpy(), rows)

    return energy, grad, hess


def test_barrier_potential_matches_ipctk(scene, pots):
    sc = scene
    pot = pots.barrier  # starts with room for 8 pairs: must grow
    energy, grad, hess = _barrier_fns(sc, pot)
    col = ipctk.NormalCollisions()
    col.build(sc.mesh, sc.V, sc.dhat, sc.xi)
    B = ipctk.BarrierPotential(sc.dhat, KAPPA)
    # the scene exercises mollified edge pairs and several contact kinds
    assert sum(c.is_mollified() for c in col.ee_collisions) >= 3
    assert len(col.fv_collisions) > 0 and len(col.ev_collisions) > 0
    E_ref = B(col, sc.mesh, sc.V)
    assert E_ref > 0
    assert _close(energy(sc.V), E_ref, E_ref)
    g_ref = B.gradient(col, sc.mesh, sc.V)
    assert _close(grad(sc.V), g_ref, np.abs(g_ref).max())
    H_ref = B.hessian(col, sc.mesh, sc.V).toarray()
    assert _close(hess(sc.V), H_ref, np.abs(H_ref).max())
    Hp_ref = B.hessian(col, sc.mesh, sc.V, ipctk.PSDProjectionMethod.CLAMP).toarray()
    Hp = hess(sc.V, project=True)
    assert np.abs(Hp - hess(sc.V)).max() > 1e-6 * np.abs(H_ref).max()  # projection did something
    assert _close(Hp, Hp_ref, np.abs(Hp_ref).max(), rtol=1e-9)
    assert pot.capacity >= len(sc.pt) + len(sc.ee) > pots.initial_capacity
    # scalars for the solver's statistics
    dmin = pot.min_distance(sc.x, sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee))
    ref_min = min(
        [np.sqrt(ipctk.point_triangle_distance(*sc.V[r])) for r in sc.pt]
        + [np.sqrt(ipctk.edge_edge_distance(*sc.V[r])) for r in sc.ee]
    )
    assert _close(dmin, ref_min, ref_min)
    active = pot.active_count(sc.x, sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee), sc.dhat, sc.xi)
    sh = sc.dhat**2 + 2 * sc.dhat * sc.xi
    n_ref = sum(ipctk.point_triangle_distance(*sc.V[r]) - sc.xi**2 < sh for r in sc.pt) + sum(
        ipctk.edge_edge_distance(*sc.V[r]) - sc.xi**2 < sh for r in sc.ee
    )
    assert active == n_ref > 10


def test_barrier_potential_finite_differences(scene, pots):
    sc = scene
    pot = pots.barrier
    energy, grad, hess = _barrier_fns(sc, pot)
    X0 = sc.V.ravel().copy()
    check_gradient(energy, grad, X0, eps=1e-7, rtol=1e-5, full_max=200)
    check_hessian(grad, hess, X0, eps=1e-7, rtol=1e-5, full_max=200)
    # projected local Hessians are PSD and the unprojected ones are not all PSD
    pairs = (sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee), sc.dhat, sc.xi, KAPPA)
    rows = pot.local_hessians(sc.x, *pairs, False)
    H = pot.hessians.to_numpy()[:rows]
    scale = np.abs(H).max()
    assert np.linalg.eigvalsh(H).min() < -1e-6 * scale
    pot.local_hessians(sc.x, *pairs, True)
    Hp = pot.hessians.to_numpy()[:rows]
    assert np.linalg.eigvalsh(Hp).min() >= -1e-12 * scale


def test_barrier_potential_empty_and_overlap(scene, pots):
    sc = scene
    pot = pots.barrier
    sc.set_x(sc.V)
    assert pot.energy(sc.x, sc.pt_f, 0, sc.ee_f, 0, sc.dhat, sc.xi, KAPPA) == 0.0
    assert pot.min_distance(sc.x, sc.pt_f, 0, sc.ee_f, 0) == np.inf
    assert pot.local_hessians(sc.x, sc.pt_f, 0, sc.ee_f, 0, sc.dhat, sc.xi, KAPPA, True) == 0
    # thicker than the gap: an overlapping pair makes the energy infinite
    e = pot.energy(sc.x, sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee), sc.dhat, 0.05, KAPPA)
    assert e == np.inf


def _friction_fns(sc, fpot, x_ref, eps_v, h):
    def energy(X):
        sc.set_x(X)
        return fpot.energy(sc.x, x_ref, eps_v, h)

    def grad(X):
        sc.set_x(X)
        sc.g.fill(0.0)
        fpot.add_gradient(sc.x, x_ref, eps_v, h, sc.g)
        return sc.g.to_numpy().ravel()

    def hess(X, project=False):
        sc.set_x(X)
        rows = fpot.local_hessians(sc.x, x_ref, eps_v, h, project)
        return sc.assemble(fpot.hessians.to_numpy(), fpot.stencils.to_numpy(), rows)

    return energy, grad, hess


def test_friction_potential_matches_ipctk(scene, pots, rng):
    sc = scene
    mu = 0.4
    mu_f, x_ref, fpot = pots.mu, pots.x_ref, pots.friction
    mu_f.fill(mu)
    sc.set_x(sc.V)
    count = fpot.update(sc.x, sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee), sc.dhat, sc.xi, KAPPA, mu_f)
    col = ipctk.NormalCollisions()
    col.build(sc.mesh, sc.V, sc.dhat, sc.xi)
    B = ipctk.BarrierPotential(sc.dhat, KAPPA)
    tc = ipctk.TangentialCollisions()
    tc.build(sc.mesh, sc.V, col, B, mu)
    assert count > 10
    eps_v, h = 0.05, 0.01
    F = ipctk.FrictionPotential(eps_v * h)
    energy, grad, hess = _friction_fns(sc, fpot, x_ref, eps_v, h)
    # displacements: some below eps (static), some above (sliding)
    for amp in (1e-4, 3e-3):
        U = amp * rng.normal(size=sc.V.shape)
        X = sc.V + U
        D_ref = F(tc, sc.mesh, U)
        assert _close(energy(X), D_ref, D_ref)
        g_ref = F.gradient(tc, sc.mesh, U)
        assert np.abs(g_ref).max() > 0
        assert _close(grad(X), g_ref, np.abs(g_ref).max())
        H_ref = F.hessian(tc, sc.mesh, U).toarray()
        assert _close(hess(X), H_ref, np.abs(H_ref).max())


def test_friction_potential_finite_differences(scene, pots, rng):
    sc = scene
    mu_f, x_ref, fpot = pots.mu, pots.x_ref, pots.friction
    # vertex mu varies: pair mu is the mean of the two sides' means
    mu_np = rng.uniform(0.2, 0.6, sc.n)
    mu_f.from_numpy(mu_np)
    sc.set_x(sc.V)
    fpot.update(sc.x, sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee), sc.dhat, sc.xi, KAPPA, mu_f)
    # lagged coefficients mu_pair * lambda, lambda = -kappa b'(s) 2 d
    coef = fpot.coef.to_numpy()
    sh = sc.dhat**2 + 2 * sc.dhat * sc.xi
    checked = 0
    for k, r in enumerate(sc.pt):
        dsq = ipctk.point_triangle_distance(*sc.V[r])
        lam = -KAPPA * ipctk.barrier_first_derivative(dsq - sc.xi**2, sh) * 2 * np.sqrt(dsq)
        mu_pair = 0.5 * mu_np[r[0]] + 0.5 * mu_np[r[1:]].mean()
        assert _close(coef[k], mu_pair * lam, max(abs(mu_pair * lam), 1e-300))
        checked += lam > 0
    assert checked > 5
    eps_v, h = 0.05, 0.01
    energy, grad, hess = _friction_fns(sc, fpot, x_ref, eps_v, h)
    for amp in (1e-4, 3e-3):
        X0 = (sc.V + amp * rng.normal(size=sc.V.shape)).ravel()
        check_gradient(energy, grad, X0, eps=1e-8, rtol=1e-5, full_max=200)
        check_hessian(grad, hess, X0, eps=1e-8, rtol=1e-4, full_max=200)
        Hp = hess(X0, project=True)
        assert np.linalg.eigvalsh(Hp).min() >= -1e-10 * np.abs(Hp).max()


# ---------------------------------------------------------------------------------
# compile once per process


def _compiled_counts():
    """{kernel: compiled instances} of the barrier's and the friction's modules and the PSD
    projection (Taichi keeps one per distinct argument specialisation in ``compiled_kernels``)."""
    from tisim.contact.ipc import friction_potential, potential
    from tisim.linalg import psd

    kernels = [
        k
        for m in (potential, friction_potential)
        for k in vars(m).values()
        if hasattr(k, "_primal") and k.__module__ == m.__name__
    ]
    kernels.append(psd._project_psd_kernel)
    return {k.__name__: len(k._primal.compiled_kernels) for k in kernels}


def _exercise(sc, barrier, friction, mu, x_ref):
    """Every public method of both potentials once (reserve/growth included)."""
    pairs = (sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee))
    sc.set_x(sc.V)
    sc.g.fill(0.0)
    mu.fill(0.3)
    x_ref.from_numpy(sc.V - 1e-4)
    e = barrier.energy(sc.x, *pairs, sc.dhat, sc.xi, KAPPA)
    barrier.add_gradient(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, sc.g)
    rows = barrier.local_hessians(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, False)
    barrier.local_hessians(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, True)
    dmin = barrier.min_distance(sc.x, *pairs)
    active = barrier.active_count(sc.x, *pairs, sc.dhat, sc.xi)
    _, a_pt, _, a_ee = barrier.compact_active(sc.x, *pairs, sc.dhat, sc.xi)
    assert a_pt + a_ee == active
    count = friction.update(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, mu)
    d = friction.energy(sc.x, x_ref, 0.05, 0.01)
    friction.add_gradient(sc.x, x_ref, 0.05, 0.01, sc.g)
    frows = friction.local_hessians(sc.x, x_ref, 0.05, 0.01, False)
    friction.local_hessians(sc.x, x_ref, 0.05, 0.01, True)
    # the barrier and its friction in one launch: the same sums (bit for bit with Taichi's
    # IR passes on both; the fused kernels compile without them on the CPU, and then the
    # last bits of a few products differ: round-off, ir_passes.LIGHT)
    eb, ef = barrier.energy_with_friction(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, friction, x_ref, 0.05, 0.01)
    np.testing.assert_allclose([eb, ef], [barrier.energy(sc.x, *pairs, sc.dhat, sc.xi, KAPPA), d], rtol=1e-13)
    g = sc.g.to_numpy()
    sc.g.fill(0.0)
    barrier.add_gradient(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, sc.g, friction=(friction, x_ref, 0.05, 0.01))
    np.testing.assert_allclose(sc.g.to_numpy(), g, rtol=0, atol=1e-13 * np.abs(g).max())
    assert np.abs(g).max() > 0 and frows > 0
    cap = barrier.capacity
    assert barrier.hessians.to_numpy().shape == (cap, 12, 12)
    assert barrier.stencils.to_numpy().shape == (cap, 4)
    assert friction.hessians.to_numpy().shape == (friction.capacity, 12, 12)
    return e, rows, dmin, active, count, d, frows, sc.g.to_numpy()


def test_second_instances_compile_nothing(scene, pots):
    """ndarray kernel arguments: a second BarrierPotential / FrictionPotential of another
    size (other vertex count, pair arrays, capacities, growing on first use) runs every
    public method without compiling a kernel."""
    sc = scene
    t0 = time.perf_counter()
    first = _exercise(sc, pots.barrier, pots.friction, pots.mu, pots.x_ref)
    t_first = time.perf_counter() - t0
    count = _compiled_counts()
    # each ran and compiled once
    assert len(count) == 12 and set(count.values()) == {1}, count
    sc2 = Scene(np.random.default_rng(7), size=3)
    assert sc2.n != sc.n
    t0 = time.perf_counter()
    barrier = BarrierPotential(sc2.n, 2, sc2.rest)
    friction = FrictionPotential(sc2.n, 3, sc2.rest)
    mu = ti.ndarray(ti.f64, sc2.n)
    x_ref = ti.Vector.ndarray(3, ti.f64, sc2.n)
    second = _exercise(sc2, barrier, friction, mu, x_ref)
    # and a friction potential without rest positions, on the first scene
    friction_nr = FrictionPotential(sc.n, 1)
    pairs = (sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee))
    friction_nr.update(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, pots.mu)
    t_second = time.perf_counter() - t0
    assert _compiled_counts() == count  # nothing new compiled
    assert t_second < 1.0, (t_first, t_second)
    # the second instance computed something real, the first is unaffected by it
    e, rows, _dmin, active, n_fric, d, _frows, g = second
    assert e > 0 and rows == len(sc2.pt) + len(sc2.ee) and active > 0 and n_fric > 0 and d > 0
    assert barrier.capacity >= rows > 2 and np.abs(g).max() > 0
    again = _exercise(sc, pots.barrier, pots.friction, pots.mu, pots.x_ref)
    assert again[1:5] == first[1:5] and again[6] == first[6]  # counts exactly
    for k in (0, 5, 7):  # sums: exactly where they are serial (backend.SERIAL_SUMS)
        if backend.SERIAL_SUMS:
            assert np.array_equal(again[k], first[k])
        else:
            assert _close(again[k], first[k], np.abs(first[k]).max())
    print(f"potentials: first instance calls {t_first:.3f} s, second instance {t_second:.4f} s")


def test_active_pairs_carry_the_whole_gradient_and_hessian(scene, pots):
    """The solver evaluates forces and Hessians on compact_active's rows only: the same
    gradient and assembled Hessian as over every candidate pair, with fewer rows."""
    import scipy.sparse as sp

    from tisim.solvers.cloth.assembly import local_to_coo

    sc = scene
    pairs = (sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee))
    sc.set_x(sc.V)
    b = pots.barrier

    def grad_hess(p):
        sc.g.fill(0.0)
        b.add_gradient(sc.x, *p, sc.dhat, sc.xi, KAPPA, sc.g)
        k = b.local_hessians(sc.x, *p, sc.dhat, sc.xi, KAPPA, False)
        r, c, v = local_to_coo(b.hessians.to_numpy()[:k], b.stencils.to_numpy()[:k])
        return sc.g.to_numpy(), sp.csr_matrix((v, (r, c)), shape=(3 * sc.n, 3 * sc.n)).toarray(), k

    g_all, H_all, k_all = grad_hess(pairs)
    apt, n_apt, aee, n_aee = b.compact_active(sc.x, *pairs, sc.dhat, sc.xi)
    g_act, H_act, k_act = grad_hess((apt, n_apt, aee, n_aee))
    assert 0 < k_act < k_all
    assert np.abs(g_all).max() > 0
    np.testing.assert_allclose(g_act, g_all, rtol=1e-12, atol=1e-12 * np.abs(g_all).max())
    np.testing.assert_allclose(H_act, H_all, rtol=1e-12, atol=1e-12 * np.abs(H_all).max())


def test_sums_and_active_pairs_repeat_bit_for_bit_on_the_cpu_backend(taichi_backend):
    """Barrier and friction energies and gradients are sums over thousands of pairs into
    shared entries, and the compaction of active pairs appends through a shared counter.
    On the CPU backend these loops run on one thread (backend.SERIAL_SUMS), so repeated
    calls give the same bits and the same pair order; with parallel atomic adds (the code
    before) the energies and gradients of this scene differed between calls."""
    if not backend.SERIAL_SUMS:
        pytest.skip("parallel atomic sums on GPU backends are reproducible to round-off only")
    sc = Scene(np.random.default_rng(11), size=8, gap=0.01)
    pairs = (sc.pt_f, len(sc.pt), sc.ee_f, len(sc.ee))
    barrier = BarrierPotential(sc.n, 8, sc.rest)
    friction = FrictionPotential(sc.n, 8, sc.rest)
    mu, x_ref = ti.ndarray(ti.f64, sc.n), ti.Vector.ndarray(3, ti.f64, sc.n)
    mu.fill(0.3)
    x_ref.from_numpy(sc.V - 1e-3)
    sc.set_x(sc.V)
    assert friction.update(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, mu) > 500

    def once():
        sc.g.fill(0.0)
        e = barrier.energy(sc.x, *pairs, sc.dhat, sc.xi, KAPPA)
        barrier.add_gradient(sc.x, *pairs, sc.dhat, sc.xi, KAPPA, sc.g)
        d = friction.energy(sc.x, x_ref, 0.05, 0.01)
        friction.add_gradient(sc.x, x_ref, 0.05, 0.01, sc.g)
        apt, n_pt, aee, n_ee = barrier.compact_active(sc.x, *pairs, sc.dhat, sc.xi)
        return (e, d, sc.g.to_numpy(), apt.to_numpy()[:n_pt], aee.to_numpy()[:n_ee])

    first = once()
    assert len(first[3]) > 100 and len(first[4]) > 100 and np.abs(first[2]).max() > 0
    for _ in range(12):
        again = once()
        assert again[0] == first[0] and again[1] == first[1]
        for a, b in zip(again[2:], first[2:]):
            assert np.array_equal(a, b)
