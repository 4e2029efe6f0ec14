"""The per-sample unbiased estimates of the tensor terms of G (Ge–Lee–Ma 2017) and of their gradient,
summed over a batch (:func:`batch_terms`) or over a part of the sample stream drawn on a worker
(:func:`part_sums`), on residual labels (:func:`residual_labels`). :mod:`.landscape.stream` derives
them and minimizes G with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import hermite

__all__ = ["SIGN_C4", "BLOCK_ROWS", "residual_labels", "BatchTerms", "batch_terms", "batch_sums", "part_sums"]

#: ``sign(c_4)`` for ReLU (``c_4 = −1/√(2π)``): the sign that makes the tensor's weights positive
SIGN_C4 = float(np.sign(hermite.relu_hermite_coefficient(4)))
#: rows of a part handled at a time: (rows, m) temporaries of 2048 rows stay in cache (twice as fast
#: as 16384 rows at m = d = 50, measured)
BLOCK_ROWS = 2048


#: ``ỹ = y − (T_0 + <T_1, x> + ½ <T_2, xxᵀ − I>)``: the labels less their Hermite expansion up to order 2
#: (same ``E[ỹ He_4(x)]``, since ``He_4`` is orthogonal to every polynomial of degree ≤ 2)
residual_labels = hermite.subtract_expansion


@dataclass(frozen=True)
class BatchTerms:
    """Sums over a batch (see :func:`batch_terms`)."""

    value: float
    grad: np.ndarray
    own: np.ndarray
    rows: np.ndarray


def batch_terms(x: np.ndarray, y_resid: np.ndarray, v: np.ndarray, mu: float) -> BatchTerms:
    """Sums over a batch of per-sample unbiased estimates: the tensor part of G, its gradient in V,
    and per row j ``T(v_j⁴)`` (``own``) and ``Σ_k T(v_j, v_j, v_k, v_k)`` (``rows``, k = j included).

    The estimate of sample ``(x, ỹ)`` is ``f = sign(c_4) ỹ [A − (1 + μ) D]`` with
    ``A = Σ_{j,k} ⟨He_4(x), v_j v_j v_k v_k⟩ = (P − N)² − 4 |g|² + 2 ‖Γ‖_F²`` and
    ``D = Σ_j ⟨He_4(x), v_j⁴⟩ = Σ_j (p_j⁴ − 6 n_j p_j² + 3 n_j²)`` (``p = V x``, ``P = |p|²``,
    ``n_j = |v_j|²``, ``N = Σ n_j``, ``g = Vᵀ p``, ``Γ = V Vᵀ``), so that ``A − D`` is the sum
    over ``j ≠ k``. Its gradient in V, derived by hand::

        ∂A = 4 (P − N)(p xᵀ − V) − 8 p pᵀ V − 8 Γ p xᵀ + 8 Γ V
        ∂D (row j) = 4 (p_j³ − 3 n_j p_j) x + 12 (n_j − p_j²) v_j

    and row j of A is ``p_j² P − n_j P − N p_j² − 4 p_j (Γ p)_j + n_j N + 2 (Γ²)_jj``. Two GEMMs
    over the batch (``X Vᵀ`` and one ``(n, m)ᵀ (n, d)`` pair); the rest is O(n m) or independent of n.
    """
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    c = SIGN_C4 * np.asarray(y_resid, dtype=np.float64)
    gram = v @ v.T
    nrm = np.diag(gram).copy()
    big_n = float(nrm.sum())
    p = x @ v.T  # (n, m)
    q = p * p
    pn = q.sum(axis=1) - big_n  # P − N
    q -= 3.0 * nrm[None, :]  # q = p² − 3 n: ⟨He_4, v_j⁴⟩ = q_j² − 6 n_j²
    q2 = q * q
    csum = float(c.sum())
    cq = c @ q  # Σ_i c_i (p_ij² − 3 n_j) per row j
    cbig_p = c * (pn + big_n)
    cbig_p_q = cbig_p @ q
    own = c @ q2 - 6.0 * csum * nrm * nrm
    diag = float(own.sum())
    cp = c[:, None] * p
    lin_c = cp.T @ x  # Σ c p xᵀ (m, d)
    pp = lin_c @ v.T  # Σ c p pᵀ = (Σ c p xᵀ) Vᵀ, as p = V x: no n·m² product
    cpn = float(c @ pn)
    fro2 = float(np.einsum("jk,jk->", gram, gram))
    value = (
        float(c @ (pn * pn)) + 2.0 * csum * fro2 - 4.0 * float(np.einsum("jk,jk->", gram, pp)) - (1.0 + mu) * diag
    )  # Σ c |g|² = <Γ, Σ c p pᵀ>
    rows = (
        cbig_p_q
        + 3.0 * nrm * float(cbig_p.sum())
        - nrm * float(cbig_p.sum())
        - big_n * (cq + 3.0 * nrm * csum)
        - 4.0 * np.einsum("jk,jk->j", pp, gram)
        + csum * (nrm * big_n + 2.0 * np.einsum("jk,jk->j", gram, gram))
    )
    # coefficient of xᵀ in ∂A − (1+μ) ∂D, over 4: c p (P − N − (1 + μ)(p² − 3 n)), built in place
    q *= -(1.0 + mu)
    q += pn[:, None]
    q *= cp
    lin_a = q.T @ x
    cn = -2.0 * csum * nrm - cq  # Σ_i c_i (n_j − p_ij²) per row j
    grad = (
        4.0 * lin_a
        - 8.0 * (gram @ lin_c)
        - 8.0 * (pp @ v)
        + 8.0 * csum * (gram @ v)
        - 4.0 * cpn * v
        - 12.0 * (1.0 + mu) * cn[:, None] * v
    )
    return BatchTerms(value, grad, own, rows)


def batch_sums(x: np.ndarray, y_resid: np.ndarray, v: np.ndarray, mu: float) -> tuple[float, np.ndarray]:
    """Sum over a batch of the per-sample unbiased estimate of
    ``sign(c_4) ỹ [Σ_{j≠k} ⟨He_4(x), v_j v_j v_k v_k⟩ − μ Σ_j ⟨He_4(x), v_j⁴⟩]`` and of its gradient in V.

    Parameters
    ----------
    x
        ``(n, d)`` inputs.
    y_resid
        ``(n,)`` residual labels.
    v
        ``(m, d)`` rows ``v_j``.
    mu
        The weight μ of the diagonal terms.

    Returns
    -------
    (float, np.ndarray)
        The sum over the batch and the sum of its gradient in V, ``(m, d)``. See :func:`batch_terms`
        for the formulas.
    """
    t = batch_terms(x, y_resid, v, mu)
    return t.value, t.grad


def part_sums(
    draw: Any, t0: float, t1: np.ndarray, t2: np.ndarray, v: np.ndarray, mu: float, item: tuple[int, int]
) -> BatchTerms:
    """:func:`batch_terms` on the independent part ``p`` of ``n`` samples, ``item = (p, n)``, drawn
    where this runs (a worker): only the part's id travels, and the result is O(m d)."""
    p, n = item
    x, y = draw.part(int(p), int(n))
    total: BatchTerms | None = None
    for a in range(0, x.shape[0], BLOCK_ROWS):  # blocks whose (rows, m) temporaries stay in cache
        xs = x[a : a + BLOCK_ROWS]
        t = batch_terms(xs, residual_labels(xs, y[a : a + BLOCK_ROWS], t0, t1, t2), v, mu)
        total = (
            t
            if total is None
            else BatchTerms(total.value + t.value, total.grad + t.grad, total.own + t.own, total.rows + t.rows)
        )
    if total is None:
        raise ValueError(f"part {p} has no samples")
    return total
