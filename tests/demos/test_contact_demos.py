"""The frictional-contact demos of the PD solver: each runs headless and checks what it
is about (squeeze-ball, stick-slip, sharp-corner, grab)."""

from __future__ import annotations

import numpy as np
import pytest

from tisim.cli.app import demos_dir
from tisim.geometry.mesh import tet_signed_volumes
from tisim.model import Model
from tisim.scene import load_scene
from tisim.solvers.pd.solver import SolverPD

CONTACT_DEMOS = ["squeeze-ball", "stick-slip", "sharp-corner", "grab"]


def _setup(name, overrides=()):
    scene = load_scene(demos_dir() / f"{name}.toml", list(overrides))
    model = Model.from_scene(scene)
    solver = SolverPD(model, scene.solver)
    s0 = model.initial_state()
    return scene, model, solver, s0, s0.clone()


def _depth_inside(model, x, t):
    """(c,) deepest penetration of x (n, 3) into each collider at time t, m (>= 0)."""
    return np.array([max(0.0, -float(c.signed_distance(x, t)[0].min())) for c in model.colliders])


@pytest.mark.parametrize("name", CONTACT_DEMOS)
def test_contact_demo_uses_pd_with_contact(name):
    small = ["objects.ball.ball_resolution=8"] if name == "squeeze-ball" else []
    scene, model, solver, *_ = _setup(name, small)
    assert scene.solver.type == "pd" and scene.contact.enabled and scene.scene.description
    assert solver.contact is not None and len(model.colliders) >= 1


def test_squeeze_ball_passes_through_and_recovers():
    """The ball is drawn between the rollers, never sinks more than 1% of its radius into
    them, comes out below them and its volume returns within 2% of the rest volume.
    Run on a coarser ball (1,483 vertices) than the demo's 7,743 to keep the test short."""
    scene, model, solver, s0, s1 = _setup("squeeze-ball", ["objects.ball.ball_resolution=10"])
    R = scene.objects["ball"].radius
    tets = model.mesh.tets
    V0 = tet_signed_volumes(s0.positions, tets).sum()
    depth, ncontact, volumes, centre = [], [], [], []
    for _ in range(scene.sim.frames):
        st = solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
        assert s0.is_finite()
        depth.append(_depth_inside(model, s0.positions, s0.time).max())
        ncontact.append(st.n_contacts)
        volumes.append(tet_signed_volumes(s0.positions, tets).sum() / V0)
        centre.append(s0.positions.mean(axis=0))
    assert max(depth) < 0.01 * R, max(depth)
    touched = np.flatnonzero(np.asarray(ncontact) > 0)
    assert len(touched) > 30  # it was squeezed for a while, not bounced off
    assert min(volumes) < 0.98  # squeezed noticeably
    after = np.arange(touched[-1] + 1, len(volumes))
    assert len(after) >= 3
    assert abs(volumes[-1] - 1.0) < 0.02
    # the centre ends below the rollers' nip (the ball is 0.1 m in radius, rollers at y = 0)
    assert centre[-1][1] < -0.15
    assert abs(centre[-1][0]) < 0.01 and abs(centre[-1][2]) < 0.01  # symmetric


def test_stick_slip_demo_box_stays():
    """With mu = 0.1773 > tan(10 deg) the box's centre moves less than 1 mm (0.8 s here;
    the 2 s check and the sliding side are in tests/verification/test_contact.py)."""
    scene, _model, solver, s0, s1 = _setup("stick-slip")
    c0 = s0.positions.mean(axis=0)
    for _ in range(80):
        st = solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
    assert np.linalg.norm(s0.positions.mean(axis=0) - c0) < 1e-3
    assert np.abs(s0.velocities.mean(axis=0)).max() < 1e-6
    assert st.n_contacts == 25 and st.extra["ncp_residual"] < 1e-9


def test_sharp_corner_slab_goes_over_the_edge():
    scene, model, solver, s0, s1 = _setup("sharp-corner")
    table_top, edge = 0.0, 0.25
    lowest_while_held = np.inf
    deepest = 0.0
    for f in range(scene.sim.frames):
        solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
        assert s0.is_finite()
        deepest = max(deepest, _depth_inside(model, s0.positions, s0.time).max())
        if f == 55:
            lowest_while_held = s0.positions[:, 1].min()
    assert deepest < 1e-3  # 2% of the slab's thickness
    assert lowest_while_held < table_top - 0.1  # the front droops over the edge
    c = s0.positions.mean(axis=0)
    assert c[0] > edge and c[1] < table_top  # it has gone over the edge


@pytest.mark.slow
@pytest.mark.parametrize("mu, lifted", [(0.6, True), (0.05, False)])
def test_grab_lifts_by_friction(mu, lifted):
    """The keyframed fingers start clear of the cube (no initial overlap), close on it by
    0.3 s, hold, and lift from 0.4 s: with mu = 0.6 the cube's centre of mass rises with
    the fingers (within 1 mm: the squeezed cube sags a little), with mu = 0.05 it slips
    out and stays on the floor."""
    scene, model, solver, s0, s1 = _setup("grab", [f"contact.mu={mu}"])
    fingers = [c for c in model.colliders if c.name.endswith("finger")]
    assert np.all(_depth_inside(model, s0.positions, 0.0) == 0.0)
    y0 = s0.positions[:, 1].mean()
    rises = []
    for _ in range(90):  # to t = 0.9 s, halfway up the lift
        solver.step(s0, s1, scene.sim.dt)
        s0, s1 = s1, s0
        assert s0.is_finite()
        lift = fingers[0].center(s0.time)[1] - fingers[0].center(0.0)[1]
        rises.append((s0.time, lift, s0.positions[:, 1].mean() - y0))
    t, lift, rise = np.array(rises).T
    assert lift[-1] > 0.06  # the fingers have gone up 6 cm
    assert np.abs(rise[t <= 0.4]).max() < 1e-3  # resting on the floor while they close
    if lifted:
        assert np.abs(rise - lift).max() < 1e-3, np.abs(rise - lift).max()
        v_finger = fingers[0].linear_velocity(s0.time)[1]
        assert s0.velocities[:, 1].mean() == pytest.approx(v_finger, abs=5e-3)
    else:
        assert abs(rise[-1]) < 5e-3
