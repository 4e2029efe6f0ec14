"""tools/function_sizes.py: what counts as a function's lines and parameters, and what a `Long:` reason exempts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "function_sizes.py"


def _tool():
    spec = importlib.util.spec_from_file_location("function_sizes", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["function_sizes"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _function(name: str, body_lines: int, doc: list[str], params: str = "") -> str:
    docstring = ['    """'] + [f"    {line}" for line in doc] + ['    """'] if doc else []
    return "\n".join([f"def {name}({params}):", *docstring, *["    x = 1"] * body_lines, ""]) + "\n"


def test_lines_exclude_the_docstring_and_a_long_reason_exempts_them(tmp_path, capsys):
    fs = _tool()
    source = (
        _function("fits", 79, ["One job.", "", "More words."])  # def + 79 = 80 lines: allowed
        + _function("too_long", 80, ["Two jobs."])
        + _function("explained", 120, ["A sequence.", "", "Long: one procedure that splits badly."])
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    sizes = {s.name: s for s in fs.sizes(path)}
    assert sizes["fits"].lines == 80 and not sizes["fits"].offends
    assert sizes["too_long"].lines == 81 and sizes["too_long"].offends
    assert sizes["explained"].long_reason and not sizes["explained"].offends
    assert fs.main([str(path)]) == 1
    assert capsys.readouterr().out == f"{path}:{sizes['too_long'].line} too_long: 81 lines / 0 parameters\n"


def test_parameters_count_star_args_once_and_skip_self(tmp_path):
    fs = _tool()
    ten = ", ".join(f"a{i}" for i in range(10))
    twelve = ten + ", *args, **kw"
    source = (
        "class C:\n"
        + "".join("    " + line + "\n" for line in _function("method", 1, [], "self, " + twelve).splitlines())
        + _function("thirteen", 1, ["Long: no help for parameters."], ten + ", *args, extra, **kw")
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    sizes = {s.name: s for s in fs.sizes(path)}
    assert sizes["C.method"].parameters == 12 and not sizes["C.method"].offends
    assert sizes["thirteen"].parameters == 13 and sizes["thirteen"].offends
