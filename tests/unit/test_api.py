"""The Python API (tisim.api): loading with overrides, runs, positions, images, clips,
compare; ``import tisim`` stays light."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tisim
from tisim.config import ConfigError
from tisim.render import vulkan_available

needs_vulkan = pytest.mark.skipif(not vulkan_available(), reason="no Vulkan driver for off-screen rendering")

# a coarse stick-slip box: 2x2x2 cells (27 vertices) keep a run to a fraction of a second
SMALL = {"objects.box.resolution": [2, 2, 2], "render.width": 160, "render.height": 120}


def test_import_tisim_imports_neither_taichi_nor_pandas():
    code = (
        "import sys, tisim; assert callable(tisim.load); "
        "print(sorted(m for m in ('taichi', 'pandas', 'tisim.api') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # tisim.load is looked up lazily: the API module, but neither heavy package
    assert r.stdout.strip() == "['tisim.api']", r.stdout


def test_compare_and_sweep_stay_callable_after_their_modules_are_imported():
    """tisim.compare and tisim.sweep are also submodules; importing one (as the API itself
    does) made the package attribute the module, and a second tisim.compare(...) raised
    "'module' object is not callable"."""
    import tisim.compare
    import tisim.sweep

    assert callable(tisim.compare) and callable(tisim.sweep)
    assert tisim.compare.summarize is not None  # the module's contents are still there
    with pytest.raises(ConfigError, match="no such scene file or demo"):
        tisim.sweep("no-such-demo", {"contact.mu": [0.1]})


def test_no_api_name_is_also_a_submodule():
    """A submodule named like an API function replaces it on the package once imported
    (tisim/demos.py made tisim.demos() "'module' object is not callable" after tisim demo
    --list had run in the process); compare and sweep are the callable exceptions."""
    import importlib.util

    for name in tisim._API:
        assert importlib.util.find_spec(f"tisim.{name}") is None, name


def test_load_applies_overrides_as_the_cli_set_does():
    sim = tisim.load("stick-slip", **{"contact.mu": 0.18, "objects.box.resolution": [2, 2, 2]})
    assert sim.scene.contact.mu == 0.18
    assert sim.scene.objects["box"].resolution == (2, 2, 2)
    assert sim.overrides == ("contact.mu=0.18", "objects.box.resolution=[2, 2, 2]")
    assert tisim.load("stick-slip").scene.contact.mu != 0.18  # the default is another value
    again = sim.with_overrides(**{"contact.mu": 0.3})
    assert again.scene.contact.mu == 0.3 and sim.scene.contact.mu == 0.18


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"contact.mu": -1.0}, "contact.mu"),
        ({"mu": 0.2}, "mu: expected a dotted scene key"),
        ({"contact.nu": 0.2}, "contact.nu"),
    ],
)
def test_bad_overrides_name_the_key(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        tisim.load("stick-slip", **overrides)


def test_an_unknown_scene_names_the_demos():
    with pytest.raises(ConfigError, match=r"no such scene file or demo.*stick-slip"):
        tisim.load("no-such-demo")


def test_a_scene_file_path_loads(demos_dir):
    assert tisim.load(demos_dir / "stick-slip.toml").name == "stick-slip"


def test_run_gives_the_stats_and_every_frames_positions(tmp_path):
    sim = tisim.load("stick-slip", **SMALL)
    res = sim.run(frames=3, out=tmp_path / "run")
    assert res.ended == "completed" and res.frames == 3
    assert list(res.stats["frame"]) == [0, 1, 2, 3]
    assert res.positions.shape == (4, sim.model.vertex_count, 3)
    np.testing.assert_array_equal(res.positions[0], sim.rest_positions)
    # the positions kept are the ones the stats were computed from: the mass-weighted
    # centre of mass of each frame is stats.csv's (an off-by-one frame would differ)
    m = sim.model.mass
    com = (m[:, None] * res.positions).sum(1) / m.sum()
    np.testing.assert_allclose(com, res.stats[["com_x", "com_y", "com_z"]].to_numpy(), rtol=0, atol=1e-12)
    assert np.abs(np.diff(com[:, 1])).max() > 0  # it moved: frames differ
    last = sim.run(frames=3, out=tmp_path / "last", keep="last")
    assert last.positions.shape == (2, sim.model.vertex_count, 3)
    np.testing.assert_array_equal(last.last_positions, res.last_positions)  # deterministic on the CPU
    assert (tmp_path / "run" / "stats.csv").exists() and (tmp_path / "run" / "run.json").exists()


def test_run_default_folder_is_the_clis(tmp_path):
    sim = tisim.load("stick-slip", **SMALL)
    res = sim.run(frames=1)
    assert res.out_dir == tmp_path.joinpath("out", "stick-slip").relative_to(tmp_path)
    assert (tmp_path / "out" / "stick-slip" / "stats.csv").exists()


@needs_vulkan
def test_render_frame_draws_the_body_and_its_labels(tmp_path):
    sim = tisim.load("stick-slip", **SMALL)
    img = sim.render_frame()
    assert img.shape == (120, 160, 3) and img.dtype == np.uint8
    # the box is orange (scene colour 0.85, 0.45, 0.25): some pixels are red-dominant
    assert np.count_nonzero((img[..., 0].astype(int) - img[..., 2]) > 60) > 50
    moved = sim.render_frame(sim.rest_positions + [0.0, 0.3, 0.0])
    assert np.abs(moved.astype(int) - img).sum() > 0  # the positions given are drawn
    labelled = sim.render_frame(labels=["t = 0.000 s"])
    corner = np.s_[4:30, 4:80]
    assert np.abs(labelled[corner].astype(int) - img[corner]).max() > 100  # text written there
    with pytest.raises(ValueError, match="positions must be"):
        sim.render_frame(np.zeros((3, 3)))
    # another size in between replaces the process's one GGUI window: this one reopens
    other = tisim.load("stick-slip", **{**SMALL, "render.width": 96, "render.height": 64})
    assert other.render_frame().shape == (64, 96, 3)
    np.testing.assert_array_equal(sim.render_frame(), img)


@needs_vulkan
def test_video_of_a_run_is_an_inline_mp4(tmp_path):
    sim = tisim.load("stick-slip", **SMALL)
    res = sim.run(frames=2, out=tmp_path / "v")
    clip = res.video()
    assert clip.path == tmp_path / "v" / "stick-slip.mp4" and clip.path.stat().st_size > 1000
    html = clip._repr_html_()
    assert html.startswith("<video") and "data:video/mp4;base64," in html
    recorded = sim.run(frames=2, out=tmp_path / "r", render=True)
    assert len(list((tmp_path / "r" / "frames").glob("frame_*.png"))) == 3
    assert recorded.video().path == tmp_path / "r" / "stick-slip.mp4"


def test_compare_returns_a_table_and_each_integrators_stats(tmp_path):
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # the user's backend (a notebook's inline one)
    try:
        cmp = tisim.compare(
            "spinning-bar",
            ["admm", "implicit-euler"],
            frames=2,
            out=tmp_path / "c",
            render=False,
            **{"objects.bar.resolution": [4, 1, 1]},
        )
        # the plots are drawn without switching it: matplotlib.use("Agg") did, and a
        # notebook's own plots stopped showing after its first compare
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert (tmp_path / "c" / "energy.png").stat().st_size > 1000
    assert list(cmp.table.index) == ["admm", "implicit-euler"]
    assert set(cmp.table["ended"]) == {"completed"}
    assert {k: len(v) for k, v in cmp.stats.items()} == {"admm": 3, "implicit-euler": 3}
    # the table's drift is the one the stats give (summarize's definition)
    s = cmp.stats["implicit-euler"]
    E = s["total_energy"].to_numpy()
    want = np.abs(E - E[0]).max() / max(abs(E[0]), s["kinetic"].max())
    assert cmp.table.loc["implicit-euler", "energy_max_drift_rel"] == pytest.approx(want, rel=1e-9)
    assert want > 0
    with pytest.raises(FileNotFoundError):
        cmp.video()


def test_demos_table_has_every_demo_with_what_to_look_for(demos_dir):
    df = tisim.demos()
    assert sorted(df["name"]) == sorted(p.stem for p in demos_dir.glob("*.toml"))
    assert (df["description"].str.len() > 20).all() and (df["look_for"].str.len() > 20).all()
