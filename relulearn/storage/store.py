"""The run store: one zarr v3 group per run, committed atomically (docs/design.md §4).

Layout::

    STORE/zarr.json          root group; attrs["relulearn"] = the run's metadata, with ``head`` and the
                             manifest of the head generation (``integrity``: the size and sha256 of each
                             of its objects, and the digest of this document); consolidated metadata of
                             the head generation (below)
    STORE/g000007/<stat>/    the committed generation: one subgroup per statistic,
                             arrays with dimension names (xarray.open_zarr(..., group=...))
    STORE/g000007/ledger/    the blocks counted in this generation
    STORE/passes/<name>-<digest>/   extra passes of a learning method, each a store of its own

The location is a local directory or any fsspec URL zarr accepts (``s3://bucket/path``
through s3fs; credentials and endpoint come from the usual AWS variables, e.g.
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``).

Atomic commits
--------------
A commit (1) writes a complete new generation group ``gNNNNNN/`` — every group and array
metadata document and every chunk — next to the committed one, (2) switches ``head`` by
rewriting the root ``zarr.json``, a single key, and only then (3) deletes older
generations. Readers start at the root ``zarr.json`` and follow ``head``, so they see the
old generation until the instant of step (2) and the complete new one after it.

Step (2) is atomic on every store we use. On a local disk zarr writes a temporary file and
renames it over ``zarr.json`` (rename is atomic within a directory). On S3 every object PUT
is atomic — a reader gets the whole old object or the whole new one, never a mix — and S3
has been strongly read-after-write consistent since December 2020 (also for overwrites and
listings), so once the PUT of ``zarr.json`` returns every reader sees the new ``head``, and
every object of the generation it names, all PUT before it, is visible too. Nothing is
renamed on S3 (it cannot rename atomically): generations are written under fresh names and
only the one-object switch makes them current. A crash (SIGKILL, lost connection) at any
instant therefore leaves the last committed state readable; an unfinished generation, or an
old one not yet deleted, is an orphan no reader follows, removed by the next writer (a new
commit, or ``clean()`` when a run resumes). Only one writer (the driver) may commit to a
store at a time: it holds the store's lease (``lease.json``, :mod:`relulearn.storage.lease`).
:meth:`RunStore.read_head` reads ``head`` again after the arrays and reads anew when a commit
moved it meanwhile (step (3) may have deleted chunks under it, which zarr would read as zeros).
A reader holding a generation open (a lazy xarray dataset) while a commit deletes it loses its
chunks: readers of a store that is being written re-open it per read.

Consolidated metadata
---------------------
The root ``zarr.json`` also holds the metadata of every group and array of the head
generation (zarr's "consolidated metadata"), written in the same single PUT as ``head``, so
the consolidated view always describes exactly the committed generation. Opening a
statistic — ``xr.open_zarr(url, group=f"{head}/{statistic}")`` — reads that one document
and no other metadata. Arrays that describe a statistic rather than estimate it (τ grids,
quantiles, direction banks, bases, ...) are listed in the statistic group's
``coordinates`` attribute, which xarray turns into coordinates (:func:`coordinate_names`).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, cast
from urllib.parse import urlsplit

import numpy as np
import zarr
import zarr.api.asynchronous as zasync
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from . import integrity
from .errors import RESTORE_HINT, Damage, NotAStoreError, StoreDamagedError, StoreError

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

#: (dimension names, values)
ArrayData = tuple[tuple[str, ...], np.ndarray]


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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> Path:
    return Path(url.removeprefix("file://"))


#: object written and removed by :meth:`RunStore.check_writable` on object stores
_PROBE = ".relulearn-write-check"
#: zarr's LocalStore writes a key to a temporary ``<key>.<uuid hex>.partial`` file, then renames it
_PARTIAL = re.compile(r".+\.[0-9a-f]{32}\.partial")
#: what a writer may leave behind when killed before a store's first commit completed (or is
#: leaving right now: a first commit in progress shows its root document as a .partial file)
_LEFTOVER = re.compile(rf"g\d{{6}}|{re.escape(_PROBE)}|{_PARTIAL.pattern}")
#: the writer's lease at the store's root (:mod:`relulearn.storage.lease`), and the temporary file it is
#: written through; never removed by a commit's cleanup
LEASE_KEY = "lease.json"
_LEASE_FILES = re.compile(rf"{re.escape(LEASE_KEY)}(\.[0-9a-f]{{32}}\.tmp)?")


#: where ``--new-store-here`` moves the relulearn data of a damaged store (kept, never deleted)
SET_ASIDE = "set-aside-"
_SET_ASIDE = re.compile(rf"{SET_ASIDE}\d{{8}}T\d{{6}}Z")
_GENERATION = re.compile(r"g\d{6}")
#: what only a store that was committed to holds besides its generations: learn records, extra passes
_COMMITTED_ONLY = ("records", "passes")


def _leftover_or_lease(name: str) -> bool:
    return bool(_LEFTOVER.fullmatch(name) or _LEASE_FILES.fullmatch(name))


def _tolerated(name: str) -> bool:
    """Whether a store folder without a root document may hold ``name`` and still hold no run."""
    return _leftover_or_lease(name) or bool(_SET_ASIDE.fullmatch(name))


def _shown(names: list[str], most: int = 3) -> str:
    names = sorted(names)
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def _short(err: BaseException) -> str:
    text = str(err)
    return text if len(text) <= 80 else text[:77] + "..."


def _committed_data(store: Store, children: list[str], *, root: bool, own_lease: bool = False) -> list[str]:
    """The relulearn data in a store folder that only a store with a committed run holds (its root
    document missing, ``root=False``, or unreadable, ``root=True``).

    Generations past the first, learn records and extra passes come after a first commit. The first
    generation ``g000000`` alone comes after one too when it is complete (its group document is written
    last) and no first run is under way or was interrupted: no writer's lease (``own_lease``: the lease
    there is the caller's own, which says nothing), no root document being written. A root document that
    exists but cannot be read is never a first commit under way (it is replaced in one atomic write), so
    any generation next to it counts.
    """
    gens = sorted(c for c in children if _GENERATION.fullmatch(c))
    found = [f"{c}/" for c in children if c in _COMMITTED_ONLY]
    if root or any(g != "g000000" for g in gens):
        return [f"{g}/" for g in gens] + found
    writer = any(_PARTIAL.fullmatch(c) or (c == LEASE_KEY and not own_lease) for c in children)
    if gens and not writer and sync(store.get("g000000/zarr.json", default_buffer_prototype())) is not None:
        found.insert(0, "g000000/")
    return found


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
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
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


def _json_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=1, allow_nan=True).encode()


def _json_buffer(doc: Mapping[str, Any]):
    return default_buffer_prototype().buffer.from_bytes(_json_bytes(doc))


# ------------------------------------------------------------------------ store objects


def storage_options(url: str) -> dict[str, Any] | None:
    """fsspec options for ``url``. On S3, ``max_concurrency=1``: s3fs then reads an object with
    one GET, instead of a HEAD (to decide on parallel ranged reads, useless for objects of a
    few MB) followed by the GET."""
    if url.startswith(("s3://", "s3a://")):
        return {"max_concurrency": 1}
    return None


def _open_store(url: str, *, read_only: bool) -> Store:
    """The zarr store object for ``url``: a LocalStore for paths, an FsspecStore for URLs."""
    if _is_local(url):
        return LocalStore(_local_path(url), read_only=read_only)
    try:
        return FsspecStore.from_url(url, storage_options=storage_options(url), read_only=read_only)
    except ImportError as err:
        protocol = url.split("://", 1)[0]
        package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}.get(protocol)
        fix = f"install {package} (pip install {package})" if package else "install the fsspec package for it"
        raise StoreError(
            f"cannot open the store at {url}: {protocol}:// needs a package that is missing ({err}); {fix}"
        ) from None


def _invalidate_listings(store: Store) -> None:
    """Forget cached directory listings (s3fs caches them per process; another process may
    have written since)."""
    if isinstance(store, FsspecStore):
        with contextlib.suppress(Exception):
            store.fs.invalidate_cache(store.path)


async def _children(store: Store) -> list[str]:
    # list prefixes, not groups: a commit killed before its group metadata was written
    # leaves a prefix zarr would not report as a group
    _invalidate_listings(store)
    return [p.rstrip("/") async for p in store.list_dir("")]


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
    await asyncio.gather(
        *(store.set(key, prototype.buffer.from_bytes(data)) for key, data in objects.items() if key != last)
    )
    await store.set(last, prototype.buffer.from_bytes(objects[last]))
    return nodes, manifest


# ------------------------------------------------------------------- errors of object stores


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def _endpoint(err: BaseException) -> str:
    for e in _chain(err):
        url = (getattr(e, "kwargs", None) or {}).get("endpoint_url")
        if url:
            parts = urlsplit(url)
            return f"{parts.scheme}://{parts.netloc}"
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the default AWS endpoint"


_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "InvalidClientTokenId",
    "AuthorizationHeaderMalformed",
}
_CONNECTION_ERRORS = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ReadTimeoutError",
}
_S3_FIX = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for an "
    "S3-compatible server other than AWS"
)


def _object_store_error(url: str, err: BaseException, doing: str) -> StoreError | None:
    """A one-line :class:`StoreError` for a failure to reach or use an S3 store, or None when
    ``err`` is something else (or the store is not on S3)."""
    if not url.startswith(("s3://", "s3a://")):
        return None
    names = {cls.__name__ for e in _chain(err) for cls in type(e).__mro__}
    codes = set()
    for e in _chain(err):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            codes.add(str(response.get("Error", {}).get("Code", "")))
    bucket = urlsplit(url).netloc
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        return StoreError(f"cannot {doing} the store at {url}: no S3 credentials were found; {_S3_FIX}")
    if names & _CONNECTION_ERRORS:
        return StoreError(
            f"cannot {doing} the store at {url}: the S3 endpoint {_endpoint(err)} is unreachable; set "
            "AWS_ENDPOINT_URL to the address of your S3-compatible server (unset it for AWS) and check that the "
            "server is running"
        )
    if codes & _CREDENTIAL_CODES:
        return StoreError(
            f"cannot {doing} the store at {url}: the S3 server at {_endpoint(err)} rejected the credentials "
            f"({', '.join(sorted(codes & _CREDENTIAL_CODES))}); {_S3_FIX}"
        )
    if "NoSuchBucket" in codes or (isinstance(err, FileNotFoundError) and "bucket" in str(err).lower()):
        return StoreError(
            f"cannot {doing} the store at {url}: the bucket '{bucket}' does not exist; create it "
            "first or choose another --store location"
        )
    if "AccessDenied" in codes or isinstance(err, PermissionError):
        return StoreError(
            f"cannot {doing} the store at {url}: access denied; use credentials that may read and "
            f"write it ({_S3_FIX}) or choose another --store location"
        )
    return None


@contextlib.contextmanager
def _object_store_errors(url: str, doing: str = "access") -> Iterator[None]:
    """Turn failures to reach an object store (credentials, endpoint, bucket, permissions) into
    one-line :class:`StoreError` messages naming the URL, the cause and the fix."""
    if _is_local(url):
        yield
        return
    try:
        yield
    except StoreError:
        raise
    except Exception as err:  # noqa: BLE001 - classified below, re-raised when not understood
        mapped = _object_store_error(url, err, doing)
        if mapped is None:
            raise
        raise mapped from None


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
        """The committed metadata, or None for a store that holds no run yet.

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
            doc = self._root_doc(store)
            if doc is None:
                return None
            attrs = doc.get("attributes") or {}
            meta = attrs.get("relulearn")
            if meta is None and not attrs and all(_tolerated(c) for c in sync(_children(store)) if c != "zarr.json"):
                return None  # (stores of older versions wrote an empty root before their first generation)
            if not isinstance(meta, dict):
                self._refuse_root(
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
            raise StoreDamagedError(self.url, [damage], root=True, hint=self._damaged_root_hint())
        return dict(meta)

    def _root_doc(self, store: Store) -> dict[str, Any] | None:
        """The root document, parsed; None for a store without one that holds no run yet."""
        for attempt in range(3):
            raw = sync(store.get("zarr.json", default_buffer_prototype()))
            if raw is not None:
                break
            children = sync(_children(store))
            if "zarr.json" in children and attempt < 2:
                continue  # a first commit completed between the read and the listing
            self._without_root(store, children)
            return None
        assert raw is not None  # the loop breaks on a read or returns
        try:
            doc = json.loads(raw.to_bytes())
            if not isinstance(doc, dict):
                raise ValueError("zarr.json does not hold a JSON object")
        except ValueError as err:
            self._refuse_root(
                store, f"is not readable JSON ({_short(err)})", f"{self.url} is not a readable zarr group: {err}"
            )
        if doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
            self._refuse_root(
                store,
                "is not a zarr v3 group document",
                f"{self.url} is a zarr array or a zarr v2 store, not a relulearn store",
            )
        return doc

    def _without_root(self, store: Store, children: list[str]) -> None:
        """Refuse a folder without a root document that holds relulearn data (damaged) or other files (not
        a store, unless ``allow_foreign``); return for one that holds nothing, or only what a first run
        leaves before its first commit completes."""
        found = _committed_data(store, children, root=False)
        if found:
            raise StoreDamagedError(
                self.url,
                [Damage("root", "zarr.json", "", "is missing")],
                root=True,
                found=f"it holds {_shown(found)}",
                hint=self._damaged_root_hint(),
            )
        foreign = [c for c in children if not _tolerated(c)]
        if foreign and not self.allow_foreign:
            raise NotAStoreError(
                f"{self.url} exists and is not a relulearn store (it holds {_shown(foreign)} but no zarr.json); "
                "choose an empty or new path, or give --new-store-here (Python: new_store_here=True) to start a "
                "new store next to them (they are left as they are)"
            )

    def _refuse_root(self, store: Store, problem: str, not_a_store: str) -> NoReturn:
        """Raise for a root document that cannot be used: damaged when relulearn data is next to it, else
        not a relulearn store."""
        found = _committed_data(store, sync(_children(store)), root=True)
        if found:
            raise StoreDamagedError(
                self.url,
                [Damage("root", "zarr.json", "", problem)],
                root=True,
                found=f"it holds {_shown(found)}",
                hint=self._damaged_root_hint(),
            )
        raise NotAStoreError(not_a_store)

    def _damaged_root_hint(self) -> str:
        return (
            f"{RESTORE_HINT}; or run `relulearn estimate` with --new-store-here to set its relulearn data "
            f"aside under {self.url.rstrip('/')}/{SET_ASIDE}<time>/ and start a new run here"
        )

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
        and of its size); reads the arrays; then reads the root document again: when ``head`` has not moved,
        no commit deleted the generation while it was read (a commit deletes a generation only after
        switching ``head`` away from it, and never back), so every array is the committed one — a chunk
        deleted under a reader would read as zeros. When it has moved, the read is done again on the new head.

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

        async def head_now(store: Store) -> str | None:
            raw = await store.get("zarr.json", default_buffer_prototype())
            try:
                return None if raw is None else json.loads(raw.to_bytes())["attributes"]["relulearn"]["head"]
            except (ValueError, KeyError, TypeError):
                return None

        async def read() -> tuple[dict, dict[str, dict[str, ArrayData]], str | None, list[Damage]]:
            store = self._store(read_only=True)
            raw = await store.get("zarr.json", default_buffer_prototype())
            try:
                doc = json.loads(raw.to_bytes()) if raw is not None else None
            except ValueError:
                doc = None
            damage = None if doc is None else integrity.check_root(doc)
            if doc is None or damage is not None:  # (damaged since meta() read it: meta() says how)
                return {}, {}, "", [damage] if damage is not None else []
            meta = dict(doc["attributes"]["relulearn"])
            head = meta["head"]
            root = await zasync.open_group(store, mode="r", zarr_format=3)
            if root.attrs["relulearn"].get("head") != head:  # a commit between the two reads of the root
                return meta, {}, None, []
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
                return meta, {}, await head_now(store), damages + doc_damages

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
            return meta, groups, await head_now(store), []

        with _object_store_errors(self.url, "read"):
            for _ in range(attempts):
                meta, groups, after, damages = sync(read())
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

    def check_sizes(self) -> list[Damage] | None:
        """The objects of the committed generation that are missing or of another size than the commit
        wrote, from one listing of the generation (no object is read: cheap enough for ``status``; a flipped
        byte needs :func:`relulearn.storage.verify.verify_store`). None for a store without a manifest (written
        before checksums) or without a run."""
        meta = self.meta()
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
        touches them."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        key = f"records/{kind}-{stamp}.json"
        with _object_store_errors(self.url, "write"):
            sync(self._store(read_only=False).set(key, _json_buffer(dict(doc, recorded=stamp))))
        return key

    def records(self, kind: str) -> list[dict]:
        """The records of ``kind``, oldest first (empty for a store without any)."""

        async def read() -> list[dict]:
            store = self._store(read_only=True)
            keys = sorted([k async for k in store.list_prefix("records/") if k.startswith(f"records/{kind}-")])
            out = []
            for k in keys:
                buf = await store.get(k, default_buffer_prototype())
                if buf is not None:
                    out.append(json.loads(buf.to_bytes()))
            return out

        with _object_store_errors(self.url, "read"):
            return sync(read())

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
        number = 0 if previous is None else int(previous.get("commits", 0)) + 1
        gen_name = f"g{number:06d}"
        full = dict(meta, head=gen_name, commits=number, format_version=FORMAT_VERSION, updated=_now())
        full.pop("integrity", None)
        full.setdefault("created", (previous or {}).get("created", full["updated"]))
        with _object_store_errors(self.url, "write"):
            if lease is not None:
                lease.check()
            store = self._store(read_only=False)
            sync(store.delete_dir(gen_name))  # leftover of a crashed commit with the same number
            nodes, manifest = sync(_write_generation(store, gen_name, groups))  # (1) the new generation
            if lease is not None:
                lease.check()  # a writer whose lease was broken switches no head (its generation is an orphan)
            self._switch_head(store, dict(full, integrity=manifest), nodes)  # (2) one atomic write of zarr.json
            self._clean(keep=gen_name, store=store)  # (3)
        return gen_name

    @staticmethod
    def _switch_head(store: Store, meta: dict, nodes: Mapping[str, Mapping[str, Any]]) -> None:
        """Write the root document: ``meta`` (with the generation's manifest, ``meta["integrity"]``), the
        consolidated metadata of ``nodes``, and the document's own digest."""
        root = dict(_group_doc({"relulearn": meta}), consolidated_metadata=_consolidated(nodes))
        integrity.seal_root(root)
        sync(store.set("zarr.json", _json_buffer(root)))

    def _clean(self, keep: str, store: Store | None = None) -> None:
        store = store or self._store(read_only=False)
        for name in sync(_children(store)):
            if name != keep and _LEFTOVER.fullmatch(name):
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
        """Remove leftovers of an interrupted commit (generations other than the head)."""
        head = self.head()
        if head is not None:
            with _object_store_errors(self.url, "write"):
                self._clean(keep=head)
