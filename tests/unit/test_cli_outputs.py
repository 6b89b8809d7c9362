"""What a run does to its output folder: a refused rerun leaves the earlier run's
frames, a rerun removes only what the earlier run wrote, an --out that is a file is a
one-line error, and a cloth thrown at an absurd speed ends as diverged instead of
hanging in CCD (found by a review of the command line as a user meets it)."""

import json

import pytest

from tests.unit.test_cli import assert_one_line_error, tisim, tisim_here

SMALL = ("--set", "objects.cloth.cloth_resolution=[4,4]")


def _drape(demos_dir, out, *extra):
    return tisim_here(
        "run", str(demos_dir / "cloth-drape.toml"), "--headless", "--no-render", "-q", *SMALL, "--out", str(out), *extra
    )


@pytest.mark.slow
def test_a_refused_rerun_keeps_the_earlier_frames(tmp_path, demos_dir):
    """The earlier run's meshes were removed before the start-up checks refused the
    rerun, which left a run.json saying 'completed' beside empty folders."""
    out = tmp_path / "o"
    r = _drape(demos_dir, out, "--export-meshes", "-n", "2")
    assert r.returncode == 0, r.stderr
    before = sorted(p.name for p in (out / "meshes").iterdir())
    assert len(before) == 3
    r = _drape(demos_dir, out, "--export-meshes", "-n", "2", "--set", "objects.cloth.translation=[0,0.3,0]")
    assert_one_line_error(r, "the cloth intersects collider 'sphere'")
    assert sorted(p.name for p in (out / "meshes").iterdir()) == before


@pytest.mark.slow
def test_a_rerun_removes_only_what_the_earlier_run_wrote(tmp_path, demos_dir):
    """Numbered files of the user's own (another object's meshes, frame images where
    the earlier run wrote none, numbers past its last frame) stay."""
    out = tmp_path / "o"
    (out / "frames").mkdir(parents=True)
    (out / "meshes").mkdir()
    mine = [
        out / "frames" / "frame_00001.png",
        out / "meshes" / "scan_00001.obj",
        out / "meshes" / "bunny_00042.ply",
        out / "meshes" / "cloth_00099.obj",
    ]
    for p in mine:
        p.write_text("mine")
    r = _drape(demos_dir, out, "--export-meshes", "-n", "3")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "run.json").read_text())["outputs"] == {"frames": False, "meshes": True}
    r = _drape(demos_dir, out, "--export-meshes", "-n", "1")
    assert r.returncode == 0, r.stderr
    assert all(p.read_text() == "mine" for p in mine)
    assert sorted(p.name for p in (out / "meshes").glob("cloth_0000*.obj")) == ["cloth_00000.obj", "cloth_00001.obj"]


def test_an_out_that_is_a_file_is_a_one_line_error(tmp_path, demos_dir):
    f = tmp_path / "afile"
    f.write_text("mine")
    r = tisim("run", str(demos_dir / "spinning-bar.toml"), "--headless", "--no-render", "-n", "1", "--out", str(f))
    assert_one_line_error(r, "--out", "expected a folder", "afile")
    r = tisim("compare", "spinning-bar", "-i", "admm", "-n", "1", "--out", str(f))
    assert_one_line_error(r, "--out", "expected a folder")
    r = tisim(
        "run", str(demos_dir / "spinning-bar.toml"), "--headless", "--no-render", "-n", "1", "--out", str(f / "below")
    )
    assert_one_line_error(r, "--out", "cannot create the folder", "is a file")
    assert f.read_text() == "mine"


@pytest.mark.slow
def test_an_absurd_velocity_ends_as_diverged(tmp_path, demos_dir):
    """1e170 m/s hung the run in CCD (Ctrl-C did not stop it); 1e20 m/s ran to the end
    with a kinetic energy of 1e23 J."""
    for v in ("1e170", "1e20"):
        r = _drape(demos_dir, tmp_path / v, "-n", "3", "--set", f"objects.cloth.velocity=[{v},0,0]")
        assert r.returncode == 3, (r.returncode, r.stderr)
        assert "diverged at frame 1" in r.stderr and "in one step" in r.stderr, r.stderr
        assert "Warning" not in r.stderr, r.stderr
    r = _drape(demos_dir, tmp_path / "fast", "-n", "2", "--set", "objects.cloth.velocity=[100,0,0]")
    assert r.returncode == 0, r.stderr


def test_a_start_within_the_thickness_names_the_pair(tmp_path):
    """It said "two primitives start ... apart" without saying which."""
    p = tmp_path / "near.toml"
    p.write_text(
        '[solver]\ntype = "cloth"\n[contact]\nthickness = 1e-3\n[objects.sheet]\nkind = "cloth"\n'
        'generator = "cloth"\ncloth_size = [0.2, 0.2]\ncloth_resolution = [4, 4]\n'
        'translation = [0.0, 0.2005, 0.0]\n[colliders.rock]\ntype = "sphere"\n'
        'position = [0.0, 0.1, 0.0]\nradius = 0.1\n'
    )
    r = tisim("run", str(p), "--no-render", "-n", "1")
    assert_one_line_error(r, "near.toml", "of collider 'rock'", "start 0.0005 m apart", "move the cloth away")
    assert "cloth vertex" in r.stderr or "cloth edge" in r.stderr or "cloth triangle" in r.stderr, r.stderr
    p.write_text(
        '[solver]\ntype = "cloth"\n[contact]\nthickness = 1e-3\n'
        '[objects.a]\nkind = "cloth"\ngenerator = "cloth"\ncloth_size = [0.2, 0.2]\n'
        'cloth_resolution = [4, 4]\ntranslation = [0.0, 0.5, 0.0]\n'
        '[objects.b]\nkind = "cloth"\ngenerator = "cloth"\ncloth_size = [0.2, 0.2]\n'
        'cloth_resolution = [4, 4]\ntranslation = [0.0, 0.5005, 0.0]\n'
    )
    r = tisim("run", str(p), "--no-render", "-n", "1")
    assert_one_line_error(r, "near.toml", "start 0.0005 m apart", "cloth ")
    assert "collider" not in r.stderr, r.stderr


def test_run_given_a_demo_name_or_a_mesh_says_which_command(tmp_path):
    """`tisim run squeeze-ball` said only "no such scene file"; a mesh file was "not valid TOML"."""
    r = tisim("run", "squeeze-ball", "--no-render", "-n", "1", cwd=tmp_path)
    assert_one_line_error(r, "squeeze-ball", "is a demo", "tisim demo squeeze-ball")
    mesh = tmp_path / "sheet.obj"
    mesh.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n")
    r = tisim("run", str(mesh), "--no-render", "-n", "1")
    assert_one_line_error(r, "sheet.obj", "a mesh, not a scene", "tisim refine")
