"""Text drawn into rendered images: overlays, panel labels, plot-free captions.

GGUI's canvas has no text outside its ImGui panel, and a rendered frame is a numpy
image, so labels are drawn on the image with Pillow (a dependency of imageio and
matplotlib already). The font is Pillow's built-in scalable one, so the same text
looks the same on every machine, with or without system fonts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has only the small bitmap font
        return ImageFont.load_default()


def draw_text(
    image: np.ndarray,
    lines: Sequence[str],
    *,
    origin: tuple[int, int] = (8, 8),
    size: int | None = None,
    color: tuple[int, int, int] = (255, 255, 255),
    background: tuple[int, int, int] | None = (0, 0, 0),
    opacity: float = 0.55,
    anchor: str = "top-left",
) -> np.ndarray:
    """A copy of ``image`` with ``lines`` written in a block, one line each.

    image: (h, w, 3) or (h, w, 4) uint8 (float images in [0, 1] are accepted and
    returned as uint8). origin: pixels from the corner named by ``anchor``
    ("top-left", "top-right", "bottom-left", "bottom-right"). size: the font's
    height in pixels (default: 1/40 of the image's height, at least 11).
    background: a box behind the text, blended with ``opacity`` (None: no box).
    """
    from PIL import Image, ImageDraw

    img = np.asarray(image)
    if img.dtype != np.uint8:
        img = (np.clip(img, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
    h, w = img.shape[:2]
    if not lines:
        return img.copy()
    size = size or max(11, h // 40)
    font = _font(size)
    base = Image.fromarray(img[..., :3]).convert("RGBA")
    layer = Image.new("RGBA", base.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    spacing = max(2, size // 4)
    boxes = [draw.textbbox((0, 0), line, font=font) for line in lines]
    width = max(b[2] for b in boxes)
    height = len(lines) * size + (len(lines) - 1) * spacing
    pad = max(3, size // 3)
    ox, oy = origin
    x0 = ox if "left" in anchor else w - ox - width - 2 * pad
    y0 = oy if "top" in anchor else h - oy - height - 2 * pad
    if background is not None:
        draw.rectangle(
            [x0, y0, x0 + width + 2 * pad, y0 + height + 2 * pad], fill=(*background, int(round(255 * opacity)))
        )
    for i, line in enumerate(lines):
        draw.text((x0 + pad, y0 + pad + i * (size + spacing)), line, font=font, fill=(*color, 255))
    out = np.asarray(Image.alpha_composite(base, layer).convert("RGB"))
    if img.shape[-1] == 4:
        out = np.concatenate([out, img[..., 3:4]], axis=-1)
    return out
