"""Time one broad-phase detection (tisim/contact/ipc/broad_phase.py) on cloth-like scenes.

A 64 x 64-vertex sheet (the cloth-drape benchmark's size; --cells 8 for the refine
preview's 9 x 9) with a 2,562-vertex geodesic sphere as a static obstacle, in two poses: flat just above the sphere, and draped (the
sheet's vertices pushed out of the sphere and dropped onto it, so thousands of pairs are
close). Each detection is timed after a warm-up (kernels compiled); the table gives the
median and the quartiles of --repeats detections, the build and query split, and the
pair counts, which must not depend on the implementation. The sphere is inserted into
its own grid once while it stays put; the last column ("moving") is the median of
detections that each move it by 1 nm, so that its grid is rebuilt every time, as for an
obstacle moving through the step.

Usage:
    .venv/bin/python benchmarks/bench_broad_phase.py [--repeats 30] [--arch cpu] [--json out.json]

To compare two versions of the broad phase, run this script with PYTHONPATH pointing at
each checkout in the same session and compare the medians' ratio (the pair counts must
be equal).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def scenes(cells: int = 63) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """name -> (x, faces, edges, active) with the sheet (cells + 1 vertices a side) first and
    the sphere after it."""
    from tisim.geometry import generate
    from tisim.geometry.topology import edges

    sphere = generate.geodesic_sphere(16)  # 2,562 vertices, unit radius
    radius = 0.5
    xs = np.asarray(sphere.vertices, dtype=np.float64) * radius
    fs = np.asarray(sphere.faces, dtype=np.int64)
    sheet = generate.cloth_grid(size=(1.6, 1.6), resolution=(cells, cells), center=(0.0, 0.0, 0.0))
    xc = np.asarray(sheet.vertices, dtype=np.float64)
    fc = np.asarray(sheet.faces, dtype=np.int64)

    flat = xc.copy()
    flat[:, 1] = radius + 0.004
    draped = xc.copy()
    r_xz = np.hypot(draped[:, 0], draped[:, 2])
    inside = r_xz < radius
    draped[:, 1] = np.where(inside, np.sqrt(np.maximum(radius**2 - r_xz**2, 0.0)), 0.0) + 0.002
    out = {}
    for name, cloth in (("flat", flat), ("draped", draped)):
        x = np.concatenate([cloth, xs])
        f = np.concatenate([fc, fs + len(cloth)])
        active = np.zeros(len(x), dtype=bool)
        active[: len(cloth)] = True
        out[name] = (x, f, edges(f), active)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--cells", type=int, default=63, help="sheet cells a side (63: 64 x 64 vertices)")
    ap.add_argument("--inflation", type=float, default=0.003, help="dhat + thickness, metres")
    ap.add_argument("--arch", default="cpu")
    ap.add_argument("--precision", default="f64")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import taichi as ti
    from common import machine

    from tisim import backend
    from tisim.contact.ipc.broad_phase import BroadPhase

    backend.init(arch=args.arch, precision=args.precision)
    rows = {}
    for name, (x, f, e, active) in scenes(args.cells).items():
        bp = BroadPhase(len(x), f, e, active)
        xf = ti.Vector.ndarray(3, backend.real(), len(x))
        xf.from_numpy(x.astype(backend.np_real()))
        counts = bp.detect(xf, args.inflation)  # warm-up: compiles
        times, build, query = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            c = bp.detect(xf, args.inflation)
            times.append(time.perf_counter() - t0)
            build.append(bp.last_timings["build"])
            query.append(bp.last_timings["query"])
            assert c == counts, "pair counts changed between identical detections"
        obstacle = ~np.asarray(active, dtype=bool)
        moving = []
        for k in range(args.repeats):
            xm = x.copy()
            xm[obstacle, 1] += 1e-9 * (1 + k % 2)
            xf.from_numpy(xm.astype(backend.np_real()))
            t0 = time.perf_counter()
            bp.detect(xf, args.inflation)
            moving.append(time.perf_counter() - t0)
        q1, med, q3 = np.percentile(np.array(times) * 1e3, [25, 50, 75])
        rows[name] = {
            "vertices": int(len(x)), "faces": int(len(f)), "edges": int(len(e)),
            "pt_pairs": int(counts[0]), "ee_pairs": int(counts[1]),
            "median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3),
            "build_median_ms": float(np.median(build) * 1e3),
            "query_median_ms": float(np.median(query) * 1e3),
            "moving_median_ms": float(np.median(moving) * 1e3),
        }  # fmt: skip

    info = {"machine": machine(), "arch": args.arch, "precision": args.precision,
            "repeats": args.repeats, "cells": args.cells, "inflation": args.inflation, "scenes": rows}  # fmt: skip
    print(f"broad phase, {args.arch} {args.precision}, median of {args.repeats} detections")
    print(f"{'scene':8} {'pt':>7} {'ee':>7} {'median ms':>10} {'q1-q3 ms':>14} {'build':>7} {'query':>7} {'moving':>7}")
    for name, r in rows.items():
        print(
            f"{name:8} {r['pt_pairs']:7d} {r['ee_pairs']:7d} {r['median_ms']:10.2f} "
            f"{r['q1_ms']:6.2f}-{r['q3_ms']:<7.2f} {r['build_median_ms']:7.2f} {r['query_median_ms']:7.2f} "
            f"{r['moving_median_ms']:7.2f}"
        )
    m = info["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, load {m['load_average']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(info, fh, indent=2)


if __name__ == "__main__":
    main()
