"""Replaying timed input into the live loop, without a window or an X server.

A list of :class:`InputEvent` (mouse presses, moves and releases in pixels, keys, slider
values), each due at a loop iteration (``at``: the number of the ``poll`` that delivers
it), is fed to :class:`ReplayViewer`, which implements the viewer interface on the same
:class:`~tisim.render.ggui.InputController` as the live GGUI window: the same picking,
grab, camera, pause/step/reset and slider handling, with nothing drawn. It records what
the loop showed it (frames drawn, any non-finite position, the panel's one-line
messages), so tests can drive a long random session through ``run_scene(..., live=True)``
and check that the loop stayed alive, no NaN reached the renderer and every rollback was
reported. :func:`random_events` makes such sessions from a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from tisim.render.base import ViewerEvents, ViewInfo
from tisim.render.camera import OrbitCamera
from tisim.render.ggui import LMB, MMB, RMB, InputController
from tisim.render.panel import shown_value

KINDS = ("press", "release", "move", "key", "slider")


@dataclass(frozen=True)
class InputEvent:
    """One input event, due at loop iteration ``at`` (the ``at``-th poll, from 1).

    kind: "press" / "release" (``button`` LMB, MMB or RMB at pixel (x, y), origin top
    left, y down; a press with ``on_object`` aims at a random surface vertex of what is on
    screen instead), "move" (cursor to (x, y); ``shift`` / ``ctrl`` held), "key"
    (``key``: a key name as GGUI gives it, e.g. " ", "n", "r", "Escape"), "slider"
    (the panel's slider ``name`` moved to ``value``, clamped to its range).
    """

    at: int
    kind: str
    button: str = LMB
    x: float = 0.0
    y: float = 0.0
    key: str = ""
    name: str = ""
    value: float = 0.0
    shift: bool = False
    ctrl: bool = False
    on_object: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}: expected one of {', '.join(KINDS)}")


@dataclass
class ReplayLog:
    """What the replayed loop showed the viewer."""

    polls: int = 0
    frames_drawn: int = 0
    nonfinite_draws: int = 0
    messages: list[str] = field(default_factory=list)
    grabs: int = 0  # polls that delivered an active grab
    slider_values: dict[str, list[float]] = field(default_factory=dict)


class ReplayViewer:
    """A viewer that takes its input from a list of :class:`InputEvent` (see the module
    docstring). It stops (``running`` False) once every event is delivered and
    ``tail`` more iterations have run."""

    idle_sleep = 0.0  # the loop does not wait while paused: nobody is watching

    def __init__(self, events, *, tail: int = 5, seed: int = 0, pick_radius_px: float = 12.0):
        self.events = sorted(events, key=lambda e: e.at)
        self.tail = int(tail)
        self.rng = np.random.default_rng(seed)
        self.pick_radius_px = pick_radius_px
        self.log = ReplayLog()
        self.info: ViewInfo | None = None
        self.controller: InputController | None = None
        self.tunables: dict = {}
        self.values: dict[str, float] = {}
        self._next = 0
        self._closed = True
        self._positions: np.ndarray | None = None

    def open(self, info: ViewInfo) -> None:
        self.info = info
        r = info.render
        self.controller = InputController(
            OrbitCamera.from_config(info.camera), r.width, r.height, info.faces, pick_radius_px=self.pick_radius_px
        )
        self.tunables = {t.name: t for t in info.tunables}
        self.values = {t.name: float(t.value) for t in info.tunables}
        self._closed = False

    @property
    def running(self) -> bool:
        if self._closed or self.controller is None or self.controller.quit:
            return False
        return self._next < len(self.events) or self.log.polls < self._last_at() + self.tail

    def _last_at(self) -> int:
        return self.events[-1].at if self.events else 0

    def poll(self) -> ViewerEvents:
        if self._closed:
            return ViewerEvents(quit=True)
        self.log.polls += 1
        c = self.controller
        while self._next < len(self.events) and self.events[self._next].at <= self.log.polls:
            self._apply(self.events[self._next])
            self._next += 1
        ev = c.take_events()
        if ev.drag_vertex is not None:
            self.log.grabs += 1
        return ev

    def _apply(self, e: InputEvent) -> None:
        c = self.controller
        if e.kind == "key":
            c.key_press(e.key)
        elif e.kind == "move":
            c.mouse_move(e.x, e.y, shift=e.shift, ctrl=e.ctrl)
        elif e.kind == "press":
            x, y = (e.x, e.y)
            if e.on_object and self._positions is not None and len(self.info.faces):
                v = int(self.rng.choice(np.unique(self.info.faces)))
                pix, depth = c.view().project(self._positions[v][None, :])
                if depth[0] > 0 and np.all(np.isfinite(pix)):
                    x, y = float(pix[0, 0]), float(pix[0, 1])
            c.mouse_move(x, y)
            c.mouse_press(e.button, x, y)
        elif e.kind == "release":
            c.mouse_move(e.x, e.y)
            c.mouse_release(e.button, e.x, e.y)
        elif e.kind == "slider":
            t = self.tunables.get(e.name)
            if t is None:
                return
            value = shown_value(t, min(max(float(e.value), t.low), t.high))
            if value != self.values[e.name]:
                self.values[e.name] = value
                self.log.slider_values.setdefault(e.name, []).append(value)
                c.set_tunable(e.name, value)

    def draw(self, frame: int, time: float, positions: np.ndarray, extra_points: np.ndarray | None = None) -> None:
        x = np.asarray(positions, dtype=np.float64)
        self.log.frames_drawn += 1
        if not np.all(np.isfinite(x)) or not math.isfinite(time):
            self.log.nonfinite_draws += 1
            return
        self._positions = x
        self.controller.set_positions(x)

    def notify(self, message: str, *, pause: bool = False, values: dict | None = None) -> None:
        """A one-line message for the panel (a rollback, a refused value); ``pause`` pauses
        the loop; ``values``: tunables whose value the loop changed."""
        self.log.messages.append(message)
        if pause:
            self.controller.request(pause=True)
        for k, v in (values or {}).items():
            if k in self.values:
                self.values[k] = float(v)

    def take_refine(self) -> bool:
        """The preview's refine request (key ``f``): never, in a replay."""
        return False

    refine_status = ""

    def close(self) -> None:
        self._closed = True


KEYS = (" ", "n", "r", "c", "h", "Left", "Right", "Up", "Down", "Escape")


def random_events(seed: int, count: int, *, width: int, height: int, tunables=(), polls: int | None = None):
    """``count`` random input events over ``polls`` loop iterations (default count / 5):
    grabs on the object dragged across the window (released by the button, a right-click
    or Esc), camera drags, slider moves (to either end of the range half the time), keys
    (pause, step, reset, camera). Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    polls = polls if polls is not None else max(1, count // 5)
    names = [t.name for t in tunables]
    lo = {t.name: t.low for t in tunables}
    hi = {t.name: t.high for t in tunables}
    logs = {t.name: bool(t.log and t.low > 0) for t in tunables}
    out: list[InputEvent] = []
    at = 1

    def px():
        return float(rng.uniform(0, width)), float(rng.uniform(0, height))

    while len(out) < count:
        r = rng.random()
        if r < 0.45:  # a grab: press on the object, drag, let go
            out.append(InputEvent(at, "press", LMB, on_object=True))
            x, y = px()
            for _ in range(int(rng.integers(2, 12))):
                at += int(rng.integers(0, 3))
                x = float(np.clip(x + rng.normal(0, 0.2 * width), -0.2 * width, 1.2 * width))
                y = float(np.clip(y + rng.normal(0, 0.2 * height), -0.2 * height, 1.2 * height))
                out.append(InputEvent(at, "move", x=x, y=y))
            at += int(rng.integers(0, 3))
            how = rng.random()
            if how < 0.7:
                out.append(InputEvent(at, "release", LMB, x=x, y=y))
            elif how < 0.85:
                out.append(InputEvent(at, "press", RMB, x=x, y=y))
                out.append(InputEvent(at, "release", RMB, x=x, y=y))
                out.append(InputEvent(at, "release", LMB, x=x, y=y))
            else:
                out.append(InputEvent(at, "key", key="Escape"))
                out.append(InputEvent(at, "release", LMB, x=x, y=y))
        elif r < 0.65 and names:  # a slider
            name = names[int(rng.integers(len(names)))]
            a, b = lo[name], hi[name]
            u = rng.random()
            if u < 0.25:
                v = a
            elif u < 0.5:
                v = b
            elif logs[name]:
                v = float(10 ** rng.uniform(math.log10(a), math.log10(b)))
            else:
                v = float(rng.uniform(a, b))
            out.append(InputEvent(at, "slider", name=name, value=v))
        elif r < 0.85:
            out.append(InputEvent(at, "key", key=KEYS[int(rng.integers(len(KEYS)))]))
        else:  # a camera drag
            button = RMB if rng.random() < 0.7 else MMB
            x, y = px()
            out.append(InputEvent(at, "press", button, x=x, y=y))
            for _ in range(int(rng.integers(1, 5))):
                x, y = px()
                out.append(
                    InputEvent(at, "move", x=x, y=y, shift=bool(rng.random() < 0.2), ctrl=bool(rng.random() < 0.2))
                )
            out.append(InputEvent(at, "release", button, x=x, y=y))
        at += int(rng.integers(0, 2))
    out = out[:count]
    # spread over exactly ``polls`` iterations, in order (several events share a poll)
    last = max(e.at for e in out)
    return [replace(e, at=1 + (e.at - 1) * (polls - 1) // max(last - 1, 1)) for e in out]
