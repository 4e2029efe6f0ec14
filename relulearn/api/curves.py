"""Learning curves (``curve``): one store extended through increasing sample counts, the method learned at each,
the learned model measured against the teacher, and the slope of the parameter error against the samples on
log-log axes (:func:`fit_slope`, a pure function) beside the rate the method's paper states."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ..config import RunConfig, load_config
from ..estimators.base import BudgetError, NoSignalError, TooFewSamplesError
from ..pipeline.run import estimate as _estimate
from ..storage import RunStore
from .execution import Where, stored_samples, working
from .fitting import fit_config
from .keywords import split_keywords, takes_keywords
from .learning import learn_with
from .models import evaluate
from .runs import planned_workers

__all__ = ["curve", "fit_slope", "EXACT_FLOOR", "STATED_SLOPE", "rounded_counts"]

#: a parameter error below this is exact recovery (double precision's polish reaches ~1e-15; a noisy fit at these
#: sample counts stays above 1e-5): such points are marked and left out of the slope
EXACT_FLOOR = 1e-10

#: the rate the methods' papers state for the parameter error under label noise: error ~ n^{-1/2} (``moments``
#: ends in a least-squares fit of the network on every sample the store holds, whose error is a regression's)
STATED_SLOPE = -0.5

#: the store's record of each learned point (``records/curve-<time>.json``)
RECORD = "curve"

#: what a learn may raise for a sample count too small for the method: the point is kept, with the reason
_TOO_FEW = (NoSignalError, TooFewSamplesError, BudgetError)


def fit_slope(samples: Sequence[float], errors: Sequence[float | None], floor: float = EXACT_FLOOR) -> dict[str, Any]:
    """The least-squares line through ``(log n, log error)`` of the points above ``floor``.

    Parameters
    ----------
    samples
        The sample counts n, increasing.
    errors
        The error at each count (None: not measured, left out).
    floor
        Errors below it are exact recovery: the first such count is ``exact_recovery_samples``, and no point
        below it enters the fit.

    Returns
    -------
    dict
        ``slope`` and ``constant`` (error ≈ constant · n^slope; None with fewer than two points fitted),
        ``slope_se`` (its standard error from the residuals; None with fewer than three points), ``fitted``
        (the counts fitted) and ``exact_recovery_samples`` (the first count below ``floor``, or None).
    """
    n = np.asarray(samples, dtype=float)
    e = np.array([np.nan if v is None else float(v) for v in errors], dtype=float)
    exact = np.isfinite(e) & (e < floor)
    first = int(n[exact][0]) if exact.any() else None
    keep = np.isfinite(e) & (e >= floor)
    out: dict[str, Any] = {
        "slope": None,
        "slope_se": None,
        "constant": None,
        "fitted": [int(v) for v in n[keep]],
        "exact_recovery_samples": first,
        "floor": floor,
    }
    if len(np.unique(n[keep])) < 2:
        return out
    x, y = np.log(n[keep]), np.log(e[keep])
    design = np.column_stack([x, np.ones_like(x)])
    (slope, intercept), *_ = np.linalg.lstsq(design, y, rcond=None)
    out.update(slope=float(slope), constant=float(np.exp(intercept)))
    if len(x) > 2:
        residual = y - design @ np.array([slope, intercept])
        out["slope_se"] = float(np.sqrt(residual @ residual / (len(x) - 2) / np.sum((x - x.mean()) ** 2)))
    return out


def rounded_counts(counts: Sequence[int], chunk_size: int) -> list[int]:
    """The sample counts rounded up to whole chunks (as ``estimate`` rounds them); refused unless they increase
    and the first holds two chunks (the standard errors' least)."""
    if not counts:
        raise ValueError("a curve needs at least one sample count: e.g. --samples 1e5,1e6")
    got = [-(-int(c) // chunk_size) * chunk_size for c in counts]
    if got[0] < 2 * chunk_size:
        raise ValueError(
            f"the first sample count, {counts[0]:,}, is one chunk of {chunk_size:,}: the statistics' standard errors "
            f"need at least two chunks; start the curve at {2 * chunk_size:,} samples or more"
        )
    for a, b, ra, rb in zip(counts, counts[1:], got, got[1:]):
        if rb <= ra:
            same = "" if b <= a else f" (both round up to {rb:,} samples, whole chunks of {chunk_size:,})"
            raise ValueError(f"sample counts must increase: {a:,} then {b:,}{same}; give increasing counts")
    return got


def _run_digest(cfg: RunConfig) -> str:
    """What a recorded point was learned from: the seed, chunks, source and statistics (not the configuration's
    own sample count, which a curve overrides)."""
    doc = {
        "seed": cfg.seed,
        "chunk_size": cfg.chunk_size,
        "source": cfg.source.model_dump(mode="json", exclude_none=True),
        "statistics": cfg.statistics.model_dump(mode="json", exclude_none=True),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


@takes_keywords(
    {
        "config": "str, Path or RunConfig\n    A YAML path or a :class:`~relulearn.config.RunConfig`.",
        "store": "str\n    The store the curve extends (local directory or fsspec URL).",
        "method": "str\n    The learning method (``relulearn.METHODS``; default ``moments``).",
        "samples": "sequence of int\n    The increasing sample counts of the curve's points.",
        "test_samples": "int\n    Fresh samples each learned model is measured on (default 200,000).",
    }
)
def curve(
    config: str | Path | RunConfig,
    store: str,
    method: str = "moments",
    *,
    samples: Sequence[int],
    test_samples: int = 200_000,
    **keywords: Any,
) -> dict[str, Any]:
    """A learning curve: extend one store through the sample counts ``samples``, learn with ``method`` at each
    and measure the model against the configuration's teacher (:func:`relulearn.evaluate` on ``test_samples``
    fresh samples: the parameter error up to the symmetries and the relative test error).

    The counts are rounded up to whole chunks and must increase. Each learned point is recorded in the store
    (``records/curve-*.json``): the same call again reuses the points already learned with the same method,
    options and test samples, and only extends the store and learns the rest (an interrupted curve resumes). A
    store holding more samples than a count still to learn is refused: a curve only extends its store.
    The method options and the cluster options are those of :func:`relulearn.fit`.

    Returns
    -------
    dict
        ``points`` (per count: ``samples``, ``parameter_error``, ``relative_test_error``, ``noise_floor``,
        ``seconds`` with ``estimate_seconds``, ``learn_seconds``, ``evaluate_seconds``; ``reused``: from the
        store's record; ``error``: why the method learned nothing at that count), ``fit`` (:func:`fit_slope` of
        the parameter errors), ``stated_slope`` (the papers' rate, -1/2), ``exact_recovery_samples``,
        ``store_samples``, ``learned`` and ``blocks_run`` by this call, and ``seconds``.
    """
    t0 = time.perf_counter()
    options, ex = split_keywords("curve", method, keywords)
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    counts = rounded_counts(samples, cfg.chunk_size)
    cfg, run_plan, _ = fit_config(
        cfg, store, method, options, counts[-1], planned_workers(ex.client, ex.workers), choose_where=not ex.forced
    )
    key = {"method": method, "options": options, "test_samples": test_samples, "run": _run_digest(cfg)}
    done, todo = _recorded(store, key, counts)
    progress = ex.progress
    if progress is not None and todo:
        print(run_plan.summary(), file=progress)
    learned: dict[int, dict] = {}
    blocks = 0

    def run(where: Where, lease: Any) -> None:
        nonlocal blocks
        with tempfile.TemporaryDirectory(prefix="relulearn-curve-") as tmp:
            for n in todo:
                if progress is not None:
                    print(f"curve: {n:,} samples ({counts.index(n) + 1} of {len(counts)})", file=progress)
                summary = _estimate(cfg, store, samples=n, client=where.client, progress=progress, lease=lease)
                blocks += summary.blocks_run
                point = _learn_point(where, store, method, options, cfg, n, test_samples, tmp, progress, ex.break_lock)
                point["estimate_seconds"] = summary.seconds
                point["seconds"] = summary.seconds + point["learn_seconds"] + point["evaluate_seconds"]
                RunStore(store).add_record(RECORD, {"key": key, **point})
                learned[n] = point

    if todo:
        in_process = run_plan.runs_in == "in process"
        with working(ex, in_process=in_process, dashboard=cfg.run.dashboard, store=store) as (where, lease):
            run(where, lease)
    points = [
        dict(learned[n], reused=False) if n in learned else dict(_stored_point(done[n]), reused=True) for n in counts
    ]
    return _curve_result(config, store, options, counts, points, test_samples, method) | {
        "learned": len(learned),
        "blocks_run": blocks,
        "seconds": time.perf_counter() - t0,
    }


def _recorded(store: str, key: dict[str, Any], counts: list[int]) -> tuple[dict[int, dict], list[int]]:
    """The points of ``counts`` the store's records hold for ``key``, and the counts still to learn; refused when
    the store holds more samples than a count still to learn (a curve only extends its store)."""
    held = stored_samples(store)  # 0: no run there yet, so no records
    done = {r["samples"]: r for r in RunStore(store).records(RECORD) if r.get("key") == key} if held else {}
    todo = [n for n in counts if n not in done]
    if todo and held > todo[0]:
        raise ValueError(
            f"the store {store} holds {held:,} samples, more than {todo[0]:,} (a count of the curve not yet learned "
            f"on it): a curve only extends its store; give counts from {held:,} on, or a new --store"
        )
    return done, todo


def _curve_result(
    config: str | Path | RunConfig,
    store: str,
    options: dict[str, Any],
    counts: list[int],
    points: list[dict],
    test_samples: int,
    method: str,
) -> dict[str, Any]:
    """What a curve returns of its points: the slope fitted to their parameter errors beside the stated one."""
    fitted = fit_slope(counts, [p["parameter_error"] for p in points])
    return {
        "method": method,
        "config": None if isinstance(config, RunConfig) else str(config),
        "store": store,
        "options": options,
        "test_samples": test_samples,
        "samples": counts,
        "points": points,
        "fit": fitted,
        "stated_slope": STATED_SLOPE,
        "exact_recovery_samples": fitted["exact_recovery_samples"],
        "store_samples": stored_samples(store),
    }


#: the fields of a point, as recorded and returned
_FIELDS = (
    "samples",
    "parameter_error",
    "relative_test_error",
    "noise_floor",
    "seconds",
    "estimate_seconds",
    "learn_seconds",
    "evaluate_seconds",
    "passes",
    "chosen",
    "error",
)


def _stored_point(record: dict) -> dict:
    return {k: record.get(k) for k in _FIELDS}


def _learn_point(
    where: Where,
    store: str,
    method: str,
    options: dict[str, Any],
    cfg: RunConfig,
    n: int,
    test_samples: int,
    tmp: str,
    progress: TextIO | None,
    break_lock: bool,
) -> dict[str, Any]:
    """Learn at the store's ``n`` samples and measure the model against the teacher (or say why nothing was
    learned: too few samples for the method)."""
    t0 = time.perf_counter()
    model = str(Path(tmp) / f"model-{n}.npz")
    point: dict[str, Any] = dict.fromkeys(_FIELDS)
    point["samples"] = n
    try:
        done = learn_with(where, store, method, options, model, progress, break_lock)
    except _TOO_FEW as err:
        point.update(learn_seconds=time.perf_counter() - t0, evaluate_seconds=0.0, error=str(err))
        return point
    t1 = time.perf_counter()
    got = evaluate(model, cfg, samples=test_samples)
    point.update(
        parameter_error=got.get("parameter_error"),
        relative_test_error=got["relative_test_error"],
        noise_floor=got["noise_floor"],
        learn_seconds=t1 - t0,
        evaluate_seconds=time.perf_counter() - t1,
        passes=[p["name"] for p in done["passes"]],
        chosen=done["report"].get("chosen"),
    )
    return point
