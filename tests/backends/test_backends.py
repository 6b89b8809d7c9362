"""GPU-class backends against the CPU backend (issue 10): Vulkan (Taichi's SPIR-V
back-end; on Mesa's lavapipe driver where no GPU is present, run by CI) and CUDA (run by
tools/device_check.sh on a machine with an NVIDIA GPU). Each backend's tests carry its
marker and are skipped when it cannot start. Scenes are small and a few frames long; see
backend_compare.py for the tolerances."""

from __future__ import annotations

import os
import subprocess
import sys

import backend_compare as compare
import backend_scenarios as scenarios
import numpy as np
import pytest

ARCHS = [
    pytest.param("vulkan", marks=pytest.mark.vulkan, id="vulkan"),
    pytest.param("cuda", marks=pytest.mark.cuda, id="cuda"),
]


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    """The backend under test; skips its tests, before any CPU reference run, when it
    cannot start."""
    compare.require(request.param)
    return request.param


@pytest.fixture(scope="module")
def reference(arch):
    """name -> the scene on the session's CPU f64 backend (after the backend check), each
    run once per process when a test first needs it (xdist workers share no fixtures)."""
    runs: dict = {}

    def get(name: str) -> dict:
        if name not in runs:
            runs[name] = getattr(scenarios, name)()
        return runs[name]

    return get


# (scene, precision); the device contact kernels and the Anderson kernels run on the GPU
# code path only in these scenes (measured on lavapipe: 1e-15 m in f64, 1e-6 m in f32)
SCENES = [
    *[(n, p) for n in ("twisting_bar", "squeeze_ball", "squeeze_ball_device") for p in ("f64", "f32")],
    ("twisting_bar_anderson", "f64"),
]


@pytest.mark.parametrize("name, precision", SCENES)
def test_scene_matches_cpu(arch, reference, name, precision, request):
    if (arch, name, precision) == ("cuda", "squeeze_ball_device", "f32"):
        # measured on an NVIDIA H200 (docs/benchmarks.md, "GPU-class backends"): this scene with the
        # device update was 0.06, 0.49 and 1.2 mm from the CPU in its first three frames,
        # 11 mm after eight; "auto" runs the host update there (squeeze_ball f32 above).
        # The cause (CUDA's approximate f32 square root in a cancelling derivative) is fixed
        # since, checked by emulation on the CPU only. Strict: when a GPU run passes this,
        # it fails as XPASS: then drop this mark and let "auto" choose "device" on CUDA f32.
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="the device contact update was wrong on CUDA in f32; fix unconfirmed")
        )
    compare.check_scene(arch, precision, name, reference(name))


@pytest.mark.vulkan
def test_stick_slip_cpu_reference():
    """The verdicts of check_stick_slip hold on the CPU backend itself."""
    got = scenarios.stick_slip()
    compare.check_stick_slip_verdicts(got)
    assert got["stick"] < 1e-5, got  # f64 holds the box (7e-7 m/s measured)


def test_f32_free_fall_follows_gravity():
    """A falling ball in f32 on the CPU backend gains g h of velocity per step to 1e-4.
    The PD residual b - A x summed A_vj x_j with entries of size h^2 |L| and positions
    of 0.2 m, and the f32 entries' row sums are not zero: the ball (1,009 vertices)
    gained 0.2% too much or too little per step, the 7k-vertex demo ball 1.5-2% too
    much, which also made f32 friction wrong (docs/benchmarks.md, "GPU-class backends"). In
    difference form, sum_j A_vj (x_j - x_v), it is 1e-5."""
    got = compare.on_backend("cpu", "f32", scenarios.free_fall)
    assert not got["contacts"].any()
    assert np.abs(got["ratio"] - 1.0).max() < 1e-4, got["ratio"]


@pytest.mark.slow
def test_f32_stick_slip_as_f64_cpu():
    """Stick-slip at 10 degrees and mu = tan -/+ 0.003 in f32 on the CPU backend: the box
    sticks as in f64 and slides at f64's speed. Measured over twelve runs with mu moved by
    1e-6 relative: f32 sticks at 2.3e-7 to 7.5e-6 m/s (f64 7e-7) and slides at 0.00635 to
    0.00705 m/s (f64 0.00674, 6% at most apart). Before the residual's difference form
    (above) it crept at up to 2e-3 m/s and slid 1.3-1.6x f64's speed."""
    ref = scenarios.stick_slip()
    got = compare.on_backend("cpu", "f32", scenarios.stick_slip)
    assert got["stick"] < 1e-4, got  # Coulomb's sliding speed then: 5.8e-3 m/s
    assert abs(got["slide"] / ref["slide"] - 1.0) < 0.1, (got, ref)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["f32"])
def test_stick_slip_verdicts_match(arch, precision):
    """f32 against the CPU's f64 verdicts (test_stick_slip_cpu_reference); f64 on this
    backend is covered by the position comparisons above (agreement to 1e-11 m)."""
    compare.check_stick_slip(arch, precision)


def test_cloth_matches_cpu_in_free_fall_and_through_contact(arch, reference):
    """The cloth drape on the backend, one run for both checks (one test, not two sharing a
    fixture: pytest-xdist's worksteal put the two on different workers now and then, and
    each compiled and ran the drape on lavapipe, 55-60 s).

    Free fall (the first two frames, before the sheet reaches the sphere): the cloth
    solver's kernels (membrane, bending, strain limit, with tisim.ti_math's f64 log / atan2
    / sin / cos where SPIR-V has none) give the same positions as the CPU to round-off.

    Through contact: no intersection on any frame, contacts within one of the CPU's every
    frame (a pair at the activation distance may flip with round-off) and the same
    positions to 1e-8 m (Newton's line search and CCD decisions amplify round-off).
    Measured on Vulkan (lavapipe): the same contacts and 1.2e-14 m. Before the broad
    phase's scans kept their running sums in locals and its atomics left the per-box
    loops, no pair was found there and the sheet fell through the sphere."""
    ref = reference("cloth_drape")
    got = compare.on_backend(arch, "f64", scenarios.cloth_drape)
    assert ref["contacts"][:2].sum() == 0
    dx = np.abs(got["positions"][:2] - ref["positions"][:2]).max()
    assert dx < compare.POSITION_TOL["f64"], dx
    assert ref["contacts"].max() > 0 and np.all(ref["min_distance"] > 0)
    assert np.all(got["min_distance"] > 0), got["min_distance"]
    assert np.abs(got["contacts"] - ref["contacts"]).max() <= 1, (got["contacts"], ref["contacts"])
    assert np.abs(got["positions"] - ref["positions"]).max() < 1e-8


def test_admm_spinning_bar_matches_cpu(arch, reference):
    """The conservative integrator on the GPU code path, f64 (its proximal steps take
    tisim.ti_math's f64 log on SPIR-V): the same positions as the CPU to round-off, and
    the momenta it guarantees kept. (In f32 the demo's ADMM tolerance of 1e-8 is out of
    reach: on lavapipe the first step stalls at residuals of 5e-7 and is reported as
    such.)"""
    ref = reference("spinning_bar_admm")
    got = compare.on_backend(arch, "f64", scenarios.spinning_bar_admm)
    dx = np.abs(got["positions"] - ref["positions"]).max()
    assert dx < compare.POSITION_TOL["f64"], dx
    L0 = np.abs(ref["angular_momentum"][0]).max()
    assert np.abs(got["angular_momentum"] - ref["angular_momentum"][0]).max() < 1e-6 * L0
    assert np.abs(got["momentum"]).max() < 1e-9


_UPLOAD_F32 = r"""
import sys
import numpy as np
import taichi as ti
from tisim import backend
info = backend.init(sys.argv[1], "f32")
assert info.arch == sys.argv[1], info.arch
nd = ti.Vector.ndarray(3, backend.real(), shape=5)
x = np.linspace(0.0, 1.0, 15).reshape(5, 3)  # float64, as the solvers hold positions
backend.upload(nd, x)
np.testing.assert_array_equal(backend.download(nd), x.astype(np.float32))
"""


def test_f32_uploads_of_f64_arrays_compile_without_warning(arch, tmp_path):
    """The solvers keep positions in float64 numpy arrays; on a GPU backend in f32,
    ``backend.upload`` gave them to ``from_numpy`` as they were, whose copy kernel then
    compiled for f64 and warned "Assign may lose precision: f32 <- f64" on every fresh
    machine's first cloth run (kernel cache empty, as here)."""
    env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=str(tmp_path))
    r = subprocess.run(
        [sys.executable, "-c", _UPLOAD_F32, arch],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TaichiWarning" not in r.stderr + r.stdout, r.stderr[-3000:]
