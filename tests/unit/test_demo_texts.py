"""tisim demo --list prints every demo's whole description; --about adds what to look for;
the [scene] look_for key is validated like every key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tisim.cli.app import app
from tisim.config import ConfigError
from tisim.demo_texts import demo_texts
from tisim.scene import scene_from_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _words(text: str) -> str:
    return " ".join(text.split())


def test_list_shows_each_whole_description(demos_dir):
    r = CliRunner().invoke(app, ["demo", "--list"])
    assert r.exit_code == 0, r.output
    printed = _words(r.output)
    for p in sorted(demos_dir.glob("*.toml")):
        desc = _words(tomllib.loads(p.read_text())["scene"]["description"])
        # the whole text (it was cut at 110 characters with "..."), wrapped but in order
        assert f"{p.stem} {desc}" in printed, p.stem
    assert not any(ln.endswith(" ...") for ln in r.output.splitlines())  # the old cut
    assert max(len(ln) for ln in r.output.splitlines()) <= 120  # wrapped


@pytest.mark.parametrize("name", ["stick-slip", "spinning-bar"])
def test_about_prints_the_description_and_what_to_look_for(name, demos_dir):
    r = CliRunner().invoke(app, ["demo", name, "--about"])
    assert r.exit_code == 0, r.output
    scene = tomllib.loads((demos_dir / f"{name}.toml").read_text())["scene"]
    out = _words(r.output)
    assert _words(scene["description"]) in out
    assert "What to look for:" in r.output and _words(scene["look_for"]) in out
    assert not Path("out").exists()  # nothing ran


def test_about_without_a_name_is_a_one_line_error():
    r = CliRunner().invoke(app, ["demo", "--about"])
    assert r.exit_code == 2 and "--about needs a demo's name" in r.output


def test_every_demo_says_what_to_look_for():
    texts = demo_texts()
    assert len(texts) >= 19
    for name, desc, look in texts:
        assert len(desc) > 40 and len(look) > 40, name


def test_look_for_is_validated():
    base = {"objects": {"b": {"generator": "box"}}}
    assert scene_from_dict({**base, "scene": {"look_for": "the box falls"}}).scene.look_for == "the box falls"
    with pytest.raises(ConfigError, match=r"scene.look_for"):
        scene_from_dict({**base, "scene": {"look_for": 3}})
    with pytest.raises(ConfigError, match=r"scene.look_fr"):
        scene_from_dict({**base, "scene": {"look_fr": "typo"}})


def test_a_closed_pipe_ends_the_list_quietly(monkeypatch, capsys):
    """`tisim demo --list | head -1`: the longer list meets a closed pipe; the command
    ended in an AttributeError traceback (typer's click has no Abort to catch) instead of
    a quiet exit."""
    import io

    from tisim.cli.app import main

    class ClosedPipe(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "argv", ["tisim", "demo", "--list"])
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 1
