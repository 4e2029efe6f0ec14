"""The ``basic`` family: count, Σy, Σy², Σx, Σxxᵀ, Σy·x."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config import BasicConfig
from .base import Statistic, Var
from .build import FamilyContext
from .family import Family
from .work import F, Work, syrk

__all__ = ["BasicMoments"]


class BasicMoments(Family):
    """count (from the ledger), Σy, Σy², Σx, Σxxᵀ, Σy·x."""

    name = "basic"
    descriptions = {
        "y": ("mean label", "E[y]"),
        "yy": ("mean squared label", "E[y²]"),
        "x": ("mean input", "E[x] (0 for standard Gaussian inputs)"),
        "xx": ("second moment of the inputs", "E[x xᵀ] (the identity for standard Gaussian inputs)"),
        "yx": ("first Hermite coefficient", "E[y x]: the label's first Hermite coefficient T_1"),
    }

    def __init__(self, d: int):
        self.d = d

    @classmethod
    def from_config(cls, section: BasicConfig, ctx: FamilyContext) -> Statistic:
        """The ``basic`` section's statistic (it has no options)."""
        return ctx.per_output(lambda j: BasicMoments(ctx.d))

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """One syrk ``Xᵀ X`` for all outputs (label-free); the label's sums per output."""
        return Work((syrk(d),), stream=F * 3 * d * outputs)

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        n = d * d + 2 * d + 2
        return n * outputs, n * outputs

    def sums_schema(self) -> dict[str, Var]:
        d = self.d
        return {
            "y": Var((), ()),
            "yy": Var((), ()),
            "x": Var(("i",), (d,)),
            "xx": Var(("i", "j"), (d, d)),
            "yx": Var(("i",), (d,)),
        }

    def label_free_sums(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The batch sums that do not involve the label: computed once for all outputs of a
        vector source (:class:`PerOutput`), then added to each output's accumulator."""
        return {"x": x.sum(axis=0), "xx": x.T @ x}  # numpy dispatches Xᵀ X to a BLAS-3 syrk

    def label_update(self, acc, x, y):
        acc["y"] += y.sum()
        acc["yy"] += y @ y
        acc["yx"] += y @ x

    def update(self, acc, x, y):
        self.label_update(acc, x, y)
        for k, v in self.label_free_sums(x).items():
            acc[k] += v
