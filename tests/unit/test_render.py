"""Viewers: camera math, picking, input handling, off-screen GGUI rendering, frame writing."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tisim import backend
from tisim.contact.colliders import Collider
from tisim.geometry.generate import box
from tisim.geometry.topology import surface_triangles
from tisim.render import (
    FrameWriter,
    NullViewer,
    Viewer,
    ViewerUnavailable,
    ViewInfo,
    make_viewer,
    vulkan_available,
)
from tisim.render import video as video_mod
from tisim.render.camera import (
    CameraView,
    OrbitCamera,
    drag_point,
    pick_vertex,
    ray_triangles,
    vertex_normals,
)
from tisim.render.ggui import LMB, RMB, InputController
from tisim.scene import CameraConfig, ColliderConfig, RenderConfig
from tisim.solvers.base import Tunable

W, H = 160, 120
BG = (0.12, 0.12, 0.14)
COLOR = (0.85, 0.45, 0.25)


def _view(eye=(1.0, 2.0, 3.0), target=(0.0, 0.5, 0.0), fov=45.0, w=W, h=H) -> CameraView:
    return CameraView(
        eye=np.array(eye, float),
        target=np.array(target, float),
        up=np.array([0.0, 1.0, 0.0]),
        fov=fov,
        width=w,
        height=h,
    )


# ---------------------------------------------------------------------------
# camera math


def test_target_projects_to_image_centre():
    v = _view()
    pix, depth = v.project(v.target[None])
    np.testing.assert_allclose(pix[0], [W / 2, H / 2], atol=1e-9)
    assert depth[0] == pytest.approx(np.linalg.norm(v.target - v.eye))


def test_ray_through_centre_hits_target_and_rays_invert_projection():
    v = _view()
    o, d = v.ray(W / 2, H / 2)
    to_target = v.target - o
    # the target lies on the ray: no component perpendicular to it
    assert np.linalg.norm(to_target - (to_target @ d) * d) < 1e-12
    rng = np.random.default_rng(1)
    for px, py in rng.uniform([0, 0], [W, H], size=(10, 2)):
        o, d = v.ray(px, py)
        pix, depth = v.project((o + 2.7 * d)[None])
        np.testing.assert_allclose(pix[0], [px, py], atol=1e-9)
        assert depth[0] > 0


def test_projection_puts_up_at_the_top_and_right_at_the_right():
    v = _view(eye=(0, 0, 3), target=(0, 0, 0))
    pix, _ = v.project(np.array([[0.0, 0.5, 0.0], [0.5, 0.0, 0.0]]))
    assert pix[0, 1] < H / 2 and abs(pix[0, 0] - W / 2) < 1e-9  # y up -> smaller row
    assert pix[1, 0] > W / 2 and abs(pix[1, 1] - H / 2) < 1e-9


def test_projection_matches_ggui_camera_matrices():
    """Our pixels must be GGUI's pixels, or picking would miss what is drawn."""
    backend.init("cpu", "f64")
    import taichi as ti
    from taichi._lib import core

    if not getattr(core, "GGUI_AVAILABLE", False):
        pytest.skip("this Taichi build has no GGUI")

    c = ti.ui.Camera()
    c.position(1.0, 2.0, 3.0)
    c.lookat(0.0, 0.5, 0.0)
    c.up(0.0, 1.0, 0.0)
    c.fov(45.0)
    Vm = np.array(c.get_view_matrix())  # row-vector convention: p @ V @ P
    Pm = np.array(c.get_projection_matrix(W / H))
    pts = np.random.default_rng(0).normal(size=(8, 3)) * 0.5
    clip = np.c_[pts, np.ones(len(pts))] @ Vm @ Pm
    ndc = clip[:, :2] / clip[:, 3:]
    pix, _ = _view().project(pts)
    ours = np.c_[2 * pix[:, 0] / W - 1, 1 - 2 * pix[:, 1] / H]
    np.testing.assert_allclose(ours, ndc, atol=1e-5)  # GGUI works in f32


def test_orbit_camera_round_trip_orbit_zoom_pan():
    eye, target = np.array([2.0, 1.5, 3.0]), np.array([0.1, 0.2, -0.3])
    cam = OrbitCamera.from_look_at(eye, target, (0, 1, 0), 45.0)
    np.testing.assert_allclose(cam.eye(), eye, atol=1e-12)
    d0 = cam.distance
    cam.orbit(0.7, -0.4)
    assert np.linalg.norm(cam.eye() - cam.target) == pytest.approx(d0, rel=1e-12)
    assert not np.allclose(cam.eye(), eye)
    cam.orbit(0.0, 10.0)  # pitch is clamped short of the pole
    assert cam.pitch <= math.radians(89.0) + 1e-12
    assert np.linalg.norm(cam.eye() - cam.target) == pytest.approx(d0, rel=1e-12)
    cam.zoom(0.5)
    assert cam.distance == pytest.approx(0.5 * d0)
    # panning by (dx, 0) pixels moves the target along -right by dx pixel widths
    before = cam.view(W, H)
    right, _, fwd = before.basis()
    t0 = cam.target.copy()
    cam.pan(10.0, 0.0, H)
    moved = cam.target - t0
    assert abs(moved @ fwd) < 1e-12
    assert moved @ right == pytest.approx(-10.0 * before.pixel_size_at(cam.distance))


def test_vertex_normals_of_a_flat_grid():
    x = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [5, 5, 5]], float)
    f = np.array([[0, 1, 2], [0, 2, 3]])
    n = vertex_normals(x, f)
    np.testing.assert_allclose(n[:4], np.tile([0, 0, 1.0], (4, 1)))
    np.testing.assert_allclose(n[4], [0, 1, 0])  # in no face: the fallback
    np.testing.assert_allclose(vertex_normals(x, f[:, ::-1])[:4], np.tile([0, 0, -1.0], (4, 1)))


# ---------------------------------------------------------------------------
# picking


def _two_sheets():
    """Two 3x3-vertex sheets facing +z: the front one at z=0.5, one behind at z=-0.5."""
    g = np.linspace(-0.5, 0.5, 3)
    X, Y = np.meshgrid(g, g)
    sheet = np.c_[X.ravel(), Y.ravel(), np.zeros(9)]
    x = np.concatenate([sheet + [0, 0, 0.5], sheet + [0, 0, -0.5]])
    f = []
    for i in range(2):
        for j in range(2):
            a = 3 * i + j
            f += [[a, a + 1, a + 4], [a, a + 4, a + 3]]
    f = np.array(f)
    return x, np.concatenate([f, f + 9])


def test_pick_returns_the_visible_vertex_under_the_cursor():
    x, f = _two_sheets()
    v = _view(eye=(0.1, 0.05, 3.0), target=(0, 0, 0))
    pix, _ = v.project(x)
    for i in range(9):  # every front vertex; each hides a back vertex nearly exactly
        got = pick_vertex(v, x, f, *(pix[i] + [0.3, -0.2]))
        assert got == i
    # a vertex of the back sheet that the front sheet does not hide is pickable
    v2 = _view(eye=(2.5, 0.0, 1.5), target=(0, 0, 0))
    p2, _ = v2.project(x)
    ray_hits = [pick_vertex(v2, x, f, *p2[i]) for i in range(9, 18)]
    assert any(h is not None and h >= 9 for h in ray_hits)


def test_pick_off_the_silhouette_uses_the_pixel_radius():
    x, f = _two_sheets()
    v = _view(eye=(0.0, 0.0, 3.0), target=(0, 0, 0))
    pix, _ = v.project(x)
    corner = 8  # (+0.5, +0.5, 0.5): top-right corner of the front sheet
    off = pix[corner] + [5.0, -5.0]  # outside the sheet, ~7 px from the corner
    assert np.isinf(ray_triangles(*v.ray(*off), x[f]).min())
    assert pick_vertex(v, x, f, *off, radius_px=12.0) == corner
    assert pick_vertex(v, x, f, *off, radius_px=4.0) is None
    assert pick_vertex(v, x, f, 2.0, 2.0) is None


def test_drag_point_lies_on_the_view_plane_under_the_cursor():
    v = _view()
    anchor = np.array([0.2, 0.4, -0.1])
    p = drag_point(v, 30.0, 90.0, anchor)
    _, _, fwd = v.basis()
    assert abs((p - anchor) @ fwd) < 1e-12
    np.testing.assert_allclose(v.project(p[None])[0][0], [30.0, 90.0], atol=1e-9)


# ---------------------------------------------------------------------------
# input handling (no window)


def _controller(panel=None):
    x, f = _two_sheets()
    cam = OrbitCamera.from_look_at((0.0, 0.0, 3.0), (0, 0, 0))
    c = InputController(cam, W, H, f, panel_rect=panel)
    c.set_positions(x)
    return c, x


def test_keys_pause_step_reset_quit():
    c, _ = _controller()
    assert c.take_events().paused is False
    c.key_press(" ")
    ev = c.take_events()
    assert ev.paused and not ev.step_once
    c.key_press("n")
    ev = c.take_events()
    assert ev.paused and ev.step_once
    assert not c.take_events().step_once  # one-shot
    c.key_press(" ")
    c.key_press("n")  # stepping while running pauses first
    assert c.take_events().paused
    c.key_press("r")
    assert c.take_events().reset
    assert not c.take_events().reset
    c.key_press("Escape")  # Esc lets go of a grab; it does not close the window
    assert not c.take_events().quit
    c.key_press("q")
    assert c.take_events().quit


def test_left_drag_picks_moves_and_releases_a_vertex():
    c, x = _controller()
    v = c.view()
    pix, _ = v.project(x)
    c.mouse_move(*pix[4])
    c.mouse_press(LMB, *pix[4])
    ev = c.take_events()
    assert ev.drag_vertex == 4
    np.testing.assert_allclose(ev.drag_target, x[4])
    c.mouse_move(pix[4][0] + 20.0, pix[4][1] - 10.0)
    ev = c.take_events()
    assert ev.drag_vertex == 4 and not ev.drag_released
    np.testing.assert_allclose(v.project(ev.drag_target[None])[0][0], pix[4] + [20.0, -10.0], atol=1e-9)
    assert ev.drag_target[2] == pytest.approx(x[4, 2])  # the plane faces the camera (along z)
    c.mouse_release(LMB, pix[4][0] + 20.0, pix[4][1] - 10.0)
    ev = c.take_events()
    assert ev.drag_released and ev.drag_vertex is None and ev.drag_target is None
    assert not c.take_events().drag_released
    # a click on empty space picks nothing
    c.mouse_press(LMB, 3.0, 3.0)
    assert c.take_events().drag_vertex is None


def test_right_click_or_escape_lets_go_of_a_grab_without_moving_the_camera():
    for release in ("RMB", "Escape"):
        c, x = _controller()
        pix, _ = c.view().project(x)
        c.mouse_move(*pix[4])
        c.mouse_press(LMB, *pix[4])
        assert c.take_events().drag_vertex == 4
        eye0 = c.camera.eye()
        if release == "RMB":
            c.mouse_press(RMB, *pix[4])
            c.mouse_move(pix[4][0] + 40.0, pix[4][1])
        else:
            c.key_press("Escape")
        ev = c.take_events()
        assert ev.drag_released and ev.drag_vertex is None and not ev.quit
        np.testing.assert_allclose(c.camera.eye(), eye0)  # the right-click did not start an orbit


def test_right_drag_orbits_shift_pans_and_panel_clicks_are_ignored():
    c, _x = _controller(panel=(0.0, 0.0, 50.0, 40.0))
    d0 = c.camera.distance
    eye0 = c.camera.eye()
    c.mouse_move(100.0, 60.0)
    c.mouse_press(RMB, 100.0, 60.0)
    c.mouse_move(130.0, 70.0)
    assert not np.allclose(c.camera.eye(), eye0)
    assert np.linalg.norm(c.camera.eye() - c.camera.target) == pytest.approx(d0)
    t0 = c.camera.target.copy()
    c.mouse_move(140.0, 70.0, shift=True)
    assert np.linalg.norm(c.camera.target - t0) > 0
    c.mouse_release(RMB, 140.0, 70.0)
    # a press inside the panel neither picks nor starts a camera drag
    c2, x2 = _controller(panel=(0.0, 0.0, W, H))
    pix, _ = c2.view().project(x2)
    c2.mouse_press(LMB, *pix[4])
    assert c2.take_events().drag_vertex is None


# ---------------------------------------------------------------------------
# interface, factory, frames


def test_view_info_validates_and_colours_objects():
    with pytest.raises(ValueError):
        ViewInfo(faces=np.array([[0, 1, 5]]), vertex_count=3)
    with pytest.raises(ValueError):
        ViewInfo(faces=np.zeros((2, 4)), vertex_count=3)
    info = ViewInfo(
        faces=np.array([[0, 1, 2]]),
        vertex_count=6,
        object_vertex_ranges=[(0, 3), slice(3, 6)],
        render=RenderConfig(color=COLOR),
    )
    col = info.vertex_colors()
    np.testing.assert_allclose(col[:3], np.tile(COLOR, (3, 1)))
    assert not np.allclose(col[3:], COLOR)
    assert ViewInfo(faces=np.array([[0, 1, 2]]), vertex_count=3).vertex_colors() is None


def test_null_viewer_and_factory(monkeypatch):
    v = make_viewer("none")
    assert isinstance(v, NullViewer) and isinstance(v, Viewer)
    v.open(ViewInfo(faces=np.array([[0, 1, 2]]), vertex_count=3))
    v.draw(0, 0.0, np.zeros((3, 3)))
    ev = v.poll()
    assert v.running and not ev.paused and not ev.quit and ev.drag_vertex is None
    v.close()
    with pytest.raises(ValueError):
        make_viewer("hologram")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    with pytest.raises(ViewerUnavailable, match="display"):
        make_viewer("live")
    from tisim.render.ggui import GGUIViewer

    assert not isinstance(make_viewer("live", fallback=True), GGUIViewer)
    monkeypatch.setenv("TISIM_VULKAN", "0")
    with pytest.raises(ViewerUnavailable, match="Vulkan"):
        make_viewer("offscreen")
    assert isinstance(make_viewer("live", fallback=True), NullViewer)


def _gradient_frames(n, h=25, w=33):
    frames = []
    for i in range(n):
        img = np.zeros((h, w, 3), np.uint8)
        img[..., 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
        img[..., 1] = 40 * i
        img[: h // 2, :, 2] = 200
        frames.append(img)
    return frames


def test_frame_writer_pngs_and_mp4(tmp_path):
    import imageio.v2 as iio2
    import imageio.v3 as iio

    fw = FrameWriter(tmp_path / "out", fps=10)
    frames = _gradient_frames(5)  # odd size: the MP4 must be padded to even
    for f in frames:
        fw.write(f)
    pngs = sorted((tmp_path / "out" / "frames").glob("frame_*.png"))
    assert [p.name for p in pngs] == [f"frame_{i:05d}.png" for i in range(5)]
    np.testing.assert_array_equal(iio.imread(pngs[3]), frames[3])
    with pytest.raises(ValueError):
        fw.write(np.zeros((10, 10, 3), np.uint8))
    path = fw.finish()
    assert path == tmp_path / "out" / "video.mp4" and path.stat().st_size > 0
    reader = iio2.get_reader(path, format="FFMPEG")
    assert reader.count_frames() == 5
    first = reader.get_data(0)
    reader.close()
    assert first.shape == (26, 34, 3)
    # lossy, but the picture survives: the blue top half and the red ramp
    assert first[:10, 5:28, 2].mean() > 150 and first[15:, 5:28, 2].mean() < 60
    assert first[12, 30, 0] > first[12, 3, 0] + 150
    assert fw.finish() == path  # idempotent


def test_frame_writer_without_ffmpeg_keeps_frames(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(video_mod, "ffmpeg_exe", lambda: None)
    fw = FrameWriter(tmp_path, fps=24)
    fw.write(_gradient_frames(1)[0])
    with caplog.at_level(logging.WARNING):
        assert fw.finish() is None
    assert "ffmpeg" in caplog.text
    assert (tmp_path / "frames" / "frame_00000.png").exists()
    assert FrameWriter(tmp_path / "empty").finish() is None


# ---------------------------------------------------------------------------
def test_cloth_checker_squares_follow_the_grid_and_the_uvs():
    """On a generated sheet a checker square is a whole number of cells, the same along u
    and v (the flag's 30 x 20 cells: 4 x 4-cell squares, 7.5 x 5 of them), so its edges run
    along mesh edges; a mesh that is no grid gets 8 squares per unit of UV."""
    from tisim.geometry.generate import cloth_rectangle
    from tisim.render.base import checker

    m = cloth_rectangle((1.5, 1.0), (30, 20))
    c = checker(m.uv, m.face_uv)
    cell = (m.uv[m.face_uv].mean(axis=1) * [30, 20]).astype(int)  # (m, 2) cell of each face
    want = ((cell[:, 0] // 4) + (cell[:, 1] // 4)) % 2
    np.testing.assert_array_equal(c, want)
    assert 0.4 < c.mean() < 0.6
    with pytest.raises(ValueError):  # the surface's faces and their colours must agree
        ViewInfo(faces=np.array([[0, 1, 2]]), vertex_count=3, face_colors=np.zeros((2, 3)))
    # the levels of a refine (8 -> 16 -> 32 cells a side) show the same squares in UV
    for cells in (8, 16, 32):
        g = cloth_rectangle((1.0, 1.0), (cells, cells))
        centroid = g.uv[g.face_uv].mean(axis=1)
        np.testing.assert_array_equal(checker(g.uv, g.face_uv), np.floor(centroid * 8).sum(axis=1) % 2)
    # irregular UVs (a user's mesh): squares of 1/8 of UV
    rng = np.random.default_rng(1)
    uv = m.uv + rng.uniform(-0.004, 0.004, m.uv.shape)
    centroid = uv[m.face_uv].mean(axis=1)
    np.testing.assert_array_equal(checker(uv, m.face_uv), np.floor(centroid * 8).sum(axis=1) % 2)


# off-screen rendering (GGUI on Vulkan; lavapipe is enough)

needs_vulkan = pytest.mark.skipif(not vulkan_available(), reason="no Vulkan driver: GGUI cannot render here")


@pytest.fixture(scope="module")
def renderer(tmp_path_factory):
    """One renderer for the module: GGUI allows one window per process reliably."""
    from tisim.render.offscreen import OffscreenRenderer

    backend.init("cpu", "f64")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("ggui"))  # GGUI writes imgui.ini into the cwd
        r = OffscreenRenderer()
        yield r
        r.close()


def _box_info(colliders=(), center=(0.0, 0.5, 0.0), **kw):
    mesh = box((0.5, 0.5, 0.5), (2, 2, 2), center=center)
    info = ViewInfo(
        faces=surface_triangles(mesh.tets),
        vertex_count=len(mesh.vertices),
        colliders=list(colliders),
        camera=CameraConfig(position=(0.0, 0.0, 3.0), lookat=(0.0, 0.0, 0.0), fov=45.0),
        render=RenderConfig(width=W, height=H, background=BG, color=COLOR),
        **kw,
    )
    return info, mesh.vertices


def _object_mask(img, tol=12):
    bg = np.rint(np.array(BG) * 255)
    return np.abs(img.astype(float) - bg).max(axis=2) > tol


@needs_vulkan
def test_offscreen_render_is_upright_and_shows_the_object(renderer, tmp_path):
    info, x = _box_info()
    renderer.open(info)
    renderer.draw(0, 0.0, x)
    img = renderer.image()
    assert img.shape == (H, W, 3) and img.dtype == np.uint8
    mask = _object_mask(img)
    n = int(mask.sum())
    # the 0.5 m box at 3 m fills roughly (0.5 / (2 * 3 tan 22.5deg) * 120)^2 ~ 580 px
    assert 300 < n < 2000
    rows, cols = np.nonzero(mask)
    assert rows.max() < H / 2  # placed above the look-at point: upper half, so upright
    assert abs(cols.mean() - W / 2) < 5
    # where our camera math projects the box's centre, the box is drawn
    pix, _ = renderer.view.project(np.array([[0.0, 0.5, 0.25]]))
    assert mask[int(pix[0, 1]), int(pix[0, 0])]
    # lit object colour keeps its hue (R > G > B), the background stays exact
    obj = img[mask].astype(int)
    assert np.mean((obj[:, 0] > obj[:, 1]) & (obj[:, 1] > obj[:, 2])) > 0.95
    np.testing.assert_array_equal(img[-1, 0], np.rint(np.array(BG) * 255))
    out = renderer.save_png(tmp_path / "shot.png")
    import imageio.v3 as iio

    np.testing.assert_array_equal(iio.imread(out), img)


@needs_vulkan
def test_offscreen_colliders_are_drawn_and_move(renderer):
    sphere = Collider.from_config(
        "ball",
        ColliderConfig(type="sphere", position=(0.0, -0.6, 0.0), radius=0.3, velocity=(0.6, 0.0, 0.0)),
    )
    info, x = _box_info()
    renderer.open(info)
    renderer.draw(0, 0.0, x)
    plain = renderer.image()
    renderer.open(_box_info(colliders=[sphere])[0])
    renderer.draw(0, 0.0, x)
    with_ball = renderer.image()
    changed = np.abs(with_ball.astype(int) - plain.astype(int)).max(axis=2) > 12
    rows, _ = np.nonzero(changed)
    assert changed.sum() > 300 and rows.min() > H / 2  # the ball, below the box
    grey = with_ball[changed].astype(int)
    assert np.mean(grey.max(1) - grey.min(1) < 30) > 0.9  # colliders are drawn grey
    renderer.draw(1, 1.0, x)  # the ball moved 0.6 m to the right
    moved = renderer.image()
    c0 = np.nonzero(changed)[1].mean()
    c1 = np.nonzero(_object_mask(moved) & (np.arange(H)[:, None] > H / 2))[1].mean()
    assert c1 > c0 + 10


@needs_vulkan
def test_offscreen_face_colours_have_sharp_edges(renderer):
    """Face colours (a cloth's checker) are drawn per face: a sheet of 4 x 4 cells in
    2 x 2-cell squares shows two colours with almost nothing between them, where
    per-vertex colours (the vertices on a square's edge take one side's colour) blend
    across every edge cell."""
    from tisim.geometry.generate import cloth_rectangle
    from tisim.render.base import checker

    m = cloth_rectangle((1.2, 1.2), (4, 4), center=(0.0, 0.0, 0.0), normal="z")
    check = checker(m.uv, m.face_uv)
    light, dark = np.array([0.9, 0.5, 0.2]), np.array([0.3, 0.15, 0.05])
    face_colors = np.where(check[:, None] == 1, light, dark)
    cam = CameraConfig(position=(0.0, 0.0, 3.0), lookat=(0.0, 0.0, 0.0), fov=45.0)
    kw = {
        "faces": m.faces,
        "vertex_count": len(m.vertices),
        "camera": cam,
        "render": RenderConfig(width=W, height=H, background=BG, color=COLOR),
    }

    def spread(info):
        renderer.open(info)
        renderer.draw(0, 0.0, m.vertices)
        obj = renderer.image()[_object_mask(renderer.image())].astype(float)
        lum = obj.mean(axis=1)
        lo, hi = np.percentile(lum, 5), np.percentile(lum, 95)
        between = (lum > lo + 0.2 * (hi - lo)) & (lum < hi - 0.2 * (hi - lo))
        return len(lum), between.mean()

    n, sharp = spread(ViewInfo(face_colors=face_colors, **kw))
    vcol = np.zeros((len(m.vertices), 3))
    vcol[m.faces.ravel()] = np.repeat(face_colors, 3, axis=0)
    _, blurred = spread(ViewInfo(colors=vcol, **kw))
    assert n > 1000
    assert sharp < 0.03 < blurred, (sharp, blurred)


@needs_vulkan
def test_offscreen_extra_points_and_object_colours(renderer):
    info, x = _box_info(object_vertex_ranges=[(0, 0), (0, 27)], object_colors=[COLOR, (0.2, 0.3, 0.9)])
    renderer.open(info)
    renderer.draw(0, 0.0, x)
    img = renderer.image()
    obj = img[_object_mask(img)].astype(int)
    assert np.mean(obj[:, 2] > obj[:, 0]) > 0.95  # the second object's blue
    before = _object_mask(img).sum()
    renderer.draw(1, 0.0, x, extra_points=np.array([[-0.6, -0.4, 0.0], [0.6, -0.4, 0.0]]))
    assert _object_mask(renderer.image()).sum() > before


@needs_vulkan
def test_offscreen_roller_stripes_turn_with_the_roller(renderer):
    """A roller seen end-on keeps its silhouette while it spins, but its stripes turn
    with it: after one stripe's angle (30 degrees of 12 stripes a turn) light and dark
    swap, after two they are back."""
    from tisim.render.offscreen import STRIPES

    step = 2 * math.pi / STRIPES
    roller = Collider.from_config(
        "roller",
        ColliderConfig(
            type="cylinder",
            position=(0.0, -0.6, 0.0),
            radius=0.35,
            length=0.3,
            axis=(0.0, 0.0, 1.0),
            angular_velocity=(0.0, 0.0, step),
        ),
    )
    info, x = _box_info(colliders=[roller])
    renderer.open(info)
    images = []
    for t in (0.0, 1.0, 2.0):
        renderer.draw(0, t, x)
        images.append(renderer.image().astype(int))
    pix, _ = renderer.view.project(np.array([[0.0, -0.6, 0.15]]))  # the cap's centre
    rr, cc = np.mgrid[0:H, 0:W]
    r = np.hypot(rr + 0.5 - pix[0, 1], cc + 0.5 - pix[0, 0])
    cap = (r > 3) & (r < 12)  # a ring inside the cap, away from its centre
    assert cap.sum() > 200
    masks = [_object_mask(im) for im in images]
    assert (masks[0] != masks[1]).sum() < 0.02 * masks[0].sum()  # same silhouette
    lum = [im.sum(axis=2) for im in images]
    assert lum[0][cap].std() > 20  # striped, not flat
    swapped = np.abs(lum[1] - lum[0])[cap] > 30
    assert swapped.mean() > 0.6  # turned by one stripe: light and dark swapped
    back = np.abs(lum[2] - lum[0])[cap] > 30
    assert back.mean() < 0.15  # two stripes: the same pattern again


@needs_vulkan
def test_offscreen_floor_shows_a_grid_and_the_objects_shadow(renderer):
    """A plane collider is drawn as a checkered floor (light and dark tiles along a
    row) and the box casts its shadow on it where the sun direction projects it."""
    from tisim.render.offscreen import sun_direction

    floor = Collider.from_config("floor", ColliderConfig(type="plane", position=(0.0, -0.5, 0.0)))
    mesh = box((0.5, 0.5, 0.5), (2, 2, 2), center=(0.0, 0.0, 0.0))
    cam = CameraConfig(position=(0.0, 1.2, 3.0), lookat=(0.0, -0.3, 0.0), fov=45.0)
    info = ViewInfo(
        faces=surface_triangles(mesh.tets),
        vertex_count=len(mesh.vertices),
        colliders=[floor],
        camera=cam,
        render=RenderConfig(width=W, height=H, background=BG),
    )
    renderer.open(info)
    renderer.draw(0, 0.0, mesh.vertices)
    img = renderer.image().astype(int)
    lum = img.sum(axis=2)
    grey = (img.max(axis=2) - img.min(axis=2)) < 30
    # a floor row in front of the box: tiles alternate light/dark several times
    row = lum[int(0.9 * H)]
    assert grey[int(0.9 * H)].all()
    levels = row > np.median(row)
    assert np.count_nonzero(levels[1:] != levels[:-1]) >= 4
    # the box's shadow: its centre projected along the sun onto the floor
    d = sun_direction(cam)
    c = np.array([0.0, 0.0, 0.0])
    shadow = c - (c[1] + 0.5) / d[1] * d
    pix, _ = renderer.view.project(shadow[None])
    i, j = int(pix[0, 1]), int(pix[0, 0])
    assert 0 <= i < H and 0 <= j < W and grey[i, j]  # on the floor, not on the (orange) box
    floor_px = lum[grey & (np.arange(H)[:, None] > 0.8 * H)]
    assert lum[i, j] < 0.75 * np.percentile(floor_px, 10), (lum[i, j], np.percentile(floor_px, 10))
    renderer.close()


@needs_vulkan
def test_offscreen_meshes_show_whatever_ggui_memory_held_before(renderer):
    """Regression: Taichi 1.7.4's mesh shader reads a model matrix from a per-draw
    buffer that ``scene.mesh`` leaves uninitialised and multiplies it by 0, so NaN left
    there by an earlier draw made whole meshes vanish (a floor missing from a frame,
    one run in ten). Poison that memory with NaN matrices, then every frame must equal
    the clean one (the old drawing failed about half of these frames)."""
    from tisim.render import host_draw
    from tisim.render.offscreen import setup_camera_and_lights

    floor = Collider.from_config("floor", ColliderConfig(type="plane", position=(0.0, -0.5, 0.0)))
    info, x = _box_info(colliders=[floor])
    renderer.open(info)
    renderer.draw(0, 0.0, x)
    clean = renderer.image()
    assert (clean != np.array(BG) * 255).any()
    nan = np.full((1, 4, 4), np.nan, np.float32)
    surface = renderer._drawer.surface
    for _ in range(8):
        scene = renderer._window.get_scene()
        setup_camera_and_lights(scene, renderer._ti_camera, renderer.view)
        for _ in range(8):
            host_draw.mesh(scene, surface.vbo, surface.idx, nan, (1.0, 1.0, 1.0))
        renderer._window.get_canvas().scene(scene)
        renderer._window.get_image_buffer_as_numpy()  # renders and frees the poisoned draws
        renderer.draw(0, 0.0, x)
        np.testing.assert_array_equal(renderer.image(), clean)
    renderer.close()


@needs_vulkan
def test_host_arrays_draw_what_taichis_field_wrappers_draw(renderer):
    """tisim.render.host_draw hands GGUI's C++ scene the vertex buffer, indices and
    transform as numpy arrays; Taichi's own ``mesh_instance``, ``particles`` and ``lines``
    take fields and build the same arrays with their copy kernels. The same drawing both
    ways must give the same pixels (a wrong stride, colour slot or count would not)."""
    import taichi as ti

    from tisim.render import host_draw
    from tisim.render.offscreen import setup_camera_and_lights

    info, x = _box_info()
    renderer.open(info)
    renderer.draw(0, 0.0, x)  # camera and view
    surface = renderer._drawer.surface
    vbo, idx, n = surface.vbo, surface.idx, len(surface.vbo)
    rng = np.random.default_rng(3)
    vbo[:, 8:11] = rng.uniform(0.2, 1.0, (n, 3))  # distinct colours per corner
    pts = host_draw.vertex_buffer(5)  # a segment and points in front of the box
    pts[:, 0:3] = [(-0.8, 0.3, 1.0), (0.8, 0.3, 1.0), (-0.8, -0.3, 1.2), (0.8, -0.2, 1.2), (0.0, 0.0, 0.0)]
    images = []
    for way in ("taichi", "host"):
        scene = renderer._window.get_scene()
        setup_camera_and_lights(scene, renderer._ti_camera, renderer.view)
        if way == "host":
            host_draw.mesh(scene, vbo, idx, surface.model, (1.0, 1.0, 1.0))
            host_draw.particles(scene, pts, 0.03, (0.1, 0.9, 0.2), index_count=4)
            host_draw.lines(scene, pts, 3.0, (0.9, 0.9, 0.1), vertex_count=2)
        else:
            f = {k: ti.Vector.field(d, ti.f32, shape=n) for k, d in (("x", 3), ("n", 3), ("c", 4))}
            f["x"].from_numpy(vbo[:, 0:3].copy())
            f["n"].from_numpy(vbo[:, 3:6].copy())
            f["c"].from_numpy(vbo[:, 8:12].copy())
            fi = ti.field(ti.i32, shape=len(idx))
            fi.from_numpy(idx)
            fm = ti.Matrix.field(4, 4, ti.f32, shape=1)
            fm.from_numpy(surface.model)
            fp = ti.Vector.field(3, ti.f32, shape=5)
            fp.from_numpy(pts[:, 0:3].copy())
            scene.mesh_instance(
                f["x"], indices=fi, normals=f["n"], per_vertex_color=f["c"], transforms=fm, two_sided=True
            )
            scene.particles(fp, radius=0.03, color=(0.1, 0.9, 0.2), index_count=4)
            scene.lines(fp, width=3.0, color=(0.9, 0.9, 0.1), vertex_count=2)
        canvas = renderer._window.get_canvas()
        canvas.set_background_color(BG)
        canvas.scene(scene)
        images.append(renderer._window.get_image_buffer_as_numpy().copy())
    assert (images[0] != images[0][0, 0]).any()  # something drawn
    np.testing.assert_array_equal(images[0], images[1])
    renderer.close()


@needs_vulkan
def test_offscreen_records_frames_and_video(renderer, tmp_path):
    import imageio.v2 as iio2

    info, x = _box_info()
    renderer.frames = FrameWriter(tmp_path / "rec", fps=12)
    try:
        renderer.open(info)
        for i in range(4):
            renderer.draw(i, 0.1 * i, x + [0.05 * i, 0.0, 0.0])
        renderer.close()
        renderer.close()  # safe twice
    finally:
        renderer.frames = None
    assert len(list((tmp_path / "rec" / "frames").glob("*.png"))) == 4
    assert renderer.video_path is not None and renderer.video_path.stat().st_size > 0
    reader = iio2.get_reader(renderer.video_path, format="FFMPEG")
    assert reader.count_frames() == 4
    reader.close()


class _ScriptedWindow:
    """A ti.ui.Window stand-in: real off-screen drawing, scripted input."""

    def __init__(self, real, width, height):
        self.real = real
        self.size = (width, height)
        self.presses: list[str] = []
        self.releases: list[str] = []
        self.cursor = (0.5, 0.5)
        self.held: set[str] = set()
        self.running = True
        self.shown = 0
        self.last_image = None

    def get_events(self, tag):
        import taichi as ti

        lst = self.presses if tag == ti.ui.PRESS else self.releases
        out = [SimpleNamespace(key=k) for k in lst]
        lst.clear()
        return out

    def get_cursor_pos(self):
        return self.cursor

    def is_pressed(self, *keys):
        return any(k in self.held for k in keys)

    def get_window_shape(self):
        return self.size

    def get_scene(self):
        return self.real.get_scene()

    def get_canvas(self):
        return self.real.get_canvas()

    def get_gui(self):
        return self.real.get_gui()

    def show(self):
        # GGUI's show() needs a visible window; off-screen, fetching the buffer renders
        self.shown += 1
        self.last_image = self.real.get_image_buffer_as_numpy()


@needs_vulkan
def test_live_viewer_logic_on_an_offscreen_window(renderer):
    """GGUIViewer's poll/draw/panel code against real GGUI calls, with scripted input."""
    from tisim.render.ggui import GGUIViewer
    from tisim.render.offscreen import acquire_window, buffer_to_image, release_window

    w, h = 400, 300  # wide enough that the box is not under the panel
    info, x = _box_info(tunables=[Tunable("dt", 0.013, 1e-4, 0.1, log=True), Tunable("iterations", 7.3, 1.0, 100.0)])
    info.render = RenderConfig(width=w, height=h, background=BG, color=COLOR)
    real = acquire_window(w, h, show=False)
    win = _ScriptedWindow(real, w, h)
    v = GGUIViewer(window=win)
    try:
        v.open(info)
        assert v.running
        v.draw(0, 0.0, x)
        # click on the box's front centre and drag upwards by 10 px
        pix, _ = v.controller.view().project(np.array([[0.0, 0.5, 0.25]]))
        px, py = pix[0]
        win.cursor = (px / w, 1.0 - py / h)  # GGUI: [0, 1]^2 with y up
        ev = v.poll()  # the cursor arrives
        assert ev.tunable_changes == {}  # untouched sliders (f32 in imgui) report nothing
        win.presses.append("LMB")
        ev = v.poll()
        assert ev.drag_vertex is not None
        picked = x[ev.drag_vertex]
        assert picked[2] == pytest.approx(0.25)  # a vertex of the front face
        win.cursor = (px / w, 1.0 - (py - 10.0) / h)
        ev = v.poll()
        assert ev.drag_target[1] > picked[1]
        v.draw(1, 0.01, x)
        v.draw(2, 0.02, x)  # imgui shows the panel from the second frame on
        img = buffer_to_image(win.last_image)
        bg = np.rint(np.array(BG) * 255)
        assert np.abs(img[10:60, 10:100].astype(int) - bg).max() > 12  # the panel
        drag = np.all(img.astype(int) > [200, 180, -1], axis=2) & (img[..., 2] < 100)
        assert drag.sum() > 5  # the yellow drag marker
        win.releases.append("LMB")
        win.presses.append(" ")
        ev = v.poll()
        assert ev.drag_released and ev.paused
        win.presses.append("q")
        assert v.poll().quit and not v.running
        assert win.shown == 3
    finally:
        v.close()
        v.close()
        release_window()  # leave no imgui state behind for the other tests


def test_size_option_sets_the_render_size_and_rejects_bad_input(tmp_path):
    """--size WxH becomes render.width/height; a malformed size is one line, exit code 2."""
    from typer.testing import CliRunner

    from tisim.cli.app import _size_overrides, app

    assert _size_overrides("1280x720") == ["render.width=1280", "render.height=720"]
    assert _size_overrides(None) == []
    from tisim.scene import load_scene

    scene = tmp_path / "s.toml"
    scene.write_text('[objects.b]\ngenerator = "box"\n')
    s = load_scene(scene, _size_overrides("320X200"))
    assert (s.render.width, s.render.height) == (320, 200)
    for bad in ("1280", "1280x", "8x8", "axb", "12x34x5", "100000x100000", "19200x10800"):
        r = CliRunner().invoke(app, ["run", str(scene), "--no-render", "-n", "1", "--size", bad])
        assert r.exit_code == 2, (bad, r.output)
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and "--size" in lines[0] and "WIDTHxHEIGHT" in lines[0], r.output


_FIRST_RENDER = r"""
from tisim import backend
backend.init("cpu", "f64")
from tisim.geometry.generate import box
from tisim.geometry.topology import surface_triangles
from tisim.render import ViewInfo
from tisim.render.offscreen import OffscreenRenderer
from tisim.scene import CameraConfig, RenderConfig
mesh = box((0.5, 0.5, 0.5), (2, 2, 2))
r = OffscreenRenderer()
r.open(ViewInfo(faces=surface_triangles(mesh.tets), vertex_count=len(mesh.vertices),
                camera=CameraConfig(position=(0.0, 0.0, 3.0), lookat=(0.0, 0.0, 0.0), fov=45.0),
                render=RenderConfig(width=64, height=48)))
r.draw(0, 0.0, mesh.vertices)
assert r.image().any()
r.close()
"""


@needs_vulkan
def test_first_render_on_a_fresh_machine_prints_no_taichi_warning(tmp_path):
    """With an empty kernel cache (a fresh machine's `make demo`), GGUI's copy kernels
    compile in the f64 process; given RGB vertex colours, Taichi's own kernel assigned an
    f64 literal alpha to its f32 buffer and warned "Assign may lose precision"."""
    env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=str(tmp_path))
    r = subprocess.run(
        [sys.executable, "-c", _FIRST_RENDER],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TaichiWarning" not in r.stderr + r.stdout, r.stderr[-3000:]
