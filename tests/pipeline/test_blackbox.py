"""Black-box teachers: a user's Python function queried at the run's Gaussian inputs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import yaml

from relulearn import api
from relulearn.config import ConfigError, config_from_dict
from relulearn.network import Network, NetworkFileError, compare
from relulearn.pipeline.cluster import ClusterError
from relulearn.pipeline.sources import LabelShapeError, SourceDataError, Stream, generator, make_source
from relulearn.storage import StoreError

from conftest import FIXTURES, PYTHON, cli_env, relulearn

D, K = 10, 3
MODULE = "user_teacher_{}"

# A user's module: a one-hidden-layer ReLU network y = Σ λ_i relu(u_i·x) behind a function of a batch,
# and functions that misbehave the ways the pipeline must name.
SOURCE = """
import numpy as np

_rng = np.random.default_rng(5)
U = _rng.standard_normal((3, 10))
U /= np.linalg.norm(U, axis=1, keepdims=True)
LAM = np.array([1.0, -0.8, 1.3])


def teacher(x):
    return np.maximum(x @ U.T, 0.0) @ LAM


B = np.array([0.4, -0.7, 0.2])
C = -0.3


def biased(x):  # Σ λ_i relu(u_i·x + b_i) + c, as most trained models are
    return np.maximum(x @ U.T + B, 0.0) @ LAM + C


def two_outputs(x):
    return np.stack([teacher(x), -teacher(x)], axis=1)


def short(x):  # right on the two-row probe, one label short on a real batch
    return teacher(x)[:max(2, len(x) - 1)]


def nan_above(x):
    y = teacher(x)
    y[x[:, 0] > 3.0] = np.nan
    return y


def centring(x):  # the teacher's labels, then the batch changed in place, as a careless user's code may
    y = teacher(x)
    x -= x.mean(0)
    x /= 10
    return y


def exits(x):  # answers the two-row probe, then ends the program as a script's helper may
    if len(x) > 2:
        raise SystemExit(4)
    return teacher(x)


def exits_at_probe(x):
    raise SystemExit(4)


class Stop(BaseException):
    pass


def stops(x):
    raise Stop("no more")


def constant(x):
    return np.full(len(x), 1.5)


def odd(x):  # an odd function: a linear part, no even-order moments
    return np.tanh(x @ U[0] + 0.5 * x @ U[1])


def thousand(x):  # a label vector of 1,000 outputs
    return np.repeat(teacher(x)[:, None], 1000, axis=1)


def billion(x):  # 10^9 outputs per row, answered without memory (a broadcast view); a batch of them is 33 TB
    return np.broadcast_to(teacher(x)[:, None], (len(x), 10**9))


NOT_A_FUNCTION = 3
"""


@pytest.fixture
def module(tmp_path, monkeypatch):
    """The user's module in its own folder, importable by this process (not by the fixture's workers)."""
    name = MODULE.format(abs(hash(str(tmp_path))) % 10**8)  # a fresh name per test: no stale import
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    return name, folder


def config(name: str, function: str = "teacher", samples: int = 400_000, **source) -> dict:
    return {
        "seed": 3,
        "samples": samples,
        "chunk_size": 25_000,
        "source": {"d": D, "teacher": {"callable": f"{name}:{function}"}, **source},
        "run": {"commit_interval": 1e9},
    }


def teacher_network(name: str) -> Network:
    import importlib

    mod = importlib.import_module(name)
    return Network((mod.U, mod.LAM[None, :]))


def test_a_callable_teacher_is_extracted_exactly_through_the_cli_on_two_workers(module, tmp_path):
    """`relulearn fit --method moments` on a user's function (its folder on PYTHONPATH, as a user sets it):
    the learned network equals the one behind the function to machine precision."""
    name, folder = module
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(config(name)))
    env = cli_env()
    env["PYTHONPATH"] = str(folder) + os.pathsep + env["PYTHONPATH"]
    out = tmp_path / "m.npz"
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "relulearn.cli",
            "fit",
            str(cfg_path),
            "--store",
            str(tmp_path / "s.zarr"),
            "--method",
            "moments",
            "--workers",
            "2",
            "--out",
            str(out),
            "--quiet",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["width"] == K
    cmp = compare(teacher_network(name), Network.load(out))
    assert cmp.relative_error <= 1e-10, cmp
    ev = api.evaluate(out, cfg_path, samples=100_000)
    assert ev["relative_test_error"] <= 1e-20, ev
    assert ev["parameter_error"] is None and "black box" in ev["parameter_error_note"]


def test_a_callable_with_biases_is_extracted_exactly(module, tmp_path):
    """Biases are learned by default from a black box: the enumeration searches directions and offsets,
    polish fits [x, 1] and the output bias; the hidden biases, output bias and units come out exact."""
    import importlib

    name, _ = module
    mod = importlib.import_module(name)
    out = str(tmp_path / "m.npz")
    got = api.fit(
        config_from_dict(config(name, "biased")),
        str(tmp_path / "s.zarr"),
        "moments",
        out=out,
        client="local",
        progress=None,
    )
    assert got["width"] == K
    learned = Network.load(out)
    assert learned.biases is not None
    assert compare(Network((mod.U, mod.LAM[None, :]), (mod.B, np.array([mod.C]))), learned).relative_error <= 1e-10
    # the same function without biases is learned as bias-free only when asked: its charge for the
    # missing biases is the test of compare counting them
    assert compare(Network((mod.U, mod.LAM[None, :])), learned).relative_error > 0.1


def test_the_inputs_are_the_chunks_of_a_planted_run_and_the_store_names_the_function(module, tmp_path):
    """The same chunk bytes as any source of the seed; the store's fingerprint holds the function's
    name and a hash of its module, so an edited module cannot resume the store."""
    name, folder = module
    cfg = config_from_dict(config(name, samples=50_000))
    source = make_source(cfg)
    x, y = next(source.batches(generator(3, Stream.INPUTS, 1), generator(3, Stream.NOISE, 1), 100))
    x_ref = generator(3, Stream.INPUTS, 1).standard_normal((100, D))
    assert np.array_equal(x, x_ref)
    assert np.array_equal(y, teacher_network(name).forward(x_ref)[:, 0])
    url = str(tmp_path / "s.zarr")
    api.estimate(cfg, url, client="local", progress=None)
    from relulearn import open_store

    fp = open_store(url).meta["fingerprint"]["source"]
    assert fp["teacher"] == {"callable": f"{name}:teacher"} and len(fp["teacher_sha256"]) == 64
    # an edited module is another teacher: the store refuses to be extended with it
    (folder / f"{name}.py").write_text(SOURCE.replace("LAM = np.array([1.0,", "LAM = np.array([1.1,"))
    from relulearn.pipeline import blackbox

    blackbox.load_callable.cache_clear()
    import sys

    sys.modules.pop(name)
    with pytest.raises(StoreError, match=r"different fingerprint; differing fields: source.teacher_sha256"):
        api.estimate(config_from_dict(config(name, samples=100_000)), url, client="local", progress=None)


def test_a_callable_that_changes_its_batch_in_place_leaves_the_statistics_unchanged(module, tmp_path):
    """The statistics never see an array the user's function can touch: a function that centres and scales its
    batch in place after answering gives statistics bitwise equal to the same function that does not."""
    from relulearn import open_store

    name, _ = module
    stores = {}
    for function in ("teacher", "centring"):
        url = str(tmp_path / f"{function}.zarr")
        api.estimate(config_from_dict(config(name, function, samples=50_000)), url, client=None, progress=None)
        stores[function] = open_store(url)
    for key in ("xx", "yx", "sum_y"):
        ref, got = stores["teacher"].arrays("basic")[key], stores["centring"].arrays("basic")[key]
        assert np.array_equal(ref, got), key
    assert np.allclose(np.diag(stores["teacher"].arrays("basic")["xx"]), 1.0, atol=0.05)  # E x x^T = I


def test_vector_outputs_and_source_output(module):
    name, _ = module
    both = make_source(config_from_dict(config(name, "two_outputs")))
    assert both.outputs == 2
    second = make_source(config_from_dict(config(name, "two_outputs", output=1)))
    x = generator(0, Stream.INPUTS, 0).standard_normal((50, D))
    assert np.array_equal(second.labels(x), -both.labels(x)[:, 0])
    with pytest.raises(ValueError, match=r"source.output is 2 but .* has only 2 output"):
        make_source(config_from_dict(config(name, "two_outputs", output=2)))


def test_workers_that_cannot_import_the_function_are_refused_before_any_block(module, client, tmp_path):
    """The fixture's workers started before the user's folder was on this process's path."""
    name, _ = module
    url = tmp_path / "s.zarr"
    with pytest.raises(ClusterError, match=rf"cannot import '{name}' \(ModuleNotFoundError.*no block was run"):
        api.estimate(config_from_dict(config(name, samples=50_000)), str(url), client=client, progress=None)
    assert not url.exists()


def test_a_wrong_shape_names_the_chunk_and_the_row(module, tmp_path):
    name, _ = module
    cfg = config_from_dict(config(name, "short", samples=50_000))
    with pytest.raises(
        LabelShapeError,
        match=r"chunk 0, the batch from row 0: .*returned shape \(4095,\) for a "
        r"batch of 4096 rows; it must return \(rows,\)",
    ):
        api.estimate(cfg, str(tmp_path / "s.zarr"), client="local", progress=None)


def test_nan_answers_name_the_chunk_and_the_row(module, tmp_path):
    name, _ = module
    cfg = config_from_dict(config(name, "nan_above", samples=50_000))
    # the first row of the run whose x_0 > 3: the chunk and row the error must name
    for chunk in range(2):
        x = generator(3, Stream.INPUTS, chunk).standard_normal((25_000, D))
        rows = np.flatnonzero(x[:, 0] > 3.0)
        if rows.size:
            break
    with pytest.raises(SourceDataError, match=rf"chunk {chunk}, row {rows[0]} "):
        api.estimate(cfg, str(tmp_path / "s.zarr"), client="local", progress=None)


@pytest.mark.parametrize(
    "function, said",
    [
        ("exits", "exited with code 4 on a batch x of shape"),
        ("exits_at_probe", r"exited with code 4 when called on a probe batch x of shape \(2, 10\)"),
        ("stops", "raised Stop, which ends a program, when called on a probe batch"),
    ],
)
def test_a_callable_that_ends_the_program_is_named_and_refused(module, tmp_path, function, said):
    """SystemExit(4) (or another BaseException but Ctrl-C) in the user's function ended relulearn with code 4
    and no word: it is one line naming the callable, exit 2, and no store is written."""
    name, _ = module
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config(name, function, samples=50_000)))
    store = tmp_path / "s.zarr"
    done = relulearn("estimate", cfg, "--store", store, "--quiet")
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relulearn: error: "), done.stderr
    assert f"source.teacher.callable '{name}:{function}'" in lines[0]
    assert re.search(said, lines[0]) and "not end the process" in lines[0], lines[0]
    assert not store.exists()


@pytest.mark.slow
def test_a_callable_that_exits_on_a_worker_is_named_and_refused(module, tmp_path):
    """The same on two worker processes: the worker's SystemExit is the driver's one line, exit 2."""
    name, folder = module
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config(name, "exits", samples=50_000)))
    env = cli_env()
    env["PYTHONPATH"] = str(folder) + os.pathsep + env["PYTHONPATH"]
    store = tmp_path / "s.zarr"
    args = ["estimate", str(cfg), "--store", str(store), "--workers", "2", "--quiet"]
    done = subprocess.run([PYTHON, "-m", "relulearn.cli", *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert f"source.teacher.callable '{name}:exits' exited with code 4 on a batch x of shape (4096, 10)" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not store.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "function, said",
    [
        ("constant", "the labels are constant (y = 1.5 on every sample): there is nothing to learn but the mean"),
        ("odd", "no even-order moment above the noise floor: a ReLU network's labels have both, so the teacher is "
         "outside the '{method}' method's setting (an odd function such as tanh?) and more samples will not help; "
         "use --method polynomial"),
    ],
)  # fmt: skip
def test_a_teacher_no_sample_count_helps_is_not_told_to_add_samples(module, tmp_path, function, said):
    """A constant teacher, and an odd one (tanh: a linear part, no even-order moment), were told to "estimate with
    more samples" by moments and tensor: fit and learn say what the statistics show and what to use."""
    name, _ = module
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config(name, function, samples=100_000)))
    store = tmp_path / "s.zarr"
    fitted = relulearn("fit", cfg, "--store", store, "--method", "moments", "--out", tmp_path / "m.npz", "-q")
    for method, done in (
        ("moments", fitted),
        ("tensor", relulearn("learn", store, "--method", "tensor", "--out", tmp_path / "m.npz", "-q")),
    ):
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and said.format(method=method) in lines[0], done.stderr
        assert "estimate with more samples" not in lines[0]
    assert not (tmp_path / "m.npz").exists()


def test_a_relu_teacher_under_its_noise_floor_is_told_to_add_samples(module, tmp_path):
    """The same words stay for a ReLU teacher whose signal is still under the noise floor (2,000 samples)."""
    name, _ = module
    data = config(name, samples=2_000, noise_std=3.0)
    data["chunk_size"] = 1_000
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    done = relulearn("fit", cfg, "--store", tmp_path / "s.zarr", "--method", "moments", "--out", tmp_path / "m.npz",
                     "-q")  # fmt: skip
    assert done.returncode == 2 and "estimate with more samples" in done.stderr, done


def test_the_plan_counts_a_callables_outputs_from_its_probe(module):
    """A callable's outputs per row are known only from its probe: the plan's memory per worker counts its answers
    to a batch and the label vector's sums (it projected 12 kB for a function of 10^5 outputs that took 7.6 GB)."""
    from relulearn.pipeline.sizes import ANSWER_COPIES, BATCH_COPIES

    name, _ = module
    got = api.plan(config_from_dict(config(name, "thousand", samples=50_000)), workers=1)
    (estimate,) = got["passes"]
    assert [f["name"] for f in estimate["families"]] == ["basic"]
    m, rows = 1000, 4096
    sums = (D * D + 2 * D + 2) * m  # basic's sums per output: xx, yx, sum_x, sum_y, count
    # the block partial (sums and terms), a chunk's sums, a batch of inputs and the answers to it
    want = 8 * (2 * sums + sums) + BATCH_COPIES * 8 * rows * D + ANSWER_COPIES * 8 * rows * m
    assert estimate["worker_bytes"] == want


def test_a_callable_whose_answers_to_a_batch_exceed_the_machine_is_refused_before_any_batch(module, tmp_path):
    """10^9 outputs per row: plan and estimate refuse in one line naming the callable and the bytes; no store."""
    name, _ = module
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config(name, "billion", samples=50_000)))
    store = tmp_path / "s.zarr"
    for args in (("plan", cfg), ("estimate", cfg, "--store", store, "--quiet")):
        done = relulearn(*args)
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert (
            f"source.teacher.callable '{name}:billion' returns 1,000,000,000 outputs per row: its answers to one "
            "batch (4,096 rows × 1,000,000,000 outputs, 2 copies) would take 65,536,000,000,000 bytes (65.5 TB)"
        ) in lines[0]
        assert "make the function return fewer outputs per row" in lines[0]
    assert not store.exists()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon", r"not 'package.module:function'"),
        ("not_a_module_xyz:f", r"module 'not_a_module_xyz' cannot be imported \(ModuleNotFoundError"),
        ("{name}:missing", r"has no attribute 'missing'"),
        ("{name}:NOT_A_FUNCTION", r"is not callable \(an object of type int\)"),
    ],
)
def test_bad_callables_name_the_key(module, spec, message):
    name, _ = module
    data = config(name)
    data["source"]["teacher"]["callable"] = spec.format(name=name)
    with pytest.raises((ConfigError, ValueError), match=message):
        make_source(config_from_dict(data))


def test_pickle_files_are_refused_with_the_routes_that_work(tmp_path):
    import pickle

    for suffix in (".pkl", ".joblib", ".npz"):
        path = tmp_path / f"model{suffix}"
        path.write_bytes(pickle.dumps({"W0": np.eye(2)}))
        with pytest.raises(
            NetworkFileError,
            match=r"pickle.*run code when loaded.*source.teacher.onnx.*skl2onnx"
            r".*torch.onnx.export.*\.npz network file.*callable",
        ):
            Network.load(path)


def test_a_pickle_teacher_file_is_refused_by_the_cli_before_any_store_is_written(tmp_path):
    import pickle

    (tmp_path / "model.pkl").write_bytes(pickle.dumps({"W0": np.eye(2)}))
    data = dict(config("unused"), source={"d": 2, "teacher": {"file": "model.pkl"}})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    done = relulearn("estimate", str(tmp_path / "c.yaml"), "--store", str(tmp_path / "s.zarr"), "--in-process")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{tmp_path / 'model.pkl'} is a pickle" in done.stderr and "never loads pickles" in done.stderr
    assert not (tmp_path / "s.zarr").exists()


# ------------------------------------------------------------------------------ ONNX


def mlp_onnx(folder) -> Network:
    """A scikit-learn MLPRegressor (one hidden ReLU layer of width 4, with its intercepts) trained on
    scikit-learn's diabetes data, exported by skl2onnx (float32): the file ``folder / 'mlp.onnx'``; returns the
    model's float64 network."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_diabetes
    from sklearn.neural_network import MLPRegressor

    x, y = load_diabetes(return_X_y=True)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    mlp = MLPRegressor(hidden_layer_sizes=(4,), max_iter=2000, random_state=0).fit(x, y / y.std())
    (folder / "mlp.onnx").write_bytes(to_onnx(mlp, x[:1].astype(np.float32)).SerializeToString())
    return Network(
        (mlp.coefs_[0].T.copy(), mlp.coefs_[1].T.copy()), (mlp.intercepts_[0].copy(), mlp.intercepts_[1].copy())
    )


def onnx_graph(
    folder,
    w0: np.ndarray,
    w1: np.ndarray,
    name: str = "g.onnx",
    rows: int | None = None,
    float_output: bool = False,
    biases: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """``W1 relu(W0 x)`` as a float64 ONNX graph (MatMul, Relu, MatMul: what torch.onnx writes for a bias-free
    nn.Sequential of Linear and ReLU layers); with ``biases`` ``(b0, b1)``, ``W1 relu(W0 x + b0) + b1`` as Gemm
    nodes (what torch.onnx writes for nn.Linear layers with biases)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    d = w0.shape[1]
    last = "y64" if float_output else "y"
    if biases is None:
        nodes = [
            helper.make_node("MatMul", ["x", "w0t"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w1t"], [last]),
        ]
        weights = [numpy_helper.from_array(w0.T.copy(), "w0t"), numpy_helper.from_array(w1.T.copy(), "w1t")]
    else:
        nodes = [
            helper.make_node("Gemm", ["x", "w0", "b0"], ["h"], transB=1),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w1", "b1"], [last], transB=1),
        ]
        weights = [
            numpy_helper.from_array(np.asarray(a, dtype=np.float64), n)
            for a, n in ((w0, "w0"), (biases[0], "b0"), (w1, "w1"), (biases[1], "b1"))
        ]
    if float_output:  # a double graph that answers in float32
        nodes.append(helper.make_node("Cast", ["y64"], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [rows, d])],
        [
            helper.make_tensor_value_info(
                "y", TensorProto.FLOAT if float_output else TensorProto.DOUBLE, [rows, w1.shape[0]]
            )
        ],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    (folder / name).write_bytes(model.SerializeToString())


def onnx_config(path, d: int = 10, **source) -> dict:
    return {
        "seed": 1,
        "samples": 400_000,
        "chunk_size": 25_000,
        "source": {"d": d, "teacher": {"onnx": str(path)}, **source},
        "run": {"commit_interval": 1e9},
    }


@pytest.mark.extra("onnx", "sklearn")
def test_the_hidden_width_an_onnx_graph_fixes_shapes_the_plan_of_the_passes_the_learn_asks_for(tmp_path):
    """skl2onnx's graph of a 4-unit MLP and a Gemm graph of 6 units in d = 10 say their widths (ONNX shape
    inference); tensor's plan without --width then prices its second pass at that width, exactly as with
    ``width`` given (the first pass is the same either way), and below the upper bound k = d it assumes
    otherwise."""
    from relulearn.estimators.base import teacher_width
    from relulearn.pipeline.blackbox import onnx_source

    mlp_onnx(tmp_path)
    assert onnx_source(tmp_path / "mlp.onnx", 10, 0.0, None).hidden_widths() == [4]
    rng = np.random.default_rng(3)
    onnx_graph(tmp_path, rng.standard_normal((6, 10)), rng.standard_normal((1, 6)))
    assert teacher_width(onnx_source(tmp_path / "g.onnx", 10, 0.0, None)) == 6
    cfg = config_from_dict(onnx_config(tmp_path / "g.onnx"))
    told, given = api.plan(cfg, "tensor"), api.plan(cfg, "tensor", width=6)
    assert [p["name"] for p in told["passes"]] == ["estimate", "tensor-1"]
    assert told["passes"][1]["families"] == given["passes"][1]["families"]
    assert told["passes"][0]["families"] == given["passes"][0]["families"]
    bound = api.plan(cfg, "tensor", width=10)["passes"][1]["families"][0]["flops_per_sample"]
    assert told["passes"][1]["families"][0]["flops_per_sample"] < bound


@pytest.mark.extra("onnx")
def test_without_the_lattice_extra_an_onnx_teacher_past_its_equations_is_refused_before_any_sample(
    tmp_path, monkeypatch
):
    """The default install (no fplll) and an ONNX graph of 3d = 36 units in d = 12, its width in the graph
    only: `plan` and `fit` refuse it in one line naming the extra, and no store is written."""
    import sys

    monkeypatch.setitem(sys.modules, "fpylll", None)  # what `import fpylll` does where it is not installed
    rng = np.random.default_rng(4)
    onnx_graph(tmp_path, rng.standard_normal((36, 12)), rng.standard_normal((1, 36)))
    (tmp_path / "c.yaml").write_text(json.dumps(onnx_config(tmp_path / "g.onnx", 12)))
    for argv in (
        ("plan", tmp_path / "c.yaml", "--method", "tensor"),
        ("fit", tmp_path / "c.yaml", "--store", tmp_path / "s.zarr", "--method", "tensor", "--out", tmp_path / "m"),
    ):
        done = relulearn(*argv)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "orienting 36 units" in line and "pip install 'relulearn[wide]'" in line, line
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.extra("onnx", "sklearn")
def test_a_scikit_learn_mlp_exported_to_onnx_is_extracted_to_its_float32_rounding(client, tmp_path):
    """The float32 model sees float32 inputs and answers in float32; the network learned from its answers
    matches the model's float64 weights to that rounding: parameter error ≤ 1e-6, test error ≤ 1e-10."""
    net = mlp_onnx(tmp_path)
    cfg = onnx_config(tmp_path / "mlp.onnx")
    out = str(tmp_path / "m.npz")
    api.fit(config_from_dict(cfg), str(tmp_path / "s.zarr"), "moments", width=4, out=out, client=client, progress=None)
    learned = Network.load(out)
    assert compare(net, learned).relative_error <= 1e-6
    x = generator(9, Stream.TEST, 0).standard_normal((100_000, 10))
    y = net.forward(x)[:, 0]
    assert np.mean((y - learned.forward(x)[:, 0]) ** 2) / np.mean(y**2) <= 1e-10
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    ev = api.evaluate(out, tmp_path / "c.yaml", samples=50_000)
    # against the model's own float32 answers the error is the rounding's, (2^-24)^2 relative and above
    assert ev["teacher_precision"] == "float32" and ev["teacher_relative_rounding"] == 2.0**-24
    assert 1e-17 <= ev["relative_test_error"] <= 1e-12, ev


@pytest.mark.extra("onnx")
def test_a_float64_onnx_graph_is_extracted_to_machine_precision(tmp_path):
    rng = np.random.default_rng(4)
    w0 = rng.standard_normal((3, 10))
    w1 = np.array([[1.2, -0.9, 0.7]])
    onnx_graph(tmp_path, w0, w1)
    out = str(tmp_path / "m.npz")
    api.fit(
        config_from_dict(onnx_config(tmp_path / "g.onnx")),
        str(tmp_path / "s.zarr"),
        "moments",
        width=3,
        out=out,
        client="local",
        progress=None,
    )
    assert compare(Network((w0, w1)), Network.load(out)).relative_error <= 1e-10


@pytest.mark.extra("onnx")
def test_a_float64_onnx_graph_with_biases_is_extracted_to_machine_precision(tmp_path):
    """Linear layers with biases as torch.onnx writes them (Gemm): units, hidden and output biases exact."""
    rng = np.random.default_rng(6)
    w0, w1 = rng.standard_normal((4, 10)) / np.sqrt(10), np.array([[1.2, -0.9, 0.7, 1.1]])
    b0, b1 = 0.6 * rng.standard_normal(4), np.array([0.25])
    onnx_graph(tmp_path, w0, w1, biases=(b0, b1))
    out = str(tmp_path / "m.npz")
    api.fit(
        config_from_dict(onnx_config(tmp_path / "g.onnx")),
        str(tmp_path / "s.zarr"),
        "moments",
        width=4,
        out=out,
        client="local",
        progress=None,
    )
    assert compare(Network((w0, w1), (b0, b1)), Network.load(out)).relative_error <= 1e-10


def torch_onnx(folder) -> Network:
    """A small PyTorch network (Linear 10→4 with bias, ReLU, Linear 4→1 with bias; float32, PyTorch's default),
    trained briefly on scikit-learn's diabetes data and exported by torch.onnx with a variable batch size
    (``tests/fixtures/make_fixtures.py`` made it): copied to ``folder / 'torch.onnx'``; returns the model's
    weights as a float64 network."""
    fixtures = FIXTURES
    shutil.copyfile(fixtures / "torch_diabetes.onnx", folder / "torch.onnx")
    with np.load(fixtures / "torch_diabetes.npz") as w:
        return Network(
            (w["w0"].astype(np.float64), w["w1"].astype(np.float64)),
            (w["b0"].astype(np.float64), w["b1"].astype(np.float64)),
        )


@pytest.mark.extra("onnx")
def test_a_pytorch_network_exported_to_onnx_is_extracted_to_its_float32_rounding(tmp_path):
    """Its weights and biases from the float32 model's answers: parameter error ≤ 1e-6 (the rounding sets
    the level), test error ≤ 1e-10 against the float64 network of its weights."""
    net = torch_onnx(tmp_path)
    out = str(tmp_path / "m.npz")
    # its weakest unit (λ‖u‖ = −0.12, offset −0.69‖u‖: a seventh of the largest weight in M_2) clears the noise
    # floor at 4·10⁵ samples thanks to fit's control variate (without it: parameter error 0.1 there)
    api.fit(
        config_from_dict(onnx_config(tmp_path / "torch.onnx")),
        str(tmp_path / "s.zarr"),
        "moments",
        width=4,
        out=out,
        client="local",
        progress=None,
    )
    learned = Network.load(out)
    assert learned.biases is not None and compare(net, learned).relative_error <= 1e-6
    x = generator(9, Stream.TEST, 0).standard_normal((100_000, 10))
    y = net.forward(x)[:, 0]
    assert np.mean((y - learned.forward(x)[:, 0]) ** 2) / np.mean(y**2) <= 1e-10


@pytest.mark.extra("onnx")
def test_a_double_input_float_output_model_gets_double_inputs_and_float32_precision(tmp_path):
    rng = np.random.default_rng(5)
    w0, w1 = rng.standard_normal((3, 10)), rng.standard_normal((1, 3))
    onnx_graph(tmp_path, w0, w1, float_output=True)
    source = make_source(config_from_dict(onnx_config(tmp_path / "g.onnx")))
    assert (source.input_type, source.precision) == ("float64", "float32")
    x = generator(0, Stream.TEST, 0).standard_normal((100, 10))
    y = Network((w0, w1)).forward(x)[:, 0]
    assert np.array_equal(source.labels(x), y.astype(np.float32).astype(np.float64))  # only the answers rounded


@pytest.mark.extra("onnx")
@pytest.mark.parametrize(
    "case, message",
    [
        ("width", r"takes inputs of shape \[None, 10\] but source.d is 8; .*make source.d and the model agree"),
        ("output", r"source.output is 1 but source.teacher.onnx .* has only 1 output\(s\)"),
        ("garbage", r"is not a model onnxruntime can load"),
        ("missing", r"does not exist; set source.teacher.onnx"),
        ("fixed-batch", r"takes batches of exactly 1 rows .*dynamic_axes=\{'x': \{0: 'rows'\}\}"),
    ],
)
def test_bad_onnx_teachers_name_the_file_and_the_mismatch(tmp_path, case, message):
    onnx_graph(tmp_path, np.ones((2, 10)), np.ones((1, 2)), rows=1 if case == "fixed-batch" else None)
    path = tmp_path / "g.onnx"
    data = onnx_config(path, d=8 if case == "width" else 10, **({"output": 1} if case == "output" else {}))
    if case == "garbage":
        path.write_bytes(b"not a model")
    elif case == "missing":
        path.unlink()
    with pytest.raises(ValueError, match=message):
        make_source(config_from_dict(data))
    # the command line says the same, without a traceback, and writes no store
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    done = relulearn("estimate", str(tmp_path / "c.yaml"), "--store", str(tmp_path / "s.zarr"), "--in-process")
    assert done.returncode == 2 and "Traceback" not in done.stderr and str(path) in done.stderr, done.stderr
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.extra("onnx", "sklearn")
def test_a_multi_output_mlp_that_skl2onnx_flattened_is_refused_with_the_fix(tmp_path):
    """skl2onnx exports a multi-output MLPRegressor with its answers flattened to (rows·m, 1): the probe's (2m, 1)
    is named as m outputs per row in one column, with the ways to export it as (rows, m)."""
    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPRegressor

    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPRegressor(hidden_layer_sizes=(4,), max_iter=20, random_state=0).fit(x, rng.standard_normal((100, 3)))
    path = tmp_path / "mlp3.onnx"
    path.write_bytes(to_onnx(mlp, x[:1].astype(np.float32)).SerializeToString())
    with pytest.raises(
        ValueError,
        match=r"returned shape \(6, 1\) .*its 3 outputs per row come flattened into one "
        r"column .*Reshape to \[-1, 3\]",
    ):
        make_source(config_from_dict(onnx_config(path, d=6)))
