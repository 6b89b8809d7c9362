"""Benchmark of the ADMM integrator: time per ADMM iteration against the number of tets
(box meshes, about 1k to 50k tets) with its log-log slope, and time per step of the demos.

    .venv/bin/python benchmarks/bench_admm.py [--out out/bench_admm] [--quick] [--arch cpu]
                                         [--no-demos] [--compare FRAMES]

Writes bench_admm.json and bench_admm.png into --out and prints a table. With
``--compare FRAMES`` it also runs the spinning-bar demo with ADMM, implicit Euler and XPBD
for FRAMES frames (tisim.compare: stats and energy/momentum plots in --out/compare). The time per
iteration is the ADMM loop only (q-step solve + element kernel, from StepStats.timings)
divided by the iterations, with a fixed iteration count (tolerance unreachable, rho fixed so
A is factored once), after a warm-up step (kernel compilation); the slope is fitted to the
minimum over the sampled steps, the sample least disturbed by other processes (the median is
reported too).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from common import machine

SIZES = (6, 8, 10, 13, 16, 19, 22)  # cube cells per side; 5 tets per cell: 1,080 ... 53,240 tets
DEMOS = {"spinning-bar": 30, "bouncing-ball": 60, "beam": 20, "stretch": 20}  # frames (quick: / 3)


def bench_size(cells: int, iterations: int, steps: int) -> dict:
    from tisim.model import Model
    from tisim.scene import scene_from_dict
    from tisim.solvers.admm.solver import SolverADMM

    sc = scene_from_dict(
        {
            "sim": {"dt": 0.01, "gravity": [0.0, 0.0, 0.0]},
            "solver": {
                "type": "admm",
                "tolerance": 1e-300,
                "max_iterations": iterations,
                "min_iterations": iterations,
                "adaptive_rho": False,
                "local_rho": False,
                "warn_every": 1000000,
                "retry_stalled": False,
            },  # a fixed iteration count: no retry of the (capped) steps
            "objects": {
                "box": {
                    "generator": "box",
                    "size": [1.0, 1.0, 1.0],
                    "resolution": [cells] * 3,
                    "material": "neo-hookean",
                    "youngs_modulus": 1e5,
                    "poisson_ratio": 0.3,
                    "angular_velocity": [1.0, 2.0, 3.0],
                }
            },
        }
    )
    import logging

    logging.getLogger("tisim.solvers.admm.solver").setLevel(logging.ERROR)
    model = Model.from_scene(sc)
    solver = SolverADMM(model, sc.solver)
    a, b = model.initial_state(), model.initial_state()
    solver.step(a, b, 0.01)  # warm-up: compilation, factorization
    a, b = b, a
    per_it, per_step = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        st = solver.step(a, b, 0.01)
        per_step.append(time.perf_counter() - t0)
        a, b = b, a
        loop_ms = st.timings["q_step"] + st.timings["local"] + st.timings["contact"]
        per_it.append(loop_ms / st.iterations)
    return {
        "cells": cells,
        "tets": model.element_count,
        "vertices": model.vertex_count,
        "ms_per_iteration": float(np.min(per_it)),
        "ms_per_iteration_median": float(np.median(per_it)),
        "ms_per_iteration_step_wall": float(np.median(per_step)) * 1e3 / iterations,
        "q_step_share": float(st.timings["q_step"] / max(loop_ms, 1e-12)),
    }


def bench_demo(name: str, frames: int, root: Path, out: Path) -> dict:
    from tisim.compare import read_stats
    from tisim.runner import run_scene
    from tisim.scene import load_scene

    sc = load_scene(root / "demos" / f"{name}.toml")
    res = run_scene(sc, out / "demos" / name, frames=frames, progress=False)
    st = read_stats(out / "demos" / name / "stats.csv")
    wall = st["wall_ms"][2:] / sc.sim.substeps  # frame 1 includes compilation
    its = st["iterations"][1:] / sc.sim.substeps
    return {
        "demo": name,
        "ended": res.ended,
        "frames": frames,
        "tets": res.info["sizes"]["tets"],
        "dt": sc.sim.dt,
        "ms_per_step_median": float(np.median(wall)),
        "ms_per_step_mean": float(np.mean(wall)),
        "iterations_per_step_mean": float(np.mean(its)),
        "iterations_per_step_max": float(np.max(its)),
        "stalled_frames": int(np.nansum(st.get("admm_stalled", np.zeros(1))[1:] > 0)),
        "min_volume_ratio": float(np.nanmin(st["min_volume_ratio"])),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/bench_admm")
    ap.add_argument("--quick", action="store_true", help="fewer sizes, steps and demo frames")
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--no-demos", action="store_true")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="Taichi CPU threads (0: Taichi's default, all cores). 1 shows the algorithmic "
        "scaling without thread start-up/synchronisation, which dominates small meshes "
        "on a busy machine",
    )
    ap.add_argument(
        "--compare",
        type=int,
        default=0,
        metavar="FRAMES",
        help="also compare admm, implicit-euler and xpbd on spinning-bar for FRAMES frames",
    )
    args = ap.parse_args(argv)
    if args.threads > 0:  # read by ti.init (through tisim.backend.init)
        os.environ["TI_CPU_MAX_NUM_THREADS"] = str(args.threads)
    from tisim import backend

    info = backend.init(args.arch, "f64" if args.arch == "cpu" else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parent.parent
    sizes = SIZES[::2] if args.quick else SIZES
    iterations, steps = (10, 3) if args.quick else (20, 6)

    rows = []
    print(f"{'tets':>8} {'vertices':>9} {'ms/iteration':>13} {'(median)':>9} {'q-step share':>13}")
    for c in sizes:
        r = bench_size(c, iterations, steps)
        rows.append(r)
        print(
            f"{r['tets']:>8} {r['vertices']:>9} {r['ms_per_iteration']:>13.3f} "
            f"{r['ms_per_iteration_median']:>9.3f} {r['q_step_share']:>13.2f}",
            flush=True,
        )
    tets = np.array([r["tets"] for r in rows], float)
    ms = np.array([r["ms_per_iteration"] for r in rows])
    slope, intercept = np.polyfit(np.log(tets), np.log(ms), 1)
    print(f"log-log slope of time per iteration vs tets: {slope:.3f} (expected 0.9 .. 1.15)")

    demos = []
    if not args.no_demos:
        print(
            f"\n{'demo':>14} {'tets':>6} {'dt':>7} {'ms/step':>9} {'its/step':>9} {'max its':>8} "
            f"{'stalled':>8} {'min det':>8}"
        )
        for name, frames in DEMOS.items():
            d = bench_demo(name, max(3, frames // 3) if args.quick else frames, root, out)
            demos.append(d)
            print(
                f"{name:>14} {d['tets']:>6} {d['dt']:>7.4f} {d['ms_per_step_median']:>9.2f} "
                f"{d['iterations_per_step_mean']:>9.1f} {d['iterations_per_step_max']:>8.0f} "
                f"{d['stalled_frames']:>8d} {d['min_volume_ratio']:>8.3f}",
                flush=True,
            )

    comparison = None
    if args.compare > 0:
        from tisim.compare import compare
        from tisim.scene import load_scene

        comparison = compare(
            load_scene(root / "demos" / "spinning-bar.toml"),
            ["admm", "implicit-euler", "xpbd"],
            out / "compare",
            frames=args.compare,
            progress=False,
        )
        print(
            f"\nspinning-bar, {args.compare} frames: {'integrator':>15} {'max |dE|/E0':>12} {'E end/E0-1':>11} "
            f"{'|dL|/L0':>9} {'|dp| rel':>9} {'ms/frame':>9}"
        )
        for name, r in comparison["integrators"].items():
            print(
                f"{'':>30}{name:>15} {r['energy_max_drift_rel']:>12.2e} {r['energy_final_change_rel']:>11.2e} "
                f"{r['angular_momentum_max_drift_rel']:>9.2e} {r['linear_momentum_max_drift_rel']:>9.1e} "
                f"{r['median_wall_ms']:>9.1f}"
            )

    mach = machine()
    mach["arch"], mach["precision"] = info.arch, info.precision
    import taichi as ti

    mach["taichi_cpu_threads"] = int(ti.lang.impl.current_cfg().cpu_max_num_threads)
    print(
        f"\nmachine: {mach['cpu']}, {mach['cores']} logical cores, {mach['system']}, "
        f"taichi {mach['taichi']} ({info.arch}, {info.precision}, {mach['taichi_cpu_threads']} CPU threads)"
    )
    result = {
        "machine": mach,
        "scaling": rows,
        "slope": float(slope),
        "slope_ok": bool(0.9 <= slope <= 1.15),
        "iterations_per_sample": iterations,
        "demos": demos,
        "compare": comparison,
    }
    (out / "bench_admm.json").write_text(json.dumps(result, indent=2))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.loglog(tets, ms, "o-", label="measured")
    ax.loglog(tets, np.exp(intercept) * tets**slope, "--", label=f"fit, slope {slope:.2f}")
    ax.loglog(tets, ms[0] * tets / tets[0], ":", color="gray", label="linear")
    ax.set_xlabel("tets")
    ax.set_ylabel("ms per ADMM iteration")
    ax.set_title(f"ADMM iteration cost ({info.arch}, {mach['taichi_cpu_threads']} threads)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "bench_admm.png")
    print(f"wrote {out / 'bench_admm.json'} and {out / 'bench_admm.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
