"""Where a command's work runs: the execution keywords of a call (:class:`Execution`), the one switch between this
process, a given client and a new cluster (:func:`working`, giving a :class:`Where`), candidate batches mapped on
either, and the held-out samples a method draws, the same wherever they are drawn."""

from __future__ import annotations

import contextlib
import pickle
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from ..aligned import fresh, fresh_map, one_blas_thread
from ..estimators.base import Samples
from ..pipeline.cluster import ClusterLostError, connection_lost


def mapper(client: Any) -> Callable:
    """The cluster's map for candidate batches (results in input order), or the builtin map.

    Either way each item is computed on fresh aligned copies with one BLAS thread, and each
    result is copied again where it arrives (:mod:`relulearn.aligned`), so that the learned
    network does not depend on where a batch ran or how its bytes travelled.
    """
    if client is None:

        def local_map(fn: Callable, items: Any) -> list:
            # one BLAS thread, as on a worker (pipeline.worker): multi-threaded BLAS sums in another order
            with one_blas_thread():
                return [fresh(r) for r in map(fresh_map(fn), items)]

        return local_map

    def cluster_map(fn: Callable, items: Any) -> list:
        items = list(items)
        try:
            task: Any = fresh_map(fn)
            if len(items) > 1 and len(pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)) > SCATTER_BYTES:
                # a large function (a model of megabytes) goes to each worker once, not inside the task graph
                task = client.scatter(task, broadcast=True, hash=False)
                return [fresh(r) for r in client.gather(client.map(_apply, [task] * len(items), items, pure=False))]
            return [fresh(r) for r in client.gather(client.map(task, items, pure=False))]
        except Exception as err:  # noqa: BLE001 - only a lost scheduler is translated
            if connection_lost(client, err):
                raise ClusterLostError(
                    "lost the connection to the Dask scheduler while learning; the "
                    "statistics and the passes already stored are kept"
                ) from None
            raise

    return cluster_map


#: a mapped function whose pickle is larger than this is scattered to the workers once per map
SCATTER_BYTES = 1_000_000


def _apply(fn: Callable, item: Any) -> Any:
    return fn(item)


@dataclass(frozen=True)
class HeldOut:
    """Samples a method draws from the run's source (:class:`~.estimators.base.SampleDraw`):
    the held-out stream, independent of every chunk of the run; picklable, so that a method's
    mapped functions can draw their own part on a worker."""

    source: Any
    seed: int

    @property
    def noiseless(self) -> bool:
        """Whether the labels are a teacher's answers without added noise (``source.noise_std`` 0 and not a data
        file's labels, which no one promises are exact): a method may then search what its network leaves."""
        from ..pipeline.sources import data_of

        return float(getattr(self.source, "noise_std", 1.0)) == 0.0 and data_of(self.source) is None

    def __call__(self, n_train: int, n_val: int) -> Samples:
        x, y = self.part(0, n_train)
        xv, yv = self.part(1, n_val)
        return Samples(x, y, xv, yv)

    def part(self, p: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        from ..pipeline.sources import Stream, draw

        return draw(self.source, self.seed, Stream.HELD_OUT, n, part=p)

    def part_batches(self, p: int, n: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The samples of :meth:`part` batch by batch (a mapped sum holds one batch, not the part)."""
        from ..pipeline.sources import Stream, draw_batches

        return draw_batches(self.source, self.seed, Stream.HELD_OUT, n, part=p)


def _cluster_forced(client: Any, workers: int | None, scheduler: str | None) -> bool:
    """Whether the caller named where the work runs: a client (or ``"local"``), ``workers``, a scheduler, or
    Dask's configured ``scheduler-address`` (``DASK_SCHEDULER_ADDRESS``). Otherwise the plan chooses between this
    process and a local cluster (:func:`relulearn.runplan.where_to_run`)."""
    from ..pipeline.cluster import configured_scheduler

    return client is not None or workers is not None or scheduler is not None or configured_scheduler() is not None


class Where:
    """Where a command's work runs: ``client``, a ``distributed.Client`` or None for this process.

    A command that chose this process may still start a local cluster for a pass that is projected to gain more
    than the cluster's start costs (:meth:`for_pass`): ``start`` makes it (a context manager giving a prepared
    client, :func:`relulearn.pipeline.cluster.connect`), once, and it is closed when the ``with`` block ends.
    The results are the same bits wherever the work runs.
    """

    def __init__(self, client: Any = None, start: Callable[[], Any] | None = None, workers: int = 1) -> None:
        self.client = client
        self._start = start
        self.workers = workers
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Where:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def may_start(self) -> bool:
        """Whether a local cluster may still be started for a pass."""
        return self.client is None and self._start is not None

    def for_pass(self, seconds_alone: float, seconds_on_cluster: float) -> Any:
        """The client of a pass projected ``seconds_alone`` in process and ``seconds_on_cluster`` on the local
        cluster: the cluster is started now when it pays for its start (and kept for the rest of the command)."""
        from ..runplan import where_to_run

        if self.may_start and not where_to_run(seconds_alone, seconds_on_cluster, self.workers):
            self.client = self._stack.enter_context(self._start())  # type: ignore[misc]
        return self.client


@contextlib.contextmanager
def _running(
    client: Any, workers: int | None, scheduler: str | None, dashboard: str | None, *, in_process: bool
) -> Iterator[Where]:
    """The :class:`Where` of a command: ``client`` as given (``"local"``: this process), this process when the
    plan chose it (``in_process``; a local cluster is then started only for a pass that pays for it), else a
    cluster (:func:`relulearn.pipeline.cluster.connect`: ``scheduler``, or a local one of ``workers``)."""
    from ..pipeline.cluster import connect, default_workers, prepare

    def start() -> Any:
        return connect(workers=workers, scheduler=scheduler, dashboard_address=dashboard)

    if client == "local":
        yield Where(None)
    elif client is not None:
        prepare(client)  # a client the caller made: the same checks and worker setup as connect()
        yield Where(client)
    elif in_process:
        with Where(None, start=start, workers=workers or default_workers()) as where:
            yield where
    else:
        with start() as c:
            yield Where(c)


@dataclass(frozen=True)
class Execution:
    """The execution keywords of ``fit``, ``learn`` and ``curve``, which travel together (:data:`EXECUTION_HELP`
    says what each does)."""

    workers: int | None = None
    scheduler: str | None = None
    client: Any = None
    progress: TextIO | None = sys.stderr
    break_lock: bool = False
    dashboard: str | None = None

    @property
    def forced(self) -> bool:
        """Whether the caller named where the work runs (:func:`_cluster_forced`)."""
        return _cluster_forced(self.client, self.workers, self.scheduler)


#: each execution keyword's type and what it does, for the parameter lists of the functions that take them
EXECUTION_HELP: dict[str, tuple[str, str]] = {
    "workers": ("int, optional", "Start a local cluster of this many worker processes (default: one per core)."),
    "scheduler": ("str, optional", "Connect to the Dask scheduler at this address instead."),
    "client": (
        "distributed.Client or 'local', optional",
        "An existing client to compute on, or ``'local'`` for this process without Dask. Without ``client``, "
        "``workers``, ``scheduler`` or ``DASK_SCHEDULER_ADDRESS`` the work goes where it is projected to finish "
        "first (:func:`relulearn.runplan.where_to_run`); the same bits either way.",
    ),
    "progress": ("file or None", "Where progress lines are printed (default: standard error; None: nothing)."),
    "break_lock": ("bool", "Break a stale lease (left by a writer that died) before taking it."),
    "dashboard": (
        "str, optional",
        "``HOST:PORT`` of a local cluster's dashboard (default: the configuration's ``run.dashboard`` if any, else "
        "127.0.0.1 on a free port).",
    ),
}


@contextlib.contextmanager
def working(
    execution: Execution,
    *,
    in_process: bool,
    dashboard: str | None = None,
    store: str | None = None,
    new_store_here: bool = False,
    before: Callable[[], None] | None = None,
) -> Iterator[tuple[Where, Any]]:
    """Where a command's work runs, and the lease of the store it writes: ``(where, lease)``.

    The work runs where the caller named (:attr:`Execution.forced`), else in this process when the plan chose it
    (``in_process``; a local cluster is then started only for a pass that pays for it), else on a local cluster.
    A command that writes ``store`` first refuses an unguarded script that would start a local cluster
    (:func:`_check_script`), runs ``before`` (its first line to the user), then takes the store's lease before any
    cluster starts, so that a refusal is immediate (``lease`` is None without a ``store``). ``dashboard``: the
    configuration's, when the call names none.
    """
    from ..storage import writing

    ex = execution
    in_process = in_process and not ex.forced
    if store is not None:
        _check_script(ex.client, ex.scheduler, in_process)  # before anything is written
    if before is not None:
        before()
    lease: Any = contextlib.nullcontext()
    if store is not None:
        lease = writing(store, break_lock=ex.break_lock, new_store_here=new_store_here)
    with (
        lease as held,
        _running(ex.client, ex.workers, ex.scheduler, ex.dashboard or dashboard, in_process=in_process) as where,
    ):
        yield where, held


def _check_script(client: Any, scheduler: str | None, in_process: bool) -> None:
    """Before a command takes a lease or writes anything: refuse a call from a script's unguarded top level when
    the command will start a local cluster (:func:`relulearn.pipeline.mainguard.check_main_guard`)."""
    from ..pipeline.cluster import configured_scheduler
    from ..pipeline.mainguard import check_main_guard

    if client is None and scheduler is None and not in_process and configured_scheduler() is None:
        check_main_guard()


def stored_samples(store: str) -> int:
    """Samples ``store`` holds (0 for a store that holds no run yet or cannot be read: the run itself then says
    why)."""
    from ..storage import RunStore, StoreError

    try:
        meta = RunStore(store).meta() or {}
    except (StoreError, OSError, ValueError):
        return 0
    return int(meta.get("samples", 0) or 0)


def samples_to_run(store: str, target: int) -> int:
    """Samples a run of ``target`` samples still has to draw into ``store``."""
    return max(0, int(target) - stored_samples(store))
