"""Method ``filtered-pca``: deep ReLU networks with a low-dimensional relevant subspace
(Chen–Klivans–Meka 2021, "Learning deep ReLU networks is fixed-parameter tractable").

``F(x) = W_L relu(… relu(W_0 x))`` depends on ``x`` only through ``V = rowspace(W_0)``
(``k ≪ d`` rows). The method:

1. **Filtered PCA.** The stored ``M_τ = E[1{|y| > τ}(xxᵀ − I)]`` (a grid of τ) have their
   range inside ``V`` (docs/design.md §3), also for networks whose low-order Hermite moments
   vanish. Their eigenvectors above the noise floor (from the standard errors,
   :func:`.spectral.stage.relevant_subspace`) give the first directions ``W``.
2. **Iterate.** Fit candidate networks ``F̃`` on ``z = Wᵀx`` (architectures up to the
   given depth and width, random starts in a norm ball refined by local optimization, and after
   a residual pass the last best network re-expressed on the extended subspace as one more
   start; best by held-out loss: :mod:`.filtered_pca.deepfit`; the sphere-net enumeration of
   :mod:`.enumeration.network` for one hidden layer). Ask for one pass of the residual-filtered
   matrices ``E[1{|y − F̃(Wᵀx)| > τ}(x⊥x⊥ᵀ − (I − WWᵀ))]`` of the best candidates (the
   ``residual`` statistic), add the directions that clear its noise floor, repeat; stop
   when none does, or when the held-out residual loss is below ``target``.
3. **Output** a ReLU network on the input space (first layer composed with ``Wᵀ``), then
   :func:`~.polish.dense.polish` when it has one hidden layer.

**Large d.** When the dense ``M_τ`` do not fit a worker's block partial, ``fit`` asks for their
sketch (``statistics.sketch.filtered``) instead; step 1 then runs as subspace passes on the same
chunks, all τ at once (:func:`.filtered_pca.joint_subspace.joint_ritz`), and the answer is the span of their
significant refined eigenvectors. The candidates are fitted on inputs projected part by part on
the workers when a bounded sample of d-dimensional inputs would not fit. Step 2 runs in sketch form
too: a pass sketches the residual-filtered matrices of the best candidate (``statistics.sketch.residual``,
Gaussian Ω), subspace passes on the same chunks refine their significant eigenvectors (all τ at
once), and those directions extend the subspace.

Like every method, a pure function of stored statistics and bounded samples; ``api`` runs
the passes it asks for and calls it again with their statistics. Each call re-derives the
subspace from the main store and the passes (cheap), and fits candidates only on the
newest subspace; when a pass adds nothing, the candidate stored with it is the answer. The replay of
the subspace from the passes is :mod:`.filtered_pca.filtered_subspace`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...config import SKETCH_OVERSAMPLING
from ...network import Network, gradient_subspace
from ..base import LearnResult, MissingStatisticError, PassRequest, Samples, configured_lack, section_get
from ..enumeration import network as enumeration
from ..polish.dense import polish_and_select, refinement_verdict
from ..polish.streamed import projected_sample, refine_streamed
from ..spectral.subspace_geometry import principal_angles
from . import deepfit
from .deepstream import refine_deep
from .filtered_subspace import (
    SKETCH_PASSES,
    _candidate_config,
    _sketched_state,
    _stored_candidate,
    _subspace_state,
    last_candidate,
)

__all__ = [
    "MissingStatisticError",
    "PassRequest",
    "LearnResult",
    "Samples",
    "required_statistics",
    "learn",
    "MAX_PASSES",
    "QUANTILES",
    "DENSE_FAMILIES",
    "sketch_rank",
    "lacks",
    "check_setting",
    "sketch_passes",
]

Arrays = Mapping[str, np.ndarray]

#: the deep refinement streams as many samples as the store holds, at most this many per pass
REFINE_SAMPLES = 10_000_000
#: the τ grid of the first pass and of every residual pass, as quantiles of |y| (|residual|)
QUANTILES = [0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.97]
#: residual passes asked for at most (each adds at least one direction, so also ≤ k)
RESIDUAL_PASSES = 4
#: passes a run may ask for (residual passes on dense statistics; on a sketch, the subspace passes of
#: the M_τ, then per residual round one sketch of the residual family and its subspace passes)
MAX_PASSES = SKETCH_PASSES[1] + RESIDUAL_PASSES * (1 + SKETCH_PASSES[1])
#: candidates sent to each residual pass (the best of distinct architectures)
PASS_CANDIDATES = 2
#: the d × d matrices of the dense statistics :func:`required_statistics` asks for, by family: ``fit``
#: plans dense or sketch from them
DENSE_FAMILIES = {"basic": 1, "filtered": len(QUANTILES)}
#: bounded training and validation inputs (rows of d floats) above this many bytes are not drawn: the
#: candidates get inputs projected on the subspace part by part on the workers
LARGE_INPUT_BYTES = 2 * 2**30


def required_statistics(d: int, width: int | None = None, sketched: bool = False) -> dict:
    """The ``statistics`` config section the first pass needs: the dense ``M_τ`` (and ``basic``), or,
    when ``api`` finds that they do not fit a worker (``sketched``), their sketch."""
    if not sketched:
        return {"basic": {}, "filtered": {"quantiles": list(QUANTILES)}}
    return {"basic": None, "sketch": {"rank": sketch_rank(d, width), "filtered": {"quantiles": list(QUANTILES)}}}


def sketch_rank(d: int, width: int | None) -> int:
    """Columns of the sketch: 32, or more when ``width`` needs them (``width + 8``), at most d."""
    return int(min(d, max(32, (width or 0) + SKETCH_OVERSAMPLING)))


def sketch_passes(d: int, width: int | None) -> list[tuple[str, dict, bool]]:
    """The subspace passes the sketched route adds before any residual round, for planning
    (:mod:`relulearn.runplan`): ``(name, statistics, optional)`` with the shapes the passes will have."""
    stats = {
        "basic": None,
        "sketch": {"basis": [[0.0]] * sketch_rank(d, width), "filtered": {"thresholds": [0.0] * len(QUANTILES)}},
    }
    return [(f"subspace-{i + 1}", stats, i >= SKETCH_PASSES[0]) for i in range(SKETCH_PASSES[1])]


def sample_sizes(d: int, depth: int, width: int) -> tuple[int, int]:
    """Training and validation samples: enough for a low-dimensional fit, and for polish's
    ``width·d`` unknowns when the network has one hidden layer."""
    if depth == 1:
        return max(50_000, 40 * width * d), max(20_000, 10 * width * d)
    return 50_000, 20_000


def check_setting(source: Any, options: dict[str, Any], outputs: int | None) -> dict[str, Any]:
    """The options as given: filtered-pca learns any teacher its statistics describe (a deep one included), so
    nothing in the source is outside its setting."""
    return options


def lacks(sections: Mapping[str, Any], outputs: int | None = None) -> MissingStatisticError | None:
    """What a configuration's statistics ``sections`` lack for this method, before anything is written."""
    sketch = sections.get("sketch")
    if "filtered" in sections or (sketch is not None and section_get(sketch, "filtered") is not None):
        return None
    return configured_lack("filtered-pca", "filtered", "filtered second moments M_τ", f"{{quantiles: {QUANTILES}}}")


def _check(stats: Mapping[str, Arrays]) -> None:
    if "filtered" not in stats and "Y_filtered" not in stats.get("sketch", {}):
        raise MissingStatisticError.lacking(
            "filtered-pca", "filtered", "filtered second moments M_τ", f"{{quantiles: {QUANTILES}}}"
        )


def learn(
    stats: Mapping[str, Arrays],
    passes: Sequence[Mapping[str, Arrays]],
    samples: Callable[[int, int], Samples],
    *,
    width: int | None = None,
    depth: int | None = None,
    mapper: Callable = map,
    seed: int = 0,
    budget: int = 256,
    starts: int = 6,
    target: float = 1e-4,
    refine_samples: int | None = None,
) -> LearnResult | PassRequest:
    """Learn ``F(x) = W_L relu(… relu(W_0 x))`` by iterative filtered PCA.

    Parameters
    ----------
    stats
        The main store's statistics, ``{name: arrays}``; needs ``filtered``.
    passes
        The ``residual`` passes run so far at this method's request, in order.
    samples
        ``samples(n_train, n_val)`` draws bounded held-out samples from the source.
    width, depth
        Largest hidden width and number of hidden layers of the candidate networks
        (defaults: depth 1; width: the subspace rank for depth 1, else twice it, at least 4).
    mapper
        ``map``-like callable that evaluates candidate batches (a cluster's map in a run).
    budget
        Largest number of candidate networks the enumeration may fit; more is an error
        (:class:`.filtered_pca.deepfit.CandidateBudgetError`) raised before any fitting.
    starts
        Random starts per architecture.
    target
        Stop asking for residual passes once the best candidate's held-out relative loss
        ``E[(y − F̃)²]/E[y²]`` is below this.
    refine_samples
        Samples per pass of the streamed refinement of a deep answer and its basis
        (:func:`.filtered_pca.deepstream.refine_deep`; default: as many as the store holds, at most
        :data:`REFINE_SAMPLES`; 0: none).

    Returns
    -------
    LearnResult or PassRequest
    """
    _check(stats)
    depth = 1 if depth is None else int(depth)
    if depth < 1:
        raise ValueError(f"depth must be at least 1 (hidden layers), got {depth}")
    if width is not None and width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    sketched = "filtered" not in stats
    got = _replayed(stats, passes)
    if isinstance(got, PassRequest):
        return got
    basis, steps, exhausted, rounds = got
    d, r = basis.shape
    w = int(width) if width is not None else (r if depth == 1 else max(4, 2 * r))
    if depth > 1:  # fail before any work when the enumeration cannot fit its budget
        deepfit.check_budget(depth, w, starts, budget)
    report: dict[str, Any] = {"steps": steps, "depth": depth, "width": w}
    n_train, n_val = sample_sizes(d, depth, w)
    stored = int(np.asarray(stats["sketch" if sketched else "filtered"]["count"]))
    total = min(stored, REFINE_SAMPLES) if refine_samples is None else int(refine_samples)
    ask = None
    if sketched:
        ask = _ResidualAsk(basis, rounds, exhausted, target, int(np.asarray(stats["sketch"]["omega"]).shape[1]))
    warm = _warm_starts(passes, basis) if depth > 1 else []
    if (n_train + n_val) * d * 8 > LARGE_INPUT_BYTES and hasattr(samples, "part"):
        return _learn_large(
            basis, samples, depth, w, budget, starts, mapper, seed + 1000 * len(passes), total, report, ask, warm
        )
    smp = samples(n_train, n_val)
    refine = _Refine(samples, total, mapper)

    if exhausted and not sketched:
        # the last pass found nothing new: its best candidate, fitted on this very basis, is the answer
        net = _stored_candidate(passes[-1]["residual"])
        report["stop_reason"] = "the last residual pass found no direction above its noise floor"
        return _finish(net, basis, depth, smp, report, refine)

    z, z_val = smp.x_train @ basis, smp.x_val @ basis
    cands = _fit(
        z,
        smp.y_train,
        z_val,
        smp.y_val,
        depth=depth,
        width=w,
        budget=budget,
        starts=starts,
        mapper=mapper,
        seed=seed + 1000 * len(passes),
        warm=warm,
    )
    report["candidates"] = [c.to_dict() for c in cands[:10]]
    best = cands[0]
    report["residual_loss"] = best.val_loss
    if best.val_loss <= target:
        report["stop_reason"] = f"held-out residual loss {best.val_loss:.3g} is below the target {target:.3g}"
        return _finish(best.network, basis, depth, smp, report, refine)
    if ask is not None:
        request = ask(best, report)
        if request is not None:
            return request
        return _finish(best.network, basis, depth, smp, report, refine)
    if len(passes) >= RESIDUAL_PASSES or r >= d:
        report["stop_reason"] = f"stopped after {len(passes)} residual passes (rank {r} of d={d})"
        return _finish(best.network, basis, depth, smp, report, refine)
    return _residual_request(cands, basis, len(passes))


def _warm_starts(passes: Sequence[Mapping[str, Arrays]], basis: np.ndarray) -> list[Network]:
    """The best candidate of the last residual pass re-expressed on ``basis``, whose span holds the pass's
    basis (first layer ``W0 Bₒᵀ B``: the same function of ``x``): the candidates on the extended subspace start
    from where the last fit ended too, so that a round does not end on a worse network than the one before it
    because its random starts missed in more coordinates."""
    got = last_candidate(passes)
    if got is None:
        return []
    net, old = got
    ws = net.weights
    return [Network((ws[0] @ (old.T @ basis), *ws[1:]), activation="relu")]


def _replayed(
    stats: Mapping[str, Arrays], passes: Sequence[Mapping[str, Arrays]]
) -> PassRequest | tuple[np.ndarray, list[dict], bool, int]:
    """The subspace replayed from the passes (:mod:`.filtered_subspace`): the basis, per-step records, whether the
    last pass added nothing and the residual rounds done on a sketch; or the next pass of an unfinished
    iteration on a sketch."""
    if "filtered" not in stats:
        return _sketched_state(stats["sketch"], passes)
    basis, steps, exhausted = _subspace_state(stats, passes)
    return basis, steps, exhausted, 0


def _residual_request(cands: list[deepfit.Candidate], basis: np.ndarray, done: int) -> PassRequest:
    """The next residual pass (dense statistics; ``done`` passes so far): the residual-filtered matrices of the
    best candidate and of the best of up to :data:`PASS_CANDIDATES` − 1 other architectures."""
    r = basis.shape[1]
    best = cands[0]
    chosen, seen = [], set()
    for c in cands:  # the best candidate, then the best of other architectures
        if c.widths not in seen:
            chosen.append(c)
            seen.add(c.widths)
        if len(chosen) == PASS_CANDIDATES:
            break
    return PassRequest(
        f"residual-{done + 1}",
        {
            "residual": {
                "basis": basis.T.tolist(),
                "candidates": [{"weights": [wt.tolist() for wt in c.network.weights]} for c in chosen],
                "quantiles": list(QUANTILES),
            }
        },
        f"the best network on the {r}-dimensional subspace leaves held-out relative loss {best.val_loss:.3g}; "
        "one pass of residual-filtered matrices looks for the directions still missing",
    )


@dataclass(frozen=True)
class _ResidualAsk:
    """On a sketch: whether to ask for another residual round after fitting candidates on ``basis``
    (``rounds`` done so far; ``exhausted``: the last one added no direction)."""

    basis: np.ndarray
    rounds: int
    exhausted: bool
    target: float
    rank: int

    def __call__(self, best: deepfit.Candidate, report: dict) -> PassRequest | None:
        d, r = self.basis.shape
        if best.val_loss <= self.target:
            report["stop_reason"] = f"held-out residual loss {best.val_loss:.3g} is below the target {self.target:.3g}"
            return None
        if self.exhausted:
            report["stop_reason"] = "the last residual round found no direction above its noise floor"
            return None
        if self.rounds >= RESIDUAL_PASSES or r >= d:
            report["stop_reason"] = f"stopped after {self.rounds} residual rounds (rank {r} of d={d})"
            return None
        section = {
            "basis": self.basis.T.tolist(),
            "candidates": [_candidate_config(best.network)],
            "quantiles": list(QUANTILES),
        }
        return PassRequest(
            f"residual-{self.rounds + 1}",
            {"basic": None, "sketch": {"rank": self.rank, "residual": section}},
            f"the best network on the {r}-dimensional subspace leaves held-out relative loss {best.val_loss:.3g}; "
            "a sketch of its residual-filtered matrices looks for the directions still missing",
        )


def _learn_large(
    basis: np.ndarray,
    samples: Any,
    depth: int,
    width: int,
    budget: int,
    starts: int,
    mapper: Callable,
    seed: int,
    total: int,
    report: dict,
    ask: _ResidualAsk | None = None,
    warm: Sequence[Network] = (),
) -> LearnResult | PassRequest:
    """Large d: candidates fitted on inputs projected on the subspace part by part on the workers (no
    bounded sample of d-dimensional inputs is formed); one hidden layer: then the streamed refinement
    on all samples instead of polish."""
    d, r = basis.shape
    n_train, n_val = sample_sizes(r, depth, width)
    z, y, nxt = projected_sample(samples, basis, n_train, 2, mapper)
    z_val, y_val, nxt = projected_sample(samples, basis, n_val, nxt, mapper)
    cands = _fit(
        z, y, z_val, y_val, depth=depth, width=width, budget=budget, starts=starts, mapper=mapper, seed=seed, warm=warm
    )
    report["candidates"] = [c.to_dict() for c in cands[:10]]
    best = cands[0]
    report["residual_loss"] = best.val_loss
    if ask is not None:
        request = ask(best, report)
        if request is not None:
            return request
    else:
        report["stop_reason"] = f"d = {d}: residual passes are not run on inputs projected part by part"
    net_z = best.network
    report["validation_relative_loss"] = {"enumeration": best.val_loss}
    report["chosen"] = "enumeration"
    if net_z.depth > 1 and total > 0:  # no bounded d-dimensional validation sample: the streamed loss decides
        net_z, basis, rep = refine_deep(net_z, basis, samples, total, mapper=mapper, first_part=nxt)
        rep["kept"] = True
        report["refinement"] = rep
        report["chosen"] = "refined"
    net = deepfit.lift(net_z, basis)
    if net.depth == 1 and total > 0:
        report["polish"] = {
            "skipped": f"d = {d}: a bounded sample of k·d unknowns does not fit; the streamed "
            "refinement fits the network on all samples instead"
        }
        net, rep = refine_streamed(net, samples, total, mapper=mapper, first_part=nxt)
        report["refinement"] = rep
        report["chosen"] = "refined"
    _, eig = gradient_subspace(net_z, z_val[:20_000], r)  # z = Bᵀx is N(0, I_r) for any orthonormal B
    report["subspace"] = {
        "rank": int(r),
        "basis": basis.tolist(),
        "gradient_spectrum": (eig / max(eig[0], 1e-300)).tolist(),
    }
    report["architecture"] = [int(w.shape[0]) for w in net.weights[:-1]]
    return LearnResult(net, report)


def _fit(
    z: np.ndarray,
    y: np.ndarray,
    z_val: np.ndarray,
    y_val: np.ndarray,
    *,
    depth: int,
    width: int,
    budget: int,
    starts: int,
    mapper: Callable,
    seed: int,
    warm: Sequence[Network] = (),
) -> list[deepfit.Candidate]:
    """Candidates on the subspace coordinates, best first (held-out loss); ``warm``: networks to start from
    besides the random starts (depth > 1)."""
    if depth == 1:
        # one hidden layer: the sphere-net enumeration of the moments method (exact on noiseless data)
        enum = enumeration.enumerate_network(z, y, z_val, y_val, k=width, mapper=mapper, seed=seed)
        a, lam = np.asarray(enum.directions), np.asarray(enum.output_weights)
        if a.size == 0:
            a, lam = np.zeros((1, z.shape[1])), np.zeros(1)
        net = Network((a, lam[None, :]), activation="relu")
        return [
            deepfit.Candidate(
                widths=(a.shape[0],),
                start=0,
                network=net,
                train_loss=deepfit.relative_loss(net, z, y),
                val_loss=deepfit.relative_loss(net, z_val, y_val),
                iterations=0,
            )
        ]
    return deepfit.fit_candidates(
        z, y, z_val, y_val, depth=depth, width=width, starts=starts, budget=budget, mapper=mapper, seed=seed, warm=warm
    )


@dataclass(frozen=True)
class _Refine:
    """What the streamed refinement of a deep answer needs: the draw, samples per pass, the mapper."""

    samples: Any
    total: int
    mapper: Callable

    def skipped(self) -> str | None:
        if self.total <= 0:
            return "refine_samples is 0"
        if not hasattr(self.samples, "part"):
            return "the sample draw has no independent parts to stream"
        return None


def _refined_deep(
    net_z: Network, basis: np.ndarray, refine: _Refine, smp: Samples, report: dict
) -> tuple[Network, np.ndarray, dict[str, float]]:
    """The deep refinement of ``(net_z, basis)`` on the streamed samples, kept unless the validation
    samples say it is worse (its paired loss difference more than two standard errors above zero); with
    the validation losses of the network before and after it (empty when the refinement is skipped)."""
    why = refine.skipped()
    if why is not None:
        report["refinement"] = {"skipped": why}
        return net_z, basis, {}
    net2, basis2, rep = refine_deep(net_z, basis, refine.samples, refine.total, mapper=refine.mapper)
    # each network's predictions on the validation samples, once: for the verdict and for the two losses
    f_before = deepfit.lift(net_z, basis).forward(smp.x_val)[:, 0]
    f_after = deepfit.lift(net2, basis2).forward(smp.x_val)[:, 0]
    rep["validation_relative_loss_change"], rep["kept"] = refinement_verdict(smp.y_val, f_before, f_after)
    rep["basis_angle_moved"] = float(principal_angles(basis, basis2).max(initial=0.0))
    report["refinement"] = rep
    losses = {
        "enumeration": deepfit.relative_loss_of(smp.y_val, f_before),
        "refined": deepfit.relative_loss_of(smp.y_val, f_after),
    }
    return (net2, basis2, losses) if rep["kept"] else (net_z, basis, losses)


def _finish(
    net_z: Network, basis: np.ndarray, depth: int, smp: Samples, report: dict, refine: _Refine | None = None
) -> LearnResult:
    """Lift to the input space; polish when there is one hidden layer (keep the better), else the
    streamed refinement of the network and its basis on all samples."""
    losses: dict[str, float] = {}
    if net_z.depth > 1 and refine is not None:
        net_z, basis, losses = _refined_deep(net_z, basis, refine, smp, report)
    lifted = deepfit.lift(net_z, basis)
    if lifted.depth == 1:
        _, net = polish_and_select(lifted, smp.x_train, smp.y_train, smp.x_val, smp.y_val, report)
    else:
        net = lifted
        # the enumeration's network and, when the refinement ran, the refined one: each under its own name
        report["validation_relative_loss"] = losses or {"enumeration": deepfit.relative_loss(net, smp.x_val, smp.y_val)}
        report["chosen"] = "refined" if losses and report["refinement"]["kept"] else "enumeration"
    # how strongly the fitted network uses each direction of the found subspace: residual passes
    # also add the directions by which the estimate missed V, so the rank can exceed dim V
    _, eig = gradient_subspace(net_z, smp.x_val[:20_000] @ basis, basis.shape[1])
    report["subspace"] = {
        "rank": int(basis.shape[1]),
        "basis": basis.tolist(),
        "gradient_spectrum": (eig / max(eig[0], 1e-300)).tolist(),
    }
    report["architecture"] = [int(w.shape[0]) for w in net.weights[:-1]]
    return LearnResult(net, report)
