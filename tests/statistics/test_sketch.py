"""The ``sketch`` statistic, subspace passes and iteration, and the dense-or-sketch plan.

Truths checked, all in-process (no cluster), on d >= 20 (docs/design.md §4: tiny matrices hide
arithmetic differences):

1. ``Y = M Ω`` of every family equals the dense family's stored estimate times the stored Ω, on
   the same chunks, to rounding; its standard error is the spread of the per-chunk ``M_c Ω``;
   (the residual family too: candidate networks on a found subspace, projected off it);
2. a subspace pass stores ``M Bᵀ`` and ``B M Bᵀ`` for the given basis rows B;
3. a run extended at a block boundary is bitwise equal to one uninterrupted run;
4. a rank the sketch cannot hold, a budget too small for the sketch, and a pass on chunks other
   than its refined store's are refused, naming what to use;
5. subspace iteration converges to the dense empirical eigenvectors through real passes, and on a
   synthetic matrix with known spectrum and noise lands within its angle bound of the truth.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from relulearn import open_store
from relulearn.config import ConfigError, config_from_dict
from relulearn.estimators.spectral.subspace import rayleigh_ritz, sketch_basis, subspace_iteration
from relulearn.estimators.spectral.subspace_geometry import principal_angles
from relulearn.pipeline.families import build_statistics
from relulearn.pipeline.plan import MemoryBudgetError, plan_families
from relulearn.pipeline.refines import check_pass_store, refine_record
from relulearn.pipeline.run import estimate
from relulearn.pipeline.sources import make_source
from relulearn.pipeline.stats.output_moments import OutputMoments
from relulearn.pipeline.stats.partial import accumulate_chunks
from relulearn.storage import StoreError

D = 24
BASE = {
    "seed": 3,
    "samples": 20_000,
    "chunk_size": 2_500,
    "source": {"d": D, "teacher": {"kind": "one_hidden_relu", "width": 2, "output_weights": [1.0, -0.6]}},
    "run": {"chunks_per_block": 2, "commit_interval": 1e9},
}
#: the residual family on the subspace of e_0, for the exact first unit's part and for the zero network
RESIDUAL = {
    "basis": [[1.0] + [0.0] * (D - 1)],
    "candidates": [{"weights": [[[1.0]], [[1.0]]]}, {"weights": [[[0.0]], [[0.0]]]}],
    "quantiles": [0.3, 0.7],
    "pilot_samples": 2_000,
}
FAMILIES = {
    "contracted": {"orders": [2, 4], "directions": 3},
    "filtered": {"quantiles": [0.3, 0.7], "pilot_samples": 2_000},
    "residual": RESIDUAL,
}
DENSE = {
    "second": ("output_moments", "T2"),
    "contracted": ("contracted", "M"),
    "filtered": ("filtered", "M"),
    "residual": ("residual", "M"),
}


def dense_matrices(url: str) -> dict[str, np.ndarray]:
    """The dense families' stored estimates, by sketched family name (M_2: T2 of output 0)."""
    out = {fam: arrays(url, name)[key] for fam, (name, key) in DENSE.items()}
    out["second"] = out["second"][0]
    return out


def config(statistics: dict, **top):
    return config_from_dict(dict(BASE, statistics=statistics, **top))


def arrays(url: str, name: str = "sketch") -> dict[str, np.ndarray]:
    return open_store(url).arrays(name)


@pytest.fixture(scope="module")
def dense_and_sketch(tmp_path_factory):
    """One run with the dense families and their sketches (rank 6) on the same chunks."""
    url = str(tmp_path_factory.mktemp("sketch") / "run.zarr")
    stats = {"basic": None, "output_moments": {}, **FAMILIES, "sketch": {"rank": 6, "second": {}, **FAMILIES}}
    estimate(config(stats), url, progress=None)
    return url


def test_sketch_equals_dense_matrix_times_test_matrix(dense_and_sketch):
    sk = arrays(dense_and_sketch)
    om = sk["omega"]
    assert om.shape == (D, 6)
    for fam, m in dense_matrices(dense_and_sketch).items():
        want = m @ om
        np.testing.assert_allclose(sk[f"Y_{fam}"], want, rtol=0, atol=1e-12 * np.abs(want).max(), err_msg=fam)
    for fam in ("filtered", "residual"):
        np.testing.assert_array_equal(sk[f"prob_{fam}"], arrays(dense_and_sketch, fam)["prob"])
    np.testing.assert_array_equal(sk["tau"], arrays(dense_and_sketch, "filtered")["tau"])
    np.testing.assert_array_equal(sk["residual_tau"], arrays(dense_and_sketch, "residual")["tau"])
    res = arrays(dense_and_sketch, "residual")
    assert sk["Y_residual"].shape == (2, 2, D, 6)
    for c in range(2):  # the candidates are stored under the dense family's names
        for j in range(2):
            np.testing.assert_array_equal(sk[f"candidate{c}_W{j}"], res[f"candidate{c}_W{j}"])
    # the residual family lives off the found subspace: B Y = 0 to rounding
    assert np.abs(sk["Y_residual"][:, :, 0, :]).max() < 1e-12 * np.abs(sk["Y_residual"]).max()
    np.testing.assert_array_equal(sk["direction"], arrays(dense_and_sketch, "contracted")["direction"])


def test_sketch_standard_error_is_the_spread_of_chunk_sketches(dense_and_sketch):
    cfg = config({"basic": None, "output_moments": {}})
    source = make_source(cfg)
    stat = OutputMoments(D)
    om = arrays(dense_and_sketch)["omega"]
    chunks = [
        stat.terms(accumulate_chunks([stat], source, cfg.seed, cfg.chunk_size, c, c + 1).sums[stat.name])["T2"][0]
        for c in range(cfg.n_chunks)
    ]
    per_chunk = np.stack([m @ om for m in chunks]) / cfg.chunk_size
    se = per_chunk.std(axis=0, ddof=1) / math.sqrt(cfg.n_chunks)
    np.testing.assert_allclose(arrays(dense_and_sketch)["Y_second_se"], se, rtol=1e-8)


def test_subspace_pass_stores_m_b_and_b_m_b(dense_and_sketch, tmp_path):
    rows = np.linalg.qr(np.random.default_rng(0).standard_normal((D, 5)))[0].T  # orthonormal rows B (5 × d)
    record = refine_record(open_store(dense_and_sketch).meta)
    url = str(tmp_path / "pass.zarr")
    estimate(
        config({"basic": None, "sketch": {"basis": rows.tolist(), "second": {}, **FAMILIES, "refines": record}}),
        url,
        progress=None,
    )
    sk = arrays(url)
    np.testing.assert_array_equal(sk["omega"], rows.T)
    for fam, m in dense_matrices(dense_and_sketch).items():
        for name, want in ((f"Y_{fam}", m @ rows.T), (f"BMB_{fam}", rows @ m @ rows.T)):
            np.testing.assert_allclose(sk[name], want, rtol=0, atol=1e-12 * np.abs(want).max(), err_msg=name)
            # every entry has a spread over the chunks, but those of the residual family on the found
            # subspace's coordinate e_0: exactly zero in every chunk (x⊥ and (I − BᵀB)Ω vanish there)
            se = sk[f"{name}_se"]
            assert np.all((se > 0) | ((sk[name] == 0) & (fam == "residual"))), name


def test_extended_run_is_bitwise_equal_to_uninterrupted(tmp_path):
    stats = {"basic": None, "sketch": {"rank": 5, "second": {}, **FAMILIES}}
    short, full = str(tmp_path / "short.zarr"), str(tmp_path / "full.zarr")
    estimate(config(stats), short, samples=10_000, progress=None)  # 4 chunks: 2 blocks
    estimate(config(stats), short, progress=None)  # resumed at a block boundary, to 8 chunks
    estimate(config(stats), full, progress=None)
    a, b = arrays(short), arrays(full)
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_merged_sketch_stores_average_their_sketches(tmp_path):
    from relulearn.pipeline.merge import merge_stores

    stats = {"basic": None, "sketch": {"rank": 4, "second": {}, "filtered": {"thresholds": [0.0, 0.5]}}}
    a, b, c = (str(tmp_path / n) for n in ("a.zarr", "b.zarr", "c.zarr"))
    estimate(config(stats, seed=1), a, samples=10_000, progress=None)
    estimate(config(stats, seed=2), b, samples=10_000, progress=None)
    with pytest.raises(StoreError, match=r"omega differs.*statistics\.sketch\.seed"):
        merge_stores(a, b, c)
    fixed = {"basic": None, "sketch": dict(stats["sketch"], seed=0)}
    a2, b2 = str(tmp_path / "a2.zarr"), str(tmp_path / "b2.zarr")
    estimate(config(fixed, seed=1), a2, samples=10_000, progress=None)
    estimate(config(fixed, seed=2), b2, samples=10_000, progress=None)
    merge_stores(a2, b2, c)
    for name in ("Y_second", "Y_filtered"):
        np.testing.assert_allclose(arrays(c)[name], (arrays(a2)[name] + arrays(b2)[name]) / 2, rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------------ refusals


def test_rank_the_sketch_cannot_hold_is_refused():
    with pytest.raises(ConfigError, match=rf"use r <= {D}"):
        build_statistics(config({"sketch": {"rank": D + 1, "second": {}}}), None)
    with pytest.raises(ConfigError, match=r"use r >= 12"):
        plan_families(100, {"second": 1}, rank=8, budget_bytes=10**9, k=4)
    with pytest.raises(ConfigError, match=r"use r <= 20"):
        plan_families(20, {"second": 1}, rank=32, budget_bytes=10**9)
    basis = np.linalg.qr(np.random.default_rng(1).standard_normal((50, 6)))[0]
    with pytest.raises(ConfigError, match=r"use r >= 12"):
        rayleigh_ritz(np.zeros((50, 6)), np.ones((50, 6)), np.zeros((6, 6)), basis, k=4)


def test_plan_keeps_dense_while_it_fits_and_refuses_a_budget_below_the_sketch():
    fams = {"basic": 1, "contracted": 16, "filtered": 3}
    small = plan_families(128, fams, rank=32, budget_bytes=2**30)
    assert small["sketched"] == [] and small["total_bytes"] == 2 * 20 * 128**2 * 8
    big = plan_families(10_000, fams, rank=32, budget_bytes=2 * 10**9)
    assert big["families"]["contracted"]["form"] == "sketch" and big["total_bytes"] <= 2 * 10**9
    assert big["families"]["basic"]["form"] == "dense"  # 1.6 GB dense basic fits once contracted is sketched
    need = 20 * 2 * 10_000 * 32 * 8
    with pytest.raises(MemoryBudgetError, match=f"{need:,} bytes"):
        plan_families(10_000, fams, rank=32, budget_bytes=need - 1)


def test_pass_on_other_chunks_is_refused(dense_and_sketch, tmp_path):
    record = refine_record(open_store(dense_and_sketch).meta)
    rows = np.eye(D)[:3].tolist()
    stats = {"basic": None, "sketch": {"basis": rows, "second": {}, "refines": record}}
    with pytest.raises(StoreError, match=r"differing fields: seed$|differing fields: seed\."):
        estimate(config(stats, seed=4), str(tmp_path / "a"), progress=None)
    with pytest.raises(StoreError, match=r"differing fields: samples"):
        estimate(config(stats), str(tmp_path / "b"), samples=30_000, progress=None)
    with pytest.raises(StoreError, match=r"chunk_size"):
        estimate(config(stats, chunk_size=2_000), str(tmp_path / "c"), progress=None)
    assert not (tmp_path / "a").exists()
    meta = open_store(dense_and_sketch).meta
    pass_meta = {"config": {"statistics": {"sketch": {"refines": record}}}}
    check_pass_store(pass_meta, meta)
    with pytest.raises(StoreError, match=r"differing fields: digest, seed"):
        check_pass_store(pass_meta, dict(meta, fingerprint=dict(meta["fingerprint"], seed=4)))


# ---------------------------------------------------------------------- iteration


def test_iteration_through_passes_reaches_the_dense_eigenvectors(tmp_path):
    url = str(tmp_path / "sketch.zarr")
    estimate(config({"basic": None, "output_moments": {}, "sketch": {"rank": 12, "second": {}}}), url, progress=None)
    run = open_store(url)
    t2 = run.arrays("output_moments")["T2"][0]
    w, v = np.linalg.eigh(0.5 * (t2 + t2.T))
    top = v[:, np.argsort(-np.abs(w))[:2]]
    count = [0]

    def run_pass(statistics: dict) -> dict:
        count[0] += 1
        out = str(tmp_path / f"pass{count[0]}.zarr")
        estimate(config(statistics), out, progress=None)
        return arrays(out)

    it = subspace_iteration(
        run_pass,
        run.arrays("sketch"),
        run.meta["config"]["statistics"]["sketch"],
        k=2,
        refines=refine_record(run.meta),
        max_passes=5,
        rtol=0.0,
    )
    assert count[0] == 5 and not it.converged
    assert principal_angles(top, it.vectors).max() < 1e-5  # the same empirical matrix as the dense path
    np.testing.assert_allclose(it.eigenvalues, w[np.argsort(-np.abs(w))[:2]], rtol=1e-8)
    assert it.changes[-1] < it.changes[0] / 100


def test_iteration_on_a_noisy_matrix_converges_within_its_angle_bound():
    rng = np.random.default_rng(5)
    d, k, r, sigma = 200, 4, 16, 3e-3
    truth = np.linalg.qr(rng.standard_normal((d, k)))[0]
    lam = np.array([1.0, -0.8, 0.6, 0.45])
    e = rng.standard_normal((d, d)) * sigma
    e = (e + e.T) / math.sqrt(2)  # symmetric, entries of standard deviation sigma
    m_hat = truth @ np.diag(lam) @ truth.T + e
    omega = rng.standard_normal((d, r))
    sketch = {"Y_second": m_hat @ omega, "Y_second_se": np.full((d, r), sigma) * np.linalg.norm(omega, axis=0)}
    # a single sketch is swamped: each column's noise ‖E ω‖ ≈ d σ ≈ 0.6 is as large as its signal ‖M ω‖
    assert sketch_basis(sketch["Y_second"], sketch["Y_second_se"]).significant < r

    def run_pass(statistics: dict) -> dict:
        b = np.asarray(statistics["sketch"]["basis"]).T
        return {
            "omega": b,
            "Y_second": m_hat @ b,
            "Y_second_se": np.full((d, r), sigma),
            "BMB_second": b.T @ m_hat @ b,
            "BMB_second_se": np.full((r, r), sigma),
        }

    w, v = np.linalg.eigh(m_hat)
    dense = v[:, np.argsort(-np.abs(w))[:k]]
    one = subspace_iteration(run_pass, sketch, {"second": {}}, k=k, max_passes=1)
    assert principal_angles(dense, one.vectors).max() <= one.steps[0].angle_bound  # sketch + ONE pass

    it = subspace_iteration(run_pass, sketch, {"second": {}}, k=k, max_passes=10, rtol=0.05)
    last = it.steps[-1]
    assert it.converged and len(it.steps) < 10
    assert last.floor >= np.linalg.norm(e, 2) and last.subspace_noise >= np.linalg.norm(e @ truth, 2)
    assert last.significant == k
    assert principal_angles(dense, it.vectors).max() < 0.05 * last.angle_bound + 1e-6
    assert principal_angles(truth, it.vectors).max() <= last.angle_bound
    np.testing.assert_allclose(it.eigenvalues, lam, atol=last.eigenvalue_floor)


def test_second_with_an_expansion_estimates_the_same_moments_with_less_variance(tmp_path):
    """A degree-≤2 expansion subtracted from the labels (control variate) leaves the estimands of the
    ``second`` family unbiased — ``M_2 Ω``, ``E[y]``, ``E[y x]`` in closed form (docs/design.md §3) within their
    standard errors — and, being the teacher's own, cuts their standard errors (the residual is the
    degree-≥3 part: about 2 % of a ReLU unit's energy)."""
    teacher = make_source(config({"basic": {}})).network
    u, lam = teacher.weights[0], teacher.weights[1][0]
    c2 = 1 / math.sqrt(2 * math.pi)
    t0, t1, m2 = lam.sum() * c2, u.T @ lam / 2, (u.T * lam * c2) @ u
    expansion = {"t0": float(t0), "t1": t1.tolist(), "t2_vectors": u.tolist(), "t2_values": (lam * c2).tolist()}
    got = {}
    for name, second in (("raw", {}), ("expansion", {"expansion": expansion})):
        url = str(tmp_path / f"{name}.zarr")
        estimate(config({"basic": None, "sketch": {"rank": 6, "second": second}}, samples=40_000), url, progress=None)
        got[name] = arrays(url)
    om = got["raw"]["omega"]
    for name, sk in got.items():
        for key, want in (("Y_second", m2 @ om), ("t0_second", t0), ("t1_second", t1)):
            z = np.abs(sk[key] - want) / sk[f"{key}_se"]
            assert z.max() < 5.0, (name, key, z.max())
    ratio = np.median(got["expansion"]["Y_second_se"] / got["raw"]["Y_second_se"])
    assert ratio < 0.35, ratio
    assert np.median(got["expansion"]["t1_second_se"] / got["raw"]["t1_second_se"]) < 0.5


def test_an_expansion_of_low_rank_needs_values_for_its_vectors():
    with pytest.raises(ValueError, match="t2_vectors and t2_values together"):
        config({"basic": None, "sketch": {"second": {"expansion": {"t2_vectors": [[0.0] * D]}}}})
    with pytest.raises(ValueError, match="t2_vectors has shape"):
        estimate(
            config(
                {
                    "basic": None,
                    "sketch": {
                        "rank": 6,
                        "second": {"expansion": {"t2_vectors": [[1.0] * (D + 1)], "t2_values": [1.0]}},
                    },
                }
            ),
            "memory://never",
            progress=None,
        )
