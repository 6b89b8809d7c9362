"""Labelled side-by-side videos: tisim compare's (integrator, time, energy on each panel)
and the refine's levels.mp4 (level, vertices, ms/frame): the label regions hold text."""

from __future__ import annotations

import json

import imageio.v3 as iio
import numpy as np
import pytest
from typer.testing import CliRunner

from tisim.compare import panel_labels
from tisim.render import vulkan_available
from tisim.render.video import ffmpeg_exe, write_side_by_side

needs_vulkan = pytest.mark.skipif(not vulkan_available(), reason="no Vulkan driver for off-screen rendering")

GREY = 90


def _frames(folder, n, h=96, w=128):
    folder.mkdir(parents=True)
    paths = []
    for i in range(n):
        p = folder / f"frame_{i:05d}.png"
        iio.imwrite(p, np.full((h, w, 3), GREY, np.uint8))
        paths.append(p)
    return paths


def _text_pixels(panel: np.ndarray) -> int:
    """Pixels brighter than the background and the label box: the glyphs."""
    return int(np.count_nonzero(panel.min(axis=-1) > 200))


def test_each_panel_gets_its_own_label_and_a_short_panel_holds_its_last_frame(tmp_path):
    a = _frames(tmp_path / "a", 3)
    b = _frames(tmp_path / "b", 2)  # a run that stopped one frame early
    labels = [[["admm", f"t = {i}"] for i in range(3)], [["xpbd", f"t = {i}"] for i in range(2)]]
    video = write_side_by_side([a, b], labels, tmp_path / "side", fps=10, video_name="s.mp4", gap=4)
    frames = sorted((tmp_path / "side" / "frames").glob("frame_*.png"))
    assert len(frames) == 3
    img = iio.imread(frames[-1])
    assert img.shape == (96, 2 * 128 + 4, 3)
    left, right = img[:, :128], img[:, 132:]
    for panel in (left, right):
        top, bottom = panel[:48], panel[48:]
        assert _text_pixels(top) > 30  # the label, in the top-left corner
        assert _text_pixels(bottom) == 0 and np.all(bottom == GREY)  # and only there
    # the labels differ per panel: the two names are drawn, not one label twice
    assert np.any(left[:48, :60] != right[:48, :60])
    if ffmpeg_exe():
        assert video is not None and video.stat().st_size > 0


def test_compare_panel_labels_say_the_integrator_time_and_energy_change():
    stats = {"time": np.array([0.0, 0.01]), "total_energy": np.array([2.0, 1.9])}
    assert panel_labels("implicit-euler", stats) == [
        ["implicit-euler", "t = 0.000 s", "E = 2 J (+0.000%)"],
        ["implicit-euler", "t = 0.010 s", "E = 1.9 J (-5.000%)"],
    ]
    assert panel_labels("xpbd", stats, "diverged")[-1][-1] == "diverged"


@needs_vulkan
def test_tisim_compare_writes_each_integrators_frames_and_a_labelled_video(tmp_path):
    from tisim.cli.app import app

    out = tmp_path / "c"
    r = CliRunner().invoke(
        app,
        [
            "compare",
            "spinning-bar",
            "-i",
            "admm,xpbd",
            "-n",
            "2",
            "--out",
            str(out),
            "--set",
            "objects.bar.resolution=[4,1,1]",
            "--set",
            "render.width=160",
            "--set",
            "render.height=120",
        ],
    )
    assert r.exit_code == 0, r.output
    for name in ("admm", "xpbd"):
        assert len(list((out / name / "frames").glob("frame_*.png"))) == 3
    summary = json.loads((out / "compare.json").read_text())
    assert summary["side_by_side"] == str(out / "side_by_side" / "side_by_side.mp4")
    assert f"side by side: {out / 'side_by_side' / 'side_by_side.mp4'}" in r.output
    side = iio.imread(out / "side_by_side" / "frames" / "frame_00002.png")
    assert side.shape == (120, 2 * 160 + 4, 3)
    for k, name in enumerate(("admm", "xpbd")):
        plain = iio.imread(out / name / "frames" / "frame_00002.png")
        panel = side[:, k * 164 : k * 164 + 160]
        label = np.s_[:60, :100]
        # the label region changed (text written), the rest of the panel is the run's frame
        assert np.abs(panel[label].astype(int) - plain[label]).max() > 100
        assert np.array_equal(panel[70:, :], plain[70:, :])
    r = CliRunner().invoke(
        app,
        [
            "compare",
            "spinning-bar",
            "-i",
            "admm",
            "-n",
            "1",
            "--out",
            str(tmp_path / "n"),
            "--set",
            "objects.bar.resolution=[4,1,1]",
            "--no-render",
        ],
    )
    assert r.exit_code == 0 and not (tmp_path / "n" / "admm" / "frames").exists()


@needs_vulkan
@pytest.mark.slow
def test_refine_levels_video_labels_each_level(tmp_path):
    from tisim.cli.app import app

    out = tmp_path / "r"
    r = CliRunner().invoke(
        app,
        [
            "refine",
            "refine-drape",
            "-n",
            "2",
            "-L",
            "2",
            "-q",
            "--out",
            str(out),
            "--set",
            "render.width=200",
            "--set",
            "render.height=150",
        ],
    )
    assert r.exit_code == 0, r.output
    side = iio.imread(out / "side_by_side" / "frames" / "frame_00002.png")
    assert side.shape == (150, 2 * 200 + 4, 3)
    for k in range(2):
        plain = iio.imread(out / f"level_{k}" / "frames" / "frame_00002.png")
        panel = side[:, k * 204 : k * 204 + 200]
        assert np.abs(panel[:75, :110].astype(int) - plain[:75, :110]).max() > 100
        assert np.array_equal(panel[90:], plain[90:])
