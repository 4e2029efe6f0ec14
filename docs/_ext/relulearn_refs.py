"""Write the command-line and configuration references from the code, before Sphinx reads the sources.

``reference/cli.md`` comes from ``relulearn.cli.build_parser()`` (every subcommand's usage, description and
options, as ``--help`` prints them), ``reference/config.md`` from the pydantic models of
``relulearn.config`` (every key, its type, default and description), and the methods page's table and each
method page's options from the declarations in ``relulearn.methods``, so none can drift from the code.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# ------------------------------------------------------------------ CLI


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_reference() -> str:
    from relulearn.cli import build_parser

    parser = build_parser()
    parser.prog = "relulearn"
    out = [
        "# Command-line reference",
        "",
        "Generated from the argument parser when the documentation is built: the same text as `--help`.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    for name, sub in _subparsers(parser).items():
        sub.prog = f"relulearn {name}"
        out += [f"## `relulearn {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# ------------------------------------------------------------------ configuration


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:  # Optional[X] and X | None alike
        args = [a for a in get_args(annotation) if a is not type(None)]
        names = " or ".join(_type_name(a) for a in args)
        return names + (" (optional)" if len(args) < len(get_args(annotation)) else "")
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in get_args(annotation))
    if origin in (list, tuple):
        return f"list of {_type_name(get_args(annotation)[0])}" if get_args(annotation) else "list"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        kind = annotation.model_fields.get("kind")
        kinds = get_args(kind.annotation) if kind is not None else ()
        if kinds:
            return f"section (kind {kinds[0]})"
        # a section told apart by a key of its own (a teacher's `file:`, `callable:` or `onnx:`)
        required = [k for k, f in annotation.model_fields.items() if f.is_required()]
        return f"section ({required[0]}: …)" if required else "section"
    name = getattr(annotation, "__name__", str(annotation)).replace("typing.", "")
    # the sections live in submodules of relulearn.config, which re-exports them: name them where users import them
    return re.sub(r"\brelulearn\.config\.\w+\.", "relulearn.config.", name)


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    if field.default_factory is not None:
        return "(a section of defaults)" if isinstance(field.default_factory, type) else "(computed)"
    return f"`{field.default!r}`"


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models(a)]


def _escape(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _first_sentence(model: type[BaseModel]) -> str:
    doc = " ".join((model.__doc__ or "").split())
    return doc.split(". ")[0].rstrip(".") if doc else "see below"


def _section(model: type[BaseModel], path: str, out: list[str], seen: set[str]) -> None:
    doc = (model.__doc__ or "").strip()
    title = f"`{path}`" if path else "Top level"
    if model.__name__ in seen:
        return
    seen.add(model.__name__)
    out += [f"## {title}" + (f" ({model.__name__})" if path else ""), ""]
    if doc:
        out += [" ".join(doc.split()), ""]
    rows, nested = [], []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        subs = _models(field.annotation)
        meaning = field.description or (
            "; ".join(_first_sentence(m) for m in subs[:1])
            if len(subs) == 1
            else "one of the sections below, chosen by its `kind`"
            if subs
            else ""
        )
        rows.append(
            f"| `{name}` | {_escape(_type_name(field.annotation))} | {_escape(_default(field))} | {_escape(meaning)} |"
        )
        for sub in _models(field.annotation):
            nested.append((sub, f"{path}.{name}" if path else name))
    out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for sub, sub_path in nested:
        _section(sub, sub_path, out, seen)


def config_reference() -> str:
    from relulearn.config import RunConfig

    out = [
        "# Configuration reference",
        "",
        "Generated from the configuration's schema (`relulearn.config`) when the documentation is built. "
        "Unknown keys are refused with the closest known one; [the configuration guide](../guide/configuration.md) "
        "explains the choices.",
        "",
    ]
    _section(RunConfig, "", out, set())
    return "\n".join(out)


# ------------------------------------------------------------------ methods


def methods_table() -> str:
    """The methods page's table, from the declarations in :data:`relulearn.methods.METHODS`."""
    from relulearn.methods import METHODS

    out = ["| `--method` | learns | from | seed paper | pick instead when |", "|---|---|---|---|---|"]
    for m in METHODS.values():
        out.append(f"| [`{m.name}`]({m.name}.md) | {m.learns} | {m.source} | {m.paper} | {m.instead} |")
    return "\n".join(out) + "\n"


def method_options(name: str) -> str:
    """A method page's list of options, from its declaration: each flag and what it does for this method."""
    from relulearn.methods import METHODS, OPTIONS

    m = METHODS[name]
    out = [
        f"Options of `--method {name}` (with `learn` and `fit`; scikit-learn: the `{m.regressor}` parameters "
        "of the same names):",
        "",
    ]
    for key in OPTIONS:  # the command line's order
        if key in m.options:
            choices = f" ({', '.join(OPTIONS[key].choices)})" if OPTIONS[key].choices else ""
            out.append(f"- `{OPTIONS[key].flag}`{choices}: {' '.join(m.options[key].split())}")
    return "\n".join(out) + "\n"


def write(docs: Path) -> None:
    from relulearn.methods import METHODS

    (docs / "reference").mkdir(exist_ok=True)
    pages = {
        "reference/cli.md": cli_reference(),
        "reference/config.md": config_reference(),
        "methods/figures/table.md": methods_table(),
    }
    pages.update({f"methods/figures/{name}-options.md": method_options(name) for name in METHODS})
    for name, text in pages.items():
        path = docs / name
        if not path.exists() or path.read_text() != text:  # unchanged files keep Sphinx's cache valid
            path.write_text(text)


def setup(app: Any) -> dict:
    app.connect("builder-inited", lambda app: write(Path(app.srcdir)))
    return {"parallel_read_safe": True, "version": "1"}
