"""Configuration of the variational ADMM integrator (the ``[solver]`` table with type = "admm").

Imported by the scene loader, so it must not import Taichi.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tisim.config import ConfigError, num


@dataclass(frozen=True, kw_only=True)
class ADMMConfig:
    """ADMM settings of the midpoint variational integrator (:class:`SolverADMM`).

    Stiffness: the notes' kappa (and lambda) come from each object's Lame
    parameters (mu, lam) = ``ObjectConfig.lame`` as documented in
    :mod:`tisim.solvers.admm.solver`; nothing here overrides them.

    Residuals (both dimensionless, volume-weighted RMS over the elements):
    primal = RMS ||F_i(q_mid) - R_i S_i||_F (a strain error), with contact also
    RMS ||q - q'|| / (mean edge length); dual = RMS rho_i/(w_i k_i) ||R_i S_i - (R_i S_i)_previous||_F
    (the unconverged part of the q-step's elastic force, as a stress relative to the
    stiffness k_i), with contact also RMS ||q' - q'_previous|| / (mean edge length).
    A step stops when both are below their tolerance (after ``min_iterations``)
    or at ``max_iterations``: it has stalled. A stalled step is never accepted as it is: it
    is retried from a fresh splitting (polar decomposition of q^k, rho back to its start)
    with ``retry_iteration_factor`` times the iteration cap, then as two half steps (each
    with the same retries, ``retry_halvings`` levels deep). A step that still has not
    converged is returned flagged (``converged`` False, ``admm_stalled`` = 1,
    ``stall_failed`` = 1) and the runner ends the run (exit status 4). The same holds for
    the Newton solve of the energy-momentum option. ``retry_stalled = false`` skips the retries
    (a step is flagged at once: for benchmarks of a fixed iteration count).
    """

    type: Literal["admm"] = "admm"
    tolerance: float = num(1e-6, gt=0, doc="primal residual tolerance (RMS strain error)")
    dual_tolerance: float = num(0.0, ge=0, doc="dual residual tolerance; 0: same as tolerance")
    max_iterations: int = num(1000, ge=1, doc="ADMM iteration cap per time step")
    min_iterations: int = num(1, ge=1, doc="ADMM iterations always done per step")
    rho_scale: float = num(
        1.0, gt=0, doc="penalty rho_i = rho_scale * w_i * k_i (k_i: stiffness of the material at rest)"
    )
    eta_fraction: float = num(0.05, ge=0, doc="proximal weight of the rotation step, eta_i / rho_i")
    adaptive_rho: bool = True  # residual balancing (doubles/halves rho and refactors)
    rho_balance: float = num(10.0, gt=1, doc="rescale rho when one residual exceeds the other by this factor")
    rho_update_interval: int = num(20, ge=1, doc="ADMM iterations between residual-balancing checks")
    rho_min_scale: float = num(0.5, gt=0, doc="lower limit of the adaptive rho relative to its start")
    rho_max_scale: float = num(1e3, gt=0, doc="upper limit of the adaptive rho relative to its start")
    local_rho: bool = True  # raise rho_i of elements much stiffer than at rest (see SolverADMM)
    local_rho_threshold: float = num(1.0, gt=0, doc="local rho level = ceil(log2(threshold * need)), see SolverADMM")
    local_rho_max_level: int = num(12, ge=0, doc="local rho is at most 2^level times the rest rho")
    contact_penalty_scale: float = num(
        1.0, gt=0, doc="ADMM penalty of the contact copy q' per vertex, mu_v = scale * m_v / h^2"
    )
    warn_every: int = num(50, ge=1, doc="log one warning per this many retried steps (the first always)")
    retry_stalled: bool = True  # False: a stalled step is returned flagged at once (fixed-iteration benchmarks)
    retry_iteration_factor: float = num(
        4.0, ge=1, doc="a stalled step is retried from a fresh splitting with this many times max_iterations"
    )
    retry_halvings: int = num(1, ge=0, doc="then retried as two half steps, recursively this many levels deep")
    prox_newton_iterations: int = num(
        60, ge=1, doc="cap of the Newton solve of the Neo-Hookean (lam != 0) and corotated S-step per element"
    )
    integrator: Literal["midpoint", "energy-momentum"] = "midpoint"
    # "midpoint": the notes' variational midpoint rule, solved by ADMM (symplectic; on stiff nonlinear
    # runs its energy can drift and blow up, see SolverADMM). "energy-momentum": the discrete-gradient
    # step of Gonzalez / Simo-Tarnow (energy and momenta conserved to the solver tolerance), solved by
    # Newton (tisim.solvers.admm.energy_momentum); the ADMM settings above are then unused.
    newton_tolerance: float = num(
        1e-10, gt=0, doc="energy-momentum: Newton stops when max |dx| / bounding diagonal is below this"
    )
    newton_max_iterations: int = num(100, ge=1, doc="energy-momentum: Newton iteration cap per time step")
    drift_warning: float = num(
        0.01, ge=0, doc="warn once when |E - E0| / max(|E0|, K0) exceeds this (no handles/damping); 0: never"
    )

    def __post_init__(self):
        if self.min_iterations > self.max_iterations:
            raise ConfigError("min_iterations", f"must not exceed max_iterations ({self.max_iterations})")
        if self.rho_min_scale > 1.0 or self.rho_max_scale < 1.0:
            raise ConfigError("rho_min_scale", "expected rho_min_scale <= 1 <= rho_max_scale")

    @property
    def dual_tol(self) -> float:
        return self.dual_tolerance if self.dual_tolerance > 0 else self.tolerance

    @classmethod
    def accurate(cls, **kw) -> ADMMConfig:
        """Tight tolerances for verification (conservation tests)."""
        return cls(**{"tolerance": 1e-9, "max_iterations": 5000, **kw})

    @classmethod
    def realtime(cls, **kw) -> ADMMConfig:
        """Loose tolerance and a small cap for interactive use."""
        return cls(**{"tolerance": 1e-4, "max_iterations": 50, **kw})
