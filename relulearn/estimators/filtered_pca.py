"""Method ``filtered-pca``: deep ReLU networks with a low-dimensional relevant subspace
(Chen–Klivans–Meka 2021, "Learning deep ReLU networks is fixed-parameter tractable").

``F(x) = W_L relu(… relu(W_0 x))`` depends on ``x`` only through ``V = rowspace(W_0)``
(``k ≪ d`` rows). The method:

1. **Filtered PCA.** The stored ``M_τ = E[1{|y| > τ}(xxᵀ − I)]`` (a grid of τ) have their
   range inside ``V`` (DESIGN.md §3), also for networks whose low-order Hermite moments
   vanish. Their eigenvectors above the noise floor (from the standard errors,
   :func:`.spectral.relevant_subspace`) give the first directions ``W``.
2. **Iterate.** Fit candidate networks ``F̃`` on ``z = Wᵀx`` (architectures up to the
   given depth and width, random starts in a norm ball refined by local optimization,
   best by held-out loss: :mod:`.deepfit`; the sphere-net enumeration of
   :mod:`.enumeration` for one hidden layer). Ask for one pass of the residual-filtered
   matrices ``E[1{|y − F̃(Wᵀx)| > τ}(x⊥x⊥ᵀ − (I − WWᵀ))]`` of the best candidates (the
   ``residual`` statistic), add the directions that clear its noise floor, repeat; stop
   when none does, or when the held-out residual loss is below ``target``.
3. **Output** a ReLU network on the input space (first layer composed with ``Wᵀ``), then
   :func:`~.polish.polish` when it has one hidden layer.

Like every method, a pure function of stored statistics and bounded samples; ``api`` runs
the passes it asks for and calls it again with their statistics. Each call re-derives the
subspace from the main store and the passes (cheap), and fits candidates only on the
newest subspace; when a pass adds nothing, the candidate stored with it is the answer.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from ..network import Network, gradient_subspace
from . import deepfit, enumeration, spectral
from .base import LearnResult, MissingStatisticError, PassRequest, Samples
from .polish import polish_and_select
from .spectral import FilterGridError

__all__ = ["OPTIONS", "MissingStatisticError", "PassRequest", "LearnResult", "Samples", "FilterGridError",
           "required_statistics", "learn", "MAX_PASSES", "QUANTILES"]

Arrays = Mapping[str, np.ndarray]

#: keyword options of :func:`learn` that ``relulearn learn`` passes through
OPTIONS = ("width", "depth", "budget")
#: the τ grid of the first pass and of every residual pass, as quantiles of |y| (|residual|)
QUANTILES = [0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.97]
#: residual passes asked for at most (each adds at least one direction, so also ≤ k)
MAX_PASSES = 4
#: candidates sent to each residual pass (the best of distinct architectures)
PASS_CANDIDATES = 2


def required_statistics(d: int, width: Optional[int] = None) -> dict:
    """The ``statistics`` config section the first pass needs."""
    return {"basic": {}, "filtered": {"quantiles": list(QUANTILES)}}


def sample_sizes(d: int, depth: int, width: int) -> tuple[int, int]:
    """Training and validation samples: enough for a low-dimensional fit, and for polish's
    ``width·d`` unknowns when the network has one hidden layer."""
    if depth == 1:
        return max(50_000, 40 * width * d), max(20_000, 10 * width * d)
    return 50_000, 20_000


def _check(stats: Mapping[str, Arrays]) -> None:
    if "filtered" not in stats:
        raise MissingStatisticError.lacking("filtered-pca", "filtered", "filtered second moments M_τ",
                                            f"{{quantiles: {QUANTILES}}}")


def _grid_hint(stats: Mapping[str, Arrays]) -> str:
    hint = "Lower statistics.filtered.thresholds, or give quantiles instead (e.g. quantiles: [0.5, 0.75, 0.9])"
    basic = stats.get("basic")
    if basic is not None and "yy" in basic:
        hint += f"; this store has E[y²] = {float(np.asarray(basic['yy'])):.4g}"
    return hint + ", and estimate into a new store."


def _orthonormal_extension(basis: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``[basis, new']`` with ``new`` orthonormalized against ``basis`` (new: (d, m))."""
    if new.shape[1] == 0:
        return basis
    new = new - basis @ (basis.T @ new)
    q, _ = np.linalg.qr(new)
    return np.concatenate([basis, q], axis=1)


def _subspace_state(stats: Mapping[str, Arrays], passes: Sequence[Mapping[str, Arrays]]
                    ) -> tuple[np.ndarray, list[dict], bool]:
    """The basis (d, r) after the first pass and every residual pass; per-step records;
    whether the last pass added nothing."""
    mats, ses, names, grid = spectral.filtered_matrices(stats["filtered"], "M_tau", _grid_hint(stats))
    sub = spectral.relevant_subspace(mats, ses, names=names)
    steps = [{"pass": "filtered", "grid": grid, "added": int(sub.rank), "subspace": sub.to_dict(include_basis=False)}]
    if sub.rank == 0:
        raise ValueError(
            "filtered PCA found no direction above the noise floor in the stored M_τ: the statistics are pure "
            "noise at this sample count; estimate with more samples (`relulearn estimate ... --samples N`)"
        )
    basis = sub.basis
    exhausted = False
    for i, p in enumerate(passes):
        arrays = p["residual"]
        stored_basis = np.asarray(arrays["basis"]).T
        if stored_basis.shape != basis.shape or not np.allclose(stored_basis, basis, atol=1e-12):
            raise ValueError(f"residual pass {i + 1} was computed on another subspace; this is a bug, please report it")
        m, s, n, grid = spectral.filtered_matrices(arrays, f"residual{i + 1}", "The candidates fit every sample exactly.")
        step = spectral.relevant_subspace(m, s, names=n)
        # the pass's matrices live off the basis; keep what is off it (noise may leak a little in)
        added = min(step.rank, basis.shape[0] - basis.shape[1])
        basis = _orthonormal_extension(basis, step.basis[:, :added])
        steps.append({"pass": f"residual-{i + 1}", "grid": grid, "added": int(added),
                      "subspace": step.to_dict(include_basis=False)})
        exhausted = added == 0
    return basis, steps, exhausted


def _stored_candidate(arrays: Arrays, c: int = 0) -> Network:
    layers, j = [], 0
    while f"candidate{c}_W{j}" in arrays:
        layers.append(np.asarray(arrays[f"candidate{c}_W{j}"], dtype=np.float64))
        j += 1
    return Network(tuple(layers), activation="relu")


def learn(stats: Mapping[str, Arrays], passes: Sequence[Mapping[str, Arrays]],
          samples: Callable[[int, int], Samples], *, width: Optional[int] = None, depth: Optional[int] = None,
          mapper: Callable = map, seed: int = 0, budget: int = 256, starts: int = 6,
          target: float = 1e-4) -> LearnResult | PassRequest:
    """Learn ``F(x) = W_L relu(… relu(W_0 x))`` by iterative filtered PCA.

    Parameters
    ----------
    stats
        The main store's statistics, ``{name: arrays}``; needs ``filtered``.
    passes
        The ``residual`` passes run so far at this method's request, in order.
    samples
        ``samples(n_train, n_val)`` draws bounded held-out samples from the source.
    width, depth
        Largest hidden width and number of hidden layers of the candidate networks
        (defaults: depth 1; width: the subspace rank for depth 1, else twice it, at least 4).
    mapper
        ``map``-like callable that evaluates candidate batches (a cluster's map in a run).
    budget
        Largest number of candidate networks the enumeration may fit; more is an error
        (:class:`.deepfit.CandidateBudgetError`) raised before any fitting.
    starts
        Random starts per architecture.
    target
        Stop asking for residual passes once the best candidate's held-out relative loss
        ``E[(y − F̃)²]/E[y²]`` is below this.

    Returns
    -------
    LearnResult or PassRequest
    """
    _check(stats)
    depth = 1 if depth is None else int(depth)
    if depth < 1:
        raise ValueError(f"depth must be at least 1 (hidden layers), got {depth}")
    if width is not None and width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    basis, steps, exhausted = _subspace_state(stats, passes)
    d, r = basis.shape
    w = int(width) if width is not None else (r if depth == 1 else max(4, 2 * r))
    if depth > 1:  # fail before any work when the enumeration cannot fit its budget
        deepfit.check_budget(depth, w, starts, budget)
    report: dict[str, Any] = {"steps": steps, "depth": depth, "width": w}
    n_train, n_val = sample_sizes(d, depth, w)
    smp = samples(n_train, n_val)

    if exhausted:
        # the last pass found nothing new: its best candidate, fitted on this very basis, is the answer
        net = _stored_candidate(passes[-1]["residual"])
        report["stop_reason"] = "the last residual pass found no direction above its noise floor"
        return _finish(net, basis, depth, smp, report)

    z, z_val = smp.x_train @ basis, smp.x_val @ basis
    cands = _fit(z, smp.y_train, z_val, smp.y_val, depth=depth, width=w, budget=budget, starts=starts,
                 mapper=mapper, seed=seed + 1000 * len(passes))
    report["candidates"] = [c.to_dict() for c in cands[:10]]
    best = cands[0]
    report["residual_loss"] = best.val_loss
    if best.val_loss <= target:
        report["stop_reason"] = f"held-out residual loss {best.val_loss:.3g} is below the target {target:.3g}"
        return _finish(best.network, basis, depth, smp, report)
    if len(passes) >= MAX_PASSES or r >= d:
        report["stop_reason"] = f"stopped after {len(passes)} residual passes (rank {r} of d={d})"
        return _finish(best.network, basis, depth, smp, report)
    chosen, seen = [], set()
    for c in cands:  # the best candidate, then the best of other architectures
        if c.widths not in seen:
            chosen.append(c)
            seen.add(c.widths)
        if len(chosen) == PASS_CANDIDATES:
            break
    return PassRequest(
        f"residual-{len(passes) + 1}",
        {"residual": {"basis": basis.T.tolist(),
                      "candidates": [{"weights": [wt.tolist() for wt in c.network.weights]} for c in chosen],
                      "quantiles": list(QUANTILES)}},
        f"the best network on the {r}-dimensional subspace leaves held-out relative loss {best.val_loss:.3g}; "
        "one pass of residual-filtered matrices looks for the directions still missing",
    )


def _fit(z: np.ndarray, y: np.ndarray, z_val: np.ndarray, y_val: np.ndarray, *, depth: int, width: int,
         budget: int, starts: int, mapper: Callable, seed: int) -> list[deepfit.Candidate]:
    """Candidates on the subspace coordinates, best first (held-out loss)."""
    if depth == 1:
        # one hidden layer: the sphere-net enumeration of the moments method (exact on noiseless data)
        enum = enumeration.enumerate_network(z, y, z_val, y_val, k=width, mapper=mapper, seed=seed)
        a, lam = np.asarray(enum.directions), np.asarray(enum.output_weights)
        if a.size == 0:
            a, lam = np.zeros((1, z.shape[1])), np.zeros(1)
        net = Network((a, lam[None, :]), activation="relu")
        return [deepfit.Candidate(widths=(a.shape[0],), start=0, network=net,
                                  train_loss=deepfit.relative_loss(net, z, y),
                                  val_loss=deepfit.relative_loss(net, z_val, y_val), iterations=0)]
    return deepfit.fit_candidates(z, y, z_val, y_val, depth=depth, width=width, starts=starts, budget=budget,
                                  mapper=mapper, seed=seed)


def _finish(net_z: Network, basis: np.ndarray, depth: int, smp: Samples, report: dict) -> LearnResult:
    """Lift to the input space; polish when there is one hidden layer; keep the better."""
    lifted = deepfit.lift(net_z, basis)
    if lifted.depth == 1:
        _, net = polish_and_select(lifted, smp.x_train, smp.y_train, smp.x_val, smp.y_val, report)
    else:
        net = lifted
        report["validation_relative_loss"] = {"enumeration": deepfit.relative_loss(net, smp.x_val, smp.y_val)}
        report["chosen"] = "enumeration"
    # how strongly the fitted network uses each direction of the found subspace: residual passes
    # also add the directions by which the estimate missed V, so the rank can exceed dim V
    _, eig = gradient_subspace(net_z, smp.x_val[:20_000] @ basis, basis.shape[1])
    report["subspace"] = {"rank": int(basis.shape[1]), "basis": basis.tolist(),
                          "gradient_spectrum": (eig / max(eig[0], 1e-300)).tolist()}
    report["architecture"] = [int(w.shape[0]) for w in net.weights[:-1]]
    return LearnResult(net, report)
