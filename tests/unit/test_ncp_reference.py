"""Host (PDContact's numpy path) and device (tisim.contact.ncp.device_ncp) nonsmooth Newton
steps against a dense numpy reference written from the notes
(/work/shared/papers/pd-sparse-inverse-contact.md, §2.6, §2.7, §2.9), not against each other.

The reference builds, per contact j with frame rows F_j = (n, t1, t2):

* the Delassus operator in frame coordinates, C_jk = h^2 W_jk F_j F_k^T (§2.7, the
  gap and slip-displacement change per unit force), so that after a force change
  dlambda the gaps are d + (C dlambda)_n and the slips u + (C dlambda)_t / h;
* the preconditioner r_n = h^2 W_jj, r_t = h W_jj (§2.9);
* the residual: Signorini phi_FB(d, r_n lambda_n) or min(d, r_n lambda_n) (§2.6), and the
  proximal Coulomb residual lambda_t - Pi_{|x| <= mu lambda_n}(lambda_t - u / r_t) with the
  normal force and the stick/slip verdict lagged at the current iterate (§2.6), its
  friction rows scaled by r_t h (metres, as the solver's merit);
* one Newton step: its generalized Jacobian by central differences of that residual
  (the pieces are smooth away from the kinks, which random problems avoid), dense solve.

Row scalings and the solver's rotated tangent basis leave the Newton step unchanged, so
the step of either path must equal the reference once its Conjugate Residual solve has
converged (here 300 iterations on at most 30 unknowns). The merit (sum of squared
residuals) is compared as well.
"""

from __future__ import annotations

import numpy as np
import pytest

from tisim.contact.ncp.delassus import DelassusOperator
from tisim.contact.ncp.frames import ContactSet, tangent_frames
from tisim.contact.ncp.functions import ncp_function

H = 0.01


class _Config:
    def __init__(self, ncp):
        self.ncp = ncp
        self.cr_iterations = 300
        self.preconditioner = "delassus"


def _problem(rng, k=10, n=24, triangles=3):
    q_n = rng.uniform(-0.1, 0.1, size=(n, 3))
    verts = np.zeros((k, 4), dtype=np.int64)
    w = np.zeros((k, 4))
    vk = rng.choice(n, size=k, replace=False)
    verts[:] = vk[:, None]
    w[:, 0] = 1.0
    for c in range(k - triangles, k):
        others = rng.choice(np.setdiff1d(np.arange(n), [vk[c]]), size=3, replace=False)
        verts[c, 1:] = others
        w[c, 1:] = -rng.dirichlet(np.ones(3))
    normals = rng.standard_normal((k, 3))
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    cs = ContactSet(
        vertices=verts,
        weights=w,
        frames=tangent_frames(normals),
        gap0=rng.uniform(-2e-3, 1e-3, size=k),
        point0=np.einsum("kj,kjd->kd", w, q_n[verts]),
        collider=np.where(np.arange(k) < k - triangles, 0, -1),
        mu=rng.uniform(0.2, 0.8, size=k),
        surface_velocity=np.zeros((k, 3)),
        key=np.arange(k, dtype=np.int64),
    )
    M = rng.standard_normal((n, n))
    A = M @ M.T / n + np.eye(n)
    B = np.zeros((n, k))
    for c in range(k):
        for j in range(4):
            B[verts[c, j], c] += w[c, j]
    W = B.T @ np.linalg.solve(A, B)
    return cs, 0.5 * (W + W.T)


def _state(rng, cs, W):
    """Gaps, slips and forces with sticking and slipping contacts and some without force."""
    k = cs.count
    d = rng.uniform(-1e-3, 1e-3, size=k)
    r_t = H * np.diag(W)
    lam = np.zeros((k, 3))
    lam[:, 0] = np.abs(rng.standard_normal(k)) * 10.0
    lam[:2, 0] = 0.0
    lam[:, 1:] = 0.5 * cs.mu[:, None] * lam[:, :1] * rng.standard_normal((k, 2))
    # slips: half small enough to stick (|lambda_t - u / r_t| < mu lambda_n), half sliding
    u = (
        r_t[:, None]
        * rng.standard_normal((k, 2))
        * np.where(np.arange(k) % 2 == 0, 0.2, 20.0)[:, None]
        * cs.mu[:, None]
        * lam[:, :1]
    )
    u[:2] = 1e-3 * rng.standard_normal((2, 2))
    return d, u, lam


def _reference(cs, W, d, u, lam, ncp):
    """(merit, Newton step (k, 3)) from the notes' formulas."""
    k = cs.count
    F = cs.frames  # (k, 3, 3): rows n, t1, t2
    C = (H * H) * np.einsum("jk,jab,kcb->jakc", W, F, F).reshape(3 * k, 3 * k)
    r_n = H * H * np.diag(W)
    r_t = H * np.diag(W)
    radius = cs.mu * np.maximum(lam[:, 0], 0.0)  # lagged normal force

    def fb(a, b):
        return a + b - np.sqrt(a * a + b * b)

    phi_fn = fb if ncp == "fischer-burmeister" else np.minimum
    y0 = lam[:, 1:] - u / r_t[:, None]
    stick = (np.linalg.norm(y0, axis=1) <= radius) & (radius > 0)  # lagged verdict

    def residual(lv):
        L = lv.reshape(k, 3)
        resp = (C @ (lv - lam.ravel())).reshape(k, 3)
        dd = d + resp[:, 0]
        uu = u + resp[:, 1:] / H
        rows = [phi_fn(dd, r_n * L[:, 0])]
        y = L[:, 1:] - uu / r_t[:, None]
        ny = np.linalg.norm(y, axis=1)
        proj = np.where(stick[:, None], y, radius[:, None] * y / np.where(ny > 0, ny, 1.0)[:, None])
        ft = (L[:, 1:] - proj) * (r_t * H)[:, None]
        return np.concatenate([rows[0], ft.ravel()])

    R0 = residual(lam.ravel())
    merit = float(R0 @ R0)
    J = np.zeros((3 * k, 3 * k))
    x0 = lam.ravel()
    for i in range(3 * k):
        e = 1e-6 * max(1.0, abs(x0[i]))
        a, b = x0.copy(), x0.copy()
        a[i] += e
        b[i] -= e
        J[:, i] = (residual(a) - residual(b)) / (2 * e)
    # residual order (normal rows, then friction pairs) to lambda's (k, 3) layout
    perm = np.concatenate([3 * np.arange(k), (3 * np.arange(k)[:, None] + [1, 2]).ravel()])
    Jr = J[np.argsort(perm)]
    Rr = R0[np.argsort(perm)]
    step = np.linalg.solve(Jr, -Rr).reshape(k, 3)
    return merit, step, stick


def _host(cs, W, ncp, lam):
    from tisim.contact.ncp.pd_contact import PDContact

    c = object.__new__(PDContact)
    c._on_device = False
    c._lam_stale = False
    c._built = True
    c.config = _Config(ncp)
    c.ncp = ncp_function(ncp)
    c.friction_jacobian = "full"
    c.exact_gaps = False
    c.contacts = cs
    c._h = H
    c._stats = PDContact._empty_stats()
    c.C = DelassusOperator(W, cs.frames, H * H)
    c.r_n = H * H * np.diag(W)
    c.r_t = H * np.diag(W)
    c.lam = np.array(lam, dtype=np.float64)
    return c


def _close(a, b, rtol):
    scale = np.abs(b).max()
    assert scale > 0
    err = np.abs(a - b).max()
    assert err <= rtol * scale, f"max error {err:.3e} against a scale {scale:.3e}"


@pytest.mark.parametrize("ncp", ["fischer-burmeister", "min-map"])
@pytest.mark.parametrize("seed", [1, 2])
def test_host_newton_step_matches_the_dense_reference(ncp, seed):
    rng = np.random.default_rng(seed)
    cs, W = _problem(rng)
    d, u, lam = _state(rng, cs, W)
    merit, ref, stick = _reference(cs, W, d, u, lam, ncp)
    assert 0 < stick.sum() < len(stick) - 2  # both verdicts present
    host = _host(cs, W, ncp, lam)
    assert host.merit(lam, d, u) == pytest.approx(merit, rel=1e-12)
    dlam, _ = host._newton_step(d, u)
    _close(dlam, ref, 1e-6)


@pytest.mark.parametrize("ncp", ["fischer-burmeister", "min-map"])
def test_device_newton_step_matches_the_dense_reference(ncp):
    from tisim.contact.ncp.device_ncp import DeviceNCP

    rng = np.random.default_rng(3)
    cs, W = _problem(rng)
    d, u, lam = _state(rng, cs, W)
    merit, ref, stick = _reference(cs, W, d, u, lam, ncp)
    assert 0 < stick.sum() < len(stick) - 2
    comp = H * H * np.diag(W)
    dev = DeviceNCP(int(cs.vertices.max()) + 1, ncp=ncp, friction_jacobian="full", exact_gaps=False, cr_iterations=300)
    dev.load(cs, W, comp, comp / H, comp, H * H, H, lam, (), 0.0)
    # gaps and slips straight into the device's state (its kinematics from positions are
    # compared with the host's in test_device_ncp.py)
    dev.kinematics(np.zeros((int(cs.vertices.max()) + 1, 3)))
    dev._put(dev.st.d, d)
    dev._put(dev.st.u, u)
    dd, ud = dev.gaps_and_slips()
    np.testing.assert_array_equal(dd, d)
    np.testing.assert_array_equal(ud, u)
    assert dev.merit() == pytest.approx(merit, rel=1e-10)
    dev.newton_step()
    _close(dev.direction(), ref, 1e-6)


def test_built_delassus_and_preconditioner_match_a_dense_solve(demos_dir):
    """The box on the incline (stick-slip demo): the contact solver's Delassus matrix is
    B^T A^-1 B by a dense solve with the global matrix A, and its preconditioner is the
    notes' r_n = h^2 W_jj, r_t = h W_jj (§2.9) - the values host and device both receive."""
    from tisim.model import Model
    from tisim.scene import load_scene
    from tisim.solvers.pd.solver import SolverPD

    scene = load_scene(demos_dir / "stick-slip.toml", ["contact.mu=0.2"])
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    s0 = model.initial_state()
    h = 0.01
    q_n, v_n = s0.positions, s0.velocities
    q_tilde = q_n + h * v_n + h * h * np.asarray(model.gravity)
    b = solver.A @ q_n + model.mass[:, None] * (q_tilde - q_n)
    c = solver.contact
    c.begin_step(q_n, v_n, q_tilde, 0.0, h)
    q = solver.global_step.solve(b + c.force_coefficient(h) * c.force())
    c.update(q)
    assert c.contacts.count >= 4
    B = c.contacts.selection_matrix(model.vertex_count)
    B = B.toarray() if hasattr(B, "toarray") else np.asarray(B)
    A = solver.A.toarray() if hasattr(solver.A, "toarray") else np.asarray(solver.A)
    W = B.T @ np.linalg.solve(A, B)
    np.testing.assert_allclose(c.C.W_hat, W, rtol=1e-8, atol=1e-10 * np.abs(W).max())
    np.testing.assert_allclose(c.r_n, h * h * np.diag(W), rtol=1e-8)
    np.testing.assert_allclose(c.r_t, h * np.diag(W), rtol=1e-8)
