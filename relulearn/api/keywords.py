"""The keywords of ``fit``, ``learn`` and ``curve``, declared once: the method options of
:data:`relulearn.methods.OPTIONS` and the execution keywords (:class:`~.execution.Execution`).

Each of these functions takes them as ``**keywords``; :func:`takes_keywords` gives it the public signature
(``inspect.signature``, ``help`` and the API reference list every keyword with its default) and the docstring's
parameter list, both generated from the declarations, and :func:`split_keywords` checks a call's keywords against
them: a keyword nobody declares is refused naming the closest valid one and the method's options, an option of
another method as the command line refuses it.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from ..methods import METHODS, OPTIONS, option_help, parameter_lines
from .execution import EXECUTION_HELP, Execution

F = TypeVar("F", bound=Callable[..., Any])


def _option_parameters() -> list[inspect.Parameter]:
    return [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=o.annotation)
        for name, o in OPTIONS.items()
    ]


def _execution_parameters() -> list[inspect.Parameter]:
    return [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in fields(Execution)
    ]


def _option_lines() -> list[str]:
    lines = []
    for name, o in OPTIONS.items():
        kind = "{" + ", ".join(map(repr, o.choices)) + "}" if o.choices else o.annotation.replace(" | None", "")
        kind += ", optional"
        lines += parameter_lines(name, kind, f"{option_help(name)}; None: the method's default.")
    return lines


def _execution_lines() -> list[str]:
    return [line for name, (kind, text) in EXECUTION_HELP.items() for line in parameter_lines(name, kind, text)]


def _with_parameters(doc: str, lines: list[str]) -> str:
    """``doc`` with a numpydoc ``Parameters`` section of ``lines`` (before its ``Returns``/``Raises``, if any)."""
    text = inspect.cleandoc(doc)
    section = "\n".join(["Parameters", "----------", *lines])
    for heading in ("Returns\n-------", "Raises\n------"):
        at = text.find(heading)
        if at >= 0:
            return f"{text[:at]}{section}\n\n{text[at:]}"
    return f"{text}\n\n{section}\n"


def takes_keywords(own: dict[str, str]) -> Callable[[F], F]:
    """Give a function that takes ``**keywords`` its public signature and parameter list: its own parameters
    (described by ``own``, ``{name: "type\\n    description"}``), every method option, then the execution
    keywords."""

    def attach(func: F) -> F:
        sig = inspect.signature(func)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        keyword_only = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        every = [*positional, *_option_parameters(), *keyword_only, *_execution_parameters()]
        func.__signature__ = sig.replace(parameters=every)  # type: ignore[attr-defined]
        described = [line for name, text in own.items() for line in (f"{name} : {text}".split("\n"))]
        func.__doc__ = _with_parameters(func.__doc__ or "", described + _option_lines() + _execution_lines())
        return func

    return attach


def split_keywords(function: str, method: str, keywords: dict[str, Any]) -> tuple[dict[str, Any], Execution]:
    """A call's ``**keywords`` as the method's options (:func:`checked_options`) and its :class:`Execution`.

    Raises
    ------
    TypeError
        For a keyword that is neither a method option nor an execution keyword, naming the closest valid one.
    ValueError
        For the option of another method (as ``--method`` refuses its flag).
    """
    execution = {f.name for f in fields(Execution)}
    refuse_unknown(function, method, keywords, [*OPTIONS, *execution])
    options = checked_options(method, **{k: keywords.get(k) for k in OPTIONS})
    return options, Execution(**{k: v for k, v in keywords.items() if k in execution})


def refuse_unknown(function: str, method: str, keywords: dict[str, Any], valid: list[str]) -> None:
    """Refuse the first of ``keywords`` not in ``valid``: a :class:`TypeError` naming the closest valid one and the
    method's options, as Python words an unexpected keyword argument (``function``: its name under
    ``relulearn``, e.g. ``fit`` or ``api.plan``)."""
    for name in keywords:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            taken = ", ".join(["width", *(k for k in METHODS[method].options if k != "width")])
            raise TypeError(
                f"{function.rpartition('.')[2]}() got an unexpected keyword argument {name!r}{hint} "
                f"(--method {method} takes {taken}; "
                f"see help(relulearn.{function}))"
            )


def checked_options(method: str, **given: Any) -> dict[str, Any]:
    """The method's keyword options (``width`` always); options a method does not declare
    (:attr:`relulearn.methods.Method.options`) are refused by name."""
    allowed = {"width", *METHODS[method].options}
    extra = [k for k, v in given.items() if v is not None and k not in allowed]
    if extra:
        verb = "applies" if len(extra) == 1 else "apply"
        users = [m.name for m in METHODS.values() if all(k in m.options for k in extra)]
        extra = [OPTIONS[k].flag if k in OPTIONS else f"--{k}" for k in extra]
        raise ValueError(f"{' and '.join(extra)} {verb} to --method {' or '.join(users)} only, not to {method}")
    return {k: v for k, v in given.items() if k == "width" or v is not None}
