"""Camera math for the viewers, in numpy: orbit camera, projection, pixel rays, picking.

Conventions (shared by every function here and by the renderers):

* A camera looks from ``eye`` at ``target`` with a world ``up`` hint and a
  *vertical* field of view ``fov`` in degrees (GGUI's convention as well).
* Pixel coordinates ``(px, py)`` are continuous: ``px`` in ``[0, width)`` grows to
  the right, ``py`` in ``[0, height)`` grows *downwards*, so ``image[int(py), int(px)]``
  is the pixel they fall in and the centre of pixel ``(i, j)`` is ``(i + 0.5, j + 0.5)``.
  The image centre is ``(width / 2, height / 2)``.
* Depth is the distance along the viewing direction (metres), positive in front.

Nothing here touches Taichi, so the live viewer's interaction logic is testable
without a window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_MIN_PITCH = -math.radians(89.0)
_MAX_PITCH = math.radians(89.0)


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    if n == 0.0:
        raise ValueError("zero-length vector")
    return v / n


def look_at_basis(eye, target, up) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Orthonormal camera frame ``(right, true_up, forward)``, each (3,).

    forward points from ``eye`` to ``target``; ``true_up`` is ``up`` made
    perpendicular to it. When ``up`` is parallel to the viewing direction, any
    perpendicular vector is used instead, so the frame is always valid.
    """
    eye = np.asarray(eye, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    forward = _unit(target - eye)
    up = np.asarray(up, dtype=np.float64)
    right = np.cross(forward, up)
    if np.linalg.norm(right) < 1e-9 * max(1.0, float(np.linalg.norm(up))):
        # up is (anti)parallel to the view: pick the axis least aligned with it
        axis = np.eye(3)[int(np.argmin(np.abs(forward)))]
        right = np.cross(forward, axis)
    right = _unit(right)
    true_up = np.cross(right, forward)
    return right, true_up, forward


@dataclass(frozen=True)
class CameraView:
    """A pinhole camera and the image it produces.

    eye, target, up: (3,) world coordinates, metres. fov: vertical field of view,
    degrees. width, height: image size, pixels.
    """

    eye: np.ndarray
    target: np.ndarray
    up: np.ndarray
    fov: float
    width: int
    height: int

    @classmethod
    def from_config(cls, camera, width: int, height: int) -> CameraView:
        """From a ``tisim.scene.CameraConfig`` (position, lookat, up, fov)."""
        return cls(
            eye=np.asarray(camera.position, dtype=np.float64),
            target=np.asarray(camera.lookat, dtype=np.float64),
            up=np.asarray(camera.up, dtype=np.float64),
            fov=float(camera.fov),
            width=int(width),
            height=int(height),
        )

    @property
    def aspect(self) -> float:
        return self.width / self.height

    def basis(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(right, true_up, forward)`` unit vectors, each (3,)."""
        return look_at_basis(self.eye, self.target, self.up)

    def _tan_half(self) -> float:
        return math.tan(math.radians(self.fov) / 2.0)

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pixel coordinates (k, 2) and depth (k,) of world ``points`` (k, 3).

        Points behind the eye get a negative depth and meaningless pixels; callers
        filter on ``depth > 0``.
        """
        right, up, forward = self.basis()
        d = np.asarray(points, dtype=np.float64).reshape(-1, 3) - self.eye
        depth = d @ forward
        safe = np.where(np.abs(depth) > 1e-300, depth, 1e-300)
        t = self._tan_half()
        ndc_x = (d @ right) / safe / (t * self.aspect)
        ndc_y = (d @ up) / safe / t
        px = (ndc_x + 1.0) * 0.5 * self.width
        py = (1.0 - ndc_y) * 0.5 * self.height
        return np.stack([px, py], axis=1), depth

    def ray(self, px: float, py: float) -> tuple[np.ndarray, np.ndarray]:
        """Ray ``(origin (3,), unit direction (3,))`` through pixel coordinates (px, py)."""
        right, up, forward = self.basis()
        t = self._tan_half()
        ndc_x = 2.0 * px / self.width - 1.0
        ndc_y = 1.0 - 2.0 * py / self.height
        d = forward + ndc_x * t * self.aspect * right + ndc_y * t * up
        return self.eye.copy(), _unit(d)

    def pixel_size_at(self, depth: float) -> float:
        """World length (m) covered by one pixel at ``depth`` metres."""
        return 2.0 * depth * self._tan_half() / self.height


@dataclass
class OrbitCamera:
    """A camera orbiting ``target`` at ``distance``; yaw and pitch in radians.

    The eye is ``target + distance * (cos(pitch) (cos(yaw) e2 + sin(yaw) e1) +
    sin(pitch) up)`` with ``(e1, e2)`` a fixed basis of the plane perpendicular to
    the world ``up``. Pitch is kept within +-89 degrees so the view never flips.
    """

    target: np.ndarray
    distance: float
    yaw: float
    pitch: float
    up: np.ndarray
    fov: float = 45.0

    def __post_init__(self) -> None:
        self.target = np.asarray(self.target, dtype=np.float64).copy()
        self.up = _unit(np.asarray(self.up, dtype=np.float64))
        self.pitch = float(np.clip(self.pitch, _MIN_PITCH, _MAX_PITCH))

    @classmethod
    def from_look_at(cls, position, lookat, up=(0.0, 1.0, 0.0), fov: float = 45.0) -> OrbitCamera:
        """The orbit camera whose eye is ``position`` looking at ``lookat``."""
        up = _unit(np.asarray(up, dtype=np.float64))
        offset = np.asarray(position, dtype=np.float64) - np.asarray(lookat, dtype=np.float64)
        distance = float(np.linalg.norm(offset))
        if distance == 0.0:
            raise ValueError("camera position and lookat coincide")
        e1, e2 = _plane_basis(up)
        o = offset / distance
        pitch = math.asin(float(np.clip(o @ up, -1.0, 1.0)))
        yaw = math.atan2(float(o @ e1), float(o @ e2))
        return cls(
            target=np.asarray(lookat, dtype=np.float64),
            distance=distance,
            yaw=yaw,
            pitch=pitch,
            up=up,
            fov=fov,
        )

    @classmethod
    def from_config(cls, camera) -> OrbitCamera:
        """From a ``tisim.scene.CameraConfig``."""
        return cls.from_look_at(camera.position, camera.lookat, camera.up, camera.fov)

    def eye(self) -> np.ndarray:
        """(3,) eye position, metres."""
        e1, e2 = _plane_basis(self.up)
        cp = math.cos(self.pitch)
        horizontal = math.cos(self.yaw) * e2 + math.sin(self.yaw) * e1
        direction = cp * horizontal + math.sin(self.pitch) * self.up
        return self.target + self.distance * direction

    def view(self, width: int, height: int) -> CameraView:
        return CameraView(
            eye=self.eye(),
            target=self.target.copy(),
            up=self.up.copy(),
            fov=self.fov,
            width=int(width),
            height=int(height),
        )

    def orbit(self, dyaw: float, dpitch: float) -> None:
        """Rotate about the target by ``dyaw``, ``dpitch`` radians (distance kept)."""
        self.yaw = (self.yaw + dyaw) % (2.0 * math.pi)
        self.pitch = float(np.clip(self.pitch + dpitch, _MIN_PITCH, _MAX_PITCH))

    def pan(self, dx_px: float, dy_px: float, height_px: int) -> None:
        """Move eye and target so the scene follows a mouse drag of (dx, dy) pixels
        (dy positive downwards) in a window ``height_px`` tall."""
        view = self.view(height_px, height_px)
        right, up, _ = view.basis()
        s = view.pixel_size_at(self.distance)
        self.target = self.target - dx_px * s * right + dy_px * s * up

    def zoom(self, factor: float, min_distance: float = 1e-3, max_distance: float = 1e5) -> None:
        """Multiply the distance by ``factor`` (< 1 moves closer)."""
        self.distance = float(np.clip(self.distance * factor, min_distance, max_distance))


def _plane_basis(up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(e1, e2) spanning the plane perpendicular to unit ``up``; for y-up, e1 = x, e2 = z."""
    ref = np.array([0.0, 0.0, 1.0])
    e2 = ref - (ref @ up) * up
    if np.linalg.norm(e2) < 1e-6:
        ref = np.array([1.0, 0.0, 0.0])
        e2 = ref - (ref @ up) * up
    e2 = _unit(e2)
    e1 = np.cross(up, e2)
    return e1, e2


def vertex_normals(positions: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Area-weighted unit vertex normals (n, 3) of a triangle mesh.

    positions: (n, 3); faces: (k, 3) int, counter-clockwise seen from outside.
    Vertices in no face (interior tet vertices) get (0, 1, 0).
    """
    x = np.asarray(positions, dtype=np.float64)
    f = np.asarray(faces, dtype=np.int64)
    n = len(x)
    fn = np.cross(x[f[:, 1]] - x[f[:, 0]], x[f[:, 2]] - x[f[:, 0]])  # |fn| = 2 area
    vn = np.zeros((n, 3))
    # bincount is several times faster than np.add.at for scatter-adds
    for c in range(3):
        w = fn[:, c]
        vn[:, c] = np.bincount(f[:, 0], w, n) + np.bincount(f[:, 1], w, n) + np.bincount(f[:, 2], w, n)
    length = np.linalg.norm(vn, axis=1)
    out = np.tile(np.array([0.0, 1.0, 0.0]), (n, 1))
    ok = length > 0
    out[ok] = vn[ok] / length[ok, None]
    return out


def ray_triangles(origin: np.ndarray, direction: np.ndarray, tri: np.ndarray) -> np.ndarray:
    """Ray parameter t (k,) of the hit with each triangle ``tri`` (k, 3, 3); inf on a miss.

    Moller-Trumbore, both sides counted; only hits with t > 0.
    """
    e1 = tri[:, 1] - tri[:, 0]
    e2 = tri[:, 2] - tri[:, 0]
    p = np.cross(direction, e2)
    det = np.einsum("ij,ij->i", e1, p)
    scale = np.maximum(np.linalg.norm(e1, axis=1) * np.linalg.norm(e2, axis=1), 1e-300)
    ok = np.abs(det) > 1e-12 * scale
    inv = np.where(ok, 1.0 / np.where(ok, det, 1.0), 0.0)
    s = origin - tri[:, 0]
    u = np.einsum("ij,ij->i", s, p) * inv
    q = np.cross(s, e1)
    v = (q @ direction) * inv
    t = np.einsum("ij,ij->i", e2, q) * inv
    hit = ok & (u >= 0) & (v >= 0) & (u + v <= 1) & (t > 0)
    return np.where(hit, t, np.inf)


def pick_vertex(
    view: CameraView,
    positions: np.ndarray,
    faces: np.ndarray,
    px: float,
    py: float,
    radius_px: float = 12.0,
    normals: np.ndarray | None = None,
) -> int | None:
    """The surface vertex under pixel (px, py), or None.

    First the ray through the pixel is intersected with the surface triangles:
    on a hit, the vertex of the nearest hit triangle closest to the hit point is
    returned (this respects occlusion). Otherwise (the cursor is just off the
    silhouette) the vertex nearest in screen space among front-facing surface
    vertices within ``radius_px`` pixels is returned.

    positions: (n, 3) world coordinates; faces: (k, 3) int surface triangles;
    normals: optional (n, 3) vertex normals (computed when missing).
    """
    x = np.asarray(positions, dtype=np.float64)
    f = np.asarray(faces, dtype=np.int64)
    if len(f) == 0:
        return None
    origin, direction = view.ray(px, py)
    t = ray_triangles(origin, direction, x[f])
    k = int(np.argmin(t))
    if np.isfinite(t[k]):
        hit = origin + t[k] * direction
        corners = f[k]
        return int(corners[np.argmin(np.linalg.norm(x[corners] - hit, axis=1))])
    surf = np.unique(f)
    pix, depth = view.project(x[surf])
    nrm = vertex_normals(x, f)[surf] if normals is None else np.asarray(normals)[surf]
    facing = np.einsum("ij,ij->i", nrm, x[surf] - view.eye) < 0
    dist = np.linalg.norm(pix - np.array([px, py]), axis=1)
    ok = facing & (depth > 0) & (dist <= radius_px)
    if not np.any(ok):
        return None
    cand = np.flatnonzero(ok)
    return int(surf[cand[np.argmin(dist[cand])]])


def drag_point(view: CameraView, px: float, py: float, anchor: np.ndarray) -> np.ndarray:
    """Where the ray through (px, py) meets the plane through ``anchor`` (3,) facing
    the camera: the drag target for a vertex picked at ``anchor``."""
    origin, direction = view.ray(px, py)
    _, _, forward = view.basis()
    denom = float(direction @ forward)  # > 0 for any ray through the image
    t = float((np.asarray(anchor, dtype=np.float64) - origin) @ forward) / max(denom, 1e-12)
    return origin + t * direction
