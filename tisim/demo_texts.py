"""The bundled demos' texts: name, description and what to look for.

Read from each demo's ``[scene]`` table (``description``, ``look_for``) without
validating the whole scene or importing Taichi, so ``tisim demo --list`` is instant;
every demo's full validation is tested in tests/demos.
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

UNREADABLE = "(unreadable scene file)"


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as single spaces."""
    return " ".join(str(text).split())


def demo_text(path: Path) -> tuple[str, str]:
    """(description, look_for) of the scene file ``path``, each on one line ("" when
    absent); a file that cannot be read gives :data:`UNREADABLE` as its description."""
    try:
        scene = tomllib.loads(Path(path).read_text()).get("scene", {})
    except Exception:  # a broken demo file still shows up in the list
        return UNREADABLE, ""
    if not isinstance(scene, dict):
        return UNREADABLE, ""
    return one_line(scene.get("description", "")), one_line(scene.get("look_for", ""))


def demo_texts() -> list[tuple[str, str, str]]:
    """(name, description, look_for) of every bundled demo, sorted by name."""
    from tisim.resources import demos_dir

    return [(p.stem, *demo_text(p)) for p in sorted(demos_dir().glob("*.toml"))]
