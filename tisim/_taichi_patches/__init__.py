"""Every change tisim makes to Taichi's internals, in one place, behind one switch.

Taichi 1.7's Python front end and launch path cost more than many of tisim's kernels take
to run, so ``backend.init`` installs five patches, each in its own module with its reason:

- ``source_cache``: a function's source read once, not at every translation;
- ``positions``: short source positions in the AST translation (not with ``--debug``);
- ``launch``: a shorter Python path for kernel launches (not with ``--debug``);
- ``serial_loops``: kernel loops compiled serial on a one-thread CPU backend (installed
  by ``backend.init`` through ``serialize_loops()`` only in that case);
- ``ir_passes``: Taichi's IR optimisation passes left out of the kernels that compile
  slowly with them and run no faster, on the CPU and Vulkan backends (``light_compile()``;
  on any backend for every kernel with ``TISIM_TAICHI_IR_OPT=0``).

All apply to Taichi 1.7 only (``SUPPORTED``): on another version, or with the environment
variable ``TISIM_PLAIN_TAICHI=1``, none is installed and tisim runs on plain Taichi, with
the same results (``tests/unit/test_taichi_patches.py`` runs a scene both ways) and slower
start-up and launches. Each patch also checks the internals it replaces and steps aside,
with a debug log, where they are not what it expects.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

# Taichi (major, minor) versions whose internals the patches were written against
SUPPORTED = ((1, 7),)
PLAIN_ENV = "TISIM_PLAIN_TAICHI"

# which patches are in place in this process (read by tests and `tisim info`)
installed: dict[str, bool] = {}


def taichi_version() -> tuple[int, int, int]:
    import taichi as ti

    return tuple(ti.__version__)[:3]


def enabled() -> bool:
    """Whether the patches may be installed: not switched off by ``TISIM_PLAIN_TAICHI=1``
    and a Taichi version in ``SUPPORTED``."""
    if os.environ.get(PLAIN_ENV, "") not in ("", "0"):
        return False
    version = taichi_version()
    if version[:2] not in SUPPORTED:
        log.debug("Taichi %s: patches for %s not installed", version, SUPPORTED)
        return False
    return True


def install(*, debug: bool = False) -> dict[str, bool]:
    """Install the patches that apply (before ``ti.init``); returns which are in place.

    debug: keep Taichi's own launch path and full source positions in compile errors.
    """
    if not enabled():
        installed.update(source_cache=False, positions=False, launch=False)
        return dict(installed)
    from tisim._taichi_patches import launch, positions, source_cache

    installed["source_cache"] = source_cache.install()
    installed["positions"] = False if debug else positions.install()
    installed["launch"] = False if debug else launch.install()
    return dict(installed)


def serialize_loops() -> bool:
    """Compile every kernel loop serial (the CPU backend on one thread); returns whether
    they are (False on plain Taichi)."""
    from tisim._taichi_patches import serial_loops

    installed["serial_loops"] = serial_loops.install()
    return installed["serial_loops"]


def light_compile() -> bool:
    """Compile the kernels outside ``ir_passes.KEEP_PASSES`` without Taichi's IR passes
    (the backends in ``backend.LIGHT_COMPILE_ARCHS``); returns whether the patch is in place (False on plain Taichi)."""
    if not enabled():
        return False
    from tisim._taichi_patches import ir_passes

    installed["ir_passes"] = ir_passes.install()
    return installed["ir_passes"]
