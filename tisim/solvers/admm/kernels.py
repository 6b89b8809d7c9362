"""Element-wise kernels of the ADMM integrator (Taichi, compiled once per process).

All element data live in Taichi ndarrays passed as arguments, so the kernels
are module-level and compiled once whatever the number of solver instances;
vertex arrays (positions, right-hand sides) are plain numpy (n, 3) arrays
because the q-step solve runs on the host (CHOLMOD). Element data are packed
into four arrays because every kernel argument costs launch time, and one ADMM
iteration is one launch of :func:`iterate`:

* ``topo`` (m, 5) i32: the tet's four vertices, then its material code;
* ``params`` (m, 6) float: w (rest volume, m^3), mu, lam (Pa), rho, eta (ADMM penalties),
  wk = w * k (k: the material's stiffness at rest, Pa; the unit of the residuals);
* ``grad`` (m, 4, 3): shape-function gradients, 1/m;
* ``split`` (m, 4) 3x3 matrices: R, S, Y (the splitting and its dual) and Fk = F(q^k).

Conventions: ``F_e(x) = sum_a x[topo[e, a]] grad[e, a]^T`` (the deformation
gradient). The notes' J_e = D_e q is F_e^T and their splitting J = U P is
written here as F = R S (R = U^T, S = U P U^T): the same problem, since the
Frobenius norm and isotropic energies are invariant under transposition.
"""

# No "from __future__ import annotations": Taichi reads kernel annotations as objects.

import taichi as ti

from tisim.solvers.admm import prox

ND1 = ti.types.ndarray(ndim=1)
ND2 = ti.types.ndarray(ndim=2)
ND3 = ti.types.ndarray(ndim=3)

# columns of ``params`` and slots of ``split``
W, MU, LAM, RHO, ETA, WK = range(6)
N_PARAMS = 6
MAT = 4  # column of ``topo``
R_, S_, Y_, FK = range(4)

# reductions returned by ``iterate`` (indices into its result vector)
PRIMAL, DUAL, VOLUME, MIN_DET_Z, MIN_DET_F, NONFINITE, STRESS, PROX_FAILED = range(8)
N_SUMS = 8


@ti.func
def _deformation_gradient(x: ti.template(), topo: ti.template(), grad: ti.template(), e):
    F = ti.Matrix.zero(float, 3, 3)
    for a in ti.static(range(4)):
        v = topo[e, a]
        xa = ti.Vector([x[v, 0], x[v, 1], x[v, 2]])
        F += xa.outer_product(ti.Vector([grad[e, a, 0], grad[e, a, 1], grad[e, a, 2]]))
    return F


@ti.func
def _diag(s):
    return ti.Matrix([[s[0], 0.0, 0.0], [0.0, s[1], 0.0], [0.0, 0.0, s[2]]])


@ti.func
def _scatter(rhs: ti.template(), topo: ti.template(), grad: ti.template(), e, X):
    """rhs[topo[e, a]] += X grad[e, a] for the four vertices a."""
    for a in ti.static(range(4)):
        v = topo[e, a]
        f = X @ ti.Vector([grad[e, a, 0], grad[e, a, 1], grad[e, a, 2]])
        for c in ti.static(range(3)):
            ti.atomic_add(rhs[v, c], f[c])


@ti.func
def _rhs_term(rho, R, S, Y, Fk):
    """rho/2 (R S - Y/rho - Fk/2): the element's part of B (notes §2.5a) is this times grad[e, a]."""
    return 0.5 * rho * (R @ S - Y / rho - 0.5 * Fk)


@ti.kernel
def store_deformation_gradients(x: ND2, topo: ND2, grad: ND3, split: ND2):
    """split[e, FK] = F_e(x)."""
    for e in range(topo.shape[0]):
        split[e, FK] = _deformation_gradient(x, topo, grad, e)


@ti.kernel
def init_splitting(topo: ND2, params: ND2, split: ND2, stress_dual: ti.i32, floor: float):
    """R, S from the signed polar decomposition of F = split[e, FK] (notes §2.5b); singular
    values below ``floor`` (inverted or flat elements) are raised to it. Y = w P(R S) (the
    first Piola stress: the converged dual of a static element) if ``stress_dual``, else 0."""
    for e in range(topo.shape[0]):
        U, sig, V = prox.svd3(split[e, FK])
        for j in ti.static(range(3)):
            sig[j] = ti.max(sig[j], floor)
        split[e, R_] = U @ V.transpose()
        split[e, S_] = V @ _diag(sig) @ V.transpose()
        Ye = ti.Matrix.zero(float, 3, 3)
        if stress_dual != 0:
            g = prox.gradient_sigma(topo[e, MAT], sig, params[e, MU], params[e, LAM])
            Ye = params[e, W] * (U @ _diag(g) @ V.transpose())
        split[e, Y_] = Ye


@ti.kernel
def assemble_rhs(rhs: ND2, topo: ND2, grad: ND3, params: ND2, split: ND2):
    """rhs[v] += sum over tets e with topo[e, a] = v of rho_e/2 (R_e S_e - Y_e/rho_e - Fk_e/2) grad[e, a]
    (the element part of B in notes §2.5a)."""
    for e in range(topo.shape[0]):
        X = _rhs_term(params[e, RHO], split[e, R_], split[e, S_], split[e, Y_], split[e, FK])
        _scatter(rhs, topo, grad, e, X)


@ti.kernel
def iterate(
    x: ND2, rhs: ND2, topo: ND2, params: ND2, grad: ND3, split: ND2, check_stress: ti.i32, newton_iterations: ti.i32
) -> ti.types.vector(N_SUMS, float):
    """One ADMM pass over the elements after a q-step (notes §3, step 2.2 and the dual step):
    F = (Fk + F(x)) / 2, C = F + Y/rho; R <- rotation of rho C S + eta R (signed SVD);
    S <- prox_{(w/rho) psi}(sym(R^T C)); Y <- Y + rho (F - R S). Then the element part of
    the next q-step's right-hand side is added to ``rhs`` (as in :func:`assemble_rhs`).

    Returns (PRIMAL = sum w ||F - R S||^2, DUAL = sum w (rho/wk)^2 ||R S - (R S)_old||^2,
    VOLUME = sum w, MIN_DET_Z = min det(R S), MIN_DET_F = min det F, NONFINITE = number of
    elements whose update was not finite and was discarded, STRESS, PROX_FAILED = number of
    elements whose S-step Newton solve (Neo-Hookean with lam, corotated) stopped unconverged at
    ``newton_iterations``: their S is not the prox, so the iteration must not count as converged).

    STRESS (only when ``check_stress``; else 0): sum w (||w P(F) - Y - rho dZ|| / wk)^2.
    The q-step just solved satisfies
    M (q - z)/h^2 = -1/2 sum G^T (Y + rho dZ) exactly, so this is the element-wise
    residual of the implicit midpoint equations M (q - z)/h^2 + 1/2 grad E(q_mid) = 0,
    relative to the stiffness (inf where a barrier element is inverted at the midpoint).
    """
    primal = 0.0
    dual = 0.0
    volume = 0.0
    min_det_z = ti.math.inf
    min_det_f = ti.math.inf
    nonfinite = 0.0
    stress = 0.0
    prox_failed = 0.0
    for e in range(topo.shape[0]):
        w = params[e, W]
        re = params[e, RHO]
        Fk = split[e, FK]
        Rold = split[e, R_]
        Sold = split[e, S_]
        Yold = split[e, Y_]
        F = 0.5 * (Fk + _deformation_gradient(x, topo, grad, e))
        C = F + Yold / re
        Rn = prox.closest_rotation(re * C @ Sold + params[e, ETA] * Rold)
        T = Rn.transpose() @ C
        Sn, prox_ok = prox.prox_stretch(
            topo[e, MAT], 0.5 * (T + T.transpose()), w, params[e, MU], params[e, LAM], re, newton_iterations
        )
        if prox_ok == 0:
            prox_failed += 1.0
        Z = Rn @ Sn
        D = F - Z
        Yn = Yold + re * D
        ok = True
        for r, c in ti.static(ti.ndrange(3, 3)):
            if not (ti.abs(Z[r, c]) < ti.math.inf and ti.abs(Yn[r, c]) < ti.math.inf):
                ok = False
        if ok:
            split[e, R_] = Rn
            split[e, S_] = Sn
            split[e, Y_] = Yn
            dZ = Z - Rold @ Sold
            primal += w * D.norm_sqr()
            dual += w * (re / params[e, WK]) ** 2 * dZ.norm_sqr()
            ti.atomic_min(min_det_z, Z.determinant())
            _scatter(rhs, topo, grad, e, _rhs_term(re, Rn, Sn, Yn, Fk))
            if check_stress != 0:
                U, sig, V = prox.svd3(F)
                g = prox.gradient_sigma(topo[e, MAT], sig, params[e, MU], params[e, LAM])
                X = w * (U @ _diag(g) @ V.transpose()) - Yn - re * dZ
                r = X.norm() / params[e, WK]
                if not (r < ti.math.inf):
                    r = ti.math.inf
                stress += w * r * r
        else:
            # keep the previous splitting; the step is reported as not converged
            nonfinite += 1.0
            primal += w * (F - Rold @ Sold).norm_sqr()
            _scatter(rhs, topo, grad, e, _rhs_term(re, Rold, Sold, Yold, Fk))
        volume += w
        ti.atomic_min(min_det_f, F.determinant())
    return ti.Vector([primal, dual, volume, min_det_z, min_det_f, nonfinite, stress, prox_failed])


@ti.kernel
def scale_penalties(params: ND2, factor: float):
    """rho and eta of every element times ``factor`` (residual balancing)."""
    for e in range(params.shape[0]):
        params[e, RHO] *= factor
        params[e, ETA] *= factor


@ti.kernel
def elastic_energy(x: ND2, topo: ND2, grad: ND3, params: ND2) -> ti.types.vector(2, float):
    """(sum_e w_e psi_e(F_e(x)) in J (inf if a barrier element is inverted), min_e det F_e(x))."""
    total = 0.0
    min_det = ti.math.inf
    for e in range(topo.shape[0]):
        F = _deformation_gradient(x, topo, grad, e)
        _U, sig, _V = prox.svd3(F)
        total += params[e, W] * prox.energy_sigma(topo[e, MAT], sig, params[e, MU], params[e, LAM])
        ti.atomic_min(min_det, F.determinant())
    return ti.Vector([total, min_det])


@ti.kernel
def elastic_forces(x: ND2, topo: ND2, grad: ND3, params: ND2, f: ND2):
    """f[v] -= sum_e w_e P_e(F_e(x)) grad[e, a]: minus the gradient of the elastic energy, N."""
    for e in range(topo.shape[0]):
        F = _deformation_gradient(x, topo, grad, e)
        U, sig, V = prox.svd3(F)
        g = prox.gradient_sigma(topo[e, MAT], sig, params[e, MU], params[e, LAM])
        P = params[e, W] * (U @ _diag(g) @ V.transpose())
        _scatter(f, topo, grad, e, -P)


@ti.kernel
def stiffness_ratio(topo: ND2, params: ND2, split: ND2, rho_scale: float, out: ND1):
    """out[e]: the factor by which rho_e must exceed rho_scale * w_e * k_e (k_e: stiffness at
    rest), from the eigenvalues sigma of S_e:

    * curvature: largest |eigenvalue| of d^2 psi/d sigma^2 over k_e (nonconvex ADMM needs
      rho above the curvature of the split-off function);
    * stress: max_j 2 w (-dpsi/dsigma_j) / sigma_j over rho_scale w k_e. At the fixed point
      R^T (rho C S + eta R) = rho S^2 + w psi'(S) S + eta I; a compressive stress
      (psi' < 0, barrier energies squeezed) of magnitude rho sigma makes it indefinite and
      the rotation step ill-conditioned (R then jumps and ADMM cycles). rho >= 2 w |psi'|/sigma
      keeps it above rho sigma^2 / 2.
    """
    for e in range(topo.shape[0]):
        lam_s, _Q = prox.sym_eig3(split[e, S_])
        for j in ti.static(range(3)):
            lam_s[j] = ti.max(lam_s[j], 1e-8)
        mat = topo[e, MAT]
        H = prox.hessian_sigma(mat, lam_s, params[e, MU], params[e, LAM])
        ev, _Q2 = prox.sym_eig3(H)
        k = ti.max(ti.abs(ev[0]), ti.max(ti.abs(ev[1]), ti.abs(ev[2])))
        g = prox.gradient_sigma(mat, lam_s, params[e, MU], params[e, LAM])
        stress = 0.0
        for j in ti.static(range(3)):
            stress = ti.max(stress, -2.0 * g[j] / lam_s[j])
        k_rest = params[e, WK] / params[e, W]
        r = ti.max(k / k_rest, stress / (rho_scale * k_rest))
        if not (r < ti.math.inf):
            r = 1e30
        out[e] = r
