"""What the registry holds: a :class:`Family` declares everything about one statistic family on its class — how
it is built from its configuration section, what it accumulates (the :class:`~.base.Statistic` protocol), its
cost per sample, the size of its partial, its pilot pass, its form and the words describing its arrays — so
that the generic code (the cost model, the planner, the store's xarray view) asks the class and never names
a family.

The class methods the planner calls (``work``, ``entries``, ``form``, the pilot's) take the family's
configuration section as a mapping or as its pydantic model (the planner prices a method's statistics as
mappings before they are validated) and read it with :func:`~.work.option`; ``from_config`` gets the model.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from .base import Statistic
from .build import FamilyContext
from .work import Work, option

__all__ = ["Family", "DEFAULT_PILOT_SAMPLES"]

#: samples of a pilot pass whose section leaves its count unset (the sections' own default)
DEFAULT_PILOT_SAMPLES = 100_000


class Family(Statistic):
    """A statistic family: the :class:`~.base.Statistic` it accumulates, and its declarations by class.

    ``descriptions`` maps each estimand and coordinate to ``(long_name, description)``; ``pilot_key`` names
    the section's option that holds its pilot pass's sample count (None: the family has no pilot pass).
    """

    descriptions: ClassVar[Mapping[str, tuple[str, str]]] = {}
    pilot_key: ClassVar[str | None] = None

    @classmethod
    @abstractmethod
    def from_config(cls, section: Any, ctx: FamilyContext) -> Statistic:
        """The statistic a configuration section asks for, with its banks and grids resolved."""

    @classmethod
    @abstractmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """Work per sample at input dimension ``d`` for a label of ``outputs`` outputs (1: a scalar label)."""

    @classmethod
    @abstractmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        """``(sums, terms)``: float64 entries of one chunk's accumulator and of its terms, as the schemas
        declare them, for a label of ``outputs`` outputs."""

    @classmethod
    def form(cls, section: Any) -> str:
        """How the planner shows the family: ``contracted dense`` (the sketch says its rank)."""
        return f"{cls.name} dense"

    @classmethod
    def runs_pilot(cls, section: Any) -> bool:
        """Whether the section runs a pilot pass before the first block (τ quantiles, a control variate)."""
        return False

    @classmethod
    def pilot_samples(cls, section: Any) -> int:
        """Samples of the pilot pass the section runs (0: none)."""
        if cls.pilot_key is None or not cls.runs_pilot(section):
            return 0
        return int(option(section, cls.pilot_key) or DEFAULT_PILOT_SAMPLES)

    @classmethod
    def pilot_floor(cls, d: int) -> int:
        """The fewest pilot samples worth drawing at input dimension ``d`` beyond the planner's own floor."""
        return 0

    @classmethod
    def describe(cls, name: str) -> tuple[str, str] | None:
        """``(long_name, description)`` of the estimand or coordinate ``name``; None for a name it does not know."""
        return cls.descriptions.get(name)
