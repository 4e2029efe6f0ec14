"""Streaming statistics: each a small class with ``init / update / terms / finalize``.

A statistic accumulates *sums* over samples in an accumulator (a dict of float64 arrays).
The quantity it estimates is ``terms(sums) / N`` where ``terms`` is linear (the identity
for most statistics; the raw-to-Hermite conversion for the Hermite tensors; suffix sums
over bins for the filtered matrices). The standard error of every entry comes from the
spread of per-chunk values: the accumulation also keeps ``Σ_c terms(chunk sum_c)²`` over
the equal-size chunks c (docs/design.md §3, "Standard errors").

The driver-side bookkeeping (a :class:`Partial` per block, merged in block order) lives
here too, so that the same code runs in a worker, in a single-process loop and in tests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast, overload

import numpy as np

from .. import hermite
from ..config import (
    ContractedConfig,
    ExpansionConfig,
    FilteredConfig,
    HermiteConfig,
    ProjectedHermiteConfig,
    ResidualConfig,
)
from ..hermite.contracted import _GRAM_BLOCK, _SYRK_MIN_D, _add_signed_grams, _mirror_upper
from ..network import Network
from .sources import (
    LabelShapeError,
    Source,
    Stream,
    at_rows,
    check_finite,
    chunk_batches,
    generator,
    label_outputs,
    pilot_batches,
)

__all__ = [
    "Var",
    "Statistic",
    "BasicMoments",
    "OutputMoments",
    "PerOutput",
    "HermiteTensors",
    "ContractedMoments",
    "FilteredMoments",
    "ResidualFilteredMoments",
    "ProjectedHermite",
    "Partial",
    "Estimate",
    "accumulate_chunks",
    "direction_bank",
    "threshold_grid",
    "residual_setup",
    "residual_scores",
    "candidate_coords",
]


@dataclass(frozen=True)
class Var:
    """Shape and dimension names of one array."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Estimate:
    """A finalized statistic entry: its mean and standard error, with dimension names."""

    dims: tuple[str, ...]
    mean: np.ndarray
    se: np.ndarray


class Statistic(ABC):
    """One family of sufficient statistics.

    Subclasses declare the arrays of their accumulator (``sums``) and of their
    estimands (``terms``), and provide coordinates that describe them (direction banks,
    τ grids, index tables), which are stored next to the sums.
    """

    name: str

    @abstractmethod
    def sums_schema(self) -> dict[str, Var]:
        """Arrays of the accumulator."""

    def terms_schema(self) -> dict[str, Var]:
        """Arrays of the estimands; by default the accumulator's own arrays."""
        return self.sums_schema()

    def coords(self) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """Arrays that describe the statistic (stored, never summed)."""
        return {}

    def init(self) -> dict[str, np.ndarray]:
        return {k: np.zeros(v.shape) for k, v in self.sums_schema().items()}

    @abstractmethod
    def update(self, acc: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> None:
        """Add the sums of a batch ``x`` (n, d), ``y`` (n,) — (n, m) for the statistics of a
        label vector (:class:`PerOutput`, :class:`OutputMoments`) — to ``acc`` in place."""

    def terms(self, acc: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Linear map from accumulated sums to sums of the estimands."""
        return dict(acc)

    def finalize(
        self, sums: Mapping[str, np.ndarray], sumsq: Mapping[str, np.ndarray], n_chunks: int, chunk_size: int
    ) -> dict[str, Estimate]:
        """Means and standard errors of the estimands from the merged sums.

        The standard error of a mean over ``K`` equal chunks of ``B`` samples is the
        sample standard deviation of the chunk means over ``sqrt(K)``; it is NaN for
        ``K < 2``.
        """
        n = n_chunks * chunk_size
        schema = self.terms_schema()
        out = {}
        for name, total in self.terms(sums).items():
            mean = total / n
            if n_chunks >= 2:
                var = (sumsq[name] / chunk_size**2 - n_chunks * mean**2) / (n_chunks - 1)
                se = np.sqrt(np.maximum(var, 0.0) / n_chunks)
            else:
                se = np.full_like(mean, np.nan)
            out[name] = Estimate(schema[name].dims, mean, se)
        return out

    def config(self) -> dict:
        """The options that define this statistic (part of the run's fingerprint)."""
        return {}


# ------------------------------------------------------------------------ basic


class BasicMoments(Statistic):
    """count (from the ledger), Σy, Σy², Σx, Σxxᵀ, Σy·x."""

    name = "basic"

    def __init__(self, d: int):
        self.d = d

    def sums_schema(self) -> dict[str, Var]:
        d = self.d
        return {
            "y": Var((), ()),
            "yy": Var((), ()),
            "x": Var(("i",), (d,)),
            "xx": Var(("i", "j"), (d, d)),
            "yx": Var(("i",), (d,)),
        }

    def label_free_sums(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The batch sums that do not involve the label: computed once for all outputs of a
        vector source (:class:`PerOutput`), then added to each output's accumulator."""
        return {"x": x.sum(axis=0), "xx": x.T @ x}  # numpy dispatches Xᵀ X to a BLAS-3 syrk

    def label_update(self, acc, x, y):
        acc["y"] += y.sum()
        acc["yy"] += y @ y
        acc["yx"] += y @ x

    def update(self, acc, x, y):
        self.label_update(acc, x, y)
        for k, v in self.label_free_sums(x).items():
            acc[k] += v


# --------------------------------------------------------------- output moments

#: bytes of the weighted copy ``xw`` of a row batch in :class:`OutputMoments` (rows are cut to fit)
_XW_BYTES = 32 * 2**20


class OutputMoments(Statistic):
    """Moments of the label vector ``A`` (``m`` outputs; ``m = 1`` for a scalar label).

    Estimands: ``A = E[A]`` (output,), ``AA = E[A Aᵀ]`` (output, output2),
    ``T1 = E[A_j x]`` (output, i) and ``T2 = E[A_j (x xᵀ − I)]`` (output, i, j). The d × d
    part is, per output, two symmetric rank-k updates (rows with positive and with negative label,
    ``m d (d + 1)`` flops per sample); below d = 64, one GEMM per row batch for all outputs,
    ``xwᵀ x`` with ``xw[s, j·d + i] = A_j(x_s) x_{s,i}`` (2 m d² flops per sample).
    """

    name = "output_moments"

    def __init__(self, d: int, outputs: int = 1):
        self.d, self.outputs = d, int(outputs)

    def sums_schema(self):
        m, d = self.outputs, self.d
        return {
            "a": Var(("output",), (m,)),
            "aa": Var(("output", "output2"), (m, m)),
            "ax": Var(("output", "i"), (m, d)),
            "axx": Var(("output", "i", "j"), (m, d, d)),
        }

    def terms_schema(self):
        m, d = self.outputs, self.d
        return {
            "A": Var(("output",), (m,)),
            "AA": Var(("output", "output2"), (m, m)),
            "T1": Var(("output", "i"), (m, d)),
            "T2": Var(("output", "i", "j"), (m, d, d)),
        }

    def coords(self):
        return {"output": (("output",), np.arange(self.outputs, dtype=np.int64))}

    def update(self, acc, x, y):
        a = y[:, None] if y.ndim == 1 else y
        n, d = x.shape
        m = a.shape[1]
        acc["a"] += a.sum(axis=0)
        acc["aa"] += a.T @ a
        acc["ax"] += a.T @ x
        if d >= _SYRK_MIN_D:
            # Σ a_j x xᵀ as two symmetric rank-k updates per output (d(d+1) flops per sample, half a
            # GEMM's), then mirrored: 1.5× faster than the GEMM below at d = 512
            quad = np.zeros((m, d, d))
            _add_signed_grams(
                quad, np.require(x, requirements=("C", "A")), a, np.empty((max(1, min(n, _GRAM_BLOCK // d)), d))
            )
            _mirror_upper(quad)
            acc["axx"] += quad
            return
        # rows per GEMM so that the weighted copy xw (rows × m d) stays below _XW_BYTES
        step = max(1, _XW_BYTES // (8 * m * d))
        for start in range(0, n, step):
            xs, ws = x[start : start + step], a[start : start + step]
            xw = (ws[:, :, None] * xs[:, None, :]).reshape(len(xs), m * d)
            acc["axx"] += (xw.T @ xs).reshape(m, d, d)

    def terms(self, acc):
        a = acc["a"]
        return {"A": a, "AA": acc["aa"], "T1": acc["ax"], "T2": acc["axx"] - a[:, None, None] * np.eye(self.d)}

    def config(self):
        return {"outputs": self.outputs}


# ------------------------------------------------------------------ per output


def _at(arrays: Mapping[str, np.ndarray], j: int) -> dict[str, np.ndarray]:
    """Views of entry ``j`` along the leading axis (``a[j, ...]``: a 0-d view, not a copy, when
    ``a`` is 1-d, so that in-place updates reach the stacked accumulator)."""
    return {k: a[j, ...] for k, a in arrays.items()}


class PerOutput(Statistic):
    """A family computed for each output ``j`` of a label vector, as if ``y = A_j``.

    Holds one inner statistic per output (they differ only in what was fitted to their
    output, e.g. the τ grid from per-output quantiles). Every array of the inner schemas
    gets a leading dimension ``output``; each output's sums are updated in place through
    views of the stacked accumulator, so they are the bits the inner statistic computes
    on the scalar source of that output. Coordinates equal for all outputs are stored
    once, the others stacked along ``output``; ``output`` itself is a coordinate.
    """

    def __init__(self, inner: Iterable[Statistic]):
        self.inner = list(inner)
        if not self.inner or len({s.name for s in self.inner}) != 1:
            raise ValueError("PerOutput needs one or more statistics of the same family")
        self.name = self.inner[0].name

    @property
    def outputs(self) -> int:
        return len(self.inner)

    def _stacked(self, schema: Mapping[str, Var]) -> dict[str, Var]:
        return {k: Var(("output",) + v.dims, (self.outputs,) + v.shape) for k, v in schema.items()}

    def sums_schema(self):
        return self._stacked(self.inner[0].sums_schema())

    def terms_schema(self):
        return self._stacked(self.inner[0].terms_schema())

    def coords(self):
        out = {"output": (("output",), np.arange(self.outputs, dtype=np.int64))}
        per = [s.coords() for s in self.inner]
        for k, (dims, _first) in per[0].items():
            values = [np.asarray(c[k][1]) for c in per]
            if all(v.shape == values[0].shape and np.array_equal(v, values[0]) for v in values[1:]):
                out[k] = (dims, values[0])
            else:
                out[k] = (("output",) + tuple(dims), np.stack(values))
        return out

    def update(self, acc, x, y):
        first = self.inner[0]
        if hasattr(first, "label_free_sums"):
            # sums that do not involve the label (basic's x, xxᵀ) once for all outputs, not m times:
            # the same batch arrays are added to every output, so each output's bits are unchanged
            shared = first.label_free_sums(x)
            for j, s in enumerate(self.inner):
                out = _at(acc, j)
                s.label_update(out, x, y[:, j])
                for k, v in shared.items():
                    out[k] += v
            return
        for j, s in enumerate(self.inner):
            s.update(_at(acc, j), x, y[:, j])

    def terms(self, acc):
        per = [s.terms(_at(acc, j)) for j, s in enumerate(self.inner)]
        return {k: np.stack([p[k] for p in per]) for k in per[0]}

    def config(self):
        return {"per_output": [s.config() for s in self.inner]}


# ---------------------------------------------------------------------- hermite


class HermiteTensors(Statistic):
    """Full Hermite tensors ``T_l = E[y He_l(x)]``, ``l ≤ L``, packed (unique entries).

    Accumulated as raw weighted moments ``Σ y x^{⊗m}`` and converted exactly by the
    matching sum (:func:`relulearn.hermite.raw_to_hermite`).
    """

    name = "hermite"

    def __init__(self, d: int, cfg: HermiteConfig, expansion: tuple | None = None):
        self.d, self.max_order = d, cfg.max_order
        self.sizes = [_n_unique(d, m) for m in range(self.max_order + 1)]
        total = sum(self.sizes)
        if total > cfg.max_entries:
            raise ValueError(
                f"statistics.hermite: T_0..T_{self.max_order} at d={d} have {total:,} unique entries, more than "
                f"max_entries={cfg.max_entries:,}; lower max_order, raise max_entries, or use the "
                "`contracted` statistic, which never forms the full tensor"
            )
        self.expansion = expansion

    def sums_schema(self):
        return {f"raw{m}": Var((f"entry{m}",), (s,)) for m, s in enumerate(self.sizes)}

    def terms_schema(self):
        return {f"T{m}": Var((f"entry{m}",), (s,)) for m, s in enumerate(self.sizes)}

    def coords(self):
        out = {
            f"index{m}": ((f"entry{m}", f"axis{m}"), hermite.unique_indices(self.d, m))
            for m in range(1, self.max_order + 1)
        }
        if self.expansion is not None:
            t0, t1, t2 = self.expansion
            out.update(
                {
                    "expansion_t0": (("scalar",), np.array([t0])),
                    "expansion_t1": (("i",), t1),
                    "expansion_t2": (("i", "j"), t2),
                }
            )
        return out

    def labels(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The labels the tensors are taken of: ``y``, or ``y`` less the expansion (residual labels)."""
        return y if self.expansion is None else hermite.subtract_expansion(x, y, *self.expansion)

    def update(self, acc, x, y):
        self._accumulate(acc, x, self.labels(x, y))

    def _accumulate(self, acc: dict[str, np.ndarray], z: np.ndarray, y: np.ndarray) -> None:
        """Add the packed raw sums ``Σ y z^{⊗m}``, ``m ≤ max_order``, of inputs ``z``."""
        for m, s in enumerate(hermite.raw_moment_sums_upto(z, y, self.max_order)):
            acc[f"raw{m}"] += s

    def terms(self, acc):
        raw = {m: np.asarray(acc[f"raw{m}"]) for m in range(self.max_order + 1)}
        return {f"T{l}": hermite.raw_to_hermite(raw, self.d, l) for l in range(self.max_order + 1)}

    def config(self):
        # the residual flag only when set: stores made before the option keep their fingerprint
        return {"max_order": self.max_order, **({"residual_labels": True} if self.expansion is not None else {})}


def _n_unique(d: int, m: int) -> int:
    from math import comb

    return comb(d + m - 1, m)


# ------------------------------------------------------------------- contracted


def _check_bank(cfg: ContractedConfig, d: int, m: int | None, budget: int) -> None:
    """Refuse a count of directions whose matrices alone (one d × d sum per order, direction and output) exceed
    ``budget`` bytes, before the bank itself is drawn (10¹² directions would be a 116 TiB array)."""
    from .plan import MemoryBudgetError

    if not isinstance(cfg.directions, int):
        return
    need = 8 * cfg.directions * len(cfg.orders) * d * d * (m or 1)
    if need > budget:
        raise MemoryBudgetError(
            f"statistics.contracted.directions = {cfg.directions:,}: one d × d matrix per order, direction and "
            f"output is {need:,} bytes per block partial, more than run.worker_memory = {budget:,} bytes; give "
            f"fewer directions (at most {max(1, budget // (8 * len(cfg.orders) * d * d * (m or 1))):,} fit) or "
            "sketch the family (statistics.sketch). Nothing was written"
        )


def direction_bank(cfg: ContractedConfig, d: int, run_seed: int) -> np.ndarray:
    """The unit directions g of the contracted statistic, shape (G, d)."""
    if isinstance(cfg.directions, int):
        seed = run_seed if cfg.directions_seed is None else cfg.directions_seed
        g = generator(seed, Stream.DIRECTIONS).standard_normal((cfg.directions, d))
    else:
        g = np.asarray(cfg.directions, dtype=np.float64)
        if g.ndim != 2 or g.shape[1] != d:
            raise ValueError(
                f"statistics.contracted.directions has shape {g.shape}; each direction needs d={d} entries"
            )
    norms = np.linalg.norm(g, axis=1)
    if np.any(norms == 0) or not np.all(np.isfinite(norms)):
        raise ValueError("statistics.contracted.directions has a zero or non-finite row")
    return g / norms[:, None]


class ContractedMoments(Statistic):
    """``M_l^g = T_l(g,…,g,·,·)``, ``T_l(g,…,g,·)`` and ``T_l(g,…,g)`` for orders × directions.

    Each pair costs two symmetric rank-k updates (rows of positive and of negative weight), d(d+1)
    flops per sample; docs/design.md §3 batches them into one GEMM, at twice the flops.
    Pairs are ordered order-major: pair ``p = a·G + b`` is (orders[a], directions[b]).
    """

    name = "contracted"

    def __init__(
        self,
        directions: np.ndarray,
        orders: Iterable[int],
        control: tuple[np.ndarray, np.ndarray] | None = None,
        expansion: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None,
    ):
        self.directions = np.asarray(directions, dtype=np.float64)
        self.orders = [int(o) for o in orders]
        self.d = self.directions.shape[1]
        self.n_pairs = len(self.orders) * len(self.directions)
        # (ȳ, β): the labels' expansion of degree ≤ 1 from the pilot pass, subtracted from every label
        self.control = (
            None
            if control is None
            else (float(np.asarray(control[0])), np.asarray(control[1], dtype=np.float64).reshape(self.d))
        )
        # (t0, t1, V, θ): a given expansion of degree ≤ 2, T_2 = V diag(θ) Vᵀ (low rank: O(d s) per sample)
        self.expansion = expansion

    def sums_schema(self):
        p, d = self.n_pairs, self.d
        return {"M": Var(("pair", "i", "j"), (p, d, d)), "v": Var(("pair", "i"), (p, d)), "s": Var(("pair",), (p,))}

    def coords(self):
        g = len(self.directions)
        out = {
            "direction": (("direction", "i"), self.directions),
            "pair_order": (("pair",), np.repeat(np.asarray(self.orders, dtype=np.int64), g)),
            "pair_direction": (("pair",), np.tile(np.arange(g, dtype=np.int64), len(self.orders))),
        }
        if self.control is not None:
            out["control_mean"] = ((), np.float64(self.control[0]))
            out["control_beta"] = (("i",), self.control[1])
        return out

    def update(self, acc, x, y):
        if self.control is not None:  # same expectations for orders ≥ 2, less variance
            y = y - self.control[0] - x @ self.control[1]
        if self.expansion is not None:  # the same for orders ≥ 3
            t0, t1, v, theta = self.expansion
            z = x @ v
            y = y - (t0 + x @ t1 + 0.5 * ((z * z - 1.0) @ theta))
        acc["M"] += hermite.contracted_matrix_sums(x, y, self.directions, self.orders)
        acc["v"] += hermite.contracted_vector_sums(x, y, self.directions, self.orders)
        acc["s"] += hermite.contracted_scalar_sums(x, y, self.directions, self.orders)

    def config(self):
        out = {"orders": self.orders, "directions": self.directions.tolist()}
        if self.expansion is not None:  # only when set: stores made before the option keep their fingerprint
            t0, t1, v, theta = self.expansion
            out["expansion"] = {"t0": t0, "t1": t1.tolist(), "t2_vectors": v.T.tolist(), "t2_values": theta.tolist()}
        return out


# --------------------------------------------------------------------- filtered


def _pilot_scores(
    source: Source, seed: int, n: int, score: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> np.ndarray:
    """``score(x, y)`` (shape (..., rows)) over the pilot pass, concatenated along rows."""
    parts, row = [], 0
    for x, y in pilot_batches(source, seed, n):
        check_finite(x, y, None, row)
        parts.append(score(x, y))
        row += len(y)
    return np.concatenate(parts, axis=-1)


def _label_scores(
    source: Source, score: Callable[[np.ndarray, np.ndarray], np.ndarray]
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``score`` of a scalar label, applied to every output of a vector source and stacked
    along a leading ``output`` axis; ``score`` itself for a scalar source."""
    m = label_outputs(source)
    if m is None:
        return score
    return lambda x, y: np.stack([score(x, y[:, j]) for j in range(m)])


def linear_control(source: Source, seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ȳ, β)`` with ``β = E[y x]`` over the pilot pass: the labels' expansion of degree ≤ 1 under Gaussian
    inputs (per output, stacked, for a vector source: shapes (m,) and (m, d))."""
    count, s0, s1 = 0, 0.0, 0.0
    row = 0
    for x, y in pilot_batches(source, seed, n):
        check_finite(x, y, None, row)
        row += len(y)
        count += len(y)
        s0 = s0 + y.sum(axis=0)
        s1 = s1 + (y.T @ x if y.ndim == 2 else y @ x)
    return np.asarray(s0 / count, dtype=np.float64), np.asarray(s1 / count, dtype=np.float64)


def threshold_grid(cfg: FilteredConfig, source: Source, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The τ grid: given thresholds, or quantiles of |y| over a pilot pass.

    Returns ``(tau, quantiles)``; ``quantiles`` is None when τ was given. For a source with
    ``m`` outputs and quantiles, ``tau`` has shape (m, T): the quantiles of each ``|A_j|``.
    """
    if cfg.thresholds is not None:
        return np.asarray(cfg.thresholds, dtype=np.float64), None
    q = np.asarray(cfg.quantiles, dtype=np.float64)
    scores = _pilot_scores(source, seed, cfg.pilot_samples, _label_scores(source, lambda x, y: np.abs(y)))
    if scores.ndim == 1:
        return np.quantile(scores, q), q
    # one output at a time, on the same contiguous 1-d arrays as for a scalar source
    return np.stack([np.quantile(s, q) for s in scores]), q


def _binned_gram(xx: np.ndarray, count: np.ndarray, x: np.ndarray, score: np.ndarray, tau: np.ndarray) -> None:
    """Add ``x_bᵀ x_b`` and the row count of each bin ``tau[b] < score <= tau[b+1]`` to ``xx[b]``,
    ``count[b]`` in place (rows at or below ``tau[0]`` are dropped): one d² product per row."""
    b = np.searchsorted(tau, score, side="left") - 1
    counts = np.bincount(b + 1, minlength=len(tau) + 1)[1:]
    count += counts
    for k in np.flatnonzero(counts):
        # one gather per bin, rows in sample order (the bits of the syrk depend on it);
        # no argsort and no second copy of the kept rows
        seg = x.take(np.flatnonzero(b == k), axis=0)
        xx[k] += seg.T @ seg


def _suffix(a: np.ndarray, axis: int) -> np.ndarray:
    """Sums over bins ``b' >= b`` (the samples past threshold ``b``) along ``axis``."""
    return np.flip(np.cumsum(np.flip(a, axis), axis=axis), axis)


class FilteredMoments(Statistic):
    """``M_τ = E[1{|y|>τ}(xxᵀ − I)]`` and ``P[|y|>τ]`` for a grid of τ, in one pass.

    Samples are binned by |y| between consecutive thresholds; bin sums cost one
    ``X_bᵀ X_b`` per bin (all bins together: one d² product per sample), and each
    ``M_τ`` is a suffix sum over bins.
    """

    name = "filtered"

    def __init__(self, d: int, tau: np.ndarray, quantiles: np.ndarray | None = None):
        self.d = d
        self.tau = np.asarray(tau, dtype=np.float64)
        self.quantiles = quantiles

    def sums_schema(self):
        k, d = len(self.tau), self.d
        return {"bin_xx": Var(("tau", "i", "j"), (k, d, d)), "bin_count": Var(("tau",), (k,))}

    def terms_schema(self):
        k, d = len(self.tau), self.d
        return {"M": Var(("tau", "i", "j"), (k, d, d)), "prob": Var(("tau",), (k,))}

    def coords(self):
        out = {"tau": (("tau",), self.tau)}
        if self.quantiles is not None:
            out["quantile"] = (("tau",), np.asarray(self.quantiles, dtype=np.float64))
        return out

    def update(self, acc, x, y):
        _binned_gram(acc["bin_xx"], acc["bin_count"], x, np.abs(y), self.tau)

    def terms(self, acc):
        count, xx = _suffix(acc["bin_count"], 0), _suffix(acc["bin_xx"], 0)
        return {"M": xx - count[:, None, None] * np.eye(self.d), "prob": count}

    def config(self):
        return {"tau": self.tau.tolist()}


# --------------------------------------------------------------------- residual


def residual_scores(y: np.ndarray, z: np.ndarray, candidates: list[Network]) -> np.ndarray:
    """``|y − F̃_c(z)|`` of every candidate on the subspace coordinates ``z = x Bᵀ``, shape (C, n)."""
    return np.stack([np.abs(y - net.forward(z)[:, 0]) for net in candidates])


def candidate_coords(candidates: list[Network]) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """The candidates' weights as coordinates ``candidate{c}_W{j}``, as the residual families store them."""
    return {
        f"candidate{c}_W{j}": ((f"candidate{c}_W{j}_out", f"candidate{c}_W{j}_in"), w)
        for c, net in enumerate(candidates)
        for j, w in enumerate(net.weights)
    }


def residual_setup(cfg: ResidualConfig, d: int, where: str = "statistics.residual") -> tuple[np.ndarray, list[Network]]:
    """The basis rows ``B`` (r, d) and candidate networks of a residual section, checked.

    Raises
    ------
    ValueError
        Naming the key at fault: a basis of the wrong width or not orthonormal, a
        candidate whose first layer does not take ``r`` inputs or that has several outputs.
    """
    basis = np.asarray(cfg.basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[1] != d:
        raise ValueError(f"{where}.basis has shape {basis.shape}; each row needs d={d} entries")
    r = basis.shape[0]
    if not np.allclose(basis @ basis.T, np.eye(r), atol=1e-8):
        raise ValueError(f"{where}.basis rows must be orthonormal (B Bᵀ = I)")
    nets = []
    for c, cand in enumerate(cfg.candidates):
        try:
            net = Network(tuple(np.asarray(w, dtype=np.float64) for w in cand.weights), activation=cand.activation)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}.candidates[{c}]: {err}") from None
        if net.input_dim != r or net.output_dim != 1:
            raise ValueError(
                f"{where}.candidates[{c}] maps {net.input_dim} inputs to {net.output_dim} outputs; "
                f"it must take the r={r} subspace coordinates z = B x to one output"
            )
        nets.append(net)
    return basis, nets


def residual_grid(
    cfg: ResidualConfig, source: Source, seed: int, basis: np.ndarray, candidates: list[Network]
) -> tuple[np.ndarray, np.ndarray | None]:
    """The τ grid per candidate, shape (C, T): given thresholds, or quantiles of each
    candidate's |residual| over the pilot pass (then (m, C, T) for a source with m outputs)."""
    if cfg.thresholds is not None:
        tau = np.asarray(cfg.thresholds, dtype=np.float64)
        return np.tile(tau, (len(candidates), 1)), None

    def scores(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return residual_scores(y, x @ basis.T, candidates)

    q = np.asarray(cfg.quantiles, dtype=np.float64)
    all_scores = _pilot_scores(source, seed, cfg.pilot_samples, _label_scores(source, scores))
    if all_scores.ndim == 2:
        return np.quantile(all_scores, q, axis=1).T.copy(), q
    return np.stack([np.quantile(s, q, axis=1).T.copy() for s in all_scores]), q


class ResidualFilteredMoments(Statistic):
    """Residual-filtered second moments, projected off a found subspace.

    For candidate networks ``F̃_c`` on the coordinates ``z = B x`` of the subspace found so
    far (rows ``B``, orthonormal), and thresholds ``τ_{c,t}``::

        M[c, t] = E[1{|y − F̃_c(Bx)| > τ_{c,t}} (x⊥ x⊥ᵀ − (I − BᵀB))],   x⊥ = x − BᵀB x,
        prob[c, t] = P[|y − F̃_c(Bx)| > τ_{c,t}].

    If ``y`` depends on ``x`` only through a subspace ``V ⊇ span(B)``, the residual does
    too, and ``M[c, t]`` has its range in ``V ⊖ span(B)``: the directions still missing.
    Per sample and candidate one d² product (the bins of one candidate partition the
    samples), as for :class:`FilteredMoments`. The candidates and the basis are stored
    with the sums (coordinates ``basis``, ``candidate{c}_W{j}``).
    """

    name = "residual"

    def __init__(
        self, d: int, basis: np.ndarray, candidates: list[Network], tau: np.ndarray, quantiles: np.ndarray | None = None
    ):
        self.d = d
        self.basis = np.asarray(basis, dtype=np.float64)
        self.candidates = list(candidates)
        self.tau = np.asarray(tau, dtype=np.float64).reshape(len(self.candidates), -1)
        self.quantiles = quantiles

    def sums_schema(self) -> dict[str, Var]:
        c, t, d = *self.tau.shape, self.d
        return {
            "bin_xx": Var(("candidate", "tau", "i", "j"), (c, t, d, d)),
            "bin_count": Var(("candidate", "tau"), (c, t)),
        }

    def terms_schema(self) -> dict[str, Var]:
        c, t, d = *self.tau.shape, self.d
        return {"M": Var(("candidate", "tau", "i", "j"), (c, t, d, d)), "prob": Var(("candidate", "tau"), (c, t))}

    def coords(self):
        out = {"tau": (("candidate", "tau"), self.tau), "basis": (("rank", "i"), self.basis)}
        if self.quantiles is not None:
            out["quantile"] = (("tau",), np.asarray(self.quantiles, dtype=np.float64))
        out.update(candidate_coords(self.candidates))
        return out

    def update(self, acc, x, y):
        z = x @ self.basis.T
        xp = x - z @ self.basis
        for c, score in enumerate(residual_scores(y, z, self.candidates)):
            _binned_gram(acc["bin_xx"][c], acc["bin_count"][c], xp, score, self.tau[c])

    def terms(self, acc):
        count, xx = _suffix(acc["bin_count"], 1), _suffix(acc["bin_xx"], 1)
        off = np.eye(self.d) - self.basis.T @ self.basis
        return {"M": xx - count[:, :, None, None] * off, "prob": count}

    def config(self):
        return {"tau": self.tau.tolist()}


# ------------------------------------------------------------ projected hermite


def expansion_setup(cfg: ExpansionConfig | None, d: int, where: str) -> tuple | None:
    """The expansion ``(t0, t1, t2)`` of a section's ``expansion`` key, checked (``None``: raw labels).

    Raises
    ------
    ValueError
        Naming the key at fault: a term of the wrong shape, or ``t2`` not symmetric.
    """
    if cfg is None:
        return None
    t1 = np.zeros(d) if cfg.t1 is None else np.asarray(cfg.t1, dtype=np.float64)
    if cfg.t2_vectors is not None:
        _, _, v, theta = low_rank_expansion(cfg, d, where)
        t2 = (v * theta) @ v.T
    else:
        t2 = np.zeros((d, d)) if cfg.t2 is None else np.asarray(cfg.t2, dtype=np.float64)
    if t1.shape != (d,):
        raise ValueError(f"{where}.expansion.t1 has shape {t1.shape}; it needs d={d} entries")
    if t2.shape != (d, d) or not np.allclose(t2, t2.T, rtol=0, atol=1e-12 * (1 + np.abs(t2).max())):
        raise ValueError(f"{where}.expansion.t2 must be a symmetric d × d matrix (d={d}), got shape {t2.shape}")
    return float(cfg.t0), t1, 0.5 * (t2 + t2.T)


def low_rank_expansion(cfg: ExpansionConfig, d: int, where: str) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """The expansion of a section's ``expansion`` key as ``(t0, t1, V, θ)`` with ``T_2 = V diag(θ) Vᵀ``
    (V: d × s): given so (``t2_vectors``, ``t2_values``), or the eigenpairs of a dense ``t2``.

    Raises
    ------
    ValueError
        Naming the key at fault: a term of the wrong shape, ``t2`` not symmetric, a value not finite.
    """
    t1 = np.zeros(d) if cfg.t1 is None else np.asarray(cfg.t1, dtype=np.float64)
    if t1.shape != (d,):
        raise ValueError(f"{where}.expansion.t1 has shape {t1.shape}; it needs d={d} entries")
    if cfg.t2_vectors is None:
        if cfg.t2 is None:
            return float(cfg.t0), t1, np.zeros((d, 0)), np.zeros(0)
        _, _, t2 = cast(tuple, expansion_setup(cfg.model_copy(update={"t1": None}), d, where))  # (cfg is given)
        theta, v = np.linalg.eigh(t2)
        return float(cfg.t0), t1, v, theta
    v = np.asarray(cfg.t2_vectors, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != d:
        raise ValueError(f"{where}.expansion.t2_vectors has shape {v.shape}; each row needs d={d} entries")
    theta = np.asarray(cfg.t2_values, dtype=np.float64)
    if not (np.all(np.isfinite(v)) and np.all(np.isfinite(theta)) and np.isfinite(cfg.t0) and np.all(np.isfinite(t1))):
        raise ValueError(f"{where}.expansion has NaN or infinite entries")
    return float(cfg.t0), t1, np.ascontiguousarray(v.T), theta


def projected_setup(cfg: ProjectedHermiteConfig, d: int) -> tuple[np.ndarray, tuple | None]:
    """The basis ``P`` (r, d) and the expansion ``(t0, t1, t2)`` of a ``projected_hermite``
    section, checked (``None``: raw labels).

    Raises
    ------
    ValueError
        Naming the key at fault: a basis of the wrong width or not orthonormal, an expansion
        term of the wrong shape or not symmetric.
    """
    where = "statistics.projected_hermite"
    basis = np.asarray(cfg.basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[1] != d:
        raise ValueError(f"{where}.basis has shape {basis.shape}; each row needs d={d} entries")
    r = basis.shape[0]
    if r > d or not np.allclose(basis @ basis.T, np.eye(r), atol=1e-8):
        raise ValueError(f"{where}.basis rows must be orthonormal (P Pᵀ = I), at most d={d} of them")
    return basis, expansion_setup(cfg.expansion, d, where)


class ProjectedHermite(HermiteTensors):
    """Hermite tensors on a subspace, on residual labels (docs/design.md §3, "Residual labels").

    For orthonormal rows ``P`` (r × d), ``z = P x`` is standard normal in ``R^r`` and
    ``He_l(z) = P^{⊗l} He_l(x)``, so ``E[ỹ He_l(z)] = T_l(Pᵀ·, …, Pᵀ·)``: the moment tensors
    restricted to the subspace, packed over r coordinates (C(r+l−1, l) entries, not
    C(d+l−1, l)): the :class:`HermiteTensors` of ``(z, ỹ)``. The labels are
    ``ỹ = y − (t0 + <t1, x> + ½<t2, xxᵀ − I>)``; He_l is orthogonal to every polynomial of
    degree < l, so orders l ≥ 3 are those of ``y`` while their variance falls with ``E[ỹ²]``.
    Orders 0..2 are moments of ``ỹ`` (zero in expectation when the expansion is the true one).
    Per sample: one d × r product, one d × d product for the expansion (BLAS-3 over the
    batch), and the raw sums of ``z``.
    """

    name = "projected_hermite"

    def __init__(self, d: int, basis: np.ndarray, max_order: int, expansion: tuple | None = None):
        self.basis, self.max_order, self.expansion = np.asarray(basis, dtype=np.float64), max_order, expansion
        self.input_dim, self.d = d, self.basis.shape[0]  # the tensors live on the r subspace coordinates
        self.sizes = [_n_unique(self.d, m) for m in range(max_order + 1)]

    def coords(self):
        return {"basis": (("rank", "i"), self.basis), **super().coords()}

    def update(self, acc, x, y):
        self._accumulate(acc, x @ self.basis.T, self.labels(x, y))

    def config(self):
        return {"max_order": self.max_order, "rank": self.d, "residual_labels": self.expansion is not None}


# ----------------------------------------------------------------- building


def _stored_outputs(names: Iterable[str], stored: Callable[[str], Mapping[str, np.ndarray]]) -> int | None:
    """The number of outputs of a stored run's label vector (None: scalar label), read from
    the ``output`` coordinate of one of its statistics: every statistic of a vector run has
    it (the scalar ``output_moments`` has one of length 1, the scalar families none)."""
    # one group tells; not the Hermite tensors (the largest) unless they are all there is
    name = min(names, key=lambda n: n == "hermite", default=None)
    if name is None:
        return None
    arrays = stored(name)
    return int(len(arrays["output"])) if "output" in arrays and len(arrays["output"]) > 1 else None


@overload
def _of_output(values: np.ndarray, j: int | None, ndim: int) -> np.ndarray: ...


@overload
def _of_output(values: np.ndarray | None, j: int | None, ndim: int) -> np.ndarray | None: ...


def _of_output(values: np.ndarray | None, j: int | None, ndim: int) -> np.ndarray | None:
    """Output ``j``'s part of a grid stored once for all outputs (``ndim`` dims) or stacked
    along a leading output axis (``ndim + 1``)."""
    if values is None or j is None:
        return values
    values = np.asarray(values)
    return values[j] if values.ndim == ndim + 1 else values


def _output_expansion(section: Any, m: int | None, j: int | None, where: str) -> tuple[ExpansionConfig | None, str]:
    """Output ``j``'s expansion of a section's ``expansion`` key (None: none given) and the key's name: a list
    gives one per output, a single one serves a scalar label."""
    exp = section.expansion
    if exp is None:
        return None, where
    if isinstance(exp, list):
        if len(exp) != (m or 1):
            raise ValueError(
                f"{where}.expansion has {len(exp)} entries; the source has {m or 1} output(s): give "
                "one expansion per output"
            )
        return exp[j or 0], f"{where}.expansion[{j or 0}]"
    if m is not None:
        raise ValueError(
            f"{where}.expansion is a single expansion but the source has {m} outputs: give a list, one per output"
        )
    return exp, where


def _contracted_expansion(section: ContractedConfig, d: int, m: int | None, j: int | None) -> tuple | None:
    """Output ``j``'s expansion ``(t0, t1, V, θ)`` of a ``contracted`` section (None: none given)."""
    exp, where = _output_expansion(section, m, j, "statistics.contracted")
    return None if exp is None else low_rank_expansion(exp, d, where)


def _hermite_expansion(section: HermiteConfig, d: int, m: int | None, j: int | None) -> tuple | None:
    """Output ``j``'s expansion ``(t0, t1, t2)`` of a ``hermite`` section (None: none given)."""
    exp, where = _output_expansion(section, m, j, "statistics.hermite")
    return expansion_setup(exp, d, where)


# ------------------------------------------------------------------ partials


@dataclass
class Partial:
    """Merged sums of a run of consecutive whole chunks.

    ``sums[stat][array]`` are accumulator sums; ``sumsq[stat][term]`` are sums over
    chunks of the squared per-chunk estimand sums (for standard errors).
    """

    chunk_start: int
    chunk_stop: int
    sums: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    sumsq: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    #: numpy version and BLAS kernel that computed the block (``worker.platform_id``)
    platform: str = ""

    @property
    def n_chunks(self) -> int:
        return self.chunk_stop - self.chunk_start

    @classmethod
    def empty(cls, stats: Iterable[Statistic], at: int = 0) -> Partial:
        p = cls(at, at)
        for s in stats:
            p.sums[s.name] = s.init()
            p.sumsq[s.name] = {k: np.zeros(v.shape) for k, v in s.terms_schema().items()}
        return p

    def add(self, other: Partial) -> Partial:
        """Add the partial of the chunks right after this one, in place (order matters for bits)."""
        if other.chunk_start != self.chunk_stop:
            raise ValueError(
                f"partials must be merged in chunk order: have chunks [{self.chunk_start}, {self.chunk_stop}), "
                f"got [{other.chunk_start}, {other.chunk_stop})"
            )
        for name, arrays in other.sums.items():
            for k, v in arrays.items():
                self.sums[name][k] += v
            for k, v in other.sumsq[name].items():
                self.sumsq[name][k] += v
        self.chunk_stop = other.chunk_stop
        return self

    def nbytes(self) -> int:
        return sum(v.nbytes for g in (self.sums, self.sumsq) for a in g.values() for v in a.values())


def accumulate_chunks(
    stats: list[Statistic], source: Source, seed: int, chunk_size: int, chunk_start: int, chunk_stop: int
) -> Partial:
    """Reduce chunks ``[chunk_start, chunk_stop)`` into one :class:`Partial`, in chunk order."""
    part = Partial.empty(stats, chunk_start)
    for chunk_id in range(chunk_start, chunk_stop):
        accs = {s.name: s.init() for s in stats}
        row = 0
        try:
            for x, y in chunk_batches(source, seed, chunk_id, chunk_size):
                check_finite(x, y, chunk_id, row)
                for s in stats:
                    s.update(accs[s.name], x, y)
                row += len(y)
        except LabelShapeError as err:  # a black-box teacher's answer: name the chunk and row
            raise at_rows(err, chunk_id, row) from None
        for s in stats:
            sums = part.sums[s.name]
            for k, v in accs[s.name].items():
                sums[k] += v
            sq = part.sumsq[s.name]
            for k, v in s.terms(accs[s.name]).items():
                sq[k] += v * v
        part.chunk_stop = chunk_id + 1
    return part
