"""tisim: a Taichi-based simulation sandbox for soft bodies and cloth.

Importing this package is cheap: Taichi is imported and initialised only by
:mod:`tisim.backend`, on demand.
"""

from __future__ import annotations

__version__ = "0.1.0"

# The Python API (tisim.api), loaded on first use so that ``import tisim`` stays instant
# and imports neither Taichi nor pandas.
# ``compare`` and ``sweep`` are also submodules: the modules themselves are callable as
# the API functions (tisim._callable_module), so tisim.compare(...) works either way.
_API = ("load", "demos", "Simulation", "Result", "Clip", "Comparison")
_CALLABLE_MODULES = ("compare", "sweep")

__all__ = ["__version__", *_API, *_CALLABLE_MODULES]


def __getattr__(name: str):
    if name in _API:
        from tisim import api

        return getattr(api, name)
    if name in _CALLABLE_MODULES:
        import importlib

        return importlib.import_module(f"tisim.{name}")
    raise AttributeError(f"module 'tisim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, *_CALLABLE_MODULES])
