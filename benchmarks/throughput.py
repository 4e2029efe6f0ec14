"""Throughput benchmark of the statistics pipeline (a script, not a test).

Measures, in one process and one run (docs/design.md §7, performance model):

1. per statistic family and input dimension d: samples/s of ``Statistic.update`` on
   pre-generated batches of ``BATCH_ROWS`` rows, of generation + update, and of the whole
   ``accumulate_chunks`` path; the FLOPs the family needs per sample; and the "roofline
   ratio" against bare numpy BLAS-3 calls doing the same FLOPs, timed interleaved with the
   statistic (A, B, A, B, ...) so that machine noise hits both alike;
2. the overhead of the Dask run (a ``LocalCluster`` with one single-threaded worker) over
   the single-process loop (``estimate(..., client=None)``) on the same chunks, in wall
   time and in CPU time, and the speed-up with two workers; each also with distributed's
   ``MALLOC_TRIM_THRESHOLD_`` worker setting removed (see :data:`DASK_VARIANTS`);
3. the peak memory (RSS) of in-process runs of 10^6 and 10^8 samples, each in a fresh
   subprocess.

BLAS runs single-threaded throughout (``threadpool_limits(1)``), as in a pipeline worker.
The environment is used as it is (this machine may force an OpenBLAS core type with
``OPENBLAS_CORETYPE``); the BLAS kernel in use is recorded in the output.

FLOP convention
---------------
One flop is one float64 multiply or add (a multiply-add counts 2). A family's flops per
sample are the model counts of docs/design.md §7, exploiting symmetry: a symmetric d×d second
moment needs d(d+1)/2 multiply-adds, i.e. ``d(d+1) ≈ d²`` flops per sample (a ``syrk``
of an n×d batch: ``n·d(d+1)`` flops; the same ``XᵀX`` done as a general GEMM costs
``2·n·d²``). A full packed Hermite tensor of order l costs one multiply-add per unique
entry, ``2·C(d+l-1, l)`` flops per sample; all orders ``0..L`` together ``2·C(d+L, L)``
(for the Hermite family, also Σy and Σy·x, which are part of the packed output). Other
lower-order terms (Σx, Σy², ...) are not counted. Two yardsticks, both counted with the same convention:

- ``blas``: the bare BLAS-3 call(s) the family minimally needs, on the same rows: ``x.T @ x``
  (numpy dispatches it to ``syrk``) once per matrix (basic: 1; filtered: 1 on as many rows
  as the filter keeps; contracted: one per (order, direction) pair); for the Hermite
  tensors, the general GEMM below. ``roofline_ratio`` = time(yardstick) / time(update)
  (the flops are identical).
- ``gemm``: one general ``a.T @ b`` GEMM whose flop count equals the family's model count
  (``b`` has as many rows as the batch). ``roofline_ratio_gemm`` compares the family
  with the BLAS's best per-flop rate; a ``syrk``-based family cannot exceed
  rate(syrk)/rate(gemm) on it.

The Hermite family (full packed tensors) runs at its own dimensions and orders
(``--hermite-dims``, ``--hermite-orders``; default d = 8, 20, 50 and L = 4, 6, where the
entries fit ``max_entries``). Besides the model count it records the flops the
implementation executes (``relulearn.hermite.raw_moment_flops``, the plan of its blocked
GEMMs) and, timed in the same interleaved rounds, the former implementation ("before":
one GEMM of all (prefix, suffix) pairs per order, ``relulearn.hermite.moments._raw_moment_sums_pairs``).

Run ``python benchmarks/throughput.py`` (about 10 minutes on 2 cores) or ``--quick`` for a
smoke run; results go to ``benchmarks/results/throughput.json``, or, when ``--families``
is ``hermite`` alone, to ``benchmarks/results/throughput_hermite.json`` (the script writes
its whole output file; this keeps the other families' results).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a source tree without installing
    sys.path.insert(0, str(ROOT))

from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from relulearn import hermite  # noqa: E402
from relulearn.config import (  # noqa: E402
    ContractedConfig,
    FilteredConfig,
    HermiteConfig,
    RunConfig,
    config_from_dict,
)
from relulearn.hermite.moments import _raw_moment_sums_pairs  # noqa: E402
from relulearn.pipeline.sources import BATCH_ROWS, Source, Stream, generator, make_source  # noqa: E402
from relulearn.pipeline.stats.base import Statistic  # noqa: E402
from relulearn.pipeline.stats.basic import BasicMoments  # noqa: E402
from relulearn.pipeline.stats.contracted import ContractedMoments, direction_bank  # noqa: E402
from relulearn.pipeline.stats.filtered import FilteredMoments, threshold_grid  # noqa: E402
from relulearn.pipeline.stats.hermite import HermiteTensors  # noqa: E402
from relulearn.pipeline.stats.partial import accumulate_chunks  # noqa: E402

from _common import save_json, utc_now  # noqa: E402

SEED = 11
QUANTILES = [0.5, 0.8, 0.95]
CONTRACTED_ORDERS = [2, 4]
CONTRACTED_DIRECTIONS = 4
HERMITE_DIMS = [8, 20, 50]
HERMITE_ORDERS = [4, 6]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "throughput.json"
HERMITE_OUT = ROOT / "benchmarks" / "results" / "throughput_hermite.json"


# ------------------------------------------------------------------ helpers


def interleaved(
    fns: dict[str, Callable[[int], Any]], *, min_reps: int, max_reps: int, budget: float
) -> dict[str, list[float]]:
    """Time several callables in rounds (A, B, C, A, B, C, ...).

    Parameters
    ----------
    fns
        Name -> callable taking the round index (to pick the same input in a round).
    min_reps, max_reps
        Bounds on the number of rounds.
    budget
        Seconds after which no new round starts (once ``min_reps`` rounds are done).

    Returns
    -------
    dict
        Name -> list of wall times (s), one per round. One untimed warm-up call of
        each callable precedes the rounds.
    """
    for f in fns.values():
        f(0)
    times: dict[str, list[float]] = {k: [] for k in fns}
    t_end = time.perf_counter() + budget
    r = 0
    while r < max_reps and (r < min_reps or time.perf_counter() < t_end):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f(r)
            times[name].append(time.perf_counter() - t0)
        r += 1
    return times


def med(ts: list[float]) -> float:
    """Median of a list of times."""
    return float(np.median(ts))


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of ``num[r] / den[r]`` (robust to noise shared within a round)."""
    return float(np.median(np.asarray(num) / np.asarray(den)))


def machine_info() -> dict[str, Any]:
    """Cores, CPU, memory, library versions and the BLAS in use (inside a 1-thread limit)."""
    import psutil

    cpu = ""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and not cpu:
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    with threadpool_limits(limits=1, user_api="blas"):
        blas_limited = threadpool_info()
    try:
        build_blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except Exception:  # older numpy
        build_blas = None
    import dask
    import distributed
    import scipy
    import zarr

    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu,
        "cpu_flags_of_interest": sorted(flags & {"avx", "avx2", "fma", "avx512f", "avx512dq", "avx512vl"}),
        "cores": cores,
        "cpu_count_logical": os.cpu_count(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "load_average_at_start": list(os.getloadavg()),
        "versions": {
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "dask": dask.__version__,
            "distributed": distributed.__version__,
            "zarr": zarr.__version__,
        },
        "env": {
            k: os.environ.get(k)
            for k in (
                "OPENBLAS_CORETYPE",
                "OPENBLAS_L2_SIZE",
                "OPENBLAS_NUM_THREADS",
                "OMP_NUM_THREADS",
                "MKL_NUM_THREADS",
            )
        },
        "blas_threadpool_info": blas_limited,
        "blas_kernel": [i.get("architecture") for i in blas_limited if i.get("user_api") == "blas"],
        "numpy_build_blas": build_blas,
    }


# ------------------------------------------------------------------ families


def make_run_config(
    d: int,
    statistics: dict,
    *,
    samples: int = 1_000_000,
    chunk_size: int = 50_000,
    chunks_per_block: int = 4,
    seed: int = SEED,
) -> RunConfig:
    """A run of a planted width-3 one-hidden-layer ReLU teacher in dimension ``d``."""
    return config_from_dict(
        {
            "seed": seed,
            "samples": samples,
            "chunk_size": chunk_size,
            "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": 3, "output_weights": [1.0, -1.0, 0.7]}},
            "statistics": statistics,
            "run": {"chunks_per_block": chunks_per_block},
        }
    )


def n_unique(d: int, m: int) -> int:
    """Unique entries of a symmetric tensor of order ``m`` in dimension ``d``."""
    return math.comb(d + m - 1, m)


def build_family(name: str, d: int, source: Source, max_order: int = 4) -> tuple[Statistic | None, dict[str, Any]]:
    """The statistic of one family at dimension ``d``, and a description of its options.

    ``max_order`` is the Hermite family's highest order. Returns ``(None, info)`` with
    ``info["status"]`` saying why when the family does not fit at this ``d`` (the Hermite
    tensors' entry limit).
    """
    if name == "basic":
        return BasicMoments(d), {"options": {}}
    if name == "filtered":
        tau, q = threshold_grid(FilteredConfig(quantiles=QUANTILES), source, SEED)
        return FilteredMoments(d, tau, q), {"options": {"quantiles": QUANTILES, "tau": tau.tolist()}}
    if name == "contracted":
        g = direction_bank(ContractedConfig(orders=CONTRACTED_ORDERS, directions=CONTRACTED_DIRECTIONS), d, SEED)
        return ContractedMoments(g, CONTRACTED_ORDERS), {
            "options": {"orders": CONTRACTED_ORDERS, "directions": CONTRACTED_DIRECTIONS}
        }
    if name == "hermite":
        opts = {"max_order": max_order}
        try:
            return HermiteTensors(d, HermiteConfig(max_order=max_order)), {"options": opts}
        except ValueError as err:
            return None, {"options": opts, "status": "skipped: too many entries", "reason": str(err)}
    raise ValueError(f"unknown family {name!r}")


def flop_model(stat: Statistic, batches: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """Flops per sample of a family: the model count and what the implementation executes.

    Both count BLAS-3 work only (see the module docstring for the convention). For the
    filtered family the count is per sample *offered* (only the kept fraction is summed).
    """
    d = batches[0][0].shape[1]
    sym = d * (d + 1)
    if isinstance(stat, BasicMoments):
        return {"model": sym, "implementation": sym, "matrices": 1}
    if isinstance(stat, FilteredMoments):
        kept = np.mean([np.mean(np.abs(y) > stat.tau[0]) for _, y in batches])
        return {"model": kept * sym, "implementation": kept * sym, "matrices": 1, "kept_fraction": float(kept)}
    if isinstance(stat, ContractedMoments):
        p, g = stat.n_pairs, len(stat.directions)
        # matrices: per pair two syrks (rows of positive / negative weight), d(d+1) per sample
        # and pair together; v (twice: matrix and vector sums); projections x Gᵀ (3×)
        impl = p * sym + 4 * p * d + 6 * g * d
        return {"model": p * sym, "implementation": impl, "matrices": p}
    if isinstance(stat, HermiteTensors):
        model = sum(2 * n_unique(d, m) for m in range(stat.max_order + 1))
        return {
            "model": model,
            "implementation": hermite.raw_moment_flops(d, stat.max_order),
            "matrices": 0,
            "before": hermite_flops_before(d, stat.max_order),
        }
    raise TypeError(type(stat))


def hermite_flops_before(d: int, max_order: int) -> int:
    """Flops per sample of the former Hermite update: per order m, one GEMM of the sorted
    ceil(m/2)-tuple products against the sorted floor(m/2)-tuple products, every pair."""
    return sum(2 * n_unique(d, m - m // 2) * n_unique(d, m // 2) for m in range(max_order + 1))


def yardsticks(
    stat: Statistic, batches: list[tuple[np.ndarray, np.ndarray]], flops: dict[str, float], rng: np.random.Generator
) -> dict[str, tuple[Callable[[int], Any], list[float], str]]:
    """Bare numpy BLAS-3 calls doing the family's model flops on the same batches.

    Returns name -> (callable(round), flops per batch for each batch, description).
    """
    n, d = batches[0][0].shape
    nb = len(batches)
    out: dict[str, tuple[Callable[[int], Any], list[float], str]] = {}
    if isinstance(stat, (BasicMoments, FilteredMoments, ContractedMoments)):
        if isinstance(stat, FilteredMoments):
            rows = [int(np.count_nonzero(np.abs(y) > stat.tau[0])) for _, y in batches]
        else:
            rows = [n] * nb
        reps = flops["matrices"]
        views = [x[:k] for (x, _), k in zip(batches, rows)]

        def blas(r: int) -> None:
            v = views[r % nb]
            for _ in range(reps):
                v.T @ v

        desc = f"{reps} × x.T @ x (syrk) on the {'kept' if isinstance(stat, FilteredMoments) else 'same'} rows"
        out["blas"] = (blas, [reps * k * d * (d + 1) for k in rows], desc)
        # one general GEMM x.T @ b, b: (rows, q), with 2 d q = reps · d (d + 1)
        q = max(1, round(reps * (d + 1) / 2))
        b = rng.standard_normal((n, q))
        bviews = [b[:k] for k in rows]

        def gemm(r: int) -> None:
            views[r % nb].T @ bviews[r % nb]

        out["gemm"] = (gemm, [2 * k * d * q for k in rows], f"x.T @ b, x: (n, {d}), b: (n, {q}) (dgemm)")
    else:
        f = flops["model"]
        p = max(1, int(math.sqrt(f / 2)))
        q = max(1, round(f / 2 / p))
        a = rng.standard_normal((n, p))
        b = rng.standard_normal((n, q))

        def gemm(r: int) -> None:
            a.T @ b

        out["gemm"] = (gemm, [2 * n * p * q] * nb, f"a.T @ b, a: (n, {p}), b: (n, {q}) (dgemm)")
        out["blas"] = out["gemm"]
    return out


def bench_family(
    name: str,
    d: int,
    source: Source,
    batches: list[tuple[np.ndarray, np.ndarray]],
    *,
    min_reps: int,
    max_reps: int,
    budget: float,
    chunk_size: int,
    max_order: int = 4,
) -> dict[str, Any]:
    """Update vs. yardsticks (interleaved), generation + update, and ``accumulate_chunks``;
    for the Hermite family also the former update ("before") in the same rounds."""
    stat, info = build_family(name, d, source, max_order)
    rec: dict[str, Any] = {"family": name, "d": d, "batch_rows": BATCH_ROWS, **info}
    if stat is None:
        return rec
    rec["status"] = "ok"
    n = batches[0][0].shape[0]
    nb = len(batches)
    flops = flop_model(stat, batches)
    rng = np.random.default_rng(0)
    ys = yardsticks(stat, batches, flops, rng)
    acc, acc_gen = stat.init(), stat.init()
    gen_x, gen_noise = generator(SEED, Stream.INPUTS, 10_000), generator(SEED, Stream.NOISE, 10_000)

    def update(r: int) -> None:
        x, y = batches[r % nb]
        stat.update(acc, x, y)

    def gen_update(r: int) -> None:
        for x, y in source.batches(gen_x, gen_noise, n):
            stat.update(acc_gen, x, y)

    def chunk(r: int) -> None:
        accumulate_chunks([stat], source, SEED, chunk_size, r, r + 1)

    fns = {"update": update, "gen_update": gen_update, "chunk": chunk, "yard_blas": ys["blas"][0]}
    if ys["gemm"][0] is not ys["blas"][0]:
        fns["yard_gemm"] = ys["gemm"][0]
    if isinstance(stat, HermiteTensors):
        acc_before = stat.init()

        def update_before(r: int) -> None:
            x, y = batches[r % nb]
            for m in range(stat.max_order + 1):
                acc_before[f"raw{m}"] += _raw_moment_sums_pairs(x, y, m)

        fns["update_before"] = update_before
    t = interleaved(fns, min_reps=min_reps, max_reps=max_reps, budget=budget)
    t_upd = med(t["update"])
    f_model = flops["model"]
    rec["flops_per_sample"] = f_model
    rec["flops_per_sample_implementation"] = flops["implementation"]
    rec["matrices"] = flops["matrices"]
    if "kept_fraction" in flops:
        rec["kept_fraction"] = flops["kept_fraction"]
    rec["update"] = {
        "seconds_per_batch": t_upd,
        "samples_per_s": n / t_upd,
        "reps": len(t["update"]),
        "gflops_model": f_model * n / t_upd / 1e9,
        "gflops_implementation": flops["implementation"] * n / t_upd / 1e9,
    }
    for key in ("blas", "gemm"):
        _, fl, desc = ys[key]
        tk = t["yard_gemm"] if key == "gemm" and "yard_gemm" in t else t["yard_blas"]
        flops_per_batch = float(np.mean(fl))
        rate = flops_per_batch / med(tk)
        rec[f"yardstick_{key}"] = {
            "op": desc,
            "flops_per_batch": flops_per_batch,
            "seconds_per_batch": med(tk),
            "gflops": rate / 1e9,
            "samples_per_s_equivalent": rate / f_model,
        }
        # the rate-based ratio; equal to t(yardstick)/t(update) when the flops match exactly
        rec[f"roofline_ratio{'' if key == 'blas' else '_gemm'}"] = (n / t_upd) / (rate / f_model)
        if key == "blas":
            rec["roofline_ratio_paired"] = paired_ratio([ti * f_model * n / flops_per_batch for ti in tk], t["update"])
    if "update_before" in t:
        rec.update(hermite_record(rec, t, flops, n))
    t_gu = med(t["gen_update"])
    rec["generation_update"] = {"seconds_per_batch": t_gu, "samples_per_s": n / t_gu}
    # the whole accumulate_chunks path (generation, finiteness check, update, per-chunk error terms)
    t_ch = med(t["chunk"])
    rec["accumulate_chunks"] = {
        "chunk_size": chunk_size,
        "seconds_per_chunk": t_ch,
        "samples_per_s": chunk_size / t_ch,
        "reps": len(t["chunk"]),
    }
    return rec


def hermite_record(rec: dict[str, Any], t: dict[str, list[float]], flops: dict[str, float], n: int) -> dict[str, Any]:
    """The Hermite family's extra fields: executed/packed flops, and the former update's
    speed and roofline ratio, timed in the same rounds against the same yardstick."""
    t_before = med(t["update_before"])
    ratio_before = rec["roofline_ratio"] * med(t["update"]) / t_before  # same yardstick rate
    return {
        "max_order": rec["options"]["max_order"],
        "executed_over_packed": flops["implementation"] / flops["model"],
        "before": {
            "implementation": "one GEMM of all (ceil(m/2)-tuple, floor(m/2)-tuple) pairs per order m",
            "flops_per_sample_implementation": flops["before"],
            "executed_over_packed": flops["before"] / flops["model"],
            "seconds_per_batch": t_before,
            "samples_per_s": n / t_before,
            "roofline_ratio": ratio_before,
            "reps": len(t["update_before"]),
        },
        "speedup_vs_before": paired_ratio(t["update_before"], t["update"]),
    }


def bench_generation(d: int, source: Source, *, min_reps: int, max_reps: int, budget: float) -> dict[str, Any]:
    """Generation of a batch (normals + teacher labels) vs. bare ``standard_normal`` of the same size."""
    n = BATCH_ROWS
    gx, gn = generator(SEED, Stream.INPUTS, 20_000), generator(SEED, Stream.NOISE, 20_000)
    bare = generator(SEED, Stream.INPUTS, 30_000)  # same bit generator (Philox) as the source

    def gen(r: int) -> None:
        for _ in source.batches(gx, gn, n):
            pass

    def normals(r: int) -> None:
        bare.standard_normal((n, d))

    t = interleaved({"generate": gen, "normals": normals}, min_reps=min_reps, max_reps=max_reps, budget=budget)
    return {
        "d": d,
        "batch_rows": n,
        "generation_samples_per_s": n / med(t["generate"]),
        "bare_standard_normal_samples_per_s": n / med(t["normals"]),
        "ratio": med(t["normals"]) / med(t["generate"]),
        "normals_per_sample": d,
        "ns_per_normal_bare": med(t["normals"]) / (n * d) * 1e9,
        "reps": len(t["generate"]),
    }


def run_families(
    dims: list[int],
    families: list[str],
    *,
    min_reps: int,
    max_reps: int,
    budget: float,
    chunk_size: int,
    log: Callable[[str], None],
    hermite_dims: list[int] | None = None,
    hermite_orders: list[int] | None = None,
) -> tuple[list, list]:
    """All (family, d) records and the per-d generation records.

    The Hermite family runs at ``hermite_dims`` (default :data:`HERMITE_DIMS`), once per
    order in ``hermite_orders`` (default :data:`HERMITE_ORDERS`); the others at ``dims``.
    """
    records, gens = [], []
    hdims = HERMITE_DIMS if hermite_dims is None else hermite_dims
    horders = HERMITE_ORDERS if hermite_orders is None else hermite_orders
    # d -> [(family, max_order or None)], in order of d
    plan: dict[int, list[tuple[str, int | None]]] = {}
    for d in dims:
        plan.setdefault(d, []).extend((f, None) for f in families if f != "hermite")
    if "hermite" in families:
        for d in hdims:
            plan.setdefault(d, []).extend(("hermite", L) for L in horders)
    plan = {d: runs for d, runs in sorted(plan.items()) if runs}
    with threadpool_limits(limits=1, user_api="blas"):
        for d, runs in plan.items():
            source = make_source(make_run_config(d, {"basic": {}}))
            gx, gn = generator(SEED, Stream.INPUTS, 0), generator(SEED, Stream.NOISE, 0)
            batches = list(source.batches(gx, gn, 4 * BATCH_ROWS))
            t0 = time.perf_counter()
            gens.append(bench_generation(d, source, min_reps=min_reps, max_reps=max_reps, budget=budget / 2))
            log(
                f"  d={d:4d} generation: {gens[-1]['generation_samples_per_s']:,.0f} samples/s "
                f"({time.perf_counter() - t0:.1f} s)"
            )
            for name, order in runs:
                t0 = time.perf_counter()
                kw = {} if order is None else {"max_order": order}
                rec = bench_family(
                    name,
                    d,
                    source,
                    batches,
                    min_reps=min_reps,
                    max_reps=max_reps,
                    budget=budget,
                    chunk_size=chunk_size,
                    **kw,
                )
                rec["wall_seconds"] = time.perf_counter() - t0
                records.append(rec)
                label = f"{name} L={order}" if name == "hermite" else name
                if rec["status"] == "ok":
                    extra = ""
                    if "before" in rec:
                        b = rec["before"]
                        extra = (
                            f", executed/packed {rec['executed_over_packed']:.2f}; before: "
                            f"{b['samples_per_s']:,.0f} samples/s, ratio {b['roofline_ratio']:.2f}, "
                            f"executed/packed {b['executed_over_packed']:.2f}; "
                            f"speed-up {rec['speedup_vs_before']:.1f}×"
                        )
                    log(
                        f"  d={d:4d} {label:10s}: update {rec['update']['samples_per_s']:,.0f} samples/s, "
                        f"ratio {rec['roofline_ratio']:.2f} (gemm {rec['roofline_ratio_gemm']:.2f}), "
                        f"gen+update {rec['generation_update']['samples_per_s']:,.0f}, "
                        f"chunks {rec['accumulate_chunks']['samples_per_s']:,.0f}{extra} ({rec['wall_seconds']:.1f} s)"
                    )
                else:
                    log(f"  d={d:4d} {label:10s}: {rec['status']}")
    return records, gens


# ---------------------------------------------------------------------- dask


def _read_sums(url: str, names: list[str]) -> dict[str, np.ndarray]:
    from relulearn.storage import RunStore

    store = RunStore(url)
    out = {}
    for name in names:
        for k, (_, v) in store.read_group(name).items():
            if k.startswith(("sum_", "sumsq_")):
                out[f"{name}/{k}"] = np.asarray(v)
    return out


def _worker_env(client) -> dict[str, str | None]:
    """The allocator- and BLAS-related environment variables the workers see."""
    keys = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE")

    def probe() -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in keys}

    return next(iter(client.run(probe).values()))


#: Cluster variants of the Dask comparison: workers, and dask config set while the cluster starts.
#: ``distributed`` sets MALLOC_TRIM_THRESHOLD_=65536 in every nanny-spawned worker by default
#: (``distributed.nanny.pre-spawn-environ``); setting any MALLOC_* tunable turns off glibc's dynamic
#: mmap threshold, so each multi-MB batch array is a fresh mmap with page faults. The ``_no_trim``
#: variants unset it (value None) to measure that cost.
DASK_VARIANTS: dict[str, tuple[int, dict[str, Any]]] = {
    "1_worker": (1, {}),
    "2_worker": (2, {}),
    "1_worker_no_trim": (1, {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}),
    "2_worker_no_trim": (2, {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}),
}


def bench_dask(
    *, d: int, samples: int, chunk_size: int, chunks_per_block: int, reps: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """In-process loop vs. LocalClusters of single-threaded workers on the same chunks.

    Clusters are those of :func:`relulearn.pipeline.cluster.connect` (see
    :data:`DASK_VARIANTS`), started one at a time so that idle clusters do not compete.
    For each: cluster start-up and a warm-up run are timed separately, then ``reps`` pairs
    (in-process, Dask) are timed interleaved, each run into a fresh store; every Dask
    result is checked bitwise against the in-process one. The nannies write their pre-spawn
    environment into this process's ``os.environ``; it is restored before each cluster starts
    and at the end, so that later subprocesses (the memory runs) are not affected.
    """
    import dask
    import distributed  # noqa: F401 - its defaults must be in dask.config before dask.config.set below
    import psutil

    from relulearn.pipeline.cluster import connect
    from relulearn.pipeline.run import estimate

    env0 = dict(os.environ)
    env0["PYTHONPATH"] = str(ROOT) + (os.pathsep + env0["PYTHONPATH"] if env0.get("PYTHONPATH") else "")

    def restore_env() -> None:
        os.environ.clear()
        os.environ.update(env0)

    probe = make_run_config(d, {"basic": {}})
    tau, _ = threshold_grid(FilteredConfig(quantiles=QUANTILES), make_source(probe), SEED)
    stats_cfg = {"basic": {}, "filtered": {"thresholds": [float(t) for t in tau]}}
    cfg = make_run_config(d, stats_cfg, samples=samples, chunk_size=chunk_size, chunks_per_block=chunks_per_block)
    warm = make_run_config(
        d,
        stats_cfg,
        samples=2 * chunks_per_block * chunk_size,
        chunk_size=chunk_size,
        chunks_per_block=chunks_per_block,
    )
    tmp = Path(tempfile.mkdtemp(prefix="relulearn-bench-"))
    res: dict[str, Any] = {
        "d": d,
        "samples": samples,
        "chunk_size": chunk_size,
        "chunks_per_block": chunks_per_block,
        "statistics": stats_cfg,
        "blocks": -(-samples // chunk_size) // chunks_per_block,
        "reps": reps,
    }
    counter = [0]
    worker_procs: dict[Any, list] = {None: []}

    def cpu(client) -> np.ndarray:
        """CPU seconds (user + system) so far of this process and of the client's workers."""
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return np.array([ru.ru_utime + ru.ru_stime, sum(sum(p.cpu_times()[:2]) for p in worker_procs[client])])

    def run(client, c: RunConfig = cfg) -> tuple[float, np.ndarray, str]:
        counter[0] += 1
        url = str(tmp / f"run{counter[0]}.zarr")
        c0, t0 = cpu(client), time.perf_counter()
        estimate(c, url, client=client, progress=None)
        return time.perf_counter() - t0, cpu(client) - c0, url

    names = ["basic", "filtered"]
    ref_sums: dict[str, np.ndarray] | None = None
    variants: dict[str, dict[str, Any]] = {}
    try:
        for key, (w, conf) in DASK_VARIANTS.items():
            restore_env()
            v: dict[str, Any] = {
                "workers": w,
                "dask_config": conf,
                "seconds": [],
                "local_seconds": [],
                "cpu_seconds": [],
                "local_cpu_seconds": [],
                "cpu_seconds_driver": [],
                "cpu_seconds_workers": [],
            }
            with ExitStack() as stack:
                t0 = time.perf_counter()
                with dask.config.set(conf):
                    client = stack.enter_context(connect(workers=w, threads_per_worker=1))
                client.wait_for_workers(w)
                v["startup_seconds"] = time.perf_counter() - t0
                v["worker_env"] = _worker_env(client)
                worker_procs[client] = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
                restore_env()
                v["warmup_seconds"] = {"local": run(None, warm)[0], "dask": run(client, warm)[0]}
                for r in range(reps):
                    for side, c in (("local_", None), ("", client)):
                        t, cp, url = run(c)
                        v[f"{side}seconds"].append(t)
                        v[f"{side}cpu_seconds"].append(float(cp.sum()))
                        if side == "":
                            v["cpu_seconds_driver"].append(float(cp[0]))
                            v["cpu_seconds_workers"].append(float(cp[1]))
                        if ref_sums is None:
                            ref_sums = _read_sums(url, names)
                        elif side == "":
                            same = all(np.array_equal(ref_sums[k], a) for k, a in _read_sums(url, names).items())
                            v["bitwise_identical_to_local"] = v.get("bitwise_identical_to_local", True) and same
                        shutil.rmtree(url, ignore_errors=True)
                    log(
                        f"  {key} rep {r + 1}/{reps}: local {v['local_seconds'][-1]:.2f} s, "
                        f"dask {v['seconds'][-1]:.2f} s"
                    )
            v["seconds_median"], v["local_seconds_median"] = med(v["seconds"]), med(v["local_seconds"])
            v["overhead_vs_local"] = v["seconds_median"] / v["local_seconds_median"] - 1
            v["overhead_vs_local_paired"] = paired_ratio(v["seconds"], v["local_seconds"]) - 1
            v["speedup_vs_local"] = v["local_seconds_median"] / v["seconds_median"]
            # CPU time (this process, which holds the scheduler and nannies, plus the workers): less
            # sensitive than wall time to other tenants' load; the workers' part is the compute side
            v["cpu_overhead_vs_local"] = med(v["cpu_seconds"]) / med(v["local_cpu_seconds"]) - 1
            v["worker_cpu_overhead_vs_local"] = med(v["cpu_seconds_workers"]) / med(v["local_cpu_seconds"]) - 1
            v["samples_per_s"] = samples / v["seconds_median"]
            v["local_samples_per_s"] = samples / v["local_seconds_median"]
            variants[key] = v
    finally:
        restore_env()
        shutil.rmtree(tmp, ignore_errors=True)
    res["variants"] = variants
    for suffix in ("", "_no_trim"):
        if f"1_worker{suffix}" not in variants or f"2_worker{suffix}" not in variants:
            continue
        one, two = variants[f"1_worker{suffix}"], variants[f"2_worker{suffix}"]
        res[f"overhead_1_worker{suffix}_vs_local"] = one["overhead_vs_local"]
        res[f"cpu_overhead_1_worker{suffix}_vs_local"] = one["cpu_overhead_vs_local"]
        res[f"worker_cpu_overhead_1_worker{suffix}_vs_local"] = one["worker_cpu_overhead_vs_local"]
        res[f"speedup_2_worker{suffix}_vs_local"] = two["speedup_vs_local"]
        res[f"speedup_2_worker{suffix}_vs_1_worker{suffix}"] = one["seconds_median"] / two["seconds_median"]
    return res


# -------------------------------------------------------------------- memory


def _vm_hwm() -> int | None:
    """Peak resident set of this process's address space (``VmHWM``), in bytes; None off Linux.

    Unlike ``getrusage(RUSAGE_SELF).ru_maxrss``, it is not inherited: on Linux a process
    started by fork (or vfork) + exec reports in ``ru_maxrss`` at least the RSS its parent
    had at the fork, which would hide the child's own peak under the benchmark's.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_child(samples: int, d: int, chunk_size: int) -> None:
    """Body of the memory subprocess: one in-process run, then its peak RSS as JSON on stdout."""
    from relulearn.pipeline.run import estimate

    cfg = make_run_config(
        d, {"basic": {}, "filtered": {"quantiles": QUANTILES}}, samples=samples, chunk_size=chunk_size
    )
    before = _vm_hwm()
    tmp = tempfile.mkdtemp(prefix="relulearn-mem-")
    try:
        t0 = time.perf_counter()
        summary = estimate(cfg, os.path.join(tmp, "run.zarr"), client=None, progress=None)
        seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    peak = _vm_hwm()
    if peak is None:  # not Linux: ru_maxrss (KiB on Linux, bytes on macOS)
        scale = 1 if sys.platform == "darwin" else 1024
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    print(
        json.dumps(
            {
                "samples": summary.samples,
                "seconds": seconds,
                "samples_per_s": summary.samples / seconds,
                "peak_rss_before_run_bytes": before,
                "peak_rss_bytes": peak,
                "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        )
    )


def run_memory_child(samples: int, d: int, chunk_size: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Run :func:`memory_child` in a fresh interpreter, sampling its RSS with psutil meanwhile."""
    import psutil

    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--memory-child",
        str(samples),
        "--memory-d",
        str(d),
        "--memory-chunk-size",
        str(chunk_size),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    trace: list[tuple[float, int]] = []
    while proc.poll() is None:
        try:
            trace.append((time.perf_counter() - t0, ps.memory_info().rss))
        except psutil.Error:
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"memory child ({samples} samples) failed:\n{err}")
    res = json.loads(out.strip().splitlines()[-1])
    res["wall_seconds"] = time.perf_counter() - t0
    if trace:
        rss = np.array([r for _, r in trace])
        # RSS at tenths of the run: flat when memory does not grow with the sample count
        idx = np.linspace(0, len(rss) - 1, 11).round().astype(int)
        res["rss_sampled_max_bytes"] = int(rss.max())
        res["rss_trace_deciles_bytes"] = [int(rss[i]) for i in idx]
    log(
        f"  {samples:.0e} samples: peak RSS {res['peak_rss_bytes'] / 2**20:.1f} MiB, "
        f"{res['seconds']:.1f} s ({res['samples_per_s']:,.0f} samples/s)"
    )
    return res


def bench_memory(
    sizes: list[int], *, d: int, chunk_size: int, budget: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """Peak RSS of in-process runs at each size, smallest first.

    The time of each larger run is predicted from the previous one; a size whose
    prediction exceeds ``budget`` seconds is replaced by the largest power of ten that fits
    (recorded as such).
    """
    runs: list[dict[str, Any]] = []
    notes = []
    for n in sorted(sizes):
        if runs:
            prev = runs[-1]
            predicted = n / prev["samples_per_s"]
            if predicted > budget:
                fit = 10 ** int(math.floor(math.log10(budget * prev["samples_per_s"])))
                notes.append(f"{n:.0e} samples predicted {predicted:.0f} s > budget {budget:.0f} s; ran {fit:.0e}")
                log("  " + notes[-1])
                n = fit
                if n <= prev["samples"]:
                    continue
            else:
                log(f"  {n:.0e} samples: predicted {predicted:.0f} s from the {prev['samples']:.0e} run")
        runs.append(run_memory_child(n, d, chunk_size, log))
    res: dict[str, Any] = {
        "d": d,
        "chunk_size": chunk_size,
        "statistics": ["basic", "filtered"],
        "mode": "in-process (client=None), fresh subprocess per size",
        "measure": "VmHWM of the child (peak RSS of its own address space); ru_maxrss of a "
        "fork+exec child includes the parent's RSS at the fork and is recorded "
        "only for reference",
        "runs": runs,
        "notes": notes,
    }
    if len(runs) >= 2:
        res["peak_ratio_largest_vs_smallest"] = runs[-1]["peak_rss_bytes"] / runs[0]["peak_rss_bytes"]
        if all(r["peak_rss_before_run_bytes"] for r in runs):
            res["run_increment_bytes"] = [r["peak_rss_bytes"] - r["peak_rss_before_run_bytes"] for r in runs]
    return res


# ---------------------------------------------------------------------- main


def summary_table(result: dict[str, Any]) -> str:
    """Markdown tables of the headline figures (for the README)."""
    lines = []
    fam = [r for r in result["families"]]
    gens = {g["d"]: g for g in result["generation"]}
    herm = [r for r in fam if r["family"] == "hermite"]
    fam = [r for r in fam if r["family"] != "hermite"]
    if herm:
        lines += [
            "| d | L | packed flops/sample | executed/packed (before → after) "
            "| update samples/s (before → after) | speed-up | roofline ratio (before → after) "
            "| gen+update samples/s |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in herm:
            if r["status"] != "ok":
                lines.append(f"| {r['d']} | {r['options']['max_order']} | | {r['status']} | | | | |")
                continue
            b = r["before"]
            lines.append(
                f"| {r['d']} | {r['max_order']} | {r['flops_per_sample']:,.0f} "
                f"| {b['executed_over_packed']:.2f} → {r['executed_over_packed']:.2f} "
                f"| {b['samples_per_s']:,.0f} → {r['update']['samples_per_s']:,.0f} | {r['speedup_vs_before']:.1f}× "
                f"| {b['roofline_ratio']:.2f} → {r['roofline_ratio']:.2f} "
                f"| {r['generation_update']['samples_per_s']:,.0f} |"
            )
        lines.append("")
    if fam:
        lines += [
            "| family | d | flops/sample | update samples/s | GFlop/s | yardstick samples/s | ratio "
            "| ratio vs dgemm "
            "| gen+update samples/s | accumulate_chunks samples/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in fam:
            if r["status"] != "ok":
                lines.append(f"| {r['family']} | {r['d']} | | {r['status']} | | | | | | |")
                continue
            lines.append(
                f"| {r['family']} | {r['d']} | {r['flops_per_sample']:,.0f} | {r['update']['samples_per_s']:,.0f} "
                f"| {r['update']['gflops_model']:.1f} | {r['yardstick_blas']['samples_per_s_equivalent']:,.0f} "
                f"| {r['roofline_ratio']:.2f} | {r['roofline_ratio_gemm']:.2f} "
                f"| {r['generation_update']['samples_per_s']:,.0f} | {r['accumulate_chunks']['samples_per_s']:,.0f} |"
            )
        lines += ["", "| d | generation samples/s | bare standard_normal samples/s | ratio |", "|---:|---:|---:|---:|"]
        for d, g in gens.items():
            lines.append(
                f"| {d} | {g['generation_samples_per_s']:,.0f} | "
                f"{g['bare_standard_normal_samples_per_s']:,.0f} "
                f"| {g['ratio']:.2f} |"
            )
    dk = result.get("dask")
    if dk:
        lines += [
            "",
            f"Dask vs. in-process (d={dk['d']}, basic+filtered, {dk['samples']:,} samples, chunk "
            f"{dk['chunk_size']:,}, {dk['chunks_per_block']} chunks/block; medians of {dk['reps']} "
            "interleaved pairs per cluster):",
            "",
            "| cluster | in-process s | Dask s | wall overhead | CPU overhead (all) | CPU overhead (workers) "
            "| speed-up | start-up s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for k, v in dk["variants"].items():
            lines.append(
                f"| {k} | {v['local_seconds_median']:.2f} | {v['seconds_median']:.2f} "
                f"| {100 * v['overhead_vs_local']:+.1f}% | {100 * v['cpu_overhead_vs_local']:+.1f}% "
                f"| {100 * v['worker_cpu_overhead_vs_local']:+.1f}% "
                f"| {v['speedup_vs_local']:.2f}× | {v['startup_seconds']:.1f} |"
            )
    mem = result.get("memory")
    if mem and mem.get("runs"):
        lines += [
            "",
            "| samples | peak RSS (MiB) | of which after imports (MiB) | run time (s) | samples/s |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in mem["runs"]:
            before = r["peak_rss_before_run_bytes"]
            lines.append(
                f"| {r['samples']:.0e} | {r['peak_rss_bytes'] / 2**20:.1f} "
                f"| {'' if before is None else f'{before / 2**20:.1f}'} | {r['seconds']:.1f} "
                f"| {r['samples_per_s']:,.0f} |"
            )
        if "peak_ratio_largest_vs_smallest" in mem:
            lines.append(f"\npeak RSS ratio largest/smallest: {mem['peak_ratio_largest_vs_smallest']:.3f}")
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The acceptance targets, evaluated."""
    out: dict[str, Any] = {}
    for r in result["families"]:
        if r["status"] == "ok" and r["family"] in ("basic", "filtered", "contracted") and r["d"] == 512:
            out[f"roofline_ratio_{r['family']}_d512"] = {
                "value": r["roofline_ratio"],
                "target": ">= 0.7",
                "met": r["roofline_ratio"] >= 0.7,
                "value_vs_dgemm": r["roofline_ratio_gemm"],
            }
    for r in result["families"]:
        if r["status"] == "ok" and r["family"] == "hermite":
            v = r["executed_over_packed"]
            out[f"hermite_executed_over_packed_d{r['d']}_L{r['max_order']}"] = {
                "value": v,
                "target": "<= 1.5",
                "met": v <= 1.5,
            }
    dk = result.get("dask")
    if dk:
        for suffix in ("", "_no_trim"):
            v = dk[f"overhead_1_worker{suffix}_vs_local"]
            out[f"dask_overhead{suffix}"] = {"value": v, "target": "<= 0.10", "met": v <= 0.10}
    mem = result.get("memory")
    if mem and "peak_ratio_largest_vs_smallest" in mem:
        v = mem["peak_ratio_largest_vs_smallest"]
        out["memory_flat"] = {
            "value": v,
            "target": "within 10%",
            "met": abs(v - 1) <= 0.10,
            "sizes": [r["samples"] for r in mem["runs"]],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see ``--help``."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a fast smoke run (small sizes, few repetitions)")
    p.add_argument(
        "--out", type=Path, help=f"JSON output (default {DEFAULT_OUT}; {HERMITE_OUT} when --families is hermite alone)"
    )
    p.add_argument("--dims", type=int, nargs="+", help="input dimensions (default 32 128 512)")
    p.add_argument(
        "--families",
        nargs="+",
        default=["basic", "filtered", "contracted", "hermite"],
        help="statistic families (default: basic filtered contracted hermite)",
    )
    p.add_argument(
        "--hermite-dims",
        type=int,
        nargs="+",
        help=f"input dimensions of the hermite family (default {' '.join(map(str, HERMITE_DIMS))})",
    )
    p.add_argument(
        "--hermite-orders",
        type=int,
        nargs="+",
        help=f"max orders L of the hermite family (default {' '.join(map(str, HERMITE_ORDERS))})",
    )
    p.add_argument("--skip-families", action="store_true", help="skip the per-family throughput part")
    p.add_argument("--skip-dask", action="store_true", help="skip the Dask overhead part")
    p.add_argument("--skip-memory", action="store_true", help="skip the peak-memory part")
    p.add_argument("--dask-reps", type=int, help="interleaved repetitions of the Dask comparison (default 5)")
    p.add_argument("--memory-sizes", type=float, nargs="+", help="sample counts of the memory runs (default 1e6 1e8)")
    p.add_argument(
        "--memory-budget",
        type=float,
        default=600.0,
        help="seconds allowed for the largest memory run (predicted from the smaller one)",
    )
    p.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--memory-d", type=int, default=32, help=argparse.SUPPRESS)
    p.add_argument("--memory-chunk-size", type=int, default=100_000, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.memory_child is not None:
        memory_child(args.memory_child, args.memory_d, args.memory_chunk_size)
        return 0

    q = args.quick
    dims = args.dims or ([32, 128] if q else [32, 128, 512])
    if args.out is None:
        args.out = HERMITE_OUT if args.families == ["hermite"] else DEFAULT_OUT
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", flush=True)

    result: dict[str, Any] = {
        "benchmark": "throughput",
        "started": utc_now(),
        "quick": q,
        "machine": machine_info(),
        "batch_rows": BATCH_ROWS,
        "flop_convention": (
            "1 flop = one float64 multiply or add (multiply-add = 2). Model counts exploit "
            "symmetry: a d×d second moment = d(d+1) flops/sample (syrk of n×d: n·d(d+1); "
            "general GEMM XᵀX: 2·n·d²); a packed order-l Hermite tensor = 2·C(d+l-1,l), "
            "orders 0..L together 2·C(d+L,L). Other lower-order (BLAS-1/2) terms not "
            "counted. Yardsticks count the same way."
        ),
        "families": [],
        "generation": [],
    }
    log(
        f"machine: {result['machine']['cores']} cores, BLAS kernel {result['machine']['blas_kernel']}, "
        f"load {result['machine']['load_average_at_start'][0]:.2f}"
    )
    sections = {}
    if not args.skip_families:
        t0 = time.perf_counter()
        log("per-family throughput")
        result["families"], result["generation"] = run_families(
            dims,
            args.families,
            min_reps=3 if q else 7,
            max_reps=10 if q else 41,
            budget=0.5 if q else 6.0,
            chunk_size=50_000,
            log=log,
            hermite_dims=args.hermite_dims,
            hermite_orders=args.hermite_orders,
        )
        sections["families"] = time.perf_counter() - t0
    if not args.skip_dask:
        t0 = time.perf_counter()
        log("dask overhead")
        result["dask"] = bench_dask(
            d=128,
            samples=400_000 if q else 2_000_000,
            chunk_size=50_000,
            chunks_per_block=4,
            reps=args.dask_reps or (1 if q else 5),
            log=log,
        )
        sections["dask"] = time.perf_counter() - t0
    if not args.skip_memory:
        t0 = time.perf_counter()
        log("peak memory")
        sizes = [int(s) for s in (args.memory_sizes or ([1e5, 1e6] if q else [1e6, 1e8]))]
        result["memory"] = bench_memory(sizes, d=32, chunk_size=100_000, budget=args.memory_budget, log=log)
        sections["memory"] = time.perf_counter() - t0
    result["targets"] = targets(result)
    result["finished"] = utc_now()
    result["section_seconds"] = sections
    result["total_seconds"] = time.perf_counter() - t_start
    save_json(result, args.out)
    print()
    print(summary_table(result))
    print()
    for k, v in result["targets"].items():
        print(f"target {k}: {v['value']:.3f} ({v['target']}) -> {'met' if v['met'] else 'MISSED'}")
    print(f"\ntotal {result['total_seconds']:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
