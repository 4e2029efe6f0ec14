"""The least-squares system of the single-output polish (:func:`.polish.dense.polish`), kept from step to step.

With the units' activation patterns fixed, ``y = Σ_i P_i <w_i, x̃> (+ c + Lᵀx)`` is linear in the products ``w_i``:
the design ``Φ`` has block ``i`` equal to ``P_i x̃`` (then a column of ones for the output bias and ``x`` for a
free affine part). Its normal matrix ``ΦᵀΦ`` costs ``n p²`` flops (``p`` unknowns on ``n`` rows: 6.4·10¹¹ at d = 24,
k = 96), every step. It depends on the patterns alone, and from one step to the next only the samples near a
moved boundary change pattern (a few per cent at first, then none): :class:`ProductsSystem` sums the normal matrix
once and then subtracts the old rows and adds the new ones of just those samples. The products with ``Φ`` and
``Φᵀ`` (right-hand side, refinement) are two GEMMs on the inputs, ``4 n d k`` flops, so the ``n × p`` design is
never held whole: it is built a block of rows at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.linalg import lapack

__all__ = ["ProductsSystem", "solve_normal", "RCOND_NORMAL"]

#: eigenvalues of a normal matrix below this fraction of its largest are dropped (the design's singular values
#: below 3·10⁻⁷ of its largest: directions the samples do not determine), as a rank-revealing solve would
RCOND_NORMAL = 1e-13

#: a normal matrix whose reciprocal condition number LAPACK estimates at least this is solved by Cholesky: its
#: smallest eigenvalue is then far above :data:`RCOND_NORMAL` of its largest (the estimate is within a small
#: factor), so that the eigendecomposition would drop nothing and find the same solution
CHOLESKY_RCOND = 1e-11

#: entries of a block of design rows built at once (64 MB: at 2,521 unknowns, blocks of 3,300 rows sum the normal
#: matrix 1.35× as fast as blocks of 830)
BLOCK_ENTRIES = 2**23

#: past this fraction of the trusted samples changed, the normal matrix is summed again rather than updated (an
#: update sums each changed sample twice, out with its old pattern and in with its new one)
RESUM = 0.5


def _cholesky(gram: np.ndarray) -> Callable[[np.ndarray], np.ndarray] | None:
    """A solver of ``gram s = r`` by its Cholesky factor, when the factor exists and LAPACK's estimate of the
    reciprocal condition number is at least :data:`CHOLESKY_RCOND`; else None."""
    factor, info = lapack.dpotrf(gram, lower=False, clean=True)
    if info != 0:
        return None
    rcond, info = lapack.dpocon(factor, float(np.linalg.norm(gram, 1)))
    if info != 0 or not rcond >= CHOLESKY_RCOND:
        return None
    return lambda r: lapack.dpotrs(factor, r[:, None])[0][:, 0]


def solve_normal(gram: np.ndarray, at_b: np.ndarray, refine: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The minimum-norm solution of the normal equations ``gram s = at_b`` on the eigenvectors with eigenvalues
    above :data:`RCOND_NORMAL` of the largest, refined once with ``refine(s) = Aᵀ(b − A s)`` (computed from the
    design itself, so that an error of ``gram`` slows the refinement, never moves its answer). A well-conditioned
    ``gram`` (no eigenvalue would be dropped) is solved by its Cholesky factor instead: the same solution, at a
    thirtieth of an eigendecomposition's cost (0.25 s against 2.9 s at 2,521 unknowns)."""
    chol = _cholesky(gram)
    if chol is not None:
        s = chol(at_b)
        return s + chol(refine(s))
    lam, v = np.linalg.eigh(gram)
    inv = np.zeros_like(lam)
    keep = lam > RCOND_NORMAL * max(float(lam[-1]), 0.0)
    inv[keep] = 1.0 / lam[keep]
    s = v @ (inv * (v.T @ at_b))
    return s + v @ (inv * (v.T @ refine(s)))


class ProductsSystem:
    """The products' least squares of :func:`.polish.dense.polish` on inputs ``xt`` (``[x, 1]`` with biases) for
    ``k`` units, with an output bias (``biased``) and a free affine part on the first ``d_in`` inputs
    (``affine``). :meth:`solve` takes each step's trusted samples and patterns and updates the normal matrix
    where they changed."""

    def __init__(self, xt: np.ndarray, k: int, biased: bool, affine: bool, d_in: int) -> None:
        self.xt, self.k, self.biased, self.affine, self.d_in = xt, k, biased, affine, d_in
        self.d = xt.shape[1]
        self.unknowns = k * self.d + int(biased) + (d_in if affine else 0)
        self._gram: np.ndarray | None = None
        self._rows = np.zeros(len(xt), dtype=bool)  # the samples summed into the normal matrix
        self._pattern = np.zeros((len(xt), k), dtype=bool)  # their patterns as summed

    def _design(self, rows: np.ndarray, pattern: np.ndarray) -> np.ndarray:
        """The design's rows of samples ``rows`` (indices) with their patterns."""
        xs, k, d = self.xt[rows], self.k, self.d
        phi = np.empty((len(rows), self.unknowns))
        for i in range(k):
            np.multiply(xs, pattern[:, i : i + 1], out=phi[:, i * d : (i + 1) * d])
        if self.biased:
            phi[:, k * d] = 1.0
        if self.affine:
            phi[:, k * d + 1 :] = xs[:, : self.d_in]
        return phi

    def _sum(self, rows: np.ndarray, pattern: np.ndarray) -> np.ndarray:
        """``Φᵀ Φ`` over the samples ``rows`` (indices, patterns ``pattern``), a block of rows at a time."""
        gram = np.zeros((self.unknowns, self.unknowns))
        step = max(1, BLOCK_ENTRIES // self.unknowns)
        for lo in range(0, len(rows), step):
            phi = self._design(rows[lo : lo + step], pattern[lo : lo + step])
            gram += phi.T @ phi
        return gram

    def _normal(self, trusted: np.ndarray, pattern: np.ndarray) -> np.ndarray:
        """The normal matrix on the trusted samples (``pattern``: every sample's, n × k), updated in place."""
        changed = (trusted != self._rows) | (trusted & np.any(pattern != self._pattern, axis=1))
        if self._gram is None or np.count_nonzero(changed) > RESUM * np.count_nonzero(trusted):
            rows = np.flatnonzero(trusted)
            self._gram = self._sum(rows, pattern[rows])
        else:
            gone = np.flatnonzero(changed & self._rows)
            new = np.flatnonzero(changed & trusted)
            self._gram += self._sum(new, pattern[new]) - self._sum(gone, self._pattern[gone])
        self._rows, self._pattern = trusted.copy(), pattern.copy()
        return self._gram

    def _apply(self, xs: np.ndarray, pat: np.ndarray, s: np.ndarray) -> np.ndarray:
        """``Φ s`` on the samples ``xs`` with patterns ``pat`` (float)."""
        k, d = self.k, self.d
        out = np.einsum("ij,ij->i", xs @ s[: k * d].reshape(k, d).T, pat)
        if self.biased:
            out += s[k * d]
        if self.affine:
            out += xs[:, : self.d_in] @ s[k * d + 1 :]
        return out

    def _apply_t(self, xs: np.ndarray, pat: np.ndarray, r: np.ndarray) -> np.ndarray:
        """``Φᵀ r`` on the samples ``xs`` with patterns ``pat`` (float)."""
        parts = [(xs.T @ (pat * r[:, None])).T.ravel()]
        if self.biased:
            parts.append(np.array([r.sum()]))
        if self.affine:
            parts.append(xs[:, : self.d_in].T @ r)
        return np.concatenate(parts)

    def solve(self, trusted: np.ndarray, pattern: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The least-squares products (then the output bias and the affine part) on the ``trusted`` samples (a
        mask), whose activation patterns are ``pattern`` (every sample's, n × k booleans), for labels ``y``."""
        gram = self._normal(trusted, pattern)
        xs, ys = self.xt[trusted], y[trusted]
        pat = pattern[trusted].astype(np.float64)
        return solve_normal(
            gram, self._apply_t(xs, pat, ys), lambda s: self._apply_t(xs, pat, ys - self._apply(xs, pat, s))
        )
