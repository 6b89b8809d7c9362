"""Toss sweep (issue 9, the toss demo): do the preview and the refined result agree
on hit or miss?

Runs ``tisim refine`` on the toss scene for a sweep of throw speeds (the x component
of ``objects.toy.velocity``) and records, per speed and level, whether the toy's
centre of mass went through the hole (``tisim.progressive.through_hole``) and at which
frame. With ``--direct`` it also simulates the finest mesh plainly (its own shell
energy and inertia), which the paper reports hits or misses depending on resolution.
Prints a table and writes toss_sweep.json.

    python studies/toss_sweep.py --speeds 0.7 1.9 12 --out out/toss-sweep [--direct] [--set ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def direct_com(r, level: int, frames: int) -> np.ndarray:
    """(frames + 1, 3): the centre of mass of a plain simulation of ``level``'s mesh."""
    s, st, hs = r.solver(level, direct=True), r.initial_state(level), r.handles(level)
    m = s.cloth_mass
    com = [(m[:, None] * st.x).sum(0) / m.sum()]
    for _ in range(frames):
        for _ in range(r.substeps):
            st, _ = r.step_level(level, st, st.x + r.h * st.v, None, solver=s, handles=hs)
        com.append((m[:, None] * st.x).sum(0) / m.sum())
    return np.asarray(com)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scene", default="toss")
    ap.add_argument(
        "--speeds",
        nargs=3,
        type=float,
        default=[0.7, 1.9, 12],
        metavar=("LO", "HI", "COUNT"),
        help="throw speeds along x, m/s: COUNT values from LO to HI",
    )
    ap.add_argument("--vy", type=float, default=None, help="vertical throw speed (default: the scene's)")
    ap.add_argument("--frames", type=int, default=None)
    ap.add_argument("--levels", type=int, default=None)
    ap.add_argument("--direct", action="store_true", help="also simulate the finest mesh directly")
    ap.add_argument("--out", type=Path, default=Path("out/toss-sweep"))
    ap.add_argument("--set", action="append", default=[], help="scene override, KEY=VALUE")
    a = ap.parse_args(argv)

    from tisim import backend
    from tisim.cli.app import demos_dir
    from tisim.progressive import Hole, ProgressiveRefiner, level_com, through_hole
    from tisim.scene import load_scene

    backend.init("cpu", "f64")
    path = Path(a.scene) if Path(a.scene).exists() else demos_dir() / f"{a.scene}.toml"
    base = load_scene(path, a.set)
    hole = Hole.from_boxes(base)
    toy = base.refine.object or next(k for k, o in base.objects.items() if o.kind == "cloth")
    v0 = base.objects[toy].velocity
    vy = v0[1] if a.vy is None else a.vy
    frames = a.frames or base.sim.frames
    speeds = np.linspace(a.speeds[0], a.speeds[1], int(a.speeds[2]))
    rows = []
    print(f"{'vx m/s':>8} {'preview':>9} {'refined':>9}" + (f" {'direct':>9}" if a.direct else "") + "  agree")
    for vx in speeds:
        sc = load_scene(path, [*a.set, f"objects.{toy}.velocity=[{vx:.6g},{vy:.6g},{v0[2]:.6g}]"])
        out = a.out / f"vx_{vx:.4f}"
        t0 = time.perf_counter()
        r = ProgressiveRefiner(sc, out, levels=a.levels, progress=False, export_meshes=False)
        res = r.run(frames)
        if res.ended != "completed":
            print(f"vx = {vx:.4g}: {res.ended}: {res.message}", file=sys.stderr)
            return 1
        hits = {f"level_{k}": through_hole(level_com(out, k), hole) for k in range(r.L + 1)}
        row = {"vx": float(vx), "vy": float(vy), **hits, "seconds": time.perf_counter() - t0}
        if a.direct:
            row["direct_finest"] = through_hole(direct_com(r, r.L, frames), hole)
        row["agree"] = all((hits[f"level_{k}"] is None) == (hits["level_0"] is None) for k in range(r.L + 1))
        rows.append(row)

        def word(f):
            return "miss" if f is None else f"hit@{f}"

        a.out.mkdir(parents=True, exist_ok=True)  # after every speed, so a cut-short sweep keeps its rows
        (a.out / "toss_sweep_rows.json").write_text(json.dumps(rows, indent=2))
        print(
            f"{vx:8.3f} {word(hits['level_0']):>9} {word(hits[f'level_{r.L}']):>9}"
            + (f" {word(row['direct_finest']):>9}" if a.direct else "")
            + f"  {'yes' if row['agree'] else 'NO'}",
            flush=True,
        )
    disagree = [r_["vx"] for r_ in rows if not r_["agree"]]
    summary = {
        "scene": base.name,
        "hole": {"lo": hole.lo, "hi": hole.hi, "top": hole.top},
        "frames": frames,
        "speeds": len(rows),
        "hits_preview": sum(r_["level_0"] is not None for r_ in rows),
        "disagreements": disagree,
        "rows": rows,
    }
    if a.direct:
        summary["direct_disagreements"] = [
            r_["vx"] for r_ in rows if (r_["direct_finest"] is None) != (r_["level_0"] is None)
        ]
    print(
        f"{len(rows)} speeds, preview hits {summary['hits_preview']}, preview/refined disagree at "
        f"{disagree or 'none'}"
        + (f"; direct fine vs preview disagree at {summary['direct_disagreements'] or 'none'}" if a.direct else "")
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "toss_sweep.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {a.out / 'toss_sweep.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
