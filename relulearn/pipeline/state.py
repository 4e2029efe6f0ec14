"""A run's state as its store holds it: the fingerprint runs sharing a store must agree on, the statistics and
merged sums rebuilt from a store, and what a commit writes (the arrays of every statistic and the ledger, the
metadata), with the message of a commit the file system refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ..config import RunConfig
from ..storage import FORMAT_VERSION, LEDGER_COLUMNS, RunStore, StoreError, ledger_platforms
from .families import build_statistics
from .sources import RunSource
from .stats.base import Statistic
from .stats.partial import Partial

__all__ = [
    "fingerprint",
    "statistics_from_store",
    "load_partial",
    "commit_groups",
    "commit_meta",
    "committed_chunks",
    "StoreWriteError",
    "write_failure",
]


def fingerprint(cfg: RunConfig, source: RunSource) -> dict[str, Any]:
    """What must agree for two runs to share a store (everything but the sample count)."""
    src = cfg.source.model_dump(mode="json", exclude_none=True)
    if cfg.source.data is not None:  # the files may move; their rows may not
        src.pop("teacher", None)
        src["data"] = {k: v for k, v in src["data"].items() if k not in ("x", "y", "storage_options")}
    for key in ("file", "onnx"):
        if key in src.get("teacher", {}):
            src["teacher"] = {key: "<file>"}  # the path may move; the weights (the model's bytes) may not
    src["teacher_sha256"] = source.fingerprint()
    return {
        "format_version": FORMAT_VERSION,
        "seed": cfg.seed,
        "chunk_size": cfg.chunk_size,
        "chunks_per_block": cfg.run.chunks_per_block,
        "source": src,
        "statistics": cfg.statistics.model_dump(mode="json", exclude_none=True),
    }


def statistics_from_store(cfg: RunConfig, store: RunStore) -> list[Statistic]:
    """Rebuild a run's statistics from its configuration and the stored banks and grids."""
    return build_statistics(cfg, None, lambda name: {k: v for k, (_, v) in store.read_group(name).items()})


def load_partial(store: RunStore, stats: Sequence[Statistic]) -> tuple[Partial, list[list]]:
    """The committed sums as a :class:`Partial`, and the ledger rows
    ``[seed, start, stop, commit, platform]`` (platform: see :func:`worker.platform_id`)."""
    # one generation: the ledger, the sums and the metadata of the same commit (a store being extended
    # while it is merged, for instance, is read as one of its commits)
    meta, groups = store.read_head(["ledger"] + [s.name for s in stats])
    ledger_arrays = groups["ledger"]
    ledger = np.stack([ledger_arrays[k][1] for k in LEDGER_COLUMNS], axis=1).astype(np.int64)
    names = ledger_platforms(ledger_arrays, meta)
    ledger_rows = [row + [name] for row, name in zip(ledger.tolist(), names)]
    # merged stores hold several seeds' ranges: the state covers their total count
    part = Partial(0, int((ledger[:, 2] - ledger[:, 1]).sum()))
    for s in stats:
        arrays = groups[s.name]
        part.sums[s.name] = {k: np.array(arrays[f"sum_{k}"][1]) for k in s.sums_schema()}
        part.sumsq[s.name] = {k: np.array(arrays[f"sumsq_{k}"][1]) for k in s.terms_schema()}
    return part, ledger_rows


def _platforms(ledger: list[list]) -> list[str]:
    """The distinct platforms of the ledger rows, in order of first appearance."""
    return list(dict.fromkeys(r[4] for r in ledger))


def commit_groups(
    stats: Sequence[Statistic], state: Partial, chunk_size: int, ledger: list[list[Any]]
) -> dict[str, dict[str, tuple]]:
    """Everything a commit writes: sums, error terms, estimates with SEs, coords, ledger."""
    groups: dict[str, dict[str, tuple]] = {}
    n_chunks = sum(r[2] - r[1] for r in ledger)
    for s in stats:
        arrays: dict[str, tuple] = {}
        sums_schema, terms_schema = s.sums_schema(), s.terms_schema()
        for k, v in state.sums[s.name].items():
            arrays[f"sum_{k}"] = (sums_schema[k].dims, v)
        for k, v in state.sumsq[s.name].items():
            arrays[f"sumsq_{k}"] = (terms_schema[k].dims, v)
        for k, est in s.finalize(state.sums[s.name], state.sumsq[s.name], n_chunks, chunk_size).items():
            arrays[k] = (est.dims, est.mean)
            arrays[f"{k}_se"] = (est.dims, est.se)
        for k, (dims, v) in s.coords().items():
            arrays[k] = (dims, v)
        arrays["count"] = ((), np.int64(n_chunks * chunk_size))  # samples behind every estimate
        groups[s.name] = arrays
    table = np.asarray([r[:4] for r in ledger], dtype=np.int64).reshape(-1, 4)
    groups["ledger"] = {k: (("block",), table[:, i]) for i, k in enumerate(LEDGER_COLUMNS)}
    index = {p: i for i, p in enumerate(_platforms(ledger))}
    groups["ledger"]["platform"] = (("block",), np.asarray([index[r[4]] for r in ledger], dtype=np.int64))
    return groups


def commit_meta(
    cfg: RunConfig, fp: dict, stats: Sequence[Statistic], ledger: list[list[Any]], target_chunks: int
) -> dict[str, Any]:
    """The metadata a commit writes: fingerprint, configuration, seeds, counts, statistics, platforms."""
    chunks = sum(r[2] - r[1] for r in ledger)
    return {
        "fingerprint": fp,
        "config": cfg.to_dict(),
        "seeds": sorted({int(r[0]) for r in ledger}) or [cfg.seed],
        "chunk_size": cfg.chunk_size,
        "chunks": chunks,
        "samples": chunks * cfg.chunk_size,
        "target_samples": target_chunks * cfg.chunk_size,
        "blocks": len(ledger),
        "statistics": [s.name for s in stats],
        "platforms": _platforms(ledger),
    }


def committed_chunks(store: RunStore) -> int:
    """The chunks of the store's last commit (0 for a store without one)."""
    meta = store.meta()
    return 0 if meta is None else int(meta.get("chunks", 0))


class StoreWriteError(StoreError):
    """A commit the file system refused (no space, no permission, an I/O error); the store keeps its last
    commit."""


def write_failure(err: OSError, url: str, committed: int, merged: int) -> str:
    """The message of a refused commit: the file, the cause, what is committed, and how to go on."""
    import errno

    where = err.filename or url
    fix = {
        errno.ENOSPC: "free space there",
        errno.EDQUOT: "free space there (the disk quota is reached)",
        errno.EFBIG: "free space there or raise the file size limit (ulimit -f)",
        errno.EACCES: "make it writable",
        errno.EPERM: "make it writable",
        errno.EROFS: "use a writable file system",
    }.get(cast(int, err.errno), "fix the cause")  # (None, no errno, has no entry either)
    return (
        f"could not write {where}: {err.strerror or err}. The store {url} is intact at its last commit: "
        f"{committed:,} samples are committed and safe ({merged - committed:,} merged samples since were not "
        f"saved). {fix[0].upper() + fix[1:]}, then run the same command to resume"
    )
