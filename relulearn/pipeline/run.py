"""The accumulation run: plan blocks of chunks, reduce them on Dask workers, merge the
block partials on the driver in block order, and commit them atomically to the store.

Bitwise reproducibility comes from three rules: a chunk's bytes depend only on
``(seed, chunk id)``; a block is always the same chunks reduced in the same order; the
driver adds block partials in block order (holding early arrivals in a buffer bounded by
the number of blocks in flight). So the result does not depend on the number of workers,
on scheduling, or on how often the run was interrupted and resumed.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO, cast

import numpy as np

from ..aligned import fresh
from ..config import RunConfig, config_from_dict
from ..storage import FORMAT_VERSION, LEDGER_COLUMNS, RunStore, StoreError, diff_fields, ledger_platforms
from ..storage.lease import Lease, StoreLockedError, writing
from .cluster import DASK_SETTINGS, ClusterLostError, connection_lost
from .families import build_statistics
from .plan import check_partial_bytes
from .sketch import check_refines
from .sources import RunSource, Source, SourceDataError, data_of, make_source
from .stats.base import Statistic
from .stats.partial import Partial, accumulate_chunks
from .worker import platform_id, tune_malloc

if TYPE_CHECKING:
    from .data import DataSource

__all__ = [
    "RunSummary",
    "estimate",
    "fingerprint",
    "plan_blocks",
    "statistics_from_store",
    "load_partial",
    "compute_block",
    "merge_stores",
]


# ----------------------------------------------------------------- planning


def plan_blocks(start: int, stop: int, per_block: int) -> list[tuple[int, int]]:
    """Chunk ranges ``[a, b)`` of the blocks that take a run from ``start`` to ``stop`` chunks.

    Blocks are laid from ``start``, so a run resumed at a block boundary continues with
    exactly the blocks the uninterrupted run would have used.
    """
    return [(a, min(a + per_block, stop)) for a in range(start, stop, per_block)]


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


# ------------------------------------------------------------ store <-> state


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


def _groups(
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


def _meta(
    cfg: RunConfig, fp: dict, stats: Sequence[Statistic], ledger: list[list[Any]], target_chunks: int
) -> dict[str, Any]:
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


# ------------------------------------------------------------------ workers


def compute_block(
    stats: Sequence[Statistic], source: Source, seed: int, chunk_size: int, chunk_start: int, chunk_stop: int
) -> Partial:
    """Reduce one block on a worker, with single-threaded BLAS (one task per core).

    The statistics and the source (weights, direction banks, bases, candidates) are first
    copied into fresh aligned memory: arrays that came through Dask's transport may sit at
    unaligned addresses, where numpy multiplies without BLAS and so in another order.
    The in-process loop takes the same copies, so every path does the same arithmetic.
    """
    from ..aligned import one_blas_thread

    tune_malloc()
    stats, source = fresh((list(stats), source))
    with one_blas_thread():
        part = accumulate_chunks(stats, source, seed, chunk_size, chunk_start, chunk_stop)
    part.platform = platform_id()
    return part


def _compute_block_task(
    stats: Sequence[Statistic], source: Source, seed: int, chunk_size: int, chunk_start: int, chunk_stop: int
) -> Partial | SourceDataError:
    """:func:`compute_block` as a Dask task: bad source data comes back to the driver as a value
    (reported there with its chunk and row), not as a crashed task logged with a traceback."""
    try:
        return compute_block(stats, source, seed, chunk_size, chunk_start, chunk_stop)
    except SourceDataError as err:
        return err


# ----------------------------------------------------------------- progress


class _Progress:
    """One line over completed blocks: samples done, samples/s, ETA (the plan's projection, marked ``~``, until
    a block is merged; then from the measured rate)."""

    def __init__(self, total: int, done: int, stream: TextIO | None, projected: float | None = None):
        self.total, self.start_done, self.stream = total, done, stream
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.projected = projected

    def update(self, done: int, force: bool = False) -> None:
        if self.stream is None:
            return
        now = time.perf_counter()
        if not force and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        rate = (done - self.start_done) / max(now - self.t0, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else math.inf
        mark = ""
        if rate <= 0 and self.projected is not None:  # nothing measured yet: the plan's projection
            eta, mark = max(self.projected - (now - self.t0), 0.0), "~"
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac)
        eta_s = "--" if not math.isfinite(eta) else mark + time.strftime("%H:%M:%S", time.gmtime(eta))
        line = f"[{bar:<30}] {done:,}/{self.total:,} samples  {rate:,.0f} samples/s  ETA {eta_s}"
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------- run


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
    dashboard = getattr(client, "dashboard_link", None) if client is not None else None
    if on_start is not None:
        on_start(
            {
                "store": store_url,
                "dashboard": dashboard,
                "resumed_from_samples": done0 * cfg.chunk_size,
                "target_samples": target * cfg.chunk_size,
                "blocks": len(blocks),
                "set_aside": set_aside,
            }
        )

    bar = _Progress(target * cfg.chunk_size, done0 * cfg.chunk_size, progress, projected)
    committed_at = [time.perf_counter()]
    commit_no = int((store.meta() or {}).get("commits", -1)) + 1

    interrupts = _Interrupts()

    def commit() -> None:
        nonlocal commit_no
        with interrupts.held():
            try:
                store.commit(
                    _meta(cfg, fp, stats, ledger, target), _groups(stats, state, cfg.chunk_size, ledger), lease=lease
                )
            except OSError as err:  # disk full, permissions, I/O: say where, and what is safe
                raise StoreWriteError(
                    _write_failure(
                        err, store_url, _committed_chunks(store) * cfg.chunk_size, state.chunk_stop * cfg.chunk_size
                    )
                ) from err
            commit_no += 1
            committed_at[0] = time.perf_counter()

    def merge(part: Partial) -> None:
        state.add(part)
        ledger.append([cfg.seed, part.chunk_start, part.chunk_stop, commit_no, part.platform or "unknown"])
        bar.update(state.chunk_stop * cfg.chunk_size)
        if time.perf_counter() - committed_at[0] >= interval:
            commit()

    # SIGTERM behaves like Ctrl-C: commit what is merged, then stop (never in the middle of a commit)
    in_main = _is_main_thread()
    old_handlers = {}
    if in_main:
        for sig in (signal.SIGTERM, signal.SIGINT):
            old_handlers[sig] = signal.getsignal(sig)
            signal.signal(sig, interrupts.handler)
    try:
        if client is None:
            for a, b in blocks:
                merge(compute_block(stats, source, cfg.seed, cfg.chunk_size, a, b))
        else:
            _run_distributed(client, blocks, stats, source, cfg, merge, max_blocks_in_flight)
    except BaseException as err:
        if not isinstance(err, (StoreLockedError, StoreWriteError)) and state.chunk_stop > _committed_chunks(store):
            commit()  # keep every merged block: a failure or interruption loses nothing (unless the lease is lost)
        if isinstance(err, ClusterLostError):
            raise ClusterLostError(
                f"{err}; every merged block is committed: {state.chunk_stop * cfg.chunk_size:,} of "
                f"{target * cfg.chunk_size:,} samples in {store_url}"
            ) from None
        raise
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        bar.update(state.chunk_stop * cfg.chunk_size, force=True)
        bar.close()
    if state.chunk_stop > _committed_chunks(store):
        commit()
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


class StoreWriteError(StoreError):
    """A commit the file system refused (no space, no permission, an I/O error); the store keeps its last
    commit."""


def _write_failure(err: OSError, url: str, committed: int, merged: int) -> str:
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


def _data_summary(source: Source) -> dict[str, Any] | None:
    if data_of(source) is None:
        return None
    from .data import describe

    return describe(cast("DataSource", source))


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


class _Interrupts:
    """SIGTERM and SIGINT as ``KeyboardInterrupt``, held while a commit runs.

    A commit waits on zarr's writer thread; an exception raised in the waiting thread does not stop
    the writes, and the commit that follows the interrupt (same generation number) would delete a
    directory the writer is still filling (``Directory not empty``). So a signal that arrives inside
    :meth:`held` is raised when the commit has ended.
    """

    def __init__(self) -> None:
        self.holding = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: Any) -> None:  # noqa: ARG002 - signal handler signature
        if self.holding:
            self.pending = signum
            return
        raise KeyboardInterrupt(f"received signal {signum}")

    @contextlib.contextmanager
    def held(self):
        outer, self.holding = self.holding, True
        try:
            yield
        finally:  # an error of the commit itself propagates as it is; a held signal is raised after a commit
            self.holding = outer
        if not outer and self.pending is not None:
            signum, self.pending = self.pending, None
            raise KeyboardInterrupt(f"received signal {signum}")


def _committed_chunks(store: RunStore) -> int:
    meta = store.meta()
    return 0 if meta is None else int(meta.get("chunks", 0))


def _run_distributed(
    client: Any,
    blocks: list[tuple[int, int]],
    stats: Sequence[Statistic],
    source: Source,
    cfg: RunConfig,
    merge: Callable[[Partial], None],
    max_in_flight: int | None,
) -> None:
    """Submit blocks with a bounded number in flight; merge results in block order."""
    from distributed import as_completed

    if max_in_flight is None:
        max_in_flight = cfg.run.max_blocks_in_flight

    counted: list[Any] = [0.0, 3]  # when the workers were last counted, and the limit then

    def in_flight_limit() -> int:
        # given, or two per worker present now (plus one): workers that join a running
        # cluster (a batch system starting them late, a nanny restarting one) get blocks too;
        # counted at most every 5 s (each count is a round trip to the scheduler)
        if max_in_flight is not None:
            return max_in_flight
        if time.monotonic() - counted[0] > 5.0:
            counted[:] = [time.monotonic(), 2 * max(1, len(client.scheduler_info().get("workers", {}))) + 1]
        return counted[1]

    # Ship the statistics and source once, as the result of a task rather than by scatter: a
    # task's inputs stay in the scheduler, so when every worker holding them dies the
    # scheduler computes them again (scattered data would be lost with its last holder,
    # and every block still to run with it).
    stamp = time.time_ns()
    stats_f = client.submit(_identity, list(stats), pure=False, key=f"relulearn-statistics-{cfg.seed}-{stamp}")
    source_f = client.submit(_identity, source, pure=False, key=f"relulearn-source-{cfg.seed}-{stamp}")
    futures: dict[Any, int] = {}
    ready: dict[int, Partial] = {}
    next_submit = next_merge = 0
    ac = as_completed()

    def submit_more() -> None:
        nonlocal next_submit
        limit = in_flight_limit()
        while next_submit < len(blocks) and next_submit - next_merge < limit:
            a, b = blocks[next_submit]
            fut = client.submit(
                _compute_block_task,
                stats_f,
                source_f,
                cfg.seed,
                cfg.chunk_size,
                a,
                b,
                pure=False,
                retries=0,
                key=f"relulearn-block-{cfg.seed}-{a}-{b}-{time.time_ns()}",
            )
            futures[fut] = next_submit
            ac.add(fut)
            next_submit += 1

    # A failed block is raised only once every block before it is merged, and the earliest failed
    # block wins: the error and the committed state do not depend on scheduling (as in-process).
    failed: tuple[int, BaseException] | None = None
    try:
        submit_more()
        while next_merge < len(blocks):
            if failed is not None and next_merge == failed[0]:
                raise _block_error(failed[1], blocks[failed[0]])
            fut = next(ac)
            idx = futures.pop(fut)
            try:
                result = fresh(fut.result())  # received buffers may be unaligned
            except Exception as err:  # noqa: BLE001 - a crashed task: raised in block order, like data errors
                result = err
            fut.release()
            if isinstance(result, BaseException):
                if connection_lost(client, result):
                    raise ClusterLostError(
                        "lost the connection to the Dask scheduler (it stopped or is unreachable)"
                    ) from None
                if failed is None or idx < failed[0]:
                    failed = (idx, result)
                continue
            ready[idx] = result
            while next_merge in ready:
                merge(ready.pop(next_merge))
                next_merge += 1
            if failed is None:
                submit_more()
    finally:
        for fut in futures:
            with contextlib.suppress(Exception):
                fut.cancel()
        with contextlib.suppress(Exception):
            client.cancel([stats_f, source_f])


def _identity(value: Any) -> Any:
    return value


def _block_error(err: BaseException, block: tuple[int, int]) -> BaseException:
    """A block's failure as the driver reports it: workers that kept dying become a ClusterError."""
    from distributed.scheduler import KilledWorker

    if isinstance(err, KilledWorker):
        return ClusterLostError(
            f"the block of chunks [{block[0]}, {block[1]}) was running on workers that died "
            f"{DASK_SETTINGS['distributed.scheduler.allowed-failures']} times (KilledWorker: {err}); check the "
            "workers' logs and memory limit (a block needs about chunks_per_block × its statistics' size)"
        )
    return err


# -------------------------------------------------------------------- merge


def merge_stores(a_url: str, b_url: str, out_url: str, *, break_lock: bool = False) -> dict[str, Any]:
    """Merge the stores of two runs of the same source with different seeds into ``out_url``.

    The sums of A come first, then B's (the order fixes the bits). Both must agree on
    everything but the seed: source, statistics with their direction banks and τ grids,
    chunk size. A and B are only read, each as one of its commits; once they are checked,
    the lease of ``out_url`` is taken (``break_lock``: break a stale one first) and held
    until the merged store is committed.
    """
    a, b, out = RunStore(a_url), RunStore(b_url), RunStore(out_url)
    ma, mb = a.meta(), b.meta()
    for url, m in ((a_url, ma), (b_url, mb)):
        if m is None:
            raise StoreError(f"{url} holds no run; run `relulearn estimate` into it first")
    if out.meta() is not None:
        raise StoreError(f"{out_url} already holds a run; merge into a new path")
    assert ma is not None and mb is not None  # checked above
    fa = {k: v for k, v in ma["fingerprint"].items() if k != "seed"}
    fb = {k: v for k, v in mb["fingerprint"].items() if k != "seed"}
    differing = diff_fields(fa, fb)
    if differing:
        raise StoreError(f"{a_url} and {b_url} are runs of different setups; differing fields: {', '.join(differing)}")
    overlap = set(ma["seeds"]) & set(mb["seeds"])
    if overlap:
        raise StoreError(f"{a_url} and {b_url} both contain seed(s) {sorted(overlap)}: their samples would count twice")
    cfg = config_from_dict(ma["config"], where=f"stored in {a_url}")
    stats_a, stats_b = statistics_from_store(cfg, a), statistics_from_store(cfg, b)
    for sa, sb in zip(stats_a, stats_b):
        for k, (_, va) in sa.coords().items():
            vb = sb.coords()[k][1]
            if va.shape != vb.shape or not np.array_equal(va, vb):
                hint = {
                    "direction": "give the same statistics.contracted.directions_seed (or directions) to both runs",
                    "tau": "give statistics.filtered.thresholds explicitly (same values) to both runs",
                    "quantile": "give statistics.filtered.thresholds explicitly to both runs",
                    "omega": "give statistics.sketch.seed explicitly (same value) to both runs",
                }.get(k, "")
                raise StoreError(f"cannot merge: the '{sa.name}' statistic's {k} differs between the stores; {hint}")
    with writing(out_url, break_lock=break_lock) as lease:
        if out.meta() is not None:  # (a merge into the same path that finished meanwhile)
            raise StoreError(f"{out_url} already holds a run; merge into a new path")
        pa, la = load_partial(a, stats_a)
        pb, lb = load_partial(b, stats_b)
        # The ledgers are per-seed ranges; the sums simply add.
        pb.chunk_start, pb.chunk_stop = pa.chunk_stop, pa.chunk_stop + pb.n_chunks
        pa.add(pb)
        ledger = [r[:3] + [0, r[4]] for r in la + lb]
        meta = _meta(
            cfg, dict(ma["fingerprint"], seed=sorted(ma["seeds"] + mb["seeds"])), stats_a, ledger, pa.chunk_stop
        )
        meta["merged_from"] = [a_url, b_url]
        out.commit(meta, _groups(stats_a, pa, cfg.chunk_size, ledger), lease=lease)
    return {"store": out_url, "seeds": meta["seeds"], "samples": meta["samples"], "chunks": meta["chunks"]}
