"""Benchmark of the cloth solver on the cloth-drape demo, with NVIDIA Newton's cloth as a peer.

tisim: demos/cloth-drape.toml with a 64x64-vertex cloth (4,096 vertices, 7,938 faces) at the
demo's h = 0.01 s (projected Newton, C-IPC contact), headless: the median frame time over
all frames after the first (which compiles the Taichi kernels), over frames with contact
(n_contacts > 0) and over free-fall frames, Newton iterations per frame, and the split
of a frame into the solver's phases (StepStats.timings: contact = barrier/friction
potentials and broad phase, elastic = shell energy/gradient/Hessian kernels,
assemble = sparse assembly, linear = sparse factorisation and solve, ccd =
continuous collision detection for the step bound, line_search). Every frame is checked
with the IPC Toolkit (ipctk) outside the timed region: frames with intersections should
be 0.

Peer: the same drape in NVIDIA Newton (``pip install newton``; warp-lang on the CPU
device): the same cloth mesh (same vertices and triangles, 1.2 m, 0.2 kg/m^2, same
placement), Lame membrane stiffnesses mu*t and lambda*t, a static sphere of radius 0.3 at
(0, 0.3, 0) and a ground plane, gravity -9.81 along y, frames of 0.01 s in substeps with
the VBD solver (10 iterations, self-contact on), as in Newton's cloth examples. Its frame
time (median after the first frames, which compile the Warp kernels) and the frames in
which ipctk finds the cloth self-intersecting or intersecting the tessellated sphere
(``has_intersections`` only: distances below Newton's particle radius are allowed).
If Newton cannot be imported or run, the tisim part still runs and the JSON says why.

    .venv/bin/python benchmarks/bench_cloth.py                  # 64x64 cloth, 40 frames
    .venv/bin/python benchmarks/bench_cloth.py --quick          # 32x32 cloth, 25 frames
    .venv/bin/python benchmarks/bench_cloth.py --no-peer --frames 60 --json /tmp/cloth.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
from common import load_average, machine, median

ROOT = Path(__file__).resolve().parent.parent
SCENE = ROOT / "demos" / "cloth-drape.toml"
PHASES = ("contact", "elastic", "assemble", "linear", "ccd", "line_search")


# ------------------------------------------------------------------------------ tisim


def _area(X, F) -> float:
    return float(0.5 * np.linalg.norm(np.cross(X[F[:, 1]] - X[F[:, 0]], X[F[:, 2]] - X[F[:, 0]]), axis=1).sum())


def bench_tisim(cells: int, frames: int, arch: str, overrides: list[str]) -> tuple[dict, dict]:
    """Run the drape; returns (result, scene data for the peer)."""
    from tisim.runner import build
    from tisim.scene import load_scene
    from tisim.testing import ipc_report

    sc = load_scene(SCENE, [f"objects.cloth.cloth_resolution=[{cells},{cells}]", *overrides])
    t0 = time.perf_counter()
    binfo, model, solver = build(sc, arch, "f64")
    setup_s = time.perf_counter() - t0
    dt, substeps = sc.sim.dt, sc.sim.substeps
    xi = sc.contact.thickness
    st, spare = model.initial_state(), model.initial_state()
    V0, F_all, _planes = solver.collision_state(st)
    rows = []
    for f in range(frames):
        prev = st.clone()
        wall = 0.0
        its, nct = 0, 0
        tm = dict.fromkeys(PHASES, 0.0)
        for _ in range(substeps):
            t = time.perf_counter()
            out = solver.step(st, spare, dt)
            wall += 1e3 * (time.perf_counter() - t)
            st, spare = spare, st
            its += out.iterations
            nct = max(nct, out.n_contacts)
            for k in PHASES:
                tm[k] += out.timings.get(k, 0.0)
        finite = st.is_finite()
        # the independent check, outside the timed region
        V, F, pl = solver.collision_state(st)
        P, _, _ = solver.collision_state(prev)
        r = (
            ipc_report(
                V, F, P, planes=pl, plane_rows=solver.nc, edges=solver.edges_all, colliders=solver.analytic_colliders
            )
            if finite
            else None
        )
        rows.append(
            {
                "frame": f,
                "wall_ms": wall,
                "iterations": its,
                "n_contacts": nct,
                "converged": bool(out.converged),
                "ccd_clamps": out.extra.get("ccd_clamps"),
                "min_distance": out.extra.get("min_distance"),
                **{f"{k}_ms": v for k, v in tm.items()},
                "intersecting": None if r is None else bool(r.intersecting),
                "step_free": None if r is None else bool(r.step_free),
                "ipc_min_distance": None if r is None else r.min_distance,
                "plane_distance": None if r is None else r.plane_distance,
            }
        )
        if not finite:
            break
    warm = rows[1:]  # frame 0 compiles the Taichi kernels
    contact = [r for r in warm if r["n_contacts"] > 0]
    free = [r for r in warm if r["n_contacts"] == 0]

    def phase(rs):
        return {k: median([r[f"{k}_ms"] for r in rs]) for k in PHASES}

    first_contact = next((r["frame"] for r in rows if r["n_contacts"] > 0), None)
    res = {
        "solver": "tisim cloth (projected Newton, C-IPC)",
        "cloth_resolution": [cells, cells],
        "vertices": model.cloth.vertex_count,
        "faces": int(len(model.cloth.faces)),
        "obstacle_vertices": solver.no,
        "dt": dt,
        "substeps": substeps,
        "frames": len(rows),
        "arch": binfo.arch,
        "precision": binfo.precision,
        "linear_solver": solver.info().get("linear_solver"),
        "setup_s": setup_s,
        "first_frame_ms": rows[0]["wall_ms"],
        "frame_ms_median": median([r["wall_ms"] for r in warm]),
        "frame_ms_max": float(max(r["wall_ms"] for r in warm)) if warm else None,
        "contact_frame_ms_median": median([r["wall_ms"] for r in contact]),
        "free_frame_ms_median": median([r["wall_ms"] for r in free]),
        "contact_frames": len(contact),
        "first_contact_frame": first_contact,
        "iterations_median": median([r["iterations"] for r in warm]),
        "iterations_contact_median": median([r["iterations"] for r in contact]),
        "iterations_max": int(max(r["iterations"] for r in rows)),
        # the machine-independent part of a contact frame's cost, and what each costs: the
        # median frame is the fifth-fastest contact frame, so it moves with how the
        # iterations fall on the frames as much as with their total
        "iterations_contact_total": int(sum(r["iterations"] for r in contact)),
        # of those, the iterations whose step CCD cut short (alpha < 1 from the collision bound)
        "ccd_cut_iterations_contact_total": int(sum(r["ccd_clamps"] or 0 for r in contact)),
        "contact_ms_per_iteration": (
            float(sum(r["wall_ms"] for r in contact) / sum(r["iterations"] for r in contact))
            if contact and sum(r["iterations"] for r in contact)
            else None
        ),
        "phase_ms_per_contact_iteration": {
            k: float(sum(r[f"{k}_ms"] for r in contact) / max(1, sum(r["iterations"] for r in contact))) for k in PHASES
        }
        if contact
        else None,
        "phase_ms_median": {"all": phase(warm), "contact": phase(contact), "free": phase(free)},
        "phase_ms_mean": {k: float(np.mean([r[f"{k}_ms"] for r in warm])) if warm else None for k in PHASES},
        "frames_intersecting": sum(1 for r in rows if r["intersecting"]),
        "frames_not_step_free": sum(1 for r in rows if r["step_free"] is False),
        "frames_below_thickness": sum(
            1
            for r in rows
            if r["ipc_min_distance"] is not None and (r["ipc_min_distance"] <= xi or r["plane_distance"] <= xi)
        ),
        "all_finite": bool(st.is_finite()),
        "per_frame": rows,
    }
    cp = model.cloth
    peer_scene = {
        "rest": np.asarray(model.initial_positions[cp.vertex_slice], dtype=np.float64),
        "faces": np.asarray(cp.faces, dtype=np.int32),
        "area_density": float(cp.mass.sum()) / _area(cp.rest, cp.faces),  # kg/m^2
        "total_mass": float(cp.mass.sum()),
        "mu_t": float(np.mean(cp.face_mu * cp.face_thickness)),
        "lam_t": float(np.mean(cp.face_lam * cp.face_thickness)),
        "hinge_k": float(np.mean(cp.hinge_k)) if len(cp.hinge_k) else 0.0,
        "friction": float(sc.contact.mu),
        "obstacle_V": np.asarray(V0[solver.nc :], dtype=np.float64),
        "obstacle_F": np.asarray(F_all[len(cp.faces) :] - solver.nc, dtype=np.int32),
        "dt": dt,
        "thickness": xi,
    }
    return res, peer_scene


# ------------------------------------------------------------------------------ Newton


def _peer_child(scene: dict, frames: int, warmup: int, opts: dict, queue) -> None:
    try:
        queue.put(bench_newton(scene, frames, warmup, opts))
    except BaseException as e:  # report instead of hanging the parent
        queue.put({"error": f"{type(e).__name__}: {e}"})


def bench_newton(scene: dict, frames: int, warmup: int, opts: dict) -> dict:
    import ipctk
    import newton
    import warp as wp

    from tisim.geometry.topology import edges as mesh_edges

    wp.config.quiet = True
    wp.init()
    device = "cpu"
    wp.set_device(device)
    X0, Fc = scene["rest"], scene["faces"]
    nc = len(X0)
    edge = float(np.mean(np.linalg.norm(X0[Fc[:, 0]] - X0[Fc[:, 1]], axis=1)))
    radius = opts["particle_radius"]

    builder = newton.ModelBuilder(up_axis=newton.Axis.Y, gravity=(0.0, -9.81, 0.0))
    shape_cfg = newton.ModelBuilder.ShapeConfig()
    shape_cfg.mu = scene["friction"]
    shape_cfg.ke = opts["contact_ke"]
    shape_cfg.kd = opts["contact_kd"]
    builder.add_cloth_mesh(
        pos=wp.vec3(0.0, 0.0, 0.0),
        rot=wp.quat_identity(),
        scale=1.0,
        vel=wp.vec3(0.0, 0.0, 0.0),
        vertices=[wp.vec3(*map(float, v)) for v in X0],
        indices=Fc.reshape(-1).tolist(),
        density=scene["area_density"],
        tri_ke=scene["mu_t"],
        tri_ka=scene["lam_t"],
        tri_kd=opts["tri_kd"],
        # Newton's hinge energy is k * rest_length * (theta - theta0)^2 / 2 (k in N); tisim's
        # discrete-shell hinge_k is in N m: scaled by 1 / edge length (bending is negligible
        # for this 1 mm cloth either way)
        edge_ke=3.0 * scene["hinge_k"] / edge,
        edge_kd=0.0,
        particle_radius=radius,
    )
    builder.add_shape_sphere(
        -1, xform=wp.transform(wp.vec3(0.0, 0.3, 0.0), wp.quat_identity()), radius=0.3, cfg=shape_cfg
    )
    builder.add_ground_plane(cfg=shape_cfg)
    builder.color(include_bending=True)
    model = builder.finalize(device=device)
    model.soft_contact_ke = opts["contact_ke"]
    model.soft_contact_kd = opts["contact_kd"]
    model.soft_contact_mu = scene["friction"]
    solver = newton.solvers.SolverVBD(
        model,
        iterations=opts["iterations"],
        particle_enable_self_contact=True,
        particle_self_contact_margin=opts["self_margin"],
        particle_self_contact_gap=opts["self_gap"],
    )
    pipeline = newton.CollisionPipeline(model, soft_contact_gap=opts["soft_gap"])
    contacts = pipeline.contacts()
    s0, s1 = model.state(), model.state()
    control = model.control()
    substeps = opts["substeps"]
    h = scene["dt"] / substeps

    # the check: cloth + the tessellated sphere tisim uses (the ground is a plane, checked
    # analytically: Newton's penetration of it is reported separately)
    Vo, Fo = scene["obstacle_V"], scene["obstacle_F"]
    F_all = np.concatenate([Fc, Fo + nc]).astype(np.int32)
    E_all = np.asfortranarray(mesh_edges(F_all).astype(np.int32))
    F_all = np.asfortranarray(F_all)
    V_init = np.concatenate([X0, Vo])
    mesh = ipctk.CollisionMesh(np.asfortranarray(V_init), E_all, F_all)
    cloth_mesh = ipctk.CollisionMesh(
        np.asfortranarray(X0), np.asfortranarray(mesh_edges(Fc).astype(np.int32)), np.asfortranarray(Fc)
    )

    rows = []
    for f in range(frames):
        t = time.perf_counter()
        for _ in range(substeps):
            s0.clear_forces()
            pipeline.collide(s0, contacts)
            solver.step(s0, s1, control, contacts, h)
            s0, s1 = s1, s0
        wp.synchronize_device(device)
        wall = 1e3 * (time.perf_counter() - t)
        x = s0.particle_q.numpy().astype(np.float64)
        finite = bool(np.all(np.isfinite(x)))
        V = np.asfortranarray(np.concatenate([x, Vo]))
        inter = bool(ipctk.has_intersections(mesh, V)) if finite else None
        self_inter = bool(ipctk.has_intersections(cloth_mesh, np.asfortranarray(x))) if finite else None
        rows.append(
            {
                "frame": f,
                "wall_ms": wall,
                "intersecting": inter,
                "self_intersecting": self_inter,
                "ground_min_y": float(x[:, 1].min()) if finite else None,
                "sphere_min_distance": float(np.min(np.linalg.norm(x - np.array([0.0, 0.3, 0.0]), axis=1)) - 0.3)
                if finite
                else None,
            }
        )
        if not finite:
            break
    warm = rows[warmup:]
    # contact frames: a vertex within reach of the sphere or the ground
    reach = radius + opts["soft_gap"] + 1e-3
    contact = [
        r
        for r in warm
        if r["sphere_min_distance"] is not None and (r["sphere_min_distance"] < reach or r["ground_min_y"] < reach)
    ]
    return {
        "solver": "Newton SolverVBD",
        "newton": newton.__version__,
        "warp": wp.__version__,
        "device": device,
        "vertices": nc,
        "faces": int(len(Fc)),
        "substeps": substeps,
        "iterations_per_substep": opts["iterations"],
        "settings": opts,
        "frames": len(rows),
        "warmup_frames": warmup,
        "first_frame_ms": rows[0]["wall_ms"],
        "frame_ms_median": median([r["wall_ms"] for r in warm]),
        "frame_ms_max": float(max(r["wall_ms"] for r in warm)) if warm else None,
        "contact_frame_ms_median": median([r["wall_ms"] for r in contact]),
        "contact_frames": len(contact),
        "frames_intersecting": sum(1 for r in rows if r["intersecting"]),
        "frames_self_intersecting": sum(1 for r in rows if r["self_intersecting"]),
        "first_intersecting_frame": next((r["frame"] for r in rows if r["intersecting"]), None),
        "min_sphere_distance": min(
            (r["sphere_min_distance"] for r in rows if r["sphere_min_distance"] is not None),
            default=None,
        ),
        "min_ground_y": min((r["ground_min_y"] for r in rows if r["ground_min_y"] is not None), default=None),
        "all_finite": all(np.isfinite(r["wall_ms"]) and r["sphere_min_distance"] is not None for r in rows),
        "per_frame": rows,
    }


def run_peer(scene: dict, frames: int, warmup: int, opts: dict, timeout: float) -> dict:
    try:
        import newton  # noqa: F401
        import warp  # noqa: F401
    except Exception as e:
        return {"error": f"Newton not available ({type(e).__name__}: {e}); pip install newton"}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_peer_child, args=(scene, frames, warmup, opts, q))
    p.start()
    try:
        r = q.get(timeout=timeout)
    except Exception:
        r = {"error": f"Newton run gave no result within {timeout:.0f} s (exit code {p.exitcode})"}
    p.join(5)
    if p.is_alive():
        p.terminate()
    return r


# ------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="32x32 cloth, 25 frames")
    ap.add_argument("--cells", type=int, default=None, help="cloth cells per side (default 63: 64x64 vertices)")
    ap.add_argument("--frames", type=int, default=None, help="frames (default 40, quick 25; contact from ~17)")
    ap.add_argument("--arch", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--set", action="append", default=[], help="scene override for tisim")
    ap.add_argument("--no-peer", action="store_true", help="skip Newton")
    ap.add_argument("--peer-substeps", type=int, default=10, help="Newton substeps per 0.01 s frame")
    ap.add_argument("--peer-iterations", type=int, default=10, help="VBD iterations per substep")
    ap.add_argument("--peer-warmup", type=int, default=2, help="Newton frames not timed (Warp JIT)")
    ap.add_argument("--peer-radius", type=float, default=5e-3, help="Newton particle radius, m")
    ap.add_argument("--peer-timeout", type=float, default=1800.0)
    ap.add_argument("--json", type=Path, default=ROOT / "out" / "bench_cloth.json")
    args = ap.parse_args(argv)
    cells = args.cells or (31 if args.quick else 63)
    frames = args.frames or (25 if args.quick else 40)

    m = machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores, load average {m['load_average']}")
    tis, scene = bench_tisim(cells, frames, args.arch, args.set)
    print(
        f"tisim: {tis['vertices']} vertices, {tis['faces']} faces, {tis['obstacle_vertices']} obstacle vertices, "
        f"h = {tis['dt']} s, {tis['arch']}/{tis['precision']}, linear solver {tis['linear_solver']}, "
        f"first frame (compile) {tis['first_frame_ms'] / 1e3:.1f} s, first contact frame {tis['first_contact_frame']}"
    )

    opts = {
        "substeps": args.peer_substeps,
        "iterations": args.peer_iterations,
        "particle_radius": args.peer_radius,
        "self_margin": args.peer_radius,
        "self_gap": 0.5 * args.peer_radius,
        "soft_gap": 0.5 * args.peer_radius,
        "contact_ke": 1.0e3,
        "contact_kd": 1.0e-1,
        "tri_kd": 1.0e-2,
    }
    if args.no_peer:
        peer = {"error": "skipped (--no-peer)"}
    else:
        peer = run_peer(scene, frames, args.peer_warmup, opts, args.peer_timeout)

    def cell(v, spec, width):
        return format(v, spec).rjust(width) if v is not None else "-".rjust(width)

    print()
    print(
        f"{'solver':<22} {'verts':>6} {'ms/frame':>9} {'contact':>9} {'free':>9} "
        f"{'Newton it./substeps':>20} {'frames w/ intersection':>23}"
    )
    print(
        f"{'tisim (PN + C-IPC)':<22} {tis['vertices']:>6} {cell(tis['frame_ms_median'], '.0f', 9)} "
        f"{cell(tis['contact_frame_ms_median'], '.0f', 9)} {cell(tis['free_frame_ms_median'], '.0f', 9)} "
        f"{'it. ' + format(tis['iterations_median'], '.0f') + ' (max ' + str(tis['iterations_max']) + ')':>20} "
        f"{str(tis['frames_intersecting']) + ' / ' + str(tis['frames']):>23}"
    )
    if "error" in peer:
        print(f"{'Newton':<22} missing: {peer['error']}")
    else:
        print(
            f"{'Newton ' + peer['newton'] + ' VBD (cpu)':<22} {peer['vertices']:>6} "
            f"{cell(peer['frame_ms_median'], '.0f', 9)} {cell(peer['contact_frame_ms_median'], '.0f', 9)} "
            f"{'':>9} {str(peer['substeps']) + ' x ' + str(peer['iterations_per_substep']) + ' VBD it.':>20} "
            f"{str(peer['frames_intersecting']) + ' / ' + str(peer['frames']):>23}"
        )
        print(
            f"  Newton: first frame (Warp compile) {peer['first_frame_ms'] / 1e3:.1f} s, "
            f"self-intersecting frames {peer['frames_self_intersecting']}, first intersecting frame "
            f"{peer['first_intersecting_frame']}, closest vertex to the sphere {peer['min_sphere_distance']:+.4f} m, "
            f"lowest vertex y {peer['min_ground_y']:+.4f} m"
        )

    print()
    print(f"tisim phase split, median ms per frame ({tis['contact_frames']} contact frames):")
    print(f"{'frames':<10}" + "".join(f"{k:>12}" for k in PHASES) + f"{'wall':>10}")
    for label, key, wall in (
        ("all", "all", tis["frame_ms_median"]),
        ("contact", "contact", tis["contact_frame_ms_median"]),
        ("free-fall", "free", tis["free_frame_ms_median"]),
    ):
        ph = tis["phase_ms_median"][key]
        print(f"{label:<10}" + "".join(cell(ph[k], ".0f", 12) for k in PHASES) + cell(wall, ".0f", 10))
    mean = tis["phase_ms_mean"]
    tot = sum(v for v in mean.values() if v)
    if tot:
        print("share of the mean frame: " + ", ".join(f"{k} {100 * mean[k] / tot:.0f}%" for k in PHASES))
    per = tis.get("phase_ms_per_contact_iteration")
    if per:
        print(
            f"contact frames: {tis['iterations_contact_total']} Newton iterations "
            f"({tis['ccd_cut_iterations_contact_total']} of them cut short by CCD), "
            f"{tis['contact_ms_per_iteration']:.1f} ms each (" + ", ".join(f"{k} {per[k]:.1f}" for k in PHASES) + ")"
        )

    m["loadavg_end"] = load_average()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings.update(cells=cells, frames=frames)
    args.json.write_text(json.dumps({"machine": m, "settings": settings, "tisim": tis, "newton": peer}, indent=2))
    print(f"\nload average at the end {m['loadavg_end']}; wrote {args.json}")
    if cells == 63 and tis["frame_ms_median"] is not None:
        print(
            f"64x64 drape: {tis['frame_ms_median']:.0f} ms/frame median "
            f"(contact frames {cell(tis['contact_frame_ms_median'], '.0f', 0)}); target <= 500 ms on 2 cores"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
