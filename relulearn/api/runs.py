"""Running a configuration's estimation and reading a store: ``estimate``, ``status``, ``verify``, ``merge``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..config import RunConfig, load_config
from ..storage import (
    Damage,
    LeaseInfo,
    RunStore,
    StoredRun,
    StoreError,
    StoreMovedError,
    read_lease,
    read_one_commit,
)

if TYPE_CHECKING:
    from ..pipeline.run import RunSummary

# the pipeline (Dask, the statistic families, scipy) is imported by the functions that run passes, so that
# `relulearn status` and `verify` start without it


def estimate(
    config: str | Path | RunConfig,
    store: str,
    *,
    samples: int | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: TextIO | None = sys.stderr,
    commit_interval: float | None = None,
    on_start: Callable[[dict], None] | None = None,
    break_lock: bool = False,
    dashboard: str | None = None,
    new_store_here: bool = False,
) -> RunSummary:
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
        process without Dask. Without ``client``, ``workers``, ``scheduler`` or ``DASK_SCHEDULER_ADDRESS``, the
        run goes where it is projected to finish first: in this process, or on a local cluster when that saves
        more than the cluster costs to start (:func:`relulearn.runplan.where_to_run`); the same bits either way.
    break_lock
        Break a stale lease on the store (left by a writer that died) before taking it.
    dashboard
        ``HOST:PORT`` of a local cluster's dashboard (default: the config's ``run.dashboard``,
        else 127.0.0.1 on a free port).
    new_store_here
        Start a new store in a folder that is not a readable store (other files stay as they are; the
        relulearn data of a store whose root metadata is missing or damaged is moved into
        ``STORE/set-aside-<time>/``, never deleted). Without it such a folder is refused.

    Raises
    ------
    StoreLockedError
        Before any cluster starts, when another writer holds the store's lease, or a
        stale lease is left and ``break_lock`` is not given.
    StoreDamagedError
        When the store is damaged (its root metadata before any cluster starts; a chunk or metadata
        document of the committed generation when the run opens it), naming what; nothing is modified.
    TooLongError
        When ``run.max_hours`` is set and the run is projected to take longer (:mod:`relulearn.runplan`).
    """
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    from ..pipeline.projection import check_statistics_sizes
    from ..pipeline.sizes import check_source_sizes

    check_source_sizes(cfg.source)  # sizes before anything is allocated, planned or written
    check_statistics_sizes(cfg, store)
    if cfg.run.max_hours is not None:  # projected before any work (the projection is skipped without a limit)
        from .planning import measured_plan

        measured_plan(cfg, None, samples=samples, workers=planned_workers(client, workers))
    from ..pipeline.run import estimate as _estimate
    from .execution import Execution, working

    ex = Execution(workers=workers, scheduler=scheduler, client=client, break_lock=break_lock, dashboard=dashboard)
    workers_planned = planned_workers(client, workers) if ex.forced and scheduler is None else None
    in_process, projected = _where(cfg, store, samples, workers_planned if ex.forced else None)
    kw: dict[str, Any] = dict(
        samples=samples,
        progress=progress,
        commit_interval=commit_interval,
        on_start=on_start,
        new_store_here=new_store_here,
    )
    # an unguarded script is refused, then the store's lease taken, before anything is written or a cluster starts
    with working(
        ex, in_process=in_process, dashboard=cfg.run.dashboard, store=store, new_store_here=new_store_here
    ) as (where, lease):
        return _estimate(cfg, store, client=where.client, lease=lease, projected=projected, **kw)


def _where(cfg: RunConfig, store: str, samples: int | None, forced: int | None) -> tuple[bool, float | None]:
    """Whether the samples ``store`` still lacks are projected to run sooner in this process than on a local
    cluster with its start (:func:`relulearn.runplan.where_to_run`), and the projected seconds where they run
    (None when there is nothing to run, or on a scheduler's cluster); ``forced``: the workers the caller
    chose (then only the seconds are projected)."""
    from .execution import samples_to_run
    from .planning import measured_plan

    target = int(cfg.samples if samples is None else samples)
    todo = samples_to_run(store, -(-target // cfg.chunk_size) * cfg.chunk_size)
    if todo <= 0:
        return True, None
    if forced is not None:  # for the starting line only: a black box or a data file is not run for it
        return False, measured_plan(cfg, None, probe=False, samples=todo, workers=forced).projected_seconds
    chosen = measured_plan(cfg, None, samples=todo, choose_where=True)
    return chosen.runs_in == "in process", chosen.projected_seconds


def status(store: str) -> dict[str, Any]:
    """What a store holds: samples, statistics, fingerprint, last commit, and ``lease``: the writer
    holding the store (host, pid, start, last heartbeat, and ``stale``: why it is stale, or None),
    or None when no writer holds it; ``damaged``: the objects of the committed generation that one
    listing shows missing or truncated (no byte is read: :func:`verify` finds altered bytes too; None
    for a store written before checksums).

    Raises
    ------
    StoreDamagedError
        When the root metadata is missing, unreadable or differs from its digest (a damaged store, not
        "no store").
    """
    try:
        run, sizes = read_one_commit(store, _sizes)
    except StoreError as err:
        found = read_lease(store) if "no relulearn store" in str(err) else None
        if not isinstance(found, LeaseInfo):
            raise
        stale = found.stale_reason()
        if stale is None:
            raise StoreError(f"{err}; its first run is being written by {found.describe()}") from None
        how = "run the same command to resume it" if found.holder_gone() else "run it again with --break-lock"
        raise StoreError(
            f"{err}; its first run was started by {found.describe()}, stale because {stale}: {how}"
        ) from None
    out = run.summary()
    out["damaged"] = None if sizes is None else [d.to_dict() for d in sizes]
    found = read_lease(store)
    out["lease"] = None if found is None else found.to_dict()
    return out


def _sizes(run: StoredRun) -> tuple[StoredRun, list[Damage] | None]:
    """The objects of the commit ``run`` pinned that one listing shows missing or truncated; a listing that found
    some while the store moved on is of a generation a later commit deleted, not damage
    (:class:`~relulearn.storage.StoreMovedError`: :func:`~relulearn.storage.read_one_commit` opens it again)."""
    sizes = RunStore(run.url).check_sizes(run.meta)
    now = RunStore(run.url).pin() if sizes else None
    if sizes and (now is None or now.raw != run.pin.raw):
        raise StoreMovedError(run.url, run.pin.commit, None if now is None else now.commit)
    return run, sizes


def verify(store: str) -> dict[str, Any]:
    """Check every chunk and metadata document of the store's committed generation (statistics and ledger,
    then each extra pass under ``passes/``) against the commit's manifest, and the root metadata against its
    digest; nothing is written.

    Returns
    -------
    dict
        ``intact`` (bool), ``arrays`` (per array: ``array``, ``chunks`` checked, ``status``), ``damaged``
        (every damaged object: ``array``, ``chunk``, ``key`` — its file — and ``problem``), ``checksums``
        (False for a store written before checksums: missing and truncated chunks are found, flipped bytes
        are not), ``root``, ``documents``, ``passes``, ``seconds``
        (:func:`relulearn.storage.verify.verify_store`).

    Raises
    ------
    StoreError
        When ``store`` holds no relulearn store or no committed run, or cannot be reached.
    """
    from ..storage.verify import verify_store

    return verify_store(store)


def merge(a: str, b: str, out: str, *, break_lock: bool = False) -> dict[str, Any]:
    """Merge two stores of the same source with different seeds into a new store ``out``
    (``break_lock``: break a stale lease on ``out`` first)."""
    from ..pipeline.merge import merge_stores

    return merge_stores(a, b, out, break_lock=break_lock)


def planned_workers(client: Any, workers: int | None) -> int:
    """Workers a run will have: 1 in process, a client's current workers, else the local cluster's."""
    import os

    if client == "local":
        return 1
    if client is not None:
        return max(1, len(client.scheduler_info().get("workers", {})))
    return int(workers or os.cpu_count() or 1)
