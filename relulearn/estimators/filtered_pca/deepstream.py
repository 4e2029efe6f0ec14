"""Streamed refinement of a deep candidate and its subspace: ``f(x) = g(Bᵀx)`` fitted on every sample.

``filtered-pca`` fits a deep bias-free ReLU network ``g`` on ``z = Bᵀx`` (``B``: d × r, orthonormal
columns, from the spectral stage). The basis is only as accurate as the spectral stage's noise
allows (at d = 2048 and 10⁶ samples, 0.1–0.5 rad for the weaker directions), and ``g`` was fitted on
a bounded sample. This module fits both on all ``n`` samples by Gauss–Newton, one pass per step,
with statistics that cost O(d r + P²) per sample (P: the weights of ``g``) and no d × d matrix:

- per part, with ``z = x B``, ``e = y − g(z)``, the Jacobian ``J`` (n × P) of ``g`` in its weights
  (exact backprop) and ``D = ∇_z g`` (n × r): the sums ``JᵀJ``, ``Jᵀe``, ``G = xᵀ (e ⊙ D)``
  (d × r), ``H = DᵀD`` (r × r), ``Σe²``, ``Σy²`` (:class:`DeepSums`);
- the step: ``Δθ = (JᵀJ)⁺ Jᵀe`` for the weights, ``ΔB = (I − BBᵀ) G H⁺`` for the basis. Why the
  basis step is a Gauss–Newton step: perturbing B by Δ ⊥ B changes f by ``(Δᵀx⊥)·∇_z g``, and for
  Gaussian x the part ``x⊥ = (I − BBᵀ)x`` is independent of z with identity covariance on
  range(I − BBᵀ), so the Gauss–Newton matrix of Δ is ``E[∇g ∇gᵀ] ⊗ (I − BBᵀ)`` — a closed form,
  like :class:`.polish.streamed_gram.PopulationGram` — and its coupling with θ (a function of z alone, times
  a mean-zero x⊥ independent of it) vanishes. Rotations inside span(B) are the first layer's
  job (θ);
- damped (Levenberg–Marquardt, :data:`DAMPING` relative to each block's mean diagonal): a basis of
  r columns holds directions the network barely uses (a residual pass adds the directions by
  which the estimate missed, and noise), where H is near zero and an undamped step is noise;
- the new point: ``B + ΔB = Q R`` (QR) and g's first layer ``W₀ → W₀ Rᵀ``, so that
  ``g'(Qᵀx) = g((B + ΔB)ᵀx)`` exactly; the next pass evaluates it: a step is kept when the loss
  fell, else the damping grows tenfold (at most :data:`MAX_REJECTS` times in a row); after a kept
  step it follows the ratio of the actual to the predicted decrease (Nielsen's update).

Stops: the loss at rounding level; a step at rounding level; a predicted decrease below a
thousandth of the statistical excess error ``(P + (d − r) r)/n · loss``; :data:`POOR_STEPS` steps
in a row that gained less than :data:`POOR_GAIN` of the model's promise; ``max_passes``. Its fixed
point is the least-squares fit on all n samples: with noiseless labels the teacher itself once
span(B) holds the teacher's first-layer rows, which the steps rotate it onto.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import progress
from ...network import Network
from ..base import part_sum
from ..polish.refine import parts
from ..polish.streamed import PREDICTED_DECREASE, RELATIVE_STEP, ROUNDING_LOSS, mapped_sum, part_rows_for

__all__ = ["DeepSums", "deep_sums", "DeepPart", "refine_deep", "MAX_PASSES"]

#: passes at most (each streams the ``total`` samples once)
MAX_PASSES = 30
#: rows per part at most (several parts keep every worker busy at small d)
PART_ROWS = 100_000
#: rows per block of the Jacobians inside a part
_BLOCK = 8192
#: starting Levenberg–Marquardt damping, relative to the mean diagonal of each Gauss–Newton block
#: (×10 on a rejected step, ÷10 on an accepted one)
DAMPING = 1e-2
#: rejected steps in a row before the refinement gives up
MAX_REJECTS = 5
#: steps in a row whose actual decrease is below this fraction of the model's stop the refinement:
#: near a noiseless or noisy least-squares optimum the model is accurate (gain ≈ 1); a network whose
#: units' kinks keep crossing samples gains almost nothing per pass
POOR_GAIN, POOR_STEPS = 0.5, 4


@dataclass(frozen=True)
class DeepSums:
    """Sums over samples of one part (or several): see the module docstring."""

    jtj: np.ndarray
    jte: np.ndarray
    g: np.ndarray
    h: np.ndarray
    loss: float
    y2: float
    n: int

    def __add__(self, other: DeepSums) -> DeepSums:
        return DeepSums(
            self.jtj + other.jtj,
            self.jte + other.jte,
            self.g + other.g,
            self.h + other.h,
            self.loss + other.loss,
            self.y2 + other.y2,
            self.n + other.n,
        )


def _jacobians(ws: list[np.ndarray], z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``g(z)`` (n,), ``∂g/∂θ`` (n × P, weights flattened layer by layer, row-major) and ``∇_z g``
    (n × r) of a bias-free ReLU network, vectorised over the rows (the subgradient of relu at 0 is 0)."""
    hs, masks = [z], []
    h = z
    for w in ws[:-1]:
        a = h @ w.T
        m = a > 0
        h = np.where(m, a, 0.0)
        hs.append(h)
        masks.append(m)
    out = h @ ws[-1][0]
    jac: list[np.ndarray] = [hs[-1]]  # ∂g/∂W_L = the last hidden layer
    delta = masks[-1] * ws[-1][0]  # ∂g/∂(pre-activation of the last hidden layer)
    dz = None
    for j in range(len(ws) - 2, -1, -1):
        jac.append((delta[:, :, None] * hs[j][:, None, :]).reshape(len(z), -1))
        back = delta @ ws[j]  # ∂g/∂(input of layer j)
        if j > 0:
            delta = back * masks[j - 1]
        else:
            dz = back
    assert dz is not None  # set at j = 0: masks[-1] above needs at least two layers
    return out, np.concatenate(jac[::-1], axis=1), dz


def deep_sums(x: np.ndarray, y: np.ndarray, ws: list[np.ndarray], basis: np.ndarray) -> DeepSums:
    """:class:`DeepSums` of the samples ``(x, y)`` at ``f(x) = g(Bᵀx)``, ``g`` with weights ``ws``; the
    Jacobians are formed :data:`_BLOCK` rows at a time (they stay in cache), the ``d × r`` sum in one GEMM."""
    z = x @ basis
    y = np.asarray(y, dtype=np.float64).reshape(len(x))
    p = sum(w.size for w in ws)
    jtj, jte = np.zeros((p, p)), np.zeros(p)
    e, dz = np.empty(len(x)), np.empty_like(z)
    for a in range(0, len(x), _BLOCK):
        f, jac, dz[a : a + _BLOCK] = _jacobians(ws, z[a : a + _BLOCK])
        e[a : a + _BLOCK] = y[a : a + _BLOCK] - f
        jtj += jac.T @ jac
        jte += jac.T @ e[a : a + _BLOCK]
    return DeepSums(jtj, jte, x.T @ (e[:, None] * dz), dz.T @ dz, float(e @ e), float(y @ y), len(x))


@dataclass(frozen=True)
class DeepPart:
    """Picklable function of a part ``(p, n)``: draws it and returns its :class:`DeepSums`."""

    draw: Any
    weights: tuple[np.ndarray, ...]
    basis: np.ndarray

    def __call__(self, item: tuple[int, int]) -> DeepSums:
        p, n = item
        return part_sum(lambda x, y: deep_sums(x, y, list(self.weights), self.basis), self.draw, p, n)


def _accumulate(
    draw: Any, items: list[tuple[int, int]], ws: list[np.ndarray], basis: np.ndarray, mapper: Callable
) -> DeepSums:
    return mapped_sum(DeepPart(draw, tuple(ws), basis), items, mapper)


def _check(net: Network, basis: np.ndarray) -> None:
    if net.activation != "relu" or net.biases is not None or net.output_dim != 1 or net.depth < 1:
        raise ValueError("the deep streamed refinement takes a bias-free ReLU network with one output")
    d, r = basis.shape
    if net.input_dim != r:
        raise ValueError(f"the network takes {net.input_dim} inputs but the basis has {r} columns")
    if not np.allclose(basis.T @ basis, np.eye(r), rtol=0, atol=1e-8):
        raise ValueError("the basis must have orthonormal columns")


def _unflatten(theta: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    out, i = [], 0
    for s in shapes:
        out.append(theta[i : i + s[0] * s[1]].reshape(s))
        i += s[0] * s[1]
    return out


def _step(cur: DeepSums, basis: np.ndarray, damping: float) -> tuple[np.ndarray, np.ndarray]:
    """The Levenberg–Marquardt step of the weights and of the basis (off its span) at ``damping``
    (relative to the mean diagonal of each Gauss–Newton block): directions of z that the network
    barely uses have a near-zero ``H``, where an undamped step would be noise."""
    p, r = len(cur.jte), cur.h.shape[0]
    a = cur.jtj + damping * max(np.trace(cur.jtj) / p, 1e-300) * np.eye(p)
    h = cur.h + damping * max(np.trace(cur.h) / r, 1e-300) * np.eye(r)
    d_theta = np.linalg.lstsq(a, cur.jte, rcond=1e-12)[0]
    d_basis = np.linalg.lstsq(h, cur.g.T, rcond=1e-12)[0].T
    d_basis -= basis @ (basis.T @ d_basis)  # off the span: rotations inside it are the first layer's
    return d_theta, d_basis


def _moved(
    theta: np.ndarray, d_theta: np.ndarray, shapes: list[tuple[int, ...]], basis: np.ndarray, d_basis: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray]:
    """The weights and the orthonormal basis after the step ``(d_theta, d_basis)``, the same function of x as
    the step's ``(θ + Δθ, B + Δ)``: the triangular factor of the basis goes into the first layer."""
    new_ws = _unflatten(theta + d_theta, shapes)
    q, rr = np.linalg.qr(basis + d_basis)
    new_ws[0] = new_ws[0] @ rr.T  # g'(Qᵀx) = g((B + Δ)ᵀx)
    return new_ws, q


def _gain(cur: DeepSums, new: DeepSums, predicted: float, d_theta: np.ndarray, d_basis: np.ndarray) -> float:
    """The decrease of the loss from ``cur`` to ``new`` as a fraction of the decrease the Gauss–Newton model
    promised (0 where it promised none)."""
    # the decrease the Gauss–Newton model promised: 2 δᵀJᵀe − δᵀJᵀJδ for both blocks
    model = 2 * predicted - float(d_theta @ (cur.jtj @ d_theta) + np.sum((d_basis @ cur.h) * d_basis))
    return (cur.loss - new.loss) / model if model > 0 else 0.0


def _history_entry(
    relative_loss: float,
    rel_step: float,
    damping: float,
    basis: np.ndarray,
    q: np.ndarray,
    gain: float,
    accepted: bool,
) -> dict[str, Any]:
    """One pass's entry of the report's ``iterations``; ``basis_step``: the largest principal angle between
    the bases ``basis`` and ``q``."""
    moved = float(np.arccos(np.clip(np.linalg.svd(basis.T @ q, compute_uv=False).min(), -1.0, 1.0)))
    return {
        "relative_loss": relative_loss,
        "relative_step": rel_step,
        "damping": damping,
        "basis_step": moved,
        "gain": gain,
        "accepted": bool(accepted),
    }


def refine_deep(
    net: Network,
    basis: np.ndarray,
    draw: Any,
    total: int,
    *,
    mapper: Callable = map,
    max_passes: int = MAX_PASSES,
    part_rows: int | None = None,
    first_part: int = 2,
) -> tuple[Network, np.ndarray, dict[str, Any]]:
    """Gauss–Newton on ``total`` streamed samples for ``f(x) = net(Bᵀx)``: the weights and the basis.

    Parameters
    ----------
    net
        Bias-free ReLU network on ``r`` inputs, one output (a :mod:`.filtered_pca.deepfit` candidate).
    basis
        ``(d, r)`` orthonormal columns.
    draw
        A :class:`~.base.SampleDraw`; its parts ``first_part, first_part + 1, …`` are streamed (the same
        ones every pass).
    total
        Samples per pass.
    mapper
        ``map``-like; maps :class:`DeepPart` over the parts (results in order).
    max_passes
        Passes at most.
    part_rows
        Rows per part (default :func:`.polish.streamed.part_rows_for` d, at most :data:`PART_ROWS`).

    Returns
    -------
    (Network, ndarray, dict)
        The refined network on ``r`` inputs, the refined basis (d × r, orthonormal) and a report:
        ``samples``, ``parts``, ``passes``, ``stop``, ``relative_loss``, per pass ``relative_loss``,
        ``relative_step``, ``basis_step`` (largest principal angle the basis moved), ``accepted``.
    """
    basis = np.ascontiguousarray(basis, dtype=np.float64)
    _check(net, basis)
    d, r = basis.shape
    ws = [np.asarray(w, dtype=np.float64) for w in net.weights]
    shapes = [w.shape for w in ws]
    n_params = sum(w.size for w in ws) + (d - r) * r
    items = parts(total, part_rows or min(part_rows_for(d), PART_ROWS), first=first_part)
    cur = _accumulate(draw, items, ws, basis, mapper)
    y2 = cur.y2 or 1.0
    history: list[dict[str, Any]] = [{"relative_loss": cur.loss / y2}]
    passes, stop, damping, rejects, poor = 1, "max_passes", DAMPING, 0, 0
    theta = np.concatenate([w.ravel() for w in ws])
    while passes < max_passes:
        progress.step(
            "deep refinement: passes over the samples", passes, max_passes, f"relative loss {cur.loss / y2:.3g}"
        )
        if cur.loss / y2 < ROUNDING_LOSS * n_params:
            stop = "loss at rounding level"
            break
        d_theta, d_basis = _step(cur, basis, damping)
        # first-order decrease of the summed loss (×½), and the size of the step against the weights
        predicted = float(d_theta @ cur.jte + np.sum(d_basis * cur.g))
        rel_step = float(np.sqrt(np.sum(d_theta**2) / max(float(theta @ theta), 1e-300) + np.sum(d_basis**2) / r))
        if rejects == 0 and rel_step < RELATIVE_STEP:
            stop = "step at rounding level"
            break
        if rejects == 0 and predicted < PREDICTED_DECREASE * (n_params / cur.n) * cur.loss:
            stop = "predicted decrease below a thousandth of the statistical excess error"
            break
        new_ws, q = _moved(theta, d_theta, shapes, basis, d_basis)
        new = _accumulate(draw, items, new_ws, q, mapper)
        passes += 1
        accepted = new.loss <= cur.loss
        gain = _gain(cur, new, predicted, d_theta, d_basis)
        history.append(_history_entry(new.loss / y2, rel_step, damping, basis, q, gain, accepted))
        poor = poor + 1 if gain < POOR_GAIN else 0
        if poor >= POOR_STEPS:
            if accepted:
                ws, basis, cur = new_ws, q, new
            stop = (
                f"stalled: the last {POOR_STEPS} steps gained less than {POOR_GAIN:g} of the decrease the "
                "Gauss–Newton model predicted (ReLU kinks crossing samples: a local minimum of this network)"
            )
            break
        if accepted:
            ws, basis, cur, rejects = new_ws, q, new, 0
            theta = np.concatenate([w.ravel() for w in ws])
            damping = max(damping * max(1 / 3, 1 - (2 * gain - 1) ** 3), 1e-12)  # Nielsen's update
        else:
            rejects += 1
            if rejects > MAX_REJECTS:
                stop = "no decrease along the step (rounding level or a bad start)"
                break
            damping *= 10.0  # shorter steps, turned towards the gradient
    report = {
        "samples": int(cur.n),
        "parts": len(items),
        "passes": passes,
        "stop": stop,
        "relative_loss": cur.loss / y2,
        "iterations": history,
    }
    return Network(tuple(ws), activation="relu"), basis, report
