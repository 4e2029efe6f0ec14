"""Files written whole or not at all: the bytes go to a temporary name in the target's folder, are flushed to disk,
and the temporary file is renamed over the target (``os.replace``, atomic on one file system). An interrupted or
failed write leaves the previous file as it was, never a truncated model or report."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np

__all__ = ["save_npz", "write_bytes", "write_text"]


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically.

    Parameters
    ----------
    path
        The file to write (its folder must exist).
    data
        The whole content.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OSError
        As the file system raises it (no space, no permission), naming ``path``; ``path`` is then unchanged and no
        temporary file is left behind.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and not err.filename:
            raise OSError(err.errno, f"{err.strerror}: could not write {path} (it is unchanged)", str(path)) from err
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"))


def save_npz(path: str | Path, arrays: Mapping[str, np.ndarray]) -> Path:
    """``np.savez`` atomically. As ``np.savez`` does, ``.npz`` is appended to a name without it; returns the path
    written."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    buf = io.BytesIO()
    np.savez(buf, **cast(Mapping[str, Any], arrays))  # the stubs type **kwds against allow_pickle too
    return write_bytes(path, buf.getvalue())
