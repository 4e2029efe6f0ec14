"""The ``landscape`` method (Ge–Lee–Ma 2017) on wide one-hidden-layer ReLU networks with non-negative
output weights, side by side with what a user would pick instead (a script, not a test).

Parts, each on ONE shared two-worker ``LocalCluster``:

1. **settings** (``relulearn fit --method landscape``, 8 starts, 4·10⁶ samples unless said):
   d = m = 20 with orthonormal B (a ∈ [0.5, 1.5]); d = m = 20 with B of condition number 3;
   undercomplete m = 10, d = 40 (condition 3); and σ = 0.1 on the non-orthogonal teacher.
   For each: how many starts reached the lowest G, the largest row angle before polish, the
   parameter error (up to permutation and positive scaling) and relative test error after, the
   noise floor, and wall time.
2. **side by side** at d = m = 20, orthonormal B, on the SAME run samples (the run's own
   chunks, in order): ``moments`` (its enumeration over a net of a 20-dimensional sphere: a
   budget refusal or a failure, recorded as it is), a squared-loss ReLU network of the true width
   trained by Adam on fresh mini-batches (plain numpy, each sample used once, as the paper's §6),
   scikit-learn ``MLPRegressor`` (ReLU, true width) streamed chunk by chunk, and ``landscape``.
3. **paper** (d = m = 50, B = I, a = 1, noiseless: the paper's §6 experiment): the numpy SGD
   baseline on fresh batches against ``landscape``; the route ``landscape`` takes is recorded.

Writes ``benchmarks/results/learn_landscape.json`` and ``learn_landscape.png``; prints a markdown
table. ``--parts`` reruns some parts and keeps the others of an existing result file.
"""

from __future__ import annotations

import argparse
import json
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

from relulearn import api  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.network import Network, compare  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.sources import Stream, chunk_batches, draw, make_source  # noqa: E402

from _common import save_json, utc_now  # noqa: E402
from learn_one_hidden import machine_info  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "learn_landscape.json"
RUN_SEED = 3
CHUNK = 50_000
TEST_SAMPLES = 200_000


def planted(d: int, m: int, cond: float, seed: int, *, unit_a: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``B`` (m × d): orthonormal rows for ``cond = 1`` (the identity when m = d and seed < 0),
    singular values geometric in [1, cond] otherwise; ``a`` uniform in [0.5, 1.5] or all ones."""
    if seed < 0:
        return np.eye(m, d), np.ones(m)
    rng = np.random.default_rng(seed)
    q1 = np.linalg.qr(rng.standard_normal((m, m)))[0]
    q2 = np.linalg.qr(rng.standard_normal((d, m)))[0].T
    b = q1 @ np.diag(np.geomspace(1.0, cond, m)) @ q2
    return b, (np.ones(m) if unit_a else rng.uniform(0.5, 1.5, m))


def config(b: np.ndarray, a: np.ndarray, n: int, sigma: float = 0.0) -> dict[str, Any]:
    norms = np.linalg.norm(b, axis=1)
    return {
        "seed": RUN_SEED,
        "samples": n,
        "chunk_size": CHUNK,
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
        "run": {"commit_interval": 60},
    }


def row_angle(truth: np.ndarray, found: np.ndarray) -> float:
    from relulearn.estimators.landscape.objective_g import row_angles

    return float(row_angles(found, truth).max()) if len(found) >= len(truth) else float(np.pi / 2)


def run_method(
    cfg: dict, workdir: Path, client: Any, tag: str, method: str, b: np.ndarray, **options: Any
) -> dict[str, Any]:
    store, model = str(workdir / f"{tag}.zarr"), str(workdir / f"{tag}.npz")
    cfg_path = workdir / f"{tag}.json"
    cfg_path.write_text(json.dumps(cfg))
    rec: dict[str, Any] = {"method": method, "samples": cfg["samples"]}
    t0 = time.perf_counter()
    try:
        res = api.fit(config_from_dict(cfg), store, method, out=model, client=client, progress=None, **options)
    except Exception as err:  # recorded, not fatal: a refusal is a result here
        # a ValueError is the method refusing with its reason (a result here); anything else is a failure
        rec.update(
            status="refused" if isinstance(err, ValueError) else "error",
            error=f"{type(err).__name__}: {err}"[:600],
            traceback=traceback.format_exc(limit=4),
            seconds=time.perf_counter() - t0,
        )
        return rec
    rep = res["report"]
    rec.update(
        estimate_seconds=res["estimate"]["seconds"],
        learn_seconds=res["seconds"],
        passes=[{k: p[k] for k in ("name", "seconds")} for p in res["passes"]],
    )
    if method == "landscape":
        rec.update(
            summary=rep["summary"],
            parameters=rep["parameters"],
            noise=rep.get("noise"),
            route=rep.get("route", "moments"),
            starts=[s for r in rep["rounds"][-1:] for s in r.get("starts", [])],
            stream=[
                {k: v for k, v in r["stream"].items()} | {"conditions": r["conditions"]}
                for r in rep["rounds"]
                if "stream" in r
            ],
            angle_before_polish=row_angle(b, np.asarray(rep["before_polish"]["W0"])),
        )
    ev = api.evaluate(model, cfg_path, samples=TEST_SAMPLES)
    rec.update(
        parameter_error=ev["parameter_error"],
        relative_test_error=ev["relative_test_error"],
        noise_floor=ev["noise_floor"],
        angle=row_angle(b, Network.load(model).weights[0]),
        status="ok",
        seconds=time.perf_counter() - t0,
    )
    return rec


def run_samples(source: Any, n: int):
    """The run's own chunks, in order (the samples the estimation saw), as (x, y) batches."""
    for c in range(-(-n // CHUNK)):
        xs, ys = zip(*chunk_batches(source, RUN_SEED, c, CHUNK))
        yield np.concatenate(xs), np.concatenate(ys)


def sgd_baseline(
    source: Any,
    k: int,
    n: int,
    teacher: Network,
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    batch: int = 1000,
    lr: float = 3e-3,
    seed: int = 0,
) -> dict[str, Any]:
    """Squared loss of ``Σ_j a_j relu(<w_j, x>)`` (true width k) by Adam on fresh mini-batches: each
    of the n samples used once (the paper's §6 protocol); step size decays as 1/√t after a tenth."""
    rng = np.random.default_rng([seed, 1])
    d = teacher.input_dim
    w = rng.standard_normal((k, d)) / np.sqrt(d)
    a = np.full(k, 1.0 / np.sqrt(k))
    params = [w, a]
    mom = [np.zeros_like(p) for p in params]
    var = [np.zeros_like(p) for p in params]
    t, t0, curve = 0, time.perf_counter(), []
    seen = 0
    for x_all, y_all in run_samples(source, n):
        for s in range(0, len(y_all), batch):
            x, y = x_all[s : s + batch], y_all[s : s + batch]
            h = x @ w.T
            act = np.maximum(h, 0.0)
            r = act @ a - y
            ga = act.T @ r / len(y)
            gw = ((r[:, None] * (h > 0)) * a).T @ x / len(y)
            t += 1
            step = lr / np.sqrt(max(1.0, t / (0.1 * n / batch)))
            for p, g, m1, v1 in zip(params, (gw, ga), mom, var):
                m1 *= 0.9
                m1 += 0.1 * g
                v1 *= 0.999
                v1 += 0.001 * g * g
                p -= step * (m1 / (1 - 0.9**t)) / (np.sqrt(v1 / (1 - 0.999**t)) + 1e-12)
        seen += len(y_all)
        pred = np.maximum(x_test @ w.T, 0.0) @ a
        curve.append([seen, float(np.sum((y_test - pred) ** 2) / np.sum(y_test**2))])
    net = Network((w.copy(), a[None, :].copy()), activation="relu")
    pred = net.forward(x_test)[:, 0]
    return {
        "method": "sgd-squared-loss",
        "samples": n,
        "batch": batch,
        "seconds": time.perf_counter() - t0,
        "relative_test_error": float(np.sum((y_test - pred) ** 2) / np.sum(y_test**2)),
        "parameter_error": compare(teacher, net).relative_error,
        "angle": row_angle(teacher.weights[0], w),
        "curve": curve,
        "status": "ok",
    }


def mlp_baseline(
    source: Any,
    k: int,
    n: int,
    teacher: Network,
    x_test: np.ndarray,
    y_test: np.ndarray,
) -> dict[str, Any]:
    """scikit-learn MLPRegressor (ReLU, the true width) by ``partial_fit`` over the run's chunks, one pass."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    t0 = time.perf_counter()
    mlp = MLPRegressor(
        hidden_layer_sizes=(k,),
        activation="relu",
        solver="adam",
        batch_size=1000,
        learning_rate_init=1e-3,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for x, y in run_samples(source, n):
            mlp.partial_fit(x, y)
    pred = mlp.predict(x_test)
    # the MLP has biases and a free output layer: compare it by test error, and its first layer by angle
    return {
        "method": "MLPRegressor",
        "samples": n,
        "seconds": time.perf_counter() - t0,
        "relative_test_error": float(np.sum((y_test - pred) ** 2) / np.sum(y_test**2)),
        "angle": row_angle(teacher.weights[0], np.asarray(mlp.coefs_[0]).T),
        "status": "ok",
    }


def test_set(cfg: dict) -> tuple[Any, Network, np.ndarray, np.ndarray]:
    source = make_source(config_from_dict(cfg))
    x, y = draw(source, RUN_SEED, Stream.TEST, TEST_SAMPLES)
    return source, source.network, x, y


# --------------------------------------------------------------------- parts


SETTINGS = [  # tag, d, m, condition, sigma, samples
    ("orthogonal", 20, 20, 1.0, 0.0, 4_000_000),
    ("condition-3", 20, 20, 3.0, 0.0, 4_000_000),
    ("undercomplete", 40, 10, 3.0, 0.0, 4_000_000),
    ("noisy", 20, 20, 3.0, 0.1, 4_000_000),
]


def part_settings(client: Any, workdir: Path, quick: bool) -> list[dict[str, Any]]:
    out = []
    for tag, d, m, cond, sigma, n in SETTINGS:
        if quick:
            d, m, n = max(d // 2, 6), max(m // 2, 4), 1_000_000
        b, a = planted(d, m, cond, seed=5)
        rec = run_method(config(b, a, n, sigma), workdir, client, tag, "landscape", b, width=m)
        rec.update(setting=tag, d=d, m=m, condition=cond, sigma=sigma)
        print(
            f"settings {tag}: {rec.get('status')} angle {rec.get('angle_before_polish')} "
            f"error {rec.get('parameter_error')}",
            flush=True,
        )
        out.append(rec)
    return out


def part_side_by_side(client: Any, workdir: Path, quick: bool) -> dict[str, Any]:
    d = m = 10 if quick else 20
    n = 1_000_000 if quick else 4_000_000
    b, a = planted(d, m, 1.0, seed=5)
    cfg = config(b, a, n)
    source, teacher, xt, yt = test_set(cfg)
    rows = [run_method(cfg, workdir, client, "side-landscape", "landscape", b, width=m)]
    rows.append(run_method(cfg, workdir, client, "side-moments", "moments", b, width=m))
    rows.append(sgd_baseline(source, m, n, teacher, xt, yt))
    rows.append(mlp_baseline(source, m, n, teacher, xt, yt))
    for r in rows:
        print(
            f"side by side {r['method']}: {r.get('status')} test {r.get('relative_test_error')} "
            f"angle {r.get('angle')} {r.get('error', '')[:200]}",
            flush=True,
        )
    return {"d": d, "m": m, "samples": n, "rows": rows}


def part_paper(client: Any, workdir: Path, quick: bool, samples: int, sgd_samples: int) -> dict[str, Any]:
    d = m = 12 if quick else 50
    b, a = planted(d, m, 1.0, seed=-1)
    cfg = config(b, a, samples)
    source, teacher, xt, yt = test_set(cfg)
    rows = [run_method(cfg, workdir, client, "paper-landscape", "landscape", b, width=m)]
    rows.append(sgd_baseline(source, m, sgd_samples, teacher, xt, yt))
    for r in rows:
        print(
            f"paper {r['method']}: {r.get('status')} test {r.get('relative_test_error')} "
            f"error {r.get('parameter_error')} {r.get('error', '')[:200]}",
            flush=True,
        )
    return {"d": d, "m": m, "samples": samples, "rows": rows}


# ---------------------------------------------------------------------- report


def table(result: dict[str, Any]) -> str:
    lines = [
        "| setting | d | m | samples | starts at lowest G | row angle before polish | parameter error | "
        "test error / noise floor | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("settings", []):
        s = r.get("summary", {})
        ratio = (
            f"{r['relative_test_error'] / r['noise_floor']:.3f}"
            if r.get("noise_floor")
            else f"{r.get('relative_test_error', float('nan')):.1e} (noiseless)"
        )
        lines.append(
            f"| {r['setting']} | {r['d']} | {r['m']} | {r['samples']:.0e} | "
            f"{s.get('starts_at_lowest_G', '–')}/{s.get('starts', '–')} | "
            f"{r.get('angle_before_polish', float('nan')):.3f} | "
            f"{r.get('parameter_error', float('nan')):.1e} | "
            f"{ratio} | {r.get('seconds', float('nan')):.0f} |"
        )
    for part in ("side_by_side", "paper"):
        if part not in result:
            continue
        p = result[part]
        lines += [
            "",
            f"**{part.replace('_', ' ')}** (d = {p['d']}, m = {p['m']}):",
            "",
            "| method | samples | status | relative test error | parameter error | largest row angle | seconds |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in p["rows"]:
            pe = r.get("parameter_error")
            lines.append(
                f"| {r['method']} | {r['samples']:.0e} | {r.get('status')} | "
                f"{r.get('relative_test_error', float('nan')):.2e} | "
                f"{'–' if pe is None else f'{pe:.1e}'} | {r.get('angle', float('nan')):.3f} | "
                f"{r.get('seconds', float('nan')):.0f} |"
            )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, part in zip(axes, ("side_by_side", "paper")):
        if part not in result:
            continue
        p = result[part]
        for r in p["rows"]:
            if r.get("curve"):
                c = np.asarray(r["curve"])
                ax.loglog(c[:, 0], np.maximum(c[:, 1], 1e-32), label=f"{r['method']} (test error while training)")
            elif r.get("status") == "ok":
                streamed = (r.get("summary") or {}).get("samples_streamed")
                seen = f"{r['samples']:.0e} samples" + (f" + {streamed:.1e} streamed" if streamed else "")
                ax.axhline(
                    max(r["relative_test_error"], 1e-32),
                    ls="--",
                    label=f"{r['method']} ({seen})",
                    color="C2" if r["method"] == "landscape" else "C3",
                )
        ax.set_xlabel("samples seen")
        ax.set_ylabel("relative test error")
        ax.set_title(f"{part.replace('_', ' ')}: d = m = {p['d']}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes")
    ap.add_argument("--parts", default="settings,side_by_side,paper", help="comma-separated parts to run")
    ap.add_argument("--paper-samples", type=float, default=1e7, help="samples of landscape at d = m = 50")
    ap.add_argument("--sgd-samples", type=float, default=5e7, help="fresh samples of the SGD baseline at d = m = 50")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update(benchmark="learn_landscape", started=utc_now(), machine=machine_info())
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, connect(workers=2) as client:
        workdir = Path(tmp)
        if "settings" in parts:
            result["settings"] = part_settings(client, workdir, args.quick)
        if "side_by_side" in parts:
            result["side_by_side"] = part_side_by_side(client, workdir, args.quick)
        if "paper" in parts:
            result["paper"] = part_paper(client, workdir, args.quick, int(args.paper_samples), int(args.sgd_samples))
    result["seconds"] = time.perf_counter() - t_start
    result["finished"] = utc_now()
    out = args.out if not args.quick else args.out.with_name(args.out.stem + "_quick.json")
    save_json(result, out)
    plot(result, out.with_suffix(".png"))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
