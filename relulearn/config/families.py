"""The ``statistics`` section: one section per statistic family (``statistics.basic``, ``hermite``,
``contracted``, ``filtered``, ``residual``, ..., ``sketch``), what each estimates and the options that shape it,
and :class:`StatisticsConfig`, whose field order is the order a run builds the families in."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from .base import SEED_MAX, _Section
from .sketch import SKETCH_DEFAULT_RANK

__all__ = [
    "BasicConfig",
    "OutputMomentsConfig",
    "ExpansionConfig",
    "HermiteConfig",
    "ContractedConfig",
    "FilteredConfig",
    "CandidateNetworkConfig",
    "ResidualConfig",
    "ProjectedHermiteConfig",
    "ProjectedContractedConfig",
    "SketchSecondConfig",
    "SketchConfig",
    "StatisticsConfig",
]


class BasicConfig(_Section):
    """count, Σy, Σy², Σx, Σxxᵀ, Σy·x."""


class OutputMomentsConfig(_Section):
    """Per-output moments of the label vector A (m outputs; m = 1 for a scalar label):
    ``E[A]``, ``E[A Aᵀ]``, ``T1 = E[A_j x]``, ``T2 = E[A_j (x xᵀ − I)]``; one GEMM per batch
    for all outputs."""


class ExpansionConfig(_Section):
    """A polynomial expansion of degree ≤ 2 in Hermite form, ``t0 + <t1, x> + ½<t2, xxᵀ − I>``
    (docs/design.md §3): the ``P_{≤2} y`` that residual labels subtract."""

    t0: float = Field(0.0, description="constant term (E[y])")
    t1: list[float] | None = Field(None, description="linear term T_1 (d entries); omitted: zero")
    t2: list[list[float]] | None = Field(None, description="second-order term T_2 (d × d, symmetric); omitted: zero")
    t2_vectors: list[list[float]] | None = Field(
        None,
        description="T_2 of low rank, Σ_j t2_values[j] v_j v_jᵀ: the rows v_j (each of d entries); the form "
        "for large d, where a d × d t2 does not fit a configuration (give t2_values too, and no t2)",
    )
    t2_values: list[float] | None = Field(None, description="the weights of the t2_vectors rows")

    @model_validator(mode="after")
    def _low_rank(self) -> ExpansionConfig:
        if (self.t2_vectors is None) != (self.t2_values is None):
            raise ValueError("give t2_vectors and t2_values together (T_2 = Σ_j t2_values[j] v_j v_jᵀ)")
        if self.t2_vectors is not None:
            if self.t2 is not None:
                raise ValueError("give T_2 either dense (t2) or of low rank (t2_vectors, t2_values), not both")
            assert self.t2_values is not None  # given together with t2_vectors (checked above)
            if len(self.t2_vectors) != len(self.t2_values):
                raise ValueError(
                    f"t2_vectors has {len(self.t2_vectors)} rows but t2_values has "
                    f"{len(self.t2_values)} entries; give one value per row"
                )
        return self


class HermiteConfig(_Section):
    max_order: int = Field(4, ge=0, le=8, description="largest order l of T_l = E[y He_l(x)]")
    max_entries: int = Field(
        2_000_000, ge=1, description="refuse when the packed tensors would have more entries than this (large d)"
    )
    expansion: ExpansionConfig | list[ExpansionConfig] | None = Field(
        None,
        description="degree-≤2 expansion subtracted from the labels (residual labels: orders ≥ 3 unchanged, "
        "lower variance); one per output for a source with several outputs; omitted: raw labels",
    )


class ContractedConfig(_Section):
    orders: list[int] = Field([2, 4], min_length=1, description="orders l of the contracted matrices M_l^g")
    directions: int | list[list[float]] = Field(
        8, description="number of random unit directions g, or the directions themselves (rows of length d)"
    )
    directions_seed: int | None = Field(
        None, ge=0, le=SEED_MAX, description="seed of the random direction bank (default: the run's seed)"
    )
    control: bool | None = Field(
        None,
        description="subtract from the labels their expansion of degree ≤ 1, ȳ + βᵀx, estimated on a pilot "
        "pass: the same M_l^g (E[He_l] = E[x He_l] = 0 for l ≥ 2), far less variance when E[y] or E[y x] is "
        "large (networks with biases, whose mean is large next to their spread)",
    )
    control_samples: int = Field(100_000, ge=1000, description="samples of the pilot pass of `control`")
    expansion: ExpansionConfig | list[ExpansionConfig] | None = Field(
        None,
        description="a degree-≤2 expansion subtracted from the labels (residual labels: orders ≥ 3 unchanged, "
        "far less variance; order 2 then holds the residual's T_2); one per output for a source with several "
        "outputs; not together with `control`",
    )

    @field_validator("orders")
    @classmethod
    def _orders(cls, value: list[int]) -> list[int]:
        return _check_orders(value)

    @field_validator("directions")
    @classmethod
    def _directions(cls, value: Any) -> Any:
        return _check_directions(value)

    @model_validator(mode="after")
    def _one_control(self) -> ContractedConfig:
        if self.control and self.expansion is not None:
            raise ValueError(
                "give `control` (a linear control variate from a pilot pass) or `expansion` (a given "
                "degree-≤2 expansion), not both"
            )
        return self


def _check_orders(value: list[int]) -> list[int]:
    """Orders of contracted matrices: between 2 and 30, none repeated."""
    bad = [o for o in value if o < 2 or o > 30]
    if bad:
        raise ValueError(f"contracted orders must be between 2 and 30, got {bad}")
    if len(set(value)) != len(value):
        raise ValueError(f"contracted orders repeat: {value}")
    return value


def _check_directions(value: Any) -> Any:
    """A positive count of directions, or the directions themselves."""
    if isinstance(value, int) and value < 1:
        raise ValueError("directions must be a positive count or a list of direction vectors")
    return value


def _check_grid(quantiles: list[float] | None, thresholds: list[float] | None) -> None:
    """Exactly one τ grid, increasing: quantiles in [0, 1) (strictly) or non-negative thresholds."""
    if (quantiles is None) == (thresholds is None):
        raise ValueError("give exactly one of `quantiles` (e.g. [0.5, 0.8, 0.95]) or `thresholds`")
    if quantiles is not None:
        if not quantiles or any(not 0.0 <= q < 1.0 for q in quantiles):
            raise ValueError(f"quantiles must lie in [0, 1), got {quantiles}")
        if sorted(set(quantiles)) != list(quantiles):
            raise ValueError(f"quantiles must be strictly increasing, got {quantiles}")
    if thresholds is not None:
        if not thresholds or any(t < 0 for t in thresholds):
            raise ValueError(f"thresholds must be non-negative, got {thresholds}")
        # repeats are allowed: a quantile grid of labels with an atom (a ReLU net's zero) repeats τ too, and a
        # pass given such a grid back as thresholds must compute the same matrices
        if sorted(thresholds) != list(thresholds):
            raise ValueError(f"thresholds must be increasing, got {thresholds}")


class FilteredConfig(_Section):
    quantiles: list[float] | None = Field(
        None, description="thresholds τ as quantiles of |y| (estimated in a short pilot pass)"
    )
    thresholds: list[float] | None = Field(None, description="thresholds τ given directly")
    pilot_samples: int = Field(100_000, ge=1000, description="samples of the pilot pass that estimates quantiles")

    @model_validator(mode="after")
    def _one_grid(self) -> FilteredConfig:
        _check_grid(self.quantiles, self.thresholds)
        return self


class CandidateNetworkConfig(_Section):
    """A bias-free network on the subspace coordinates ``z = B x`` (``B``: the residual basis)."""

    weights: list[list[list[float]]] = Field(
        ..., min_length=1, description="W0..WL; W0 has one column per basis row, WL one row (the output)"
    )
    activation: str = Field("relu", description="hidden activation")


class ResidualConfig(_Section):
    """Residual-filtered second moments ``E[1{|y − F̃(Bx)| > τ} (x⊥x⊥ᵀ − (I − BᵀB))]``,
    ``x⊥ = x − BᵀB x``: the filtered matrix of the residual of candidate networks ``F̃`` on
    the subspace found so far, projected off it (one d² product per sample and candidate)."""

    basis: list[list[float]] = Field(..., min_length=1, description="orthonormal rows B (r × d) of the found subspace")
    candidates: list[CandidateNetworkConfig] = Field(..., min_length=1, description="networks F̃ on z = B x")
    quantiles: list[float] | None = Field(
        None, description="thresholds τ as quantiles of each candidate's |residual| (pilot pass)"
    )
    thresholds: list[float] | None = Field(None, description="thresholds τ given directly (all candidates)")
    pilot_samples: int = Field(100_000, ge=1000, description="samples of the pilot pass that estimates quantiles")

    @model_validator(mode="after")
    def _one_grid(self) -> ResidualConfig:
        _check_grid(self.quantiles, self.thresholds)
        return self


class ProjectedHermiteConfig(_Section):
    """Hermite moments on a subspace, ``E[ỹ He_l(P x)]`` for ``l ≤ max_order``, packed over the
    r coordinates of ``z = P x`` (P: r × d, orthonormal rows), on labels ``ỹ = y − expansion(x)``
    (``y`` itself when no expansion is given). He_l is orthogonal to every polynomial of lower
    degree, so subtracting a degree-≤2 expansion leaves the orders ≥ 3 unchanged and cuts their
    variance."""

    basis: list[list[float]] = Field(..., min_length=1, description="orthonormal rows P (r × d) of the subspace")
    max_order: int = Field(4, ge=0, le=6, description="largest order l")
    expansion: ExpansionConfig | None = Field(
        None, description="degree-≤2 expansion subtracted from the labels (residual labels); omitted: raw labels"
    )


class ProjectedContractedConfig(_Section):
    """The ``contracted`` family's matrices inside a subspace: for orthonormal rows ``B`` (k × d) and
    ``z = B x``, ``M_l^g = T_l(g, …, g, ·, ·)`` of the labels as a function of z for directions g of the
    subspace, k × k instead of d × d (``B M_l^{Bᵀg} Bᵀ`` of the full family); no control variate."""

    basis: list[list[float]] = Field(..., min_length=1, description="orthonormal rows B (k × d) of the subspace")
    orders: list[int] = Field([2, 4], min_length=1, description="orders l of the contracted matrices M_l^g")
    directions: int | list[list[float]] = Field(
        8,
        description="number of random unit directions g of the subspace, or the directions themselves (rows of "
        "length k, one entry per basis row)",
    )
    directions_seed: int | None = Field(
        None, ge=0, le=SEED_MAX, description="seed of the random direction bank (default: the run's seed)"
    )
    expansion: ExpansionConfig | list[ExpansionConfig] | None = Field(
        None,
        description="a degree-≤2 expansion in the full x subtracted from the labels before the batch is "
        "projected (residual labels: orders ≥ 3 unchanged, far less variance); one per output for a source "
        "with several outputs",
    )

    @field_validator("orders")
    @classmethod
    def _orders(cls, value: list[int]) -> list[int]:
        return _check_orders(value)

    @field_validator("directions")
    @classmethod
    def _directions(cls, value: Any) -> Any:
        return _check_directions(value)


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


class StatisticsConfig(_Section):
    """The statistic families a run accumulates, one optional section each. The fields' order is the order a
    run builds them in and their pilot passes draw (the registry of families follows it)."""

    basic: BasicConfig | None = Field(default_factory=BasicConfig)
    output_moments: OutputMomentsConfig | None = None
    hermite: HermiteConfig | None = None
    contracted: ContractedConfig | None = None
    filtered: FilteredConfig | None = None
    residual: ResidualConfig | None = None
    projected_hermite: ProjectedHermiteConfig | None = None
    sketch: SketchConfig | None = None
    projected_contracted: ProjectedContractedConfig | None = None

    def enabled(self) -> dict[str, _Section]:
        """The statistics to accumulate, by name, in the fields' order."""
        return {name: section for name in type(self).model_fields if (section := getattr(self, name)) is not None}
