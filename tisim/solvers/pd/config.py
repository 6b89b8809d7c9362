"""Configuration of the real-time solver (the ``[solver]`` table with type = "pd")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tisim.config import num


@dataclass(frozen=True, kw_only=True)
class PDConfig:
    """Settings of the local-global solver :class:`~tisim.solvers.pd.solver.SolverPD`.

    Weights of the global matrix per element (V: rest volume, mu/lam: Lamé parameters):
    ARAP 2 mu V (its energy, not scaled); corotated 2 mu V + weight_scale * 2 lam V;
    Neo-Hookean and the other hyperelastic materials weight_scale * (3 mu + 2 lam) V
    (quasi-Newton, see the solver's docstring for why).
    """

    type: Literal["pd"] = "pd"
    iterations: int = num(5, ge=1, doc="local-global iterations per step (at most, with a tolerance)")
    tolerance: float = num(0.0, ge=0, doc="stop early when the relative residual is below this (0: fixed count)")
    global_step: Literal["auto", "sparse-inverse", "cholesky", "jacobi"] = "auto"
    ordering: Literal["auto", "metis", "amd", "natural"] = "auto"
    jacobi_iterations: int = num(1, ge=1, doc="Jacobi-Chebyshev sweeps per global step (jacobi back-end)")
    chebyshev_rho: float = num(0.9992, gt=0, lt=1, doc="spectral radius estimate for Chebyshev acceleration")
    chebyshev_delay: int = num(10, ge=1, doc="plain Jacobi sweeps before Chebyshev acceleration starts")
    jacobi_relaxation: float = num(0.9, gt=0, le=1, doc="under-relaxation gamma of the Jacobi sweep")
    weight_scale: float = num(1.0, gt=0, doc="scales the quasi-Newton weights (Neo-Hookean, corotated volume term)")
    rotation_iterations: int = num(1, ge=1, doc="warm-started rotation-extraction iterations per local step")
    volume_stiffness: float = num(0.0, ge=0, doc="Pa; > 0 adds the PD volume-preservation constraint to every tet")
    # "auto": Anderson where it was measured to pay (Neo-Hookean, no contact, exact global
    # step, CPU f64), none elsewhere; run.json's solver_info says which and why
    acceleration: Literal["auto", "none", "anderson"] = "auto"
    anderson_window: int = num(5, ge=1, le=16, doc="Anderson acceleration: previous iterates combined per step (m)")
    handle_stiffness: float = num(1e8, gt=0, doc="stiffness of the mouse-drag handle, N/m")
    memory_limit_mb: float = num(2000.0, gt=0, doc="largest S (with S^T) allowed before falling back to cholesky")
