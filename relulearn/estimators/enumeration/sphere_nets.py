"""Nets of the sphere for the enumeration (:mod:`.enumeration.network`): quasi-uniform antipodal nets of
``S^{r-1}``, their covering radius, and nets of small caps around a direction."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

__all__ = ["sphere_net", "covering_radius", "cap_net"]


def _rng(*key: int) -> np.random.Generator:
    """Seeded generator keyed by a tuple of non-negative ints (no global state)."""
    return np.random.default_rng([int(k) for k in key])


def _unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _repulse(p: np.ndarray, iters: int) -> np.ndarray:
    """Spread antipodal pairs ``±p`` on the sphere by nearest-neighbour repulsion.

    Each of ``iters`` steps moves every point away from its ``2r+2`` nearest neighbours
    among ``±p`` (weights ``1/dist^{r+1}``) by a decaying fraction of the typical spacing.
    The neighbours are found to within a factor 1.5 of their distances (``eps=0.5``): the k-d
    tree query is most of the cost (r = 6, 32768 points, one thread: 9.5 s with exact
    neighbours, 5.7 s so), and the nets cover as well (covering radius within 1 % of the exact
    query's nets', r = 3–6). The query runs on every core: nets are built on the driver, once
    per size and seed (cached), never inside a worker's task.
    """
    from scipy.spatial import cKDTree

    half, r = p.shape
    nb = min(2 * r + 2, 2 * half - 1)
    for it in range(iters):
        full = np.vstack([p, -p])
        dist, idx = cKDTree(full).query(p, nb + 1, eps=0.5, workers=-1)
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
