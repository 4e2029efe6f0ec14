"""The blocked GEMM plan that computes packed sums over sorted tuples of coordinates (raw moments, and the
monomials of a Hermite expansion), and the prefix and suffix products it multiplies."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np

from .packing import packed_index, unique_indices

# Raw moments Σ_s y_s x_s^{⊗m}, packed.  A sorted L-tuple splits into a sorted prefix of
# length a and a sorted suffix of length b = L - a with last(prefix) <= first(suffix).  The
# prefixes are built in *colex* order (grouped by last index: those over range(c) form a
# head), the suffixes in lex order (grouped by first index: those over range(c, D) form a
# tail).  For boundaries 0 = c_0 < ... < c_K = D, GEMM j multiplies the prefixes with last
# index < c_{j+1} (a head) by the suffixes with first index in [c_j, c_{j+1}) (a contiguous
# block): every valid pair is computed exactly once; the only waste is the pairs with
# c_j <= first(suffix) < last(prefix) < c_{j+1}.  Boundaries: a small dynamic programme on a
# cost model of GEMM time (below), with the waste capped at _WASTE_LIMIT.

#: Cost of one GEMM with an m x n output, in flop-equivalents per sample (= per row of the
#: inner dimension): ``2 m n + _GEMM_EDGE (m + n) + _GEMM_CALL``.  The edge term is how a
#: thin GEMM falls short of the peak rate, the call term the fixed cost of one call (about
#: 1.5 µs, with the accumulation, at the 256-row batches below).  Fitted to single-threaded
#: OpenBLAS 0.3.31 on this project's 2-core AMD EPYC: the rate is ≈ peak / (1 + 12/m + 12/n)
#: (measured 20, 28, 38, 43 GFlop/s at m = n = 16, 32, 64, 128, ≈ 50 at large sizes).  Only
#: the plan depends on these constants, never the result's correctness; they are constants
#: so that every process plans (and rounds) alike.
_GEMM_EDGE = 24.0
_GEMM_CALL = 300.0
#: Executed GEMM flops are kept within this factor of the packed count 2·C(D+L-1, L).
_WASTE_LIMIT = 1.5
#: Boundary candidates of the plan (all of range(D + 1) when D is at most this).
_PLAN_CANDIDATES = 64
#: Row batches of the GEMM operands: about this many float64 elements (1 MiB, an L2 cache;
#: measured 1.1-1.7x faster than 4096-row batches at d = 8..50), but at least _MIN_ROWS
#: rows (GEMMs with a shorter inner dimension lose efficiency to their fixed costs).
_OPERAND_ELEMENTS = 2**17
_MIN_ROWS = 256


@dataclass(frozen=True)
class _MomentPlan:
    """GEMM blocks computing the packed sums over sorted ``order``-tuples of ``dim`` coordinates.

    ``gemms[j] = (m, s0, s1)``: the first ``m`` (colex) prefix products times the (lex)
    suffix products ``s0:s1``; ``offsets[j]`` is where its ``m x (s1 - s0)`` output starts
    in the flat accumulator of ``size`` entries; ``flops`` = ``2 Σ_j m (s1 - s0)`` per sample.
    """

    dim: int
    order: int
    prefix: int
    breaks: tuple[int, ...]
    gemms: tuple[tuple[int, int, int], ...]
    offsets: tuple[int, ...]
    size: int
    flops: int


def _plan_breaks(dim: int, a: int, b: int, waste_weight: float) -> tuple[float, int, tuple[int, ...]]:
    """Boundaries minimising the modelled time (waste flops weighted ``1 + waste_weight``).

    Returns ``(cost, flops, breaks)``; ``O(C^2)`` in the number ``C`` of candidate boundaries.
    """
    heads = [math.comb(c + a - 1, a) for c in range(dim + 1)]  # prefixes with last index < c
    tails = [math.comb(dim - c + b - 1, b) for c in range(dim + 1)]  # suffixes with first index >= c
    if dim <= _PLAN_CANDIDATES:
        cand = list(range(dim + 1))
    else:
        cand = sorted({round(dim * k / _PLAN_CANDIDATES) for k in range(_PLAN_CANDIDATES + 1)})
    # best[j] = (cost, flops, previous boundary) of the cheapest cover of suffix first indices < cand[j]
    best: list[tuple[float, int, int]] = [(0.0, 0, -1)]
    for j in range(1, len(cand)):
        hi = cand[j]
        opts = []
        for i in range(j):
            m, n = heads[hi], tails[cand[i]] - tails[hi]
            cost = (1.0 + waste_weight) * 2 * m * n + _GEMM_EDGE * (m + n) + _GEMM_CALL
            opts.append((best[i][0] + cost, best[i][1] + 2 * m * n, i))
        best.append(min(opts))
    breaks, j = [], len(cand) - 1
    while j >= 0:
        breaks.append(cand[j])
        j = best[j][2]
    return best[-1][0], best[-1][1], tuple(reversed(breaks))


@cache
def _moment_plan(dim: int, order: int) -> _MomentPlan:
    """The GEMM plan for sorted ``order``-tuples (``order >= 2``) over ``dim`` coordinates.

    Tries both prefix lengths ``floor(L/2)``, ``ceil(L/2)``; raises the weight of wasted
    flops until the plan executes at most ``_WASTE_LIMIT`` times the packed count (always
    reachable when every boundary is a candidate: one block per boundary value wastes
    nothing).  Pure: a function of ``(dim, order)`` only.
    """
    if order < 2 or dim < 1:
        raise ValueError(f"a GEMM plan needs order >= 2 and dim >= 1, got {order}, {dim}")
    packed = 2 * math.comb(dim + order - 1, order)
    prefixes = sorted({order // 2, order - order // 2})
    for weight in (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1e6):
        cost, flops, breaks, a = min(_plan_breaks(dim, a, order - a, weight) + (a,) for a in prefixes)
        if flops <= _WASTE_LIMIT * packed:
            break
    b = order - a
    tails = [math.comb(dim - c + b - 1, b) for c in breaks]
    gemms = tuple(
        (math.comb(hi + a - 1, a), tails[0] - tails[j], tails[0] - tails[j + 1]) for j, hi in enumerate(breaks[1:])
    )
    sizes = [m * (s1 - s0) for m, s0, s1 in gemms]
    offsets = tuple(int(o) for o in np.cumsum([0] + sizes[:-1]))
    return _MomentPlan(dim, order, a, breaks, gemms, offsets, sum(sizes), 2 * sum(sizes))


@lru_cache(maxsize=8)
def _plan_gather(dim: int, order: int) -> np.ndarray:
    """Positions in the plan's flat accumulator of the packed entries, in packed order."""
    plan = _moment_plan(dim, order)
    a, b = plan.prefix, order - plan.prefix
    pre = unique_indices(dim, a)
    pre = pre[np.lexsort(pre.T)]  # colex: last index first
    suf = unique_indices(dim, b)
    # packed_index is a sum of one-index terms, so rank(p ++ s) = rank(p ++ top) + rank(0 ++ s) - rank(0 ++ top)
    top, zero = np.full(b, dim - 1), np.zeros(a, dtype=np.int64)
    rank_pre = packed_index(np.hstack([pre, np.broadcast_to(top, (len(pre), b))]), dim)
    rank_suf = packed_index(np.hstack([np.broadcast_to(zero, (len(suf), a)), suf]), dim)
    rank_suf -= packed_index(np.concatenate([zero, top]), dim)
    gather = np.full(math.comb(dim + order - 1, order), -1, dtype=np.int64)
    for (m, s0, s1), off in zip(plan.gemms, plan.offsets):
        valid = pre[:m, -1, None] <= suf[None, s0:s1, 0]
        rank = rank_pre[:m, None] + rank_suf[None, s0:s1]
        gather[rank[valid]] = off + np.flatnonzero(valid)
    if (gather < 0).any():  # every sorted tuple must be covered by exactly one block
        raise AssertionError(f"GEMM plan for dim={dim}, order={order} misses entries")
    gather.flags.writeable = False
    return gather


def _colex_products(xt: np.ndarray, w: np.ndarray, a: int) -> np.ndarray:
    """``(C(D+a-1, a), n)``: ``w`` times the products of the rows of ``xt`` (``(D, n)``) over
    sorted ``a``-tuples, in colex order (by last index, then the rest in colex order).

    The tuples ending in ``j`` are the previous level's tuples over ``range(j + 1)`` (a
    head of it) followed by ``j``: contiguous slices only.
    """
    D, n = xt.shape
    prev = xt * w  # level 1
    for r in range(2, a + 1):
        out = np.empty((math.comb(D + r - 1, r), n))
        col = 0
        for j in range(D):
            h = math.comb(j + r - 1, r - 1)
            np.multiply(prev[:h], xt[j], out=out[col : col + h])
            col += h
        prev = out
    return prev


def _lex_products(xt: np.ndarray, b: int) -> np.ndarray:
    """``(C(D+b-1, b), n)`` products of the rows of ``xt`` over sorted ``b``-tuples, in
    ``combinations_with_replacement`` order (as ``moments._tuple_products``, rows for columns)."""
    D, n = xt.shape
    prev = xt  # level 1
    for r in range(2, b + 1):
        out = np.empty((math.comb(D + r - 1, r), n))
        col = 0
        for i in range(D):
            t = math.comb(D - i + r - 2, r - 1)
            np.multiply(xt[i], prev[prev.shape[0] - t :], out=out[col : col + t])
            col += t
        prev = out
    return prev
