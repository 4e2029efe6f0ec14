"""What a family is built from: the run's configuration, the pilot pass (drawn by the executor, so that no
family imports a source) or the store (for the direction banks and τ grids drawn before), and the label's output
count (the classes the registry holds are :class:`~.family.Family` subclasses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ...config import RunConfig
from .base import Statistic
from .per_output import PerOutput

__all__ = ["FamilyContext", "Pilot", "drawn"]

#: the pilot pass: ``pilot(n)`` yields its first ``n`` samples in checked batches ``(x, y)``
Pilot = Callable[[int], Iterator[tuple[np.ndarray, np.ndarray]]]


@dataclass(frozen=True)
class FamilyContext:
    """What every family's :meth:`~.family.Family.from_config` gets.

    ``pilot(n)`` yields the pilot pass's first ``n`` samples in batches ``(x, y)``, each checked for NaN and inf
    (the same samples on every call: the pilot stream of the run's seed). ``stored(name)``, when given, returns a
    committed statistic's arrays: its direction bank and τ grid are then taken from the store instead of being
    drawn again (``pilot`` is then None). ``outputs`` is the number of outputs of a label vector (None: a scalar
    label).
    """

    cfg: RunConfig
    pilot: Pilot | None
    stored: Callable[[str], Mapping[str, np.ndarray]] | None
    outputs: int | None

    @property
    def d(self) -> int:
        """The input dimension."""
        return self.cfg.source.d

    def per_output(self, make: Callable[[int | None], Statistic]) -> Statistic:
        """``make(j)``, the statistic of output ``j`` (``j`` None: of the scalar label), as the run needs it:
        itself for a scalar label, a :class:`PerOutput` of one per output for a label vector."""
        m = self.outputs
        return make(None) if m is None else PerOutput(make(j) for j in range(m))


def drawn(pilot: Pilot | None) -> Pilot:
    """The pilot pass where a family draws one: there is always one then (without a source, a family reads what it
    drew from the store instead)."""
    assert pilot is not None, "a family draws its pilot pass only where the run has a source"
    return pilot
