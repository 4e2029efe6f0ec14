"""Plan a run before any work: the passes it will make, each family's form, the projected wall time and memory.

``relulearn plan`` and ``relulearn fit --dry-run`` print it; ``fit`` prints its one-line summary and follows the
choice it makes. For a method whose second-moment families have a dense and a sketched form (``moments``,
``filtered-pca``) and a configuration without a ``statistics`` section, the planner projects both routes — the
dense families in one pass, or their sketch and the subspace passes it adds (counting those it may add) — and
takes the faster of those whose block partial fits ``run.worker_memory``, the dense one on a tie. With a
``statistics`` section it projects that section's pass.
A method whose learn asks for further passes it can shape beforehand (``planned_passes``: tensor's second pass)
has them projected after its own, and its learn's costs after the passes stated in the plan's notes.
A run projected past ``run.max_hours`` is refused before any work, with the sample count that would fit.

Where the run goes (:func:`where_to_run`), when nothing forces it (no client, ``workers``, scheduler or
``DASK_SCHEDULER_ADDRESS``): in this process, unless a local cluster is projected to save more time than it costs
to start (:func:`local_cluster_seconds`): the passes that always run are projected on one worker and on the local
cluster's workers, and the cluster is started only when ``in process > on the cluster + its start`` (the passes a
learn asks for are left out: it chooses where each of them runs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from .config import ConfigError
from .estimators.base import method_entry, plans_passes, sketchable
from .pipeline.cost import Rates, SourceCost, counted_source_cost
from .pipeline.projection import PassPlan, format_bytes, format_seconds, project_pass, seconds_split
from .pipeline.stats.work import Work

__all__ = [
    "RunPlan",
    "LearnPlan",
    "PassSetting",
    "Route",
    "plan_run",
    "check_plan_sizes",
    "TooLongError",
    "local_cluster_seconds",
    "where_to_run",
]


class TooLongError(ConfigError):
    """A run projected to take longer than ``run.max_hours``: refused before any work."""


#: seconds of one numpy call's fixed cost (argument checks, dispatch, a small temporary): what a step of many
#: calls on small arrays costs beyond its flops and bytes
CALL_SECONDS = 5e-6


@dataclass(frozen=True)
class LearnPlan:
    """The learn's own steps after the passes, priced: per step its name, what it does in words, the projected
    seconds of one repetition, and its repetitions expected (an exact recovery's usual way) and at most
    (:class:`relulearn.estimators.base.LearnStep`)."""

    steps: tuple[tuple[str, str, float, int, int], ...]

    @property
    def seconds(self) -> float:
        """Projected seconds of the steps an exact recovery usually takes."""
        return float(sum(each * expected for _, _, each, expected, _ in self.steps))

    @property
    def seconds_max(self) -> float:
        """Projected seconds with every step at its bound."""
        return float(sum(each * most for _, _, each, _, most in self.steps))

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "seconds_max": self.seconds_max,
            "steps": [
                {"name": n, "words": w, "seconds_each": e, "expected": x, "most": m} for n, w, e, x, m in self.steps
            ],
        }


@dataclass(frozen=True)
class RunPlan:
    """What a run will do and cost: the object ``fit`` executes. ``passes`` in order, each with the statistics it
    accumulates (:attr:`.PassPlan.statistics`); optional ones (subspace passes past the minimum) are run only if
    the method asks for them. ``choice`` (dense or sketched families, and the projections behind it) for
    a method that has both forms and no ``statistics`` section."""

    method: str | None
    d: int
    samples: int
    workers: int
    passes: tuple[PassPlan, ...]
    rates: Rates
    choice: dict | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: where the passes run: ``"in process"`` or ``"local cluster"`` (or a cluster the caller named);
    #: ``runs_in_reason`` says why, when the planner chose
    runs_in: str = "local cluster"
    runs_in_reason: str | None = None
    #: the learn's own steps after the passes, priced (a method that states them; None: not projected)
    learn: LearnPlan | None = None

    @property
    def statistics(self) -> dict:
        """The ``statistics`` section of the run: the estimate pass's (the first)."""
        return dict(self.passes[0].statistics or {})

    @property
    def projected_seconds(self) -> float:
        """Wall time of the passes that always run and of the learn's steps as an exact recovery usually takes
        them (:attr:`learn`; a method that states none: the passes alone)."""
        learn = self.learn.seconds if self.learn is not None else 0.0
        return float(sum(p.projected_seconds for p in self.passes if not p.optional)) + learn

    @property
    def projected_seconds_max(self) -> float:
        """Wall time with every optional pass and every learn step at its bound."""
        learn = self.learn.seconds_max if self.learn is not None else 0.0
        return float(sum(p.projected_seconds for p in self.passes)) + learn

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "d": self.d,
            "samples": self.samples,
            "workers": self.workers,
            "projected_seconds": self.projected_seconds,
            "projected_seconds_max": self.projected_seconds_max,
            "where": seconds_split([p for p in self.passes if not p.optional]),
            "passes": [p.to_dict() for p in self.passes],
            "choice": self.choice,
            "statistics": self.statistics,
            "rates": self.rates.to_dict(),
            "notes": list(self.notes),
            "runs_in": self.runs_in,
            "runs_in_reason": self.runs_in_reason,
            "learn": None if self.learn is None else self.learn.to_dict(),
        }

    def summary(self) -> str:
        """One line: passes, forms, projected time and memory."""
        main = self.passes[0]
        forms = ", ".join(f.form for f in main.families) or "no statistics"
        required = [p for p in self.passes if not p.optional]
        extra = len(self.passes) - len(required)
        span = format_seconds(self.projected_seconds)
        if extra:
            span += f" (up to {format_seconds(self.projected_seconds_max)} with {extra} more passes if needed)"
        return (
            f"plan: {len(required)} pass{'es' if len(required) != 1 else ''} of {self.samples:,} samples "
            f"{self._where_words()} ({forms}); projected {span}; "
            f"{format_bytes(max(p.worker_bytes for p in self.passes))} per worker"
        )

    def _where_words(self) -> str:
        if self.runs_in == "in process":
            return "in process"
        return f"on {self.workers} worker{'s' if self.workers != 1 else ''}"

    def lines(self) -> list[str]:
        """The plan as a person reads it: a table of passes, where the time goes, and the choice made."""
        out = [
            f"d = {self.d}, {self.samples:,} samples per pass, "
            + (
                "in process"
                if self.runs_in == "in process"
                else f"{self.workers} worker{'s' if self.workers != 1 else ''}"
            )
            + (f", method {self.method}" if self.method else "")
        ]
        rows = [(p.name + (" *" if p.optional else ""), ", ".join(f.form for f in p.families), p) for p in self.passes]
        # the columns as wide as their longest entry: a pass's families are never cut
        wn = max([len("pass"), *(len(r[0]) for r in rows)]) + 2
        wf = max([len("families (form)"), *(len(r[1]) for r in rows)]) + 2
        head = f"{'pass':<{wn}}{'families (form)':<{wf}}{'Gflop/sample':>13}{'per worker':>12}{'projected':>12}"
        out += ["", head, "-" * len(head)]
        for name, fams, p in rows:
            gflop = sum(f.flops_per_sample for f in p.families) / 1e9
            out.append(
                f"{name:<{wn}}{fams:<{wf}}{gflop:>13.3g}{format_bytes(p.worker_bytes):>12}"
                f"{format_seconds(p.projected_seconds):>12}"
            )
        out += self._learn_lines()
        total = f"{format_seconds(self.projected_seconds)}"
        if self.projected_seconds_max > self.projected_seconds:
            total += f" (up to {format_seconds(self.projected_seconds_max)}; * runs only if the method asks)"
        out += ["", f"projected: {total}"]
        split = seconds_split([p for p in self.passes if not p.optional])
        whole = sum(split.values()) or 1.0
        out.append(
            "where the time goes: "
            + ", ".join(
                f"{k} {100 * v / whole:.0f}%"
                for k, v in sorted(split.items(), key=lambda kv: -kv[1])
                if v / whole >= 0.01
            )
        )
        out.append(f"driver memory: {format_bytes(max(p.driver_bytes for p in self.passes))}")
        if self.choice is not None:
            out.append(f"form: {self.choice['form']} — {self.choice['reason']}")
        if self.runs_in_reason is not None:
            out.append(f"runs {self.runs_in} — {self.runs_in_reason}")
        out += [f"note: {n}" for n in self.notes]
        if self.learn is None and self.method is not None:
            out.append("learning after the passes is not projected")
        return out

    def _learn_lines(self) -> list[str]:
        """The learn's steps as rows under the passes: repetitions expected (and at most), and their time."""
        if self.learn is None:
            return []
        rows = [
            (name, f"{expected} (≤ {most})", each * expected, each * most)
            for name, _, each, expected, most in self.learn.steps
        ]
        wn = max([len("learn step"), *(len(r[0]) for r in rows)]) + 2
        head = f"{'learn step':<{wn}}{'repetitions':>14}{'projected':>12}{'at most':>12}"
        out = ["", head, "-" * len(head)]
        for name, reps, expected, most in rows:
            shown = format_seconds(expected) if expected > 0 else "-"
            out.append(f"{name:<{wn}}{reps:>14}{shown:>12}{format_seconds(most):>12}")
        return out


#: a pilot pass (the control variate's fit, the τ quantiles) takes at most this share of the run's samples: on
#: the driver, alone, its samples cost about as much as the pass's on one worker, so on two workers it stays
#: within ~5 % of the pass's time (a share of samples, not of seconds: the statistics' bits stay independent of
#: the machine's speed)
PILOT_SHARE = 0.025

#: the smallest pilot (a quantile grid needs its tails populated)
PILOT_FLOOR = 10_000


def size_pilots(statistics: dict, samples: int, d: int) -> dict:
    """``statistics`` with each pilot pass the method left at its default sized to the run: ``PILOT_SHARE``
    of ``samples``, at least ``PILOT_FLOOR`` (and the family's own floor: 20 d for a control variate's d + 1
    coefficients), at most the family's default (its :attr:`~.pipeline.stats.family.Family.pilot_key`)."""
    from .config import StatisticsConfig
    from .pipeline.stats.registry import FAMILIES

    out = dict(statistics)
    for fam, sec in statistics.items():
        family = FAMILIES.get(fam)
        key = None if family is None else family.pilot_key
        if family is None or key is None or not isinstance(sec, dict) or key in sec:
            continue
        if not family.runs_pilot(sec):
            continue  # no pilot pass
        model = StatisticsConfig.model_fields[fam].annotation
        default = _default_of(model, key)
        if default is None:
            continue
        floor = max(PILOT_FLOOR, family.pilot_floor(d))  # a control variate's coefficients, or a 1-d grid
        out[fam] = dict(sec, **{key: int(min(default, max(floor, int(PILOT_SHARE * samples))))})
    return out


def _default_of(annotation: Any, key: str) -> int | None:
    """The default of ``key`` in a section's pydantic model (``Optional[Model]`` unwrapped)."""
    for model in (annotation, *getattr(annotation, "__args__", ())):
        field = getattr(model, "model_fields", {}).get(key)
        if field is not None:
            return int(field.default)
    return None


@dataclass(frozen=True)
class Route:
    """One way a run may go: the estimate pass's ``statistics`` section and the passes it adds after it,
    ``(name, statistics, optional)``; ``section`` is the configured pydantic section projected in place of
    ``statistics`` (its dump), when the configuration names the statistics."""

    statistics: dict
    extra: tuple[tuple[str, dict, bool], ...] = ()
    section: Any = None
    #: the passes the learn asks for after these (projected last): where each runs the learn chooses by itself
    asked: tuple[tuple[str, dict, bool], ...] = ()


@dataclass(frozen=True)
class PassSetting:
    """What every pass of a run is projected with: the configuration, this machine's ``rates``, the samples of
    each pass (whole chunks), the source's measured cost and the label vector's length (None: a scalar label)."""

    cfg: Any
    rates: Rates
    samples: int
    source: SourceCost
    outputs: int | None

    def project(self, route: Route, workers: int) -> list[PassPlan]:
        """The passes of ``route`` on ``workers`` single-threaded workers, each holding the statistics it runs."""
        first = self._one("estimate", route.statistics if route.section is None else route.section, False, workers)
        plans = [replace(first, statistics=route.statistics)]
        for name, stats, optional in route.extra + route.asked:
            plans.append(replace(self._one(name, stats, optional, workers), statistics=stats))
        return plans

    def _one(self, name: str, statistics: Any, optional: bool, workers: int) -> PassPlan:
        return project_pass(
            self.cfg,
            self.rates,
            workers=workers,
            samples=self.samples,
            statistics=statistics,
            name=name,
            optional=optional,
            source=self.source,
            outputs=self.outputs,
        )


def _candidates(
    mod: Any, cfg: Any, width: int | None, extra: dict, samples: int, teacher: int | None = None
) -> dict[str, Route]:
    """The routes of a method by form (``dense``, and ``sketch`` for a method that may sketch), pilots sized to
    the run's ``samples``; the passes the learn asks for shaped by ``width``, else by the ``teacher``'s width."""
    d = cfg.source.d
    # the passes the learn asks for after the first (tensor's second pass), shaped before any sample is drawn
    shape = width if width is not None else teacher
    asked = tuple(mod.planned_passes(d, shape, extra.get("outputs"))) if plans_passes(mod) else ()
    out = {"dense": Route(size_pilots(mod.required_statistics(d, width, **extra), samples, d), asked=asked)}
    if sketchable(mod):
        sketched = size_pilots(mod.required_statistics(d, width, **dict(extra, sketched=True)), samples, d)
        out["sketch"] = Route(sketched, tuple(mod.sketch_passes(d, width)))
    return out


def plan_run(
    cfg: Any,
    method: str | None = None,
    *,
    width: int | None = None,
    samples: int | None = None,
    workers: int | None = None,
    rates: Rates,
    extra: dict | None = None,
    source: SourceCost | None = None,
    outputs: int | None = None,
    choose_where: bool = False,
    teacher_width: int | None = None,
) -> RunPlan:
    """The plan of ``relulearn fit`` (``method`` given) or ``relulearn estimate`` (``method`` None) for ``cfg``:
    the passes ``fit`` runs, each with the statistics it accumulates, its samples and its form.

    Pure: what it is priced by comes in as ``rates`` and ``source`` (measured by
    :mod:`relulearn.pipeline.calibration`; :func:`relulearn.api.planning.measured_plan` gives both).

    Parameters
    ----------
    cfg
        The run configuration (:class:`relulearn.config.RunConfig`).
    method
        The learning method; with a configuration without ``statistics``, the method's own statistics, in the
        form projected fastest under ``run.worker_memory``.
    width
        Hidden units wanted (the sketch's rank grows with it).
    samples
        Samples of each pass (default ``cfg.samples``).
    workers
        Single-threaded workers (default: one per core, as a local cluster starts).
    rates
        This machine's rates, as measured (:func:`relulearn.pipeline.calibration.calibrate`, measured once and
        cached; :func:`relulearn.api.planning.measured_plan` gives them); tests give their own.
    extra
        Keyword arguments of the method's ``required_statistics`` beyond ``d`` and ``width`` (its
        ``fit_options`` and ``source_options`` in :data:`relulearn.methods.METHODS`, as
        :func:`relulearn.api.fit` collects them).
    source
        The source's cost per sample, as measured (:func:`relulearn.pipeline.calibration.source_cost`: a black
        box timed once); default: as counted from the configuration (:func:`.pipeline.cost.counted_source_cost`).
    outputs
        Length of the label vector (None: scalar labels, or read from an ONNX or callable teacher).
    choose_where
        Choose between this process and a local cluster of ``workers`` (nothing forces either): the plan's
        ``runs_in`` is ``"in process"`` (and its passes projected on one worker) unless the cluster is projected to
        save more than it costs to start (:func:`local_cluster_seconds`).
    teacher_width
        The teacher's hidden width where the source tells it (:func:`relulearn.estimators.base.teacher_width`: a
        planted or file network, an ONNX graph): without ``width``, it shapes the passes the learn asks for and
        the learn's costs (the statistics of the first pass stay those of ``width``, as ``fit`` runs them).

    Raises
    ------
    MemoryBudgetError
        When no form's block partial fits ``run.worker_memory`` (the bytes each form needs), or a source's array,
        a worker's or the driver's memory would exceed this machine's (:mod:`.pipeline.sizes`).
    TooLongError
        When the passes that always run are projected past ``run.max_hours``.
    """
    check_plan_sizes(cfg, method)
    configured = "statistics" in cfg.model_fields_set  # followed as given, by estimate and by fit
    setting = _setting(cfg, rates, samples, source, outputs, method is None or configured)
    workers = int(workers or os.cpu_count() or 1)
    if method is None or configured:
        route, choice = _configured_route(cfg), None
        passes = setting.project(route, workers)
    else:
        route, passes, choice = _chosen_route(
            setting, method_entry(method), width, dict(extra or {}), workers, teacher_width
        )
    where, why = "local cluster", None
    learn: LearnPlan | None = None
    ours = len(passes) - len(route.asked)  # the passes before those the learn asks for
    if choose_where:
        alone = setting.project(route, 1)
        # the learn chooses where its own passes run (a local cluster only for one that pays for its start)
        where, why = _where(passes[:ours], alone[:ours], workers)
        if where == "in process":
            passes, workers = alone, 1
    notes: tuple[str, ...] = (CONFIGURED_NOTE,) if configured and method is not None else ()
    if method is not None and not configured:
        shape = width if width is not None else teacher_width
        notes += tuple(_learn_costs(method_entry(method), cfg, shape, setting, dict(extra or {})))
        learn = _learn_plan(method_entry(method), shape, setting, dict(extra or {}), workers)
    plan = RunPlan(
        method, int(cfg.source.d), setting.samples, workers, tuple(passes), rates, choice, notes, where, why, learn
    )
    # the memory of a pass the learn asks for is checked when it asks, at the subspace it found (the plan's
    # shapes may be an upper bound: k = d without a width)
    _check_memory(replace(plan, passes=plan.passes[:ours]))
    _check_hours(cfg, plan)
    return plan


#: what a plan of ``fit`` says of a configuration that names its statistics
CONFIGURED_NOTE = (
    "the statistics as configured (or as the store holds them, when a run is resumed or "
    "extended) are followed; passes the method asks for are not projected"
)


def _setting(
    cfg: Any, rates: Rates, samples: int | None, source: SourceCost | None, outputs: int | None, configured: bool
) -> PassSetting:
    """What the passes are projected with: the samples rounded up to whole chunks, and a black box's label vector
    read from its probe (its statistics then checked again against ``run.worker_memory``)."""
    from .pipeline.projection import check_statistics_sizes

    n = int(cfg.samples if samples is None else samples)
    n = -(-n // cfg.chunk_size) * cfg.chunk_size
    src = source or counted_source_cost(cfg, rates)
    if outputs is None and cfg.source.output is None and src.answers > 1:
        # a black box's label vector: its length is known from its probe only
        outputs = src.answers
        if configured:
            check_statistics_sizes(cfg, outputs=outputs)
    return PassSetting(cfg, rates, n, src, outputs)


def _configured_route(cfg: Any) -> Route:
    """The one pass of the configuration's own statistics section."""
    statistics = cfg.statistics.model_dump(mode="json", exclude_none=True)
    if cfg.statistics.basic is None:  # off must stay off (as RunConfig.to_dict writes it)
        statistics["basic"] = None
    return Route(statistics, section=cfg.statistics)


def _chosen_route(
    setting: PassSetting, mod: Any, width: int | None, extra: dict, workers: int, teacher: int | None = None
) -> tuple[Route, list[PassPlan], dict | None]:
    """A method's route: each of its forms projected, and the fastest that fits ``run.worker_memory`` chosen."""
    routes = _candidates(mod, setting.cfg, width, extra, setting.samples, teacher)
    projected = {form: setting.project(route, workers) for form, route in routes.items()}
    form, choice = _choose(setting.cfg, mod, width, projected)
    return routes[form], projected[form], choice


def _learn_plan(mod: Any, width: int | None, setting: PassSetting, extra: dict, workers: int) -> LearnPlan | None:
    """The learn's steps as the method states them (:class:`relulearn.estimators.base.LearnStep`), priced: work on
    the driver by this machine's rates (one core) and :data:`CALL_SECONDS` per numpy call; a step that samples as
    a pass over its samples on the run's ``workers``. None for a method that states no steps."""
    if not hasattr(mod, "learn_steps"):
        return None
    d = int(setting.cfg.source.d)
    priced = []
    for step in mod.learn_steps(d, width, extra.get("outputs", setting.outputs), setting.samples):
        if step.statistics is not None:
            each = project_pass(
                setting.cfg,
                setting.rates,
                workers=workers,
                samples=step.samples,
                statistics=step.statistics,
                name=step.name,
                source=setting.source,
                outputs=setting.outputs,
            ).projected_seconds
        else:
            work = Work(step.gemm, stream=step.stream, fresh=step.fresh)
            each = setting.rates.seconds(work) + step.calls * CALL_SECONDS
        priced.append((step.name, step.words, float(each), int(step.expected), int(step.most)))
    return LearnPlan(tuple(priced))


def _learn_costs(mod: Any, cfg: Any, width: int | None, setting: PassSetting, extra: dict) -> list[str]:
    """The learn's own costs after the passes as the method states them (none for a method that does not)."""
    if not plans_passes(mod):
        return []
    return list(mod.learn_costs(int(cfg.source.d), width, extra.get("outputs"), setting.samples))


def check_plan_sizes(cfg: Any, method: str | None) -> None:
    """The checks :func:`plan_run` makes first, from the configuration alone: the source's arrays, and the
    configured statistics' block partial (a method's own statistics are checked as they are planned); run them
    before measuring the source too, whose probe builds it.

    Raises
    ------
    MemoryBudgetError
        Naming the bytes needed (:mod:`.pipeline.sizes`, :func:`.pipeline.projection.check_statistics_sizes`).
    """
    from .pipeline.projection import check_statistics_sizes
    from .pipeline.sizes import check_source_sizes

    check_source_sizes(cfg.source)  # sizes first: projecting some families costs O(d) memory
    if method is None or "statistics" in cfg.model_fields_set:
        check_statistics_sizes(cfg)


def _check_memory(plan: RunPlan) -> None:
    """Refuse a plan whose worker or driver would hold more than this machine's memory (the bytes named)."""
    from .pipeline.plan import MemoryBudgetError
    from .pipeline.sizes import machine_memory

    memory = machine_memory()
    if memory is None:
        return
    for p in plan.passes:
        for who, need in (("a worker", p.worker_bytes), ("the driver", p.driver_bytes)):
            if need > memory:
                raise MemoryBudgetError(
                    f"the {p.name} pass at source.d = {plan.d:,} would hold {need:,} bytes ({format_bytes(need)}) on "
                    f"{who}, more than this machine's memory ({format_bytes(memory)}); lower source.d, or sketch the "
                    "d × d families (statistics.sketch, with basic: null). Nothing was written"
                )


#: what a local cluster costs before its first block: the scheduler and the nannies, then each worker process
#: importing numpy, scipy, zarr, distributed and relulearn (about 1.5 s of a core each, in parallel up to the
#: cores) and the driver's import of distributed; on 2 cores a cluster of 2 workers added 1.3 s to a learn on a
#: fast machine and 3-5 s on a slower one
CLUSTER_START_SECONDS = 2.0
CLUSTER_SECONDS_PER_WORKER_ROUND = 1.5


def local_cluster_seconds(workers: int, cores: int | None = None) -> float:
    """Projected seconds to start a local cluster of ``workers`` processes on ``cores`` cores (default: this
    machine's) before its first block, beside the work itself."""
    cores = max(1, int(cores or os.cpu_count() or 1))
    rounds = -(-max(1, int(workers)) // cores)
    return CLUSTER_START_SECONDS + CLUSTER_SECONDS_PER_WORKER_ROUND * rounds


def _where(on_cluster: list[PassPlan], alone: list[PassPlan], workers: int) -> tuple[str, str]:
    """In process unless the local cluster saves more than it costs to start (the passes that always run)."""
    t_cluster = float(sum(p.projected_seconds for p in on_cluster if not p.optional))
    t_alone = float(sum(p.projected_seconds for p in alone if not p.optional))
    start = local_cluster_seconds(workers)
    if where_to_run(t_alone, t_cluster, workers):
        return "in process", (
            f"projected {format_seconds(t_alone)} in process against {format_seconds(t_cluster)} on {workers} "
            f"workers + {format_seconds(start)} to start them"
        )
    return "local cluster", (
        f"projected {format_seconds(t_cluster)} on {workers} workers + {format_seconds(start)} to start them "
        f"against {format_seconds(t_alone)} in process"
    )


def where_to_run(seconds_alone: float, seconds_on_cluster: float, workers: int) -> bool:
    """Whether work projected ``seconds_alone`` in process and ``seconds_on_cluster`` on a local cluster of
    ``workers`` runs in process (the rule of :func:`plan_run`'s ``choose_where``)."""
    return workers <= 1 or seconds_alone <= seconds_on_cluster + local_cluster_seconds(workers)


def _choose(cfg: Any, mod: Any, width: int | None, projected: dict[str, list[PassPlan]]) -> tuple[str, dict | None]:
    """The form of the families: the fastest whose block partial fits ``run.worker_memory``."""
    if len(projected) == 1:
        return "dense", None
    from .pipeline.plan import MemoryBudgetError

    budget = int(cfg.run.worker_memory)
    info = {}
    for form, plans in projected.items():
        need = max(sum(f.partial_bytes for f in p.families) for p in plans)  # what run.worker_memory bounds
        info[form] = {
            "projected_seconds": float(sum(p.projected_seconds for p in plans if not p.optional)),
            "projected_seconds_max": float(sum(p.projected_seconds for p in plans)),
            "partial_bytes": int(need),
            "fits": need <= budget,
            "passes": len(plans),
        }
    fitting = [f for f in info if info[f]["fits"]]
    if not fitting:
        raise MemoryBudgetError(
            "no form of the statistics fits run.worker_memory = "
            f"{format_bytes(budget)} per worker: "
            + "; ".join(f"{f} needs {format_bytes(v['partial_bytes'])}" for f, v in info.items())
            + "; give the workers more memory (run.worker_memory) or lower d. Nothing was written"
        )
    # a route is judged by all the passes it may make (the sketch's subspace iteration may need its optional
    # passes; the dense families are read in one): the exact dense form unless the sketch is faster even then
    form = min(fitting, key=lambda f: (info[f]["projected_seconds_max"], f != "dense"))
    other = [f for f in info if f != form]
    if not other:
        reason = "the only form"
    elif not info[other[0]]["fits"]:
        reason = (
            f"the {other[0]} form's block partial needs {format_bytes(info[other[0]]['partial_bytes'])}, "
            f"more than run.worker_memory = {format_bytes(budget)}"
        )
    else:
        reason = (
            f"projected {format_seconds(info[form]['projected_seconds_max'])} at most against "
            f"{format_seconds(info[other[0]]['projected_seconds_max'])} {other[0]}"
        )
    return form, {"form": form, "reason": reason, "forms": info, "budget_bytes": budget}


def _check_hours(cfg: Any, plan: RunPlan) -> None:
    limit = getattr(cfg.run, "max_hours", None)
    if limit is None or plan.projected_seconds <= 3600 * limit:
        return
    scale = 3600 * limit / plan.projected_seconds
    fit = int(plan.samples * scale) // cfg.chunk_size * cfg.chunk_size
    raise TooLongError(
        f"the run is projected to take {format_seconds(plan.projected_seconds)}, more than run.max_hours = "
        f"{limit:g} h:\n  "
        + "\n  ".join(plan.lines())
        + "\n"
        + (f"about {fit:,} samples per pass would fit (samples: {fit}); " if fit > 0 else "")
        + "raise run.max_hours, lower the samples, or add workers. Nothing was written"
    )
