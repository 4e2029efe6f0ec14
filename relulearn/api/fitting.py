"""Estimate then learn in one call (``fit``), and the plan of a run before any work (``plan``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import RunConfig, load_config
from ..estimators.base import method_entry, sketchable, teacher_width
from ..methods import METHODS, OPTIONS
from ..pipeline.run import estimate as _estimate
from ..storage import RunStore, StoreError
from .execution import Where, samples_to_run, working
from .keywords import checked_options, refuse_unknown, split_keywords, takes_keywords
from .learning import check_setting, learn_with, setting_source
from .runs import planned_workers


@takes_keywords(
    {
        "config": "str, Path or RunConfig\n    A YAML path or a :class:`~relulearn.config.RunConfig`.",
        "store": "str\n    The store location (local directory or fsspec URL).",
        "method": "str\n    The learning method (``relulearn.METHODS``; default ``moments``).",
        "out": "str, optional\n    Write the learned model there (``.npz``).",
        "samples": "int, optional\n    Total samples wanted (default: the configuration's ``samples``).",
        "dry_run": "bool\n    Return the plan without any work.",
    }
)
def fit(
    config: str | Path | RunConfig,
    store: str,
    method: str = "moments",
    *,
    out: str | None = None,
    samples: int | None = None,
    dry_run: bool = False,
    **keywords: Any,
) -> dict[str, Any]:
    """Estimate the statistics ``method`` needs, then learn: the one call that returns a network.

    A configuration without a ``statistics`` section gets the method's own statistics, in the form
    projected fastest under ``run.worker_memory`` (:func:`relulearn.runplan.plan_run`); the plan's
    one-line summary is printed to ``progress`` before the work, and a run projected past
    ``run.max_hours`` is refused. ``dry_run`` returns the plan (``plan``, and ``plan_lines`` to print)
    without any work. The other options are those of :func:`learn` and :func:`estimate`; the store's
    lease is taken before a cluster starts and held until the learn ends.
    """
    options, ex = split_keywords("fit", method, keywords)
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    cfg, run_plan, memory = fit_config(
        cfg, store, method, options, samples, planned_workers(ex.client, ex.workers), choose_where=not ex.forced
    )
    if dry_run:
        return {"method": method, "dry_run": True, "plan": run_plan.to_dict(), "plan_lines": run_plan.lines()}
    progress = ex.progress

    def announce() -> None:
        if progress is not None:
            # a finished store is learned from at once: its plan (a pass of samples already held) is not the work
            done = samples_to_run(store, run_plan.samples) == 0
            print(
                f"{store} already holds {run_plan.samples:,} samples: learning from them"
                if done
                else run_plan.summary(),
                file=progress,
            )

    # the plan is what runs: its first pass here (cfg holds its statistics, fit_config put them there), the
    # passes after it as the method asks for them, each with its projection
    first = run_plan.passes[0]
    projected = {p.name: (p.projected_seconds, p.workers) for p in run_plan.passes}

    def run(where: Where, lease: Any) -> dict[str, Any]:
        summary = _estimate(
            cfg,
            store,
            samples=samples,
            client=where.client,
            progress=progress,
            lease=lease,
            projected=first.projected_seconds,
        )
        result = learn_with(where, store, method, options, out, progress, ex.break_lock, projected=projected)
        result["estimate"] = summary.to_dict()
        result["plan"] = run_plan.to_dict()
        if memory is not None:
            result["statistics_plan"] = memory
        return result

    # an unguarded script refused, the plan's line, then the store's lease before a cluster starts (a refusal is
    # immediate), held until the learn ends
    at = working(
        ex, in_process=run_plan.runs_in == "in process", dashboard=cfg.run.dashboard, store=store, before=announce
    )
    with at as (where, lease):
        return run(where, lease)


def check_statistics_section(cfg: RunConfig, method: str, setting: Any) -> None:
    """Refuse a configuration whose ``statistics`` section lacks what ``method`` needs (the method's ``lacks``),
    before anything is written: the learn found it only after the whole store was estimated."""
    if "statistics" not in cfg.model_fields_set:
        return
    lack = method_entry(method).lacks(cfg.statistics.enabled(), getattr(setting, "outputs", None))
    if lack is not None:
        raise lack


def fit_config(
    cfg: RunConfig,
    store: str,
    method: str,
    options: dict[str, Any],
    samples: int | None,
    workers: int,
    *,
    choose_where: bool = False,
) -> tuple[RunConfig, Any, dict | None]:
    """The configuration a fit of ``method`` runs (its statistics: the configuration's, the store's, or the
    method's planned for ``samples`` on ``workers``), its plan, and the memory plan of the method's dense
    families (None when the configuration names its statistics); the source is checked against the method's
    setting before anything is written. ``choose_where``: the plan also chooses between this process and a local
    cluster, by the samples ``store`` still lacks."""
    from ..config import config_from_dict

    width = options.get("width")
    setting = setting_source(cfg)
    check_setting(method, setting, options)  # before anything is written
    check_statistics_section(cfg, method, setting)
    kept = _stored_statistics(store) if "statistics" not in cfg.model_fields_set else None
    if kept is not None:
        # a run to resume or extend keeps the statistics it was started with: the form chosen by projected
        # time depends on the machine, and another choice would not match the store
        cfg = config_from_dict(dict(cfg.to_dict(), statistics=kept), base_dir=cfg.base_dir)
    run_plan = _plan_fit(cfg, method, setting, width, options, samples, workers, choose_where, store=store)
    memory = None
    if "statistics" not in cfg.model_fields_set:
        mod = method_entry(method)
        if sketchable(mod):  # what the dense families need of a worker, beside the time
            from ..pipeline.plan import plan_families

            memory = plan_families(
                cfg.source.d, mod.DENSE_FAMILIES, mod.sketch_rank(cfg.source.d, width), cfg.run.worker_memory, k=width
            )
        # the statistics of the plan's first pass: what fit runs is what the plan shows
        cfg = config_from_dict(dict(cfg.to_dict(), statistics=run_plan.passes[0].statistics), base_dir=cfg.base_dir)
    return cfg, run_plan, memory


def _stored_statistics(store: str) -> dict | None:
    """The statistics section of the run already committed at ``store`` (None: no run there yet, or a store
    that cannot be read, which the run itself then reports)."""
    try:
        meta = RunStore(store).meta()
    except (StoreError, OSError, ValueError):
        return None
    if not meta or "config" not in meta:
        return None
    return dict(meta["config"].get("statistics") or {}) or None


def _plan_fit(
    cfg: RunConfig,
    method: str,
    setting: Any,
    width: int | None,
    options: dict[str, Any],
    samples: int | None,
    workers: int,
    choose_where: bool = False,
    store: str | None = None,
) -> Any:
    """The plan of a fit (:func:`relulearn.runplan.plan_run`) with the method's statistics options; with
    ``choose_where``, in process or on a local cluster by the samples ``store`` still lacks (a finished store's
    fit only learns)."""
    from .planning import measured_plan

    extra = {k: options.get(k) for k in METHODS[method].fit_options}
    extra.update({k: getattr(setting, k, None) for k in METHODS[method].source_options})
    kw: dict[str, Any] = dict(width=width, workers=workers, extra=extra, outputs=getattr(setting, "outputs", None))
    kw["teacher_width"] = teacher_width(setting)  # shapes the passes the learn asks for, when the source tells it
    target = -(-int(cfg.samples if samples is None else samples) // cfg.chunk_size) * cfg.chunk_size
    todo = target if store is None or not choose_where else samples_to_run(store, target)
    plan = measured_plan(cfg, method, samples=samples, choose_where=choose_where and todo == target, **kw)
    if not choose_where or todo == target:  # a new store: the plan of the run chose where it runs
        return plan
    if todo <= 0:
        return replace(plan, runs_in="in process", runs_in_reason=f"the store already holds its {target:,} samples")
    # a run resumed or extended: where by the samples it still lacks
    chosen = measured_plan(cfg, method, samples=todo, choose_where=True, **kw)
    return replace(plan, runs_in=chosen.runs_in, runs_in_reason=chosen.runs_in_reason)


def plan(
    config: str | Path | RunConfig,
    method: str | None = None,
    *,
    samples: int | None = None,
    width: int | None = None,
    workers: int | None = None,
    **method_options: Any,
) -> dict[str, Any]:
    """The plan of ``relulearn fit`` (``method`` given) or ``relulearn estimate`` (no method) for a configuration,
    without any work: each pass, each family's form, flops and bytes per sample, projected wall time on
    ``workers`` (default: one per core) and memory per worker and on the driver.

    Returns the plan as a dict (:meth:`relulearn.runplan.RunPlan.to_dict`: ``projected_seconds`` for the whole
    command, one per pass) with ``lines``, the plan as a person reads it.
    """
    from .planning import measured_plan

    if method is None and (method_options or width is not None):
        given = ", ".join(sorted([*method_options, *(["width"] if width is not None else [])]))
        raise TypeError(f"plan() takes method options ({given}) only with a method: plan(config, method, ...)")
    if method is not None:
        refuse_unknown("api.plan", method, method_options, list(OPTIONS))
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    n_workers = planned_workers(None, workers)
    choose = workers is None  # where fit and estimate would run (a configured scheduler aside)
    if method is None:
        got = measured_plan(cfg, None, samples=samples, workers=n_workers, choose_where=choose)
    else:
        options = checked_options(method, width=width, **method_options)
        setting = setting_source(cfg)
        check_setting(method, setting, options)
        check_statistics_section(cfg, method, setting)
        got = _plan_fit(cfg, method, setting, width, options, samples, n_workers, choose)
    return dict(got.to_dict(), lines=got.lines())
