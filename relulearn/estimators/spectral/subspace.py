"""Subspace iteration on sketched second moments (docs/design.md §6; the ``sketch`` statistic).

At large d a d × d moment matrix ``M̂ = M + E`` is never formed: a first pass stores
``Y = M̂ Ω`` for a Gaussian Ω (d × r), later *subspace passes* store ``M̂ B`` and ``Bᵀ M̂ B`` for
an orthonormal basis B (d × r), each on the same chunks as the first (same seed and chunk
ids), so every pass multiplies the *same* empirical matrix ``M̂``. Then

- :func:`sketch_basis`: ``B₀ = orth(Y)`` (left singular vectors, strongest first);
- :func:`rayleigh_ritz`: the eigenpairs of ``Bᵀ M̂ B`` and Ritz vectors ``B Q`` (the best
  approximations to eigenpairs of ``M̂`` from ``span(B)``), the next basis ``orth(M̂ B)``, and
  the noise, from the standard errors ``S`` of ``M̂ B`` (entry ``(i, c)`` has variance
  ``Σ_j s_ij² B_jc²``, s the entry-wise standard errors of ``M̂``):

  - the noise floor ``f ≈ ||E||₂``: :func:`relulearn.estimators.spectral.stage.noise_floor`'s bound
    ``2σ + κ σ* sqrt(2 log(d/level))`` with the row norms of the unseen d × d standard errors
    estimated as ``σ_i² ≈ (d/r) Σ_c S_ic²`` (B's rows carry r/d of the weight on average: a
    delocalized basis). Ritz values above it are significant (Weyl);
  - the subspace noise ``ν ≈ ||E V||₂`` for a basis V independent of the noise (the population
    eigenvectors): the rectangular bound ``σ_row + σ_col + κ S* sqrt(2 log((d+r)/level))`` of S;
    it is ≈ ``σ (√d + √r)``, about half of ``f``;
  - the Davis–Kahan sin-Θ bound ``arcsin(min(1, ν / (g − ν)))`` on the angle between the top-k
    Ritz space and the top-k eigenvectors of the population ``M``, with the gap
    ``g = |θ_k| − |θ_{k+1}|`` lowered by ``ν`` for the error of ``θ_k`` (π/2 when ``g ≤ 2ν``)
    (Davis–Kahan's residual is ``E V``, so its numerator is ``||E V||``, not ``||E||``: the
    basis converges to noise-aligned directions beyond k, where ``||E B||`` reaches ``||E||₂``);
- the *refined* top-k estimate of a pass: the rank-k Nyström approximation
  ``(M̂ V) Θ⁻¹ (M̂ V)ᵀ`` of ``M̂`` from the top-k Ritz pairs ``(Θ, V)``, whose eigenvectors span
  ``range(M̂ V)``: one multiplication by ``M̂`` ahead of the Ritz vectors, for no extra pass (to
  first order in the noise, ``M̂ v / θ = v + E v / θ``, the dense eigenvector's own perturbation).
  It is exact for a rank-k ``M̂`` once ``span(B)`` holds its range;
- the same for several matrices that share every pass (the τ grid of ``M_τ``):
  :mod:`.filtered_pca.joint_subspace`;
- :func:`subspace_iteration`: repeats passes through a ``run_pass`` callable until, from the
  second pass on, the change one more pass makes to the top-k Ritz space V — the largest angle
  between V and ``range(M̂ V)``, the leading k columns of the next basis — is below the angle
  bound (further passes would only move it inside its statistical uncertainty), or
  ``max_passes``; it returns the last pass's refined estimate and Ritz values.

Why iterate. The noise of a single sketch is ``E Ω``: each column carries ``||E||_F ≈ d σ``
(σ the entry-wise standard error), which at large d swamps the signal ``M ω`` of a column; the
*spectral* norm ``||E||₂ ≈ 2 √d σ`` is far smaller. Each pass multiplies by ``M̂`` once more, so
``span(B)`` converges to the dominant eigenvectors of ``M̂`` at the rate ``|θ_{r+1}| / |θ_k|``
(block power iteration with r ≥ k columns), where only ``||E||₂`` matters — and to those of the
very matrix the dense path would form, since every pass sees the same chunks.

Eigenvalues are ordered by ``|θ|`` (moment matrices of signed networks are indefinite).
Everything here is pure numpy; the driver takes the pass runner as a callable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...config import SKETCH_OVERSAMPLING, check_sketch_rank
from .stage import DEFAULT_LEVEL, KAPPA, _stack_noise, noise_floor
from .subspace_geometry import principal_angles

__all__ = [
    "SketchBasis",
    "RitzStep",
    "Iteration",
    "sketch_basis",
    "rayleigh_ritz",
    "angle_bound",
    "spectral_noise",
    "pass_statistics",
    "subspace_iteration",
]


def _rounding(a: np.ndarray) -> float:
    """The rounding level of products with ``a``: a floor below which nothing is significant."""
    return 8.0 * max(a.shape) * np.finfo(np.float64).eps * float(np.abs(a).max(initial=0.0))


def _check_se(se: np.ndarray, shape: tuple[int, ...], what: str) -> np.ndarray:
    s = np.asarray(se, dtype=np.float64)
    if s.shape != shape:
        raise ValueError(f"{what} standard errors have shape {s.shape}, the estimate {shape}; they must match")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"{what} standard errors have NaN or infinite entries (they need at least two chunks)")
    return s


def angle_bound(noise: float, gap: float) -> float:
    """Davis–Kahan sin-Θ bound ``arcsin(min(1, ν / (g − ν)))`` (radians) on the angle between an
    estimated top-k eigenspace and the population one, for ``||E V|| ≤ ν`` (V the population
    eigenvectors) and estimated gap ``g = |θ_k| − |θ_{k+1}|``: the population gap to the estimated
    ``θ_{k+1}`` is at least ``g − ν``; π/2 when ``g ≤ 2ν``."""
    if gap <= noise or gap <= 0:
        return math.pi / 2
    return math.asin(min(1.0, noise / (gap - noise)))


def spectral_noise(mb_se: np.ndarray, level: float = DEFAULT_LEVEL) -> float:
    """Estimated bound on ``||E||₂`` (the d × d noise of ``M̂``) from the standard errors ``S`` (d × r)
    of ``M̂ B`` for an orthonormal, delocalized basis B: :func:`relulearn.estimators.spectral.stage.noise_floor`
    with the row norms ``σ_i² = Σ_j s_ij²`` estimated as ``(d/r) Σ_c S_ic²`` and ``σ* ≈ max S``."""
    s = np.asarray(mb_se, dtype=np.float64)
    d, r = s.shape
    sigma = math.sqrt(d / r * float(np.max(np.sum(s * s, axis=1))))
    return 2.0 * sigma + KAPPA * float(s.max()) * math.sqrt(2.0 * math.log(d / level))


# ------------------------------------------------------------------------- sketch


@dataclass(frozen=True)
class SketchBasis:
    """The orthonormal basis of a sketch's range, against the sketch's noise.

    Attributes
    ----------
    basis
        ``(d, r)`` orthonormal columns spanning ``range(Y)``, by singular value of Y, largest first.
    singular_values
        ``(r,)`` singular values of Y.
    floor
        Bound on ``||E Ω||₂`` from Y's standard errors (``None`` without them).
    significant
        Singular values above the floor (all r without standard errors).
    """

    basis: np.ndarray
    singular_values: np.ndarray
    floor: float | None
    significant: int


def sketch_basis(y: np.ndarray, se: np.ndarray | None = None, *, level: float = DEFAULT_LEVEL) -> SketchBasis:
    """``orth(Y)`` of a sketch ``Y = M̂ Ω`` (d × r), strongest directions first.

    Parameters
    ----------
    y
        ``(d, r)`` sketch.
    se
        ``(d, r)`` standard errors of its entries (optional): gives the noise floor of ``E Ω``.
    level
        Exceedance probability of the floor.

    Returns
    -------
    SketchBasis
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 2 or y.shape[1] > y.shape[0]:
        raise ValueError(f"a sketch is a (d, r) array with r <= d, got shape {y.shape}")
    if not np.all(np.isfinite(y)):
        raise ValueError("the sketch has NaN or infinite entries")
    # QR, then the SVD of the small r × r factor: the same range, ordered by strength
    q, r = np.linalg.qr(y)
    u, s, _ = np.linalg.svd(r)
    floor = None
    if se is not None:
        floor = max(_stack_noise(_check_se(se, y.shape, "the sketch's"), level), _rounding(y))
    significant = len(s) if floor is None else int(np.count_nonzero(s > floor))
    return SketchBasis(basis=q @ u, singular_values=s, floor=floor, significant=significant)


# ------------------------------------------------------------------ subspace pass


@dataclass(frozen=True)
class RitzStep:
    """One subspace pass, reduced by Rayleigh–Ritz.

    Attributes
    ----------
    eigenvalues
        ``(r,)`` Ritz values (eigenvalues of ``Bᵀ M̂ B``), by ``|θ|``, largest first.
    vectors
        ``(d, r)`` Ritz vectors ``B Q``, same order.
    next_basis
        ``(d, r)`` orthonormal basis of ``range(M̂ B)`` (the next pass's basis), its leading columns
        spanning ``M̂`` applied to the leading Ritz vectors.
    refined_values, refined_vectors
        ``(k,)``, ``(d, k)``: eigenpairs of the rank-k Nyström approximation ``(M̂ V) Θ_k⁻¹ (M̂ V)ᵀ``
        (V, Θ_k: the top-k Ritz pairs), by ``|value|``; the vectors span ``range(M̂ V)``. The
        pass's best estimate of the top-k eigenvectors (the values carry a bias ``≈ ||E v||²/θ``:
        prefer the Ritz values).
    k
        Number of leading Ritz pairs the gap and bound refer to.
    floor
        Estimated bound on ``||E||₂`` (:func:`spectral_noise`): Ritz values above it are significant.
    subspace_noise
        Bound on ``||E V||₂`` for a basis V independent of the noise (the rectangular bound of the
        standard errors of ``M̂ B``): the numerator of the angle bound.
    eigenvalue_floor
        Bound on ``||Bᵀ E B||₂`` from the standard errors of ``Bᵀ M̂ B``: the error bar of every Ritz
        value (Weyl); ``None`` without those standard errors.
    gap
        ``|θ_k| − |θ_{k+1}|`` (``|θ_k|`` when ``k = r``).
    angle_bound
        :func:`angle_bound` of ``subspace_noise`` and ``gap``, radians.
    significant
        Number of Ritz values with ``|θ| > floor``.
    """

    eigenvalues: np.ndarray
    vectors: np.ndarray
    next_basis: np.ndarray
    refined_values: np.ndarray
    refined_vectors: np.ndarray
    k: int
    floor: float
    subspace_noise: float
    eigenvalue_floor: float | None
    gap: float
    angle_bound: float
    significant: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "eigenvalues": self.eigenvalues[: self.k].tolist(),
            "k": self.k,
            "floor": self.floor,
            "subspace_noise": self.subspace_noise,
            "eigenvalue_floor": self.eigenvalue_floor,
            "gap": self.gap,
            "angle_bound": self.angle_bound,
            "significant": self.significant,
            "ritz_values": self.eigenvalues.tolist(),
        }


def rayleigh_ritz(
    mb: np.ndarray,
    mb_se: np.ndarray,
    bmb: np.ndarray,
    basis: np.ndarray,
    *,
    k: int | None = None,
    bmb_se: np.ndarray | None = None,
    level: float = DEFAULT_LEVEL,
    oversampling: int = SKETCH_OVERSAMPLING,
) -> RitzStep:
    """Reduce a subspace pass: Ritz pairs, next basis, noise floor and angle bound.

    Parameters
    ----------
    mb, mb_se
        ``(d, r)``: ``M̂ B`` and its standard errors (the pass's ``Y_*`` and ``Y_*_se``).
    bmb
        ``(r, r)``: ``Bᵀ M̂ B`` (the pass's ``BMB_*``); symmetrized.
    basis
        ``(d, r)`` the orthonormal basis B the pass used (its ``omega``).
    k
        Directions wanted; default: the number of Ritz values above the floor (at least 1).
    bmb_se
        ``(r, r)`` standard errors of ``Bᵀ M̂ B`` (optional): error bars of the Ritz values.
    level
        Exceedance probability of the floors.
    oversampling
        Columns beyond k the basis must have (``r >= min(d, k + oversampling)``).

    Raises
    ------
    ValueError
        For mismatched shapes, a basis that is not orthonormal, or (ConfigError) a rank r that
        cannot hold k directions; the message names the r to use.
    """
    b = np.asarray(basis, dtype=np.float64)
    mb, bmb = np.asarray(mb, dtype=np.float64), np.asarray(bmb, dtype=np.float64)
    d, r = b.shape
    if mb.shape != (d, r) or bmb.shape != (r, r):
        raise ValueError(
            f"a pass on a (d, r) = {(d, r)} basis has M B (d, r) and Bᵀ M B (r, r); got {mb.shape} and {bmb.shape}"
        )
    if not np.allclose(b.T @ b, np.eye(r), rtol=0, atol=1e-8):
        raise ValueError("the basis of a subspace pass must have orthonormal columns")
    if k is not None:
        check_sketch_rank(d, r, k, where="the subspace pass's rank r", oversampling=oversampling)
    s = _check_se(mb_se, mb.shape, "M B's")
    floor = max(spectral_noise(s, level), _rounding(mb))
    nu = max(_stack_noise(s, level), _rounding(mb))
    eig_floor = None
    if bmb_se is not None:
        eig_floor = max(noise_floor(_check_se(bmb_se, bmb.shape, "Bᵀ M B's"), level), _rounding(bmb))
    theta, q = np.linalg.eigh(0.5 * (bmb + bmb.T))
    order = np.argsort(-np.abs(theta), kind="stable")
    theta, q = theta[order], q[:, order]
    significant = int(np.count_nonzero(np.abs(theta) > floor))
    k = max(1, significant) if k is None else int(k)
    mv = mb @ q  # M̂ applied to the Ritz vectors, strongest first
    nxt, _ = np.linalg.qr(mv)
    refined_values, refined_vectors = _nystrom(mv[:, :k], theta[:k])
    gap = float(abs(theta[k - 1]) - (abs(theta[k]) if k < r else 0.0))
    return RitzStep(
        eigenvalues=theta,
        vectors=b @ q,
        next_basis=nxt,
        refined_values=refined_values,
        refined_vectors=refined_vectors,
        k=k,
        floor=float(floor),
        subspace_noise=float(nu),
        eigenvalue_floor=None if eig_floor is None else float(eig_floor),
        gap=gap,
        angle_bound=angle_bound(nu, gap),
        significant=significant,
    )


def _nystrom(mv: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of ``W diag(θ)⁻¹ Wᵀ`` (``W = M̂ V``, d × k) by ``|value|``, through ``W = Q R``:
    the eigenpairs of the k × k ``R diag(θ)⁻¹ Rᵀ``, vectors mapped by Q."""
    if np.any(theta == 0):  # a zero Ritz value has no inverse: keep the unrefined span
        q, _ = np.linalg.qr(mv)
        return theta.copy(), q
    q, r = np.linalg.qr(mv)
    small = (r / theta) @ r.T
    w, u = np.linalg.eigh(0.5 * (small + small.T))
    order = np.argsort(-np.abs(w), kind="stable")
    return w[order], q @ u[:, order]


# ------------------------------------------------------------------------- driver


def pass_statistics(
    basis: np.ndarray, family: str, options: Mapping[str, Any], refines: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``statistics`` section of a subspace pass: only ``sketch`` (``basic`` off: it is a d × d
    family), with the basis rows ``Bᵀ``, the one family iterated on and the record of the refined store."""
    section: dict[str, Any] = {"basis": np.asarray(basis).T.tolist(), family: dict(options)}
    if refines is not None:
        section["refines"] = dict(refines)
    return {"basic": None, "sketch": section}


def _family_options(sketch: Mapping[str, np.ndarray], section: Mapping[str, Any], family: str) -> dict[str, Any]:
    """The family's options for a pass, with the sketch store's direction bank and τ grid spelled out,
    so that the pass computes the very same matrices without drawing them again."""
    if family not in section:
        raise ValueError(
            f"the sketch section has no '{family}' family (it has "
            f"{sorted(k for k in section if k in ('second', 'contracted', 'filtered'))})"
        )
    opts = dict(section[family] or {})
    if family == "contracted":
        opts = {"orders": list(opts.get("orders", [2, 4])), "directions": np.asarray(sketch["direction"]).tolist()}
    elif family == "filtered" and np.ndim(sketch["tau"]) == 1:
        opts = {"thresholds": np.asarray(sketch["tau"]).tolist()}
    return opts


def _select(arrays: Mapping[str, np.ndarray], name: str, family: str, index: int | None) -> np.ndarray:
    a = np.asarray(arrays[name])
    if a.ndim != (2 if family == "second" else 3):
        raise ValueError(f"{name} has shape {a.shape}; per-output sketches are not supported by the driver")
    if family == "second":
        return a
    if index is None:
        raise ValueError(f"the {family} family holds {a.shape[0]} matrices; give index= (a pair or τ index)")
    return a[index]


@dataclass(frozen=True)
class Iteration:
    """Result of :func:`subspace_iteration`.

    Attributes
    ----------
    eigenvalues
        ``(k,)`` the final leading Ritz values.
    vectors
        ``(d, k)`` orthonormal: the last pass's refined top-k estimate (``RitzStep.refined_vectors``).
    steps
        The :class:`RitzStep` of every pass.
    changes
        Per pass, the largest principal angle (radians) between its top-k Ritz space V and
        ``range(M̂ V)``: how far the next pass moves it (0 for an invariant subspace of ``M̂``).
    converged
        Whether the stop rule fired (``change ≤ rtol · angle_bound``) before ``max_passes``.
    initial
        The :class:`SketchBasis` the iteration started from.
    """

    eigenvalues: np.ndarray
    vectors: np.ndarray
    steps: list[RitzStep]
    changes: list[float]
    converged: bool
    initial: SketchBasis
    report: dict = field(default_factory=dict)


def subspace_iteration(
    run_pass: Callable[[dict], Mapping[str, np.ndarray]],
    sketch: Mapping[str, np.ndarray],
    section: Mapping[str, Any],
    *,
    family: str = "second",
    index: int | None = None,
    k: int | None = None,
    refines: Mapping[str, Any] | None = None,
    max_passes: int = 5,
    min_passes: int = 2,
    rtol: float = 1.0,
    level: float = DEFAULT_LEVEL,
) -> Iteration:
    """Subspace iteration on one sketched matrix, one pass per step.

    Parameters
    ----------
    run_pass
        ``run_pass(statistics) -> arrays``: runs a pass with the ``statistics`` section given (see
        :func:`pass_statistics`) on the same chunks as the sketch store (same configuration otherwise)
        and returns the arrays of its ``sketch`` group.
    sketch
        The arrays of the sketch store's ``sketch`` group (``Y_*``, ``Y_*_se``, ``omega``, ...).
    section
        The sketch store's ``statistics.sketch`` section (a dict), for the family's options.
    family, index
        Which matrix: ``"second"``, or ``"contracted"`` / ``"filtered"`` with a pair / τ index.
    k
        Directions wanted (default: the Ritz values above the floor in the first pass).
    refines
        The record of the sketch store (``relulearn.pipeline.refines.refine_record``), recorded in
        every pass so that a pass on other chunks is refused.
    max_passes, min_passes, rtol
        Stop after ``max_passes`` passes, or, from pass ``min_passes`` on, once the next pass would
        move the top-k Ritz space by at most ``rtol`` × its angle bound. The bound rests on the Ritz
        gap, which the first pass takes from the sketch's range — at large d mostly noise — so it
        is too small there, the bound too loose, and a stop after one pass premature: hence
        ``min_passes = 2``.
    level
        Exceedance probability of the floors.
    """
    if max_passes < 1:
        raise ValueError(f"max_passes must be at least 1, got {max_passes}")
    options = _family_options(sketch, section, family)
    y = _select(sketch, f"Y_{family}", family, index)
    initial = sketch_basis(y, _select(sketch, f"Y_{family}_se", family, index), level=level)
    if k is not None:
        check_sketch_rank(y.shape[0], y.shape[1], k)
    oversampling = SKETCH_OVERSAMPLING if k is not None else 0  # an inferred k is at most r: nothing to check
    basis = initial.basis
    steps: list[RitzStep] = []
    changes: list[float] = []
    converged = False
    for _ in range(max_passes):
        arrays = run_pass(pass_statistics(basis, family, options, refines))
        if not np.allclose(np.asarray(arrays["omega"]), basis, rtol=0, atol=1e-12):
            raise ValueError(
                "run_pass returned a pass computed on another basis; it must run the statistics it is given"
            )
        se_name = f"BMB_{family}_se"
        step = rayleigh_ritz(
            _select(arrays, f"Y_{family}", family, index),
            _select(arrays, f"Y_{family}_se", family, index),
            _select(arrays, f"BMB_{family}", family, index),
            basis,
            k=k,
            bmb_se=_select(arrays, se_name, family, index) if se_name in arrays else None,
            level=level,
            oversampling=oversampling,
        )
        k = step.k  # fixed from the first pass on
        # the next basis's leading k columns span M̂ V (V: the top-k Ritz vectors): the next pass's move
        change = float(principal_angles(step.vectors[:, :k], step.next_basis[:, :k]).max(initial=0.0))
        steps.append(step)
        changes.append(change)
        basis = step.next_basis
        if len(steps) >= min_passes and change <= rtol * step.angle_bound:
            converged = True
            break
    last = steps[-1]
    report = {
        "family": family,
        "index": index,
        "k": k,
        "passes": len(steps),
        "converged": converged,
        "changes": changes,
        "sketch_floor": initial.floor,
        "sketch_significant": initial.significant,
        "steps": [s.to_dict() for s in steps],
    }
    return Iteration(
        eigenvalues=last.eigenvalues[:k].copy(),
        vectors=last.refined_vectors.copy(),
        steps=steps,
        changes=changes,
        converged=converged,
        initial=initial,
        report=report,
    )
