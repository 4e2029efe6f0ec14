"""The ``projected_hermite`` family: the Hermite tensors of the coordinates on a given subspace, on residual
labels.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from ...config import ProjectedHermiteConfig
from .base import Statistic
from .build import FamilyContext
from .expansion import expansion_setup
from .hermite import HermiteTensors, n_unique, packed_entries
from .work import Work, option

__all__ = ["ProjectedHermite", "projected_setup"]


def projected_setup(cfg: ProjectedHermiteConfig, d: int) -> tuple[np.ndarray, tuple | None]:
    """The basis ``P`` (r, d) and the expansion ``(t0, t1, t2)`` of a ``projected_hermite``
    section, checked (``None``: raw labels).

    Raises
    ------
    ValueError
        Naming the key at fault: a basis of the wrong width or not orthonormal, an expansion
        term of the wrong shape or not symmetric.
    """
    where = "statistics.projected_hermite"
    basis = np.asarray(cfg.basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[1] != d:
        raise ValueError(f"{where}.basis has shape {basis.shape}; each row needs d={d} entries")
    r = basis.shape[0]
    if r > d or not np.allclose(basis @ basis.T, np.eye(r), atol=1e-8):
        raise ValueError(f"{where}.basis rows must be orthonormal (P Pᵀ = I), at most d={d} of them")
    return basis, expansion_setup(cfg.expansion, d, where)


class ProjectedHermite(HermiteTensors):
    """Hermite tensors on a subspace, on residual labels (docs/design.md §3, "Residual labels").

    For orthonormal rows ``P`` (r × d), ``z = P x`` is standard normal in ``R^r`` and
    ``He_l(z) = P^{⊗l} He_l(x)``, so ``E[ỹ He_l(z)] = T_l(Pᵀ·, …, Pᵀ·)``: the moment tensors
    restricted to the subspace, packed over r coordinates (C(r+l−1, l) entries, not
    C(d+l−1, l)): the :class:`HermiteTensors` of ``(z, ỹ)``. The labels are
    ``ỹ = y − (t0 + <t1, x> + ½<t2, xxᵀ − I>)``; He_l is orthogonal to every polynomial of
    degree < l, so orders l ≥ 3 are those of ``y`` while their variance falls with ``E[ỹ²]``.
    Orders 0..2 are moments of ``ỹ`` (zero in expectation when the expansion is the true one).
    Per sample: one d × r product, one d × d product for the expansion (BLAS-3 over the
    batch), and the raw sums of ``z``.
    """

    name = "projected_hermite"

    def __init__(self, d: int, basis: np.ndarray, max_order: int, expansion: tuple | None = None):
        self.basis, self.max_order, self.expansion = np.asarray(basis, dtype=np.float64), max_order, expansion
        self.input_dim, self.d = d, self.basis.shape[0]  # the tensors live on the r subspace coordinates
        self.sizes = [n_unique(self.d, m) for m in range(max_order + 1)]

    @classmethod
    def from_config(cls, section: Any, ctx: FamilyContext) -> Statistic:
        """The ``projected_hermite`` section's tensors (its basis and expansion checked).

        ``section`` is a :class:`~relulearn.config.ProjectedHermiteConfig` (typed ``Any``: the parent class
        builds from a ``HermiteConfig``)."""
        cfg = cast(ProjectedHermiteConfig, section)
        d = ctx.d
        basis, expansion = projected_setup(cfg, d)
        return ctx.per_output(lambda j: ProjectedHermite(d, basis, cfg.max_order, expansion))

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """The projection ``X Pᵀ``, then the raw moments in the s subspace coordinates, per output."""
        from ... import hermite

        s = len(option(section, "basis") or [[0]])
        order = int(option(section, "max_order") or 4)
        return (Work(((2.0 * d * s, s), (float(hermite.raw_moment_flops(s, order)), s)))).scaled(outputs)

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        n = packed_entries(len(option(section, "basis")), int(option(section, "max_order") or 4))
        return n * outputs, n * outputs

    def coords(self):
        return {"basis": (("rank", "i"), self.basis), **super().coords()}

    def update(self, acc, x, y):
        self._accumulate(acc, x @ self.basis.T, self.labels(x, y))

    def config(self):
        return {"max_order": self.max_order, "rank": self.d, "residual_labels": self.expansion is not None}
