"""Progressive dynamics: a coarse cloth preview refined level by level into finer
meshes that follow the same motion (``tisim refine``).

The driver is built on the cloth solver (:class:`~tisim.solvers.cloth.solver.SolverCloth`):
each level has its own solver (its own mesh, contact, strain limit), with

* the elastic term replaced by the finest level's shell energy evaluated through the
  direct prolongation, Psi_L(P_l(x)) (the "prolongation IP" of the notes, which cures
  membrane locking of the coarse mesh), and
* for levels above the preview, the inertial target taken from the level below:
  x_hat^t_{l+1} = P(x^t_l) + U (x^t_l - x^{t-1}_l) (the "progressive IP").

References:
    Zhang, Li, Kaufman, Jiang, "Progressive Dynamics for Cloth and Shell Animation",
    SIGGRAPH 2024 (notes: ../shared/papers/progressive-dynamics.md, sections 2-5, 7).

Limitations:
    One cloth object; obstacles are the scene's colliders (no soft bodies). The
    pipelined schedule (``pipeline_groups``) gives the finest levels a process each, as
    many as the cores allow, and interleaves the coarser ones in the refine's process,
    fed through the per-frame checkpoints. Each process pays Taichi's start-up (the
    Python front end of every kernel, seconds), and every level below the finest
    evaluates the finest level's shell energy through the prolongation, so the levels'
    CPU time adds up to about twice the finest level's alone (benchmarks/bench_refine.py
    --schedule-compare measures the schedules).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from tisim import backend
from tisim.config import ConfigError
from tisim.geometry.mesh import MeshError
from tisim.outputs import progress
from tisim.outputs import read_json  # noqa: F401  (re-exported: the CLI reads run.json through it)
from tisim.outputs import write_json as _write_json

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# the prolonged elastic term


class ProlongedShell:
    """Psi_L(P_l(x)): the finest level's shell energy at a level's prolonged positions.

    Offsets a(x) are frozen at the Newton iterate where the gradient and Hessian were
    last evaluated (notes §2.4: keeps the energy consistent with its gradient inside a
    line search); gradient U^T grad Psi_L, Hessian U^T H_L U (PSD since H_L is).
    """

    def __init__(self, fine, P):
        self.fine = fine
        self.P = P
        self._a: np.ndarray | None = None
        self.n = P.coarse_count
        self._restrict = None  # (H's indptr, indices, apply, C's indptr, indices): see _restriction_map
        self._last = None  # the last full evaluation and its offsets (see ShellTerm.evaluate)

    def restrict_hessian(self, Hf: sp.csr_matrix) -> sp.csr_matrix:
        """U3^T Hf U3. The fine Hessian's pattern is fixed (the assembler's), so the
        product is linear in Hf.data, through maps built once (each fine entry
        (3i+a, 3j+b) adds U[i, I] U[j, J] to (3I+a, 3J+b)): two sparse mat-vecs instead
        of two sparse-sparse products with their symbolic passes."""
        r = self._restrict
        if r is None or not (r[0] is Hf.indptr or np.array_equal(r[0], Hf.indptr)) or not (
                r[1] is Hf.indices or np.array_equal(r[1], Hf.indices)):
            r = self._restrict = _restriction_map(Hf, self.P.U)
        apply, indptr, indices = r[2], r[3], r[4]
        nc = 3 * self.n
        return sp.csr_matrix((apply(Hf.data), indices, indptr), shape=(nc, nc))

    def _prolong(self, x: np.ndarray, refresh: bool) -> np.ndarray:
        if refresh or self._a is None:
            self._a = self.P.offsets(x)
        return self.P.U @ x + self._a

    def exact_energy(self, x: np.ndarray) -> float:
        return float(self.fine.evaluate(self.P.apply(x), energy_only=True, folded=False)[0])

    def evaluate(self, x: np.ndarray, hessian: bool = True, energy_only: bool = False):
        if energy_only:
            return self.fine.evaluate(self._prolong(x, False), energy_only=True, folded=False)[0], None, None
        last = self._last
        if last is not None and np.array_equal(last[0], x):
            # the same iterate as the last full evaluation: its offsets, energy and
            # derivatives, without prolonging, evaluating and restricting again
            self._a = last[4]
            return last[1], last[2], (last[3] if hessian else None)
        y = self._prolong(x, True)
        E, gf, Hf = self.fine.evaluate(y, hessian=hessian, folded=False)
        g = self.P.U.T @ gf
        if not hessian:
            return E, g, None
        H = self.restrict_hessian(Hf)
        from tisim.solvers.cloth.solver import remember

        self._last = remember(x, E, g, H, self._a)
        return E, g, H


def _times_u3(rows: np.ndarray, cols: np.ndarray, U: sp.csr_matrix):
    """The pattern of X U3 for X with entries at (rows, cols), and M with
    (X U3).data = M @ X.data (in the order of the given entries); the result's entries
    sorted row-major. Entry (r, 3j + b) of X adds U[j, J] X[r, 3j + b] to (r, 3J + b)."""
    nc3 = 3 * U.shape[1]
    cnt = np.diff(U.indptr).astype(np.int64)
    v = cols // 3
    reps = cnt[v]
    k = np.repeat(np.arange(len(cols), dtype=np.int64), reps)
    pos = np.repeat(U.indptr[v].astype(np.int64) - np.cumsum(reps) + reps, reps) + np.arange(reps.sum())
    new_c = 3 * U.indices[pos].astype(np.int64) + cols[k] % 3
    key = rows[k] * nc3 + new_c
    uniq, slot = np.unique(key, return_inverse=True)
    M = sp.csr_matrix((U.data[pos], (slot, k)), shape=(len(uniq), len(cols)))
    return M, uniq // nc3, uniq % nc3


def _restriction_map(Hf: sp.csr_matrix, U: sp.csr_matrix):
    """(Hf.indptr, Hf.indices, apply, indptr, indices) with U3^T Hf U3 =
    CSR((apply(Hf.data), indices, indptr)) for every Hf of this pattern; U: (n_fine,
    n_coarse) weights.

    apply is two sparse maps, T = Hf U3 and then U3^T T: with a wide prolongation stencil
    (Loop's, ~8 coarse vertices per fine one) a single map from Hf to C would have
    ~64 entries per Hf entry, the two ~8 each."""
    Hf = sp.csr_matrix(Hf)
    U = sp.csr_matrix(U)
    nc3 = 3 * U.shape[1]
    rows = np.repeat(np.arange(Hf.shape[0], dtype=np.int64), np.diff(Hf.indptr))
    cols = Hf.indices.astype(np.int64)
    M1, tr, tc = _times_u3(rows, cols, U)  # T = Hf U3
    M2, cr, cc = _times_u3(tc, tr, U)  # T^T U3 = C^T: entries (column of C, row of C)
    order = np.lexsort((cr, cc))  # C's entries row-major
    M2 = M2[order]
    crow, ccol = cc[order], cr[order]
    indptr = np.zeros(nc3 + 1, dtype=np.int64)
    np.add.at(indptr, crow + 1, 1)

    def apply(data, M1=M1, M2=M2):
        return M2 @ (M1 @ data)

    return Hf.indptr, Hf.indices, apply, np.cumsum(indptr), ccol.astype(np.int32)


# --------------------------------------------------------------------------------------
# levels


@dataclass
class LevelState:
    """What one level carries from step to step."""

    x: np.ndarray  # (n, 3) positions, m
    v: np.ndarray  # (n, 3) velocities, m/s
    t: float = 0.0
    kappa: float = 0.0  # the solver's adaptive barrier stiffness after the step
    kappa_max: float = math.inf  # and its cap (set with kappa at the first contact)
    obstacles: np.ndarray | None = None


def cloth_part_for_level(level, oc, mesh=None):
    """A ClothPart (the cloth solver's input) for one hierarchy level, with the
    object's material."""
    from tisim.geometry.cloth import ClothMesh
    from tisim.model import ClothPart

    mesh = mesh if mesh is not None else ClothMesh(level.vertices, level.faces)
    m = len(mesh.faces)
    mu, lam = oc.lame_plane_stress
    h = mesh.hinges
    return ClothPart(
        offset=0,
        vertex_count=mesh.vertex_count,
        faces=mesh.faces.astype(np.int32),
        edges=mesh.edges.astype(np.int32),
        hinges=np.asarray(h, dtype=np.int32).reshape(-1, 4),
        rest=np.asarray(level.vertices, dtype=np.float64).copy(),
        face_mu=np.full(m, mu),
        face_lam=np.full(m, lam),
        face_thickness=np.full(m, oc.thickness),
        hinge_k=np.full(len(h), oc.plate_bending_stiffness),
        vertex_mu=np.full(mesh.vertex_count, np.nan if oc.friction is None else oc.friction),
        face_object=np.zeros(m, dtype=np.int64),
        mass=np.asarray(level.mass, dtype=np.float64),
        meshes=(("cloth", slice(0, mesh.vertex_count), mesh),),
    )


def level_mesh(level):
    """The ``ClothMesh`` a level's frames are written with, UVs included: per-corner UVs
    as they are, per-vertex ones (decimated levels) as corners naming their vertex's UV."""
    from tisim.geometry.cloth import ClothMesh

    if level.uv is None:
        return ClothMesh(level.vertices, level.faces)
    face_uv = level.faces if level.face_uv is None else level.face_uv
    return ClothMesh(level.vertices, level.faces, level.uv, face_uv)


def build_levels(scene, model, count: int | None = None):
    """The hierarchy for ``scene``'s cloth object: (Hierarchy, ObjectConfig, name)."""
    from tisim.geometry import hierarchy as hy
    from tisim.geometry.cloth import load_cloth_mesh
    from tisim.model import _transform

    rc = scene.refine
    cloths = {k: o for k, o in scene.objects.items() if o.kind == "cloth"}
    solids = [k for k, o in scene.objects.items() if o.kind != "cloth"]
    if solids:
        raise ConfigError(f"objects.{solids[0]}", "tisim refine takes cloth objects and colliders only", scene.path)
    if rc.object is not None:
        if rc.object not in cloths:
            raise ConfigError("refine.object", f"expected the name of a cloth object ({', '.join(cloths)})", scene.path)
        name = rc.object
    elif len(cloths) != 1:
        raise ConfigError("refine.object", f"the scene has {len(cloths)} cloth objects: name one", scene.path)
    else:
        name = next(iter(cloths))
    oc = cloths[name]
    levels = count if count is not None else rc.levels
    cp = model.cloth
    _, _, mesh = cp.meshes[0]
    rho = oc.density * oc.thickness
    method = rc.method
    if method == "auto":
        method = "loop" if oc.generator in ("cloth", "sphere") else "decimate"
    # the object's own masses (the plain cloth solver's), so a one-level refine is that
    # solver exactly and a mesh-file finest level keeps them
    base = hy.Level(np.asarray(cp.rest, dtype=np.float64), mesh.faces, np.asarray(cp.mass, dtype=np.float64),
                    mesh.uv, mesh.face_uv)
    try:
        if method in ("loop", "midpoint"):
            H = hy.build_hierarchy(base, levels, method=method, mass=rc.mass)
        elif method == "decimate":
            need = hy.decimation_minimum(levels, tuple(rc.coarse_vertices))
            if rc.method == "auto" and levels > 1 and base.vertex_count < need:
                # too coarse to decimate: refine upward, the mesh is the preview
                H = hy.build_hierarchy(base, levels, method="loop", mass=rc.mass)
                log.info("%s has %d vertices, too few to decimate into %d levels (%d needed): it is the "
                         "preview, and Loop subdivision makes the finer levels (%s vertices)",
                         oc.mesh, base.vertex_count, levels, need,
                         ", ".join(str(lv.vertex_count) for lv in H.levels[1:]))
            else:
                H = hy.build_hierarchy(base, levels, method="decimate", coarse_vertices=tuple(rc.coarse_vertices),
                                       mass=rc.mass)
        else:
            if len(rc.meshes) != levels - 1:
                raise ConfigError("refine.meshes", f"expected {levels - 1} coarser meshes for {levels} levels, "
                                  f"got {len(rc.meshes)}", scene.path)
            user = []
            for i, f in enumerate(rc.meshes):
                m = load_cloth_mesh(str(scene.mesh_file(f, f"refine.meshes[{i}]")))
                user.append(hy.Level.from_mesh(_transform(m.vertices, oc, scene), m.faces, rho, m.uv, m.face_uv))
            H = hy.from_meshes(user + [base], mass=rc.mass)
    except MeshError as e:
        raise MeshError(str(e).split(": ", 1)[-1] if scene.path and str(e).startswith(scene.path) else str(e),
                        scene.path) from None
    return H, oc, name


# --------------------------------------------------------------------------------------
# the driver


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


class ProgressiveRefiner:
    """Runs the preview (level 0) and refines it level by level.

    Each level writes ``level_K/`` (stats.csv, meshes/NAME_NNNNN.obj, checkpoints/,
    frames and an MP4 when rendering); the refiner writes consistency.csv,
    consistency.png, run.json and, when rendering, a side-by-side MP4 of all levels.
    """

    def __init__(self, scene, out_dir, *, levels: int | None = None, arch: str = "auto",
                 precision: str | None = None, render: bool = False, progress: bool = True,
                 export_meshes: bool = True, on_level_done=None):
        from tisim import backend
        from tisim.model import Model

        self.scene = scene
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        from tisim.runner import scene_precision

        self.binfo = backend.init(arch, scene_precision(scene, precision))
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
            self._fine_term = ShellTerm(cp.vertex_count, cp.faces, cp.hinges, cp.rest, cp.face_mu, cp.face_lam,
                                        cp.face_thickness, cp.hinge_k, bending=self.scene.solver.bending,
                                        lumped_bending=self.scene.solver.bending_hessian == "lumped")
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
            s.check_start(self.initial_state(level).x, s.obstacles.positions(0.0, self.model.initial_positions),
                          advice="give the preview more vertices (refine.coarse_vertices)" if made_here
                          else "separate them")
        except MeshError as err:
            raise MeshError(f"hierarchy level {level} of {self.L} ({lv.vertex_count} vertices, "
                            f"{self.hierarchy.method}): {err.detail}", err.path) from None
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
    def step_level(self, level: int, st: LevelState, x_hat: np.ndarray, tolerance: float | None,
                   solver=None, handles=None):
        """One implicit step of ``level`` from ``st`` towards ``x_hat``; returns the new
        LevelState and the solver's StepResult."""
        s = solver if solver is not None else self.solver(level)
        h = self.h
        t1 = st.t + h
        if st.kappa > 0:  # a resumed level continues with the stiffness it had reached
            s.kappa = st.kappa
            s.kappa_max = st.kappa_max
        obs_start = st.obstacles if st.obstacles is not None else s.obstacles.positions(st.t, None)
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
        res = s.solve(st.x, x_hat, h, f_ext=f_ext, obstacles=(obs_start, obs_target), held=(idx, tgt),
                      tolerance=tolerance)
        new = LevelState(x=res.x, v=(res.x - st.x) / h, t=t1, kappa=s.kappa, kappa_max=s.kappa_max,
                         obstacles=s._last_obstacles.copy())
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

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_path(self, level: int, frame: int) -> Path:
        return self.level_dir(level) / "checkpoints" / f"frame_{frame:05d}.npz"

    def save_checkpoint(self, level: int, frame: int, st: LevelState, steps: list[np.ndarray]) -> None:
        """Atomically write a finished frame: the level's state and the positions after
        each of the frame's steps (what the next level is driven by)."""
        p = self.checkpoint_path(level, frame)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.stem}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp.npz")
        np.savez(tmp, x=st.x, v=st.v, t=st.t, kappa=st.kappa, kappa_max=st.kappa_max,
                 obstacles=st.obstacles if st.obstacles is not None else np.zeros((0, 3)),
                 steps=np.stack(steps) if steps else np.zeros((0,) + st.x.shape))
        os.replace(tmp, p)

    def load_checkpoint(self, level: int, frame: int):
        with np.load(self.checkpoint_path(level, frame)) as d:
            st = LevelState(x=d["x"].copy(), v=d["v"].copy(), t=float(d["t"]), kappa=float(d["kappa"]),
                            kappa_max=float(d["kappa_max"]) if "kappa_max" in d else math.inf,
                            obstacles=d["obstacles"].copy() if len(d["obstacles"]) else None)
            return st, list(d["steps"])

    def last_checkpoint(self, level: int) -> int:
        """The last frame whose checkpoint is complete (-1: none)."""
        d = self.level_dir(level) / "checkpoints"
        if not d.is_dir():
            return -1
        frames = sorted(int(p.stem.split("_")[1]) for p in d.glob("frame_*.npz"))
        # frames are written in order; a gap means a later file is from an older run
        last = -1
        for f in frames:
            if f != last + 1:
                break
            last = f
        return last

    def prepare_outputs(self, resume: bool) -> list[int]:
        """Make the checkpoints on disk a consistent starting point before any level
        runs: without ``resume`` every level's old checkpoints go (a pipelined level
        would otherwise read the level below's frames from an earlier run); with it,
        each level keeps its frames up to the last one that the level below also
        has (a level cannot be ahead of the one driving it) and drops the rest.
        Returns the frame each level resumes from (-1: from the start). A resume of a
        refine made with other levels, another mesh or other scene values is refused
        (ConfigError): its frames would be mixed with this one's."""
        if resume:
            self._check_resumable()
        starts = []
        for level in range(self.L + 1):
            if not resume:  # an earlier, longer refine's pictures and meshes would stay
                from tisim.outputs import clear_earlier_frames

                clear_earlier_frames(self.level_dir(level))
            last = self.last_checkpoint(level) if resume else -1
            if level > 0:
                last = min(last, starts[-1])
            d = self.level_dir(level) / "checkpoints"
            if d.is_dir():
                for p in d.glob("frame_*.npz"):
                    if int(p.stem.split("_")[1]) > last:
                        p.unlink()
            (self.level_dir(level) / "level.json").unlink(missing_ok=True)
            starts.append(last)
        return starts

    def _check_resumable(self) -> None:
        """ConfigError unless the refine in ``self.out`` is this one: the same number of
        levels, vertices per level and scene values (its run.json, written when it
        started; colliders included), and checkpoints of this refine's sizes. The frame
        count, rendering and camera may change. (It builds no solver: building a finer
        level's solver before a coarser level steps changed that level's last bits.)"""
        again = "; rerun without --resume, or into another --out"
        prev = read_json(self.out / "run.json")
        if prev is not None:
            vertices = [lv.vertex_count for lv in self.hierarchy.levels]
            had = (prev.get("hierarchy") or {}).get("vertices")
            if had is not None and list(had) != vertices:
                raise ConfigError("", f"cannot resume: the refine there has {len(had)} levels of "
                                      f"{', '.join(map(str, had))} vertices, this one {len(vertices)} of "
                                      f"{', '.join(map(str, vertices))}{again}", str(self.out))
            if isinstance(prev.get("scene"), dict):
                key, was, now = _first_difference(prev["scene"], json.loads(json.dumps(self.scene.to_dict())),
                                                  ignore=_RESUME_MAY_CHANGE)
                if key is not None:
                    raise ConfigError("", f"cannot resume: {key} was {was!r} there and is {now!r} now{again}",
                                      str(self.out))
        for level in range(self.L + 1):
            last = self.last_checkpoint(level)
            if last < 0:
                continue
            with np.load(self.checkpoint_path(level, last)) as d:
                n = len(d["x"])
            want = self.hierarchy.levels[level].vertex_count
            if n != want:
                raise ConfigError("", f"cannot resume: level {level}'s checkpoints have {n} vertices, this refine's "
                                      f"level {level} has {want}{again}", str(self.out))

    def _level_entry(self, level: int, li: dict) -> dict:
        """``level``'s entry in run.json: ``li``, or the resumed refine's entry when this
        run had no frame of the level to step (its timings would be lost: frames 0)."""
        if li.get("frames", 0) <= 0 and level in self._earlier_levels:
            return self._earlier_levels[level]
        return li

    def _with_earlier(self, levels: list[dict]) -> list[dict]:
        """``levels`` and the resumed refine's entries of the levels not among them, by level."""
        have = {e["level"] for e in levels}
        return sorted(levels + [e for k, e in self._earlier_levels.items() if k not in have],
                      key=lambda e: e["level"])

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
        return {"frames": frames - start, "median_ms": float(np.median(wall)) if wall else math.nan,
                "mean_ms": float(np.mean(wall)) if wall else math.nan, "total_s": float(np.sum(wall) / 1e3),
                "first_frame_s": float(wall[0] / 1e3) if wall else math.nan}

    def _row(self, level, frame, st: LevelState, res, ms, second) -> dict:
        s = self.solver(level)
        m = s.cloth_mass
        p = (m[:, None] * st.v).sum(axis=0)
        L = (m[:, None] * np.cross(st.x, st.v)).sum(axis=0)
        com = (m[:, None] * st.x).sum(axis=0) / m.sum()
        ke = 0.5 * float((m * (st.v**2).sum(axis=1)).sum())
        pot = s.potential_energy(st.x)
        row = {"frame": frame, "time": st.t, "wall_ms": ms, "kinetic": ke, "potential": pot,
               "total_energy": ke + pot, "px": p[0], "py": p[1], "pz": p[2], "lx": L[0], "ly": L[1], "lz": L[2],
               "com_x": com[0], "com_y": com[1], "com_z": com[2], "vcom_x": p[0] / m.sum(),
               "vcom_y": p[1] / m.sum(), "vcom_z": p[2] / m.sum(), "min_volume_ratio": math.nan,
               "iterations": res.iterations if res else 0, "residual": res.residual if res else math.nan,
               "n_contacts": res.n_contacts if res else 0, "max_penetration": 0.0 if res else math.nan,
               "converged": res.converged if res else True,
               "newton_iterations": res.iterations if res else 0,
               "min_distance": res.min_distance if res else math.nan,
               "ccd_clamps": res.ccd_clamps if res else 0,
               "max_strain": res.max_strain if res else math.nan,
               "second_difference": second if second is not None else math.nan}
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
    def run(self, frames: int, *, resume: bool = False, direct: bool = False, schedule: str | None = None,
            announce=None) -> RefineResult:
        """Preview first, then every finer level; consistency, plot, run.json."""
        schedule = schedule or self.scene.refine.schedule
        info = {"scene": self.scene.to_dict(), "scene_file": self.scene.path, "levels": [],
                "schedule": schedule, "hierarchy_s": self.hierarchy_s,
                "hierarchy": {"method": self.hierarchy.method, "mass": self.hierarchy.mass,
                              "vertices": [lv.vertex_count for lv in self.hierarchy.levels],
                              "faces": [lv.face_count for lv in self.hierarchy.levels]},
                "arch": self.binfo.arch, "precision": self.binfo.precision,
                # "1": single-threaded Taichi, so a rerun or --resume is bit-identical
                "cpu_threads": os.environ.get("TI_CPU_MAX_NUM_THREADS"),
                # kernel loops compiled serial (backend.SERIAL_LOOPS): a --resume compiles them
                # the same way, for the same bits
                "serial_loops": backend.SERIAL_LOOPS}
        from tisim.outputs import machine, versions

        info["machine"] = machine()
        info["versions"] = versions()
        seconds = []
        ended, message = "completed", ""
        pipelined = schedule == "pipelined" and self.L > 0
        # every level this process steps checks its start (SolverCloth.check_start) before
        # anything of an earlier refine is removed or its run.json rewritten: a refine
        # refused in one line leaves the folder as it was (it emptied the levels' frames,
        # meshes and checkpoints first). A finer level of the pipelined schedule checks in
        # its own process.
        for level in (pipeline_groups(self.L + 1, self.pipeline_cores)[0] if pipelined else range(self.L + 1)):
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
        self._earlier_levels = {e["level"]: e for e in (earlier or {}).get("levels") or []
                                if isinstance(e, dict) and isinstance(e.get("level"), int)}
        info["resumed_from"] = self.prepare_outputs(resume)
        # written now and again at the end: a refine killed on the way leaves its settings
        # for --resume
        _write_json(self.out / "run.json", {**info, "levels": self._with_earlier([]), "ended": "running",
                                            "message": ""})
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
                    li.update(level=level, seconds=seconds[-1],
                              vertices=self.hierarchy.levels[level].vertex_count,
                              faces=self.hierarchy.levels[level].face_count)
                    li = self._level_entry(level, li)
                    info["levels"].append(li)
                    if announce is not None:
                        announce(level, self.level_dir(level), li)
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
        """The levels in ``pipeline_groups``: the coarser ones interleaved frame by frame
        in this process, each finer one in a process of its own, every level following
        the one below through the checkpoints; returns the wall time of each level (from
        the common start).

        Each worker process pays Taichi's start-up: the Python front end of every kernel
        runs again in each process (Taichi 1.7's offline cache, keyed on the front end's
        output, saves only the LLVM compilation; the solvers' kernels take ndarrays, so
        one cached kernel serves every mesh size). Workers get ``pipeline_threads`` Taichi
        (and BLAS) threads each unless the environment already sets them, so that the
        processes do not oversubscribe the cores."""
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        t0 = time.perf_counter()
        groups = pipeline_groups(self.L + 1, self.pipeline_cores)
        threads = pipeline_threads(len(groups), self.pipeline_cores)
        threads["TISIM_SERIAL_LOOPS"] = "1" if backend.SERIAL_LOOPS else "0"  # the loops as here
        procs = {}
        with _environment(threads):
            for (level,) in groups[1:]:
                (self.level_dir(level) / "worker_error.txt").unlink(missing_ok=True)
                pr = ctx.Process(target=_pipeline_worker,
                                 args=(self.scene, str(self.out), level, frames, resume, self.binfo.arch,
                                       self.binfo.precision, self.hierarchy.level_count, self.export_meshes,
                                       time.time()))
                pr.start()
                procs[level] = pr
        info["pipelined_threads"] = {k: os.environ.get(k, v) for k, v in threads.items()}
        info["pipelined_groups"] = groups
        done = {}
        try:
            c0 = _cpu_seconds()
            here = groups[0]
            name = f"level {here[0]}" if len(here) == 1 else f"levels {here[0]}-{here[-1]}"
            bar = _bar(self.progress, frames, name)
            running = {lv: self.level_frames(lv, frames, resume=resume,
                                             bar=bar.advance if bar and lv == here[-1] else None) for lv in here}
            try:
                while running:  # one frame of each level in turn, coarsest first
                    for lv in list(running):
                        try:
                            next(running[lv])
                        except StopIteration as end:
                            done[lv] = (end.value, time.perf_counter() - t0)
                            del running[lv]
            finally:
                for gen in running.values():
                    gen.close()
                if bar:
                    bar.stop()
            # cpu_s: this process's stepping of its levels together (its start-up is the refine's own)
            cpu = _cpu_seconds() - c0
            for lv in here:
                li, sec = done[lv]
                li.update(level=lv, seconds=sec, process_s=sec, cpu_s=cpu, levels_in_process=here,
                          vertices=self.hierarchy.levels[lv].vertex_count, faces=self.hierarchy.levels[lv].face_count)
                li = self._level_entry(lv, li)
                info["levels"].append(li)
                if announce is not None:
                    announce(lv, self.level_dir(lv), li)
            seconds = [done[lv][1] for lv in here]
            if procs:
                _load_plotting()  # while the finer levels step: the plot at the end is then quick
            for level, pr in procs.items():
                pr.join()
                seconds.append(time.perf_counter() - t0)
                if pr.exitcode != 0:
                    err = self.level_dir(level) / "worker_error.txt"
                    why = f": {err.read_text()}" if err.exists() else ""
                    raise FloatingPointError(f"level {level} failed in its process (exit code {pr.exitcode}){why}")
                li = json.loads((self.level_dir(level) / "level.json").read_text())
                li.update(level=level, seconds=seconds[-1], vertices=self.hierarchy.levels[level].vertex_count,
                          faces=self.hierarchy.levels[level].face_count)
                li = self._level_entry(level, li)
                info["levels"].append(li)
                if announce is not None:
                    announce(level, self.level_dir(level), li)
        finally:
            # a failed or interrupted level never writes the frames the levels above
            # wait for: stop them rather than leave them polling
            for pr in procs.values():
                if pr.is_alive():
                    pr.terminate()
                    pr.join()
        info["pipelined_wall_s"] = time.perf_counter() - t0
        return seconds

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


class _Trajectory:
    """Positions x^t of a finished (or, pipelined, advancing) level, read from its
    checkpoints: x^{-1} = x^0 - h v^0; x^t for t >= 1 is in frame ceil(t / substeps)."""

    def __init__(self, refiner: ProgressiveRefiner, level: int):
        self.r = refiner
        self.level = level
        self._cache: dict[int, tuple] = {}

    def _frame(self, f: int):
        if f not in self._cache:
            p = self.r.checkpoint_path(self.level, f)
            waited = 0.0
            while not p.exists():  # pipelined: the level below is still working on it
                time.sleep(0.02)
                waited += 0.02
                if waited > 3600:
                    raise RuntimeError(f"level {self.level} frame {f} never arrived")
            if len(self._cache) > 4:
                self._cache.pop(min(self._cache))
            self._cache[f] = self.r.load_checkpoint(self.level, f)
        return self._cache[f]

    def at(self, t: int) -> np.ndarray:
        sub = self.r.substeps
        if t <= 0:
            st, _ = self._frame(0)
            return st.x if t == 0 else st.x - self.r.h * st.v
        _, steps = self._frame((t - 1) // sub + 1)
        return steps[(t - 1) % sub]


# scene values a --resume may change: the frame count, what a divergence does, the
# pictures, the text, the schedule
_RESUME_MAY_CHANGE = ("sim.frames", "sim.on_divergence", "render", "camera", "scene", "refine.schedule")


def _first_difference(a, b, ignore=(), key=""):
    """(dotted key, value in a, value in b) of the first difference between two JSON-like
    values, skipping the keys in ``ignore`` and their children; (None, None, None) when
    equal."""
    if key in ignore:
        return None, None, None
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            sub = f"{key}.{k}" if key else str(k)
            if k not in a or k not in b:
                if sub in ignore:
                    continue
                return sub, a.get(k), b.get(k)
            found = _first_difference(a[k], b[k], ignore, sub)
            if found[0] is not None:
                return found
        return None, None, None
    if json.dumps(a) != json.dumps(b):
        return key, a, b
    return None, None, None


def _read_rows(path: Path, last_frame: int) -> list[dict]:
    """The rows of an earlier stats.csv up to ``last_frame`` (numbers parsed)."""
    import csv

    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if int(r["frame"]) > last_frame:
                break
            out.append({k: (float(v) if v not in ("", None) else math.nan) for k, v in r.items()})
            out[-1]["frame"] = int(out[-1]["frame"])
    return out


def pipeline_groups(levels: int, cores: int | None = None) -> list[list[int]]:
    """The pipelined schedule's processes as lists of levels, the refine's own process
    first: the finest levels a process each, as many as the cores allow beside the
    refine's, and every coarser level interleaved frame by frame in the refine's process
    (on 2 cores and 3 levels: [[0, 1], [2]]). A process per level on fewer cores would
    pay one more start-up and make the finest level, whose last frame ends the refine,
    share its core with the levels below until they finish, then step its backlog alone."""
    cores = max(1, cores or os.cpu_count() or 1)
    own = min(levels - 1, cores - 1)  # the finest levels with a process of their own
    first = levels - own
    return [list(range(first))] + [[lv] for lv in range(first, levels)]


def pipeline_threads(processes: int, cores: int | None = None) -> dict[str, str]:
    """Thread counts for each of ``processes`` concurrent level processes on ``cores``
    cores (default: this machine's): Taichi's CPU threads and the BLAS/OpenMP/MKL threads
    of the linear solvers, as environment variables, so that together they use each core
    about once. More threads than cores make every parallel kernel wait for its slowest
    thread whenever another process holds a core."""
    cores = cores or os.cpu_count() or 1
    n = str(max(1, cores // max(1, processes)))
    return {"TI_CPU_MAX_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}


class _environment:
    """Set the variables not already set, for the processes started inside; restore after."""

    def __init__(self, values: dict[str, str]):
        self.values = {k: v for k, v in values.items() if k not in os.environ}

    def __enter__(self):
        os.environ.update(self.values)
        return self

    def __exit__(self, *exc):
        for k in self.values:
            os.environ.pop(k, None)
        return False


def _load_plotting() -> None:
    """Import matplotlib (Agg) ahead of ``write_consistency``'s plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError:
        pass


def _pipeline_worker(scene, out, level, frames, resume, arch, precision, count, export, spawned):
    """One level of the pipelined schedule in its own process. Its level.json records
    ``startup_s`` (from the spawn until ready to step: interpreter, imports, Taichi, the
    levels and the solver; the kernels load at the first step, inside the first frame),
    ``process_s`` (spawn to end) and ``cpu_s`` (the process's CPU time, all threads)."""
    try:
        r = ProgressiveRefiner(scene, out, levels=count, arch=arch, precision=precision, progress=False,
                               export_meshes=export)
        r.solver(level)
        ready = time.time() - spawned
        li = r.run_level(level, frames, resume=resume)
    except BaseException as e:  # noqa: BLE001  (the refine's process reports it, in one line)
        err = Path(out) / f"level_{level}" / "worker_error.txt"
        err.parent.mkdir(parents=True, exist_ok=True)
        err.write_text(f"{type(e).__name__}: {e}")
        raise SystemExit(1) from None
    li.update(startup_s=ready, process_s=time.time() - spawned, cpu_s=_cpu_seconds(),
              threads=os.environ.get("TI_CPU_MAX_NUM_THREADS"))
    (r.level_dir(level) / "level.json").write_text(json.dumps(li))


def _cpu_seconds() -> float:
    """CPU time of this process so far (user + system, all threads), s."""
    try:
        import resource
    except ImportError:  # not POSIX
        return time.process_time()
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _merge(a, b):
    return dataclasses.replace(
        b, iterations=a.iterations + b.iterations, ccd_clamps=a.ccd_clamps + b.ccd_clamps,
        min_distance=min(a.min_distance, b.min_distance), max_strain=max(a.max_strain, b.max_strain),
        converged=a.converged and b.converged)


# --------------------------------------------------------------------------------------
# consistency


def write_consistency(out: Path, L: int, diagonal: float) -> dict:
    """consistency.csv (per frame: each level's centre-of-mass distance from the
    preview, relative to the finest mesh's bounding-box diagonal, and kinetic-energy
    difference) and consistency.png. Returns the maxima."""
    import csv

    cols = {}
    for level in range(L + 1):
        with open(out / f"level_{level}" / "stats.csv") as f:
            rows = list(csv.DictReader(f))
        cols[level] = {
            "com": np.array([[float(r["com_x"]), float(r["com_y"]), float(r["com_z"])] for r in rows]),
            "ke": np.array([float(r["kinetic"]) for r in rows]),
            "time": np.array([float(r["time"]) for r in rows]),
            "second": np.array([float(r["second_difference"] or "nan") for r in rows]),
        }
    n = min(len(c["ke"]) for c in cols.values())
    summary = {}
    with open(out / "consistency.csv", "w", newline="") as f:
        w = csv.writer(f)
        head = ["frame", "time"]
        for level in range(1, L + 1):
            head += [f"com_distance_{level}", f"com_distance_rel_{level}", f"kinetic_{level}",
                     f"kinetic_difference_{level}"]
        w.writerow(["frame", "time", "kinetic_0"] + head[2:])
        for i in range(n):
            row = [i, cols[0]["time"][i], cols[0]["ke"][i]]
            for level in range(1, L + 1):
                d = float(np.linalg.norm(cols[level]["com"][i] - cols[0]["com"][i]))
                row += [d, d / diagonal, cols[level]["ke"][i], cols[level]["ke"][i] - cols[0]["ke"][i]]
            w.writerow(row)
    for level in range(1, L + 1):
        d = np.linalg.norm(cols[level]["com"][:n] - cols[0]["com"][:n], axis=1)
        summary[f"level_{level}"] = {"com_distance_max": float(d.max()),
                                     "com_distance_max_rel": float(d.max() / diagonal),
                                     "kinetic_difference_max": float(np.abs(cols[level]["ke"][:n]
                                                                            - cols[0]["ke"][:n]).max())}
    summary["second_difference_max"] = {f"level_{k}": float(np.nanmax(c["second"])) if np.isfinite(
        c["second"]).any() else None for k, c in cols.items()}
    try:
        # a Figure of its own, not pyplot (which would switch a notebook's backend)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 3.6))
        FigureCanvasAgg(fig)
        ax = fig.subplots(1, 2)
        for level in range(L + 1):
            ax[1].plot(cols[level]["time"][:n], cols[level]["ke"][:n], label=f"level {level}")
            if level:
                d = np.linalg.norm(cols[level]["com"][:n] - cols[0]["com"][:n], axis=1) / diagonal
                ax[0].plot(cols[level]["time"][:n], 100 * d, label=f"level {level}")
        ax[0].set_xlabel("time (s)")
        # two lines: on one, the label was longer than the axis and cut at both ends
        ax[0].set_ylabel("centre-of-mass distance\nfrom preview (% of diagonal)")
        ax[1].set_xlabel("time (s)")
        ax[1].set_ylabel("kinetic energy (J)")
        for a in ax:
            if a.get_legend_handles_labels()[0]:
                a.legend()
            a.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "consistency.png", dpi=90)
    except Exception as e:  # the numbers are in the CSV either way
        log.warning("could not draw consistency.png: %s", e)
    return summary


def _bar(enabled, total, name):
    return progress(enabled, total, name)


# --------------------------------------------------------------------------------------
# a toss at a hole (the toss demo's hit-or-miss metric)


@dataclass(frozen=True)
class Hole:
    """A rectangular hole in a horizontal surface: ``lo``, ``hi`` (2,) m, its extent
    along the two horizontal axes (x, z); ``top`` m, the height of the surface (y up)."""

    lo: tuple[float, float]
    hi: tuple[float, float]
    top: float

    @classmethod
    def from_boxes(cls, scene, prefix: str = "rim_") -> Hole:
        """The hole framed by the scene's four axis-aligned box colliders named
        ``{prefix}near``/``far`` (smaller/larger x) and ``{prefix}left``/``right``
        (smaller/larger z), whose tops are level (the toss demo's table)."""
        need = [f"{prefix}{k}" for k in ("near", "far", "left", "right")]
        missing = [k for k in need if k not in scene.colliders or scene.colliders[k].type != "box"]
        if missing:
            raise ConfigError(f"colliders.{missing[0]}", "expected a box collider framing the hole", scene.path)
        c = {k[len(prefix):]: scene.colliders[k] for k in need}
        if any(any(abs(a) > 0 for a in b.rotation) for b in c.values()):
            raise ConfigError(f"colliders.{prefix}near", "the hole's boxes must not be rotated", scene.path)
        lo = (c["near"].position[0] + c["near"].half_extents[0], c["left"].position[2] + c["left"].half_extents[2])
        hi = (c["far"].position[0] - c["far"].half_extents[0], c["right"].position[2] - c["right"].half_extents[2])
        tops = [b.position[1] + b.half_extents[1] for b in c.values()]
        if not (lo[0] < hi[0] and lo[1] < hi[1]) or max(tops) - min(tops) > 1e-9:
            raise ConfigError(f"colliders.{prefix}near", "the four boxes do not frame a hole with a level top",
                              scene.path)
        return cls(lo=lo, hi=hi, top=tops[0])


def through_hole(com: np.ndarray, hole: Hole) -> int | None:
    """The first frame at which a toy's centre of mass ``com`` ((frames, 3) m) is
    below the surface's top inside the hole's footprint (the toy went in), or None (a
    miss: it stayed on the surface, or fell past its edge outside the hole)."""
    com = np.asarray(com, dtype=np.float64).reshape(-1, 3)
    inside = ((com[:, 0] >= hole.lo[0]) & (com[:, 0] <= hole.hi[0]) & (com[:, 2] >= hole.lo[1])
              & (com[:, 2] <= hole.hi[1]) & (com[:, 1] < hole.top))
    hit = np.flatnonzero(inside)
    return int(hit[0]) if hit.size else None


def level_com(out: Path, level: int) -> np.ndarray:
    """(frames + 1, 3): a finished level's centre of mass per frame, from its stats.csv."""
    import csv

    with open(Path(out) / f"level_{level}" / "stats.csv") as f:
        return np.array([[float(r["com_x"]), float(r["com_y"]), float(r["com_z"])] for r in csv.DictReader(f)])


# --------------------------------------------------------------------------------------
# rendering


def render_levels(refiner: ProgressiveRefiner, frames: int) -> dict:
    """PNG frames and an MP4 per level from its checkpoints, and a side-by-side MP4 of
    all levels (``levels.mp4``). Returns the paths written."""
    from tisim.render.base import ViewInfo, checker_colors
    from tisim.render.offscreen import OffscreenRenderer
    from tisim.render.video import FrameWriter

    scene = refiner.scene
    fps = scene.render.fps or 1.0 / (scene.sim.dt * scene.sim.substeps)
    out = {}
    images: dict[int, list[Path]] = {}
    for level in range(refiner.L + 1):
        lv = refiner.hierarchy.levels[level]
        d = refiner.level_dir(level)
        writer = FrameWriter(d, fps=fps, video_name=f"level_{level}.mp4")
        r = OffscreenRenderer(writer)
        r.open(ViewInfo(faces=lv.faces, vertex_count=lv.vertex_count,
                        colliders=[c for c in refiner.model.colliders if c.visible], camera=scene.camera,
                        render=scene.render, title=f"level {level}",
                        face_colors=checker_colors(lv.faces, lv.uv, lv.face_uv, scene.render.color)))
        for f in range(frames + 1):
            if not refiner.checkpoint_path(level, f).exists():
                break
            st, _ = refiner.load_checkpoint(level, f)
            r.draw(f, st.t, st.x)
        r.close()
        out[f"level_{level}"] = str(r.video_path) if r.video_path else None
        images[level] = sorted((d / "frames").glob("frame_*.png"))
    n = min(len(v) for v in images.values()) if images else 0
    if n:
        import imageio.v3 as iio

        from tisim.render.video import write_side_by_side

        levels = sorted(images)
        ms = level_timings(refiner)
        labels = []
        for k in levels:
            lv = refiner.hierarchy.levels[k]
            what = " (preview)" if k == 0 else (" (finest)" if k == refiner.L else "")
            head = [f"level {k}{what}", f"{lv.vertex_count} vertices",
                    f"{ms[k]:.0f} ms/frame" if math.isfinite(ms.get(k, math.nan)) else "ms/frame: n/a"]
            labels.append([[*head, f"t = {i * scene.sim.dt * scene.sim.substeps:.2f} s"] for i in range(n)])
        path = write_side_by_side([images[k][:n] for k in levels], labels, refiner.out / "side_by_side",
                                  fps=fps, video_name="levels.mp4")
        out["side_by_side"] = str(path) if path else None
    return out


def level_timings(refiner: ProgressiveRefiner) -> dict[int, float]:
    """{level: median wall-clock ms per frame} from each level's stats.csv (frames that
    stepped; NaN when there is none)."""
    import csv

    out = {}
    for level in range(refiner.L + 1):
        f = refiner.level_dir(level) / "stats.csv"
        ms = []
        if f.exists():
            with open(f, newline="") as fh:
                for row in csv.DictReader(fh):
                    v = row.get("wall_ms") or ""
                    if v and int(float(row.get("frame") or 0)) > 0:
                        ms.append(float(v))
        out[level] = float(np.median(ms)) if ms else math.nan
    return out


# --------------------------------------------------------------------------------------
# a scene around a user's cloth mesh


def scene_for_mesh(mesh_path: Path, *, drape_on: str = "sphere", pin: str | None = None,
                   wind: tuple[float, float, float] | None = None, frames: int = 100) -> str:
    """TOML text of a default scene for a cloth mesh file: the mesh centred and laid
    above a sphere, the ground or a box (or pinned and blown by wind). A mesh lying flat
    with ``pin = "top-edge"`` is stood up (rotated 90 degrees about x) so that it hangs
    from its top edge: lying flat, its whole border is its top edge."""
    from tisim.geometry.cloth import load_cloth_mesh
    from tisim.geometry.transforms import euler_xyz_deg

    m = load_cloth_mesh(str(mesh_path))
    x = m.vertices
    lo, hi = x.min(0), x.max(0)
    size = float(np.linalg.norm(hi - lo))
    if size > 100.0 or size < 0.01:
        # the scene is scaled to the mesh (the obstacles, the contact thickness): a cloth
        # modelled in millimetres becomes a sheet a kilometre wide
        log.warning("%s is %.3g m across (its coordinates are read as metres; the scene, its obstacles and "
                    "contact thickness are sized to it): if it is in other units, scale the mesh to metres "
                    "(e.g. by 0.001 from millimetres) and rerun", mesh_path.name, size)
    rotation = None
    if pin == "top-edge" and hi[1] - lo[1] <= 1e-3 * size:
        rotation = (90.0, 0.0, 0.0)
        x = x @ euler_xyz_deg(rotation).T
        lo, hi = x.min(0), x.max(0)
    c = 0.5 * (lo + hi)
    lift = 0.25 * size
    lines = [
        "[scene]", f'name = "{mesh_path.stem}"',
        (f'description = "{mesh_path.name} draped on {"the ground" if drape_on == "ground" else "a " + drape_on} '
         '(written by tisim refine; edit freely)"'), "",
        "[sim]", "dt = 0.01", f"frames = {frames}", "",
        "[solver]", 'type = "cloth"', "",
        "[contact]", "mu = 0.2", f"dhat = {max(1e-4, 1e-3 * size):.3g}", f"thickness = {max(1e-4, 1e-3 * size):.3g}",
        "",
        "[objects.cloth]", 'kind = "cloth"', f'mesh = "{mesh_path.resolve()}"',
        "youngs_modulus = 1e5", "poisson_ratio = 0.3", "thickness = 1e-3", "density = 200.0",
        f"translation = [{-c[0]:.6g}, {-lo[1] + lift + (0.35 * size if drape_on != 'ground' else 0):.6g}, "
        f"{-c[2]:.6g}]",
    ]
    if rotation is not None:
        lines.append(f"rotation = [{rotation[0]:g}, {rotation[1]:g}, {rotation[2]:g}]  # stood up to hang from its top edge")
    if pin:
        lines.append(f'pin = "{pin}"')
    lines.append("")
    if drape_on == "sphere":
        lines += ["[colliders.sphere]", 'type = "sphere"', f"position = [0.0, {0.2 * size:.6g}, 0.0]",
                  f"radius = {0.2 * size:.6g}", ""]
    elif drape_on == "box":
        lines += ["[colliders.box]", 'type = "box"', f"position = [0.0, {0.15 * size:.6g}, 0.0]",
                  f"half_extents = [{0.15 * size:.6g}, {0.15 * size:.6g}, {0.15 * size:.6g}]", ""]
    lines += ["[colliders.ground]", 'type = "plane"', "position = [0.0, 0.0, 0.0]", "normal = [0.0, 1.0, 0.0]", ""]
    if wind:
        lines += ["[wind]", f"velocity = [{wind[0]}, {wind[1]}, {wind[2]}]", "gust = 0.5", ""]
    lines += ["[camera]", f"position = [{1.2 * size:.6g}, {0.9 * size:.6g}, {1.4 * size:.6g}]",
              f"lookat = [0.0, {0.25 * size:.6g}, 0.0]", ""]
    return "\n".join(lines)
