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


def _local_store(folder: Path) -> bool:
    """Whether ``folder`` is a relulearn store: its root document, or a writer's lease (a first run under way)."""
    doc = folder / "zarr.json"
    try:
        raw = doc.read_bytes() if doc.is_file() else None
    except OSError:
        raw = None
    return _is_store_doc(raw) or (folder / LEASE_KEY).is_file()


def _remote_store(url: str) -> bool:
    from .folder import _get
    from .location import _open_store

    store = _open_store(url, read_only=True)
    raw = _get(store, "zarr.json")
    return _is_store_doc(None if raw is None else raw.to_bytes()) or _get(store, LEASE_KEY) is not None


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
