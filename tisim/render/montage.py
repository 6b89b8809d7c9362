"""The first, middle and last frame of a demo, rendered off-screen, and the pixel test
that the object is in view in each (``tools/montage.py`` makes docs/montage.png from them;
tests/demos/test_demo_frames.py checks every demo).

A progressive demo (a [refine] table) is shown by its coarse preview level, as
`tisim demo` shows it live. Needs Vulkan (off-screen GGUI).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tomllib

IN_VIEW = 0.002  # the least fraction of a frame's pixels in the object's colour
THUMB = (320, 240)


def _demos() -> Path:
    from tisim.resources import demos_dir

    return demos_dir()


def quick_sets(demo: str) -> list[str]:
    """Overrides that shrink every object of ``demo`` (the frame count stays); ADMM solves
    to a relative residual of 1e-4 (a thumbnail's motion is the same to the eye; it halves
    the time of the ADMM demos). Balls are of resolution 4 at most (bouncing-ball's 600 ADMM
    steps: 17 -> 10 s; cloth-on-ball 24-28 s either way)."""
    data = tomllib.loads((_demos() / f"{demo}.toml").read_text())
    sets = [f"render.width={THUMB[0]}", f"render.height={THUMB[1]}"]
    solver = data.get("solver", {})
    if solver.get("type") == "admm":
        sets.append(f"solver.tolerance={max(float(solver.get('tolerance', 0)), 1e-4)}")
    for name, o in data.get("objects", {}).items():
        if "resolution" in o:
            r = [max(2, int(v) // 3) for v in o["resolution"]]
            sets.append(f"objects.{name}.resolution=[{r[0]},{r[1]},{r[2]}]")
        if "ball_resolution" in o:
            sets.append(f"objects.{name}.ball_resolution={min(float(o['ball_resolution']), 4.0)}")
        if "cloth_resolution" in o:
            c = o["cloth_resolution"]
            sets.append(f"objects.{name}.cloth_resolution=[{max(4, c[0] // 2)},{max(4, c[1] // 2)}]")
    return sets


class _Picker:
    """An off-screen viewer that renders only the frames in ``wanted`` (without overlay)."""

    def __init__(self, wanted):
        from tisim.render.offscreen import OffscreenRenderer

        self.r = OffscreenRenderer()
        self.wanted = set(wanted)
        self.images: dict[int, np.ndarray] = {}
        self.info = None

    def open(self, info):
        self.info = info
        self.r.open(info)

    def draw(self, frame, time, positions, extra_points=None):
        if frame in self.wanted:
            self.r.draw(frame, time, positions, extra_points)
            self.images[frame] = self.r.image()
            self.positions = positions

    def poll(self):
        return self.r.poll()

    def close(self):
        self.r.close()

    @property
    def running(self):
        return True


def object_colors(info) -> np.ndarray:
    """(c, 3) the objects' base colours in a ViewInfo (render.color, the palette colours of
    further objects, a cloth's checker), one row per direction in RGB."""
    if info.face_colors is not None:
        rows = np.asarray(info.face_colors, dtype=np.float64)
    else:
        vc = info.vertex_colors()
        rows = np.asarray([info.render.color] if vc is None else vc, dtype=np.float64)
    rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return np.unique(np.round(rows, 2), axis=0)


def object_pixels(image: np.ndarray, colors) -> float:
    """The fraction of ``image``'s pixels in an object's hue (one of ``colors`` (c, 3),
    lit or shaded): the pixel test's measure of the objects being in view."""
    img = image.astype(np.float64) / 255.0
    c = np.atleast_2d(np.asarray(colors, dtype=np.float64))
    c = c / np.linalg.norm(c, axis=1, keepdims=True)
    # shading scales a colour: compare directions in RGB, on pixels that are not dark
    norm = np.linalg.norm(img, axis=2)
    cos = (img @ c.T).max(axis=2) / np.maximum(norm, 1e-9)
    return float(np.mean((cos > 0.985) & (norm > 0.15)))


def demo_frames(demo: str, sets: list[str], out: Path):
    """(images (3,), frame numbers, the objects' colours (c, 3)) of ``demo``'s first, middle
    and last frame."""
    from tisim.preview import is_progressive
    from tisim.runner import run_scene
    from tisim.scene import load_scene

    path = _demos() / f"{demo}.toml"
    if is_progressive(path, sets):
        return preview_frames(path, sets)
    scene = load_scene(path, sets)
    n = scene.sim.frames
    wanted = [0, n // 2, n]
    v = _Picker(wanted)
    r = run_scene(scene, out / demo, viewer=v, progress=False, arch="cpu")
    if r.ended != "completed":
        raise RuntimeError(f"{demo}: {r.ended}: {r.message}")
    return [v.images[f] for f in wanted], wanted, object_colors(v.info)


def preview_frames(path: Path, sets: list[str]):
    from tisim.preview import PreviewSession
    from tisim.render.base import ViewInfo, checker_colors, drawn_ground

    session = PreviewSession(path, sets)
    sc = session.scene
    lv = session.refiner.hierarchy.levels[0]
    info = ViewInfo(
        faces=session.faces,
        vertex_count=len(session.state.x),
        colliders=[c for c in session.refiner.model.colliders if c.visible],
        camera=sc.camera,
        render=sc.render,
        face_colors=checker_colors(lv.faces, lv.uv, lv.face_uv, sc.render.color),
    )
    info.ground = drawn_ground(session.state.x, info.colliders, session.refiner.model.gravity)
    n = sc.sim.frames
    wanted = [0, n // 2, n - 1]
    v = _Picker(wanted)
    v.open(info)
    images = []
    for f in range(n):
        if f in wanted:
            v.draw(f, session.state.t, session.state.x)
            images.append(v.images[f])
        session.step()
    v.close()
    return images, wanted, object_colors(info)
