"""tisim: a Taichi-based simulation sandbox for soft bodies and cloth.

Importing this package is cheap: Taichi is imported and initialised only by
:mod:`tisim.backend`, on demand.
"""

from __future__ import annotations

__version__ = "0.1.0"

# The Python API (tisim.api), loaded on first use so that ``import tisim`` stays instant
# and imports neither Taichi nor pandas.
_API = ("load", "compare", "sweep", "demos", "Simulation", "Result", "Clip", "Comparison")

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from tisim import api

        return getattr(api, name)
    raise AttributeError(f"module 'tisim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
