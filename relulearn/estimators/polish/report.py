"""What a polish did (:mod:`.polish.dense` and its matrix-free steps, :mod:`.polish.cg`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PolishReport"]


@dataclass(frozen=True)
class PolishReport:
    """What polish did: iterations, whether the patterns converged, the final residual.

    ``converged`` is true when the patterns reached a fixed point, or a cycle (possible
    with noisy labels, where a few samples at a boundary can flip back and forth); the
    returned network is the iterate with the smallest residual on all samples.
    """

    iterations: int
    converged: bool
    relative_residual: float
    samples_used: int
    pattern_changes: tuple[int, ...]
    stop_reason: str = "fixed point"  # or "cycle" (patterns repeat), "no descent" (matrix-free), or "max_iter"
    linear: np.ndarray | None = None  # with ``affine``: the free linear term, (m, d)
    cg_iterations: tuple[int, ...] = ()  # matrix-free steps (:mod:`.polish.cg`): conjugate-gradient iterations
