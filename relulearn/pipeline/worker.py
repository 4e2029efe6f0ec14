"""What every worker process gets, whoever started it (docs/design.md §4, §9).

A ``LocalCluster`` started by relulearn and a ``dask worker`` started by hand (or by a
batch system, a compose file, a Kubernetes operator) must compute the same bits at the
same speed. The treatment is applied in three places, so that no route misses it:

* :func:`compute_block` (in ``blocks.py``) tunes malloc once per process, limits BLAS to
  one thread per task and copies every array it uses into aligned memory;
* :func:`worker_setup_plugin`, a worker plugin the driver registers on connecting, applies the
  process-wide part (malloc, one BLAS thread) as soon as a worker joins;
* ``dask worker --preload relulearn.pipeline.worker`` does the same at start-up (the
  recipes in ``deploy/`` use it).

:func:`worker_probe` is what the driver runs on every worker before any block: it must
not import relulearn at module level on the worker, so it is shipped by value.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["platform_id", "tune_malloc", "worker_setup_plugin", "probe_source", "dask_setup", "make_probe"]

_MALLOC_TUNED = False


def tune_malloc() -> None:
    """Keep batch-sized arrays on the heap in this process (once per process).

    Workers started by ``dask worker`` or a nanny carry ``MALLOC_TRIM_THRESHOLD_``, which
    switches glibc to a fixed 128 kB mmap threshold; then each batch array is mmapped and
    page-faulted anew (measured: +30 % wall time per block).
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 * 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


@functools.lru_cache(maxsize=1)
def platform_id() -> str:
    """The numpy version and BLAS kernel of this process, e.g. ``numpy 2.4.6; openblas 0.3.31 SkylakeX``.

    Bitwise equality holds between blocks computed under the same id; blocks computed
    under different BLAS kernels agree within rounding only. Recorded per ledger row.
    """
    import numpy as np
    from threadpoolctl import threadpool_info

    blas = [
        f"{i.get('internal_api', '?')} {i.get('version', '?')} {i.get('architecture') or ''}".strip()
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    # sorted: threadpoolctl lists the loaded libraries (numpy's and scipy's OpenBLAS) in load order,
    # which differs between processes; the id must not
    return f"numpy {np.__version__}; " + (", ".join(sorted(blas)) if blas else "no BLAS found")


def _single_blas_thread() -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def worker_setup_plugin() -> Any:
    """A worker plugin (``WorkerSetup``): one BLAS thread and adaptive malloc in every worker
    process. Registered by the driver (``client.register_plugin``) once the workers' versions
    have been checked; it also applies to workers that join later. (Built on demand so that
    importing relulearn does not import ``distributed``.)"""
    from distributed.diagnostics.plugin import WorkerPlugin

    class WorkerSetup(WorkerPlugin):
        name = "relulearn-setup"
        idempotent = True

        def setup(self, worker: Any) -> None:  # noqa: ARG002 - WorkerPlugin signature
            tune_malloc()
            _single_blas_thread()

    return WorkerSetup()


def dask_setup(worker: Any) -> None:  # noqa: ARG001 - the --preload hook's signature
    """``dask worker --preload relulearn.pipeline.worker``: set the process up at start-up."""
    tune_malloc()
    _single_blas_thread()


def try_imports(modules: list[str]) -> dict[str, str | None]:
    """Import each module; None where it worked, else the error (run on every worker)."""
    import importlib

    out: dict[str, str | None] = {}
    for m in modules:
        try:
            importlib.import_module(m)
            out[m] = None
        except Exception as err:  # noqa: BLE001 - reported to the driver, which names the worker
            out[m] = f"{type(err).__name__}: {err}"
    return out


# The probe runs on workers that may lack relulearn or have another version, so it must not
# be pickled by reference to this module: it is compiled from this source under a module
# name that does not exist on any worker, and cloudpickle then ships it by value.
probe_source = """
def worker_probe():
    import os, sys
    info = {"executable": sys.executable}
    try:
        import relulearn
        info["relulearn"] = getattr(relulearn, "__version__", "unknown")
        info["relulearn_path"] = os.path.dirname(relulearn.__file__)
    except Exception as err:
        info["relulearn"] = None
        info["relulearn_error"] = f"{type(err).__name__}: {err}"
    return info
"""


def make_probe():
    """The probe function, compiled so that cloudpickle ships it by value."""
    namespace: dict[str, Any] = {"__name__": "relulearn_worker_probe"}
    exec(compile(probe_source, "<relulearn worker probe>", "exec"), namespace)  # noqa: S102 - our own source
    return namespace["worker_probe"]
