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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..network import Network

__all__ = [
    "CandidateBudgetError",
    "architectures",
    "candidate_count",
    "check_budget",
    "Candidate",
    "init_network",
    "fit_network",
    "fit_candidates",
    "lift",
    "relative_loss",
    "fit_batch",
]

Mapper = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]

#: candidates per mapped task (at most; batches are interleaved over the candidate list so
#: that every task holds a mix of small and large architectures)
TASK_CANDIDATES = 4
#: L-BFGS memory (correction pairs): the fits are ill-conditioned (positive rescaling of
#: units, near-degenerate kinks); a longer memory than scipy's default 10 converges faster
MAXCOR = 50
#: rows per block of the vectorised forward/backward pass
_BLOCK = 4096
#: default radius of the norm ball of random starts, a multiple of each layer's expected
#: Frobenius norm under the He-scaled Gaussian draw
INIT_RADIUS = 1.5
#: a fit stops on a plateau: when its last ``PLATEAU[0]`` iterations lowered the loss by less than the
#: fraction ``PLATEAU[1]``. A start that stalls creeps on for thousands of iterations (measured on a depth-3
#: teacher: 1.6 % lower after 1,500 more iterations of 3,000); a fit that converges stops on L-BFGS-B's own
#: tolerances first
PLATEAU = (200, 3e-3)


class CandidateBudgetError(ValueError):
    """More candidate networks (architectures × starts) than the budget allows."""


def _rng(*key: int) -> np.random.Generator:
    """Seeded generator keyed by a tuple of non-negative ints (no global state)."""
    return np.random.default_rng([int(k) for k in key])


def _single_thread():
    """Single-threaded BLAS: the products are small (``n × width``), and threaded BLAS on small
    products collapses on a loaded machine; parallelism comes from the mapper."""
    from ..aligned import one_blas_thread

    return one_blas_thread()


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


# ------------------------------------------------------------------ loss and gradient


def _check_relu(net: Network) -> None:
    if net.activation != "relu":
        raise ValueError(f"deep fitting supports activation 'relu' only, got {net.activation!r}")
    if net.biases is not None:
        raise ValueError("deep fitting fits bias-free networks; got a network with biases")
    if net.output_dim != 1:
        raise ValueError(f"deep fitting fits networks with one output, got output_dim={net.output_dim}")


def _pack(ws: Iterable[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in ws])


def _unpack(theta: np.ndarray, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    out, i = [], 0
    for s in shapes:
        size = s[0] * s[1]
        out.append(theta[i : i + size].reshape(s))
        i += size
    return out


def _forward(ws: list[np.ndarray], z: np.ndarray) -> np.ndarray:
    h = z
    for w in ws[:-1]:
        h = h @ w.T
        np.maximum(h, 0.0, out=h)
    return (h @ ws[-1].T)[:, 0]


def _loss_grad(
    theta: np.ndarray, zt: np.ndarray, y: np.ndarray, shapes: list[tuple[int, int]]
) -> tuple[float, np.ndarray]:
    """``mean((f − y)²)`` and its exact gradient by backpropagation.

    ``zt`` is the *transposed* sample, ``(r, n)``: activations are held as ``(width, rows)``
    so that every product is ``(width × width) @ (width × rows)`` and every elementwise
    operation runs along contiguous rows. The rows are processed in blocks of ``_BLOCK``
    columns (vectorised within a block; a block's intermediates stay in cache, which is
    several times faster than whole-sample arrays). The subgradient of relu at 0 is 0.
    """
    ws = _unpack(theta, shapes)
    n = zt.shape[1]
    wl = ws[-1][0]
    grads = [np.zeros(s) for s in shapes]
    total = 0.0
    for start in range(0, n, _BLOCK):
        zb = zt[:, start : start + _BLOCK]
        hs = [zb]  # inputs of every layer (post-activation), (dim_j, block)
        h = zb
        for w in ws[:-1]:
            h = w @ h
            np.maximum(h, 0.0, out=h)
            hs.append(h)
        e = wl @ h
        e -= y[start : start + _BLOCK]
        total += float(e @ e)
        grads[-1][0] += h @ e
        # d f / d pre-activation of the last hidden layer times the residual: the outer product, masked where
        # the unit is off (one write and one masked multiply; the same numbers as masking the weights first)
        delta = np.multiply.outer(wl, e)
        delta *= h > 0
        for j in range(len(ws) - 2, -1, -1):
            grads[j] += delta @ hs[j].T
            if j > 0:
                delta = ws[j].T @ delta
                delta *= hs[j] > 0
    g = _pack(grads)
    g *= 2.0 / n
    return total / n, g


def relative_loss(net: Network, z: np.ndarray, y: np.ndarray) -> float:
    """``mean((y − f(z))²) / mean(y²)`` (``mean((y − f)²)`` when ``y`` is all zero)."""
    y = np.asarray(y, dtype=np.float64).ravel()
    e = y - _forward(list(net.weights), np.asarray(z, dtype=np.float64))
    yy = float(y @ y)
    return float(e @ e) / (yy if yy > 0 else len(y))


# ------------------------------------------------------------------ local optimisation


def _balance(ws: list[np.ndarray]) -> list[np.ndarray]:
    """Rescale hidden units so that each unit's incoming and outgoing weight norms agree.

    ``relu`` is positively homogeneous, so ``(W_j[i, :] * c, W_{j+1}[:, i] / c)`` is the same
    function for any ``c > 0``; balanced weights condition the optimisation better.
    """
    ws = [w.copy() for w in ws]
    for j in range(len(ws) - 1):
        inc = np.linalg.norm(ws[j], axis=1)
        out = np.linalg.norm(ws[j + 1], axis=0)
        ok = (inc > 0) & (out > 0)
        c = np.ones_like(inc)
        c[ok] = np.sqrt(out[ok] / inc[ok])
        ws[j] *= c[:, None]
        ws[j + 1] /= c[None, :]
    return ws


def fit_network(
    net: Network,
    z: np.ndarray,
    y: np.ndarray,
    *,
    max_iter: int = 500,
    tol: float = 1e-12,
    plateau: tuple[int, float] | None = PLATEAU,
) -> tuple[Network, dict]:
    """Local optimisation of all weights of a bias-free ReLU network on the mean squared error.

    ``scipy.optimize.minimize(method="L-BFGS-B", jac=True)`` with the exact backprop
    gradient, vectorised over all rows. ``y`` is divided by its RMS during the optimisation
    (the output layer likewise), so the objective is the relative loss
    ``mean((y − f)²)/mean(y²)`` whatever the scale of ``y``; the hidden units are balanced
    first (positive rescaling, the same function). Runs under a single-thread BLAS limit.

    Parameters
    ----------
    net
        Starting network (bias-free, relu, one output, input dimension ``z.shape[1]``).
    z, y
        Rows ``(n, r)`` and labels ``(n,)``.
    max_iter
        Bound on the L-BFGS iterations.
    tol
        ``ftol`` and ``gtol`` of L-BFGS-B on the normalised objective (the relative loss).
        L-BFGS-B's ``ftol`` compares the decrease of an iteration with ``max(|f|, 1)``, so
        with a relative loss below 1 the fit stops once an iteration gains less than ``tol``
        in absolute terms (a plateau far below any useful precision).
    plateau
        ``(iterations, fraction)``: the fit also stops once its last ``iterations`` iterations
        lowered the loss by less than ``fraction`` of it (default :data:`PLATEAU`); ``None``
        runs on to ``max_iter``. The iterates up to the stop are those of a fit without it.

    Returns
    -------
    (Network, dict)
        The fitted network (in the scale of ``y``) and ``{"iterations", "loss" (relative, on
        ``(z, y)``), "converged", "message"}``.
    """
    with _single_thread():
        return _fit_network(net, z, y, max_iter=max_iter, tol=tol, plateau=plateau)


class _Plateau:
    """A callback of ``minimize`` that stops the fit once the last ``window`` iterations lowered the loss by
    less than ``fraction`` of it."""

    def __init__(self, window: int, fraction: float):
        if int(window) < 1 or not 0 <= fraction < 1:
            raise ValueError(f"plateau must be (iterations >= 1, fraction in [0, 1)), got {(window, fraction)}")
        self.window, self.keep = int(window), 1.0 - float(fraction)
        self.losses: list[float] = []
        self.stopped = False

    def __call__(self, intermediate_result: Any) -> None:
        self.losses.append(float(intermediate_result.fun))
        if len(self.losses) > self.window and self.losses[-1] > self.keep * self.losses[-1 - self.window]:
            self.stopped = True
            raise StopIteration


def _fit_network(
    net: Network,
    z: np.ndarray,
    y: np.ndarray,
    *,
    max_iter: int,
    tol: float,
    plateau: tuple[int, float] | None = PLATEAU,
) -> tuple[Network, dict]:
    from scipy.optimize import minimize

    _check_relu(net)
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).ravel()
    if z.ndim != 2 or z.shape[1] != net.input_dim or len(z) != len(y):
        raise ValueError(f"fit_network: z must be (n, {net.input_dim}) and y (n,), got {z.shape} and {y.shape}")
    zt = np.ascontiguousarray(z.T)
    rms = math.sqrt(float(y @ y) / len(y)) if len(y) else 0.0
    scale = rms if rms > 0 else 1.0
    ws = [w.copy() for w in net.weights]
    ws[-1] = ws[-1] / scale
    ws = _balance(ws)
    shapes = [w.shape for w in ws]
    ys = y / scale
    theta0 = _pack(ws)
    if max_iter <= 0:
        loss, _ = _loss_grad(theta0, zt, ys, shapes)
        return net, {"iterations": 0, "loss": loss, "converged": False, "message": "max_iter = 0"}
    stop = _Plateau(*plateau) if plateau is not None else None
    res = minimize(
        _loss_grad,
        theta0,
        args=(zt, ys, shapes),
        jac=True,
        method="L-BFGS-B",
        callback=stop,
        options={
            "maxiter": int(max_iter),
            "maxfun": max(15000, 4 * int(max_iter)),
            "ftol": float(tol),
            "gtol": float(tol),
            "maxcor": MAXCOR,
        },
    )
    theta = res.x if np.all(np.isfinite(res.x)) else theta0
    out = _unpack(np.array(theta, dtype=np.float64), shapes)
    loss, _ = _loss_grad(theta, zt, ys, shapes)
    out[-1] = out[-1] * scale
    fitted = Network(tuple(out))
    msg = res.message.decode() if isinstance(res.message, bytes) else str(res.message)
    if stop is not None and stop.stopped:
        msg = f"plateau: the last {stop.window} iterations lowered the loss by less than {1 - stop.keep:.2%}"
    return fitted, {"iterations": int(res.nit), "loss": float(loss), "converged": bool(res.success), "message": msg}


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
    screen_samples: int = 20_000,
    screen_iter: int = 300,
    refine: int = 3,
    refine_iter: int = 3000,
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
    screen_samples, screen_iter
        Stage 1: every candidate is fitted for ``screen_iter`` iterations on the first
        ``screen_samples`` training rows.
    refine, refine_iter
        Stage 2: the ``refine`` best by validation loss are fitted further on all training
        rows for ``refine_iter`` iterations.

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
    (:data:`PLATEAU`) rather than creep on to ``refine_iter``; about 10–50 s on one core.

    Raises
    ------
    CandidateBudgetError
        When there are more candidates than ``budget`` (before any fitting).
    ValueError
        On inconsistent shapes or parameters.
    """
    check_budget(depth, width, starts, budget)
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
    if screen_samples < 1 or screen_iter < 0 or refine < 0 or refine_iter < 0:
        raise ValueError("screen_samples must be >= 1 and screen_iter, refine, refine_iter >= 0")
    r = z.shape[1]
    rms = math.sqrt(float(y @ y) / len(y))
    scale = rms if rms > 0 else 1.0
    keys = [(w, s) for w in architectures(depth, width) for s in range(int(starts))]
    nets = []
    for widths, s in keys:
        ws = list(init_network(widths, r, seed, s).weights)
        ws[-1] = ws[-1] * scale  # start on the scale of y
        nets.append(tuple(ws))
    n_s = min(len(z), int(screen_samples))
    screened = _run_batches(mapper, z[:n_s], y[:n_s], z_val, y_val, nets, int(screen_iter), 1e-12, TASK_CANDIDATES)
    order = sorted(range(len(keys)), key=lambda i: (_nan_last(screened[i][2]), i))
    chosen = order[: int(refine)]
    results = {i: screened[i] + (False,) for i in range(len(keys))}
    if chosen and refine_iter > 0:
        refined = _run_batches(
            mapper, z, y, z_val, y_val, [screened[i][0] for i in chosen], int(refine_iter), 1e-12, 1
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
