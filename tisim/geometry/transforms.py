"""Rotations (numpy)."""

from __future__ import annotations

import numpy as np


def euler_xyz_deg(angles) -> np.ndarray:
    """(3, 3) rotation of XYZ Euler angles in degrees (x applied first)."""
    ax, ay, az = np.radians(np.asarray(angles, dtype=np.float64))
    cx, sx, cy, sy, cz, sz = np.cos(ax), np.sin(ax), np.cos(ay), np.sin(ay), np.cos(az), np.sin(az)
    Rx = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    Ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    Rz = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return Rz @ Ry @ Rx


def rotation_vector(w) -> np.ndarray:
    """(3, 3) rotation by the rotation vector ``w`` (axis * angle, radians), Rodrigues' formula."""
    w = np.asarray(w, dtype=np.float64)
    th = float(np.linalg.norm(w))
    if th < 1e-300:
        return np.eye(3)
    k = w / th
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(th) * K + (1 - np.cos(th)) * (K @ K)
