"""Variational (midpoint-rule) elastodynamics solved per step by ADMM.

``config`` is Taichi-free (read by the scene loader); ``prox`` holds the per-element
operators as Taichi functions, ``kernels`` the element/vertex kernels and
``solver`` the :class:`~tisim.solvers.admm.solver.SolverADMM` orchestration;
``verification`` the checks (energy trend, order, reversibility, sufficient decrease,
angular momentum) that the tests run on the solver and on deliberately wrong variants of it.
"""
