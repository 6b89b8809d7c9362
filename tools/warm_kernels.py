"""Compile tisim's kernels into Taichi's offline cache before many processes need them.

Taichi compiles a kernel at its first launch in each process and writes the compiled code
to its offline cache only when the process ends. On a fresh machine, the test suite's two
workers and the command-line runs they start therefore all compile the same kernels, each
for itself, until one of them exits. This runs every demo for two headless frames in
``--jobs`` processes (the demos shared out between them), which then exit and write the
cache; the processes that follow load the kernels instead of compiling them. The cloth
demos share one process (their kernels are the same), the other solvers' the others. ``make test``
runs it first; after a warm-up of the same sources (a stamp in the cache folder names a
hash of tisim's sources and the demos) it returns at once.

    .venv/bin/python tools/warm_kernels.py              # every demo, 2 processes
    .venv/bin/python tools/warm_kernels.py --jobs 1 squeeze-ball cloth-drape
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import sys
from tisim import backend
backend.init("cpu", "f64")
import tisim
for demo in sys.argv[2:]:
    tisim.load(demo).run(frames=2, out=sys.argv[1] + "/" + demo)
"""


def demos() -> list[str]:
    return sorted(p.stem for p in (ROOT / "demos").glob("*.toml"))


def _is_cloth(name: str) -> bool:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    path = ROOT / "demos" / f"{name}.toml"
    return path.exists() and tomllib.loads(path.read_text()).get("solver", {}).get("type") == "cloth"


def groups(names: list[str], jobs: int) -> list[list[str]]:
    """The demos shared out over ``jobs`` processes: the cloth demos in the first, the
    others round-robin over the rest (all in one for one job)."""
    if jobs == 1:
        return [names]
    out = [[n for n in names if _is_cloth(n)]] + [[] for _ in range(jobs - 1)]
    for k, n in enumerate(n for n in names if not _is_cloth(n)):
        out[1 + k % (jobs - 1)].append(n)
    return [g for g in out if g]


def stamp_path() -> Path:
    """The stamp a finished warm-up leaves in Taichi's cache folder: named by a hash of
    tisim's sources, the demos and the Python and Taichi versions."""
    from importlib.metadata import version

    h = hashlib.sha1(f"{sys.version}|{version('taichi')}".encode())
    for p in sorted([*(ROOT / "tisim").rglob("*.py"), *(ROOT / "demos").glob("*.toml")]):
        h.update(p.relative_to(ROOT).as_posix().encode())
        h.update(p.read_bytes())
    folder = os.environ.get("TI_OFFLINE_CACHE_FILE_PATH") or str(Path.home() / ".cache" / "taichi" / "ticache")
    return Path(folder) / f"tisim-warm-{h.hexdigest()[:16]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("demos", nargs="*", help="demo names (default: every demo)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("TEST_JOBS", "2")))
    a = ap.parse_args()
    names = a.demos or demos()
    stamp = None if a.demos else stamp_path()
    if stamp is not None and stamp.exists():
        print("warm_kernels: the cache already holds these sources' kernels")
        return 0
    parts = groups(names, max(1, min(a.jobs, len(names))))
    t0 = time.perf_counter()
    env = dict(os.environ, TISIM_QUIET="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="tisim-warm-") as tmp:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, tmp, *part],
                cwd=tmp,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for part in parts
        ]
        failed = [(p, p.communicate()[1]) for p in procs]
        failed = [(p, err) for p, err in failed if p.returncode != 0]
    for p, err in failed:  # a warm-up that fails costs only time: say so, do not stop the tests
        print(f"warm_kernels: a warm-up process exited {p.returncode}: {err.strip()[-500:]}", file=sys.stderr)
    if stamp is not None and not failed:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.touch()
    print(f"warm_kernels: {len(names)} demos in {len(parts)} processes, {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
