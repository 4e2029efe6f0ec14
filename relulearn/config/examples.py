"""The example configurations shipped with the package (``relulearn/examples/*.yaml``; ``examples/`` in a
checkout is the same folder), so that ``relulearn example NAME`` gives a wheel's user the files the
documentation runs."""

from __future__ import annotations

from importlib.resources import files

from .base import ConfigError

__all__ = ["example_description", "example_names", "example_text"]


def _folder():
    return files("relulearn") / "examples"


def example_names() -> list[str]:
    """The names of the shipped examples, sorted (``small`` for ``small.yaml``)."""
    return sorted(p.name.removesuffix(".yaml") for p in _folder().iterdir() if p.name.endswith(".yaml"))


def example_text(name: str) -> str:
    """The configuration file of the example ``name``, exactly as shipped.

    Raises
    ------
    ConfigError
        When no example has that name (the message lists the names).
    """
    names = example_names()
    if name not in names:
        raise ConfigError(f"no example named {name!r}: the examples are {', '.join(names)} (`relulearn example`)")
    return (_folder() / f"{name}.yaml").read_text(encoding="utf-8")


def example_description(name: str) -> str:
    """The first sentence of the example's leading comment: what it plants or runs."""
    comment = []
    for line in example_text(name).splitlines():
        if not line.startswith("#") or not line[1:].strip():
            break
        comment.append(line[1:].strip())
    text = " ".join(comment)
    return text.split(". ")[0].rstrip(".") + "."
