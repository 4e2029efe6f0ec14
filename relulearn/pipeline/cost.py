"""The cost model of an accumulation pass: the work each statistic family does per sample, in each of its forms,
priced by rates measured on this machine.

Pure functions of a configuration and a :class:`Rates` (no Dask, no store): :mod:`.projection` assembles them
into the passes of a run, and the planner compares forms by their projected time. Work is counted as

* BLAS-3 flops, each product with its *size* (the smallest of its dimensions other than the rows: d for a d × d
  Gram, r for the skinny ``X Ω``); one BLAS thread reaches ``peak · s / (s + half)`` flop/s on products of size s
  (:meth:`Rates.blas`: small products run far below peak);
* bytes of memory-bound numpy work (weights, gathers, the chunk's own accumulator added and squared), and
  apart the bytes written into fresh temporaries (a broadcast product's result: its pages are touched first,
  several times slower per byte than work in place);
* Gaussian numbers drawn (the inputs, and the noise).

A teacher known to relulearn (a planted network) has its forward pass counted; a black box (ONNX, a callable,
a data file) is timed on a probe batch by :func:`.calibration.source_cost`, which, with :func:`.calibration.calibrate`
(the :class:`Rates`), is where everything measured comes from: this module only counts and prices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .stats.work import Work

__all__ = [
    "Work",
    "Rates",
    "SourceCost",
    "family_work",
    "statistics_work",
    "teacher_work",
    "counted_source_cost",
    "sums_entries",
]

_F = 8  # bytes of a float64


@dataclass(frozen=True)
class Rates:
    """What one core of this machine does per second, as :func:`.calibration.calibrate` measured it.

    ``peak`` flop/s of one BLAS thread on large products, reached at half by products of size ``half``;
    ``memory`` bytes/s of elementwise numpy work in place, ``fresh`` bytes/s written by a broadcast product into
    a new array (0: not measured, a third of ``memory``); ``normals`` Gaussian numbers/s of the sample streams
    (SFC64);
    ``disk`` bytes/s of a commit (compressed zarr chunks written and synced); ``task`` seconds of a Dask task's
    round trip (scheduling, pickling a small result); ``setup`` seconds a pass spends whatever its size (the
    store's lease, metadata and statistics set up, its commits' fixed part: a tiny run measured end to end)."""

    peak: float
    half: float
    memory: float
    normals: float
    disk: float
    task: float = 0.03  # a block on a local cluster: submitted, its partial returned and merged (0.02–0.04 s here)
    setup: float = 0.5
    fresh: float = 0.0
    machine: str = ""
    measured: str = ""

    def blas(self, size: int) -> float:
        """flop/s of one BLAS thread on products of ``size``."""
        s = max(1.0, float(size))
        return self.peak * s / (s + self.half)

    def seconds(self, work: Work) -> float:
        """Seconds of one core for ``work``."""
        return (
            sum(f / self.blas(s) for f, s in work.gemm)
            + work.stream / self.memory
            + work.fresh / (self.fresh or self.memory / 3)
            + work.normals / self.normals
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------- families


def _section(cfg: Any, name: str) -> Any:
    return cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)


def family_work(name: str, section: Any, d: int, outputs: int | None = None) -> Work:
    """The work per sample of one configured statistic family (``section``: its config section, a mapping or
    the pydantic model) at input dimension ``d``, for a source of ``outputs`` outputs (None: a scalar label),
    as the family's class declares it (:meth:`~.stats.family.Family.work`).

    Families computed once per output (all but ``output_moments`` and the label-free part of ``basic``) count
    ``outputs`` times."""
    from .stats.registry import FAMILIES  # here: the families' modules load only when a plan is priced

    family = FAMILIES.get(name)
    if family is None:
        raise ValueError(f"no cost model for the statistic family {name!r}")
    return family.work(section, d, int(outputs or 1))


def statistics_work(statistics: Any, d: int, outputs: int | None = None) -> dict[str, Work]:
    """:func:`family_work` of every family a ``statistics`` section (a mapping, or the pydantic model) enables."""
    if hasattr(statistics, "enabled"):
        sections = statistics.enabled()
    else:
        sections = {k: v for k, v in statistics.items() if v is not None}
    return {name: family_work(name, sec, d, outputs) for name, sec in sections.items()}


def teacher_work(teacher: Any, d: int) -> Work | None:
    """The forward pass of a teacher relulearn builds (planted networks), per sample; None for a black box
    (a file, ONNX model or callable: :func:`.calibration.source_cost` times it)."""
    kind = _section(teacher, "kind")
    if kind == "one_hidden_relu":
        k = int(_section(teacher, "width") or 1)
        return Work(((2.0 * d * k, k),), stream=_F * 2 * k)
    if kind in ("deep_relu", "random_xavier"):
        dims = [d] + [int(w) for w in _section(teacher, "widths")] + [1]
        return Work(tuple((2.0 * a * b, min(a, b)) for a, b in zip(dims[:-1], dims[1:])), stream=_F * 4 * sum(dims[1:]))
    if kind == "two_layer":
        k, m = int(_section(teacher, "width")), int(_section(teacher, "outputs"))
        return Work(((2.0 * d * k, k), (2.0 * k * m, min(k, m))), stream=_F * 4 * (k + m))
    return None


def sums_entries(statistics: Any, d: int, outputs: int | None = None) -> dict[str, tuple[int, int]]:
    """``(sums, terms)`` float64 entries of one chunk's accumulator of each family, as their schemas declare them
    (:meth:`~.stats.family.Family.entries`): a block partial holds both (the sums, and the sums of the squared
    terms); a chunk allocates the sums."""
    from .stats.registry import FAMILIES

    m = int(outputs or 1)
    out: dict[str, tuple[int, int]] = {}
    sections = (
        statistics.enabled()
        if hasattr(statistics, "enabled")
        else {k: v for k, v in statistics.items() if v is not None}
    )
    for name, sec in sections.items():
        if name in FAMILIES:
            out[name] = FAMILIES[name].entries(sec, d, m)
    return out


# --------------------------------------------------------------------------------------------- source


@dataclass(frozen=True)
class SourceCost:
    """Seconds per sample of the source on one core: drawing the inputs and labels; ``probed`` when timed on a
    probe batch (a black-box teacher or a data file)."""

    seconds: float
    generation: float
    teacher: float
    probed: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the teacher's outputs per row (a black box's from its probe): a worker holds its answers to a whole batch
    answers: int = 1


def counted_source_cost(cfg: Any, rates: Rates) -> SourceCost:
    """The source's cost per sample as the configuration tells it: Gaussian inputs (and noise) at
    ``rates.normals`` plus a planted teacher's forward pass (:func:`teacher_work`). A black box's or a data
    file's own time is not counted here (a note says so): only a probe tells it
    (:func:`.calibration.source_cost`)."""
    src = cfg.source
    d = int(src.d)
    if src.data is not None:
        return SourceCost(0.0, 0.0, 0.0, False, ("the data file's read time is not counted",))
    gen = rates.seconds(Work(normals=d + (1 if src.noise_std else 0), stream=_F * d))
    work = teacher_work(src.teacher, d)
    if work is not None:
        t = rates.seconds(work)
        return SourceCost(gen + t, gen, t)
    return SourceCost(gen, gen, 0.0, False, ("the black-box teacher's time is not counted",))
