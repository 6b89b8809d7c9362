"""Frames per second of ``tisim preview``: the preview's simulation alone (headless),
the scene drawer's host-side work per frame (positions, shadows), and the live loop as
the window runs it (poll, step, draw and render) on an off-screen GGUI window
(``ti.ui.Window(..., show_window=False)``; Mesa's lavapipe renders it on a machine
without a GPU). Each figure is frames / wall seconds over ``--frames`` frames after
``--warmup`` frames (kernel compilation and the first contact).

    python tools/preview_fps.py refine-drape --frames 60
    python tools/preview_fps.py refine-drape --json out/preview_fps.json

Run it from another tree's code (PYTHONPATH) to compare before and after a change.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace


class _OffscreenWindow:
    """A ti.ui.Window stand-in for the live loop: the real off-screen window draws, no
    key is ever pressed, and ``show`` reads the rendered image back (what makes GGUI
    render the frame off-screen, as presenting it would on screen)."""

    def __init__(self, real, size):
        self.real, self.size = real, size
        self.running = True

    def get_events(self, tag):
        return []

    def get_cursor_pos(self):
        return (0.9, 0.1)

    def is_pressed(self, *keys):
        return False

    def get_window_shape(self):
        return self.size

    def get_scene(self):
        return self.real.get_scene()

    def get_canvas(self):
        return self.real.get_canvas()

    def get_gui(self):
        return self.real.get_gui()

    def show(self):
        self.real.get_image_buffer_as_numpy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scene", nargs="?", default="refine-drape", help="a demo name or a scene file")
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=25, help="frames before the timings (compilation, first contact)")
    ap.add_argument("--size", default="640x480", help="window pixels WxH")
    ap.add_argument("--no-render", action="store_true", help="the headless figures only")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    from tisim import backend
    from tisim.cli.app import demos_dir
    from tisim.preview import PreviewSession
    from tisim.runner import scene_threads
    from tisim.scene import load_scene

    path = Path(a.scene) if Path(a.scene).exists() else demos_dir() / f"{a.scene}.toml"
    # the threads `tisim preview` takes (one on a 2-core machine; TI_CPU_MAX_NUM_THREADS wins)
    backend.init("cpu", "f64", threads=scene_threads(load_scene(path)))
    w, h = (int(v) for v in a.size.lower().split("x"))
    sets = [f"render.width={w}", f"render.height={h}"]
    out = {
        "scene": path.stem,
        "frames": a.frames,
        "warmup": a.warmup,
        "size": [w, h],
        "cores": os.cpu_count(),
        "taichi_threads": __import__("taichi").lang.impl.current_cfg().cpu_max_num_threads,
        "load_average_start": os.getloadavg(),
    }

    # the simulation alone: what `tisim preview` steps between two drawn frames
    s = PreviewSession(path, sets, arch="cpu")
    out["vertices"] = len(s.state.x)
    for _ in range(a.warmup):
        s.step()
    t0 = time.perf_counter()
    for _ in range(a.frames):
        s.step()
    out["headless_fps"] = a.frames / (time.perf_counter() - t0)
    print(
        f"{path.stem} preview ({out['vertices']} vertices): simulation {out['headless_fps']:.1f} frames/s", flush=True
    )

    if not a.no_render:
        from tisim.render import vulkan_available

        if not vulkan_available():
            print("no Vulkan driver: no rendered figures (install mesa-vulkan-drivers for lavapipe)")
        else:
            out.update(_rendered(path, sets, s, a, w, h))
    out["load_average_end"] = os.getloadavg()
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {a.json}")
    return 0


def _rendered(path, sets, s, a, w, h) -> dict:
    import numpy as np

    from tisim.preview import make_preview_viewer, run_preview
    from tisim.render.base import ViewInfo, checker_colors, drawn_ground
    from tisim.render.offscreen import SceneDrawer, acquire_window, release_window

    out = {}
    # the drawer's host work per frame (new positions, shadows on the floor), the
    # frames of a recorded take replayed
    lv = s.refiner.hierarchy.levels[0]
    info = ViewInfo(
        faces=s.faces,
        vertex_count=len(s.state.x),
        colliders=[c for c in s.refiner.model.colliders if c.visible],
        camera=s.scene.camera,
        render=s.scene.render,
        title="fps",
        face_colors=checker_colors(lv.faces, lv.uv, lv.face_uv, s.scene.render.color),
    )
    info.ground = drawn_ground(s.state.x, info.colliders, s.refiner.model.gravity)
    win = acquire_window(w, h, show=False)
    drawer = SceneDrawer(info)
    s.restart()
    take = []
    for _ in range(min(a.frames, 30)):
        s.step()
        take.append((s.state.t, s.state.x.copy()))
    drawer.update(*take[0][::-1])
    # with the still colliders' shadows cached, and (where the drawer caches them)
    # projected anew every frame as before, alternating frame by frame in this process
    cached = hasattr(drawer, "_shadow_static")
    ms = {"cached": [], "uncached": []}
    for k in range(a.frames):
        t, x = take[k % len(take)]
        for how in ("cached", "uncached") if cached else ("uncached",):
            if how == "uncached" and cached:
                drawer._shadow_static.clear()
            t0 = time.perf_counter()
            drawer.update(x, t + k)  # a new time each frame, as the live loop has
            ms[how].append(1e3 * (time.perf_counter() - t0))
    out["drawer_update_ms"] = float(np.median(ms["cached"] if cached else ms["uncached"]))
    out["drawer_update_uncached_ms"] = float(np.median(ms["uncached"]))
    print(
        f"  scene drawer, host work: {out['drawer_update_ms']:.2f} ms/frame median "
        f"(every shadow projected every frame: {out['drawer_update_uncached_ms']:.2f})",
        flush=True,
    )

    # the live loop: poll, step, draw, render (off-screen), as `tisim preview` runs it;
    # the frames after the warm-up, timed by when each one is shown. Where the drawer
    # caches still shadows, also with the cache emptied before every frame (as before it),
    # the two runs in turn in this process
    window = _OffscreenWindow(win, (w, h))
    shown = []
    real_show = window.show

    def show():
        real_show()
        shown.append(time.perf_counter())

    window.show = show
    real_update = SceneDrawer._update_shadows

    def uncached_update(self, *args):
        self._shadow_static.clear()
        return real_update(self, *args)

    for how in ("uncached", "cached") if cached else ("uncached",):
        shown.clear()
        SceneDrawer._update_shadows = uncached_update if (how == "uncached" and cached) else real_update
        try:
            run_preview(
                path,
                sets,
                viewer=make_preview_viewer(window=window),
                out_root=Path("/tmp"),
                arch="cpu",
                max_frames=a.warmup + a.frames,
                launch=lambda *x: SimpleNamespace(pid=0),
                echo=lambda *x: None,
            )
        finally:
            SceneDrawer._update_shadows = real_update
        out[f"live_fps_{how}"] = a.frames / max(shown[-1] - shown[a.warmup - 1], 1e-9)
    out["live_fps"] = out["live_fps_cached" if cached else "live_fps_uncached"]
    print(
        f"  live loop, off-screen ({w}x{h}): {out['live_fps']:.1f} frames/s"
        + (f" (every shadow projected every frame: {out['live_fps_uncached']:.1f})" if cached else ""),
        flush=True,
    )
    release_window()
    return out


if __name__ == "__main__":
    sys.exit(main())
