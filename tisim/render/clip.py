"""A video file that plays inline in Jupyter."""

from __future__ import annotations

import base64
from pathlib import Path


class Clip:
    """A video file that plays inline in Jupyter (an HTML5 ``<video>`` with the MP4
    embedded) and prints as its path elsewhere.

    Attributes:
        path: the MP4 file.
    """

    def __init__(self, path: str | Path, *, width: int | None = None):
        self.path = Path(path)
        self.width = width

    def _repr_html_(self) -> str:
        data = base64.b64encode(self.path.read_bytes()).decode("ascii")
        w = f' width="{int(self.width)}"' if self.width else ""
        return f'<video controls loop autoplay muted playsinline{w} src="data:video/mp4;base64,{data}"></video>'

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"Clip({str(self.path)!r})"
