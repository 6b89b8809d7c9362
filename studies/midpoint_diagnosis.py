"""Issue 13: is the energy drift and blow-up of the ADMM midpoint integrator an implementation
fault or the midpoint rule itself?

Runs ``demos/spinning-bar.toml`` with one step per frame at ``--dt`` (default 0.01 s) and

1. checks that the energy ADMM measures is the energy whose gradient its step uses: the
   Taichi kernels (energy, forces) against the numpy energies of ``tisim.materials``
   (an independent implementation: same material, Lame parameters, one-point quadrature)
   and against central finite differences of the kernel energy;
2. integrates the same run with ADMM and with an independent implicit-midpoint solver
   (Newton on M (q - z)/h^2 + 1/2 grad E(q_mid) = 0 with numpy energies, converged to
   round-off: :class:`tisim.solvers.admm.energy_momentum.MidpointNewton`), and solves
   single steps from ADMM's own states with Newton (local agreement);
3. runs the energy-momentum option (``solver.integrator = "energy-momentum"``) of the same
   solver for ``--em-steps`` steps (energy, momenta, inversion, capped steps).

Writes ``midpoint-diagnosis.json`` and ``.png`` into ``--out`` (default ``out/midpoint-diagnosis/``;
the kept ones are ``studies/results/midpoint-diagnosis/`` and ``docs/midpoint-diagnosis.png``); trajectories
are cached in ``out/midpoint-diagnosis/cache/`` (``--fresh`` recomputes them).

    nice -n 10 .venv/bin/python studies/midpoint_diagnosis.py [--dt 0.01] [--steps 2300] [--em-steps 4000]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("midpoint_diagnosis")


def _scene(dt: float, integrator: str = "midpoint"):
    from tisim.scene import load_scene

    return load_scene(
        ROOT / "demos" / "spinning-bar.toml", [f"sim.dt={dt}", "sim.substeps=1", f"solver.integrator={integrator}"]
    )


def _quantities(m, x, v):
    return (0.5 * float(m @ np.einsum("ij,ij->i", v, v)), m @ v, np.sum(m[:, None] * np.cross(x, v), axis=0))


def energy_consistency(model, solver, states: dict) -> dict:
    """Kernel energy/forces (what ADMM measures and steps with) against the numpy energies of
    tisim.materials (same Lame parameters, one-point quadrature) and central finite differences
    of the kernel energy, at the given states {label: positions (n, 3)}."""
    from tisim.solvers.baselines.common import ModelEnergy
    from tisim.testing import check_gradient

    me = ModelEnergy(model)
    out = {
        "lame_scene_Pa": list(model.scene.objects["bar"].lame),
        "lame_model_Pa": [float(model.element_mu[0]), float(model.element_lam[0])],
        "states": [],
    }
    for label, x in states.items():
        e_k = solver.potential_energy(x)
        e_np = me.elastic(x)
        f_k = -solver.elastic_forces(x)
        f_np = me.elastic_gradient(x)
        fd = check_gradient(
            lambda y: solver.potential_energy(y.reshape(-1, 3)),
            lambda y: -solver.elastic_forces(y.reshape(-1, 3)).ravel(),
            x.ravel(),
            raise_on_failure=False,
        )
        out["states"].append(
            {
                "state": label,
                "energy_kernel_J": e_k,
                "energy_numpy_J": e_np,
                "energy_rel_diff": abs(e_k - e_np) / max(abs(e_np), 1e-300),
                "gradient_rel_diff": float(np.abs(f_k - f_np).max() / np.abs(f_np).max()),
                "fd_check": {"passed": bool(fd.passed), "max_rel_error": float(fd.max_rel_error)},
            }
        )
    return out


def run_admm(dt: float, steps: int, cache: Path, fresh: bool):
    path = cache / f"admm_dt{dt:g}.npz"
    if path.exists() and not fresh:
        d = np.load(path)
        return d["X"], d["V"], d["rows"]
    from tisim.model import Model
    from tisim.solvers.admm.solver import SolverADMM

    sc = _scene(dt)
    model = Model.from_scene(sc)
    s = SolverADMM(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    X, V, rows = [a.positions.copy()], [a.velocities.copy()], []
    inf_steps = 0
    for k in range(steps):
        st = s.step(a, b, dt)
        a, b = b, a
        rows.append(
            (k + 1, st.potential, st.iterations, float(st.converged), st.extra["min_det"], st.extra["min_det_mid"])
        )
        X.append(a.positions.copy())
        V.append(a.velocities.copy())
        inf_steps = inf_steps + 1 if not np.isfinite(st.potential) else 0
        if k % 200 == 0:
            log.info("ADMM dt=%g step %d: potential %.6g J, %d iterations", dt, k + 1, st.potential, st.iterations)
        if inf_steps >= 20:  # blown up: the rest is noise
            break
    X, V, rows = np.array(X), np.array(V), np.array(rows)
    np.savez_compressed(path, X=X, V=V, rows=rows)
    return X, V, rows


def run_newton(model, scheme: str, dt: float, steps: int, cache: Path, fresh: bool, stop_on_inf: bool = True):
    from tisim.solvers.admm.energy_momentum import MidpointNewton

    path = cache / f"newton_{scheme}_dt{dt:g}_{steps}.npz"
    if path.exists() and not fresh:
        d = np.load(path)
        return d["X"], d["V"], d["rows"]
    nm = MidpointNewton(model, scheme, tolerance=1e-13 if scheme == "midpoint" else 1e-10)
    x, v = model.initial_positions.copy(), model.initial_state().velocities.copy()
    X, V, rows = [x.copy()], [v.copy()], []
    inf_steps = 0
    t0 = time.perf_counter()
    for k in range(steps):
        r = nm.solve(x, v, dt, k * dt)
        v = 2.0 / dt * (r.positions - x) - v
        x = r.positions
        pot = nm.energy.elastic(x)
        J = np.linalg.det(nm.energy.F(x))
        rows.append(
            (
                k + 1,
                pot,
                r.iterations,
                float(r.converged),
                float(J.min()),
                float(np.linalg.det(nm.energy.F(0.5 * (X[-1] + x))).min()),
            )
        )
        X.append(x.copy())
        V.append(v.copy())
        inf_steps = inf_steps + 1 if not np.isfinite(pot) else 0
        if k % 200 == 0:
            log.info(
                "Newton %s dt=%g step %d: potential %.6g J, %d iterations (%.0f s)",
                scheme,
                dt,
                k + 1,
                pot,
                r.iterations,
                time.perf_counter() - t0,
            )
        if stop_on_inf and inf_steps >= 20:
            break
    X, V, rows = np.array(X), np.array(V), np.array(rows)
    np.savez_compressed(path, X=X, V=V, rows=rows)
    return X, V, rows


def summarise(model, X, V, rows, dt) -> dict:
    m = model.mass
    K = np.array([_quantities(m, x, v)[0] for x, v in zip(X[1:], V[1:])])
    E = K + rows[:, 1]
    P = np.array([m @ v for v in V])
    L = np.array([_quantities(m, x, v)[2] for x, v in zip(X, V)])
    E0 = _quantities(m, X[0], V[0])[0] + float(rows[0, 1] * 0)  # potential at rest is 0
    fin = np.isfinite(E)
    first_inf = int(rows[~fin, 0][0]) if np.any(~fin) else None
    first_inv = int(rows[rows[:, 4] <= 0, 0][0]) if np.any(rows[:, 4] <= 0) else None
    first_cap = int(rows[rows[:, 3] == 0, 0][0]) if np.any(rows[:, 3] == 0) else None
    ok = np.arange(len(E)) < (np.argmax(~fin) if first_inf else len(E))
    ok &= np.isfinite(E)
    steps = rows[:, 0]
    # linear trend over the finite part vs the scatter of its residuals (the criterion)
    if ok.sum() > 10:
        c = np.polyfit(steps[ok], E[ok], 1)
        resid = E[ok] - np.polyval(c, steps[ok])
        trend = float(c[0] * (steps[ok][-1] - steps[ok][0]))
        scatter = float(resid.std())
    else:
        trend = scatter = float("nan")
    return {
        "dt": dt,
        "steps": int(len(rows)),
        "E0_J": E0,
        "E_at": {str(k): float(E[k - 1]) for k in (100, 500, 1000, 2000, 2100, 2110, 3000, 4000) if k <= len(E)},
        "max_rel_energy_error_finite": float(np.nanmax(np.abs(E[ok] - E0)) / E0) if ok.any() else None,
        "trend_J": trend,
        "residual_scatter_J": scatter,
        "first_infinite_energy_step": first_inf,
        "first_inverted_end_state_step": first_inv,
        "first_capped_step": first_cap,
        "capped_steps": int(np.sum(rows[:, 3] == 0)),
        "min_det_end_before_blowup": float(rows[ok, 4].min()) if ok.any() else None,
        "min_det_mid_overall": float(np.nanmin(rows[:, 5])),
        "max_iterations": int(rows[:, 2].max()),
        "linear_momentum_max_change": float(np.abs(P - P[0]).max()),
        "angular_momentum_max_rel_change": float(np.abs(L - L[0]).max() / np.linalg.norm(L[0])),
        "E": E,
        "steps_arr": steps,
    }


def blowup_steps(model, sc, X, V, dt, start: int, steps: int, cache: Path, fresh: bool) -> list[dict]:
    """ADMM continued from its own state at step ``start`` (where the end-of-step state is about to
    invert), and for every step a Newton midpoint solve from the same (x_k, v_k): does the
    midpoint equation still have a solution that ADMM fails to find?"""
    from tisim.solvers.admm.energy_momentum import MidpointNewton
    from tisim.solvers.admm.solver import SolverADMM

    path = cache / f"blowup_dt{dt:g}_{start}_{steps}.json"
    if path.exists() and not fresh:
        return json.loads(path.read_text())
    s = SolverADMM(model, sc.solver)
    nm = MidpointNewton(model, "midpoint", tolerance=1e-13)
    a, b = model.initial_state(), model.initial_state()
    a.positions[:] = X[start]
    a.velocities[:] = V[start]
    a.time = start * dt
    m = model.mass
    out = []
    for k in range(start, start + steps):
        x0, v0 = a.positions.copy(), a.velocities.copy()
        st = s.step(a, b, dt)
        a, b = b, a
        r = nm.solve(x0, v0, dt, k * dt)  # warm start: the previous step's acceleration
        v_n = 2.0 / dt * (r.positions - x0) - v0
        out.append(
            {
                "step": k + 1,
                "admm_iterations": st.iterations,
                "admm_converged": bool(st.converged),
                "admm_energy_J": 0.5 * float(m @ (a.velocities**2).sum(1)) + st.potential,
                "admm_min_det_end": st.extra["min_det"],
                "admm_min_det_start": float(np.linalg.det(nm.energy.F(x0)).min()),
                "newton_iterations": r.iterations,
                "newton_converged": bool(r.converged),
                "newton_energy_J": 0.5 * float(m @ (v_n**2).sum(1)) + nm.energy.elastic(r.positions),
                "max_dx_rel": float(np.abs(r.positions - a.positions).max() / nm.scale),
            }
        )
        log.info(
            "blow-up step %d: ADMM %d it (%s), E %.5g; Newton %d it, E %.5g; |dx| %.2g",
            k + 1,
            st.iterations,
            st.converged,
            out[-1]["admm_energy_J"],
            r.iterations,
            out[-1]["newton_energy_J"],
            out[-1]["max_dx_rel"],
        )
        if not np.isfinite(a.positions).all():
            break
    path.write_text(json.dumps(out, indent=1))
    return out


def local_steps(model, X, V, dt, which) -> list[dict]:
    """Solve step k from ADMM's (x_k, v_k) with Newton midpoint; compare with ADMM's x_{k+1}."""
    from tisim.solvers.admm.energy_momentum import MidpointNewton

    nm = MidpointNewton(model, "midpoint", tolerance=1e-14)
    scale = nm.scale
    out = []
    for k in which:
        if k + 1 >= len(X):
            break
        nm.forget()
        r = nm.solve(X[k], V[k], dt, k * dt)
        out.append(
            {
                "step": int(k + 1),
                "newton_iterations": r.iterations,
                "newton_converged": r.converged,
                "max_dx_rel": float(np.abs(r.positions - X[k + 1]).max() / scale),
                "admm_residual_N": float(np.abs(nm.residual(X[k], V[k], X[k + 1], dt, k * dt)).max()),
                "newton_residual_N": float(np.abs(nm.residual(X[k], V[k], r.positions, dt, k * dt)).max()),
            }
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dt", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=2300, help="ADMM and Newton-midpoint steps (stop 20 after blow-up)")
    ap.add_argument("--em-steps", type=int, default=4000, help="energy-momentum steps")
    ap.add_argument("--blowup-steps", type=int, default=8, help="ADMM steps continued from the first inversion")
    ap.add_argument("--fresh", action="store_true", help="recompute cached trajectories")
    ap.add_argument("--out", default=str(ROOT / "out" / "midpoint-diagnosis"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    from tisim import backend

    backend.init("cpu", "f64")
    from tisim.model import Model
    from tisim.solvers.admm.solver import SolverADMM

    cache = ROOT / "out" / "midpoint-diagnosis" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dt = args.dt
    sc = _scene(dt)
    model = Model.from_scene(sc)
    report: dict = {
        "scene": "demos/spinning-bar.toml",
        "dt": dt,
        "substeps": 1,
        "vertices": model.vertex_count,
        "tets": model.element_count,
    }

    Xa, Va, Ra = run_admm(dt, args.steps, cache, args.fresh)
    states = {f"ADMM step {k}": Xa[k] for k in (100, 1000, 2000) if k < len(Xa)}
    report["energy_consistency"] = energy_consistency(model, SolverADMM(model, sc.solver), states)
    log.info("energy consistency: %s", [s["energy_rel_diff"] for s in report["energy_consistency"]["states"]])
    Xn, Vn, Rn = run_newton(model, "midpoint", dt, args.steps, cache, args.fresh)
    sa, sn = summarise(model, Xa, Va, Ra, dt), summarise(model, Xn, Vn, Rn, dt)
    n_common = min(len(Xa), len(Xn))
    dev = np.abs(Xa[:n_common] - Xn[:n_common]).max(axis=(1, 2)) / np.linalg.norm(np.ptp(Xa[0], axis=0))
    which = (
        list(range(0, 300, 25))
        + list(range(1000, min(len(Xa) - 1, 2120), 100))
        + [k for k in (2050, 2080, 2090, 2095, 2100, 2105) if k < len(Xa) - 1]
    )
    report["local_step_agreement"] = local_steps(model, Xa, Va, dt, sorted(set(which)))
    report["trajectory_deviation_rel"] = {
        str(k): float(dev[k]) for k in (10, 100, 300, 1000, 1500, 2000, 2050, 2100) if k < n_common
    }
    inv = np.flatnonzero(~(Ra[:, 4] > 0))
    if len(inv):
        start = max(int(Ra[inv[0], 0]) - 3, 0)
        report["blowup"] = blowup_steps(model, sc, Xa, Va, dt, start, args.blowup_steps, cache, args.fresh)
    em_model = Model.from_scene(_scene(dt, "energy-momentum"))
    Xe, Ve, Re = run_newton(em_model, "energy-momentum", dt, args.em_steps, cache, args.fresh, stop_on_inf=False)
    se = summarise(em_model, Xe, Ve, Re, dt)
    plots = {"ADMM (midpoint)": sa, "Newton (midpoint)": sn, "energy-momentum": se}
    for name, s in plots.items():
        report[name] = {k: v for k, v in s.items() if k not in ("E", "steps_arr")}
    report["energy_momentum_rel_energy_error"] = float(np.abs(se["E"] - se["E0_J"]).max() / se["E0_J"])
    (out / "midpoint-diagnosis.json").write_text(json.dumps(report, indent=1, default=float))
    _plot(out / "midpoint-diagnosis.png", plots, dev, report)
    log.info("wrote %s", out / "midpoint-diagnosis.json")
    return 0


def _plot(path: Path, plots: dict, dev: np.ndarray, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4), dpi=80)
    styles = {"ADMM (midpoint)": ("C0", "-"), "Newton (midpoint)": ("C3", "--"), "energy-momentum": ("C2", "-")}
    for name, s in plots.items():
        c, ls = styles[name]
        E = np.where(np.isfinite(s["E"]), s["E"], np.nan)
        ax[0].plot(s["steps_arr"], (E - s["E0_J"]) / s["E0_J"] * 100, c, ls=ls, lw=1, label=name)
    ax[0].set_ylim(-0.5, 5)
    ax[0].set_xlabel(f"step (dt = {report['dt']:g} s)")
    ax[0].set_ylabel("total energy change, %")
    ax[0].legend(fontsize=8, loc="upper left")
    ax[0].set_title("spinning-bar: energy", fontsize=9)
    ax[1].semilogy(np.arange(len(dev)), np.maximum(dev, 1e-16), "k", lw=1, label="trajectory: ADMM vs Newton")
    loc = report["local_step_agreement"]
    ax[1].semilogy(
        [r["step"] for r in loc],
        [max(r["max_dx_rel"], 1e-16) for r in loc],
        "o",
        ms=3,
        label="one step from ADMM's state",
    )
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("max |x_ADMM - x_Newton| / diagonal")
    ax[1].legend(fontsize=8)
    ax[1].set_title("ADMM vs independent midpoint solve", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
