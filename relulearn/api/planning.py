"""Where planning meets measurement: a run's plan from this machine's measured rates and its source's cost.

The planner (:func:`relulearn.runplan.plan_run`) is pure: it takes the rates and the source's cost as inputs.
They are measured here, at the edge, by :mod:`relulearn.pipeline.calibration` (the rates once per machine and
cached; a black-box teacher or a data file timed on a probe batch).
"""

from __future__ import annotations

from typing import Any

from ..runplan import RunPlan, check_plan_sizes, plan_run


def measured_plan(cfg: Any, method: str | None = None, *, probe: bool = True, **options: Any) -> RunPlan:
    """:func:`relulearn.runplan.plan_run` of ``cfg`` and ``method`` with this machine's rates
    (:func:`~relulearn.pipeline.calibration.calibrate`) and the source's cost
    (:func:`~relulearn.pipeline.calibration.source_cost`; ``probe`` false: a black box's or data file's time is not
    counted, and it is not run); ``options`` are :func:`~relulearn.runplan.plan_run`'s other keywords.

    The configuration's sizes are checked before anything is measured (a probe builds the source).
    """
    from ..pipeline.calibration import calibrate, source_cost

    check_plan_sizes(cfg, method)
    rates = calibrate()
    return plan_run(cfg, method, rates=rates, source=source_cost(cfg, rates, probe=probe), **options)
