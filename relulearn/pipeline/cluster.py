"""Where the accumulation runs: a local cluster by default, or an existing scheduler."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

__all__ = ["connect", "default_workers"]


def default_workers() -> int:
    """One single-threaded worker process per available core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def connect(workers: Optional[int] = None, scheduler: Optional[str] = None,
            threads_per_worker: int = 1, memory_limit: str = "auto",
            dashboard_address: str = ":0") -> Iterator["distributed.Client"]:  # noqa: F821
    """A ``distributed.Client``: on an existing scheduler, or on a new ``LocalCluster``.

    Parameters
    ----------
    workers
        Worker processes of the local cluster (default: one per core). Ignored with
        ``scheduler``.
    scheduler
        Address of a running scheduler (``tcp://host:8786``) or a scheduler file path.
    threads_per_worker
        Threads of each local worker. One thread per process keeps BLAS single-threaded
        per task, which is both the fastest and the reproducible choice.
    """
    from distributed import Client, LocalCluster

    if scheduler is not None:
        kwargs = {"scheduler_file": scheduler} if os.path.isfile(scheduler) else {"address": scheduler}
        try:
            client = Client(timeout="20s", **kwargs)
        except (OSError, TimeoutError) as err:
            raise ConnectionError(
                f"cannot reach the Dask scheduler at {scheduler}: {err}; check the address "
                "(e.g. tcp://host:8786) or run without --scheduler to start a local cluster"
            ) from None
        try:
            yield client
        finally:
            client.close()
        return
    import dask

    n = workers or default_workers()
    # distributed sets MALLOC_TRIM_THRESHOLD_ in its workers' environment; any glibc malloc
    # variable disables the adaptive mmap threshold, so every few-MB batch array is mapped
    # and page-faulted afresh (measured: +30% wall time per block). Leave glibc adaptive.
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}), LocalCluster(n_workers=n, threads_per_worker=threads_per_worker, processes=True,
                      memory_limit=memory_limit, dashboard_address=dashboard_address,
                      silence_logs=40) as cluster, Client(cluster) as client:
        yield client
