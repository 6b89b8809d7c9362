"""The overall exit code of ``tisim compare`` and ``tisim sweep`` when several runs end
badly: README ("with several, the first of 130, 1, 2, 3, 4") and tisim.cli.app. The runs
themselves are monkeypatched to end as wanted (no simulation), and the expected code is
worked out here from the documented order and the documented code of each ending:
interrupted 130, internal failure 1, a user's mistake (ConfigError, MeshError, ...) 2,
diverged 3, stalled 4."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

# (ended, error class name) -> the code `tisim run` documents for such a run
ENDINGS = {
    ("interrupted", None): 130,
    ("failed", "RuntimeError"): 1,
    ("failed", "ConfigError"): 2,
    ("diverged", None): 3,
    ("stalled", None): 4,
}
ORDER = (130, 1, 2, 3, 4)
# every pair and triple of endings, and all five
CASES = [c for n in (1, 2, 3, 5) for c in itertools.combinations(ENDINGS, n)]


def _expected(endings) -> int:
    codes = {ENDINGS[e] for e in endings}
    return next(c for c in ORDER if c in codes)


@pytest.fixture
def scene_file(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('[sim]\ndt = 0.01\nframes = 1\n[objects.box]\ngenerator = "box"\n')
    return p


@pytest.mark.parametrize("endings", CASES, ids=lambda c: "+".join(e[0] + (f"-{e[1]}" if e[1] else "") for e in c))
def test_compare_exits_with_the_first_of_the_documented_order(endings, scene_file, tmp_path, monkeypatch):
    import tisim.compare as cmp
    from tisim.cli.app import app

    summary = {"integrators": {}}
    for k, (ended, error) in enumerate(endings):
        entry = {"ended": ended, "message": f"run {k} {ended}"}
        if error:
            entry["error"] = error
        summary["integrators"][f"int{k}"] = entry
    summary["integrators"]["fine"] = {"ended": "completed", "message": ""}  # one that completed
    names = ",".join(summary["integrators"])
    monkeypatch.setattr(cmp, "check_comparable", lambda sc, chosen: None)
    monkeypatch.setattr(cmp, "compare", lambda sc, chosen, out, frames=None, **kw: summary)
    monkeypatch.setattr(cmp, "format_table", lambda s: [])
    r = CliRunner().invoke(app, ["compare", str(scene_file), "-i", names, "--out", str(tmp_path / "o")])
    assert r.exit_code == _expected(endings), (r.exit_code, r.output)


@pytest.mark.parametrize("endings", CASES, ids=lambda c: "+".join(e[0] + (f"-{e[1]}" if e[1] else "") for e in c))
def test_sweep_exits_with_the_first_of_the_documented_order(endings, scene_file, tmp_path, monkeypatch):
    import tisim.sweep as sw
    from tisim.cli.app import app

    # a sweep reports Ctrl-C as the whole sweep interrupted, the other endings per row
    interrupted = ("interrupted", None) in endings
    rows = [{"run": f"r{k}", "ended": e, "error": err} for k, (e, err) in enumerate(endings) if e != "interrupted"]
    rows.append({"run": "ok", "ended": "completed", "error": None})
    counts = {}
    for row in rows:
        counts[row["ended"]] = counts.get(row["ended"], 0) + 1
    res = SimpleNamespace(rows=rows, counts=lambda: counts, ran=len(rows), skipped=0, interrupted=interrupted)
    monkeypatch.setattr(sw, "sweep", lambda *a, **k: res)
    r = CliRunner().invoke(
        app, ["sweep", str(scene_file), "--vary", "contact.mu=0.1,0.2", "--out", str(tmp_path / "o"), "-q"]
    )
    assert r.exit_code == _expected(endings), (r.exit_code, r.output)


def test_every_documented_code_wins_somewhere():
    """The cases above exercise each code as the winner (so no branch of the order is unchecked)."""
    assert {_expected(c) for c in CASES} == set(ORDER)
