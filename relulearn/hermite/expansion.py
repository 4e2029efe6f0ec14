"""Hermite expansions ``Σ_l <T_l, He_l(x)> / l!``: their monomial coefficients, their terms at samples, and
residual labels less an expansion of degree ≤ 2."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .batching import _row_batches
from .packing import multiplicities, packed_trace
from .plan import _MIN_ROWS, _OPERAND_ELEMENTS, _colex_products, _lex_products, _moment_plan, _plan_gather

__all__ = ["subtract_expansion", "expansion_coefficients", "expansion_terms"]


def subtract_expansion(x: np.ndarray, y: np.ndarray, t0: float, t1: np.ndarray, t2: np.ndarray) -> np.ndarray:
    """Residual labels ``y − (t0 + <t1, x> + ½ <t2, xxᵀ − I>)``: ``y`` less a Hermite expansion of
    degree ≤ 2 (docs/design.md §3; ``E[(y − P_{≤2} y) He_l(x)] = T_l`` for ``l ≥ 3``).

    Parameters
    ----------
    x
        ``(n, d)`` inputs.
    y
        ``(n,)`` labels.
    t0, t1, t2
        The expansion: ``E[y]``, ``E[y x]`` (d,), ``E[y (xxᵀ − I)]`` (d, d, symmetric).

    Returns
    -------
    np.ndarray
        ``(n,)`` residual labels.
    """
    x = np.asarray(x, dtype=np.float64)
    quad = np.einsum("ij,ij->i", x @ t2, x) - np.trace(t2)  # <t2, xxᵀ − I>, one d × d GEMM over the batch
    return np.asarray(y, dtype=np.float64) - (t0 + x @ t1 + 0.5 * quad)


def expansion_coefficients(tensors: Sequence[np.ndarray], d: int) -> list[np.ndarray]:
    """Monomial coefficients of the Hermite expansion ``Σ_l <T_l, He_l(x)> / l!``, per degree.

    ``<T_l, He_l(x)> / l! = Σ_p (−1)^p / (2^p p! (l−2p)!) <tr^p T_l, x^{⊗(l−2p)}>`` (the
    matchings of ``p`` pairs, docs/design.md §3). Entry ``m`` of the result has shape
    ``(C(d+m−1, m), L+1)``: column ``l`` holds, for each sorted monomial of order ``m``, its
    coefficient in degree ``l``'s term, multiplicity included, so that
    ``Σ_m products_m(x) @ coef[m]`` gives every degree's term of every sample in one GEMM per order.

    Parameters
    ----------
    tensors
        Packed ``T_0 .. T_L`` (``T_l = E[y He_l(x)]``).
    d
        Dimension.
    """
    top = len(tensors) - 1
    coef = [np.zeros((math.comb(d + m - 1, m), top + 1)) for m in range(top + 1)]
    for l, t in enumerate(tensors):
        t = np.asarray(t, dtype=np.float64)
        for p in range(l // 2 + 1):
            m = l - 2 * p
            scale = (-1) ** p / (2**p * math.factorial(p) * math.factorial(m))
            coef[m][:, l] = scale * multiplicities(d, m) * t
            if m >= 2:
                t = packed_trace(t, d, m)
    return coef


def expansion_terms(x: np.ndarray, coef: Sequence[np.ndarray]) -> np.ndarray:
    """Every degree's term of a Hermite expansion at the rows of ``x``: shape ``(n, L+1)``.

    ``coef`` comes from :func:`expansion_coefficients`; the prediction of the expansion
    truncated at degree ``L'`` is the sum of the first ``L' + 1`` columns. Monomials of order
    ``m`` are summed with the blocked GEMM plan of the raw moments (prefix products times the
    coefficients times suffix products, within 1.5× of the packed count): order ``m`` feeds the
    degrees ``m, m+2, …`` only, so the widest order costs one column.
    """
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    top = coef[0].shape[1] - 1
    out = np.zeros((n, top + 1))
    out += coef[0][0]
    if len(coef) > 1:
        out += x @ coef[1]
    for m in range(2, len(coef)):
        cols = list(range(m, top + 1, 2))
        _add_order_terms(x, coef[m][:, cols], m, out, cols)
    return out


def _add_order_terms(x: np.ndarray, c: np.ndarray, m: int, out: np.ndarray, cols: list[int]) -> None:
    """``out[:, cols] += Σ_t c[t] Π x_t`` over the sorted ``m``-tuples t, by the raw moments' GEMM plan."""
    n, d = x.shape
    k = c.shape[1]
    plan = _moment_plan(d, m)
    flat = np.zeros((plan.size, k))
    flat[_plan_gather(d, m)] = c  # pairs the plan computes twice (diagonal blocks) keep a zero coefficient
    blocks = [
        flat[off : off + mb * (s1 - s0)].reshape(mb, s1 - s0, k).transpose(2, 0, 1).reshape(k * mb, s1 - s0)
        for (mb, s0, s1), off in zip(plan.gemms, plan.offsets)
    ]
    a, b = plan.prefix, m - plan.prefix
    row_elements = d + math.comb(d + a - 1, a) + math.comb(d + b - 1, b) * (1 + k)
    for sl in _row_batches(n, row_elements, max(_OPERAND_ELEMENTS, _MIN_ROWS * row_elements)):
        xt = np.ascontiguousarray(x[sl].T)
        rows = xt.shape[1]
        left = _colex_products(xt, np.ones(rows), a)
        right = _lex_products(xt, b)
        acc = np.zeros((k, rows))
        for blk, (mb, s0, s1) in zip(blocks, plan.gemms):
            acc += np.einsum("kmr,mr->kr", (blk @ right[s0:s1]).reshape(k, mb, rows), left[:mb])
        out[sl, cols] += acc.T
