"""``tisim preview``: the panel's values reach the scene, the preview is the refiner's
level 0, key f launches a refine of the current settings, and without a display the
command fails with one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tisim.config import ConfigError
from tisim.preview import PreviewSession, overrides, refine_command, run_preview
from tisim.render import vulkan_available
from tisim.scene import load_scene


def test_panel_values_become_scene_overrides(demos_dir):
    path = demos_dir / "toss.toml"
    sc = load_scene(path)
    sets = overrides(sc, {"friction": 0.55, "youngs_modulus": 2.5e6, "wind_x": 3.0, "velocity_y": 1.7})
    new = load_scene(path, sets)
    toy = new.objects["toy"]
    assert new.contact.mu == 0.55 and toy.friction is None
    assert toy.youngs_modulus == 2.5e6
    assert new.wind.velocity == (3.0, sc.wind.velocity[1], sc.wind.velocity[2])
    # the components not changed keep the scene's values
    assert toy.velocity == (sc.objects["toy"].velocity[0], 1.7, sc.objects["toy"].velocity[2])
    # an object with its own friction gets that key instead of contact.mu
    sc2 = load_scene(path, ["objects.toy.friction=0.1"])
    assert overrides(sc2, {"friction": 0.4}) == ["objects.toy.friction=0.4"]
    with pytest.raises(ConfigError, match="unknown panel parameter 'gravity'"):
        overrides(sc, {"gravity": 1.0})
    cmd = refine_command(path, sets, "out/x")
    assert cmd[1:5] == ["-m", "tisim", "refine", str(path)]
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"] == sets


def test_preview_without_a_display_is_one_line_and_exit_2(demos_dir, tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    r = subprocess.run([sys.executable, "-m", "tisim", "preview", str(demos_dir / "toss.toml")], env=env,
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "needs a live window" in r.stderr, r.stderr


class _Window:
    """A ti.ui.Window stand-in for the preview loop: real off-screen drawing, scripted keys."""

    def __init__(self, real, size):
        self.real, self.size = real, size
        self.presses: list[str] = []
        self.running = True
        self.shown = 0

    def get_events(self, tag):
        import taichi as ti

        if tag != ti.ui.PRESS:
            return []
        out = [SimpleNamespace(key=k) for k in self.presses]
        self.presses.clear()
        return out

    def get_cursor_pos(self):
        return (0.9, 0.1)

    def is_pressed(self, *keys):
        return False

    def get_window_shape(self):
        return self.size

    def get_scene(self):
        return self.real.get_scene()

    def get_canvas(self):
        return self.real.get_canvas()

    def get_gui(self):
        return self.real.get_gui()

    def show(self):
        self.shown += 1
        self.real.get_image_buffer_as_numpy()


@pytest.mark.slow
@pytest.mark.skipif(not vulkan_available(), reason="no Vulkan driver: GGUI cannot render here")
def test_preview_loop_steps_and_f_launches_refine_of_the_current_settings(demos_dir, tmp_path):
    """Three frames of the preview on an off-screen window: the coarse level moves with
    the scene's throw, and key f hands the launcher the command line's --set plus the
    panel's changes (the launcher is stubbed: a real refine is the refine tests' job)."""
    from tisim.preview import make_preview_viewer
    from tisim.render.offscreen import acquire_window, release_window

    path = demos_dir / "toss.toml"
    sets = ["render.width=320", "render.height=240"]
    calls = []

    def launch(p, s, out):
        calls.append((p, list(s), out))
        return SimpleNamespace(pid=12345)

    win = _Window(acquire_window(320, 240, show=False), (320, 240))
    win.presses.append("f")
    echoed = []
    try:
        launched = run_preview(path, sets, viewer=make_preview_viewer(window=win), out_root=tmp_path, arch="cpu",
                               max_frames=3, launch=launch, echo=echoed.append)
    finally:
        release_window()
    assert win.shown == 3
    assert len(launched) == 1 and calls[0][0] == path and calls[0][1] == sets
    assert str(calls[0][2]) in echoed[0] and "pid 12345" in echoed[0]


def test_preview_session_restarts_with_the_panels_values(demos_dir, tmp_path):
    """A slider change rebuilds the scene and restarts the take: the new initial
    velocity is the preview's, and the level is the refiner's prolonged-energy level 0."""
    from tisim.progressive import ProlongedShell

    s = PreviewSession(demos_dir / "toss.toml", work_dir=tmp_path / "w", arch="cpu")
    assert isinstance(s.solver.elastic, ProlongedShell)  # the finest energy through P, not the mesh's own
    s.step()
    assert s.frame == 1
    s.set_values({"velocity_x": 2.0, "velocity_z": -0.5})
    assert s.frame == 0
    assert np.allclose(s.state.v.mean(axis=0)[[0, 2]], [2.0, -0.5])
    assert "objects.toy.velocity=[2.0,1.0,-0.5]" in s.scene_sets()
    s.step()
    com = s.state.x.mean(axis=0)
    assert com[0] > 0.015 and com[2] < -0.004  # one frame of 0.01 s at (2, *, -0.5) m/s
