"""The short kernel-launch path (``tisim._taichi_patches.launch``) against Taichi's own: the same
results to the bit, the same errors for bad arguments, and Taichi's path for what the
short one does not take. Run in a fresh interpreter (Taichi is initialised once per
process); the kernels live in a module file, as Taichi reads their source."""

from __future__ import annotations

import json
import subprocess
import sys

KERNELS = '''
import taichi as ti

@ti.kernel
def mix(a: ti.types.ndarray(dtype=ti.f64, ndim=1), b: ti.types.ndarray(dtype=ti.math.vec3, ndim=1), n: ti.i32,
        s: float, o: ti.types.vector(3, float), u: ti.u32, out: ti.types.ndarray()):
    for i in range(n):
        out[i] = a[i] * s + b[i].dot(o) + ti.cast(u, ti.f64) / 7.0

@ti.kernel
def total(a: ti.types.ndarray(), n: ti.i32) -> ti.f64:
    t = 0.0
    for i in range(n):
        t += a[i]
    return t

@ti.kernel
def sums(a: ti.types.ndarray(), n: ti.i32) -> ti.types.vector(3, float):
    s = ti.Vector([0.0, 0.0, ti.math.inf])
    for i in range(n):
        s[0] += a[i]
        s[1] += a[i] * a[i]
        ti.atomic_min(s[2], a[i])
    return s

@ti.kernel
def counts(a: ti.types.ndarray(), n: ti.i32) -> ti.types.vector(2, ti.i32):
    c = ti.Vector([0, 0])
    for i in range(n):
        if a[i] > 0:
            c[0] += 1
        else:
            c[1] -= 1
    return c

@ti.kernel
def positives(a: ti.types.ndarray(), n: ti.i32) -> ti.u32:
    c = ti.u32(0)
    for i in range(n):
        if a[i] > 0:
            c += 1
    return c

@ti.kernel
def pair(a: ti.types.ndarray(), n: ti.i32) -> (ti.f64, ti.i32):
    return a[0] * 2.0, n - 1
'''

SCRIPT = '''
import json, sys
import numpy as np
sys.path.insert(0, {folder!r})
from tisim import backend
backend.init("cpu", "f64")
import taichi as ti
from tisim._taichi_patches import launch as L
import kern

rng = np.random.default_rng(3)
n = 37
a = rng.standard_normal(n)
bv = ti.Vector.ndarray(3, ti.f64, shape=n)
bv.from_numpy(rng.standard_normal((n, 3)))
o = np.array([0.3, -1.7, 2.9])
out = np.zeros(n)
res = {{"installed": L.taichi_call is not None}}
before = dict(L.counts)
for _ in range(3):
    kern.mix(a, bv, n, 1.25, o, 5, out)
res["short_calls"] = L.counts["short"] - before["short"]
ref = np.zeros(n)
L.taichi_call(kern.mix._primal, a, bv, n, 1.25, o, 5, ref)
res["same_bits"] = bool(np.array_equal(out.view(np.int64), ref.view(np.int64)))
res["right"] = float(np.abs(out - (a * 1.25 + bv.to_numpy() @ o + 5 / 7.0)).max())
# out as a Taichi ndarray (set_arg_ndarray) rather than numpy
od = ti.ndarray(ti.f64, shape=n)
kern.mix(a, bv, n, 1.25, o, 5, od)
kern.mix(a, bv, n, 1.25, o, 5, od)
res["ndarray_out_same"] = bool(np.array_equal(od.to_numpy(), ref))

def error(call, *args):
    try:
        call(*args)
    except Exception as e:
        return type(e).__name__ + ": " + " ".join(str(e).split())
    return None

bad = {{"float_for_int": (a, bv, 2.5, 1.25, o, 5, out), "string_for_float": (a, bv, n, "x", o, 5, out),
        "f32_for_f64": (a.astype(np.float32), bv, n, 1.25, o, 5, out),
        "strided": (np.zeros(2 * n)[::2], bv, n, 1.25, o, 5, out)}}
for k, args in bad.items():
    res[k] = [error(kern.mix, *args), error(lambda *x: L.taichi_call(kern.mix._primal, *x), *args)]
res["total"] = [kern.total(a, n), float(a.sum())]
# return values on the short path: the values (and types) Taichi's own path gives
rets = {{}}
for name in ("total", "sums", "counts", "positives", "pair"):
    k = getattr(kern, name)
    k(a, n)  # the first call with these array types compiles through Taichi's path
    s0 = L.counts["short"]
    got = k(a, n)
    ref = L.taichi_call(k._primal, a, n)
    flat = lambda v: [float(x) for x in (v.to_numpy() if hasattr(v, "to_numpy") else np.atleast_1d(v))]
    got_l, ref_l = (got, ref) if isinstance(got, (list, tuple)) else ([got], [ref])
    rets[name] = {{"short": L.counts["short"] - s0,
                  "types": [[type(g).__name__, type(r).__name__] for g, r in zip(got_l, ref_l)],
                  "same": all(np.array_equal(np.array(flat(g)), np.array(flat(r))) for g, r in zip(got_l, ref_l))}}
res["rets"] = rets
print(json.dumps(res))
'''


def test_short_launch_path_matches_taichis(tmp_path):
    (tmp_path / "kern.py").write_text(KERNELS)
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(folder=str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["installed"]
    assert res["short_calls"] == 2  # the first call with these array types compiles through Taichi's path
    assert res["same_bits"] and res["right"] < 1e-12 and res["ndarray_out_same"], res
    # bad arguments: the error Taichi's own path raises
    for k in ("float_for_int", "string_for_float", "f32_for_f64", "strided"):
        short, taichi = res[k]
        # (the kernel's wrapper may add lines around Taichi's message)
        assert short is not None and taichi is not None, (k, short, taichi)
        assert short.split(":")[0] == taichi.split(":")[0] and taichi.split(": ", 1)[1] in short, (k, short, taichi)
    assert res["float_for_int"][0].startswith("TaichiRuntimeTypeError")
    assert "dtype" in res["f32_for_f64"][0] and "contiguous" in res["strided"][0].lower(), res
    assert abs(res["total"][0] - res["total"][1]) < 1e-12, res
    # return values: scalars (real, signed, unsigned), vectors (real, integer) and several,
    # read on the short path, equal to Taichi's own and of the same types
    for name, r in res["rets"].items():
        assert r["short"] == 1 and r["same"], (name, r)
        assert all(g == t for g, t in r["types"]), (name, r)
    assert res["rets"]["sums"]["types"] == [["Vector", "Vector"]], res["rets"]
