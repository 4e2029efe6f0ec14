"""The ``sketch`` family: sketched second-moment families and subspace passes (docs/design.md §3, §6, §7;
the record a pass keeps of the store it refines is :mod:`relulearn.pipeline.refines`).

At large d a d × d moment matrix per τ or direction does not fit a block partial (800 MB at
d = 10⁴, twice with its error terms). The ``sketch`` statistic keeps, for each chosen matrix
``M = E[w(x, y) (x xᵀ − I) + rank-two terms]``, only ``Y = M Ω`` (d × r):

- Ω a Gaussian test matrix drawn from the run's seed (``Stream.SKETCH``): ``range(Y)``
  captures the dominant eigenvectors of M (randomized range finder), or
- Ω = Bᵀ for an orthonormal basis B given in the configuration (a *subspace pass*): then
  ``Y = M Bᵀ`` and ``B M Bᵀ = B Y`` (r × r) — one step of subspace iteration and the
  Rayleigh–Ritz matrix (:mod:`relulearn.estimators.spectral.subspace`).

Per batch ``Z = X Ω`` is one (n × d × r) product shared by all families, and each family adds
``Xᵀ (W ⊙ Z)``: O(d r) per sample and matrix, BLAS-3, memory independent of n. The estimands are
linear in the sums, so standard errors, merging and resuming follow the :class:`Statistic`
protocol like every other family. Families:

- ``second``: ``M_2 = E[y (xxᵀ − I)]``: ``Y = Xᵀ diag(y) Z − (Σy) Ω``;
- ``contracted``: ``M_l^g`` (docs/design.md §3) for orders × directions, all pairs in one GEMM:
  ``Y_p = Xᵀ diag(a_p) Z − (Σa_p) Ω − g (v_pᵀ Ω) − v_p (gᵀ Ω) + (Σc_p) g (gᵀ Ω)`` with
  ``v_p = Xᵀ b_p`` and per-sample weights ``(a, b, c) = y · contracted_coefficients``;
- ``filtered``: ``M_τ = E[1{|y|>τ}(xxᵀ − I)]``: per-bin ``X_bᵀ Z_b`` and suffix sums over bins;
- ``residual``: ``M[c, τ] = E[1{|y − F̃_c(Bx)| > τ}(x⊥x⊥ᵀ − (I − BᵀB))]``, ``x⊥ = x − BᵀBx``, for candidate
  networks ``F̃_c`` on a found subspace (rows B): the dense ``residual`` family (docs/design.md §3) in sketch
  form, ``Z⊥ = X⊥ Ω = Z − (X Bᵀ)(B Ω)`` and per-bin ``X⊥_bᵀ Z⊥_b``; ``(I − BᵀB) Ω`` replaces Ω in the
  centring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ... import hermite
from ...config import SKETCH_DEFAULT_RANK, RunConfig, SketchConfig, check_sketch_rank
from ...network import Network
from ..batches import Stream, generator
from .base import Statistic, Var
from .build import FamilyContext, Pilot, drawn
from .contracted import direction_bank
from .expansion import low_rank_expansion
from .family import Family
from .filtered import suffix_sums, threshold_grid
from .per_output import of_output
from .residual import candidate_coords, residual_grid, residual_scores, residual_setup
from .work import F, Work, count, grid_size, option

__all__ = [
    "SketchMoments",
    "SketchSetup",
    "sketch_setup",
    "gaussian_test_matrix",
]

#: bytes of the weighted copy ``W ⊙ Z`` of a row batch in the contracted family (rows are cut to fit)
_WZ_BYTES = 32 * 2**20
# Row blocks of the M_2 sketch: about the 1 MiB L2 cache, but at least 512 rows (smaller GEMMs lose more at large d)
_SECOND_BLOCK_BYTES = 2**20
_SECOND_MIN_ROWS = 512


def gaussian_test_matrix(d: int, rank: int, seed: int) -> np.ndarray:
    """The Gaussian test matrix Ω (d × r) of a sketch, i.i.d. N(0, 1) from ``(seed, Stream.SKETCH)``."""
    return generator(seed, Stream.SKETCH).standard_normal((d, rank))


class SketchMoments(Family):
    """``Y = M Ω`` for the chosen second-moment families; ``Ωᵀ M Ω`` too for a subspace pass.

    Parameters
    ----------
    omega
        Ω (d × r): a Gaussian test matrix, or Bᵀ for orthonormal basis rows B (``is_basis``).
    is_basis
        Whether Ω has orthonormal columns given as a basis: then the r × r ``BMB_*`` are stored.
    second
        Whether to sketch ``M_2``.
    expansion
        ``(t0, t1, V, θ)``: a degree-≤2 expansion ``q(x) = t0 + <t1, x> + ½ Σ_j θ_j ((v_jᵀx)² − |v_j|²)``
        (``T_2 = V diag(θ) Vᵀ``, V: d × s) used as a control variate of ``M_2``: the sums are of
        ``y − q(x)`` and ``T_2 Ω`` is added back (``E[q (xxᵀ − I)] = T_2``), so the estimands are
        unchanged and their variance is that of the residual labels. None: raw labels.
    contracted
        ``(directions (G, d), orders)`` of the contracted family, or None.
    filtered
        ``(tau (T,), quantiles or None)`` of the filtered family, or None.
    residual
        ``(B (s, d) orthonormal rows, candidates, tau (C, T), quantiles or None)`` of the residual family
        (candidate networks on ``z = B x``, one τ grid per candidate), or None.

    Estimands (each with ``_se``): ``Y_second`` (i, rank) with ``t0_second = E[y]`` and
    ``t1_second = E[y x]`` (i) (the expansion a later pass subtracts); ``Y_contracted`` (pair, i, rank);
    ``Y_filtered`` (tau, i, rank) and ``prob_filtered`` (tau); ``Y_residual`` (candidate, residual_tau, i, rank)
    and ``prob_residual`` (candidate, residual_tau); with a basis also ``BMB_second`` (rank, rank2),
    ``BMB_contracted`` (pair, rank, rank2), ``BMB_filtered`` (tau, rank, rank2), ``BMB_residual``.
    """

    name = "sketch"
    descriptions = {
        "t0_second": ("mean label of the sketch", "E[y] (less the control expansion's constant, if any)"),
        "t1_second": ("first Hermite coefficient", "E[y x] (less the control expansion's linear part, if any)"),
        "Y_second": ("sketch of T_2", "T_2 Ω = E[y (x xᵀ − I)] Ω: the second Hermite moment times the test matrix"),
        "BMB_second": ("T_2 on the basis", "Ωᵀ T_2 Ω for the orthonormal basis Ω of a subspace pass"),
        "Y_contracted": ("sketch of M_l^g", "M_l^g Ω per (order, direction) pair"),
        "BMB_contracted": ("M_l^g on the basis", "Ωᵀ M_l^g Ω per pair, on the orthonormal basis Ω"),
        "Y_filtered": ("sketch of M_τ", "M_τ Ω per threshold τ"),
        "BMB_filtered": ("M_τ on the basis", "Ωᵀ M_τ Ω per threshold τ"),
        "prob_filtered": ("filter probability", "P[|y| > τ] per threshold τ"),
        "Y_residual": ("sketch of the residual-filtered moments", "M[c, t] Ω per candidate and threshold"),
        "BMB_residual": ("residual-filtered moments on the basis", "Ωᵀ M[c, t] Ω per candidate and threshold"),
        "prob_residual": ("residual filter probability", "P[|y − F̃_c(Bx)| > τ_{c,t}]"),
        "omega": (
            "test matrix Ω",
            "the Gaussian test matrix (d × rank) of the sketch, or the orthonormal basis of a subspace pass",
        ),
        "direction": ("direction bank", "the unit directions g of the contracted family"),
        "pair_order": ("order of each pair", "the Hermite order l of pair p"),
        "pair_direction": ("direction of each pair", "the index into `direction` of pair p"),
        "tau": ("threshold τ", "the thresholds of |y|"),
        "quantile": ("quantile of |y|", "the quantile of |y| each τ was taken at"),
        "residual_basis": ("basis found so far", "orthonormal rows B of the residual family"),
        "residual_tau": ("residual thresholds", "the thresholds of each candidate's |residual|"),
        "residual_quantile": ("quantile of the residual", "the quantile of |residual| each residual τ was taken at"),
    }

    def __init__(
        self,
        omega: np.ndarray,
        *,
        is_basis: bool = False,
        second: bool = False,
        contracted: tuple[np.ndarray, Sequence[int]] | None = None,
        filtered: tuple[np.ndarray, np.ndarray | None] | None = None,
        expansion: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None,
        residual: tuple[np.ndarray, list[Network], np.ndarray, np.ndarray | None] | None = None,
    ):
        self.omega = np.ascontiguousarray(omega, dtype=np.float64)
        self.d, self.rank = self.omega.shape
        self.is_basis, self.second = bool(is_basis), bool(second)
        self.directions: np.ndarray | None = None
        self.orders: list[int] | None = None
        self.tau: np.ndarray | None = None
        self.quantiles: np.ndarray | None = None
        if contracted is not None:
            self.directions = np.asarray(contracted[0], dtype=np.float64)
            self.orders = [int(o) for o in contracted[1]]
        if filtered is not None:
            self.tau = np.asarray(filtered[0], dtype=np.float64)
            self.quantiles = None if filtered[1] is None else np.asarray(filtered[1], dtype=np.float64)
        self.candidates: list[Network] | None = None
        if residual is not None:
            rb, nets, tau, q = residual
            self.res_basis = np.ascontiguousarray(rb, dtype=np.float64)
            self.candidates = list(nets)
            self.res_tau = np.asarray(tau, dtype=np.float64).reshape(len(self.candidates), -1)
            self.res_quantiles = None if q is None else np.asarray(q, dtype=np.float64)
            self.b_omega = self.res_basis @ self.omega  # B Ω (s × r)
        if not (self.second or self.orders or self.tau is not None or self.candidates):
            raise ValueError("a sketch needs at least one family (second, contracted, filtered or residual)")
        self.expansion: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None
        if expansion is not None:
            t0, t1, v, theta = expansion
            self.expansion = (
                float(t0),
                np.asarray(t1, dtype=np.float64),
                np.asarray(v, dtype=np.float64),
                np.asarray(theta, dtype=np.float64),
            )

    @classmethod
    def from_config(cls, section: SketchConfig, ctx: FamilyContext) -> Statistic:
        """The ``sketch`` section's statistic: Ω, its direction bank and τ grids resolved once
        (:func:`sketch_setup`), then one statistic per output."""
        setup = sketch_setup(section, ctx.cfg, ctx.pilot, ctx.outputs, ctx.stored(cls.name) if ctx.stored else None)
        return ctx.per_output(setup.statistic)

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """``X Ω`` once, then per sketched family one skinny product ``Xᵀ [w ⊙ Z]`` (2 d r flops per sample and
        matrix; the contracted pairs in one GEMM of P r columns), per output."""
        r = _columns(section)
        products: list[tuple[float, int]] = [(2.0 * d * r, r)]
        stream = F * 2 * d
        second = option(section, "second")
        if second is not None:
            products.append((2.0 * d * (r + 1), r))
            expansion = option(second, "expansion")
            vectors = option(expansion, "t2_vectors") if expansion is not None else None
            if vectors:
                products.append((2.0 * d * len(vectors), len(vectors)))
        contracted = option(section, "contracted")
        if contracted is not None:
            g = count(option(contracted, "directions") or 8)
            pairs = len(option(contracted, "orders") or [2, 4]) * g
            products += [(2.0 * d * g, g), (2.0 * d * pairs, pairs), (2.0 * d * pairs * r, min(d, pairs * r))]
            stream += F * pairs * r
        if option(section, "filtered") is not None:
            products.append((2.0 * d * r, r))
            stream += F * d
        residual = option(section, "residual")
        if residual is not None:
            c = len(option(residual, "candidates") or [1])
            s = len(option(residual, "basis") or [[0]])
            products += [(2.0 * d * s, s), (2.0 * d * s, d), (2.0 * c * d * r, r)]
            stream += F * 2 * d * (c + 1)
        return Work(tuple(products), stream=stream).scaled(outputs)

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        basis = option(section, "basis")
        r = _columns(section)
        bmb = r * r if basis is not None else 0
        sums = terms = 0
        if option(section, "second") is not None:
            sums += d * r + d + 2
            terms += d * r + d + 1 + bmb
        contracted = option(section, "contracted")
        if contracted is not None:
            p = len(option(contracted, "orders") or [2, 4]) * count(option(contracted, "directions") or 8)
            sums += p * (d * r + d + 2)
            terms += p * (d * r + bmb)
        filtered = option(section, "filtered")
        if filtered is not None:
            t = grid_size(filtered)
            sums += t * (d * r + 1)
            terms += t * (d * r + 1 + bmb)
        residual = option(section, "residual")
        if residual is not None:
            ct = len(option(residual, "candidates") or [0]) * grid_size(residual)
            sums += ct * (d * r + 1)
            terms += ct * (d * r + 1 + bmb)
        return sums * outputs, terms * outputs

    @classmethod
    def form(cls, section: Any) -> str:
        """``second sketch r=32``, ``second+contracted subspace r=8``: the families sketched and the rank."""
        basis = option(section, "basis")
        inner = "+".join(k for k in ("second", "contracted", "filtered", "residual") if option(section, k) is not None)
        if basis is not None:
            return f"{inner} subspace r={len(basis)}"
        return f"{inner} sketch r={option(section, 'rank') or SKETCH_DEFAULT_RANK}"

    @property
    def n_pairs(self) -> int:
        return 0 if self.orders is None else len(self.orders) * len(cast(np.ndarray, self.directions))  # set together

    # ------------------------------------------------------------------ schemas

    def sums_schema(self) -> dict[str, Var]:
        d, r = self.d, self.rank
        out: dict[str, Var] = {}
        if self.second:
            out.update(
                {
                    "second_xz": Var(("i", "rank"), (d, r)),
                    "second_y": Var((), ()),
                    "second_x": Var(("i",), (d,)),
                    "second_n": Var((), ()),
                }
            )
        if self.orders is not None:
            p = self.n_pairs
            out.update(
                {
                    "contracted_xz": Var(("pair", "i", "rank"), (p, d, r)),
                    "contracted_a": Var(("pair",), (p,)),
                    "contracted_bx": Var(("pair", "i"), (p, d)),
                    "contracted_c": Var(("pair",), (p,)),
                }
            )
        if self.tau is not None:
            t = len(self.tau)
            out.update({"filtered_xz": Var(("tau", "i", "rank"), (t, d, r)), "filtered_count": Var(("tau",), (t,))})
        if self.candidates is not None:
            c, t = self.res_tau.shape
            out.update(
                {
                    "residual_xz": Var(("candidate", "residual_tau", "i", "rank"), (c, t, d, r)),
                    "residual_count": Var(("candidate", "residual_tau"), (c, t)),
                }
            )
        return out

    def terms_schema(self) -> dict[str, Var]:
        d, r = self.d, self.rank
        out: dict[str, Var] = {}
        if self.second:
            out.update({"t0_second": Var((), ()), "t1_second": Var(("i",), (d,))})
        for fam, lead, size in self._families():
            out[f"Y_{fam}"] = Var(lead + ("i", "rank"), size + (d, r))
            if self.is_basis:
                out[f"BMB_{fam}"] = Var(lead + ("rank", "rank2"), size + (r, r))
            if fam in ("filtered", "residual"):
                out[f"prob_{fam}"] = Var(lead, size)
        return out

    def _families(self) -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]:
        """(family, leading dims, leading shape) of each sketched family, in a fixed order."""
        out: list[tuple[str, tuple[str, ...], tuple[int, ...]]] = []
        if self.second:
            out.append(("second", (), ()))
        if self.orders is not None:
            out.append(("contracted", ("pair",), (self.n_pairs,)))
        if self.tau is not None:
            out.append(("filtered", ("tau",), (len(self.tau),)))
        if self.candidates is not None:
            out.append(("residual", ("candidate", "residual_tau"), self.res_tau.shape))
        return out

    def coords(self) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        out: dict[str, tuple[tuple[str, ...], np.ndarray]] = {"omega": (("i", "rank"), self.omega)}
        if self.orders is not None:
            assert self.directions is not None  # set with the orders
            g = len(self.directions)
            out.update(
                {
                    "direction": (("direction", "i"), self.directions),
                    "pair_order": (("pair",), np.repeat(np.asarray(self.orders, dtype=np.int64), g)),
                    "pair_direction": (("pair",), np.tile(np.arange(g, dtype=np.int64), len(self.orders))),
                }
            )
        if self.tau is not None:
            out["tau"] = (("tau",), self.tau)
            if self.quantiles is not None:
                out["quantile"] = (("tau",), self.quantiles)
        if self.candidates is not None:
            out["residual_basis"] = (("residual_rank", "i"), self.res_basis)
            out["residual_tau"] = (("candidate", "residual_tau"), self.res_tau)
            if self.res_quantiles is not None:
                out["residual_quantile"] = (("residual_tau",), self.res_quantiles)
            out.update(candidate_coords(self.candidates))  # named as in the dense residual family
        return out

    # ------------------------------------------------------------------- update

    def update(self, acc, x, y):
        z = self._update_second(acc, x, y) if self.second else x @ self.omega  # Z = X Ω, shared by every family
        if self.orders is not None:
            self._update_contracted(acc, x, z, y)
        if self.tau is not None:
            _binned_cross(acc["filtered_xz"], acc["filtered_count"], x, z, np.abs(y), self.tau)
        if self.candidates is not None:
            h = x @ self.res_basis.T  # coordinates on the found subspace, the candidates' inputs
            xp, zp = x - h @ self.res_basis, z - h @ self.b_omega  # x⊥ and x⊥ Ω
            for c, score in enumerate(residual_scores(y, h, self.candidates)):
                _binned_cross(acc["residual_xz"][c], acc["residual_count"][c], xp, zp, score, self.res_tau[c])

    def _update_second(self, acc, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Add the sums of ``M_2 Ω`` and return ``Z = X Ω``.

        Row blocks that stay in cache between their two skinny products ``Z_b = X_b Ω`` and
        ``[w ⊙ Z_b | w_b]ᵀ X_b`` (one GEMM that also gives ``Σ w x``, so E[y x] costs no further read):
        20% faster than whole batches at d = 512, r = 32 (``benchmarks/sketch.py``).
        """
        w = y if self.expansion is None else self._residual(x, y)
        n, r = x.shape[0], self.rank
        step = min(n, max(_SECOND_MIN_ROWS, _SECOND_BLOCK_BYTES // (8 * self.d)))
        z, wz = np.empty((n, r)), np.empty((step, r + 1))
        for start in range(0, n, step):
            xs, ws = x[start : start + step], w[start : start + step]
            m = len(xs)
            zs = np.matmul(xs, self.omega, out=z[start : start + m])
            np.multiply(ws[:, None], zs, out=wz[:m, :-1])
            wz[:m, -1] = ws
            wzx = wz[:m].T @ xs  # this orientation of the skinny product is ~10% faster than Xᵀ [w ⊙ Z | w]
            acc["second_xz"] += wzx[:-1].T
            acc["second_x"] += wzx[-1]
        acc["second_y"] += w.sum()
        acc["second_n"] += n
        return z

    def _residual(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``y − q(x)`` for the expansion q: one n × d × s product for its low-rank T_2."""
        assert self.expansion is not None  # called with an expansion only
        t0, t1, v, theta = self.expansion
        h = x @ v
        quad = (h * h - (v * v).sum(axis=0)) @ theta
        return y - (t0 + x @ t1 + 0.5 * quad)

    def _update_contracted(self, acc, x, z, y):
        n, r = z.shape
        p = self.n_pairs
        h = x @ self.directions.T  # z_g = <g, x> for every direction
        coef = [hermite.contracted_coefficients(h, l) for l in self.orders]
        # per-sample weights (n, P), pairs order-major as in the dense family
        wa, wb, wc = (np.concatenate([c[i] for c in coef], axis=1) * y[:, None] for i in range(3))
        acc["contracted_a"] += wa.sum(axis=0)
        acc["contracted_c"] += wc.sum(axis=0)
        acc["contracted_bx"] += (x.T @ wb).T
        # one GEMM per row slice for all pairs: Xᵀ [a_1 ⊙ Z | a_2 ⊙ Z | ...] (d × P r)
        step = max(1, _WZ_BYTES // (8 * p * r))
        for start in range(0, n, step):
            xs, zs, ws = x[start : start + step], z[start : start + step], wa[start : start + step]
            wz = (ws[:, :, None] * zs[:, None, :]).reshape(len(xs), p * r)
            acc["contracted_xz"] += (xs.T @ wz).reshape(self.d, p, r).transpose(1, 0, 2)

    # -------------------------------------------------------------------- terms

    def terms(self, acc):
        om = self.omega
        out: dict[str, np.ndarray] = {}
        if self.second:
            out["Y_second"] = acc["second_xz"] - acc["second_y"] * om
            out["t0_second"], out["t1_second"] = acc["second_y"], acc["second_x"]
            if self.expansion is not None:
                # q's own part, exact: E[q (xxᵀ − I)] Ω = T_2 Ω, E[q] = t0, E[q x] = t1 (per sample of the chunk)
                t0, t1, v, theta = self.expansion
                n = acc["second_n"]
                out["Y_second"] = out["Y_second"] + n * ((v * theta) @ (v.T @ om))
                out["t0_second"], out["t1_second"] = out["t0_second"] + n * t0, out["t1_second"] + n * t1
        if self.orders is not None:
            gp = np.tile(self.directions, (len(self.orders), 1))  # (P, d), pair order
            v = acc["contracted_bx"]
            g_om, v_om = gp @ om, v @ om  # (P, r)
            out["Y_contracted"] = (
                acc["contracted_xz"]
                - acc["contracted_a"][:, None, None] * om
                - gp[:, :, None] * v_om[:, None, :]
                - v[:, :, None] * g_om[:, None, :]
                + acc["contracted_c"][:, None, None] * gp[:, :, None] * g_om[:, None, :]
            )
        if self.tau is not None:
            count = suffix_sums(acc["filtered_count"], 0)
            out["Y_filtered"] = suffix_sums(acc["filtered_xz"], 0) - count[:, None, None] * om
            out["prob_filtered"] = count
        if self.candidates is not None:
            count = suffix_sums(acc["residual_count"], 1)
            off = om - self.res_basis.T @ self.b_omega  # (I − BᵀB) Ω
            out["Y_residual"] = suffix_sums(acc["residual_xz"], 1) - count[:, :, None, None] * off
            out["prob_residual"] = count
        if self.is_basis:
            # B M Bᵀ = Ωᵀ Y: linear in the sums, so its standard error comes from the chunks like Y's
            for fam, _, _ in self._families():
                out[f"BMB_{fam}"] = np.matmul(om.T, out[f"Y_{fam}"])
        return out

    def config(self):
        out: dict[str, Any] = {"rank": self.rank, "basis": self.is_basis, "second": self.second}
        if self.expansion is not None:
            t0, t1, v, theta = self.expansion
            out["second_expansion"] = {
                "t0": t0,
                "t1": t1.tolist(),
                "t2_vectors": v.T.tolist(),
                "t2_values": theta.tolist(),
            }
        if self.orders is not None:
            out.update(orders=self.orders, directions=self.directions.tolist())
        if self.tau is not None:
            out["tau"] = self.tau.tolist()
        if self.candidates is not None:
            out["residual_tau"] = self.res_tau.tolist()
        return out


def _columns(section: Any) -> int:
    """r: the basis rows of a section (a mapping or its model), or its rank."""
    basis = option(section, "basis")
    return len(basis) if basis is not None else int(option(section, "rank") or SKETCH_DEFAULT_RANK)


def _binned_cross(
    xz: np.ndarray, count: np.ndarray, x: np.ndarray, z: np.ndarray, score: np.ndarray, tau: np.ndarray
) -> None:
    """Add ``x_bᵀ z_b`` and the row count of each bin ``tau[b] < score <= tau[b+1]`` in place (rows at or
    below ``tau[0]`` are dropped): one d × r product per row, as the dense filtered family's bins."""
    b = np.searchsorted(tau, score, side="left") - 1
    counts = np.bincount(b + 1, minlength=len(tau) + 1)[1:]
    count += counts
    for k in np.flatnonzero(counts):
        rows = np.flatnonzero(b == k)  # rows in sample order: the bits do not depend on the binning
        xz[k] += x.take(rows, axis=0).T @ z.take(rows, axis=0)


# -------------------------------------------------------------------- building


def _basis_rows(section: SketchConfig, d: int) -> np.ndarray:
    """The basis rows B (r × d) of a subspace pass, checked."""
    where = "statistics.sketch.basis"
    basis = np.asarray(section.basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[1] != d:
        raise ValueError(f"{where} has shape {basis.shape}; each row needs d={d} entries")
    check_sketch_rank(d, basis.shape[0], where=f"{where} (rows)")
    if not np.allclose(basis @ basis.T, np.eye(basis.shape[0]), rtol=0, atol=1e-8):
        raise ValueError(f"{where} rows must be orthonormal (B Bᵀ = I); orthonormalize them (QR) first")
    return basis


@dataclass(frozen=True)
class SketchSetup:
    """What the sketch statistics of a run share, resolved once: Ω, the direction bank, the τ grid
    (``tau``: (T,), or (m, T) per output of a vector source, with its quantiles)."""

    omega: np.ndarray
    is_basis: bool
    second: bool
    expansion: tuple | None
    contracted: tuple[np.ndarray, list[int]] | None
    tau: np.ndarray | None
    quantiles: np.ndarray | None
    #: ``(B, candidates, tau (C, T) or (m, C, T), quantiles)`` of the residual family, or None
    residual: tuple | None = None

    def statistic(self, output: int | None = None) -> SketchMoments:
        """The statistic of the scalar label (``output`` None) or of output ``output``."""
        filtered = None
        if self.tau is not None:
            filtered = (of_output(self.tau, output, 1), of_output(self.quantiles, output, 1))
        residual = None
        if self.residual is not None:
            rb, nets, tau, q = self.residual
            residual = (rb, nets, of_output(tau, output, 2), q)
        return SketchMoments(
            self.omega,
            is_basis=self.is_basis,
            second=self.second,
            contracted=self.contracted,
            filtered=filtered,
            expansion=self.expansion,
            residual=residual,
        )


def sketch_setup(
    section: SketchConfig,
    cfg: RunConfig,
    pilot: Pilot | None,
    outputs: int | None,
    stored: Mapping[str, np.ndarray] | None = None,
) -> SketchSetup:
    """Resolve a ``statistics.sketch`` section: the test matrix, direction bank and τ grid drawn from
    the run's seed (the τ grid from one pilot pass), or read from ``stored`` (the committed group) on
    resume; a basis is checked (shape, orthonormal rows, rank).

    Raises
    ------
    ValueError
        Naming the key at fault (ConfigError for a rank the sketch cannot hold, with the r to use).
    """
    d = cfg.source.d
    if section.basis is not None:
        omega, is_basis = np.ascontiguousarray(_basis_rows(section, d).T), True
    else:
        check_sketch_rank(d, section.columns)
        seed = cfg.seed if section.seed is None else section.seed
        omega = stored["omega"] if stored else gaussian_test_matrix(d, section.columns, seed)
        is_basis = False
    contracted = tau = q = None
    if section.contracted is not None:
        g = stored["direction"] if stored else direction_bank(section.contracted, d, cfg.seed)
        contracted = (np.asarray(g, dtype=np.float64), list(section.contracted.orders))
    if section.filtered is not None:
        if stored:
            tau, q = stored["tau"], stored.get("quantile")
        else:
            tau, q = threshold_grid(section.filtered, drawn(pilot), outputs)
    expansion = None
    if section.second is not None and section.second.expansion is not None:
        expansion = low_rank_expansion(section.second.expansion, d, "statistics.sketch.second")
    residual = None
    if section.residual is not None:
        rb, nets = residual_setup(section.residual, d, where="statistics.sketch.residual")
        if stored:
            r_tau, r_q = stored["residual_tau"], stored.get("residual_quantile")
        else:
            r_tau, r_q = residual_grid(section.residual, drawn(pilot), outputs, rb, nets)
        residual = (rb, nets, np.asarray(r_tau, dtype=np.float64), r_q)
    return SketchSetup(omega, is_basis, section.second is not None, expansion, contracted, tau, q, residual)
