"""Taichi kernels of the shell energies: Neo-Hookean membrane and strain limiting (hinge
bending in :mod:`tisim.energies.bending_kernels`, re-exported here).

Orchestration (rest data, fields, numpy helpers) lives in :mod:`tisim.energies.shell`;
this module only defines ``@ti.func``s and ``@ti.kernel``s. Every kernel takes its
per-object data as ``ti.types.ndarray()`` arguments (dtype, dimension and element
shape come from the argument), so each kernel compiles once per process (per
precision) and serves every energy object and every positions array of any size;
the offline cache reuses it across processes. Scalars are plain arguments.

Argument layouts: positions / gradients ``ti.Vector.ndarray(3, real, n)``; faces
``ti.ndarray(i32, (m, 3))``, hinges ``ti.ndarray(i32, (h, 4))``; packed per-element
data ``ti.ndarray(real, (k, cols))``; local Hessians ``ti.ndarray(real, (k, d, d))``;
reductions write ``out[0]`` of a shape-(1,) ndarray (set, not accumulated: each
kernel zeroes it in a serial step before its loop).

Every loop that adds floats into shared entries (energy sums, gradient scatters)
carries ``ti.loop_config(serialize=backend.SERIAL_SUMS)``: on the CPU backend it runs
on one thread, so the additions come in element order and two runs agree bit for bit
(and a serial scatter of plain adds beats a parallel one of atomic compare-and-swap
loops there); GPU backends keep the parallel atomic loop. The Hessians' sums into the
CSR values (``gather_*``) are parallel everywhere and still in a fixed order: each
vertex sums its own rows, from its elements in increasing order (the 64 x 64 drape's
two serial scatters took 4.2 ms of a 40 ms Newton iteration, the gathers with the
hinge factors they read 2.9 ms on two cores). A gather's ``csr[s] = csr[s] + t`` is
written out: ``+=`` on an ndarray in a parallel loop compiles to an atomic add (a
compare-and-swap loop for floats on the CPU), which made the first version 3x slower
than the serial scatter.

Conventions shared by every kernel:

* A triangle (x0, x1, x2) has edge matrix E = [x1 - x0, x2 - x0] (3 x 2) and the
  membrane deformation F = E G (3 x 2), with G = L^{-T} (2 x 2 upper triangular)
  from the Cholesky factor a_bar = L L^T of the rest first fundamental form, so
  C = F^T F = L^{-1} a L^{-T} is similar to a_bar^{-1} a (same invariants and
  singular values) and C = I at rest.
* A per-face gradient dPsi/dF (3 x 2) goes to the vertices through the 3 x 2
  matrix BG = B G with B = [[-1, -1], [1, 0], [0, 1]]: g_v = dPsi/dF BG[v, :]^T;
  a Hessian in F, blocks H_F[c][d] (3 x 3, d(dPsi/dF[:, c]) / dF[:, d]), goes to
  vertex blocks H[v][w] = sum_cd BG[v, c] BG[w, d] H_F[c][d].
* Local Hessians are stored row-major by (local vertex, coordinate): entry
  [e, 3 a + k, 3 b + l] = d^2 Psi / (dx_{a,k} dx_{b,l}).
* A hinge (e0, e1, o0, o1) has faces (e0, e1, o0) and (e1, e0, o1) (both in the
  winding that makes e0 -> e1 an edge of the first face); its signed dihedral
  angle is theta = atan2((n0 x n1) . e_hat, n0 . n1), 0 when flat, positive when
  the hinge bends away from the normals (like a convex surface with outward
  normals), in (-pi, pi].

This module has no ``from __future__ import annotations``: Taichi reads the
kernels' type annotations when they are decorated.
"""

import taichi as ti

from tisim import backend
from tisim import ti_math as tm

# the hinge bending's kernels live in their own module; the shell's callers find them here too
from tisim.energies.bending_kernels import (  # noqa: F401
    B_K,
    B_THETA,
    B_WEIGHT,
    BENDING_COLS,
    bending_energy,
    bending_gauss_newton_factors,
    bending_gradient,
    bending_hessian,
    gather_bending_gauss_newton,
)

# Packed per-face data of the membrane (columns of ``face_data``, real).
M_G00, M_G01, M_G11, M_AREA, M_MU, M_LAM, M_THICK = 0, 1, 2, 3, 4, 5, 6
MEMBRANE_COLS = 7
# Packed per-face data of the strain limit: G (3 entries), rest area, stiffness.
S_G00, S_G01, S_G11, S_AREA, S_KAPPA = 0, 1, 2, 3, 4
STRAIN_COLS = 5


# ---------------------------------------------------------------------------
# shared helpers


@ti.func
def face_frame(data: ti.template(), f):
    """BG (3 x 2) of face f: maps vertex positions to F = X^T BG and back."""
    g00 = data[f, 0]
    g01 = data[f, 1]
    g11 = data[f, 2]
    # B G with G = [[g00, g01], [0, g11]]
    return ti.Matrix([[-g00, -g01 - g11], [g00, g01], [0.0, g11]])


@ti.func
def deformation(x: ti.template(), faces: ti.template(), f, BG):
    """F = sum_v x_v BG[v, :] (3 x 2), the membrane deformation of face f."""
    F = ti.Matrix.zero(float, 3, 2)
    for v in ti.static(range(3)):
        xv = x[faces[f, v]]
        for c in ti.static(range(2)):
            F[:, c] += BG[v, c] * xv
    return F


@ti.func
def scatter_gradient(g: ti.template(), faces: ti.template(), f, BG, P):
    """Add dPsi/dF = P (3 x 2) of face f to the vertex gradients (atomic adds; the
    calling loops run on one thread on the CPU backend, backend.SERIAL_SUMS)."""
    for v in ti.static(range(3)):
        g[faces[f, v]] += BG[v, 0] * P[:, 0] + BG[v, 1] * P[:, 1]


@ti.func
def store_face_hessian(out: ti.template(), f, BG, H00, H01, H11):
    """Write the 9 x 9 vertex Hessian of face f from the F-space blocks
    H00, H01, H11 (H10 = H01^T); runtime loops keep the traced code small."""
    H10 = H01.transpose()
    for v, w in ti.ndrange(3, 3):
        blk = (
            (BG[v, 0] * BG[w, 0]) * H00
            + (BG[v, 0] * BG[w, 1]) * H01
            + (BG[v, 1] * BG[w, 0]) * H10
            + (BG[v, 1] * BG[w, 1]) * H11
        )
        for k, l in ti.ndrange(3, 3):
            out[f, 3 * v + k, 3 * w + l] = blk[k, l]


@ti.func
def inverse2(C):
    det = C[0, 0] * C[1, 1] - C[0, 1] * C[1, 0]
    return ti.Matrix([[C[1, 1], -C[0, 1]], [-C[1, 0], C[0, 0]]]) / det


# ---------------------------------------------------------------------------
# Neo-Hookean membrane (notes §2.4, §7): with C = F^T F (= a_bar^-1 a up to similarity),
# Psi = tau A [mu/2 (tr C - 2 - 2 ln J) + lam/2 ln^2 J],  ln J = 1/2 ln det C.
# dPsi/dC = kap [mu I + beta C^-1] =: S, kap = tau A / 2, beta = lam ln J - mu;
# dPsi/dF = 2 F S. With A = C^-1 and P = F A, the F-space Hessian blocks are
# H_F[c][d] = 2 S_cd I + 2 kap lam P_c P_d^T - 2 kap beta (A_cd F A F^T + P_d P_c^T).


@ti.func
def membrane_psi(F, area, mu, lam, tau):
    C = F.transpose() @ F
    det = C[0, 0] * C[1, 1] - C[0, 1] * C[1, 0]
    psi = ti.math.inf
    if det > 0.0:
        lnJ = 0.5 * tm.log(det)
        psi = tau * area * (0.5 * mu * (C[0, 0] + C[1, 1] - 2.0 - 2.0 * lnJ) + 0.5 * lam * lnJ * lnJ)
    return psi


@ti.func
def membrane_stress(F, area, mu, lam, tau):
    """(dPsi/dF (3 x 2), S = dPsi/dC, A = C^-1, beta, kap)."""
    C = F.transpose() @ F
    det = C[0, 0] * C[1, 1] - C[0, 1] * C[1, 0]
    lnJ = 0.5 * tm.log(det)
    A = inverse2(C)
    kap = 0.5 * tau * area
    beta = lam * lnJ - mu
    S = kap * (mu * ti.Matrix.identity(float, 2) + beta * A)
    return 2.0 * F @ S, S, A, beta, kap


@ti.func
def membrane_energy_pass(x: ti.template(), faces: ti.template(), data: ti.template(), out: ti.template()):
    """out[0] = sum over faces of Psi_m (J)."""
    out[0] = 0.0
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        out[0] += membrane_psi(F, data[f, M_AREA], data[f, M_MU], data[f, M_LAM], data[f, M_THICK])


@ti.kernel
def membrane_energy(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
):
    """``membrane_energy_pass`` in a launch of its own."""
    membrane_energy_pass(x, faces, data, out)


@ti.func
def membrane_gradient_pass(x: ti.template(), faces: ti.template(), data: ti.template(), g: ti.template()):
    """g += dPsi_m/dx (N)."""
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        P, _S, _A, _beta, _kap = membrane_stress(F, data[f, M_AREA], data[f, M_MU], data[f, M_LAM], data[f, M_THICK])
        scatter_gradient(g, faces, f, BG, P)


@ti.kernel
def membrane_gradient(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    g: ti.types.ndarray(),
):
    """``membrane_gradient_pass`` in a launch of its own."""
    membrane_gradient_pass(x, faces, data, g)


@ti.func
def membrane_blocks(F, area, mu, lam, tau):
    """F-space Hessian blocks (H00, H01, H11) of Psi_m (H10 = H01^T)."""
    _P, S, A, beta, kap = membrane_stress(F, area, mu, lam, tau)
    PA = F @ A
    P0 = ti.Vector([PA[0, 0], PA[1, 0], PA[2, 0]])
    P1 = ti.Vector([PA[0, 1], PA[1, 1], PA[2, 1]])
    FAF = PA @ F.transpose()
    I3 = ti.Matrix.identity(float, 3)
    c1 = 2.0 * kap * lam
    c2 = 2.0 * kap * beta
    H00 = 2.0 * S[0, 0] * I3 + c1 * P0.outer_product(P0) - c2 * (A[0, 0] * FAF + P0.outer_product(P0))
    H11 = 2.0 * S[1, 1] * I3 + c1 * P1.outer_product(P1) - c2 * (A[1, 1] * FAF + P1.outer_product(P1))
    H01 = 2.0 * S[0, 1] * I3 + c1 * P0.outer_product(P1) - c2 * (A[0, 1] * FAF + P1.outer_product(P0))
    return H00, H01, H11


@ti.func
def store_f_hessian(out: ti.template(), f, H00, H01, H11):
    """Write the 6 x 6 F-space Hessian of face f, row (column c of F, coordinate k)."""
    H10 = H01.transpose()
    for k, l in ti.static(ti.ndrange(3, 3)):
        out[f, k, l] = H00[k, l]
        out[f, k, 3 + l] = H01[k, l]
        out[f, 3 + k, l] = H10[k, l]
        out[f, 3 + k, 3 + l] = H11[k, l]


@ti.kernel
def membrane_hessian(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
):
    """out[f] = raw 9 x 9 Hessian of Psi_m of face f (N/m)."""
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        H00, H01, H11 = membrane_blocks(F, data[f, M_AREA], data[f, M_MU], data[f, M_LAM], data[f, M_THICK])
        store_face_hessian(out, f, BG, H00, H01, H11)


@ti.kernel
def membrane_hessian_f(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
):
    """out[f] = raw 6 x 6 Hessian of Psi_m of face f with respect to F (J).

    The vertex Hessian is D^T out[f] D with D = dF/dx (6 x 9, constant per face), so a
    PSD projection of this 6 x 6 matrix gives a PSD 9 x 9 one at a third of the cost."""
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        H00, H01, H11 = membrane_blocks(F, data[f, M_AREA], data[f, M_MU], data[f, M_LAM], data[f, M_THICK])
        store_f_hessian(out, f, H00, H01, H11)


@ti.func
def _row_of(BG, a):
    """Row a (a run-time local vertex index) of the 3 x 2 matrix BG, as a 2-vector."""
    r = ti.Vector([BG[0, 0], BG[0, 1]])
    for aa in ti.static(range(1, 3)):
        if a == aa:
            r = ti.Vector([BG[aa, 0], BG[aa, 1]])
    return r


@ti.func
def gather_face_hessians_pass(
    data: ti.template(),
    hf: ti.template(),
    ptr: ti.template(),
    inc: ti.template(),
    rows: ti.template(),
    indptr: ti.template(),
    csr: ti.template(),
):
    """csr[slot] = sum of (D^T hf[f] D)[i, j] over the faces f: the 9 x 9 vertex Hessians
    from their F-space Hessians (``shell_hessian_f``), summed into a CSR value array
    whose rows 3 v .. 3 v + 2 (indptr: the pattern's row starts) vertex v first zeroes:
    the first of the gathers into ``csr``, the others add.
    Parallel over vertices, without atomics: vertex v adds the rows of its faces' 9 x 9
    Hessians that belong to it (the pattern is the full matrix, so row v's slots are
    written by v alone). ptr (n + 1,) and inc (K, 2) list each vertex's (face, local
    index) pairs by increasing face, rows (K, 3, 9) their rows' CSR slots
    (``DeviceAssembler.incidence``; -1: dropped). Every entry gets its terms in face
    order, on every backend and thread count (bit for bit: no float atomics)."""
    for v in range(ptr.shape[0] - 1):
        for s in range(indptr[3 * v], indptr[3 * v + 3]):
            csr[s] = 0.0
        for j in range(ptr[v], ptr[v + 1]):
            f = inc[j, 0]
            a = inc[j, 1]
            BG = face_frame(data, f)
            ba = _row_of(BG, a)
            for w in ti.static(range(3)):
                for k, l in ti.ndrange(3, 3):
                    s = rows[j, k, 3 * w + l]
                    if s >= 0:
                        acc = 0.0
                        for c in ti.static(range(2)):
                            for d in ti.static(range(2)):
                                acc += ba[c] * BG[w, d] * hf[f, 3 * c + k, 3 * d + l]
                        csr[s] = csr[s] + acc  # row v is v's alone: no atomic add


@ti.kernel
def gather_face_hessians(
    data: ti.types.ndarray(),
    hf: ti.types.ndarray(),
    ptr: ti.types.ndarray(),
    inc: ti.types.ndarray(),
    rows: ti.types.ndarray(),
    indptr: ti.types.ndarray(),
    csr: ti.types.ndarray(),
):
    """``gather_face_hessians_pass`` in a launch of its own."""
    gather_face_hessians_pass(data, hf, ptr, inc, rows, indptr, csr)


@ti.kernel
def scatter_blocks(h: ti.types.ndarray(), count: ti.i32, slots: ti.types.ndarray(), csr: ti.types.ndarray()):
    """csr[slots[e, i, j]] += h[e, i, j] for e < count (slot -1: entry dropped)."""
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for e in range(count):
        for i, j in ti.ndrange(h.shape[1], h.shape[2]):
            s = slots[e, i, j]
            if s >= 0:
                csr[s] += h[e, i, j]


# ---------------------------------------------------------------------------
# Strain limiting (C-IPC): Phi = kappa A sum_i b(s_max - sigma_i, s_hat), written as a
# spectral function of C = F^T F: Phi = sum_i g(lambda_i), lambda_i = sigma_i^2, with
#   g(l) = kappa A b(s_max - sqrt(l), s_hat),
#   g'(l) = -kappa A b'(d) / (2 sigma),  g''(l) = kappa A (b''(d) / (4 sigma^2) + b'(d) / (4 sigma^3)).
# dPhi/dC = V diag(g') V^T =: S, dPhi/dF = 2 F S, and with f_i = F v_i,
# H_F[c][d] = 2 S_cd I + sum_i 4 g''_i v_i[c] v_i[d] f_i f_i^T + 2 gamma w_c w_d^T,
# w_c = v2[c] f1 + v1[c] f2, gamma = (g'_1 - g'_2) / (lambda_1 - lambda_2)
# (-> g''(mean) when the eigenvalues meet; ``tol`` picks the switch).


@ti.func
def barrier(d, dhat):
    """IPC log barrier b(d, dhat) = -(d - dhat)^2 ln(d / dhat) on 0 < d < dhat, 0 beyond,
    +inf for d <= 0; returns (b, b', b'')."""
    b = 0.0
    b1 = 0.0
    b2 = 0.0
    if d <= 0.0:
        b = ti.math.inf
    elif d < dhat:
        r = d - dhat
        lg = tm.log(d / dhat)
        b = -r * r * lg
        b1 = -2.0 * r * lg - r * r / d
        b2 = -2.0 * lg - 4.0 * r / d + r * r / (d * d)
    return b, b1, b2


@ti.func
def sym_eigen2(C):
    """Eigenvalues l1 >= l2 and unit eigenvectors (v1, v2) of a symmetric 2 x 2 C."""
    m = 0.5 * (C[0, 0] + C[1, 1])
    hd = 0.5 * (C[0, 0] - C[1, 1])
    r = ti.sqrt(hd * hd + C[0, 1] * C[0, 1])
    phi = 0.5 * tm.atan2(C[0, 1], hd)
    cs = tm.cos(phi)
    sn = tm.sin(phi)
    return m + r, m - r, ti.Vector([cs, sn]), ti.Vector([-sn, cs])


@ti.func
def strain_scalar(lam, ka, s_max, s_hat):
    """(g, g', g'') of one eigenvalue lam = sigma^2 of C."""
    sig = ti.sqrt(ti.max(lam, 0.0))
    b, b1, b2 = barrier(s_max - sig, s_hat)
    g1 = 0.0
    g2 = 0.0
    if b1 != 0.0 or b2 != 0.0:
        g1 = -ka * b1 / (2.0 * sig)
        g2 = ka * (b2 / (4.0 * sig * sig) + b1 / (4.0 * sig * sig * sig))
    return ka * b, g1, g2


@ti.func
def max_singular_value(F):
    C = F.transpose() @ F
    l1, _l2, _v1, _v2 = sym_eigen2(C)
    return ti.sqrt(ti.max(l1, 0.0))


@ti.func
def strain_energy_pass(
    x: ti.template(), faces: ti.template(), data: ti.template(), out: ti.template(), s_max, s_hat, count
):
    """out[0] = sum over faces of Phi (J); +inf where a sigma_i >= s_max. out[1] = the
    largest sigma_1 over the faces (``face_stretch``'s value, from the same eigenvalues)."""
    out[0] = 0.0
    out[1] = 0.0
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for f in range(count):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        l1, l2, _v1, _v2 = sym_eigen2(F.transpose() @ F)
        ti.atomic_max(out[1], ti.sqrt(ti.max(l1, 0.0)))
        ka = data[f, S_KAPPA] * data[f, S_AREA]
        e1, _a1, _b1 = strain_scalar(l1, ka, s_max, s_hat)
        e2, _a2, _b2 = strain_scalar(l2, ka, s_max, s_hat)
        if e1 + e2 != 0.0:
            out[0] += e1 + e2


@ti.kernel
def strain_energy(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
    s_max: float,
    s_hat: float,
):
    """``strain_energy_pass`` in a launch of its own."""
    strain_energy_pass(x, faces, data, out, s_max, s_hat, faces.shape[0])


@ti.func
def strain_gradient_pass(
    x: ti.template(), faces: ti.template(), data: ti.template(), g: ti.template(), s_max, s_hat, count
):
    """g += dPhi/dx (N), faces below activation skipped."""
    ti.loop_config(serialize=backend.SERIAL_SUMS)
    for f in range(count):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        l1, l2, v1, v2 = sym_eigen2(F.transpose() @ F)
        if ti.sqrt(ti.max(l1, 0.0)) > s_max - s_hat:
            ka = data[f, S_KAPPA] * data[f, S_AREA]
            _e1, gp1, _gq1 = strain_scalar(l1, ka, s_max, s_hat)
            _e2, gp2, _gq2 = strain_scalar(l2, ka, s_max, s_hat)
            S = gp1 * v1.outer_product(v1) + gp2 * v2.outer_product(v2)
            scatter_gradient(g, faces, f, BG, 2.0 * F @ S)


@ti.kernel
def strain_gradient(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    g: ti.types.ndarray(),
    s_max: float,
    s_hat: float,
):
    """``strain_gradient_pass`` in a launch of its own."""
    strain_gradient_pass(x, faces, data, g, s_max, s_hat, faces.shape[0])


@ti.func
def strain_blocks(F, ka, s_max, s_hat, tol):
    """F-space Hessian blocks (H00, H01, H11) of the strain barrier of one face (zero
    below activation); ka = kappa * rest area."""
    l1, l2, v1, v2 = sym_eigen2(F.transpose() @ F)
    H00 = ti.Matrix.zero(float, 3, 3)
    H01 = ti.Matrix.zero(float, 3, 3)
    H11 = ti.Matrix.zero(float, 3, 3)
    if ti.sqrt(ti.max(l1, 0.0)) > s_max - s_hat:
        _e1, gp1, gq1 = strain_scalar(l1, ka, s_max, s_hat)
        _e2, gp2, gq2 = strain_scalar(l2, ka, s_max, s_hat)
        gamma = 0.0
        if l1 - l2 > tol:
            gamma = (gp1 - gp2) / (l1 - l2)
        else:
            # the divided difference tends to g'' at the mean eigenvalue
            _em, _gpm, gqm = strain_scalar(0.5 * (l1 + l2), ka, s_max, s_hat)
            gamma = gqm
        S = gp1 * v1.outer_product(v1) + gp2 * v2.outer_product(v2)
        f1 = F @ v1
        f2 = F @ v2
        w0 = v2[0] * f1 + v1[0] * f2
        w1 = v2[1] * f1 + v1[1] * f2
        F11 = 4.0 * gq1 * f1.outer_product(f1)
        F22 = 4.0 * gq2 * f2.outer_product(f2)
        I3 = ti.Matrix.identity(float, 3)
        H00 = 2.0 * S[0, 0] * I3 + v1[0] * v1[0] * F11 + v2[0] * v2[0] * F22 + 2.0 * gamma * w0.outer_product(w0)
        H01 = 2.0 * S[0, 1] * I3 + v1[0] * v1[1] * F11 + v2[0] * v2[1] * F22 + 2.0 * gamma * w0.outer_product(w1)
        H11 = 2.0 * S[1, 1] * I3 + v1[1] * v1[1] * F11 + v2[1] * v2[1] * F22 + 2.0 * gamma * w1.outer_product(w1)
    return H00, H01, H11


@ti.kernel
def strain_hessian(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
    s_max: float,
    s_hat: float,
    tol: float,
):
    """out[f] = raw 9 x 9 Hessian of Phi of face f (N/m); zero below activation."""
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        H00, H01, H11 = strain_blocks(F, data[f, S_KAPPA] * data[f, S_AREA], s_max, s_hat, tol)
        store_face_hessian(out, f, BG, H00, H01, H11)


@ti.kernel
def strain_hessian_f(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
    s_max: float,
    s_hat: float,
    tol: float,
    accumulate: ti.i32,
):
    """out[f] (+)= the 6 x 6 F-space Hessian of Phi of face f (see membrane_hessian_f);
    accumulate = 1 adds it (to a membrane F-space Hessian on the same faces), 0 sets it."""
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        H00, H01, H11 = strain_blocks(F, data[f, S_KAPPA] * data[f, S_AREA], s_max, s_hat, tol)
        if accumulate:
            H10 = H01.transpose()
            for k, l in ti.static(ti.ndrange(3, 3)):
                out[f, k, l] += H00[k, l]
                out[f, k, 3 + l] += H01[k, l]
                out[f, 3 + k, l] += H10[k, l]
                out[f, 3 + k, 3 + l] += H11[k, l]
        else:
            store_f_hessian(out, f, H00, H01, H11)


# ---------------------------------------------------------------------------
# The PSD projection of membrane + strain limit in F-space, analytically.
# Both energies are functions of the eigenvalues lambda_1 >= lambda_2 of C = F^T F
# (F = sigma_1 u_1 v_1^T + sigma_2 u_2 v_2^T, lambda_i = sigma_i^2, u_3 = u_1 x u_2), so
# with g_i = dPsi/dlambda_i, h_ij = d2Psi/dlambda_i dlambda_j and
# gamma = (g_1 - g_2) / (lambda_1 - lambda_2), the F-space Hessian's six eigenpairs are
# (from d2Psi[dF, dG] = 2 tr(S dF^T dG) + Psi_CC[dC(dF), dC(dG)] and Lewis' formula
# for the second derivative of a spectral function):
#   u_3 v_j^T, j = 1, 2 (out of plane, dC = 0):  2 g_j;
#   span(u_1 v_1^T, u_2 v_2^T) (stretch):        [[2 g_1 + 4 l_1 h_11, 4 s_1 s_2 h_12],
#                                                  [4 s_1 s_2 h_12, 2 g_2 + 4 l_2 h_22]];
#   span(u_1 v_2^T, u_2 v_1^T) (shear/rotation):  [[2 g_2 + 2 l_1 gamma, 2 s_1 s_2 gamma],
#                                                  [2 s_1 s_2 gamma, 2 g_1 + 2 l_2 gamma]].
# Membrane (above): g_i = kap (mu + beta / l_i), h_ii = kap (lam / 2 - beta) / l_i^2,
# h_12 = kap lam / (2 l_1 l_2), gamma = -kap beta / (l_1 l_2). Strain limit: separable,
# g_i = g'(l_i), h_ii = g''(l_i), gamma its divided difference (strain_blocks).
# Clamping the six eigenvalues at zero is the exact PSD projection, without the Jacobi
# sweeps of linalg.psd (which compressed faces needed: their Cholesky test fails).


@ti.func
def _mode(u, v):
    """u v^T (3 x 2) as a 6-vector in the F-space Hessian's order (3 c + k for F[k, c])."""
    return ti.Vector([u[0] * v[0], u[1] * v[0], u[2] * v[0], u[0] * v[1], u[1] * v[1], u[2] * v[1]])


@ti.func
def _left_frame(f1, f2):
    """Orthonormal u_1, u_2, u_3 with u_1 along f1 and u_2 in span(f1, f2) (any completion
    where f1 or f2 vanish: such a face has infinite membrane energy, never an iterate)."""
    u1 = ti.Vector([1.0, 0.0, 0.0])
    n1 = f1.norm()
    if n1 > 0.0:
        u1 = f1 / n1
    t = f2 - f2.dot(u1) * u1
    n2 = t.norm()
    u2 = ti.Vector([0.0, 0.0, 0.0])
    if n2 > 1e-12 * n1:
        u2 = t / n2
    else:
        a = ti.Vector([1.0, 0.0, 0.0])
        if ti.abs(u1[0]) > 0.6:
            a = ti.Vector([0.0, 1.0, 0.0])
        u2 = u1.cross(a).normalized()
    return u1, u2, u1.cross(u2)


@ti.func
def _add_block(H, a00, a01, a11, qa, qb, project: ti.i32):
    """H += the symmetric 2 x 2 block [[a00, a01], [a01, a11]] on the modes (qa, qb),
    its eigenvalues clamped at zero when ``project``."""
    m1, m2, e1, e2 = sym_eigen2(ti.Matrix([[a00, a01], [a01, a11]]))
    if project:
        m1 = ti.max(m1, 0.0)
        m2 = ti.max(m2, 0.0)
    q1 = e1[0] * qa + e1[1] * qb
    q2 = e2[0] * qa + e2[1] * qb
    return H + m1 * q1.outer_product(q1) + m2 * q2.outer_product(q2)


@ti.func
def shell_hessian_f_pass(
    x: ti.template(),
    faces: ti.template(),
    data: ti.template(),
    sdata: ti.template(),
    membrane_on,
    strain_on,
    s_max,
    s_hat,
    tol,
    project,
    out: ti.template(),
):
    """out[f] = the 6 x 6 F-space Hessian of Psi_m (when membrane_on; per-face data
    ``data``) plus the strain limit's Phi (when strain_on; per-face data ``sdata``, on
    the same faces), from its eigensystem (above): clamped at zero when ``project`` (the
    PSD projection), raw otherwise. The face frames are read from ``data`` (the same
    columns in both layouts)."""
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        F = deformation(x, faces, f, BG)
        l1, l2, v1, v2 = sym_eigen2(F.transpose() @ F)
        g1 = 0.0
        g2 = 0.0
        h11 = 0.0
        h22 = 0.0
        h12 = 0.0
        gamma = 0.0
        if membrane_on != 0:
            kap = 0.5 * data[f, M_THICK] * data[f, M_AREA]
            mu = data[f, M_MU]
            lam = data[f, M_LAM]
            ll = l1 * l2
            beta = lam * 0.5 * tm.log(ll) - mu
            g1 = kap * (mu + beta / l1)
            g2 = kap * (mu + beta / l2)
            h11 = kap * (0.5 * lam - beta) / (l1 * l1)
            h22 = kap * (0.5 * lam - beta) / (l2 * l2)
            h12 = 0.5 * kap * lam / ll
            gamma = -kap * beta / ll
        if strain_on != 0 and ti.sqrt(ti.max(l1, 0.0)) > s_max - s_hat:
            ka = sdata[f, S_KAPPA] * sdata[f, S_AREA]
            _e1, gp1, gq1 = strain_scalar(l1, ka, s_max, s_hat)
            _e2, gp2, gq2 = strain_scalar(l2, ka, s_max, s_hat)
            gs = 0.0
            if l1 - l2 > tol:
                gs = (gp1 - gp2) / (l1 - l2)
            else:
                _em, _gpm, gqm = strain_scalar(0.5 * (l1 + l2), ka, s_max, s_hat)
                gs = gqm
            g1 += gp1
            g2 += gp2
            h11 += gq1
            h22 += gq2
            gamma += gs
        s1 = ti.sqrt(ti.max(l1, 0.0))
        s2 = ti.sqrt(ti.max(l2, 0.0))
        u1, u2, u3 = _left_frame(F @ v1, F @ v2)
        H = ti.Matrix.zero(float, 6, 6)
        wo1 = 2.0 * g1  # the out-of-plane modes
        wo2 = 2.0 * g2
        if project:
            wo1 = ti.max(wo1, 0.0)
            wo2 = ti.max(wo2, 0.0)
        q1 = _mode(u3, v1)
        q2 = _mode(u3, v2)
        H += wo1 * q1.outer_product(q1) + wo2 * q2.outer_product(q2)
        H = _add_block(
            H,
            2.0 * g1 + 4.0 * l1 * h11,
            4.0 * s1 * s2 * h12,
            2.0 * g2 + 4.0 * l2 * h22,
            _mode(u1, v1),
            _mode(u2, v2),
            project,
        )
        H = _add_block(
            H,
            2.0 * g2 + 2.0 * l1 * gamma,
            2.0 * s1 * s2 * gamma,
            2.0 * g1 + 2.0 * l2 * gamma,
            _mode(u1, v2),
            _mode(u2, v1),
            project,
        )
        for i in ti.static(range(6)):
            for j in ti.static(range(6)):
                out[f, i, j] = H[i, j]


@ti.kernel
def shell_hessian_f(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    sdata: ti.types.ndarray(),
    membrane_on: ti.i32,
    strain_on: ti.i32,
    s_max: float,
    s_hat: float,
    tol: float,
    project: ti.i32,
    out: ti.types.ndarray(),
):
    """``shell_hessian_f_pass`` in a launch of its own."""
    shell_hessian_f_pass(x, faces, data, sdata, membrane_on, strain_on, s_max, s_hat, tol, project, out)


@ti.kernel
def face_stretch(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    sigma: ti.types.ndarray(),
    out: ti.types.ndarray(),
):
    """sigma[f] = largest singular value of F of face f; out[0] = max over faces."""
    out[0] = 0.0
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        s = max_singular_value(deformation(x, faces, f, BG))
        sigma[f] = s
        ti.atomic_max(out[0], s)


@ti.kernel
def count_infeasible(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    data: ti.types.ndarray(),
    out: ti.types.ndarray(),
    s_max: float,
):
    """out[0] = number of faces with sigma_1 >= s_max (or a degenerate F)."""
    out[0] = 0
    for f in range(faces.shape[0]):
        BG = face_frame(data, f)
        s = max_singular_value(deformation(x, faces, f, BG))
        if not (s < s_max):
            out[0] += 1


@ti.kernel
def zero_vectors(g: ti.types.ndarray()):
    for i in range(g.shape[0]):
        g[i] = ti.Vector([0.0, 0.0, 0.0])
