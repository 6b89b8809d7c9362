"""Taichi kernels of the local-global solver's local half: the local step (rotation
extraction, element targets), the residual assembly, the energy, and the launches that
fuse them (``iterate`` and its variants).

Everything per element or per vertex lives in Taichi ndarrays allocated once by
:class:`~tisim.solvers.pd.kernels.PDKernels` (sized by the model); the kernels are module-level functions
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

# nested ifs: the outer ``if ti.static(...)`` is resolved at compile time

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
# when the first PDKernels is made (before any of these kernels compiles; each module of
# kernels has its own, set together); parallel on GPU backends.
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
    Ds = ti.Matrix.cols([row3(x, EI[e, _T0 + 1]) - x0, row3(x, EI[e, _T0 + 2]) - x0, row3(x, EI[e, _T0 + 3]) - x0])
    return Ds @ mat3(Dm_inv, e)


@ti.func
def element_target(EF: ti.template(), quat: ti.template(), e, mat, F, rot_iters, flags: ti.template()):
    """T_e = sum w p (3x3) of element e at deformation gradient F (quat updated)."""
    T = ti.Matrix.zero(float, 3, 3)
    if ti.static(flags & ((1 << ARAP) | (1 << COROTATED))):
        if mat == ARAP or mat == COROTATED:
            # projective rotation term: p = R(F), the minimiser of ||F - R||^2 over SO(3),
            # warm-started from the previous iteration / frame
            q = fast_rotation(F, ti.Vector([quat[e, 0], quat[e, 1], quat[e, 2], quat[e, 3]]), rot_iters)
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
def element_energy(EF: ti.template(), quat: ti.template(), e, mat, F, rot_iters, flags: ti.template()):
    """V_e psi(F) in J (+ the volume constraint's w/2 ||F - proj(F)||^2)."""
    psi = 0.0
    if ti.static(flags & ((1 << ARAP) | (1 << COROTATED))):
        if mat == ARAP or mat == COROTATED:
            q = fast_rotation(F, ti.Vector([quat[e, 0], quat[e, 1], quat[e, 2], quat[e, 3]]), rot_iters)
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


def _is_f64() -> bool:
    from tisim import backend

    return backend.current().precision == "f64"


def _np_real():
    from tisim import backend

    return backend.np_real()
