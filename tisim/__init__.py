"""tisim: a Taichi-based simulation sandbox for soft bodies and cloth.

Importing this package is cheap: Taichi is imported and initialised only by
:mod:`tisim.backend`, on demand.
"""

from __future__ import annotations

__version__ = "0.1.0"
