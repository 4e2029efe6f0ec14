"""Local fits of deep bias-free ReLU networks: the mean squared error and its exact gradient by
backpropagation, and L-BFGS-B on all weights, stopped by its tolerances, an iteration cap or a plateau.

:mod:`relulearn.estimators.filtered_pca.deepfit` fits its candidate networks with these (its screen and its
refinement); the functions are pure, on numpy arrays, and run under one BLAS thread.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ...network import Network

__all__ = ["MAXCOR", "PLATEAU", "fit_network", "relative_loss", "relative_loss_of"]

#: L-BFGS memory (correction pairs): the fits are ill-conditioned (positive rescaling of
#: units, near-degenerate kinks); a longer memory than scipy's default 10 converges faster
MAXCOR = 50
#: rows per block of the vectorised forward/backward pass
_BLOCK = 4096
#: a fit stops on a plateau: when its last ``PLATEAU[0]`` iterations lowered the loss by less than the
#: fraction ``PLATEAU[1]``. A start that stalls creeps on for thousands of iterations (measured on a depth-3
#: teacher: 1.6 % lower after 1,500 more iterations of 3,000); a fit that converges stops on L-BFGS-B's own
#: tolerances first
PLATEAU = (200, 3e-3)


def _single_thread():
    """Single-threaded BLAS: the products are small (``n × width``), and threaded BLAS on small
    products collapses on a loaded machine; parallelism comes from the mapper."""
    from ...aligned import one_blas_thread

    return one_blas_thread()


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
    return relative_loss_of(y, _forward(list(net.weights), np.asarray(z, dtype=np.float64)))


def relative_loss_of(y: np.ndarray, f: np.ndarray) -> float:
    """``mean((y − f)²) / mean(y²)`` of predictions ``f`` already computed (``mean((y − f)²)`` when ``y`` is all
    zero)."""
    y = np.asarray(y, dtype=np.float64).ravel()
    e = y - np.asarray(f, dtype=np.float64).ravel()
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
