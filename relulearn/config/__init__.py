"""The run configuration: typed, validated, loaded from YAML (docs/design.md §8).

Every section is a pydantic model with ``extra="forbid"``, so a mistyped key is an
error that names the key and the closest valid one, instead of being silently ignored.

The modules: :mod:`~relulearn.config.source` (the ``source`` section: teachers and files),
:mod:`~relulearn.config.families` (the ``statistics`` section: every family's section, the sketch's too),
:mod:`~relulearn.config.sketch` (the sketch ranks), :mod:`~relulearn.config.run` (the run options, the whole
configuration), :mod:`~relulearn.config.loading` (from a dict or a YAML file) and
:mod:`~relulearn.config.messages` (validation errors, one line per key, with "did you mean").
Every public name is re-exported here.
"""

from __future__ import annotations

from .base import ConfigError
from .families import (
    BasicConfig,
    CandidateNetworkConfig,
    ContractedConfig,
    ExpansionConfig,
    FilteredConfig,
    HermiteConfig,
    OutputMomentsConfig,
    ProjectedHermiteConfig,
    ResidualConfig,
    SketchConfig,
    SketchSecondConfig,
    StatisticsConfig,
)
from .loading import config_from_dict, load_config
from .run import RunConfig, RunOptions
from .sketch import (
    SKETCH_DEFAULT_RANK,
    SKETCH_OVERSAMPLING,
    check_sketch_rank,
    required_sketch_rank,
)
from .source import (
    CallableTeacher,
    DataConfig,
    DeepReluTeacher,
    FileTeacher,
    OneHiddenReluTeacher,
    OnnxTeacher,
    RandomXavierTeacher,
    SourceConfig,
    TeacherConfig,
    TwoLayerTeacher,
    is_url,
)

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
    # the sections and helpers the rest of the package reads
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
    "BasicConfig",
    "OutputMomentsConfig",
    "ExpansionConfig",
    "HermiteConfig",
    "ContractedConfig",
    "FilteredConfig",
    "CandidateNetworkConfig",
    "ResidualConfig",
    "ProjectedHermiteConfig",
    "SKETCH_DEFAULT_RANK",
    "SketchSecondConfig",
    "RunOptions",
]
