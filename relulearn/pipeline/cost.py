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

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

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
class Work:
    """Work per sample: BLAS-3 flops by product size, memory-bound bytes (in place, and written into fresh
    temporaries), Gaussian numbers drawn."""

    gemm: tuple[tuple[float, int], ...] = ()
    stream: float = 0.0
    normals: float = 0.0
    fresh: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(
            self.gemm + other.gemm, self.stream + other.stream, self.normals + other.normals, self.fresh + other.fresh
        )

    def scaled(self, c: float) -> Work:
        """The work of ``c`` copies (``c`` outputs computed one after the other)."""
        return Work(tuple((f * c, s) for f, s in self.gemm), self.stream * c, self.normals * c, self.fresh * c)

    @property
    def flops(self) -> float:
        return float(sum(f for f, _ in self.gemm))


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


def _syrk(d: int) -> tuple[float, int]:
    """A Gram ``Xᵀ X`` (or two signed ones, rows of positive and of negative weight): d(d + 1) flops per sample."""
    return (float(d) * (d + 1), d)


def _gram_work(d: int, matrices: int, *, weighted: bool = True) -> Work:
    """``matrices`` d × d sums of ``w x xᵀ``: a syrk each above d = 64 (the rows gathered or weighted once per
    matrix, in place), one GEMM per row batch for all below it (2 d² flops each, on a fresh weighted copy of
    the rows for every matrix, which the GEMM then reads)."""
    from ..hermite.contracted import _SYRK_MIN_D

    if d >= _SYRK_MIN_D:
        return Work(((matrices * float(d) * (d + 1), d),), stream=(2 if weighted else 1) * _F * d * matrices)
    flops = (2.0 * matrices * d * d, min(d, matrices * d))
    if not weighted:
        return Work((flops,), stream=_F * d * matrices)
    return Work((flops,), stream=_F * d * matrices, fresh=_F * d * matrices)


def _section(cfg: Any, name: str) -> Any:
    return cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)


def _count(directions: Any) -> int:
    return directions if isinstance(directions, int) else len(directions)


def family_work(name: str, section: Any, d: int, outputs: int | None = None) -> Work:
    """The work per sample of one configured statistic family (``section``: its config section, a mapping or
    the pydantic model) at input dimension ``d``, for a source of ``outputs`` outputs (None: a scalar label).

    Families computed once per output (all but ``output_moments`` and the label-free part of ``basic``) count
    ``outputs`` times."""
    m = int(outputs or 1)
    if name == "basic":
        return Work((_syrk(d),), stream=_F * 3 * d * m)
    if name == "output_moments":
        return _gram_work(d, m) + Work(((2.0 * m * d, m),), stream=_F * 2 * d)
    if name == "hermite":
        from ..hermite import raw_moment_flops

        order = int(_section(section, "max_order") or 4)
        return Work(
            ((float(raw_moment_flops(d, order)), d),), stream=_F * 2 * math.comb(d + order // 2, order // 2)
        ).scaled(m)
    if name == "contracted":
        g = _count(_section(section, "directions") or 8)
        pairs = len(_section(section, "orders") or [2, 4]) * g
        # the Grams, the directions' projections x·g, the vectors Σ w_b x (one GEMM for all pairs)
        return (_gram_work(d, pairs) + Work(((2.0 * d * g, g), (2.0 * d * pairs, pairs)), stream=_F * 4 * d)).scaled(m)
    if name == "filtered":
        return _gram_work(d, 1).scaled(m)  # each row into one τ bin: one d² product per row
    if name == "residual":
        c = len(_section(section, "candidates") or [1])
        s = len(_section(section, "basis") or [[0]])
        return (_gram_work(d, c) + Work(((2.0 * d * s, s), (2.0 * d * s, d)))).scaled(m)
    if name == "projected_hermite":
        from ..hermite import raw_moment_flops

        s = len(_section(section, "basis") or [[0]])
        order = int(_section(section, "max_order") or 4)
        return (Work(((2.0 * d * s, s), (float(raw_moment_flops(s, order)), s)))).scaled(m)
    if name == "sketch":
        return _sketch_work(section, d).scaled(m)
    raise ValueError(f"no cost model for the statistic family {name!r}")


def _sketch_work(section: Any, d: int) -> Work:
    """``X Ω`` once, then per sketched family one skinny product ``Xᵀ [w ⊙ Z]`` (2 d r flops per sample and
    matrix; the contracted pairs in one GEMM of P r columns)."""
    basis = _section(section, "basis")
    from ..config import SKETCH_DEFAULT_RANK

    r = len(basis) if basis is not None else int(_section(section, "rank") or SKETCH_DEFAULT_RANK)
    products: list[tuple[float, int]] = [(2.0 * d * r, r)]
    stream = _F * 2 * d
    second = _section(section, "second")
    if second is not None:
        products.append((2.0 * d * (r + 1), r))
        expansion = _section(second, "expansion")
        vectors = _section(expansion, "t2_vectors") if expansion is not None else None
        if vectors:
            products.append((2.0 * d * len(vectors), len(vectors)))
    contracted = _section(section, "contracted")
    if contracted is not None:
        g = _count(_section(contracted, "directions") or 8)
        pairs = len(_section(contracted, "orders") or [2, 4]) * g
        products += [(2.0 * d * g, g), (2.0 * d * pairs, pairs), (2.0 * d * pairs * r, min(d, pairs * r))]
        stream += _F * pairs * r
    if _section(section, "filtered") is not None:
        products.append((2.0 * d * r, r))
        stream += _F * d
    residual = _section(section, "residual")
    if residual is not None:
        c = len(_section(residual, "candidates") or [1])
        s = len(_section(residual, "basis") or [[0]])
        products += [(2.0 * d * s, s), (2.0 * d * s, d), (2.0 * c * d * r, r)]
        stream += _F * 2 * d * (c + 1)
    return Work(tuple(products), stream=stream)


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


def _grid(section: Any) -> int:
    return len(_section(section, "quantiles") or _section(section, "thresholds") or [0])


def _sketch_entries(sec: Any, d: int) -> tuple[int, int]:
    """Entries of a sketch's sums and terms (its schemas: :class:`.sketch.SketchMoments`)."""
    from ..config import SKETCH_DEFAULT_RANK

    basis = _section(sec, "basis")
    r = len(basis) if basis is not None else int(_section(sec, "rank") or SKETCH_DEFAULT_RANK)
    bmb = r * r if basis is not None else 0
    sums = terms = 0
    if _section(sec, "second") is not None:
        sums += d * r + d + 2
        terms += d * r + d + 1 + bmb
    contracted = _section(sec, "contracted")
    if contracted is not None:
        p = len(_section(contracted, "orders") or [2, 4]) * _count(_section(contracted, "directions") or 8)
        sums += p * (d * r + d + 2)
        terms += p * (d * r + bmb)
    filtered = _section(sec, "filtered")
    if filtered is not None:
        t = _grid(filtered)
        sums += t * (d * r + 1)
        terms += t * (d * r + 1 + bmb)
    residual = _section(sec, "residual")
    if residual is not None:
        ct = len(_section(residual, "candidates") or [0]) * _grid(residual)
        sums += ct * (d * r + 1)
        terms += ct * (d * r + 1 + bmb)
    return sums, terms


def sums_entries(statistics: Any, d: int, outputs: int | None = None) -> dict[str, tuple[int, int]]:
    """``(sums, terms)`` float64 entries of one chunk's accumulator of each family, as their schemas declare them:
    a block partial holds both (the sums, and the sums of the squared terms); a chunk allocates the sums."""
    m = int(outputs or 1)
    out: dict[str, tuple[int, int]] = {}
    sections = (
        statistics.enabled()
        if hasattr(statistics, "enabled")
        else {k: v for k, v in statistics.items() if v is not None}
    )
    for name, sec in sections.items():
        if name == "basic":
            n = d * d + 2 * d + 2
            out[name] = (n * m, n * m)
        elif name == "output_moments":  # natively per output
            n = m * d * d + m * d + m * m + m
            out[name] = (n, n)
        elif name in ("hermite", "projected_hermite"):
            dim = d if name == "hermite" else len(_section(sec, "basis"))
            order = int(_section(sec, "max_order") or 4)
            n = sum(math.comb(dim + j - 1, j) for j in range(order + 1))
            out[name] = (n * m, n * m)
        elif name == "contracted":
            pairs = len(_section(sec, "orders") or [2, 4]) * _count(_section(sec, "directions") or 8)
            n = pairs * (d * d + d + 1)
            out[name] = (n * m, n * m)
        elif name in ("filtered", "residual"):
            c = len(_section(sec, "candidates") or [0]) if name == "residual" else 1
            n = c * _grid(sec) * (d * d + 1)
            out[name] = (n * m, n * m)
        elif name == "sketch":
            a, b = _sketch_entries(sec, d)
            out[name] = (a * m, b * m)
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
