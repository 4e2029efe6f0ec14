"""A new store is never created inside another relulearn store: the outer store's commits delete what they did
not write under names like their own (``gNNNNNN``), and its folder is its own. The one exception is the outer
store's own extra passes, ``STORE/passes/<name>`` (:func:`relulearn.api.learning._pass_url`), stores it keeps."""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path

from .errors import StoreError
from .folder import LEASE_KEY
from .location import _is_local, _local_path, _object_store_errors

__all__ = ["check_not_inside_a_store"]

#: where a store keeps its extra passes, each a store of its own (``STORE/passes/<name>``)
_PASSES = "passes"


def _is_store_doc(raw: bytes | None) -> bool:
    """Whether ``raw`` is the root document of a relulearn store (a JSON object with a ``relulearn`` attribute)."""
    if raw is None:
        return False
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("attributes"), dict) and "relulearn" in doc["attributes"]


def _is_lease_doc(raw: bytes | None) -> bool:
    """Whether ``raw`` is a relulearn writer's lease (:mod:`~relulearn.storage.lease`): a first run under way
    has one before its root document (another tool's ``lease.json`` is not one)."""
    if raw is None or len(raw) > _LEASE_BYTES:
        return False
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and {"holder", "heartbeat"} <= set(doc)


#: a lease document is a few hundred bytes; a larger file named lease.json is not read
_LEASE_BYTES = 1 << 16


def _read_local(path: Path, most: int | None = None) -> bytes | None:
    """The bytes of a regular file (at most ``most``), or None (missing, a folder, a device, a FIFO)."""
    try:
        if not path.is_file():
            return None
        with path.open("rb") as f:
            return f.read() if most is None else f.read(most + 1)
    except OSError:
        return None


def _local_store(folder: Path) -> bool:
    """Whether ``folder`` is a relulearn store: its root document, or a writer's lease (a first run under way)."""
    return _is_store_doc(_read_local(folder / "zarr.json")) or _is_lease_doc(
        _read_local(folder / LEASE_KEY, _LEASE_BYTES)
    )


def _remote_store(url: str) -> bool:
    from .folder import _get
    from .location import _open_store

    store = _open_store(url, read_only=True)
    raw, lease = _get(store, "zarr.json"), _get(store, LEASE_KEY)
    return _is_store_doc(None if raw is None else raw.to_bytes()) or _is_lease_doc(
        None if lease is None else lease.to_bytes()
    )


def _ancestors(url: str) -> list[tuple[str, tuple[str, ...]]]:
    """Each folder above ``url``, nearest first, with the path of ``url`` below it."""
    if _is_local(url):
        path = Path(os.path.realpath(_local_path(url)))
        return [(str(parent), path.relative_to(parent).parts) for parent in path.parents]
    scheme, rest = url.split("://", 1)
    parts = [p for p in posixpath.normpath("/" + rest).split("/") if p]
    return [(f"{scheme}://{'/'.join(parts[:i])}", tuple(parts[i:])) for i in range(len(parts) - 1, 0, -1)]


def check_not_inside_a_store(url: str) -> None:
    """Refuse to create a store at ``url`` when a folder above it is a relulearn store (its root document or its
    writer's lease is there), unless ``url`` is that store's extra pass, ``STORE/passes/<name>``.

    Local paths are resolved first (``..``, symbolic links); an fsspec URL's parents are read on its file system
    (one read of ``zarr.json`` per level).

    Raises
    ------
    StoreError
        Naming the outer store and saying to choose a path outside it; nothing is written.
    """
    local = _is_local(url)
    with _object_store_errors(url, "read"):
        for parent, below in _ancestors(url):
            if not (_local_store(Path(parent)) if local else _remote_store(parent)):
                continue
            if len(below) == 2 and below[0] == _PASSES:
                return  # the store's own extra pass
            raise StoreError(
                f"cannot create a store at {url}: it is inside the relulearn store {parent}, whose commits "
                f"delete what they did not write; choose a path outside {parent}"
            )
