"""Packed storage of symmetric tensors: the entries with ``i1 <= ... <= il`` in
``itertools.combinations_with_replacement`` order, their positions, multiplicities and traces."""

from __future__ import annotations

import itertools
import math
from functools import cache, lru_cache

import numpy as np

__all__ = ["unique_indices", "packed_index", "pack", "unpack", "multiplicities", "packed_trace"]


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


@cache
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


# unpack's position tables are kept up to this many entries (an int32 table of 32 MiB; four at most): a learner
# unpacks the same orders of a store's tensors and of their standard errors several times, and computing the
# positions of the d**l entries (a sort of each multi-index) cost 150 times the gather (1.9 s at d = 13, order 6)
_CACHED_POSITIONS = 2**23


@lru_cache(maxsize=4)
def _cached_positions(d: int, l: int) -> np.ndarray:
    return _positions(d, l)


def _positions(d: int, l: int) -> np.ndarray:
    """Packed position of every entry of a full ``(d,)*l`` tensor, in C order (int32 where it fits)."""
    pos = packed_index(_full_indices(d, l), d)
    if math.comb(d + l - 1, l) < 2**31:
        pos = pos.astype(np.int32)
    pos.flags.writeable = False
    return pos


def unpack(packed: np.ndarray, d: int, l: int) -> np.ndarray:
    """Full symmetric tensor of shape ``(d,)*l`` from its packed entries."""
    packed = np.asarray(packed)
    if packed.shape != (math.comb(d + l - 1, l),):
        raise ValueError(f"packed shape {packed.shape} does not match d={d}, l={l}")
    if l == 0:
        return packed.reshape(())
    pos = _cached_positions(d, l) if d**l <= _CACHED_POSITIONS else _positions(d, l)
    return packed[pos].reshape((d,) * l)


def multiplicities(d: int, l: int) -> np.ndarray:
    """How many positions of a full ``(d,)*l`` tensor each packed entry stands for:
    ``l! / Π_i c_i!`` for an index with value counts ``c_i`` (``‖T‖_F² = Σ mult · T_packed²``)."""
    idx = unique_indices(d, l)
    out = np.full(idx.shape[0], float(math.factorial(l)))
    if l == 0:
        return out
    # sorted rows: runs of equal values are the counts
    run = np.ones(idx.shape[0])
    for k in range(1, l):
        same = idx[:, k] == idx[:, k - 1]
        run = np.where(same, run + 1, 1.0)
        out /= np.where(same, run, 1.0)
    return out


def packed_trace(t: np.ndarray, d: int, l: int) -> np.ndarray:
    """Packed ``tr T = Σ_j T[…, j, j]`` (order ``l − 2``) of a packed symmetric tensor of order ``l``."""
    if l < 2:
        raise ValueError(f"a trace needs order >= 2, got {l}")
    t = np.asarray(t, dtype=np.float64)
    idx = unique_indices(d, l - 2)
    out = np.zeros(idx.shape[0])
    for j in range(d):
        full = np.concatenate([idx, np.full((idx.shape[0], 2), j)], axis=1)
        out += t[packed_index(full, d)]
    return out
