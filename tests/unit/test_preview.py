"""``tisim preview`` (and ``tisim demo`` on a progressive scene): the panel's values
reach the scene, the preview is the refiner's level 0, key f launches a refine of the
current settings, and without a display the command fails with one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tisim.config import ConfigError
from tisim.preview import PreviewSession, overrides, refine_command
from tisim.render import vulkan_available
from tisim.scene import load_scene


def test_panel_values_become_scene_overrides(demos_dir):
    path = demos_dir / "toss.toml"
    sc = load_scene(path)
    sets = overrides(sc, {"contact.mu": 0.55, "youngs_modulus": 2.5e6, "wind_x": 3.0, "velocity_y": 1.7})
    new = load_scene(path, sets)
    toy = new.objects["toy"]
    assert new.contact.mu == 0.55 and toy.friction is None
    assert toy.youngs_modulus == 2.5e6
    assert new.wind.velocity == (3.0, sc.wind.velocity[1], sc.wind.velocity[2])
    # the components not changed keep the scene's values
    assert toy.velocity == (sc.objects["toy"].velocity[0], 1.7, sc.objects["toy"].velocity[2])
    # an object with its own friction gets that key instead of contact.mu
    sc2 = load_scene(path, ["objects.toy.friction=0.1"])
    assert overrides(sc2, {"contact.mu": 0.4}) == ["objects.toy.friction=0.4"]
    with pytest.raises(ConfigError, match="unknown panel parameter 'gravity'"):
        overrides(sc, {"gravity": 1.0})
    cmd = refine_command(path, sets, "out/x")
    assert cmd[1:5] == ["-m", "tisim", "refine", str(path)]
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"] == sets


def test_preview_without_a_display_is_one_line_and_exit_2(demos_dir, tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    r = subprocess.run(
        [sys.executable, "-m", "tisim", "preview", str(demos_dir / "toss.toml")],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "needs a live window" in r.stderr, r.stderr


@pytest.mark.parametrize("display", [None, ":99"])
def test_preview_of_a_scene_without_cloth_says_what_a_progressive_scene_needs(demos_dir, tmp_path, display):
    """squeeze-ball (a PD ball) ended in "refine.object: the scene has 0 cloth objects: name
    one" with a display, and in "needs a live window" without one. One line naming the
    file and what a progressive scene needs, exit code 2, before any window is opened
    (with or without a display)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    if display:
        env["DISPLAY"] = display
    r = subprocess.run(
        [sys.executable, "-m", "tisim", "preview", "squeeze-ball"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for frag in (
        f"error: {demos_dir / 'squeeze-ball.toml'}: tisim preview needs a progressive cloth scene",
        "a cloth object (kind = 'cloth'",
        "[refine] table",
        "this scene has no cloth object",
    ):
        assert frag in lines[0], lines[0]
    assert "refine.object" not in lines[0] and "live window" not in lines[0]


def test_demo_of_a_scene_made_progressive_without_cloth_is_one_line(monkeypatch):
    """`tisim demo squeeze-ball --set refine.levels=2` has a [refine] table, so the demo goes
    to the live preview: the same one line, naming the demo's command, and no preview."""
    from typer.testing import CliRunner

    from tisim.cli.app import app

    calls = _fake_live(monkeypatch)
    r = CliRunner().invoke(app, ["demo", "squeeze-ball", "--set", "refine.levels=2"])
    assert r.exit_code == 2, r.output
    assert "tisim demo squeeze-ball needs a progressive cloth scene" in r.stderr, r.stderr
    assert calls == {"preview": [], "run": []}


def _fake_live(monkeypatch):
    """Route ``tisim demo``'s two paths into recorders: the live preview (with a
    display and Vulkan claimed available) and the plain run."""
    import tisim.cli.app as cli
    import tisim.preview as pv

    calls = {"preview": [], "run": []}
    monkeypatch.setattr(pv, "live_unavailable_reason", lambda: None)
    monkeypatch.setattr(pv, "make_preview_viewer", lambda: "the live viewer")
    monkeypatch.setattr(pv, "run_preview", lambda path, sets, **kw: calls["preview"].append((path, sets, kw)))
    monkeypatch.setattr(cli, "_run", lambda path, **kw: calls["run"].append((path, kw)) or 0)
    return calls


def test_demo_opens_the_live_preview_of_a_progressive_scene(monkeypatch, tmp_path):
    """`tisim demo` on a scene with a [refine] table goes to the preview loop with the
    command line's settings; --headless, --no-render and plain scenes go to the plain run."""
    from typer.testing import CliRunner

    from tisim.cli.app import app, demos_dir, list_demos
    from tisim.preview import is_progressive

    progressive = {n for n, _ in list_demos() if is_progressive(demos_dir() / f"{n}.toml")}
    assert progressive == {"refine-drape", "flag-refine", "toss", "ball-drop"}
    assert is_progressive(demos_dir() / "cloth-drape.toml", ["refine.levels=2"])  # --set can make one

    calls = _fake_live(monkeypatch)
    r = CliRunner().invoke(
        app, ["demo", "toss", "-n", "7", "--size", "320x240", "--set", "contact.mu=0.3", "--out", str(tmp_path / "o")]
    )
    assert r.exit_code == 0, r.output
    assert not calls["run"] and len(calls["preview"]) == 1
    path, sets, kw = calls["preview"][0]
    assert path == demos_dir() / "toss.toml"
    assert sets == ["contact.mu=0.3", "render.width=320", "render.height=240", "sim.frames=7"]
    assert kw["viewer"] == "the live viewer" and kw["out_root"] == tmp_path / "o" and kw["arch"] == "auto"
    for extra in (["--headless"], ["--no-render"]):
        r = CliRunner().invoke(app, ["demo", "toss", "-n", "1", *extra])
        assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["demo", "cloth-drape", "-n", "1"])
    assert r.exit_code == 0, r.output
    assert len(calls["preview"]) == 1
    assert [(p.name, kw["headless"], kw["no_render"]) for p, kw in calls["run"]] == [
        ("toss.toml", True, False),
        ("toss.toml", False, True),
        ("cloth-drape.toml", False, False),
    ]


def test_demo_of_a_progressive_scene_without_a_display_runs_headless(monkeypatch):
    """Like every demo without a display: one warning line, then the plain headless run."""
    from typer.testing import CliRunner

    import tisim.cli.app as cli

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    seen = {}

    def fake_run(path, **kw):
        seen.update(kw, path=path)
        return 0

    monkeypatch.setattr(cli, "_run", fake_run)
    monkeypatch.setattr(cli, "_preview_live", lambda *a, **k: pytest.fail("no display: no live preview"))
    r = CliRunner().invoke(cli.app, ["demo", "ball-drop", "-n", "3"])
    assert r.exit_code == 0, r.output
    assert seen["headless"] is True and seen["frames"] == 3 and seen["path"].name == "ball-drop.toml"
    assert "Traceback" not in r.output


class _Window:
    """A ti.ui.Window stand-in for the preview loop: real off-screen drawing, scripted keys."""

    def __init__(self, real, size):
        self.real, self.size = real, size
        self.presses: list[str] = []
        self.running = True
        self.images: list[np.ndarray] = []

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
        self.images.append(np.array(self.real.get_image_buffer_as_numpy()))


@pytest.mark.slow
@pytest.mark.skipif(not vulkan_available(), reason="no Vulkan driver: GGUI cannot render here")
def test_demo_preview_renders_steps_and_f_launches_refine_of_the_current_settings(monkeypatch, demos_dir, tmp_path):
    """`tisim demo toss` with a display: three frames of the real preview loop on an
    off-screen GGUI window (only the window and the launcher are stand-ins). The frames
    are real pixels of the scene, the thrown toy moves between them, and key f hands the
    launcher the command line's settings (the launcher is stubbed: a real refine is the
    refine tests' job)."""
    from typer.testing import CliRunner

    import tisim.preview as pv
    from tisim.cli.app import app
    from tisim.render.offscreen import acquire_window, release_window

    calls, echoed = [], []
    throw = "objects.toy.velocity=[1.5,1.0,0.0]"

    def launch(p, s, out):
        calls.append((p, list(s), out))
        return SimpleNamespace(pid=12345)

    real_run, real_viewer = pv.run_preview, pv.make_preview_viewer
    win = _Window(acquire_window(320, 240, show=False), (320, 240))
    win.presses += ["f", "h"]
    monkeypatch.setattr(pv, "live_unavailable_reason", lambda: None)
    monkeypatch.setattr(pv, "make_preview_viewer", lambda: real_viewer(window=win))
    monkeypatch.setattr(
        pv,
        "run_preview",
        lambda path, sets, **kw: real_run(
            path, sets, **{**kw, "max_frames": 3, "launch": launch, "echo": echoed.append}
        ),
    )
    try:
        r = CliRunner().invoke(
            app, ["demo", "toss", "--size", "320x240", "--arch", "cpu", "--out", str(tmp_path), "--set", throw]
        )
    finally:
        release_window()
    assert r.exit_code == 0, r.output
    assert len(win.images) == 3
    sets = [throw, "render.width=320", "render.height=240"]
    assert len(calls) == 1 and calls[0][0] == demos_dir / "toss.toml" and calls[0][1] == sets
    assert str(calls[0][2]).startswith(str(tmp_path / "toss-refine-"))
    assert str(calls[0][2]) in echoed[0] and "pid 12345" in echoed[0]
    # real pixels: the toy (the scene's orange, the panel hidden by key h) is on screen
    # and, thrown at 1.5 m/s along +x (to the right from this camera), moves right by
    # about 3 cm, some 8 pixels, between the first and the third frame
    centres = []
    for im in (win.images[0], win.images[-1]):
        rgb = np.asarray(im[..., :3], dtype=np.float64)  # (width, height, 3)
        toy = (rgb[..., 0] > 0.45) & (rgb[..., 0] - rgb[..., 2] > 0.25) & (rgb[..., 0] - rgb[..., 1] > 0.1)
        assert 20 < toy.sum() < 0.05 * toy.size, toy.sum()
        centres.append(np.argwhere(toy).mean(axis=0))
    assert 3.0 < centres[1][0] - centres[0][0] < 20.0, centres


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


def test_a_still_colliders_shadow_is_projected_once_and_stays_right(demos_dir, tmp_path):
    """refine-drape's sphere and floor do not move: the drawer projects the sphere's
    shadow at the first frame only, the cloth's every frame, and a later frame's picture
    is the one a fresh drawer draws for that frame."""
    from tisim.render.base import ViewInfo, drawn_ground
    from tisim.render.offscreen import SceneDrawer

    s = PreviewSession(demos_dir / "refine-drape.toml", work_dir=tmp_path / "w", arch="cpu")
    info = ViewInfo(
        faces=s.faces,
        vertex_count=len(s.state.x),
        colliders=[c for c in s.refiner.model.colliders if c.visible],
        camera=s.scene.camera,
        render=s.scene.render,
        title="t",
    )
    info.ground = drawn_ground(s.state.x, info.colliders, s.refiner.model.gravity)
    d = SceneDrawer(info)
    assert d.grounds and any(not moving for _, _, moving, _ in d.colliders)
    x0 = s.state.x
    x1 = x0 + np.array([0.05, -0.1, 0.02])
    d.update(x0, 0.0)
    projected = []
    for per_caster in d._shadows:
        for f in per_caster[1:]:
            f.update = lambda *a, _f=f, **k: projected.append(_f)  # a second projection would land here
    d.update(x1, 0.5)
    assert not projected
    fresh = SceneDrawer(info)
    fresh.update(x1, 0.5)
    for a, b in zip(d._shadows, fresh._shadows):
        for fa, fb in zip(a, b):
            np.testing.assert_array_equal(fa.vbo, fb.vbo)  # positions, normals, colours
