"""Counting what crosses between host and device (the iteration budget the benchmarks
print with ``--traffic``): kernel launches, host synchronisations and bytes moved.

A launch costs Python and driver time whatever the kernel does, and a read of device
data on the host waits for every launch before it (a synchronisation: the GPU queue
drains, the host idles). On a GPU backend the time of a small iteration is mostly these,
so they are what to count before removing them. Counted, per process, while
:func:`counting` is active (nothing is counted, and nothing costs, otherwise):

- ``launches``: kernel calls (Taichi's own copy kernels of ``to_numpy``/``from_numpy``
  not included: those are counted as transfers);
- ``syncs``: reads of device data on the host: ``to_numpy`` of an ndarray or field,
  ``nd[i]`` / ``field[i]`` reads, a kernel's return value, a numpy array passed to a
  kernel on a GPU backend (Taichi copies it in, launches, waits and copies it back),
  ``ti.sync()``, and ``tisim.backend.download`` (on the CPU backend a copy out of the
  ndarray's memory, the same point in the iteration where a GPU backend would wait);
- ``bytes_to_host`` / ``bytes_to_device``: the bytes of those reads and of the writes
  (``from_numpy``, ``nd[i] = v``, ``backend.upload``, numpy kernel arguments on GPU
  backends);
- ``numpy_args`` / ``numpy_arg_bytes``: numpy arrays passed to kernels, on any backend
  (zero-copy on the CPU backend: listed so that a CPU run shows what a GPU run copies).

Applies to: Taichi 1.7 (``Kernel.__call__``, ``Ndarray``, ``ScalarField`` and
``MatrixField`` methods, ``ti.sync``); installed by :func:`install` only when the
patches are enabled (``tisim._taichi_patches.enabled``), on request (the benchmarks'
``--traffic``), after ``backend.init``. Wrappers only count and call the original:
results are bit for bit the same.
"""

from __future__ import annotations

import contextlib
import logging

import numpy as np

log = logging.getLogger(__name__)

KEYS = (
    "launches",
    "syncs",
    "bytes_to_host",
    "bytes_to_device",
    "numpy_args",
    "numpy_arg_bytes",
)
counts = dict.fromkeys(KEYS, 0)
_active = False
_gpu = False  # numpy kernel arguments are copied (and waited for) on GPU backends
_installed = False


def snapshot() -> dict:
    """The counters now (a copy)."""
    return dict(counts)


def difference(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in KEYS}


@contextlib.contextmanager
def counting():
    """Count inside the block (the counters keep running totals; take snapshots)."""
    global _active
    old, _active = _active, True
    try:
        yield counts
    finally:
        _active = old


def _read(nbytes: int) -> None:
    if _active:
        counts["syncs"] += 1
        counts["bytes_to_host"] += int(nbytes)


def _write(nbytes: int) -> None:
    if _active:
        counts["bytes_to_device"] += int(nbytes)


def _nbytes(v) -> int:
    return int(np.asarray(v).nbytes) if v is not None else 0


def install() -> bool:
    """Wrap the counted calls (once per process, after ``backend.init``); returns whether
    the wrappers are in place.

    One function on purpose: the wrappers close over the Taichi functions they replace,
    imported here (after Taichi started), and are installed together or not at all."""
    global _installed, _gpu
    from tisim import _taichi_patches, backend

    if _installed:
        return True
    if not _taichi_patches.enabled():
        return False
    try:
        import taichi as ti
        from taichi.lang import kernel_impl
        from taichi.lang._ndarray import Ndarray, ScalarNdarray
        from taichi.lang.field import Field, ScalarField
        from taichi.lang.matrix import MatrixField, MatrixNdarray, VectorNdarray
    except ImportError as exc:
        log.debug("traffic counters not installed: %s", exc)
        return False
    _gpu = backend.current().arch != "cpu"

    K = kernel_impl.Kernel
    launch = K.__call__

    def call(self, *args, **kwargs):
        if not _active:
            return launch(self, *args, **kwargs)
        counts["launches"] += 1
        for v in args:
            if isinstance(v, np.ndarray):
                counts["numpy_args"] += 1
                counts["numpy_arg_bytes"] += v.nbytes
                if _gpu:  # copied in, and back after the launch finishes
                    counts["syncs"] += 1
                    counts["bytes_to_device"] += v.nbytes
                    counts["bytes_to_host"] += v.nbytes
        out = launch(self, *args, **kwargs)
        if out is not None:
            _read(8 * (len(out) if isinstance(out, tuple) else 1))
        return out

    for attr in ("_tisim", "__doc__"):  # launch.install() recognises its own path
        if hasattr(launch, attr):
            setattr(call, attr, getattr(launch, attr))
    K.__call__ = call

    def paused(fn):
        """A transfer of Taichi's that launches its own copy kernel: not a launch of ours."""

        def wrapped(*args, **kwargs):
            global _active
            old, _active = _active, False
            try:
                return fn(*args, **kwargs)
            finally:
                _active = old

        return wrapped

    def reader(fn):
        def wrapped(self, *args, **kwargs):
            was = _active
            out = paused(fn)(self, *args, **kwargs)
            if was:
                _read(_nbytes(out))
            return out

        return wrapped

    def writer(fn):
        def wrapped(self, arr, *args, **kwargs):
            if _active:
                _write(_nbytes(arr))
            return paused(fn)(self, arr, *args, **kwargs)

        return wrapped

    def item_reader(fn):
        def wrapped(self, key):
            was = _active
            out = paused(fn)(self, key)
            if was:
                _read(_nbytes(out) if isinstance(out, (np.ndarray, int, float)) else 8)
            return out

        return wrapped

    def item_writer(fn):
        def wrapped(self, key, value):
            if _active:
                _write(_nbytes(value))
            return paused(fn)(self, key, value)

        return wrapped

    # a method calling another counted one counts once (the inner call runs paused)
    for cls in (
        Ndarray,
        ScalarNdarray,
        MatrixNdarray,
        VectorNdarray,
        Field,
        ScalarField,
        MatrixField,
    ):
        d = cls.__dict__
        if "to_numpy" in d:
            cls.to_numpy = reader(d["to_numpy"])
        if "from_numpy" in d:
            cls.from_numpy = writer(d["from_numpy"])
        if "__getitem__" in d:
            cls.__getitem__ = item_reader(d["__getitem__"])
        if "__setitem__" in d:
            cls.__setitem__ = item_writer(d["__setitem__"])
    sync = ti.sync

    def counted_sync():
        if _active:
            counts["syncs"] += 1
        return sync()

    ti.sync = counted_sync
    backend._traffic = (_read, _write)
    _installed = True
    return True
