"""Mutation testing: apply one small, realistic bug at a time and see whether the tests notice.

Each mutant (tools/mutants.toml) names a module group (its test files, extra pytest
``args`` such as ``["-m", "not slow"]`` and a ``timeout`` in seconds), a source file, an exact piece of
text that occurs exactly once in that file (``find``) and its replacement (``replace``):
an operator swap, a constant doubled, a sign, a dropped term, an off-by-one. For every
mutant the script

1. copies the repository's ``tisim/``, ``tests/``, ``demos/``, ``assets/`` and
   ``pyproject.toml`` into a temporary folder once (the working tree is never edited,
   so Ctrl-C or a crash cannot leave a mutant behind),
2. writes the mutated file there, runs the group's test files with
   ``pytest -x -q -p no:cacheprovider`` and a timeout, and puts the file back,
3. records killed (the tests failed), survived (they passed), timeout, or error (pytest
   could not run them: exit code 2-5). Timeouts and errors count as caught in the score,
   and are listed apart in the table so that they can be looked at.

Before the mutants, each group's tests run once unmutated: a group whose tests fail as
they are is reported as "baseline failed" and its mutants are skipped (a kill would mean
nothing).

``--tests-from REV`` replaces the copy's ``tests/`` with the one of a git revision (the
score before new tests were written); ``--deselect FILE`` leaves a test file out;
``--tests a.py,b.py`` runs those files for every mutant instead of the groups' lists (to
try a new test against the mutants it is meant to kill); ``--list`` prints every mutant
with its line.
A mutant marked ``equivalent = "why"`` in the data file is run but reported apart: it
does not count against the score.

    python tools/mutate.py --groups ipc,shell --json out/mutation-after.json
    python tools/mutate.py --tests-from 570b27c --json out/mutation-before.json
    python tools/mutate.py --only halfspace-grad-factor -v      # one mutant, pytest's output

Writes a JSON (every mutant: id, group, file, line, status, seconds, the failing test's
last lines) and prints a Markdown table: killed / survived / timeout per group.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(__file__).resolve().parent / "mutants.toml"
COPIED = ("tisim", "tests", "demos", "assets", "pyproject.toml", "setup.py")


@dataclass
class Mutant:
    id: str
    group: str
    file: str
    find: str
    replace: str
    note: str = ""
    equivalent: str = ""
    tests: list[str] = field(default_factory=list)  # overrides the group's tests


def load(path: Path) -> tuple[dict[str, dict], list[Mutant]]:
    """(groups {name: {"tests": [...], "timeout": s}}, mutants) from the TOML data file."""
    data = tomllib.loads(path.read_text())
    groups = data.get("groups", {})
    mutants = []
    seen = set()
    for row in data.get("mutant", []):
        m = Mutant(**row)
        if m.id in seen:
            raise SystemExit(f"{path}: mutant id {m.id!r} appears twice")
        if m.group not in groups:
            raise SystemExit(f"{path}: mutant {m.id!r}: unknown group {m.group!r}")
        seen.add(m.id)
        mutants.append(m)
    return groups, mutants


def locate(text: str, m: Mutant) -> int:
    """1-based line of the mutant's ``find`` text; it must occur exactly once."""
    count = text.count(m.find)
    if count != 1:
        raise ValueError(f"mutant {m.id}: {m.find!r} occurs {count} times in {m.file} (need exactly 1)")
    return text[: text.index(m.find)].count("\n") + 1


def make_copy(dest: Path, tests_from: str | None) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    if tests_from:
        shutil.rmtree(dest / "tests")
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", tests_from, "tests"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def run_tests(copy: Path, tests: list[str], timeout: float, deselect: list[str], verbose: bool, args: list[str] = ()):
    """(status, seconds, tail): status 'passed', 'failed', 'timeout' or 'error' (pytest rc 2-5)."""
    present = [t for t in tests if (copy / t.split("::")[0]).exists() and t.split("::")[0] not in deselect]
    if not present:
        return "error", 0.0, "no test file of this group exists in the copy"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-W",
        "ignore::DeprecationWarning",
        *args,
        *present,
    ]
    for d in deselect:
        cmd += ["--deselect", d] if "::" in d else ["--ignore", d]
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "timeout", time.perf_counter() - t0, out[-1500:]
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    dt = time.perf_counter() - t0
    if verbose:
        print(out)
    status = {0: "passed", 1: "failed"}.get(proc.returncode, "error")
    return status, dt, out[-1500:]


def table(results: list[dict]) -> str:
    groups: dict[str, dict[str, int]] = {}
    for r in results:
        g = groups.setdefault(
            r["group"], {"killed": 0, "survived": 0, "timeout": 0, "error": 0, "equivalent": 0, "skipped": 0}
        )
        key = "equivalent" if r.get("equivalent") and r["status"] == "survived" else r["status"]
        g[key] = g.get(key, 0) + 1
    lines = [
        "| group | mutants | killed | survived | timeout | equivalent (survived) | score |",
        "|---|---|---|---|---|---|---|",
    ]
    tot = {"n": 0, "k": 0, "s": 0, "t": 0, "e": 0}
    for name, g in groups.items():
        n = sum(g.values()) - g["skipped"]
        k = g["killed"] + g["timeout"] + g["error"]
        counted = n - g["equivalent"]
        score = f"{k / counted:.0%}" if counted else "-"
        lines.append(
            f"| {name} | {n} | {g['killed']} | {g['survived']} | {g['timeout']} | {g['equivalent']} | {score} |"
        )
        tot["n"] += n
        tot["k"] += k
        tot["s"] += g["survived"]
        tot["t"] += g["timeout"]
        tot["e"] += g["equivalent"]
    counted = tot["n"] - tot["e"]
    lines.append(
        f"| all | {tot['n']} | {tot['k'] - tot['t']} | {tot['s']} | {tot['t']} | {tot['e']} | "
        f"{tot['k'] / counted:.0%} |"
        if counted
        else "| all | 0 | | | | | |"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--groups", default="", help="comma-separated groups (default: all)")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--tests-from", default=None, help="git revision whose tests/ to use")
    ap.add_argument("--tests", default="", help="comma-separated test files replacing every group's")
    ap.add_argument("--deselect", action="append", default=[], help="test file (or node id) to leave out")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per mutant (default: the group's)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of each group")
    ap.add_argument("--list", action="store_true", help="list the mutants with their lines and exit")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)

    groups, mutants = load(a.data)
    if a.groups:
        wanted = set(a.groups.split(","))
        unknown = wanted - set(groups)
        if unknown:
            raise SystemExit(f"unknown group(s) {sorted(unknown)}; known: {sorted(groups)}")
        mutants = [m for m in mutants if m.group in wanted]
    if a.only:
        wanted = set(a.only.split(","))
        mutants = [m for m in mutants if m.id in wanted]
        if len(mutants) != len(wanted):
            raise SystemExit(f"unknown mutant id(s): {sorted(wanted - {m.id for m in mutants})}")
    # every mutant must apply to the working tree's source before anything runs
    lines = {}
    for m in mutants:
        lines[m.id] = locate((ROOT / m.file).read_text(), m)
    if a.list:
        for m in mutants:
            print(f"{m.id:40s} {m.file}:{lines[m.id]}  {m.find!r} -> {m.replace!r}")
        return 0

    def terminate(signum, frame):  # a kill ends like Ctrl-C: the running tests, then the copy
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    results: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="tisim-mutate-"))
    try:
        make_copy(tmp, a.tests_from)
        baseline: dict[str, str] = {}
        for m in mutants:
            g = groups[m.group]
            tests = a.tests.split(",") if a.tests else (m.tests or g["tests"])
            timeout = a.timeout or g.get("timeout", 300)
            key = " ".join(tests)
            if not a.no_baseline and key not in baseline:
                st, dt, tail = run_tests(tmp, tests, 3 * timeout, a.deselect, a.verbose, g.get("args", []))
                baseline[key] = st
                print(f"[baseline] {m.group}: {st} in {dt:.0f} s", flush=True)
                if st != "passed":
                    print(tail, flush=True)
            row = {
                "id": m.id,
                "group": m.group,
                "file": m.file,
                "line": lines[m.id],
                "find": m.find,
                "replace": m.replace,
                "note": m.note,
                "equivalent": m.equivalent,
            }
            if baseline.get(key, "passed") != "passed":
                row.update(status="skipped", seconds=0.0, tail="baseline failed")
                results.append(row)
                continue
            path = tmp / m.file
            original = path.read_text()
            try:
                path.write_text(original.replace(m.find, m.replace, 1))
                st, dt, tail = run_tests(tmp, tests, timeout, a.deselect, a.verbose, g.get("args", []))
            finally:
                path.write_text(original)
            status = {"failed": "killed", "passed": "survived"}.get(st, st)
            row.update(status=status, seconds=round(dt, 1), tail=tail if status != "survived" else "")
            results.append(row)
            print(f"{status:9s} {dt:6.1f} s  {m.id}  ({m.file}:{lines[m.id]})", flush=True)
    except KeyboardInterrupt:
        print("interrupted: the results so far follow", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "tests_from": a.tests_from,
            "deselect": a.deselect,
            "data": str(a.data),
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        a.json.write_text(json.dumps({"meta": meta, "mutants": results}, indent=1))
    print()
    print(table(results))
    survivors = [r for r in results if r["status"] == "survived"]
    if survivors:
        print("\nsurvived:")
        for r in survivors:
            eq = f"  [equivalent: {r['equivalent']}]" if r["equivalent"] else ""
            print(f"  {r['id']}  {r['file']}:{r['line']}  {r['find']!r} -> {r['replace']!r}{eq}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
