"""A configuration's validation errors as one line per key: an unknown key with the closest valid one ("did you
mean"), a missing key, an unknown teacher kind, a section that is not a mapping."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from .run import RunConfig
from .source import TeacherConfig


def _valid_keys(model: type[BaseModel]) -> list[str]:
    return [name for name, field in model.model_fields.items() if not field.exclude]


def _kind_of(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("kind")
    return getattr(field.annotation, "__args__", (None,))[0] if field is not None else None


def _model_at(loc: tuple, root: type[BaseModel], data: Any = None) -> type[BaseModel] | None:
    """The model class that owns the location ``loc`` (used to suggest keys); ``data`` is
    the input, used to tell the members of a union apart by their ``kind``."""
    model: Any = root
    for i, part in enumerate(loc[:-1]):
        data = data.get(part) if isinstance(data, dict) else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            # a union member tag such as 'OneHiddenReluTeacher'
            return None
        ann = field.annotation
        candidates = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not candidates:
            return None
        # in a union (e.g. the teacher kinds) the owner is the member that lacks the unknown
        # key, or that has the next key on the way to it
        nxt, last = loc[i + 1], i + 1 == len(loc) - 1
        kind = data.get("kind") if isinstance(data, dict) else None
        tags = [t for t in ("file", "callable", "onnx") if isinstance(data, dict) and t in data]
        if tags:  # as _pick_teacher
            tag = tags[0]
            by_kind = [c for c in candidates if tag in c.model_fields]
        else:
            by_kind = [c for c in candidates if kind is not None and _kind_of(c) == kind]
        if by_kind:
            model = by_kind[0]
            continue
        fitting = [c for c in candidates if (nxt in c.model_fields) != last]
        model = (fitting or candidates)[0]
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _format_errors(err: ValidationError, where: str, data: Any = None) -> str:
    lines: list[str] = []
    for e in err.errors():
        # drop union member tags such as 'FileTeacher' or 'function-after[_lengths(), OneHiddenReluTeacher]'
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and (p[:1].isupper() or "[" in p)))
        key = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            owner = _model_at(loc, RunConfig, data)
            hint = ""
            if owner is not None:
                close = difflib.get_close_matches(str(loc[-1]), _valid_keys(owner), n=1, cutoff=0.5)
                valid = ", ".join(_valid_keys(owner))
                hint = f" — did you mean '{close[0]}'?" if close else ""
                hint += f" (valid keys here: {valid})" if valid else " (this section takes no keys: write it as {})"
            lines.append(f"unknown key '{key}'{hint}")
        elif e["type"] == "missing":
            lines.append(f"missing required key '{key}'")
        elif e["type"] == "literal_error" and loc[-2:] == ("teacher", "kind"):
            kinds = [k for k in (_kind_of(c) for c in TeacherConfig.__args__) if k]
            close = difflib.get_close_matches(str(e.get("input")), kinds, n=1, cutoff=0.5)
            line = (
                f"'{key}': unknown teacher kind {e.get('input')!r}"
                + (f" — did you mean '{close[0]}'?" if close else "")
                + f" (kinds: {', '.join(kinds)}; or a network from a file, an ONNX model or a Python callable: "
                "the keys file, onnx or callable instead of kind)"
            )
            if line not in lines:  # one line for all members of the union
                lines.append(line)
        elif e["type"] in ("model_type", "dict_type"):
            line = f"'{key}' must be a mapping of keys (got {e.get('input')!r})"
            if line not in lines:  # one line for all members of a union
                lines.append(line)
        else:
            got = e.get("input")
            got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
            lines.append(f"'{key}': {e['msg']}{got_s}")
    return f"invalid configuration {where}:\n  " + "\n  ".join(lines)
