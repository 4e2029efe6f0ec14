"""Symmetric CP decomposition of stacked symmetric slices by simultaneous diagonalisation (Jennrich, then ALS).

Used by ``exact`` (per-output second moments) and ``tensor`` (contracted moments of several orders,
directions and outputs). The text below is written for ``exact``'s slices; any stack ``S_p = B diag(α_p) Bᵀ``
is decomposed the same way.

In a ``k``-dimensional basis ``W`` (d×k) of the relevant subspace, each output's second moment is

    S_j = Wᵀ T2_j W = B diag(α_j) Bᵀ,        B = Wᵀ [ν_1 … ν_k],   α_ji = κ2 U_ji |v_i|^c,

a symmetric CP decomposition of the ``m × k × k`` tensor ``(S_j)``. Jennrich's algorithm reads
``B`` off the eigenvectors of ``P Q⁻¹`` for two random output combinations
``P = Σ a_j S_j``, ``Q = Σ b_j S_j`` (``P Q⁻¹ = B diag(Uᵀa / Uᵀb) B⁻¹``); it needs
``rank(α) = k`` (so ``m ≥ k``) and is exact on exact moments. With estimated moments a few
draws are tried and the best fit kept, then alternating least squares on all outputs jointly
polishes the factors (the ALS fixed point is the least-squares decomposition, which uses every
output rather than two combinations of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

__all__ = ["TensorDecomposition", "decompose", "fit_weights"]

#: random output combinations tried by Jennrich's algorithm (the best fit is kept): a draw is
#: poor only when two eigenvalue ratios nearly coincide, which a handful of draws avoids
JENNRICH_DRAWS = 5

#: ALS sweeps after Jennrich: each costs O(m k³); convergence from Jennrich's start is fast
ALS_SWEEPS = 40

#: past this many components :func:`fit_weights` solves its normal equations (O(m k³)) instead of the k² × k
#: least-squares problem (O(k⁴): minutes at k = 500)
LSTSQ_MAX_COMPONENTS = 96

_TENSOR_STREAM = 0x7E4503  # separates this generator's stream from others keyed by the same seed


@dataclass(frozen=True)
class TensorDecomposition:
    """Result of :func:`decompose`.

    Attributes
    ----------
    directions
        ``(k, d)`` unit rows ``ν̂_i`` (signs arbitrary: second moments cannot see them).
    weights
        ``(m, k)`` ``α``: ``S_j ≈ Σ_i α_ji b_i b_iᵀ``.
    relative_residual
        ``sqrt(Σ_j |S_j − B diag(α_j) Bᵀ|² / Σ_j |S_j|²)`` of the kept decomposition.
    jennrich_residuals
        The same for each Jennrich draw (before ALS).
    weight_condition
        Condition number of ``α`` (its rank must be ``k``).
    """

    directions: np.ndarray
    weights: np.ndarray
    relative_residual: float
    jennrich_residuals: tuple[float, ...]
    weight_condition: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "relative_residual": float(self.relative_residual),
            "jennrich_residuals": [float(r) for r in self.jennrich_residuals],
            "weight_condition": float(self.weight_condition),
            "weights": self.weights.tolist(),
        }


def fit_weights(s: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Least-squares ``α`` with ``S_j ≈ B diag(α_j) Bᵀ`` for fixed ``B``; returns ``(α, relative residual)``.

    Parameters
    ----------
    s
        ``(m, k, k)`` the projected moments.
    b
        ``(k, r)`` columns ``b_i``.
    """
    m, k, _ = s.shape
    if b.shape[1] > LSTSQ_MAX_COMPONENTS:
        # the normal equations: the design's Gram is (BᵀB)∗(BᵀB) and its right-hand side diag(Bᵀ S_j B), O(m k³)
        # where the k² × r least-squares solve is O(k² r²); the residual is formed explicitly, not by cancellation
        alpha = _solve_gram(np.stack([np.sum(b * (sj @ b), axis=0) for sj in s]), (b.T @ b) ** 2)
        res = s - np.stack([(b * aj) @ b.T for aj in alpha])
    else:
        design = np.einsum("ai,bi->abi", b, b).reshape(k * k, -1)  # column i: vec(b_i b_iᵀ)
        sol, *_ = np.linalg.lstsq(design, s.reshape(m, k * k).T, rcond=None)
        alpha = sol.T
        res = s.reshape(m, -1) - alpha @ design.T
    norm = float(np.linalg.norm(s))
    return alpha, float(np.linalg.norm(res) / norm) if norm > 0 else float(np.linalg.norm(res))


def _unit_columns(b: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(b, axis=0)
    return b / np.where(n > 0, n, 1.0)


def _jennrich(s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    m, k, _ = s.shape
    a, c = rng.standard_normal(m), rng.standard_normal(m)
    p, q = np.tensordot(a, s, 1), np.tensordot(c, s, 1)
    # eigenvectors of P Q⁻¹ are the b_i. With estimated moments two close eigenvalue ratios can turn
    # into a complex pair λ ± iμ with eigenvectors v ± iw: their real parts are one vector twice (a
    # rank-deficient start that ALS cannot split), but span{v, w} holds the two true columns, so the
    # pair contributes v and w
    w, vec = np.linalg.eig(np.linalg.solve(q.T, p.T).T)
    cols = np.real(vec).copy()
    for i in np.flatnonzero(np.imag(w) > 0):
        j = int(np.argmin(np.abs(w - np.conj(w[i]))))  # its conjugate partner
        if j != i:
            cols[:, j] = np.imag(vec[:, i])
    return _unit_columns(cols)


def _als(s: np.ndarray, b: np.ndarray, sweeps: int) -> np.ndarray:
    """Alternating least squares on ``S_jab ≈ Σ_i α_ji B_ai C_bi`` from ``B = C = b``; returns the
    symmetrised factor ``(B + C)/2`` (columns sign-aligned, unit norm).

    Each update solves its normal equations: the Gram of a Khatri–Rao product is the Hadamard product of the
    factors' Grams (``(B ⊙ C)ᵀ(B ⊙ C) = BᵀB ∗ CᵀC``), and each right-hand side is one GEMM with the slices
    unfolded as ``m × k²``: ``α``'s against the columns ``vec(b_i c_iᵀ)``, and the sums ``M_i = Σ_j α_ji S_j``
    that both factors' right-hand sides (``M_i c_i``, ``M_iᵀ b_i``) read. With more slices than ``k²`` the
    unfolding is replaced by the ``R`` of its QR factorisation first: ``α`` lies in the unfolding's column
    space, so every iterate is the same in exact arithmetic, at ``k²`` rows instead of ``m``."""
    m, k, _ = s.shape
    if m <= k:  # few slices: the sums M_i (k³ numbers) would cost more than the slices' products
        return _als_few(s, b, sweeps)
    flat = s.reshape(m, k * k)
    if m > k * k:
        flat = np.asarray(np.linalg.qr(flat, mode="r"))
    bb, cc = b.copy(), b.copy()
    r = b.shape[1]
    for _ in range(sweeps):
        kr = (bb[:, None, :] * cc[None, :, :]).reshape(k * k, r)  # column i: vec(b_i c_iᵀ), row-major as S_j
        alpha = _solve_gram(flat @ kr, (bb.T @ bb) * (cc.T @ cc))
        sums = (alpha.T @ flat).reshape(r, k, k)  # M_i = Σ_j α_ji S_j
        bb = _solve_gram((sums @ cc.T[:, :, None])[:, :, 0].T, (alpha.T @ alpha) * (cc.T @ cc))
        cc = _solve_gram((bb.T[:, None, :] @ sums)[:, 0, :].T, (alpha.T @ alpha) * (bb.T @ bb))
        bb, cc = _unit_columns(bb), _unit_columns(cc)
    return _symmetrised(bb, cc)


def _als_few(s: np.ndarray, b: np.ndarray, sweeps: int) -> np.ndarray:
    """:func:`_als` for at most ``k`` slices: the right-hand sides from the products ``S_j C`` (one GEMM per
    slice serves both ``α``'s and ``B``'s), ``O(m k³)`` a sweep without forming the k sums ``M_i``."""
    bb, cc = b.copy(), b.copy()
    st = np.ascontiguousarray(s.transpose(0, 2, 1))
    for _ in range(sweeps):
        sc = s @ cc  # (m, k, r)
        alpha = _solve_gram(np.sum(bb[None] * sc, axis=1), (bb.T @ bb) * (cc.T @ cc))
        bb = _solve_gram(np.einsum("jai,ji->ai", sc, alpha), (alpha.T @ alpha) * (cc.T @ cc))
        cc = _solve_gram(np.einsum("jbi,ji->bi", st @ bb, alpha), (alpha.T @ alpha) * (bb.T @ bb))
        bb, cc = _unit_columns(bb), _unit_columns(cc)
    return _symmetrised(bb, cc)


def _symmetrised(bb: np.ndarray, cc: np.ndarray) -> np.ndarray:
    """``(B + C)/2`` with each pair of columns sign-aligned first, unit columns."""
    sign = np.sign(np.sum(bb * cc, axis=0))
    return _unit_columns(bb + np.where(sign == 0, 1.0, sign) * cc)


def _solve_gram(rhs: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """``rhs @ gram⁻¹`` (rows of ``rhs``) for a positive semidefinite k × k Gram, with a ridge of 10⁻¹² of its
    mean diagonal so that a singular Gram (collinear columns) gives a finite answer instead of an error."""
    ridge = 1e-12 * float(np.trace(gram)) / len(gram) + 1e-300
    return np.linalg.solve(gram + ridge * np.eye(len(gram)), rhs.T).T


def decompose(
    t2: Sequence[np.ndarray] | np.ndarray,
    basis: np.ndarray,
    *,
    seed: int = 0,
    draws: int = JENNRICH_DRAWS,
    sweeps: int = ALS_SWEEPS,
    starts: int = 1,
) -> TensorDecomposition:
    """Decompose ``T2_j = Σ_i α_ji ν_i ν_iᵀ`` inside ``span(basis)`` by simultaneous diagonalisation.

    Parameters
    ----------
    t2
        ``(m, d, d)`` per-output second moments ``E[A_j (x xᵀ − I)]``.
    basis
        ``(d, k)`` orthonormal basis of the span of the ``ν_i``.
    seed
        Seeds the random output combinations (``np.random.default_rng((seed, stream, draw))``).
    draws
        Jennrich draws; the one with the smallest residual starts ALS.
    sweeps
        ALS sweeps on all outputs jointly (0: Jennrich only).
    starts
        ALS runs from the ``starts`` best Jennrich draws; the one of least final residual is kept (with noisy
        slices the best draw before ALS is not always the best after it).

    Returns
    -------
    TensorDecomposition

    Raises
    ------
    ValueError
        With fewer than two slices. (Two slices whose weight ratios differ between components suffice for a
        unique answer, Kruskal's condition with ``B`` of rank k; ``exact`` needs ``α`` of rank k for its own
        reasons and checks ``m ≥ k`` itself.)
    """
    t2 = np.asarray(t2, dtype=np.float64)
    w = np.asarray(basis, dtype=np.float64)
    m, k = t2.shape[0], w.shape[1]
    if m < 2 and k > 1:
        raise ValueError(
            f"a decomposition into {k} components needs at least two slices (got {m}): Jennrich's "
            "algorithm compares two combinations of them"
        )
    s = w.T @ t2 @ w  # GEMMs: the three-operand einsum without a path is O(m d² k²)
    s = 0.5 * (s + s.transpose(0, 2, 1))
    best, residuals = None, []
    for draw in range(draws):
        rng = np.random.default_rng((int(seed), _TENSOR_STREAM, draw))
        try:
            b = _jennrich(s, rng)
        except np.linalg.LinAlgError:
            residuals.append(float("inf"))
            continue
        res = fit_weights(s, b)[1]
        residuals.append(res)
        if best is None or res < best[0]:
            best = (res, b)
    if best is None:
        raise ValueError(
            "Jennrich's algorithm failed on every draw: the output combinations were singular "
            "(the per-output weights do not have rank k)"
        )
    ranked = sorted((r, i) for i, r in enumerate(residuals) if np.isfinite(r))[: max(1, int(starts))]
    kept: tuple[float, np.ndarray, np.ndarray] | None = None
    for _, draw in ranked:
        rng = np.random.default_rng((int(seed), _TENSOR_STREAM, draw))
        start = _jennrich(s, rng)
        b = _als(s, start, sweeps) if sweeps > 0 else start
        alpha, res = fit_weights(s, b)
        if res > residuals[draw]:  # ALS never should make it worse; keep its start if it does
            b = start
            alpha, res = fit_weights(s, b)
        if kept is None or res < kept[0]:
            kept = (res, b, alpha)
    res, b, alpha = cast(tuple[float, np.ndarray, np.ndarray], kept)  # set: `best` had a finite residual
    nu = (w @ b).T
    norms = np.linalg.norm(nu, axis=1)
    nu = nu / norms[:, None]
    alpha = alpha * norms[None, :] ** 2  # b_i b_iᵀ = |Wb_i|² ν̂ ν̂ᵀ in the input space
    sv = np.linalg.svd(alpha, compute_uv=False)
    cond = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
    return TensorDecomposition(nu, alpha, res, tuple(residuals), cond)
