"""The run store: one zarr v3 group per run, committed atomically (DESIGN.md §4).

Layout::

    STORE/zarr.json          root group; attrs["relulearn"] = the run's metadata, with ``head``;
                             consolidated metadata of the head generation (below)
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

Stores hold arrays and JSON only.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional
from urllib.parse import urlsplit

import numpy as np
import zarr
import zarr.api.asynchronous as zasync
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore, StorePath

__all__ = [
    "FORMAT_VERSION",
    "StoreError",
    "RunStore",
    "ArrayData",
    "coordinate_names",
    "diff_fields",
    "flatten",
    "storage_options",
]

#: version of the on-disk layout and of the definition of chunk bytes; bump on change.
#: 2: samples drawn with SFC64 (was Philox), and sketch stores hold ``t0_second``, ``t1_second``.
FORMAT_VERSION = 2

#: (dimension names, values)
ArrayData = tuple[tuple[str, ...], np.ndarray]


class StoreError(RuntimeError):
    """A store that cannot be used as asked; the message says why and what to do."""


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
        k for k in arrays
        if k != "count" and not k.startswith(("sum_", "sumsq_")) and k not in estimands
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


def _leftover_or_lease(name: str) -> bool:
    return bool(_LEFTOVER.fullmatch(name) or _LEASE_FILES.fullmatch(name))

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


def _group_doc(attributes: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
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
    bytes_codec: dict[str, Any] = {"name": "bytes"}
    if dt.itemsize > 1:
        bytes_codec["configuration"] = {"endian": "little"}
    doc: dict[str, Any] = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(values.shape),
        "data_type": dt.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(_chunks(values))}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        # float64 statistics do not compress; skipping the codec halves the time
        "codecs": [bytes_codec],
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


def _json_buffer(doc: Mapping[str, Any]):
    return default_buffer_prototype().buffer.from_bytes(json.dumps(doc, indent=1, allow_nan=True).encode())


# ------------------------------------------------------------------------ store objects


def storage_options(url: str) -> Optional[dict[str, Any]]:
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
        raise StoreError(f"cannot open the store at {url}: {protocol}:// needs a package that is missing ({err}); "
                         f"{fix}") from None


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


async def _write_generation(store: Store | str, gen_name: str,
                            groups: Mapping[str, Mapping[str, ArrayData]]) -> dict[str, dict[str, Any]]:
    """Write every group, array and chunk of a generation concurrently; return the metadata
    documents written, ``{path: document}`` (paths relative to the store's root).

    Nothing is read: the documents are built here, and each chunk is written whole (chunks
    equal to the fill value too, so that a generation is always the same set of objects).
    """
    if isinstance(store, str):
        store = _open_store(store, read_only=False)
    nodes: dict[str, dict[str, Any]] = {gen_name: _group_doc()}
    data: dict[str, np.ndarray] = {}
    for gname, arrays in groups.items():
        coords = coordinate_names(arrays)
        nodes[f"{gen_name}/{gname}"] = _group_doc({"coordinates": " ".join(coords)} if coords else None)
        for name, (dims, values) in arrays.items():
            values = np.asarray(values, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
            path = f"{gen_name}/{gname}/{name}"
            nodes[path] = _array_doc(tuple(dims), values)
            data[path] = values

    async def write_array(path: str) -> None:
        arr = zarr.AsyncArray(nodes[path], StorePath(store, path), config={"write_empty_chunks": True})
        await arr.setitem(Ellipsis, data[path])

    await asyncio.gather(
        *(store.set(f"{path}/zarr.json", _json_buffer(doc)) for path, doc in nodes.items()),
        *(write_array(path) for path in data),
    )
    return nodes


# ------------------------------------------------------------------- errors of object stores


def _chain(err: BaseException) -> Iterator[BaseException]:
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


_CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                     "InvalidClientTokenId", "AuthorizationHeaderMalformed"}
_CONNECTION_ERRORS = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                      "ClientConnectorError", "ServerDisconnectedError", "ReadTimeoutError"}
_S3_FIX = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for an "
           "S3-compatible server other than AWS")


def _object_store_error(url: str, err: BaseException, doing: str) -> Optional[StoreError]:
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
        return StoreError(f"cannot {doing} the store at {url}: the bucket '{bucket}' does not exist; create it "
                          "first or choose another --store location")
    if "AccessDenied" in codes or isinstance(err, PermissionError):
        return StoreError(f"cannot {doing} the store at {url}: access denied; use credentials that may read and "
                          f"write it ({_S3_FIX}) or choose another --store location")
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
    """A run's zarr store at ``url`` (a local path or any fsspec URL zarr accepts)."""

    url: str

    # ------------------------------------------------------------------ opening
    def _root(self, mode: str) -> zarr.Group:
        return zarr.open_group(self._store(read_only=mode == "r"), mode=mode, zarr_format=3)

    def _store(self, *, read_only: bool) -> Store:
        return _open_store(self.url, read_only=read_only)

    def meta(self) -> Optional[dict]:
        """The committed metadata, or None for a store that holds no run yet.

        Raises
        ------
        StoreError
            When the path holds something that is not a relulearn store, or a store of a
            newer format version than this code reads, or (object stores) when the store
            cannot be reached: no credentials, endpoint unreachable, access denied.
        """
        if _is_local(self.url):
            p = _local_path(self.url)
            if not p.exists():
                return None
            if p.is_file():
                raise StoreError(f"{self.url} is a file, not a store directory; choose another --store path")
        with _object_store_errors(self.url, "read"):
            store = self._store(read_only=True)
            for attempt in range(3):
                raw = sync(store.get("zarr.json", default_buffer_prototype()))
                if raw is not None:
                    break
                # nothing, or only leftovers of a first commit that never completed: an empty store
                children = sync(_children(store))
                if "zarr.json" in children and attempt < 2:
                    continue  # a first commit completed between the read and the listing
                foreign = [c for c in children if not _leftover_or_lease(c)]
                if foreign:
                    shown = ", ".join(sorted(foreign)[:3]) + (", ..." if len(foreign) > 3 else "")
                    raise StoreError(
                        f"{self.url} exists and is not a relulearn store (it holds {shown} but no zarr.json); "
                        "choose an empty or new path"
                    )
                return None
            try:
                doc = json.loads(raw.to_bytes())
                if not isinstance(doc, dict):
                    raise ValueError("zarr.json does not hold a JSON object")
            except ValueError as err:
                raise StoreError(f"{self.url} is not a readable zarr group: {err}") from None
            if doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
                raise StoreError(f"{self.url} is a zarr array or a zarr v2 store, not a relulearn store")
            attrs = doc.get("attributes") or {}
            meta = attrs.get("relulearn")
            if meta is None and not attrs and all(_leftover_or_lease(c) for c in sync(_children(store))
                                                  if c != "zarr.json"):
                return None  # (stores of older versions wrote an empty root before their first generation)
        if not isinstance(meta, dict):
            raise StoreError(f"{self.url} is a zarr group but not a relulearn store (no 'relulearn' attribute)")
        try:
            version = int(meta.get("format_version", -1))
        except (TypeError, ValueError):
            raise StoreError(
                f"{self.url} has an unreadable store format version {meta.get('format_version')!r} in its root "
                "zarr.json; the store's metadata is damaged"
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
        return dict(meta)

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
    def head(self) -> Optional[str]:
        meta = self.meta()
        return None if meta is None else meta.get("head")

    def read_group(self, name: str) -> dict[str, ArrayData]:
        """All arrays of one statistic (or ``ledger``) in the committed generation (see :meth:`read_head`)."""
        return self.read_head([name])[1][name]

    def read_head(self, names: list[str], *, attempts: int = 10) -> tuple[dict, dict[str, dict[str, ArrayData]]]:
        """The metadata and the arrays of ``names`` (statistics or ``ledger``) of one committed generation.

        Reads the root document once (``head`` and the consolidated metadata), every chunk of the groups
        concurrently, then the root document again: when ``head`` has not moved, no commit deleted the
        generation while it was read (a commit deletes a generation only after switching ``head`` away from
        it, and never back), so every array is the committed one — a chunk deleted under a reader would read
        as zeros. When it has moved, the read is done again on the new head.

        Raises
        ------
        StoreError
            When the store holds no committed statistics, or was committed to during each of ``attempts``
            reads.
        """
        if self.meta() is None:
            raise StoreError(f"{self.url} holds no committed statistics yet")

        async def read() -> tuple[dict, dict[str, dict[str, ArrayData]], Optional[str]]:
            store = self._store(read_only=True)
            root = await zasync.open_group(store, mode="r", zarr_format=3)
            meta = dict(root.attrs["relulearn"])  # the same document the consolidated metadata came from
            head = meta["head"]

            async def group(name: str) -> dict[str, ArrayData]:
                grp = await root.getitem(f"{head}/{name}")
                arrays = [arr async for _, arr in grp.arrays()]
                values = await asyncio.gather(*(arr.getitem(Ellipsis) for arr in arrays))
                return dict(sorted((arr.basename, (tuple(arr.metadata.dimension_names or ()), np.asarray(v)))
                                   for arr, v in zip(arrays, values)))

            groups = dict(zip(names, await asyncio.gather(*(group(n) for n in names))))
            raw = await store.get("zarr.json", default_buffer_prototype())
            after = None if raw is None else json.loads(raw.to_bytes()).get("attributes", {}).get(
                "relulearn", {}).get("head")
            return meta, groups, after

        with _object_store_errors(self.url, "read"):
            for _ in range(attempts):
                meta, groups, after = sync(read())
                if after == meta["head"]:
                    return meta, groups
        raise StoreError(f"{self.url} was committed to during each of {attempts} reads; read it again, or when "
                         "its writer has stopped (`relulearn status` names it)")

    def groups(self) -> list[str]:
        head = self.head()
        if head is None:
            return []
        with _object_store_errors(self.url, "read"):
            return sorted(k for k in self._root("r")[head].group_keys())

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

        ``meta`` is stored (with ``head``, ``format_version`` and ``updated`` filled in)
        as the root group's ``relulearn`` attribute, next to the consolidated metadata of
        the new generation. ``lease`` is the writer's :class:`~relulearn.storage.lease.Lease`
        on this store: checked before the generation is written and again before ``head``
        switches (:class:`~relulearn.storage.lease.LeaseLostError` when another writer took it).
        """
        previous = self.meta()
        number = 0 if previous is None else int(previous.get("commits", 0)) + 1
        gen_name = f"g{number:06d}"
        full = dict(meta, head=gen_name, commits=number, format_version=FORMAT_VERSION, updated=_now())
        full.setdefault("created", (previous or {}).get("created", full["updated"]))
        with _object_store_errors(self.url, "write"):
            if lease is not None:
                lease.check()
            store = self._store(read_only=False)
            sync(store.delete_dir(gen_name))  # leftover of a crashed commit with the same number
            nodes = sync(_write_generation(store, gen_name, groups))  # (1) the new generation
            if lease is not None:
                lease.check()  # a writer whose lease was broken switches no head (its generation is an orphan)
            self._switch_head(store, full, nodes)  # (2) one atomic write of the root zarr.json
            self._clean(keep=gen_name, store=store)  # (3)
        return gen_name

    @staticmethod
    def _switch_head(store: Store, meta: dict, nodes: Mapping[str, Mapping[str, Any]]) -> None:
        root = dict(_group_doc({"relulearn": meta}), consolidated_metadata=_consolidated(nodes))
        sync(store.set("zarr.json", _json_buffer(root)))

    def _clean(self, keep: str, store: Optional[Store] = None) -> None:
        store = store or self._store(read_only=False)
        for name in sync(_children(store)):
            if name != keep and _LEFTOVER.fullmatch(name):
                if name == _PROBE or _PARTIAL.fullmatch(name):
                    sync(store.delete(name))
                else:
                    sync(store.delete_dir(name))

    def clean(self) -> None:
        """Remove leftovers of an interrupted commit (generations other than the head)."""
        head = self.head()
        if head is not None:
            with _object_store_errors(self.url, "write"):
                self._clean(keep=head)
