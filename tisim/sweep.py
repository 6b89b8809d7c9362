"""Parameter sweeps: one scene run over a grid of ``--set`` values on a Dask cluster.

``sweep(scene_file, [parse_vary("contact.mu=0.15:0.20:11")], out_dir=...)`` runs the
scene once for every combination of the varied values (the Cartesian product, in the
order given) and writes into ``out_dir``:

* ``runs/NAME/stats.csv`` and ``runs/NAME/run.json``: one folder per run, as ``tisim run``
  writes them (run.json gains a ``sweep`` entry: the overrides and the run's signature);
* ``sweep.csv``: one row per run: the varied values, how the run ended (completed,
  diverged, failed, not run) with its message, and the metrics (:data:`BUILTIN_METRICS`
  and any ``COLUMN:REDUCTION`` of a stats.csv column);
* ``sweep.png``: each metric against each varied parameter (one line per combination of
  the other varied parameters; runs that did not complete are marked with a red x);
* ``sweep.json``: what was swept (scene, overrides, frames, metrics), the counts and the
  runs that did not complete (``not_completed``, their folder names).

The runs go to a ``distributed.LocalCluster`` of worker processes (one per core, one
Taichi thread each: ``TI_CPU_MAX_NUM_THREADS=1`` is set before Taichi initialises, once
per worker process) or to an existing scheduler. A worker runs in a temporary folder and
returns the contents of stats.csv and run.json; the client writes them, so no shared
file system is needed. Limitation: a scene that reads mesh files needs them at the same
path on the workers (the scene's generators need nothing).

A run whose folder holds a run.json with the same signature (the scene after the
overrides less [scene], [camera] and [render], the frame count, arch and precision) that
completed or diverged is not run again: rerunning an interrupted or extended sweep only
runs what is missing. A run that failed (an exception, a lost worker) is a row saying so
and is retried on the next call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from tisim.config import ConfigError
from tisim.scene import toml_value
from tisim.sweep_report import BUILTIN_METRICS, plot, value_label, write_csv

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger(__name__)

# name -> (what, unit) of the metrics every sweep computes
REDUCTIONS = ("min", "max", "last", "mean")
FINISHED = ("completed", "diverged", "stalled")  # results a rerun keeps; "failed" runs are retried
DEFAULT_CONNECT_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Vary:
    """One varied scene value: ``key`` (dotted, as for ``--set``) and its ``values``."""

    key: str
    values: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Metric:
    """A column of sweep.csv: a built-in metric (``column`` None) or ``column`` of
    stats.csv reduced over the stepped frames (1..N) by ``reduction``."""

    name: str
    column: str | None = None
    reduction: str | None = None


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One point of the grid: ``params`` (key -> value), the ``overrides`` that set them,
    the run's folder name and the signature that decides whether it is already done."""

    params: dict[str, Any]
    overrides: tuple[str, ...]
    folder: str
    signature: str
    data: dict  # the raw scene table after every override, sent to the worker


@dataclasses.dataclass
class SweepResult:
    out_dir: Path
    rows: list[dict]
    metrics: list[Metric]
    ran: int = 0
    skipped: int = 0
    interrupted: bool = False
    plot: Path | None = None

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {}
        for r in self.rows:
            c[r["ended"]] = c.get(r["ended"], 0) + 1
        return c


# ---------------------------------------------------------------- parsing


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes: ``[0,0,10],[0,0,20]`` is two values."""
    parts, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def _toml_scalar(raw: str) -> Any:
    raw = raw.strip()
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word is a string, as for --set


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_INT = re.compile(r"^[+-]?\d+$")


def parse_vary(text: str) -> Vary:
    """Parse ``KEY=START:STOP:COUNT`` (COUNT evenly spaced values, ends included) or
    ``KEY=V1,V2,...`` (TOML values; bare words are strings; lists in brackets).

    Raises :class:`ConfigError` naming ``--vary`` and what was expected."""
    if "=" not in text:
        raise ConfigError("--vary", f"expected KEY=START:STOP:COUNT or KEY=V1,V2,..., got {text!r}")
    key, raw = (s.strip() for s in text.split("=", 1))
    if not key or any(not p for p in key.split(".")) or not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
        raise ConfigError("--vary", f"expected a dotted scene key like contact.mu before '=', got {key!r}")
    if not raw:
        raise ConfigError("--vary", f"{key}: no values after '='")
    quoted = raw[0] in "\"'["
    if ":" in raw and not quoted:
        bits = raw.split(":")
        if len(bits) != 3:
            raise ConfigError("--vary", f"{key}: malformed range {raw!r}: expected START:STOP:COUNT, e.g. 0.15:0.20:11")
        a, b, n = (s.strip() for s in bits)
        if not (_NUMBER.match(a) and _NUMBER.match(b)):
            raise ConfigError("--vary", f"{key}: malformed range {raw!r}: START and STOP must be numbers")
        if not _INT.match(n) or int(n) < 1:
            raise ConfigError("--vary", f"{key}: malformed range {raw!r}: COUNT must be an integer >= 1, got {n!r}")
        count = int(n)
        lo, hi = float(a), float(b)
        if count == 1 and lo != hi:
            raise ConfigError("--vary", f"{key}: malformed range {raw!r}: one value needs START == STOP")
        vals = np.linspace(lo, hi, count) if count > 1 else np.array([lo])
        if _INT.match(a) and _INT.match(b) and np.all(vals == np.round(vals)):
            values = tuple(int(round(v)) for v in vals)  # integer keys (substeps, frames) stay integers
        else:
            values = tuple(float(f"{v:.12g}") for v in vals)  # 0.155, not 0.15500000000000003
        return Vary(key, values)
    items = [s.strip() for s in _split_top_level(raw)]
    if any(not s for s in items):
        raise ConfigError("--vary", f"{key}: empty value in {raw!r}: expected V1,V2,...")
    values = tuple(_toml_scalar(s) for s in items)
    if len(set(map(toml_value, values))) != len(values):
        raise ConfigError("--vary", f"{key}: a value is repeated in {raw!r}")
    return Vary(key, values)


def parse_metric(text: str) -> Metric:
    """A built-in metric name or ``COLUMN:REDUCTION`` (min, max, last or mean of a stats.csv
    column over the stepped frames). Raises :class:`ConfigError`."""
    text = text.strip()
    if text in BUILTIN_METRICS:
        return Metric(text)
    if ":" in text:
        col, red = (s.strip() for s in text.rsplit(":", 1))
        if red not in REDUCTIONS:
            raise ConfigError(
                "--metric", f"{text!r}: expected a reduction {', '.join(REDUCTIONS)} after ':', got {red!r}"
            )
        if not col:
            raise ConfigError("--metric", f"{text!r}: expected a stats.csv column before ':'")
        from tisim.outputs import STATS_COLUMNS

        if col not in STATS_COLUMNS:
            log.warning(
                "--metric %s: %r is not one of the runner's stats.csv columns; it is empty unless the solver writes it",
                text,
                col,
            )
        return Metric(f"{col}:{red}", col, red)
    raise ConfigError(
        "--metric",
        f"unknown metric {text!r}: expected one of {', '.join(BUILTIN_METRICS)} "
        f"or COLUMN:REDUCTION with REDUCTION one of {', '.join(REDUCTIONS)} "
        "(e.g. max_penetration:max)",
    )


# ---------------------------------------------------------------- planning


def _slug(params: dict[str, Any]) -> str:
    def short(v):
        s = value_label(v)
        return re.sub(r"[^A-Za-z0-9.+-]+", "-", s).strip("-") or "x"

    s = "_".join(f"{k.split('.')[-1]}={short(v)}" for k, v in params.items())
    return s[:80]


_NOT_PHYSICS = ("scene", "camera", "render")


def plan(
    scene_path: Path | str,
    varies: list[Vary],
    *,
    sets: list[str] | tuple[str, ...] = (),
    frames: int | None = None,
    arch: str = "cpu",
    precision: str | None = None,
) -> list[SweepRun]:
    """Every run of the grid, each scene validated (no Taichi): an unknown key, a value of
    the wrong type or out of range raises :class:`ConfigError` naming ``--vary`` and the
    run's values, before anything is launched."""
    from tisim.backend import ARCHES
    from tisim.runner import scene_precision
    from tisim.scene import apply_overrides, load_scene, scene_from_dict

    if arch not in ARCHES:
        raise ConfigError("--arch", f"unknown arch {arch!r}: expected one of {', '.join(ARCHES)}")
    p = Path(scene_path)
    # the scene and --set alone first, so their errors read as such (a cloth in f32 too)
    scene_precision(load_scene(p, list(sets)), precision)
    keys = [v.key for v in varies]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ConfigError("--vary", f"{dup} is varied twice")
    base = tomllib.loads(p.read_text())
    base = apply_overrides(base, list(sets))
    runs = []
    for combo in itertools.product(*(v.values for v in varies)):
        params = dict(zip(keys, combo))
        overrides = tuple(f"{k}={toml_value(v)}" for k, v in params.items())
        try:
            data = apply_overrides(base, list(overrides))
            scene_from_dict(data, str(p))
        except ConfigError as e:
            what = ", ".join(overrides)
            where = f"{e.key}: " if e.key and e.key not in keys else ""
            raise ConfigError("--vary", f"{what}: {where}{e.detail}", str(p)) from None
        # what the run computes from: not the camera, the render settings or the description,
        # so touching those does not rerun a sweep
        physics = {k: v for k, v in data.items() if k not in _NOT_PHYSICS}
        sig_src = json.dumps(
            {"scene": physics, "frames": frames, "arch": arch, "precision": precision}, sort_keys=True, default=str
        )
        sig = hashlib.sha1(sig_src.encode()).hexdigest()[:10]
        runs.append(SweepRun(params, overrides, f"{_slug(params)}-{sig[:6]}", sig, data))
    return runs


def is_finished(folder: Path, signature: str) -> bool:
    """Whether ``folder`` holds the finished (completed or diverged) run of this signature."""
    try:
        info = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        info.get("sweep", {}).get("signature") == signature
        and info.get("ended") in FINISHED
        and (folder / "stats.csv").exists()
    )


# ---------------------------------------------------------------- the worker side


def run_task(
    data: dict, scene_path: str, frames: int | None, arch: str, precision: str | None, threads: int = 1
) -> dict:
    """Run one scene (a raw scene table) in a temporary folder on a Dask worker and return
    what the client needs: ``ended``, ``message``, ``stats_csv`` and ``run_json`` (text),
    ``worker`` (host:pid) and ``seconds``. Never raises for a failed run: the exception
    becomes ``ended = "failed"`` and its message."""
    import contextlib
    import io
    import socket
    import tempfile
    import traceback

    from tisim import backend

    t0 = time.perf_counter()
    out: dict[str, Any] = {"worker": f"{socket.gethostname()}:{os.getpid()}", "stats_csv": "", "run_json": ""}
    try:
        from tisim.runner import scene_precision
        from tisim.scene import scene_from_dict

        scene = scene_from_dict(data, scene_path)
        precision = scene_precision(scene, precision)
        if not backend.is_initialized():
            # Taichi reads these when it initialises, once per worker process; its banner
            # would land on the worker's stdout (the user's terminal for a LocalCluster)
            os.environ["TI_CPU_MAX_NUM_THREADS"] = str(threads)
            os.environ["ENABLE_TAICHI_HEADER_PRINT"] = "False"
            import taichi  # noqa: F401 - imported outside the redirect: it inspects sys.stdout

            with contextlib.redirect_stdout(io.StringIO()):  # "[Taichi] Starting on arch=x64"
                backend.init(arch, precision)
        out["cpu_threads"] = os.environ.get("TI_CPU_MAX_NUM_THREADS")
        from tisim.runner import run_scene

        with tempfile.TemporaryDirectory(prefix="tisim-sweep-") as tmp:
            res = run_scene(scene, tmp, frames=frames, viewer=None, progress=False, arch=arch, precision=precision)
            t = Path(tmp)
            if (t / "stats.csv").exists():
                out["stats_csv"] = (t / "stats.csv").read_text()
            out["run_json"] = (t / "run.json").read_text()
        out.update(ended=res.ended, message=res.message)
    except Exception as e:  # a run's failure is a row, never a lost sweep
        msg = str(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"
        out.update(
            ended="failed", message=" ".join(msg.split()), traceback=traceback.format_exc(), error=type(e).__name__
        )
    out["seconds"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------- the client side


def store(folder: Path, run: SweepRun, res: dict) -> None:
    """Write a worker's result into the run's folder (stats.csv and run.json with a
    ``sweep`` entry). A failed run gets a run.json saying so."""
    from tisim.outputs import write_json as _write_json

    folder.mkdir(parents=True, exist_ok=True)
    if res.get("stats_csv"):
        (folder / "stats.csv").write_text(res["stats_csv"])
    elif (folder / "stats.csv").exists():
        (folder / "stats.csv").unlink()  # a stale one from an earlier try would pass for this run's
    try:
        info = json.loads(res["run_json"]) if res.get("run_json") else {}
    except ValueError:
        info = {}
    info["ended"] = res.get("ended", "failed")
    info["message"] = res.get("message", "")
    info["sweep"] = {
        "params": run.params,
        "overrides": list(run.overrides),
        "signature": run.signature,
        "worker": res.get("worker"),
        "cpu_threads": res.get("cpu_threads"),
        "seconds": res.get("seconds"),
    }
    if res.get("traceback"):
        info["traceback"] = res["traceback"]
    if res.get("error"):
        info["error"] = res["error"]  # the exception's class: a user's mistake or ours (exit code)
    _write_json(folder / "run.json", info)


def run_metrics(folder: Path, metrics: list[Metric]) -> dict[str, float]:
    """The metrics of one run from its stats.csv (NaN where it has no stepped frame)."""
    from tisim.compare import read_stats, summarize

    path = folder / "stats.csv"
    stats = read_stats(path) if path.exists() else {}
    out = {m.name: math.nan for m in metrics}
    if not stats or len(stats.get("frame", ())) < 2:
        return out
    stepped = slice(1, None)
    for m in metrics:
        if m.column is not None:
            col = stats.get(m.column)
            if col is None:
                continue
            v = col[stepped]
            fin = v[np.isfinite(v)]
            if m.reduction == "last":
                out[m.name] = float(v[-1])
            elif fin.size:
                out[m.name] = float({"min": np.min, "max": np.max, "mean": np.mean}[m.reduction](fin))
        elif m.name == "final_displacement":
            c = np.stack([stats["com_x"], stats["com_y"], stats["com_z"]], 1)
            out[m.name] = float(np.linalg.norm(c[-1] - c[0]))
        elif m.name == "max_penetration":
            v = stats["max_penetration"][stepped]
            out[m.name] = float(np.nanmax(v)) if np.isfinite(v).any() else math.nan
        elif m.name == "energy_drift":
            out[m.name] = summarize(stats)["energy_max_drift_rel"]
        elif m.name == "frame_ms":
            w = stats["wall_ms"][1:]
            out[m.name] = float(np.median(w[1:] if len(w) > 1 else w))
    return out


def _row(out: Path, run: SweepRun, metrics: list[Metric]) -> dict:
    folder = out / "runs" / run.folder
    row: dict[str, Any] = {"run": run.folder, **run.params, "ended": "not run", "frames_done": "", "message": ""}
    try:
        info = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        info = None
    if info is not None and info.get("sweep", {}).get("signature") == run.signature:
        row.update(
            ended=info.get("ended", "failed"),
            frames_done=info.get("frames_done", ""),
            message=info.get("message", ""),
            error=info.get("error"),
        )
        row.update(run_metrics(folder, metrics))
    else:
        row.update({m.name: math.nan for m in metrics})
    return row


class _Progress:
    def __init__(self, total: int, done: int, name: str, enabled: bool):
        self.p = None
        if not enabled or total == 0:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.p = Progress(
            TextColumn(f"[bold]sweep {name}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} runs"),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        self.task = self.p.add_task(name, total=total, completed=done, note="")
        self.p.start()

    def advance(self, note: str = "") -> None:
        if self.p is not None:
            self.p.update(self.task, advance=1, note=note)

    def stop(self) -> None:
        if self.p is not None:
            self.p.stop()


def quiet_dask_logs(level: int = logging.ERROR) -> None:
    """Raise the level of Dask's loggers (its cluster start/stop chatter) in this process.
    The CLI calls it unless --debug; distributed configures some child loggers itself, so
    each is set, not only the parent."""
    import distributed  # noqa: F401 - configures its loggers on import

    for name in list(logging.root.manager.loggerDict):
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(level)


def check_scheduler_address(address: str) -> None:
    """Raise :class:`ConfigError` unless ``address`` reads as a Dask scheduler address
    (``tcp://host:port``, or ``host:port``)."""
    from distributed.comm import parse_address, parse_host_port

    try:
        scheme, loc = parse_address(address)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(loc)
    except (ValueError, TypeError) as e:
        raise ConfigError(
            "--scheduler", f"expected an address like tcp://host:8786, got {address!r} ({' '.join(str(e).split())})"
        ) from None


def connect(
    scheduler: str | None,
    workers: int | None,
    timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    threads: int = 1,
    quiet: bool = False,
):
    """A Dask client: to ``scheduler`` (raises :class:`ConfigError` if it cannot be reached
    within ``timeout`` seconds), or to a new LocalCluster of ``workers`` processes (default:
    one per core) with one thread each. ``quiet``: see :func:`quiet_dask_logs`.
    Returns (client, cluster or None)."""
    from distributed import Client, LocalCluster

    if quiet:
        quiet_dask_logs()
    if scheduler:
        check_scheduler_address(scheduler)
        try:
            return Client(scheduler, timeout=timeout, set_as_default=False), None
        except (OSError, TimeoutError, ValueError) as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            if len(reason) > 160:
                reason = reason[:157] + "..."
            raise ConfigError(
                "--scheduler", f"cannot reach the Dask scheduler at {scheduler} within {timeout:g} s ({reason})"
            ) from None
    n = workers or os.cpu_count() or 1
    env = {
        "TI_CPU_MAX_NUM_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "MPLBACKEND": "Agg",
    }
    import dask

    # No heartbeat time-out: Taichi compiles a solver's kernels holding the GIL, which on a
    # busy machine can silence a worker's heartbeat for longer than the default 5 minutes;
    # the scheduler would then restart the worker and lose its run (seen with ADMM at load 18).
    with dask.config.set({"distributed.scheduler.worker-ttl": None}):
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
            env=env,
        )
    client = Client(cluster, set_as_default=False)
    started = len(client.scheduler_info().get("workers", {}))
    if started < n:  # seen on a heavily loaded machine: a worker that does not start in time is dropped
        log.warning("only %d of %d Dask workers started; the sweep runs on those", started, n)
    return client, cluster


_POLL_S = 5.0
NO_WORKERS_TIMEOUT_S = 300.0  # a sweep whose cluster has had no worker this long gives up


def _finish(out: Path, run: SweepRun, res: dict, bar: _Progress, on_result) -> None:
    store(out / "runs" / run.folder, run, res)
    if on_result is not None:
        on_result(run, res)
    bar.advance(f"{_slug(run.params)}: {res.get('ended')}")


def _collect(client, futures: dict, out: Path, bar: _Progress, on_result) -> None:
    """Store each run as its future completes. A cluster that has had no worker for
    NO_WORKERS_TIMEOUT_S marks the runs still pending failed and returns (it would
    otherwise wait forever)."""
    from distributed import TimeoutError as DaskTimeout
    from distributed import wait

    pending = set(futures)
    no_workers_since = None
    while pending:
        try:
            with client.as_current():  # wait() finds its client there
                done, not_done = wait(list(pending), timeout=_POLL_S, return_when="FIRST_COMPLETED")
        except (TimeoutError, DaskTimeout):
            if client.scheduler_info().get("workers"):
                no_workers_since = None
            elif no_workers_since is None:
                no_workers_since = time.monotonic()
            elif time.monotonic() - no_workers_since > NO_WORKERS_TIMEOUT_S:
                msg = f"no Dask worker for {NO_WORKERS_TIMEOUT_S:g} s: the run was not done"
                for f in pending:
                    f.cancel()
                    _finish(out, futures[f], {"ended": "failed", "message": msg}, bar, on_result)
                log.error(
                    "the Dask cluster has had no worker for %g s: %d runs marked failed",
                    NO_WORKERS_TIMEOUT_S,
                    len(pending),
                )
                return
            continue
        pending = set(not_done)
        for f in done:
            try:
                res = f.result()
            except Exception as e:  # a lost worker, a task that could not be sent
                res = {"ended": "failed", "message": f"{type(e).__name__}: {' '.join(str(e).split())}"}
            _finish(out, futures[f], res, bar, on_result)


def _submit(client, todo, scene_path, frames, arch, precision, out: Path, bar: _Progress, on_result) -> bool:
    """Submit the runs to do and store each as it completes; returns whether a Ctrl-C
    interrupted them (the runs in flight are then cancelled)."""
    futures = {}
    try:
        for r in todo:
            f = client.submit(
                run_task,
                r.data,
                str(Path(scene_path).resolve()),
                frames,
                arch,
                precision,
                key=f"tisim-sweep-{r.folder}-{r.signature}",
                pure=False,
                retries=0,
            )
            futures[f] = r
        _collect(client, futures, out, bar, on_result)
    except KeyboardInterrupt:
        for f in futures:
            f.cancel()
        return True
    return False


def sweep(
    scene_path: Path | str,
    varies: list[Vary],
    out_dir: Path | str,
    *,
    sets: list[str] | tuple[str, ...] = (),
    metrics: list[Metric] | None = None,
    frames: int | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    arch: str = "cpu",
    precision: str | None = None,
    progress: bool = True,
    title: str = "",
    vlines: dict[str, list[tuple[float, str]]] | None = None,
    on_result: Callable[[SweepRun, dict], None] | None = None,
    quiet_dask: bool = False,
) -> SweepResult:
    """Run the grid of ``varies`` over the scene (see the module docstring) and write
    ``out_dir``. ``metrics``: the chosen metrics (default: the built-in ones), plotted;
    sweep.csv has the built-in ones too. Raises :class:`ConfigError` for bad input, before
    any run starts. A Ctrl-C cancels the runs in flight, still writes the summary (their
    rows say "not run") and returns with ``interrupted`` set. ``quiet_dask``: silence Dask's
    logs below ERROR in this process (the CLI's default)."""
    if not varies:
        raise ConfigError("--vary", "nothing to sweep: give at least one --vary KEY=VALUES")
    chosen = list(metrics) if metrics else [Metric(n) for n in BUILTIN_METRICS]
    # Metric("max_penetration:max") made by hand is read as parse_metric would (or refused)
    chosen = [m if m.column or m.name in BUILTIN_METRICS else parse_metric(m.name) for m in chosen]
    all_metrics = [Metric(n) for n in BUILTIN_METRICS] + [m for m in chosen if m.name not in BUILTIN_METRICS]
    if scheduler:
        check_scheduler_address(scheduler)
    runs = plan(scene_path, varies, sets=sets, frames=frames, arch=arch, precision=precision)
    out = Path(out_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    todo = [r for r in runs if not is_finished(out / "runs" / r.folder, r.signature)]
    skipped = len(runs) - len(todo)
    if skipped:
        log.debug("%d of %d runs finished before (in %s): skipped", skipped, len(runs), out / "runs")
    interrupted = False
    t0 = time.perf_counter()
    if todo:
        client, cluster = connect(scheduler, workers, timeout, quiet=quiet_dask)
        bar = _Progress(len(runs), skipped, Path(scene_path).stem, progress)
        try:
            interrupted = _submit(client, todo, scene_path, frames, arch, precision, out, bar, on_result)
        finally:
            bar.stop()
            client.close()
            if cluster is not None:
                cluster.close()
    rows = [_row(out, r, all_metrics) for r in runs]
    write_csv(out / "sweep.csv", rows, varies, all_metrics)
    png = plot(
        out / "sweep.png", rows, varies, chosen, title=title or f"sweep of {Path(scene_path).name}", vlines=vlines
    )
    result = SweepResult(out, rows, all_metrics, ran=len(todo), skipped=skipped, interrupted=interrupted, plot=png)
    from tisim.outputs import machine
    from tisim.outputs import write_json as _write_json

    _write_json(
        out / "sweep.json",
        {
            "scene_file": str(scene_path),
            "sets": list(sets),
            "varies": {v.key: list(v.values) for v in varies},
            "frames": frames,
            "arch": arch,
            "precision": precision,
            "metrics": [m.name for m in all_metrics],
            "scheduler": scheduler or f"LocalCluster({workers or os.cpu_count()} workers, 1 thread each)",
            "runs": len(runs),
            "ran": len(todo),
            "skipped": skipped,
            "counts": result.counts(),
            "not_completed": [r["run"] for r in rows if r["ended"] != "completed"],
            "interrupted": interrupted,
            "seconds": time.perf_counter() - t0,
            "machine": machine(),
        },
    )
    return result


def run_grid(
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
    """Run a scene over a grid of values on local worker processes, as ``tisim sweep``.

    Args:
        scene: a scene file or demo name.
        vary: dotted key -> the values to try, e.g. ``{"contact.mu": [0.17, 0.18]}``;
            several keys run every combination.
        frames: frames per run (default: the scene's).
        metrics: extra metrics, ``"COLUMN:min|max|last|mean"`` of stats.csv (the built-in
            final_displacement, max_penetration, energy_drift and frame_ms are always there).
        out: output folder (default ``out/NAME-sweep``); a rerun skips finished runs.
        workers: worker processes (default: one per core).
        arch, precision: each run's backend.
        **overrides: dotted scene keys applied to every run (``--set``).

    Returns:
        sweep.csv as a DataFrame: one row per run, the varied keys, ``ended``, the metrics.
    """
    import pandas as pd

    from tisim.scene import override_strings, resolve_scene

    run_sweep = sweep

    path = resolve_scene(scene)
    varies = []
    for key, values in vary.items():
        override_strings({key: list(values)})  # the same checks as an override
        varies.append(Vary(key, tuple(values)))
    out_dir = Path(out) if out is not None else Path("out") / f"{path.stem}-sweep"
    res = run_sweep(
        path,
        varies,
        out_dir,
        sets=override_strings(overrides),
        metrics=[parse_metric(m) for m in metrics] or None,
        frames=frames,
        workers=workers,
        arch=arch,
        precision=precision,
        progress=progress,
        quiet_dask=True,
    )
    return pd.read_csv(res.out_dir / "sweep.csv")


# tisim.sweep(...) is run_grid, the Python API's sweep (tisim.api.sweep)
from tisim._callable_module import make_callable  # noqa: E402

make_callable(__name__, "run_grid")
