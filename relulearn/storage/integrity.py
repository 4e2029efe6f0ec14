"""Checksums of a store: a crc32c in every chunk, and a manifest of sha256 digests in every commit.

Every array a commit writes has the codecs ``bytes`` (little endian) then ``crc32c`` (zarr v3's core
checksum codec): each chunk object is the array's bytes followed by their CRC-32C, and zarr refuses a
chunk whose checksum does not match when it reads it. zarr reads a *missing* chunk as the fill value,
silently, so a checksum inside the chunk cannot catch a deleted one: the commit also records a manifest
in the root metadata (``attributes.relulearn.integrity``)::

    {"version": 1, "algorithm": "sha256",
     "chunks": {"basic/sum_xx": {"c.0.0": [2052, "<sha256 of the chunk object's bytes>"]}, ...},
     "documents": {"zarr.json": [180, "<sha256>"], "basic/zarr.json": [...], "basic/sum_xx/zarr.json": ...},
     "digest": "<sha256 of the root document without this field>"}

listing every chunk and metadata document of the generation (paths relative to it) with the digest of
the bytes written, and a digest of the root document itself (``digest``; the root is the document that
holds the manifest, the head and the consolidated metadata). Chunks are encoded here, so that the bytes
hashed are the bytes written: :func:`encode_chunks`.

A check (:func:`check_chunks`, :func:`check_documents`, :func:`check_root`) reads the objects' bytes and
reports each damaged one as a :class:`~relulearn.storage.errors.Damage`: missing, truncated, failing its
crc32c, or differing from the manifest. Stores written before checksums (no ``integrity`` in the root
metadata, chunks without crc32c) are checked for what can be: every chunk present and of its size, every
metadata document readable JSON.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import google_crc32c
import numpy as np
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype

from .errors import Damage

__all__ = [
    "ALGORITHM",
    "INTEGRITY_VERSION",
    "array_codecs",
    "chunk_coords",
    "chunk_key",
    "encode_chunks",
    "new_manifest",
    "add_chunk",
    "add_document",
    "digest",
    "root_digest",
    "seal_root",
    "check_root",
    "check_chunks",
    "check_documents",
    "check_sizes",
    "ArrayInfo",
]

#: the digest of chunks and documents in the manifest
ALGORITHM = "sha256"
#: version of the manifest's layout (``attributes.relulearn.integrity.version``)
INTEGRITY_VERSION = 1
_CRC = {"name": "crc32c"}


def digest(data: bytes) -> str:
    """The manifest's digest of ``data`` (hex sha256)."""
    return hashlib.sha256(data).hexdigest()


def _crc32c(payload: bytes) -> bytes:
    """The 4 bytes the crc32c codec appends: CRC-32C of ``payload``, little endian."""
    return np.array([google_crc32c.value(payload)], dtype="<u4").tobytes()


# ----------------------------------------------------------------------------- writing


def array_codecs(dtype: np.dtype) -> list[dict[str, Any]]:
    """The codecs of every array a commit writes: raw little-endian bytes, then their crc32c."""
    bytes_codec: dict[str, Any] = {"name": "bytes"}
    if dtype.itemsize > 1:
        bytes_codec["configuration"] = {"endian": "little"}
    return [bytes_codec, dict(_CRC)]


def chunk_coords(shape: Sequence[int], chunk_shape: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """The coordinates of every chunk of an array (one empty tuple for a 0-d array; none when empty)."""
    return itertools.product(*(range(math.ceil(s / c)) for s, c in zip(shape, chunk_shape)))


def chunk_key(coords: Sequence[int]) -> str:
    """The key of a chunk under zarr's default encoding with separator ".": ``c.0.1`` (``c`` for 0-d). An array's
    chunks are files of its own folder: with "/" every chunk adds two folders, and on a local disk making and
    deleting them was most of a commit's time (measured). Stores written with "/" read as before: readers take
    each array's encoding from its metadata."""
    return ".".join(["c", *map(str, coords)])


def encode_chunks(values: np.ndarray, chunk_shape: Sequence[int], fill: Any) -> Iterator[tuple[str, bytes]]:
    """``(chunk key, the chunk object's bytes)`` of every chunk of ``values`` as the codecs of
    :func:`array_codecs` encode it: the chunk's values in C order, little endian (an edge chunk padded with
    ``fill`` to the whole chunk shape, as zarr does), followed by their CRC-32C."""
    little = values.dtype.newbyteorder("<") if values.dtype.itemsize > 1 else values.dtype
    for coords in chunk_coords(values.shape, chunk_shape):
        region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, chunk_shape, values.shape))
        part = values[region]
        if part.shape != tuple(chunk_shape):
            padded = np.full(tuple(chunk_shape), fill, dtype=values.dtype)
            padded[tuple(slice(0, n) for n in part.shape)] = part
            part = padded
        payload = np.ascontiguousarray(part, dtype=little).tobytes()
        yield chunk_key(coords), payload + _crc32c(payload)


def new_manifest() -> dict[str, Any]:
    """An empty manifest (filled by :func:`add_chunk` and :func:`add_document`, sealed by :func:`seal_root`)."""
    return {"version": INTEGRITY_VERSION, "algorithm": ALGORITHM, "chunks": {}, "documents": {}}


def add_chunk(manifest: dict[str, Any], array: str, key: str, data: bytes) -> None:
    """Record chunk ``key`` of ``array`` (path relative to the generation) as written: its size and digest."""
    manifest["chunks"].setdefault(array, {})[key] = [len(data), digest(data)]


def add_document(manifest: dict[str, Any], path: str, data: bytes) -> None:
    """Record the metadata document at ``path`` (relative to the generation, ``basic/zarr.json``) as written:
    its size and digest."""
    manifest["documents"][path] = [len(data), digest(data)]


# --------------------------------------------------------------------------- the root


def root_digest(doc: Mapping[str, Any]) -> str:
    """The digest of a root document, without ``attributes.relulearn.integrity.digest`` itself: of its
    canonical JSON (sorted keys, no spaces), so that the parsed document gives the digest written. The document
    goes through one JSON round trip first (its keys, tuples and numbers as a reader parses them)."""
    return _parsed_digest(json.loads(json.dumps(doc, allow_nan=True)))


def _parsed_digest(doc: Mapping[str, Any]) -> str:
    """:func:`root_digest` of a document parsed from JSON, which needs no round trip: only the three mappings on
    the way to the digest are copied, to leave it out."""
    relulearn = doc["attributes"]["relulearn"]
    integrity = {k: v for k, v in relulearn["integrity"].items() if k != "digest"}
    view = dict(doc, attributes=dict(doc["attributes"], relulearn=dict(relulearn, integrity=integrity)))
    return digest(json.dumps(view, sort_keys=True, separators=(",", ":"), allow_nan=True).encode())


def seal_root(doc: dict[str, Any]) -> None:
    """Set the root document's own digest (its manifest must be in place)."""
    doc["attributes"]["relulearn"]["integrity"]["digest"] = root_digest(doc)


def check_root(doc: Mapping[str, Any]) -> Damage | None:
    """The root document's damage, or None when it matches its digest (or predates checksums); ``doc`` as parsed
    from the store's JSON."""
    integrity = doc.get("attributes", {}).get("relulearn", {}).get("integrity")
    if integrity is None:
        return None
    if (
        not isinstance(integrity, dict)
        or not isinstance(integrity.get("chunks"), dict)
        or not isinstance(integrity.get("documents"), dict)
    ):
        return Damage("root", "zarr.json", "", "has an unreadable manifest")
    if integrity.get("digest") != _parsed_digest(doc):
        return Damage("root", "zarr.json", "", f"does not match its {ALGORITHM} digest")
    return None


# --------------------------------------------------------------------------- checking


class ArrayInfo:
    """What a check needs of one stored array: its path relative to the generation, its shape and chunk
    shape, the size of one chunk's values in bytes, whether its chunks end with a crc32c, and whether
    its chunk sizes can be known without a manifest (raw bytes, no compression)."""

    def __init__(self, path: str, metadata: Any):
        self.path = path
        self.metadata = metadata
        self.shape = tuple(metadata.shape)
        self.chunk_shape = tuple(metadata.chunk_grid.chunk_shape)
        names = [type(c).__name__ for c in metadata.codecs]
        self.crc = "Crc32cCodec" in names
        self.raw = set(names) <= {"BytesCodec", "Crc32cCodec"}
        self.dtype = metadata.dtype.to_native_dtype()
        self.payload = int(np.prod(self.chunk_shape, dtype=np.int64)) * self.dtype.itemsize
        endians = {getattr(getattr(c, "endian", None), "value", None) for c in metadata.codecs}
        #: chunk objects :meth:`decode` can read: raw little-endian numbers (and their crc32c), as commits write
        self.decodable = self.raw and self.dtype.kind in "biuf" and endians <= {"little", None}

    def keys(self) -> list[str]:
        return [self.metadata.encode_chunk_key(c) for c in chunk_coords(self.shape, self.chunk_shape)]

    def decode(self, chunks: Mapping[str, bytes]) -> np.ndarray:
        """The array from its chunk objects (``{key: bytes}``, every key of :meth:`keys`, already checked), for a
        :attr:`decodable` array: the inverse of :func:`encode_chunks`. A reader that has checked the bytes
        decodes them instead of reading every chunk a second time through zarr."""
        little = self.dtype.newbyteorder("<") if self.dtype.itemsize > 1 else self.dtype
        out = np.empty(self.shape, dtype=self.dtype)
        for coords in chunk_coords(self.shape, self.chunk_shape):
            data = chunks[self.metadata.encode_chunk_key(coords)]
            part = np.frombuffer(data[:-4] if self.crc else data, dtype=little).reshape(self.chunk_shape)
            region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, self.chunk_shape, self.shape))
            out[region] = part[tuple(slice(0, r.stop - r.start) for r in region)]
        return out


def _chunk_problem(data: bytes | None, info: ArrayInfo, entry: Sequence[Any] | None) -> str | None:
    if data is None:
        return "is missing"
    size = int(entry[0]) if entry is not None else (info.payload + 4 * info.crc if info.raw else None)
    if size is not None and len(data) < size:
        return f"is truncated ({len(data)} of {size} bytes)"
    if size is not None and len(data) > size:
        return f"has {len(data)} bytes where {size} were written"
    if info.crc and (len(data) < 4 or _crc32c(data[:-4]) != data[-4:]):
        return "fails its crc32c checksum"
    if entry is not None and digest(data) != entry[1]:
        return f"does not match its {ALGORITHM} in the commit's manifest"
    return None


async def _get(store: Store, key: str) -> bytes | None:
    buf = await store.get(key, default_buffer_prototype())
    return None if buf is None else buf.to_bytes()


async def check_chunks(
    store: Store,
    generation: str,
    arrays: Sequence[ArrayInfo],
    manifest: Mapping[str, Any] | None,
    keep: dict[str, dict[str, bytes]] | None = None,
) -> tuple[list[Damage], dict[str, int]]:
    """Read every chunk of ``arrays`` (of ``generation``) and compare it with the manifest (or, for a store
    written before checksums, with what its metadata implies). ``keep``, when given, receives the bytes read,
    ``{array path: {key: bytes}}`` (for :meth:`ArrayInfo.decode`).

    Returns
    -------
    damages, checked
        Every damaged chunk, and the number of chunks checked per array.
    """
    listed = None if manifest is None else manifest.get("chunks", {})
    jobs: list[tuple[ArrayInfo, str, Sequence[Any] | None]] = []
    damages: list[Damage] = []
    for info in arrays:
        entries = None if listed is None else listed.get(info.path)
        if listed is not None and entries is None:
            damages.append(
                Damage(info.path, f"{generation}/{info.path}/zarr.json", "", "is not in the commit's manifest")
            )
            continue
        for key in info.keys():
            jobs.append((info, key, None if entries is None else entries.get(key)))
    found = await asyncio.gather(*(_get(store, f"{generation}/{info.path}/{key}") for info, key, _ in jobs))
    checked: dict[str, int] = {info.path: 0 for info in arrays}
    for (info, key, entry), data in zip(jobs, found):
        checked[info.path] += 1
        if listed is not None and entry is None:
            problem: str | None = "is not in the commit's manifest"
        else:
            problem = _chunk_problem(data, info, entry)
        if problem is not None:
            damages.append(Damage(info.path, f"{generation}/{info.path}/{key}", key, problem))
        elif keep is not None:
            assert data is not None  # no problem found: _chunk_problem reports a missing chunk
            keep.setdefault(info.path, {})[key] = data
    return damages, checked


async def check_documents(
    store: Store, generation: str, paths: Sequence[str], manifest: Mapping[str, Any] | None
) -> list[Damage]:
    """Read the metadata documents of ``paths`` (groups and arrays of ``generation``, relative to it; ``""``
    is the generation's own group) and compare each with the manifest (without one: readable JSON)."""
    docs = [f"{p}/zarr.json" if p else "zarr.json" for p in paths]
    found = await asyncio.gather(*(_get(store, f"{generation}/{d}") for d in docs))
    listed = None if manifest is None else manifest.get("documents", {})
    damages = []
    for path, doc, data in zip(paths, docs, found):
        owner = path or generation
        key = f"{generation}/{doc}"
        if data is None:
            damages.append(Damage(owner, key, "", "is missing"))
        elif listed is not None:
            if doc not in listed:
                damages.append(Damage(owner, key, "", "is not in the commit's manifest"))
            elif len(data) != listed[doc][0]:
                size = listed[doc][0]
                damages.append(
                    Damage(
                        owner,
                        key,
                        "",
                        f"is truncated ({len(data)} of {size} bytes)"
                        if len(data) < size
                        else f"has {len(data)} bytes where {size} were written",
                    )
                )
            elif digest(data) != listed[doc][1]:
                damages.append(Damage(owner, key, "", f"does not match its {ALGORITHM} in the commit's manifest"))
        else:
            try:
                if not isinstance(json.loads(data), dict):
                    raise ValueError("not a JSON object")
            except ValueError:
                damages.append(Damage(owner, key, "", "is not readable JSON"))
    return damages


def check_sizes(generation: str, listing: Mapping[str, int], manifest: Mapping[str, Any]) -> list[Damage]:
    """The objects of ``generation`` in the manifest that a listing (``{key relative to the generation: size}``)
    shows missing, or of another size than written: what can be told without reading a byte (a flipped byte
    cannot; :func:`check_chunks` reads them)."""
    damages = []
    for array, chunks in manifest.get("chunks", {}).items():
        for key, (size, _) in chunks.items():
            found = listing.get(f"{array}/{key}")
            if found == size:
                continue
            if found is None:
                problem = "is missing"
            elif found < size:
                problem = f"is truncated ({found} of {size} bytes)"
            else:
                problem = f"has {found} bytes where {size} were written"
            damages.append(Damage(array, f"{generation}/{array}/{key}", key, problem))
    for doc, (size, _) in manifest.get("documents", {}).items():
        found = listing.get(doc)
        if found != size:
            owner = doc.rsplit("/", 1)[0] if "/" in doc else generation
            problem = "is missing" if found is None else f"has {found} bytes where {size} were written"
            damages.append(Damage(owner, f"{generation}/{doc}", "", problem))
    return damages
