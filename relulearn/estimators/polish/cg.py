"""Polish at scale: Gauss–Newton steps for a one-hidden-layer ReLU network with ``m`` outputs, each step solved by
preconditioned conjugate gradients on the structured design, never forming the normal matrix.

With the activation patterns fixed on the samples away from every unit's boundary the model
``y = A relu(H x̃) + c (+ L x)`` (``x̃ = [x, 1]``) is bilinear, and a Gauss–Newton step solves
``JᵀJ s = Jᵀ r``. :func:`.polish.dense.polish_outputs` sums the ``p × p`` normal matrix (``p = k(d+1) + m(k+1)``
unknowns, ``n p²`` flops per output): at d = 784 and k = 128 that is 10⁵ unknowns, an 80 GB matrix. Here ``JᵀJ``
is applied as two products with the samples, ``J v`` and ``Jᵀ w`` (``4 n d k`` flops), and the step is found by
conjugate gradients with a two-part preconditioner:

* *coarse* unknowns — each unit's row along its own direction and its offset, the output weights and the output
  biases, ``2k + m(k+1)`` in all — solved exactly (their Gram from products of the samples' ``n × 2k`` and
  ``n × (k+1)`` designs, shared by all outputs). They hold the near-collinear pairs of the problem: a rarely
  active unit's slope and offset, an always-active unit's offset and the output biases, a unit's output weights
  and its row's length;
* the rest of each hidden row (off its unit's plane): ``(AᵀA ⊙ PᵀP)⁻¹ ⊗ I`` (``P`` the patterns), the
  expected normal matrix of those components for Gaussian ``x``;
* with ``affine``, the linear term: ``(XᵀX)⁻¹``.

Each unit's rescaling ``(h_i, A_:i) → (t h_i, A_:i / t)`` leaves the outputs unchanged; a penalty on it makes
the system definite. Each step is solved to a tolerance that follows the residual (a step from a stale pattern
is worth little precision; at the answer steps are solved to 10⁻¹³), so noiseless labels reach machine
precision.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import cast

import numpy as np
import scipy.linalg

from ... import progress
from ...network import Network
from .report import PolishReport

__all__ = ["polish_outputs_cg", "start_rows", "trusted_samples", "DENSE_UNKNOWNS", "matrix_free"]

#: past this many unknowns :func:`.polish.dense.polish_outputs` always hands over to :func:`polish_outputs_cg` (a dense
#: normal matrix of 6000² is 290 MB and its sum costs ``n p²`` flops per output); below, :func:`matrix_free` decides
DENSE_UNKNOWNS = 6000


#: conjugate-gradient iterations a step is taken to cost when choosing between the dense and the matrix-free polish
#: (measured: 30–400, most under 200)
CG_PER_STEP = 200


def matrix_free(unknowns: int, outputs: int = 1) -> bool:
    """Whether the polish of ``unknowns`` parameters ``p`` on ``outputs`` outputs ``m`` is solved matrix-free.

    By the work of one Gauss–Newton step on the samples each takes (:func:`.tensor.plan.sample_sizes`): the dense
    normal matrix is summed output by output, ``m · max(20000, 40p) · p²``; conjugate gradients apply it as two
    products with the design, ``4 p`` per row and iteration, on ``max(20000, 8p/m)`` rows, for
    :data:`CG_PER_STEP` iterations. Measured (from 0.05 rad, both to 10⁻¹⁶): d = 64, k = 12, m = 4 (1,088
    unknowns): dense 20 s, matrix-free 1.6 s; d = 30, k = 16, m = 3: 4.7 s against 1.3 s; d = 12, k = 6, m = 3:
    0.3 s against 0.5 s. Never dense past :data:`DENSE_UNKNOWNS` (a 6000² matrix is 290 MB); with one output
    dense up to it, as the single-output polish of products it sizes the samples for."""
    p, m = int(unknowns), max(1, int(outputs))
    if p > DENSE_UNKNOWNS:
        return True
    if m == 1:  # below the bound one output is polished by the products' least squares (:func:`.polish.dense.polish`)
        return False
    dense = m * max(20_000, 40 * p) * p * p
    free = CG_PER_STEP * 4 * max(20_000, 8 * p // m) * p
    return dense > free


#: conjugate-gradient iterations per Gauss–Newton step, at most
CG_ITER = 400

#: fractions of a Gauss–Newton step tried in turn
BACKTRACK = (1.0, 0.5, 0.25, 0.125)

#: a step that leaves more than this fraction of the residual, or more than the step before it left, was not in
#: Gauss–Newton's quadratic regime (zero-residual problems square their residual near the answer): the labels'
#: floor is near (their noise, or a float32 model's rounding), or the patterns are still moving. The next step is
#: solved to :data:`LOOSE` only: at a floor it can gain a few per cent whatever its precision, and the iteration
#: stops on the stall. Measured at d = 300, k = 200, m = 10 on a float32 forward pass (floor 3.0e-7): the stalled
#: step took 162 iterations to the tight tolerance
QUADRATIC = 0.1

#: conjugate-gradient tolerance of a step after a slow one
LOOSE = 1e-2


#: the two products of each iteration run on this many fixed row parts at once, each part's product on one BLAS
#: thread: the parts do not depend on the machine's cores, so neither do the bits (a BLAS call on several
#: threads may split its sums differently from one machine to the next)
PARTS = 2

#: below this many rows a product is not split (threads cost more than they save)
SPLIT_ROWS = 20_000


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(PARTS, thread_name_prefix="relulearn-polish")


@dataclass
class _Design:
    """The samples a step uses: inputs ``xt`` (with the constant), patterns and activations (n, k)."""

    xt: np.ndarray
    pat: np.ndarray
    act: np.ndarray
    affine: bool
    parts: list[slice] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.xt)
        cuts = np.linspace(0, n, PARTS + 1).astype(int) if n >= SPLIT_ROWS else np.array([0, n])
        self.parts = [slice(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]

    @property
    def d(self) -> int:
        return self.xt.shape[1] - 1

    def each_part(self, fn: Callable[[slice], np.ndarray]) -> list[np.ndarray]:
        """``fn`` on every row part, the parts at once (numpy releases the GIL in its products)."""
        if len(self.parts) == 1:
            return [fn(self.parts[0])]
        return list(_pool().map(fn, self.parts))


@dataclass
class _Step:
    """A direction in parameter space: hidden rows (k, d+1), output weights (m, k), biases (m), linear (m, d)."""

    h: np.ndarray
    a: np.ndarray
    c: np.ndarray
    lin: np.ndarray

    def __add__(self, o: _Step) -> _Step:
        return _Step(self.h + o.h, self.a + o.a, self.c + o.c, self.lin + o.lin)

    def scaled(self, s: float) -> _Step:
        return _Step(s * self.h, s * self.a, s * self.c, s * self.lin)

    def dot(self, o: _Step) -> float:
        return float(np.vdot(self.h, o.h) + np.vdot(self.a, o.a) + np.vdot(self.c, o.c) + np.vdot(self.lin, o.lin))


def _jvp(des: _Design, a: np.ndarray, v: _Step) -> np.ndarray:
    """``J v``: the change of the outputs (n, m) along ``v`` (row parts at once)."""

    def part(rows: slice) -> np.ndarray:
        out = ((des.xt[rows] @ v.h.T) * des.pat[rows]) @ a.T + des.act[rows] @ v.a.T + v.c
        if des.affine:
            out += des.xt[rows, :-1] @ v.lin.T
        return out

    return np.concatenate(des.each_part(part))


def _vjp(des: _Design, a: np.ndarray, w: np.ndarray) -> _Step:
    """``Jᵀ w`` for output changes ``w`` (n, m): the row parts' sums at once, added in a fixed order."""

    def part(rows: slice) -> np.ndarray:
        return des.xt[rows].T @ ((w[rows] @ a) * des.pat[rows])  # this orientation runs faster in OpenBLAS

    h = cast(np.ndarray, sum(des.each_part(part))).T  # (a design has at least one row part)
    lin = w.T @ des.xt[:, :-1] if des.affine else np.zeros((w.shape[1], des.d))
    return _Step(h, w.T @ des.act, w.sum(axis=0), lin)


def _gauge(h: np.ndarray, a: np.ndarray, weight: float) -> Callable[[_Step], _Step]:
    """``weight · Σ_i g_i g_iᵀ v`` for the rescalings ``g_i = (h_i, −A_:i)`` of the units, which leave the outputs
    unchanged: added to ``JᵀJ`` it makes the normal operator definite, and the step is the one that does not
    rescale the units."""

    def apply(v: _Step) -> _Step:
        t = weight * (np.sum(h * v.h, axis=1) - np.sum(a * v.a, axis=0))
        return _Step(t[:, None] * h, -a * t[None, :], np.zeros_like(v.c), np.zeros_like(v.lin))

    return apply


def _preconditioner(des: _Design, a: np.ndarray, h: np.ndarray, gauge: float) -> Callable[[_Step], _Step]:
    """The preconditioner of the module docstring: exact on the *coarse* unknowns — each unit's row along its own
    direction and its offset, the output weights and the output biases, ``2k + m(k+1)`` unknowns whose Gram is
    built from two designs every output shares — and ``(AᵀA ⊙ PᵀP)⁻¹ ⊗ I`` on the rest of the hidden rows (each row
    projected off its unit's plane). The coarse part holds the near-collinear pairs of the problem: a rarely
    active unit's slope and offset, an always-active unit's offset and the output bias. ``gauge`` weighs the
    penalty on each unit's rescaling, as in :func:`_gauge`."""
    k, m, n = len(h), a.shape[0], len(des.xt)
    u = h[:, :-1] / np.linalg.norm(h[:, :-1], axis=1, keepdims=True)
    s = des.xt[:, :-1] @ u.T  # (n, k)
    q = 2 * k + m * (k + 1)
    # output j's design is [S diag(ã_j), R, 1] with S = [P ⊙ s, P] shared, ã_j = [A_j, A_j], R the activations
    shared = np.hstack([des.pat * s, des.pat])
    tilde = np.hstack([a, a])  # (m, 2k)
    out_design = np.hstack([des.act, np.ones((n, 1))])
    cross = shared.T @ out_design  # (2k, k+1)
    gram = np.zeros((q, q))
    gram[: 2 * k, : 2 * k] = (shared.T @ shared) * (tilde.T @ tilde)
    own = out_design.T @ out_design
    for j in range(m):
        idx = np.r_[2 * k + j * k + np.arange(k), 2 * k + m * k + j]
        gram[np.ix_(idx, idx)] = own
        gram[: 2 * k, idx] = tilde[j][:, None] * cross
        gram[idx, : 2 * k] = gram[: 2 * k, idx].T
    # the rescaling of each unit, in coarse coordinates: its row's length along û_i and offset, minus its weights
    null = np.zeros((k, q))
    null[np.arange(k), np.arange(k)] = np.linalg.norm(h[:, :-1], axis=1)
    null[np.arange(k), k + np.arange(k)] = h[:, -1]
    for j in range(m):
        null[np.arange(k), 2 * k + j * k + np.arange(k)] = -a[j]
    gram += gauge * null.T @ null

    def factor(g: np.ndarray) -> tuple:
        return scipy.linalg.cho_factor(g + (1e-12 * np.trace(g) / len(g) + 1e-300) * np.eye(len(g)))

    coarse = factor(gram)
    fine = factor((a.T @ a) * (des.pat.T @ des.pat))
    lin = factor(des.xt[:, :-1].T @ des.xt[:, :-1]) if des.affine else None

    def off_plane(v: np.ndarray) -> np.ndarray:
        out_ = v.copy()
        out_[:, :-1] -= np.sum(v[:, :-1] * u, axis=1)[:, None] * u
        out_[:, -1] = 0.0
        return out_

    def apply(v: _Step) -> _Step:
        z = scipy.linalg.cho_solve(
            coarse, np.concatenate([np.sum(v.h[:, :-1] * u, axis=1), v.h[:, -1], v.a.ravel(), v.c])
        )
        hz = off_plane(scipy.linalg.cho_solve(fine, off_plane(v.h)))
        hz[:, :-1] += z[:k, None] * u
        hz[:, -1] += z[k : 2 * k]
        return _Step(
            hz,
            z[2 * k : 2 * k + m * k].reshape(m, k),
            z[2 * k + m * k :],
            scipy.linalg.cho_solve(lin, v.lin.T).T if lin is not None else v.lin,
        )

    return apply


def _pcg(
    normal: Callable[[_Step], _Step], rhs: _Step, precond: Callable[[_Step], _Step], tol: float, maxiter: int
) -> tuple[_Step, int, float]:
    """Preconditioned conjugate gradients from zero: the solution, iterations, and the final relative residual."""
    x = rhs.scaled(0.0)
    r = rhs
    z = precond(r)
    p = z
    rz = r.dot(z)
    norm0 = np.sqrt(r.dot(r)) or 1.0
    rel = 1.0
    for it in range(1, maxiter + 1):
        q = normal(p)
        pq = p.dot(q)
        if pq <= 0:
            return x, it, rel
        alpha = rz / pq
        x = x + p.scaled(alpha)
        r = r + q.scaled(-alpha)
        rel = np.sqrt(r.dot(r)) / norm0
        if rel <= tol:
            return x, it, rel
        z = precond(r)
        rz_new = r.dot(z)
        p = z + p.scaled(rz_new / rz)
        rz = rz_new
    return x, maxiter, rel


def _gauss_newton_step(
    des: _Design, y: np.ndarray, h: np.ndarray, a: np.ndarray, c: np.ndarray, lin: np.ndarray, tol: float
) -> tuple[_Step, int]:
    """The Gauss–Newton step on the patterns of ``des`` (labels ``y``), to relative tolerance ``tol``, and the
    conjugate-gradient iterations it took."""
    r = y - des.act @ a.T - c
    if des.affine:
        r -= des.xt[:, :-1] @ lin.T
    weight = float(np.mean(des.pat)) * len(y) * float(np.mean(a**2)) or 1.0  # the normal matrix's scale
    gauge = _gauge(h, a, weight)
    step, its, _ = _pcg(
        lambda v: _vjp(des, a, _jvp(des, a, v)) + gauge(v),
        _vjp(des, a, r),
        _preconditioner(des, a, h, weight),
        tol,
        CG_ITER,
    )
    return step, its


def start_rows(
    net: Network, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The labels as (n, m), the inputs with the constant ``x̃`` (n, d+1), and a start's hidden rows ``[u_i, b_i]``,
    output weights and output biases (biases zero where the network has none; units without output weight
    left out)."""
    if net.depth != 1 or net.activation != "relu":
        raise ValueError("polish applies to one-hidden-layer ReLU networks")
    y = np.asarray(y, dtype=np.float64).reshape(len(x), -1)
    xt = np.column_stack([x, np.ones(len(x))])
    b0 = np.zeros(len(net.weights[0])) if net.biases is None else net.biases[0]
    h = np.column_stack([net.weights[0], b0])
    a = net.weights[1].astype(np.float64).copy()
    c = np.zeros(y.shape[1]) if net.biases is None else net.biases[1].astype(np.float64).copy()
    keep = np.linalg.norm(a, axis=0) > 0
    return y, xt, h[keep], a[:, keep], c


def trusted_samples(xt: np.ndarray, h: np.ndarray, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """``x̃ Hᵀ`` and the samples whose patterns are trusted: at least ``margin`` (times the unit's input norm)
    from every unit's boundary."""
    proj = xt @ h.T
    return proj, np.all(np.abs(proj) >= margin * np.linalg.norm(h[:, :-1], axis=1), axis=1)


def polish_outputs_cg(
    net: Network, x: np.ndarray, y: np.ndarray, *, margin: float = 1e-3, max_iter: int = 30, affine: bool = False
) -> tuple[Network, PolishReport]:
    """:func:`.polish.dense.polish_outputs` for networks too large for a dense normal matrix: the same Gauss–Newton
    iteration with the patterns fixed and refreshed, each step solved by preconditioned conjugate gradients.

    Parameters and return value as for :func:`.dense.polish_outputs`; the report's ``pattern_changes`` counts, for
    each step, the samples trusted after it whose pattern it changed (the design of the next step), and
    ``cg_iterations`` the iterations of each step.
    """
    y, xt, h, a, c = start_rows(net, x, y)
    (n, m), (k, d) = y.shape, (len(h), x.shape[1])
    p = k * (d + 1) + m * k + m + (m * d if affine else 0)
    if n * m < 2 * p:
        raise ValueError(
            f"polish needs more than {2 * p} equations (twice the unknowns; samples × outputs); got {n * m}"
        )
    lin = np.zeros((m, d))
    y_norm = float(np.linalg.norm(y)) or 1.0

    def residual(h_: np.ndarray, a_: np.ndarray, c_: np.ndarray, lin_: np.ndarray) -> float:
        pred = np.maximum(xt @ h_.T, 0.0) @ a_.T + c_
        if affine:
            pred += x @ lin_.T
        return float(np.linalg.norm(y - pred) / y_norm)

    best = (residual(h, a, c, lin), h, a, c, lin)
    changes: list[int] = []
    cg_its: list[int] = []
    stop, used, it, slow, kept = "max_iter", 0, 0, False, 1.0
    proj, trusted = trusted_samples(xt, h, margin)
    for it in range(1, max_iter + 1):
        progress.step("exact polish (matrix-free): Gauss–Newton steps", it - 1, max_iter)
        used = int(trusted.sum())
        if used * m < 2 * p:
            raise ValueError(f"polish needs more than {2 * p} equations away from the unit boundaries; got {used * m}")
        # the step's tolerance follows the residual: a step from a stale pattern needs little precision, nor does
        # one that can only confirm a floor (see LOOSE)
        tol = LOOSE if slow else float(np.clip(best[0], 1e-13, 1e-3))
        design = _Design(
            np.ascontiguousarray(xt[trusted]), (proj[trusted] > 0) * 1.0, np.maximum(proj[trusted], 0.0), affine
        )
        before = np.packbits(proj > 0, axis=1)
        del proj  # n × k floats: not kept through the step
        step, its = _gauss_newton_step(design, y[trusted], h, a, c, lin, tol=tol)
        del design
        cg_its.append(its)
        # the step in full, or a fraction of it that lowers the residual on all samples (from far off, a step
        # solved on patterns that are still wrong can overshoot); none: the iteration is at its end
        for t in BACKTRACK:
            h_t, a_t = h + t * step.h, a + t * step.a
            norms = np.linalg.norm(h_t, axis=1)
            h_t, a_t = h_t / norms[:, None], a_t * norms[None, :]
            res = residual(h_t, a_t, c + t * step.c, lin + t * step.lin)
            if res < best[0]:
                break
        else:
            stop = "no descent"
            break
        h, a, c, lin = h_t, a_t, c + t * step.c, lin + t * step.lin
        ratio = res / best[0]
        stalled = ratio >= 0.5
        # a tight step that kept more of the residual than QUADRATIC, or than the step before it kept, left the
        # quadratic regime: the next is solved loosely (a loose step is followed by a tight one)
        slow, kept = not slow and (ratio > QUADRATIC or ratio > kept), ratio
        best = (res, h, a, c, lin)
        proj, trusted = trusted_samples(xt, h, margin)
        # a pattern that changed on a sample now trusted changes the next step's design; a sample within the
        # margin of a boundary may flip with any step at the noise floor, and is not in the design
        changes.append(int(np.count_nonzero(np.any(before != np.packbits(proj > 0, axis=1), axis=1) & trusted)))
        if changes[-1] == 0 and (stalled or res < 4 * np.finfo(float).eps):
            stop = "fixed point"
            break
    res, h, a, c, lin = best
    out = Network((h[:, :-1].copy(), a.copy()), (h[:, -1].copy(), c.copy()), activation="relu")
    return out, PolishReport(
        it, stop != "max_iter", res, used, tuple(changes), stop, lin.copy() if affine else None, tuple(cg_its)
    )
