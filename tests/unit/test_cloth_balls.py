"""A static sphere met by the cloth's triangles through its centre
(:mod:`tisim.solvers.cloth.balls`): the rows a detection keeps, the barrier's force
against the scene's at the same gap, friction's Coulomb bound, and a coarse sheet
draped on a small ball kept off the real surface (ipctk's distances)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tisim.backend import download, upload

XI, DHAT = 1e-3, 1e-3


def _batch(x, faces, radius=0.3, centre_index=None):
    """A BallPairs over positions x (n, 3) whose last vertex is the centre."""
    import taichi as ti

    from tisim import backend
    from tisim.solvers.cloth.balls import BallPairs

    n = len(x)
    ball = BallPairs(n, x.copy(), n - 1 if centre_index is None else centre_index, radius, XI, DHAT, faces)
    xd = ti.Vector.ndarray(3, backend.real(), n)
    upload(xd, x)
    return ball, xd


def _distance_to_centre(c, tri):
    import ipctk

    return math.sqrt(ipctk.point_triangle_distance(c, *tri))


def test_a_detection_keeps_every_face_that_comes_within_reach_over_its_sweep(rng):
    """Random triangles and straight sweeps around a sphere of radius 0.3 m: every face that
    comes within rho + dhat + inflation of the centre anywhere on its sweep (ipctk's
    distance at 201 times of the sweep) is among the candidates, and candidates are not
    all the faces (the bound prunes)."""
    m = 400
    R, inflation = 0.3, 2e-3
    tri = rng.normal(size=(m, 1, 3))
    tri = tri / np.linalg.norm(tri, axis=2, keepdims=True) * rng.uniform(0.29, 0.45, (m, 1, 1))
    tri = tri + 0.03 * rng.normal(size=(m, 3, 3))
    move = 0.02 * rng.normal(size=(m, 3, 3))
    x = np.concatenate([tri.reshape(-1, 3), [[0.0, 0.0, 0.0]]])
    dx = np.concatenate([move.reshape(-1, 3), [[0.0, 0.0, 0.0]]])
    faces = np.arange(3 * m).reshape(m, 3)
    ball, _ = _batch(x, faces, R)
    reach = ball.rho + DHAT + inflation
    static = set(ball.candidate_faces(x, inflation).tolist())
    swept = set(ball.candidate_faces(x, inflation, dx).tolist())
    c = np.zeros(3)
    for f in range(m):
        d0 = _distance_to_centre(c, tri[f])
        if d0 < reach:
            assert f in static, (f, d0)
        dmin = min(_distance_to_centre(c, tri[f] + t * move[f]) for t in np.linspace(0, 1, 201))
        if dmin < reach:
            assert f in swept, (f, dmin)
    assert 0 < len(static) < m and len(swept) < m


def test_candidates_are_those_of_the_plain_numpy_bound(rng):
    """candidate_faces computes its bound by coordinate rows for speed: the same faces as
    the bound written with numpy's reductions (mean over the vertices, norms, the
    largest), at thresholds that fall between two faces' bounds (1 ulp on either side of
    each), so a bound one rounding off would change a set."""
    m = 300
    tri = rng.normal(size=(m, 3, 3)) * 0.2 + rng.normal(size=(m, 1, 3)) * 0.4
    move = 0.01 * rng.normal(size=(m, 3, 3))
    x = np.concatenate([tri.reshape(-1, 3), [[0.01, -0.02, 0.03]]])
    dx = np.concatenate([move.reshape(-1, 3), [[0.0, 0.0, 0.0]]])
    faces = np.arange(3 * m).reshape(m, 3)
    ball, _ = _batch(x, faces, 0.3)
    checked = 0
    for d in (None, dx):
        c, t = x[-1], x[faces]
        cen = t.mean(axis=1)
        reach = np.linalg.norm(t - cen[:, None], axis=2).max(axis=1)
        if d is not None:
            t1 = t + d[faces]
            cen1 = t1.mean(axis=1)
            reach = np.maximum(reach, np.linalg.norm(t1 - cen1[:, None], axis=2).max(axis=1))
            reach = reach + np.linalg.norm(cen1 - cen, axis=1)
        lower = np.linalg.norm(cen - c, axis=1) - reach
        base = ball.rho + DHAT
        for bound in np.sort(lower)[::10]:
            for limit in (np.nextafter(bound, -np.inf), bound, np.nextafter(bound, np.inf)):
                want = np.flatnonzero(lower < limit)
                # the inflation whose threshold rho + dhat + inflation lands on the limit
                inflation = limit - base
                if base + inflation != limit:
                    continue
                np.testing.assert_array_equal(ball.candidate_faces(x, inflation, d), want)
                checked += 1
    assert checked > 40  # (most limits are reachable as rho + dhat + an inflation)


@pytest.mark.parametrize("gap", [1e-7, 1e-6])
def test_the_balls_barrier_pushes_as_the_scenes_pairs_do_at_the_same_gap(gap):
    """The ball's barrier acts on the centre distance with thickness rho = R + xi, and its
    stiffness is scaled so that near contact it pushes as hard as the scene's barrier
    on a pair at the same gap: a face at gap delta from the sphere (its force, the
    barrier's gradient summed over the face, along the normal) against the scene's
    point-triangle pair at distance xi + delta (the same kernels, scene constants)."""
    from tisim.contact.ipc.potential import BarrierPotential

    R = 0.3
    h = R + XI + gap
    tri = np.array([[-0.01, h, -0.01], [0.02, h, -0.01], [-0.01, h, 0.02]])
    x = np.concatenate([tri, [[0.0, 0.0, 0.0]]])
    ball, xd = _batch(x, np.array([[0, 1, 2]]), R)
    assert ball.detect(x, 0.0) == 1
    import taichi as ti

    from tisim import backend

    g = ti.Vector.ndarray(3, backend.real(), 4)
    g.fill(0.0)
    kappa = 1e4
    ball.add_gradient(xd, kappa, g)
    f_ball = -download(g)[:3].sum(axis=0)
    # the scene's pair: a point xi + delta below the same triangle
    xs = np.concatenate([tri, [[0.0, h - XI - gap, 0.0]]])
    pot = BarrierPotential(4, 8, xs)
    pt = ti.Vector.ndarray(4, ti.i32, 1)
    upload(pt, np.array([[3, 0, 1, 2]], dtype=np.int32))
    ee = ti.Vector.ndarray(4, ti.i32, 1)
    xs_d = ti.Vector.ndarray(3, backend.real(), 4)
    upload(xs_d, xs)
    g.fill(0.0)
    pot.add_gradient(xs_d, pt, 1, ee, 0, DHAT, XI, kappa, g)
    f_pair = -download(g)[:3].sum(axis=0)
    assert f_ball[1] > 0 and f_pair[1] > 0  # both push the face up, away from the sphere
    assert abs(f_ball[1] / f_pair[1] - 1.0) < 0.01, (f_ball, f_pair)


def test_a_face_sliding_on_the_ball_feels_coulombs_bound(rng):
    """A face resting at a small gap on the sphere, moved tangentially by far more than the
    smoothing length eps_v h: friction's force on it (its gradient summed over the face)
    is mu lambda, lambda the lagged normal force (the barrier's force on it), with mu the
    pair's coefficient (half the sphere's, half the face's vertices' mean), and opposes
    the slip."""
    import taichi as ti

    from tisim import backend

    R, mu_sphere, mu_cloth = 0.3, 0.4, 0.2
    h = R + XI + 1e-5
    tri = np.array([[-0.01, h, -0.01], [0.02, h, -0.01], [-0.01, h, 0.02]])
    x = np.concatenate([tri, [[0.0, 0.0, 0.0]]])
    ball, xd = _batch(x, np.array([[0, 1, 2]]), R)
    ball.detect(x, 0.0)
    mu = ti.ndarray(backend.real(), 4)
    upload(mu, np.array([mu_cloth, mu_cloth, mu_cloth, mu_sphere]))
    kappa = 1e4
    ball.update_friction(xd, kappa, mu)
    g = ti.Vector.ndarray(3, backend.real(), 4)
    g.fill(0.0)
    ball.add_gradient(xd, kappa, g)
    lam = float(np.linalg.norm(download(g)[:3].sum(axis=0)))
    eps_v, dt = 1e-3, 0.01
    slip = np.array([1.0, 0.0, 0.3]) / np.linalg.norm([1.0, 0.0, 0.3]) * 100 * eps_v * dt
    moved = x.copy()
    moved[:3] += slip
    xm = ti.Vector.ndarray(3, backend.real(), 4)
    upload(xm, moved)
    g.fill(0.0)
    part = ball.add_friction_terms(xm, xd, eps_v, dt, g)
    assert part is not None
    f = -download(g)[:3].sum(axis=0)
    mu_pair = 0.5 * mu_sphere + 0.5 * mu_cloth
    assert ball.friction_bound() == pytest.approx(mu_pair * lam, rel=1e-9)
    assert np.linalg.norm(f) == pytest.approx(mu_pair * lam, rel=1e-6)
    assert f @ slip < 0 and abs(f @ slip) == pytest.approx(np.linalg.norm(f) * np.linalg.norm(slip), rel=1e-6)


@pytest.mark.parametrize(
    "height, words",
    [
        (0.05, "intersects collider 'ball': cloth triangle .* cuts through the sphere"),
        (0.0605, "within the contact thickness"),
        (0.08, None),
    ],
)
def test_a_coarse_face_over_the_ball_is_checked_at_the_start(height, words):
    """A two-triangle sheet 0.3 m wide over a ball of radius 6 cm: every vertex is outside
    the ball, but at height 5 cm its faces cut through it, and at 6.05 cm they come within
    the contact thickness: the start check names a triangle; at 8 cm the sheet is clear."""
    from tisim.geometry.mesh import MeshError
    from tisim.model import Model
    from tisim.scene import scene_from_dict
    from tisim.solvers.cloth.solver import SolverCloth

    sc = scene_from_dict(
        {
            "solver": {"type": "cloth"},
            "objects": {
                "c": {
                    "kind": "cloth",
                    "generator": "cloth",
                    "cloth_size": [0.3, 0.3],
                    "cloth_resolution": [1, 1],
                    "translation": [0.0, height, 0.0],
                }
            },
            "colliders": {"ball": {"type": "sphere", "radius": 0.06}},
            "contact": {"thickness": XI, "dhat": DHAT},
            "sim": {"dt": 0.01},
        }
    )
    if words is None:
        s = SolverCloth(Model.from_scene(sc), sc.solver)
        assert len(s.balls) == 1 and s.no == 1
        return
    with pytest.raises(MeshError, match=words) as e:
        SolverCloth(Model.from_scene(sc), sc.solver)
    assert "cloth triangle" in str(e.value) and "collider 'ball'" in str(e.value)
