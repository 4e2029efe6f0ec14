"""The statistics a run's configuration asks for, built: each section's family from the registry of
:mod:`.stats.registry`, with their direction banks, τ grids and control
variates resolved (drawn by their pilot passes, or read from the store).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from ..config import RunConfig
from .sources import Source, check_finite, label_outputs, pilot_batches
from .stats.base import Statistic
from .stats.build import FamilyContext, Pilot
from .stats.per_output import stored_outputs
from .stats.registry import FAMILIES

__all__ = ["build_statistics"]


def build_statistics(
    cfg: RunConfig, source: Source | None, stored: Callable[[str], Mapping[str, np.ndarray]] | None = None
) -> list[Statistic]:
    """The statistics a configuration asks for (:func:`_build_statistics`), their pilot passes (τ grids, the
    control variate) on one BLAS thread: the same grids in any process, whatever its thread count."""
    from ..aligned import one_blas_thread

    with one_blas_thread():
        return _build_statistics(cfg, source, stored)


def _build_statistics(
    cfg: RunConfig, source: Source | None, stored: Callable[[str], Mapping[str, np.ndarray]] | None = None
) -> list[Statistic]:
    """The statistics a configuration asks for, with resolved direction banks and τ grids.

    ``stored(name)``, when given, returns a committed statistic's arrays: its direction
    bank and τ grid are then taken from the store instead of being drawn again.

    For a source with ``m`` outputs (a label vector), every family but ``output_moments``
    (natively per output) is a :class:`~.stats.per_output.PerOutput` of ``m`` statistics, one per output,
    with τ grids from each output's pilot quantiles. Without a source, ``m`` is read from the store.
    """
    sections = cfg.statistics.enabled()
    if stored is not None:
        cache: dict[str, Mapping[str, np.ndarray]] = {}
        read = stored

        def stored(name: str) -> Mapping[str, np.ndarray]:  # each group is read once
            if name not in cache:
                cache[name] = read(name)
            return cache[name]

    m = label_outputs(source) if source is not None else stored_outputs(sections, stored) if stored else None
    ctx = FamilyContext(cfg, None if source is None else _pilot(source, cfg.seed), stored, m)
    # in the configuration's order: the pilot passes draw from their streams in the same order as ever
    return [FAMILIES[name].from_config(section, ctx) for name, section in sections.items()]


def _pilot(source: Source, seed: int) -> Pilot:
    """The pilot pass of ``source`` (:func:`.sources.pilot_batches`, the same samples on every call), each batch
    checked for NaN and inf (an error names the row)."""

    def pilot(n: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        row = 0
        for x, y in pilot_batches(source, seed, n):
            check_finite(x, y, None, row)
            row += len(y)
            yield x, y

    return pilot
