"""Taichi ``@ti.func`` versions of the materials, for solver kernels.

Importing this module imports Taichi but neither initialises it nor creates
fields or kernels; the functions compile inside the caller's kernels in the
precision the backend was initialised with (:mod:`tisim.backend`).

Formulas and units are those of :mod:`tisim.materials.hyperelastic` (F: 3x3
deformation gradient, mu, lam: Lamé parameters in Pa, psi in Pa = J/m^3, P in Pa):

* ``energy_density_nh`` / ``first_piola_nh``: stable Neo-Hookean
  psi = mu/2 (I_C - 3) - mu (J - 1) + (lam + mu)/2 (J - 1)^2.
* ``energy_density_nh_log`` / ``first_piola_nh_log``: mu/2 (I_C - 3) - mu log J + lam/2 (log J)^2
  (psi = inf for J <= 0; P is then nan).
* ``energy_density_arap`` / ``first_piola_arap``: mu ||F - R||^2, P = 2 mu (F - R).
* ``energy_density_corotated`` / ``first_piola_corotated``: + lam/2 (J - 1)^2.
* ``energy_density_symmetric_dirichlet`` / ``first_piola_symmetric_dirichlet``,
  ``energy_density_symmetric_gradient`` / ``first_piola_symmetric_gradient``.

R is the polar rotation of F (det R = +1), passed in by the caller so that a
solver can cache or warm-start it:

* ``polar_rotation(F, R_guess, iterations) -> R`` and
  ``polar_rotation_quat(F, q_guess, iterations) -> q`` (unit quaternion (w, x, y, z)):
  iterative, SVD-free, warm-started maximisation of tr(R^T F) over SO(3) (see
  ``polar_rotation_quat`` for the method and its convergence).
* ``polar_rotation_svd(F) -> R`` and ``svd_rotation_variant(F) -> (U, sigma, V)``
  through ``ti.svd`` with the determinant fix.
* ``polar_rotation_guard(F, q) -> q`` and ``is_polar_maximum(F, R)``: a half-turn guard
  for any warm-started extraction (falls back to the SVD when R is not the maximiser).

References:
    M. Müller, J. Bender, N. Chentanez, M. Macklin. A Robust Method to Extract the
    Rotational Part of Deformations. MIG 2016.
    B. Smith, F. de Goes, T. Kim. Stable Neo-Hookean Flesh Simulation. ACM TOG 2018.

Limitations: ``polar_rotation_svd`` inherits the accuracy of ``ti.svd`` (about
1e-9 in f64, whatever its sweep count; polish it with two iterations of
``polar_rotation`` if more is needed); the iterative rotation converges to the
maximiser of tr(R^T F) except from an exactly critical start that none of its
candidate axes improves (see ``polar_rotation_quat``). The f32 paths compile but
are tested only in f64.
"""

from __future__ import annotations

import taichi as ti

from tisim import ti_math as tm

__all__ = [
    "cofactor",
    "energy_density_arap",
    "energy_density_corotated",
    "energy_density_nh",
    "energy_density_nh_log",
    "energy_density_symmetric_dirichlet",
    "energy_density_symmetric_gradient",
    "first_piola_arap",
    "first_piola_corotated",
    "first_piola_nh",
    "first_piola_nh_log",
    "first_piola_symmetric_dirichlet",
    "first_piola_symmetric_gradient",
    "is_polar_maximum",
    "matrix_to_quat",
    "polar_rotation",
    "polar_rotation_guard",
    "polar_rotation_quat",
    "polar_rotation_svd",
    "quat_mul",
    "quat_to_matrix",
    "svd_rotation_variant",
]


# ---------------------------------------------------------------------------
# helpers


# No type annotations on @ti.func arguments here: with `from __future__ import
# annotations` Taichi would receive them as strings.


@ti.func
def _cols(F):
    return (
        ti.Vector([F[0, 0], F[1, 0], F[2, 0]]),
        ti.Vector([F[0, 1], F[1, 1], F[2, 1]]),
        ti.Vector([F[0, 2], F[1, 2], F[2, 2]]),
    )


@ti.func
def cofactor(F):
    """cof F = dJ/dF = J F^-T, exact for singular F too (columns: cross products of F's columns)."""
    f0, f1, f2 = _cols(F)
    return ti.Matrix.cols([f1.cross(f2), f2.cross(f0), f0.cross(f1)])


@ti.func
def _machine_eps():
    e = 2.220446049250313e-16
    if ti.static(ti.lang.impl.get_runtime().default_fp == ti.f32):
        e = 1.1920928955078125e-07
    return e


# ---------------------------------------------------------------------------
# energies and stresses


@ti.func
def energy_density_nh(F, mu, lam):
    """Stable Neo-Hookean psi(F) in Pa: mu/2 (I_C - 3) - mu (J - 1) + (lam + mu)/2 (J - 1)^2."""
    J = F.determinant()
    lp = lam + mu
    return 0.5 * mu * (F.norm_sqr() - 3.0) - mu * (J - 1.0) + 0.5 * lp * (J - 1.0) ** 2


@ti.func
def first_piola_nh(F, mu, lam):
    """Stable Neo-Hookean P = mu F + ((lam + mu)(J - 1) - mu) cof F, in Pa."""
    J = F.determinant()
    lp = lam + mu
    return mu * F + (lp * (J - 1.0) - mu) * cofactor(F)


@ti.func
def energy_density_nh_log(F, mu, lam):
    """mu/2 (I_C - 3) - mu log J + lam/2 (log J)^2 in Pa; inf for J <= 0."""
    J = F.determinant()
    psi = ti.math.inf
    if J > 0.0:
        lj = tm.log(J)
        psi = 0.5 * mu * (F.norm_sqr() - 3.0) - mu * lj + 0.5 * lam * lj * lj
    return psi


@ti.func
def first_piola_nh_log(F, mu, lam):
    """P = mu F + (lam log J - mu) F^-T in Pa (nan for J <= 0)."""
    J = F.determinant()
    lj = ti.math.nan
    if J > 0.0:
        lj = tm.log(J)
    return mu * F + (lam * lj - mu) * (cofactor(F) / J)


@ti.func
def energy_density_arap(F, R, mu):
    """ARAP psi = mu ||F - R||_F^2 in Pa; R the polar rotation of F."""
    return mu * (F - R).norm_sqr()


@ti.func
def first_piola_arap(F, R, mu):
    """ARAP P = 2 mu (F - R) in Pa."""
    return 2.0 * mu * (F - R)


@ti.func
def energy_density_corotated(F, R, mu, lam):
    """Corotated psi = mu ||F - R||^2 + lam/2 (J - 1)^2 in Pa."""
    J = F.determinant()
    return mu * (F - R).norm_sqr() + 0.5 * lam * (J - 1.0) ** 2


@ti.func
def first_piola_corotated(F, R, mu, lam):
    """Corotated P = 2 mu (F - R) + lam (J - 1) cof F in Pa."""
    J = F.determinant()
    return 2.0 * mu * (F - R) + lam * (J - 1.0) * cofactor(F)


@ti.func
def energy_density_symmetric_dirichlet(F, mu):
    """mu/2 (||F||^2 + ||F^-1||^2) - 3 mu in Pa; inf for J = 0."""
    J = F.determinant()
    psi = ti.math.inf
    if J != 0.0:
        A = cofactor(F) / J  # F^-T
        psi = 0.5 * mu * (F.norm_sqr() + A.norm_sqr()) - 3.0 * mu
    return psi


@ti.func
def first_piola_symmetric_dirichlet(F, mu):
    """P = mu (F - F^-T F^-1 F^-T) in Pa."""
    A = cofactor(F) / F.determinant()
    return mu * (F - A @ A.transpose() @ A)


@ti.func
def energy_density_symmetric_gradient(F, mu):
    """mu/2 ||F||^2 - mu log J - 3 mu / 2 in Pa; inf for J <= 0."""
    J = F.determinant()
    psi = ti.math.inf
    if J > 0.0:
        psi = 0.5 * mu * F.norm_sqr() - mu * tm.log(J) - 1.5 * mu
    return psi


@ti.func
def first_piola_symmetric_gradient(F, mu):
    """P = mu (F - F^-T) in Pa (nan for J <= 0)."""
    J = F.determinant()
    inv_j = ti.math.nan
    if J > 0.0:
        inv_j = 1.0 / J
    return mu * (F - cofactor(F) * inv_j)


# ---------------------------------------------------------------------------
# quaternions, (w, x, y, z); q1 * q2 is the rotation R(q1) R(q2)


@ti.func
def quat_mul(a, b):
    va = ti.Vector([a[1], a[2], a[3]])
    vb = ti.Vector([b[1], b[2], b[3]])
    v = a[0] * vb + b[0] * va + va.cross(vb)
    return ti.Vector([a[0] * b[0] - va.dot(vb), v[0], v[1], v[2]])


@ti.func
def quat_to_matrix(q):
    """Rotation matrix of a unit quaternion q = (w, x, y, z)."""
    w, x, y, z = q[0], q[1], q[2], q[3]
    return ti.Matrix(
        [
            [1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y)],
            [2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x)],
            [2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y)],
        ]
    )


@ti.func
def matrix_to_quat(R):
    """Unit quaternion (w, x, y, z) of a rotation matrix R (Shepperd's method: divide by
    the largest of the four candidate components, stable for every rotation)."""
    t = R[0, 0] + R[1, 1] + R[2, 2]
    q = ti.Vector([1.0, 0.0, 0.0, 0.0])
    if t >= R[0, 0] and t >= R[1, 1] and t >= R[2, 2]:
        s = 2.0 * ti.sqrt(ti.max(1.0 + t, 0.0))
        q = ti.Vector([0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s])
    elif R[0, 0] >= R[1, 1] and R[0, 0] >= R[2, 2]:
        s = 2.0 * ti.sqrt(ti.max(1.0 + R[0, 0] - R[1, 1] - R[2, 2], 0.0))
        q = ti.Vector([(R[2, 1] - R[1, 2]) / s, 0.25 * s, (R[0, 1] + R[1, 0]) / s, (R[0, 2] + R[2, 0]) / s])
    elif R[1, 1] >= R[2, 2]:
        s = 2.0 * ti.sqrt(ti.max(1.0 + R[1, 1] - R[0, 0] - R[2, 2], 0.0))
        q = ti.Vector([(R[0, 2] - R[2, 0]) / s, (R[0, 1] + R[1, 0]) / s, 0.25 * s, (R[1, 2] + R[2, 1]) / s])
    else:
        s = 2.0 * ti.sqrt(ti.max(1.0 + R[2, 2] - R[0, 0] - R[1, 1], 0.0))
        q = ti.Vector([(R[1, 0] - R[0, 1]) / s, (R[0, 2] + R[2, 0]) / s, (R[1, 2] + R[2, 1]) / s, 0.25 * s])
    return q.normalized()


@ti.func
def _quat_exp(omega):
    """Unit quaternion of the rotation by the vector omega (angle |omega|, radians)."""
    a = omega.norm()
    q = ti.Vector([1.0, 0.5 * omega[0], 0.5 * omega[1], 0.5 * omega[2]])
    if a > 1e-8:
        s = tm.sin(0.5 * a) / a
        q = ti.Vector([tm.cos(0.5 * a), s * omega[0], s * omega[1], s * omega[2]])
    return q.normalized()


@ti.func
def _axis_gain(b, c):
    """max over theta of c cos(theta) + b sin(theta), minus its value c at theta = 0,
    i.e. sqrt(b^2 + c^2) - c, written without cancellation for c > 0."""
    r = ti.sqrt(b * b + c * c)
    gain = r - c
    if c > 0.0:
        gain = b * b / (r + c)
    return gain


# ---------------------------------------------------------------------------
# rotation extraction


@ti.func
def polar_rotation_quat(F, q_guess, iterations):
    """Polar rotation of F as a unit quaternion (w, x, y, z), warm-started from q_guess.

    Maximises f(R) = tr(R^T F) over SO(3); the maximiser is the rotation of the
    rotation-variant SVD (the polar rotation for det F > 0). Like Müller et al.
    2016 it turns a quaternion by an axis-angle step each iteration (no SVD, no
    re-orthogonalisation, cheap warm starts), but it chooses the step better:

    * with g = sum_i r_i x f_i (r_i, f_i the columns of R, F; the gradient of f
      for R <- Rot(omega) R) and M = tr(T) I - sym(T), T = F R^T (the Hessian of
      -f), f along any unit axis n is exactly
      f(theta) = const + (n.M n) cos(theta) + (n.g) sin(theta),
      so the best angle atan2(n.g, n.M n) and its gain are known in closed form;
    * candidate axes: Newton's M^-1 g (where M is positive definite), the
      gradient g, and R's own axes r_k (there n.M n = S_jj + S_ll, S = R^T F, so
      a negative pair sum yields a half-turn gain even where g = 0, e.g. a warm
      start I for a half-turn F, where Müller's iteration stalls);
    * the axis with the largest gain is taken at its best angle, so f never
      decreases; near the answer that is Newton's step (quadratic convergence);
    * stop when no candidate gains or the angle is < 16 machine epsilons.

    Convergence (f64, measured in tests/unit/test_materials.py): a warm start
    within 0.1 rad reaches round-off in 3 iterations (1e-2 -> 1e-9 -> 1e-15
    rad); arbitrary starts converge in <= 5 iterations for F with det > 0.05
    and singular values over two decades; for 20,000 random F (inverted ones
    included) from random starts, all but 0.15 % converge within 10 iterations
    and all within 60. Accuracy: round-off times the conditioning
    sigma_max / (sigma_j + sigma_k) of R(F), which blows up at F of rank <= 1 and
    at the ARAP kink of inverted F (sigma_2 + sigma_3 -> 0). F = 0 returns
    q_guess (every rotation is a maximiser). The last-resort limitation: a start
    exactly at a non-maximal critical point where none of the candidate axes
    gains would stay there (not observed; the r_k axes catch the half-turns).

    F: 3x3; q_guess: 4-vector (normalised here); iterations: maximum number of
    iterations (a runtime integer; 0 returns the normalised guess).
    """
    q = q_guess.normalized()
    eps = _machine_eps()
    fnorm = F.norm()
    for _ in range(iterations):
        R = quat_to_matrix(q)
        g = ti.Vector([0.0, 0.0, 0.0])
        for i in ti.static(range(3)):
            g += ti.Vector([R[0, i], R[1, i], R[2, i]]).cross(ti.Vector([F[0, i], F[1, i], F[2, i]]))
        T = F @ R.transpose()
        tr = T.trace()
        M = tr * ti.Matrix.identity(float, 3) - 0.5 * (T + T.transpose())
        # Along any unit axis n, f(Rot(theta n) R) = const + c cos(theta) + b sin(theta)
        # with b = n.g, c = n.M n: the best angle atan2(b, c) gains sqrt(b^2 + c^2) - c.
        # Candidates: Newton's axis M^-1 g (M positive definite), the gradient axis,
        # and R's own axes r_k (c = S_jj + S_ll there: a negative pair sum is a
        # half-turn gain even where g = 0). Take the axis that gains most.
        best_n = ti.Vector([0.0, 0.0, 0.0])
        best_gain = 0.0
        gn = g.norm()
        if gn > 0.0:
            best_n = g / gn
            best_gain = _axis_gain(gn, best_n.dot(M @ best_n))
        m2 = M[0, 0] * M[1, 1] - M[0, 1] * M[1, 0]
        floor = 1e-8 * fnorm
        if gn > 0.0 and M[0, 0] > floor and m2 > floor * floor and M.determinant() > floor * floor * floor:
            n = (M.inverse() @ g).normalized()
            gain = _axis_gain(n.dot(g), n.dot(M @ n))
            if gain >= best_gain:
                best_gain = gain
                best_n = n
        for k in ti.static(range(3)):
            n = ti.Vector([R[0, k], R[1, k], R[2, k]])
            gain = _axis_gain(n.dot(g), n.dot(M @ n))
            if gain > best_gain:
                best_gain = gain
                best_n = n
        theta = tm.atan2(best_n.dot(g), best_n.dot(M @ best_n))
        if best_gain <= 0.0 or ti.abs(theta) < 16.0 * eps:
            break  # the maximum (a critical point with no gain along any candidate) or F = 0
        q = quat_mul(_quat_exp(theta * best_n), q).normalized()
    return q


@ti.func
def polar_rotation(F, R_guess, iterations):
    """Polar rotation of F (3x3, det = +1), warm-started from the rotation R_guess;
    see :func:`polar_rotation_quat` (stores and returns a matrix instead)."""
    return quat_to_matrix(polar_rotation_quat(F, matrix_to_quat(R_guess), iterations))


@ti.func
def is_polar_maximum(F, R):
    """1 if the rotation R passes the second-order test for the maximiser of tr(R^T F)
    over SO(3), else 0: M = tr(S) I - sym(S) with S = R^T F must be positive
    semidefinite (its eigenvalues are the pair sums sigma_j + sigma_k >= 0 at the
    maximiser, rotation-variant SVD). At the other critical points, R a half-turn away
    from the maximiser about an axis n, n^T M n = -(the two pair sums across n) < 0;
    for F a rotation, n^T M n = 2 cos(theta) for R theta away about n, so every R more
    than a quarter-turn off fails (where Newton's step is not an ascent). Tested through
    all principal minors (Sylvester), with a round-off floor of 1e-10 ||F||; F = 0 and
    the maximiser at the inverted-F kink (a zero pair sum) pass. Numpy twin:
    :func:`tisim.materials.polar.polar_optimality`."""
    S = R.transpose() @ F
    M = S.trace() * ti.Matrix.identity(float, 3) - 0.5 * (S + S.transpose())
    t = 1e-10 * F.norm()
    ok = 1
    if M[0, 0] < -t or M[1, 1] < -t or M[2, 2] < -t:
        ok = 0
    t2 = t * (t + M.norm())
    if (
        M[0, 0] * M[1, 1] - M[0, 1] * M[1, 0] < -t2
        or M[0, 0] * M[2, 2] - M[0, 2] * M[2, 0] < -t2
        or M[1, 1] * M[2, 2] - M[1, 2] * M[2, 1] < -t2
    ):
        ok = 0
    if M.determinant() < -t2 * (t + M.norm()):
        ok = 0
    return ok


@ti.func
def polar_rotation_guard(F, q):
    """Half-turn guard for a warm-started rotation extraction: the unit quaternion q
    (w, x, y, z) unchanged when its rotation passes :func:`is_polar_maximum`, else the
    exact polar rotation of F (``polar_rotation_svd``, polished to round-off by two
    iterations of :func:`polar_rotation_quat`).

    Iterations that follow the gradient of tr(R^T F) (Newton, or Müller et al.'s damped
    turn) stall at a start a half-turn away from the answer, where the gradient
    vanishes (an identity start for F = R_x(pi) stays at I: off by 2.0 in every
    diagonal entry), and crawl away from one near it. Call this on their result: it
    costs one 3x3 test when the result is fine and an SVD when it is not (rare with
    warm starts from the previous iteration or frame)."""
    out = q
    if is_polar_maximum(F, quat_to_matrix(q)) == 0:
        # (SPIR-V in f64: the SVD runs in f32, and the polish, with tisim.ti_math's f64
        # atan2 / sin / cos, takes it to f64 round-off)
        out = polar_rotation_quat(F, matrix_to_quat(polar_rotation_svd(F)), 2)
    return out


@ti.func
def _svd(F):
    """ti.svd(F) in the default precision, or, where f64 cannot compile (SPIR-V), in f32
    polished to f64 round-off by :func:`svd_polish`."""
    if ti.static(tm.soft_f64()):  # SPIR-V in f64: Taichi's SVD needs a 64-bit atan2
        U, _S, V = ti.svd(F.cast(ti.f32), ti.f32)
        return svd_polish(F, U.cast(float), V.cast(float))
    else:
        return ti.svd(F)


@ti.func
def svd_polish(F, U0, V0):
    """F = U diag(sigma) V^T to the working precision from a nearly right V0 (an f32
    SVD's): one-sided Jacobi (Hestenes) on the columns of B = F V, three sweeps of
    plane rotations that make them orthogonal (quadratic convergence: 1e-7 -> 1e-14 ->
    round-off), with only sqrt and division (SPIR-V has no 64-bit trigonometry). Then
    sigma_i = |b_i| >= 0 and u_i = b_i / sigma_i; a column with sigma_i below 1e-12 |F|
    (a flat or collapsed element) is completed by the cross product of the other two, or
    taken from U0 when two are that small. Returns (U, diag(sigma), V) like ti.svd, not
    sorted, signs left to the caller (:func:`svd_rotation_variant`)."""
    V = V0
    # re-orthonormalise V0's f32 columns (Gram-Schmidt, then the cross product)
    v0 = ti.Vector([V[0, 0], V[1, 0], V[2, 0]]).normalized()
    v1 = ti.Vector([V[0, 1], V[1, 1], V[2, 1]])
    v1 = (v1 - v1.dot(v0) * v0).normalized()
    v2 = v0.cross(v1)
    if v2.dot(ti.Vector([V[0, 2], V[1, 2], V[2, 2]])) < 0.0:
        v2 = -v2
    V = ti.Matrix.cols([v0, v1, v2])
    B = F @ V
    fn = F.norm()
    for _sweep in ti.static(range(3)):
        for p, q in ti.static(((0, 1), (0, 2), (1, 2))):
            bp = ti.Vector([B[0, p], B[1, p], B[2, p]])
            bq = ti.Vector([B[0, q], B[1, q], B[2, q]])
            a = bp.dot(bp)
            b = bq.dot(bq)
            g = bp.dot(bq)
            if ti.abs(g) > 1e-300 and ti.abs(g) > 1e-17 * ti.sqrt(a * b):
                zeta = (b - a) / (2.0 * g)
                t = 1.0 / (ti.abs(zeta) + ti.sqrt(1.0 + zeta * zeta))
                if zeta < 0.0:
                    t = -t
                c = 1.0 / ti.sqrt(1.0 + t * t)
                s = c * t
                for r in ti.static(range(3)):
                    xp, xq = B[r, p], B[r, q]
                    B[r, p] = c * xp - s * xq
                    B[r, q] = s * xp + c * xq
                    yp, yq = V[r, p], V[r, q]
                    V[r, p] = c * yp - s * yq
                    V[r, q] = s * yp + c * yq
    sig = ti.Vector([0.0, 0.0, 0.0])
    U = U0
    small = 0
    for i in ti.static(range(3)):
        bi = ti.Vector([B[0, i], B[1, i], B[2, i]])
        sig[i] = bi.norm()
        if sig[i] > 1e-12 * fn:
            for r in ti.static(range(3)):
                U[r, i] = bi[r] / sig[i]
        else:
            small += 1
    if small == 1:
        for i in ti.static(range(3)):
            if sig[i] <= 1e-12 * fn:
                j, k = (i + 1) % 3, (i + 2) % 3
                uj = ti.Vector([U[0, j], U[1, j], U[2, j]])
                uk = ti.Vector([U[0, k], U[1, k], U[2, k]])
                ui = uj.cross(uk)
                for r in ti.static(range(3)):
                    U[r, i] = ui[r]
    S = ti.Matrix([[sig[0], 0.0, 0.0], [0.0, sig[1], 0.0], [0.0, 0.0, sig[2]]])
    return U, S, V


@ti.func
def svd_rotation_variant(F):
    """Rotation-variant SVD through ti.svd: (U, sigma (3-vector), V) with F = U diag(sigma) V^T,
    det U = det V = +1 and the sign of det F carried by sigma[2]."""
    U, S, V = _svd(F)
    sig = ti.Vector([S[0, 0], S[1, 1], S[2, 2]])
    # ti.svd does not sort; sort descending by magnitude so the sign goes on the smallest
    for _ in ti.static(range(2)):
        for i in ti.static(range(2)):
            if ti.abs(sig[i]) < ti.abs(sig[i + 1]):
                sig[i], sig[i + 1] = sig[i + 1], sig[i]
                for r in ti.static(range(3)):
                    U[r, i], U[r, i + 1] = U[r, i + 1], U[r, i]
                    V[r, i], V[r, i + 1] = V[r, i + 1], V[r, i]
    # make every singular value non-negative except possibly the last
    for i in ti.static(range(2)):
        if sig[i] < 0.0:
            sig[i] = -sig[i]
            for r in ti.static(range(3)):
                U[r, i] = -U[r, i]
    if U.determinant() < 0.0:
        for r in ti.static(range(3)):
            U[r, 2] = -U[r, 2]
        sig[2] = -sig[2]
    if V.determinant() < 0.0:
        for r in ti.static(range(3)):
            V[r, 2] = -V[r, 2]
        sig[2] = -sig[2]
    return U, sig, V


@ti.func
def polar_rotation_svd(F):
    """Polar rotation R = U V^T of F via ti.svd with the determinant fix (det R = +1)."""
    U, _sig, V = svd_rotation_variant(F)
    return U @ V.transpose()
