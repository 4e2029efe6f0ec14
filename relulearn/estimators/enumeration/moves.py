"""Changes to the enumeration's model between stages (:mod:`.enumeration.search`): the well-separated peaks
of a scan, units worth splitting, mirrored units that keep the linear part, merges of close units, units a
larger answer held that the held-out loss did not justify, and the held-out comparison of two models."""

from __future__ import annotations

import math

import numpy as np

from .relu_units import _predict, fit_units


def _angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.arccos(np.clip(a @ b.T, -1.0, 1.0))


def _significantly_better(
    z_val: np.ndarray,
    y_val: np.ndarray,
    big: tuple[np.ndarray, np.ndarray],
    small: tuple[np.ndarray, np.ndarray],
    margin: float,
    min_gain: float,
) -> bool:
    """Whether model ``big`` has a lower held-out loss than ``small`` by more than ``margin``
    standard errors of the paired per-sample difference and by more than the fraction
    ``min_gain`` of ``small``'s loss."""
    e_big = y_val - _predict(z_val, *big)
    e_small = y_val - _predict(z_val, *small)
    d = e_big**2 - e_small**2
    mean = float(d.mean())
    se = float(d.std()) / math.sqrt(len(d))
    return mean < -margin * se and mean < -min_gain * float(np.mean(e_small**2))


def _pick_centres(
    net: np.ndarray, red: np.ndarray, *, count: int, separation: float, neighbourhood: float, fraction: float
) -> list[int]:
    """Indices of the strongest local maxima of ``red`` over ``net``, pairwise ``≥ separation``
    apart, each at least ``fraction`` of the best."""
    order = np.argsort(-red, kind="stable")
    best = float(red[order[0]])
    cos_sep, cos_nb = math.cos(separation), math.cos(neighbourhood)
    picked: list[int] = []
    for idx in order[: min(len(order), 4096)]:
        if red[idx] < fraction * best or len(picked) >= count:
            break
        if picked and float(np.max(net[picked] @ net[idx])) > cos_sep:
            continue
        near = net @ net[idx] > cos_nb
        near[idx] = True
        if float(red[near].max()) > red[idx]:
            continue  # on the slope of a peak
        picked.append(int(idx))
    return picked


def _split_directions(
    z: np.ndarray,
    y: np.ndarray,
    model: tuple[np.ndarray, np.ndarray],
) -> list[tuple[float, int, np.ndarray]]:
    """Units whose splitting lowers the loss to second order, most negative curvature first.

    Replacing unit ``(a, λ)`` by ``(a ± ε v, λ/2)`` changes the output by
    ``(λ/2) ε² (v·z)² δ(a·z)`` to second order, hence the squared loss by
    ``ε² λ vᵀ S v`` with ``S = E[(f − y) δ(a·z) z zᵀ]`` (a "splitting matrix"); ``δ`` is
    smoothed over a band ``|a·z| < h``. Returns ``(eigenvalue, unit, v)`` for the units whose
    ``λ S`` restricted to ``a⊥`` has a negative eigenvalue.
    """
    a, lam = model
    n, r = z.shape
    if len(lam) == 0 or r < 2:
        return []
    e = _predict(z, a, lam) - y
    h = max(0.05, 2000.0 / n)  # about 0.04 n samples in the band
    out = []
    for i in range(len(lam)):
        band = np.abs(z @ a[i]) < h
        zb = z[band]
        s_mat = (zb * e[band, None]).T @ zb / (2.0 * h * n)
        proj = np.eye(r) - np.outer(a[i], a[i])
        vals, vecs = np.linalg.eigh(lam[i] * proj @ s_mat @ proj)
        if vals[0] < 0:
            v = proj @ vecs[:, 0]
            out.append((float(vals[0]), i, v / np.linalg.norm(v)))
    return sorted(out, key=lambda t: t[0])


def _match_linear_part(a: np.ndarray, lam: np.ndarray, linear: np.ndarray) -> np.ndarray | None:
    """Directions with some signs flipped so that ``Σ λ_i a_i`` best matches ``linear``.

    ``λ relu(<a, z>) = λ relu(<-a, z>) + λ <a, z>``: a unit and its mirror differ by a linear
    function, so a model with surplus units can hold a linear term (e.g. a pair ``±a`` with
    opposite weights) and mirrored units. When such a surplus unit is dropped, mirroring some
    of the others restores the linear part. Returns ``None`` when no sign pattern matches
    ``linear`` markedly better (by half) than the unflipped one.
    """
    m = len(lam)
    if m == 0 or m > 14:
        return None
    signs = 1.0 - 2.0 * ((np.arange(2**m)[:, None] >> np.arange(m)[None, :]) & 1)  # (2^m, m), row 0 = all +1
    miss = np.linalg.norm((signs * lam) @ a - linear, axis=1)
    j = int(np.argmin(miss))
    if j == 0 or miss[j] > 0.5 * miss[0]:
        return None
    return signs[j][:, None] * a


def _nearest_unit(direction: np.ndarray, final: np.ndarray) -> int:
    if len(final) == 0:
        return -1
    return int(np.argmin(_angles(direction[None], final)[0]))


def _merge_close(
    z: np.ndarray,
    y: np.ndarray,
    z_val: np.ndarray,
    y_val: np.ndarray,
    model: tuple[np.ndarray, np.ndarray],
    merge_angle: float,
    se_margin: float,
    min_gain: float,
) -> tuple[tuple[np.ndarray, np.ndarray], list[dict]]:
    """Merge the closest pair of units while it is closer than ``merge_angle`` and the merged
    model (refitted on ``(z, y)``) is not significantly worse on held-out data."""
    merges: list[dict] = []
    while len(model[1]) >= 2:
        ang = _angles(model[0], model[0])
        np.fill_diagonal(ang, np.inf)
        i, j = np.unravel_index(int(np.argmin(ang)), ang.shape)
        if ang[i, j] >= merge_angle:
            break
        a, lam = model
        w = abs(lam[i]) * a[i] + abs(lam[j]) * a[j]
        same = np.sign(lam[i]) == np.sign(lam[j])
        into = w / np.linalg.norm(w) if same else a[i if abs(lam[i]) >= abs(lam[j]) else j]
        rest = [t for t in range(len(lam)) if t not in (i, j)]
        fit = fit_units(z, y, np.vstack([a[rest], into[None]]), np.r_[lam[rest], lam[i] + lam[j]], max_iter=200)
        cand = (fit.directions, fit.weights)
        if len(cand[1]) == 0 or _significantly_better(z_val, y_val, model, cand, se_margin, min_gain):
            break
        merges.append(
            {
                "reason": "close",
                "directions": [a[i].tolist(), a[j].tolist()],
                "weights": [float(lam[i]), float(lam[j])],
                "angle": float(ang[i, j]),
                "merged_direction": into.tolist(),
            }
        )
        model = cand
    return model, merges


def _unmatched(big, final, stage):
    """Units of ``big`` left over after matching ``final``'s units to them by angle."""
    from scipy.optimize import linear_sum_assignment

    a, lam = big
    if len(final[1]) == 0:
        left = list(range(len(lam)))
    else:
        rows, cols = linear_sum_assignment(_angles(final[0], a))
        left = [t for t in range(len(lam)) if t not in set(cols.tolist())]
    return [
        {
            "reason": "held-out",
            "directions": [a[t].tolist()],
            "weights": [float(lam[t])],
            "stage": stage,
            "merged_direction": a[t].tolist(),
        }
        for t in left
    ]
