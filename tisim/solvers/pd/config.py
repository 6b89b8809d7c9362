"""Configuration of the real-time solver (the ``[solver]`` table with type = "pd")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tisim.config import num


@dataclass(frozen=True, kw_only=True)
class PDConfig:
    type: Literal["pd"] = "pd"
    iterations: int = num(5, ge=1, doc="local-global iterations per step")
    tolerance: float = num(0.0, ge=0, doc="stop early when the relative residual is below this (0: fixed count)")
    global_step: Literal["auto", "sparse-inverse", "cholesky", "jacobi"] = "auto"
    ordering: Literal["auto", "metis", "amd", "natural"] = "auto"
    jacobi_iterations: int = num(1, ge=1, doc="Jacobi-Chebyshev sweeps per global step (jacobi back-end)")
    chebyshev_rho: float = num(0.9992, gt=0, lt=1, doc="spectral radius estimate for Chebyshev acceleration")
    weight_scale: float = num(1.0, gt=0, doc="scales the PD weights w_i = 2 mu V_i (Neo-Hookean may want more)")
    handle_stiffness: float = num(1e8, gt=0, doc="stiffness of the mouse-drag handle, N/m")
    memory_limit_mb: float = num(2000.0, gt=0, doc="largest S allowed before falling back to cholesky")
