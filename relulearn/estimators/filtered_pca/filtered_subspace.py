"""The subspace of the filtered-pca method (:mod:`.filtered_pca.entry`), replayed from the stored statistics and the
passes run so far: from the dense ``M_τ`` and the residual passes, or, on a sketch, from the subspace passes of
the ``M_τ`` and the residual rounds (a sketch of the residual-filtered matrices and its subspace passes)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...network import Network
from ..base import NoSignalError, PassRequest
from ..spectral import subspace
from ..spectral.stage import relevant_subspace
from ..spectral.stored_matrices import FilterGridError, filtered_matrices
from ..spectral.subspace_geometry import principal_angles
from .joint_subspace import JointStep, joint_ritz, joint_sketch_basis

Arrays = Mapping[str, np.ndarray]


#: subspace passes on a sketch of the M_τ: at least 2 (the first pass's gap comes from the noisy
#: sketch), at most 5
SKETCH_PASSES = (2, 5)


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


def _subspace_state(
    stats: Mapping[str, Arrays], passes: Sequence[Mapping[str, Arrays]]
) -> tuple[np.ndarray, list[dict], bool]:
    """The basis (d, r) after the first pass and every residual pass; per-step records;
    whether the last pass added nothing."""
    mats, ses, names, grid = filtered_matrices(stats["filtered"], "M_tau", _grid_hint(stats))
    sub = relevant_subspace(mats, ses, names=names)
    steps = [{"pass": "filtered", "grid": grid, "added": int(sub.rank), "subspace": sub.to_dict(include_basis=False)}]
    if sub.rank == 0:
        raise NoSignalError(
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
        m, s, n, grid = filtered_matrices(arrays, f"residual{i + 1}", "The candidates fit every sample exactly.")
        step = relevant_subspace(m, s, names=n)
        # the pass's matrices live off the basis; keep what is off it (noise may leak a little in)
        added = min(step.rank, basis.shape[0] - basis.shape[1])
        basis = _orthonormal_extension(basis, step.basis[:, :added])
        steps.append(
            {
                "pass": f"residual-{i + 1}",
                "grid": grid,
                "added": int(added),
                "subspace": step.to_dict(include_basis=False),
            }
        )
        exhausted = added == 0
    return basis, steps, exhausted


def _stored_candidate(arrays: Arrays, c: int = 0) -> Network:
    layers, j = [], 0
    while f"candidate{c}_W{j}" in arrays:
        layers.append(np.asarray(arrays[f"candidate{c}_W{j}"], dtype=np.float64))
        j += 1
    return Network(tuple(layers), activation="relu")


def last_candidate(passes: Sequence[Mapping[str, Arrays]]) -> tuple[Network, np.ndarray] | None:
    """The best candidate the last residual pass (on a sketch: round) was asked for, and the basis (d, r) whose
    coordinates it is a network on; None before the first."""
    for p in reversed(passes):
        if "residual" in p:
            return _stored_candidate(p["residual"]), np.asarray(p["residual"]["basis"]).T
        sketch = p.get("sketch", {})
        if "Y_residual" in sketch and "BMB_residual" not in sketch:  # a round's sketch holds its candidate
            return _stored_candidate(sketch), np.asarray(sketch["residual_basis"]).T
    return None


def _candidate_config(net: Network) -> dict[str, Any]:
    return {"weights": [w.tolist() for w in net.weights]}


def _stored_candidate_config(arrays: Arrays) -> dict[str, Any]:
    return _candidate_config(_stored_candidate(arrays))


def _sketched_state(
    sketch: Arrays, passes: Sequence[Mapping[str, Arrays]]
) -> PassRequest | tuple[np.ndarray, list[dict], bool, int]:
    """Replay the passes of a sketched run: subspace passes on the ``M_τ``, then residual rounds (a sketch
    of the residual family of the best candidate on the basis so far, and its subspace passes; the
    directions they find extend the basis). Returns the next :class:`PassRequest` of an unfinished
    iteration, or the basis, per-pass records, whether the last round added nothing, and the rounds."""
    sketches = [p["sketch"] for p in passes if "sketch" in p]
    filtered = [a for a in sketches if "Y_filtered" in a]
    got: PassRequest | tuple[np.ndarray, list[dict]] | tuple[JointStep, list[dict]]
    got = _sketch_subspace(sketch, filtered)
    if isinstance(got, PassRequest):
        return got
    basis, steps = got
    residual = [a for a in sketches if "Y_residual" in a]
    groups: list[list[Arrays]] = []
    for a in residual:  # a round opens with its sketch (no basis: no B M Bᵀ), then its subspace passes
        if "BMB_residual" not in a or not groups:
            groups.append([a])
        else:
            groups[-1].append(a)
    exhausted = False
    for i, (first, *done) in enumerate(groups):
        d, r = basis.shape
        stored = np.asarray(first["residual_basis"]).T
        if stored.shape != basis.shape or not np.allclose(stored, basis, atol=1e-12):
            raise ValueError(
                f"residual round {i + 1} was computed on another subspace; this is a bug, please report it"
            )
        count = float(np.asarray(first["count"]))
        keep = np.flatnonzero(np.asarray(first["prob_residual"])[0] * count >= 1)
        if keep.size == 0:  # every |residual| at or below the smallest τ: the candidate fits every sample
            steps.append({"pass": f"residual-{i + 1}", "added": 0, "reason": "no residual above any threshold"})
            exhausted = True
            continue
        options = {
            "basis": basis.T.tolist(),
            "candidates": [_stored_candidate_config(first)],
            "thresholds": np.asarray(first["residual_tau"])[0].tolist(),
        }
        got = _iterate(
            first,
            done,
            "residual",
            keep,
            options,
            f"residual-{i + 1}-subspace",
            "a single sketch of the residual-filtered matrices is noisy at large d; subspace passes on "
            "the same chunks refine it (all τ at once)",
        )
        if isinstance(got, PassRequest):
            return got
        last, rsteps = got
        added = min(last.rank, d - r)
        basis = _orthonormal_extension(basis, last.basis[:, :added])
        steps.extend(rsteps)
        steps.append({"pass": f"residual-{i + 1}", "added": int(added)})
        exhausted = added == 0
    return basis, steps, exhausted, len(groups)


def _sketch_subspace(sketch: Arrays, done: Sequence[Arrays]) -> PassRequest | tuple[np.ndarray, list[dict]]:
    """Subspace iteration on the sketched ``M_τ`` of every τ at once, one requested pass per step on the
    chunks of the main store (``done``: the passes so far); the iteration is replayed from the passes (a
    pure function of the statistics). Returns the next :class:`PassRequest`, or the basis (d × m) of the
    span of the significant eigenvectors and the per-pass records."""
    tau = np.asarray(sketch["tau"], dtype=np.float64)
    if tau.ndim != 1:
        raise ValueError(
            "filtered-pca on a sketch learns one scalar label; this store sketches the M_τ of "
            f"{tau.shape[0]} outputs (choose one with source.output)"
        )
    count = float(np.asarray(sketch["count"]))
    keep = np.flatnonzero(np.asarray(sketch["prob_filtered"], dtype=np.float64) * count >= 1)
    if keep.size == 0:
        taus = ", ".join(f"{t:.4g}" for t in tau)
        raise FilterGridError(
            f"no sample passed the filter at any threshold of the sketched M_τ (τ = {taus}, {int(count):,} "
            f"samples): every |y| is at or below the smallest τ. {_grid_hint({})}"
        )
    got = _iterate(
        sketch,
        done,
        "filtered",
        keep,
        {"thresholds": tau.tolist()},
        "subspace",
        "a single sketch of the M_τ is swamped by noise at large d; subspace passes on the same "
        "chunks refine it (randomised subspace iteration, all τ at once)",
    )
    if isinstance(got, PassRequest):
        return got
    last, steps = got
    if last.rank == 0:
        raise NoSignalError(
            "filtered PCA found no direction above the noise floor in the sketched M_τ: the statistics are pure "
            "noise at this sample count; estimate with more samples (`relulearn estimate ... --samples N`)"
        )
    return last.basis, steps


def _iterate(
    sketch: Arrays,
    done: Sequence[Arrays],
    family: str,
    keep: np.ndarray,
    options: dict[str, Any],
    prefix: str,
    first_reason: str,
) -> PassRequest | tuple[JointStep, list[dict]]:
    """Subspace iteration on a sketched family's matrices of the τ in ``keep``, replayed from the passes
    ``done``: the next pass (named ``prefix-i``, with the family's ``options``), or the last joint step and
    the per-pass records once the span moves by less than its angle bound (at most ``SKETCH_PASSES[1]``)."""
    if not done:
        y, se = _per_tau(sketch, f"Y_{family}", family), _per_tau(sketch, f"Y_{family}_se", family)
        basis, _ = joint_sketch_basis([y[t] for t in keep], [se[t] for t in keep])
        return PassRequest(f"{prefix}-1", subspace.pass_statistics(basis, family, options), first_reason)
    joint = [_joint_step(p, keep, family) for p in done]
    steps = [dict({"pass": f"{prefix}-{i + 1}", "added": j.rank}, **j.to_dict()) for i, j in enumerate(joint)]
    last = joint[-1]
    change = math.pi / 2
    if len(joint) > 1 and joint[-2].rank == last.rank and last.rank > 0:
        change = float(principal_angles(joint[-2].basis, last.basis).max(initial=0.0))
    steps[-1]["change"] = change
    lo, hi = SKETCH_PASSES
    if len(done) < hi and (len(done) < lo or change > last.angle_bound):
        return PassRequest(
            f"{prefix}-{len(done) + 1}",
            subspace.pass_statistics(last.next_basis, family, options),
            f"the span of the significant directions moved by {change:.3g} rad in the last pass, more "
            f"than its angle bound {last.angle_bound:.3g} rad (or fewer than {lo} passes so far)",
        )
    steps[-1]["converged"] = bool(change <= last.angle_bound)
    return last, steps


def _joint_step(arrays: Arrays, keep: np.ndarray, family: str = "filtered") -> JointStep:
    """:func:`.joint_subspace.joint_ritz` of a stored subspace pass of a family, on the τ that kept samples."""
    y, y_se, bmb = (_per_tau(arrays, k, family) for k in (f"Y_{family}", f"Y_{family}_se", f"BMB_{family}"))
    key = f"BMB_{family}_se"
    bmb_se = _per_tau(arrays, key, family) if key in arrays else None
    return joint_ritz(
        [y[t] for t in keep],
        [y_se[t] for t in keep],
        [bmb[t] for t in keep],
        np.asarray(arrays["omega"]),
        bmb_ses=None if bmb_se is None else [bmb_se[t] for t in keep],
    )


def _per_tau(arrays: Arrays, key: str, family: str) -> np.ndarray:
    """A sketched family's array over τ: ``filtered`` as stored, ``residual`` of its one candidate."""
    a = np.asarray(arrays[key])
    return a[0] if family == "residual" else a
