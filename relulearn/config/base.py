"""What every part of the configuration shares: the error it raises and the base of its sections."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message says what to change."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
