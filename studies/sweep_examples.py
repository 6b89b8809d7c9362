"""The README's two sweep examples, run with ``tisim.sweep`` on a 2-worker LocalCluster.

1. ``stick-slip``: demos/stick-slip.toml (a box on a plane inclined by 10 degrees), the
   friction coefficient swept over 0.15..0.20. Coulomb friction holds the box for
   mu >= tan(10 deg) = 0.17633 and lets it slide for mu < tan(10 deg), where it moves
   (g (sin theta - mu cos theta)) t^2 / 2 in t seconds; the final displacement of the
   centre of mass jumps by orders of magnitude between the two mu values around tan(theta),
   marked on the plot. The checks: every mu below tan(theta) slides at least half the
   analytic distance, every mu above it moves less than 1/20 of the smallest analytic slide.
2. ``spinning-bar``: demos/spinning-bar.toml (a free Neo-Hookean bar spinning in space),
   Young's modulus swept for the two ADMM integrators (solver.integrator = midpoint,
   energy-momentum): the energy drift of the midpoint rule grows with the stiffness, the
   energy-momentum integrator's stays at round-off; the frame time is the price.

Each example writes its sweep folder under ``--out`` (default out/sweeps) and copies
the plot to docs/sweep-NAME.png and a JSON summary to studies/results/sweep-NAME/DATE.json. Rerunning reuses the finished
runs (the sweep resumes).

Usage:
    .venv/bin/python studies/sweep_examples.py                 # both
    .venv/bin/python studies/sweep_examples.py stick-slip --frames 60 --workers 2
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMOS = ROOT / "demos"
DOCS = ROOT / "docs"
RESULTS = ROOT / "studies" / "results"


def stick_slip(out: Path, workers: int, frames: int, count: int) -> dict:
    from tisim.sweep import Metric, parse_vary, sweep

    theta = math.radians(10.0)
    tan = math.tan(theta)
    vary = parse_vary(f"contact.mu=0.15:0.20:{count}")
    res = sweep(
        DEMOS / "stick-slip.toml",
        [vary],
        out,
        frames=frames,
        workers=workers,
        metrics=[Metric("final_displacement")],
        quiet_dask=True,
        title=f"stick-slip: a box on a 10° incline for {frames * 0.01:g} s; it slides for mu < tan 10°",
        vlines={"contact.mu": [(tan, " tan 10°")]},
    )
    dt = 0.01  # demos/stick-slip.toml
    t = frames * dt
    table = []
    ok = True
    # the smallest analytic slide (the mu value just below tan(theta)); a box that sticks
    # still settles elastically and creeps for a few steps while the contact forces build up
    # (~30 micrometres here), far below it
    smallest = min(
        0.5 * 9.81 * (math.sin(theta) - r["contact.mu"] * math.cos(theta)) * (frames * 0.01) ** 2
        for r in res.rows
        if r["contact.mu"] < tan
    )
    for r in res.rows:
        mu = r["contact.mu"]
        a = 9.81 * (math.sin(theta) - mu * math.cos(theta))
        analytic = 0.5 * max(a, 0.0) * t * t
        d = r["final_displacement"]
        if mu < tan:
            good = r["ended"] == "completed" and d >= 0.5 * analytic
        else:
            good = r["ended"] == "completed" and d < 0.05 * smallest
        ok &= good
        table.append(
            {
                "mu": mu,
                "ended": r["ended"],
                "displacement_m": d,
                "analytic_slide_m": analytic,
                "check": "ok" if good else "FAILED",
            }
        )
    return {
        "scene": "demos/stick-slip.toml",
        "tan_theta": tan,
        "frames": frames,
        "seconds": t,
        "runs": table,
        "all_checks_pass": bool(ok),
        "ran": res.ran,
        "skipped": res.skipped,
    }


def spinning_bar(out: Path, workers: int, frames: int, moduli: str, resolution: str) -> dict:
    from tisim.sweep import Metric, parse_metric, parse_vary, sweep

    varies = [
        parse_vary(f"objects.bar.youngs_modulus={moduli}"),
        parse_vary("solver.integrator=midpoint,energy-momentum"),
    ]
    res = sweep(
        DEMOS / "spinning-bar.toml",
        varies,
        out,
        frames=frames,
        workers=workers,
        sets=[f"objects.bar.resolution={resolution}"],
        metrics=[Metric("energy_drift"), Metric("frame_ms"), parse_metric("min_volume_ratio:min")],
        quiet_dask=True,
        title=f"spinning bar ({resolution} cells), {frames} frames of 2 x 0.005 s: ADMM integrators",
    )
    table = [
        {
            "youngs_modulus": r["objects.bar.youngs_modulus"],
            "integrator": r["solver.integrator"],
            "ended": r["ended"],
            "energy_drift": r["energy_drift"],
            "frame_ms": r["frame_ms"],
            "min_volume_ratio": r["min_volume_ratio:min"],
        }
        for r in res.rows
    ]
    return {
        "scene": "demos/spinning-bar.toml",
        "frames": frames,
        "resolution": resolution,
        "runs": table,
        "ran": res.ran,
        "skipped": res.skipped,
    }


def _small_png(src: Path, dst: Path) -> None:
    """A copy of the plot with a 64-colour palette, small enough to commit."""
    from PIL import Image

    Image.open(src).convert("RGB").quantize(colors=64).save(dst, optimize=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", nargs="*", default=["stick-slip", "spinning-bar"], choices=["stick-slip", "spinning-bar"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "sweeps")
    ap.add_argument("--frames", type=int, default=None, help="frames per run (default: 60 and 40)")
    ap.add_argument("--count", type=int, default=11, help="stick-slip: mu values over 0.15..0.20")
    ap.add_argument("--moduli", default="3e3,1e4,3e4", help="spinning-bar: Young's moduli, Pa")
    ap.add_argument("--resolution", default="[10,2,2]", help="spinning-bar: the bar's cells")
    ap.add_argument("--no-docs", action="store_true", help="do not copy the plots into docs/")
    a = ap.parse_args(argv)
    from tisim.outputs import machine

    status = 0
    for name in a.which:
        t0 = time.perf_counter()
        out = a.out / name
        if name == "stick-slip":
            summary = stick_slip(out, a.workers, a.frames or 60, a.count)
            for r in summary["runs"]:
                print(
                    f"mu {r['mu']:.4f}  {r['ended']:10s} displacement {r['displacement_m']:.3e} m  "
                    f"(analytic slide {r['analytic_slide_m']:.3e} m)  {r['check']}"
                )
            status |= 0 if summary["all_checks_pass"] else 1
        else:
            summary = spinning_bar(out, a.workers, a.frames or 40, a.moduli, a.resolution)
            for r in summary["runs"]:
                print(
                    f"E {r['youngs_modulus']:9.3g} Pa  {r['integrator']:16s} {r['ended']:10s} energy drift "
                    f"{r['energy_drift']:.2e}  {r['frame_ms']:8.1f} ms/frame  min det F {r['min_volume_ratio']:.3f}"
                )
        summary.update(workers=a.workers, wall_s=time.perf_counter() - t0, machine=machine())
        print(f"{name}: {summary['ran']} runs, {summary['skipped']} reused, {summary['wall_s']:.0f} s; {out}/")
        if not a.no_docs:
            _small_png(out / "sweep.png", DOCS / f"sweep-{name}.png")
            kept = RESULTS / f"sweep-{name}" / f"{time.strftime('%Y-%m-%d')}.json"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps(summary, indent=2, default=str) + "\n")
            print(f"wrote docs/sweep-{name}.png and {kept.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
