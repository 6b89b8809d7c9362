"""Where the bundled demos and assets are.

An installed wheel carries them as package data, ``tisim/_demos/*.toml`` and
``tisim/_assets/*`` (setup.py maps the source tree's ``demos/`` and ``assets/``
there), found through :mod:`importlib.resources`. A source checkout (an editable
install, or running from the tree) has no such folders inside the package and
uses the repository's ``demos/`` and ``assets/`` instead, so both layouts work
with the same code.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _data_dir(packaged: str, source: str) -> Path:
    inside = files("tisim") / packaged
    if inside.is_dir():
        # wheels install unpacked, so this is a real folder: scenes name their files by path
        return Path(str(inside))
    return Path(__file__).resolve().parent.parent / source


def demos_dir() -> Path:
    """The folder of the bundled demo scenes (``NAME.toml``)."""
    return _data_dir("_demos", "demos")


def assets_dir() -> Path:
    """The folder of the bundled meshes (``assets/`` in the source tree)."""
    return _data_dir("_assets", "assets")


def demo_path(name: str) -> Path:
    """The scene file of the demo ``name`` (it may not exist)."""
    return demos_dir() / f"{name}.toml"
