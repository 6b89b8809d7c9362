"""The GPU code path (Taichi's SPIR-V back-end) against the CPU backend, on Mesa's
lavapipe Vulkan driver where no GPU is present (issue 10). Skipped when Vulkan cannot
start. Scenes are small and a few frames long; see backend_compare.py for the tolerances."""

from __future__ import annotations

import pytest

import backend_compare as compare
import backend_scenarios as scenarios

pytestmark = pytest.mark.vulkan


@pytest.fixture(autouse=True, scope="module")
def _vulkan_present():
    """Skip the whole module, before any CPU reference run, when vulkan cannot start."""
    compare.require("vulkan")


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
    compare.check_scene("vulkan", precision, name, reference[name])


def test_stick_slip_cpu_reference():
    """The verdicts of check_stick_slip hold on the CPU backend itself."""
    got = scenarios.stick_slip()
    assert got["slide"] > 3e-3 and got["stick"] < 1e-4, got


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["f32"])
def test_stick_slip_verdicts_match(precision):
    """f32 against the CPU's f64 verdicts (test_stick_slip_cpu_reference); f64 on this
    backend is covered by the position comparisons above (agreement to 1e-11 m)."""
    compare.check_stick_slip("vulkan", precision)
