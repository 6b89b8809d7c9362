"""Frame-time breakdown of the PD solver with frictional contact on the squeeze-ball demo.

For each ball size the demo (demos/squeeze-ball.toml) is run headless and each frame's
time is split into collision detection, building the Delassus operator W, the
nonsmooth-Newton / Conjugate Residual contact solve, and local-global (local step and
global solves), as reported by SolverPD's StepStats. Frames with contact are
summarised separately (mean, median, max), and the machine is stated.

Usage:
    .venv/bin/python benchmarks/bench_contact.py                       # 6,951 and 14,721 vertices
    .venv/bin/python benchmarks/bench_contact.py --resolution 17.6493 --frames 60 --json bench_contact.json
    .venv/bin/python benchmarks/bench_contact.py --set solver.global_step=\\"cholesky\\"
    .venv/bin/python benchmarks/bench_contact.py --arch cuda --precision f32   # on a GPU
    .venv/bin/python benchmarks/bench_contact.py --resolution 17.6493 --frames 80 --implementation both

--implementation host|device|both: the contact update per local-global iteration in numpy
(host) or in Taichi kernels (device, tisim/contact/ncp/device_ncp.py); "both" runs the two one
after the other in this process and prints them side by side.

--traffic: kernel launches, host synchronisations and bytes moved per local-global
iteration of a small squeeze-ball with device and host contact, on the CPU backend and
Vulkan (the table of bench_pd.py --traffic, contact rows only).

--peer: NVIDIA Newton's XPBD (``pip install newton``) on issue 10's twisting bar (the bar of
benchmarks/twist_accuracy.py: 5,346 vertices, Neo-Hookean E = 1e6, 10 substeps x 2 iterations,
relaxation 0.1) in a child process, one bar frame after every squeeze-ball frame, so that
both see the same load; prints the ratio of the squeeze-ball's contact-frame median to the
bar's median frame (issue 10: at most 3).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from common import machine

ROOT = Path(__file__).resolve().parent.parent
SCENE = ROOT / "demos" / "squeeze-ball.toml"


def bench(
    resolution: float,
    frames: int,
    overrides: list[str],
    implementation: str = "host",
    between_frames=None,
) -> dict:
    """The squeeze-ball at ``resolution`` for ``frames`` frames; ``between_frames()`` (if
    given) runs after every frame, outside the timed part."""
    from tisim.model import Model
    from tisim.scene import load_scene
    from tisim.solvers.pd.solver import SolverPD

    scene = load_scene(
        SCENE,
        [
            f"objects.ball.ball_resolution={resolution}",
            f'contact.implementation="{implementation}"',
            *overrides,
        ],
    )
    model = Model.from_scene(scene)
    t0 = time.perf_counter()
    solver = SolverPD(model, scene.solver)
    setup = time.perf_counter() - t0
    s0 = model.initial_state()
    s1 = s0.clone()
    rows = []
    for f in range(frames):
        t0 = time.perf_counter()
        st = solver.step(s0, s1, scene.sim.dt)
        wall = 1e3 * (time.perf_counter() - t0)
        s0, s1 = s1, s0
        if between_frames is not None:
            between_frames()
        tm = st.timings
        rows.append(
            {
                "frame": f,
                "wall_ms": wall,
                "n_contacts": st.n_contacts,
                "detect_ms": tm.get("contact_detect", 0.0),
                "delassus_ms": tm.get("contact_delassus", 0.0),
                "cr_ms": tm.get("contact_cr", 0.0),
                "local_global_ms": tm.get("local", 0.0) + tm.get("global", 0.0),
                "contact_other_ms": tm.get("contact", 0.0)
                - tm.get("contact_detect", 0.0)
                - tm.get("contact_delassus", 0.0)
                - tm.get("contact_cr", 0.0),
                "energy_ms": tm.get("energy", 0.0),
                "penetration": st.max_penetration,
            }
        )
        if not s0.is_finite():
            break
    info = solver.info()
    warm = rows[1:]  # frame 0 compiles the kernels
    contact = [r for r in warm if r["n_contacts"] > 0]
    free = [r for r in warm if r["n_contacts"] == 0]
    keys = (
        "wall_ms",
        "detect_ms",
        "delassus_ms",
        "cr_ms",
        "local_global_ms",
        "contact_other_ms",
        "energy_ms",
        "n_contacts",
    )

    def summary(rs):
        if not rs:
            return {}
        return {
            k: {
                "mean": float(np.mean([r[k] for r in rs])),
                "median": float(np.median([r[k] for r in rs])),
                "max": float(np.max([r[k] for r in rs])),
            }
            for k in keys
        }

    return {
        "implementation": implementation,
        "all_frames_median_ms": float(np.median([r["wall_ms"] for r in warm])) if warm else None,
        "resolution": resolution,
        "vertices": model.vertex_count,
        "tets": model.element_count,
        "global_step": info.get("global_step"),
        "iterations": info.get("iterations"),
        "setup_s": setup,
        "frames": len(rows),
        "contact_frames": summary(contact),
        "free_frames": summary(free),
        "per_frame": rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--resolution",
        type=float,
        nargs="+",
        default=[17.6493, 22.84],
        help="ball_resolution values (17.6493: 6,951 vertices, 22.84: 14,721; the paper's 7.1k/14.7k)",
    )
    ap.add_argument("--frames", type=int, default=70)
    ap.add_argument("--set", action="append", default=[], help="scene override, e.g. solver.iterations=5")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--implementation",
        default="host",
        choices=["host", "device", "both"],
        help="contact update in numpy (host) or Taichi kernels (device), or both",
    )
    ap.add_argument("--arch", default="cpu", choices=["cpu", "cuda", "vulkan", "auto"])
    ap.add_argument(
        "--precision", default=None, choices=["f64", "f32"], help="default: f64 on the CPU, f32 on a GPU backend"
    )
    ap.add_argument("--peer", action="store_true", help="NVIDIA Newton's XPBD twisting bar in the same run (see above)")
    ap.add_argument(
        "--traffic",
        action="store_true",
        help="instead: the iteration budget with contact (launches, host synchronisations and "
        "bytes per local-global iteration; bench_pd.py --traffic) on --traffic-archs",
    )
    ap.add_argument("--traffic-archs", nargs="+", default=["cpu", "vulkan"])
    args = ap.parse_args(argv)
    if args.traffic:
        from bench_pd import traffic

        traffic(args.traffic_archs, ["contact", "contact-host"], out=args.json)
        return 0

    from tisim import backend

    b = backend.init(args.arch, args.precision)
    mach = machine()
    print(f"machine: {mach['cpu']}, {mach['cores']} CPUs, load {mach['load_average']}, taichi {b.arch}/{b.precision}")
    results = []
    impls = ["host", "device"] if args.implementation == "both" else [args.implementation]
    peer = None
    if args.peer:
        peer = _xpbd_bar(args.frames * len(impls) * len(args.resolution))
    for res in args.resolution:
        pair = []
        for impl in impls:
            r = bench(res, args.frames, args.set, impl, peer.frame if peer else None)
            results.append(r)
            pair.append(r)
            c = r["contact_frames"]
            print(
                f"\nball_resolution {res:g} [{impl}]: {r['vertices']} vertices, {r['tets']} tets, "
                f"global step {r['global_step']}, "
                f"{r['iterations']} iterations, setup {r['setup_s']:.1f} s, "
                f"median frame (all frames after the first) {r['all_frames_median_ms']:.1f} ms"
            )
            if c:
                print(
                    f"  frames with contact: {sum(1 for x in r['per_frame'] if x['n_contacts'])}, "
                    f"contacts mean {c['n_contacts']['mean']:.0f} max {c['n_contacts']['max']:.0f}"
                )
                print(f"  {'ms per frame':<22}{'mean':>9}{'median':>9}{'max':>9}")
                for k, label in (
                    ("wall_ms", "total"),
                    ("detect_ms", "collision detection"),
                    ("delassus_ms", "W build"),
                    ("cr_ms", "Newton / CR solve"),
                    ("local_global_ms", "local-global"),
                    ("contact_other_ms", "contact other"),
                    ("energy_ms", "energy (stats)"),
                ):
                    ck = c[k]
                    print(f"  {label:<22}{ck['mean']:>9.1f}{ck['median']:>9.1f}{ck['max']:>9.1f}")
            f = r["free_frames"]
            if f:
                print(
                    f"  frames without contact: total {f['wall_ms']['mean']:.1f} ms mean "
                    f"(local-global {f['local_global_ms']['mean']:.1f})"
                )
        if len(pair) == 2 and pair[0]["contact_frames"] and pair[1]["contact_frames"]:
            ch, cd = pair[0]["contact_frames"], pair[1]["contact_frames"]
            head = "side by side, frames with contact, median ms"
            print(f"\n  {head:<42}{'host':>9}{'device':>9}{'ratio':>8}")
            for k, label in (
                ("wall_ms", "total"),
                ("detect_ms", "collision detection"),
                ("delassus_ms", "W build (+ upload)"),
                ("cr_ms", "Newton / CR solve"),
                ("local_global_ms", "local-global"),
                ("contact_other_ms", "contact other"),
            ):
                mh, md = ch[k]["median"], cd[k]["median"]
                ratio = md / mh if mh else float("nan")
                print(f"  {label:<42}{mh:>9.1f}{md:>9.1f}{ratio:>8.2f}")
            mh, md = pair[0]["all_frames_median_ms"], pair[1]["all_frames_median_ms"]
            print(f"  {'whole demo, median frame':<42}{mh:>9.1f}{md:>9.1f}{md / mh:>8.2f}")
            dx = max(
                abs(x["penetration"] - y["penetration"]) for x, y in zip(pair[0]["per_frame"], pair[1]["per_frame"])
            )
            print(f"  largest per-frame difference in max penetration: {dx:.2e} m")
    peer_summary = None
    if peer is not None:
        peer.close()
        peer_summary = _peer_summary(peer, results)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": mach,
                    "peer": peer_summary,
                    "arch": b.arch,
                    "precision": b.precision,
                    "scene": str(SCENE.name),
                    "overrides": args.set,
                    "results": results,
                },
                indent=2,
            )
        )
        print(f"\nwrote {args.json}")
    return 0


def _xpbd_bar(frames: int):
    """benchmarks/twist_accuracy.py's Newton XPBD run on its bar, ready for ``frames`` frames."""
    from twist_accuracy import PeerRun, bar_scene

    from tisim.model import Model

    model = Model.from_scene(bar_scene(5, 0.01, [65, 8, 8]))
    peer = PeerRun(model, frames, {"substeps": 10, "iterations": 2, "relaxation": 0.1})
    if peer.error:
        print(f"Newton: {peer.error}")
    return peer


def _peer_summary(peer, results: list[dict], warmup: int = 5) -> dict | None:
    """Print and return the bar's median frame and each run's contact-frame ratio to it."""
    if peer.error or len(peer.ms) <= warmup:
        print(f"\nNewton XPBD bar: no timing ({peer.error or 'too few frames'})")
        return None
    bar = float(np.median(peer.ms[warmup:]))
    out = {"label": peer.label, "info": peer.info, "frame_ms_median": bar, "ratios": []}
    print(
        f"\n{peer.label} on the twisting bar ({peer.info.get('vertices')} vertices), "
        f"same run: median frame {bar:.1f} ms"
    )
    for r in results:
        c = r["contact_frames"]
        if not c:
            continue
        med = c["wall_ms"]["median"]
        out["ratios"].append(
            {
                "implementation": r["implementation"],
                "resolution": r["resolution"],
                "contact_frame_ms_median": med,
                "ratio": med / bar,
            }
        )
        print(
            f"  squeeze-ball {r['vertices']} vertices [{r['implementation']}]: contact frames "
            f"{med:.1f} ms median = {med / bar:.2f}x the XPBD bar frame (issue 10: at most 3)"
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
