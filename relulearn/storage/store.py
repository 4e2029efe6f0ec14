"""The run store: one zarr v3 group per run, committed atomically (DESIGN.md §4).

Layout::

    STORE/zarr.json          root group; attrs["relulearn"] = the run's metadata (below)
    STORE/g000007/<stat>/    the committed generation: one subgroup per statistic,
                             arrays with dimension names (xarray.open_zarr(..., group=...))
    STORE/g000007/ledger/    the blocks counted in this generation

A commit writes a complete new generation group, then rewrites the root metadata
(``head`` names the new generation) — a single key written atomically by every zarr
store (temporary file and rename on local disk, one PUT on object stores) — and only
then deletes older generations. A crash at any instant leaves the last committed
generation readable; leftovers of an unfinished commit are removed by the next writer.
Stores hold arrays and JSON only.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import asyncio
import re

import numpy as np
import zarr
import zarr.api.asynchronous as zasync
from zarr.core.sync import sync

__all__ = [
    "FORMAT_VERSION",
    "StoreError",
    "RunStore",
    "ArrayData",
    "diff_fields",
    "flatten",
]

#: version of the on-disk layout and of the definition of chunk bytes; bump on change.
FORMAT_VERSION = 1

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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


_GENERATION = re.compile(r"g\d{6}")

#: arrays up to this many bytes are one chunk; larger stacks of matrices are chunked per matrix
_WHOLE_CHUNK_BYTES = 64 * 2**20


def _chunks(values: np.ndarray) -> tuple[int, ...]:
    shape = tuple(max(s, 1) for s in values.shape)
    if values.nbytes > _WHOLE_CHUNK_BYTES and len(shape) == 3:
        return (1,) + shape[1:]
    return shape


async def _write_generation(url: str, gen_name: str, groups: Mapping[str, Mapping[str, "ArrayData"]]) -> None:
    """Create all groups and arrays of a generation concurrently (zarr's per-array
    overhead dominates small statistics; gathering the writes halves a commit)."""
    root = await zasync.open_group(url, mode="a", zarr_format=3)
    gen = await root.create_group(gen_name)

    async def write_array(grp, name: str, dims: tuple[str, ...], values: np.ndarray) -> None:
        values = np.asarray(values, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        arr = await grp.create_array(
            name, shape=values.shape, dtype=values.dtype, chunks=_chunks(values),
            dimension_names=dims if values.ndim else None,
            compressors=None,  # float64 statistics do not compress; skipping the codec halves the time
        )
        await arr.setitem(Ellipsis, values)

    async def write_group(gname: str, arrays: Mapping[str, ArrayData]) -> None:
        grp = await gen.create_group(gname)
        await asyncio.gather(*(write_array(grp, k, tuple(d), np.asarray(v)) for k, (d, v) in arrays.items()))

    await asyncio.gather(*(write_group(g, a) for g, a in groups.items()))


@dataclass
class RunStore:
    """A run's zarr store at ``url`` (a local path or any fsspec URL zarr accepts)."""

    url: str

    # ------------------------------------------------------------------ opening
    def _root(self, mode: str) -> zarr.Group:
        return zarr.open_group(self.url, mode=mode, zarr_format=3)

    def meta(self) -> Optional[dict]:
        """The committed metadata, or None for a store that holds no run yet.

        Raises
        ------
        StoreError
            When the path holds something that is not a relulearn store, or a store of a
            newer format version than this code reads.
        """
        if _is_local(self.url):
            p = Path(self.url.removeprefix("file://"))
            if not p.exists():
                return None
            if p.is_file():
                raise StoreError(f"{self.url} is a file, not a store directory; choose another --store path")
            if not (p / "zarr.json").exists():
                # only leftovers of a first commit that never completed: an empty store
                if any(not (c.is_dir() and _GENERATION.fullmatch(c.name)) for c in p.iterdir()):
                    raise StoreError(
                        f"{self.url} exists and is not a relulearn store (no zarr.json); choose an empty or new path"
                    )
                return None
        try:
            root = self._root("r")
        except Exception as err:  # noqa: BLE001 - zarr raises several kinds for "not a group"
            if _is_local(self.url):
                raise StoreError(f"{self.url} is not a readable zarr group: {err}") from None
            return None
        meta = root.attrs.asdict().get("relulearn")
        if meta is None and not root.attrs.asdict() and all(_GENERATION.fullmatch(k) for k in root.keys()):
            return None  # a first commit was interrupted before its head was written
        if meta is None:
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
        """Fail early, before any computation, when the store location cannot be written."""
        if not _is_local(self.url):
            return
        p = Path(self.url.removeprefix("file://"))
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
        """All arrays of one statistic (or ``ledger``) in the committed generation."""
        head = self.head()
        if head is None:
            raise StoreError(f"{self.url} holds no committed statistics yet")
        grp = self._root("r")[f"{head}/{name}"]
        out = {}
        for key, arr in grp.arrays():
            dims = tuple(arr.metadata.dimension_names or ())
            out[key] = (dims, np.asarray(arr[...]))
        return out

    def groups(self) -> list[str]:
        head = self.head()
        if head is None:
            return []
        return sorted(k for k in self._root("r")[head].group_keys())

    # ------------------------------------------------------------------ writing
    def commit(self, meta: dict, groups: Mapping[str, Mapping[str, ArrayData]]) -> str:
        """Write ``groups`` as a new generation and make it the head, atomically.

        ``meta`` is stored (with ``head``, ``format_version`` and ``updated`` filled in)
        as the root group's ``relulearn`` attribute.
        """
        previous = self.meta()
        number = 0 if previous is None else int(previous.get("commits", 0)) + 1
        gen_name = f"g{number:06d}"
        self._delete(gen_name)  # leftover of a crashed commit with the same number
        sync(_write_generation(self.url, gen_name, groups))  # (1) the new generation
        full = dict(meta, head=gen_name, commits=number, format_version=FORMAT_VERSION, updated=_now())
        full.setdefault("created", (previous or {}).get("created", full["updated"]))
        self._root("a").attrs.put({"relulearn": full})  # (2) flip: one atomic key write
        self._clean(keep=gen_name)  # (3)
        return gen_name

    def _delete(self, prefix: str) -> None:
        root = self._root("a")
        sync(root.store.delete_dir(prefix))

    def _clean(self, keep: str) -> None:
        root = self._root("a")

        async def children() -> list[str]:
            # list prefixes, not groups: a commit killed before its group metadata was
            # written leaves a directory zarr would not report as a group
            return [p.rstrip("/") async for p in root.store.list_dir("")]

        for name in sync(children()):
            if name != keep and _GENERATION.fullmatch(name):
                sync(root.store.delete_dir(name))

    def clean(self) -> None:
        """Remove leftovers of an interrupted commit (generations other than the head)."""
        head = self.head()
        if head is not None:
            self._clean(keep=head)
