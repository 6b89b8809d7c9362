"""Analytic colliders: signed distance, outward normal and surface velocity (numpy).

Every collider moves rigidly: its reference point is ``position + velocity * t``
and it is rotated by ``angular_velocity * t`` (rad/s) about that point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tisim.geometry.transforms import euler_xyz_deg, rotation_vector


@dataclass(frozen=True, eq=False)
class Collider:
    """A rigid analytic obstacle.

    kind: "plane" | "sphere" | "box" | "cylinder". position: (3,) m. normal: (3,)
    unit plane normal. radius: m. axis: (3,) unit cylinder axis. length: cylinder
    length, m (inf = unbounded). half_extents: (3,) box half sizes, m.
    rotation: (3, 3) initial orientation of box/cylinder/plane (applied to the
    reference normal/axis). velocity: (3,) m/s. angular_velocity: (3,) rad/s.
    friction: per-collider Coulomb coefficient, or None for the scene's.
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
        )

    # pose -------------------------------------------------------------------
    def center(self, t: float) -> np.ndarray:
        return self.position + self.velocity * t

    def orientation(self, t: float) -> np.ndarray:
        """(3, 3) world rotation at time t."""
        return rotation_vector(self.angular_velocity * t) @ self.rotation

    def is_moving(self) -> bool:
        return bool(np.any(self.velocity) or np.any(self.angular_velocity))

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

    def velocity_at(self, points: np.ndarray, t: float = 0.0) -> np.ndarray:
        """(k, 3) velocity of the collider's material at ``points`` (m/s)."""
        x = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        return self.velocity + np.cross(self.angular_velocity, x - self.center(t))

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
            F = np.array([[0, 2, 1], [1, 2, 3], [4, 5, 6], [5, 7, 6], [0, 1, 4], [1, 5, 4],
                          [2, 6, 3], [3, 6, 7], [0, 4, 2], [2, 4, 6], [1, 3, 5], [3, 7, 5]])
            return c + (V * self.half_extents) @ R.T, F
        if self.kind == "cylinder":
            a = R @ self.axis
            L = self.length if math.isfinite(self.length) else 2 * extent
            u = _any_perpendicular(a)
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


def _combine_box_like(q, normals):
    """Signed distance of an intersection of slabs: q (k, j) per-slab distances,
    normals (k, j, 3) per-slab outward normals."""
    outside = np.maximum(q, 0.0)
    dist_out = np.linalg.norm(outside, axis=1)
    inside = dist_out == 0
    d = np.where(inside, q.max(axis=1), dist_out)
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
