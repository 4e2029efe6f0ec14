"""The Gauss–Newton matrices of the streamed refinement (:mod:`.polish.streamed`) and their solves.

:class:`PopulationGram` inverts the population Gram of the activation patterns of an unbiased network
in closed form under Gaussian inputs (the module docstring of :mod:`.polish.streamed`); :class:`SampleGram`
forms the Gram of a biased network on a bounded sample.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pair_second_moment", "PopulationGram", "GRAM_ROWS_PER_UNKNOWN", "SampleGram"]


def pair_second_moment(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``E[1{<a,z> > 0} 1{<b,z> > 0} z zᵀ]`` for ``z ~ N(0, I_q)`` and unit ``a``, ``b``.

    In the plane of ``a`` and ``b`` (angle θ), with ``e1 = a`` and ``e2`` the unit part of ``b``
    orthogonal to ``a``, the region is the arc ``(θ − π/2, π/2)`` and ``E[r²] = 2``, so the 2×2 block is
    ``(1/π) ∫ e(φ) e(φ)ᵀ dφ``; orthogonally to the plane the factor is ``P = (π − θ)/2π``.
    """
    q = len(a)
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    c = float(np.clip(a @ b, -1.0, 1.0))
    perp = b - c * a
    sin = float(np.linalg.norm(perp))
    theta = float(np.arctan2(sin, c))  # arccos(c) loses half the digits near c = ±1
    p = (np.pi - theta) / (2 * np.pi)
    out = p * np.eye(q)
    if sin < 1e-12:  # (anti)parallel: the plane block is p·I too (θ = 0: 1/2; θ = π: 0)
        return out
    e = np.stack([a, perp / sin], axis=1)  # q × 2
    half = (np.pi - theta) / 2
    block = (
        np.array([[half + np.sin(2 * theta) / 4, sin * sin / 2], [sin * sin / 2, half - np.sin(2 * theta) / 4]]) / np.pi
    )
    return out + e @ (block - p * np.eye(2)) @ e.T


def _orthant(a: np.ndarray, b: np.ndarray) -> float:
    """``P(<a,z> > 0, <b,z> > 0) = (π − θ)/2π`` for unit ``a``, ``b`` (θ from atan2, as above)."""
    c = float(a @ b)
    return (np.pi - float(np.arctan2(np.linalg.norm(b - c * a), c))) / (2 * np.pi)


class PopulationGram:
    """The Gauss–Newton matrix ``E[J Jᵀ]`` of ``f = Σ s_i relu(<w_i, x>)`` under ``x ~ N(0, I)``,
    inverted in closed form (module docstring): ``solve(G)`` returns ``Δ`` (k × d) with ``H Δ = G``."""

    def __init__(self, w: np.ndarray, s: np.ndarray):
        k, d = w.shape
        norms = np.linalg.norm(w, axis=1)
        if np.any(norms == 0):
            raise ValueError("a hidden row is zero: its unit has no direction to refine; drop it first")
        u, sv, _ = np.linalg.svd(w.T, full_matrices=False)
        self.q = u[:, sv > sv[0] * 1e-12]  # d × q, orthonormal basis of span(W)
        a = (w / norms[:, None]) @ self.q  # k × q unit rows in the basis
        a /= np.linalg.norm(a, axis=1, keepdims=True)
        qd = self.q.shape[1]
        self.p = np.zeros((k, k))
        kmat = np.zeros((k, qd, k, qd))
        for i in range(k):  # k² blocks of q × q: tiny next to a pass
            for j in range(i, k):
                c = s[i] * s[j] * pair_second_moment(a[i], a[j])
                kmat[i, :, j, :], kmat[j, :, i, :] = c, c.T
                # the factor orthogonal to span(W): P_ij = c's eigenvalue off the pair's plane
                self.p[i, j] = self.p[j, i] = s[i] * s[j] * _orthant(a[i], a[j])
        self.k = kmat.reshape(k * qd, k * qd)

    def solve(self, g: np.ndarray) -> np.ndarray:
        k = g.shape[0]
        inside = g @ self.q  # k × q
        outside = g - inside @ self.q.T
        # lstsq: two units along one direction make both blocks singular; the minimum-norm step is right
        d_out = np.linalg.lstsq(self.p, outside, rcond=1e-12)[0]
        d_in = np.linalg.lstsq(self.k, inside.ravel(), rcond=1e-12)[0].reshape(k, -1)
        return d_out + d_in @ self.q.T


#: rows of the bounded sample the Gram of a biased network is formed on: this many per unknown (its error
#: against the population Gram, O(√(1/ratio)), is the contraction per pass), at least 2,000
GRAM_ROWS_PER_UNKNOWN = 8


class SampleGram:
    """The Gauss–Newton matrix of a biased network (:func:`.streamed._split_biased`) on a bounded sample ``x``: with
    biases the patterns are halfspaces off the origin, with no closed form as in :class:`PopulationGram`,
    so ``JᵀJ / m`` is formed on at most ``GRAM_ROWS_PER_UNKNOWN`` rows per unknown of the sample."""

    def __init__(self, x: np.ndarray, w: np.ndarray, s: np.ndarray):
        k, dt = len(s) - 1, w.shape[1]
        unknowns = k * dt + 1
        m = int(min(len(x), max(2_000, GRAM_ROWS_PER_UNKNOWN * unknowns)))
        xt = np.column_stack([x[:m], np.ones(m)])
        act = (xt @ w[:k].T > 0) * s[:k]  # m × k
        jac = np.column_stack([(act[:, :, None] * xt[:, None, :]).reshape(m, k * dt), np.ones(m)])
        self.h, self.k, self.dt = jac.T @ jac / m, k, dt

    def solve(self, g: np.ndarray) -> np.ndarray:
        rhs = np.r_[g[: self.k].ravel(), g[self.k, -1]]
        sol = np.linalg.lstsq(self.h, rhs, rcond=1e-12)[0]
        out = np.zeros_like(g)
        out[: self.k] = sol[:-1].reshape(self.k, self.dt)
        out[self.k, -1] = sol[-1]
        return out
