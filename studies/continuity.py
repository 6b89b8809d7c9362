"""Temporal continuity of progressive refinement (notes §5.6 and the addendum's
follow-up critique): per-frame second differences of every level against those of a
direct simulation of the same mesh.

For each level l the refiner's stats.csv has s_l(t) = max over the frame's steps of
max_i |x^{k+1}_i - 2 x^k_i + x^{k-1}_i| (m). This tool simulates each level's mesh
directly (its own shell energy, inertia x + h v) for d_l(t), the same measure, and
reports per level:

* ``mean_ratio``: mean s_l / mean d_l (overall jitter against the plain simulation);
* ``jump_ratio``: max_t s_l(t) / max d_l over frames t-2..t+2 (a jump is a frame far
  above what the plain simulation of that mesh does at that moment);
* ``jumps``: frames with s_l(t) > 3 max d_l(t-2..t+2) and s_l(t) > 3 median(s_l) (an
  isolated spike, not a stretch of hard contact both show);

for each ``refine.position_gain`` given (1 = the paper's re-prolonged position; < 1 =
separate position and velocity prolongation), with the finest level's centre-of-mass
distance from the preview (the consistency that a smaller gain could cost). Prints a
table and writes continuity.json.

    python studies/continuity.py --scene refine-drape --resolution 4 --levels 2 --frames 30 --gains 1 0.2
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np


def direct_second_difference(r, level: int, frames: int) -> np.ndarray:
    """(frames,): s(t) of a plain simulation of ``level``'s mesh, as the refiner measures it."""
    s, st, hs = r.solver(level, direct=True), r.initial_state(level), r.handles(level)
    x_prev = st.x - r.h * st.v
    out = []
    for _ in range(frames):
        sec = 0.0
        for _ in range(r.substeps):
            new, _ = r.step_level(level, st, st.x + r.h * st.v, None, solver=s, handles=hs)
            sec = max(sec, float(np.abs(new.x - 2 * st.x + x_prev).max()))
            x_prev, st = st.x, new
        out.append(sec)
    return np.asarray(out)


def level_second_difference(out: Path, level: int) -> np.ndarray:
    with open(out / f"level_{level}" / "stats.csv") as f:
        return np.array([float(r["second_difference"]) for r in list(csv.DictReader(f))[1:]])


def analyse(s: np.ndarray, d: np.ndarray, window: int = 2) -> dict:
    n = min(len(s), len(d))
    s, d = s[:n], d[:n]
    dmax = np.array([d[max(0, t - window) : t + window + 1].max() for t in range(n)])
    ratio = s / np.maximum(dmax, 1e-300)
    med = float(np.median(s))
    jumps = [int(t + 1) for t in np.flatnonzero((ratio > 3.0) & (s > 3.0 * med))]
    return {
        "mean_ratio": float(s.mean() / d.mean()),
        "jump_ratio": float(ratio.max()),
        "jump_frame": int(np.argmax(ratio)) + 1,
        "jumps": jumps,
        "mean_m": float(s.mean()),
        "direct_mean_m": float(d.mean()),
        "max_m": float(s.max()),
        "direct_max_m": float(d.max()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scene", default="refine-drape")
    ap.add_argument(
        "--resolution", type=int, default=4, help="preview cells per side (generated sheets; 0: the scene's)"
    )
    ap.add_argument("--levels", type=int, default=2)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--gains", nargs="+", type=float, default=[1.0, 0.2])
    ap.add_argument("--out", type=Path, default=Path("out/continuity"))
    ap.add_argument("--set", action="append", default=[], help="scene override, KEY=VALUE")
    ap.add_argument("--reuse", action="store_true", help="reuse finished runs and direct series in --out")
    a = ap.parse_args(argv)

    from tisim import backend
    from tisim.cli.app import demos_dir
    from tisim.progressive import ProgressiveRefiner
    from tisim.scene import load_scene

    backend.init("cpu", "f64")
    path = Path(a.scene) if Path(a.scene).exists() else demos_dir() / f"{a.scene}.toml"
    base = load_scene(path, a.set)
    sets = list(a.set)
    cloth = next(k for k, o in base.objects.items() if o.kind == "cloth")
    if base.objects[cloth].generator == "cloth" and a.resolution > 0:
        sets.append(f"objects.{cloth}.cloth_resolution=[{a.resolution},{a.resolution}]")
    a.out.mkdir(parents=True, exist_ok=True)
    result = {"scene": base.name, "frames": a.frames, "levels": a.levels, "direct": {}, "gains": {}}
    direct = None
    for g in a.gains:
        sc = load_scene(path, [*sets, f"refine.position_gain={g}"])
        out = a.out / f"gain_{g:g}"
        r = ProgressiveRefiner(sc, out, levels=a.levels, progress=False, export_meshes=False)
        done = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
        if a.reuse and done.get("ended") == "completed" and r.last_checkpoint(r.L) == a.frames:
            consistency = done["consistency"]  # a finished run of the same settings
        else:
            res = r.run(a.frames)
            if res.ended != "completed":
                print(f"gain {g}: {res.ended}: {res.message}")
                return 1
            consistency = res.info["consistency"]
        if direct is None:
            cache = a.out / f"direct_{a.frames}.npz"
            if a.reuse and cache.exists():
                with np.load(cache) as z:
                    direct = {k: z[f"level_{k}"] for k in range(r.L + 1)}
            else:
                direct = {k: direct_second_difference(r, k, a.frames) for k in range(r.L + 1)}
                np.savez(cache, **{f"level_{k}": v for k, v in direct.items()})
            result["vertices"] = [lv.vertex_count for lv in r.hierarchy.levels]
            result["direct"] = {f"level_{k}": v.tolist() for k, v in direct.items()}
        per = {f"level_{k}": analyse(level_second_difference(out, k), direct[k]) for k in range(r.L + 1)}
        per["com_distance_max_rel"] = consistency[f"level_{r.L}"]["com_distance_max_rel"]
        per["second_difference"] = {f"level_{k}": level_second_difference(out, k).tolist() for k in range(r.L + 1)}
        result["gains"][f"{g:g}"] = per
    print(f"{result['scene']}: {' -> '.join(map(str, result['vertices']))} vertices, {a.frames} frames")
    print(
        f"{'gain':>6} {'level':>6} {'mean s/d':>9} {'max jump':>9} {'@frame':>7} {'jumps':>6} "
        f"{'finest COM dev % diag':>22}"
    )
    for g, per in result["gains"].items():
        for k in range(a.levels):
            q = per[f"level_{k}"]
            print(
                f"{g:>6} {k:>6} {q['mean_ratio']:9.2f} {q['jump_ratio']:9.2f} {q['jump_frame']:7d} "
                f"{len(q['jumps']):6d} {100 * per['com_distance_max_rel'] if k == a.levels - 1 else float('nan'):22.3f}"
            )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "continuity.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {a.out / 'continuity.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
