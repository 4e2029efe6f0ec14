"""Rank-deficient ``U`` (``m < k``): the fixed-parameter algorithm of Bakshi–Jayaram–Woodruff (noiseless).

On a sample where exactly one unit ``i`` is active, ``A_n = u_i f(<v_i, x_n>)`` is a positive
multiple of the column ``u_i`` (about ``2^{-k}`` of Gaussian samples per unit). Columns where two
or more units are active are generic and never repeat a direction, and all-inactive columns are
zero; so the 1-sparse columns are exactly the clusters of *positively parallel* columns — found up
to rounding by sorting the unit directions along a random projection. Each cluster gives a
column of ``U`` (up to positive scale) and, from its samples, the linear system

    (|A_n| / |u_i|)^{1/c} = <v_i, x_n>

(``|u_i|^{1/c}`` is a positive rescaling: set ``|u_i| = 1``); then ``U`` by least squares.

A pair of opposite columns ``u_{i'} = −s u_i`` (allowed) adds samples where just ``i`` and ``i'``
are active, whose columns ``u_i (f_i − s f_{i'})`` also lie on the line of ``u_i``: the two opposite
clusters then mix 1-sparse samples with these. They are separated by alternating between the two
units: the samples of the ``+u`` cluster where the current ``v_{i'}`` is most negative are
1-sparse in ``i``, which fixes ``v_i`` exactly, and vice versa. Two *positively* parallel columns
cannot be separated (their 1-sparse samples fall in one cluster that fits no single linear
system); this is refused with that reason.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...network import Network
from .. import base
from ..rectified import output_weights

__all__ = ["fixed_parameter", "samples_needed", "TooFewSamplesError", "FIXED_MARGIN", "FIXED_SAFETY"]

#: 1-sparse samples per unit beyond ``d``: the linear system is then overdetermined, so its exact
#: consistency is a check (a merged cluster of two units fails it)
FIXED_MARGIN = 10

#: safety factor on ``(d + margin) 2^k``: ``2^{-k}`` is the 1-sparse fraction for orthogonal
#: units; random units, the Binomial spread of the counts, and opposite pairs (whose clusters are
#: split before use) need more
FIXED_SAFETY = 4

#: consecutive unit columns (sorted along a random projection) closer than this are one direction:
#: 1-sparse columns agree to a few ulp
PARALLEL_TOL = 1e-12

#: two clusters are an opposite pair when their mean directions sum to less than this
PAIR_TOL = 1e-8

#: a cluster's fit drops, once, the samples whose residual exceeds this multiple of the median
#: residual (exact samples have residuals at rounding level, all alike)
TRIM = 1e3

#: a cluster's linear system is consistent when its relative residual is below this
FIT_TOL = 1e-9

#: columns with norm below this fraction of the largest are zero (all units inactive)
ZERO_TOL = 1e-13

#: an opposite pair is resolved on the samples of each cluster where the partner unit is most
#: negative: these fractions, shrinking with the alternations while the partner is not yet exact
#: (the partner is inactive on a third to two thirds of a cluster's samples)
PAIR_FRACTIONS = (0.4, 0.3, 0.2, 0.1)

#: an opposite pair's smaller cluster should hold this many times ``d + margin`` samples: a third to
#: two thirds of a cluster is 1-sparse, depending on the two units' scales
PAIR_CLUSTER_FACTOR = 3

#: alternations between the two units of an opposite pair (each exact once its set is pure)
PAIR_ITERATIONS = 30

_CLUSTER_STREAM = 0xC1A57  # seeds the random projection that orders the unit columns


class TooFewSamplesError(base.TooFewSamplesError):
    """Too few samples for every unit to be alone on enough of them; ``needed`` is an estimate."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = int(needed)


def samples_needed(d: int, k: int) -> int:
    """Samples for every unit to be the only active one on ``≥ d + margin`` samples (Gaussian inputs)."""
    return int((d + FIXED_MARGIN) * 2**k * FIXED_SAFETY)


def _clusters(y: np.ndarray, seed: int) -> list[np.ndarray]:
    """Index arrays of the samples whose columns are positively parallel (size ≥ 2), largest first."""
    norms = np.linalg.norm(y, axis=1)
    nz = np.flatnonzero(norms > ZERO_TOL * max(float(norms.max(initial=0.0)), 1e-300))
    if nz.size < 2:
        return []
    dirs = y[nz] / norms[nz, None]
    g = np.random.default_rng((int(seed), _CLUSTER_STREAM)).standard_normal(y.shape[1])
    order = np.argsort(dirs @ g, kind="stable")
    same = np.linalg.norm(np.diff(dirs[order], axis=0), axis=1) <= PARALLEL_TOL
    # runs of consecutive equal directions
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    ends = np.concatenate([starts[1:], [len(order)]])
    groups = [nz[order[a:b]] for a, b in zip(starts, ends) if b - a >= 2]
    return sorted(groups, key=len, reverse=True)


def _solve(x: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, float]:
    """``v`` with ``x v = h`` and the relative residual; one trimming pass drops the rare samples
    whose residual is far above the rest (a second unit just past its boundary, ``f`` below
    :data:`PARALLEL_TOL` — with ``relu3``, ``<v, x> ≲ 1e-4`` — leaves its column in the cluster)."""
    v, *_ = np.linalg.lstsq(x, h, rcond=None)
    r = np.abs(x @ v - h)
    keep = r <= TRIM * float(np.median(r))
    if not keep.all() and keep.sum() >= x.shape[1] + 1:
        v, *_ = np.linalg.lstsq(x[keep], h[keep], rcond=None)
        x, h = x[keep], h[keep]
    return v, float(np.linalg.norm(x @ v - h) / max(np.linalg.norm(h), 1e-300))


def _direction(cols: np.ndarray) -> np.ndarray:
    """Mean unit direction of a cluster's columns."""
    s = np.sum(cols / np.linalg.norm(cols, axis=1, keepdims=True), axis=0)
    return s / np.linalg.norm(s)


def _pure(x: np.ndarray, partner: np.ndarray, exact: bool, it: int, need: int) -> np.ndarray:
    """Samples of a cluster taken as 1-sparse: where the partner unit is inactive (exactly so once the
    partner's fit is exact), else the most negative fraction of ``<partner, x>``, shrinking."""
    proj = x @ partner
    if exact:
        sel = np.flatnonzero(proj <= 0)
        if len(sel) >= need:
            return sel
    frac = PAIR_FRACTIONS[min(it, len(PAIR_FRACTIONS) - 1)]
    return np.argsort(proj, kind="stable")[: max(need, int(frac * len(proj)))]


def _resolve_pair(
    g_plus: np.ndarray, x_plus: np.ndarray, g_minus: np.ndarray, x_minus: np.ndarray, power: int, need: int
) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Units ``i`` (cluster ``+u``, values ``g_plus > 0``) and ``i'`` (cluster ``−u``, ``|g_minus|``)."""
    hp, hm = g_plus ** (1.0 / power), np.abs(g_minus) ** (1.0 / power)
    p, rp = _solve(x_plus, hp)
    q, rq = _solve(x_minus, hm)
    for it in range(PAIR_ITERATIONS):
        sel_p = _pure(x_plus, q, rq <= FIT_TOL, it, need)
        p, rp = _solve(x_plus[sel_p], hp[sel_p])
        sel_m = _pure(x_minus, p, rp <= FIT_TOL, it, need)
        q, rq = _solve(x_minus[sel_m], hm[sel_m])
        if max(rp, rq) <= FIT_TOL and len(sel_m) == np.count_nonzero(x_minus @ p <= 0):
            sel_p = _pure(x_plus, q, True, it, need)  # one more pass on the exact partner's pure set
            p, rp = _solve(x_plus[sel_p], hp[sel_p])
            if rp <= FIT_TOL:
                return p, q, max(rp, rq), it + 1
    return p, q, max(rp, rq), PAIR_ITERATIONS


def _opposite_pairs(dirs: list[np.ndarray]) -> dict[int, int]:
    """Each cluster's partner, for the pairs of clusters with opposite mean directions (greedy, in order)."""
    partner: dict[int, int] = {}
    for a in range(len(dirs)):
        for b in range(a + 1, len(dirs)):
            if a not in partner and b not in partner and np.linalg.norm(dirs[a] + dirs[b]) <= PAIR_TOL:
                partner[a], partner[b] = b, a
    return partner


def _fit_pair(
    x: np.ndarray, y: np.ndarray, groups: list[np.ndarray], a: int, b: int, direction: np.ndarray, power: int, need: int
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """The units of the opposite clusters ``a`` (along ``direction``) and ``b`` and their report rows;
    refuses (with the samples needed) a pair that does not separate."""
    g, gb = groups[a], groups[b]
    p, q, res, its = _resolve_pair(y[g] @ direction, x[g], y[gb] @ direction, x[gb], power, need)
    if res > FIT_TOL:
        # a cluster of the pair holds fewer than d 1-sparse samples of its unit: more samples separate them
        n = x.shape[0]
        more = int(math.ceil(n * PAIR_CLUSTER_FACTOR * need / min(len(g), len(gb))))
        raise TooFewSamplesError(
            f"too few samples for the fixed-parameter path to separate the two units with opposite output "
            f"columns (clusters of {len(g)} and {len(gb)} samples, best relative residual {res:.2g}): about "
            f"{more} samples are needed (set exact_samples)",
            more,
        )
    info = [
        {"cluster": a, "samples": len(g), "partner": b, "fit_residual": res, "iterations": its},
        {"cluster": b, "samples": len(gb), "partner": a, "fit_residual": res, "iterations": its},
    ]
    return p, q, info


def _fit_single(x: np.ndarray, y: np.ndarray, g: np.ndarray, power: int) -> tuple[np.ndarray, float]:
    """The unit of a cluster without partner and its relative residual; refuses a cluster that fits no
    single linear system (two positively parallel columns of ``U``)."""
    v, res = _solve(x[g], np.linalg.norm(y[g], axis=1) ** (1.0 / power))
    if res > FIT_TOL:
        raise ValueError(
            f"the {len(g)} samples whose labels are positive multiples of one output direction do not fit one "
            f"linear system (relative residual {res:.2g}): two columns of U are positively parallel (u_j = s u_i, "
            "s > 0), which the fixed-parameter algorithm cannot separate (it needs no two columns of U to be "
            "positive multiples of each other; u and −u are fine)"
        )
    return v, res


def _fit_units(
    x: np.ndarray, y: np.ndarray, groups: list[np.ndarray], power: int, need: int
) -> tuple[dict[int, np.ndarray], list[dict[str, Any]]]:
    """Units (by cluster) of the clusters with at least ``need`` samples (both, for an opposite pair),
    and their report rows."""
    dirs = [_direction(y[g]) for g in groups]
    # opposite pairs among all repeated directions (a small partner still contaminates a big cluster)
    partner = _opposite_pairs(dirs)
    units: dict[int, np.ndarray] = {}
    info: list[dict[str, Any]] = []
    for a, g in enumerate(groups):
        if a in units or len(g) < need or (a in partner and len(groups[partner[a]]) < need):
            continue
        if a in partner:
            b = partner[a]
            units[a], units[b], rows = _fit_pair(x, y, groups, a, b, dirs[a], power, need)
            info += rows
            continue
        v, res = _fit_single(x, y, g, power)
        units[a] = v
        info.append({"cluster": a, "samples": len(g), "partner": None, "fit_residual": res})
    return units, info


def _check_width(units: dict[int, np.ndarray], groups: list[np.ndarray], k: int, n: int, need: int) -> None:
    """Refuse fewer units than ``k`` (with the samples needed when clusters were too small) or more."""
    if len(units) < k:
        small = [len(g) for a, g in enumerate(groups) if a not in units][: k - len(units)]
        if small:
            short = max(1, min(small))
            more = int(math.ceil(n * need / short * 1.5))
            raise TooFewSamplesError(
                f"too few samples for the fixed-parameter path: {len(units)} of {k} units are the only active unit on "
                f"at least d + {FIXED_MARGIN} = {need} samples (the others on {sorted(small)}); about {more} samples "
                f"are needed (set exact_samples), i.e. ≈ (d + {FIXED_MARGIN})·2^k·safety for Gaussian inputs",
                more,
            )
        if not groups:
            raise ValueError(
                "no two labels are positively parallel: the fixed-parameter path needs noiseless labels "
                "(with label noise only the tensor path applies, which needs U of rank k: m ≥ k outputs)"
            )
        raise ValueError(
            f"found {len(units)} output directions shared by 1-sparse samples but the network has k = {k} units: "
            "a unit is never the only active one (a zero column of U, or columns that are positive multiples)"
        )
    if len(units) > k:
        raise ValueError(
            f"found {len(units)} clusters of positively parallel labels for k = {k} units; is the width right?"
        )


def fixed_parameter(
    x: np.ndarray, y: np.ndarray, k: int, power: int, activation: str, *, seed: int = 0, width_known: bool = True
) -> tuple[Network, dict[str, Any]]:
    """Learn ``A = U f(V x)`` exactly from noiseless samples when ``U`` may have rank ``< k``.

    Parameters
    ----------
    x, y
        ``(N, d)`` inputs and ``(N, m)`` noiseless labels; ``N`` about :func:`samples_needed`.
    k
        Number of units.
    power, activation
        ``c`` of ``f = max(z, 0)^c`` and its name.
    seed
        Seeds the random projection that orders the columns.
    width_known
        False when ``k`` is only the rank the noise floor supported (a lower bound): noiseless
        labels repeat a direction only for 1-sparse samples, so every cluster is a unit, and
        ``k`` is raised to the number of clusters.

    Returns
    -------
    (Network, dict)
        The network and a report (clusters and their sizes, opposite pairs, fit residuals).

    Raises
    ------
    ValueError
        Too few samples (with the number needed), fewer than ``k`` clusters, or a cluster that
        fits no single linear system (two positively parallel columns of ``U``).
    """
    y = y.reshape(len(y), -1)
    n, d = x.shape
    need = d + FIXED_MARGIN
    groups = _clusters(y, seed)
    k_given = k
    if not width_known:
        k = max(k, len(groups))
    units, info = _fit_units(x, y, groups, power, need)
    report = {
        "samples": int(n),
        "clusters": [len(g) for g in groups[: 2 * k]],
        "units": info,
        "samples_needed": samples_needed(d, k),
        "width": k,
    }
    if k != k_given:
        report["width_note"] = (
            f"the noise floor supported {k_given} directions; {k} distinct output directions "
            f"are shared by 1-sparse samples, so the network has {k} units"
        )
    _check_width(units, groups, k, n, need)
    v = np.array([units[a] for a in sorted(units)])
    u = output_weights(x, y, v, power)
    return Network((v, u), activation=activation), report
