"""What a refine reports: consistency.csv and consistency.png (each level's distance
from the preview), each level's frames and MP4 and the side-by-side video of all levels,
and the levels' timings.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def write_consistency(out: Path, L: int, diagonal: float) -> dict:
    """consistency.csv (per frame: each level's centre-of-mass distance from the
    preview, relative to the finest mesh's bounding-box diagonal, and kinetic-energy
    difference) and consistency.png. Returns the maxima."""
    import csv

    cols = {}
    for level in range(L + 1):
        with open(out / f"level_{level}" / "stats.csv") as f:
            rows = list(csv.DictReader(f))
        cols[level] = {
            "com": np.array([[float(r["com_x"]), float(r["com_y"]), float(r["com_z"])] for r in rows]),
            "ke": np.array([float(r["kinetic"]) for r in rows]),
            "time": np.array([float(r["time"]) for r in rows]),
            "second": np.array([float(r["second_difference"] or "nan") for r in rows]),
        }
    n = min(len(c["ke"]) for c in cols.values())
    summary = {}
    with open(out / "consistency.csv", "w", newline="") as f:
        w = csv.writer(f)
        head = ["frame", "time"]
        for level in range(1, L + 1):
            head += [
                f"com_distance_{level}",
                f"com_distance_rel_{level}",
                f"kinetic_{level}",
                f"kinetic_difference_{level}",
            ]
        w.writerow(["frame", "time", "kinetic_0"] + head[2:])
        for i in range(n):
            row = [i, cols[0]["time"][i], cols[0]["ke"][i]]
            for level in range(1, L + 1):
                d = float(np.linalg.norm(cols[level]["com"][i] - cols[0]["com"][i]))
                row += [d, d / diagonal, cols[level]["ke"][i], cols[level]["ke"][i] - cols[0]["ke"][i]]
            w.writerow(row)
    for level in range(1, L + 1):
        d = np.linalg.norm(cols[level]["com"][:n] - cols[0]["com"][:n], axis=1)
        summary[f"level_{level}"] = {
            "com_distance_max": float(d.max()),
            "com_distance_max_rel": float(d.max() / diagonal),
            "kinetic_difference_max": float(np.abs(cols[level]["ke"][:n] - cols[0]["ke"][:n]).max()),
        }
    summary["second_difference_max"] = {
        f"level_{k}": float(np.nanmax(c["second"])) if np.isfinite(c["second"]).any() else None for k, c in cols.items()
    }
    try:
        # a Figure of its own, not pyplot (which would switch a notebook's backend)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 3.6))
        FigureCanvasAgg(fig)
        ax = fig.subplots(1, 2)
        for level in range(L + 1):
            ax[1].plot(cols[level]["time"][:n], cols[level]["ke"][:n], label=f"level {level}")
            if level:
                d = np.linalg.norm(cols[level]["com"][:n] - cols[0]["com"][:n], axis=1) / diagonal
                ax[0].plot(cols[level]["time"][:n], 100 * d, label=f"level {level}")
        ax[0].set_xlabel("time (s)")
        # two lines: on one, the label was longer than the axis and cut at both ends
        ax[0].set_ylabel("centre-of-mass distance\nfrom preview (% of diagonal)")
        ax[1].set_xlabel("time (s)")
        ax[1].set_ylabel("kinetic energy (J)")
        for a in ax:
            if a.get_legend_handles_labels()[0]:
                a.legend()
            a.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "consistency.png", dpi=90)
    except Exception as e:  # the numbers are in the CSV either way
        log.warning("could not draw consistency.png: %s", e)
    return summary


def render_levels(refiner, frames: int) -> dict:
    """PNG frames and an MP4 per level from its checkpoints, and a side-by-side MP4 of
    all levels (``levels.mp4``). Returns the paths written."""
    from tisim.render.base import ViewInfo, checker_colors
    from tisim.render.offscreen import OffscreenRenderer
    from tisim.render.video import FrameWriter

    scene = refiner.scene
    fps = scene.render.fps or 1.0 / (scene.sim.dt * scene.sim.substeps)
    out = {}
    images: dict[int, list[Path]] = {}
    for level in range(refiner.L + 1):
        lv = refiner.hierarchy.levels[level]
        d = refiner.level_dir(level)
        writer = FrameWriter(d, fps=fps, video_name=f"level_{level}.mp4")
        r = OffscreenRenderer(writer)
        r.open(
            ViewInfo(
                faces=lv.faces,
                vertex_count=lv.vertex_count,
                colliders=[c for c in refiner.model.colliders if c.visible],
                camera=scene.camera,
                render=scene.render,
                title=f"level {level}",
                face_colors=checker_colors(lv.faces, lv.uv, lv.face_uv, scene.render.color),
            )
        )
        for f in range(frames + 1):
            if not refiner.checkpoint_path(level, f).exists():
                break
            st, _ = refiner.load_checkpoint(level, f)
            r.draw(f, st.t, st.x)
        r.close()
        out[f"level_{level}"] = str(r.video_path) if r.video_path else None
        images[level] = sorted((d / "frames").glob("frame_*.png"))
    n = min(len(v) for v in images.values()) if images else 0
    if n:
        from tisim.render.video import write_side_by_side

        levels = sorted(images)
        ms = level_timings(refiner)
        labels = []
        for k in levels:
            lv = refiner.hierarchy.levels[k]
            what = " (preview)" if k == 0 else (" (finest)" if k == refiner.L else "")
            head = [
                f"level {k}{what}",
                f"{lv.vertex_count} vertices",
                f"{ms[k]:.0f} ms/frame" if math.isfinite(ms.get(k, math.nan)) else "ms/frame: n/a",
            ]
            labels.append([[*head, f"t = {i * scene.sim.dt * scene.sim.substeps:.2f} s"] for i in range(n)])
        path = write_side_by_side(
            [images[k][:n] for k in levels], labels, refiner.out / "side_by_side", fps=fps, video_name="levels.mp4"
        )
        out["side_by_side"] = str(path) if path else None
    return out


def level_timings(refiner) -> dict[int, float]:
    """{level: median wall-clock ms per frame} from each level's stats.csv (frames that
    stepped; NaN when there is none)."""
    import csv

    out = {}
    for level in range(refiner.L + 1):
        f = refiner.level_dir(level) / "stats.csv"
        ms = []
        if f.exists():
            with open(f, newline="") as fh:
                for row in csv.DictReader(fh):
                    v = row.get("wall_ms") or ""
                    if v and int(float(row.get("frame") or 0)) > 0:
                        ms.append(float(v))
        out[level] = float(np.median(ms)) if ms else math.nan
    return out
