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
the plane of the two rows, :func:`.polish.streamed_gram.pair_second_moment`). So the ``kd × kd`` matrix is never formed:
its inverse is a ``k × k`` solve on the part of the gradient orthogonal to span(W) and a ``kq × kq``
solve inside it.

The fixed point of the iteration is a zero of the empirical gradient, the least-squares fit on all
``n`` samples (exact when the labels are noiseless, at any d), and the empirical Gram differs from
the population one by ``O(√(kd/n))``, which is the contraction factor per pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import progress
from ...network import Network
from ..base import part_batches, part_sum
from .dense import refinement_verdict
from .refine import PART_ROWS, parts
from .streamed_gram import PopulationGram, SampleGram

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


def _unknowns(
    net: Network, gram_x: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], SampleGram | PopulationGram], Callable[..., Network]]:
    """``(W, s)`` of ``net``, the Gauss–Newton matrix at a ``W`` (:class:`SampleGram` on ``gram_x`` for a
    biased network, else :class:`PopulationGram`), and the map of ``(W, s)`` back to a network."""
    if net.biases is not None:
        if net.activation != "relu" or len(net.weights) != 2 or net.weights[1].shape[0] != 1:
            raise ValueError("the streamed refinement takes a one-hidden-layer ReLU network with one output")
        if gram_x is None:
            raise ValueError(
                "the streamed refinement of a biased network needs a bounded sample (gram_x) for its "
                "Gauss–Newton matrix"
            )
        w, s = _split_biased(net)
        return w, s, (lambda w_: SampleGram(gram_x, w_, s)), _join_biased
    w, s = _split(net)
    return w, s, (lambda w_: PopulationGram(w_, s)), _join


@dataclass
class _Run:
    """The state of :func:`refine_streamed`'s iteration: the iterate ``w`` and its sums ``cur``, ``Σ y²``
    (1 when zero), passes made, the step's scale after backtracking, mixed steps taken, the per-pass
    history, and the iterates and steps the Anderson mixing remembers."""

    w: np.ndarray
    cur: GradientSums
    y2: float
    passes: int = 1
    scale: float = 1.0
    mixed: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    iterates: list[np.ndarray] = field(default_factory=list)
    steps: list[np.ndarray] = field(default_factory=list)


def _step_stop(run: _Run, step: np.ndarray) -> tuple[float, str | None]:
    """The step's size relative to ``w``, and why to stop before taking it (None: take it)."""
    cur, w = run.cur, run.w
    predicted = float(np.sum(step * cur.g)) / cur.n  # first-order decrease of the mean loss (×½ of ∂)
    rel_step = float(np.linalg.norm(step) / np.linalg.norm(w))
    if rel_step * run.scale < RELATIVE_STEP:
        return rel_step, "step at rounding level"
    if predicted < PREDICTED_DECREASE * (w.size / cur.n) * cur.loss / cur.n:
        return rel_step, "predicted decrease below a thousandth of the statistical excess error"
    return rel_step, None


def _mixed_pass(run: _Run, step: np.ndarray, accumulate: Callable[[np.ndarray], GradientSums]) -> bool:
    """One pass at the Anderson mixing of the remembered steps (at full scale only); True when it decreased
    the loss and was taken. A rejected mixing restarts from the plain step."""
    run.iterates = (run.iterates + [run.w])[-ANDERSON_MEMORY - 1 :]
    run.steps = (run.steps + [step])[-ANDERSON_MEMORY - 1 :]
    mix = _anderson(run.iterates, run.steps) if run.scale == 1.0 else None
    if mix is None:
        return False
    new = accumulate(mix)
    run.passes += 1
    run.history.append(
        {
            "relative_loss": new.loss / run.y2,
            "relative_step": float(np.linalg.norm(mix - run.w) / np.linalg.norm(run.w)),
            "accepted": bool(new.loss <= run.cur.loss),
            "mixed": True,
        }
    )
    if new.loss <= run.cur.loss:
        run.w, run.cur, run.mixed = mix, new, run.mixed + 1
        return True
    run.iterates, run.steps = [run.w], [step]  # the mixing overshot: restart it from the plain step
    return False


def _line_search(
    run: _Run, step: np.ndarray, rel_step: float, accumulate: Callable[[np.ndarray], GradientSums], max_passes: int
) -> bool:
    """Passes along ``step``, halving its scale (at most ``MAX_BACKTRACKS`` times) until the loss does not
    increase; True when a point was taken (the scale then doubles back towards 1)."""
    for _ in range(MAX_BACKTRACKS + 1):
        w_new = run.w + run.scale * step
        new = accumulate(w_new)
        run.passes += 1
        accepted = new.loss <= run.cur.loss
        run.history.append(
            {"relative_loss": new.loss / run.y2, "relative_step": rel_step * run.scale, "accepted": bool(accepted)}
        )
        if accepted or run.passes >= max_passes:
            break
        run.scale /= 2
    if not accepted:
        return False
    run.w, run.cur, run.scale = w_new, new, min(1.0, 2 * run.scale)
    return True


def _iterate(
    run: _Run,
    gram: Callable[[np.ndarray], SampleGram | PopulationGram],
    accumulate: Callable[[np.ndarray], GradientSums],
    max_passes: int,
) -> str:
    """Gauss–Newton steps (mixed, else backtracked) from ``run`` until a stopping test holds or the passes
    run out; why it stopped."""
    while run.passes < max_passes:
        progress.step(
            "refinement: passes over the samples", run.passes, max_passes, f"relative loss {run.cur.loss / run.y2:.3g}"
        )
        if run.cur.loss / run.y2 < ROUNDING_LOSS * run.w.shape[1]:
            return "loss at rounding level"
        step = gram(run.w).solve(run.cur.g / run.cur.n)
        rel_step, stop = _step_stop(run, step)
        if stop is not None:
            return stop
        if _mixed_pass(run, step, accumulate):
            continue
        if run.passes >= max_passes:
            break
        if not _line_search(run, step, rel_step, accumulate, max_passes):
            return "no decrease along the step (rounding level or a bad start)"
    return "max_passes"


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
    w, s, gram, join = _unknowns(net, gram_x)
    biased = net.biases is not None
    items = parts(total, part_rows or part_rows_for(net.input_dim), first=first_part)

    def accumulate(w_: np.ndarray) -> GradientSums:
        return _accumulate(draw, items, w_, s, mapper, biased)

    cur = accumulate(w)
    y2 = cur.y2 or 1.0
    run = _Run(w, cur, y2, history=[{"relative_loss": cur.loss / y2}])
    stop = _iterate(run, gram, accumulate, max_passes)
    report = {
        "samples": int(run.cur.n),
        "parts": len(items),
        "passes": run.passes,
        "stop": stop,
        "relative_loss": run.cur.loss / y2,
        "mixed_steps": run.mixed,
        "iterations": run.history,
    }
    return join(run.w, s), report


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
