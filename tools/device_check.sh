#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (issue 10): the cuda-marked tests
# (tests/backends/test_backends.py: twisting bar, squeeze-ball, stick-slip and the cloth drape on CUDA in f64
# and f32 against the CPU backend), the same tests on the GPU's Vulkan driver, and the PD
# (with the global step "auto" chooses), contact and ADMM benchmarks and the sparse inverse's
# build on the CPU and on CUDA (and Vulkan) side by side, summarised in one table headed by
# the GPU's name. Without a GPU the tests skip (with the reason) and only the CPU column is filled.
#
#   tools/device_check.sh            # minutes; on an H200 with an empty kernel cache the
#                                    # cuda tests alone took 5 min one at a time (2026-12-04)
#   OUT=/tmp/dc tools/device_check.sh
#   BENCH=0 tools/device_check.sh    # the tests only
#   VULKAN_TESTS=0 tools/device_check.sh  # not the vulkan-marked tests on the GPU
#   PYTHON=python3 tools/device_check.sh  # another interpreter (tisim from this checkout)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
# the tools import tisim from this checkout also where it is not installed
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-out/device_check}
mkdir -p "$OUT"

# test processes in parallel where pytest-xdist is there: most of a backend test's time is
# Taichi compiling kernels in the child processes it starts
jobs=""; "$PY" -c "import xdist" 2>/dev/null && jobs="-n ${TEST_JOBS:-4}"

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
if [ -z "$gpu" ]; then
  gpu="none (nvidia-smi found no GPU)"
  archs="cpu"
else
  archs="cpu cuda"
fi
echo "GPU: $gpu"

timeout "${TEST_TIMEOUT:-600}" "$PY" -m pytest $jobs -q -rs -m cuda tests/backends/test_backends.py -p no:cacheprovider \
  --junitxml="$OUT/cuda_tests.xml" 2>&1 | tee "$OUT/cuda_tests.log" | tail -n 15
tests_rc=${PIPESTATUS[0]}
# pytest exits 5 when every test was deselected/skipped: not a failure here
[ "$tests_rc" -eq 5 ] && tests_rc=0

# on a GPU machine the vulkan-marked tests run on the GPU's own Vulkan driver (CI runs them
# on Mesa's lavapipe); they skip when Vulkan cannot start
vk_rc=0
if [ "$archs" != cpu ] && [ "${VULKAN_TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-600}" "$PY" -m pytest $jobs -q -rs -m vulkan tests/backends/test_backends.py -p no:cacheprovider \
    --junitxml="$OUT/vulkan_tests.xml" 2>&1 | tee "$OUT/vulkan_tests.log" | tail -n 15
  vk_rc=${PIPESTATUS[0]}
  [ "$vk_rc" -eq 5 ] && vk_rc=0
  [ "$tests_rc" -eq 0 ] && tests_rc=$vk_rc
fi

# whether a device contact kernel still parts from the CPU's on CUDA in f32 (wrong on an
# H200 before the Fischer-Burmeister fix, docs/benchmarks.md "GPU-class backends"): one recorded contact
# problem replayed stage by stage on both
if [ "$archs" != cpu ]; then
  timeout 300 "$PY" studies/contact_trace.py --archs cpu cuda --precision f32 --out "$OUT/contact_trace" \
    > "$OUT/contact_trace.log" 2>&1
  echo "contact trace (exit $?; 3: the replays part):"; grep -v "^\[Taichi\]" "$OUT/contact_trace.log" | tail -n 8
  # the whole demo with the device update forced on CUDA in f32 (wrong before the FB fix)
  # beside the CPU in f64: smallest det F and deepest penetration over 80 frames
  for ap in "cpu f64" "cuda f32"; do
    set -- $ap
    timeout 240 "$PY" -m tisim demo squeeze-ball --arch "$1" --precision "$2" --no-render -q -n 80 \
      --set 'contact.implementation="device"' -o "$OUT/squeeze_$1_$2" > "$OUT/squeeze_$1_$2.log" 2>&1
    "$PY" - "$OUT/squeeze_$1_$2/stats.csv" "$1 $2" <<'PY'
import csv, sys
try:
    rows = list(csv.DictReader(open(sys.argv[1])))[1:]
except OSError:
    sys.exit(print(f"squeeze-ball {sys.argv[2]}: no stats.csv"))
pen = max((float(r["max_penetration"]) for r in rows if r["max_penetration"]), default=0.0)
det = min(float(r["min_volume_ratio"]) for r in rows)
print(f"squeeze-ball {sys.argv[2]} (device contact): {len(rows)} frames, min det F {det:.3f}, "
      f"max penetration {pen * 1e3:.3f} mm")
PY
  done
fi

# whether this machine's Vulkan (a GPU's driver, or lavapipe) loses atomic updates made
# inside run-time loops, as lavapipe 22.3 does (the cloth broad phase's pattern)
timeout 180 "$PY" studies/spirv_loop_atomics.py 2>&1 | tee "$OUT/spirv_loop_atomics.log"

[ "${BENCH:-1}" = 0 ] && archs=""
for arch in $archs; do
  prec=f64; [ "$arch" = cuda ] && prec=f32
  timeout 240 "$PY" benchmarks/bench_pd.py --quick --backends sparse-inverse cholesky auto --arch "$arch" \
    --out "$OUT/bench_pd_$arch.json" > "$OUT/bench_pd_$arch.log" 2>&1 || echo "bench_pd ($arch) failed: see $OUT/bench_pd_$arch.log"
  # on CUDA both contact updates: "auto" runs numpy in f32 until this check confirms the
  # kernels (the contact trace above), which read nothing per iteration
  impl=host; [ "$arch" = cpu ] && impl=device; [ "$arch" = cuda ] && impl=both
  timeout 300 "$PY" benchmarks/bench_contact.py --resolution 17.6493 --frames 25 --arch "$arch" \
    --precision "$prec" --implementation "$impl" --json "$OUT/bench_contact_$arch.json" > "$OUT/bench_contact_$arch.log" 2>&1 \
    || echo "bench_contact ($arch) failed: see $OUT/bench_contact_$arch.log"
  timeout 240 "$PY" benchmarks/bench_admm.py --quick --no-demos --arch "$arch" --out "$OUT/admm_$arch" \
    > "$OUT/bench_admm_$arch.log" 2>&1 || echo "bench_admm ($arch) failed: see $OUT/bench_admm_$arch.log"
done
# the iteration budget on the GPU: launches and host synchronisations per local-global step,
# without and with contact (issue 46: none per iteration inside a step)
if [ "${BENCH:-1}" != 0 ] && [ "$archs" != cpu ]; then
  timeout 300 "$PY" benchmarks/bench_pd.py --traffic --traffic-archs cuda --out "$OUT/traffic_cuda.json" \
    > "$OUT/traffic_cuda.log" 2>&1 || echo "traffic benchmark failed: see $OUT/traffic_cuda.log"
fi
# the sparse inverse's build on each backend, the same matrix side by side (issue 10: under a
# GPU backend at most 2x the CPU's)
if [ "${BENCH:-1}" != 0 ]; then
  si_archs="cpu"; [ "$archs" != cpu ] && si_archs="cpu cuda vulkan"
  timeout 300 "$PY" benchmarks/bench_pd.py --si-build 10 17.6493 --si-archs $si_archs \
    --out "$OUT/bench_si_build.json" > "$OUT/bench_si_build.log" 2>&1 \
    || echo "sparse-inverse build benchmark failed: see $OUT/bench_si_build.log"
fi

"$PY" - "$OUT" "$gpu" "$tests_rc" <<'PY'
import json, sys
from pathlib import Path

out, gpu, rc = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

def load(name):
    p = out / name
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None

rows = []
for arch in ("cpu", "cuda"):
    pd = load(f"bench_pd_{arch}.json")
    for r in (pd or {}).get("results", []):
        if "error" not in r:
            asked = "auto -> " if r.get("requested") == "auto" else ""
            rows.append((f"PD twisting bar {r['vertices']} v, {asked}{r['global_step']}", arch,
                         r["frame_ms_median"], f"setup {r['setup_s']:.1f} s"))
    bc = load(f"bench_contact_{arch}.json")
    for r in (bc or {}).get("results", []):
        c = r.get("contact_frames") or {}
        if c:
            rows.append((f"PD squeeze-ball {r['vertices']} v, {r.get('implementation', '?')} contact (contact frames)", arch,
                         c["wall_ms"]["median"],
                         f"detect {c['detect_ms']['median']:.1f} / W {c['delassus_ms']['median']:.1f}"
                         f" / NCP {c['cr_ms']['median']:.1f} ms"))
    ad = load(f"admm_{arch}/bench_admm.json")
    for r in (ad or {}).get("scaling", []):
        rows.append((f"ADMM {r['vertices']} v (ms per iteration)", arch,
                     r["ms_per_iteration_median"], f"q-step share {r['q_step_share']:.2f}"))
for r in (load("bench_si_build.json") or {}).get("sparse_inverse_build", []):
    if "error" not in r:
        rows.append((f"sparse inverse build {r['vertices']} v (ms, not per frame)", r["arch"],
                     1e3 * r["build_s"], f"residual {r['relative_residual']:.1e}"))
for r in (load("traffic_cuda.json") or {}).get("traffic", []):
    if "error" not in r:
        st = r["per_step"]
        rows.append((f"traffic {r['scene']} ({r['iterations'] // max(r['steps'], 1)} it./step; syncs per step)", r["arch"],
                     st["syncs"], f"launches per step {st['launches']:.0f}"))
print()
print(f"device check, GPU: {gpu}; cuda tests: {'passed or skipped' if rc == 0 else 'FAILED'}")
print(f"{'benchmark':<60}{'arch':>6}{'ms/frame':>10}  notes")
for name, arch, ms, note in rows:
    print(f"{name:<60}{arch:>6}{ms:>10.2f}  {note}")
if not rows:
    print("(no benchmark produced results; see the logs in", out, ")")
(out / "device_check.json").write_text(json.dumps(
    {"gpu": gpu, "cuda_tests_rc": rc, "rows": [dict(zip(("benchmark", "arch", "ms", "notes"), r)) for r in rows]},
    indent=2))
PY
exit "$tests_rc"
