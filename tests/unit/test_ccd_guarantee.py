"""Additive CCD's documented guarantee in the window where its early exit is decided.

tisim.contact.ipc.ccd (module docstring, steps 3-4): with d0 the start distance, xi the
thickness, s = 0.9 the conservative rescaling and l_p the bound on the closing speed,
the returned time toi satisfies

    d(toi) - xi >= (1 - s) (d0 - xi) = 0.1 (d0 - xi)

(distances from IPC Toolkit, not from the module). The first advancement is s (d0 - xi)
/ l_p; when it passes t_max the pair is declared safe at once. Queries whose unscaled
advancement (d0 - xi) / l_p lies in [t_max, t_max / s] are the ones where an exit that
forgets the rescaling returns t_max with the pair closer than the guarantee (head-on
approaches, where the real closing speed equals l_p, reach d - xi = (1 - q) (d0 - xi)
at q = t_max l_p / (d0 - xi) < 1). The random and degenerate queries of
test_ipc_ccd.py never land there; these do, on purpose.
"""

# No ``from __future__ import annotations``: Taichi reads the test kernels' annotations.

import numpy as np
import pytest
import taichi as ti

ipctk = pytest.importorskip("ipctk")

from tisim.contact.ipc import ccd

PT, EE = 0, 1
S = 0.9  # the documented conservative rescaling


@ti.func
def _row(A: ti.template(), k, i):
    return ti.Vector([A[k, i, 0], A[k, i, 1], A[k, i, 2]])


@ti.kernel
def _batch(
    X: ti.types.ndarray(),
    D: ti.types.ndarray(),
    kind: ti.types.ndarray(),
    thickness: float,
    t_max: ti.types.ndarray(),
    out: ti.types.ndarray(),
):
    for k in range(out.shape[0]):
        a, b, c, d = _row(X, k, 0), _row(X, k, 1), _row(X, k, 2), _row(X, k, 3)
        da, db, dc, dd = _row(D, k, 0), _row(D, k, 1), _row(D, k, 2), _row(D, k, 3)
        if kind[k] == PT:
            out[k] = ccd.point_triangle_ccd(a, b, c, d, da, db, dc, dd, thickness, t_max[k])
        else:
            out[k] = ccd.edge_edge_ccd(a, b, c, d, da, db, dc, dd, thickness, t_max[k])


def _dist(kind, X):
    return float(np.sqrt((ipctk.point_triangle_distance if kind == PT else ipctk.edge_edge_distance)(*X)))


def _l_p(kind, D):
    """The closing-speed bound of the docstring, step 2 (mean displacement removed)."""
    U = D - D.mean(axis=0)
    n = np.linalg.norm(U, axis=1)
    if kind == PT:
        return n[0] + n[1:].max()
    return n[:2].max() + n[2:].max()


def _check(queries, thickness):
    """Run the queries (kind, X (4, 3), D (4, 3), t_max) and assert the guarantee."""
    kinds = np.array([q[0] for q in queries], np.int32)
    X = np.ascontiguousarray([q[1] for q in queries], float)
    D = np.ascontiguousarray([q[2] for q in queries], float)
    T = np.array([q[3] for q in queries], float)
    out = np.zeros(len(queries))
    _batch(X, D, kinds, float(thickness), T, out)
    worst = np.inf
    for k, toi in enumerate(out):
        d0 = _dist(kinds[k], X[k])
        d1 = _dist(kinds[k], X[k] + toi * D[k])
        assert 0 < toi <= T[k]
        ratio = (d1 - thickness) / (d0 - thickness)
        worst = min(worst, ratio)
        assert ratio >= (1 - S) * (1 - 1e-9), (
            f"query {k} ({'PT' if kinds[k] == PT else 'EE'}): d(toi) - xi = {ratio:.4f} (d0 - xi) "
            f"at toi {toi:.6g} (t_max {T[k]:.6g}); the guarantee is >= {1 - S:.1f}"
        )
    return worst


def _in_window(kind, X, D, thickness, q, t_max=1.0):
    """Scale D so that the unscaled advancement (d0 - xi) / l_p is t_max / q, q in (s, 1)."""
    f0 = _dist(kind, X) - thickness
    D = D * (f0 * q / (t_max * _l_p(kind, D)))
    return (kind, X, D, t_max)


@pytest.mark.parametrize("thickness", [0.0, 1e-3])
def test_head_on_approaches_in_the_rescaling_window(thickness):
    qs = np.linspace(0.905, 0.995, 7)
    queries = []
    tri = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    for t_max in (1.0, 0.37):
        for q in qs:
            # a point falling straight onto a static triangle's interior
            X = np.vstack([[0.2, 0.3, 0.05], tri])
            D = np.zeros((4, 3))
            D[0] = [0.0, 0.0, -1.0]
            queries.append(_in_window(PT, X, D, thickness, q, t_max))
            # the triangle rising to a static point (only the triangle moves)
            D = np.zeros((4, 3))
            D[1:] = [0.0, 0.0, 1.0]
            queries.append(_in_window(PT, X, D, thickness, q, t_max))
            # crossing edges, one moving onto the other
            X = np.array([[-0.5, 0.0, 0.04], [0.5, 0.0, 0.04], [0.0, -0.5, 0.0], [0.0, 0.5, 0.0]])
            D = np.zeros((4, 3))
            D[:2] = [0.0, 0.0, -1.0]
            queries.append(_in_window(EE, X, D, thickness, q, t_max))
    worst = _check(queries, thickness)
    # the head-on queries come close to the bound: the check has teeth
    assert worst < 0.2


@pytest.mark.parametrize("thickness", [0.0, 1e-3])
def test_degenerate_queries_in_the_rescaling_window(thickness):
    queries = []
    for q in (0.91, 0.95, 0.99):
        # parallel edges closing on each other (the line-line distance is undefined)
        X = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.2, 0.03, 0.0], [1.3, 0.03, 0.0]])
        D = np.zeros((4, 3))
        D[2:] = [0.0, -1.0, 0.0]
        queries.append(_in_window(EE, X, D, thickness, q))
        # overlapping collinear-ish: one edge above the other, both moving
        X = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.05], [1.0, 0.0, 0.05]])
        D = np.array([[0.0, 0.0, 0.5], [0.0, 0.0, 0.5], [0.0, 0.0, -0.5], [0.0, 0.0, -0.5]])
        queries.append(_in_window(EE, X, D, thickness, q))
        # a point approaching a triangle's edge (closest feature: the edge) ...
        tri = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        X = np.vstack([[0.5, -0.04, 0.0], tri])
        D = np.zeros((4, 3))
        D[0] = [0.0, 1.0, 0.0]
        queries.append(_in_window(PT, X, D, thickness, q))
        # ... and a triangle's vertex: an edge's end sliding onto the other edge's vertex
        X = np.vstack([[-0.03, -0.03, 0.0], tri])
        D = np.zeros((4, 3))
        D[0] = [1.0, 1.0, 0.0]
        queries.append(_in_window(PT, X, D, thickness, q))
        # an edge whose vertex lies on the other edge's line, moving onto it
        X = np.array([[0.5, 0.05, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
        D = np.zeros((4, 3))
        D[:2] = [0.0, -1.0, 0.0]
        queries.append(_in_window(EE, X, D, thickness, q))
    _check(queries, thickness)


def test_random_queries_in_the_rescaling_window(rng):
    queries = []
    for _ in range(300):
        kind = PT if rng.random() < 0.5 else EE
        X = rng.uniform(-1, 1, size=(4, 3))
        # aim the motion at the other primitive, plus a random part
        target = X[1:].mean(axis=0) if kind == PT else X[2:].mean(axis=0)
        src = X[0] if kind == PT else X[:2].mean(axis=0)
        D = rng.normal(scale=0.3, size=(4, 3))
        if kind == PT:
            D[0] += target - src
        else:
            D[:2] += target - src
        thickness = float(rng.choice([0.0, 1e-3]))
        if _dist(kind, X) <= 2 * thickness + 1e-3:
            continue
        queries.append(_in_window(kind, X, D, thickness, rng.uniform(S + 1e-3, 1.0), float(rng.choice([1.0, 0.5]))))
        queries[-1] = queries[-1] + (thickness,)
    for thickness in (0.0, 1e-3):
        sel = [q[:4] for q in queries if q[4] == thickness]
        _check(sel, thickness)
