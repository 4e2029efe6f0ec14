"""What a store's folder holds: the names a writer leaves at its root (generations, leftovers of an interrupted
commit, the lease, set-aside folders), which of them only a committed run leaves, and the root document read and
refused as damaged (relulearn data next to it) or as not a relulearn store."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import RESTORE_HINT, Damage, NotAStoreError, StoreDamagedError
from .location import _children

if TYPE_CHECKING:  # zarr is imported where a store is read: the lease's module needs only LEASE_KEY
    from zarr.abc.store import Store

__all__ = ["LEASE_KEY", "SET_ASIDE"]

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


def _get(store: Store, key: str) -> Any:
    """The object ``key`` of ``store`` (a zarr buffer), or None."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    return sync(store.get(key, default_buffer_prototype()))


def _list(store: Store) -> list[str]:
    """The names at the top of ``store``."""
    from zarr.core.sync import sync

    return sync(_children(store))


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
    if gens and not writer and _get(store, "g000000/zarr.json") is not None:
        found.insert(0, "g000000/")
    return found


def _root_doc(url: str, store: Store, allow_foreign: bool) -> tuple[dict[str, Any], bytes] | None:
    """The root document, parsed, and its bytes; None for a store without one that holds no run yet."""
    for attempt in range(3):
        raw = _get(store, "zarr.json")
        if raw is not None:
            break
        children = _list(store)
        if "zarr.json" in children and attempt < 2:
            continue  # a first commit completed between the read and the listing
        _without_root(url, store, children, allow_foreign)
        return None
    assert raw is not None  # the loop breaks on a read or returns
    data = raw.to_bytes()
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("zarr.json does not hold a JSON object")
    except ValueError as err:
        _refuse_root(url, store, f"is not readable JSON ({_short(err)})", f"{url} is not a readable zarr group: {err}")
    if doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
        _refuse_root(
            url,
            store,
            "is not a zarr v3 group document",
            f"{url} is a zarr array or a zarr v2 store, not a relulearn store",
        )
    return doc, data


def _without_root(url: str, store: Store, children: list[str], allow_foreign: bool) -> None:
    """Refuse a folder without a root document that holds relulearn data (damaged) or other files (not
    a store, unless ``allow_foreign``); return for one that holds nothing, or only what a first run
    leaves before its first commit completes."""
    found = _committed_data(store, children, root=False)
    if found:
        raise StoreDamagedError(
            url,
            [Damage("root", "zarr.json", "", "is missing")],
            root=True,
            found=f"it holds {_shown(found)}",
            hint=_damaged_root_hint(url),
        )
    foreign = [c for c in children if not _tolerated(c)]
    if foreign and not allow_foreign:
        raise NotAStoreError(
            f"{url} exists and is not a relulearn store (it holds {_shown(foreign)} but no zarr.json); "
            "choose an empty or new path, or give --new-store-here (Python: new_store_here=True) to start a "
            "new store next to them (they are left as they are)"
        )


def _refuse_root(url: str, store: Store, problem: str, not_a_store: str) -> NoReturn:
    """Raise for a root document that cannot be used: damaged when relulearn data is next to it, else
    not a relulearn store."""
    found = _committed_data(store, _list(store), root=True)
    if found:
        raise StoreDamagedError(
            url,
            [Damage("root", "zarr.json", "", problem)],
            root=True,
            found=f"it holds {_shown(found)}",
            hint=_damaged_root_hint(url),
        )
    raise NotAStoreError(not_a_store)


def _damaged_root_hint(url: str) -> str:
    return (
        f"{RESTORE_HINT}; or run `relulearn estimate` with --new-store-here to set its relulearn data "
        f"aside under {url.rstrip('/')}/{SET_ASIDE}<time>/ and start a new run here"
    )
