"""The ``projected_contracted`` family: the ``contracted`` family's matrices inside a given subspace, k × k
instead of d × d."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np

from ...config.families import ProjectedContractedConfig
from ...hermite import contracted_sums_of_labels
from .base import Statistic, Var
from .build import FamilyContext
from .contracted import ContractedMoments, direction_bank
from .expansion import low_rank_expansion, output_expansion
from .work import F, Work, count, option

__all__ = ["ProjectedContracted"]

_WHERE = "statistics.projected_contracted"


class ProjectedContracted(ContractedMoments):
    """``M_l^g``, its vector and scalar of the subspace coordinates ``z = B x`` for orders × directions g of
    the subspace: the :class:`ContractedMoments` of ``(z, y)``.

    For orthonormal rows ``B`` (k × d), ``z`` is standard normal in ``R^k`` and the matrices are those of the
    full family along the lifted direction ``Bᵀg``, restricted to the subspace:
    ``M_proj(g) = B M_full(Bᵀg) Bᵀ``, ``v_proj(g) = B v_full(Bᵀg)``, ``s_proj(g) = s_full(Bᵀg)``. No control
    variate; an ``expansion`` of degree ≤ 2 in the full x is subtracted from the labels first (residual
    labels, as the ``contracted`` family's). For a label vector the batch is projected once for all outputs,
    and each kind of sum of all outputs is one GEMM (:meth:`update_outputs`).
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

    def __init__(
        self,
        basis: np.ndarray,
        directions: np.ndarray,
        orders: Iterable[int],
        expansion: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None,
    ):
        super().__init__(directions, orders, expansion=expansion)
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
        return ctx.per_output(
            lambda j: ProjectedContracted(basis, g, cfg.orders, _expansion(cfg, ctx.d, ctx.outputs, j))
        )

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """Per sample, for all ``m`` outputs together: the residual labels (``x [t1 | V]``: 2 d (m + s) flops for
        ``s`` expansion vectors), the projection ``z = x Bᵀ`` (2 d k) and ``z·g`` (2 k G), once; the Grams of
        every output and pair as one GEMM of their weights with the products ``z_a z_b`` (a ≤ b, fresh:
        ``m P k(k+1)`` flops), and the vectors' (4 m P k). Fresh temporaries: the products and the weights."""
        k = len(option(section, "basis") or [[0]])
        g = count(option(section, "directions") or 8)
        mp = outputs * len(option(section, "orders") or [2, 4]) * g
        tri = k * (k + 1) // 2
        gemm = [(2.0 * d * k, k), (2.0 * k * g, g), (2.0 * mp * tri, tri), (4.0 * mp * k, 2 * mp)]
        s = _expansion_vectors(option(section, "expansion"), d)
        if s is not None:
            gemm.insert(0, (2.0 * d * (outputs + s), outputs + s))
        return Work(tuple(gemm), stream=F * d, fresh=F * (tri + 3 * mp))

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
        self.update_outputs([self], {k: a[None] for k, a in acc.items()}, x, np.asarray(y)[:, None])

    @staticmethod
    def update_outputs(inner: list[ProjectedContracted], acc, x, y):
        """Add the sums of every output (``y``: (n, m), ``acc``: arrays with a leading output axis; ``inner``:
        the outputs' statistics, sharing basis, directions and orders): the residual labels of all outputs
        from the full x, then the batch projected once and the contracted sums of all outputs together."""
        first = inner[0]
        r = _residual_labels(x, y, [s.expansion for s in inner])
        mats, vecs, scalars = contracted_sums_of_labels(x @ first.basis.T, r, first.directions, first.orders)
        acc["M"] += mats
        acc["v"] += vecs
        acc["s"] += scalars

    def config(self):
        return {**super().config(), "basis": self.basis.tolist()}


def _expansion(section: ProjectedContractedConfig, d: int, m: int | None, j: int | None) -> tuple | None:
    """Output ``j``'s expansion ``(t0, t1, V, θ)`` in the full x (None: none given)."""
    exp, where = output_expansion(section, m, j, _WHERE)
    return None if exp is None else low_rank_expansion(exp, d, where)


def _expansion_vectors(expansion: Any, d: int) -> int | None:
    """The expansions' low-rank vectors over all outputs (a dense ``t2``: d of them; None: no expansion)."""
    if expansion is None:
        return None
    parts = expansion if isinstance(expansion, list) else [expansion]
    vectors = [option(e, "t2_vectors") for e in parts]
    dense = [option(e, "t2") is not None for e in parts]
    return sum(len(v) if v is not None else (d if t2 else 0) for v, t2 in zip(vectors, dense))


def _residual_labels(x: np.ndarray, y: np.ndarray, expansions: list[tuple | None]) -> np.ndarray:
    """``y_j − (t0_j + <t1_j, x> + ½ Σ_s θ_js ((x·v_js)² − 1))`` of every output j with an expansion (the
    others as they are), shape (n, m): one GEMM of the batch with every output's ``t1`` and vectors."""
    if all(e is None for e in expansions):
        return np.asarray(y, dtype=np.float64)
    d, m = x.shape[1], len(expansions)
    none = (0.0, np.zeros(d), np.zeros((d, 0)), np.zeros(0))
    parts = [none if e is None else e for e in expansions]
    t0 = np.array([p[0] for p in parts])
    sizes = [len(p[3]) for p in parts]
    cols = x @ np.hstack([np.column_stack([p[1] for p in parts]), *(p[2] for p in parts)])
    theta = np.concatenate([p[3] for p in parts])
    quad = (cols[:, m:] * cols[:, m:] - 1.0) * theta
    # each output's quadratic term: the sum over its own vectors' columns
    ends = np.cumsum(sizes)
    second = np.column_stack([quad[:, e - s : e].sum(axis=1) for s, e in zip(sizes, ends)])
    return y - (t0 + cols[:, :m] + 0.5 * second)


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
    return direction_bank(section, k, run_seed, _WHERE, "k={d} entries (one per basis row)")
