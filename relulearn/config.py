"""The run configuration: typed, validated, loaded from YAML (docs/design.md §8).

Every section is a pydantic model with ``extra="forbid"``, so a mistyped key is an
error that names the key and the closest valid one, instead of being silently ignored.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "ConfigError",
    "RunConfig",
    "SourceConfig",
    "StatisticsConfig",
    "SketchConfig",
    "SKETCH_OVERSAMPLING",
    "check_sketch_rank",
    "required_sketch_rank",
    "load_config",
    "config_from_dict",
]


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message says what to change."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# --------------------------------------------------------------------------- source


class OneHiddenReluTeacher(_Section):
    """``y = Σ_i λ_i relu(<u_i, x>)`` with unit ``u_i`` (docs/design.md §3)."""

    kind: Literal["one_hidden_relu"] = "one_hidden_relu"
    width: int = Field(default=3, ge=1, description="number of hidden units k")
    output_weights: list[float] | None = Field(
        default=None, description="λ_1..λ_k; drawn from `seed` (random signs, |λ| in [0.5, 1.5]) when omitted"
    )
    weights: list[list[float]] | None = Field(
        default=None, description="k rows u_i of length d (normalized to unit length); random unit vectors when omitted"
    )
    seed: int = Field(default=0, ge=0, description="seed of the planted weights (independent of the run's seed)")

    @model_validator(mode="after")
    def _lengths(self) -> OneHiddenReluTeacher:
        if self.output_weights is not None and len(self.output_weights) != self.width:
            raise ValueError(
                f"output_weights has {len(self.output_weights)} entries but width is {self.width}; "
                "give one output weight per hidden unit"
            )
        if self.weights is not None and len(self.weights) != self.width:
            raise ValueError(f"weights has {len(self.weights)} rows but width is {self.width}")
        return self


class DeepReluTeacher(_Section):
    """``y = W_L relu(… relu(W_0 x))``: a planted deep ReLU network without biases.

    ``widths`` are the hidden widths, first to last; the first is the number ``k`` of rows
    of ``W_0`` (unit rows, random directions), so the relevant subspace is their span.
    Later layers have Gaussian entries of variance ``2 / fan_in``; the output layer
    ``1 / fan_in``.
    """

    kind: Literal["deep_relu"]
    widths: list[int] = Field(..., min_length=1, description="hidden widths; widths[0] = k rows of the first layer")
    seed: int = Field(0, ge=0, description="seed of the planted weights (independent of the run's seed)")

    @field_validator("widths")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(w < 1 for w in value):
            raise ValueError(f"every hidden width must be at least 1, got {value}")
        return value


class TwoLayerTeacher(_Section):
    """``A = U f(V x)`` with ``m`` outputs: ``V`` (k × d) and ``U`` (m × k), ``f(z) = max(z, 0)^c``.

    Rows of ``V`` are random unit directions times norms drawn uniformly from ``v_norms``;
    ``U`` has i.i.d. standard normal entries when its rank r (``output_rank``, default
    ``min(m, k)``) equals k, or m = 1. When r < k and m ≥ 2 (fewer outputs than units, or
    ``output_rank`` below ``min(m, k)``), ``U = P Q`` (``P``: m × r, ``Q``: r × k, Gaussian) and its last column is
    then set to minus its first: an antipodal pair ``u, −u``, the case a rank-deficient learner
    (the fixed-parameter path of ``exact``) must handle.
    Without ``source.output`` the label is the vector of all m outputs.
    """

    kind: Literal["two_layer"]
    width: int = Field(..., ge=1, description="number of hidden units k (rows of V)")
    outputs: int = Field(..., ge=1, description="number of outputs m (rows of U)")
    activation: Literal["relu", "relu2", "relu3"] = Field(
        "relu", description="hidden activation f(z) = max(z, 0)^c: relu (c = 1), relu2 (c = 2) or relu3 (c = 3)"
    )
    weights_seed: int = Field(0, ge=0, description="seed of the planted weights (independent of the run's seed)")
    v_norms: list[float] = Field(
        [0.5, 2.0], description="[lo, hi]: the norms of the rows of V are uniform in [lo, hi], 0 < lo <= hi"
    )
    output_rank: int | None = Field(
        None,
        ge=1,
        description="rank r of U, at most min(outputs, width) (the default); below width, U = P Q "
        "with an antipodal pair of columns (u, −u)",
    )

    @field_validator("v_norms")
    @classmethod
    def _norms(cls, value: list[float]) -> list[float]:
        if len(value) != 2 or not 0 < value[0] <= value[1] or not all(map(math.isfinite, value)):
            raise ValueError(f"v_norms must be [lo, hi] with 0 < lo <= hi, got {value}")
        return value

    @model_validator(mode="after")
    def _rank(self) -> TwoLayerTeacher:
        full = min(self.outputs, self.width)
        r = self.output_rank
        if r is not None and r > full:
            raise ValueError(
                f"output_rank is {r} but U (outputs × width = {self.outputs} × {self.width}) has rank at most "
                f"min(outputs, width) = {full}; lower output_rank or omit it for full rank"
            )
        # r < min(m, k) implies k >= 2, so the antipodal pair (first, last column) is two columns;
        # with r = 1 every column is ±u, so a third column would be positively parallel to one of them
        if r == 1 and self.outputs >= 2 and self.width > 2:
            raise ValueError(
                f"U of rank 1 (outputs {self.outputs}, output_rank {r}) with width {self.width}: every column of U "
                "would be a multiple of one vector, so two of them would be positively parallel; use outputs and "
                "output_rank >= 2, or width <= 2"
            )
        return self


class RandomXavierTeacher(_Section):
    """A random "Xavier" network of Daniely, Srebro, Vardi (2023), without biases:
    ``y = W_L σ(… σ(W_0 x))`` with entries of every ``W_j`` (the scalar output layer included)
    i.i.d. ``N(0, 1/fan_in)`` and ``σ`` the activation normalised to ``E σ(z)² = 1``, ``z ~ N(0, 1)``
    (relu: ``√2 relu``; erf: ``√3 erf(z/√2)``; erf_relu and tanh divided by their norms). The
    normalisation is folded into the weights of the planted network file (``relulearn shadow``).
    """

    kind: Literal["random_xavier"]
    widths: list[int] = Field(..., min_length=1, description="hidden widths, first to last")
    activation: Literal["relu", "erf", "erf_relu", "tanh"] = Field(
        "relu", description="hidden activation σ before normalisation: relu, erf, erf_relu or tanh"
    )
    seed: int = Field(0, ge=0, description="seed of the planted weights (independent of the run's seed)")

    @field_validator("widths")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(w < 1 for w in value):
            raise ValueError(
                f"every hidden width must be at least 1, got {value}; give one positive width per "
                "hidden layer, e.g. [512] or [256, 256]"
            )
        return value


class FileTeacher(_Section):
    """Any network file in the format of docs/design.md §5 (``W0..WL``, ``activation``)."""

    file: str = Field(..., description="path of a .npz network file, relative to the config file")


class CallableTeacher(_Section):
    """A black-box teacher: ``y = F(x)`` for a Python function ``F`` of a batch of inputs, queried at
    the run's Gaussian inputs on the workers (``relulearn.pipeline.blackbox``)."""

    callable: str = Field(
        ...,
        description="'package.module:function': F(x) for a batch x of shape (rows, d) returns labels (rows,) "
        "or (rows, m); vectorised over the rows and deterministic; its module must import on the driver and on "
        "every worker",
    )

    @field_validator("callable")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", value):
            raise ValueError(
                f"'{value}' is not 'package.module:function' (a module to import, a colon, and the "
                "name of a function in it)"
            )
        return value


class OnnxTeacher(_Section):
    """A black-box teacher: an ONNX model (from scikit-learn via skl2onnx, PyTorch via torch.onnx, ...) run by
    onnxruntime at the run's Gaussian inputs (``relulearn.pipeline.blackbox``)."""

    onnx: str = Field(
        ...,
        description="path of an .onnx model, relative to the config file: one input (rows, d), "
        "its first output (rows,) or (rows, m)",
    )


TeacherConfig = (
    OneHiddenReluTeacher
    | DeepReluTeacher
    | TwoLayerTeacher
    | RandomXavierTeacher
    | FileTeacher
    | CallableTeacher
    | OnnxTeacher
)


def is_url(path: str) -> bool:
    """A fsspec URL (``memory://…``, ``s3://…``, ``file://…``) rather than a local path."""
    return "://" in path


class DataConfig(_Section):
    """Samples from files instead of a teacher (``relulearn.pipeline.data``)."""

    x: str = Field(
        ...,
        description="inputs: a .npy file (rows, d), a zarr array or a Parquet file; a path "
        "(relative to the config file) or an fsspec URL",
    )
    y: str = Field(..., description="labels: a .npy file (rows,), a zarr array or a Parquet file (y_column)")
    x_columns: list[str] | None = Field(
        None, description="Parquet: the input columns (default: all columns of x's file)"
    )
    y_column: str | None = Field(None, description="Parquet: the label column (default: the file's only column)")
    whiten: bool = Field(
        True,
        description="estimate the inputs' mean and covariance and whiten them on the fly; "
        "the learned network is mapped back to raw coordinates",
    )
    nan_rows: Literal["refuse", "skip"] = Field(
        "refuse",
        description="rows with NaN or inf: refuse (naming the first row) or skip them (counted in `estimate`'s `data`)",
    )
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options for URLs")


class SourceConfig(_Section):
    d: int = Field(..., ge=1, description="input dimension")
    teacher: TeacherConfig = Field(default_factory=OneHiddenReluTeacher)
    data: DataConfig | None = Field(None, description="samples from files instead of a teacher")
    noise_std: float = Field(0.0, ge=0.0, description="standard deviation of additive Gaussian label noise")
    output: int | None = Field(
        None,
        ge=0,
        description="for a vector-output teacher: which output coordinate is the (scalar) label y; "
        "omitted: the label is the vector of all outputs, and every statistic is computed per output",
    )

    @model_validator(mode="after")
    def _data_or_teacher(self) -> SourceConfig:
        if self.data is not None:
            given = [k for k in ("teacher", "noise_std", "output") if k in self.model_fields_set]
            if given:
                raise ValueError(
                    f"source.data gives the samples; source.{given[0]} applies to teachers only: remove it"
                )
        return self

    @field_validator("teacher", mode="before")
    @classmethod
    def _pick_teacher(cls, value: Any) -> Any:
        if isinstance(value, dict) and "file" in value:
            return FileTeacher(**value)
        if isinstance(value, dict) and "callable" in value:
            return CallableTeacher(**value)
        if isinstance(value, dict) and "onnx" in value:
            return OnnxTeacher(**value)
        if isinstance(value, dict) and value.get("kind") == "deep_relu":
            return DeepReluTeacher(**value)
        if isinstance(value, dict) and value.get("kind") == "two_layer":
            return TwoLayerTeacher(**value)
        if isinstance(value, dict) and value.get("kind") == "random_xavier":
            return RandomXavierTeacher(**value)
        if isinstance(value, dict):
            return OneHiddenReluTeacher(**value)
        return value


# ----------------------------------------------------------------------- statistics


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
        None, ge=0, description="seed of the random direction bank (default: the run's seed)"
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
        bad = [o for o in value if o < 2 or o > 30]
        if bad:
            raise ValueError(f"contracted orders must be between 2 and 30, got {bad}")
        if len(set(value)) != len(value):
            raise ValueError(f"contracted orders repeat: {value}")
        return value

    @field_validator("directions")
    @classmethod
    def _directions(cls, value: Any) -> Any:
        if isinstance(value, int) and value < 1:
            raise ValueError("directions must be a positive count or a list of direction vectors")
        return value

    @model_validator(mode="after")
    def _one_control(self) -> ContractedConfig:
        if self.control and self.expansion is not None:
            raise ValueError(
                "give `control` (a linear control variate from a pilot pass) or `expansion` (a given "
                "degree-≤2 expansion), not both"
            )
        return self


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
    seed: int | None = Field(None, ge=0, description="seed of Ω (default: the run's seed)")
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
    basic: BasicConfig | None = Field(default_factory=BasicConfig)
    output_moments: OutputMomentsConfig | None = None
    hermite: HermiteConfig | None = None
    contracted: ContractedConfig | None = None
    filtered: FilteredConfig | None = None
    residual: ResidualConfig | None = None
    projected_hermite: ProjectedHermiteConfig | None = None
    sketch: SketchConfig | None = None

    def enabled(self) -> dict[str, _Section]:
        """The statistics to accumulate, by name, in a fixed order."""
        out = {}
        for name in (
            "basic",
            "output_moments",
            "hermite",
            "contracted",
            "filtered",
            "residual",
            "projected_hermite",
            "sketch",
        ):
            section = getattr(self, name)
            if section is not None:
                out[name] = section
        return out


class RunOptions(_Section):
    chunks_per_block: int = Field(
        default=4, ge=1, description="chunks reduced on a worker into one block partial (part of the fingerprint)"
    )
    commit_interval: float = Field(
        default=30.0, ge=0.0, description="seconds between commits to the store (0: commit after every block)"
    )
    max_blocks_in_flight: int | None = Field(
        default=None, ge=1, description="bound on submitted, unmerged blocks (default: 2 × workers + 1)"
    )
    worker_memory: int = Field(
        default=4 * 2**30,
        ge=1,
        description="bytes one block partial (sums and error terms of every statistic) may take on "
        "a worker; a run needing more is refused before any work, with the bytes needed, and `fit` sketches the "
        "d × d families to fit it (default 4 GiB)",
    )
    max_hours: float | None = Field(
        default=None,
        gt=0,
        description="refuse a run (estimate, fit) projected to take longer than this many hours, before "
        "any work, with the plan and the sample count that would fit (`relulearn plan` shows the projection)",
    )
    dashboard: str | None = Field(
        default=None,
        pattern=r"^\S*:\d{1,5}$",
        description="HOST:PORT where a local cluster's Dask dashboard listens "
        "(default 127.0.0.1:0: this machine only, any free port); 0.0.0.0:8787 exposes it on every interface, "
        "where anyone who reaches the host can read the cluster's pages. --dashboard overrides it",
    )


class RunConfig(_Section):
    seed: int = Field(..., ge=0, description="chunk i of this run uses a generator keyed by (seed, i)")
    samples: int = Field(..., ge=1, description="samples wanted (rounded up to whole chunks)")
    chunk_size: int = Field(50_000, ge=2, description="samples per chunk")
    source: SourceConfig
    statistics: StatisticsConfig = Field(default_factory=StatisticsConfig)
    run: RunOptions = Field(default_factory=RunOptions)
    # Where the config was read from: relative teacher files resolve against it. Not user-set.
    base_dir: str | None = Field(None, exclude=True, repr=False)

    @property
    def n_chunks(self) -> int:
        return -(-self.samples // self.chunk_size)

    def resolve_path(self, path: str) -> Path:
        p = Path(path).expanduser()
        if not p.is_absolute() and self.base_dir:
            p = Path(self.base_dir) / p
        return p

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict that round-trips through :func:`config_from_dict`.

        A teacher file's path is made absolute, so that the dict means the same thing
        wherever it is read (it is stored with the run).
        """
        data = self.model_dump(mode="json", exclude_none=True)
        if self.statistics.basic is None:  # off must stay off: an absent `basic` reads back as its default (on)
            data.setdefault("statistics", {})["basic"] = None
        teacher = data["source"].get("teacher", {})
        for key in ("file", "onnx"):
            if key in teacher:
                teacher[key] = str(self.resolve_path(teacher[key]).resolve())
        if self.source.data is not None:
            data["source"].pop("teacher", None)
            data["source"].pop("noise_std", None)
            for key in ("x", "y"):
                path = data["source"]["data"][key]
                if not is_url(path):
                    data["source"]["data"][key] = str(self.resolve_path(path).resolve())
        return data


# --------------------------------------------------------------------------- loading


def _valid_keys(model: type[BaseModel]) -> list[str]:
    return [name for name, field in model.model_fields.items() if not field.exclude]


def _kind_of(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("kind")
    return getattr(field.annotation, "__args__", (None,))[0] if field is not None else None


def _model_at(loc: tuple, root: type[BaseModel], data: Any = None) -> type[BaseModel] | None:
    """The model class that owns the location ``loc`` (used to suggest keys); ``data`` is
    the input, used to tell the members of a union apart by their ``kind``."""
    model: Any = root
    for i, part in enumerate(loc[:-1]):
        data = data.get(part) if isinstance(data, dict) else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            # a union member tag such as 'OneHiddenReluTeacher'
            return None
        ann = field.annotation
        candidates = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not candidates:
            return None
        # in a union (e.g. the teacher kinds) the owner is the member that lacks the unknown
        # key, or that has the next key on the way to it
        nxt, last = loc[i + 1], i + 1 == len(loc) - 1
        kind = data.get("kind") if isinstance(data, dict) else None
        tags = [t for t in ("file", "callable", "onnx") if isinstance(data, dict) and t in data]
        if tags:  # as _pick_teacher
            tag = tags[0]
            by_kind = [c for c in candidates if tag in c.model_fields]
        else:
            by_kind = [c for c in candidates if kind is not None and _kind_of(c) == kind]
        if by_kind:
            model = by_kind[0]
            continue
        fitting = [c for c in candidates if (nxt in c.model_fields) != last]
        model = (fitting or candidates)[0]
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _format_errors(err: ValidationError, where: str, data: Any = None) -> str:
    lines: list[str] = []
    for e in err.errors():
        # drop union member tags such as 'FileTeacher' or 'function-after[_lengths(), OneHiddenReluTeacher]'
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and (p[:1].isupper() or "[" in p)))
        key = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            owner = _model_at(loc, RunConfig, data)
            hint = ""
            if owner is not None:
                close = difflib.get_close_matches(str(loc[-1]), _valid_keys(owner), n=1, cutoff=0.5)
                valid = ", ".join(_valid_keys(owner))
                hint = f" — did you mean '{close[0]}'?" if close else ""
                hint += f" (valid keys here: {valid})" if valid else " (this section takes no keys: write it as {})"
            lines.append(f"unknown key '{key}'{hint}")
        elif e["type"] == "missing":
            lines.append(f"missing required key '{key}'")
        elif e["type"] == "literal_error" and loc[-2:] == ("teacher", "kind"):
            kinds = [k for k in (_kind_of(c) for c in TeacherConfig.__args__) if k]
            close = difflib.get_close_matches(str(e.get("input")), kinds, n=1, cutoff=0.5)
            line = (
                f"'{key}': unknown teacher kind {e.get('input')!r}"
                + (f" — did you mean '{close[0]}'?" if close else "")
                + f" (kinds: {', '.join(kinds)}; or a network from a file, an ONNX model or a Python callable: "
                "the keys file, onnx or callable instead of kind)"
            )
            if line not in lines:  # one line for all members of the union
                lines.append(line)
        elif e["type"] in ("model_type", "dict_type"):
            line = f"'{key}' must be a mapping of keys (got {e.get('input')!r})"
            if line not in lines:  # one line for all members of a union
                lines.append(line)
        else:
            got = e.get("input")
            got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
            lines.append(f"'{key}': {e['msg']}{got_s}")
    return f"invalid configuration {where}:\n  " + "\n  ".join(lines)


def config_from_dict(data: Any, *, where: str = "", base_dir: str | None = None) -> RunConfig:
    """Validate a configuration given as a dict (the parsed YAML)."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration {where}: expected a mapping of keys, got {type(data).__name__}")
    try:
        cfg = RunConfig(**data, base_dir=base_dir)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, where, data)) from None
    except TypeError as err:  # e.g. a section given as a scalar
        raise ConfigError(f"invalid configuration {where}: {err}") from None
    return cfg


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} is given twice (line {seen[key] + 1} and line "
                    f"{key_node.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a run configuration from a YAML file.

    Raises
    ------
    ConfigError
        If the file is missing, is not YAML, or does not satisfy the schema. The
        message names each offending key and, for unknown keys, the closest valid one.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read configuration file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"configuration file {path} is not a text file (byte {err.start} is not UTF-8): give the "
            "run's YAML configuration (examples/small.yaml in the source tree is one)"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"configuration file {path} is not valid YAML: {err}") from None
    return config_from_dict(data, where=f"in {path}", base_dir=str(path.resolve().parent))
