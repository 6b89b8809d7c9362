"""Modules that are also the API function of their name: ``tisim.compare(...)`` and
``tisim.sweep(...)``.

``tisim.compare`` is a submodule (the library code of ``tisim compare``), and the import
system sets the package's attribute to the module when it is first imported, whatever
``tisim/__init__.py`` put there. So the module itself is made callable: calling it calls
:func:`tisim.api.compare` (resp. ``sweep``), and its attributes stay reachable
(``tisim.compare.summarize``, ``mock.patch("tisim.sweep.run_task")``).
"""

from __future__ import annotations

import sys
import types


def make_callable(module_name: str, api_name: str) -> None:
    """Make the module ``module_name`` callable as ``tisim.api.<api_name>``."""

    class _CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            from tisim import api

            return getattr(api, api_name)(*args, **kwargs)

    _CallableModule.__call__.__doc__ = f"tisim.api.{api_name} (see its docstring)"
    sys.modules[module_name].__class__ = _CallableModule
