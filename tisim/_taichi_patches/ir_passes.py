"""Taichi's IR optimisation passes left out of the kernels that gain nothing from them, on
the CPU and Vulkan backends (installed by ``backend.init`` through ``light_compile()``).

Taichi runs its own optimisation passes over a kernel's IR (``advanced_optimization``:
whole-kernel common subexpressions, control-flow store forwarding, iterated
simplification) before LLVM optimises the code again at -O3. For the real-time and
conservative solvers' kernels (a tet's rotation extraction with its half-turn guard and
SVD, the ADMM proximal steps, the contact update) those passes took most of the compile
time and bought no speed: a fresh machine's first two frames (every kernel compiled) took
11-12 s with them and 3-6 s without, at the same frame time afterwards
(``benchmarks/bench_compile.py``). The cloth's kernels (shell, bending, broad phase) ran
7-10% slower without them, so modules in ``KEEP_PASSES`` keep them. Inside those modules,
the kernels in ``LIGHT`` do not: the contact barrier's per-pair kernels and the pair
scatters took 1-8 s each to compile with the passes (0.2-0.9 s without), most of a cold
cloth run's compile (a 20-frame cloth-drape's first launches: 26 s with every cloth
kernel's passes, 8.6 s without these), and ran no slower without them (Taichi's kernel
profiler, 30 contact frames of refine-drape at 289 vertices: together under 0.1 ms a frame
either way). Vulkan follows the same policy (``backend.LIGHT_COMPILE_ARCHS``): on lavapipe
the test scenes' first frames took 148.7 s with every pass and 82.6 s with it, and their
later frames ran no slower. CUDA keeps every pass until a GPU measures its kernels without
them.

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
# kernels of those modules that compile without them: dear to compile, cheap to run
LIGHT = frozenset(
    {
        "tisim.contact.ipc.potential._barrier_gradient",
        "tisim.contact.ipc.potential._barrier_hessians",
        "tisim.contact.ipc.potential._barrier_energy",
        "tisim.contact.ipc.potential._barrier_classify",
        "tisim.contact.ipc.potential._pair_stats",
        "tisim.contact.ipc.potential._barrier_friction_energy",
        "tisim.contact.ipc.potential._barrier_friction_gradient",
        "tisim.contact.ipc.friction_potential._friction_update",
        "tisim.solvers.cloth.assembly_kernels.scatter_pairs",
        "tisim.solvers.cloth.assembly_kernels.emit_outside",
        "tisim.solvers.cloth.assembly_kernels.scatter_two",
    }
)
ENV = "TISIM_TAICHI_IR_OPT"


def keeps_passes(module: str, name: str = "") -> bool:
    """Whether the kernel ``name`` defined in ``module`` compiles with Taichi's IR passes."""
    forced = os.environ.get(ENV)
    if forced in ("0", "1"):
        return forced == "1"
    return module.startswith(KEEP_PASSES) and f"{module}.{name}" not in LIGHT


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
            func = self.func
            light = self._tisim_light = not keeps_passes(
                getattr(func, "__module__", "") or "", getattr(func, "__qualname__", "") or ""
            )
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
