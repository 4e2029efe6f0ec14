"""``relulearn fit/learn --method exact`` and ``exact-arbitrary`` end to end: real stores, the real
pipeline, a real LocalCluster for the mapped refinement; exact recoveries, bitwise equalities and
refusals that leave nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pytest

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.network import Network, compare_two_layer
from relulearn.pipeline.sources import make_source

from conftest import relulearn as cli


def two_layer(
    d: int, k: int, m: int, activation: str = "relu", *, n: int = 200_000, sigma: float = 0.0, seed: int = 4, **teacher
) -> dict:
    return {
        "seed": seed,
        "samples": n,
        "chunk_size": 25_000,
        "source": {
            "d": d,
            "noise_std": sigma,
            "teacher": {
                "kind": "two_layer",
                "width": k,
                "outputs": m,
                "activation": activation,
                "weights_seed": seed,
                "v_norms": [0.5, 2.0],
                **teacher,
            },
        },
        "run": {"commit_interval": 0},
    }


@pytest.mark.parametrize("activation", ["relu", "relu2", "relu3"])
def test_fit_exact_recovers_planted_two_layer_networks_to_machine_precision(tmp_path, activation):
    data = two_layer(20, 4, 5, activation)
    out = str(tmp_path / "model.npz")
    res = api.fit(config_from_dict(data), str(tmp_path / "s.zarr"), "exact", out=out, client="local", progress=None)
    assert res["report"]["path"] == "tensor"
    assert res["report"]["check"]["exact"] is True  # checked on fresh samples, and said so
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(data))
    ev = api.evaluate(out, cfg_path, samples=50_000)
    assert ev["parameter_error"] <= 1e-12, ev
    assert ev["relative_test_error"] <= 1e-20, ev
    assert len(ev["relative_test_error_per_output"]) == 5 and max(ev["relative_test_error_per_output"]) <= 1e-20
    assert Network.load(out).activation == activation


def test_rank_deficient_teacher_takes_the_fixed_parameter_path(tmp_path):
    data = two_layer(12, 6, 3, "relu", output_rank=3)
    teacher = make_source(config_from_dict(data)).network
    u = teacher.weights[1]
    assert np.linalg.matrix_rank(u) == 3 and np.allclose(u[:, -1], -u[:, 0])  # a pair (u, −u)
    out = str(tmp_path / "model.npz")
    res = api.fit(config_from_dict(data), str(tmp_path / "s.zarr"), "exact", out=out, client="local", progress=None)
    assert res["report"]["path"] == "fixed-parameter"
    assert compare_two_layer(teacher, Network.load(out)).relative_error <= 1e-12


def test_noisy_refinement_is_bitwise_equal_in_process_and_on_two_workers(client, tmp_path):
    """The refinement maps its sample parts over the cluster; the sums are taken in part order, so
    the learned network does not depend on where the parts ran (d = 20: BLAS really runs)."""
    data = two_layer(20, 3, 4, "relu", n=100_000, sigma=0.05)
    store = str(tmp_path / "s.zarr")
    api.estimate(
        config_from_dict(dict(data, statistics={"basic": {}, "output_moments": {}})),
        store,
        client="local",
        progress=None,
    )
    nets = []
    for where, c in (("local", "local"), ("cluster", client)):
        out = str(tmp_path / f"{where}.npz")
        res = api.learn(store, "exact", out=out, client=c, progress=None)
        assert len(res["report"]["refinement"]["iterations"]) >= 1, res["report"]["refinement"]
        nets.append(Network.load(out))
    for a, b in zip(nets[0].weights, nets[1].weights):
        assert np.array_equal(a, b)
    teacher = make_source(config_from_dict(data)).network
    assert compare_two_layer(teacher, nets[0]).relative_error < 0.05


@pytest.mark.parametrize(
    "teacher, needle",
    [
        ("tanh", "not rectified"),
        ("deep", "two-layer"),
    ],
)
def test_fit_exact_refuses_teachers_outside_the_papers_setting_before_writing(tmp_path, teacher, needle):
    rng = np.random.default_rng(0)
    if teacher == "tanh":
        Network((rng.standard_normal((3, 8)), rng.standard_normal((4, 3))), activation="tanh").save(tmp_path / "t.npz")
    else:
        Network((rng.standard_normal((3, 8)), rng.standard_normal((3, 3)), rng.standard_normal((4, 3)))).save(
            tmp_path / "t.npz"
        )
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("seed: 1\nsamples: 50000\nchunk_size: 25000\nsource: {d: 8, teacher: {file: t.npz}}\n")
    proc = cli(
        "fit",
        str(cfg),
        "--store",
        str(tmp_path / "s.zarr"),
        "--method",
        "exact",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in proc.stderr, proc.stderr
    assert not (tmp_path / "s.zarr").exists() and not (tmp_path / "m.npz").exists()


def test_scalar_methods_refuse_vector_labels(tmp_path):
    data = two_layer(8, 2, 3, n=50_000)
    store = str(tmp_path / "s.zarr")
    api.estimate(
        config_from_dict(dict(data, statistics={"basic": {}, "contracted": {}})), store, client="local", progress=None
    )
    with pytest.raises(ValueError, match="3 outputs.*source.output"):
        api.learn(store, "moments", client="local", progress=None)


def test_too_few_exact_samples_is_refused_with_the_number_needed(tmp_path):
    data = two_layer(12, 6, 3, "relu", output_rank=3, n=50_000)
    store = str(tmp_path / "s.zarr")
    api.estimate(
        config_from_dict(dict(data, statistics={"basic": {}, "output_moments": {}})),
        store,
        client="local",
        progress=None,
    )
    proc = cli(
        "learn",
        store,
        "--method",
        "exact",
        "--width",
        "6",
        "--exact-samples",
        "500",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
        "--json",
    )
    assert proc.returncode == 2, proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert "500" in err and "5632 samples are needed" in err, err
    assert not (tmp_path / "m.npz").exists()
    # fit knows the width and the outputs before estimating: refused before anything is written
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(data))
    proc = cli(
        "fit",
        str(cfg),
        "--store",
        str(tmp_path / "new.zarr"),
        "--method",
        "exact",
        "--width",
        "6",
        "--exact-samples",
        "500",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
    )
    assert proc.returncode == 2 and "5632 samples are needed" in proc.stderr, proc.stderr
    assert not (tmp_path / "new.zarr").exists() and not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize("k", [2, 3])
def test_exact_arbitrary_cli_on_cube_inputs(tmp_path, k):
    rng = np.random.default_rng(k)
    x = rng.uniform(-1.0, 1.0, size=(300, 5))
    teacher = Network((rng.standard_normal((k, 5)), rng.standard_normal((k + 1, k))), activation="relu")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "a.npy", teacher.forward(x))
    proc = cli(
        "exact-arbitrary",
        str(tmp_path / "x.npy"),
        str(tmp_path / "a.npy"),
        "--width",
        str(k),
        "--out",
        str(tmp_path / "m.npz"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["relative_error"] <= 1e-20
    assert compare_two_layer(teacher, Network.load(tmp_path / "m.npz")).relative_error <= 1e-12


def test_exact_arbitrary_cli_names_bad_files(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((10, 3)))
    np.save(tmp_path / "a.npy", np.zeros((9, 2)))
    proc = cli(
        "exact-arbitrary",
        str(tmp_path / "x.npy"),
        str(tmp_path / "a.npy"),
        "--width",
        "2",
        "--out",
        str(tmp_path / "m.npz"),
    )
    assert proc.returncode == 2 and "10 rows" in proc.stderr and "9" in proc.stderr, proc.stderr
    proc = cli(
        "exact-arbitrary",
        str(tmp_path / "missing.npy"),
        str(tmp_path / "a.npy"),
        "--width",
        "2",
        "--out",
        str(tmp_path / "m.npz"),
    )
    assert proc.returncode == 2 and "missing.npy" in proc.stderr and "does not exist" in proc.stderr, proc.stderr


def test_the_two_layer_example_plants_what_it_says():
    from pathlib import Path

    from relulearn.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[3] / "examples" / "two_layer.yaml")
    net = make_source(cfg).network
    assert (net.input_dim, net.weights[0].shape[0], net.output_dim, net.activation) == (50, 6, 8, "relu2")
    assert cfg.statistics.output_moments is None  # fit chooses the method's statistics


def test_a_vector_output_network_file_is_a_teacher_for_exact(tmp_path):
    """Any .npz network with a vector output: vector labels, and its own activation is the default."""
    rng = np.random.default_rng(5)
    teacher = Network((rng.standard_normal((3, 10)), rng.standard_normal((4, 3))), activation="relu3")
    teacher.save(tmp_path / "t.npz")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("seed: 2\nsamples: 100000\nchunk_size: 25000\nsource: {d: 10, teacher: {file: t.npz}}\n")
    proc = cli(
        "fit",
        str(cfg),
        "--store",
        str(tmp_path / "s.zarr"),
        "--method",
        "exact",
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
        "--quiet",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["report"]["activation"] == "relu3"
    assert compare_two_layer(teacher, Network.load(tmp_path / "m.npz")).relative_error <= 1e-12
