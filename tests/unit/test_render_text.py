"""Text drawn into images (tisim.render.text): real pixels, in the asked corner."""

import numpy as np

from tisim.render.text import draw_text


def test_text_lands_in_the_named_corner_and_nowhere_else():
    img = np.full((200, 400, 3), 90, np.uint8)
    out = draw_text(img, ["t = 1.00 s", "contact.mu = 0.20"], anchor="top-right")
    changed = np.any(out != 90, axis=-1)
    rows, cols = np.nonzero(changed)
    assert changed.sum() > 200  # glyphs and their box
    assert cols.min() > 200 and rows.max() < 100  # the right half, the top
    assert np.array_equal(img, np.full((200, 400, 3), 90, np.uint8))  # the input is untouched


def test_float_and_rgba_images_keep_their_layout():
    img = np.zeros((100, 100, 4), np.float32)
    out = draw_text(img, ["x"], background=None)
    assert out.dtype == np.uint8 and out.shape == (100, 100, 4)
    assert out[..., :3].max() > 128  # the glyph, white on black
