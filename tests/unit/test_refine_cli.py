"""``tisim refine`` as a user meets it: bad meshes and inconsistent levels end with exit
code 2 and one line naming the problem; a bare mesh file gets a scene written next to
the output and runs."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from tisim.cli.app import app
from tisim.geometry.cloth import ClothMesh, save_cloth_obj
from tisim.geometry.generate import cloth_rectangle


def _refine(*args):
    return CliRunner().invoke(app, ["refine", *args, "--no-render", "--quiet"])


def _assert_one_line_error(r, *fragments):
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in r.output, r.output
    for f in fragments:
        assert f in errors[0], errors[0]


def _sheet(path, nx, ny, size=(0.4, 0.4), shift=(0.0, 0.0, 0.0)):
    m = cloth_rectangle(size=size, resolution=(nx, ny))
    save_cloth_obj(path, m.vertices + np.asarray(shift), ClothMesh(m.vertices, m.faces))
    return path


def _scene(tmp_path, mesh, extra=""):
    p = tmp_path / "s.toml"
    p.write_text(
        f'[sim]\ndt = 0.01\n[solver]\ntype = "cloth"\n[objects.c]\nkind = "cloth"\nmesh = "{mesh}"\n'
        f'translation = [0.0, 0.5, 0.0]\n{extra}'
    )
    return p


def test_mesh_too_coarse_for_the_levels(tmp_path):
    """One line naming the user's mesh (not the scene written for it), and nothing left
    behind: no scene, no output folder; a bad --wind is refused before anything is written."""
    mesh = _sheet(tmp_path / "small.obj", 6, 6)  # 49 vertices; 3 levels need >= 1200
    # (method "auto" refines such a mesh upward: test_coarse_mesh_is_the_preview_of_loop_levels)
    r = _refine(
        str(mesh), "--levels", "3", "--frames", "1", "--out", str(tmp_path / "o"), "--set", "refine.method=decimate"
    )
    _assert_one_line_error(r, "small.obj: ", "3-level hierarchy", "at least", "49", 'refine.method = "loop"')
    assert not (tmp_path / "o").exists() and "wrote the scene" not in r.output
    r = _refine(str(mesh), "--levels", "1", "--wind", "nan,0,0", "--frames", "1", "--out", str(tmp_path / "o"))
    _assert_one_line_error(r, "--wind", "nan,0,0")
    assert not (tmp_path / "o").exists()


def test_coarse_mesh_is_the_preview_of_loop_levels(tmp_path):
    """A mesh too coarse to decimate into the levels asked for (49 vertices, 3 levels) is
    the preview, and Loop subdivision makes the finer ones (49 -> 169 -> 625), said in one
    line; the finest centre of mass follows the preview's."""
    import csv

    mesh = _sheet(tmp_path / "small.obj", 6, 6)
    r = CliRunner().invoke(
        app, ["refine", str(mesh), "--levels", "3", "--frames", "2", "--out", str(tmp_path / "o"), "--no-render"]
    )
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "Loop subdivision" in ln]
    assert len(lines) == 1 and "49 vertices" in lines[0] and "169, 625" in lines[0], lines
    assert sorted(p.name for p in (tmp_path / "o").glob("level_*")) == ["level_0", "level_1", "level_2"]
    with open(tmp_path / "o" / "consistency.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert max(float(row["com_distance_rel_2"]) for row in rows) < 0.02


def test_user_levels_far_apart(tmp_path):
    coarse = _sheet(tmp_path / "coarse.obj", 4, 4, shift=(0.0, 0.3, 0.0))  # 0.3 m above the fine sheet
    fine = _sheet(tmp_path / "fine.obj", 12, 12)
    p = _scene(tmp_path, fine, f'[refine]\nlevels = 2\nmethod = "meshes"\nmeshes = ["{coarse}"]\n')
    r = _refine(str(p), "--frames", "1", "--out", str(tmp_path / "o"))
    _assert_one_line_error(r, "s.toml", "level 1 is far from level 0", "embedding distance")


def test_user_levels_of_different_shapes(tmp_path):
    # the coarse level folded into a tent over the flat fine sheet
    m = cloth_rectangle(size=(0.4, 0.4), resolution=(4, 4))
    v = m.vertices.copy()
    v[:, 1] += 0.5 * np.abs(v[:, 0])
    coarse = tmp_path / "coarse.obj"
    save_cloth_obj(coarse, v, ClothMesh(m.vertices, m.faces))
    fine = _sheet(tmp_path / "fine.obj", 12, 12)
    p = _scene(tmp_path, fine, f'[refine]\nlevels = 2\nmethod = "meshes"\nmeshes = ["{coarse}"]\n')
    r = _refine(str(p), "--frames", "1", "--out", str(tmp_path / "o"))
    _assert_one_line_error(r, "far from level 0")


def test_user_levels_wrong_count(tmp_path):
    fine = _sheet(tmp_path / "fine.obj", 12, 12)
    p = _scene(tmp_path, fine, '[refine]\nlevels = 3\nmethod = "meshes"\nmeshes = []\n')
    r = _refine(str(p), "--frames", "1", "--out", str(tmp_path / "o"))
    _assert_one_line_error(r, "refine.meshes", "expected 2 coarser meshes")


def test_non_manifold_mesh(tmp_path):
    # three triangles on one edge (0-1): not a surface
    p = tmp_path / "fan.obj"
    p.write_text("v 0 0 0\nv 1 0 0\nv 0.5 1 0\nv 0.5 -1 0\nv 0.5 0 1\nf 1 2 3\nf 2 1 4\nf 1 2 5\n")
    r = _refine(str(p), "--frames", "1", "--out", str(tmp_path / "o"))
    _assert_one_line_error(r, "fan.obj", "non-manifold")


def _pieces(faces):
    """Each vertex's piece (faces joined across shared edges), -1 where pieces touch."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    m, n = len(faces), int(faces.max()) + 1
    vf = sp.csr_matrix((np.ones(3 * m), (np.repeat(np.arange(m), 3), faces.ravel())), shape=(m, n))
    ff = vf @ vf.T
    ff.data = (ff.data >= 2).astype(float)  # faces sharing an edge
    ff.eliminate_zeros()
    _, face_piece = connected_components(ff)
    pairs = np.unique(np.stack([faces.ravel(), np.repeat(face_piece, 3)], 1), axis=0)  # (vertex, piece)
    vertex, count = np.unique(pairs[:, 0], return_counts=True)
    piece = np.full(n, -1)
    piece[vertex[count == 1]] = pairs[np.isin(pairs[:, 0], vertex[count == 1]), 1]
    return piece


def test_a_bowtie_mesh_refines_with_its_sheets_kept_apart(tmp_path):
    """Two 18 x 18 sheets touching at one corner only (a non-manifold vertex, accepted with
    a warning). Decimation keeps the touching vertex and the two sheets on the coarse level,
    every fine vertex follows coarse vertices of its own sheet only, and no level's frames
    intersect."""
    import json

    from tisim.geometry.cloth import find_intersections, load_cloth_mesh
    from tisim.geometry.topology import nonmanifold_vertices
    from tisim.model import Model
    from tisim.progressive import build_levels
    from tisim.scene import load_scene

    m = cloth_rectangle(size=(0.3, 0.3), resolution=(18, 18))
    v = m.vertices
    a, b = v - [v[:, 0].max(), 0.0, v[:, 2].max()], v - [v[:, 0].min(), 0.0, v[:, 2].min()]
    ka, kb = int(np.argmin(np.linalg.norm(a, axis=1))), int(np.argmin(np.linalg.norm(b, axis=1)))
    keep = np.arange(len(b)) != kb
    to = np.where(keep, np.cumsum(keep) - 1 + len(a), ka)
    x, f = np.concatenate([a, b[keep]]), np.concatenate([m.faces, to[m.faces]])
    mesh = tmp_path / "bowtie.obj"
    mesh.write_text(
        "".join(f"v {p[0]:.17g} {p[1]:.17g} {p[2]:.17g}\n" for p in x)
        + "".join(f"f {t[0] + 1} {t[1] + 1} {t[2] + 1}\n" for t in f)
    )
    assert nonmanifold_vertices(f).tolist() == [ka] and len(x) == 721

    out = tmp_path / "o"
    r = _refine(str(mesh), "--frames", "2", "--levels", "2", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "2 levels (" in r.output and "721 vertices)" in r.output, r.output
    for level in (0, 1):
        frames = sorted((out / f"level_{level}" / "meshes").glob("*.obj"))
        assert len(frames) == 3
        for p in frames:
            c = load_cloth_mesh(p)
            assert len(nonmanifold_vertices(c.faces)) == 1, p  # the sheets still touch at one vertex
            assert set(_pieces(c.faces).tolist()) == {-1, 0, 1}, p  # two sheets and the shared vertex
            assert not find_intersections(c.vertices, c.faces, c.edges), p
    assert json.loads((out / "run.json").read_text())["ended"] == "completed"

    sc = load_scene(out / "bowtie.toml")
    hierarchy, _, _ = build_levels(sc, Model.from_scene(sc), 2)
    coarse, fine = (_pieces(lv.faces) for lv in hierarchy.levels)
    U = hierarchy.prolongations[0].U.tocsr()
    U.eliminate_zeros()
    leans = {(int(fine[i]), int(coarse[j])) for i, j in zip(*U.nonzero()) if fine[i] >= 0 and coarse[j] >= 0}
    assert len(leans) == 2 and len({p for p, _ in leans}) == 2, leans  # sheet to sheet, one to one


@pytest.mark.slow
def test_mesh_file_gets_a_scene_and_runs(tmp_path):
    mesh = _sheet(tmp_path / "my.obj", 5, 5, size=(0.3, 0.3))
    out = tmp_path / "out"
    r = _refine(str(mesh), "--drape-on", "ground", "--frames", "2", "--levels", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    scene = out / "my.toml"
    assert scene.exists() and "wrote the scene" in r.output
    assert (out / "level_0" / "checkpoints" / "frame_00002.npz").exists()
    assert (out / "run.json").exists()
    from tisim.scene import load_scene

    sc = load_scene(scene)
    assert sc.objects["cloth"].kind == "cloth" and "ground" in sc.colliders


def test_mesh_options_on_a_scene_are_refused(tmp_path):
    """--drape-on, --pin and --wind make the scene of a mesh file; given with a scene
    they were silently ignored."""
    scene = _scene(tmp_path, _sheet(tmp_path / "m.obj", 4, 4))
    for flag, value in (("--pin", "corners"), ("--drape-on", "box"), ("--wind", "1,0,0")):
        r = _refine(str(scene), flag, value, "--frames", "1", "--out", str(tmp_path / "o"))
        _assert_one_line_error(r, flag, "applies to a mesh file", "s.toml")


@pytest.mark.slow
def test_resume_keeps_the_scene_and_refuses_another(tmp_path):
    """Rerunning the mesh command keeps an edited scene beside the new one; --resume runs
    the scene that is there; a resume with other levels or other scene values is refused
    in one line (it crashed, or mixed frames of two set-ups)."""
    mesh = _sheet(tmp_path / "my.obj", 25, 25, size=(0.3, 0.3))  # 676 vertices: 2 levels
    out = tmp_path / "out"
    args = ("--drape-on", "ground", "--frames", "1", "--levels", "2", "--out", str(out))
    r = _refine(str(mesh), *args)
    assert r.exit_code == 0, r.output
    scene = out / "my.toml"
    edited = scene.read_text().replace("[objects.cloth]", "# my edit\n[objects.cloth]")
    scene.write_text(edited)
    r = _refine(str(mesh), *args, "--resume")  # continues with the edited scene, untouched
    assert r.exit_code == 0 and "resuming with the scene" in r.output, r.output
    assert scene.read_text() == edited
    r = _refine(str(mesh), *args)  # a fresh run: the edited scene is kept beside
    assert r.exit_code == 0 and "kept the earlier scene as" in r.output, r.output
    assert (out / "my.1.toml").read_text() == edited and "# my edit" not in scene.read_text()
    r = _refine(
        str(scene),
        "--frames",
        "2",
        "--levels",
        "2",
        "--out",
        str(out),
        "--resume",
        "--set",
        "objects.cloth.density=2000",
    )
    _assert_one_line_error(r, "cannot resume", "objects.cloth.density", "2000", "--out")
    r = _refine(str(scene), "--frames", "2", "--levels", "1", "--out", str(out), "--resume")
    _assert_one_line_error(r, "cannot resume", "levels", "--out")
    r = _refine(str(scene), "--frames", "2", "--levels", "2", "--out", str(out), "--resume")
    assert r.exit_code == 0, r.output  # the same refine, two frames more
    assert (out / "level_1" / "checkpoints" / "frame_00002.npz").exists()


def test_rerunning_the_mesh_command_with_another_frame_count_keeps_no_copy(tmp_path):
    """Only -n changed the written scene, and every rerun kept the last one as my.K.toml."""
    mesh = _sheet(tmp_path / "my.obj", 25, 25, size=(0.3, 0.3))
    out = tmp_path / "out"
    for n in ("1", "2"):
        r = _refine(str(mesh), "--drape-on", "ground", "--frames", n, "--levels", "2", "--out", str(out))
        assert r.exit_code == 0 and "kept the earlier scene" not in r.output, r.output
    assert sorted(p.name for p in out.glob("*.toml")) == ["my.toml"]
    assert "frames = 2" in (out / "my.toml").read_text()


def test_a_refused_refine_and_a_resume_of_a_finished_one_leave_the_folder_as_it_was(tmp_path):
    """A rerun refused by a level's start-up check first emptied the levels' frames,
    meshes and checkpoints and left run.json 'running'; --resume of a finished refine
    rewrote run.json with empty timings ("nan ms/frame")."""
    mesh = _sheet(tmp_path / "my.obj", 12, 12, size=(0.3, 0.3))
    scene = _scene(
        tmp_path,
        mesh,
        '[colliders.rock]\ntype = "sphere"\nposition = [0.0, 0.2, 0.0]\nradius = 0.1\n[refine]\nmethod = "loop"\n',
    )
    out = tmp_path / "out"
    r = _refine(str(scene), "--frames", "2", "--levels", "2", "--out", str(out))
    assert r.exit_code == 0, r.output

    def files():
        return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    before = files()
    assert any(p.suffix == ".npz" for p in before) and (out / "run.json") in [out / p for p in before]
    r = _refine(str(scene), "--frames", "2", "--levels", "2", "--out", str(out), "--resume")
    assert r.exit_code == 0 and "nothing to resume" in r.output, r.output
    assert files() == before
    r = _refine(
        str(scene),
        "--frames",
        "2",
        "--levels",
        "2",
        "--out",
        str(out),
        "--set",
        "objects.c.translation=[0.0, 0.2, 0.0]",
    )  # through the rock
    _assert_one_line_error(r, "the cloth intersects collider 'rock'")
    assert files() == before


@pytest.mark.slow
def test_a_resume_that_steps_some_levels_keeps_the_others_timings(tmp_path):
    """A resume with the preview's frames all there steps only the finest level: run.json
    kept the preview with frames 0 and no median, and the command said "nan ms/frame".
    Now the preview's entry is the earlier run's; a --direct resume of a refine made
    without the direct runs is not "nothing to resume"."""
    import json

    mesh = _sheet(tmp_path / "my.obj", 4, 4, size=(0.3, 0.3))
    scene = _scene(tmp_path, mesh, '[refine]\nmethod = "loop"\n')
    out = tmp_path / "out"
    args = (str(scene), "--frames", "2", "--levels", "2", "--out", str(out))
    r = _refine(*args)
    assert r.exit_code == 0, r.output
    before = json.loads((out / "run.json").read_text())["levels"]
    (out / "level_1" / "checkpoints" / "frame_00002.npz").unlink()  # the finest level's last frame to redo
    r = _refine(*args, "--resume")
    assert r.exit_code == 0 and "nan" not in r.output and "its frames were there already" not in r.output, r.output
    after = json.loads((out / "run.json").read_text())["levels"]
    assert [e["level"] for e in after] == [0, 1]
    assert after[0] == before[0] and after[0]["frames"] == 2 and after[1]["frames"] == 1, after
    r = _refine(*args, "--resume", "--direct")
    assert r.exit_code == 0 and "nothing to resume" not in r.output, r.output
    assert "direct" in json.loads((out / "run.json").read_text())


def test_pipeline_groups_give_the_finest_levels_the_spare_cores():
    from tisim.progressive import pipeline_groups

    assert pipeline_groups(3, cores=2) == [[0, 1], [2]]
    assert pipeline_groups(3, cores=3) == [[0], [1], [2]]
    assert pipeline_groups(3, cores=16) == [[0], [1], [2]]
    assert pipeline_groups(4, cores=3) == [[0, 1], [2], [3]]
    assert pipeline_groups(2, cores=2) == [[0], [1]]
    assert pipeline_groups(3, cores=1) == [[0, 1, 2]]
    assert pipeline_groups(1, cores=4) == [[0]]


def test_pipelined_processes_share_the_cores(monkeypatch):
    """Each of the pipelined schedule's processes gets cores // processes threads (at
    least one), and a count the user set in the environment is kept."""
    import os

    from tisim.progressive import _environment, pipeline_threads

    assert pipeline_threads(3, cores=2) == {
        "TI_CPU_MAX_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    assert pipeline_threads(3, cores=16)["TI_CPU_MAX_NUM_THREADS"] == "5"
    monkeypatch.setenv("TI_CPU_MAX_NUM_THREADS", "2")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with _environment(pipeline_threads(3, cores=2)):
        assert os.environ["TI_CPU_MAX_NUM_THREADS"] == "2" and os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["TI_CPU_MAX_NUM_THREADS"] == "2" and "OPENBLAS_NUM_THREADS" not in os.environ


def test_a_resume_compiles_the_loops_as_the_run_it_continues(monkeypatch, tmp_path):
    """Serial and parallel kernel loops differ in the last bits (see
    test_bits_depend_on_the_loops_form_not_the_thread_count): a --resume sets
    TISIM_SERIAL_LOOPS from the interrupted refine's run.json, parallel for one written
    before run.json recorded it, and leaves it alone without a run.json."""
    import json
    import os

    from tisim.cli.refine import _previous_refine, _refine_loops_as

    monkeypatch.setenv("TISIM_SERIAL_LOOPS", "")  # so that monkeypatch removes it afterwards
    monkeypatch.delenv("TISIM_SERIAL_LOOPS")
    assert _previous_refine(tmp_path) == {}
    _refine_loops_as(_previous_refine(tmp_path))
    assert "TISIM_SERIAL_LOOPS" not in os.environ
    for recorded, want in (
        ({"serial_loops": True}, "1"),
        ({"serial_loops": False}, "0"),
        ({"ended": "interrupted", "cpu_threads": None}, "0"),
    ):
        (tmp_path / "run.json").write_text(json.dumps(recorded))
        _refine_loops_as(_previous_refine(tmp_path))
        assert os.environ["TISIM_SERIAL_LOOPS"] == want, recorded
    (tmp_path / "run.json").write_text("{not json")
    assert _previous_refine(tmp_path) == {}


def _disc(path):
    from tisim.geometry.generate import cloth_disc

    m = cloth_disc(0.5, 0.025, seed=3)  # 1,513 vertices; its decimation to 380 made slivers
    save_cloth_obj(path, m.vertices, ClothMesh(m.vertices, m.faces))
    return path


@pytest.mark.slow
def test_decimated_preview_of_a_disc_falls(tmp_path):
    """A user's disc refined with two levels: the decimated preview had slivers whose
    vertices started within the contact thickness of their neighbours; every Newton step
    was then cut to nothing, and both levels hung in the air for the whole take."""
    import csv

    out = tmp_path / "out"
    r = _refine(
        str(_disc(tmp_path / "disc.obj")), "--drape-on", "sphere", "--frames", "6", "--levels", "2", "--out", str(out)
    )
    assert r.exit_code == 0, r.output
    for level in (0, 1):
        rows = list(csv.DictReader((out / f"level_{level}" / "stats.csv").open()))
        drop = float(rows[0]["com_y"]) - float(rows[-1]["com_y"])
        assert drop > 0.01, (level, drop)  # free fall for 0.06 s: 0.0177 m
        assert all(row["converged"] == "1" for row in rows), level


@pytest.mark.slow
def test_coarse_level_thinner_than_the_thickness_starts(tmp_path):
    """A contact thickness above a decimated level's smallest triangle height (2.6 mm on
    the middle level of this disc, 3.2 and 4.1 mm on the others): that level used to be
    refused ('within the contact thickness'); the pairs in contact at rest are now left out
    of self-contact (tisim.contact.ipc.exclusion), so every level starts and runs."""
    from tisim.geometry.generate import cloth_disc

    m = cloth_disc(0.5, 0.0125, seed=5)
    mesh = tmp_path / "disc.obj"
    save_cloth_obj(mesh, m.vertices, ClothMesh(m.vertices, m.faces))
    p = _scene(tmp_path, mesh, '[contact]\nthickness = 0.0029\n[refine]\nlevels = 3\nmethod = "decimate"\n')
    r = _refine(str(p), "--frames", "1", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    assert len(list((tmp_path / "o").glob("level_*/stats.csv"))) == 3


def test_flat_mesh_pinned_at_its_top_edge_is_stood_up(tmp_path):
    """`--pin top-edge` on a mesh lying flat: its whole border is its top edge (the model
    refuses that), so the written scene stands it up to hang from the edge it then has."""
    import csv

    from tisim.scene import load_scene

    mesh = _sheet(tmp_path / "flat.obj", 6, 6)
    out = tmp_path / "out"
    r = _refine(str(mesh), "--pin", "top-edge", "--frames", "2", "--levels", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    oc = load_scene(out / "flat.toml").objects["cloth"]
    assert oc.rotation == (90.0, 0.0, 0.0) and oc.pin == "top-edge"
    rows = list(csv.DictReader((out / "level_0" / "stats.csv").open()))
    assert all(row["converged"] == "1" for row in rows)


def test_a_mesh_in_millimetres_gets_a_hint(tmp_path, caplog):
    """Coordinates are metres: a sheet modelled in millimetres (400 units wide) would be
    draped as a 400 m sheet without a word; the scene says what it drapes on."""
    import logging

    from tisim.progressive import scene_for_mesh

    mm = _sheet(tmp_path / "mm.obj", 4, 4, size=(400.0, 400.0))
    with caplog.at_level(logging.WARNING, logger="tisim.progressive"):
        text = scene_for_mesh(mm, drape_on="ground")
    assert any("mm.obj is 566 m across" in r.message and "millimetres" in r.message for r in caplog.records)
    assert 'description = "mm.obj draped on the ground' in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tisim.progressive"):
        scene_for_mesh(_sheet(tmp_path / "m.obj", 4, 4), drape_on="box")
    assert not caplog.records
