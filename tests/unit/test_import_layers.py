"""tisim's modules import one another without a cycle: layers depend one way
(docs/architecture.md). The test reads every module's ``from tisim... import`` and
``import tisim...`` statements with ``ast``, at module level and inside functions (an import
put inside a function to dodge a cycle at import time is still a cycle in the design), and
fails naming each cycle it finds."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "tisim"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def _resolve(name: str, known: set[str]) -> str | None:
    """The tisim module ``name`` refers to (a name inside a module: that module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(mods: dict[str, Path], *, module_level_only: bool = False) -> dict[str, set[str]]:
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        nodes = tree.body if module_level_only else ast.walk(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in nodes:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # "from tisim.x import y": y may be a module of its own
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                if not t.startswith("tisim"):
                    continue
                dep = _resolve(t, known)
                # a package's __init__ is imported by its submodules: not a dependency edge
                if dep and dep != mod and not mod.startswith(dep + "."):
                    graph[mod].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_imports():
    g = import_graph(modules())
    assert "tisim.scene" in g["tisim.runner"]  # module level
    assert "tisim.outputs" in g["tisim.progressive.refiner"]
    assert "tisim.runner" in g["tisim.progressive.refiner"]  # inside a function: scene_precision


def test_no_import_cycle_at_module_level():
    found = cycles(import_graph(modules(), module_level_only=True))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_runner_and_refiner_do_not_import_each_other():
    """The output writers live in tisim.outputs, which both use, so the runner needs
    nothing from the refiner (the refiner may use the runner)."""
    g = import_graph(modules())
    assert not {m for m in g["tisim.runner"] if m.split(".")[:2] == ["tisim", "progressive"]}
    assert not {m for m in g["tisim.outputs"] if m.split(".")[:2] in (["tisim", "runner"], ["tisim", "progressive"])}


def test_no_import_cycle_through_function_level_imports():
    """An import inside a function closes a cycle as surely as one at the top (it only
    postpones the failure to run time): none either."""
    found = cycles(import_graph(modules()))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
