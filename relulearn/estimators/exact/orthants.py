"""Arbitrary inputs: the units of ``A = U f(V X)`` by enumerating zero patterns of the row span.

No input distribution is assumed (Bakshi–Jayaram–Woodruff's algorithm for arbitrary X, exponential
in ``k``). With ``rank A = k``, the ``k`` rows ``f(v_i X)`` are a basis of the row span of ``A``;
let ``B`` (k×n) be an orthonormal one. Row ``f(v_i X)`` vanishes on the samples where unit ``i`` is
inactive; any ``k − 1`` of them (generic, non-zero columns of ``B``) span a hyperplane of ``R^k``
whose normal ``c`` gives ``c B ∝ f(v_i X)`` exactly. So every ``(k−1)``-subset of non-zero columns
is a candidate normal; a candidate is kept when ``c B`` is zero on more columns than the subset
forced and of one sign elsewhere; then ``r^{1/c} = <v, x>`` on its positive entries must be an
exactly consistent linear system with ``<v, x> ≤ 0`` on its zero set. Candidates are formed in
chunks of numpy arrays (generalised cross products by ``(k−1)``-minors); distinct zero patterns
are deduplicated before the linear systems are solved.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

__all__ = ["enumerate_units", "enumeration_cost", "ENUMERATION_BUDGET", "MIN_SAMPLES_PER_UNIT"]

#: entries of candidate rows (candidates × samples) the enumeration may form; ~1 s per 1e8 in
#: chunks, so a few seconds at most
ENUMERATION_BUDGET = 1e8

#: candidate rows formed per chunk (memory: chunk × n floats)
CHUNK = 4096

#: the enumeration runs over at least this many non-zero columns per unit, so that every unit's
#: zero set (about half of them for a unit through the data's centre) holds ``k − 1`` columns
ENUM_COLUMNS_PER_UNIT = 4

#: relative size below which an entry of a candidate row is zero (exact rows are zero to ~1e-15)
ZERO_TOL = 1e-9

#: a unit is exact when ``f(<v, x>)`` reproduces its row to this fraction of the row's maximum
FIT_TOL = 1e-10

#: a candidate row from a (k−1)-subset is kept for the final refit below this misfit (a subset
#: holding a column just past the unit's boundary gives a slightly tilted but still close row)
CANDIDATE_TOL = 1e-5

#: the linear system ``r^{1/c} = <v, x>`` uses the entries with ``r`` above this fraction of its
#: maximum: ``r^{1/c}`` amplifies the rounding of small ``r`` (by ``r^{1/c − 1}/c``)
FIT_FLOOR = 1e-3

#: the refit's inactive set: ``<v, x>`` below minus this fraction of ``max |<v, x>|``
INACTIVE_MARGIN = 1e-3

#: candidates whose unit directions differ by less than this are one unit
SAME_DIRECTION = 1e-4

#: rank of ``A``: singular values below this fraction of the largest are zero
RANK_TOL = 1e-9

#: each unit must be active on at least ``d +`` this many samples (an overdetermined system is a check)
MIN_SAMPLES_PER_UNIT = 5


def enumeration_cost(n: int, k: int) -> float:
    """Entries of candidate rows formed when enumerating over ``n`` columns: ``C(n, k−1) · n``."""
    return float(math.comb(n, k - 1)) * n


def _normals(cols: np.ndarray) -> np.ndarray:
    """Normals of the hyperplanes spanned by ``(M, k, k−1)`` column sets: generalised cross products
    ``c_a = (−1)^a det(minor without row a)`` (zero when the columns are dependent)."""
    m, k, _ = cols.shape
    if k == 1:
        return np.ones((m, 1))
    out = np.empty((m, k))
    for a in range(k):  # k determinants of (k−1)×(k−1) minors, batched over all M subsets
        minor = np.delete(cols, a, axis=1)
        out[:, a] = (-1) ** a * (np.linalg.det(minor) if k > 2 else minor[:, 0, 0])
    return out


def _subsets(n: int, size: int, chunk: int):
    it = itertools.combinations(range(n), size)
    while True:
        block = np.fromiter(itertools.chain.from_iterable(itertools.islice(it, chunk)), dtype=np.int64)
        if block.size == 0:
            return
        yield block.reshape(-1, size)


def _fit_row(x: np.ndarray, r: np.ndarray, power: int) -> tuple[np.ndarray | None, float]:
    """``v`` from ``r^{1/c} = <v, x>`` on the clearly positive entries of a candidate row ``r ≥ 0``, and
    the misfit ``max_n |f(<v, x_n>) − r_n| / max r`` over all samples (zero set included)."""
    top = float(r.max())
    if top <= 0:
        return None, np.inf
    active = r > FIT_FLOOR * top
    if active.sum() < x.shape[1] + 1:
        return None, np.inf
    v, *_ = np.linalg.lstsq(x[active], r[active] ** (1.0 / power), rcond=None)
    return v, float(np.max(np.abs(np.maximum(x @ v, 0.0) ** power - r)) / top)


def _refit(x: np.ndarray, b: np.ndarray, v: np.ndarray, power: int) -> tuple[np.ndarray | None, float, int]:
    """Unit ``v`` again from the left null vector of ``B`` on all samples where ``v`` is clearly inactive."""
    proj = x @ v
    inactive = proj < -INACTIVE_MARGIN * np.abs(proj).max()
    if inactive.sum() < b.shape[0] - 1:
        return None, np.inf, int(inactive.sum())
    left = np.linalg.svd(b[:, inactive], full_matrices=True)[0]
    r = left[:, -1] @ b
    if r @ np.maximum(proj, 0.0) < 0:
        r = -r
    w, misfit = _fit_row(x, r, power)
    return w, misfit, int(inactive.sum())


def _check_samples(n: int, d: int, k: int) -> None:
    """Refuse ``k < 1`` and fewer samples than every unit needs active and inactive."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if n < 2 * (d + MIN_SAMPLES_PER_UNIT):
        raise ValueError(
            f"too few samples: {n}; each unit must be active on at least d + {MIN_SAMPLES_PER_UNIT} = "
            f"{d + MIN_SAMPLES_PER_UNIT} samples and inactive on some, so at least "
            f"{2 * (d + MIN_SAMPLES_PER_UNIT)} samples are needed (a few hundred are typical)"
        )


def _row_basis(y: np.ndarray, k: int) -> np.ndarray:
    """An orthonormal basis ``B`` (k×n) of the labels' row span, refusing ``rank(A) ≠ k``."""
    p, sv, _ = np.linalg.svd(y, full_matrices=False)
    rank = int(np.count_nonzero(sv > RANK_TOL * sv[0])) if sv.size and sv[0] > 0 else 0
    if rank != k:
        raise ValueError(
            f"rank(A) = {rank} but k = {k}: the arbitrary-input algorithm needs the labels' row span to be "
            f"exactly the span of the k hidden units' outputs (at least k outputs, U of rank k, noiseless labels; "
            f"singular values {', '.join(f'{s:.3g}' for s in sv[: k + 2])})"
        )
    return p[:, :k].T


def _enumerated_columns(b: np.ndarray, k: int) -> tuple[np.ndarray, int]:
    """The non-zero columns of ``B`` and how many of them (the first) the enumeration's budget allows,
    refusing ``k`` when even the fewest useful columns exceed it."""
    n = b.shape[1]
    col_norm = np.linalg.norm(b, axis=0)
    nonzero = np.flatnonzero(col_norm > ZERO_TOL * col_norm.max())
    n_enum = len(nonzero)
    while n_enum > ENUM_COLUMNS_PER_UNIT * k and enumeration_cost(n_enum, k) > ENUMERATION_BUDGET:
        n_enum -= 1
    if enumeration_cost(n_enum, k) > ENUMERATION_BUDGET:
        raise ValueError(
            f"k = {k} is too large for the arbitrary-input enumeration: even over {n_enum} columns it forms "
            f"C({n_enum}, {k - 1}) = {math.comb(n_enum, k - 1):.3g} candidate rows of {n} samples "
            f"({enumeration_cost(n_enum, k):.3g} entries; budget {ENUMERATION_BUDGET:.0e}); the cost grows like "
            "n^(k−1): use Gaussian inputs and the tensor path (learn) for larger k"
        )
    return nonzero, n_enum


def _block_patterns(cols: np.ndarray, bn: np.ndarray, k: int, patterns: dict[bytes, np.ndarray]) -> None:
    """Add to ``patterns`` (zero pattern → signed row, first one kept) the candidate rows of a block of
    ``(M, k, k−1)`` column subsets that vanish on more columns than forced and are of one sign elsewhere."""
    c = _normals(cols)
    cn = np.linalg.norm(c, axis=1)
    scale = np.prod(np.linalg.norm(cols, axis=1), axis=1)
    ok = cn > 1e-8 * scale  # dependent columns span no hyperplane
    c = c[ok] / cn[ok, None]
    rows = c @ bn  # (M, n_nonzero)
    mag = np.abs(rows)
    zero = mag <= ZERO_TOL * mag.max(axis=1, keepdims=True)
    many = zero.sum(axis=1) > k - 1
    if not many.any():
        return
    rows, zero = rows[many], zero[many]
    pos = np.where(zero, True, rows > 0).all(axis=1)
    neg = np.where(zero, True, rows < 0).all(axis=1)
    one_sign = pos | neg
    if not one_sign.any():
        return
    rows, zero, sign = rows[one_sign], zero[one_sign], np.where(pos, 1.0, -1.0)[one_sign]
    keys, first = np.unique(np.packbits(zero, axis=1), axis=0, return_index=True)
    for key, i in zip(keys, first):
        patterns.setdefault(key.tobytes(), sign[i] * rows[i])


def _zero_patterns(b: np.ndarray, nonzero: np.ndarray, n_enum: int, k: int) -> tuple[dict[bytes, np.ndarray], int]:
    """The distinct zero patterns (and their rows on the non-zero columns) of the candidate rows from
    every ``(k−1)``-subset of the first ``n_enum`` non-zero columns, and the number of subsets tried."""
    enum_cols = nonzero[:n_enum]
    bn = b[:, nonzero]
    patterns: dict[bytes, np.ndarray] = {}
    tried = 0
    for block in _subsets(n_enum, k - 1, CHUNK):
        tried += len(block)
        _block_patterns(b[:, enum_cols[block]].transpose(1, 0, 2), bn, k, patterns)  # (M, k, k−1)
    return patterns, tried


def _distinct_candidates(
    x: np.ndarray, patterns: dict[bytes, np.ndarray], nonzero: np.ndarray, power: int
) -> list[tuple[float, np.ndarray]]:
    """``(misfit, v)`` of the candidate rows that fit a unit, the best one per distinct direction."""
    n = x.shape[0]
    found: list[tuple[float, np.ndarray]] = []
    for r_nz in patterns.values():
        r = np.zeros(n)
        r[nonzero] = r_nz
        v, misfit = _fit_row(x, r, power)
        if v is None or misfit > CANDIDATE_TOL:
            continue
        nu = v / np.linalg.norm(v)
        same = [j for j, (_, w) in enumerate(found) if np.linalg.norm(nu - w / np.linalg.norm(w)) <= SAME_DIRECTION]
        if not same:
            found.append((misfit, v))
        elif misfit < found[same[0]][0]:
            found[same[0]] = (misfit, v)
    return found


def _exact_units(
    x: np.ndarray, b: np.ndarray, found: list[tuple[float, np.ndarray]], power: int
) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """Each candidate once more from the null vector of its whole inactive set (:func:`_refit`): the
    units that fit exactly, and per unit its inactive samples and misfit."""
    units, info = [], []
    for _, v in found:
        w, misfit, inactive = _refit(x, b, v, power)
        if w is not None and misfit <= FIT_TOL:
            units.append(w)
            info.append({"inactive_samples": inactive, "misfit": misfit})
    return units, info


def enumerate_units(x: np.ndarray, y: np.ndarray, k: int, power: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The hidden weights ``V`` (k×d, up to positive scale) of ``A = U f(V X)`` for arbitrary ``X``.

    Parameters
    ----------
    x
        ``(n, d)`` inputs, any distribution.
    y
        ``(n, m)`` noiseless labels with ``rank = k``.
    k
        Number of units.
    power
        ``c`` of ``f = max(z, 0)^c``.

    Returns
    -------
    (np.ndarray, dict)
        ``V`` and a report (subsets tried, candidate patterns, units accepted).

    Raises
    ------
    ValueError
        For ``rank(A) ≠ k``, too few samples, ``k`` beyond the enumeration budget (with its cost),
        or fewer than ``k`` units found.
    """
    y = y.reshape(len(y), -1)
    n, d = x.shape
    _check_samples(n, d, k)
    b = _row_basis(y, k)
    nonzero, n_enum = _enumerated_columns(b, k)
    patterns, tried = _zero_patterns(b, nonzero, n_enum, k)
    found = _distinct_candidates(x, patterns, nonzero, power)  # one per distinct direction
    units, info = _exact_units(x, b, found, power)
    report = {
        "samples": int(n),
        "columns_enumerated": int(n_enum),
        "subsets": int(tried),
        "zero_patterns": len(patterns),
        "units": info,
    }
    if len(units) != k:
        raise ValueError(
            f"found {len(units)} units consistent with the labels, not k = {k}: a unit is active on fewer than "
            f"d + 1 = {d + 1} samples, inactive on fewer than k − 1 = {k - 1} of the {n_enum} enumerated samples, or "
            "the labels are not exactly A = U f(V X) (noise, biases, another activation)"
        )
    return np.array(units), report
