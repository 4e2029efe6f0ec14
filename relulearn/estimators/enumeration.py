"""Enumeration of one-hidden-layer ReLU networks inside a found subspace (docs/design.md §6).

After the spectral stage has found a ``k'``-dimensional subspace with orthonormal basis
``V`` (``d × r``), a sample ``x ~ N(0, I_d)`` is projected to ``z = Vᵀx ~ N(0, I_r)`` and the
labels follow ``y = Σ_i λ_i relu(<a_i, z>) (+ noise)`` with ``a_i = Vᵀu_i``. This module
learns ``(a_i, λ_i)``, ``i ≤ k``, from such projected samples by the multi-stage enumeration
of Chen–Dou–Goel–Klivans–Meka (2023), made practical. Each stage:

1. **Global scan.** Every direction ``a`` of a net of the sphere ``S^{r-1}`` (both signs of
   every direction, since ``relu(<a,z>) ≠ relu(<-a,z>)``) is scored against the residual
   ``res`` of the current model: the least-squares output weight ``λ = <φ, res>/<φ, φ>`` of
   ``φ = relu(z a)`` and the reduction ``<φ, res>²/<φ, φ>`` of the squared residual. Batches
   of candidates go through a ``mapper`` (the builtin ``map`` in tests, a Dask client's map
   in a run), one BLAS-3 product ``relu(z Aᵀ)`` per batch (:func:`score_candidates`).
2. **Well-separated peaks.** The local maxima of the reduction that are at least
   ``separation`` apart and not much weaker than the best are "the neurons that are well
   separated at this scale"; several are taken at once.
3. **Local refinement.** Around each peak, nets of caps of halving radius are scored (through
   the mapper again) down to ``FINEST_CAP``.
4. **Moves and joint refit.** Moves are tried in order — add all peaks, add one peak, split
   a unit along the direction of most negative splitting curvature — each followed by a
   joint refit of all units in the ``r``-dimensional space (:func:`fit_units`,
   Levenberg–Marquardt), merging of close units the held-out loss cannot tell apart, and
   pruning. The first move that lowers the held-out loss significantly is kept, and the
   search recurses on its residual.
5. **Candidate answers.** The search may hold ``k + extra_units`` units: over-parameterised
   fits leave the local minima where one unit sits between two true ones. After every stage
   the model is pruned to at most ``k`` units (dropping the unit, or mirrored pair, whose
   removal costs least, mirroring units to keep the linear part) and refitted; these are
   the candidate answers (1, 2, ..., k units). The answer is the one with the lowest
   held-out loss, a smaller one winning unless the larger is significantly better.

The search stops on an exact fit, when no move helps on held-out data, after
``max_exchanges`` stages at full size, or when the budget — the total number of candidate
directions scored — is spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from .. import progress
from ..network import Network
from .base import BudgetError

__all__ = [
    "sphere_net",
    "covering_radius",
    "cap_net",
    "score_candidates",
    "fit_units",
    "UnitFit",
    "relative_loss",
    "EnumerationResult",
    "enumerate_network",
    "stage_cost",
]

Mapper = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


def _rng(*key: int) -> np.random.Generator:
    """Seeded generator keyed by a tuple of non-negative ints (no global state)."""
    return np.random.default_rng([int(k) for k in key])


def _single_thread():
    """Single-threaded BLAS: the driver's products are small (``n × m r``), and threaded BLAS
    on small products collapses on a loaded machine; parallelism comes from the mapper."""
    from ..aligned import one_blas_thread

    return one_blas_thread()


def _unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


# ------------------------------------------------------------------ nets of the sphere


def _repulse(p: np.ndarray, iters: int) -> np.ndarray:
    """Spread antipodal pairs ``±p`` on the sphere by nearest-neighbour repulsion.

    Each of ``iters`` steps moves every point away from its ``2r+2`` nearest neighbours
    among ``±p`` (weights ``1/dist^{r+1}``) by a decaying fraction of the typical spacing.
    """
    from scipy.spatial import cKDTree

    half, r = p.shape
    nb = min(2 * r + 2, 2 * half - 1)
    for it in range(iters):
        full = np.vstack([p, -p])
        dist, idx = cKDTree(full).query(p, nb + 1)
        dist, idx = dist[:, 1:], idx[:, 1:]
        diff = p[:, None, :] - full[idx]
        spacing = float(np.median(dist[:, 0]))
        push = (diff / np.maximum(dist, 1e-12)[..., None] ** (r + 2)).sum(1)
        push -= (push * p).sum(1, keepdims=True) * p  # tangent component
        norm = np.linalg.norm(push, axis=1, keepdims=True)
        step = 0.3 * (1.0 - it / iters) * spacing
        p = _unit_rows(p + step * push / np.maximum(norm, 1e-300))
    return p


@lru_cache(maxsize=32)
def _sphere_net_cached(r: int, count: int, seed: int) -> np.ndarray:
    if r == 1:
        return np.array([[1.0], [-1.0]])
    half = count // 2
    if r == 2:
        # equally spaced angles (optimal on the circle), rotated by a seeded offset
        phase = _rng(seed, 2, count).uniform(0.0, 2.0 * np.pi / count)
        t = phase + 2.0 * np.pi * np.arange(half) / count
        p = np.column_stack([np.cos(t), np.sin(t)])
    else:
        p = _unit_rows(_rng(seed, r, count).standard_normal((half, r)))
        p = _repulse(p, iters=30)
    net = np.vstack([p, -p])
    net.setflags(write=False)
    return net


def sphere_net(r: int, count: int, seed: int = 0) -> np.ndarray:
    """Quasi-uniform unit vectors covering ``S^{r-1}``, closed under ``a -> -a``.

    Parameters
    ----------
    r
        Dimension of the space (``r ≥ 1``).
    count
        Number of points; even (antipodal pairs). For ``r = 1`` the only net is ``{+1, -1}``.
    seed
        Seed of the generator (``np.random.default_rng([seed, r, count])``).

    Returns
    -------
    np.ndarray
        ``(count, r)`` unit rows; row ``count/2 + j`` is minus row ``j``. On the circle the
        points are equally spaced; for ``r ≥ 3`` random antipodal pairs are spread by
        30 steps of nearest-neighbour repulsion. See :func:`covering_radius`.
    """
    if r < 1:
        raise ValueError(f"sphere_net: dimension r must be ≥ 1, got {r}")
    if count < 2 or count % 2:
        raise ValueError(f"sphere_net: count must be an even number ≥ 2 (antipodal pairs), got {count}")
    if r == 1 and count != 2:
        raise ValueError("sphere_net: in r = 1 the sphere is {+1, -1}; use count = 2")
    return _sphere_net_cached(int(r), int(count), int(seed)).copy()


def _facet_along(points: np.ndarray, ray: np.ndarray, start: np.ndarray) -> float:
    """Angular circumradius of the facet of ``conv(points)`` that the ray ``t·ray`` crosses.

    Linear program ``min b  s.t.  <n, p_j> ≤ b,  <n, ray> = 1`` with lazily added
    constraints (cutting planes), started from the points ``start``.
    """
    from scipy.optimize import linprog

    r = points.shape[1]
    active = [int(i) for i in start]
    for _ in range(100):
        p = points[active]
        res = linprog(
            np.r_[np.zeros(r), 1.0],
            A_ub=np.hstack([p, -np.ones((len(p), 1))]),
            b_ub=np.zeros(len(p)),
            A_eq=np.r_[ray, 0.0][None],
            b_eq=[1.0],
            bounds=[(-1e4, 1e4)] * r + [(None, None)],
            method="highs",
        )
        if res.status != 0:  # pragma: no cover - HiGHS failure; fall back to the sample distance
            return 0.0
        n, b = res.x[:r], res.x[r]
        nn = float(np.linalg.norm(n))
        viol = points @ n - b
        bad = np.flatnonzero(viol > 1e-12 * nn)
        if len(bad) == 0:
            return float(np.arccos(np.clip(b / nn, -1.0, 1.0)))
        bad = bad[np.argsort(-viol[bad], kind="stable")][: 2 * r]
        active += [int(i) for i in bad if int(i) not in active]
    return 0.0  # pragma: no cover


def covering_radius(
    points: np.ndarray, *, exact: bool | None = None, samples: int | None = None, refine: int = 32, seed: int = 0
) -> float:
    """Angular covering radius ``max_{x ∈ S^{r-1}} min_j ∠(x, p_j)`` of unit vectors ``points``.

    The covering radius is the largest angular circumradius of a facet of the convex hull of
    the points (the origin being inside it, as it is for antipodal nets).

    Parameters
    ----------
    points
        ``(N, r)`` unit rows.
    exact
        Compute all hull facets with qhull (exact). Default: when ``r ≤ 3``, or ``r = 4`` and
        ``N ≤ 20000`` (qhull gets slow beyond).
    samples
        Otherwise (estimate): number of random directions whose distance to the net is
        measured (default ``min(20 N, 200000)``) ...
    refine
        ... of which the ``refine`` farthest are followed to the hull facet their ray crosses,
        whose exact circumradius is taken (a cutting-plane LP). The estimate is the largest
        circumradius found: a lower bound that finds the deepest holes near the sampled
        ones, typically within a few per cent of the true value.
    seed
        Seed of the random directions.

    Returns
    -------
    float
        Radians.
    """
    pts = np.asarray(points, dtype=np.float64)
    n_pts, r = pts.shape
    if r == 1:
        return 0.0 if (pts > 0).any() and (pts < 0).any() else float(np.pi)
    if exact is None:
        exact = r <= 3 or (r == 4 and n_pts <= 20_000)
    if exact:
        from scipy.spatial import ConvexHull

        hull = ConvexHull(pts)
        # equations: n·x + c ≤ 0 inside, |n| = 1: the facet plane is at distance -c
        dist = -hull.equations[:, -1]
        if dist.min() <= 0:
            return float(np.pi)  # origin not strictly inside: a hemisphere is uncovered
        return float(np.arccos(np.clip(dist.min(), -1.0, 1.0)))
    from scipy.spatial import cKDTree

    m = int(samples) if samples is not None else min(20 * n_pts, 200_000)
    g = _unit_rows(_rng(seed, 7, r, n_pts).standard_normal((m, r)))
    chord, idx = cKDTree(pts).query(g, min(2 * r, n_pts))
    ang = 2.0 * np.arcsin(np.clip(chord[:, 0] / 2.0, 0.0, 1.0))
    best = float(ang.max())
    for w in np.argsort(-ang, kind="stable")[:refine]:
        best = max(best, _facet_along(pts, g[w], idx[w]))
    return best


@lru_cache(maxsize=64)
def _net_scale(r: int, count: int, seed: int) -> float:
    """Covering radius of ``sphere_net(r, count, seed)`` (cached; a cheap estimate for r ≥ 5)."""
    net = _sphere_net_cached(r, count, seed)
    if r <= 4 and count <= 20_000:
        return covering_radius(net)
    return covering_radius(net, samples=min(8 * count, 60_000), refine=8, seed=seed)


@lru_cache(maxsize=64)
def _ball_pattern(dim: int, count: int, seed: int) -> np.ndarray:
    """``count`` quasi-uniform points of the unit ``dim``-ball, the first one being 0 (cached, read-only)."""
    if dim == 1:
        half = max(1, (count) // 2)
        steps = np.arange(1, half + 1) / half
        pts = np.r_[0.0, np.column_stack([steps, -steps]).ravel()][:count, None]  # 0, ±1/h, ±2/h, ...
    else:
        from scipy.stats import qmc

        sob = qmc.Sobol(dim, scramble=True, seed=_rng(seed, 11, dim, count))
        inside = np.zeros((0, dim))
        while len(inside) < count - 1:  # scrambled Sobol points of the cube, kept inside the ball
            cube = 2.0 * sob.random_base2(max(4, int(math.ceil(math.log2(max(count, 2) * 2.0**dim))))) - 1.0
            inside = np.vstack([inside, cube[(cube**2).sum(1) <= 1.0]])
        pts = np.vstack([np.zeros((1, dim)), inside[: count - 1]])
    pts.setflags(write=False)
    return pts


def cap_net(center: np.ndarray, radius: float, count: int, seed: int = 0) -> np.ndarray:
    """``count`` unit vectors in the spherical cap of angular ``radius`` around ``center``.

    The first row is ``center``; the others are the exponential map of quasi-uniform
    (scrambled Sobol) points of the tangent ball of radius ``radius``.
    """
    c = np.asarray(center, dtype=np.float64)
    c = c / np.linalg.norm(c)
    r = len(c)
    if r == 1:
        return c[None].copy()
    # orthonormal basis of the tangent space c⊥ (QR of [c, I]: columns 2.. are ⊥ c)
    q, _ = np.linalg.qr(np.column_stack([c, np.eye(r)]))
    basis = q[:, 1:r]
    t = radius * _ball_pattern(r - 1, count, seed)  # (count, r-1)
    ang = np.linalg.norm(t, axis=1)
    safe = np.where(ang > 0, ang, 1.0)
    pts = np.cos(ang)[:, None] * c + (np.sin(ang) / safe)[:, None] * (t @ basis.T)
    return _unit_rows(pts)


# ------------------------------------------------------------------ scoring


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


# ------------------------------------------------------------------ models and losses


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


# ------------------------------------------------------------------ the multi-stage search

#: centres (well-separated peaks) refined and added per stage at most
MAX_CENTRES = 4
#: moves (refits) tried per stage at most
MAX_MOVES = 8
#: half-angle (radians) between the two children of a split unit
SPLIT_ANGLE = 0.1
#: local refinement stops once the cap radius is below this (radians); fit_units does the rest
FINEST_CAP = 0.01


def _min_net(r: int) -> int:
    """Smallest global net allowed (coarser nets miss peaks): ``4^r`` points."""
    return 2 if r == 1 else 4**r


def _max_net(r: int) -> int:
    """Largest global net worth scoring (finer resolution is left to the local caps)."""
    return 2 if r == 1 else 2 * 4 ** (r + 1)


def _cap_count(r: int) -> int:
    """Points per local cap: halving the cap radius needs about ``2^{r-1}`` times more."""
    return 1 if r == 1 else 4 * 2 ** (r - 1)


def _ladder(limit: int, r: int) -> int:
    """Largest net size ``≤ limit`` on a √2 ladder of even numbers (reused across runs)."""
    if r == 1:
        return 2
    best = _min_net(r)
    j = 0
    while True:
        c = 2 * int(round(2 ** (j / 2) * _min_net(r) / 2))
        if c > limit:
            return best
        best = c
        j += 1


def _levels(scale: float) -> int:
    """Local levels from radius ``2·scale`` halving down to ``FINEST_CAP``."""
    return max(1, int(math.ceil(math.log2(max(2.0 * scale / FINEST_CAP, 2.0)))))


def stage_cost(r: int, seed: int = 0) -> int:
    """Candidate evaluations of the cheapest stage in ``r`` dimensions (smallest net, one centre)."""
    if r == 1:
        return 2
    n = _min_net(r)
    return n + _levels(_net_scale(r, n, seed)) * _cap_count(r)


@dataclass(frozen=True)
class EnumerationResult:
    """The network found by :func:`enumerate_network`, in the subspace's coordinates.

    Attributes
    ----------
    directions
        ``(m, r)`` unit hidden directions ``a_i``.
    weights
        ``(m,)`` output weights ``λ_i``.
    heldout_loss
        Relative held-out loss ``mean((y − f)²)/mean(y²)`` on ``(z_val, y_val)``.
    train_loss
        Relative training loss on ``(z, y)``.
    stages
        One dict per stage: net size and covering radius (``scale``), centres found and
        refined, units after the refit, losses, candidates scored.
    candidates_evaluated
        Directions scored in total (bounded by the budget).
    merged
        Groups of units merged into one final unit because they could not be told apart:
        ``reason`` (``"close"``: two units within ``merge_angle`` whose merge did not
        worsen the held-out loss; ``"held-out"``: units of a larger candidate answer that the
        held-out loss did not justify), their ``directions`` and ``weights``, the
        ``merged_direction``, ``into`` (index of the final unit closest to it, ``-1`` when
        there is none) and ``angle_to_into``.
    models
        The candidate answers (at most ``k`` units) of every stage: units, held-out and
        training losses, stage, ``accepted`` (``False`` for the best rejected attempt of the
        last stage) and ``chosen``.
    stopped
        Why the search stopped.
    """

    directions: np.ndarray
    weights: np.ndarray
    heldout_loss: float
    train_loss: float
    stages: list[dict] = field(default_factory=list)
    candidates_evaluated: int = 0
    merged: list[dict] = field(default_factory=list)
    models: list[dict] = field(default_factory=list)
    stopped: str = ""

    @property
    def units(self) -> int:
        return int(len(self.weights))

    @property
    def output_weights(self) -> np.ndarray:
        """Alias of ``weights``."""
        return self.weights

    def network(self, basis: np.ndarray | None = None) -> Network:
        """The learned network; with ``basis`` (``d × r``, orthonormal columns) lifted to ``R^d``."""
        u = self.directions if basis is None else self.directions @ np.asarray(basis, dtype=np.float64).T
        return Network((u, self.weights[None, :]))

    def to_dict(self) -> dict:
        """Plain JSON-serialisable form."""
        return {
            "directions": self.directions.tolist(),
            "weights": self.weights.tolist(),
            "heldout_loss": self.heldout_loss,
            "train_loss": self.train_loss,
            "stages": self.stages,
            "candidates_evaluated": self.candidates_evaluated,
            "merged": self.merged,
            "models": self.models,
            "stopped": self.stopped,
        }


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


def enumerate_network(
    z: np.ndarray,
    y: np.ndarray,
    z_val: np.ndarray,
    y_val: np.ndarray,
    *,
    k: int,
    budget: int = 200_000,
    mapper: Mapper = map,
    batch: int = 512,
    seed: int = 0,
    score_samples: int = 8192,
    extra_units: int = 2,
    max_exchanges: int | None = None,
    separation: float = 0.6,
    fraction: float = 0.25,
    merge_angle: float = 0.1,
    se_margin: float = 2.0,
    min_gain: float = 1e-3,
) -> EnumerationResult:
    """Learn ``y ≈ Σ_{i≤m} λ_i relu(<a_i, z>)``, ``m ≤ k``, by multi-stage enumeration.

    Each stage scans the residual of the current model over a net of the sphere (through
    ``mapper``), takes the well-separated peaks, refines them on shrinking caps, and tries
    moves — add all peaks, add one peak, split a unit — each followed by a joint refit
    (:func:`fit_units`); the first move that lowers the held-out loss significantly is kept.
    The search may hold up to ``k + extra_units`` units (over-parameterised fits escape
    the local minima where one unit sits between two true ones); after every stage the model
    is pruned to at most ``k`` units, and these pruned models are the candidate answers.

    Parameters
    ----------
    z, y
        Training sample projected on the subspace, ``(n, r)``, and labels ``(n,)``.
    z_val, y_val
        Held-out sample of the same kind (acceptance of moves, model selection, stopping).
    k
        Upper bound on the number of units of the answer.
    budget
        Bound on the total number of candidate directions scored.
    mapper
        ``mapper(fn, iterable) -> iterable`` with the semantics of the builtin ``map``;
        called with :func:`score_candidates` and tuples ``(z_s, res, A_batch)`` of numpy
        arrays; results are used in order, so any evaluation order gives the same answer.
    batch
        Candidate directions per mapped task.
    seed
        Seed of the nets.
    score_samples
        Candidates are scored, and moves screened, on the first ``min(n, score_samples)``
        training samples; accepted moves are refitted on all of them.
    extra_units
        Units the search may hold beyond ``k``.
    max_exchanges
        Stages run once ``k + extra_units`` units are held (add then prune, split then
        prune); default ``k``.
    separation
        Peaks of one stage are at least this far apart (radians): "well separated".
    fraction
        A secondary peak is taken when its reduction is at least this fraction of the best.
    merge_angle
        Two units closer than this (radians) are tried merged into one.
    se_margin
        A move (or a larger model) must lower the held-out loss by this many standard errors
        of the paired per-sample difference ...
    min_gain
        ... and by this fraction of the held-out loss.

    Returns
    -------
    EnumerationResult
        The candidate answer with the lowest held-out loss (a smaller one wins unless the
        larger is significantly better).

    Raises
    ------
    ValueError
        On inconsistent shapes, non-finite values, ``k < 1``, or a budget too small for one
        stage (the message says which budget to give).
    """
    z = np.ascontiguousarray(z, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64).reshape(-1)
    z_val = np.ascontiguousarray(z_val, dtype=np.float64)
    y_val = np.ascontiguousarray(y_val, dtype=np.float64).reshape(-1)
    if z.ndim != 2 or z_val.ndim != 2 or z.shape[1] != z_val.shape[1]:
        raise ValueError(f"z and z_val must be (n, r) with the same r; got {z.shape} and {z_val.shape}")
    if len(z) != len(y) or len(z_val) != len(y_val):
        raise ValueError(f"samples and labels differ in length: {len(z)} vs {len(y)}, {len(z_val)} vs {len(y_val)}")
    if len(z_val) < 2 or len(z) < 2:
        raise ValueError("enumerate_network needs training and held-out samples (at least 2 of each)")
    for name, arr in (("z", z), ("y", y), ("z_val", z_val), ("y_val", y_val)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or inf")
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    if batch < 1:
        raise ValueError(f"batch must be ≥ 1, got {batch}")
    if extra_units < 0:
        raise ValueError(f"extra_units must be ≥ 0, got {extra_units}")
    opts = _Options(
        k=k,
        budget=int(budget),
        batch=batch,
        seed=seed,
        score_samples=score_samples,
        k_max=k + extra_units,
        max_exchanges=k if max_exchanges is None else max_exchanges,
        separation=separation,
        fraction=fraction,
        merge_angle=merge_angle,
        se_margin=se_margin,
        min_gain=min_gain,
    )
    with _single_thread():
        return _Search(z, y, z_val, y_val, mapper, opts).run()


@dataclass(frozen=True)
class _Options:
    k: int
    budget: int
    batch: int
    seed: int
    score_samples: int
    k_max: int
    max_exchanges: int
    separation: float
    fraction: float
    merge_angle: float
    se_margin: float
    min_gain: float


Model = tuple[np.ndarray, np.ndarray]


class _Search:
    """State of one :func:`enumerate_network` run (driver side; only scoring is mapped)."""

    def __init__(self, z, y, z_val, y_val, mapper: Mapper, opts: _Options) -> None:
        self.z, self.y, self.z_val, self.y_val, self.mapper, self.o = z, y, z_val, y_val, mapper, opts
        r = self.r = z.shape[1]
        n_s = min(len(z), opts.score_samples)
        self.zs, self.ys = z[:n_s], y[:n_s]
        # plan: one global net for the whole run, sized so that k + 1 stages fit in the budget
        self.cap_n = _cap_count(r)
        # a stage costs at least a net of 4^r points and one local cap: refuse on that bound before building
        # the net (at r = 10 that net has 10^6 points, and building it would take hours)
        lower = 2 if r == 1 else _min_net(r) + _cap_count(r)
        one = stage_cost(r, opts.seed) if opts.budget >= lower or _min_net(r) <= 4**8 else lower
        if opts.budget < one:
            raise BudgetError(
                f"budget={opts.budget} candidate evaluations does not pay for one enumeration stage in r={r} "
                f"dimensions: a stage scores at least {one} directions (a net of {_min_net(r)} plus local "
                f"refinement of one peak); give budget >= {one} (>= {(opts.k + 1) * one} to allow k + 1 = "
                f"{opts.k + 1} stages)",
                one,
                (opts.k + 1) * one,
            )
        levels = _levels(_net_scale(r, _min_net(r), opts.seed)) if r > 1 else 0
        per_stage = opts.budget // (opts.k + 1) - levels * self.cap_n
        self.n_net = _ladder(min(max(per_stage, _min_net(r)), _max_net(r)), r)
        self.net = _sphere_net_cached(r, self.n_net, opts.seed)
        self.scale = _net_scale(r, self.n_net, opts.seed)
        self.levels = _levels(self.scale) if r > 1 else 0
        self.evaluated = 0

    # -------------------------------------------------------------- small tools
    def heldout(self, model: Model) -> float:
        return relative_loss(self.z_val, self.y_val, *model)

    def better(self, big: Model, small: Model) -> bool:
        return _significantly_better(self.z_val, self.y_val, big, small, self.o.se_margin, self.o.min_gain)

    def prune(self, model: Model, limit: int) -> Model:
        """Drop units one at a time — the one whose removal, after a refit on the scoring
        subsample, costs least — until at most ``limit`` remain."""
        a, lam = model
        while len(lam) > limit:
            linear = lam @ a  # twice the linear part E[y z] of the model: relu(t) = (t + |t|)/2
            drops = [[i] for i in range(len(lam))]
            if len(lam) - limit >= 2:  # a mirrored pair (±a, ∓λ) is a linear term: drop it whole
                ang = _angles(a, a)
                drops += [
                    [i, j]
                    for i in range(len(lam))
                    for j in range(i + 1, len(lam))
                    if ang[i, j] > math.pi - self.o.merge_angle
                ]
            best: UnitFit | None = None
            for drop in drops:
                rest = ~np.isin(np.arange(len(lam)), drop)
                starts = [a[rest]]
                flipped = _match_linear_part(a[rest], lam[rest], linear)
                if flipped is not None:
                    starts.append(flipped)
                for start in starts:
                    f = fit_units(self.zs, self.ys, start, lam[rest], max_iter=200)
                    if best is None or f.loss < best.loss:
                        best = f
            assert best is not None  # at least one drop (len(lam) > limit), each with a start
            a, lam = best.directions, best.weights
        return a, lam

    def full_fit(self, model: Model) -> Model:
        f = fit_units(self.z, self.y, *model, max_iter=100)
        return f.directions, f.weights

    def score(self, res: np.ndarray, cand: np.ndarray) -> np.ndarray:
        self.evaluated += len(cand)
        return _score(self.mapper, self.zs, res, cand, self.o.batch)

    # -------------------------------------------------------------- one stage
    def peaks(self, state: Model, want: int) -> tuple[np.ndarray, np.ndarray, float, float]:
        """Scan the residual over the net, take the well-separated peaks, refine them on caps.

        Returns the refined centres, their scores ``(reduction, λ)``, the squared residual
        and the best reduction of the global scan.
        """
        o = self.o
        res = self.ys - _predict(self.zs, *state)
        res_sq = float(res @ res)
        scores = self.score(res, np.asarray(self.net))
        red = scores[:, 0]
        best = float(red.max())
        if res_sq <= 1e-28 * float(self.ys @ self.ys) or best <= 1e-14 * res_sq:
            return np.zeros((0, self.r)), np.zeros((0, 2)), res_sq, best
        picked = _pick_centres(
            self.net,
            red,
            count=want,
            separation=o.separation,
            neighbourhood=min(2.5 * self.scale, o.separation),
            fraction=o.fraction,
        )
        centres = np.array(self.net[picked])
        cscore = scores[picked].copy()
        radius = 2.0 * self.scale  # caps of halving radius, all centres in one mapped call per level
        for level in range(self.levels):
            caps = [cap_net(c, radius, self.cap_n, seed=o.seed + level) for c in centres]
            sc = self.score(res, np.vstack(caps))
            for j in range(len(centres)):
                block = sc[j * self.cap_n : (j + 1) * self.cap_n]
                b = int(np.argmax(block[:, 0]))
                if block[b, 0] > cscore[j, 0]:
                    centres[j], cscore[j] = caps[j][b], block[b]
            radius /= 2.0
        keep: list[int] = []  # centres that refined onto each other count once
        for j in np.argsort(-cscore[:, 0], kind="stable"):
            if all(_angles(centres[j : j + 1], centres[i : i + 1])[0, 0] > o.separation / 2 for i in keep):
                keep.append(int(j))
        return centres[keep], cscore[keep], res_sq, best

    def moves(self, state: Model, centres: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray | None, int]]:
        """Starting points of the refits: add all centres, add each centre, split each unit
        whose splitting lowers the loss (most negative curvature first)."""
        a, lam = state
        out: list[tuple[str, np.ndarray, np.ndarray | None, int]] = []
        if len(centres):
            out.append(("add", np.vstack([a, centres]), None, len(centres)))
            if len(centres) > 1:
                out += [("add", np.vstack([a, centres[j : j + 1]]), None, 1) for j in range(len(centres))]
        c, s = math.cos(SPLIT_ANGLE), math.sin(SPLIT_ANGLE)
        for _, i, v in _split_directions(self.z, self.y, state):
            rest = np.arange(len(lam)) != i
            out.append(
                (
                    "split",
                    np.vstack([a[rest], c * a[i] + s * v, c * a[i] - s * v]),
                    np.r_[lam[rest], lam[i] / 2, lam[i] / 2],
                    1,
                )
            )
        return out[:MAX_MOVES]

    # -------------------------------------------------------------- the search
    def run(self) -> EnumerationResult:
        o = self.o
        empty: Model = (np.zeros((0, self.r)), np.zeros(0))
        state = empty
        answers: list[dict] = [
            {"units": 0, "heldout_loss": 1.0, "train_loss": 1.0, "stage": 0, "accepted": True, "_model": empty}
        ]
        stages: list[dict] = []
        merged: list[dict] = []
        exchanges, stage, stopped = 0, 0, ""
        stage_min = self.n_net + self.levels * self.cap_n
        while True:
            m = len(state[1])
            if m >= o.k_max and exchanges >= o.max_exchanges:
                stopped = f"holding k + extra = {o.k_max} units after {exchanges} exchange stages"
                break
            if o.budget - self.evaluated < stage_min:
                stopped = f"budget exhausted ({self.evaluated} of {o.budget} candidate evaluations used)"
                break
            stage += 1
            progress.step(
                "enumeration: stages",
                stage,
                None,
                f"{m} units, {self.evaluated:,} of {o.budget:,} candidate evaluations",
            )
            exchange = m >= o.k_max
            exchanges += exchange
            before = self.evaluated
            afford = (o.budget - self.evaluated - self.n_net) // max(self.levels * self.cap_n, 1)
            want = max(1, min(MAX_CENTRES, max(o.k - m, 1), afford))
            centres, cscore, res_sq, best_red = self.peaks(state, want)
            record: dict[str, Any] = {
                "stage": stage,
                "kind": "exchange" if exchange else "growth",
                "net": self.n_net,
                "scale": self.scale,
                "levels": self.levels,
                "best_reduction": best_red / max(res_sq, 1e-300),
                "centres": centres.tolist(),
                "centre_weights": cscore[:, 1].tolist(),
                "centre_reductions": (cscore[:, 0] / max(res_sq, 1e-300)).tolist(),
            }
            moves = self.moves(state, centres) if len(centres) else []
            accepted = None
            rejected: tuple[float, Model] | None = None
            tried: list[str] = []
            for kind, start, start_w, added in moves:
                tried.append(kind)
                # screen on the scoring subsample; refit on all samples only what passes
                fit = fit_units(self.zs, self.ys, start, start_w, max_iter=200)
                pre = self.prune((fit.directions, fit.weights), o.k_max)
                model, merges = _merge_close(
                    self.zs, self.ys, self.z_val, self.y_val, pre, o.merge_angle, o.se_margin, o.min_gain
                )
                if self.better(model, state):
                    model = self.full_fit(model)
                    if self.better(model, state):
                        accepted = (kind, added, model, merges)
                        break
                h_pre = self.heldout(pre)
                if len(pre[1]) > m and len(pre[1]) <= o.k and (rejected is None or h_pre < rejected[0]):
                    rejected = (h_pre, pre)
            record |= {"candidates": self.evaluated - before, "moves_tried": tried}
            if accepted is None:
                stopped = "residual explained" if not len(centres) else "no held-out improvement"
                stages.append(
                    record
                    | {
                        "added": 0,
                        "units": m,
                        "heldout_loss": self.heldout(state),
                        "train_loss": relative_loss(self.z, self.y, *state),
                    }
                )
                if rejected is not None:
                    answers.append(
                        {
                            "units": len(rejected[1][1]),
                            "heldout_loss": rejected[0],
                            "train_loss": relative_loss(self.z, self.y, *rejected[1]),
                            "stage": stage,
                            "accepted": False,
                            "_model": rejected[1],
                        }
                    )
                break
            kind, added, state, merges = accepted
            merged.extend(g | {"stage": stage} for g in merges)
            answer = state if len(state[1]) <= o.k else self.full_fit(self.prune(state, o.k))
            h, train = self.heldout(answer), relative_loss(self.z, self.y, *answer)
            stages.append(
                record
                | {
                    "move": kind,
                    "added": added,
                    "units": len(state[1]),
                    "heldout_loss": self.heldout(state),
                    "answer_units": len(answer[1]),
                    "answer_heldout_loss": h,
                }
            )
            answers.append(
                {
                    "units": len(answer[1]),
                    "heldout_loss": h,
                    "train_loss": train,
                    "stage": stage,
                    "accepted": True,
                    "_model": answer,
                }
            )
            if train <= 1e-28:
                stopped = "exact fit"
                break
        return self.finish(answers, stages, merged, stopped)

    def finish(self, answers: list[dict], stages: list[dict], merged: list[dict], stopped: str) -> EnumerationResult:
        """Pick the answer: lowest held-out loss, a smaller model winning unless significantly worse."""
        ok = [i for i, a in enumerate(answers) if a["accepted"]]
        best = min(ok, key=lambda i: (answers[i]["heldout_loss"], answers[i]["units"]))
        chosen = best
        for i in sorted(ok, key=lambda i: (answers[i]["units"], i)):
            if answers[i]["units"] >= answers[best]["units"]:
                break
            if not self.better(answers[best]["_model"], answers[i]["_model"]):
                chosen = i
                break
        final = answers[chosen]["_model"]
        # units of a larger candidate answer (accepted, or the last rejected attempt) that the
        # held-out loss did not justify
        largest = max(answers, key=lambda a: (a["units"], a["stage"]))
        if largest["units"] > len(final[1]):
            merged.extend(_unmatched(largest["_model"], final, stage=largest["stage"]))
        for g in merged:
            g["into"] = _nearest_unit(np.array(g["merged_direction"]), final[0])
            g["angle_to_into"] = (
                float(_angles(np.array(g["merged_direction"])[None], final[0][g["into"]][None])[0, 0])
                if g["into"] >= 0
                else None
            )
        return EnumerationResult(
            directions=final[0],
            weights=final[1],
            heldout_loss=self.heldout(final),
            train_loss=relative_loss(self.z, self.y, *final),
            stages=stages,
            candidates_evaluated=self.evaluated,
            merged=merged,
            models=[
                {k_: v for k_, v in a.items() if k_ != "_model"} | {"chosen": i == chosen}
                for i, a in enumerate(answers)
            ],
            stopped=stopped,
        )


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
