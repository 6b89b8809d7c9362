"""The cloth solver compiles its contact kernels when it is built, not at the first
contact: left to that frame, their compilation froze a live drape for about a second
(64 x 64 cloth, frame 16). Run in a fresh process: in the test session's own process
earlier tests have compiled these kernels already, and the check could not fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, sys
from taichi.lang import kernel_impl as K

compiled = []
_materialize = K.Kernel.materialize


def materialize(self, key=None, args=None, arg_features=None):
    if key is None or key not in self.compiled_kernels:
        compiled.append(self.func.__name__)
    return _materialize(self, key, args, arg_features)


K.Kernel.materialize = materialize

from tisim.backend import init
from tisim.runner import build
from tisim.scene import load_scene
import tisim.contact.ipc.friction_potential as friction_potential
import tisim.contact.ipc.potential as potential
import tisim.solvers.cloth.assembly_kernels as assembly_kernels

init("cpu", "f64")
# a 12 x 12 sheet 2 cm above the sphere: it touches in the second frame and then slides
sc = load_scene(sys.argv[1], ["objects.cloth.cloth_resolution=[11,11]",
                              "objects.cloth.translation=[0.25,0.62,0.0]"])
_, model, solver = build(sc, "cpu", "f64")
kernels = [v for m in (potential, friction_potential) for v in vars(m).values()
           if hasattr(v, "_primal") and v.__module__ == m.__name__]
kernels += [assembly_kernels.scatter_pairs, assembly_kernels.emit_outside]
not_compiled = sorted({k.__name__ for k in kernels if not k._primal.compiled_kernels})
st, spare = model.initial_state(), model.initial_state()
solver.step(st, spare, sc.sim.dt)
st, spare = spare, st
compiled.clear()
contacts, friction = 0, 0
for _ in range(8):
    out = solver.step(st, spare, sc.sim.dt)
    st, spare = spare, st
    contacts = max(contacts, out.n_contacts)
    friction = max(friction, solver.friction.rows + sum(b.friction.rows for b in solver.balls))
print(json.dumps({"not_compiled": not_compiled, "later": sorted(set(compiled)),
                  "contacts": contacts, "friction_rows": friction, "kernels": len(kernels)}))
"""


def test_contact_kernels_compile_when_the_cloth_solver_is_built(repo_root, demos_dir):
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(demos_dir / "cloth-drape.toml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["kernels"] >= 11
    assert res["not_compiled"] == []  # every contact kernel compiled at construction
    assert res["contacts"] > 0 and res["friction_rows"] > 0  # the steps below did reach contact
    assert res["later"] == []  # and no step after the first compiled anything
