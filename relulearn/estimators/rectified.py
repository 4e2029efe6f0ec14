"""Rectified activations ``f(z) = φ(max(z, 0))`` and the small pieces every step of ``exact`` shares.

Bakshi–Jayaram–Woodruff (2019) learn ``A = U f(V x)`` for *rectified* activations: ``f(z) = 0``
for ``z ≤ 0`` and ``f = φ`` on ``z ≥ 0`` with ``φ`` continuous, injective and ``φ(0) = 0``. The
exact step inverts ``φ`` on the samples where a unit is active; this implementation inverts
``φ(z) = z^c`` (``relu``, ``relu2``, ``relu3``), which is positively homogeneous of degree ``c``:
``(u_i, v_i) -> (u_i s^{-c}, s v_i)`` (``s > 0``) leaves the network unchanged.

Gaussian moments of a unit ``f(<v, x>)`` with ``v = |v| ν`` and ``x ~ N(0, I)``::

    E[f(<v,x>) x]          = κ1_c |v|^c ν,      κ1_c = E[z^{c+1} 1{z>0}] = ½ E|z|^{c+1}
    E[f(<v,x>) (x xᵀ − I)] = κ2_c |v|^c ν νᵀ,   κ2_c = E[z^c (z²−1) 1{z>0}] = ½ (E|z|^{c+2} − E|z|^c)

with ``E|z|^p = 2^{p/2} Γ((p+1)/2) / √π`` (ReLU: ``κ1 = ½``, ``κ2 = 1/√(2π)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..network import ACTIVATIONS, RELU_POWERS, Network

__all__ = [
    "Rectified",
    "check_activation",
    "abs_moment",
    "kappas",
    "activate",
    "derivative",
    "output_weights",
    "relative_loss",
    "check_on",
    "EXACT_LOSS",
]

#: relative squared validation error (Σ|A − Â|² / Σ|A|²) below which a fit counts as exact:
#: rounding of a float64 fit gives ~1e-30; any label noise or model error gives far more
EXACT_LOSS = 1e-20

_GRID = np.linspace(-4.0, 4.0, 1601)  # where a callable activation is probed (step 0.005)
_BISECTIONS = 30  # halvings of the grid's largest step (to ~5e-12): a continuous φ's jump vanishes


@dataclass(frozen=True)
class Rectified:
    """A rectified activation the exact step supports: ``f(z) = max(z, 0)^power``."""

    name: str
    power: int

    def __call__(self, z: np.ndarray) -> np.ndarray:
        return activate(z, self.power)


def _probe(f: Callable[[np.ndarray], np.ndarray], z: np.ndarray) -> np.ndarray:
    return np.asarray(f(np.array(z, dtype=np.float64)), dtype=np.float64)


def check_activation(
    activation: str | Callable[[np.ndarray], np.ndarray] | None, *, what: str = "the activation"
) -> Rectified:
    """Refuse, naming why, an activation outside the exact method's setting.

    The setting (Bakshi–Jayaram–Woodruff 2019) is a rectified ``f(z) = φ(max(z, 0))``:
    ``f(z) = 0`` for ``z < 0``, ``φ`` continuous, injective on ``[0, ∞)`` and ``φ(0) = 0``.
    Of these, the exact step inverts ``φ(z) = z^c``: ``relu`` (c = 1), ``relu2``, ``relu3``.

    Parameters
    ----------
    activation
        A name from :data:`relulearn.network.ACTIVATIONS` or a vectorised callable
        (``None`` means ``relu``).
    what
        How to call it in messages (e.g. ``"the teacher's activation"``).

    Returns
    -------
    Rectified
        Name and power ``c`` of a supported activation.

    Raises
    ------
    ValueError
        Naming every violated condition (e.g. ``tanh``: ``f(−1) = −0.76 ≠ 0``), or, for a
        rectified ``φ`` other than a power, that only ``z^c`` is supported.
    """
    if activation is None:
        activation = "relu"
    if isinstance(activation, str):
        if activation in RELU_POWERS:
            return Rectified(activation, RELU_POWERS[activation])
        if activation not in ACTIVATIONS:
            raise ValueError(f"{what} {activation!r} is unknown; the exact method supports relu, relu2, relu3")
        name, f = activation, ACTIVATIONS[activation]
    elif callable(activation):
        name, f = getattr(activation, "__name__", "callable"), activation
    else:
        raise ValueError(f"{what} must be a name or a callable, got {type(activation).__name__}")

    reasons = []
    neg = _GRID[_GRID < 0]
    fn = _probe(f, neg)
    bad = np.flatnonzero(np.abs(fn) > 0)
    if bad.size:
        j = bad[np.argmin(np.abs(neg[bad] + 1.0))]  # report the point nearest −1, the usual example
        reasons.append(f"it is not rectified: f({neg[j]:g}) = {fn[j]:.2g} ≠ 0 (f must vanish for z < 0)")
    phi0 = float(_probe(f, np.array([0.0]))[0])
    if phi0 != 0.0:
        reasons.append(f"φ(0) = f(0) = {phi0:.2g} ≠ 0")
    pos = _GRID[_GRID >= 0]
    fp = _probe(f, pos)
    steps = np.abs(np.diff(fp))
    if steps.size and steps.max() > 0:
        j = int(np.argmax(steps))
        a, b, fa, fb = pos[j], pos[j + 1], fp[j], fp[j + 1]
        for _ in range(_BISECTIONS):  # follow the larger half-jump: a continuous φ's jump shrinks
            mid = 0.5 * (a + b)
            fm = float(_probe(f, np.array([mid]))[0])
            a, b, fa, fb = (a, mid, fa, fm) if abs(fm - fa) >= abs(fb - fm) else (mid, b, fm, fb)
        if abs(fb - fa) > 0.25 * steps[j]:
            reasons.append(f"φ is not continuous: it jumps by {abs(fb - fa):.2g} at z ≈ {a:.3g}")
    d = np.diff(fp)
    turn = np.flatnonzero((d == 0) | (np.sign(d) != np.sign(d[0])))
    if turn.size:  # a flat piece, or (φ continuous) a turn: two points with one value
        j = int(turn[0])
        reasons.append(
            f"φ is not injective on [0, ∞): φ({pos[j]:g}) = φ({pos[j + 1]:g}) = {fp[j]:.3g}"
            if d[j] == 0
            else f"φ is not injective on [0, ∞): it turns at z ≈ {pos[j]:g}"
        )
    if reasons:
        raise ValueError(
            f"{what} {name!r} is outside the exact method's setting (a rectified f(z) = φ(max(z, 0)) with φ "
            f"continuous, injective and φ(0) = 0; Bakshi–Jayaram–Woodruff): " + "; ".join(reasons)
        )
    for c in (1, 2, 3):  # a rectified callable that is a power is supported
        if np.allclose(fp, pos**c, rtol=1e-12, atol=1e-14):
            return Rectified(f"relu{c}" if c > 1 else "relu", c)
    raise ValueError(
        f"{what} {name!r} is rectified, but the exact step inverts only φ(z) = z^c on the active samples: "
        "use relu (c = 1), relu2 (c = 2) or relu3 (c = 3)"
    )


def abs_moment(p: float) -> float:
    """``E|z|^p`` for ``z ~ N(0, 1)``: ``2^{p/2} Γ((p+1)/2) / √π``."""
    return 2.0 ** (p / 2) * math.gamma((p + 1) / 2) / math.sqrt(math.pi)


def kappas(power: int) -> tuple[float, float]:
    """``(κ1_c, κ2_c)``: the first- and second-moment constants of ``max(z, 0)^c`` (module docstring)."""
    c = int(power)
    return 0.5 * abs_moment(c + 1), 0.5 * (abs_moment(c + 2) - abs_moment(c))


def activate(z: np.ndarray, power: int) -> np.ndarray:
    """``max(z, 0)^power`` (a new array)."""
    h = np.maximum(z, 0.0)
    return h if power == 1 else h**power


def derivative(z: np.ndarray, power: int) -> np.ndarray:
    """``f'(z) = c max(z, 0)^{c−1}`` (0 at and below 0)."""
    if power == 1:
        return (z > 0).astype(np.float64)
    return power * np.maximum(z, 0.0) ** (power - 1)


def output_weights(x: np.ndarray, y: np.ndarray, v: np.ndarray, power: int) -> np.ndarray:
    """Least-squares ``U`` (m×k) in ``y ≈ f(x Vᵀ) Uᵀ`` for fixed hidden weights ``V`` (k×d)."""
    f = activate(x @ v.T, power)
    sol, *_ = np.linalg.lstsq(f, y.reshape(len(y), -1), rcond=None)
    return sol.T


def relative_loss(net: Network, x: np.ndarray, y: np.ndarray) -> float:
    """``Σ|y − net(x)|² / Σ|y|²`` (0 for all-zero labels predicted exactly)."""
    y = y.reshape(len(y), -1)
    r = float(np.sum((y - net.forward(x)) ** 2))
    s = float(np.sum(y**2))
    return r / s if s > 0 else r


def check_on(net: Network, x: np.ndarray, y: np.ndarray) -> dict:
    """The ``check`` report on fresh samples: relative squared error per output and in total,
    and whether it is exact (≤ :data:`EXACT_LOSS`)."""
    y = y.reshape(len(y), -1)
    res = np.sum((y - net.forward(x)) ** 2, axis=0)
    scale = np.sum(y**2, axis=0)
    per = np.where(scale > 0, res / np.where(scale > 0, scale, 1.0), res)
    total = float(res.sum() / scale.sum()) if scale.sum() > 0 else float(res.sum())
    return {
        "samples": int(len(x)),
        "relative_error_per_output": [float(v) for v in per],
        "relative_error": total,
        "exact": bool(total <= EXACT_LOSS),
        "threshold": EXACT_LOSS,
    }
