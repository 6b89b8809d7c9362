"""Run the corpus of awkward cloth meshes through ``tisim refine`` for many frames and
check every frame of every level with ipctk: the long form of
``tests/demos/test_user_meshes_corpus.py`` (which runs 2 frames, for time).

    python tools/check_user_meshes.py                    # every mesh, 40 frames
    python tools/check_user_meshes.py holey_sheet -n 60  # one mesh, 60 frames

Prints a table (exit code, frames checked, frames with a self-intersection per level,
the finest centre of mass's distance to the preview's, in % of its diagonal, wall time)
and writes it as JSON (``--json``, default ``out/user-meshes.json``) with the machine.
Exits 1 when any mesh fails (non-zero exit, an intersecting frame, or a centre of mass
over 2%).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _intersecting_frames(level: Path) -> tuple[int, int]:
    import ipctk

    from tisim.geometry.cloth import load_cloth_mesh

    files = sorted((level / "meshes").glob("cloth_*.obj"))
    bad = 0
    for f in files:
        m = load_cloth_mesh(str(f))
        bad += bool(ipctk.has_intersections(ipctk.CollisionMesh(m.vertices, m.edges, m.faces), m.vertices))
    return len(files), bad


def check(name: str, frames: int, work: Path) -> dict:
    from tisim.geometry import awkward
    from tisim.geometry.cloth import ClothMesh, save_cloth_obj

    m = awkward.CORPUS[name]()
    mesh = work / f"{name}.obj"
    save_cloth_obj(mesh, m.vertices, ClothMesh(m.vertices, m.faces))
    out = work / f"{name}-refine"
    cmd = [sys.executable, "-m", "tisim", "refine", str(mesh), "--drape-on", "sphere", "--frames", str(frames)]
    t = time.perf_counter()
    r = subprocess.run([*cmd, "--no-render", "--quiet", "--out", str(out)], capture_output=True, text=True)
    row = {"mesh": name, "vertices": len(m.vertices), "exit": r.returncode, "seconds": time.perf_counter() - t}
    if r.returncode != 0:
        row["error"] = (r.stderr or r.stdout).strip().splitlines()[-1:]
        return row
    row["levels"] = [
        dict(zip(("frames", "intersecting"), _intersecting_frames(lv))) for lv in sorted(out.glob("level_*"))
    ]
    with open(out / "consistency.csv") as fh:
        rows = list(csv.DictReader(fh))
    key = max((k for k in rows[0] if k.startswith("com_distance_rel_")), default=None)
    row["com_percent"] = 100 * max(float(x[key]) for x in rows) if key else None
    return row


def main(argv=None) -> int:
    from tisim.geometry import awkward

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("meshes", nargs="*", default=sorted(awkward.CORPUS), help="corpus names (default: all)")
    ap.add_argument("-n", "--frames", type=int, default=40)
    ap.add_argument("--json", type=Path, default=ROOT / "out" / "user-meshes.json")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import machine

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.meshes:
            rows.append(check(name, a.frames, Path(tmp)))
            r = rows[-1]
            lv = " ".join(f"{x['intersecting']}/{x['frames']}" for x in r.get("levels", [])) or r.get("error")
            com = f"{r['com_percent']:.2f}" if r.get("com_percent") is not None else "-"
            print(
                f"{r['mesh']:14s} {r['vertices']:6d} v  exit {r['exit']}  intersecting {lv}  com {com}%  {r['seconds']:.0f} s"
            )
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"machine": machine(), "frames": a.frames, "meshes": rows}, indent=1))
    print(f"wrote {a.json}")
    ok = all(
        r["exit"] == 0 and all(x["intersecting"] == 0 for x in r["levels"]) and (r["com_percent"] or 0) < 2
        for r in rows
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
