"""Short scenes run on one Taichi backend and summarised per frame, for comparing
backends (tests/backends/test_backends.py).

Every function builds the scene on the backend that is initialised when it is called
and returns numpy data only, so the caller may tear Taichi down afterwards.
"""

from __future__ import annotations

import math

import numpy as np

# Ball placed 2 mm above its first touch of the rollers (centre height 0.1497 m) and
# coarse (387 vertices): 16 contacts in the first frame, 38 in the eighth.
SQUEEZE_BALL = [
    "objects.ball.ball_resolution=6",
    "objects.ball.translation=[0.0, 0.152, 0.0]",
    'solver.global_step="sparse-inverse"',
]
TWISTING_BAR = ["objects.bar.resolution=[12, 3, 3]", 'solver.global_step="sparse-inverse"']
STICK_SLIP_ANGLE = 10.0
STICK_SLIP_MARGIN = 0.003  # mu = tan(angle) +- this


def _solver(name: str, overrides: list[str]):
    from tisim.cli.app import demos_dir
    from tisim.model import Model
    from tisim.scene import load_scene
    from tisim.solvers.pd.solver import SolverPD

    scene = load_scene(demos_dir() / f"{name}.toml", overrides)
    model = Model.from_scene(scene)
    return scene, model, SolverPD(model, scene.solver)


def _run(name: str, overrides: list[str], frames: int) -> dict:
    from tisim.geometry.precompute import deformation_gradients

    scene, model, solver = _solver(name, overrides)
    s0 = model.initial_state()
    s1 = s0.clone()
    out = {"positions": [], "det_f": [], "penetration": [], "contacts": [], "speed": []}
    for _ in range(frames):
        st = solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
        x = np.array(s0.positions, dtype=np.float64)
        F = deformation_gradients(x, model.mesh.tets, model.rest.Dm_inv)
        depth = [max(0.0, -float(c.signed_distance(x, s0.time)[0].min())) for c in model.colliders]
        out["positions"].append(x)
        out["det_f"].append(float(np.linalg.det(F).min()))
        out["penetration"].append(max(depth, default=0.0))
        out["contacts"].append(int(st.n_contacts))
        out["speed"].append(float(np.linalg.norm(np.asarray(s0.velocities).mean(axis=0))))
    return {k: np.asarray(v) for k, v in out.items()}


def free_fall(frames: int = 6, resolution: float = 8.0) -> dict:
    """The squeeze-ball's ball (1,009 vertices at resolution 8, E = 2e5 Pa) in its first
    frames, before it reaches the rollers: the change of its centre-of-mass velocity per
    step divided by g h (1 for implicit Euler in free fall, whatever the elastic state)."""
    scene, model, solver = _solver("squeeze-ball", [f"objects.ball.ball_resolution={resolution!r}"])
    s0 = model.initial_state()
    s1 = s0.clone()
    m = np.asarray(model.mass, dtype=np.float64)
    v = [float(m @ np.asarray(s0.velocities, dtype=np.float64)[:, 1]) / m.sum()]
    contacts = []
    for _ in range(frames):
        st = solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
        v.append(float(m @ np.asarray(s0.velocities, dtype=np.float64)[:, 1]) / m.sum())
        contacts.append(int(st.n_contacts))
    g_h = float(model.gravity[1]) * scene.sim.dt
    return {"ratio": np.diff(v) / g_h, "contacts": np.asarray(contacts)}


def squeeze_ball(frames: int = 8) -> dict:
    return _run("squeeze-ball", SQUEEZE_BALL, frames)


def twisting_bar(frames: int = 5) -> dict:
    return _run("twisting-bar", TWISTING_BAR, frames)


def squeeze_ball_device(frames: int = 3) -> dict:
    """The squeeze-ball with its contact update in Taichi kernels (contact.implementation
    "auto" keeps numpy on Vulkan, so the kernels are asked for here)."""
    return _run("squeeze-ball", [*SQUEEZE_BALL, 'contact.implementation="device"'], frames)


def twisting_bar_anderson(frames: int = 5) -> dict:
    """The twisting bar with Anderson-accelerated local-global iterations."""
    return _run("twisting-bar", [*TWISTING_BAR, 'solver.acceleration="anderson"'], frames)


def stick_slip(frames: int = 25, window: int = 10) -> dict:
    """Mean centre-of-mass speed (m/s) over the last ``window`` of ``frames`` steps at
    mu = tan(10 deg) -/+ 0.003: {"slide": below the threshold, "stick": above it,
    "coulomb": the speed Coulomb's law gives the sliding box in the middle of that window}.
    Coulomb's law: the box accelerates at g (sin - mu cos) = 0.029 m/s^2 below the
    threshold and stays put above it. A mean over a window, not the last frame's speed:
    in f32 a sticking box jitters at 1e-5 to 5e-4 m/s from frame to frame (measured on
    the CPU backend and on Vulkan), so one frame's speed is no verdict."""
    angle = math.radians(STICK_SLIP_ANGLE)
    mu_star = math.tan(angle)
    res = {}
    for key, mu in (("slide", mu_star - STICK_SLIP_MARGIN), ("stick", mu_star + STICK_SLIP_MARGIN)):
        r = _run(
            "stick-slip",
            [f"colliders.incline.rotation=[0.0, 0.0, {STICK_SLIP_ANGLE!r}]", f"contact.mu={mu!r}"],
            frames,
        )
        com = r["positions"].mean(axis=1)
        dt = 0.01  # the stick-slip demo's step
        res[key] = float(np.linalg.norm(com[-1] - com[-1 - window])) / (window * dt)
    g = 9.81 * (math.sin(angle) - (mu_star - STICK_SLIP_MARGIN) * math.cos(angle))
    res["coulomb"] = g * (frames - window / 2) * 0.01
    return res


# refine-drape's sheet, 6 x 6 vertices, placed 5 mm above the sphere's top: the barrier
# acts from the second frame, the sheet folds over the sphere in the next ones
CLOTH_DRAPE = [
    "objects.cloth.cloth_resolution=[5, 5]",
    "objects.cloth.translation=[0.15, 0.605, 0.0]",
]


def cloth_drape(frames: int = 4) -> dict:
    """The cloth solver (C-IPC barrier, CCD, friction, strain limit) per frame: cloth
    positions, smallest primitive distance minus the thickness, contacts, Newton iterations.
    Two frames of free fall, then the impact (17 Newton iterations) and the frame after it
    (10): every contact kernel runs. On lavapipe a launch of a contact kernel costs 3-180 ms
    (most 10-60 ms) even for one pair (a loop whose end is known only at run time is dispatched as 65,536
    invocations on SPIR-V, and lavapipe pays for each), so each later frame cost 2-5 s: the
    test took 50 s with six frames, 41.5 s with four."""
    from tisim import backend
    from tisim.cli.app import demos_dir
    from tisim.runner import build
    from tisim.scene import load_scene

    scene = load_scene(demos_dir() / "refine-drape.toml", CLOTH_DRAPE)
    _info, model, solver = build(scene, backend.current().arch, backend.current().precision)
    s0 = model.initial_state()
    s1 = s0.clone()
    out = {"positions": [], "min_distance": [], "contacts": [], "iterations": []}
    for _ in range(frames):
        st = solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
        out["positions"].append(np.array(s0.positions, dtype=np.float64))
        out["min_distance"].append(float(st.extra["min_distance"]))
        out["contacts"].append(int(st.n_contacts))
        out["iterations"].append(int(st.iterations))
    return {k: np.asarray(v) for k, v in out.items()}


SPINNING_BAR = ["objects.bar.resolution=[8, 2, 2]"]


def spinning_bar_admm(frames: int = 4) -> dict:
    """The conservative integrator (ADMM on the variational midpoint rule, log Neo-Hookean
    proximal steps) on a coarse spinning bar: positions, and the linear and angular
    momentum (exact in the method) per frame."""
    from tisim import backend
    from tisim.cli.app import demos_dir
    from tisim.runner import build
    from tisim.scene import load_scene

    scene = load_scene(demos_dir() / "spinning-bar.toml", SPINNING_BAR)
    _info, model, solver = build(scene, backend.current().arch, backend.current().precision)
    s0 = model.initial_state()
    s1 = s0.clone()
    m = np.asarray(model.mass, dtype=np.float64)[:, None]
    out = {"positions": [], "momentum": [], "angular_momentum": []}
    for _ in range(frames):
        solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
        x = np.array(s0.positions, dtype=np.float64)
        v = np.array(s0.velocities, dtype=np.float64)
        out["positions"].append(x)
        out["momentum"].append((m * v).sum(axis=0))
        out["angular_momentum"].append(np.cross(x, m * v).sum(axis=0))
    return {k: np.asarray(v) for k, v in out.items()}
