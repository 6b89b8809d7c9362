"""The notebooks of docs/notebooks execute from top to bottom (nbclient, the "python3"
kernel of this interpreter's environment, which ipykernel installs), with their own
assertions, in a scratch folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "docs" / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"first-steps.ipynb", "integrators.ipynb"}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    # the kernel imports this tisim: a source checkout's tree on the kernel's path, as the
    # test process has it (an installed tisim finds itself anyway)
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    from jupyter_client.kernelspec import KernelSpecManager

    ksm = KernelSpecManager()
    # the "python3" kernel is this interpreter (ipykernel's native spec), not some other Python
    spec = ksm.get_kernel_spec("python3")
    assert (
        spec.argv[0] in (sys.executable, "python", "python3")
        or Path(spec.argv[0]).resolve() == Path(sys.executable).resolve()
    ), spec.argv
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors, errors
    assert (tmp_path / "out").is_dir()  # it ran where it was told to
