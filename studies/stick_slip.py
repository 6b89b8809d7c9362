"""Stick-slip threshold of the PD solver's frictional contact (notes §5.8).

A stiff box (demos/stick-slip.toml: 0.2 m, E = 10 MPa, h = 0.01 s, 10 local-global and
24 CR iterations) rests on a plane inclined by theta. Coulomb friction makes it stay for
mu >= tan(theta) and slide for mu < tan(theta). For each angle and complementarity
preconditioner this script

1. runs mu = tan(theta) +- 0.001 and reports whether the box stays (its centre moves
   less than 1 mm in ``--seconds`` and ends at rest) or slides (its speed keeps growing),
2. finds the simulated threshold by bisection on mu to ``--tol`` and prints its error
   against tan(theta). The bisection asks whether the box is at rest at the end (speed
   below 1e-6 m/s): just above the threshold the box may creep during the first steps
   (the contact forces start from zero and the box settles elastically) and then needs
   (mu - tan theta) g cos theta to stop, so "moved less than 1 mm" would bias the
   threshold upwards by the transient rather than measure the friction law.

Usage:
    .venv/bin/python studies/stick_slip.py                      # 10 and 20 degrees, both preconditioners
    .venv/bin/python studies/stick_slip.py --angle 10 --preconditioner delassus --tol 1e-4
    .venv/bin/python studies/stick_slip.py --friction-jacobian lagged   # the notes' slip linearisation
    .venv/bin/python studies/stick_slip.py --notes-settings --no-bisection  # the notes' contact settings
    .venv/bin/python studies/stick_slip.py --json stick_slip.json

The project's default contact settings (3 Newton steps per local-global iteration, full
friction Jacobian) pass mu* +- 0.001 with both preconditioners. With the notes' settings
(``--notes-settings``: 1 Newton step, lagged friction Jacobian) the preconditioner
matters, as the paper reports: at mu* + 0.001 the box moves 0.29 mm with the Delassus
diagonal and creeps 5.6 mm with the mass-based one at 10 degrees (8.7 mm and 30 mm, still
sliding, at 20 degrees); tests/verification/test_contact.py checks it.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCENE = ROOT / "demos" / "stick-slip.toml"


def incline_overrides(angle_deg: float) -> list[str]:
    """--set override that tilts the incline; the box sits in the incline's frame
    (objects.box.frame = "incline"), so it tilts along and stays flat on it."""
    return [f"colliders.incline.rotation=[0.0, 0.0, {angle_deg!r}]"]


def run_box(
    angle: float,
    mu: float,
    preconditioner: str,
    seconds: float,
    friction_jacobian: str,
    extra: list[str],
) -> dict:
    """Simulate the box; return displacement of the centre (m) and speeds down the slope (m/s)."""
    from tisim.model import Model
    from tisim.scene import load_scene
    from tisim.solvers.pd.solver import SolverPD

    scene = load_scene(
        SCENE,
        incline_overrides(angle)
        + [
            f"contact.mu={mu!r}",
            f'contact.preconditioner="{preconditioner}"',
            f'contact.friction_jacobian="{friction_jacobian}"',
            *extra,
        ],
    )
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    th = math.radians(angle)
    down = -np.array([math.cos(th), math.sin(th), 0.0])
    m = model.mass[:, None]
    s0 = model.initial_state()
    s1 = s0.clone()
    c0 = (m * s0.positions).sum(0) / m.sum()
    speeds = []
    steps = round(seconds / scene.sim.dt)
    t0 = time.perf_counter()
    for _ in range(steps):
        solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
        speeds.append(float((m * s0.velocities).sum(0) @ down / m.sum()))
    c1 = (m * s0.positions).sum(0) / m.sum()
    sp = np.asarray(speeds)
    disp = float(np.linalg.norm(c1 - c0))
    at_rest = abs(sp[-1]) < 1e-6
    stays = disp < 1e-3 and at_rest
    growing = bool(sp[-1] > sp[len(sp) // 2] > 0)
    return {
        "mu": mu,
        "displacement_m": disp,
        "speed_end": float(sp[-1]),
        "speed_mid": float(sp[len(sp) // 2]),
        "stays": bool(stays),
        "at_rest": bool(at_rest),
        "slides_accelerating": growing,
        "wall_s": time.perf_counter() - t0,
    }


def threshold(angle, preconditioner, seconds, tol, friction_jacobian, extra, bracket=0.02, log=print):
    """Bisection for the smallest mu at which the box is at rest after ``seconds``."""
    mu_star = math.tan(math.radians(angle))
    lo, hi = mu_star - bracket, mu_star + bracket
    r_lo = run_box(angle, lo, preconditioner, seconds, friction_jacobian, extra)
    r_hi = run_box(angle, hi, preconditioner, seconds, friction_jacobian, extra)
    runs = [r_lo, r_hi]
    # widen until the bracket holds (a poor preconditioner may be off by more than the bracket)
    while r_lo["at_rest"] and lo > 0:
        lo = max(lo - 4 * bracket, 0.0)
        r_lo = run_box(angle, lo, preconditioner, seconds, friction_jacobian, extra)
        runs.append(r_lo)
    while not r_hi["at_rest"] and hi < 2.0:
        hi += 4 * bracket
        r_hi = run_box(angle, hi, preconditioner, seconds, friction_jacobian, extra)
        runs.append(r_hi)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        r = run_box(angle, mid, preconditioner, seconds, friction_jacobian, extra)
        runs.append(r)
        log(
            f"    mu = {mid:.5f}: {'at rest' if r['at_rest'] else 'sliding'} at the end "
            f"(moved {1e3 * r['displacement_m']:.3f} mm, end speed {r['speed_end']:.2e} m/s)"
        )
        if r["at_rest"]:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi), (lo, hi), runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--angle", type=float, nargs="+", default=[10.0, 20.0])
    ap.add_argument("--preconditioner", nargs="+", default=["delassus", "mass"], choices=["delassus", "mass"])
    ap.add_argument("--friction-jacobian", default="full", choices=["full", "lagged"])
    ap.add_argument(
        "--newton-iterations",
        type=int,
        default=None,
        help="contact Newton steps per local-global iteration",
    )
    ap.add_argument(
        "--notes-settings",
        action="store_true",
        help="the notes' contact settings: 1 Newton step, lagged friction Jacobian",
    )
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--tol", type=float, default=2e-4, help="bisection bracket width on mu")
    ap.add_argument("--bracket", type=float, default=0.02, help="initial half-width around tan(theta)")
    ap.add_argument("--no-bisection", action="store_true", help="only the +-0.001 checks")
    ap.add_argument("--set", action="append", default=[], help="extra scene override, e.g. solver.iterations=5")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.notes_settings:
        args.friction_jacobian = "lagged"
        args.newton_iterations = 1
    if args.newton_iterations is not None:
        if args.newton_iterations < 1:
            print(
                f"--newton-iterations: expected an integer >= 1, got {args.newton_iterations}",
                file=sys.stderr,
            )
            return 2
        args.set = [*args.set, f"contact.newton_iterations={args.newton_iterations}"]

    from tisim import backend

    backend.init("cpu", "f64")
    results = []
    print(
        f"machine: {platform.processor() or platform.machine()}, {platform.system()}, python {platform.python_version()}"
    )
    print(
        f"scene: {SCENE.name}, {args.seconds:g} s, friction Jacobian: {args.friction_jacobian}, "
        f"contact Newton steps: {args.newton_iterations or 'scene default'}"
    )
    for angle in args.angle:
        mu_star = math.tan(math.radians(angle))
        for pre in args.preconditioner:
            print(f"angle {angle:g} deg (tan = {mu_star:.8f}), preconditioner {pre}:")
            checks = {}
            for dmu in (+0.001, -0.001):
                r = run_box(angle, mu_star + dmu, pre, args.seconds, args.friction_jacobian, args.set)
                checks[f"{dmu:+.3f}"] = r
                verdict = (
                    "stays"
                    if r["stays"]
                    else "slides, speeding up"
                    if r["slides_accelerating"]
                    else "crept more than 1 mm, then stopped"
                    if r["at_rest"]
                    else "slides"
                )
                print(
                    f"  mu = tan + {dmu:+.3f} = {r['mu']:.5f}: {verdict} (centre moved "
                    f"{1e3 * r['displacement_m']:.3f} mm, speed mid/end {r['speed_mid']:.2e}/{r['speed_end']:.2e} m/s)"
                )
            entry = {
                "angle_deg": angle,
                "tan": mu_star,
                "preconditioner": pre,
                "friction_jacobian": args.friction_jacobian,
                "newton_iterations": args.newton_iterations,
                "checks": checks,
                "correct_at_0_001": bool(checks["+0.001"]["stays"] and checks["-0.001"]["slides_accelerating"]),
            }
            if not args.no_bisection:
                mu_t, (lo, hi), runs = threshold(
                    angle,
                    pre,
                    args.seconds,
                    args.tol,
                    args.friction_jacobian,
                    args.set,
                    args.bracket,
                )
                entry.update(threshold=mu_t, bracket=[lo, hi], error=mu_t - mu_star, runs=len(runs))
                print(
                    f"  simulated threshold {mu_t:.5f} in [{lo:.5f}, {hi:.5f}]: error {mu_t - mu_star:+.5f} "
                    f"({len(runs)} runs)"
                )
            results.append(entry)
    print()
    print(f"{'angle':>6} {'precond.':>9} {'+-0.001 ok':>10} {'threshold':>10} {'error':>9}")
    for e in results:
        thr = f"{e['threshold']:.5f}" if "threshold" in e else "-"
        err = f"{e['error']:+.5f}" if "error" in e else "-"
        print(f"{e['angle_deg']:>6g} {e['preconditioner']:>9} {e['correct_at_0_001']!s:>10} {thr:>10} {err:>9}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": platform.machine(),
                    "processor": platform.processor(),
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
