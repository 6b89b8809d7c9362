"""``tisim``: run demos and scenes, compare integrators, print the set-up.

Every user mistake (bad scene, bad mesh, bad option) is one line on stderr and
exit code 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="tisim: soft bodies and cloth in Taichi. Demos, scenes, integrator comparisons.",
    pretty_exceptions_enable=False,
)

_DEBUG = {"on": False}


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
    level = logging.DEBUG if debug else (logging.ERROR if quiet else logging.INFO)
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s" if not debug else
                        "%(levelname)s %(name)s: %(message)s", force=True)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
):
    _DEBUG["on"] = debug
    _setup_logging(debug)


def demos_dir() -> Path:
    """Where the demo scenes are: the source tree's demos/ (editable installs),
    or the copy shipped inside the package."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "demos", here / "demos"):
        if cand.is_dir():
            return cand
    return here.parent / "demos"


def list_demos() -> list[tuple[str, str]]:
    import sys as _sys

    if _sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    out = []
    for p in sorted(demos_dir().glob("*.toml")):
        try:
            desc = tomllib.loads(p.read_text()).get("scene", {}).get("description", "")
        except Exception:  # a broken demo file still shows up in the list
            desc = "(unreadable scene file)"
        desc = " ".join(str(desc).split())  # one line, whatever the file's layout
        if len(desc) > 110:
            cut = desc[:110].rsplit(" ", 1)[0]
            desc = cut.rstrip(",;:") + " ..."
        out.append((p.stem, desc))
    return out


def _run(
    scene_path: Path,
    *,
    frames: Optional[int],
    headless: bool,
    out: Optional[Path],
    no_render: bool,
    export_meshes: bool,
    arch: str,
    precision: Optional[str],
    sets: List[str],
    quiet: bool,
) -> int:
    from tisim.scene import load_scene

    scene = load_scene(scene_path, sets)
    out_dir = out if out is not None else Path("out") / scene.name
    from tisim.render import display_available, vulkan_available

    live = not headless and not no_render and display_available()
    viewer = None
    if live:
        from tisim.render.ggui import GGUIViewer

        viewer = GGUIViewer()
    elif not no_render:
        if vulkan_available():
            from tisim.render.offscreen import OffscreenRenderer
            from tisim.render.video import FrameWriter

            fps = scene.render.fps or 1.0 / (scene.sim.dt * scene.sim.substeps)
            viewer = OffscreenRenderer(FrameWriter(out_dir, fps=fps, video_name=f"{scene.name}.mp4"))
        else:
            logging.warning(
                "no Vulkan driver found: running headless without images "
                "(install mesa-vulkan-drivers, or run 'make setup' as root, to get PNG frames and an MP4)"
            )
    from tisim.runner import run_scene

    result = run_scene(
        scene, out_dir, frames=frames, viewer=viewer, export_meshes=export_meshes,
        progress=not quiet, arch=arch, precision=precision, live=live,
    )
    msg = f"{result.ended}: {result.frames_done} frames in {out_dir}/ (stats.csv, run.json"
    if result.video:
        msg += f", frames/, {Path(result.video).name}"
    if export_meshes:
        msg += ", meshes/"
    msg += ")"
    if result.info.get("timings_ms"):
        msg += f"; median {result.info['timings_ms']['median']:.1f} ms/frame"
    typer.echo(msg)
    if result.ended == "diverged":
        typer.echo(f"error: {result.message}", err=True)
    return result.exit_code


def _guard(fn, *args, **kwargs) -> int:
    try:
        return fn(*args, **kwargs)
    except typer.Exit:
        raise
    except _user_errors() as e:
        if _DEBUG["on"]:
            raise
        _die(str(e))
    except Exception as e:  # a bug, not the user's mistake: still one line unless --debug
        if _DEBUG["on"]:
            raise
        _die(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", 1)
    return 0


_FRAMES = typer.Option(None, "--frames", "-n", help="Number of frames (default: the scene's).", min=1)
_HEADLESS = typer.Option(False, "--headless", help="No window: render off-screen to PNG frames + MP4.")
_OUT = typer.Option(None, "--out", "-o", help="Output folder (default: out/<scene>).")
_NO_RENDER = typer.Option(False, "--no-render", help="Write no images (stats and run.json only).")
_EXPORT = typer.Option(False, "--export-meshes", help="Write the surface mesh of every frame (.ply).")
_ARCH = typer.Option("auto", "--arch", help="Taichi backend: auto, cpu, cuda, vulkan.")
_PREC = typer.Option(None, "--precision", help="f64 (CPU default) or f32 (GPU default).")
_SET = typer.Option([], "--set", "-s", help="Override a scene value: --set contact.mu=0.3 (repeatable).")
_QUIET = typer.Option(False, "--quiet", "-q", help="No progress bar.")


@app.command()
def run(
    scene: Path = typer.Argument(..., help="A scene file (TOML)."),
    frames: Optional[int] = _FRAMES,
    headless: bool = _HEADLESS,
    out: Optional[Path] = _OUT,
    no_render: bool = _NO_RENDER,
    export_meshes: bool = _EXPORT,
    arch: str = _ARCH,
    precision: Optional[str] = _PREC,
    set: List[str] = _SET,  # noqa: A002 - the option is called --set
    quiet: bool = _QUIET,
):
    """Run a scene file."""
    code = _guard(_run, scene, frames=frames, headless=headless, out=out, no_render=no_render,
                  export_meshes=export_meshes, arch=arch, precision=precision, sets=set, quiet=quiet)
    raise typer.Exit(code)


@app.command()
def demo(
    name: Optional[str] = typer.Argument(None, help="Demo name (see --list)."),
    list_: bool = typer.Option(False, "--list", "-l", help="List the demos."),
    frames: Optional[int] = _FRAMES,
    headless: bool = _HEADLESS,
    out: Optional[Path] = _OUT,
    no_render: bool = _NO_RENDER,
    export_meshes: bool = _EXPORT,
    arch: str = _ARCH,
    precision: Optional[str] = _PREC,
    set: List[str] = _SET,  # noqa: A002
    quiet: bool = _QUIET,
):
    """Run a bundled demo (tisim demo --list shows them)."""
    demos = list_demos()
    if list_ or name is None:
        width = max((len(n) for n, _ in demos), default=0)
        for n, d in demos:
            typer.echo(f"{n.ljust(width)}  {d}")
        raise typer.Exit(0)
    names = [n for n, _ in demos]
    if name not in names:
        _die(f"unknown demo {name!r}: expected one of {', '.join(names)}")
    path = demos_dir() / f"{name}.toml"
    code = _guard(_run, path, frames=frames, headless=headless, out=out, no_render=no_render,
                  export_meshes=export_meshes, arch=arch, precision=precision, sets=set, quiet=quiet)
    raise typer.Exit(code)


@app.command()
def compare(
    scene: Path = typer.Argument(..., help="A scene file, or the name of a demo."),
    integrators: str = typer.Option("admm,implicit-euler,xpbd", "--integrators", "-i",
                                    help="Comma-separated solver names."),
    frames: Optional[int] = _FRAMES,
    out: Optional[Path] = _OUT,
    arch: str = _ARCH,
    precision: Optional[str] = _PREC,
    set: List[str] = _SET,  # noqa: A002
):
    """Run one scene with several integrators; write stats and energy/momentum plots."""

    def go() -> int:
        from tisim.compare import compare as do_compare
        from tisim.config import ConfigError
        from tisim.scene import load_scene
        from tisim.solvers.registry import names

        path = scene
        if not path.exists() and (demos_dir() / f"{scene}.toml").exists():
            path = demos_dir() / f"{scene}.toml"
        sc = load_scene(path, set)
        chosen = [s.strip() for s in integrators.split(",") if s.strip()]
        for s in chosen:
            if s not in names():
                raise ConfigError("--integrators", f"unknown integrator {s!r}: expected some of {', '.join(names())}")
        from tisim import backend

        backend.init(arch, precision)
        out_dir = out if out is not None else Path("out") / f"{sc.name}-compare"
        summary = do_compare(sc, chosen, out_dir, frames=frames)
        typer.echo(f"{'integrator':16s} {'ended':10s} {'energy drift':>12s} {'|dL|/L0':>9s} "
                   f"{'min det F':>9s} {'ms/frame':>9s}")
        for k, v in summary["integrators"].items():
            typer.echo(
                f"{k:16s} {v.get('ended', ''):10s} {v.get('energy_max_drift_rel', float('nan')):12.2e} "
                f"{v.get('angular_momentum_max_drift_rel', float('nan')):9.2e} "
                f"{v.get('min_volume_ratio', float('nan')):9.3f} {v.get('median_wall_ms', float('nan')):9.1f}"
            )
        typer.echo(f"wrote {out_dir}/ (per-integrator stats.csv, energy/momentum plots)")
        return 0

    raise typer.Exit(_guard(go))


@app.command()
def info():
    """Print versions, the chosen backend and what optional pieces are available."""
    from tisim import backend
    from tisim.linalg.cholesky import cholmod_available, metis_available
    from tisim.render import display_available, vulkan_available
    from tisim.runner import machine, versions

    v = versions()
    typer.echo(f"tisim {v.get('tisim')}  python {v['python']}")
    for k in ("taichi", "numpy", "scipy", "meshio", "scikit-sparse", "imageio-ffmpeg"):
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
    try:
        import imageio_ffmpeg

        typer.echo(f"ffmpeg:  {imageio_ffmpeg.get_ffmpeg_exe()}")
    except Exception:
        typer.echo("ffmpeg:  no (PNG frames only)")


def main() -> None:
    # --debug is accepted anywhere on the line, not only before the command.
    if "--debug" in sys.argv[1:]:
        sys.argv = [sys.argv[0], "--debug"] + [a for a in sys.argv[1:] if a != "--debug"]
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
