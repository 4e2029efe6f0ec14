"""Method ``moments``: one-hidden-layer ReLU networks from Hermite moments
(Chen–Dou–Goel–Klivans–Meka 2023), made practical.

1. Spectral stage: the relevant subspace V from the stored ``M_2`` and contracted
   ``M_l^g``, each scaled by its standard error (:mod:`.spectral.stage`).
2. If the noise floor supports fewer directions than wanted, ask for one more pass with
   contracted directions g chosen inside V (there ``<u_i, g>`` is O(1), not O(1/√d)).
3. Enumeration over a net of the sphere of V on a bounded sample projected on V,
   multi-stage with residual recursion, best by held-out loss (:mod:`.enumeration.network`).
4. Lift to the input space and :func:`~.polish.dense.polish` (exact on noiseless labels). Networks with biases
   ``Σ λ_i relu(<u_i, x> + b_i) + c``: the enumeration runs on ``[Vᵀx, 1]`` and so searches directions and
   offsets (:mod:`.moments.biased`); polish fits ``[x, 1]`` and the output bias.
5. Unless polish is exact on the validation samples: the streamed refinement on as many samples
   as the store holds (:mod:`.polish.streamed`), so that with label noise the error keeps falling with n.

The method is a pure function of stored statistics and bounded samples; it never
touches Dask or the pipeline. ``api`` runs the passes it requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...config import SKETCH_OVERSAMPLING, check_sketch_rank
from ...network import Network
from ..base import (
    Arrays,
    BudgetError,
    LearnResult,
    MissingStatisticError,
    NoSignalError,
    PassRequest,
    Samples,
    configured_lack,
    section_get,
)
from ..enumeration import network as enumeration
from ..enumeration.search import EnumerationResult
from ..polish.dense import polish_and_select
from ..polish.streamed import projected_sample, refine_streamed, refine_unless_exact
from ..spectral import stage as spectral
from ..spectral import subspace
from ..spectral.signal import no_signal
from ..spectral.stored_matrices import matrices_from_store
from ..spectral.subspace_geometry import directions_in_subspace, principal_angles
from . import biased

__all__ = [
    "MissingStatisticError",
    "PassRequest",
    "LearnResult",
    "Samples",
    "required_statistics",
    "learn",
    "lacks",
    "check_setting",
    "MAX_PASSES",
    "DENSE_FAMILIES",
    "sketch_rank",
    "sketch_passes",
]

#: passes a run may ask for: the adaptive contracted pass, or the subspace passes of a sketch
MAX_PASSES = 6

#: the d × d matrices of the dense statistics :func:`required_statistics` asks for, by family: ``fit``
#: plans dense or sketch from them (d = 4096 needs 4.6 GB dense, more than the default 4 GiB per worker)
DENSE_FAMILIES = {"basic": 1, "contracted": 16}

#: subspace passes on a sketch: at least 3 (the first pass's basis comes from the noisy sketch, and the
#: labels' degree-2 expansion the passes subtract from the second on comes from the pass before), at most 5
SKETCH_PASSES = (3, 5)

#: an angle bound at or above this many radians says nothing (the noise reaches the gap): the passes go on
VACUOUS_ANGLE = 1.0

#: bounded training and validation inputs (``40·k·d`` rows of d floats), or polish's design matrix on them
#: (``40·k·d`` rows of ``k d`` floats: 8 GB at k = 5, d = 1000), above this many bytes are not formed: the
#: enumeration gets inputs projected on the subspace part by part, polish is skipped and the streamed
#: refinement fits the network on all samples
LARGE_INPUT_BYTES = 2 * 2**30

#: at large d, a bounded sample of ``CG_ROWS_PER_UNKNOWN`` rows per unknown (``p = k(d + 2) + 1``) whose inputs fit
#: ``CG_POLISH_BYTES`` is drawn for the matrix-free polish (:mod:`.polish.cg`: ``4·n·d·k`` flops per
#: conjugate-gradient iteration, no k·d-column design): at d = 3000, k = 4 2.3 GB and seconds, where the streamed
#: refinement would regenerate every sample of the store per pass, dozens of passes
CG_ROWS_PER_UNKNOWN = 8
CG_POLISH_BYTES = 3 * 2**30


def required_statistics(d: int, width: int | None = None, sketched: bool = False) -> dict:
    """The ``statistics`` config section the first pass needs: the dense ``basic`` and ``contracted``
    families, or, when ``api`` finds that their block partial does not fit a worker (``sketched``; the
    plan of :data:`DENSE_FAMILIES` under ``run.worker_memory``), the sketch of ``M_2`` alone: the
    subspace passes sharpen it, so no contracted direction is needed, and ``basic`` is dropped."""
    if not sketched:
        return {"basic": {}, "contracted": {"orders": [2, 4], "directions": 8, "control": True}}
    return {"basic": None, "sketch": {"rank": sketch_rank(d, width), "second": {}}}


def sketch_rank(d: int, width: int | None) -> int:
    """Columns of the sketch: 32, or more when ``width`` needs them (``k + 8``), at most d."""
    return int(min(d, max(32, (width or 0) + SKETCH_OVERSAMPLING)))


def sketch_passes(d: int, width: int | None) -> list[tuple[str, dict, bool]]:
    """The passes the sketched route adds, for planning (:mod:`relulearn.runplan`): ``(name, statistics,
    optional)`` with the shapes the subspace passes will have (basis rows of the sketch's rank, the expansion's
    ``T_2`` of rank ``width``: the values are placeholders)."""
    r, k = sketch_rank(d, width), width or 4
    stats = {
        "basic": None,
        "sketch": {"basis": [[0.0]] * r, "second": {"expansion": {"t2_vectors": [[0.0]] * k, "t2_values": [0.0] * k}}},
    }
    return [(f"subspace-{i + 1}", stats, i >= SKETCH_PASSES[0]) for i in range(SKETCH_PASSES[1])]


def sample_sizes(d: int, width: int) -> tuple[int, int]:
    """Training and validation sample sizes: polish solves for ``k·d`` unknowns."""
    return max(20_000, 40 * width * d), max(10_000, 10 * width * d)


def lacks(sections: Mapping[str, Any], outputs: int | None = None) -> MissingStatisticError | None:
    """What a configuration's statistics ``sections`` lack for this method (as :func:`_check` finds in a store),
    before anything is written."""
    sketch = sections.get("sketch")
    if "contracted" not in sections and sketch is not None and section_get(sketch, "second") is not None:
        return None
    if "contracted" not in sections:
        return configured_lack("moments", "contracted", "orders 2 and 4", "{orders: [2, 4], directions: 8}")
    if not set(section_get(sections["contracted"], "orders") or [2, 4]) & {2, 4}:
        return configured_lack("moments", "contracted", "orders 2 or 4", "{orders: [2, 4], directions: 8}")
    return None


def _check(stats: Mapping[str, Arrays]) -> None:
    if "contracted" not in stats and "Y_second" in stats.get("sketch", {}):
        return
    if "contracted" not in stats:
        raise MissingStatisticError.lacking(
            "moments", "contracted", "orders 2 and 4", "{orders: [2, 4], directions: 8}"
        )
    orders = set(np.asarray(stats["contracted"]["pair_order"]).tolist())
    if not orders & {2, 4}:
        raise MissingStatisticError(
            f"the 'moments' method needs contracted orders 2 or 4; this store has orders {sorted(orders)}; "
            "set statistics.contracted.orders: [2, 4]"
        )


def check_setting(source: Any, options: dict[str, Any], outputs: int | None) -> dict[str, Any]:
    """``biases`` from the source when not given: a black box (or data) may hold biases; a planted or file
    network says whether it does."""
    if options.get("biases") is None:
        net = getattr(source, "network", None)
        options = dict(options, biases=net is None or net.biases is not None)
    return options


def learn(
    stats: Mapping[str, Arrays],
    passes: Sequence[Mapping[str, Arrays]],
    samples: Callable[[int, int], Samples],
    *,
    width: int | None = None,
    refine_samples: int | None = None,
    biases: bool = False,
    mapper: Callable = map,
    seed: int = 0,
    budget: int = 200_000,
) -> LearnResult | PassRequest:
    """Learn ``y = Σ λ_i relu(<u_i, x>)`` (``biases``: ``Σ λ_i relu(<u_i, x> + b_i) + c``) from stored moments.

    Parameters
    ----------
    stats
        The main store's statistics, ``{name: arrays}`` (``open_store(url).arrays(name)``).
    passes
        Statistics of the extra passes run so far at this method's request.
    samples
        ``samples(n_train, n_val)`` draws bounded held-out samples from the source.
    width
        Number of hidden units wanted (default: the rank the noise floor supports).
    refine_samples
        Samples the streamed refinement regenerates in every pass (default: as many as the store
        holds; 0: no refinement).
    biases
        Learn hidden biases and an output bias (``api`` sets it unless the source is known to be bias-free).
        The streamed refinement of a biased network is preconditioned by the Gram of the bounded sample, so
        inputs too large for that sample (:data:`LARGE_INPUT_BYTES`) are refused.
    mapper
        ``map``-like callable used to evaluate candidate batches (a cluster's map in a run).

    Returns
    -------
    LearnResult or PassRequest
    """
    _check(stats)
    if "contracted" not in stats:
        got = _sketch_subspace(stats["sketch"], passes, width)
        if isinstance(got, PassRequest):
            return got
        basis, report = got
        wanted = basis.shape[1]
        total = int(np.asarray(stats["sketch"]["count"])) if refine_samples is None else int(refine_samples)
        return _finish(basis, wanted, total, samples, mapper, seed, budget, report, biases)
    mats, ses, names = matrices_from_store(stats["contracted"])
    for i, p in enumerate(passes):
        m, s, n = matrices_from_store(p["contracted"])
        mats, ses, names = mats + m, ses + s, names + [f"pass{i + 1}:{x}" for x in n]
    sub = spectral.relevant_subspace(mats, ses, rank=width, names=names)
    report = {"subspace": sub.to_dict()}
    if sub.rank == 0:
        raise no_signal(stats, "moments")
    wanted = width or sub.rank
    if not passes and (sub.rank < wanted or not getattr(sub, "supported", True)):
        g = directions_in_subspace(sub.basis, max(4, 2 * sub.rank), seed)
        return PassRequest(
            "adaptive-1",
            {"contracted": {"orders": [2, 4, 6], "directions": g.tolist(), "control": True}},
            f"the noise floor supports {sub.rank} of {wanted} directions with random g; "
            "one pass with directions inside the found subspace",
        )
    total = int(np.asarray(stats["contracted"]["count"])) if refine_samples is None else int(refine_samples)
    return _finish(sub.basis, wanted, total, samples, mapper, seed, budget, report, biases)


def _finish(
    basis: np.ndarray,
    wanted: int,
    total: int,
    samples: Any,
    mapper: Callable,
    seed: int,
    budget: int,
    report: dict,
    biases: bool = False,
) -> LearnResult:
    """Enumeration on the found subspace, polish (or, at large d, projected parts) and refinement."""
    d = basis.shape[0]
    n_train, n_val = sample_sizes(d, wanted)
    large = max((n_train + n_val) * d, n_train * wanted * d) * 8 > LARGE_INPUT_BYTES
    if large and biases:
        raise ValueError(
            f"a network with biases at d = {d}, width {wanted}: its bounded sample of {n_train + n_val:,} inputs does "
            f"not fit {LARGE_INPUT_BYTES / 2**30:.0f} GiB, and a biased network's refinement needs it (its "
            "Gauss–Newton matrix has no closed form); learn without biases (--no-biases) or with a smaller width"
        )
    if large and hasattr(samples, "part") and total > 0:
        net, merged = _learn_large(basis, samples, wanted, total, mapper, seed, budget, report)
    else:
        smp = samples(n_train, n_val)
        z, z_val = smp.x_train @ basis, smp.x_val @ basis
        if biases:  # directions and offsets: the enumeration on [z, 1], with room for an affine part
            z, z_val = biased.lift(z), biased.lift(z_val)
        enum = _enumerate(
            z,
            smp.y_train,
            z_val,
            smp.y_val,
            budget=budget,
            mapper=mapper,
            seed=seed,
            k=wanted + (biased.EXTRA_UNITS if biases else 0),
        )
        report["enumeration"] = enum.to_dict()
        a, lam = np.asarray(enum.directions), np.asarray(enum.output_weights)
        start = (
            biased.to_biased(a, lam, basis, wanted)
            if biases
            else Network((a @ basis.T, lam[None, :]), activation="relu")
        )
        best, net = polish_and_select(start, smp.x_train, smp.y_train, smp.x_val, smp.y_val, report)
        net = refine_unless_exact(net, samples, total, smp, mapper, report)
        merged = enum.merged
    # units that could not be told apart at this sample count, each with the final unit it went into
    report["merged_units"] = [
        {
            "into": int(g["into"]),
            "reason": g["reason"],  # into −1: no final unit left
            "angle_to_into": None if g.get("angle_to_into") is None else float(g["angle_to_into"]),
        }
        for g in merged
    ]
    found = int(np.count_nonzero(net.weights[1]))
    report["width_requested"], report["width_found"] = wanted, found
    if found < wanted:
        report["unresolved"] = (
            f"{wanted} units were requested but the samples support {found} distinct units: units closer than "
            "the resolution at this sample count were merged into one (more samples separate them)"
        )
    return LearnResult(net, report)


def _enumerate(
    z: np.ndarray, y: np.ndarray, z_val: np.ndarray, y_val: np.ndarray, *, k: int, budget: int, **options: Any
) -> EnumerationResult:
    """The enumeration of ``k`` units on the subspace coordinates ``z``; a budget too small for it is refused
    naming ``--budget`` and the method that needs no enumeration."""
    try:
        return enumeration.enumerate_network(z, y, z_val, y_val, k=k, budget=budget, **options)
    except BudgetError as err:
        raise BudgetError(
            f"the moments method enumerates a net of the {z.shape[1]}-dimensional subspace for each of {k} units, "
            f"which needs a budget of {err.wanted:,} candidate evaluations (at least {err.needed:,}); this run has "
            f"{budget:,}. Give --budget {err.wanted} (time grows with it, exponentially in the width), or learn "
            "the same store with --method tensor, which needs no enumeration (one hidden layer, biases, any "
            "number of outputs, width up to d)",
            err.needed,
            err.wanted,
        ) from None


def _learn_large(
    basis: np.ndarray, samples: Any, wanted: int, total: int, mapper: Callable, seed: int, budget: int, report: dict
) -> tuple[Network, list]:
    """Large d: enumeration on projected samples of the subspace's dimension, then the matrix-free polish on a
    bounded sample of 8 rows per unknown where its inputs fit :data:`CG_POLISH_BYTES` (then the streamed
    refinement only if the polish is not exact on the validation samples), else the streamed refinement from
    the lift (no bounded sample of the input dimension is formed); returns the network and the enumeration's
    merged units."""
    r = basis.shape[1]
    n_train, n_val = sample_sizes(r, wanted)
    z, y, nxt = projected_sample(samples, basis, n_train, 2, mapper)
    z_val, y_val, nxt = projected_sample(samples, basis, n_val, nxt, mapper)
    enum = _enumerate(z, y, z_val, y_val, k=wanted, budget=budget, mapper=mapper, seed=seed)
    report["enumeration"] = enum.to_dict()
    a, lam = np.asarray(enum.directions), np.asarray(enum.output_weights)
    start = Network((a @ basis.T, lam[None, :]), activation="relu")
    d = basis.shape[0]
    p = wanted * (d + 2) + 1  # the matrix-free polish's unknowns: rows, offsets, output weights and bias
    n_pol, n_val = max(20_000, CG_ROWS_PER_UNKNOWN * p), max(10_000, p)
    if (n_pol + n_val) * d * 8 <= CG_POLISH_BYTES:
        smp = samples(n_pol, n_val)
        _, net = _polish_matrix_free(start, smp, report)
        return refine_unless_exact(net, samples, total, smp, mapper, report), enum.merged
    report["polish"] = {
        "skipped": f"d = {d}: a bounded sample of {n_pol:,} inputs for the k·d unknowns does not "
        f"fit {CG_POLISH_BYTES / 2**30:.0f} GiB; the streamed refinement fits the network "
        "on all samples instead"
    }
    # first on a bounded stream (8 rows per unknown): noiseless labels are fitted to their rounding there, in a
    # fraction of the passes over every sample of the store; labels with noise go on to all of them
    bounded = min(total, max(20_000, CG_ROWS_PER_UNKNOWN * wanted * d))
    net, rep = refine_streamed(start, samples, bounded, mapper=mapper, first_part=nxt)
    if bounded < total and rep["stop"] != "loss at rounding level":
        first = {k: v for k, v in rep.items() if k != "iterations"}
        net, rep = refine_streamed(net, samples, total, mapper=mapper, first_part=nxt)
        rep["bounded_first"] = first
    rep["kept"] = True
    report["refinement"] = rep
    report["chosen"] = "refined"
    return net, enum.merged


def _polish_matrix_free(start: Network, smp: Samples, report: dict) -> tuple[str, Network]:
    """``start`` and its matrix-free Gauss–Newton polish (:func:`.polish.cg.polish_outputs_cg`: no k·d-column
    design is formed), whichever has the lower validation loss; recorded as :func:`.polish.dense.polish_and_select`
    records the dense polish. The polish fits hidden offsets and an output bias too (zero for a bias-free
    teacher, to the labels' rounding)."""
    from ..polish.cg import polish_outputs_cg

    candidates = {"enumeration": start}
    try:
        polished, prep = polish_outputs_cg(start, smp.x_train, smp.y_train)
        candidates["polish"] = polished
        report["polish"] = {k: v for k, v in prep.__dict__.items() if k != "linear"}
    except (ValueError, np.linalg.LinAlgError) as err:
        report["polish"] = {"error": str(err)}
    y2 = float(np.mean(smp.y_val**2)) or 1.0
    losses = {k: float(np.mean((smp.y_val - n.forward(smp.x_val)[:, 0]) ** 2) / y2) for k, n in candidates.items()}
    best = min(losses, key=losses.__getitem__)
    report["validation_relative_loss"], report["chosen"] = losses, best
    return best, candidates[best]


def _control(sketch: Arrays, step: subspace.RitzStep | None = None) -> dict[str, Any]:
    """The ``second`` options of a subspace pass: the labels' expansion of degree ≤ 2 as a control variate.

    ``E[y]`` and ``E[y x]`` come from the sketch pass, ``T_2`` from the top-k Ritz pairs of the last pass
    (``M_2 ≈ V Θ Vᵀ``). Any fixed expansion leaves the pass's estimate of ``M_2 B`` unbiased; a good one
    removes most of the labels' variance (for a ReLU unit, degrees 0–2 carry 0.489 of ``E[relu(z)²] = ½``),
    and the noise of ``M̂_2`` falls with ``E[(y − q)²]``: at d/n = 0.01 a top-5 angle of 0.92 rad with raw
    labels, 0.31 with degrees 0–1 removed, 0.12 with degree 2 too (docs/design.md §3, "Residual labels").
    Empty (raw labels) for a sketch store without ``t0_second``.
    """
    if "t0_second" not in sketch:
        return {}
    expansion: dict[str, Any] = {
        "t0": float(np.asarray(sketch["t0_second"])),
        "t1": np.asarray(sketch["t1_second"], dtype=np.float64).tolist(),
    }
    if step is not None:
        k = step.k
        expansion["t2_vectors"] = step.vectors[:, :k].T.tolist()
        expansion["t2_values"] = np.asarray(step.eigenvalues[:k], dtype=np.float64).tolist()
    return {"expansion": expansion}


def _sketch_subspace(
    sketch: Arrays, passes: Sequence[Mapping[str, Arrays]], width: int | None
) -> PassRequest | tuple[np.ndarray, dict]:
    """Subspace iteration on the sketched ``M_2``, one requested pass per step, each on the chunks of the
    main store (``api`` runs a pass with the run's configuration); the iteration is replayed from the
    passes so far, so the method stays a pure function of the statistics.

    Returns the next :class:`PassRequest`, or the basis (d × k) of the top-k estimate and the report.
    """
    done = [p["sketch"] for p in passes if "sketch" in p]
    if not done:
        init = subspace.sketch_basis(np.asarray(sketch["Y_second"]), np.asarray(sketch["Y_second_se"]))
        if width is not None:
            check_sketch_rank(init.basis.shape[0], init.basis.shape[1], width)
        return PassRequest(
            "subspace-1",
            subspace.pass_statistics(init.basis, "second", _control(sketch)),
            "a single sketch of M_2 is swamped by noise at large d; subspace passes on the same "
            "chunks refine it (randomised subspace iteration)",
        )
    last = done[-1]
    basis = np.asarray(last["omega"])
    step = subspace.rayleigh_ritz(
        np.asarray(last["Y_second"]),
        np.asarray(last["Y_second_se"]),
        np.asarray(last["BMB_second"]),
        basis,
        k=width,
        bmb_se=np.asarray(last["BMB_second_se"]) if "BMB_second_se" in last else None,
    )
    k = step.k
    change = float(principal_angles(step.vectors[:, :k], step.next_basis[:, :k]).max(initial=0.0))
    lo, hi = SKETCH_PASSES
    if len(done) < hi and (len(done) < lo or change > step.angle_bound or step.angle_bound >= VACUOUS_ANGLE):
        return PassRequest(
            f"subspace-{len(done) + 1}",
            subspace.pass_statistics(step.next_basis, "second", _control(sketch, step)),
            f"the next pass would move the top-{k} subspace by {change:.3g} rad; its angle bound is "
            f"{step.angle_bound:.3g} rad (the passes go on while the move exceeds the bound, the bound "
            f"reaches {VACUOUS_ANGLE} rad, or fewer than {lo} passes ran)",
        )
    vectors = step.refined_vectors[:, :k]
    report = {
        "subspace": {
            "kind": "sketch",
            "rank": k,
            "supported": step.significant >= k,
            "passes": len(done),
            "converged": bool(change <= step.angle_bound < VACUOUS_ANGLE),
            "last_change": change,
            "angle_bound": step.angle_bound,
            "step": step.to_dict(),
            "basis": vectors.tolist(),
        }
    }
    if step.significant < k:
        report["subspace"]["message"] = (
            f"the noise floor supports only {step.significant} of the {k} directions "
            "asked for; more samples raise the signal above it"
        )
    if step.significant == 0:
        raise NoSignalError(
            "the sketched M_2 has no Ritz value above the noise floor: the statistics are pure noise at this sample "
            "count; estimate with more samples (`relulearn estimate ... --samples N`)"
        )
    return vectors, report
