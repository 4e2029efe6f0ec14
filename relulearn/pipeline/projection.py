"""Projected time and memory of the passes of a run, from the cost model (:mod:`.cost`): pure planning, no work.

A pass of ``n`` samples in chunks of ``c`` and blocks of ``b`` chunks costs

* on the workers, in parallel: every sample's source (inputs, teacher) and statistic updates, and every chunk's
  accumulator (allocated, added into the block's partial, its terms squared);
* on the driver: every block partial received and merged, and every commit (one per ``run.commit_interval``
  and the last) written; on a local cluster the driver shares the cores with the workers, so its time adds;
* before the first block: the pilot passes of the statistics that need one (τ quantiles, the control variate),
  on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .batches import batch_rows
from .cost import Rates, SourceCost, Work, counted_source_cost, statistics_work, sums_entries
from .plan import check_directions, check_partial_shares
from .sizes import BATCH_COPIES, answers_bytes, format_bytes

__all__ = [
    "FamilyCost",
    "PassPlan",
    "PassShape",
    "Accumulator",
    "project_pass",
    "accumulator",
    "pass_seconds",
    "pass_bytes",
    "makespan",
    "format_seconds",
    "format_bytes",
    "check_statistics_sizes",
]

_F = 8

#: copies of a block partial on its way to the driver's merged state: pickled, sent, unpickled, added
MERGE_COPIES = 6

#: passes over a chunk's accumulator: zeroed, added into the partial, its terms formed, squared and added
CHUNK_COPIES = 5


@dataclass(frozen=True)
class FamilyCost:
    """One statistic family in a pass: its form, work per sample and bytes of its block partial."""

    name: str
    form: str
    flops_per_sample: float
    stream_bytes_per_sample: float
    partial_bytes: int
    seconds_per_sample: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "form": self.form,
            "flops_per_sample": self.flops_per_sample,
            "bytes_per_sample": self.stream_bytes_per_sample,
            "partial_bytes": self.partial_bytes,
            "seconds_per_sample": self.seconds_per_sample,
        }


@dataclass(frozen=True)
class PassPlan:
    """The projection of one pass: what it computes and where its time goes (seconds of wall time); a run's plan
    (:class:`relulearn.runplan.RunPlan`) holds one per pass, and ``fit`` runs them."""

    name: str
    samples: int
    chunks: int
    blocks: int
    workers: int
    families: tuple[FamilyCost, ...]
    source: SourceCost
    seconds: dict[str, float]
    worker_bytes: int
    driver_bytes: int
    optional: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the ``statistics`` section the pass accumulates, as its run configuration takes it (a subspace pass's
    #: basis and expansion with the shapes they will have, their values placeholders until the method gives them)
    statistics: dict | None = None

    @property
    def projected_seconds(self) -> float:
        return float(sum(self.seconds.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "samples": self.samples,
            "chunks": self.chunks,
            "blocks": self.blocks,
            "workers": self.workers,
            "optional": self.optional,
            "projected_seconds": self.projected_seconds,
            "seconds": dict(self.seconds),
            "families": [f.to_dict() for f in self.families],
            "source_seconds_per_sample": self.source.seconds,
            "source_probed": self.source.probed,
            "worker_bytes": self.worker_bytes,
            "driver_bytes": self.driver_bytes,
            "notes": list(self.notes) + list(self.source.notes),
        }


def _form(name: str, section: Any) -> str:
    """How a family is shown: ``contracted dense``, ``second sketch r=32``, ``second subspace r=32``
    (:meth:`~.stats.family.Family.form`)."""
    from .stats.registry import FAMILIES

    family = FAMILIES.get(name)
    return f"{name} dense" if family is None else family.form(section)


def _sections(statistics: Any) -> dict[str, Any]:
    if hasattr(statistics, "enabled"):
        return statistics.enabled()
    return {k: v for k, v in statistics.items() if v is not None}


def _pilot_samples(statistics: Any) -> int:
    """Samples of the pilot passes a statistics section runs before its first block (the driver draws them):
    each family's :meth:`~.stats.family.Family.pilot_samples`."""
    from .stats.registry import FAMILIES

    return sum(FAMILIES[name].pilot_samples(sec) for name, sec in _sections(statistics).items() if name in FAMILIES)


@dataclass(frozen=True)
class PassShape:
    """How a pass is cut: its samples (whole chunks), its chunks, blocks of ``per_block`` chunks (the last maybe
    fewer), and the single-threaded workers that take them."""

    samples: int
    chunks: int
    per_block: int
    blocks: int
    workers: int

    @classmethod
    def of(cls, cfg: Any, samples: int | None, workers: int) -> PassShape:
        """The shape of a pass of ``samples`` (default ``cfg.samples``) rounded up to whole chunks."""
        n = int(cfg.samples if samples is None else samples)
        chunks = -(-n // int(cfg.chunk_size))
        per_block = int(cfg.run.chunks_per_block)
        return cls(chunks * int(cfg.chunk_size), chunks, per_block, -(-chunks // per_block), max(1, int(workers)))


@dataclass(frozen=True)
class Accumulator:
    """A pass's families and the float64 entries of one chunk's accumulator: ``sums`` (what a chunk allocates)
    and ``terms`` (the sums of squared per-chunk terms a block partial holds beside them)."""

    families: tuple[FamilyCost, ...]
    sums: int
    terms: int

    @property
    def partial_bytes(self) -> int:
        """Bytes of a block partial: the sums and the terms."""
        return _F * (self.sums + self.terms)


def project_pass(
    cfg: Any,
    rates: Rates,
    *,
    workers: int,
    samples: int | None = None,
    statistics: Any = None,
    name: str = "estimate",
    optional: bool = False,
    source: SourceCost | None = None,
    outputs: int | None = None,
) -> PassPlan:
    """The projection of one accumulation pass of ``cfg`` (its ``statistics``, or the ``statistics`` given: a
    mapping or the pydantic section) over ``samples`` (default ``cfg.samples``) on ``workers`` single-threaded
    workers (1: in process).

    ``source`` is the source's cost as measured (:func:`.calibration.source_cost`; default: as counted from the
    configuration, :func:`.cost.counted_source_cost`, a black box's own time left out);
    ``outputs`` the label vector's length (None: a scalar label)."""
    stats = cfg.statistics if statistics is None else statistics
    shape = PassShape.of(cfg, samples, workers)
    src = source if source is not None else counted_source_cost(cfg, rates)
    acc = accumulator(stats, int(cfg.source.d), outputs, rates)
    worker_bytes, driver_bytes = pass_bytes(cfg, shape, src, acc, outputs)
    return PassPlan(
        name,
        shape.samples,
        shape.chunks,
        shape.blocks,
        shape.workers,
        acc.families,
        src,
        pass_seconds(cfg, rates, shape, src, acc, stats),
        worker_bytes=worker_bytes,
        driver_bytes=driver_bytes,
        optional=optional,
    )


def accumulator(stats: Any, d: int, outputs: int | None, rates: Rates) -> Accumulator:
    """Each family of ``stats`` (a mapping or the pydantic section) with its form, work per sample and partial
    bytes at input dimension ``d``, and the entries of one chunk's accumulator of them all."""
    works = statistics_work(stats, d, outputs)
    entries = sums_entries(stats, d, outputs)
    families = []
    for fam, work in works.items():
        e_sums, e_terms = entries.get(fam, (0, 0))
        families.append(
            FamilyCost(
                fam,
                _form(fam, _sections(stats)[fam]),
                work.flops,
                work.stream,
                _F * (e_sums + e_terms),
                rates.seconds(work),
            )
        )
    return Accumulator(tuple(families), sum(e for e, _ in entries.values()), sum(e for _, e in entries.values()))


def pass_seconds(
    cfg: Any, rates: Rates, shape: PassShape, src: SourceCost, acc: Accumulator, stats: Any
) -> dict[str, float]:
    """Where a pass's wall time goes, in seconds: the workers' share (generation, teacher, update, chunks), and
    the driver's (setup, merge, commit, the pilot passes of ``stats``)."""
    update = sum(f.seconds_per_sample for f in acc.families)
    partial = acc.partial_bytes
    chunk_seconds = rates.seconds(Work(stream=CHUNK_COPIES * _F * (acc.sums + acc.terms)))
    # the workers' wall time: the blocks (``per_block`` chunks, the last maybe fewer) taken in order by the
    # first free worker; 5 equal blocks on 2 workers take 3 blocks' time, not 2.5
    share = makespan(shape.chunks, shape.per_block, shape.workers) / shape.chunks
    n = shape.samples
    parallel = {
        "generation": n * src.generation * share,
        "teacher": n * src.teacher * share,
        "update": n * update * share,
        "chunks": shape.chunks * chunk_seconds * share,
    }
    worker_wall = sum(parallel.values())
    merge = shape.blocks * (rates.seconds(Work(stream=MERGE_COPIES * partial)) + rates.task)
    commit_each = partial / rates.disk + rates.seconds(Work(stream=2 * partial))
    commits = (
        1 + int(worker_wall // max(float(cfg.run.commit_interval), 1e-9))
        if cfg.run.commit_interval > 0
        else shape.blocks
    )
    pilot_n = _pilot_samples(stats)
    if cfg.source.data is not None:  # a data source's pilot reads its first rows: at most the run's
        pilot_n = min(pilot_n, n)
    d = int(cfg.source.d)
    return dict(
        parallel,
        setup=rates.setup,
        merge=merge,
        commit=commits * commit_each,
        pilot=pilot_n * (src.seconds + rates.seconds(Work(stream=_F * 2 * d))),
    )


def pass_bytes(cfg: Any, shape: PassShape, src: SourceCost, acc: Accumulator, outputs: int | None) -> tuple[int, int]:
    """Bytes a pass holds on a worker (a block partial, a chunk's sums, a batch of inputs and the teacher's answers
    to it) and on the driver (the merged state and the partials in flight)."""
    d = int(cfg.source.d)
    partial = acc.partial_bytes
    # a batch of inputs, and the teacher's answers to it (a black box's outputs per row, from its probe)
    batch = BATCH_COPIES * _F * batch_rows(d) * d + answers_bytes(d, max(src.answers, outputs or 1))
    in_flight = cfg.run.max_blocks_in_flight or 2 * shape.workers + 1
    return int(partial + _F * acc.sums + batch), int(partial * (1 + in_flight))


def makespan(chunks: int, per_block: int, workers: int) -> float:
    """Chunks' worth of time until the last block of a pass is done: blocks of ``per_block`` chunks (the last
    one the rest) taken in order by whichever of ``workers`` equal workers is free first."""
    full, rest = divmod(int(chunks), int(per_block))
    workers = max(1, int(workers))
    if full + (rest > 0) <= workers:
        return float(per_block if full else rest)
    rounds, left = divmod(full, workers)  # equal blocks fill whole rounds; then the leftover ones and the rest
    if left == 0:
        return float(rounds * per_block + (rest if rest else 0))
    return float(rounds * per_block + per_block)  # the rest goes to a worker free after `rounds` blocks


def format_seconds(s: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``: a duration as a person reads it."""
    if s < 90:
        return f"{s:.0f} s" if s >= 1 else f"{s:.2g} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def seconds_split(plans: list[PassPlan]) -> dict[str, float]:
    """Where the time of ``plans`` goes, summed over them."""
    out: dict[str, float] = {}
    for p in plans:
        for k, v in p.seconds.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _outputs(source: Any) -> int | None:
    """The label vector's length as the configuration states it (a black box's is known only once it answers)."""
    teacher = source.teacher
    if source.data is None and getattr(teacher, "kind", None) == "two_layer" and source.output is None:
        return int(teacher.outputs)
    return None


def check_statistics_sizes(cfg: Any, where: str = "the configuration", outputs: int | None = None) -> None:
    """Refuse statistics whose block partial, counted from the configuration, exceeds ``run.worker_memory``,
    before the source or the statistics are built (:func:`.plan.check_partial_bytes` checks the built ones);
    ``where`` names the run (its store) in the message; ``outputs`` the label vector's length where the
    configuration does not state it (a black box's, from its probe).

    Raises
    ------
    MemoryBudgetError
        Naming the bytes needed, each family's share and what to change.
    """
    d, m, budget = int(cfg.source.d), outputs or _outputs(cfg.source), int(cfg.run.worker_memory)
    contracted = cfg.statistics.contracted
    if contracted is not None and 8 * len(contracted.orders) * d * d * (m or 1) <= budget:
        # one direction fits: the count of directions is what to lower, and its own message names the count that fits
        check_directions(contracted, d, m, budget)
    entries = sums_entries(cfg.statistics, d, m)
    check_partial_shares({name: _F * (sums + terms) for name, (sums, terms) in entries.items()}, budget, where)
