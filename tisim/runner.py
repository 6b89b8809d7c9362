"""The one owner of the time loop: timing, stats.csv rows, run.json, NaN guard,
Ctrl-C, mesh export and the viewer.

The CLI only parses and dispatches to :func:`run_scene`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tisim.geometry.mesh import tet_signed_volumes
from tisim.outputs import (  # noqa: F401  (re-exported: callers import them from the runner too)
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STALLED,
    EXIT_USAGE,
    STATS_COLUMNS,
    StatsWriter,
    clear_earlier_frames,
    earlier_outputs,
    machine,
    versions,
)
from tisim.outputs import progress as _progress
from tisim.outputs import write_json as _write_json
from tisim.scene import Scene
from tisim.solvers.base import StepDiverged, StepStats

log = logging.getLogger(__name__)


class Diverged(RuntimeError):
    pass


class Stalled(RuntimeError):
    """A solver step did not converge even after the solver's own retries (StepStats extra
    ``stall_failed`` = 1): the run ends like a divergence, with its own exit status."""


@dataclass
class RunResult:
    out_dir: Path
    frames_done: int
    ended: str  # "completed" | "interrupted" | "diverged" | "stalled" | "closed"
    message: str = ""
    video: Path | None = None
    frame_ms: list[float] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return {"diverged": EXIT_DIVERGED, "stalled": EXIT_STALLED, "interrupted": EXIT_INTERRUPTED}.get(
            self.ended, EXIT_OK
        )


def volume_ratios(model, positions: np.ndarray) -> np.ndarray:
    """(m,) det F of every tet: its signed volume over its rest volume (the same number
    as det(Ds Dm^-1), to round-off, at a sixth of the cost)."""
    return tet_signed_volumes(positions, model.mesh.tets) / model.rest.volume


def _kinetic(m: np.ndarray, velocities: np.ndarray) -> float:
    """Kinetic energy, J; inf (not a numpy warning) for velocities whose squares overflow,
    which the divergence guards then report."""
    with np.errstate(over="ignore"):
        return 0.5 * float((m * (velocities**2).sum(axis=1)).sum())


def frame_quantities(model, positions: np.ndarray, velocities: np.ndarray) -> dict[str, float]:
    """Kinetic energy (J), linear momentum (kg m/s), angular momentum about the origin
    (kg m^2/s), centre of mass (m) and its velocity, smallest volume ratio det F."""
    m = model.mass
    M = float(m.sum())
    p = (m[:, None] * velocities).sum(axis=0)
    L = (m[:, None] * np.cross(positions, velocities)).sum(axis=0)
    com = (m[:, None] * positions).sum(axis=0) / M
    J = volume_ratios(model, positions)
    return {
        "kinetic": _kinetic(m, velocities),
        "px": p[0],
        "py": p[1],
        "pz": p[2],
        "lx": L[0],
        "ly": L[1],
        "lz": L[2],
        "com_x": com[0],
        "com_y": com[1],
        "com_z": com[2],
        "vcom_x": p[0] / M,
        "vcom_y": p[1] / M,
        "vcom_z": p[2] / M,
        "min_volume_ratio": float(J.min()) if len(J) else math.nan,
    }


# What f32 cannot promise, measured (docs/benchmarks.md, "GPU-class backends"); one line each, logged
# at start-up and kept in run.json ("precision_notes").
F32_ADMM_NOTE = (
    "f32: the conservative integrator's residuals stall near 5e-7, above its 1e-8 tolerance, "
    "so its exact momentum and near-exact energy hold only in f64: use --precision f64"
)


def precision_notes(scene: Scene, precision: str) -> list[str]:
    """The promises a run in ``precision`` cannot keep for ``scene`` (empty in f64)."""
    if precision != "f32":
        return []
    notes = []
    if scene.solver.type == "admm":
        notes.append(F32_ADMM_NOTE)
    return notes


def needs_f64(scene: Scene) -> bool:
    """Whether the scene runs the cloth solver (cloth objects, or solver.type "cloth")."""
    return scene.solver.type == "cloth" or any(o.kind == "cloth" for o in scene.objects.values())


# Solvers that run faster on one CPU thread than on two on a 2-core machine: their
# iterations are many short kernel loops, and Taichi's thread pool costs about 80 us to
# hand each parallel loop over (wake the worker, wait for it) against 3 us for a serial
# loop (``_taichi_patches.serial_loops``). See ``scene_threads``.
ONE_THREAD_SOLVERS = ("cloth", "admm")
# at most this many usable cores: one thread for those solvers
ONE_THREAD_CORES = 2


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def scene_threads(scene: Scene) -> int | None:
    """The CPU backend's thread count for ``scene`` when the user set none
    (``backend.init(threads=...)``; TI_CPU_MAX_NUM_THREADS always wins): 1 for the cloth
    and the conservative (ADMM) solvers, and for projective dynamics with colliders (its
    contact update is many short loops too), on a machine with at most ONE_THREAD_CORES
    cores; otherwise None (Taichi's default, a thread per core).

    Measured on a 2-core AMD EPYC, median ms a frame, two threads against one (`tisim
    run --no-render`, each pair back to back): the refine-drape preview 70-75 -> 46 (13.4
    and 14.2 -> 21.4 and 21.9 frames a second), refine-drape 34.5 -> 20.5, flag 45.8 ->
    32.9, cloth-drape (4,096 vertices, 40 frames with contact) 134 -> 117, refine-drape at
    4,225 vertices 1,061 and 1,071 -> 1,036 and 968, stretch (ADMM)
    62.3 and 58.7 -> 43.1 and 44.7, bouncing-ball 30.3 and 33.2 -> 29.9 and 28.9;
    projective dynamics with colliders: squeeze-ball (6,951 vertices) 87.8, 86.1 and 100.3
    -> 73.4, 67.7 and 74.7, grab 11.7 and 9.4 -> 9.5 and 9.1, sharp-corner 13.6 and 16.3
    -> 10.5 and 9.9. Projective dynamics without colliders keeps Taichi's default: its
    local step is one large loop, and the twisting bar (5,346 vertices) took 18.8 and 13.1
    ms on two threads against 20.3 and 18.4 on one (the smaller pulling demo was faster on
    one, 13.1 and 10.9 -> 8.4 and 8.4, and is left as it is). With more cores a parallel loop gains more than the hand-off
    costs; not measured here, so Taichi's default stays."""
    solver = scene.solver.type
    contact_pd = solver == "pd" and len(scene.colliders) > 0
    if solver not in ONE_THREAD_SOLVERS and not needs_f64(scene) and not contact_pd:  # (needs_f64: cloth)
        return None
    return 1 if usable_cores() <= ONE_THREAD_CORES else None


def scene_precision(scene: Scene, precision: str | None) -> str | None:
    """The precision to initialise Taichi with for ``scene`` (None: the backend's default,
    f64 on the CPU and f32 on a GPU).

    The cloth solver's IPC contact runs in f64 on every backend; asking for f32 is a
    ConfigError. Its barrier works on squared distances d^2 - xi^2 of about 1e-9 m^2
    between vertices 1 m from the origin, which f32 positions (6e-8 m apart at 1 m) carry
    to a few per cent; measured on the CPU backend, cloth-drape in f32 met a Newton
    system that no diagonal shift up to 1e-4 made positive definite in its fifth contact
    frame (frame 21). The conservative (ADMM) integrator also defaults to f64 everywhere:
    in f32 its residuals stall near 5e-7 and the spinning-bar demo stops at its first step
    (an explicit f32 runs, with F32_ADMM_NOTE)."""
    from tisim.backend import PRECISIONS

    if precision is not None and precision not in PRECISIONS:
        from tisim.config import ConfigError

        raise ConfigError("--precision", f"expected f64 or f32, got {precision!r}")
    if precision is None and scene.solver.type == "admm":
        return "f64"
    if not needs_f64(scene):
        return precision
    if precision == "f32":
        from tisim.config import ConfigError

        raise ConfigError(
            "--precision",
            "the cloth solver (IPC contact) runs in f64 only, got f32: leave --precision unset or use f64",
            scene.path,
        )
    return "f64"


def build(scene: Scene, arch: str = "auto", precision: str | None = None):
    """Initialise Taichi, build the model and the scene's solver."""
    from tisim import backend
    from tisim.model import Model
    from tisim.solvers.registry import solver_class
    from tisim.startup import check_initial_overlaps

    info = backend.init(arch, scene_precision(scene, precision), threads=scene_threads(scene))
    model = check_initial_overlaps(Model.from_scene(scene))  # a deep overlap: one line, exit 2
    if model.cloth is not None and scene.solver.type != "cloth":
        from tisim.config import ConfigError

        raise ConfigError(
            "solver.type", f"cloth objects need solver.type = 'cloth', got {scene.solver.type!r}", scene.path
        )
    solver = solver_class(scene.solver.type)(model, scene.solver)
    return info, model, solver


def run_scene(
    scene: Scene,
    out_dir: Path | str,
    *,
    frames: int | None = None,
    viewer=None,
    export_meshes: bool = False,
    progress: bool = True,
    arch: str = "auto",
    precision: str | None = None,
    live: bool = False,
    on_frame: Callable[[int, object], None] | None = None,
) -> RunResult:
    """Run ``scene`` and write stats.csv, run.json (and frames/meshes) into ``out_dir``.

    frames: frame count (default: the scene's; in a live window the run goes on
    until the window is closed when ``frames`` is None). viewer: an object with
    the tisim.render viewer interface (live, or off-screen with a FrameWriter
    that records PNG frames and the MP4) or None; the runner closes it, which
    finishes the video. The run stops cleanly on Ctrl-C and on NaN, keeping every
    frame it finished.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, solver, n_frames, run_info = _start_run(scene, out, frames, viewer, export_meshes, arch, precision, live)
    loop = _FrameLoop(
        scene,
        out,
        model,
        solver,
        n_frames,
        run_info,
        viewer=viewer,
        export_meshes=export_meshes,
        progress=progress,
        live=live,
        on_frame=on_frame,
    )
    return loop.run()


def _start_run(
    scene: Scene,
    out: Path,
    frames: int | None,
    viewer,
    export_meshes: bool,
    arch: str,
    precision: str | None,
    live: bool,
):
    """Build the model and solver, clear an earlier run's outputs and write the
    first run.json. Returns (model, solver, frame count or None, run_info)."""
    t_build = time.perf_counter()
    binfo, model, solver = build(scene, arch, precision)
    build_s = time.perf_counter() - t_build
    # only once the scene has passed its start-up checks: a rerun refused in one line
    # leaves the earlier run's frames as they were
    if (out / "run.json").exists():
        clear_earlier_frames(out, **earlier_outputs(out / "run.json"))
    notes = precision_notes(scene, binfo.precision)
    for note in notes:
        log.warning("%s", note)
    n_frames = frames if frames is not None else (None if live else scene.sim.frames)
    run_info = {
        "scene": scene.to_dict(),
        "scene_file": scene.path,
        "versions": versions(),
        "machine": machine(),
        "arch": binfo.arch,
        "precision": binfo.precision,
        "precision_notes": notes,
        "sizes": model.sizes(),
        "solver": scene.solver.type,
        "solver_info": solver.info() if hasattr(solver, "info") else {},
        "setup_s": build_s,
        "frames_requested": n_frames,
        "ended": "running",
        # what a rerun into this folder may remove as this run's (clear_earlier_frames)
        "outputs": {"frames": viewer is not None and hasattr(viewer, "video_path"), "meshes": export_meshes},
    }
    _write_json(out / "run.json", run_info)
    return model, solver, n_frames, run_info


class _FrameLoop:
    """One run's time loop: two states swapped every substep, a stats.csv row,
    a viewer frame and the optional mesh export per frame, the divergence
    guards, a live window's events (pause, step, reset, rollback of a failed
    step), and the closing run.json whatever ends the run."""

    def __init__(
        self,
        scene: Scene,
        out: Path,
        model,
        solver,
        n_frames: int | None,
        run_info: dict,
        *,
        viewer,
        export_meshes: bool,
        progress: bool,
        live: bool,
        on_frame: Callable[[int, object], None] | None,
    ):
        self.scene, self.out, self.model, self.solver = scene, out, model, solver
        self.n_frames, self.run_info = n_frames, run_info
        self.viewer, self.export_meshes, self.on_frame = viewer, export_meshes, on_frame
        self.dt, self.substeps = scene.sim.dt, scene.sim.substeps
        self.stats = StatsWriter(out / "stats.csv")
        self.mesh_dir = out / "meshes"
        if export_meshes:
            self.mesh_dir.mkdir(exist_ok=True)
        self.state, self.spare = model.initial_state(), model.initial_state()
        self.frame_ms: list[float] = []
        self.ended, self.message = "completed", ""
        self.done = 0
        self.video = None
        self.bar = _progress(progress and not live, n_frames, scene.name)
        self.guards = DivergenceGuards(
            model,
            scene.sim.on_divergence,
            max_capped_steps=getattr(solver, "max_capped_steps", MAX_CAPPED_STEPS),
            inversion=solver.inversion_is_divergence(),
        )
        self.control = None
        if live and viewer is not None:
            from tisim.live import LiveControl

            self.control = LiveControl(model, solver, viewer, self.dt)
        if viewer is not None:
            viewer.open(view_info(model, scene, solver, self.control))

    def run(self) -> RunResult:
        """Run the frames; a stall, a divergence or Ctrl-C ends the run cleanly."""
        try:
            self._frames()
        except Stalled as e:
            self.ended, self.message = "stalled", str(e)
        except Diverged as e:
            self.ended, self.message = "diverged", str(e)
        except KeyboardInterrupt:
            self.ended, self.message = "interrupted", f"interrupted after {self.done} frames"
        finally:
            self._finish()
        return RunResult(self.out, self.done, self.ended, self.message, self.video, self.frame_ms, self.run_info)

    def _frames(self) -> None:
        self.emit(0, None, 0.0)
        frame = 0
        while self.n_frames is None or frame < self.n_frames:
            if self.control is not None:
                action = self._live_events(frame)
                if action == "closed":
                    self.ended = "closed"
                    break
                if action == "reset":
                    frame = 0
                    continue
                if action == "idle":
                    continue
            t0 = time.perf_counter()
            agg = self._step_frame(frame)
            if agg is None:  # a live window rolled the failed step back
                continue
            if self.control is not None:
                self.control.after_good_step()
            wall_ms = (time.perf_counter() - t0) * 1e3
            frame += 1
            self.frame_ms.append(wall_ms)
            self.emit(frame, agg, wall_ms)
            self.done = frame
            if self.bar is not None:
                self.bar.advance()

    def _live_events(self, frame: int) -> str | None:
        """Apply a live window's events before a frame: "closed", "reset" (back
        to frame 0), "idle" (paused: draw and wait) or None (step the frame)."""
        viewer, control = self.viewer, self.control
        ev = viewer.poll()
        if ev.quit or not viewer.running:
            return "closed"
        paused, step_once = ev.paused, ev.step_once
        control.apply_events(ev, self.state)  # the panel's values hold across a reset
        # a live window without a frame count loops: it starts over at the scene's end
        at_end = self.n_frames is None and frame >= self.scene.sim.frames
        if ev.reset or at_end:
            self.state = self.model.initial_state()
            self.spare = self.model.initial_state()
            self.solver.reset(self.state)
            self.guards.capped_run = 0
            control.on_reset()
            viewer.draw(0, self.state.time, self.state.positions)
            return "reset"
        if paused and not step_once:
            viewer.draw(frame, self.state.time, self.state.positions)
            time.sleep(getattr(viewer, "idle_sleep", 1 / 60))
            return "idle"
        control.before_step(self.state)
        return None

    def _step_frame(self, frame: int) -> StepStats | None:
        """The substeps of frame ``frame + 1``, their stats summed; None when a
        live window rolled a failed step back (without a window it raises)."""
        agg = StepStats(iterations=0)
        try:
            # a live window's dt slider (solvers without a dt of their own)
            h = self.control.dt if self.control is not None and self.control.owns_dt else self.dt
            for _ in range(self.substeps):
                self._substep(frame, h, agg)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a live window survives whatever a step did
            if self.control is None:
                raise
            if not isinstance(e, (Diverged, Stalled)):
                log.warning("live: the step at frame %d raised %s: %s", frame + 1, type(e).__name__, e)
            self.control.rollback(self.state, frame, e)
            self.guards.capped_run = 0
            self.viewer.draw(frame, self.state.time, self.state.positions)
            return None
        return agg

    def _substep(self, frame: int, h: float, agg: StepStats) -> None:
        try:
            st = self.solver.step(self.state, self.spare, h)
        except StepDiverged as e:
            raise Diverged(
                f"the simulation diverged at frame {frame + 1} (t = {self.state.time:.4g} s): "
                f"{e}; the {frame} frames before are kept"
            ) from None
        self.state, self.spare = self.spare, self.state
        _accumulate(agg, st)
        if not self.state.is_finite():
            raise Diverged(
                f"the simulation diverged at frame {frame + 1} (t = {self.state.time:.4g} s): "
                f"NaN or Inf in the positions or velocities; the {frame} frames before are kept"
            )
        self.guards.check_stall(self.state, st, frame + 1)
        self.guards.check(self.state, st, frame + 1)

    def emit(self, frame: int, st: StepStats | None, wall_ms: float) -> None:
        """Write frame ``frame``'s stats row, draw it, export its meshes."""
        state, solver, viewer = self.state, self.solver, self.viewer
        q = frame_quantities(self.model, state.positions, state.velocities)
        pot = st.potential if st is not None else solver.potential_energy(state.positions)
        row = {
            "frame": frame,
            "time": state.time,
            "wall_ms": wall_ms,
            "iterations": st.iterations if st else 0,
            "residual": st.residual if st else math.nan,
            "potential": pot,
            "total_energy": q["kinetic"] + pot,
            "n_contacts": st.n_contacts if st else 0,
            "max_penetration": st.max_penetration if st else math.nan,
            "converged": st.converged if st else True,
        }
        row.update(q)
        if st is not None:
            row.update({f"ms_{k}": v for k, v in st.timings.items()})
            row.update(st.extra)
        self.stats.write(row)
        if viewer is not None:
            readout = getattr(viewer, "set_readout", None)
            if readout is not None:
                readout({"energy": row["total_energy"]})  # NaN where the solver reports no potential
            viewer.draw(frame, state.time, state.positions)
        if self.export_meshes:
            export_frame_meshes(self.model, self.mesh_dir, frame, state.positions)
        if self.on_frame is not None:
            self.on_frame(frame, state)

    def _finish(self) -> None:
        """Close the stats, the progress bar and the viewer (which finishes a
        recording's MP4); write the final run.json."""
        self.stats.close()
        if self.bar is not None:
            self.bar.stop()
        if self.viewer is not None:
            self.viewer.close()  # finishes the MP4 of a recording renderer
            self.video = getattr(self.viewer, "video_path", None)
        ms = np.asarray(self.frame_ms) if self.frame_ms else np.asarray([math.nan])
        self.run_info.update(
            ended=self.ended,
            message=self.message,
            frames_done=self.done,
            timings_ms={
                "mean": float(np.mean(ms)),
                "median": float(np.median(ms)),
                "p95": float(np.percentile(ms, 95)),
                "max": float(np.max(ms)),
            },
            solver_info=self.solver.info() if hasattr(self.solver, "info") else {},
            video=str(self.video) if self.video else None,
            guards=self.guards.info(),
            stalls=self.guards.stalls,
        )
        if self.control is not None:
            self.run_info["rollbacks"] = [vars(r) for r in self.control.rollbacks]
        _write_json(self.out / "run.json", self.run_info)


_SUMMED = {"newton_iterations", "ccd_clamps", "stall_retries", "prox_failures"}


def export_frame_meshes(model, mesh_dir: Path, frame: int, positions: np.ndarray) -> None:
    """Write one frame's meshes: the solids' surface as ``frame_NNNNN.ply`` and every
    cloth object as ``NAME_NNNNN.obj`` with its original UVs."""
    from tisim.geometry.io import save_mesh

    cloth = model.cloth
    n_cloth_faces = len(cloth.faces) if cloth is not None else 0
    solid_surface = model.surface[: len(model.surface) - n_cloth_faces]
    if len(solid_surface):
        save_mesh(str(mesh_dir / f"frame_{frame:05d}.ply"), positions, solid_surface)
    if cloth is not None:
        from tisim.geometry.cloth import save_cloth_obj

        for name, sl, mesh in cloth.meshes:
            x = positions[cloth.offset + sl.start : cloth.offset + sl.stop]
            save_cloth_obj(mesh_dir / f"{name}_{frame:05d}.obj", x, mesh)


MAX_CAPPED_STEPS = 20  # consecutive non-converged solver steps that count as a divergence


class DivergenceGuards:
    """Divergence checks after every solver step, beyond the NaN check (any solver):

    * an infinite or NaN total energy (``StepStats.potential`` inf or NaN while the state
      is finite; a potential of NaN counts only from a solver that reported a finite one
      before, since NaN also means "not computed");
    * an inverted element (det F <= 0) in the end-of-step state, for tet meshes only
      (``model.element_count > 0``; cloth has no tets), when ``inversion`` is true (the
      solver's ``inversion_is_divergence()``): the ADMM solver guarantees det F > 0, so an
      inverted tet there is a failure; PD with ARAP, corotated or neo-Hookean recovers
      inverted tets in its local step, so there it is logged once and the run goes on;
    * ``MAX_CAPPED_STEPS`` consecutive steps with ``StepStats.converged`` false;
    * (``check_stall``) a step the solver could not converge even after its own retries
      (``StepStats.extra["stall_failed"]`` = 1): :class:`Stalled`, exit status 4.

    ``on_divergence = "stop"`` raises :class:`Diverged` naming the frame and the cause;
    "continue" logs each cause once and records its first occurrence (``info()``, in run.json).
    """

    def __init__(
        self, model, on_divergence: str = "stop", max_capped_steps: int = MAX_CAPPED_STEPS, inversion: bool = True
    ):
        self.model = model
        self.inversion = bool(inversion)
        self.inverted_steps = 0  # steps that ended with an inverted tet (inversion = False)
        self.stop = on_divergence != "continue"
        self.max_capped_steps = int(max_capped_steps)
        self.capped_run = 0
        self.capped_steps = 0
        self._capped_since = math.nan
        self._reports_potential = False
        self.events: list[dict] = []
        self._seen: set[str] = set()
        # solvers that retry stalled steps report stall_retries / stall_failed per step (StepStats.extra)
        self.stalls: dict[str, int] = {"stalled_steps": 0, "retries": 0, "recovered": 0, "failed": 0}

    def check_stall(self, state, st: StepStats, frame: int) -> None:
        """Count the step's stall retries; raise :class:`Stalled` (or, with on_divergence =
        "continue", record the event) when the step is unconverged after them."""
        retries = int(st.extra.get("stall_retries", 0) or 0)
        failed = bool(st.extra.get("stall_failed", 0))
        if retries or failed:
            self.stalls["stalled_steps"] += 1
            self.stalls["retries"] += retries
            self.stalls["recovered"] += int(not failed)
            self.stalls["failed"] += int(failed)
        if not failed:
            return
        msg = (
            f"the solver stalled at frame {frame} (t = {state.time:.4g} s): the step did not converge "
            f"after {retries} retries (residual {st.residual:.3g}, {st.iterations} iterations)"
        )
        if self.stop:
            raise Stalled(f"{msg}; the {frame - 1} frames before are kept (sim.on_divergence = \"continue\" runs on)")
        if "stalled" not in self._seen:
            self._seen.add("stalled")
            self.events.append({"frame": frame, "time": float(state.time), "cause": "stalled", "message": msg})
            log.warning("%s; continuing (sim.on_divergence = \"continue\")", msg)

    def check(self, state, st: StepStats, frame: int) -> None:
        """Raise :class:`Diverged` (or record the event) if the step that produced ``state``
        (the end of the step, reported by ``st``, within frame ``frame``) diverged."""
        causes: list[tuple[str, str]] = []
        pot = st.potential
        if math.isfinite(pot):
            self._reports_potential = True
        elif math.isinf(pot) or self._reports_potential:
            causes.append(("energy", f"the energy is {'infinite' if math.isinf(pot) else 'NaN'} (potential = {pot} J)"))
        m = self.model.element_count
        if m > 0:
            J = volume_ratios(self.model, state.positions)
            bad = int(np.count_nonzero(~(J > 0)))
            if bad:
                text = f"{bad} of {m} tets inverted at the end of the step (min det F = {float(np.nanmin(J)):.3g})"
                if self.inversion:
                    causes.append(("inversion", text))
                else:
                    self.inverted_steps += 1
                    if "inverted" not in self._seen:
                        self._seen.add("inverted")
                        log.info(
                            "frame %d (t = %.4g s): %s; the solver's projections recover inverted tets, "
                            "so the run goes on",
                            frame,
                            state.time,
                            text,
                        )
        if st.converged:
            self.capped_run = 0
        else:
            self.capped_steps += 1
            if self.capped_run == 0:
                self._capped_since = float(state.time)
            self.capped_run += 1
            if self.capped_run >= self.max_capped_steps:
                causes.append(
                    (
                        "capped",
                        f"{self.capped_run} consecutive solver steps did not converge "
                        f"(since t = {self._capped_since:.4g} s)",
                    )
                )
        for kind, text in causes:
            msg = f"the simulation diverged at frame {frame} (t = {state.time:.4g} s): {text}"
            if self.stop:
                raise Diverged(
                    f"{msg}; the {frame - 1} frames before are kept (sim.on_divergence = \"continue\" runs on)"
                )
            if kind not in self._seen:
                self._seen.add(kind)
                self.events.append({"frame": frame, "time": float(state.time), "cause": kind, "message": msg})
                log.warning("%s; continuing (sim.on_divergence = \"continue\")", msg)

    def info(self) -> dict:
        """For run.json: the policy, the capped-step limit and count, first events per cause."""
        return {
            "on_divergence": "stop" if self.stop else "continue",
            "max_capped_steps": self.max_capped_steps,
            "capped_steps": self.capped_steps,
            "events": self.events,
            "inversion_is_divergence": self.inversion,
            "inverted_steps": self.inverted_steps,
        }


def _accumulate(agg: StepStats, st: StepStats) -> None:
    agg.iterations += st.iterations
    agg.residual = st.residual
    agg.converged = agg.converged and st.converged
    agg.potential = st.potential
    agg.n_contacts = st.n_contacts
    agg.max_penetration = (
        st.max_penetration if math.isnan(agg.max_penetration) else max(agg.max_penetration, st.max_penetration)
    )
    for k, v in st.timings.items():
        agg.timings[k] = agg.timings.get(k, 0.0) + v
    for k, v in st.extra.items():
        # a frame has stalled if any of its substeps did; extremes and counts combine over
        # the substeps; other columns keep the last substep's value
        prev = agg.extra.get(k)
        if prev is None or (isinstance(prev, float) and math.isnan(prev)):
            agg.extra[k] = v
        elif "stalled" in k or k.startswith("max_"):
            agg.extra[k] = max(prev, v)
        elif k.startswith("min_"):
            agg.extra[k] = min(prev, v)
        elif k in _SUMMED:
            agg.extra[k] = prev + v
        else:
            agg.extra[k] = v


def cloth_colors(info, model) -> np.ndarray | None:
    """Per-face colours of the surface (``model.surface``) with a checker from each cloth's
    UVs (:func:`tisim.render.base.checker`), so both sides of a sheet and its folds read clearly, and a
    user's UV layout shows; the solids' faces keep their objects' colours. None without
    cloth."""
    from tisim.render.base import checker_colors

    if model.cloth is None:
        return None
    colors = info.vertex_colors()
    if colors is None:
        colors = np.empty((model.vertex_count, 3))
        colors[:] = info.render.color
    faces = np.asarray(model.surface)
    face_colors = colors[faces[:, 0]]
    cp = model.cloth
    row = len(faces) - len(cp.faces)  # the cloth's faces close the surface, in mesh order
    for _name, _sl, mesh in cp.meshes:
        m = len(mesh.faces)
        face_colors[row : row + m] = checker_colors(mesh.faces, mesh.uv, mesh.face_uv, face_colors[row])
        row += m
    return face_colors


def view_info(model, scene, solver=None, control=None):
    """What a viewer needs to draw ``model`` as ``scene`` sets it (camera, colours,
    colliders, the drawn ground and held faces); the solver's tunables, and the live
    loop's (``control``), for a live panel when ``solver`` is given."""
    from tisim.render.base import ViewInfo

    tunables = list(solver.tunables()) if solver is not None else []
    if control is not None:
        tunables += control.tunables(tunables)

    info = ViewInfo(
        title=f"tisim - {scene.name}",
        faces=model.surface,
        vertex_count=model.vertex_count,
        object_vertex_ranges=model.object_vertex_slices if len(model.object_names) > 1 else None,
        colliders=[c for c in model.colliders if c.visible],
        camera=scene.camera,
        render=scene.render,
        tunables=tunables,
    )
    info.face_colors = cloth_colors(info, model)
    from tisim.render.base import drawn_ground

    info.ground = drawn_ground(model.initial_positions, info.colliders, model.gravity)
    held = [h.vertices for h in getattr(model, "handles", ())]
    info.held_vertices = np.unique(np.concatenate(held)).astype(np.int64) if held else None
    return info
