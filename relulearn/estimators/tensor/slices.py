"""The CP tensor of the tensor method (:mod:`.tensor.entry`): its slices from the stored statistics and the pass (the
contracted matrices of the complete route, the flattened full tensors of the lifted one, the outputs' ``T_2``
and ``T_1``), each with its noise level, and their decomposition into units (directions, offsets, output
weights)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base import Arrays
from ..spectral import cp
from ..spectral.stored_matrices import matrices_from_store
from . import lifted
from .profile import _fit_profiles

#: Jennrich draws, ALS runs from the best of them, and ALS sweeps (measured on trained width-8 MLPs at
#: d = 13: one ALS run from the best draw can end in a poor point at 10⁷ samples; ten runs do not)
DRAWS, STARTS, SWEEPS = 30, 10, 200

#: contraction directions of the overcomplete route's pass (T_5(g) and T_6(g, g) slices)
LIFTED_DIRECTIONS = 8

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


def _has_outputs(stats: Mapping[str, Arrays]) -> bool:
    """A store of the :func:`.tensor.plan.outputs_route`: ``output_moments`` of two or more outputs."""
    om = stats.get("output_moments")
    return (
        om is not None and all(k in om for k in ("T1", "T1_se", "T2", "T2_se")) and np.asarray(om["T2"]).shape[0] >= 2
    )


def _count(stats: Mapping[str, Arrays]) -> int:
    """The samples the store's statistics were estimated from."""
    return int(np.asarray(stats["contracted" if "contracted" in stats else "output_moments"]["count"]))


def _order2(arrays: dict) -> tuple[np.ndarray, np.ndarray]:
    """``M_2`` and its standard errors of one output."""
    mats, ses, _ = matrices_from_store(arrays, orders=[2])
    return mats[0], ses[0]


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


def _outputs_slices(om: Arrays) -> Slices:
    """Each output's ``T_2`` as a slice and its ``T_1`` as a vector (order 1: ``Σ_i A_ji Φ(β_i) û_i``)."""
    t2, s2 = np.asarray(om["T2"], dtype=np.float64), np.asarray(om["T2_se"], dtype=np.float64)
    t1, s1 = np.asarray(om["T1"], dtype=np.float64), np.asarray(om["T1_se"], dtype=np.float64)
    m, d = t1.shape
    none = tuple(np.zeros((0, d)) for _ in range(m))
    vectors = Slices(t1, s1, np.arange(m), np.ones(m, dtype=int), none, False)
    return Slices(0.5 * (t2 + t2.transpose(0, 2, 1)), s2, np.arange(m), np.full(m, 2), none, False, vectors)


def _complete_slices(outputs: list[dict], passed: list[dict]) -> Slices:
    """Order 2 of each output (first pass) and each (order, direction) of the higher-order pass, d × d: a pass of
    the full ``contracted`` family (stores made before the pass was estimated in the subspace)."""
    order2 = [_order2(arrays) for arrays in outputs]
    return _slices(order2, passed, len(order2[0][0]))


def _slices(order2: list[tuple[np.ndarray, np.ndarray]], passed: list[dict], dim: int) -> Slices:
    """The slices of ``order2`` (each output's ``T_2`` and its standard errors) and of each output's pass
    (``passed``: its (order, direction) pairs of order ≥ 3), in coordinates of dimension ``dim``."""
    mats, ses, out_of, order_of, conts = [], [], [], [], []
    for j, (m2, s2) in enumerate(order2):
        mats.append(m2)
        ses.append(s2)
        out_of.append(j)
        order_of.append(2)
        conts.append(np.zeros((0, dim)))
    for j, arrays in enumerate(passed):
        mat, se, order, cont = _pass_pairs(arrays)
        mats += mat
        ses += se
        out_of += [j] * len(mat)
        order_of += order
        conts += cont
    return Slices(np.asarray(mats), np.asarray(ses), np.asarray(out_of), np.asarray(order_of), tuple(conts), False)


def _projected_slices(outputs: list[dict], passed: list[dict]) -> tuple[Slices, np.ndarray]:
    """The complete route's slices in the coordinates of the pass's subspace (``projected_contracted``: k × k),
    and its basis ``B`` (rows, k × d): a unit ``û`` of the subspace is ``B û`` there.

    Order 2 of each output (first pass, d × d) is restricted to the subspace, ``B M_2 Bᵀ``, with the standard
    errors :func:`_noise_scale` gives each entry of a restricted matrix (entries taken as independent); the
    pass's slices, estimated in the subspace, come with their own standard errors. Only the sum of an
    in-subspace slice's entry variances is read (:func:`_noise_scale` with the identity basis), and that sum is
    ``E‖noise‖²_F``, the same in any orthonormal coordinates of the subspace: the decomposition's own basis of
    it may differ from ``B`` by a rotation without changing the slices' weights. Lifting the k × k standard
    errors to d × d instead would not be right: an entry's standard error does not transform linearly."""
    basis = np.asarray(passed[0]["basis"], dtype=np.float64)
    order2 = []
    for arrays in outputs:
        m2, s2 = _order2(arrays)
        order2.append(
            (basis @ m2 @ basis.T, np.sqrt(np.einsum("ad,de,be->ab", basis**2, s2**2, basis**2, optimize=True)))
        )
    return _slices(order2, passed, len(basis)), basis


def _pass_pairs(arrays: dict) -> tuple[list, list, list, list]:
    """One output's (order, direction) pairs of the pass past order 2: matrices, standard errors, orders, and
    each one's contraction directions (its direction, ``order − 2`` times)."""
    g = np.asarray(arrays["direction"], dtype=np.float64)
    po, pd = np.asarray(arrays["pair_order"]).astype(int), np.asarray(arrays["pair_direction"]).astype(int)
    keep = [p for p in range(len(po)) if po[p] != 2]
    return (
        [np.asarray(arrays["M"][p]) for p in keep],
        [np.asarray(arrays["M_se"][p]) for p in keep],
        [int(po[p]) for p in keep],
        [np.repeat(g[pd[p]][None, :], po[p] - 2, 0) for p in keep],
    )


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
