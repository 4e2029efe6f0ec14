"""Files written whole or not at all, at a local path or an fsspec URL (``file://``, ``s3://``, ...).

A local file (a path or a ``file://`` URL): the bytes go to a temporary name in the target's folder, are flushed
to disk, and the temporary file is renamed over the target (``os.replace``, atomic on one file system); the file
gets the mode the umask gives a new file (as ``open`` would), not the temporary file's 0600. An object store's
URL: the whole object goes in one ``pipe`` (s3fs: one PUT, or a multipart upload that the store makes visible
only when complete), so a reader sees the old object or the new one. An interrupted or failed write leaves the
previous file or object as it was, never a truncated model or report.

:func:`read_bytes` reads what :func:`write_bytes` writes, from the same paths and URLs (the model readers use it).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np

__all__ = ["is_remote", "local_path", "read_bytes", "save_npy", "save_npz", "write_bytes", "write_text"]

Target = str | Path

log = logging.getLogger(__name__)


def is_remote(target: Target) -> bool:
    """Whether ``target`` is a URL of a file system other than the local one (``s3://...``; not ``file://``)."""
    return isinstance(target, str) and "://" in target and not target.startswith("file://")


def local_path(target: Target) -> Path:
    """The local path of a path or a ``file://`` URL (as the stores read ``file://``: the rest is the path)."""
    return Path(target.removeprefix("file://")) if isinstance(target, str) else target


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``os.umask`` sets it to read it: a
    thread creating a file meanwhile would get the wrong mode)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_local(path: Path, data: bytes) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp's 0600 would hide a model from the group
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and not err.filename:
            kept = "it is unchanged" if path.exists() else "nothing was written"
            fix = "; free space there" if err.errno in (errno.ENOSPC, errno.EDQUOT) else ""
            raise WriteError(err.errno, f"could not write {path} ({kept}): {err.strerror}{fix}", str(path)) from err
        raise
    return path


class WriteError(OSError):
    """A file that could not be written, said in one sentence that names it (``str`` is the message alone, not
    ``[Errno 28] …: 'path'``)."""

    def __str__(self) -> str:
        return str(self.strerror)


def _filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path on it, or an error naming the package a protocol needs."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as err:
        protocol = url.split("://", 1)[0]
        package = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
        fix = f"pip install {package[protocol]}" if protocol in package else "install the fsspec package for it"
        raise OSError(f"cannot reach {url}: {protocol}:// needs a package that is missing ({err}); {fix}") from None
    except ValueError as err:  # an unknown protocol
        raise OSError(f"cannot reach {url}: {err}") from None


def _write_remote(url: str, data: bytes) -> str:
    fs, path = _filesystem(url)
    try:
        fs.pipe_file(path, data)
    except Exception as err:  # noqa: BLE001 - any failure of the store (credentials, bucket, network) is one line
        raise OSError(f"could not write {url} (any earlier object there is unchanged): {_describe(err)}") from err
    return url


def _describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text.splitlines()[0] if text.strip() else type(err).__name__


def write_bytes(target: Target, data: bytes) -> Target:
    """Write ``data`` to ``target`` atomically.

    Parameters
    ----------
    target
        A local file path (its folder must exist), a ``file://`` URL, or an fsspec URL such as
        ``s3://bucket/key`` (credentials and endpoint as the file system reads them, e.g. ``AWS_ENDPOINT_URL``).
    data
        The whole content.

    Returns
    -------
    Path or str
        The local path written, or the URL.

    Raises
    ------
    OSError
        As the file system or the object store raises it (no space, no permission, no such bucket), naming
        ``target``; ``target`` is then unchanged and no temporary file is left behind.
    """
    written = _write_remote(cast(str, target), data) if is_remote(target) else _write_local(local_path(target), data)
    log.info("wrote %s (%s bytes)", written, f"{len(data):,}")
    return written


def write_text(target: Target, text: str) -> Target:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(target, text.encode("utf-8"))


def save_npz(target: Target, arrays: Mapping[str, np.ndarray]) -> Target:
    """``np.savez`` atomically, to a path or a URL. As ``np.savez`` does, ``.npz`` is appended to a name without
    it; returns the path or URL written."""
    if not str(target).endswith(".npz"):
        target = target + ".npz" if isinstance(target, str) else target.with_name(target.name + ".npz")
    buf = io.BytesIO()
    np.savez(buf, **cast(Mapping[str, Any], arrays))  # the stubs type **kwds against allow_pickle too
    return write_bytes(target, buf.getvalue())


def save_npy(target: Target, array: np.ndarray) -> Target:
    """``np.save`` atomically, to a path or a URL. As ``np.save`` does, ``.npy`` is appended to a name without it;
    returns the path or URL written."""
    if not str(target).endswith(".npy"):
        target = target + ".npy" if isinstance(target, str) else target.with_name(target.name + ".npy")
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return write_bytes(target, buf.getvalue())


def read_bytes(target: Target) -> bytes:
    """The whole content of a local file, a ``file://`` URL or an fsspec URL.

    Raises
    ------
    FileNotFoundError
        ``target`` does not exist.
    OSError
        It cannot be read (a folder, no permission, an unreachable store), naming ``target``.
    """
    if not is_remote(target):
        return local_path(target).read_bytes()
    fs, path = _filesystem(cast(str, target))
    try:
        return bytes(fs.cat_file(path))
    except FileNotFoundError:
        raise FileNotFoundError(f"{target} does not exist") from None
    except IsADirectoryError:
        raise
    except Exception as err:  # noqa: BLE001 - credentials, endpoint, permissions: one line naming the URL
        raise OSError(f"could not read {target}: {_describe(err)}") from err
