"""Planning: dense or sketched second-moment families for a per-worker memory budget (docs/design.md §7).

A block partial holds, per statistic, its sums and its error terms (sums over chunks of squared
per-chunk estimands), both float64. A dense family of ``c`` d × d matrices costs ``2 c d²``
numbers; its sketch of rank r costs ``2 c d r`` (``Y = M Ω`` and its error terms), plus ``c r²``
for the ``Bᵀ M B`` of a subspace pass. Vectors and scalars (O(c d)) are left out: they are the
same order in both forms and small.

The rule: every family stays dense (the default, exact and cheapest to read) while the whole
block partial fits the budget; otherwise families switch to their sketch, largest first, until
it fits. A budget too small for every family sketched is refused with the bytes needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import SKETCH_OVERSAMPLING, check_sketch_rank

__all__ = [
    "MemoryBudgetError",
    "FamilyPlan",
    "dense_bytes",
    "sketch_bytes",
    "plan_families",
    "partial_bytes",
    "check_partial_bytes",
    "check_partial_shares",
    "check_directions",
]

_FLOAT = 8


class MemoryBudgetError(ValueError):
    """A per-worker memory budget too small for the statistics asked for; the message gives the bytes needed."""


def dense_bytes(d: int, matrices: int) -> int:
    """Bytes of the d × d arrays of a dense family's block partial: sums and error terms."""
    return 2 * matrices * d * d * _FLOAT


def sketch_bytes(d: int, matrices: int, rank: int, *, basis: bool = False) -> int:
    """Bytes of a sketched family's block partial: ``Y`` (d × r) and its error terms per matrix, and
    the error terms of ``Bᵀ M B`` (r × r) for a subspace pass (the sums hold only ``M B``)."""
    return matrices * (2 * d * rank + (rank * rank if basis else 0)) * _FLOAT


@dataclass(frozen=True)
class FamilyPlan:
    """One family's form and the bytes of its block partial in each form."""

    name: str
    matrices: int
    dense_bytes: int
    sketch_bytes: int
    form: str  # "dense" or "sketch"

    @property
    def bytes(self) -> int:
        return self.dense_bytes if self.form == "dense" else self.sketch_bytes


def plan_families(
    d: int,
    families: Mapping[str, int],
    rank: int,
    budget_bytes: int,
    *,
    k: int | None = None,
    basis: bool = False,
    oversampling: int = SKETCH_OVERSAMPLING,
) -> dict[str, Any]:
    """Choose dense or sketch for each second-moment family under a per-worker memory budget.

    Parameters
    ----------
    d
        Input dimension.
    families
        Number of d × d matrices of each family, e.g. ``{"second": 1, "contracted": 16, "filtered": 3}``
        (``basic`` counts as one: its Σxxᵀ).
    rank
        Sketch rank r.
    budget_bytes
        Bytes one block partial may take on a worker (sums and error terms of every family).
    k
        Directions wanted from each matrix, if known: then ``r >= min(d, k + oversampling)``.
    basis
        Plan for a subspace pass (adds the r × r ``Bᵀ M B`` error terms).

    Returns
    -------
    dict
        ``families``: per family ``{"matrices", "dense_bytes", "sketch_bytes", "form"}``;
        ``total_bytes`` of the plan, ``dense_total_bytes``, ``sketch_total_bytes``, ``budget_bytes``,
        ``d``, ``rank``, and ``sketched``: the families in sketch form.

    Raises
    ------
    ConfigError
        When r > d, or r is too small for k directions (naming the r to use).
    MemoryBudgetError
        When even every family sketched exceeds the budget (naming the bytes needed).
    """
    _check_counts(d, families)
    check_sketch_rank(d, rank, k, where="the sketch rank r", oversampling=oversampling)
    plans = {
        n: FamilyPlan(n, int(c), dense_bytes(d, int(c)), sketch_bytes(d, int(c), rank, basis=basis), "dense")
        for n, c in families.items()
    }
    all_dense = sum(p.dense_bytes for p in plans.values())
    all_sketch = sum(p.sketch_bytes for p in plans.values())
    if all_sketch > budget_bytes:
        raise MemoryBudgetError(
            f"a block partial needs {all_sketch:,} bytes even with every family sketched at r = {rank} (d = {d}, "
            f"{sum(p.matrices for p in plans.values())} matrices), more than the budget of {budget_bytes:,} bytes; "
            f"give each worker at least {all_sketch:,} bytes for the partial, or lower r, or sketch fewer matrices "
            "(fewer directions or τ values)"
        )
    plans, total = _sketch_until_fits(plans, all_dense, budget_bytes)
    return {
        "d": d,
        "rank": rank,
        "budget_bytes": int(budget_bytes),
        "total_bytes": int(total),
        "dense_total_bytes": int(all_dense),
        "sketch_total_bytes": int(all_sketch),
        "sketched": sorted(n for n, p in plans.items() if p.form == "sketch"),
        "families": {
            n: {"matrices": p.matrices, "dense_bytes": p.dense_bytes, "sketch_bytes": p.sketch_bytes, "form": p.form}
            for n, p in plans.items()
        },
    }


def _check_counts(d: int, families: Mapping[str, int]) -> None:
    """Refuse a non-positive ``d`` or a negative count of matrices."""
    if d < 1:
        raise ValueError(f"d must be positive, got {d}")
    bad = {n: c for n, c in families.items() if int(c) < 0}
    if bad:
        raise ValueError(f"matrix counts must be non-negative, got {bad}")


def _sketch_until_fits(
    plans: dict[str, FamilyPlan], total: int, budget_bytes: int
) -> tuple[dict[str, FamilyPlan], int]:
    """``plans`` (all dense, ``total`` bytes) with families switched to their sketch, the one that saves the
    most first, until the block partial fits ``budget_bytes``; and the bytes it then takes."""
    plans = dict(plans)
    # largest dense family first: the fewest families leave their exact dense form
    for p in sorted(plans.values(), key=lambda p: (-(p.dense_bytes - p.sketch_bytes), p.name)):
        if total <= budget_bytes:
            break
        plans[p.name] = FamilyPlan(p.name, p.matrices, p.dense_bytes, p.sketch_bytes, "sketch")
        total -= p.dense_bytes - p.sketch_bytes
    return plans, total


def partial_bytes(stats: Any) -> dict[str, int]:
    """Bytes of one block partial of each built statistic: its sums and the sums of its squared
    per-chunk terms (exact, from the statistics' schemas)."""

    def size(schema: Mapping[str, Any]) -> int:
        total = 0
        for var in schema.values():
            n = 1
            for extent in var.shape:
                n *= int(extent)
            total += n
        return total

    return {s.name: _FLOAT * (size(s.sums_schema()) + size(s.terms_schema())) for s in stats}


def check_partial_bytes(stats: Any, budget_bytes: int, where: str) -> dict[str, int]:
    """Refuse statistics whose block partial exceeds ``budget_bytes`` (``run.worker_memory``), naming the
    bytes needed and each statistic's share; returns the shares."""
    shares = partial_bytes(stats)
    check_partial_shares(shares, budget_bytes, where)
    return shares


def check_partial_shares(shares: Mapping[str, int], budget_bytes: int, where: str) -> None:
    """Refuse a block partial of ``shares`` (bytes by statistic) past ``budget_bytes``, naming the bytes."""
    total = sum(shares.values())
    if total > budget_bytes:
        parts = ", ".join(f"{k}: {v:,}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))
        raise MemoryBudgetError(
            f"one block partial of the statistics of {where} needs {total:,} bytes ({parts}), more than "
            f"run.worker_memory = {budget_bytes:,} bytes; give each worker more (run.worker_memory: {total}), "
            "lower source.d, or replace the d × d families by their sketch (statistics.sketch, with basic: null; "
            "the configuration guide's 'Sketches and subspace passes'). Nothing was written"
        )


def check_directions(cfg: Any, d: int, m: int | None, budget: int) -> None:
    """Refuse a count of directions of ``statistics.contracted`` whose matrices alone (one d × d sum per order,
    direction and output) exceed ``budget`` bytes, before the bank itself is drawn (10¹² directions would be a
    116 TiB array)."""
    if not isinstance(cfg.directions, int):
        return
    need = 8 * cfg.directions * len(cfg.orders) * d * d * (m or 1)
    if need > budget:
        raise MemoryBudgetError(
            f"statistics.contracted.directions = {cfg.directions:,}: one d × d matrix per order, direction and "
            f"output is {need:,} bytes per block partial, more than run.worker_memory = {budget:,} bytes; give "
            f"fewer directions (at most {max(1, budget // (8 * len(cfg.orders) * d * d * (m or 1))):,} fit) or "
            "sketch the family (statistics.sketch). Nothing was written"
        )
