"""Spectral stage: the relevant subspace from stored second-order statistics (docs/design.md §3, §6).

For ``y = Σ_i λ_i relu(<u_i, x>)`` with unit ``u_i`` and signed ``λ_i``, every stored matrix

    M_2 = T_2 = c_2 Σ_i λ_i u_i u_iᵀ,        M_l^g = c_l Σ_i λ_i <u_i, g>^{l-2} u_i u_iᵀ

has its range inside ``U = span(u_i)``. Signs can cancel in any single matrix (``λ = +1`` on
``e1, e2`` and ``-1`` on ``(e1 ± e2)/√2`` give ``M_2 = 0`` on that plane, while ``M_4^g`` with
``g`` in the plane does not vanish), so the relevant subspace is the span of the
significant eigenvectors of *all* of them. (Two *nearly identical* units with opposite
signs are different: every ``M_l^g`` sees them only at ``O(sin angle)``, since
``|<u1,g>² - <u2,g>²| ≤ sin angle`` and ``|c_4| = |c_2|``; only a lower floor, i.e. more
samples, resolves them.) Every estimate is ``truth + E`` with ``E``
symmetric and entries ≈ independent ``N(0, S_ij²)``, ``S`` the stored standard errors, and
every decision below compares with the noise floor computed from ``S`` — never with a
hand-set constant.

The stage in three steps:

1. :func:`noise_floor` — a high-probability bound ``f`` on ``||E||₂``.
2. :func:`spectrum` — eigenvalues of one matrix sorted by ``|μ|``; ``|μ| > f`` is
   *significant*. By Weyl, a pure-noise matrix has every ``|μ| ≤ ||E|| ≤ f``, so the count
   of significant eigenvalues never exceeds the true rank (with probability ``1 - level``).
3. :func:`relevant_subspace` — each significant eigenvector weighted by ``|μ|/f`` and all
   stacked as columns of ``B``; the subspace is the top left-singular space of ``B``.

Why the stack threshold is ``max(1, ν)`` (step 3). Let ``P⊥`` project onto ``U^⊥``. Since
``P⊥ M = 0``, an eigenpair of ``M + E`` satisfies ``P⊥ E v̂ = μ P⊥ v̂``, so for a matrix's
block of weighted columns ``B_a = V̂_a |D_a| / f_a``::

    P⊥ B_a = P⊥ E_a V̂_a sign(D_a) / f_a,   hence   ||P⊥ B_a||₂ ≤ ||E_a||₂ / f_a ≤ 1.

``B`` minus its part inside ``U`` (rank ≤ dim U) is ``P⊥ B``, so every singular value of
``B`` beyond ``dim U`` is at most ``||P⊥ B||``: singular values above ``||P⊥ B||`` are
directions of ``U``. Each block's share is ``≤ 1`` exactly; how the blocks add up depends on
how their noises align. With fully aligned noise (the same ``E`` in every matrix) it would
be ``sqrt(#matrices)``; the matrices of a run come from the same samples but their noises
are nearly uncorrelated (``E[(z_g²-1)(z_h²-1)] = 2<g,h>²``), so the stacked noise behaves
like a ``d × N`` Gaussian matrix whose entry variances ``(S_a² v̂²)_i / f_a²`` are known. Its
norm is bounded by ``ν`` (:func:`_stack_noise`, the rectangular form of the same
Bandeira–van Handel bound: ``σ_row + σ_col + κ τ* sqrt(2 log((d+N)/level))``). Typically
``ν ≈ 0.5–0.8`` (one column's noise is ``≈ σ_a/f_a ≈ 0.3–0.4``), so the threshold is ``1``:
clearly above the noise, and exactly the strength at which a single matrix declared a
direction significant, so a direction seen in one matrix only (its singular value is at
least its own ``|μ|/f > 1``, by interlacing) survives. When many directions are stacked
(in simulations from ``N`` ≳ 2d columns), ``ν`` exceeds 1 and becomes the threshold — there
a threshold of 1 would keep noise directions (``tests/estimators/spectral/test_spectral.py``) — and the rank is
then still at least the largest per-matrix count (each count is a lower bound on
``dim U``), and the result says so in its message.

The matrices come from a store through :mod:`.spectral.stored_matrices`; the joint range of many matrices from the sum
of their squares is :mod:`.exact.joint_range`; angles between subspaces and directions inside one are
:mod:`.spectral.subspace_geometry`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DEFAULT_LEVEL", "KAPPA", "Spectrum", "Subspace", "noise_floor", "relevant_subspace", "spectrum"]

DEFAULT_LEVEL = 0.01
"""Default probability that noise alone exceeds a floor (for ``relevant_subspace``: in any
of its matrices together, split over them by a union bound)."""

KAPPA = 0.75
"""Constant of the fluctuation term of :func:`noise_floor`.

Calibration (simulation, 1000–4000 draws per case, ``d`` = 5 … 100, ``level`` = 0.01 and
0.001): the smallest κ for which ``2σ + κ σ* sqrt(2 log(d/level))`` reaches the
``1 - level`` quantile of ``||E||`` was ≤ 0.45 (at 0.01) and ≤ 0.51 (at 0.001) over
homogeneous (GOE-like), row/column-graded, diagonal, block-diagonal, tridiagonal, star and
sparse-spiky variance patterns; the diagonal pattern (the norm is a maximum of ``d``
Gaussians) needs the most and approaches, for ``d/level`` → ∞, κ → 1 only very slowly
(κ = 0.75 covers it up to ``d/level`` ≈ 10^13). The floor is then 1.3–1.8× the 99th
percentile of ``||E||`` for standard-error patterns like those of real ``M_2`` / ``M_4^g``
estimates, and up to ~2× when a few isolated entries dominate ``σ*``
(``tests/estimators/spectral/test_spectral.py`` checks exceedance and looseness by simulation)."""


def _check_level(level: float) -> None:
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must be a probability in (0, 1), got {level}")


def noise_floor(se: np.ndarray, level: float = DEFAULT_LEVEL) -> float:
    """A bound on ``||E||₂`` that noise exceeds with probability about ``level`` at most.

    ``E`` is a symmetric ``d × d`` random matrix with independent centred Gaussian entries
    ``E_ij = E_ji`` of standard deviations ``se[i, j]`` (the stored standard errors of an
    estimated matrix). The bound has the shape of Bandeira–van Handel's
    ``E||E|| ≲ 2σ + C σ* sqrt(log d)``::

        floor = 2 σ + κ σ* sqrt(2 log(d / level)),
        σ  = max_i sqrt(Σ_j se_ij²)   (largest row norm),   σ* = max_ij se_ij.

    ``2σ`` is the sharp leading term (the semicircle edge for equal variances); the second
    term covers finite-``d`` fluctuations, localized patterns (a diagonal ``E`` has norm
    ``σ* max_i |g_i|``, whose union bound is ``σ* sqrt(2 log(2d/level))``) and the
    probability level. ``κ =`` :data:`KAPPA` was calibrated by simulation (see there); it
    is an empirical constant, not a proven one.

    Parameters
    ----------
    se
        ``(d, d)`` non-negative standard deviations; an asymmetric array is made symmetric
        by the elementwise maximum (the conservative choice).
    level
        Probability of exceedance aimed at, in ``(0, 1)``.

    Returns
    -------
    float
        The floor, in the units of the matrix.

    Raises
    ------
    ValueError
        For a non-square, negative or non-finite ``se`` (a NaN standard error means the
        store has fewer than two chunks), or a ``level`` outside ``(0, 1)``.
    """
    _check_level(level)
    s = np.asarray(se, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or s.shape[0] == 0:
        raise ValueError(f"se must be a non-empty square matrix, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("se has NaN or infinite entries (standard errors need at least two chunks in the store)")
    if np.any(s < 0):
        raise ValueError("se has negative entries; standard errors are non-negative")
    s = np.maximum(s, s.T)
    d = s.shape[0]
    sigma = math.sqrt(float(np.max(np.sum(s * s, axis=1))))
    sigma_star = float(s.max())
    return 2.0 * sigma + KAPPA * sigma_star * math.sqrt(2.0 * math.log(d / level))


def _stack_noise(tau: np.ndarray, level: float) -> float:
    """Rectangular analogue of :func:`noise_floor` for a ``d × N`` matrix of independent
    Gaussian entries with standard deviations ``tau``: ``σ_row + σ_col + κ τ* sqrt(2 log((d+N)/level))``
    (Bandeira–van Handel's rectangular bound has ``σ_row + σ_col`` in place of ``2σ``)."""
    if tau.size == 0:
        return 0.0
    d, n = tau.shape
    t2 = tau * tau
    row = math.sqrt(float(t2.sum(axis=1).max()))
    col = math.sqrt(float(t2.sum(axis=0).max()))
    return row + col + KAPPA * float(tau.max()) * math.sqrt(2.0 * math.log((d + n) / level))


@dataclass(frozen=True)
class Spectrum:
    """Eigen-decomposition of one estimated symmetric matrix, against its noise floor.

    Attributes
    ----------
    eigenvalues
        ``(m,)`` sorted by ``|value|``, largest first.
    eigenvectors
        ``(d, m)`` orthonormal columns, in the same order.
    floor
        :func:`noise_floor` of the matrix's standard errors (at least the rounding level of
        the eigensolver): the error bar of every eigenvalue (Weyl: ``|μ̂_j - μ_j| ≤ ||E|| ≤ floor``).
    significant
        ``(m,)`` bool, ``|eigenvalue| > floor``.
    name
        Label such as ``"M_2"`` or ``"M_4^g3"``.
    level
        Exceedance probability the floor was computed for.
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    floor: float
    significant: np.ndarray
    name: str = ""
    level: float = DEFAULT_LEVEL

    @property
    def rank(self) -> int:
        """Number of significant eigenvalues (a lower bound on the true rank)."""
        return int(np.count_nonzero(self.significant))

    @property
    def ratios(self) -> np.ndarray:
        """``|eigenvalue| / floor``; significant where ``> 1``."""
        return np.abs(self.eigenvalues) / self.floor if self.floor > 0 else np.full(self.eigenvalues.shape, np.inf)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data for plots: eigenvalues with error bars (= the floor)."""
        return {
            "name": self.name,
            "eigenvalues": [float(v) for v in self.eigenvalues],
            "error_bar": [float(self.floor)] * len(self.eigenvalues),
            "floor": float(self.floor),
            "significant": [bool(b) for b in self.significant],
            "rank": self.rank,
            "level": float(self.level),
        }


def spectrum(matrix: np.ndarray, se: np.ndarray, *, level: float = DEFAULT_LEVEL, name: str = "") -> Spectrum:
    """Eigenvalues of an estimated symmetric matrix, compared with its noise floor.

    Parameters
    ----------
    matrix
        ``(d, d)`` estimate; symmetrized as ``(M + Mᵀ)/2`` (a stored estimate is symmetric
        up to rounding).
    se
        ``(d, d)`` standard errors of its entries.
    level
        Exceedance probability of the floor.
    name
        Label carried into the result.

    Returns
    -------
    Spectrum
    """
    m = np.asarray(matrix, dtype=np.float64)
    s = np.asarray(se, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"matrix must be square, got shape {m.shape}")
    if s.shape != m.shape:
        raise ValueError(f"se has shape {s.shape}, the matrix {m.shape}; they must match")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"matrix {name + ' ' if name else ''}has NaN or infinite entries")
    sym = 0.5 * (m + m.T)
    # Never below the eigensolver's rounding level, so that an all-zero SE (e.g. y ≡ 0)
    # cannot turn rounding errors into "significant" eigenvalues.
    rounding = 8.0 * m.shape[0] * np.finfo(np.float64).eps * float(np.abs(sym).max(initial=0.0))
    floor = max(noise_floor(s, level), rounding)
    w, v = np.linalg.eigh(sym)
    order = np.argsort(-np.abs(w), kind="stable")
    w, v = w[order], v[:, order]
    return Spectrum(eigenvalues=w, eigenvectors=v, floor=floor, significant=np.abs(w) > floor, name=name, level=level)


@dataclass(frozen=True)
class Subspace:
    """The relevant subspace found from several matrices, with its evidence.

    Attributes
    ----------
    basis
        ``(d, r)`` orthonormal columns, strongest first.
    rank
        ``r``, the number of directions kept.
    strength
        ``(r,)``: for each basis vector, ``s_j / threshold - 1`` where ``s_j`` is its singular
        value in the stack of floor-weighted eigenvectors: how far above the floor, relative
        to the floor (for a single matrix and direction this is ``(|μ| - f)/f``). Negative
        only for a direction kept on a single matrix's count while ``stack_noise > 1``.
    singular_values
        All singular values of the stack, in units of the floor.
    threshold
        The singular-value threshold used: ``max(1, stack_noise)`` (module docstring).
    stack_noise
        ``ν``, the estimated norm of the stack's part outside the true subspace.
    spectra
        The per-matrix :class:`Spectrum` objects, in input order.
    requested_rank
        The ``rank`` asked for, or ``None``.
    supported
        ``False`` when fewer directions than requested are above the noise.
    message
        Plain-language account of the decision (empty when there is nothing to add).
    angle_bound
        Estimated bound on the largest principal angle (radians) between ``basis`` and the
        true subspace, ``arcsin(min(1, threshold / s_r))`` (Davis–Kahan / Wedin with the
        stack's noise bounded by the threshold); ``None`` for ``r = 0``.
    level
        Total exceedance probability, split evenly over the matrices.
    """

    basis: np.ndarray
    rank: int
    strength: np.ndarray
    singular_values: np.ndarray
    threshold: float
    stack_noise: float
    spectra: tuple[Spectrum, ...]
    requested_rank: int | None = None
    supported: bool = True
    message: str = ""
    angle_bound: float | None = None
    level: float = DEFAULT_LEVEL
    names: tuple[str, ...] = field(default=())

    def to_dict(self, *, include_basis: bool = True) -> dict[str, Any]:
        """JSON-ready summary (spectra with error bars for plots; the basis as nested lists)."""
        out: dict[str, Any] = {
            "rank": int(self.rank),
            "requested_rank": self.requested_rank,
            "supported": bool(self.supported),
            "message": self.message,
            "strength": [float(v) for v in self.strength],
            "singular_values": [float(v) for v in self.singular_values],
            "threshold": float(self.threshold),
            "stack_noise": float(self.stack_noise),
            "angle_bound": None if self.angle_bound is None else float(self.angle_bound),
            "level": float(self.level),
            "spectra": [s.to_dict() for s in self.spectra],
        }
        if include_basis:
            out["basis"] = self.basis.tolist()
        return out


def relevant_subspace(
    matrices: Sequence[np.ndarray],
    ses: Sequence[np.ndarray],
    *,
    rank: int | None = None,
    names: Sequence[str] | None = None,
    level: float = DEFAULT_LEVEL,
) -> Subspace:
    """The span of the significant eigenvectors of several estimated matrices.

    Each matrix is compared with its own noise floor ``f_a`` (at ``level / len(matrices)``,
    a union bound over the matrices); its significant eigenvectors ``v̂`` (``|μ| > f_a``)
    are weighted by ``|μ| / f_a`` and stacked as columns of ``B``. The subspace is spanned
    by the left singular vectors of ``B`` whose singular value exceeds
    ``max(1, ν)`` — why, in the module docstring. The count is never below the largest
    per-matrix count (each is a lower bound on the true dimension).

    Parameters
    ----------
    matrices
        ``(d, d)`` estimates (e.g. ``M_2`` and several ``M_l^g``).
    ses
        Their standard-error matrices, same shapes.
    rank
        Number of directions wanted. When more are significant, the ``rank`` strongest are
        kept; when fewer are, only the supported ones are returned with
        ``supported=False`` and a message — never padded with noise directions.
    names
        Labels of the matrices (default ``"matrix0"``, ...).
    level
        Total probability that noise alone adds a direction.

    Returns
    -------
    Subspace
    """
    names = _checked_names(matrices, ses, rank=rank, names=names, level=level)
    d = np.shape(matrices[0])[0]

    per_level = level / len(matrices)
    spectra = tuple(spectrum(m, s, level=per_level, name=n) for m, s, n in zip(matrices, ses, names))

    cols, taus = _weighted_columns(spectra, ses)
    per_matrix_max = max((sp.rank for sp in spectra), default=0)

    if cols:
        b = np.concatenate(cols, axis=1)
        left, sv, _ = np.linalg.svd(b, full_matrices=False)
        nu = _stack_noise(np.concatenate(taus, axis=1), level)
    else:
        left, sv, nu = np.zeros((d, 0)), np.zeros(0), 0.0
    threshold = max(1.0, nu)
    n_svd = int(np.count_nonzero(sv > threshold))
    n_sig = max(n_svd, per_matrix_max)

    notes = []
    if nu > 1.0:
        n_cols = sum(c.shape[1] for c in cols)
        notes.append(
            f"the {n_cols} stacked directions carry combined noise {nu:.2f} floors (> 1), so a direction "
            f"seen in a single matrix needs strength above {nu:.2f} floors to be kept"
        )
    r, supported = _kept_rank(n_sig, rank, notes)

    basis = left[:, :r]
    strength = sv[:r] / threshold - 1.0
    angle = float(math.asin(min(1.0, threshold / sv[r - 1]))) if r > 0 else None
    return Subspace(
        basis=basis,
        rank=r,
        strength=strength,
        singular_values=sv,
        threshold=threshold,
        stack_noise=nu,
        spectra=spectra,
        requested_rank=None if rank is None else int(rank),
        supported=supported,
        message="; ".join(notes),
        angle_bound=angle,
        level=level,
        names=tuple(names),
    )


def _checked_names(
    matrices: Sequence[np.ndarray],
    ses: Sequence[np.ndarray],
    *,
    rank: int | None,
    names: Sequence[str] | None,
    level: float,
) -> Sequence[str]:
    """Refuse inconsistent arguments of :func:`relevant_subspace`; the matrices' names (default ``"matrix0"``, ...)."""
    _check_level(level)
    if len(matrices) == 0:
        raise ValueError("relevant_subspace needs at least one matrix")
    if len(ses) != len(matrices):
        raise ValueError(f"got {len(matrices)} matrices but {len(ses)} standard-error arrays")
    if names is None:
        names = [f"matrix{a}" for a in range(len(matrices))]
    elif len(names) != len(matrices):
        raise ValueError(f"got {len(matrices)} matrices but {len(names)} names")
    if rank is not None and (int(rank) != rank or rank < 0):
        raise ValueError(f"rank must be a non-negative integer or None, got {rank}")
    shapes = {np.shape(m) for m in matrices}
    if len(shapes) != 1:
        raise ValueError(f"all matrices must have the same shape, got {sorted(shapes)}")
    return names


def _weighted_columns(
    spectra: Sequence[Spectrum], ses: Sequence[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The significant eigenvectors of each matrix weighted by ``|μ| / f_a``, and the standard deviations of
    their noise parts ``(E_a v̂)_i / f_a`` with ``v̂`` treated as fixed: ``var = Σ_l S_il² v̂_l² / f_a²``."""
    cols, taus = [], []
    for sp, s in zip(spectra, ses):
        if sp.rank == 0:
            continue
        v = sp.eigenvectors[:, sp.significant]
        cols.append(v * (np.abs(sp.eigenvalues[sp.significant]) / sp.floor))
        s2 = np.maximum(np.asarray(s, dtype=np.float64), np.asarray(s, dtype=np.float64).T) ** 2
        taus.append(np.sqrt(s2 @ (v * v)) / sp.floor)
    return cols, taus


def _kept_rank(n_sig: int, rank: int | None, notes: list[str]) -> tuple[int, bool]:
    """The directions kept of ``n_sig`` significant ones when ``rank`` are asked for, and whether the noise floor
    supports them all; adds what was decided to ``notes``."""
    supported = True
    if rank is None:
        r = n_sig
    elif n_sig >= rank:
        r = int(rank)
        if n_sig > rank:
            notes.append(f"the noise floor supports {n_sig} directions; kept the {r} strongest as requested")
    else:
        r = n_sig
        supported = False
        notes.insert(
            0,
            f"the noise floor supports only {n_sig} of the {rank} requested directions at this sample count; "
            "more samples (or higher orders / directions inside the subspace) would be needed",
        )
    return r, supported
