"""The contracted matrices, vectors and scalars of several label columns at once: one Hermite stack of the
directions for all of them, and each kind of sum for all columns and pairs in one GEMM."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .batching import _row_batches
from .contracted import _contracted_from_h, _prepare
from .polynomials import hermite_e

__all__ = ["contracted_sums_of_labels"]


def contracted_sums_of_labels(
    x: np.ndarray, r: np.ndarray, G: np.ndarray, orders: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum_s r_sj He_l(x_s)[g^{(l-2)}, ., .]``, ``[g^{(l-1)}, .]`` and ``[g^{(l)}]`` for every label column
    j and (order, direction) pair.

    Parameters
    ----------
    x : np.ndarray
        Shape ``(n, d)``; meant for small d (a subspace's coordinates): the matrices are general GEMMs.
    r : np.ndarray
        Labels, shape ``(n, m)``.
    G : np.ndarray
        Unit directions, shape ``(k, d)``.
    orders : sequence of int
        Orders ``l >= 2``.

    Returns
    -------
    tuple of np.ndarray
        Matrices ``(m, P, d, d)`` (exactly symmetric), vectors ``(m, P, d)``, scalars ``(m, P)``;
        ``P = len(orders) * k``, pairs order-major as in :func:`~relulearn.hermite.contracted_matrix_sums`.

    Notes
    -----
    The identities of :mod:`~relulearn.hermite.contracted` with ``z = <g, x>``: the matrix is
    ``a (x xᵀ − I) − b (g xᵀ + x gᵀ) + c g gᵀ`` with ``(a, b, c) = (He_n, n He_{n-1}, n(n-1) He_{n-2})``,
    ``n = l − 2``; the vector ``He_{l-1}(z) x − (l − 1) He_{l-2}(z) g``; the scalar ``He_l(z)``. Per row
    batch: the weights ``W`` of all columns × pairs are formed once, then the matrices' upper triangles are one
    GEMM ``Wᵀ Q`` with the rows' products ``Q_s = (x_sa x_sb)_{a ≤ b}`` (``m P d(d+1)`` flops per sample; its
    temporaries, ``Q`` and ``W``, do not grow with d times the pairs, as ``Xᵀ [w_1 ⊙ X | …]``'s would) and
    the vectors' ``Xᵀ W`` another: no loop over columns or samples.
    """
    x = np.require(np.asarray(x, dtype=np.float64), requirements=("C", "A"))
    r = np.asarray(r, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] != x.shape[0]:
        raise ValueError(f"shapes x {x.shape}, r {r.shape} do not agree: r needs one row per sample")
    x, _, G, orders = _prepare(x, np.zeros(len(x)), G, orders, 2)  # the directions unit, the orders ≥ 2
    n, d = x.shape
    m, P = r.shape[1], len(orders) * G.shape[0]
    top = max(orders)
    iu, ju = np.triu_indices(d)
    quad = np.zeros((m * P, len(iu)))  # the upper triangles, packed: one row per (column, pair)
    vec = np.zeros((d, 2 * m * P))  # columns: the matrices' b-weights, then the vectors' He_{l-1} weights
    lin = np.zeros((m, 4 * P))  # per column: Σ a, Σ c, Σ (l − 1) He_{l-2} and Σ He_l
    for sl in _row_batches(n, len(iu) + 8 * m * P):
        xs, rs = x[sl], r[sl]
        h = hermite_e(xs @ G.T, top)
        coef = [_contracted_from_h(h, l) for l in orders]
        a, b, c = (np.concatenate([co[i] for co in coef], axis=1) for i in range(3))
        w1 = np.concatenate([h[l - 1] for l in orders], axis=1)
        w2 = np.concatenate([(l - 1) * h[l - 2] for l in orders], axis=1)
        hl = np.concatenate([h[l] for l in orders], axis=1)
        # Σ_s w_s x_s x_sᵀ of every (column, pair) at once: the weights (rows × m P) against the rows' products
        # x_a x_b (a ≤ b), one GEMM whose temporaries are shared by all columns and pairs
        wa = (rs[:, :, None] * a[:, None, :]).reshape(len(xs), m * P)
        quad += wa.T @ (xs[:, iu] * xs[:, ju])
        wbw1 = np.concatenate([(rs[:, :, None] * b[:, None, :]), (rs[:, :, None] * w1[:, None, :])], axis=1)
        vec += xs.T @ wbw1.reshape(len(xs), 2 * m * P)
        lin += rs.T @ np.concatenate([a, c, w2, hl], axis=1)
    mats = np.zeros((m * P, d, d))
    mats[:, iu, ju] = quad
    mats[:, ju, iu] = quad
    mats = mats.reshape(m, P, d, d)
    vb, v1 = (vec.reshape(d, 2, m, P)[:, i].transpose(1, 2, 0) for i in range(2))
    wa_sum, wc_sum, w2_sum, scalars = (lin.reshape(m, 4, P)[:, i] for i in range(4))
    gp = np.tile(G, (len(orders), 1))
    mats -= wa_sum[:, :, None, None] * np.eye(d)
    mats -= gp[:, :, None] * vb[:, :, None, :] + vb[:, :, :, None] * gp[:, None, :]
    mats += wc_sum[:, :, None, None] * (gp[:, :, None] * gp[:, None, :])
    vectors = v1 - w2_sum[:, :, None] * gp
    return mats, vectors, scalars.copy()  # exactly symmetric: each term is (products commute)
