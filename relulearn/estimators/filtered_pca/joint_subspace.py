"""Subspace passes shared by several sketched matrices (the τ grid of ``M_τ``; :mod:`.subspace` for one matrix).

:func:`joint_sketch_basis` and :func:`joint_ritz`: every pass multiplies all the matrices by one basis; each is
reduced on its own (:func:`.spectral.subspace.rayleigh_ritz`), with the floor taken at ``level / T``; the answer is the
span of all their significant eigenvectors (weighted by strength over floor and stacked, as
:func:`relulearn.estimators.spectral.stage.relevant_subspace` does with dense matrices), and the next basis the r
strongest left singular vectors of the stacked ``M̂_τ B / f_τ`` (block subspace iteration on all of them at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..spectral.stage import DEFAULT_LEVEL
from ..spectral.subspace import RitzStep, SketchBasis, rayleigh_ritz, sketch_basis

__all__ = ["JointStep", "joint_sketch_basis", "joint_ritz"]


def _strongest_columns(cols: list[np.ndarray], r: int) -> np.ndarray:
    """The ``r`` strongest left singular vectors of the stacked columns (QR, then the small SVD)."""
    q, rr = np.linalg.qr(np.concatenate(cols, axis=1))
    u, _, _ = np.linalg.svd(rr)
    return q @ u[:, :r]


def joint_sketch_basis(
    ys: list[np.ndarray], ses: list[np.ndarray], *, level: float = DEFAULT_LEVEL
) -> tuple[np.ndarray, list[SketchBasis]]:
    """The first basis for several sketches ``Y_t = M̂_t Ω`` of one Ω (d × r each): the r strongest left
    singular vectors of the stacked ``Y_t / f_t`` (f_t: each sketch's noise floor at ``level / T``),
    so that every matrix weighs by its signal over its own noise. Returns the basis and the
    :class:`SketchBasis` of each sketch."""
    if not ys or len(ys) != len(ses):
        raise ValueError(f"joint_sketch_basis needs one standard-error array per sketch, got {len(ys)} and {len(ses)}")
    per = level / len(ys)
    each = [sketch_basis(y, s, level=per) for y, s in zip(ys, ses)]
    r = np.shape(ys[0])[1]
    cols = [np.asarray(y, dtype=np.float64) / max(b.floor or 0.0, np.finfo(float).tiny) for y, b in zip(ys, each)]
    return _strongest_columns(cols, r), each


@dataclass(frozen=True)
class JointStep:
    """One subspace pass shared by several matrices, reduced by Rayleigh–Ritz.

    Attributes
    ----------
    steps
        The :class:`RitzStep` of each matrix (floors at ``level / T``).
    basis
        ``(d, m)`` orthonormal: the span of the significant refined eigenvectors of all matrices.
    strengths
        ``(m,)`` singular values of the stacked significant vectors, each weighted by ``|θ| / f``.
    next_basis
        ``(d, r)`` the basis of the next pass.
    angle_bound
        The smallest :attr:`RitzStep.angle_bound` of the matrices with a significant direction (π/2
        when none has): the stop rule's yardstick.
    """

    steps: list[RitzStep]
    basis: np.ndarray
    strengths: np.ndarray
    next_basis: np.ndarray
    angle_bound: float

    @property
    def rank(self) -> int:
        return int(self.basis.shape[1])

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "strengths": self.strengths.tolist(),
            "angle_bound": self.angle_bound,
            "significant": [s.significant for s in self.steps],
            "floors": [s.floor for s in self.steps],
            "leading": [float(s.eigenvalues[0]) for s in self.steps],
        }


def joint_ritz(
    mbs: list[np.ndarray],
    mb_ses: list[np.ndarray],
    bmbs: list[np.ndarray],
    basis: np.ndarray,
    *,
    bmb_ses: list[np.ndarray] | None = None,
    level: float = DEFAULT_LEVEL,
) -> JointStep:
    """Reduce a subspace pass of several matrices ``M̂_t`` on one basis B (d × r).

    Each matrix goes through :func:`rayleigh_ritz` with the floor at ``level / T``; its
    significant refined eigenvectors (``|θ| >`` its floor), weighted by ``|θ| / f``, are stacked,
    and their left singular vectors with singular value above 1 span the answer — never fewer
    than the largest per-matrix count (each is a lower bound on the dimension), as in
    :func:`relulearn.estimators.spectral.stage.relevant_subspace`. The next basis: the r strongest left
    singular vectors of the stacked ``M̂_t B / f_t``.

    Parameters
    ----------
    mbs, mb_ses
        ``(d, r)`` per matrix: ``M̂_t B`` and its standard errors.
    bmbs
        ``(r, r)`` per matrix: ``Bᵀ M̂_t B``.
    basis
        ``(d, r)`` the orthonormal basis of the pass.
    bmb_ses
        ``(r, r)`` per matrix: standard errors of ``Bᵀ M̂_t B`` (optional).
    level
        Total exceedance probability of the floors.

    Returns
    -------
    JointStep
    """
    t = len(mbs)
    if t == 0 or len(mb_ses) != t or len(bmbs) != t or (bmb_ses is not None and len(bmb_ses) != t):
        raise ValueError("joint_ritz needs the same number (>= 1) of M B, standard errors and Bᵀ M B arrays")
    per = level / t
    steps = [
        rayleigh_ritz(mb, se, bmb, basis, bmb_se=None if bmb_ses is None else bmb_ses[i], level=per, oversampling=0)
        for i, (mb, se, bmb) in enumerate(zip(mbs, mb_ses, bmbs))
    ]
    cols = [
        st.refined_vectors[:, : st.significant] * (np.abs(st.eigenvalues[: st.significant]) / st.floor)
        for st in steps
        if st.significant > 0
    ]
    d, r = np.shape(basis)
    if cols:
        left, sv, _ = np.linalg.svd(np.concatenate(cols, axis=1), full_matrices=False)
        m = max(
            int(np.count_nonzero(sv > 1.0)), max(st.significant for st in steps)
        )  # each count <= the stacked columns
        span, strengths = left[:, :m], sv[:m]
        bound = min(st.angle_bound for st in steps if st.significant > 0)
    else:
        span, strengths, bound = np.zeros((d, 0)), np.zeros(0), math.pi / 2
    nxt = _strongest_columns(
        [np.asarray(mb, dtype=np.float64) / max(st.floor, np.finfo(float).tiny) for mb, st in zip(mbs, steps)], r
    )
    return JointStep(steps=steps, basis=span, strengths=strengths, next_basis=nxt, angle_bound=float(bound))
