"""Where the command line sends the library's log records: the ``relulearn`` logger (and its children) to stderr,
at the level ``-v`` / ``-q`` ask for. Only the command line configures logging; the library only logs.

========  =============================================================================================
default   warnings and errors (``relulearn: warning: ...``), besides the command's progress and result
``-v``    also what the run does (INFO: stores opened and committed, files written, workers checked)
``-vv``   also the details (DEBUG)
``-q``    errors only: no progress lines and no notices; the command's result (its table or JSON) still prints
========  =============================================================================================
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

__all__ = ["level", "logging_to_stderr"]


def level(verbose: int, quiet: bool) -> int:
    """The ``relulearn`` logger's level for ``-v`` given ``verbose`` times and ``-q``."""
    if quiet:
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)


class _Format(logging.Formatter):
    """``relulearn: warning: ...`` as the command line's errors read; INFO without a level; DEBUG names its
    module."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.levelno >= logging.WARNING:
            return f"relulearn: {record.levelname.lower()}: {text}"
        if record.levelno >= logging.INFO:
            return f"relulearn: {text}"
        return f"{record.name}: {text}"


@contextlib.contextmanager
def logging_to_stderr(verbose: int, quiet: bool) -> Iterator[None]:
    """Send the ``relulearn`` logger's records at the level of ``-v``/``-q`` to the current ``sys.stderr`` for
    the duration of a command; the logger is left as it was found (a command run inside another program, as
    the tests do, adds nothing that outlives it)."""
    log = logging.getLogger("relulearn")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Format())
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(level(verbose, quiet))
    log.propagate = False  # the command line prints them once, in its own format
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]
