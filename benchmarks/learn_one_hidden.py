"""Learning curves of the ``moments`` method on planted one-hidden-layer ReLU networks,
against scikit-learn's MLPRegressor (a script, not a test).

For each input dimension d, width k and label noise σ ∈ {0, 0.1}, and a ladder of sample
counts, one run of ``relulearn.api.fit(cfg, store, "moments", width=k)`` (all runs on ONE
shared ``LocalCluster`` with two workers), then ``relulearn.api.evaluate`` on 10⁵ fresh
test samples (``Stream.TEST``). Recorded per point:

- the spectral stage alone: the largest principal angle between the subspace the method
  used (``report["subspace"]["basis"]``, after any adaptive pass) and the span of the
  teacher's rows ``u_i``; when the found rank is below k, the angle is π/2 (a teacher
  direction is missing) and the raw angles are kept as well;
- the whole method: relative test error E[(y − f̂)²]/E[y²] (noise included for σ > 0,
  next to the noise floor σ²/E[y²]) and the symmetry-aware parameter error
  (``relulearn.network.compare``);
- the same training samples given to ``MLPRegressor(hidden_layer_sizes=(k,),
  activation="relu", solver="adam")``: exactly the first n samples of the run's chunk
  stream (the bytes the estimation saw; all n of them unless ``--mlp-max-samples`` caps
  it), trained by ``partial_fit`` epochs until a wall-clock cap ``--mlp-seconds`` (default
  60 s, at least one full epoch, at most 200 epochs; recorded per point). sklearn's MLP
  always has biases; its weight error is computed on the network built from ``coefs_``
  with the biases dropped (noted in the JSON).
- wall time of each step.

Before the curves, an exactness grid: noiseless planted networks for every
d ∈ {10, 50, 200} and k ∈ {1, …, 5} at one sample count (``--grid-samples``, default 2·10⁵),
recording parameter and test error against the targets 1e-8 and 1e-12.

The sample ladder of one (d, k, σ) is nested: one store is extended from the smallest
count to the largest (a later ``fit`` with more samples extends the store; the adaptive
pass a method may request is removed before each step so it is recomputed for the new
count). A point whose predicted time would overrun ``--budget`` is skipped and recorded as
such; a point whose method raises is recorded with the error.

``--refinement`` runs only the noisy curve d = 50, k = 3, σ = 0.1, n = 10⁵ … 10⁷ of the streamed
refinement beside the bounded-sample polish alone (``refine_samples=0``, the curve before the
refinement existed) and MLPRegressor at the true width and at 8× it, each trained for the wall time of
relulearn's fit at that n; errors are excess errors E[(f̂ − F)²]/E[y²] against the noiseless teacher on
10⁶ test inputs (``learn_one_hidden_refinement.json`` and ``.png``, about 20 minutes).

Run ``python benchmarks/learn_one_hidden.py`` (about an hour on 2 cores) or
``--quick`` for a smoke run. Writes ``benchmarks/results/learn_one_hidden.json`` and a PNG
next to it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from relulearn import api  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.estimators.spectral import stage as spectral  # noqa: E402
from relulearn.estimators.spectral.stored_matrices import matrices_from_store  # noqa: E402
from relulearn.estimators.spectral.subspace_geometry import principal_angles  # noqa: E402
from relulearn.network import Network, compare  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.sources import Stream, chunk_batches, draw, make_source  # noqa: E402

from _common import save_json, utc_now  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "learn_one_hidden.json"
TEACHER_SEED = 11
RUN_SEED = 5
MLP_SEED = 0
CHUNK = 50_000
TEST_SAMPLES = 100_000


def machine_info() -> dict[str, Any]:
    import dask
    import distributed
    import psutil
    import scipy
    import sklearn

    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "load_average_at_start": list(os.getloadavg()),
        "versions": {
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "dask": dask.__version__,
            "distributed": distributed.__version__,
            "sklearn": sklearn.__version__,
        },
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
    }


def make_config(d: int, k: int, noise: float, samples: int) -> dict[str, Any]:
    return {
        "seed": RUN_SEED,
        "samples": samples,
        "chunk_size": CHUNK,
        "source": {
            "d": d,
            "teacher": {"kind": "one_hidden_relu", "width": k, "seed": TEACHER_SEED},
            "noise_std": noise,
        },
        "run": {"commit_interval": 30},
    }


def largest_angle(basis: np.ndarray, teacher_u: np.ndarray) -> tuple[float, list[float]]:
    """Largest principal angle between span(basis) and span(teacher rows); π/2 if rank < k."""
    k = teacher_u.shape[0]
    if basis.size == 0 or basis.shape[1] == 0:
        return float(np.pi / 2), []
    ang = principal_angles(basis, teacher_u.T)
    raw = [float(a) for a in ang]
    return (float(np.pi / 2) if basis.shape[1] < k else float(np.max(ang))), raw


def run_relulearn(cfg_dict: dict, store: str, workdir: Path, client: Any, teacher_u: np.ndarray) -> dict[str, Any]:
    """One fit + evaluate; returns the point's record (never raises)."""
    d, k, n = cfg_dict["source"]["d"], cfg_dict["source"]["teacher"]["width"], cfg_dict["samples"]
    rec: dict[str, Any] = {"samples": n}
    shutil.rmtree(os.path.join(store, "passes"), ignore_errors=True)  # passes of smaller counts: only disk
    cfg_path = workdir / f"cfg_d{d}_k{k}_s{cfg_dict['source']['noise_std']}_n{n}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg_dict))
    model = str(workdir / f"model_d{d}_k{k}_n{n}.npz")
    t0 = time.perf_counter()
    try:
        res = api.fit(config_from_dict(cfg_dict), store, "moments", width=k, out=model, client=client, progress=None)
    except Exception as err:  # recorded, not fatal
        rec.update(
            status="error",
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(limit=3),
            fit_seconds=time.perf_counter() - t0,
        )
        # the spectral stage alone, from the stored statistics, when the store has them
        try:
            from relulearn import open_store

            mats, ses, names = matrices_from_store(open_store(store).arrays("contracted"))
            sub = spectral.relevant_subspace(mats, ses, rank=k, names=names)
            rec["angle"], rec["angles"] = largest_angle(sub.basis, teacher_u)
            rec["subspace_rank"] = int(sub.rank)
            rec["angle_note"] = "recomputed from the stored contracted statistics (no adaptive pass)"
        except Exception as err2:
            rec["angle_error"] = f"{type(err2).__name__}: {err2}"
        return rec
    rec["fit_seconds"] = time.perf_counter() - t0
    rec["estimate_seconds"] = res["estimate"]["seconds"]
    rec["learn_seconds"] = res["seconds"]
    rec["samples"] = res["samples"]
    rec["passes"] = [{"name": p["name"], "reason": p["reason"], "seconds": p["seconds"]} for p in res["passes"]]
    sub = res["report"]["subspace"]
    basis = np.asarray(sub["basis"], dtype=float).reshape(d, -1)
    rec["subspace_rank"] = int(sub["rank"])
    rec["subspace_supported"] = bool(sub["supported"])
    rec["angle_bound"] = sub.get("angle_bound")
    rec["angle"], rec["angles"] = largest_angle(basis, teacher_u)
    rec["chosen"] = res["report"].get("chosen")
    rec["merged_units"] = res["report"].get("merged_units", [])
    t1 = time.perf_counter()
    ev = api.evaluate(model, cfg_path, samples=TEST_SAMPLES)
    rec["evaluate_seconds"] = time.perf_counter() - t1
    rec["relative_test_error"] = ev["relative_test_error"]
    rec["noise_floor"] = ev["noise_floor"]
    rec["parameter_error"] = ev["parameter_error"]
    rec["unit_errors"] = ev.get("unit_errors")
    rec["status"] = "ok"
    return rec


def training_samples(source: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n samples of the run's chunk stream: what the estimation saw."""
    xs, ys, got, chunk = [], [], 0, 0
    while got < n:
        for x, y in chunk_batches(source, RUN_SEED, chunk, CHUNK):
            xs.append(x)
            ys.append(y)
            got += len(y)
        chunk += 1
    return np.concatenate(xs)[:n], np.concatenate(ys)[:n]


def run_mlp(
    source: Any,
    k: int,
    n: int,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    max_samples: int | None,
    seconds: float,
    max_epochs: int = 200,
) -> dict[str, Any]:
    """MLPRegressor on the first min(n, max_samples) training samples, epochs until the time cap
    (at least one epoch)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    n_used = n if max_samples is None else min(n, max_samples)
    rec: dict[str, Any] = {
        "samples_given": n,
        "samples_used": n_used,
        "sample_cap": max_samples,
        "seconds_cap": seconds,
    }
    try:
        t0 = time.perf_counter()
        x, y = training_samples(source, n_used)
        rec["data_seconds"] = time.perf_counter() - t0
        m = MLPRegressor(
            hidden_layer_sizes=(k,),
            activation="relu",
            solver="adam",
            random_state=MLP_SEED,
            batch_size=200,
            learning_rate_init=1e-3,
        )
        t0 = time.perf_counter()
        best, epochs, stop = np.inf, 0, "seconds cap"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            while epochs == 0 or time.perf_counter() - t0 < seconds:
                m.partial_fit(x, y)
                epochs += 1
                best = min(best, m.loss_)
                if epochs >= max_epochs:
                    stop = f"{max_epochs} epochs"
                    break
        rec["train_seconds"] = time.perf_counter() - t0
        rec["epochs"] = epochs
        rec["stopped_by"] = stop
        rec["final_training_loss"] = float(m.loss_)
        pred = m.predict(x_test)
        rec["relative_test_error"] = float(np.mean((y_test - pred) ** 2) / np.mean(y_test**2))
        net = Network((m.coefs_[0].T.copy(), m.coefs_[1].T.copy()), activation="relu")
        cmp = compare(make_source_network(source), net)
        rec["parameter_error"] = cmp.relative_error
        rec["unit_errors"] = list(cmp.unit_errors)
        del x, y
        rec["bias_norms"] = {
            "hidden": float(np.linalg.norm(m.intercepts_[0])),
            "output": float(np.abs(m.intercepts_[1]).sum()),
        }
        rec["status"] = "ok"
    except Exception as err:
        rec.update(status="error", error=f"{type(err).__name__}: {err}")
    return rec


def make_source_network(source: Any) -> Network:
    return source.network


def excess_error(predict: Any, source: Any, x: np.ndarray, y2: float) -> float:
    """``E[(f̂(x) − F(x))²] / E[y²]`` on the test inputs, against the noiseless teacher F: the test
    error above the noise floor, measured without the noise's own sampling error."""
    f = source.network.forward(x)[:, 0]
    return float(np.mean((predict(x) - f) ** 2) / y2)


def _mlp_same_time(
    source: Any, width: int, n: int, seconds: float, x_test: np.ndarray, y2: float, max_samples: int | None
) -> dict[str, Any]:
    """MLPRegressor of ``width`` hidden units on the first n samples for ``seconds`` (at least one
    epoch): the excess test error and, at the true width, the parameter error."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    n_used = n if max_samples is None else min(n, max_samples)
    rec: dict[str, Any] = {"width": width, "samples_used": n_used, "seconds_cap": seconds}
    x, y = training_samples(source, n_used)
    m = MLPRegressor(
        hidden_layer_sizes=(width,),
        activation="relu",
        solver="adam",
        random_state=MLP_SEED,
        batch_size=200,
        learning_rate_init=1e-3,
    )
    t0, epochs = time.perf_counter(), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        while epochs == 0 or time.perf_counter() - t0 < seconds:
            m.partial_fit(x, y)
            epochs += 1
    del x, y
    rec.update(
        train_seconds=time.perf_counter() - t0, epochs=epochs, excess_error=excess_error(m.predict, source, x_test, y2)
    )
    if width == source.network.weights[0].shape[0]:
        net = Network((m.coefs_[0].T.copy(), m.coefs_[1].T.copy()), activation="relu")
        rec["parameter_error"] = compare(source.network, net).relative_error
    return rec


def refinement_curve(
    client: Any,
    workdir: Path,
    log: Any,
    *,
    ladder: list[int],
    mlp_max_samples: int | None,
    d: int = 50,
    k: int = 3,
    noise: float = 0.1,
    test_samples: int = 1_000_000,
) -> dict[str, Any]:
    """The noisy curve with and without the streamed refinement, and the MLP at the true width and at 8×
    the width, each trained for the wall time of relulearn's fit at that n (one nested store)."""
    from numpy.polynomial import polynomial as P

    source = make_source(config_from_dict(make_config(d, k, noise, ladder[0])))
    x_test, _ = draw(source, RUN_SEED, Stream.TEST, test_samples)
    y2 = float(np.mean(source.network.forward(x_test)[:, 0] ** 2)) + noise**2
    store = str(workdir / f"refine_d{d}_k{k}.zarr")
    points = []
    for n in ladder:
        cfg = make_config(d, k, noise, n)
        shutil.rmtree(os.path.join(store, "passes"), ignore_errors=True)
        pt: dict[str, Any] = {"samples": n}
        t0 = time.perf_counter()
        res = api.fit(
            config_from_dict(cfg), store, "moments", width=k, out=str(workdir / "r.npz"), client=client, progress=None
        )
        fit_seconds = time.perf_counter() - t0
        ref = res["report"].get("refinement", {})
        net = Network.load(workdir / "r.npz")
        pt["refined"] = {
            "fit_seconds": fit_seconds,
            "estimate_seconds": res["estimate"]["seconds"],
            "passes": ref.get("passes"),
            "stop": ref.get("stop"),
            "kept": ref.get("kept"),
            "refine_samples": ref.get("samples"),
            "excess_error": excess_error(lambda x, net=net: net.forward(x)[:, 0], source, x_test, y2),
            "parameter_error": compare(source.network, net).relative_error,
        }
        t0 = time.perf_counter()
        api.learn(store, "moments", width=k, refine_samples=0, out=str(workdir / "b.npz"), client=client, progress=None)
        base = Network.load(workdir / "b.npz")
        pt["bounded_sample"] = {
            "learn_seconds": time.perf_counter() - t0,
            "excess_error": excess_error(lambda x, base=base: base.forward(x)[:, 0], source, x_test, y2),
            "parameter_error": compare(source.network, base).relative_error,
        }
        pt["mlp"] = [_mlp_same_time(source, w, n, fit_seconds, x_test, y2, mlp_max_samples) for w in (k, 8 * k)]
        log(
            f"refinement d={d} k={k} σ={noise} n={n:.0e}: refined excess {pt['refined']['excess_error']:.2e} param "
            f"{pt['refined']['parameter_error']:.2e} ({pt['refined']['passes']} passes, {fit_seconds:.0f} s); "
            f"bounded-sample excess {pt['bounded_sample']['excess_error']:.2e}; MLP excess "
            + ", ".join(f"{m['width']} units {m['excess_error']:.2e}" for m in pt["mlp"])
        )
        points.append(pt)
    ns = np.log([p["samples"] for p in points])
    slopes = {
        key: float(P.polyfit(ns, np.log([p["refined"][key] for p in points]), 1)[1])
        for key in ("excess_error", "parameter_error")
    }
    return {
        "d": d,
        "k": k,
        "noise_std": noise,
        "test_samples": test_samples,
        "points": points,
        "log_log_slopes": slopes,
        "excess_error": "E[(f̂ − F)²]/E[y²] on the test inputs against the noiseless teacher F",
        "mlp": "MLPRegressor(activation='relu', solver='adam', batch_size=200, learning_rate_init=1e-3) "
        "at the true width and at 8× it, on the first n training samples (capped as noted), trained by "
        "epochs for the wall time of relulearn's fit (estimate + learn + refinement) at the same n",
    }


def plot_refinement(curve: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = curve["points"]
    n = [p["samples"] for p in pts]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    ax = axes[0]
    ax.loglog(n, [p["refined"]["excess_error"] for p in pts], "o-", label="relulearn moments (streamed refinement)")
    ax.loglog(n, [p["bounded_sample"]["excess_error"] for p in pts], "s--", label="moments, bounded-sample polish only")
    for i, style in enumerate(("x:", "d:")):
        ax.loglog(
            n,
            [p["mlp"][i]["excess_error"] for p in pts],
            style,
            label=f"MLPRegressor, {pts[0]['mlp'][i]['width']} units, same wall time",
        )
    ax.set_title(
        f"excess test error over the noise floor (slope {curve['log_log_slopes']['excess_error']:.2f})", fontsize=10
    )
    ax = axes[1]
    ax.loglog(n, [p["refined"]["parameter_error"] for p in pts], "o-", label="streamed refinement")
    ax.loglog(n, [p["bounded_sample"]["parameter_error"] for p in pts], "s--", label="bounded-sample polish only")
    ax.loglog(n, [p["mlp"][0]["parameter_error"] for p in pts], "x:", label="MLPRegressor, true width")
    ax.set_title(f"parameter error (slope {curve['log_log_slopes']['parameter_error']:.2f})", fontsize=10)
    for ax in axes:
        ax.set_xlabel("samples n")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"d = {curve['d']}, k = {curve['k']}, σ = {curve['noise_std']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result["series"]
    dks = sorted({(s["d"], s["k"]) for s in series})
    colors = {dk: c for dk, c in zip(dks, ["C0", "C1", "C2", "C3", "C4", "C5"])}
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    titles = [
        "spectral stage: largest principal angle (rad)",
        "relative test error, σ = 0 (values < 1e-16 drawn at 1e-16)",
        "relative test error, σ = 0.1 (noise floor dotted)",
    ]
    for s in series:
        c = colors[(s["d"], s["k"])]
        lab = f"d={s['d']}, k={s['k']}"
        pts = [p for p in s["points"] if p.get("relulearn", {}).get("status") == "ok"]
        angp = [p for p in s["points"] if p.get("relulearn", {}).get("angle") is not None]
        if s["noise_std"] == 0:
            if angp:
                axes[0].loglog(
                    [p["samples"] for p in angp],
                    [max(p["relulearn"]["angle"], 1e-12) for p in angp],
                    "o-",
                    color=c,
                    label=lab + " (σ=0)",
                )
            ax = axes[1]
        else:
            if angp:
                axes[0].loglog(
                    [p["samples"] for p in angp],
                    [max(p["relulearn"]["angle"], 1e-12) for p in angp],
                    "s--",
                    color=c,
                    alpha=0.6,
                    label=lab + " (σ=0.1)",
                )
            ax = axes[2]
            fl = [p for p in pts if p["relulearn"].get("noise_floor") is not None]
            if fl:
                ax.loglog([p["samples"] for p in fl], [p["relulearn"]["noise_floor"] for p in fl], ":", color=c)
        if pts:
            ax.loglog(
                [p["samples"] for p in pts],
                [max(p["relulearn"]["relative_test_error"], 1e-16) for p in pts],
                "o-",
                color=c,
                label=lab + " relulearn",
            )
        mp = [p for p in s["points"] if p.get("mlp", {}).get("status") == "ok"]
        if mp:
            ax.loglog(
                [p["samples"] for p in mp],
                [p["mlp"]["relative_test_error"] for p in mp],
                "x--",
                color=c,
                label=lab + " MLPRegressor",
            )
    for ax, t in zip(axes, titles):
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("samples n")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        "relulearn 'moments' vs scikit-learn MLPRegressor (ReLU, Adam, true width, same samples; "
        "time cap in the JSON) "
        "on planted one-hidden-layer ReLU networks",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grid_table(result: dict[str, Any]) -> str:
    lines = ["| d | k | n | param err | test err | exact | fit s |", "|---:|---:|---:|---:|---:|---|---:|"]
    for r in result["grid"]["points"]:
        pe, te = r.get("parameter_error"), r.get("relative_test_error")
        lines.append(
            f"| {r['d']} | {r['k']} | {r['samples']:.0e} | {'' if pe is None else format(pe, '.1e')} "
            f"| {'' if te is None else format(te, '.1e')} | {r.get('exact', r['status'])} "
            f"| {r.get('fit_seconds', 0):.1f} |"
        )
    return "\n".join(lines)


def table(result: dict[str, Any]) -> str:
    lines = [
        "| σ | d | k | n | rank | angle (rad) | test err | floor | param err | MLP n used | MLP epochs "
        "| MLP test err | MLP param err | fit s | MLP s | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def f(v: Any, fmt: str = ".2e") -> str:
        return "" if v is None else format(v, fmt)

    for s in result["series"]:
        for p in s["points"]:
            r, m = p.get("relulearn", {}), p.get("mlp", {})
            status = r.get("status", "")
            if status == "error":
                status += ": " + r["error"][:60]
            lines.append(
                f"| {s['noise_std']} | {s['d']} | {s['k']} | {p['samples']:.0e} | {r.get('subspace_rank', '')} "
                f"| {f(r.get('angle'))} | {f(r.get('relative_test_error'))} | {f(r.get('noise_floor'))} "
                f"| {f(r.get('parameter_error'))} | {f(m.get('samples_used'), '.0e')} | {m.get('epochs', '')} "
                f"| {f(m.get('relative_test_error'))} | {f(m.get('parameter_error'))} "
                f"| {f(r.get('fit_seconds'), '.1f')} | {f(m.get('train_seconds'), '.1f')} | {status} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a fast smoke run (d=20, small counts)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT}); PNG beside it")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole run; points predicted to overrun it are skipped (default 5400)",
    )
    p.add_argument(
        "--mlp-seconds",
        type=float,
        default=None,
        help="wall-clock cap of one MLP fit, at least one epoch is always run (default 60)",
    )
    p.add_argument(
        "--mlp-max-samples",
        type=int,
        default=None,
        help="samples cap of one MLP fit (default: none, the MLP gets all n samples)",
    )
    p.add_argument(
        "--grid-samples",
        type=int,
        default=200_000,
        help="sample count of the noiseless exactness grid d in {10,50,200} x k in {1..5}",
    )
    p.add_argument(
        "--refinement",
        action="store_true",
        help="only the noisy curve d=50, k=3, σ=0.1, n = 1e5..1e7 with and without the streamed "
        "refinement, beside MLPs at the true width and at 8× it for the same wall time; writes "
        "learn_one_hidden_refinement.json and .png next to --out",
    )
    args = p.parse_args(argv)
    if args.refinement:
        return main_refinement(args)

    q = args.quick
    if q:
        plan = [(d, 3, s, [100_000, 200_000]) for d in (20, 40) for s in (0.0, 0.1)]
        grid = [(d, k) for d in (10, 20) for k in (1, 2)]
        budget = args.budget or 240.0
        mlp_seconds = args.mlp_seconds or 3.0
    else:
        # order = priority: the budget skips from the end (d=200 noisy last)
        ladder = [100_000, 300_000, 1_000_000, 3_000_000]
        plan = (
            [(50, k, s, ladder) for k in (3, 5) for s in (0.0, 0.1)]
            + [(200, k, 0.0, ladder) for k in (3, 5)]
            + [(200, k, 0.1, ladder) for k in (3, 5)]
        )
        grid = [(d, k) for d in (10, 50, 200) for k in (1, 2, 3, 4, 5)]
        budget = args.budget or 5400.0
        mlp_seconds = args.mlp_seconds or 60.0
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", flush=True)

    result: dict[str, Any] = {
        "benchmark": "learn_one_hidden",
        "started": utc_now(),
        "quick": q,
        "machine": machine_info(),
        "settings": {
            "teacher": "planted one_hidden_relu: unit rows u_i (random, teacher seed), λ_i random sign, |λ_i| in "
            "[0.5, 1.5]",
            "teacher_seed": TEACHER_SEED,
            "run_seed": RUN_SEED,
            "chunk_size": CHUNK,
            "method": "relulearn.api.fit(cfg, store, 'moments', width=k) on one shared LocalCluster (2 workers)",
            "test_samples": TEST_SAMPLES,
            "test_stream": "Stream.TEST of the run seed (relulearn.api.evaluate); "
            "the MLP is scored on the same samples",
            "angle": "largest principal angle between the subspace the method used (report.subspace.basis, after "
            "any adaptive pass) and span(u_i); pi/2 when the found rank < k",
            "ladder": "nested: one store per (d, k, sigma) extended from the smallest count to the largest",
            "budget_seconds": budget,
            "mlp": {
                "estimator": "sklearn.neural_network.MLPRegressor(hidden_layer_sizes=(k,), activation='relu', "
                "solver='adam', batch_size=200, learning_rate_init=1e-3, random_state=0)",
                "training_data": "the first min(n, cap) samples of the run's own chunk stream (the same samples "
                "the estimation used)",
                "sample_cap": args.mlp_max_samples or "none (all n samples)",
                "seconds_cap_per_fit": mlp_seconds,
                "training": "partial_fit epochs (minibatch 200, shuffled) until the seconds cap or 200 epochs, "
                "at least one full epoch; no loss-based early stop, so the MLP always gets its "
                "whole time cap",
                "biases": "sklearn's MLPRegressor always fits biases (no fit_intercept option); the weight "
                "error uses coefs_ only (W0 = coefs_[0].T (k, d), W1 = coefs_[1].T (1, k)), biases "
                "dropped; the test error uses the full model, biases included",
            },
        },
        "grid": {
            "samples": args.grid_samples,
            "targets": {"parameter_error": 1e-8, "relative_test_error": 1e-12},
            "points": [],
        },
        "series": [],
    }
    log(
        f"machine: {result['machine']['cores']} cores, load {result['machine']['load_average_at_start'][0]:.2f}; "
        f"budget {budget:.0f} s"
    )
    workdir = Path(tempfile.mkdtemp(prefix="relulearn-learnbench-"))
    last_learn: dict[int, float] = {}
    rate: dict[int, float] = {}
    try:
        with connect(workers=2) as client:
            log(f"cluster up: {len(client.scheduler_info()['workers'])} workers")
            for d, k in grid:
                cfg = make_config(d, k, 0.0, args.grid_samples)
                teacher_u = make_source(config_from_dict(cfg)).network.weights[0]
                r = run_relulearn(cfg, str(workdir / f"grid_d{d}_k{k}.zarr"), workdir, client, teacher_u)
                r.update(d=d, k=k)
                if r["status"] == "ok":
                    r["exact"] = bool(r["parameter_error"] <= 1e-8 and r["relative_test_error"] <= 1e-12)
                result["grid"]["points"].append(r)
                log(
                    f"grid d={d} k={k}: {r['status']} param {r.get('parameter_error')} test "
                    f"{r.get('relative_test_error')} exact {r.get('exact')} ({r.get('fit_seconds', 0):.1f} s)"
                )
            for d, k, noise, ladder in plan:
                cfg0 = make_config(d, k, noise, ladder[0])
                source = make_source(config_from_dict(cfg0))
                teacher_u = source.network.weights[0]
                x_test, y_test = draw(source, RUN_SEED, Stream.TEST, TEST_SAMPLES)
                store = str(workdir / f"d{d}_k{k}_s{noise}.zarr")
                series = {
                    "d": d,
                    "k": k,
                    "noise_std": noise,
                    "teacher_output_weights": source.network.weights[1][0].tolist(),
                    "points": [],
                }
                result["series"].append(series)
                done = 0
                for n in ladder:
                    elapsed = time.perf_counter() - t_start
                    pred = None
                    if d in rate:
                        pred = (n - done) / rate[d] + last_learn[d] + 5 + min(mlp_seconds + 5, 2 * mlp_seconds)
                    if pred is not None and elapsed + pred > budget:
                        msg = (
                            f"skipped: predicted {pred:.0f} s would overrun the {budget:.0f} s budget "
                            f"at {elapsed:.0f} s"
                        )
                        series["points"].append({"samples": n, "relulearn": {"status": "skipped", "note": msg}})
                        log(f"d={d} k={k} σ={noise} n={n:.0e}: {msg}")
                        continue
                    point: dict[str, Any] = {"samples": n}
                    r = run_relulearn(make_config(d, k, noise, n), store, workdir, client, teacher_u)
                    point["relulearn"] = r
                    if r.get("estimate_seconds") and n > done:
                        rate[d] = (n - done) / max(r["estimate_seconds"], 1e-3)
                        last_learn[d] = r["learn_seconds"]
                    done = n
                    if r["status"] == "ok":
                        log(
                            f"d={d} k={k} σ={noise} n={n:.0e}: rank {r['subspace_rank']} angle {r['angle']:.2e} "
                            f"test {r['relative_test_error']:.2e} (floor {r['noise_floor']:.1e}) param "
                            f"{r['parameter_error']:.2e}; est {r['estimate_seconds']:.1f} s learn "
                            f"{r['learn_seconds']:.1f} s"
                        )
                    else:
                        log(f"d={d} k={k} σ={noise} n={n:.0e}: relulearn {r['status']}: {r.get('error', '')[:200]}")
                    m = run_mlp(source, k, n, x_test, y_test, max_samples=args.mlp_max_samples, seconds=mlp_seconds)
                    point["mlp"] = m
                    if m["status"] == "ok":
                        log(
                            f"    MLP ({m['samples_used']:.0e} samples, {m['epochs']} epochs, "
                            f"{m['train_seconds']:.1f} s): test {m['relative_test_error']:.2e} param "
                            f"{m['parameter_error']:.2e}"
                        )
                    else:
                        log(f"    MLP error: {m['error'][:200]}")
                    series["points"].append(point)
                    del point
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["finished"] = utc_now()
    result["total_seconds"] = time.perf_counter() - t_start
    save_json(result, args.out)
    png = args.out.with_suffix(".png")
    plot(result, png)
    print()
    print(grid_table(result))
    print()
    print(table(result))
    print(f"\ntotal {result['total_seconds']:.0f} s; results in {args.out} and {png}")
    return 0


def main_refinement(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", flush=True)

    ladder = [100_000, 300_000] if args.quick else [100_000, 300_000, 1_000_000, 3_000_000, 10_000_000]
    workdir = Path(tempfile.mkdtemp(prefix="relulearn-refinebench-"))
    try:
        with connect(workers=2) as client:
            curve = refinement_curve(client, workdir, log, ladder=ladder, mlp_max_samples=args.mlp_max_samples)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "benchmark": "learn_one_hidden_refinement",
        "started": utc_now(),
        "quick": args.quick,
        "machine": machine_info(),
        "curve": curve,
        "total_seconds": time.perf_counter() - t_start,
    }
    out = args.out.with_name(args.out.stem + "_refinement.json")
    save_json(result, out)
    plot_refinement(curve, out.with_suffix(".png"))
    print(f"log-log slopes: {curve['log_log_slopes']}; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
