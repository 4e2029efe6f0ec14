"""Extraction of trained networks: ``relulearn fit --method tensor`` on ONNX exports of scikit-learn MLPs, side by
side with what a user would do instead — distil a same-width ``MLPRegressor`` on the same number of queries.

For each teacher (an ``MLPRegressor`` trained on a data set scikit-learn ships, inputs standardised, exported by
skl2onnx in float32, intercepts kept; or a PyTorch network trained on the same data and exported by
``torch.onnx``), on ONE shared two-worker ``LocalCluster``:

* relulearn: ``api.plan`` and then ``api.fit(config, store, "tensor")`` on the ONNX teacher; the plan's projection
  of each pass, of the learn and of the whole fit against the measured times; the queries it used (both passes, the
  bounded samples of polish and of the residual rounds, the streamed refinement's passes), its wall time, and
  against the teacher's float64 weights the parameter error (up to permutation and positive rescaling, biases
  and output weights included) and the relative test error on 10⁵ fresh Gaussian inputs;
* the student: a same-width ``MLPRegressor`` (ReLU, Adam) trained on Gaussian queries of the teacher, as many
  as fit a time cap (``--student-seconds``), with the same two errors.

Writes ``benchmarks/results/extract.json`` and a plot (``extract.png``: parameter and test error against width,
both methods) and prints the table the README shows. ``--only NAME`` runs some teachers (names as in
``TEACHERS``); ``--quick`` a smoke run at smaller sample counts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from relulearn import api  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.network import Network, compare  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.sources import Stream, generator  # noqa: E402

from _common import cpu_model, save_json, utc_now  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "extract.json"

#: (name, data set, width, samples of each pass, trainer: scikit-learn's MLPRegressor or a PyTorch module)
TEACHERS = [
    ("wine-8", "wine", 8, 2_000_000, "sklearn"),
    ("wine-16", "wine", 16, 4_000_000, "sklearn"),
    ("wine-32", "wine", 32, 10_000_000, "sklearn"),
    ("wine-64", "wine", 64, 20_000_000, "sklearn"),
    ("cancer-16", "breast_cancer", 16, 2_000_000, "sklearn"),
    ("cancer-64", "breast_cancer", 64, 20_000_000, "sklearn"),
    ("torch-wine-24", "wine", 24, 10_000_000, "torch"),
    ("regression60-24", "regression60", 24, 2_000_000, "outputs"),
    ("digits-128", "digits", 128, 2**20, "digits"),
    ("digits-512", "digits", 512, 2**20, "digits"),
]

TEST_ROWS = 100_000


def trained_teacher(data: str, width: int, folder: Path) -> tuple[Network, Path]:
    """An MLPRegressor of ``width`` ReLU units trained on a scikit-learn data set (standardised inputs and
    label), exported by skl2onnx: its float64 network and the ONNX file."""
    from skl2onnx import to_onnx
    from sklearn import datasets
    from sklearn.neural_network import MLPRegressor

    x, y = getattr(datasets, f"load_{data}")(return_X_y=True)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    y = (y - y.mean()) / y.std()
    mlp = MLPRegressor(hidden_layer_sizes=(width,), max_iter=3000, random_state=0).fit(x, y)
    path = folder / f"{data}-{width}.onnx"
    path.write_bytes(to_onnx(mlp, x[:1].astype(np.float32)).SerializeToString())
    net = Network(
        (mlp.coefs_[0].T.copy(), mlp.coefs_[1].T.copy()), (mlp.intercepts_[0].copy(), mlp.intercepts_[1].copy())
    )
    return net, path


def torch_teacher(data: str, width: int, folder: Path) -> tuple[Network, Path]:
    """A PyTorch ``Linear(d, width) → ReLU → Linear(width, 1)`` trained (Adam, 2000 full-batch steps) on a
    scikit-learn data set, exported by ``torch.onnx`` with a variable batch size: its float64 network and the
    file."""
    import torch
    from sklearn import datasets

    x, y = getattr(datasets, f"load_{data}")(return_X_y=True)
    x = torch.tensor((x - x.mean(axis=0)) / x.std(axis=0), dtype=torch.float32)
    y = torch.tensor((y - y.mean()) / y.std(), dtype=torch.float32)[:, None]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(2000):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    path = folder / f"torch-{data}-{width}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x[:2],),
            str(path),
            input_names=["input"],
            output_names=["y"],
            dynamic_axes={"input": {0: "n"}, "y": {0: "n"}},
            dynamo=False,
        )
    w = [p.detach().double().numpy() for p in model.parameters()]
    return Network((w[0], w[2]), (w[1], w[3])), path


def digits_teacher(data: str, width: int, folder: Path) -> tuple[Network, Path]:
    """28 × 28 images: scikit-learn's 8 × 8 digits upsampled (linear interpolation) and standardised (pixels that
    never vary left at zero), an ``MLPRegressor`` of ``width`` ReLU units trained on the 10 one-hot classes (500
    Adam epochs), exported with ``torch.onnx`` (float32, variable batch): skl2onnx flattens the 10 outputs of a
    multi-output MLPRegressor to one column. Its float32 weights as a float64 network, and the file."""
    import torch
    from scipy.ndimage import zoom
    from sklearn import datasets
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    x, label = datasets.load_digits(return_X_y=True)
    x = np.stack([zoom(im, 3.5, order=1) for im in x.reshape(-1, 8, 8)]).reshape(len(x), -1)
    sd = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(width,), max_iter=500, random_state=0).fit(x, np.eye(10)[label])
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    with torch.no_grad():
        for layer, w, b in (
            (model[0], mlp.coefs_[0], mlp.intercepts_[0]),
            (model[2], mlp.coefs_[1], mlp.intercepts_[1]),
        ):
            layer.weight.copy_(torch.tensor(w.T))
            layer.bias.copy_(torch.tensor(b))
    path = folder / f"digits-{width}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros((2, x.shape[1])),),
            str(path),
            input_names=["input"],
            output_names=["y"],
            dynamic_axes={"input": {0: "n"}, "y": {0: "n"}},
            dynamo=False,
        )
    w = [p.detach().double().numpy() for p in model.parameters()]
    return Network((w[0], w[2]), (w[1], w[3])), path


def outputs_teacher(data: str, width: int, folder: Path) -> tuple[Network, Path]:
    """An MLPRegressor of ``width`` ReLU units on scikit-learn's ``make_regression`` with 60 features and 10
    targets (standardised), exported as a float32 ``Gemm → Relu → Gemm`` graph (skl2onnx flattens a
    multi-output MLP's outputs to one column): ``benchmarks/heldout.py``'s teachers, its float64 network and the
    ONNX file."""
    from heldout import teacher

    return teacher(data, width, folder)


TRAINERS = {"sklearn": trained_teacher, "torch": torch_teacher, "digits": digits_teacher, "outputs": outputs_teacher}


def queries(done: dict[str, Any], outputs: int = 1) -> int:
    """The teacher's answers a fit used: the store's samples, each pass's, and the bounded and streamed ones the
    learner drew (training and validation samples, control and residual rounds, refinement passes)."""
    from relulearn.estimators.tensor.finish import RESIDUAL_SAMPLES
    from relulearn.estimators.tensor.plan import sample_sizes

    rep = done["report"]
    n = done["samples"] * (1 + len(done["passes"]))
    d, k = done["input_dim"], done["width"]
    n_train, n_val = sample_sizes(d, k, outputs)
    n += int(rep.get("coverage", {}).get("queries", 0))
    n += n_train + n_val
    n += RESIDUAL_SAMPLES * sum(1 for r in rep.get("residual_rounds", []) if "rank" in r)
    n += sum(int(r["samples"]) for r in rep.get("control_rounds", []))
    refine = rep.get("refinement", {})
    n += int(refine.get("samples", 0)) * int(refine.get("passes", 0))
    return int(n)


def errors(teacher: Network, model: Any, d: int) -> dict[str, float | None]:
    x = generator(9, Stream.TEST, 0).standard_normal((TEST_ROWS, d))
    y = teacher.forward(x)
    out = {"relative_test_error": float(np.sum((y - model.forward(x)) ** 2) / np.sum(y**2))}
    try:
        out["parameter_error"] = float(compare(teacher, model).relative_error)
    except ValueError:
        out["parameter_error"] = None
    return out


def run_relulearn(teacher: Network, onnx: Path, samples: int, client: Any, workdir: Path) -> dict[str, Any]:
    d = teacher.input_dim
    cfg = {
        "seed": 1,
        "samples": samples,
        "chunk_size": max(100_000, samples // 100),
        "source": {"d": d, "teacher": {"onnx": str(onnx)}},
        "run": {"commit_interval": 1e9},
    }
    store, out = workdir / f"{onnx.stem}.zarr", workdir / f"{onnx.stem}.npz"
    plan = api.plan(config_from_dict(cfg), "tensor", workers=2)  # on the two workers the fit is given
    t0 = time.perf_counter()
    done = api.fit(config_from_dict(cfg), str(store), "tensor", out=str(out), client=client, progress=None)
    seconds = time.perf_counter() - t0
    rep = done["report"]
    measured = [{"name": "estimate", "seconds": done["estimate"]["seconds"]}]
    measured += [{"name": p["name"], "seconds": p["seconds"]} for p in done["passes"]]
    rec = {
        "samples_per_pass": samples,
        "queries": queries(done, teacher.output_dim),
        "seconds": seconds,
        "plan": {
            "projected_seconds": plan["projected_seconds"],
            "projected_seconds_max": plan["projected_seconds_max"],
            "passes": [{"name": p["name"], "seconds": p["projected_seconds"]} for p in plan["passes"]],
            "learn": plan["learn"],
        },
        "passes": measured,
        "learn_seconds": seconds - sum(p["seconds"] for p in measured),
        "route": rep["route"],
        "width_found": rep["width_found"],
        "chosen": rep["chosen"],
        "validation_relative_loss": rep["validation_relative_loss"],
        "orientation": rep["network"].get("orientation", {}).get("method"),
        "residual_rounds": len(rep.get("residual_rounds", [])),
        "control_rounds": [r["rank"] for r in rep.get("control_rounds", [])],
        **errors(teacher, Network.load(out), d),
    }
    shutil.rmtree(store, ignore_errors=True)
    return rec


class _Teacher:
    """The teacher's float32 answers, as the ONNX model gives them (queried in process for the student)."""

    def __init__(self, onnx: Path):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(onnx), opts, providers=["CPUExecutionProvider"])
        self.name = self.session.get_inputs()[0].name

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.name: x.astype(np.float32)})[0].astype(np.float64).reshape(len(x), -1)


def run_student(teacher: Network, onnx: Path, width: int, queries_cap: int, seconds: float) -> dict[str, Any]:
    """A same-width MLPRegressor distilled on fresh Gaussian queries of the teacher, batch after batch, until the
    time cap or as many queries as relulearn used."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    d = teacher.input_dim
    ask = _Teacher(onnx)
    model = MLPRegressor(
        hidden_layer_sizes=(width,),
        activation="relu",
        solver="adam",
        batch_size=256,
        learning_rate_init=1e-3,
        random_state=0,
    )
    rng = np.random.default_rng(5)
    used, t0 = 0, time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        while used < queries_cap and time.perf_counter() - t0 < seconds:
            x = rng.standard_normal((50_000, d))
            y = ask(x)
            model.partial_fit(x, y[:, 0] if y.shape[1] == 1 else y)
            used += len(x)
    w = Network(
        (model.coefs_[0].T.copy(), model.coefs_[1].T.copy()), (model.intercepts_[0].copy(), model.intercepts_[1].copy())
    )
    return {"queries": used, "seconds": time.perf_counter() - t0, **errors(teacher, w, d)}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["teachers"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for ax, key, label in (
        (axes[0], "parameter_error", "relative parameter error"),
        (axes[1], "relative_test_error", "relative test error (Gaussian inputs)"),
    ):
        for data, trainer, marker in (
            ("wine", "sklearn", "o"),
            ("breast_cancer", "sklearn", "s"),
            ("wine", "torch", "*"),
            ("digits", "digits", "D"),
        ):
            sel = [r for r in rows if r["data"] == data and r.get("trainer", "sklearn") == trainer]
            if not sel:
                continue
            widths = [r["width"] for r in sel]
            for who, color in (("relulearn", "C0"), ("student", "C3")):
                ys = [max(r[who].get(key) or np.nan, 1e-18) for r in sel]
                export = "skl2onnx" if trainer == "sklearn" else "torch.onnx"
                ax.semilogy(
                    widths,
                    ys,
                    marker + "-",
                    color=color,
                    ms=9 if marker == "*" else 5,
                    label=f"{who}, {data} (d = {sel[0]['d']}, {export})",
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("hidden width")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        "Extracting trained MLPs (float32 ONNX): relulearn --method tensor vs a distilled same-width MLPRegressor",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    def f(v: Any, fmt: str = ".1e") -> str:
        return "" if v is None else format(v, fmt)

    lines = [
        "| teacher | d | width | m | relulearn queries | passes: projected → measured s | s (projected) "
        "| param. error | test error | student queries | s | param. error | test error |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["teachers"]:
        a, b = r["relulearn"], r["student"]
        plan = a.get("plan")
        passes = "not projected (a record made before the plan was)"
        if plan is not None:
            passes = "; ".join(
                f"{p['name']} {p['seconds']:.0f} → {m['seconds']:.0f}" for p, m in zip(plan["passes"], a["passes"])
            )
        projected = "" if plan is None else f" ({plan['projected_seconds']:.0f})"
        lines.append(
            f"| {r['name']} | {r['d']} | {r['width']} | {r.get('outputs', 1)} | {f(a.get('queries'), '.2e')} | "
            f"{passes} | {f(a.get('seconds'), '.0f')}{projected} | {f(a.get('parameter_error'))} | "
            f"{f(a.get('relative_test_error'))} "
            f"| {f(b.get('queries'), '.2e')} | {f(b.get('seconds'), '.0f')} | {f(b.get('parameter_error'))} | "
            f"{f(b.get('relative_test_error'))} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", default="", help="comma-separated teacher names (default: all)")
    ap.add_argument("--quick", action="store_true", help="smoke run: a tenth of the samples")
    ap.add_argument("--student-seconds", type=float, default=180.0, help="time cap of the distilled student")
    args = ap.parse_args(argv)
    chosen = [t for t in TEACHERS if not args.only or t[0] in args.only.split(",")]
    result: dict[str, Any] = {
        "started": utc_now(),
        "machine": {"cpu": cpu_model(), "workers": 2},
        "quick": args.quick,
        "teachers": [],
    }
    if args.out.exists() and args.only:  # a partial rerun keeps the other teachers of the previous result
        previous = json.loads(args.out.read_text())
        result["teachers"] = [r for r in previous.get("teachers", []) if r["name"] not in {t[0] for t in chosen}]
    with tempfile.TemporaryDirectory(prefix="relulearn-bench-extract-") as tmp, connect(workers=2) as client:
        workdir = Path(tmp)
        for name, data, width, samples, trainer in chosen:
            samples = samples // 10 if args.quick else samples
            teacher, onnx = TRAINERS[trainer](data, width, workdir)
            rec = {"name": name, "data": data, "trainer": trainer, "d": teacher.input_dim, "width": width}
            rec["outputs"] = teacher.output_dim
            rec["relulearn"] = run_relulearn(teacher, onnx, samples, client, workdir)
            rec["student"] = run_student(teacher, onnx, width, rec["relulearn"]["queries"], args.student_seconds)
            result["teachers"].append(rec)
            print(json.dumps({k: rec[k] for k in ("name", "relulearn", "student")}, default=str), flush=True)
    order = [t[0] for t in TEACHERS]
    result["teachers"].sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    result["finished"] = utc_now()
    save_json(result, args.out)
    plot(result, args.out.with_suffix(".png"))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
