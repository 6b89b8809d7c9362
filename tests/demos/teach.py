"""Reads docs/teaching.md: its exercises, their runnable blocks and their stated results.

An exercise is a ``## Exercise N: ...`` section. Its fenced blocks with the info string
``sh {.teach}`` are shell commands (one per line; ``tisim`` runs as ``python -m tisim``),
``python {.teach}`` blocks are run in one namespace per exercise (``import tisim`` done),
and ``text {.expect}`` blocks state the results, one a line:

    EXPR = VALUE ± TOL        (TOL absolute, or relative with a %)
    EXPR < VALUE   /   EXPR > VALUE
    EXPR == LITERAL

where EXPR is a Python expression in the exercise's namespace. ``python tests/demos/teach.py
[N ...]`` runs the exercises and prints every EXPR's value (how the stated numbers were
measured); tests/demos/test_teaching.py checks them.
"""

from __future__ import annotations

import ast
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "teaching.md"
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_HEAD = re.compile(r"^## Exercise (\d+):", re.MULTILINE)
_EXPECT = re.compile(
    r"^(?P<expr>.+?)\s*(?P<op>==|=|<|>)\s*(?P<value>[^±]+?)(?:\s*±\s*(?P<tol>[\d.eE+-]+)(?P<pct>%)?)?$"
)


@dataclass
class Exercise:
    number: int
    title: str
    blocks: list[tuple[str, str]] = field(default_factory=list)  # ("sh" | "python", code)
    expects: list[str] = field(default_factory=list)


def exercises(doc: Path = DOC) -> list[Exercise]:
    text = doc.read_text()
    heads = list(_HEAD.finditer(text))
    out = []
    for i, h in enumerate(heads):
        body = text[h.start() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        ex = Exercise(int(h.group(1)), body.splitlines()[0][3:].strip())
        for m in _FENCE.finditer(body):
            # "python {.teach}": the class form that the docs' Markdown (SuperFences) renders
            info, code = re.sub(r"[{}.]", " ", m.group(1)).split(), m.group(2)
            if info[:2] in (["sh", "teach"], ["python", "teach"]):
                ex.blocks.append((info[0], code))
            elif info[:2] == ["text", "expect"]:
                ex.expects += [ln.strip() for ln in code.splitlines() if ln.strip()]
        out.append(ex)
    return out


def run(ex: Exercise, workdir: Path) -> dict:
    """Run the exercise's blocks in ``workdir`` (the current directory while they run);
    returns the Python namespace."""
    ns: dict = {"__name__": "__teach__"}
    old = Path.cwd()
    os.chdir(workdir)
    try:
        exec("import tisim", ns)
        for kind, code in ex.blocks:
            if kind == "python":
                exec(compile(code, f"teaching.md exercise {ex.number}", "exec"), ns)
                continue
            for line in code.splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                argv = shlex.split(line)
                if argv[0] == "tisim":
                    argv = [sys.executable, "-m", "tisim", *argv[1:]]
                r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
                if r.returncode != 0:
                    raise AssertionError(f"exercise {ex.number}: `{line}` exited {r.returncode}:\n{r.stderr[-3000:]}")
                ns.setdefault("_outputs", []).append(r.stdout)
    finally:
        os.chdir(old)
    return ns


def parse(line: str) -> tuple[str, str, str, float | None, bool]:
    m = _EXPECT.match(line)
    if m is None:
        raise ValueError(f"cannot read the expected result {line!r}")
    tol = m.group("tol")
    return m.group("expr"), m.group("op"), m.group("value").strip(), float(tol) if tol else None, bool(m.group("pct"))


def check(line: str, ns: dict) -> str | None:
    """None when the stated result holds, else what differs."""
    expr, op, value, tol, pct = parse(line)
    got = eval(expr, ns)
    if op == "==":
        want = ast.literal_eval(value)
        return None if got == want else f"{expr} is {got!r}, the guide says {want!r}"
    want = float(value)
    got = float(got)
    if not math.isfinite(got):
        return f"{expr} is {got}"
    if op == "<":
        return None if got < want else f"{expr} is {got:.4g}, the guide says < {want:g}"
    if op == ">":
        return None if got > want else f"{expr} is {got:.4g}, the guide says > {want:g}"
    if tol is None:
        raise ValueError(f"{line!r}: '=' needs a tolerance (± TOL or ± TOL%)")
    allowed = tol / 100 * abs(want) if pct else tol
    return (
        None
        if abs(got - want) <= allowed
        else (f"{expr} is {got:.4g}, the guide says {want:g} ± {tol:g}{'%' if pct else ''}")
    )


def main(argv: list[str]) -> int:
    import tempfile

    chosen = {int(a) for a in argv}
    for ex in exercises():
        if chosen and ex.number not in chosen:
            continue
        with tempfile.TemporaryDirectory() as d:
            ns = run(ex, Path(d))
            print(f"# {ex.title}")
            for line in ex.expects:
                expr = parse(line)[0]
                val = eval(expr, ns)
                print(f"{expr} -> {val!r}   [{'ok' if check(line, ns) is None else 'DIFFERS'}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
