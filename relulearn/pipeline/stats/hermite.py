"""The ``hermite`` family: the full Hermite tensors ``T_l = E[y He_l(x)]``, packed."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ... import hermite  # (relulearn.hermite: the tensor algebra this family's module is named after)
from ...config import HermiteConfig
from .base import Statistic, Var
from .build import FamilyContext
from .expansion import expansion_setup, output_expansion
from .family import Family
from .work import F, Work, option

__all__ = ["HermiteTensors", "n_unique", "packed_entries"]


class HermiteTensors(Family):
    """Full Hermite tensors ``T_l = E[y He_l(x)]``, ``l ≤ L``, packed (unique entries).

    Accumulated as raw weighted moments ``Σ y x^{⊗m}`` and converted exactly by the
    matching sum (:func:`relulearn.hermite.raw_to_hermite`).
    """

    name = "hermite"
    descriptions = {
        "expansion_t0": ("expansion: constant", "t0 of the degree-≤2 expansion subtracted from the labels"),
        "expansion_t1": ("expansion: linear part", "t1 of the degree-≤2 expansion subtracted from the labels"),
        "expansion_t2": (
            "expansion: quadratic part",
            "t2 of the degree-≤2 expansion subtracted from the labels (y − t0 − <t1, x> − ½<t2, xxᵀ − I>)",
        ),
        "basis": ("subspace basis", "orthonormal rows P: the tensors are those of z = P x"),
    }
    #: the arrays of each order l (``T{l}``, ``index{l}``): their words, with ``{l}`` the order
    ordered = {
        "T": (
            "Hermite coefficients of order {l}",
            "E[y He_α(x)] for the sorted multi-indices α of `index{l}` (one "
            "entry per multiset of {l} input axes; a symmetric tensor packed)",
        ),
        "index": ("multi-indices of order {l}", "the sorted input axes (α_1 ≤ … ≤ α_{l}) of each packed entry"),
    }

    def __init__(self, d: int, cfg: HermiteConfig, expansion: tuple | None = None):
        self.d, self.max_order = d, cfg.max_order
        self.sizes = [n_unique(d, m) for m in range(self.max_order + 1)]
        total = sum(self.sizes)
        if total > cfg.max_entries:
            raise ValueError(
                f"statistics.hermite: T_0..T_{self.max_order} at d={d} have {total:,} unique entries, more than "
                f"max_entries={cfg.max_entries:,}; lower max_order, raise max_entries, or use the "
                "`contracted` statistic, which never forms the full tensor"
            )
        self.expansion = expansion

    @classmethod
    def from_config(cls, section: HermiteConfig, ctx: FamilyContext) -> Statistic:
        """The ``hermite`` section's tensors, on each output's residual labels when it gives an expansion."""
        d, m = ctx.d, ctx.outputs
        return ctx.per_output(lambda j: HermiteTensors(d, section, _hermite_expansion(section, d, m, j)))

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """The raw moments' blocked GEMMs, and the packed sums added per output."""
        order = int(option(section, "max_order") or 4)
        return Work(
            ((float(hermite.raw_moment_flops(d, order)), d),), stream=F * 2 * math.comb(d + order // 2, order // 2)
        ).scaled(outputs)

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        n = packed_entries(d, int(option(section, "max_order") or 4))
        return n * outputs, n * outputs

    @classmethod
    def describe(cls, name: str) -> tuple[str, str] | None:
        m = re.fullmatch(r"(T|index)(\d+)", name)
        if m:
            long_name, text = cls.ordered[m.group(1)]
            return long_name.format(l=m.group(2)), text.format(l=m.group(2))
        return super().describe(name)

    def sums_schema(self):
        return {f"raw{m}": Var((f"entry{m}",), (s,)) for m, s in enumerate(self.sizes)}

    def terms_schema(self):
        return {f"T{m}": Var((f"entry{m}",), (s,)) for m, s in enumerate(self.sizes)}

    def coords(self):
        out = {
            f"index{m}": ((f"entry{m}", f"axis{m}"), hermite.unique_indices(self.d, m))
            for m in range(1, self.max_order + 1)
        }
        if self.expansion is not None:
            t0, t1, t2 = self.expansion
            out.update(
                {
                    "expansion_t0": (("scalar",), np.array([t0])),
                    "expansion_t1": (("i",), t1),
                    "expansion_t2": (("i", "j"), t2),
                }
            )
        return out

    def labels(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The labels the tensors are taken of: ``y``, or ``y`` less the expansion (residual labels)."""
        return y if self.expansion is None else hermite.subtract_expansion(x, y, *self.expansion)

    def update(self, acc, x, y):
        self._accumulate(acc, x, self.labels(x, y))

    def _accumulate(self, acc: dict[str, np.ndarray], z: np.ndarray, y: np.ndarray) -> None:
        """Add the packed raw sums ``Σ y z^{⊗m}``, ``m ≤ max_order``, of inputs ``z``."""
        for m, s in enumerate(hermite.raw_moment_sums_upto(z, y, self.max_order)):
            acc[f"raw{m}"] += s

    def terms(self, acc):
        raw = {m: np.asarray(acc[f"raw{m}"]) for m in range(self.max_order + 1)}
        return {f"T{l}": hermite.raw_to_hermite(raw, self.d, l) for l in range(self.max_order + 1)}

    def config(self):
        # the residual flag only when set: stores made before the option keep their fingerprint
        return {"max_order": self.max_order, **({"residual_labels": True} if self.expansion is not None else {})}


def n_unique(d: int, m: int) -> int:
    from math import comb

    return comb(d + m - 1, m)


def packed_entries(dim: int, order: int) -> int:
    """Unique entries of the tensors of orders 0..``order`` in ``dim`` coordinates."""
    return sum(math.comb(dim + j - 1, j) for j in range(order + 1))


def _hermite_expansion(section: HermiteConfig, d: int, m: int | None, j: int | None) -> tuple | None:
    """Output ``j``'s expansion ``(t0, t1, t2)`` of a ``hermite`` section (None: none given)."""
    exp, where = output_expansion(section, m, j, "statistics.hermite")
    return expansion_setup(exp, d, where)
