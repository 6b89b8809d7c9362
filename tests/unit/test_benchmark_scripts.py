"""benchmarks/ and studies/: every script starts (its imports, including the shared
``benchmarks/common.py``, resolve when run as ``python benchmarks/NAME.py``), and the shared
helpers name machines and result files as docs/benchmarks.md says."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# spirv_loop_atomics takes no options: it runs its probes at once (seconds of Taichi compile)
SCRIPTS = sorted(
    p
    for p in [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("studies/*.py")]
    if p.name not in ("common.py", "spirv_loop_atomics.py")
)


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "benchmarks" / "common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_scripts_are_where_the_docs_say():
    names = {p.name for p in SCRIPTS}
    assert {"bench_cloth.py", "bench_pd.py", "bench_contact.py", "twist_accuracy.py"} <= names
    assert {"stick_slip.py", "midpoint_diagnosis.py", "contact_trace.py"} <= names
    # tools/ keeps set-up and asset scripts only
    assert not list((ROOT / "tools").glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_starts(script):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage" in r.stdout.lower()


def test_machine_slug_and_result_path(tmp_path, monkeypatch):
    c = _common()
    assert c.machine_slug({"cpu": "Intel(R) Xeon(R) Processor", "cores": 2}) == "intel-xeon-2c"
    assert c.machine_slug({"cpu": "AMD EPYC 7B13 64-Core Processor", "cores": 2}) == "amd-epyc-2c"
    monkeypatch.setattr(c, "RESULTS", tmp_path)
    m = {"cpu": "AMD EPYC 7B13", "cores": 16}
    first = c.result_path("cloth", m, date="2026-01-02")
    assert first == tmp_path / "cloth" / "2026-01-02-amd-epyc-16c.json"
    c.write_json(first, {"x": 1})
    # a second result of the same day and machine never overwrites the first
    assert c.result_path("cloth", m, date="2026-01-02").name == "2026-01-02-amd-epyc-16c-02.json"


def test_machine_and_median():
    c = _common()
    m = c.machine()
    assert m["cores"] == os.cpu_count() and m["cpu"] and m["taichi"] and m["numpy"]
    assert c.median([3.0, 1.0, 2.0]) == 2.0 and c.median([]) is None


def test_kept_results_follow_the_naming():
    import re

    pat = re.compile(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.json")
    files = [*ROOT.glob("benchmarks/results/*/*.json"), *ROOT.glob("studies/results/*/*.json")]
    assert len(files) > 50
    bad = [str(f.relative_to(ROOT)) for f in files if not pat.fullmatch(f.name)]
    assert not bad, bad
    assert not list((ROOT / "docs").glob("*.json"))
