"""docs/montage.png: the first, middle and last frame of every demo, rendered off-screen,
and a check that the object is in view in each (the pixel test of tests/demos).

    python tools/montage.py                      # every demo, as shipped
    python tools/montage.py --quick              # shrunk meshes (what the tests run)
    python tools/montage.py --demos squeeze-ball toss --out /tmp/m.png

A progressive demo (a [refine] table) is shown by its coarse preview level, as
`tisim demo` shows it live.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demos", nargs="*", default=None)
    ap.add_argument("--quick", action="store_true", help="shrink the meshes (what the tests run)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "montage.png")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tisim-montage"))
    a = ap.parse_args(argv)
    from tisim import backend

    backend.init("cpu", "f64")
    from tisim.render.montage import IN_VIEW, THUMB, demo_frames, object_pixels, quick_sets
    from tisim.render.text import draw_text

    demos = a.demos or sorted(p.stem for p in (ROOT / "demos").glob("*.toml"))
    rows, bad = [], []
    for demo in demos:
        sets = quick_sets(demo) if a.quick else [f"render.width={THUMB[0]}", f"render.height={THUMB[1]}"]
        images, frames, color = demo_frames(demo, sets, a.work)
        tiles = []
        for img, f in zip(images, frames):
            frac = object_pixels(img, color)
            if frac < IN_VIEW:
                bad.append(f"{demo} frame {f}: {frac:.4f} of the pixels are the object's")
            tiles.append(draw_text(img, [f"{demo}  frame {f}"], size=12))
        rows.append(np.concatenate(tiles, axis=1))
        print(f"{demo}: object pixels {[round(object_pixels(i, color), 4) for i in images]}", flush=True)
    import imageio.v3 as iio

    a.out.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(a.out, np.concatenate(rows, axis=0))
    print(f"wrote {a.out}")
    for b in bad:
        print("NOT IN VIEW:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
