"""What a run leaves behind, shared by the runner and the progressive refiner: stats.csv
rows, run.json (written atomically), the machine and versions it records, the exit codes,
clearing an earlier run's numbered frames, and the progress bar.

Both :mod:`tisim.runner` and :mod:`tisim.progressive` use this module and it imports
neither, so the two do not import each other.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import platform
import re
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

STATS_COLUMNS = [
    "frame",
    "time",
    "wall_ms",
    "iterations",
    "residual",
    "kinetic",
    "potential",
    "total_energy",
    "px",
    "py",
    "pz",
    "lx",
    "ly",
    "lz",
    "com_x",
    "com_y",
    "com_z",
    "vcom_x",
    "vcom_y",
    "vcom_z",
    "min_volume_ratio",
    "n_contacts",
    "max_penetration",
    "converged",
]

# Exit codes of a run (the CLI returns them).
EXIT_OK, EXIT_USAGE, EXIT_DIVERGED, EXIT_STALLED, EXIT_INTERRUPTED = 0, 2, 3, 4, 130


class StatsWriter:
    """stats.csv, one row per frame; flushed every row so an interrupted run keeps its rows.

    The header is the fixed columns plus the solver's extra columns of the first row.
    A quantity that is NaN is written as an empty cell.
    """

    def __init__(self, path: Path):
        self.path = path
        self._f = None
        self._w = None
        self._cols: list[str] = []
        self._pending: list[dict] = []

    def write(self, row: dict) -> None:
        # The header is fixed by the first stepped row (frame 0 has no solver
        # columns yet), so the initial row waits for it.
        if self._w is None:
            self._pending.append(row)
            if len(self._pending) < 2:
                return
            self._open()
            return
        self._w.writerow([_cell(row.get(c, math.nan)) for c in self._cols])
        self._f.flush()

    def _open(self) -> None:
        extra: list[str] = []
        for r in self._pending:
            extra += [k for k in r if k not in STATS_COLUMNS and k not in extra]
        self._cols = STATS_COLUMNS + extra
        self._f = open(self.path, "w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(self._cols)
        for r in self._pending:
            self._w.writerow([_cell(r.get(c, math.nan)) for c in self._cols])
        self._pending = []
        self._f.flush()

    def close(self) -> None:
        if self._w is None and self._pending:
            self._open()
        if self._f is not None:
            self._f.close()
            self._f = None


def _cell(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if v is None:
        return ""
    v = float(v)
    if math.isnan(v):
        return ""
    return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("tisim", "taichi", "numpy", "scipy", "meshio", "scikit-sparse", "mkl", "imageio-ffmpeg"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def machine() -> dict:
    """What the numbers were measured on: CPU model, logical cores, system, Python,
    load average (benchmarks on shared machines must say how busy it was) and date."""
    import os

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "system": platform.platform(),
        "python": platform.python_version(),
        "load_average": load,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


_EARLIER = re.compile(r"^(frames/frame_(\d{5})\.png|meshes/([\w.-]+)_(\d{5})\.(obj|ply))$")


def earlier_outputs(run_json: Path) -> dict:
    """What the run recorded in ``run_json`` can have written, as the keyword arguments
    of :func:`clear_earlier_frames`: its mesh names (the solids' surface ``frame`` and
    its cloth objects' names), whether it wrote frame images and meshes at all, and its
    last frame number. A run.json from before ``outputs`` was recorded counts as having
    written both."""
    info = read_json(run_json) or {}
    objects = (info.get("scene") or {}).get("objects") or {}
    names = {"frame"} | {str(k) for k, o in objects.items() if isinstance(o, dict) and o.get("kind") == "cloth"}
    outputs = info.get("outputs") if isinstance(info.get("outputs"), dict) else {}
    last = info.get("frames_requested")
    return {
        "names": names if outputs.get("meshes", True) else set(),
        "frames": bool(outputs.get("frames", True)),
        "last": last if isinstance(last, int) and not isinstance(last, bool) else None,
    }


def clear_earlier_frames(folder: Path, *, names=None, frames: bool = True, last: int | None = None) -> int:
    """Remove the numbered frame images (frames/frame_NNNNN.png) and meshes
    (meshes/NAME_NNNNN.obj or .ply) an earlier run wrote into ``folder``, so that a
    shorter rerun does not leave a sequence mixing two runs; nothing else (the rest is
    overwritten, and files of the user's own stay). names: the mesh names that run
    wrote (None: any); frames: whether it wrote frame images; last: its last frame
    number (None: any). Returns the number removed."""
    folder = Path(folder)
    gone = 0
    for sub in ("frames", "meshes"):
        d = folder / sub
        if not d.is_dir():
            continue
        for p in d.iterdir():
            m = _EARLIER.match(f"{sub}/{p.name}")
            if not m or not p.is_file():
                continue
            if m.group(2) is not None:  # a frame image
                ours, number = frames, int(m.group(2))
            else:
                ours, number = names is None or m.group(3) in names, int(m.group(4))
            if ours and (last is None or number <= last):
                p.unlink()
                gone += 1
    if gone:
        log.info("removed %d frame files of an earlier run from %s", gone, folder)
    return gone


def read_json(path: Path) -> dict | None:
    """A JSON object from ``path`` (a run.json); None when missing, unreadable or not an object."""
    try:
        info = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file replaced), NaN as null and
    infinities as strings, numpy values as plain numbers."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(data), indent=2, default=_json_default, allow_nan=False))
    tmp.replace(path)


def _finite(o):
    """NaN/inf are not JSON: NaN becomes null, infinities become strings."""
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, (float, np.floating)):
        o = float(o)
        if math.isnan(o):
            return None
        if math.isinf(o):
            return "inf" if o > 0 else "-inf"
    return o


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


class ProgressBar:
    """A rich progress bar counting frames."""

    def __init__(self, total, name):
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(
            TextColumn(f"[bold]{name}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} frames"),
            TimeRemainingColumn(),
            transient=False,
        )
        self.task = self.p.add_task(name, total=total)
        self.p.start()

    def advance(self):
        self.p.advance(self.task)

    def stop(self):
        self.p.stop()


def progress(enabled: bool, total, name):
    """A progress bar over ``total`` frames, or None when not ``enabled`` or the total is unknown."""
    if not enabled or total is None:
        return None
    return ProgressBar(total, name)
