"""The `moments` method end to end: estimate, spectral stage, enumeration, polish, evaluate."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.estimators.base import MissingStatisticError
from relulearn.network import Network

from conftest import relulearn


def planted_config(d: int, k: int, seed: int, samples: int, noise: float = 0.0) -> dict:
    return {
        "seed": seed,
        "samples": samples,
        "chunk_size": 25_000,
        "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": k, "seed": seed}, "noise_std": noise},
        "run": {"commit_interval": 1e9},
    }


@pytest.mark.parametrize("d,k", [(10, 1), (10, 3), (10, 5), (50, 2), (50, 4)])
def test_noiseless_planted_network_is_recovered_exactly(client, tmp_path, d, k):
    cfg = config_from_dict(planted_config(d, k, seed=d + k, samples=400_000))
    out = str(tmp_path / "model.npz")
    result = api.fit(cfg, str(tmp_path / "s.zarr"), "moments", width=k, out=out, client=client, progress=None)
    assert result["width"] == k
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(planted_config(d, k, seed=d + k, samples=400_000)))
    ev = api.evaluate(out, cfg_path, samples=100_000)
    assert ev["parameter_error"] <= 1e-8, ev
    assert ev["relative_test_error"] <= 1e-12, ev


def test_learn_refuses_a_store_without_the_needed_statistic(tmp_path):
    data = dict(planted_config(6, 2, seed=1, samples=50_000), statistics={"basic": {}})
    url = str(tmp_path / "basic.zarr")
    api.estimate(config_from_dict(data), url, client="local", progress=None)
    with pytest.raises(MissingStatisticError, match=r"contracted: \{orders: \[2, 4\], directions: 8\}"):
        api.learn(url, "moments", out=str(tmp_path / "m.npz"), client="local", progress=None)
    out = relulearn("learn", url, "--out", str(tmp_path / "m.npz"), "--in-process", "--json")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "contracted" in json.loads(out.stdout)["error"]


def test_evaluate_cli_against_a_network_file(tmp_path):
    rng = np.random.default_rng(0)
    u = rng.standard_normal((2, 5))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    teacher = Network((u, np.array([[1.0, -0.5]])))
    teacher.save(tmp_path / "t.npz")
    # the same network, rescaled and permuted: zero error up to symmetries
    Network((u[::-1] * 3.0, np.array([[-0.5 / 3.0, 1.0 / 3.0]]))).save(tmp_path / "m.npz")
    out = relulearn(
        "evaluate", str(tmp_path / "m.npz"), "--teacher", str(tmp_path / "t.npz"), "--samples", "20000", "--json"
    )
    assert out.returncode == 0, out.stderr
    ev = json.loads(out.stdout)
    assert ev["parameter_error"] < 1e-14 and ev["relative_test_error"] < 1e-28
    assert ev["matching"] == [1, 0]


def _hard_teacher(kind: str, d: int = 10) -> tuple[list, list]:
    rng = np.random.default_rng(0)
    u0 = rng.standard_normal(d)
    u0 /= np.linalg.norm(u0)
    v = rng.standard_normal(d)
    v -= (v @ u0) * u0
    v /= np.linalg.norm(v)
    w = rng.standard_normal(d)
    w -= (w @ u0) * u0 + (w @ v) * v
    w /= np.linalg.norm(w)
    if kind == "clump":  # two units 1e-2 rad apart (the paper's clumps)
        units, lam = [u0, np.cos(1e-2) * u0 + np.sin(1e-2) * v, w], [1.0, 0.8, -0.7]
    elif kind == "cancel":  # output weights that nearly cancel
        units, lam = [u0, np.cos(0.3) * u0 + np.sin(0.3) * v, w], [1.0, -0.98, 0.6]
    else:  # one unit with a 100x smaller output weight
        units, lam = [u0, v, w], [1.0, -0.01, 0.8]
    return [[float(t) for t in x] for x in units], lam


@pytest.mark.parametrize("kind", ["clump", "cancel", "small"])
def test_hard_cases(client, tmp_path, kind):
    units, lam = _hard_teacher(kind)
    data = {
        "seed": 1,
        "samples": 400_000,
        "chunk_size": 25_000,
        "source": {
            "d": 10,
            "teacher": {"kind": "one_hidden_relu", "width": 3, "weights": units, "output_weights": lam},
        },
        "run": {"commit_interval": 1e9},
    }
    out = str(tmp_path / "m.npz")
    result = api.fit(
        config_from_dict(data), str(tmp_path / "s.zarr"), "moments", width=3, out=out, client=client, progress=None
    )
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    ev = api.evaluate(out, tmp_path / "c.yaml", samples=100_000)
    assert ev["relative_test_error"] <= 1e-4, ev
    if result["width"] < 3:
        # the output says that units were merged, and evaluation names them
        assert "merged" in result["report"]["unresolved"]
        merged = ev["merged_teacher_units"]
        assert kind == "clump" and len(merged) == 1
        teacher_unit = merged[0]["teacher_unit"]
        assert teacher_unit in (0, 1) and merged[0]["angle"] < 0.05  # one of the clump, into its partner
    else:
        assert ev["parameter_error"] <= 1e-8


def test_noisy_labels_reach_the_noise_floor(client, tmp_path):
    data = planted_config(10, 3, seed=5, samples=400_000, noise=0.1)
    out = str(tmp_path / "m.npz")
    api.fit(config_from_dict(data), str(tmp_path / "s.zarr"), "moments", width=3, out=out, client=client, progress=None)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    ev = api.evaluate(out, tmp_path / "c.yaml", samples=400_000)
    # the test error includes the label noise: it cannot go below σ²/E[y²]
    assert ev["relative_test_error"] <= 1.1 * ev["noise_floor"], ev


def test_a_rank_the_noise_floor_cannot_support_is_reported(client, tmp_path):
    """Asking for 4 units of a 2-unit network: the subspace is not padded with noise directions."""
    data = planted_config(10, 2, seed=9, samples=200_000)
    result = api.fit(
        config_from_dict(data),
        str(tmp_path / "s.zarr"),
        "moments",
        width=4,
        out=str(tmp_path / "m.npz"),
        client=client,
        progress=None,
    )
    sub = result["report"]["subspace"]
    assert sub["rank"] == 2 and sub["supported"] is False
    assert "supports only 2 of the 4" in sub["message"]
    assert [p["name"] for p in result["passes"]] == ["adaptive-1"]  # it tried directions inside the subspace
    assert result["report"]["width_found"] == 2 and "4 units were requested" in result["report"]["unresolved"]


def test_fit_cli_without_statistics_section(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(planted_config(8, 2, seed=4, samples=200_000)))
    model = tmp_path / "m.npz"
    out = relulearn(
        "fit",
        str(cfg),
        "--store",
        str(tmp_path / "s.zarr"),
        "--width",
        "2",
        "--out",
        str(model),
        "--in-process",
        "--quiet",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["estimate"]["statistics"] == ["basic", "contracted"]  # the method's choice
    ev = api.evaluate(str(model), cfg, samples=50_000)
    assert ev["parameter_error"] <= 1e-8 and ev["relative_test_error"] <= 1e-12


def test_moments_from_a_sketch_runs_subspace_passes_and_recovers_exactly(client, tmp_path):
    """A store with only the sketch of M_2 (no d × d matrix): subspace passes on the same chunks, then exact."""
    data = dict(
        planted_config(24, 2, seed=5, samples=200_000), statistics={"basic": None, "sketch": {"rank": 16, "second": {}}}
    )
    out = str(tmp_path / "m.npz")
    result = api.fit(
        config_from_dict(data), str(tmp_path / "s.zarr"), "moments", width=2, out=out, client=client, progress=None
    )
    names = [p["name"] for p in result["passes"]]
    assert names[:2] == ["subspace-1", "subspace-2"] and len(names) <= 5
    sub = result["report"]["subspace"]
    assert sub["kind"] == "sketch" and sub["rank"] == 2 and sub["converged"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    ev = api.evaluate(out, tmp_path / "c.yaml", samples=50_000)
    assert ev["subspace_angle"] <= sub["angle_bound"]
    assert ev["parameter_error"] <= 1e-12, ev


def test_fit_chooses_the_sketch_when_the_dense_families_exceed_a_worker_budget():
    from relulearn.estimators.moments import entry as moments
    from relulearn.pipeline.plan import MemoryBudgetError, plan_families

    def plan(d, width, budget=4 * 2**30):
        return plan_families(d, moments.DENSE_FAMILIES, moments.sketch_rank(d, width), budget, k=width)

    assert not plan(2048, 5)["sketched"]  # 16·d²·17 bytes = 1.1 GB: dense
    assert plan(8192, 5)["sketched"] == ["contracted"]
    assert moments.required_statistics(8192, 5, sketched=True) == {"basic": None, "sketch": {"rank": 32, "second": {}}}
    assert moments.sketch_rank(8192, 30) == 38  # k + 8 columns
    with pytest.raises(MemoryBudgetError, match="needs 71,303,168 bytes"):
        plan(8192, 5, budget=10**6)


def test_estimate_refuses_statistics_larger_than_the_worker_memory_before_writing(tmp_path):
    data = dict(
        planted_config(64, 2, seed=1, samples=50_000),
        run={"worker_memory": 10**6},
        statistics={"basic": {}, "contracted": {"orders": [2, 4], "directions": 8}},
    )
    url = tmp_path / "s.zarr"
    with pytest.raises(ValueError, match=r"needs 1,1\d\d,\d\d\d bytes \(contracted: 1,0.*run.worker_memory: 1"):
        api.estimate(config_from_dict(data), str(url), client="local", progress=None)
    assert not url.exists()
