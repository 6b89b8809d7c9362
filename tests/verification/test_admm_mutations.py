"""Mutation check of the ADMM verification (issue 12): three plausible implementation mistakes,
each swapped into the solver, and the checks of tests/verification/test_admm_properties.py
(tisim.solvers.admm.verification, with the same settings) must fail on each.

* ``velocity``: the finite-difference velocity v = (q - x0)/h instead of the midpoint
  recursion v = 2 (q - x0)/h - v0 (first order, not symmetric; linear momentum stays exact
  because G 1 = 0, which is why the momentum test alone cannot see it);
* ``dual-sign``: the dual update Y <- Y - rho (F - R S) (a sign slip in the kernel; the source
  of kernels.py is mutated and loaded as a separate module, like a mutation-testing tool);
* ``q-step-rho-half``: the q-step matrix with rho/2 G^T G instead of rho/4 (forgetting that
  q_mid = (q^k + q)/2 halves G q; the notes' consistency note): A no longer matches B, so
  the q-step stops minimising the augmented Lagrangian and the fixed point moves.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tisim.solvers.admm import kernels
from tisim.solvers.admm import solver as solver_module
from tisim.solvers.admm import verification as V
from tisim.solvers.admm.solver import SolverADMM

_DUAL = "        Yn = Yold + re * D\n"


def _mutated_kernels(tmp_path: Path):
    """kernels.py with the dual update's sign flipped, imported from a copy (Taichi compiles
    its kernels from that file)."""
    src = Path(kernels.__file__).read_text()
    assert src.count(_DUAL) == 1, "the dual update line of kernels.py changed: update the mutation"
    path = tmp_path / "admm_kernels_dual_sign_mutant.py"
    path.write_text(src.replace(_DUAL, _DUAL.replace("+ re * D", "- re * D")))
    spec = importlib.util.spec_from_file_location("admm_kernels_dual_sign_mutant", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def apply_mutation(name: str, monkeypatch, tmp_path):
    """Swap the mistake ``name`` in; returns the solver factory the checks should use."""
    if name == "velocity":
        monkeypatch.setattr(solver_module, "midpoint_velocity", lambda q, x0, v0, h: (q - x0) / h)
        return None
    if name == "dual-sign":
        mutant = _mutated_kernels(tmp_path)

        def factory(model, config):
            s = SolverADMM(model, config)
            s._K = mutant
            return s

        return factory
    if name == "q-step-rho-half":
        real = SolverADMM.global_matrix
        monkeypatch.setattr(
            SolverADMM, "global_matrix", lambda self, h: (real(self, h) + self._rho_factor * self._L0).tocsr()
        )
        return None
    raise KeyError(name)


# the checks with the settings of test_admm_properties.py
CHECKS = {
    "energy-trend": lambda f: V.energy_trend(solver_factory=f),
    "order": lambda f: V.convergence_order(solver_factory=f),
    "reversibility": lambda f: V.reversibility(solver_factory=f),
    "sufficient-decrease": lambda f: V.sufficient_decrease(solver_factory=f),
    "angular-momentum": lambda f: V.angular_momentum(solver_factory=f),
}

# which checks catch which mistake (measured). The velocity mistake passes the sufficient-
# decrease check (a property of the ADMM iterations within one step, which it does not touch).
# dual-sign makes every step blow up (non-finite iterates), so every check fails through its
# convergence requirement; q-step-rho-half converges to a wrong fixed point within a few steps
# (energy +108 % in the first step) and stalls soon after.
CAUGHT = {
    "velocity": ["energy-trend", "order", "reversibility", "angular-momentum"],
    "dual-sign": ["energy-trend", "order", "reversibility", "sufficient-decrease", "angular-momentum"],
    "q-step-rho-half": ["energy-trend", "order", "reversibility", "sufficient-decrease", "angular-momentum"],
}

# a few seconds each on an idle machine; the others run 10^2-10^4 steps, or a mutant that stalls
# (two capped attempts per check), or compile the mutated kernels: marked slow
_FAST = {("velocity", "reversibility"), ("velocity", "angular-momentum")}


def _cases():
    for mutation, checks in CAUGHT.items():
        for check in checks:
            marks = [] if (mutation, check) in _FAST else [pytest.mark.slow]
            yield pytest.param(mutation, check, id=f"{mutation}-{check}", marks=marks)


@pytest.mark.parametrize("mutation, check", list(_cases()))
def test_mutation_fails_the_check(mutation, check, monkeypatch, tmp_path):
    factory = apply_mutation(mutation, monkeypatch, tmp_path)
    result = CHECKS[check](factory)
    assert not result.passed, f"{mutation} passed {result}: {result.details}"


@pytest.mark.slow
def test_the_mutations_leave_the_unmutated_solver_alone(monkeypatch, tmp_path):
    """Undoing the monkeypatches restores the solver: the fast checks pass again (the
    failures above are the mutations', not a broken set-up)."""
    with monkeypatch.context() as mp:
        apply_mutation("velocity", mp, tmp_path)
        assert not V.reversibility().passed
    assert V.reversibility().passed
    assert V.angular_momentum().passed
