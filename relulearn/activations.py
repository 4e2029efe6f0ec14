"""The activations of Daniely–Srebro–Vardi's random networks as the paper normalises them,
``σ(z) = f(s z) / ‖f(s·)‖``: what a planted ``random_xavier`` teacher folds into its weights
(:mod:`relulearn.pipeline.sources`) and what its shadow network expands (:mod:`relulearn.shadow`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from .network import ACTIVATIONS

__all__ = ["SUPPORTED_ACTIVATIONS", "PaperActivation", "ShadowError", "paper_activation"]

#: activations a shadow network is defined for, with the input scale s of the paper's σ(z) = f(s z)/‖f(s·)‖
_INPUT_SCALE = {"relu": 1.0, "erf": 1.0 / math.sqrt(2.0), "erf_relu": 1.0, "tanh": 1.0}
#: ‖f(s·)‖ = sqrt(E f(s z)²): closed forms for relu (1/2) and erf (E erf(z/√2)² = (2/π) arcsin(1/2) = 1/3);
#: erf_relu and tanh by mpmath's adaptive quadrature at 40 digits (Gauss–Legendre agrees to 5e-14). Constants,
#: not quadrature at run time, so a planted teacher's bytes never depend on the quadrature rule.
_NORM = {
    "relu": math.sqrt(0.5),
    "erf": math.sqrt(1.0 / 3.0),
    "erf_relu": 1.1798193476778229244,
    "tanh": 0.62792873034910671653,
}
#: Lipschitz constants of the unscaled activations f (sup |f'|)
_F_LIPSCHITZ = {"relu": 1.0, "erf": 2.0 / math.sqrt(math.pi), "erf_relu": 2.0, "tanh": 1.0}
SUPPORTED_ACTIVATIONS = tuple(_INPUT_SCALE)


class ShadowError(ValueError):
    """A network or a degree the shadow construction does not apply to; the message says why and what to do."""


@dataclass(frozen=True)
class PaperActivation:
    """The paper's normalised activation ``σ(z) = f(s z) / norm`` for a file activation ``f``.

    Attributes
    ----------
    name
        The file's activation name ``f`` (a key of :data:`relulearn.network.ACTIVATIONS`).
    scale
        ``s``: the paper's pre-activation ``z`` is the file's pre-activation divided by ``s``.
    norm
        ``‖f(s·)‖ = sqrt(E f(s z)²)``, ``z ~ N(0, 1)``.
    lipschitz
        Lipschitz constant of ``σ``: ``s · sup|f'| / norm``.
    """

    name: str
    scale: float
    norm: float
    lipschitz: float

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """``σ(z)``."""
        return ACTIVATIONS[self.name](self.scale * np.asarray(z, dtype=np.float64)) / self.norm


def _check_activation(activation: str) -> None:
    if activation not in _INPUT_SCALE:
        raise ShadowError(
            f"the shadow network is defined here for the activations {', '.join(SUPPORTED_ACTIVATIONS)}, not "
            f"{activation!r}; use a network with one of them (e.g. a random_xavier teacher)"
        )


@cache
def paper_activation(activation: str) -> PaperActivation:
    """The paper's normalised activation for a file activation name (relu, erf, erf_relu, tanh).

    Raises
    ------
    ShadowError
        For another activation.
    """
    _check_activation(activation)
    s, norm = _INPUT_SCALE[activation], _NORM[activation]
    return PaperActivation(activation, s, norm, s * _F_LIPSCHITZ[activation] / norm)
