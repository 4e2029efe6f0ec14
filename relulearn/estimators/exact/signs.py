"""Signs of the tensor step's directions from first moments, and the moment estimate.

Second moments see ``ν_i ν_iᵀ`` only, so the tensor step returns ``ν̂_i = s_i ν_i`` with unknown
signs ``s_i``. The first moments do see them: with ``α_ji = κ2 U_ji |v_i|^c``,

    T1_j = E[A_j x] = Σ_i κ1 U_ji |v_i|^c ν_i = Σ_i q_i α_ji ν̂_i,      q_i = s_i κ1 / κ2,

a least-squares problem for the ``k`` numbers ``q_i`` (weighted by the stored standard errors
of ``T1``, which also give each ``q_i`` a z-score). ``q_i κ2/κ1`` should be ≈ ±1.

Diagnostic (the "projection test"): with ``Û = α/κ2 = U diag(|v_i|^c)`` of rank ``k``,
``(Û⁺ A)_i = f(<ν_i, x>) ≥ 0`` on every sample, so where ``(Û⁺A)_i`` is large, ``<s_i ν̂_i, x>``
must be positive: the fraction of those samples on the positive side is ≈ 1 when ``s_i`` is right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ...network import Network
from ..rectified import kappas

__all__ = ["Signs", "signs_from_first_moments", "projection_test", "moment_estimate"]

#: the projection test looks at the samples whose ``(Û⁺A)_i`` is in this top fraction: there the
#: unit is clearly active (its value is far above the noise), so the side of ``ν̂_i`` is unambiguous
PROJECTION_TOP = 0.1


@dataclass(frozen=True)
class Signs:
    """Signs ``s_i`` with their evidence: ``ratio_i = q_i κ2/κ1`` (≈ ±1) and z-scores of ``q_i``."""

    signs: np.ndarray
    ratio: np.ndarray
    z: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        return {
            "signs": [int(s) for s in self.signs],
            "coefficient": [float(r) for r in self.ratio],
            "z_score": [float(z) if np.isfinite(z) else None for z in self.z],
        }


def signs_from_first_moments(
    t1: np.ndarray, t1_se: np.ndarray | None, alpha: np.ndarray, directions: np.ndarray, power: int
) -> Signs:
    """Least squares ``T1 ≈ Σ_i q_i α_i ν̂_iᵀ``; signs ``s_i = sign(q_i)``.

    Parameters
    ----------
    t1
        ``(m, d)`` first moments ``E[A_j x]``.
    t1_se
        Their standard errors (same shape), or ``None``; zero or missing standard errors mean
        unweighted least squares and infinite z-scores.
    alpha
        ``(m, k)`` weights from the tensor step.
    directions
        ``(k, d)`` unit directions ``ν̂_i`` from the tensor step.
    power
        ``c`` of ``f = max(z, 0)^c``.

    Returns
    -------
    Signs
    """
    k1, k2 = kappas(power)
    design = np.einsum("ji,ia->jai", alpha, directions).reshape(-1, alpha.shape[1])  # column i: vec(α_i ν̂_iᵀ)
    target = np.asarray(t1, dtype=np.float64).reshape(-1)
    se = None if t1_se is None else np.asarray(t1_se, dtype=np.float64).reshape(-1)
    weighted = se is not None and np.all(np.isfinite(se)) and np.all(se > 0)
    w: np.ndarray = 1.0 / cast(np.ndarray, se) if weighted else np.ones_like(target)  # weighted: se is not None
    q, *_ = np.linalg.lstsq(design * w[:, None], target * w, rcond=None)
    if weighted:
        cov = np.linalg.pinv((design * w[:, None]).T @ (design * w[:, None]))
        z = q / np.sqrt(np.maximum(np.diag(cov), 1e-300))
    else:
        z = np.full(q.shape, np.inf) * np.sign(q)
    s = np.where(q >= 0, 1.0, -1.0)
    return Signs(s, q * k2 / k1, z)


def projection_test(x: np.ndarray, y: np.ndarray, alpha: np.ndarray, directions: np.ndarray, power: int) -> list[float]:
    """Per unit, the fraction of samples with large ``(Û⁺A)_i`` on the positive side of ``ν̂_i``
    (``Û = α/κ2``; ≈ 1 when ``ν̂_i`` has the right sign, ≈ 0 when it has the wrong one)."""
    k2 = kappas(power)[1]
    z = y.reshape(len(y), -1) @ np.linalg.pinv(alpha / k2).T  # rows ≈ f(<ν_i, x>)
    side = x @ directions.T > 0
    out = []
    for i in range(alpha.shape[1]):
        top = z[:, i] >= np.quantile(z[:, i], 1.0 - PROJECTION_TOP)
        out.append(float(np.mean(side[top, i])) if top.any() else float("nan"))
    return out


def moment_estimate(
    alpha: np.ndarray, directions: np.ndarray, signs: np.ndarray, power: int, activation: str
) -> Network:
    """The network the moments determine: ``V0`` rows ``s_i ν̂_i`` and ``U0 = α/κ2``."""
    k2 = kappas(power)[1]
    return Network((directions * signs[:, None], alpha / k2), activation=activation)
