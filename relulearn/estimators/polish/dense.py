"""Exact refinement of a one-hidden-layer ReLU network (docs/design.md §6, ``polish``).

Once the activation pattern ``1{<u_i, x> > 0}`` of every unit is known on a sample, the
output ``y = Σ_i λ_i relu(<u_i, x>) = Σ_i 1{<u_i,x> > 0} <w_i, x>`` is linear in the
products ``w_i = λ_i u_i``. Polish fixes the patterns on samples away from every unit's
boundary, solves that least-squares problem for all ``w_i`` at once, refreshes the
patterns, and repeats until they stop changing. On noiseless labels this reaches machine
precision.
"""

from __future__ import annotations

import numpy as np

from ... import progress
from ...network import Network
from .cg import matrix_free, polish_outputs_cg, start_rows, trusted_samples
from .products import RCOND_NORMAL, ProductsSystem, solve_normal
from .report import PolishReport

__all__ = ["PolishReport", "polish", "polish_outputs", "least_squares", "RCOND_NORMAL"]

#: a polish with a ``stall`` window stops once its best residual is above this fraction of its value that many
#: steps before: measured on a float32 teacher's lifted route (d = 10, width 32), polishes at the labels' floor
#: kept it to 4 digits for 25 steps, and one far off lost under 1 % a step for 25 steps
STALL_GAIN = 0.95


def least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The minimum-norm least-squares solution of ``a s ≈ b`` for a tall design ``a`` (n × p, n ≫ p).

    By the normal equations: ``aᵀa`` is one symmetric BLAS-3 product (``n p²`` flops; numpy's SVD-based
    ``lstsq`` spends ten times as long at n = 20,000, p = 266), solved on its eigenvectors with eigenvalues
    above :data:`RCOND_NORMAL` of the largest (by its Cholesky factor where none is below:
    :func:`.polish.products.solve_normal`), then refined once on the residual ``b − a s``: a refinement
    step multiplies the error by ``cond(a)² ε``, so wherever the design's kept directions have ``cond(a)`` under
    about 10⁶ the solution is as accurate as a QR's, and noiseless labels are fitted to their rounding.

    Parameters
    ----------
    a
        ``(n, p)`` design.
    b
        ``(n,)`` labels.

    Returns
    -------
    np.ndarray
        ``(p,)``.
    """
    return solve_normal(a.T @ a, a.T @ b, lambda s: a.T @ (b - a @ s))


def _split(net: Network) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Hidden rows (``[u_i, b_i]`` with biases), output weights, and the output bias (None: bias-free)."""
    if net.depth != 1 or net.output_dim != 1 or net.activation != "relu":
        raise ValueError("polish applies to one-hidden-layer ReLU networks with one output")
    if net.biases is None:
        return net.weights[0], net.weights[1][0], None
    return np.column_stack([net.weights[0], net.biases[0]]), net.weights[1][0], float(net.biases[1][0])


def _polished(dirs: np.ndarray, lam: np.ndarray, c: float | None, d_in: int) -> Network:
    """The network of unit rows ``dirs`` (``[u_i, b_i]`` with an output bias ``c``) and output weights ``lam``."""
    lam_out = lam[None, :]
    if c is not None:
        return Network((dirs[:, :d_in], lam_out), (dirs[:, d_in], np.array([c])), activation="relu")
    return Network((dirs, lam_out), activation="relu")


def polish(
    net: Network,
    x: np.ndarray,
    y: np.ndarray,
    *,
    margin: float = 1e-3,
    max_iter: int = 30,
    affine: bool = False,
    stall: int | None = None,
) -> tuple[Network, PolishReport]:
    """Refine ``net`` on samples ``(x, y)`` by alternating pattern fixing and least squares.

    Parameters
    ----------
    net
        Starting network (one hidden ReLU layer, one output, with or without biases); its
        output weights' signs are kept. With biases, units act on ``[x, 1]`` and the output
        bias is solved for with the products.
    x, y
        Samples, ``(n, d)`` and ``(n,)``; ``n`` should exceed ``k·d`` several times.
    margin
        Samples with ``|<u_i, x>| < margin`` for some unit (unit ``u_i``) are left out:
        their patterns are not trusted.
    max_iter
        Bound on the number of pattern refreshes.
    affine
        Fit a free linear term ``Lᵀx`` beside the units (and an output bias, which it implies): then a unit
        held as ``relu(−s)`` where the labels have ``relu(s) = relu(−s) + s`` is still fitted exactly, so
        units whose orientation is not known yet converge; ``L`` is returned in the report (``linear``) and is
        not part of the network.
    stall
        Stop (``stop_reason`` ``"stalled"``) once the best residual is more than :data:`STALL_GAIN` of what it was
        ``stall`` steps before: at the labels' floor (a float32 model's rounding, where boundary samples keep
        flipping and no fixed point comes) or far from the answer, further steps gain nothing. None: never.

    Returns
    -------
    (Network, PolishReport)
        The refined network, with unit-norm hidden rows (``[u_i, b_i]`` with biases), and a report.
    """
    if affine and net.biases is None:
        net = Network(net.weights, (np.zeros(len(net.weights[0])), np.zeros(1)), activation=net.activation)
    u, lam, c = _split(net)
    biased = c is not None
    d_in = x.shape[1]
    if biased:  # a unit relu(u·x + b) is relu(ũ·x̃) on x̃ = [x, 1]; the output bias is one more unknown
        x = np.column_stack([x, np.ones(len(x))])
    u, lam = u[lam != 0], lam[lam != 0]
    k, d = u.shape
    sign = np.sign(lam)
    dirs = u / np.linalg.norm(u, axis=1, keepdims=True)
    y_norm = float(np.linalg.norm(y)) or 1.0

    lin = np.zeros(d_in)

    def residual(dirs_: np.ndarray, w_: np.ndarray, c_: float | None, lin_: np.ndarray) -> float:
        pred = np.maximum(x @ dirs_.T, 0.0) @ (sign * np.linalg.norm(w_, axis=1))
        return float(np.linalg.norm(y - pred - (c_ or 0.0) - x[:, :d_in] @ lin_) / y_norm)

    w = (lam * np.linalg.norm(u, axis=1))[:, None] * dirs
    best = (residual(dirs, w, c, lin), dirs, w, c, lin)
    bests = [best[0]]  # the best residual after each step (the start first)
    seen: set[bytes] = set()
    changes: list[int] = []
    prev = None
    stop, used, it = "max_iter", 0, 0
    system = ProductsSystem(x, k, biased, affine, d_in)
    proj = x @ dirs.T  # (n, k): each step's projections, from the directions the step before left
    for it in range(1, max_iter + 1):
        progress.step("exact polish: Gauss–Newton steps", it - 1, max_iter)
        trusted = np.all(np.abs(proj) >= margin, axis=1)
        used = int(trusted.sum())
        if used < system.unknowns:
            raise ValueError(
                f"polish needs more than {system.unknowns} samples (the unknowns) away from the unit boundaries; "
                f"got {used}"
            )
        sol = system.solve(trusted, proj > 0, y)
        w = sol[: k * d].reshape(k, d)
        c = float(sol[k * d]) if biased else None
        lin = sol[k * d + 1 :] if affine else lin
        norms = np.linalg.norm(w, axis=1)
        alive = norms > 0
        dirs = np.where(alive[:, None], sign[:, None] * w / np.where(alive, norms, 1.0)[:, None], dirs)
        res = residual(dirs, w, c, lin)
        if res < best[0]:
            best = (res, dirs, w, c, lin)
        bests.append(best[0])
        if stall is not None and len(bests) > stall and bests[-1] > STALL_GAIN * bests[-1 - stall]:
            stop = "stalled"
            break
        proj = x @ dirs.T
        full_pattern = proj > 0
        if prev is not None:
            changes.append(int((full_pattern != prev).sum()))
            if changes[-1] == 0:
                stop = "fixed point"
                break
        key = np.packbits(full_pattern).tobytes()
        if key in seen:  # with noisy labels a few boundary samples can cycle forever
            stop = "cycle"
            break
        seen.add(key)
        prev = full_pattern
    res, dirs, w, c, lin = best
    out = _polished(dirs, sign * np.linalg.norm(w, axis=1), c, d_in)
    return out, PolishReport(
        it, stop != "max_iter", res, used, tuple(changes), stop, lin[None, :].copy() if affine else None
    )


def polish_and_select(
    start: Network, x: np.ndarray, y: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, report: dict
) -> tuple[str, Network]:
    """``start`` and its :func:`polish`, whichever has the lower held-out relative loss.

    Records in ``report``: ``polish`` (its :class:`PolishReport`, or the error that stopped
    it), ``validation_relative_loss`` of each and ``chosen`` (``"enumeration"`` or ``"polish"``).
    """
    candidates = {"enumeration": start}
    try:
        polished, prep = polish(start, x, y)
        candidates["polish"] = polished
        report["polish"] = prep.__dict__
    except (ValueError, np.linalg.LinAlgError) as err:
        report["polish"] = {"error": str(err)}
    y2 = float(np.mean(y_val**2)) or 1.0
    losses = {k: float(np.mean((y_val - n.forward(x_val)[:, 0]) ** 2) / y2) for k, n in candidates.items()}
    best = min(losses, key=losses.__getitem__)
    report["validation_relative_loss"] = losses
    report["chosen"] = best
    return best, candidates[best]


def refinement_verdict(y_val: np.ndarray, before: np.ndarray, after: np.ndarray) -> tuple[float, bool]:
    """Whether a refined network may replace the one it started from, on held-out samples: the paired
    change of the squared error, relative to ``mean(y²)``, and ``True`` unless that change is more than two
    standard errors above zero (``before``/``after``: the two networks' predictions of ``y_val``)."""
    diff = (y_val - after) ** 2 - (y_val - before) ** 2
    y2 = float(np.mean(y_val**2)) or 1.0
    return float(np.mean(diff)) / y2, bool(np.mean(diff) <= 2 * np.std(diff) / np.sqrt(len(diff)))


def polish_outputs(
    net: Network, x: np.ndarray, y: np.ndarray, *, margin: float = 1e-3, max_iter: int = 30, affine: bool = False
) -> tuple[Network, PolishReport]:
    """Refine a one-hidden-layer ReLU network with ``m ≥ 1`` outputs and biases on samples ``(x, y)``.

    With several outputs the label is no longer linear in one product per unit (the hidden rows are shared by
    every output), so each step is a Gauss–Newton step on all parameters at once — hidden rows ``[u_i, b_i]``,
    output weights ``A`` (m × k) and output biases — with the activation patterns fixed on the samples away
    from every unit's boundary, then the patterns are refreshed. The model is bilinear once the patterns are
    fixed, and the steps converge quadratically near the answer: noiseless labels reach machine precision.
    The normal matrix is summed output by output (``n·p²`` flops per output, ``p = k(d+1) + m(k+1)``); where
    that costs more than conjugate gradients would, and always past :data:`.polish.cg.DENSE_UNKNOWNS` unknowns
    (:func:`.polish.cg.matrix_free`), each step is solved matrix-free instead
    (:func:`.polish.cg.polish_outputs_cg`: ``4ndk`` flops per conjugate-gradient iteration, no ``p × p`` matrix).

    Parameters
    ----------
    net
        Start (one hidden ReLU layer; with or without biases, which are learned either way).
    x, y
        ``(n, d)`` and ``(n, m)`` (or ``(n,)``) samples; ``n`` should exceed the unknowns several times.
    margin, max_iter, affine
        As for :func:`polish` (``affine``: a free linear term ``L x``, ``L`` m × d, in the report).

    Returns
    -------
    (Network, PolishReport)
        The network with unit-norm hidden rows ``[u_i, b_i]`` and its output biases, and the report.
    """
    y, xt, h, a, c = start_rows(net, x, y)
    (n, m), (k, d1) = y.shape, h.shape
    d = d1 - 1
    p = k * d1 + m * k + m + (m * d if affine else 0)
    if matrix_free(p, m):
        return polish_outputs_cg(net, x, y, margin=margin, max_iter=max_iter, affine=affine)
    lin = np.zeros((m, d))
    if n < 2 * p:
        raise ValueError(f"polish needs more than {2 * p} samples (twice the unknowns); got {n}")
    y_norm = float(np.linalg.norm(y)) or 1.0

    def predict(h_: np.ndarray, a_: np.ndarray, c_: np.ndarray, lin_: np.ndarray) -> np.ndarray:
        return np.maximum(xt @ h_.T, 0.0) @ a_.T + c_ + x @ lin_.T

    def residual(h_: np.ndarray, a_: np.ndarray, c_: np.ndarray, lin_: np.ndarray) -> float:
        return float(np.linalg.norm(y - predict(h_, a_, c_, lin_)) / y_norm)

    best = (residual(h, a, c, lin), h, a, c, lin)
    changes: list[int] = []
    prev = None
    stop, used, it = "max_iter", 0, 0
    for it in range(1, max_iter + 1):
        progress.step("exact polish: Gauss–Newton steps", it - 1, max_iter)
        proj, trusted = trusted_samples(xt, h, margin)
        used = int(trusted.sum())
        if used < 2 * p:
            raise ValueError(f"polish needs more than {2 * p} samples away from the unit boundaries; got {used}")
        xs, pat = xt[trusted], (proj[trusted] > 0).astype(np.float64)
        act = proj[trusted] * pat
        r = y[trusted] - act @ a.T - c - xs[:, :d] @ lin.T
        gram = np.zeros((p, p))
        rhs = np.zeros(p)
        for j in range(m):  # J_j = [A_ji P_i x̃ | relu(·) in output j's columns | 1 in c_j]
            jac = np.zeros((used, p))
            jac[:, : k * d1] = ((pat * a[j])[:, :, None] * xs[:, None, :]).reshape(used, k * d1)
            jac[:, k * d1 + j * k : k * d1 + (j + 1) * k] = act
            jac[:, k * d1 + m * k + j] = 1.0
            if affine:
                jac[:, k * d1 + m * k + m + j * d : k * d1 + m * k + m + (j + 1) * d] = xs[:, :d]
            gram += jac.T @ jac
            rhs += jac.T @ r[:, j]
        # the rescaling (u, b, A) -> (s u, s b, A / s) leaves the model unchanged: the normal matrix has a
        # k-dimensional null space, so the step is the minimum-norm solution
        step = np.linalg.lstsq(gram, rhs, rcond=1e-13)[0]
        h = h + step[: k * d1].reshape(k, d1)
        a = a + step[k * d1 : k * d1 + m * k].reshape(m, k)
        c = c + step[k * d1 + m * k : k * d1 + m * k + m]
        if affine:
            lin = lin + step[k * d1 + m * k + m :].reshape(m, d)
        norms = np.linalg.norm(h, axis=1)
        h, a = h / norms[:, None], a * norms[None, :]
        res = residual(h, a, c, lin)
        stalled = res >= 0.5 * best[0]  # Gauss–Newton gains far more than this per step until it converges
        if res < best[0]:
            best = (res, h, a, c, lin)
        full = (xt @ h.T) > 0
        if prev is not None:
            changes.append(int((full != prev).sum()))
            if changes[-1] == 0 and stalled:
                stop = "fixed point"
                break
        prev = full
    res, h, a, c, lin = best
    out = Network((h[:, :-1].copy(), a.copy()), (h[:, -1].copy(), c.copy()), activation="relu")
    return out, PolishReport(it, stop != "max_iter", res, used, tuple(changes), stop, lin.copy() if affine else None)
