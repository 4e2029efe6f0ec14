"""What the tensor method's learn costs after its passes, for the plan (:func:`learn_steps`): the decomposition of
the slices, the polish on the bounded sample, and the further sampling some routes ask for (residual rounds,
control rounds, the streamed refinement), each as a :class:`~relulearn.estimators.base.LearnStep` the planner
prices with this machine's rates.

The counts follow the code they stand for (:mod:`.slices`, :mod:`.finish`, :mod:`.outputs`,
:mod:`relulearn.estimators.polish`); the repetitions an exact recovery usually takes (``expected``) were
measured on trained networks (scikit-learn MLPs exported to ONNX, d = 10–100, widths 8–64, 1–10 outputs): the
affine polish took 5–12 Gauss–Newton steps of 81–226 conjugate-gradient iterations each (the spread is the
teacher's conditioning, which no plan knows: the learn of the same shape can take 3× the expected time). The
expected way is an exact first network, as at d = 30, width 64 (4 + 4 steps); where the first pass leaves the
lifted route short of exact (d = 10, width 32 at 2·10⁶ samples) the polishes stop on their stall and a residual
round follows: about 6× the expected learn, within the bound.
"""

from __future__ import annotations

from ..base import LearnStep
from ..polish.cg import DENSE_UNKNOWNS, matrix_free
from ..polish.products import BLOCK_ENTRIES
from ..polish.streamed import MAX_PASSES as REFINE_PASSES
from . import lifted
from .finish import RESIDUAL_ROUNDS, RESIDUAL_SAMPLES
from .outputs import CONTROL_ROUNDS
from .plan import outputs_route, sample_sizes
from .slices import DRAWS, LIFTED_DIRECTIONS, STARTS, SWEEPS

__all__ = [
    "learn_steps",
    "HIGHER_ORDER_COUNT",
    "GN_STEPS",
    "GN_STEPS_MOST",
    "CG_ITERATIONS",
]

#: orders of the complete route's second pass (:data:`.tensor.entry.HIGHER_ORDERS`: 3, 4, 5, 6)
HIGHER_ORDER_COUNT = 4

#: Gauss–Newton steps of a polish that ends exact (measured 5–12), and at most (``max_iter``)
GN_STEPS, GN_STEPS_MOST = 8, 30

#: conjugate-gradient iterations of a matrix-free Gauss–Newton step: measured 81–226 a step on exact recoveries
#: (the most where two units are nearly parallel, cos 0.99: an ill-conditioned normal matrix), at most
#: :data:`relulearn.estimators.polish.cg.CG_ITER`
CG_ITERATIONS = 125

#: share of the polish's samples a Gauss–Newton step takes out of its normal matrix and puts back with new patterns,
#: on average over an exact recovery's steps (the single-output polish updates its normal matrix on them).
#: Measured from 0.02–0.05 rad at d = 10–24, widths 32–96: 17–25 % of the samples' unit patterns moved in the
#: first step, 1–4 % in the second, almost none after (each moved sample counts twice: out and back in)
MOVED_ROWS = 0.05

F = 8  # bytes of a float64


def learn_steps(d: int, width: int | None = None, outputs: int | None = None, samples: int = 0) -> list[LearnStep]:
    """The learn's steps after the passes for a network of ``width`` units (None: d, the most the complete route
    reads) on inputs of dimension ``d`` with ``outputs`` outputs, from a store of ``samples`` samples."""
    m = int(outputs or 1)
    k = int(width or d)
    if outputs_route(d, outputs):
        control = LearnStep(
            "control rounds",
            0,
            CONTROL_ROUNDS,
            statistics={"output_moments": {}},
            samples=samples,
            words=f"up to {CONTROL_ROUNDS} rounds of {samples:,} fresh samples where T_2 leaves units unresolved",
        )
        return [_decomposition(m, k, "decomposition of the outputs' T_2", 1, 1 + CONTROL_ROUNDS), control] + _polish(
            d, k, m, 1
        )
    if k > d and lifted.lifted_route(d):
        # expected: the first network exact; at most every residual round, each network's polishes to their bound
        steps = [
            _decomposition(m * (1 + 2 * LIFTED_DIRECTIONS), k, "lifted decomposition", 1, 1 + RESIDUAL_ROUNDS),
            _residual_rounds(d, 0),
        ]
        return steps + _polish(d, k, m, 1, most_rounds=1 + RESIDUAL_ROUNDS) + _refinement(d, k, m, samples)
    slices = m * (HIGHER_ORDER_COUNT * max(8, 2 * k) + 1)
    if not lifted.lifted_route(d):
        return [_decomposition(slices, k, "decomposition", 1, 1)] + _polish(d, k, m, 1) + _refinement(d, k, m, samples)
    # noiseless labels the network does not fit: the units it misses are looked for in residual rounds
    steps = [_decomposition(slices, k, "decomposition", 1, 1 + RESIDUAL_ROUNDS), _residual_rounds(d, 0)]
    return steps + _polish(d, k, m, 1, most_rounds=1 + RESIDUAL_ROUNDS) + _refinement(d, k, m, samples)


def _residual_rounds(d: int, expected: int) -> LearnStep:
    """The residual rounds: each the tensors of what the network leaves on fresh samples (a pass of the
    ``hermite`` family to :func:`.tensor.lifted.max_order`), then a decomposition and the polish of the grown
    network."""
    return LearnStep(
        "residual rounds",
        expected,
        RESIDUAL_ROUNDS,
        statistics={"hermite": {"max_order": lifted.max_order(d)}},
        samples=RESIDUAL_SAMPLES,
        words=f"the tensors of what the network leaves, on {RESIDUAL_SAMPLES:,} fresh samples a round",
    )


def _decomposition(slices: int, k: int, words: str, expected: int, most: int) -> LearnStep:
    """Jennrich's draws and :data:`.slices.STARTS` ALS runs of :data:`.slices.SWEEPS` sweeps on ``slices`` k × k
    slices (:func:`relulearn.estimators.spectral.cp.decompose`), as one repetition, ``expected`` and at most
    ``most`` of them (the lifted route decomposes again in each residual round). A sweep of more than k slices
    is three GEMMs with the unfolding (at most k² rows) and k matrix–vector products with the k × k sums; of
    fewer, two products per slice and elementwise sums over them."""
    sweeps, draws = STARTS * SWEEPS, DRAWS + STARTS
    k3, k2 = float(k) ** 3, float(k) ** 2
    if slices > k:
        rows = min(slices, k * k)
        sweep_flops, stream, fresh = 4.0 * rows * k3, 2.0 * F * k3, 2.0 * F * k3
        once = 2.0 * slices * k2 * k2 if slices > k * k else 0.0  # the unfolding's QR, once per run
    else:
        sweep_flops, stream, fresh = 4.0 * slices * k3, 4.0 * F * slices * k2, 3.0 * F * slices * k2
        once = 0.0
    draw_flops = 2.0 * slices * k3 + 30.0 * k3
    return LearnStep(
        "decomposition",
        expected,
        most,
        gemm=((sweeps * sweep_flops + STARTS * once + draws * draw_flops, k),),
        stream=sweeps * stream + draws * 4.0 * F * slices * k2,
        fresh=sweeps * fresh,
        calls=sweeps * 20 + draws * 30,
        words=f"{words}: {slices:,} slices of rank {k}, {STARTS} runs of {SWEEPS} ALS sweeps",
    )


def _polish(d: int, k: int, m: int, rounds: int, most_rounds: int = 1) -> list[LearnStep]:
    """The polish on the bounded sample's training rows, ``rounds`` networks of it expected, each of
    :data:`GN_STEPS` Gauss–Newton steps (an exact recovery: the affine polish, and the polish after the
    orientation, often skipped); at most both polishes to their bound :data:`GN_STEPS_MOST` for each of
    ``most_rounds`` networks (the first and each residual round's). One output's dense polish sums its normal
    matrix once a polish and updates it on the samples whose patterns moved (:mod:`.polish.products`)."""
    n = sample_sizes(d, k, m)[0]
    p = k * (d + 1) + m * (k + 1) + m * d
    # each step's residual on every sample, with backtracking: about two forward passes
    forward = (2.0 * 2.0 * n * ((d + 1) * k + k * m), k)
    expected = rounds * GN_STEPS
    most = 2 * GN_STEPS_MOST * max(rounds, most_rounds)
    sums: list[LearnStep] = []
    if m == 1 and p <= DENSE_UNKNOWNS and not matrix_free(p, m):
        # the products with the design (right-hand side, refinement: 8ndk), the update of the normal matrix on
        # the samples that changed pattern, a Cholesky factor (p³/3)
        step_gemm: tuple[tuple[float, int], ...] = (
            (8.0 * n * (d + 1) * k + MOVED_ROWS * n * p * p + p**3 / 3.0, p),
            forward,
        )
        step_fresh = 2.0 * F * n * k
        calls = 60
        how = f"least squares on {n:,} × {p:,}"
        sums = [
            LearnStep(
                "normal matrix",
                rounds,
                2 * max(rounds, most_rounds),
                gemm=((float(n) * p * p, p),),
                fresh=F * n * p,
                calls=2 * n * p // BLOCK_ENTRIES + 10,
                words=f"the polish's normal matrix ({n:,} × {p:,} design), summed once a polish",
            )
        ]
    else:
        cg = CG_ITERATIONS * (4.0 * n * (d + 1) * k + 4.0 * n * k * m)
        step_gemm = ((cg, k), forward)
        step_fresh = CG_ITERATIONS * 6.0 * F * n * k
        calls = CG_ITERATIONS * 40
        how = f"conjugate gradients on {n:,} samples"
    return sums + [
        LearnStep(
            "polish",
            expected,
            most,
            gemm=step_gemm,
            fresh=step_fresh,
            calls=calls,
            words=f"Gauss–Newton steps of {p:,} unknowns ({how})",
        )
    ]


def _refinement(d: int, k: int, m: int, samples: int) -> list[LearnStep]:
    """One output: the streamed refinement, run only when the polish is not exact on its validation samples, of
    up to :data:`relulearn.estimators.polish.streamed.MAX_PASSES` passes over the store's samples."""
    if m != 1 or samples <= 0:
        return []
    return [
        LearnStep(
            "refinement",
            0,
            REFINE_PASSES,
            statistics={},
            samples=samples,
            words=f"a streamed refinement, unless the polish is exact: up to {REFINE_PASSES} passes of {samples:,}",
        )
    ]
