"""The ``residual`` family: second moments filtered by the residual of candidate networks on a found subspace,
projected off it; the checks of its basis and candidates and its τ grid, which the sketch family shares.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...config import ResidualConfig
from ...network import Network
from .base import Statistic, Var
from .build import FamilyContext, Pilot, drawn
from .family import Family
from .filtered import binned_gram, suffix_sums
from .per_output import of_output
from .pilot import label_scores, pilot_scores
from .work import Work, gram_work, grid_size, option

__all__ = ["ResidualFilteredMoments", "residual_scores", "candidate_coords", "residual_setup", "residual_grid"]


def residual_scores(y: np.ndarray, z: np.ndarray, candidates: list[Network]) -> np.ndarray:
    """``|y − F̃_c(z)|`` of every candidate on the subspace coordinates ``z = x Bᵀ``, shape (C, n)."""
    return np.stack([np.abs(y - net.forward(z)[:, 0]) for net in candidates])


def candidate_coords(candidates: list[Network]) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """The candidates' weights as coordinates ``candidate{c}_W{j}``, as the residual families store them."""
    return {
        f"candidate{c}_W{j}": ((f"candidate{c}_W{j}_out", f"candidate{c}_W{j}_in"), w)
        for c, net in enumerate(candidates)
        for j, w in enumerate(net.weights)
    }


def residual_setup(cfg: ResidualConfig, d: int, where: str = "statistics.residual") -> tuple[np.ndarray, list[Network]]:
    """The basis rows ``B`` (r, d) and candidate networks of a residual section, checked.

    Raises
    ------
    ValueError
        Naming the key at fault: a basis of the wrong width or not orthonormal, a
        candidate whose first layer does not take ``r`` inputs or that has several outputs.
    """
    basis = np.asarray(cfg.basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[1] != d:
        raise ValueError(f"{where}.basis has shape {basis.shape}; each row needs d={d} entries")
    r = basis.shape[0]
    if not np.allclose(basis @ basis.T, np.eye(r), atol=1e-8):
        raise ValueError(f"{where}.basis rows must be orthonormal (B Bᵀ = I)")
    nets = []
    for c, cand in enumerate(cfg.candidates):
        try:
            net = Network(tuple(np.asarray(w, dtype=np.float64) for w in cand.weights), activation=cand.activation)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}.candidates[{c}]: {err}") from None
        if net.input_dim != r or net.output_dim != 1:
            raise ValueError(
                f"{where}.candidates[{c}] maps {net.input_dim} inputs to {net.output_dim} outputs; "
                f"it must take the r={r} subspace coordinates z = B x to one output"
            )
        nets.append(net)
    return basis, nets


def residual_grid(
    cfg: ResidualConfig,
    pilot: Pilot,
    outputs: int | None,
    basis: np.ndarray,
    candidates: list[Network],
) -> tuple[np.ndarray, np.ndarray | None]:
    """The τ grid per candidate, shape (C, T): given thresholds, or quantiles of each
    candidate's |residual| over the pilot pass (then (m, C, T) for a source with m outputs)."""
    if cfg.thresholds is not None:
        tau = np.asarray(cfg.thresholds, dtype=np.float64)
        return np.tile(tau, (len(candidates), 1)), None

    def scores(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return residual_scores(y, x @ basis.T, candidates)

    q = np.asarray(cfg.quantiles, dtype=np.float64)
    all_scores = pilot_scores(pilot(cfg.pilot_samples), label_scores(outputs, scores))
    if all_scores.ndim == 2:
        return np.quantile(all_scores, q, axis=1).T.copy(), q
    return np.stack([np.quantile(s, q, axis=1).T.copy() for s in all_scores]), q


class ResidualFilteredMoments(Family):
    """Residual-filtered second moments, projected off a found subspace.

    For candidate networks ``F̃_c`` on the coordinates ``z = B x`` of the subspace found so
    far (rows ``B``, orthonormal), and thresholds ``τ_{c,t}``::

        M[c, t] = E[1{|y − F̃_c(Bx)| > τ_{c,t}} (x⊥ x⊥ᵀ − (I − BᵀB))],   x⊥ = x − BᵀB x,
        prob[c, t] = P[|y − F̃_c(Bx)| > τ_{c,t}].

    If ``y`` depends on ``x`` only through a subspace ``V ⊇ span(B)``, the residual does
    too, and ``M[c, t]`` has its range in ``V ⊖ span(B)``: the directions still missing.
    Per sample and candidate one d² product (the bins of one candidate partition the
    samples), as for :class:`FilteredMoments`. The candidates and the basis are stored
    with the sums (coordinates ``basis``, ``candidate{c}_W{j}``).
    """

    name = "residual"
    descriptions = {
        "M": (
            "residual-filtered second moment",
            "M[c, t] = E[1{|y − F̃_c(Bx)| > τ_{c,t}} (x⊥x⊥ᵀ − (I − BᵀB))], "
            "x⊥ = x − BᵀBx: per candidate network c and threshold t",
        ),
        "prob": ("residual filter probability", "P[|y − F̃_c(Bx)| > τ_{c,t}]"),
        "tau": ("threshold τ", "the thresholds of each candidate's |residual|"),
        "quantile": ("quantile of the residual", "the quantile of |residual| each τ was taken at"),
        "basis": ("basis found so far", "orthonormal rows B of the subspace the candidates act on"),
    }
    pilot_key = "pilot_samples"

    def __init__(
        self, d: int, basis: np.ndarray, candidates: list[Network], tau: np.ndarray, quantiles: np.ndarray | None = None
    ):
        self.d = d
        self.basis = np.asarray(basis, dtype=np.float64)
        self.candidates = list(candidates)
        self.tau = np.asarray(tau, dtype=np.float64).reshape(len(self.candidates), -1)
        self.quantiles = quantiles

    @classmethod
    def from_config(cls, section: ResidualConfig, ctx: FamilyContext) -> Statistic:
        """The ``residual`` section's statistic: its basis and candidates checked, its τ grid per candidate from
        the pilot pass (or given), or read from the store."""
        d = ctx.d
        basis, nets = residual_setup(section, d)
        if ctx.stored:
            arrays = ctx.stored(cls.name)
            tau, q = arrays["tau"], arrays.get("quantile")
        else:
            tau, q = residual_grid(section, drawn(ctx.pilot), ctx.outputs, basis, nets)
        return ctx.per_output(
            lambda j: ResidualFilteredMoments(d, basis, nets, of_output(tau, j, 2), of_output(q, j, 1))
        )

    @classmethod
    def work(cls, section: Any, d: int, outputs: int) -> Work:
        """Per output: a Gram per candidate, the subspace coordinates x Bᵀ and the projection off it."""
        c = len(option(section, "candidates") or [1])
        s = len(option(section, "basis") or [[0]])
        return (gram_work(d, c) + Work(((2.0 * d * s, s), (2.0 * d * s, d)))).scaled(outputs)

    @classmethod
    def entries(cls, section: Any, d: int, outputs: int) -> tuple[int, int]:
        c = len(option(section, "candidates") or [0])
        n = c * grid_size(section) * (d * d + 1)
        return n * outputs, n * outputs

    @classmethod
    def runs_pilot(cls, section: Any) -> bool:
        """The pilot pass of a grid given as quantiles (of each candidate's residual)."""
        return bool(option(section, "quantiles"))

    def sums_schema(self) -> dict[str, Var]:
        c, t, d = *self.tau.shape, self.d
        return {
            "bin_xx": Var(("candidate", "tau", "i", "j"), (c, t, d, d)),
            "bin_count": Var(("candidate", "tau"), (c, t)),
        }

    def terms_schema(self) -> dict[str, Var]:
        c, t, d = *self.tau.shape, self.d
        return {"M": Var(("candidate", "tau", "i", "j"), (c, t, d, d)), "prob": Var(("candidate", "tau"), (c, t))}

    def coords(self):
        out = {"tau": (("candidate", "tau"), self.tau), "basis": (("rank", "i"), self.basis)}
        if self.quantiles is not None:
            out["quantile"] = (("tau",), np.asarray(self.quantiles, dtype=np.float64))
        out.update(candidate_coords(self.candidates))
        return out

    def update(self, acc, x, y):
        z = x @ self.basis.T
        xp = x - z @ self.basis
        for c, score in enumerate(residual_scores(y, z, self.candidates)):
            binned_gram(acc["bin_xx"][c], acc["bin_count"][c], xp, score, self.tau[c])

    def terms(self, acc):
        count, xx = suffix_sums(acc["bin_count"], 1), suffix_sums(acc["bin_xx"], 1)
        off = np.eye(self.d) - self.basis.T @ self.basis
        return {"M": xx - count[:, :, None, None] * off, "prob": count}

    def config(self):
        return {"tau": self.tau.tolist()}
