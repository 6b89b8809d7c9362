"""A toss at a hole: the toss demo's hit-or-miss metric on a level's centre of mass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tisim.config import ConfigError


@dataclass(frozen=True)
class Hole:
    """A rectangular hole in a horizontal surface: ``lo``, ``hi`` (2,) m, its extent
    along the two horizontal axes (x, z); ``top`` m, the height of the surface (y up)."""

    lo: tuple[float, float]
    hi: tuple[float, float]
    top: float

    @classmethod
    def from_boxes(cls, scene, prefix: str = "rim_") -> Hole:
        """The hole framed by the scene's four axis-aligned box colliders named
        ``{prefix}near``/``far`` (smaller/larger x) and ``{prefix}left``/``right``
        (smaller/larger z), whose tops are level (the toss demo's table)."""
        need = [f"{prefix}{k}" for k in ("near", "far", "left", "right")]
        missing = [k for k in need if k not in scene.colliders or scene.colliders[k].type != "box"]
        if missing:
            raise ConfigError(f"colliders.{missing[0]}", "expected a box collider framing the hole", scene.path)
        c = {k[len(prefix) :]: scene.colliders[k] for k in need}
        if any(any(abs(a) > 0 for a in b.rotation) for b in c.values()):
            raise ConfigError(f"colliders.{prefix}near", "the hole's boxes must not be rotated", scene.path)
        lo = (c["near"].position[0] + c["near"].half_extents[0], c["left"].position[2] + c["left"].half_extents[2])
        hi = (c["far"].position[0] - c["far"].half_extents[0], c["right"].position[2] - c["right"].half_extents[2])
        tops = [b.position[1] + b.half_extents[1] for b in c.values()]
        if not (lo[0] < hi[0] and lo[1] < hi[1]) or max(tops) - min(tops) > 1e-9:
            raise ConfigError(
                f"colliders.{prefix}near", "the four boxes do not frame a hole with a level top", scene.path
            )
        return cls(lo=lo, hi=hi, top=tops[0])


def through_hole(com: np.ndarray, hole: Hole) -> int | None:
    """The first frame at which a toy's centre of mass ``com`` ((frames, 3) m) is
    below the surface's top inside the hole's footprint (the toy went in), or None (a
    miss: it stayed on the surface, or fell past its edge outside the hole)."""
    com = np.asarray(com, dtype=np.float64).reshape(-1, 3)
    inside = (
        (com[:, 0] >= hole.lo[0])
        & (com[:, 0] <= hole.hi[0])
        & (com[:, 2] >= hole.lo[1])
        & (com[:, 2] <= hole.hi[1])
        & (com[:, 1] < hole.top)
    )
    hit = np.flatnonzero(inside)
    return int(hit[0]) if hit.size else None


def level_com(out: Path, level: int) -> np.ndarray:
    """(frames + 1, 3): a finished level's centre of mass per frame, from its stats.csv."""
    import csv

    with open(Path(out) / f"level_{level}" / "stats.csv") as f:
        return np.array([[float(r["com_x"]), float(r["com_y"]), float(r["com_z"])] for r in csv.DictReader(f)])
