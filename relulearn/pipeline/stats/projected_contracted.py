"""The ``projected_contracted`` family: the ``contracted`` family's matrices inside a given subspace, k × k
instead of d × d."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np

from ...config.families import ProjectedContractedConfig
from ..sources import Stream, generator
from .base import Statistic, Var
from .build import FamilyContext
from .contracted import ContractedMoments
from .work import Work, option

__all__ = ["ProjectedContracted"]

_WHERE = "statistics.projected_contracted"


class ProjectedContracted(ContractedMoments):
    """``M_l^g``, its vector and scalar of the subspace coordinates ``z = B x`` for orders × directions g of
    the subspace: the :class:`ContractedMoments` of ``(z, y)``.

    For orthonormal rows ``B`` (k × d), ``z`` is standard normal in ``R^k`` and the matrices are those of the
    full family along the lifted direction ``Bᵀg``, restricted to the subspace:
    ``M_proj(g) = B M_full(Bᵀg) Bᵀ``, ``v_proj(g) = B v_full(Bᵀg)``, ``s_proj(g) = s_full(Bᵀg)``. Per sample:
    one d × k product for ``z``, then the contracted family's work at dimension k. No control variate.
    """

    name = "projected_contracted"
    descriptions = {
        "M": (
            "contracted Hermite moment in the subspace",
            "M_l^g = T_l(g, …, g, ·, ·) of the labels as a function of z = B x, per (order, direction) pair: "
            "B M_l^{Bᵀg} Bᵀ, the full family's matrix along the lifted direction, restricted to the subspace",
        ),
        "v": ("contracted Hermite vector in the subspace", "T_l(g, …, g, ·) of z = B x: contracted l − 1 times"),
        "s": ("contracted Hermite scalar in the subspace", "T_l(g, …, g) of z = B x: contracted l times"),
        "direction": ("direction bank", "the unit directions g of the subspace the tensors are contracted with"),
        "pair_order": ContractedMoments.descriptions["pair_order"],
        "pair_direction": ContractedMoments.descriptions["pair_direction"],
        "basis": ("subspace basis", "orthonormal rows B: the matrices are those of z = B x"),
    }

    def __init__(self, basis: np.ndarray, directions: np.ndarray, orders: Iterable[int]):
        super().__init__(directions, orders)
        self.basis = np.asarray(basis, dtype=np.float64)

    @classmethod
    def from_config(cls, section: Any, ctx: FamilyContext) -> Statistic:
        """The section's statistic: its basis checked, its direction bank in the subspace drawn (or read from the
        store).

        ``section`` is a :class:`~relulearn.config.families.ProjectedContractedConfig` (typed ``Any``: the
        parent class builds from a ``ContractedConfig``)."""
        cfg = cast(ProjectedContractedConfig, section)
        basis = _basis(cfg, ctx.d)
        g = ctx.stored(cls.name)["direction"] if ctx.stored else _direction_bank(cfg, len(basis), ctx.cfg.seed)
        return ctx.per_output(lambda j: ProjectedContracted(basis, g, cfg.orders))

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """The projection ``z = x Bᵀ`` (2 d k flops per sample and output), then the contracted family at k."""
        k = len(option(section, "basis") or [[0]])
        return Work(((2.0 * d * k, k),)).scaled(outputs) + super().work(section, k, outputs)

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        return super().entries(section, len(option(section, "basis") or [[0]]), outputs)

    @classmethod
    def runs_pilot(cls, section: Any) -> bool:
        """Never: no control variate, so no pilot pass."""
        return False

    def sums_schema(self):
        # the subspace's axes are rank and rank2 (i is the input's, which the basis spans)
        p, k = self.n_pairs, self.d
        return {
            "M": Var(("pair", "rank", "rank2"), (p, k, k)),
            "v": Var(("pair", "rank"), (p, k)),
            "s": Var(("pair",), (p,)),
        }

    def coords(self):
        return {
            **super().coords(),
            "direction": (("direction", "rank"), self.directions),
            "basis": (("rank", "i"), self.basis),
        }

    def update(self, acc, x, y):
        super().update(acc, x @ self.basis.T, y)  # one GEMM projects the batch; the rest is the contracted family's

    def config(self):
        return {**super().config(), "basis": self.basis.tolist()}


def _basis(section: ProjectedContractedConfig, d: int) -> np.ndarray:
    """The orthonormal rows B (k, d) of a section, checked."""
    basis = np.asarray(section.basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[1] != d:
        raise ValueError(f"{_WHERE}.basis has shape {basis.shape}; each row needs d={d} entries")
    k = basis.shape[0]
    if k > d or not np.allclose(basis @ basis.T, np.eye(k), atol=1e-8):
        raise ValueError(f"{_WHERE}.basis rows must be orthonormal (B Bᵀ = I), at most d={d} of them")
    return basis


def _direction_bank(section: ProjectedContractedConfig, k: int, run_seed: int) -> np.ndarray:
    """The unit directions g of the subspace, shape (G, k): drawn from the directions' stream, or given."""
    if isinstance(section.directions, int):
        seed = run_seed if section.directions_seed is None else section.directions_seed
        g = generator(seed, Stream.DIRECTIONS).standard_normal((section.directions, k))
    else:
        g = np.asarray(section.directions, dtype=np.float64)
        if g.ndim != 2 or g.shape[1] != k:
            raise ValueError(
                f"{_WHERE}.directions has shape {g.shape}; each direction needs k={k} entries (one per basis row)"
            )
    norms = np.linalg.norm(g, axis=1)
    if np.any(norms == 0) or not np.all(np.isfinite(norms)):
        raise ValueError(f"{_WHERE}.directions has a zero or non-finite row")
    return g / norms[:, None]
