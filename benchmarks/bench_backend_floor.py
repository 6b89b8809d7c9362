"""The same three Taichi kernels on the CPU backend and on another backend (default
Vulkan): a launch of a tiny kernel, a streaming update of 4M f64 values (axpy) and a
gather of 8 random reads per value. It measures what no implementation of a kernel can
beat on that backend, e.g. how far lavapipe (Vulkan on the CPU, no GPU) can come to the
CPU backend at all. Prints a table and writes JSON.

    .venv/bin/python benchmarks/bench_backend_floor.py --archs cpu vulkan --out out/bench_backend_floor.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import sys, time, json, numpy as np, taichi as ti
ti.init(arch=getattr(ti, sys.argv[1]), default_fp=ti.f64, offline_cache=True, log_level="error")
n = 4_000_000
x = ti.ndarray(ti.f64, n); y = ti.ndarray(ti.f64, n); idx = ti.ndarray(ti.i32, n)
rng = np.random.default_rng(0)
x.from_numpy(rng.random(n)); y.from_numpy(rng.random(n)); idx.from_numpy(rng.integers(0, n, n).astype(np.int32))

@ti.kernel
def axpy(a: ti.f64, x: ti.types.ndarray(ndim=1), y: ti.types.ndarray(ndim=1), m: ti.i32):
    for i in range(m):
        y[i] += a * x[i]

@ti.kernel
def gather(x: ti.types.ndarray(ndim=1), idx: ti.types.ndarray(ndim=1), y: ti.types.ndarray(ndim=1), m: ti.i32):
    for i in range(m):
        acc = 0.0
        for k in range(8):
            acc += x[idx[(i + k * 7919) % m]]
        y[i] = acc

def median_ms(f, reps):
    f(); ti.sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); f(); ti.sync(); ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))

print(json.dumps({"arch": sys.argv[1],
                  "launch_ms": median_ms(lambda: axpy(1.0, x, y, 100), 200),
                  "axpy_4M_ms": median_ms(lambda: axpy(1.0, x, y, n), 20),
                  "gather_4M_ms": median_ms(lambda: gather(x, idx, y, n), 10)}))
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=["cpu", "vulkan"])
    ap.add_argument("--out", type=Path, default=Path("out/bench_backend_floor.json"))
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "bench_backend_floor_child.py"  # Taichi reads kernels' source files
        script.write_text(CHILD)
        for arch in a.archs:
            r = subprocess.run([sys.executable, str(script), arch], capture_output=True, text=True)
            lines = r.stdout.strip().splitlines()
            rows.append(
                json.loads(lines[-1])
                if r.returncode == 0 and lines
                else {"arch": arch, "error": (r.stderr.strip().splitlines() or ["?"])[-1]}
            )
    base = rows[0]
    print(f"{'arch':<8}{'launch ms':>11}{'axpy 4M ms':>12}{'gather 4M ms':>14}   (ratio to {base['arch']})")
    for r in rows:
        if "error" in r:
            print(f"{r['arch']:<8}{r['error']}")
            continue
        cells = []
        for k in ("launch_ms", "axpy_4M_ms", "gather_4M_ms"):
            ratio = r[k] / base[k] if "error" not in base else float("nan")
            cells.append(f"{r[k]:.3g} ({ratio:.1f}x)")
        print(f"{r['arch']:<8}" + "".join(f"{c:>14}" for c in cells))
    from common import machine

    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
