"""Streamed refinement of one-hidden-layer ReLU networks on every sample (docs/design.md §6, polish).

Fits ``f(x) = Σ_i s_i relu(<w_i, x>)`` (signs ``s_i = ±1`` fixed, magnitudes in ``w_i``) to the
least-squares minimum over ``n`` streamed samples, with memory independent of ``n`` and of ``d²``.
Each pass streams only the gradient statistics of the squared loss at the current network,

    g_i = Σ_n s_i 1{<w_i, x_n> > 0} x_n r_n      (k × d),     r_n = y_n − f(x_n),

and the loss ``Σ r_n²``: ``3 k d`` flops per sample, one GEMM per part. The driver then takes a
Gauss–Newton step preconditioned by the *population* Gram of the activation patterns, which has a
closed form under Gaussian inputs: with ``Q`` an orthonormal basis of span(W),

    E[1{w_i·x>0} 1{w_j·x>0} x xᵀ] = P_ij (I − Q Qᵀ) + Q C_ij Qᵀ,    P_ij = (π − θ_ij) / 2π,

where ``C_ij`` is the same expectation for the ``q``-dimensional Gaussian ``Qᵀ x`` (a closed form in
the plane of the two rows, :func:`pair_second_moment`). So the ``kd × kd`` matrix is never formed:
its inverse is a ``k × k`` solve on the part of the gradient orthogonal to span(W) and a ``kq × kq``
solve inside it.

The fixed point of the iteration is a zero of the empirical gradient, the least-squares fit on all
``n`` samples (exact when the labels are noiseless, at any d), and the empirical Gram differs from
the population one by ``O(√(kd/n))``, which is the contraction factor per pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import progress
from ..network import Network
from .base import part_batches, part_sum
from .polish import refinement_verdict
from .refine import PART_ROWS, parts

#: a validation relative loss below this is exact up to rounding: nothing left to refine
EXACT_LOSS = 1e-20

__all__ = [
    "EXACT_LOSS",
    "refine_unless_exact",
    "GradientSums",
    "gradient_sums",
    "gradient_sums_biased",
    "PartGradient",
    "ProjectedPart",
    "pair_second_moment",
    "PopulationGram",
    "SampleGram",
    "refine_streamed",
    "part_rows_for",
    "projected_sample",
    "MAX_PASSES",
]

#: iterates the Anderson mixing of the steps remembers (:func:`_anderson`)
ANDERSON_MEMORY = 5

#: passes at most (each streams the ``total`` samples once); from 0.2 rad off, 10–20 at kd/n ≤ 1e-2
MAX_PASSES = 40

#: stop when the step's predicted decrease of the mean loss is below this fraction of ``(kd / n)`` × the
#: mean loss: with noise, the least-squares fit's excess error is about ``σ² kd / n``, so the remaining
#: distance to the fixed point then costs a thousandth of it; noiseless, loss and decrease fall together
#: and the iteration goes on to rounding level
PREDICTED_DECREASE = 1e-3

#: stop when a step moves the weights by less than this, relative to their norm (rounding level)
RELATIVE_STEP = 1e-15

#: halvings of a step that increased the loss, before stopping
MAX_BACKTRACKS = 4

#: stop when the relative loss is below this × d (the rounding of ``<w_i, x>``, a sum of d terms, leaves
#: an exact fit a relative loss of order ``eps² d``): noiseless labels are then fitted to machine precision
ROUNDING_LOSS = np.finfo(float).eps ** 2

#: bytes of one part's inputs (rows × d floats) at most: parts shrink at large d to stay well inside a
#: worker's memory
PART_BYTES = 256 * 2**20


def part_rows_for(d: int) -> int:
    """Rows per streamed part at input dimension ``d``: ``PART_ROWS``, fewer when they would exceed
    ``PART_BYTES``."""
    return int(max(1_000, min(PART_ROWS, PART_BYTES // (8 * d))))


@dataclass(frozen=True)
class GradientSums:
    """Sums over samples at one network: ``g`` (k × d, the negative half-gradient of ``Σ r²``),
    ``loss = Σ r²``, ``y2 = Σ y²`` and the count ``n``."""

    g: np.ndarray
    loss: float
    y2: float
    n: int

    def __add__(self, other: GradientSums) -> GradientSums:
        return GradientSums(self.g + other.g, self.loss + other.loss, self.y2 + other.y2, self.n + other.n)


def gradient_sums(x: np.ndarray, y: np.ndarray, w: np.ndarray, s: np.ndarray) -> GradientSums:
    """The gradient statistics of ``Σ (y − Σ_i s_i relu(<w_i, x>))²`` on one batch.

    Parameters
    ----------
    x, y
        ``(n, d)`` inputs and ``(n,)`` labels.
    w
        ``(k, d)`` hidden rows (their norms carry the output magnitudes).
    s
        ``(k,)`` output signs.

    Returns
    -------
    GradientSums
    """
    y = np.asarray(y, dtype=np.float64).reshape(len(x))
    z = x @ w.T
    r = y - np.maximum(z, 0.0) @ s
    weight = (z > 0) * (s * r[:, None])  # n × k: s_i 1{z_i > 0} r
    return GradientSums(weight.T @ x, float(r @ r), float(y @ y), len(x))


@dataclass(frozen=True)
class PartGradient:
    """Picklable function of a part ``(p, n)``: draws it from ``draw`` and returns its
    :class:`GradientSums` (what a mapper runs on a worker); ``biased``: of a biased network on ``[x, 1]``
    (:func:`gradient_sums_biased`)."""

    draw: Any
    w: np.ndarray
    s: np.ndarray
    biased: bool = False

    def __call__(self, item: tuple[int, int]) -> GradientSums:
        p, n = item
        fn = gradient_sums_biased if self.biased else gradient_sums
        return part_sum(lambda x, y: fn(x, y, self.w, self.s), self.draw, p, n)


@dataclass(frozen=True)
class ProjectedPart:
    """Picklable function of a part ``(p, n)``: the part's inputs projected on ``basis`` (``x B``) and its
    labels, so that only ``n × r`` floats travel back from a worker."""

    draw: Any
    basis: np.ndarray

    def __call__(self, item: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        p, n = item
        got = [
            (x @ self.basis, np.asarray(y, dtype=np.float64).reshape(len(x))) for x, y in part_batches(self.draw, p, n)
        ]
        if len(got) == 1:
            return got[0]
        return np.concatenate([z for z, _ in got]), np.concatenate([y for _, y in got])


def projected_sample(
    draw: Any, basis: np.ndarray, n: int, first: int, mapper: Callable = map
) -> tuple[np.ndarray, np.ndarray, int]:
    """``n`` held-out samples projected on ``basis`` (``z = x B``, d × r), drawn in parts on the workers
    from part ``first`` on (``draw.part``), so that no ``n × d`` array is ever formed on the driver.

    Returns
    -------
    (z, y, next_part)
        ``(n, r)`` projected inputs, ``(n,)`` labels and the first part id not used.
    """
    items = parts(n, part_rows_for(basis.shape[0]), first=first)
    got = list(mapper(ProjectedPart(draw, basis), items))
    return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]), first + len(items)


def pair_second_moment(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``E[1{<a,z> > 0} 1{<b,z> > 0} z zᵀ]`` for ``z ~ N(0, I_q)`` and unit ``a``, ``b``.

    In the plane of ``a`` and ``b`` (angle θ), with ``e1 = a`` and ``e2`` the unit part of ``b``
    orthogonal to ``a``, the region is the arc ``(θ − π/2, π/2)`` and ``E[r²] = 2``, so the 2×2 block is
    ``(1/π) ∫ e(φ) e(φ)ᵀ dφ``; orthogonally to the plane the factor is ``P = (π − θ)/2π``.
    """
    q = len(a)
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    c = float(np.clip(a @ b, -1.0, 1.0))
    perp = b - c * a
    sin = float(np.linalg.norm(perp))
    theta = float(np.arctan2(sin, c))  # arccos(c) loses half the digits near c = ±1
    p = (np.pi - theta) / (2 * np.pi)
    out = p * np.eye(q)
    if sin < 1e-12:  # (anti)parallel: the plane block is p·I too (θ = 0: 1/2; θ = π: 0)
        return out
    e = np.stack([a, perp / sin], axis=1)  # q × 2
    half = (np.pi - theta) / 2
    block = (
        np.array([[half + np.sin(2 * theta) / 4, sin * sin / 2], [sin * sin / 2, half - np.sin(2 * theta) / 4]]) / np.pi
    )
    return out + e @ (block - p * np.eye(2)) @ e.T


def _orthant(a: np.ndarray, b: np.ndarray) -> float:
    """``P(<a,z> > 0, <b,z> > 0) = (π − θ)/2π`` for unit ``a``, ``b`` (θ from atan2, as above)."""
    c = float(a @ b)
    return (np.pi - float(np.arctan2(np.linalg.norm(b - c * a), c))) / (2 * np.pi)


class PopulationGram:
    """The Gauss–Newton matrix ``E[J Jᵀ]`` of ``f = Σ s_i relu(<w_i, x>)`` under ``x ~ N(0, I)``,
    inverted in closed form (module docstring): ``solve(G)`` returns ``Δ`` (k × d) with ``H Δ = G``."""

    def __init__(self, w: np.ndarray, s: np.ndarray):
        k, d = w.shape
        norms = np.linalg.norm(w, axis=1)
        if np.any(norms == 0):
            raise ValueError("a hidden row is zero: its unit has no direction to refine; drop it first")
        u, sv, _ = np.linalg.svd(w.T, full_matrices=False)
        self.q = u[:, sv > sv[0] * 1e-12]  # d × q, orthonormal basis of span(W)
        a = (w / norms[:, None]) @ self.q  # k × q unit rows in the basis
        a /= np.linalg.norm(a, axis=1, keepdims=True)
        qd = self.q.shape[1]
        self.p = np.zeros((k, k))
        kmat = np.zeros((k, qd, k, qd))
        for i in range(k):  # k² blocks of q × q: tiny next to a pass
            for j in range(i, k):
                c = s[i] * s[j] * pair_second_moment(a[i], a[j])
                kmat[i, :, j, :], kmat[j, :, i, :] = c, c.T
                # the factor orthogonal to span(W): P_ij = c's eigenvalue off the pair's plane
                self.p[i, j] = self.p[j, i] = s[i] * s[j] * _orthant(a[i], a[j])
        self.k = kmat.reshape(k * qd, k * qd)

    def solve(self, g: np.ndarray) -> np.ndarray:
        k = g.shape[0]
        inside = g @ self.q  # k × q
        outside = g - inside @ self.q.T
        # lstsq: two units along one direction make both blocks singular; the minimum-norm step is right
        d_out = np.linalg.lstsq(self.p, outside, rcond=1e-12)[0]
        d_in = np.linalg.lstsq(self.k, inside.ravel(), rcond=1e-12)[0].reshape(k, -1)
        return d_out + d_in @ self.q.T


def gradient_sums_biased(x: np.ndarray, y: np.ndarray, w: np.ndarray, s: np.ndarray) -> GradientSums:
    """The gradient statistics of ``Σ (y − Σ_i s_i relu(<w_i, [x, 1]>) − c)²`` on one batch: ``g`` is
    ``(k + 1) × (d + 1)``, its last row ``[0, …, 0, Σ r]`` (the output bias ``c = w[k, d]``)."""
    y = np.asarray(y, dtype=np.float64).reshape(len(x))
    k = len(s) - 1
    xt = np.column_stack([x, np.ones(len(x))])
    z = xt @ w[:k].T
    r = y - np.maximum(z, 0.0) @ s[:k] - w[k, -1]
    weight = (z > 0) * (s[:k] * r[:, None])
    g = np.zeros_like(w)
    g[:k] = weight.T @ xt
    g[k, -1] = r.sum()
    return GradientSums(g, float(r @ r), float(y @ y), len(x))


#: rows of the bounded sample the Gram of a biased network is formed on: this many per unknown (its error
#: against the population Gram, O(√(1/ratio)), is the contraction per pass), at least 2,000
GRAM_ROWS_PER_UNKNOWN = 8


class SampleGram:
    """The Gauss–Newton matrix of a biased network (:func:`_split_biased`) on a bounded sample ``x``: with
    biases the patterns are halfspaces off the origin, with no closed form as in :class:`PopulationGram`,
    so ``JᵀJ / m`` is formed on at most ``GRAM_ROWS_PER_UNKNOWN`` rows per unknown of the sample."""

    def __init__(self, x: np.ndarray, w: np.ndarray, s: np.ndarray):
        k, dt = len(s) - 1, w.shape[1]
        unknowns = k * dt + 1
        m = int(min(len(x), max(2_000, GRAM_ROWS_PER_UNKNOWN * unknowns)))
        xt = np.column_stack([x[:m], np.ones(m)])
        act = (xt @ w[:k].T > 0) * s[:k]  # m × k
        jac = np.column_stack([(act[:, :, None] * xt[:, None, :]).reshape(m, k * dt), np.ones(m)])
        self.h, self.k, self.dt = jac.T @ jac / m, k, dt

    def solve(self, g: np.ndarray) -> np.ndarray:
        rhs = np.r_[g[: self.k].ravel(), g[self.k, -1]]
        sol = np.linalg.lstsq(self.h, rhs, rcond=1e-12)[0]
        out = np.zeros_like(g)
        out[: self.k] = sol[:-1].reshape(self.k, self.dt)
        out[self.k, -1] = sol[-1]
        return out


def _split_biased(net: Network) -> tuple[np.ndarray, np.ndarray]:
    """``(W, s)`` of ``f = Σ s_i relu(<w_i, [x, 1]>) + c`` from a biased ``Network((U, λ), (b, [c]))``:
    rows ``|λ_i| [u_i, b_i]``, then the row ``[0, …, 0, c]``; ``s`` ends with +1 for that row."""
    assert net.biases is not None  # called for a biased network only
    u, lam = net.weights[0], net.weights[1][0]
    b, c = net.biases[0], float(net.biases[1][0])
    keep = lam != 0
    rows = np.abs(lam[keep])[:, None] * np.column_stack([u[keep], b[keep]])
    last = np.zeros((1, rows.shape[1]))
    last[0, -1] = c
    return np.vstack([rows, last]), np.r_[np.sign(lam[keep]), 1.0]


def _join_biased(w: np.ndarray, s: np.ndarray) -> Network:
    k = len(s) - 1
    norms = np.linalg.norm(w[:k], axis=1)
    rows = w[:k] / norms[:, None]
    return Network(
        (rows[:, :-1], (s[:k] * norms)[None, :]), (rows[:, -1].copy(), np.array([w[k, -1]])), activation="relu"
    )


def _split(net: Network) -> tuple[np.ndarray, np.ndarray]:
    """``(W, s)`` with ``f = Σ s_i relu(<w_i, x>)`` from a ``Network((U, λ))`` without biases."""
    if net.activation != "relu" or len(net.weights) != 2 or net.weights[1].shape[0] != 1 or net.biases:
        raise ValueError("the streamed refinement takes a one-hidden-layer ReLU network with one output and no biases")
    u, lam = net.weights[0], net.weights[1][0]
    keep = lam != 0
    return np.abs(lam[keep])[:, None] * u[keep], np.sign(lam[keep])


def _join(w: np.ndarray, s: np.ndarray) -> Network:
    norms = np.linalg.norm(w, axis=1)
    return Network((w / norms[:, None], (s * norms)[None, :]), activation="relu")


def mapped_sum(fn: Callable[[tuple[int, int]], Any], items: list[tuple[int, int]], mapper: Callable) -> Any:
    """``fn`` mapped over the parts and its results added in part order (so the sum does not depend on
    where the parts ran); the results support ``+``."""
    results = list(mapper(fn, items))
    if len(results) != len(items):
        raise RuntimeError(f"mapper returned {len(results)} results for {len(items)} parts")
    total = results[0]
    for r in results[1:]:
        total = total + r
    return total


def _accumulate(
    draw: Any, items: list[tuple[int, int]], w: np.ndarray, s: np.ndarray, mapper: Callable, biased: bool = False
) -> GradientSums:
    return mapped_sum(PartGradient(draw, w, s, biased), items, mapper)


def refine_streamed(
    net: Network,
    draw: Any,
    total: int,
    *,
    mapper: Callable = map,
    max_passes: int = MAX_PASSES,
    part_rows: int | None = None,
    first_part: int = 2,
    gram_x: np.ndarray | None = None,
) -> tuple[Network, dict[str, Any]]:
    """Preconditioned Gauss–Newton on ``total`` streamed samples, from ``net``.

    Parameters
    ----------
    net
        Starting ``Network((U, λ), "relu")``, one output; with biases ``(b, [c])``, the units act on
        ``[x, 1]``, the output bias is one more unknown, and the step is preconditioned by the Gram of the
        bounded sample ``gram_x`` (:class:`SampleGram`) instead of the closed-form population Gram.
    draw
        A :class:`~.base.SampleDraw`; its parts ``first_part, first_part + 1, …`` are streamed (the same
        ones every pass).
    total
        Samples per pass.
    mapper
        ``map``-like; maps :class:`PartGradient` over the parts (results in order).
    max_passes
        Passes at most (each streams ``total`` samples once).
    part_rows
        Rows per part (default :func:`part_rows_for` d).
    gram_x
        Inputs of a bounded sample (n × d): the preconditioner of a biased network (required for one).

    Returns
    -------
    (Network, dict)
        The refined network and a report: ``samples``, ``parts``, ``passes``, ``stop`` (why it
        stopped), ``relative_loss`` and per pass ``relative_loss``, ``relative_step``, ``accepted``.
    """
    biased = net.biases is not None
    gram: Callable[[np.ndarray], SampleGram | PopulationGram]
    if biased:
        if net.activation != "relu" or len(net.weights) != 2 or net.weights[1].shape[0] != 1:
            raise ValueError("the streamed refinement takes a one-hidden-layer ReLU network with one output")
        if gram_x is None:
            raise ValueError(
                "the streamed refinement of a biased network needs a bounded sample (gram_x) for its "
                "Gauss–Newton matrix"
            )
        w, s = _split_biased(net)
        gram, join = (lambda w_: SampleGram(gram_x, w_, s)), _join_biased
    else:
        w, s = _split(net)
        gram, join = (lambda w_: PopulationGram(w_, s)), _join
    items = parts(total, part_rows or part_rows_for(net.input_dim), first=first_part)

    def accumulate(w_: np.ndarray) -> GradientSums:
        return _accumulate(draw, items, w_, s, mapper, biased)

    cur = accumulate(w)
    y2 = cur.y2 or 1.0
    history: list[dict[str, Any]] = [{"relative_loss": cur.loss / y2}]
    passes, stop, scale, mixed = 1, "max_passes", 1.0, 0
    iterates: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    while passes < max_passes:
        progress.step("refinement: passes over the samples", passes, max_passes, f"relative loss {cur.loss / y2:.3g}")
        if cur.loss / y2 < ROUNDING_LOSS * w.shape[1]:
            stop = "loss at rounding level"
            break
        step = gram(w).solve(cur.g / cur.n)
        predicted = float(np.sum(step * cur.g)) / cur.n  # first-order decrease of the mean loss (×½ of ∂)
        rel_step = float(np.linalg.norm(step) / np.linalg.norm(w))
        if rel_step * scale < RELATIVE_STEP:
            stop = "step at rounding level"
            break
        if predicted < PREDICTED_DECREASE * (w.size / cur.n) * cur.loss / cur.n:
            stop = "predicted decrease below a thousandth of the statistical excess error"
            break
        iterates, steps = (iterates + [w])[-ANDERSON_MEMORY - 1 :], (steps + [step])[-ANDERSON_MEMORY - 1 :]
        mix = _anderson(iterates, steps) if scale == 1.0 else None
        if mix is not None:
            new = accumulate(mix)
            passes += 1
            history.append(
                {
                    "relative_loss": new.loss / y2,
                    "relative_step": float(np.linalg.norm(mix - w) / np.linalg.norm(w)),
                    "accepted": bool(new.loss <= cur.loss),
                    "mixed": True,
                }
            )
            if new.loss <= cur.loss:
                w, cur, mixed = mix, new, mixed + 1
                continue
            iterates, steps = [w], [step]  # the mixing overshot: restart it from the plain step
            if passes >= max_passes:
                break
        for _ in range(MAX_BACKTRACKS + 1):
            w_new = w + scale * step
            new = accumulate(w_new)
            passes += 1
            accepted = new.loss <= cur.loss
            history.append(
                {"relative_loss": new.loss / y2, "relative_step": rel_step * scale, "accepted": bool(accepted)}
            )
            if accepted or passes >= max_passes:
                break
            scale /= 2
        if not accepted:
            stop = "no decrease along the step (rounding level or a bad start)"
            break
        w, cur, scale = w_new, new, min(1.0, 2 * scale)
    report = {
        "samples": int(cur.n),
        "parts": len(items),
        "passes": passes,
        "stop": stop,
        "relative_loss": cur.loss / y2,
        "mixed_steps": mixed,
        "iterations": history,
    }
    return join(w, s), report


def _anderson(iterates: list[np.ndarray], steps: list[np.ndarray]) -> np.ndarray | None:
    """Anderson mixing of the last Gauss–Newton steps (type II; Walker and Ni 2011): the next iterate
    ``w + f − (ΔW + ΔF) γ`` with γ minimising ``||f − ΔF γ||``, ``f`` the last step and ``ΔW``, ``ΔF`` the
    differences of the remembered iterates and steps. Near the fit the activation patterns settle and the
    iteration is linear with contraction ``O(√(kd/n))`` per pass (the empirical against the population
    Gram); the mixing is then a Krylov method on the same passes: the passes needed fall from
    ``log ε / log ρ`` to about the square root of the conditioning's. None with fewer than two iterates.
    """
    if len(iterates) < 2:
        return None
    w, f = iterates[-1], steps[-1]
    dw = np.stack([(a - b).ravel() for a, b in zip(iterates[1:], iterates[:-1])], axis=1)
    df = np.stack([(a - b).ravel() for a, b in zip(steps[1:], steps[:-1])], axis=1)
    gamma, *_ = np.linalg.lstsq(df, f.ravel(), rcond=1e-10)
    return w + f - ((dw + df) @ gamma).reshape(w.shape)


def refine_unless_exact(net: Network, samples: Any, total: int, smp: Any, mapper: Callable, report: dict) -> Network:
    """The streamed refinement of ``net`` (one output) on ``total`` samples, kept unless the validation samples
    say it is worse (its paired loss difference more than two standard errors above zero); skipped when the
    network is already exact on them (``report["validation_relative_loss"][report["chosen"]]`` below
    :data:`EXACT_LOSS`). Records ``refinement`` (and ``chosen = "refined"`` when kept) in ``report``."""
    if report["validation_relative_loss"][report["chosen"]] < EXACT_LOSS:
        report["refinement"] = {"skipped": "polish is exact on the validation samples"}
        return net
    if total <= 0 or not hasattr(samples, "part"):
        report["refinement"] = {
            "skipped": "no samples to stream" if total <= 0 else "the sample draw has no independent parts to stream"
        }
        return net
    refined, rep = refine_streamed(net, samples, total, mapper=mapper, gram_x=smp.x_train)
    rep["validation_relative_loss_change"], rep["kept"] = refinement_verdict(
        smp.y_val, net.forward(smp.x_val)[:, 0], refined.forward(smp.x_val)[:, 0]
    )
    report["refinement"] = rep
    if rep["kept"]:
        report["chosen"] = "refined"
        return refined
    return net
