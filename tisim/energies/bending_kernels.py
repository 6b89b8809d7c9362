"""Taichi kernels of the hinge bending of shells: Psi_b = k w (theta - theta_bar)^2 per
interior edge, its gradient, exact Hessian and Gauss-Newton factors.

Conventions (ndarray arguments, serial sums on the CPU, the hinge's vertex order and the
sign of its dihedral angle) are those of :mod:`tisim.energies.shell_kernels`.

This module has no ``from __future__ import annotations``: Taichi reads the
kernels' type annotations when they are decorated.
"""

import taichi as ti

from tisim import backend
from tisim import ti_math as tm

# Packed per-hinge data of the bending (columns of ``hinge_data``, real):
# rest angle, weight 3 |e_bar|^2 / A_bar_e, stiffness k.
B_THETA, B_WEIGHT, B_K = 0, 1, 2
BENDING_COLS = 3

# For hinge face i, the hinge-local vertex of role (e0, e1, opposite).
_ROLE_VERTEX = ((0, 1, 2), (0, 1, 3))


@ti.func
def skew(v):
    """[v]_x, the matrix of the cross product v x (.)."""
    return ti.Matrix([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])


# ---------------------------------------------------------------------------
# Hinge bending: Psi_b = k w (theta - theta_bar)^2, w = 3 |e_bar|^2 / A_bar_e.
# Gradient of theta (Bridson et al. 2003 form): with N_i the unnormalised normal
# of hinge face i and q_i = N_i / |N_i|^2,
#   dtheta/dx_v = sum_i c_{i,v} q_i,  c_{i,o_i} = -|e|,  c_{i,e1} = d_i . e_hat,
#   c_{i,e0} = |e| - d_i . e_hat,  d_i = x_{o_i} - x_{e0}.
# Its Hessian is the exact derivative of that expression:
#   d^2theta/dx_v dx_w = sum_i q_i (grad_w c_{i,v})^T + c_{i,v} Q_i dN_i/dx_w,
#   Q_i = (I - 2 n_i n_i^T) / |N_i|^2, dN/da = [c - b]_x (cyclic over face (a, b, c)).


@ti.func
def hinge_positions(x: ti.template(), hinges: ti.template(), h):
    return x[hinges[h, 0]], x[hinges[h, 1]], x[hinges[h, 2]], x[hinges[h, 3]]


@ti.func
def dihedral_angle(xe0, xe1, xo0, xo1):
    e = xe1 - xe0
    n0 = e.cross(xo0 - xe0)
    n1 = (xe0 - xe1).cross(xo1 - xe1)
    return tm.atan2(n0.cross(n1).dot(e) / e.norm(), n0.dot(n1))


@ti.func
def dihedral_gradient(xe0, xe1, xo0, xo1):
    """(dtheta/dx_e0, dtheta/dx_e1, dtheta/dx_o0, dtheta/dx_o1)."""
    e = xe1 - xe0
    el = e.norm()
    eh = e / el
    N0 = e.cross(xo0 - xe0)
    N1 = (xe0 - xe1).cross(xo1 - xe1)
    q0 = N0 / N0.norm_sqr()
    q1 = N1 / N1.norm_sqr()
    s0 = (xo0 - xe0).dot(eh)
    s1 = (xo1 - xe0).dot(eh)
    return (el - s0) * q0 + (el - s1) * q1, s0 * q0 + s1 * q1, -el * q0, -el * q1


@ti.func
def bending_energy_pass(x: ti.template(), hinges: ti.template(), data: ti.template(), out: ti.template(), count):
    """out[0] = sum over hinges of Psi_b (J)."""
    out[0] = 0.0
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for h in range(count):
        xe0, xe1, xo0, xo1 = hinge_positions(x, hinges, h)
        d = dihedral_angle(xe0, xe1, xo0, xo1) - data[h, B_THETA]
        out[0] += data[h, B_K] * data[h, B_WEIGHT] * d * d


@ti.kernel
def bending_energy(
    x: ti.types.ndarray(),
    hinges: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
):
    """``bending_energy_pass`` in a launch of its own."""
    bending_energy_pass(x, hinges, data, out, hinges.shape[0])


@ti.func
def bending_gradient_pass(x: ti.template(), hinges: ti.template(), data: ti.template(), g: ti.template(), count):
    """g += dPsi_b/dx (N)."""
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for h in range(count):
        xe0, xe1, xo0, xo1 = hinge_positions(x, hinges, h)
        c = 2.0 * data[h, B_K] * data[h, B_WEIGHT] * (dihedral_angle(xe0, xe1, xo0, xo1) - data[h, B_THETA])
        g0, g1, g2, g3 = dihedral_gradient(xe0, xe1, xo0, xo1)
        g[hinges[h, 0]] += c * g0
        g[hinges[h, 1]] += c * g1
        g[hinges[h, 2]] += c * g2
        g[hinges[h, 3]] += c * g3


@ti.kernel
def bending_gradient(
    x: ti.types.ndarray(),
    hinges: ti.types.ndarray(),
    data: ti.types.ndarray(),
    g: ti.types.ndarray(),
):
    """``bending_gradient_pass`` in a launch of its own."""
    bending_gradient_pass(x, hinges, data, g, hinges.shape[0])


# Coefficients of dc_{i, role r} / dx_{role s} = A[r][s] e_hat + B[r][s] p_i, with
# p_i = (d_i - (d_i . e_hat) e_hat) / |e| (roles e0, e1, opposite).
_DC_E = ((0, 1, -1), (-1, 0, 1), (1, -1, 0))
_DC_P = ((1, -1, 0), (-1, 1, 0), (0, 0, 0))


@ti.func
def outer(a, b):
    """a b^T of two 3-vectors (cheaper to trace than Matrix.outer_product)."""
    return ti.Matrix.cols([b[0] * a, b[1] * a, b[2] * a])


@ti.func
def store_block(out: ti.template(), e, v, w, blk):
    """out[e, 3 v + k, 3 w + l] = blk[k, l] (a runtime loop: traced once)."""
    for k, l in ti.ndrange(3, 3):
        out[e, 3 * v + k, 3 * w + l] = blk[k, l]


@ti.kernel
def bending_hessian(
    x: ti.types.ndarray(),
    hinges: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
    full: ti.template(),
):
    """out[h] = 12 x 12 Hessian of Psi_b of hinge h (N/m), vertex order (e0, e1, o0, o1):
    c (theta - theta_bar) Hess(theta) + c grad(theta) grad(theta)^T with c = 2 k w.
    full=False drops the first term (a Gauss-Newton, positive semi-definite
    approximation: the cheap analytic projection)."""
    for h in range(hinges.shape[0]):
        xe0, xe1, xo0, xo1 = hinge_positions(x, hinges, h)
        c = 2.0 * data[h, B_K] * data[h, B_WEIGHT]
        dtheta = dihedral_angle(xe0, xe1, xo0, xo1) - data[h, B_THETA]
        e = xe1 - xe0
        el = e.norm()
        eh = e / el
        N0 = e.cross(xo0 - xe0)
        N1 = (xe0 - xe1).cross(xo1 - xe1)
        nn0 = N0.norm_sqr()
        nn1 = N1.norm_sqr()
        q0 = N0 / nn0
        q1 = N1 / nn1
        d0 = xo0 - xe0
        d1 = xo1 - xe0
        s0 = d0.dot(eh)
        s1 = d1.dot(eh)
        # dtheta/dx_v = alpha_v q0 + beta_v q1 (alpha_v = c_{0, v}, beta_v = c_{1, v})
        alpha = [el - s0, s0, -el, 0.0]
        beta = [el - s1, s1, 0.0, -el]
        G00 = c * outer(q0, q0)
        G01 = c * outer(q0, q1)
        G11 = c * outer(q1, q1)
        q = [q0, q1]
        N = [N0, N1]
        nn = [nn0, nn1]
        # Q_i [u]_x = ([u]_x - 2 q_i (N_i x u)^T) / |N_i|^2 for u of each role's dN_i/dx:
        # face 0 = (e0, e1, o0), face 1 = (e1, e0, o1), dN/da = [c - b]_x cyclically.
        U = [[xo0 - xe1, xe0 - xo0, xe1 - xe0], [xe1 - xo1, xo1 - xe0, xe0 - xe1]]
        cd = c * dtheta
        QK = [[ti.Matrix.zero(float, 3, 3) for _ in ti.static(range(3))] for _ in ti.static(range(2))]
        EA = [ti.Matrix.zero(float, 3, 3) for _ in ti.static(range(2))]
        PB = [ti.Matrix.zero(float, 3, 3) for _ in ti.static(range(2))]
        if ti.static(full):
            p = [(d0 - s0 * eh) / el, (d1 - s1 * eh) / el]
            for i in ti.static(range(2)):
                EA[i] = cd * outer(q[i], eh)
                PB[i] = cd * outer(q[i], p[i])
                for r in ti.static(range(3)):
                    u = U[i][r]
                    QK[i][r] = (cd / nn[i]) * (skew(u) - 2.0 * outer(q[i], N[i].cross(u)))
        for v in ti.static(range(4)):
            for w in ti.static(range(v, 4)):
                blk = (
                    (alpha[v] * alpha[w]) * G00
                    + (alpha[v] * beta[w]) * G01
                    + (beta[v] * alpha[w]) * G01.transpose()
                    + (beta[v] * beta[w]) * G11
                )
                if ti.static(full):
                    for i in ti.static(range(2)):
                        if ti.static(v in _ROLE_VERTEX[i] and w in _ROLE_VERTEX[i]):
                            r = ti.static(_ROLE_VERTEX[i].index(v))
                            s = ti.static(_ROLE_VERTEX[i].index(w))
                            cv = alpha[v] if ti.static(i == 0) else beta[v]
                            blk += cv * QK[i][s]
                            if ti.static(_DC_E[r][s] != 0):
                                blk += ti.static(float(_DC_E[r][s])) * EA[i]
                            if ti.static(_DC_P[r][s] != 0):
                                blk += ti.static(float(_DC_P[r][s])) * PB[i]
                store_block(out, h, v, w, blk)
                if ti.static(w != v):
                    store_block(out, h, w, v, blk.transpose())


@ti.func
def gauss_newton_factors_pass(x: ti.template(), hinges: ti.template(), data: ti.template(), count, out: ti.template()):
    """out[h, 0:12] = grad theta of hinge h (e0, e1, o0, o1 blocks), out[h, 12] = c = 2 k w:
    the factors of its Gauss-Newton Hessian c g g^T, for ``gather_bending_gauss_newton``."""
    for h in range(count):
        xe0, xe1, xo0, xo1 = hinge_positions(x, hinges, h)
        g = dihedral_gradient(xe0, xe1, xo0, xo1)
        for v in ti.static(range(4)):
            for k in ti.static(range(3)):
                out[h, 3 * v + k] = g[v][k]
        out[h, 12] = 2.0 * data[h, B_K] * data[h, B_WEIGHT]


@ti.kernel
def bending_gauss_newton_factors(
    x: ti.types.ndarray(),
    hinges: ti.types.ndarray(),
    data: ti.types.ndarray(),
    count: ti.i32,
    out: ti.types.ndarray(),
):
    """``gauss_newton_factors_pass`` in a launch of its own."""
    gauss_newton_factors_pass(x, hinges, data, count, out)


@ti.func
def gather_bending_gauss_newton_pass(
    factors: ti.template(),
    ptr: ti.template(),
    inc: ti.template(),
    rows: ti.template(),
    csr: ti.template(),
    lumped,
    count,
):
    """csr[slot] += c g_i g_j for every hinge: the Gauss-Newton bending Hessian
    (``bending_hessian`` with full=False, c = 2 k w, g = grad theta) from the hinges'
    factors (``bending_gauss_newton_factors``), without storing its 12 x 12 blocks.
    Parallel over vertices as ``gather_face_hessians``: vertex v adds its rows of its
    hinges' c g g^T, listed by ptr / inc (hinge, local index) by increasing hinge, their
    rows' CSR slots in rows (K, 3, 12); each entry gets its terms in hinge order.

    lumped != 0: each hinge adds c (g g^T + u u^T) with u = ((g_o1 - g_o0) / 2,
    (g_o1 - g_o0) / 2, g_o0, -g_o1) over (e0, e1, o0, o1), whose block between the two
    opposite vertices (which share no face) is zero: the pattern needs only the
    membrane's blocks (``ShellTerm``; the slots of those blocks are -1)."""
    for v in range(count):
        for j in range(ptr[v], ptr[v + 1]):
            h = inc[j, 0]
            a = inc[j, 1]
            c = factors[h, 12]
            cg = ti.Vector([c * factors[h, 3 * a], c * factors[h, 3 * a + 1], c * factors[h, 3 * a + 2]])
            go0 = ti.Vector([factors[h, 6], factors[h, 7], factors[h, 8]])
            go1 = ti.Vector([factors[h, 9], factors[h, 10], factors[h, 11]])
            half = 0.5 * (go1 - go0)
            ua = half
            if a == 2:
                ua = go0
            elif a == 3:
                ua = -go1
            for w in ti.static(range(4)):
                uw = half
                if ti.static(w == 2):
                    uw = go0
                elif ti.static(w == 3):
                    uw = -go1
                for k, l in ti.ndrange(3, 3):
                    s = rows[j, k, 3 * w + l]
                    if s >= 0:
                        e = cg[k] * factors[h, 3 * w + l]
                        if lumped != 0:
                            e += c * ua[k] * uw[l]
                        csr[s] = csr[s] + e  # no atomic add (row v is v's)


@ti.kernel
def gather_bending_gauss_newton(
    factors: ti.types.ndarray(),
    ptr: ti.types.ndarray(),
    inc: ti.types.ndarray(),
    rows: ti.types.ndarray(),
    csr: ti.types.ndarray(),
    lumped: ti.i32,
):
    """``gather_bending_gauss_newton_pass`` in a launch of its own."""
    gather_bending_gauss_newton_pass(factors, ptr, inc, rows, csr, lumped, ptr.shape[0] - 1)
