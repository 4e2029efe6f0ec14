"""The ``basic`` family: count, Σy, Σy², Σx, Σxxᵀ, Σy·x."""

from __future__ import annotations

import numpy as np

from ...config import BasicConfig
from .base import Statistic, Var
from .build import FamilyContext

__all__ = ["BasicMoments"]


class BasicMoments(Statistic):
    """count (from the ledger), Σy, Σy², Σx, Σxxᵀ, Σy·x."""

    name = "basic"

    def __init__(self, d: int):
        self.d = d

    @classmethod
    def from_config(cls, section: BasicConfig, ctx: FamilyContext) -> Statistic:
        """The ``basic`` section's statistic (it has no options)."""
        return ctx.per_output(lambda j: BasicMoments(ctx.d))

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
