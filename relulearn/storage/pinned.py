"""Reading one commit of a store, however many commits follow: a reader's handle pins the root document it opened.

A commit writes a new generation, switches ``head`` in the root document and then deletes the generations before
the one it replaced (:mod:`~relulearn.storage.store`). A reader that read the root once and follows ``head`` again
later would mix two commits (``samples`` of one, arrays of the next); a lazy xarray dataset whose chunks are read
after their generation was deleted would read zarr's fill value, zeros. A :class:`Pin` is the root document as one
read found it: every later read of the handle takes the generation it names, checked against the manifest it holds
(:func:`read_pinned`), and xarray reads through a :class:`PinnedStore`, which serves that root document and checks
every object of the generation the manifest lists. A read that finds the pinned generation gone or changed raises
:class:`~relulearn.storage.errors.StoreMovedError` when the root document changed since (a later commit deleted
it), :class:`~relulearn.storage.errors.StoreDamagedError` when it did not (the store is damaged).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import WrapperStore

from . import integrity
from .errors import Damage, StoreDamagedError, StoreMovedError
from .generation import ArrayData
from .location import _object_store_errors, _open_store
from .reading import _read_generation

__all__ = ["Pin", "PinnedStore", "read_pinned", "refusal"]


@dataclass(frozen=True)
class Pin:
    """The root document of a store as one read found it: the run's metadata (``meta``, with ``head`` and the
    commit's manifest ``integrity``), the document parsed (``doc``: the consolidated metadata of ``head``) and its
    bytes (``raw``: served to zarr as the store's root, compared with the root now to tell a store that moved on
    from a damaged one)."""

    url: str
    meta: dict = field(repr=False)
    doc: dict = field(repr=False)
    raw: bytes = field(repr=False)

    @property
    def head(self) -> str:
        return str(self.meta["head"])

    @property
    def commit(self) -> tuple[str, int]:
        return self.head, int(self.meta.get("samples", 0))


async def _root_now(store: Store) -> bytes | None:
    buf = await store.get("zarr.json", default_buffer_prototype())
    return None if buf is None else buf.to_bytes()


def _commit_of(raw: bytes | None) -> tuple[str, int] | None:
    try:
        meta = json.loads(raw or b"")["attributes"]["relulearn"]
        return str(meta["head"]), int(meta.get("samples", 0))
    except (ValueError, KeyError, TypeError):
        return None


async def refusal(pin: Pin, store: Store, damages: list[Damage]) -> StoreMovedError | StoreDamagedError | None:
    """What a read of ``pin`` that found ``damages`` (objects of its generation missing or changed) raises: the
    store moved on when its root document is no longer the pinned one (a later commit deleted the generation),
    else it is damaged; None when there is no damage and the root is the pinned one."""
    now = await _root_now(store)
    if now != pin.raw:
        return StoreMovedError(pin.url, pin.commit, _commit_of(now))
    return StoreDamagedError(pin.url, damages) if damages else None


def read_pinned(pin: Pin, names: list[str]) -> tuple[dict, dict[str, dict[str, ArrayData]]]:
    """The metadata and the arrays of ``names`` (statistics or ``ledger``) of the pinned commit, each chunk and
    document checked against its manifest (:func:`~relulearn.storage.reading._read_generation` on the pinned root
    document: the same read as :meth:`~relulearn.storage.store.RunStore.read_head`, without following ``head``).

    Raises
    ------
    StoreMovedError
        When the pinned generation was deleted or changed under the read by later commits.
    StoreDamagedError
        When an object of the generation is missing or differs from the manifest while the store is still at the
        pinned commit.
    """

    async def read() -> tuple[dict, dict[str, dict[str, ArrayData]]]:
        meta, groups, after, damages = await _read_generation(pin.url, names, pin.doc)
        if damages or after != pin.head:
            # damage, or a store without a manifest (arrays zarr decodes) whose head moved: the generation may have
            # been deleted under the read, which zarr reads as zeros
            err = await refusal(pin, _open_store(pin.url, read_only=True), damages)
            if err is not None:
                raise err
        return meta, groups

    with _object_store_errors(pin.url, "read"):
        return sync(read())


class PinnedStore(WrapperStore[Store]):
    """A read-only view of a store at the pinned commit, for zarr and xarray: ``zarr.json`` is the pinned root
    document (its consolidated metadata describes the pinned generation), and every object of the pinned
    generation that the commit's manifest lists is checked as it is read — missing, of another size or another
    sha256, it raises :class:`~relulearn.storage.errors.StoreMovedError` (a later commit deleted it) or
    :class:`~relulearn.storage.errors.StoreDamagedError`, never zarr's fill value. Objects the manifest does not
    list pass through (zarr may ask for keys that need not exist). A store written before checksums has no
    manifest: a missing object of the generation is refused only when the store has moved on."""

    def __init__(self, store: Store, pin: Pin | None = None) -> None:
        super().__init__(store)
        if pin is None:  # (zarr rebuilds a wrapper from its store alone: _with_store)
            raise TypeError("a PinnedStore needs the pin it serves")
        self.pin = pin
        manifest = pin.meta.get("integrity") or {}
        self._prefix = pin.head + "/"
        self._listed: dict[str, list[Any]] | None = None
        if manifest:
            listed = {path: entry for path, entry in manifest.get("documents", {}).items()}
            for array, chunks in manifest.get("chunks", {}).items():
                listed.update({f"{array}/{key}": entry for key, entry in chunks.items()})
            self._listed = listed

    def _with_store(self, store: Store) -> PinnedStore:
        return type(self)(store, self.pin)

    def __eq__(self, value: object) -> bool:
        return isinstance(value, PinnedStore) and value.pin == self.pin and self._store == value._store

    def __hash__(self) -> int:
        return hash((self.pin.url, self.pin.raw))

    def __repr__(self) -> str:
        return f"PinnedStore({self.pin.url!r}, {self.pin.head})"

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        if key == "zarr.json":
            return prototype.buffer.from_bytes(_ranged(self.pin.raw, byte_range))
        got = await self._store.get(key, prototype, None if self._checks(key) else byte_range)
        if not key.startswith(self._prefix):
            return got
        path = key[len(self._prefix) :]
        entry = None if self._listed is None else self._listed.get(path)
        if self._listed is not None and entry is None:
            return got  # not an object of the commit: may legitimately be absent
        problem = _problem(None if got is None else got.to_bytes(), entry)
        if problem is not None:
            array, _, chunk = path.rpartition("/")
            damage = Damage(array, key, "" if chunk == "zarr.json" else chunk, problem)
            err = await refusal(self.pin, self._store, [damage] if entry is not None else [])
            if err is not None:
                raise err
        if got is None or byte_range is None:
            return got
        return prototype.buffer.from_bytes(_ranged(got.to_bytes(), byte_range))

    def _checks(self, key: str) -> bool:
        """Whether ``key`` is read whole to be checked against the manifest."""
        return self._listed is not None and key.startswith(self._prefix) and key[len(self._prefix) :] in self._listed

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def exists(self, key: str) -> bool:
        return key == "zarr.json" or await self._store.exists(key)

    async def _get_many(
        self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
    ) -> AsyncGenerator[tuple[str, Buffer | None], None]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)


def _problem(data: bytes | None, entry: list[Any] | None) -> str | None:
    """What is wrong with an object read against its manifest entry ``[size, sha256]`` (None: no manifest, only
    presence is known)."""
    if data is None:
        return "is missing"
    if entry is None:
        return None
    if len(data) != int(entry[0]):
        return f"has {len(data)} bytes where {entry[0]} were written"
    if integrity.digest(data) != entry[1]:
        return f"does not match its {integrity.ALGORITHM} in the commit's manifest"
    return None


def _ranged(data: bytes, byte_range: ByteRequest | None) -> bytes:
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return data[-byte_range.suffix :] if byte_range.suffix else b""
    raise TypeError(f"unexpected byte range {byte_range!r}")
