"""Method ``polynomial``: the Hermite expansion truncated at degree L (Daniely–Srebro–Vardi 2023,
"Most neural networks are almost learnable").

Random Xavier networks of constant depth with Lipschitz activations are close in L² to
low-degree polynomials, so an improper learner that fits the best degree-L polynomial learns
them. Under Gaussian inputs the best degree-L approximation in L² is read off the moments
relulearn streams (docs/design.md §3): ``f̂_L(x) = Σ_{l ≤ L} <T̂_l, He_l(x)> / l!``; its excess
error over the population truncation is ``Σ_{l ≤ L} ‖T̂_l − T_l‖_F² / l!``, whose expectation
``Σ_l V_l / l!`` (``V_l = Σ_entries multiplicity · se²``) is the *predicted variance term*.

Steps:

1. ``T_0 .. T_2`` from the stored ``hermite`` statistic (``fit`` asks for ``max_order = 2``, or
   ``max_order = L`` with ``residual=False``, when the stored orders ≥ 3 are used as they are).
2. **Residual pass** (default for L ≥ 3): ``T_0 .. T_L`` in one more pass, on labels less the
   degree-≤2 expansion ``P_{≤2} y`` of step 1. He_l is orthogonal to every polynomial of lower
   degree, so orders ≥ 3 keep their mean while their variance falls with ``E[(y − P_{≤2} y)²]``
   (for ReLU nets about 2 % of ``E[y²]``).
3. **Shrinkage** (``shrink``; default ``order``, ``none`` for plain projection): ``order`` scales each
   ``T̂_l`` by the positive-part James–Stein factor ``max(0, 1 − V_l / ‖T̂_l‖²)``, the factor that minimises the estimated
   error ``‖s T̂_l − T_l‖²``; ``entry`` scales each packed entry by ``max(0, 1 − se² / T̂²)``
   (a Wiener filter per coefficient). Shrinking wins where an order's signal is comparable
   with its noise (``‖T_l‖² ≲ V_l``: high degree, few samples) and costs little elsewhere.
4. **Degree**: given, or the one of least error on held-out samples (the source's held-out
   stream, never the run's chunks); the report also gives, per degree, the predicted variance
   and the estimated Hermite tail ``1 − Σ_{l ≤ L} (‖T̂_l‖² − V_l) / (l! E[y²])``.

With ``subspace``: the relevant subspace comes first, from ``T_2`` and the filtered matrices
``M_τ`` when the store has them (:func:`.spectral.stage.relevant_subspace`) and ``T_1`` when it clears
its noise; then one ``projected_hermite`` pass (shared with ``landscape``) gives the expansion
of ``z = P x`` to a higher degree at ``C(r+l−1, l)`` entries per order instead of ``C(d+l−1, l)``,
for teachers whose first layer has few rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import hermite
from ...polynomial import PolynomialModel
from ..base import LearnResult, MissingStatisticError, PassRequest, Samples, configured_lack, section_get
from ..spectral import stage as spectral
from ..spectral.stored_matrices import FilterGridError, filtered_matrices

__all__ = [
    "MAX_PASSES",
    "DEFAULT_DEGREE",
    "SHRINK",
    "required_statistics",
    "learn",
    "max_degree",
    "check_degree",
    "DegreeError",
    "Expansion",
    "shrink_tensors",
    "tail_and_variance",
    "lacks",
    "check_setting",
]

Arrays = Mapping[str, np.ndarray]

#: one pass: the residual tensors, or the projected tensors on the found subspace
MAX_PASSES = 1
#: the largest degree ``fit`` estimates when none is given (the degree is then chosen on held-out samples)
DEFAULT_DEGREE = 4
#: the same for a subspace expansion (the ``projected_hermite`` statistic goes to order 6)
DEFAULT_SUBSPACE_DEGREE = 6
#: highest order of the stored families: ``hermite`` (full) and ``projected_hermite`` (subspace)
ORDER_LIMIT, SUBSPACE_ORDER_LIMIT = 8, 6
#: the entry budget of a ``hermite`` statistic (its ``max_entries`` default)
MAX_ENTRIES = 2_000_000
SHRINK = ("none", "order", "entry")
#: the τ grid of the filtered matrices a subspace fit asks for (quantiles of |y|)
QUANTILES = [0.1, 0.25, 0.5, 0.75, 0.9, 0.97]
#: held-out samples for the choice of degree: at most this many entry evaluations in all
_VALIDATION_WORK = 4e9


class DegreeError(ValueError):
    """A degree the store's tensors or the entry budget cannot give; the message says what can."""


def _entries(d: int, degree: int) -> int:
    """Packed entries of ``T_0 .. T_degree`` at dimension ``d``: ``Σ_l C(d+l−1, l) = C(d+degree, degree)``."""
    return math.comb(d + degree, degree)


def max_degree(d: int, max_entries: int = MAX_ENTRIES, limit: int = ORDER_LIMIT) -> int:
    """The largest degree ``L ≤ limit`` whose packed tensors ``T_0..T_L`` fit ``max_entries``."""
    return max((L for L in range(limit + 1) if _entries(d, L) <= max_entries), default=0)


def check_degree(
    d: int, degree: int, max_entries: int = MAX_ENTRIES, *, limit: int = ORDER_LIMIT, what: str = "statistics.hermite"
) -> None:
    """Refuse a degree the statistics cannot hold, naming the entry count, the limit and the largest degree
    that fits."""
    if degree < 0:
        raise DegreeError(f"--degree must be >= 0, got {degree}")
    if degree > limit:
        raise DegreeError(
            f"--degree {degree} is above {what}'s largest order {limit}; use --degree {limit} or less"
            + (" (or --subspace with a few directions)" if what == "statistics.hermite" else "")
        )
    n = _entries(d, degree)
    if n > max_entries:
        raise DegreeError(
            f"--degree {degree} at d = {d} needs T_0..T_{degree} with {n:,} packed entries, more than the limit "
            f"{max_entries:,} ({what}.max_entries); the largest degree that fits is "
            f"{max_degree(d, max_entries, limit)}. "
            "Use a lower --degree, raise max_entries (memory grows with it), or --subspace, which expands the "
            "inputs projected on the relevant subspace"
        )


def check_setting(source: Any, options: dict[str, Any], outputs: int | None) -> dict[str, Any]:
    """Refuse whitened data (the polynomial would be of the whitened inputs) and a degree the statistics
    cannot hold."""
    if getattr(source, "whitening", None) is not None:
        raise ValueError(
            "--method polynomial on whitened data would give a polynomial of the whitened inputs; "
            "set source.data.whiten: false (inputs already of mean 0 and identity covariance), or use "
            "--method moments"
        )
    if options.get("degree") is not None:
        if options.get("subspace"):
            check_degree(1, options["degree"], limit=SUBSPACE_ORDER_LIMIT, what="statistics.projected_hermite")
        else:
            check_degree(source.d, options["degree"])
    return options


def required_statistics(
    d: int,
    width: int | None = None,
    degree: int | None = None,
    subspace: bool | None = None,
    residual: bool | None = None,
) -> dict:
    """The ``statistics`` section the first pass needs.

    ``T_0..T_L`` (``L`` = ``degree`` or :data:`DEFAULT_DEGREE`, within the entry budget) when the
    orders ≥ 3 are used as stored (``residual=False``); otherwise only ``T_0..T_2``, since the
    residual pass estimates ``T_0..T_L`` anyway (half the work of estimating them twice); with
    ``subspace``, ``T_0..T_2`` and the filtered matrices that find the subspace.
    """
    if subspace:
        return {"basic": {}, "hermite": {"max_order": 2}, "filtered": {"quantiles": list(QUANTILES)}}
    degree = _default_degree(d) if degree is None else degree
    check_degree(d, degree)
    use_residual = (residual is None or residual) and degree >= 3
    return {"basic": {}, "hermite": {"max_order": 2 if use_residual else degree}}


def _default_degree(d: int) -> int:
    return min(DEFAULT_DEGREE, max_degree(d))


# ------------------------------------------------------------------ the tensors


@dataclass(frozen=True)
class Expansion:
    """Packed ``T̂_0..T̂_L`` over ``r`` coordinates with their standard errors (entrywise)."""

    tensors: tuple[np.ndarray, ...]
    ses: tuple[np.ndarray, ...]
    dim: int

    @property
    def degree(self) -> int:
        return len(self.tensors) - 1

    def norms(self) -> np.ndarray:
        """``‖T̂_l‖_F² / l!`` per order: each degree's share of ``E[f̂²]``."""
        return np.array(
            [float(hermite.multiplicities(self.dim, l) @ t**2) / math.factorial(l) for l, t in enumerate(self.tensors)]
        )

    def variances(self) -> np.ndarray:
        """``V_l / l! = Σ_entries multiplicity · se² / l!`` per order: the expected excess error of degree l."""
        return np.array(
            [float(hermite.multiplicities(self.dim, l) @ s**2) / math.factorial(l) for l, s in enumerate(self.ses)]
        )


def _stored_orders(arrays: Arrays) -> int:
    """The highest ``T_l`` a stored Hermite statistic holds."""
    return max(int(k[1:]) for k in arrays if k.startswith("T") and k[1:].isdigit())


def _tensors(arrays: Arrays, orders: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return (
        [np.asarray(arrays[f"T{l}"], dtype=np.float64).reshape(-1) for l in orders],
        [np.asarray(arrays[f"T{l}_se"], dtype=np.float64).reshape(-1) for l in orders],
    )


def shrink_tensors(exp: Expansion, how: str) -> tuple[Expansion, list[float]]:
    """The expansion shrunk by its standard errors (module docstring, step 3), and the factor per order
    (for ``entry``: the multiplicity-weighted mean factor)."""
    if how not in SHRINK:
        raise ValueError(f"--shrink must be one of {', '.join(SHRINK)}, got {how!r}")
    if how == "none":
        return exp, [1.0] * (exp.degree + 1)
    out, factors = [], []
    f: float | np.ndarray
    for l, (t, s) in enumerate(zip(exp.tensors, exp.ses)):
        mult = hermite.multiplicities(exp.dim, l)
        if how == "order":
            signal = float(mult @ t**2)
            f = max(0.0, 1.0 - float(mult @ s**2) / signal) if signal > 0 else 0.0
            out.append(f * t)
            factors.append(f)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                f = np.where(t != 0, np.maximum(0.0, 1.0 - s**2 / t**2), 0.0)
            out.append(f * t)
            factors.append(float(mult @ f / mult.sum()))
    return Expansion(tuple(out), exp.ses, exp.dim), factors


def tail_and_variance(exp: Expansion, ey2: float) -> dict[str, list[float]]:
    """Per degree L (relative to ``E[y²]``): the estimated Hermite tail
    ``1 − Σ_{l ≤ L} (‖T̂_l‖² − V_l) / (l! E[y²])`` (bias-corrected) and the predicted variance
    ``Σ_{l ≤ L} V_l / (l! E[y²])``."""
    norms, var = exp.norms(), exp.variances()
    return {
        "tail": (1.0 - np.cumsum(norms - var) / ey2).tolist(),
        "predicted_variance": (np.cumsum(var) / ey2).tolist(),
    }


# ------------------------------------------------------------------ the subspace


def _significant(v: np.ndarray, se: np.ndarray, dof: int, level: float = spectral.DEFAULT_LEVEL) -> bool:
    """Whether a vector estimate clears its noise: ``Σ (v/se)²`` against the χ² quantile at ``level``."""
    from scipy.stats import chi2

    return dof > 0 and float(np.sum((v / np.maximum(se, 1e-300)) ** 2)) > chi2.isf(level, dof)


def _find_subspace(stats: Mapping[str, Arrays], d: int, report: dict) -> np.ndarray:
    """Orthonormal rows ``P`` (r × d) of the relevant subspace: significant eigenvectors of ``T_2`` and of
    the stored ``M_τ``, and ``T_1`` when significant."""
    h = stats["hermite"]
    mats = [hermite.unpack(np.asarray(h["T2"]), d, 2)]
    ses = [hermite.unpack(np.asarray(h["T2_se"]), d, 2)]
    names = ["T_2"]
    if "filtered" in stats:
        try:
            m, s, n, _ = filtered_matrices(stats["filtered"], "M_tau", "")
        except FilterGridError:  # no sample above any τ: T_2 and T_1 alone
            m, s, n = [], [], []
        mats, ses, names = mats + m, ses + s, names + n
    sub = spectral.relevant_subspace(mats, ses, names=names)
    basis = sub.basis
    t1, se1 = np.asarray(h["T1"], dtype=np.float64), np.asarray(h["T1_se"], dtype=np.float64)
    # T_1 adds a direction only where its part off the found subspace clears the noise (χ² on d − r dims)
    off = t1 - basis @ (basis.T @ t1)
    with_t1 = _significant(off, se1, d - basis.shape[1])
    if with_t1:
        basis = np.concatenate([basis, (off / np.linalg.norm(off))[:, None]], axis=1)
    report["subspace"] = {
        "rank": int(basis.shape[1]),
        "from": names + (["T_1"] if with_t1 else []),
        "spectral": sub.to_dict(include_basis=False),
    }
    if basis.shape[1] == 0:
        raise ValueError(
            "no direction of T_1, T_2 or the filtered matrices clears its noise floor: the statistics "
            "are pure noise at this sample count; estimate with more samples, or fit without --subspace"
        )
    return basis.T


def _projected_low_orders(
    t0: float, t1: np.ndarray, t2: np.ndarray, se: Sequence[np.ndarray], p: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``T_0, P T_1, P T_2 Pᵀ`` packed, with standard errors (``se`` of T_0, T_1, T_2 unpacked) propagated as
    if entries were independent."""
    se0, se1, se2 = se
    t = [np.array([t0]), p @ t1, hermite.pack(p @ t2 @ p.T)]
    s1 = np.sqrt((p**2) @ se1**2)
    s2 = np.sqrt(np.einsum("ai,bj,ij->ab", p**2, p**2, se2**2))
    return t, [np.asarray(se0, dtype=np.float64).reshape(1), s1, hermite.pack(s2)]


# ------------------------------------------------------------------ learning


def _expansion_terms_of(stats: Mapping[str, Arrays]) -> tuple[float, np.ndarray, np.ndarray, int]:
    h = stats["hermite"]
    d = int(np.asarray(h["T1"]).shape[0])
    return (
        float(np.asarray(h["T0"]).reshape(())),
        np.asarray(h["T1"], dtype=np.float64),
        hermite.unpack(np.asarray(h["T2"]), d, 2),
        d,
    )


def _expansion_section(t0: float, t1: np.ndarray, t2: np.ndarray) -> dict:
    return {"t0": t0, "t1": t1.tolist(), "t2": t2.tolist()}


def _validation_size(dim: int, degree: int) -> int:
    return int(min(200_000, max(20_000, _VALIDATION_WORK / _entries(dim, degree))))


def _held_out_errors(model: PolynomialModel, samples: Any, n: int) -> tuple[list[float], float]:
    """Relative held-out error of the expansion cut at every degree, and E[y²] on the same samples."""
    x, y = samples.part(2, n)
    y = np.asarray(y, dtype=np.float64).reshape(len(y))
    cum = np.cumsum(model.terms(x), axis=1)
    ey2 = float(np.mean(y**2))
    return (np.mean((y[:, None] - cum) ** 2, axis=0) / ey2).tolist(), ey2


def lacks(sections: Mapping[str, Any], outputs: int | None = None) -> MissingStatisticError | None:
    """What a configuration's statistics ``sections`` lack for this method, before anything is written."""
    h = sections.get("hermite")
    if h is not None and int(section_get(h, "max_order") or 4) >= 2:
        return None
    return configured_lack(
        "polynomial", "hermite", "the Hermite tensors T_0..T_2 at least", f"{{max_order: {DEFAULT_DEGREE}}}"
    )


def learn(
    stats: Mapping[str, Arrays],
    passes: Sequence[Mapping[str, Arrays]],
    samples: Callable[[int, int], Samples],
    *,
    mapper: Callable = map,
    seed: int = 0,
    width: int | None = None,
    degree: int | None = None,
    shrink: str | None = None,
    subspace: bool | None = None,
    residual: bool | None = None,
) -> LearnResult | PassRequest:
    """Fit the degree-L Hermite expansion of the label from stored moments.

    Parameters
    ----------
    stats, passes
        The store's statistics and those of the pass this method asked for (at most one).
    samples
        The source's held-out draws (:class:`~.base.SampleDraw`): the degree is chosen on ``samples.part(2, n)``.
    degree
        The degree L; default: the one of least held-out error up to the stored order (up to
        :data:`DEFAULT_SUBSPACE_DEGREE` with ``subspace``).
    shrink
        ``order`` (default), ``none`` or ``entry`` (module docstring, step 3).
    subspace
        Expand the inputs projected on the relevant subspace (module docstring).
    residual
        Re-estimate orders ≥ 3 on residual labels in one more pass (default True).

    Returns
    -------
    LearnResult or PassRequest
        The :class:`~relulearn.polynomial.PolynomialModel` and a report: degree, held-out error per
        degree, predicted variance and estimated tail per degree, shrink factors, subspace.
    """
    if width is not None:
        raise ValueError(
            "--width does not apply to --method polynomial (an improper learner: the model is a "
            "polynomial of --degree, not a network of some width)"
        )
    shrink = shrink or "order"
    if shrink not in SHRINK:
        raise ValueError(f"--shrink must be one of {', '.join(SHRINK)}, got {shrink!r}")
    h = stats.get("hermite")
    if h is None or "T2" not in h:
        order = 2 if subspace else degree if degree is not None else DEFAULT_DEGREE
        raise MissingStatisticError.lacking(
            "polynomial", "hermite", f"the Hermite tensors T_0..T_{order}", f"{{max_order: {order}}}"
        )
    if "output" in h:
        raise ValueError(
            "the 'polynomial' method learns a scalar label; this store holds a label vector "
            "(set source.output to the output to learn)"
        )
    t0, t1, t2, d = _expansion_terms_of(stats)
    ey2 = float(np.asarray(stats["basic"]["yy"]).reshape(())) if "basic" in stats else None
    report: dict[str, Any] = {"d": d, "shrink": shrink}
    if subspace:
        return _learn_subspace(stats, passes, samples, d, (t0, t1, t2), degree, shrink, ey2, report)

    stored = _stored_orders(h)
    wants_residual = residual is None or residual
    if degree is not None:
        check_degree(d, degree)
    # the degree to expand to: given; else what the store holds, or fit's default when only T_0..T_2
    # are stored (the residual pass estimates the rest)
    top = degree if degree is not None else stored if stored >= 3 or not wants_residual else _default_degree(d)
    use_residual = wants_residual and top >= 3
    if top > stored and not use_residual:
        raise MissingStatisticError(
            f"--degree {top} needs T_0..T_{top}, but this store has T_0..T_{stored}; add to the "
            f"configuration\n  statistics:\n    hermite: {{max_order: {top}}}\nand estimate into a new store, "
            "or learn without --no-residual (one more pass then estimates T_3..T_L on residual labels)"
        )
    if use_residual and not passes:
        return PassRequest(
            name="residual-hermite",
            statistics={"basic": {}, "hermite": {"max_order": top, "expansion": _expansion_section(t0, t1, t2)}},
            reason=f"T_3..T_{top} on labels less their degree-≤2 expansion (lower variance, same means)",
        )
    low, low_se = _tensors(h, range(min(3, top + 1)))
    if use_residual:
        high, high_se = _tensors(passes[0]["hermite"], range(3, top + 1))
    else:
        high, high_se = _tensors(h, range(3, top + 1))
    exp = Expansion(tuple(low + high), tuple(low_se + high_se), d)
    model = _select(exp, None, d, degree, shrink, samples, ey2, report)
    report["residual"] = use_residual
    return LearnResult(model, report)


def _learn_subspace(
    stats: Mapping[str, Arrays],
    passes: Sequence[Mapping[str, Arrays]],
    samples: Any,
    d: int,
    first: tuple[float, np.ndarray, np.ndarray],
    degree: int | None,
    shrink: str,
    ey2: float | None,
    report: dict,
) -> LearnResult | PassRequest:
    """The expansion of ``z = P x`` on the relevant subspace, from one ``projected_hermite`` pass."""
    p = _find_subspace(stats, d, report)
    r = p.shape[0]
    top = degree if degree is not None else min(DEFAULT_SUBSPACE_DEGREE, max_degree(r, limit=SUBSPACE_ORDER_LIMIT))
    check_degree(r, top, limit=SUBSPACE_ORDER_LIMIT, what="statistics.projected_hermite")
    t0, t1, t2 = first
    if not passes:
        return PassRequest(
            name="projected-hermite",
            statistics={
                "basic": {},
                "projected_hermite": {
                    "basis": p.tolist(),
                    "max_order": top,
                    "expansion": _expansion_section(t0, t1, t2),
                },
            },
            reason=f"T_0..T_{top} of the inputs projected on the {r}-dimensional relevant subspace, on residual labels",
        )
    arrays = passes[0]["projected_hermite"]
    if not np.allclose(np.asarray(arrays["basis"]), p, atol=1e-12):
        raise ValueError("the projected pass was computed on another subspace; this is a bug, please report it")
    h = stats["hermite"]
    se = [
        np.asarray(h["T0_se"]),
        np.asarray(h["T1_se"], dtype=np.float64),
        hermite.unpack(np.asarray(h["T2_se"]), d, 2),
    ]
    low, low_se = _projected_low_orders(t0, t1, t2, se, p)
    res, res_se = _tensors(arrays, range(top + 1))
    tensors = [res[l] + low[l] if l < 3 else res[l] for l in range(top + 1)]
    ses = [np.sqrt(res_se[l] ** 2 + low_se[l] ** 2) if l < 3 else res_se[l] for l in range(top + 1)]
    exp = Expansion(tuple(tensors), tuple(ses), r)
    model = _select(exp, p, d, degree, shrink, samples, ey2, report)
    return LearnResult(model, report)


def _select(
    exp: Expansion,
    basis: np.ndarray | None,
    d: int,
    degree: int | None,
    shrink: str,
    samples: Any,
    ey2: float | None,
    report: dict,
) -> PolynomialModel:
    """Shrink, measure every degree on held-out samples, and keep the given degree or the best one."""
    shrunk, factors = shrink_tensors(exp, shrink)
    full = PolynomialModel(shrunk.tensors, d, basis)
    n_val = _validation_size(exp.dim, exp.degree)
    errors, ey2_val = _held_out_errors(full, samples, n_val)
    chosen = int(np.argmin(errors)) if degree is None else degree
    report.update(
        {
            "degree": chosen,
            "degree_chosen_by": "held-out error" if degree is None else "given",
            "degrees": list(range(exp.degree + 1)),
            "held_out_error": errors,
            "held_out_samples": n_val,
            **tail_and_variance(exp, ey2 if ey2 is not None else ey2_val),
            "shrink_factors": factors,
            "entries": _entries(exp.dim, chosen),
        }
    )
    tail = report["tail"][chosen]
    report["summary"] = {
        "held_out_error": errors[chosen],
        "estimated_tail": tail,
        "predicted_variance": report["predicted_variance"][chosen],
        "held_out_error_by_degree": errors,
    }
    return full.truncate(chosen)
