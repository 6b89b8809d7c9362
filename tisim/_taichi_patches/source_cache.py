"""Read a Taichi function's source once, not at every translation.

Why: Taichi 1.7 translates every kernel again in every process (its offline cache skips
only the compilation after it) and re-translates a ``ti.func`` at every call site, each time
reading the function's source with ``inspect`` (a module search and a tokenizer pass; the
same lines every time). Together with ``positions`` that was about half of the front end's
time: a cloth process (64 x 64 drape) got through set-up 4.0-4.4 -> 2.8-3.0 s and its first
frame 1.14 -> 0.63-0.69 s.

Applies to: Taichi 1.7 (``taichi.lang.kernel_impl.getsourcelines`` / ``getsourcefile``).
Results: unchanged (the same source lines, read once).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def install() -> bool:
    """Cache ``kernel_impl.getsourcelines``/``getsourcefile`` per function; returns whether
    the cache is in place (False, with a debug log, where Taichi's internals differ)."""
    try:
        from taichi.lang import kernel_impl
    except ImportError as exc:
        log.debug("Taichi's source reading left as it is: %s", exc)
        return False
    read_lines = getattr(kernel_impl, "getsourcelines", None)
    read_file = getattr(kernel_impl, "getsourcefile", None)
    if read_lines is None or read_file is None:
        log.debug("Taichi's source reading left as it is: not 1.7's kernel_impl")
        return False
    if getattr(read_lines, "_tisim", False):
        return True
    lines: dict = {}
    files: dict = {}

    def getsourcelines(obj):
        if obj not in lines:
            src, start = read_lines(obj)
            lines[obj] = (tuple(src), start)
        src, start = lines[obj]
        return list(src), start

    def getsourcefile(obj):
        if obj not in files:
            files[obj] = read_file(obj)
        return files[obj]

    getsourcelines._tisim = True
    kernel_impl.getsourcelines = getsourcelines
    kernel_impl.getsourcefile = getsourcefile
    return True
