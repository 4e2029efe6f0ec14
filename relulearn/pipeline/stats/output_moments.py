"""The ``output_moments`` family: moments of the label vector up to ``E[A_j (x xᵀ − I)]``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config import OutputMomentsConfig
from ...hermite.contracted import _GRAM_BLOCK, _SYRK_MIN_D, _add_signed_grams, _mirror_upper
from .base import Statistic, Var
from .build import FamilyContext
from .family import Family
from .work import F, Work, gram_work

__all__ = ["OutputMoments"]

#: bytes of the weighted copy ``xw`` of a row batch in :class:`OutputMoments` (rows are cut to fit)
_XW_BYTES = 32 * 2**20


class OutputMoments(Family):
    """Moments of the label vector ``A`` (``m`` outputs; ``m = 1`` for a scalar label).

    Estimands: ``A = E[A]`` (output,), ``AA = E[A Aᵀ]`` (output, output2),
    ``T1 = E[A_j x]`` (output, i) and ``T2 = E[A_j (x xᵀ − I)]`` (output, i, j). The d × d
    part is, per output, two symmetric rank-k updates (rows with positive and with negative label,
    ``m d (d + 1)`` flops per sample); below d = 64, one GEMM per row batch for all outputs,
    ``xwᵀ x`` with ``xw[s, j·d + i] = A_j(x_s) x_{s,i}`` (2 m d² flops per sample).
    """

    name = "output_moments"
    descriptions = {
        "A": ("mean output", "E[A_j] per output j"),
        "AA": ("outputs' second moment", "E[A_j A_k] per pair of outputs"),
        "T1": ("first Hermite coefficient per output", "E[A_j x]"),
        "T2": ("second Hermite coefficient per output", "E[A_j (x xᵀ − I)]"),
    }

    def __init__(self, d: int, outputs: int = 1):
        self.d, self.outputs = d, int(outputs)

    @classmethod
    def from_config(cls, section: OutputMomentsConfig, ctx: FamilyContext) -> Statistic:
        """The ``output_moments`` section's statistic: natively one set of moments per output, never wrapped."""
        return OutputMoments(ctx.d, ctx.outputs or 1)

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """Natively per output: a Gram per output and one product for ``Σ A_j x``."""
        m = outputs
        return gram_work(d, m) + Work(((2.0 * m * d, m),), stream=F * 2 * d)

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        m = outputs
        n = m * d * d + m * d + m * m + m
        return n, n

    def sums_schema(self):
        m, d = self.outputs, self.d
        return {
            "a": Var(("output",), (m,)),
            "aa": Var(("output", "output2"), (m, m)),
            "ax": Var(("output", "i"), (m, d)),
            "axx": Var(("output", "i", "j"), (m, d, d)),
        }

    def terms_schema(self):
        m, d = self.outputs, self.d
        return {
            "A": Var(("output",), (m,)),
            "AA": Var(("output", "output2"), (m, m)),
            "T1": Var(("output", "i"), (m, d)),
            "T2": Var(("output", "i", "j"), (m, d, d)),
        }

    def coords(self):
        return {"output": (("output",), np.arange(self.outputs, dtype=np.int64))}

    def update(self, acc, x, y):
        a = y[:, None] if y.ndim == 1 else y
        n, d = x.shape
        m = a.shape[1]
        acc["a"] += a.sum(axis=0)
        acc["aa"] += a.T @ a
        acc["ax"] += a.T @ x
        if d >= _SYRK_MIN_D:
            # Σ a_j x xᵀ as two symmetric rank-k updates per output (d(d+1) flops per sample, half a
            # GEMM's), then mirrored: 1.5× faster than the GEMM below at d = 512
            quad = np.zeros((m, d, d))
            _add_signed_grams(
                quad, np.require(x, requirements=("C", "A")), a, np.empty((max(1, min(n, _GRAM_BLOCK // d)), d))
            )
            _mirror_upper(quad)
            acc["axx"] += quad
            return
        # rows per GEMM so that the weighted copy xw (rows × m d) stays below _XW_BYTES
        step = max(1, _XW_BYTES // (8 * m * d))
        for start in range(0, n, step):
            xs, ws = x[start : start + step], a[start : start + step]
            xw = (ws[:, :, None] * xs[:, None, :]).reshape(len(xs), m * d)
            acc["axx"] += (xw.T @ xs).reshape(m, d, d)

    def terms(self, acc):
        a = acc["a"]
        return {"A": a, "AA": acc["aa"], "T1": acc["ax"], "T2": acc["axx"] - a[:, None, None] * np.eye(self.d)}

    def config(self):
        return {"outputs": self.outputs}
