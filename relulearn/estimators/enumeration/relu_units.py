"""Units ``λ relu(<a, z>)`` inside a found subspace, for the enumeration (:mod:`.enumeration.network`): their
prediction and relative loss, the scores of candidate directions against a residual (batches through a
mapper), and the joint Levenberg–Marquardt fit of all units."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .sphere_nets import _unit_rows

__all__ = ["score_candidates", "fit_units", "UnitFit", "relative_loss"]


Mapper = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


def _single_thread():
    """Single-threaded BLAS: the driver's products are small (``n × m r``), and threaded BLAS
    on small products collapses on a loaded machine; parallelism comes from the mapper."""
    from ...aligned import one_blas_thread

    return one_blas_thread()


def score_candidates(args: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Score a batch of candidate directions against a residual (top-level, for a mapper).

    Parameters
    ----------
    args
        ``(z, res, A)``: samples ``(n, r)``, residual ``(n,)``, candidate directions ``(B, r)``.

    Returns
    -------
    np.ndarray
        ``(B, 2)``: column 0 is the reduction ``<φ, res>²/<φ, φ>`` of the squared residual
        (a sum over samples) when the unit ``λ relu(<a, z>)`` is added with its
        least-squares weight, column 1 is that weight ``λ = <φ, res>/<φ, φ>``, where
        ``φ = relu(z a)``. Computed with one product ``relu(z Aᵀ)`` (no loop).
    """
    z, res, cand = args
    phi = z @ cand.T  # (n, B)
    np.maximum(phi, 0.0, out=phi)
    num = res @ phi
    den = np.einsum("nb,nb->b", phi, phi)
    ok = den > 0
    safe = np.where(ok, den, 1.0)
    lam = np.where(ok, num / safe, 0.0)
    return np.column_stack([lam * num, lam])


def _score(mapper: Mapper, z: np.ndarray, res: np.ndarray, cand: np.ndarray, batch: int) -> np.ndarray:
    """Score all candidates through ``mapper`` in batches; results in candidate order."""
    jobs = [(z, res, cand[i : i + batch]) for i in range(0, len(cand), batch)]
    parts = list(mapper(score_candidates, jobs))
    if len(parts) != len(jobs):
        raise RuntimeError(f"mapper returned {len(parts)} results for {len(jobs)} batches")
    return np.vstack(parts) if parts else np.zeros((0, 2))


def _predict(z: np.ndarray, a: np.ndarray, lam: np.ndarray) -> np.ndarray:
    if len(lam) == 0:
        return np.zeros(len(z))
    return np.maximum(z @ a.T, 0.0) @ lam


def relative_loss(z: np.ndarray, y: np.ndarray, directions: np.ndarray, weights: np.ndarray) -> float:
    """``mean((y − Σ_i λ_i relu(<a_i, z>))²) / mean(y²)``."""
    e = y - _predict(z, directions, weights)
    return float(e @ e / max(float(y @ y), 1e-300))


@dataclass(frozen=True)
class UnitFit:
    """Result of :func:`fit_units`.

    Attributes
    ----------
    directions
        ``(m, r)`` unit rows (units whose weight vanished are removed).
    weights
        ``(m,)`` output weights.
    loss
        Relative training loss ``|y − f(z)|² / |y|²``.
    iterations
        Levenberg–Marquardt iterations.
    converged
        Whether the last steps stopped decreasing the loss (rather than hitting ``max_iter``).
    """

    directions: np.ndarray
    weights: np.ndarray
    loss: float
    iterations: int
    converged: bool


def _lstsq_weights(z: np.ndarray, y: np.ndarray, a: np.ndarray) -> np.ndarray:
    phi = np.maximum(z @ a.T, 0.0)
    lam, *_ = np.linalg.lstsq(phi, y, rcond=None)
    return lam


def fit_units(
    z: np.ndarray,
    y: np.ndarray,
    directions: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    max_iter: int = 200,
    tol: float = 1e-10,
) -> UnitFit:
    """Fit all units jointly: ``min Σ_n (y_n − Σ_i λ_i relu(<a_i, z_n>))²`` from a start.

    The unknowns are the products ``w_i = |λ_i| a_i`` with the signs ``s_i = sign(λ_i)``
    fixed, so that ``f(z) = Σ_i s_i relu(<w_i, z>)`` has the Jacobian block
    ``s_i 1{<w_i,z> > 0} z`` (a Gauss–Newton step on fixed activation patterns is an
    exact linear solve, as in :mod:`polish`); Levenberg–Marquardt damping makes it robust
    from far starting points.

    Parameters
    ----------
    z, y
        Samples ``(n, r)`` and labels ``(n,)``.
    directions
        ``(m, r)`` starting directions (any nonzero norms).
    weights
        ``(m,)`` starting output weights; default: least squares with the directions fixed.
        Their signs are kept; a unit whose weight is zero is dropped.
    max_iter
        Bound on the iterations.
    tol
        Stop when an accepted step decreases the loss by less than ``tol`` relatively.

    Returns
    -------
    UnitFit
    """
    with _single_thread():
        return _fit_units(z, y, directions, weights, max_iter=max_iter, tol=tol)


def _fit_units(
    z: np.ndarray, y: np.ndarray, directions: np.ndarray, weights: np.ndarray | None, *, max_iter: int, tol: float
) -> UnitFit:
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    a = _unit_rows(np.asarray(directions, dtype=np.float64).reshape(-1, z.shape[1]))
    lam = _lstsq_weights(z, y, a) if weights is None else np.asarray(weights, dtype=np.float64).copy()
    keep = lam != 0
    a, lam = a[keep], lam[keep]
    m, r = a.shape
    yy = max(float(y @ y), 1e-300)
    if m == 0:
        return UnitFit(np.zeros((0, r)), np.zeros(0), float(y @ y) / yy, 0, True)
    s = np.sign(lam)
    w = np.abs(lam)[:, None] * a

    def residual(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = z @ w.T
        act = h > 0
        return np.maximum(h, 0.0) @ s - y, act

    e, act = residual(w)
    loss = float(e @ e)
    mu = 1e-8
    converged = False
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - `it` is read after the loop
        jac = ((act * s)[:, :, None] * z[:, None, :]).reshape(len(z), m * r)
        grad = jac.T @ e
        jtj = jac.T @ jac
        diag = np.diag(jtj).copy()
        floor = 1e-12 * max(float(diag.max()), 1e-300)
        accepted = False
        while mu < 1e12:
            lhs = jtj + mu * np.diag(np.maximum(diag, floor))
            try:
                step = np.linalg.solve(lhs, -grad)
            except np.linalg.LinAlgError:
                mu *= 10.0
                continue
            w_new = w + step.reshape(m, r)
            e_new, act_new = residual(w_new)
            loss_new = float(e_new @ e_new)
            if loss_new < loss:
                accepted = True
                break
            mu *= 10.0
        if not accepted:
            converged = True
            break
        decrease = (loss - loss_new) / max(loss, 1e-300)
        w, e, act, loss = w_new, e_new, act_new, loss_new
        mu = max(mu / 10.0, 1e-12)
        if decrease < tol or loss <= 1e-30 * yy:
            converged = True
            break
    norms = np.linalg.norm(w, axis=1)
    alive = norms > 1e-12 * max(float(norms.max()), 1e-300)
    return UnitFit(w[alive] / norms[alive, None], (s * norms)[alive], loss / yy, it, converged)
