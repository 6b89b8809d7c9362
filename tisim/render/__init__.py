"""Rendering behind one viewer interface (numpy in, no solver knowledge).

``make_viewer("live" | "offscreen" | "none")`` builds a viewer; ``Viewer``,
``ViewInfo`` and ``ViewerEvents`` describe the interface (``base.py``).
Importing this package does not import Taichi; the GGUI viewers import it when
they are opened.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tisim.render.base import (
    NullViewer,
    Viewer,
    ViewerEvents,
    ViewerUnavailable,
    ViewInfo,
    display_available,
    vulkan_available,
)
from tisim.render.video import FrameWriter

log = logging.getLogger(__name__)

MODES = ("live", "offscreen", "none")

__all__ = [
    "MODES",
    "FrameWriter",
    "NullViewer",
    "ViewInfo",
    "Viewer",
    "ViewerEvents",
    "ViewerUnavailable",
    "display_available",
    "make_viewer",
    "vulkan_available",
]


def make_viewer(
    mode: str,
    *,
    out_dir: str | Path | None = None,
    fps: float = 30.0,
    fallback: bool = False,
) -> Viewer:
    """A viewer for ``mode``.

    "live": a GGUI window (needs a display and Vulkan). "offscreen": GGUI without a
    window (needs Vulkan); with ``out_dir`` every drawn frame is written to
    ``out_dir/frames/frame_NNNNN.png`` and ``close()`` encodes
    ``out_dir/video.mp4`` at ``fps`` frames per second. "none": draws nothing.

    When the mode cannot run here, raises ``ViewerUnavailable`` with the reason,
    or with ``fallback=True`` logs a warning and degrades live -> offscreen ->
    none.
    """
    if mode not in MODES:
        raise ValueError(f"unknown viewer mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "live":
        reason = None
        if not display_available():
            reason = "no display ($DISPLAY / $WAYLAND_DISPLAY unset)"
        elif not vulkan_available():
            reason = "Vulkan is not available (install a Vulkan driver, e.g. mesa-vulkan-drivers)"
        if reason is None:
            from tisim.render.ggui import GGUIViewer

            return GGUIViewer()
        if not fallback:
            raise ViewerUnavailable(f"cannot open a live window: {reason}")
        log.warning("cannot open a live window (%s); rendering off-screen instead", reason)
        mode = "offscreen"
    if mode == "offscreen":
        if vulkan_available():
            from tisim.render.offscreen import OffscreenRenderer

            frames = FrameWriter(out_dir, fps=fps) if out_dir is not None else None
            return OffscreenRenderer(frames=frames)
        reason = "Vulkan is not available (install a Vulkan driver, e.g. mesa-vulkan-drivers)"
        if not fallback:
            raise ViewerUnavailable(f"cannot render off-screen: {reason}")
        log.warning("cannot render off-screen (%s); not rendering", reason)
    return NullViewer()
