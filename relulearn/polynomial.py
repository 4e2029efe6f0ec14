"""Polynomial models: a Hermite expansion truncated at degree L, and its file format (docs/design.md §5).

``f(x) = Σ_{l ≤ L} <T_l, He_l(z)> / l!`` with packed symmetric ``T_l`` (``T_l = E[y He_l(z)]`` for
the model read off a store's moments) and ``z = x`` or, for a model fitted on a subspace,
``z = P x`` with orthonormal rows ``P`` (r × d). A model file is an ``.npz`` without pickled
objects: ``kind = "polynomial"``, ``degree``, ``input_dim``, ``T0 .. TL`` and, when fitted on a
subspace, ``basis``. :func:`load_model` reads either kind of model file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import hermite
from .atomic import save_npz
from .network import Network, NetworkFileError, read_arrays

__all__ = ["PolynomialModel", "load_model", "Model"]


@dataclass(frozen=True)
class PolynomialModel:
    """A Hermite expansion ``Σ_{l ≤ L} <T_l, He_l(z)> / l!``, ``z = P x`` (or ``x``).

    Parameters
    ----------
    tensors
        Packed ``T_0 .. T_L`` over the ``r`` coordinates of ``z``.
    input_dim
        ``d``, the width of the inputs ``x``.
    basis
        Orthonormal rows ``P`` (r × d), or ``None`` (``z = x``, r = d).
    """

    tensors: tuple[np.ndarray, ...]
    input_dim: int
    basis: np.ndarray | None = None
    _origin: str = field(default="polynomial model", compare=False, repr=False)

    def __post_init__(self) -> None:
        where = self._origin
        if not self.tensors:
            raise NetworkFileError(f"{where}: a polynomial model needs at least T0")
        if self.basis is not None:
            basis = np.asarray(self.basis, dtype=np.float64)
            if basis.ndim != 2 or basis.shape[1] != self.input_dim:
                raise NetworkFileError(f"{where}: basis has shape {basis.shape}; it needs {self.input_dim} columns")
            if not np.allclose(basis @ basis.T, np.eye(basis.shape[0]), atol=1e-8):
                raise NetworkFileError(f"{where}: the rows of basis must be orthonormal")
            object.__setattr__(self, "basis", basis)
        r = self.dim
        ts = tuple(np.asarray(t, dtype=np.float64).reshape(-1) for t in self.tensors)
        for l, t in enumerate(ts):
            if t.shape != (math.comb(r + l - 1, l),):
                raise NetworkFileError(
                    f"{where}: T{l} has {t.size} entries; packed order {l} over {r} "
                    f"coordinates has {math.comb(r + l - 1, l)}"
                )
            if not np.all(np.isfinite(t)):
                raise NetworkFileError(f"{where}: T{l} contains NaN or inf")
        object.__setattr__(self, "tensors", ts)

    @property
    def degree(self) -> int:
        return len(self.tensors) - 1

    @property
    def dim(self) -> int:
        """``r``: the number of coordinates the expansion is taken in."""
        return self.input_dim if self.basis is None else int(self.basis.shape[0])

    @property
    def output_dim(self) -> int:
        return 1

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise ValueError(f"inputs have shape {x.shape}; the model takes rows of d = {self.input_dim} entries")
        return x if self.basis is None else x @ self.basis.T

    def terms(self, x: np.ndarray) -> np.ndarray:
        """Each degree's term ``<T_l, He_l(z)> / l!`` at the rows of ``x``: shape ``(n, L+1)``."""
        coef = hermite.expansion_coefficients(self.tensors, self.dim)
        return hermite.expansion_terms(self._inputs(x), coef)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Predictions for a batch ``x`` (n, d); returns ``(n, 1)`` like :meth:`Network.forward`."""
        return self.terms(x).sum(axis=1, keepdims=True)

    def truncate(self, degree: int) -> PolynomialModel:
        """The same expansion cut at ``degree`` (≤ this model's degree)."""
        if not 0 <= degree <= self.degree:
            raise ValueError(f"degree {degree} is outside 0..{self.degree}")
        return PolynomialModel(self.tensors[: degree + 1], self.input_dim, self.basis)

    # ---------------------------------------------------------------- files
    def to_arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {
            "kind": np.array("polynomial"),
            "degree": np.array(self.degree),
            "input_dim": np.array(self.input_dim),
        }
        out.update({f"T{l}": t for l, t in enumerate(self.tensors)})
        if self.basis is not None:
            out["basis"] = self.basis
        return out

    def save(self, path: str | Path) -> None:
        """Write the model as an ``.npz`` file (no pickled objects) at a path or a URL, atomically."""
        save_npz(path, self.to_arrays())

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], origin: str = "polynomial model") -> PolynomialModel:
        missing = [k for k in ("degree", "input_dim") if k not in arrays]
        if missing:
            raise NetworkFileError(f"{origin}: a polynomial model file needs {missing} (and T0..TL)")
        degree = int(arrays["degree"])
        absent = [f"T{l}" for l in range(degree + 1) if f"T{l}" not in arrays]
        if absent:
            raise NetworkFileError(f"{origin}: degree is {degree} but {absent} are missing")
        known = {"kind", "degree", "input_dim", "basis"} | {f"T{l}" for l in range(degree + 1)}
        unknown = set(arrays) - known
        if unknown:
            raise NetworkFileError(
                f"{origin}: unexpected arrays {sorted(unknown)}; a polynomial model file holds "
                "kind, degree, input_dim, T0..TL and optionally basis"
            )
        return cls(
            tuple(arrays[f"T{l}"] for l in range(degree + 1)),
            int(arrays["input_dim"]),
            arrays.get("basis"),
            _origin=origin,
        )


Model = Network | PolynomialModel


def load_model(path: str | Path) -> Model:
    """Read a model file of either kind: a network (``W0..WL``) or a polynomial (``kind = "polynomial"``)."""
    arrays = read_arrays(path, "model", "W0..WL, or T0..TL of a polynomial")
    if "kind" in arrays and str(arrays["kind"]) == "polynomial":
        return PolynomialModel.from_arrays(arrays, origin=str(path))
    return Network.from_arrays(arrays, origin=str(path))
