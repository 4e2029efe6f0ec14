"""Enumeration of one-hidden-layer ReLU networks inside a found subspace (docs/design.md §6).

After the spectral stage has found a ``k'``-dimensional subspace with orthonormal basis
``V`` (``d × r``), a sample ``x ~ N(0, I_d)`` is projected to ``z = Vᵀx ~ N(0, I_r)`` and the
labels follow ``y = Σ_i λ_i relu(<a_i, z>) (+ noise)`` with ``a_i = Vᵀu_i``. This module
learns ``(a_i, λ_i)``, ``i ≤ k``, from such projected samples by the multi-stage enumeration
of Chen–Dou–Goel–Klivans–Meka (2023), made practical. Each stage:

1. **Global scan.** Every direction ``a`` of a net of the sphere ``S^{r-1}`` (both signs of
   every direction, since ``relu(<a,z>) ≠ relu(<-a,z>)``) is scored against the residual
   ``res`` of the current model: the least-squares output weight ``λ = <φ, res>/<φ, φ>`` of
   ``φ = relu(z a)`` and the reduction ``<φ, res>²/<φ, φ>`` of the squared residual. Batches
   of candidates go through a ``mapper`` (the builtin ``map`` in tests, a Dask client's map
   in a run), one BLAS-3 product ``relu(z Aᵀ)`` per batch (:func:`.enumeration.relu_units.score_candidates`).
2. **Well-separated peaks.** The local maxima of the reduction that are at least
   ``separation`` apart and not much weaker than the best are "the neurons that are well
   separated at this scale"; several are taken at once.
3. **Local refinement.** Around each peak, nets of caps of halving radius are scored (through
   the mapper again) down to ``FINEST_CAP``.
4. **Moves and joint refit.** Moves are tried in order — add all peaks, add one peak, split
   a unit along the direction of most negative splitting curvature — each followed by a
   joint refit of all units in the ``r``-dimensional space (:func:`.enumeration.relu_units.fit_units`,
   Levenberg–Marquardt), merging of close units the held-out loss cannot tell apart, and
   pruning. The first move that lowers the held-out loss significantly is kept, and the
   search recurses on its residual.
5. **Candidate answers.** The search may hold ``k + extra_units`` units: over-parameterised
   fits leave the local minima where one unit sits between two true ones. After every stage
   the model is pruned to at most ``k`` units (dropping the unit, or mirrored pair, whose
   removal costs least, mirroring units to keep the linear part) and refitted; these are
   the candidate answers (1, 2, ..., k units). The answer is the one with the lowest
   held-out loss, a smaller one winning unless the larger is significantly better.

The search stops on an exact fit, when no move helps on held-out data, after
``max_exchanges`` stages at full size, or when the budget — the total number of candidate
directions scored — is spent.

The pieces: the nets of the sphere (:mod:`.enumeration.sphere_nets`), the units and their scores and fits
(:mod:`.enumeration.relu_units`), the stages (:mod:`.enumeration.search`) and the changes of model between them
(:mod:`.enumeration.moves`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .relu_units import Mapper, _single_thread
from .search import EnumerationResult, _Options, _Search

__all__ = ["enumerate_network", "SearchTolerances"]


@dataclass(frozen=True)
class SearchTolerances:
    """The sizes and tolerances of :func:`enumerate_network`'s search (the defaults serve every method).

    Attributes
    ----------
    score_samples
        Candidates are scored, and moves screened, on the first ``min(n, score_samples)``
        training samples; accepted moves are refitted on all of them.
    extra_units
        Units the search may hold beyond ``k``.
    max_exchanges
        Stages run once ``k + extra_units`` units are held (add then prune, split then
        prune); default ``k``.
    separation
        Peaks of one stage are at least this far apart (radians): "well separated".
    fraction
        A secondary peak is taken when its reduction is at least this fraction of the best.
    merge_angle
        Two units closer than this (radians) are tried merged into one.
    se_margin
        A move (or a larger model) must lower the held-out loss by this many standard errors
        of the paired per-sample difference ...
    min_gain
        ... and by this fraction of the held-out loss.
    """

    score_samples: int = 8192
    extra_units: int = 2
    max_exchanges: int | None = None
    separation: float = 0.6
    fraction: float = 0.25
    merge_angle: float = 0.1
    se_margin: float = 2.0
    min_gain: float = 1e-3


def enumerate_network(
    z: np.ndarray,
    y: np.ndarray,
    z_val: np.ndarray,
    y_val: np.ndarray,
    *,
    k: int,
    budget: int = 200_000,
    mapper: Mapper = map,
    batch: int = 512,
    seed: int = 0,
    tolerances: SearchTolerances = SearchTolerances(),
) -> EnumerationResult:
    """Learn ``y ≈ Σ_{i≤m} λ_i relu(<a_i, z>)``, ``m ≤ k``, by multi-stage enumeration.

    Each stage scans the residual of the current model over a net of the sphere (through
    ``mapper``), takes the well-separated peaks, refines them on shrinking caps, and tries
    moves — add all peaks, add one peak, split a unit — each followed by a joint refit
    (:func:`.enumeration.relu_units.fit_units`); the first move that lowers the held-out loss significantly is kept.
    The search may hold up to ``k + extra_units`` units (over-parameterised fits escape
    the local minima where one unit sits between two true ones); after every stage the model
    is pruned to at most ``k`` units, and these pruned models are the candidate answers.

    Parameters
    ----------
    z, y
        Training sample projected on the subspace, ``(n, r)``, and labels ``(n,)``.
    z_val, y_val
        Held-out sample of the same kind (acceptance of moves, model selection, stopping).
    k
        Upper bound on the number of units of the answer.
    budget
        Bound on the total number of candidate directions scored.
    mapper
        ``mapper(fn, iterable) -> iterable`` with the semantics of the builtin ``map``;
        called with :func:`.enumeration.relu_units.score_candidates` and tuples ``(z_s, res, A_batch)`` of numpy
        arrays; results are used in order, so any evaluation order gives the same answer.
    batch
        Candidate directions per mapped task.
    seed
        Seed of the nets.
    tolerances
        The search's sizes and tolerances (:class:`SearchTolerances`: scoring samples, extra units,
        exchanges, peak separation, merging, acceptance of moves).

    Returns
    -------
    EnumerationResult
        The candidate answer with the lowest held-out loss (a smaller one wins unless the
        larger is significantly better).

    Raises
    ------
    ValueError
        On inconsistent shapes, non-finite values, ``k < 1``, or a budget too small for one
        stage (the message says which budget to give).
    """
    z = np.ascontiguousarray(z, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64).reshape(-1)
    z_val = np.ascontiguousarray(z_val, dtype=np.float64)
    y_val = np.ascontiguousarray(y_val, dtype=np.float64).reshape(-1)
    if z.ndim != 2 or z_val.ndim != 2 or z.shape[1] != z_val.shape[1]:
        raise ValueError(f"z and z_val must be (n, r) with the same r; got {z.shape} and {z_val.shape}")
    if len(z) != len(y) or len(z_val) != len(y_val):
        raise ValueError(f"samples and labels differ in length: {len(z)} vs {len(y)}, {len(z_val)} vs {len(y_val)}")
    if len(z_val) < 2 or len(z) < 2:
        raise ValueError("enumerate_network needs training and held-out samples (at least 2 of each)")
    for name, arr in (("z", z), ("y", y), ("z_val", z_val), ("y_val", y_val)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or inf")
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    if batch < 1:
        raise ValueError(f"batch must be ≥ 1, got {batch}")
    t = tolerances
    if t.extra_units < 0:
        raise ValueError(f"extra_units must be ≥ 0, got {t.extra_units}")
    opts = _Options(
        k=k,
        budget=int(budget),
        batch=batch,
        seed=seed,
        score_samples=t.score_samples,
        k_max=k + t.extra_units,
        max_exchanges=k if t.max_exchanges is None else t.max_exchanges,
        separation=t.separation,
        fraction=t.fraction,
        merge_angle=t.merge_angle,
        se_margin=t.se_margin,
        min_gain=t.min_gain,
    )
    with _single_thread():
        return _Search(z, y, z_val, y_val, mapper, opts).run()
