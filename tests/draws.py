"""Planted teachers' samples drawn by part, as a learn's sample draws are."""

from __future__ import annotations

import numpy as np

from relulearn.network import Network


class Draw:
    """Parts of a planted teacher's samples, keyed by part id (what ``SampleDraw.part`` promises)."""

    def __init__(self, teacher: Network, d: int, noise: float = 0.0):
        self.teacher, self.d, self.noise = teacher, d, noise

    def part(self, p: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([7, p])
        x = rng.standard_normal((n, self.d))
        return x, self.teacher.forward(x)[:, 0] + self.noise * rng.standard_normal(n)
