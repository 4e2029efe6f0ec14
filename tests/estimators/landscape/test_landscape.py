"""``landscape`` (Ge–Lee–Ma 2017): the designed objective G, its minimization, the whitening on the
subspace of T_2, the ``projected_hermite`` statistic on residual labels, and the method end to end
on real stores and a real LocalCluster; refusals name the cause and leave nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.optimize import approx_fprime

from relulearn import api, hermite
from relulearn.config import config_from_dict
from relulearn.estimators.base import PassRequest, Samples
from relulearn.estimators.landscape import entry as landscape
from relulearn.estimators.landscape.objective_g import GParameters, g_value_grad, minimize_g, row_angles
from relulearn.network import Network, compare
from relulearn.storage import open_store

from conftest import relulearn

C = [hermite.relu_hermite_coefficient(l) for l in range(5)]


def planted(d: int, m: int, cond: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``B`` (m × d) with singular values from 1 to ``cond`` (orthonormal rows for cond = 1), ``a`` in [0.5, 1.5]."""
    rng = np.random.default_rng(seed)
    q1 = np.linalg.qr(rng.standard_normal((m, m)))[0]
    q2 = np.linalg.qr(rng.standard_normal((d, m)))[0].T
    b = q1 @ np.diag(np.geomspace(1.0, cond, m)) @ q2
    return b, rng.uniform(0.5, 1.5, m)


def config(b: np.ndarray, a: np.ndarray, n: int, sigma: float = 0.0, seed: int = 3) -> dict:
    norms = np.linalg.norm(b, axis=1)  # relu(<b, x>) = |b| relu(<u, x>): the teacher's units are unit rows
    return {
        "seed": seed,
        "samples": n,
        "chunk_size": 50_000,
        "source": {
            "d": b.shape[1],
            "noise_std": sigma,
            "teacher": {
                "kind": "one_hidden_relu",
                "width": len(a),
                "weights": b.tolist(),
                "output_weights": (a * norms).tolist(),
            },
        },
        "run": {"commit_interval": 0},
    }


# ------------------------------------------------------------------ objective


def test_gradient_of_g_matches_finite_differences():
    rng = np.random.default_rng(0)
    r = 5
    t = rng.standard_normal((r,) * 4)
    t = sum(t.transpose(p) for p in [(0, 1, 2, 3), (1, 0, 2, 3), (2, 3, 0, 1), (0, 2, 1, 3), (3, 1, 2, 0)])
    t = hermite.unpack(hermite.pack(t), r, 4)  # fully symmetric
    b = rng.standard_normal((4, r))
    f = lambda v: g_value_grad(v.reshape(4, r), t.reshape(r * r, r * r), 0.3, 2.0)[0]  # noqa: E731
    _, grad = g_value_grad(b, t.reshape(r * r, r * r), 0.3, 2.0)
    num = approx_fprime(b.ravel(), f, 1e-7)
    assert np.allclose(grad.ravel(), num, rtol=1e-5, atol=1e-5 * np.abs(num).max())


def test_every_start_of_g_reaches_the_orthogonal_components():
    """The population landscape: no spurious local minimum; every start finds all m rows."""
    r = 10
    rng = np.random.default_rng(1)
    u = np.linalg.qr(rng.standard_normal((r, r)))[0]
    beta = 1.0 / rng.uniform(0.5, 1.5, r)
    t = np.einsum("i,ia,ib,ic,id->abcd", beta, u, u, u, u)
    kappa = beta.max() / beta.min()
    params = GParameters(mu=0.1 / kappa, lam=beta.max() / 0.1, beta_max=beta.max(), beta_min=beta.min(), noise=0.0)
    results = minimize_g(t.reshape(r * r, r * r), r, params, starts=6, seed=(2,))
    assert all(s.distinct == r and not s.unbounded for s in results)
    assert max(row_angles(s.b, u).max() for s in results) <= 1e-6
    assert np.ptp([s.value for s in results]) <= 1e-9


# ------------------------------------------------------- learn on closed forms


def population(b: np.ndarray, a: np.ndarray, *, n: int = 10**6) -> dict:
    """The first pass's arrays at their population values (docs/design.md §3), tiny standard errors."""
    lam, u = a * np.linalg.norm(b, axis=1), b / np.linalg.norm(b, axis=1, keepdims=True)
    t2 = C[2] * (u.T * lam) @ u
    se = np.full(t2.shape, 1e-9)
    return {
        "hermite": {
            "T0": np.array(C[0] * lam.sum()),
            "T1": C[1] * u.T @ lam,
            "T2": hermite.pack(t2),
            "T2_se": hermite.pack(se),
            "count": np.array([n]),
        }
    }


def projected_pass(b: np.ndarray, a: np.ndarray, basis: np.ndarray, *, n: int = 10**6) -> dict:
    lam, u = a * np.linalg.norm(b, axis=1), b / np.linalg.norm(b, axis=1, keepdims=True)
    p = u @ basis.T
    t4 = C[4] * np.einsum("i,ia,ib,ic,id->abcd", lam, p, p, p, p)
    return {
        "projected_hermite": {
            "basis": basis,
            "T4": hermite.pack(t4),
            "T4_se": hermite.pack(np.full(t4.shape, 1e-9)),
            "count": np.array([n]),
        }
    }


def draw(b: np.ndarray, a: np.ndarray):
    def samples(n_train: int, n_val: int) -> Samples:
        rng = np.random.default_rng(9)
        x, xv = rng.standard_normal((n_train, b.shape[1])), rng.standard_normal((n_val, b.shape[1]))
        return Samples(x, np.maximum(x @ b.T, 0) @ a, xv, np.maximum(xv @ b.T, 0) @ a)

    return samples


def test_learn_on_population_moments_recovers_a_nonorthogonal_undercomplete_net_exactly():
    """Whitening in the eigenbasis of T_2, G, un-whitening, signs from T_1 and polish: exact."""
    b, a = planted(16, 6, 3.0, seed=4)
    stats = population(b, a)
    request = landscape.learn(stats, [], draw(b, a), width=6)
    assert isinstance(request, PassRequest)
    ph = request.statistics["projected_hermite"]
    basis = np.asarray(ph["basis"])
    assert basis.shape == (6, 16) and np.allclose(ph["expansion"]["t2"], hermite.unpack(stats["hermite"]["T2"], 16, 2))
    res = landscape.learn(stats, [projected_pass(b, a, basis)], draw(b, a), width=6)
    before = Network(tuple(np.asarray(w) for w in res.report["before_polish"].values()), activation="relu")
    assert compare(Network((b, a[None, :]), activation="relu"), before).relative_error <= 1e-8
    assert compare(Network((b, a[None, :]), activation="relu"), res.network).relative_error <= 1e-12
    assert res.report["summary"]["starts_at_lowest_G"] == res.report["summary"]["starts"]


def test_negative_output_weights_are_seen_in_t2_and_refused():
    b, a = planted(10, 4, 1.0, seed=5)
    a[2] = -0.8
    with pytest.raises(landscape.NegativeWeightsError, match=r"negative.*a ≥ 0.*--method moments"):
        landscape.learn(population(b, a), [], draw(b, a), width=4)


def test_rank_deficient_b_is_refused_with_what_to_do():
    b, a = planted(10, 4, 1.0, seed=6)
    b[3] = 2.0 * b[0]  # parallel rows: one unit of weight a_0 + 2 a_3, T_2 of rank 3
    with pytest.raises(landscape.TooFewSamplesError, match=r"full row rank 4.*--width 3"):
        landscape.learn(population(b, a), [], draw(b, a), width=4)


# ------------------------------------------------------------------ statistic


def test_projected_hermite_matches_closed_forms_on_residual_labels(tmp_path):
    """E[ỹ He_l(P x)] = T_l(Pᵀ·, …) for l ≥ 3, and ≈ 0 for l ≤ 2 when the expansion is the true one."""
    d, k = 8, 3
    b, a = planted(d, k, 1.0, seed=7)
    basis = np.linalg.qr(np.random.default_rng(8).standard_normal((d, 4)))[0].T
    pop = population(b, a)["hermite"]
    data = config(b, a, 600_000)
    data["chunk_size"] = 10_000
    data["statistics"] = {
        "projected_hermite": {
            "basis": basis.tolist(),
            "max_order": 4,
            "expansion": {
                "t0": float(pop["T0"]),
                "t1": pop["T1"].tolist(),
                "t2": hermite.unpack(pop["T2"], d, 2).tolist(),
            },
        }
    }
    api.estimate(config_from_dict(data), str(tmp_path / "s"), client="local", progress=None)
    got = open_store(str(tmp_path / "s")).arrays("projected_hermite")
    lam, u = a * np.linalg.norm(b, axis=1), b / np.linalg.norm(b, axis=1, keepdims=True)
    p = u @ basis.T
    for l in range(5):
        true = (
            np.zeros_like(got[f"T{l}"])
            if l <= 3
            else hermite.pack(C[4] * np.einsum("i,ia,ib,ic,id->abcd", lam, p, p, p, p))
        )
        z = (got[f"T{l}"] - true) / got[f"T{l}_se"]
        assert np.abs(z).max() <= 5.0 and np.sqrt(np.mean(z**2)) <= 1.6, (l, z)
    # residual labels carry a few % of E[y²] (ReLU units' degree-≤2 part): T_4's errors shrink threefold or more
    del data["statistics"]["projected_hermite"]["expansion"]
    api.estimate(config_from_dict(data), str(tmp_path / "raw"), client="local", progress=None)
    raw = open_store(str(tmp_path / "raw")).arrays("projected_hermite")
    assert np.median(got["T4_se"] / raw["T4_se"]) <= 1 / 3


# ---------------------------------------------------------------- end to end


def test_fit_landscape_recovers_a_full_width_net_on_the_cluster(tmp_path, client):
    """m = d = 12, orthonormal B, a in [0.5, 1.5], noiseless: all starts agree, rows within 0.2 rad
    before polish, machine precision after."""
    b, a = planted(12, 12, 1.0, seed=11)
    data = config(b, a, 2_000_000)
    out = str(tmp_path / "m.npz")
    res = api.fit(
        config_from_dict(data), str(tmp_path / "s"), "landscape", width=12, out=out, client=client, progress=None
    )
    rep = res["report"]
    assert [p["name"] for p in res["passes"]] == ["projected-hermite"]
    assert "y − P≤2 y" in rep["labels"]["fourth_moment"]
    assert rep["summary"]["starts_at_lowest_G"] == rep["summary"]["starts"] == 8
    assert row_angles(np.asarray(rep["before_polish"]["W0"]), b).max() <= 0.2
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(data))
    ev = api.evaluate(out, cfg, samples=50_000)
    assert ev["parameter_error"] <= 1e-8 and ev["relative_test_error"] <= 1e-20, ev


def test_fit_landscape_with_noise_reaches_the_noise_floor(tmp_path, client):
    b, a = planted(16, 8, 3.0, seed=12)
    data = config(b, a, 2_000_000, sigma=0.1)
    out = str(tmp_path / "m.npz")
    api.fit(config_from_dict(data), str(tmp_path / "s"), "landscape", width=8, out=out, client=client, progress=None)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(data))
    ev = api.evaluate(out, cfg, samples=400_000)
    assert ev["relative_test_error"] <= 1.05 * ev["noise_floor"], ev


# ------------------------------------------------------------------ refusals


def test_teachers_outside_the_setting_are_refused_before_any_work(tmp_path):
    b, a = planted(6, 3, 1.0, seed=13)
    neg = config(b, a, 100_000)
    neg["source"]["teacher"]["output_weights"][1] = -0.5
    with pytest.raises(landscape.NegativeWeightsError, match="negative output weight"):
        api.fit(
            config_from_dict(neg),
            str(tmp_path / "a"),
            "landscape",
            out=str(tmp_path / "m.npz"),
            client="local",
            progress=None,
        )
    wide = config(np.vstack([b, b[:1] + b[1:2]]), np.append(a, 1.0), 100_000)
    with pytest.raises(ValueError, match=r"rank 3 < 4 rows.*full row rank"):
        api.fit(
            config_from_dict(wide),
            str(tmp_path / "b"),
            "landscape",
            out=str(tmp_path / "m.npz"),
            client="local",
            progress=None,
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    cfg = tmp_path / "neg.json"
    cfg.write_text(json.dumps(neg))
    run = relulearn(
        "fit",
        str(cfg),
        "--store",
        str(tmp_path / "c"),
        "--method",
        "landscape",
        "--starts",
        "4",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
    )
    assert run.returncode != 0 and "negative output weight" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "c").exists()


def test_too_few_samples_gives_the_number_needed(tmp_path):
    b, a = planted(12, 12, 3.0, seed=14)
    with pytest.raises(landscape.TooFewSamplesError, match=r"about [\d,]+ samples would"):
        api.fit(
            config_from_dict(config(b, a, 100_000)),
            str(tmp_path / "s"),
            "landscape",
            width=12,
            out=str(tmp_path / "m.npz"),
            client="local",
            progress=None,
        )


def test_starts_are_bitwise_equal_in_process_and_on_two_workers(client):
    """The starts of G run through the method's mapper: the same bits wherever they run (r = 20)."""
    from relulearn.api.execution import mapper

    r = 20
    rng = np.random.default_rng(15)
    u = np.linalg.qr(rng.standard_normal((r, r)))[0]
    t = np.einsum("i,ia,ib,ic,id->abcd", 1.0 / rng.uniform(0.5, 1.5, r), u, u, u, u)
    t += 1e-3 * hermite.unpack(hermite.pack(rng.standard_normal((r,) * 4)), r, 4)  # noisy, not exactly orthogonal
    params = GParameters(mu=0.03, lam=20.0, beta_max=2.0, beta_min=0.7, noise=0.0)
    here = minimize_g(t.reshape(r * r, r * r), r, params, starts=2, seed=(5,), mapper=mapper(None))
    there = minimize_g(t.reshape(r * r, r * r), r, params, starts=2, seed=(5,), mapper=mapper(client))
    assert all(np.array_equal(a.b, b.b) and a.value == b.value for a, b in zip(here, there))


def test_streamed_route_never_forms_the_fourth_moment_and_recovers_the_net(tmp_path):
    """``--route stream`` (the paper's stochastic gradient of G on fresh samples): no extra pass, μ and λ
    checked against the β's of the rows found, machine precision after polish."""
    b, a = planted(8, 8, 1.0, seed=16)
    data = config(b, a, 1_000_000)
    out = str(tmp_path / "m.npz")
    res = api.fit(
        config_from_dict(data),
        str(tmp_path / "s"),
        "landscape",
        width=8,
        route="stream",
        out=out,
        client="local",
        progress=None,
    )
    rep = res["report"]
    assert res["passes"] == [] and rep["route"] == "stream" and rep["summary"]["conditions_held"]
    assert rep["summary"]["distinct_rows"] == 8 and rep["summary"]["converged"]
    assert row_angles(np.asarray(rep["before_polish"]["W0"]), b).max() <= 0.2
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(data))
    assert api.evaluate(out, cfg, samples=50_000)["parameter_error"] <= 1e-8
