"""Compile every kernel loop as a serial loop (the CPU backend on one thread).

Why: Taichi hands every parallel loop to its thread pool even with one thread, and the
hand-off (wake the worker, wait for it) costs about 70-90 us on 2-core machines against
3 us for a serial loop. ``backend.init`` installs this only when the CPU backend runs on
one thread (or ``TISIM_SERIAL_LOOPS=1``, as a resumed refine's run.json asks).

Applies to: Taichi 1.7 (``ASTTransformer.build_For``, ``misc._parallelize``).
Results: the same up to LLVM's optimisation of a serial loop body (1.7e-10 m after two
cloth steps), which is why a resumed run compiles its loops as the interrupted one did.
"""

from __future__ import annotations

import ast
import logging

from tisim._taichi_patches import enabled

log = logging.getLogger(__name__)


def install() -> bool:
    """Compile every kernel's loops as serial loops: for the CPU backend on one thread
    (TI_CPU_MAX_NUM_THREADS=1: the pipelined refine's processes on 2 cores, ``refine
    --deterministic``, a user's choice). Taichi hands every parallel loop to its thread
    pool even with one thread, and the hand-off (wake the worker, wait for it) costs
    about 70-90 us on these 2-core machines against 3 us for a serial loop: an empty
    parallel kernel launch 92-113 us, serial 13-20 us. The cloth's Newton iteration
    launches about 28 parallel loops, a coarse preview's frame about 170.

    The same values to the last bit? Mostly: a parallel loop on one or several threads
    gives the same bits (the float sums are serial already, ``SERIAL_SUMS``), but LLVM
    optimises a serial loop's body differently under Taichi's fast math (the membrane's
    Hessian kernel: a cloth differed by 1.7e-10 m after two steps). So a run continued
    with ``--resume`` compiles its loops as the interrupted one did (TISIM_SERIAL_LOOPS,
    from its run.json), whatever its thread count. Returns whether the loops are
    serialized (False, with a debug log, where Taichi's front end differs from 1.7's)."""
    if not enabled():
        log.debug("kernel loops left parallel: TISIM_PLAIN_TAICHI=1")
        return False
    try:
        from taichi.lang import misc
        from taichi.lang.ast.ast_transformer import ASTTransformer
    except ImportError as exc:
        log.debug("kernel loops left parallel: %s", exc)
        return False
    parallelize = getattr(misc, "_parallelize", None)
    build_for = getattr(ASTTransformer, "build_For", None)
    if parallelize is None or build_for is None or not hasattr(ASTTransformer, "get_decorator"):
        log.debug("kernel loops left parallel: Taichi's front end is not 1.7's")
        return False
    if getattr(build_for, "_tisim", False):
        return True

    def build_For(ctx, node):
        # as ti.loop_config(serialize=True) before a range or ndrange loop (a loop inside
        # another is serial anyway; a ti.static loop is unrolled; Taichi warns that a loop
        # over a field's cells does not serialize, and we have none that matter)
        it = node.iter
        deco = ASTTransformer.get_decorator(ctx, it)
        ranged = isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
        if deco == "grouped" and len(it.args) == 1:
            deco = ASTTransformer.get_decorator(ctx, it.args[0])
        if ranged or deco == "ndrange":
            parallelize(1)
        return build_for(ctx, node)

    build_For._tisim = True
    ASTTransformer.build_For = staticmethod(build_For)
    return True
