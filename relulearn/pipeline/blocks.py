"""Blocks of chunks, the unit of work of a run: their plan, their reduction on a worker, and the loop that
runs them on a Dask cluster with a bounded number in flight and hands them back in block order.

Bitwise reproducibility needs a block to be always the same chunks reduced in the same order, and the
driver to add block partials in block order: :func:`run_distributed` holds early arrivals in a buffer
bounded by the number of blocks in flight.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, overload

from ..aligned import fresh
from ..config import RunConfig
from .arrays import ArrayFileError
from .cluster import DASK_SETTINGS, ClusterLostError, connection_lost
from .sources import Source, SourceDataError
from .stamps import DataChangedError
from .stats.base import Statistic
from .stats.partial import Partial, accumulate_chunks
from .worker import platform_id, tune_malloc

__all__ = ["BlockPlan", "plan_blocks", "compute_block", "run_distributed"]


class BlockPlan(Sequence[tuple[int, int]]):
    """The chunk ranges ``[a, b)`` of a run's blocks, made when asked for: a run of 10^13 samples has 5 × 10^7
    blocks, whose tuples in a list took gigabytes before the first block ran."""

    def __init__(self, start: int, stop: int, per_block: int):
        self._starts = range(start, stop, per_block)
        self.stop, self.per_block = stop, per_block

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[int, int]]: ...
    def __getitem__(self, i: int | slice) -> tuple[int, int] | Sequence[tuple[int, int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        a = self._starts[i]
        return a, min(a + self.per_block, self.stop)


def plan_blocks(start: int, stop: int, per_block: int) -> BlockPlan:
    """Chunk ranges ``[a, b)`` of the blocks that take a run from ``start`` to ``stop`` chunks (a lazy sequence).

    Blocks are laid from ``start``, so a run resumed at a block boundary continues with
    exactly the blocks the uninterrupted run would have used.
    """
    return BlockPlan(start, stop, per_block)


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
) -> Partial | ValueError:
    """:func:`compute_block` as a Dask task: bad source data (NaN or inf, a data file missing a chunk or changed
    under the run) comes back to the driver as a value, reported there in its one line, not as a crashed task
    logged with a traceback."""
    try:
        return compute_block(stats, source, seed, chunk_size, chunk_start, chunk_stop)
    except (SourceDataError, ArrayFileError, DataChangedError) as err:
        return err


class _InFlightLimit:
    """The number of blocks in flight at most: given, or two per worker present now (plus one): workers that
    join a running cluster (a batch system starting them late, a nanny restarting one) get blocks too;
    counted at most every 5 s (each count is a round trip to the scheduler)."""

    def __init__(self, client: Any, given: int | None):
        self.client, self.given = client, given
        self.counted: list[Any] = [0.0, 3]  # when the workers were last counted, and the limit then

    def __call__(self) -> int:
        if self.given is not None:
            return self.given
        if time.monotonic() - self.counted[0] > 5.0:
            self.counted[:] = [time.monotonic(), 2 * max(1, len(self.client.scheduler_info().get("workers", {}))) + 1]
        return self.counted[1]


class _BlockQueue:
    """The blocks submitted to the cluster and their results: submitted in block order up to the in-flight
    limit, received as they complete, handed on in block order."""

    def __init__(self, client: Any, blocks: Sequence[tuple[int, int]], stats_f: Any, source_f: Any, cfg: RunConfig):
        from distributed import as_completed

        self.client, self.blocks, self.stats_f, self.source_f, self.cfg = client, blocks, stats_f, source_f, cfg
        self.futures: dict[Any, int] = {}
        self.ready: dict[int, Partial] = {}
        self.next_submit = self.next_merge = 0
        self.ac = as_completed()

    def submit_more(self, limit: int) -> None:
        """Submit the next blocks while fewer than ``limit`` are between submission and merge."""
        cfg = self.cfg
        while self.next_submit < len(self.blocks) and self.next_submit - self.next_merge < limit:
            a, b = self.blocks[self.next_submit]
            fut = self.client.submit(
                _compute_block_task,
                self.stats_f,
                self.source_f,
                cfg.seed,
                cfg.chunk_size,
                a,
                b,
                pure=False,
                retries=0,
                key=f"relulearn-block-{cfg.seed}-{a}-{b}-{time.time_ns()}",
            )
            self.futures[fut] = self.next_submit
            self.ac.add(fut)
            self.next_submit += 1

    def next_result(self) -> tuple[int, Partial | BaseException]:
        """The next block to complete: its index and its partial, or the error it raised or returned."""
        fut = next(self.ac)
        idx = self.futures.pop(fut)
        result: Partial | BaseException
        try:
            result = fresh(fut.result())  # received buffers may be unaligned
        except Exception as err:  # noqa: BLE001 - a crashed task: raised in block order, like data errors
            result = err
        fut.release()
        return idx, result

    def merge_ready(self, merge: Callable[[Partial], None]) -> None:
        """Merge the received blocks that continue the merged ones, in block order."""
        while self.next_merge in self.ready:
            merge(self.ready.pop(self.next_merge))
            self.next_merge += 1

    def cancel(self) -> None:
        """Cancel the blocks still in flight and release the shipped statistics and source."""
        for fut in self.futures:
            with contextlib.suppress(Exception):
                fut.cancel()
        with contextlib.suppress(Exception):
            self.client.cancel([self.stats_f, self.source_f])


def run_distributed(
    client: Any,
    blocks: Sequence[tuple[int, int]],
    stats: Sequence[Statistic],
    source: Source,
    cfg: RunConfig,
    merge: Callable[[Partial], None],
    max_in_flight: int | None,
) -> None:
    """Submit blocks with a bounded number in flight; merge results in block order.

    Raises
    ------
    ClusterLostError
        When the connection to the scheduler is lost, or a block's workers kept dying.
    SourceDataError
        Or any error a block raised: the earliest failed block's, once every block before it is merged.
    """
    if max_in_flight is None:
        max_in_flight = cfg.run.max_blocks_in_flight
    in_flight_limit = _InFlightLimit(client, max_in_flight)

    # Ship the statistics and source once, as the result of a task rather than by scatter: a
    # task's inputs stay in the scheduler, so when every worker holding them dies the
    # scheduler computes them again (scattered data would be lost with its last holder,
    # and every block still to run with it).
    stamp = time.time_ns()
    stats_f = client.submit(_identity, list(stats), pure=False, key=f"relulearn-statistics-{cfg.seed}-{stamp}")
    source_f = client.submit(_identity, source, pure=False, key=f"relulearn-source-{cfg.seed}-{stamp}")
    queue = _BlockQueue(client, blocks, stats_f, source_f, cfg)

    # A failed block is raised only once every block before it is merged, and the earliest failed
    # block wins: the error and the committed state do not depend on scheduling (as in-process).
    failed: tuple[int, BaseException] | None = None
    try:
        queue.submit_more(in_flight_limit())
        while queue.next_merge < len(blocks):
            if failed is not None and queue.next_merge == failed[0]:
                raise _block_error(failed[1], blocks[failed[0]])
            idx, result = queue.next_result()
            if isinstance(result, BaseException):
                if connection_lost(client, result):
                    raise ClusterLostError(
                        "lost the connection to the Dask scheduler (it stopped or is unreachable)"
                    ) from None
                if failed is None or idx < failed[0]:
                    failed = (idx, result)
                continue
            queue.ready[idx] = result
            queue.merge_ready(merge)
            if failed is None:
                queue.submit_more(in_flight_limit())
    finally:
        queue.cancel()


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
