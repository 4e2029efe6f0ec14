"""Scores over the pilot pass, per output of a label vector: what the τ grids of the ``filtered`` and
``residual`` families (and their sketches) are quantiles of.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..sources import Source, check_finite, label_outputs, pilot_batches

__all__ = ["pilot_scores", "label_scores"]


def pilot_scores(
    source: Source, seed: int, n: int, score: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
    """``score(x, y)`` (shape (..., rows)) over the pilot pass, concatenated along rows."""
    parts, row = [], 0
    for x, y in pilot_batches(source, seed, n):
        check_finite(x, y, None, row)
        parts.append(score(x, y))
        row += len(y)
    return np.concatenate(parts, axis=-1)


def label_scores(
    source: Source, score: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``score`` of a scalar label, applied to every output of a vector source and stacked
    along a leading ``output`` axis; ``score`` itself for a scalar source."""
    m = label_outputs(source)
    if m is None:
        return score
    return lambda x, y: np.stack([score(x, y[:, j]) for j in range(m)])
