"""The plan as a promise on held-out trained networks: ``relulearn plan`` against ``relulearn fit --method tensor`` on
teachers neither the tests nor ``benchmarks/extract.py`` hold (a script, not a test).

Builds, in a temporary folder and seeded, one-hidden-layer ReLU regressors with biases trained by scikit-learn's
``MLPRegressor`` on data the other benchmarks do not use — Friedman #1 (d = 20), the diabetes data (d = 10, width
32: k > d + 20, the lattice search of the ``wide`` extra), ``make_regression`` with 3 and 10 targets (d = 40 and d =
50) — exported as float32 ONNX (skl2onnx for one output; for several, as skl2onnx flattens a multi-output
MLPRegressor's outputs to one column, a ``Gemm → Relu → Gemm`` graph written with ``onnx``). For each it writes a
configuration that only names the teacher and a sample cap, runs ``relulearn plan --method tensor --json`` and then
``relulearn fit --method tensor --json`` as a user would (the CLI, its default workers), and records d, width,
outputs, each pass's projected and measured seconds, the learn's own time, the parameter error against the float64
weights (:func:`relulearn.network.compare`), the relative test error on Gaussian inputs and the machine's load
average at the start and end of each fit.

Run ``python benchmarks/heldout.py`` (about 10–20 minutes on a loaded 2-core machine; ``--only NAME`` for one
network); results go to ``benchmarks/results/heldout.json`` and a table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from relulearn.network import Network, compare

from _common import cpu_model, save_json, utc_now

OUT = Path(__file__).parent / "results" / "heldout.json"

#: name → (data, width, samples): data is a scikit-learn loader or generator call, samples the fit's cap
NETWORKS = {
    "friedman1-8": ("friedman1", 8, 2_000_000),
    "friedman1-40": ("friedman1", 40, 2_000_000),
    "diabetes-32": ("diabetes", 32, 2_000_000),
    "regression3-16": ("regression3", 16, 2_000_000),
    "regression10-24": ("regression10", 24, 2_000_000),
    "regression100-32": ("regression100", 32, 2_000_000),
    "diabetes-40": ("diabetes", 40, 20_000_000),
    "regression24-96": ("regression24", 96, 20_000_000),
}


def _data(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Standardised inputs and labels (a matrix for several targets) of a held-out data set, seeded."""
    from sklearn import datasets

    if name == "friedman1":
        x, y = datasets.make_friedman1(n_samples=2000, n_features=20, noise=0.5, random_state=1)
    elif name == "diabetes":
        x, y = datasets.load_diabetes(return_X_y=True)
    elif name == "regression3":
        x, y = datasets.make_regression(n_samples=2000, n_features=40, n_targets=3, noise=1.0, random_state=2)
    elif name == "regression10":
        x, y = datasets.make_regression(n_samples=2000, n_features=50, n_targets=10, noise=1.0, random_state=3)
    elif name == "regression60":  # benchmarks/extract.py's vector-output row
        x, y = datasets.make_regression(n_samples=4000, n_features=60, n_targets=10, noise=1.0, random_state=6)
    elif name == "regression100":
        x, y = datasets.make_regression(n_samples=4000, n_features=100, n_targets=10, noise=1.0, random_state=4)
    elif name == "regression24":
        x, y = datasets.make_regression(n_samples=4000, n_features=24, n_informative=24, noise=5.0, random_state=5)
        y = y + 0.02 * y**2 / np.std(y)  # a nonlinear target: units that differ
    else:
        raise ValueError(name)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    y = (y - y.mean(axis=0)) / y.std(axis=0)
    return x, y


def teacher(data: str, width: int, folder: Path) -> tuple[Network, Path]:
    """An MLPRegressor of ``width`` ReLU units on ``data``, exported as float32 ONNX: its float64 network and file."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    x, y = _data(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(width,), max_iter=2000, random_state=0).fit(x, y)
    net = Network(
        (mlp.coefs_[0].T.copy(), mlp.coefs_[1].T.copy()), (mlp.intercepts_[0].copy(), mlp.intercepts_[1].copy())
    )
    path = folder / f"{data}-{width}.onnx"
    if y.ndim == 1:
        from skl2onnx import to_onnx

        path.write_bytes(to_onnx(mlp, x[:1].astype(np.float32)).SerializeToString())
    else:
        onnx_export(net, path)
    return net, path


def onnx_export(net: Network, path: Path) -> None:
    """``net`` as a float32 ONNX graph ``Gemm → Relu → Gemm`` with a variable batch, written with the ``onnx``
    package (what torch.onnx writes for ``Linear → ReLU → Linear``; torch is not needed)."""
    from onnx import TensorProto, helper, numpy_helper

    (u, a), (b, c) = net.weights, net.biases
    weights = [
        numpy_helper.from_array(np.asarray(w, dtype=np.float32), name)
        for w, name in ((u, "w1"), (b, "b1"), (a, "w2"), (c, "b2"))
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "w1", "b1"], ["h"], transB=1),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1),
        ],
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", u.shape[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", a.shape[0]])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def _cli(args: list[str], cwd: Path) -> tuple[dict, float]:
    """``relulearn ARGS`` as a user runs it (its JSON on stdout), and its wall seconds."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "relulearn", *args], cwd=str(cwd), capture_output=True, text=True, env=dict(os.environ)
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"relulearn {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), wall


def test_error(net: Network, model: Network, seed: int = 7) -> float:
    """Relative squared error of ``model`` on 10⁵ Gaussian inputs, against the float64 teacher."""
    x = np.random.default_rng(seed).standard_normal((100_000, net.input_dim))
    y = net.forward(x)
    return float(np.sum((y - model.forward(x)) ** 2) / np.sum((y - y.mean(axis=0)) ** 2))


def run(name: str, folder: Path) -> dict:
    """Plan, then fit, one held-out network: projected and measured seconds, errors and load."""
    data, width, samples = NETWORKS[name]
    net, onnx = teacher(data, width, folder)
    config = folder / f"{name}.yaml"
    config.write_text(
        json.dumps({"seed": 5, "samples": samples, "source": {"d": net.input_dim, "teacher": {"onnx": str(onnx)}}})
    )
    plan, plan_wall = _cli(["plan", str(config), "--method", "tensor", "--json"], folder)
    load_start = list(os.getloadavg())
    store, out = folder / f"{name}.zarr", folder / f"{name}.npz"
    # no --width: a trained net may hold units below the noise floor; the fit learns those it supports
    argv = ["fit", str(config), "--store", str(store), "--method", "tensor"]
    fit, fit_wall = _cli([*argv, "--out", str(out), "--json", "-q"], folder)
    (folder / f"{name}.fit.json").write_text(json.dumps(fit, default=str))
    load_end = list(os.getloadavg())
    model = Network.load(out)
    # fit's JSON: the estimate pass, the passes the method asked for, and the whole command (passes and learn)
    measured = [{"name": "estimate", "seconds": fit["estimate"]["seconds"]}]
    measured += [{"name": p["name"], "seconds": p["seconds"]} for p in fit.get("passes", [])]
    projected = [
        {"name": p["name"], "seconds": p["projected_seconds"], "optional": p.get("optional", False)}
        for p in plan["passes"]
    ]
    passes_seconds = float(sum(p["seconds"] for p in measured))
    # fit's ``seconds`` is the learn's (from the stored statistics on, the passes it asked for included)
    total = float(fit["estimate"]["seconds"]) + float(fit["seconds"])
    report = fit.get("report", {})
    return {
        "name": name,
        "data": data,
        "d": net.input_dim,
        "width": width,
        "outputs": net.output_dim,
        "samples": samples,
        "plan": {
            "projected_seconds": plan["projected_seconds"],
            "projected_seconds_max": plan["projected_seconds_max"],
            "passes": projected,
            "workers": plan["workers"],
            "runs_in": plan["runs_in"],
            "learn": plan.get("learn"),
            "passes_seconds": float(sum(p["seconds"] for p in projected if not p["optional"])),
            "notes": plan.get("notes"),
            "wall_seconds": plan_wall,
        },
        "fit": {
            "command_seconds": fit_wall,
            "seconds": total,
            "passes": measured,
            "passes_seconds": passes_seconds,
            "learn_seconds": total - passes_seconds,
            "runs_in": fit.get("runs_in"),
            "route": report.get("route"),
            "subspace_rank": report.get("subspace", {}).get("rank"),
            "coverage_queries": report.get("coverage", {}).get("queries"),
            "refinement": {k: report.get("refinement", {}).get(k) for k in ("samples", "parts", "passes", "stop")},
            "residual_rounds": len(report.get("residual_rounds", [])),
            "control_rounds": len(report.get("control_rounds", [])),
            "merged": "network_merged" in report,
            "dropped_spare": len(report.get("dropped_spare", [])),
        },
        "parameter_error": compare(net, model).relative_error,
        "test_error": test_error(net, model),
        "width_found": model.weights[0].shape[0],
        "load_start": load_start,
        "load_end": load_end,
    }


def table(rows: list[dict]) -> list[str]:
    """A Markdown table: projected against measured seconds, the passes (each), the learn after them and the
    whole fit, with the load (the plan's probe of the teacher is timed under it too, so no factor of it is taken
    out)."""
    out = [
        "| network | d | k (found) | m | passes projected → measured (s) | learn projected (at most) → measured (s) "
        "| fit projected → measured (s) | measured / projected | param. error | test error | load start → end |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        proj = ", ".join(f"{p['seconds']:.1f}" for p in r["plan"]["passes"])
        meas = ", ".join(f"{p['seconds']:.1f}" for p in r["fit"]["passes"])
        learn = r["plan"]["learn"] or {"seconds": 0.0, "seconds_max": 0.0}
        ratio = r["fit"]["seconds"] / r["plan"]["projected_seconds"]
        out.append(
            f"| {r['name']} | {r['d']} | {r['width']} ({r['width_found']}) | {r['outputs']} | {proj} → {meas} "
            f"| {learn['seconds']:.1f} ({learn['seconds_max']:.0f}) → {r['fit']['learn_seconds']:.1f} "
            f"| {r['plan']['projected_seconds']:.1f} → {r['fit']['seconds']:.1f} | {ratio:.2f} "
            f"| {r['parameter_error']:.2g} | {r['test_error']:.2g} "
            f"| {r['load_start'][0]:.1f} → {r['load_end'][0]:.1f} |"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep its teachers, stores and models")
    args = parser.parse_args()
    result: dict = {"when": utc_now(), "machine": {"cpu": cpu_model(), "cores": os.cpu_count()}, "networks": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name in args.only:
            try:
                row = run(name, folder)
            except Exception as exc:  # a failed fit is a result too: record it, go on
                row = {"name": name, "error": str(exc)[-3000:]}
            result["networks"].append(row)
            print(json.dumps(row, default=str)[:2000], flush=True)
            save_json(result, args.out)
    print("\n".join(table([r for r in result["networks"] if "error" not in r])))


if __name__ == "__main__":
    main()
