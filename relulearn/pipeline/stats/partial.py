"""The driver-side bookkeeping of the statistics: the merged sums of a run of chunks (:class:`Partial`, added
in chunk order) and the reduction of chunks into one (:func:`accumulate_chunks`), the same in a worker, in a
single-process loop and in tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..sources import LabelShapeError, Source, at_rows, check_finite, chunk_batches
from .base import Statistic

__all__ = ["Partial", "accumulate_chunks"]


@dataclass
class Partial:
    """Merged sums of a run of consecutive whole chunks.

    ``sums[stat][array]`` are accumulator sums; ``sumsq[stat][term]`` are sums over
    chunks of the squared per-chunk estimand sums (for standard errors).
    """

    chunk_start: int
    chunk_stop: int
    sums: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    sumsq: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    #: numpy version and BLAS kernel that computed the block (``worker.platform_id``)
    platform: str = ""

    @property
    def n_chunks(self) -> int:
        return self.chunk_stop - self.chunk_start

    @classmethod
    def empty(cls, stats: Iterable[Statistic], at: int = 0) -> Partial:
        p = cls(at, at)
        for s in stats:
            p.sums[s.name] = s.init()
            p.sumsq[s.name] = {k: np.zeros(v.shape) for k, v in s.terms_schema().items()}
        return p

    def add(self, other: Partial) -> Partial:
        """Add the partial of the chunks right after this one, in place (order matters for bits)."""
        if other.chunk_start != self.chunk_stop:
            raise ValueError(
                f"partials must be merged in chunk order: have chunks [{self.chunk_start}, {self.chunk_stop}), "
                f"got [{other.chunk_start}, {other.chunk_stop})"
            )
        for name, arrays in other.sums.items():
            for k, v in arrays.items():
                self.sums[name][k] += v
            for k, v in other.sumsq[name].items():
                self.sumsq[name][k] += v
        self.chunk_stop = other.chunk_stop
        return self

    def nbytes(self) -> int:
        return sum(v.nbytes for g in (self.sums, self.sumsq) for a in g.values() for v in a.values())


def accumulate_chunks(
    stats: list[Statistic], source: Source, seed: int, chunk_size: int, chunk_start: int, chunk_stop: int
) -> Partial:
    """Reduce chunks ``[chunk_start, chunk_stop)`` into one :class:`Partial`, in chunk order."""
    part = Partial.empty(stats, chunk_start)
    for chunk_id in range(chunk_start, chunk_stop):
        accs = {s.name: s.init() for s in stats}
        row = 0
        try:
            for x, y in chunk_batches(source, seed, chunk_id, chunk_size):
                check_finite(x, y, chunk_id, row)
                for s in stats:
                    s.update(accs[s.name], x, y)
                row += len(y)
        except LabelShapeError as err:  # a black-box teacher's answer: name the chunk and row
            raise at_rows(err, chunk_id, row) from None
        for s in stats:
            sums = part.sums[s.name]
            for k, v in accs[s.name].items():
                sums[k] += v
            sq = part.sumsq[s.name]
            for k, v in s.terms(accs[s.name]).items():
                sq[k] += v * v
        part.chunk_stop = chunk_id + 1
    return part
