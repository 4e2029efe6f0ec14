"""Biased one-hidden-layer networks ``Σ λ_i relu(<u_i, x> + b_i) + c`` in the moments method.

A biased unit is a bias-free unit of the lifted input ``x̃ = [x, 1]``: ``relu(<u, x> + b) = relu(<[u, b], x̃>)``.
The spectral stage still finds ``span(u_i)`` (the ``M_2`` weight of a unit is ``λ_i φ(b_i)/‖u_i‖``, never 0), so the
enumeration runs on the projected inputs lifted by a constant coordinate, ``z̃ = [Vᵀx, 1]``: its net of the
sphere of ``z̃``'s space is a search over directions *and* offsets. The output bias ``c`` and any affine part
the search holds come as mirrored pairs, ``λ relu(s) − λ relu(−s) = λ s``, so the search may hold
:data:`EXTRA_UNITS` more units than wanted; :func:`to_biased` folds those pairs into an affine term and mirrors
units (``λ relu(s) = λ relu(−s) + λ s``) until the affine term is a constant, the output bias.
"""

from __future__ import annotations

import numpy as np

from ...network import Network

__all__ = ["EXTRA_UNITS", "lift", "to_biased"]

#: units the enumeration may hold beyond the wanted width: one mirrored pair, which holds an affine term
EXTRA_UNITS = 2

#: a pair of units closer than this (radians) to being mirror images is an affine term plus one unit
MIRROR_ANGLE = 0.1

#: a unit ``relu(<w, z> + β)`` with ``|β| / ‖w‖`` above this (``z ~ N(0, I)``: it changes sides on fewer than
#: 0.1 % of inputs) is affine (``β > 0``: ``<w, z> + β``) or zero (``β < 0``) for the search and for polish
AFFINE_OFFSET = 3.09

#: flips of at most this many units are searched exhaustively (2^m sign patterns)
MAX_FLIP_UNITS = 14


def lift(z: np.ndarray) -> np.ndarray:
    """``[z, 1]``: projected inputs with the constant coordinate that carries the biases."""
    return np.column_stack([z, np.ones(len(z))])


def _angle(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.arccos(np.clip(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)), -1.0, 1.0)))


def to_biased(directions: np.ndarray, weights: np.ndarray, basis: np.ndarray, width: int) -> Network:
    """The biased network of an enumeration answer on lifted inputs (see the module's docstring).

    Parameters
    ----------
    directions, weights
        The answer's unit directions ``a_i = [w_i, β_i]`` (``(m, r + 1)``) and output weights ``λ_i``.
    basis
        ``d × r`` orthonormal basis of the subspace the enumeration ran on.
    width
        Units wanted: a surplus beyond it after folding mirrored pairs drops the units of least weight.

    Returns
    -------
    Network
        ``Network((U, λ), (b, [c]))`` with ``U = W Vᵀ``: a start for polish, exact up to what folding left out.
    """
    a = [np.asarray(v, dtype=np.float64) for v in directions]
    lam = [float(v) for v in weights]
    r = basis.shape[1]
    affine = np.zeros(r + 1)  # f = Σ λ_i relu(a_i·z̃) + affine·z̃
    # units (nearly) always on are affine, always off are zero: a search on lifted inputs holds the output
    # bias and linear terms in them
    for i in reversed(range(len(a))):
        if abs(a[i][r]) >= AFFINE_OFFSET * np.linalg.norm(a[i][:r]):
            if a[i][r] > 0:
                affine += lam[i] * a[i]
            del a[i], lam[i]
    # mirrored pairs: λ_i relu(s) + λ_j relu(−s) = (λ_i + λ_j) relu(s) − λ_j s
    while True:
        pairs = [(_angle(a[i], -a[j]), i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
        pairs = [p for p in pairs if p[0] < MIRROR_ANGLE]
        if not pairs:
            break
        _, i, j = min(pairs)
        unit = a[i] / np.linalg.norm(a[i])
        s_j = np.linalg.norm(a[j])  # relu is positively homogeneous: λ_j relu(a_j·z̃) ≈ λ_j s_j relu(−unit·z̃)
        s_i = np.linalg.norm(a[i])
        affine -= lam[j] * s_j * unit
        merged = lam[i] * s_i + lam[j] * s_j
        del a[j], lam[j]
        a[i], lam[i] = unit, merged
    # surplus: drop the units of least weight (polish cannot remove a unit; a missing one it cannot add either)
    norms = [float(np.linalg.norm(v)) for v in a]  # unit rows, the scale moved into λ
    a, lam = [v / s for v, s in zip(a, norms)], [w * s for w, s in zip(lam, norms)]
    keep = sorted(range(len(a)), key=lambda t: -abs(lam[t]))[:width]
    keep = [t for t in sorted(keep) if lam[t] != 0.0]
    a_k = np.array([a[t] for t in keep]).reshape(-1, r + 1)
    lam_k = np.array([lam[t] for t in keep])
    # mirror units so that the affine term has no direction part: flipping unit i adds λ_i a_i
    m = len(lam_k)
    if m and np.linalg.norm(affine[:r]) > 0 and m <= MAX_FLIP_UNITS:
        signs = 1.0 - 2.0 * ((np.arange(2**m)[:, None] >> np.arange(m)[None, :]) & 1)  # row 0: no flip
        flipped = (signs < 0) * lam_k
        miss = np.linalg.norm(affine[None, :r] + flipped @ a_k[:, :r], axis=1)
        best = signs[int(np.argmin(miss))]
        affine = affine + ((best < 0) * lam_k) @ a_k
        a_k = best[:, None] * a_k
    u = a_k[:, :r] @ basis.T
    return Network((u, lam_k[None, :]), (a_k[:, r].copy(), np.array([affine[r]])), activation="relu")
