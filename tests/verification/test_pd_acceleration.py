"""Anderson acceleration of the local-global iteration (solver.acceleration = "anderson").

Checked against the plain iteration and against the incremental potential computed
independently on the host (``SolverPD.incremental_potential``, numpy), on a small
Neo-Hookean twisting bar (81 vertices)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tisim.cli.app import demos_dir
from tisim.config import ConfigError
from tisim.model import Model
from tisim.scene import load_scene
from tisim.solvers.pd.solver import SolverPD


def small_bar(*sets, angular_velocity=6.283185307179586):
    base = [
        "objects.bar.resolution=[8,2,2]",
        "objects.bar.youngs_modulus=1e6",
        "objects.bar.poisson_ratio=0.4",
        "sim.gravity=[0.0, 0.0, 0.0]",
        f"objects.bar.handles.twist.angular_velocity=[{angular_velocity!r}, 0.0, 0.0]",
        'solver.acceleration="none"',  # the plain iteration unless a test asks for another
    ]
    scene = load_scene(demos_dir() / "twisting-bar-neohookean.toml", base + list(sets))
    model = Model.from_scene(scene)
    return model, SolverPD(model, scene.solver), scene.sim.dt


def twisted_state(steps=8, *sets):
    """A twisted, moving bar: the state after ``steps`` steps of 5 plain iterations."""
    model, solver, dt = small_bar("solver.iterations=5", *sets)
    a = model.initial_state()
    b = a.clone()
    for _ in range(steps):
        solver.step(a, b, dt)
        a, b = b, a
    return a


def test_accelerated_solve_reaches_the_plain_answer_in_fewer_iterations():
    """Both iterations are stopped at a relative residual of 1e-8 (at most 400 iterations);
    the answers then agree to 1e-6 of the step's displacement (measured 5e-9: both are
    within the tolerance of the same minimiser of the incremental potential), and
    Anderson needs fewer than half the plain iterations (measured 31 vs 163; 75 vs 983
    at E = 1e6). E = 1e5 Pa here so that the plain iteration converges in a test's time."""
    E = "objects.bar.youngs_modulus=1e5"
    state = twisted_state(8, E)
    out = {}
    for accel in ("none", "anderson"):
        _, solver, dt = small_bar("solver.iterations=400", "solver.tolerance=1e-8", f'solver.acceleration="{accel}"', E)
        b = state.clone()
        st = solver.step(state, b, dt)
        assert st.converged, (accel, st)
        out[accel] = (b.positions.copy(), st.iterations)
    (x_plain, n_plain), (x_aa, n_aa) = out["none"], out["anderson"]
    step = np.linalg.norm(x_plain - state.positions)
    assert step > 1e-3  # the step moves the bar (the check is not about a bar at rest)
    assert np.linalg.norm(x_aa - x_plain) < 1e-6 * step
    assert n_aa < n_plain / 2, (n_aa, n_plain)


def _accepted_energies(solver, state, dt):
    """Run one step; return the host (numpy) incremental potential of every iterate the
    safeguard accepted (the iterate whose local step feeds each global step)."""
    acc = solver._anderson
    energies = []
    original = acc.safeguard

    def record(kernels, evaluate):
        rsq = original(kernels, evaluate)
        x = np.zeros((solver.vertex_count, 3))
        kernels.read_x(x)
        energies.append(solver.incremental_potential(x))
        return rsq

    acc.safeguard = record
    b = state.clone()
    st = solver.step(state, b, dt)
    acc.safeguard = original
    return np.asarray(energies), st


def test_safeguard_never_lets_the_energy_increase():
    """With quasi-Newton weights at 0.3 of the default, the plain step overshoots the
    volume modes ((4 mu + 3 lam) / w = 4.8 > 2: the plain iteration raises the energy and
    diverges); with Anderson the safeguard rejects the extrapolations and halves the plain
    steps that would raise it, so the incremental potential (evaluated independently in
    numpy) never increases from one accepted iterate to the next (beyond round-off,
    1e-12 of the energy)."""
    state = twisted_state()
    _, solver, dt = small_bar("solver.iterations=30", "solver.weight_scale=0.3", 'solver.acceleration="anderson"')
    E, st = _accepted_energies(solver, state, dt)
    assert len(E) == 30
    assert st.extra["anderson_backtracks"] + st.extra["anderson_rejected"] > 0  # it acted
    assert np.all(np.diff(E) <= 1e-12 * np.abs(E[:-1])), np.diff(E)
    assert E[-1] < E[0]
    # the same step without the safeguard: the energy goes up (the check is not vacuous)
    _, plain, _ = small_bar("solver.iterations=30", "solver.weight_scale=0.3")
    energies = []
    plain.iteration_callback = lambda k, x: energies.append(plain.incremental_potential(x))
    plain.step(state, state.clone(), dt)
    assert np.any(np.diff(energies) > 1e-6 * abs(energies[0]))


def test_fused_energy_matches_the_host_incremental_potential():
    """PDKernels.iterate_energy's E equals SolverPD.incremental_potential (numpy) up to the
    held vertices' inertia term, which the kernel omits (a constant within a step)."""
    state = twisted_state(4)
    model, solver, dt = small_bar("solver.iterations=3", 'solver.acceleration="anderson"')
    solver.step(state, state.clone(), dt)
    k = solver.kernels
    x = np.zeros((solver.vertex_count, 3))
    k.read_x(x)
    held = solver._held_idx
    assert held.size > 0
    gidx, gout = solver.global_step.gather_target(k)
    _, E = k.iterate_energy(1, solver._A_dev, dt * dt, -1, 0.0, [0.0, 0.0, 0.0], gidx, gout)
    d = x[held] - solver._x_tilde[held]
    mass_c = model.mass[held] * (1.0 + solver._damping * dt)
    held_inertia = 0.5 / dt**2 * float(mass_c @ np.einsum("ij,ij->i", d, d))
    assert E > 0
    assert E + held_inertia == pytest.approx(solver.incremental_potential(x), rel=1e-10)


def test_bar_at_rest_stays_at_rest_with_acceleration():
    """No gravity, handles not moving: the rest shape is the minimiser of every step's
    incremental potential, so the accelerated iteration must leave it exactly (no
    extrapolation of round-off into motion): positions within 1e-12 m, velocities 0."""
    model, solver, dt = small_bar("solver.iterations=8", 'solver.acceleration="anderson"', angular_velocity=0.0)
    a = model.initial_state()
    b = a.clone()
    for _ in range(5):
        st = solver.step(a, b, dt)
        a, b = b, a
        assert np.all(np.isfinite(a.positions)), st
    assert np.abs(a.positions - model.initial_positions).max() < 1e-12
    assert np.abs(a.velocities).max() < 1e-10


def test_auto_picks_anderson_for_neo_hookean_without_contact_only():
    """The default, acceleration = "auto": Anderson for the Neo-Hookean bar on the CPU in
    f64 (the timed case), the plain iteration for ARAP and for a scene with contact; the
    choice and its reason are in the solver's info (run.json). The auto run is the
    explicit Anderson run, bit for bit."""
    from tisim import backend

    if backend.current().precision != "f64":
        pytest.skip("auto uses Anderson in f64 only")
    runs = {}
    for accel in ("auto", "anderson"):
        model, solver, dt = small_bar("solver.iterations=6", f'solver.acceleration="{accel}"')
        info = solver.info()
        assert info["acceleration"] == "anderson" and info["acceleration_requested"] == accel
        a = model.initial_state()
        b = a.clone()
        for _ in range(3):
            solver.step(a, b, dt)
            a, b = b, a
        runs[accel] = a.positions.copy()
    assert np.array_equal(runs["auto"], runs["anderson"])
    _, arap, _ = small_bar('solver.acceleration="auto"', 'objects.bar.material="arap"')
    assert arap.info()["acceleration"] == "none" and arap._anderson is None
    scene = load_scene(demos_dir() / "squeeze-ball.toml", ["objects.ball.ball_resolution=4"])
    assert scene.solver.acceleration == "auto"
    info = SolverPD(Model.from_scene(scene), scene.solver).info()
    assert info["acceleration"] == "none" and "contact" in info["acceleration_reason"]


def test_acceleration_keys_are_validated():
    with pytest.raises(ConfigError, match=r"solver.acceleration"):
        load_scene(demos_dir() / "twisting-bar-neohookean.toml", ['solver.acceleration="fast"'])
    with pytest.raises(ConfigError, match=r"solver.anderson_window"):
        load_scene(demos_dir() / "twisting-bar-neohookean.toml", ["solver.anderson_window=0"])


@pytest.mark.slow  # 19 s with a cold Taichi cache (compiling the contact path), 1 s warm
def test_contact_steps_run_without_acceleration():
    """While contacts are active the contact update moves the iterate and its forces are
    not in the energy the safeguard compares: such steps run the plain iteration (no
    extrapolation, no safeguard work), the steps before the first contact are accelerated,
    and the squeeze runs through with the rollers' contacts resolved."""
    scene = load_scene(
        demos_dir() / "squeeze-ball.toml",
        [
            "objects.ball.ball_resolution=6",
            "objects.ball.translation=[0.0, 0.22, 0.0]",
            "objects.ball.velocity=[0.0, -2.0, 0.0]",
            'solver.acceleration="anderson"',
        ],
    )
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    a = model.initial_state()
    b = a.clone()
    free, touching = [], []
    for _ in range(6):
        accelerated = []
        original = solver._anderson.safeguard
        solver._anderson.safeguard = lambda k, ev: (accelerated.append(1), original(k, ev))[1]
        st = solver.step(a, b, scene.sim.dt)
        solver._anderson.safeguard = original
        a, b = b, a
        assert np.all(np.isfinite(a.positions)), st
        (touching if st.n_contacts > 0 else free).append(len(accelerated))
        if st.n_contacts > 0:
            assert st.extra["anderson_extrapolated"] == 0
    assert free and touching, (free, touching)
    assert all(n == scene.solver.iterations for n in free)
    assert all(n == 0 for n in touching)
    assert st.max_penetration < 1e-3


def _host_anderson_step(solver, iterations, window):
    """Reference: the same type-II Anderson iteration in numpy (no safeguard), with the map
    G(x) = x - h^2 A_ff^-1 grad E(x) built from the host's incremental gradient
    (``SolverPD.incremental_gradient``, numpy) and a sparse LU of the global matrix."""
    import scipy.sparse.linalg as spla

    h = solver._h
    free = np.ones(solver.vertex_count, dtype=bool)
    free[solver._held_idx] = False
    lu = spla.splu(solver.A[free][:, free].tocsc())

    def G(x):
        y = x.copy()
        y[free] -= h * h * lu.solve(solver.incremental_gradient(x)[free])
        return y

    x = solver._x0.copy()  # the step's initial guess: x_tilde, held vertices at their targets
    fs, gs = [], []
    for k in range(iterations):
        gx = G(x)
        if k == iterations - 1:
            return gx
        fs.append(gx - x)
        gs.append(gx)
        fs, gs = fs[-(window + 1) :], gs[-(window + 1) :]
        x = gx
        if len(fs) >= 2:
            dF = np.stack([(b - a).ravel() for a, b in itertools.pairwise(fs)], axis=1)
            dG = np.stack([(b - a).ravel() for a, b in itertools.pairwise(gs)], axis=1)
            gram = dF.T @ dF  # the normal equations, regularised like the solver's
            gram += 1e-10 * np.trace(gram) / len(gram) * np.eye(len(gram))
            theta = np.linalg.solve(gram, dF.T @ fs[-1].ravel())
            x = gx - (dG @ theta).reshape(x.shape)
    return x


@pytest.mark.parametrize("window", [2, 5])
def test_device_anderson_matches_a_host_implementation(window):
    """The device iteration (history recorded in the local step's launch, dot products
    summed per chunk, the normal equations solved by a serial Cholesky on the device)
    against an independent numpy Anderson iteration of the same map from the same initial
    guess: 7 iterations, so that the history fills (5 columns) and, with window 2, wraps
    around the ring buffer. The reference solves the same Tikhonov-regularised normal
    equations (1e-10 of their mean diagonal; without it the two differ by 1e-8 with 5
    ill-conditioned columns). Measured: agreement to 2e-13 (window 2) and 3e-12 (window
    5) of the step's displacement; tolerance 1e-9 (round-off amplified by the normal
    equations' conditioning). The plain iteration's answer differs by 35-48% of the step
    (checked), so a device that skipped or garbled the extrapolation would fail."""
    state = twisted_state(6)
    iterations = 7
    _, solver, dt = small_bar(
        f"solver.iterations={iterations}",
        'solver.acceleration="anderson"',
        f"solver.anderson_window={window}",
    )
    b = state.clone()
    st = solver.step(state, b, dt)
    assert st.extra["anderson_rejected"] == 0 and st.extra["anderson_backtracks"] == 0
    assert st.extra["anderson_extrapolated"] == iterations - 2
    x_host = _host_anderson_step(solver, iterations, window)
    step = np.linalg.norm(x_host - state.positions)
    assert step > 1e-3
    assert np.linalg.norm(b.positions - x_host) < 1e-9 * step, np.linalg.norm(b.positions - x_host)
    _, plain, _ = small_bar(f"solver.iterations={iterations}")
    c = state.clone()
    plain.step(state, c, dt)
    assert np.linalg.norm(c.positions - x_host) > 0.1 * step
