"""The ``filtered`` family: ``E[1{|y|>τ}(xxᵀ − I)]`` for a grid of τ, from bins of |y|; its τ grid, and the
binned Gram products and suffix sums the residual and sketch families share.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config import FilteredConfig
from .base import Statistic, Var
from .build import FamilyContext, Pilot, drawn
from .family import Family
from .per_output import of_output
from .pilot import label_scores, pilot_scores
from .work import Work, gram_work, grid_size, option

__all__ = ["FilteredMoments", "threshold_grid", "binned_gram", "suffix_sums"]


def threshold_grid(cfg: FilteredConfig, pilot: Pilot, outputs: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The τ grid: given thresholds, or quantiles of |y| over the pilot pass (``pilot``: see
    :class:`.build.FamilyContext`).

    Returns ``(tau, quantiles)``; ``quantiles`` is None when τ was given. For a source with
    ``m`` outputs and quantiles, ``tau`` has shape (m, T): the quantiles of each ``|A_j|``.
    """
    if cfg.thresholds is not None:
        return np.asarray(cfg.thresholds, dtype=np.float64), None
    q = np.asarray(cfg.quantiles, dtype=np.float64)
    scores = pilot_scores(pilot(cfg.pilot_samples), label_scores(outputs, lambda x, y: np.abs(y)))
    if scores.ndim == 1:
        return np.quantile(scores, q), q
    # one output at a time, on the same contiguous 1-d arrays as for a scalar source
    return np.stack([np.quantile(s, q) for s in scores]), q


def binned_gram(xx: np.ndarray, count: np.ndarray, x: np.ndarray, score: np.ndarray, tau: np.ndarray) -> None:
    """Add ``x_bᵀ x_b`` and the row count of each bin ``tau[b] < score <= tau[b+1]`` to ``xx[b]``,
    ``count[b]`` in place (rows at or below ``tau[0]`` are dropped): one d² product per row."""
    b = np.searchsorted(tau, score, side="left") - 1
    counts = np.bincount(b + 1, minlength=len(tau) + 1)[1:]
    count += counts
    for k in np.flatnonzero(counts):
        # one gather per bin, rows in sample order (the bits of the syrk depend on it);
        # no argsort and no second copy of the kept rows
        seg = x.take(np.flatnonzero(b == k), axis=0)
        xx[k] += seg.T @ seg


def suffix_sums(a: np.ndarray, axis: int) -> np.ndarray:
    """Sums over bins ``b' >= b`` (the samples past threshold ``b``) along ``axis``."""
    return np.flip(np.cumsum(np.flip(a, axis), axis=axis), axis)


class FilteredMoments(Family):
    """``M_τ = E[1{|y|>τ}(xxᵀ − I)]`` and ``P[|y|>τ]`` for a grid of τ, in one pass.

    Samples are binned by |y| between consecutive thresholds; bin sums cost one
    ``X_bᵀ X_b`` per bin (all bins together: one d² product per sample), and each
    ``M_τ`` is a suffix sum over bins.
    """

    name = "filtered"
    descriptions = {
        "M": ("filtered second moment", "M_τ = E[1{|y| > τ} (x xᵀ − I)] per threshold τ"),
        "prob": ("filter probability", "P[|y| > τ] per threshold τ"),
        "tau": ("threshold τ", "the thresholds of |y|"),
        "quantile": ("quantile of |y|", "the quantile of |y| (in the pilot pass) each τ was taken at"),
    }
    pilot_key = "pilot_samples"

    def __init__(self, d: int, tau: np.ndarray, quantiles: np.ndarray | None = None):
        self.d = d
        self.tau = np.asarray(tau, dtype=np.float64)
        self.quantiles = quantiles

    @classmethod
    def from_config(cls, section: FilteredConfig, ctx: FamilyContext) -> Statistic:
        """The ``filtered`` section's statistic: its τ grid from the pilot pass (or given), or read from the store."""
        if ctx.stored:
            arrays = ctx.stored(cls.name)
            tau, q = arrays["tau"], arrays.get("quantile")
        else:
            tau, q = threshold_grid(section, drawn(ctx.pilot), ctx.outputs)
        d = ctx.d
        return ctx.per_output(lambda j: FilteredMoments(d, of_output(tau, j, 1), of_output(q, j, 1)))

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """Per output, each row into one τ bin: one d² product per row."""
        return gram_work(d, 1).scaled(outputs)

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        n = 1 * grid_size(section) * (d * d + 1)
        return n * outputs, n * outputs

    @classmethod
    def runs_pilot(cls, section: Any) -> bool:
        """The pilot pass of a grid given as quantiles."""
        return bool(option(section, "quantiles"))

    def sums_schema(self):
        k, d = len(self.tau), self.d
        return {"bin_xx": Var(("tau", "i", "j"), (k, d, d)), "bin_count": Var(("tau",), (k,))}

    def terms_schema(self):
        k, d = len(self.tau), self.d
        return {"M": Var(("tau", "i", "j"), (k, d, d)), "prob": Var(("tau",), (k,))}

    def coords(self):
        out = {"tau": (("tau",), self.tau)}
        if self.quantiles is not None:
            out["quantile"] = (("tau",), np.asarray(self.quantiles, dtype=np.float64))
        return out

    def update(self, acc, x, y):
        binned_gram(acc["bin_xx"], acc["bin_count"], x, np.abs(y), self.tau)

    def terms(self, acc):
        count, xx = suffix_sums(acc["bin_count"], 0), suffix_sums(acc["bin_xx"], 0)
        return {"M": xx - count[:, None, None] * np.eye(self.d), "prob": count}

    def config(self):
        return {"tau": self.tau.tolist()}
