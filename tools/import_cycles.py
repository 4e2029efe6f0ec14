"""Fail on any import circle among relulearn's modules, deferred imports (inside functions) included.

import-linter's layers contract keeps the layers apart but allows circles inside a layer; this reads every
``import`` statement of every module and reports each group of modules that import each other (the strongly
connected components of the import graph).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules() -> dict[str, tuple[Path, bool]]:
    """Each module's dotted name, with its file and whether it is a package's ``__init__``."""
    out = {}
    for path in sorted((ROOT / "relulearn").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def imports(name: str, path: Path, package: bool, known: dict) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its source."""
    here = name.split(".") if package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from pkg import sub` imports the submodule when there is one, else a name of pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main() -> int:
    known = modules()
    graph = {name: imports(name, path, package, known) for name, (path, package) in known.items()}
    found = circles(graph)
    for group in found:
        print("import circle:", " <-> ".join(group))
    print(f"{len(found)} import circles among {len(known)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
