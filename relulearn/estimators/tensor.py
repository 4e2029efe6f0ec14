"""Method ``tensor``: wide one-hidden-layer ReLU networks with biases and any number of outputs, by a joint
symmetric CP decomposition of Hermite moments of several orders.

For ``y_j = Σ_i A_ji relu(<û_i, x> + β_i) + c_j`` (unit ``û_i``; a unit ``a relu(<u, x> + b)`` is
``A = a|u|``, ``β = b/|u|``) every Hermite moment of order ``l ≥ 2`` has the same rank-one factors
(docs/design.md §3): ``T_l[j] = Σ_i A_ji f_l(β_i) û_i^{⊗l}`` with ``f_l(β) = (−1)^l He_{l−2}(β) φ(β)``. So, whatever
the signs of the output weights and however many outputs there are:

* **complete widths** (``k ≤ d``): the contracted moments ``M_l^g[j] = T_l[j](g, …, g, ·, ·)`` (orders 2–6,
  directions ``g`` inside the relevant subspace, d × d each) form one symmetric CP tensor with factors
  ``û_i``, decomposed in the k-dimensional subspace;
* **overcomplete widths** (``d < k ≤ d(d+1)/2``): the full tensors ``T_4``, ``T_5(g)``, ``T_6(g, g)``
  flattened to ``D × D`` matrices on ``Sym²(R^d)`` form one with factors ``û_i û_iᵀ`` (:mod:`.lifted`);
* **several outputs at large d** (:func:`outputs_route`): the ``m`` slices ``T_2[j]`` alone form one with the
  outputs as third mode, and ``T_1[j] = Σ_i A_ji Φ(β_i) û_i`` gives each unit's offset and orientation: one
  pass of ``output_moments``, no higher orders. Where the noise floor hides units (a decomposition that leaves
  more than its noise unexplained, or fewer directions than ``width``), control-variate rounds
  (:mod:`.control`) re-estimate ``T_1``, ``T_2`` on fresh samples of what the labels' degree-two expansion
  leaves: a floor several times lower from the same count.

The method:

1. The relevant subspace ``W`` from the stored ``M_2`` and ``M_4^g`` of every output, its rank set by their
   noise floor (:func:`.spectral.relevant_subspace`) or by ``width``; a full rank (or ``width > d``) means
   the network may be wider than d.
2. One requested pass on residual labels ``y − P_{≤2} y`` (the degree-≤2 expansion from the first pass:
   orders ≥ 3 unchanged, their variance cut about tenfold): contracted orders 3–6 along directions inside
   ``W`` (complete), or the full Hermite tensors up to order 6, 5 or 4 by d (:func:`.lifted.max_order`).
3. The slices, each divided by its noise level, decomposed by Jennrich's algorithm and alternating least
   squares from several starts (:func:`.cp.decompose`): the directions ``±û_i``.
4. Each unit's offset and output weights from its weights across the slices (its *profile*, e.g.
   ``f_3/f_2 = −β``): a least-squares fit in ``β``.
5. Polish with a free affine part (:func:`.polish.polish` with ``affine``): orders ≥ 2 cannot tell ``relu(s)``
   from ``relu(−s) = relu(s) − s``, so the units are fitted as found and the affine part takes up the rest;
   then the units whose flip removes its linear term (:func:`.orient.orient`: least squares, enumeration or a
   lattice search), and polish again without it: machine precision on noiseless labels.
6. Residual rounds (overcomplete route): while the network does not fit the validation samples, the tensors of
   the labels it leaves, on fresh samples (small labels, so far less noise than the stored tensors), decomposed
   at their own noise-floor rank: components away from the network's units are units it missed, swapped in
   before polishing again.
7. With one output and noisy labels, the streamed refinement on every sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import eval_hermitenorm, ndtr

from .. import hermite
from ..network import Network
from . import control, cp, lifted, spectral
from .base import Arrays, LearnResult, MissingStatisticError, NoSignalError, PassRequest, Samples, TooFewSamplesError
from .coverage import COVER_PART, cover
from .orient import orient
from .polish import polish, polish_outputs
from .polish_cg import DENSE_UNKNOWNS, matrix_free
from .streamed import refine_unless_exact

__all__ = [
    "MAX_PASSES",
    "HIGHER_ORDERS",
    "OUTPUTS_ROUTE_MIN_D",
    "WidthError",
    "identifiable_width",
    "check_width",
    "outputs_route",
    "required_statistics",
    "sample_sizes",
    "profile",
    "learn",
]

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

#: the pass of higher orders, and nothing more
MAX_PASSES = 1

#: from this input dimension on, a network with several outputs is learned from the outputs' second moments alone
#: (:func:`outputs_route`)
OUTPUTS_ROUTE_MIN_D = 64

#: orders of the complete route's pass: every f_l(β) with l ≥ 3 has zeros, neighbouring orders do not share them
HIGHER_ORDERS = (3, 4, 5, 6)

#: Jennrich draws, ALS runs from the best of them, and ALS sweeps (measured on trained width-8 MLPs at
#: d = 13: one ALS run from the best draw can end in a poor point at 10⁷ samples; ten runs do not)
DRAWS, STARTS, SWEEPS = 30, 10, 200

#: the β grid of the profile fit (a unit with |β| > 6 is on or off for all but 10⁻⁹ of the inputs)
BETA_GRID = np.linspace(-6.0, 6.0, 4801)

#: residual rounds after the first decomposition, at most
RESIDUAL_ROUNDS = 4

#: a validation relative loss below this is an exact fit (float32 teachers round at about 10⁻¹⁴ relative)
FIT_LOSS = 1e-11

#: contraction directions of the overcomplete route's pass (T_5(g) and T_6(g, g) slices)
LIFTED_DIRECTIONS = 8


class WidthError(ValueError):
    """A width the stored orders cannot identify (the message names the limit and what would lift it)."""


def identifiable_width(d: int) -> int:
    """The widest network this method separates at input dimension ``d``: ``d(d+1)/2`` where the full tensor
    ``T_4`` is affordable (:func:`.lifted.lifted_route`), else ``d``."""
    return lifted.lifted_dimension(d) if lifted.lifted_route(d) else d


def check_width(width: int | None, d: int) -> None:
    """Refuse, before any work, a width past what this method identifies."""
    limit = identifiable_width(d)
    if width is None or width <= limit:
        return
    if limit == d:
        raise WidthError(
            f"--method tensor separates at most d = {d} units at this input dimension (width {width} asked): wider "
            f"networks need the full Hermite tensor T_4 flattened on symmetric matrices, and at d = {d} it has "
            f"{math.comb(d + 3, 4):,} entries per sample, past the {lifted.ORDER_ENTRIES:,} this version estimates; "
            "use a width ≤ d"
        )
    raise WidthError(
        f"--method tensor separates at most d(d+1)/2 = {limit} units at d = {d} (width {width} asked): the full "
        "tensors of orders 4–6 flattened on symmetric matrices hold at most that many rank-one terms apart; orders "
        f"6 and 8 flattened on symmetric 3-tensors would lift the limit to d(d+1)(d+2)/6 = "
        f"{d * (d + 1) * (d + 2) // 6}, which this version does not estimate"
    )


def check_setting(source: Any, options: dict[str, Any], outputs: int | None) -> dict[str, Any]:
    """``tensor``'s setting: one hidden ReLU layer (biases and vector outputs allowed), width at most what
    :func:`check_width` allows."""
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
    check_width(options.get("width"), source.d)
    if net is not None and options.get("width") is None:
        check_width(int(net.weights[0].shape[0]), source.d)
    return options


def outputs_route(d: int, outputs: int | None) -> bool:
    """Whether ``fit`` learns from the outputs' second moments alone (``output_moments``: ``T_2`` and ``T_1`` of
    each output, one pass, no higher orders).

    With ``m ≥ 2`` outputs the ``m`` slices ``T_2[j] = Σ_i A_ji φ(β_i) û_i û_iᵀ`` are a CP tensor whose third
    mode is the outputs: Jennrich's algorithm separates every pair of units whose output profiles ``A_·i`` are
    not parallel, whatever ``k ≤ d`` (Kruskal; rank ``A = k`` is not needed), and ``T_1`` gives each unit's offset
    and orientation. That costs ``m d²/2`` per sample where the contracted route's two passes cost about
    ``m d² (9 + 8k)``: past :data:`OUTPUTS_ROUTE_MIN_D` (d = 784, k = 128, m = 10: 3·10⁶ against 5·10⁹
    multiply-adds per sample) it is the route that finishes. Below it, and for one output, the contracted orders
    (and the overcomplete route, for widths past d) are used."""
    return outputs is not None and outputs >= 2 and d >= OUTPUTS_ROUTE_MIN_D


def required_statistics(d: int, width: int | None = None, outputs: int | None = None) -> dict:
    """The first pass: ``basic`` (``E[y]``, ``E[y x]`` for the residual labels of the second) and the contracted
    orders 2 and 4 along random directions with the linear control variate (for the subspace); on the
    :func:`outputs_route`, ``basic`` and ``output_moments`` (every output's ``T_1`` and ``T_2``) and no pass."""
    if outputs_route(d, outputs):
        return {"basic": {}, "output_moments": {}}
    return {"basic": {}, "contracted": {"orders": [2, 4], "directions": 8, "control": True}}


def sample_sizes(d: int, k: int, m: int) -> tuple[int, int]:
    """Training and validation samples of the bounded sample: polish with a free affine part solves for
    ``p = k(d+1) + m(k+1) + m·d`` unknowns. Past :func:`.polish_cg.matrix_free` the polish is matrix-free,
    each sample gives m equations and each of its iterations costs a pass over the samples: ``8p/m`` of them
    (``40p`` would be 4·10⁶ rows of 784 inputs for a width-128 network with 10 outputs). Units active (or inactive)
    on a small fraction of inputs get further rows from :func:`.coverage.cover`."""
    unknowns = k * (d + 1) + m * (k + 1) + m * d
    if matrix_free(unknowns, m):
        return max(20_000, 8 * unknowns // m), max(10_000, 2 * unknowns // m)
    return max(20_000, 40 * unknowns), max(10_000, 10 * unknowns)


def profile(order: int | np.ndarray, beta: float | np.ndarray) -> np.ndarray:
    """``f_l(β) = E[relu(z + β) He_l(z)] = (−1)^l He_{l−2}(β) φ(β)`` for ``l ≥ 2`` (docs/design.md §3), and
    ``f_1(β) = Φ(β)``."""
    order, beta = np.broadcast_arrays(np.asarray(order), np.asarray(beta, dtype=np.float64))
    high = (
        (-1.0) ** order * eval_hermitenorm(np.maximum(order, 2) - 2, beta) * np.exp(-0.5 * beta**2) / np.sqrt(2 * np.pi)
    )
    return np.where(order == 1, ndtr(beta), high)


# ------------------------------------------------------------------------------------------ statistics


#: dimensions of the arrays this method reads, for one output (a per-output group stacks the estimands, and
#: the coordinates that differ between outputs, along a leading ``output`` axis)
_NDIM = {
    "M": 3,
    "M_se": 3,
    "control_mean": 0,
    "control_beta": 1,
    "y": 0,
    "y_se": 0,
    "yx": 1,
    "yx_se": 1,
    **{f"T{l}{s}": 1 for l in range(9) for s in ("", "_se")},
}


def _per_output(arrays: Arrays) -> list[dict[str, np.ndarray]]:
    """A per-output group as one dict per output (a scalar label: one dict)."""
    if "output" not in arrays:
        return [dict(arrays)]
    out = []
    for j in range(len(np.asarray(arrays["output"]))):
        part = {}
        for key, value in arrays.items():
            value = np.asarray(value)
            part[key] = value[j] if key in _NDIM and value.ndim == _NDIM[key] + 1 else value
        out.append(part)
    return out


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


def _has_outputs(stats: Mapping[str, Arrays]) -> bool:
    """A store of the :func:`outputs_route`: ``output_moments`` of two or more outputs."""
    om = stats.get("output_moments")
    return (
        om is not None and all(k in om for k in ("T1", "T1_se", "T2", "T2_se")) and np.asarray(om["T2"]).shape[0] >= 2
    )


def _outputs_slices(om: Arrays) -> Slices:
    """Each output's ``T_2`` as a slice and its ``T_1`` as a vector (order 1: ``Σ_i A_ji Φ(β_i) û_i``)."""
    t2, s2 = np.asarray(om["T2"], dtype=np.float64), np.asarray(om["T2_se"], dtype=np.float64)
    t1, s1 = np.asarray(om["T1"], dtype=np.float64), np.asarray(om["T1_se"], dtype=np.float64)
    m, d = t1.shape
    none = tuple(np.zeros((0, d)) for _ in range(m))
    vectors = Slices(t1, s1, np.arange(m), np.ones(m, dtype=int), none, False)
    return Slices(0.5 * (t2 + t2.transpose(0, 2, 1)), s2, np.arange(m), np.full(m, 2), none, False, vectors)


def _subspace(outputs: list[dict], width: int | None) -> spectral.Subspace:
    mats: list[np.ndarray]
    ses: list[np.ndarray]
    names: list[str]
    mats, ses, names = [], [], []
    for j, arrays in enumerate(outputs):
        m, s, n = spectral.matrices_from_store(arrays)
        mats, ses, names = mats + m, ses + s, names + [f"y{j}:{x}" for x in n]
    return spectral.relevant_subspace(mats, ses, rank=width, names=names)


#: the count of samples a refusal asks for is this many times the one at which the weakest unit wanted would
#: just reach the noise floor
SAMPLES_MARGIN = 2.0


def _too_few(sub: spectral.Subspace, width: int, n: int) -> TooFewSamplesError:
    """The refusal of a width the first pass's noise floor does not support, with the samples that would: the
    stack's singular values grow as √n against the floor, so the width-th reaches the threshold at
    ``n·(threshold/s)²``."""
    s = float(sub.singular_values[width - 1]) if len(sub.singular_values) >= width else 0.0
    ratio = s / sub.threshold if s > 0 else 0.0
    need = f"about {int(math.ceil(SAMPLES_MARGIN * n / ratio**2)):,}" if ratio > 0.05 else "far more than"
    return TooFewSamplesError(
        f"--width {width} asks for more units than the noise floor supports at {n:,} samples: {sub.rank} directions "
        f"stand above it (the {width}-th is at {ratio:.2f} of the threshold). Estimate with {need} samples "
        f"(`relulearn estimate CONFIG --store STORE --samples N`, then learn again), or leave out --width to learn the "
        f"{sub.rank} units the floor supports"
    )


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


def _order2(arrays: dict) -> tuple[np.ndarray, np.ndarray]:
    """``M_2`` and its standard errors of one output."""
    mats, ses, _ = spectral.matrices_from_store(arrays, orders=[2])
    return mats[0], ses[0]


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
    g = spectral.directions_in_subspace(basis, max(8, 2 * k), seed)
    return PassRequest(
        "tensor-1",
        {"contracted": {"orders": list(HIGHER_ORDERS), "directions": g.tolist(), "expansion": expansion}},
        f"contracted orders {list(HIGHER_ORDERS)} along {len(g)} directions inside the {k}-dimensional subspace, "
        "on residual labels: the slices of the tensor the units are read from",
    )


# ------------------------------------------------------------------------------------------ slices


@dataclass(frozen=True)
class Slices:
    """The CP tensor: ``matrices`` (P, n, n) with standard errors, per slice its output, order and contraction
    directions (rows ``g``, each contributing ``<û, g>``), and ``n``: d (complete) or d(d+1)/2 (lifted)."""

    matrices: np.ndarray
    ses: np.ndarray
    out_of: np.ndarray
    order_of: np.ndarray
    contractions: tuple[np.ndarray, ...]
    lifted: bool
    #: lifted only: lower orders as vectors of the slices' space, linear in the factors (``Σ_i w_i v_i``)
    vectors: Slices | None = None

    def factors(self, directions: np.ndarray) -> np.ndarray:
        """``(P, k)``: ``Π_g <û_i, g>`` over each slice's contraction directions."""
        return np.stack(
            [np.prod(g @ directions.T, axis=0) if len(g) else np.ones(len(directions)) for g in self.contractions]
        )

    def embed(self, directions: np.ndarray) -> np.ndarray:
        """The factor of each unit in the slices' space: ``û`` (complete) or ``vec(û ûᵀ)`` (lifted)."""
        return lifted.embed(directions) if self.lifted else directions


def _complete_slices(outputs: list[dict], passed: list[dict]) -> Slices:
    """Order 2 of each output (first pass) and each (order, direction) of the higher-order pass."""
    mats, ses, out_of, order_of, conts = [], [], [], [], []
    for j, arrays in enumerate(outputs):
        m2, s2 = _order2(arrays)
        mats.append(m2)
        ses.append(s2)
        out_of.append(j)
        order_of.append(2)
        conts.append(np.zeros((0, len(m2))))
    for j, arrays in enumerate(passed):
        g = np.asarray(arrays["direction"], dtype=np.float64)
        po, pd = np.asarray(arrays["pair_order"]).astype(int), np.asarray(arrays["pair_direction"]).astype(int)
        for p in range(len(po)):
            if po[p] == 2:
                continue
            mats.append(np.asarray(arrays["M"][p]))
            ses.append(np.asarray(arrays["M_se"][p]))
            out_of.append(j)
            order_of.append(int(po[p]))
            conts.append(np.repeat(g[pd[p]][None, :], po[p] - 2, 0))
    return Slices(np.asarray(mats), np.asarray(ses), np.asarray(out_of), np.asarray(order_of), tuple(conts), False)


def _lifted_slices(order2: list[tuple[np.ndarray, np.ndarray]], passed: list[dict], d: int, seed: int) -> Slices:
    """``T_4`` and ``T_5(g)``, ``T_6(g, g)`` of each output, flattened on symmetric matrices; as vectors, each
    output's ``T_2`` (``order2``: matrix and standard errors) and ``T_3(g)``."""
    rng = np.random.default_rng((int(seed), _LIFTED_STREAM))
    g = rng.standard_normal((LIFTED_DIRECTIONS, d))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    parts = [lifted.slices(arrays, d, g) for arrays in passed]
    vec, vse, vout, vorder, vcont = [], [], [], [], []
    for j, ((m2, s2), arrays) in enumerate(zip(order2, passed)):
        v3, s3, c3 = lifted.vectors(arrays, d, g)
        vec += [lifted.lift_vector(m2), *v3]
        vse += [lifted.lift_vector(s2), *s3]
        vout += [j] * (1 + len(v3))
        vorder += [2] + [3] * len(v3)
        vcont += [np.zeros((0, d)), *c3]
    vectors = Slices(np.asarray(vec), np.asarray(vse), np.asarray(vout), np.asarray(vorder), tuple(vcont), True)
    return Slices(
        np.concatenate([p.matrices for p in parts]),
        np.concatenate([p.ses for p in parts]),
        np.concatenate([np.full(len(p.orders), j) for j, p in enumerate(parts)]),
        np.concatenate([p.orders for p in parts]),
        tuple(c for p in parts for c in p.contractions),
        True,
        vectors,
    )


_LIFTED_STREAM = 0x11F7ED  # separates the lifted directions' stream from others keyed by the same seed


def _noise_scale(sl: Slices, basis: np.ndarray) -> np.ndarray:
    """Each slice's noise inside the subspace (entries roughly independent): slices divided by it have equal
    noise, so the decomposition weighs them by their evidence."""
    scale = np.sqrt(np.einsum("da,pde,eb->p", basis**2, sl.ses**2, basis**2, optimize=True))
    return np.where(scale > 0, scale, 1.0)


# ------------------------------------------------------------------------------------------ units


@dataclass(frozen=True)
class Units:
    """Units read off a decomposition: unit directions (orientation arbitrary), offsets, output weights (m, k)."""

    directions: np.ndarray
    beta: np.ndarray
    amp: np.ndarray


def _decompose(matrices: np.ndarray, sl: Slices, basis: np.ndarray, seed: int, d: int, m: int) -> tuple[Units, dict]:
    """Decompose noise-scaled slices in ``span(basis)`` (Jennrich and ALS; the subspace power method when each
    output has one slice, ``T_4``) and fit each unit's profile."""
    scale = _noise_scale(sl, basis)
    scaled = matrices / scale[:, None, None]
    report: dict[str, Any] = {"slices": int(len(matrices)), "rank": int(basis.shape[1])}
    res: float | np.ndarray  # the decomposition's relative residual, then the profiles' residuals per unit
    if sl.lifted and len(matrices) == m:  # T_4 of each output alone: SPM on a random combination of the outputs
        rng = np.random.default_rng((int(seed), _LIFTED_STREAM, 1))
        mix = np.tensordot(rng.standard_normal(m) if m > 1 else np.ones(1), scaled, 1)
        dirs, _ = lifted.spm(basis.T @ mix @ basis, basis, d, seed)
        weights, res = cp.fit_weights(
            np.einsum("da,pde,eb->pab", basis, scaled, basis, optimize=True), basis.T @ lifted.embed(dirs).T
        )
        report.update(algorithm="subspace power method", relative_residual=res)
        quality = np.ones(len(dirs))
    else:
        dec = cp.decompose(scaled, basis, seed=seed, draws=DRAWS, starts=STARTS, sweeps=SWEEPS)
        report.update(algorithm="Jennrich and alternating least squares", relative_residual=dec.relative_residual)
        dirs, weights = dec.directions, dec.weights
        if sl.lifted:
            dirs, _, quality = lifted.units(dec.directions, d)
    if sl.lifted:
        report["rank_one_quality"] = quality.tolist()
    report["misfit"] = _misfit(report["relative_residual"], scaled, basis)
    scale = np.broadcast_to(scale[:, None], weights.shape)
    factors, out_of, order_of = sl.factors(dirs), sl.out_of, sl.order_of
    if sl.vectors is not None:  # lower orders: each vector's weights by least squares on the factors
        vw, vs = _vector_weights(sl.vectors, sl.embed(dirs))
        weights, scale = np.vstack([weights, vw / vs]), np.vstack([scale, vs])
        factors = np.vstack([factors, sl.vectors.factors(dirs)])
        out_of, order_of = np.r_[out_of, sl.vectors.out_of], np.r_[order_of, sl.vectors.order_of]
    beta, amp, res = _fit_profiles(weights, scale, factors, out_of, order_of, m)
    if np.any(order_of == 1):
        # orders ≥ 2 cannot tell the unit (û, β) from (−û, −β); order 1 can (T_1 holds Φ(β) û): the flipped unit's
        # odd orders change sign, so each unit is fitted both ways and keeps the orientation that fits
        odd = (order_of % 2 == 1)[:, None]
        fb, fa, fr = _fit_profiles(np.where(odd, -weights, weights), scale, factors, out_of, order_of, m)
        flip = fr < res
        dirs = np.where(flip[:, None], -dirs, dirs)
        beta, amp, res = np.where(flip, fb, beta), np.where(flip[None, :], fa, amp), np.where(flip, fr, res)
        report["flipped_by_order_1"] = int(flip.sum())
    report.update(profile_residuals=res.tolist(), offsets=beta.tolist(), output_weights=amp.tolist())
    return Units(dirs, beta, amp), report


def _misfit(relative_residual: float, scaled: np.ndarray, basis: np.ndarray) -> float:
    """The decomposition's residual inside the subspace over what noise alone leaves: each noise-scaled slice
    holds noise of squared norm ~1 there, of which the CP model's ``k² + P k`` parameters absorb their share of
    the ``P k(k+1)/2`` entries. About 1 (up to 2: symmetric noise) when the model explains the slices."""
    p, k = len(scaled), basis.shape[1]
    inside = float(sum(np.linalg.norm(basis.T @ s @ basis) ** 2 for s in scaled))
    free = max(0.1, 1.0 - (k * k + p * k) / (p * k * (k + 1) / 2))
    return float(relative_residual**2 * inside / (p * free))


def _vector_weights(vec: Slices, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``w`` (Q, k) with ``vector_q ≈ Σ_i w_qi v_i`` for factors ``v`` (k, D), and their noise levels
    (the rows of ``(Vᵀ)⁺`` times each vector's noise)."""
    pinv = np.linalg.pinv(v.T)  # (k, D)
    w = vec.matrices @ pinv.T
    noise = np.sqrt((vec.ses**2) @ (pinv**2).T)
    return w, np.where(noise > 0, noise, 1.0)


def _fit_profiles(
    weights: np.ndarray, scale: np.ndarray, factors: np.ndarray, out_of: np.ndarray, order_of: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets ``β_i`` and output weights ``A`` (m × k) from the weights of the noise-scaled slices: slice p
    holds ``A_{j_p i} f_{l_p}(β_i) factor_{p i} / scale_{p i}``. For each unit, ``A`` is the least-squares answer
    at each β of :data:`BETA_GRID`, and the β of least residual is kept. Returns ``(β, A, relative residual per
    unit)``."""
    k = weights.shape[1]
    f = profile(order_of[:, None], BETA_GRID[None, :])  # (P, grid)
    onehot = (out_of[:, None] == np.arange(m)[None, :]).astype(np.float64)  # (P, m)
    beta, amp, resid = np.zeros(k), np.zeros((m, k)), np.zeros(k)
    for i in range(k):
        bf = (factors[:, i] / scale[:, i])[:, None] * f  # (P, grid)
        target = weights[:, i]
        # per output j and grid point: A_j = Σ_p∈j t_p b_p f_p / Σ_p∈j (b_p f_p)²
        num = onehot.T @ (target[:, None] * bf)  # (m, grid)
        den = onehot.T @ (bf * bf)
        a = num / np.where(den > 0, den, 1.0)
        res = float(target @ target) - np.sum(a * num, axis=0)  # the residual sum of squares per grid point
        best = int(np.argmin(res))
        beta[i], amp[:, i] = BETA_GRID[best], a[:, best]
        resid[i] = float(np.sqrt(max(res[best], 0.0) / max(float(target @ target), 1e-300)))
    return beta, amp, resid


# ------------------------------------------------------------------------------------------ networks


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
        loose, prep = polish(start, x, y[:, 0], affine=True) if single else polish_outputs(start, x, y, affine=True)
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
        net, prep = polish(oriented, x, y[:, 0]) if single else polish_outputs(oriented, x, y)
        report["polish"] = prep.__dict__
    except (ValueError, np.linalg.LinAlgError) as err:
        report["polish"] = {"error": str(err)}
        net = oriented
    return net, report


#: part ids between the coverage draws of successive rounds (a draw without ``part_batches`` uses consecutive ids)
COVER_STRIDE = 10_000


def _covered(
    samples: Any, x: np.ndarray, y: np.ndarray, units: Units, report: dict, part: int
) -> tuple[np.ndarray, np.ndarray]:
    """The polish's sample with the rows :func:`.coverage.cover` adds for the units' smaller sides; what it did
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


#: a residual component within this angle (radians) of a unit of the network is that unit's own correction,
#: not a unit it misses
NEW_UNIT_ANGLE = 0.2

#: samples of a residual round's tensors (parts of :data:`.refine.PART_ROWS` rows; their spread gives the
#: standard errors), and the first part id it draws (parts 0 and 1 are the training and validation samples)
RESIDUAL_SAMPLES, RESIDUAL_PART = 2_000_000, 2

#: after polish, a unit whose output weights are below this fraction of the largest unit's is dropped
PRUNE = 1e-6

#: two units whose unit-norm hidden rows ``[u, b]`` differ by less than this in ``1 − cos`` are one unit split
SAME_ROW = 1e-10


def _missing_units(
    net: Network, samples: Any, mapper: Callable, d: int, m: int, seed: int, report: dict
) -> Units | None:
    """Units the network misses: the lifted decomposition, at its own noise-floor rank, of the tensors of the
    labels it leaves (fresh samples; small labels, so far less noise than the stored tensors), less the
    components that are corrections of its own units. None when nothing is found."""
    from .refine import parts

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


# ------------------------------------------------------------------------------------------ learn


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
    :func:`identifiable_width`.

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
        raise NoSignalError(
            "the spectral stage found no direction above the noise floor: the statistics are pure noise at this "
            "sample count; estimate with more samples (`relulearn estimate ... --samples N`)"
        )
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
    passed = _per_output(passes[0]["hermite" if overcomplete else "contracted"])
    if overcomplete:
        sl = _lifted_slices([_order2(a) for a in outputs], passed, d, seed)
        lsub = spectral.relevant_subspace(list(sl.matrices), list(sl.ses), rank=width)
        report["lifted_subspace"] = lsub.to_dict(include_basis=False)
        basis = _widened(lsub, sl.matrices, sl.ses, width, report)
    else:
        sl = _complete_slices(outputs, passed)
        basis = sub.basis
    k = basis.shape[1]
    if k == 0:
        raise NoSignalError(
            "no unit stands above the noise floor of the higher orders at this sample count; estimate with more samples"
        )
    units, report["decomposition"] = _decompose(sl.matrices, sl, basis, seed, d, m)
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


def _from_outputs(
    stats: Mapping[str, Arrays],
    width: int | None,
    seed: int,
    samples: Any = None,
    mapper: Callable = map,
    rounds_first: bool = False,
) -> tuple[Units, bool, dict]:
    """The :func:`outputs_route`: the subspace from every output's ``T_2`` at its noise floor, then the joint CP
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
    """The :func:`outputs_route` to the network. When the polished network does not fit the validation samples
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


def _samples_needed(sub: spectral.Subspace, width: int, n: int) -> float:
    """Samples at which the ``width``-th direction would clear the floor (singular values grow as √n)."""
    s = float(sub.singular_values[width - 1]) if len(sub.singular_values) >= width else 0.0
    return n * (sub.threshold / s) ** 2 if s > 0 else math.inf


def _control_rounds(
    om: dict, sub: spectral.Subspace, width: int | None, samples: Any, mapper: Callable, rounds: list
) -> tuple[dict, spectral.Subspace]:
    """Lower the noise floor of the outputs' ``T_1``, ``T_2`` with control variates (:mod:`.control`): each
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


def _count(stats: Mapping[str, Arrays]) -> int:
    """The samples the store's statistics were estimated from."""
    return int(np.asarray(stats["contracted" if "contracted" in stats else "output_moments"]["count"]))


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
    units), prune, residual rounds (overcomplete route), the streamed refinement (one output, noisy labels)."""
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
    for r in range(RESIDUAL_ROUNDS if overcomplete else 0):
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
        report["refinement"] = {"skipped": "polish fits the validation samples to the teacher's rounding"}
    elif m == 1:
        total = _count(stats) if refine_samples is None else int(refine_samples)
        net = refine_unless_exact(net, samples, total, smp, mapper, report)
    else:
        report["refinement"] = {
            "skipped": "the streamed refinement fits one output; polish fitted all outputs on the bounded sample"
        }
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
    return LearnResult(net, report)
