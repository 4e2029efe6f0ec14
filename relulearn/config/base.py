"""What every part of the configuration shares: the error it raises and the base of its sections."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigError", "SEED_MAX", "SAMPLES_MAX"]

#: the largest seed: the store's ledger keeps the run's seed in an int64 column (numpy's SeedSequence would take
#: any size); every seed of a configuration has the same range
SEED_MAX = 2**63 - 1
#: the most samples a run can count: the ledger's sample and chunk columns are int64 too
SAMPLES_MAX = 2**63 - 1


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message says what to change."""


class _Section(BaseModel):
    # every number of a configuration is finite (NaN or inf refused naming the key): no key means "unbounded" by inf
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)
