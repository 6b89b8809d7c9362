"""Taichi kernels of the local-global solver: local step, residual assembly, updates.

Everything per element or per vertex lives in Taichi ndarrays allocated once by
:class:`PDKernels` (sized by the model); the kernels are module-level functions
of those arrays, so they are compiled once per process (and found in Taichi's
offline cache afterwards), whatever the number of solvers and models; matrices
that change with the time step, the stiffness or the held set are passed the
same way (see :mod:`tisim.linalg.spmv`).

Scaling (notes §2.2): A = M' + h^2 sum_i w_i G_i^T G_i with M' = (1 + c h) M (c
the mass damping), b = M' x_tilde + h^2 sum_i w_i G_i^T p_i. The element
"targets" are stored pre-multiplied by their weights as

    T_e = sum_terms w_term p_term   (3 x 3),

so b's elastic part at vertex a of element e is T_e grad_a (grad_a the gradient
of the linear shape function of a). The kernels store T_e grad_a in a slot of an
incidence list sorted by vertex and sum per vertex (a gather, no atomics: the
result does not depend on thread scheduling).

This module has no ``from __future__ import annotations``: Taichi reads the
kernels' type annotations when they are decorated.
"""

# ruff: noqa: SIM102  (nested ifs: the outer ``if ti.static(...)`` is resolved at compile time)

import numpy as np
import taichi as ti

from tisim.materials import ti_funcs as mf
from tisim.scene import MATERIALS

ARAP = MATERIALS.index("arap")
COROTATED = MATERIALS.index("corotated")
NEO_HOOKEAN = MATERIALS.index("neo-hookean")
SYMMETRIC_DIRICHLET = MATERIALS.index("symmetric-dirichlet")
SYMMETRIC_GRADIENT = MATERIALS.index("symmetric-gradient")


@ti.func
def project_unit_determinant(F, iterations):
    """Closest matrix to F (Frobenius) with det = +1, through the rotation-variant SVD:
    U diag(s) V^T with s the closest point to sigma on s0 s1 s2 = 1, found by
    linearised projections s = sigma + t grad C(s) (Gauss-Newton on the constraint).
    Falls back to the polar rotation (det 1) if the iteration does not settle.
    """
    U, sig, V = mf.svd_rotation_variant(F)
    s = sig
    for _ in range(iterations):
        C = s[0] * s[1] * s[2] - 1.0
        g = ti.Vector([s[1] * s[2], s[0] * s[2], s[0] * s[1]])
        gg = g.norm_sqr()
        if gg > 0.0:
            t = (g.dot(s - sig) - C) / gg
            s = sig + t * g
    ok = ti.abs(s[0] * s[1] * s[2] - 1.0) < 1e-6 and s[0] > 0.0 and s[1] > 0.0 and s[2] > 0.0
    if not ok:
        s = ti.Vector([1.0, 1.0, 1.0])
    D = ti.Matrix([[s[0], 0.0, 0.0], [0.0, s[1], 0.0], [0.0, 0.0, s[2]]])
    return U @ D @ V.transpose()


@ti.func
def fast_rotation(F, q, iterations):
    """Polar rotation of F as a unit quaternion (w, x, y, z), warm-started from q:
    Newton's method on f(R) = tr(R^T F) over SO(3), written for the local step.

    In R's body frame, f(R exp([d]x)) = f(R) + g.d - d^T M d / 2 + O(|d|^3) with
    S = R^T F, g = axial(S - S^T) and M = tr(S) I - sym(S), so the Newton turn is
    d = M^-1 g (M is positive definite near the maximiser, with eigenvalues
    sigma_j + sigma_k). The turn is applied as q <- q * (1, d/2) normalised (a
    rotation by 2 atan(|d|/2) = |d| + O(|d|^3): convergence stays quadratic) —
    no SVD and no trigonometric function, about 150 flops an iteration. Where M
    is not safely positive definite (far from the answer) it takes the damped
    gradient turn d = g / |tr S| of Müller et al. 2016 instead. A warm start
    from the previous iteration's rotation typically needs one iteration per
    local step (error ~ (change of R)^2). Stops early once g vanishes.
    """
    # a warm start a half-turn (or nearly) from the answer stalls the iteration: such a
    # start is replaced by the exact polar rotation (one 3x3 test otherwise)
    q = mf.polar_rotation_guard(F, q)
    fn2 = F.norm_sqr()
    for _ in range(iterations):
        R = mf.quat_to_matrix(q)
        S = R.transpose() @ F
        g = ti.Vector([S[2, 1] - S[1, 2], S[0, 2] - S[2, 0], S[1, 0] - S[0, 1]])
        if g.norm_sqr() <= 1e-30 * fn2:
            break
        tr = S[0, 0] + S[1, 1] + S[2, 2]
        M = tr * ti.Matrix.identity(float, 3) - 0.5 * (S + S.transpose())
        m2 = M[0, 0] * M[1, 1] - M[0, 1] * M[1, 0]
        det = M.determinant()
        floor = 1e-6 * ti.sqrt(fn2)
        d = g / (ti.abs(tr) + 1e-300)
        if M[0, 0] > floor and m2 > floor * floor and det > floor * floor * floor:
            d = M.inverse() @ g
        q = mf.quat_mul(q, ti.Vector([1.0, 0.5 * d[0], 0.5 * d[1], 0.5 * d[2]])).normalized()
    return q


# Every array is a plain (scalar) ndarray: Taichi's per-launch cost of a vector-typed
# ndarray argument is about twice that of a scalar one.
# Packed per-element data: EI (m, 9) int32 = tet vertices (4), incidence slots (4),
# material index; EF (m, 6) float = volume, mu, lam, w_rot, w_qn, w_vol.
# Per vertex: VF (n, 3) float = mass_c ((1 + c h) m), mass, free (1.0 unless held).
# Points, residuals: (n, 3); Dm_inv (m, 3, 3); quat (m, 4); contrib (4 m, 3).
_T0, _S0, _MAT = 0, 4, 8
_VOL, _MU, _LAM, _WROT, _WQN, _WVOL = 0, 1, 2, 3, 4, 5
_MASSC, _MASS, _FREE = 0, 1, 2
nd = ti.types.ndarray()

# Streaming loops over vertices with a few flops a row (copies, gathers, scatters, norms)
# run on one thread on the CPU backend: each parallel loop there is a hand-over to
# Taichi's thread pool and a join, about 90 us on the 2-core machine, against 40 us for
# the whole serial pass over 7k rows (measured: an n x 3 add, 126 against 40 us). Set
# when the first PDKernels is made (before any of these kernels compiles); parallel on
# GPU backends.
_SERIAL = False


def material_flags(materials, volume_constraint: bool) -> int:
    """Bit mask of the materials present (bit = index in MATERIALS) plus bit 16 for the
    volume constraint: kernels compile only the branches they need."""
    flags = 0
    for k in materials:
        flags |= 1 << int(k)
    return flags | ((1 << 16) if volume_constraint else 0)


@ti.func
def row3(a: ti.template(), i):
    return ti.Vector([a[i, 0], a[i, 1], a[i, 2]])


@ti.func
def set_row3(a: ti.template(), i, v):
    a[i, 0] = v[0]
    a[i, 1] = v[1]
    a[i, 2] = v[2]


@ti.func
def mat3(a: ti.template(), e):
    return ti.Matrix(
        [
            [a[e, 0, 0], a[e, 0, 1], a[e, 0, 2]],
            [a[e, 1, 0], a[e, 1, 1], a[e, 1, 2]],
            [a[e, 2, 0], a[e, 2, 1], a[e, 2, 2]],
        ]
    )


@ti.func
def deformation_gradient(EI: ti.template(), Dm_inv: ti.template(), x: ti.template(), e):
    x0 = row3(x, EI[e, _T0])
    Ds = ti.Matrix.cols(
        [row3(x, EI[e, _T0 + 1]) - x0, row3(x, EI[e, _T0 + 2]) - x0, row3(x, EI[e, _T0 + 3]) - x0]
    )
    return Ds @ mat3(Dm_inv, e)


@ti.func
def element_target(
    EF: ti.template(), quat: ti.template(), e, mat, F, rot_iters, flags: ti.template()
):
    """T_e = sum w p (3x3) of element e at deformation gradient F (quat updated)."""
    T = ti.Matrix.zero(float, 3, 3)
    if ti.static(flags & ((1 << ARAP) | (1 << COROTATED))):
        if mat == ARAP or mat == COROTATED:
            # projective rotation term: p = R(F), the minimiser of ||F - R||^2 over SO(3),
            # warm-started from the previous iteration / frame
            q = fast_rotation(
                F, ti.Vector([quat[e, 0], quat[e, 1], quat[e, 2], quat[e, 3]]), rot_iters
            )
            for c in ti.static(range(4)):
                quat[e, c] = q[c]
            T = EF[e, _WROT] * mf.quat_to_matrix(q)
    if ti.static(flags & (1 << COROTATED)):
        if mat == COROTATED:
            # volume term lam/2 (J-1)^2 as a quasi-Newton target p = F - (V/w) dpsi/dF
            J = F.determinant()
            T += EF[e, _WQN] * F - (EF[e, _VOL] * EF[e, _LAM] * (J - 1.0)) * mf.cofactor(F)
    if ti.static(flags & (1 << NEO_HOOKEAN)):
        if mat == NEO_HOOKEAN:
            T = EF[e, _WQN] * F - EF[e, _VOL] * mf.first_piola_nh(F, EF[e, _MU], EF[e, _LAM])
    if ti.static(flags & (1 << SYMMETRIC_DIRICHLET)):
        if mat == SYMMETRIC_DIRICHLET:
            T = EF[e, _WQN] * F - EF[e, _VOL] * mf.first_piola_symmetric_dirichlet(F, EF[e, _MU])
    if ti.static(flags & (1 << SYMMETRIC_GRADIENT)):
        if mat == SYMMETRIC_GRADIENT:
            T = EF[e, _WQN] * F - EF[e, _VOL] * mf.first_piola_symmetric_gradient(F, EF[e, _MU])
    if ti.static(flags & (1 << 16)):
        T += EF[e, _WVOL] * project_unit_determinant(F, 10)
    return T


@ti.kernel
def local_step(
    EI: nd,
    EF: nd,
    Dm_inv: nd,
    quat: nd,
    x: nd,
    contrib: nd,
    rot_iters: ti.i32,
    flags: ti.template(),
):
    """Project every element (parallel over elements); store T_e grad_a per incidence slot."""
    for e in range(EI.shape[0]):
        F = deformation_gradient(EI, Dm_inv, x, e)
        T = element_target(EF, quat, e, EI[e, _MAT], F, rot_iters, flags)
        H = T @ mat3(Dm_inv, e).transpose()  # column k: T grad_{k+1}
        c1 = ti.Vector([H[0, 0], H[1, 0], H[2, 0]])
        c2 = ti.Vector([H[0, 1], H[1, 1], H[2, 1]])
        c3 = ti.Vector([H[0, 2], H[1, 2], H[2, 2]])
        set_row3(contrib, EI[e, _S0], -(c1 + c2 + c3))
        set_row3(contrib, EI[e, _S0 + 1], c1)
        set_row3(contrib, EI[e, _S0 + 2], c2)
        set_row3(contrib, EI[e, _S0 + 3], c3)


@ti.func
def element_energy(
    EF: ti.template(), quat: ti.template(), e, mat, F, rot_iters, flags: ti.template()
):
    """V_e psi(F) in J (+ the volume constraint's w/2 ||F - proj(F)||^2)."""
    psi = 0.0
    if ti.static(flags & ((1 << ARAP) | (1 << COROTATED))):
        if mat == ARAP or mat == COROTATED:
            q = fast_rotation(
                F, ti.Vector([quat[e, 0], quat[e, 1], quat[e, 2], quat[e, 3]]), rot_iters
            )
            R = mf.quat_to_matrix(q)
            psi = mf.energy_density_arap(F, R, EF[e, _MU])
            if mat == COROTATED:
                psi = mf.energy_density_corotated(F, R, EF[e, _MU], EF[e, _LAM])
    if ti.static(flags & (1 << NEO_HOOKEAN)):
        if mat == NEO_HOOKEAN:
            psi = mf.energy_density_nh(F, EF[e, _MU], EF[e, _LAM])
    if ti.static(flags & (1 << SYMMETRIC_DIRICHLET)):
        if mat == SYMMETRIC_DIRICHLET:
            psi = mf.energy_density_symmetric_dirichlet(F, EF[e, _MU])
    if ti.static(flags & (1 << SYMMETRIC_GRADIENT)):
        if mat == SYMMETRIC_GRADIENT:
            psi = mf.energy_density_symmetric_gradient(F, EF[e, _MU])
    E = EF[e, _VOL] * psi
    if ti.static(flags & (1 << 16)):
        E += 0.5 * EF[e, _WVOL] * (F - project_unit_determinant(F, 10)).norm_sqr()
    return E


@ti.kernel
def potential_energy(
    EI: nd,
    EF: nd,
    Dm_inv: nd,
    quat: nd,
    x: nd,
    VF: nd,
    rot_iters: ti.i32,
    gravity: ti.types.vector(3, float),
    flags: ti.template(),
) -> float:
    """Elastic + gravitational potential energy (J) at x; rotations warm-started from
    quat (not stored back)."""
    total = 0.0
    for e in range(EI.shape[0]):
        F = deformation_gradient(EI, Dm_inv, x, e)
        total += element_energy(EF, quat, e, EI[e, _MAT], F, rot_iters, flags)
    ti.loop_config(serialize=_SERIAL)
    for v in range(x.shape[0]):
        total -= VF[v, _MASS] * gravity.dot(row3(x, v))
    return total


@ti.func
def assemble_residual(
    inc_ptr: ti.template(),
    contrib: ti.template(),
    VF: ti.template(),
    x_tilde: ti.template(),
    x: ti.template(),
    r: ti.template(),
    Ap: ti.template(),
    Aj: ti.template(),
    Ax: ti.template(),
    h2,
    drag_vertex,
    drag_k,
    drag_target,
    with_energy: ti.template(),
    force: ti.template(),
    kept: ti.template(),
    fscale,
    with_force: ti.template(),
):
    """r = b - A x (see :func:`residual`), + fscale * force on free vertices and
    kept = force when ``with_force`` (the contact forces, notes §2.4: A q = b + h^2
    H^T lambda); returns (||r||^2, inertia energy sum_free mass_c / (2 h^2)
    |x - x_tilde|^2 when ``with_energy``, else 0)."""
    rsq = 0.0
    inertia = 0.0
    for v in range(x.shape[0]):
        res = ti.Vector([0.0, 0.0, 0.0])
        if ti.static(with_force):
            set_row3(kept, v, row3(force, v))
        if VF[v, _FREE] != 0.0:
            el = ti.Vector([0.0, 0.0, 0.0])
            for p in range(inc_ptr[v], inc_ptr[v + 1]):
                el += row3(contrib, p)
            xt = row3(x_tilde, v)
            xv = row3(x, v)
            # b - A x in difference form: A = M + h^2 L with L's rows summing to zero
            # (L = G^T W G, G translation-invariant), so (A x)_v = m_v x_v +
            # sum_{j != v} A_vj (x_j - x_v). The plain sum cancels terms of size
            # h^2 |L_vv| |x| down to m_v |x|, and in f32 the stored entries' row sums are
            # off by their rounding: that gave a free-falling ball 1.5-2% too much
            # gravity. Differences of nearby positions are exact in any precision.
            acc = VF[v, _MASSC] * (xt - xv) + h2 * el
            for p in range(Ap[v], Ap[v + 1]):
                j = Aj[p]
                if j != v:
                    acc -= Ax[p] * (row3(x, j) - xv)
            if v == drag_vertex:
                acc += (h2 * drag_k) * (drag_target - row3(x, v))
            res = acc
            if ti.static(with_force):
                res += fscale * row3(force, v)
            rsq += res.norm_sqr()
            if ti.static(with_energy):  # in this loop: one parallel pass fewer
                inertia += (0.5 / h2) * VF[v, _MASSC] * (row3(x, v) - xt).norm_sqr()
        set_row3(r, v, res)
    return ti.Vector([rsq, inertia])


@ti.kernel
def residual(
    inc_ptr: nd,
    contrib: nd,
    VF: nd,
    x_tilde: nd,
    x: nd,
    r: nd,
    Ap: nd,
    Aj: nd,
    Ax: nd,
    h2: float,
    drag_vertex: ti.i32,
    drag_k: float,
    drag_target: ti.types.vector(3, float),
) -> float:
    """r = b - A x on free vertices (0 on held ones), notes' scaling (kg m), with
    b = M' x_tilde + h^2 sum T_e grad_a (+ h^2 k (target - x) at the dragged vertex).
    Returns ||r||^2."""
    return assemble_residual(
        inc_ptr, contrib, VF, x_tilde, x, r, Ap, Aj, Ax, h2, drag_vertex, drag_k, drag_target,
        False, r, r, 0.0, False,
    )[0]  # fmt: skip


@ti.func
def local_half(
    EI: ti.template(),
    EF: ti.template(),
    Dm_inv: ti.template(),
    quat: ti.template(),
    x: ti.template(),
    contrib: ti.template(),
    rot_iters,
    inc_ptr: ti.template(),
    VF: ti.template(),
    x_tilde: ti.template(),
    r: ti.template(),
    Ap: ti.template(),
    Aj: ti.template(),
    Ax: ti.template(),
    h2,
    drag_vertex,
    drag_k,
    drag_target,
    gidx: ti.template(),
    gout: ti.template(),
    flags: ti.template(),
    with_energy: ti.template(),
    force: ti.template(),
    kept: ti.template(),
    fscale,
    with_force: ti.template(),
):
    energy = 0.0
    for e in range(EI.shape[0]):
        F = deformation_gradient(EI, Dm_inv, x, e)
        T = element_target(EF, quat, e, EI[e, _MAT], F, rot_iters, flags)
        if ti.static(with_energy):
            # rotations were just updated by element_target: one warm-started turn suffices
            energy += element_energy(EF, quat, e, EI[e, _MAT], F, 1, flags)
        H = T @ mat3(Dm_inv, e).transpose()
        c1 = ti.Vector([H[0, 0], H[1, 0], H[2, 0]])
        c2 = ti.Vector([H[0, 1], H[1, 1], H[2, 1]])
        c3 = ti.Vector([H[0, 2], H[1, 2], H[2, 2]])
        set_row3(contrib, EI[e, _S0], -(c1 + c2 + c3))
        set_row3(contrib, EI[e, _S0 + 1], c1)
        set_row3(contrib, EI[e, _S0 + 2], c2)
        set_row3(contrib, EI[e, _S0 + 3], c3)
    res = assemble_residual(
        inc_ptr, contrib, VF, x_tilde, x, r, Ap, Aj, Ax, h2, drag_vertex, drag_k, drag_target,
        with_energy, force, kept, fscale, with_force,
    )  # fmt: skip
    ti.loop_config(serialize=_SERIAL)
    for i in range(gidx.shape[0]):
        set_row3(gout, i, row3(r, gidx[i]))
    if ti.static(with_energy):
        energy += res[1]
        if drag_vertex >= 0:
            energy += 0.5 * drag_k * (row3(x, drag_vertex) - drag_target).norm_sqr()
    return ti.Vector([res[0], energy])


@ti.kernel
def iterate(
    EI: nd,
    EF: nd,
    Dm_inv: nd,
    quat: nd,
    x: nd,
    contrib: nd,
    rot_iters: ti.i32,
    inc_ptr: nd,
    VF: nd,
    x_tilde: nd,
    r: nd,
    Ap: nd,
    Aj: nd,
    Ax: nd,
    h2: float,
    drag_vertex: ti.i32,
    drag_k: float,
    drag_target: ti.types.vector(3, float),
    gidx: nd,
    gout: nd,
    force: nd,
    kept: nd,
    fscale: float,
    flags: ti.template(),
    with_force: ti.template(),
) -> float:
    """One launch for the local half of an iteration: the local step (parallel over
    elements), the residual r = b - A x (parallel over vertices; returns ||r||^2) and
    the gather gout[i] = r[gidx[i]] feeding the global step (permuted or compacted
    free rows; gidx may be empty). with_force: the contact forces force (n, 3) enter the
    residual as r += fscale force (the momentum residual) and are copied into kept."""
    return local_half(
        EI, EF, Dm_inv, quat, x, contrib, rot_iters, inc_ptr, VF, x_tilde, r, Ap, Aj, Ax, h2,
        drag_vertex, drag_k, drag_target, gidx, gout, flags, False, force, kept, fscale,
        with_force,
    )[0]  # fmt: skip


@ti.kernel
def iterate_stored(
    EI: nd,
    EF: nd,
    Dm_inv: nd,
    quat: nd,
    x: nd,
    contrib: nd,
    rot_iters: ti.i32,
    inc_ptr: nd,
    VF: nd,
    x_tilde: nd,
    r: nd,
    Ap: nd,
    Aj: nd,
    Ax: nd,
    h2: float,
    drag_vertex: ti.i32,
    drag_k: float,
    drag_target: ti.types.vector(3, float),
    gidx: nd,
    gout: nd,
    force: nd,
    kept: nd,
    fscale: float,
    flags: ti.template(),
    with_force: ti.template(),
    rsq: nd,
    slot: ti.i32,
):
    """:func:`iterate` with ||r||^2 left on the device in rsq[slot] instead of returned:
    a return value is a host synchronisation (the host waits for the launch), so GPU
    backends read the residuals of several iterations at once."""
    rsq[slot] = local_half(
        EI, EF, Dm_inv, quat, x, contrib, rot_iters, inc_ptr, VF, x_tilde, r, Ap, Aj, Ax, h2,
        drag_vertex, drag_k, drag_target, gidx, gout, flags, False, force, kept, fscale,
        with_force,
    )[0]  # fmt: skip


@ti.kernel
def iterate_with_energy(
    EI: nd,
    EF: nd,
    Dm_inv: nd,
    quat: nd,
    x: nd,
    contrib: nd,
    rot_iters: ti.i32,
    inc_ptr: nd,
    VF: nd,
    x_tilde: nd,
    r: nd,
    Ap: nd,
    Aj: nd,
    Ax: nd,
    h2: float,
    drag_vertex: ti.i32,
    drag_k: float,
    drag_target: ti.types.vector(3, float),
    gidx: nd,
    gout: nd,
    out: nd,
    flags: ti.template(),
) -> float:
    """:func:`iterate` and the incremental potential at x in the same launch: returns
    ||r||^2 and stores E in out[0], E in J up to a constant (held vertices omitted):
    E = sum_e V_e psi_e(F_e) + sum_free mass_c / (2 h^2) |x - x_tilde|^2
    (+ k/2 |x_v - target|^2 for the drag spring). (Results go through ``out``, not a
    vector return type: that would be typed when this module is imported, possibly
    before Taichi is initialised in f64.)"""
    v = local_half(
        EI, EF, Dm_inv, quat, x, contrib, rot_iters, inc_ptr, VF, x_tilde, r, Ap, Aj, Ax, h2,
        drag_vertex, drag_k, drag_target, gidx, gout, flags, True, r, r, 0.0, False,
    )  # fmt: skip
    out[0] = v[1]
    return v[0]


# Anderson acceleration (solver.acceleration = "anderson"), arrays of AndersonArrays:
# AV (5, n, 3): x_iter (the iterate the local step saw last), x_acc and f_acc (the last
# accepted iterate and its plain step G(x_acc) - x_acc), f_last and g_last (f and G of
# the previous iterate); H (2, m, n, 3): the history dF (H[0]) and dG (H[1]) of at most
# ANDERSON_MAX columns; AS (small, see below): per-chunk partial dot products, the Gram
# matrix dF dF^T, its Cholesky factor and theta. Dot products are summed per chunk of
# vertices then over the chunks, in a fixed order (deterministic, no atomics).
ANDERSON_MAX = 16
ANDERSON_CHUNKS = 64
_AX_ITER, _AX_ACC, _AF_ACC, _AF_LAST, _AG_LAST = 0, 1, 2, 3, 4
_AS_GRAM = ANDERSON_CHUNKS  # rows: the Gram matrix (ANDERSON_MAX, ANDERSON_MAX)
_AS_CHOL = ANDERSON_CHUNKS + ANDERSON_MAX  # rows: its regularised Cholesky factor
_AS_THETA = ANDERSON_CHUNKS + 2 * ANDERSON_MAX  # row: theta, then the right-hand side
_AS_APPLIED = ANDERSON_CHUNKS + 2 * ANDERSON_MAX + 1  # [.., 0]: 1.0 if extrapolated
ANDERSON_SMALL_ROWS = ANDERSON_CHUNKS + 2 * ANDERSON_MAX + 2


@ti.func
def row3_of(a: ti.template(), j, v):
    return ti.Vector([a[j, v, 0], a[j, v, 1], a[j, v, 2]])


@ti.func
def set_row3_of(a: ti.template(), j, v, value):
    a[j, v, 0] = value[0]
    a[j, v, 1] = value[1]
    a[j, v, 2] = value[2]


@ti.func
def history(H: ti.template(), k, j, v):
    return ti.Vector([H[k, j, v, 0], H[k, j, v, 1], H[k, j, v, 2]])


@ti.func
def anderson_update(
    x: ti.template(),
    AV: ti.template(),
    H: ti.template(),
    AS: ti.template(),
    slot,
    count,
    record,
    tikhonov,
):
    """Record the global step's result and extrapolate (type-II Anderson, Walker & Ni 2011).

    record 0: nothing to record (a step's first iterate, or a fallback point: x is then
    left as it is); 1: x = G(x_iter): x_acc = x_iter, f_acc = f = x - x_iter, f_last = f,
    g_last = x; 2: the same and the new column dF[slot] = f - f_last, dG[slot] = x - g_last
    with its Gram row dF_j . dF_slot (j < count, count including the new column).
    With record > 0 and count > 0 columns: theta = argmin ||f - dF theta|| by the normal
    equations (dF_j . f on the right; Tikhonov ``tikhonov`` times their mean diagonal;
    Cholesky) and x <- x - dG theta, unless they are not positive definite or theta is not
    finite (then x = G(x_iter), the plain step). Always x_iter = x."""
    n = x.shape[0]
    C = ANDERSON_CHUNKS
    M = ANDERSON_MAX
    for c in range(C * ti.min(record, 1)):  # parallel over chunks, serial within one
        v0 = c * n // C
        v1 = (c + 1) * n // C
        for v in range(v0, v1):
            g = row3(x, v)
            xi = row3_of(AV, _AX_ITER, v)
            f = g - xi
            set_row3_of(AV, _AX_ACC, v, xi)
            set_row3_of(AV, _AF_ACC, v, f)
            if record == 2:
                df = f - row3_of(AV, _AF_LAST, v)
                dg = g - row3_of(AV, _AG_LAST, v)
                for k in ti.static(range(3)):
                    H[0, slot, v, k] = df[k]
                    H[1, slot, v, k] = dg[k]
            set_row3_of(AV, _AF_LAST, v, f)
            set_row3_of(AV, _AG_LAST, v, g)
        # the chunk's dot products, column by column (two accumulators, the chunk in cache)
        for j in range(count):
            gram = 0.0
            rhs = 0.0
            for v in range(v0, v1):
                a = history(H, 0, j, v)
                if record == 2:
                    gram += a.dot(history(H, 0, slot, v))
                rhs += a.dot(row3_of(AV, _AF_LAST, v))
            AS[c, j] = gram
            AS[c, M + j] = rhs
    # the small problem: serial (top-level statements outside the parallel loops)
    AS[_AS_APPLIED, 0] = 0.0
    if record != 0 and count > 0:
        for j in range(count):
            d = 0.0
            rhs = 0.0
            for c in range(C):
                d += AS[c, j]
                rhs += AS[c, M + j]
            if record == 2:
                AS[_AS_GRAM + slot, j] = d
                AS[_AS_GRAM + j, slot] = d
            AS[_AS_THETA, M + j] = rhs
        trace = 0.0
        for j in range(count):
            trace += AS[_AS_GRAM + j, j]
        scale = trace / count
        ok = scale > 0.0 and scale < ti.math.inf  # false for NaN too
        if ok:
            for i in range(count):  # Cholesky of Gram + tikhonov scale I
                for j in range(i + 1):
                    s = AS[_AS_GRAM + i, j]
                    if i == j:
                        s += tikhonov * scale
                    for k in range(j):
                        s -= AS[_AS_CHOL + i, k] * AS[_AS_CHOL + j, k]
                    if i == j:
                        if s > 0.0:
                            AS[_AS_CHOL + i, i] = ti.sqrt(s)
                        else:
                            ok = False
                            AS[_AS_CHOL + i, i] = 1.0
                    else:
                        AS[_AS_CHOL + i, j] = s / AS[_AS_CHOL + j, j]
        if ok:
            for i in range(count):  # L y = rhs
                s = AS[_AS_THETA, M + i]
                for k in range(i):
                    s -= AS[_AS_CHOL + i, k] * AS[_AS_THETA, k]
                AS[_AS_THETA, i] = s / AS[_AS_CHOL + i, i]
            for ii in range(count):  # L^T theta = y
                i = count - 1 - ii
                s = AS[_AS_THETA, i]
                for k in range(i + 1, count):
                    s -= AS[_AS_CHOL + k, i] * AS[_AS_THETA, k]
                t = s / AS[_AS_CHOL + i, i]
                AS[_AS_THETA, i] = t
                if not ti.abs(t) < ti.math.inf:
                    ok = False
        if ok:
            AS[_AS_APPLIED, 0] = 1.0
    for v in range(n):  # x <- x - dG theta; x_iter = x
        xv = row3(x, v)
        if AS[_AS_APPLIED, 0] != 0.0:
            for j in range(count):
                xv -= AS[_AS_THETA, j] * history(H, 1, j, v)
            set_row3(x, v, xv)
        set_row3_of(AV, _AX_ITER, v, xv)


@ti.kernel
def iterate_anderson(
    EI: nd,
    EF: nd,
    Dm_inv: nd,
    quat: nd,
    x: nd,
    contrib: nd,
    rot_iters: ti.i32,
    inc_ptr: nd,
    VF: nd,
    x_tilde: nd,
    r: nd,
    Ap: nd,
    Aj: nd,
    Ax: nd,
    h2: float,
    drag_vertex: ti.i32,
    drag_k: float,
    drag_target: ti.types.vector(3, float),
    gidx: nd,
    gout: nd,
    AV: nd,
    H: nd,
    AS: nd,
    slot: ti.i32,
    count: ti.i32,
    record: ti.i32,
    tikhonov: float,
    out: nd,
    flags: ti.template(),
) -> float:
    """One launch for an accelerated iteration: :func:`anderson_update` (record the last
    global step's result, solve the small least-squares problem, extrapolate), then
    :func:`iterate_with_energy`. Returns ||r||^2; out[0] = E (J), out[1] = 1.0 if the
    iterate was extrapolated."""
    anderson_update(x, AV, H, AS, slot, count, record, tikhonov)
    res = local_half(
        EI, EF, Dm_inv, quat, x, contrib, rot_iters, inc_ptr, VF, x_tilde, r, Ap, Aj, Ax, h2,
        drag_vertex, drag_k, drag_target, gidx, gout, flags, True, r, r, 0.0, False,
    )  # fmt: skip
    out[0] = res[1]
    out[1] = AS[_AS_APPLIED, 0]
    return res[0]


@ti.kernel
def anderson_fallback(x: nd, AV: nd, alpha: float):
    """x = x_acc + alpha f_acc: the (damped) plain step from the last accepted iterate."""
    ti.loop_config(serialize=_SERIAL)
    for v in range(x.shape[0]):
        set_row3(x, v, row3_of(AV, _AX_ACC, v) + alpha * row3_of(AV, _AF_ACC, v))


@ti.kernel
def norm_sq(r: nd) -> float:
    total = 0.0
    ti.loop_config(serialize=_SERIAL)
    for v in range(r.shape[0]):
        total += row3(r, v).norm_sqr()
    return total


@ti.kernel
def add_scaled_rows(r: nd, VF: nd, f: nd, scale: float):
    """r += scale * f on free vertices (f: (n, 3), e.g. contact forces)."""
    ti.loop_config(serialize=_SERIAL)
    for v in range(r.shape[0]):
        if VF[v, _FREE] != 0.0:
            set_row3(r, v, row3(r, v) + scale * row3(f, v))


@ti.kernel
def set_scaled_rows(r: nd, VF: nd, f: nd, scale: float):
    """r = scale * f on free vertices, 0 on held ones."""
    ti.loop_config(serialize=_SERIAL)
    for v in range(r.shape[0]):
        res = ti.Vector([0.0, 0.0, 0.0])
        if VF[v, _FREE] != 0.0:
            res = scale * row3(f, v)
        set_row3(r, v, res)


@ti.kernel
def set_scaled_difference(r: nd, VF: nd, fa: nd, fb: nd, scale: float, gidx: nd, gout: nd):
    """r = scale * (fa - fb) on free vertices, 0 on held ones; then gout[i] = r[gidx[i]]
    (the global step's gather, gidx may be empty)."""
    ti.loop_config(serialize=_SERIAL)
    for v in range(r.shape[0]):
        res = ti.Vector([0.0, 0.0, 0.0])
        if VF[v, _FREE] != 0.0:
            res = scale * (row3(fa, v) - row3(fb, v))
        set_row3(r, v, res)
    ti.loop_config(serialize=_SERIAL)
    for i in range(gidx.shape[0]):
        set_row3(gout, i, row3(r, gidx[i]))


@ti.kernel
def gather_rows(src: nd, index: nd, out: nd):
    """out[i] = src[index[i]]."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(index.shape[0]):
        set_row3(out, i, row3(src, index[i]))


@ti.kernel
def scatter_add_rows(dst: nd, index: nd, delta: nd):
    """dst[index[i]] += delta[i] (index injective)."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(index.shape[0]):
        v = index[i]
        set_row3(dst, v, row3(dst, v) + row3(delta, i))


@ti.kernel
def copy_rows(dst: nd, src: nd):
    ti.loop_config(serialize=_SERIAL)
    for v in range(dst.shape[0]):
        set_row3(dst, v, row3(src, v))


@ti.kernel
def save_row(x: nd, v: ti.i32, saved: nd):
    set_row3(saved, 0, row3(x, v))


@ti.kernel
def rank_one_correction(x: nd, column: nd, v: ti.i32, saved: nd, coef: float):
    """Sherman-Morrison for the drag spring: with y = x[v] - saved (the plain solve's
    displacement of v), x -= column * coef * y."""
    s = coef * (row3(x, v) - row3(saved, 0))
    ti.loop_config(serialize=_SERIAL)
    for i in range(x.shape[0]):
        set_row3(x, i, row3(x, i) - column[i] * s)


@ti.kernel
def jacobi_chebyshev(
    x: nd,
    x_prev: nd,
    r: nd,
    VF: nd,
    diag: nd,
    gamma: float,
    omega: float,
    drag_vertex: ti.i32,
    drag_add: float,
):
    """One Jacobi sweep with relaxation gamma and Chebyshev weight omega (Wang 2015):
    x_new = omega (gamma D^-1 r + x - x_prev) + x_prev on free vertices."""
    for v in range(x.shape[0]):
        if VF[v, _FREE] != 0.0:
            d = diag[v]
            if v == drag_vertex:
                d += drag_add
            xv = row3(x, v)
            xp = row3(x_prev, v)
            set_row3(x_prev, v, xv)
            set_row3(x, v, omega * (gamma * row3(r, v) / d + xv - xp) + xp)


class PDKernels:
    """The arrays of :class:`~tisim.solvers.pd.solver.SolverPD` for one model, and the
    kernel calls on them.

    n vertices, m tets. Per element (EI, EF, Dm_inv, quat): tet vertices,
    incidence slots, material, volume, Lamé parameters, the three weights
    (w_rot: projective rotation term, w_qn: quasi-Newton term, w_vol: projective
    volume constraint) and the rotation warm start (unit quaternion). Per vertex:
    x (the iterate, m), x_tilde (inertial prediction, m), VF (mass_c = (1 + c h) m,
    mass in kg; free: 1.0 unless held), r (residual of the global system, notes'
    scaling: kg m), x_prev (Jacobi-Chebyshev history), work/work2 (permuted
    vectors of the global step); all (n, 3) unless stated.
    """

    def __init__(
        self,
        tets: np.ndarray,
        Dm_inv: np.ndarray,
        volume: np.ndarray,
        material: np.ndarray,
        vertex_count: int,
        volume_constraint: bool,
    ):
        global _SERIAL
        from tisim import backend

        _SERIAL = backend.current().arch == "cpu"
        real = ti.f64 if _is_f64() else ti.f32
        self.np_real = _np_real()
        self.rsq = None  # residuals left on the device (iterate_stored), grown on demand
        self._real = real
        n, m = int(vertex_count), len(tets)
        self.n, self.m = n, m
        present = {int(k) for k in np.unique(material)}
        unknown = present - {ARAP, COROTATED, NEO_HOOKEAN, SYMMETRIC_DIRICHLET, SYMMETRIC_GRADIENT}
        if unknown:
            raise ValueError(f"unsupported material index {sorted(unknown)}")
        self.flags = material_flags(present, volume_constraint)
        self.EI = ti.ndarray(ti.i32, shape=(m, 9))
        self.EF = ti.ndarray(real, shape=(m, 6))
        self.Dm_inv = ti.ndarray(real, shape=(m, 3, 3))
        self.quat = ti.ndarray(real, shape=(m, 4))
        self.contrib = ti.ndarray(real, shape=(4 * m, 3))
        self.inc_ptr = ti.ndarray(ti.i32, shape=n + 1)
        self.VF = ti.ndarray(real, shape=(n, 3))
        self.x = ti.ndarray(real, shape=(n, 3))
        self.x_tilde = ti.ndarray(real, shape=(n, 3))
        self.x_prev = ti.ndarray(real, shape=(n, 3))
        self.r = ti.ndarray(real, shape=(n, 3))
        self.work = ti.ndarray(real, shape=(n, 3))
        self.work2 = ti.ndarray(real, shape=(n, 3))
        self.saved = ti.ndarray(real, shape=(1, 3))
        self.kept = ti.ndarray(real, shape=(n, 3))  # the contact forces iterate() last added
        self._out = np.zeros(1, dtype=self.np_real)  # scalar results besides the return value

        tets = np.asarray(tets, dtype=np.int64)
        # incidence lists: slot of (e, a) in the vertex-sorted order of tets.ravel()
        flat = tets.ravel()
        order = np.argsort(flat, kind="stable")
        slot = np.empty(4 * m, dtype=np.int64)
        slot[order] = np.arange(4 * m)
        ei = np.concatenate([tets, slot.reshape(m, 4), np.asarray(material).reshape(m, 1)], axis=1)
        self.EI.from_numpy(np.ascontiguousarray(ei, dtype=np.int32))
        self._EF = np.zeros((m, 6), dtype=self.np_real)
        self._EF[:, _VOL] = volume
        self.EF.from_numpy(self._EF)
        self.Dm_inv.from_numpy(np.ascontiguousarray(Dm_inv, dtype=self.np_real))
        ptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.bincount(flat, minlength=n), out=ptr[1:])
        self.inc_ptr.from_numpy(ptr)
        self._VF = np.zeros((n, 3), dtype=self.np_real)
        self._VF[:, _FREE] = 1.0
        self.VF.from_numpy(self._VF)
        self.reset_rotations()

    # ------------------------------------------------------------------ set-up
    def reset_rotations(self) -> None:
        q = np.zeros((self.m, 4), dtype=self.np_real)
        q[:, 0] = 1.0
        self.quat.from_numpy(q)

    def set_element_parameters(self, mu, lam, w_rot, w_qn, w_vol) -> None:
        for col, a in ((_MU, mu), (_LAM, lam), (_WROT, w_rot), (_WQN, w_qn), (_WVOL, w_vol)):
            self._EF[:, col] = a
        self.EF.from_numpy(self._EF)

    def set_masses(self, mass_c, mass) -> None:
        self._VF[:, _MASSC] = mass_c
        self._VF[:, _MASS] = mass
        self.VF.from_numpy(self._VF)

    def set_free(self, free_mask: np.ndarray) -> None:
        self._VF[:, _FREE] = np.asarray(free_mask, dtype=bool)
        self.VF.from_numpy(self._VF)

    # ------------------------------------------------------------------ kernels
    def local_step(self, rot_iters: int) -> None:
        local_step(
            self.EI, self.EF, self.Dm_inv, self.quat, self.x, self.contrib, rot_iters, self.flags
        )

    def residual(self, A, h2: float, drag_vertex: int, drag_k: float, drag_target) -> float:
        """r = b - A x (A: DeviceCSR); returns ||r||^2."""
        return residual(
            self.inc_ptr,
            self.contrib,
            self.VF,
            self.x_tilde,
            self.x,
            self.r,
            A.indptr,
            A.indices,
            A.data,
            h2,
            drag_vertex,
            drag_k,
            drag_target,
        )

    def iterate(
        self, rot_iters: int, A, h2: float, drag_vertex: int, drag_k: float, drag_target, gidx,
        gout, force=None, force_scale: float = 0.0,
    ) -> float:
        """local_step + residual + gather r[gidx] into gout, in one launch; returns ||r||^2.
        force: contact forces as a (n, 3) Taichi array, added to the residual as
        r += force_scale force and copied into :attr:`kept` (for
        :meth:`set_residual_difference` after the contact update), in the same launch."""
        with_force = force is not None
        return iterate(
            self.EI, self.EF, self.Dm_inv, self.quat, self.x, self.contrib, rot_iters,
            self.inc_ptr, self.VF, self.x_tilde, self.r, A.indptr, A.indices, A.data, h2,
            drag_vertex, drag_k, drag_target, gidx, gout,
            force if with_force else self.r, self.kept if with_force else self.r,
            force_scale, self.flags, with_force,
        )  # fmt: skip

    def iterate_stored(
        self, slot: int, rot_iters: int, A, h2: float, drag_vertex: int, drag_k: float,
        drag_target, gidx, gout, force=None, force_scale: float = 0.0,
    ) -> None:
        """:meth:`iterate` with ||r||^2 kept on the device in :attr:`rsq` [slot] (grown to
        hold ``slot``); read them with :meth:`read_rsq`."""
        from tisim import backend

        if self.rsq is None or self.rsq.shape[0] <= slot:
            size = max(16, 2 * (slot + 1))
            self.rsq = ti.ndarray(dtype=backend.real(), shape=size)
        with_force = force is not None
        iterate_stored(
            self.EI, self.EF, self.Dm_inv, self.quat, self.x, self.contrib, rot_iters,
            self.inc_ptr, self.VF, self.x_tilde, self.r, A.indptr, A.indices, A.data, h2,
            drag_vertex, drag_k, drag_target, gidx, gout,
            force if with_force else self.r, self.kept if with_force else self.r,
            force_scale, self.flags, with_force, self.rsq, slot,
        )  # fmt: skip

    def read_rsq(self, count: int) -> np.ndarray:
        """The first ``count`` stored ||r||^2 (one read of the device)."""
        from tisim import backend

        return np.asarray(backend.download(self.rsq, count), dtype=np.float64)

    def iterate_energy(
        self, rot_iters: int, A, h2: float, drag_vertex: int, drag_k: float, drag_target, gidx, gout
    ) -> tuple[float, float]:
        """Like :meth:`iterate`, and the incremental potential at x in the same launch:
        returns (||r||^2, E in J)."""
        rsq = self._iterate(
            iterate_with_energy, rot_iters, A, h2, drag_vertex, drag_k, drag_target, gidx, gout,
            self._out,
        )  # fmt: skip
        return float(rsq), float(self._out[0])

    def iterate_anderson(
        self, rot_iters: int, A, h2, drag_vertex, drag_k, drag_target, gidx, gout, aa,
        slot: int, count: int, record: int,
    ) -> tuple[float, float, bool]:
        """:func:`anderson_update` (``aa``: :class:`AndersonArrays`) then
        :meth:`iterate_energy`, in one launch; returns (||r||^2, E in J, extrapolated)."""
        rsq = iterate_anderson(
            self.EI, self.EF, self.Dm_inv, self.quat, self.x, self.contrib, rot_iters,
            self.inc_ptr, self.VF, self.x_tilde, self.r, A.indptr, A.indices, A.data, h2,
            drag_vertex, drag_k, drag_target, gidx, gout, aa.AV, aa.H, aa.AS, slot, count,
            record, aa.tikhonov, aa.out, self.flags,
        )  # fmt: skip
        return float(rsq), float(aa.out[0]), bool(aa.out[1] != 0.0)

    def _iterate(
        self, kernel, rot_iters, A, h2, drag_vertex, drag_k, drag_target, gidx, gout, *out
    ):
        return kernel(
            self.EI,
            self.EF,
            self.Dm_inv,
            self.quat,
            self.x,
            self.contrib,
            rot_iters,
            self.inc_ptr,
            self.VF,
            self.x_tilde,
            self.r,
            A.indptr,
            A.indices,
            A.data,
            h2,
            drag_vertex,
            drag_k,
            drag_target,
            gidx,
            gout,
            *out,
            self.flags,
        )

    def potential_energy(self, rot_iters: int, gravity) -> float:
        return potential_energy(
            self.EI,
            self.EF,
            self.Dm_inv,
            self.quat,
            self.x,
            self.VF,
            rot_iters,
            list(gravity),
            self.flags,
        )

    def residual_norm_sq(self) -> float:
        return norm_sq(self.r)

    def _typed(self, a):
        """A host array as the backend's float type (a kernel compiled for an f64 argument
        would narrow it silently into the f32 arrays); Taichi arrays pass through."""
        if isinstance(a, np.ndarray) and a.dtype != self.np_real:
            return np.ascontiguousarray(a, dtype=self.np_real)
        return a

    def add_to_residual(self, f: np.ndarray, scale: float) -> None:
        add_scaled_rows(self.r, self.VF, self._typed(f), scale)

    def set_residual_difference(self, fa, fb, scale: float, gidx, gout) -> None:
        """r = scale (fa - fb) on free vertices: fa, fb (n, 3) Taichi arrays (device); and
        the gather gout[i] = r[gidx[i]] for the global step (gidx may be empty)."""
        set_scaled_difference(self.r, self.VF, fa, fb, scale, gidx, gout)

    def set_residual(self, f: np.ndarray, scale: float) -> None:
        set_scaled_rows(self.r, self.VF, self._typed(f), scale)

    def gather_residual(self, index: np.ndarray, out: np.ndarray) -> None:
        gather_rows(self.r, index, out)

    def scatter_add_x(self, index: np.ndarray, delta: np.ndarray) -> None:
        scatter_add_rows(self.x, index, self._typed(delta))

    def read_x(self, out: np.ndarray) -> None:
        copy_rows(out, self.x)

    def write_x(self, src: np.ndarray) -> None:
        copy_rows(self.x, self._typed(src))

    def write_x_tilde(self, src: np.ndarray) -> None:
        copy_rows(self.x_tilde, self._typed(src))

    def copy_x_to_prev(self) -> None:
        copy_rows(self.x_prev, self.x)

    def save_vertex(self, v: int) -> None:
        save_row(self.x, v, self.saved)

    def rank_one_correction(self, column, v: int, coef: float) -> None:
        rank_one_correction(self.x, column, v, self.saved, coef)

    def jacobi_chebyshev(
        self, diag, gamma: float, omega: float, drag_vertex: int, drag_add: float
    ) -> None:
        jacobi_chebyshev(
            self.x, self.x_prev, self.r, self.VF, diag, gamma, omega, drag_vertex, drag_add
        )


class AndersonArrays:
    """Device arrays of Anderson acceleration for n vertices and window m (<= ANDERSON_MAX):
    AV (5, n, 3) vectors, H (2, m, n, 3) history, AS the small problem (see
    :func:`anderson_update`); ``out`` (2,) host array: E and the "extrapolated" flag."""

    def __init__(self, vertex_count: int, window: int):
        if not 1 <= window <= ANDERSON_MAX:
            raise ValueError(f"Anderson window must be in 1..{ANDERSON_MAX}, got {window}")
        real = ti.f64 if _is_f64() else ti.f32
        n, m = int(vertex_count), int(window)
        self.AV = ti.ndarray(real, shape=(5, n, 3))
        self.H = ti.ndarray(real, shape=(2, m, n, 3))
        self.AS = ti.ndarray(real, shape=(ANDERSON_SMALL_ROWS, 2 * ANDERSON_MAX))
        self.AS.fill(0.0)
        self.out = np.zeros(2, dtype=_np_real())
        # relative Tikhonov regularisation of the normal equations: above round-off
        self.tikhonov = 1e-10 if _is_f64() else 1e-5

    def fallback(self, x, alpha: float) -> None:
        anderson_fallback(x, self.AV, alpha)


def _is_f64() -> bool:
    from tisim import backend

    return backend.current().precision == "f64"


def _np_real():
    from tisim import backend

    return backend.np_real()
