"""The errors of a store: one that cannot be used as asked, one that is not a store, one that is damaged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["StoreError", "NotAStoreError", "StoreDamagedError", "Damage", "RESTORE_HINT"]

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
