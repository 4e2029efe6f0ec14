"""Hermite tensors contracted with unit directions ``g``: the matrices ``He_l(x)[g^{(l-2)}, ., .]``, vectors
and scalars summed over samples, without forming a tensor."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# scipy's BLAS (the contracted matrices' syrk) is imported with this module, not on first use, so that
# it is loaded before any ``threadpool_limits(1)`` of a worker or of the in-process loop, which then
# covers it too (and ``worker.platform_id`` lists it).
from scipy.linalg.blas import dsyr2k as _dsyr2k
from scipy.linalg.blas import dsyrk as _dsyrk

from .batching import _row_batches
from .polynomials import hermite_e

__all__ = [
    "contracted_coefficients",
    "contracted_matrix_sums",
    "contracted_vector_sums",
    "contracted_scalar_sums",
]


def _contracted_from_h(h: np.ndarray, l: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c) for order l from a stack ``h[k] = He_k(z)`` with ``k >= l - 2``."""
    n = l - 2
    zero = np.zeros_like(h[0])
    b = n * h[n - 1] if n >= 1 else zero
    c = n * (n - 1) * h[n - 2] if n >= 2 else zero
    return h[n], b, c


def contracted_coefficients(z: np.ndarray, l: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample ``(He_n(z), n He_{n-1}(z), n(n-1) He_{n-2}(z))`` with ``n = l - 2``.

    For unit g and ``z = <g, x>``:
    ``He_l(x)[g^n, ., .] = a (x x^T - I) - b (g x^T + x g^T) + c g g^T``.
    """
    if l < 2:
        raise ValueError(f"matrix contraction needs l >= 2, got {l}")
    return _contracted_from_h(hermite_e(z, l - 2), l)


def _prepare(
    x: np.ndarray, y: np.ndarray, G: np.ndarray, orders: Sequence[int], lmin: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Validate the inputs of the contracted sums (the identities need unit g)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    G = np.atleast_2d(np.asarray(G, dtype=np.float64))
    if y.shape != (x.shape[0],) or G.shape[1] != x.shape[1]:
        raise ValueError(f"shapes x {x.shape}, y {y.shape}, G {G.shape} do not agree")
    if not np.allclose(np.linalg.norm(G, axis=1), 1.0, rtol=0, atol=1e-8):
        raise ValueError("directions must be unit vectors")
    orders = [int(l) for l in orders]
    if not orders or min(orders) < lmin:
        raise ValueError(f"orders must be non-empty and >= {lmin}, got {orders}")
    return x, y, G, orders


# Rows gathered per rank-k update of the contracted matrices, times d (float64 elements): a
# block of 2 MiB stays in cache between its gathering and the syrk that reads it.
_GRAM_BLOCK = 2**18


def _add_signed_grams(quad: np.ndarray, x: np.ndarray, w: np.ndarray, buf: np.ndarray) -> None:
    """Add ``sum_s w[s, p] x_s x_s^T`` to the upper triangle of ``quad[p]`` for every column p of w.

    Per pair, two symmetric rank-k updates (``dsyrk``, ``d(d+1)`` flops per row, all rows together):
    ``+ Z^T Z`` over the rows with ``w > 0`` and ``- Z^T Z`` over those with ``w < 0``, where
    ``Z = sqrt(|w|) ⊙ X`` restricted to those rows, gathered in row order in blocks of ``len(buf)``
    rows into ``buf``. Rows with ``w == 0`` add nothing; a NaN weight goes with the positive rows (it
    propagates). ``quad[p].T`` is Fortran-ordered, so its lower triangle, which dsyrk updates in
    place, is the upper triangle of ``quad[p]``.
    """
    block = buf.shape[0]
    neg = w < 0
    pos = ~(neg | (w == 0))
    for p in range(w.shape[1]):
        c = quad[p].T
        for rows, alpha in ((pos[:, p], 1.0), (neg[:, p], -1.0)):
            idx = np.flatnonzero(rows)
            scale = np.sqrt(alpha * w[idx, p])
            for start in range(0, idx.size, block):
                part = idx[start : start + block]
                z = buf[: part.size]
                np.take(x, part, axis=0, out=z, mode="clip")  # indices are valid: clip only avoids a copy
                z *= scale[start : start + block, None]
                out = _dsyrk(alpha, z.T, beta=1.0, c=c, trans=0, lower=1, overwrite_c=1)
                if out is not c:  # pragma: no cover - f2py updates a Fortran-ordered float64 c in place
                    c[...] = out


def _mirror_upper(m: np.ndarray, block: int = 32) -> None:
    """Copy the strict upper triangles of the square matrices ``m[..., :, :]`` onto their lower ones,
    in place (by column blocks, which keeps the transposed reads in cache)."""
    d = m.shape[-1]
    for i in range(0, d, block):
        j = min(d, i + block)
        m[..., j:, i:j] = m[..., i:j, j:].swapaxes(-1, -2)
        lo_i, lo_j = np.tril_indices(j - i, -1)
        diag = m[..., i:j, i:j]
        diag[..., lo_i, lo_j] = diag[..., lo_j, lo_i]


def contracted_matrix_sums(x: np.ndarray, y: np.ndarray, G: np.ndarray, orders: Sequence[int]) -> np.ndarray:
    """``sum_s y_s He_l(x_s)[g^{(l-2)}, ., .]`` for every (order, direction) pair.

    Parameters
    ----------
    x : np.ndarray
        Shape ``(n, d)``.
    y : np.ndarray
        Shape ``(n,)``.
    G : np.ndarray
        Unit directions, shape ``(k, d)``.
    orders : sequence of int
        Orders ``l >= 2``.

    Returns
    -------
    np.ndarray
        Shape ``(P, d, d)``, ``P = len(orders) * k``, order-major
        (pair ``i * k + j`` is ``orders[i]``, ``G[j]``); exactly symmetric.

    Notes
    -----
    With ``w_p = y He_n(z)``, ``n = l - 2`` (docs/design.md section 3), pair p is
    ``X^T diag(w_p) X - sum(w_p) I - (g v^T + v g^T) + sum(c_p) g g^T``. The first term is two
    symmetric rank-k updates per pair (:func:`_add_signed_grams`: ``d(d+1)`` flops per sample and
    pair, half of a general GEMM), the rank-two rest one ``dsyr2k``, all into the upper triangle,
    which is mirrored once, at the end.
    """
    x, y, G, orders = _prepare(x, y, G, orders, 2)
    x = np.require(x, requirements=("C", "A"))  # BLAS throughout, whatever the caller's memory layout
    n, d = x.shape
    if d < _SYRK_MIN_D:
        return _contracted_matrix_sums_gemm(x, y, G, orders)
    k = G.shape[0]
    P = len(orders) * k
    quad = np.zeros((P, d, d))  # upper triangles accumulate
    wa_sum, wc_sum, v = np.zeros(P), np.zeros(P), np.zeros((d, P))
    buf = np.empty((max(1, min(n, _GRAM_BLOCK // d)), d))
    for sl in _row_batches(n, 3 * P + (max(orders) - 1) * k):
        xs = x[sl]
        h = hermite_e(xs @ G.T, max(orders) - 2)
        coef = [_contracted_from_h(h, l) for l in orders]
        wa, wb, wc = (np.concatenate([c[i] for c in coef], axis=1) * y[sl, None] for i in range(3))
        _add_signed_grams(quad, xs, wa, buf)
        wa_sum += wa.sum(axis=0)
        wc_sum += wc.sum(axis=0)
        v += xs.T @ wb
    gp = np.tile(G, (len(orders), 1))
    for p in range(P):
        m = quad[p]
        # -(g v^T + v g^T) + c g g^T = g u^T + u g^T with u = c g / 2 - v
        u = 0.5 * wc_sum[p] * gp[p] - v[:, p]
        c = m.T
        out = _dsyr2k(1.0, gp[p][:, None], u[:, None], beta=1.0, c=c, trans=0, lower=1, overwrite_c=1)
        if out is not c:  # pragma: no cover - f2py updates a Fortran-ordered float64 c in place
            c[...] = out
        m.reshape(-1)[:: d + 1] -= wa_sum[p]
    _mirror_upper(quad)
    return quad


#: below this d the per-pair syrk calls and row gathers cost more than they save (measured 15–28 % slower
#: at d = 10–32, 4 % faster at 64, 28 % at 128): one general GEMM for all pairs instead
_SYRK_MIN_D = 64


def _contracted_matrix_sums_gemm(x: np.ndarray, y: np.ndarray, G: np.ndarray, orders: list[int]) -> np.ndarray:
    """:func:`contracted_matrix_sums` at small d: ``X^T diag(w_p) X`` of all pairs in one GEMM
    (2 P d² flops per sample), symmetrised at the end so the result is exactly symmetric."""
    n, d = x.shape
    P = len(orders) * G.shape[0]
    quad = np.zeros((d, P * d))
    wa_sum, wc_sum, v = np.zeros(P), np.zeros(P), np.zeros((d, P))
    for sl in _row_batches(n, P * d):
        xs = x[sl]
        h = hermite_e(xs @ G.T, max(orders) - 2)
        coef = [_contracted_from_h(h, l) for l in orders]
        wa, wb, wc = (np.concatenate([c[i] for c in coef], axis=1) * y[sl, None] for i in range(3))
        quad += xs.T @ (wa[:, :, None] * xs[:, None, :]).reshape(xs.shape[0], P * d)
        wa_sum += wa.sum(axis=0)
        wc_sum += wc.sum(axis=0)
        v += xs.T @ wb
    out = quad.reshape(d, P, d).transpose(1, 0, 2).copy()
    gp, vt = np.tile(G, (len(orders), 1)), v.T
    out -= wa_sum[:, None, None] * np.eye(d)
    out -= gp[:, :, None] * vt[:, None, :] + vt[:, :, None] * gp[:, None, :]
    out += wc_sum[:, None, None] * gp[:, :, None] * gp[:, None, :]
    return 0.5 * (out + out.transpose(0, 2, 1))


def contracted_vector_sums(x: np.ndarray, y: np.ndarray, G: np.ndarray, orders: Sequence[int]) -> np.ndarray:
    """``sum_s y_s He_l(x_s)[g^{(l-1)}, .]`` for every (order, direction) pair.

    Uses ``He_l(x)[g^{(l-1)}, .] = He_{l-1}(z) x - (l-1) He_{l-2}(z) g``, ``z = <g, x>``.
    Orders ``l >= 1``; returns shape ``(P, d)``, pairs order-major as in
    :func:`contracted_matrix_sums`.
    """
    x, y, G, orders = _prepare(x, y, G, orders, 1)
    n, d = x.shape
    k = G.shape[0]
    P = len(orders) * k
    v, w2_sum = np.zeros((d, P)), np.zeros(P)
    for sl in _row_batches(n, (max(orders) + 2) * k):
        xs = x[sl]
        h = hermite_e(xs @ G.T, max(orders) - 1)
        w1 = np.concatenate([h[l - 1] for l in orders], axis=1) * y[sl, None]
        w2 = np.concatenate([(l - 1) * h[max(l - 2, 0)] for l in orders], axis=1)
        v += xs.T @ w1
        w2_sum += y[sl] @ w2
    return v.T - w2_sum[:, None] * np.tile(G, (len(orders), 1))


def contracted_scalar_sums(x: np.ndarray, y: np.ndarray, G: np.ndarray, orders: Sequence[int]) -> np.ndarray:
    """``sum_s y_s He_l(<g, x_s>)`` for every (order, direction) pair; shape ``(P,)``.

    Orders ``l >= 0``; pairs order-major as in :func:`contracted_matrix_sums`.
    """
    x, y, G, orders = _prepare(x, y, G, orders, 0)
    out = np.zeros(len(orders) * G.shape[0])
    for sl in _row_batches(x.shape[0], (max(orders) + 2) * G.shape[0]):
        h = hermite_e(x[sl] @ G.T, max(orders))
        out += y[sl] @ np.concatenate([h[l] for l in orders], axis=1)
    return out
