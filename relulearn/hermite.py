"""Hermite polynomials, Hermite tensors and their moment estimators.

Conventions (docs/design.md section 3): probabilists' Hermite polynomials ``He_k``;
the Hermite tensor ``He_l(x)`` is the sum over partial matchings of the ``l``
index positions (matched pair -> ``-delta``, unmatched position -> ``x_i``);
``T_l = E[y He_l(x)]``.  Symmetric tensors are stored *packed*: the entries with
``i1 <= ... <= il`` in ``itertools.combinations_with_replacement`` order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

# scipy's BLAS (the contracted matrices' syrk) is imported with this module, not on first use, so that
# it is loaded before any ``threadpool_limits(1)`` of a worker or of the in-process loop, which then
# covers it too (and ``worker.platform_id`` lists it).
from scipy.linalg.blas import dsyr2k as _dsyr2k
from scipy.linalg.blas import dsyrk as _dsyrk

__all__ = [
    "subtract_expansion",
    "hermite_e",
    "relu_hermite_coefficient",
    "activation_hermite_coefficients",
    "unique_indices",
    "packed_index",
    "pack",
    "unpack",
    "partial_matchings",
    "raw_moment_sums",
    "raw_moment_sums_upto",
    "raw_moment_flops",
    "raw_to_hermite",
    "hermite_tensor",
    "contracted_coefficients",
    "contracted_matrix_sums",
    "contracted_vector_sums",
    "contracted_scalar_sums",
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
        weights = (half * wt).ravel() * np.exp(-(nodes**2) / 2) / math.sqrt(2.0 * math.pi)
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


def unpack(packed: np.ndarray, d: int, l: int) -> np.ndarray:
    """Full symmetric tensor of shape ``(d,)*l`` from its packed entries."""
    packed = np.asarray(packed)
    if packed.shape != (math.comb(d + l - 1, l),):
        raise ValueError(f"packed shape {packed.shape} does not match d={d}, l={l}")
    if l == 0:
        return packed.reshape(())
    return packed[packed_index(_full_indices(d, l), d)].reshape((d,) * l)


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


def _row_batches(n: int, row_elements: int, budget: int | None = None) -> Iterator[slice]:
    """Row slices so that a temporary of ``rows * row_elements`` stays under budget
    (``_TEMP_ELEMENTS`` unless ``budget`` is given)."""
    budget = _TEMP_ELEMENTS if budget is None else budget
    rows = max(1, budget // max(1, row_elements))
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
            tail = prev[:, prev.shape[1] - math.comb(d - i + r - 2, r - 1) :]
            np.multiply(x[:, i : i + 1], tail, out=out[:, col : col + tail.shape[1]])
            col += tail.shape[1]
        prev = out
    return prev


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
    ``combinations_with_replacement`` order (as :func:`_tuple_products`, rows for columns)."""
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


def _sorted_tuple_sums(x: np.ndarray, y: np.ndarray, order: int, constant: bool, budget: int | None) -> np.ndarray:
    """Packed ``Σ_s y_s Π_k z_s[i_k]`` over sorted ``order``-tuples (``order >= 2``) of the
    coordinates ``z = [1, x]`` (``constant``) or ``z = x``: one GEMM per plan block and row batch."""
    n, d = x.shape
    dim = d + int(constant)
    plan = _moment_plan(dim, order)
    a, b = plan.prefix, order - plan.prefix
    row_elements = dim + math.comb(dim + a - 1, a) + math.comb(dim + b - 1, b)
    budget = min(_TEMP_ELEMENTS if budget is None else budget, max(_OPERAND_ELEMENTS, _MIN_ROWS * row_elements))
    acc = np.zeros(plan.size)
    views = [acc[off : off + m * (s1 - s0)].reshape(m, s1 - s0) for (m, s0, s1), off in zip(plan.gemms, plan.offsets)]
    for sl in _row_batches(n, row_elements, budget):
        # coordinates as rows: a block of tuples is then a contiguous row range for BLAS
        zt = np.empty((dim, sl.stop - sl.start))
        if constant:
            zt[0] = 1.0
        zt[int(constant) :] = x[sl].T
        left = _colex_products(zt, y[sl], a)
        right = _lex_products(zt, b)
        for view, (m, s0, s1) in zip(views, plan.gemms):
            view += left[:m] @ right[s0:s1].T
    return acc[_plan_gather(dim, order)]


def _check_xy(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``x`` of shape ``(n, d)`` and ``y`` of shape ``(n,)``."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"x must have shape (n, d) and y shape (n,), got {x.shape}, {y.shape}")
    return x, y


def raw_moment_sums_upto(
    x: np.ndarray, y: np.ndarray, max_order: int, *, _temp_elements: int | None = None
) -> list[np.ndarray]:
    """Packed ``Σ_s y_s x_s^{(x)m}`` for every ``m = 0..max_order``, in one pass.

    With the constant coordinate ``z = [1, x]``, the sorted ``L``-tuples over ``d + 1``
    coordinates hold every product of order ``m <= L`` exactly once, and in packed order
    over ``z`` they are orders ``0, 1, ..., L`` one after the other (the tuples starting
    with the constant come first).  They are computed by blocked GEMMs that skip nearly all
    unsorted (prefix, suffix) pairs: :func:`raw_moment_flops` gives the flops executed.

    Parameters
    ----------
    x : np.ndarray
        Shape ``(n, d)``.
    y : np.ndarray
        Shape ``(n,)``.
    max_order : int
        Highest order ``L >= 0``.
    _temp_elements : int, optional
        Private: the temporaries' budget in float64 elements (default ``_TEMP_ELEMENTS``).

    Returns
    -------
    list of np.ndarray
        Entry ``m`` has shape ``(C(d+m-1, m),)``.
    """
    x, y = _check_xy(x, y)
    if max_order < 0:
        raise ValueError(f"max_order must be >= 0, got {max_order}")
    d = x.shape[1]
    if max_order == 0:
        return [np.array([y.sum()])]
    if max_order == 1:
        return [np.array([y.sum()]), x.T @ y]
    flat = _sorted_tuple_sums(x, y, max_order, True, _temp_elements)
    ends = [math.comb(d + m, m) for m in range(max_order + 1)]  # Σ_{m' <= m} C(d+m'-1, m')
    return [flat[e - math.comb(d + m - 1, m) : e] for m, e in enumerate(ends)]


def raw_moment_flops(d: int, max_order: int) -> int:
    """Flops per sample executed by :func:`raw_moment_sums_upto` (pure; no data needed).

    Counts the multiply-adds of its GEMMs (2 flops each), as the packed model count
    ``2 Σ_m C(d+m-1, m) = 2 C(d+L, L)`` does; not counted: the ``C(d+a, a) + C(d+b, b)``
    elementwise products per sample that build the GEMM operands (``a + b = L``).
    Orders 0 and 1 are a sum and a matrix-vector product, exactly the packed count.
    """
    if max_order <= 1:
        return 2 * math.comb(d + max_order, max_order)
    return _moment_plan(d + 1, max_order).flops


def raw_moment_sums(x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """Packed unique entries of ``sum_s y_s x_s^{(x)m}`` (one order).

    The blocked GEMMs of :func:`raw_moment_sums_upto` over the coordinates of ``x`` alone
    (no constant coordinate).  For several orders, one call of
    :func:`raw_moment_sums_upto` is cheaper than one call per order.

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
    x, y = _check_xy(x, y)
    if m < 0:
        raise ValueError(f"order must be >= 0, got {m}")
    if m == 0:
        return np.array([y.sum()])
    if m == 1:
        return x.T @ y
    return _sorted_tuple_sums(x, y, m, False, None)


def _raw_moment_sums_pairs(x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """The former :func:`raw_moment_sums`, kept as a reference and for the benchmark's
    before/after comparison: one GEMM of all (sorted ``a``-tuple, sorted ``b``-tuple)
    pairs, ``a = ceil(m/2)``, ``b = floor(m/2)``, unsorted pairs included
    (``2 C(d+a-1, a) C(d+b-1, b)`` flops per sample)."""
    x, y = _check_xy(x, y)
    n, d = x.shape
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


# ------------------------------------------------------------- Hermite expansions


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
