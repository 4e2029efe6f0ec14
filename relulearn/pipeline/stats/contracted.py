"""The ``contracted`` family: ``T_l(g, …, g, ·, ·)`` and its lower contractions for orders × directions, with
its direction bank and the pilot pass of its control variate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ... import hermite
from ...config import ContractedConfig
from ..batches import Stream, generator
from ..plan import check_directions
from .base import Statistic, Var
from .build import FamilyContext, drawn
from .expansion import low_rank_expansion, output_expansion
from .family import Family
from .per_output import of_output
from .work import F, Work, count, gram_work, option

__all__ = ["ContractedMoments", "direction_bank", "linear_control"]


def direction_bank(
    cfg: Any, d: int, run_seed: int, where: str = "statistics.contracted", entries: str = "d={d} entries"
) -> np.ndarray:
    """The unit directions g of a contracted statistic (``cfg``: its section, with ``directions`` and
    ``directions_seed``), shape (G, d): drawn from the directions' stream, or given. ``where`` and ``entries``
    word the error for a given bank of the wrong width."""
    if isinstance(cfg.directions, int):
        seed = run_seed if cfg.directions_seed is None else cfg.directions_seed
        g = generator(seed, Stream.DIRECTIONS).standard_normal((cfg.directions, d))
    else:
        g = np.asarray(cfg.directions, dtype=np.float64)
        if g.ndim != 2 or g.shape[1] != d:
            raise ValueError(f"{where}.directions has shape {g.shape}; each direction needs {entries.format(d=d)}")
    norms = np.linalg.norm(g, axis=1)
    if np.any(norms == 0) or not np.all(np.isfinite(norms)):
        raise ValueError(f"{where}.directions has a zero or non-finite row")
    return g / norms[:, None]


class ContractedMoments(Family):
    """``M_l^g = T_l(g,…,g,·,·)``, ``T_l(g,…,g,·)`` and ``T_l(g,…,g)`` for orders × directions.

    Each pair costs two symmetric rank-k updates (rows of positive and of negative weight), d(d+1)
    flops per sample; docs/design.md §3 batches them into one GEMM, at twice the flops.
    Pairs are ordered order-major: pair ``p = a·G + b`` is (orders[a], directions[b]).
    """

    name = "contracted"
    descriptions = {
        "M": (
            "contracted Hermite moment",
            "M_l^g = T_l(g, …, g, ·, ·): the order-l Hermite tensor of the label "
            "contracted l − 2 times with the unit direction g, per (order, direction) pair",
        ),
        "v": ("contracted Hermite vector", "T_l(g, …, g, ·): contracted l − 1 times, per pair"),
        "s": ("contracted Hermite scalar", "T_l(g, …, g): contracted l times, per pair"),
        "direction": ("direction bank", "the unit directions g the tensors are contracted with"),
        "pair_order": ("order of each pair", "the Hermite order l of pair p"),
        "pair_direction": ("direction of each pair", "the index into `direction` of pair p"),
        "control_mean": ("control variate: mean label", "ȳ of the pilot pass, subtracted from the labels"),
        "control_beta": (
            "control variate: linear part",
            "β = E[y x] of the pilot pass; the labels summed are "
            "y − ȳ − βᵀx, whose moments of order ≥ 2 are those of y",
        ),
    }
    pilot_key = "control_samples"

    def __init__(
        self,
        directions: np.ndarray,
        orders: Iterable[int],
        control: tuple[np.ndarray, np.ndarray] | None = None,
        expansion: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None,
    ):
        self.directions = np.asarray(directions, dtype=np.float64)
        self.orders = [int(o) for o in orders]
        self.d = self.directions.shape[1]
        self.n_pairs = len(self.orders) * len(self.directions)
        # (ȳ, β): the labels' expansion of degree ≤ 1 from the pilot pass, subtracted from every label
        self.control = (
            None
            if control is None
            else (float(np.asarray(control[0])), np.asarray(control[1], dtype=np.float64).reshape(self.d))
        )
        # (t0, t1, V, θ): a given expansion of degree ≤ 2, T_2 = V diag(θ) Vᵀ (low rank: O(d s) per sample)
        self.expansion = expansion

    @classmethod
    def from_config(cls, section: ContractedConfig, ctx: FamilyContext) -> Statistic:
        """The ``contracted`` section's statistic: its direction bank and control variate drawn (after the
        bank's size is checked against ``run.worker_memory``), or read from the store."""
        cfg, d, m, stored = ctx.cfg, ctx.d, ctx.outputs, ctx.stored
        if not stored:
            check_directions(section, d, m, cfg.run.worker_memory)
        g = stored(cls.name)["direction"] if stored else direction_bank(section, d, cfg.seed)
        control = None
        if section.control:
            control = (
                (stored(cls.name)["control_mean"], stored(cls.name)["control_beta"])
                if stored
                else linear_control(drawn(ctx.pilot)(section.control_samples))
            )
        return ctx.per_output(
            lambda j: ContractedMoments(
                g,
                section.orders,
                None if control is None else (of_output(control[0], j, 0), of_output(control[1], j, 1)),
                _contracted_expansion(section, d, m, j),
            )
        )

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """Per output: the Grams, the directions' projections x·g, the vectors Σ w_b x (one GEMM for all pairs)."""
        g = count(option(section, "directions") or 8)
        pairs = len(option(section, "orders") or [2, 4]) * g
        return (gram_work(d, pairs) + Work(((2.0 * d * g, g), (2.0 * d * pairs, pairs)), stream=F * 4 * d)).scaled(
            outputs
        )

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        pairs = len(option(section, "orders") or [2, 4]) * count(option(section, "directions") or 8)
        n = pairs * (d * d + d + 1)
        return n * outputs, n * outputs

    @classmethod
    def runs_pilot(cls, section: Any) -> bool:
        """The control variate's pilot pass."""
        return bool(option(section, "control"))

    @classmethod
    def pilot_floor(cls, d: int) -> int:
        """20 samples per coefficient of the control variate's d + 1."""
        return 20 * d

    def sums_schema(self):
        p, d = self.n_pairs, self.d
        return {"M": Var(("pair", "i", "j"), (p, d, d)), "v": Var(("pair", "i"), (p, d)), "s": Var(("pair",), (p,))}

    def coords(self):
        g = len(self.directions)
        out = {
            "direction": (("direction", "i"), self.directions),
            "pair_order": (("pair",), np.repeat(np.asarray(self.orders, dtype=np.int64), g)),
            "pair_direction": (("pair",), np.tile(np.arange(g, dtype=np.int64), len(self.orders))),
        }
        if self.control is not None:
            out["control_mean"] = ((), np.float64(self.control[0]))
            out["control_beta"] = (("i",), self.control[1])
        return out

    def update(self, acc, x, y):
        if self.control is not None:  # same expectations for orders ≥ 2, less variance
            y = y - self.control[0] - x @ self.control[1]
        if self.expansion is not None:  # the same for orders ≥ 3
            t0, t1, v, theta = self.expansion
            z = x @ v
            y = y - (t0 + x @ t1 + 0.5 * ((z * z - 1.0) @ theta))
        acc["M"] += hermite.contracted_matrix_sums(x, y, self.directions, self.orders)
        acc["v"] += hermite.contracted_vector_sums(x, y, self.directions, self.orders)
        acc["s"] += hermite.contracted_scalar_sums(x, y, self.directions, self.orders)

    def config(self):
        out = {"orders": self.orders, "directions": self.directions.tolist()}
        if self.expansion is not None:  # only when set: stores made before the option keep their fingerprint
            t0, t1, v, theta = self.expansion
            out["expansion"] = {"t0": t0, "t1": t1.tolist(), "t2_vectors": v.T.tolist(), "t2_values": theta.tolist()}
        return out


def linear_control(batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """``(ȳ, β)`` with ``β = E[y x]`` over the pilot pass's ``batches``: the labels' expansion of degree ≤ 1 under
    Gaussian inputs (per output, stacked, for a vector source: shapes (m,) and (m, d))."""
    count, s0, s1 = 0, 0.0, 0.0
    for x, y in batches:
        count += len(y)
        s0 = s0 + y.sum(axis=0)
        s1 = s1 + (y.T @ x if y.ndim == 2 else y @ x)
    return np.asarray(s0 / count, dtype=np.float64), np.asarray(s1 / count, dtype=np.float64)


def _contracted_expansion(section: ContractedConfig, d: int, m: int | None, j: int | None) -> tuple | None:
    """Output ``j``'s expansion ``(t0, t1, V, θ)`` of a ``contracted`` section (None: none given)."""
    exp, where = output_expansion(section, m, j, "statistics.contracted")
    return None if exp is None else low_rank_expansion(exp, d, where)
