"""Method ``tensor``: wide one-hidden-layer ReLU networks with biases and any number of outputs, by a joint
symmetric CP decomposition of contracted Hermite moments of several orders.

For ``y_j = Σ_i A_ji relu(<û_i, x> + β_i) + c_j`` (unit ``û_i``; a unit ``a relu(<u, x> + b)`` is
``A = a|u|``, ``β = b/|u|``) every contracted moment of order ``l ≥ 2`` along a direction ``g`` shares the
same rank-one factors (DESIGN.md §3):

    M_l^g[j] = Σ_i A_ji f_l(β_i) <û_i, g>^{l−2} û_i û_iᵀ,      f_l(β) = (−1)^l He_{l−2}(β) φ(β).

So the stack of all of them — outputs × orders × directions — is one symmetric CP tensor whose factors are
the units' directions, whatever the signs of the output weights and however many outputs there are. The
method:

1. The relevant subspace ``W`` (d × k) from the stored ``M_2`` and ``M_4^g`` of every output, its rank set by
   their noise floor (:func:`.spectral.relevant_subspace`) or by ``width``.
2. One requested pass: contracted orders 3–6 along directions inside ``W`` (there ``<û_i, g>`` is O(1)), on
   residual labels ``y − P_{≤2} y`` (the degree-≤2 expansion from the first pass: orders ≥ 3 unchanged, their
   variance cut by about an order of magnitude).
3. The slices ``Wᵀ M W`` (k × k), each divided by its noise level, decomposed by Jennrich's algorithm and
   alternating least squares from several starts (:func:`.cp.decompose`): the directions ``±û_i``.
4. Each unit's offset and output weights from its weights across the slices (its *profile* over orders, e.g.
   ``f_3/f_2 = −β``), a 1-D least-squares fit in ``β``.
5. A direction's sign is invisible to orders ≥ 2: ``relu(s) − relu(−s) = s``, so flipping a unit changes the
   network by an affine function. A least-squares fit of the units and an affine part on a bounded sample
   finds that part; writing it as ``−Σ_{flipped} A_i û_i`` (k unknowns, ``m·d`` equations: complete widths)
   tells which units to flip.
6. Polish on activation patterns to machine precision (:func:`.polish.polish` for one output,
   :func:`.polish.polish_outputs` for several), then, with one output and noisy labels, the streamed
   refinement on every sample.

Complete widths only (``k ≤ d``): the slices live in the k-dimensional subspace. Wider networks (the
overcomplete case, up to about d(d+1)/2 units with order 4) need the full tensors of orders 4 and 6 and a
subspace power method; they are refused by name.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
from scipy.special import eval_hermitenorm

from ..network import Network
from . import cp, spectral
from .base import Arrays, LearnResult, MissingStatisticError, NoSignalError, PassRequest, Samples
from .polish import polish, polish_outputs
from .streamed import refine_unless_exact

__all__ = ["OPTIONS", "MAX_PASSES", "HIGHER_ORDERS", "WidthError", "check_width", "required_statistics",
           "sample_sizes", "profile", "learn"]

#: keyword options of :func:`learn` that ``relulearn learn`` passes through
OPTIONS = ("width", "refine_samples")

#: the pass of higher orders, and nothing more
MAX_PASSES = 1

#: orders of the requested pass: every c_l(β) with l ≥ 3 has zeros, neighbouring orders do not share them
HIGHER_ORDERS = (3, 4, 5, 6)

#: Jennrich draws, ALS runs from the best of them, and ALS sweeps (measured on trained width-8 MLPs at
#: d = 13: one ALS run from the best draw can end in a poor point at 10⁷ samples; ten runs do not)
DRAWS, STARTS, SWEEPS = 30, 10, 200

#: the β grid of the profile fit (a unit with |β| > 6 is on or off for all but 10⁻⁹ of the inputs)
BETA_GRID = np.linspace(-6.0, 6.0, 4801)


class WidthError(ValueError):
    """A width the stored orders cannot identify (the message names the limit and what would lift it)."""


def check_width(width: Optional[int], d: int) -> None:
    """Refuse, before any work, a width past what this method identifies (``k ≤ d``)."""
    if width is not None and width > d:
        raise WidthError(
            f"--method tensor learns complete widths, at most the input dimension (width {width} > d = {d}): the "
            "contracted moments live in a subspace of dimension at most d, so they hold at most d distinct units. "
            f"Wider (overcomplete) networks are identifiable from the full tensors of orders 4 (up to about "
            f"d(d+1)/2 = {d * (d + 1) // 2} units) and 6, which this version does not decompose; use a width ≤ {d}")


def required_statistics(d: int, width: Optional[int] = None) -> dict:
    """The first pass: ``basic`` (``E[y]``, ``E[y x]`` for the residual labels of the second) and the contracted
    orders 2 and 4 along random directions with the linear control variate (for the subspace)."""
    return {"basic": {}, "contracted": {"orders": [2, 4], "directions": 8, "control": True}}


def sample_sizes(d: int, k: int, m: int) -> tuple[int, int]:
    """Training and validation samples of the bounded sample: polish solves for ``k(d+1) + m(k+1)`` unknowns."""
    unknowns = k * (d + 1) + m * (k + 1)
    return max(20_000, 40 * unknowns), max(10_000, 10 * unknowns)


def profile(order: int | np.ndarray, beta: float | np.ndarray) -> np.ndarray:
    """``f_l(β) = E[relu(z + β) He_l(z)] = (−1)^l He_{l−2}(β) φ(β)`` for ``l ≥ 2`` (DESIGN.md §3)."""
    order, beta = np.asarray(order), np.asarray(beta, dtype=np.float64)
    return (-1.0) ** order * eval_hermitenorm(order - 2, beta) * np.exp(-0.5 * beta**2) / np.sqrt(2 * np.pi)


def _per_output(arrays: Arrays) -> list[dict[str, np.ndarray]]:
    """A contracted (or basic) group as one dict per output: arrays stacked along a leading ``output`` axis
    are sliced, shared ones repeated (a scalar label: one dict)."""
    if "output" not in arrays:
        return [dict(arrays)]
    m = len(np.asarray(arrays["output"]))
    scalar_ndim = {"M": 3, "M_se": 3, "control_mean": 0, "control_beta": 1, "y": 0, "y_se": 0, "yx": 1, "yx_se": 1}
    out = []
    for j in range(m):
        part = {}
        for key, value in arrays.items():
            value = np.asarray(value)
            part[key] = value[j] if key in scalar_ndim and value.ndim == scalar_ndim[key] + 1 else value
        out.append(part)
    return out


def _check(stats: Mapping[str, Arrays]) -> None:
    if "contracted" not in stats:
        raise MissingStatisticError.lacking("tensor", "contracted", "orders 2 and 4",
                                            "{orders: [2, 4], directions: 8, control: true}")
    orders = set(np.asarray(stats["contracted"]["pair_order"]).tolist())
    if 2 not in orders:
        raise MissingStatisticError(f"the 'tensor' method needs contracted order 2; this store has orders "
                                    f"{sorted(orders)}; set statistics.contracted.orders: [2, 4]")


def _subspace(outputs: list[dict], width: Optional[int]) -> spectral.Subspace:
    mats, ses, names = [], [], []
    for j, arrays in enumerate(outputs):
        m, s, n = spectral.matrices_from_store(arrays)
        mats, ses, names = mats + m, ses + s, names + [f"y{j}:{x}" for x in n]
    return spectral.relevant_subspace(mats, ses, rank=width, names=names)


def _order2(arrays: dict) -> tuple[np.ndarray, np.ndarray]:
    """``M_2`` and its standard errors of one output."""
    mats, ses, names = spectral.matrices_from_store(arrays, orders=[2])
    return mats[0], ses[0]


def _expansion(arrays: dict, basic: Optional[dict], basis: np.ndarray) -> dict[str, Any]:
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


def _slices(outputs: list[dict], passed: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                              np.ndarray, np.ndarray]:
    """Every slice of the CP tensor: order 2 of each output (first pass) and each (order, direction) of the
    higher-order pass; returns matrices, standard errors, and per slice its output, order and direction
    index (−1 for order 2), with the direction bank."""
    mats, ses, out_of, order_of, dir_of = [], [], [], [], []
    for j, arrays in enumerate(outputs):
        m2, s2 = _order2(arrays)
        mats.append(m2), ses.append(s2), out_of.append(j), order_of.append(2), dir_of.append(-1)
    g = np.asarray(passed[0]["direction"], dtype=np.float64)
    for j, arrays in enumerate(passed):
        po, pd = np.asarray(arrays["pair_order"]).astype(int), np.asarray(arrays["pair_direction"]).astype(int)
        for p in range(len(po)):
            if po[p] == 2:
                continue
            mats.append(np.asarray(arrays["M"][p])), ses.append(np.asarray(arrays["M_se"][p]))
            out_of.append(j), order_of.append(int(po[p])), dir_of.append(int(pd[p]))
    return (np.asarray(mats), np.asarray(ses), np.asarray(out_of), np.asarray(order_of), np.asarray(dir_of), g)


def _fit_profiles(weights: np.ndarray, scale: np.ndarray, directions: np.ndarray, out_of: np.ndarray,
                  order_of: np.ndarray, dir_of: np.ndarray, g: np.ndarray, m: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets ``β_i`` and output weights ``A`` (m × k) from the decomposition's weights on the noise-scaled
    slices: slice p holds ``A_{j_p i} f_{l_p}(β_i) <û_i, g_p>^{l_p−2} / scale_p``. For each unit, ``A`` is the
    least-squares answer at each β of :data:`BETA_GRID`, and the β of least residual is kept. Returns
    ``(β, A, relative residual per unit)``."""
    k = directions.shape[0]
    f = profile(order_of[:, None], BETA_GRID[None, :])  # (P, grid)
    onehot = (out_of[:, None] == np.arange(m)[None, :]).astype(np.float64)  # (P, m)
    beta, amp, resid = np.zeros(k), np.zeros((m, k)), np.zeros(k)
    for i in range(k):
        c = np.where(dir_of >= 0, (g @ directions[i])[np.maximum(dir_of, 0)], 1.0)
        base = c ** (order_of - 2) / scale  # (P,)
        target = weights[:, i]
        # per output j and grid point: A_j = Σ_p∈j t_p b_p f_p / Σ_p∈j (b_p f_p)²
        bf = base[:, None] * f  # (P, grid)
        num = onehot.T @ (target[:, None] * bf)  # (m, grid)
        den = onehot.T @ (bf * bf)
        a = num / np.where(den > 0, den, 1.0)
        res = float(target @ target) - np.sum(a * num, axis=0)  # the residual sum of squares per grid point
        best = int(np.argmin(res))
        beta[i], amp[:, i] = BETA_GRID[best], a[:, best]
        resid[i] = float(np.sqrt(max(res[best], 0.0) / max(float(target @ target), 1e-300)))
    return beta, amp, resid


def _orient(dirs: np.ndarray, beta: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray, dict]:
    """Which units to flip: fit the units (fixed directions and offsets) and an affine part on ``(x, y)``; the
    affine part's linear term is ``−Σ_{flipped} A_i û_i``. Returns the oriented directions, offsets, the flip
    indicators ``t`` (least squares, before rounding) and a report."""
    n, d = x.shape
    k = len(dirs)
    feats = np.maximum(x @ dirs.T + beta, 0.0)
    design = np.column_stack([feats, x, np.ones(n)])
    sol = np.linalg.lstsq(design, y, rcond=None)[0]  # (k + d + 1, m)
    amp, lin = sol[:k], sol[k:k + d]  # (k, m), (d, m)
    # lin[:, j] = −Σ_i t_i A_ij û_i: column i of the system is −vec(û_i A_iᵀ) over (d, m)
    system = -(dirs[:, :, None] * amp[:, None, :]).reshape(k, -1).T
    t = np.linalg.lstsq(system, lin.reshape(-1), rcond=None)[0]
    flip = t > 0.5
    sign = np.where(flip, -1.0, 1.0)
    report = {"flip_indicators": t.tolist(), "flipped": np.flatnonzero(flip).tolist(),
              "affine_norm": float(np.linalg.norm(lin)),
              "affine_left": float(np.linalg.norm(lin.reshape(-1) - system @ flip.astype(float)))}
    return sign[:, None] * dirs, sign * beta, t, report


def _start(dirs: np.ndarray, beta: np.ndarray, x: np.ndarray, y: np.ndarray) -> Network:
    """The network of oriented units, its output weights and biases by least squares on ``(x, y)``."""
    feats = np.column_stack([np.maximum(x @ dirs.T + beta, 0.0), np.ones(len(x))])
    sol = np.linalg.lstsq(feats, y, rcond=None)[0]
    return Network((dirs.copy(), sol[:-1].T.copy()), (beta.copy(), sol[-1].copy()), activation="relu")


def learn(stats: Mapping[str, Arrays], passes: Sequence[Mapping[str, Arrays]],
          samples: Callable[[int, int], Samples], *, width: Optional[int] = None,
          refine_samples: Optional[int] = None, mapper: Callable = map,
          seed: int = 0) -> LearnResult | PassRequest:
    """Learn ``y = A relu(U x + b) + c`` (one hidden ReLU layer, biases, m ≥ 1 outputs) of width ≤ d.

    Parameters
    ----------
    stats
        The main store's statistics (``contracted`` with order 2; ``basic`` when present).
    passes
        The higher-order pass this method asks for, once run.
    samples
        ``samples(n_train, n_val)`` draws bounded held-out samples from the source.
    width
        Hidden units wanted (default: the rank the noise floor supports); at most d.
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
    outputs = _per_output(stats["contracted"])
    d = np.asarray(outputs[0]["M"]).shape[-1]
    check_width(width, d)
    sub = _subspace(outputs, width)
    report: dict[str, Any] = {"subspace": sub.to_dict()}
    if sub.rank == 0:
        raise NoSignalError(
            "the spectral stage found no direction above the noise floor: the statistics are pure noise at this "
            "sample count; estimate with more samples (`relulearn estimate ... --samples N`)")
    k, basis = sub.rank, sub.basis
    if not passes:
        basic = _per_output(stats["basic"]) if "basic" in stats else [None] * len(outputs)
        g = spectral.directions_in_subspace(basis, max(8, 2 * k), seed)
        expansions = [_expansion(a, b, basis) for a, b in zip(outputs, basic)]
        return PassRequest(
            "tensor-1",
            {"contracted": {"orders": list(HIGHER_ORDERS), "directions": g.tolist(),
                            "expansion": expansions if "output" in stats["contracted"] else expansions[0]}},
            f"contracted orders {list(HIGHER_ORDERS)} along {len(g)} directions inside the {k}-dimensional subspace, "
            "on residual labels: the slices of the tensor the units are read from")
    passed = _per_output(passes[0]["contracted"])
    mats, ses, out_of, order_of, dir_of, g = _slices(outputs, passed)
    m = len(outputs)
    # each slice's noise in the subspace (entries of E roughly independent): slices of equal noise
    scale = np.sqrt(np.einsum("da,pde,eb->p", basis**2, ses**2, basis**2))
    scale = np.where(scale > 0, scale, 1.0)
    dec = cp.decompose(mats / scale[:, None, None], basis, seed=seed, draws=DRAWS, starts=STARTS, sweeps=SWEEPS)
    snr = np.linalg.norm(np.einsum("da,pde,eb->pab", basis, mats, basis), axis=(1, 2)) / scale
    beta, amp, prof_res = _fit_profiles(dec.weights, scale, dec.directions, out_of, order_of, dir_of, g, m)
    report["decomposition"] = {
        "slices": int(len(mats)), "relative_residual": dec.relative_residual, "weight_condition": dec.weight_condition,
        "slice_snr_by_order": {str(o): float(np.median(snr[order_of == o])) for o in sorted(set(order_of.tolist()))},
        "profile_residuals": prof_res.tolist(), "offsets": beta.tolist(), "output_weights": amp.tolist()}

    n_train, n_val = sample_sizes(d, k, m)
    smp = samples(n_train, n_val)
    y, y_val = smp.y_train.reshape(n_train, -1), smp.y_val.reshape(len(smp.y_val), -1)
    dirs, beta, _, report["orientation"] = _orient(dec.directions, beta, smp.x_train, y)
    start = _start(dirs, beta, smp.x_train, y)
    candidates = {"decomposition": start}
    try:
        if m == 1:
            polished, prep = polish(start, smp.x_train, y[:, 0])
        else:
            polished, prep = polish_outputs(start, smp.x_train, y)
        candidates["polish"] = polished
        report["polish"] = prep.__dict__
    except (ValueError, np.linalg.LinAlgError) as err:
        report["polish"] = {"error": str(err)}
    y2 = float(np.mean(y_val**2)) or 1.0
    losses = {name: float(np.mean((y_val - n.forward(smp.x_val)) ** 2) / y2) for name, n in candidates.items()}
    report["validation_relative_loss"] = losses
    report["chosen"] = min(losses, key=losses.get)
    net = candidates[report["chosen"]]
    if m == 1:
        total = int(np.asarray(stats["contracted"]["count"])) if refine_samples is None else int(refine_samples)
        net = refine_unless_exact(net, samples, total, smp, mapper, report)
    else:
        report["refinement"] = {"skipped": "the streamed refinement fits one output; polish fitted all outputs on "
                                           "the bounded sample"}
    report["width_requested"], report["width_found"] = width if width is not None else k, k
    if width is not None and k < width:
        report["unresolved"] = (f"{width} units were requested but the noise floor supports {k} directions at this "
                                "sample count: more samples raise the weaker units above it")
    return LearnResult(net, report)
