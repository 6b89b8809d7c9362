"""The device contact update's line search with every trial at once (the staged update of
:class:`tisim.contact.ncp.device_ncp.DeviceNCP` on GPU backends).

The backtracking line search tries alpha = 1, 1/2, ..., 2^-LINE_SEARCH_STEPS in turn and
takes the first trial whose merit is below the merit at the start (or the last one).
Done in turn on a GPU, each trial is a launch and the host must read its merit before
deciding on the next: a synchronisation per trial. Here the trials are evaluated
together, each (trial, contact) pair a thread: the projected forces, the response
C (new - lambda) in the contact frames, the predicted gaps and slips and the merit's
block sums; then one serial pass picks the first accepted trial in the order of the
sequential search, and its state is copied. Every value is computed by the same
expressions as the sequential trial (:func:`~tisim.contact.ncp.device_functions._trial`,
``_apply`` with op 2, ``_predict``, ``_merit``), so the chosen trial is the one the
sequential search accepts, with the same numbers to round-off (Taichi compiles with fast
math, so the compiler may contract the same expressions differently in the two kernels:
on the CPU backend the predicted slips differ by an ulp). The cost is the work of all trials
(the product with W_hat, k^2 per trial, done in parallel) instead of the first
accepted one's: on a GPU the launches and the host's waits are what a small contact
problem costs, not the arithmetic.

Storage: trial t of contact i at row t * cap + i of fields sized (LINE_SEARCH_STEPS + 1)
times the capacity (:class:`TrialFields`).

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import taichi as ti

from tisim.contact.ncp.device_functions import (
    _BLOCK,
    _CHOSEN,
    _F0,
    _HALVINGS,
    LINE_SEARCH_STEPS,
    _frame,
    _merit_term,
    _project_trial,
    _row_product,
)

TRIALS = LINE_SEARCH_STEPS + 1


@ti.data_oriented
class TrialFields:
    """Per-trial copies of the forces, world-frame steps, gaps, slips and merit block sums
    for up to ``cap`` contacts in precision ``dtype`` (sums in f64)."""

    def __init__(self, cap: int, dtype):
        n = TRIALS * cap
        self.cap = cap
        self.nbcap = cap // _BLOCK + 1
        self.new = ti.field(dtype, shape=(n, 3))
        self.world = [ti.field(ti.f64, shape=n) for _ in range(3)]
        self.d1 = ti.field(dtype, shape=n)
        self.u1 = ti.field(dtype, shape=(n, 2))
        self.part = ti.field(ti.f64, shape=TRIALS * self.nbcap)


@ti.func
def trials(
    k: ti.i32,
    lam: ti.template(),
    dlam: ti.template(),
    mu: ti.template(),
    frames: ti.template(),
    epar: ti.template(),
    tf: ti.template(),
):
    """Each trial's projected forces and its step new - lambda in world coordinates (the
    first half of ``_apply`` op 2)."""
    cap = ti.static(tf.cap)
    for q in range(TRIALS * k):
        t = q // k
        i = q % k
        alpha = ti.cast(1.0, lam.dtype)
        for _ in range(t):
            alpha *= 0.5
        ln, l1, l2 = _project_trial(i, alpha, lam, dlam, mu)
        o = t * cap + i
        tf.new[o, 0] = ln
        tf.new[o, 1] = l1
        tf.new[o, 2] = l2
        step = ti.Vector(
            [
                ti.cast(ti.cast(ln - lam[i, 0], lam.dtype), ti.f64),
                ti.cast(ti.cast(l1 - lam[i, 1], lam.dtype), ti.f64),
                ti.cast(ti.cast(l2 - lam[i, 2], lam.dtype), ti.f64),
            ]
        )
        wv = _frame(frames, epar, 0, i).transpose() @ step
        for a in ti.static(range(3)):
            tf.world[a][o] = wv[a]


@ti.func
def responses(
    k: ti.i32,
    scale,
    inv_h,
    W: ti.template(),
    frames: ti.template(),
    epar: ti.template(),
    d: ti.template(),
    u: ti.template(),
    tf: ti.template(),
):
    """Each trial's response C step in the contact frames and its predicted gaps and
    slips (the second half of ``_apply`` op 2, then ``_predict``)."""
    cap = ti.static(tf.cap)
    for q in range(TRIALS * k):
        t = q // k
        i = q % k
        off = t * cap
        y = _row_product(i, k, W, tf.world[0], tf.world[1], tf.world[2], off)
        z = _frame(frames, epar, 0, i) @ (scale * y)
        o = off + i
        tf.d1[o] = d[i] + ti.cast(z[0], d.dtype)
        tf.u1[o, 0] = u[i, 0] + ti.cast(z[1], d.dtype) * inv_h
        tf.u1[o, 1] = u[i, 1] + ti.cast(z[2], d.dtype) * inv_h


@ti.func
def merits_and_choice(
    mode,
    k: ti.i32,
    h,
    r_n: ti.template(),
    r_t: ti.template(),
    mu: ti.template(),
    tf: ti.template(),
    sc: ti.template(),
):
    """Each trial's merit in the blocks of ``_merit``, then the first trial the
    sequential search accepts (merit below sc[_F0], or F0 = 0, or the last) into
    sc[_CHOSEN], its halvings added to sc[_HALVINGS]."""
    cap = ti.static(tf.cap)
    nbcap = ti.static(tf.nbcap)
    nb = (k + _BLOCK - 1) // _BLOCK
    for q in range(TRIALS * nb):
        t = q // nb
        b = q % nb
        off = t * cap
        acc = ti.f64(0.0)
        for i in range(b * _BLOCK, ti.min((b + 1) * _BLOCK, k)):
            o = off + i
            acc += _merit_term(
                mode, h, tf.d1[o], tf.u1[o, 0], tf.u1[o, 1], tf.new[o, 0], tf.new[o, 1], tf.new[o, 2],
                r_n[i], r_t[i], mu[i],
            )  # fmt: skip
        tf.part[t * nbcap + b] = acc
    for _ in range(1):
        if k > 0:
            f0 = sc[_F0]
            chosen = -1
            for t in range(TRIALS):
                if chosen < 0:
                    tot = ti.f64(0.0)
                    for b in range(nb):
                        tot += tf.part[t * nbcap + b]
                    if f0 == 0.0 or t == TRIALS - 1 or tot < f0:
                        chosen = t
            sc[_CHOSEN] = ti.cast(chosen, ti.f64)
            sc[_HALVINGS] += ti.cast(chosen, ti.f64)


@ti.func
def take_chosen(
    k: ti.i32, tf: ti.template(), sc: ti.template(), lam: ti.template(), d: ti.template(), u: ti.template()
):
    """(lambda, d, u) = the chosen trial's (the sequential search's commit)."""
    cap = ti.static(tf.cap)
    for i in range(k):
        o = ti.cast(sc[_CHOSEN], ti.i32) * cap + i
        for a in ti.static(range(3)):
            lam[i, a] = tf.new[o, a]
        d[i] = tf.d1[o]
        u[i, 0] = tf.u1[o, 0]
        u[i, 1] = tf.u1[o, 1]
