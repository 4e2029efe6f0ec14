"""``relulearn verify``: check every chunk and metadata document of a store's committed generation."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, cast

import zarr.api.asynchronous as zasync
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from . import integrity
from .errors import RESTORE_HINT, Damage, StoreDamagedError, StoreError
from .folder import _PARTIAL
from .location import _children, _is_local, _local_path, _object_store_errors
from .store import RunStore

if TYPE_CHECKING:
    from zarr import AsyncGroup

__all__ = ["verify_store"]


def verify_store(url: str, *, attempts: int = 10) -> dict[str, Any]:
    """Check the store at ``url``: its root metadata against its digest, and every chunk and metadata
    document of the committed generation (statistics and ledger) against the commit's manifest; then the
    same for each extra pass stored under ``passes/``. Nothing is written.

    Parameters
    ----------
    url
        The store (a local path or an fsspec URL).
    attempts
        Reads to try while a writer commits (a check slower than two commits finds its generation deleted).

    Returns
    -------
    dict
        ``store``, ``head``, ``checksums`` (whether the store has them: stores written before checksums are
        checked for missing and truncated chunks only), ``intact``, ``arrays`` (per array: ``array``,
        ``chunks`` checked, ``status`` ``ok`` or ``damaged``), ``documents`` (metadata documents checked),
        ``root`` (``ok`` or ``damaged``), ``damaged`` (every damaged object: ``array``, ``chunk``, ``key`` —
        its file under the store — and ``problem``), ``unfinished`` (temporary files of record writes that were
        killed, ``records/<key>.<uuid hex>.partial``: not records, ignored by every reader, safe to delete),
        ``passes`` (the same for each extra pass) and ``seconds``.

    Raises
    ------
    StoreError
        When ``url`` holds no relulearn store (nothing, other files, another zarr group), holds no
        committed run yet, or cannot be reached.
    """
    t0 = time.perf_counter()
    report = _verify(url, attempts)
    report["unfinished"] = _unfinished_records(url)
    report["passes"] = [_verify(p, attempts) for p in _pass_stores(url)]
    report["intact"] = report["intact"] and all(p["intact"] for p in report["passes"])
    report["seconds"] = time.perf_counter() - t0
    return report


def _verify(url: str, attempts: int) -> dict[str, Any]:
    store = RunStore(url)
    root_damage: list[Damage] = []
    try:
        meta = store.meta()
    except StoreDamagedError as err:
        if not err.root:
            raise
        root_damage = err.damages
        meta = _readable_meta(url)
        if meta is None:  # no manifest to check the rest against: the root's damage is the report
            return dict(_report(url, None, False, root_damage, root_damage, {}, 0), found=err.found)
    if meta is None:
        if _is_local(url) and not _local_path(url).exists():
            raise StoreError(f"no relulearn store at {url}; nothing to verify")
        raise StoreError(f"{url} holds no committed run yet (no generation was committed); nothing to verify")
    with _object_store_errors(url, "read"):
        for _ in range(attempts):
            result = sync(_check(url, meta, consolidated=not root_damage))
            if result is not None:
                head, damages, checked, documents = result
                return _report(
                    url, head, bool(meta.get("integrity")), root_damage + damages, root_damage, checked, documents
                )
            meta = store.meta() or meta  # a commit moved the head: check the new one
    raise StoreError(
        f"{url} was committed to during each of {attempts} checks; verify it when its writer has "
        "stopped (`relulearn status` names it)"
    )


def _readable_meta(url: str) -> dict[str, Any] | None:
    """The root's relulearn metadata when the root document parses and names a head, else None."""
    try:
        with _object_store_errors(url, "read"):
            raw = sync(RunStore(url)._store(read_only=True).get("zarr.json", default_buffer_prototype()))
        meta = json.loads(raw.to_bytes())["attributes"]["relulearn"] if raw is not None else None
    except (ValueError, KeyError, TypeError):
        return None
    return meta if isinstance(meta, dict) and isinstance(meta.get("head"), str) else None


async def _check(
    url: str, meta: dict[str, Any], *, consolidated: bool = True
) -> tuple[str, list[Damage], dict[str, int], int] | None:
    """Check the generation ``meta`` names; None when a commit moved the head meanwhile. ``consolidated=False``
    (the root is damaged): the generation's arrays are found from their own documents, not from the root's copy
    of them, so that a damaged root is not reported as damage of the objects it describes."""
    store = RunStore(url)._store(read_only=True)
    head = meta["head"]
    manifest = meta.get("integrity")
    damages: list[Damage] = []
    try:
        root = await zasync.open_group(store, mode="r", zarr_format=3, use_consolidated=None if consolidated else False)
        generation = cast("AsyncGroup", await root.getitem(head))  # a generation is a group
        members = [(name, node) async for name, node in generation.members(max_depth=None)]
    except (KeyError, ValueError, FileNotFoundError) as err:  # no consolidated metadata, a document missing
        members = []
        damages.append(Damage(head, f"{head}/zarr.json", "", f"cannot be opened ({err})"))
    arrays = [integrity.ArrayInfo(name, node.metadata) for name, node in members if hasattr(node, "shape")]
    groups = [name for name, node in members if not hasattr(node, "shape")]
    if manifest:  # arrays the commit wrote that the metadata no longer lists
        listed = {a.path for a in arrays}
        damages += [
            Damage(path, f"{head}/{path}/zarr.json", "", "is in the commit's manifest but not in the root's metadata")
            for path in sorted(set(manifest.get("chunks", {})) - listed)
        ]
    (chunk_damages, checked), doc_damages = await asyncio.gather(
        integrity.check_chunks(store, head, arrays, manifest),
        integrity.check_documents(store, head, ["", *groups, *(a.path for a in arrays)], manifest),
    )
    damages += chunk_damages + doc_damages
    raw = await store.get("zarr.json", default_buffer_prototype())
    try:
        after = json.loads(raw.to_bytes())["attributes"]["relulearn"]["head"] if raw is not None else None
    except (ValueError, KeyError, TypeError):
        after = None
    if after != head and after is not None:
        return None
    return head, damages, checked, 1 + len(groups) + len(arrays)


def _report(
    url: str,
    head: str | None,
    checksums: bool,
    damages: list[Damage],
    root_damage: list[Damage],
    checked: dict[str, int],
    documents: int,
) -> dict[str, Any]:
    bad = {d.array for d in damages}
    return {
        "store": url,
        "head": head,
        "checksums": checksums,
        "intact": not damages,
        "root": "damaged" if root_damage else "ok",
        "arrays": [{"array": a, "chunks": n, "status": "damaged" if a in bad else "ok"} for a, n in checked.items()],
        "documents": documents,
        "damaged": [d.to_dict() for d in damages],
        "advice": None if not damages else RESTORE_HINT,
    }


def _unfinished_records(url: str) -> list[str]:
    """The temporary files of record writes that did not finish (a writer killed while writing a record)."""

    async def listed() -> list[str]:
        store = RunStore(url)._store(read_only=True)
        return sorted([k async for k in store.list_prefix("records/")])

    with _object_store_errors(url, "read"):
        return [k for k in sync(listed()) if _PARTIAL.fullmatch(k.removeprefix("records/"))]


def _pass_stores(url: str) -> list[str]:
    """The extra passes' stores under ``url/passes/`` (each a store of its own)."""
    base = url.rstrip("/")
    if _is_local(url):
        folder = _local_path(base) / "passes"
        return sorted(f"{base}/passes/{p.name}" for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    try:
        with _object_store_errors(url, "read"):
            names = sync(_children(RunStore(f"{base}/passes")._store(read_only=True)))
    except (StoreError, OSError):
        return []
    return sorted(f"{base}/passes/{n}" for n in names)
