"""Method ``landscape``: the designed objective G of Ge–Lee–Ma (2017), "Learning one-hidden-layer
neural networks with landscape design".

Setting: ``y = Σ_i a_i relu(<b_i, x>) + ξ`` with ``a_i ≥ 0`` and ``B`` of full row rank
``m ≤ d`` (``m = d`` included, a width where enumeration over a net of the subspace is
hopeless). Since ``relu(<b, x>) = |b| relu(<u, x>)``, only the unit directions and the
products ``λ_i = a_i |b_i|`` are identifiable; the learned network has unit rows.

1. First pass (``hermite`` up to order 2): ``T_0, T_1, T_2``. ``T_2 = c_2 Σ λ_i u_i u_iᵀ`` is
   positive semidefinite of rank m (``c_2 > 0``); an eigenvalue below minus its noise floor
   means a negative output weight, outside the method's setting. Its top-m eigenvectors Q give
   the subspace and the whitening ``Λ^{-1/2} Qᵀ`` (their Appendix A.3; undercomplete m < d
   works in the subspace).
2. One more pass, ``projected_hermite`` on Q: the fourth moment on the subspace, on residual
   labels ``y − P_{≤2} y`` with ``P_{≤2}`` from the first pass (same expectation, about ten
   times less variance for ReLU units; docs/design.md §3). In the eigenbasis whitening is a
   diagonal scaling, so each entry's standard error scales the same way.
3. ``T = sign(c_4) T̃_4 = Σ_i β_i ũ_i^{⊗4}`` with orthonormal ``ũ_i``; G from many random starts
   (:mod:`.landscape.objective_g`), μ and λ from the theorem's conditions (``μ = c/κ``, ``λ = β_max/c``),
   β estimated from the tensor and, after a first round, from the rows found; λ at least the
   noise's bound (so that G is bounded below). The answer: the lowest G with m distinct rows.
4. Un-whiten (``u_i ∝ Q Λ^{1/2} b̃_i``, ``λ_i = |Λ^{1/2} b̃_i|² / c_2``), signs of the ``u_i``
   from ``T_1 = ½ Σ λ_i u_i`` (even orders cannot see them), then :func:`~.polish.dense.polish`
   (exact on noiseless labels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ... import hermite
from ...network import Network
from .. import base
from ..base import (
    Arrays,
    LearnResult,
    MissingStatisticError,
    NoSignalError,
    PassRequest,
    Samples,
    configured_lack,
    section_get,
)
from ..polish.dense import polish_and_select
from ..spectral import stage as spectral
from .objective_g import GParameters, StartResult, best_start, distinct_rows, minimize_g

__all__ = [
    "MAX_PASSES",
    "required_statistics",
    "learn",
    "NegativeWeightsError",
    "TooFewSamplesError",
    "whitened_tensor",
    "g_parameters",
    "lacks",
    "check_setting",
]

#: one extra pass: the fourth moment on the found subspace
MAX_PASSES = 1
#: the theorem's small constant: ``μ = C/κ``, ``λ = β_max/C``
C_THEOREM = 0.1
#: above this width the fourth moment on the subspace (C(m+3, 4) entries, about m⁴/4 flops per sample) gives
#: way to the paper's streamed stochastic gradient of G (O(m d) per sample); ``--route`` overrides
STREAM_WIDTH = 32
#: samples of the pilot estimate of the β's on the streamed route
PILOT_SAMPLES = 1_000_000
#: samples per mapped part of a pilot
PILOT_PART = 16_384
#: rows of a start are the same unit up to sign when closer than this angle (radians)
SAME_ROW_ANGLE = 0.3

_C2, _C4, _C1 = (hermite.relu_hermite_coefficient(l) for l in (2, 4, 1))


class NegativeWeightsError(ValueError):
    """The statistics show a negative output weight: outside the setting of Ge–Lee–Ma."""


class TooFewSamplesError(base.TooFewSamplesError):
    """The fourth moment is too noisy at this sample count; the message gives the count needed."""


class NoEigenvalueError(TooFewSamplesError, NoSignalError):
    """``T_2`` has no eigenvalue above its noise floor: nothing but the mean is supported."""


def required_statistics(d: int, width: int | None = None) -> dict:
    """The ``statistics`` config section the first pass needs: ``T_0, T_1, T_2``."""
    return {"basic": {}, "hermite": {"max_order": 2}}


def sample_sizes(d: int, width: int) -> tuple[int, int]:
    """Training and validation sample sizes of the polish (``k·d`` unknowns)."""
    return max(20_000, 40 * width * d), max(10_000, 10 * width * d)


def lacks(sections: Mapping[str, Any], outputs: int | None = None) -> MissingStatisticError | None:
    """What a configuration's statistics ``sections`` lack for this method, before anything is written."""
    h = sections.get("hermite")
    if h is not None and int(section_get(h, "max_order") or 4) >= 2:
        return None
    return configured_lack("landscape", "hermite", "T_0, T_1 and T_2", "{max_order: 2}")


def _first_pass(stats: Mapping[str, Arrays]) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, int]:
    """``T_0, T_1, T_2, se(T_2)`` and d from the stored ``hermite`` statistic."""
    h = stats.get("hermite")
    if h is None or "T2" not in h:
        raise MissingStatisticError.lacking("landscape", "hermite", "T_0, T_1 and T_2", "{max_order: 2}")
    if "output" in h:
        raise ValueError("the 'landscape' method learns a scalar label; this store holds a label vector")
    d = int(np.asarray(h["T1"]).shape[0])
    t2 = hermite.unpack(np.asarray(h["T2"]), d, 2)
    se2 = hermite.unpack(np.asarray(h["T2_se"]), d, 2)
    return float(np.asarray(h["T0"]).reshape(())), np.asarray(h["T1"], dtype=np.float64), t2, se2, d


def _subspace(t2: np.ndarray, se2: np.ndarray, width: int | None, d: int, n: int, report: dict) -> spectral.Spectrum:
    """The spectrum of ``T_2`` against its floor; refuses negative weights and a rank below ``width``."""
    spec = spectral.spectrum(t2, se2, name="T_2")
    report["T2_spectrum"] = spec.to_dict()
    negative = spec.eigenvalues[spec.eigenvalues < -spec.floor]
    if negative.size:
        raise NegativeWeightsError(
            f"T_2 = E[y (xxᵀ − I)] has {negative.size} eigenvalue(s) below minus its noise floor "
            f"({', '.join(f'{v:.3g}' for v in negative[:4])}; floor {spec.floor:.3g}): for y = Σ a_i relu(<b_i, x>) it "
            "equals c_2 Σ a_i |b_i| u_i u_iᵀ with c_2 > 0, so some output weight a_i is negative. The landscape "
            "method (Ge–Lee–Ma) assumes a ≥ 0; use --method moments, which allows output weights of either sign"
        )
    rank = spec.rank
    if width is not None and width > d:
        raise ValueError(f"--width {width} exceeds d = {d}: the landscape method needs B of full row rank m ≤ d")
    if width is not None and rank < width:
        e = abs(float(spec.eigenvalues[width - 1])) if width <= len(spec.eigenvalues) else 0.0
        needed = int(math.ceil(n * 1.2 * (spec.floor / e) ** 2)) if e > 0 else None
        raise TooFewSamplesError(
            f"T_2 has {rank} eigenvalue(s) above its noise floor ({spec.floor:.3g}) but --width is {width} (the "
            f"{width}-th is {e:.3g}): either B is not of full row rank {width} (parallel rows, or rows that are "
            f"combinations of others, cannot be told apart; the method needs rank m = width) or {n:,} samples do not "
            "resolve the weakest unit"
            + (f", which about {needed:,} samples would (the floor falls as 1/√n)" if needed else "")
            + f"; or learn with --width {rank}"
        )
    if rank == 0:
        raise NoEigenvalueError(
            "T_2 has no eigenvalue above its noise floor: the statistics are pure noise at this sample count; "
            "estimate with more samples (`relulearn estimate ... --samples N`)"
        )
    return spec


def _count(arrays: Arrays) -> int:
    """Samples behind a stored statistic."""
    return int(np.asarray(arrays["count"]).reshape(-1)[0])


def whitened_tensor(t4_packed: np.ndarray, se4_packed: np.ndarray, eig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The whitened fourth moment ``T_4 / sqrt(Λ_a Λ_b Λ_c Λ_d)`` in the eigenbasis of ``T_2``,
    and its standard errors, both full ``(r,)*4``."""
    r = eig.shape[0]
    s = 1.0 / np.sqrt(eig)
    scale = np.einsum("a,b,c,d->abcd", s, s, s, s)
    return hermite.unpack(t4_packed, r, 4) * scale, hermite.unpack(se4_packed, r, 4) * scale


def _power_max(t: np.ndarray, seed: int, tries: int = 8, iters: int = 100) -> float:
    """``max_v T(v, v, v, v)`` over unit v by the shifted power method (β_max of an orthogonal
    tensor with positive weights), from a few random starts."""
    r = t.shape[0]
    rng = np.random.default_rng([seed, 4])
    best = 0.0
    shift = float(np.abs(t).sum(axis=(1, 2, 3)).max())  # makes the map monotone (Kolda–Mayo)
    for _ in range(tries):
        v = rng.standard_normal(r)
        v /= np.linalg.norm(v)
        for _ in range(iters):
            w = np.einsum("abcd,b,c,d->a", t, v, v, v) + shift * v
            v = w / np.linalg.norm(w)
        best = max(best, float(np.einsum("abcd,a,b,c,d->", t, v, v, v, v)))
    return best


def g_parameters(t: np.ndarray, se: np.ndarray, betas: np.ndarray | None, seed: int) -> GParameters:
    """μ and λ of G from the theorem's conditions and the noise.

    ``β_max`` comes from the power method, ``β_min`` from the rows of a first round when
    given (``betas``) or else the mean ``trace/m``. ``μ = C/κ``, ``λ = max(β_max/C, m ν)``
    where ``ν`` bounds the operator norm of the noise in the r² × r² unfolding (spectral
    noise floor of the standard errors): the quartic part of G is then bounded below whatever
    the noise, ``Σ_{j≠k} E(b_j, b_j, b_k, b_k) ≥ −ν (Σ_j |b_j|²)² ≥ −m ν Σ_j |b_j|⁴``.
    """
    r = t.shape[0]
    trace = float(np.einsum("aabb->", t))
    if betas is not None:
        beta_max, beta_min = float(betas.max()), float(betas.min())
    else:
        beta_max = max(_power_max(t, seed), trace / r)
        beta_min = trace / r
    nu = spectral.noise_floor(se.reshape(r * r, r * r))
    beta_min = max(beta_min, 1e-300)
    mu = C_THEOREM * beta_min / beta_max
    lam = max(beta_max / C_THEOREM, r * nu)
    return GParameters(mu=mu, lam=lam, beta_max=beta_max, beta_min=beta_min, noise=nu)


def _row_betas(t: np.ndarray, b: np.ndarray) -> np.ndarray:
    bn = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.einsum("abcd,ja,jb,jc,jd->j", t, bn, bn, bn, bn)


def _minimize(
    t: np.ndarray, se: np.ndarray, m: int, n: int, starts: int, seed: int, mapper: Callable, report: dict
) -> tuple[StartResult, list[StartResult], GParameters]:
    """Two rounds of G: parameters from the tensor, then from the β of the rows found."""
    tmat = t.reshape(m * m, m * m)
    params = g_parameters(t, se, None, seed)
    rounds = []
    for rnd in range(2):
        results = minimize_g(tmat, m, params, starts=starts, seed=(seed, 7, rnd), mapper=mapper)
        best = best_start(results, m)
        rounds.append(
            {
                "parameters": params.to_dict(),
                "starts": [s.to_dict() for s in results],
                "best_start": None if best is None else best.start,
            }
        )
        if best is None:
            break
        betas = _row_betas(t, best.b)
        if betas.min() <= 0:
            break
        new = g_parameters(t, se, betas, seed)
        # rerun only when the first round's μ or λ broke the theorem's conditions for the β found
        if params.mu <= new.mu * 1.5 and params.lam >= new.lam / 1.5:
            break
        params = new
    report["rounds"] = rounds
    if best is None:
        unbounded = sum(s.unbounded for s in results)
        rho = params.noise / max(params.beta_min, 1e-300)
        # ρ ∝ 1/√n: the samples at which it falls to the accepted ratio, and at least twice these
        needed = max(2 * n, int(math.ceil(n * (rho / MAX_NOISE_RATIO) ** 2)))
        raise TooFewSamplesError(
            f"no start of G reached {m} distinct rows ({unbounded} of {len(results)} ran off to infinity): the fourth "
            f"moment is too noisy at {n:,} samples for G's landscape (noise-to-signal {rho:.2f}); about {needed:,} "
            f"samples are needed (`relulearn estimate ... --samples {needed}`); every start is in the report"
        )
    return best, results, params


def _check_noise(params: GParameters, n: int) -> dict:
    """The noise-to-signal ratio of the fourth moment at the answer, and the samples needed.

    The gradient noise on a row is about ``ν_row = ||E(·, b_j, b_k, b_k) summed||`` and the
    restoring curvature about ``β_min``; we measure ``ρ = ν / β_min`` with ``ν`` the operator
    bound of the noise, and ask ``ρ ≤`` :data:`MAX_NOISE_RATIO` (at which the row angles
    stay below about 0.2; measured in the tests and the benchmark).
    """
    rho = params.noise / max(params.beta_min, 1e-300)
    needed = int(math.ceil(n * (rho / MAX_NOISE_RATIO) ** 2))
    out = {"noise_to_signal": rho, "max_noise_to_signal": MAX_NOISE_RATIO, "samples": n, "samples_needed": needed}
    if rho > MAX_NOISE_RATIO:
        raise TooFewSamplesError(
            f"the fourth moment's noise is {rho:.2f} times the smallest unit's signal (at most {MAX_NOISE_RATIO} "
            f"keeps G's minima near the truth): {n:,} samples are too few; about {needed:,} are needed "
            f"(`relulearn estimate ... --samples {needed}`)"
        )
    return out


#: largest noise-to-signal ratio ν/β_min of the whitened fourth moment that is accepted
MAX_NOISE_RATIO = 1.5


def check_setting(source: Any, options: dict[str, Any], outputs: int | None) -> dict[str, Any]:
    """Refuse a planted or file teacher outside Ge–Lee–Ma's setting ``y = aᵀ relu(B x)``, ``a ≥ 0``,
    ``B`` of full row rank ``m ≤ d``, naming what differs and what to use instead."""
    net = getattr(source, "network", None)
    if net is None:
        return options
    if net.depth != 1 or net.biases is not None or net.activation != "relu" or net.output_dim != 1:
        raise ValueError(
            "--method landscape learns y = aᵀ relu(B x) (one hidden ReLU layer, no biases, one output; Ge–Lee–Ma); "
            f"the teacher has {net.depth} hidden layer(s), activation {net.activation}"
            f"{', biases' if net.biases is not None else ''} and {net.output_dim} output(s); use --method "
            "filtered-pca for deep networks or --method exact for other rectified activations"
        )
    a, b = net.weights[1][0], net.weights[0]
    if np.any(a < 0):
        raise NegativeWeightsError(
            f"the teacher has {int(np.sum(a < 0))} negative output weight(s); the landscape method (Ge–Lee–Ma) assumes "
            "a ≥ 0 (its T_2 would not be positive semidefinite); use --method moments, which allows either sign"
        )
    m, d = b.shape
    rank = int(np.linalg.matrix_rank(b))
    if m > d or rank < m:
        raise ValueError(
            f"the teacher's B ({m} × {d}) has rank {rank} < {m} rows: the landscape method needs B of full row rank "
            "(m ≤ d, no row a combination of others), where whitening by T_2 makes the fourth moment orthogonal; "
            "use --method moments for parallel or too many units"
        )
    return options


def learn(
    stats: Mapping[str, Arrays],
    passes: Sequence[Mapping[str, Arrays]],
    samples: Callable[[int, int], Samples],
    *,
    width: int | None = None,
    starts: int | None = None,
    route: str | None = None,
    mapper: Callable = map,
    seed: int = 0,
) -> LearnResult | PassRequest:
    """Learn ``y = Σ a_i relu(<b_i, x>)``, ``a ≥ 0``, ``B`` of full row rank, by minimizing G.

    Parameters
    ----------
    stats
        The main store's statistics (``hermite`` up to order 2).
    passes
        Statistics of the extra pass (``projected_hermite`` on the subspace), once run.
    samples
        ``samples(n_train, n_val)`` draws bounded held-out samples (for the polish).
    width
        The number m of hidden units (default: the rank of ``T_2`` above its noise floor).
    starts
        Random starts of G (default 8; on the streamed route, one start).
    route
        ``"moments"``: G from the fourth moment on the subspace (one extra pass); ``"stream"``: the
        paper's stochastic gradient of G on fresh samples (``samples.part``), never forming the fourth
        moment. Default: ``"stream"`` above :data:`STREAM_WIDTH` units, else ``"moments"``.
    mapper
        ``map``-like callable over which the starts run.

    Returns
    -------
    LearnResult or PassRequest

    Raises
    ------
    NegativeWeightsError
        When ``T_2`` shows a negative output weight.
    TooFewSamplesError
        When the fourth moment is too noisy for G (the message gives the samples needed).
    """
    starts = 8 if starts is None else int(starts)
    if starts < 1:
        raise ValueError(f"--starts must be at least 1, got {starts}")
    t0, t1, t2, se2, d = _first_pass(stats)
    report: dict[str, Any] = {}
    spec = _subspace(t2, se2, width, d, _count(stats["hermite"]), report)
    m = width or spec.rank
    q, eig = spec.eigenvectors[:, :m], spec.eigenvalues[:m]
    route = route or ("stream" if m > STREAM_WIDTH else "moments")
    if route not in ("moments", "stream"):
        raise ValueError(f"--route must be 'moments' or 'stream', got {route!r}")
    report["route"] = route
    if route == "stream":
        bt, params = _stream_route(samples, mapper, seed, t0, t1, t2, q, eig, report)
        return _finish(bt, q, eig, t1, d, m, samples, params, report)
    if not passes:
        return PassRequest(
            "projected-hermite",
            {
                "projected_hermite": {
                    "basis": q.T.tolist(),
                    "max_order": 4,
                    "expansion": {"t0": t0, "t1": t1.tolist(), "t2": t2.tolist()},
                }
            },
            f"the fourth moment on the {m}-dimensional subspace of T_2, on residual labels y − P≤2 y",
        )
    ph = passes[-1]["projected_hermite"]
    basis = np.asarray(ph["basis"])
    if basis.shape != (m, d) or not np.allclose(basis, q.T):
        raise ValueError("the stored projected_hermite pass was computed on another subspace; remove STORE/passes")
    n = _count(ph)
    t4w, se4w = whitened_tensor(np.asarray(ph["T4"]), np.asarray(ph["T4_se"]), eig)
    t = np.sign(_C4) * t4w
    report["labels"] = {"first_pass": "y", "fourth_moment": "y − P≤2 y (T_0, T_1, T_2 of the first pass)"}
    best, results, params = _minimize(t, se4w, m, n, starts, seed, mapper, report)
    report["parameters"] = params.to_dict()
    report["noise"] = _check_noise(params, n)
    report["summary"] = _summary(report, best, results)
    return _finish(best.b, q, eig, t1, d, m, samples, params, report)


def _finish(
    b: np.ndarray,
    q: np.ndarray,
    eig: np.ndarray,
    t1: np.ndarray,
    d: int,
    m: int,
    samples: Callable[[int, int], Samples],
    params: GParameters,
    report: dict,
) -> LearnResult:
    """Un-whiten the rows ``b`` of G's minimum, sign them from ``T_1``, and polish."""
    # un-whiten: u ∝ Q Λ^{1/2} b̃ for unit b̃, λ = |Λ^{1/2} b̃|² / c_2
    bt = b / np.linalg.norm(b, axis=1, keepdims=True)
    w = bt * np.sqrt(eig)[None, :]
    lam = np.einsum("ij,ij->i", w, w) / _C2
    u = w @ q.T
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    # even orders cannot see the sign of u; T_1 = c_1 Σ λ_i u_i does
    coef = np.linalg.lstsq(u.T, t1, rcond=None)[0]
    u *= np.where(coef < 0, -1.0, 1.0)[:, None]
    report["sign_coefficients"] = (coef / (_C1 * lam)).tolist()
    start = Network((u, lam[None, :]), activation="relu")
    report["before_polish"] = {"W0": u.tolist(), "W1": lam[None, :].tolist()}
    smp = samples(*sample_sizes(d, m))
    chosen, net = polish_and_select(start, smp.x_train, smp.y_train, smp.x_val, smp.y_val, report)
    report["chosen"] = "landscape" if chosen == "enumeration" else chosen
    report["validation_relative_loss"] = {
        ("landscape" if k == "enumeration" else k): v for k, v in report["validation_relative_loss"].items()
    }
    report["width"] = m
    report.setdefault("summary", {"width": m, "route": report["route"]})
    report["summary"]["chosen"] = report["chosen"]
    return LearnResult(net, report)


def _summary(report: dict, best: StartResult, results: list[StartResult]) -> dict:
    agree = [
        s
        for s in results
        if not s.unbounded
        and s.distinct == best.b.shape[0]
        and abs(s.value - best.value) <= 1e-6 * max(1.0, abs(best.value))
    ]
    return {
        "width": int(best.b.shape[0]),
        "route": "moments",
        "starts": len(results),
        "starts_at_lowest_G": len(agree),
        "lowest_G": best.value,
        "noise_to_signal": report["noise"]["noise_to_signal"],
    }


def _pilot_parts(n: int) -> int:
    """Parts of :data:`PILOT_PART` samples a pilot of ``n`` samples maps (at least two, for a spread)."""
    return max(2, -(-n // PILOT_PART))


def _pilot(
    samples: Any, mapper: Callable, t: tuple, v: np.ndarray, first: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row j of ``v``: ``T(v_j⁴)`` and ``Σ_k T(v_j, v_j, v_k, v_k)``, streamed from ``n`` fresh samples
    (parts ``first, first + 1, …``)."""
    from functools import partial

    from .sums import part_sums

    size = PILOT_PART
    items = [(first + i, size) for i in range(_pilot_parts(n))]
    fn = partial(part_sums, samples, float(t[0]), np.asarray(t[1]), np.asarray(t[2]), v, 0.0)
    own, rows = 0.0, 0.0
    for r in mapper(fn, items):  # summed in part order
        own, rows = own + r.own, rows + r.rows
    total = size * len(items)
    return np.asarray(own) / total, np.asarray(rows) / total


def _pilot_parameters(own: np.ndarray, rows: np.ndarray, m: int) -> GParameters:
    """μ and λ from a pilot at the whitened basis rows (:func:`_stream_route`): the trace's mean β̄ and
    ``max(β̄, max_a T(e_a⁴))``; refuses a trace without the sign of a ReLU network's signal."""
    beta_bar = float(rows.sum()) / m
    if beta_bar <= 0:
        raise TooFewSamplesError(
            f"the streamed trace of the whitened fourth moment is {beta_bar:.3g} ≤ 0 from {PILOT_SAMPLES:,} samples: "
            "no fourth-order signal of the sign a ReLU network with a ≥ 0 gives; check the teacher, or use more samples"
        )
    beta_max = max(beta_bar, float(own.max()))
    return GParameters(
        mu=C_THEOREM * beta_bar / beta_max,
        lam=2.0 * beta_max / C_THEOREM,
        beta_max=beta_max,
        beta_min=beta_bar,
        noise=float("nan"),
    )


def _streamed_round(
    samples: Any, mapper: Callable, w: np.ndarray, t: tuple, params: GParameters, seed: int, first: int
) -> tuple[Any, np.ndarray]:
    """One round of G on the stream from part ``first`` on (:func:`.landscape.stream.streamed_g`), and the β
    of each row found, from fresh samples after the run (parts past every part it used)."""
    from .stream import GProblem, StepRules, StreamSizes, streamed_g

    res = streamed_g(
        samples,
        mapper,
        problem=GProblem(w=w, t0=t[0], t1=t[1], t2=t[2], m=w.shape[0], mu=params.mu, lam=params.lam),
        seed=seed,
        sizes=StreamSizes(first_part=first),
        rules=StepRules(beta_max=params.beta_max, beta_min=params.beta_min),
    )
    v = (res.b / np.linalg.norm(res.b, axis=1, keepdims=True)) @ w
    own_rows, _ = _pilot(samples, mapper, t, v, int(res.report["parts"][1]), PILOT_SAMPLES)
    return res, own_rows


def _conditions(params: GParameters, own_rows: np.ndarray) -> dict[str, Any]:
    """Whether μ and λ met the theorem's conditions (within a factor 1.5) for the β's of the rows found."""
    bmax, bmin = float(own_rows.max()), float(own_rows.min())
    kappa = bmax / max(bmin, 1e-300)
    held = bool(bmin > 0 and params.mu <= 1.5 * C_THEOREM / kappa and params.lam >= bmax / C_THEOREM / 1.5)
    return {"kappa": kappa, "mu_at_most": C_THEOREM / kappa, "lambda_at_least": bmax / C_THEOREM, "held": held}


def _theorem_parameters(params: GParameters, own_rows: np.ndarray) -> GParameters:
    """μ and λ that meet the theorem's conditions for the β's of the rows found (λ never lowered)."""
    bmax, bmin = float(own_rows.max()), float(own_rows.min())
    kappa = bmax / max(bmin, 1e-300)
    return GParameters(
        mu=C_THEOREM / kappa,
        lam=max(params.lam, bmax / C_THEOREM),
        beta_max=bmax,
        beta_min=bmin,
        noise=float("nan"),
    )


def _stream_summary(m: int, rounds: list[dict], last: dict, b: np.ndarray) -> dict[str, Any]:
    """The report's summary of the streamed route (``last``: the last round's stream report)."""
    return {
        "width": m,
        "route": "stream",
        "rounds": len(rounds),
        "samples_streamed": sum(r["stream"]["samples"] for r in rounds),
        "steps": sum(r["stream"]["steps"] for r in rounds),
        "converged": last.get("converged"),
        "conditions_held": rounds[-1]["conditions"]["held"],
        "distinct_rows": distinct_rows(b),
    }


def _stream_route(
    samples: Any,
    mapper: Callable,
    seed: int,
    t0: float,
    t1: np.ndarray,
    t2: np.ndarray,
    q: np.ndarray,
    eig: np.ndarray,
    report: dict,
) -> tuple[np.ndarray, GParameters]:
    """G by the paper's stochastic gradient on fresh samples (:mod:`.landscape.stream`).

    μ and λ need the β's of the whitened tensor without forming it: a pilot of
    :data:`PILOT_SAMPLES` fresh samples streams ``Σ_ab T(e_a, e_a, e_b, e_b) = Σ_i β_i`` (the
    whitened basis rows; the trace of an orthogonal tensor) and ``max_a T(e_a⁴)``; κ is unknown
    before the rows are found, so μ = C·β̄/β_max with the trace's mean β̄, and λ = 2 max(β̄, max_a T(e_a⁴))/C.
    The rows found then give each β_j, reported with whether the theorem's conditions held.
    """
    m = len(eig)
    w = (q / np.sqrt(eig)[None, :]).T  # Λ^{-1/2} Qᵀ, m × d
    t = (t0, t1, t2)
    pilot_parts = _pilot_parts(PILOT_SAMPLES)
    own, rows = _pilot(samples, mapper, t, w, 2, PILOT_SAMPLES)
    params = _pilot_parameters(own, rows, m)
    rounds = []
    first = 2 + pilot_parts
    for rnd in range(2):
        res, own_rows = _streamed_round(samples, mapper, w, t, params, seed + rnd, first)
        first = int(res.report["parts"][1]) + pilot_parts
        conditions = _conditions(params, own_rows)
        rounds.append(
            {
                "parameters": params.to_dict(),
                "stream": res.report,
                "row_betas": own_rows.tolist(),
                "conditions": conditions,
            }
        )
        if conditions["held"] or float(own_rows.min()) <= 0:
            break
        # the theorem's conditions for the β's found: run again with them
        params = _theorem_parameters(params, own_rows)
    report["labels"] = {"first_pass": "y", "streamed_gradient": "y − P≤2 y (T_0, T_1, T_2 of the first pass)"}
    report["parameters"] = params.to_dict()
    report["rounds"] = rounds
    report["summary"] = _stream_summary(m, rounds, res.report, res.b)
    return res.b, params
