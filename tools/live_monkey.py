"""Random mouse drags, slider moves and keys on a live tisim window, on an X display
(a virtual one: Xvfb), with xdotool: the issue-43 check that poking the window never
closes it.

    Xvfb :43 -screen 0 1280x1024x24 &
    DISPLAY=:43 python tools/live_monkey.py --seconds 90 -- python -m tisim demo squeeze-ball

Starts the command, waits for its window (title starting "tisim"), then for ``--seconds``
sends random left drags over the window (grabs), right-clicks and right drags (let go,
orbit), drags in the panel (sliders, buttons) and keys (space, n, r, h, c, Escape, arrows).
At the end it checks the process is alive and that its output holds no error or divergence
line, presses q, and prints a one-line verdict with the number of actions. Exit status 0
when the window survived, 1 when not.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BAD = re.compile(r"error|diverged|Traceback|exception", re.IGNORECASE)


def xdo(*args: str) -> str:
    return subprocess.run(["xdotool", *args], capture_output=True, text=True, timeout=20, check=False).stdout.strip()


def find_window(timeout: float, proc) -> str | None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            return None
        ids = xdo("search", "--name", "^tisim").split()
        if ids:
            return ids[-1]
        time.sleep(1.0)
    return None


def session(win: str, seconds: float, rng: random.Random, w: int = 960, h: int = 720) -> int:
    """Random actions on window ``win`` for ``seconds``; returns their number."""
    actions = 0
    t_end = time.time() + seconds
    keys = ["space", "n", "r", "h", "c", "Escape", "Left", "Right", "Up", "Down"]
    while time.time() < t_end:
        r = rng.random()
        if r < 0.45:  # a grab near the middle of the view, dragged somewhere
            x, y = rng.randint(w // 4, 3 * w // 4), rng.randint(h // 4, 3 * h // 4)
            xdo("mousemove", "--window", win, str(x), str(y))
            xdo("mousedown", "1")
            for _ in range(rng.randint(2, 8)):
                x = min(max(x + rng.randint(-200, 200), 0), w - 1)
                y = min(max(y + rng.randint(-200, 200), 0), h - 1)
                xdo("mousemove", "--window", win, str(x), str(y))
                time.sleep(rng.uniform(0.02, 0.3))
            if rng.random() < 0.2:
                xdo("click", "3")  # right-click lets go
            xdo("mouseup", "1")
        elif r < 0.65:  # the panel: sliders and buttons live in its top-left 340 x 500 px
            x, y = rng.randint(20, 330), rng.randint(40, 500)
            xdo("mousemove", "--window", win, str(x), str(y))
            xdo("mousedown", "1")
            xdo("mousemove", "--window", win, str(rng.choice([0, 340, rng.randint(0, 340)])), str(y))
            xdo("mouseup", "1")
        elif r < 0.85:
            xdo("key", "--window", win, rng.choice(keys))
        else:  # orbit
            x, y = rng.randint(0, w - 1), rng.randint(0, h - 1)
            xdo("mousemove", "--window", win, str(x), str(y))
            xdo("mousedown", "3")
            xdo("mousemove", "--window", win, str(rng.randint(0, w - 1)), str(rng.randint(0, h - 1)))
            xdo("mouseup", "3")
        actions += 1
        time.sleep(rng.uniform(0.05, 0.4))
    return actions


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup", type=float, default=240.0, help="seconds to wait for the window")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    win = None
    try:
        win = find_window(a.startup, proc)
        if win is None:
            print(f"FAIL: no window (exit {proc.poll()}); log {log.name}")
            return 1
        title0 = xdo("getwindowname", win)
        n = session(win, a.seconds, random.Random(a.seed))
        alive = proc.poll() is None
        title = xdo("getwindowname", win) if alive else ""
        log.flush()
        text = Path(log.name).read_text()
        bad = [line for line in text.splitlines() if BAD.search(line)]
        ok = alive and not bad
        rollbacks = text.count("rolled back")
        print(
            f"{'OK' if ok else 'FAIL'}: {n} actions in {a.seconds:g} s; alive={alive}; "
            f"title {title0!r} -> {title!r}; {len(bad)} error lines; {rollbacks} rollbacks; log {log.name}"
        )
        for line in bad[:5]:
            print("   ", line)
        return 0 if ok else 1
    finally:
        if proc.poll() is None:
            try:
                if win:
                    xdo("key", "--window", win, "q")
                proc.wait(timeout=20)
            except (subprocess.SubprocessError, OSError):
                pass
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=20)


if __name__ == "__main__":
    sys.exit(main())
