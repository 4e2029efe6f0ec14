"""The run store: one zarr v3 group per run, committed atomically (docs/design.md §4).

Layout::

    STORE/zarr.json          root group; attrs["relulearn"] = the run's metadata, with ``head`` and the
                             manifest of the head generation (``integrity``: the size and sha256 of each
                             of its objects, and the digest of this document); consolidated metadata of
                             the head generation (below)
    STORE/g000007/<stat>/    the committed generation: one subgroup per statistic,
                             arrays with dimension names (xarray.open_zarr(..., group=...))
    STORE/g000007/ledger/    the blocks counted in this generation
    STORE/passes/<name>-<digest>/   extra passes of a learning method, each a store of its own (the only
                             stores allowed inside a store: :mod:`~relulearn.storage.nesting`)
    STORE/records/<kind>-<time>.json   what a learn or a curve's point found (:meth:`RunStore.add_record`)

The location is a local directory or any fsspec URL zarr accepts (``s3://bucket/path``
through s3fs; credentials and endpoint come from the usual AWS variables, e.g.
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``).

Atomic commits
--------------
A commit (1) writes a complete new generation group ``gNNNNNN/`` — every group and array
metadata document and every chunk — next to the committed one, (2) switches ``head`` by
rewriting the root ``zarr.json``, a single key, and only then (3) deletes the generations
before the one it replaced. Readers start at the root ``zarr.json`` and follow ``head``, so
they see the old generation until the instant of step (2) and the complete new one after it.
The generation a commit replaces stays until the next commit, so that a reader that started
on it has the time of a whole commit to finish its read; the writer removes it when it is done,
also after a failure or an interruption (:meth:`RunStore.clean`), so a store at rest holds one
generation (a writer killed outright leaves it to the next writer, like any orphan).

Step (2) is atomic on every store we use. On a local disk zarr writes a temporary file and
renames it over ``zarr.json`` (rename is atomic within a directory). On S3 every object PUT
is atomic — a reader gets the whole old object or the whole new one, never a mix — and S3
has been strongly read-after-write consistent since December 2020 (also for overwrites and
listings), so once the PUT of ``zarr.json`` returns every reader sees the new ``head``, and
every object of the generation it names, all PUT before it, is visible too. Nothing is
renamed on S3 (it cannot rename atomically): generations are written under fresh names and
only the one-object switch makes them current. A crash (SIGKILL, lost connection) at any
instant therefore leaves the last committed state readable; an unfinished generation, or an
old one not yet deleted, is an orphan no reader follows, removed by the next writer (a later
commit, or ``clean()`` when a run resumes). Only one writer (the driver) may commit to a
store at a time: it holds the store's lease (``lease.json``, :mod:`relulearn.storage.lease`).
:meth:`RunStore.read_head` checks every chunk it reads against the commit's manifest, and reads
anew when one went missing under it (a read slower than two commits, or than the writer's last
commit and its cleanup), which zarr alone would read as zeros.
A reader's handle (:class:`~relulearn.storage.views.StoredRun`, ``open_store``) pins the root document it
opened (:mod:`~relulearn.storage.pinned`): its reads, lazy xarray views included, are of that commit, checked
against its manifest, and one that finds the generation deleted by later commits raises
:class:`~relulearn.storage.errors.StoreMovedError` rather than read zeros or another commit.

Consolidated metadata
---------------------
The root ``zarr.json`` also holds the metadata of every group and array of the head
generation (zarr's "consolidated metadata"), written in the same single PUT as ``head``, so
the consolidated view always describes exactly the committed generation. Opening a
statistic — ``xr.open_zarr(url, group=f"{head}/{statistic}")`` — reads that one document
and no other metadata. Arrays that describe a statistic rather than estimate it (τ grids,
quantiles, direction banks, bases, ...) are listed in the statistic group's
``coordinates`` attribute, which xarray turns into coordinates
(:func:`~relulearn.storage.generation.coordinate_names`).

Checksums
---------
Every array's chunks end with their crc32c (zarr's ``crc32c`` codec), and each commit's manifest lists every
object of its generation (:mod:`relulearn.storage.integrity`). :meth:`RunStore.meta` checks the root document
against its digest; :meth:`RunStore.read_head` checks every chunk and document it reads against the manifest
before any value is used, and raises :class:`~relulearn.storage.errors.StoreDamagedError` naming each damaged
object (zarr alone reads a deleted chunk as the fill value). A folder whose root document is missing or
unreadable while it holds relulearn data that only a commit leaves is damaged, not empty (:meth:`RunStore.meta`);
``--new-store-here`` moves that data into ``set-aside-<time>/`` (:meth:`RunStore.set_aside`).

Stores hold arrays and JSON only.

Its parts: :mod:`~relulearn.storage.location` (opening a path or URL, errors of object stores),
:mod:`~relulearn.storage.folder` (what the folder holds; the root document refused),
:mod:`~relulearn.storage.generation` (writing a generation), :mod:`~relulearn.storage.reading` (reading one),
:mod:`~relulearn.storage.pinned` (a reader's reads of the commit it opened) and :mod:`~relulearn.storage.nesting` (no
store inside another).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import zarr
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from . import integrity
from .errors import Damage, NotAStoreError, StoreDamagedError, StoreError
from .folder import (
    _COMMITTED_ONLY,
    _GENERATION,
    _LEFTOVER,
    _PARTIAL,
    _PROBE,
    SET_ASIDE,
    _committed_data,
    _damaged_root_hint,
    _refuse_root,
    _root_doc,
    _tolerated,
)
from .generation import ArrayData, _consolidated, _group_doc, _json_buffer, _write_generation, coordinate_names
from .location import (
    _children,
    _invalidate_listings,
    _is_local,
    _local_path,
    _object_store_errors,
    _open_store,
    disk_full_named,
    storage_options,
)
from .nesting import check_not_inside_a_store
from .pinned import Pin
from .reading import _read_generation

log = logging.getLogger(__name__)

__all__ = [
    "FORMAT_VERSION",
    "StoreError",
    "NotAStoreError",
    "StoreDamagedError",
    "RunStore",
    "ArrayData",
    "coordinate_names",
    "diff_fields",
    "flatten",
    "storage_options",
]

#: version of the on-disk layout and of the definition of chunk bytes; bump on change.
#: 2: samples drawn with SFC64 (was Philox), and sketch stores hold ``t0_second``, ``t1_second``.
#: (Checksums — the crc32c codec of every array, the manifest of a commit — did not change it: zarr's
#: metadata names each array's codecs, so stores with and without them read alike, and a commit to a
#: store written before them adds them; see :mod:`relulearn.storage.integrity`.)
FORMAT_VERSION = 2


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}`` (lists are kept as values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def diff_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Dotted names of the fields where two (nested) fingerprints differ."""
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k, "<absent>") != fb.get(k, "<absent>"))


#: the UTC time in a record's name (:meth:`RunStore.add_record`)
_RECORD_STAMP = r"\d{8}T\d{6}\.\d{6}Z"


#: the fields records share and what each must hold where present (readers use them without checking again)
_RECORD_FIELDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "method": ("a string", (str,)),
    "kind": ("a string", (str,)),
    "recorded": ("a string", (str,)),
    "samples": ("a whole number", (int,)),
    "seconds": ("a number", (int, float)),
    "validation_relative_loss": ("a number or null", (int, float, type(None))),
    "report": ("a JSON object", (dict,)),
    "network": ("a JSON object", (dict,)),
    "key": ("a JSON object", (dict,)),
}


def _parse_record(raw: bytes) -> tuple[dict | None, str]:
    """A record's document, or None and what is wrong with it."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"not readable JSON ({err})"
    if not isinstance(doc, dict):
        return None, f"not a JSON object (it holds a {type(doc).__name__.replace('dict', 'object')})"
    for name, (what, types) in _RECORD_FIELDS.items():
        value = doc.get(name)
        if name in doc and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            return None, f"its field {name!r} is not {what} ({json.dumps(value)[:40]})"
    return doc, ""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunStore:
    """A run's zarr store at ``url`` (a local path or any fsspec URL zarr accepts).

    ``allow_foreign``: a folder holding other files (not relulearn data) reads as an empty store rather
    than being refused (``--new-store-here``); the files are left as they are.
    """

    url: str
    allow_foreign: bool = False

    # ------------------------------------------------------------------ opening
    def _root(self, mode: Literal["r", "r+", "a", "w", "w-"]) -> zarr.Group:
        return zarr.open_group(self._store(read_only=mode == "r"), mode=mode, zarr_format=3)

    def _store(self, *, read_only: bool) -> Store:
        return _open_store(self.url, read_only=read_only)

    def meta(self) -> dict | None:
        """The committed metadata, or None for a store that holds no run yet (:meth:`pin`, its metadata)."""
        pin = self.pin()
        return None if pin is None else dict(pin.meta)

    def pin(self) -> Pin | None:
        """The committed root document, read once, or None for a store that holds no run yet: the metadata, the
        manifest and the consolidated metadata of one commit, which a reader's reads then take
        (:mod:`~relulearn.storage.pinned`) rather than whatever ``head`` is at each read.

        The root document is checked against its own digest (:mod:`~relulearn.storage.integrity`; stores
        written before checksums have none). A folder without a root document holds no run yet when it is
        empty or holds only what a first run leaves before its first commit completes (an unfinished first
        generation, a writer's lease); any other relulearn data there means the root was lost.

        Raises
        ------
        StoreDamagedError
            When the root metadata is missing, unreadable or differs from its digest while the store holds
            relulearn data (generations, records, passes): the store is damaged; nothing is written.
        NotAStoreError
            When the path holds something that is not a relulearn store (files, another zarr group);
            files are allowed when the store was opened with ``allow_foreign``.
        StoreError
            For a store of a newer or older format version than this code reads, or (object stores) when
            the store cannot be reached: no credentials, endpoint unreachable, access denied.
        """
        if _is_local(self.url):
            p = _local_path(self.url)
            if not p.exists():
                return None
            if p.is_file():
                raise StoreError(f"{self.url} is a file, not a store directory; choose another --store path")
        with _object_store_errors(self.url, "read"):
            store = self._store(read_only=True)
            found = _root_doc(self.url, store, self.allow_foreign)
            if found is None:
                return None
            doc, raw = found
            attrs = doc.get("attributes") or {}
            meta = attrs.get("relulearn")
            if meta is None and not attrs and all(_tolerated(c) for c in sync(_children(store)) if c != "zarr.json"):
                return None  # (stores of older versions wrote an empty root before their first generation)
            if not isinstance(meta, dict):
                _refuse_root(
                    self.url,
                    store,
                    "has no relulearn metadata",
                    f"{self.url} is a zarr group but not a relulearn store (no 'relulearn' attribute)",
                )
        try:
            version = int(meta.get("format_version", -1))
        except (TypeError, ValueError):
            raise StoreDamagedError(
                self.url,
                [
                    Damage(
                        "root",
                        "zarr.json",
                        "",
                        f"has an unreadable store format version {meta.get('format_version')!r}",
                    )
                ],
                root=True,
            ) from None
        if version > FORMAT_VERSION:
            raise StoreError(
                f"{self.url} was written by a newer relulearn (store format {version}; this version reads "
                f"format {FORMAT_VERSION}); upgrade relulearn to use it. The store was not modified."
            )
        if version < FORMAT_VERSION:
            raise StoreError(
                f"{self.url} has store format {version}, older than this relulearn's format {FORMAT_VERSION}; "
                "re-run the estimation into a new store"
            )
        damage = integrity.check_root(doc)
        if damage is None and not isinstance(meta.get("head"), str):
            damage = Damage("root", "zarr.json", "", "names no head generation")
        if damage is not None:
            raise StoreDamagedError(self.url, [damage], root=True, hint=_damaged_root_hint(self.url))
        return Pin(self.url, dict(meta), doc, raw)

    def check_writable(self) -> None:
        """Fail early, before any computation, when the store location cannot be written.

        Local paths are checked with the file system's permissions; on an object store a
        small probe object is written under the store's prefix and deleted again.
        """
        if not _is_local(self.url):
            with _object_store_errors(self.url, "write"):
                store = self._store(read_only=False)
                sync(store.set(_PROBE, default_buffer_prototype().buffer.from_bytes(b"")))
                sync(store.delete(_PROBE))
            return
        p = _local_path(self.url)
        probe_dir = p if p.exists() else p.parent
        while not probe_dir.exists() and probe_dir != probe_dir.parent:
            probe_dir = probe_dir.parent
        if not probe_dir.is_dir():  # e.g. --store notes.txt/run.zarr (permission bits do not stop root)
            raise StoreError(
                f"cannot write the store at {self.url}: {probe_dir} is a file, not a directory; "
                "choose a writable --store path"
            )
        if not os.access(probe_dir, os.W_OK | os.X_OK):
            raise StoreError(
                f"cannot write the store at {self.url}: {probe_dir} is not writable; choose a writable --store path"
            )

    # ------------------------------------------------------------------ reading
    def head(self) -> str | None:
        meta = self.meta()
        return None if meta is None else meta.get("head")

    def read_group(self, name: str) -> dict[str, ArrayData]:
        """All arrays of one statistic (or ``ledger``) in the committed generation (see :meth:`read_head`)."""
        return self.read_head([name])[1][name]

    def read_head(self, names: list[str], *, attempts: int = 10) -> tuple[dict, dict[str, dict[str, ArrayData]]]:
        """The metadata and the arrays of ``names`` (statistics or ``ledger``) of one committed generation,
        checked against the commit's manifest.

        Reads the root document (``head``, the manifest and the consolidated metadata) and checks it against
        its digest; reads every chunk and metadata document of the groups and checks each against the
        manifest (:mod:`~relulearn.storage.integrity`; a store written before checksums: every chunk present
        and of its size); decodes the arrays from the bytes checked. Where every array was decoded so and
        they are all the arrays the manifest lists in those groups, they are the committed ones even if a
        commit has moved ``head`` since: the read is returned (a reader slower than the writer's commits
        still gets a whole generation, if not the newest). Otherwise (arrays zarr must decode, a store
        without checksums) it reads the root document again: when ``head`` has not moved, no commit deleted
        the generation while it was read (a commit deletes a generation only after switching ``head`` away
        from it, and never back), so every array is the committed one — a chunk deleted under a reader would
        read as zeros. When it has moved, or a checked object went missing under the read (a commit keeps the
        generation it replaced until the next one: a read slower than that), the read is done again on the
        new head.

        Raises
        ------
        StoreDamagedError
            When a chunk or metadata document of the groups is missing, truncated, fails its crc32c or differs
            from the manifest, naming each (and the root document, checked by :meth:`meta`). Nothing is used.
        StoreError
            When the store holds no committed statistics, or was committed to during each of ``attempts``
            reads.
        """
        if self.meta() is None:
            raise StoreError(f"{self.url} holds no committed statistics yet")
        with _object_store_errors(self.url, "read"):
            for _ in range(attempts):
                meta, groups, after, damages = sync(_read_generation(self.url, names))
                if not meta:
                    self.meta()  # raises what is wrong with the root now
                    continue
                if after == meta["head"]:
                    if damages:
                        raise StoreDamagedError(self.url, damages)
                    return meta, groups
        raise StoreError(
            f"{self.url} was committed to during each of {attempts} reads; read it again, or when "
            "its writer has stopped (`relulearn status` names it)"
        )

    def groups(self) -> list[str]:
        head = self.head()
        if head is None:
            return []
        with _object_store_errors(self.url, "read"):
            return sorted(k for k in cast("zarr.Group", self._root("r")[head]).group_keys())

    def check_sizes(self, meta: dict | None = None) -> list[Damage] | None:
        """The objects of the committed generation that are missing or of another size than the commit
        wrote, from one listing of the generation (no object is read: cheap enough for ``status``; a flipped
        byte needs :func:`relulearn.storage.verify.verify_store`). None for a store without a manifest (written
        before checksums) or without a run. ``meta``: the metadata of the commit to check (as read by
        :meth:`pin`), instead of the head now."""
        meta = self.meta() if meta is None else meta
        manifest = None if meta is None else meta.get("integrity")
        if not manifest:
            return None
        import fsspec

        assert meta is not None  # the manifest came from it
        head = meta["head"]
        with _object_store_errors(self.url, "read"):
            fs, root = fsspec.core.url_to_fs(self.url, **(storage_options(self.url) or {}))
            base = f"{root.rstrip('/')}/{head}"
            with contextlib.suppress(AttributeError):
                fs.invalidate_cache(base)
            found = fs.find(base, detail=True) if fs.exists(base) else {}
        prefix = base.lstrip("/") + "/"
        listing = {str(k).lstrip("/").removeprefix(prefix): int(v.get("size") or 0) for k, v in found.items()}
        return integrity.check_sizes(head, listing, manifest)

    # ------------------------------------------------------------------ records
    def add_record(self, kind: str, doc: Mapping[str, Any]) -> str:
        """Keep a JSON document beside the statistics (``records/<kind>-<UTC time>.json``; e.g. what a learn on
        the store found, for ``relulearn report``). Records are outside every generation: a commit never
        touches them. A record is written whole or not at all: zarr writes a local key to a temporary
        ``<key>.<uuid hex>.partial`` file and renames it, and an object store's PUT is atomic."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        key = f"records/{kind}-{stamp}.json"
        with _object_store_errors(self.url, "write"), disk_full_named(self.url, f"the record {key} of the store"):
            sync(self._store(read_only=False).set(key, _json_buffer(dict(doc, recorded=stamp))))
        return key

    def records(self, kind: str) -> list[dict]:
        """The records of ``kind``, oldest first (empty for a store without any).

        Only whole records are read: a record that is not readable JSON, or not a JSON object, is skipped with a
        warning naming its file (a record is kept for people and figures, never needed to read the statistics),
        and the temporary file of a write that was killed (``<key>.<uuid hex>.partial``: zarr writes a key there
        and renames it) is not a record at all (``relulearn verify`` lists it).
        """
        pattern = re.compile(rf"records/{re.escape(kind)}-{_RECORD_STAMP}\.json")

        async def read() -> list[tuple[str, bytes | None]]:
            store = self._store(read_only=True)
            keys = sorted([k async for k in store.list_prefix("records/") if pattern.fullmatch(k)])
            out = []
            for k in keys:
                buf = await store.get(k, default_buffer_prototype())
                out.append((k, None if buf is None else buf.to_bytes()))
            return out

        with _object_store_errors(self.url, "read"):
            found = sync(read())
        out = []
        for key, raw in found:
            if raw is None:  # removed since it was listed
                continue
            doc, problem = _parse_record(raw)
            if doc is None:
                log.warning(
                    "skipped the damaged %s record %s/%s: %s; delete it (or restore it from a copy) to read the "
                    "store without this warning",
                    kind,
                    self.url.rstrip("/"),
                    key,
                    problem,
                )
                continue
            out.append(doc)
        return out

    # ------------------------------------------------------------------ writing
    def commit(self, meta: dict, groups: Mapping[str, Mapping[str, ArrayData]], *, lease: Any = None) -> str:
        """Write ``groups`` as a new generation and make it the head, atomically.

        ``meta`` is stored (with ``head``, ``format_version`` and ``updated`` filled in, and the
        generation's manifest as ``integrity``: :mod:`~relulearn.storage.integrity`) as the root
        group's ``relulearn`` attribute, next to the consolidated metadata of the new generation and
        the root document's own digest. ``lease`` is the writer's :class:`~relulearn.storage.lease.Lease`
        on this store: checked before the generation is written and again before ``head``
        switches (:class:`~relulearn.storage.lease.LeaseLostError` when another writer took it).
        """
        previous = self.meta()
        if previous is None:  # a first commit (a writer with a lease checked this when it took it)
            check_not_inside_a_store(self.url)
        number = 0 if previous is None else int(previous.get("commits", 0)) + 1
        gen_name = f"g{number:06d}"
        full = dict(meta, head=gen_name, commits=number, format_version=FORMAT_VERSION, updated=_now())
        full.pop("integrity", None)
        full.setdefault("created", (previous or {}).get("created", full["updated"]))
        with _object_store_errors(self.url, "write"):
            if lease is not None:
                lease.check()
            store = self._store(read_only=False)
            try:
                sync(store.delete_dir(gen_name))  # leftover of a crashed commit with the same number
                nodes, manifest = sync(_write_generation(store, gen_name, groups))  # (1) the new generation
            except OSError:
                if lease is not None:  # a writer that took the lease meanwhile writes the same generation
                    lease.check()
                raise
            # (2) one atomic write of zarr.json; a writer whose lease was taken switches no head (its generation
            # is an orphan): the lease is checked once the document is ready, just before it is written
            self._switch_head(store, dict(full, integrity=manifest), nodes, None if lease is None else lease.check)
            # (3) the generation just replaced stays until the next commit: a reader that started on it has a
            # whole commit's time to finish (:meth:`clean` removes it when the writer is done)
            self._clean(keep={gen_name, (previous or {}).get("head", gen_name)}, store=store)
        log.info("committed %s: generation %s, %s samples", self.url, gen_name, f"{meta.get('samples', 0):,}")
        return gen_name

    @staticmethod
    def _switch_head(
        store: Store, meta: dict, nodes: Mapping[str, Mapping[str, Any]], check: Callable[[], None] | None = None
    ) -> None:
        """Write the root document: ``meta`` (with the generation's manifest, ``meta["integrity"]``), the
        consolidated metadata of ``nodes``, and the document's own digest; ``check`` (the writer's lease check)
        runs once the document is ready, right before it is written."""
        root = dict(_group_doc({"relulearn": meta}), consolidated_metadata=_consolidated(nodes))
        integrity.seal_root(root)
        buffer = _json_buffer(root, indent=None)
        if check is not None:
            check()
        sync(store.set("zarr.json", buffer))

    def discard_unfinished(self) -> None:
        """Remove what an unfinished first commit left (its generation, probes) from a store with no commit yet,
        so that a refused first write leaves the folder as it found it. Called by the writer holding the lease."""
        if self.meta() is None:
            with _object_store_errors(self.url, "write"):
                self._clean(keep=set())

    def _clean(self, keep: set[str], store: Store | None = None) -> None:
        store = store or self._store(read_only=False)
        for name in sync(_children(store)):
            if name not in keep and _LEFTOVER.fullmatch(name):
                if name == _PROBE or _PARTIAL.fullmatch(name):
                    sync(store.delete(name))
                else:
                    sync(store.delete_dir(name))

    def set_aside(self) -> dict[str, Any] | None:
        """Move the relulearn data of a store whose root metadata is missing or damaged — generations, the
        root document, learn records, extra passes — into ``STORE/set-aside-<UTC time>/``, where it is kept
        as it was, so that a new run can start in the folder (``--new-store-here``). Other files stay.

        Called by the writer holding the store's lease: a complete first generation without a root document
        is set aside too (it reads as an interrupted first commit while a lease is there, but the lease is
        the caller's own; set aside rather than deleted by the new run's first commit).

        Returns
        -------
        dict or None
            ``folder`` (the set-aside folder's URL) and ``moved`` (the names moved), or None when the store
            is readable or the folder holds no relulearn data (nothing is moved then).
        """
        try:
            if self.meta() is not None:
                return None
            with _object_store_errors(self.url, "read"):
                store = self._store(read_only=True)
                if not _committed_data(store, sync(_children(store)), root=False, own_lease=True):
                    return None
        except StoreDamagedError as err:
            if not err.root:
                raise
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        folder = f"{SET_ASIDE}{stamp}"
        with _object_store_errors(self.url, "write"):
            children = sync(_children(self._store(read_only=True)))
            moved = sorted(
                c
                for c in children
                if c == "zarr.json" or c in _COMMITTED_ONLY or _GENERATION.fullmatch(c) or _PARTIAL.fullmatch(c)
            )
            if _is_local(self.url):
                root = _local_path(self.url)
                (root / folder).mkdir()
                for name in moved:
                    os.rename(root / name, root / folder / name)
            else:
                import fsspec

                fs, root_path = fsspec.core.url_to_fs(self.url, **(storage_options(self.url) or {}))
                for name in moved:
                    fs.mv(f"{root_path.rstrip('/')}/{name}", f"{root_path.rstrip('/')}/{folder}/{name}", recursive=True)
                _invalidate_listings(self._store(read_only=True))
        return {"folder": f"{self.url.rstrip('/')}/{folder}", "moved": moved}

    def clean(self) -> None:
        """Remove every generation but the head: the one the last commit replaced (kept for readers that
        started on it) and leftovers of an interrupted commit. The writer calls it when it starts and when it
        is done."""
        head = self.head()
        if head is not None:
            with _object_store_errors(self.url, "write"):
                self._clean(keep={head})
