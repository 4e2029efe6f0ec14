"""Where the accumulation runs: a local cluster by default, or an existing scheduler (docs/design.md §9).

Whatever the cluster, :func:`prepare` runs before any block: it checks that every worker
imports the same relulearn version as the driver (naming the worker and both versions
when not), and registers :func:`~relulearn.pipeline.worker.worker_setup_plugin` so that workers
started by hand get the same treatment as the local cluster's.

Dask settings chosen on purpose (:data:`DASK_SETTINGS`, applied to the driver's client
and to a local cluster's scheduler; an external scheduler reads its own configuration,
``deploy/README.md`` shows how to give it the same values):

``distributed.scheduler.allowed-failures: 5``
    A block whose worker dies is recomputed elsewhere (its result does not depend on the
    worker); after 5 deaths while running the same block the block is reported as failed
    (``KilledWorker``), which usually means it exhausts a worker's memory.
``distributed.comm.timeouts.connect: 20s``
    One connection attempt between processes. The driver keeps trying to reach an
    external scheduler for ``RELULEARN_CONNECT_TIMEOUT`` seconds (default 20) and waits
    ``RELULEARN_WAIT_FOR_WORKERS`` seconds (default 60) for a first worker. A scheduler
    lost during a run ends it at once: merged blocks are committed and the command exits
    with code 2, saying how to resume.
``distributed.comm.timeouts.tcp: 60s``
    An unresponsive peer (a stopped VM, a partition) is declared dead after a minute; a
    killed process is noticed at once by its closed socket.
``distributed.worker.profile.enabled: False``
    Dask's statistical profiler keeps 1000 one-second profiles per worker: worker memory
    grew by ~0.03 MiB per second of work with it (benchmarks/scale.py), and it samples
    every 10 ms. (Passed to a local cluster's workers; give ``dask worker`` processes
    ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False``, as the deploy/ recipes do.)
A local cluster listens on 127.0.0.1 only, its dashboard included (:data:`DEFAULT_DASHBOARD`);
``connect(dashboard_address=...)`` (``--dashboard``, ``run.dashboard``) puts the dashboard elsewhere.

Tasks are submitted with ``retries=0``: a block is a deterministic function of its chunk
ids, so an exception raised inside it would be raised again; only lost workers are
retried, by the scheduler.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import distributed

__all__ = [
    "ClusterError",
    "ClusterLostError",
    "connection_lost",
    "DASK_SETTINGS",
    "DEFAULT_DASHBOARD",
    "check_dashboard",
    "dashboard_link",
    "configured_scheduler",
    "connect",
    "default_workers",
    "prepare",
    "WORKER_COMMAND",
]

DASK_SETTINGS: dict[str, Any] = {
    "distributed.scheduler.allowed-failures": 5,
    "distributed.comm.timeouts.connect": "20s",
    "distributed.comm.timeouts.tcp": "60s",
    "distributed.worker.profile.enabled": False,
}

#: how a worker for relulearn is started by hand (the deploy/ recipes use the same)
WORKER_COMMAND = "dask worker {address} --nworkers auto --nthreads 1 --preload relulearn.pipeline.worker"

#: seconds to wait for a first worker on an external scheduler
WAIT_FOR_WORKERS = float(os.environ.get("RELULEARN_WAIT_FOR_WORKERS", "60"))
#: seconds to keep trying to reach an external scheduler (and to reconnect to it)
CONNECT_TIMEOUT = float(os.environ.get("RELULEARN_CONNECT_TIMEOUT", "20"))


class ClusterError(ConnectionError):
    """The cluster cannot run the work: unreachable, no workers, mismatched workers, or lost midway."""


class ClusterLostError(ClusterError):
    """The scheduler went away (or its workers kept dying) during a run; merged blocks are committed
    and the same command resumes the run once a cluster is back."""


def configured_scheduler() -> str | None:
    """The scheduler Dask's configuration names (``DASK_SCHEDULER_ADDRESS``, ``scheduler-address``), if any."""
    import dask

    return dask.config.get("scheduler-address", None) or None


def default_workers() -> int:
    """One single-threaded worker process per available core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _scheduler_kwargs(scheduler: str) -> dict[str, str]:
    """``address`` for a URL or host:port, ``scheduler_file`` for a file path — waiting up to
    ``CONNECT_TIMEOUT`` seconds for the file to appear, as ``dask worker --scheduler-file`` does
    (a driver started next to a scheduler that is still starting)."""
    if "://" in scheduler or (":" in scheduler and "/" not in scheduler and not os.path.exists(scheduler)):
        return {"address": scheduler}
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while not os.path.isfile(scheduler) and time.monotonic() < deadline:
        time.sleep(0.2)
    if os.path.isfile(scheduler):
        return {"scheduler_file": scheduler}
    raise ClusterError(
        f"--scheduler {scheduler}: no such scheduler file (waited {CONNECT_TIMEOUT:.0f} s), and not an address; "
        "give the address of a running scheduler (tcp://host:8786) or the file written by "
        "`dask scheduler --scheduler-file FILE`"
    )


#: where a local cluster's dashboard listens by default: the loopback interface, any free port
DEFAULT_DASHBOARD = "127.0.0.1:0"
#: the interface a local cluster's scheduler, nannies and workers listen on
LOCAL_HOST = "127.0.0.1"


def check_dashboard(address: str) -> str:
    """``address`` when it reads as ``HOST:PORT`` or ``:PORT`` (all interfaces), else a ValueError saying so."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535 or " " in host:
        raise ValueError(
            f"dashboard address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:8787 (port 0: any free "
            "port; 0.0.0.0:8787 or :8787 on every interface)"
        )
    return address


def _refused(address: str) -> bool:
    """Whether a TCP connection to ``address`` (``tcp://host:port`` or ``host:port``) is refused now: nothing
    listens there (a timeout is another story: a firewall, a host down)."""
    import socket

    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if not port.isdigit() or "://" in host:
        return False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def dashboard_link(client: Any) -> str | None:
    """The client's dashboard link, saying so when the dashboard listens on every interface (``--dashboard :8787``
    or ``0.0.0.0:8787``): distributed's link names the scheduler's host, 127.0.0.1, whatever the dashboard's."""
    link = getattr(client, "dashboard_link", None)
    if not link:
        return None
    server = getattr(getattr(getattr(client, "cluster", None), "scheduler", None), "http_server", None)
    bound = [s.getsockname() for s in getattr(server, "_sockets", {}).values()]  # a local cluster's own server
    wide = [f"{host}:{port}" for host, port, *_ in bound if host in ("0.0.0.0", "::")]
    return f"{link} (listening on every interface: {', '.join(wide)})" if wide else str(link)


@contextlib.contextmanager
def connect(
    workers: int | None = None,
    scheduler: str | None = None,
    threads_per_worker: int = 1,
    memory_limit: str = "auto",
    dashboard_address: str | None = None,
) -> Iterator[distributed.Client]:
    """A prepared ``distributed.Client``: on an existing scheduler, or on a new ``LocalCluster``.

    Parameters
    ----------
    workers
        Worker processes of the local cluster (default: one per core). Ignored with
        ``scheduler``.
    scheduler
        Address of a running scheduler (``tcp://host:8786``) or a scheduler file path.
        Default: Dask's ``scheduler-address`` setting (environment variable
        ``DASK_SCHEDULER_ADDRESS``) when ``workers`` is not given, else a local cluster.
    threads_per_worker
        Threads of each local worker. One thread per process keeps BLAS single-threaded
        per task, which is both the fastest and the reproducible choice.
    dashboard_address
        Where the local cluster's dashboard listens (default :data:`DEFAULT_DASHBOARD`, the
        loopback interface only). An address on another interface (``0.0.0.0:8787``) lets
        anyone who reaches the host read the cluster's pages. The scheduler, nannies and
        workers of a local cluster listen on 127.0.0.1 whatever this is.

    Raises
    ------
    ClusterError
        For an unreachable scheduler, one without workers after ``WAIT_FOR_WORKERS``
        seconds, or workers without relulearn or with another version of it.
    UnguardedScriptError
        Before a local cluster starts, when the call comes from a script's top level outside
        ``if __name__ == "__main__":`` (:mod:`.mainguard`): each worker process would run the script again.
    """
    import dask
    from distributed import Client, LocalCluster

    if scheduler is None and workers is None:
        # DASK_SCHEDULER_ADDRESS (set by the Kubernetes operator in a DaskJob's driver pod, for
        # instance) names the cluster to use; otherwise a local cluster is started
        scheduler = configured_scheduler()
    if scheduler is not None:
        kwargs = _scheduler_kwargs(scheduler)
        # a scheduler that dies closes the client's batched stream, which distributed logs at INFO with
        # a traceback; the run reports the lost scheduler itself (what is committed, how to resume)
        with dask.config.set(DASK_SETTINGS), _quiet("distributed.batched"):
            try:
                client = Client(timeout=CONNECT_TIMEOUT, **kwargs)
            except (OSError, TimeoutError) as err:
                if "address" in kwargs and _refused(kwargs["address"]):
                    raise ClusterError(
                        f"cannot reach the Dask scheduler at {scheduler}: nothing listens there (the connection was "
                        f"refused for {CONNECT_TIMEOUT:g} s); "
                        "start the scheduler there (dask scheduler), check the address (e.g. tcp://host:8786), or "
                        "run without --scheduler to start a local cluster"
                    ) from None
                raise ClusterError(
                    f"cannot reach the Dask scheduler at {scheduler}: {err}; check the address "
                    "(e.g. tcp://host:8786) or the scheduler file, or run without --scheduler to start a "
                    "local cluster"
                ) from None
            try:
                _wait_for_workers(client, scheduler)
                prepare(client)
                yield client
            finally:
                _close(client)
        return

    from .mainguard import check_main_guard, hide_missing_main

    check_main_guard()  # before any process starts: workers would re-run an unguarded script
    n = workers or default_workers()
    # distributed sets MALLOC_TRIM_THRESHOLD_ in its workers' environment; any glibc malloc
    # variable disables the adaptive mmap threshold, so every few-MB batch array is mapped
    # and page-faulted afresh (measured: +30% wall time per block). Leave glibc adaptive.
    settings = dict(DASK_SETTINGS, **{"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
    dashboard = check_dashboard(dashboard_address or DEFAULT_DASHBOARD)
    with dask.config.set(settings), _workers_ignore_ctrl_c(), hide_missing_main():
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=threads_per_worker,
            processes=True,
            memory_limit=memory_limit,
            host=LOCAL_HOST,
            dashboard_address=dashboard,
            # the workers' own log records are dropped (CRITICAL only): a failing block reaches the driver as its
            # exception, and a worker whose scheduler closes first when a run stops on an error logged a page of
            # "Failed to communicate with scheduler during heartbeat" traceback (ERROR) under the run's message
            silence_logs=50,
        )
    with dask.config.set(settings), cluster, Client(cluster) as client:
        prepare(client)
        yield client


@contextlib.contextmanager
def _workers_ignore_ctrl_c() -> Iterator[None]:
    """SIGINT ignored while the local cluster spawns its worker processes, which keep it ignored.

    Ctrl-C in a terminal interrupts the whole foreground process group, the workers included: each printed a
    page of ``KeyboardInterrupt`` tracebacks from its event loop while the driver was already stopping the run.
    An ignored signal stays ignored across ``exec`` (and Python then installs no handler of its own), so workers
    spawned inside this block leave Ctrl-C to the driver, which closes them. A Ctrl-C during the cluster's start
    (a second or two) is lost; outside the main thread this does nothing."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Log records of logger ``name`` below WARNING are dropped inside the block."""
    import logging

    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def _close(client: Any) -> None:
    """Close the client; after a lost scheduler, without distributed's reconnect-loop traceback
    (the run has already said what happened and how to resume)."""
    import logging

    lost = client.status not in ("running", "newly-created")
    log = logging.getLogger("distributed.client")
    level = log.level
    if lost:
        log.setLevel(logging.CRITICAL)
    try:
        with contextlib.suppress(Exception):
            client.close(timeout=5)
    finally:
        log.setLevel(level)


def _wait_for_workers(client: Any, scheduler: str) -> None:
    try:
        client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS)
    except TimeoutError:
        raise ClusterError(
            f"the Dask scheduler at {scheduler} has no workers after {WAIT_FOR_WORKERS:.0f} s; start them with "
            f"`{WORKER_COMMAND.format(address=scheduler)}` (RELULEARN_WAIT_FOR_WORKERS sets how long to wait)"
        ) from None


def prepare(client: Any) -> dict[str, dict]:
    """Check every worker and set it up; return what each worker reported.

    Runs a probe on every worker (shipped by value, so it also runs where relulearn is
    missing), refuses workers that cannot import relulearn or have another version than
    this driver, then registers the worker setup plugin (one BLAS thread, adaptive malloc).
    """
    import logging

    from .._version import __version__
    from .worker import make_probe, worker_setup_plugin

    log = logging.getLogger(__name__)

    infos = client.run(make_probe(), on_error="return")
    problems = []
    for addr, info in sorted(infos.items()):
        if isinstance(info, BaseException):
            problems.append(f"worker {addr} could not run the version probe ({type(info).__name__}: {info})")
        elif info.get("relulearn") is None:
            problems.append(
                f"worker {addr} cannot import relulearn ({info.get('relulearn_error')}; "
                f"python {info.get('executable')})"
            )
        elif info["relulearn"] != __version__:
            problems.append(
                f"worker {addr} has relulearn {info['relulearn']} (at {info.get('relulearn_path')}) "
                f"but this driver has relulearn {__version__}"
            )
    if problems:
        # a development version (0.1.0.devN+gHASH: built from a git checkout) is no release pip could fetch
        install = (
            f"pip install relulearn=={__version__}, or the same source tree"
            if re.fullmatch(r"[\d.]+", __version__)
            else "the same source tree at the same commit, installed with pip install"
        )
        raise ClusterError(
            "the cluster's workers cannot run this relulearn: "
            + "; ".join(problems)
            + f". Install the driver's version on every worker ({install}) and restart the workers; no block was run"
        )
    for addr, info in sorted(infos.items()):
        log.debug("worker %s: relulearn %s at %s, python %s", addr, __version__, info.get("relulearn_path"),
                  info.get("executable"))  # fmt: skip
    log.info("%d workers checked: each runs relulearn %s", len(infos), __version__)
    plugin = worker_setup_plugin()
    client.register_plugin(plugin, name=plugin.name)
    return infos


def check_imports(client: Any, modules: list[str], why: str) -> None:
    """Refuse, before any block, workers that cannot import ``modules`` (a black-box teacher's).

    Raises
    ------
    ClusterError
        Naming each worker, the module and its import error, and what to do.
    """
    from .worker import try_imports

    answers = client.run(try_imports, list(modules), on_error="return")
    problems = []
    for addr, answer in sorted(answers.items()):
        if isinstance(answer, BaseException):
            problems.append(f"worker {addr} could not run the import check ({type(answer).__name__}: {answer})")
            continue
        problems += [f"worker {addr} cannot import '{m}' ({e})" for m, e in answer.items() if e is not None]
    if problems:
        raise ClusterError(
            f"{why}: " + "; ".join(problems) + ". Install the module on every worker, or put its folder on the "
            "workers' PYTHONPATH, and restart them; no block was run"
        )


def connection_lost(client: Any, err: BaseException) -> bool:
    """Whether a failed future means the scheduler is gone (not that its block failed)."""
    import asyncio

    from distributed.comm.core import CommClosedError

    if getattr(client, "status", "running") not in ("running", "newly-created"):
        return True
    if isinstance(err, (ConnectionError, CommClosedError)):
        # the client's own link broke (seen as ConnectionResetError when the scheduler dies mid-gather)
        return True
    return isinstance(err, asyncio.CancelledError) and "scheduler-connection-lost" in str(getattr(err, "reason", err))
