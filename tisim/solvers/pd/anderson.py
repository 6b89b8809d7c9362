"""Anderson acceleration of the local-global iteration on the device (``solver.acceleration``
"anderson", or "auto" where it applies): the history update, the small least-squares
problem and the extrapolation, fused with the local step in one launch
(:func:`iterate_anderson`), and the arrays they work on (:class:`AndersonArrays`). The
host side (ring buffer, energy safeguard) is :class:`AndersonSafeguard`.

This module has no ``from __future__ import annotations``: Taichi reads the
kernels' type annotations when they are decorated.
"""

import math

import numpy as np
import taichi as ti

from tisim.solvers.pd.local import (
    _is_f64,
    _np_real,
    local_half,
    nd,
    row3,
    set_row3,
)

# set with tisim.solvers.pd.local._SERIAL when the first PDKernels is made
_SERIAL = False


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
    One function on purpose: it runs inside the local step's launch, and its phases share
    the per-chunk sums and the small dense solve.

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


class AndersonSafeguard:
    """Anderson acceleration (type II, window m) of the local-global fixed-point map
    x -> G(x) = x + A_ff^-1 r(x), with the energy safeguard of Peng et al. 2018.

    With f_k = G(x_k) - x_k and the differences dF_j = f_{j+1} - f_j, dG_j = G(x_{j+1}) - G(x_j)
    of the last m iterations, x_{k+1} = G(x_k) - dG theta, theta = argmin ||f_k - dF theta||
    (normal equations, Tikhonov-regularised at 1e-10 of their mean diagonal in f64, 1e-5
    in f32). On a quadratic energy this is GMRES on the preconditioned system; here it lets
    the iteration move along the soft directions (shear, in a Neo-Hookean bar under
    quasi-Newton weights w = (3 mu + 2 lam) V) where the plain map contracts by only
    about 1 - mu / (3 mu + 2 lam) an iteration.

    Safeguard: the incremental potential E (the true one: elastic energy of the material
    plus inertia, not the local-global surrogate, which for the quasi-Newton materials is
    not an energy the iteration decreases) is evaluated at every iterate, in the same
    launch as its local step. An extrapolated iterate whose E exceeds that of the
    previous iterate (by more than round-off, 1e-12 |E|) is replaced by the plain step
    G(x_{k-1}) (its local step runs again) and the history is cleared; if the plain step
    also increases E (a quasi-Newton step need not decrease it), it is halved along the
    same direction up to ``max_backtracks`` times. So the energy of the iterates the
    local steps see never increases (beyond round-off; after ``max_backtracks`` halvings
    the last one is kept). The last global step's result is returned without an energy
    check, as in the plain iteration: no extrapolation the safeguard has not seen is
    returned.

    Device work (kernels.iterate_anderson): one launch an iteration, like the plain
    iteration's: it records the previous global step's result in the history, sums the
    dot products of the small least-squares problem (deterministically, per chunk of
    vertices), solves it (Cholesky, serial, m <= 16), extrapolates, then runs the local
    step with the energy. The host keeps the ring buffer's bookkeeping and reads two
    scalars (E, whether it extrapolated) besides ||r||^2; nothing of size n or m crosses.

    References: Y. Peng, B. Deng, J. Zhang, F. Geng, W. Qin, L. Liu. Anderson
    Acceleration for Geometry Optimization and Physics Simulation. SIGGRAPH 2018.
    H. F. Walker, P. Ni. Anderson acceleration for fixed-point iterations. SINUM 2011.
    """

    max_backtracks = 4
    slack = 1e-12

    def __init__(self, window: int, vertex_count: int):
        self.m = int(window)
        self.arrays = AndersonArrays(vertex_count, self.m)
        self.begin()

    def clear(self) -> None:
        """Forget the history (the map changed: refactoring, reset, a rejected step)."""
        self.count = 0  # columns in the history
        self.pos = 0  # next ring-buffer slot

    def begin(self) -> None:
        """Start a time step (its initial guess already on the device)."""
        self.clear()
        self.calls = 0  # iterations of this step so far (safeguard calls)
        self.E_prev = math.inf
        self.rejected = 0
        self.backtracks = 0
        self.extrapolated = 0

    def _ok(self, E: float) -> bool:
        return E <= self.E_prev + self.slack * abs(self.E_prev)

    def safeguard(self, kernels, evaluate) -> float:
        """Record the last global step, extrapolate and run the local step with its energy
        (``evaluate(slot, count, record) -> (||r||^2, E, extrapolated)``, see
        kernels.anderson_update); enforce the energy decrease as described in the class
        docstring. Returns ||r||^2 of the iterate kept."""
        # what the launch records: nothing before the step's first global step, then
        # G(x_0) without differences, then a new history column every iteration
        record = min(self.calls, 2)
        self.calls += 1
        slot, count = self.pos, self.count
        if record == 2:
            count = min(count + 1, self.m)
            self.pos = (slot + 1) % self.m
            self.count = count
        rsq, E, extrapolated = evaluate(slot, count, record)
        self.extrapolated += int(extrapolated)
        if not self._ok(E):
            if extrapolated:
                self.rejected += 1
                self.clear()
                self.arrays.fallback(kernels.x, 1.0)
                rsq, E, _ = evaluate(0, 0, 0)
            alpha = 0.5
            for _ in range(self.max_backtracks):
                if self._ok(E):
                    break
                self.backtracks += 1
                self.clear()
                self.arrays.fallback(kernels.x, alpha)
                rsq, E, _ = evaluate(0, 0, 0)
                alpha *= 0.5
        self.E_prev = E
        return rsq
