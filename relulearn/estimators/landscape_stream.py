"""G of Ge–Lee–Ma (2017) minimized by stochastic gradients on fresh samples (their own route).

The fourth moment is never formed. For rows ``v_j = Wᵀ b̃_j`` of ``V = B̃ W`` (``W`` the
whitening, m × d), the sign-corrected objective ``Σ_{j≠k} T(b̃_j, b̃_j, b̃_k, b̃_k) −
μ Σ_j T(b̃_j⁴)`` is the expectation of ``sign(c_4) ỹ [Σ_{j≠k} ⟨He_4(x), v_j v_j v_k v_k⟩ −
μ Σ_j ⟨He_4(x), v_j⁴⟩]``, and with ``p = V x``, ``P = |p|²``, ``N = Σ_j |v_j|²``,
``g = Vᵀ p``, ``Γ = V Vᵀ``::

    Σ_{j,k} ⟨He_4, v_j v_j v_k v_k⟩ = (P − N)² − 4 |g|² + 2 ‖Γ‖_F²,
    ⟨He_4, v⁴⟩ = p⁴ − 6 |v|² p² + 3 |v|⁴,

O(m d) per sample and BLAS-3 over a batch (:func:`batch_sums`). Residual labels ``ỹ = y −
P_{≤2} y`` have the same expectation against ``He_4`` and, for ReLU units, about fifty
times less variance than ``y`` (:func:`residual_labels`).

:func:`streamed_g` runs proximal gradient steps on ``B̃``: the tensor terms' gradient from
fresh parts of the sample stream mapped over a cluster, the deterministic
``λ Σ_j (|b̃_j|² − 1)²`` by its exact proximal map (a cubic per row), so that the step is set
by the tensor's curvature ``4 β`` and not by ``8 λ = 80 β``. Batch sizes come from the measured
noise (the spread of the per-part gradients): while the iterate drifts, a batch whose noise
moves a row by at most ``drift_angle`` per step; once successive gradients turn away from each
other (Pflug's diagnostic: the noise floor) and every row holds its own component (the share
``T(b̃_j⁴) / Σ_k T(b̃_j, b̃_j, b̃_k, b̃_k)``, 1 at the minimum and ½ at a saddle between two),
a batch grown until the predicted error meets the target. The iterates that pass the test
are averaged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .. import hermite
from .objective_g import distinct_rows

__all__ = [
    "SIGN_C4",
    "BLOCK_ROWS",
    "BatchTerms",
    "batch_terms",
    "batch_sums",
    "residual_labels",
    "part_sums",
    "prox_radial",
    "streamed_g",
    "StreamedG",
]

#: ``sign(c_4)`` for ReLU (``c_4 = −1/√(2π)``): the sign that makes the tensor's weights positive
SIGN_C4 = float(np.sign(hermite.relu_hermite_coefficient(4)))
#: rows of a part handled at a time: (rows, m) temporaries of 2048 rows stay in cache (twice as fast
#: as 16384 rows at m = d = 50, measured)
BLOCK_ROWS = 2048


#: ``ỹ = y − (T_0 + <T_1, x> + ½ <T_2, xxᵀ − I>)``: the labels less their Hermite expansion up to order 2
#: (same ``E[ỹ He_4(x)]``, since ``He_4`` is orthogonal to every polynomial of degree ≤ 2)
residual_labels = hermite.subtract_expansion


@dataclass(frozen=True)
class BatchTerms:
    """Sums over a batch (see :func:`batch_terms`)."""

    value: float
    grad: np.ndarray
    own: np.ndarray
    rows: np.ndarray


def batch_terms(x: np.ndarray, y_resid: np.ndarray, v: np.ndarray, mu: float) -> BatchTerms:
    """Sums over a batch of per-sample unbiased estimates: the tensor part of G, its gradient in V,
    and per row j ``T(v_j⁴)`` (``own``) and ``Σ_k T(v_j, v_j, v_k, v_k)`` (``rows``, k = j included).

    The estimate of sample ``(x, ỹ)`` is ``f = sign(c_4) ỹ [A − (1 + μ) D]`` with
    ``A = Σ_{j,k} ⟨He_4(x), v_j v_j v_k v_k⟩ = (P − N)² − 4 |g|² + 2 ‖Γ‖_F²`` and
    ``D = Σ_j ⟨He_4(x), v_j⁴⟩ = Σ_j (p_j⁴ − 6 n_j p_j² + 3 n_j²)`` (``p = V x``, ``P = |p|²``,
    ``n_j = |v_j|²``, ``N = Σ n_j``, ``g = Vᵀ p``, ``Γ = V Vᵀ``), so that ``A − D`` is the sum
    over ``j ≠ k``. Its gradient in V, derived by hand::

        ∂A = 4 (P − N)(p xᵀ − V) − 8 p pᵀ V − 8 Γ p xᵀ + 8 Γ V
        ∂D (row j) = 4 (p_j³ − 3 n_j p_j) x + 12 (n_j − p_j²) v_j

    and row j of A is ``p_j² P − n_j P − N p_j² − 4 p_j (Γ p)_j + n_j N + 2 (Γ²)_jj``. Two GEMMs
    over the batch (``X Vᵀ`` and one ``(n, m)ᵀ (n, d)`` pair); the rest is O(n m) or independent of n.
    """
    x = np.asarray(x, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    c = SIGN_C4 * np.asarray(y_resid, dtype=np.float64)
    gram = v @ v.T
    nrm = np.diag(gram).copy()
    big_n = float(nrm.sum())
    p = x @ v.T  # (n, m)
    q = p * p
    pn = q.sum(axis=1) - big_n  # P − N
    q -= 3.0 * nrm[None, :]  # q = p² − 3 n: ⟨He_4, v_j⁴⟩ = q_j² − 6 n_j²
    q2 = q * q
    csum = float(c.sum())
    cq = c @ q  # Σ_i c_i (p_ij² − 3 n_j) per row j
    cbig_p = c * (pn + big_n)
    cbig_p_q = cbig_p @ q
    own = c @ q2 - 6.0 * csum * nrm * nrm
    diag = float(own.sum())
    cp = c[:, None] * p
    lin_c = cp.T @ x  # Σ c p xᵀ (m, d)
    pp = lin_c @ v.T  # Σ c p pᵀ = (Σ c p xᵀ) Vᵀ, as p = V x: no n·m² product
    cpn = float(c @ pn)
    fro2 = float(np.einsum("jk,jk->", gram, gram))
    value = (
        float(c @ (pn * pn)) + 2.0 * csum * fro2 - 4.0 * float(np.einsum("jk,jk->", gram, pp)) - (1.0 + mu) * diag
    )  # Σ c |g|² = <Γ, Σ c p pᵀ>
    rows = (
        cbig_p_q
        + 3.0 * nrm * float(cbig_p.sum())
        - nrm * float(cbig_p.sum())
        - big_n * (cq + 3.0 * nrm * csum)
        - 4.0 * np.einsum("jk,jk->j", pp, gram)
        + csum * (nrm * big_n + 2.0 * np.einsum("jk,jk->j", gram, gram))
    )
    # coefficient of xᵀ in ∂A − (1+μ) ∂D, over 4: c p (P − N − (1 + μ)(p² − 3 n)), built in place
    q *= -(1.0 + mu)
    q += pn[:, None]
    q *= cp
    lin_a = q.T @ x
    cn = -2.0 * csum * nrm - cq  # Σ_i c_i (n_j − p_ij²) per row j
    grad = (
        4.0 * lin_a
        - 8.0 * (gram @ lin_c)
        - 8.0 * (pp @ v)
        + 8.0 * csum * (gram @ v)
        - 4.0 * cpn * v
        - 12.0 * (1.0 + mu) * cn[:, None] * v
    )
    return BatchTerms(value, grad, own, rows)


def batch_sums(x: np.ndarray, y_resid: np.ndarray, v: np.ndarray, mu: float) -> tuple[float, np.ndarray]:
    """Sum over a batch of the per-sample unbiased estimate of
    ``sign(c_4) ỹ [Σ_{j≠k} ⟨He_4(x), v_j v_j v_k v_k⟩ − μ Σ_j ⟨He_4(x), v_j⁴⟩]`` and of its gradient in V.

    Parameters
    ----------
    x
        ``(n, d)`` inputs.
    y_resid
        ``(n,)`` residual labels.
    v
        ``(m, d)`` rows ``v_j``.
    mu
        The weight μ of the diagonal terms.

    Returns
    -------
    (float, np.ndarray)
        The sum over the batch and the sum of its gradient in V, ``(m, d)``. See :func:`batch_terms`
        for the formulas.
    """
    t = batch_terms(x, y_resid, v, mu)
    return t.value, t.grad


def part_sums(
    draw: Any, t0: float, t1: np.ndarray, t2: np.ndarray, v: np.ndarray, mu: float, item: tuple[int, int]
) -> BatchTerms:
    """:func:`batch_terms` on the independent part ``p`` of ``n`` samples, ``item = (p, n)``, drawn
    where this runs (a worker): only the part's id travels, and the result is O(m d)."""
    p, n = item
    x, y = draw.part(int(p), int(n))
    total: BatchTerms | None = None
    for a in range(0, x.shape[0], BLOCK_ROWS):  # blocks whose (rows, m) temporaries stay in cache
        xs = x[a : a + BLOCK_ROWS]
        t = batch_terms(xs, residual_labels(xs, y[a : a + BLOCK_ROWS], t0, t1, t2), v, mu)
        total = (
            t
            if total is None
            else BatchTerms(total.value + t.value, total.grad + t.grad, total.own + t.own, total.rows + t.rows)
        )
    if total is None:
        raise ValueError(f"part {p} has no samples")
    return total


def prox_radial(z: np.ndarray, eta_lam: float, iters: int = 60) -> np.ndarray:
    """The proximal map of ``η λ Σ_j (|b_j|² − 1)²`` at the rows of ``z``.

    Row j keeps its direction; its norm r is the unique positive root of
    ``4 η λ r³ + (1 − 4 η λ) r − |z_j| = 0`` (the derivative of ``½ (r − |z_j|)² + η λ (r² − 1)²``),
    found by Newton's method from ``max(|z_j|, 1)``, where that convex cubic is non-negative, so the
    iterates decrease monotonically to the root.
    """
    s = np.linalg.norm(z, axis=1)
    a = 4.0 * eta_lam
    r = np.maximum(s, 1.0)
    for _ in range(iters):
        f = a * r**3 + (1.0 - a) * r - s
        step = f / (3.0 * a * r * r + 1.0 - a)
        r = r - step
        if np.all(np.abs(step) <= 1e-15 * r):
            break
    return z * (r / np.where(s > 0, s, 1.0))[:, None]


@dataclass
class _Moments:
    """Sums of the part results, and the spread of the per-part means of the gradient and the value
    (shifted by the first part's, so that the variance does not cancel against a large mean)."""

    n: int = 0
    parts: int = 0
    value: float = 0.0
    grad: Any = 0.0
    own: Any = 0.0
    rows: Any = 0.0
    ref: tuple[np.ndarray, float] | None = None
    shift: Any = 0.0
    shift_sq: float = 0.0
    vshift: Any = np.float64(0.0)  # numpy scalars: an overflow gives inf, not an exception
    vshift_sq: Any = np.float64(0.0)

    def add(self, t: BatchTerms, grad: np.ndarray, n: int) -> None:
        g, v = grad / n, np.float64(t.value) / n
        if self.ref is None:
            self.ref = (g, v)
        dg, dv = g - self.ref[0], v - self.ref[1]
        self.n += n
        self.parts += 1
        self.value += t.value
        self.grad = self.grad + grad
        self.own = self.own + t.own
        self.rows = self.rows + t.rows
        self.shift = self.shift + dg
        self.shift_sq += float(np.einsum("ij,ij->", dg, dg))
        self.vshift += dv
        self.vshift_sq += dv * dv

    def standard_errors(self) -> tuple[float, float]:
        """Standard errors of the mean gradient (Frobenius) and of the mean value, from the spread of
        the parts (all of the same size)."""
        k = self.parts
        if k < 2:
            return math.inf, math.inf
        ss = self.shift_sq - float(np.einsum("ij,ij->", self.shift, self.shift)) / k
        vs = self.vshift_sq - self.vshift**2 / k
        return math.sqrt(max(ss, 0.0) / (k * (k - 1))), math.sqrt(max(float(vs), 0.0) / (k * (k - 1)))


def _stream(
    draw: Any,
    mapper: Callable,
    first: int,
    parts: int,
    part_size: int,
    v: np.ndarray,
    w: np.ndarray,
    mu: float,
    t0: float,
    t1: np.ndarray,
    t2: np.ndarray,
    window: int,
) -> _Moments:
    """Map :func:`part_sums` over parts ``first, …, first + parts − 1`` (in windows) and sum their
    results in part order; gradients are taken to B̃ (``∂/∂B̃ = (∂/∂V) Wᵀ``) part by part."""
    fn = partial(
        part_sums, draw, float(t0), np.asarray(t1, dtype=np.float64), np.asarray(t2, dtype=np.float64), v, float(mu)
    )
    acc = _Moments()
    items = [(first + i, part_size) for i in range(parts)]
    for a in range(0, parts, window):
        chunk = items[a : a + window]
        results = list(mapper(fn, chunk))
        if len(results) != len(chunk):
            raise RuntimeError(f"mapper returned {len(results)} results for {len(chunk)} parts")
        for t in results:  # part order, whatever ran where: the sum is deterministic
            acc.add(t, np.asarray(t.grad) @ w.T, part_size)
    return acc


@dataclass(frozen=True)
class StreamedG:
    """What :func:`streamed_g` reached (``b``: B̃, m × m) and its report (JSON-ready)."""

    b: np.ndarray
    report: dict


def streamed_g(
    draw: Any,
    mapper: Callable = map,
    *,
    w: np.ndarray,
    t0: float,
    t1: np.ndarray,
    t2: np.ndarray,
    m: int,
    mu: float,
    lam: float,
    seed: int = 0,
    batch: int = 65_536,
    steps: int = 200,
    beta_max: float | None = None,
    beta_min: float | None = None,
    target_angle: float = 0.05,
    step: float = 0.5,
    theta: float = 3.0,
    growth: float = 4.0,
    part_size: int = 16_384,
    min_parts: int = 4,
    max_samples: int = 200_000_000,
    window: int = 64,
    first_part: int = 2,
    confirm: int = 2,
    min_align: float = 0.8,
    drift_angle: float = 0.2,
    callback: Callable[[int, np.ndarray], Any] | None = None,
) -> StreamedG:
    """Minimize G over B̃ (m × m) by proximal stochastic gradient steps on fresh samples.

    Step k maps :func:`part_sums` over new parts of ``draw`` (ids from ``first_part`` on, never
    reused), so its gradient of the tensor terms is unbiased and independent of the iterate; the λ
    term is deterministic and taken by its proximal map (:func:`prox_radial`). Steps are
    ``B̃ ← prox(B̃ − η ĝ)`` with ``η = step / (4 β_max)`` (the tensor's curvature along the
    sphere at the minimum is ``4 β_i``). With ``s`` the standard error of ĝ (spread of the
    per-part gradients) and ``|g| = sqrt(|ĝ + ∇R|² − s²)`` the debiased norm of the full gradient,
    the predicted error after the step is ``e = sqrt((|1 − η h| |g| / h)² + (η s)²)``
    (``h = 4 β_min``). The next batch is the largest of: the one whose step noise moves a row by
    ``drift_angle`` (``η s = drift_angle √m``); the norm test's (``s ≤ θ |g|``); and, at the noise
    floor (successive gradients at an obtuse angle) with every row's own share of the tensor at
    least ``min_align``, the one that brings ``e`` to 0.8 of ``target_angle · √m``. Batches
    never shrink and grow at most ``growth`` times a step. The run stops when ``e ≤ target_angle ·
    √m`` with distinct rows holding their components on ``confirm`` consecutive steps (a saddle
    has a small gradient too), returning the mean of those iterates; or at ``steps``,
    ``max_samples``, or a non-finite estimate (``stop = "diverged"``).

    Parameters
    ----------
    draw
        Picklable; ``draw.part(p, n)`` returns ``n`` samples ``(x, y)`` of the independent part ``p``.
    mapper
        ``map``-like callable (a cluster's map in a run, the builtin ``map`` in tests).
    w
        Whitening ``Λ^{-1/2} Qᵀ`` (m × d); ``V = B̃ W``.
    t0, t1, t2
        First-pass statistics, for the residual labels.
    m
        Number of rows.
    mu, lam
        μ and λ of G.
    seed
        The start: ``default_rng([seed, 29])`` Gaussian rows of norm about 1.
    batch
        Samples of the first step (rounded up to whole parts, at least ``min_parts``).
    steps
        Largest number of steps.
    beta_max, beta_min
        Curvature scales of the tensor (default: from μ and λ as ``landscape.g_parameters`` sets them,
        ``β_max = 0.1 λ``, ``β_min = μ λ``).
    target_angle
        Requested RMS angle (radians) of a row of B̃ to its minimum.
    step, theta, growth
        Step as a fraction of ``1 / (4 β_max)`` (1 is unstable from a random start); norm-test ratio;
        largest batch growth per step.
    part_size, min_parts, window
        Samples per mapped part; fewest parts per step (for the spread); parts mapped at a time.
    max_samples
        Budget of samples.
    confirm
        Consecutive steps on which the stopping test must hold (a saddle has a small gradient too).
    min_align
        Least share ``T(b̃_j⁴) / Σ_k T(b̃_j, b̃_j, b̃_k, b̃_k)`` of every row for the noise-floor growth
        and the stop (1 at the components, ``1 − ½ sin² 2φ`` for a row at angle φ in the plane of two).
    drift_angle
        RMS angle by which one step's noise may move a row.
    first_part
        Id of the first part used (0 and 1 are the training and validation parts of a SampleDraw).
    callback
        Called as ``callback(k, b)`` after step k with the new iterate (for diagnostics).

    Returns
    -------
    StreamedG
        ``b`` (m × m) and ``report`` (JSON-ready): ``steps``, ``samples``, ``seconds``, ``converged``,
        ``stop`` (``target``, ``steps``, ``max_samples`` or ``diverged``), ``parts`` (the range of part
        ids used), η, μ, λ, β's, ``averaged_iterates``, ``final`` (last step's batch, G estimate and
        SE, gradient norm and SE, predicted RMS angle, least and mean row share), ``row_betas``
        (``T(b̂_j⁴)`` of the unit rows at the last step: the β_i once converged) and ``trace`` (the
        same per step, with ``successive_cos``).
    """
    t_start = time.perf_counter()
    w = np.asarray(w, dtype=np.float64)
    if w.shape[0] != m:
        raise ValueError(f"the whitening has {w.shape[0]} rows for m = {m}")
    beta_max = 0.1 * lam if beta_max is None else float(beta_max)
    beta_min = mu * lam if beta_min is None else float(beta_min)
    eta = step / (4.0 * beta_max)
    h = 4.0 * beta_min
    contraction = abs(1.0 - eta * h)
    rng = np.random.default_rng([seed, 29])
    b = rng.standard_normal((m, m)) / math.sqrt(m)
    parts = max(min_parts, -(-int(batch) // part_size))
    next_part = int(first_part)
    used = 0
    trace: list[dict] = []
    stop = "steps"
    converged = False
    k = held = 0
    betas = np.zeros(m)
    prev: tuple[np.ndarray, float] | None = None
    tail: list[np.ndarray] = []
    for k in range(1, steps + 1):
        acc = _stream(draw, mapper, next_part, parts, part_size, b @ w, w, mu, t0, t1, t2, window)
        next_part += parts
        used += acc.n
        if not (math.isfinite(acc.value) and np.all(np.isfinite(acc.grad))):
            stop = "diverged"  # the step outgrew the curvature: report it, never return non-finite rows
            break
        g_t = acc.grad / acc.n
        se, val_se = acc.standard_errors()
        norms = np.einsum("ij,ij->i", b, b) - 1.0
        g_full = g_t + 4.0 * lam * norms[:, None] * b
        value = acc.value / acc.n + lam * float(norms @ norms)
        signal = math.sqrt(max(float(np.einsum("ij,ij->", g_full, g_full)) - se * se, 0.0))
        # share of row j's weight T(b_j, b_j, b_k, b_k) summed over k that is its own T(b_j⁴): 1 when
        # the rows are the components, ½ for a row midway between two (a saddle G may linger at)
        align = acc.own / np.where(acc.rows != 0.0, acc.rows, 1.0)
        # Pflug's diagnostic: successive gradients (independent samples) point alike while the
        # iterate drifts and turn away from each other once the noise drives it (the noise floor)
        corr = None if prev is None else float(np.einsum("ij,ij->", g_full, prev[0])) / (se * prev[1])
        prev = (g_full, se)
        # the error after this step: the distance |g| / h to the minimum contracted by the step,
        # and the noise the step puts in
        err = math.hypot(contraction * signal / h, eta * se)
        found = float(align.min()) >= min_align and distinct_rows(b) == m
        # T(b̂_j⁴) for the unit rows: β_j at the components (for μ and λ of a second round)
        betas = acc.own / acc.n / np.maximum(np.einsum("ij,ij->i", b, b), 1e-300) ** 2
        b = prox_radial(b - eta * g_t, eta * lam)
        trace.append(
            {
                "step": k,
                "samples": used,
                "batch": acc.n,
                "G": value,
                "G_se": val_se,
                "grad_norm": signal,
                "grad_se": se,
                "successive_cos": corr,
                "rms_angle": err / math.sqrt(m),
                "align_min": float(align.min()),
                "align_mean": float(align.mean()),
            }
        )
        if callback is not None:
            callback(k, b)
        # a small gradient alone may be a saddle's: the rows must be the components too, twice running
        held = held + 1 if err <= target_angle * math.sqrt(m) and found else 0
        tail = (tail + [b])[-confirm:] if held else []
        if held >= confirm:
            stop, converged = "target", True
            break
        if used >= max_samples:
            stop = "max_samples"
            break
        # the batch, from the standard errors: (i) the noise of a step moves a row by at most
        # `drift_angle` (RMS), or the iterate wanders off the components and, with rows bunched, the
        # step outgrows the curvature; (ii) norm test, noise at most θ times the gradient; (iii) at
        # the noise floor near the components (successive gradients turned apart, rows found) the
        # error is proportional to the noise: what brings it to 0.8 of the target. Never smaller:
        # while drifting a fixed batch moves the iterate as far per sample as any other.
        factor = (eta * se / (drift_angle * math.sqrt(m))) ** 2
        if se > theta * signal:
            factor = max(factor, (se / (theta * signal)) ** 2 if signal > 0 else growth)
        if corr is not None and corr < 0.0 and found:
            factor = max(factor, (err / (0.8 * target_angle * math.sqrt(m))) ** 2)
        factor = min(growth, max(1.0, factor))
        parts = max(parts, min(int(math.ceil(parts * factor)), -(-(max_samples - used) // part_size)))
    if converged:
        b = np.mean(tail, axis=0)  # the iterates that passed the test: their mean has less noise
    last = trace[-1] if trace else {}
    report = {
        "steps": k,
        "samples": used,
        "seconds": time.perf_counter() - t_start,
        "converged": converged,
        "stop": stop,
        "parts": [int(first_part), next_part],
        "eta": eta,
        "mu": mu,
        "lambda": lam,
        "beta_max": beta_max,
        "beta_min": beta_min,
        "averaged_iterates": len(tail) if converged else 0,
        "final": {
            k_: last.get(k_)
            for k_ in ("batch", "G", "G_se", "grad_norm", "grad_se", "rms_angle", "align_min", "align_mean")
        },
        "row_betas": betas.tolist() if trace else None,
        "trace": trace,
    }
    return StreamedG(b, report)
