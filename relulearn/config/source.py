"""The ``source`` section: where samples come from, a planted or black-box teacher (one model per kind) or files."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import SEED_MAX, _Section

__all__ = [
    "OneHiddenReluTeacher",
    "DeepReluTeacher",
    "TwoLayerTeacher",
    "RandomXavierTeacher",
    "FileTeacher",
    "CallableTeacher",
    "OnnxTeacher",
    "TeacherConfig",
    "is_url",
    "DataConfig",
    "SourceConfig",
]


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
    seed: int = Field(
        default=0, ge=0, le=SEED_MAX, description="seed of the planted weights (independent of the run's seed)"
    )

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
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of the planted weights (independent of the run's seed)")

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
    weights_seed: int = Field(
        0, ge=0, le=SEED_MAX, description="seed of the planted weights (independent of the run's seed)"
    )
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
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of the planted weights (independent of the run's seed)")

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
