"""Per-frame checkpoints of each level: writing and reading them, making those on disk
a consistent start for a (resumed) refine, and a finished level's trajectory read back
from them (what drives the level above).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path

import numpy as np

from tisim.config import ConfigError
from tisim.outputs import read_json
from tisim.progressive.levels import LevelState


class Checkpoints:
    """The refiner's checkpoint and resume methods (mixed into ProgressiveRefiner: they use
    its ``out``, ``level_dir``, ``L``, ``hierarchy``, ``scene`` and ``_earlier_levels``)."""

    def checkpoint_path(self, level: int, frame: int) -> Path:
        return self.level_dir(level) / "checkpoints" / f"frame_{frame:05d}.npz"

    def save_checkpoint(self, level: int, frame: int, st: LevelState, steps: list[np.ndarray]) -> None:
        """Atomically write a finished frame: the level's state and the positions after
        each of the frame's steps (what the next level is driven by)."""
        p = self.checkpoint_path(level, frame)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.stem}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp.npz")
        np.savez(
            tmp,
            x=st.x,
            v=st.v,
            t=st.t,
            kappa=st.kappa,
            kappa_max=st.kappa_max,
            obstacles=st.obstacles if st.obstacles is not None else np.zeros((0, 3)),
            steps=np.stack(steps) if steps else np.zeros((0,) + st.x.shape),
        )
        os.replace(tmp, p)

    def load_checkpoint(self, level: int, frame: int):
        with np.load(self.checkpoint_path(level, frame)) as d:
            st = LevelState(
                x=d["x"].copy(),
                v=d["v"].copy(),
                t=float(d["t"]),
                kappa=float(d["kappa"]),
                kappa_max=float(d["kappa_max"]) if "kappa_max" in d else math.inf,
                obstacles=d["obstacles"].copy() if len(d["obstacles"]) else None,
            )
            return st, list(d["steps"])

    def last_checkpoint(self, level: int) -> int:
        """The last frame whose checkpoint is complete (-1: none)."""
        d = self.level_dir(level) / "checkpoints"
        if not d.is_dir():
            return -1
        frames = sorted(int(p.stem.split("_")[1]) for p in d.glob("frame_*.npz"))
        # frames are written in order; a gap means a later file is from an older run
        last = -1
        for f in frames:
            if f != last + 1:
                break
            last = f
        return last

    def prepare_outputs(self, resume: bool) -> list[int]:
        """Make the checkpoints on disk a consistent starting point before any level
        runs: without ``resume`` every level's old checkpoints go (a pipelined level
        would otherwise read the level below's frames from an earlier run); with it,
        each level keeps its frames up to the last one that the level below also
        has (a level cannot be ahead of the one driving it) and drops the rest.
        Returns the frame each level resumes from (-1: from the start). A resume of a
        refine made with other levels, another mesh or other scene values is refused
        (ConfigError): its frames would be mixed with this one's."""
        if resume:
            self._check_resumable()
        starts = []
        for level in range(self.L + 1):
            if not resume:  # an earlier, longer refine's pictures and meshes would stay
                from tisim.outputs import clear_earlier_frames

                clear_earlier_frames(self.level_dir(level))
            last = self.last_checkpoint(level) if resume else -1
            if level > 0:
                last = min(last, starts[-1])
            d = self.level_dir(level) / "checkpoints"
            if d.is_dir():
                for p in d.glob("frame_*.npz"):
                    if int(p.stem.split("_")[1]) > last:
                        p.unlink()
            (self.level_dir(level) / "level.json").unlink(missing_ok=True)
            starts.append(last)
        return starts

    def _check_resumable(self) -> None:
        """ConfigError unless the refine in ``self.out`` is this one: the same number of
        levels, vertices per level and scene values (its run.json, written when it
        started; colliders included), and checkpoints of this refine's sizes. The frame
        count, rendering and camera may change. (It builds no solver: building a finer
        level's solver before a coarser level steps changed that level's last bits.)"""
        again = "; rerun without --resume, or into another --out"
        prev = read_json(self.out / "run.json")
        if prev is not None:
            vertices = [lv.vertex_count for lv in self.hierarchy.levels]
            had = (prev.get("hierarchy") or {}).get("vertices")
            if had is not None and list(had) != vertices:
                raise ConfigError(
                    "",
                    f"cannot resume: the refine there has {len(had)} levels of "
                    f"{', '.join(map(str, had))} vertices, this one {len(vertices)} of "
                    f"{', '.join(map(str, vertices))}{again}",
                    str(self.out),
                )
            if isinstance(prev.get("scene"), dict):
                key, was, now = _first_difference(
                    prev["scene"], json.loads(json.dumps(self.scene.to_dict())), ignore=_RESUME_MAY_CHANGE
                )
                if key is not None:
                    raise ConfigError(
                        "", f"cannot resume: {key} was {was!r} there and is {now!r} now{again}", str(self.out)
                    )
        for level in range(self.L + 1):
            last = self.last_checkpoint(level)
            if last < 0:
                continue
            with np.load(self.checkpoint_path(level, last)) as d:
                n = len(d["x"])
            want = self.hierarchy.levels[level].vertex_count
            if n != want:
                raise ConfigError(
                    "",
                    f"cannot resume: level {level}'s checkpoints have {n} vertices, this refine's "
                    f"level {level} has {want}{again}",
                    str(self.out),
                )

    def _level_entry(self, level: int, li: dict) -> dict:
        """``level``'s entry in run.json: ``li``, or the resumed refine's entry when this
        run had no frame of the level to step (its timings would be lost: frames 0)."""
        if li.get("frames", 0) <= 0 and level in self._earlier_levels:
            return self._earlier_levels[level]
        return li

    def _with_earlier(self, levels: list[dict]) -> list[dict]:
        """``levels`` and the resumed refine's entries of the levels not among them, by level."""
        have = {e["level"] for e in levels}
        return sorted(levels + [e for k, e in self._earlier_levels.items() if k not in have], key=lambda e: e["level"])


class _Trajectory:
    """Positions x^t of a finished (or, pipelined, advancing) level, read from its
    checkpoints: x^{-1} = x^0 - h v^0; x^t for t >= 1 is in frame ceil(t / substeps)."""

    def __init__(self, refiner, level: int):  # a ProgressiveRefiner
        self.r = refiner
        self.level = level
        self._cache: dict[int, tuple] = {}

    def _frame(self, f: int):
        if f not in self._cache:
            p = self.r.checkpoint_path(self.level, f)
            waited = 0.0
            while not p.exists():  # pipelined: the level below is still working on it
                time.sleep(0.02)
                waited += 0.02
                if waited > 3600:
                    raise RuntimeError(f"level {self.level} frame {f} never arrived")
            if len(self._cache) > 4:
                self._cache.pop(min(self._cache))
            self._cache[f] = self.r.load_checkpoint(self.level, f)
        return self._cache[f]

    def at(self, t: int) -> np.ndarray:
        sub = self.r.substeps
        if t <= 0:
            st, _ = self._frame(0)
            return st.x if t == 0 else st.x - self.r.h * st.v
        _, steps = self._frame((t - 1) // sub + 1)
        return steps[(t - 1) % sub]


# scene values a --resume may change: the frame count, what a divergence does, the
# pictures, the text, the schedule
_RESUME_MAY_CHANGE = ("sim.frames", "sim.on_divergence", "render", "camera", "scene", "refine.schedule")


def _first_difference(a, b, ignore=(), key=""):
    """(dotted key, value in a, value in b) of the first difference between two JSON-like
    values, skipping the keys in ``ignore`` and their children; (None, None, None) when
    equal."""
    if key in ignore:
        return None, None, None
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            sub = f"{key}.{k}" if key else str(k)
            if k not in a or k not in b:
                if sub in ignore:
                    continue
                return sub, a.get(k), b.get(k)
            found = _first_difference(a[k], b[k], ignore, sub)
            if found[0] is not None:
                return found
        return None, None, None
    if json.dumps(a) != json.dumps(b):
        return key, a, b
    return None, None, None


def _read_rows(path: Path, last_frame: int) -> list[dict]:
    """The rows of an earlier stats.csv up to ``last_frame`` (numbers parsed)."""
    import csv

    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if int(r["frame"]) > last_frame:
                break
            out.append({k: (float(v) if v not in ("", None) else math.nan) for k, v in r.items()})
            out[-1]["frame"] = int(out[-1]["frame"])
    return out
