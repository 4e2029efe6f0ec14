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

from .objective_g import distinct_rows
from .sums import BatchTerms, part_sums

__all__ = [
    "GProblem",
    "prox_radial",
    "StepRules",
    "streamed_g",
    "StreamedG",
    "StreamSizes",
]


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


@dataclass(frozen=True)
class GProblem:
    """The objective :func:`streamed_g` minimizes.

    Attributes
    ----------
    w
        Whitening ``Λ^{-1/2} Qᵀ`` (m × d); ``V = B̃ W``.
    t0, t1, t2
        First-pass statistics, for the residual labels.
    m
        Number of rows.
    mu, lam
        μ and λ of G.
    """

    w: np.ndarray
    t0: float
    t1: np.ndarray
    t2: np.ndarray
    m: int
    mu: float
    lam: float


@dataclass(frozen=True)
class StreamSizes:
    """How much :func:`streamed_g` streams, and from which parts.

    Attributes
    ----------
    batch
        Samples of the first step (rounded up to whole parts, at least ``min_parts``).
    steps
        Largest number of steps.
    part_size, min_parts, window
        Samples per mapped part; fewest parts per step (for the spread); parts mapped at a time.
    max_samples
        Budget of samples.
    first_part
        Id of the first part used (0 and 1 are the training and validation parts of a SampleDraw).
    """

    batch: int = 65_536
    steps: int = 200
    part_size: int = 16_384
    min_parts: int = 4
    max_samples: int = 200_000_000
    window: int = 64
    first_part: int = 2


@dataclass(frozen=True)
class StepRules:
    """The step, batch and stopping rules of :func:`streamed_g`.

    Attributes
    ----------
    beta_max, beta_min
        Curvature scales of the tensor (default: from μ and λ as ``landscape.g_parameters`` sets them,
        ``β_max = 0.1 λ``, ``β_min = μ λ``).
    target_angle
        Requested RMS angle (radians) of a row of B̃ to its minimum.
    step, theta, growth
        Step as a fraction of ``1 / (4 β_max)`` (1 is unstable from a random start); norm-test ratio;
        largest batch growth per step.
    confirm
        Consecutive steps on which the stopping test must hold (a saddle has a small gradient too).
    min_align
        Least share ``T(b̃_j⁴) / Σ_k T(b̃_j, b̃_j, b̃_k, b̃_k)`` of every row for the noise-floor growth
        and the stop (1 at the components, ``1 − ½ sin² 2φ`` for a row at angle φ in the plane of two).
    drift_angle
        RMS angle by which one step's noise may move a row.
    """

    beta_max: float | None = None
    beta_min: float | None = None
    target_angle: float = 0.05
    step: float = 0.5
    theta: float = 3.0
    growth: float = 4.0
    confirm: int = 2
    min_align: float = 0.8
    drift_angle: float = 0.2


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
    problem: GProblem,
    window: int,
) -> _Moments:
    """Map :func:`part_sums` over parts ``first, …, first + parts − 1`` (in windows) and sum their
    results in part order; gradients are taken to B̃ (``∂/∂B̃ = (∂/∂V) Wᵀ``) part by part."""
    t1, t2 = np.asarray(problem.t1, dtype=np.float64), np.asarray(problem.t2, dtype=np.float64)
    fn = partial(part_sums, draw, float(problem.t0), t1, t2, v, float(problem.mu))
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
class _Policy:
    """The step and batch rules of :func:`streamed_g`: its arguments, the step η, the curvature ``h = 4 β_min``
    and the step's contraction ``|1 − η h|``."""

    m: int
    mu: float
    lam: float
    beta_max: float
    beta_min: float
    eta: float
    h: float
    contraction: float
    target_angle: float
    theta: float
    growth: float
    part_size: int
    max_samples: int
    min_align: float
    drift_angle: float


def _policy(problem: GProblem, rules: StepRules, sizes: StreamSizes) -> _Policy:
    """The :class:`_Policy` of :func:`streamed_g`'s arguments (the β's by default from μ and λ)."""
    mu, lam = problem.mu, problem.lam
    beta_max = 0.1 * lam if rules.beta_max is None else float(rules.beta_max)
    beta_min = mu * lam if rules.beta_min is None else float(rules.beta_min)
    eta = rules.step / (4.0 * beta_max)
    h = 4.0 * beta_min
    contraction = abs(1.0 - eta * h)
    return _Policy(
        problem.m,
        mu,
        lam,
        beta_max,
        beta_min,
        eta,
        h,
        contraction,
        rules.target_angle,
        rules.theta,
        rules.growth,
        sizes.part_size,
        sizes.max_samples,
        rules.min_align,
        rules.drift_angle,
    )


@dataclass(frozen=True)
class _Assessment:
    """What one step's sums say at the iterate: the mean gradient of the tensor terms (``g_t``) and with the λ
    term (``g_full``), G and the standard errors, the debiased gradient norm (``signal``), the rows' shares
    (``align``), the cosine to the previous gradient, the predicted error, whether the rows are found, and
    ``T(b̂_j⁴)`` of the unit rows."""

    g_t: np.ndarray
    g_full: np.ndarray
    value: float
    se: float
    val_se: float
    signal: float
    align: np.ndarray
    corr: float | None
    err: float
    found: bool
    betas: np.ndarray


def _assess(acc: _Moments, b: np.ndarray, prev: tuple[np.ndarray, float] | None, policy: _Policy) -> _Assessment:
    """The :class:`_Assessment` of the sums ``acc`` at ``b``; ``prev``: the previous step's full gradient and
    its standard error."""
    g_t = acc.grad / acc.n
    se, val_se = acc.standard_errors()
    norms = np.einsum("ij,ij->i", b, b) - 1.0
    g_full = g_t + 4.0 * policy.lam * norms[:, None] * b
    value = acc.value / acc.n + policy.lam * float(norms @ norms)
    signal = math.sqrt(max(float(np.einsum("ij,ij->", g_full, g_full)) - se * se, 0.0))
    # share of row j's weight T(b_j, b_j, b_k, b_k) summed over k that is its own T(b_j⁴): 1 when
    # the rows are the components, ½ for a row midway between two (a saddle G may linger at)
    align = acc.own / np.where(acc.rows != 0.0, acc.rows, 1.0)
    # Pflug's diagnostic: successive gradients (independent samples) point alike while the
    # iterate drifts and turn away from each other once the noise drives it (the noise floor)
    corr = None if prev is None else float(np.einsum("ij,ij->", g_full, prev[0])) / (se * prev[1])
    # the error after this step: the distance |g| / h to the minimum contracted by the step,
    # and the noise the step puts in
    err = math.hypot(policy.contraction * signal / policy.h, policy.eta * se)
    found = float(align.min()) >= policy.min_align and distinct_rows(b) == policy.m
    # T(b̂_j⁴) for the unit rows: β_j at the components (for μ and λ of a second round)
    betas = acc.own / acc.n / np.maximum(np.einsum("ij,ij->i", b, b), 1e-300) ** 2
    return _Assessment(g_t, g_full, value, se, val_se, signal, align, corr, err, found, betas)


def _trace_row(k: int, used: int, batch: int, a: _Assessment, m: int) -> dict:
    """Step ``k``'s entry of the report's trace."""
    return {
        "step": k,
        "samples": used,
        "batch": batch,
        "G": a.value,
        "G_se": a.val_se,
        "grad_norm": a.signal,
        "grad_se": a.se,
        "successive_cos": a.corr,
        "rms_angle": a.err / math.sqrt(m),
        "align_min": float(a.align.min()),
        "align_mean": float(a.align.mean()),
    }


def _grown_parts(parts: int, used: int, a: _Assessment, policy: _Policy) -> int:
    """The parts of the next step's batch, from the standard errors: (i) the noise of a step moves a row by at
    most ``drift_angle`` (RMS), or the iterate wanders off the components and, with rows bunched, the step
    outgrows the curvature; (ii) norm test, noise at most θ times the gradient; (iii) at the noise floor near
    the components (successive gradients turned apart, rows found) the error is proportional to the noise:
    what brings it to 0.8 of the target. Never smaller: while drifting a fixed batch moves the iterate as far
    per sample as any other; at most ``growth`` times larger, and within the budget of samples."""
    m, se, signal = policy.m, a.se, a.signal
    factor = (policy.eta * se / (policy.drift_angle * math.sqrt(m))) ** 2
    if se > policy.theta * signal:
        factor = max(factor, (se / (policy.theta * signal)) ** 2 if signal > 0 else policy.growth)
    if a.corr is not None and a.corr < 0.0 and a.found:
        factor = max(factor, (a.err / (0.8 * policy.target_angle * math.sqrt(m))) ** 2)
    factor = min(policy.growth, max(1.0, factor))
    return max(parts, min(int(math.ceil(parts * factor)), -(-(policy.max_samples - used) // policy.part_size)))


def _report(
    policy: _Policy,
    k: int,
    used: int,
    seconds: float,
    stop: str,
    part_range: list[int],
    averaged: int,
    betas: np.ndarray,
    trace: list[dict],
) -> dict:
    """The report of :func:`streamed_g` (its docstring lists the fields)."""
    last = trace[-1] if trace else {}
    return {
        "steps": k,
        "samples": used,
        "seconds": seconds,
        "converged": stop == "target",
        "stop": stop,
        "parts": part_range,
        "eta": policy.eta,
        "mu": policy.mu,
        "lambda": policy.lam,
        "beta_max": policy.beta_max,
        "beta_min": policy.beta_min,
        "averaged_iterates": averaged,
        "final": {
            k_: last.get(k_)
            for k_ in ("batch", "G", "G_se", "grad_norm", "grad_se", "rms_angle", "align_min", "align_mean")
        },
        "row_betas": betas.tolist() if trace else None,
        "trace": trace,
    }


@dataclass(frozen=True)
class StreamedG:
    """What :func:`streamed_g` reached (``b``: B̃, m × m) and its report (JSON-ready)."""

    b: np.ndarray
    report: dict


def streamed_g(
    draw: Any,
    mapper: Callable = map,
    *,
    problem: GProblem,
    seed: int = 0,
    sizes: StreamSizes = StreamSizes(),
    rules: StepRules = StepRules(),
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
    problem
        The whitening, the first-pass statistics, the number of rows and μ, λ (:class:`GProblem`).
    seed
        The start: ``default_rng([seed, 29])`` Gaussian rows of norm about 1.
    sizes
        The first batch, the most steps and samples, the parts' size and first id (:class:`StreamSizes`).
    rules
        The curvature scales, the step, the batch growth and the stopping test (:class:`StepRules`).
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
    m, lam = problem.m, problem.lam
    w = np.asarray(problem.w, dtype=np.float64)
    if w.shape[0] != m:
        raise ValueError(f"the whitening has {w.shape[0]} rows for m = {m}")
    policy = _policy(problem, rules, sizes)
    eta = policy.eta
    rng = np.random.default_rng([seed, 29])
    b = rng.standard_normal((m, m)) / math.sqrt(m)
    parts = max(sizes.min_parts, -(-int(sizes.batch) // sizes.part_size))
    next_part = int(sizes.first_part)
    used = 0
    trace: list[dict] = []
    stop = "steps"
    k = held = 0
    betas = np.zeros(m)
    prev: tuple[np.ndarray, float] | None = None
    tail: list[np.ndarray] = []
    for k in range(1, sizes.steps + 1):
        acc = _stream(draw, mapper, next_part, parts, sizes.part_size, b @ w, w, problem, sizes.window)
        next_part += parts
        used += acc.n
        if not (math.isfinite(acc.value) and np.all(np.isfinite(acc.grad))):
            stop = "diverged"  # the step outgrew the curvature: report it, never return non-finite rows
            break
        a = _assess(acc, b, prev, policy)
        prev, betas = (a.g_full, a.se), a.betas
        b = prox_radial(b - eta * a.g_t, eta * lam)
        trace.append(_trace_row(k, used, acc.n, a, m))
        if callback is not None:
            callback(k, b)
        # a small gradient alone may be a saddle's: the rows must be the components too, twice running
        held = held + 1 if a.err <= rules.target_angle * math.sqrt(m) and a.found else 0
        tail = (tail + [b])[-rules.confirm :] if held else []
        if held >= rules.confirm:
            stop = "target"
            break
        if used >= sizes.max_samples:
            stop = "max_samples"
            break
        parts = _grown_parts(parts, used, a, policy)
    converged = stop == "target"
    if converged:
        b = np.mean(tail, axis=0)  # the iterates that passed the test: their mean has less noise
    seconds = time.perf_counter() - t_start
    part_range = [int(sizes.first_part), next_part]
    report = _report(policy, k, used, seconds, stop, part_range, len(tail) if converged else 0, betas, trace)
    return StreamedG(b, report)
