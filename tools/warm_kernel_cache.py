"""Compile tisim's CPU f64 kernels once, into Taichi's offline cache, before the test suite.

Why: Taichi writes its offline cache when a process ends. pytest's workers live for the
whole suite, so on a fresh machine each of them compiled every kernel it met by itself, and
so did every command-line run or child process a test started before some other process
had ended and written the kernel down. This runs every demo's solver for a few frames on
shrunk meshes (plus a two-level refine and the compared integrators), in ``--jobs``
processes that each take one family of solvers, and lets them write the cache as they end;
the suite's processes then load those kernels instead of compiling them again.

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
    print(f"  {'+'.join(names)}: {time.perf_counter() - t0:.0f} s ({', '.join(done)})", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--group", help=argparse.SUPPRESS)  # a child's share, comma-separated
    args = ap.parse_args(argv)
    if args.group:
        _group(args.group.split(","))
        return 0
    groups = [["solids", "cloth", "refine"]]
    if args.jobs == 2:
        groups = [["solids"], ["cloth", "refine"]]
    elif args.jobs >= 3:
        groups = [["solids"], ["cloth"], ["refine"]]
    t0 = time.perf_counter()
    # child processes that end normally: Taichi writes its cache at a process's exit, which
    # a multiprocessing worker skips
    # MKL on one thread, as in the suite (conftest.py): its idle thread spins on a busy core
    env = {"MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", **os.environ}
    children = [subprocess.Popen([sys.executable, __file__, "--group", ",".join(g)], env=env) for g in groups]
    failed = [c.args[-1] for c in children if c.wait() != 0]
    if failed:
        print(f"warming Taichi's kernel cache failed in: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"Taichi's kernel cache warmed in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
