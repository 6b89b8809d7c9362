"""The surface every solver exposes.

solver = SolverX(model, config)              # precomputation here
stats = solver.step(state_in, state_out, dt) # StepStats
solver.reset(state); solver.notify_model_changed(what)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

if TYPE_CHECKING:
    from tisim.model import Model
    from tisim.state import State


class StepDiverged(RuntimeError):
    """A solver step whose motion is beyond anything it can simulate (a Newton step
    that moves the mesh kilometres, overflowing positions): the runner ends the run as
    diverged, keeping the frames before it. The message says what went wrong."""


@dataclass
class StepStats:
    """What one solver step reports. Quantities a solver does not compute stay NaN
    (written as empty cells), never a made-up number.

    timings: milliseconds per phase (e.g. {"local": 3.1, "global": 1.2}).
    extra: further per-step columns for stats.csv (name -> number).
    """

    iterations: int = 0
    residual: float = math.nan
    converged: bool = True
    potential: float = math.nan  # J: elastic + gravity (+ collision penalty), at state_out
    n_contacts: int = 0
    max_penetration: float = math.nan  # m, >= 0
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Tunable:
    """A parameter the viewer's panel may change while running."""

    name: str
    value: float
    low: float
    high: float
    log: bool = False


class Solver(ABC):
    """Base class of all solvers.

    Subclasses set ``name`` and implement ``step``. ``config`` is the solver's own
    frozen config dataclass (``solver`` table of the scene); ``model.scene.contact``
    holds the shared contact settings.
    """

    name: ClassVar[str] = ""

    def __init__(self, model: Model, config):
        self.model = model
        self.config = config
        self._drag: tuple[int, np.ndarray] | None = None
        self._grab_force: np.ndarray | None = None

    @abstractmethod
    def step(self, state_in: State, state_out: State, dt: float) -> StepStats:
        """Advance ``state_in`` by ``dt`` seconds into ``state_out`` (distinct objects)."""

    def inversion_is_divergence(self) -> bool:
        """Whether an inverted tet (det F <= 0) at the end of a step means the run
        diverged (the runner's DivergenceGuards). True unless the solver recovers
        inverted elements by itself (SolverPD with inversion-robust materials)."""
        return True

    def reset(self, state: State) -> None:
        """Forget warm-start data (called when the viewer resets the scene)."""
        state.warm.clear()

    def notify_model_changed(self, what: str) -> None:  # noqa: B027 (a hook; most solvers need nothing)
        """Re-run the precomputation that depends on ``what`` (e.g. "stiffness", "dt")."""

    def potential_energy(self, positions: np.ndarray) -> float:
        """Total potential energy in J at ``positions``: elastic + gravity. NaN if unknown."""
        return math.nan

    def held_vertices(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vertices prescribed at time ``t``: the active handles plus the mouse drag
        (held at its target, at rest). Returns sorted indices (h,), positions (h, 3)
        and velocities (h, 3)."""
        idx, tgt = self.model.handle_targets(t)
        _, vel = self.model.handle_velocities(t)
        idx = np.asarray(idx, dtype=np.int64)
        if self._drag is not None:
            v, target = self._drag
            keep = idx != v
            idx = np.concatenate([idx[keep], [v]])
            tgt = np.concatenate([tgt[keep], target[None, :]])
            vel = np.concatenate([vel[keep], np.zeros((1, 3))])
        order = np.argsort(idx, kind="stable")
        return idx[order], tgt[order], vel[order]

    # viewer interaction ------------------------------------------------------
    def set_drag(self, vertex: int | None, target: np.ndarray | None = None) -> None:
        """Pull ``vertex`` towards ``target`` (3,) as a temporary handle; None releases it."""
        self._drag = None if vertex is None else (int(vertex), np.asarray(target, dtype=np.float64))

    def set_grab_force(self, force: np.ndarray | None) -> None:
        """A constant external force (n, 3) in N on the next steps (the live window's grab
        tool, :mod:`tisim.render.grab`), added to gravity inside the solver's own step;
        None removes it."""
        self._grab_force = None if force is None else np.asarray(force, dtype=np.float64)

    def grab_acceleration(self, mass: np.ndarray) -> np.ndarray | None:
        """The grab force divided by ``mass`` (n,) kg: (n, 3) m/s^2, or None."""
        if self._grab_force is None:
            return None
        m = np.asarray(mass, dtype=np.float64)
        return self._grab_force / np.where(m > 0, m, np.inf)[:, None]

    def tunables(self) -> list[Tunable]:
        """Parameters the viewer's panel may change while running."""
        return []

    def set_tunable(self, name: str, value: float) -> None:
        raise KeyError(name)
