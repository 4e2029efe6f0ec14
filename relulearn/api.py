"""Orchestration: the one place that runs passes on a cluster (DESIGN.md §1).

Functions here take plain arguments (paths, counts) and return plain data; the CLI
only parses arguments and prints what these return.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from .config import RunConfig, load_config
from .pipeline.cluster import connect
from .pipeline.run import RunSummary, merge_stores
from .pipeline.run import estimate as _estimate
from .storage import StoredRun, open_store

__all__ = ["estimate", "status", "merge", "open_store"]


def estimate(config: str | Path | RunConfig, store: str, *, samples: Optional[int] = None,
             workers: Optional[int] = None, scheduler: Optional[str] = None, client: Any = None,
             progress: Optional[TextIO] = sys.stderr, commit_interval: Optional[float] = None,
             on_start: Optional[Callable[[dict], None]] = None) -> RunSummary:
    """Start, resume or extend the run described by ``config`` in ``store``.

    Parameters
    ----------
    config
        A YAML path or a :class:`~relulearn.config.RunConfig`.
    store
        The store location (local directory or fsspec URL).
    samples
        Total samples wanted (default: the config's ``samples``); more than the store
        holds extends the run.
    workers, scheduler
        Start a ``LocalCluster`` with ``workers`` processes (default: one per core), or
        connect to a running scheduler. Ignored when ``client`` is given.
    client
        An existing ``distributed.Client``, or the string ``"local"`` to run in this
        process without Dask.
    """
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    if client == "local":
        return _estimate(cfg, store, samples=samples, client=None, progress=progress,
                         commit_interval=commit_interval, on_start=on_start)
    if client is not None:
        return _estimate(cfg, store, samples=samples, client=client, progress=progress,
                         commit_interval=commit_interval, on_start=on_start)
    with connect(workers=workers, scheduler=scheduler) as c:
        return _estimate(cfg, store, samples=samples, client=c, progress=progress,
                         commit_interval=commit_interval, on_start=on_start)


def status(store: str) -> dict[str, Any]:
    """What a store holds: samples, statistics, fingerprint, last commit."""
    return open_store(store).summary()


def merge(a: str, b: str, out: str) -> dict[str, Any]:
    """Merge two stores of the same source with different seeds into a new store ``out``."""
    return merge_stores(a, b, out)
