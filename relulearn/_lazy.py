"""Packages whose public names are imported on first use (PEP 562): one ``__getattr__`` and ``__dir__`` for all.

The command line starts, checks its arguments and refuses a locked store before numpy, zarr, Dask and the methods
are imported; ``relulearn status`` reads a store without the pipeline.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def attach(package: str, names: Mapping[str, str], public: Sequence[str]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``, whose names ``names`` (``{name: module}``, the module relative
    to the package, e.g. ``".runs"`` or ``"..storage"``) are imported on first use and then kept in the package;
    its modules resolve as attributes too (``relulearn.api.execution``)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            if importlib.util.find_spec(f"{package}.{name}") is not None:  # a module of the package
                return importlib.import_module(f".{name}", package)
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__
