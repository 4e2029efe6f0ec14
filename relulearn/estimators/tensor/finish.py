"""The finishing steps of the tensor method (:mod:`.tensor.entry`): from the decomposition's units to the network —
polish with a free affine part on a bounded sample (rows added for rarely active units), orientation, polish
again, pruning, residual rounds that add the units the network misses (lifted route), and the streamed
refinement (one output, noisy labels)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ... import hermite
from ...errors import MissingDependencyError
from ...network import Network
from ..base import Arrays, LearnResult, NoSignalError, Samples
from ..polish.cg import DENSE_UNKNOWNS
from ..polish.dense import polish, polish_outputs
from ..polish.streamed import refine_unless_exact
from ..spectral import stage as spectral
from . import lifted
from .coverage import COVER_PART, cover
from .orient import orient
from .plan import sample_sizes
from .slices import Units, _count, _decompose, _lifted_slices

#: residual rounds after the first decomposition, at most
RESIDUAL_ROUNDS = 4

#: a validation relative loss below this is an exact fit (float32 teachers round at about 10⁻¹⁴ relative)
FIT_LOSS = 1e-11

#: part ids between the coverage draws of successive rounds (a draw without ``part_batches`` uses consecutive ids)
COVER_STRIDE = 10_000

#: a residual component within this angle (radians) of a unit of the network is that unit's own correction,
#: not a unit it misses
NEW_UNIT_ANGLE = 0.2

#: samples of a residual round's tensors (parts of :data:`.polish.refine.PART_ROWS` rows; their spread gives the
#: standard errors), and the first part id it draws (parts 0 and 1 are the training and validation samples)
RESIDUAL_SAMPLES, RESIDUAL_PART = 2_000_000, 2

#: the single-output polish stops when 5 steps gained under 5 % (:data:`.polish.dense.STALL_GAIN`): at the labels'
#: floor, or where the network is not the answer yet and a residual round will grow it
STALL = 5

#: after polish, a unit whose output weights are below this fraction of the largest unit's is dropped
PRUNE = 1e-6

#: in a network that fits exactly, units whose output weights (times their rows' norms) are below this fraction of
#: the largest unit's are dropped when the network fits as exactly without them (:func:`_spare_units_dropped`)
FLOOR_UNIT = 1e-3

#: a unit whose offset is this many times its slope's norm is on (or off) for all but 6·10⁻¹⁶ of Gaussian inputs
CONSTANT_BETA = 8.0

#: two units whose unit-norm hidden rows ``[u, b]`` differ by less than this in ``1 − cos`` are one unit split
SAME_ROW = 1e-10


def _network(units: Units, x: np.ndarray, y: np.ndarray) -> tuple[Network, dict]:
    """Polish the units with a free affine part, orient them, and polish again: the network, and a report."""
    m = y.shape[1]
    k, d = units.directions.shape
    # one output: the products' least squares (a dense n × k(d+1) design) while it is small, else the matrix-free
    # Gauss–Newton polish
    single = m == 1 and k * (d + 1) + d + 1 <= DENSE_UNKNOWNS
    report: dict[str, Any] = {}
    # output weights, output bias and the affine part by least squares on the units as found
    feats = np.column_stack([np.maximum(x @ units.directions.T + units.beta, 0.0), x, np.ones(len(x))])
    sol = np.linalg.lstsq(feats, y, rcond=None)[0]
    start = Network((units.directions.copy(), sol[:k].T.copy()), (units.beta.copy(), sol[-1].copy()), activation="relu")
    try:
        loose, prep = (
            polish(start, x, y[:, 0], affine=True, stall=STALL) if single else polish_outputs(start, x, y, affine=True)
        )
    except (ValueError, np.linalg.LinAlgError) as err:
        report["affine_polish"] = {"error": str(err)}
        return start, report
    report["affine_polish"] = {k_: v for k_, v in prep.__dict__.items() if k_ != "linear"}
    assert loose.biases is not None and prep.linear is not None  # an affine polish returns both
    u, b, a, c = loose.weights[0], loose.biases[0], loose.weights[1], loose.biases[1]
    if len(u) == 0:
        raise NoSignalError(
            "no unit keeps a nonzero output weight on the bounded sample: the statistics support "
            "only the mean at this sample count; estimate with more samples"
        )
    got = orient(a, u, prep.linear, precision=max(prep.relative_residual, 1e-15))
    report["orientation"] = got.to_dict()
    sign = np.where(got.flip, -1.0, 1.0)
    # A relu(s) = A relu(−s) + A s: the flipped units' linear parts cancel the affine term, their offsets
    # move into the output bias
    c = c + a[:, got.flip] @ b[got.flip]
    oriented = Network((sign[:, None] * u, a.copy()), (sign * b, c), activation="relu")
    if prep.relative_residual**2 <= FIT_LOSS:
        # an exact fit: when the oriented network (the flipped units' linear parts standing for the affine term)
        # fits as well, the affine part held only the labels' rounding, and a second polish would spend its steps
        # (at d = 784, k = 512: an hour) finding no descent
        fit = float(np.linalg.norm(y - oriented.forward(x)) / (np.linalg.norm(y) or 1.0))
        if fit <= 2.0 * max(prep.relative_residual, 1e-15):
            report["polish"] = {
                **report["affine_polish"],
                "relative_residual": fit,
                "skipped": "the oriented network fits as well as the polish with its affine part",
            }
            return oriented, report
    try:
        net, prep = polish(oriented, x, y[:, 0], stall=STALL) if single else polish_outputs(oriented, x, y)
        report["polish"] = prep.__dict__
    except (ValueError, np.linalg.LinAlgError) as err:
        report["polish"] = {"error": str(err)}
        net = oriented
    return net, report


def _covered(
    samples: Any, x: np.ndarray, y: np.ndarray, units: Units, report: dict, part: int
) -> tuple[np.ndarray, np.ndarray]:
    """The polish's sample with the rows :func:`.tensor.coverage.cover` adds for the units' smaller sides; what it did
    in ``report["coverage"]``, and units still short in ``report["short_units"]``."""
    x_add, y_add, cov = cover(samples, x, units.directions, units.beta, part=part)
    report["coverage"] = cov.to_dict()
    if cov.short_units:
        report["short_units"] = (
            f"{len(cov.short_units)} units have fewer than {cov.needed} samples on their rarer "
            f"side after {cov.queries:,} further queries (fewest: {cov.smallest_side}): their "
            "rows may not be determined"
        )
    if len(x_add) == 0:
        return x, y
    return np.vstack([x, x_add]), np.vstack([y, y_add.reshape(len(x_add), -1)])


def _units_of(net: Network) -> Units:
    """A network's units in the decomposition's terms: unit directions, offsets, output weights ``A = a|u|``."""
    u = net.weights[0]
    norms = np.linalg.norm(u, axis=1)
    b = np.zeros(len(u)) if net.biases is None else net.biases[0]
    return Units(u / norms[:, None], b / norms, net.weights[1] * norms[None, :])


def _pruned(net: Network, width: int | None) -> tuple[Network, list[int]]:
    """Merge units that are one unit split in two (hidden rows ``[u, b]`` parallel to :data:`SAME_ROW`: their
    output weights add up), drop units whose output weights vanish (below :data:`PRUNE` of the largest:
    spurious units a polish switched off) and, past ``width``, the weakest."""
    rows = np.column_stack([net.weights[0], np.zeros(len(net.weights[0])) if net.biases is None else net.biases[0]])
    norms = np.linalg.norm(rows, axis=1)
    unit = rows / norms[:, None]
    out = net.weights[1] * norms[None, :]  # output weights of the unit-norm rows
    for i in range(len(rows)):
        for j in range(i):
            if np.linalg.norm(out[:, j]) > 0 and unit[i] @ unit[j] > 1.0 - SAME_ROW:
                out[:, j] += out[:, i]
                out[:, i] = 0.0
                break
    net = Network(
        (unit[:, :-1], out),
        (unit[:, -1], np.zeros(net.output_dim) if net.biases is None else net.biases[1]),
        activation="relu",
    )
    strength = np.linalg.norm(out, axis=0)
    keep = np.flatnonzero(strength > PRUNE * strength.max())
    if width is not None and len(keep) > width:
        keep = keep[np.argsort(-strength[keep])[:width]]
    keep = np.sort(keep)
    dropped = sorted(set(range(len(strength))) - set(keep.tolist()))
    if not dropped:
        return net, []
    biases = None if net.biases is None else (net.biases[0][keep], net.biases[1])
    return Network((net.weights[0][keep], net.weights[1][:, keep]), biases, activation="relu"), dropped


def _antipodes_merged(net: Network) -> Network | None:
    """``net`` with each pair of units whose hidden rows ``[u, b]`` are antiparallel merged into one, or None when
    it has no such pair. ``A' relu(−s) = A' relu(s) − A' s``: the pair is one unit of output weights ``A + A'``
    beside a linear term, which is left out here (the affine polish fits it and the orientation removes it). A
    residual round that meets a misoriented unit can fit it exactly this way, with a partner that carries the
    linear term: the function is right, the network wider than the teacher's."""
    rows = np.column_stack([net.weights[0], np.zeros(len(net.weights[0])) if net.biases is None else net.biases[0]])
    norms = np.linalg.norm(rows, axis=1)
    unit = rows / norms[:, None]
    out = net.weights[1] * norms[None, :]  # output weights of the unit-norm rows
    keep = np.ones(len(rows), dtype=bool)
    for i, j in zip(*np.nonzero(np.triu(unit @ unit.T < -1.0 + SAME_ROW, 1))):
        if keep[i] and keep[j]:
            out[:, i] += out[:, j]
            keep[j] = False
    if keep.all():
        return None
    return Network(
        (unit[keep, :-1], out[:, keep]),
        (unit[keep, -1], np.zeros(net.output_dim) if net.biases is None else net.biases[1]),
        activation="relu",
    )


def _spare_units_dropped(net: Network, loss: Callable[[Network], float]) -> tuple[Network, list[int]]:
    """An exact network without the units it does not need, when it fits the validation samples as exactly
    without them (``loss`` below :data:`FIT_LOSS`): units of output weights below :data:`FLOOR_UNIT` of the
    largest (they fit the labels' rounding, a float32 teacher's, which a residual round's grown network can
    absorb into units it does not need), units whose offset puts them off on every input (``β < −``
    :data:`CONSTANT_BETA`), and units on for every input whose slope is that weak — those are a constant, which
    goes into the output bias (a polish with a free output bias can leave part of it in such a unit). The units
    dropped (indices)."""
    u, a = net.weights
    b = np.zeros(len(u)) if net.biases is None else net.biases[0]
    c = np.zeros(net.output_dim) if net.biases is None else net.biases[1]
    slope = np.linalg.norm(u, axis=1)
    beta = b / np.where(slope > 0, slope, 1e-300)
    on, off = beta > CONSTANT_BETA, beta < -CONSTANT_BETA
    # what a unit adds that no output bias can: its whole row, or the slope of one that is always on
    strength = np.linalg.norm(a, axis=0) * np.where(on, slope, np.hypot(slope, b))
    drop = off | (strength < FLOOR_UNIT * strength[~(on | off)].max(initial=0.0))
    if not drop.any():
        return net, []
    keep = ~drop
    c = c + a[:, drop & on] @ b[drop & on]
    slim = Network((u[keep], a[:, keep]), (b[keep], c), activation=net.activation)
    if loss(slim) >= FIT_LOSS:
        return net, []
    return slim, np.flatnonzero(drop).tolist()


def _missing_units(
    net: Network, samples: Any, mapper: Callable, d: int, m: int, seed: int, report: dict
) -> Units | None:
    """Units the network misses: the lifted decomposition, at its own noise-floor rank, of the tensors of the
    labels it leaves (fresh samples; small labels, so far less noise than the stored tensors), less the
    components that are corrections of its own units. None when nothing is found."""
    from ..polish.refine import parts

    arrays = lifted.residual_tensors(
        samples, net, lifted.max_order(d), parts(RESIDUAL_SAMPLES, first=RESIDUAL_PART), mapper
    )
    order2 = [(hermite.unpack(a["T2"], d, 2), hermite.unpack(a["T2_se"], d, 2)) for a in arrays]
    sl = _lifted_slices(order2, arrays, d, seed)
    sub = spectral.relevant_subspace(list(sl.matrices), list(sl.ses))
    report["rank"] = int(sub.rank)
    if sub.rank == 0:
        return None
    found, dec = _decompose(sl.matrices, sl, sub.basis, seed, d, m)
    report["decomposition"] = dec
    own = _units_of(net)
    # a unit the network misses is a rank-one factor away from all of its units; a component near one of them
    # (or not rank one: a mixture of the small turns of several) is their correction
    cos = np.abs(found.directions @ own.directions.T)
    new = np.flatnonzero((cos.max(axis=1) <= np.cos(NEW_UNIT_ANGLE)) & (np.asarray(dec["rank_one_quality"]) >= 0.98))
    new = new[np.argsort(-np.linalg.norm(found.amp[:, new], axis=0))][: max(1, len(own.beta) // 8)]
    report["new"] = int(len(new))
    if len(new) == 0:
        return None
    return Units(found.directions[new], found.beta[new], found.amp[:, new])


def _finish(
    units: Units,
    overcomplete: bool,
    report: dict,
    stats: Mapping[str, Arrays],
    samples: Callable[[int, int], Samples],
    *,
    width: int | None,
    refine_samples: int | None,
    mapper: Callable,
    seed: int,
) -> LearnResult:
    """From the decomposition's units to the network: polish on a bounded sample (rows added for rarely active
    units), prune, residual rounds (the overcomplete route, and the complete one on noiseless labels where the
    lifted tensors are affordable), the streamed refinement (one output, noisy labels)."""
    k, d = units.directions.shape
    m = units.amp.shape[0]
    n_train, n_val = sample_sizes(d, k, m)
    smp = samples(n_train, n_val)
    y, y_val = smp.y_train.reshape(len(smp.y_train), -1), smp.y_val.reshape(len(smp.y_val), -1)
    y2 = float(np.mean(y_val**2)) or 1.0

    def loss(net: Network) -> float:
        return float(np.mean((y_val - net.forward(smp.x_val)) ** 2) / y2)

    x_train, y = _covered(samples, smp.x_train, y, units, report, part=COVER_PART)
    net, report["network"] = _network(units, x_train, y)
    net, report["dropped"] = _pruned(net, width)
    if report["dropped"]:
        net, report["network_pruned"] = _network(_units_of(net), x_train, y)
    losses = {"decomposition": loss(net)}
    rounds: list[dict] = []
    # the overcomplete route always looks for the units its network misses; the complete route too where the
    # labels are a teacher's exact answers and the residual tensors are affordable (two nearly parallel units
    # can share one direction of the first pass: what the network leaves holds the other)
    if overcomplete or (lifted.lifted_route(d) and getattr(samples, "noiseless", False)):
        net = _residual_rounds(net, x_train, y, loss, losses, rounds, samples, mapper, d=d, m=m, width=width, seed=seed)
    report["residual_rounds"] = rounds
    report["validation_relative_loss"] = losses
    report["chosen"] = min(losses, key=losses.__getitem__)
    source = report if report["chosen"] == "decomposition" else rounds[int(report["chosen"][len("residual-") :]) - 1]
    chosen = source.get("network_pruned") or source["network"]
    report["polish"] = chosen.get("polish", {})
    report["summary"] = {
        "route": report["route"],
        "orientation": chosen.get("orientation", {}).get("method"),
        "residual rounds": len(rounds),
    }
    if "control_rounds" in report:
        report["summary"]["control rounds"] = len(report["control_rounds"])
    if min(losses.values()) < FIT_LOSS:
        net = _narrowed(net, x_train, y, loss, width, report)
        report["refinement"] = {"skipped": "polish fits the validation samples to the teacher's rounding"}
    elif m == 1:
        total = _count(stats) if refine_samples is None else int(refine_samples)
        net = refine_unless_exact(net, samples, total, smp, mapper, report)
    else:
        report["refinement"] = {
            "skipped": "the streamed refinement fits one output; polish fitted all outputs on the bounded sample"
        }
    _widths(report, net, width, source, losses)
    return LearnResult(net, report)


def _narrowed(
    net: Network, x: np.ndarray, y: np.ndarray, loss: Callable[[Network], float], width: int | None, report: dict
) -> Network:
    """An exact network with no more units than it needs: antiparallel pairs merged and the network oriented and
    polished again (:func:`_antipodes_merged`; kept if it fits as exactly), then units at the labels' floor
    and constant ones dropped (:func:`_spare_units_dropped`). What was done in ``report``."""
    merged = _antipodes_merged(net)
    if merged is not None:
        try:
            candidate, report["network_merged"] = _network(_units_of(merged), x, y)
        except (MissingDependencyError, NoSignalError) as err:  # the exact network stands as it is
            report["network_merged"] = {"error": str(err)}
        else:
            candidate, _ = _pruned(candidate, width)
            report["network_merged"]["validation_relative_loss"] = merged_loss = loss(candidate)
            if merged_loss < FIT_LOSS:
                net = candidate
                report["validation_relative_loss"]["merged"] = merged_loss
                report["chosen"] = "merged"
    net, report["dropped_spare"] = _spare_units_dropped(net, loss)
    return net


def _residual_rounds(
    net: Network,
    x_train: np.ndarray,
    y: np.ndarray,
    loss: Callable[[Network], float],
    losses: dict[str, float],
    rounds: list[dict],
    samples: Callable[[int, int], Samples],
    mapper: Callable,
    *,
    d: int,
    m: int,
    width: int | None,
    seed: int,
) -> Network:
    """The residual rounds (at most :data:`RESIDUAL_ROUNDS`): while the network does not fit
    the validation samples, the units it misses are added and the grown network polished; kept while it fits
    better. Records each round's validation loss in ``losses`` (``residual-<i>``) and its report in ``rounds``;
    returns the best network."""
    for r in range(RESIDUAL_ROUNDS):
        if min(losses.values()) < FIT_LOSS:
            break
        round_report: dict[str, Any] = {}
        rounds.append(round_report)
        missing = _missing_units(net, samples, mapper, d, m, seed + 1 + r, round_report)
        if missing is None:
            round_report["stop"] = "nothing in what the network leaves separates from its own units"
            break
        have = _units_of(net)
        grown = Units(
            np.vstack([have.directions, missing.directions]),
            np.r_[have.beta, missing.beta],
            np.hstack([have.amp, missing.amp]),
        )
        x_train, y = _covered(samples, x_train, y, grown, round_report, part=COVER_PART + COVER_STRIDE * (r + 1))
        candidate, round_report["network"] = _network(grown, x_train, y)
        candidate, round_report["dropped"] = _pruned(candidate, width)
        if round_report["dropped"]:
            candidate, round_report["network_pruned"] = _network(_units_of(candidate), x_train, y)
        name = f"residual-{r + 1}"
        losses[name] = round_report["validation_relative_loss"] = loss(candidate)
        if losses[name] < min(v for key, v in losses.items() if key != name):
            net = candidate
        else:
            break
    return net


def _widths(report: dict, net: Network, width: int | None, source: dict, losses: dict[str, float]) -> None:
    """The widths requested and found in ``report``, and what is unresolved: fewer units than requested, units
    short of samples on their rarer side (unless the network fits exactly)."""
    k = int(net.weights[0].shape[0])
    report["width_requested"], report["width_found"] = width if width is not None else k, k
    if width is not None and k < width:
        report["unresolved"] = "; ".join(
            filter(
                None,
                [
                    report.get("unresolved"),
                    (
                        f"{width} units were requested but the noise floor supports {k} at this sample count: "
                        "more samples raise the weaker units above it"
                    ),
                ],
            )
        )
    if source.get("short_units") and min(losses.values()) >= FIT_LOSS:
        report["unresolved"] = "; ".join(filter(None, [report.get("unresolved"), source["short_units"]]))
    if report.get("unresolved"):
        report["summary"]["unresolved"] = report["unresolved"]
