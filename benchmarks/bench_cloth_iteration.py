"""Cost of one Newton iteration of the cloth solver, and where it goes.

A direct simulation of ``demos/refine-drape.toml`` (a sheet dropped on a sphere over a
ground plane, h = 0.01 s) on a coarse mesh, 9 x 9, 17 x 17 and 33 x 33 vertices (81, 289
and 1,089), each in a process of its own on the CPU backend in f64. Per frame, the solver's
step is timed and divided by its Newton iterations; the figures are medians over the frames
after the first (which compiles), for all frames and for the frames with contact.

What an iteration is made of, per iteration (medians over the frames):

- ``ms_per_iteration``: ``SolverCloth.step`` wall time over its Newton iterations (the
  step's set-up, friction lagging and closing detection are shared out over them).
- ``cpu_ms_per_iteration``: the same with the process's CPU time (``time.process_time``)
  instead of the wall clock: on one thread it is what the iteration costs the CPU, which a
  machine shared with other work does not inflate as it does the wall time (it still
  pays for the other work's cache and memory traffic);
- the named steps of :class:`tisim.solvers.cloth.newton.NewtonLoop`, timed by wrapping
  them: ``assembly`` (elastic_terms + contact_terms + assemble: the shell's and the
  barrier's gradients and Hessians in kernels, the system on the host), ``linear``
  (linear_solve: the sparse factorisation and solve), ``ccd`` (ccd_bound: the strain
  limit's feasibility, the swept broad phase and CCD, the planes' bound), ``line_search``
  (line_search: energies at the trial points, kappa's adaptation), ``convergence``
  (converged) and ``step_setup`` (everything of ``step`` outside the iterations: the
  first and the closing detection, friction lagging, obstacles, wind, statistics);
- ``launches``: Taichi kernel launches (``tisim._taichi_patches.launch.counts``, both
  paths), per iteration and per named step;
- ``kernel_share``: the kernels' own execution time over the step's, from Taichi's
  kernel profiler in a second pass of the same frames (the profiler's timing adds to every
  launch, so the other figures come from the pass without it); ``kernel_cpu_ms`` is that
  share of the CPU time per iteration;
- ``launch_us``: the Python cost of one launch of a kernel with five array arguments and
  an empty body, measured in the same process: ``launches x launch_us`` is what the
  launches cost before any arithmetic;
- ``host_cpu_ms``: an iteration's CPU time less its kernels' execution and the linear
  solve: Python, numpy on the host and the launches' own cost.

The phases are given in CPU time (``*_cpu_ms``) and in wall time (``*_ms``).

A straight line through (vertices, ms per iteration) of the three sizes gives the fixed cost
of an iteration (its intercept) and the cost per vertex (its slope).

    .venv/bin/python benchmarks/bench_cloth_iteration.py                      # 40 frames, 3 sizes
    .venv/bin/python benchmarks/bench_cloth_iteration.py --frames 20 --sizes 16 --no-save
    .venv/bin/python benchmarks/bench_cloth_iteration.py --threads 0          # Taichi's default threads

Results: ``benchmarks/results/cloth-iteration/<date>-<machine>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import load_average, machine, median, result_path, write_json

ROOT = Path(__file__).resolve().parent.parent
SCENE = ROOT / "demos" / "refine-drape.toml"
# the named steps of NewtonLoop timed one by one, and the phase each counts toward
STEPS = {
    "start": "step_setup",
    "start_friction": "step_setup",
    "lag_friction": "step_setup",
    "result": "step_setup",
    "elastic_terms": "assembly",
    "contact_terms": "assembly",
    "assemble": "assembly",
    "linear_solve": "linear",
    "converged": "convergence",
    "ccd_bound": "ccd",
    "line_search": "line_search",
}
PHASES = ("assembly", "linear", "ccd", "line_search", "convergence", "step_setup")


# ------------------------------------------------------------------------------ one size, in a child


def _launch_us(n: int = 3000) -> float:
    """The Python cost of one launch of a kernel with an empty body over five arrays, us."""
    import taichi as ti

    from tisim import backend

    real = backend.real()

    def nothing(a, b, c, d, e, k, s):
        pass

    # (this module's annotations are strings, which Taichi does not read: given as objects)
    vec = ti.types.ndarray(dtype=ti.types.vector(3, real))
    nothing.__annotations__ = {
        "a": vec,
        "b": vec,
        "c": ti.types.ndarray(),
        "d": ti.types.ndarray(),
        "e": ti.types.ndarray(),
        "k": ti.i32,
        "s": real,
    }
    nothing = ti.kernel(nothing)

    arrs = [
        ti.Vector.ndarray(3, real, shape=16),
        ti.Vector.ndarray(3, real, shape=16),
        ti.ndarray(real, shape=16),
        ti.ndarray(ti.i32, shape=16),
        ti.ndarray(real, shape=16),
    ]
    nothing(*arrs, 1, 1.0)
    ti.sync()
    t = time.perf_counter()
    for _ in range(n):
        nothing(*arrs, 1, 1.0)
    ti.sync()
    return (time.perf_counter() - t) / n * 1e6


def _instrument(acc: dict) -> None:
    """Wrap NewtonLoop's named steps to add their time (s) and launches to acc[name]."""
    from tisim._taichi_patches import launch
    from tisim.solvers.cloth.newton import NewtonLoop

    counts = launch.counts

    def wrap(name, fn):
        def timed(self, *a, **kw):
            n0 = counts["short"] + counts["taichi"]
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(self, *a, **kw)
            finally:
                rec = acc.setdefault(name, [0.0, 0, 0.0])
                rec[0] += time.perf_counter() - t
                rec[1] += counts["short"] + counts["taichi"] - n0
                rec[2] += time.process_time() - c

        return timed

    for name in STEPS:
        setattr(NewtonLoop, name, wrap(name, getattr(NewtonLoop, name)))


def run_size(cells: int, frames: int, profile: bool) -> dict:
    """Simulate refine-drape at cells x cells cells; per-frame records (see the module doc)."""
    import taichi as ti

    from tisim._taichi_patches import launch
    from tisim.runner import build
    from tisim.scene import load_scene

    sc = load_scene(SCENE, [f"objects.cloth.cloth_resolution=[{cells},{cells}]"])
    _, model, solver = build(sc, "cpu", "f64")
    launch_us = None if profile else _launch_us()
    acc: dict = {}
    _instrument(acc)
    st, spare = model.initial_state(), model.initial_state()
    dt = sc.sim.dt
    rows = []
    for f in range(frames):
        acc.clear()
        n0 = launch.counts["short"] + launch.counts["taichi"]
        if profile:
            ti.profiler.clear_kernel_profiler_info()
        t, c = time.perf_counter(), time.process_time()
        out = solver.step(st, spare, dt)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        st, spare = spare, st
        row = {
            "frame": f,
            "wall_ms": wall * 1e3,
            "cpu_ms": cpu * 1e3,
            "iterations": out.iterations,
            "n_contacts": out.n_contacts,
            "launches": launch.counts["short"] + launch.counts["taichi"] - n0,
            "steps": {k: {"ms": v[0] * 1e3, "launches": v[1], "cpu_ms": v[2] * 1e3} for k, v in acc.items()},
        }
        if profile:
            row["kernel_ms"] = ti.profiler.get_kernel_profiler_total_time() * 1e3
            row["wall_ms_profiled"] = row["wall_ms"]
        rows.append(row)
    return {
        "cells": cells,
        "vertices": solver.nc,
        "obstacle_vertices": solver.no,
        "analytic_colliders": [c.name for c in solver.obstacles.analytic],
        "linear_backend": solver.linear.backend,
        "launch_us": launch_us,
        "rows": rows,
    }


def _child(cells: int, frames: int, profile: bool, threads: int) -> dict:
    """run_size in a fresh process (its own Taichi, kernel profiler on or off)."""
    env = dict(os.environ, TISIM_QUIET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if threads > 0:  # Taichi's loops and the linear solver's BLAS alike
        env["TI_CPU_MAX_NUM_THREADS"] = str(threads)
        for k in ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[k] = str(threads)
    if profile:
        env["TI_KERNEL_PROFILER"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "size.json"
        cmd = [sys.executable, __file__, "--child", str(cells), "--frames", str(frames), "--child-out", str(out)]
        if profile:
            cmd.append("--child-profile")
        subprocess.run(cmd, env=env, check=True)
        return json.loads(out.read_text())


# ------------------------------------------------------------------------------ summary


def summarise(plain: dict, prof: dict | None) -> dict:
    """Medians per iteration over the frames after the first (see the module doc)."""
    rows = [r for r in plain["rows"][1:] if r["iterations"] > 0]
    krow = {r["frame"]: r for r in (prof["rows"] if prof else [])}

    def per_it(rs, get):
        return median(get(r) / r["iterations"] for r in rs)

    def step_sum(r, key, names):
        return sum(v[key] for k, v in r["steps"].items() if STEPS[k] in names)

    def figures(rs):
        d = {
            "frames": len(rs),
            "iterations_per_frame": median(r["iterations"] for r in rs),
            "ms_per_iteration": per_it(rs, lambda r: r["wall_ms"]),
            "cpu_ms_per_iteration": per_it(rs, lambda r: r["cpu_ms"]),
            "launches_per_iteration": per_it(rs, lambda r: r["launches"]),
        }
        for ph in PHASES:
            for unit, total in (("ms", "wall_ms"), ("cpu_ms", "cpu_ms")):
                if ph == "step_setup":  # what step() does outside the loop's named steps
                    get = lambda r, unit=unit, total=total: (
                        r[total] - sum(v[unit] for k, v in r["steps"].items() if STEPS[k] != "step_setup")
                    )
                else:
                    get = lambda r, ph=ph, unit=unit: step_sum(r, unit, (ph,))
                d[f"{ph}_{unit}"] = per_it(rs, get)
            d[f"{ph}_launches"] = per_it(rs, lambda r, ph=ph: step_sum(r, "launches", (ph,)))
        ks = [r for r in rs if r["frame"] in krow]
        if ks:
            # the kernels' share of the profiled pass's step, applied to the plain pass's CPU
            # time (the share, unlike the times, hardly depends on how busy the machine is)
            d["kernel_share"] = median(krow[r["frame"]]["kernel_ms"] / krow[r["frame"]]["wall_ms"] for r in ks)
            d["kernel_cpu_ms"] = d["kernel_share"] * d["cpu_ms_per_iteration"]
            d["host_cpu_ms"] = d["cpu_ms_per_iteration"] - d["kernel_cpu_ms"] - d["linear_cpu_ms"]
        if plain["launch_us"] is not None:
            d["launch_overhead_ms"] = d["launches_per_iteration"] * plain["launch_us"] * 1e-3
        return d

    out = {
        k: plain[k]
        for k in ("cells", "vertices", "obstacle_vertices", "analytic_colliders", "linear_backend", "launch_us")
    }
    out["all"] = figures(rows)
    contact = [r for r in rows if r["n_contacts"] > 0]
    out["contact"] = figures(contact) if contact else None
    return out


def fixed_cost(sizes: list[dict], key: str = "all", figure: str = "ms_per_iteration") -> dict | None:
    """Least-squares line ms/iteration = a + b * vertices over the sizes: a (ms), b (us/vertex)."""
    pts = [(s["vertices"], s[key][figure]) for s in sizes if s.get(key)]
    if len(pts) < 2:
        return None
    v, ms = np.array(pts, dtype=float).T
    b, a = np.polyfit(v, ms, 1)
    return {"fixed_ms": float(a), "us_per_vertex": float(b) * 1e3}


def table(sizes: list[dict], key: str = "all") -> str:
    """A Markdown table: per iteration, CPU time (ms) of the phases, launches in brackets."""
    head = (
        "| vertices | wall ms / iteration | CPU ms / iteration | launches / iteration | assembly "
        "| linear solve | CCD + broad phase | line search | convergence test | step set-up "
        "| kernels (share) | host: Python, numpy, launches | launches x launch cost |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in sizes:
        d = s.get(key)
        if not d:
            continue

        def ms(k, d=d):
            return "-" if d.get(k) is None else f"{d[k]:.2f}"

        share = "" if d.get("kernel_share") is None else f" ({100 * d['kernel_share']:.0f}%)"
        lines.append(
            f"| {s['vertices']:,} | {ms('ms_per_iteration')} | {ms('cpu_ms_per_iteration')} "
            f"| {d['launches_per_iteration']:.1f} | {ms('assembly_cpu_ms')} ({d['assembly_launches']:.0f}) "
            f"| {ms('linear_cpu_ms')} | {ms('ccd_cpu_ms')} ({d['ccd_launches']:.0f}) "
            f"| {ms('line_search_cpu_ms')} ({d['line_search_launches']:.0f}) | {ms('convergence_cpu_ms')} "
            f"| {ms('step_setup_cpu_ms')} ({d['step_setup_launches']:.0f}) | {ms('kernel_cpu_ms')}{share} "
            f"| {ms('host_cpu_ms')} | {ms('launch_overhead_ms')} |"
        )
    return "\n".join(lines)


def compact(o):
    """Per-frame records with times rounded to 0.1 us (ms to 4 decimals): a smaller JSON."""
    if isinstance(o, dict):
        return {k: compact(v) for k, v in o.items()}
    if isinstance(o, list):
        return [compact(v) for v in o]
    return round(o, 4) if isinstance(o, float) else o


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--sizes", default="8,16,32", help="cells per side (vertices: (cells + 1)^2)")
    ap.add_argument("--threads", type=int, default=1, help="Taichi CPU threads (0: Taichi's default)")
    ap.add_argument("--no-kernel-profile", action="store_true", help="skip the kernel profiler's pass")
    ap.add_argument("--json", type=Path, help="write here instead of benchmarks/results/cloth-iteration/")
    ap.add_argument("--no-save", action="store_true", help="print only")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child is not None:
        a.child_out.write_text(json.dumps(run_size(a.child, a.frames, a.child_profile)))
        return 0
    m = machine(threads=a.threads or "taichi default")
    sizes, raw = [], []
    for cells in (int(c) for c in a.sizes.split(",")):
        plain = _child(cells, a.frames, False, a.threads)
        prof = None if a.no_kernel_profile else _child(cells, a.frames, True, a.threads)
        s = summarise(plain, prof)
        sizes.append(s)
        if prof:  # (its named steps' times carry the profiler's cost: not kept)
            prof["rows"] = [{k: v for k, v in r.items() if k != "steps"} for r in prof["rows"]]
        raw.append({"plain": plain, "profiled": prof})
        print(
            f"{s['vertices']} vertices: {s['all']['ms_per_iteration']:.2f} ms/iteration "
            f"({s['all']['cpu_ms_per_iteration']:.2f} ms CPU time), "
            f"{s['all']['launches_per_iteration']:.1f} launches/iteration",
            flush=True,
        )
    m["loadavg_end"] = load_average()
    fit = {k: fixed_cost(sizes, k) for k in ("all", "contact")}
    fit.update({f"{k}_cpu": fixed_cost(sizes, k, "cpu_ms_per_iteration") for k in ("all", "contact")})
    print(
        f"\nrefine-drape, direct coarse, {a.frames} frames, medians per Newton iteration (ms; launches in "
        f"brackets); machine: {m.get('cpu')}, {m.get('cores')} cores, Taichi threads {a.threads or 'default'}, "
        f"load {m.get('loadavg_start')} -> {m['loadavg_end']}"
    )
    for key in ("all", "contact"):
        print(f"\n{key} frames:\n" + table(sizes, key))
        for name, f in ((key, fit[key]), (f"{key}, CPU time", fit[f"{key}_cpu"])):
            if f:
                print(f"fit ({name}): {f['fixed_ms']:.2f} ms fixed + {f['us_per_vertex']:.2f} us per vertex")
    if not a.no_save:
        path = a.json or result_path("cloth-iteration", m)
        write_json(
            path,
            {
                "benchmark": "cloth-iteration",
                "scene": "refine-drape",
                "frames": a.frames,
                "machine": m,
                "sizes": sizes,
                "fit": fit,
                "raw": compact(raw),
            },
        )
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
