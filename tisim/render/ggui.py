"""The live GGUI viewer: orbit camera, vertex picking and dragging, a parameter panel.

Controls
    right drag            orbit            Up / Down     zoom in / out
    shift + right drag    pan              Left / Right  orbit
    ctrl + right drag     zoom             c             reset the camera
    middle drag           pan
    left drag on surface  grab a region    space         pause / resume
    right click or Esc    let go           n             one step (pauses first)
    r                     reset            h             hide / show the panel
    q                     quit

GGUI (Taichi 1.7) reports no mouse wheel, hence zooming by keys and ctrl-drag.
The interaction logic lives in ``InputController``, which takes plain pixel
coordinates and key names and never touches Taichi, so it is tested without a
window; ``GGUIViewer`` only feeds it from the window and draws.
"""

from __future__ import annotations

import logging
import math
import time as _time
from typing import Any

import numpy as np

from tisim.render.base import ViewerEvents, ViewInfo
from tisim.render.camera import CameraView, OrbitCamera, drag_point, pick_vertex

log = logging.getLogger(__name__)

LMB, MMB, RMB = "LMB", "MMB", "RMB"
ORBIT_RAD_PER_HEIGHT = math.pi  # a drag across the window height turns the view by 180 degrees
ZOOM_STEP = 1.15
KEY_ORBIT_STEP = math.radians(10.0)


class InputController:
    """Turns mouse and keyboard input into camera motion and ``ViewerEvents``.

    camera: the orbit camera it moves. width, height: window size in pixels.
    faces: (k, 3) surface triangles used for picking. panel_rect: (x0, y0, x1,
    y1) pixels (y down) of the GUI panel, where clicks belong to the panel.
    Pixel coordinates follow ``tisim.render.camera`` (origin top-left, y down).
    """

    def __init__(
        self,
        camera: OrbitCamera,
        width: int,
        height: int,
        faces: np.ndarray,
        *,
        pick_radius_px: float = 12.0,
        panel_rect: tuple[float, float, float, float] | None = None,
    ):
        self.camera = camera
        self.home = OrbitCamera(
            target=camera.target.copy(),
            distance=camera.distance,
            yaw=camera.yaw,
            pitch=camera.pitch,
            up=camera.up.copy(),
            fov=camera.fov,
        )
        self.width, self.height = int(width), int(height)
        self.faces = np.asarray(faces, dtype=np.int64)
        self.pick_radius_px = float(pick_radius_px)
        self.panel_rect = panel_rect
        self.panel_visible = panel_rect is not None
        self.positions: np.ndarray | None = None
        self.paused = False
        self.quit = False
        self.drag_vertex: int | None = None
        self.drag_target: np.ndarray | None = None
        self._step_once = False
        self._reset = False
        self._drag_released = False
        self._tunable_changes: dict[str, float] = {}
        self._held: set[str] = set()
        self._cursor: tuple[float, float] | None = None

    # state ------------------------------------------------------------------
    def view(self) -> CameraView:
        return self.camera.view(self.width, self.height)

    def set_size(self, width: int, height: int) -> None:
        self.width, self.height = int(width), int(height)

    def set_positions(self, positions: np.ndarray) -> None:
        """The positions (n, 3) currently on screen (picking works on these)."""
        self.positions = np.asarray(positions, dtype=np.float64)

    def set_tunable(self, name: str, value: float) -> None:
        self._tunable_changes[name] = float(value)

    def request(
        self,
        *,
        pause: bool | None = None,
        step: bool = False,
        reset: bool = False,
        quit: bool = False,
    ) -> None:
        """What the panel's buttons ask for."""
        if pause is not None:
            self.paused = pause
        if step:
            self.paused = True
            self._step_once = True
        if reset:
            self._reset = True
            self._end_drag()
        if quit:
            self.quit = True

    def take_events(self) -> ViewerEvents:
        """The events since the last call; one-shot flags are cleared."""
        ev = ViewerEvents(
            paused=self.paused,
            step_once=self._step_once,
            reset=self._reset,
            quit=self.quit,
            drag_vertex=self.drag_vertex,
            drag_target=None if self.drag_target is None else self.drag_target.copy(),
            drag_released=self._drag_released,
            tunable_changes=self._tunable_changes,
        )
        self._step_once = self._reset = self._drag_released = False
        self._tunable_changes = {}
        return ev

    # keyboard ---------------------------------------------------------------
    def key_press(self, key: str) -> None:
        k = key.lower() if len(key) == 1 else key
        if k == " ":
            self.paused = not self.paused
        elif k == "n":
            self.request(step=True)
        elif k == "r":
            self.request(reset=True)
        elif k == "Escape":
            self._end_drag()  # Esc lets go of the grab; it never closes the window
        elif k == "q":
            self.quit = True
        elif k == "Up":
            self.camera.zoom(1.0 / ZOOM_STEP)
        elif k == "Down":
            self.camera.zoom(ZOOM_STEP)
        elif k == "Left":
            self.camera.orbit(KEY_ORBIT_STEP, 0.0)
        elif k == "Right":
            self.camera.orbit(-KEY_ORBIT_STEP, 0.0)
        elif k == "h":
            self.panel_visible = not self.panel_visible
        elif k == "c":
            h = self.home
            self.camera.target, self.camera.distance = h.target.copy(), h.distance
            self.camera.yaw, self.camera.pitch = h.yaw, h.pitch

    # mouse ------------------------------------------------------------------
    def is_held(self, button: str) -> bool:
        return button in self._held

    def _in_panel(self, px: float, py: float) -> bool:
        r = self.panel_rect
        return self.panel_visible and r is not None and r[0] <= px <= r[2] and r[1] <= py <= r[3]

    def mouse_press(self, button: str, px: float, py: float) -> None:
        self._cursor = (px, py)
        if self._in_panel(px, py):
            return  # the panel's widgets own this click
        if button == RMB and self.drag_vertex is not None:
            self._end_drag()  # a right-click lets go of the grab
            return
        self._held.add(button)
        if button == LMB and self.positions is not None:
            v = pick_vertex(self.view(), self.positions, self.faces, px, py, self.pick_radius_px)
            if v is not None:
                self.drag_vertex = v
                self.drag_target = self.positions[v].copy()

    def mouse_release(self, button: str, px: float, py: float) -> None:
        self._held.discard(button)
        if button == LMB:
            self._end_drag()

    def _end_drag(self) -> None:
        if self.drag_vertex is not None:
            self._drag_released = True
        self.drag_vertex = None
        self.drag_target = None

    def mouse_move(self, px: float, py: float, *, shift: bool = False, ctrl: bool = False) -> None:
        """The cursor is at (px, py); held buttons drag with it."""
        if self._cursor is None:
            self._cursor = (px, py)
            return
        dx, dy = px - self._cursor[0], py - self._cursor[1]
        self._cursor = (px, py)
        if dx == 0 and dy == 0:
            return
        if RMB in self._held:
            if shift:
                self.camera.pan(dx, dy, self.height)
            elif ctrl:
                self.camera.zoom(math.exp(dy / self.height * 3.0))
            else:
                k = ORBIT_RAD_PER_HEIGHT / self.height
                self.camera.orbit(-dx * k, dy * k)
        elif MMB in self._held:
            self.camera.pan(dx, dy, self.height)
        if self.drag_vertex is not None and LMB in self._held:
            # the plane through the current target facing the (possibly moved) camera
            self.drag_target = drag_point(self.view(), px, py, self.drag_target)


class GGUIViewer:
    """A live GGUI window (see the module docstring for the controls).

    ``poll`` reads the window's input; ``draw`` renders the frame and the panel
    (frame, time, FPS, pause/step/reset buttons, a slider per tunable) and
    presents it. Call both every loop iteration, also while paused.

    window: an object with the ``ti.ui.Window`` interface to use instead of the
    process's shared window (tests pass an adapter around an off-screen window).
    """

    def __init__(self, *, pick_radius_px: float = 12.0, show_panel: bool = True, window: Any = None):
        self.pick_radius_px = pick_radius_px
        self.show_panel = show_panel
        self._given_window = window
        self._window = None
        self.info: ViewInfo | None = None
        self.controller: InputController | None = None
        self._drawer = None
        self._ti_camera = None
        self._tunables: dict[str, Any] = {}
        self._values: dict[str, float] = {}
        self._frame = 0
        self._time = 0.0
        self._fps = 0.0
        self._fps_count = 0
        self._fps_since: float | None = None
        self._last_draw: float | None = None
        self._closed = True
        self.status = ""  # the panel's one-line message (a rollback, a refused value)
        self.readout: dict[str, float] = {}  # energy (J) and such, from the runner

    # the panel's place, as fractions of the window; its size in pixels
    _PANEL_X, _PANEL_Y = 0.01, 0.01
    _PANEL_W_PX, _ROW_PX, _TITLE_PX = 340.0, 23.0, 36.0
    _WRAP = 44  # characters of a message line (ImGui's default font is 7 px wide)

    def _panel_size(self) -> tuple[float, float]:
        """Panel (width, height) as fractions of the window."""
        logs = sum(1 for t in self._tunables.values() if t.log and t.low > 0)
        # overlay (time, FPS, energy), message (2 lines), a label + slider each (+ halve /
        # double for log ranges), pause / step / reset
        rows = 3 + 2 + 2 * len(self._tunables) + 2 * logs + 3
        w, h = max(self.info.render.width, 1), max(self.info.render.height, 1)
        return (
            min(0.45, self._PANEL_W_PX / w),
            min(0.95, (self._TITLE_PX + self._ROW_PX * rows) / h),
        )

    def open(self, info: ViewInfo) -> None:
        import taichi as ti

        from tisim import backend
        from tisim.render.offscreen import SceneDrawer, acquire_window

        backend.current()
        r = info.render
        self.info = info
        if self._given_window is not None:
            self._window = self._given_window
        else:
            self._window = acquire_window(r.width, r.height, show=True, title=info.title)
        self._drawer = SceneDrawer(info)
        self._ti_camera = ti.ui.Camera()
        self._tunables = {t.name: t for t in info.tunables}
        self._values = {t.name: float(t.value) for t in info.tunables}
        w, h = r.width, r.height
        rect = None
        if self.show_panel:
            pw, ph = self._panel_size()
            rect = (
                self._PANEL_X * w,
                self._PANEL_Y * h,
                (self._PANEL_X + pw) * w,
                (self._PANEL_Y + ph) * h,
            )
        self.controller = InputController(
            OrbitCamera.from_config(info.camera),
            w,
            h,
            info.faces,
            pick_radius_px=self.pick_radius_px,
            panel_rect=rect,
        )
        self._closed = False
        self._last_draw = None
        self._fps_since, self._fps_count, self._fps = None, 0, 0.0
        self.status = ""

    def notify(self, message: str, *, pause: bool = False, values: dict | None = None) -> None:
        """Show ``message`` in the panel (one line); ``pause`` pauses the loop; ``values``:
        tunables whose value the loop changed (the grab stiffness after a rollback)."""
        self.status = message
        if pause and self.controller is not None:
            self.controller.request(pause=True)
        for k, v in (values or {}).items():
            if k in self._values:
                self._values[k] = float(v)

    def set_readout(self, values: dict[str, float]) -> None:
        """Quantities of the frame about to be drawn (``energy`` in J) for the overlay."""
        self.readout = dict(values)

    def overlay_lines(self) -> list[str]:
        """The overlay's text: time and frame, FPS, energy where the solver reports it."""
        c = self.controller
        lines = [
            f"t = {self._time:.3f} s   frame {self._frame}",
            f"{self._fps:.1f} FPS" + ("   (paused)" if c is not None and c.paused else ""),
        ]
        e = self.readout.get("energy")
        if e is not None and math.isfinite(e):
            lines.append(f"energy {e:.4g} J")
        return lines

    @property
    def running(self) -> bool:
        if self._closed or self._window is None:
            return False
        return bool(self._window.running) and not self.controller.quit

    # input ------------------------------------------------------------------
    def _cursor_px(self) -> tuple[float, float]:
        x, y = self._window.get_cursor_pos()  # [0, 1]^2, y up
        return x * self.controller.width, (1.0 - y) * self.controller.height

    def poll(self) -> ViewerEvents:
        import taichi as ti

        if self._closed:
            return ViewerEvents(quit=True)
        c = self.controller
        win = self._window
        w, h = win.get_window_shape()
        c.set_size(w, h)
        presses = [e.key for e in win.get_events(ti.ui.PRESS)]
        releases = [e.key for e in win.get_events(ti.ui.RELEASE)]
        px, py = self._cursor_px()
        shift = win.is_pressed(ti.ui.SHIFT)
        ctrl = win.is_pressed(ti.ui.CTRL)
        c.mouse_move(px, py, shift=shift, ctrl=ctrl)
        # GGUI gives presses and releases as separate lists: a button held before
        # this poll that shows up in both was released first, then pressed again
        early = [k for k in releases if k in presses and c.is_held(k)]
        for k in early:
            self._release(k, px, py)
        for k in presses:
            if k in (LMB, MMB, RMB):
                c.mouse_press(k, px, py)
            else:
                c.key_press(k)
        for k in releases:
            if k not in early:
                self._release(k, px, py)
        if not win.running:
            c.quit = True
        return c.take_events()

    def _release(self, key: str, px: float, py: float) -> None:
        if key in (LMB, MMB, RMB):
            self.controller.mouse_release(key, px, py)

    # drawing ----------------------------------------------------------------
    def draw(self, frame: int, time: float, positions: np.ndarray, extra_points: np.ndarray | None = None) -> None:
        from tisim.render.offscreen import setup_camera_and_lights

        if self._closed:
            return
        # frames shown per second over windows of at least a second: the figure GGUI's
        # window title shows, so the panel and the title agree
        now = _time.perf_counter()
        if self._fps_since is None:
            self._fps_since, self._fps_count = now, 0
        self._fps_count += 1
        if now - self._fps_since >= 1.0:
            self._fps = self._fps_count / (now - self._fps_since)
            self._fps_since, self._fps_count = now, 0
        self._last_draw = now
        self._frame, self._time = frame, time
        c = self.controller
        x = np.asarray(positions, dtype=np.float64)
        c.set_positions(x)
        self._drawer.update(x, time, extra_points)
        if c.drag_vertex is not None and c.drag_target is not None:
            self._drawer.set_marker(x[c.drag_vertex], c.drag_target)
        else:
            self._drawer.set_marker(None, None)
        win = self._window
        scene = win.get_scene()
        setup_camera_and_lights(scene, self._ti_camera, c.view())
        self._drawer.draw(scene)
        canvas = win.get_canvas()
        canvas.set_background_color(tuple(float(v) for v in self.info.render.background))
        canvas.scene(scene)
        if self.show_panel and c.panel_visible:
            self._draw_panel(win.get_gui())
        win.show()

    def _draw_panel(self, gui) -> None:
        import textwrap

        from tisim.render import panel

        c = self.controller
        pw, ph = self._panel_size()
        with gui.sub_window("tisim", self._PANEL_X, self._PANEL_Y, pw, ph) as g:
            for line in self.overlay_lines():
                g.text(line)
            for line in textwrap.wrap(self.status, self._WRAP)[:2] or [""]:
                g.text(line, color=(1.0, 0.85, 0.3))
            for name, t in self._tunables.items():
                v = self._values[name]
                g.text(panel.label(name, v))
                # "##" hides the slider's own label (the line above names it) but keeps it
                # as imgui's widget id; the slider runs in the unit the label shows
                _, f = panel.unit(name)
                lo, hi = panel.slider_range(t)
                shown = min(max(v * f, lo), hi)
                new = g.slider_float(f"##{name}", shown, lo, hi)
                # imgui holds floats in f32: an untouched slider returns the value rounded
                # to f32, which must not count as a change
                new = panel.shown_value(t, new / f) if np.float32(new) != np.float32(shown) else v
                if t.log and t.low > 0:
                    if g.button(f"halve##{name}"):
                        new = panel.shown_value(t, 0.5 * v)
                    if g.button(f"double##{name}"):
                        new = panel.shown_value(t, 2.0 * v)
                if new != v:
                    self._values[name] = new
                    c.set_tunable(name, new)
            if g.button("resume" if c.paused else "pause"):
                c.request(pause=not c.paused)
            if g.button("step"):
                c.request(step=True)
            if g.button("reset"):
                c.request(reset=True)

    def close(self) -> None:
        """Close the window (safe to call repeatedly)."""
        from tisim.render.offscreen import release_window

        if self._closed:
            return
        self._closed = True
        self._drawer = None
        if self._given_window is None:
            release_window()
        self._window = None
