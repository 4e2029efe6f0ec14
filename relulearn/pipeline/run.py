"""The accumulation run: plan blocks of chunks, reduce them on Dask workers, merge the
block partials on the driver in block order, and commit them atomically to the store.

Bitwise reproducibility comes from three rules: a chunk's bytes depend only on
``(seed, chunk id)``; a block is always the same chunks reduced in the same order; the
driver adds block partials in block order (holding early arrivals in a buffer bounded by
the number of blocks in flight). So the result does not depend on the number of workers,
on scheduling, or on how often the run was interrupted and resumed.

The pieces live next to this module: :mod:`.blocks` (planning, computing and dispatching blocks),
:mod:`.state` (the state in the store and what a commit writes), :mod:`.interrupts` (signals during a run),
:mod:`.progress_line` (the progress line) and :mod:`.merge` (merging two stores).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO, cast

from ..config import RunConfig, config_from_dict
from ..storage import RunStore, StoreError, diff_fields
from ..storage.lease import Lease, StoreLockedError, writing
from .blocks import compute_block, plan_blocks, run_distributed
from .cluster import ClusterLostError, dashboard_link
from .families import build_statistics
from .interrupts import Interrupts, signals_as_interrupts
from .plan import check_partial_bytes
from .progress_line import ProgressLine
from .refines import check_refines
from .sources import RunSource, Source, data_of, make_source
from .state import (
    StoreWriteError,
    commit_groups,
    commit_meta,
    committed_chunks,
    fingerprint,
    load_partial,
    statistics_from_store,
    write_failure,
)
from .stats.base import Statistic
from .stats.partial import Partial

if TYPE_CHECKING:
    from .data import DataSource

__all__ = ["RunSummary", "estimate"]


@dataclass
class RunSummary:
    """What :func:`estimate` did."""

    store: str
    samples: int
    chunks: int
    blocks_run: int
    resumed_from_samples: int
    seconds: float
    samples_per_second: float
    statistics: list[str]
    dashboard: str | None = None
    #: a data source's rows, rows skipped (NaN or inf, ``nan_rows: skip``) and whether it is whitened
    data: dict[str, Any] | None = None
    #: with ``new_store_here``: where the relulearn data of a damaged store was moved (``folder``, ``moved``)
    set_aside: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for key in ("data", "set_aside"):
            if out[key] is None:
                del out[key]
        return out


def _open(cfg: RunConfig, store: RunStore, source: RunSource) -> tuple[list[Statistic], Partial, list[list[Any]], dict]:
    """Start a new run, or resume the one in the store after checking its fingerprint."""
    meta = store.meta()
    if meta is None:
        store.check_writable()
        stats = build_statistics(cfg, source)
        check_partial_bytes(stats, cfg.run.worker_memory, store.url)
        fp = fingerprint(cfg, source)
        return stats, Partial.empty(stats), [], fp
    fp = fingerprint(cfg, source)
    stored_fp = meta.get("fingerprint", {})
    if len(meta.get("seeds", [])) > 1:
        raise StoreError(
            f"{store.url} is a merge of runs with seeds {meta['seeds']} and cannot be extended; "
            "extend one of the merged stores and merge again"
        )
    differing = diff_fields(stored_fp, fp)
    data = data_of(source)
    if "source.teacher_sha256" in differing and data is not None:  # the scan's hash of the rows differs
        files = " and ".join(dict.fromkeys((data.x.url, data.y.url)))
        others = [f for f in differing if f != "source.teacher_sha256"]
        raise StoreError(
            f"{store.url} was made from other data: the rows of {files} are not those the store's statistics "
            "were read from (its fingerprint holds a hash of them)"
            + (f", and these fields differ too: {', '.join(others)}" if others else "")
            + "; restore the files the store was made from, or start a new store (--store) for the new data. "
            "The store was not modified."
        )
    if differing:
        raise StoreError(
            f"{store.url} holds a run with a different fingerprint; differing fields: {', '.join(differing)}. "
            "Use the configuration the store was made with (see `relulearn status`), or a new --store path. "
            "The store was not modified."
        )
    store.check_writable()
    stored_cfg = config_from_dict(meta["config"], where=f"stored in {store.url}", base_dir=cfg.base_dir)
    stats = statistics_from_store(stored_cfg, store)
    check_partial_bytes(stats, cfg.run.worker_memory, store.url)
    state, ledger = load_partial(store, stats)
    return stats, state, ledger, fp


def estimate(
    cfg: RunConfig,
    store_url: str,
    *,
    samples: int | None = None,
    client: Any = None,
    progress: TextIO | None = sys.stderr,
    commit_interval: float | None = None,
    max_blocks_in_flight: int | None = None,
    on_start: Callable[[dict], None] | None = None,
    break_lock: bool = False,
    lease: Lease | None = None,
    new_store_here: bool = False,
    projected: float | None = None,
) -> RunSummary:
    """Accumulate the configured statistics into the store at ``store_url``.

    Starts a new run, resumes an interrupted one, or extends a finished one when
    ``samples`` (default: ``cfg.samples``) asks for more than the store holds.

    Parameters
    ----------
    cfg
        The run configuration.
    store_url
        A local directory or any fsspec URL zarr accepts.
    samples
        Samples wanted in total; rounded up to whole chunks.
    client
        A ``distributed.Client``; ``None`` runs the same blocks in this process, serially.
    progress
        Stream for the progress line (``None`` for silence).
    commit_interval
        Seconds between commits (default ``cfg.run.commit_interval``); 0 commits after
        every block. The last merged state is always committed when the run ends, fails
        or is interrupted.
    break_lock
        Break a stale lease on the store (:mod:`relulearn.storage.lease`) before taking it.
    projected
        The plan's projected seconds of the pass (:mod:`relulearn.runplan`): the progress line's ETA until the
        first block is merged.
    lease
        The caller's lease on ``store_url``, taken before it started a cluster; by default the
        lease is taken here, before anything else, and released when the run ends.
    new_store_here
        Start a new store in a folder that is not a readable store: other files there are left as they
        are, and the relulearn data of a store whose root metadata is missing or damaged is moved into
        ``STORE/set-aside-<time>/`` (:meth:`RunStore.set_aside`), never deleted. A readable store is
        resumed as without it.

    Raises
    ------
    StoreLockedError
        When another writer holds the store's lease (or a stale one is left and ``break_lock``
        is not given); :class:`~relulearn.storage.lease.LeaseLostError` when another writer broke
        and took it during the run (nothing more is committed).
    StoreDamagedError
        For a store whose root metadata, chunks or metadata documents are damaged (missing, truncated,
        failing their checksum), naming each; the store is not modified.
    StoreError
        For a store with another fingerprint, a newer format, or an unwritable path; for a folder that is
        not a readable store (without ``new_store_here``); for a subspace pass
        (``statistics.sketch.refines``) that would not draw the chunks of the store it refines.
    SourceDataError
        When the source produces NaN or inf; blocks merged before the failing one are
        committed first.
    """
    t0 = time.perf_counter()
    with writing(store_url, break_lock=break_lock, held=lease, new_store_here=new_store_here) as held:
        return _estimate(
            cfg,
            store_url,
            held,
            t0,
            samples=samples,
            client=client,
            progress=progress,
            commit_interval=commit_interval,
            max_blocks_in_flight=max_blocks_in_flight,
            on_start=on_start,
            new_store_here=new_store_here,
            projected=projected,
        )


def _estimate(
    cfg: RunConfig,
    store_url: str,
    lease: Lease,
    t0: float,
    *,
    samples: int | None,
    client: Any,
    progress: TextIO | None,
    commit_interval: float | None,
    max_blocks_in_flight: int | None,
    on_start: Callable[[dict], None] | None,
    new_store_here: bool = False,
    projected: float | None = None,
) -> RunSummary:
    """:func:`estimate`, with the store's lease held."""
    source = _checked_source(cfg, store_url, client, samples)
    store = RunStore(store_url, allow_foreign=new_store_here)
    set_aside = store.set_aside() if new_store_here else None  # (under the lease: no other writer is here)
    stats, state, ledger, fp = _open(cfg, store, source)
    if store.meta() is not None:
        store.clean()
    target = -(-(samples if samples is not None else cfg.samples) // cfg.chunk_size)
    done0 = state.chunk_stop
    target = max(target, done0)
    blocks = plan_blocks(done0, target, cfg.run.chunks_per_block)
    interval = cfg.run.commit_interval if commit_interval is None else commit_interval
    dashboard = dashboard_link(client) if client is not None else None
    if on_start is not None:
        on_start(
            {
                "store": store_url,
                "dashboard": dashboard,
                "resumed_from_samples": done0 * cfg.chunk_size,
                "target_samples": target * cfg.chunk_size,
                "blocks": len(blocks),
                "set_aside": set_aside,
                "projected_seconds": projected,
            }
        )

    # a store that already holds the samples runs no block: no progress line (it would say 0 samples/s)
    bar = ProgressLine(target * cfg.chunk_size, done0 * cfg.chunk_size, progress if blocks else None, projected)
    run = _Accumulation(cfg, store, store_url, lease, fp, stats, state, ledger, target, bar, interval)
    _run_blocks(run, blocks, client, source, max_blocks_in_flight)
    if run.behind():
        run.commit()
    store.clean()  # the generation the last commit replaced (kept while commits came): one generation at rest
    seconds = time.perf_counter() - t0
    ran = (state.chunk_stop - done0) * cfg.chunk_size
    return RunSummary(
        store=store_url,
        samples=state.chunk_stop * cfg.chunk_size,
        chunks=state.chunk_stop,
        blocks_run=len(blocks),
        resumed_from_samples=done0 * cfg.chunk_size,
        seconds=seconds,
        samples_per_second=ran / seconds if seconds > 0 else 0.0,
        statistics=[s.name for s in stats],
        dashboard=dashboard,
        data=_data_summary(source),
        set_aside=set_aside,
    )


def _checked_source(cfg: RunConfig, store_url: str, client: Any, samples: int | None) -> RunSource:
    """The run's source, after the checks that need no store: a data source's scan primed on the workers and
    its rows enough for ``samples``, a black-box teacher's modules importable on every worker, a subspace pass
    drawing the chunks of the store it refines."""
    if client is not None and cfg.source.data is not None:  # the workers read the data, not the driver
        from .sources import prime_data_scan

        prime_data_scan(cfg, client)
    source = make_source(cfg)
    modules = getattr(source, "required_modules", None)
    if client is not None and modules:  # a black-box teacher is imported where its labels are made
        from .cluster import check_imports

        check_imports(
            client, modules, f"{getattr(source, 'label', 'the teacher')} needs '{modules[0]}' on every worker"
        )
    if samples is not None and data_of(source) is not None:  # data: --samples cannot exceed its rows
        from .data import check_rows

        check_rows(cast("DataSource", source).rows, samples, cfg.chunk_size, cast("DataSource", source).x.url)
    sketch = cfg.statistics.sketch
    if sketch is not None and sketch.refines is not None:  # a subspace pass: the chunks of the store it refines
        wanted = samples if samples is not None else cfg.samples
        check_refines(
            sketch.refines, fingerprint(cfg, source), -(-wanted // cfg.chunk_size) * cfg.chunk_size, where=store_url
        )
    return source


class _Accumulation:
    """A run's merged state and its commits: blocks merged in block order into ``state`` and ``ledger``,
    committed every ``interval`` seconds (signals held while a block is merged or a commit runs)."""

    def __init__(
        self,
        cfg: RunConfig,
        store: RunStore,
        url: str,
        lease: Lease,
        fp: dict,
        stats: list[Statistic],
        state: Partial,
        ledger: list[list[Any]],
        target: int,
        bar: ProgressLine,
        interval: float,
    ):
        self.cfg, self.store, self.url, self.lease, self.fp = cfg, store, url, lease, fp
        self.stats, self.state, self.ledger, self.target = stats, state, ledger, target
        self.bar, self.interval = bar, interval
        self.committed_at = time.perf_counter()
        self.commit_no = int((store.meta() or {}).get("commits", -1)) + 1
        self.interrupts = Interrupts()

    def commit(self) -> None:
        """Commit the merged state; a refused write raises :class:`StoreWriteError` saying what is safe."""
        cfg, store, state = self.cfg, self.store, self.state
        with self.interrupts.held():
            try:
                store.commit(
                    commit_meta(cfg, self.fp, self.stats, self.ledger, self.target),
                    commit_groups(self.stats, state, cfg.chunk_size, self.ledger),
                    lease=self.lease,
                )
            except OSError as err:  # disk full, permissions, I/O: say where, and what is safe
                with contextlib.suppress(Exception):  # a first commit's unfinished generation goes (space it took)
                    store.discard_unfinished()
                raise StoreWriteError(
                    write_failure(
                        err, self.url, committed_chunks(store) * cfg.chunk_size, state.chunk_stop * cfg.chunk_size
                    )
                ) from err
            self.commit_no += 1
            self.committed_at = time.perf_counter()

    def merge(self, part: Partial) -> None:
        """Add the next block's partial, record it in the ledger, and commit when the interval is over."""
        cfg = self.cfg
        # signals held: one raised between two arrays' sums would commit a block merged into some arrays only
        with self.interrupts.held():
            self.state.add(part)
            self.ledger.append(
                [cfg.seed, part.chunk_start, part.chunk_stop, self.commit_no, part.platform or "unknown"]
            )
        self.bar.update(self.state.chunk_stop * cfg.chunk_size)
        if time.perf_counter() - self.committed_at >= self.interval:
            self.commit()

    def behind(self) -> bool:
        """Whether blocks are merged that the store's last commit does not hold."""
        return self.state.chunk_stop > committed_chunks(self.store)


def _run_blocks(
    run: _Accumulation, blocks: Sequence[tuple[int, int]], client: Any, source: Source, max_blocks_in_flight: int | None
) -> None:
    """Compute and merge the blocks, in this process (``client`` None) or on the cluster.

    SIGTERM behaves like Ctrl-C: commit what is merged, then stop (never in the middle of a merge or a commit); a
    failure also commits every merged block first (unless the lease is lost or the write itself failed).
    """
    cfg, state = run.cfg, run.state
    try:
        with signals_as_interrupts(run.interrupts):
            try:
                if client is None:
                    for a, b in blocks:
                        run.merge(compute_block(run.stats, source, cfg.seed, cfg.chunk_size, a, b))
                else:
                    run_distributed(client, blocks, run.stats, source, cfg, run.merge, max_blocks_in_flight)
            except BaseException as err:
                if not isinstance(err, (StoreLockedError, StoreWriteError)):
                    if run.behind():
                        # keep every merged block: a failure or interruption loses nothing (unless the lease is lost)
                        run.commit()
                    with contextlib.suppress(Exception):  # one generation at rest (else the next writer's start)
                        run.store.clean()
                if isinstance(err, ClusterLostError):
                    raise ClusterLostError(
                        f"{err}; every merged block is committed: {state.chunk_stop * cfg.chunk_size:,} of "
                        f"{run.target * cfg.chunk_size:,} samples in {run.url}"
                    ) from None
                raise
    finally:
        run.bar.update(state.chunk_stop * cfg.chunk_size, force=True)
        run.bar.close()


def _data_summary(source: Source) -> dict[str, Any] | None:
    if data_of(source) is None:
        return None
    from .data import describe

    return describe(cast("DataSource", source))
