"""Expansions of the labels of degree ≤ 2 (a section's ``expansion`` key), checked: what the ``hermite``,
``contracted``, ``projected_contracted``, ``projected_hermite`` and ``sketch`` families subtract from the labels
(residual labels).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from ...config import ExpansionConfig

__all__ = ["expansion_setup", "low_rank_expansion", "output_expansion"]


def expansion_setup(cfg: ExpansionConfig | None, d: int, where: str) -> tuple | None:
    """The expansion ``(t0, t1, t2)`` of a section's ``expansion`` key, checked (``None``: raw labels).

    Raises
    ------
    ValueError
        Naming the key at fault: a term of the wrong shape, or ``t2`` not symmetric.
    """
    if cfg is None:
        return None
    t1 = np.zeros(d) if cfg.t1 is None else np.asarray(cfg.t1, dtype=np.float64)
    if cfg.t2_vectors is not None:
        _, _, v, theta = low_rank_expansion(cfg, d, where)
        t2 = (v * theta) @ v.T
    else:
        t2 = np.zeros((d, d)) if cfg.t2 is None else np.asarray(cfg.t2, dtype=np.float64)
    if t1.shape != (d,):
        raise ValueError(f"{where}.expansion.t1 has shape {t1.shape}; it needs d={d} entries")
    if t2.shape != (d, d) or not np.allclose(t2, t2.T, rtol=0, atol=1e-12 * (1 + np.abs(t2).max())):
        raise ValueError(f"{where}.expansion.t2 must be a symmetric d × d matrix (d={d}), got shape {t2.shape}")
    return float(cfg.t0), t1, 0.5 * (t2 + t2.T)


def low_rank_expansion(cfg: ExpansionConfig, d: int, where: str) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """The expansion of a section's ``expansion`` key as ``(t0, t1, V, θ)`` with ``T_2 = V diag(θ) Vᵀ``
    (V: d × s): given so (``t2_vectors``, ``t2_values``), or the eigenpairs of a dense ``t2``.

    Raises
    ------
    ValueError
        Naming the key at fault: a term of the wrong shape, ``t2`` not symmetric, a value not finite.
    """
    t1 = np.zeros(d) if cfg.t1 is None else np.asarray(cfg.t1, dtype=np.float64)
    if t1.shape != (d,):
        raise ValueError(f"{where}.expansion.t1 has shape {t1.shape}; it needs d={d} entries")
    if cfg.t2_vectors is None:
        if cfg.t2 is None:
            return float(cfg.t0), t1, np.zeros((d, 0)), np.zeros(0)
        _, _, t2 = cast(tuple, expansion_setup(cfg.model_copy(update={"t1": None}), d, where))  # (cfg is given)
        theta, v = np.linalg.eigh(t2)
        return float(cfg.t0), t1, v, theta
    v = np.asarray(cfg.t2_vectors, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != d:
        raise ValueError(f"{where}.expansion.t2_vectors has shape {v.shape}; each row needs d={d} entries")
    theta = np.asarray(cfg.t2_values, dtype=np.float64)
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(theta)) and np.isfinite(cfg.t0) and np.all(np.isfinite(t1))):
        raise ValueError(f"{where}.expansion has NaN or infinite entries")
    return float(cfg.t0), t1, np.ascontiguousarray(v.T), theta


def output_expansion(section: Any, m: int | None, j: int | None, where: str) -> tuple[ExpansionConfig | None, str]:
    """Output ``j``'s expansion of a section's ``expansion`` key (None: none given) and the key's name: a list
    gives one per output, a single one serves a scalar label."""
    exp = section.expansion
    if exp is None:
        return None, where
    if isinstance(exp, list):
        if len(exp) != (m or 1):
            raise ValueError(
                f"{where}.expansion has {len(exp)} entries; the source has {m or 1} output(s): give "
                "one expansion per output"
            )
        return exp[j or 0], f"{where}.expansion[{j or 0}]"
    if m is not None:
        raise ValueError(
            f"{where}.expansion is a single expansion but the source has {m} outputs: give a list, one per output"
        )
    return exp, where
