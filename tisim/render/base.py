"""The viewer interface: what the runner hands a viewer and what it gets back.

A viewer receives numpy arrays only (surface faces once, positions every frame)
and knows nothing about solvers. Implementations: ``NullViewer`` (here),
``OffscreenRenderer`` (GGUI without a window, ``offscreen.py``) and ``GGUIViewer``
(live window with picking and a parameter panel, ``ggui.py``).

The runner's loop with a live viewer::

    viewer.open(info)
    while viewer.running:
        ev = viewer.poll()             # what the user did since the last poll
        if ev.quit: break
        if not ev.paused or ev.step_once: step()
        viewer.draw(frame, t, x)       # also while paused: it presents and handles input
    viewer.close()
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from tisim.contact.colliders import Collider
    from tisim.solvers.base import Tunable

log = logging.getLogger(__name__)


class ViewerUnavailable(RuntimeError):
    """The requested viewer cannot run here (no display, no Vulkan driver)."""


def _default_camera():
    from tisim.scene import CameraConfig

    return CameraConfig()


def _default_render():
    from tisim.scene import RenderConfig

    return RenderConfig()


@dataclass
class ViewInfo:
    """What a viewer needs to know once, before the first frame.

    faces: (k, 3) int surface triangles (outward, counter-clockwise) indexing the
    positions passed to ``draw``. vertex_count: n, the number of rows of those
    positions. colliders: drawn with ``collider.surface_mesh(t)``; moving ones are
    redrawn every frame, invisible ones skipped. camera: ``tisim.scene.CameraConfig``.
    render: ``tisim.scene.RenderConfig`` (width, height in pixels, background and
    object colour as RGB in [0, 1], fps). title: window title.
    object_vertex_ranges: optional ``(start, stop)`` vertex ranges (or slices), one
    per object; with them every object gets its own colour, from ``object_colors``
    (RGB in [0, 1]) or a built-in palette starting at ``render.color``.
    tunables: ``tisim.solvers.base.Tunable`` values the live panel shows as sliders.
    """

    faces: np.ndarray
    vertex_count: int
    colliders: Sequence[Collider] = ()
    camera: Any = field(default_factory=_default_camera)
    render: Any = field(default_factory=_default_render)
    title: str = "tisim"
    object_vertex_ranges: Sequence[tuple[int, int] | slice] | None = None
    object_colors: Sequence[tuple[float, float, float]] | None = None
    tunables: Sequence[Tunable] = ()
    colors: np.ndarray | None = None  # (n, 3) per-vertex RGB overriding the object colours
    # (k, 3) RGB per face of ``faces``, overriding both: the surface is drawn with a corner
    # per face and vertex, so a pattern (a cloth's UV checker) keeps sharp edges
    face_colors: np.ndarray | None = None
    # a floor drawn (no physics) when the scene has no plane collider: (point (3,), unit
    # normal (3,)) in metres, from :func:`drawn_ground`; None: no floor
    ground: tuple[np.ndarray, np.ndarray] | None = None
    # vertices held by handles (clamps, grips): their faces are drawn in the clamp colour
    held_vertices: np.ndarray | None = None

    def __post_init__(self) -> None:
        f = np.asarray(self.faces)
        if f.ndim != 2 or f.shape[1] != 3:
            raise ValueError(f"faces must be (k, 3), got {f.shape}")
        self.faces = f.astype(np.int32)
        self.vertex_count = int(self.vertex_count)
        if len(f) and (f.min() < 0 or f.max() >= self.vertex_count):
            raise ValueError(f"faces index outside 0..{self.vertex_count - 1}")
        if self.face_colors is not None and np.shape(self.face_colors) != (len(f), 3):
            raise ValueError(f"face_colors must be ({len(f)}, 3), got {np.shape(self.face_colors)}")

    def vertex_colors(self) -> np.ndarray | None:
        """(n, 3) float per-vertex colours: ``colors`` when given, else from the object
        ranges, or None without them."""
        if self.colors is not None:
            return np.asarray(self.colors, dtype=np.float64)
        if not self.object_vertex_ranges:
            return None
        colors = np.empty((self.vertex_count, 3))
        colors[:] = self.render.color
        for i, r in enumerate(self.object_vertex_ranges):
            start, stop = (r.start, r.stop) if isinstance(r, slice) else r
            if self.object_colors is not None and i < len(self.object_colors):
                c = self.object_colors[i]
            elif i == 0:
                c = self.render.color
            else:
                c = PALETTE[(i - 1) % len(PALETTE)]
            colors[start:stop] = c
        return colors


def drawn_ground(positions: np.ndarray, colliders=(), gravity=(0.0, -9.81, 0.0)):
    """(point, normal) of a floor to draw under a scene without a plane collider, or None
    when it has one: perpendicular to gravity (y up without gravity), a quarter of the
    scene's size below its lowest point (the objects and the other colliders at t = 0),
    so what holds an object up (a clamp, a handle) reads as holding it above the floor."""
    if any(c.kind == "plane" and getattr(c, "visible", True) for c in colliders):
        return None
    g = np.asarray(gravity, dtype=np.float64)
    up = -g / np.linalg.norm(g) if np.linalg.norm(g) > 0 else np.array([0.0, 1.0, 0.0])
    pts = [np.asarray(positions, dtype=np.float64).reshape(-1, 3)]
    for c in colliders:
        if c.kind != "plane" and getattr(c, "visible", True):
            pts.append(np.asarray(c.surface_mesh(0.0)[0], dtype=np.float64))
    p = np.concatenate(pts)
    p = p[np.all(np.isfinite(p), axis=1)]
    if not len(p):
        return None
    h = p @ up
    size = float(np.linalg.norm(p.max(axis=0) - p.min(axis=0)))
    point = p.mean(axis=0) - (p.mean(axis=0) @ up) * up + (h.min() - 0.25 * size) * up
    return point, up


CLAMP_COLOR = (0.30, 0.34, 0.42)  # faces held by a handle: the clamp or grip that moves the object

# colours for the 2nd, 3rd, ... object (the first uses render.color)
PALETTE = (
    (0.30, 0.55, 0.85),
    (0.45, 0.75, 0.35),
    (0.85, 0.75, 0.30),
    (0.65, 0.40, 0.75),
    (0.35, 0.75, 0.75),
    (0.80, 0.35, 0.45),
)


@dataclass
class ViewerEvents:
    """What the user did since the last ``poll``.

    paused: the current pause state (not a toggle). step_once: advance one step
    while paused. reset: restart from the initial state. quit: stop the run.
    drag_vertex: index of the vertex being dragged, or None. drag_target: (3,)
    world point (metres) the dragged vertex should follow, or None.
    drag_released: the drag ended since the last poll. tunable_changes: name ->
    new value of the panel's sliders.
    """

    paused: bool = False
    step_once: bool = False
    reset: bool = False
    quit: bool = False
    drag_vertex: int | None = None
    drag_target: np.ndarray | None = None
    drag_released: bool = False
    tunable_changes: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Viewer(Protocol):
    """What every viewer implements; see the module docstring for the loop."""

    def open(self, info: ViewInfo) -> None: ...

    def draw(self, frame: int, time: float, positions: np.ndarray, extra_points: np.ndarray | None = None) -> None: ...

    def poll(self) -> ViewerEvents: ...

    def close(self) -> None: ...

    @property
    def running(self) -> bool: ...


class NullViewer:
    """A viewer that draws nothing (headless runs, benchmarks)."""

    def __init__(self) -> None:
        self.info: ViewInfo | None = None
        self.frames_drawn = 0

    def open(self, info: ViewInfo) -> None:
        self.info = info

    def draw(self, frame: int, time: float, positions: np.ndarray, extra_points: np.ndarray | None = None) -> None:
        self.frames_drawn += 1

    def poll(self) -> ViewerEvents:
        return ViewerEvents()

    def close(self) -> None:
        pass

    @property
    def running(self) -> bool:
        return True


# ---------------------------------------------------------------------------
# capabilities


def display_available() -> bool:
    """Whether a window can be shown: $DISPLAY or $WAYLAND_DISPLAY on Linux/BSD;
    always True on macOS and Windows."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


_PROBE = """
import taichi as ti
ti.init(arch=ti.cpu, log_level=ti.ERROR, offline_cache=False)
w = ti.ui.Window("probe", (16, 16), show_window=False)
c = w.get_canvas()
c.set_background_color((1.0, 0.0, 0.0))
img = w.get_image_buffer_as_numpy()
assert img.shape == (16, 16, 4) and img[..., 0].mean() > 0.9, img.shape
w.destroy()
"""


def _libvulkan_loadable() -> bool:
    import ctypes

    names = {"win32": ["vulkan-1.dll"], "darwin": ["libvulkan.1.dylib", "libMoltenVK.dylib"]}
    for name in names.get(sys.platform, ["libvulkan.so.1", "libvulkan.so"]):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def vulkan_available() -> bool:
    """Whether GGUI can render here (Vulkan loader + a driver, hardware or lavapipe).

    $TISIM_VULKAN=0/1 overrides. Otherwise, after checking that the Vulkan loader
    loads, a tiny off-screen GGUI render is tried in a subprocess (about a second),
    because a missing or broken driver can abort the process that tries it. The
    answer is cached for the process.
    """
    forced = os.environ.get("TISIM_VULKAN")
    if forced in ("0", "1"):
        return forced == "1"
    return _probe_vulkan()


@functools.lru_cache(maxsize=1)
def _probe_vulkan() -> bool:
    if not _libvulkan_loadable():
        log.info("Vulkan loader not found: GGUI rendering unavailable")
        return False
    with tempfile.TemporaryDirectory() as tmp:  # GGUI leaves imgui.ini in its cwd
        try:
            r = subprocess.run([sys.executable, "-c", _PROBE], cwd=tmp, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.info("Vulkan probe failed: %s", exc)
            return False
    if r.returncode != 0:
        log.info("Vulkan probe failed (exit %d): %s", r.returncode, r.stderr.strip()[-500:])
        return False
    return True


# a cloth's checker

CHECKER_SQUARES = 8  # along a cloth's longer side (per unit of UV on a mesh that is no grid)


def _grid_cells(values: np.ndarray) -> int:
    """Cells of a regular grid whose vertex coordinates are ``values`` (one UV axis), or 0
    when they are not evenly spaced (a user's mesh)."""
    u = np.unique(np.round(values, 9))
    if len(u) < 2 or len(u) > 1 + len(values) // 2:
        return 0
    du = np.diff(u)
    return len(du) if np.allclose(du, du.mean(), rtol=1e-6, atol=1e-12) else 0


def checker(uv: np.ndarray, face_uv: np.ndarray) -> np.ndarray:
    """(m,) 0 / 1 checker of a cloth's faces from their UV centroids. On a grid (the
    generated rectangles) a square is a whole number of cells, the same along u and v,
    ``CHECKER_SQUARES`` along the longer side: its edges run along mesh edges, sharp and
    straight. Otherwise ``CHECKER_SQUARES`` squares per unit of UV, which shows the user's
    UV layout (a square's edge then cuts faces and steps along them)."""
    cu, cv = _grid_cells(uv[:, 0]), _grid_cells(uv[:, 1])
    if cu and cv:
        k = max(1, round(max(cu, cv) / CHECKER_SQUARES))
        lo = uv.min(axis=0)
        scale = np.array([cu, cv]) / (np.ptp(uv, axis=0) * k)
    else:
        lo, scale = np.zeros(2), np.full(2, float(CHECKER_SQUARES))
    c = (uv[face_uv].mean(axis=1) - lo) * scale  # (m, 2) in squares
    return np.floor(c).sum(axis=1) % 2


def checker_colors(faces: np.ndarray, uv: np.ndarray | None, face_uv: np.ndarray | None, color) -> np.ndarray:
    """(m, 3) face colours of one cloth: ``color`` with the UV :func:`checker` darkening
    every other square (plain without UVs). ``face_uv`` None: one UV per vertex."""
    out = np.tile(np.asarray(color, dtype=np.float64), (len(faces), 1))
    if uv is not None:
        check = checker(np.asarray(uv, dtype=np.float64), faces if face_uv is None else face_uv)
        out *= (0.65 + 0.35 * check)[:, None]
    return out
