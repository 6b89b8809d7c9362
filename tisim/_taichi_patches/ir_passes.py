"""Taichi's IR optimisation passes left out of the kernels that gain nothing from them, on
the CPU backend (installed by ``backend.init`` through ``light_compile()``).

Taichi runs its own optimisation passes over a kernel's IR (``advanced_optimization``:
whole-kernel common subexpressions, control-flow store forwarding, iterated
simplification) before LLVM optimises the code again at -O3. For the real-time and
conservative solvers' kernels (a tet's rotation extraction with its half-turn guard and
SVD, the ADMM proximal steps, the contact update) those passes took most of the compile
time and bought no speed: a fresh machine's first two frames (every kernel compiled) took
11-12 s with them and 3-6 s without, at the same frame time afterwards
(``benchmarks/bench_compile.py``). The cloth's kernels (shell, barrier, CCD) ran 7-10%
slower without them, so modules in ``KEEP_PASSES`` keep them; so does every other backend.

The switch is Taichi's own config, read when a kernel compiles: it is turned off for the
first launch of a kernel outside ``KEEP_PASSES`` (its compile, or its load from the offline
cache, whose key includes the setting) and back on after it. A compiled kernel keeps what
it was compiled with. Results agree to round-off either way (the last bits of a few
operations differ: ``tests/unit/test_backend.py``); ``TISIM_TAICHI_IR_OPT=1`` keeps the passes on for every
kernel, ``=0`` turns them off for every kernel, on any backend (the benchmark, and the
Vulkan test of a compile-bound scene).

Applies to: Taichi 1.7 (``Kernel.launch_kernel``, ``CompileConfig.advanced_optimization``).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

# modules whose kernels keep the passes (measured faster with them)
KEEP_PASSES = ("tisim.solvers.cloth", "tisim.contact.ipc", "tisim.energies", "tisim.progressive", "tisim.linalg")
ENV = "TISIM_TAICHI_IR_OPT"


def keeps_passes(module: str) -> bool:
    """Whether kernels defined in ``module`` compile with Taichi's IR passes."""
    forced = os.environ.get(ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return module.startswith(KEEP_PASSES)


def install() -> bool:
    """Wrap ``Kernel.launch_kernel`` (once per process); returns whether it is in place."""
    try:
        from taichi.lang import impl, kernel_impl
    except ImportError:  # pragma: no cover - another Taichi
        return False
    K = kernel_impl.Kernel
    original = K.launch_kernel
    if getattr(original, "_tisim", False):
        return True
    if not hasattr(impl.default_cfg(), "advanced_optimization"):  # pragma: no cover
        log.debug("Taichi's config has no advanced_optimization: IR passes left as they are")
        return False

    def launch_kernel(self, t_kernel, *args):
        done = self.__dict__.setdefault("_tisim_compiled", set())
        if id(t_kernel) in done:
            return original(self, t_kernel, *args)
        done.add(id(t_kernel))
        light = self.__dict__.get("_tisim_light")
        if light is None:
            light = self._tisim_light = not keeps_passes(getattr(self.func, "__module__", "") or "")
        if not light:
            return original(self, t_kernel, *args)
        cfg = impl.current_cfg()
        before = cfg.advanced_optimization
        cfg.advanced_optimization = False
        try:
            return original(self, t_kernel, *args)
        finally:
            cfg.advanced_optimization = before

    launch_kernel._tisim = True
    launch_kernel.__doc__ = original.__doc__
    K.launch_kernel = launch_kernel
    return True
