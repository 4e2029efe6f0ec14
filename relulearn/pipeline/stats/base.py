"""The protocol every statistic family follows (``init / update / terms / finalize``), and the array
declarations (:class:`Var`) and finalized entries (:class:`Estimate`) it speaks in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["Var", "Estimate", "Statistic"]


@dataclass(frozen=True)
class Var:
    """Shape and dimension names of one array."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Estimate:
    """A finalized statistic entry: its mean and standard error, with dimension names."""

    dims: tuple[str, ...]
    mean: np.ndarray
    se: np.ndarray


class Statistic(ABC):
    """One family of sufficient statistics.

    Subclasses declare the arrays of their accumulator (``sums``) and of their
    estimands (``terms``), and provide coordinates that describe them (direction banks,
    τ grids, index tables), which are stored next to the sums.
    """

    name: str

    @abstractmethod
    def sums_schema(self) -> dict[str, Var]:
        """Arrays of the accumulator."""

    def terms_schema(self) -> dict[str, Var]:
        """Arrays of the estimands; by default the accumulator's own arrays."""
        return self.sums_schema()

    def coords(self) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """Arrays that describe the statistic (stored, never summed)."""
        return {}

    def init(self) -> dict[str, np.ndarray]:
        return {k: np.zeros(v.shape) for k, v in self.sums_schema().items()}

    @abstractmethod
    def update(self, acc: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> None:
        """Add the sums of a batch ``x`` (n, d), ``y`` (n,) — (n, m) for the statistics of a
        label vector (:class:`PerOutput`, :class:`OutputMoments`) — to ``acc`` in place."""

    def terms(self, acc: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Linear map from accumulated sums to sums of the estimands."""
        return dict(acc)

    def finalize(
        self, sums: Mapping[str, np.ndarray], sumsq: Mapping[str, np.ndarray], n_chunks: int, chunk_size: int
    ) -> dict[str, Estimate]:
        """Means and standard errors of the estimands from the merged sums.

        The standard error of a mean over ``K`` equal chunks of ``B`` samples is the
        sample standard deviation of the chunk means over ``sqrt(K)``; it is NaN for
        ``K < 2``.
        """
        n = n_chunks * chunk_size
        schema = self.terms_schema()
        out = {}
        for name, total in self.terms(sums).items():
            mean = total / n
            if n_chunks >= 2:
                var = (sumsq[name] / chunk_size**2 - n_chunks * mean**2) / (n_chunks - 1)
                se = np.sqrt(np.maximum(var, 0.0) / n_chunks)
            else:
                se = np.full_like(mean, np.nan)
            out[name] = Estimate(schema[name].dims, mean, se)
        return out

    def config(self) -> dict:
        """The options that define this statistic (part of the run's fingerprint)."""
        return {}
