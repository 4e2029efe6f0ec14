"""Scores over the pilot pass, per output of a label vector: what the τ grids of the ``filtered`` and
``residual`` families (and their sketches) are quantiles of.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

__all__ = ["pilot_scores", "label_scores"]


def pilot_scores(
    batches: Iterable[tuple[np.ndarray, np.ndarray]], score: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
    """``score(x, y)`` (shape (..., rows)) over the pilot pass's ``batches``, concatenated along rows."""
    return np.concatenate([score(x, y) for x, y in batches], axis=-1)


def label_scores(
    outputs: int | None, score: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``score`` of a scalar label, applied to each of the ``outputs`` of a label vector and stacked along a
    leading ``output`` axis; ``score`` itself for a scalar label (``outputs`` None)."""
    m = outputs
    if m is None:
        return score
    return lambda x, y: np.stack([score(x, y[:, j]) for j in range(m)])
