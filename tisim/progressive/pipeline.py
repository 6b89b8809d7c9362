"""The pipelined schedule: the finest levels in processes of their own, the coarser ones
interleaved frame by frame in the refine's process, each level following the one below
through the checkpoints; the thread counts that keep the processes off each other's
cores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from tisim import backend
from tisim.outputs import progress


def run_pipelined(self, frames, resume, info, announce):
    """The levels in ``pipeline_groups``: the coarser ones interleaved frame by frame
    in this process, each finer one in a process of its own, every level following
    the one below through the checkpoints; returns the wall time of each level (from
    the common start).

    Each worker process pays Taichi's start-up: the Python front end of every kernel
    runs again in each process (Taichi 1.7's offline cache, keyed on the front end's
    output, saves only the LLVM compilation; the solvers' kernels take ndarrays, so
    one cached kernel serves every mesh size). Workers get ``pipeline_threads`` Taichi
    (and BLAS) threads each unless the environment already sets them, so that the
    processes do not oversubscribe the cores."""
    t0 = time.perf_counter()
    groups = pipeline_groups(self.L + 1, self.pipeline_cores)
    threads = pipeline_threads(len(groups), self.pipeline_cores)
    threads["TISIM_SERIAL_LOOPS"] = "1" if backend.SERIAL_LOOPS else "0"  # the loops as here
    procs = _start_workers(self, groups, threads, frames, resume)
    info["pipelined_threads"] = {k: os.environ.get(k, v) for k, v in threads.items()}
    info["pipelined_groups"] = groups
    done = {}
    try:
        c0 = _cpu_seconds()
        here = groups[0]
        name = f"level {here[0]}" if len(here) == 1 else f"levels {here[0]}-{here[-1]}"
        bar = _bar(self.progress, frames, name)
        running = {
            lv: self.level_frames(lv, frames, resume=resume, bar=bar.advance if bar and lv == here[-1] else None)
            for lv in here
        }
        try:
            while running:  # one frame of each level in turn, coarsest first
                for lv in list(running):
                    try:
                        next(running[lv])
                    except StopIteration as end:
                        done[lv] = (end.value, time.perf_counter() - t0)
                        del running[lv]
        finally:
            for gen in running.values():
                gen.close()
            if bar:
                bar.stop()
        # cpu_s: this process's stepping of its levels together (its start-up is the refine's own)
        cpu = _cpu_seconds() - c0
        for lv in here:
            li, sec = done[lv]
            self._record_level(lv, li, sec, info, announce, process_s=sec, cpu_s=cpu, levels_in_process=here)
        seconds = [done[lv][1] for lv in here]
        if procs:
            _load_plotting()  # while the finer levels step: the plot at the end is then quick
        for level, pr in procs.items():
            pr.join()
            seconds.append(time.perf_counter() - t0)
            if pr.exitcode != 0:
                err = self.level_dir(level) / "worker_error.txt"
                why = f": {err.read_text()}" if err.exists() else ""
                raise FloatingPointError(f"level {level} failed in its process (exit code {pr.exitcode}){why}")
            li = json.loads((self.level_dir(level) / "level.json").read_text())
            self._record_level(level, li, seconds[-1], info, announce)
    finally:
        # a failed or interrupted level never writes the frames the levels above
        # wait for: stop them rather than leave them polling
        for pr in procs.values():
            if pr.is_alive():
                pr.terminate()
                pr.join()
    info["pipelined_wall_s"] = time.perf_counter() - t0
    return seconds


def _start_workers(self, groups, threads: dict, frames, resume) -> dict:
    """Start a process for each finer level (``groups[1:]``), with ``threads`` in its
    environment; returns {level: process}."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = {}
    with _environment(threads):
        for (level,) in groups[1:]:
            (self.level_dir(level) / "worker_error.txt").unlink(missing_ok=True)
            pr = ctx.Process(
                target=_pipeline_worker,
                args=(
                    type(self),
                    self.scene,
                    str(self.out),
                    level,
                    frames,
                    resume,
                    self.binfo.arch,
                    self.binfo.precision,
                    self.hierarchy.level_count,
                    self.export_meshes,
                    time.time(),
                ),
            )
            pr.start()
            procs[level] = pr
    return procs


def pipeline_groups(levels: int, cores: int | None = None) -> list[list[int]]:
    """The pipelined schedule's processes as lists of levels, the refine's own process
    first: the finest levels a process each, as many as the cores allow beside the
    refine's, and every coarser level interleaved frame by frame in the refine's process
    (on 2 cores and 3 levels: [[0, 1], [2]]). A process per level on fewer cores would
    pay one more start-up and make the finest level, whose last frame ends the refine,
    share its core with the levels below until they finish, then step its backlog alone."""
    cores = max(1, cores or os.cpu_count() or 1)
    own = min(levels - 1, cores - 1)  # the finest levels with a process of their own
    first = levels - own
    return [list(range(first))] + [[lv] for lv in range(first, levels)]


def pipeline_threads(processes: int, cores: int | None = None) -> dict[str, str]:
    """Thread counts for each of ``processes`` concurrent level processes on ``cores``
    cores (default: this machine's): Taichi's CPU threads and the BLAS/OpenMP/MKL threads
    of the linear solvers, as environment variables, so that together they use each core
    about once. More threads than cores make every parallel kernel wait for its slowest
    thread whenever another process holds a core."""
    cores = cores or os.cpu_count() or 1
    n = str(max(1, cores // max(1, processes)))
    return {"TI_CPU_MAX_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}


class _environment:
    """Set the variables not already set, for the processes started inside; restore after."""

    def __init__(self, values: dict[str, str]):
        self.values = {k: v for k, v in values.items() if k not in os.environ}

    def __enter__(self):
        os.environ.update(self.values)
        return self

    def __exit__(self, *exc):
        for k in self.values:
            os.environ.pop(k, None)
        return False


def _load_plotting() -> None:
    """Import matplotlib (Agg) ahead of ``write_consistency``'s plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError:
        pass


def _pipeline_worker(refiner_class, scene, out, level, frames, resume, arch, precision, count, export, spawned):
    """One level of the pipelined schedule in its own process. Its level.json records
    ``startup_s`` (from the spawn until ready to step: interpreter, imports, Taichi, the
    levels and the solver; the kernels load at the first step, inside the first frame),
    ``process_s`` (spawn to end) and ``cpu_s`` (the process's CPU time, all threads)."""
    try:
        r = refiner_class(
            scene, out, levels=count, arch=arch, precision=precision, progress=False, export_meshes=export
        )
        r.solver(level)
        ready = time.time() - spawned
        li = r.run_level(level, frames, resume=resume)
    except BaseException as e:  # the refine's process reports it, in one line
        err = Path(out) / f"level_{level}" / "worker_error.txt"
        err.parent.mkdir(parents=True, exist_ok=True)
        err.write_text(f"{type(e).__name__}: {e}")
        raise SystemExit(1) from None
    li.update(
        startup_s=ready,
        process_s=time.time() - spawned,
        cpu_s=_cpu_seconds(),
        threads=os.environ.get("TI_CPU_MAX_NUM_THREADS"),
    )
    (r.level_dir(level) / "level.json").write_text(json.dumps(li))


def _cpu_seconds() -> float:
    """CPU time of this process so far (user + system, all threads), s."""
    try:
        import resource
    except ImportError:  # not POSIX
        return time.process_time()
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _merge(a, b):
    return dataclasses.replace(
        b,
        iterations=a.iterations + b.iterations,
        ccd_clamps=a.ccd_clamps + b.ccd_clamps,
        min_distance=min(a.min_distance, b.min_distance),
        max_strain=max(a.max_strain, b.max_strain),
        converged=a.converged and b.converged,
    )


def _bar(enabled, total, name):
    return progress(enabled, total, name)
