"""Per-element operators of the ADMM integrator as Taichi functions, plus numpy entry points.

* :func:`svd3` - signed ("rotation-variant") SVD of a 3x3 matrix by one-sided
  Jacobi: G = U diag(sigma) V^T with U, V in SO(3), sigma[0] >= sigma[1] >= |sigma[2]|
  and sign(sigma[2]) = sign(det G). ``U V^T`` is the rotation maximising tr(R^T G)
  (the proximal Procrustes / U-step of the notes, §2.5b).
* :func:`sym_eig3` - eigen-decomposition of a symmetric 3x3 matrix by cyclic
  two-sided Jacobi (accurate also for (nearly) repeated eigenvalues, where the
  closed-form solvers lose the eigenvectors).
* :func:`prox_sigma` - the P-step (notes §2.5c, §2.6): for an isotropic energy,
  argmin_{sigma > 0} w psi(sigma) + rho/2 ||sigma - s||^2 on the eigenvalues s of
  S = sym(R^T C).

Energies use the conventions of :mod:`tisim.materials.hyperelastic` (zero at rest),
written in the eigenvalues sigma of the stretch S; the notes' kappa is:

=====================  ==============================================  ==================
material (code)        psi(sigma) (Pa)                                 notes' energy
=====================  ==============================================  ==================
arap (0)               mu sum (sigma - 1)^2                            ARAP, kappa = 2 mu
corotated (1)          mu sum (sigma - 1)^2 + lam/2 (J - 1)^2          (not in the notes)
neo-hookean (2)        mu/2 (sum sigma^2 - 3) - mu log J + lam/2 log^2 J   NH, kappa = mu, lambda = lam
symmetric-dirichlet (3) mu/2 (sum sigma^2 + sigma^-2) - 3 mu           SymDir, kappa = mu
symmetric-gradient (4) mu/2 (sum sigma^2 - 3) - mu log J               SymG, kappa = mu
=====================  ==============================================  ==================

(J = prod sigma.) The material codes are indices into ``tisim.scene.MATERIALS``;
"neo-hookean" is integrated by ADMM as the log-barrier Neo-Hookean of the notes
(``"neo-hookean-log"`` in :mod:`tisim.materials`), see :func:`energy_name`.
"""

# No "from __future__ import annotations": Taichi reads kernel/func annotations as objects.

import numpy as np
import taichi as ti

from tisim import ti_math as tm
from tisim.scene import MATERIALS

ARAP, COROTATED, NEO_HOOKEAN, SYMMETRIC_DIRICHLET, SYMMETRIC_GRADIENT = range(5)
assert MATERIALS == ("arap", "corotated", "neo-hookean", "symmetric-dirichlet", "symmetric-gradient")

_JACOBI_SWEEPS = 12  # quadratic convergence: 4-6 sweeps reach round-off for any 3x3 input
NEWTON_ITERATIONS = 60  # default cap of the coupled proxes' damped Newton (ADMMConfig.prox_newton_iterations)
_PAIRS = ((0, 1), (0, 2), (1, 2))  # Jacobi rotation planes


def energy_name(material: str) -> str:
    """The :mod:`tisim.materials` energy that ADMM integrates for a scene material name."""
    return "neo-hookean-log" if material == "neo-hookean" else material


def rest_stiffness(material: str, mu, lam):
    """Largest eigenvalue of d^2 psi / d sigma^2 at sigma = (1, 1, 1), Pa (scales rho)."""
    mu = np.asarray(mu, dtype=np.float64)
    lam = np.asarray(lam, dtype=np.float64)
    if material == "arap":
        return 2.0 * mu
    if material in ("corotated", "neo-hookean"):
        return 2.0 * mu + 3.0 * lam
    if material == "symmetric-dirichlet":
        return 4.0 * mu
    if material == "symmetric-gradient":
        return 2.0 * mu
    raise KeyError(material)


# ---------------------------------------------------------------------------
# small linear algebra


@ti.func
def _tiny():
    return ti.static(1e-300 if _is_f64() else 1e-36)


def _is_f64() -> bool:
    from tisim import backend

    return backend.current().precision == "f64"


@ti.func
def _eps():
    return ti.static(2.2e-16 if _is_f64() else 1.2e-7)


@ti.func
def _col(M, j: ti.template()):
    return ti.Vector([M[0, j], M[1, j], M[2, j]])


@ti.func
def _any_perpendicular(u):
    ref = ti.Vector([1.0, 0.0, 0.0])
    if ti.abs(u[0]) > 0.9:
        ref = ti.Vector([0.0, 1.0, 0.0])
    p = u.cross(ref)
    return p / p.norm()


@ti.func
def svd3(G):
    """Signed SVD of G (3x3): returns (U, sigma (vec3), V), G = U diag(sigma) V^T,
    U, V proper rotations, sigma[0] >= sigma[1] >= |sigma[2]|, sigma[2] < 0 iff det G < 0.

    One-sided Jacobi (Hestenes): plane rotations V orthogonalise the columns of
    B = G V; sigma_j = ||b_j||. Accurate to round-off relative to ||G|| even for
    repeated or vanishing singular values.
    """
    b0 = _col(G, 0)
    b1 = _col(G, 1)
    b2 = _col(G, 2)
    v0 = ti.Vector([1.0, 0.0, 0.0])
    v1 = ti.Vector([0.0, 1.0, 0.0])
    v2 = ti.Vector([0.0, 0.0, 1.0])
    eps = _eps()
    for _sweep in range(_JACOBI_SWEEPS):
        rotated = 0
        for p, q in ti.static(_PAIRS):
            bp = b0 if ti.static(p == 0) else b1
            bq = b1 if ti.static(q == 1) else b2
            vp = v0 if ti.static(p == 0) else v1
            vq = v1 if ti.static(q == 1) else v2
            alpha = bp.dot(bp)
            beta = bq.dot(bq)
            gamma = bp.dot(bq)
            if ti.abs(gamma) > eps * ti.sqrt(alpha * beta) and ti.abs(gamma) > _tiny():
                zeta = (beta - alpha) / (2.0 * gamma)
                t = 0.0
                if ti.abs(zeta) > 1e150:
                    t = 0.5 / zeta
                else:
                    t = ti.math.sign(zeta) / (ti.abs(zeta) + ti.sqrt(1.0 + zeta * zeta))
                    if zeta == 0.0:
                        t = 1.0
                c = 1.0 / ti.sqrt(1.0 + t * t)
                s = c * t
                nbp = c * bp - s * bq
                nbq = s * bp + c * bq
                nvp = c * vp - s * vq
                nvq = s * vp + c * vq
                if ti.static(p == 0):
                    b0 = nbp
                    v0 = nvp
                else:
                    b1 = nbp
                    v1 = nvp
                if ti.static(q == 1):
                    b1 = nbq
                    v1 = nvq
                else:
                    b2 = nbq
                    v2 = nvq
                rotated += 1
        if rotated == 0:
            break
    # sort columns by norm, descending; swapping two columns and negating one keeps det V = +1
    n0, n1, n2 = b0.norm_sqr(), b1.norm_sqr(), b2.norm_sqr()
    if n0 < n1:
        b0, b1 = b1, -b0
        v0, v1 = v1, -v0
        n0, n1 = n1, n0
    if n0 < n2:
        b0, b2 = b2, -b0
        v0, v2 = v2, -v0
        n0, n2 = n2, n0
    if n1 < n2:
        b1, b2 = b2, -b1
        v1, v2 = v2, -v1
        n1, n2 = n2, n1
    s0 = ti.sqrt(n0)
    u0 = ti.Vector([1.0, 0.0, 0.0])
    if s0 > _tiny():
        u0 = b0 / s0
    u1 = b1 - u0.dot(b1) * u0
    s1n = u1.norm()
    if s1n > eps * s0 and s1n > _tiny():
        u1 = u1 / s1n
    else:
        # rank <= 1: any unit vector orthogonal to u0 (v1 stays orthogonal to v0)
        u1 = _any_perpendicular(u0)
    u2 = u0.cross(u1)
    sigma = ti.Vector([s0, u1.dot(b1), u2.dot(b2)])
    U = ti.Matrix.cols([u0, u1, u2])
    V = ti.Matrix.cols([v0, v1, v2])
    return U, sigma, V


@ti.func
def closest_rotation(G):
    """argmax_{R in SO(3)} tr(R^T G) = U V^T of the signed SVD."""
    U, _s, V = svd3(G)
    return U @ V.transpose()


@ti.func
def sym_eig3(A):
    """Eigen-decomposition of the symmetric 3x3 A: returns (lam (vec3), Q) with
    A = Q diag(lam) Q^T, Q in SO(3) (eigenvalues unsorted). Cyclic two-sided Jacobi."""
    a = 0.5 * (A + A.transpose())
    Q = ti.Matrix.identity(float, 3)
    eps = _eps()
    for _sweep in range(_JACOBI_SWEEPS):
        off = a[0, 1] * a[0, 1] + a[0, 2] * a[0, 2] + a[1, 2] * a[1, 2]
        diag = a[0, 0] * a[0, 0] + a[1, 1] * a[1, 1] + a[2, 2] * a[2, 2]
        if off <= eps * eps * diag or off <= _tiny():
            break
        for k in range(3):  # pairs (p, q) = (0, 1), (0, 2), (1, 2); r is the third index
            p = 0 if k < 2 else 1
            q = 1 if k == 0 else 2
            r = 2 - k
            apq = a[p, q]
            if ti.abs(apq) > _tiny():
                theta = (a[q, q] - a[p, p]) / (2.0 * apq)
                t = 0.0
                if ti.abs(theta) > 1e150:
                    t = 0.5 / theta
                else:
                    t = 1.0 / (ti.abs(theta) + ti.sqrt(theta * theta + 1.0))
                    if theta < 0.0:
                        t = -t
                c = 1.0 / ti.sqrt(t * t + 1.0)
                s = t * c
                # a <- J^T a J, J the rotation in the (p, q) plane with J_pq = s, J_qp = -s
                arp = a[r, p]
                arq = a[r, q]
                a[p, p] = a[p, p] - t * apq
                a[q, q] = a[q, q] + t * apq
                a[p, q] = 0.0
                a[q, p] = 0.0
                a[r, p] = c * arp - s * arq
                a[p, r] = a[r, p]
                a[r, q] = s * arp + c * arq
                a[q, r] = a[r, q]
                for i in range(3):
                    qip = Q[i, p]
                    qiq = Q[i, q]
                    Q[i, p] = c * qip - s * qiq
                    Q[i, q] = s * qip + c * qiq
    return ti.Vector([a[0, 0], a[1, 1], a[2, 2]]), Q


# ---------------------------------------------------------------------------
# energies in the eigenvalues / signed singular values sigma


@ti.func
def energy_sigma(mat, sigma, mu, lam):
    """psi(sigma) in Pa for material code ``mat`` (see module doc); +inf outside the domain."""
    e = 0.0
    J = sigma[0] * sigma[1] * sigma[2]
    s2 = sigma.dot(sigma)
    inf = ti.math.inf
    if mat == ARAP or mat == COROTATED:
        d = sigma - 1.0
        e = mu * d.dot(d)
        if mat == COROTATED:
            e += 0.5 * lam * (J - 1.0) * (J - 1.0)
    elif mat == SYMMETRIC_DIRICHLET:
        if J == 0.0:
            e = inf
        else:
            inv = 1.0 / sigma
            e = 0.5 * mu * (s2 + inv.dot(inv)) - 3.0 * mu
    else:
        if J <= 0.0:
            e = inf
        else:
            lj = tm.log(J)
            e = 0.5 * mu * (s2 - 3.0) - mu * lj
            if mat == NEO_HOOKEAN:
                e += 0.5 * lam * lj * lj
    return e


@ti.func
def gradient_sigma(mat, sigma, mu, lam):
    """d psi / d sigma (vec3), Pa (domain as in :func:`energy_sigma`)."""
    J = sigma[0] * sigma[1] * sigma[2]
    g = ti.Vector([0.0, 0.0, 0.0])
    if mat == ARAP or mat == COROTATED:
        g = 2.0 * mu * (sigma - 1.0)
        if mat == COROTATED:
            dJ = ti.Vector([sigma[1] * sigma[2], sigma[0] * sigma[2], sigma[0] * sigma[1]])
            g += lam * (J - 1.0) * dJ
    elif mat == SYMMETRIC_DIRICHLET:
        g = mu * (sigma - 1.0 / (sigma * sigma * sigma))
    else:
        lj = tm.log(J)
        g = mu * (sigma - 1.0 / sigma)
        if mat == NEO_HOOKEAN:
            g += lam * lj / sigma
    return g


@ti.func
def hessian_sigma(mat, sigma, mu, lam):
    """d^2 psi / d sigma^2 (3x3), Pa (domain as in :func:`energy_sigma`)."""
    J = sigma[0] * sigma[1] * sigma[2]
    H = ti.Matrix.zero(float, 3, 3)
    if mat == ARAP or mat == COROTATED:
        H = 2.0 * mu * ti.Matrix.identity(float, 3)
        if mat == COROTATED:
            dJ = ti.Vector([sigma[1] * sigma[2], sigma[0] * sigma[2], sigma[0] * sigma[1]])
            HJ = ti.Matrix([[0.0, sigma[2], sigma[1]], [sigma[2], 0.0, sigma[0]], [sigma[1], sigma[0], 0.0]])
            H += lam * (dJ.outer_product(dJ) + (J - 1.0) * HJ)
    elif mat == SYMMETRIC_DIRICHLET:
        for j in range(3):
            H[j, j] = mu * (1.0 + 3.0 / (sigma[j] * sigma[j] * sigma[j] * sigma[j]))
    else:
        inv = 1.0 / sigma
        lj = tm.log(J)
        for j in range(3):
            H[j, j] = mu * (1.0 + inv[j] * inv[j])
            if mat == NEO_HOOKEAN:
                H[j, j] -= lam * lj * inv[j] * inv[j]
        if mat == NEO_HOOKEAN:
            H += lam * inv.outer_product(inv)
    return H


# ---------------------------------------------------------------------------
# proximal operators (notes §2.6): argmin_sigma  w psi(sigma) + rho/2 ||sigma - s||^2


@ti.func
def _prox_symmetric_gradient_1d(s, c, rho):
    """Positive root of (c + rho) x^2 - rho s x - c = 0 (cancellation-free form)."""
    b = rho * s
    disc = ti.sqrt(b * b + 4.0 * c * (c + rho))
    x = 0.0
    if b >= 0.0:
        x = (b + disc) / (2.0 * (c + rho))
    else:
        x = 2.0 * c / (disc - b)
    return x


@ti.func
def _prox_symmetric_dirichlet_1d(s, c, rho):
    """Unique positive root of phi(x) = (c + rho) x^4 - rho s x^3 - c (Newton in a bisection bracket)."""
    lo = 0.0
    hi = ti.max(s, 1.0) + 1.0
    # start from the SymG solution (same structure, tight for small c/rho)
    x = ti.min(ti.max(_prox_symmetric_gradient_1d(s, c, rho), 0.5 * hi * 1e-6), hi)
    a4 = c + rho
    a3 = rho * s
    for _ in range(200):
        x2 = x * x
        phi = a4 * x2 * x2 - a3 * x2 * x - c
        if phi > 0.0:
            hi = x
        else:
            lo = x
        dphi = 4.0 * a4 * x2 * x - 3.0 * a3 * x2
        xn = 0.5 * (lo + hi)
        if dphi > 0.0:
            xn = x - phi / dphi
            if not (xn > lo and xn < hi):
                xn = 0.5 * (lo + hi)
        step = ti.abs(xn - x)
        x = xn
        if step <= 4.0 * _eps() * x or hi - lo <= 4.0 * _eps() * hi:
            break
    return x


@ti.func
def _solve_spd3(H, b):
    """H^-1 b by a 3x3 Cholesky factorization; returns (x, ok), ok False when H is not
    (numerically) positive definite."""
    ok = True
    x = ti.Vector([0.0, 0.0, 0.0])
    tol = 1e3 * _eps() * (ti.abs(H[0, 0]) + ti.abs(H[1, 1]) + ti.abs(H[2, 2]))
    l00 = H[0, 0]
    if l00 <= tol:
        ok = False
    else:
        l00 = ti.sqrt(l00)
        l10 = H[1, 0] / l00
        l20 = H[2, 0] / l00
        l11 = H[1, 1] - l10 * l10
        if l11 <= tol:
            ok = False
        else:
            l11 = ti.sqrt(l11)
            l21 = (H[2, 1] - l20 * l10) / l11
            l22 = H[2, 2] - l20 * l20 - l21 * l21
            if l22 <= tol:
                ok = False
            else:
                l22 = ti.sqrt(l22)
                y0 = b[0] / l00
                y1 = (b[1] - l10 * y0) / l11
                y2 = (b[2] - l20 * y0 - l21 * y1) / l22
                x2 = y2 / l22
                x1 = (y1 - l21 * x2) / l11
                x0 = (y0 - l10 * x1 - l20 * x2) / l00
                x = ti.Vector([x0, x1, x2])
    return x, ok


@ti.func
def _coupled_objective(mat, x, s, cw, lw, rho):
    """w psi(x) + rho/2 ||x - s||^2 (cw = w mu, lw = w lam) for Neo-Hookean and corotated."""
    d = x - s
    J = x[0] * x[1] * x[2]
    e = 0.5 * rho * d.dot(d)
    if mat == NEO_HOOKEAN:
        lj = tm.log(J)
        e += cw * (0.5 * x.dot(x) - lj) + 0.5 * lw * lj * lj
    else:
        y = x - 1.0
        e += cw * y.dot(y) + 0.5 * lw * (J - 1.0) * (J - 1.0)
    return e


@ti.func
def _prox_newton(mat, s, cw, lw, rho, x0, max_iterations):
    """Damped Newton for the coupled proxes (Neo-Hookean with lambda, corotated).
    Returns (x, ok): ok is 0 when the iteration stopped at ``max_iterations`` or at a failed
    line search away from the round-off floor of the gradient (x is then the last iterate,
    not the minimiser, and the caller must not take it as converged).

    Neo-Hookean's Hessian is diag(d) + lw u u^T (u = 1/x), inverted by
    Sherman-Morrison after clamping d to >= rho/2 (positive definite). Corotated
    uses its full Hessian when that is positive definite (3x3 Cholesky), else the
    Gauss-Newton model without the (J - 1) d^2J/dx^2 term (diagonal + rank one).
    Steps are cut to keep x > 0 (Neo-Hookean) or x >= 0 (corotated) and halved until
    the objective decreases (Armijo, with a round-off allowance).
    """
    x = x0
    f = _coupled_objective(mat, x, s, cw, lw, rho)
    scale = cw + lw + rho
    ok = 0
    for _ in range(max_iterations):
        J = x[0] * x[1] * x[2]
        u = ti.Vector([0.0, 0.0, 0.0])
        dg = ti.Vector([0.0, 0.0, 0.0])
        g = rho * (x - s)
        if mat == NEO_HOOKEAN:
            u = 1.0 / x
            lj = tm.log(J)
            g += cw * (x - u) + lw * lj * u
            dg = rho + cw + (cw - lw * lj) * u * u
        else:
            u = ti.Vector([x[1] * x[2], x[0] * x[2], x[0] * x[1]])
            g += 2.0 * cw * (x - 1.0) + lw * (J - 1.0) * u
            dg = ti.Vector([rho + 2.0 * cw, rho + 2.0 * cw, rho + 2.0 * cw])
            for j in range(3):  # a bound x_j = 0 with the gradient pushing outwards is active
                if x[j] <= 0.0 and g[j] > 0.0:
                    g[j] = 0.0
                    u[j] = 0.0
        gnorm = g.norm()
        if gnorm <= 8.0 * _eps() * scale * ti.max(1.0, x.norm()):
            ok = 1
            break
        d = ti.Vector([0.0, 0.0, 0.0])
        solved = False
        if mat == COROTATED:
            # the full Hessian when it is positive definite (Newton's quadratic convergence)
            H = lw * (J - 1.0) * ti.Matrix([[0.0, x[2], x[1]], [x[2], 0.0, x[0]], [x[1], x[0], 0.0]])
            H += lw * u.outer_product(u)
            for j in range(3):
                H[j, j] += dg[j]
            d, solved = _solve_spd3(H, g)
            d = -d
        if not solved:
            dg = ti.max(dg, 0.5 * rho)
            Dg = g / dg
            Du = u / dg
            d = -(Dg - Du * (lw * u.dot(Dg) / (1.0 + lw * u.dot(Du))))
        alpha = 1.0
        for j in range(3):
            if d[j] < 0.0:
                if mat == NEO_HOOKEAN:
                    alpha = ti.min(alpha, 0.95 * x[j] / (-d[j]))
                elif x[j] <= 0.0:
                    d[j] = 0.0
                else:
                    alpha = ti.min(alpha, x[j] / (-d[j]))
        slope = g.dot(d)
        accepted = False
        xn = x
        fn = f
        for _ls in range(60):
            xn = x + alpha * d
            if mat == COROTATED:
                xn = ti.max(xn, 0.0)
            fn = _coupled_objective(mat, xn, s, cw, lw, rho)
            # Armijo, with a round-off allowance: near the optimum f changes by ~eps |f|
            if fn <= f + 1e-4 * alpha * slope + 16.0 * _eps() * ti.abs(f):
                accepted = True
                break
            alpha *= 0.5
        if not accepted:
            # no decrease along a descent direction: converged only at the round-off floor
            if gnorm <= 1e-7 * scale * ti.max(1.0, x.norm()):
                ok = 1
            break
        moved = (xn - x).norm()
        x = xn
        f = fn
        if moved <= 4.0 * _eps() * ti.max(1.0, x.norm()):
            ok = 1
            break
    return x, ok


@ti.func
def prox_sigma(mat, s, w, mu, lam, rho, newton_iterations):
    """argmin_{sigma} w psi(sigma) + rho/2 ||sigma - s||^2 over sigma > 0 (>= 0 for
    ARAP/corotated), per material code ``mat``. s: vec3 eigenvalues of sym(R^T C);
    w: element weight (rest volume, m^3); mu, lam: Pa; rho: the element's ADMM penalty;
    newton_iterations: cap of the damped Newton solve of the coupled proxes (Neo-Hookean
    with lam != 0, corotated). Returns (sigma, ok): ok = 0 when that Newton solve stopped
    unconverged (the closed-form and bracketed 1D proxes always converge)."""
    out = ti.Vector([0.0, 0.0, 0.0])
    ok = 1
    cw = w * mu
    lw = w * lam
    if mat == ARAP or mat == COROTATED:
        # ARAP: quadratic isotropic objective, the unconstrained minimiser clamped to the PSD cone
        out = ti.max((2.0 * cw + rho * s) / (2.0 * cw + rho), 0.0)
    else:
        for j in range(3):
            if mat == SYMMETRIC_DIRICHLET:
                out[j] = _prox_symmetric_dirichlet_1d(s[j], cw, rho)
            else:  # symmetric gradient, and Neo-Hookean's lambda = 0 solution
                out[j] = _prox_symmetric_gradient_1d(s[j], cw, rho)
    if (mat == NEO_HOOKEAN or mat == COROTATED) and lw != 0.0:
        out, ok = _prox_newton(mat, s, cw, lw, rho, out, newton_iterations)
    return out, ok


@ti.func
def prox_stretch(mat, Ssym, w, mu, lam, rho, newton_iterations):
    """The P-step on a symmetric matrix: Q diag(prox_sigma(eig(Ssym))) Q^T; returns it and
    the ok flag of :func:`prox_sigma`."""
    lam_s, Q = sym_eig3(Ssym)
    sig, ok = prox_sigma(mat, lam_s, w, mu, lam, rho, newton_iterations)
    return Q @ ti.Matrix([[sig[0], 0.0, 0.0], [0.0, sig[1], 0.0], [0.0, 0.0, sig[2]]]) @ Q.transpose(), ok


# ---------------------------------------------------------------------------
# numpy entry points (tests, tools): run the Taichi functions on batches


@ti.func
def _load_mat(a: ti.template(), i):
    M = ti.Matrix.zero(float, 3, 3)
    for r, c in ti.static(ti.ndrange(3, 3)):
        M[r, c] = a[i, r, c]
    return M


@ti.func
def _store_mat(a: ti.template(), i, M):
    for r, c in ti.static(ti.ndrange(3, 3)):
        a[i, r, c] = M[r, c]


@ti.kernel
def _svd_kernel(
    G: ti.types.ndarray(ndim=3), U: ti.types.ndarray(ndim=3), S: ti.types.ndarray(ndim=2), V: ti.types.ndarray(ndim=3)
):
    for i in range(G.shape[0]):
        u, s, v = svd3(_load_mat(G, i))
        _store_mat(U, i, u)
        _store_mat(V, i, v)
        for j in ti.static(range(3)):
            S[i, j] = s[j]


@ti.kernel
def _eig_kernel(A: ti.types.ndarray(ndim=3), L: ti.types.ndarray(ndim=2), Q: ti.types.ndarray(ndim=3)):
    for i in range(A.shape[0]):
        lam, q = sym_eig3(_load_mat(A, i))
        _store_mat(Q, i, q)
        for j in ti.static(range(3)):
            L[i, j] = lam[j]


@ti.kernel
def _prox_kernel(
    mat: ti.types.ndarray(ndim=1),
    s: ti.types.ndarray(ndim=2),
    w: ti.types.ndarray(ndim=1),
    mu: ti.types.ndarray(ndim=1),
    lam: ti.types.ndarray(ndim=1),
    rho: ti.types.ndarray(ndim=1),
    out: ti.types.ndarray(ndim=2),
    ok: ti.types.ndarray(ndim=1),
    newton_iterations: ti.i32,
):
    for i in range(s.shape[0]):
        sv = ti.Vector([s[i, 0], s[i, 1], s[i, 2]])
        x, good = prox_sigma(mat[i], sv, w[i], mu[i], lam[i], rho[i], newton_iterations)
        ok[i] = good
        for j in ti.static(range(3)):
            out[i, j] = x[j]


@ti.kernel
def _energy_kernel(
    mat: ti.types.ndarray(ndim=1),
    s: ti.types.ndarray(ndim=2),
    mu: ti.types.ndarray(ndim=1),
    lam: ti.types.ndarray(ndim=1),
    out: ti.types.ndarray(ndim=1),
):
    for i in range(s.shape[0]):
        sv = ti.Vector([s[i, 0], s[i, 1], s[i, 2]])
        out[i] = energy_sigma(mat[i], sv, mu[i], lam[i])


def _real(a) -> np.ndarray:
    from tisim import backend

    return np.ascontiguousarray(a, dtype=backend.np_real())


def _batch_param(v, m: int) -> np.ndarray:
    return _real(np.broadcast_to(np.asarray(v, dtype=np.float64), (m,)))


def signed_svd(G) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Signed SVD of G (m, 3, 3) with the Taichi kernel: U (m, 3, 3), sigma (m, 3), V (m, 3, 3)."""
    G = _real(np.reshape(G, (-1, 3, 3)))
    U, V = np.zeros_like(G), np.zeros_like(G)
    S = np.zeros((len(G), 3), dtype=G.dtype)
    if len(G):
        _svd_kernel(G, U, S, V)
    return U, S, V


def symmetric_eigen(A) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (m, 3) and rotations Q (m, 3, 3) of symmetric A (m, 3, 3) with the Taichi kernel."""
    A = _real(np.reshape(A, (-1, 3, 3)))
    L = np.zeros((len(A), 3), dtype=A.dtype)
    Q = np.zeros_like(A)
    if len(A):
        _eig_kernel(A, L, Q)
    return L, Q


def _codes(material, m: int) -> np.ndarray:
    if isinstance(material, str):
        material = MATERIALS.index(material)
    return np.ascontiguousarray(np.broadcast_to(np.asarray(material, dtype=np.int32), (m,)))


def prox_eigenvalues(
    material, s, w, mu, lam, rho, *, newton_iterations: int = NEWTON_ITERATIONS, with_status: bool = False
):
    """The P-step on eigenvalues s (m, 3): argmin_sigma w psi(sigma) + rho/2 ||sigma - s||^2.

    material: scene material name or code(s); w (m^3), mu, lam (Pa), rho: scalars or (m,);
    newton_iterations: cap of the coupled proxes' Newton solve. Returns sigma (m, 3), and with
    ``with_status`` also ok (m,) bool: False where that Newton solve stopped unconverged.
    """
    s = _real(np.reshape(s, (-1, 3)))
    m = len(s)
    out = np.zeros_like(s)
    ok = np.ones(m, dtype=np.int32)
    if m:
        _prox_kernel(
            _codes(material, m),
            s,
            _batch_param(w, m),
            _batch_param(mu, m),
            _batch_param(lam, m),
            _batch_param(rho, m),
            out,
            ok,
            int(newton_iterations),
        )
    return (out, ok.astype(bool)) if with_status else out


def energy_eigenvalues(material, sigma, mu, lam) -> np.ndarray:
    """psi(sigma) (m,) in Pa of the Taichi energy functions (for cross-checks with tisim.materials)."""
    s = _real(np.reshape(sigma, (-1, 3)))
    m = len(s)
    out = np.zeros(m, dtype=s.dtype)
    if m:
        _energy_kernel(_codes(material, m), s, _batch_param(mu, m), _batch_param(lam, m), out)
    return out
