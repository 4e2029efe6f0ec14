"""Geometry of subspaces: the principal angles between two spans, and unit directions spread inside one (for
an adaptive contracted pass)."""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["principal_angles", "directions_in_subspace"]


_DIRECTIONS_STREAM = 0x5BEC7  # separates this generator's stream from others keyed by the same seed


def _as_basis(a: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"{what} must be a (d, r) basis, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{what} has NaN or infinite entries")
    return a


def principal_angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Principal angles between ``span(a)`` and ``span(b)``, in radians, ascending.

    Parameters
    ----------
    a, b
        ``(d, r_a)`` and ``(d, r_b)`` spanning sets, not necessarily orthonormal (a 1-d
        array is one vector).

    Returns
    -------
    np.ndarray
        ``min(r_a, r_b)`` angles in ``[0, π/2]``. Computed by
        ``scipy.linalg.subspace_angles`` (Knyazev–Argentati), which uses sines for small
        angles: the absolute error is ~1e-16 (a 1e-9 rad angle comes out with relative
        error ~1e-7), where arccos of a cosine would lose everything below ~1e-8.
    """
    a, b = _as_basis(a, "a"), _as_basis(b, "b")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"bases live in different dimensions: {a.shape[0]} and {b.shape[0]}")
    if a.shape[1] == 0 or b.shape[1] == 0:
        return np.zeros(0)
    return np.sort(scipy.linalg.subspace_angles(a, b))


def directions_in_subspace(basis: np.ndarray, count: int, seed: int) -> np.ndarray:
    """Unit vectors spread inside ``span(basis)``, for an adaptive contracted pass.

    Inside the relevant subspace ``<u_i, g>`` is O(1) instead of O(1/sqrt(d)), so the
    contracted matrices ``M_l^g`` there carry their full signal.

    Parameters
    ----------
    basis
        ``(d, r)`` spanning set of the subspace (orthonormalized here).
    count
        Number of directions.
    seed
        Seed of the generator ``np.random.default_rng((seed, stream))``; no global state.

    Returns
    -------
    np.ndarray
        ``(count, d)`` unit rows: Gaussian vectors projected on the subspace (so they depend on its
        span only); when ``count <= r`` they are made orthonormal (maximally spread).
    """
    q = scipy.linalg.orth(_as_basis(basis, "basis"))
    r = q.shape[1]
    if r == 0:
        raise ValueError("the subspace is empty (rank 0); there are no directions inside it")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = np.random.default_rng((int(seed), _DIRECTIONS_STREAM))
    # Gaussian vectors of R^d projected on the subspace: they depend on span(basis) only, not on which
    # orthonormal basis an eigensolver returned (eigenvector signs and rotations differ between CPUs)
    c = rng.standard_normal((count, q.shape[0])) @ q
    if 0 < count <= r:
        qr, rr = np.linalg.qr(c.T)
        c = (qr * np.where(np.diag(rr) < 0, -1.0, 1.0)).T  # R with a positive diagonal: unique
    g = c @ q.T
    return g / np.linalg.norm(g, axis=1, keepdims=True)
