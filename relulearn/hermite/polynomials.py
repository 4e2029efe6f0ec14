"""One-dimensional Hermite polynomials ``He_k`` and the Hermite coefficients of activations."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

__all__ = ["hermite_e", "relu_hermite_coefficient", "activation_hermite_coefficients"]


def hermite_e(z: np.ndarray, kmax: int) -> np.ndarray:
    """Probabilists' Hermite polynomials ``He_0 .. He_kmax`` at ``z``.

    Parameters
    ----------
    z : np.ndarray
        Points, any shape.
    kmax : int
        Highest order, ``>= 0``.

    Returns
    -------
    np.ndarray
        Shape ``(kmax + 1, *z.shape)``; entry ``k`` is ``He_k(z)``.
    """
    if kmax < 0:
        raise ValueError(f"kmax must be >= 0, got {kmax}")
    z = np.asarray(z, dtype=np.float64)
    out = np.empty((kmax + 1,) + z.shape)
    out[0] = 1.0
    if kmax >= 1:
        out[1] = z
    for k in range(1, kmax):
        out[k + 1] = z * out[k] - k * out[k - 1]
    return out


def relu_hermite_coefficient(l: int) -> float:
    """``c_l = E[relu(z) He_l(z)]`` for ``z ~ N(0, 1)``.

    ``c_0 = 1/sqrt(2 pi)``, ``c_1 = 1/2``, ``c_l = He_{l-2}(0)/sqrt(2 pi)`` for ``l >= 2``.
    """
    if l < 0:
        raise ValueError(f"order must be >= 0, got {l}")
    if l == 1:
        return 0.5
    # He_k(0) is an integer obtained exactly by the recurrence (for moderate k).
    he0 = 1.0 if l == 0 else float(hermite_e(np.zeros(()), l - 2)[l - 2])
    return he0 / math.sqrt(2.0 * math.pi)


def activation_hermite_coefficients(
    f: Callable[[np.ndarray], np.ndarray],
    lmax: int,
    quad_points: int = 200,
    breakpoints: Sequence[float] | None = None,
) -> np.ndarray:
    """``E[f(z) He_l(z)]`` for ``l = 0..lmax``, ``z ~ N(0, 1)``, by quadrature.

    Parameters
    ----------
    f : callable
        Vectorised activation, ``f(z)`` for an array ``z``.
    lmax : int
        Highest order.
    quad_points : int
        Number of nodes (per piece when ``breakpoints`` is given).
    breakpoints : sequence of float, optional
        Points where ``f`` is not smooth (``(0.0,)`` for relu).  Without them the rule is
        Gauss-HermiteE (``hermegauss``, at most 360 nodes), spectrally accurate for smooth
        ``f`` but only O(1/quad_points) across a kink.  With them, Gauss-Legendre on each
        piece of ``[-L, L]``, cut at the breakpoints, ``L`` far into the Gaussian tail.

    Returns
    -------
    np.ndarray
        Shape ``(lmax + 1,)``.
    """
    if breakpoints is None:
        if quad_points > 360:  # hermegauss weights underflow to NaN beyond ~370 nodes
            raise ValueError("Gauss-HermiteE supports at most 360 nodes; pass breakpoints")
        nodes, weights = hermegauss(quad_points)
        # hermegauss integrates against exp(-z^2/2); normalise to the Gaussian density.
        weights = weights / math.sqrt(2.0 * math.pi)
    else:
        bp = np.sort(np.asarray(breakpoints, dtype=np.float64))
        # He_l lives on |z| <~ 2 sqrt(l); beyond L the Gaussian factor is below e^-100.
        edge = np.abs(bp).max(initial=0.0) + 14.0 + 2.0 * math.sqrt(lmax + 1)
        ends = np.concatenate([[-edge], bp, [edge]])
        t, wt = np.polynomial.legendre.leggauss(quad_points)
        half = np.diff(ends)[:, None] / 2
        nodes = ((ends[:-1, None] + ends[1:, None]) / 2 + half * t).ravel()
        weights = (half * wt).ravel() * np.exp(-(nodes**2) / 2) / math.sqrt(2.0 * math.pi)
    w = weights * np.asarray(f(nodes), dtype=np.float64)
    return hermite_e(nodes, lmax) @ w
