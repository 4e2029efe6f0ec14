"""The matrices the spectral stage (:mod:`.spectral.stage`) reads from a store's arrays: the contracted ``M_l^g`` and
the filtered ``M_τ``, with their standard errors and names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["FilterGridError", "filtered_matrices", "matrices_from_store"]


class FilterGridError(ValueError):
    """No sample passed the filter at any τ of the stored grid."""


def filtered_matrices(
    arrays: Mapping[str, np.ndarray], what: str, config_hint: str
) -> tuple[list, list, list, list[dict]]:
    """The filtered matrices ``M_τ`` of a stored ``filtered`` (or ``residual``) statistic with at least one
    sample past their threshold, their SEs, names (``what[i] (tau=…)``) and the grid; raises
    :class:`FilterGridError`, ending with ``config_hint``, when no sample passed any threshold."""
    m, se, prob = (np.asarray(arrays[k], dtype=np.float64) for k in ("M", "M_se", "prob"))
    tau = np.asarray(arrays["tau"], dtype=np.float64)
    lead = m.shape[:-2]
    tau = np.broadcast_to(tau, lead)
    count = float(np.asarray(arrays["count"]))
    mats, ses, names, grid = [], [], [], []
    for idx in np.ndindex(*lead):
        label = "".join(f"[{i}]" for i in idx)
        grid.append({"matrix": f"{what}{label}", "tau": float(tau[idx]), "prob": float(prob[idx])})
        if prob[idx] * count < 1:
            continue
        mats.append(m[idx])
        ses.append(se[idx])
        names.append(f"{what}{label} (tau={tau[idx]:.4g})")
    if not mats:
        taus = ", ".join(f"{t:.4g}" for t in np.unique(tau))
        raise FilterGridError(
            f"no sample passed the filter at any threshold of the '{what}' statistic (τ = {taus}, "
            f"{int(count):,} samples): every |y| is at or below the smallest τ. {config_hint}"
        )
    return mats, ses, names, grid


def matrices_from_store(
    arrays: Mapping[str, np.ndarray], orders: Sequence[int] | None = None
) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    """The contracted matrices ``M_l^g`` and their standard errors from a store's arrays.

    Parameters
    ----------
    arrays
        ``open_store(url).arrays("contracted")``: needs ``M`` and ``M_se`` (pair, i, j),
        ``pair_order`` and ``pair_direction`` (pair,).
    orders
        Orders wanted (default: all stored, in stored order). Order 2 does not depend on
        ``g`` (``M_2^g = T_2``), so it is taken once, named ``"M_2"``; order ``l`` at
        direction ``b`` is named ``"M_l^gb"``.

    Returns
    -------
    (matrices, ses, names)
        Lists in pair order.

    Raises
    ------
    KeyError
        When a required array is missing.
    ValueError
        When an order asked for is not in the store.
    """
    missing = [k for k in ("M", "M_se", "pair_order", "pair_direction") if k not in arrays]
    if missing:
        raise KeyError(f"contracted arrays lack {missing}; pass open_store(url).arrays('contracted')")
    m = np.asarray(arrays["M"], dtype=np.float64)
    se = np.asarray(arrays["M_se"], dtype=np.float64)
    po = np.asarray(arrays["pair_order"]).astype(int)
    pd = np.asarray(arrays["pair_direction"]).astype(int)
    if m.ndim != 3 or se.shape != m.shape or po.shape != (m.shape[0],) or pd.shape != po.shape:
        raise ValueError(
            f"inconsistent contracted arrays: M {m.shape}, M_se {se.shape}, pair_order {po.shape}, "
            f"pair_direction {pd.shape}"
        )
    stored = list(dict.fromkeys(po.tolist()))
    wanted = stored if orders is None else [int(o) for o in orders]
    absent = [o for o in wanted if o not in stored]
    if absent:
        raise ValueError(f"orders {absent} are not in the store; it has contracted orders {stored}")
    mats, ses, names = [], [], []
    for p in range(len(po)):
        if po[p] not in wanted:
            continue
        if po[p] == 2:
            if "M_2" in names:
                continue
            names.append("M_2")
        else:
            names.append(f"M_{po[p]}^g{pd[p]}")
        mats.append(m[p])
        ses.append(se[p])
    return mats, ses, names
