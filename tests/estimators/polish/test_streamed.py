"""The streamed refinement of one-hidden-layer ReLU networks: closed-form Gram, exactness, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from draws import Draw

from relulearn.api.execution import mapper
from relulearn.estimators.polish import streamed
from relulearn.estimators.polish.streamed import gradient_sums, refine_streamed
from relulearn.estimators.polish.streamed_gram import PopulationGram, pair_second_moment
from relulearn.network import Network, compare


def _teacher_and_start(d: int, k: int, angle: float, seed: int = 0) -> tuple[Network, Network]:
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((k, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    lam = rng.choice([-1.0, 1.0], k) * rng.uniform(0.5, 1.5, k)
    e = rng.standard_normal((k, d))
    e -= np.sum(e * u, axis=1, keepdims=True) * u
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    start = Network((np.cos(angle) * u + np.sin(angle) * e, 1.1 * lam[None, :]), activation="relu")
    return Network((u, lam[None, :]), activation="relu"), start


def test_pair_second_moment_matches_monte_carlo_within_its_standard_error():
    rng = np.random.default_rng(1)
    q, n = 4, 400_000
    z = rng.standard_normal((n, q))
    for c in (0.9, 0.0, -0.7):
        a = np.eye(q)[0]
        b = c * a + np.sqrt(1 - c * c) * np.eye(q)[1]
        keep = ((z @ a > 0) & (z @ b > 0)).astype(float)
        terms = keep[:, None, None] * z[:, :, None] * z[:, None, :]
        mean, se = terms.mean(axis=0), terms.std(axis=0) / np.sqrt(n)
        assert np.all(np.abs(mean - pair_second_moment(a, b)) <= 5 * se + 1e-12)
    e = np.eye(q)[2]
    assert np.allclose(pair_second_moment(e, e), np.eye(q) / 2, atol=1e-15)
    assert np.allclose(pair_second_moment(e, -e), 0, atol=1e-15)


def test_population_gram_solve_inverts_the_dense_gram():
    """H assembled densely from the pair formula in R^d (d = 20): H · solve(G) = G to rounding."""
    rng = np.random.default_rng(2)
    k, d = 4, 20
    w = rng.standard_normal((k, d)) * rng.uniform(0.5, 2, (k, 1))
    s = np.array([1.0, -1.0, 1.0, -1.0])
    unit = w / np.linalg.norm(w, axis=1, keepdims=True)
    h = np.block([[s[i] * s[j] * pair_second_moment(unit[i], unit[j]) for j in range(k)] for i in range(k)])
    g = rng.standard_normal((k, d))
    step = PopulationGram(w, s).solve(g)
    assert np.abs(h @ step.ravel() - g.ravel()).max() <= 1e-12 * np.abs(g).max()


def test_gradient_sums_is_the_half_gradient_of_the_squared_loss():
    rng = np.random.default_rng(3)
    x, w, s = rng.standard_normal((500, 20)), rng.standard_normal((3, 20)), np.array([1.0, -1.0, 1.0])
    y = rng.standard_normal(500)
    sums = gradient_sums(x, y, w, s)
    loss = lambda v: float(np.sum((y - np.maximum(x @ v.T, 0) @ s) ** 2))  # noqa: E731
    e = np.zeros_like(w)
    e[1, 4] = 1e-6
    assert sums.loss == pytest.approx(loss(w), rel=1e-14)
    assert (loss(w + e) - loss(w - e)) / 2e-6 == pytest.approx(-2 * sums.g[1, 4], rel=1e-6)


def test_noiseless_refinement_reaches_machine_precision_from_a_start_02_rad_off():
    teacher, start = _teacher_and_start(50, 3, 0.2)
    net, rep = refine_streamed(start, Draw(teacher, 50), 200_000, mapper=mapper(None))
    assert compare(teacher, start).relative_error > 0.1
    assert compare(teacher, net).relative_error <= 1e-12, rep
    assert rep["passes"] <= 20 and rep["relative_loss"] <= 1e-26


def test_anderson_mixing_reaches_the_exact_fit_when_the_samples_are_few_multiples_of_kd(monkeypatch):
    """At n = 8·kd samples per pass the empirical Gram is far from the population one (Marchenko–Pastur
    spread 1 ± 2√(kd/n)): plain preconditioned steps contract by about 0.8 per pass, the mixed ones
    reach the noiseless fit to rounding within the pass limit."""
    d, k = 100, 5
    teacher, start = _teacher_and_start(d, k, 0.3, seed=2)
    draw = Draw(teacher, d)
    mixed, rep = refine_streamed(start, draw, 8 * k * d, mapper=mapper(None))
    assert compare(teacher, mixed).relative_error <= 1e-12, rep["stop"]
    assert rep["mixed_steps"] > 0
    monkeypatch.setattr(streamed, "ANDERSON_MEMORY", 0)  # plain steps only
    plain, rep_plain = refine_streamed(start, draw, 8 * k * d, mapper=mapper(None))
    assert rep_plain["mixed_steps"] == 0
    assert compare(teacher, plain).relative_error > 1e3 * max(compare(teacher, mixed).relative_error, 1e-15)


def test_refinement_is_bitwise_equal_in_process_and_on_two_workers(client):
    teacher, start = _teacher_and_start(24, 3, 0.05, seed=4)
    draw = Draw(teacher, 24, noise=0.1)
    here, rep_here = refine_streamed(start, draw, 90_000, part_rows=30_000, max_passes=3, mapper=mapper(None))
    there, rep_there = refine_streamed(start, draw, 90_000, part_rows=30_000, max_passes=3, mapper=mapper(client))
    assert rep_here["passes"] == 3 and rep_here == rep_there
    assert all(np.array_equal(a, b) for a, b in zip(here.weights, there.weights))


def _fit_large(
    client, tmp_path, monkeypatch, d: int, width: int, seed: int, *, matrix_free: bool, noise: float = 0.0
) -> tuple[dict, dict]:
    """``fit --method moments`` with the large-d path forced at a small d (no bounded d-dimensional sample for
    the enumeration; the matrix-free polish allowed or not): the result, and the parameter error's evaluation
    (None with noisy labels)."""
    import yaml

    from relulearn import api
    from relulearn.config import config_from_dict
    from relulearn.estimators.moments import entry as moments

    monkeypatch.setattr(moments, "LARGE_INPUT_BYTES", 0)
    if not matrix_free:
        monkeypatch.setattr(moments, "CG_POLISH_BYTES", 0)
    data = {
        "seed": seed,
        "samples": 200_000,
        "chunk_size": 25_000,
        "source": {
            "d": d,
            "noise_std": noise,
            "teacher": {"kind": "one_hidden_relu", "width": width, "seed": seed + 2},
        },
        "run": {"commit_interval": 1e9},
    }
    out = str(tmp_path / "m.npz")
    res = api.fit(
        config_from_dict(data), str(tmp_path / "s.zarr"), "moments", width=width, out=out, client=client, progress=None
    )
    if noise:
        return res, {}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    return res, api.evaluate(out, tmp_path / "c.yaml", samples=50_000)


def test_moments_at_large_d_enumerates_projected_parts_and_refines_on_the_stream(client, tmp_path, monkeypatch):
    """The large-d path (no bounded d-dimensional sample, no polish), forced at d = 24: exact."""
    res, ev = _fit_large(client, tmp_path, monkeypatch, 24, 2, 3, matrix_free=False)
    assert "skipped" in res["report"]["polish"] and res["report"]["chosen"] == "refined"
    # noiseless: fitted to rounding on the bounded stream (8 rows per unknown, at least 20,000), not on all 200,000
    assert res["report"]["refinement"]["samples"] == 20_000
    assert res["report"]["refinement"]["stop"] == "loss at rounding level"
    assert ev["parameter_error"] <= 1e-12, ev


def test_moments_at_large_d_polishes_matrix_free_where_its_bounded_sample_fits(client, tmp_path, monkeypatch):
    """The large-d path with a bounded sample of 8 rows per unknown that fits: enumeration on projected parts,
    then the matrix-free Gauss–Newton polish, exact on the validation samples (no streamed refinement), forced
    at d = 40."""
    res, ev = _fit_large(client, tmp_path, monkeypatch, 40, 3, 4, matrix_free=True)
    rep = res["report"]
    assert rep["chosen"] == "polish" and rep["polish"]["cg_iterations"], rep["polish"]
    assert rep["refinement"] == {"skipped": "polish is exact on the validation samples"}
    assert ev["parameter_error"] <= 1e-12, ev


def test_moments_at_large_d_with_noisy_labels_refines_on_every_sample_after_the_bounded_stream(
    client, tmp_path, monkeypatch
):
    """Labels with noise are not fitted to their rounding on the bounded stream: the refinement goes on over all
    the store's samples (the statistically efficient fit), from where the bounded one stopped."""
    res, _ = _fit_large(client, tmp_path, monkeypatch, 24, 2, 3, matrix_free=False, noise=0.05)
    ref = res["report"]["refinement"]
    assert ref["bounded_first"]["samples"] == 20_000 and ref["bounded_first"]["stop"] != "loss at rounding level"
    assert ref["samples"] == 200_000 and ref["kept"]
