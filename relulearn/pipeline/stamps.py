"""Content stamps of a data source's files, checked around every read (docs/design.md §5).

A stamp is what the file system says of one object without reading it: for a local file its size, modification
time, inode and status-change time (``st_ctime``, which no user can set: a file rewritten and its modification
time set back with ``os.utime`` still shows); for an object at an fsspec URL (S3, GCS, memory) its size and what
``fs.info`` gives that changes with the content (S3's ``ETag``, a modification time, a generation). Readers take
the stamps of their objects when they are opened (:func:`take_stamps`), and each read compares the objects it
reads with them before the rows are used and again after (:func:`check_stamps`): a file replaced or rewritten
under a run is refused, naming it and what changed, before its rows reach a statistic.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

__all__ = ["Stamp", "DataChangedError", "take_stamps", "check_stamps", "stamp_of"]

#: one object's stamp: ``(field, value)`` pairs in a fixed order
Stamp = tuple[tuple[str, Any], ...]

#: the fields of ``fs.info`` of a remote object that change with its content: its digest or version where the
#: store gives one (S3's ETag, GCS's generation), else a modification time (a listing and a HEAD request give an
#: ETag alike, but S3's modification times to the millisecond and to the second: times are not compared there)
_CONTENT_FIELDS = ("ETag", "etag", "generation", "md5Hash")
_TIME_FIELDS = ("mtime", "LastModified", "last_modified", "updated", "created")
_WORDS = {
    "size": "size",
    "mtime_ns": "modification time",
    "inode": "inode",
    "ctime_ns": "status-change time",
    "created": "creation time",
    "mtime": "modification time",
    "LastModified": "modification time",
    "last_modified": "modification time",
    "updated": "modification time",
}


class DataChangedError(ValueError):
    """A data file changed while a run read it (one line naming the file, what changed and the fix)."""


@lru_cache(maxsize=64)
def _fs(url: str, opts_json: str) -> tuple[Any, str]:
    import json

    import fsspec

    return fsspec.core.url_to_fs(url, **json.loads(opts_json))


def _local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def stamp_of(fs: Any, path: str) -> Stamp | None:
    """The stamp of the object at ``path`` of ``fs`` now, or None when there is none."""
    if _local(fs):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return (("size", st.st_size), ("mtime_ns", st.st_mtime_ns), ("inode", st.st_ino), ("ctime_ns", st.st_ctime_ns))
    fs.invalidate_cache(path)  # fsspec caches listings: ask the object store
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    return _remote_stamp(info)


def _remote_stamp(info: Mapping[str, Any]) -> Stamp:
    fields: list[tuple[str, Any]] = [("size", int(info.get("size") or 0))]
    for names in (_CONTENT_FIELDS, _TIME_FIELDS):
        found = next((k for k in names if info.get(k) is not None), None)
        if found is not None:
            return tuple(fields + [(found, str(info[found]))])
    return tuple(fields)


def take_stamps(url: str, opts_json: str) -> dict[str, Stamp]:
    """The stamps of the file at ``url`` (key ``""``), or of every file of the folder (a zarr array) by its path
    inside the folder, e.g. ``zarr.json`` or ``c/1/0``."""
    fs, root = _fs(url, opts_json)
    if _local(fs):
        if not os.path.isdir(root):
            here = stamp_of(fs, root)
            if here is None:
                raise FileNotFoundError(root)
            return {"": here}
        out: dict[str, Stamp] = {}
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                stamp = stamp_of(fs, path)
                if stamp is not None:
                    out[os.path.relpath(path, root).replace(os.sep, "/")] = stamp
        return out
    info = fs.info(root)
    if info.get("type") != "directory":
        return {"": _remote_stamp(info)}
    prefix = root.rstrip("/") + "/"
    return {
        name[len(prefix) :] if name.startswith(prefix) else name: _remote_stamp(e)
        for name, e in fs.find(root, detail=True).items()
    }


def check_stamps(url: str, opts_json: str, stamps: Mapping[str, Stamp], keys: Iterable[str]) -> None:
    """Refuse the read when an object ``keys`` names is not as it was when the reader was opened.

    Raises
    ------
    DataChangedError
        Naming the file, what changed and the fix (restore the file, or start a new store for the new data).
    """
    fs, root = _fs(url, opts_json)
    for key in keys:
        path = root if key == "" else root.rstrip("/") + "/" + key
        then, now = stamps.get(key), stamp_of(fs, path)
        if now == then:
            continue
        shown = url if key == "" else f"{url.rstrip('/')}/{key}"
        raise DataChangedError(
            f"{shown} changed while this run read it ({_what_changed(then, now)}): its rows are no longer those "
            "the run started with; restore the file, or start a new store for the new data"
        )


def _what_changed(then: Stamp | None, now: Stamp | None) -> str:
    if now is None:
        return "it is gone"
    if then is None:
        return "it was created after the run started"
    old, new = dict(then), dict(now)
    parts = []
    for k in list(old) + [k for k in new if k not in old]:  # in the stamp's order
        if old.get(k) == new.get(k):
            continue
        parts.append(f"size {old.get(k)} → {new.get(k)} bytes" if k == "size" else _WORDS.get(k, k))
    return ", ".join(parts) + " changed"
