"""The `filtered-pca` method end to end: filtered PCA, candidate networks on the found
subspace, residual-filtered passes, lift and polish, through the real LocalCluster."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from closeness import check_within

from relulearn import api, open_store
from relulearn.config import config_from_dict
from relulearn.estimators.base import MissingStatisticError
from relulearn.estimators.filtered_pca.deepfit import CandidateBudgetError
from relulearn.estimators.filtered_pca.entry import QUANTILES
from relulearn.estimators.spectral import stage as spectral
from relulearn.estimators.spectral.stored_matrices import FilterGridError, filtered_matrices, matrices_from_store
from relulearn.estimators.spectral.subspace_geometry import principal_angles
from relulearn.network import Network, compare, subspace_angle
from relulearn.pipeline.sources import make_source

from conftest import relulearn as _cli


def vanishing_network(d: int, seed: int = 0) -> tuple[Network, np.ndarray]:
    """``y = ||z1| − |z2|| − (√2 − 1)(|z1| + |z2|)``, ``z = U x`` (orthonormal rows U).

    A depth-2 ReLU network whose first and second Hermite moments vanish exactly: it is
    even (so ``T_1 = 0``), and in polar coordinates ``E[||z1|−|z2|| (z1² − 1)] =
    √(2/π)(√2 − 1)``, which the ``|z1| + |z2|`` term (``T_2 = √(2/π) u uᵀ`` per ``|<u,x>|``)
    cancels: ``E[y (xxᵀ − I)] = 0``.
    """
    rng = np.random.default_rng(seed)
    u = np.linalg.qr(rng.standard_normal((d, 2)))[0].T
    w0 = np.vstack([u[0], -u[0], u[1], -u[1]])  # relu(±z1), relu(±z2): |z1| and |z2|
    w1 = np.array([[1.0, 1, -1, -1], [-1, -1, 1, 1], [1, 1, 1, 1]])  # relu(|z1|−|z2|), relu(|z2|−|z1|), |z1|+|z2|
    w2 = np.array([[1.0, 1.0, -(math.sqrt(2.0) - 1.0)]])
    return Network((w0, w1, w2)), u


@pytest.mark.slow
def test_vanishing_moments_network(client, tmp_path):
    """M_2 = E[y(xxᵀ − I)] is zero (checked against its SE) and its spectrum has nothing
    above the noise floor, while filtered PCA recovers the 2-dimensional subspace."""
    d = 20
    net, u = vanishing_network(d)
    net.save(tmp_path / "t.npz")
    cfg = config_from_dict(
        {
            "seed": 3,
            "samples": 200_000,
            "chunk_size": 20_000,
            "source": {"d": d, "teacher": {"file": str(tmp_path / "t.npz")}},
            "statistics": {
                "basic": {},
                "contracted": {"orders": [2], "directions": 1},
                "filtered": {"quantiles": QUANTILES},
            },
            "run": {"commit_interval": 1e9},
        }
    )
    url = str(tmp_path / "s.zarr")
    api.estimate(cfg, url, client=client, progress=None)
    run = open_store(url)
    mats, ses, _ = matrices_from_store(run.arrays("contracted"), orders=[2])
    check_within("M_2 of the vanishing network", mats[0], ses[0], np.zeros((d, d)))
    m2 = spectral.relevant_subspace(mats, ses, names=["M_2"])
    assert m2.rank == 0, m2.message  # the correlational stage finds nothing

    result = api.learn(url, "filtered-pca", depth=2, width=4, out=str(tmp_path / "m.npz"), client=client, progress=None)
    step0 = result["report"]["steps"][0]
    assert step0["pass"] == "filtered" and step0["added"] == 2
    basis = np.asarray(result["report"]["subspace"]["basis"])
    # residual passes may add the directions by which the estimated subspace misses V
    assert basis.shape[0] == d and basis.shape[1] >= 2
    assert principal_angles(u.T, basis).max() <= 0.05
    learned = Network.load(tmp_path / "m.npz")
    x = np.random.default_rng(1).standard_normal((20_000, d))
    assert subspace_angle(net, learned, x) <= 0.05
    # the deep refinement streamed the store's samples and was checked on the validation samples
    refinement = result["report"]["refinement"]
    assert refinement["samples"] == 200_000 and refinement["passes"] >= 2 and isinstance(refinement["kept"], bool)
    # the held-out losses are reported per network: the enumeration's and the refined one, which differ by the
    # verdict's paired change (both relative to the same mean(y²)); the chosen one is the network returned
    losses = result["report"]["validation_relative_loss"]
    assert set(losses) == {"enumeration", "refined"}
    change = losses["refined"] - losses["enumeration"]
    assert change == pytest.approx(refinement["validation_relative_loss_change"], rel=1e-9, abs=1e-15)
    assert result["report"]["chosen"] == ("refined" if refinement["kept"] else "enumeration")


def deep_config(d: int, widths: list[int], seed: int, samples: int) -> dict:
    return {
        "seed": seed,
        "samples": samples,
        "chunk_size": 50_000,
        "source": {"d": d, "teacher": {"kind": "deep_relu", "widths": widths, "seed": seed}},
        "run": {"commit_interval": 1e9},
    }


@pytest.mark.slow
def test_deep_teacher_subspace_and_test_error(client, tmp_path):
    """A depth-2 teacher (first layer 3 rows, then 6) in d = 30, learned with `fit` from a
    config without statistics: angle ≤ 0.05 rad, relative test error ≤ 1e-2."""
    data = deep_config(30, [3, 6], seed=2, samples=2_000_000)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    out = str(tmp_path / "m.npz")
    # width 6: the ladder {3, 6} holds the teacher's widths (width 8 fits 1.5x the candidates' weights);
    # no deep refinement here (the vanishing-moments test and test_deepstream.py run it): the angle and
    # test error below are those of filtered PCA, residual passes and candidates alone
    result = api.fit(
        config_from_dict(data),
        str(tmp_path / "s.zarr"),
        "filtered-pca",
        depth=2,
        width=6,
        out=out,
        client=client,
        progress=None,
        refine_samples=0,
    )
    assert result["report"]["refinement"] == {"skipped": "refine_samples is 0"}
    # the candidates of depth 1 and 2 were enumerated; the chosen one is the network written out
    assert result["report"]["depth"] == 2 and 1 <= result["depth"] <= 2
    assert result["report"]["architecture"] == [int(w.shape[0]) for w in Network.load(out).weights[:-1]]
    ev = api.evaluate(out, tmp_path / "c.yaml", samples=100_000)
    assert ev["subspace_angle"] <= 0.05, (ev, result["report"]["steps"])
    assert ev["relative_test_error"] <= 1e-2, (ev, result["report"].get("candidates"))


@pytest.mark.slow
def test_depth_one_agrees_with_moments(client, tmp_path):
    """A one-hidden-layer teacher learned by `filtered-pca --depth 1` and by `moments` is the
    same network up to symmetries (both after polish), and equal to the teacher."""
    d, k = 10, 3
    data = {
        "seed": 4,
        "samples": 600_000,
        "chunk_size": 25_000,
        "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": k, "seed": 4}},
        "statistics": {
            "basic": {},
            "contracted": {"orders": [2, 4], "directions": 8},
            "filtered": {"quantiles": QUANTILES},
        },
        "run": {"commit_interval": 1e9},
    }
    url = str(tmp_path / "s.zarr")
    api.estimate(config_from_dict(data), url, client=client, progress=None)
    api.learn(url, "moments", width=k, out=str(tmp_path / "a.npz"), client=client, progress=None)
    r = api.learn(url, "filtered-pca", depth=1, width=k, out=str(tmp_path / "b.npz"), client=client, progress=None)
    a, b = Network.load(tmp_path / "a.npz"), Network.load(tmp_path / "b.npz")
    assert compare(a, b).relative_error <= 1e-8, r["report"]
    assert compare(make_source(config_from_dict(data)).network, b).relative_error <= 1e-8


@pytest.mark.slow
def test_fit_on_a_sketch_runs_subspace_passes_and_recovers_exactly(client, tmp_path):
    """Dense M_τ over the worker budget: `fit` sketches them, runs subspace passes on the same chunks
    (all τ at once), finds the dense path's subspace and recovers a one-hidden-layer teacher exactly."""
    d, k = 60, 3
    data = {
        "seed": 6,
        "samples": 400_000,
        "chunk_size": 50_000,
        "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": k, "seed": 6}},
        # dense basic + 7 M_τ take 460,800 bytes; with the M_τ sketched at r = 32, 272,640
        "run": {"commit_interval": 1e9, "worker_memory": 300_000},
    }
    out = str(tmp_path / "m.npz")
    result = api.fit(
        config_from_dict(data),
        str(tmp_path / "s.zarr"),
        "filtered-pca",
        depth=1,
        width=k,
        out=out,
        client=client,
        progress=None,
    )
    assert result["statistics_plan"]["sketched"] == ["filtered"]
    # the subspace passes of the M_τ come first (residual rounds may follow while the enumeration's
    # held-out loss is above the target, as residual passes do on the dense path)
    steps = [s for s in result["report"]["steps"] if not s["pass"].startswith("residual-")]
    assert [s["pass"] for s in steps] == [f"subspace-{i + 1}" for i in range(len(steps))]
    assert result["report"]["steps"][: len(steps)] == steps
    assert 2 <= len(steps) <= 5 and steps[-1]["converged"] and steps[-1]["rank"] == k
    teacher = make_source(config_from_dict(data)).network
    assert compare(teacher, Network.load(out)).relative_error <= 1e-8, result["report"]
    # the dense M_τ of the same chunks: their significant span is the one the passes found
    dense = dict(data, statistics={"basic": None, "filtered": {"quantiles": QUANTILES}}, run={"commit_interval": 1e9})
    url = str(tmp_path / "dense.zarr")
    api.estimate(config_from_dict(dense), url, client=client, progress=None)
    mats, ses, names, _ = filtered_matrices(open_store(url).arrays("filtered"), "M_tau", "")
    sub = spectral.relevant_subspace(mats, ses, names=names)
    found = np.asarray(result["report"]["subspace"]["basis"])[:, :k]  # residual rounds append their directions
    truth = teacher.weights[0].T
    assert sub.rank == found.shape[1] == k
    to_truth = principal_angles(truth, sub.basis).max()
    assert principal_angles(sub.basis, found).max() <= 0.1 * to_truth, to_truth


@pytest.mark.slow
def test_residual_rounds_on_a_sketch_extend_the_subspace(client, tmp_path):
    """A deep teacher with the M_τ sketched (dense over the worker budget): after the subspace passes
    `fit` asks for residual rounds in sketch form (a sketch of the best candidate's residual-filtered
    matrices, then their subspace passes on the same chunks) until one adds nothing or the held-out
    loss is below the target; the answer meets the dense path's bounds (angle ≤ 0.05 rad, test
    error ≤ 1e-2)."""
    data = dict(
        deep_config(60, [3, 6], seed=2, samples=200_000), run={"commit_interval": 1e9, "worker_memory": 300_000}
    )
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    out = str(tmp_path / "m.npz")
    # candidates of width up to 4, narrower than the teacher's second layer (as a user may pick): the rounds and
    # the bounds are the same as with width 6 (test_deep_teacher_subspace_and_test_error runs that ladder), at a
    # third of the enumeration's cost (26 s against 82 s for this fit on 2 workers)
    result = api.fit(
        config_from_dict(data),
        str(tmp_path / "s.zarr"),
        "filtered-pca",
        depth=2,
        width=4,
        out=out,
        client=client,
        progress=None,
        refine_samples=0,
    )
    assert result["statistics_plan"]["sketched"] == ["filtered"]
    names = [p["name"] for p in result["passes"]]
    assert names[0] == "subspace-1" and "residual-1" in names and "residual-1-subspace-1" in names, names
    rep = result["report"]
    rounds = [s for s in rep["steps"] if s["pass"].startswith("residual-") and "subspace" not in s["pass"]]
    first = [s for s in rep["steps"] if s["pass"].startswith("subspace-")][-1]["added"]
    assert rounds and rep["subspace"]["rank"] == first + sum(s["added"] for s in rounds)
    assert rep["stop_reason"].startswith(("held-out residual loss", "the last residual round")), rep["stop_reason"]
    ev = api.evaluate(out, tmp_path / "c.yaml", samples=100_000)
    assert ev["subspace_angle"] <= 0.05, (ev, rep["steps"])
    assert ev["relative_test_error"] <= 1e-2, (ev, rep.get("candidates"))


# ------------------------------------------------------------------ bad input


def _store(tmp_path, statistics: dict, samples: int = 100_000) -> str:
    data = dict(deep_config(8, [2, 3], seed=1, samples=samples), statistics=statistics, chunk_size=10_000)
    url = str(tmp_path / "s.zarr")
    api.estimate(config_from_dict(data), url, client="local", progress=None)
    return url


def test_no_sample_passes_the_filter(tmp_path):
    url = _store(tmp_path, {"basic": {}, "filtered": {"thresholds": [1e3, 1e4]}})
    with pytest.raises(FilterGridError, match=r"no sample passed the filter.*τ = 1000, 1e\+04.*thresholds"):
        api.learn(url, "filtered-pca", out=str(tmp_path / "m.npz"), client="local", progress=None)
    out = _cli("learn", url, "--method", "filtered-pca", "--out", str(tmp_path / "m.npz"), "--in-process", "--json")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "lower statistics.filtered.thresholds" in json.loads(out.stdout)["error"].lower()
    assert not (tmp_path / "m.npz").exists()


def test_store_without_filtered_matrices(tmp_path):
    url = _store(tmp_path, {"basic": {}}, samples=20_000)
    with pytest.raises(MissingStatisticError, match=r"filtered: \{quantiles: \["):
        api.learn(url, "filtered-pca", out=str(tmp_path / "m.npz"), client="local", progress=None)


def test_candidate_budget_is_checked_before_any_work(tmp_path):
    url = _store(tmp_path, {"basic": {}, "filtered": {"quantiles": QUANTILES}})
    with pytest.raises(
        CandidateBudgetError, match=r"--depth 10 --width 64 gives \d+ candidates .* over the budget of 256"
    ):
        api.learn(url, "filtered-pca", depth=10, width=64, out=str(tmp_path / "m.npz"), client="local", progress=None)
    out = _cli(
        "learn",
        url,
        "--method",
        "filtered-pca",
        "--depth",
        "3",
        "--width",
        "16",
        "--budget",
        "10",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "raise --budget" in out.stderr
    assert not (tmp_path / "s.zarr" / "passes").exists()


def test_depth_is_refused_for_moments(tmp_path):
    out = _cli(
        "learn",
        str(tmp_path / "nowhere.zarr"),
        "--method",
        "moments",
        "--depth",
        "2",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
    )
    assert out.returncode == 2 and "--depth applies to --method filtered-pca only" in out.stderr


def test_fit_cli_json(tmp_path):
    """`relulearn fit CONFIG --method filtered-pca --depth 1 --json` from a config without a
    statistics section: the method's statistics, the JSON report, an exact network."""
    data = {
        "seed": 2,
        "samples": 300_000,
        "chunk_size": 25_000,
        "source": {"d": 8, "teacher": {"kind": "one_hidden_relu", "width": 2, "seed": 2}},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    out = _cli(
        "fit",
        str(tmp_path / "c.yaml"),
        "--store",
        str(tmp_path / "s.zarr"),
        "--method",
        "filtered-pca",
        "--depth",
        "1",
        "--width",
        "2",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
        "--quiet",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["method"] == "filtered-pca" and res["depth"] == 1 and res["width"] == 2
    assert res["report"]["steps"][0]["pass"] == "filtered" and res["report"]["subspace"]["rank"] >= 2
    assert open_store(str(tmp_path / "s.zarr")).statistics == ["basic", "filtered"]
    ev = json.loads(_cli("evaluate", str(tmp_path / "m.npz"), "--teacher", str(tmp_path / "c.yaml"), "--json").stdout)
    assert ev["parameter_error"] <= 1e-8 and ev["subspace_angle"] <= 1e-8
