"""Frame time of the live loop while grabbing vs untouched, on the CPU (issue 43: within 20%).

    python tools/grab_fps.py twisting-bar cloth-drape --frames 40

Runs each demo's live loop twice through the replay viewer (no window, no rendering: the
loop's own cost, solver step + grab): untouched, and with a grab held on the object and
dragged around the window the whole time; prints the median ms per frame of each.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def run(demo: str, frames: int, grab: bool, sets: list[str]) -> tuple[float, int]:
    from tisim.render.replay import InputEvent, ReplayViewer
    from tisim.runner import run_scene
    from tisim.scene import load_scene

    scene = load_scene(ROOT / "demos" / f"{demo}.toml", [*sets, f"sim.frames={frames + 10}"])
    w, h = scene.render.width, scene.render.height
    events = []
    if grab:
        events.append(InputEvent(2, "press", on_object=True))
        for i in range(3, frames + 5):  # circle around the window's middle
            a = 2 * math.pi * i / 40
            events.append(InputEvent(i, "move", x=w / 2 + 0.25 * w * math.cos(a), y=h / 2 + 0.25 * h * math.sin(a)))
    v = ReplayViewer(events, tail=frames + 5 - (events[-1].at if events else 0))
    r = run_scene(scene, Path("/tmp/tisim-grab-fps") / demo, viewer=v, live=True, progress=False, arch="cpu")
    ms = np.asarray(r.frame_ms[2:])  # the first frames compile
    return float(np.median(ms)), v.log.grabs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("demos", nargs="+")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args(argv)
    from tisim import backend
    from tisim.runner import machine

    backend.init("cpu", "f64")
    m = machine()
    print(f"{m['cpu']}, {m['cores']} cores, load {m['load_average']}")
    for demo in a.demos:
        free, _ = run(demo, a.frames, False, a.set)
        held, grabs = run(demo, a.frames, True, a.set)
        print(
            f"{demo}: untouched {free:.1f} ms/frame, grabbing {held:.1f} ms/frame "
            f"({grabs} polls with the grab held): {100 * (held / free - 1):+.1f}%",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
