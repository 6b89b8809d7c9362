"""Solvers: one sub-package each, selected by name through :mod:`tisim.solvers.registry`."""
