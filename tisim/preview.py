"""``tisim preview``: the coarse level of a progressive scene live in GGUI, with a
parameter panel, and ``tisim refine`` of the current settings in the background.

The preview is level 0 of :class:`~tisim.progressive.ProgressiveRefiner` (the coarse
mesh with the finest level's shell energy through the prolongation), so what the
designer sees is what ``refine`` starts from. A slider change rebuilds the scene
with the panel's values (``--set`` overrides on top of the file and the command
line's own ``--set``) and restarts the take from frame 0; the take loops at the
scene's frame count. Key ``f`` (or the panel's "refine" button) launches
``python -m tisim refine SCENE --set ...`` with the current values in a background
process, its output and log in a new folder that it prints.

Limitations:
    The panel's parameters are the ones an animator tunes on a toss or drape:
    friction (``contact.mu``, the same key as in the scene file and every other
    panel), Young's modulus, wind (x and z) and the initial velocity; anything else
    goes through the scene file or ``--set``. Every change restarts the take.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tisim.config import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Param:
    """A panel parameter: its slider and how it maps onto the scene."""

    name: str
    low: float
    high: float
    log: bool = False


PARAMS = (
    Param("contact.mu", 0.0, 1.0),
    Param("youngs_modulus", 1e3, 1e9, log=True),
    Param("wind_x", -20.0, 20.0),
    Param("wind_z", -20.0, 20.0),
    Param("velocity_x", -10.0, 10.0),
    Param("velocity_y", -10.0, 10.0),
    Param("velocity_z", -10.0, 10.0),
)


def is_progressive(scene_path: Path, sets=()) -> bool:
    """Whether the scene file (with the ``--set`` overrides) has a ``[refine]`` table:
    a progressive scene, whose demo is the live preview. An unreadable file is not (the
    plain run reports what is wrong with it)."""
    from tisim.scene import apply_overrides, tomllib

    try:
        data = apply_overrides(tomllib.loads(Path(scene_path).read_text()), list(sets))
    except (OSError, UnicodeDecodeError, ValueError, ConfigError):
        return False
    return isinstance(data.get("refine"), dict)


def cloth_object(scene) -> str:
    """The name of the cloth object a progressive scene refines."""
    if scene.refine.object is not None:
        return scene.refine.object
    cloths = [k for k, o in scene.objects.items() if o.kind == "cloth"]
    if len(cloths) != 1:
        raise ConfigError("refine.object", f"the scene has {len(cloths)} cloth objects: name one", scene.path)
    return cloths[0]


def current_values(scene) -> dict[str, float]:
    """The panel's values as the scene has them."""
    name = cloth_object(scene)
    oc = scene.objects[name]
    mu = oc.friction if oc.friction is not None else scene.contact.mu
    return {
        "contact.mu": float(mu),
        "youngs_modulus": float(oc.youngs_modulus),
        "wind_x": float(scene.wind.velocity[0]),
        "wind_z": float(scene.wind.velocity[2]),
        "velocity_x": float(oc.velocity[0]),
        "velocity_y": float(oc.velocity[1]),
        "velocity_z": float(oc.velocity[2]),
    }


def overrides(scene, values: dict[str, float]) -> list[str]:
    """``--set`` strings that give ``scene`` the panel's ``values`` (only the keys
    given; unknown names raise ConfigError)."""
    unknown = sorted(set(values) - {p.name for p in PARAMS})
    if unknown:
        raise ConfigError(
            "preview", f"unknown panel parameter {unknown[0]!r}: expected one of {', '.join(p.name for p in PARAMS)}"
        )
    name = cloth_object(scene)
    oc = scene.objects[name]
    now = current_values(scene)
    v = {**now, **{k: float(x) for k, x in values.items()}}
    out = []
    if "contact.mu" in values:
        # the object's own friction wins over contact.mu: set whichever the scene uses
        out.append(
            f"objects.{name}.friction={v['contact.mu']!r}"
            if oc.friction is not None
            else f"contact.mu={v['contact.mu']!r}"
        )
    if "youngs_modulus" in values:
        out.append(f"objects.{name}.youngs_modulus={v['youngs_modulus']!r}")
    if {"wind_x", "wind_z"} & set(values):
        out.append(f"wind.velocity=[{v['wind_x']!r},{float(scene.wind.velocity[1])!r},{v['wind_z']!r}]")
    if {"velocity_x", "velocity_y", "velocity_z"} & set(values):
        out.append(f"objects.{name}.velocity=[{v['velocity_x']!r},{v['velocity_y']!r},{v['velocity_z']!r}]")
    return out


def refine_command(scene_path: Path, sets: list[str], out_dir: Path) -> list[str]:
    """The ``tisim refine`` command line for ``scene_path`` with ``sets``."""
    cmd = [sys.executable, "-m", "tisim", "refine", str(scene_path), "--out", str(out_dir), "--headless", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def launch_refine(scene_path: Path, sets: list[str], out_dir: Path) -> subprocess.Popen:
    """Start ``tisim refine`` in the background (its own session, so closing the
    preview does not stop it); stdout and stderr go to ``out_dir/refine.log``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    logf = open(out_dir / "refine.log", "w")  # the child owns it from here
    try:
        return subprocess.Popen(
            refine_command(scene_path, sets, out_dir),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        logf.close()


class PreviewSession:
    """The preview's simulation: level 0 of the refiner for the scene file with the
    command line's ``sets`` and the panel's values."""

    def __init__(
        self,
        scene_path: Path,
        sets: list[str] = (),
        *,
        arch: str = "auto",
        precision: str | None = None,
        work_dir: Path | None = None,
    ):
        from tisim.scene import load_scene

        self.path = Path(scene_path)
        self.sets = list(sets)
        self.arch, self.precision = arch, precision
        import tempfile

        # the refiner wants an output folder; the preview writes nothing into it
        self.work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="tisim-preview-"))
        self.base = load_scene(self.path, self.sets)
        self.values = current_values(self.base)
        self.changed: dict[str, float] = {}
        self._build()

    def scene_sets(self) -> list[str]:
        """The command line's overrides and the panel's changes, as ``--set`` strings."""
        return self.sets + overrides(self.base, self.changed)

    def _build(self) -> None:
        from tisim.progressive import ProgressiveRefiner
        from tisim.scene import load_scene

        self.scene = load_scene(self.path, self.scene_sets())
        self.refiner = ProgressiveRefiner(
            self.scene, self.work_dir, arch=self.arch, precision=self.precision, progress=False, export_meshes=False
        )
        self.solver = self.refiner.solver(0)
        self.handles = self.refiner.handles(0)
        self.restart()

    def restart(self) -> None:
        self.state = self.refiner.initial_state(0)
        self.frame = 0

    def set_values(self, values: dict[str, float]) -> None:
        """Take the panel's new values: rebuild the scene and restart the take."""
        overrides(self.base, values)  # validates the names before anything changes
        self.values.update(values)
        self.changed.update(values)
        self._build()

    @property
    def faces(self) -> np.ndarray:
        return self.refiner.hierarchy.levels[0].faces

    def step(self) -> str | None:
        """One frame of the preview (the scene's substeps); the take loops at its end. A
        frame whose step fails (an error, or non-finite positions) restarts the take: the
        window stays open. Returns that failure's one-line message, or None."""
        r = self.refiner
        if self.frame >= self.scene.sim.frames:
            self.restart()
            return None
        try:
            for _ in range(r.substeps):
                st = self.state
                self.state, _ = r.step_level(
                    0, st, st.x + r.h * st.v, r.tolerance(0), solver=self.solver, handles=self.handles
                )
            ok = bool(np.all(np.isfinite(self.state.x)))
            why = "non-finite positions"
        except Exception as exc:  # a live preview survives whatever a step did
            ok, why = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            msg = f"frame {self.frame + 1} failed ({why[:60]}): restarted the take"
            log.info("preview: %s", msg)
            self.restart()
            return msg
        self.frame += 1
        return None


def tunables(values: dict[str, float]):
    from tisim.solvers.base import Tunable

    return [Tunable(p.name, values[p.name], p.low, p.high, log=p.log) for p in PARAMS]


def live_unavailable_reason() -> str | None:
    """Why a live preview window cannot open here, or None."""
    from tisim.render import display_available, vulkan_available

    if not display_available():
        return "no display ($DISPLAY / $WAYLAND_DISPLAY unset)"
    if not vulkan_available():
        return "Vulkan is not available (install a Vulkan driver, e.g. mesa-vulkan-drivers)"
    return None


def make_preview_viewer(window=None):
    """The live viewer with a "refine" button and key ``f`` (``window``: an object
    with the ``ti.ui.Window`` interface, for off-screen tests)."""
    from tisim.render.ggui import GGUIViewer

    class PreviewViewer(GGUIViewer):
        refine_requested = False
        refine_status = ""

        def open(self, info):
            super().open(info)
            keys = self.controller.key_press

            def key_press(key):
                if key in ("f", "F"):
                    self.refine_requested = True
                else:
                    keys(key)

            self.controller.key_press = key_press

        def take_refine(self) -> bool:
            r, self.refine_requested = self.refine_requested, False
            return r

        def _draw_panel(self, gui) -> None:
            super()._draw_panel(gui)
            pw, ph = self._panel_size()
            with gui.sub_window("refine", self._PANEL_X, self._PANEL_Y + ph + 0.01, pw, 0.12) as g:
                if g.button("refine these settings (f)"):
                    self.refine_requested = True
                if self.refine_status:
                    g.text(self.refine_status)

    return PreviewViewer(window=window)


def run_preview(
    scene_path: Path,
    sets: list[str] = (),
    *,
    viewer,
    out_root: Path,
    arch: str = "auto",
    precision: str | None = None,
    max_frames: int | None = None,
    launch=launch_refine,
    echo=print,
) -> list[tuple[Path, object]]:
    """The preview loop: poll, apply the panel, step, draw; ``f`` launches a refine.
    Returns the (output folder, process) of every refine launched. ``max_frames``
    stops after that many drawn frames (tests)."""
    from tisim.render.base import ViewInfo, checker_colors

    session = PreviewSession(scene_path, sets, arch=arch, precision=precision)
    sc = session.scene
    lv = session.refiner.hierarchy.levels[0]
    info = ViewInfo(
        faces=session.faces,
        vertex_count=len(session.state.x),
        colliders=[c for c in session.refiner.model.colliders if c.visible],
        camera=sc.camera,
        render=sc.render,
        title=f"tisim preview: {sc.name}",
        tunables=tunables(session.values),
        face_colors=checker_colors(lv.faces, lv.uv, lv.face_uv, sc.render.color),
    )
    from tisim.render.base import drawn_ground

    info.ground = drawn_ground(session.state.x, info.colliders, session.refiner.model.gravity)
    launched = []
    drawn = 0
    viewer.open(info)
    try:
        while viewer.running:
            ev = viewer.poll()
            if ev.quit:
                break
            notify = getattr(viewer, "notify", None)
            if ev.tunable_changes:
                try:
                    session.set_values(ev.tunable_changes)
                except ConfigError as exc:
                    if notify is not None:
                        notify(f"refused: {exc}")
            elif ev.reset:
                session.restart()
            if viewer.take_refine():
                out = out_root / f"{sc.name}-refine-{time.strftime('%Y%m%d-%H%M%S')}-{len(launched)}"
                proc = launch(session.path, session.scene_sets(), out)
                launched.append((out, proc))
                viewer.refine_status = f"refining -> {out}"
                echo(
                    f"refine started (pid {getattr(proc, 'pid', '?')}): writing {out}/ "
                    f"(log: {out / 'refine.log'}); settings: {' '.join(session.scene_sets()) or 'the scene file'}"
                )
            if not ev.paused or ev.step_once:
                failed = session.step()
                if failed and notify is not None:
                    notify(failed)
            viewer.draw(session.frame, session.state.t, session.state.x)
            drawn += 1
            if max_frames is not None and drawn >= max_frames:
                break
    finally:
        viewer.close()
    return launched
