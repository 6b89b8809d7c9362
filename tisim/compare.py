"""Run one scene with several integrators and compare energy and momenta over time.

``compare(scene, ["admm", "implicit-euler", "xpbd"], out_dir)`` runs the scene once per
integrator through :func:`tisim.runner.run_scene` (``out_dir/NAME/stats.csv`` and
``run.json`` each), then writes into ``out_dir``:

* ``energy.png``: total energy (kinetic + elastic + gravity + penalty) over time;
* ``linear_momentum.png``: |p(t) - p(0)| (kg m/s);
* ``angular_momentum.png``: |L(t)| about the origin (kg m^2/s);
* ``compare.json``: the summary returned (drifts, iterations, timings per integrator);
* with ``render``: ``NAME/frames/`` and ``NAME/NAME.mp4`` per integrator, and
  ``side_by_side/side_by_side.mp4``: the integrators next to each other,
  each panel labelled with the integrator, the time and the total energy.

Like with like: every integrator must integrate the same energy (the one each reports
as its potential, so the energy curves measure dissipation and drift, not a model
mismatch). :func:`integrated_energies` names the energy each integrator integrates per
scene material (:mod:`tisim.materials` names: ADMM, implicit Euler and XPBD integrate
"neo-hookean-log" for the scene's "neo-hookean", PD tisim's stable "neo-hookean"; XPBD
has only a stand-in for the symmetric energies); :func:`compare` refuses integrators that
disagree (unless ``mixed_energies``) and records the energies in compare.json and its
table. The runner computes momenta from the velocities each integrator carries (ADMM:
the midpoint recursion). Library code: the CLI (``tisim compare``) only parses.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from tisim.render.clip import Clip

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


def comparable_integrators() -> list[str]:
    """The registered solvers compare runs: all but the cloth solver, which is the only one
    that runs cloth (so a cloth scene has no second integrator to compare it with) and runs
    nothing else."""
    from tisim.solvers.registry import names

    return [n for n in names() if n != "cloth"]


def check_comparable(scene, integrators) -> None:
    """Raise :class:`ConfigError` (one line, naming the scene file) for a scene with cloth
    objects or an integrator compare does not run, before anything runs. (A cloth scene
    ended in "solver.type: cloth objects need solver.type = 'cloth', got 'admm'", a type
    compare had set, not the user.)"""
    from tisim.config import ConfigError

    ok = comparable_integrators()
    cloths = [k for k, o in scene.objects.items() if getattr(o, "kind", "solid") == "cloth"]
    if cloths:
        raise ConfigError(
            "",
            f"tisim compare compares the solid integrators ({', '.join(ok)}) on scenes "
            f"without cloth; objects.{cloths[0]} is a cloth (kind = 'cloth'), which only the "
            "cloth solver runs: nothing to compare (run the scene with tisim run)",
            scene.path,
        )
    for name in integrators:
        if name not in ok:
            what = (
                f"{name!r} is the cloth solver, which runs only cloth scenes"
                if name == "cloth"
                else f"unknown integrator {name!r}"
            )
            raise ConfigError("--integrators", f"{what}: expected some of {', '.join(ok)}")


def integrated_energies(scene) -> dict[str, str]:
    """{scene material: name of the energy the scene's solver integrates for it}, for the
    materials of the scene's solid objects: a :mod:`tisim.materials` name when the solver
    integrates that energy exactly (up to a constant), else a descriptive name ("...
    stand-in", "unknown", or a "+ ..." suffix for extra terms)."""
    mats = sorted({o.material for o in scene.objects.values() if getattr(o, "kind", "solid") == "solid"})
    cfg = scene.solver
    kind = cfg.type if cfg is not None else "unknown"
    if kind == "xpbd":
        from tisim.solvers.baselines.xpbd import integrated_energy

        return {m: integrated_energy(m) for m in mats}
    if kind == "implicit-euler":
        from tisim.solvers.baselines.common import material_name

        return {m: material_name(m, bool(getattr(cfg, "stable_neo_hookean", False))) for m in mats}
    if kind == "admm":
        from tisim.solvers.admm.prox import energy_name

        return {m: energy_name(m) for m in mats}
    if kind == "pd":
        extra = " + volume constraint" if float(getattr(cfg, "volume_stiffness", 0.0)) > 0 else ""
        return {m: m + extra for m in mats}
    return dict.fromkeys(mats, "unknown")


def format_table(summary: dict) -> list[str]:
    """The comparison as text lines: one row per integrator with how the run ended, the
    largest relative energy drift, |dL|/L0, min det F, the median frame time and the
    energy integrated (material=energy)."""
    lines = [
        f"{'integrator':16s} {'ended':10s} {'energy drift':>12s} {'|dL|/L0':>9s} "
        f"{'min det F':>9s} {'ms/frame':>9s}  energy integrated"
    ]
    for k, v in summary["integrators"].items():
        energy = ", ".join(f"{m}={e}" for m, e in v.get("energy", {}).items())
        lines.append(
            f"{k:16s} {v.get('ended', ''):10s} {v.get('energy_max_drift_rel', float('nan')):12.2e} "
            f"{v.get('angular_momentum_max_drift_rel', float('nan')):9.2e} "
            f"{v.get('min_volume_ratio', float('nan')):9.3f} {v.get('median_wall_ms', float('nan')):9.1f}  "
            f"{energy}"
        )
    if not summary.get("same_energy", True):
        lines.append("warning: the integrators integrate different energies: the drifts are not comparable")
    return lines


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
        # (empty for cloth: no volume; np.nanmin would warn on the all-NaN column)
        "min_volume_ratio": float(np.nanmin(v)) if np.isfinite(v := stats["min_volume_ratio"]).any() else math.nan,
    }
    if "admm_stalled" in stats:
        out["stalled_frames"] = int(np.nansum(stats["admm_stalled"][1:] > 0))
    return out


def _plot(
    curves: dict[str, tuple[np.ndarray, np.ndarray]], ylabel: str, title: str, path: Path, logy: bool = False
) -> None:
    # a Figure of its own, not pyplot: matplotlib.use("Agg") here switched a Jupyter
    # kernel's backend for good, and the notebook's own plots stopped showing
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
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


def _drop_stale(run_dir: Path, started: float) -> None:
    """Remove an integrator folder's stats.csv and run.json left by an earlier compare when
    this one's run failed before writing its own: they would pass for this run's."""
    for f in ("stats.csv", "run.json"):
        p = run_dir / f
        if p.exists() and p.stat().st_mtime < started:
            p.unlink()


def compare(
    scene,
    integrators: list[str] | tuple[str, ...] = DEFAULT_INTEGRATORS,
    out_dir: Path | str = "compare",
    frames: int | None = None,
    progress: bool | Callable[[str, int, int], None] | None = None,
    options: dict[str, dict] | None = None,
    mixed_energies: bool = False,
    render: bool = False,
) -> dict:
    """Run ``scene`` with each integrator and write stats, plots and compare.json.

    scene: a :class:`tisim.scene.Scene` (its ``solver`` is replaced per integrator, see
    :func:`scene_for`). integrators: registry names. out_dir: output folder.
    frames: frames per run (default: the scene's). progress: True/False for the runner's
    progress bar, or a callable ``progress(name, index, count)`` called before each run.
    options: per-integrator config overrides, e.g. ``{"xpbd": {"substeps": 20}}``.
    mixed_energies: run integrators that integrate different energies anyway (flagged);
    by default that is a :class:`tisim.config.ConfigError` raised before any run.
    render: render each run off-screen (needs Vulkan) and compose the labelled
    side-by-side video (``summary["side_by_side"]``, its path).

    Returns {"scene": name, "integrators": {name: summary}, "plots": [paths], "energy":
    {material: energy} shared by all (None when mixed), "same_energy": bool}, where a
    summary holds the run's end state ("completed"/"diverged"/"stalled"/"interrupted", the
    runner's, or "failed": an exception, named in ``error``; or "not run": after a Ctrl-C)
    with its message, its folder, the energy it integrated ({material: energy},
    :func:`integrated_energies`) and the drifts of :func:`summarize`. A run that diverges
    or fails does not stop the others; the plots and compare.json hold every run that
    stepped. A :class:`ConfigError` or :class:`MeshError` (the scene's mistake) is raised.
    """
    from tisim.model import Model

    if not integrators:
        raise ValueError("compare needs at least one integrator")
    check_comparable(scene, integrators)
    scenes = {name: scene_for(scene, name, (options or {}).get(name)) for name in integrators}
    energies, same = _shared_energy(scenes, mixed_energies)
    total_mass = float(Model.from_scene(scene).mass.sum())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    curves: dict[str, dict[str, np.ndarray]] = {}
    stopped = False  # a Ctrl-C: the integrators after it are not run
    for i, name in enumerate(integrators):
        run_dir = out / name
        summary = {"ended": "not run", "message": "", "out_dir": str(run_dir), "energy": energies[name]}
        results[name] = summary
        if stopped:
            continue
        if callable(progress):
            progress(name, i, len(integrators))
        stats, stopped = _run_one(
            scenes[name],
            name,
            run_dir,
            summary,
            frames=frames,
            render=render,
            progress=bool(progress) and not callable(progress),
        )
        if stats and len(stats.get("frame", [])) > 1:
            summary.update(summarize(stats, total_mass))
            curves[name] = stats
    plots = _plot_drifts(curves, scene.name, out) if curves else []
    side = side_by_side(scene, out, list(curves)) if render and curves else None
    summary = {
        "scene": scene.name,
        "integrators": results,
        "plots": plots,
        "side_by_side": str(side) if side else None,
        "energy": next(iter(energies.values())) if same else None,
        "same_energy": same,
    }
    (out / "compare.json").write_text(json.dumps(_jsonable(summary), indent=2))
    return summary


def _shared_energy(scenes: dict, mixed_energies: bool) -> tuple[dict, bool]:
    """The energy each integrator integrates ({name: {material: energy}}) and whether they
    all integrate the same one; a mixed set is a ConfigError unless ``mixed_energies``."""
    from tisim.config import ConfigError

    energies = {name: integrated_energies(sc) for name, sc in scenes.items()}
    distinct = {tuple(sorted(e.items())) for e in energies.values()}
    same = len(distinct) == 1 and not any(
        "stand-in" in v or v == "unknown" for e in energies.values() for v in e.values()
    )
    if not same:
        text = "; ".join(f"{n}: " + ", ".join(f"{m} -> {e}" for m, e in en.items()) for n, en in energies.items())
        if not mixed_energies:
            raise ConfigError(
                "--integrators",
                f"these integrators do not integrate the same energy ({text}); compare integrators that "
                "share one (e.g. admm, implicit-euler and xpbd on arap, corotated or neo-hookean)",
            )
        log.warning("compare: different energies (%s): the energy drifts are not comparable", text)
    return energies, same


def _run_one(
    sc, name: str, run_dir: Path, summary: dict, *, frames, render: bool, progress: bool
) -> tuple[dict | None, bool]:
    """Run one integrator's scene into ``run_dir``, recording how it ended in ``summary``.

    Returns (its stats columns or None, whether a Ctrl-C stops the comparison). A failure
    of this integrator is recorded, not raised; the scene's own mistake (ConfigError,
    MeshError) is raised, since it is the same for every integrator."""
    from tisim.config import ConfigError
    from tisim.geometry.mesh import MeshError
    from tisim.runner import run_scene

    log.info("compare: running %s with %s", sc.name, name)
    started = time.time()
    try:
        viewer = None
        if render:
            from tisim.render.offscreen import recording_viewer

            viewer = recording_viewer(sc, run_dir, video_name=f"{name}.mp4", frames=frames)
        res = run_scene(sc, run_dir, frames=frames, progress=progress, viewer=viewer)
    except (ConfigError, MeshError):
        raise
    except KeyboardInterrupt:  # before the first step (the runner keeps the frames of one after it)
        summary.update(ended="interrupted", message="interrupted before its first frame")
        _drop_stale(run_dir, started)
        return None, True
    except Exception as e:  # one integrator's failure; the others still run
        log.debug("compare: %s failed", name, exc_info=True)
        summary.update(
            ended="failed", message=f"{type(e).__name__}: {' '.join(str(e).split())}", error=type(e).__name__
        )
        _drop_stale(run_dir, started)
        return None, False
    summary.update(ended=res.ended, message=res.message)
    return read_stats(run_dir / "stats.csv"), res.ended == "interrupted"


def _plot_drifts(curves: dict[str, dict[str, np.ndarray]], scene_name: str, out: Path) -> list[str]:
    """energy.png, linear_momentum.png and angular_momentum.png of every run that stepped."""
    t = {k: v["time"] for k, v in curves.items()}
    paths = (out / "energy.png", out / "linear_momentum.png", out / "angular_momentum.png")
    _plot(
        {k: (t[k], v["total_energy"]) for k, v in curves.items()},
        "total energy (J)",
        f"{scene_name}: total energy",
        paths[0],
    )
    _plot(
        {
            k: (
                t[k],
                np.linalg.norm(np.stack([v["px"] - v["px"][0], v["py"] - v["py"][0], v["pz"] - v["pz"][0]], 1), axis=1),
            )
            for k, v in curves.items()
        },
        "|p(t) - p(0)| (kg m/s)",
        f"{scene_name}: linear momentum change",
        paths[1],
        logy=True,
    )
    _plot(
        {k: (t[k], np.linalg.norm(np.stack([v["lx"], v["ly"], v["lz"]], 1), axis=1)) for k, v in curves.items()},
        "|L(t)| (kg m^2/s)",
        f"{scene_name}: angular momentum",
        paths[2],
    )
    return [str(p) for p in paths]


def panel_labels(name: str, stats: dict[str, np.ndarray], ended: str = "completed") -> list[list[str]]:
    """The lines written on an integrator's panel, per frame: its name, the time (s) and
    the total energy (J) with its change from frame 0 (per cent of |E(0)|, or J when E(0)
    is 0); the last frame of a run that did not complete says how it ended."""
    E = stats["total_energy"]
    E0 = float(E[0])
    out = []
    for i, (t, e) in enumerate(zip(stats["time"], E)):
        change = f"{100 * (e - E0) / abs(E0):+.3f}%" if E0 != 0 else f"{e - E0:+.3g} J"
        lines = [name, f"t = {t:.3f} s", f"E = {e:.5g} J ({change})"]
        if ended != "completed" and i == len(E) - 1:
            lines.append(ended)
        out.append(lines)
    return out


def side_by_side(scene, out: Path, names: list[str]) -> Path | None:
    """``out/side_by_side.mp4`` from the integrators' rendered frames (``out/NAME/frames``)
    and their stats.csv, each panel labelled (:func:`panel_labels`)."""
    from tisim.render.video import write_side_by_side

    panels, labels = [], []
    for name in names:
        frames = sorted((out / name / "frames").glob("frame_*.png"))
        stats = read_stats(out / name / "stats.csv")
        if not frames or not stats:
            continue
        ended = (
            json.loads((out / name / "run.json").read_text()).get("ended", "completed")
            if (out / name / "run.json").exists()
            else "completed"
        )
        panels.append(frames[: len(stats["time"])])
        labels.append(panel_labels(name, stats, ended))
    fps = scene.render.fps or 1.0 / (scene.sim.dt * scene.sim.substeps)
    return write_side_by_side(panels, labels, out / "side_by_side", fps=fps, video_name="side_by_side.mp4")


def _jsonable(o):
    if isinstance(o, dict):
        return {k: _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
    return o


@dataclasses.dataclass
class Comparison:
    """What :func:`compare` returns.

    Attributes:
        table: one row per integrator: ``ended``, ``energy_max_drift_rel`` (largest
            |E(t) - E(0)| over max(|E(0)|, max kinetic energy)), ``energy_final_change_rel``,
            ``linear_momentum_max_drift_rel``, ``angular_momentum_max_drift_rel`` (|L(t) -
            L(0)| / |L(0)|), ``min_volume_ratio``, ``mean_iterations``, ``median_wall_ms``.
        stats: each integrator's stats.csv as a DataFrame.
        summary: compare.json's content.
        out_dir: the output folder (``NAME/`` per integrator, the plots, side_by_side.mp4).
    """

    table: pd.DataFrame
    stats: dict[str, pd.DataFrame]
    summary: dict
    out_dir: Path

    def __repr__(self) -> str:
        return f"Comparison({list(self.table.index)}, out_dir={str(self.out_dir)!r})"

    def video(self, *, width: int | None = 960) -> Clip:
        from tisim.render.clip import Clip

        """The labelled side-by-side video (integrator, time, energy on each panel)."""
        p = self.summary.get("side_by_side")
        if not p or not Path(p).exists():
            raise FileNotFoundError("this comparison rendered no video (render=False, or no Vulkan)")
        return Clip(p, width=width)

    def plot(self, column: str = "total_energy", ax=None):
        """``column`` of each integrator's stats against time on a matplotlib axis."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3.5))
        for name, df in self.stats.items():
            ax.plot(df["time"], df[column], label=name)
        ax.set_xlabel("time (s)")
        ax.set_ylabel(column)
        ax.legend()
        ax.grid(alpha=0.3)
        return ax


def run_comparison(
    scene: str | Path,
    integrators: Sequence[str] = ("admm", "implicit-euler", "xpbd"),
    *,
    frames: int | None = None,
    out: str | Path | None = None,
    render: bool = True,
    arch: str = "auto",
    precision: str | None = None,
    **overrides: Any,
) -> Comparison:
    """Run one scene with several integrators, as ``tisim compare`` does.

    Args:
        scene: a scene file or demo name.
        integrators: solver names ("admm", "implicit-euler", "pd", "xpbd").
        frames: frames per run (default: the scene's).
        out: output folder (default ``out/NAME-compare``).
        render: render each integrator's frames and a labelled side-by-side video
            (skipped without Vulkan).
        arch, precision: the backend (see :func:`load`).
        **overrides: dotted scene keys (``--set``).

    Returns:
        A :class:`Comparison`.
    """
    import pandas as pd

    from tisim import backend
    from tisim.runner import scene_precision, scene_threads
    from tisim.scene import load_scene, override_strings, resolve_scene

    sc = load_scene(resolve_scene(scene), override_strings(overrides))
    out_dir = Path(out) if out is not None else Path("out") / f"{sc.name}-compare"
    backend.init(arch, scene_precision(sc, precision), threads=scene_threads(sc))
    summary = compare(sc, list(integrators), out_dir, frames=frames, progress=False, render=render)
    rows, stats = [], {}
    for name, v in summary["integrators"].items():
        rows.append({"integrator": name, **{k: v for k, v in v.items() if k not in ("energy", "out_dir")}})
        f = Path(v["out_dir"]) / "stats.csv"
        if f.exists():
            stats[name] = pd.read_csv(f)
    return Comparison(table=pd.DataFrame(rows).set_index("integrator"), stats=stats, summary=summary, out_dir=out_dir)


# tisim.compare(...) is run_comparison, the Python API's compare (tisim.api.compare)
from tisim._callable_module import make_callable  # noqa: E402

make_callable(__name__, "run_comparison")
