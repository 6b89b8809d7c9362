"""The device contact update's building blocks (:mod:`tisim.contact.ncp.device_ncp` chains
them into kernels): the constants shared with the numpy path, the slots of the scalar
array, the NCP function and its generalized derivative, the proximal friction rows, the
exact signed distances to the analytic colliders and the collider table the kernels read,
and the Taichi functions of one Newton step - kinematics and merit, Newton rows,
Conjugate Residual stages, line-search trial, commit and force scatter.

Loops run serially or in parallel as ``_SERIAL`` says when a kernel using them
compiles (:func:`set_serial_loops`, called by whoever makes the kernels).

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import math

import numpy as np
import taichi as ti

# The same constants as the numpy path (pd_contact.py)
OMEGA_TOL = 1e-10
NEWTON_TOL = 1e-12
LINE_SEARCH_STEPS = 4
_FB_KINK = 1.0 - 1.0 / math.sqrt(2.0)

# reductions: each block of this many entries is summed by one thread, the blocks serially
_BLOCK = 64

# slots of the f64 scalar array ``sc``
_MERIT = 0
_DONE = 1
_ALPHA = 2
_RS = 3
_ITS = 4
_BETA = 5
_NCP_RES = 6
_MAX_PEN = 7
_TOUCHING = 8
_CR_TOTAL = 9
_HALVINGS = 10
# the staged update's decisions, taken on the device (DeviceNCP.update on GPU backends):
# Newton still running (1) or converged (0), the merit the step started from, and the
# line-search trial taken
_GO = 11
_F0 = 12
_CHOSEN = 13
_N_SCALARS = 16


def _serial_loops() -> bool:
    """Whether the kernels' loops run on one thread (read when they compile).

    On the CPU backend, every parallel loop is a hand-over to Taichi's thread pool and a
    join, which costs more than the work for the problem sizes of a contact solve
    (k <= a few thousand); serial loops made the stick-slip frame 3x faster there. On
    GPU backends the loops are parallel and each stage is a launch. (Serial on Mesa's
    lavapipe was 10x faster for the coarse squeeze-ball but wrong from its 7th frame:
    lavapipe silently stops a shader invocation after 65535 loop iterations, which one
    thread doing the whole update passes at k ~ 40 contacts.) TISIM_CONTACT_SERIAL=0 or
    1 overrides the choice (for measurements)."""
    import os

    from tisim import backend

    forced = os.environ.get("TISIM_CONTACT_SERIAL")
    if forced in ("0", "1"):
        return forced == "1"
    return backend.current().arch == "cpu"


# set by set_serial_loops() when the first storage or gap test is made (before any kernel
# compiles)
_SERIAL = False


def set_serial_loops() -> bool:
    """Fix ``_SERIAL`` from :func:`_serial_loops` for the functions here (call it before a
    kernel using them compiles) and return it."""
    global _SERIAL
    _SERIAL = _serial_loops()
    return _SERIAL


NCP_CODES = {"fischer-burmeister": 0, "min-map": 1}
_KIND = {"plane": 0, "sphere": 1, "box": 2, "cylinder": 3}
# collider parameter row: kind, center (3), R (9, row-major), normal/axis in world (3),
# radius, length (or -1 when unbounded), half extents (3)
_COLLIDER_WIDTH = 21
# columns of DeviceNCP.load's packed per-contact array
_PACKED = 27


# ---------------------------------------------------------------------------------------
# functions


@ti.func
def _ncp(mode, a, b):
    """(phi, phi_a, phi_b) of Fischer-Burmeister (mode 0) or min-map (1), as ncp.py."""
    phi = a * 0.0
    da = a * 0.0
    db = a * 0.0
    if mode == 0:
        rho = ti.sqrt(a * a + b * b)
        s = a + b
        if s > 0:
            phi = 2.0 * a * b / (s + rho)
        else:
            phi = s - rho
        if rho == 0.0:
            da = _FB_KINK
            db = _FB_KINK
        else:  # 1 - a / rho and 1 - b / rho without cancellation (ncp.fischer_burmeister)
            da = 1.0 - a / rho
            db = 1.0 - b / rho
            if a > 0:
                da = (b / rho) * (b / (rho + a))
            if b > 0:
                db = (a / rho) * (a / (rho + b))
    else:
        if a <= b:
            phi = a
            da = 1.0
        else:
            phi = b
            db = 1.0
    return phi, da, db


@ti.func
def _friction_residual(l1, l2, u1, u2, rt, radius):
    """Proximal Coulomb residual lambda_t - Proj_{|x| <= radius}(lambda_t - u / r_t)."""
    y1 = l1 - u1 / rt
    y2 = l2 - u2 / rt
    ny = ti.sqrt(y1 * y1 + y2 * y2)
    p1 = y1
    p2 = y2
    if not (ny <= radius and radius > 0):
        sc = radius * 0.0
        if ny > 0:
            sc = radius / ny
        p1 = y1 * sc
        p2 = y2 * sc
    return l1 - p1, l2 - p2


@ti.func
def _combine2(q0, q1):
    o0 = ti.max(q0, 0.0)
    o1 = ti.max(q1, 0.0)
    out = ti.sqrt(o0 * o0 + o1 * o1)
    if out == 0:
        out = ti.max(q0, q1)
    return out


@ti.func
def _signed_distance(cp: ti.template(), c, px, py, pz):
    """Signed distance of point p to collider c (the formulas of Collider.signed_distance)."""
    kind = ti.cast(cp[c, 0], ti.i32)
    dx = px - cp[c, 1]
    dy = py - cp[c, 2]
    dz = pz - cp[c, 3]
    ax = cp[c, 13]
    ay = cp[c, 14]
    az = cp[c, 15]
    out = dx * 0.0
    if kind == 0:
        out = dx * ax + dy * ay + dz * az
    elif kind == 1:
        out = ti.sqrt(dx * dx + dy * dy + dz * dz) - cp[c, 16]
    elif kind == 3:
        s = dx * ax + dy * ay + dz * az
        rx = dx - s * ax
        ry = dy - s * ay
        rz = dz - s * az
        side = ti.sqrt(rx * rx + ry * ry + rz * rz) - cp[c, 16]
        out = side
        if cp[c, 17] >= 0:
            out = _combine2(side, ti.abs(s) - 0.5 * cp[c, 17])
    else:
        # local = (x - c) @ R, q = |local| - half extents, combined as slabs
        q0 = ti.abs(dx * cp[c, 4] + dy * cp[c, 7] + dz * cp[c, 10]) - cp[c, 18]
        q1 = ti.abs(dx * cp[c, 5] + dy * cp[c, 8] + dz * cp[c, 11]) - cp[c, 19]
        q2 = ti.abs(dx * cp[c, 6] + dy * cp[c, 9] + dz * cp[c, 12]) - cp[c, 20]
        o0 = ti.max(q0, 0.0)
        o1 = ti.max(q1, 0.0)
        o2 = ti.max(q2, 0.0)
        out = ti.sqrt(o0 * o0 + o1 * o1 + o2 * o2)
        if out == 0:
            out = ti.max(q0, ti.max(q1, q2))
    return out


@ti.func
def _frame(frames: ti.template(), epar: ti.template(), rotate, i):
    """Contact i's frame (rows n, t1, t2) as an f64 matrix; with ``rotate`` != 0 the
    tangent rows are (e_par, e_perp) expressed in (t1, t2), the basis of the Newton rows."""
    F = ti.Matrix.zero(ti.f64, 3, 3)
    for a, b in ti.static(ti.ndrange(3, 3)):
        F[a, b] = ti.cast(frames[i, a, b], ti.f64)
    if rotate != 0:
        e0 = ti.cast(epar[i, 0], ti.f64)
        e1 = ti.cast(epar[i, 1], ti.f64)
        for b in ti.static(range(3)):
            t1 = F[1, b]
            t2 = F[2, b]
            F[1, b] = e0 * t1 + e1 * t2
            F[2, b] = -e1 * t1 + e0 * t2
    return F


@ti.func
def _kinematics(
    exact,
    k: ti.i32,
    inv_h,
    q: ti.template(),
    vert: ti.template(),
    wgt: ti.template(),
    frames: ti.template(),
    gap0: ti.template(),
    point0: ti.template(),
    collider: ti.template(),
    cparams: ti.template(),
    surf_vel: ti.template(),
    d: ti.template(),
    u: ti.template(),
):
    ti.loop_config(serialize=_SERIAL)
    for i in range(k):
        p = ti.Vector([0.0, 0.0, 0.0], ti.f64)
        for j in ti.static(range(4)):
            v = vert[i, j]
            w = ti.cast(wgt[i, j], ti.f64)
            p += w * ti.Vector([q[v, 0], q[v, 1], q[v, 2]], ti.f64)
        dp = p - ti.Vector([point0[i, 0], point0[i, 1], point0[i, 2]], ti.f64)
        n = ti.Vector([frames[i, 0, 0], frames[i, 0, 1], frames[i, 0, 2]], ti.f64)
        gap = ti.cast(gap0[i], ti.f64) + n.dot(dp)
        c = collider[i]
        if exact != 0 and c >= 0:
            gap = ti.cast(_signed_distance(cparams, c, p[0], p[1], p[2]), ti.f64)
        d[i] = ti.cast(gap, d.dtype)
        rel = dp * inv_h - ti.Vector([surf_vel[i, 0], surf_vel[i, 1], surf_vel[i, 2]], ti.f64)
        for a in ti.static(range(2)):
            t = ti.Vector([frames[i, a + 1, 0], frames[i, a + 1, 1], frames[i, a + 1, 2]], ti.f64)
            u[i, a] = ti.cast(t.dot(rel), u.dtype)


@ti.func
def _merit_term(mode, h, d, u1, u2, ln, l1, l2, rn, rt, mu):
    """One contact's share of the merit: phi(d, r_n lambda_n)^2 + |r_t h (lambda_t -
    Proj(lambda_t - u / r_t))|^2, summed in f64."""
    phi, _da, _db = _ncp(mode, d, rn * ln)
    radius = mu * ti.max(ln, 0.0)
    f1, f2 = _friction_residual(l1, l2, u1, u2, rt, radius)
    s = rt * h
    f1 *= s
    f2 *= s
    return ti.cast(phi * phi, ti.f64) + ti.cast(f1 * f1 + f2 * f2, ti.f64)


@ti.func
def _merit(
    mode,
    k: ti.i32,
    h,
    lam: ti.template(),
    d: ti.template(),
    u: ti.template(),
    r_n: ti.template(),
    r_t: ti.template(),
    mu: ti.template(),
    part: ti.template(),
    sc: ti.template(),
):
    """sc[_MERIT] = sum phi^2 + |r_t h (lambda_t - Proj(lambda_t - u / r_t))|^2, as
    PDContact.merit."""
    nb = (k + _BLOCK - 1) // _BLOCK
    ti.loop_config(serialize=_SERIAL)
    for b in range(nb):
        acc = ti.f64(0.0)
        for i in range(b * _BLOCK, ti.min((b + 1) * _BLOCK, k)):
            acc += _merit_term(mode, h, d[i], u[i, 0], u[i, 1], lam[i, 0], lam[i, 1], lam[i, 2], r_n[i], r_t[i], mu[i])
        part[b] = acc
    ti.loop_config(serialize=_SERIAL)
    for _ in range(1):
        if k > 0:  # k = 0: a stage the device's gate closed (DeviceNCP.update) writes nothing
            tot = ti.f64(0.0)
            for b in range(nb):
                tot += part[b]
            sc[_MERIT] = tot


@ti.func
def _newton_rows(
    mode,
    lagged,
    k: ti.i32,
    h,
    lam: ti.template(),
    d: ti.template(),
    u: ti.template(),
    r_n: ti.template(),
    r_t: ti.template(),
    mu: ti.template(),
    res: ti.template(),
    om: ti.template(),
    E: ti.template(),
    act: ti.template(),
    epar: ti.template(),
    dl: ti.template(),
):
    """Residual rows, indicators omega and E of the Newton step (PDContact._newton_step),
    the tangent basis (e_par, e_perp) and the direct solution of the inactive rows."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(k):
        phi, pa, pb = _ncp(mode, d[i], r_n[i] * lam[i, 0])
        rr = ti.Vector([phi, 0.0, 0.0])
        oo = ti.Vector([pa, 0.0, 0.0])
        ee = ti.Vector([r_n[i] * pb, 0.0, 0.0])
        radius = mu[i] * ti.max(lam[i, 0], 0.0)
        rt = r_t[i]
        y1 = lam[i, 1] - u[i, 0] / rt
        y2 = lam[i, 2] - u[i, 1] / rt
        ny = ti.sqrt(y1 * y1 + y2 * y2)
        e0 = 1.0
        e1 = 0.0
        if ny > 0:
            e0 = y1 / ny
            e1 = y2 / ny
        epar[i, 0] = e0
        epar[i, 1] = e1
        lt0 = e0 * lam[i, 1] + e1 * lam[i, 2]
        lt1 = -e1 * lam[i, 1] + e0 * lam[i, 2]
        ut0 = e0 * u[i, 0] + e1 * u[i, 1]
        ut1 = -e1 * u[i, 0] + e0 * u[i, 1]
        if ny <= radius and radius > 0:  # stick: drive h u to zero
            rr[1] = h * ut0
            rr[2] = h * ut1
            oo[1] = 1.0
            oo[2] = 1.0
        else:
            rr[1] = lt0 - radius
            ee[1] = 1.0
            if radius > 0:
                if lagged != 0:
                    rr[2] = lt1
                    ee[2] = 1.0
                else:
                    rr[2] = ny * rt * h / radius * lt1
                    oo[2] = 1.0
                    ee[2] = rt * h * (ny / radius - 1.0)
            else:
                rr[2] = lt1
                ee[2] = 1.0
        for a in ti.static(range(3)):
            row = 3 * i + a
            res[row] = rr[a]
            om[row] = oo[a]
            E[row] = ee[a]
            if oo[a] > OMEGA_TOL:
                act[row] = 1
                dl[row] = 0.0
            else:
                act[row] = 0
                dl[row] = -rr[a] / ee[a]


@ti.func
def _row_product(i, k, W: ti.template(), w0: ti.template(), w1: ti.template(), w2: ti.template(), off):
    """Row i of W_hat (k x k) times the world-frame vectors w0, w1, w2 (entries off to
    off + k), as three f64 sums in the order of j."""
    y0 = ti.f64(0.0)
    y1 = ti.f64(0.0)
    y2 = ti.f64(0.0)
    base = i * k
    for j in range(k):
        w = ti.cast(W[base + j], ti.f64)
        y0 += w * w0[off + j]
        y1 += w * w1[off + j]
        y2 += w * w2[off + j]
    return ti.Vector([y0, y1, y2], ti.f64)


@ti.func
def _apply(
    op,
    k,
    scale,
    W: ti.template(),
    frames: ti.template(),
    epar: ti.template(),
    x: ti.template(),
    om: ti.template(),
    E: ti.template(),
    act: ti.template(),
    res: ti.template(),
    world0: ti.template(),
    world1: ti.template(),
    world2: ti.template(),
    out: ti.template(),
    sc: ti.template(),
):
    """out = an operator built on C = scale F (W_hat kron I_3) F^T applied to x (3 k,).

    op 0: the Newton matrix om C' (om x) + E om x on the active rows (C' in the rotated
    frames; zero on inactive rows); skipped once the CR breakdown flag is set.
    op 1: the CR right-hand side -res - om C'(x) on the active rows (x: the direct
    solution of the inactive rows).
    op 2: C x in the contact frames (the line search's response).
    The world-frame vectors are three 1-D fields and the product keeps three scalar
    sums: the inner loop then runs 1.5x faster on the CPU backend than with a (k, 3)
    field and a vector sum (36 products at k = 400: 2.3 -> 1.5 ms), the same sums in
    the same order.
    """
    rotate = 1 if op != 2 else 0
    ti.loop_config(serialize=_SERIAL)
    for j in range(k):
        if op != 0 or sc[_DONE] == 0.0:
            xin = ti.Vector([0.0, 0.0, 0.0], ti.f64)
            for a in ti.static(range(3)):
                row = 3 * j + a
                if op != 0:
                    xin[a] = ti.cast(x[row], ti.f64)
                elif act[row] != 0:
                    xin[a] = ti.cast(om[row] * x[row], ti.f64)
            wv = _frame(frames, epar, rotate, j).transpose() @ xin
            world0[j] = wv[0]
            world1[j] = wv[1]
            world2[j] = wv[2]
    ti.loop_config(serialize=_SERIAL)
    for i in range(k):
        if op != 0 or sc[_DONE] == 0.0:
            y = _row_product(i, k, W, world0, world1, world2, 0)
            z = _frame(frames, epar, rotate, i) @ (scale * y)
            for a in ti.static(range(3)):
                row = 3 * i + a
                v = z[a]
                if op != 2:
                    v = 0.0
                    if act[row] != 0:
                        if op == 0:
                            v = om[row] * z[a] + ti.cast(E[row] * om[row] * x[row], ti.f64)
                        else:
                            v = ti.cast(-res[row], ti.f64) - om[row] * z[a]
                out[row] = ti.cast(v, out.dtype)


@ti.func
def _cr_init(
    m: ti.i32,
    c: ti.template(),
    x: ti.template(),
    r: ti.template(),
    p: ti.template(),
    part: ti.template(),
    sc: ti.template(),
):
    """x = 0, r = p = c; the done flag when c = 0 (krylov.conjugate_residual)."""
    nb = (m + _BLOCK - 1) // _BLOCK
    ti.loop_config(serialize=_SERIAL)
    for i in range(m):
        x[i] = 0.0
        r[i] = c[i]
        p[i] = c[i]
    ti.loop_config(serialize=_SERIAL)
    for b in range(nb):
        acc = ti.f64(0.0)
        for i in range(b * _BLOCK, ti.min((b + 1) * _BLOCK, m)):
            ci = ti.cast(c[i], ti.f64)
            acc += ci * ci
        part[b] = acc
    ti.loop_config(serialize=_SERIAL)
    for _ in range(1):
        if m > 0:
            tot = ti.f64(0.0)
            for b in range(nb):
                tot += part[b]
            sc[_DONE] = 1.0 if tot == 0.0 else 0.0
            sc[_ITS] = 0.0


@ti.func
def _cr_start(
    m: ti.i32,
    r: ti.template(),
    s: ti.template(),
    t: ti.template(),
    part: ti.template(),
    sc: ti.template(),
):
    """t = s = K r, rs = r^T s."""
    nb = (m + _BLOCK - 1) // _BLOCK
    ti.loop_config(serialize=_SERIAL)
    for i in range(m):
        t[i] = s[i]
    ti.loop_config(serialize=_SERIAL)
    for b in range(nb):
        acc = ti.f64(0.0)
        for i in range(b * _BLOCK, ti.min((b + 1) * _BLOCK, m)):
            acc += ti.cast(r[i], ti.f64) * ti.cast(s[i], ti.f64)
        part[b] = acc
    ti.loop_config(serialize=_SERIAL)
    for _ in range(1):
        if m > 0:
            tot = ti.f64(0.0)
            for b in range(nb):
                tot += part[b]
            sc[_RS] = tot


@ti.func
def _cr_step(
    it: ti.i32,
    m: ti.i32,
    x: ti.template(),
    r: ti.template(),
    p: ti.template(),
    t: ti.template(),
    part: ti.template(),
    sc: ti.template(),
):
    """alpha = rs / t^T t; x += alpha p; r -= alpha t (or breakdown); done when r = 0."""
    nb = (m + _BLOCK - 1) // _BLOCK
    ti.loop_config(serialize=_SERIAL)
    for b in range(nb):
        acc = ti.f64(0.0)
        for i in range(b * _BLOCK, ti.min((b + 1) * _BLOCK, m)):
            ti_ = ti.cast(t[i], ti.f64)
            acc += ti_ * ti_
        part[b] = acc
    ti.loop_config(serialize=_SERIAL)
    for _ in range(1):
        tt = ti.f64(0.0)
        for b in range(nb):
            tt += part[b]
        alpha = ti.f64(0.0)
        if m > 0 and sc[_DONE] == 0.0:
            if tt <= 0.0 or sc[_RS] == 0.0:
                sc[_DONE] = 1.0  # breakdown
            else:
                alpha = sc[_RS] / tt
                sc[_ITS] = ti.cast(it + 1, ti.f64)
        sc[_ALPHA] = alpha
    ti.loop_config(serialize=_SERIAL)
    for i in range(m):
        al = sc[_ALPHA]
        if al != 0.0:
            x[i] = ti.cast(x[i] + al * p[i], x.dtype)
            r[i] = ti.cast(r[i] - al * t[i], r.dtype)
    ti.loop_config(serialize=_SERIAL)
    for b in range(nb):
        acc = ti.f64(0.0)
        for i in range(b * _BLOCK, ti.min((b + 1) * _BLOCK, m)):
            ri = ti.cast(r[i], ti.f64)
            acc += ri * ri
        part[b] = acc
    ti.loop_config(serialize=_SERIAL)
    for _ in range(1):
        rr = ti.f64(0.0)
        for b in range(nb):
            rr += part[b]
        if m > 0 and sc[_DONE] == 0.0 and rr == 0.0:
            sc[_DONE] = 1.0  # converged exactly


@ti.func
def _cr_direction(
    m: ti.i32,
    r: ti.template(),
    s: ti.template(),
    p: ti.template(),
    t: ti.template(),
    part: ti.template(),
    sc: ti.template(),
):
    """rs' = r^T s (s = K r); p = r + beta p; t = s + beta t with beta = rs' / rs."""
    nb = (m + _BLOCK - 1) // _BLOCK
    ti.loop_config(serialize=_SERIAL)
    for b in range(nb):
        acc = ti.f64(0.0)
        for i in range(b * _BLOCK, ti.min((b + 1) * _BLOCK, m)):
            acc += ti.cast(r[i], ti.f64) * ti.cast(s[i], ti.f64)
        part[b] = acc
    ti.loop_config(serialize=_SERIAL)
    for _ in range(1):
        if m > 0 and sc[_DONE] == 0.0:
            rs_new = ti.f64(0.0)
            for b in range(nb):
                rs_new += part[b]
            sc[_BETA] = rs_new / sc[_RS]
            sc[_RS] = rs_new
    ti.loop_config(serialize=_SERIAL)
    for i in range(m):
        if sc[_DONE] == 0.0:
            be = sc[_BETA]
            p[i] = ti.cast(r[i] + be * p[i], p.dtype)
            t[i] = ti.cast(s[i] + be * t[i], t.dtype)


@ti.func
def _newton_finish(
    k: ti.i32,
    x: ti.template(),
    om: ti.template(),
    act: ti.template(),
    dl: ti.template(),
    epar: ti.template(),
    dlam: ti.template(),
):
    """dlam = om x on the active rows, the direct solution on the others, rotated from
    (e_par, e_perp) back to (t1, t2)."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(k):
        v = ti.Vector([0.0, 0.0, 0.0])
        for a in ti.static(range(3)):
            row = 3 * i + a
            if act[row] != 0:
                v[a] = om[row] * x[row]
            else:
                v[a] = dl[row]
        e0 = epar[i, 0]
        e1 = epar[i, 1]
        dlam[i, 0] = v[0]
        dlam[i, 1] = e0 * v[1] - e1 * v[2]
        dlam[i, 2] = e1 * v[1] + e0 * v[2]


@ti.func
def _project_trial(i, alpha, lam: ti.template(), dlam: ti.template(), mu: ti.template()):
    """Contact i's Proj_cone(lambda + alpha dlam)."""
    ln = ti.max(lam[i, 0] + alpha * dlam[i, 0], 0.0)
    l1 = lam[i, 1] + alpha * dlam[i, 1]
    l2 = lam[i, 2] + alpha * dlam[i, 2]
    radius = mu[i] * ln
    nt = ti.sqrt(l1 * l1 + l2 * l2)
    if nt > radius:
        s = 1.0
        if nt > 0:
            s = radius / nt
        l1 *= s
        l2 *= s
    return ln, l1, l2


@ti.func
def _trial(
    k: ti.i32,
    alpha,
    lam: ti.template(),
    dlam: ti.template(),
    mu: ti.template(),
    new: ti.template(),
    step: ti.template(),
):
    """new = Proj_cone(lambda + alpha dlam) (ncp.project_cone); step = new - lambda."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(k):
        ln, l1, l2 = _project_trial(i, alpha, lam, dlam, mu)
        new[i, 0] = ln
        new[i, 1] = l1
        new[i, 2] = l2
        step[3 * i] = ln - lam[i, 0]
        step[3 * i + 1] = l1 - lam[i, 1]
        step[3 * i + 2] = l2 - lam[i, 2]


@ti.func
def _predict(
    k: ti.i32,
    inv_h,
    d: ti.template(),
    u: ti.template(),
    resp: ti.template(),
    d1: ti.template(),
    u1: ti.template(),
):
    """Gaps and slips after the forces change by step: d + C_n step, u + C_t step / h."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(k):
        d1[i] = d[i] + resp[3 * i]
        u1[i, 0] = u[i, 0] + resp[3 * i + 1] * inv_h
        u1[i, 1] = u[i, 1] + resp[3 * i + 2] * inv_h


@ti.func
def _copy_state(
    k: ti.i32,
    new: ti.template(),
    d1: ti.template(),
    u1: ti.template(),
    lam: ti.template(),
    d: ti.template(),
    u: ti.template(),
):
    ti.loop_config(serialize=_SERIAL)
    for i in range(k):
        for a in ti.static(range(3)):
            lam[i, a] = new[i, a]
        d[i] = d1[i]
        u[i, 0] = u1[i, 0]
        u[i, 1] = u1[i, 1]


@ti.func
def _record(
    k: ti.i32,
    inv_h,
    lam: ti.template(),
    d: ti.template(),
    u: ti.template(),
    cjj: ti.template(),
    mu: ti.template(),
    sc: ti.template(),
):
    """Natural-map NCP residual with the Delassus diagonal (m), deepest penetration (m)
    and touching count (PDContact._record); one serial pass, once per update."""
    ti.loop_config(serialize=_SERIAL)
    for _ in range(1):
        worst = ti.f64(0.0)
        dmin = ti.f64(0.0)
        touching = 0
        for i in range(k):
            c = cjj[i]
            rn = ti.abs(ti.min(d[i], c * lam[i, 0]))
            f1, f2 = _friction_residual(lam[i, 1], lam[i, 2], u[i, 0], u[i, 1], c * inv_h, mu[i] * lam[i, 0])
            rt = c * ti.sqrt(f1 * f1 + f2 * f2)
            worst = ti.max(worst, ti.cast(ti.max(rn, rt), ti.f64))
            if i == 0:
                dmin = ti.cast(d[i], ti.f64)
            dmin = ti.min(dmin, ti.cast(d[i], ti.f64))
            if lam[i, 0] > 0:
                touching += 1
        sc[_NCP_RES] = worst
        sc[_MAX_PEN] = ti.max(0.0, -dmin)
        sc[_TOUCHING] = ti.cast(touching, ti.f64)


@ti.func
def _scatter(
    nv: ti.i32,
    ptr: ti.template(),
    vtx: ti.template(),
    entry: ti.template(),
    lam: ti.template(),
    frames: ti.template(),
    wgt: ti.template(),
    force: ti.template(),
):
    """force[v] = sum over the contact slots (c, j) at vertex v of w_cj F_c^T lambda_c
    (a gather over a vertex -> slots list, in the order of ContactSet.scatter_forces)."""
    ti.loop_config(serialize=_SERIAL)
    for t in range(nv):
        f = ti.Vector([0.0, 0.0, 0.0])
        for e in range(ptr[t], ptr[t + 1]):
            c = entry[e] // 4
            j = entry[e] % 4
            w = ti.Vector([0.0, 0.0, 0.0])
            for a in ti.static(range(3)):
                w += lam[c, a] * ti.Vector([frames[c, a, 0], frames[c, a, 1], frames[c, a, 2]])
            f += wgt[c, j] * w
        v = vtx[t]
        for a in ti.static(range(3)):
            force[v, a] = f[a]


@ti.func
def _clear_rows(nv: ti.i32, vtx: ti.template(), force: ti.template()):
    ti.loop_config(serialize=_SERIAL)
    for t in range(nv):
        for a in ti.static(range(3)):
            force[vtx[t], a] = 0.0


@ti.kernel
def _load_matrix(k: ti.i32, src: ti.types.ndarray(ndim=2), W: ti.template()):
    ti.loop_config(serialize=_SERIAL)
    for i, j in ti.ndrange(k, k):
        W[i * k + j] = src[i, j]


def collider_parameters(colliders, t: float) -> np.ndarray:
    """(c, 21) the pose at time t (s) and shape of each collider, as the kernels read them.

    Mesh colliders get kind -1 (PDContact never creates contacts with them: their
    signed distance raises on the host)."""
    out = np.zeros((max(len(colliders), 1), _COLLIDER_WIDTH))
    for i, col in enumerate(colliders):
        kind = _KIND.get(col.kind, -1)
        out[i, 0] = kind
        if kind < 0:
            continue
        c = col.center(t)
        R = col.orientation(t)
        out[i, 1:4] = c
        out[i, 4:13] = R.ravel()
        if col.kind == "plane":
            out[i, 13:16] = R @ col.normal
        elif col.kind == "cylinder":
            out[i, 13:16] = R @ col.axis
        out[i, 16] = col.radius
        out[i, 17] = col.length if math.isfinite(col.length) else -1.0
        out[i, 18:21] = col.half_extents
    return out
