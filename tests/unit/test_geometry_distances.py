"""The numpy primitive distances used in start-up messages, against IPC Toolkit."""

import numpy as np
import pytest

from tisim.geometry.distances import point_triangle_distance, segment_segment_distance

ipctk = pytest.importorskip("ipctk")


def test_point_triangle_against_ipctk():
    rng = np.random.default_rng(3)
    cases = [rng.normal(size=(4, 3)) for _ in range(300)]
    a, b, c = np.eye(3)
    cases += [np.array([p, a, b, c]) for p in ((a + b) / 2, a, (a + b + c) / 3, (a + b) / 2 + [0, 0, 1e-9])]
    cases.append(np.array([[0.3, 0.2, 1.0], [0, 0, 0], [1, 0, 0], [2, 0, 0]]))  # a degenerate triangle
    for p, t0, t1, t2 in cases:
        ref = np.sqrt(ipctk.point_triangle_distance(p, t0, t1, t2))
        assert point_triangle_distance(p, t0, t1, t2) == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_segment_segment_against_ipctk():
    rng = np.random.default_rng(4)
    cases = [rng.normal(size=(4, 3)) for _ in range(300)]
    cases += [
        np.array([[0, 0, 0], [1, 0, 0], [0.5, 1, 0], [1.5, 1, 0]], float),  # parallel, overlapping
        np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0]], float),  # collinear, apart
        np.array([[0, 0, 0], [1, 0, 0], [0.5, 0, 0], [0.5, 1, 0]], float),  # touching
        np.array([[0, 0, 0], [0, 0, 0], [0, 1, 0], [1, 1, 0]], float),  # a point as an edge
    ]
    for a0, a1, b0, b1 in cases:
        ref = np.sqrt(ipctk.edge_edge_distance(a0, a1, b0, b1))
        assert segment_segment_distance(a0, a1, b0, b1) == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_batched_distances_match_the_single_ones_and_ipctk():
    """The batched twins on random pairs, near-parallel and degenerate ones included."""
    from tisim.geometry.distances import point_triangle_distances, segment_segment_distances

    rng = np.random.default_rng(7)
    k = 400
    P = rng.normal(size=(4, k, 3))
    P[3, :50] = P[2, :50] + 1e-9 * rng.normal(size=(50, 3))  # near-degenerate last primitive
    P[1, 50:100] = P[0, 50:100] + (P[3, 50:100] - P[2, 50:100])  # parallel edges
    pt = point_triangle_distances(*P)
    ee = segment_segment_distances(*P)
    for i in range(k):
        assert pt[i] == pytest.approx(np.sqrt(ipctk.point_triangle_distance(*P[:, i])), rel=1e-9, abs=1e-12)
        assert ee[i] == pytest.approx(segment_segment_distance(*P[:, i]), rel=1e-9, abs=1e-12)
