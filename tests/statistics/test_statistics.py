"""Every statistic family against its closed form for planted teachers (docs/design.md §3).

For ``y = Σ_i λ_i relu(<u_i, x>) + σ ε`` with unit ``u_i`` and ``x ~ N(0, I_d)`` the
population value of every stored estimand is known in closed form (or, for the filtered
moments of a two-neuron net, by a quadrature accurate to ~1e-11, far below any standard
error here). The tests check

1. each family's estimate is within 4 reported standard errors of the population value,
   entry by entry (and that each configuration has entries far from zero, so a wrong
   sign or factor could not pass);
2. the reported standard errors are calibrated: over 30 independent seeds, the spread of
   the estimates matches the reported SE, and the standardized residuals
   ``(estimate − truth) / SE`` have the second moment of a t distribution;
3. a run on a real two-worker LocalCluster stores the same bits as the in-process run;
4. the filtered statistic's τ grid is the pilot's quantiles, and ``P[|y| > τ] ≈ 1 − q``;
5. a vector-output teacher file with ``source.output: 1`` gives the statistics of the
   one-output teacher made of its second output row.

All runs are seeded; the file runs in well under a minute on two cores.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
from closeness import Z_MAX, assert_powerful, check_within
from scipy import special, stats

from relulearn import hermite, open_store
from relulearn.network import Network
from relulearn.pipeline.families import build_statistics
from relulearn.pipeline.run import estimate
from relulearn.pipeline.sources import make_source, pilot_batches
from relulearn.pipeline.stats.partial import accumulate_chunks

from conftest import make_config

SQRT2PI = math.sqrt(2.0 * math.pi)


# ===================================================================== closed forms


def teacher_units(source) -> tuple[np.ndarray, np.ndarray]:
    """``(λ, U)`` with unit rows ``U`` such that the source's label is ``Σ λ_i relu(<u_i, x>)``.

    Reads the actual network of the source (one hidden ReLU layer, no biases); a non-unit
    row ``w_i`` with output weight ``a_i`` is the unit ``w_i/|w_i|`` with ``λ_i = a_i |w_i|``.
    """
    net = source.network
    assert net.depth == 1 and net.activation == "relu" and net.biases is None
    w0, w1 = net.weights
    a = w1[source.output if source.output is not None else 0]
    norms = np.linalg.norm(w0, axis=1)
    return a * norms, w0 / norms[:, None]


def kappa(rho: np.ndarray) -> np.ndarray:
    """``E[relu(z1) relu(z2)]`` for standard normals with correlation ``rho``."""
    rho = np.clip(rho, -1.0, 1.0)
    return (np.sqrt(1.0 - rho**2) + rho * (np.pi - np.arccos(rho))) / (2.0 * np.pi)


def c(l: int) -> float:
    """``c_l = E[relu(z) He_l(z)]``, written out independently of relulearn.hermite."""
    if l == 0:
        return 1.0 / SQRT2PI
    if l == 1:
        return 0.5
    if (l - 2) % 2:
        return 0.0
    n = l - 2  # He_n(0) = (-1)^{n/2} (n-1)!!
    return (-1) ** (n // 2) * float(np.prod(np.arange(n - 1, 0, -2), dtype=float)) / SQRT2PI


def basic_truth(lam, U, noise_std) -> dict[str, np.ndarray]:
    d = U.shape[1]
    return {
        "y": np.asarray(c(0) * lam.sum()),
        "yy": np.asarray(lam @ kappa(U @ U.T) @ lam + noise_std**2),
        "x": np.zeros(d),
        "xx": np.eye(d),
        "yx": c(1) * lam @ U,
    }


def hermite_truth(lam, U, l: int, index: np.ndarray | None) -> np.ndarray:
    """Packed ``T_l = c_l Σ λ_i u_i^{⊗l}`` at the stored index table (rows = multi-indices)."""
    if l == 0:
        return np.array([c(0) * lam.sum()])
    return c(l) * (lam[:, None] * np.prod(U[:, index], axis=2)).sum(axis=0)


def contracted_truth(lam, U, directions, pair_order, pair_direction) -> dict[str, np.ndarray]:
    """``M``, ``v``, ``s`` for every (order, direction) pair, from the stored pair tables."""
    M, v, s = [], [], []
    for l, b in zip(pair_order, pair_direction):
        ug = U @ directions[b]  # <u_i, g>
        M.append(c(l) * np.einsum("i,ij,ik->jk", lam * ug ** (l - 2), U, U))
        v.append(c(l) * (lam * ug ** (l - 1)) @ U)
        s.append(c(l) * (lam * ug**l).sum())
    return {"M": np.array(M), "v": np.array(v), "s": np.array(s)}


@functools.cache
def _leggauss(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(n)


def _gauss_legendre(pieces, n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of Gauss–Legendre rules on consecutive pieces ``[(a, b), ...]``."""
    t, w = _leggauss(n)
    nodes = [(a + b) / 2 + (b - a) / 2 * t for a, b in pieces if b > a]
    weights = [(b - a) / 2 * w for a, b in pieces if b > a]
    return np.concatenate(nodes), np.concatenate(weights)


def _phi(z):
    return np.exp(-0.5 * z**2) / SQRT2PI


def _zphi(z):
    return np.where(np.isfinite(z), z * _phi(np.where(np.isfinite(z), z, 0.0)), 0.0)


def filtered_truth(lam, U, tau, noise_std: float = 0.0, span: float = 12.0, nodes: int = 300) -> dict[str, np.ndarray]:
    """``P[|y| > τ]`` and ``M_τ = E[1{|y|>τ}(x xᵀ − I)]`` for one or two orthonormal units.

    ``y`` depends on ``x`` only through ``z = Uᵀx``, so ``M_τ = Uᵀ M2 U`` with the 2×2
    ``M2 = E[1{|y|>τ}(z zᵀ − I)]`` on the plane (the orthogonal part is exactly zero).

    Noiseless: the indicator is integrated analytically in ``z2`` (for fixed ``z1``,
    ``{|y| > τ}`` is a union of intervals of ``z2`` with closed-form Gaussian integrals of
    ``1, z, z² − 1``), then ``z1`` by Gauss–Legendre on pieces cut at its kinks
    (``z1 = 0`` and ``|λ1| z1 = τ``). Noisy: ``P[|y|>τ | z]`` is smooth except at the
    axes, so a tensor Gauss–Legendre rule on the four quadrants is accurate.
    """
    lam = np.asarray(lam, dtype=float)
    U = np.asarray(U, dtype=float)
    assert U.shape[0] in (1, 2) and np.allclose(U @ U.T, np.eye(U.shape[0]), atol=1e-12)
    lam2 = np.append(lam, 0.0)[:2] if len(lam) == 1 else lam
    l1, l2 = lam2
    probs, mats = [], []
    for t in np.atleast_1d(tau):
        if noise_std > 0:
            z, w = _gauss_legendre([(-span, 0.0), (0.0, span)], nodes)
            z1, z2 = z[:, None], z[None, :]
            ww = (w * _phi(z))[:, None] * (w * _phi(z))[None, :]
            f = l1 * np.maximum(z1, 0) + l2 * np.maximum(z2, 0)
            p = special.ndtr((f - t) / noise_std) + special.ndtr((-t - f) / noise_std)
            pw = p * ww
            m2 = np.array(
                [[np.sum(pw * (z1**2 - 1)), np.sum(pw * z1 * z2)], [np.sum(pw * z1 * z2), np.sum(pw * (z2**2 - 1))]]
            )
            probs.append(pw.sum())
        else:
            cuts = [-span, 0.0]
            if l1 != 0 and t / abs(l1) < span:
                cuts.append(t / abs(l1))
            cuts.append(span)
            z1, w1 = _gauss_legendre(list(zip(cuts[:-1], cuts[1:])), nodes)
            a = l1 * np.maximum(z1, 0.0)
            far = np.abs(a) > t
            intervals = [((np.full_like(z1, -np.inf), np.zeros_like(z1)), far)]  # z2 <= 0: y = a
            if l2 == 0:
                intervals.append(((np.zeros_like(z1), np.full_like(z1, np.inf)), far))
            else:
                r_hi, r_lo = (t - a) / l2, (-t - a) / l2  # a + l2 z2 = ±τ
                if l2 < 0:
                    r_hi, r_lo = r_lo, r_hi
                # with l2 > 0: y > τ ⟺ z2 > r_hi, y < −τ ⟺ z2 < r_lo (mirrored for l2 < 0)
                intervals.append(((np.maximum(r_hi, 0.0), np.full_like(z1, np.inf)), np.ones_like(far)))
                intervals.append(((np.zeros_like(z1), r_lo), r_lo > 0))
            g0 = g1 = g2 = 0.0
            for (lo, hi), ok in intervals:
                g0 = g0 + ok * (special.ndtr(hi) - special.ndtr(lo))
                g1 = g1 + ok * (_phi(lo) - _phi(hi))
                g2 = g2 + ok * (_zphi(lo) - _zphi(hi))
            wz = w1 * _phi(z1)
            m2 = np.array([[wz @ ((z1**2 - 1) * g0), wz @ (z1 * g1)], [wz @ (z1 * g1), wz @ g2]])
            probs.append(wz @ g0)
        B = U.T if U.shape[0] == 2 else np.stack([U[0], np.zeros_like(U[0])], axis=1)
        mats.append(B @ m2 @ B.T)
    return {"prob": np.array(probs), "M": np.array(mats)}


# ========================================================================= helpers


def run_in_process(cfg, path: Path):
    estimate(cfg, str(path), client=None, progress=None)
    return open_store(str(path))


def _outer_power(u, l):
    out = np.ones(())
    for _ in range(l):
        out = np.multiply.outer(out, u)
    return out


def orthonormal_rows(rng, k: int, d: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((d, k)))
    return q.T.copy()


def unit_rows(rng, k: int, d: int) -> np.ndarray:
    g = rng.standard_normal((k, d))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def run_config(seed, samples, chunk_size, d, teacher, statistics, noise_std=0.0, **source):
    return make_config(
        seed=seed,
        samples=samples,
        chunk_size=chunk_size,
        source={"d": d, "teacher": teacher, "noise_std": noise_std, **source},
        statistics=statistics,
        run={"chunks_per_block": 10, "commit_interval": 3600},
    )


# =================================================== 1. estimates vs closed forms

RNG = np.random.default_rng(20240611)
D_NOISY = 5
U_NOISY = unit_rows(RNG, 3, D_NOISY)  # generic (correlated) unit rows
G_EXTRA = unit_rows(RNG, 2, D_NOISY)
LAM_NOISY = [1.0, -0.7, 0.5]
NOISE = 0.5


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    """Width-3 teacher with correlated units and label noise: basic, hermite, contracted."""
    directions = np.vstack([U_NOISY, G_EXTRA])  # the teacher's own units, and two random ones
    cfg = run_config(
        seed=101,
        samples=200_000,
        chunk_size=2_000,
        d=D_NOISY,
        noise_std=NOISE,
        teacher={"kind": "one_hidden_relu", "width": 3, "weights": U_NOISY.tolist(), "output_weights": LAM_NOISY},
        statistics={
            "basic": {},
            "hermite": {"max_order": 4},
            "contracted": {"orders": [2, 3, 4, 6], "directions": directions.tolist()},
        },
    )
    run = run_in_process(cfg, tmp_path_factory.mktemp("noisy") / "store")
    assert run.meta["chunks"] == 100
    return cfg, run


def test_basic_moments_match_closed_form(noisy_run):
    cfg, run = noisy_run
    lam, U = teacher_units(make_source(cfg))
    truth = basic_truth(lam, U, NOISE)
    for name, t in truth.items():
        mean, se = run.estimate("basic", name)
        check_within(f"basic.{name}", mean, se, t)
    assert_powerful("basic.yx", truth["yx"], run.estimate("basic", "yx")[1])
    assert_powerful("basic.yy", truth["yy"], run.estimate("basic", "yy")[1])


def test_hermite_tensors_match_closed_form(noisy_run):
    cfg, run = noisy_run
    lam, U = teacher_units(make_source(cfg))
    arrays = run.arrays("hermite")
    d = cfg.source.d
    for l in range(12):  # the coefficients written out here are the library's
        assert hermite.relu_hermite_coefficient(l) == pytest.approx(c(l), rel=1e-15, abs=1e-300), l
    for l in range(5):
        index = arrays[f"index{l}"] if l else None
        if l:
            np.testing.assert_array_equal(index, hermite.unique_indices(d, l))
        truth = hermite_truth(lam, U, l, index)
        # the same truth through the full tensor and hermite.pack (the stored packing)
        full = c(l) * sum(li * _outer_power(u, l) for li, u in zip(lam, U))
        np.testing.assert_allclose(hermite.pack(full), truth, rtol=1e-12, atol=1e-15)
        mean, se = run.estimate("hermite", f"T{l}")
        check_within(f"hermite.T{l}", mean, se, truth)
        if l != 3:
            assert_powerful(f"hermite.T{l}", truth, se)
    # T1 is E[y x] of the basic statistic, computed another way: same sums up to rounding
    np.testing.assert_allclose(run.estimate("hermite", "T1")[0], run.estimate("basic", "yx")[0], rtol=1e-10)


def test_contracted_moments_match_closed_form(noisy_run):
    cfg, run = noisy_run
    lam, U = teacher_units(make_source(cfg))
    arrays = run.arrays("contracted")
    G = arrays["direction"]
    directions = np.vstack([U_NOISY, G_EXTRA])
    np.testing.assert_allclose(G, directions / np.linalg.norm(directions, axis=1, keepdims=True), rtol=1e-14)
    orders = [2, 3, 4, 6]
    # order-major pairs: p = a·G + b ↔ (orders[a], directions[b])
    np.testing.assert_array_equal(arrays["pair_order"], np.repeat(orders, len(G)))
    np.testing.assert_array_equal(arrays["pair_direction"], np.tile(np.arange(len(G)), len(orders)))
    truth = contracted_truth(lam, U, G, arrays["pair_order"], arrays["pair_direction"])
    for name in ("M", "v", "s"):
        mean, se = run.estimate("contracted", name)
        check_within(f"contracted.{name}", mean, se, truth[name])
        assert_powerful(f"contracted.{name}", truth[name], se)
    # order 6 along a teacher unit sees that unit: M_6^{u_1} ≈ c_6 λ_1 u_1 u_1ᵀ + ...
    mean, se = run.estimate("contracted", "M")
    p = 3 * len(G) + 0
    assert_powerful("contracted.M[l=6, g=u1]", truth["M"][p], se[p], at_least=4.0)  # a sign error: 8 SE


# ------------------------------------------------------------------ filtered

TAU_GRID = [0.0, 0.3, 1.0, 2.5]


@pytest.mark.parametrize("lam", [1.3, -1.3], ids=["positive", "negative"])
def test_filtered_single_neuron_closed_form(tmp_path, lam):
    """``P[|y|>τ] = Q(t)``, ``M_τ = t φ(t) u uᵀ`` with ``t = τ/|λ|`` (the sign of λ is irrelevant)."""
    rng = np.random.default_rng(7)
    u = unit_rows(rng, 1, 5)
    cfg = run_config(
        seed=202,
        samples=200_000,
        chunk_size=2_000,
        d=5,
        teacher={"kind": "one_hidden_relu", "width": 1, "weights": u.tolist(), "output_weights": [lam]},
        statistics={"filtered": {"thresholds": TAU_GRID}},
    )
    run = run_in_process(cfg, tmp_path / "store")
    np.testing.assert_array_equal(run.arrays("filtered")["tau"], TAU_GRID)
    lam_t, U = teacher_units(make_source(cfg))
    t = np.asarray(TAU_GRID) / abs(lam)
    closed = {"prob": special.ndtr(-t), "M": (t * _phi(t))[:, None, None] * np.outer(U[0], U[0])}
    quad = filtered_truth(lam_t, U, TAU_GRID)  # the helper agrees with the closed form
    np.testing.assert_allclose(quad["prob"], closed["prob"], rtol=0, atol=1e-13)
    np.testing.assert_allclose(quad["M"], closed["M"], rtol=0, atol=1e-13)
    for name in ("prob", "M"):
        mean, se = run.estimate("filtered", name)
        check_within(f"filtered.{name}", mean, se, closed[name])
        assert_powerful(f"filtered.{name}", closed[name], se)


U_TWO = orthonormal_rows(np.random.default_rng(11), 2, 6)
LAM_TWO = [1.0, -0.8]


def test_filtered_two_orthogonal_neurons_by_quadrature(tmp_path):
    cfg = run_config(
        seed=303,
        samples=200_000,
        chunk_size=2_000,
        d=6,
        teacher={"kind": "one_hidden_relu", "width": 2, "weights": U_TWO.tolist(), "output_weights": LAM_TWO},
        statistics={"filtered": {"thresholds": [0.0, 0.2, 0.6, 1.5]}},
    )
    run = run_in_process(cfg, tmp_path / "store")
    lam, U = teacher_units(make_source(cfg))
    truth = filtered_truth(lam, U, run.arrays("filtered")["tau"])
    np.testing.assert_allclose(truth["prob"][0], 0.75, rtol=1e-12)  # y = 0 exactly when z1, z2 <= 0
    for name in ("prob", "M"):
        mean, se = run.estimate("filtered", name)
        check_within(f"filtered.{name}", mean, se, truth[name])
        assert_powerful(f"filtered.{name}", truth[name], se)


def test_filtered_quadrature_is_converged():
    """The two-neuron quadrature (used as the truth) is accurate far below any SE here: it does
    not move when its rule is refined, and integrating analytically in the other variable
    (neurons swapped) gives the same values."""
    tau = [0.0, 0.2, 0.6, 1.5]
    for noise in (0.0, 0.25):
        a = filtered_truth(LAM_TWO, U_TWO, tau, noise_std=noise)
        b = filtered_truth(LAM_TWO, U_TWO, tau, noise_std=noise, span=14.0, nodes=450)
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-11)
    a = filtered_truth(LAM_TWO, U_TWO, tau)
    b = filtered_truth(LAM_TWO[::-1], U_TWO[::-1], tau)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-12)


def test_filtered_has_no_mass_outside_the_span(tmp_path):
    """``M_τ = Π_V M_τ Π_V`` for a generic width-3 teacher (no closed form): every entry that
    touches V^⊥ is zero within 4 SE. The units are generic inside V = span(e1, e2, e3), so that
    the blocks touching V^⊥ are plain entries of the stored matrix (x is isotropic, so this
    loses no generality)."""
    rng = np.random.default_rng(5)
    d, k = 6, 3
    U = np.hstack([unit_rows(rng, k, k), np.zeros((k, d - k))])
    cfg = run_config(
        seed=404,
        samples=200_000,
        chunk_size=2_000,
        d=d,
        noise_std=0.0,
        teacher={"kind": "one_hidden_relu", "width": k, "weights": U.tolist(), "output_weights": [1.0, -0.6, 0.8]},
        statistics={"filtered": {"thresholds": [0.0, 0.3, 0.9]}},
    )
    run = run_in_process(cfg, tmp_path / "store")
    mean, se = run.estimate("filtered", "M")
    outside = np.ones((d, d), dtype=bool)
    outside[:k, :k] = False
    check_within("filtered.M off V×V", mean[:, outside], se[:, outside], np.zeros_like(mean[:, outside]))
    assert_powerful("filtered.M on V×V", mean[:, :k, :k], se[:, :k, :k], at_least=20.0)


# ================================================== 2. standard-error calibration

CAL_SEEDS = range(5000, 5030)  # K = 30 independent runs
CAL_CHUNKS, CAL_CHUNK_SIZE = 40, 1_000
CAL_D = 4
U_CAL = orthonormal_rows(np.random.default_rng(99), 2, CAL_D)
G_CAL = unit_rows(np.random.default_rng(98), 1, CAL_D)
LAM_CAL = [1.0, -0.8]
NOISE_CAL = 0.25
TAU_CAL = [0.0, 0.4, 1.2]


def calibration_config(seed: int):
    return run_config(
        seed=seed,
        samples=CAL_CHUNKS * CAL_CHUNK_SIZE,
        chunk_size=CAL_CHUNK_SIZE,
        d=CAL_D,
        noise_std=NOISE_CAL,
        teacher={"kind": "one_hidden_relu", "width": 2, "weights": U_CAL.tolist(), "output_weights": LAM_CAL},
        statistics={
            "basic": {},
            "hermite": {"max_order": 4},
            "contracted": {"orders": [2, 4], "directions": np.vstack([U_CAL, G_CAL]).tolist()},
            "filtered": {"thresholds": TAU_CAL},
        },  # fixed τ and directions: the same estimands for every seed
    )


def population(stats_list, source, noise_std) -> dict[str, dict[str, np.ndarray]]:
    """The population value of every estimand of every statistic, in the statistics' own layout."""
    lam, U = teacher_units(source)
    out = {}
    for s in stats_list:
        if s.name == "basic":
            out["basic"] = basic_truth(lam, U, noise_std)
        elif s.name == "hermite":
            idx = s.coords()
            out["hermite"] = {
                f"T{l}": hermite_truth(lam, U, l, idx[f"index{l}"][1] if l else None) for l in range(s.max_order + 1)
            }
        elif s.name == "contracted":
            co = s.coords()
            out["contracted"] = contracted_truth(lam, U, s.directions, co["pair_order"][1], co["pair_direction"][1])
        elif s.name == "filtered":
            out["filtered"] = filtered_truth(lam, U, s.tau, noise_std=noise_std)
    return out


@pytest.fixture(scope="module")
def calibration_runs():
    """K independent seeds of the same setup, accumulated and finalized as a run does."""
    cfg0 = calibration_config(CAL_SEEDS[0])
    source = make_source(cfg0)
    stats_list = build_statistics(cfg0, source)
    means: dict[tuple[str, str], list] = {}
    ses: dict[tuple[str, str], list] = {}
    for seed in CAL_SEEDS:
        part = accumulate_chunks(stats_list, source, seed, CAL_CHUNK_SIZE, 0, CAL_CHUNKS)
        for s in stats_list:
            for name, est in s.finalize(part.sums[s.name], part.sumsq[s.name], CAL_CHUNKS, CAL_CHUNK_SIZE).items():
                means.setdefault((s.name, name), []).append(est.mean)
                ses.setdefault((s.name, name), []).append(est.se)
    truth = population(stats_list, source, NOISE_CAL)
    return ({k: np.array(v) for k, v in means.items()}, {k: np.array(v) for k, v in ses.items()}, truth)


FAMILIES = ["basic", "hermite", "contracted", "filtered"]


def _family(means, ses, truth, family):
    """A family's estimands as (seeds, entries) arrays.

    Entries that are exact constants cannot be calibrated: the only one here is
    ``P[|y| > 0] = 1`` (the label noise makes ``y ≠ 0`` surely), whose every chunk gives
    exactly 1 and whose SE is exactly 0. Such entries must equal the truth exactly in every
    seed, and are left out of the calibration.
    """
    keys = [k for k in means if k[0] == family]
    m = np.concatenate([means[k].reshape(len(CAL_SEEDS), -1) for k in keys], axis=1)
    s = np.concatenate([ses[k].reshape(len(CAL_SEEDS), -1) for k in keys], axis=1)
    t = np.concatenate([np.asarray(truth[family][k[1]]).reshape(-1) for k in keys])
    const = (s == 0).all(axis=0)
    assert not ((s == 0).any(axis=0) & ~const).any(), f"{family}: an SE is zero in some seeds only"
    np.testing.assert_array_equal(m[:, const], 1.0)  # every chunk: the exact constant
    np.testing.assert_allclose(t[const], 1.0, rtol=0, atol=1e-12)  # the quadrature agrees
    assert const.sum() == (1 if family == "filtered" else 0)
    return m[:, ~const], s[:, ~const], t[~const]


@pytest.mark.parametrize("family", FAMILIES)
def test_standard_error_matches_spread_over_seeds(calibration_runs, family):
    """The reported SE is the sd of the estimate: sd over K = 30 seeds vs RMS reported SE.

    For one entry, ``(K−1) s²/σ²`` is χ²(K−1) (the estimate is a mean of 40 000 samples,
    normal to good accuracy), and the RMS of 30 reported SEs is σ within a few per cent.
    Per entry, the ratio lies outside [0.5, 1.6] with probability ≈ 2e-5 (≤ 3e-3 for the
    ≤ 126 entries of a family, by the union bound). The median over a family's entries
    leaves [0.6, 1.4] only if half the entries do, which by Markov's inequality on their
    count has probability ≤ 2 × 2.1e-3 whatever the correlation between entries.
    """
    means, ses, truth = calibration_runs
    m, s, _ = _family(means, ses, truth, family)
    K = len(CAL_SEEDS)
    ratio = m.std(axis=0, ddof=1) / np.sqrt((s**2).mean(axis=0))
    chi2 = stats.chi2(K - 1)
    assert chi2.cdf((K - 1) * 0.5**2) + chi2.sf((K - 1) * 1.6**2) < 3e-5  # the bands above
    assert chi2.cdf((K - 1) * 0.6**2) + chi2.sf((K - 1) * 1.4**2) < 2.5e-3
    assert 0.6 <= np.median(ratio) <= 1.4, f"{family}: median sd/SE ratio {np.median(ratio):.3f}"
    assert np.all((ratio >= 0.5) & (ratio <= 1.6)), (
        f"{family}: sd/SE ratios out of [0.5, 1.6]: {np.sort(ratio[(ratio < 0.5) | (ratio > 1.6)])}"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_standardized_residuals_have_unit_variance(calibration_runs, family):
    """``r = (estimate − truth) / SE`` over seeds and entries has ``E[r²] = (n−1)/(n−3)``
    (t with n − 1 = 39 degrees of freedom: the SE comes from n = 40 chunk means).

    Entries of one seed are correlated, seeds are independent: the per-seed average
    ``R_s = mean_e r²`` are 30 iid values, so a t test on them is exact in the limit; a
    second bound makes sure that test is sharp enough to matter: with the SE of mean R below
    12 % of E[R], an SE 20 % too small (E[R] × 1.56) or 35 % too large (E[R] × 0.55) fails.
    (Entries of a family are strongly correlated, so R is far noisier than a χ² bound for
    independent residuals would say; this is why the test is on seeds, not on entries.)
    """
    means, ses, truth = calibration_runs
    m, s, t = _family(means, ses, truth, family)
    r2 = ((m - t) / s) ** 2
    R = r2.mean(axis=1)
    expected = (CAL_CHUNKS - 1) / (CAL_CHUNKS - 3)
    err = R.std(ddof=1) / np.sqrt(len(R))
    assert err < 0.12 * expected, f"{family}: the pooled test is too weak (SE of mean r² is {err:.3f})"
    assert abs(R.mean() - expected) <= Z_MAX * err, (
        f"{family}: mean squared standardized residual {R.mean():.3f} ± {err:.3f}, expected {expected:.3f}"
    )
    # and no single entry is systematically off (a bias would show as a mean residual):
    # a t statistic over the 30 seeds, |t(29)| > 5 with probability 2.5e-5 per entry
    r = (m - t) / s
    tstat = r.mean(axis=0) / (r.std(axis=0, ddof=1) / np.sqrt(len(R)))
    assert np.all(np.abs(tstat) <= 5.0), f"{family}: entries with a systematic bias, t = {tstat[np.abs(tstat) > 5]}"


# ============================================ 3. a real cluster stores the same bits


def _all_arrays(run) -> dict[str, np.ndarray]:
    out = {f"{stat}/{k}": v for stat in run.statistics for k, v in run.arrays(stat).items()}
    out["ledger"] = run.ledger()
    return out


def test_cluster_run_is_bitwise_equal_to_in_process_run(tmp_path, client):
    # 30 chunks in 15 blocks, all four statistics (τ from a pilot, a random direction bank);
    # one commit at the end (the bits do not depend on commits: tests/pipeline/test_resume.py)
    cfg = make_config(seed=17, samples=60_000, chunk_size=2_000, run={"chunks_per_block": 2, "commit_interval": 3600})
    assert set(cfg.statistics.enabled()) == {"basic", "hermite", "contracted", "filtered"}
    local = run_in_process(cfg, tmp_path / "local")
    estimate(cfg, str(tmp_path / "cluster"), client=client, progress=None)
    remote = open_store(str(tmp_path / "cluster"))
    assert remote.statistics == local.statistics
    a, b = _all_arrays(local), _all_arrays(remote)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), f"{k} differs between the cluster and the in-process run"
    assert remote.samples == local.samples == 60_000


# ================================== 4. the τ grid of the filtered statistic from quantiles

QUANTILES = [0.05, 0.1, 0.5, 0.8, 0.95]
PILOT = 400_000


def test_filtered_quantile_grid(tmp_path):
    """τ = the pilot's quantiles of |y|; ``P[|y| > τ] ≈ 1 − q``; ``M_τ`` and ``P`` at the
    recorded τ match the population.

    The two-neuron net ``y = relu(z1) − 0.8 relu(z2)`` has an atom ``P[y = 0] = 1/4``: the
    0.05- and 0.1-quantiles of |y| are both exactly 0 (a repeated τ), and there
    ``P[|y| > 0] = 3/4``, not 0.95 or 0.9 — the strict inequality drops the atom. Above the atom,
    the recorded τ is the pilot's estimate of the quantile, so ``P[|y| > τ]`` differs from
    ``1 − q`` by the pilot's sampling error (sd ``sqrt(q(1−q)/pilot)``) on top of the run's own SE.
    """
    cfg = run_config(
        seed=505,
        samples=200_000,
        chunk_size=2_000,
        d=6,
        teacher={"kind": "one_hidden_relu", "width": 2, "weights": U_TWO.tolist(), "output_weights": LAM_TWO},
        statistics={"filtered": {"quantiles": QUANTILES, "pilot_samples": PILOT}},
    )
    run = run_in_process(cfg, tmp_path / "store")
    arrays = run.arrays("filtered")
    source = make_source(cfg)
    absy = np.concatenate([np.abs(y) for _, y in pilot_batches(source, cfg.seed, PILOT)])
    assert absy.size == PILOT
    np.testing.assert_array_equal(arrays["quantile"], QUANTILES)
    np.testing.assert_array_equal(arrays["tau"], np.quantile(absy, QUANTILES))
    tau = arrays["tau"]
    assert tau[0] == tau[1] == 0.0 and np.all(np.diff(tau[1:]) > 0)

    lam, U = teacher_units(source)
    truth = filtered_truth(lam, U, tau)
    for name in ("prob", "M"):
        mean, se = run.estimate("filtered", name)
        check_within(f"filtered.{name}", mean, se, truth[name])
    prob, prob_se = run.estimate("filtered", "prob")
    q = np.asarray(QUANTILES)
    pilot_sd = np.sqrt(q * (1 - q) / PILOT)
    above = q > 0.25
    # the recorded τ is the q-quantile of |y| up to the pilot's error ...
    assert np.all(np.abs(truth["prob"][above] - (1 - q[above])) <= Z_MAX * pilot_sd[above])
    # ... so the estimate of P[|y| > τ] is 1 − q within 4 (combined) SE
    assert np.all(np.abs(prob[above] - (1 - q[above])) <= Z_MAX * np.hypot(prob_se[above], pilot_sd[above]))
    # below the atom: τ = 0 and the estimate is P[y ≠ 0] = 3/4, the same for both quantiles
    np.testing.assert_allclose(truth["prob"][:2], 0.75, rtol=1e-12)
    assert np.all(np.abs(prob[:2] - 0.75) <= Z_MAX * prob_se[:2])
    for name in ("prob", "M"):
        np.testing.assert_array_equal(arrays[name][0], arrays[name][1])


# =========================================== 5. vector-output teacher, one output chosen


def test_vector_output_teacher_selects_its_output(tmp_path):
    """``W0`` (k, d) with non-unit rows, ``W1`` (2, k), ``source.output: 1`` ≡ the one-output
    teacher ``(W0, W1[1:2])`` ≡ the planted teacher with units ``w_i/|w_i|`` and output weights
    ``W1[1, i] |w_i|``; and its statistics match the closed forms for non-unit weights
    (``c_l |w|^{1−l} w^{⊗l}``)."""
    rng = np.random.default_rng(31)
    d, k = 5, 3
    W0 = rng.standard_normal((k, d)) * np.array([[0.5], [1.0], [2.0]])
    W1 = np.array([[0.3, 1.1, -0.4], [1.2, -0.9, 0.5]])
    Network((W0, W1)).save(tmp_path / "two.npz")
    Network((W0, W1[1:2])).save(tmp_path / "one.npz")
    statistics = {
        "basic": {},
        "hermite": {"max_order": 4},
        "contracted": {"orders": [2, 4], "directions": 3},
        "filtered": {"quantiles": [0.6, 0.9], "pilot_samples": 20_000},
    }
    common = dict(seed=606, samples=100_000, chunk_size=2_000, d=d, statistics=statistics, noise_std=0.1)
    norms = np.linalg.norm(W0, axis=1)
    teachers = {
        "two": ({"file": str(tmp_path / "two.npz")}, {"output": 1}),
        "one": ({"file": str(tmp_path / "one.npz")}, {}),
        "planted": (
            {
                "kind": "one_hidden_relu",
                "width": k,
                "weights": (W0 / norms[:, None]).tolist(),
                "output_weights": (W1[1] * norms).tolist(),
            },
            {},
        ),
    }
    runs = {
        name: _all_arrays(run_in_process(run_config(teacher=t, **common, **extra), tmp_path / name))
        for name, (t, extra) in teachers.items()
    }
    runs["first"] = _all_arrays(
        run_in_process(run_config(teacher={"file": str(tmp_path / "two.npz")}, output=0, **common), tmp_path / "first")
    )
    two = runs["two"]
    for other in ("one", "planted"):
        assert runs[other].keys() == two.keys()
        for key, v in two.items():
            # the same function, computed with other matrix shapes: equal up to rounding
            np.testing.assert_allclose(
                runs[other][key], v, rtol=1e-9, atol=1e-12 * max(1.0, np.abs(v).max()), err_msg=f"{other}: {key}"
            )
    assert not np.allclose(runs["first"]["basic/yx"], two["basic/yx"])  # output 0 is another label

    # closed forms with λ_i = W1[1, i] |w_i| and u_i = w_i / |w_i|, computed from the arrays above
    lam, U = W1[1] * norms, W0 / norms[:, None]
    for name, t in basic_truth(lam, U, 0.1).items():
        check_within(f"basic.{name}", two[f"basic/{name}"], two[f"basic/{name}_se"], t)
    for l in range(5):
        t = hermite_truth(lam, U, l, two.get(f"hermite/index{l}"))
        check_within(f"hermite.T{l}", two[f"hermite/T{l}"], two[f"hermite/T{l}_se"], t)
    ct = contracted_truth(
        lam, U, two["contracted/direction"], two["contracted/pair_order"], two["contracted/pair_direction"]
    )
    for name, t in ct.items():
        check_within(f"contracted.{name}", two[f"contracted/{name}"], two[f"contracted/{name}_se"], t)


def test_registry_names_every_section_by_its_family():
    """Every statistics section has a family in the registry, under the name its statistic stores its group by."""
    from relulearn.config import StatisticsConfig
    from relulearn.pipeline.stats.registry import FAMILIES

    assert list(FAMILIES) == list(StatisticsConfig.model_fields)
    assert all(cls.name == name for name, cls in FAMILIES.items())


def test_enabled_families_follow_the_fields_order():
    """``enabled()`` lists the sections set, in the order of ``StatisticsConfig``'s fields (the registry's)."""
    from relulearn.config import StatisticsConfig

    basis = [[1.0, 0.0, 0.0]]
    net = {"weights": [[[1.0]], [[1.0]]]}
    every = {
        "basic": {},
        "output_moments": {},
        "hermite": {},
        "contracted": {},
        "filtered": {"quantiles": [0.5]},
        "residual": {"basis": basis, "candidates": [net], "quantiles": [0.5]},
        "projected_hermite": {"basis": basis},
        "sketch": {"second": {}},
    }
    stats = StatisticsConfig.model_validate(dict(reversed(list(every.items()))))
    assert list(stats.enabled()) == [name for name in StatisticsConfig.model_fields if name in every]
    assert list(
        StatisticsConfig.model_validate({"basic": None, "sketch": {"second": {}}, "hermite": {}}).enabled()
    ) == [
        "hermite",
        "sketch",
    ]
