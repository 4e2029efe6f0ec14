"""Control variates for the labels' first and second Hermite moments (per output).

For any model ``f`` whose moments are known in closed form, ``T_l(y) = T_l(f) + E[(y − f(x)) He_l(x)]``: only
the second term is sampled, and its noise is that of the residual labels ``y − f(x)``, not of the labels. The
model here is the labels' own expansion to degree two (:class:`Quadratic`) built from the current estimate, kept
inside the estimate's significant subspace: it removes the labels' affine and quadratic parts, which hold most of
their variance for a ReLU network (for relu(z) the degree ≥ 3 terms hold 3 % of the variance), so the same
number of fresh samples gives a noise floor several times lower, and each round's better estimate makes the next
round's residual smaller. The noise of a moment falls as the residual's scale: a residual at a third of the labels'
scale is worth nine times the samples.

The sampled term is a mapped sum over independent parts of the held-out stream (:class:`ResidualMoments` on a
worker, one ``(m, d, d)`` array back per part); its standard errors are the spread of the parts' means. Each round's
estimate is unbiased whatever the model (the model only changes the variance).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...hermite.contracted import _GRAM_BLOCK, _add_signed_grams, _mirror_upper
from ..base import part_batches

#: parts of the residual's sample (their spread gives the standard errors), each of at least ``MIN_ROWS`` rows
PARTS, MIN_ROWS = 24, 1_000

#: parts mapped at a time (each returns m d² floats; a window bounds the driver's memory)
WINDOW = 4


@dataclass(frozen=True)
class Quadratic:
    """The labels' Hermite expansion to degree two, ``f(x) = A + T_1 x + ½⟨T_2, x xᵀ − I⟩`` per output, with
    ``T_2 = V S Vᵀ`` inside an orthonormal basis ``V`` (d × r): its moments are itself (``T_1``, ``T_2``) and a
    sample costs ``d r + m r²`` multiply-adds, not ``m d²``."""

    a: np.ndarray  # (m,)
    t1: np.ndarray  # (m, d)
    basis: np.ndarray  # (d, r)
    core: np.ndarray  # (m, r, r), symmetric

    @property
    def input_dim(self) -> int:
        return int(self.t1.shape[1])

    @property
    def output_dim(self) -> int:
        return int(self.t1.shape[0])

    def forward(self, x: np.ndarray) -> np.ndarray:
        m, r = self.core.shape[0], self.core.shape[1]
        z = x @ self.basis
        zs = (z @ self.core.transpose(1, 0, 2).reshape(r, m * r)).reshape(len(z), m, r)
        quad = np.einsum("njb,nb->nj", zs, z) - np.trace(self.core, axis1=1, axis2=2)[None, :]
        return self.a[None, :] + x @ self.t1.T + 0.5 * quad

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """``(T_1, T_2)``: ``(m, d)`` and ``(m, d, d)``."""
        return self.t1, np.stack([self.basis @ c @ self.basis.T for c in self.core])


def quadratic(a: np.ndarray, t1: np.ndarray, t2: np.ndarray, basis: np.ndarray) -> Quadratic:
    """:class:`Quadratic` from estimated moments, ``T_2`` kept inside ``span(basis)`` (outside it the estimate is
    noise: adding it would add its noise to the residual)."""
    sym = 0.5 * (t2 + t2.transpose(0, 2, 1))
    return Quadratic(
        np.asarray(a, dtype=np.float64),
        np.asarray(t1, dtype=np.float64),
        basis,
        np.stack([basis.T @ s @ basis for s in sym]),
    )


@dataclass(frozen=True)
class ResidualMoments:
    """Picklable: the means of ``r``, ``r_j x`` and ``r_j (x xᵀ − I)`` of the residual labels ``r = y − f(x)`` over
    one part of a draw (what a mapper runs on a worker); ``model`` has ``forward``, ``input_dim``, ``output_dim``."""

    draw: Any
    model: Any

    def __call__(self, item: tuple[int, int]) -> dict[str, np.ndarray]:
        p, n = item
        d, m = self.model.input_dim, self.model.output_dim
        s0, s1, s2 = np.zeros(m), np.zeros((m, d)), np.zeros((m, d, d))
        buf = np.empty((max(1, _GRAM_BLOCK // d), d))
        for x, y in part_batches(self.draw, p, n):
            r = y.reshape(len(y), -1) - self.model.forward(x)
            s0 += r.sum(axis=0)
            s1 += r.T @ x
            _add_signed_grams(s2, np.require(x, requirements=("C", "A")), r, buf)
        _mirror_upper(s2)
        return {"A": s0 / n, "T1": s1 / n, "T2": s2 / n - (s0 / n)[:, None, None] * np.eye(d)}


def residual_parts(total: int, first: int) -> list[tuple[int, int]]:
    """``(part id, rows)``: ``total`` samples in :data:`PARTS` equal parts (fewer when that would leave a part
    under :data:`MIN_ROWS` rows; at least two), ids from ``first``."""
    count = max(2, min(PARTS, int(total) // MIN_ROWS))
    base = max(1, int(total) // count)
    return [(first + i, base) for i in range(count)]


def residual_moments(
    draw: Any, model: Any, parts: list[tuple[int, int]], mapper: Callable = map
) -> dict[str, np.ndarray]:
    """The mean over ``parts`` of :class:`ResidualMoments` and its standard error (the parts' spread), as an
    ``output_moments`` group: ``A``, ``T1``, ``T2`` and their ``_se``, and ``count``. Parts are mapped
    :data:`WINDOW` at a time and merged as they come (Welford), so the driver holds a window, not every part."""
    fn = ResidualMoments(draw, model)
    mean: dict[str, np.ndarray] = {}
    m2: dict[str, np.ndarray] = {}
    seen = 0
    for start in range(0, len(parts), WINDOW):
        for got in mapper(fn, parts[start : start + WINDOW]):
            seen += 1
            for key, value in got.items():
                if key not in mean:
                    mean[key], m2[key] = np.array(value, dtype=np.float64), np.zeros_like(value, dtype=np.float64)
                    continue
                delta = value - mean[key]
                mean[key] += delta / seen
                m2[key] += delta * (value - mean[key])
    out = dict(mean)
    for key in mean:
        out[f"{key}_se"] = np.sqrt(m2[key] / (seen - 1) / seen)
    out["count"] = np.asarray(sum(n for _, n in parts))
    return out


def controlled(residual: dict[str, np.ndarray], model: Quadratic) -> dict[str, np.ndarray]:
    """The labels' ``T_1`` and ``T_2`` per output: the model's own plus the residual's sampled moments, with the
    residual's standard errors (the model's part has none)."""
    t1, t2 = model.moments()
    t2 = t2 + residual["T2"]
    return {
        "A": model.a + residual["A"],
        "A_se": residual["A_se"],
        "T1": t1 + residual["T1"],
        "T1_se": residual["T1_se"],
        "T2": 0.5 * (t2 + t2.transpose(0, 2, 1)),
        "T2_se": residual["T2_se"],
        "count": residual["count"],
    }
