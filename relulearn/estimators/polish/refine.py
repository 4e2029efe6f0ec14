"""Streamed Gauss–Newton (Levenberg–Marquardt) refinement of ``A ≈ U f(V x)`` on many samples.

Minimises ``Σ_n |A_n − U f(V x_n)|²`` over ``(U, V)`` with the normal equations accumulated part
by part over the held-out stream, so memory does not grow with the number of samples and the
parameter error keeps falling like ``σ / √n``. With ``G = f'(X Vᵀ)``, ``F = f(X Vᵀ)`` (n×k) and
``Y = (G[:, :, None] · X[:, None, :])`` reshaped to ``n × k d``, the Gauss–Newton matrix is

    H_VV = (YᵀY) ⊙ kron(UᵀU, 1_{d×d}),   H_UU = I_m ⊗ FᵀF,   H_UV[(j,l),(l',b)] = U_jl' (FᵀY)_{l,(l',b)}

and the gradient ``((R U) ⊙ G)ᵀ X`` (for ``V``), ``Rᵀ F`` (for ``U``) with residual ``R = A − F Uᵀ``:
one GEMM ``YᵀY`` per block, no loop over samples.

Positive homogeneity ``f(s z) = s^c f(z)`` makes ``(u_i, v_i) → (u_i s^{-c}, s v_i)`` an exact
symmetry, so ``H`` has a ``k``-dimensional null space spanned by ``t_i = (v_i in block i of V,
−c u_i in column i of U)`` (``J t_i = 0`` on every sample, and ``gᵀ t_i = 0``). Adding
``μ Σ t_i t_iᵀ`` removes it without changing the step; after each step the ``v_i`` are renormalised
to unit length (moving the scale into ``u_i``), which changes nothing about the network.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ... import progress
from ...network import RELU_POWERS, Network
from ..rectified import activate, derivative

__all__ = ["NormalEquations", "normal_equations", "PartEquations", "refine", "parts", "PART_ROWS", "MAX_ITERATIONS"]

#: rows per streamed part (at most): the accumulated normal equations are ``(kd + mk)²`` whatever the
#: part size, and a part's inputs are ``rows × d``, so memory stays flat in the number of samples
PART_ROWS = 50_000

#: entries (rows × k·d) of the design block ``Y`` formed at a time inside a part (32 MB of float64)
BLOCK_ENTRIES = 4_000_000

#: bytes of part results held at once before they are summed (large k·d: each is (kd + mk)² floats)
WINDOW_BYTES = 512 * 2**20

#: Gauss–Newton iterations at most (each is one pass over the refinement samples); from the
#: exact step's estimate the loss settles in 3–6
MAX_ITERATIONS = 12

#: stop when a step changes the loss by less than this fraction (either way: near the minimum
#: the change is rounding, and a "rejected" step there is no reason to damp and try again)
RELATIVE_DECREASE = 1e-9

#: initial Levenberg–Marquardt damping, relative to ``diag(H)``; ×10 on a rejected step, ÷10 on an accepted one
INITIAL_DAMPING = 1e-6


@dataclass(frozen=True)
class NormalEquations:
    """Sums over samples: Gauss–Newton matrix ``h``, gradient ``g`` (``Jᵀ R``), loss ``Σ|R|²``,
    ``Σ|A|²`` and the count ``n``; parameters ordered ``(vec V, vec U)`` row-major."""

    h: np.ndarray
    g: np.ndarray
    loss: float
    y2: float
    n: int

    def __add__(self, other: NormalEquations) -> NormalEquations:
        return NormalEquations(
            self.h + other.h, self.g + other.g, self.loss + other.loss, self.y2 + other.y2, self.n + other.n
        )


def normal_equations(
    x: np.ndarray, y: np.ndarray, v: np.ndarray, u: np.ndarray, power: int, *, block_entries: int = BLOCK_ENTRIES
) -> NormalEquations:
    """The Gauss–Newton normal equations of ``Σ|y − f(x Vᵀ) Uᵀ|²`` at ``(V, U)`` on one batch.

    Parameters
    ----------
    x, y
        ``(n, d)`` inputs and ``(n, m)`` labels.
    v, u
        ``(k, d)`` hidden and ``(m, k)`` output weights.
    power
        ``c`` of ``f = max(z, 0)^c``.
    block_entries
        Rows of ``Y`` are formed ``block_entries // (k d)`` at a time.

    Returns
    -------
    NormalEquations
    """
    y = y.reshape(len(y), -1)
    k, d = v.shape
    m = u.shape[0]
    kd = k * d
    hvv = np.zeros((kd, kd))
    fy = np.zeros((k, kd))
    ff = np.zeros((k, k))
    gv = np.zeros((k, d))
    gu = np.zeros((m, k))
    loss = y2 = 0.0
    rows = max(1, block_entries // kd)
    for a in range(0, len(x), rows):
        xb, yb = x[a : a + rows], y[a : a + rows]
        z = xb @ v.T
        f, gd = activate(z, power), derivative(z, power)
        r = yb - f @ u.T
        big_y = (gd[:, :, None] * xb[:, None, :]).reshape(len(xb), kd)
        hvv += big_y.T @ big_y
        fy += f.T @ big_y
        ff += f.T @ f
        gv += ((r @ u) * gd).T @ xb
        gu += r.T @ f
        loss += float(np.sum(r * r))
        y2 += float(np.sum(yb * yb))
    utu = u.T @ u
    hvv = (hvv.reshape(k, d, k, d) * utu[:, None, :, None]).reshape(kd, kd)
    huv = np.einsum("jq,lqb->jlqb", u, fy.reshape(k, k, d)).reshape(m * k, kd)
    huu = np.kron(np.eye(m), ff)
    h = np.block([[hvv, huv.T], [huv, huu]])
    return NormalEquations(h, np.concatenate([gv.ravel(), gu.ravel()]), loss, y2, len(x))


@dataclass(frozen=True)
class PartEquations:
    """Picklable function of a part ``(p, n)``: draws it from ``draw`` and returns its normal equations
    (what a mapper runs on a worker)."""

    draw: Any
    v: np.ndarray
    u: np.ndarray
    power: int

    def __call__(self, item: tuple[int, int]) -> NormalEquations:
        # the mapper hands this object, its weights and its draw's teacher over in fresh aligned
        # memory (relulearn.aligned.fresh_call), so every worker does the same arithmetic
        p, n = item
        x, y = self.draw.part(int(p), int(n))
        return normal_equations(x, y, self.v, self.u, self.power)


def parts(total: int, rows: int = PART_ROWS, first: int = 2) -> list[tuple[int, int]]:
    """``(part id, rows)`` covering ``total`` samples in parts of at most ``rows`` (ids from ``first``:
    parts 0 and 1 are the training and validation samples)."""
    count = max(1, -(-int(total) // rows))
    base, extra = divmod(int(total), count)
    return [(first + i, base + (1 if i < extra else 0)) for i in range(count)]


def _window(k: int, d: int, m: int) -> int:
    """Parts mapped at a time: their results (a ``(kd + mk)²`` matrix each) are held until summed,
    so a window is at most ``WINDOW_BYTES`` of them (and at least 2, to keep two workers busy)."""
    p = k * d + m * k
    return max(2, int(WINDOW_BYTES // (8 * p * p)))


def _accumulate(
    draw: Any, items: list[tuple[int, int]], v: np.ndarray, u: np.ndarray, power: int, mapper: Callable
) -> NormalEquations:
    fn = PartEquations(draw, v, u, power)
    step = _window(v.shape[0], v.shape[1], u.shape[0])
    total: NormalEquations | None = None
    for a in range(0, len(items), step):
        window = items[a : a + step]
        results = list(mapper(fn, window))
        if len(results) != len(window):
            raise RuntimeError(f"mapper returned {len(results)} results for {len(window)} parts")
        for r in results:  # in part order, whatever the window: the sum is deterministic
            total = r if total is None else total + r
    assert total is not None  # items (from parts()) is never empty, and each part has its result
    return total


def _normalise(v: np.ndarray, u: np.ndarray, power: int) -> tuple[np.ndarray, np.ndarray]:
    norms = np.linalg.norm(v, axis=1)
    norms = np.where(norms > 0, norms, 1.0)
    return v / norms[:, None], u * norms[None, :] ** power


def _step(eq: NormalEquations, v: np.ndarray, u: np.ndarray, power: int, damping: float) -> np.ndarray:
    k, d = v.shape
    m = u.shape[0]
    h = eq.h
    scale = float(np.trace(h)) / len(h) or 1.0
    t = np.zeros((k, k * d + m * k))
    for i in range(k):  # the scaling symmetry's null directions
        t[i, i * d : (i + 1) * d] = v[i]
        t[i, k * d + np.arange(m) * k + i] = -power * u[:, i]
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    a = h + scale * (t.T @ t) + damping * np.diag(np.maximum(np.diag(h), 1e-12 * scale))
    try:
        return np.linalg.solve(a, eq.g)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(a, eq.g, rcond=None)[0]


def refine(
    net: Network,
    draw: Any,
    total: int,
    *,
    mapper: Callable = map,
    max_iter: int = MAX_ITERATIONS,
    part_rows: int = PART_ROWS,
) -> tuple[Network, dict[str, Any]]:
    """Levenberg–Marquardt on ``(U, V)`` with normal equations streamed over ``total`` held-out samples.

    Parameters
    ----------
    net
        Starting network ``Network((V, U), activation)`` with ``activation`` in relu/relu2/relu3.
    draw
        A :class:`~.base.SampleDraw`; parts ``2, 3, …`` of it are used (the same parts each iteration).
    total
        Number of refinement samples.
    mapper
        ``map``-like; maps :class:`PartEquations` over the parts (results in order).
    max_iter
        Iterations at most (one pass over ``total`` samples each, plus one per rejected step).
    part_rows
        Rows per part.

    Returns
    -------
    (Network, dict)
        The refined network (unit-norm hidden rows) and a report: ``samples``, ``parts``, per
        iteration the relative loss ``Σ|R|²/Σ|A|²``, damping and acceptance, ``converged``.
    """
    power = RELU_POWERS[net.activation]
    v, u = _normalise(*cast(tuple[np.ndarray, np.ndarray], net.weights), power)  # one hidden layer
    items = parts(total, part_rows)
    eq = _accumulate(draw, items, v, u, power, mapper)
    y2 = eq.y2 or 1.0
    history: list[dict[str, Any]] = [{"relative_loss": eq.loss / y2, "accepted": True, "damping": 0.0}]
    damping, converged, passes = INITIAL_DAMPING, False, 1
    k, d = v.shape
    while passes <= max_iter:
        progress.step("refinement: passes over the samples", passes, max_iter + 1, f"relative loss {eq.loss / y2:.3g}")
        delta = _step(eq, v, u, power, damping)
        v_new = v + delta[: k * d].reshape(k, d)
        u_new = u + delta[k * d :].reshape(u.shape)
        v_new, u_new = _normalise(v_new, u_new, power)
        eq_new = _accumulate(draw, items, v_new, u_new, power, mapper)
        passes += 1
        change = (eq.loss - eq_new.loss) / max(eq.loss, 1e-300)
        accepted = change >= 0
        history.append({"relative_loss": eq_new.loss / y2, "accepted": bool(accepted), "damping": damping})
        if accepted:
            v, u, eq = v_new, u_new, eq_new
            damping = max(damping / 10.0, 1e-12)
        else:
            damping *= 10.0
        # a change at the level of rounding either way: the minimum is reached
        if abs(change) < RELATIVE_DECREASE or damping > 1e6:
            converged = True
            break
    report = {
        "samples": int(eq.n),
        "parts": len(items),
        "passes": passes,
        "converged": converged,
        "relative_loss": eq.loss / y2,
        "iterations": history,
    }
    return Network((v, u), activation=net.activation), report
