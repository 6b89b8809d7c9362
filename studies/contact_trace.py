"""Where two backends' device contact updates part ways: one recorded contact problem
replayed on both, stage by stage.

On an NVIDIA H200 the device contact update (tisim.contact.ncp.device_ncp) in f32 let the
squeeze-ball through the floor, while the same kernels agree with the CPU in f64 on CUDA
and in f32 on the CPU backend and on Vulkan (docs/benchmarks.md, "GPU-class backends"). The cause was
found afterwards by emulation on the CPU (CUDA's approximate f32 square root in a
cancelling Fischer-Burmeister derivative) and fixed; no GPU has run the fix yet. This tool
confirms it there, or names the kernel that still parts. Backends differ in round-off long
before contact, so comparing two whole runs cannot say which kernel is wrong; therefore:

1. runs the squeeze-ball on the reference backend with the device update and records the
   DeviceNCP calls of its first contact updates: the constructor's settings, each load
   (contacts, W_hat, preconditioner, forces, the colliders' parameter table), set_lam and
   update (positions q, Newton steps);
2. replays those calls, inputs identical to the bit, on each backend in a fresh process
   with the stages launched one by one (TISIM_CONTACT_SERIAL=0, the GPU path, everywhere),
   each update from the forces the recording had when it began, keeping after each load,
   kinematics/merit, Newton begin, CR iteration, CR end, line search (its trials at
   once, then the commit) and record the per-contact arrays (first k rows) and scalars,
   and after each update the forces lambda and H^T lambda;
3. lines the two replays up and prints, stage by stage, the largest relative difference
   per array, stopping at the first judged stage past its tolerance (:func:`judged`: each
   update's first Newton step on everything, later steps, which amplify round-off, on
   forces, gaps and slips): the kernel that stage launched is where to look. The whole
   runs' positions are compared frame by frame too.

    python studies/contact_trace.py --archs cpu cuda --precision f32     # on a GPU machine, ~1 min
    python studies/contact_trace.py --archs cpu vulkan --precision f32   # Mesa lavapipe: agrees (3.7%)

Writes calls.pkl, replay_<arch>.npz, run_<arch>.npz (<arch>_2 for the second of two runs on
the same backend) and trace.json under --out; exits 3
when the replays part.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np

# storage arrays kept after each stage (their first k rows, or 3k entries of the flat ones)
ROWS = ("lam", "d", "u", "dlam", "epar")
FLAT = ("res", "om", "E", "dl", "x", "r", "p", "s", "act")
LOADED = ("vert", "wgt", "frames", "gap0", "point0", "mu", "r_n", "r_t", "cjj")
STAGES = ("start", "merit", "newton_begin", "cr_iteration", "cr_last", "line_search", "record")
# what a verdict is taken on: the problem as loaded, the gaps and slips, the CR solution, the
# Newton direction and the forces. Not the CR's work vectors (s, p, r: measured 0.18 apart on
# Mesa's lavapipe against the CPU, both right, from round-off in a few CR iterations), not
# the scalars (residuals and merits near convergence are round-off themselves), not the
# active-set flags (a row at the Fischer-Burmeister kink may flip with round-off).
KEY = ("lam", "dlam", "x", "d", "u", "force", "W", "cparams", *LOADED)


def _scene():
    from tisim.cli.app import demos_dir
    from tisim.scene import load_scene

    return load_scene(
        demos_dir() / "squeeze-ball.toml", ['contact.implementation="device"', 'solver.global_step="sparse-inverse"']
    )


def _run(arch: str, precision: str, frames: int, out: Path, calls_out: Path | None, updates: int) -> None:
    """The squeeze-ball on ``arch``: positions per frame into ``out``; with ``calls_out``,
    the DeviceNCP calls of the first ``updates`` device updates into it."""
    from tisim.contact.ncp import device_ncp as dn
    from tisim.runner import build

    calls: list = []
    state = {"updates": 0}
    if calls_out is not None:
        orig_init, orig_load = dn.DeviceNCP.__init__, dn.DeviceNCP.load
        orig_set, orig_update = dn.DeviceNCP.set_lam, dn.DeviceNCP.update

        def recording() -> bool:
            return state["updates"] < updates

        def init(self, vertex_count, **kw):
            orig_init(self, vertex_count, **kw)
            calls.append(("init", vertex_count, {k: (np.dtype(v).str if k == "dtype" else v) for k, v in kw.items()}))

        def load(self, contacts, W_hat, r_n, r_t, compliance, scale, h, lam, colliders=(), t=0.0):
            orig_load(self, contacts, W_hat, r_n, r_t, compliance, scale, h, lam, colliders, t)
            if recording() and contacts.count:
                table = dn.collider_parameters(colliders, t)
                calls.append(
                    (
                        "load",
                        pickle.dumps(contacts),
                        np.array(W_hat),
                        np.array(r_n),
                        np.array(r_t),
                        np.array(compliance),
                        float(scale),
                        float(h),
                        np.array(lam),
                        table,
                    )
                )

        def set_lam(self, lam):
            orig_set(self, lam)
            if recording() and self.k:
                calls.append(("set_lam", np.array(lam)))

        def update(self, q, newton_iterations, fused=None):
            kept = recording() and self.k
            if kept:
                # the forces it starts from: each replayed update starts from the reference
                # run's, so a difference in one update does not carry into the next (they
                # compound: on lavapipe a 0.2% difference after the impact frame's first
                # update became 100% at the end of the next)
                calls.append(("start_lam", self.get_lam()))
                qa = q.to_numpy() if hasattr(q, "to_numpy") else np.array(q)
                calls.append(("update", qa, int(newton_iterations)))
                state["updates"] += 1
            r = orig_update(self, q, newton_iterations, fused)
            if kept:  # what the run got: the replay on this backend must give the same
                calls.append(("result", np.array(self.force(), copy=True)))
            return r

        dn.DeviceNCP.__init__, dn.DeviceNCP.load = init, load
        dn.DeviceNCP.set_lam, dn.DeviceNCP.update = set_lam, update

    scene = _scene()
    _, model, solver = build(scene, arch, precision)
    a = model.initial_state()
    b = a.clone()
    positions = []
    for _ in range(frames):
        solver.step(a, b, scene.sim.dt)
        a, b = b, a
        positions.append(np.array(a.positions, copy=True))
    np.savez_compressed(out, positions=np.array(positions))
    if calls_out is not None:
        calls_out.write_bytes(pickle.dumps(calls))


def _replay(calls_path: Path, out: Path) -> None:
    """Replay the recorded calls on this process's backend, keeping each stage's arrays."""
    from taichi.lang.kernel_impl import _BoundedDifferentiableMethod

    from tisim.contact.ncp import device_ncp as dn

    calls = pickle.loads(calls_path.read_bytes())
    snaps: list[tuple[str, dict]] = []
    ctx = {"update": 0, "k": 0, "count": {}}

    def keep(label: str, arrays: dict) -> None:
        snaps.append((f"update {ctx['update']} {label}", {n: np.array(v, copy=True) for n, v in arrays.items()}))

    def storage_arrays(st, names) -> dict:
        k = ctx["k"]
        got = {}
        for name in names:
            a = getattr(st, name).to_numpy()
            got[name] = a[: 3 * k] if name in FLAT else a[:k]
        got["sc"] = st.sc.to_numpy()
        return got

    def traced(stage):
        orig = dn._Storage.__dict__[stage]  # a class kernel: bound per call, as data_oriented does
        orig._is_staticmethod = False

        def wrapper(self, *args):
            r = _BoundedDifferentiableMethod(self, orig)(*args)
            if ctx["k"] > 0:
                n = ctx["count"].get(stage, 0)
                ctx["count"][stage] = n + 1
                keep(f"{stage} {n}", storage_arrays(self, ROWS + FLAT))
            return r

        return wrapper

    for stage in STAGES:
        setattr(dn._Storage, stage, traced(stage))

    dev = None
    for call in calls:
        kind = call[0]
        if kind == "init":
            _, n, kw = call
            kw = dict(kw, dtype=np.dtype(kw["dtype"]))
            dev = dn.DeviceNCP(n, **kw)
        elif kind == "load":
            _, contacts, W, r_n, r_t, comp, scale, h, lam, table = call
            contacts = pickle.loads(contacts)
            while dev._ncol < len(table):
                dev._ncol *= 2
            dev.load(contacts, W, r_n, r_t, comp, scale, h, lam, colliders=(), t=0.0)
            dev._put(dev.st.cparams, table)
            ctx["k"] = dev.k
            arrays = storage_arrays(dev.st, LOADED)
            arrays["W"] = dev.st.W.to_numpy()[: dev.k * dev.k]
            arrays["cparams"] = dev.st.cparams.to_numpy()
            keep("load", arrays)
        elif kind in ("set_lam", "start_lam"):
            dev.set_lam(call[1])
        elif kind == "update":
            ctx["count"] = {}
            dev.update(call[1], call[2])
            keep("forces", {"lam": dev.get_lam(), "force": dev.force()})
        elif kind == "result":  # the recording run's forces (the same in every replay)
            keep("recorded", {"recorded_force": call[1]})
            ctx["update"] += 1
    labels = [s[0] for s in snaps]
    flat = {f"{i:05d}/{name}": arr for i, (_, d) in enumerate(snaps) for name, arr in d.items()}
    np.savez_compressed(out, labels=np.array(labels), **flat)


def load_trace(path: Path) -> list[tuple[str, dict]]:
    z = np.load(path)
    snaps = [(str(lab), {}) for lab in z["labels"]]
    for key in z.files:
        if key != "labels":
            i, name = key.split("/", 1)
            snaps[int(i)][1][name] = z[key]
    return snaps


def relative_difference(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(|a|, |b|) over the finite entries (0 for two zero arrays); inf
    when the shapes differ or the entries that are not finite differ."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return float("inf")
    if not fa.any():
        return 0.0
    scale = max(np.abs(a[fa]).max(), np.abs(b[fb]).max())
    return 0.0 if scale == 0 else float(np.abs(a[fa] - b[fb]).max() / scale)


# arrays a stage leaves that an earlier update's stages wrote last until this update
# rewrites them: the CR solution and direction until its first CR solve (judged from then on)
_WRITTEN_BY = {"cr_last": ("x", "dlam")}


# what later Newton steps are judged on: the forces, gaps and slips, not the directions
PHYSICAL = ("lam", "force", "d", "u")


def judged(label: str, newton_step: int) -> tuple[str, ...]:
    """The arrays a stage is judged on (none within a CR solve, whose iterates amplify
    round-off). Every update starts from the reference run's forces and positions, so up
    to the end of its first Newton step both backends see identical inputs: KEY, at the
    first tolerance. Later steps start from each backend's own previous step, and a
    nonsmooth Newton step amplifies round-off (an active-set row flipping at the
    Fischer-Burmeister kink): measured on the squeeze-ball's impact updates, lavapipe
    against the CPU in f64 parted by 27% in a fourth step's direction and 2.9% in its
    forces, in f32 by 7.3% and 3.7%. There only PHYSICAL is judged, at the late tolerance.
    The CUDA f32 fault this tool was built for, emulated on the CPU (every square root of
    the update 4 ulp high, the old Fischer-Burmeister derivative), parts the forces by 19%,
    the slips by 33% (trial slips 114%) in later steps; the fixed derivative under the same
    emulation stays within 4.3%."""
    if "cr_iteration" in label:
        return ()
    return KEY if newton_step == 0 else PHYSICAL


def compare(reference: list, other: list, tol: float, late_tol: float = 0.1) -> dict:
    """Line two traces up label by label: per stage the largest relative difference per
    array; the first stage where a judged array (:func:`judged`) passes its tolerance
    (``tol`` up to the end of an update's first Newton step, ``late_tol`` after), or where
    the labels part within a first step (a different number of CR iterations or trials),
    ends the comparison. When the labels part in a later step both traces skip to the next
    update, which starts from the same inputs again; such partings are listed."""
    rows, first = [], None
    update, step = None, 0
    stale: set = set()
    i = j = 0
    while i < len(reference) and j < len(other):
        (la, da), (lb, db) = reference[i], other[j]
        words = la.split()
        if words[:2] != update:
            update, step = words[:2], 0
            stale = {n for names in _WRITTEN_BY.values() for n in names}
        if la != lb:
            if step >= 1 and lb.split()[:2] == update:
                rows.append({"label": la, "diffs": {}, "parted": lb})
                while i < len(reference) and reference[i][0].split()[:2] == update:
                    i += 1
                while j < len(other) and other[j][0].split()[:2] == update:
                    j += 1
                continue
            first = {"label": lb, "reason": f"the traces part: {la!r} against {lb!r}"}
            break
        if len(words) >= 3 and words[2] in _WRITTEN_BY:
            stale -= set(_WRITTEN_BY[words[2]])
        if len(words) == 4 and words[2] == "newton_begin":
            step = int(words[3])
        diffs = {name: relative_difference(db[name], da[name]) for name in da if name in db}
        names = judged(la, step)
        kept = {n: v for n, v in diffs.items() if n in names and n not in stale}
        rows.append({"label": la, "diffs": diffs, "judged": kept})
        limit = tol if step == 0 else late_tol
        bad = {n: v for n, v in kept.items() if v > limit}
        if bad:
            first = {
                "label": la,
                "reason": f"past tolerance {limit:.0e}: "
                + ", ".join(f"{n} {v:.2e}" for n, v in sorted(bad.items(), key=lambda kv: -kv[1])),
            }
            break
        i += 1
        j += 1
    if first is None and (i < len(reference) or j < len(other)):
        first = {"label": None, "reason": f"lengths {len(reference)} and {len(other)}"}
    return {"tolerance": tol, "late_tolerance": late_tol, "stages_compared": len(rows), "rows": rows, "first": first}


def print_report(res: dict, title: str, last: int = 14) -> None:
    print(
        f"{title}: {res['stages_compared']} stages compared, tolerance {res['tolerance']:.0e} "
        f"(later Newton steps {res['late_tolerance']:.0e})"
    )
    for r in res["rows"][-last:] if last > 0 else []:
        if "parted" in r:
            print(f"  {r['label']:<30} parted from {r['parted']!r} (a later Newton step: next update)")
            continue
        top = sorted(((n, v) for n, v in r["diffs"].items() if n in KEY), key=lambda kv: -kv[1])[:4]
        print(f"  {r['label']:<30} " + ", ".join(f"{n} {v:.1e}" for n, v in top))
    worst = max(((v, n, r["label"]) for r in res["rows"] for n, v in r.get("judged", {}).items()), default=None)
    if worst is not None:
        print(f"  largest judged difference: {worst[1]} {worst[0]:.1e} at {worst[2]}")
    parted = [r["label"] for r in res["rows"] if "parted" in r]
    if parted:
        print(f"  later Newton steps parted (not judged) in: {', '.join(parted)}")
    f = res["first"]
    print("  first difference:", "none" if f is None else f"{f['label']}: {f['reason']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", nargs=2, default=["cpu", "cuda"], metavar=("REFERENCE", "OTHER"))
    ap.add_argument("--precision", default="f32", choices=["f32", "f64"])
    ap.add_argument(
        "--frames",
        type=int,
        default=13,
        help="the squeeze-ball enters the contact band in frame 11 and is hit in frame 12",
    )
    ap.add_argument(
        "--updates",
        type=int,
        default=10,
        help="device contact updates recorded and replayed (five a frame: the default covers "
        "frames 11 and 12; frame 11's converge before a Newton step)",
    )
    ap.add_argument(
        "--tol", type=float, default=None, help="each update's first Newton step (default 1e-1 in f32, 1e-8 in f64)"
    )
    ap.add_argument(
        "--late-tol", type=float, default=0.1, help="forces, gaps and slips in later Newton steps (default 0.1)"
    )
    ap.add_argument(
        "--replay-only",
        action="store_true",
        help="no whole run on the other backend (nor the runs' comparison): record on the reference "
        "and replay on both (the test of the tool itself, which checks only the replays)",
    )
    ap.add_argument("--out", type=Path, default=Path("out/contact_trace"))
    ap.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    ref, other = a.archs
    # the other backend's files; "_2" when both are the same backend (two processes compared)
    tag = {"ref": ref, "other": other if other != ref else f"{other}_2"}
    if a.child:  # a fresh process per backend: ("run" | "replay", "ref" | "other")
        os.environ["TISIM_CONTACT_SERIAL"] = "0"  # staged launches on every backend
        from tisim import backend

        what, role = a.child
        arch = ref if role == "ref" else other
        backend.init(arch, a.precision)
        if what == "run":
            record = a.out / "calls.pkl" if role == "ref" else None
            _run(arch, a.precision, a.frames, a.out / f"run_{tag[role]}.npz", record, a.updates)
        else:
            _replay(a.out / "calls.pkl", a.out / f"replay_{tag[role]}.npz")
        return 0

    # first Newton steps, identical inputs: lavapipe against the CPU within 3.5e-2 in f32
    # (CR in f32 amplifies round-off) and 4.9e-10 in f64; later steps: see judged()
    tol = a.tol if a.tol is not None else (1e-1 if a.precision == "f32" else 1e-8)
    a.out.mkdir(parents=True, exist_ok=True)
    steps = [("run", "ref"), ("run", "other"), ("replay", "ref"), ("replay", "other")]
    if a.replay_only:
        steps.remove(("run", "other"))
    for what, role in steps:
        cmd = [
            sys.executable,
            __file__,
            "--archs",
            ref,
            other,
            "--precision",
            a.precision,
            "--frames",
            str(a.frames),
            "--updates",
            str(a.updates),
            "--out",
            str(a.out),
            "--child",
            what,
            role,
        ]
        r = subprocess.run(cmd, check=False)
        if r.returncode != 0:
            print(f"{what} on {tag[role]} failed (exit {r.returncode})", file=sys.stderr)
            return 1
    gap = None
    if not a.replay_only:
        pa = np.load(a.out / f"run_{tag['ref']}.npz")["positions"]
        pb = np.load(a.out / f"run_{tag['other']}.npz")["positions"]
        gap = np.abs(pa - pb).max(axis=(1, 2))
        print(
            f"whole runs, {other} against {ref} ({a.precision}), max |dx| per frame (m): "
            + " ".join(f"{g:.1e}" for g in gap)
        )
    res = compare(
        load_trace(a.out / f"replay_{tag['ref']}.npz"),
        load_trace(a.out / f"replay_{tag['other']}.npz"),
        tol,
        a.late_tol,
    )
    print_report(res, f"replayed contact updates, {other} against {ref}")
    if res["first"] is None and gap is not None and gap[-1] > 1e-3:
        print(
            "  the contact kernels agree on the same inputs while the runs part by "
            f"{gap[-1] * 1e3:.1f} mm: look at the PD kernels that take the device forces "
            "(iterate with fdev, set_residual_difference) and at what PDContact hands the device"
        )
    (a.out / "trace.json").write_text(
        json.dumps(
            {
                "archs": a.archs,
                "precision": a.precision,
                "run_max_dx_per_frame": None if gap is None else gap.tolist(),
                **res,
            },
            indent=1,
            default=float,
        )
    )
    return 0 if res["first"] is None else 3


if __name__ == "__main__":
    sys.exit(main())
