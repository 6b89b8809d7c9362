"""Benchmark of a fresh machine's first run: how long a demo's first frames take when every
kernel compiles (an empty kernel cache), with Taichi's IR optimisation passes on for every
kernel ("on", Taichi's default) and as tisim sets them ("tisim": off for the kernels
outside ``tisim._taichi_patches.ir_passes.KEEP_PASSES``) or off for all ("off", with
``--all``), and the frame time once compiled, in the same child processes.

Each (demo, setting, repeat) runs in its own child process with an empty Taichi cache
folder (``TI_OFFLINE_CACHE_FILE_PATH``) and ``TISIM_TAICHI_IR_OPT`` = 1 ("on"), unset
("tisim") or 0 ("off"). The child times ``tisim.load(demo).run(frames=2)`` (compile and the first frames:
"first run"), then a second simulation of the same demo over ``--frames`` frames (its
kernels compiled: "frame time"). Settings alternate within each repeat, so a drift of the
machine's load reaches both alike; the table gives medians over the repeats.

    .venv/bin/python benchmarks/bench_compile.py                       # 5 demos, 3 repeats
    .venv/bin/python benchmarks/bench_compile.py --demos squeeze-ball --repeat 1

Results: ``benchmarks/results/compile/<date>-<machine>.json``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, load_average, machine, median, result_path, write_json

DEMOS = ("squeeze-ball", "twisting-bar", "spinning-bar", "cloth-drape", "refine-drape")
SETTINGS = {"on": "1", "tisim": None, "off": "0"}

_CHILD = """
import json, sys, time
from tisim import backend
backend.init("cpu", "f64")
import tisim
demo, frames = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
tisim.load(demo).run(frames=2, out=sys.argv[3] + "/a")
t1 = time.perf_counter()
tisim.load(demo).run(frames=frames, out=sys.argv[3] + "/b")
t2 = time.perf_counter()
print(json.dumps({"first_s": t1 - t0, "frame_ms": 1e3 * (t2 - t1) / frames}))
"""


def run_child(demo: str, setting: str, frames: int) -> dict:
    """One cold child: {"first_s", "frame_ms"}."""
    with tempfile.TemporaryDirectory(prefix="tisim-bench-compile-") as tmp:
        env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=str(Path(tmp) / "cache"))
        env.pop("TISIM_TAICHI_IR_OPT", None)
        if SETTINGS[setting] is not None:
            env["TISIM_TAICHI_IR_OPT"] = SETTINGS[setting]
        env["TISIM_QUIET"] = "1"
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, demo, str(frames), tmp],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"{demo} ({setting}) failed:\n{out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demos", nargs="+", default=list(DEMOS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--frames", type=int, default=20, help="frames timed after the compile")
    ap.add_argument("--all", action="store_true", help="also the passes off for every kernel")
    ap.add_argument("--json", type=Path, help="write here instead of benchmarks/results/compile/")
    a = ap.parse_args()
    settings = list(SETTINGS) if a.all else ["on", "tisim"]
    m = machine()
    runs: dict[str, dict[str, list[dict]]] = {d: {s: [] for s in settings} for d in a.demos}
    t_start = time.time()
    for r in range(a.repeat):
        for d in a.demos:
            order = settings if r % 2 == 0 else settings[::-1]
            for s in order:
                runs[d][s].append(run_child(d, s, a.frames))
                print(f"  repeat {r + 1}: {d} passes {s}: {runs[d][s][-1]}", flush=True)
    rows = []
    print()
    others = settings[1:]
    head = "".join(f" {s:>8s} {'/ on':>5s}" for s in others)
    print(f"{'demo':16s} {'first run s, on':>15s}{head}   {'ms/frame, on':>12s}{head}")
    for d in a.demos:
        row = {"demo": d}
        for s in settings:
            row[f"first_s_{s}"] = median(x["first_s"] for x in runs[d][s])
            row[f"frame_ms_{s}"] = median(x["frame_ms"] for x in runs[d][s])
        rows.append(row)
        first = "".join(f" {row[f'first_s_{s}']:8.2f} {row[f'first_s_{s}'] / row['first_s_on']:5.2f}" for s in others)
        frame = "".join(
            f" {row[f'frame_ms_{s}']:8.1f} {row[f'frame_ms_{s}'] / row['frame_ms_on']:5.2f}" for s in others
        )
        print(f"{d:16s} {row['first_s_on']:15.2f}{first}   {row['frame_ms_on']:12.1f}{frame}")
    m["loadavg_end"] = load_average()
    path = a.json or result_path("compile", m)
    write_json(
        path,
        {
            "benchmark": "compile",
            "machine": m,
            "frames": a.frames,
            "repeat": a.repeat,
            "seconds": time.time() - t_start,
            "rows": rows,
            "runs": runs,
            "root": ROOT,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
