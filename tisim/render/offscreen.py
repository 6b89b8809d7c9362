"""GGUI rendering without a window, the shared GGUI window, and the scene drawer.

Taichi's GGUI supports one window per process reliably, and a window that
outlives a ``ti.reset()`` crashes the process when it is garbage-collected after
a new one exists. So the window lives here, module-wide: ``acquire_window``
reuses it when the size and mode match, and otherwise (or after a Taichi reset)
destroys the old one *before* creating the next. It is destroyed at exit.
GGUI writes ``imgui.ini`` into the current directory when a window is destroyed;
that is done from a temporary folder so runs do not litter the user's folder.

``SceneDrawer`` owns the f32 host arrays GGUI draws from (allocated once per ``open``;
only positions and normals change per frame; :mod:`tisim.render.host_draw`) and is
shared by the off-screen renderer and the live viewer.
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
COLLIDER_STRIPE = (0.36, 0.38, 0.43)  # the darker stripes / checks on round colliders
PLANE_COLOR = (0.42, 0.44, 0.48)
PLANE_CHECK = (0.37, 0.39, 0.43)  # alternate floor tiles
SHADOW_DARKNESS = 0.55  # the umbra is the floor's colour times this
STRIPES = 12  # stripes around a cylinder, checks around a sphere
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


class _MeshBuffers:
    """The vertex buffer (f32 positions, normals, colours in GGUI's layout), indices and
    identity transform of one fixed-topology mesh, as host arrays
    (:mod:`tisim.render.host_draw`: no Taichi fields, so nothing to compile)."""

    def __init__(
        self,
        vertex_count: int,
        faces: np.ndarray,
        colors: np.ndarray | None = None,
        color=(1.0, 1.0, 1.0),
    ):
        from tisim.render import host_draw

        n = max(int(vertex_count), 1)
        self.vertex_count = int(vertex_count)
        self.faces = np.asarray(faces, dtype=np.int32)
        self.vbo = host_draw.vertex_buffer(n)
        self.idx = np.ascontiguousarray(self.faces.reshape(-1)) if len(self.faces) else np.zeros(3, np.int32)
        # per-vertex colours on every mesh (uniform when none are given): one draw path
        self.set_colors(np.broadcast_to(np.asarray(colors if colors is not None else color, dtype=np.float32), (n, 3)))
        self.model = np.eye(4, dtype=np.float32)[None]  # identity: see ``draw``

    def set_colors(self, rgb: np.ndarray) -> None:
        """Per-vertex colours (n, 3), opaque."""
        self.vbo[:, 8:11] = rgb
        self.vbo[:, 11] = 1.0

    def update(self, positions: np.ndarray, normals: np.ndarray | None = None) -> None:
        """New positions (n, 3); normals (n, 3), or (3,) for all, default: from the faces."""
        x = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
        self.vbo[:, 0:3] = x
        if normals is None:
            nrm = vertex_normals(x, self.faces)
        else:
            nrm = np.broadcast_to(np.asarray(normals, dtype=np.float64), x.shape)
        self.vbo[:, 3:6] = nrm

    def draw(self, scene, color) -> None:
        """Draw as one instance with an identity model matrix, never as a plain mesh:
        Taichi 1.7.4's mesh shader computes ``I (1 - a) + M a`` with a = 0 and M read
        from a per-draw storage buffer that ``scene.mesh`` leaves uninitialised, so a
        NaN left in that memory (by anything allocated before) makes the whole mesh
        vanish, at random (seen as a floor or an object missing from some frames)."""
        if not len(self.faces):
            return
        from tisim.render import host_draw

        host_draw.mesh(scene, self.vbo, self.idx, self.model, color)


CREASE_DEGREES = 40.0  # faces meeting at a sharper angle (at rest) are shaded apart


def crease_matrix(positions: np.ndarray, faces: np.ndarray, degrees: float = CREASE_DEGREES):
    """(3k, k) sparse 0/1 matrix: corner i (face i // 3, its vertex i % 3) averages the
    normals of the faces around its vertex that meet its own face at less than
    ``degrees`` in ``positions`` (the rest shape). Times the area-weighted face normals it
    gives corner normals that are smooth across a curved surface and flat on the faces of
    a box (no dark bands along its edges)."""
    import scipy.sparse as sp

    x = np.asarray(positions, dtype=np.float64)
    F = np.asarray(faces, dtype=np.int64)
    k, n = len(F), len(x)
    fn = np.cross(x[F[:, 1]] - x[F[:, 0]], x[F[:, 2]] - x[F[:, 0]])
    u = fn / np.maximum(np.linalg.norm(fn, axis=1, keepdims=True), 1e-300)
    corner_vertex = F.reshape(-1)
    A = sp.csr_matrix((np.ones(3 * k), (corner_vertex, np.repeat(np.arange(k), 3))), shape=(n, k))
    P = sp.csr_matrix((np.ones(3 * k), (np.arange(3 * k), corner_vertex)), shape=(3 * k, n))
    M = (P @ A).tocoo()
    own = M.row // 3
    keep = np.einsum("ij,ij->i", u[own], u[M.col]) >= math.cos(math.radians(degrees)) - 1e-12
    return sp.csr_matrix((np.ones(int(keep.sum())), (M.row[keep], M.col[keep])), shape=(3 * k, k))


class _CreasedMesh(_MeshBuffers):
    """The objects' surface drawn with a corner per face and vertex: colours per corner
    (a cloth's checker keeps sharp edges) and normals smooth within a smooth region and
    split at creases (:func:`crease_matrix`, found in the first positions drawn, the rest
    shape). ``update`` takes the welded mesh's positions."""

    def __init__(self, vertex_count: int, faces: np.ndarray, corner_colors: np.ndarray):
        self.welded = np.asarray(faces, dtype=np.int64)
        self.corners = self.welded.reshape(-1)
        self.crease = None
        k = len(self.welded)
        super().__init__(3 * k, np.arange(3 * k).reshape(-1, 3), np.asarray(corner_colors))

    def update(self, positions: np.ndarray, normals: np.ndarray | None = None) -> None:
        x = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
        F = self.welded
        if normals is not None:
            nrm = np.broadcast_to(np.asarray(normals, dtype=np.float64), x.shape)[self.corners]
        elif not len(F):
            nrm = np.zeros((0, 3))
        else:
            if self.crease is None:
                self.crease = crease_matrix(x, F)
            fn = np.cross(x[F[:, 1]] - x[F[:, 0]], x[F[:, 2]] - x[F[:, 0]])
            nrm = self.crease @ fn
            length = np.linalg.norm(nrm, axis=1, keepdims=True)
            nrm = np.where(length > 0, nrm / np.where(length > 0, length, 1.0), [0.0, 1.0, 0.0])
        super().update(x[self.corners], nrm)


def _shadow_buffers(vertex_count: int, faces: np.ndarray, copies: int) -> _MeshBuffers:
    """Buffers for ``copies`` shadows of one caster in one mesh (one a light sample)."""
    n = vertex_count
    F = np.concatenate([faces + k * n for k in range(copies)])
    return _MeshBuffers(copies * n, F, np.zeros((copies * n, 3)))


def nice_length(x: float) -> float:
    """The largest 1, 2 or 5 times a power of ten that is <= ``x`` (> 0)."""
    e = math.floor(math.log10(x))
    for m in (5.0, 2.0, 1.0):
        if m * 10.0**e <= x * (1 + 1e-12):
            return m * 10.0**e
    return 10.0**e


def sun_direction(camera) -> np.ndarray:
    """(3,) unit vector towards the light that casts the shadows: high above (world up
    = the camera's up), a little to the camera's right and beyond the target, so the
    shadows fall to the left and towards the viewer, where they are seen. Fixed in the
    world: orbiting the live view does not swing them."""
    from tisim.render.camera import look_at_basis

    up = np.asarray(camera.up, dtype=np.float64)
    up = up / np.linalg.norm(up)
    right, _, forward = look_at_basis(camera.position, camera.lookat, up)
    fwd_h = forward - (forward @ up) * up
    if np.linalg.norm(fwd_h) > 1e-9:
        fwd_h /= np.linalg.norm(fwd_h)
    d = up + 0.35 * right + 0.35 * fwd_h
    return d / np.linalg.norm(d)


def collider_pattern(c, points: np.ndarray, t: float) -> np.ndarray:
    """(k,) 0/1 pattern of the collider's material at world ``points`` (k, 3), time t:
    ``STRIPES`` stripes around a cylinder, a checker on a sphere, both in the body
    frame so they turn with it; 0 on other kinds."""
    if c.kind not in ("cylinder", "sphere"):
        return np.zeros(len(points), dtype=np.int64)
    from tisim.contact.colliders import _any_perpendicular

    local = (np.asarray(points, dtype=np.float64) - c.center(t)) @ c.orientation(t)  # body frame
    a = c.axis if c.kind == "cylinder" else np.array([0.0, 1.0, 0.0])
    u = _any_perpendicular(a)
    w = np.cross(a, u)
    angle = np.arctan2(local @ w, local @ u)
    sector = np.floor((angle + np.pi) / (2 * np.pi) * STRIPES).astype(np.int64)
    if c.kind == "cylinder":
        return sector % 2
    r = np.maximum(np.linalg.norm(local, axis=1), 1e-300)
    polar = np.arccos(np.clip(local @ a / r, -1, 1))
    band = np.floor(polar / np.pi * (STRIPES // 2)).astype(np.int64)
    return (sector + band) % 2


def _fog(dist: np.ndarray, radius: float) -> np.ndarray:
    """(k,) 0 -> 1 blend towards the background from 60 % to 100 % of ``radius``."""
    s = np.clip((np.asarray(dist) / radius - 0.6) / 0.4, 0.0, 1.0)
    return s * s * (3 - 2 * s)


class _Ground:
    """A plane collider drawn as a checkered floor: tiles of ``tile`` metres attached
    to the plane (a moving plane shows it), centred under the camera's target and
    fading into the background towards ``radius`` metres from there."""

    def __init__(self, c, info: ViewInfo, tile: float, radius: float):
        from tisim.contact.colliders import _any_perpendicular

        self.c = c
        self.radius = radius
        self._u = _any_perpendicular(c.normal)  # body-frame tile directions
        self._w = np.cross(c.normal, self._u)
        p, n, u, w = self.frame(0.0)
        target = np.asarray(info.camera.lookat, dtype=np.float64)
        self.origin_uw = np.round(np.array([(target - p) @ u, (target - p) @ w]) / tile) * tile
        m = max(2, int(math.ceil(radius / tile)))
        iu, iw = (a.ravel() for a in np.meshgrid(np.arange(-m, m), np.arange(-m, m), indexing="ij"))
        corners = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], dtype=np.float64)
        quads = (np.stack([iu, iw], 1)[:, None, :] + corners[None]) * tile + self.origin_uw
        self.uw = quads[:, [0, 1, 2, 0, 2, 3], :].reshape(-1, 2)  # two triangles a tile
        check = ((iu + iw) % 2).repeat(6)
        base = np.where(check[:, None] == 1, np.array(PLANE_CHECK), np.array(PLANE_COLOR))
        V = self.vertices(0.0)
        self.fog_color = self._unlit_background(info, V, n)
        fade = self.fog(self.uw)[:, None]
        self.colors = (1 - fade) * base + fade * self.fog_color
        faces = np.arange(len(self.uw)).reshape(-1, 3)
        if np.dot(np.cross(V[1] - V[0], V[2] - V[0]), n) < 0:
            faces = faces[:, ::-1].copy()
        self.buffers = _MeshBuffers(len(V), faces, self.colors)
        self.buffers.update(V, n)

    @staticmethod
    def _unlit_background(info: ViewInfo, V: np.ndarray, n: np.ndarray) -> np.ndarray:
        """(k, 3) colours that GGUI's shading turns into the background at vertices V:
        the floor fades into them, so its far edge disappears (from the scene's camera)."""
        view = CameraView.from_config(info.camera, info.render.width, info.render.height)
        to_light = head_light(view) - V
        to_light /= np.linalg.norm(to_light, axis=1, keepdims=True)
        lit = AMBIENT + LIGHT * np.abs(to_light @ n)  # two-sided
        bg = np.asarray(info.render.background, dtype=np.float64)
        return np.clip(bg[None, :] / lit[:, None], 0.0, 1.0)

    def frame(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(point, unit normal, u, w) of the plane at time t, each (3,)."""
        R = self.c.orientation(t)
        return self.c.center(t), R @ self.c.normal, R @ self._u, R @ self._w

    def vertices(self, t: float) -> np.ndarray:
        p, _, u, w = self.frame(t)
        return p + self.uw[:, :1] * u + self.uw[:, 1:] * w

    def fog(self, uw: np.ndarray) -> np.ndarray:
        """(k,) fade towards the background at plane coordinates ``uw`` (k, 2), metres."""
        return _fog(np.linalg.norm(uw - self.origin_uw, axis=1), self.radius)


class SceneDrawer:
    """Everything a ViewInfo describes, as GGUI draw calls.

    ``update`` takes the frame's positions (n, 3) in metres, the time in seconds
    and optional extra points (p, 3); ``draw`` issues the draw calls on a GGUI scene.

    Depth cues (GGUI has no shadow maps): plane colliders are checkered floors fading
    into the background, and the objects and other colliders cast shadows on them,
    projected along ``sun_direction`` (a dark umbra over a lighter penumbra from a
    ring of tilted light directions: soft edges, and the gap between an object and
    its shadow shows its height). Cylinders are striped and spheres checkered in
    their own frame, so their rotation shows.
    """

    PENUMBRA_SAMPLES = 4
    PENUMBRA_SPREAD = 0.1  # how far the penumbra's light directions tilt, radians

    def __init__(self, info: ViewInfo):
        from tisim.render import host_draw

        self.info = info
        if info.face_colors is not None:
            corner_colors = np.repeat(np.asarray(info.face_colors, dtype=np.float64), 3, axis=0)
        else:
            vc = info.vertex_colors()
            corner_colors = (
                np.broadcast_to(np.asarray(info.render.color, dtype=np.float64), (3 * len(info.faces), 3))
                if vc is None
                else vc[np.asarray(info.faces).reshape(-1)]
            )
        if info.held_vertices is not None and len(info.held_vertices) and len(info.faces):
            from tisim.render.base import CLAMP_COLOR

            held = np.zeros(info.vertex_count, dtype=bool)
            held[np.asarray(info.held_vertices, dtype=np.int64)] = True
            clamp = np.repeat(held[np.asarray(info.faces)].all(axis=1), 3)
            corner_colors = np.where(clamp[:, None], np.asarray(CLAMP_COLOR), corner_colors)
        self.surface = _CreasedMesh(info.vertex_count, info.faces, corner_colors)
        cam = info.camera
        self._cam_dist = float(np.linalg.norm(np.subtract(cam.position, cam.lookat)))
        self.sun = sun_direction(cam)
        self.colliders: list[tuple[Any, _MeshBuffers, bool, tuple]] = []
        self._collider_vertices: list[np.ndarray] = []
        self.grounds: list[_Ground] = []
        tile = nice_length(self._cam_dist / 6.0)
        colliders = list(info.colliders)
        if info.ground is not None:  # a floor to draw only: the scene has no plane collider
            from tisim.contact.colliders import Collider

            point, normal = info.ground
            z = np.zeros(3)
            colliders.append(
                Collider(
                    name="ground (drawn)",
                    kind="plane",
                    position=np.asarray(point, float),
                    normal=np.asarray(normal, float),
                    radius=0.0,
                    axis=np.array([0.0, 1.0, 0.0]),
                    length=0.0,
                    half_extents=z,
                    rotation=np.eye(3),
                    velocity=z,
                    angular_velocity=z,
                )
            )
        for c in colliders:
            if not getattr(c, "visible", True):
                continue
            if c.kind == "plane":
                self.grounds.append(_Ground(c, info, tile, 3.0 * self._cam_dist))
                continue
            V, F, nrm = self._collider_mesh(c, 0.0)
            colors = None
            if c.kind in ("cylinder", "sphere"):
                pattern = collider_pattern(c, V[F].mean(axis=1), 0.0).repeat(3)
                colors = np.where(pattern[:, None] == 1, np.array(COLLIDER_STRIPE), np.array(COLLIDER_COLOR))
            buffers = _MeshBuffers(len(V), F, colors, COLLIDER_COLOR)
            buffers.update(V, nrm)
            self.colliders.append((c, buffers, c.is_moving(), COLLIDER_COLOR))
            self._collider_vertices.append(V)
        # shadows: per floor and caster (the surface, then each collider) one mesh that
        # holds a copy of the caster per light sample
        self._lights = self._light_samples()
        self._shadows: list[list[_MeshBuffers]] = []
        L = len(self._lights)
        casters = [(info.vertex_count, info.faces)]
        casters += [(f.vertex_count, f.faces) for _, f, _, _ in self.colliders]
        for _ in self.grounds:
            self._shadows.append([_shadow_buffers(nv, F, L) for nv, F in casters])
        self._shadow_on = False
        # (floor, caster) pairs whose shadow is drawn and cannot change: a still collider
        # over a still floor (the light is fixed in the world), projected once
        self._shadow_static: set[tuple[int, int]] = set()
        self._points = None
        self._point_count = 0
        self._marker = host_draw.vertex_buffer(2)  # dragged vertex and its target
        self._marker_on = False
        self.radius = 0.01  # particle radius, metres; set from the object size on the first frame
        self._sized = False
        self.time = 0.0

    def _light_samples(self) -> list[tuple[np.ndarray, float, float]]:
        """(unit direction, strength in [0, 1], lift in units of 1e-3 camera distances)
        of each shadow layer, in drawing order: the penumbra's tilted directions first,
        lighter and lower, then the umbra above them (no z-fighting between layers)."""
        from tisim.contact.colliders import _any_perpendicular

        d = self.sun
        u = _any_perpendicular(d)
        w = np.cross(d, u)
        out = []
        for k in range(self.PENUMBRA_SAMPLES):
            a = 2 * np.pi * k / self.PENUMBRA_SAMPLES
            dk = d + self.PENUMBRA_SPREAD * (np.cos(a) * u + np.sin(a) * w)
            out.append((dk / np.linalg.norm(dk), 0.5, 1.0 + 0.2 * k))
        out.append((d, 1.0, 2.0))
        return out

    def _collider_mesh(self, c, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Unwelded triangles of a collider at time t (flat faces, one colour a face) and
        their normals (None: from the faces; a sphere gets the exact ones, so it looks round)."""
        V, F = c.surface_mesh(t)
        V, F = _flat_mesh(np.asarray(V, dtype=np.float64), np.asarray(F, dtype=np.int64))
        nrm = None
        if c.kind == "sphere":
            d = V - c.center(t)
            nrm = d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-300)
        return V, F, nrm

    def update(self, positions: np.ndarray, time: float, extra_points: np.ndarray | None = None) -> None:
        x = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
        if len(x) != self.info.vertex_count:
            raise ValueError(f"expected {self.info.vertex_count} positions, got {len(x)}")
        self.surface.update(x)
        if not self._sized and len(x):
            # 0.6 % of the object's size, but at least ~2 pixels at the camera's distance
            diag = float(np.linalg.norm(x.max(0) - x.min(0)))
            cam = self.info.camera
            tan_half = math.tan(math.radians(cam.fov) / 2.0)
            pixel = 2.0 * self._cam_dist * tan_half / self.info.render.height
            self.radius = max(0.006 * diag, 2.0 * pixel, 1e-6)
            self._sized = True
        if time != self.time:
            for i, (c, buffers, moving, _) in enumerate(self.colliders):
                if moving:
                    V, _, nrm = self._collider_mesh(c, time)
                    buffers.update(V, nrm)
                    self._collider_vertices[i] = V
            for g in self.grounds:
                if g.c.is_moving():
                    g.buffers.update(g.vertices(time), g.frame(time)[1])
        self.time = time
        self._update_shadows(x, time)
        self._set_points(extra_points)

    def _update_shadows(self, x: np.ndarray, time: float) -> None:
        """Project every caster onto every floor along each light sample; a still
        collider's shadow on a still floor only the first time (on refine-drape's
        preview, the sphere's shadow was most of this work, every frame)."""
        if not self.grounds:
            return
        floor = np.asarray(PLANE_COLOR)
        casters = [x] + self._collider_vertices
        still = [False] + [not moving for _, _, moving, _ in self.colliders]
        for gi, (g, per_caster) in enumerate(zip(self.grounds, self._shadows)):
            p, n, u, w = g.frame(time)
            floor_still = not g.c.is_moving()
            for ci, (V, buffers) in enumerate(zip(casters, per_caster)):
                if (gi, ci) in self._shadow_static:
                    continue
                if still[ci] and floor_still:
                    self._shadow_static.add((gi, ci))
                # what is below the floor is hidden by it: clamp heights at 0
                h = np.maximum((V - p) @ n, 0.0)
                pos, col = [], []
                for d, strength, lift in self._lights:
                    dn = max(float(d @ n), 0.05)  # a grazing light would throw shadows to infinity
                    S = V - (h / dn)[:, None] * d + (lift * 1e-3 * self._cam_dist) * n
                    fog = g.fog(np.stack([(S - p) @ u, (S - p) @ w], 1))[:, None]
                    dark = floor * (1.0 - strength * (1.0 - SHADOW_DARKNESS))
                    # shadows lie near the target, where the fog colour hardly matters
                    pos.append(S)
                    col.append((1 - fog) * dark + fog * g.fog_color.mean(0))
                buffers.set_colors(np.concatenate(col))
                buffers.update(np.concatenate(pos), n)
        self._shadow_on = True

    def _set_points(self, pts: np.ndarray | None) -> None:
        from tisim.render import host_draw

        if pts is None or len(pts) == 0:
            self._point_count = 0
            return
        p = np.asarray(pts, dtype=np.float32).reshape(-1, 3)
        if self._points is None or len(self._points) < len(p):
            self._points = host_draw.vertex_buffer(max(16, 2 * len(p)))  # grows geometrically
        self._points[: len(p), 0:3] = p
        self._point_count = len(p)

    def set_marker(self, vertex_pos: np.ndarray | None, target: np.ndarray | None) -> None:
        """Show a drag line from ``vertex_pos`` to ``target`` (both (3,)), or hide it."""
        if vertex_pos is None or target is None:
            self._marker_on = False
            return
        self._marker[:, 0:3] = np.array([vertex_pos, target], dtype=np.float32)
        self._marker_on = True

    def draw(self, scene) -> None:
        for g in self.grounds:
            g.buffers.draw(scene, PLANE_COLOR)
        if self._shadow_on:
            for per_caster in self._shadows:
                for buffers in per_caster:
                    buffers.draw(scene, PLANE_COLOR)
        self.surface.draw(scene, self.info.render.color)
        for _, buffers, _, color in self.colliders:
            buffers.draw(scene, color)
        from tisim.render import host_draw

        if self._point_count:
            host_draw.particles(scene, self._points, self.radius, POINT_COLOR, index_count=self._point_count)
        if self._marker_on:
            host_draw.lines(scene, self._marker, 2.0, DRAG_COLOR)
            host_draw.particles(scene, self._marker, 1.5 * self.radius, DRAG_COLOR, index_offset=1, index_count=1)


def setup_camera_and_lights(scene, ti_camera, view: CameraView) -> None:
    """Point the GGUI camera along ``view`` and place a light above and beside the eye
    (a head light keeps whatever the user orbits to lit)."""
    dist = float(np.linalg.norm(view.target - view.eye))
    ti_camera.position(*view.eye.tolist())
    ti_camera.lookat(*view.target.tolist())
    ti_camera.up(*view.up.tolist())
    ti_camera.fov(view.fov)
    ti_camera.z_near(min(0.1, 0.05 * dist))
    ti_camera.z_far(max(1000.0, 100.0 * dist))
    scene.set_camera(ti_camera)
    scene.point_light(tuple(head_light(view).tolist()), (LIGHT, LIGHT, LIGHT))
    scene.ambient_light((AMBIENT, AMBIENT, AMBIENT))


LIGHT, AMBIENT = 0.75, 0.4  # GGUI shades a colour c as c (AMBIENT + LIGHT max(n.l, 0))


def head_light(view: CameraView) -> np.ndarray:
    """(3,) position of the point light: above and beside the eye."""
    right, up, _ = view.basis()
    dist = float(np.linalg.norm(view.target - view.eye))
    return view.eye + dist * (0.6 * up + 0.4 * right)


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

    def __init__(
        self, frames: FrameWriter | None = None, *, stride: int = 1, overlay: bool = False, slowdown: float = 1.0
    ):
        self.frames = frames
        self.stride = max(1, int(stride))  # render every stride-th frame (videos at most 60 fps)
        self.overlay = bool(overlay)  # write the text block of panel.overlay_lines into each frame
        self.slowdown = float(slowdown)
        self.readout: dict[str, float] = {}
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

    def draw(self, frame: int, time: float, positions: np.ndarray, extra_points: np.ndarray | None = None) -> None:
        self._check_open()
        if frame % self.stride:
            return
        self._drawer.update(positions, time, extra_points)
        self.render()
        if self.overlay:
            from tisim.render.panel import overlay_lines
            from tisim.render.text import draw_text

            rate = f"slow motion {self.slowdown:.3g}x" if self.slowdown > 1.01 else ""
            lines = overlay_lines(time, frame, self.info.tunables, energy=self.readout.get("energy"), rate=rate)
            self._image = draw_text(self.image(), lines)
        if self.frames is not None:
            self.frames.write(self.image())

    def set_readout(self, values: dict[str, float]) -> None:
        """Quantities of the frame about to be drawn (``energy`` in J) for the overlay."""
        self.readout = dict(values)

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
        """Finish the video (if recording) and drop the scene's buffers; the shared
        window stays for the next ``open``. Safe to call repeatedly."""
        if self.frames is not None and self._drawer is not None:
            self.video_path = self.frames.finish()
        self._drawer = None
        self._ti_camera = None
        self._window = None


def recording_viewer(scene, out_dir, video_name: str | None = None, frames: int | None = None):
    """The off-screen renderer a headless run records with: PNG frames in
    ``out_dir/frames`` and ``out_dir/NAME.mp4`` (or ``video_name``) (``tisim run
    --headless``). The video plays at most 60 fps and lasts at least 3 s for a run of
    ``frames`` frames (default the scene's): subsampled or in stated slow motion
    (:func:`tisim.render.video.video_timing`); the frames carry the overlay when
    ``render.overlay`` is on. Needs Vulkan (:func:`tisim.render.vulkan_available`)."""
    from tisim.render.video import FrameWriter, video_timing

    sim_fps = 1.0 / (scene.sim.dt * scene.sim.substeps)
    vt = video_timing(sim_fps, frames or scene.sim.frames, scene.render.fps)
    return OffscreenRenderer(
        FrameWriter(out_dir, fps=vt.fps, video_name=video_name or f"{scene.name}.mp4"),
        stride=vt.stride,
        overlay=scene.render.overlay,
        slowdown=vt.slowdown,
    )
