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
a data file) is timed on a probe batch by :func:`probe_source_seconds`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .stats.work import Work

__all__ = [
    "Work",
    "Rates",
    "calibrate",
    "family_work",
    "statistics_work",
    "teacher_work",
    "sums_entries",
    "CALIBRATION_VERSION",
]

_F = 8  # bytes of a float64

#: bumped when what :func:`calibrate` measures changes: older cached rates are measured again
CALIBRATION_VERSION = 4


@dataclass(frozen=True)
class Rates:
    """What one core of this machine does per second, as :func:`calibrate` measured it.

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
    (a file, ONNX model or callable: :func:`probe_source_seconds` times it)."""
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


# --------------------------------------------------------------------------------------- calibration


def _best_of(fn: Any, repeat: int = 5) -> float:
    """The fastest of ``repeat`` timed calls (the machine is shared: the fastest is the least disturbed)."""
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def _measure() -> dict[str, float]:
    """The measurements behind :class:`Rates`: :func:`_measure_core`, the disk, and a tiny pass.

    One process measures: two at once (a local cluster's workers side by side on two cores) measured the same
    rates here, within the machine's own noise."""
    import tempfile

    return dict(_measure_core(), disk=_disk_rate(tempfile.gettempdir()), setup=_setup_seconds())


def _measure_core() -> dict[str, float]:
    """The measurements behind :class:`Rates` in this process, on one BLAS thread:
    Grams of 2048 rows at sizes 32–1024 (their flop rates fit ``1/rate = 1/peak + half/(peak·size)``),
    elementwise work on 64 MB in place and a broadcast product into a fresh array, SFC64 normals. About two
    seconds."""
    from threadpoolctl import threadpool_limits

    from .sources import Stream, generator

    gen = generator(0, Stream.PILOT, 99)
    with threadpool_limits(limits=1, user_api="blas"):
        sizes, inv = [], []
        for s in (32, 64, 128, 256, 512, 1024):
            x = gen.standard_normal((2048, s))
            sec = _best_of(lambda: x.T @ x)
            sizes.append(s)
            inv.append(sec / (2048.0 * s * (s + 1)))
        # least squares of 1/rate = a + b/size
        a_mat = np.column_stack([np.ones(len(sizes)), 1.0 / np.asarray(sizes, dtype=float)])
        a, b = np.linalg.lstsq(a_mat, np.asarray(inv), rcond=None)[0]
        a = max(a, min(inv) / 4)
        peak, half = 1.0 / a, max(b / a, 0.0)
    big = np.ones(2**23)  # 64 MB: past the caches, as a chunk's accumulator is
    other = np.ones(2**23)
    memory = 3 * big.nbytes / _best_of(lambda: np.multiply(big, other, out=big))
    # a broadcast product into a new array of 16 MB, as the small-d weighted copies of a row batch are made
    rows, cols = np.ones((2**12, 16)), np.ones((2**12, 32))
    fresh = 2**12 * 16 * 32 * 8 / _best_of(lambda: rows[:, :, None] * cols[:, None, :], repeat=5)
    # the rate of a batch's normals depends on where its array lands (it varies by ~40 % between allocations of
    # the same size here): the median over several arrays, each timed at its best
    draws = 2**20
    normals = draws / float(np.median([_best_of(lambda: gen.standard_normal(draws), repeat=3) for _ in range(9)]))
    return {
        "peak": float(peak),
        "half": float(half),
        "memory": float(memory),
        "fresh": float(fresh),
        "normals": float(normals),
    }


def _setup_seconds() -> float:
    """Seconds of a tiny pass (d = 4, two chunks of 500 samples, ``basic``) in process, end to end: what every
    pass costs beyond its samples (the second of two runs: imports and first calls excluded)."""
    import tempfile

    from ..config import config_from_dict
    from .run import estimate

    cfg = config_from_dict({"seed": 0, "samples": 1000, "chunk_size": 500, "source": {"d": 4}})
    best = math.inf
    with tempfile.TemporaryDirectory(prefix="relulearn-calibrate-") as tmp:
        for i in range(2):
            t0 = time.perf_counter()
            estimate(cfg, os.path.join(tmp, f"s{i}.zarr"), progress=None)
            best = min(best, time.perf_counter() - t0) if i else best
    return float(best)


def _disk_rate(folder: str) -> float:
    """Bytes/s of writing and syncing 16 MB of float64 noise-free numbers (a commit's compressed zarr chunks are
    of this kind) in ``folder``."""
    import tempfile

    data = np.cumsum(np.ones(2**21)).tobytes()
    with tempfile.NamedTemporaryFile(dir=folder) as fh:

        def write() -> None:
            fh.seek(0)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

        return len(data) / _best_of(write, repeat=2)


def _cache_path(key: str) -> Path:
    base = os.environ.get("RELULEARN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "relulearn"
    )
    return Path(base) / f"rates-{key}.json"


def _blas_build() -> str:
    """numpy's own BLAS build (the one the updates run on; scipy may load another, whatever was imported first)."""
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} {blas.get('openblas configuration', '')}".strip()
    except (AttributeError, KeyError, TypeError):
        return "unknown"


def _cpu_model() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """What the rates depend on: the processor, the number of cores, numpy's version and its BLAS build."""
    text = json.dumps([_cpu_model(), os.cpu_count(), np.__version__, _blas_build(), CALIBRATION_VERSION])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def calibrate(*, refresh: bool = False) -> Rates:
    """This machine's :class:`Rates`: measured once (about two seconds) and cached per machine, BLAS and numpy
    (``$RELULEARN_CACHE``, else ``~/.cache/relulearn``); ``refresh`` measures again."""
    key = machine_key()
    path = _cache_path(key)
    if not refresh and path.exists():
        try:
            return Rates(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # a damaged or older cache entry: measure again
    rates = Rates(
        **_measure(),
        machine=f"{_cpu_model()}, {os.cpu_count()} cores, {_blas_build()}",
        measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rates.to_dict()))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the rates are measured again next time
    return rates


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


def source_cost(cfg: Any, rates: Rates, *, probe: bool = True) -> SourceCost:
    """The source's cost per sample: Gaussian inputs (and noise) at ``rates.normals`` plus the teacher's forward
    pass (:func:`teacher_work`); a black box or data file timed on a probe batch (:func:`probe_source_seconds`)
    unless ``probe`` is false (then only the generation is counted, and a note says so)."""
    src = cfg.source
    d = int(src.d)
    if src.data is not None:
        if not probe:
            return SourceCost(0.0, 0.0, 0.0, False, ("the data file's read time is not counted",))
        sec = probe_source_seconds(cfg)
        return SourceCost(sec, 0.0, sec, True)
    gen = rates.seconds(Work(normals=d + (1 if src.noise_std else 0), stream=_F * d))
    work = teacher_work(src.teacher, d)
    if work is not None:
        t = rates.seconds(work)
        return SourceCost(gen + t, gen, t)
    if not probe:
        return SourceCost(gen, gen, 0.0, False, ("the black-box teacher's time is not counted",))
    total, answers = _probe_black_box(cfg)
    return SourceCost(max(total, gen), gen, max(total - gen, 0.0), True, answers=answers)


#: rows of the probe batch a black-box source is timed on
PROBE_ROWS = 4096


def probe_source_seconds(cfg: Any, rows: int = PROBE_ROWS) -> float:
    """Seconds per sample of the configured source on one BLAS thread, timed on a pilot-stream batch of ``rows``
    samples after one warm-up batch (an ONNX session's first call is slow)."""
    return _time_source(cfg, rows)[0]


def _probe_black_box(cfg: Any, rows: int = PROBE_ROWS) -> tuple[float, int]:
    """Seconds per sample of a black-box teacher and its outputs per row (read by its probe on two rows, and its
    answers to a batch checked against this machine's memory, before the timed batches)."""
    seconds, source = _time_source(cfg, rows)
    return seconds, int(getattr(source, "width", 1))


def _time_source(cfg: Any, rows: int) -> tuple[float, Any]:
    from threadpoolctl import threadpool_limits

    from .sources import make_source, pilot_batches

    source = make_source(cfg)
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in pilot_batches(source, cfg.seed, min(rows, 256)):
            pass
        t0 = time.perf_counter()
        n = 0
        for x, _ in pilot_batches(source, cfg.seed, rows):
            n += len(x)
        return (time.perf_counter() - t0) / max(n, 1), source
