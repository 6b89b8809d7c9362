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

Modules: ``refiner`` (ProgressiveRefiner: stepping, one level, the whole refine),
``levels`` (the hierarchy of a scene's cloth and each level's solver input), ``shell``
(the prolonged shell term and its restricted Hessian), ``checkpoints`` (per-frame
checkpoints, resume, a finished level's trajectory), ``pipeline`` (the pipelined
schedule's processes and threads), ``report`` (consistency.csv/png, videos, timings),
``metrics`` (the toss metric), ``mesh_scene`` (a scene around a mesh file). This package
re-exports the names the rest of tisim, the tests and the studies use.
"""

from tisim.outputs import read_json
from tisim.progressive.checkpoints import _first_difference, _read_rows, _Trajectory
from tisim.progressive.levels import LevelState, build_levels, cloth_part_for_level, level_mesh
from tisim.progressive.mesh_scene import scene_for_mesh
from tisim.progressive.metrics import Hole, level_com, through_hole
from tisim.progressive.pipeline import _environment, pipeline_groups, pipeline_threads
from tisim.progressive.refiner import ProgressiveRefiner, RefineResult
from tisim.progressive.report import level_timings, render_levels, write_consistency
from tisim.progressive.shell import ProlongedShell, _restriction_map

__all__ = [
    "Hole",
    "LevelState",
    "ProgressiveRefiner",
    "ProlongedShell",
    "RefineResult",
    "_Trajectory",
    "_environment",
    "_first_difference",
    "_read_rows",
    "_restriction_map",
    "build_levels",
    "cloth_part_for_level",
    "level_com",
    "level_mesh",
    "level_timings",
    "pipeline_groups",
    "pipeline_threads",
    "read_json",
    "render_levels",
    "scene_for_mesh",
    "through_hole",
    "write_consistency",
]
