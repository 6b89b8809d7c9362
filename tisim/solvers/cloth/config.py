"""Configuration of the cloth solver (the ``[solver]`` table with type = "cloth")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tisim.config import ConfigError, num
from tisim.solvers.pd.config import PDConfig


@dataclass(frozen=True, kw_only=True)
class ClothConfig:
    """Settings of :class:`~tisim.solvers.cloth.solver.SolverCloth`.

    The contact constants (dhat, thickness, eps_v, friction iterations, kappa) are in the
    scene's ``[contact]`` table, shared with the other solvers' friction coefficient.
    ``solids`` configures the PD solver that moves the scene's soft bodies, whose
    surfaces the cloth meets as moving obstacles (one-way coupling).
    """

    type: Literal["cloth"] = "cloth"
    newton_iterations: int = num(50, ge=1, doc="Newton iterations per step at most")
    tolerance: float = num(1e-2, gt=0, doc="Newton stops when max|p| / h < tolerance * cloth size per second (IPC)")
    stop: Literal["decrement", "max"] = field(
        default="decrement",
        metadata={
            "doc": "'max': stop on max|p| / h alone (IPC); 'decrement': also when the Newton "
            "decrement as a velocity, sqrt(p^T H p / M), is below the same tolerance "
            "(a mass-weighted RMS bound on p / h that ignores isolated floppy vertices)"
        },
    )
    hessian_reuse: int = num(
        1,
        ge=1,
        doc="Newton iterations that share one evaluation of the elastic Hessian "
        "(1: a fresh one every iteration; more: the gradient stays exact, the kept "
        "Hessian is refreshed after that many iterations, a backtracking line search, and "
        "to confirm convergence)",
    )
    strain_limit: float = num(1.01, ge=0, doc="largest membrane stretch sigma_max, > 1 (0: no limit)")
    # Beyond 1e12 E t the barrier's Hessian swamps the mass matrix in double precision: a
    # hanging sheet stopped moving from 1e16 on, and 1e300 overflowed the Newton system
    strain_stiffness: float = num(1e2, gt=0, le=1e12, doc="strain-limit barrier stiffness, scales E t")
    self_contact: bool = True
    bending: bool = True
    bending_hessian: Literal["lumped", "coupled"] = field(
        default="lumped",
        metadata={
            "doc": "the Gauss-Newton bending Hessian in the Newton matrix: 'coupled' as it is; "
            "'lumped' replaces each hinge's c g g^T by c (g g^T + u u^T), which has no block "
            "between the hinge's two opposite vertices (they share no face): an upper bound "
            "with rigid translations in its null space that keeps the system's pattern the "
            "membrane's (half the factor's non-zeros on a regular sheet; ShellTerm); the "
            "gradient and the energy stay exact"
        },
    )
    line_search_steps: int = num(30, ge=1, doc="backtracking halvings before a step gives up")
    linear_precision: Literal["double", "mixed"] = field(
        default="double",
        metadata={
            "doc": "Newton systems factorised in double precision, or ('mixed', MKL PARDISO only) "
            "in single precision refined in double: contact frames 3-6% faster, "
            "residuals about 1e-9 instead of round-off"
        },
    )
    ccd_eta: float = num(0.1, gt=0, lt=1, doc="CCD keeps this fraction of the gap")
    solids: PDConfig = field(default_factory=PDConfig)

    def __post_init__(self):
        # the barrier acts on stretches in (1, s_max): at s_max <= 1 the rest shape itself
        # would violate the limit
        if 0.0 < self.strain_limit <= 1.0:
            raise ConfigError("strain_limit", f"expected 0 (no limit) or a stretch > 1, got {self.strain_limit!r}")
