"""Solvers selected by name (``solver.type`` in a scene).

Entries name modules lazily so that reading a scene never imports Taichi: a
solver's config dataclass lives in a light ``config`` module next to it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from tisim.config import ConfigError


@dataclass(frozen=True)
class SolverEntry:
    name: str
    solver: object  # "module:Class", or the class itself (plugins, tests)
    config: object  # "module:Class" importable without Taichi, or the class
    summary: str


_ENTRIES: dict[str, SolverEntry] = {}


def register(name: str, solver, config, summary: str = "") -> None:
    """Make a solver selectable as ``solver.type = name``. ``solver`` and ``config``
    are "module:Class" references (imported on first use) or classes."""
    _ENTRIES[name] = SolverEntry(name, solver, config, summary)


def unregister(name: str) -> None:
    _ENTRIES.pop(name, None)


def _load(ref):
    if not isinstance(ref, str):
        return ref
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


def names() -> list[str]:
    return sorted(_ENTRIES)


def entries() -> list[SolverEntry]:
    return [_ENTRIES[n] for n in names()]


def _entry(name: str) -> SolverEntry:
    if name not in _ENTRIES:
        raise ConfigError("solver.type", f"unknown solver {name!r}: expected one of {', '.join(names())}")
    return _ENTRIES[name]


def solver_config_class(name: str):
    return _load(_entry(name).config)


def solver_class(name: str):
    return _load(_entry(name).solver)


register(
    "pd",
    "tisim.solvers.pd.solver:SolverPD",
    "tisim.solvers.pd.config:PDConfig",
    "real-time local-global (projective dynamics) with sparse-inverse global step and NCP contact",
)
register(
    "admm",
    "tisim.solvers.admm.solver:SolverADMM",
    "tisim.solvers.admm.config:ADMMConfig",
    "variational midpoint integrator solved by ADMM (momentum-exact, inversion-free)",
)
register(
    "implicit-euler",
    "tisim.solvers.baselines.implicit_euler:SolverImplicitEuler",
    "tisim.solvers.baselines.config:ImplicitEulerConfig",
    "baseline: backward Euler, Newton with line search and projected Hessians",
)
register(
    "xpbd",
    "tisim.solvers.baselines.xpbd:SolverXPBD",
    "tisim.solvers.baselines.config:XPBDConfig",
    "baseline: extended position-based dynamics",
)
register(
    "cloth",
    "tisim.solvers.cloth.solver:SolverCloth",
    "tisim.solvers.cloth.config:ClothConfig",
    "cloth and shells: implicit Euler by projected Newton with C-IPC contact (intersection-free)",
)
