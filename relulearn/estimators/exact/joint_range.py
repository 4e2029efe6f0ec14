"""The joint range of several estimated symmetric matrices from the sum of their squares, against the sum of
their squared noise floors (:func:`.spectral.stage.noise_floor`): where a direction weak in each matrix adds up over
many of them (the ``exact`` method's per-output second moments)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..spectral.stage import DEFAULT_LEVEL, _check_level, noise_floor

__all__ = ["JointRange", "joint_range"]


@dataclass(frozen=True)
class JointRange:
    """The joint range of several symmetric matrices from the sum of their squares.

    Attributes
    ----------
    basis
        ``(d, r)`` orthonormal eigenvectors of ``Σ_a M̂_a²``, strongest first.
    rank
        ``r``: eigenvalues above ``floor`` (or the ``rank`` requested, when supported).
    eigenvalues
        All eigenvalues of ``Σ_a M̂_a²``, descending.
    floor
        ``Σ_a f_a²`` with ``f_a`` the noise floor of matrix ``a`` (at ``level / count``).
    strength
        ``(r,)``: ``λ_i / floor − 1`` of the kept directions.
    supported
        ``False`` when fewer directions than requested clear the floor.
    message
        What was decided, in words (empty when nothing to add).
    angle_bound
        ``arcsin(min(1, δ / λ_r))`` with ``δ = Σ_a (2 ||M̂_a|| f_a + f_a²)`` bounding the noise in
        ``Σ_a M̂_a²`` (Davis–Kahan); ``None`` for ``r = 0``.
    """

    basis: np.ndarray
    rank: int
    eigenvalues: np.ndarray
    floor: float
    strength: np.ndarray
    supported: bool = True
    message: str = ""
    angle_bound: float | None = None
    level: float = DEFAULT_LEVEL

    def to_dict(self, *, include_basis: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": int(self.rank),
            "supported": bool(self.supported),
            "message": self.message,
            "floor": float(self.floor),
            "strength": [float(v) for v in self.strength],
            "eigenvalues": [float(v) for v in self.eigenvalues[: max(2 * self.rank, 8)]],
            "angle_bound": None if self.angle_bound is None else float(self.angle_bound),
            "level": float(self.level),
        }
        if include_basis:
            out["basis"] = self.basis.tolist()
        return out


def joint_range(
    matrices: Sequence[np.ndarray], ses: Sequence[np.ndarray], *, rank: int | None = None, level: float = DEFAULT_LEVEL
) -> JointRange:
    """The span of the ranges of several estimated symmetric matrices ``M̂_a = M_a + E_a`` whose true
    ranges lie in one subspace ``V``, from the eigenvalues of ``Σ_a M̂_a²`` (``= Σ_a M̂_aᵀ M̂_a``).

    For a unit ``w ⊥ V``, ``wᵀ (Σ_a M̂_a²) w = Σ_a |E_a w|² ≤ Σ_a ||E_a||²``, so by Courant–Fischer
    every eigenvalue beyond ``dim V`` is at most ``floor = Σ_a f_a²`` (``f_a`` :func:`noise_floor`
    of matrix ``a`` at ``level / count``): the count of eigenvalues above ``floor`` never exceeds
    ``dim V`` (with probability ``1 − level``). Unlike stacking each matrix's significant
    eigenvectors (:func:`relevant_subspace`), a direction that is weak in every single matrix
    still adds up over many of them, and many matrices add no spurious directions (the
    per-output second moments of the ``exact`` method: tens of matrices at large ``d``).

    Parameters
    ----------
    matrices, ses
        ``(d, d)`` estimates and their standard-error matrices.
    rank
        Number of directions wanted (the strongest are kept; fewer when fewer clear the floor).
    level
        Total probability that noise alone adds a direction.

    Returns
    -------
    JointRange
    """
    _check_level(level)
    if len(matrices) == 0 or len(ses) != len(matrices):
        raise ValueError(
            f"joint_range needs matrices and as many standard-error arrays; got {len(matrices)} and {len(ses)}"
        )
    per = level / len(matrices)
    floors = [noise_floor(s, per) for s in ses]
    mats = [np.asarray(mt, dtype=np.float64) for mt in matrices]
    total = sum(mt @ mt.T for mt in mats)
    w, v = np.linalg.eigh((total + total.T) / 2.0)
    order = np.argsort(w)[::-1]
    w, v = w[order], v[:, order]
    floor = float(sum(f * f for f in floors))
    n_sig = int(np.count_nonzero(w > floor))
    supported, notes = True, []
    r = n_sig if rank is None else min(int(rank), n_sig)
    if rank is not None and n_sig < rank:
        supported = False
        notes.append(
            f"the noise floor supports only {n_sig} of the {rank} requested directions at this sample count; "
            "more samples would be needed"
        )
    elif rank is not None and n_sig > rank:
        notes.append(f"the noise floor supports {n_sig} directions; kept the {r} strongest as requested")
    delta = float(sum(2.0 * np.linalg.norm(mt, 2) * f + f * f for mt, f in zip(mats, floors)))
    angle = float(math.asin(min(1.0, delta / w[r - 1]))) if r > 0 and w[r - 1] > 0 else None
    return JointRange(
        basis=v[:, :r],
        rank=r,
        eigenvalues=w,
        floor=floor,
        strength=w[:r] / floor - 1.0,
        supported=supported,
        message="; ".join(notes),
        angle_bound=angle,
        level=level,
    )
