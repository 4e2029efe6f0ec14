"""Reading a committed generation: the arrays of its groups, each chunk and document checked against the commit's
manifest before a value is used, and ``head`` read again after them (:meth:`relulearn.storage.store.RunStore.read_head`
retries when it moved)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import numpy as np
import zarr
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import StorePath

from . import integrity
from .errors import Damage
from .generation import ArrayData
from .location import _open_store


async def _head_now(store: Store) -> str | None:
    raw = await store.get("zarr.json", default_buffer_prototype())
    try:
        return None if raw is None else json.loads(raw.to_bytes())["attributes"]["relulearn"]["head"]
    except (ValueError, KeyError, TypeError):
        return None


async def _read_generation(
    url: str, names: list[str], pinned: dict | None = None
) -> tuple[dict, dict[str, dict[str, ArrayData]], str | None, list[Damage]]:
    """One read of the arrays of ``names`` in the head generation (:meth:`~relulearn.storage.store.RunStore.read_head`):
    ``(meta, groups, head after the read, damages)``; ``meta`` is empty when the root document is damaged, ``groups``
    empty when a checked object is damaged (a generation deleted by a later commit while it was read, or damage).
    The root document is read once: its metadata of the groups read opens them. ``pinned``: the root document,
    parsed and checked, of the commit to read instead of the head now (:func:`~relulearn.storage.pinned.read_pinned`);
    the head after the read is then the pinned one whenever the arrays were decoded from bytes checked against its
    manifest."""
    store = _open_store(url, read_only=True)
    if pinned is not None:
        doc: dict | None = pinned
    else:
        raw = await store.get("zarr.json", default_buffer_prototype())
        try:
            doc = json.loads(raw.to_bytes()) if raw is not None else None
        except ValueError:
            doc = None
    damage = None if doc is None or pinned is not None else integrity.check_root(doc)
    if doc is None or damage is not None:  # (damaged since meta() read it: meta() says how)
        return {}, {}, "", [damage] if damage is not None else []
    meta = dict(doc["attributes"]["relulearn"])
    head = meta["head"]
    root = _root_group(store, doc, head, names)
    grps = dict(zip(names, await asyncio.gather(*(root.getitem(f"{head}/{n}") for n in names))))
    arrays: dict[str, list[Any]] = {}
    for n, g in grps.items():
        arrays[n] = [arr async for _, arr in cast("zarr.AsyncGroup", g).arrays()]  # a generation's groups
    infos = [
        integrity.ArrayInfo(arr.path.removeprefix(f"{head}/"), arr.metadata)
        for group in arrays.values()
        for arr in group
    ]
    manifest = meta.get("integrity")
    checked: dict[str, dict[str, bytes]] = {}
    (damages, _), doc_damages = await asyncio.gather(
        integrity.check_chunks(store, head, infos, manifest, keep=checked),
        integrity.check_documents(store, head, ["", *names, *(i.path for i in infos)], manifest),
    )
    if damages or doc_damages:
        return meta, {}, await _head_now(store), damages + doc_damages

    by_path = {info.path: info for info in infos}

    async def values_of(arr: Any) -> np.ndarray:
        # the bytes just checked are decoded (raw numbers): each chunk is read once
        info = by_path[arr.path.removeprefix(f"{head}/")]
        if info.decodable:
            return info.decode(checked.get(info.path, {}))
        return await arr.getitem(Ellipsis)

    async def group(name: str) -> dict[str, ArrayData]:
        values = await asyncio.gather(*(values_of(arr) for arr in arrays[name]))
        return dict(
            sorted(
                (arr.basename, (tuple(arr.metadata.dimension_names or ()), np.asarray(v)))
                for arr, v in zip(arrays[name], values)
            )
        )

    groups = dict(zip(names, await asyncio.gather(*(group(n) for n in names))))
    if manifest and all(info.decodable for info in infos) and _complete(manifest, names, infos):
        # every array was decoded from bytes checked against the commit's manifest, and the manifest names no
        # other array of these groups: this is the committed generation whether or not a later commit has moved
        # head since (a reader slower than the writer's commits still gets one)
        return meta, groups, head, []
    return meta, groups, await _head_now(store), []


def _root_group(store: Store, doc: dict, head: str, names: list[str]) -> zarr.AsyncGroup:
    """The root group of the document just read and checked, its consolidated metadata cut to the groups ``names``
    of ``head``: zarr builds an object for every array its metadata lists (~0.2 ms each), and a read of three
    groups of a store with five no longer builds the other two (nor reads the root a second time)."""
    data = dict(doc)
    consolidated = doc.get("consolidated_metadata")
    if isinstance(consolidated, dict) and isinstance(consolidated.get("metadata"), dict):
        wanted = {f"{head}/{n}" for n in names}
        inside = tuple(w + "/" for w in wanted)
        kept = {
            path: node
            for path, node in consolidated["metadata"].items()
            if path == head or path in wanted or path.startswith(inside)
        }
        data["consolidated_metadata"] = dict(consolidated, metadata=kept)
    return zarr.AsyncGroup.from_dict(StorePath(store), data)


def _complete(manifest: dict, names: list[str], infos: list[integrity.ArrayInfo]) -> bool:
    """Whether the arrays read are every array the commit's manifest lists in the groups ``names``."""
    listed = {path for path in manifest.get("chunks", {}) if path.split("/", 1)[0] in names}
    return listed == {info.path for info in infos}
