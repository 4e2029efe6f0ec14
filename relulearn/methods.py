"""The learning methods (``relulearn learn --method``): their names, a constant the command line reads without
importing the methods, and the module that implements each, imported when asked for."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["METHODS", "method_module"]

METHODS = ("moments", "tensor", "filtered-pca", "exact", "landscape", "polynomial")


def method_module(name: str) -> ModuleType:
    """The module of ``relulearn.estimators`` that implements method ``name`` (its ``learn`` function, its
    ``OPTIONS`` and what statistics it needs).

    Raises
    ------
    ValueError
        For a name not in :data:`METHODS`.
    """
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    return importlib.import_module(f"relulearn.estimators.{name.replace('-', '_')}")
