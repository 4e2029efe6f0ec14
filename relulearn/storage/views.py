"""Read-only views of a committed run, pinned to one commit: metadata, arrays and xarray datasets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from .errors import StoreMovedError
from .generation import ArrayData
from .location import _object_store_errors, _open_store
from .pinned import Pin, PinnedStore, read_pinned
from .store import RunStore, StoreError

__all__ = ["StoredRun", "open_store", "read_one_commit", "LEDGER_COLUMNS", "ledger_platforms"]

T = TypeVar("T")

#: the integer columns of a store's ``ledger`` group, one row per committed block
LEDGER_COLUMNS = ("seed", "chunk_start", "chunk_stop", "commit")


def ledger_platforms(ledger: dict, meta: dict) -> list[str]:
    """Per ledger row (``ledger``: the group's arrays as read by ``RunStore.read_group``), the
    numpy version and BLAS kernel that computed the block: the ``platform`` column indexes the
    root metadata's ``platforms`` list ("unknown" for stores written before it existed)."""
    names = list(meta.get("platforms", []))
    if "platform" not in ledger:
        return ["unknown"] * len(ledger["seed"][1])
    return [names[i] if 0 <= i < len(names) else "unknown" for i in ledger["platform"][1]]


@dataclass(frozen=True)
class StoredRun:
    """A committed run, as read from its store: one commit, pinned.

    Every statistic is a group of the committed generation ``head``; its estimates are
    the arrays named after the estimand (``xx``, ``T4``, ``M``, ...) with standard errors
    in ``<name>_se``, next to the raw ``sum_*``/``sumsq_*`` arrays they come from.

    The handle holds the root document it was opened with (``pin``): ``meta``, ``samples`` and every read through
    it (:meth:`arrays`, :meth:`all_arrays`, :meth:`estimate`, :meth:`ledger`, :meth:`platforms`, :meth:`dataset`)
    are of that one commit, checked against its manifest, however many commits a writer makes meanwhile. A read
    that finds the commit's generation deleted by later commits (a commit keeps the one it replaced until the next
    one) raises :class:`~relulearn.storage.errors.StoreMovedError`: open the store again
    (:func:`read_one_commit` does, a bounded number of times).
    """

    url: str
    pin: Pin = field(repr=False)

    @property
    def meta(self) -> dict:
        return self.pin.meta

    @property
    def head(self) -> str:
        return self.meta["head"]

    @property
    def samples(self) -> int:
        return int(self.meta["samples"])

    @property
    def statistics(self) -> list[str]:
        return list(self.meta["statistics"])

    def dataset(self, statistic: str):
        """The statistic's group as an ``xarray.Dataset`` of the pinned commit (lazy, via ``xarray.open_zarr``).

        Opening reads no metadata: the pinned root document's consolidated metadata describes the generation; the
        arrays that describe the statistic (``tau``, ``quantile``, ``direction``, ...) are coordinates. The values
        are read when used, through a :class:`~relulearn.storage.pinned.PinnedStore`: each chunk checked against
        the commit's manifest, and one that later commits deleted raises
        :class:`~relulearn.storage.errors.StoreMovedError` (zarr alone would read zeros).
        """
        import xarray as xr

        self._check(statistic)
        group = f"{self.head}/{statistic}"
        store = PinnedStore(_open_store(self.url, read_only=True), self.pin)
        with _object_store_errors(self.url, "read"):
            try:  # the pinned root's consolidated metadata describes the generation
                return xr.open_zarr(store, group=group, consolidated=True, zarr_format=3)
            except ValueError:  # a store written before metadata was consolidated
                return xr.open_zarr(store, group=group, consolidated=False, zarr_format=3)

    def read(self, names: list[str]) -> dict[str, dict[str, ArrayData]]:
        """The arrays of ``names`` (statistics or ``ledger``) of the pinned commit, with their dimension names,
        checked against its manifest (:func:`~relulearn.storage.pinned.read_pinned`)."""
        return read_pinned(self.pin, names)[1]

    def arrays(self, statistic: str) -> dict[str, np.ndarray]:
        """All arrays of a statistic's group, loaded as numpy arrays (checked against the commit's
        manifest: a damaged store raises :class:`~relulearn.storage.errors.StoreDamagedError`)."""
        self._check(statistic)
        return {k: v for k, (_, v) in self.read([statistic])[statistic].items()}

    def all_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """The arrays of every statistic, ``{statistic: {name: array}}``, read from the pinned commit, whose
        ledger is checked too (every chunk against the commit's manifest)."""
        groups = self.read(self.statistics + ["ledger"])
        return {name: {k: v for k, (_, v) in groups[name].items()} for name in self.statistics}

    def estimate(self, statistic: str, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, standard error)`` of one estimand, e.g. ``estimate("filtered", "M")``."""
        arrays = self.arrays(statistic)
        if name not in arrays or f"{name}_se" not in arrays:
            names = sorted(k[: -len("_se")] for k in arrays if k.endswith("_se"))
            raise KeyError(f"statistic '{statistic}' has no estimand '{name}'; it has {names}")
        return arrays[name], arrays[f"{name}_se"]

    def ledger(self) -> np.ndarray:
        """Committed blocks as rows ``(seed, chunk_start, chunk_stop, commit)``; the platform
        (numpy version and BLAS kernel) of each block is ``platforms()[i]`` per row."""
        g = self.read(["ledger"])["ledger"]
        return np.stack([g[k][1] for k in LEDGER_COLUMNS], axis=1)

    def platforms(self) -> list[str]:
        """Per committed block, the numpy version and BLAS kernel that computed it."""
        return ledger_platforms(self.read(["ledger"])["ledger"], self.meta)

    def _check(self, statistic: str) -> None:
        if statistic not in self.statistics:
            raise StoreError(
                f"{self.url} has no '{statistic}' statistic (it has {self.statistics}); add a "
                f"`statistics: {{{statistic}: ...}}` section to the configuration and estimate into a new store"
            )

    def summary(self) -> dict[str, Any]:
        m = self.meta
        return {
            "store": self.url,
            "samples": m["samples"],
            "target_samples": m.get("target_samples"),
            "chunks": m["chunks"],
            "chunk_size": m["chunk_size"],
            "blocks": m["blocks"],
            "seeds": m["seeds"],
            "complete": m.get("target_samples") is None or m["samples"] >= m["target_samples"],
            "statistics": m["statistics"],
            "fingerprint": m["fingerprint"],
            "format_version": m["format_version"],
            "checksums": bool(m.get("integrity")),
            "commits": m["commits"] + 1,
            "created": m["created"],
            "last_commit": m["updated"],
            "head": m["head"],
            "platforms": m.get("platforms", []),
            "mixed_platforms": len(m.get("platforms", [])) > 1,
        }


def open_store(url: str) -> StoredRun:
    """Open a run's store for reading: its last commit, pinned (:class:`StoredRun`).

    Raises
    ------
    StoreError
        When there is no committed run at ``url``, or it has a newer format.
    """
    pin = RunStore(url).pin()
    if pin is None:
        raise StoreError(f"no relulearn store at {url}; create one with `relulearn estimate CONFIG --store {url}`")
    return StoredRun(url, pin)


#: how many times :func:`read_one_commit` opens a store that keeps moving on under its reads
ATTEMPTS = 5


def read_one_commit(url: str, read: Callable[[StoredRun], T], *, attempts: int = ATTEMPTS) -> T:
    """``read(run)`` on the store at ``url`` opened with :func:`open_store`: everything ``read`` reads through the
    handle is of one commit. When the store moves on under it (:class:`~relulearn.storage.errors.StoreMovedError`),
    it is opened again and read anew, ``attempts`` times at most.

    Raises
    ------
    StoreMovedError
        When a writer's commits deleted the commit being read during each of ``attempts`` reads; the message says
        how many.
    """
    for attempt in range(attempts):
        try:
            return read(open_store(url))
        except StoreMovedError as err:
            if attempt == attempts - 1:
                raise StoreMovedError(err.url, err.before, err.after, attempts=attempts) from None
    raise AssertionError("unreachable")  # (attempts >= 1)
