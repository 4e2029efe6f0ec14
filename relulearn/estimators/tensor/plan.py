"""What the tensor method (:mod:`.tensor.entry`) can learn at an input dimension, checked before any work: the widths
it identifies, the route of several outputs at large d, the refusal of a width the noise floor does not support
(with the samples that would), and the bounded sample its polish takes."""

from __future__ import annotations

import math

from ..base import TooFewSamplesError
from ..polish.cg import matrix_free
from ..spectral import stage as spectral
from . import lifted

__all__ = ["OUTPUTS_ROUTE_MIN_D", "WidthError", "identifiable_width", "check_width", "outputs_route", "sample_sizes"]

#: from this input dimension on, a network with several outputs is learned from the outputs' second moments alone
#: (:func:`outputs_route`)
OUTPUTS_ROUTE_MIN_D = 64


class WidthError(ValueError):
    """A width the stored orders cannot identify (the message names the limit and what would lift it)."""


def identifiable_width(d: int) -> int:
    """The widest network this method separates at input dimension ``d``: ``d(d+1)/2`` where the full tensor
    ``T_4`` is affordable (:func:`.tensor.lifted.lifted_route`), else ``d``."""
    return lifted.lifted_dimension(d) if lifted.lifted_route(d) else d


def check_width(width: int | None, d: int) -> None:
    """Refuse, before any work, a width past what this method identifies."""
    limit = identifiable_width(d)
    if width is None or width <= limit:
        return
    if limit == d:
        raise WidthError(
            f"--method tensor separates at most d = {d} units at this input dimension (width {width} asked): wider "
            f"networks need the full Hermite tensor T_4 flattened on symmetric matrices, and at d = {d} it has "
            f"{math.comb(d + 3, 4):,} entries per sample, past the {lifted.ORDER_ENTRIES:,} this version estimates; "
            "use a width ≤ d"
        )
    raise WidthError(
        f"--method tensor separates at most d(d+1)/2 = {limit} units at d = {d} (width {width} asked): the full "
        "tensors of orders 4–6 flattened on symmetric matrices hold at most that many rank-one terms apart; orders "
        f"6 and 8 flattened on symmetric 3-tensors would lift the limit to d(d+1)(d+2)/6 = "
        f"{d * (d + 1) * (d + 2) // 6}, which this version does not estimate"
    )


def outputs_route(d: int, outputs: int | None) -> bool:
    """Whether ``fit`` learns from the outputs' second moments alone (``output_moments``: ``T_2`` and ``T_1`` of
    each output, one pass, no higher orders).

    With ``m ≥ 2`` outputs the ``m`` slices ``T_2[j] = Σ_i A_ji φ(β_i) û_i û_iᵀ`` are a CP tensor whose third
    mode is the outputs: Jennrich's algorithm separates every pair of units whose output profiles ``A_·i`` are
    not parallel, whatever ``k ≤ d`` (Kruskal; rank ``A = k`` is not needed), and ``T_1`` gives each unit's offset
    and orientation. That costs ``m d²/2`` per sample where the contracted route's two passes cost about
    ``m (9 d² + 8 k³)`` (the second in the k-dimensional subspace): past :data:`OUTPUTS_ROUTE_MIN_D` (d = 784,
    k = 128, m = 10: 3·10⁶ against 2·10⁸ multiply-adds per sample) it is the route that finishes. Below it, and
    for one output, the contracted orders (and the overcomplete route, for widths past d) are used."""
    return outputs is not None and outputs >= 2 and d >= OUTPUTS_ROUTE_MIN_D


#: training rows per unknown of a single-output polish (:func:`sample_sizes`)
SINGLE_ROWS = 10


def sample_sizes(d: int, k: int, m: int) -> tuple[int, int]:
    """Training and validation samples of the bounded sample: polish with a free affine part solves for
    ``p = k(d+1) + m(k+1) + m·d`` unknowns. Past :func:`.polish.cg.matrix_free` the polish is matrix-free,
    each sample gives m equations and each of its iterations costs a pass over the samples: ``8p/m`` of them
    (``40p`` would be 4·10⁶ rows of 784 inputs for a width-128 network with 10 outputs). One output's least
    squares on the products sums a normal matrix of ``n p²`` flops: :data:`SINGLE_ROWS` per unknown (its
    parameters agree with the float64 teacher's as well as on four times as many: at d = 24, k = 96 on a float32
    teacher, 4.0·10⁻⁸ against 3.7·10⁻⁸, the float32 weights themselves being 3.6·10⁻⁸ off). Several outputs
    polished densely take ``40p``. Units active (or inactive) on a small fraction of inputs get further rows from
    :func:`.tensor.coverage.cover`."""
    unknowns = k * (d + 1) + m * (k + 1) + m * d
    if matrix_free(unknowns, m):
        return max(20_000, 8 * unknowns // m), max(10_000, 2 * unknowns // m)
    return max(20_000, (SINGLE_ROWS if m == 1 else 40) * unknowns), max(10_000, 10 * unknowns)


#: the count of samples a refusal asks for is this many times the one at which the weakest unit wanted would
#: just reach the noise floor
SAMPLES_MARGIN = 2.0


def _too_few(sub: spectral.Subspace, width: int, n: int) -> TooFewSamplesError:
    """The refusal of a width the first pass's noise floor does not support, with the samples that would: the
    stack's singular values grow as √n against the floor, so the width-th reaches the threshold at
    ``n·(threshold/s)²``."""
    s = float(sub.singular_values[width - 1]) if len(sub.singular_values) >= width else 0.0
    ratio = s / sub.threshold if s > 0 else 0.0
    need = f"about {int(math.ceil(SAMPLES_MARGIN * n / ratio**2)):,}" if ratio > 0.05 else "far more than"
    return TooFewSamplesError(
        f"--width {width} asks for more units than the noise floor supports at {n:,} samples: {sub.rank} directions "
        f"stand above it (the {width}-th is at {ratio:.2f} of the threshold). Estimate with {need} samples "
        f"(`relulearn estimate CONFIG --store STORE --samples N`, then learn again), or leave out --width to learn the "
        f"{sub.rank} units the floor supports"
    )


def _samples_needed(sub: spectral.Subspace, width: int, n: int) -> float:
    """Samples at which the ``width``-th direction would clear the floor (singular values grow as √n)."""
    s = float(sub.singular_values[width - 1]) if len(sub.singular_values) >= width else 0.0
    return n * (sub.threshold / s) ** 2 if s > 0 else math.inf
