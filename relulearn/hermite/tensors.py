"""Hermite tensors by their matching-sum definition: ``He_l(x)`` of one sample, and ``T_l`` from raw moments."""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import cache, lru_cache

import numpy as np

from .packing import _full_indices, packed_index, unique_indices

__all__ = ["partial_matchings", "raw_to_hermite", "hermite_tensor"]


@cache
def partial_matchings(l: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """All partial matchings of positions ``0..l-1`` as tuples of pairs ``(a, b)``, a < b."""

    def rec(pos: tuple[int, ...]) -> Iterator[tuple[tuple[int, int], ...]]:
        if not pos:
            yield ()
            return
        first, rest = pos[0], pos[1:]
        yield from rec(rest)  # first position unmatched
        for j, other in enumerate(rest):
            for m in rec(rest[:j] + rest[j + 1 :]):
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


def raw_to_hermite(raw: dict[int, np.ndarray], d: int, l: int) -> np.ndarray:
    """Packed ``T_l = E[y He_l(x)]`` from packed raw moments ``R_m = E[y x^{(x)m}]``.

    Exact matching-sum: a matching with ``p`` pairs contributes ``(-1)^p`` times
    ``R_{l-2p}`` at the unmatched indices, on entries whose matched indices agree.
    Linear, so sums instead of means give sums.  Needs ``raw[m]`` for
    ``m = l, l-2, ...``; other keys are ignored.
    """
    for m in range(l % 2, l + 1, 2):
        if m not in raw:
            raise KeyError(f"raw moment of order {m} is needed for T_{l}")
        if np.shape(raw[m]) != (math.comb(d + m - 1, m),):
            raise ValueError(f"raw[{m}] has shape {np.shape(raw[m])}, expected packed d={d}")
    count = math.comb(d + l - 1, l)
    plan = _cached_plan(d, l) if count <= _CACHED_PLAN else _plan(d, l)
    out = np.zeros(count)
    for sign, rows, pos, m in plan:
        out[rows] += sign * np.asarray(raw[m], dtype=np.float64)[pos]
    return out


#: matching-sum plans are kept for tensors of up to this many unique entries (a few MiB each, eight at most): a run
#: converts every chunk's raw moments with the same plan, whose index arithmetic cost more than the sums
_CACHED_PLAN = 2**18


def _plan(d: int, l: int) -> tuple[tuple[int, np.ndarray, np.ndarray, int], ...]:
    """The terms of :func:`raw_to_hermite`: per partial matching, its sign, the entries of ``T_l`` it adds to, the
    positions in ``R_m`` it reads and ``m`` (the unmatched count)."""
    idx = unique_indices(d, l)
    plan = []
    for sign, mask, free in _matching_terms(idx):
        rows = np.flatnonzero(mask)
        # idx rows are sorted, so the unmatched sub-index is sorted too.
        plan.append((sign, rows, packed_index(idx[rows][:, free], d), len(free)))
    return tuple(plan)


@lru_cache(maxsize=8)
def _cached_plan(d: int, l: int) -> tuple[tuple[int, np.ndarray, np.ndarray, int], ...]:
    plan = _plan(d, l)
    for _, rows, pos, _ in plan:
        rows.setflags(write=False)
        pos.setflags(write=False)
    return plan


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
