"""Consistency of progressive refinement against direct simulation (notes §5.3).

Runs ``tisim refine`` with ``--direct`` on refine-drape and flag-refine and prints,
per scene, the finest level's largest centre-of-mass distance from the preview and
the largest distance between direct coarse and direct fine simulations, both relative
to the finest mesh's bounding-box diagonal; writes consistency.json and each run's
consistency.png (in its output folder).

    python studies/consistency.py --frames 30 --out out/consistency [--set ...] [--levels 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", nargs="+", default=["refine-drape", "flag-refine"])
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--levels", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("out/consistency"))
    ap.add_argument("--set", action="append", default=[], help="scene override for every scene, KEY=VALUE")
    a = ap.parse_args(argv)

    from tisim import backend
    from tisim.cli.app import demos_dir
    from tisim.progressive import ProgressiveRefiner
    from tisim.scene import load_scene

    backend.init("cpu", "f64")
    results = {}
    for name in a.scenes:
        path = Path(name) if Path(name).exists() else demos_dir() / f"{name}.toml"
        sc = load_scene(path, a.set)
        r = ProgressiveRefiner(sc, a.out / sc.name, levels=a.levels, progress=False)
        res = r.run(a.frames, direct=True)
        if res.ended != "completed":
            print(f"{sc.name}: {res.ended}: {res.message}", file=sys.stderr)
            return 1
        c, d = res.info["consistency"], res.info["direct"]
        fine = c[f"level_{r.L}"]["com_distance_max_rel"]
        results[sc.name] = {
            "vertices": [lv.vertex_count for lv in r.hierarchy.levels],
            "frames": a.frames,
            "finest_vs_preview_com_max_rel": fine,
            "direct_coarse_vs_fine_com_max_rel": d["direct_com_distance_max_rel"],
            "ratio": fine / d["direct_com_distance_max_rel"] if d["direct_com_distance_max_rel"] else None,
            "per_level": c,
            "plot": str(a.out / sc.name / "consistency.png"),
        }
        print(
            f"{sc.name} ({' -> '.join(map(str, results[sc.name]['vertices']))} vertices, {a.frames} frames): "
            f"finest vs preview {100 * fine:.3f}% of the diagonal, direct coarse vs fine "
            f"{100 * d['direct_com_distance_max_rel']:.3f}%",
            flush=True,
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "consistency.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {a.out / 'consistency.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
