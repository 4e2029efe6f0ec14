"""Lifting to symmetric matrices: the CP slices of wide (overcomplete) networks from full Hermite tensors.

A one-hidden-layer network wider than its input (``k > d``) has more units than any ``d × d`` moment matrix
can hold apart. One level up they separate: with ``v_i = û_i û_iᵀ`` seen as a vector of the space ``Sym²``
of symmetric matrices (dimension ``D = d(d+1)/2``), every full Hermite tensor of order ``l ≥ 4`` contracted
``l − 4`` times along directions ``g`` is, flattened, a ``D × D`` matrix

    T_l(g^{⊗(l−4)}, ·, ·, ·, ·) = Σ_i A_i f_l(β_i) <û_i, g>^{l−4} v_i v_iᵀ,

so the stack of these slices is a symmetric CP tensor with factors ``v_i``, decomposed like the contracted
slices of complete widths (:mod:`.spectral.cp`) as long as the ``v_i`` are linearly independent: ``k ≤ D``. Each
``v_i`` is then a rank-one symmetric matrix whose top eigenvector is ``±û_i``.

The flattening is isometric: ``Sym²`` gets the orthonormal basis ``E_ii`` and ``(E_ij + E_ji)/√2`` (``i < j``),
in which ``|û ûᵀ| = 1`` and inner products are traces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import comb
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import hermite

if TYPE_CHECKING:
    from ...network import Network

__all__ = [
    "lifted_route",
    "lifted_dimension",
    "max_order",
    "lift_matrix",
    "lift_vector",
    "embed",
    "LiftedSlices",
    "slices",
    "vectors",
    "units",
    "spm",
    "ResidualTensors",
    "residual_tensors",
]

#: a full tensor is unpacked to contract it: at most this many entries (d^l), 1.6·10⁸ bytes
UNPACK_ENTRIES = 20_000_000

#: packed entries of the highest order estimated per sample, at most (its cost per sample)
ORDER_ENTRIES = 300_000


def lifted_dimension(d: int) -> int:
    """``D = d(d+1)/2``: the dimension of ``Sym²(R^d)`` and the most units the lifted slices hold apart."""
    return d * (d + 1) // 2


def lifted_route(d: int) -> bool:
    """Whether networks wider than ``d`` can be separated here: the full ``T_4`` (``C(d+3, 4)`` entries per
    sample) within :data:`ORDER_ENTRIES` and its unpacking within :data:`UNPACK_ENTRIES` (d ≤ 50)."""
    return comb(d + 3, 4) <= ORDER_ENTRIES and d**4 <= UNPACK_ENTRIES


def max_order(d: int) -> int:
    """The highest order estimated at input dimension ``d``: 6 where its packed tensor has at most
    :data:`ORDER_ENTRIES` entries and unpacks to at most :data:`UNPACK_ENTRIES` (the slices ``T_4``, ``T_5(g)``,
    ``T_6(g, g)`` are decomposed jointly), else 4 (``T_4`` alone, by the subspace power method). Order 5 alone
    is not enough: ``f_5(β) ≈ 3βφ(β)`` vanishes for the many units of trained networks with ``β ≈ 0``, which then
    all share one weight ratio and cannot be told apart."""
    if comb(d + 5, 6) <= ORDER_ENTRIES and d**6 <= UNPACK_ENTRIES:
        return 6
    return 4


def _pairs(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    i, j = np.triu_indices(d)
    return i, j, np.where(i == j, 1.0, np.sqrt(2.0))


def lift_matrix(full4: np.ndarray) -> np.ndarray:
    """The ``D × D`` isometric flattening of a symmetric order-4 tensor ``(d, d, d, d)``."""
    d = full4.shape[0]
    i, j, s = _pairs(d)
    return full4[i[:, None], j[:, None], i[None, :], j[None, :]] * s[:, None] * s[None, :]


def lift_vector(mat: np.ndarray) -> np.ndarray:
    """The isometric coordinates of a symmetric ``d × d`` matrix in ``Sym²``: (D,)."""
    i, j, s = _pairs(mat.shape[0])
    return mat[i, j] * s


def embed(directions: np.ndarray) -> np.ndarray:
    """``vec(û ûᵀ)`` of each row ``û`` in the isometric coordinates of ``Sym²``: (k, D), unit rows for unit ``û``."""
    i, j, s = _pairs(directions.shape[1])
    return directions[:, i] * directions[:, j] * s


@dataclass(frozen=True)
class LiftedSlices:
    """Slices ``(P, D, D)`` with standard errors, and per slice its order and its contraction directions
    (``contractions[p]``: ``(l_p − 4, d)`` rows ``g``)."""

    matrices: np.ndarray
    ses: np.ndarray
    orders: np.ndarray
    contractions: tuple[np.ndarray, ...]


def _contract(full: np.ndarray, g: np.ndarray, times: int) -> np.ndarray:
    for _ in range(times):
        full = np.tensordot(g, full, axes=(0, 0))
    return full


def slices(arrays: Mapping[str, np.ndarray], d: int, directions: np.ndarray) -> LiftedSlices:
    """The lifted slices of a ``hermite`` store's tensors: ``T_4`` itself, and ``T_5(g)``, ``T_6(g, g)`` for each
    row ``g`` of ``directions`` where those orders are stored.

    Standard errors are propagated as for independent entries (``se² ↦ Σ g² se²`` per contraction).
    """
    mats, ses, orders, conts = [], [], [], []
    stored = [l for l in (4, 5, 6) if f"T{l}" in arrays]
    if 4 not in stored:
        raise ValueError("the lifted slices need the full tensor T_4 (statistics.hermite with max_order ≥ 4)")
    for l in stored:
        t = hermite.unpack(np.asarray(arrays[f"T{l}"], dtype=np.float64), d, l)
        s2 = hermite.unpack(np.asarray(arrays[f"T{l}_se"], dtype=np.float64), d, l) ** 2
        for g in directions if l > 4 else directions[:1]:
            times = l - 4
            mats.append(lift_matrix(_contract(t, g, times)))
            ses.append(lift_matrix(np.sqrt(_contract(s2, g * g, times))))
            orders.append(l)
            conts.append(np.repeat(g[None, :], times, axis=0))
    return LiftedSlices(np.asarray(mats), np.asarray(ses), np.asarray(orders), tuple(conts))


def vectors(
    arrays: Mapping[str, np.ndarray], d: int, directions: np.ndarray
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """``T_3(g)`` for each row ``g`` of ``directions`` as vectors of ``Sym²`` (``Σ_i A_i f_3(β_i) <û_i, g> v_i``):
    linear in the factors, they give each unit's order-3 weight once the factors are known (orders 4–6 alone
    confuse ``β ≈ 0`` with ``|β| ≈ 1.75``). Returns ``(vectors (G, D), standard errors, contractions)``."""
    t = hermite.unpack(np.asarray(arrays["T3"], dtype=np.float64), d, 3)
    s2 = hermite.unpack(np.asarray(arrays["T3_se"], dtype=np.float64), d, 3) ** 2
    vec = np.stack([lift_vector(np.tensordot(g, t, axes=(0, 0))) for g in directions])
    se = np.stack([lift_vector(np.sqrt(np.tensordot(g * g, s2, axes=(0, 0)))) for g in directions])
    return vec, se, tuple(g[None, :] for g in directions)


def units(factors: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unit directions held by lifted factors: rows ``(k, D)`` of unit norm, each ideally ``±û ûᵀ``.

    Returns
    -------
    (directions, signs, rank_one)
        ``(k, d)`` unit rows ``û_i`` (orientation arbitrary), ``±1`` with ``v_i ≈ ±û_i û_iᵀ`` (the weights of a
        factor found as ``−ûûᵀ`` change sign), and ``|λ_max| / |v_i|`` (1 for an exact rank-one factor).
    """
    i, j, s = _pairs(d)
    k = len(factors)
    out, signs, quality = np.zeros((k, d)), np.ones(k), np.zeros(k)
    for a, v in enumerate(factors):
        mat = np.zeros((d, d))
        mat[i, j] = v / s
        mat[j, i] = v / s
        lam, vec = np.linalg.eigh(mat)
        top = int(np.argmax(np.abs(lam)))
        out[a], signs[a] = vec[:, top], np.sign(lam[top]) or 1.0
        quality[a] = abs(lam[top]) / max(float(np.linalg.norm(v)), 1e-300)
    return out, signs, quality


@dataclass(frozen=True)
class ResidualTensors:
    """Picklable: the Hermite tensors ``T_2 … T_L`` of the labels a network leaves, ``y − f̂(x)``, on one
    independent part of a sample draw (what a mapper runs on a worker). The residual of a nearly right network
    is small, so its tensors are estimated far more precisely than the stored ones from the same count."""

    draw: object
    network: Network
    max_order: int

    def __call__(self, item: tuple[int, int]) -> dict[str, np.ndarray]:
        from ..base import part_batches

        p, n = item
        raw: Any = None  # the moment sums per order: a list once a batch is added
        for x, y in part_batches(self.draw, p, n):
            r = y.reshape(len(y), -1) - self.network.forward(x)
            got = [
                np.stack(s)
                for s in zip(*(hermite.raw_moment_sums_upto(x, r[:, j], self.max_order) for j in range(r.shape[1])))
            ]
            raw = got if raw is None else [a + b for a, b in zip(raw, got)]
        d = self.network.input_dim
        return {
            f"T{l}": np.stack(
                [hermite.raw_to_hermite({m: raw[m][j] / n for m in range(l + 1)}, d, l) for j in range(len(raw[0]))]
            )
            for l in range(2, self.max_order + 1)
        }


def residual_tensors(
    draw: object, network: Network, max_order: int, parts: list[tuple[int, int]], mapper=map
) -> list[dict[str, np.ndarray]]:
    """Per output, the tensors ``T_2 … T_L`` of the residual labels ``y − f̂(x)`` over ``parts`` (``(part id,
    rows)``, equal sizes) with standard errors from the spread of the parts' means: arrays named as a
    ``hermite`` store's (``T4``, ``T4_se``, …)."""
    got = list(mapper(ResidualTensors(draw, network, max_order), parts))
    out = []
    for j in range(len(got[0]["T2"])):
        arrays = {}
        for key in got[0]:
            vals = np.stack([g[key][j] for g in got])
            arrays[key] = vals.mean(axis=0)
            arrays[f"{key}_se"] = vals.std(axis=0, ddof=1) / np.sqrt(len(vals))
        out.append(arrays)
    return out


#: SPM: random starts per component, iterations per start, and the tolerance of the gradient on the sphere
SPM_TRIES, SPM_ITERATIONS, SPM_TOL = 4, 300, 1e-12


def spm(core: np.ndarray, basis: np.ndarray, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The subspace power method (Kileel–Pereira 2021) for ``M = Σ_i λ_i v_i v_iᵀ``, ``v_i = vec(a_i a_iᵀ)``.

    ``M`` is given inside its k-dimensional column space: ``M = Q core Qᵀ`` (``basis`` Q: D × k orthonormal).
    Each ``a`` with ``vec(a aᵀ)`` in that space is a maximum of ``F(a) = |Qᵀ vec(a aᵀ)|²`` (= 1) on the unit
    sphere, reached by the shifted power iteration ``a ← S a + √(3/2)·√F · a`` (``S`` the projection of
    ``a aᵀ`` on the space, as a matrix). The best of several random starts is a component; its weight is
    ``1 / (wᵀ core⁻¹ w)`` (``w = Qᵀ v``), and deflating it takes one dimension off the space. Works for k up to
    about the dimension of the space, well beyond d.

    Returns
    -------
    (directions, weights)
        ``(k, d)`` unit rows ``a_i`` (signs arbitrary) and their weights ``λ_i``.
    """
    rng = np.random.default_rng((int(seed), _SPM_STREAM))
    q, core = np.array(basis, dtype=np.float64), 0.5 * (core + core.T)
    i, j, s = _pairs(d)
    shift = np.sqrt(1.5)  # √(2(n2−1)/n2) for order n2 = 4: the power iteration then increases F
    found, weights = [], []
    while q.shape[1] > 0:

        def power(a: np.ndarray, iterations: int) -> tuple[float, np.ndarray]:
            for _ in range(iterations):
                w = q.T @ (a[i] * a[j] * s)
                proj = q @ w / s
                mat = np.zeros((d, d))
                mat[i, j] = proj
                mat[j, i] = proj
                g = mat @ a
                if np.linalg.norm(g - (g @ a) * a) < SPM_TOL:  # the gradient of F on the sphere
                    break
                a = g + shift * np.sqrt(float(w @ w)) * a
                a /= np.linalg.norm(a)
            w = q.T @ (a[i] * a[j] * s)
            return float(w @ w), a

        starts = [power(a / np.linalg.norm(a), SPM_ITERATIONS) for a in rng.standard_normal((SPM_TRIES, d))]
        # the best start, iterated on to convergence (the rate is linear, slow where components are close)
        _, a = power(max(starts, key=lambda t: t[0])[1], 20 * SPM_ITERATIONS)
        w = q.T @ (a[i] * a[j] * s)
        lam = 1.0 / float(w @ np.linalg.lstsq(core, w, rcond=1e-12)[0])
        found.append(a)
        weights.append(lam)
        # deflate: core − λ w wᵀ has rank k − 1 inside the space; keep its k − 1 strongest eigenvectors
        mu, vec = np.linalg.eigh(core - lam * np.outer(w, w))
        keep = np.sort(np.argsort(-np.abs(mu))[: q.shape[1] - 1])
        q, core = q @ vec[:, keep], np.diag(mu[keep])
    return np.asarray(found), np.asarray(weights)


_SPM_STREAM = 0x5B3A  # separates the SPM starts' stream from others keyed by the same seed
