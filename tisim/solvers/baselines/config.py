"""Configuration of the baseline integrators (``[solver]`` type = "implicit-euler" or "xpbd").

Imported by the scene loader, so it must not import Taichi.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tisim.config import num


@dataclass(frozen=True, kw_only=True)
class ImplicitEulerConfig:
    """Backward Euler solved by Newton's method with a backtracking line search.

    Energies are those ADMM integrates ("neo-hookean" is the log-barrier
    Neo-Hookean of the notes, see :func:`tisim.solvers.admm.prox.energy_name`),
    unless ``stable_neo_hookean`` asks for tisim's stable Neo-Hookean.
    """

    type: Literal["implicit-euler"] = "implicit-euler"
    tolerance: float = num(1e-6, gt=0, doc="stop when the Newton step max |dx| < tolerance * (bounding diagonal)")
    max_iterations: int = num(50, ge=1, doc="Newton iterations per step")
    line_search_iterations: int = num(30, ge=1, doc="step halvings before giving up on a Newton step")
    armijo: float = num(1e-4, gt=0, lt=1, doc="sufficient-decrease constant of the line search")
    stable_neo_hookean: bool = False  # use "neo-hookean" (stable) instead of the log-barrier form


@dataclass(frozen=True, kw_only=True)
class XPBDConfig:
    """Extended position-based dynamics with small steps (substeps, one constraint pass each).

    Constraints per tet (see :class:`tisim.solvers.baselines.xpbd.SolverXPBD`): the
    deviatoric/hydrostatic pair of Macklin & Mueller 2021 for the Neo-Hookean-type
    materials, ||F - R||_F (+ det F - 1 for corotated) for ARAP/corotated.
    """

    type: Literal["xpbd"] = "xpbd"
    substeps: int = num(10, ge=1, doc="XPBD substeps per time step (small steps, Macklin et al. 2019)")
    iterations: int = num(1, ge=1, doc="constraint passes per substep")
    contact: Literal["projection", "penalty"] = "projection"
