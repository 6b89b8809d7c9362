"""``tisim``: run demos and scenes, compare integrators, print the set-up.

Every user mistake (bad scene, bad mesh, bad option) is one line on stderr and
exit code 2; ``--debug`` shows the traceback as well.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="tisim: soft bodies and cloth in Taichi. Demos, scenes, integrator comparisons.",
    pretty_exceptions_enable=False,
    # plain text: docstrings' line breaks are joined and "[refine]" is not read as markup
    rich_markup_mode=None,
)

_DEBUG = {"on": False}

log = logging.getLogger(__name__)


def _die(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _user_errors():
    from tisim.backend import BackendError
    from tisim.config import ConfigError
    from tisim.geometry.mesh import MeshError
    from tisim.linalg.cholesky import FactorizationError

    return (ConfigError, MeshError, BackendError, FactorizationError)


def _setup_logging(debug: bool, quiet: bool = False) -> None:
    level = logging.DEBUG if debug else (logging.WARNING if quiet else logging.INFO)
    logging.basicConfig(
        level=level,
        format="%(levelname)s: %(message)s" if not debug else "%(levelname)s %(name)s: %(message)s",
        force=True,
    )


def _quiet(quiet: bool, ctx: typer.Context) -> None:
    """``--quiet``: only warnings and errors reach the terminal besides the command's
    result lines: no INFO logs and no Taichi banner (in this process and in the ones it
    starts, which inherit the environment: Taichi reads ENABLE_TAICHI_HEADER_PRINT when
    imported, tisim.backend.init TISIM_QUIET). ``--debug`` wins. The environment and the
    log level are restored when the command (``ctx``) ends: it may run in-process (tests)."""
    if not quiet or _DEBUG["on"]:
        return
    saved = {k: os.environ.get(k) for k in ("ENABLE_TAICHI_HEADER_PRINT", "TISIM_QUIET")}
    level = logging.getLogger().level
    _setup_logging(False, quiet=True)
    os.environ.update(ENABLE_TAICHI_HEADER_PRINT="False", TISIM_QUIET="1")

    def restore() -> None:
        logging.getLogger().setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    ctx.call_on_close(restore)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
):
    _DEBUG["on"] = debug
    _setup_logging(debug)


def demos_dir() -> Path:
    """Where the demo scenes are: the copy shipped inside the installed package,
    or the source tree's demos/ (see tisim.resources)."""
    from tisim.resources import demos_dir as _demos_dir

    return _demos_dir()


def list_demos() -> list[tuple[str, str]]:
    """(name, whole description on one line) of every bundled demo, sorted by name."""
    from tisim.demo_texts import demo_texts

    return [(name, desc) for name, desc, _ in demo_texts()]


def _wrapped(label: str, text: str, indent: int, width: int) -> list[str]:
    """``label`` padded to ``indent`` then ``text`` wrapped to ``width`` columns, the
    continuation lines indented under the text."""
    import textwrap

    # whole words, hyphenated ones too (a demo name cut at its hyphen reads as two words)
    lines = textwrap.wrap(text, max(20, width - indent), break_on_hyphens=False, break_long_words=False) or [""]
    return [(label.ljust(indent) if i == 0 else " " * indent) + ln for i, ln in enumerate(lines)]


def _terminal_width() -> int:
    import shutil

    return min(shutil.get_terminal_size((100, 24)).columns, 120)


def _print_demo_list() -> None:
    """``tisim demo --list``: each demo's whole description, wrapped under its name."""
    demos = list_demos()
    indent = max((len(n) for n, _ in demos), default=0) + 2
    width = _terminal_width()
    for n, d in demos:
        typer.echo("\n".join(_wrapped(n, d, indent, width)))
    typer.echo(f"\n{len(demos)} demos: tisim demo NAME runs one, tisim demo NAME --about says what to look for.")


def _print_demo_about(name: str) -> None:
    """``tisim demo NAME --about``: the description, what to look for, how to run it."""
    from tisim.demo_texts import demo_text

    desc, look = demo_text(demos_dir() / f"{name}.toml")
    width = _terminal_width()
    typer.echo(name)
    typer.echo("\n".join(_wrapped("", desc, 2, width)))
    if look:
        typer.echo("\nWhat to look for:")
        typer.echo("\n".join(_wrapped("", look, 2, width)))
    typer.echo(f"\nRun it: tisim demo {name} (add --headless for PNG frames and an MP4 in out/{name}/)")


def _run(
    scene_path: Path,
    *,
    frames: int | None,
    headless: bool,
    out: Path | None,
    no_render: bool,
    export_meshes: bool,
    arch: str,
    precision: str | None,
    sets: list[str],
    quiet: bool,
    size: str | None = None,
) -> int:
    from tisim.scene import load_scene

    scene = load_scene(scene_path, [*sets, *_size_overrides(size)])
    out_dir = _out_folder(out if out is not None else Path("out") / scene.name)
    from tisim.render import display_available, vulkan_available

    live = not headless and not no_render and display_available()
    viewer = None
    if live:
        from tisim.render.ggui import GGUIViewer

        viewer = GGUIViewer()
    elif not no_render:
        if vulkan_available():
            from tisim.api import recording_viewer

            viewer = recording_viewer(scene, out_dir, frames=frames)
        else:
            log.warning(
                "no Vulkan driver found: running headless without images "
                "(install mesa-vulkan-drivers, or run 'make setup' as root, to get PNG frames and an MP4)"
            )
    from tisim.runner import run_scene

    result = run_scene(
        scene,
        out_dir,
        frames=frames,
        viewer=viewer,
        export_meshes=export_meshes,
        progress=not quiet,
        arch=arch,
        precision=precision,
        live=live,
    )
    msg = f"{result.ended}: {result.frames_done} frames in {out_dir}/ (stats.csv, run.json"
    if result.video:
        msg += f", frames/, {Path(result.video).name}"
    if export_meshes:
        msg += ", meshes/"
    msg += ")"
    if result.info.get("timings_ms") and result.frames_done:
        msg += f"; median {result.info['timings_ms']['median']:.1f} ms/frame"
    typer.echo(msg)
    stalls = result.info.get("stalls") or {}
    if stalls.get("stalled_steps") or "stalls" in (result.info.get("solver_info") or {}):
        typer.echo(
            f"stalled steps: {stalls.get('stalled_steps', 0)} ({stalls.get('retries', 0)} retries; "
            f"{stalls.get('recovered', 0)} recovered, {stalls.get('failed', 0)} failed)"
        )
    if result.ended in ("diverged", "stalled"):
        typer.echo(f"error: {result.message}", err=True)
    return result.exit_code


def _run_file(scene_path: Path, **kw) -> int:
    """``tisim run``: a scene file; a demo's name, or a mesh file, gets the command it needs."""
    from tisim.config import ConfigError

    if not scene_path.exists() and (demos_dir() / f"{scene_path}.toml").exists():
        raise ConfigError(
            "", f"no such scene file; {scene_path} is a demo: run it with `tisim demo {scene_path}`", str(scene_path)
        )
    if scene_path.is_file() and scene_path.suffix.lower() in (".obj", ".ply", ".stl", ".off", ".msh", ".vtk"):
        raise ConfigError(
            "",
            "a mesh, not a scene: name it in a scene file (`mesh = ...` in an [objects.NAME] "
            "table), or refine a cloth mesh with `tisim refine`",
            str(scene_path),
        )
    return _run(scene_path, **kw)


def _ended_code(ended: str, error: str | None = None) -> int:
    """The exit code ``tisim run`` gives a run that ended so (tisim.runner.RunResult):
    diverged 3, stalled 4, interrupted 130; a run that raised: 2 for the user's mistake
    (``error``, the exception's class name, one of _user_errors), else 1 (internal)."""
    from tisim.runner import RunResult

    if ended == "failed":
        return 2 if error in {c.__name__ for c in _user_errors()} else 1
    return RunResult(Path(), 0, ended).exit_code


def _overall_code(codes) -> int:
    """One exit code for several runs (compare, sweep): 0 when all completed, else the
    first of Ctrl-C (130), a failure (1, 2), a divergence (3), a stall (4) found."""
    bad = {c for c in codes if c}
    return next((c for c in (130, 1, 2, 3, 4) if c in bad), max(bad, default=0))


MAX_IMAGE_SIDE = 8192


def _size_overrides(size: str | None) -> list[str]:
    """``--size WxH`` as the overrides render.width=W, render.height=H."""
    if size is None:
        return []
    from tisim.config import ConfigError

    parts = size.lower().replace("\u00d7", "x").split("x")
    # 8192: the largest image the renderer and the video encoder take everywhere (100000 x
    # 100000 aborted Taichi's renderer; 19200 x 10800 rendered for minutes and ffmpeg refused it)
    if len(parts) != 2 or not all(p.strip().isdigit() and 16 <= int(p) <= MAX_IMAGE_SIDE for p in parts):
        raise ConfigError(
            "--size", f"expected WIDTHxHEIGHT in pixels, each from 16 to {MAX_IMAGE_SIDE} (e.g. 1280x720), got {size!r}"
        )
    return [f"render.width={int(parts[0])}", f"render.height={int(parts[1])}"]


def _out_folder(path: Path, option: str = "--out") -> Path:
    """Check that the output folder ``path`` can be made, without making it (a run that
    fails its own checks leaves nothing behind): a path that is a file, below a file or
    in a folder that cannot be written is the user's one-line error (it was an internal
    error)."""
    import os

    from tisim.config import ConfigError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(option, f"expected a folder, got the file {str(path)!r}")
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(option, f"cannot create the folder {str(path)!r}: {str(parent)!r} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            option, f"cannot create or write the folder {str(path)!r}: no permission to write in {str(parent)!r}"
        )
    return path


def _guard(fn, *args, **kwargs) -> int:
    try:
        return fn(*args, **kwargs)
    except typer.Exit:
        raise
    except _user_errors() as e:
        if _DEBUG["on"]:  # the traceback too, and the same exit code
            traceback.print_exc()
        _die(str(e))
    except Exception as e:  # a bug, not the user's mistake: one line unless --debug
        if _DEBUG["on"]:
            traceback.print_exc()
        if isinstance(e, OSError) and e.filename is not None:
            # a file that cannot be written or read where the user pointed (a full disk,
            # a file where a folder goes, no permission): theirs to fix, in one line
            _die(f"{e.filename}: {e.strerror or e}")
            _die(f"internal error: {type(e).__name__}: {e}", 1)
        _die(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", 1)
    return 0


_FRAMES = typer.Option(None, "--frames", "-n", help="Number of frames (default: the scene's).", min=1)
_HEADLESS = typer.Option(False, "--headless", help="No window: render off-screen to PNG frames + MP4.")
_OUT = typer.Option(None, "--out", "-o", help="Output folder (default: out/<scene>).")
_NO_RENDER = typer.Option(False, "--no-render", help="Write no images (stats and run.json only).")
_EXPORT = typer.Option(
    False,
    "--export-meshes",
    help="Write every frame's meshes to meshes/: the solids' surface (.ply), each cloth with its UVs (.obj).",
)
_ARCH = typer.Option("auto", "--arch", help="Taichi backend: auto, cpu, cuda, vulkan.")
_PREC = typer.Option(None, "--precision", help="f64 (CPU default) or f32 (GPU default).")
_SET = typer.Option([], "--set", "-s", help="Override a scene value: --set contact.mu=0.3 (repeatable).")
_QUIET = typer.Option(
    False, "--quiet", "-q", help="No progress bar and no INFO lines: only warnings, errors and the result."
)
_SIZE = typer.Option(None, "--size", help="Image size in pixels, WxH (e.g. 1280x720; default: the scene's).")


@app.command()
def run(
    ctx: typer.Context,
    scene: Path = typer.Argument(..., help="A scene file (TOML)."),
    frames: int | None = _FRAMES,
    headless: bool = _HEADLESS,
    out: Path | None = _OUT,
    no_render: bool = _NO_RENDER,
    export_meshes: bool = _EXPORT,
    arch: str = _ARCH,
    precision: str | None = _PREC,
    set: list[str] = _SET,  # the option is called --set
    quiet: bool = _QUIET,
    size: str | None = _SIZE,
):
    """Run a scene file."""
    _quiet(quiet, ctx)
    code = _guard(
        _run_file,
        scene,
        frames=frames,
        headless=headless,
        out=out,
        no_render=no_render,
        export_meshes=export_meshes,
        arch=arch,
        precision=precision,
        sets=set,
        quiet=quiet,
        size=size,
    )
    raise typer.Exit(code)


@app.command()
def demo(
    ctx: typer.Context,
    name: str | None = typer.Argument(None, help="Demo name (see --list)."),
    list_: bool = typer.Option(False, "--list", "-l", help="List the demos with their descriptions."),
    about: bool = typer.Option(
        False, "--about", help="Print the demo's description and what to look for in it, without running it."
    ),
    frames: int | None = _FRAMES,
    headless: bool = _HEADLESS,
    out: Path | None = _OUT,
    no_render: bool = _NO_RENDER,
    export_meshes: bool = _EXPORT,
    arch: str = _ARCH,
    precision: str | None = _PREC,
    set: list[str] = _SET,
    quiet: bool = _QUIET,
    size: str | None = _SIZE,
):
    """Run a bundled demo (tisim demo --list shows them). A progressive cloth demo (one
    with a [refine] table) opens its coarse preview live with the parameter panel, as
    tisim preview does; --headless or --no-render run its coarse mesh plainly."""
    _quiet(quiet, ctx)
    demos = list_demos()
    if list_ or name is None:
        if about:
            _die("--about needs a demo's name: tisim demo NAME --about")
        _print_demo_list()
        raise typer.Exit(0)
    names = [n for n, _ in demos]
    if name not in names:
        _die(f"unknown demo {name!r}: expected one of {', '.join(names)}")
    if about:
        _print_demo_about(name)
        raise typer.Exit(0)
    path = demos_dir() / f"{name}.toml"
    if not (headless or no_render):
        from tisim.preview import is_progressive, live_unavailable_reason

        progressive = is_progressive(path, set)
        reason = live_unavailable_reason() if progressive else None
        if reason is not None:
            # as every demo does without a display: run headless, and say so once
            log.warning(
                "no live preview (%s): running the coarse mesh headless (tisim refine %s refines it)", reason, name
            )
            headless = True
        elif progressive:
            # a progressive scene's demo is its coarse preview, live with the panel, as
            # `tisim preview` shows it; --headless / --no-render keep the plain run
            if export_meshes:
                log.warning(
                    "--export-meshes: the live preview writes no meshes (use --headless, or 'tisim refine %s')", name
                )

            def go() -> int:
                sets = [*set, *_size_overrides(size), *([f"sim.frames={frames}"] if frames else [])]
                return _preview_live(
                    path,
                    sets,
                    out_root=out if out is not None else Path("out"),
                    arch=arch,
                    precision=precision,
                    command=f"tisim demo {name}",
                    instead=f"--headless, or 'tisim refine {name}'",
                )

            raise typer.Exit(_guard(go))
    code = _guard(
        _run,
        path,
        frames=frames,
        headless=headless,
        out=out,
        no_render=no_render,
        export_meshes=export_meshes,
        arch=arch,
        precision=precision,
        sets=set,
        quiet=quiet,
        size=size,
    )
    raise typer.Exit(code)


@app.command()
def compare(
    scene: Path = typer.Argument(..., help="A scene file, or the name of a demo."),
    integrators: str = typer.Option(
        "admm,implicit-euler,xpbd", "--integrators", "-i", help="Comma-separated solver names."
    ),
    frames: int | None = _FRAMES,
    out: Path | None = _OUT,
    arch: str = _ARCH,
    precision: str | None = _PREC,
    set: list[str] = _SET,
    no_render: bool = typer.Option(False, "--no-render", help="Write no images (stats and plots only)."),
):
    """Run one scene with several integrators; write stats, energy/momentum plots, each
    integrator's frames and a side-by-side video labelled with the integrator, time and
    energy."""

    def go() -> int:
        from tisim.compare import check_comparable, comparable_integrators
        from tisim.compare import compare as do_compare
        from tisim.config import ConfigError
        from tisim.scene import load_scene

        path = scene
        if not path.exists() and (demos_dir() / f"{scene}.toml").exists():
            path = demos_dir() / f"{scene}.toml"
        sc = load_scene(path, set)
        chosen = list(dict.fromkeys(s.strip() for s in integrators.split(",") if s.strip()))  # once each
        if not chosen:
            raise ConfigError(
                "--integrators", f"expected one or more of {', '.join(comparable_integrators())}, got {integrators!r}"
            )
        check_comparable(sc, chosen)  # a cloth scene, an integrator compare does not run
        out_dir = _out_folder(out if out is not None else Path("out") / f"{sc.name}-compare")
        from tisim import backend
        from tisim.runner import scene_precision, scene_threads

        backend.init(arch, scene_precision(sc, precision), threads=scene_threads(sc))
        from tisim.render import vulkan_available

        render = not no_render and vulkan_available()
        if not no_render and not render:
            log.warning("no Vulkan driver found: no frames or video (stats and plots are written)")
        summary = do_compare(sc, chosen, out_dir, frames=frames, render=render)
        from tisim.compare import format_table

        typer.echo("\n".join(format_table(summary)))  # with the energy each integrator integrated
        typer.echo(
            f"wrote {out_dir}/ (per-integrator stats.csv{', frames/, NAME.mp4' if render else ''}, "
            "energy/momentum plots)"
        )
        if summary.get("side_by_side"):
            typer.echo(f"side by side: {summary['side_by_side']}")
        codes = []
        for name, v in summary["integrators"].items():
            codes.append(_ended_code(v["ended"], v.get("error")))
            if v["ended"] not in ("completed", "not run"):  # as run says it, naming the integrator
                typer.echo(f"error: {name} {v['ended']}: {v['message']}", err=True)
        not_run = [n for n, v in summary["integrators"].items() if v["ended"] == "not run"]
        if not_run:
            typer.echo(f"error: not run: {', '.join(not_run)}", err=True)
        return _overall_code(codes)

    raise typer.Exit(_guard(go))


@app.command()
def sweep(
    ctx: typer.Context,
    scene: Path = typer.Argument(..., help="A scene file, or the name of a demo."),
    vary: list[str] = typer.Option(
        [], "--vary", "-v", help="KEY=START:STOP:COUNT or KEY=V1,V2,... (repeatable: the runs are every combination)."
    ),
    metric: list[str] = typer.Option(
        [],
        "--metric",
        "-m",
        help="Plot this metric: final_displacement, "
        "max_penetration, energy_drift, frame_ms, or COLUMN:min|max|last|mean "
        "of stats.csv (repeatable; default: the four).",
    ),
    workers: int | None = typer.Option(
        None, "--workers", "-w", min=1, help="Local worker processes (default: one per core)."
    ),
    scheduler: str | None = typer.Option(
        None, "--scheduler", help="An existing Dask scheduler, e.g. tcp://host:8786 (default: a local cluster)."
    ),
    timeout: float = typer.Option(10.0, "--timeout", min=0.1, help="Seconds to reach the scheduler."),
    frames: int | None = _FRAMES,
    out: Path | None = typer.Option(None, "--out", "-o", help="Output folder (default: out/<scene>-sweep)."),
    arch: str = typer.Option("cpu", "--arch", help="Taichi backend of each run: cpu (default), cuda, vulkan."),
    precision: str | None = _PREC,
    set: list[str] = _SET,
    quiet: bool = _QUIET,
):
    """Run a scene over a grid of parameter values on Dask; write sweep.csv and sweep.png.
    Rerunning the same sweep skips the runs already finished."""
    _quiet(quiet, ctx)

    def go() -> int:
        from tisim.sweep import parse_metric, parse_vary
        from tisim.sweep import sweep as do_sweep

        path = scene
        if not path.exists() and (demos_dir() / f"{scene}.toml").exists():
            path = demos_dir() / f"{scene}.toml"
        varies = [parse_vary(v) for v in vary]
        metrics = [parse_metric(m) for m in metric]
        out_dir = _out_folder(out if out is not None else Path("out") / f"{path.stem}-sweep")
        res = do_sweep(
            path,
            varies,
            out_dir,
            sets=set,
            metrics=metrics,
            frames=frames,
            workers=workers,
            scheduler=scheduler,
            timeout=timeout,
            arch=arch,
            precision=precision,
            progress=not quiet,
            quiet_dask=not _DEBUG["on"],
        )
        counts = ", ".join(f"{n} {k}" for k, n in res.counts().items())
        typer.echo(f"{len(res.rows)} runs ({counts}); ran {res.ran}, skipped {res.skipped} finished before")
        typer.echo(f"wrote {out_dir}/ (sweep.csv, sweep.png, sweep.json, runs/*/stats.csv and run.json)")
        bad = [(r["ended"], r.get("error")) for r in res.rows if r["ended"] != "completed"]
        if bad:  # every row is written; the exit code is the one run gives such a run
            what = ", ".join(f"{n} {k}" for k, n in res.counts().items() if k != "completed")
            typer.echo(
                f"error: {len(bad)} of {len(res.rows)} runs did not complete ({what}): see {out_dir / 'sweep.csv'}",
                err=True,
            )
        if res.interrupted:
            return 130
        # a run that raised on the user's mistake (a cloth that starts inside a collider at
        # one of the values) exits 2, as `tisim run` would
        return _overall_code(_ended_code("failed" if e == "not run" else e, err) for e, err in bad)

    raise typer.Exit(_guard(go))


@app.command()
def refine(
    ctx: typer.Context,
    source: Path = typer.Argument(..., help="A cloth scene (TOML), or a cloth mesh file (.obj, .ply, ...)."),
    levels: int | None = typer.Option(
        None, "--levels", "-L", min=1, max=6, help="Levels including the preview (default: the scene's, 3)."
    ),
    frames: int | None = _FRAMES,
    out: Path | None = typer.Option(None, "--out", "-o", help="Output folder (default: out/<scene>-refine)."),
    schedule: str | None = typer.Option(None, "--schedule", help="sequential or pipelined."),
    direct: bool = typer.Option(
        False,
        "--direct",
        help="Also simulate the coarsest and finest meshes directly, for the speed-up and consistency.",
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted refine from its checkpoints."),
    deterministic: bool = typer.Option(
        False,
        "--deterministic",
        help="Single-threaded Taichi kernels, their loops compiled serial: "
        "the sequential schedule then gives the pipelined one's bits on 2 "
        "cores. Reruns and --resume repeat bit for bit without it.",
    ),
    drape_on: str | None = typer.Option(
        None, "--drape-on", help="For a mesh file: sphere (the default), ground or box."
    ),
    pin: str | None = typer.Option(None, "--pin", help="For a mesh file: corners or top-edge."),
    wind: str | None = typer.Option(None, "--wind", help="For a mesh file: wind velocity 'vx,vy,vz' in m/s."),
    remesh: bool = typer.Option(
        False,
        "--remesh",
        help="Remesh the cloth isotropically first (keeps its border, holes and UVs): for a mesh of sliver triangles.",
    ),
    headless: bool = _HEADLESS,
    no_render: bool = _NO_RENDER,
    arch: str = _ARCH,
    precision: str | None = _PREC,
    set: list[str] = _SET,
    quiet: bool = _QUIET,
):
    """Preview a cloth animation on a coarse mesh, then refine it to finer levels that
    follow the same motion (progressive dynamics)."""
    _quiet(quiet, ctx)
    from tisim.cli.refine import refine_command

    raise typer.Exit(
        _guard(
            refine_command,
            source,
            levels=levels,
            frames=frames,
            out=out,
            schedule=schedule,
            direct=direct,
            resume=resume,
            deterministic=deterministic,
            drape_on=drape_on,
            pin=pin,
            wind=wind,
            remesh=remesh,
            no_render=no_render,
            arch=arch,
            precision=precision,
            sets=set,
            quiet=quiet,
        )
    )


@app.command()
def preview(
    scene: Path = typer.Argument(..., help="A progressive cloth scene (TOML) or a demo name."),
    out: Path = typer.Option(Path("out"), "--out", "-o", help="Where launched refines write (a new folder each)."),
    arch: str = _ARCH,
    precision: str | None = _PREC,
    set: list[str] = _SET,
):
    """The coarse preview live in a window with a parameter panel (friction, stiffness,
    wind, initial velocity); key f or the panel's button refines the current settings
    in the background."""

    def go() -> int:
        from tisim.config import ConfigError

        path = scene
        if not path.is_file() and (demos_dir() / f"{scene}.toml").exists():
            path = demos_dir() / f"{scene}.toml"
        if not path.exists():
            raise ConfigError("", "no such scene file", str(path))
        return _preview_live(
            path,
            list(set),
            out_root=out,
            arch=arch,
            precision=precision,
            command="tisim preview",
            instead="'tisim refine' headless",
        )

    raise typer.Exit(_guard(go))


def _preview_live(
    path: Path, sets: list[str], *, out_root: Path, arch: str, precision: str | None, command: str, instead: str
) -> int:
    """The live coarse preview with its panel (``tisim preview``, and ``tisim demo`` on a
    progressive scene); a scene it cannot preview, or no display or Vulkan: one line and
    exit code 2, before any window."""
    from tisim import preview as pv
    from tisim.config import ConfigError
    from tisim.scene import load_scene

    sc = load_scene(path, list(sets))
    if not any(o.kind == "cloth" for o in sc.objects.values()):
        # it said "refine.object: the scene has 0 cloth objects: name one"
        raise ConfigError(
            "",
            f"{command} needs a progressive cloth scene: a cloth object (kind = 'cloth', with "
            "solver.type = 'cloth'), whose levels the scene's [refine] table sets; this scene has "
            "no cloth object (tisim run runs it)",
            sc.path,
        )
    pv.cloth_object(sc)  # several cloths: refine.object names the one to preview
    reason = pv.live_unavailable_reason()
    if reason is not None:
        _die(f"{command} needs a live window: {reason} (use {instead})")
    pv.run_preview(
        path,
        list(sets),
        viewer=pv.make_preview_viewer(),
        out_root=out_root,
        arch=arch,
        precision=precision,
        echo=typer.echo,
    )
    return 0


@app.command()
def info():
    """Print versions, the chosen backend and what optional pieces are available."""
    from tisim import backend
    from tisim.linalg.cholesky import cholmod_available, metis_available
    from tisim.render import display_available, vulkan_available
    from tisim.runner import machine, versions

    v = versions()
    typer.echo(f"tisim {v.get('tisim')}  python {v['python']}")
    for k in ("taichi", "numpy", "scipy", "meshio", "scikit-sparse", "mkl", "imageio-ffmpeg"):
        typer.echo(f"  {k:15s} {v.get(k) or 'not installed'}")
    m = machine()
    typer.echo(f"machine: {m['cpu']} ({m['cores']} cores)")
    cuda = backend.cuda_available()
    typer.echo(f"arch (auto): {'cuda' if cuda else 'cpu'}")
    typer.echo(f"CUDA:    {'yes' if cuda else 'no'}")
    typer.echo(f"Vulkan:  {'yes' if vulkan_available() else 'no (headless runs write no images)'}")
    typer.echo(f"display: {'yes' if display_available() else 'no (demos render off-screen)'}")
    typer.echo(f"CHOLMOD: {'yes' if cholmod_available() else 'no (scipy fallback)'}")
    typer.echo(f"METIS:   {'yes' if metis_available() else 'no (AMD/RCM ordering)'}")
    from tisim.linalg import pardiso

    typer.echo(
        f"PARDISO: {'yes (cloth Newton systems)' if pardiso.available() else 'no (cloth uses CHOLMOD; pip install mkl)'}"
    )
    try:
        import imageio_ffmpeg

        typer.echo(f"ffmpeg:  {imageio_ffmpeg.get_ffmpeg_exe()}")
    except Exception:
        typer.echo("ffmpeg:  no (PNG frames only)")


def main() -> None:
    # --debug is accepted anywhere on the line, not only before the command.
    if "--debug" in sys.argv[1:]:
        sys.argv = [sys.argv[0], "--debug"] + [a for a in sys.argv[1:] if a != "--debug"]
    try:  # typer >= 0.2x carries its own copy of click
        from typer._click import exceptions as cx
    except ImportError:
        from click import exceptions as cx
    no_args = getattr(cx, "NoArgsIsHelpError", None) or ()  # click >= 8.2

    try:
        # not standalone: click's usage errors (a bad option value, a missing argument)
        # come here, to be said in one line like every other bad input
        code = app(standalone_mode=False)
    except no_args as e:  # a bare `tisim` or group: its help
        e.show()
        sys.exit(e.exit_code)
    except cx.UsageError as e:
        typer.echo(usage_line(e), err=True)
        sys.exit(2)
    except cx.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, getattr(cx, "Abort", KeyboardInterrupt)):  # (typer 0.2x's click has no Abort)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def usage_line(e) -> str:
    """A click usage error in one line: what was wrong and where to look
    ("error: tisim refine: Invalid value for '--levels' / '-L': ... (see tisim refine --help)"),
    in place of click's usage block."""
    names, ctx = [], e.ctx
    while ctx is not None and ctx.parent is not None:  # (the root's name is how it was started)
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    path = " ".join(["tisim", *names])
    msg = " ".join(e.format_message().split()).rstrip(".")
    return f"error: {path}: {msg} (see {path} --help)"


if __name__ == "__main__":
    main()
