"""Analytic colliders: signed distance, outward normal and surface velocity (numpy).

Every collider moves rigidly. Its reference point is ``position + velocity * t``,
or, with position keyframes, the keyframes interpolated at t; it is rotated by
``angular_velocity * t`` (rad/s) about that point, or, with rotation keyframes, by
the interpolated XYZ Euler angles. The pose at time t (``center``, ``orientation``)
and its rate (``linear_velocity``, ``spin``) are all a contact solver needs:
``velocity_at`` combines them into the velocity of the collider's material.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tisim.geometry.transforms import euler_xyz_deg, rotation_vector

INTERPOLATIONS = ("linear", "smooth")


@dataclass(frozen=True, eq=False)
class Keyframes:
    """A 3-vector given at increasing times and interpolated between them.

    times: (k,) seconds, strictly increasing. values: (k, 3). mode: "linear" (constant
    rate between keys, a kink at each) or "smooth" (per segment
    v0 + (v1 - v0) h(s), h(s) = 3 s^2 - 2 s^3, s = (t - t0) / (t1 - t0): C1, at rest
    at every key, never past a key's value). Before the first key and after the
    last the value is held (rate 0).
    """

    times: np.ndarray
    values: np.ndarray
    mode: str = "smooth"

    def __post_init__(self) -> None:
        t = np.asarray(self.times, dtype=np.float64).reshape(-1)
        v = np.asarray(self.values, dtype=np.float64).reshape(len(t), 3)
        if len(t) == 0:
            raise ValueError("keyframes need at least one key")
        if np.any(np.diff(t) <= 0):
            raise ValueError("keyframe times must be strictly increasing")
        if self.mode not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {self.mode!r}")
        object.__setattr__(self, "times", t)
        object.__setattr__(self, "values", v)

    @classmethod
    def from_rows(cls, rows, mode: str = "smooth") -> Keyframes:
        """From rows ``[t, x, y, z]`` (k, 4)."""
        a = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
        return cls(a[:, 0], a[:, 1:], mode)

    def _segment(self, t: float) -> tuple[int, float, float]:
        """(i, s, ds/dt): t lies in [times[i], times[i+1]] at fraction s; s held at
        0 or 1 (and ds/dt = 0) outside the keys."""
        tk = self.times
        if len(tk) == 1 or t <= tk[0]:
            return 0, 0.0, 0.0
        if t >= tk[-1]:
            return len(tk) - 2, 1.0, 0.0
        i = int(np.searchsorted(tk, t, side="right")) - 1
        h = tk[i + 1] - tk[i]
        return i, (t - tk[i]) / h, 1.0 / h

    def _shape(self, s: float) -> tuple[float, float]:
        """(h(s), h'(s)) of the interpolation."""
        if self.mode == "linear":
            return s, 1.0
        return s * s * (3.0 - 2.0 * s), 6.0 * s * (1.0 - s)

    def value(self, t: float) -> np.ndarray:
        """(3,) interpolated value at time ``t`` (s)."""
        if len(self.times) == 1:
            return self.values[0].copy()
        i, s, _ = self._segment(float(t))
        h, _ = self._shape(s)
        return self.values[i] + (self.values[i + 1] - self.values[i]) * h

    def rate(self, t: float) -> np.ndarray:
        """(3,) time derivative of ``value`` at ``t`` (units of value per second)."""
        if len(self.times) == 1:
            return np.zeros(3)
        i, s, ds = self._segment(float(t))
        _, dh = self._shape(s)
        return (self.values[i + 1] - self.values[i]) * (dh * ds)

    def is_constant(self) -> bool:
        return bool(np.all(self.values == self.values[0]))


def euler_rates_to_angular_velocity(angles_deg, rates_deg) -> np.ndarray:
    """(3,) world angular velocity (rad/s) of the rotation ``euler_xyz_deg(angles)``
    (R = Rz Ry Rx) whose angles change at ``rates`` (degrees per second):
    omega = c' e_z + b' Rz e_y + a' Rz Ry e_x."""
    _a, b, c = np.radians(np.asarray(angles_deg, dtype=np.float64))
    da, db, dc = np.radians(np.asarray(rates_deg, dtype=np.float64))
    ey_rot = np.array([-np.sin(c), np.cos(c), 0.0])  # Rz e_y
    ex_rot = np.array([np.cos(b) * np.cos(c), np.cos(b) * np.sin(c), -np.sin(b)])  # Rz Ry e_x
    return dc * np.array([0.0, 0.0, 1.0]) + db * ey_rot + da * ex_rot


@dataclass(frozen=True, eq=False)
class Collider:
    """A rigid analytic obstacle.

    kind: "plane" | "sphere" | "box" | "cylinder". position: (3,) m. normal: (3,)
    unit plane normal. radius: m. axis: (3,) unit cylinder axis. length: cylinder
    length, m (inf = unbounded). half_extents: (3,) box half sizes, m.
    rotation: (3, 3) initial orientation of box/cylinder/plane (applied to the
    reference normal/axis). velocity: (3,) m/s. angular_velocity: (3,) rad/s.
    friction: per-collider Coulomb coefficient, or None for the scene's.
    position_keys: ``Keyframes`` of the reference point (m), replacing ``position``
    and ``velocity``; rotation_keys: ``Keyframes`` of XYZ Euler angles (degrees),
    replacing ``rotation`` and ``angular_velocity``. Read the pose through
    ``center(t)`` / ``orientation(t)`` and its rate through ``linear_velocity(t)`` /
    ``spin(t)``, never through the fields.
    """

    name: str
    kind: str
    position: np.ndarray
    normal: np.ndarray
    radius: float
    axis: np.ndarray
    length: float
    half_extents: np.ndarray
    rotation: np.ndarray
    velocity: np.ndarray
    angular_velocity: np.ndarray
    friction: float | None = None
    visible: bool = True
    # kind "mesh": triangles in the collider's frame (scaled), placed by rotation and position
    mesh_vertices: np.ndarray | None = None
    mesh_faces: np.ndarray | None = None
    position_keys: Keyframes | None = None
    rotation_keys: Keyframes | None = None

    @classmethod
    def from_config(cls, name: str, c, source_dir=None) -> Collider:
        """From a ``ColliderConfig``; ``source_dir`` resolves a mesh collider's file."""
        mv = mf = None
        if c.type == "mesh":
            from pathlib import Path

            from tisim.geometry.io import load_tri_mesh

            path = Path(c.mesh).expanduser()
            if not path.is_absolute() and source_dir is not None:
                path = Path(source_dir) / path
            tri = load_tri_mesh(str(path))
            mv, mf = tri.vertices * c.scale, tri.faces
        n = np.asarray(c.normal, dtype=np.float64)
        a = np.asarray(c.axis, dtype=np.float64)
        mode, pk, rk = c.interpolation, c.position_keys, c.rotation_keys
        return cls(
            name=name,
            kind=c.type,
            position=np.asarray(c.position, dtype=np.float64),
            normal=n / np.linalg.norm(n),
            radius=float(c.radius),
            axis=a / np.linalg.norm(a),
            length=float(c.length),
            half_extents=np.asarray(c.half_extents, dtype=np.float64),
            rotation=euler_xyz_deg(c.rotation),
            velocity=np.asarray(c.velocity, dtype=np.float64),
            angular_velocity=np.asarray(c.angular_velocity, dtype=np.float64),
            friction=c.friction,
            visible=c.visible,
            mesh_vertices=mv,
            mesh_faces=mf,
            position_keys=Keyframes.from_rows(pk, mode) if len(pk) else None,
            rotation_keys=Keyframes.from_rows(rk, mode) if len(rk) else None,
        )

    # pose -------------------------------------------------------------------
    def center(self, t: float) -> np.ndarray:
        """(3,) reference point (m) at time t (s)."""
        if self.position_keys is not None:
            return self.position_keys.value(t)
        return self.position + self.velocity * t

    def orientation(self, t: float) -> np.ndarray:
        """(3, 3) world rotation at time t."""
        if self.rotation_keys is not None:
            return euler_xyz_deg(self.rotation_keys.value(t))
        return rotation_vector(self.angular_velocity * t) @ self.rotation

    def linear_velocity(self, t: float) -> np.ndarray:
        """(3,) velocity of the reference point (m/s) at time t: d center / dt."""
        if self.position_keys is not None:
            return self.position_keys.rate(t)
        return self.velocity.copy()

    def spin(self, t: float) -> np.ndarray:
        """(3,) world angular velocity (rad/s) at time t: [spin]x = dR/dt R^T."""
        if self.rotation_keys is not None:
            k = self.rotation_keys
            return euler_rates_to_angular_velocity(k.value(t), k.rate(t))
        return self.angular_velocity.copy()

    def is_moving(self) -> bool:
        """Whether the pose changes with time at all."""
        if self.position_keys is not None:
            moves = not self.position_keys.is_constant()
        else:
            moves = bool(np.any(self.velocity))
        if self.rotation_keys is not None:
            return moves or not self.rotation_keys.is_constant()
        return moves or bool(np.any(self.angular_velocity))

    # queries ----------------------------------------------------------------
    def signed_distance(self, points: np.ndarray, t: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Signed distance (k,) in metres (negative inside) and unit outward normal (k, 3)
        of ``points`` (k, 3) at time ``t``."""
        x = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        c = self.center(t)
        R = self.orientation(t)
        if self.kind == "plane":
            n = R @ self.normal
            return (x - c) @ n, np.broadcast_to(n, x.shape).copy()
        if self.kind == "sphere":
            d = x - c
            r = np.linalg.norm(d, axis=1)
            nrm = _safe_normalize(d, r, R @ np.array([0.0, 1.0, 0.0]))
            return r - self.radius, nrm
        if self.kind == "cylinder":
            a = R @ self.axis
            d = x - c
            s = d @ a
            radial = d - s[:, None] * a
            rr = np.linalg.norm(radial, axis=1)
            perp = _any_perpendicular(a)
            n_side = _safe_normalize(radial, rr, perp)
            d_side = rr - self.radius
            if not math.isfinite(self.length):
                return d_side, n_side
            d_cap = np.abs(s) - 0.5 * self.length
            n_cap = np.sign(s)[:, None] * a
            n_cap[s == 0] = a
            return _combine_box_like(np.stack([d_side, d_cap], 1), np.stack([n_side, n_cap], 1))
        if self.kind == "box":
            local = (x - c) @ R  # coordinates in the box frame
            q = np.abs(local) - self.half_extents
            sgn = np.where(local >= 0, 1.0, -1.0)
            normals = np.zeros((len(x), 3, 3))
            for k in range(3):
                normals[:, k, :] = sgn[:, k : k + 1] * R[:, k]
            return _combine_box_like(q, normals)
        if self.kind == "mesh":
            raise ValueError(f"collider {self.name!r}: mesh colliders work with the cloth solver only")
        raise ValueError(f"unknown collider kind {self.kind!r}")

    def distance(self, points: np.ndarray, t: float = 0.0) -> np.ndarray:
        """Signed distance (k,) in metres of ``points`` (k, 3) at time ``t``: the first
        result of :meth:`signed_distance`, value for value (the same operations), without
        the normals, which cost most of it (contact detection tests every surface vertex
        and keeps a few)."""
        x = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        c = self.center(t)
        R = self.orientation(t)
        if self.kind == "plane":
            return (x - c) @ (R @ self.normal)
        if self.kind == "sphere":
            return np.linalg.norm(x - c, axis=1) - self.radius
        if self.kind == "cylinder":
            a = R @ self.axis
            d = x - c
            s = d @ a
            d_side = np.linalg.norm(d - s[:, None] * a, axis=1) - self.radius
            if not math.isfinite(self.length):
                return d_side
            return _slab_distance(np.stack([d_side, np.abs(s) - 0.5 * self.length], 1))[0]
        if self.kind == "box":
            return _slab_distance(np.abs((x - c) @ R) - self.half_extents)[0]
        return self.signed_distance(x, t)[0]  # mesh (raises) or unknown

    def velocity_at(self, points: np.ndarray, t: float = 0.0) -> np.ndarray:
        """(k, 3) velocity of the collider's material at ``points`` (m/s)."""
        x = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        return self.linear_velocity(t) + np.cross(self.spin(t), x - self.center(t))

    # drawing ----------------------------------------------------------------
    def surface_mesh(self, t: float = 0.0, extent: float = 4.0, segments: int = 48):
        """(V (k, 3), F (l, 3)) triangles for drawing; unbounded shapes are cut at ``extent``."""
        c, R = self.center(t), self.orientation(t)
        if self.kind == "mesh":
            return c + self.mesh_vertices @ R.T, self.mesh_faces
        if self.kind == "plane":
            n = R @ self.normal
            u = _any_perpendicular(n)
            w = np.cross(n, u)
            V = np.array([c + extent * (su * u + sw * w) for su, sw in ((-1, -1), (1, -1), (1, 1), (-1, 1))])
            F = np.array([[0, 1, 2], [0, 2, 3]])
            if np.dot(np.cross(V[1] - V[0], V[2] - V[0]), n) < 0:
                F = F[:, ::-1]
            return V, F
        if self.kind == "sphere":
            V, F = _uv_sphere(segments)
            return c + self.radius * V @ R.T, F
        if self.kind == "box":
            V = np.array([[(i & 1) * 2 - 1, (i >> 1 & 1) * 2 - 1, (i >> 2 & 1) * 2 - 1] for i in range(8)], float)
            F = np.array(
                [
                    [0, 2, 1],
                    [1, 2, 3],
                    [4, 5, 6],
                    [5, 7, 6],
                    [0, 1, 4],
                    [1, 5, 4],
                    [2, 6, 3],
                    [3, 6, 7],
                    [0, 4, 2],
                    [2, 4, 6],
                    [1, 3, 5],
                    [3, 7, 5],
                ]
            )
            return c + (V * self.half_extents) @ R.T, F
        if self.kind == "cylinder":
            a = R @ self.axis
            L = self.length if math.isfinite(self.length) else 2 * extent
            u = R @ _any_perpendicular(self.axis)  # turns with the body, so a spin shows
            w = np.cross(a, u)
            th = np.linspace(0, 2 * np.pi, segments, endpoint=False)
            ring = self.radius * (np.cos(th)[:, None] * u + np.sin(th)[:, None] * w)
            V = np.concatenate([c + ring - 0.5 * L * a, c + ring + 0.5 * L * a, [c - 0.5 * L * a, c + 0.5 * L * a]])
            F = []
            s = segments
            for i in range(s):
                j = (i + 1) % s
                F += [[i, j, s + j], [i, s + j, s + i], [2 * s, j, i], [2 * s + 1, s + i, s + j]]
            return V, np.array(F)
        raise ValueError(self.kind)


def _safe_normalize(d, r, fallback):
    out = np.empty_like(d)
    ok = r > 1e-300
    out[ok] = d[ok] / r[ok, None]
    out[~ok] = fallback
    return out


def _any_perpendicular(a):
    a = np.asarray(a, dtype=np.float64)
    ref = np.array([1.0, 0.0, 0.0]) if abs(a[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    u = np.cross(a, ref)
    return u / np.linalg.norm(u)


def _slab_distance(q):
    """(distance (k,), outside parts (k, j), inside mask (k,)) of an intersection of slabs
    with per-slab distances q (k, j)."""
    outside = np.maximum(q, 0.0)
    dist_out = np.linalg.norm(outside, axis=1)
    inside = dist_out == 0
    return np.where(inside, q.max(axis=1), dist_out), outside, inside


def _combine_box_like(q, normals):
    """Signed distance of an intersection of slabs: q (k, j) per-slab distances,
    normals (k, j, 3) per-slab outward normals."""
    d, outside, inside = _slab_distance(q)
    nrm = np.einsum("kj,kjc->kc", outside, normals)
    nn = np.linalg.norm(nrm, axis=1)
    nrm = np.where(nn[:, None] > 0, nrm / np.where(nn > 0, nn, 1)[:, None], 0.0)
    if np.any(inside):
        k = np.argmax(q[inside], axis=1)
        nrm[inside] = normals[inside][np.arange(k.size), k]
    return d, nrm


def _uv_sphere(segments: int):
    nlat, nlon = max(4, segments // 2), max(6, segments)
    th = np.linspace(0, np.pi, nlat + 1)
    ph = np.linspace(0, 2 * np.pi, nlon, endpoint=False)
    V = np.array([[np.sin(t) * np.cos(p), np.cos(t), np.sin(t) * np.sin(p)] for t in th for p in ph])
    F = []
    for i in range(nlat):
        for j in range(nlon):
            a, b = i * nlon + j, i * nlon + (j + 1) % nlon
            c, d = a + nlon, b + nlon
            F += [[a, b, d], [a, d, c]]
    return V, np.array(F)
