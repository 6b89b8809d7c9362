"""Additive CCD (Taichi) against IPC Toolkit: ipctk.AdditiveCCD (same algorithm),
ipctk.TightInclusionCCD (exact and conservative) and ipctk's distances.

What every query must satisfy (``_check``):
* agreement with ipctk's additive CCD (same algorithm, conservative rescaling 0.9):
  both hit with times within 1e-9, or neither hits (ours then returns t_max);
* never later than the exact impact time: Tight-Inclusion with conservative
  rescaling 1.0 and no minimum separation returns a lower bound (within its 1e-6
  tolerance) of the first time the pair touches. (Tight-Inclusion's own minimum
  separation is measured in the max-norm, so with xi > 0 its time can be earlier than
  the Euclidean one; the Euclidean guarantee is checked directly instead:)
* safety: at the returned time the pair is farther apart than the thickness
  (ipctk's squared distances), and so is every configuration before it (sampled).
"""

# No ``from __future__ import annotations``: Taichi reads the test kernels' annotations.

import logging
import time

import numpy as np
import pytest
import taichi as ti

ipctk = pytest.importorskip("ipctk")

from tisim.contact.ipc import ccd

log = logging.getLogger(__name__)

PT, EE = 0, 1


@ti.func
def _row(A: ti.template(), k, i):
    return ti.Vector([A[k, i, 0], A[k, i, 1], A[k, i, 2]])


@ti.kernel
def _batch_ccd(
    X: ti.types.ndarray(),
    D: ti.types.ndarray(),
    kind: ti.types.ndarray(),
    thickness: float,
    t_max: float,
    out: ti.types.ndarray(),
):
    for k in range(out.shape[0]):
        a, b, c, d = _row(X, k, 0), _row(X, k, 1), _row(X, k, 2), _row(X, k, 3)
        da, db, dc, dd = _row(D, k, 0), _row(D, k, 1), _row(D, k, 2), _row(D, k, 3)
        if kind[k] == PT:
            out[k] = ccd.point_triangle_ccd(a, b, c, d, da, db, dc, dd, thickness, t_max)
        else:
            out[k] = ccd.edge_edge_ccd(a, b, c, d, da, db, dc, dd, thickness, t_max)


@ti.kernel
def _batch_distance(X: ti.types.ndarray(), kind: ti.types.ndarray(), out: ti.types.ndarray()):
    for k in range(out.shape[0]):
        a, b, c, d = _row(X, k, 0), _row(X, k, 1), _row(X, k, 2), _row(X, k, 3)
        if kind[k] == PT:
            out[k] = ccd._point_triangle_distance_sq(a, b, c, d)
        else:
            out[k] = ccd._edge_edge_distance_sq(a, b, c, d)


def _run_ccd(X, D, kind, thickness, t_max=1.0):
    X, D = np.ascontiguousarray(X, float), np.ascontiguousarray(D, float)
    out = np.zeros(len(X))
    _batch_ccd(X, D, np.asarray(kind, np.int32), float(thickness), float(t_max), out)
    return out


def _dist(kind, X):
    return (ipctk.point_triangle_distance if kind == PT else ipctk.edge_edge_distance)(*X)


_ACCD = None
_TI_EXACT = None


def _oracles():
    global _ACCD, _TI_EXACT
    if _ACCD is None:
        _ACCD = ipctk.AdditiveCCD(conservative_rescaling=0.9)
        # An iteration cap keeps the coplanar cases (a continuum of roots) from taking
        # ~15 s each; a capped answer is still a lower bound of the impact time.
        _TI_EXACT = ipctk.TightInclusionCCD(tolerance=1e-6, max_iterations=100_000, conservative_rescaling=1.0)
    return _ACCD, _TI_EXACT


def _check(X, D, kind, toi, thickness, t_max=1.0, compare_accd=True):
    """Assert the properties listed in the module docstring for one query; return
    (ipctk additive hit, ipctk additive toi)."""
    accd, ti_exact = _oracles()
    X1 = X + D
    query = ti_exact.point_triangle_ccd if kind == PT else ti_exact.edge_edge_ccd
    hit_ti, toi_ti = query(*X, *X1, min_distance=0.0, tmax=t_max)
    if hit_ti:
        assert toi <= toi_ti + 1e-6, f"later than the exact impact: {toi} > {toi_ti}"
    assert 0.0 <= toi <= t_max
    xi2 = thickness**2
    if _dist(kind, X) > xi2:
        # safe at the returned time and (sampled) before it
        for s in np.linspace(0.0, 1.0, 9):
            d2 = _dist(kind, X + s * toi * D)
            assert d2 > xi2, f"distance {np.sqrt(d2)} <= thickness {thickness} at t={s * toi}"
    hit_a = toi_a = None
    if compare_accd:
        query = accd.point_triangle_ccd if kind == PT else accd.edge_edge_ccd
        hit_a, toi_a = query(*X, *X1, min_distance=thickness, tmax=t_max)
        if hit_a:
            assert toi == pytest.approx(toi_a, rel=1e-9, abs=1e-12), (toi, toi_a)
        else:
            assert toi == t_max, f"ipctk: no hit before t_max, ours {toi}"
    return hit_a, toi_a


# ----------------------------------------------------------------------------------
# distances used inside CCD


def test_private_distances_match_ipctk_including_degenerate(rng):
    cases = []  # (kind, 4 x 3)
    for _ in range(200):
        cases.append((PT, rng.normal(size=(4, 3))))
        cases.append((EE, rng.normal(size=(4, 3))))
    a0, a1 = np.array([0.0, 0, 0]), np.array([1.0, 0, 0])
    for off in ([0.3, 0.2, 0], [1.5, 0.1, 0.05], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]):
        off = np.array(off)  # parallel / collinear / overlapping edges
        cases.append((EE, np.array([a0, a1, a0 + off, a1 + off])))
    cases.append((EE, np.array([a0, a1, [0.5, 0, 0], [0.5, 0, 0]])))  # zero-length, on the edge
    cases.append((EE, np.array([a0, a1, [0.5, -1, 0.2], [0.5, 1, 0.2]])))  # crossing
    cases.append((EE, np.array([a0, a1, [0.5, -1, 0.0], [0.5, 1, 0.0]])))  # intersecting
    cases.append((EE, np.array([a0, a1 * (1 + 1e-9), a0 + [0, 1e-3, 0], a1 + [0, 1e-3, 1e-12]])))
    tri = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]])
    for p in ([0.5, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.0], [0.2, 0.2, 0.3], [2, 2, 1],
              [-1, -1, 0], [0.0, 0.0, 0.0], [0.5, -0.3, 0.0]):  # fmt: skip
        cases.append((PT, np.vstack([p, tri])))
    cases.append((PT, np.array([[0.3, 0.1, 0.2], [0, 0, 0], [1, 0, 0], [2, 0, 0]])))  # flat
    cases.append((PT, np.array([[0.3, 0.1, 0.2], [0, 0, 0], [0, 0, 0], [0, 0, 0]])))  # a point
    kind = np.array([k for k, _ in cases], np.int32)
    X = np.array([x for _, x in cases])
    out = np.zeros(len(X))
    _batch_distance(X, kind, out)
    ref = np.array([_dist(k, x) for k, x in cases])
    # ipctk returns NaN for a triangle collapsed to a point; the distance is to that point
    assert np.isnan(ref[-1])
    ref[-1] = np.sum((X[-1, 0] - X[-1, 1]) ** 2)
    assert np.all(ref >= 0) and np.count_nonzero(ref) > len(ref) // 2
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-14)


# ----------------------------------------------------------------------------------
# single pairs


def test_random_queries_against_ipctk(rng):
    m = 300
    X = rng.normal(size=(2 * m, 4, 3))
    D = 2.0 * rng.normal(size=(2 * m, 4, 3))
    kind = np.tile([PT, EE], m)
    n_hit = 0
    t0 = time.perf_counter()
    for thickness, t_max in ((0.0, 1.0), (1e-2, 1.0), (1e-2, 0.5)):
        toi = _run_ccd(X, D, kind, thickness, t_max)
        for k in range(len(X)):
            hit, _ = _check(X[k], D[k], kind[k], toi[k], thickness, t_max)
            n_hit += bool(hit)
    log.info("random CCD queries: %d hits, %.2f s", n_hit, time.perf_counter() - t0)
    assert n_hit > 100  # enough impacts to mean something


def _pt(p, tri, dp, dtri=None):
    dtri = np.zeros((3, 3)) if dtri is None else np.asarray(dtri, float)
    return PT, np.vstack([p, tri]).astype(float), np.vstack([dp, dtri]).astype(float)


def _ee(a, b, da, db):
    return EE, np.vstack([a, b]).astype(float), np.vstack([da, db]).astype(float)


TRI = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]])
XI = 1e-3

DEGENERATE = {
    # (case, expected: "hit" = toi < t_max, "miss" = toi == t_max)
    "zero motion": (_pt([0.2, 0.2, 0.1], TRI, [0, 0, 0]), "miss"),
    "common translation": (_pt([0.2, 0.2, 0.1], TRI, [0, 0, -5], [[0, 0, -5]] * 3), "miss"),
    "parallel edges sliding": (
        _ee([[0, 0, 0], [1, 0, 0]], [[0, 0, 0.01], [1, 0, 0.01]],
            [[0, 0, 0]] * 2, [[2, 0, 0]] * 2),
        "miss",
    ),
    "parallel edges sliding and closing": (
        _ee([[0, 0, 0], [1, 0, 0]], [[0.5, 0, 0.01], [1.5, 0, 0.01]],
            [[0, 0, 0]] * 2, [[-1, 0, -0.02]] * 2),
        "hit",
    ),
    "collinear edges meeting end to end": (
        _ee([[0, 0, 0], [1, 0, 0]], [[1.5, 0, 0], [2.5, 0, 0]], [[0, 0, 0]] * 2, [[-1, 0, 0]] * 2),
        "hit",
    ),
    "point exactly through an edge": (_pt([0.5, 0, 0.2], TRI, [0, 0, -0.4]), "hit"),
    "point exactly through a vertex": (_pt([0, 0, 0.2], TRI, [0, 0, -0.4]), "hit"),
    "coplanar point toward an edge": (_pt([0.5, -0.3, 0], TRI, [0, 0.6, 0]), "hit"),
    "coplanar point passing beside": (_pt([1.5, -0.3, 0], TRI, [0, 0.6, 0]), "miss"),
    "coplanar edges closing": (
        _ee([[0, 0, 0], [1, 0, 0]], [[0.2, 0.5, 0], [0.8, 0.3, 0]],
            [[0, 0, 0]] * 2, [[0, -0.6, 0]] * 2),
        "hit",
    ),
    "start just above thickness, approaching": (
        _pt([0.2, 0.2, XI * (1 + 1e-6)], TRI, [0, 0, -0.1]), "hit"
    ),
    "start just above thickness, sliding": (
        _pt([0.2, 0.2, XI + 1e-4], TRI, [0.3, 0.3, 0.0]), "miss"
    ),
    "edges start just above thickness, receding": (
        _ee([[0, 0, 0], [1, 0, 0]], [[0.5, -1, XI * 1.001], [0.5, 1, XI * 1.001]],
            [[0, 0, 0]] * 2, [[0, 0, 0.1]] * 2),
        "miss",
    ),
}  # fmt: skip


@pytest.mark.parametrize("thickness", [0.0, XI])
def test_degenerate_configurations(thickness):
    names = list(DEGENERATE)
    cases = [DEGENERATE[k][0] for k in names]
    kind = [c[0] for c in cases]
    X = np.array([c[1] for c in cases])
    D = np.array([c[2] for c in cases])
    toi = _run_ccd(X, D, kind, thickness)
    for name, k, x, d, t in zip(names, kind, X, D, toi):
        expected = DEGENERATE[name][1]
        hit, _ = _check(x, d, k, t, thickness)
        if expected == "hit":
            assert t < 1.0 and hit, name
        else:
            assert t == 1.0 and not hit, name


def test_iteration_cap_gives_a_safe_early_step():
    """Sliding 1e-7 m above the thickness needs ~ l_p / (0.9 * 1e-7) > 1e6 advancement
    steps: the cap stops it with a small time whose configurations are all safe."""
    gap = 1e-7
    kind, X, D = _pt([0.2, 0.2, XI + gap], TRI, [0.3, 0.3, 0.0])
    (toi,) = _run_ccd(X[None], D[None], [kind], XI)
    l_p = np.linalg.norm(D[0] - D.mean(0)) + np.linalg.norm(D[1] - D.mean(0))
    per_step = ccd.CONSERVATIVE_RESCALING * gap / l_p
    assert toi == pytest.approx(ccd.MAX_ITERATIONS * per_step, rel=1e-3)
    assert 0.0 < toi < 0.1
    _check(X, D, kind, toi, XI, compare_accd=False)


def test_adversarial_fast_motions():
    h = 0.01
    v = 100.0  # m/s: dx = 1 m in one step
    cases = {
        # a vertex shot through a 10 cm triangle from 1 cm above
        "bullet through triangle": _pt([0.02, 0.02, 0.01], 0.1 * TRI, [0, 0, -v * h]),
        # two 10 cm edges crossing in one step
        "edges crossing": _ee(
            [[-0.05, 0, 0], [0.05, 0, 0]], [[0, -0.05, 0.5], [0, 0.05, 0.5]],
            [[0, 0, 0]] * 2, [[0, 0, -v * h]] * 2,
        ),
        # a fast point passing 0.5 xi from a triangle edge (inside the thickness)
        "grazing an edge": _pt([0.05, -0.5 * XI, 0.5], 0.1 * TRI, [0, 0, -v * h]),
    }  # fmt: skip
    names = list(cases)
    kind = [cases[k][0] for k in names]
    X = np.array([cases[k][1] for k in names])
    D = np.array([cases[k][2] for k in names])
    toi = _run_ccd(X, D, kind, XI)
    for name, k, x, d, t in zip(names, kind, X, D, toi):
        assert 0.0 < t < 1.0, name
        _check(x, d, k, t, XI)
        y = x + t * d
        if name == "bullet through triangle":
            # still on the starting side, above the thickness
            assert y[0, 2] - y[1, 2] > XI
        elif name == "edges crossing":
            n = np.cross(y[1] - y[0], y[3] - y[2])
            n0 = np.cross(x[1] - x[0], x[3] - x[2])
            assert np.dot(y[2] - y[0], n) * np.dot(x[2] - x[0], n0) > 0  # same side
            assert np.dot(y[2] - y[0], n) / np.linalg.norm(n) > XI
        else:
            assert y[0, 2] > 0  # has not passed the edge's height yet


# ----------------------------------------------------------------------------------
# over pairs and meshes


def _vfield(a):
    """Positions / steps as the caller passes them: ti.Vector.ndarray(3, real, n)."""
    from tisim import backend

    f = ti.Vector.ndarray(3, backend.real(), len(a))
    f.from_numpy(np.ascontiguousarray(a, dtype=backend.np_real()))
    return f


def _ifield(rows):
    """Pair rows: ti.Vector.ndarray(4, ti.i32, cap)."""
    f = ti.Vector.ndarray(4, ti.i32, max(1, len(rows)))
    if len(rows):
        f.from_numpy(np.ascontiguousarray(rows, np.int32))
    return f


def _compiled(*modules) -> int:
    """Kernels compiled so far for the Taichi kernels of ``modules`` (one per argument
    specialisation; a new instance that compiles nothing leaves this unchanged)."""
    return sum(
        len(obj._primal.compiled_kernels)
        for m in modules
        for obj in vars(m).values()
        if hasattr(obj, "_primal") and hasattr(obj._primal, "compiled_kernels")
    )


def test_max_step_is_the_minimum_over_pairs(rng):
    from tisim.contact.ipc.ccd import max_step

    n = 40
    V = rng.normal(size=(n, 3))
    dV = 1.5 * rng.normal(size=(n, 3))
    pt = [rng.choice(n, 4, replace=False) for _ in range(60)]
    ee = [rng.choice(n, 4, replace=False) for _ in range(60)]
    x, dx = _vfield(V), _vfield(dV)
    alpha = max_step(x, dx, _ifield(pt), len(pt), _ifield(ee), len(ee), XI)
    per_pair = _run_ccd(
        np.array([V[q] for q in pt + ee]), np.array([dV[q] for q in pt + ee]),
        [PT] * len(pt) + [EE] * len(ee), XI,
    )  # fmt: skip
    assert alpha == pytest.approx(per_pair.min(), rel=1e-12)
    assert 0.0 < alpha < 1.0
    np.testing.assert_array_equal(x.to_numpy(), V)  # the positions did not move
    # no pairs: the full step; a pair already inside the thickness: no step
    assert max_step(x, dx, _ifield([]), 0, _ifield([]), 0, XI) == 1.0
    V2 = V.copy()
    V2[pt[0][0]] = V[pt[0][1]]  # the point sits on a vertex of its triangle
    assert max_step(_vfield(V2), dx, _ifield(pt), len(pt), _ifield([]), 0, XI) == 0.0


def test_two_batches_in_one_launch_give_each_its_own_bound(rng):
    """max_step_two: each batch's bound (its own rows and thickness) as max_step gives it
    alone, bit for bit, whichever batch is the tighter."""
    from tisim.contact.ipc.ccd import max_step, max_step_two

    n = 40
    V = rng.normal(size=(n, 3))
    x = _vfield(V)
    rows = [[rng.choice(n, 4, replace=False) for _ in range(k)] for k in (50, 30, 20, 0)]
    a = (_ifield(rows[0]), len(rows[0]), _ifield(rows[1]), len(rows[1]), XI)
    b = (_ifield(rows[2]), len(rows[2]), _ifield(rows[3]), 0, 3 * XI)
    for scale in (0.3, 1.5, 4.0):
        dx = _vfield(scale * rng.normal(size=(n, 3)))
        alone = (max_step(x, dx, *a), max_step(x, dx, *b))
        assert max_step_two(x, dx, a, b) == alone
        assert max_step_two(x, dx, b, a) == alone[::-1]
        assert alone[0] != alone[1]


def _collision_mesh(V, F, E):
    return ipctk.CollisionMesh(V, E.astype(np.int32), F.astype(np.int32))


def test_mesh_step_is_collision_free(rng):
    """A cloth over a sphere obstacle with a large random step: the CCD step is
    intersection-free (ipctk.is_step_collision_free) and keeps the thickness."""
    from tisim.contact.ipc.ccd import CCD
    from tisim.geometry import generate, topology

    cloth = generate.cloth_grid(size=(1.0, 1.0), resolution=(16, 16), normal="y", center=(0, 0.56, 0))
    sphere = generate.icosphere(2)
    Vc = cloth.vertices
    Vs = 0.5 * sphere.vertices
    V = np.vstack([Vc, Vs])
    F = np.vstack([cloth.faces, sphere.faces + len(Vc)]).astype(np.int64)
    E = topology.edges(F)
    active = np.arange(len(V)) < len(Vc)
    dV = np.zeros_like(V)
    dV[: len(Vc)] = [0.0, -0.6, 0.0] + rng.normal(scale=0.05, size=Vc.shape)
    thickness = 1e-3

    ccd = CCD(len(V), F, E, active, thickness)
    x, dx = _vfield(V), _vfield(dV)
    t0 = time.perf_counter()
    alpha = ccd.max_step(x, dx)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    alpha2 = ccd.max_step(x, dx)
    log.info(
        "mesh CCD: alpha %.4f, first call %.2f s (compile), then %.1f ms, pairs %s, %s",
        alpha, first, 1e3 * (time.perf_counter() - t0), ccd.last_counts, ccd.last_timings,
    )  # fmt: skip
    assert alpha == alpha2
    assert 0.0 < alpha < 1.0

    mesh = _collision_mesh(V, F, E)
    # the full step tunnels (so the check below can fail) ...
    assert not ipctk.is_step_collision_free(mesh, V, V + dV)
    # ... the CCD step does not
    V1 = V + alpha * dV
    assert ipctk.is_step_collision_free(mesh, V, V1)
    # Euclidean distances at the end of the step stay above the thickness
    cand = ipctk.Candidates()
    cand.build(mesh, V1, 2 * thickness)
    d2 = [ipctk.point_triangle_distance(V1[c.vertex_id], *V1[F[c.face_id]]) for c in cand.fv_candidates]
    d2 += [ipctk.edge_edge_distance(*V1[E[c.edge0_id]], *V1[E[c.edge1_id]]) for c in cand.ee_candidates]
    assert len(d2) > 0 and min(d2) > thickness**2


def _cloth_over_sphere(rng, res, drop=0.6):
    from tisim.geometry import generate, topology

    cloth = generate.cloth_grid(size=(1.0, 1.0), resolution=(res, res), normal="y", center=(0, 0.56, 0))
    Vc = cloth.vertices
    sphere = generate.icosphere(2)
    V = np.vstack([Vc, 0.5 * sphere.vertices])
    F = np.vstack([cloth.faces, sphere.faces + len(Vc)]).astype(np.int64)
    E = topology.edges(F)
    active = np.arange(len(V)) < len(Vc)
    dV = np.zeros_like(V)
    dV[: len(Vc)] = [0.0, -drop, 0.0] + rng.normal(scale=0.05, size=Vc.shape)
    return V, F, E, active, dV


def test_second_instance_compiles_nothing(rng):
    """A second CCD (another mesh size) and max_step on other arrays reuse every
    compiled kernel (ndarray arguments, no template fields)."""
    from tisim.contact.ipc import broad_phase
    from tisim.contact.ipc.ccd import CCD, max_step

    V, F, E, active, dV = _cloth_over_sphere(rng, 8)
    t0 = time.perf_counter()
    c1 = CCD(len(V), F, E, active, 1e-3, initial_capacity=4)
    a1 = c1.max_step(_vfield(V), _vfield(dV))
    b1 = max_step(
        _vfield(V), _vfield(dV), c1.broad_phase.pt, c1.last_counts[0],
        c1.broad_phase.ee, c1.last_counts[1], 1e-3,
    )  # fmt: skip
    first = time.perf_counter() - t0
    assert a1 == b1
    before = _compiled(ccd, broad_phase)
    assert before > 0

    V2, F2, E2, active2, dV2 = _cloth_over_sphere(rng, 13)
    t0 = time.perf_counter()
    c2 = CCD(len(V2), F2, E2, active2, 2e-3, initial_capacity=4)
    x2, dx2 = _vfield(V2), _vfield(dV2)
    a2 = c2.max_step(x2, dx2)
    n_pt, n_ee = c2.last_counts
    b2 = max_step(x2, dx2, c2.broad_phase.pt, n_pt, c2.broad_phase.ee, n_ee, 2e-3)
    b3 = max_step(x2, dx2, _ifield([]), 0, _ifield([]), 0, 2e-3)
    second = time.perf_counter() - t0
    log.info("CCD: first instance %.3f s, second instance %.3f s", first, second)
    assert 0.0 < a2 < 1.0 and a2 == b2 and b3 == 1.0
    assert _compiled(ccd, broad_phase) == before, "a new instance recompiled kernels"
    assert second < 1.0
