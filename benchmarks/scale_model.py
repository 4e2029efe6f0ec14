"""Cost model of one estimation pass at large d (a script, not a test; docs/design.md §7).

Measures here, per sample, on one core (one BLAS thread, as on a pipeline worker), at several
input dimensions d and row batches of ``BATCH_ROWS`` (the pipeline's batch), the cost of:

- generating the Gaussian inputs ``x`` (the sources' SFC64 generator, ``standard_normal``);
- evaluating the planted teacher (``one_hidden_relu`` of width 5) on them;
- ``Statistic.update`` of the dense families ``basic`` (Σxxᵀ), ``output_moments`` (the dense
  ``M_2``, whose sketch is ``second``), ``filtered`` (3 τ) and ``contracted`` (orders [2, 4] ×
  8 directions = 16 matrices);
- ``update`` of the ``sketch`` statistic (``relulearn.pipeline.stats.sketch``) holding one family
  (``second``, ``contracted`` or ``filtered``, the same options) at r = 16, 32, 64;
- the streamed refinement's ``relulearn.estimators.polish.streamed.gradient_sums`` (k = 5);
- a numpy ``a += b`` (the driver's merge of a block partial is one such add per array), in bytes
  of ``b`` per second, and ``Partial.add`` of a real partial to check it.

Every cost is fitted to its model form by (unweighted) least squares over the measured d (the
largest d dominates, as wanted for extrapolation): generation ``a·d``, teacher and refinement
``c·k·d``, dense ``c·d²``, sketch ``a·d·r + b·d`` (the ``b·d`` part: the direction projections
and weights of the contracted family). Costs are CPU seconds of this process
(``time.process_time``: robust to other jobs time-sharing the cores; wall times are recorded
too), median over repetitions. A check runs whole chunks through ``accumulate_chunks`` and
compares them with the sum of the parts.

The bytes of a block partial (sums and error terms, float64) come from each statistic's
``sums_schema()`` and ``terms_schema()``, built at the projected d; ``relulearn.pipeline.plan``'s
``dense_bytes`` / ``sketch_bytes`` (matrices only) are recorded beside them.

The projection (d = 10⁴, 10⁵; n = 10⁹; N = 1, 16, 256 one-core workers; chunks of 50 000,
4 chunks per block) assumes perfect scaling of the workers' compute, and a driver that merges
the block partials serially (overlapped with the workers): wall = max(compute / N, merge).
The JSON states every assumption, also a variant with the driver receiving the partials at an
assumed network bandwidth (``--network-gbit``).

Run ``python benchmarks/scale_model.py`` (6–7 minutes on 2 busy cores); ``--quick`` is a smoke
run at small d (written to a temporary file unless ``--out`` is given). Writes
``benchmarks/results/scale_model.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a source tree without installing
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

from relulearn.config import FilteredConfig, RunConfig, config_from_dict  # noqa: E402
from relulearn.estimators.polish.streamed import gradient_sums, part_rows_for  # noqa: E402
from relulearn.pipeline import plan  # noqa: E402
from relulearn.pipeline.families import build_statistics  # noqa: E402
from relulearn.pipeline.sources import (  # noqa: E402
    BATCH_ROWS,
    Stream,
    TeacherSource,
    batch_rows,
    chunk_batches,
    generator,
    make_source,
)
from relulearn.pipeline.stats.base import Statistic  # noqa: E402
from relulearn.pipeline.stats.filtered import threshold_grid  # noqa: E402
from relulearn.pipeline.stats.partial import Partial, accumulate_chunks  # noqa: E402

from _common import cpu_model, save_json, utc_now  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "scale_model.json"
SEED = 11
WIDTH = 5  # hidden units of the planted teacher, and k of the refinement
QUANTILES = [0.5, 0.8, 0.95]
CONTRACTED = {"orders": [2, 4], "directions": 8}
DENSE = ["basic", "output_moments", "filtered", "contracted"]
SKETCHED = ["second", "filtered", "contracted"]
#: the dense family whose matrices each sketched family sketches
DENSE_OF = {"second": "output_moments", "filtered": "filtered", "contracted": "contracted"}
MATRICES = {
    "basic": 1,
    "output_moments": 1,
    "second": 1,
    "filtered": len(QUANTILES),
    "contracted": len(CONTRACTED["orders"]) * CONTRACTED["directions"],
}
FLOAT = 8
#: the per-sample costs linear in d (inputs, teacher, refinement): cheap, repeated more
INPUT_CALLS = ("generation_x", "teacher", "source_batch", "refinement")

# the projection
PROJECT_DIMS = [10_000, 100_000]
PROJECT_SAMPLES = 10**9
PROJECT_WORKERS = [1, 16, 256]
PROJECT_RANKS = [16, 32, 64]
CHUNK_SIZE = 50_000
CHUNKS_PER_BLOCK = 4
WORKER_BYTES = 4 * 10**9
#: per chunk a worker zeroes its accumulator, adds it into the block's sums, squares the chunk's
#: estimands and adds them into the error terms: about this many passes over the sums' bytes
CHUNK_FINALIZE_PASSES = 4

#: measured d: not powers of two (whose strides alias in the caches: ~10 % slower dense updates at 1024, 2048)
FULL = {
    "dims": [125, 500, 1000, 2000, 4000, 8000, 16000],
    "dense_dims": [125, 500, 1000, 2000, 3000],
    "ranks": [16, 32, 64],
    "min_reps": 3,
    "max_reps": 7,
    "budget": 3.0,
    "merge_mib": 256,
    "check_d": 1000,
    "check_chunk": 50_000,
    "check_reps": 2,
    "input_reps": 9,
}
QUICK = {
    "dims": [64, 125, 250],
    "dense_dims": [64, 125, 250],
    "ranks": [16, 32],
    "min_reps": 1,
    "max_reps": 2,
    "budget": 0.5,
    "merge_mib": 32,
    "check_d": 125,
    "check_chunk": 8_192,
    "check_reps": 1,
    "input_reps": 2,
}


# ------------------------------------------------------------------ timing


def time_interleaved(
    fns: dict[str, Callable[[], Any]],
    *,
    min_reps: int,
    max_reps: int,
    budget: float,
    at_least: dict[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Median CPU and wall seconds of each callable, timed in interleaved rounds (A, B, C, A, B, ...).

    One untimed warm-up call each; then each callable gets as many repetitions as fit ``budget``
    seconds (judged from its warm-up), within ``[min_reps, max_reps]`` (at least ``at_least[name]``),
    spread over the rounds so that load from other jobs hits every callable alike.
    """
    target = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        reps = int(min(max_reps, max(min_reps, budget // max(time.perf_counter() - t0, 1e-9))))
        target[name] = max(reps, (at_least or {}).get(name, 0))
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    while any(len(cpu[k]) < target[k] for k in fns):
        for name, fn in fns.items():
            if len(cpu[name]) < target[name]:
                c0, w0 = time.process_time(), time.perf_counter()
                fn()
                cpu[name].append(time.process_time() - c0)
                wall[name].append(time.perf_counter() - w0)
    return {
        k: {
            "cpu": float(np.median(cpu[k])),
            "wall": float(np.median(wall[k])),
            "reps": len(cpu[k]),
            "cpu_spread": [float(min(cpu[k])), float(max(cpu[k]))],
        }
        for k in fns
    }


def time_call(fn: Callable[[], Any], *, min_reps: int, max_reps: int, budget: float) -> dict[str, Any]:
    """:func:`time_interleaved` of one callable."""
    return time_interleaved({"fn": fn}, min_reps=min_reps, max_reps=max_reps, budget=budget)["fn"]


def per_sample(t: dict[str, float], rows: int) -> dict[str, Any]:
    """A timing of a call on ``rows`` samples, per sample."""
    return {
        "rows": rows,
        "cpu_s_per_sample": t["cpu"] / rows,
        "wall_s_per_sample": t["wall"] / rows,
        "reps": t["reps"],
        "cpu_s_per_call_range": t["cpu_spread"],
    }


# ------------------------------------------------------------------ set-up


def run_config(d: int, statistics: dict[str, Any]) -> RunConfig:
    """A run of a planted width-5 one-hidden-layer ReLU teacher in dimension ``d``."""
    return config_from_dict(
        {
            "seed": SEED,
            "samples": PROJECT_SAMPLES,
            "chunk_size": CHUNK_SIZE,
            "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": WIDTH}},
            "statistics": statistics,
            "run": {"chunks_per_block": CHUNKS_PER_BLOCK},
        }
    )


def tau_grid() -> list[float]:
    """τ at the |y| quantiles :data:`QUANTILES` of the teacher (pilot pass at d = 128; the law of y
    hardly depends on d: the teacher's rows are unit vectors), given to every family as thresholds."""
    source = make_source(run_config(128, {"basic": {}}))
    tau, _ = threshold_grid(FilteredConfig(quantiles=QUANTILES), source, SEED)
    return [float(t) for t in tau]


def family_section(family: str, tau: list[float]) -> dict[str, Any]:
    """The configuration section of one family (dense name, or sketched family name)."""
    if family == "filtered":
        return {"thresholds": tau}
    if family == "contracted":
        return dict(CONTRACTED)
    return {}


def build_family(family: str, d: int, tau: list[float], rank: int | None = None) -> Statistic:
    """The statistic of one family at ``d``: dense (``rank`` None) or its sketch of rank ``rank``,
    built from a configuration by ``build_statistics`` as a run builds it."""
    if rank is None:
        stats: dict[str, Any] = {"basic": None, family: family_section(family, tau)}
        if family == "basic":
            stats = {"basic": {}}
    else:
        stats = {"basic": None, "sketch": {"rank": rank, family: family_section(family, tau)}}
    (stat,) = build_statistics(run_config(d, stats), None)
    return stat


def schema_bytes(stat: Statistic) -> dict[str, int]:
    """Bytes of a block partial of ``stat``: its sums and its error terms (float64)."""
    sums = sum(math.prod(v.shape) for v in stat.sums_schema().values()) * FLOAT
    terms = sum(math.prod(v.shape) for v in stat.terms_schema().values()) * FLOAT
    largest = max(math.prod(v.shape) for v in stat.sums_schema().values()) * FLOAT
    return {"sums": sums, "error_terms": terms, "partial": sums + terms, "largest_sums_array": largest}


# ------------------------------------------------------------------ measurements


def input_calls(d: int, source: TeacherSource, x: np.ndarray) -> dict[str, Callable[[], Any]]:
    """Generation of x alone (the sources' generator), the teacher on x, and the source's whole
    batch (x and labels, as a chunk draws it)."""
    rows = len(x)
    gx = generator(SEED, Stream.INPUTS, 1_000)
    gsrc, gnoise = generator(SEED, Stream.INPUTS, 2_000), generator(SEED, Stream.NOISE, 2_000)
    return {
        "generation_x": lambda: gx.standard_normal((rows, d)),
        "teacher": lambda: source.labels(x),
        "source_batch": lambda: list(source.batches(gsrc, gnoise, rows)),
    }


def update_call(stat: Statistic, x: np.ndarray, y: np.ndarray) -> Callable[[], Any]:
    """``stat.update`` of one batch into an accumulator of its own."""
    acc = stat.init()
    return lambda: stat.update(acc, x, y)


def refinement_call(x: np.ndarray, y: np.ndarray) -> Callable[[], Any]:
    """``gradient_sums`` of a width-5 network (unit rows, random signs) on one batch."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((WIDTH, x.shape[1]))
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    s = rng.choice([-1.0, 1.0], size=WIDTH)
    return lambda: gradient_sums(x, y, w, s)


def measure_at(d: int, tau: list[float], cfg: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """Every per-sample cost at dimension ``d`` on one batch of ``BATCH_ROWS`` real samples, interleaved."""
    source = make_source(run_config(d, {"basic": {}}))
    x, y = next(chunk_batches(source, SEED, 0, BATCH_ROWS))
    calls = {**input_calls(d, source, x), "refinement": refinement_call(x, y)}
    if d in cfg["dense_dims"]:
        calls.update({f"dense/{fam}": update_call(build_family(fam, d, tau), x, y) for fam in DENSE})
    calls.update(
        {f"sketch/{fam}/{r}": update_call(build_family(fam, d, tau, r), x, y) for fam in SKETCHED for r in cfg["ranks"]}
    )
    # the inputs' costs dominate the sketches' projection and are cheap: repeat them more
    t = time_interleaved(
        calls,
        min_reps=cfg["min_reps"],
        max_reps=cfg["max_reps"],
        budget=cfg["budget"],
        at_least={k: cfg["input_reps"] for k in INPUT_CALLS},
    )
    out: dict[str, Any] = {
        "d": d,
        "kept_fraction_filtered": float(np.mean(np.abs(y) > tau[0])),
        "dense": {},
        "sketch": {fam: {} for fam in SKETCHED},
    }
    for name, tn in t.items():
        kind, _, rest = name.partition("/")
        if kind == "dense":
            out["dense"][rest] = per_sample(tn, len(x))
        elif kind == "sketch":
            fam, r = rest.split("/")
            out["sketch"][fam][r] = per_sample(tn, len(x))
        else:
            out[name] = per_sample(tn, len(x))
    us = {k: v["cpu"] / len(x) * 1e6 for k, v in t.items()}
    r = cfg["ranks"][-1]
    log(
        f"  d={d:5d} µs/sample: x {us['generation_x']:.3g}, teacher {us['teacher']:.3g}, batch "
        f"{us['source_batch']:.3g}, refine {us['refinement']:.3g}"
        + "".join(f", {f} {us[f'dense/{f}']:.3g}" for f in DENSE if f"dense/{f}" in us)
        + f"; sketch r={r}: "
        + ", ".join(f"{f} {us[f'sketch/{f}/{r}']:.3g}" for f in SKETCHED)
    )
    return out


def time_numpy_add(n: int, cfg: dict[str, Any]) -> dict[str, float]:
    """Timing of ``a += b`` on two float64 arrays of ``n`` entries."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(n), rng.standard_normal(n)
    return time_call(lambda: np.add(a, b, out=a), min_reps=max(3, cfg["min_reps"]), max_reps=9, budget=cfg["budget"])


def measure_merge(cfg: dict[str, Any], tau: list[float]) -> dict[str, Any]:
    """Bytes per second of ``a += b`` (bytes of ``b``), and of ``Partial.add`` on a real dense partial."""
    n = cfg["merge_mib"] * 2**20 // FLOAT
    t = time_numpy_add(n, cfg)
    d = cfg["dense_dims"][-1]
    stat = build_family("basic", d, tau)
    p, q = Partial.empty([stat], 0), Partial.empty([stat], 0)
    for arrays in (*q.sums.values(), *q.sumsq.values()):
        for v in arrays.values():
            v += 1.0
    state = {"p": p}

    def partial_add() -> None:
        q.chunk_start = q.chunk_stop = state["p"].chunk_stop  # merge in chunk order
        state["p"].add(q)

    tp = time_call(partial_add, min_reps=max(3, cfg["min_reps"]), max_reps=9, budget=cfg["budget"])
    return {
        "numpy_add": {
            "bytes": n * FLOAT,
            "cpu_s": t["cpu"],
            "wall_s": t["wall"],
            "reps": t["reps"],
            "bytes_per_s": n * FLOAT / t["cpu"],
            "bytes_per_s_wall": n * FLOAT / t["wall"],
        },
        "partial_add": {
            "family": "basic",
            "d": d,
            "bytes": q.nbytes(),
            "cpu_s": tp["cpu"],
            "reps": tp["reps"],
            "bytes_per_s": q.nbytes() / tp["cpu"],
        },
    }


def next_chunk(stat: Statistic, source: TeacherSource, chunk: int) -> Callable[[], Any]:
    """A callable that reduces the next chunk of the run (0, 1, 2, ...) into a partial."""
    state = {"chunk": 0}

    def run() -> Partial:
        c = state["chunk"]
        state["chunk"] += 1
        return accumulate_chunks([stat], source, SEED, chunk, c, c + 1)

    return run


def measure_chunks(cfg: dict[str, Any], tau: list[float]) -> list[dict[str, Any]]:
    """Whole chunks through ``accumulate_chunks`` (generation, finiteness check, update, error
    terms), per sample, at one d, for a few families: the check of the sum of the parts."""
    d, chunk = cfg["check_d"], cfg["check_chunk"]
    rank = 32 if 32 in cfg["ranks"] else cfg["ranks"][0]
    source = make_source(run_config(d, {"basic": {}}))
    out = []
    for fam, r in (("basic", None), ("filtered", None), ("second", rank), ("contracted", rank)):
        stat = build_family(fam, d, tau, r)
        t = time_call(
            next_chunk(stat, source, chunk), min_reps=cfg["check_reps"], max_reps=cfg["check_reps"], budget=0.0
        )
        out.append(
            {
                "family": fam,
                "form": "dense" if r is None else "sketch",
                "rank": r,
                "d": d,
                "chunk_size": chunk,
                **per_sample(t, chunk),
            }
        )
    return out


# ------------------------------------------------------------------ fits


def lstsq_fit(
    features: list[list[float]], t: list[float], names: list[str], form: str, labels: list[dict[str, Any]]
) -> dict[str, Any]:
    """Least squares ``t ≈ features @ coef`` (no intercept) with relative residuals per point."""
    f, tt = np.asarray(features, dtype=float), np.asarray(t, dtype=float)
    coef, *_ = np.linalg.lstsq(f, tt, rcond=None)
    fitted = f @ coef
    rel = tt / fitted - 1.0
    return {
        "form": form,
        "coefficients": dict(zip(names, coef.tolist())),
        "points": [
            {**lab, "measured": float(m), "fitted": float(v), "relative_residual": float(e)}
            for lab, m, v, e in zip(labels, tt, fitted, rel)
        ],
        "max_abs_relative_residual": float(np.max(np.abs(rel))),
    }


def loglog_slope(d: list[int], t: list[float]) -> float | None:
    """Exponent of d from a log-log line through the points (a check of the model's power)."""
    return float(np.polyfit(np.log(d), np.log(t), 1)[0]) if len(d) >= 2 else None


def fit_power(
    meas: list[dict[str, Any]],
    key: Callable[[dict[str, Any]], dict[str, Any] | None],
    power: int,
    scale: float,
    form: str,
    name: str,
) -> dict[str, Any]:
    """Fit ``t = c · scale · d**power`` to the per-sample CPU costs ``key(m)`` of the measurements."""
    pts = [(m["d"], key(m)["cpu_s_per_sample"]) for m in meas if key(m) is not None]
    fit = lstsq_fit([[scale * d**power] for d, _ in pts], [t for _, t in pts], [name], form, [{"d": d} for d, _ in pts])
    fit["loglog_slope"] = loglog_slope([d for d, _ in pts], [t for _, t in pts])
    return fit


def fit_sketch(meas: list[dict[str, Any]], fam: str) -> dict[str, Any]:
    """Fit ``t = a · d · r + b · d`` to a sketched family's per-sample costs over every (d, r)."""
    rows, ts, labels = [], [], []
    for m in meas:
        for r, v in m["sketch"][fam].items():
            rows.append([m["d"] * int(r), m["d"]])
            ts.append(v["cpu_s_per_sample"])
            labels.append({"d": m["d"], "rank": int(r)})
    return lstsq_fit(rows, ts, ["a_per_d_r", "b_per_d"], "a*d*r + b*d", labels)


def fit_all(meas: list[dict[str, Any]]) -> dict[str, Any]:
    """Every model fit."""
    fits = {
        "generation_x": fit_power(meas, lambda m: m["generation_x"], 1, 1.0, "a*d", "a_per_d"),
        "teacher": fit_power(meas, lambda m: m["teacher"], 1, WIDTH, "c*k*d (k = 5)", "c_per_k_d"),
        "source_batch": fit_power(meas, lambda m: m["source_batch"], 1, 1.0, "a*d", "a_per_d"),
        "refinement": fit_power(meas, lambda m: m["refinement"], 1, WIDTH, "c*k*d (k = 5)", "c_per_k_d"),
    }
    for fam in DENSE:
        fits[f"dense_{fam}"] = fit_power(meas, lambda m, f=fam: m["dense"].get(f), 2, 1.0, "c*d^2", "c_per_d2")
    for fam in SKETCHED:
        fits[f"sketch_{fam}"] = fit_sketch(meas, fam)
    return fits


# ------------------------------------------------------------------ projection


def per_sample_model(fits: dict[str, Any], kind: str, family: str, d: int, rank: int | None) -> dict[str, float]:
    """Fitted seconds per sample at ``d`` of generation, teacher and the update of one family."""
    c = {k: v["coefficients"] for k, v in fits.items()}
    out = {"generation_x": c["generation_x"]["a_per_d"] * d, "teacher": c["teacher"]["c_per_k_d"] * WIDTH * d}
    if kind == "dense":
        out["update"] = c[f"dense_{family}"]["c_per_d2"] * d * d
    elif kind == "sketch":
        s = c[f"sketch_{family}"]
        out["update"] = s["a_per_d_r"] * d * rank + s["b_per_d"] * d
    else:
        out["update"] = c["refinement"]["c_per_k_d"] * WIDTH * d
    return out


def finalize_seconds(sums_bytes: int, merge_bps: float, chunk_size: int) -> float:
    """Per-sample share of the end of a chunk: :data:`CHUNK_FINALIZE_PASSES` passes over the sums."""
    return CHUNK_FINALIZE_PASSES * sums_bytes / merge_bps / chunk_size


def partial_layout(kind: str, family: str, d: int, rank: int | None, tau: list[float]) -> dict[str, Any]:
    """Bytes of one block partial (from the schemas), plan's matrix-only count, and a worker's
    working set: partial + the chunk accumulator + one temporary of its largest array (the
    update's product or the chunk's estimands) + two row batches of x (a source builds the next
    batch while the loop still holds the last) + the finiteness check's boolean mask.

    The refinement ships one k × d gradient sum per part of ``part_rows_for(d)`` rows (the part's
    inputs are drawn whole: its working set is about two parts' inputs)."""
    if kind == "refinement":
        rows = part_rows_for(d)
        b = (WIDTH * d + 3) * FLOAT
        batch = 2 * batch_rows(d) * d * FLOAT  # a part is summed batch by batch (store format 2)
        return {
            "sums": b,
            "error_terms": 0,
            "partial": b,
            "samples_per_partial": rows,
            "plan_bytes": None,
            "batch_bytes": batch,
            "working_set_bytes": b + batch,
            "partial_fits_worker": b <= WORKER_BYTES,
            "working_set_fits_worker": b + batch <= WORKER_BYTES,
        }
    by = schema_bytes(build_family(family, d, tau, rank))
    mats = MATRICES[family]
    planned = plan.dense_bytes(d, mats) if kind == "dense" else plan.sketch_bytes(d, mats, rank)
    rows = batch_rows(d)  # at most 32 MB of inputs per batch (store format 2)
    batch = 2 * rows * d * FLOAT + rows * d
    working = by["partial"] + by["sums"] + by["largest_sums_array"] + batch
    return {
        **by,
        "samples_per_partial": CHUNK_SIZE * CHUNKS_PER_BLOCK,
        "plan_bytes": planned,
        "batch_bytes": batch,
        "working_set_bytes": working,
        "partial_fits_worker": by["partial"] <= WORKER_BYTES,
        "working_set_fits_worker": working <= WORKER_BYTES,
    }


def project_one(
    fits: dict[str, Any],
    merge_bps: float,
    net_bps: float,
    kind: str,
    family: str,
    d: int,
    rank: int | None,
    tau: list[float],
) -> list[dict[str, Any]]:
    """Projection rows (one per N) of one family and form at ``d``."""
    lay = partial_layout(kind, family, d, rank, tau)
    parts = per_sample_model(fits, kind, family, d, rank)
    if kind != "refinement":
        parts["chunk_finalize"] = finalize_seconds(lay["sums"], merge_bps, CHUNK_SIZE)
    s_per_sample = sum(parts.values())
    compute = PROJECT_SAMPLES * s_per_sample
    blocks = math.ceil(PROJECT_SAMPLES / lay["samples_per_partial"])
    shipped = blocks * lay["partial"]
    merge, receive = shipped / merge_bps, shipped / net_bps
    rows = []
    for n in PROJECT_WORKERS:
        wall = max(compute / n, merge)
        wall_net = max(compute / n, merge + receive)
        rows.append(
            {
                "kind": kind,
                "family": family,
                "rank": rank,
                "d": d,
                "samples": PROJECT_SAMPLES,
                "workers": n,
                "seconds_per_sample": s_per_sample,
                "seconds_per_sample_parts": parts,
                "compute_core_hours": compute / 3600,
                "worker_hours": compute / n / 3600,
                "blocks": blocks,
                "bytes_per_block_partial": lay["partial"],
                "bytes_shipped_total": shipped,
                "driver_merge_hours": merge / 3600,
                "driver_receive_hours": receive / 3600,
                "wall_hours": wall / 3600,
                "bound": "workers" if compute / n >= merge else "driver merge",
                "speedup_over_1_worker": compute / wall,
                "wall_hours_with_network": wall_net / 3600,
                "driver_bound_from_workers": compute / merge if merge > 0 else None,
                "driver_bound_from_workers_with_network": compute / (merge + receive) if merge > 0 else None,
                "layout": lay,
            }
        )
    return rows


def projection(fits: dict[str, Any], merge_bps: float, net_bps: float, tau: list[float]) -> list[dict[str, Any]]:
    """Every projection row: dense families, sketched families at each rank, the refinement."""
    rows: list[dict[str, Any]] = []
    for d in PROJECT_DIMS:
        for fam in DENSE:
            rows += project_one(fits, merge_bps, net_bps, "dense", fam, d, None, tau)
        for fam in SKETCHED:
            for r in PROJECT_RANKS:
                rows += project_one(fits, merge_bps, net_bps, "sketch", fam, d, r, tau)
        rows += project_one(fits, merge_bps, net_bps, "refinement", "gradient_sums", d, None, tau)
    return rows


def assumptions(merge_bps: float, net_bps: float) -> dict[str, Any]:
    """The projection's assumptions, stated."""
    return {
        "samples": PROJECT_SAMPLES,
        "dims": PROJECT_DIMS,
        "workers": PROJECT_WORKERS,
        "ranks": PROJECT_RANKS,
        "chunk_size": CHUNK_SIZE,
        "chunks_per_block": CHUNKS_PER_BLOCK,
        "batch_rows": BATCH_ROWS,
        "worker_memory_bytes": WORKER_BYTES,
        "per_sample_cost": "fitted CPU seconds on one core of this machine (one BLAS thread), extrapolated "
        "from the measured d by the model forms; every worker is one such dedicated core",
        "scaling": "perfect: the workers' compute time is (n × seconds per sample) / N; no scheduling, "
        "serialization or straggler cost",
        "driver": "one driver merges every block partial serially, in block order, overlapped with the "
        "workers' compute: wall = max(compute / N, merge); merge = bytes shipped / merge rate",
        "merge_bytes_per_s": merge_bps,
        "merge_rate": "measured numpy a += b (bytes of b per CPU second) on arrays larger than the caches",
        "chunk_finalize": f"{CHUNK_FINALIZE_PASSES} passes over the sums' bytes per chunk at the merge rate "
        "(zero the accumulator, add it into the block, square the estimands, add them)",
        "network": "wall_hours_with_network also adds, to the driver's serial time, receiving every partial "
        "at the assumed bandwidth (no overlap of receive and merge on the driver)",
        "network_bytes_per_s": net_bps,
        "partial_bytes": "sums + error terms (float64) from the statistics' sums_schema() / terms_schema() "
        "at the projected d",
        "working_set": "partial + chunk accumulator (sums) + one temporary of the largest sums array + 2 "
        "batches of x (batch_rows(d) × d float64, at most 32 MB) + the finiteness mask; "
        "Python, Dask and serialization copies are not counted (a lower bound)",
        "refinement": "one pass of gradient_sums (k = 5) with generation and teacher; it ships one k × d "
        "gradient sum per part of part_rows_for(d) rows ('blocks' counts parts)",
    }


# ------------------------------------------------------------------ output


def machine() -> dict[str, Any]:
    """Cores, CPU, load, numpy and the BLAS kernel in use."""
    cpu = cpu_model()
    with threadpool_limits(1, "blas"):
        blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return {
        "hostname": platform.node(),
        "cpu_model": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "load_average_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": [{k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")} for i in blas],
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS")},
    }


def fmt_bytes(b: float) -> str:
    """Bytes in decimal units."""
    for unit, s in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= s:
            return f"{b / s:.3g} {unit}"
    return f"{b:.0f} B"


def print_tables(fits: dict[str, Any], rows: list[dict[str, Any]], merge_bps: float) -> None:
    """The fitted constants and the projection at r = 32 (dense vs sketch)."""
    print("\nfitted per-sample constants (CPU s, one core):")
    for name, f in fits.items():
        coef = ", ".join(f"{k} = {v:.3g}" for k, v in f["coefficients"].items())
        slope = f.get("loglog_slope")
        print(
            f"  {name:24s} {f['form']:16s} {coef:40s} max |rel. residual| {f['max_abs_relative_residual']:.2f}"
            + (f", log-log slope {slope:.2f}" if slope is not None else "")
        )
    print(f"  merge (numpy add): {merge_bps / 1e9:.2f} GB/s")
    print("\nprojection, n = 1e9 (wall hours; driver merge hours; bytes per block partial; worker working set):")
    print(
        f"  {'d':>6s} {'family':15s} {'form':9s} {'N=1':>9s} {'N=16':>9s} {'N=256':>9s} {'merge h':>8s} "
        f"{'bytes/block':>11s} {'working set':>11s}"
    )
    keep = [r for r in rows if r["rank"] in (None, 32) and r["family"] != "basic"]
    for key in dict.fromkeys((r["d"], r["kind"], r["family"], r["rank"]) for r in keep):
        grp = [r for r in keep if (r["d"], r["kind"], r["family"], r["rank"]) == key]
        form = key[1] if key[3] is None else f"sketch{key[3]}"
        hours = " ".join(f"{r['wall_hours']:9.3g}" for r in grp)
        first = grp[0]
        partial, working = fmt_bytes(first["bytes_per_block_partial"]), fmt_bytes(first["layout"]["working_set_bytes"])
        print(
            f"  {key[0]:6d} {key[2]:15s} {form:9s} {hours} {first['driver_merge_hours']:8.3g} "
            f"{partial:>11s} {working:>11s}"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a smoke run at small d, few repetitions")
    p.add_argument("--out", type=Path, help=f"JSON output (default {DEFAULT_OUT}; --quick: a temporary file)")
    p.add_argument(
        "--network-gbit",
        type=float,
        default=10.0,
        help="assumed network bandwidth into the driver, Gbit/s (default 10)",
    )
    args = p.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out = args.out or (Path(tempfile.gettempdir()) / "relulearn-scale-model-quick.json" if args.quick else DEFAULT_OUT)
    t_start = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "scale_model",
        "started": utc_now(),
        "quick": args.quick,
        "command": "python benchmarks/scale_model.py" + (" --quick" if args.quick else ""),
        "machine": machine(),
        "settings": dict(cfg),
    }

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)

    with threadpool_limits(1, "blas"):
        tau = tau_grid()
        result["settings"].update(
            batch_rows=BATCH_ROWS,
            dense_counterpart_of_sketch=DENSE_OF,
            teacher={"kind": "one_hidden_relu", "width": WIDTH},
            filtered={"quantiles": QUANTILES, "tau": tau},
            contracted=CONTRACTED,
            timing="CPU seconds of this process (time.process_time), median over repetitions "
            "after one warm-up call; wall seconds recorded beside",
        )
        log(f"τ grid {np.round(tau, 3).tolist()}; measuring at d = {cfg['dims']}")
        meas = [measure_at(d, tau, cfg, log) for d in sorted(set(cfg["dims"]) | set(cfg["dense_dims"]))]
        result["measurements"] = meas
        result["merge"] = merge = measure_merge(cfg, tau)
        log(
            f"merge: numpy add {merge['numpy_add']['bytes_per_s'] / 1e9:.2f} GB/s, Partial.add "
            f"{merge['partial_add']['bytes_per_s'] / 1e9:.2f} GB/s"
        )
        fits = fit_all(meas)
        result["fits"] = fits
        merge_bps = merge["numpy_add"]["bytes_per_s"]
        net_bps = args.network_gbit * 1e9 / 8
        checks = measure_chunks(cfg, tau)
        for c in checks:
            parts = per_sample_model(fits, c["form"], c["family"], c["d"], c["rank"])
            sums = schema_bytes(build_family(c["family"], c["d"], tau, c["rank"]))["sums"]
            parts["chunk_finalize"] = finalize_seconds(sums, merge_bps, c["chunk_size"])
            c["predicted_parts"] = parts
            c["predicted_cpu_s_per_sample"] = sum(parts.values())
            c["measured_over_predicted"] = c["cpu_s_per_sample"] / c["predicted_cpu_s_per_sample"]
            log(
                f"check {c['family']} {c['form']} d={c['d']}: accumulate_chunks {c['cpu_s_per_sample'] * 1e6:.3g} "
                f"µs/sample, model {c['predicted_cpu_s_per_sample'] * 1e6:.3g} "
                f"(ratio {c['measured_over_predicted']:.2f})"
            )
        result["chunk_check"] = checks
        result["assumptions"] = assumptions(merge_bps, net_bps)
        result["projection"] = rows = projection(fits, merge_bps, net_bps, tau)
    result["wall_seconds"] = time.perf_counter() - t_start
    print_tables(fits, rows, merge_bps)
    save_json(result, out)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
