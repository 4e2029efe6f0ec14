"""Calibration: everything the planner's numbers are measured from, by running things on this machine.

:func:`calibrate` times a few products, normals, a write to disk and a tiny pass (:func:`.run.estimate` into a
temporary store) once per machine and caches the :class:`.cost.Rates`; :func:`source_cost` times a black-box
teacher or a data file on a probe batch. This is the executor's side of planning: the planning modules
(:mod:`relulearn.runplan`, :mod:`.projection`, :mod:`.plan`, :mod:`.cost`) take what is measured here as inputs
and never import this module (an import-linter contract holds them to it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .cost import Rates, SourceCost, counted_source_cost, teacher_work

__all__ = [
    "calibrate",
    "machine_key",
    "source_cost",
    "probe_source_seconds",
    "PROBE_ROWS",
    "CALIBRATION_VERSION",
]

#: bumped when what :func:`calibrate` measures changes: older cached rates are measured again
CALIBRATION_VERSION = 4


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


def source_cost(cfg: Any, rates: Rates, *, probe: bool = True) -> SourceCost:
    """The source's cost per sample: Gaussian inputs (and noise) at ``rates.normals`` plus the teacher's forward
    pass (:func:`.cost.counted_source_cost`); a black box or data file timed on a probe batch
    (:func:`probe_source_seconds`) unless ``probe`` is false (then only the generation is counted, and a note says
    so)."""
    src = cfg.source
    if not probe or (src.data is None and teacher_work(src.teacher, int(src.d)) is not None):
        return counted_source_cost(cfg, rates)
    if src.data is not None:
        sec = probe_source_seconds(cfg)
        return SourceCost(sec, 0.0, sec, True)
    gen = counted_source_cost(cfg, rates).generation
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
