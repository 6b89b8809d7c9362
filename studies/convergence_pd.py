"""Convergence of the local-global iteration: exact global step (plain and with Anderson
acceleration) vs Jacobi-Chebyshev.

Reproduces the notes' "Convergence: Twisting Bar" finding (§4, §5.3): with the
exact ("complete") global solve the error of a frame drops below 1e-3 within a
few iterations for soft and stiff bars, while one Jacobi-Chebyshev sweep per
iteration (the "incomplete" solve) propagates slowly and, for E >= 1e7, does not
reach 1e-3 even after many iterations.

Set-up: the twisting-bar demo (ARAP) is run for ``--warmup`` frames, converged
(relative residual 1e-8: the backward-Euler trajectory; or ``--warmup-iterations
5`` to start from the state a real-time run would have, whose frames are harder
because they also repair the error of the previous ones), then one more frame is
solved

* to a reference q* by the exact back-end, iterated until the relative residual
  is 1e-12 (at most ``--ref-iterations``), and
* by each method for ``--iterations`` iterations, recording every iterate q^k.

Errors (both reported; the notes do not say which measure the source used):

* positions: ||q^k - q*|| / ||q*|| (q about the bar's centre), the usual
  relative error of the solution;
* correction: ||q^k - q*|| / ||q^0 - q*||, the fraction of the frame's
  correction still missing (q^0 = x_tilde with the handles at their targets,
  the same initial guess for every method) -- much stricter, since a frame
  moves the vertices by millimetres. The Chebyshev spectral radius is estimated for each stiffness
by power iteration on the linear Jacobi iteration matrix (the best case for
Jacobi-Chebyshev) unless ``--rho`` is given. Rotations are extracted with
``--rotation-iterations`` Newton turns per local step so that the comparison is
about the global step.

Anderson (``--methods anderson``, window ``--window``): the exact global step with
``solver.acceleration = "anderson"``; its iterates are those the callback sees, the plain
step G(x_k) from each safeguarded iterate x_k (what a step would return if stopped there).
``--material neo-hookean`` studies the quasi-Newton materials, where the plain iteration
is slowest (shear modes contract by about 1 - mu / (3 mu + 2 lam) an iteration).

Writes CSV (E, method, iteration, error, residual) and a PNG plot; prints the
iterations each method needs to reach 1e-3.

    .venv/bin/python studies/convergence_pd.py --out out/convergence
    .venv/bin/python studies/convergence_pd.py --resolution 92 10 10 --iterations 2000
    .venv/bin/python studies/convergence_pd.py --material neo-hookean --stiffness 1e6 \
        --methods exact anderson --warmup 20 --exact-iterations 40
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np


def build(
    E: float,
    resolution,
    global_step: str,
    iterations: int,
    rho: float | None = None,
    rotation_iterations: int = 4,
    tolerance: float = 0.0,
    acceleration: str = "none",
    window: int = 5,
    material: str | None = None,
):
    from tisim.cli.app import demos_dir
    from tisim.model import Model
    from tisim.scene import load_scene
    from tisim.solvers.pd.solver import SolverPD

    sets = [
        f"objects.bar.youngs_modulus={E}",
        f"objects.bar.resolution={list(resolution)}",
        f'solver.global_step="{global_step}"',
        f"solver.iterations={iterations}",
        f"solver.rotation_iterations={rotation_iterations}",
        f"solver.tolerance={tolerance}",
        f'solver.acceleration="{acceleration}"',
        f"solver.anderson_window={window}",
    ]
    if material is not None:
        sets.append(f'objects.bar.material="{material}"')
    if rho is not None:
        sets.append(f"solver.chebyshev_rho={rho}")
    scene = load_scene(demos_dir() / "twisting-bar.toml", sets)
    model = Model.from_scene(scene)
    return SolverPD(model, scene.solver), model, scene


def jacobi_spectral_radius(solver, gamma: float, iterations: int = 300, seed: int = 0) -> float:
    """Spectral radius of I - gamma D^-1 A_ff by power iteration (A: the solver's matrix)."""
    g = solver.global_step
    A = g.A_ff.tocsr()
    d = A.diagonal()
    x = np.random.default_rng(seed).standard_normal(A.shape[0])
    lam = 0.0
    for _ in range(iterations):
        y = x - gamma * (A @ x) / d
        lam = float(np.linalg.norm(y) / np.linalg.norm(x))
        x = y / np.linalg.norm(y)
    return min(lam, 0.999999)


def frame_iterates(solver, state, dt: float) -> tuple[list[np.ndarray], object]:
    iterates = []
    solver.iteration_callback = lambda k, q: iterates.append(q)
    out = state.clone()
    st = solver.step(state, out, dt)
    solver.iteration_callback = None
    return iterates, st


def study(E: float, args) -> list[dict]:
    # warm up: a twisted, moving bar; converged frames by default (the backward-Euler
    # trajectory), or --warmup-iterations N per frame as a real-time run would do
    if args.warmup_iterations:
        warm, model, scene = build(
            E,
            args.resolution,
            args.exact,
            args.warmup_iterations,
            rotation_iterations=args.rotation_iterations,
            material=args.material,
        )
    else:
        warm, model, scene = build(
            E,
            args.resolution,
            args.exact,
            args.ref_iterations,
            rotation_iterations=args.rotation_iterations,
            tolerance=1e-8,
            material=args.material,
        )
    dt = scene.sim.dt
    a = model.initial_state()
    b = a.clone()
    for _ in range(args.warmup):
        warm.step(a, b, dt)
        a, b = b, a
    state = a.clone()
    quats = warm.kernels.quat.to_numpy()  # the rotation warm start every solve gets
    ref_solver, _, _ = build(
        E,
        args.resolution,
        args.exact,
        args.ref_iterations,
        rotation_iterations=args.rotation_iterations,
        tolerance=1e-12,
        material=args.material,
    )
    ref_solver.kernels.quat.from_numpy(quats)
    t0 = time.perf_counter()
    ref_its, ref_st = frame_iterates(ref_solver, state.clone(), dt)
    q_ref = ref_its[-1]
    print(
        f"E = {E:.0e}: reference in {ref_st.iterations} iterations, relative residual "
        f"{ref_st.residual:.1e} ({time.perf_counter() - t0:.1f} s)"
    )
    idx, targets = model.handle_targets(state.time + dt)
    g = np.asarray(model.gravity)
    q0 = state.positions + dt * state.velocities + dt * dt * g
    q0[idx] = targets
    scale = np.linalg.norm(q0 - q_ref)
    pscale = np.linalg.norm(q_ref)
    rows = []
    for method in args.methods:
        kind = "jacobi" if method == "jacobi" else args.exact
        rho = None
        if method == "jacobi":
            probe, _, _ = build(E, args.resolution, "cholesky", 1, material=args.material)
            rho = args.rho if args.rho is not None else jacobi_spectral_radius(probe, probe.config.jacobi_relaxation)
        n_it = args.iterations if method == "jacobi" else args.exact_iterations
        solver, _, _ = build(
            E,
            args.resolution,
            kind,
            n_it,
            rho=rho,
            rotation_iterations=args.rotation_iterations,
            acceleration="anderson" if method == "anderson" else "none",
            window=args.window,
            material=args.material,
        )
        solver.kernels.quat.from_numpy(quats)  # same rotation warm start as the reference
        t0 = time.perf_counter()
        its, _ = frame_iterates(solver, state.clone(), dt)
        dt_s = time.perf_counter() - t0
        label = {
            "exact": f"exact ({kind})",
            "anderson": f"exact ({kind}) + Anderson m={args.window}",
            "jacobi": f"jacobi (rho={rho:.5f})" if rho is not None else "jacobi",
        }[method]
        corr, pos = [], []
        for k, q in enumerate(its):
            d = float(np.linalg.norm(q - q_ref))
            corr.append(d / scale)
            pos.append(d / pscale)
            rows.append(
                {
                    "E": E,
                    "method": label,
                    "iteration": k + 1,
                    "error_positions": pos[-1],
                    "error_correction": corr[-1],
                }
            )
        for name, vals in (("positions", pos), ("correction", corr)):
            hit = next((k + 1 for k, e in enumerate(vals) if e < 1e-3), None)
            print(
                f"  {method:6s} {kind:15s} {name:10s}: error after 1/5/{len(its)} iterations "
                f"{vals[0]:.2e} / {vals[min(4, len(its) - 1)]:.2e} / {vals[-1]:.2e}; "
                f"< 1e-3 after {hit if hit else f'more than {len(its)}'} iterations"
            )
        print(f"  ({dt_s:.1f} s for {len(its)} iterations)")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="out/convergence_pd", help="output folder (CSV + PNG)")
    p.add_argument(
        "--resolution",
        type=int,
        nargs=3,
        default=[65, 8, 8],
        help="bar cells (default 5,346 vertices)",
    )
    p.add_argument("--stiffness", type=float, nargs="+", default=[1e5, 1e7], help="Young's moduli, Pa")
    p.add_argument("--iterations", type=int, default=1000, help="iterations of the Jacobi run")
    p.add_argument("--exact-iterations", type=int, default=60, help="iterations of the exact run")
    p.add_argument("--ref-iterations", type=int, default=3000, help="max iterations of the reference")
    p.add_argument("--warmup", type=int, default=10, help="frames before the studied one")
    p.add_argument(
        "--warmup-iterations",
        type=int,
        default=0,
        help="iterations per warm-up frame (default 0: converge them to 1e-8)",
    )
    p.add_argument("--exact", default="cholesky", choices=["cholesky", "sparse-inverse"])
    p.add_argument("--rho", type=float, default=None, help="Chebyshev rho (default: estimated)")
    p.add_argument("--rotation-iterations", type=int, default=4)
    p.add_argument(
        "--methods",
        nargs="+",
        default=["exact", "anderson", "jacobi"],
        choices=["exact", "anderson", "jacobi"],
        help="exact global step, the same with Anderson acceleration, Jacobi-Chebyshev",
    )
    p.add_argument("--window", type=int, default=5, help="Anderson window m")
    p.add_argument(
        "--material",
        default=None,
        help="the bar's material (default: the demo's, ARAP), e.g. neo-hookean",
    )
    args = p.parse_args(argv)

    from tisim import backend

    backend.init("cpu", "f64")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for E in args.stiffness:
        rows += study(E, args)
    with open(out / "convergence_pd.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["E", "method", "iteration", "error_positions", "error_correction"])
        w.writeheader()
        w.writerows(rows)
    plot(rows, out / "convergence_pd.png", args)
    print(f"wrote {out / 'convergence_pd.csv'} and {out / 'convergence_pd.png'}")
    return 0


def plot(rows, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Es = sorted({r["E"] for r in rows})
    fig, axes = plt.subplots(2, len(Es), figsize=(5.5 * len(Es), 8.0), squeeze=False)
    n = int(np.prod(np.asarray(args.resolution) + 1))
    for row, (key, ylabel) in enumerate(
        (
            ("error_positions", "||q_k - q*|| / ||q*||"),
            ("error_correction", "||q_k - q*|| / ||q_0 - q*||"),
        )
    ):
        for ax, E in zip(axes[row], Es):
            for method in sorted({r["method"] for r in rows if r["E"] == E}):
                rr = [r for r in rows if r["E"] == E and r["method"] == method]
                ax.semilogy([r["iteration"] for r in rr], [max(r[key], 1e-17) for r in rr], label=method)
            ax.axhline(1e-3, color="gray", lw=0.8, ls="--")
            ax.axvline(5, color="gray", lw=0.8, ls=":")
            ax.set_xscale("log")
            ax.set_xlabel("local-global iteration")
            ax.set_ylabel(ylabel)
            ax.set_title(f"twisting bar, {n} vertices, E = {E:.0e} Pa")
            ax.legend()
            ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
