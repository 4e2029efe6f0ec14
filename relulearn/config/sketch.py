"""The ``statistics.sketch`` section: second-moment families in sketch form, and the sketch ranks that can hold
what is asked of them."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from .base import SEED_MAX, ConfigError, _Section
from .families import ContractedConfig, ExpansionConfig, FilteredConfig, ResidualConfig

__all__ = [
    "SKETCH_OVERSAMPLING",
    "SKETCH_DEFAULT_RANK",
    "required_sketch_rank",
    "check_sketch_rank",
    "SketchSecondConfig",
    "SketchConfig",
]

#: extra columns a sketch needs beyond the k directions wanted (randomized range finder; Halko et al. 2011)
SKETCH_OVERSAMPLING = 8

#: columns of the Gaussian test matrix when a sketch section gives neither ``rank`` nor ``basis``
SKETCH_DEFAULT_RANK = 32


def required_sketch_rank(d: int, k: int, oversampling: int = SKETCH_OVERSAMPLING) -> int:
    """The smallest sketch rank ``r`` that holds ``k`` directions: ``k + oversampling``, at most ``d``
    (a rank-d sketch holds every direction)."""
    return min(int(d), int(k) + int(oversampling))


def check_sketch_rank(
    d: int,
    rank: int,
    k: int | None = None,
    *,
    where: str = "statistics.sketch.rank",
    oversampling: int = SKETCH_OVERSAMPLING,
) -> None:
    """Refuse a sketch rank ``r`` that cannot hold what is asked of it.

    Raises
    ------
    ConfigError
        When ``r > d`` (a d × r test matrix has at most d independent columns), or when ``k``
        directions are wanted and ``r < min(d, k + oversampling)``; the message names the r to use.
    """
    if rank < 1:
        raise ConfigError(f"{where} is {rank}; a sketch needs at least one column (use r >= 1)")
    if rank > d:
        raise ConfigError(
            f"{where} is {rank} but d = {d}: a d × r sketch holds at most d independent columns; use r <= {d} "
            f"(at d = {d} the dense matrix is as small as the sketch, so consider the dense family)"
        )
    if k is not None:
        need = required_sketch_rank(d, k, oversampling)
        if rank < need:
            raise ConfigError(
                f"{where} is {rank}, too small to hold k = {k} directions with the oversampling of {oversampling} "
                f"columns a randomized range finder needs; use r >= {need}"
            )


class SketchSecondConfig(_Section):
    """``M_2 = E[y (x xᵀ − I)]`` in sketch form."""

    expansion: ExpansionConfig | None = Field(
        None,
        description="a degree-≤2 expansion of the labels used as a control variate: the sums are taken of "
        "y − (t0 + <t1, x> + ½<T_2, xxᵀ − I>) and T_2 Ω is added back, so the estimate is still of M_2 (and E[y], "
        "E[y x]) with the far smaller variance of the residual labels; T_2 of low rank (t2_vectors, t2_values) at "
        "large d; omitted: raw labels",
    )


class SketchConfig(_Section):
    """Second-moment families in sketch form (docs/design.md §6, §7): for each chosen d × d matrix M,
    ``Y = M Ω`` (d × r) with Ω a seeded Gaussian test matrix, or, for a subspace pass with an
    orthonormal ``basis`` B (rows, r × d), ``M Bᵀ`` and ``B M Bᵀ`` (r × r). O(d r) per sample and
    matrix instead of O(d²)."""

    rank: int | None = Field(
        None,
        ge=1,
        description=f"columns r of the Gaussian test matrix Ω (d × r); default {SKETCH_DEFAULT_RANK}, "
        "or the number of basis rows",
    )
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="seed of Ω (default: the run's seed)")
    basis: list[list[float]] | None = Field(
        None, min_length=1, description="orthonormal rows B (r × d): a subspace pass (Ω = Bᵀ, and B M Bᵀ is stored)"
    )
    second: SketchSecondConfig | None = Field(None, description="M_2 = E[y (xxᵀ − I)]")
    contracted: ContractedConfig | None = Field(None, description="M_l^g for orders × directions")
    filtered: FilteredConfig | None = Field(None, description="M_τ = E[1{|y| > τ}(xxᵀ − I)] for a τ grid")
    residual: ResidualConfig | None = Field(
        None,
        description="residual-filtered M of candidate networks on a found subspace, projected off it "
        "(the dense `residual` family's matrices, sketched)",
    )
    refines: dict[str, Any] | None = Field(
        None,
        description="for a subspace pass: the record of the store it refines (its fingerprint but the "
        "statistics, and its sample count); the run is refused unless it draws the same chunks",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SketchConfig:
        if self.second is None and self.contracted is None and self.filtered is None and self.residual is None:
            raise ValueError(
                "give at least one family to sketch: `second: {}`, `contracted: {orders: [...], "
                "directions: ...}`, `filtered: {quantiles: [...]}` or `residual: {basis: ..., "
                "candidates: ..., quantiles: [...]}`"
            )
        if self.basis is not None:
            if self.rank is not None and self.rank != len(self.basis):
                raise ValueError(f"rank is {self.rank} but basis has {len(self.basis)} rows; omit rank with a basis")
            if self.seed is not None:
                raise ValueError(
                    "seed draws the Gaussian test matrix; a subspace pass with a basis has none (omit seed)"
                )
        elif self.refines is not None:
            raise ValueError("refines names the store a subspace pass refines; give it together with a basis")
        return self

    @property
    def columns(self) -> int:
        """r: the basis rows, or the rank (default :data:`SKETCH_DEFAULT_RANK`)."""
        if self.basis is not None:
            return len(self.basis)
        return SKETCH_DEFAULT_RANK if self.rank is None else self.rank
