"""What every benchmark shares: the machine it ran on, medians, and where results go.

A benchmark's figures mean little without the machine and how busy it was, so every JSON a
benchmark writes carries ``machine()``; results worth keeping go to
``benchmarks/results/<benchmark>/<date>-<machine slug>.json`` (``result_path``), and what
changed between two of them is told in ``docs/benchmarks.md`` and in git, not in file names.

The scripts beside this file import it as ``from common import ...``: run them as
``python benchmarks/bench_NAME.py`` (the script's folder is then on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def machine(**extra: Any) -> dict:
    """The machine and software a figure was measured with.

    CPU model, logical cores, system, Python and load average at the start (from
    ``tisim``'s run.json writer, so a benchmark and a run describe a machine alike), plus
    numpy's, Taichi's versions and whether CHOLMOD was found. ``extra`` keys are added.
    The start load is also kept as ``loadavg_start``: a benchmark adds ``loadavg_end``
    (``load_average()``) when it finishes, and figures taken at a load above the core count
    are upper bounds.
    """
    from tisim.linalg.cholesky import cholmod_available
    from tisim.outputs import machine as base
    from tisim.outputs import versions

    m = base()
    v = versions()
    m.update(
        numpy=v.get("numpy"), taichi=v.get("taichi"), cholmod=cholmod_available(), loadavg_start=m.get("load_average")
    )
    m.update(extra)
    return m


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the system has none."""
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def median(values: Iterable[float]) -> float | None:
    """The median as a plain float, None for no values (a JSON null, never a made-up 0)."""
    xs = list(values)
    return float(np.median(xs)) if xs else None


def machine_slug(m: dict | None = None) -> str:
    """A short name for a machine in result file names: ``intel-xeon-2c``, ``amd-epyc-2c``."""
    m = m or machine()
    cpu = str(m.get("cpu", "")).lower()
    cpu = re.sub(r"\((r|tm)\)|processor|cpu|@.*|\d+-core", " ", cpu)
    words = [w for w in re.split(r"[^a-z0-9]+", cpu) if w][:2] or ["cpu"]
    return "-".join(words) + f"-{m.get('cores', '?')}c"


def result_path(benchmark: str, m: dict | None = None, date: str | None = None) -> Path:
    """``benchmarks/results/<benchmark>/<date>-<machine slug>.json``; an existing file of the
    same day and machine is never overwritten (``-02``, ``-03``... are appended)."""
    date = date or time.strftime("%Y-%m-%d")
    folder = RESULTS / benchmark
    stem = f"{date}-{machine_slug(m)}"
    path = folder / f"{stem}.json"
    k = 2
    while path.exists():
        path = folder / f"{stem}-{k:02d}.json"
        k += 1
    return path


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented JSON (numpy scalars and arrays as plain numbers), making
    the folder; returns the path."""

    def plain(o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, Path):
            return str(o)
        raise TypeError(f"not JSON serialisable: {type(o).__name__}")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=plain))
    return path
