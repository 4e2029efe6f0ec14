"""Raw moments ``Σ_s y_s x_s^{⊗m}``, packed, by the blocked GEMMs of :mod:`relulearn.hermite.plan`."""

from __future__ import annotations

import math

import numpy as np

from . import batching  # _TEMP_ELEMENTS read at call time: one setting bounds every batch
from .batching import _row_batches
from .packing import packed_index, unique_indices
from .plan import _MIN_ROWS, _OPERAND_ELEMENTS, _colex_products, _lex_products, _moment_plan, _plan_gather

__all__ = ["raw_moment_sums", "raw_moment_sums_upto", "raw_moment_flops"]


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


def _sorted_tuple_sums(x: np.ndarray, y: np.ndarray, order: int, constant: bool, budget: int | None) -> np.ndarray:
    """Packed ``Σ_s y_s Π_k z_s[i_k]`` over sorted ``order``-tuples (``order >= 2``) of the
    coordinates ``z = [1, x]`` (``constant``) or ``z = x``: one GEMM per plan block and row batch."""
    n, d = x.shape
    dim = d + int(constant)
    plan = _moment_plan(dim, order)
    a, b = plan.prefix, order - plan.prefix
    row_elements = dim + math.comb(dim + a - 1, a) + math.comb(dim + b - 1, b)
    budget = min(
        batching._TEMP_ELEMENTS if budget is None else budget, max(_OPERAND_ELEMENTS, _MIN_ROWS * row_elements)
    )
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
