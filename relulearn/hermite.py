"""Hermite polynomials, Hermite tensors and their moment estimators.

Conventions (DESIGN.md section 3): probabilists' Hermite polynomials ``He_k``;
the Hermite tensor ``He_l(x)`` is the sum over partial matchings of the ``l``
index positions (matched pair -> ``-delta``, unmatched position -> ``x_i``);
``T_l = E[y He_l(x)]``.  Symmetric tensors are stored *packed*: the entries with
``i1 <= ... <= il`` in ``itertools.combinations_with_replacement`` order.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

__all__ = [
    "subtract_expansion",
    "hermite_e", "relu_hermite_coefficient", "activation_hermite_coefficients",
    "unique_indices", "packed_index", "pack", "unpack", "partial_matchings",
    "raw_moment_sums", "raw_to_hermite", "hermite_tensor", "contracted_coefficients",
    "contracted_matrix_sums", "contracted_vector_sums", "contracted_scalar_sums",
]

# Temporaries (in float64 elements) are kept below ~64 MB by processing rows in batches.
_TEMP_ELEMENTS = 64 * 2**20 // 8


def hermite_e(z: np.ndarray, kmax: int) -> np.ndarray:
    """Probabilists' Hermite polynomials ``He_0 .. He_kmax`` at ``z``.

    Parameters
    ----------
    z : np.ndarray
        Points, any shape.
    kmax : int
        Highest order, ``>= 0``.

    Returns
    -------
    np.ndarray
        Shape ``(kmax + 1, *z.shape)``; entry ``k`` is ``He_k(z)``.
    """
    if kmax < 0:
        raise ValueError(f"kmax must be >= 0, got {kmax}")
    z = np.asarray(z, dtype=np.float64)
    out = np.empty((kmax + 1,) + z.shape)
    out[0] = 1.0
    if kmax >= 1:
        out[1] = z
    for k in range(1, kmax):
        out[k + 1] = z * out[k] - k * out[k - 1]
    return out


def relu_hermite_coefficient(l: int) -> float:
    """``c_l = E[relu(z) He_l(z)]`` for ``z ~ N(0, 1)``.

    ``c_0 = 1/sqrt(2 pi)``, ``c_1 = 1/2``, ``c_l = He_{l-2}(0)/sqrt(2 pi)`` for ``l >= 2``.
    """
    if l < 0:
        raise ValueError(f"order must be >= 0, got {l}")
    if l == 1:
        return 0.5
    # He_k(0) is an integer obtained exactly by the recurrence (for moderate k).
    he0 = 1.0 if l == 0 else float(hermite_e(np.zeros(()), l - 2)[l - 2])
    return he0 / math.sqrt(2.0 * math.pi)


def activation_hermite_coefficients(
    f: Callable[[np.ndarray], np.ndarray],
    lmax: int,
    quad_points: int = 200,
    breakpoints: Sequence[float] | None = None,
) -> np.ndarray:
    """``E[f(z) He_l(z)]`` for ``l = 0..lmax``, ``z ~ N(0, 1)``, by quadrature.

    Parameters
    ----------
    f : callable
        Vectorised activation, ``f(z)`` for an array ``z``.
    lmax : int
        Highest order.
    quad_points : int
        Number of nodes (per piece when ``breakpoints`` is given).
    breakpoints : sequence of float, optional
        Points where ``f`` is not smooth (``(0.0,)`` for relu).  Without them the rule is
        Gauss-HermiteE (``hermegauss``, at most 360 nodes), spectrally accurate for smooth
        ``f`` but only O(1/quad_points) across a kink.  With them, Gauss-Legendre on each
        piece of ``[-L, L]``, cut at the breakpoints, ``L`` far into the Gaussian tail.

    Returns
    -------
    np.ndarray
        Shape ``(lmax + 1,)``.
    """
    if breakpoints is None:
        if quad_points > 360:  # hermegauss weights underflow to NaN beyond ~370 nodes
            raise ValueError("Gauss-HermiteE supports at most 360 nodes; pass breakpoints")
        nodes, weights = hermegauss(quad_points)
        # hermegauss integrates against exp(-z^2/2); normalise to the Gaussian density.
        weights = weights / math.sqrt(2.0 * math.pi)
    else:
        bp = np.sort(np.asarray(breakpoints, dtype=np.float64))
        # He_l lives on |z| <~ 2 sqrt(l); beyond L the Gaussian factor is below e^-100.
        edge = np.abs(bp).max(initial=0.0) + 14.0 + 2.0 * math.sqrt(lmax + 1)
        ends = np.concatenate([[-edge], bp, [edge]])
        t, wt = np.polynomial.legendre.leggauss(quad_points)
        half = np.diff(ends)[:, None] / 2
        nodes = ((ends[:-1, None] + ends[1:, None]) / 2 + half * t).ravel()
        weights = (half * wt).ravel() * np.exp(-nodes**2 / 2) / math.sqrt(2.0 * math.pi)
    w = weights * np.asarray(f(nodes), dtype=np.float64)
    return hermite_e(nodes, lmax) @ w


def unique_indices(d: int, l: int) -> np.ndarray:
    """Sorted multi-indices of order ``l`` over ``range(d)``, packed order.

    Returns
    -------
    np.ndarray
        int64, shape ``(C(d+l-1, l), l)``, rows in ``combinations_with_replacement`` order.
    """
    count = math.comb(d + l - 1, l)
    flat = itertools.chain.from_iterable(itertools.combinations_with_replacement(range(d), l))
    return np.fromiter(flat, dtype=np.int64, count=count * l).reshape(count, l)


@lru_cache(maxsize=None)
def _binomials(nmax: int, kmax: int) -> np.ndarray:
    """Pascal table ``B[n, k] = C(n, k)`` (int64, zero for k > n)."""
    b = np.zeros((nmax + 1, kmax + 1), dtype=np.int64)
    b[:, 0] = 1
    for n in range(1, nmax + 1):
        b[n, 1:] = b[n - 1, 1:] + b[n - 1, :-1]
    b.flags.writeable = False
    return b


def packed_index(idx: np.ndarray, d: int) -> np.ndarray:
    """Position in packed storage of multi-indices ``idx`` (shape ``(..., l)``).

    Indices need not be sorted (they are sorted first, since the tensor is symmetric).
    Uses the combinatorial number system: no ``d**l`` table.
    """
    idx = np.sort(np.asarray(idx, dtype=np.int64), axis=-1)
    l = idx.shape[-1]
    binom = _binomials(d + l, l + 1)
    rank = np.zeros(idx.shape[:-1], dtype=np.int64)
    prev = np.zeros_like(rank)
    for k in range(l):
        r = l - k - 1
        v = idx[..., k]
        # Number of sorted tails of length r+1 starting at values in [prev, v): hockey stick.
        rank += binom[d - prev + r, r + 1] - binom[d - v + r, r + 1]
        prev = v
    return rank


def _full_indices(d: int, l: int) -> np.ndarray:
    """All ``d**l`` multi-indices in C order, shape ``(d**l, l)``."""
    return np.indices((d,) * l).reshape(l, -1).T


def pack(tensor: np.ndarray) -> np.ndarray:
    """Unique entries of a symmetric tensor of shape ``(d,)*l`` (no batch dims)."""
    tensor = np.asarray(tensor)
    if tensor.ndim == 0:
        return tensor.reshape(1)
    idx = unique_indices(tensor.shape[0], tensor.ndim)
    return tensor[tuple(idx.T)]


def unpack(packed: np.ndarray, d: int, l: int) -> np.ndarray:
    """Full symmetric tensor of shape ``(d,)*l`` from its packed entries."""
    packed = np.asarray(packed)
    if packed.shape != (math.comb(d + l - 1, l),):
        raise ValueError(f"packed shape {packed.shape} does not match d={d}, l={l}")
    if l == 0:
        return packed.reshape(())
    return packed[packed_index(_full_indices(d, l), d)].reshape((d,) * l)


@lru_cache(maxsize=None)
def partial_matchings(l: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """All partial matchings of positions ``0..l-1`` as tuples of pairs ``(a, b)``, a < b."""

    def rec(pos: tuple[int, ...]) -> Iterator[tuple[tuple[int, int], ...]]:
        if not pos:
            yield ()
            return
        first, rest = pos[0], pos[1:]
        yield from rec(rest)  # first position unmatched
        for j, other in enumerate(rest):
            for m in rec(rest[:j] + rest[j + 1:]):
                yield ((first, other),) + m

    return tuple(rec(tuple(range(l))))


def _matching_terms(
    idx: np.ndarray,
) -> Iterator[tuple[int, np.ndarray, list[int]]]:
    """For each partial matching of the columns of ``idx``: its sign ``(-1)^pairs``,
    the rows whose matched indices agree, and the unmatched (free) positions."""
    l = idx.shape[1]
    for match in partial_matchings(l):
        matched = {p for pair in match for p in pair}
        mask = np.ones(idx.shape[0], dtype=bool)
        for i, j in match:
            mask &= idx[:, i] == idx[:, j]
        yield (-1) ** len(match), mask, [p for p in range(l) if p not in matched]


def _row_batches(n: int, row_elements: int) -> Iterator[slice]:
    """Row slices so that a temporary of ``rows * row_elements`` stays under budget."""
    rows = max(1, _TEMP_ELEMENTS // max(1, row_elements))
    for start in range(0, n, rows):
        yield slice(start, min(n, start + rows))


def _tuple_products(x: np.ndarray, a: int) -> np.ndarray:
    """``(n, C(d+a-1, a))`` products of the columns of ``x`` over sorted ``a``-tuples.

    Built level by level from contiguous slices (no column gathers): the tuples
    starting with ``i`` are ``i`` followed by the sorted tuples over ``range(i, d)``,
    which form the tail of the previous level.
    """
    n, d = x.shape
    prev = np.ones((n, 1))
    for r in range(1, a + 1):
        out = np.empty((n, math.comb(d + r - 1, r)))
        col = 0
        for i in range(d):
            tail = prev[:, prev.shape[1] - math.comb(d - i + r - 2, r - 1):]
            np.multiply(x[:, i:i + 1], tail, out=out[:, col:col + tail.shape[1]])
            col += tail.shape[1]
        prev = out
    return prev


def raw_moment_sums(x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """Packed unique entries of ``sum_s y_s x_s^{(x)m}``.

    Computed as one GEMM per row batch: with ``m = a + b`` (``a = ceil(m/2)``), the
    ``y``-weighted products over sorted ``a``-tuples times the products over sorted
    ``b``-tuples give every sorted ``m``-tuple as (sorted prefix, sorted suffix).

    Parameters
    ----------
    x : np.ndarray
        Shape ``(n, d)``.
    y : np.ndarray
        Shape ``(n,)``.
    m : int
        Order, ``>= 0``.

    Returns
    -------
    np.ndarray
        Shape ``(C(d+m-1, m),)``.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n, d = x.shape
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},), got {y.shape}")
    b = m // 2
    a = m - b  # the (a, b)-products matrix is dense: C(d+a-1,a) * C(d+b-1,b) floats
    pa, pb = math.comb(d + a - 1, a), math.comb(d + b - 1, b)
    acc = np.zeros((pa, pb))
    for sl in _row_batches(n, 2 * (pa + pb)):
        right = _tuple_products(x[sl], b)
        left = right if a == b else _tuple_products(x[sl], a)
        acc += (left * y[sl, None]).T @ right
    idx = unique_indices(d, m)
    return acc[packed_index(idx[:, :a], d), packed_index(idx[:, a:], d)]


def raw_to_hermite(raw: dict[int, np.ndarray], d: int, l: int) -> np.ndarray:
    """Packed ``T_l = E[y He_l(x)]`` from packed raw moments ``R_m = E[y x^{(x)m}]``.

    Exact matching-sum: a matching with ``p`` pairs contributes ``(-1)^p`` times
    ``R_{l-2p}`` at the unmatched indices, on entries whose matched indices agree.
    Linear, so sums instead of means give sums.  Needs ``raw[m]`` for
    ``m = l, l-2, ...``; other keys are ignored.
    """
    idx = unique_indices(d, l)
    out = np.zeros(idx.shape[0])
    for m in range(l % 2, l + 1, 2):
        if m not in raw:
            raise KeyError(f"raw moment of order {m} is needed for T_{l}")
        if np.shape(raw[m]) != (math.comb(d + m - 1, m),):
            raise ValueError(f"raw[{m}] has shape {np.shape(raw[m])}, expected packed d={d}")
    for sign, mask, free in _matching_terms(idx):
        # idx rows are sorted, so the unmatched sub-index is sorted too.
        pos = packed_index(idx[mask][:, free], d)
        out[mask] += sign * np.asarray(raw[len(free)], dtype=np.float64)[pos]
    return out


def hermite_tensor(x: np.ndarray, l: int) -> np.ndarray:
    """Full Hermite tensor ``He_l(x)`` of one sample ``x`` (shape ``(d,)``), for small d.

    Reference implementation by the matching-sum definition; shape ``(d,)*l``.
    """
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[0]
    if l == 0:
        return np.ones(())
    idx = _full_indices(d, l)
    out = np.zeros(idx.shape[0])
    for sign, mask, free in _matching_terms(idx):
        out += sign * mask * np.prod(x[idx[:, free]], axis=1)
    return out.reshape((d,) * l)


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


def contracted_matrix_sums(
    x: np.ndarray, y: np.ndarray, G: np.ndarray, orders: Sequence[int]
) -> np.ndarray:
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
        (pair ``i * k + j`` is ``orders[i]``, ``G[j]``).
    """
    x, y, G, orders = _prepare(x, y, G, orders, 2)
    n, d = x.shape
    P = len(orders) * G.shape[0]
    quad = np.zeros((d, P * d))
    wa_sum, wc_sum, v = np.zeros(P), np.zeros(P), np.zeros((d, P))
    for sl in _row_batches(n, P * d):
        xs = x[sl]
        h = hermite_e(xs @ G.T, max(orders) - 2)
        coef = [_contracted_from_h(h, l) for l in orders]
        wa, wb, wc = (np.concatenate([c[i] for c in coef], axis=1) * y[sl, None] for i in range(3))
        # One GEMM gives X^T diag(w_p) X for all pairs p at once.
        quad += xs.T @ (wa[:, :, None] * xs[:, None, :]).reshape(xs.shape[0], P * d)
        wa_sum += wa.sum(axis=0)
        wc_sum += wc.sum(axis=0)
        v += xs.T @ wb
    out = quad.reshape(d, P, d).transpose(1, 0, 2).copy()
    gp = np.tile(G, (len(orders), 1))
    vt = v.T
    out -= wa_sum[:, None, None] * np.eye(d)
    out -= gp[:, :, None] * vt[:, None, :] + vt[:, :, None] * gp[:, None, :]
    out += wc_sum[:, None, None] * gp[:, :, None] * gp[:, None, :]
    return out


def contracted_vector_sums(
    x: np.ndarray, y: np.ndarray, G: np.ndarray, orders: Sequence[int]
) -> np.ndarray:
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


def contracted_scalar_sums(
    x: np.ndarray, y: np.ndarray, G: np.ndarray, orders: Sequence[int]
) -> np.ndarray:
    """``sum_s y_s He_l(<g, x_s>)`` for every (order, direction) pair; shape ``(P,)``.

    Orders ``l >= 0``; pairs order-major as in :func:`contracted_matrix_sums`.
    """
    x, y, G, orders = _prepare(x, y, G, orders, 0)
    out = np.zeros(len(orders) * G.shape[0])
    for sl in _row_batches(x.shape[0], (max(orders) + 2) * G.shape[0]):
        h = hermite_e(x[sl] @ G.T, max(orders))
        out += y[sl] @ np.concatenate([h[l] for l in orders], axis=1)
    return out


def subtract_expansion(x: np.ndarray, y: np.ndarray, t0: float, t1: np.ndarray, t2: np.ndarray) -> np.ndarray:
    """Residual labels ``y − (t0 + <t1, x> + ½ <t2, xxᵀ − I>)``: ``y`` less a Hermite expansion of
    degree ≤ 2 (DESIGN.md §3; ``E[(y − P_{≤2} y) He_l(x)] = T_l`` for ``l ≥ 3``).

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
