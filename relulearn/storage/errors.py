"""The errors of a store: one that cannot be used as asked, one that is not a store, one that is damaged, one that
moved on to a newer commit while a reader read it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["StoreError", "NotAStoreError", "StoreDamagedError", "StoreMovedError", "Damage", "RESTORE_HINT"]

#: what to do with a damaged store (every refusal of damage says it)
RESTORE_HINT = "restore the store from a copy, or start a new store at another path"


class StoreError(RuntimeError):
    """A store that cannot be used as asked; the message says why and what to do."""


class NotAStoreError(StoreError):
    """The location holds something that is not a relulearn store (and no relulearn data)."""


@dataclass(frozen=True)
class Damage:
    """One damaged object of a store.

    Attributes
    ----------
    array
        What the object belongs to: an array of the committed generation (``basic/sum_xx``,
        ``ledger/chunk_stop``), a group (``basic``), the generation (``g000003``), or ``root``.
    key
        The object's key (its file path under the store): ``g000003/basic/sum_xx/c.0.0``,
        ``g000003/basic/sum_xx/zarr.json``, ``zarr.json``.
    chunk
        The chunk's key within its array (``c.0.0``), or ``""`` for a metadata document.
    problem
        What is wrong: ``is missing``, ``is truncated (12 of 2052 bytes)``, ``fails its crc32c checksum``,
        ``does not match its sha256 in the commit's manifest``, ``is not readable JSON``, ...
    """

    array: str
    key: str
    chunk: str
    problem: str

    def describe(self) -> str:
        """``array basic/sum_xx, chunk c.0.0 (file g000003/basic/sum_xx/c.0.0) is missing``"""
        if self.chunk:
            return f"array {self.array}, chunk {self.chunk} (file {self.key}) {self.problem}"
        what = "the root metadata" if self.array == "root" else f"the metadata of {self.array}"
        return f"{what} (file {self.key}) {self.problem}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StoreDamagedError(StoreError):
    """A store whose committed data or metadata is damaged: refused, never used, never modified.

    The message (one line) names the damaged arrays and chunks (or metadata documents) and says what to
    do: restore the store from a copy, or start a new store.

    Attributes
    ----------
    url
        The store.
    damages
        Every damaged object found (:class:`Damage`).
    root
        True when the root metadata is damaged or missing (the store cannot be opened at all); False when
        the root is sound and arrays of the committed generation are damaged.
    found
        With a damaged root: the relulearn data found next to it (``it holds g000003/, records/``).
    """

    def __init__(self, url: str, damages: Sequence[Damage], *, root: bool = False, found: str = "", hint: str = ""):
        self.url, self.damages, self.root, self.found = url, list(damages), root, found
        shown = "; ".join(d.describe() for d in self.damages[:3])
        more = len(self.damages) - 3
        if more > 0:
            shown += f"; and {more} more damaged object{'s' if more > 1 else ''}"
        where = f" ({found})" if found else ""
        super().__init__(
            f"{url} is a damaged relulearn store{where}: {shown}. It was not used and not modified; "
            f"{hint or RESTORE_HINT} (`relulearn verify {url}` lists every damaged object)"
        )


class StoreMovedError(StoreError):
    """A read of one commit (a :class:`~relulearn.storage.views.StoredRun`, a tree of
    :func:`relulearn.open_datatree`) found its generation deleted or changed: a writer committed since the store
    was opened, and then again (a commit keeps the generation it replaced until the next one). Nothing of the
    newer commit was mixed in; open the store again to read it.

    Attributes
    ----------
    url
        The store.
    before, after
        ``(head, samples)`` of the commit the reader opened, and of the one the store holds now (``after`` is None
        when the root document cannot be read now).
    """

    def __init__(self, url: str, before: tuple[str, int], after: tuple[str, int] | None, *, attempts: int = 1) -> None:
        self.url, self.before, self.after, self.attempts = url, before, after, attempts
        now = "" if after is None else f" ({_commit(before)} → {_commit(after)})"
        if attempts > 1:
            what = (
                f"moved on to a newer commit during each of {attempts} reads{now}: a writer commits faster than it "
                "can be read; read it again, or when its writer has stopped (`relulearn status` names it)"
            )
        else:
            what = f"moved on to a newer commit{now} while it was read: open it again to read the newer one"
        super().__init__(f"the store at {url} {what}")

    def __reduce__(self) -> tuple[Any, ...]:  # raised on a dask worker too: rebuilt from its arguments
        return _rebuild_moved, (self.url, self.before, self.after, self.attempts)


def _rebuild_moved(url: str, before: tuple[str, int], after: tuple[str, int] | None, attempts: int) -> StoreMovedError:
    return StoreMovedError(url, before, after, attempts=attempts)


def _commit(commit: tuple[str, int]) -> str:
    return f"{commit[0]}, {commit[1]:,} samples"
