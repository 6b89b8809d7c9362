"""What a live window adds to the runner's time loop: the grab tool, rolling back a step
that failed, looping at the scene's end.

A live window never closes because of what the user did. Before every frame the runner
keeps a copy of the state (:meth:`LiveControl.before_step`); a frame whose step diverges
(any cause the runner's divergence guards name: non-finite values, an infinite energy,
an inverted element for the solvers that count it, a run of unconverged steps, a stall,
or an error raised by the solver's step) is rolled back to that copy
(:meth:`LiveControl.rollback`), the solver forgets its warm starts, and the panel says
in one line what happened and what was done:

* while grabbing: "the grab was too strong: stepped back, grab stiffness halved"; the
  grab goes on with half the stiffness;
* within 30 frames of a change of dt, stiffness or iterations: "dt too large for this stiffness:
  stepped back and paused (lower dt or stiffness, or press r to reset)";
* otherwise: the cause, "stepped back and paused (r resets)".

Headless runs never get here: they end with exit status 3 (or 4 for a stall), keeping
their frames, as before.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from tisim.render.grab import GrabTool
from tisim.solvers.base import Tunable

log = logging.getLogger(__name__)

GRAB_STIFFNESS = "grab.stiffness"
GRAB_RANGE = (0.01, 10.0)  # the slider's range around the default stiffness (log scale)
MODEL_TUNABLES = ("dt", "stiffness", "iterations", "youngs_modulus")
RECENT_FRAMES = 30  # a failure this many good frames after a change of those is blamed on it


@dataclass
class Rollback:
    """One rolled-back step: the frame it would have produced, the cause and what was done."""

    frame: int
    time: float
    cause: str
    message: str
    grabbing: bool


class LiveControl:
    """The live loop's interaction state: grab, rollbacks, the grab stiffness tunable.

    model, solver: the run's; dt: the scene's time step, s (sets the default grab
    stiffness); viewer: the live viewer (told about rollbacks with ``notify`` when it
    has one).
    """

    def __init__(self, model, solver, viewer, dt: float):
        self.model = model
        self.solver = solver
        self.viewer = viewer
        self.dt = float(dt)
        slices = getattr(model, "object_vertex_slices", ()) or ()
        self.grab = GrabTool(model.mass, slices)
        self.default_stiffness = self._typical_stiffness()
        self.grab.stiffness = self.default_stiffness
        self.snapshot = model.initial_state()
        self.rollbacks: list[Rollback] = []
        self.recent_changes: set[str] = set()
        self._failed_in_a_row = 0
        self._good_since_change = 0
        self.owns_dt = False  # the solver has no dt tunable: the loop steps with self.dt

    # the grab stiffness ----------------------------------------------------------------
    def _typical_stiffness(self) -> float:
        """0.5 M / h^2 for a region around a surface vertex near the first object's middle
        (the panel's starting value; every grab uses the panel's value)."""
        x = np.asarray(self.model.initial_positions, dtype=np.float64)
        surf = np.unique(np.asarray(self.model.surface))
        if len(surf) == 0:
            return 1.0
        c = x[surf].mean(axis=0)
        v = int(surf[np.argmin(np.linalg.norm(x[surf] - c, axis=1))])
        probe = GrabTool(self.model.mass, self.grab.object_slices)
        probe.begin(v, x, self.dt)
        k = float(probe.stiffness)
        return k if math.isfinite(k) and k > 0 else 1.0

    def tunable(self) -> Tunable:
        k0 = self.default_stiffness
        return Tunable(GRAB_STIFFNESS, float(self.grab.stiffness), k0 * GRAB_RANGE[0], k0 * GRAB_RANGE[1], log=True)

    def tunables(self, solver_tunables) -> list[Tunable]:
        """What the live loop adds to the solver's panel: ``dt`` when the solver has none of
        its own (the loop then steps with the panel's dt) and the grab stiffness."""
        names = {t.name for t in solver_tunables}
        self.owns_dt = "dt" not in names
        extra = (
            [Tunable("dt", self.dt, max(1e-5, self.dt / 20), min(0.05, 5 * self.dt), log=True)] if self.owns_dt else []
        )
        return [*extra, self.tunable()]

    # events -------------------------------------------------------------------------------
    def apply_events(self, ev, state) -> None:
        """Take the viewer's tunable changes and grab from ``ev`` (a ViewerEvents); the
        tunables other than the grab's go to the solver. A value the solver refuses is
        reported, not raised."""
        for name, value in ev.tunable_changes.items():
            if name == GRAB_STIFFNESS:
                self.grab.stiffness = float(value)
                continue
            if name == "dt" and self.owns_dt:
                self.dt = float(value)
                self.grab.dt = self.dt if self.grab.active else self.grab.dt
                self.recent_changes.add(name)
                self._good_since_change = 0
                continue
            try:
                self.solver.set_tunable(name, value)
            except (KeyError, ValueError) as exc:
                self._notify(f"{name} = {value:g} refused: {exc}")
                continue
            self.recent_changes.add(name)
            self._good_since_change = 0
            if name == "dt":  # the grab's force acts over the new step
                self.dt = float(value)
                if self.grab.active:
                    self.grab.dt = self.dt
        if (ev.drag_released or ev.drag_vertex is None) and self.grab.active:
            self.grab.release()
        if ev.drag_vertex is not None:
            if self.grab.vertex != ev.drag_vertex:
                self.grab.begin(ev.drag_vertex, state.positions, self.dt)
            if ev.drag_target is not None and np.all(np.isfinite(ev.drag_target)):
                self.grab.target = np.asarray(ev.drag_target, dtype=np.float64)

    def before_step(self, state) -> None:
        """Keep a copy of ``state`` to roll back to and hand the solver the grab's force."""
        self.snapshot.copy_from(state)
        self.solver.set_grab_force(self.grab.forces(state.positions, state.velocities))

    def after_good_step(self) -> None:
        self._failed_in_a_row = 0
        # a change of dt or stiffness shows as a failure within some frames, not at once
        self._good_since_change += 1
        if self._good_since_change > RECENT_FRAMES:
            self.recent_changes.clear()

    def on_reset(self) -> None:
        self.grab.release()
        self.solver.set_grab_force(None)
        self._failed_in_a_row = 0
        self.recent_changes.clear()

    # rollback ----------------------------------------------------------------------------
    def rollback(self, state, frame: int, exc: BaseException) -> Rollback:
        """Put ``state`` back to the copy taken before the failed frame, reset the solver's
        warm starts, decide what to do and say it (``notify``). Returns the record."""
        state.copy_from(self.snapshot)
        self.solver.set_grab_force(None)
        self.solver.reset(state)
        self._failed_in_a_row += 1
        cause = _cause(exc)
        grabbing = self.grab.active
        pause = False
        if grabbing:
            self.grab.stiffness = 0.5 * float(self.grab.stiffness)
            msg = f"the grab was too strong: stepped back, grab stiffness halved (now {self.grab.stiffness:.3g} N/m)"
        elif self.recent_changes & set(MODEL_TUNABLES):
            pause = True
            msg = "dt too large for this stiffness: stepped back and paused (lower dt or stiffness, or r to reset)"
        else:
            pause = True
            msg = f"the step failed ({cause}): stepped back and paused (r resets)"
        record = Rollback(frame + 1, float(state.time), cause, msg, grabbing)
        self.rollbacks.append(record)
        log.info("live: frame %d rolled back (%s): %s", frame + 1, cause, msg)
        values = {GRAB_STIFFNESS: float(self.grab.stiffness)} if grabbing else {}
        self._notify(msg, pause=pause, values=values)
        return record

    def _notify(self, msg: str, *, pause: bool = False, values: dict | None = None) -> None:
        notify = getattr(self.viewer, "notify", None)
        if notify is not None:
            notify(msg, pause=pause, values=values or {})


def _cause(exc: BaseException) -> str:
    """A short name of what went wrong, from the exception's message."""
    text = str(exc)
    for key, name in (
        ("inverted", "inverted elements"),
        ("NaN", "non-finite values"),
        ("infinite", "infinite energy"),
        ("did not converge", "no convergence"),
        ("stalled", "stalled"),
        ("Inf", "non-finite values"),
    ):
        if key in text:
            return name
    return type(exc).__name__ if not text else text.split(":")[-1].strip()[:80]
