"""The whole run configuration: its run options and the top level (seed, samples, source, statistics)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from .base import SAMPLES_MAX, SEED_MAX, _Section
from .families import StatisticsConfig
from .source import SourceConfig, is_url

__all__ = ["RunOptions", "RunConfig"]


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
    seed: int = Field(..., ge=0, le=SEED_MAX, description="chunk i of this run uses a generator keyed by (seed, i)")
    samples: int = Field(..., ge=1, le=SAMPLES_MAX, description="samples wanted (rounded up to whole chunks)")
    chunk_size: int = Field(50_000, ge=2, description="samples per chunk")
    source: SourceConfig
    statistics: StatisticsConfig = Field(default_factory=StatisticsConfig)
    run: RunOptions = Field(default_factory=RunOptions)
    # Where the config was read from: relative teacher files resolve against it. Not user-set.
    base_dir: str | None = Field(None, exclude=True, repr=False)

    @model_validator(mode="after")
    def _whole_chunks(self) -> RunConfig:
        # a run counts whole chunks: a chunk larger than the samples asked for would silently draw a chunk's worth
        if "chunk_size" in self.model_fields_set and self.chunk_size > self.samples:
            raise ValueError(
                f"chunk_size ({self.chunk_size:,}) is larger than samples ({self.samples:,}): a run counts whole "
                f"chunks, so it would draw {self.chunk_size:,} samples; set chunk_size to at most {self.samples:,}"
            )
        if self.n_chunks * self.chunk_size > SAMPLES_MAX:
            raise ValueError(
                f"samples ({self.samples:,}) rounded up to whole chunks of {self.chunk_size:,} exceed "
                f"{SAMPLES_MAX:,}, the most a run can count; lower samples or chunk_size"
            )
        return self

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
