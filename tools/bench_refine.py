"""Cost of progressive refinement (notes §4, §5.8): preview ms/frame against direct
simulation of the finest and the coarsest mesh, finest level against direct fine per
step, and the pipelined schedule's wall time against the sequential one.

3 levels by Loop subdivision, so the finest level has 16x the preview's faces.
Prints a table and writes bench_refine.json.

    python tools/bench_refine.py --frames 10 --resolution 4 --out out/bench-refine

On a machine with fewer cores than levels the pipelined schedule (one process per
level) cannot beat the sequential one: the processes share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scene", default="refine-drape")
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--resolution", type=int, default=4, help="preview cells per side (refine-drape's sheet)")
    ap.add_argument("--out", type=Path, default=Path("out/bench-refine"))
    ap.add_argument("--no-pipelined", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="scene override, KEY=VALUE")
    a = ap.parse_args(argv)

    from tisim import backend
    from tisim.cli.app import demos_dir
    from tisim.progressive import ProgressiveRefiner
    from tisim.scene import load_scene

    backend.init("cpu", "f64")
    path = Path(a.scene) if Path(a.scene).exists() else demos_dir() / f"{a.scene}.toml"
    sets = [f"objects.cloth.cloth_resolution=[{a.resolution},{a.resolution}]", "refine.method=loop", *a.set]
    sc = load_scene(path, sets)
    row = {"scene": sc.name, "frames": a.frames, "cores": os.cpu_count()}

    r = ProgressiveRefiner(sc, a.out / "sequential", levels=3, progress=False, export_meshes=False)
    faces = [lv.face_count for lv in r.hierarchy.levels]
    row["vertices"] = [lv.vertex_count for lv in r.hierarchy.levels]
    row["faces"] = faces
    assert faces[-1] >= 16 * faces[0]
    r.run(1)  # compile every kernel once, outside the timings
    t0 = time.perf_counter()
    res = r.run(a.frames, schedule="sequential", direct=True)
    row["sequential_wall_s"] = time.perf_counter() - t0
    row["sequential_levels_s"] = [li["total_s"] for li in res.info["levels"]]
    d = res.info["direct"]
    row["preview_ms"] = res.info["levels"][0]["median_ms"]
    row["finest_ms"] = res.info["levels"][-1]["median_ms"]
    row["direct_coarse_ms"] = d["level_0_median_ms"]
    row["direct_fine_ms"] = d["level_2_median_ms"]
    row["preview_speedup_vs_direct_fine"] = row["direct_fine_ms"] / row["preview_ms"]
    row["preview_cost_vs_direct_coarse"] = row["preview_ms"] / row["direct_coarse_ms"]
    row["finest_cost_vs_direct_fine"] = row["finest_ms"] / row["direct_fine_ms"]
    # the sequential levels alone (no direct runs), for the schedule comparison
    row["sequential_refine_s"] = sum(row["sequential_levels_s"])
    if not a.no_pipelined:
        rp = ProgressiveRefiner(sc, a.out / "pipelined", levels=3, progress=False, export_meshes=False)
        # one frame first: each worker process compiles (or loads from Taichi's offline
        # cache) every kernel at its first step, which is not the schedule's cost
        t0 = time.perf_counter()
        rp.run(1, schedule="pipelined")
        row["pipelined_warmup_1_frame_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        resp = rp.run(a.frames, schedule="pipelined")
        row["pipelined_wall_s"] = time.perf_counter() - t0  # includes each process's start and compile
        row["pipelined_levels_process_s"] = [li.get("process_s") for li in resp.info["levels"]]
        row["pipelined_levels_stepping_s"] = [li["total_s"] for li in resp.info["levels"]]

    print(f"{sc.name}: {' -> '.join(map(str, row['vertices']))} vertices ({' -> '.join(map(str, faces))} faces), "
          f"{a.frames} frames, {row['cores']} cores")
    print(f"  {'preview':<28}{row['preview_ms']:9.1f} ms/frame")
    print(f"  {'direct coarse':<28}{row['direct_coarse_ms']:9.1f} ms/frame  (preview / direct coarse "
          f"{row['preview_cost_vs_direct_coarse']:.2f}x)")
    print(f"  {'direct fine':<28}{row['direct_fine_ms']:9.1f} ms/frame  (preview speed-up "
          f"{row['preview_speedup_vs_direct_fine']:.2f}x)")
    print(f"  {'finest level':<28}{row['finest_ms']:9.1f} ms/frame  (finest / direct fine "
          f"{row['finest_cost_vs_direct_fine']:.2f}x)")
    print(f"  {'sequential refine':<28}{row['sequential_refine_s']:9.2f} s (levels stepping)")
    if "pipelined_wall_s" in row:
        print(f"  {'pipelined refine':<28}{row['pipelined_wall_s']:9.2f} s wall (3 processes, incl. their start "
              f"and kernel loading; a 1-frame warm-up took {row['pipelined_warmup_1_frame_s']:.1f} s; "
              f"stepping {', '.join(f'{s:.1f}' for s in row['pipelined_levels_stepping_s'])} s)")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bench_refine.json").write_text(json.dumps(row, indent=2))
    print(f"wrote {a.out / 'bench_refine.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
