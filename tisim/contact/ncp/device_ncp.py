"""The per-iteration contact update of :class:`tisim.contact.pd_contact.PDContact` in
Taichi kernels (issue 10).

:class:`DeviceNCP` keeps one step's contact problem on the device - contact points
(vertices, weights), frames, gaps, collider poses, the dense scalar Delassus matrix
W_hat (k x k), the preconditioner and the forces lambda - and runs what
``PDContact.update(q)`` does in numpy as kernels over it: the kinematics (gaps d and
slips u from q, exact collider signed distances), the NCP and proximal friction rows
with their generalized Jacobian, the Conjugate Residual solve of the Newton system
with the (indicator-scaled) Delassus operator, the backtracking line search on the
merit, the cone projection and the force scatter H^T lambda into an (n, 3) array.
The mathematics is that of the numpy path, line by line (same friction_jacobian
modes, line-search rule and tolerances), so the two agree to round-off.

Two ways to launch the same functions (:meth:`DeviceNCP.update`):

* staged (GPU backends): one kernel per stage - kinematics and merit, Newton rows and
  CR start, one per CR iteration, one per line-search trial, commit - with parallel
  loops; the host reads the merit (one scalar) before each Newton step and after each
  trial, and the CR iteration count once per step; CR breakdown is a flag on the device.
* fused (the CPU backend): the whole update in one launch with serial loops, the
  decisions taken on the device; the host reads the scalars once per update. On the
  CPU a launch and a thread-pool hand-over cost more than the work of a contact solve.

Data: per-contact fields (k, 3), (k, 2), (k,), the dense W_hat (k * k) and flat (3 k,)
Newton-system vectors (row 3 c + a for component a = normal, e_par, e_perp of contact
c) live in a :class:`_Storage` sized by a capacity (1024 contacts first, doubling when
a step has more). Kernels compile per storage, so storages are pooled and re-used, never
re-created per step. Positions q and forces H^T lambda are (n, 3) ndarrays. Values
are in the backend's precision; every reduction accumulates in f64, in fixed blocks
and then serially (no atomics), so results are reproducible run to run.

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import math
import weakref

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


# set from _serial_loops() when the first storage is made (before any kernel compiles)
_SERIAL = False

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
            t = ti.Vector(
                [frames[i, a + 1, 0], frames[i, a + 1, 1], frames[i, a + 1, 2]], ti.f64
            )
            u[i, a] = ti.cast(t.dot(rel), u.dtype)


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
            phi, _da, _db = _ncp(mode, d[i], r_n[i] * lam[i, 0])
            radius = mu[i] * ti.max(lam[i, 0], 0.0)
            f1, f2 = _friction_residual(lam[i, 1], lam[i, 2], u[i, 0], u[i, 1], r_t[i], radius)
            s = r_t[i] * h
            f1 *= s
            f2 *= s
            acc += ti.cast(phi * phi, ti.f64) + ti.cast(f1 * f1 + f2 * f2, ti.f64)
        part[b] = acc
    ti.loop_config(serialize=_SERIAL)
    for _ in range(1):
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
            y0 = ti.f64(0.0)
            y1 = ti.f64(0.0)
            y2 = ti.f64(0.0)
            base = i * k
            for j in range(k):
                w = ti.cast(W[base + j], ti.f64)
                y0 += w * world0[j]
                y1 += w * world1[j]
                y2 += w * world2[j]
            y = ti.Vector([y0, y1, y2], ti.f64)
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
        if sc[_DONE] == 0.0:
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
        if sc[_DONE] == 0.0 and rr == 0.0:
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
        if sc[_DONE] == 0.0:
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
            f1, f2 = _friction_residual(
                lam[i, 1], lam[i, 2], u[i, 0], u[i, 1], c * inv_h, mu[i] * lam[i, 0]
            )
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


@ti.kernel
def _min_collider_gaps(
    cp: ti.types.ndarray(ndim=2),
    ncol: ti.i32,
    sv: ti.types.ndarray(ndim=1),
    q0: ti.types.ndarray(ndim=2),
    q1: ti.types.ndarray(ndim=2),
    q2: ti.types.ndarray(ndim=2),
    npos: ti.i32,
    out: ti.types.ndarray(ndim=2),
):
    """out[c, i] = min over the first npos of (q0, q1, q2) of the signed distance of vertex
    sv[i] to collider c (f64 throughout, whatever the backend's precision)."""
    ti.loop_config(serialize=_SERIAL)
    for i in range(sv.shape[0]):
        v = sv[i]
        for c in range(ncol):
            d = _signed_distance(cp, c, q0[v, 0], q0[v, 1], q0[v, 2])
            if npos > 1:
                d = ti.min(d, _signed_distance(cp, c, q1[v, 0], q1[v, 1], q1[v, 2]))
            if npos > 2:
                d = ti.min(d, _signed_distance(cp, c, q2[v, 0], q2[v, 1], q2[v, 2]))
            out[c, i] = d


class DeviceColliderGaps:
    """Contact detection's test of every surface vertex against the analytic colliders
    in one launch: the smallest signed distance of each vertex over a few positions
    (start of step, predictions), the formulas of ``Collider.distance`` (and of the NCP
    kernels' exact gaps), in f64.

    colliders: the model's colliders (no mesh colliders: PD contact does not handle them).
    vertices: (m,) the vertices tested (the surface). ``__call__(positions, t)``:
    positions, a list of 1 to 3 (n, 3) host arrays, m; t, the time (s) the colliders'
    poses are taken at; returns (c, m) distances, m (a buffer re-used by the next call).
    Host arrays go to the kernel as they are (no copy on the CPU backend; one upload
    each on GPU backends, once per detection).
    """

    def __init__(self, colliders, vertices):
        global _SERIAL
        _SERIAL = _serial_loops()
        self.colliders = tuple(colliders)
        if any(_KIND.get(c.kind, -1) < 0 for c in self.colliders):
            raise ValueError("DeviceColliderGaps handles analytic colliders only")
        self.vertices = np.ascontiguousarray(vertices, dtype=np.int32)
        self.sv = ti.ndarray(ti.i32, shape=max(len(self.vertices), 1))
        if len(self.vertices):
            self.sv.from_numpy(self.vertices)
        self.out = np.empty((len(self.colliders), len(self.vertices)))

    def __call__(self, positions, t: float) -> np.ndarray:
        qs = [np.ascontiguousarray(p, dtype=np.float64) for p in positions]
        if not 1 <= len(qs) <= 3:
            raise ValueError(f"1 to 3 position arrays, got {len(qs)}")
        if len(self.vertices) and len(self.colliders):
            q = qs + [qs[0]] * (3 - len(qs))
            cp = collider_parameters(self.colliders, t)
            _min_collider_gaps(cp, len(self.colliders), self.sv, *q, len(qs), self.out)
        return self.out


# ---------------------------------------------------------------------------------------


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


@ti.data_oriented
class _Storage:
    """Fields for up to ``cap`` contacts and the fused kernels over them.

    Each kernel chains the functions above as top-level loops (Taichi runs them in
    order, each in parallel), so one launch does what the numpy path does between two
    decisions of the host. Fields are template arguments, which Taichi launches several
    times faster than ndarray arguments, but kernels compile per _Storage instance
    (tens of seconds on a loaded 2-core machine): storages are pooled per (capacity,
    precision) and re-used by later DeviceNCP objects (:func:`_acquire`), and the NCP
    function, friction Jacobian and exact-gap switches are kernel arguments, not
    compile-time constants. The (n, 3) positions and forces depend on the model and are
    ndarray arguments of the two kernels that use them.
    """

    def __init__(self, cap: int, ncolliders: int, dtype):
        global _SERIAL
        _SERIAL = _serial_loops()
        self.cap = cap
        self.ncolliders = ncolliders
        self.dtype = dtype
        f, i32, f64 = dtype, ti.i32, ti.f64
        F = ti.field
        self.sc = F(f64, shape=_N_SCALARS)
        self.cparams = F(f, shape=(ncolliders, _COLLIDER_WIDTH))
        self.vert = F(i32, shape=(cap, 4))
        self.wgt = F(f, shape=(cap, 4))
        self.frames = F(f, shape=(cap, 3, 3))
        self.gap0 = F(f, shape=cap)
        self.point0 = F(f, shape=(cap, 3))
        self.collider = F(i32, shape=cap)
        self.mu = F(f, shape=cap)
        self.surf_vel = F(f, shape=(cap, 3))
        self.r_n = F(f, shape=cap)
        self.r_t = F(f, shape=cap)
        self.cjj = F(f, shape=cap)
        self.W = F(f, shape=cap * cap)
        self.lam = F(f, shape=(cap, 3))
        self.d = F(f, shape=cap)
        self.u = F(f, shape=(cap, 2))
        self.d1 = F(f, shape=cap)
        self.u1 = F(f, shape=(cap, 2))
        self.new = F(f, shape=(cap, 3))
        self.dlam = F(f, shape=(cap, 3))
        self.epar = F(f, shape=(cap, 2))
        self.world = [F(f64, shape=cap) for _ in range(3)]
        m = 3 * cap
        for name in ("res", "om", "E", "dl", "c", "x", "r", "p", "s", "t", "step", "resp"):
            setattr(self, name, F(f, shape=m))
        self.act = F(i32, shape=m)
        self.part = F(f64, shape=m // _BLOCK + 1)
        self.ptr = F(i32, shape=4 * cap + 1)
        self.vtx = F(i32, shape=4 * cap)
        self.entry = F(i32, shape=4 * cap)

    @ti.func
    def _merit_at(self, mode, k, h, lam: ti.template(), d: ti.template(), u: ti.template()):
        _merit(mode, k, h, lam, d, u, self.r_n, self.r_t, self.mu, self.part, self.sc)

    @ti.kernel
    def start(self, mode: ti.i32, exact: ti.i32, k: ti.i32, h: float, q: ti.types.ndarray(ndim=2)):
        """Kinematics at q, then the merit there."""
        _kinematics(
            exact, k, 1.0 / h, q, self.vert, self.wgt, self.frames, self.gap0,
            self.point0, self.collider, self.cparams, self.surf_vel, self.d, self.u,
        )  # fmt: skip
        self._merit_at(mode, k, h, self.lam, self.d, self.u)

    @ti.kernel
    def merit(self, mode: ti.i32, k: ti.i32, h: float):
        self._merit_at(mode, k, h, self.lam, self.d, self.u)

    @ti.func
    def _apply_op(self, op, k, scale, x: ti.template(), out: ti.template()):
        _apply(
            op, k, scale, self.W, self.frames, self.epar, x, self.om, self.E, self.act,
            self.res, self.world[0], self.world[1], self.world[2], out, self.sc,
        )  # fmt: skip

    @ti.kernel
    def newton_begin(self, mode: ti.i32, lagged: ti.i32, k: ti.i32, h: float, scale: float):
        """Newton rows, the CR right-hand side, and CR's start (r = c, s = t = K r)."""
        _newton_rows(
            mode, lagged, k, h, self.lam, self.d, self.u, self.r_n, self.r_t,
            self.mu, self.res, self.om, self.E, self.act, self.epar, self.dl,
        )  # fmt: skip
        self._apply_op(1, k, scale, self.dl, self.c)
        _cr_init(3 * k, self.c, self.x, self.r, self.p, self.part, self.sc)
        self._apply_op(0, k, scale, self.r, self.s)
        _cr_start(3 * k, self.r, self.s, self.t, self.part, self.sc)

    @ti.kernel
    def cr_iteration(self, it: ti.i32, k: ti.i32, scale: float):
        """One CR iteration followed by the next direction."""
        m = 3 * k
        _cr_step(it, m, self.x, self.r, self.p, self.t, self.part, self.sc)
        self._apply_op(0, k, scale, self.r, self.s)
        _cr_direction(m, self.r, self.s, self.p, self.t, self.part, self.sc)

    @ti.kernel
    def cr_last(self, it: ti.i32, k: ti.i32):
        """The last CR iteration and the Newton direction dlam in (t1, t2)."""
        _cr_step(it, 3 * k, self.x, self.r, self.p, self.t, self.part, self.sc)
        _newton_finish(k, self.x, self.om, self.act, self.dl, self.epar, self.dlam)

    @ti.kernel
    def trial(self, mode: ti.i32, k: ti.i32, h: float, scale: float, alpha: float):
        """Projected trial forces, the predicted gaps and slips, and their merit."""
        _trial(k, alpha, self.lam, self.dlam, self.mu, self.new, self.step)
        self._apply_op(2, k, scale, self.step, self.resp)
        _predict(k, 1.0 / h, self.d, self.u, self.resp, self.d1, self.u1)
        self._merit_at(mode, k, h, self.new, self.d1, self.u1)

    @ti.kernel
    def commit(self, mode: ti.i32, k: ti.i32, h: float):
        """Accept the trial; the merit at the new state."""
        _copy_state(k, self.new, self.d1, self.u1, self.lam, self.d, self.u)
        self._merit_at(mode, k, h, self.lam, self.d, self.u)

    @ti.kernel
    def update_all(
        self,
        mode: ti.i32,
        lagged: ti.i32,
        exact: ti.i32,
        k: ti.i32,
        h: float,
        scale: float,
        its: ti.i32,
        newton_iterations: ti.i32,
        q: ti.types.ndarray(ndim=2),
    ):
        """The whole update in one launch, every loop inside one serial loop (the CPU
        backend, where a launch costs more than a small problem's work): the same
        functions, in the order DeviceNCP.update launches them, the host's decisions
        (merit test, line-search acceptance) taken here. sc[_CR_TOTAL], sc[_HALVINGS]
        accumulate the CR iterations and halvings."""
        ti.loop_config(serialize=True)
        for _ in range(1):
            m = 3 * k
            _kinematics(
                exact, k, 1.0 / h, q, self.vert, self.wgt, self.frames, self.gap0,
                self.point0, self.collider, self.cparams, self.surf_vel, self.d, self.u,
            )  # fmt: skip
            for _nt in range(newton_iterations):
                self._merit_at(mode, k, h, self.lam, self.d, self.u)
                f0 = self.sc[_MERIT]
                if f0 <= NEWTON_TOL * NEWTON_TOL:
                    break
                _newton_rows(
                    mode, lagged, k, h, self.lam, self.d, self.u, self.r_n, self.r_t,
                    self.mu, self.res, self.om, self.E, self.act, self.epar, self.dl,
                )  # fmt: skip
                # the CR right-hand side (it = -1), then its iterations; each product
                # K r is followed by CR's start (it = 0) or its next direction
                for it in range(-1, its):
                    if it == -1:
                        self._apply_op(1, k, scale, self.dl, self.c)
                        _cr_init(m, self.c, self.x, self.r, self.p, self.part, self.sc)
                    else:
                        self._apply_op(0, k, scale, self.r, self.s)
                        if it == 0:
                            _cr_start(m, self.r, self.s, self.t, self.part, self.sc)
                        else:
                            _cr_direction(m, self.r, self.s, self.p, self.t, self.part, self.sc)
                        _cr_step(it, m, self.x, self.r, self.p, self.t, self.part, self.sc)
                _newton_finish(k, self.x, self.om, self.act, self.dl, self.epar, self.dlam)
                self.sc[_CR_TOTAL] += self.sc[_ITS]
                alpha = 1.0
                for ls in range(LINE_SEARCH_STEPS + 1):
                    _trial(k, alpha, self.lam, self.dlam, self.mu, self.new, self.step)
                    self._apply_op(2, k, scale, self.step, self.resp)
                    _predict(k, 1.0 / h, self.d, self.u, self.resp, self.d1, self.u1)
                    accept = f0 == 0.0 or ls == LINE_SEARCH_STEPS
                    if not accept:
                        self._merit_at(mode, k, h, self.new, self.d1, self.u1)
                        accept = self.sc[_MERIT] < f0
                    if accept:
                        self.sc[_HALVINGS] += ls
                        break
                    alpha *= 0.5
                _copy_state(k, self.new, self.d1, self.u1, self.lam, self.d, self.u)
            _record(k, 1.0 / h, self.lam, self.d, self.u, self.cjj, self.mu, self.sc)

    @ti.kernel
    def read_scalars(self, out: ti.types.ndarray(ndim=1)):
        """out = sc (a host array): a serial copy, cheaper than a field's to_numpy on the
        CPU backend (22 against 145 us)."""
        ti.loop_config(serialize=_SERIAL)
        for i in range(_N_SCALARS):
            out[i] = self.sc[i]

    @ti.kernel
    def record(self, k: ti.i32, h: float):
        _record(k, 1.0 / h, self.lam, self.d, self.u, self.cjj, self.mu, self.sc)

    @ti.kernel
    def scatter(self, nv: ti.i32, force: ti.types.ndarray(ndim=2)):
        _scatter(nv, self.ptr, self.vtx, self.entry, self.lam, self.frames, self.wgt, force)

    @ti.kernel
    def unpack(
        self,
        k: ti.i32,
        fa: ti.types.ndarray(ndim=2),
        ia: ti.types.ndarray(ndim=2),
        nv: ti.i32,
        ga: ti.types.ndarray(ndim=1),
    ):
        """Per-contact data from one packed float array (k, _PACKED) and one int array
        (k, 5), and the force gather's lists from ga = [ptr (nv + 1), vtx (nv), entry
        (4 k)], laid out by DeviceNCP.load: one launch instead of one copy per field."""
        ti.loop_config(serialize=_SERIAL)
        for i in range(nv + 1):
            self.ptr[i] = ga[i]
        ti.loop_config(serialize=_SERIAL)
        for i in range(nv):
            self.vtx[i] = ga[nv + 1 + i]
        ti.loop_config(serialize=_SERIAL)
        for i in range(4 * k):
            self.entry[i] = ga[2 * nv + 1 + i]
        ti.loop_config(serialize=_SERIAL)
        for i in range(k):
            for j in ti.static(range(4)):
                self.vert[i, j] = ia[i, j]
                self.wgt[i, j] = fa[i, j]
            for a, b in ti.static(ti.ndrange(3, 3)):
                self.frames[i, a, b] = fa[i, 4 + 3 * a + b]
            self.gap0[i] = fa[i, 13]
            self.collider[i] = ia[i, 4]
            self.mu[i] = fa[i, 17]
            self.r_n[i] = fa[i, 21]
            self.r_t[i] = fa[i, 22]
            self.cjj[i] = fa[i, 23]
            for a in ti.static(range(3)):
                self.point0[i, a] = fa[i, 14 + a]
                self.surf_vel[i, a] = fa[i, 18 + a]
                self.lam[i, a] = fa[i, 24 + a]

    @ti.kernel
    def clear_rows(self, nv: ti.i32, force: ti.types.ndarray(ndim=2)):
        _clear_rows(nv, self.vtx, force)


# Free storages by (Taichi runtime, capacity, colliders, precision); a DeviceNCP holds one
# while it lives. The runtime is part of the key: after backend.reset() and a new init the
# old fields are gone.
_POOL: dict = {}


def _runtime_id() -> int:
    from taichi.lang import impl

    return id(impl.get_runtime().prog)


def _acquire(cap: int, ncolliders: int, dtype) -> _Storage:
    key = (_runtime_id(), cap, ncolliders, dtype)
    if not _POOL.get(key):
        import gc

        gc.collect()  # a solver dropped in a reference cycle still holds its storage
    free = _POOL.get(key)
    if free:
        return free.pop()
    st = _Storage(cap, ncolliders, dtype)
    st.runtime = key[0]
    return st


def _release(st: _Storage) -> None:
    _POOL.setdefault((st.runtime, st.cap, st.ncolliders, st.dtype), []).append(st)


def clear_pool() -> None:
    """Drop the pooled storages (call before tearing Taichi down)."""
    _POOL.clear()


class DeviceNCP:
    """One step's contact problem on the device and the kernels of its Newton update.

    vertex_count: n. ncp: "fischer-burmeister" or "min-map". friction_jacobian: "full"
    or "lagged" (see PDContact). exact_gaps: collider gaps by their exact signed
    distance. cr_iterations: Conjugate Residual iterations per Newton step.
    dtype: np.float64 or np.float32 for the per-contact fields (reductions are f64).
    capacity: contacts the first allocation holds (it doubles when a step has more).

    Use: :meth:`load` once per step (after detection and W_hat), then :meth:`update`
    per local-global iteration and :meth:`force` for H^T lambda.

    References: as PDContact (notes §2.6-2.10, §3).
    Limitations: W_hat is dense (k^2 memory, k^2 work per product, one thread per row);
    q arrives and H^T lambda leaves as numpy (n, 3) arrays (the PD solver's interface);
    growing the capacity compiles the kernels again (once per doubling).
    """

    def __init__(
        self,
        vertex_count: int,
        *,
        ncp: str = "fischer-burmeister",
        friction_jacobian: str = "full",
        exact_gaps: bool = True,
        cr_iterations: int = 10,
        dtype=np.float64,
        capacity: int = 1024,
    ):
        if ncp not in NCP_CODES:
            raise ValueError(f"unknown NCP function {ncp!r}; expected one of {sorted(NCP_CODES)}")
        if friction_jacobian not in ("full", "lagged"):
            raise ValueError(
                f"friction_jacobian must be 'full' or 'lagged', got {friction_jacobian!r}"
            )
        self.n = int(vertex_count)
        self.mode = NCP_CODES[ncp]
        self.lagged = friction_jacobian == "lagged"
        self.exact = bool(exact_gaps)
        self.cr_iterations = int(cr_iterations)
        self.np_dtype = np.dtype(dtype)
        self.ti_dtype = ti.f64 if self.np_dtype == np.float64 else ti.f32
        self.k = 0
        self.h = 0.0
        self.scale = 0.0
        self.st = None
        self._capacity = max(int(capacity), 16)
        self._ncol = 8
        self._nv = 0
        self.q = ti.ndarray(self.ti_dtype, shape=(max(self.n, 1), 3))
        self.force_dev = ti.ndarray(self.ti_dtype, shape=(max(self.n, 1), 3))
        self.force_dev.fill(0)
        self._finalizer = None
        self._force_host = None
        self._force_dev_fresh = False  # force_dev holds H^T lambda of the current lambda
        self._sc_read = None  # the scalars as the last fused update read them
        self._sc_buf = np.empty(_N_SCALARS)  # read_scalars' target, allocated once
        self.cr_total = 0
        self.halvings = 0

    @property
    def cap(self) -> int:
        return self.st.cap if self.st is not None else 0

    # ------------------------------------------------------------------ storage
    def _ensure(self, k: int, ncol: int) -> None:
        cap = self._capacity
        while cap < k:
            cap *= 2
        while self._ncol < ncol:
            self._ncol *= 2
        if self.st is not None and cap == self.st.cap and self._ncol == self.st.ncolliders:
            return
        self._capacity = cap
        if self._finalizer is not None:
            self._finalizer()  # back to the pool
        self.st = _acquire(cap, self._ncol, self.ti_dtype)
        self._finalizer = weakref.finalize(self, _release, self.st)

    def warm_up(self, ncolliders: int = 0) -> None:
        """Compile the kernels now (launching them on an empty problem) rather than at
        the first contact, where it would stall a frame (seconds; Taichi's offline
        cache keeps them for later processes)."""
        self._ensure(1, ncolliders)
        st, h = self.st, 1.0
        _load_matrix(0, np.zeros((1, 1), dtype=self.np_dtype), st.W)
        st.unpack(
            0, np.zeros((1, _PACKED), dtype=self.np_dtype), np.zeros((1, 5), np.int32), 0,
            np.zeros(1, np.int32),
        )  # fmt: skip
        st.clear_rows(0, self.force_dev)
        st.scatter(0, self.force_dev)
        if _SERIAL:
            st.update_all(self.mode, 0, 0, 0, h, 1.0, 1, 1, self.q)
            st.read_scalars(np.empty(_N_SCALARS))
        else:
            st.start(self.mode, 0, 0, h, self.q)
            st.merit(self.mode, 0, h)
            st.newton_begin(self.mode, 0, 0, h, 1.0)
            st.cr_iteration(0, 0, 1.0)
            st.cr_last(0, 0)
            st.trial(self.mode, 0, h, 1.0, 1.0)
            st.commit(self.mode, 0, h)
            st.record(0, h)
        ti.sync()

    def _put(self, dst, a: np.ndarray, dtype=None) -> None:
        """Copy a (k, ...) host array into the first k rows of a capacity-sized field."""
        dt = self.np_dtype if dtype is None else dtype
        full = np.zeros(dst.shape, dtype=dt)
        if a.size:
            full[: a.shape[0]] = a
        dst.from_numpy(full)

    # ------------------------------------------------------------------ per step
    def load(
        self,
        contacts,
        W_hat: np.ndarray,
        r_n: np.ndarray,
        r_t: np.ndarray,
        compliance: np.ndarray,
        scale: float,
        h: float,
        lam: np.ndarray,
        colliders=(),
        t: float = 0.0,
    ) -> None:
        """Upload one step's contact problem.

        contacts: ContactSet (k contacts). W_hat: (k, k) B^T A_hat^-1 B. r_n (k,) m/N,
        r_t (k,) (m/s)/N: the preconditioner; compliance: (k,) the diagonal of C, m/N.
        scale: s in C = s H A^-1 H^T. h: time step, s. lam: (k, 3) initial forces, N.
        colliders, t: the model's colliders and the time (s) their poses are taken at.
        """
        k = contacts.count
        if self.st is not None and self._nv:
            self.st.clear_rows(self._nv, self.force_dev)  # the previous step's force rows
        self._ensure(k, len(colliders))
        st = self.st
        self.k = k
        self.h = float(h)
        self.scale = float(scale)
        # vertex -> (contact, slot) lists of the force gather, in the order
        # ContactSet.scatter_forces sums (contact, then slot)
        verts = contacts.vertices.ravel()
        order = np.argsort(verts, kind="stable")
        uv, start = np.unique(verts[order], return_index=True)
        nv = len(uv)
        ga = np.concatenate([start, [len(verts)], uv, order]).astype(np.int32)
        if k:
            fa = np.empty((k, _PACKED), dtype=self.np_dtype)
            fa[:, 0:4] = contacts.weights
            fa[:, 4:13] = contacts.frames.reshape(k, 9)
            fa[:, 13] = contacts.gap0
            fa[:, 14:17] = contacts.point0
            fa[:, 17] = contacts.mu
            fa[:, 18:21] = contacts.surface_velocity
            fa[:, 21] = r_n
            fa[:, 22] = r_t
            fa[:, 23] = compliance
            fa[:, 24:27] = np.asarray(lam, dtype=np.float64).reshape(k, 3)
            ia = np.empty((k, 5), dtype=np.int32)
            ia[:, :4] = contacts.vertices
            ia[:, 4] = contacts.collider
            st.unpack(k, fa, ia, nv, ga)
            _load_matrix(k, np.ascontiguousarray(W_hat, dtype=self.np_dtype), st.W)
        self._put(st.cparams, collider_parameters(colliders, t))
        self._nv = nv
        self._lam_changed()
        self.cr_total = 0
        self.halvings = 0

    def set_lam(self, lam: np.ndarray) -> None:
        """Replace the forces (k, 3) frame components, N."""
        self._put(self.st.lam, np.asarray(lam, dtype=np.float64).reshape(-1, 3))
        self._lam_changed()

    def get_lam(self) -> np.ndarray:
        """(k, 3) the forces, N (one device read)."""
        return self.st.lam.to_numpy()[: self.k].astype(np.float64)

    # ------------------------------------------------------------------ kernels
    def _scalar(self, slot: int) -> float:
        return float(self.st.sc[slot])

    def _lam_changed(self) -> None:
        self._sc_read = None  # the scalars changed since they were last read
        self._force_host = None
        self._force_dev_fresh = False

    def _q_array(self, q):
        """The positions as a (n, 3) Taichi array of this precision: a Taichi array of that
        type is used as it is (it stays on the device: the PD solver passes its own
        iterate), anything else is copied into self.q."""
        if isinstance(q, ti.Ndarray) and q.dtype == self.ti_dtype and tuple(q.shape) == tuple(self.q.shape):
            return q
        if isinstance(q, ti.Ndarray):
            q = q.to_numpy()
        self.q.from_numpy(np.ascontiguousarray(q, dtype=self.np_dtype))
        return self.q

    def kinematics(self, q) -> float:
        """d, u on the device from positions q (n, 3; numpy or a Taichi array); returns
        the merit there."""
        self.st.start(self.mode, int(self.exact), self.k, self.h, self._q_array(q))
        return self._scalar(_MERIT)

    def merit(self) -> float:
        """The merit (m^2) at the current (lambda, d, u)."""
        self.st.merit(self.mode, self.k, self.h)
        return self._scalar(_MERIT)

    def newton_step(self) -> int:
        """One Newton direction into the dlam field at the current (lambda, d, u);
        returns the CR iterations spent."""
        st, k = self.st, self.k
        st.newton_begin(self.mode, int(self.lagged), k, self.h, self.scale)
        its = self.cr_iterations
        for i in range(its - 1):
            st.cr_iteration(i, k, self.scale)
        st.cr_last(its - 1, k)
        return int(self._scalar(_ITS))

    def line_search(self, f0: float) -> int:
        """lambda <- Proj(lambda + alpha dlam), alpha = 1, 1/2, ... until the merit drops
        below f0 (at most LINE_SEARCH_STEPS halvings); d, u move to their prediction and
        the merit there is left in the scalars. Returns the halvings."""
        st, k = self.st, self.k
        alpha = 1.0
        for i in range(LINE_SEARCH_STEPS + 1):
            st.trial(self.mode, k, self.h, self.scale, alpha)
            if f0 == 0.0 or i == LINE_SEARCH_STEPS or self._scalar(_MERIT) < f0:
                break
            alpha *= 0.5
        st.commit(self.mode, k, self.h)
        self._lam_changed()
        return i

    def update(self, q: np.ndarray, newton_iterations: int, fused: bool | None = None) -> None:
        """PDContact.update on the device: kinematics at q (n, 3), then up to
        ``newton_iterations`` Newton steps with line search, then the statistics.

        fused: one launch for the whole update (default on the CPU backend) or one per
        stage, with the merit read by the host between them (default on GPUs)."""
        if not self.k:
            return
        st = self.st
        if fused is None:
            fused = _SERIAL
        if fused:
            qa = self._q_array(q)
            st.sc[_CR_TOTAL] = 0.0
            st.sc[_HALVINGS] = 0.0
            st.update_all(
                self.mode, int(self.lagged), int(self.exact), self.k, self.h, self.scale,
                self.cr_iterations, int(newton_iterations), qa,
            )  # fmt: skip
            s = self._sc_buf
            st.read_scalars(s)
            self.cr_total += int(s[_CR_TOTAL])
            self.halvings += int(s[_HALVINGS])
            self._lam_changed()
            self._sc_read = s  # what statistics() reports, without a second read
            return
        self.kinematics(q)
        for _ in range(int(newton_iterations)):
            f0 = self._scalar(_MERIT)
            if f0 <= NEWTON_TOL**2:
                break
            self.cr_total += self.newton_step()
            self.halvings += self.line_search(f0)
        st.record(self.k, self.h)
        self._lam_changed()

    def statistics(self) -> dict:
        """ncp_residual (m), max_penetration (m), n_touching of the last update."""
        s = self._sc_read
        if s is None:
            s = self.st.sc.to_numpy()
        return {
            "ncp_residual": float(s[_NCP_RES]),
            "max_penetration": float(s[_MAX_PEN]),
            "n_touching": int(s[_TOUCHING]),
        }

    def gaps_and_slips(self) -> tuple[np.ndarray, np.ndarray]:
        """(d (k,), u (k, 2)) on the host (for tests)."""
        k = self.k
        return (
            self.st.d.to_numpy()[:k].astype(np.float64),
            self.st.u.to_numpy()[:k].astype(np.float64),
        )

    def direction(self) -> np.ndarray:
        """(k, 3) the last Newton direction (for tests)."""
        return self.st.dlam.to_numpy()[: self.k].astype(np.float64)

    def force_device(self):
        """H^T lambda as a (n, 3) Taichi array of vertex forces, N, on the device (one
        gather kernel when lambda changed; nothing is read)."""
        if not self._force_dev_fresh:
            if self.k:
                self.st.scatter(self._nv, self.force_dev)
            self._force_dev_fresh = True
        return self.force_dev

    def force(self) -> np.ndarray:
        """H^T lambda as (n, 3) vertex forces, N (one gather kernel and one read, cached
        until lambda changes)."""
        if self._force_host is None:
            self._force_host = self.force_device().to_numpy().astype(np.float64, copy=False)
        return self._force_host
