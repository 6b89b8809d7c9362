"""The Python API: what the command line does, from a script or a Jupyter notebook.

A session mirrors the CLI one call for one command::

    import tisim

    sim = tisim.load("stick-slip", **{"contact.mu": 0.18})   # tisim demo stick-slip --set contact.mu=0.18
    result = sim.run(frames=50)                               # the run; stats.csv, run.json in result.out_dir
    result.stats                                              # pandas DataFrame, one row per frame
    result.positions[-1]                                      # (n, 3) float, metres, the last frame
    result.video()                                            # an MP4 that plays inline in Jupyter
    tisim.compare("spinning-bar", ["admm", "implicit-euler"], frames=20).table
    tisim.sweep("stick-slip", {"contact.mu": [0.17, 0.18]}, frames=30)

Overrides are the ``--set`` keys of the CLI, dotted (``"contact.mu"``,
``"objects.box.youngs_modulus"``), passed as keyword arguments with ``**{...}``; a
key the scene does not accept is a :class:`tisim.config.ConfigError` naming it. Units
are SI throughout: metres, seconds, kilograms, joules, pascals.

Importing :mod:`tisim` does not import this module, Taichi or pandas; the first call
does. Taichi is initialised once per process (:mod:`tisim.backend`): the first
simulation fixes the backend and precision for the rest of the session.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tisim.compare import Comparison  # numpy only at import, like this module
from tisim.render.clip import Clip

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from tisim.scene import Scene

log = logging.getLogger(__name__)

__all__ = ["Clip", "Comparison", "Result", "Simulation", "compare", "demos", "load", "resolve_scene", "sweep"]


# --------------------------------------------------------------------------- scenes


def resolve_scene(scene: str | Path) -> Path:
    """See :func:`tisim.scene.resolve_scene`."""
    from tisim.scene import resolve_scene as resolve

    return resolve(scene)


def override_strings(overrides: Mapping[str, Any]) -> list[str]:
    """See :func:`tisim.scene.override_strings`."""
    from tisim.scene import override_strings as strings

    return strings(overrides)


def demos() -> pd.DataFrame:
    """The bundled demos as a DataFrame: ``name``, ``description``, ``look_for`` (what to
    watch in it), one row each, as ``tisim demo --list`` prints them."""
    import pandas as pd

    from tisim.demo_texts import demo_texts

    return pd.DataFrame([{"name": n, "description": d, "look_for": w} for n, d, w in demo_texts()])


def load(scene: str | Path, *, arch: str = "auto", precision: str | None = None, **overrides: Any) -> Simulation:
    """Load a scene file or a demo, with overrides, as ``tisim run``/``tisim demo`` do.

    Args:
        scene: a TOML scene file or a demo's name ("stick-slip").
        arch: Taichi backend, "auto", "cpu", "cuda" or "vulkan" (``--arch``).
        precision: "f64" or "f32" (``--precision``; default f64 on the CPU).
        **overrides: dotted scene keys and values (``--set``), e.g.
            ``**{"contact.mu": 0.18, "sim.dt": 0.005}``.

    Returns:
        A :class:`Simulation` (nothing is simulated or initialised yet).

    Raises:
        ConfigError: an unknown file, demo, key or out-of-range value, naming it.
    """
    from tisim.scene import load_scene

    path = resolve_scene(scene)
    sets = override_strings(overrides)
    return Simulation(load_scene(path, sets), arch=arch, precision=precision, overrides=tuple(sets))


# --------------------------------------------------------------------------- video


def _require_vulkan(what: str) -> None:
    from tisim.render import ViewerUnavailable, vulkan_available

    if not vulkan_available():
        raise ViewerUnavailable(
            f"{what} needs Vulkan for off-screen rendering (install a Vulkan driver, e.g. mesa-vulkan-drivers)"
        )


def _labelled(image: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    from tisim.render.text import draw_text

    return draw_text(image, list(lines)) if lines else image


# --------------------------------------------------------------------------- simulation


@dataclasses.dataclass
class Result:
    """One run: its statistics, positions and files.

    Attributes:
        stats: one row per frame (frame 0 is the initial state): ``time`` (s),
            ``kinetic``, ``potential``, ``total_energy`` (J), momenta ``px``..``lz``
            (kg m/s, kg m^2/s about the origin), centre of mass ``com_x``.. (m),
            ``min_volume_ratio`` (det F), ``iterations``, ``wall_ms`` and the solver's
            own columns: stats.csv as a DataFrame.
        positions: (frames + 1, n, 3) float, metres, every frame's vertex positions
            (with ``keep="last"``: the initial and the last frame only).
        out_dir: the folder with stats.csv and run.json (and frames/, the MP4 when
            rendered).
        ended: "completed", "diverged", "stalled" or "interrupted".
        message: why a run ended early ("" when completed).
        info: run.json's content (setup, timings, versions, machine).
    """

    stats: pd.DataFrame
    positions: np.ndarray
    out_dir: Path
    ended: str
    message: str
    info: dict
    simulation: Simulation
    _video: Path | None = None

    def __repr__(self) -> str:
        return (
            f"Result({self.simulation.name!r}, {self.ended}, {self.frames} frames, "
            f"positions {self.positions.shape}, out_dir={str(self.out_dir)!r})"
        )

    @property
    def frames(self) -> int:
        """Frames simulated (not counting the initial state)."""
        return int(self.info.get("frames_done", len(self.stats) - 1))

    @property
    def last_positions(self) -> np.ndarray:
        """(n, 3) float, metres: the vertex positions at the last frame."""
        return self.positions[-1]

    @property
    def median_ms(self) -> float:
        """Median wall-clock time of a frame, milliseconds."""
        return float((self.info.get("timings_ms") or {}).get("median", math.nan))

    def video(self, path: str | Path | None = None, *, labels: bool = True, width: int | None = 480) -> Clip:
        """The run as an MP4 (inline in Jupyter).

        A run made with ``render=True`` already has one; otherwise the kept positions
        are rendered now (off-screen GGUI), with the time and total energy written on
        each frame when ``labels``.

        Args:
            path: where to write the MP4 (default: ``out_dir/NAME.mp4``).
            labels: write the scene, time (s) and total energy (J) on each frame.
            width: display width in the notebook, pixels (None: the video's own).

        Raises:
            ViewerUnavailable: no Vulkan driver to render with.
        """
        if self._video is not None and self._video.exists():
            if path is not None and Path(path).resolve() != self._video.resolve():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self._video, path)
                return Clip(path, width=width)
            return Clip(self._video, width=width)
        if len(self.positions) != len(self.stats):
            raise ValueError(
                "this run kept only its last positions (keep='last'): run it with keep='all' or render=True for a video"
            )
        _require_vulkan("Result.video")
        from tisim.render.video import FrameWriter

        sim = self.simulation
        target = Path(path) if path is not None else self.out_dir / f"{sim.scene.name}.mp4"
        folder = target.parent / f".{target.stem}-frames"
        if folder.exists():
            shutil.rmtree(folder)
        writer = FrameWriter(folder, fps=sim.fps, video_name=target.name)
        t = self.stats["time"].to_numpy()
        E = self.stats["total_energy"].to_numpy()
        for i, x in enumerate(self.positions):
            lines = [sim.scene.name, f"t = {t[i]:.3f} s", f"E = {E[i]:.6g} J"] if labels else []
            writer.write(_labelled(sim.render_frame(x, time=float(t[i])), lines))
        made = writer.finish()
        if made is None:
            raise RuntimeError(f"no video encoder (ffmpeg from imageio-ffmpeg): the frames are in {writer.frames_dir}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(made), target)
        shutil.rmtree(folder, ignore_errors=True)
        self._video = target
        return Clip(target, width=width)


class Simulation:
    """A loaded scene, ready to run or render: what ``tisim.load`` returns.

    Attributes:
        scene: the validated :class:`tisim.scene.Scene` (frozen; :meth:`with_overrides`
            gives a changed copy).
        overrides: the ``--set`` texts applied.
    """

    def __init__(
        self, scene: Scene, *, arch: str = "auto", precision: str | None = None, overrides: tuple[str, ...] = ()
    ):
        self.scene = scene
        self.arch = arch
        self.precision = precision
        self.overrides = overrides
        self._model = None
        self._renderer = None

    def __repr__(self) -> str:
        sets = "".join(f", {s}" for s in self.overrides)
        return f"Simulation({self.scene.name!r}{sets})"

    @property
    def name(self) -> str:
        return self.scene.name

    @property
    def dt(self) -> float:
        """Simulated time of one frame, seconds (``sim.dt`` x ``sim.substeps``)."""
        return self.scene.sim.dt * self.scene.sim.substeps

    @property
    def fps(self) -> float:
        """Video frame rate: the scene's ``render.fps``, else real time (1 / frame time)."""
        return self.scene.render.fps or 1.0 / self.dt

    @property
    def model(self):
        """The built :class:`tisim.model.Model` (meshes, masses; numpy, no Taichi)."""
        if self._model is None:
            from tisim.model import Model

            self._model = Model.from_scene(self.scene)
        return self._model

    @property
    def rest_positions(self) -> np.ndarray:
        """(n, 3) float, metres: the vertex positions at frame 0."""
        return self.model.initial_positions.copy()

    def with_overrides(self, **overrides: Any) -> Simulation:
        """This scene with more overrides (dotted keys, as :func:`load`)."""
        from tisim.scene import load_scene

        sets = (*self.overrides, *override_strings(overrides))
        return Simulation(load_scene(self.scene.path, sets), arch=self.arch, precision=self.precision, overrides=sets)

    def default_out_dir(self) -> Path:
        """``out/NAME``, as ``tisim run`` writes (relative to the working directory)."""
        return Path("out") / self.scene.name

    def run(
        self,
        frames: int | None = None,
        *,
        out: str | Path | None = None,
        render: bool = False,
        keep: str = "all",
        export_meshes: bool = False,
        progress: bool = False,
    ) -> Result:
        """Simulate, as ``tisim run --headless`` does.

        Args:
            frames: number of frames (default: the scene's ``sim.frames``).
            out: output folder for stats.csv, run.json (and frames/, NAME.mp4, meshes/);
                default ``out/NAME``.
            render: render every frame off-screen (PNG frames and an MP4 in ``out``;
                needs Vulkan).
            keep: "all" keeps every frame's positions in ``Result.positions``, "last"
                only the initial and the last (for long runs of large meshes).
            export_meshes: write each frame's meshes to ``out/meshes`` (``--export-meshes``).
            progress: show the progress bar.

        Returns:
            A :class:`Result`. A run that diverges is returned, not raised:
            ``Result.ended`` says how it ended and ``Result.stats`` holds its frames.
        """
        import pandas as pd

        from tisim.runner import run_scene

        if keep not in ("all", "last"):
            raise ValueError(f"keep must be 'all' or 'last', got {keep!r}")
        out_dir = Path(out) if out is not None else self.default_out_dir()
        viewer = None
        if render:
            _require_vulkan("run(render=True)")
            viewer = recording_viewer(self.scene, out_dir, frames=frames)
        kept: list[np.ndarray] = []

        def on_frame(frame: int, state) -> None:
            if keep == "all" or frame == 0:
                kept.append(state.positions.copy())
            else:
                if len(kept) == 2:
                    kept[1] = state.positions.copy()
                else:
                    kept.append(state.positions.copy())

        res = run_scene(
            self.scene,
            out_dir,
            frames=frames,
            viewer=viewer,
            export_meshes=export_meshes,
            progress=progress,
            arch=self.arch,
            precision=self.precision,
            on_frame=on_frame,
        )
        stats = pd.read_csv(out_dir / "stats.csv") if (out_dir / "stats.csv").exists() else pd.DataFrame()
        return Result(
            stats=stats,
            positions=np.stack(kept) if kept else np.zeros((0, 0, 3)),
            out_dir=out_dir,
            ended=res.ended,
            message=res.message,
            info=res.info,
            simulation=self,
            _video=Path(res.video) if res.video else None,
        )

    def render_frame(
        self, positions: np.ndarray | None = None, *, time: float = 0.0, labels: Sequence[str] = ()
    ) -> np.ndarray:
        """Render one frame off-screen with the scene's camera and image size.

        Args:
            positions: (n, 3) float, metres (default: the initial positions).
            time: the simulated time, seconds (moving colliders are drawn where they
                are then).
            labels: lines of text written on the image's top-left corner.

        Returns:
            (height, width, 3) uint8 RGB image, row 0 at the top (``render.width`` x
            ``render.height`` of the scene; ``**{"render.width": 480}`` makes it smaller).

        Raises:
            ViewerUnavailable: no Vulkan driver.
        """
        _require_vulkan("render_frame")
        from tisim import backend
        from tisim.render.offscreen import OffscreenRenderer
        from tisim.runner import scene_precision, scene_threads

        backend.init(self.arch, scene_precision(self.scene, self.precision), threads=scene_threads(self.scene))
        x = self.model.initial_positions if positions is None else np.asarray(positions, dtype=np.float64)
        if x.shape != (self.model.vertex_count, 3):
            raise ValueError(f"positions must be ({self.model.vertex_count}, 3), got {x.shape}")
        from tisim.render import offscreen

        # the process has one GGUI window (tisim.render.offscreen): another simulation's
        # render of another size replaced it, and drawing into the old one would crash
        if self._renderer is None or self._renderer._window is not offscreen._window:
            from tisim.runner import view_info

            self._renderer = OffscreenRenderer()
            self._renderer.open(view_info(self.model, self.scene))
        self._renderer.draw(0, time, x)
        return _labelled(self._renderer.image(), labels)


def recording_viewer(scene: Scene, out_dir: str | Path, video_name: str | None = None, frames: int | None = None):
    """See :func:`tisim.render.offscreen.recording_viewer`."""
    from tisim.render.offscreen import recording_viewer as recorder

    return recorder(scene, out_dir, video_name, frames)


# --------------------------------------------------------------------------- compare and sweep


def compare(
    scene: str | Path,
    integrators: Sequence[str] = ("admm", "implicit-euler", "xpbd"),
    *,
    frames: int | None = None,
    out: str | Path | None = None,
    render: bool = True,
    arch: str = "auto",
    precision: str | None = None,
    **overrides: Any,
) -> Comparison:
    """Run one scene with several integrators, as ``tisim compare`` does: see
    :func:`tisim.compare.run_comparison` (``tisim.compare(...)`` calls it too)."""
    from tisim.compare import run_comparison

    return run_comparison(
        scene, integrators, frames=frames, out=out, render=render, arch=arch, precision=precision, **overrides
    )


def sweep(
    scene: str | Path,
    vary: Mapping[str, Sequence[Any]],
    *,
    frames: int | None = None,
    metrics: Sequence[str] = (),
    out: str | Path | None = None,
    workers: int | None = None,
    arch: str = "cpu",
    precision: str | None = None,
    progress: bool = False,
    **overrides: Any,
) -> pd.DataFrame:
    """Run a scene over a grid of values on local worker processes, as ``tisim sweep``:
    see :func:`tisim.sweep.run_grid` (``tisim.sweep(...)`` calls it too)."""
    from tisim.sweep import run_grid

    return run_grid(
        scene,
        vary,
        frames=frames,
        metrics=metrics,
        out=out,
        workers=workers,
        arch=arch,
        precision=precision,
        progress=progress,
        **overrides,
    )
