"""What a local path given for a file is, said before it is opened: "does not exist" was the word for a folder,
``/dev/zero`` (read for ever) or a FIFO (waits for a writer) given where a file is expected."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["not_a_file", "is_local"]

_KINDS = (
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISCHR, "is not a regular file (a character device)"),
    (stat.S_ISBLK, "is not a regular file (a block device)"),
    (stat.S_ISFIFO, "is not a regular file (a named pipe)"),
    (stat.S_ISSOCK, "is not a regular file (a socket)"),
)


def is_local(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a local file (a URL such as ``s3://…`` is another store's business)."""
    text = os.fspath(path)
    return "://" not in text or text.startswith("file://")


def not_a_file(path: str | os.PathLike[str]) -> str | None:
    """None when ``path`` is a regular file (after symbolic links) or not local; else what it is, worded to follow
    the path: ``does not exist``, ``is a directory``, ``is not a regular file (a character device)``, …

    Only :func:`os.stat` runs: a device or a named pipe is never opened (reading ``/dev/zero`` never ends, and
    opening a FIFO waits for a writer)."""
    if not is_local(path):
        return None
    text = os.fspath(path)
    local = Path(text.removeprefix("file://"))
    try:
        mode = local.stat().st_mode
    except FileNotFoundError:
        if local.is_symlink():
            return f"does not exist (a symbolic link to {os.readlink(local)}, which is missing)"
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a part of its path is a file, not a folder)"
    except OSError:  # no permission to look, a loop of links: the read names it
        return None
    if stat.S_ISREG(mode):
        return None
    for test, words in _KINDS:
        if test(mode):
            return words
    return "is not a regular file"
