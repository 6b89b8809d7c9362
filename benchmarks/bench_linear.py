"""Benchmark of the cloth's sparse linear solvers on real Newton systems: CHOLMOD against
MKL PARDISO (double precision on the CSR upper triangle, on the 3 x 3 block upper
triangle as the cloth solver runs it, and single precision refined in double: "mixed"),
and, up to 41 x 41 vertices, LAPACK's dense Cholesky ("dense").

Runs the cloth-drape demo (default 64 x 64 vertices, the cloth benchmark's size) until
the sheet has been on the sphere for a few frames, records the Newton systems of the last
frames (the solver's own matrices and right-hand sides), then times each back-end on each
recorded system: symbolic analysis, numeric factorisation, solve (median of --repeat runs)
and the residual of its solution. Also counts how many distinct patterns the recorded
systems have, i.e. how many analyses a Newton loop pays.

    .venv/bin/python benchmarks/bench_linear.py                       # 64 x 64, frames 16-21
    .venv/bin/python benchmarks/bench_linear.py --cells 32 --json /tmp/linear.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
SCENE = ROOT / "demos" / "cloth-drape.toml"


def record_systems(cells: int, frames: int, keep_from: int) -> list[tuple[sp.csr_matrix, np.ndarray]]:
    """The Newton systems of frames >= keep_from of the drape."""
    from tisim import backend

    backend.init("cpu", "f64")
    from tisim.runner import build
    from tisim.scene import load_scene

    sc = load_scene(SCENE, [f"objects.cloth.cloth_resolution=[{cells},{cells}]"])
    _binfo, model, solver = build(sc, "cpu", "f64")
    systems, frame = [], [0]
    solve = solver.linear.solve

    def record(system, b):
        if frame[0] >= keep_from:  # (the solver hands over its SystemAssembler)
            A = system if sp.issparse(system) else system.matrix()
            systems.append((sp.csr_matrix(A, copy=True), np.array(b, copy=True)))
        return solve(system, b)

    solver.linear.solve = record
    st, spare = model.initial_state(), model.initial_state()
    for f in range(frames):
        frame[0] = f
        solver.step(st, spare, sc.sim.dt)
        st, spare = spare, st
    return systems


def _median_ms(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e3)


def time_cholmod(A, b, repeat):
    from sksparse.cholmod import analyze

    C = sp.csc_matrix(A)
    C.sort_indices()
    out = {"analyse_ms": _median_ms(lambda: analyze(C, ordering_method="amd"), repeat)}
    F = analyze(C, ordering_method="amd")
    out["factor_ms"] = _median_ms(lambda: F.cholesky_inplace(C), repeat)
    out["solve_ms"] = _median_ms(lambda: F(b), repeat)
    x = F(b)
    out["factor_nonzeros"] = int(F.L().nnz)
    return out, x


def time_pardiso(A, b, repeat, blocks: bool = False):
    """PARDISO in double precision on the CSR upper triangle, or (blocks) on the 3 x 3
    block upper triangle (BSR), as the cloth solver runs it; convert_ms: building that
    input for a new pattern (the map from A's values; a known pattern costs one gather)."""
    from tisim.linalg.pardiso import BlockUpper, Pardiso, UpperTriangle

    make = (lambda: BlockUpper(3)(A)) if blocks else (lambda: UpperTriangle()(A))
    U = make()
    if U is None:
        raise ValueError("the system is not made of whole 3 x 3 blocks")
    s = Pardiso()
    out = {"convert_ms": _median_ms(make, repeat), "analyse_ms": _median_ms(lambda: s.analyse(U), repeat)}
    out["factor_ms"] = _median_ms(lambda: s.factorize(U), repeat)
    out["solve_ms"] = _median_ms(lambda: s.solve(b), repeat)
    x = s.solve(b)
    out["factor_nonzeros"] = s.factor_nonzeros
    s.release()
    return out, x


def time_pardiso_blocks(A, b, repeat):
    return time_pardiso(A, b, repeat, blocks=True)


def time_mixed(A, b, repeat):
    """PARDISO in single precision with refinement in double, as the cloth solver runs it
    (``SPDSolver(mixed=True)``): factor_ms is the float32 factorisation, solve_ms the
    solve plus its refinement steps (float64 residuals)."""
    from tisim.linalg.pardiso import UpperTriangle
    from tisim.solvers.cloth.solver import SPDSolver

    s = SPDSolver("pardiso", mixed=True)
    U = UpperTriangle()(A)
    pd = s._pardiso32
    out = {"analyse_ms": _median_ms(lambda: pd.analyse(U), repeat)}
    out["factor_ms"] = _median_ms(lambda: pd.factorize(U), repeat)
    out["solve_ms"] = _median_ms(lambda: s._refined(A, b), repeat)
    x = s.solve(A, b)
    out["factor_nonzeros"] = pd.factor_nonzeros
    out["fallbacks"] = s.fallbacks
    return out, x


def time_dense(A, b, repeat):
    """LAPACK's dense Cholesky (scipy.linalg.cho_factor) of the whole matrix: no analysis,
    n^3 / 3 flops; convert_ms is the dense copy of A, paid at every factorisation. For
    deciding where a small system is cheaper dense than sparse."""
    import scipy.linalg as la

    out = {"convert_ms": _median_ms(A.toarray, repeat), "analyse_ms": 0.0}
    D = A.toarray()
    out["factor_ms"] = _median_ms(lambda: la.cho_factor(D, check_finite=False), repeat)
    c = la.cho_factor(D, check_finite=False)
    out["solve_ms"] = _median_ms(lambda: la.cho_solve(c, b, check_finite=False), repeat)
    out["factor_nonzeros"] = A.shape[0] * (A.shape[0] + 1) // 2
    return out, la.cho_solve(c, b, check_finite=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=63, help="cloth cells per side (63: 64 x 64 vertices)")
    ap.add_argument("--frames", type=int, default=22, help="frames to simulate")
    ap.add_argument("--keep-from", type=int, default=16, help="record the systems of frames >= this")
    ap.add_argument("--systems", type=int, default=8, help="time this many of them (evenly spaced)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    from common import machine

    from tisim.linalg import pardiso
    from tisim.linalg.cholesky import cholmod_available

    t0 = time.perf_counter()
    systems = record_systems(a.cells, a.frames, a.keep_from)
    record_s = time.perf_counter() - t0
    patterns = len({(A.indptr.tobytes(), A.indices.tobytes()) for A, _ in systems})
    pick = np.unique(np.linspace(0, len(systems) - 1, min(a.systems, len(systems))).round().astype(int))
    backends = [
        (name, fn)
        for name, fn, ok in (
            ("cholmod", time_cholmod, cholmod_available()),
            ("pardiso", time_pardiso, pardiso.available()),
            ("pardiso-3x3", time_pardiso_blocks, pardiso.available()),
            ("mixed", time_mixed, pardiso.available()),
            ("dense", time_dense, a.cells <= 40),  # 41 x 41 vertices: 5k dofs, 200 MB
        )
        if ok
    ]
    rows = []
    for i in pick:
        A, b = systems[i]
        row = {"system": int(i), "dofs": A.shape[0], "nonzeros": int(A.nnz)}
        for name, fn in backends:
            try:
                r, x = fn(A, b, a.repeat)
            except Exception as e:  # (mixed: a float32 factorisation can lose definiteness)
                row[name] = {"error": f"{type(e).__name__}: {e}"}
                continue
            r["residual"] = float(np.linalg.norm(A @ x - b) / np.linalg.norm(b))
            row[name] = r
        rows.append(row)

    def med(name, key):
        vals = [r[name][key] for r in rows if name in r and key in r[name]]
        return float(np.median(vals)) if vals else None

    summary = {
        name: {k: med(name, k) for k in ("convert_ms", "analyse_ms", "factor_ms", "solve_ms", "factor_nonzeros")}
        for name, _ in backends
    }
    out = {
        "scene": "cloth-drape",
        "cells": a.cells,
        "frames": a.frames,
        "keep_from": a.keep_from,
        "systems_recorded": len(systems),
        "distinct_patterns": patterns,
        "record_s": record_s,
        "machine": machine(),
        "mkl_threads": os.environ.get("MKL_NUM_THREADS", "default"),
        "summary": summary,
        "rows": rows,
    }
    print(
        f"cloth-drape {a.cells + 1} x {a.cells + 1} vertices: {len(systems)} Newton systems of frames "
        f">= {a.keep_from}, {patterns} distinct patterns; {len(rows)} timed, median of {a.repeat} runs each"
    )
    print(f"  {'back-end':<12}{'convert ms':>11}{'analyse ms':>12}{'factor ms':>12}{'solve ms':>10}{'nnz(L)':>12}")
    for name, s in summary.items():
        conv = "" if s["convert_ms"] is None else f"{s['convert_ms']:.1f}"
        print(
            f"  {name:<12}{conv:>11}{s['analyse_ms']:12.1f}{s['factor_ms']:12.1f}{s['solve_ms']:10.2f}"
            f"{s['factor_nonzeros']:12.0f}"
        )
    if "cholmod" in summary and "pardiso" in summary:
        print(
            f"  factorisation ratio cholmod / pardiso: {summary['cholmod']['factor_ms'] / summary['pardiso']['factor_ms']:.2f}x"
        )
    for name in ("cholmod", "pardiso-3x3", "dense"):
        if name in summary and "pardiso" in summary:
            t = {
                k: sum(summary[k][f] or 0.0 for f in ("convert_ms", "factor_ms", "solve_ms")) for k in (name, "pardiso")
            }
            print(f"  conversion + factorisation + solve, {name} / pardiso: {t[name] / t['pardiso']:.2f}x")
    if "mixed" in summary:
        tot = {k: summary[k]["factor_ms"] + summary[k]["solve_ms"] for k in ("pardiso", "mixed")}
        worst = max(r["mixed"].get("residual", np.inf) for r in rows)
        print(
            f"  factorisation + solve, pardiso / mixed: {tot['pardiso'] / tot['mixed']:.2f}x; mixed's largest "
            f"residual {worst:.1e}, {sum(r['mixed'].get('fallbacks', 0) for r in rows)} fallback(s) to double, "
            f"{sum('error' in r['mixed'] for r in rows)} failure(s)"
        )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
        print(f"  JSON: {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
