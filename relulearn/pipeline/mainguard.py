"""Whether a local cluster's worker processes would re-run the caller's script, checked before they start.

Python's ``multiprocessing`` starts each worker process of a local cluster (Dask's nannies spawn them) by
importing the parent's main module again under the name ``__mp_main__``: a script's top-level code runs once more
in every worker. A script that calls relulearn at its top level, outside ``if __name__ == "__main__":``, would make
each worker run the whole script again, take the store's lease (held by the script itself) and die; the cluster
then fails to start with a page of tracebacks. :func:`unguarded_call` finds that case before anything starts, so
that it is refused in one line saying what to add.

A main module with no file to re-import (``python -``, ``python -c``, a notebook, an interactive session) is
re-imported by nothing; ``python -`` names ``<stdin>`` as its file, which ``multiprocessing`` tries and fails to
open in each worker: :func:`hide_missing_main` hides that name while the workers start.
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
from collections.abc import Iterator
from functools import lru_cache
from types import FrameType, ModuleType

__all__ = ["UnguardedScriptError", "check_main_guard", "hide_missing_main", "unguarded_call"]


class UnguardedScriptError(SystemExit):
    """A script started worker processes from its top level, outside ``if __name__ == "__main__":``.

    A ``SystemExit`` with exit code 2: uncaught, the script stops with the one line printed when it was raised
    (a traceback would bury it), as the command line stops on a user's mistake. ``str()`` is the message.
    """

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _main_module() -> ModuleType | None:
    return sys.modules.get("__main__")


def _script_path(main: ModuleType) -> str | None:
    """The file worker processes would re-run (None: none), as ``multiprocessing.spawn`` decides: a main module
    run by name (``python -m pkg.mod``) is re-imported by that name unless it is a package's ``__main__``; one
    run from a file is re-run from it (not IPython's); a file that cannot be read is not judged."""
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None
    path = getattr(main, "__file__", None)
    if not path or not os.path.isfile(path) or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    return os.path.abspath(path)


@lru_cache(maxsize=8)
def _guarded_lines(path: str, mtime: float) -> tuple[tuple[int, int], ...] | None:
    """Line spans of the bodies of ``if __name__ == "__main__":`` blocks at the top level of a script (None: a
    file that does not parse, whose guard cannot be judged)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    spans = []
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            spans.append((node.body[0].lineno, max(getattr(n, "end_lineno", n.lineno) or n.lineno for n in node.body)))
    return tuple(spans)


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def _module_frame(main: ModuleType, frame: FrameType | None) -> FrameType | None:
    """The frame of the main module's top-level code on the stack above ``frame``, if any."""
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


def unguarded_call(frame: FrameType | None = None) -> tuple[str, int] | None:
    """``(script, line)`` when this call comes from a script's top level outside ``if __name__ == "__main__":``,
    the code worker processes would run again; None otherwise (a guarded call, a call from a function that is
    not run at import, no script file, the main module's name not ``__main__``: a worker itself)."""
    main = _main_module()
    if main is None or getattr(main, "__name__", None) != "__main__":
        return None
    path = _script_path(main)
    if path is None:
        return None
    top = _module_frame(main, frame if frame is not None else sys._getframe(1))
    if top is None:
        return None
    spans = _guarded_lines(path, os.path.getmtime(path))
    if spans is None:
        return None
    line = top.f_lineno
    if any(lo <= line <= hi for lo, hi in spans):
        return None
    return path, line


def check_main_guard(what: str = "a local Dask cluster") -> None:
    """Refuse, before any worker starts, a call from a script's unguarded top level (:func:`unguarded_call`).

    Raises
    ------
    UnguardedScriptError
        Exit code 2, its one line printed to standard error: the script and line, and the two fixes.
    """
    found = unguarded_call(sys._getframe(1))
    if found is None:
        return
    path, line = found
    message = (
        f"relulearn: {os.path.basename(path)}, line {line}, starts {what} from the top level of the script, and "
        "each worker process runs the script again from the top: put the script's code under "
        '`if __name__ == "__main__":`, or run in this process (client="local")'
    )
    print(message, file=sys.stderr, flush=True)
    raise UnguardedScriptError(message)


@contextlib.contextmanager
def hide_missing_main() -> Iterator[None]:
    """Worker processes started inside the block do not try to re-run a main module whose file does not exist
    (``python -`` names ``<stdin>``): ``multiprocessing`` would fail to open it in each worker. The attribute is
    put back as it was when the block ends."""
    main = _main_module()
    path = getattr(main, "__file__", None)
    if main is None or path is None or os.path.isfile(path) or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path
