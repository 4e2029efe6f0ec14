"""Types every learning method shares (docs/design.md §6).

A method is a pure function ``learn(stats, passes, samples, *, mapper, seed, **options)``
that returns a :class:`LearnResult` or a :class:`PassRequest`; ``api`` runs the pass and
calls it again. Each method module depends on these shared pieces only, never on another
method.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, cast

import numpy as np

from ..network import Network

if TYPE_CHECKING:
    from ..polynomial import PolynomialModel

__all__ = [
    "Arrays",
    "BudgetError",
    "TooFewSamplesError",
    "MissingStatisticError",
    "configured_lack",
    "section_get",
    "NoSignalError",
    "PassRequest",
    "Samples",
    "SampleDraw",
    "LearnResult",
    "MethodEntry",
    "SketchableEntry",
    "PlannedPassesEntry",
    "sketchable",
    "plans_passes",
    "method_entry",
    "teacher_width",
    "LearnStep",
]

Arrays = Mapping[str, np.ndarray]


class MissingStatisticError(ValueError):
    """A store lacks a statistic the method needs; the message gives the config lines."""

    @classmethod
    def lacking(cls, method: str, statistic: str, what: str, section: str) -> MissingStatisticError:
        """The error for a store without ``statistic`` (``what`` it holds), with the config line
        ``statistic: section`` that produces it."""
        return cls(
            f"the '{method}' method needs the '{statistic}' statistic ({what}), which this store lacks; add to the "
            f"configuration\n  statistics:\n    {statistic}: {section}\nand estimate into a new store (or use "
            "`relulearn fit`, which chooses the statistics itself)"
        )


def configured_lack(method: str, statistic: str, what: str, section: str) -> MissingStatisticError:
    """The error for a configuration whose ``statistics`` section lacks ``statistic``, raised by ``fit`` before
    anything is written (a store's lack is :meth:`MissingStatisticError.lacking`)."""
    return MissingStatisticError(
        f"the '{method}' method needs the '{statistic}' statistic ({what}), which the configuration's statistics "
        f"section lacks; add `{statistic}: {section}` under statistics (or remove the section: fit then estimates "
        "the method's own statistics). Nothing was written"
    )


def section_get(section: Any, key: str) -> Any:
    """A key of a statistics section, given as a mapping or as its pydantic model."""
    return section.get(key) if isinstance(section, Mapping) else getattr(section, key, None)


class NoSignalError(ValueError):
    """The statistics hold no direction above their noise floor: nothing but the mean can be learned from
    them at this sample count (the message says how to get more samples), or at any (``more_samples`` false:
    constant labels, a teacher outside the method's setting; :mod:`.spectral.signal`)."""

    def __init__(self, message: str, more_samples: bool = True):
        super().__init__(message)
        self.more_samples = more_samples


class TooFewSamplesError(ValueError):
    """The statistics are too noisy at this sample count for what was asked; the message gives the count
    needed."""


class BudgetError(ValueError):
    """An enumeration does not fit its budget of candidate evaluations; ``needed`` is the smallest budget
    that pays for one stage and ``wanted`` the one that pays for every stage."""

    def __init__(self, message: str, needed: int, wanted: int):
        super().__init__(message)
        self.needed, self.wanted = int(needed), int(wanted)


@dataclass(frozen=True)
class PassRequest:
    """A request for one more accumulation pass, with the statistics it should compute."""

    name: str
    statistics: dict
    reason: str


@dataclass(frozen=True)
class Samples:
    """Bounded samples a method fits on: a training and a validation part.

    ``y_train`` and ``y_val`` are ``(n,)`` for a scalar label and ``(n, m)`` for a source with
    ``m`` outputs.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray


class SampleDraw(Protocol):
    """What a method is handed to draw samples from the run's source (never the run's chunks).

    Calling it returns a :class:`Samples` of ``n_train`` and ``n_val`` samples; ``part(p, n)``
    returns ``n`` samples ``(x, y)`` of the independent draw ``p`` (``p >= 2``; 0 and 1 are the
    training and validation parts). It is picklable, so a method may call ``part`` inside the
    functions it maps over a cluster (a streamed refinement over many samples).
    """

    def __call__(self, n_train: int, n_val: int) -> Samples: ...

    def part(self, p: int, n: int) -> tuple[np.ndarray, np.ndarray]: ...

    @property
    def noiseless(self) -> bool:
        """Whether the labels are a teacher's exact answers (no noise added, not a data file's labels)."""
        ...


def part_batches(draw: Any, p: int, n: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Part ``p`` of ``draw`` batch by batch when the draw streams it (an optional
    ``part_batches(p, n)``, as :class:`relulearn.api.execution.HeldOut` has), else as one batch (``part``)."""
    batches = getattr(draw, "part_batches", None)
    if batches is None:
        yield draw.part(int(p), int(n))
        return
    yield from batches(int(p), int(n))


def part_sum(fn: Callable[[np.ndarray, np.ndarray], Any], draw: Any, p: int, n: int) -> Any:
    """``fn(x, y)`` added over the batches of part ``p`` in order (results support ``+``): a mapped
    function holds one batch of inputs, never the whole part (at d = 10^4 a 268 MB array per part,
    page-faulted afresh each time)."""
    total = None
    for x, y in part_batches(draw, p, n):
        got = fn(x, y)
        total = got if total is None else total + got
    return total


@dataclass(frozen=True)
class LearnResult:
    """A learned network and the method's report (JSON-ready)."""

    network: Network | PolynomialModel
    report: dict = field(default_factory=dict)


class MethodEntry(Protocol):
    """What the entry module of a method's sub-package provides (``relulearn.estimators.<method>.entry``), read
    by :func:`relulearn.methods.method_module`'s callers; mypy checks every method's module against it
    (:mod:`relulearn.estimators.conformance`)."""

    #: the most extra passes the method asks for in one learn
    MAX_PASSES: int

    def required_statistics(self, d: int, width: int | None = None) -> dict:
        """The ``statistics`` section of a run configuration holding what the method needs."""
        ...

    def lacks(self, sections: Mapping[str, Any], outputs: int | None = None) -> MissingStatisticError | None:
        """What the configuration's statistics ``sections`` lack for the method, or None."""
        ...

    def check_setting(self, source: Any, options: dict[str, Any], outputs: int | None) -> dict[str, Any]:
        """The options checked against the source (the method's setting), before anything is written."""
        ...

    def learn(
        self,
        stats: Mapping[str, Arrays],
        passes: Sequence[Mapping[str, Arrays]],
        samples: Callable[[int, int], Samples],
        *,
        width: int | None = None,
        mapper: Callable = map,
        seed: int = 0,
    ) -> LearnResult | PassRequest:
        """The network learned from the statistics (and the passes asked for), or the next pass to run."""
        ...


class SketchableEntry(MethodEntry, Protocol):
    """A method whose d × d families may be sketched (``fit`` plans their memory)."""

    #: the d × d families the method reads, and how many d × d matrices each holds per output
    DENSE_FAMILIES: dict[str, int]

    def sketch_rank(self, d: int, width: int | None) -> int:
        """The sketch's rank for inputs of dimension ``d`` and a network of ``width`` units."""
        ...

    def sketch_passes(self, d: int, width: int | None) -> list[tuple[str, dict, bool]]:
        """The passes the sketched route adds, for planning: ``(name, statistics, optional)``."""
        ...


class PlannedPassesEntry(MethodEntry, Protocol):
    """A method whose learn asks for passes the planner can shape before the first pass (``fit`` projects them),
    and states its own costs after them."""

    def planned_passes(
        self, d: int, width: int | None = None, outputs: int | None = None
    ) -> list[tuple[str, dict, bool]]:
        """The passes the learn asks for, for planning: ``(name, statistics, optional)``."""
        ...

    def learn_costs(self, d: int, width: int | None = None, outputs: int | None = None, samples: int = 0) -> list[str]:
        """The learn's own costs after the passes, in words (the plan's notes)."""
        ...

    def learn_steps(
        self, d: int, width: int | None = None, outputs: int | None = None, samples: int = 0
    ) -> list[LearnStep]:
        """The learn's own steps after the passes, for the plan to price (:class:`LearnStep`)."""
        ...


@dataclass(frozen=True)
class LearnStep:
    """One step of a learn after its passes, as the planner prices it (:mod:`relulearn.runplan`): ``expected``
    repetitions on the way an exact recovery usually goes, ``most`` at most (0: the step runs only when the
    first result falls short).

    A step is either work on the driver, per repetition ``gemm`` (flops by product size), ``stream`` (bytes
    worked in place), ``fresh`` (bytes written into new arrays) and ``calls`` (numpy calls, whose fixed cost
    matters for small arrays); or a pass over ``samples`` fresh samples of the source accumulating
    ``statistics`` (a section as :func:`relulearn.runplan.plan_run` projects one), priced as a pass is."""

    name: str
    expected: int
    most: int
    gemm: tuple[tuple[float, int], ...] = ()
    stream: float = 0.0
    fresh: float = 0.0
    calls: int = 0
    statistics: dict | None = None
    samples: int = 0
    words: str = ""


def method_entry(name: str) -> MethodEntry:
    """The entry module of method ``name`` (:func:`relulearn.methods.method_module`, imported when first asked
    for), typed as the interface every entry provides (mypy checks each: :mod:`relulearn.estimators.conformance`)."""
    from ..methods import method_module

    return cast(MethodEntry, method_module(name))


def sketchable(entry: MethodEntry) -> TypeGuard[SketchableEntry]:
    """Whether a method's entry module may sketch its d × d families (it declares ``DENSE_FAMILIES``)."""
    return hasattr(entry, "DENSE_FAMILIES")


def plans_passes(entry: MethodEntry) -> TypeGuard[PlannedPassesEntry]:
    """Whether a method's entry module shapes the passes its learn asks for (it declares ``planned_passes``)."""
    return hasattr(entry, "planned_passes")


def teacher_width(source: Any) -> int | None:
    """The hidden width of a one-hidden-layer teacher the source can say before any sample: a network planted or
    read from a file (its first weight matrix), or an ONNX model with one activation layer whose width its graph
    fixes (``hidden_widths``); None for anything else (a callable, a deeper network, data). Planning and the
    checks made before a run read it; no method learns from it."""
    net = getattr(source, "network", None)
    if net is not None:
        return int(net.weights[0].shape[0]) if net.depth == 1 else None
    widths = source.hidden_widths() if hasattr(source, "hidden_widths") else None
    return widths[0] if widths is not None and len(widths) == 1 else None
