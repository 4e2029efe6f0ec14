"""The exact step of ``exact``: each unit from a null vector of the labels' row span.

With ``rank U = k`` the ``m × n`` label matrix ``A = U f(V X)`` has the same row span as the
``k × n`` matrix ``f(V X)``; let ``B`` (k×n) be an orthonormal basis of it (the top-``k`` right
singular vectors of ``A``). On the samples ``S`` where unit ``i`` is inactive (``<v_i, x> ≤ 0``),
row ``f(v_i X)`` vanishes while the other ``k − 1`` rows stay linearly independent, so ``B_S``
(k×|S|) has a one-dimensional left null space ``c`` and ``r = c B = β f(v_i X)`` exactly, on all
samples. Where ``r > 0``, ``r^{1/c} = β^{1/c} <v_i, x>`` is a linear system for ``v_i`` (the scale
``β^{1/c} > 0`` is a positive rescaling, a symmetry of the network); ``U`` follows by least squares.

Only a rough ``v̂_i`` is needed to choose ``S``: the samples where ``<v̂_i, x>`` is most negative
(an error of 0.1 rad moves the boundary by ~0.1 standard deviations, far from the bottom 20 %).
Both signs of ``v̂_i`` are tried — with the wrong one ``S`` is where the unit is *active* and
``B_S`` has full rank — and ``S`` shrinks when the null vector is not clean. With noisy labels
the same step gives an estimate (refined afterwards by :mod:`.polish.refine`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...network import Network
from ..rectified import output_weights

__all__ = ["exact_step", "row_span", "min_samples", "INACTIVE_FRACTIONS", "CLEAN_GAP"]

#: fractions of the samples, most negative ``<v̂_i, x>`` first, tried as the inactive set ``S``
#: (largest first: more samples pin the null vector down better; smaller ones tolerate a worse ``v̂``)
INACTIVE_FRACTIONS = (0.2, 0.1, 0.05, 0.02)

#: a null vector is clean when ``σ_k(B_S) / σ_{k−1}(B_S)`` is below this (rounding gives ~1e-15;
#: a set ``S`` with active samples of unit ``i`` gives O(0.01–1))
CLEAN_GAP = 1e-10

#: the linear system ``r^{1/c} = <v, x>`` is solved on the samples where ``r`` is in this top
#: fraction: a Gaussian unit is active on half the samples, so the top 40 % are clearly active
#: (also with noisy labels, where small ``r`` are dominated by the noise)
ACTIVE_TOP = 0.4

#: inactive-set sizes below this multiple of ``k`` are not tried (the null vector of a ``k × |S|``
#: matrix needs ``|S| ≥ k − 1``; a margin makes a spurious null vector impossible)
MIN_INACTIVE_PER_UNIT = 4


def min_samples(d: int, k: int) -> int:
    """Fewest samples the exact step runs on: the largest inactive set must hold ``4k`` samples and
    each unit's linear system ``d + 1`` clearly active ones."""
    return max(int(np.ceil(MIN_INACTIVE_PER_UNIT * k / INACTIVE_FRACTIONS[0])), int(np.ceil((d + 1) / ACTIVE_TOP)))


def row_span(y: np.ndarray, k: int) -> np.ndarray:
    """``(k, n)`` orthonormal basis of the top-``k`` row span of the ``m × n`` label matrix ``yᵀ``."""
    p, _, _ = np.linalg.svd(y.reshape(len(y), -1), full_matrices=False)
    return p[:, :k].T


def _null_vector(bs: np.ndarray) -> tuple[np.ndarray, float]:
    """Left null vector of ``B_S`` and its gap ``σ_k / σ_{k−1}``."""
    left, sv, _ = np.linalg.svd(bs, full_matrices=False)
    gap = float(sv[-1] / sv[-2]) if len(sv) > 1 and sv[-2] > 0 else (0.0 if len(sv) == 1 else 1.0)
    return left[:, -1], gap


def _unit(x: np.ndarray, b: np.ndarray, direction: np.ndarray, power: int) -> tuple[np.ndarray, dict[str, Any]]:
    k, n = b.shape
    proj = x @ direction
    best = None
    for sign in (1.0, -1.0):
        for frac in INACTIVE_FRACTIONS:
            size = int(frac * n)
            if size < MIN_INACTIVE_PER_UNIT * k:
                break
            sel = np.argsort(sign * proj, kind="stable")[:size]
            c, gap = _null_vector(b[:, sel])
            if best is None or gap < best[0]:
                best = (gap, c, sign, frac, size)
            if gap <= CLEAN_GAP:
                break
        if best is not None and best[0] <= CLEAN_GAP:
            break
    if best is None:
        raise ValueError(
            f"the exact step needs at least {min_samples(x.shape[1], k)} samples for k = {k} units; got {n}"
        )
    gap, c, sign, frac, size = best
    r = c @ b
    if r.sum() < 0:  # r = β f(<v_i, x>) with f ≥ 0: choose β > 0
        r = -r
    active = (r >= np.quantile(r, 1.0 - ACTIVE_TOP)) & (r > 0)
    h = r[active] ** (1.0 / power)
    v, *_ = np.linalg.lstsq(x[active], h, rcond=None)
    fit = float(np.linalg.norm(x[active] @ v - h) / max(np.linalg.norm(h), 1e-300))
    return v, {
        "gap": gap,
        "clean": bool(gap <= CLEAN_GAP),
        "inactive_fraction": frac,
        "inactive_samples": size,
        "sign_flipped": bool(sign < 0),
        "active_samples": int(active.sum()),
        "fit_residual": fit,
    }


def exact_step(
    x: np.ndarray,
    y: np.ndarray,
    directions: np.ndarray,
    power: int,
    activation: str,
) -> tuple[Network, dict[str, Any]]:
    """Every unit exactly (noiseless labels, ``rank U = k``) from rough directions.

    Parameters
    ----------
    x, y
        Bounded training sample, ``(n, d)`` and ``(n, m)``.
    directions
        ``(k, d)`` rough directions ``v̂_i`` (any norms; signs are checked, both are tried).
    power
        ``c`` of ``f = max(z, 0)^c``.
    activation
        Its name, for the returned network.

    Returns
    -------
    (Network, dict)
        ``Network((V, U))`` and a report: per unit, the null vector's ``gap`` (``σ_k/σ_{k−1}``
        of ``B_S``; ``clean`` when ≤ :data:`CLEAN_GAP`), the inactive set used, whether the
        estimate's sign was flipped, and the residual of the unit's linear system.
    """
    y = y.reshape(len(y), -1)
    k = directions.shape[0]
    if y.shape[1] < k:
        raise ValueError(f"the exact step needs rank(U) = k, so at least k outputs: m = {y.shape[1]} < k = {k}")
    b = row_span(y, k)
    units, rows = [], []
    for i in range(k):
        v, rep = _unit(x, b, directions[i], power)
        rows.append(v)
        units.append(rep)
    v = np.array(rows)
    u = output_weights(x, y, v, power)
    return Network((v, u), activation=activation), {"units": units, "all_clean": all(r["clean"] for r in units)}
