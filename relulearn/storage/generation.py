"""Writing a generation: its zarr v3 metadata documents built here, every chunk encoded and written whole, and
the manifest of what was written (:mod:`relulearn.storage.integrity`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore

from . import integrity
from .location import _open_store

__all__ = ["ArrayData", "coordinate_names"]

#: (dimension names, values)
ArrayData = tuple[tuple[str, ...], np.ndarray]


def coordinate_names(arrays: Mapping[str, Any]) -> list[str]:
    """The arrays of a statistic's group that describe the statistic rather than estimate it.

    A statistic's group holds ``count``, the accumulated ``sum_*`` and ``sumsq_*``, the
    estimands (an array ``X`` next to its standard error ``X_se``), and the arrays that
    describe it (τ grid, quantiles, direction bank, basis, candidates, Hermite index tables):
    those last are its coordinates. Groups without ``count`` (the ledger) have none.
    """
    if "count" not in arrays:
        return []
    estimands = {k[: -len("_se")] for k in arrays if k.endswith("_se") and k[: -len("_se")] in arrays}
    return [
        k
        for k in arrays
        if k != "count"
        and not k.startswith(("sum_", "sumsq_"))
        and k not in estimands
        and not (k.endswith("_se") and k[: -len("_se")] in estimands)
    ]


#: arrays up to this many bytes are one chunk; larger stacks of matrices are chunked per matrix
_WHOLE_CHUNK_BYTES = 64 * 2**20


def _chunks(values: np.ndarray) -> tuple[int, ...]:
    shape = tuple(max(s, 1) for s in values.shape)
    if values.nbytes > _WHOLE_CHUNK_BYTES and len(shape) == 3:
        return (1,) + shape[1:]
    return shape


# ----------------------------------------------------------------- zarr metadata documents
# A generation's metadata is written as plain zarr v3 JSON documents built here (no zarr
# existence checks or read-modify-write of parents: on an object store every such check is a
# request), and the same documents make up the consolidated metadata of the root.

_CONSOLIDATED_EMPTY = {"kind": "inline", "must_understand": False, "metadata": {}}


def _group_doc(attributes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes or {})}


def _array_doc(dims: tuple[str, ...], values: np.ndarray) -> dict[str, Any]:
    dt = values.dtype
    if dt.kind == "b":
        fill: Any = False
    elif dt.kind in "iu":
        fill = 0
    elif dt.kind == "f":
        fill = 0.0
    else:
        raise TypeError(f"cannot store arrays of dtype {dt} (numbers and booleans only)")
    doc: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(values.shape),
        "data_type": dt.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(_chunks(values))}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
        "fill_value": fill,
        # raw bytes and their crc32c: float64 statistics do not compress (a compressor doubles the time)
        "codecs": integrity.array_codecs(dt),
        "attributes": {},
        "storage_transformers": [],
    }
    if values.ndim:
        doc["dimension_names"] = list(dims)
    return doc


def _consolidated(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """zarr-python's inline consolidated metadata of ``nodes`` ({path: document})."""
    flat = {}
    for path, doc in nodes.items():
        flat[path] = dict(doc, consolidated_metadata=_CONSOLIDATED_EMPTY) if doc["node_type"] == "group" else doc
    return {"kind": "inline", "must_understand": False, "metadata": flat}


def _json_bytes(doc: Mapping[str, Any], indent: int | None = 1) -> bytes:
    """A metadata document's bytes: indented (the nodes' small documents, for people reading a store's files), or
    on one line (``indent=None``: the root document, whose consolidated metadata of every node is most of a
    commit's JSON; Python's C encoder writes only unindented JSON, several times faster)."""
    return json.dumps(doc, indent=indent, allow_nan=True).encode()


def _json_buffer(doc: Mapping[str, Any], indent: int | None = 1):
    return default_buffer_prototype().buffer.from_bytes(_json_bytes(doc, indent))


async def _write_generation(
    store: Store | str, gen_name: str, groups: Mapping[str, Mapping[str, ArrayData]]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Write every group, array and chunk of a generation concurrently; return the metadata documents
    written, ``{path: document}`` (paths relative to the store's root), and the generation's manifest
    (:mod:`~relulearn.storage.integrity`: the size and digest of every object written).

    Nothing is read: the documents are built here, and each chunk is encoded here and written whole
    (chunks equal to the fill value too, so that a generation is always the same set of objects). The
    generation's own group document is written last: a generation without it was never complete.
    """
    if isinstance(store, str):
        store = _open_store(store, read_only=False)
    nodes: dict[str, dict[str, Any]] = {gen_name: _group_doc()}
    objects: dict[str, bytes] = {}
    manifest = integrity.new_manifest()
    for gname, arrays in groups.items():
        coords = coordinate_names(arrays)
        nodes[f"{gen_name}/{gname}"] = _group_doc({"coordinates": " ".join(coords)} if coords else None)
        for name, (dims, values) in arrays.items():
            values = np.asarray(values, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
            path = f"{gen_name}/{gname}/{name}"
            doc = nodes[path] = _array_doc(tuple(dims), values)
            chunk_shape = doc["chunk_grid"]["configuration"]["chunk_shape"]
            for key, data in integrity.encode_chunks(values, chunk_shape, doc["fill_value"]):
                objects[f"{path}/{key}"] = data
                integrity.add_chunk(manifest, f"{gname}/{name}", key, data)
    for path, doc in nodes.items():
        data = _json_bytes(doc)
        objects[f"{path}/zarr.json"] = data
        integrity.add_document(manifest, f"{path}/zarr.json".removeprefix(f"{gen_name}/"), data)
    last = f"{gen_name}/zarr.json"
    prototype = default_buffer_prototype()
    if isinstance(store, LocalStore):
        await asyncio.to_thread(_write_files, store.root, {k: v for k, v in objects.items() if k != last})
    else:
        await asyncio.gather(
            *(store.set(key, prototype.buffer.from_bytes(data)) for key, data in objects.items() if key != last)
        )
    await store.set(last, prototype.buffer.from_bytes(objects[last]))  # atomically (a temporary file renamed)
    return nodes, manifest


def _write_files(root: Path, objects: Mapping[str, bytes]) -> None:
    """Write the objects of a generation into a local folder: each folder made once, each file written in place.

    zarr's LocalStore makes the folders of every object it writes and writes each to a temporary file that it
    renames (a quarter of a commit's CPU time, measured). Neither is needed inside a generation, which nothing
    reads before the root document names it (a crash leaves an orphan generation, removed by the next commit);
    the generation's own group document is still written last, atomically."""
    for folder in {(root / key).parent for key in objects}:
        folder.mkdir(parents=True, exist_ok=True)
    for key, data in objects.items():
        with open(root / key, "wb") as f:
            f.write(data)
