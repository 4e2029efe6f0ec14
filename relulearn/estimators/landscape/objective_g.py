"""The designed objective G of Ge–Lee–Ma (2017) on whitened moment tensors, and its minimization.

After whitening by the second moment (``T̃_2 = I`` on the subspace, their Appendix A), the
fourth moment of ``y = Σ_i a_i σ(<b_i, x>)`` with ``a_i ≥ 0`` is an orthogonal tensor
``T̃_4 = Σ_i α_i ũ_i^{⊗4}`` (``ũ_i`` orthonormal, every ``α_i`` of the sign of ``σ̂_4``). With
``T = sign(σ̂_4) T̃_4 = Σ_i β_i ũ_i^{⊗4}``, ``β_i > 0``, the objective over the rows ``b_j`` of
``B`` (m × r) is::

    G(B) = Σ_{j≠k} T(b_j, b_j, b_k, b_k) − μ Σ_j T(b_j, b_j, b_j, b_j) + λ Σ_j (|b_j|² − 1)²,

whose local minima are all global, at ``B`` = the ``ũ_i`` up to permutation and sign (their
Theorem 2.3, for ``μ`` small against ``1/κ``, ``κ = β_max / β_min``, and ``λ`` large against
``β_max``). With ``S`` the m × r² matrix of the flattened ``b_j b_jᵀ`` and ``T`` as an
r² × r² matrix, all pair values are ``C = S T Sᵀ``, one GEMM, and the gradient of row j is
``4 (Σ_{k≠j} R_k − μ R_j) b_j + 4 λ (|b_j|² − 1) b_j`` with ``R = S T`` (rows as r × r).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize

__all__ = ["GParameters", "StartResult", "g_value_grad", "minimize_g", "best_start", "row_angles", "distinct_rows"]


@dataclass(frozen=True)
class GParameters:
    """``μ`` and ``λ`` of G, with what they were set from (JSON-ready through ``to_dict``)."""

    mu: float
    lam: float
    beta_max: float
    beta_min: float
    noise: float

    def to_dict(self) -> dict:
        return {
            "mu": self.mu,
            "lambda": self.lam,
            "beta_max": self.beta_max,
            "beta_min": self.beta_min,
            "noise": self.noise,
        }


def g_value_grad(b: np.ndarray, tmat: np.ndarray, mu: float, lam: float) -> tuple[float, np.ndarray]:
    """G and its gradient at ``b`` (m, r) for the sign-corrected tensor ``tmat`` (r², r²)."""
    m, r = b.shape
    s = (b[:, :, None] * b[:, None, :]).reshape(m, r * r)
    rr = s @ tmat  # (m, r²): row k is T(b_k, b_k, ·, ·)
    c = rr @ s.T  # C_jk = T(b_j, b_j, b_k, b_k)
    diag = np.diag(c).copy()
    norms = np.einsum("ij,ij->i", b, b) - 1.0
    value = float(c.sum() - diag.sum() - mu * diag.sum() + lam * np.dot(norms, norms))
    rsum = rr.sum(axis=0)
    # Σ_{k≠j} R_k − μ R_j, applied to b_j, for every j at once
    w = (rsum[None, :] - (1.0 + mu) * rr).reshape(m, r, r)
    grad = 4.0 * np.einsum("jab,jb->ja", w, b) + 4.0 * lam * norms[:, None] * b
    return value, grad


def row_angles(b: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """For each row of ``truth``, the angle (radians, sign-blind) to its matched row of ``b``
    (Hungarian matching on |cos|)."""
    from scipy.optimize import linear_sum_assignment

    bn = b / np.linalg.norm(b, axis=1, keepdims=True)
    tn = truth / np.linalg.norm(truth, axis=1, keepdims=True)
    cos = np.abs(tn @ bn.T)
    rows, cols = linear_sum_assignment(-cos)
    return np.arccos(np.clip(cos[rows, cols], 0.0, 1.0))


def distinct_rows(b: np.ndarray, *, angle: float = 0.3) -> int:
    """How many rows of ``b`` are distinct up to sign: greedy groups of rows within ``angle``."""
    bn = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-300)
    cos = np.abs(bn @ bn.T)
    left = list(range(len(b)))
    groups = 0
    while left:
        i = left[0]
        left = [j for j in left if cos[i, j] < np.cos(angle)]
        groups += 1
    return groups


@dataclass(frozen=True)
class StartResult:
    """What one start of the minimization reached."""

    start: int
    value: float
    iterations: int
    converged: bool
    b: np.ndarray
    distinct: int
    max_cross_cos: float  # largest |cos| between two rows: 0 for an orthonormal answer
    unbounded: bool
    trace: tuple[float, ...] = ()  # G at the start and after every iteration

    def to_dict(self) -> dict:
        return {
            "start": self.start,
            "G": self.value,
            "iterations": self.iterations,
            "converged": self.converged,
            "distinct_rows": self.distinct,
            "max_cross_cos": self.max_cross_cos,
            "unbounded": self.unbounded,
            "trace": thin_trace(self.trace),
        }


#: points of a start's G trace kept in a report (log-spaced in the iteration: the early descent and the end)
TRACE_POINTS = 80


def thin_trace(trace: tuple[float, ...], points: int = TRACE_POINTS) -> list[list[float]]:
    """``[[iteration, G], ...]`` at about ``points`` iterations spaced evenly in log(1 + iteration), the first
    and the last included."""
    if not trace:
        return []
    last = len(trace) - 1
    keep = np.unique(np.round(np.expm1(np.linspace(0.0, np.log1p(last), points))).astype(int))
    return [[int(i), float(trace[i])] for i in keep]


def _one_start(
    tmat: np.ndarray, m: int, mu: float, lam: float, seed: tuple[int, ...], start: int, max_iter: int
) -> StartResult:
    r = int(round(np.sqrt(tmat.shape[0])))
    rng = np.random.default_rng(seed + (start,))
    b0 = rng.standard_normal((m, r)) / np.sqrt(r)

    def fun(flat: np.ndarray) -> tuple[float, np.ndarray]:
        v, g = g_value_grad(flat.reshape(m, r), tmat, mu, lam)
        return v, g.ravel()

    trace = [float(fun(b0.ravel())[0])]

    def seen(intermediate_result: Any) -> None:  # scipy passes the iterate's value: no extra evaluation
        trace.append(float(intermediate_result.fun))

    res = minimize(
        fun,
        b0.ravel(),
        jac=True,
        method="L-BFGS-B",
        callback=seen,
        options={"maxiter": max_iter, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-10},
    )
    b = res.x.reshape(m, r)
    norms = np.linalg.norm(b, axis=1)
    # a bounded G keeps rows near unit norm (the λ term); rows running off mean the noise beats λ
    unbounded = bool(not np.isfinite(res.fun) or norms.max() > 10.0)
    bn = b / np.maximum(norms[:, None], 1e-300)
    cross = np.abs(bn @ bn.T) - np.eye(m)
    return StartResult(
        start,
        float(res.fun),
        int(res.nit),
        bool(res.success),
        b,
        distinct_rows(b),
        float(cross.max(initial=0.0)),
        unbounded,
        tuple(trace),
    )


def minimize_g(
    tmat: np.ndarray,
    m: int,
    params: GParameters,
    *,
    starts: int = 8,
    seed: tuple[int, ...] = (0,),
    max_iter: int = 5000,
    mapper: Callable = map,
) -> list[StartResult]:
    """Minimize G by L-BFGS from ``starts`` random starts (each from the seed and its index).

    Parameters
    ----------
    tmat
        ``(r², r²)`` sign-corrected whitened fourth moment (``sign(σ̂_4) T̃_4``, unfolded).
    m
        Number of rows of ``B``.
    params
        ``μ`` and ``λ``.
    mapper
        ``map``-like callable: the starts run through it (a cluster's map in a run).

    Returns
    -------
    list of StartResult, in start order.
    """
    from functools import partial

    fn = partial(_one_start, tmat, m, params.mu, params.lam, tuple(seed), max_iter=max_iter)
    return list(mapper(fn, range(starts)))


def best_start(results: list[StartResult], m: int) -> StartResult | None:
    """The lowest G among bounded starts with ``m`` distinct rows (``None`` when there is none)."""
    ok = [s for s in results if not s.unbounded and s.distinct == m]
    return min(ok, key=lambda s: s.value) if ok else None
