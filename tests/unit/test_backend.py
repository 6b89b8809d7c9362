"""Process-level set-up in ``tisim.backend.init`` (run in fresh interpreters: Taichi and
OpenBLAS are initialised once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

_PROBE = """
import json, numpy
{extra}
from threadpoolctl import threadpool_info
def openblas():
    return {{i["filepath"]: i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"}}
before = openblas()
from tisim import backend
backend.init("cpu", "f64")
print(json.dumps({{"before": before, "after": openblas()}}))
"""


def _probe(env_extra: dict[str, str], extra: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(extra=extra)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _numpys(path: str) -> bool:
    return "numpy" in path or "scipy_openblas" in path


def test_numpy_openblas_runs_on_one_thread_after_init():
    """OpenBLAS's spinning worker threads took a core from PARDISO and Taichi (the
    docstring of backend.limit_numpy_blas): init leaves numpy's OpenBLAS on one thread."""
    r = _probe({})
    if not r["before"]:
        pytest.skip("numpy is not linked against OpenBLAS here")
    assert set(r["after"].values()) == {1}


def test_another_openblas_keeps_its_threads():
    """The system OpenBLAS under CHOLMOD (the solvers' fallback without MKL) is not
    numpy's: loaded before init, it keeps its thread count."""
    pytest.importorskip("sksparse.cholmod")
    r = _probe({}, extra="import sksparse.cholmod")
    others = {p: n for p, n in r["before"].items() if not _numpys(p)}
    mine = [p for p in r["before"] if _numpys(p)]
    if not others or not mine:
        pytest.skip("needs numpy's own OpenBLAS and a second one in the process")
    assert {p: r["after"][p] for p in others} == others
    assert all(r["after"][p] == 1 for p in mine)


def test_a_users_openblas_thread_count_is_kept():
    r = _probe({"OPENBLAS_NUM_THREADS": "2"})
    if not r["before"]:
        pytest.skip("numpy is not linked against OpenBLAS here")
    assert r["after"] == r["before"]


def test_kernel_compile_errors_still_name_file_line_and_kernel():
    """``init`` shortens the source positions Taichi's front end builds for its error
    messages (a third of its time): a kernel that does not compile still gets a message
    with this file, the line and the kernel's name."""
    import taichi as ti

    from tisim import backend

    backend.init("cpu", "f64")

    out = ti.field(ti.f64, shape=1)

    @ti.kernel
    def broken_kernel():  # no arguments: this module's annotations are strings
        out[0] = not_defined_anywhere  # noqa: F821  (the line the message must name)

    src = Path(__file__).read_text().splitlines()
    line = 1 + next(i for i, s in enumerate(src) if "(the line the message must name)" in s and "noqa" in s)
    with pytest.raises(ti.TaichiCompilationError) as err:
        broken_kernel()
    msg = str(err.value)
    assert f'File "{__file__}", line {line}, in broken_kernel' in msg, msg
    assert "not_defined_anywhere" in msg
    # and the shortening is in force (Taichi's own message quotes the line under carets)
    assert "^" not in msg and "out[0] = not_defined_anywhere" not in msg, msg


_LOOPS = """
import json, numpy as np, taichi as ti
from tisim import backend
backend.init("cpu", "f64")
a = ti.ndarray(ti.f64, (64, 3))
b = ti.ndarray(ti.f64, (64, 3))
s = ti.field(ti.f64, shape=())

@ti.kernel
def loops(a: ti.types.ndarray(), b: ti.types.ndarray(), n: ti.i32):
    for i in range(n):  # a range-for
        for k in ti.static(range(3)):  # unrolled
            a[i, k] = i * 3.0 + k
    for i, k in ti.ndrange(n, 3):  # an ndrange-for, with a loop inside
        acc = 0.0
        for j in range(k + 1):
            acc += a[i, j]
        b[i, k] = acc
    for i in range(n):
        s[None] += b[i, 2]

loops(a, b, 64)
ti.sync()
import io, contextlib
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    ti.profiler.print_kernel_profiler_info("count")
tasks = sorted({w for w in buf.getvalue().split() if w.startswith("loops_")})
print(json.dumps({"serial_loops": backend.SERIAL_LOOPS, "tasks": tasks, "a": a.to_numpy().tolist(), "b": b.to_numpy().tolist(),
                  "s": float(s[None])}))
"""


def _loops(tmp_path: Path, threads: str) -> dict:
    script = tmp_path / "loops.py"  # Taichi reads a kernel's source from its file
    script.write_text(_LOOPS)
    env = {k: v for k, v in os.environ.items() if k != "TISIM_SERIAL_LOOPS"}
    env.update(TI_CPU_MAX_NUM_THREADS=threads, TI_KERNEL_PROFILER="1")
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_thread_compiles_every_loop_serial_with_the_same_results(tmp_path):
    """On one CPU thread Taichi would still hand each parallel loop to its thread pool
    (about 80 us a loop here against 3 us for a serial one): ``init`` compiles every
    kernel loop serial there, and leaves them parallel with two threads. Both compute
    the same numbers. Taichi's kernel profiler names each offloaded task by its kind."""
    one, two = _loops(tmp_path, "1"), _loops(tmp_path, "2")
    assert one["serial_loops"] is True and two["serial_loops"] is False
    # parallel: a task per loop; serial: Taichi merges the kernel into one serial task
    assert sum(t.endswith("_range_for") for t in two["tasks"]) == 3, two["tasks"]
    assert one["tasks"] and all(t.endswith("_serial") for t in one["tasks"]), one["tasks"]
    a = 3.0 * np.arange(64)[:, None] + np.arange(3)
    b = np.cumsum(a, axis=1)
    assert one["a"] == two["a"] == a.tolist()
    assert one["b"] == two["b"] == b.tolist()
    assert one["s"] == two["s"] == float(b[:, 2].sum())


def test_cuda_asked_for_without_a_device_runs_on_the_cpu_in_f64():
    """Taichi falls back to the CPU by itself, but the precision was then a GPU's (f32):
    a teacher's `--arch cuda` on a laptop ran f32 physics. The fallback now happens before
    the precision is chosen, and a second init asking for CUDA again (a sweep's run after
    its planner's) is the same backend, not an error."""
    from tisim.backend import cuda_available

    if cuda_available():
        pytest.skip("this machine has a CUDA device")
    code = (
        "import json\nfrom tisim import backend\nb = backend.init('cuda')\nc = backend.init('cuda')\n"
        "print(json.dumps([b.arch, b.precision, c.arch]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["cpu", "f64", "cpu"]
    assert "no CUDA device" in out.stderr


def test_a_process_ending_writes_the_kernel_cache_after_the_one_writing_now(tmp_path):
    """Taichi's own cache lock does not wait: of two processes ending together the second
    skipped its write and lost its kernels. A process ending while another holds tisim's
    lock waits for it, then writes: here the lock is held by the test, the child stays
    alive until it is released, and then its kernel is in the cache."""
    import fcntl
    import subprocess
    import sys
    import time

    code = (
        "from tisim import backend\nbackend.init('cpu', 'f64')\nimport taichi as ti\n"
        "@ti.kernel\ndef k() -> ti.i32:\n    return 7\nassert k() == 7\nprint('ran', flush=True)\n"
    )
    env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=str(tmp_path))
    with open(tmp_path / "tisim-write.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        (tmp_path / "child.py").write_text(code)  # (Taichi reads a kernel's source from its file)
        p = subprocess.Popen([sys.executable, str(tmp_path / "child.py")], env=env, stdout=subprocess.PIPE, text=True)
        assert "ran\n" in iter(p.stdout.readline, "")  # (after Taichi's banner lines)
        time.sleep(1.0)
        assert p.poll() is None  # waiting for the lock at exit
        assert not list(tmp_path.rglob("*.tic"))
    assert p.wait(timeout=60) == 0
    assert list(tmp_path.rglob("*.tic"))  # written once the lock was free


def test_a_stale_cache_lock_is_removed_at_start(tmp_path):
    """A process killed while Taichi held its cache lock left ``ticache.lock`` behind:
    every later run warned "Lock ... failed" on stderr and used no cache. A lock older
    than STALE_LOCK_AGE is removed at start; a fresh one (a process reading the cache
    now) is left."""
    from tisim.backend import STALE_LOCK_AGE

    lock = tmp_path / "ticache.lock"
    code = "from tisim import backend\nbackend.init('cpu', 'f64')\n"
    env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=str(tmp_path))
    for age, kept in ((2 * STALE_LOCK_AGE, False), (0.0, True)):
        lock.write_text("")
        t = lock.stat().st_mtime - age
        os.utime(lock, (t, t))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert lock.exists() == kept
        assert ("Lock" in r.stderr) == kept, r.stderr
        lock.unlink(missing_ok=True)


_IR_PROBE = """
import json, sys
import numpy as np
from tisim import backend
backend.init("cpu", "f64")
import taichi as ti
from tisim.materials import ti_funcs as mf
from tisim.solvers.pd.local import fast_rotation

F = np.random.default_rng(7).normal(size=(64, 3, 3))
F[:8] = -F[:8]  # inverted elements: the guard's SVD path
q0 = np.tile([1.0, 0.0, 0.0, 0.0], (64, 1))
out = np.zeros((64, 13))

@ti.kernel
def k(F: ti.types.ndarray(dtype=ti.math.mat3), q0: ti.types.ndarray(dtype=ti.math.vec4), out: ti.types.ndarray()):
    for e in range(F.shape[0]):
        q = fast_rotation(F[e], q0[e], 3)
        P = mf.first_piola_nh(F[e], 1.0, 4.0)
        for c in ti.static(range(4)):
            out[e, c] = q[c]
        for i, j in ti.static(ti.ndrange(3, 3)):
            out[e, 4 + 3 * i + j] = P[i, j]

k(F, q0, out)
print(json.dumps({"light": k._primal._tisim_light, "values": out.tobytes().hex()}))
"""


def test_taichi_ir_passes_are_left_out_on_the_cpu_and_change_only_round_off(tmp_path):
    """Taichi's IR optimisation passes took most of a CPU kernel's compile time (a fresh
    machine's first squeeze-ball frames: 11 s with them, 5.5 s without) and LLVM optimises
    after them anyway: on the CPU, kernels outside ``KEEP_PASSES`` (the cloth's, measured
    faster with them) compile without them; TISIM_TAICHI_IR_OPT=1 keeps them for all. The
    rotation extraction (Newton iterations, the half-turn guard's SVD on inverted elements)
    and a Neo-Hookean stress agree to round-off either way."""
    import importlib

    from tisim._taichi_patches.ir_passes import LIGHT, keeps_passes

    assert keeps_passes("tisim.solvers.cloth.newton") and keeps_passes("tisim.contact.ipc.potential")
    assert keeps_passes("tisim.contact.ipc.broad_phase", "_query_pairs")
    assert not keeps_passes("tisim.solvers.pd.local") and not keeps_passes("tisim.solvers.admm.kernels")
    assert not keeps_passes("tisim.contact.ipc.potential", "_barrier_gradient")
    for name in LIGHT:  # each names a kernel that exists (a rename would silently restore the passes)
        module, _, attr = name.rpartition(".")
        assert hasattr(getattr(importlib.import_module(module), attr), "_primal"), name
    (tmp_path / "probe.py").write_text(_IR_PROBE)  # (Taichi reads a kernel's source from its file)
    runs = {}
    for forced in (None, "1"):
        env = {k: v for k, v in os.environ.items() if k != "TISIM_TAICHI_IR_OPT"}
        env["TI_OFFLINE_CACHE_FILE_PATH"] = str(tmp_path / f"cache-{forced}")
        if forced is not None:
            env["TISIM_TAICHI_IR_OPT"] = forced
        r = subprocess.run([sys.executable, str(tmp_path / "probe.py")], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[forced] = json.loads(r.stdout.strip().splitlines()[-1])
    assert runs[None]["light"] is True and runs["1"]["light"] is False
    a, b = (np.frombuffer(bytes.fromhex(runs[k]["values"]), dtype=np.float64) for k in (None, "1"))
    assert np.isfinite(a).all() and np.abs(a).max() > 0
    # the same to round-off (the quaternions' last bits differ: the passes order a few
    # operations differently)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)


_THREADS = r"""
import json, sys
import taichi as ti
from tisim import backend
threads = None if sys.argv[1] == "none" else int(sys.argv[1])
backend.init("cpu", "f64", threads=threads)
print(json.dumps({"threads": ti.lang.impl.current_cfg().cpu_max_num_threads, "serial_loops": backend.SERIAL_LOOPS}))
"""


def _init_threads(asked: str, env_threads: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TI_CPU_MAX_NUM_THREADS", "TISIM_SERIAL_LOOPS")}
    if env_threads is not None:
        env["TI_CPU_MAX_NUM_THREADS"] = env_threads
    out = subprocess.run(
        [sys.executable, "-c", _THREADS, asked], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_init_takes_the_thread_count_asked_for_unless_the_user_set_one():
    """``init(threads=1)`` runs the CPU backend on one thread, its loops serial; a
    TI_CPU_MAX_NUM_THREADS the user set wins over it; without either, Taichi's own
    default (a thread per core)."""
    import multiprocessing

    assert _init_threads("1", None) == {"threads": 1, "serial_loops": True}
    assert _init_threads("1", "3") == {"threads": 3, "serial_loops": False}
    default = _init_threads("none", None)
    assert default["threads"] == multiprocessing.cpu_count()
    assert default["serial_loops"] is (default["threads"] == 1)


def test_cloth_admm_and_contact_scenes_take_one_thread_on_two_cores(monkeypatch, demos_dir):
    """``runner.scene_threads``: one thread for the cloth and the ADMM solvers and for
    projective dynamics with colliders on a machine with at most two cores (measured
    faster there); Taichi's default for projective dynamics without colliders and on
    larger machines."""
    from tisim import runner
    from tisim.scene import load_scene

    names = ("refine-drape", "stretch", "squeeze-ball", "twisting-bar")
    cloth, admm, pd_contact, pd = (load_scene(demos_dir / f"{n}.toml") for n in names)
    assert admm.solver.type == "admm" and pd_contact.solver.type == pd.solver.type == "pd"
    assert pd_contact.colliders and not pd.colliders
    scenes = (cloth, admm, pd_contact, pd)
    for cores in (1, 2):
        monkeypatch.setattr(runner, "usable_cores", lambda c=cores: c)
        assert [runner.scene_threads(s) for s in scenes] == [1, 1, 1, None]
    monkeypatch.setattr(runner, "usable_cores", lambda: 3)
    assert [runner.scene_threads(s) for s in scenes] == [None, None, None, None]
