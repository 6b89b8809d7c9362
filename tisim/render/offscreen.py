"""GGUI rendering without a window, the shared GGUI window, and the scene drawer.

Taichi's GGUI supports one window per process reliably, and a window that
outlives a ``ti.reset()`` crashes the process when it is garbage-collected after
a new one exists. So the window lives here, module-wide: ``acquire_window``
reuses it when the size and mode match, and otherwise (or after a Taichi reset)
destroys the old one *before* creating the next. It is destroyed at exit.
GGUI writes ``imgui.ini`` into the current directory when a window is destroyed;
that is done from a temporary folder so runs do not litter the user's folder.

``SceneDrawer`` owns the f32 Taichi fields GGUI draws from (allocated once per
``open``; only positions and normals change per frame) and is shared by the
off-screen renderer and the live viewer.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tisim.render.base import ViewerEvents, ViewInfo
from tisim.render.camera import CameraView, vertex_normals
from tisim.render.video import FrameWriter

log = logging.getLogger(__name__)

COLLIDER_COLOR = (0.62, 0.64, 0.68)
PLANE_COLOR = (0.42, 0.44, 0.48)
POINT_COLOR = (0.25, 0.85, 0.95)
DRAG_COLOR = (1.0, 0.9, 0.15)

# ---------------------------------------------------------------------------
# the one GGUI window of the process

_window: Any = None  # ti.ui.Window
_window_key: tuple | None = None  # (width, height, show_window)
_window_runtime: Any = None  # the Taichi runtime it was created under


@contextlib.contextmanager
def _in_scratch_dir():
    """Run a block with the cwd in a private temp folder (GGUI drops imgui.ini there)."""
    scratch = Path(tempfile.gettempdir()) / f"tisim-ggui-{getattr(os, 'getuid', lambda: 0)()}"
    try:
        scratch.mkdir(exist_ok=True)
        old = os.getcwd()
    except OSError:
        yield
        return
    os.chdir(scratch)
    try:
        yield
    finally:
        os.chdir(old)


def acquire_window(width: int, height: int, *, show: bool, title: str = "tisim"):
    """The process's GGUI window at (width, height) pixels, created or reused.

    Taichi must be initialised (``tisim.backend.init``) before.
    """
    global _window, _window_key, _window_runtime
    import taichi as ti
    from taichi.lang import impl

    key = (int(width), int(height), bool(show))
    runtime = impl.get_runtime()
    if _window is not None and _window_key == key and _window_runtime is runtime:
        return _window
    release_window()
    # fps_limit keeps a paused live viewer from spinning a core; off-screen it is moot
    _window = ti.ui.Window(title, (key[0], key[1]), vsync=False, show_window=show, fps_limit=120)
    _window_key = key
    _window_runtime = runtime
    return _window


def release_window() -> None:
    """Destroy the shared window, if any (safe to call at any time, also twice)."""
    global _window, _window_key, _window_runtime
    if _window is None:
        return
    w, _window, _window_key, _window_runtime = _window, None, None, None
    with _in_scratch_dir():
        try:
            w.destroy()
        except Exception as exc:  # destroying must never take the run down
            log.debug("GGUI window destroy failed: %s", exc)


atexit.register(release_window)


# ---------------------------------------------------------------------------
# scene drawing


def _flat_mesh(V: np.ndarray, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unweld a triangle mesh (one vertex per corner) so per-vertex normals are flat."""
    return V[F.reshape(-1)], np.arange(3 * len(F)).reshape(-1, 3)


class _MeshFields:
    """f32 vertex/normal fields and an index field of one fixed-topology mesh."""

    def __init__(self, vertex_count: int, faces: np.ndarray, colors: np.ndarray | None = None):
        import taichi as ti

        n = max(int(vertex_count), 1)
        self.vertex_count = int(vertex_count)
        self.faces = np.asarray(faces, dtype=np.int32)
        self.x = ti.Vector.field(3, ti.f32, shape=n)
        self.n = ti.Vector.field(3, ti.f32, shape=n)
        self.idx = ti.field(ti.i32, shape=max(3 * len(self.faces), 3))
        if len(self.faces):
            self.idx.from_numpy(self.faces.reshape(-1))
        self.colors = None
        if colors is not None:
            self.colors = ti.Vector.field(3, ti.f32, shape=n)
            self.colors.from_numpy(np.asarray(colors, dtype=np.float32))

    def update(self, positions: np.ndarray) -> None:
        x = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
        self.x.from_numpy(x.astype(np.float32))
        self.n.from_numpy(vertex_normals(x, self.faces).astype(np.float32))

    def draw(self, scene, color) -> None:
        if not len(self.faces):
            return
        scene.mesh(
            self.x,
            indices=self.idx,
            normals=self.n,
            color=tuple(color),
            per_vertex_color=self.colors,
            two_sided=True,
        )


class SceneDrawer:
    """Everything a ViewInfo describes, as GGUI draw calls.

    ``update`` takes the frame's positions (n, 3) in metres, the time in seconds
    and optional extra points (p, 3); ``draw`` issues the draw calls on a GGUI scene.
    """

    def __init__(self, info: ViewInfo):
        import taichi as ti

        self.info = info
        self.surface = _MeshFields(info.vertex_count, info.faces, info.vertex_colors())
        cam = info.camera
        cam_dist = float(np.linalg.norm(np.subtract(cam.position, cam.lookat)))
        self._plane_extent = max(4.0, 3.0 * cam_dist)
        self.colliders: list[tuple[Any, _MeshFields, bool, tuple]] = []
        for c in info.colliders:
            if not getattr(c, "visible", True):
                continue
            V, F = self._collider_mesh(c, 0.0)
            fields = _MeshFields(len(V), F)
            fields.update(V)
            color = PLANE_COLOR if c.kind == "plane" else COLLIDER_COLOR
            self.colliders.append((c, fields, c.is_moving(), color))
        self._points = None
        self._point_count = 0
        self._marker = ti.Vector.field(3, ti.f32, shape=2)  # dragged vertex and its target
        self._marker_on = False
        self.radius = 0.01  # particle radius, metres; set from the object size on the first frame
        self._sized = False
        self.time = 0.0

    def _collider_mesh(self, c, t: float) -> tuple[np.ndarray, np.ndarray]:
        if c.kind == "plane":
            V, F = c.surface_mesh(t, extent=self._plane_extent)
        else:
            V, F = c.surface_mesh(t)
        V, F = np.asarray(V, dtype=np.float64), np.asarray(F, dtype=np.int64)
        if c.kind != "sphere":  # flat faces look right only with unwelded corners
            V, F = _flat_mesh(V, F)
        return V, F

    def update(
        self, positions: np.ndarray, time: float, extra_points: np.ndarray | None = None
    ) -> None:
        x = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
        if len(x) != self.info.vertex_count:
            raise ValueError(f"expected {self.info.vertex_count} positions, got {len(x)}")
        self.surface.update(x)
        if not self._sized and len(x):
            # 0.6 % of the object's size, but at least ~2 pixels at the camera's distance
            diag = float(np.linalg.norm(x.max(0) - x.min(0)))
            cam = self.info.camera
            dist = float(np.linalg.norm(np.subtract(cam.position, cam.lookat)))
            pixel = 2.0 * dist * math.tan(math.radians(cam.fov) / 2.0) / self.info.render.height
            self.radius = max(0.006 * diag, 2.0 * pixel, 1e-6)
            self._sized = True
        if time != self.time:
            for c, fields, moving, _ in self.colliders:
                if moving:
                    fields.update(self._collider_mesh(c, time)[0])
        self.time = time
        self._set_points(extra_points)

    def _set_points(self, pts: np.ndarray | None) -> None:
        import taichi as ti

        if pts is None or len(pts) == 0:
            self._point_count = 0
            return
        p = np.asarray(pts, dtype=np.float32).reshape(-1, 3)
        if self._points is None or self._points.shape[0] < len(p):
            # grow geometrically: allocating fields every frame would leak SNode trees
            cap = max(16, 2 * len(p))
            self._points = ti.Vector.field(3, ti.f32, shape=cap)
        buf = np.zeros((self._points.shape[0], 3), np.float32)
        buf[: len(p)] = p
        self._points.from_numpy(buf)
        self._point_count = len(p)

    def set_marker(self, vertex_pos: np.ndarray | None, target: np.ndarray | None) -> None:
        """Show a drag line from ``vertex_pos`` to ``target`` (both (3,)), or hide it."""
        if vertex_pos is None or target is None:
            self._marker_on = False
            return
        self._marker.from_numpy(np.array([vertex_pos, target], dtype=np.float32))
        self._marker_on = True

    def draw(self, scene) -> None:
        self.surface.draw(scene, self.info.render.color)
        for _, fields, _, color in self.colliders:
            fields.draw(scene, color)
        if self._point_count:
            scene.particles(
                self._points, radius=self.radius, color=POINT_COLOR, index_count=self._point_count
            )
        if self._marker_on:
            scene.lines(self._marker, width=2.0, color=DRAG_COLOR)
            scene.particles(
                self._marker,
                radius=1.5 * self.radius,
                color=DRAG_COLOR,
                index_offset=1,
                index_count=1,
            )


def setup_camera_and_lights(scene, ti_camera, view: CameraView) -> None:
    """Point the GGUI camera along ``view`` and place a light above and beside the eye
    (a head light keeps whatever the user orbits to lit)."""
    right, up, _ = view.basis()
    dist = float(np.linalg.norm(view.target - view.eye))
    ti_camera.position(*view.eye.tolist())
    ti_camera.lookat(*view.target.tolist())
    ti_camera.up(*view.up.tolist())
    ti_camera.fov(view.fov)
    ti_camera.z_near(min(0.1, 0.05 * dist))
    ti_camera.z_far(max(1000.0, 100.0 * dist))
    scene.set_camera(ti_camera)
    light = view.eye + dist * (0.6 * up + 0.4 * right)
    scene.point_light(tuple(light.tolist()), (0.85, 0.85, 0.85))
    scene.ambient_light((0.3, 0.3, 0.3))


def buffer_to_image(buf: np.ndarray) -> np.ndarray:
    """GGUI's (W, H, 4) float buffer (row 0 at the bottom) -> (H, W, 3) uint8, top row first."""
    rgb = np.asarray(buf)[:, ::-1, :3].transpose(1, 0, 2)
    return np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------


class OffscreenRenderer:
    """Renders frames with GGUI into memory (no window, no display needed).

    ``draw`` renders the surface mesh, the colliders and extra points with the
    scene's camera; ``image()`` returns the last frame as (H, W, 3) uint8, top row
    first, and ``save_png`` writes it. With ``frames`` every drawn frame is also
    written to that ``FrameWriter``, and ``close()`` encodes the video
    (``video_path``, None when there is none).

    One instance may be opened again after ``close`` (tests share one); all
    renderers share the process's single GGUI window (see the module docstring).
    Needs Vulkan (``vulkan_available()``), lavapipe is enough.
    """

    def __init__(self, frames: FrameWriter | None = None):
        self.frames = frames
        self.video_path: Path | None = None
        self.info: ViewInfo | None = None
        self.view: CameraView | None = None
        self._drawer: SceneDrawer | None = None
        self._window = None
        self._ti_camera = None
        self._rendered = False
        self._image: np.ndarray | None = None

    def open(self, info: ViewInfo) -> None:
        import taichi as ti

        from tisim import backend

        backend.current()  # the window belongs to the Taichi runtime: make sure there is one
        r = info.render
        self.info = info
        self._window = acquire_window(r.width, r.height, show=False, title=info.title)
        self._drawer = SceneDrawer(info)
        self._ti_camera = ti.ui.Camera()
        self.view = CameraView.from_config(info.camera, r.width, r.height)
        self._rendered = False
        self._image: np.ndarray | None = None
        self.video_path = None

    def set_view(self, view: CameraView) -> None:
        """Render from ``view`` instead of the scene's camera (its size must match)."""
        if self.info is not None and (view.width, view.height) != (
            self.info.render.width,
            self.info.render.height,
        ):
            raise ValueError("the view's size differs from the render size")
        self.view = view

    def _check_open(self) -> None:
        if self._drawer is None:
            raise RuntimeError("OffscreenRenderer is not open")

    def draw(
        self, frame: int, time: float, positions: np.ndarray, extra_points: np.ndarray | None = None
    ) -> None:
        self._check_open()
        self._drawer.update(positions, time, extra_points)
        self.render()
        if self.frames is not None:
            self.frames.write(self.image())

    def render(self) -> None:
        """Render the current geometry (``draw`` does this; call it after ``set_view``)."""
        self._check_open()
        window = self._window
        scene = window.get_scene()
        setup_camera_and_lights(scene, self._ti_camera, self.view)
        self._drawer.draw(scene)
        canvas = window.get_canvas()
        canvas.set_background_color(tuple(float(c) for c in self.info.render.background))
        canvas.scene(scene)
        self._rendered = True
        # GGUI renders when the buffer is fetched and consumes the draw list, so a
        # second fetch would return an empty frame: fetch once, lazily, and keep it
        self._image = None

    def image(self) -> np.ndarray:
        """The last rendered frame, (H, W, 3) uint8, row 0 at the top."""
        self._check_open()
        if not self._rendered:
            raise RuntimeError("nothing rendered yet: call draw() first")
        if self._image is None:
            self._image = buffer_to_image(self._window.get_image_buffer_as_numpy())
        return self._image.copy()

    def save_png(self, path: str | Path) -> Path:
        import imageio.v3 as iio

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        iio.imwrite(path, self.image())
        return path

    def poll(self) -> ViewerEvents:
        return ViewerEvents()

    @property
    def running(self) -> bool:
        return True

    def close(self) -> None:
        """Finish the video (if recording) and drop the scene's fields; the shared
        window stays for the next ``open``. Safe to call repeatedly."""
        if self.frames is not None and self._drawer is not None:
            self.video_path = self.frames.finish()
        self._drawer = None
        self._ti_camera = None
        self._window = None
