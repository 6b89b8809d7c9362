"""Properties of the ADMM midpoint integrator that a wrong implementation fails (issue 12, notes
§5.5-5.10), on a tiny free spinning bar (5 tets, tisim.solvers.admm.verification). The same
check functions, with the same settings, must fail on the mistakes of test_admm_mutations.py.
The statistic each check uses, and its bound, are in tisim/solvers/admm/verification.py."""

from __future__ import annotations

import pytest

from tisim.solvers.admm import verification as V


@pytest.mark.slow
def test_energy_error_has_no_trend_over_5k_steps():
    """5 x 10^3 steps of 2 ms (10 s) of the bar tumbling at 2 rad/s, tolerance 1e-10: a
    line fitted to the means of 20 blocks of the relative energy error has |slope /
    standard error| < 3.92 (two-sided 0.1 % for 18 degrees of freedom; measured 0.08), and
    |error| stays below 1e-3 throughout (measured 4.4e-6). The same run at tolerance 1e-7,
    whose unconverged steps drift, gives t = -12.2: half the 10^4 steps this test took
    before (at 2x its time) still tells the two apart. The faster-spinning bar of the
    other checks does show a trend, the midpoint rule's own (see energy_trend's docstring)."""
    r = V.energy_trend(steps=5_000)
    assert r.passed, (str(r), r.details)
    assert r.details["steps_done"] == 5_000
    assert r.details["amplitude"] > 0  # the energy error is measured, not identically zero


@pytest.mark.slow
def test_trajectory_is_second_order_under_h_halving():
    """Positions at T = 0.1 s with h = 20, 10, 5 ms against h = 0.625 ms (tolerance 1e-11):
    each halving divides the error by 3.5-4.5 (measured: 4.20 and 4.12)."""
    r = V.convergence_order()
    assert r.passed, (str(r), r.details)
    assert min(r.details["errors"]) > 1e3 * 1e-11  # the errors are the method's, not the solver's


def test_time_reversible_to_the_solver_tolerance():
    """50 steps of 10 ms, velocities negated, 50 steps back: the distance to the start is below
    10x the ADMM tolerance (relative to the bar's diagonal) at tolerances 1e-6 and 1e-9, and
    shrinks with the tolerance (by >= 30x for 1000x; measured 960x), while the bar moved by
    more than 1 % of its diagonal in between."""
    r = V.reversibility()
    assert r.passed, (str(r), r.details)


def test_augmented_lagrangian_does_not_increase_over_admm_iterations():
    """At a fixed large rho (20x the rest stiffness), the augmented Lagrangian evaluated after
    each of 60 ADMM iterations of one step never increases by more than 1e-10 of its size,
    and falls overall (notes §5.10)."""
    r = V.sufficient_decrease()
    assert r.passed, (str(r), r.details)
    assert len(r.details["lagrangian"]) == 60


def test_angular_momentum_conserved_to_the_tolerance():
    """200 steps of 10 ms at tolerance 1e-8: |L - L0| / |L0| <= 1e-6 (measured ~1e-8)."""
    r = V.angular_momentum()
    assert r.passed, (str(r), r.details)
