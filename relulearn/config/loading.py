"""Loading a configuration: from a dict (the parsed YAML) or from a YAML file, validated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..filekind import not_a_file
from .base import ConfigError
from .messages import _format_errors
from .run import RunConfig

__all__ = ["load_config", "config_from_dict"]


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


#: the deepest nesting of mappings and lists a configuration may have (a real one is 4 levels deep): PyYAML's
#: composer recurses once per level and raised RecursionError at about a thousand
MAX_DEPTH = 100
_OPEN = (
    yaml.BlockMappingStartToken,
    yaml.BlockSequenceStartToken,
    yaml.FlowMappingStartToken,
    yaml.FlowSequenceStartToken,
)
_CLOSE = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


def _check_depth(text: str, path: Path) -> None:
    """Refuse YAML nested deeper than :data:`MAX_DEPTH`, from its tokens (the scanner does not recurse)."""
    depth = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(token, _OPEN):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(
                    f"configuration file {path} is nested more than {MAX_DEPTH} levels deep (line "
                    f"{token.start_mark.line + 1}); a run's configuration is a few levels deep: check the file"
                )
        elif isinstance(token, _CLOSE):
            depth -= 1


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a run configuration from a YAML file.

    Raises
    ------
    ConfigError
        If the file is missing, is not YAML, is nested more than :data:`MAX_DEPTH` levels deep, or does not
        satisfy the schema. The
        message names each offending key and, for unknown keys, the closest valid one.
    """
    path = Path(path)
    kind = not_a_file(path)  # before it is opened: /dev/zero is read for ever, a FIFO waits for a writer
    if kind is not None and not kind.startswith("does not exist"):  # a missing file: said by the read below
        raise ConfigError(f"configuration file {path} {kind}; give the path of the run's YAML configuration file")
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
        _check_depth(text, path)
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"configuration file {path} is not valid YAML: {err}") from None
    return config_from_dict(data, where=f"in {path}", base_dir=str(path.resolve().parent))
