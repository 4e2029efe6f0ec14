"""``polynomial`` (Daniely–Srebro–Vardi 2023): the Hermite expansion read off stored moments, its
model file, ``predict``, the residual pass, shrinkage, the subspace route, and refusals.

Truths: for ``y = Σ λ_i relu(<u_i, x>)`` (unit u_i) the population truncation error has a closed form,
``1 − Σ_{l ≤ L} c_l² / l! · λᵀ R^{∘l} λ / E[y²]`` with ``R = (<u_i, u_j>)`` and ``E[y²]`` from the arc-cosine
kernel, and the learned expansion's test error is that tail plus ``Σ_l ‖T̂_l − T_l‖² / l!``, whose
expectation is the predicted variance of the report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from relulearn import api, hermite
from relulearn.config import config_from_dict
from relulearn.estimators.polynomial import entry as polynomial
from relulearn.network import Network, NetworkFileError
from relulearn.pipeline.sources import Stream, draw, make_source
from relulearn.polynomial import PolynomialModel, load_model
from relulearn.storage import open_store

from conftest import relulearn as _cli


def one_hidden(d: int, width: int, n: int, seed: int = 1, run_seed: int = 5) -> dict:
    return {
        "seed": run_seed,
        "samples": n,
        "chunk_size": 50_000,
        "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": width, "seed": seed}},
        "run": {"commit_interval": 0},
    }


def population_tail(net: Network, degree: int) -> np.ndarray:
    """Closed-form ``1 − Σ_{l ≤ L} ‖T_l‖²/(l! E[y²])`` for L = 0..degree, one hidden ReLU layer."""
    u, lam = net.weights[0], net.weights[1][0]
    norms = np.linalg.norm(u, axis=1)
    u, lam = u / norms[:, None], lam * norms
    r = np.clip(u @ u.T, -1.0, 1.0)
    ey2 = lam @ ((np.sqrt(1 - r**2) + (np.pi - np.arccos(r)) * r) / (2 * np.pi)) @ lam
    parts = [hermite.relu_hermite_coefficient(l) ** 2 / math.factorial(l) * lam @ r**l @ lam for l in range(degree + 1)]
    return 1.0 - np.cumsum(parts) / ey2


def test_expansion_terms_match_the_hermite_tensor_definition_on_a_subspace(tmp_path):
    rng = np.random.default_rng(0)
    d, r, top = 7, 3, 4
    basis = np.linalg.qr(rng.standard_normal((d, r)))[0].T
    tensors = []
    for l in range(top + 1):
        t = rng.standard_normal((r,) * l)
        full = sum(np.transpose(t, p) for p in __import__("itertools").permutations(range(l))) if l > 1 else t
        tensors.append(hermite.pack(np.asarray(full)))
    model = PolynomialModel(tuple(tensors), d, basis)
    x = rng.standard_normal((5, d))
    z = x @ basis.T
    ref = np.array(
        [
            [
                float(np.sum(hermite.unpack(tensors[l], r, l) * hermite.hermite_tensor(zi, l))) / math.factorial(l)
                for l in range(top + 1)
            ]
            for zi in z
        ]
    )
    assert np.allclose(model.terms(x), ref, rtol=1e-12, atol=1e-12)
    assert np.allclose(model.forward(x)[:, 0], ref.sum(axis=1), rtol=1e-12, atol=1e-12)
    # the file round-trips bit for bit, and a network reader names the kind
    path = tmp_path / "model.npz"
    model.save(path)
    back = load_model(path)
    assert isinstance(back, PolynomialModel) and back.degree == top
    assert all(np.array_equal(a, b) for a, b in zip(back.tensors, model.tensors))
    assert np.array_equal(back.basis, basis)
    with pytest.raises(NetworkFileError, match="polynomial model, not a network"):
        Network.load(path)


def test_test_error_is_the_closed_form_tail_plus_the_predicted_variance(tmp_path):
    cfg = config_from_dict(one_hidden(8, 4, 400_000))
    out = str(tmp_path / "m.npz")
    res = api.fit(
        cfg, str(tmp_path / "s"), "polynomial", degree=4, shrink="none", out=out, client="local", progress=None
    )
    rep = res["report"]
    assert res["kind"] == "polynomial" and res["degree"] == 4 and rep["residual"]
    assert [p["name"] for p in res["passes"]] == ["residual-hermite"]
    assert open_store(str(tmp_path / "s")).arrays("hermite").keys() >= {"T0", "T1", "T2"}
    assert "T3" not in open_store(str(tmp_path / "s")).arrays("hermite")  # the pass estimates T_3, T_4 once
    model = load_model(out)
    source = make_source(cfg)
    x, y = draw(source, cfg.seed, Stream.TEST, 400_000)
    err = (y[:, None] - np.cumsum(model.terms(x), axis=1)) ** 2
    ey2 = np.mean(y**2)
    test, se = err.mean(axis=0) / ey2, err.std(axis=0) / np.sqrt(len(y)) / ey2
    expected = population_tail(source.network, 4) + np.array(rep["predicted_variance"])
    # the excess Σ‖ΔT_l‖²/l! fluctuates around its mean by about sqrt(2 / entries) of it
    entries = np.array([math.comb(8 + l, l) for l in range(5)])
    tol = 4 * (se + np.array(rep["predicted_variance"]) * np.sqrt(2 / entries))
    assert np.all(np.abs(test - expected) <= tol), (test, expected, tol)
    # odd orders ≥ 3 of a ReLU layer vanish: degree 3 adds nothing beyond its variance
    assert abs(test[3] - test[2]) <= tol[3]


def test_residual_pass_keeps_the_means_and_cuts_the_errors(tmp_path):
    # raw T_3, T_4 stored too (fit itself would store T_0..T_2 only: the pass estimates the rest)
    cfg = config_from_dict(dict(one_hidden(8, 4, 400_000), statistics={"basic": {}, "hermite": {"max_order": 4}}))
    res = api.fit(
        cfg, str(tmp_path / "s"), "polynomial", degree=4, out=str(tmp_path / "m.npz"), client="local", progress=None
    )
    main = open_store(str(tmp_path / "s")).arrays("hermite")
    resid = open_store(res["passes"][0]["store"]).arrays("hermite")
    for l in (3, 4):
        a, sa = np.asarray(main[f"T{l}"]), np.asarray(main[f"T{l}_se"])
        b, sb = np.asarray(resid[f"T{l}"]), np.asarray(resid[f"T{l}_se"])
        assert np.median(sb / sa) < 0.5  # variance falls with E[(y − P≤2 y)²] (about 4 % of E[y²] here)
        # same samples, so the difference is the control variate's own error: below the raw run's SE on average
        # (SEs from 8 chunks make each ratio t-distributed with 7 degrees of freedom: E[t²] = 1.4)
        assert np.sqrt(np.mean(((a - b) / sa) ** 2)) < 1.5
    # closed form T_3 = 0 and T_4 = c_4 Σ λ_i u_i^{⊗4}: the residual estimates are off by about one SE
    net = make_source(cfg).network
    u, lam = net.weights[0], net.weights[1][0]
    t4 = hermite.relu_hermite_coefficient(4) * np.einsum("i,ia,ib,ic,id->abcd", lam, u, u, u, u)
    for l, truth in ((3, 0.0), (4, hermite.pack(t4))):
        z = (np.asarray(resid[f"T{l}"]) - truth) / np.asarray(resid[f"T{l}_se"])
        assert np.sqrt(np.mean(z**2)) < 1.5, l


def test_order_shrinkage_removes_a_pure_noise_order_and_never_costs_more(tmp_path):
    cfg = config_from_dict(one_hidden(8, 4, 200_000))
    fits = {
        s: api.fit(
            cfg,
            str(tmp_path / "s"),
            "polynomial",
            degree=4,
            shrink=s,
            out=str(tmp_path / f"{s}.npz"),
            client="local",
            progress=None,
        )
        for s in ("none", "order")
    }
    # T_3 = 0 for a ReLU layer: its James–Stein factor max(0, 1 − V_3/‖T̂_3‖²) is near 0
    se3 = np.asarray(open_store(fits["none"]["passes"][0]["store"]).arrays("hermite")["T3_se"])
    t3 = load_model(str(tmp_path / "none.npz")).tensors[3]
    mult = hermite.multiplicities(8, 3)
    factor = max(0.0, 1.0 - float(mult @ se3**2) / float(mult @ t3**2))
    assert fits["order"]["report"]["shrink_factors"][3] == pytest.approx(factor, rel=1e-12)
    assert factor < 0.5
    x, y = draw(make_source(cfg), cfg.seed, Stream.TEST, 200_000)
    errs = {s: float(np.mean((y - load_model(str(tmp_path / f"{s}.npz")).forward(x)[:, 0]) ** 2)) for s in fits}
    assert errs["order"] <= errs["none"]


def test_degree_is_chosen_on_held_out_samples(tmp_path):
    cfg = config_from_dict(one_hidden(6, 3, 100_000, seed=4))
    res = api.fit(cfg, str(tmp_path / "s"), "polynomial", out=str(tmp_path / "m.npz"), client="local", progress=None)
    rep = res["report"]
    assert rep["degree_chosen_by"] == "held-out error"
    assert rep["degrees"] == [0, 1, 2, 3, 4]  # fit estimates up to DEFAULT_DEGREE
    assert rep["degree"] == int(np.argmin(rep["held_out_error"])) == load_model(str(tmp_path / "m.npz")).degree


def test_subspace_route_finds_the_first_layer_and_beats_the_full_expansion(tmp_path):
    data = {
        "seed": 2,
        "samples": 300_000,
        "chunk_size": 50_000,
        "source": {"d": 16, "teacher": {"kind": "deep_relu", "widths": [2, 4], "seed": 1}},
        "run": {"commit_interval": 0},
    }
    cfg = config_from_dict(data)
    sub = api.fit(
        cfg,
        str(tmp_path / "a"),
        "polynomial",
        subspace=True,
        degree=4,
        out=str(tmp_path / "a.npz"),
        client="local",
        progress=None,
    )
    assert [p["name"] for p in sub["passes"]] == ["projected-hermite"]
    model = load_model(str(tmp_path / "a.npz"))
    # the two rows of W_0, and perhaps T_1's part off the estimated pair (it lies in the row space too)
    assert model.dim == sub["subspace_rank"] and 2 <= model.dim <= 3
    w0 = make_source(cfg).network.weights[0]
    q = np.linalg.qr(w0.T)[0]
    cosines = np.linalg.svd(q.T @ model.basis.T, compute_uv=False)  # the row space lies inside the found span
    # within the spectral stage's own error bar (Davis–Kahan / Wedin from the noise floors)
    assert np.arccos(np.clip(cosines.min(), -1, 1)) <= sub["report"]["subspace"]["spectral"]["angle_bound"]
    full = api.fit(
        cfg, str(tmp_path / "b"), "polynomial", degree=4, out=str(tmp_path / "b.npz"), client="local", progress=None
    )
    x, y = draw(make_source(cfg), cfg.seed, Stream.TEST, 200_000)
    err = {k: float(np.mean((y - load_model(str(tmp_path / f"{k}.npz")).forward(x)[:, 0]) ** 2)) for k in "ab"}
    # the same degree with at most 35 instead of 4,845 entries: the variance term all but vanishes
    assert err["a"] < err["b"]
    assert sub["report"]["predicted_variance"][4] < 0.05 * full["report"]["predicted_variance"][4]


def test_fit_gives_the_same_model_bits_in_process_and_on_two_workers(tmp_path, client):
    cfg = config_from_dict(dict(one_hidden(20, 3, 100_000), run={"commit_interval": 0, "chunks_per_block": 1}))
    models = []
    for where, c in (("local", "local"), ("cluster", client)):
        out = str(tmp_path / f"{where}.npz")
        api.fit(cfg, str(tmp_path / where), "polynomial", degree=3, out=out, client=c, progress=None)
        models.append(load_model(out))
    assert all(np.array_equal(a, b) for a, b in zip(models[0].tensors, models[1].tensors))


def test_predict_cli_evaluates_both_model_kinds(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 5))
    np.save(tmp_path / "x.npy", x)
    net = Network((rng.standard_normal((3, 5)), rng.standard_normal((1, 3))))
    net.save(tmp_path / "net.npz")
    poly = PolynomialModel(tuple(rng.standard_normal(math.comb(5 + l - 1, l)) for l in range(4)), 5)
    poly.save(tmp_path / "poly.npz")
    for name, model in (("net", net), ("poly", poly)):
        r = _cli(
            "predict",
            str(tmp_path / f"{name}.npz"),
            "--input",
            str(tmp_path / "x.npy"),
            "--out",
            str(tmp_path / f"{name}.npy"),
            "--json",
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["kind"] == ("network" if name == "net" else "polynomial")
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), model.forward(x)[:, 0])
    np.save(tmp_path / "bad.npy", x[:, :4])
    r = _cli(
        "predict", str(tmp_path / "poly.npz"), "--input", str(tmp_path / "bad.npy"), "--out", str(tmp_path / "y.npy")
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "have 4 columns" in r.stderr and "d = 5" in r.stderr
    assert not (tmp_path / "y.npy").exists()


def test_bad_degrees_are_refused_with_what_to_do(tmp_path):
    store = str(tmp_path / "s")
    data = dict(one_hidden(6, 2, 100_000), statistics={"basic": {}, "hermite": {"max_order": 3}})
    api.estimate(config_from_dict(data), store, client="local", progress=None)
    with pytest.raises(ValueError, match=r"has T_0..T_3(.|\n)*hermite: \{max_order: 5\}"):
        api.learn(store, "polynomial", degree=5, residual=False, client="local", progress=None)
    # too large for d: the entry count, the limit and the largest degree that fits
    big = dict(one_hidden(50, 2, 100_000))
    with pytest.raises(
        polynomial.DegreeError,
        match=r"32,468,436 packed entries.*2,000,000.*largest degree that fits "
        r"is 4",
    ):
        api.fit(config_from_dict(big), str(tmp_path / "b"), "polynomial", degree=6, client="local", progress=None)
    assert not (tmp_path / "b").exists()  # refused before anything was written
    with pytest.raises(polynomial.DegreeError, match="largest order 8"):
        polynomial.check_degree(8, 9)
    polynomial.check_degree(8, 8)  # at d = 8, degree 8 fits (12,870 entries)
    with pytest.raises(ValueError, match="--width does not apply"):
        api.learn(store, "polynomial", width=3, client="local", progress=None)
    r = _cli(
        "learn",
        store,
        "--method",
        "polynomial",
        "--degree",
        "5",
        "--no-residual",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "max_order: 5" in r.stderr
