"""Process-level set-up in ``tisim.backend.init`` (run in fresh interpreters: Taichi and
OpenBLAS are initialised once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import json, numpy
{extra}
from threadpoolctl import threadpool_info
def openblas():
    return {{i["filepath"]: i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"}}
before = openblas()
from tisim import backend
backend.init("cpu", "f64")
print(json.dumps({{"before": before, "after": openblas()}}))
"""


def _probe(env_extra: dict[str, str], extra: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", _PROBE.format(extra=extra)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _numpys(path: str) -> bool:
    return "numpy" in path or "scipy_openblas" in path


def test_numpy_openblas_runs_on_one_thread_after_init():
    """OpenBLAS's spinning worker threads took a core from PARDISO and Taichi (the
    docstring of backend.limit_numpy_blas): init leaves numpy's OpenBLAS on one thread."""
    r = _probe({})
    if not r["before"]:
        pytest.skip("numpy is not linked against OpenBLAS here")
    assert set(r["after"].values()) == {1}


def test_another_openblas_keeps_its_threads():
    """The system OpenBLAS under CHOLMOD (the solvers' fallback without MKL) is not
    numpy's: loaded before init, it keeps its thread count."""
    pytest.importorskip("sksparse.cholmod")
    r = _probe({}, extra="import sksparse.cholmod")
    others = {p: n for p, n in r["before"].items() if not _numpys(p)}
    mine = [p for p in r["before"] if _numpys(p)]
    if not others or not mine:
        pytest.skip("needs numpy's own OpenBLAS and a second one in the process")
    assert {p: r["after"][p] for p in others} == others
    assert all(r["after"][p] == 1 for p in mine)


def test_a_users_openblas_thread_count_is_kept():
    r = _probe({"OPENBLAS_NUM_THREADS": "2"})
    if not r["before"]:
        pytest.skip("numpy is not linked against OpenBLAS here")
    assert r["after"] == r["before"]


def test_kernel_compile_errors_still_name_file_line_and_kernel():
    """``init`` shortens the source positions Taichi's front end builds for its error
    messages (a third of its time): a kernel that does not compile still gets a message
    with this file, the line and the kernel's name."""
    import taichi as ti

    from tisim import backend

    backend.init("cpu", "f64")

    out = ti.field(ti.f64, shape=1)

    @ti.kernel
    def broken_kernel():  # no arguments: this module's annotations are strings
        out[0] = not_defined_anywhere  # noqa: F821  (the line the message must name)

    src = Path(__file__).read_text().splitlines()
    line = 1 + next(i for i, s in enumerate(src) if "(the line the message must name)" in s and "noqa" in s)
    with pytest.raises(ti.TaichiCompilationError) as err:
        broken_kernel()
    msg = str(err.value)
    assert f'File "{__file__}", line {line}, in broken_kernel' in msg, msg
    assert "not_defined_anywhere" in msg
    # and the shortening is in force (Taichi's own message quotes the line under carets)
    assert "^" not in msg and "out[0] = not_defined_anywhere" not in msg, msg
