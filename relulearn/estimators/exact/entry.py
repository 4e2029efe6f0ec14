"""Method ``exact``: two-layer rectified networks ``A = U f(V x)`` with vector outputs, exactly
(Bakshi–Jayaram–Woodruff 2019, "Learning two layer rectified neural networks in polynomial time").

Tensor path (``m ≥ k`` outputs, ``rank U = k``):

1. Subspace: the span of the ``ν_i = v_i/|v_i|`` from the per-output ``T2_j = E[A_j (x xᵀ − I)]``
   against their noise floors (:func:`.spectral.stage.relevant_subspace`).
2. Tensor step: ``T2_j = Σ_i κ2 U_ji |v_i|^c ν_i ν_iᵀ`` decomposed by simultaneous
   diagonalisation inside the subspace (:mod:`.spectral.cp`).
3. Signs from ``T1_j = E[A_j x]`` (:mod:`.exact.signs`); the moment estimate ``V0 = s_i ν̂_i``, ``U0 = α/κ2``.
4. Exact step on a bounded sample: null vectors of the labels' row span on each unit's inactive
   samples (:mod:`.exact.step`); exact on noiseless labels, checked on fresh samples.
5. With label noise: Gauss–Newton refinement streamed over the held-out samples (:mod:`.polish.refine`);
   the best of moment estimate, exact step and refinement by validation loss.

Fixed-parameter path (``m < k``, noiseless): clusters of 1-sparse labels (:mod:`.exact.fixed_parameter`).
Arbitrary inputs (no distribution, small ``k``): :func:`recover` (:mod:`.exact.orthants`).

The method is a pure function of stored statistics and bounded samples; it never asks for a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...network import Network
from ..base import (
    Arrays,
    LearnResult,
    MissingStatisticError,
    NoSignalError,
    PassRequest,
    Samples,
    configured_lack,
)
from ..polish import refine as _refine
from ..rectified import Rectified, check_activation, check_on, output_weights, relative_loss
from ..spectral import cp
from . import fixed_parameter as _fixed
from . import orthants
from . import signs as _signs
from . import step as _exact_step
from .joint_range import JointRange, joint_range

__all__ = [
    "MAX_PASSES",
    "required_statistics",
    "sample_sizes",
    "learn",
    "recover",
    "check_exact_samples",
    "check_activation",
    "Rectified",
    "MissingStatisticError",
    "LearnResult",
    "PassRequest",
    "lacks",
    "check_setting",
]

#: the method never asks for a pass: everything it needs is in ``output_moments``
MAX_PASSES = 0

#: the tensor step needs ``rank α = k``; beyond this condition number of ``α`` the outputs do not
#: separate the units (a rank-deficient ``U``), and noiseless labels go to the fixed-parameter path
ALPHA_CONDITION_LIMIT = 1e8
#: largest bounded sample (bytes of inputs) the fixed-parameter path draws in memory
FIXED_PATH_MAX_BYTES = 4 * 2**30
#: default cap on the samples the refinement streams (each of its passes costs (k·d)² per sample:
#: 10^7 samples at k·d = 800 are minutes on 2 cores, 10^9 would be hours); ``refine_samples`` lifts it
REFINE_DEFAULT_MAX = 10_000_000
#: default flop budget of one refinement pass, ``(k·d)²`` per sample for the Gauss–Newton matrix
#: (2·10¹³: minutes on 2 cores); at large ``k·d`` it caps the default sample count below 10⁷
REFINE_FLOPS_PER_PASS = 2e13

#: the fixed-parameter path draws more samples at most this many times when its default count
#: (which assumes near-orthogonal units) leaves a unit alone on too few samples
REDRAWS = 2


def required_statistics(d: int, width: int | None = None) -> dict:
    """The ``statistics`` config section the method needs (per-output first and second moments)."""
    return {"basic": {}, "output_moments": {}}


def sample_sizes(d: int, k: int) -> tuple[int, int]:
    """Training and validation sizes of the exact step: each unit's linear system has ``d`` unknowns and
    uses the top 40 % of the samples; its inactive set is the bottom 2–20 % and needs ``≥ 4k`` samples;
    ``40 (d + k)`` leaves every system overdetermined many times over."""
    return max(4_000, 40 * (d + k)), max(2_000, 10 * (d + k))


def lacks(sections: Mapping[str, Any], outputs: int | None = None) -> MissingStatisticError | None:
    """What a configuration's statistics ``sections`` lack for this method, before anything is written."""
    if "output_moments" in sections:
        return None
    return configured_lack("exact", "output_moments", "per-output E[A x] and E[A (x xᵀ − I)]", "{}")


def _check(stats: Mapping[str, Arrays]) -> Arrays:
    if "output_moments" not in stats:
        raise MissingStatisticError.lacking("exact", "output_moments", "per-output E[A x] and E[A (x xᵀ − I)]", "{}")
    om = stats["output_moments"]
    missing = [k for k in ("T1", "T1_se", "T2", "T2_se") if k not in om]
    if missing:
        raise MissingStatisticError(
            f"the store's output_moments lack {missing}; re-estimate with statistics.output_moments: {{}}"
        )
    return om


def _validation(cands: dict[str, Network], smp: Samples) -> dict[str, float]:
    return {name: relative_loss(net, smp.x_val, smp.y_val) for name, net in cands.items()}


def _basis(sub: JointRange, t2: np.ndarray, k: int, report: dict) -> np.ndarray:
    if sub.rank >= k:
        return sub.basis[:, :k]
    # fewer directions above the floor than units: the top-k eigenvectors of Σ_j T2_j², with a note
    report["subspace_note"] = (
        f"the noise floor supports {sub.rank} of {k} directions; the tensor step uses the "
        "top-k eigenvectors of Σ_j T2_j² (more samples would make it reliable)"
    )
    total = sum(t @ t.T for t in t2)
    w, v = np.linalg.eigh((total + total.T) / 2.0)
    return v[:, np.argsort(w)[::-1][:k]]


def _tensor_candidates(
    smp: Samples, dec: cp.TensorDecomposition, signs: np.ndarray, act: Rectified, report: dict
) -> dict[str, Network]:
    """The tensor path's answers before the refinement: the moment estimate and, where it solves, the exact
    step on the bounded sample (its report and its check on the validation samples go into ``report``, with
    the projection test of the signs)."""
    signed = dec.directions * signs[:, None]
    report["projection_test"] = _signs.projection_test(smp.x_train, smp.y_train, dec.weights, signed, act.power)
    cands = {"moments": _signs.moment_estimate(dec.weights, dec.directions, signs, act.power, act.name)}
    try:
        net, rep = _exact_step.exact_step(smp.x_train, smp.y_train, signed, act.power, act.name)
        cands["exact step"] = net
        report["exact_step"] = rep
        report["check"] = check_on(net, smp.x_val, smp.y_val)
    except (ValueError, np.linalg.LinAlgError) as err:
        report["exact_step"] = {"error": str(err)}
    return cands


def learn(
    stats: Mapping[str, Arrays],
    passes: Sequence[Mapping[str, Arrays]],
    samples: Callable[[int, int], Samples],
    *,
    width: int | None = None,
    activation: str | None = "relu",
    exact_samples: int | None = None,
    refine_samples: int | None = None,
    mapper: Callable = map,
    seed: int = 0,
) -> LearnResult:
    """Learn ``A = U f(V x)`` (``f = max(z, 0)^c``) exactly from per-output moments and bounded samples.

    Parameters
    ----------
    stats
        The store's statistics, ``{name: arrays}``; needs ``output_moments`` (``T1``, ``T2`` with
        ``_se``, ``count``).
    passes
        Ignored (the method asks for none).
    samples
        A :class:`~.base.SampleDraw`: ``samples(n_train, n_val)`` for the exact step and its check,
        ``samples.part(p, n)`` for the streamed refinement.
    width
        Number of hidden units (default: the rank the noise floor supports).
    activation
        ``relu``, ``relu2`` or ``relu3`` (others are refused, naming why).
    exact_samples
        Size of the bounded sample of the exact step (default :func:`sample_sizes` on the tensor path,
        :func:`.exact.fixed_parameter.samples_needed` on the fixed-parameter path, where too few draws
        again with the count its clusters suggest); too few is refused with the number needed.
    refine_samples
        Samples streamed by the refinement (default: :func:`default_refine_samples`, the store's
        sample count, at most 10⁷ and at most 2·10¹³ / (k d)²: one pass costs (k d)² per sample).
    mapper
        ``map``-like callable; the refinement maps its parts through it.
    seed
        Seeds the tensor step's random combinations and the cluster ordering.

    Returns
    -------
    LearnResult
        ``Network((V, U), activation)`` and a JSON-ready report: ``subspace``, ``path``, ``tensor``,
        ``signs``, ``projection_test``, ``exact_step``, ``check``, ``refinement``,
        ``validation_relative_loss``, ``chosen``.

    Raises
    ------
    MissingStatisticError
        Without ``output_moments``.
    ValueError
        For an unsupported activation, an empty subspace, or a fixed-parameter path that cannot run.
    """
    act = check_activation(activation)
    om = _check(stats)
    t2 = np.asarray(om["T2"], dtype=np.float64)
    t2_se = np.asarray(om["T2_se"], dtype=np.float64)
    m, d = t2.shape[0], t2.shape[1]
    # the span of the v_i: eigenvalues of Σ_j T2_j² above the noise floor of the standard errors
    sub = joint_range(list(t2), list(t2_se), rank=width)
    report: dict[str, Any] = {"activation": act.name, "subspace": sub.to_dict(include_basis=False)}
    if sub.rank == 0:
        raise NoSignalError(
            "the spectral stage found no direction above the noise floor in any T2_j: the statistics "
            "are pure noise at this sample count; estimate with more samples"
        )
    k = int(width or sub.rank)
    report["width"] = k
    if m < k:
        report["path"] = "fixed-parameter"
        report["path_reason"] = f"m = {m} outputs < k = {k} units: U has rank < k, the tensor step cannot separate"
        return _fixed_path(samples, d, k, act, exact_samples, seed, report, width_known=width is not None)

    w = _basis(sub, t2, k, report)
    dec = cp.decompose(t2, w, seed=seed)
    report["tensor"] = dec.to_dict()
    if dec.weight_condition > ALPHA_CONDITION_LIMIT:
        report["path"] = "fixed-parameter"
        report["path_reason"] = (
            f"the per-output weights α have condition number {dec.weight_condition:.3g}: "
            "U has rank < k, the tensor step cannot separate the units"
        )
        return _fixed_path(samples, d, k, act, exact_samples, seed, report, width_known=width is not None)
    report["path"] = "tensor"
    sg = _signs.signs_from_first_moments(
        np.asarray(om["T1"]), np.asarray(om["T1_se"]), dec.weights, dec.directions, act.power
    )
    report["signs"] = sg.to_dict()
    n_train, n_val = sample_sizes(d, k)
    if exact_samples is not None:
        check_exact_samples(exact_samples, d, k, m)
        n_train = int(exact_samples)
    smp = samples(n_train, n_val)
    cands = _tensor_candidates(smp, dec, sg.signs, act, report)
    losses = _validation(cands, smp)
    if report.get("check", {}).get("exact"):
        report["refinement"] = {"skipped": "the exact step is exact on the validation samples"}
    elif refine_samples == 0:
        report["refinement"] = {"skipped": "refine_samples is 0"}
    elif not hasattr(samples, "part"):
        report["refinement"] = {"skipped": "the sample draw has no independent parts to stream"}
    else:
        total = int(
            refine_samples
            if refine_samples is not None
            else default_refine_samples(int(np.asarray(om.get("count", n_train))), d, k)
        )
        start = min(losses, key=losses.__getitem__)
        refined, rrep = _refine.refine(cands[start], samples, total, mapper=mapper)
        rrep["start"] = start
        report["refinement"] = rrep
        cands["refined"] = refined
        losses = _validation(cands, smp)
    report["validation_relative_loss"] = losses
    chosen = min(losses, key=losses.__getitem__)
    report["chosen"] = chosen
    return LearnResult(cands[chosen], _summarize(report))


def default_refine_samples(count: int, d: int, k: int) -> int:
    """Samples the refinement streams by default: the store's count, at most ``REFINE_DEFAULT_MAX``
    and at most what one pass of ``REFINE_FLOPS_PER_PASS`` affords at ``(k d)²`` flops per sample."""
    return int(max(min(count, REFINE_DEFAULT_MAX, REFINE_FLOPS_PER_PASS // (k * d) ** 2), 1))


def _summarize(report: dict) -> dict:
    """Add ``summary``: the few lines a person reads first (the CLI prints them without --json)."""
    summary: dict[str, Any] = {"path": report.get("path"), "chosen": report.get("chosen")}
    check = report.get("check") or {}
    if "relative_error" in check:
        summary["check_relative_error"] = check["relative_error"]
        summary["check_samples"] = check["samples"]
        summary["exact"] = bool(check.get("exact"))
    loss = (report.get("validation_relative_loss") or {}).get(report.get("chosen"))
    if loss is not None:
        summary["validation_relative_loss"] = loss
    ref = report.get("refinement") or {}
    if "passes" in ref:
        summary["refinement_passes"] = ref["passes"]
        summary["refinement_samples"] = ref["samples"]
    report["summary"] = summary
    return report


def check_setting(source: Any, options: dict[str, Any], outputs: int | None) -> dict[str, Any]:
    """Bakshi–Jayaram–Woodruff's setting: a planted or file teacher is a two-layer network ``U f(V x)``
    without biases and with a rectified ``f``; ``activation`` defaults to the teacher's; an
    ``exact_samples`` too small for the path the outputs and the width take is refused."""
    net = getattr(source, "network", None)
    if net is not None:
        if net.depth != 1 or net.biases is not None:
            raise ValueError(
                f"--method exact learns two-layer networks A = U f(V x) without biases (Bakshi–Jayaram–Woodruff); "
                f"the teacher has {net.depth} hidden layers{' and biases' if net.biases is not None else ''}; "
                "use --method filtered-pca for deep networks"
            )
        check_activation(net.activation, what="the teacher's activation")
        if options.get("activation") is None:
            options = dict(options, activation=net.activation)
    if options.get("activation") is not None:
        check_activation(options["activation"])
    if options.get("exact_samples") is not None and options.get("width") is not None:
        check_exact_samples(options["exact_samples"], source.d, options["width"], outputs or 1)
    return options


def check_exact_samples(exact_samples: int, d: int, k: int, outputs: int) -> None:
    """Refuse an ``exact_samples`` too small for the path ``m = outputs`` and ``k`` units take,
    naming the number needed (the tensor path's exact step when ``m >= k``, else the
    fixed-parameter path, whose 1-sparse samples are a fraction ≈ 2^-k of Gaussian inputs)."""
    if outputs >= k:
        least = _exact_step.min_samples(d, k)
        if exact_samples < least:
            raise ValueError(
                f"exact_samples = {exact_samples} is too few for the exact step: at least {least} samples "
                f"are needed (d = {d}, k = {k}; default {sample_sizes(d, k)[0]})"
            )
        return
    need = _fixed.samples_needed(d, k)
    if exact_samples < need:
        raise ValueError(
            f"exact_samples = {exact_samples} is too few for the fixed-parameter path: about {need} samples are needed "
            f"(each of the k = {k} units must be the only active one on at least d + {_fixed.FIXED_MARGIN} = "
            f"{d + _fixed.FIXED_MARGIN} samples, a fraction ≈ 2^-k of Gaussian inputs: "
            f"(d + {_fixed.FIXED_MARGIN})·2^k·{_fixed.FIXED_SAFETY})"
        )


def _fixed_path(
    samples: Callable[[int, int], Samples],
    d: int,
    k: int,
    act: Rectified,
    exact_samples: int | None,
    seed: int,
    report: dict,
    *,
    width_known: bool = True,
) -> LearnResult:
    need = _fixed.samples_needed(d, k)
    if exact_samples is not None:
        check_exact_samples(exact_samples, d, k, 0)
    n = int(exact_samples or need)
    if n * d * 8 > FIXED_PATH_MAX_BYTES:
        # exponential in k (each unit is alone on ≈ 2^-k of the samples): refuse before allocating
        raise ValueError(
            f"{report.get('path_reason', 'the tensor step cannot separate the units')}; the fixed-parameter path "
            f"would need about {n:,} samples ({n * d * 8 / 2**30:,.1f} GiB of inputs at d = {d}): each of the "
            f"k = {k} units is the only active one on a fraction ≈ 2^-{k} of Gaussian inputs. Check the width "
            f"(--width; the noise floor found {report.get('subspace', {}).get('rank', '?')} directions), use more "
            "outputs than units, or more samples for the tensor step's statistics"
        )
    n_val = sample_sizes(d, k)[1]
    smp = samples(n, n_val)
    redrawn: list[str] = []
    while True:
        try:
            net, rep = _fixed.fixed_parameter(
                smp.x_train, smp.y_train, k, act.power, act.name, seed=seed, width_known=width_known
            )
            break
        except _fixed.TooFewSamplesError as err:
            if exact_samples is not None or len(redrawn) >= REDRAWS or err.needed <= n:
                raise
            # the default count assumes near-orthogonal units; draw again with the count the clusters suggest
            redrawn.append(f"{n} samples were too few; drew {err.needed}")
            n = err.needed
            smp = samples(n, n_val)
    if redrawn:
        rep["redrawn"] = redrawn
    report["fixed_parameter"] = rep
    report["check"] = check_on(net, smp.x_val, smp.y_val)
    report["validation_relative_loss"] = {"fixed-parameter": report["check"]["relative_error"]}
    report["chosen"] = "fixed-parameter"
    return LearnResult(net, _summarize(report))


def recover(x: np.ndarray, a: np.ndarray, k: int, *, activation: str = "relu") -> LearnResult:
    """``A = U f(V X)`` exactly from noiseless samples with *arbitrary* inputs (no distribution).

    Enumerates the zero patterns realisable in the row span of ``A`` (:mod:`.exact.orthants`); exponential
    in ``k``, for small ``k`` (≤ 3 comfortably) and a few hundred samples.

    Parameters
    ----------
    x
        ``(n, d)`` inputs (e.g. uniform on a cube, or a standardised data matrix).
    a
        ``(n, m)`` labels with ``rank(A) = k`` (``m ≥ k``).
    k
        Number of hidden units.
    activation
        ``relu``, ``relu2`` or ``relu3``.

    Returns
    -------
    LearnResult
        The network and a report (``enumeration``, ``check`` on the given samples).

    Raises
    ------
    ValueError
        For ``rank(A) ≠ k``, ``k`` too large for the enumeration (with its cost), too few samples,
        or an unsupported activation.
    """
    act = check_activation(activation)
    x = np.asarray(x, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64).reshape(len(x), -1)
    v, rep = orthants.enumerate_units(x, a, int(k), act.power)
    u = output_weights(x, a, v, act.power)
    net = Network((v, u), activation=act.name)
    return LearnResult(net, {"path": "arbitrary inputs", "enumeration": rep, "check": check_on(net, x, a)})
