"""The outputs route of the tensor method (:func:`.tensor.plan.outputs_route`): the units of a network with
several outputs from the outputs' second moments alone, with control-variate rounds (:mod:`.tensor.control`) that
lower the noise floor where it hides units."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..base import Arrays, LearnResult, NoSignalError, Samples
from ..spectral import stage as spectral
from . import control
from .finish import FIT_LOSS, _finish
from .plan import WidthError, _samples_needed, _too_few
from .slices import Units, _decompose, _outputs_slices

#: control-variate rounds of the outputs route at most; each draws as many fresh samples as the store holds
CONTROL_ROUNDS = 3

#: the held-out parts of the control rounds start here, each round :data:`CONTROL_STRIDE` further (apart from
#: the polish's samples, the coverage draws and the residual rounds)
CONTROL_PART, CONTROL_STRIDE = 2_000_000, 1_000

#: how many samples' worth the rounds can gain at most: relu's terms of degree ≥ 3, which the control variate
#: leaves, hold ~3.5 % of its variance; a width needing more than this many times the stored samples is refused
#: before the rounds run
CONTROL_GAIN = 25.0

#: a decomposition whose residual exceeds its slices' noise this many times has not explained them: units under
#: the noise floor are mixed into the directions above it
MISFIT_MAX = 2.0


def _from_outputs(
    stats: Mapping[str, Arrays],
    width: int | None,
    seed: int,
    samples: Any = None,
    mapper: Callable = map,
    rounds_first: bool = False,
) -> tuple[Units, bool, dict]:
    """The outputs route: the subspace from every output's ``T_2`` at its noise floor, then the joint CP
    decomposition of the ``T_2`` slices with the outputs as third mode, and each unit's offset and orientation
    from its weights in ``T_2`` and ``T_1`` (``φ(β)`` against ``Φ(β)``).

    When the floor hides units (fewer directions than ``width``, or a decomposition that leaves more than its
    noise unexplained: units too weak to clear the floor are mixed into the directions that do) and ``samples``
    can draw, control-variate rounds (:func:`_control_rounds`) lower the floor first (always, with
    ``rounds_first``)."""
    om = dict(stats["output_moments"])
    d = np.asarray(om["T1"]).shape[1]
    if width is not None and width > d:
        raise WidthError(
            f"--width {width} is past d = {d}: from the outputs' second moments this method separates "
            f"at most d units; the contracted orders separate more at d ≤ 50 only"
        )
    n = int(np.asarray(om["count"]))
    sub = _outputs_subspace(om, width)
    if sub.rank == 0:
        raise NoSignalError(
            "the spectral stage found no direction above the noise floor: the statistics are pure noise at this "
            "sample count; estimate with more samples (`relulearn estimate ... --samples N`)"
        )
    report: dict[str, Any] = {"subspace": sub.to_dict(), "route": "outputs", "control_rounds": []}
    if (
        width is not None
        and sub.rank < width
        and (samples is None or _samples_needed(sub, width, n) > CONTROL_GAIN * n)
    ):
        raise _too_few(sub, width, n)  # beyond what the rounds can lift: refused before they run
    if rounds_first or (width is not None and sub.rank < width):
        om, sub = _control_rounds(om, sub, width, samples, mapper, report["control_rounds"])
    sl = _outputs_slices(om)
    units, report["decomposition"] = _decompose(sl.matrices, sl, sub.basis, seed, d, len(om["T1"]))
    if report["decomposition"]["misfit"] > MISFIT_MAX and not report["control_rounds"] and samples is not None:
        report["first_decomposition"] = {"rank": int(sub.rank), "misfit": report["decomposition"]["misfit"]}
        om, sub = _control_rounds(om, sub, width, samples, mapper, report["control_rounds"])
        sl = _outputs_slices(om)
        units, report["decomposition"] = _decompose(sl.matrices, sl, sub.basis, seed, d, len(om["T1"]))
    if report["control_rounds"]:
        report["subspace"] = sub.to_dict()
    if width is not None and sub.rank < width:
        raise _too_few(sub, width, n)
    if report["decomposition"]["misfit"] > MISFIT_MAX:
        report["unresolved"] = (
            f"the decomposition leaves {report['decomposition']['misfit']:.1f} times the slices' noise unexplained: "
            "units weaker than the noise floor are mixed into the directions found; estimate with more samples"
        )
    return units, False, report


def _learn_outputs(
    stats: Mapping[str, Arrays],
    samples: Callable[[int, int], Samples],
    *,
    width: int | None,
    refine_samples: int | None,
    mapper: Callable,
    seed: int,
) -> LearnResult:
    """The outputs route to the network. When the polished network does not fit the validation samples
    and no control round has run yet (the units the floor hid left no misfit: they are weak), the rounds run now;
    if they raise the rank, the network is learned again and the better on the validation samples kept."""
    options: dict[str, Any] = dict(width=width, refine_samples=refine_samples, mapper=mapper, seed=seed)
    first = _finish(*_from_outputs(stats, width, seed, samples, mapper), stats, samples, **options)
    rep = first.report
    if rep["control_rounds"] or min(rep["validation_relative_loss"].values()) < FIT_LOSS:
        return first
    units, overcomplete, again = _from_outputs(stats, width, seed, samples, mapper, rounds_first=True)
    if again["subspace"]["rank"] <= rep["subspace"]["rank"]:
        rep["control_rounds"] = again["control_rounds"]
        rep["control"] = "the control rounds raised no direction above the noise floor: the network is kept"
        return first
    second = _finish(units, overcomplete, again, stats, samples, **options)
    if min(second.report["validation_relative_loss"].values()) < min(rep["validation_relative_loss"].values()):
        second.report["before_control"] = {
            "width_found": rep["width_found"],
            "validation_relative_loss": rep["validation_relative_loss"],
        }
        return second
    rep["control_rounds"] = again["control_rounds"]
    rep["control"] = (
        f"the control rounds raised the rank to {again['subspace']['rank']} but the network learned "
        "from them fits the validation samples worse: the first is kept"
    )
    return first


def _outputs_subspace(om: Arrays, width: int | None) -> spectral.Subspace:
    sl = _outputs_slices(om)
    return spectral.relevant_subspace(
        list(sl.matrices), list(sl.ses), rank=width, names=[f"y{j}:T_2" for j in range(len(sl.matrices))]
    )


def _control_rounds(
    om: dict, sub: spectral.Subspace, width: int | None, samples: Any, mapper: Callable, rounds: list
) -> tuple[dict, spectral.Subspace]:
    """Lower the noise floor of the outputs' ``T_1``, ``T_2`` with control variates (:mod:`.tensor.control`): each
    round samples, on as many fresh samples as the store holds, only what the labels' degree-two expansion from
    the current estimate leaves. Stops when a round no longer raises the rank (or reaches ``width``), or after
    :data:`CONTROL_ROUNDS`. Appends each round's summary to ``rounds``."""
    n = int(np.asarray(om["count"]))
    for r in range(CONTROL_ROUNDS):
        model = control.quadratic(om["A"], om["T1"], om["T2"], sub.basis)
        resid = control.residual_moments(
            samples, model, control.residual_parts(n, CONTROL_PART + CONTROL_STRIDE * r), mapper
        )
        new = control.controlled(resid, model)
        noise = float(np.median(new["T2_se"]) / np.median(np.asarray(om["T2_se"])))
        new_sub = _outputs_subspace(new, width)
        rounds.append({"rank": int(new_sub.rank), "samples": int(new["count"]), "noise_ratio": noise})
        if noise >= 1.0:  # the expansion did not shrink the residual: nothing to gain
            rounds[-1]["kept"] = False
            break
        grew = new_sub.rank > sub.rank
        om, sub = new, new_sub
        if not grew or (width is not None and sub.rank >= width):
            break
    return om, sub
