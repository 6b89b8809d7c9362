"""The progressive refiner: the preview (level 0) and the finer levels that follow it,
each stepped by its own cloth solver (see the package's docstring).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tisim import backend
from tisim.config import ConfigError
from tisim.geometry.mesh import MeshError
from tisim.outputs import read_json
from tisim.outputs import write_json as _write_json
from tisim.progressive.checkpoints import Checkpoints, _read_rows, _Trajectory
from tisim.progressive.levels import LevelState, build_levels, cloth_part_for_level, level_mesh
from tisim.progressive.pipeline import _bar, _merge, pipeline_groups, run_pipelined
from tisim.progressive.report import write_consistency
from tisim.progressive.shell import ProlongedShell


@dataclass
class RefineResult:
    out_dir: Path
    ended: str
    frames: int
    level_seconds: list[float]
    info: dict = field(default_factory=dict)
    message: str = ""
    nothing_to_do: bool = False  # a --resume of a refine that had finished

    @property
    def exit_code(self) -> int:
        from tisim.outputs import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK

        return {"diverged": EXIT_DIVERGED, "interrupted": EXIT_INTERRUPTED}.get(self.ended, EXIT_OK)


class ProgressiveRefiner(Checkpoints):
    """Runs the preview (level 0) and refines it level by level.

    Each level writes ``level_K/`` (stats.csv, meshes/NAME_NNNNN.obj, checkpoints/,
    frames and an MP4 when rendering); the refiner writes consistency.csv,
    consistency.png, run.json and, when rendering, a side-by-side MP4 of all levels.
    """

    def __init__(
        self,
        scene,
        out_dir,
        *,
        levels: int | None = None,
        arch: str = "auto",
        precision: str | None = None,
        render: bool = False,
        progress: bool = True,
        export_meshes: bool = True,
        on_level_done=None,
    ):
        from tisim import backend
        from tisim.model import Model

        self.scene = scene
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        from tisim.runner import scene_precision, scene_threads

        self.binfo = backend.init(arch, scene_precision(scene, precision), threads=scene_threads(scene))
        self.model = Model.from_scene(scene)
        if self.model.cloth is None:
            raise ConfigError("objects", "tisim refine needs a cloth object (kind = 'cloth')", scene.path)
        t_ = time.perf_counter()
        self.hierarchy, self.oc, self.name = build_levels(scene, self.model, levels)
        self.hierarchy_s = time.perf_counter() - t_
        self.L = self.hierarchy.level_count - 1
        self.render = render
        self.progress = progress
        self.export_meshes = export_meshes
        self.pipeline_cores = None  # the pipelined schedule's cores (None: this machine's)
        self.on_level_done = on_level_done
        self.h = scene.sim.dt
        self.substeps = scene.sim.substeps
        self._fine_term = None
        self._solvers: dict[int, object] = {}
        self._meshes: dict[int, object] = {}
        self._earlier_levels: dict[int, dict] = {}  # a resumed refine's run.json entries, by level

    # ------------------------------------------------------------------ set-up
    def level_dir(self, level: int) -> Path:
        return self.out / f"level_{level}"

    def fine_term(self):
        if self._fine_term is None:
            from tisim.solvers.cloth.solver import ShellTerm

            cp = cloth_part_for_level(self.hierarchy.finest, self.oc)
            self._fine_term = ShellTerm(
                cp.vertex_count,
                cp.faces,
                cp.hinges,
                cp.rest,
                cp.face_mu,
                cp.face_lam,
                cp.face_thickness,
                cp.hinge_k,
                bending=self.scene.solver.bending,
                lumped_bending=self.scene.solver.bending_hessian == "lumped",
            )
        return self._fine_term

    def solver(self, level: int, *, direct: bool = False):
        """The cloth solver of ``level``; ``direct`` gives the plain solver of that mesh
        (its own shell energy: a direct simulation, for comparisons)."""
        key = (level, direct)
        if key in self._solvers:
            return self._solvers[key]
        from tisim.solvers.cloth.solver import SolverCloth

        lv = self.hierarchy.levels[level]
        cp = cloth_part_for_level(lv, self.oc)
        if direct:
            elastic = None  # the mesh's own shell energy
        elif level == self.L:
            elastic = self.fine_term()
        else:
            elastic = ProlongedShell(self.fine_term(), self.hierarchy.to_finest(level))
        s = SolverCloth(self.model, self.scene.solver, cloth=cp, elastic=elastic)
        if isinstance(elastic, ProlongedShell):
            s.hessian_reuse = int(self.scene.refine.hessian_reuse)
        made_here = level < self.L and self.hierarchy.method == "decimate"
        try:
            # every level's start must be valid for the barrier, coarse ones made here too
            s.check_start(
                self.initial_state(level).x,
                s.obstacles.positions(0.0, self.model.initial_positions),
                advice="give the preview more vertices (refine.coarse_vertices)" if made_here else "separate them",
            )
        except MeshError as err:
            raise MeshError(
                f"hierarchy level {level} of {self.L} ({lv.vertex_count} vertices, "
                f"{self.hierarchy.method}): {err.detail}",
                err.path,
            ) from None
        self._solvers[key] = s
        return s

    def handles(self, level: int):
        from tisim.geometry.cloth import ClothMesh
        from tisim.model import cloth_handles

        lv = self.hierarchy.levels[level]
        return cloth_handles(self.name, self.oc, lv.vertices, ClothMesh(lv.vertices, lv.faces), 0)

    def initial_state(self, level: int) -> LevelState:
        """x^0_l: the level's rest shape (= P(x^0_{l-1}), the preview starting at rest);
        v^0_l = U v^0_{l-1} (notes §3 B.1), so every level starts with the preview's
        momentum (m_l^T U = m_{l-1}^T with consistent masses). Evaluating the object's
        initial velocity on each level instead spins each one about its own vertex mean,
        which differs from the mass-weighted centre and breaks §5.3 from the first step."""
        from tisim.model import _initial_velocity

        x0 = self.hierarchy.levels[0].vertices
        v = _initial_velocity(x0, self.oc, None)
        for P in self.hierarchy.prolongations[:level]:
            v = P.velocity(v)
        return LevelState(x=self.hierarchy.levels[level].vertices.copy(), v=np.ascontiguousarray(v))

    # ------------------------------------------------------------------ stepping
    def step_level(
        self, level: int, st: LevelState, x_hat: np.ndarray, tolerance: float | None, solver=None, handles=None
    ):
        """One implicit step of ``level`` from ``st`` towards ``x_hat``; returns the new
        LevelState and the solver's StepResult."""
        s = solver if solver is not None else self.solver(level)
        h = self.h
        t1 = st.t + h
        if st.kappa > 0:  # a resumed level continues with the stiffness it had reached
            s.kappa = st.kappa
            s.kappa_max = st.kappa_max
        obs_start = st.obstacles
        if obs_start is None or len(obs_start) != s.no:
            # (a checkpoint of an older tisim may hold another obstacle representation, e.g.
            # a tessellated sphere; the colliders' positions at st.t are the same obstacles)
            obs_start = s.obstacles.positions(st.t, None)
        obs_target = s.obstacles.positions(t1, None)
        lv_mass = s.cloth_mass
        f_ext = lv_mass[:, None] * s.gravity + s.wind.forces(st.t, st.x, st.v, s.cloth.faces)
        hs = handles if handles is not None else self.handles(level)
        active = [hd for hd in hs if hd.active(t1)]
        if active:
            idx = np.concatenate([hd.vertices for hd in active]).astype(np.int64)
            tgt = np.concatenate([hd.targets(t1) for hd in active])
        else:
            idx, tgt = np.zeros(0, np.int64), np.zeros((0, 3))
        res = s.solve(
            st.x, x_hat, h, f_ext=f_ext, obstacles=(obs_start, obs_target), held=(idx, tgt), tolerance=tolerance
        )
        new = LevelState(
            x=res.x,
            v=(res.x - st.x) / h,
            t=t1,
            kappa=s.kappa,
            kappa_max=s.kappa_max,
            obstacles=s._last_obstacles.copy(),
        )
        return new, res

    def inertial_target(self, P, xl: np.ndarray, xl_prev: np.ndarray, x: np.ndarray) -> np.ndarray:
        """x_hat^t_{l+1} from the level below's x^t_l, x^{t-1}_l and this level's x^t.

        ``refine.position_gain`` g = 1: the notes' P(x^t_l) + U (x^t_l - x^{t-1}_l),
        which re-prolongs the position every step, so this level's own detail survives
        only through one implicit step. g < 1 prolongs position and velocity separately
        (the addendum's follow-up): x^t + U (x^t_l - x^{t-1}_l) + g (P(x^t_l) - x^t),
        the velocity from the level below and the position pulled towards the prolonged
        one by g per step. With consistent masses (m^T U = m_l^T, m^T a = 0) the target's
        centre of mass is 2 c^t_l - c^{t-1}_l + (1 - g)(c^t - c^t_l), so §5.3 still holds
        for any g once c^t = c^t_l."""
        g = self.scene.refine.position_gain
        if g >= 1.0:
            return P.apply(xl) + P.U @ (xl - xl_prev)
        return x + P.U @ (xl - xl_prev) + g * (P.apply(xl) - x)

    def tolerance(self, level: int) -> float | None:
        return None if level == self.L else self.scene.refine.intermediate_tolerance

    # ------------------------------------------------------------------ one level
    def run_level(self, level: int, frames: int, *, resume: bool = False, bar=None) -> dict:
        """Simulate ``level`` for ``frames`` frames (level 0: the preview; others driven
        by the level below's checkpoints). Returns per-level timing info."""
        frames_done = self.level_frames(level, frames, resume=resume, bar=bar)
        while True:
            try:
                next(frames_done)
            except StopIteration as end:
                return end.value

    def level_frames(self, level: int, frames: int, *, resume: bool = False, bar=None):
        """:meth:`run_level` one frame at a time: a generator that yields the frame number
        after each frame's checkpoint is written and returns the timing info (so that
        levels can be interleaved in one process)."""
        from tisim.outputs import StatsWriter

        d = self.level_dir(level)
        d.mkdir(parents=True, exist_ok=True)
        if self.export_meshes:
            (d / "meshes").mkdir(exist_ok=True)
        h, sub = self.h, self.substeps
        solver = self.solver(level)
        handles = self.handles(level)
        tol = self.tolerance(level)
        start = self.last_checkpoint(level) if resume else -1
        stats = StatsWriter(d / "stats.csv")
        if start > 0:
            st, now = self.load_checkpoint(level, start)
            if len(now) >= 2:  # substeps: the state one step before st is in the same frame
                x_prev = now[-2]
            else:
                _, before = self.load_checkpoint(level, start - 1)
                x_prev = before[-1] if len(before) else st.x - h * st.v
            for row in _read_rows(d / "stats.csv", start):
                stats.write(row)
        else:
            start = 0
            st = self.initial_state(level)
            x_prev = st.x - h * st.v
            self.save_checkpoint(level, 0, st, [st.x.copy()])
            stats.write(self._row(level, 0, st, None, 0.0, None))
            self._export(level, 0, st.x)
        below = _Trajectory(self, level - 1) if level > 0 else None
        P = self.hierarchy.prolongations[level - 1] if level > 0 else None
        wall = []
        if bar is not None:
            for _ in range(start):  # the frames a resume keeps count as done
                bar()
        try:
            for frame in range(start, frames):
                t0 = time.perf_counter()
                steps, agg, second = [], None, 0.0
                for k in range(sub):
                    t = frame * sub + k
                    if below is None:
                        x_hat = st.x + h * st.v
                    else:  # the progressive IP's inertial target, from the level below
                        xl, xl_prev = below.at(t), below.at(t - 1)
                        x_hat = self.inertial_target(P, xl, xl_prev, st.x)
                    new, res = self.step_level(level, st, x_hat, tol, solver=solver, handles=handles)
                    if not np.all(np.isfinite(new.x)):
                        raise FloatingPointError(f"level {level} diverged at frame {frame + 1}")
                    second = max(second, float(np.abs(new.x - 2 * st.x + x_prev).max()))
                    x_prev, st = st.x, new
                    steps.append(st.x.copy())
                    agg = res if agg is None else _merge(agg, res)
                ms = (time.perf_counter() - t0) * 1e3
                wall.append(ms)
                stats.write(self._row(level, frame + 1, st, agg, ms, second))
                self._export(level, frame + 1, st.x)
                # the checkpoint last: it marks the frame done (resume, the next level)
                self.save_checkpoint(level, frame + 1, st, steps)
                if bar is not None:
                    bar()
                yield frame + 1
        finally:
            stats.close()
        # first_frame_s: in a fresh process it includes loading every kernel (Taichi's
        # Python front end and its offline cache), several seconds on two cores
        return {
            "frames": frames - start,
            "median_ms": float(np.median(wall)) if wall else math.nan,
            "mean_ms": float(np.mean(wall)) if wall else math.nan,
            "total_s": float(np.sum(wall) / 1e3),
            "first_frame_s": float(wall[0] / 1e3) if wall else math.nan,
        }

    def _row(self, level, frame, st: LevelState, res, ms, second) -> dict:
        s = self.solver(level)
        m = s.cloth_mass
        p = (m[:, None] * st.v).sum(axis=0)
        L = (m[:, None] * np.cross(st.x, st.v)).sum(axis=0)
        com = (m[:, None] * st.x).sum(axis=0) / m.sum()
        ke = 0.5 * float((m * (st.v**2).sum(axis=1)).sum())
        pot = s.potential_energy(st.x)
        row = {
            "frame": frame,
            "time": st.t,
            "wall_ms": ms,
            "kinetic": ke,
            "potential": pot,
            "total_energy": ke + pot,
            "px": p[0],
            "py": p[1],
            "pz": p[2],
            "lx": L[0],
            "ly": L[1],
            "lz": L[2],
            "com_x": com[0],
            "com_y": com[1],
            "com_z": com[2],
            "vcom_x": p[0] / m.sum(),
            "vcom_y": p[1] / m.sum(),
            "vcom_z": p[2] / m.sum(),
            "min_volume_ratio": math.nan,
            "iterations": res.iterations if res else 0,
            "residual": res.residual if res else math.nan,
            "n_contacts": res.n_contacts if res else 0,
            "max_penetration": 0.0 if res else math.nan,
            "converged": res.converged if res else True,
            "newton_iterations": res.iterations if res else 0,
            "min_distance": res.min_distance if res else math.nan,
            "ccd_clamps": res.ccd_clamps if res else 0,
            "max_strain": res.max_strain if res else math.nan,
            "second_difference": second if second is not None else math.nan,
        }
        return row

    def _export(self, level: int, frame: int, x: np.ndarray) -> None:
        if not self.export_meshes:
            return
        from tisim.geometry.cloth import save_cloth_obj

        mesh = self._meshes.get(level)
        if mesh is None:  # one per level: it caches its UV and face lines
            mesh = self._meshes[level] = level_mesh(self.hierarchy.levels[level])
        save_cloth_obj(self.level_dir(level) / "meshes" / f"{self.name}_{frame:05d}.obj", x, mesh)

    # ------------------------------------------------------------------ whole refine
    def _record_level(self, level: int, li: dict, seconds: float, info: dict, announce, **extra) -> None:
        """Add a finished level's entry (its level.json data, wall time, size and ``extra``)
        to run.json's levels and announce it."""
        li.update(level=level, seconds=seconds, **extra)
        li.update(vertices=self.hierarchy.levels[level].vertex_count, faces=self.hierarchy.levels[level].face_count)
        li = self._level_entry(level, li)
        info["levels"].append(li)
        if announce is not None:
            announce(level, self.level_dir(level), li)

    def _run_info(self, schedule: str) -> dict:
        """run.json's settings: the scene, the hierarchy, the backend, threads and loops,
        machine and versions."""
        info = {
            "scene": self.scene.to_dict(),
            "scene_file": self.scene.path,
            "levels": [],
            "schedule": schedule,
            "hierarchy_s": self.hierarchy_s,
            "hierarchy": {
                "method": self.hierarchy.method,
                "mass": self.hierarchy.mass,
                "vertices": [lv.vertex_count for lv in self.hierarchy.levels],
                "faces": [lv.face_count for lv in self.hierarchy.levels],
            },
            "arch": self.binfo.arch,
            "precision": self.binfo.precision,
            # "1": single-threaded Taichi, so a rerun or --resume is bit-identical
            "cpu_threads": os.environ.get("TI_CPU_MAX_NUM_THREADS"),
            # kernel loops compiled serial (backend.SERIAL_LOOPS): a --resume compiles them
            # the same way, for the same bits
            "serial_loops": backend.SERIAL_LOOPS,
        }
        from tisim.outputs import machine, versions

        info["machine"] = machine()
        info["versions"] = versions()
        return info

    def run(
        self, frames: int, *, resume: bool = False, direct: bool = False, schedule: str | None = None, announce=None
    ) -> RefineResult:
        """Preview first, then every finer level; consistency, plot, run.json."""
        schedule = schedule or self.scene.refine.schedule
        info = self._run_info(schedule)
        seconds = []
        ended, message = "completed", ""
        pipelined = schedule == "pipelined" and self.L > 0
        # every level this process steps checks its start (SolverCloth.check_start) before
        # anything of an earlier refine is removed or its run.json rewritten: a refine
        # refused in one line leaves the folder as it was (it emptied the levels' frames,
        # meshes and checkpoints first). A finer level of the pipelined schedule checks in
        # its own process.
        for level in pipeline_groups(self.L + 1, self.pipeline_cores)[0] if pipelined else range(self.L + 1):
            self.solver(level)
        if resume:
            previous = read_json(self.out / "run.json") or {}
            if previous.get("ended") == "completed" and (not direct or "direct" in previous):
                self._check_resumable()
                if all(self.last_checkpoint(level) >= frames for level in range(self.L + 1)):
                    # nothing to step: the finished refine's folder, its run.json's timings
                    # included, stays as it is
                    message = f"nothing to resume: every level already has its {frames} frames"
                    return RefineResult(self.out, "completed", frames, [], previous, message, nothing_to_do=True)
        # a resume keeps the timings of the levels it does not step (read before run.json is rewritten)
        earlier = read_json(self.out / "run.json") if resume else None
        self._earlier_levels = {
            e["level"]: e
            for e in (earlier or {}).get("levels") or []
            if isinstance(e, dict) and isinstance(e.get("level"), int)
        }
        info["resumed_from"] = self.prepare_outputs(resume)
        # written now and again at the end: a refine killed on the way leaves its settings
        # for --resume
        _write_json(
            self.out / "run.json", {**info, "levels": self._with_earlier([]), "ended": "running", "message": ""}
        )
        try:
            if schedule == "pipelined" and self.L > 0:
                seconds = self._run_pipelined(frames, resume, info, announce)
            else:
                for level in range(self.L + 1):
                    t0 = time.perf_counter()
                    bar = _bar(self.progress, frames, f"level {level}")
                    try:
                        li = self.run_level(level, frames, resume=resume, bar=bar.advance if bar else None)
                    finally:
                        if bar:
                            bar.stop()
                    seconds.append(time.perf_counter() - t0)
                    self._record_level(level, li, seconds[-1], info, announce)
        except KeyboardInterrupt:
            ended, message = "interrupted", "interrupted: rerun with --resume to continue"
        except FloatingPointError as e:
            ended, message = "diverged", str(e)
        if ended == "completed":
            info["consistency"] = write_consistency(self.out, self.L, self.hierarchy.finest.diagonal)
            if direct:
                info["direct"] = dr = self.run_direct(frames)
                prev = info["levels"][0].get("median_ms") if info["levels"] else None
                fine = info["levels"][-1].get("median_ms") if info["levels"] else None
                if prev:
                    dr["preview_speedup_vs_direct_fine"] = dr[f"level_{self.L}_median_ms"] / prev
                    dr["preview_cost_vs_direct_coarse"] = prev / dr["level_0_median_ms"]
                if fine:
                    dr["finest_cost_vs_direct_fine"] = fine / dr[f"level_{self.L}_median_ms"]
        info.update(levels=self._with_earlier(info["levels"]), ended=ended, message=message)
        _write_json(self.out / "run.json", info)
        return RefineResult(self.out, ended, frames, seconds, info, message)

    def _run_pipelined(self, frames, resume, info, announce):
        """The pipelined schedule (:func:`tisim.progressive.pipeline.run_pipelined`)."""
        return run_pipelined(self, frames, resume, info, announce)

    def run_direct(self, frames: int, levels=None) -> dict:
        """Direct (plain) simulations of the coarsest and finest meshes, for the speed-up
        of the preview and the consistency of plain simulations across resolutions
        (``levels``: a subset of them, timings only)."""
        out = {}
        traj = {}
        for level in sorted({0, self.L} if levels is None else set(levels)):
            s = self.solver(level, direct=True)
            hs = self.handles(level)
            st = self.initial_state(level)
            coms, ms = [], []
            m = s.cloth_mass
            coms.append((m[:, None] * st.x).sum(0) / m.sum())
            for _ in range(frames):
                t0 = time.perf_counter()
                for _ in range(self.substeps):
                    st, _ = self.step_level(level, st, st.x + self.h * st.v, None, solver=s, handles=hs)
                ms.append((time.perf_counter() - t0) * 1e3)
                coms.append((m[:, None] * st.x).sum(0) / m.sum())
            traj[level] = np.asarray(coms)
            out[f"level_{level}_median_ms"] = float(np.median(ms))
            out[f"level_{level}_mean_ms"] = float(np.mean(ms))
        if not {0, self.L} <= traj.keys():
            return out
        diag = self.hierarchy.finest.diagonal
        d = np.linalg.norm(traj[0] - traj[self.L], axis=1)
        out["direct_com_distance_max"] = float(d.max())
        out["direct_com_distance_max_rel"] = float(d.max() / diag)
        # the direct runs' centre-of-mass paths (frames 0..N, m), for comparing them with the
        # preview's (level_0/stats.csv): docs/teaching.md's locking exercise
        out["com"] = {f"level_{k}": v.tolist() for k, v in traj.items()}
        return out
