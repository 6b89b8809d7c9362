"""Run one scene with several integrators and compare energy and momenta over time.

``compare(scene, ["admm", "implicit-euler", "xpbd"], out_dir)`` runs the scene once per
integrator through :func:`tisim.runner.run_scene` (``out_dir/NAME/stats.csv`` and
``run.json`` each), then writes into ``out_dir``:

* ``energy.png``: total energy (kinetic + elastic + gravity + penalty) over time;
* ``linear_momentum.png``: |p(t) - p(0)| (kg m/s);
* ``angular_momentum.png``: |L(t)| about the origin (kg m^2/s);
* ``compare.json``: the summary returned (drifts, iterations, timings per integrator).

All integrators report the same energy (the one ADMM integrates, see
:mod:`tisim.solvers.baselines.common`) and the runner computes momenta from the
velocities each integrator carries (ADMM: the midpoint recursion), so the curves
compare like with like. Library code: the CLI (``tisim compare``) only parses.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)

DEFAULT_INTEGRATORS = ("admm", "implicit-euler", "xpbd")


def scene_for(scene, integrator: str, options: dict | None = None):
    """``scene`` with its solver replaced by ``integrator``'s config: the scene's own when it
    already uses that integrator, else the integrator's defaults; ``options`` (a dict of
    config fields) override either."""
    from tisim.config import from_dict, to_dict
    from tisim.solvers.registry import solver_config_class

    cls = solver_config_class(integrator)  # ConfigError for unknown names
    base = to_dict(scene.solver) if scene.solver is not None and scene.solver.type == integrator else {}
    data = {**base, **(options or {}), "type": integrator}
    return dataclasses.replace(scene, solver=from_dict(cls, data, "solver"))


def read_stats(path: Path | str) -> dict[str, np.ndarray]:
    """stats.csv as columns of floats (empty cells are NaN)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    return {k: np.array([float(r[k]) if r[k] not in ("", None) else math.nan for r in rows]) for k in rows[0]}


def summarize(stats: dict[str, np.ndarray], total_mass: float | None = None) -> dict:
    """Energy and momentum drifts of one run (relative drifts are NaN when undefined).

    The linear momentum drift is relative to sqrt(2 M K_max) (M: ``total_mass``, K_max: the
    largest kinetic energy), the momentum of the fastest uniform motion the run reaches,
    because p itself is often zero (a body spinning about its centre)."""
    E = stats["total_energy"]
    p = np.stack([stats["px"], stats["py"], stats["pz"]], 1)
    L = np.stack([stats["lx"], stats["ly"], stats["lz"]], 1)
    finite = np.isfinite(E)
    E0 = float(E[0])
    # relative to the energy at the start, or to the largest kinetic energy when E0 ~ 0
    # (a zero of the gravity potential chosen at the start)
    scale = max(abs(E0), float(np.nanmax(stats["kinetic"])) if len(E) else 0.0)
    dE = np.abs(E[finite] - E0)
    L0 = float(np.linalg.norm(L[0]))
    p_scale = float(np.linalg.norm(p, axis=1).max())
    if total_mass is not None:
        p_scale = max(p_scale, math.sqrt(2.0 * total_mass * max(float(np.nanmax(stats["kinetic"])), 0.0)))
    p_scale = max(p_scale, 1e-300)
    frames = stats["frame"][1:]
    it = stats["iterations"][1:]
    wall = stats["wall_ms"][1:]
    out = {
        "frames": int(frames[-1]) if len(frames) else 0,
        "energy_initial": E0,
        "energy_final": float(E[-1]),
        "energy_max_drift_rel": float(dE.max() / scale) if scale > 0 and dE.size else math.nan,
        "energy_final_change_rel": float((E[-1] - E0) / scale) if scale > 0 else math.nan,
        "energy_nonfinite_frames": int(np.count_nonzero(~finite)),
        "linear_momentum_max_drift": float(np.linalg.norm(p - p[0], axis=1).max()),
        "linear_momentum_max_drift_rel": float(np.linalg.norm(p - p[0], axis=1).max() / p_scale),
        "angular_momentum_max_drift_rel": float(np.linalg.norm(L - L[0], axis=1).max() / L0) if L0 > 0 else math.nan,
        "mean_iterations": float(np.mean(it)) if len(it) else math.nan,
        "max_iterations": float(np.max(it)) if len(it) else math.nan,
        "mean_wall_ms": float(np.mean(wall)) if len(wall) else math.nan,
        "median_wall_ms": float(np.median(wall)) if len(wall) else math.nan,
        "min_volume_ratio": float(np.nanmin(stats["min_volume_ratio"])),
    }
    if "admm_stalled" in stats:
        out["stalled_frames"] = int(np.nansum(stats["admm_stalled"][1:] > 0))
    return out


def _plot(curves: dict[str, tuple[np.ndarray, np.ndarray]], ylabel: str, title: str, path: Path,
          logy: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for name, (t, y) in curves.items():
        if logy:
            y = np.where(y > 0, y, np.nan)
        ax.plot(t, y, label=name, lw=1.4)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def compare(
    scene,
    integrators: list[str] | tuple[str, ...] = DEFAULT_INTEGRATORS,
    out_dir: Path | str = "compare",
    frames: int | None = None,
    progress: bool | Callable[[str, int, int], None] | None = None,
    options: dict[str, dict] | None = None,
) -> dict:
    """Run ``scene`` with each integrator and write stats, plots and compare.json.

    scene: a :class:`tisim.scene.Scene` (its ``solver`` is replaced per integrator, see
    :func:`scene_for`). integrators: registry names. out_dir: output folder.
    frames: frames per run (default: the scene's). progress: True/False for the runner's
    progress bar, or a callable ``progress(name, index, count)`` called before each run.
    options: per-integrator config overrides, e.g. ``{"xpbd": {"substeps": 20}}``.

    Returns {"scene": name, "integrators": {name: summary}, "plots": [paths]}, where a
    summary holds the run's end state ("completed"/"diverged"/...), its folder and the
    drifts of :func:`summarize`.
    """
    from tisim.model import Model
    from tisim.runner import run_scene

    if not integrators:
        raise ValueError("compare needs at least one integrator")
    total_mass = float(Model.from_scene(scene).mass.sum())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    curves: dict[str, dict[str, np.ndarray]] = {}
    for i, name in enumerate(integrators):
        sc = scene_for(scene, name, (options or {}).get(name))
        if callable(progress):
            progress(name, i, len(integrators))
        run_dir = out / name
        log.info("compare: running %s with %s", scene.name, name)
        res = run_scene(sc, run_dir, frames=frames, progress=bool(progress) and not callable(progress))
        stats = read_stats(run_dir / "stats.csv")
        summary = {"ended": res.ended, "message": res.message, "out_dir": str(run_dir)}
        if stats and len(stats.get("frame", [])) > 1:
            summary.update(summarize(stats, total_mass))
            curves[name] = stats
        results[name] = summary
    plots = []
    if curves:
        t = {k: v["time"] for k, v in curves.items()}
        paths = (out / "energy.png", out / "linear_momentum.png", out / "angular_momentum.png")
        _plot({k: (t[k], v["total_energy"]) for k, v in curves.items()}, "total energy (J)",
              f"{scene.name}: total energy", paths[0])
        _plot({k: (t[k], np.linalg.norm(np.stack([v["px"] - v["px"][0], v["py"] - v["py"][0],
                                                    v["pz"] - v["pz"][0]], 1), axis=1))
               for k, v in curves.items()}, "|p(t) - p(0)| (kg m/s)", f"{scene.name}: linear momentum change",
              paths[1], logy=True)
        _plot({k: (t[k], np.linalg.norm(np.stack([v["lx"], v["ly"], v["lz"]], 1), axis=1))
               for k, v in curves.items()}, "|L(t)| (kg m^2/s)", f"{scene.name}: angular momentum", paths[2])
        plots = [str(p) for p in paths]
    summary = {"scene": scene.name, "integrators": results, "plots": plots}
    (out / "compare.json").write_text(json.dumps(_jsonable(summary), indent=2))
    return summary


def _jsonable(o):
    if isinstance(o, dict):
        return {k: _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
    return o
