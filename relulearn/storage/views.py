"""Read-only views of a committed run: metadata and xarray datasets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .location import _object_store_errors, storage_options
from .store import RunStore, StoreError

__all__ = ["StoredRun", "open_store", "LEDGER_COLUMNS", "ledger_platforms"]

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
    """A committed run, as read from its store.

    Every statistic is a group of the committed generation ``head``; its estimates are
    the arrays named after the estimand (``xx``, ``T4``, ``M``, ...) with standard errors
    in ``<name>_se``, next to the raw ``sum_*``/``sumsq_*`` arrays they come from.
    """

    url: str
    meta: dict

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
        """The statistic's group as an ``xarray.Dataset`` (lazy, via ``xarray.open_zarr``).

        Opening reads one metadata document, the root's consolidated metadata; the arrays
        that describe the statistic (``tau``, ``quantile``, ``direction``, ...) are coordinates.
        """
        import xarray as xr

        self._check(statistic)
        group = f"{self.head}/{statistic}"
        options: dict[str, Any] = {"storage_options": storage_options(self.url)} if storage_options(self.url) else {}
        with _object_store_errors(self.url, "read"):
            try:  # one read: the root's consolidated metadata describes the head generation
                return xr.open_zarr(self.url, group=group, consolidated=True, zarr_format=3, **options)
            except ValueError:  # a store written before metadata was consolidated
                return xr.open_zarr(self.url, group=group, consolidated=False, zarr_format=3, **options)

    def arrays(self, statistic: str) -> dict[str, np.ndarray]:
        """All arrays of a statistic's group, loaded as numpy arrays (checked against the commit's
        manifest: a damaged store raises :class:`~relulearn.storage.errors.StoreDamagedError`)."""
        self._check(statistic)
        return {k: v for k, (_, v) in RunStore(self.url).read_group(statistic).items()}

    def all_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """The arrays of every statistic, ``{statistic: {name: array}}``, read from one commit, whose
        ledger is checked too (every chunk against the commit's manifest)."""
        _, groups = RunStore(self.url).read_head(self.statistics + ["ledger"])
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
        g = RunStore(self.url).read_group("ledger")
        return np.stack([g[k][1] for k in LEDGER_COLUMNS], axis=1)

    def platforms(self) -> list[str]:
        """Per committed block, the numpy version and BLAS kernel that computed it."""
        return ledger_platforms(RunStore(self.url).read_group("ledger"), self.meta)

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
    """Open a run's store for reading.

    Raises
    ------
    StoreError
        When there is no committed run at ``url``, or it has a newer format.
    """
    meta = RunStore(url).meta()
    if meta is None:
        raise StoreError(f"no relulearn store at {url}; create one with `relulearn estimate CONFIG --store {url}`")
    return StoredRun(url, meta)
