"""The profile maths of the tensor method (:mod:`.tensor.entry`): a unit ``relu(<û, x> + β)`` weighs in the Hermite
moment of order ``l`` by ``f_l(β)`` (its *profile*), and its offset ``β`` and output weights follow from its
weights across the slices by a least-squares fit on a grid of β."""

from __future__ import annotations

import numpy as np
from scipy.special import eval_hermitenorm, ndtr

__all__ = ["BETA_GRID", "profile"]

#: the β grid of the profile fit (a unit with |β| > 6 is on or off for all but 10⁻⁹ of the inputs)
BETA_GRID = np.linspace(-6.0, 6.0, 4801)


def profile(order: int | np.ndarray, beta: float | np.ndarray) -> np.ndarray:
    """``f_l(β) = E[relu(z + β) He_l(z)] = (−1)^l He_{l−2}(β) φ(β)`` for ``l ≥ 2`` (docs/design.md §3), and
    ``f_1(β) = Φ(β)``."""
    order, beta = np.broadcast_arrays(np.asarray(order), np.asarray(beta, dtype=np.float64))
    high = (
        (-1.0) ** order * eval_hermitenorm(np.maximum(order, 2) - 2, beta) * np.exp(-0.5 * beta**2) / np.sqrt(2 * np.pi)
    )
    return np.where(order == 1, ndtr(beta), high)


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
