"""Deep bias-free ReLU networks fitted inside a found subspace.

After the spectral stage has found an orthonormal basis ``B`` (``d × r``, ``r`` small) of the
relevant subspace, the samples are projected, ``z = x B`` (``n × r``), and the labels follow a
deep bias-free ReLU network of ``z``. This module fits candidate networks on ``(z, y)``:

1. **Enumeration.** Architectures up to a given depth and width (:func:`architectures`) times
   a number of random starts, each start a point of a net inside a norm ball of weights
   (:func:`init_network`). The count is checked against a budget before any work
   (:class:`CandidateBudgetError`).
2. **Screen.** Every candidate is fitted by local optimisation (:func:`fit_network`,
   L-BFGS-B on the mean squared error with an exact backprop gradient) for a few hundred
   iterations on a subsample of the training rows; batches of candidates go through a
   ``mapper`` (builtin ``map`` in tests, a Dask client's map in a run).
3. **Refine.** The best few by held-out loss are fitted further on all training rows.

The answer is the list of candidates sorted by held-out loss; :func:`lift` composes a fitted
network with the basis to act on ``x ∈ R^d``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...network import Network
from .deep_local import _fit_network, _single_thread, fit_network, relative_loss, relative_loss_of

__all__ = [
    "CandidateBudgetError",
    "architectures",
    "candidate_count",
    "check_budget",
    "Candidate",
    "init_network",
    "fit_network",
    "fit_candidates",
    "FitStages",
    "lift",
    "relative_loss",
    "relative_loss_of",
    "fit_batch",
]

Mapper = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]

#: candidates per mapped task (at most; batches are interleaved over the candidate list so
#: that every task holds a mix of small and large architectures)
TASK_CANDIDATES = 4
#: default radius of the norm ball of random starts, a multiple of each layer's expected
#: Frobenius norm under the He-scaled Gaussian draw
INIT_RADIUS = 1.5


class CandidateBudgetError(ValueError):
    """More candidate networks (architectures × starts) than the budget allows."""


def _rng(*key: int) -> np.random.Generator:
    """Seeded generator keyed by a tuple of non-negative ints (no global state)."""
    return np.random.default_rng([int(k) for k in key])


# ------------------------------------------------------------------ enumeration


def architectures(depth: int, width: int) -> list[tuple[int, ...]]:
    """Hidden-layer widths to enumerate.

    For every depth ``j`` in ``1..depth``, uniform widths ``w`` of the geometric ladder
    ``{width, width//2, width//4, ...}`` down to ``≥ 2`` (always including ``width``; for
    ``width == 1`` just ``(1,)*j``).

    Parameters
    ----------
    depth
        Largest number of hidden layers (``≥ 1``).
    width
        Largest hidden width (``≥ 1``).

    Returns
    -------
    list of tuple of int
        ``(w,)*j``, ordered by depth, then width ascending.
    """
    depth, width = int(depth), int(width)
    if depth < 1:
        raise ValueError(f"depth must be >= 1 hidden layer, got {depth}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    ladder = [width]
    w = width // 2
    while w >= 2:
        ladder.append(w)
        w //= 2
    ladder.sort()
    return [(w,) * j for j in range(1, depth + 1) for w in ladder]


def candidate_count(depth: int, width: int, starts: int) -> int:
    """Number of candidate networks: ``len(architectures(depth, width)) * starts``."""
    if int(starts) < 1:
        raise ValueError(f"starts must be >= 1, got {starts}")
    return len(architectures(depth, width)) * int(starts)


def check_budget(depth: int, width: int, starts: int, budget: int) -> int:
    """The candidate count of ``(depth, width, starts)``; :class:`CandidateBudgetError` when it
    exceeds ``budget`` (callers check before drawing samples or fitting anything)."""
    count = candidate_count(depth, width, starts)
    if count > budget:
        raise CandidateBudgetError(_budget_message(int(depth), int(width), int(starts), count, int(budget)))
    return count


def _budget_message(depth: int, width: int, starts: int, count: int, budget: int) -> str:
    n_arch = count // starts
    return (
        f"--depth {depth} --width {width} gives {count} candidates ({n_arch} architectures x {starts} "
        f"random starts) over the budget of {budget}: lower --depth or --width (or the number of starts), "
        f"or raise --budget to at least {count}"
    )


# ------------------------------------------------------------------ candidates


@dataclass(frozen=True)
class Candidate:
    """One fitted candidate network.

    Attributes
    ----------
    widths
        Hidden widths.
    start
        Index of the random start.
    network
        Bias-free ReLU network on the ``r``-dimensional input ``z`` (``weights[0]`` has shape
        ``(widths[0], r)``), one output, in the scale of ``y``.
    train_loss
        Relative loss ``mean((y − f)²) / mean(y²)`` on the training rows it was fitted on
        (the screening subsample, or all training rows once refined).
    val_loss
        Relative loss on the validation sample.
    iterations
        L-BFGS iterations spent (screen plus refinement).
    refined
        Whether the candidate was refined on all training rows.
    """

    widths: tuple[int, ...]
    start: int
    network: Network
    train_loss: float
    val_loss: float
    iterations: int
    refined: bool = False

    def to_dict(self) -> dict:
        """JSON-ready summary (widths, start, losses, iterations; not the weights)."""
        return {
            "widths": [int(w) for w in self.widths],
            "start": int(self.start),
            "train_loss": float(self.train_loss),
            "val_loss": float(self.val_loss),
            "iterations": int(self.iterations),
            "refined": bool(self.refined),
        }


def init_network(widths: tuple[int, ...], r: int, seed: int, start: int, radius: float = INIT_RADIUS) -> Network:
    """A random start on a net inside a norm ball of weights.

    Hidden layers are He-scaled Gaussian (std ``sqrt(2/fan_in)``), the output layer has std
    ``sqrt(1/fan_in)``. Every layer is then scaled, if needed, into the ball whose
    Frobenius radius is ``radius`` times the layer's expected norm
    (``sqrt(fan_out · fan_in · var)``): the starts are random points of a product of norm
    balls, a net of it with high probability once there are enough of them.

    Parameters
    ----------
    widths
        Hidden widths (``≥ 1`` each, at least one layer).
    r
        Input dimension.
    seed, start
        The weights are a function of ``(seed, r, widths, start)`` only
        (``np.random.default_rng([seed, 31, r, start, len(widths), *widths])``).
    radius
        Radius of the ball, relative to the expected layer norm (``> 0``).

    Returns
    -------
    Network
        Bias-free ReLU network ``R^r -> R``.
    """
    widths = tuple(int(w) for w in widths)
    if not widths or min(widths) < 1:
        raise ValueError(f"widths must be a non-empty tuple of positive hidden widths, got {widths}")
    if int(r) < 1:
        raise ValueError(f"input dimension r must be >= 1, got {r}")
    if not radius > 0:
        raise ValueError(f"radius must be > 0, got {radius}")
    rng = _rng(seed, 31, r, start, len(widths), *widths)
    dims = (int(r),) + widths + (1,)
    ws = []
    for j in range(len(dims) - 1):
        fan_in, fan_out = dims[j], dims[j + 1]
        var = (1.0 if j == len(dims) - 2 else 2.0) / fan_in
        w = rng.standard_normal((fan_out, fan_in)) * math.sqrt(var)
        limit = radius * math.sqrt(fan_out * fan_in * var)
        norm = float(np.linalg.norm(w))
        if norm > limit:
            w *= limit / norm
        ws.append(w)
    return Network(tuple(ws))


# ------------------------------------------------------------------ mapped tasks


def fit_batch(args: tuple) -> list[tuple[tuple[np.ndarray, ...], float, float, int]]:
    """Fit a batch of candidates (top-level, for a mapper).

    Parameters
    ----------
    args
        ``(z, y, z_val, y_val, starts, max_iter, tol)`` where ``starts`` is a list of weight
        tuples (bias-free relu networks in the scale of ``y``).

    Returns
    -------
    list
        Per start, ``(weights, train_loss, val_loss, iterations)``.
    """
    z, y, z_val, y_val, starts, max_iter, tol = args
    out = []
    with _single_thread():
        for weights in starts:
            net, info = _fit_network(Network(tuple(weights)), z, y, max_iter=max_iter, tol=tol)
            out.append((net.weights, info["loss"], relative_loss(net, z_val, y_val), info["iterations"]))
    return out


def _run_batches(
    mapper: Mapper, z, y, z_val, y_val, nets: list[tuple[np.ndarray, ...]], max_iter: int, tol: float, per_task: int
) -> list[tuple[tuple[np.ndarray, ...], float, float, int]]:
    """Fit ``nets`` through ``mapper`` in interleaved batches of at most ``per_task``; results
    in the order of ``nets``."""
    if not nets:
        return []
    n_tasks = math.ceil(len(nets) / max(1, per_task))
    groups = [list(range(b, len(nets), n_tasks)) for b in range(n_tasks)]
    jobs = [(z, y, z_val, y_val, [nets[i] for i in g], max_iter, tol) for g in groups]
    parts = list(mapper(fit_batch, jobs))
    if len(parts) != len(jobs):
        raise RuntimeError(f"mapper returned {len(parts)} results for {len(jobs)} batches")
    out: list = [None] * len(nets)
    for g, part in zip(groups, parts):
        if len(part) != len(g):
            raise RuntimeError(f"a batch of {len(g)} candidates returned {len(part)} results")
        for i, res in zip(g, part):
            out[i] = res
    return out


@dataclass(frozen=True)
class FitStages:
    """The two stages of :func:`fit_candidates`.

    Attributes
    ----------
    screen_samples, screen_iter
        Stage 1: every candidate is fitted for ``screen_iter`` iterations on the first
        ``screen_samples`` training rows.
    refine, refine_iter
        Stage 2: the ``refine`` best by validation loss are fitted further on all training
        rows for ``refine_iter`` iterations.
    """

    screen_samples: int = 20_000
    screen_iter: int = 300
    refine: int = 3
    refine_iter: int = 3000


def fit_candidates(
    z: np.ndarray,
    y: np.ndarray,
    z_val: np.ndarray,
    y_val: np.ndarray,
    *,
    depth: int,
    width: int,
    starts: int = 6,
    budget: int = 256,
    mapper: Mapper = map,
    seed: int = 0,
    stages: FitStages = FitStages(),
    warm: Sequence[Network] = (),
) -> list[Candidate]:
    """Fit candidate deep ReLU networks on projected samples; best by validation loss first.

    Parameters
    ----------
    z, y
        Training rows ``(n, r)`` and labels ``(n,)``.
    z_val, y_val
        Validation rows and labels (selection).
    depth, width
        Architectures :func:`architectures` ``(depth, width)`` are enumerated.
    starts
        Random starts (:func:`init_network`) per architecture.
    budget
        Bound on ``candidate_count(depth, width, starts)``; checked before any work.
    mapper
        ``mapper(fn, iterable) -> iterable`` with the semantics of the builtin ``map``; called
        with :func:`fit_batch` and one tuple of numpy arrays and ints per batch of at most
        ``TASK_CANDIDATES`` candidates. Results are used in order, so any mapper gives the
        same (bitwise) answer.
    seed
        Seed of the random starts.
    stages
        The sizes of the screen and of the refinement (:class:`FitStages`).
    warm
        Networks on the same ``r`` coordinates that start from where an earlier fit ended (the last
        round's best network, re-expressed on an extended basis): each skips the screen and is fitted
        on all training rows in stage 2, besides the ``refine`` best. Their candidates have
        ``start = -1, -2, …``.

    Returns
    -------
    list of Candidate
        All candidates sorted by validation loss (best first; ties by enumeration order).

    Notes
    -----
    The defaults were tuned on planted bias-free teachers in ``r = 3, 4`` (depth 2–3, widths
    ≤ 8, 50 000 training rows, ``width=8``): the final loss depends mostly on the start (a
    start either reaches ``1e-5 .. 1e-9`` or stalls on a plateau near ``1e-4``), so six starts
    per architecture, a short screen and three long refinements, each of which stops on a plateau
    (:data:`~relulearn.estimators.filtered_pca.deep_local.PLATEAU`) rather than creep on to ``refine_iter``;
    about 10–50 s on one core.

    Raises
    ------
    CandidateBudgetError
        When there are more candidates than ``budget`` (before any fitting).
    ValueError
        On inconsistent shapes or parameters.
    """
    check_budget(depth, width, starts, budget)
    z, y, z_val, y_val = _checked_rows(z, y, z_val, y_val)
    if stages.screen_samples < 1 or stages.screen_iter < 0 or stages.refine < 0 or stages.refine_iter < 0:
        raise ValueError("screen_samples must be >= 1 and screen_iter, refine, refine_iter >= 0")
    r = z.shape[1]
    if any(net.input_dim != r or net.output_dim != 1 or net.biases is not None for net in warm):
        raise ValueError(f"a warm start must be a bias-free network on the {r} coordinates with one output")
    keys = [(w, s) for w in architectures(depth, width) for s in range(int(starts))]
    nets = _random_starts(keys, r, seed, y)
    n_s = min(len(z), int(stages.screen_samples))
    screened = _run_batches(
        mapper, z[:n_s], y[:n_s], z_val, y_val, nets, int(stages.screen_iter), 1e-12, TASK_CANDIDATES
    )
    order = sorted(range(len(keys)), key=lambda i: (_nan_last(screened[i][2]), i))
    chosen = order[: int(stages.refine)]
    for j, net in enumerate(warm):  # already fitted: no screen, always refined
        keys.append((tuple(int(w.shape[0]) for w in net.weights[:-1]), -1 - j))
        screened.append((net.weights, relative_loss(net, z[:n_s], y[:n_s]), relative_loss(net, z_val, y_val), 0))
        chosen.append(len(keys) - 1)
    results = {i: screened[i] + (False,) for i in range(len(keys))}
    if chosen and stages.refine_iter > 0:
        refined = _run_batches(
            mapper, z, y, z_val, y_val, [screened[i][0] for i in chosen], int(stages.refine_iter), 1e-12, 1
        )  # one long fit per task
        for i, (weights, train, val, it) in zip(chosen, refined):
            results[i] = (weights, train, val, it + screened[i][3], True)
    cands = [
        Candidate(
            widths=keys[i][0],
            start=keys[i][1],
            network=Network(tuple(results[i][0])),
            train_loss=float(results[i][1]),
            val_loss=float(results[i][2]),
            iterations=int(results[i][3]),
            refined=bool(results[i][4]),
        )
        for i in range(len(keys))
    ]
    ranked = sorted(range(len(cands)), key=lambda i: (_nan_last(cands[i].val_loss), i))
    return [cands[i] for i in ranked]


def _checked_rows(
    z: np.ndarray, y: np.ndarray, z_val: np.ndarray, y_val: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The training and validation rows and labels as contiguous float64 arrays, their shapes checked."""
    z = np.ascontiguousarray(z, dtype=np.float64)
    y = np.ascontiguousarray(np.asarray(y, dtype=np.float64).ravel())
    z_val = np.ascontiguousarray(z_val, dtype=np.float64)
    y_val = np.ascontiguousarray(np.asarray(y_val, dtype=np.float64).ravel())
    if z.ndim != 2 or len(z) != len(y) or len(z) == 0:
        raise ValueError(f"z must be (n, r) with n >= 1 rows and y (n,), got {z.shape} and {y.shape}")
    if z_val.ndim != 2 or z_val.shape[1] != z.shape[1] or len(z_val) != len(y_val) or len(z_val) == 0:
        raise ValueError(
            f"z_val must be (m, {z.shape[1]}) with m >= 1 rows and y_val (m,), got {z_val.shape} and {y_val.shape}"
        )
    return z, y, z_val, y_val


def _random_starts(
    keys: list[tuple[tuple[int, ...], int]], r: int, seed: int, y: np.ndarray
) -> list[tuple[np.ndarray, ...]]:
    """The start of each ``(widths, start)`` key (:func:`init_network`), its last layer on the scale of ``y``."""
    rms = math.sqrt(float(y @ y) / len(y))
    scale = rms if rms > 0 else 1.0
    nets = []
    for widths, s in keys:
        ws = list(init_network(widths, r, seed, s).weights)
        ws[-1] = ws[-1] * scale  # start on the scale of y
        nets.append(tuple(ws))
    return nets


def _nan_last(v: float) -> float:
    return v if math.isfinite(v) else math.inf


# ------------------------------------------------------------------ lifting


def lift(net: Network, basis: np.ndarray) -> Network:
    """Compose the first layer with the basis: ``W0' = W0 Bᵀ``.

    ``basis`` is ``d × r`` with orthonormal columns; the lifted network acts on ``x ∈ R^d``
    and ``lift(net, B).forward(x) == net.forward(x @ B)`` (up to rounding: ``(W0 Bᵀ) x`` vs
    ``W0 (Bᵀ x)``).
    """
    b = np.asarray(basis, dtype=np.float64)
    if b.ndim != 2 or b.shape[1] != net.input_dim:
        raise ValueError(f"basis must be (d, {net.input_dim}) (one column per input of the network), got {b.shape}")
    ws = (net.weights[0] @ b.T,) + tuple(net.weights[1:])
    return Network(ws, net.biases, net.activation)
