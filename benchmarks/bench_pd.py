"""Benchmark of the real-time PD solver on the twisting bar (notes §4, Table 3).

For each bar size (5.3k, 11k, 21k vertices) and each global-step back-end
(sparse-inverse, cholesky, jacobi), in a fresh process each (so that peak memory
means something): set-up time, median frame time over the measured frames after
warm-up (5 local-global iterations, the demo's settings), its split into local
step (local projection + residual assembly) and global step, the energy
evaluation, nnz(S) and the memory of S (and of S + S^T), and the peak resident
memory of the process. Prints a table and writes JSON with the machine
description (CPU model, cores, load average, Taichi backend).

    .venv/bin/python benchmarks/bench_pd.py                 # all sizes and back-ends
    .venv/bin/python benchmarks/bench_pd.py --quick         # 5.3k bar only, fewer frames
    .venv/bin/python benchmarks/bench_pd.py --sizes 5k --backends cholesky sparse-inverse
    .venv/bin/python benchmarks/bench_pd.py --si-build 10 17.6493 --si-archs cpu vulkan \\
        --out out/bench_si_build.json      # sparse-inverse build time per backend
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
from common import load_average, machine

SIZES = {"5k": [65, 8, 8], "11k": [92, 10, 10], "21k": [105, 13, 13]}
BACKENDS = ["sparse-inverse", "cholesky", "jacobi"]


def _run_one(size: str, backend_name: str, frames: int, warmup: int, iterations: int, arch: str, queue) -> None:
    """Child process: build, warm up, time frames, report through ``queue``."""
    try:
        queue.put(_measure(size, backend_name, frames, warmup, iterations, arch))
    except Exception as e:  # report instead of hanging the parent
        queue.put({"size": size, "global_step": backend_name, "error": f"{type(e).__name__}: {e}"})


def _measure(size, backend_name, frames, warmup, iterations, arch) -> dict:
    import resource

    from tisim import backend
    from tisim.cli.app import demos_dir
    from tisim.model import Model
    from tisim.scene import load_scene
    from tisim.solvers.pd.solver import SolverPD

    info = backend.init(arch, "f64")
    res = SIZES[size]
    scene = load_scene(
        demos_dir() / "twisting-bar.toml",
        [
            f"objects.bar.resolution={res}",
            f'solver.global_step="{backend_name}"',
            f"solver.iterations={iterations}",
        ],
    )
    model = Model.from_scene(scene)
    t0 = time.perf_counter()
    solver = SolverPD(model, scene.solver)
    setup_s = time.perf_counter() - t0
    a = model.initial_state()
    b = a.clone()
    dt = scene.sim.dt
    wall, local, glob, energy = [], [], [], []
    for f in range(warmup + frames):
        t = time.perf_counter()
        st = solver.step(a, b, dt)
        w = 1e3 * (time.perf_counter() - t)
        a, b = b, a
        if f >= warmup:
            wall.append(w)
            local.append(st.timings["local"])
            glob.append(st.timings["global"])
            energy.append(st.timings["energy"])
    if not np.all(np.isfinite(a.positions)):
        raise FloatingPointError("non-finite positions")
    sinfo = solver.info()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    return {
        "size": size,
        "vertices": model.vertex_count,
        "tets": model.element_count,
        "global_step": sinfo["global_step"],
        "requested": backend_name,
        "iterations": iterations,
        "frames": frames,
        "frame_ms_median": float(np.median(wall)),
        "frame_ms_min": float(np.min(wall)),
        "local_ms_median": float(np.median(local)),
        "global_ms_median": float(np.median(glob)),
        "energy_ms_median": float(np.median(energy)),
        "setup_s": setup_s,
        "nnz_S": sinfo.get("nnz_S"),
        "S_mb": sinfo.get("S_mb"),
        "S_and_ST_mb": sinfo.get("S_and_ST_mb"),
        "nnz_L": sinfo.get("nnz_L"),
        "factor_s": sinfo.get("factor_seconds"),
        "sparse_inverse_s": sinfo.get("sparse_inverse_seconds"),
        "ordering": sinfo.get("ordering"),
        "peak_rss_mb": peak_mb,
        "arch": info.arch,
        "precision": info.precision,
        "final_residual": float(st.residual),
    }


def _si_build_one(resolution: float, arch: str, queue) -> None:
    """Child process: time S = L^-1 of the squeeze-ball's global matrix on ``arch``."""
    try:
        from tisim import backend
        from tisim.cli.app import demos_dir
        from tisim.linalg.sparse_inverse import sparse_inverse
        from tisim.model import Model
        from tisim.scene import load_scene
        from tisim.solvers.pd.solver import SolverPD

        info = backend.init(arch)
        scene = load_scene(
            demos_dir() / "squeeze-ball.toml",
            [
                f"objects.ball.ball_resolution={resolution}",
                'solver.global_step="cholesky"',
                "contact.enabled=false",
            ],
        )
        model = Model.from_scene(scene)
        g = SolverPD(model, scene.solver).global_step
        f = g.factor
        sparse_inverse(f)  # compile
        t0 = time.perf_counter()
        si = sparse_inverse(f)
        dt = time.perf_counter() - t0
        b = np.random.default_rng(0).standard_normal(g.n_free)
        res = float(np.linalg.norm(g.A_ff @ si.solve(b) - b) / np.linalg.norm(b))
        queue.put(
            {
                "vertices": model.vertex_count,
                "arch": info.arch,
                "nnz_S": si.nnz,
                "levels": int(si.depth.max()),
                "build_s": dt,
                "relative_residual": res,
            }
        )
    except Exception as e:  # report instead of hanging the parent
        queue.put({"arch": arch, "error": f"{type(e).__name__}: {e}"})


def si_build(resolutions, archs, out: Path) -> int:
    """Build time of the sparse inverse, the same matrix on each backend side by side."""
    ctx = mp.get_context("spawn")
    rows = []
    print(
        f"{'vertices':>8} {'levels':>6} {'nnz(S)':>10} "
        + " ".join(f"{a + ' s':>10}" for a in archs)
        + "  relative residual A S^T S b - b"
    )
    for res in resolutions:
        got = []
        for arch in archs:
            q = ctx.Queue()
            proc = ctx.Process(target=_si_build_one, args=(res, arch, q))
            proc.start()
            got.append(q.get())
            proc.join()
        rows.extend(got)
        ok = [r for r in got if "error" not in r]
        if not ok:
            print(f"ball_resolution {res}: " + "; ".join(r["error"] for r in got))
            continue
        r0 = ok[0]
        times = " ".join(f"{r['build_s']:>10.2f}" if "error" not in r else f"{'error':>10}" for r in got)
        resid = ", ".join(f"{r['arch']} {r['relative_residual']:.1e}" for r in ok)
        print(f"{r0['vertices']:>8} {r0['levels']:>6} {r0['nnz_S']:>10,} {times}  {resid}")
        for r in got:
            if "error" in r:
                print(f"  {r['arch']}: {r['error']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "sparse_inverse_build": rows}, indent=2))
    print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------------------ traffic
# scenes of the iteration budget: (demo, overrides); small sizes, the counts of launches
# and synchronisations do not depend on the size (the bytes do, and are per vertex)
TRAFFIC_SCENES = {
    "bar": (
        "twisting-bar.toml",
        ["objects.bar.resolution=[16,3,3]", 'solver.global_step="sparse-inverse"'],
    ),
    "bar-neohookean": (
        "twisting-bar-neohookean.toml",
        ["objects.bar.resolution=[16,3,3]", 'solver.global_step="sparse-inverse"'],
    ),
    "bar-cholesky": (  # a host solve each iteration: r crosses to the host by design
        "twisting-bar.toml",
        ["objects.bar.resolution=[16,3,3]", 'solver.global_step="cholesky"'],
    ),
    # the sparse inverse, as "auto" picks on a GPU (the Cholesky back-end's host solve
    # moves r to the host every iteration by design)
    "contact": (
        "squeeze-ball.toml",
        ["objects.ball.ball_resolution=6", 'contact.implementation="device"', 'solver.global_step="sparse-inverse"'],
    ),
    "contact-host": (
        "squeeze-ball.toml",
        ["objects.ball.ball_resolution=6", 'contact.implementation="host"', 'solver.global_step="sparse-inverse"'],
    ),
}


def _traffic_one(arch, names, steps, warmup, iterations, queue):
    """Child process: per scene, launches, syncs and bytes per step and per local-global
    iteration (tisim._taichi_patches.traffic), after ``warmup`` steps."""
    try:
        from tisim import backend
        from tisim._taichi_patches import traffic
        from tisim.cli.app import demos_dir
        from tisim.model import Model
        from tisim.scene import load_scene
        from tisim.solvers.pd.solver import SolverPD

        info = backend.init(arch, "f64" if arch == "cpu" else "f32")
        if not traffic.install():
            raise RuntimeError("traffic counters need the Taichi patches (TISIM_PLAIN_TAICHI unset)")
        rows = []
        for name in names:
            demo, sets = TRAFFIC_SCENES[name]
            scene = load_scene(demos_dir() / demo, [*sets, f"solver.iterations={iterations}"])
            model = Model.from_scene(scene)
            solver = SolverPD(model, scene.solver)
            a = model.initial_state()
            b = a.clone()
            its = 0
            contacts = 0
            for k in range(warmup + steps):
                if k == warmup:
                    before = traffic.snapshot()
                with traffic.counting():
                    st = solver.step(a, b, scene.sim.dt)
                a, b = b, a
                if k >= warmup:
                    its += st.iterations
                    contacts += st.n_contacts
            d = traffic.difference(traffic.snapshot(), before)
            rows.append(
                {
                    "scene": name,
                    "arch": info.arch,
                    "precision": info.precision,
                    "vertices": model.vertex_count,
                    "steps": steps,
                    "iterations": its,
                    "contacts_per_step": contacts / steps,
                    "acceleration": solver.info().get("acceleration"),
                    "contact_implementation": solver.info().get("contact_implementation"),
                    "per_step": {k: v / steps for k, v in d.items()},
                    "per_iteration": {k: v / max(its, 1) for k, v in d.items()},
                }
            )
        queue.put(rows)
    except Exception as e:  # report instead of hanging the parent
        queue.put([{"arch": arch, "error": f"{type(e).__name__}: {e}"}])


def traffic(archs, names, steps=5, warmup=6, iterations=5, out=None) -> list[dict]:
    """The iteration budget, one child process per backend; prints a table, returns rows."""
    ctx = mp.get_context("spawn")
    rows = []
    for arch in archs:
        q = ctx.Queue()
        proc = ctx.Process(target=_traffic_one, args=(arch, names, steps, warmup, iterations, q))
        proc.start()
        rows += q.get()
        proc.join()
    print(f"per local-global iteration ({iterations} a step; {steps} steps after {warmup}):")
    print(
        f"{'scene':<15} {'arch':<7} {'accel':<8} {'verts':>6} {'contacts':>8} {'launches':>9} {'syncs':>7} "
        f"{'B to host':>10} {'B to dev':>10} {'np args':>8} | per step: {'launches':>8} {'syncs':>6}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['arch']}: {r['error']}")
            continue
        it, st = r["per_iteration"], r["per_step"]
        print(
            f"{r['scene']:<15} {r['arch']:<7} {r['acceleration']:<8} {r['vertices']:>6} {r['contacts_per_step']:>8.0f} "
            f"{it['launches']:>9.1f} {it['syncs']:>7.1f} {it['bytes_to_host']:>10.0f} "
            f"{it['bytes_to_device']:>10.0f} {it['numpy_args']:>8.1f} | "
            f"{st['launches']:>18.0f} {st['syncs']:>6.0f}"
        )
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": machine(), "traffic": rows}, indent=2))
        print(f"wrote {out}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5.3k bar only, 10 frames")
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=None)
    p.add_argument("--backends", nargs="+", choices=BACKENDS + ["auto"], default=None)
    p.add_argument("--frames", type=int, default=None, help="measured frames (default 30, quick 10)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--arch", default="cpu", choices=["cpu", "cuda", "vulkan", "auto"])
    p.add_argument("--out", default="out/bench_pd.json")
    p.add_argument(
        "--si-build",
        type=float,
        nargs="+",
        default=None,
        metavar="BALL_RESOLUTION",
        help="instead: time the sparse-inverse build of the squeeze-ball matrix at these "
        "ball resolutions (10: 1.5k vertices, 17.6493: 7k) on each --si-archs backend",
    )
    p.add_argument("--si-archs", nargs="+", default=["cpu", "vulkan"])
    p.add_argument(
        "--traffic",
        action="store_true",
        help="instead: the iteration budget (launches, syncs, bytes) on each --traffic-archs "
        "backend, without and with contact",
    )
    p.add_argument("--traffic-archs", nargs="+", default=["cpu", "vulkan"])
    args = p.parse_args(argv)
    if args.traffic:
        traffic(
            args.traffic_archs,
            list(TRAFFIC_SCENES),
            iterations=args.iterations,
            out=args.out,
        )
        return 0
    if args.si_build:
        return si_build(args.si_build, args.si_archs, Path(args.out))
    sizes = args.sizes or (["5k"] if args.quick else list(SIZES))
    backends = args.backends or BACKENDS
    frames = args.frames or (10 if args.quick else 30)

    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores, load average {m['loadavg_start']}")
    ctx = mp.get_context("spawn")
    results = []
    header = (
        f"{'bar':>5} {'verts':>6} {'global step':>15} {'frame ms':>9} {'local':>7} {'global':>7} "
        f"{'energy':>7} {'setup s':>8} {'nnz(S)':>11} {'S MB':>8} {'S+ST MB':>8} {'peak MB':>8}"
    )
    print(header)
    for size in sizes:
        for bk in backends:
            q = ctx.Queue()
            proc = ctx.Process(target=_run_one, args=(size, bk, frames, args.warmup, args.iterations, args.arch, q))
            proc.start()
            r = q.get()
            proc.join()
            results.append(r)
            if "error" in r:
                print(f"{size:>5} {bk:>22}: {r['error']}")
                continue

            def fmt(v, width, spec):
                return format(v, spec).rjust(width) if v is not None else "-".rjust(width)

            print(
                f"{size:>5} {r['vertices']:>6} {r['global_step']:>15} {r['frame_ms_median']:>9.2f} "
                f"{r['local_ms_median']:>7.2f} {r['global_ms_median']:>7.2f} "
                f"{r['energy_ms_median']:>7.2f} "
                f"{r['setup_s']:>8.2f} {fmt(r['nnz_S'], 11, ',')} {fmt(r['S_mb'], 8, '.1f')} "
                f"{fmt(r['S_and_ST_mb'], 8, '.1f')} {r['peak_rss_mb']:>8.0f}"
            )
    m["loadavg_end"] = load_average()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": m, "settings": vars(args), "results": results}, indent=2))
    print(f"load average at the end {m['loadavg_end']}; wrote {out}")
    target = [r for r in results if r.get("size") == "5k" and "error" not in r]
    if target:
        best = min(target, key=lambda r: r["frame_ms_median"])
        print(
            f"5.3k bar, {args.iterations} iterations: best {best['frame_ms_median']:.1f} ms/frame "
            f"({best['global_step']}); target <= 33 ms on 2 cores"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
