"""The one place where Taichi is initialised.

``init`` wraps ``ti.init`` once per process. Every other module imports Taichi
lazily or only defines kernels; no module allocates fields at import time.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)

ARCHES = ("auto", "cpu", "cuda", "vulkan")
PRECISIONS = ("f64", "f32")
# the offline kernel cache's size cap (Taichi cleans the least recently used quarter at
# exit above it): every kernel of every backend and precision fits, with room
OFFLINE_CACHE_BYTES = 1 << 30

# backends whose kernels outside the cloth's modules compile without Taichi's IR passes
# (measured for each in _taichi_patches/ir_passes.py; CUDA keeps every pass until a GPU
# measures its kernels without them)
LIGHT_COMPILE_ARCHS = ("cpu", "vulkan")


@dataclass(frozen=True)
class BackendInfo:
    arch: str  # the arch actually in use: "cpu", "cuda" or "vulkan"
    precision: str  # "f64" or "f32"


_current: BackendInfo | None = None
_requested: str | None = None  # the arch the first init asked for

# True on the CPU backend: kernels that add floats into shared entries (energy sums,
# gradient scatters of the cloth and contact terms, the contact Hessians' scatter) run
# their loop on one thread there (``ti.loop_config(serialize=backend.SERIAL_SUMS)``, read
# when a kernel compiles), so the additions come in a fixed order and two runs agree bit
# for bit. (The shell Hessians' sums are parallel gathers in a fixed order instead:
# ``shell_kernels.gather_face_hessians``.)
# On the CPU backend that costs little: a serial scatter of plain adds is faster than
# a parallel one of atomic compare-and-swap loops. GPU backends sum in parallel with
# atomics (reproducible only to round-off). Set by ``init``.
SERIAL_SUMS = False
# True when every kernel loop compiles as a serial loop (the CPU backend on one thread,
# or TISIM_SERIAL_LOOPS=1: ``_taichi_patches.serialize_loops``). Set by ``init``.
SERIAL_LOOPS = False


class BackendError(RuntimeError):
    pass


def cuda_available() -> bool:
    """Whether a CUDA device is visible, without initialising Taichi."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0:
            return False
        return lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except OSError:
        return False


def init(
    arch: str = "auto", precision: str | None = None, *, debug: bool = False, threads: int | None = None
) -> BackendInfo:
    """Initialise Taichi once for this process.

    arch: "auto" picks CUDA when a CUDA device is present, otherwise the CPU.
    precision: "f64" (default on the CPU, so accuracy tests mean something) or
    "f32" (default on a GPU, allowed for real-time runs).
    threads: the CPU backend's threads when the user set none (TI_CPU_MAX_NUM_THREADS
    wins); None: Taichi's default, one per core. See ``runner.scene_threads``.
    A second call with the same (or compatible "auto"/None) arguments returns
    the existing backend; asking for a different one is an error, because
    fields and kernels already created belong to the first.
    """
    global _current, _requested
    if arch not in ARCHES:
        raise BackendError(f"unknown arch {arch!r}: expected one of {', '.join(ARCHES)}")
    if precision is not None and precision not in PRECISIONS:
        raise BackendError(f"unknown precision {precision!r}: expected f64 or f32")
    if _current is not None:
        # the arch asked for first also matches (CUDA asked for, the CPU got)
        same_arch = arch in ("auto", _current.arch, _requested)
        same_prec = precision in (None, _current.precision)
        if same_arch and same_prec:
            return _current
        raise BackendError(
            f"Taichi is already initialised with arch={_current.arch}, "
            f"precision={_current.precision}; cannot switch to arch={arch}, precision={precision}"
        )
    import taichi as ti

    chosen = arch
    if arch == "auto":
        chosen = "cuda" if cuda_available() else "cpu"
    elif arch == "cuda" and not cuda_available():
        # Taichi would fall back to the CPU itself, but after the precision was chosen for
        # a GPU (f32): fall back here, so that the CPU's default (f64) applies
        log.warning("no CUDA device: running on the CPU")
        chosen = "cpu"
    if precision is None:
        precision = "f64" if chosen == "cpu" else "f32"
    ti_arch = {"cpu": ti.cpu, "cuda": ti.cuda, "vulkan": ti.vulkan}[chosen]
    fp = ti.f64 if precision == "f64" else ti.f32
    from tisim import _taichi_patches

    # Taichi 1.7's front end made lighter and its launches shorter (--debug keeps Taichi's
    # own launch path and error messages; TISIM_PLAIN_TAICHI=1 leaves Taichi as it is)
    _taichi_patches.install(debug=debug)
    # `tisim ... --quiet` (TISIM_QUIET=1): without Taichi's "[Taichi] Starting on arch=..." line
    quiet = os.environ.get("TISIM_QUIET") == "1"
    _clear_stale_cache_lock()
    extra = {}
    if chosen == "cpu" and threads is not None and not os.environ.get("TI_CPU_MAX_NUM_THREADS"):
        extra["cpu_max_num_threads"] = int(threads)
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        ti.init(
            arch=ti_arch,
            default_fp=fp,
            default_ip=ti.i32,
            offline_cache=True,
            # Taichi's default cap (100 MB, least recently used cleaned at exit) is below
            # what tisim's kernels take (about 110 MB for the test suite's): every process
            # exit then evicted a quarter of the cache, and the next runs compiled again
            # (a PD local-step test took 28 s in the suite, 1.3 s on its own)
            offline_cache_max_size_of_files=OFFLINE_CACHE_BYTES,
            debug=debug,
            log_level=ti.WARN,
            random_seed=0,
            **extra,
        )
    actual = _arch_name(ti.lang.impl.current_cfg().arch)
    if actual != chosen:
        log.warning("Taichi could not use %s and fell back to %s", chosen, actual)
    _current = BackendInfo(arch=actual, precision=precision)
    _requested = arch
    global SERIAL_SUMS
    SERIAL_SUMS = actual == "cpu"
    global SERIAL_LOOPS
    forced = os.environ.get("TISIM_SERIAL_LOOPS")  # "1" / "0": as a run to be continued had it
    serial = forced == "1" if forced in ("0", "1") else ti.lang.impl.current_cfg().cpu_max_num_threads == 1
    SERIAL_LOOPS = actual == "cpu" and serial and _taichi_patches.serialize_loops()
    if actual in LIGHT_COMPILE_ARCHS or os.environ.get("TISIM_TAICHI_IR_OPT") == "0":  # (forced off: any arch)
        _taichi_patches.light_compile()
    if actual == "cpu":
        log.debug("Taichi's CPU backend on %d thread(s)", ti.lang.impl.current_cfg().cpu_max_num_threads)
    limit_numpy_blas()
    import atexit

    atexit.register(_write_kernel_cache_in_turn)
    return _current


# how long a process ending waits for another's cache write before writing its own, s
CACHE_WRITE_WAIT = 60.0
# a Taichi cache lock older than this is left behind by a killed process, s
STALE_LOCK_AGE = 30.0


def _cache_folder() -> str:
    import taichi as ti

    return os.environ.get("TI_OFFLINE_CACHE_FILE_PATH") or ti.lang.impl.default_cfg().offline_cache_file_path


def _clear_stale_cache_lock() -> None:
    """Remove Taichi's cache lock when a killed process left it. Taichi holds
    ``ticache.lock`` only while it reads or writes the cache; a process killed then leaves
    it, and every later process warned "Lock ... failed" on stderr and neither read nor
    wrote the cache (a whole test run compiled everything and its one-line-error tests
    failed). A lock older than STALE_LOCK_AGE is removed, while no tisim process holds the
    write lock of :func:`_write_kernel_cache_in_turn`."""
    import time

    try:
        import fcntl
    except ImportError:
        return
    folder = _cache_folder()
    lock = os.path.join(folder, "ticache.lock")
    try:
        if time.time() - os.path.getmtime(lock) < STALE_LOCK_AGE:
            return
        with open(os.path.join(folder, "tisim-write.lock"), "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError: a process is writing now
            os.remove(lock)
            log.info("removed a stale Taichi cache lock (%s)", lock)
    except OSError:
        return


def _write_kernel_cache_in_turn() -> None:
    """At exit: write Taichi's offline kernel cache (``ti.reset``) while holding a lock of
    tisim's own. Taichi's own lock does not wait: of two processes that end together (the
    test suite's two workers, a sweep's runs, a pipelined refine's levels) the second
    skipped its write ("Lock ... failed") and every kernel only it had compiled was
    compiled again by the next run."""
    import time

    import taichi as ti

    try:
        import fcntl
    except ImportError:  # (no flock: Taichi writes at exit as it does)
        return
    try:
        folder = ti.lang.impl.current_cfg().offline_cache_file_path
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "tisim-write.lock"), "a") as fh:
            deadline = time.monotonic() + CACHE_WRITE_WAIT
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            ti.reset()
    except Exception as e:  # exiting: a cache not written costs time, never results
        log.debug("the kernel cache was not written in turn: %s", e)


def limit_numpy_blas() -> int | None:
    """numpy's OpenBLAS on one thread for the rest of the process; returns the number of
    threads it had (None when it is not loaded or the user chose its thread count).

    OpenBLAS's worker threads spin for about 0.1 s after each call it runs on several
    threads (a dot product of two 12k vectors is one), holding a core that MKL's PARDISO
    and Taichi's kernels, which run next, want: on 2 cores the cloth's factorisations and
    analyses took 1.3-1.6x their time (64 x 64 drape, frames 28-31). numpy's BLAS calls
    here are vector-sized, where one thread loses nothing. An OPENBLAS_NUM_THREADS set by
    the user is left as it is, and so is another OpenBLAS in the process (the system one
    under CHOLMOD, the solvers' fallback without MKL), unless numpy shares it."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return None
    from threadpoolctl import ThreadpoolController

    libs = ThreadpoolController().select(internal_api="openblas").lib_controllers
    # the copy numpy's wheels bring (numpy.libs/libscipy_openblas*); else the only one
    # there is (conda-style builds share one OpenBLAS with everything)
    paths = [c.filepath for c in libs if "numpy" in c.filepath or "scipy_openblas" in c.filepath]
    paths = paths or [c.filepath for c in libs]
    if not paths:
        return None
    pools = ThreadpoolController().select(filepath=paths)
    before = max(c.num_threads for c in pools.lib_controllers)
    pools.limit(limits=1)
    log.debug("numpy's OpenBLAS (%s): %d -> 1 thread", ", ".join(paths), before)
    return before


def _arch_name(a) -> str:
    import taichi as ti

    for name in ("cuda", "vulkan", "x64", "arm64"):
        if a == getattr(ti, name, None):
            return "cpu" if name in ("x64", "arm64") else name
    return str(a)


def current() -> BackendInfo:
    """The backend in use; initialises the default (auto) one if none is."""
    return _current if _current is not None else init()


def is_initialized() -> bool:
    return _current is not None


def reset() -> None:
    """Tear Taichi down (tests use this between modules that need a clean runtime)."""
    global _current, _requested
    if _current is None:
        return
    import taichi as ti

    ti.reset()
    _current = _requested = None


def real():
    """The Taichi float type of the current precision."""
    import taichi as ti

    return ti.f64 if current().precision == "f64" else ti.f32


def np_real():
    import numpy as np

    return np.float64 if current().precision == "f64" else np.float32


# --------------------------------------------------------------------------------------
# host <-> ndarray copies
#
# ``nd.from_numpy`` and ``nd.to_numpy`` launch one of Taichi's copy kernels each: about
# 0.3 ms a call on the CPU backend whatever the size (Python's launch path, not the
# copy), and the cloth solver's Newton iteration moves positions and gradients across
# a dozen times. On the CPU backend an ndarray's memory is host memory, so the same
# copies are numpy copies into and out of a view of it. GPU backends keep Taichi's.


# (read, write) counters of _taichi_patches.traffic, when installed: the host-view copies
# of the CPU backend are where a GPU backend reads and writes device memory
_traffic = None


def _host_view(nd):
    """A numpy array sharing ``nd``'s memory (CPU backend), cached on the ndarray so
    that the view never outlives the allocation it points into; None elsewhere."""
    v = getattr(nd, "_tisim_host_view", None)
    if v is not None:
        return v
    if current().arch != "cpu":
        return None
    import ctypes

    import numpy as np
    from taichi.lang import impl
    from taichi.lang._ndarray import Ndarray

    if not isinstance(nd, Ndarray):  # a field: Taichi's own copy
        return None

    dtype = {
        "f64": np.float64,
        "f32": np.float32,
        "i32": np.int32,
        "i64": np.int64,
        "u8": np.uint8,
        "i8": np.int8,
        "u32": np.uint32,
    }.get(str(nd.arr.element_data_type()))
    if dtype is None:
        return None
    shape = tuple(nd.arr.total_shape())
    count = int(np.prod(shape, dtype=np.int64))
    ptr = impl.get_runtime().prog.get_ndarray_data_ptr_as_int(nd.arr)
    if count == 0 or not ptr:
        return None
    buf = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(ptr)
    v = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)
    nd._tisim_host_view = v
    return v


def upload(nd, arr) -> None:
    """``nd.from_numpy(arr)``: the same checks (shape equal to the ndarray's), without a
    kernel launch on the CPU backend."""
    import numpy as np

    v = _host_view(nd)
    if v is None:
        # in the ndarray's own dtype: Taichi's copy kernel is compiled for the array's, and
        # an f64 array into an f32 ndarray warns "Assign may lose precision" (Vulkan, f32)
        from taichi.lang.util import to_numpy_type

        nd.from_numpy(np.ascontiguousarray(arr, dtype=to_numpy_type(nd.dtype)))
        return
    arr = np.asarray(arr)
    if arr.shape != v.shape:
        raise ValueError(f"upload: array of shape {arr.shape} into an ndarray of shape {v.shape}")
    np.copyto(v, arr, casting="unsafe")
    if _traffic is not None:
        _traffic[1](v.nbytes)


def download(nd, rows: int | None = None):
    """A numpy copy of ``nd`` (of its first ``rows`` rows when given): ``nd.to_numpy()``
    without a kernel launch on the CPU backend."""
    v = _host_view(nd)
    if v is None:
        a = nd.to_numpy()
        return a if rows is None else a[:rows]
    out = (v if rows is None else v[:rows]).copy()
    if _traffic is not None:
        _traffic[0](out.nbytes)
    return out


def zero(nd, rows: int | None = None) -> bool:
    """nd[...] = 0 (its first ``rows`` rows when given) through the host view on the CPU
    backend; False (nothing done) where there is none, for the caller's kernel to do it."""
    v = _host_view(nd)
    if v is None:
        return False
    (v if rows is None else v[:rows]).fill(0)
    return True
