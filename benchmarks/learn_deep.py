"""Learning curves of the ``filtered-pca`` method on planted deep ReLU networks, next to the
``M_2``-only spectral baseline and scikit-learn's MLPRegressor (a script, not a test).

For each teacher (``deep_relu``: depth 2 with widths (3, 6), depth 3 with widths (4, 8, 8);
first layers of unit rows), each input dimension d ∈ {50, 500} and a ladder of sample
counts, one store per (teacher, d) is extended along the ladder; at each count:

- ``relulearn.api.learn(store, "filtered-pca", depth=D, width=8)`` (D = the teacher's
  depth) on ONE shared two-worker ``LocalCluster``, with the residual passes it asks for,
  then ``relulearn.api.evaluate`` on 10⁵ fresh samples: the largest principal angle between
  the teacher's first-layer row space and the top-k subspace the learned network depends on
  (:func:`relulearn.network.subspace_angle`; π/2 when a direction is missing),
  and the relative test error E[(y − f̂)²]/E[y²];
- the ``M_2``-only spectral baseline: the top-k eigenspace of ``M_2 = E[y(xxᵀ − I)]``
  (stored in the same pass as the contracted statistic of order 2) with the rank its noise
  floor supports (:func:`relulearn.estimators.spectral.stage.relevant_subspace`), and its angle;
- ``MLPRegressor(hidden_layer_sizes=teacher widths, activation="relu", solver="adam")``
  trained by ``partial_fit`` on the SAME samples, streamed chunk by chunk from the run's
  own chunk stream (the bytes the estimation saw; nothing is held in memory): at least one
  pass over the n samples, more passes while under ``--mlp-seconds``. Its angle and test
  error use the full model (biases included).

Writes ``benchmarks/results/learn_deep.json`` and a PNG next to it. ``--quick`` is a smoke
run (d = 20, small counts).
"""

from __future__ import annotations

import argparse
import json
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from relulearn import api, open_store  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.estimators.filtered_pca.entry import QUANTILES  # noqa: E402
from relulearn.estimators.spectral import stage as spectral  # noqa: E402
from relulearn.estimators.spectral.stored_matrices import matrices_from_store  # noqa: E402
from relulearn.estimators.spectral.subspace_geometry import principal_angles  # noqa: E402
from relulearn.network import Network, subspace_angle  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.sources import Stream, chunk_batches, draw, make_source  # noqa: E402

from _common import save_json, utc_now  # noqa: E402
from learn_one_hidden import machine_info  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "learn_deep.json"
RUN_SEED = 5
MLP_SEED = 0
CHUNK = 50_000
TEST_SAMPLES = 100_000
WIDTH = 8


def make_config(d: int, widths: list[int], teacher_seed: int, samples: int) -> dict[str, Any]:
    return {
        "seed": RUN_SEED,
        "samples": samples,
        "chunk_size": CHUNK,
        "source": {"d": d, "teacher": {"kind": "deep_relu", "widths": widths, "seed": teacher_seed}},
        "statistics": {
            "basic": {},
            "contracted": {"orders": [2], "directions": 1},
            "filtered": {"quantiles": QUANTILES},
        },
        "run": {"commit_interval": 60},
    }


def baseline_angle(store: str, teacher: Network) -> dict[str, Any]:
    """The M_2-only spectral stage: its supported rank (≤ k) and largest angle (π/2 if short)."""
    k = teacher.weights[0].shape[0]
    mats, ses, names = matrices_from_store(open_store(store).arrays("contracted"), orders=[2])
    sub = spectral.relevant_subspace(mats, ses, rank=k, names=names)
    if sub.rank < k:
        angle = float(np.pi / 2)
    else:
        angle = float(principal_angles(teacher.weights[0].T, sub.basis).max())
    return {"rank": int(sub.rank), "angle": angle, "message": sub.message}


def run_relulearn(cfg: dict, store: str, workdir: Path, client: Any, depth: int) -> dict[str, Any]:
    n = cfg["samples"]
    rec: dict[str, Any] = {"samples": n}
    cfg_path = workdir / f"cfg_{Path(store).stem}_n{n}.json"
    cfg_path.write_text(json.dumps(cfg))
    model = str(workdir / f"model_{Path(store).stem}_n{n}.npz")
    t0 = time.perf_counter()
    try:
        summary = api.estimate(config_from_dict(cfg), store, client=client, progress=None)
        rec["estimate_seconds"] = summary.seconds
        t1 = time.perf_counter()
        res = api.learn(store, "filtered-pca", depth=depth, width=WIDTH, out=model, client=client, progress=None)
        rec["learn_seconds"] = time.perf_counter() - t1
    except Exception as err:  # recorded, not fatal
        rec.update(
            status="error",
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(limit=4),
            seconds=time.perf_counter() - t0,
        )
        return rec
    rep = res["report"]
    rec["passes"] = [{"name": p["name"], "seconds": p["seconds"]} for p in res["passes"]]
    rec["steps"] = [{"pass": s["pass"], "added": s["added"]} for s in rep["steps"]]
    rec["subspace_rank"] = rep["subspace"]["rank"]
    rec["architecture"] = rep.get("architecture")
    rec["stop_reason"] = rep.get("stop_reason")
    rec["validation_relative_loss"] = rep.get("validation_relative_loss")
    # evaluate reads a YAML/JSON config path: JSON is valid YAML
    ev = api.evaluate(model, cfg_path, samples=TEST_SAMPLES)
    rec["angle"] = ev["subspace_angle"]
    rec["relative_test_error"] = ev["relative_test_error"]
    rec["seconds"] = time.perf_counter() - t0
    rec["status"] = "ok"
    return rec


def run_mlp(
    source: Any, widths: list[int], n: int, x_test: np.ndarray, y_test: np.ndarray, seconds: float
) -> dict[str, Any]:
    """MLPRegressor streamed over the run's own chunks: ≥ 1 pass, more while under ``seconds``."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    rec: dict[str, Any] = {"samples": n, "seconds_cap": seconds}
    try:
        m = MLPRegressor(
            hidden_layer_sizes=tuple(widths),
            activation="relu",
            solver="adam",
            batch_size=200,
            learning_rate_init=1e-3,
            random_state=MLP_SEED,
        )
        t0, passes, n_chunks = time.perf_counter(), 0, -(-n // CHUNK)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            while passes == 0 or time.perf_counter() - t0 < seconds:
                for c in range(n_chunks):
                    x = np.concatenate([b[0] for b in chunk_batches(source, RUN_SEED, c, CHUNK)])
                    y = np.concatenate([b[1] for b in chunk_batches(source, RUN_SEED, c, CHUNK)])
                    m.partial_fit(x, y)
                    if passes > 0 and time.perf_counter() - t0 > seconds:
                        break
                passes += 1
        rec["train_seconds"] = time.perf_counter() - t0
        rec["passes"] = passes
        pred = m.predict(x_test)
        rec["relative_test_error"] = float(np.mean((y_test - pred) ** 2) / np.mean(y_test**2))
        mlp = Network(tuple(c.T.copy() for c in m.coefs_), biases=tuple(b.copy() for b in m.intercepts_))
        rec["angle"] = subspace_angle(source.network, mlp, x_test[:20_000])
        rec["status"] = "ok"
    except Exception as err:
        rec.update(status="error", error=f"{type(err).__name__}: {err}")
    return rec


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for i, s in enumerate(result["series"]):
        c = f"C{i}"
        lab = f"d={s['d']}, widths={s['widths']}"
        pts = [p for p in s["points"] if p["relulearn"].get("status") == "ok"]
        if pts:
            n = [p["samples"] for p in pts]
            axes[0].loglog(
                n, [max(p["relulearn"]["angle"], 1e-6) for p in pts], "o-", color=c, label=lab + " filtered-pca"
            )
            axes[1].loglog(
                n,
                [max(p["relulearn"]["relative_test_error"], 1e-16) for p in pts],
                "o-",
                color=c,
                label=lab + " filtered-pca",
            )
        bp = [p for p in s["points"] if "baseline" in p]
        if bp:
            axes[0].loglog(
                [p["samples"] for p in bp], [p["baseline"]["angle"] for p in bp], "s:", color=c, label=lab + " M_2 only"
            )
        mp = [p for p in s["points"] if p.get("mlp", {}).get("status") == "ok"]
        if mp:
            n = [p["samples"] for p in mp]
            axes[0].loglog(n, [p["mlp"]["angle"] for p in mp], "x--", color=c, label=lab + " MLPRegressor")
            axes[1].loglog(
                n, [p["mlp"]["relative_test_error"] for p in mp], "x--", color=c, label=lab + " MLPRegressor"
            )
    axes[0].axhline(0.05, color="k", lw=0.8, ls="--")
    axes[1].axhline(1e-2, color="k", lw=0.8, ls="--")
    axes[0].set_title("largest principal angle to the teacher's first-layer row space (rad; π/2 = missing)", fontsize=9)
    axes[1].set_title("relative test error E[(y − f̂)²]/E[y²]", fontsize=9)
    for ax in axes:
        ax.set_xlabel("samples n")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(
        "relulearn 'filtered-pca' vs the M_2-only spectral stage and MLPRegressor (same samples) on "
        "planted deep ReLU networks",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    lines = [
        "| d | teacher widths | n | angle | test err | rank | M_2-only angle | MLP angle | MLP test err "
        "| MLP passes | learn s | status |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def f(v: Any, fmt: str = ".2e") -> str:
        return "" if v is None else format(v, fmt)

    for s in result["series"]:
        for p in s["points"]:
            r, b, m = p["relulearn"], p.get("baseline", {}), p.get("mlp", {})
            status = r.get("status", "")
            if status == "error":
                status += ": " + r["error"][:60]
            lines.append(
                f"| {s['d']} | {s['widths']} | {p['samples']:.0e} | {f(r.get('angle'))} "
                f"| {f(r.get('relative_test_error'))} | {r.get('subspace_rank', '')} | {f(b.get('angle'))} "
                f"| {f(m.get('angle'))} | {f(m.get('relative_test_error'))} | {m.get('passes', '')} "
                f"| {f(r.get('learn_seconds'), '.0f')} | {status} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a fast smoke run (d=20, small counts)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT}); PNG beside it")
    p.add_argument("--mlp-seconds", type=float, default=None, help="MLP time cap beyond its first pass (default 60)")
    p.add_argument("--only-d", type=int, default=None, help="run only this input dimension")
    args = p.parse_args(argv)
    if args.quick:
        plan = [(20, [3, 6], 1, [200_000, 400_000])]
        mlp_seconds = args.mlp_seconds or 5.0
    else:
        plan = [
            (50, [3, 6], 1, [500_000, 1_000_000, 2_000_000]),
            (50, [4, 8, 8], 2, [500_000, 1_000_000, 2_000_000]),
            (500, [3, 6], 1, [10_000_000]),
            (500, [4, 8, 8], 2, [10_000_000]),
        ]
        mlp_seconds = args.mlp_seconds or 60.0
    if args.only_d is not None:
        plan = [x for x in plan if x[0] == args.only_d]
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", flush=True)

    result: dict[str, Any] = {
        "benchmark": "learn_deep",
        "started": utc_now(),
        "quick": args.quick,
        "machine": machine_info(),
        "settings": {
            "teacher": "planted deep_relu: W0 unit rows (k = widths[0]), hidden layers N(0, 2/fan_in), output "
            "N(0, 1/fan_in), no biases",
            "run_seed": RUN_SEED,
            "chunk_size": CHUNK,
            "statistics": make_config(0, [1], 0, 0)["statistics"],
            "method": f"relulearn.api.learn(store, 'filtered-pca', depth=teacher depth, width={WIDTH}) on one "
            "shared LocalCluster (2 workers)",
            "angle": "largest principal angle between the teacher's first-layer row space (k dims) and the top-k "
            "eigenspace of the learned network's average gradient outer product E[grad f grad f^T] on "
            "2e4 test inputs (relulearn.network.subspace_angle); pi/2 when it depends on fewer than k "
            "directions",
            "baseline": "M_2-only spectral stage: relevant_subspace([M_2], rank=k); pi/2 when the floor supports "
            "fewer than k directions",
            "mlp": {
                "estimator": "MLPRegressor(hidden_layer_sizes=teacher widths, activation='relu', solver='adam', "
                "batch_size=200, learning_rate_init=1e-3, random_state=0)",
                "training": "partial_fit over the run's own chunks (the same n samples), at least one pass, "
                "more passes while under the seconds cap",
                "seconds_cap": mlp_seconds,
            },
            "test_samples": TEST_SAMPLES,
        },
        "series": [],
    }
    log(f"machine: {result['machine']['cores']} cores, load {result['machine']['load_average_at_start'][0]:.2f}")
    workdir = Path(tempfile.mkdtemp(prefix="relulearn-deepbench-"))
    try:
        with connect(workers=2) as client:
            for d, widths, tseed, ladder in plan:
                cfg0 = make_config(d, widths, tseed, ladder[0])
                source = make_source(config_from_dict(cfg0))
                x_test, y_test = draw(source, RUN_SEED, Stream.TEST, TEST_SAMPLES)
                store = str(workdir / f"d{d}_w{'-'.join(map(str, widths))}.zarr")
                series = {"d": d, "widths": widths, "teacher_seed": tseed, "points": []}
                result["series"].append(series)
                for n in ladder:
                    point: dict[str, Any] = {"samples": n}
                    r = run_relulearn(make_config(d, widths, tseed, n), store, workdir, client, len(widths))
                    point["relulearn"] = r
                    if r["status"] == "ok":
                        point["baseline"] = baseline_angle(store, source.network)
                        log(
                            f"d={d} widths={widths} n={n:.0e}: angle {r['angle']:.3g} test "
                            f"{r['relative_test_error']:.3g} rank {r['subspace_rank']} passes {len(r['passes'])} "
                            f"(est {r['estimate_seconds']:.0f} s, learn {r['learn_seconds']:.0f} s); M_2-only angle "
                            f"{point['baseline']['angle']:.3g}"
                        )
                    else:
                        log(f"d={d} widths={widths} n={n:.0e}: {r['error'][:300]}")
                    m = run_mlp(source, widths, n, x_test, y_test, mlp_seconds)
                    point["mlp"] = m
                    if m["status"] == "ok":
                        log(
                            f"    MLP ({m['passes']} passes, {m['train_seconds']:.0f} s): angle {m['angle']:.3g} "
                            f"test {m['relative_test_error']:.3g}"
                        )
                    series["points"].append(point)
                    save_json(result, args.out)  # after every point: a cut-short run keeps what it measured
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["finished"] = utc_now()
    result["total_seconds"] = time.perf_counter() - t_start
    save_json(result, args.out)
    plot(result, args.out.with_suffix(".png"))
    print()
    print(table(result))
    print(f"\ntotal {result['total_seconds']:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
