"""Compile tisim's CPU f64 kernels once, into Taichi's offline cache, before the test suite.

Why: Taichi writes its offline cache when a process ends. pytest's workers live for the
whole suite, so on a fresh machine each of them compiled every kernel it met by itself, and
so did every command-line run or child process a test started before some other process
had ended and written the kernel down. This runs every demo's solver for a few frames on
shrunk meshes (plus a three-level refine, again on one thread as the bit-for-bit refine
tests run it, and the compared integrators) in child processes, ``--jobs`` at a time, each
taking one family of solvers, and lets them write the cache as they end; the suite's
processes then load those kernels instead of compiling them again.

Run by ``make test`` (the Makefile's ``warm`` step); run it by hand to time it:
``python tools/warm_kernel_cache.py --jobs 2``. It changes no result: a kernel loaded from
the cache is the one Taichi would have compiled (the cache key holds the kernel's source
and every compile setting).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# one family of solvers per process, so no two processes compile the same kernels;
# (demo, frames): enough frames to reach contact on the shrunk meshes
CLOTH = [("cloth-on-ball", 12), ("cloth-twist", 4), ("flag", 3), ("toss", 10), ("ball-drop", 10)]
REFINE = [("refine-drape", 4)]
SOLIDS = [
    ("squeeze-ball", 6),
    ("stick-slip", 4),
    ("twisting-bar", 3),
    ("twisting-bar-neohookean", 3),
    ("grab", 3),
    ("pulling", 3),
    ("sharp-corner", 8),
    ("spinning-bar", 3),
    ("bouncing-ball", 12),
    ("beam", 3),
    ("stretch", 3),
]
COMPARED = ["implicit-euler", "xpbd"]


def _shrunk(demo: str, frames: int):
    from tisim.render.montage import quick_sets
    from tisim.resources import demos_dir
    from tisim.scene import load_scene

    return load_scene(demos_dir() / f"{demo}.toml", quick_sets(demo) + [f"sim.frames={frames}"])


def _cloth(out: Path) -> list[str]:
    from tisim.runner import run_scene

    done = []
    for demo, frames in CLOTH:
        run_scene(_shrunk(demo, frames), out / demo, progress=False, arch="cpu", precision="f64")
        done.append(demo)
    return done


def _refine(out: Path) -> list[str]:
    from tisim.progressive import ProgressiveRefiner

    done = []
    for demo, frames in REFINE:
        sc = _shrunk(demo, frames)
        ProgressiveRefiner(sc, out / demo, progress=False, export_meshes=False).run(frames)
        done.append(demo + " (refine)")
    return done


def _solids(out: Path) -> list[str]:
    from tisim.compare import scene_for
    from tisim.runner import run_scene

    done = []
    for demo, frames in SOLIDS:
        run_scene(_shrunk(demo, frames), out / demo, progress=False, arch="cpu", precision="f64")
        done.append(demo)
    for integrator in COMPARED:
        sc = scene_for(_shrunk("spinning-bar", 2), integrator)
        run_scene(sc, out / integrator, progress=False, arch="cpu", precision="f64")
        done.append("spinning-bar " + integrator)
    return done


def _group(names: list[str]) -> None:
    """One process's share; Taichi writes what it compiled when the process ends."""
    t0 = time.perf_counter()
    from tisim import backend

    backend.init("cpu", "f64")
    logging.disable(logging.WARNING)  # the shrunk demos' own warnings (an ADMM energy drift) are no news
    done = []
    with tempfile.TemporaryDirectory() as out:
        for name in names:
            done += {"cloth": _cloth, "refine": _refine, "solids": _solids}[name](Path(out))
    threads = os.environ.get("TI_CPU_MAX_NUM_THREADS")
    on = f" on {threads} thread(s)" if threads else ""
    print(f"  {'+'.join(names)}{on}: {time.perf_counter() - t0:.0f} s ({', '.join(done)})", flush=True)


def _stamp() -> Path:
    """A file in Taichi's cache folder named for this tree's kernels: tisim's sources, the
    demos, this script and Taichi's version. (Taichi may evict kernels of a stamped cache
    when it outgrows its size cap: the suite then compiles those again, as without this.)"""
    import hashlib

    import taichi as ti

    from tisim import backend

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(repr(ti.__version__).encode())
    files = sorted((root / "tisim").rglob("*.py")) + sorted((root / "demos").glob("*.toml")) + [Path(__file__)]
    for f in files:
        h.update(str(f.relative_to(root)).encode() + f.read_bytes())
    return Path(backend._cache_folder()) / f"tisim-warm-{h.hexdigest()[:16]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--force", action="store_true", help="run even when this tree warmed the cache already")
    ap.add_argument("--group", help=argparse.SUPPRESS)  # a child's share, comma-separated
    args = ap.parse_args(argv)
    if args.group:
        _group(args.group.split(","))
        return 0
    stamp = _stamp()
    if stamp.exists() and not args.force:
        print(f"Taichi's kernel cache holds this tree's kernels already ({stamp.name}; --force to warm it again)")
        return 0
    # (group, Taichi's CPU threads): the refine again on one thread, whose kernels compile
    # with serial loops (backend.SERIAL_LOOPS), as the bit-for-bit refine tests run them
    children = [(["solids"], None), (["cloth", "refine"], None), (["refine"], "1")]
    if args.jobs >= 3:
        children[1:2] = [(["cloth"], None), (["refine"], None)]
    t0 = time.perf_counter()
    # MKL on one thread, as in the suite (conftest.py): its idle thread spins on a busy core
    base = {"MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **os.environ}

    def run(child) -> str | None:
        group, threads = child
        env = base if threads is None else {**base, "TI_CPU_MAX_NUM_THREADS": threads}
        cmd = [sys.executable, __file__, "--group", ",".join(group)]
        # a process each, ending normally: Taichi writes its cache at a process's exit
        return None if subprocess.run(cmd, env=env, check=False).returncode == 0 else ",".join(group)

    with ThreadPoolExecutor(max(1, args.jobs)) as lanes:
        failed = [g for g in lanes.map(run, children) if g]
    if failed:
        print(f"warming Taichi's kernel cache failed in: {'; '.join(failed)}", file=sys.stderr)
        return 1
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
    print(f"Taichi's kernel cache warmed in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
