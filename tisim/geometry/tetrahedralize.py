"""Tetrahedralize a closed triangle surface with TetGen (PyPI package ``tetgen``).

TetGen aborts the whole process (not a Python exception) on some bad inputs, for
example self-intersecting surfaces, so by default it runs in a child Python
process and a crash there becomes a ``MeshError``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tisim.geometry.mesh import MeshError, TetMesh, TriMesh, tet_signed_volumes

log = logging.getLogger(__name__)

# Quality switches: radius-edge ratio bound and minimum dihedral angle (degrees).
# TetGen's documentation calls 10 degrees a reasonable dihedral bound; tighter
# bounds can make TetGen run for a very long time.
_QUALITY = {"minratio": 1.5, "mindihedral": 10.0}

_CHILD = """
import json, sys
import numpy as np
import tetgen
data = np.load(sys.argv[1])
options = json.loads(sys.argv[3])
try:
    nodes, elems = tetgen.TetGen(data["vertices"], data["faces"]).tetrahedralize(**options)[:2]
except RuntimeError as e:
    sys.stderr.write(" ".join(str(e).split()) + "\\n")
    sys.exit(3)
nodes = np.asarray(nodes, dtype=np.float64)
np.savez(sys.argv[2], nodes=nodes, elems=np.asarray(elems, dtype=np.int64))
"""


def tetrahedralize(
    surface: TriMesh,
    max_volume: float | None = None,
    quality: bool = True,
    *,
    isolated: bool = True,
    timeout: float = 600.0,
) -> TetMesh:
    """Fill a closed triangle surface with tetrahedra.

    surface: a closed, manifold, non-self-intersecting TriMesh (metres); its
    winding does not matter. max_volume: target bound on tet volume in m^3 (None:
    no bound, TetGen only adds the points quality needs); TetGen applies it while
    refining, and its final smoothing can leave a few tets up to about 1.3 times
    larger. quality: ask TetGen for a radius-edge ratio below 1.5 and dihedral
    angles above 10 degrees (switches ``-q1.5/10``). isolated: run TetGen in a
    child process so that a crash inside it raises ``MeshError`` instead of
    killing this process (costs about 0.1 to 0.5 s). timeout: seconds before the
    child is stopped.

    Returns a positively oriented TetMesh whose boundary is the input surface
    (TetGen may insert extra points in its triangles for quality) and whose
    ``source`` is the surface's. Deterministic for a given input.

    Raises MeshError naming ``surface.source`` when the surface is open or
    non-manifold, or when TetGen fails.

    Limitations: the surface is not repaired; self-intersections are only
    detected by TetGen failing. With ``isolated=False``, TetGen may write
    ``_skipped.*`` files into the working folder when it fails.
    """
    src = surface.source
    faces = surface.faces
    if len(faces) < 4:
        raise MeshError(f"cannot tetrahedralize a surface of {len(faces)} triangles", src)
    e = np.sort(faces[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2), axis=1)
    _, counts = np.unique(e, axis=0, return_counts=True)
    if np.any(counts == 1):
        raise MeshError(
            f"surface is not closed ({int(np.sum(counts == 1))} boundary edges); "
            "only a closed surface can be filled with tetrahedra",
            src,
        )
    if np.any(counts > 2):
        raise MeshError(
            f"surface is not manifold ({int(np.sum(counts > 2))} edges shared by more "
            "than two triangles)",
            src,
        )
    used = np.unique(faces)
    vertices = surface.vertices[used]
    faces = np.searchsorted(used, faces).astype(np.int32)

    # nomergefacet: TetGen would otherwise merge nearly coplanar input triangles
    # and re-triangulate them, moving the surface slightly.
    options: dict = {"quality": bool(quality), "quiet": True, "nomergefacet": True}
    if quality:
        options.update(_QUALITY)
    if max_volume is not None:
        if not max_volume > 0:
            raise MeshError(f"max_volume must be positive, got {max_volume}", src)
        # TetGen only enforces a volume bound while refining, which is its
        # quality mode; without quality, refine for volume with a loose shape bound.
        options.update(quality=True, maxvolume=float(max_volume), fixedvolume=True)
        options.setdefault("minratio", 10.0)

    if isolated:
        nodes, elems = _run_child(vertices, faces, options, timeout, src)
    else:
        import tetgen

        try:
            nodes, elems = tetgen.TetGen(vertices, faces).tetrahedralize(**options)[:2]
        except RuntimeError as err:
            raise MeshError(f"TetGen failed: {' '.join(str(err).split())}", src) from None
    nodes = np.asarray(nodes, dtype=np.float64)
    elems = np.asarray(elems, dtype=np.int64)
    if len(elems) == 0:
        raise MeshError("TetGen produced no tetrahedra", src)
    # TetGen already returns positive tets in our convention; make sure of it.
    vol = tet_signed_volumes(nodes, elems)
    flip = vol < 0
    if np.any(flip):
        elems[flip, 2], elems[flip, 3] = elems[flip, 3].copy(), elems[flip, 2].copy()
    used = np.unique(elems)
    if len(used) < len(nodes):
        nodes = nodes[used]
        elems = np.searchsorted(used, elems)
    log.debug("TetGen: %d vertices, %d tets from %d triangles", len(nodes), len(elems), len(faces))
    return TetMesh(nodes, elems, source=src)


def _run_child(vertices, faces, options, timeout, src):
    with tempfile.TemporaryDirectory(prefix="tisim-tetgen-") as tmp:
        inp, out = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(inp, vertices=vertices, faces=faces)
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD, str(inp), str(out), json.dumps(options)],
                capture_output=True,
                text=True,
                check=False,
                cwd=tmp,  # TetGen drops _skipped.* debug files in the working folder
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise MeshError(f"TetGen did not finish within {timeout:g} s", src) from None
        if proc.returncode != 0 or not out.exists():
            last = [line for line in proc.stderr.splitlines() if line.strip()]
            why = last[-1].strip() if last else f"exit status {proc.returncode}"
            if proc.returncode < 0 or proc.returncode == 134:
                why = f"TetGen crashed ({why}); the surface may intersect itself"
            raise MeshError(f"TetGen failed: {why}", src)
        with np.load(out) as data:
            return data["nodes"], data["elems"]
