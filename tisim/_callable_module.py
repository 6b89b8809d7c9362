"""Modules that are also the API function of their name: ``tisim.compare(...)`` and
``tisim.sweep(...)``.

``tisim.compare`` is a submodule (the library code of ``tisim compare``), and the import
system sets the package's attribute to the module when it is first imported, whatever
``tisim/__init__.py`` put there. So the module itself is made callable: calling it calls
:func:`tisim.compare.run_comparison` (resp. :func:`tisim.sweep.run_grid`), which
:func:`tisim.api.compare` and :func:`tisim.api.sweep` call too, and its attributes stay reachable
(``tisim.compare.summarize``, ``mock.patch("tisim.sweep.run_task")``).
"""

from __future__ import annotations

import sys
import types


def make_callable(module_name: str, function_name: str) -> None:
    """Make the module ``module_name`` callable as its own ``function_name`` (the API's
    implementation lives in the module, so calling it imports nothing above it)."""

    class _CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return getattr(self, function_name)(*args, **kwargs)

    _CallableModule.__call__.__doc__ = f"{module_name}.{function_name} (see its docstring)"
    sys.modules[module_name].__class__ = _CallableModule
