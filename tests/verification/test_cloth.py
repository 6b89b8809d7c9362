"""Cloth solver against things that are true: free fall, static equilibrium, the
stick-slip threshold on an incline, dissipation, and no intersection ever (checked
independently by the IPC Toolkit, ``ipctk``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tisim.geometry.cloth import save_cloth_obj
from tisim.geometry.generate import cloth_disc, cloth_rectangle
from tisim.linalg import pardiso
from tisim.model import Model
from tisim.scene import scene_from_dict
from tisim.solvers.cloth.solver import SolverCloth
from tisim.testing import ipc_report

G = 9.81


def _cloth(**kw):
    o = {
        "kind": "cloth",
        "generator": "cloth",
        "cloth_size": [0.2, 0.2],
        "cloth_resolution": [4, 4],
        "youngs_modulus": 1e5,
        "poisson_ratio": 0.3,
        "thickness": 1e-3,
        "density": 200.0,
    }
    o.update(kw)
    return o


def _build(objects, colliders=None, *, contact=None, solver=None, sim=None, path=None):
    data = {
        "solver": {"type": "cloth", **(solver or {})},
        "objects": objects,
        "colliders": colliders or {},
        "contact": contact or {},
        "sim": sim or {"dt": 0.01},
    }
    sc = scene_from_dict(data, path)
    model = Model.from_scene(sc)
    return sc, model, SolverCloth(model, sc.solver)


def _run(model, solver, steps, dt, check=None):
    st, spare = model.initial_state(), model.initial_state()
    for k in range(steps):
        prev = st.clone()
        solver.step(st, spare, dt)
        st, spare = spare, st
        assert st.is_finite(), f"NaN at step {k + 1}"
        if check is not None:
            check(k + 1, prev, st)
    return st


def _ipc_check(solver, tol_distance):
    """A check that asserts ipctk's verdict on every step (no intersection, distance above
    the thickness, collision-free linear step from the previous state)."""

    def check(k, prev, st):
        V, F, planes = solver.collision_state(st)
        P, _, _ = solver.collision_state(prev)
        r = ipc_report(
            V, F, P, planes=planes, plane_rows=solver.nc, edges=solver.edges_all, colliders=solver.analytic_colliders
        )
        assert not r.intersecting, f"step {k}: ipctk finds an intersection"
        assert r.step_free, f"step {k}: the step from the previous state is not collision-free"
        assert r.min_distance > tol_distance, f"step {k}: distance {r.min_distance} below the thickness"
        assert r.plane_distance > tol_distance, f"step {k}: plane distance {r.plane_distance}"

    return check


def test_ipc_report_distance_is_unsquared():
    # a point 0.3 m above a triangle: the oracle must report 0.3, not 0.09
    V = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0.2, 0.2, 0.3], [1.2, 0.2, 0.3], [0.2, 1.2, 0.3]], float)
    F = np.array([[0, 1, 2], [3, 4, 5]])
    r = ipc_report(V, F, probe=1.0)
    assert r.min_distance == pytest.approx(0.3, rel=1e-9)
    assert not r.intersecting


def test_free_fall_is_implicit_euler():
    """Without contact a flat sheet translating rigidly has no elastic force: one implicit
    Euler step from rest gives x1 = x0 + h^2 g and v1 = h g exactly (to the Newton
    tolerance)."""
    _sc, model, solver = _build({"c": _cloth(translation=[0, 1, 0])})
    h = 0.01
    st = _run(model, solver, 1, h)
    cs = model.cloth.vertex_slice
    assert np.allclose(st.velocities[cs], [0, -G * h, 0], atol=1e-9)
    assert np.allclose(st.positions[cs] - model.initial_positions[cs], [0, -G * h * h, 0], atol=1e-11)


def test_hanging_cloth_at_rest_stays_at_rest():
    """A cloth pinned along its top edge, brought to static equilibrium, then stepped from
    rest: velocities stay at round-off level and the membrane strain below the limit."""
    sc, model, solver = _build(
        {
            "c": _cloth(
                cloth_normal="z", cloth_size=[0.2, 0.2], cloth_resolution=[3, 3], pin="top-edge", translation=[0, 1, 0]
            )
        }
    )
    cs = model.cloth.vertex_slice
    x = model.initial_positions[cs].copy()
    idx, tgt = solver._held(0.0)
    for _ in range(6):  # static solves: x_hat = x and a long step make inertia negligible
        res = solver.solve(x, x, 10.0, held=(idx, tgt), tolerance=1e-12, max_iterations=200)
        moved = np.abs(res.x - x).max()
        x = res.x
        if moved < 1e-12:
            break
    assert moved < 1e-11
    res = solver.solve(x, x.copy(), 0.01, held=(idx, tgt), tolerance=1e-10, max_iterations=200)
    v = (res.x - x) / 0.01
    assert np.abs(v).max() < 1e-9
    assert res.max_strain < sc.solver.strain_limit
    # not trivially at rest: the sheet sags under its weight
    assert x[:, 1].min() < model.initial_positions[cs][:, 1].min() - 1e-6


def _incline(mu, angle_deg, steps, dt=0.01):
    th = math.radians(angle_deg)
    n = np.array([-math.sin(th), math.cos(th), 0.0])
    dhat, xi = 1e-3, 1e-3
    _sc, model, solver = _build(
        {
            "c": _cloth(
                cloth_size=[0.1, 0.1],
                cloth_resolution=[2, 2],
                youngs_modulus=1e6,
                frame="incline",
                translation=[0, xi + 0.5 * dhat, 0],
            )
        },
        {"incline": {"type": "plane", "normal": [0.0, 1.0, 0.0], "rotation": [0, 0, angle_deg]}},
        contact={"mu": mu, "dhat": dhat, "thickness": xi, "eps_v": 1e-4, "friction_iterations": 2},
        solver={"tolerance": 1e-6},
    )
    slope = np.array([-math.cos(th), -math.sin(th), 0.0])  # downhill
    cs = model.cloth.vertex_slice
    st, spare = model.initial_state(), model.initial_state()
    com, vel = [], []
    m = model.mass[cs]
    for _ in range(steps):
        solver.step(st, spare, dt)
        st, spare = spare, st
        com.append((m[:, None] * st.positions[cs]).sum(0) / m.sum() @ slope)
        vel.append((m[:, None] * st.velocities[cs]).sum(0) / m.sum() @ slope)
    assert np.allclose(st.positions[cs] @ n, (st.positions[cs] @ n).mean(), atol=1e-4)  # lies flat
    return np.array(com), np.array(vel), th


@pytest.mark.parametrize("angle", [10.0, 20.0])
def test_incline_sticks_above_the_threshold(angle):
    """mu >= tan(angle) + 0.01: static friction holds; once the contact force has built up
    (the sheet starts 0.5 dhat above its barrier equilibrium), the sheet creeps no more than
    the smoothing velocity eps_v times the time (IPC's friction is exact beyond eps_v only)."""
    com, vel, _th = _incline(math.tan(math.radians(angle)) + 0.01, angle, 40)
    creep = com[-1] - com[20]
    assert creep <= 1e-4 * 0.01 * 20, creep
    assert abs(vel[-1]) <= 1e-4
    assert com[-1] - com[0] < 2e-3  # the settling slip is small too


@pytest.mark.parametrize("angle", [10.0, 20.0])
def test_incline_slides_below_the_threshold_at_the_coulomb_rate(angle):
    """mu <= tan(angle) - 0.01: the sheet slides with a = g (sin - mu cos), within 5%."""
    mu = math.tan(math.radians(angle)) - 0.01
    _com, vel, th = _incline(mu, angle, 40)
    a = np.polyfit(np.arange(len(vel))[10:] * 0.01, vel[10:], 1)[0]
    expect = G * (math.sin(th) - mu * math.cos(th))
    assert a == pytest.approx(expect, rel=0.05)


def _impact(ratio, steps, folder):
    """A light sheet thrown at 4 m/s onto a tessellated sphere (a mesh collider: the
    barrier over point-triangle and edge-edge pairs, whose stiffness this is about; a
    sphere collider is analytic): the barrier stiffness must double at impact. Returns
    (kappa / IPC's minimum, gaps per step, iterations)."""
    from tisim.geometry.generate import icosphere

    ico = icosphere(4)
    V = 0.1 * ico.vertices / np.linalg.norm(ico.vertices, axis=1, keepdims=True)
    path = folder / "ball.obj"
    path.write_text(
        "".join(f"v {a:.17g} {b:.17g} {c:.17g}\n" for a, b, c in V)
        + "".join(f"f {i + 1} {j + 1} {k + 1}\n" for i, j, k in ico.faces)
    )
    _sc, model, solver = _build(
        {
            "c": _cloth(
                cloth_size=[0.3, 0.3], cloth_resolution=[8, 8], translation=[0.0, 0.106, 0.0], velocity=[0.0, -4.0, 0.0]
            )
        },
        {"ball": {"type": "mesh", "mesh": str(path)}},
        contact={"mu": 0.0, "kappa_max_ratio": ratio},
    )
    st, spare = model.initial_state(), model.initial_state()
    gaps, its = [], []
    for _ in range(steps):
        s = solver.step(st, spare, 0.01)
        st, spare = spare, st
        assert st.is_finite()
        gaps.append(s.extra["min_distance"])
        its.append(s.iterations)
    return solver.kappa / (solver.kappa_max / ratio), np.array(gaps), its


def test_barrier_stiffness_may_double_past_ipcs_cap_at_impact(tmp_path):
    """IPC caps the adapted stiffness at 100x its minimum. A light cloth meets that cap at
    impact and its gaps collapse to 1e-11..1e-8 m (the digits depend on the CPU: every
    step stops at the iteration limit, so round-off is not averaged away), where every
    sliding Newton step is cut by CCD to a few percent (50 iterations, the limit). With
    the doubling allowed further (contact.kappa_max_ratio) the gaps stay a sizeable fraction of dhat = 1 mm and Newton
    converges in fewer iterations; the start stays in IPC's range either way."""
    k_ipc, gaps_ipc, its_ipc = _impact(100.0, 4, tmp_path)
    k, gaps, its = _impact(1e4, 4, tmp_path)
    assert k_ipc == pytest.approx(100.0)  # IPC's cap binds
    assert gaps_ipc.max() < 1e-3 * 1e-3  # below a thousandth of dhat (seen: 1.5e-8 on a Xeon)
    assert 100.0 < k <= 1e4 * (1 + 1e-12)
    assert gaps[1:].min() > 1e-5  # after the impact step
    assert sum(its) < sum(its_ipc)


def test_energy_never_increases_without_external_work():
    """Implicit Euler dissipates: a pinned sheet swinging under gravity (no wind, no
    friction) never gains total energy (kinetic + elastic + gravity) over a step."""
    _sc, model, solver = _build(
        {"c": _cloth(cloth_size=[0.3, 0.2], cloth_resolution=[6, 4], pin="x-min", translation=[0, 1, 0])}
    )
    energies = []

    def check(k, prev, st):
        ke = 0.5 * float((model.mass * (st.velocities**2).sum(1)).sum())
        energies.append(ke + solver.potential_energy(st.positions))

    _run(model, solver, 25, 0.01, check)
    e = np.array(energies)
    assert e[0] > e[-1] + 1e-4  # it does swing down and lose energy
    assert np.all(np.diff(e) <= 1e-9 * np.abs(e).max()), np.diff(e).max()


@pytest.mark.slow
def test_unseen_irregular_mesh_draped_on_a_sphere_never_intersects(tmp_path):
    """An irregular disc mesh (from a file) falls on a sphere and the ground: ipctk finds
    no intersection and no distance below the thickness on any step, and every step is
    collision-free by its tight-inclusion CCD."""
    disc = cloth_disc(radius=0.15, target_edge=0.03, seed=7)
    f = tmp_path / "disc.obj"
    save_cloth_obj(f, disc.vertices, disc)
    _sc, model, solver = _build(
        {
            "disc": {
                "kind": "cloth",
                "mesh": str(f),
                "translation": [0.05, 0.125, 0.0],
                "youngs_modulus": 1e5,
                "thickness": 1e-3,
                "density": 200.0,
            }
        },
        {"ball": {"type": "sphere", "position": [0, 0.06, 0], "radius": 0.06}, "ground": {"type": "plane"}},
        contact={"mu": 0.2},
    )
    assert model.cloth.vertex_count > 60
    st = _run(model, solver, 12, 0.01, _ipc_check(solver, 1e-3))
    # it did reach the sphere (top at y = 0.12) and drapes over it
    x = st.positions[model.cloth.vertex_slice]
    assert x[:, 1].min() < 0.11
    assert np.linalg.norm(x - [0, 0.06, 0], axis=1).min() < 0.06 + 3e-3


def _bowtie_obj(path, n=4, size=0.1):
    """Two n x n sheets, lying flat, touching at one corner only (a bow-tie vertex: no edge
    in common); written as a plain OBJ. Returns (path, the shared vertex, sheet A's vertex
    count)."""
    m = cloth_rectangle(size=(size, size), resolution=(n, n))
    v = m.vertices
    a = v - [v[:, 0].max(), 0.0, v[:, 2].max()]  # A's corner at the origin, the sheet at x, z < 0
    b = v - [v[:, 0].min(), 0.0, v[:, 2].min()]  # B's at the origin, at x, z > 0
    ka, kb = int(np.argmin(np.linalg.norm(a, axis=1))), int(np.argmin(np.linalg.norm(b, axis=1)))
    keep = np.arange(len(b)) != kb
    to = np.where(keep, np.cumsum(keep) - 1 + len(a), ka)  # B's vertices after A's, its corner is A's
    x, f = np.concatenate([a, b[keep]]), np.concatenate([m.faces, to[m.faces]])
    path.write_text(
        "".join(f"v {p[0]:.17g} {p[1]:.17g} {p[2]:.17g}\n" for p in x)
        + "".join(f"f {t[0] + 1} {t[1] + 1} {t[2] + 1}\n" for t in f)
    )
    return path, ka, len(a)


def test_bowtie_flaps_pinned_at_their_shared_vertex_swing_together_without_intersecting(tmp_path, caplog):
    """A cloth mesh file with a non-manifold (bow-tie) vertex is accepted with a warning:
    two sheets touching at one corner, pinned there, swing down about it into the same
    vertical plane and meet face to face. Every energy and contact pair is defined there
    (pairs sharing a vertex are skipped, as within a sheet): ipctk finds no intersection,
    no distance below the thickness and no crossing step on any step, and the sheets end
    hanging from the pin one contact thickness apart."""
    import logging

    from tisim.geometry.cloth import find_intersections
    from tisim.geometry.topology import nonmanifold_vertices

    path, knot, na = _bowtie_obj(tmp_path / "bowtie.obj")
    with caplog.at_level(logging.WARNING, logger="tisim.geometry.cloth"):
        _, model, solver = _build(
            {
                "c": {
                    **_cloth(),
                    "generator": None,
                    "mesh": str(path),
                    "translation": [0.0, 0.5, 0.0],
                    "handles": {"knot": {"vertices": [knot]}},
                }
            }
        )
    assert f"1 non-manifold vertices where separate sheets touch (first: vertex {knot} " in caplog.text
    cp = model.cloth
    assert nonmanifold_vertices(cp.faces).tolist() == [knot]
    thickness = solver.contact.thickness
    st = _run(model, solver, 20, 0.01, _ipc_check(solver, 0.9 * thickness))
    x = st.positions[cp.vertex_slice]
    assert not find_intersections(x, cp.faces, cp.edges)
    np.testing.assert_allclose(x[knot], [0.0, 0.5, 0.0], atol=1e-12)  # the pin holds
    a, b = np.setdiff1d(np.arange(na), [knot]), np.arange(na, len(x))
    # both hang below the pin (the far corners 0.1 * sqrt(2) m down) ...
    assert x[0, 1] < 0.5 - 0.13 and x[-1, 1] < 0.5 - 0.13, (x[0], x[-1])
    # ... and met: their closest vertices are a contact thickness apart, not more, not less
    gap = np.linalg.norm(x[a][:, None] - x[b][None], axis=2).min()
    assert 0.9 * thickness < gap < 3 * thickness, (gap, thickness)


def test_vertex_shot_through_a_triangle_at_100_m_per_s(tmp_path):
    """A small sheet fired at 100 m/s (1 m per step) at a pinned sheet: no tunnelling."""
    _sc, model, solver = _build(
        {
            "target": _cloth(cloth_size=[0.2, 0.2], cloth_resolution=[1, 1], pin="corners"),
            "bullet": _cloth(
                cloth_size=[0.02, 0.02], cloth_resolution=[1, 1], translation=[0.01, 0.5, 0.02], velocity=[0, -100.0, 0]
            ),
        },
        sim={"dt": 0.01, "gravity": [0, 0, 0]},
    )
    bullet = model.object_vertex_slices[1]
    st = _run(model, solver, 3, 0.01, _ipc_check(solver, 1e-3))
    assert st.positions[bullet][:, 1].min() > 1e-3  # still above the target's plane y = 0


def test_edges_crossing_in_one_step():
    """Two strips whose edges would cross within one step (3 m/s against a 2 cm gap)."""
    _sc, model, solver = _build(
        {
            "a": _cloth(cloth_size=[0.3, 0.02], cloth_resolution=[3, 1], cloth_normal="z", pin="x-min"),
            "b": _cloth(
                cloth_size=[0.02, 0.3],
                cloth_resolution=[1, 3],
                cloth_normal="z",
                translation=[0.05, 0.0, 0.02],
                velocity=[0, 0, -3.0],
            ),
        },
        sim={"dt": 0.01, "gravity": [0, 0, 0]},
    )
    st = _run(model, solver, 4, 0.01, _ipc_check(solver, 1e-3))
    # strip b pushes strip a along instead of passing through it: it stays on top
    a, b = model.object_vertex_slices
    xa = st.positions[a]
    near = np.abs(xa[:, 0] - 0.05) < 0.06
    xb = st.positions[b]
    assert xb[np.abs(xb[:, 1]) < 0.06, 2].mean() > xa[near, 2].mean()
    assert xa[near, 2].mean() < -1e-3  # a was pushed


@pytest.mark.slow
def test_cloth_thrown_at_a_thin_box_edge():
    """A sheet thrown at 10 m/s onto the edge of a thin board: no tunnelling, no NaN."""
    _sc, model, solver = _build(
        {
            "c": _cloth(
                cloth_size=[0.2, 0.2], cloth_resolution=[6, 6], translation=[0.0, 0.06, 0.0], velocity=[0, -10.0, 0]
            )
        },
        {"board": {"type": "box", "position": [0.0, 0.0, 0.0], "half_extents": [0.004, 0.05, 0.2]}},
    )
    _run(model, solver, 4, 0.01, _ipc_check(solver, 1e-3))


def test_a_kept_elastic_hessian_converges_to_the_same_steps():
    """solver.hessian_reuse keeps the elastic Hessian over Newton iterations (the gradient
    stays exact, convergence is confirmed with a fresh Hessian). A pinned sheet swinging
    under gravity (a unique nearby minimiser each step) takes the same steps as with a
    fresh Hessian every iteration, to the Newton tolerance; a sheet falling onto a sphere
    never intersects. (Through contact the two may settle in different local minima of
    the step's non-convex energy: measured 1.2 mm apart on this sheet, both converged.)"""
    sheet = {"c": _cloth(cloth_size=[0.3, 0.2], cloth_resolution=[6, 4], pin="x-min", translation=[0, 1, 0])}
    runs = {}
    for reuse in (1, 5):
        _sc, model, solver = _build(sheet, solver={"hessian_reuse": reuse, "tolerance": 1e-6, "stop": "max"})
        assert solver.hessian_reuse == reuse
        st = _run(model, solver, 12, 0.01)
        runs[reuse] = (st.positions.copy(), solver._stats_total["newton"])
    (x1, _), (x5, n5) = runs[1], runs[5]
    assert np.abs(x1 - model.initial_positions).max() > 0.01  # it swings
    assert np.abs(x1 - x5).max() < 1e-7, np.abs(x1 - x5).max()
    assert n5 > 2 * 12  # iterations beyond the first of each step ran on the kept Hessian

    _sc, model, solver = _build(
        {"c": _cloth(translation=[0.0, 0.125, 0.0])},
        {"ball": {"type": "sphere", "position": [0, 0.06, 0], "radius": 0.06}},
        solver={"hessian_reuse": 5},
    )
    st = _run(model, solver, 8, 0.01, _ipc_check(solver, 1e-3))
    assert st.positions[:, 1].min() < 0.12  # it reached the sphere (top at y = 0.12)


def test_lumped_and_coupled_bending_hessians_take_the_same_steps():
    """solver.bending_hessian: "lumped" changes the Newton matrix (no block between a
    hinge's opposite vertices, an upper bound of the Gauss-Newton term), not the energy or
    its gradient, so each step's minimiser is the same. A thick pinned sheet (bending that
    matters: 5 mm) swinging under gravity, both solved to a tight tolerance, takes the same
    steps to 1e-7 m, and the lumped one with fewer non-zeros in its Newton matrix."""
    sheet = {
        "c": _cloth(cloth_size=[0.3, 0.2], cloth_resolution=[6, 4], pin="x-min", translation=[0, 1, 0], thickness=5e-3)
    }
    runs = {}
    for mode in ("coupled", "lumped"):
        _sc, model, solver = _build(sheet, solver={"bending_hessian": mode, "tolerance": 1e-6, "stop": "max"})
        assert solver.elastic.lumped_bending == (mode == "lumped")
        st = _run(model, solver, 12, 0.01)
        runs[mode] = (st.positions.copy(), solver.elastic.assembler.pattern._nnz)
    (xc, nnz_c), (xl, nnz_l) = runs["coupled"], runs["lumped"]
    assert np.abs(xc - model.initial_positions).max() > 0.01  # it swings
    assert np.abs(xc - xl).max() < 1e-7, np.abs(xc - xl).max()
    assert nnz_l < nnz_c


@pytest.mark.skipif(not pardiso.available(), reason="needs MKL PARDISO (pip install mkl)")
def test_mixed_precision_linear_solves_take_the_same_steps():
    """solver.linear_precision = "mixed" (float32 factor, refined in float64): a swinging
    pinned sheet takes the double-precision solver's steps to the Newton tolerance with the
    same iterations, and a sheet falling onto a sphere never intersects."""
    sheet = {"c": _cloth(cloth_size=[0.3, 0.2], cloth_resolution=[6, 4], pin="x-min", translation=[0, 1, 0])}
    runs = {}
    for precision in ("double", "mixed"):
        _sc, model, solver = _build(sheet, solver={"linear_precision": precision, "tolerance": 1e-6, "stop": "max"})
        assert (solver.linear._pardiso32 is not None) == (precision == "mixed")
        st = _run(model, solver, 12, 0.01)
        runs[precision] = (st.positions.copy(), solver._stats_total["newton"], solver.linear.fallbacks)
    (xd, nd, _), (xm, nm, fallbacks) = runs["double"], runs["mixed"]
    assert np.abs(xd - model.initial_positions).max() > 0.01  # it swings
    assert np.abs(xd - xm).max() < 1e-7, np.abs(xd - xm).max()
    assert nm == nd and fallbacks == 0

    _sc, model, solver = _build(
        {"c": _cloth(translation=[0.0, 0.125, 0.0])},
        {"ball": {"type": "sphere", "position": [0, 0.06, 0], "radius": 0.06}},
        solver={"linear_precision": "mixed"},
    )
    st = _run(model, solver, 8, 0.01, _ipc_check(solver, 1e-3))
    assert st.positions[:, 1].min() < 0.12  # it reached the sphere (top at y = 0.12)


def _held_edge(handle, steps, resolution=(8, 4)):
    """A 0.4 x 0.2 m sheet without gravity, pinned at x = -0.2, its edge at x = +0.2 moved
    by ``handle``; returns per step (converged, Newton iterations, kinematic_lag, max_strain)."""
    region = {"region_min": [0.19, -1, -1], "region_max": [0.21, 1, 1]}
    sc, model, solver = _build(
        {
            "c": _cloth(
                cloth_normal="z",
                cloth_size=[0.4, 0.2],
                cloth_resolution=list(resolution),
                pin="x-min",
                handles={"h": {**region, **handle}},
            )
        },
        sim={"dt": 0.01, "gravity": [0, 0, 0]},
    )
    st, spare, out = model.initial_state(), model.initial_state(), []
    for _ in range(steps):
        s = solver.step(st, spare, 0.01)
        st, spare = spare, st
        assert st.is_finite()
        out.append((s.converged, s.extra["newton_iterations"], s.extra["kinematic_lag"], s.extra["max_strain"]))
    return sc, out


def test_a_moving_handle_lands_exactly_on_its_path():
    """A turning, approaching edge (a path the strain limit allows): every step converges
    in a few iterations with the held vertices exactly on their targets. The penalty that
    pulls them there leaves them about force / stiffness (1e-9 m) off, which had kept
    cloth-twist's Newton at its iteration limit; within the step tolerance they are put
    on the target when that move is strain-feasible and collision-free."""
    _, out = _held_edge({"angular_velocity": [math.pi, 0, 0], "velocity": [-0.05, 0, 0]}, 6)
    for k, (conv, its, lag, strain) in enumerate(out, 1):
        assert conv and its <= 10, f"step {k}: converged {conv} in {its} iterations"
        assert lag == 0.0, f"step {k}: held vertices {lag} m off their targets"
        assert strain < 1.01


def test_a_handle_the_strain_limit_blocks_stops_where_the_limit_does():
    """An edge pulled away at 1 m/s from a pinned one: the sheet (0.4 m long) may stretch
    by 1% (solver.strain_limit), 4 mm, so after t seconds the edge lags its target by
    t * 1 m/s - 4 mm. Each step converges (the held vertices stop where the limit stops
    them, instead of Newton jittering at the barrier's singularity for 50 iterations)."""
    sc, out = _held_edge({"velocity": [1.0, 0, 0]}, 5)
    L, s_max = 0.4, sc.solver.strain_limit
    for k, (conv, its, lag, strain) in enumerate(out, 1):
        expect = 0.01 * k - (s_max - 1) * L
        assert conv and its <= 15, f"step {k}: converged {conv} in {its} iterations"
        assert abs(lag - expect) < 1e-5 * L, f"step {k}: lag {lag} against {expect}"
        assert strain < s_max


def test_line_search_start_reused_changes_nothing():
    """Each line search starts from the potential the last one accepted (not a second
    evaluation at the same x), and each step from the pair list the last step's statistics
    detected at the same positions (not a second detection): through impact, friction and
    barrier-stiffness doubling the trajectory is the same, bit for bit, as with every start
    evaluated and every detection run."""
    runs = []
    for reuse_energy, reuse_detection in ((True, True), (False, True), (True, False)):
        _sc, model, solver = _build(
            {"sheet": _cloth(cloth_resolution=[6, 6], translation=[0.03, 0.075, 0.0])},
            {"ball": {"type": "sphere", "position": [0, 0, 0], "radius": 0.06}},
            contact={"mu": 0.3},
        )
        solver.reuse_start_energy = reuse_energy
        solver.reuse_detection = reuse_detection
        detections = [0]
        detect = solver.broad.detect

        def counted(*a, _detect=detect, _n=detections, **k):
            _n[0] += 1
            return _detect(*a, **k)

        solver.broad.detect = counted
        st, spare = model.initial_state(), model.initial_state()
        its = 0
        for _ in range(12):
            out = solver.step(st, spare, 0.01)
            st, spare = spare, st
            its += out.iterations
        runs.append((st.positions.copy(), its, solver.kappa, detections[0]))
    (xa, ia, ka, da), (xb, ib, kb, _), (xc, ic, kc, dc) = runs
    assert ka > 0  # the sheet reached the ball: the barrier acted
    assert ia == ib == ic and ka == kb == kc
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(xa, xc)
    assert da == dc - 11  # each step after the first reused the last one's final detection


def test_contact_terms_read_the_pair_list_in_the_buffers():
    """The barrier's gradient and Hessian read the broad phase's pair buffers with the
    counts the solver keeps. Putting held vertices on their targets checks that move with
    a detection of its own, which replaces the buffers' list: the next iteration had kept
    the line search's counts, so it read a truncated list (or stale rows past its end).
    Every call must pass the counts of the list the buffers hold."""
    region = {"region_min": [0.19, -1, -1], "region_max": [0.21, 1, 1]}
    handle = {"angular_velocity": [math.pi, 0, 0], "velocity": [-0.05, 0, 0]}
    _, model, solver = _build(
        {
            "c": _cloth(
                cloth_normal="z",
                cloth_size=[0.4, 0.2],
                cloth_resolution=[8, 4],
                pin="x-min",
                handles={"h": {**region, **handle}},
            )
        },
        sim={"dt": 0.01, "gravity": [0, 0, 0]},
    )
    calls = {"compact": 0, "move": 0}
    compact, move = solver.barrier.compact_active, solver._move_is_safe

    def checked_compact(x, pt, n_pt, ee, n_ee, *args, **kwargs):
        assert (n_pt, n_ee) == (solver.broad.n_pt, solver.broad.n_ee), "counts of another list"
        calls["compact"] += 1
        return compact(x, pt, n_pt, ee, n_ee, *args, **kwargs)

    def counted_move(*args):
        calls["move"] += 1
        return move(*args)

    solver.barrier.compact_active = checked_compact
    solver._move_is_safe = counted_move
    _run(model, solver, 4, 0.01)
    assert calls["move"] > 0 and calls["compact"] > calls["move"]  # the case was exercised
