"""Finite-difference derivative checkers, shipped for the tests of any solver.

``check_gradient(f, grad, x)`` compares an analytic gradient with central
finite differences of ``f``; ``check_hessian(grad, hess, x)`` compares an
analytic Hessian with central differences of ``grad``. Both check

* directional derivatives along ``directions`` random unit directions, and
* the full finite-difference gradient / Hessian (one coordinate direction per
  entry of ``x``) when ``x.size <= full_max``,

and they refuse to pass a zero derivative: an analytic derivative that is
(numerically) zero where the finite differences are clearly not always fails,
whatever the tolerances, and with ``require_nonzero=True`` (the default) a
derivative that is zero at ``x`` fails even when the finite differences agree
(a stub that returns zeros at a critical point must not pass by accident;
check such points with ``require_nonzero=False`` explicitly).

Tolerance: an entry passes when ``|analytic - fd| <= atol + rtol * scale``,
``scale`` being the largest magnitude of the finite-difference derivative.
With ``atol=None`` the absolute tolerance is the estimated round-off of the
central difference, ``16 * machine_eps * (max|value| + max|x| * slope) / eps``
(a central difference of values of size V carries an error of about
machine_eps * V / eps, and rounding the perturbed point x + eps d adds
machine_eps * |x| * slope / eps, the slope estimated from the spread of the
values; the truncation error eps^2 f''' / 6 is far below rtol for eps = 1e-6).
The same level decides what counts as "numerically zero".

Like MuJoCo's derivative checker, these are plain functions on numpy arrays, so
solver tests use them directly:

    from tisim.testing import check_gradient
    res = check_gradient(energy, gradient, x0)   # raises AssertionError on failure
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["CheckResult", "check_gradient", "check_hessian"]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of a derivative check.

    max_abs_error: largest |analytic - finite difference| over all compared entries.
    max_rel_error: max_abs_error / scale (scale = largest |finite difference|; inf if 0).
    atol, rtol: the tolerances used (atol after the automatic round-off estimate).
    fd_max, analytic_max: largest magnitudes of the finite-difference and analytic derivative.
    directions: number of random directions compared.
    full: whether the full finite-difference gradient/Hessian was compared.
    passed: whether every criterion held.
    message: why it failed ("" when it passed).
    """

    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    fd_max: float
    analytic_max: float
    directions: int
    full: bool
    passed: bool
    message: str = ""

    def __str__(self) -> str:
        status = "passed" if self.passed else f"FAILED: {self.message}"
        return (
            f"{status} (max abs error {self.max_abs_error:.3e}, max rel error "
            f"{self.max_rel_error:.3e}, |fd|max {self.fd_max:.3e}, |analytic|max "
            f"{self.analytic_max:.3e}, atol {self.atol:.3e}, rtol {self.rtol:.1e}, "
            f"{self.directions} directions, full={self.full})"
        )


def _rng(rng) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(0 if rng is None else rng)


def _unit_directions(rng: np.random.Generator, count: int, n: int) -> np.ndarray:
    d = rng.standard_normal((count, n))
    return d / np.linalg.norm(d, axis=1, keepdims=True)


def _finish(
    kind: str,
    pairs: list[tuple[str, np.ndarray, np.ndarray]],
    analytic: np.ndarray,
    atol: float,
    rtol: float,
    noise: float,
    require_nonzero: bool,
    directions: int,
    full: bool,
    raise_on_failure: bool,
) -> CheckResult:
    """Compare (label, analytic, fd) pairs and apply the zero guards."""
    fd_max = max(float(np.max(np.abs(fd), initial=0.0)) for _, _, fd in pairs)
    an_max = float(np.max(np.abs(analytic), initial=0.0))
    if not np.all(np.isfinite(analytic)):
        msg = f"analytic {kind} has non-finite entries"
        return _result(np.inf, np.inf, atol, rtol, fd_max, an_max, directions, full, msg, raise_on_failure)
    scale = fd_max
    bound = atol + rtol * scale
    max_abs = 0.0
    failures = []
    for label, a, fd in pairs:
        if not np.all(np.isfinite(fd)):
            failures.append(f"finite differences of {label} are not finite")
            continue
        err = np.abs(a - fd)
        k = int(np.argmax(err)) if err.size else 0
        e = float(err.flat[k]) if err.size else 0.0
        max_abs = max(max_abs, e)
        if e > bound:
            failures.append(
                f"{label}: error {e:.3e} > atol + rtol*scale = {bound:.3e} at entry "
                f"{np.unravel_index(k, err.shape)} (analytic {a.flat[k]:.9e}, finite difference {fd.flat[k]:.9e})"
            )
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else np.inf)
    # Zero guards. "Numerically zero" means no larger than the resolution of the
    # finite differences themselves (their round-off level `noise`).
    an_zero = an_max <= noise
    fd_nonzero = fd_max > 100.0 * noise
    if an_zero and fd_nonzero:
        failures.insert(
            0,
            f"analytic {kind} is (numerically) zero (max |.| = {an_max:.3e}) but the finite "
            f"differences are not (max |.| = {fd_max:.3e}); a zero {kind} never passes",
        )
    elif require_nonzero and an_zero:
        failures.insert(
            0,
            f"analytic {kind} is (numerically) zero at x (max |.| = {an_max:.3e} <= round-off "
            f"level {noise:.3e}); require_nonzero=True refuses this. Check at a point where the "
            f"{kind} is not zero, or pass require_nonzero=False for a known critical point",
        )
    msg = "; ".join(failures)
    return _result(max_abs, rel, atol, rtol, fd_max, an_max, directions, full, msg, raise_on_failure)


def _result(max_abs, rel, atol, rtol, fd_max, an_max, directions, full, msg, raise_on_failure):
    res = CheckResult(
        max_abs_error=float(max_abs),
        max_rel_error=float(rel),
        atol=float(atol),
        rtol=float(rtol),
        fd_max=float(fd_max),
        analytic_max=float(an_max),
        directions=int(directions),
        full=bool(full),
        passed=not msg,
        message=msg,
    )
    if msg and raise_on_failure:
        raise AssertionError(f"derivative check {res}")
    return res


def check_gradient(
    f: Callable[[np.ndarray], float],
    grad: Callable[[np.ndarray], np.ndarray],
    x,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float | None = None,
    rng: np.random.Generator | int | None = None,
    directions: int = 8,
    full_max: int = 64,
    require_nonzero: bool = True,
    value_scale: float = 0.0,
    raise_on_failure: bool = True,
) -> CheckResult:
    """Check ``grad(x)`` against central finite differences of the scalar ``f``.

    f: x -> float, x of the shape of ``x`` (any shape; it is passed unflattened).
    grad: x -> array with x.size entries (any shape; compared flattened).
    x: the point, array-like of floats; not modified.
    eps: finite-difference step (absolute, in the units of x).
    rtol, atol: tolerance |analytic - fd| <= atol + rtol * max|fd|;
        atol=None estimates the round-off level of the differences (see module doc).
    rng: Generator or seed for the random directions (default seed 0, reproducible).
    directions: number of random unit directions d, comparing grad.d with
        (f(x + eps d) - f(x - eps d)) / (2 eps).
    full_max: also compare every coordinate of the gradient when x.size <= full_max.
    require_nonzero: fail when the analytic gradient is zero (default True).
    value_scale: magnitude of the terms f is computed from, for the round-off
        estimate (default: max |f| over the evaluated points). Raise it when f
        is a small difference of large terms, e.g. ~3 mu for mu/2 (I_C - 3) near
        a rest state, where the finite differences are mostly round-off.
    raise_on_failure: raise AssertionError (default) or return a failed CheckResult.

    Returns a CheckResult. An analytic gradient that is numerically zero where
    the finite differences are not always fails.
    """
    x0 = np.array(x, dtype=np.float64)
    shape, n = x0.shape, x0.size
    g = np.asarray(grad(x0.copy()), dtype=np.float64).ravel()
    if g.size != n:
        raise ValueError(f"grad returned {g.size} entries for x with {n}")
    fvals = [float(f(x0.copy()))]

    def fd_along(d: np.ndarray) -> float:
        fp = float(f((x0.ravel() + eps * d).reshape(shape)))
        fm = float(f((x0.ravel() - eps * d).reshape(shape)))
        fvals.extend((fp, fm))
        return (fp - fm) / (2.0 * eps)

    gen = _rng(rng)
    D = _unit_directions(gen, directions, n) if directions > 0 else np.zeros((0, n))
    dir_fd = np.array([fd_along(d) for d in D])
    dir_an = D @ g
    pairs = [("directional derivative", dir_an, dir_fd)]
    full = n <= full_max
    if full:
        E = np.eye(n)
        full_fd = np.array([fd_along(E[i]) for i in range(n)])
        pairs.append(("gradient", g, full_fd))
    fin = np.array([v for v in fvals if np.isfinite(v)])
    fscale = float(np.max(np.abs(fin), initial=0.0))
    # Round-off of the differences: of the values themselves (machine_eps * |f|)
    # and of the perturbed points (machine_eps * |x| times the slope, estimated
    # from the spread of the values), both divided by the step.
    slope = float(np.max(np.abs(fin - fvals[0]), initial=0.0)) / eps if np.isfinite(fvals[0]) else 0.0
    xscale = float(np.max(np.abs(x0), initial=0.0))
    noise = 16.0 * np.finfo(np.float64).eps * (max(fscale, value_scale) + xscale * slope) / eps
    atol_eff = noise if atol is None else float(atol)
    return _finish(
        "gradient",
        pairs,
        g,
        atol_eff,
        rtol,
        max(noise, np.finfo(np.float64).tiny),
        require_nonzero,
        directions,
        full,
        raise_on_failure,
    )


def check_hessian(
    grad: Callable[[np.ndarray], np.ndarray],
    hess: Callable[[np.ndarray], np.ndarray],
    x,
    *,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float | None = None,
    rng: np.random.Generator | int | None = None,
    directions: int = 8,
    full_max: int = 64,
    require_nonzero: bool = True,
    symmetric: bool = True,
    value_scale: float = 0.0,
    raise_on_failure: bool = True,
) -> CheckResult:
    """Check ``hess(x)`` against central finite differences of ``grad``.

    grad: x -> array with n = x.size entries (compared flattened).
    hess: x -> array with n*n entries, reshaped to (n, n) with
        H[i, j] = d grad_i / d x_j (x flattened in C order).
    Directional check: H d against (grad(x + eps d) - grad(x - eps d)) / (2 eps)
    for ``directions`` random unit d; full check: every column when n <= full_max.
    symmetric: also require |H - H^T| <= atol + rtol * max|fd| (a Hessian of a
        scalar is symmetric; pass False for Jacobians of non-gradient maps).
    value_scale: magnitude of the terms grad is computed from (default: max |grad|).
    Other arguments as in :func:`check_gradient`; require_nonzero fails on an
    all-zero Hessian.
    """
    x0 = np.array(x, dtype=np.float64)
    shape, n = x0.shape, x0.size
    H = np.asarray(hess(x0.copy()), dtype=np.float64)
    if H.size != n * n:
        raise ValueError(f"hess returned {H.size} entries for x with {n} (expected {n * n})")
    H = H.reshape(n, n)
    g0 = np.asarray(grad(x0.copy()), dtype=np.float64).ravel()
    if g0.size != n:
        raise ValueError(f"grad returned {g0.size} entries for x with {n}")
    gscale = [float(np.max(np.abs(g0), initial=0.0))]
    gspread = [0.0]

    def fd_along(d: np.ndarray) -> np.ndarray:
        gp = np.asarray(grad((x0.ravel() + eps * d).reshape(shape)), dtype=np.float64).ravel()
        gm = np.asarray(grad((x0.ravel() - eps * d).reshape(shape)), dtype=np.float64).ravel()
        for v in (gp, gm):
            ok = np.isfinite(v) & np.isfinite(g0)
            gscale.append(float(np.max(np.abs(v[ok]), initial=0.0)))
            gspread.append(float(np.max(np.abs(v[ok] - g0[ok]), initial=0.0)))
        return (gp - gm) / (2.0 * eps)

    gen = _rng(rng)
    D = _unit_directions(gen, directions, n) if directions > 0 else np.zeros((0, n))
    dir_fd = np.array([fd_along(d) for d in D]).reshape(len(D), n)
    dir_an = D @ H.T  # row k: H d_k
    pairs = [("Hessian-vector product", dir_an, dir_fd)]
    full = n <= full_max
    if full:
        E = np.eye(n)
        cols = np.array([fd_along(E[j]) for j in range(n)]).T  # column j: d grad / d x_j
        pairs.append(("Hessian", H, cols))
    xscale = float(np.max(np.abs(x0), initial=0.0))
    # as in check_gradient: round-off of the values and of the perturbed points
    noise = 16.0 * np.finfo(np.float64).eps * (max(max(gscale), value_scale) + xscale * max(gspread) / eps) / eps
    atol_eff = noise if atol is None else float(atol)
    res = _finish(
        "Hessian",
        pairs,
        H,
        atol_eff,
        rtol,
        max(noise, np.finfo(np.float64).tiny),
        require_nonzero,
        directions,
        full,
        raise_on_failure=False,
    )
    msg = res.message
    if symmetric and np.all(np.isfinite(H)):
        asym = float(np.max(np.abs(H - H.T), initial=0.0))
        bound = atol_eff + rtol * res.fd_max
        if asym > bound:
            extra = f"analytic Hessian is not symmetric: max |H - H^T| = {asym:.3e} > {bound:.3e}"
            msg = f"{msg}; {extra}" if msg else extra
    return _result(
        res.max_abs_error,
        res.max_rel_error,
        res.atol,
        res.rtol,
        res.fd_max,
        res.analytic_max,
        res.directions,
        res.full,
        msg,
        raise_on_failure,
    )


# ---------------------------------------------------------------------------------------
# An independent intersection oracle for cloth runs (needs ipctk, a test dependency)


@dataclass(frozen=True)
class IPCReport:
    """What the IPC Toolkit finds in one state (and one step) of a cloth run.

    intersecting: ipctk.has_intersections. min_distance: smallest distance between
    non-adjacent primitives (m; inf when none is within ``probe``). step_free: the
    linear step from the previous state is collision-free by ipctk's tight-inclusion
    CCD (None without a previous state). plane_distance: smallest vertex distance to
    the analytic planes and colliders (m; inf without any).
    """

    intersecting: bool
    min_distance: float
    step_free: bool | None
    plane_distance: float


def ipc_report(
    vertices,
    faces,
    previous=None,
    *,
    probe: float = 1e-2,
    planes=(),
    plane_rows: int | None = None,
    edges=None,
    colliders=(),
) -> IPCReport:
    """Check a surface state with ipctk: vertices (n, 3) m, faces (m, 3) (cloth and
    obstacle triangles together), previous (n, 3) the state one step earlier, planes
    [(point, unit normal), ...] checked analytically for the first ``plane_rows``
    vertices (default all; obstacles may rest on a plane, the cloth may not).
    edges: (e, 2) every edge (default: the faces' edges; the cloth solver's
    ``edges_all`` adds the line sets of box edges and cylinder rims). colliders:
    analytic ``Collider``s measured like the planes, with ``Collider.distance``."""
    import ipctk

    from tisim.geometry.topology import edges as mesh_edges

    V = np.asfortranarray(np.asarray(vertices, dtype=np.float64))
    F = np.asfortranarray(np.asarray(faces, dtype=np.int32))
    E = mesh_edges(F) if edges is None else np.asarray(edges).reshape(-1, 2)
    E = np.asfortranarray(E.astype(np.int32))
    mesh = ipctk.CollisionMesh(V, E, F)
    inter = bool(ipctk.has_intersections(mesh, V))
    col = ipctk.NormalCollisions()
    col.build(mesh, V, probe)
    dmin = float(col.compute_minimum_distance(mesh, V)) if len(col) else float("inf")
    dmin = float(np.sqrt(dmin)) if np.isfinite(dmin) else dmin  # ipctk reports it squared
    step = None
    if previous is not None:
        P = np.asfortranarray(np.asarray(previous, dtype=np.float64))
        step = bool(ipctk.is_step_collision_free(mesh, P, V))
    pd = float("inf")
    rows = V[: len(V) if plane_rows is None else plane_rows]
    for p, n in planes:
        pd = min(pd, float(((rows - np.asarray(p)) @ np.asarray(n)).min()))
    for c in colliders:
        pd = min(pd, float(c.distance(rows).min()))
    return IPCReport(inter, dmin, step, pd)


def checkpoint_differences(dir_a, dir_b, levels: int, frames: int) -> list:
    """[level, frame, array name] of every checkpoint array of two refine outputs
    (``DIR/level_L/checkpoints/frame_NNNNN.npz``, frames 0..frames) that is not equal
    bit for bit; [] when the runs agree exactly (the bit-exactness tests of refine)."""
    from pathlib import Path

    diff = []
    for level in range(levels):
        for f in range(frames + 1):
            name = Path(f"level_{level}") / "checkpoints" / f"frame_{f:05d}.npz"
            a, b = np.load(Path(dir_a) / name), np.load(Path(dir_b) / name)
            diff += [[level, f, k] for k in a.files if not np.array_equal(a[k], b[k])]
    return diff
