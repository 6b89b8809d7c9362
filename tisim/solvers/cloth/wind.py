"""Wind on cloth faces: a seeded gusty field and a simple per-face aerodynamic force."""

from __future__ import annotations

import numpy as np


class Wind:
    """Mean velocity times (1 + gust * noise(t, x)); noise is a sum of a few seeded
    travelling sinusoids (smooth in time and space, amplitude about 1).

    The force on a face of area A and unit normal n, with the air's velocity relative
    to the face v (c = n . v / |v|), is the normal pressure
    0.5 rho c_d A (v . n)|v . n| n plus a lift 0.5 rho c_l A |v|^2 |c| sqrt(1 - c^2)
    across the flow, split equally over the face's three vertices. The force is
    evaluated at the start of a step and held constant over it (explicit).
    """

    def __init__(self, config, length_scale: float = 1.0):
        self.c = config
        self.enabled = bool(np.any(config.velocity)) and config.air_density > 0
        rng = np.random.default_rng(config.seed)
        k = 4
        self.freq = 2 * np.pi / config.gust_period * rng.uniform(0.5, 1.5, k)
        self.phase = rng.uniform(0, 2 * np.pi, k)
        self.wavevec = rng.normal(size=(k, 3)) * (2 * np.pi / max(4 * length_scale, 1e-6))
        self.amp = rng.uniform(0.5, 1.0, k)
        self.amp /= np.sqrt((self.amp**2).sum() / 2)  # rms about 1

    def velocity(self, t: float, points: np.ndarray) -> np.ndarray:
        """(k, 3) wind velocity in m/s at ``points`` (k, 3) and time ``t``."""
        base = np.asarray(self.c.velocity, dtype=np.float64)
        if self.c.gust == 0:
            return np.broadcast_to(base, points.shape)
        arg = self.freq[None, :] * t + points @ self.wavevec.T + self.phase[None, :]
        noise = (self.amp[None, :] * np.sin(arg)).sum(axis=1) / np.sqrt(len(self.amp))
        return base[None, :] * (1.0 + self.c.gust * noise)[:, None]

    def forces(self, t: float, x: np.ndarray, v: np.ndarray, faces: np.ndarray) -> np.ndarray:
        """(n, 3) vertex forces in N on a cloth at positions ``x`` moving at ``v``."""
        f = np.zeros_like(x)
        if not self.enabled or len(faces) == 0:
            return f
        p = x[faces]
        nrm = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
        area2 = np.linalg.norm(nrm, axis=1)
        ok = area2 > 0
        n = np.zeros_like(nrm)
        n[ok] = nrm[ok] / area2[ok, None]
        area = 0.5 * area2
        vrel = self.velocity(t, p.mean(axis=1)) - v[faces].mean(axis=1)
        speed = np.linalg.norm(vrel, axis=1)
        vn = (vrel * n).sum(axis=1)
        rho = self.c.air_density
        force = (0.5 * rho * self.c.drag * area * vn * np.abs(vn))[:, None] * n
        if self.c.lift > 0:
            vhat = np.where(speed[:, None] > 0, vrel / np.maximum(speed, 1e-300)[:, None], 0.0)
            c = (n * vhat).sum(axis=1)
            cross = n - c[:, None] * vhat
            cn = np.linalg.norm(cross, axis=1)
            lift_dir = np.where(cn[:, None] > 1e-12, cross / np.maximum(cn, 1e-300)[:, None], 0.0)
            lift_dir *= np.sign(c)[:, None]
            mag = 0.5 * rho * self.c.lift * area * speed**2 * np.abs(c) * np.sqrt(np.maximum(1 - c * c, 0))
            force += mag[:, None] * lift_dir
        for k in range(3):
            np.add.at(f, faces[:, k], force / 3.0)
        return f
