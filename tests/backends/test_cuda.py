"""CUDA against the CPU backend (run by tools/device_check.sh on a machine with
an NVIDIA GPU; skipped without one). Same scenes and tolerances as test_vulkan.py;
see backend_compare.py."""

from __future__ import annotations

import pytest

import backend_compare as compare
import backend_scenarios as scenarios

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True, scope="module")
def _cuda_present():
    """Skip the whole module, before any CPU reference run, when cuda cannot start."""
    compare.require("cuda")


@pytest.fixture(scope="module")
def reference():
    """The scenes on the session's CPU f64 backend."""
    return {
        "twisting_bar": scenarios.twisting_bar(),
        "squeeze_ball": scenarios.squeeze_ball(),
    }


@pytest.mark.parametrize("precision", ["f64", "f32"])
@pytest.mark.parametrize("name", ["twisting_bar", "squeeze_ball"])
def test_scene_matches_cpu(reference, name, precision):
    compare.check_scene("cuda", precision, name, reference[name])


def test_stick_slip_cpu_reference():
    """The verdicts of check_stick_slip hold on the CPU backend itself."""
    got = scenarios.stick_slip()
    assert got["slide"] > 3e-3 and got["stick"] < 1e-4, got


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["f32"])
def test_stick_slip_verdicts_match(precision):
    """f32 against the CPU's f64 verdicts (test_stick_slip_cpu_reference); f64 on this
    backend is covered by the position comparisons above (agreement to 1e-11 m)."""
    compare.check_stick_slip("cuda", precision)
