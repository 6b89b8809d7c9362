"""tools/contact_trace.py: the stage-by-stage replay that is to find which device contact
kernel goes wrong on CUDA in f32 (README, "GPU-class backends"). Its comparison is checked on
made-up traces (it must point at the first stage where a result parts and nowhere else),
and the record-and-replay on the CPU backend against itself (bit for bit, or the wrapping
of the storage's kernels broke)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "contact_trace.py"


@pytest.fixture(scope="module")
def ct():
    spec = importlib.util.spec_from_file_location("contact_trace", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trace(rng, labels, k=5):
    return [(lab, {"lam": rng.standard_normal((k, 3)), "s": rng.standard_normal(3 * k)}) for lab in labels]


LABELS = ["update 0 load", "update 0 newton_begin 0", "update 0 cr_iteration 0", "update 0 cr_last 0",
          "update 0 commit 0", "update 0 forces"]


def test_identical_traces_have_no_difference(ct, rng):
    a = _trace(rng, LABELS)
    res = ct.compare(a, a, 1e-2)
    assert res["first"] is None and res["stages_compared"] == len(LABELS)


def test_first_parting_result_is_named(ct, rng):
    a = _trace(rng, LABELS)
    b = [(lab, {n: v.copy() for n, v in d.items()}) for lab, d in a]
    b[2][1]["lam"] *= 2  # inside a CR solve: round-off grows there, no verdict
    b[1][1]["s"] *= 2  # a work vector: reported, no verdict
    b[4][1]["lam"][0, 0] += 0.5 * np.abs(a[4][1]["lam"]).max()
    res = ct.compare(a, b, 1e-2)
    assert res["first"]["label"] == "update 0 commit 0"
    assert res["first"]["reason"].startswith("past tolerance: lam 5.0")
    assert res["rows"][1]["diffs"]["s"] > 0.3  # shown, not judged


def test_traces_that_part_and_non_finite_values(ct, rng):
    a = _trace(rng, LABELS)
    b = _trace(rng, LABELS[:3] + ["update 0 cr_iteration 1"] + LABELS[3:])
    b[:3] = a[:3]
    res = ct.compare(a, b, 1e-2)
    assert res["first"]["label"] == "update 0 cr_iteration 1"
    x = np.ones(4)
    y = x.copy()
    y[2] = np.nan
    assert ct.relative_difference(x, y) == np.inf
    assert ct.relative_difference(np.zeros(3), np.zeros(3)) == 0.0
    assert ct.relative_difference(np.ones(3), np.ones(4)) == np.inf


@pytest.mark.slow
def test_replay_on_the_cpu_reproduces_itself(tmp_path):
    """Record the squeeze-ball's first device contact update on the CPU (f32: in f64 it
    converges before a Newton step) and replay it there in another process: every stage the
    same to the bit, and the replay's forces those the run got (the recorded inputs are
    complete)."""
    r = subprocess.run(
        [sys.executable, str(TOOL), "--archs", "cpu", "cpu", "--precision", "f32", "--frames", "12",
         "--updates", "1", "--tol", "0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "first difference: none" in r.stdout
    spec = importlib.util.spec_from_file_location("contact_trace", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    trace = mod.load_trace(tmp_path / "replay_cpu.npz")
    labels = [lab for lab, _ in trace]
    assert labels[0] == "update 0 load" and labels[-2:] == ["update 0 forces", "update 0 recorded"]
    assert any("cr_iteration" in lab for lab in labels) and any("commit" in lab for lab in labels)
    replayed, recorded = trace[-2][1]["force"], trace[-1][1]["recorded_force"]
    assert np.abs(recorded).max() > 0  # the ball touches: real forces
    np.testing.assert_array_equal(replayed, recorded)
