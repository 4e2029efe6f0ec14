"""Where a method's work runs: candidate batches mapped on the cluster or in process, and the held-out samples
a method draws, the same wherever they are drawn."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

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
