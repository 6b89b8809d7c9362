"""What a sweep leaves to read: sweep.csv (one row per run: its values, how it ended, the
metrics) and sweep.png (each metric against each varied value). Split from
:mod:`tisim.sweep`, which runs the grid and re-exports these; ``varies`` and ``metrics``
are lists of its ``Vary`` and ``Metric``."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from tisim.scene import toml_value

# the metrics every sweep records: name -> (what it measures, unit)
BUILTIN_METRICS: dict[str, tuple[str, str]] = {
    "final_displacement": ("distance of the centre of mass from its start at the last frame", "m"),
    "max_penetration": ("largest contact penetration over the run", "m"),
    "energy_drift": ("largest |E(t) - E(0)| relative to max(|E(0)|, max kinetic energy)", "1"),
    # frame 1 is left out when there are more: it compiles the kernels on a fresh worker
    "frame_ms": ("median wall-clock time of a frame on its worker (frames 2..N)", "ms"),
}


def value_label(v) -> str:
    """A value as a short label: 1e+05, 0.155, midpoint."""
    if isinstance(v, float):
        return f"{v:.6g}"
    return toml_value(v).strip('"')


def write_csv(path: Path, rows: list[dict], varies: list, metrics: list) -> None:
    cols = ["run", *(v.key for v in varies), "ended", "frames_done", *(m.name for m in metrics), "message"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            cells = []
            for c in cols:
                v = r.get(c, "")
                if isinstance(v, float):
                    v = "" if math.isnan(v) else repr(v)
                elif isinstance(v, (list, tuple, bool)):
                    v = toml_value(v)
                cells.append(v)
            w.writerow(cells)


def _metric_label(m) -> str:
    if m.name in BUILTIN_METRICS:
        unit = BUILTIN_METRICS[m.name][1]
        return f"{m.name} ({unit})" if unit != "1" else m.name
    return m.name


def plot(
    path: Path,
    rows: list[dict],
    varies: list,
    metrics: list,
    *,
    title: str = "",
    vlines: dict[str, list[tuple[float, str]]] | None = None,
) -> Path:
    """Each metric (rows of panels) against each varied parameter (columns): one line per
    combination of the other varied values. Runs that did not complete are red x marks
    (a diverged run's metrics cover the frames before it stopped); a metric spanning more
    than two decades of positive values is drawn on a log scale. ``vlines``: key ->
    [(x, label)] reference lines (e.g. tan(theta) on a friction axis). Matplotlib Agg."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nr, nc = max(len(metrics), 1), max(len(varies), 1)
    fig = Figure(figsize=(4.4 * nc + 0.6, 2.5 * nr + 0.8), dpi=90)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nr, nc, squeeze=False)
    for j, vary in enumerate(varies):
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vary.values)
        xpos = {toml_value(v): (float(v) if numeric else float(i)) for i, v in enumerate(vary.values)}
        others = [v.key for v in varies if v.key != vary.key]
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            groups.setdefault(tuple(toml_value(r[k]) for k in others), []).append(r)
        for i, m in enumerate(metrics):
            ax = axes[i][j]
            ys_all = []
            bad_x, bad_y = [], []
            for rs in groups.values():
                rs = sorted(rs, key=lambda r: xpos[toml_value(r[vary.key])])
                x = np.array([xpos[toml_value(r[vary.key])] for r in rs])
                y = np.array([float(r.get(m.name, math.nan)) for r in rs])
                ok = np.array([r["ended"] == "completed" for r in rs])
                yc = np.where(ok, y, np.nan)
                label = ", ".join(f"{k.split('.')[-1]}={value_label(rs[0][k])}" for k in others) or None
                ax.plot(x, yc, "o-", ms=3.5, lw=1.2, label=label)
                bad = np.array([r["ended"] in ("diverged", "stalled", "failed") for r in rs])
                bad_x += list(x[bad])
                bad_y += [yy if np.isfinite(yy) else np.nan for yy in y[bad]]
                ys_all += list(y[np.isfinite(y)])
            if bad_x:
                finite = list(ys_all) or [0.0]
                lo = min(finite)
                ax.plot(
                    bad_x,
                    [yy if np.isfinite(yy) else lo for yy in bad_y],
                    "x",
                    color="red",
                    ms=7,
                    mew=2,
                    label="did not complete",
                )
            pos = [v for v in ys_all if v > 0]
            if pos and len(pos) == len(ys_all) and max(pos) / min(pos) > 100:
                ax.set_yscale("log")
            for xv, lab in (vlines or {}).get(vary.key, []):
                ax.axvline(xv, color="0.4", ls="--", lw=1)
                ax.annotate(
                    lab,
                    (xv, 0.97),
                    xycoords=("data", "axes fraction"),
                    ha="left",
                    va="top",
                    fontsize=8,
                    color="0.3",
                    xytext=(3, 0),
                    textcoords="offset points",
                )
            if not numeric:
                ax.set_xticks(range(len(vary.values)))
                ax.set_xticklabels([value_label(v) for v in vary.values], fontsize=8)
            if i == nr - 1:
                ax.set_xlabel(vary.key)
            if j == 0:
                ax.set_ylabel(_metric_label(m), fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=8)
            if i == 0 and (others or bad_x):
                ax.legend(fontsize=7, loc="best")
    if title:
        import textwrap

        fig.suptitle(textwrap.fill(title, width=int(fig.get_figwidth() * 15)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path
