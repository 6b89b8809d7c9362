"""Checks of the ADMM midpoint integrator that a wrong implementation fails (notes §5.5-5.10).

Each check runs :class:`~tisim.solvers.admm.solver.SolverADMM` (or what ``solver_factory``
builds) on a tiny free spinning bar and returns a :class:`CheckResult`: the measured
statistic, the bound it is held to, and whether it passed. They are shared by
``tests/verification/test_admm_properties.py`` (the solver passes) and
``tests/verification/test_admm_mutations.py`` (plausible mistakes fail them).

* :func:`energy_trend` - no trend of the energy error over a long run (notes §5.6);
* :func:`convergence_order` - second order of the trajectory under h-halving (§5.7);
* :func:`reversibility` - N steps, velocities negated, N steps back (§5.8);
* :func:`sufficient_decrease` - the augmented Lagrangian does not increase over the ADMM
  iterations of a step at a large fixed rho (§2.8, §5.10);
* :func:`angular_momentum` - angular momentum of the free body to the ADMM tolerance (§5.5).

Every check needs converged steps: a step that stalls (even after the solver's retries)
ends the run and makes the check fail, with the count in ``details``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# Student t quantile t_{0.9995, 18} (two-sided 0.1 %, 20 blocks -> 18 degrees of freedom)
T_CRIT_18 = 3.922


@dataclass
class CheckResult:
    """name: the check; value: the measured statistic; bound: the limit it must respect
    (``passed`` says whether it did); details: the numbers behind it."""

    name: str
    value: float
    bound: float
    passed: bool
    details: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.name}: {self.value:.4g} (bound {self.bound:.4g}) {'pass' if self.passed else 'FAIL'}"


def spinning_bar(
    *,
    resolution=(1, 1, 1),
    dt: float = 0.01,
    tolerance: float = 1e-8,
    E: float = 1e4,
    material: str = "neo-hookean",
    size=(1.0, 0.2, 0.2),
    omega=(1.0, 0.0, 6.0),
    velocity=(0.3, -0.2, 0.1),
    **solver,
):
    """A free (no gravity, no contact), spinning and vibrating box: the scene of every check.
    resolution: cells per axis (5 tets per cell); dt: s; E: Young's modulus, Pa (nu = 0.3,
    density 1000 kg/m^3); solver: further ``[solver]`` keys."""
    from tisim.scene import scene_from_dict

    return scene_from_dict(
        {
            "sim": {"dt": dt, "substeps": 1, "gravity": [0.0, 0.0, 0.0]},
            # a cap well above what these steps need (tens of iterations), one retry with the same cap
            # and no halving: a step that stalls (it ends the check) costs at most twice the cap
            "solver": {
                "type": "admm",
                "tolerance": tolerance,
                "max_iterations": 1000,
                "retry_halvings": 0,
                "retry_iteration_factor": 1.0,
                **solver,
            },
            "objects": {
                "bar": {
                    "generator": "box",
                    "size": list(size),
                    "resolution": list(resolution),
                    "material": material,
                    "youngs_modulus": E,
                    "poisson_ratio": 0.3,
                    "density": 1000.0,
                    "angular_velocity": list(omega),
                    "velocity": list(velocity),
                }
            },
        }
    )


def _default_factory(model, config):
    from tisim.solvers.admm.solver import SolverADMM

    return SolverADMM(model, config)


SolverFactory = Callable[[object, object], object]


def _setup(scene, solver_factory: SolverFactory | None):
    from tisim.model import Model

    model = Model.from_scene(scene)
    return model, (solver_factory or _default_factory)(model, scene.solver)


def _advance(solver, a, b, dt: float, steps: int, each=None) -> tuple[object, object, int]:
    """``steps`` steps from state a (b is the spare), stopping at the first step that does not
    converge or when ``each(state, stats)`` returns True; returns (state, spare, 1 if a step
    did not converge else 0)."""
    for _ in range(steps):
        st = solver.step(a, b, dt)
        a, b = b, a
        if not st.converged or not a.is_finite():
            return a, b, 1
        if each is not None and each(a, st):
            break
    return a, b, 0


def _energy(model, energy, state) -> float:
    return 0.5 * float(model.mass @ np.einsum("ij,ij->i", state.velocities, state.velocities)) + energy.elastic(
        state.positions
    )


# the energy-trend scene: tumbling end over end at 2 rad/s (centrifugal strain ~5 %, radial
# vibration from the rest shape), see energy_trend
TREND_SCENE = {"omega": (0.0, 0.0, 2.0), "velocity": (0.0, 0.0, 0.0)}


def energy_trend(
    *,
    steps: int = 10_000,
    dt: float = 0.002,
    tolerance: float = 1e-10,
    blocks: int = 20,
    max_error: float = 1e-3,
    scene=None,
    solver_factory: SolverFactory | None = None,
) -> CheckResult:
    """No trend of the total energy error over ``steps`` steps (notes §5.6), and a bounded one.

    Default scene: the tiny bar tumbling at 2 rad/s (``TREND_SCENE``), tolerance 1e-10.
    Measured with these defaults: t = 1.6 over 10^4 steps of 2 ms (drift over the run 6e-8
    against a scatter of 1.4e-6); the same run at tolerance 1e-7 has t = 437 (slope
    -9e-7 /s: the unconverged part of each step, doubled by the velocity recursion, drifts),
    and the exact midpoint rule (Newton to 1e-14, 2000 steps) has the slope of the 1e-10
    run. On the faster bar of the other checks (6 rad/s with a 1 rad/s tilt) the midpoint
    rule itself drifts, at the same rate for tolerances 1e-7 and 1e-10 and by h^2 per unit
    time (1.1e-6 /s at h = 2 ms, 2.8e-5 /s at 10 ms): t = 7.8, that scene fails this check.

    e_k = (E_k - E_0) / E_0 with E = K + elastic energy (numpy energies of
    :mod:`tisim.materials`, independent of the Taichi kernels). The error oscillates, so
    consecutive values are strongly correlated and the ordinary least-squares standard
    error of the slope would be far too small. The run is cut into ``blocks`` equal blocks
    (each many oscillation periods long, so their means are close to independent) and a
    line is fitted to the block means: the statistic is t = slope / (its standard error),
    and the check passes when |t| < t_{0.9995, blocks - 2} (two-sided 0.1 %). ``details``
    also gives the drift over the run that the fit predicts, slope * T, next to the
    standard deviation of the error about the fit (the scatter). The run stops, and the check
    fails, as soon as |e_k| exceeds ``max_error`` (the midpoint rule's error is O(h^2)
    and bounded; a wrong scheme drifts past it long before the end).
    """
    from tisim.solvers.baselines.common import ModelEnergy

    if blocks != 20:
        raise ValueError("the critical value is tabulated for 20 blocks")
    scene = scene or spinning_bar(dt=dt, tolerance=tolerance, **TREND_SCENE)
    model, solver = _setup(scene, solver_factory)
    energy = ModelEnergy(model)
    a, b = model.initial_state(), model.initial_state()
    E0 = _energy(model, energy, a)
    err = np.empty(steps)
    k = [0]

    def rec(s, st):
        err[k[0]] = (_energy(model, energy, s) - E0) / E0
        k[0] += 1
        return not abs(err[k[0] - 1]) <= max_error

    _, _, bad = _advance(solver, a, b, dt, steps, rec)
    t = dt * np.arange(1, steps + 1)
    details = {
        "unconverged_steps": bad,
        "steps_done": k[0],
        "steps": steps,
        "dt": dt,
        "max_abs_error": float(np.abs(err[: k[0]]).max()) if k[0] else math.nan,
    }
    if k[0] < steps or not np.all(np.isfinite(err)):
        return CheckResult("energy trend |t|", math.inf, T_CRIT_18, False, details)
    slope, icpt = np.polyfit(t, err, 1)
    resid = err - (slope * t + icpt)
    tb = np.array([c.mean() for c in np.array_split(t, blocks)])
    eb = np.array([c.mean() for c in np.array_split(err, blocks)])
    sb, ib = np.polyfit(tb, eb, 1)
    rb = eb - (sb * tb + ib)
    se = math.sqrt(float(rb @ rb) / (blocks - 2) / float(np.sum((tb - tb.mean()) ** 2)))
    tstat = sb / se if se > 0 else (0.0 if sb == 0 else math.inf)
    details.update(
        slope_per_s=float(slope),
        drift_over_run=float(slope * (t[-1] - t[0])),
        scatter=float(resid.std()),
        block_slope_per_s=float(sb),
        block_se=se,
        amplitude=float(err.max() - err.min()),
        mean_error=float(err.mean()),
    )
    return CheckResult("energy trend |t|", abs(tstat), T_CRIT_18, abs(tstat) < T_CRIT_18 and bad == 0, details)


def convergence_order(
    *,
    T: float = 0.1,
    h0: float = 0.02,
    levels: int = 3,
    ref_divisor: int = 32,
    tolerance: float = 1e-11,
    low: float = 3.5,
    high: float = 4.5,
    scene_kw: dict | None = None,
    solver_factory: SolverFactory | None = None,
) -> CheckResult:
    """Second-order convergence of the trajectory (notes §5.7): the positions at time T with
    h = h0, h0/2, ..., h0/2^(levels-1) against a reference run at h0/ref_divisor; the
    error (max over vertices of |x_h(T) - x_ref(T)|) must shrink by a factor in [low, high]
    at every halving. With ref_divisor = 32 the reference's own error biases the ratios
    by under 2 % for a second-order method (C h^2 (1 - 1/1024) / ...). The statistic is
    the ratio farthest from 4."""
    scene_kw = scene_kw or {}
    hs = [h0 / 2**i for i in range(levels)]
    finals = []
    bad = 0
    for h in hs + [h0 / ref_divisor]:
        n = int(round(T / h))
        if abs(n * h - T) > 1e-9 * T:
            raise ValueError(f"T = {T} is not a whole number of steps of {h}")
        model, solver = _setup(spinning_bar(dt=h, tolerance=tolerance, **scene_kw), solver_factory)
        a, _, b_ = _advance(solver, model.initial_state(), model.initial_state(), h, n)
        bad += b_
        finals.append(a.positions.copy())
    ref = finals[-1]
    errs = [float(np.abs(x - ref).max()) for x in finals[:-1]]
    ratios = [errs[i] / errs[i + 1] if errs[i + 1] > 0 else math.inf for i in range(levels - 1)]
    worst = max(ratios, key=lambda r: abs(math.log(r / 4.0)) if r > 0 and math.isfinite(r) else math.inf)
    ok = all(low <= r <= high for r in ratios) and bad == 0
    return CheckResult(
        "order: error ratio under h-halving",
        worst,
        4.0,
        ok,
        {
            "h": hs,
            "errors": errs,
            "ratios": ratios,
            "low": low,
            "high": high,
            "unconverged_steps": bad,
            "observed_order": [math.log2(r) if r > 0 else math.nan for r in ratios],
        },
    )


def reversibility(
    *,
    steps: int = 50,
    dt: float = 0.01,
    tolerances=(1e-6, 1e-9),
    factor: float = 10.0,
    min_scaling: float = 30.0,
    scene_kw: dict | None = None,
    solver_factory: SolverFactory | None = None,
) -> CheckResult:
    """Time reversibility (notes §5.8): ``steps`` steps, velocities negated, ``steps`` steps
    back; the distance to the start, max |x - x0| / (bounding-box diagonal), must be below
    ``factor`` x the ADMM tolerance for each tolerance in ``tolerances``, and the error must
    actually scale with the tolerance: error(loosest) / error(tightest) >= ``min_scaling``
    (the tolerances differ by 1000x; a scheme that is not symmetric has an error set by h
    that no tolerance removes). The statistic is the largest error / tolerance."""
    scene_kw = scene_kw or {}
    errs, bad = [], 0
    for tol in tolerances:
        model, solver = _setup(spinning_bar(dt=dt, tolerance=tol, **scene_kw), solver_factory)
        a, b = model.initial_state(), model.initial_state()
        x0, v0 = a.positions.copy(), a.velocities.copy()
        diag = float(np.linalg.norm(np.ptp(x0, axis=0)))
        a, b, b1 = _advance(solver, a, b, dt, steps)
        moved = float(np.abs(a.positions - x0).max()) / diag
        a.velocities *= -1.0
        a, b, b2 = _advance(solver, a, b, dt, steps)
        bad += b1 + b2
        errs.append(float(np.abs(a.positions - x0).max()) / diag)
        vel_err = float(np.abs(-a.velocities - v0).max()) / float(np.abs(v0).max())
    rel = [e / tol for e, tol in zip(errs, tolerances)]
    scaling = errs[0] / errs[-1] if errs[-1] > 0 else math.inf
    ok = max(rel) <= factor and scaling >= min_scaling and bad == 0 and moved > 1e-2
    return CheckResult(
        "reversibility: error / tolerance",
        max(rel),
        factor,
        ok,
        {
            "tolerances": list(tolerances),
            "errors": errs,
            "scaling": scaling,
            "min_scaling": min_scaling,
            "moved": moved,
            "velocity_error_tightest": vel_err,
            "unconverged_steps": bad,
        },
    )


def augmented_lagrangian(solver, model, energy, x0, v0, h: float, q) -> float:
    """Lambda(q, R, S, Y) of notes §2.5 at the solver's current splitting, J (no gravity or
    contact): |q - z|_M^2 / (2 h^2) + sum_i w_i psi(S_i) + <Y_i, F_i - R_i S_i> +
    rho_i/2 |F_i - R_i S_i|^2, F_i the midpoint deformation gradient; psi from
    :mod:`tisim.materials` (the notes' energy of each material)."""
    from tisim import materials

    sp = solver.splitting()
    R, S, Y, rho = sp["R"], sp["S"], sp["Y"], sp["rho"]
    z = x0 + h * v0
    d = q - z
    val = 0.5 / h**2 * float(model.mass @ np.einsum("ij,ij->i", d, d))
    F = energy.F(0.5 * (x0 + q))
    D = F - R @ S
    psi = np.empty(len(F))
    for name, idx in energy.groups:  # ModelEnergy's names are already ADMM's energies (energy_name)
        psi[idx] = materials.energy_density(name, S[idx], energy.mu[idx], energy.lam[idx])
    val += float(np.sum(energy.w * psi))
    val += float(np.sum(Y * D)) + 0.5 * float(rho @ np.einsum("eij,eij->e", D, D))
    return val


def sufficient_decrease(
    *,
    warmup: int = 5,
    dt: float = 0.01,
    rho_scale: float = 20.0,
    iterations: int = 60,
    scene_kw: dict | None = None,
    solver_factory: SolverFactory | None = None,
) -> CheckResult:
    """Sufficient decrease (notes §2.8, §5.10): at a large fixed rho (``rho_scale`` x the rest
    stiffness, no residual balancing, no local raise) the augmented Lagrangian Lambda does
    not increase from one ADMM iteration to the next. After ``warmup`` steps (a deformed,
    moving state) one step runs ``iterations`` iterations (tolerance 1e-14, so none stops
    early), and Lambda is evaluated after each full iteration (q-, R-, S- and dual steps).
    The statistic is the largest increase relative to |Lambda|, bound 1e-10 (round-off);
    the check also needs Lambda to fall by more than 1e-8 |Lambda| over the step (a
    constant Lambda would pass trivially)."""
    from tisim.solvers.baselines.common import ModelEnergy

    scene_kw = {"adaptive_rho": False, "local_rho": False, **(scene_kw or {})}
    sc = spinning_bar(dt=dt, tolerance=1e-8, rho_scale=rho_scale, **scene_kw)
    model, solver = _setup(sc, solver_factory)
    energy = ModelEnergy(model)
    a, b, bad = _advance(solver, model.initial_state(), model.initial_state(), dt, warmup)
    x0, v0 = a.positions.copy(), a.velocities.copy()
    values: list[float] = []
    solver.iteration_callback = lambda it, q: values.append(augmented_lagrangian(solver, model, energy, x0, v0, dt, q))
    solver.tolerance = solver.dual_tolerance = 1e-14
    solver.max_iterations = iterations
    try:
        solver._attempt(a, b, dt, x0, v0)  # one attempt, without the stall retries
    finally:
        solver.iteration_callback = None
    lam = np.array(values)
    scale = float(np.abs(lam).max())
    incr = np.diff(lam) / scale
    worst = float(incr.max()) if len(incr) else math.inf
    fall = float(lam[0] - lam[-1]) / scale if len(lam) else 0.0
    ok = worst <= 1e-10 and fall > 1e-8 and bad == 0 and np.all(np.isfinite(lam))
    return CheckResult(
        "sufficient decrease: max relative increase of Lambda",
        worst,
        1e-10,
        ok,
        {"lagrangian": lam.tolist(), "relative_fall": fall, "unconverged_warmup_steps": bad},
    )


def angular_momentum(
    *,
    steps: int = 200,
    dt: float = 0.01,
    tolerance: float = 1e-8,
    bound: float = 1e-6,
    scene_kw: dict | None = None,
    solver_factory: SolverFactory | None = None,
) -> CheckResult:
    """Angular momentum of the free spinning bar (notes §5.5): max_k |L_k - L_0| / |L_0| over
    ``steps`` steps, with L = sum m x x v of the recursion velocity, below ``bound`` (the
    midpoint rule conserves L exactly; the ADMM tolerance sets the level: the test of the
    scaling with the tolerance is in tests/verification/test_admm.py)."""
    scene_kw = scene_kw or {}
    model, solver = _setup(spinning_bar(dt=dt, tolerance=tolerance, **scene_kw), solver_factory)
    m = model.mass
    a = model.initial_state()
    L0 = np.sum(m[:, None] * np.cross(a.positions, a.velocities), axis=0)
    worst = [0.0]

    def rec(s, st):
        L = np.sum(m[:, None] * np.cross(s.positions, s.velocities), axis=0)
        worst[0] = max(worst[0], float(np.linalg.norm(L - L0)))

    _, _, bad = _advance(solver, a, model.initial_state(), dt, steps, rec)
    drift = worst[0] / float(np.linalg.norm(L0))
    if not math.isfinite(drift):
        drift = math.inf
    return CheckResult(
        "angular momentum: max |L - L0| / |L0|",
        drift,
        bound,
        drift <= bound and bad == 0,
        {"unconverged_steps": bad, "steps": steps},
    )
