"""The ``relulearn`` command line: argument parsing and printing only; the work is in :mod:`relulearn.api`.

:func:`main` reads the arguments (:mod:`.parser`), refuses a locked store at once, checks the configuration a
command names, then imports the library and runs the command (:mod:`.commands`), printing its result for people
(:mod:`.output`) or as JSON.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import MissingDependencyError
from ..storage.errors import StoreError
from .codes import EXIT_DAMAGED, EXIT_INTERRUPTED, EXIT_USER_ERROR
from .parser import build_parser

__all__ = ["EXIT_DAMAGED", "EXIT_INTERRUPTED", "EXIT_USER_ERROR", "build_parser", "main"]

#: the store each writing command writes (the argument naming it)
_WRITES = {"estimate": "store", "fit": "store", "curve": "store", "merge": "out"}


def _refuse_if_locked(args: argparse.Namespace) -> None:
    """Raise the lease's refusal before anything is imported or read, when the store a writing command names is a
    local folder whose lease another writer holds (live, or stale but not provably gone, without
    ``--break-lock``); the command itself refuses the same way later, this only makes it immediate."""
    where = _WRITES.get(args.command)
    url = getattr(args, where, None) if where else None
    if url is None or getattr(args, "break_lock", False) or "://" in str(url):
        return
    from ..storage.lease import StoreLockedError, read_lease

    found = read_lease(str(url))  # (never opens anything but a small regular file)
    if found is not None and not found.holder_gone():
        stale = found.stale_reason()
        raise StoreLockedError(str(url), found, stale)


def _check_config(args: argparse.Namespace) -> None:
    """Read and validate the configuration a command names (``estimate``, ``fit``, ``plan``) before the library is
    imported, so that a mistake in it is reported in a fraction of a second; the command reads it again."""
    path = getattr(args, "config", None)
    if path is not None:
        from ..config import load_config

        load_config(path)


#: what is safe after Ctrl-C, per command (others write nothing, or only the file they were asked for, whole)
_INTERRUPTED: dict[str | None, str] = {
    "estimate": "every merged block was committed. Run the same command to resume.",
    "fit": "every merged block was committed. Run the same command to resume.",
    "curve": "every merged block and every point learned was kept. Run the same command to resume.",
    "learn": "the blocks of the passes it ran were committed; run the same command to continue from them.",
    "merge": "the output store keeps its last commit; run the same command again.",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``relulearn ARGV``; returns the exit code (0, :data:`EXIT_USER_ERROR` with ``relulearn: error: …``
    for a user's mistake, :data:`EXIT_DAMAGED` from ``verify``, :data:`EXIT_INTERRUPTED` after Ctrl-C)."""
    args = build_parser().parse_args(argv)
    try:
        _refuse_if_locked(args)
    except StoreError as err:
        return _error(args, str(err), err)
    from ..config import ConfigError

    try:
        _check_config(args)
    except ConfigError as err:
        return _error(args, str(err), err)
    # the library is imported once the arguments are read, a locked store has been refused and the configuration
    # checked: a second writer or a mistyped key is turned away at once (numpy, zarr, dask and the methods take
    # most of a second to import)
    from . import commands
    from .logs import logging_to_stderr

    with logging_to_stderr(args.verbose, args.quiet):
        return _run(args, argv, commands)


def _run(args: argparse.Namespace, argv: Sequence[str] | None, commands: Any) -> int:
    """Run the command and print its outcome (inside the command's logging, :mod:`.logs`)."""
    from ..config import ConfigError
    from ..network import NetworkFileError
    from ..pipeline.cluster import ClusterLostError
    from ..pipeline.sources import SourceDataError

    try:
        outcome = commands.run(args)
    except BrokenPipeError:  # a command that prints as it goes, read by `| head`: the reader has what it wanted
        _stdout_to_devnull()
        return 0
    except ClusterLostError as err:
        resume = "relulearn " + shlex.join(sys.argv[1:] if argv is None else list(argv))
        return _error(
            args,
            f"{err}. Start the scheduler and workers again (or drop --scheduler for a local cluster) and run "
            f"the same command to resume: {resume}",
            err,
        )
    except (
        ConfigError,
        StoreError,
        NetworkFileError,
        SourceDataError,
        OSError,
        ValueError,
        MissingDependencyError,
    ) as err:
        return _error(args, str(err), err)
    except KeyboardInterrupt:
        print(
            f"relulearn: interrupted; {_INTERRUPTED.get(getattr(args, 'command', None), 'nothing was written')}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if isinstance(outcome, int):  # the command printed what it had to say
        return outcome
    try:
        commands.show(args, outcome)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `relulearn plan small.yaml | head -3`
        _stdout_to_devnull()
    return 0


def _stdout_to_devnull() -> None:
    """Standard output to /dev/null, so that the interpreter's last flush at exit does not fail again on the
    closed pipe (Python's documented handling of SIGPIPE)."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _error(args: argparse.Namespace, message: str, err: BaseException) -> int:
    """Report a user's mistake: ``relulearn: error: …`` on stderr (and as JSON on stdout with ``--json``)."""
    if getattr(args, "json", False):
        print(json.dumps({"error": message, "kind": type(err).__name__}))
    print(f"relulearn: error: {message}", file=sys.stderr)
    return EXIT_USER_ERROR
