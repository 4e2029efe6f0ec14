"""Method ``tensor``: wide one-hidden-layer ReLU networks with biases and any number of outputs, by a joint
symmetric CP decomposition of Hermite moments of several orders.

For ``y_j = Σ_i A_ji relu(<û_i, x> + β_i) + c_j`` (unit ``û_i``; a unit ``a relu(<u, x> + b)`` is
``A = a|u|``, ``β = b/|u|``) every Hermite moment of order ``l ≥ 2`` has the same rank-one factors
(docs/design.md §3): ``T_l[j] = Σ_i A_ji f_l(β_i) û_i^{⊗l}`` with ``f_l(β) = (−1)^l He_{l−2}(β) φ(β)``. So, whatever
the signs of the output weights and however many outputs there are:

* **complete widths** (``k ≤ d``): the contracted moments ``M_l^g[j] = T_l[j](g, …, g, ·, ·)`` (orders 2–6,
  directions ``g`` inside the relevant subspace; the higher orders estimated in it, k × k each) form one
  symmetric CP tensor with factors ``û_i``, decomposed in the k-dimensional subspace;
* **overcomplete widths** (``d < k ≤ d(d+1)/2``): the full tensors ``T_4``, ``T_5(g)``, ``T_6(g, g)``
  flattened to ``D × D`` matrices on ``Sym²(R^d)`` form one with factors ``û_i û_iᵀ`` (:mod:`.tensor.lifted`);
* **several outputs at large d** (:func:`.tensor.plan.outputs_route`): the ``m`` slices ``T_2[j]`` alone form one
  with the outputs as third mode, and ``T_1[j] = Σ_i A_ji Φ(β_i) û_i`` gives each unit's offset and orientation: one
  pass of ``output_moments``, no higher orders. Where the noise floor hides units (a decomposition that leaves
  more than its noise unexplained, or fewer directions than ``width``), control-variate rounds
  (:mod:`.tensor.control`) re-estimate ``T_1``, ``T_2`` on fresh samples of what the labels' degree-two expansion
  leaves: a floor several times lower from the same count.

The method:

1. The relevant subspace ``W`` from the stored ``M_2`` and ``M_4^g`` of every output, its rank set by their
   noise floor (:func:`.spectral.stage.relevant_subspace`) or by ``width``; a full rank (or ``width > d``) means
   the network may be wider than d.
2. One requested pass on residual labels ``y − P_{≤2} y`` (the degree-≤2 expansion from the first pass:
   orders ≥ 3 unchanged, their variance cut about tenfold): contracted orders 3–6 along directions inside
   ``W``, estimated in ``W`` (complete: ``projected_contracted``, k × k slices), or the full Hermite tensors
   up to order 6, 5 or 4 by d (:func:`.tensor.lifted.max_order`).
3. The slices, each divided by its noise level, decomposed by Jennrich's algorithm and alternating least
   squares from several starts (:func:`.spectral.cp.decompose`): the directions ``±û_i``.
4. Each unit's offset and output weights from its weights across the slices (its *profile*, e.g.
   ``f_3/f_2 = −β``): a least-squares fit in ``β``.
5. Polish with a free affine part (:func:`.polish.dense.polish` with ``affine``): orders ≥ 2 cannot tell ``relu(s)``
   from ``relu(−s) = relu(s) − s``, so the units are fitted as found and the affine part takes up the rest;
   then the units whose flip removes its linear term (:func:`.tensor.orient.orient`: least squares, enumeration or a
   lattice search), and polish again without it: machine precision on noiseless labels.
6. Residual rounds (overcomplete route): while the network does not fit the validation samples, the tensors of
   the labels it leaves, on fresh samples (small labels, so far less noise than the stored tensors), decomposed
   at their own noise-floor rank: components away from the network's units are units it missed, swapped in
   before polishing again.
7. With one output and noisy labels, the streamed refinement on every sample.

The pieces: what a dimension allows (:mod:`.tensor.plan`), the slices and their decomposition
(:mod:`.tensor.slices`), the profiles (:mod:`.tensor.profile`), steps 5–7 (:mod:`.tensor.finish`) and the outputs
route (:mod:`.tensor.outputs`); this module checks the setting, asks for the pass and runs the route.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import MissingDependencyError
from ..base import (
    Arrays,
    LearnResult,
    LearnStep,
    MissingStatisticError,
    NoSignalError,
    PassRequest,
    Samples,
    configured_lack,
    section_get,
    teacher_width,
)
from ..polish.streamed import MAX_PASSES as REFINE_PASSES
from ..spectral import stage as spectral
from ..spectral.signal import no_signal
from ..spectral.stored_matrices import matrices_from_store
from ..spectral.subspace_geometry import directions_in_subspace
from . import costs, lifted
from .finish import _finish
from .orient import ENUMERATE_FREE, LATTICE_EXTRA, lattice_available, needs_lattice
from .outputs import _learn_outputs
from .plan import _too_few, check_width, outputs_route, sample_sizes
from .slices import (
    Units,
    _complete_slices,
    _count,
    _decompose,
    _has_outputs,
    _lifted_slices,
    _order2,
    _per_output,
    _projected_slices,
)

__all__ = [
    "MAX_PASSES",
    "HIGHER_ORDERS",
    "check_setting",
    "required_statistics",
    "planned_passes",
    "learn_costs",
    "learn_steps",
    "learn",
    "lacks",
]


#: the pass of higher orders, and nothing more
MAX_PASSES = 1

#: orders of the complete route's pass: every f_l(β) with l ≥ 3 has zeros, neighbouring orders do not share them
HIGHER_ORDERS = (3, 4, 5, 6)


def check_setting(source: Any, options: dict[str, Any], outputs: int | None) -> dict[str, Any]:
    """``tensor``'s setting: one hidden ReLU layer (biases and vector outputs allowed), width at most what
    :func:`.tensor.plan.check_width` allows."""
    net = getattr(source, "network", None)
    if net is not None and (net.depth != 1 or net.activation != "relu"):
        raise ValueError(
            f"--method tensor learns one hidden ReLU layer; the teacher has {net.depth} hidden layer(s) with "
            f"activation {net.activation!r}; use --method filtered-pca for deep networks"
            + (", --method exact for other rectified activations" if net.depth == 1 else "")
        )
    acts = source.activations() if hasattr(source, "activations") else None
    if acts is not None and acts != ["Relu"]:
        raise ValueError(
            f"--method tensor learns one hidden ReLU layer; the ONNX model {source.path} has "
            f"{len(acts)} activation layer(s) ({', '.join(acts) or 'none'}): use --method filtered-pca for deep ReLU "
            "networks, --method polynomial for other activations"
        )
    width = options.get("width") or teacher_width(source)  # a teacher's own width is checked up front too
    check_width(width, source.d)
    _check_orientation(width, source.d, outputs or 1)
    if options.get("width") is None and width is not None and width > source.d and lifted.lifted_route(source.d):
        # a teacher wider than d is learned at its width on the lifted route: the first pass's rank can fall short
        # of d where units crowd a few directions (a trained net of width 40 at d = 20 on 5 informative inputs:
        # rank 16), and the complete route would then take 16 units for 40
        return {**options, "width": width}
    return options


def _check_orientation(width: int | None, d: int, outputs: int) -> None:
    """Refuse, before any sample is drawn, a width whose orientation takes the lattice search where its package
    is not installed (a width the run only finds is named when the search is reached; the store is kept)."""
    if width is None or not needs_lattice(width, outputs * d) or lattice_available():
        return
    raise MissingDependencyError(
        f"orienting {width} units from the linear terms of {outputs} output(s) in d = {d} ({outputs * d} equations, "
        f"more than {ENUMERATE_FREE} unknowns beyond them) needs a lattice search (fplll), which this install lacks: "
        f"{LATTICE_EXTRA}"
    )


def required_statistics(d: int, width: int | None = None, outputs: int | None = None) -> dict:
    """The first pass: ``basic`` (``E[y]``, ``E[y x]`` for the residual labels of the second) and the contracted
    orders 2 and 4 along random directions with the linear control variate (for the subspace); on the
    :func:`.tensor.plan.outputs_route`, ``basic`` and ``output_moments`` (every output's ``T_1`` and ``T_2``) and
    no pass."""
    if outputs_route(d, outputs):
        return {"basic": {}, "output_moments": {}}
    return {"basic": {}, "contracted": {"orders": [2, 4], "directions": 8, "control": True}}


def planned_passes(d: int, width: int | None = None, outputs: int | None = None) -> list[tuple[str, dict, bool]]:
    """The pass the learn asks for after the first, for planning (:mod:`relulearn.runplan`): ``(name, statistics,
    optional)`` with the shapes :func:`_pass_request` gives it (its basis, directions and expansions
    placeholders). The subspace's rank ``k`` is known only from the first pass: ``width`` when given, else d
    (the most the complete route reads, an upper bound on its cost). A ``width`` past d (where
    :func:`.tensor.lifted.lifted_route` allows it) asks for the full Hermite tensors; the outputs route for none."""
    if outputs_route(d, outputs):
        return []
    m = int(outputs or 1)
    if width is not None and width > d and lifted.lifted_route(d):
        hermite = {"max_order": lifted.max_order(d), "expansion": _planned_expansion(d, m)}
        return [("tensor-lifted", {"hermite": hermite}, False)]
    k = min(int(width or d), d)
    section = {
        "basis": [[0.0]] * k,
        "orders": list(HIGHER_ORDERS),
        "directions": [[0.0]] * max(8, 2 * k),
        "expansion": _planned_expansion(k, m),
    }
    return [("tensor-1", {"projected_contracted": section}, False)]


def learn_steps(d: int, width: int | None = None, outputs: int | None = None, samples: int = 0) -> list[LearnStep]:
    """The learn's own steps after the passes, for the plan to price (:func:`.tensor.costs.learn_steps`)."""
    return costs.learn_steps(d, width, outputs, samples)


def learn_costs(d: int, width: int | None = None, outputs: int | None = None, samples: int = 0) -> list[str]:
    """The learn's own costs after the passes, in words for the plan: the bounded sample of the polish, the
    streamed refinement's passes (one output), the residual rounds (widths past d) or the control rounds (the
    outputs route); their time is projected from :func:`learn_steps`, a range where it depends on what the
    passes find."""
    m = int(outputs or 1)
    k = int(width or d)
    n_train, n_val = sample_sizes(d, k, m)
    out = [
        f"the learn after the passes draws {n_train + n_val:,} bounded samples for the polish "
        f"(width {k}: {k * (d + 1) + m * (k + 1) + m * d:,} unknowns), and more for rarely active units"
    ]
    if outputs_route(d, outputs):
        out.append("where T_2 leaves units under its noise floor, control rounds re-estimate it on fresh samples")
    elif width is not None and width > d and lifted.lifted_route(d):
        out.append("residual rounds estimate the tensors of what the network leaves on fresh samples")
    if m == 1:
        out.append(
            f"with one output, unless the polish is exact on its validation samples, a streamed refinement of up to "
            f"{REFINE_PASSES} passes over the {samples:,} samples, each drawing them from the source again"
        )
    return out


def _planned_expansion(k: int, outputs: int) -> dict | list[dict]:
    """One expansion per output with ``k`` eigenpairs of ``T_2`` (as :func:`_expansion` gives them), placeholders."""
    one = {"t2_vectors": [[0.0]] * k, "t2_values": [0.0] * k}
    return [one] * outputs if outputs > 1 else one


def lacks(sections: Mapping[str, Any], outputs: int | None = None) -> MissingStatisticError | None:
    """What a configuration's statistics ``sections`` lack for this method, before anything is written."""
    if "contracted" not in sections and "output_moments" in sections and outputs:
        return None
    if "contracted" not in sections:
        return configured_lack(
            "tensor", "contracted", "orders 2 and 4", "{orders: [2, 4], directions: 8, control: true}"
        )
    if 2 not in set(section_get(sections["contracted"], "orders") or [2, 4]):
        return configured_lack("tensor", "contracted", "order 2", "{orders: [2, 4], directions: 8, control: true}")
    return None


def _check(stats: Mapping[str, Arrays]) -> None:
    if "contracted" not in stats and _has_outputs(stats):
        return
    if "contracted" not in stats:
        raise MissingStatisticError.lacking(
            "tensor", "contracted", "orders 2 and 4", "{orders: [2, 4], directions: 8, control: true}"
        )
    orders = set(np.asarray(stats["contracted"]["pair_order"]).tolist())
    if 2 not in orders:
        raise MissingStatisticError(
            f"the 'tensor' method needs contracted order 2; this store has orders "
            f"{sorted(orders)}; set statistics.contracted.orders: [2, 4]"
        )


def _subspace(outputs: list[dict], width: int | None) -> spectral.Subspace:
    mats: list[np.ndarray]
    ses: list[np.ndarray]
    names: list[str]
    mats, ses, names = [], [], []
    for j, arrays in enumerate(outputs):
        m, s, n = matrices_from_store(arrays)
        mats, ses, names = mats + m, ses + s, names + [f"y{j}:{x}" for x in n]
    return spectral.relevant_subspace(mats, ses, rank=width, names=names)


def _widened(sub: spectral.Subspace, mats: np.ndarray, ses: np.ndarray, width: int | None, report: dict) -> np.ndarray:
    """The subspace's basis, or, when ``width`` asks for more directions than clear the noise floor, the
    ``width`` strongest directions of the matrices each divided by its noise level (the weakest units lie a
    little under the floor more often than in the noise: the polish and the validation samples judge them)."""
    if width is None or sub.rank >= width:
        return sub.basis
    scale = np.sqrt(np.mean(ses**2, axis=(1, 2)))
    stack = np.concatenate(list(mats / np.where(scale > 0, scale, 1.0)[:, None, None]), axis=1)
    basis = np.linalg.svd(stack, full_matrices=False)[0][:, :width]
    report.setdefault("below_noise_floor", []).append(
        {"dimension": int(mats.shape[1]), "above_floor": int(sub.rank), "taken": int(width)}
    )
    return basis


def _expansion(arrays: dict, basic: dict | None, basis: np.ndarray) -> dict[str, Any]:
    """One output's expansion of degree ≤ 2 for residual labels: ``E[y]``, ``E[y x]`` (from ``basic``, or the
    control variate's pilot estimate) and ``T_2`` inside the subspace, as eigenpairs."""
    if basic is not None:
        t0, t1 = float(np.asarray(basic["y"])), np.asarray(basic["yx"], dtype=np.float64)
    elif "control_mean" in arrays:
        t0, t1 = float(np.asarray(arrays["control_mean"])), np.asarray(arrays["control_beta"], dtype=np.float64)
    else:
        t0, t1 = 0.0, np.zeros(basis.shape[0])
    m2, _ = _order2(arrays)
    theta, q = np.linalg.eigh(basis.T @ m2 @ basis)
    return {"t0": t0, "t1": t1.tolist(), "t2_vectors": (basis @ q).T.tolist(), "t2_values": theta.tolist()}


def _pass_request(
    stats: Mapping[str, Arrays], outputs: list[dict], basis: np.ndarray, overcomplete: bool, seed: int
) -> PassRequest:
    basic = _per_output(stats["basic"]) if "basic" in stats else [None] * len(outputs)
    expansions = [_expansion(a, b, basis) for a, b in zip(outputs, basic)]
    expansion = expansions if len(outputs) > 1 else expansions[0]
    d, k = basis.shape
    if overcomplete:
        order = lifted.max_order(d)
        return PassRequest(
            "tensor-lifted",
            {"hermite": {"max_order": order, "expansion": expansion}},
            f"the full Hermite tensors up to order {order} on residual labels: the subspace has full rank d = {d}, "
            "so the network may be wider than d; its units are separated on symmetric matrices",
        )
    g = directions_in_subspace(basis, max(8, 2 * k), seed)
    # the slices are only read inside the subspace: estimated there, k × k, at (k/d)² of the full family's cost;
    # the directions in the subspace's coordinates (basis columns orthonormal, g in their span: still unit)
    section = {"basis": basis.T.tolist(), "orders": list(HIGHER_ORDERS), "directions": (g @ basis).tolist()}
    return PassRequest(
        "tensor-1",
        {"projected_contracted": {**section, "expansion": expansion}},
        f"contracted orders {list(HIGHER_ORDERS)} along {len(g)} directions inside the {k}-dimensional subspace, "
        "on residual labels, estimated in the subspace: the slices of the tensor the units are read from",
    )


def learn(
    stats: Mapping[str, Arrays],
    passes: Sequence[Mapping[str, Arrays]],
    samples: Callable[[int, int], Samples],
    *,
    width: int | None = None,
    refine_samples: int | None = None,
    mapper: Callable = map,
    seed: int = 0,
) -> LearnResult | PassRequest:
    """Learn ``y = A relu(U x + b) + c`` (one hidden ReLU layer, biases, m ≥ 1 outputs) of width up to
    :func:`.tensor.plan.identifiable_width`.

    Parameters
    ----------
    stats
        The main store's statistics (``contracted`` with order 2; ``basic`` when present).
    passes
        The higher-order pass this method asks for, once run.
    samples
        ``samples(n_train, n_val)`` draws bounded held-out samples from the source.
    width
        Hidden units wanted (default: the rank the noise floor supports).
    refine_samples
        Samples of the streamed refinement (one output, noisy labels; default: as many as the store holds).
    mapper
        ``map``-like callable for the streamed refinement.
    seed
        Seeds the directions of the pass and the decomposition's draws.

    Returns
    -------
    LearnResult or PassRequest
    """
    _check(stats)
    if "contracted" not in stats:
        return _learn_outputs(stats, samples, width=width, refine_samples=refine_samples, mapper=mapper, seed=seed)
    outputs = _per_output(stats["contracted"])
    m = len(outputs)
    d = np.asarray(outputs[0]["M"]).shape[-1]
    check_width(width, d)
    sub = _subspace(outputs, width if width is None or width <= d else d)
    if sub.rank == 0:
        raise no_signal(stats, "tensor")
    overcomplete = lifted.lifted_route(d) and ((width is not None and width > d) or (width is None and sub.rank == d))
    report: dict[str, Any] = {"subspace": sub.to_dict(), "route": "lifted" if overcomplete else "complete"}
    if not overcomplete and sub.rank == d:
        report["unresolved"] = (
            f"the subspace has full rank d = {d}: the network may be wider than d, and at d = {d} "
            "this method separates at most d units (the full T_4 is too large to estimate)"
        )
    if not overcomplete and width is not None and sub.rank < width:
        raise _too_few(sub, width, _count(stats))
    if not passes:
        return _pass_request(stats, outputs, sub.basis, overcomplete, seed)
    rows = None  # the pass's subspace basis (k × d) when its slices are in its coordinates
    if overcomplete:
        sl = _lifted_slices([_order2(a) for a in outputs], _per_output(passes[0]["hermite"]), d, seed)
        lsub = spectral.relevant_subspace(list(sl.matrices), list(sl.ses), rank=width)
        report["lifted_subspace"] = lsub.to_dict(include_basis=False)
        basis = _widened(lsub, sl.matrices, sl.ses, width, report)
    elif "projected_contracted" in passes[0]:
        sl, rows = _projected_slices(outputs, _per_output(passes[0]["projected_contracted"]))
        basis = np.eye(len(rows))  # the slices span the whole of their k coordinates
    else:  # a store whose pass holds the full family (estimated before the pass moved into the subspace)
        sl = _complete_slices(outputs, _per_output(passes[0]["contracted"]))
        basis = sub.basis
    k = basis.shape[1]
    if k == 0:
        raise NoSignalError(
            "no unit stands above the noise floor of the higher orders at this sample count; estimate with more samples"
        )
    units, report["decomposition"] = _decompose(sl.matrices, sl, basis, seed, d, m)
    if rows is not None:  # back from the subspace's coordinates: û = Bᵀ (B û) for û in the subspace
        units = Units(units.directions @ rows, units.beta, units.amp)
    return _finish(
        units,
        overcomplete,
        report,
        stats,
        samples,
        width=width,
        refine_samples=refine_samples,
        mapper=mapper,
        seed=seed,
    )
