"""What changes every step: positions, velocities, time, solver warm-start data."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class State:
    """positions: (n, 3) float64, metres. velocities: (n, 3) float64, m/s.
    time: seconds. ``warm`` holds solver-owned warm-start arrays (rotations,
    duals, contact forces), keyed by name; the runner never reads it.

    Two states are swapped each step and never reallocated.
    """

    positions: np.ndarray
    velocities: np.ndarray
    time: float = 0.0
    warm: dict = field(default_factory=dict)

    def copy_from(self, other: State) -> None:
        np.copyto(self.positions, other.positions)
        np.copyto(self.velocities, other.velocities)
        self.time = other.time
        self.warm = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in other.warm.items()}

    def clone(self) -> State:
        s = State(self.positions.copy(), self.velocities.copy(), self.time)
        s.warm = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.warm.items()}
        return s

    def is_finite(self) -> bool:
        return bool(np.all(np.isfinite(self.positions)) and np.all(np.isfinite(self.velocities)))
