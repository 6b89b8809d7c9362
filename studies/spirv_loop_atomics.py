"""Minimal reproductions of two Taichi 1.7.4 SPIR-V (Vulkan) miscompilations that broke
the cloth broad phase, on the CPU backend and on Vulkan, side by side:

1. atomic adds inside a loop with a per-thread trip count (the old hash-grid kernels);
2. a serial in-place prefix sum inside ``for _ in range(1)`` (a[b] += a[b - 1]), the
   scan that places the hash buckets.

    .venv/bin/python studies/spirv_loop_atomics.py

Measured with Taichi 1.7.4 and Mesa lavapipe 22.3.6 (Debian 12, no GPU): the CPU backend
counts every update and scans right; Vulkan loses some loop atomics (e.g. 1552 of 1572
in the 1-D case, 6545 of 7789 in the 3-D cell loop; a counter updated after the loop
comes out wrong too: 1132 of 7789) and gets 13 of 16 elements of the in-place scan wrong, while
the same scan with the running sum in a local is right. The broad phase now avoids both
patterns (tisim/contact/ipc/broad_phase.py). Taichi's issue tracker has similar wrong
results for loops inside parallel loops on Vulkan GPUs (taichi-dev/taichi#6896, #8432),
so they may not be lavapipe's alone; CUDA (tools/device_check.sh) has no such code path.
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

@ti.kernel
def scan_in_place(a: ti.types.ndarray(), m: ti.i32):
    for _ in range(1):
        for b in range(1, m):
            a[b] += a[b - 1]

@ti.kernel
def scan_local(a: ti.types.ndarray(), m: ti.i32):
    for _ in range(1):
        acc = 0
        for b in range(m):
            acc += a[b]
            a[b] = acc

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
v = rng.integers(0, 9, 16).astype(np.int32)
s1 = v.copy(); scan_in_place(s1, 16)
s2 = v.copy(); scan_local(s2, 16)
good = np.cumsum(v)
print(json.dumps({"loop1d": int(B.sum()), "cells3d": int(B3.sum()), "after_loop": int(T[0]),
                  "scan_in_place_wrong": int((s1 != good).sum()), "scan_local_wrong": int((s2 != good).sum()),
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
    print(
        f"{'arch':<8}{'1-D loop':>10}{'3-D cells':>11}{'after loop':>12}{'scan wrong':>12}{'local scan':>12}"
        f"   (expected {rows['cpu'].get('expected_1d')}, {rows['cpu'].get('expected_3d')}, "
        f"{rows['cpu'].get('expected_3d')}, 0 of 16, 0 of 16)"
    )
    for arch, r in rows.items():
        if "error" in r:
            print(f"{arch:<8}{r['error']}")
        else:
            print(
                f"{arch:<8}{r['loop1d']:>10}{r['cells3d']:>11}{r['after_loop']:>12}"
                f"{r['scan_in_place_wrong']:>12}{r['scan_local_wrong']:>12}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
