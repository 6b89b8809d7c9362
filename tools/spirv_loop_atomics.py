"""Minimal reproduction: atomic adds inside a loop with a per-thread trip count, on the
CPU backend and on Vulkan, the pattern of the cloth broad phase's hash-grid kernels.

    .venv/bin/python tools/spirv_loop_atomics.py            # cpu and vulkan, side by side

Measured with Taichi 1.7.4 and Mesa lavapipe 22.3.6 (Debian 12, no GPU): the CPU backend
counts every update; Vulkan loses some of them (e.g. 1552 of 1572 in the 1-D case, 6454
of 7694 in the 3-D cell loop), and a counter updated after the loop comes out wrong too.
Taichi's issue tracker has similar wrong results for loops inside parallel loops on Vulkan
GPUs (taichi-dev/taichi#6896, #8432), so it may not be lavapipe's alone; a CUDA run
(tools/device_check.sh) has no such code path.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r'''
import sys, json, numpy as np, taichi as ti
ti.init(arch=getattr(ti, sys.argv[1]), log_level="error")

@ti.kernel
def loop1d(c: ti.types.ndarray(), B: ti.types.ndarray(), n: ti.i32):
    for i in range(n):
        for k in range(c[i]):
            ti.atomic_add(B[k], 1)

@ti.kernel
def cells3d(lo: ti.types.ndarray(), hi: ti.types.ndarray(), B: ti.types.ndarray(), T: ti.types.ndarray(), n: ti.i32):
    for i in range(n):
        a = ti.Vector([lo[i, 0], lo[i, 1], lo[i, 2]])
        b = ti.Vector([hi[i, 0], hi[i, 1], hi[i, 2]])
        for x, y, z in ti.ndrange((a[0], b[0] + 1), (a[1], b[1] + 1), (a[2], b[2] + 1)):
            ti.atomic_add(B[(7 * x + 13 * y + z) % B.shape[0]], 1)
        s = b - a + 1
        ti.atomic_add(T[0], s[0] * s[1] * s[2])

rng = np.random.default_rng(0)
n = 1000
c = rng.integers(0, 4, n).astype(np.int32)
lo = rng.integers(0, 5, (n, 3)).astype(np.int32)
hi = lo + rng.integers(0, 3, (n, 3)).astype(np.int32)
B = np.zeros(8, np.int32)
loop1d(c, B, n)
B3 = np.zeros(2048, np.int32)
T = np.zeros(1, np.int32)
cells3d(lo, hi, B3, T, n)
print(json.dumps({"loop1d": int(B.sum()), "cells3d": int(B3.sum()), "after_loop": int(T[0]),
                  "expected_1d": int(c.sum()), "expected_3d": int(np.prod(hi - lo + 1, axis=1).sum())}))
'''


def main() -> int:
    import tempfile
    from pathlib import Path

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "spirv_loop_atomics_child.py"  # Taichi reads kernels' source files
        script.write_text(CHILD)
        for arch in ("cpu", "vulkan"):
            r = subprocess.run([sys.executable, str(script), arch], capture_output=True, text=True)
            line = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None
            rows[arch] = json.loads(line) if line else {"error": (r.stderr.strip().splitlines() or ["?"])[-1]}
    print(f"{'arch':<8}{'1-D loop':>10}{'3-D cells':>11}{'after loop':>12}   (expected {rows['cpu'].get('expected_1d')}, "
          f"{rows['cpu'].get('expected_3d')}, {rows['cpu'].get('expected_3d')})")
    for arch, r in rows.items():
        if "error" in r:
            print(f"{arch:<8}{r['error']}")
        else:
            print(f"{arch:<8}{r['loop1d']:>10}{r['cells3d']:>11}{r['after_loop']:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
