"""Every demo shows its object: the first, middle and last frame, rendered off-screen
with shrunk meshes (tisim.render.montage.quick_sets), each have at least IN_VIEW of their
pixels in the object's colour (toss used to end on an empty table, squeeze-ball with the
ball behind a roller). Needs Vulkan; slow (every demo's full frame count)."""

from __future__ import annotations

import pytest

from tisim.resources import demos_dir


def _demos():
    return sorted(p.stem for p in demos_dir().glob("*.toml"))


@pytest.fixture(scope="module", autouse=True)
def _vulkan():
    from tisim.render import vulkan_available

    if not vulkan_available():
        pytest.skip("no Vulkan driver: nothing to render")


@pytest.mark.slow
@pytest.mark.parametrize("demo", _demos())
def test_the_object_is_in_view_at_the_first_middle_and_last_frame(demo, tmp_path):
    from tisim.render.montage import IN_VIEW, demo_frames, object_pixels, quick_sets

    images, frames, color = demo_frames(demo, quick_sets(demo), tmp_path)
    shown = {f: object_pixels(img, color) for img, f in zip(images, frames)}
    assert all(v >= IN_VIEW for v in shown.values()), shown
