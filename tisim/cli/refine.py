"""``tisim refine``: a cloth scene or a bare cloth mesh file, previewed on a coarse level
and refined to finer ones (``tisim.progressive``). ``tisim.cli.app`` holds the command's
options; this module does the work, so the CLI module stays a table of commands."""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import typer

_MESH_SUFFIXES = (".obj", ".ply", ".stl", ".off", ".vtk", ".vtu", ".msh")

log = logging.getLogger(__name__)


def _without_frames(toml_text: str) -> str:
    """A generated scene's text without its frame count (which --frames sets)."""
    import re

    return re.sub(r"(?m)^frames = \d+$", "", toml_text)


def _spare_name(path: Path) -> Path:
    """``NAME.N.SUFFIX`` beside ``path``, with the first N not taken."""
    n = 1
    while (spare := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    return spare


def _previous_refine(out_dir: Path) -> dict:
    """The run.json of the refine in ``out_dir`` ({} when there is none)."""
    from tisim.progressive import read_json

    return read_json(out_dir / "run.json") or {}


def _refine_loops_as(previous: dict) -> None:
    """A resume compiles Taichi's kernel loops as the refine it continues did (serial or
    parallel, ``backend.SERIAL_LOOPS``; parallel before run.json recorded it), since the
    two differ in the last bits: TISIM_SERIAL_LOOPS, read when Taichi initialises (here
    and in the pipelined schedule's processes)."""
    if not previous:
        return
    want = "1" if previous.get("serial_loops") else "0"
    from tisim import backend

    if backend.is_initialized() and backend.SERIAL_LOOPS != (want == "1"):
        log.warning(
            "--resume: Taichi is already initialised in this process; its kernel loops may "
            "differ from the interrupted run's"
        )
    os.environ["TISIM_SERIAL_LOOPS"] = want


def _refine_threads(single: bool) -> None:
    """Single-threaded Taichi kernels for ``refine --deterministic``: Taichi reads
    TI_CPU_MAX_NUM_THREADS when it initialises (here and in the pipelined schedule's
    worker processes, which inherit the environment), and on one thread the kernel loops
    compile serial (``backend.SERIAL_LOOPS``), as in the pipelined schedule's processes on
    2 cores. On the CPU backend the cloth's sums run on one thread anyway
    (``backend.SERIAL_SUMS``), so reruns repeat bit for bit without it."""
    if not single:
        return
    from tisim import backend

    if backend.is_initialized() and os.environ.get("TI_CPU_MAX_NUM_THREADS") != "1":
        log.warning("--deterministic: Taichi is already initialised in this process; its kernels stay multi-threaded")
    os.environ["TI_CPU_MAX_NUM_THREADS"] = "1"


@dataclass
class _Options:
    """The command's options (see ``tisim refine --help``)."""

    levels: int | None = None
    frames: int | None = None
    out: Path | None = None
    schedule: str | None = None
    direct: bool = False
    resume: bool = False
    deterministic: bool = False
    drape_on: str | None = None
    pin: str | None = None
    wind: str | None = None
    remesh: bool = False
    no_render: bool = False
    arch: str = "auto"
    precision: str | None = None
    sets: list[str] | tuple[str, ...] = ()
    quiet: bool = False


def refine_command(source: Path, **options) -> int:
    """Run ``tisim refine SOURCE`` with the command's options (the keywords of
    :class:`_Options`); returns the exit code. ``remesh``: remesh every cloth object at load
    (``objects.NAME.remesh = true``; for a mesh file it is written into the scene made for it)."""
    return _Refine(source, _Options(**options)).run()


class _Refine:
    """One ``tisim refine``: find the source, write a scene for a mesh file, refine, report.
    A mesh that cannot be refined leaves nothing half-made behind."""

    def __init__(self, source: Path, o: _Options):
        self.source, self.o = source, o
        self.said: list[str] = []  # what the mesh command wrote, told once the refine is set up
        self.made: list[Path] = []  # files and folders this call created, for a refused mesh
        self.restore: list[tuple[Path, Path]] = []  # scenes it moved aside

    def run(self) -> int:
        from tisim.config import ConfigError
        from tisim.geometry.mesh import MeshError

        path = self._source_path()
        mesh_file = None
        if path.suffix.lower() in _MESH_SUFFIXES:
            mesh_file, path = path, self._scene_for_mesh(path)
        try:
            return self._refine_scene(path)
        except (ConfigError, MeshError) as e:
            if not self.made and not self.restore:
                raise
            self._undo()
            # name the user's file rather than the scene written for it
            if isinstance(e, MeshError):
                raise MeshError(e.detail, str(mesh_file)) from None
            raise ConfigError(e.key, e.detail, str(mesh_file)) from None

    def _source_path(self) -> Path:
        """The scene or mesh file (a demo's name is found among the demos); options that
        apply only to a mesh file are refused for a scene."""
        from tisim.config import ConfigError
        from tisim.resources import demos_dir

        o, path = self.o, self.source
        if not path.is_file() and (demos_dir() / f"{self.source}.toml").exists():
            path = demos_dir() / f"{self.source}.toml"
        if not path.exists():
            raise ConfigError("", "no such scene or mesh file", str(path))
        if o.schedule not in (None, "sequential", "pipelined"):
            raise ConfigError("--schedule", f"expected sequential or pipelined, got {o.schedule!r}")
        if path.suffix.lower() not in _MESH_SUFFIXES:
            for flag, given in (("--drape-on", o.drape_on), ("--pin", o.pin), ("--wind", o.wind)):
                if given is not None:
                    raise ConfigError(
                        flag,
                        f"applies to a mesh file; {path.name} is a scene: set it there "
                        "(colliders, objects.NAME.pin, [wind])",
                    )
        return path

    def _mesh_scene_text(self, path: Path) -> str:
        """The scene tisim writes for a bare mesh file, from --drape-on, --pin, --wind."""
        from tisim.config import ConfigError
        from tisim.progressive import scene_for_mesh

        o = self.o
        drape = o.drape_on or "sphere"
        if drape not in ("sphere", "ground", "box"):
            raise ConfigError("--drape-on", f"expected sphere, ground or box, got {drape!r}")
        if o.pin not in (None, "corners", "top-edge"):
            raise ConfigError("--pin", f"expected corners or top-edge, got {o.pin!r}")
        w = None
        if o.wind:
            try:
                w = tuple(float(c) for c in o.wind.split(","))
                assert len(w) == 3 and all(math.isfinite(c) for c in w)
            except (ValueError, AssertionError):
                raise ConfigError("--wind", f"expected three numbers vx,vy,vz, got {o.wind!r}") from None
        text = scene_for_mesh(path, drape_on=drape, pin=o.pin, wind=w, frames=o.frames or 100)
        if o.remesh:
            # in the scene written, so that rerunning it remeshes too
            text = re.sub(r'(?m)^(mesh = ".*")$', r"\1\nremesh = true", text, count=1)
        return text

    def _scene_for_mesh(self, path: Path) -> Path:
        """Write (or, with --resume, reuse) the scene for a mesh file in the output folder;
        an edited earlier scene is kept beside. Returns the scene's path."""
        o = self.o
        text = self._mesh_scene_text(path)
        out_dir = o.out if o.out is not None else Path("out") / f"{path.stem}-refine"
        if not out_dir.exists():
            self.made.append(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        scene_file = out_dir / f"{path.stem}.toml"
        if o.resume and scene_file.exists():
            # continue the refine that is there, with the scene it ran (perhaps edited)
            same = _without_frames(scene_file.read_text()) == _without_frames(text)
            typer.echo(
                f"resuming with the scene {scene_file} as it is"
                + ("" if same else " (not as these options would write it)")
            )
            return scene_file
        if scene_file.exists() and _without_frames(scene_file.read_text()) != _without_frames(text):
            # the user may have edited it (more than the frame count, which only -n changed)
            kept = _spare_name(scene_file)
            scene_file.rename(kept)
            self.restore.append((kept, scene_file))
            typer.echo(f"kept the earlier scene as {kept}")
        if not scene_file.exists():
            self.made.insert(0, scene_file)
        scene_file.write_text(text)
        # said once the refine has its levels (a mesh it cannot refine leaves no scene)
        self.said.append(f"wrote the scene {scene_file} (edit it and rerun: tisim refine {scene_file})")
        return scene_file

    def _undo(self) -> None:
        """Remove what this call made and put back the scenes it moved aside."""
        for p in self.made:
            if p.is_file():
                p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        for kept, original in self.restore:
            kept.rename(original)

    def _load(self, path: Path):
        from tisim.scene import load_scene

        o = self.o
        sc = load_scene(path, o.sets)
        if o.remesh:
            # every cloth object not remeshed already (a scene's own target length stays)
            extra = [
                f"objects.{k}.remesh=true" for k, o_ in sc.objects.items() if o_.kind == "cloth" and o_.remesh is False
            ]
            if extra:
                sc = load_scene(path, [*o.sets, *extra])
        return sc

    def _refine_scene(self, path: Path) -> int:
        from tisim.progressive import ProgressiveRefiner, pipeline_groups, pipeline_threads

        o = self.o
        sc = self._load(path)
        out_dir = o.out if o.out is not None else Path("out") / f"{sc.name}-refine"
        n = o.frames or sc.sim.frames
        previous = _previous_refine(out_dir) if o.resume else {}
        # a resume runs single-threaded if the refine it continues did
        _refine_threads(o.deterministic or previous.get("cpu_threads") == "1")
        _refine_loops_as(previous)
        if (o.schedule or sc.refine.schedule) == "pipelined":
            # this process steps the coarser levels beside the finer levels' processes: its
            # Taichi takes its share of the cores too (set before Taichi starts)
            for k, v in pipeline_threads(len(pipeline_groups(o.levels or sc.refine.levels))).items():
                os.environ.setdefault(k, v)
        r = ProgressiveRefiner(sc, out_dir, levels=o.levels, arch=o.arch, precision=o.precision, progress=not o.quiet)
        for line in self.said:
            typer.echo(line)
        counts = ", ".join(f"{lv.vertex_count}" for lv in r.hierarchy.levels)
        typer.echo(f"{r.L + 1} levels ({counts} vertices), {n} frames, schedule {o.schedule or sc.refine.schedule}")
        res = r.run(n, resume=o.resume, direct=o.direct, schedule=o.schedule, announce=_announcer(r))
        if res.nothing_to_do:
            typer.echo(f"{res.message} in {out_dir}/")
            return 0
        if res.ended != "completed":
            typer.echo(f"error: {res.message}", err=True)
            return res.exit_code
        self._report(r, res, out_dir, n)
        return 0

    def _report(self, r, res, out_dir: Path, n: int) -> None:
        """Render the levels (when Vulkan is there) and print the consistency figures."""
        from tisim.progressive import render_levels
        from tisim.render import vulkan_available

        if not self.o.no_render:
            if vulkan_available():
                paths = render_levels(r, n)
                if paths.get("side_by_side"):
                    typer.echo(f"side by side: {paths['side_by_side']}")
            else:
                log.warning("no Vulkan driver found: no images (meshes and stats are written)")
        c = res.info.get("consistency", {})
        for k, v in c.items():
            if k.startswith("level_"):
                typer.echo(
                    f"{k}: centre of mass within {100 * v['com_distance_max_rel']:.2f}% of the diagonal "
                    "of the preview's"
                )
        if "direct" in res.info:
            d = res.info["direct"]
            typer.echo(
                f"direct: coarse {d['level_0_median_ms']:.0f} ms/frame, fine "
                f"{d[f'level_{r.L}_median_ms']:.0f} ms/frame; direct coarse vs fine centre of mass "
                f"{100 * d['direct_com_distance_max_rel']:.2f}% of the diagonal"
            )
        typer.echo(f"wrote {out_dir}/ (level_*/, consistency.csv, consistency.png, run.json)")


def _announcer(r):
    """The line printed as each level finishes."""

    def announce(level, folder, li):
        what = "preview" if level == 0 else ("finest level" if level == r.L else f"level {level}")
        if not li.get("frames"):  # a resume found all its frames (and no earlier timings)
            typer.echo(f"{what} done: {folder}/ (its frames were there already)")
            return
        typer.echo(
            f"{what} done: {folder}/ ({li.get('median_ms', float('nan')):.0f} ms/frame median, "
            f"{li.get('seconds', float('nan')):.1f} s)"
        )

    return announce
