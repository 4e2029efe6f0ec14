"""Errors every layer may raise that are not about a store, a configuration or a source."""

from __future__ import annotations

__all__ = ["MissingDependencyError"]


class MissingDependencyError(ImportError):
    """An optional dependency a command needs is not installed; the message names the extra that installs it
    (the command line reports it as ``relulearn: error:`` with exit code 2)."""
