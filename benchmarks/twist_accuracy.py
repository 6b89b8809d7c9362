"""Accuracy per time on the twisting bar (issue 10): tisim's PD solver with and without
Anderson acceleration, its converged reference, and NVIDIA Newton's XPBD, in one run.

The bar: twisting-bar-neohookean's mesh (1 x 0.2 x 0.2 m, 65 x 8 x 8 cells, 5,346
vertices, 5 tets a cell), stable Neo-Hookean with E = 1e6 Pa, nu = 0.4, density
1000 kg/m^3, no gravity; the end x = -0.5 held, the end x = +0.5 turned about the bar's
axis at one revolution per second; 100 frames of 0.01 s.

Measure: the mid-section twist, the least-squares rotation angle about the bar's axis
of the vertex layers nearest x = 0 relative to the rest shape (averaged over the two
layers either side of x = 0 when there is no layer on it), unwrapped over the frames.
Error of a run: |theta(t_end) - theta_ref(t_end)| / |theta_ref(t_end)|, where theta_ref
is the same solver's converged answer (``--ref-iterations`` 50 local-global iterations
a step at dt / ``--ref-substeps`` 5); also reported: the largest error over the whole
trajectory (every frame, relative to |theta_ref(t_end)|), which shows whether a small
end error is luck.

Timing: every tisim configuration and the peer advance frame by frame in turn (the peer
in a child process driven through a pipe; the order rotates every frame), so that the
load of a shared machine falls on all of them alike; the table gives median milliseconds
per frame after ``--warmup`` frames and the ratio to the peer's median measured in the same
run. The ratio still depends on the load: on the 2-core machine the peer (Warp, threads of
its own) slows down more than tisim under load (x peer of PD 6 it. + Anderson: 0.46 at a
load average of about 5, 0.74 at about 1, the same code).

Peer: Newton's SolverXPBD (``pip install newton``; Warp on the CPU, f32) on the same
tet mesh (``add_soft_mesh``, k_mu = mu, k_lambda = lambda, no damping), ``--peer-substeps``
10 substeps x ``--peer-iterations`` 2 iterations a frame, soft-body relaxation
``--peer-relaxation`` 0.1; held vertices have zero inverse mass and are placed at their
targets (the same targets as tisim's handles) before every substep. Its twist is given
for information; its error is not comparable (another discretisation and integrator).

    .venv/bin/python benchmarks/twist_accuracy.py                      # the full study
    .venv/bin/python benchmarks/twist_accuracy.py --frames 20 --ref-iterations 20   # quick
    # timed runs only; the reference and the converged answer (about 6 of the 8 minutes)
    # read from an earlier run's JSON with the same bar, frames and reference settings:
    .venv/bin/python benchmarks/twist_accuracy.py --reference-from benchmarks/results/twist-accuracy/2026-12-01-intel-xeon-2c.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
from common import load_average, machine

REVOLUTION = 2.0 * np.pi  # rad/s: one revolution per second


def bar_scene(
    iterations: int,
    dt: float,
    resolution,
    acceleration: str = "none",
    window: int = 5,
    tolerance: float = 0.0,
):
    from tisim.cli.app import demos_dir
    from tisim.scene import load_scene

    sets = [
        "objects.bar.youngs_modulus=1e6",
        "objects.bar.poisson_ratio=0.4",
        "sim.gravity=[0.0, 0.0, 0.0]",
        f"objects.bar.handles.twist.angular_velocity=[{REVOLUTION!r}, 0.0, 0.0]",
        f"objects.bar.resolution={list(resolution)}",
        f"solver.iterations={iterations}",
        f"sim.dt={dt!r}",
        f"solver.anderson_window={window}",
        f"solver.tolerance={tolerance!r}",
    ]
    if acceleration is not None:  # None: the solver's default (acceleration = "auto")
        sets.append(f'solver.acceleration="{acceleration}"')
    return load_scene(demos_dir() / "twisting-bar-neohookean.toml", sets)


class TwistGauge:
    """Mid-section twist (rad) of a bar along x: least-squares rotation about x of the vertex
    layers nearest x = 0, unwrapped across calls."""

    def __init__(self, rest: np.ndarray):
        x0 = np.asarray(rest, dtype=np.float64)
        layers = np.unique(np.round(x0[:, 0], 9))
        d = np.abs(layers)
        near = layers[d <= d.min() + 1e-9]  # one layer on x = 0, or the two either side
        self.layers = [np.flatnonzero(np.abs(x0[:, 0] - c) < 1e-9) for c in near]
        self.rest = [x0[i][:, 1:] - x0[i][:, 1:].mean(axis=0) for i in self.layers]
        self.last = [0.0] * len(self.layers)

    def __call__(self, x: np.ndarray) -> float:
        for k, (idx, r0) in enumerate(zip(self.layers, self.rest)):
            r = x[idx][:, 1:] - x[idx][:, 1:].mean(axis=0)
            cross = float(np.sum(r0[:, 0] * r[:, 1] - r0[:, 1] * r[:, 0]))
            dot = float(np.sum(r0[:, 0] * r[:, 0] + r0[:, 1] * r[:, 1]))
            a = float(np.arctan2(cross, dot))
            # unwrap each layer (a frame turns a section by far less than pi), then average
            self.last[k] += float(np.angle(np.exp(1j * (a - self.last[k]))))
        return float(np.mean(self.last))


class TisimRun:
    """One configuration of the PD solver on the bar, advanced a frame at a time."""

    def __init__(
        self,
        label,
        iterations,
        resolution,
        acceleration="none",
        window=5,
        substeps=1,
        tolerance=0.0,
    ):
        from tisim.model import Model
        from tisim.solvers.pd.solver import SolverPD

        self.label = label
        self.iterations, self.acceleration, self.window = iterations, acceleration, window
        self.substeps = substeps
        self.dt = 0.01 / substeps
        scene = bar_scene(iterations, self.dt, resolution, acceleration, window, tolerance)
        self.model = Model.from_scene(scene)
        self.solver = SolverPD(self.model, scene.solver)
        self.a = self.model.initial_state()
        self.b = self.a.clone()
        self.gauge = TwistGauge(self.model.initial_positions)
        self.ms, self.twist, self.rejected, self.backtracks = [], [], 0, 0
        self.iterations_done = []
        # what the solver ran (acceleration = "auto" resolves to "anderson" or "none")
        self.acceleration_used = self.solver.info().get("acceleration", acceleration)

    def frame(self) -> None:
        t = time.perf_counter()
        for _ in range(self.substeps):
            st = self.solver.step(self.a, self.b, self.dt)
            self.a, self.b = self.b, self.a
            self.rejected += int(st.extra.get("anderson_rejected", 0))
            self.backtracks += int(st.extra.get("anderson_backtracks", 0))
            self.iterations_done.append(st.iterations)
        self.ms.append(1e3 * (time.perf_counter() - t))
        if not np.all(np.isfinite(self.a.positions)):
            raise FloatingPointError(f"{self.label}: non-finite positions")
        self.twist.append(self.gauge(self.a.positions))


# ------------------------------------------------------------------------------ Newton XPBD
def _peer_child(conn, rest, tets, targets_idx, targets, mu, lam, density, opts) -> None:
    """Child process: build Newton's XPBD bar, then answer "frame" requests with
    (ms, twist) until "stop"."""
    try:
        import newton
        import warp as wp

        wp.config.quiet = True
        wp.init()
        device = "cpu"
        wp.set_device(device)
        builder = newton.ModelBuilder(up_axis=newton.Axis.Y, gravity=(0.0, 0.0, 0.0))
        builder.add_soft_mesh(
            pos=wp.vec3(0.0, 0.0, 0.0),
            rot=wp.quat_identity(),
            scale=1.0,
            vel=wp.vec3(0.0, 0.0, 0.0),
            vertices=[wp.vec3(*map(float, v)) for v in rest],
            indices=np.asarray(tets).reshape(-1).tolist(),
            density=density,
            k_mu=mu,
            k_lambda=lam,
            k_damp=0.0,
            add_surface_mesh_edges=False,
        )
        model = builder.finalize(device=device)
        # no particle-particle contact (tisim's bar has none either): no hash grid, no query
        model.particle_grid = None
        model.particle_max_radius = 0.0
        inv_mass = model.particle_inv_mass.numpy()
        inv_mass[targets_idx] = 0.0
        model.particle_inv_mass.assign(inv_mass)
        mass = model.particle_mass.numpy()
        mass[targets_idx] = 0.0
        model.particle_mass.assign(mass)
        solver = newton.solvers.SolverXPBD(
            model, iterations=opts["iterations"], soft_body_relaxation=opts["relaxation"]
        )
        s0, s1 = model.state(), model.state()
        control = model.control()
        substeps = opts["substeps"]
        h = 0.01 / substeps
        gauge = TwistGauge(rest)
        conn.send(
            {
                "newton": newton.__version__,
                "warp": wp.__version__,
                "vertices": int(model.particle_count),
                "tets": int(model.tet_count),
            }
        )
        k = 0
        while True:
            msg = conn.recv()
            if msg == "stop":
                break
            t = time.perf_counter()
            for _ in range(substeps):
                q = s0.particle_q.numpy()  # held vertices at their targets at the substep's end
                q[targets_idx] = targets[k]
                s0.particle_q.assign(q)
                qd = s0.particle_qd.numpy()
                qd[targets_idx] = 0.0
                s0.particle_qd.assign(qd)
                s0.clear_forces()
                solver.step(s0, s1, control, None, h)
                s0, s1 = s1, s0
                k += 1
            wp.synchronize_device(device)
            ms = 1e3 * (time.perf_counter() - t)
            x = s0.particle_q.numpy().astype(np.float64)
            conn.send((ms, gauge(x) if np.all(np.isfinite(x)) else float("nan")))
    except BaseException as e:  # report instead of hanging the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})


class PeerRun:
    def __init__(self, model, frames: int, opts: dict, timeout: float = 600.0):
        self.label = f"Newton XPBD {opts['substeps']}x{opts['iterations']} (relax {opts['relaxation']})"
        self.ms, self.twist, self.info, self.error = [], [], {}, None
        self.timeout = timeout
        substeps = opts["substeps"]
        h = 0.01 / substeps
        idx0, _ = model.handle_targets(h)
        idx0 = np.asarray(idx0)
        targets = []
        for k in range(frames * substeps):
            idx, tg = model.handle_targets((k + 1) * h)
            if not np.array_equal(np.asarray(idx), idx0):
                raise ValueError("the held set changes during the run")
            targets.append(np.asarray(tg, dtype=np.float32))
        mu = float(np.mean(model.element_mu))
        lam = float(np.mean(model.element_lam))
        density = float(model.mass.sum() / model.rest.volume.sum())
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_peer_child,
            args=(
                child,
                np.asarray(model.initial_positions, dtype=np.float32),
                np.asarray(model.mesh.tets, dtype=np.int32),
                idx0,
                np.stack(targets),
                mu,
                lam,
                density,
                opts,
            ),
            daemon=True,
        )
        self.proc.start()
        self._recv_info()

    def _recv(self):
        if not self.conn.poll(self.timeout):
            raise TimeoutError(f"no answer from the Newton process within {self.timeout:.0f} s")
        msg = self.conn.recv()
        if isinstance(msg, dict) and "error" in msg:
            raise RuntimeError(msg["error"])
        return msg

    def _recv_info(self) -> None:
        try:
            self.info = self._recv()
        except Exception as e:
            self.error = str(e)

    def frame(self) -> None:
        if self.error:
            return
        try:
            self.conn.send("frame")
            ms, tw = self._recv()
            self.ms.append(ms)
            self.twist.append(tw)
        except Exception as e:
            self.error = str(e)

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self.conn.send("stop")
        except Exception:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


# ------------------------------------------------------------------------------ study
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=100, help="frames of 0.01 s (100: t = 1 s)")
    p.add_argument("--warmup", type=int, default=5, help="frames not timed (compilation)")
    p.add_argument("--resolution", type=int, nargs=3, default=[65, 8, 8], help="bar cells")
    p.add_argument(
        "--iterations",
        type=int,
        nargs="+",
        default=[5, 6, 8, 10],
        help="local-global iterations of the plain runs",
    )
    p.add_argument(
        "--anderson-iterations",
        type=int,
        nargs="+",
        default=[4, 5, 6, 8],
        help="local-global iterations of the Anderson-accelerated runs",
    )
    p.add_argument(
        "--default-iterations",
        type=int,
        nargs="*",
        default=[5, 6],
        help="local-global iterations of the runs with the solver's default acceleration",
    )
    p.add_argument("--window", type=int, default=5, help="Anderson window m")
    p.add_argument("--ref-iterations", type=int, default=50, help="iterations of the reference")
    p.add_argument("--ref-substeps", type=int, default=5, help="reference steps a frame (dt/k)")
    p.add_argument("--no-peer", action="store_true", help="skip Newton's XPBD")
    p.add_argument("--peer-substeps", type=int, default=10)
    p.add_argument("--peer-iterations", type=int, default=2)
    p.add_argument("--peer-relaxation", type=float, default=0.1)
    p.add_argument(
        "--out",
        default="out/twist_accuracy.json",
        help="JSON output (copy one worth keeping to benchmarks/results/twist-accuracy/)",
    )
    p.add_argument(
        "--reference-from",
        default=None,
        help="reuse the reference and converged twists of this earlier JSON (same settings)",
    )
    args = p.parse_args(argv)
    reused = None
    if args.reference_from:
        reused = json.loads(Path(args.reference_from).read_text())
        old = reused["settings"]
        keys = ("frames", "resolution", "ref_iterations", "ref_substeps", "window")
        diff = [k for k in keys if old.get(k) != getattr(args, k)]
        if diff:
            p.error(f"--reference-from {args.reference_from}: different {', '.join(diff)}")

    from tisim import backend

    info = backend.init("cpu", "f64")
    m = machine()
    m["load_average_start"] = m["load_average"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, load average {m['load_average_start']}")
    res = args.resolution
    runs = [TisimRun(f"PD {n} it.", n, res) for n in args.iterations]
    runs += [TisimRun(f"PD {n} it., default settings", n, res, None, args.window) for n in args.default_iterations]
    runs += [
        TisimRun(f"PD {n} it. + Anderson m={args.window}", n, res, "anderson", args.window)
        for n in args.anderson_iterations
    ]
    peer = None
    if not args.no_peer:
        try:
            peer = PeerRun(
                runs[0].model,
                args.frames,
                {
                    "substeps": args.peer_substeps,
                    "iterations": args.peer_iterations,
                    "relaxation": args.peer_relaxation,
                },
            )
            if peer.error:
                print(f"Newton: {peer.error}")
        except Exception as e:  # the tisim part still runs
            print(f"Newton: {type(e).__name__}: {e}")
            peer = None
    timed = runs + ([peer] if peer is not None else [])
    t0 = time.perf_counter()
    for f in range(args.frames):
        # rotate the order every frame: no run always follows the peer's pause
        k = f % len(timed)
        for r in timed[k:] + timed[:k]:
            r.frame()
    if peer is not None:
        peer.close()
    print(f"timed runs: {time.perf_counter() - t0:.1f} s; reference ...", flush=True)
    if reused is not None:
        ref_label = reused["reference"]["label"].split(" (from ")[0]
        ref_label += f" (from {args.reference_from})"
        ref_ms = reused["reference"]["frame_ms_median"]
        th_ref = np.asarray(reused["reference"]["twist_rad"])
        th_same = np.asarray(reused["converged_same_dt"]["twist_rad"])
        same_its = reused["converged_same_dt"]["iterations_median"]
    else:
        t0 = time.perf_counter()
        ref = TisimRun(
            f"reference: {args.ref_iterations} it., dt/{args.ref_substeps}",
            args.ref_iterations,
            res,
            substeps=args.ref_substeps,
        )
        for _ in range(args.frames):
            ref.frame()
        print(f"reference: {time.perf_counter() - t0:.1f} s", flush=True)
        # the iteration error alone: the same dt, converged (Anderson to a relative residual
        # of 1e-9)
        same = TisimRun("converged at dt", 500, res, "anderson", args.window, tolerance=1e-9)
        for _ in range(args.frames):
            same.frame()
        ref_label, ref_ms = ref.label, float(np.median(ref.ms))
        th_ref, th_same = np.asarray(ref.twist), np.asarray(same.twist)
        same_its = float(np.median(same.iterations_done))
    end = abs(th_ref[-1])
    peer_ms = float(np.median(peer.ms[args.warmup :])) if peer is not None and peer.ms else None
    rows = []
    for r in runs + ([peer] if peer is not None and peer.ms else []):
        tw = np.asarray(r.twist)
        ms = float(np.median(r.ms[args.warmup :]))
        row = {
            "label": r.label,
            "frame_ms_median": ms,
            "ratio_to_peer": ms / peer_ms if peer_ms else None,
            "twist_end_rad": float(tw[-1]),
        }
        if isinstance(r, TisimRun):
            row.update(
                iterations=r.iterations,
                acceleration=r.acceleration_used,
                acceleration_requested=r.acceleration or "default",
                window=r.window if r.acceleration_used != "none" else None,
                error_end_percent=100.0 * abs(tw[-1] - th_ref[-1]) / end,
                error_max_percent=100.0 * float(np.max(np.abs(tw - th_ref))) / end,
                iteration_error_end_percent=100.0 * abs(tw[-1] - th_same[-1]) / abs(th_same[-1]),
                iteration_error_max_percent=100.0 * float(np.max(np.abs(tw - th_same))) / abs(th_same[-1]),
                anderson_rejected=r.rejected,
                anderson_backtracks=r.backtracks,
            )
        else:
            row.update(
                error_end_percent=None,
                difference_to_tisim_reference_percent=100.0 * abs(tw[-1] - th_ref[-1]) / end,
            )
        rows.append(row)
    t_end = 0.01 * args.frames
    print(
        f"\nmid-section twist at t = {t_end:g} s; reference {th_ref[-1]:.5f} rad ({ref_label}, {ref_ms:.0f} ms a frame)"
    )
    print(f"converged at dt = 0.01 s: {th_same[-1]:.5f} rad ({same_its:.0f} Anderson iterations a step, median)")
    print("err: against the reference; it.err: against the converged answer at the same dt")
    hdr = (
        f"{'run':<34} {'ms/frame':>9} {'x peer':>7} {'twist rad':>10} {'err end %':>10} "
        f"{'err max %':>10} {'it.err end %':>13} {'it.err max %':>13}"
    )
    print(hdr)
    print("-" * len(hdr))
    for row in rows:
        ratio = f"{row['ratio_to_peer']:.2f}" if row["ratio_to_peer"] else "-"
        ee = row.get("error_end_percent")
        em = row.get("error_max_percent")
        ie = row.get("iteration_error_end_percent")
        im = row.get("iteration_error_max_percent")
        print(
            f"{row['label']:<34} {row['frame_ms_median']:>9.1f} {ratio:>7} "
            f"{row['twist_end_rad']:>10.5f} "
            f"{(f'{ee:.2f}' if ee is not None else '(n/a)'):>10} "
            f"{(f'{em:.2f}' if em is not None else ''):>10} "
            f"{(f'{ie:.2f}' if ie is not None else ''):>13} "
            f"{(f'{im:.2f}' if im is not None else ''):>13}"
        )
    if peer is not None and peer.error:
        print(f"Newton: {peer.error}")
    m["load_average_end"] = load_average()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": m,
                "taichi": {"arch": info.arch, "precision": info.precision},
                "settings": vars(args),
                "bar": {
                    "vertices": int(runs[0].model.vertex_count),
                    "tets": int(runs[0].model.element_count),
                    "youngs_modulus": 1e6,
                    "poisson_ratio": 0.4,
                    "angular_velocity_rad_s": REVOLUTION,
                },
                "reference": {
                    "label": ref_label,
                    "twist_end_rad": float(th_ref[-1]),
                    "frame_ms_median": ref_ms,
                    "twist_rad": th_ref.tolist(),
                },
                "converged_same_dt": {
                    "twist_end_rad": float(th_same[-1]),
                    "iterations_median": same_its,
                    "twist_rad": th_same.tolist(),
                },
                "peer": ({**peer.info, "error": peer.error, "twist_rad": peer.twist} if peer is not None else None),
                "runs": rows,
            },
            indent=2,
        )
    )
    print(f"load average at the end {m['load_average_end']}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
