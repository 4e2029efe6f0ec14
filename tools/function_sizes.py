"""Report functions that are too long or take too many parameters.

A function's length is its lines from ``def`` to its last line, minus its docstring's lines. A function over
``MAX_LINES`` needs a reason: a docstring line starting with ``Long:``. That reason exempts the length rule
only; no function may take more than ``MAX_PARAMETERS`` parameters (``self``/``cls`` not counted, ``*args``
and ``**kwargs`` one each).

Usage: ``python tools/function_sizes.py [PATH ...]`` (default: ``relulearn``). Prints each offender as
``path:line name: N lines / P parameters`` and exits 1 if there is any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_LINES = 80
MAX_PARAMETERS = 12

_Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Size:
    """One function's size: where it is, its lines (docstring excluded), its parameters, its reason."""

    path: Path
    line: int
    name: str
    lines: int
    parameters: int
    long_reason: bool

    @property
    def offends(self) -> bool:
        """Whether the function breaks a rule."""
        too_long = self.lines > MAX_LINES and not self.long_reason
        return too_long or self.parameters > MAX_PARAMETERS


def _docstring_node(function: _Function) -> ast.Constant | None:
    if function.body:
        first = function.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            if isinstance(first.value.value, str):
                return first.value
    return None


def _parameters(function: _Function, in_class: bool) -> int:
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    count = len(positional) + len(args.kwonlyargs)
    count += (args.vararg is not None) + (args.kwarg is not None)
    is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    # a method's self or cls (its first positional parameter) is not counted
    if in_class and not is_static and positional and positional[0].arg in ("self", "cls"):
        count -= 1
    return count


def _size(path: Path, function: _Function, qualname: str, in_class: bool) -> Size:
    # the decorators are not the function's lines: count from `def`
    end = function.end_lineno if function.end_lineno is not None else function.lineno
    lines = end - function.lineno + 1
    docstring = _docstring_node(function)
    long_reason = False
    if docstring is not None and docstring.end_lineno is not None:
        lines -= docstring.end_lineno - docstring.lineno + 1
        text = ast.get_docstring(function) or ""
        long_reason = any(line.strip().startswith("Long:") for line in text.splitlines())
    return Size(path, function.lineno, qualname, lines, _parameters(function, in_class), long_reason)


def _walk(path: Path, node: ast.AST, prefix: str, in_class: bool) -> Iterator[Size]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            qualname = f"{prefix}{child.name}"
            yield _size(path, child, qualname, in_class)
            yield from _walk(path, child, f"{qualname}.", in_class=False)
        elif isinstance(child, ast.ClassDef):
            yield from _walk(path, child, f"{prefix}{child.name}.", in_class=True)
        else:
            yield from _walk(path, child, prefix, in_class)


def sizes(path: Path) -> list[Size]:
    """Every function's size in one Python file, nested functions and methods included.

    Parameters
    ----------
    path : Path
        The file.

    Returns
    -------
    list of Size
        In the order the functions appear.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return list(_walk(path, tree, "", in_class=False))


def _files(roots: list[str]) -> Iterator[Path]:
    for root in roots:
        path = Path(root)
        if path.is_dir():
            yield from sorted(path.rglob("*.py"))
        else:
            yield path


def main(argv: list[str]) -> int:
    """Print the offenders under the given paths; 1 if there is any, else 0."""
    offenders = [size for path in _files(argv or ["relulearn"]) for size in sizes(path) if size.offends]
    for size in offenders:
        print(f"{size.path}:{size.line} {size.name}: {size.lines} lines / {size.parameters} parameters")
    return 1 if offenders else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
