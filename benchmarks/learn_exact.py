"""The ``exact`` method (Bakshi–Jayaram–Woodruff 2019) on planted two-layer rectified networks
with vector outputs, side by side with what a user would pick instead (a script, not a test).

Four parts, each on ONE shared two-worker ``LocalCluster``:

1. **Noiseless** (``two_layer`` teachers, d = 100, k = 8, m = 10, 10⁶ samples, ReLU, ReLU², ReLU³;
   and one d = 500, k = 16, m = 20 ReLU point): ``relulearn fit --method exact``, then
   ``evaluate`` (relative parameter error up to permutation and positive scaling, relative test
   error on fresh samples). On the SAME stored tensor ``T2`` (m × d × d): relulearn's tensor step
   (:func:`relulearn.estimators.spectral.cp.decompose` in the noise-floor subspace) against TensorLy's
   ``parafac`` on the full tensor — largest angle of the directions found, and time. On the SAME
   samples (the run's first chunks): scikit-learn ``MLPRegressor`` with m outputs (ReLU, the true
   width), streamed chunk by chunk, at least one pass and more while under ``--mlp-seconds``.
2. **The ICA route** (orthonormal V, where the units ``f(v_i·x)`` are independent sources):
   scikit-learn ``FastICA`` on the labels A of the run's first samples (unmixing → sources
   → v_i by least squares on each source's active part → U by least squares), against ``exact``.
3. **Noise**: σ ∈ {0.01, 0.03, 0.1, 0.3} at n = 10⁶, and n ∈ {10⁵, … , 10⁷} at σ = 0.1
   (d = 20, k = 4, m = 6, ReLU), each with ``--seeds`` independent runs (run seeds): parameter
   errors, their RMS, and the log-log slopes of the RMS (targets 1 and −½). ``--parts noise``
   reruns one part and keeps the others of the existing result file.

Writes ``benchmarks/results/learn_exact.json`` and ``learn_exact.png``; prints a markdown table.
``--quick`` is a smoke run (small sizes).
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

from relulearn import api, open_store  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.estimators.exact.joint_range import joint_range  # noqa: E402
from relulearn.estimators.spectral import cp  # noqa: E402
from relulearn.network import Network, compare_two_layer  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.sources import Stream, chunk_batches, draw, make_source  # noqa: E402

from _common import run_samples, save_json, utc_now  # noqa: E402
from learn_one_hidden import machine_info  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "learn_exact.json"
RUN_SEED = 11
CHUNK = 50_000
TEST_SAMPLES = 100_000


# ------------------------------------------------------------------ helpers


def two_layer_config(
    d: int,
    k: int,
    m: int,
    activation: str,
    n: int,
    sigma: float = 0.0,
    teacher_seed: int = 1,
    file: str | None = None,
    run_seed: int = RUN_SEED,
) -> dict[str, Any]:
    teacher = (
        {"file": file}
        if file
        else {
            "kind": "two_layer",
            "width": k,
            "outputs": m,
            "activation": activation,
            "weights_seed": teacher_seed,
            "v_norms": [0.5, 2.0],
        }
    )
    return {
        "seed": run_seed,
        "samples": n,
        "chunk_size": CHUNK,
        "source": {"d": d, "teacher": teacher, "noise_std": sigma},
        "statistics": {"basic": {}, "output_moments": {}},
        "run": {"commit_interval": 60},
    }


def direction_angle(truth: np.ndarray, found: np.ndarray) -> float:
    """Largest angle between matched unit directions, up to sign (rows; Hungarian on |cos|)."""
    from scipy.optimize import linear_sum_assignment

    a = truth / np.linalg.norm(truth, axis=1, keepdims=True)
    b = found / np.linalg.norm(found, axis=1, keepdims=True)
    cos = np.abs(a @ b.T)
    r, c = linear_sum_assignment(-cos)
    if len(r) < len(a):
        return float(np.pi / 2)
    return float(np.max(np.arccos(np.clip(cos[r, c], -1.0, 1.0))))


def run_fit(cfg: dict, workdir: Path, client: Any, tag: str, **options: Any) -> dict[str, Any]:
    store, model = str(workdir / f"{tag}.zarr"), str(workdir / f"{tag}.npz")
    cfg_path = workdir / f"{tag}.json"
    cfg_path.write_text(json.dumps(cfg))
    rec: dict[str, Any] = {"samples": cfg["samples"]}
    t0 = time.perf_counter()
    try:
        res = api.fit(config_from_dict(cfg), store, "exact", out=model, client=client, progress=None, **options)
    except Exception as err:  # recorded, not fatal
        rec.update(
            status="error",
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(limit=6),
            seconds=time.perf_counter() - t0,
        )
        return rec
    rep = res["report"]
    rec.update(
        estimate_seconds=res["estimate"]["seconds"],
        learn_seconds=res["seconds"],
        path=rep.get("path"),
        chosen=rep.get("chosen"),
        check=rep.get("check"),
        refinement={k: v for k, v in (rep.get("refinement") or {}).items() if not isinstance(v, list)},
    )
    ev = api.evaluate(model, cfg_path, samples=TEST_SAMPLES)
    rec.update(
        parameter_error=ev["parameter_error"],
        relative_test_error=ev["relative_test_error"],
        noise_floor=ev["noise_floor"],
        store=store,
        model=model,
        status="ok",
        seconds=time.perf_counter() - t0,
    )
    return rec


def tensor_step_vs_parafac(store: str, teacher: Network, seed: int) -> dict[str, Any]:
    """relulearn's tensor step and TensorLy's parafac on the same stored T2 (m × d × d)."""
    arrays = open_store(store).arrays("output_moments")
    t2, t2_se = np.asarray(arrays["T2"]), np.asarray(arrays["T2_se"])
    k = teacher.weights[0].shape[0]
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    sub = joint_range(list(t2), list(t2_se), rank=k)
    dec = cp.decompose(t2, sub.basis, seed=seed)
    out["relulearn"] = {
        "seconds": time.perf_counter() - t0,
        "subspace_rank": int(sub.rank),
        "angle": direction_angle(teacher.weights[0], dec.directions),
    }
    try:
        import tensorly as tl
        from tensorly.decomposition import parafac

        t0 = time.perf_counter()
        # TensorLy's default start (SVD of the unfoldings); a random start stalls far away (≈ π/2) here
        fac = parafac(tl.tensor(t2), rank=k, init="svd", random_state=seed, n_iter_max=500, tol=1e-12)
        b = np.asarray(fac.factors[1]).T
        c = np.asarray(fac.factors[2]).T
        # modes 2 and 3 are the same vectors up to sign: average after aligning signs
        sgn = np.sign(np.sum(b * c, axis=1, keepdims=True))
        sgn[sgn == 0] = 1.0
        dirs = b / np.linalg.norm(b, axis=1, keepdims=True) + sgn * c / np.linalg.norm(c, axis=1, keepdims=True)
        out["parafac"] = {"seconds": time.perf_counter() - t0, "angle": direction_angle(teacher.weights[0], dirs)}
    except Exception as err:
        out["parafac"] = {"status": "error", "error": f"{type(err).__name__}: {err}"}
    return out


def run_mlp(source: Any, k: int, n: int, x_test: np.ndarray, y_test: np.ndarray, seconds: float) -> dict[str, Any]:
    """MLPRegressor (ReLU, true width, m outputs) streamed over the run's own chunks."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    rec: dict[str, Any] = {"samples": n, "seconds_cap": seconds}
    try:
        m = MLPRegressor(
            hidden_layer_sizes=(k,),
            activation="relu",
            solver="adam",
            batch_size=200,
            learning_rate_init=1e-3,
            random_state=0,
        )
        t0, passes, n_chunks = time.perf_counter(), 0, -(-n // CHUNK)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            while passes == 0 or time.perf_counter() - t0 < seconds:
                for c in range(n_chunks):
                    batches = list(chunk_batches(source, RUN_SEED, c, CHUNK))
                    m.partial_fit(np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]))
                    if passes > 0 and time.perf_counter() - t0 > seconds:
                        break
                passes += 1
        rec.update(train_seconds=time.perf_counter() - t0, passes=passes)
        pred = m.predict(x_test).reshape(y_test.shape)
        rec["relative_test_error"] = float(np.sum((y_test - pred) ** 2) / np.sum(y_test**2))
        rec["status"] = "ok"
    except Exception as err:
        rec.update(status="error", error=f"{type(err).__name__}: {err}")
    return rec


def fastica_route(
    x: np.ndarray, a: np.ndarray, k: int, power: int, activation: str, teacher: Network, seed: int
) -> dict[str, Any]:
    """The ICA route for orthonormal V: A = U S with independent sources S_i = f(v_i·x).

    FastICA gives the sources up to scale, sign, order and their means; f ≥ 0 is zero on about
    half the samples, so the sign is the one that puts that mass at the minimum, and the zero
    level is the minimum. Then v_i by least squares of ``s^{1/c} = v·x`` on the clearly active
    samples, and U by least squares on ``f(V x)``.
    """
    from sklearn.decomposition import FastICA

    rec: dict[str, Any] = {"samples": int(len(x))}
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = FastICA(n_components=k, whiten="unit-variance", random_state=seed, max_iter=1000).fit_transform(a)
        v = np.zeros((k, x.shape[1]))
        for i in range(k):
            si = s[:, i]
            # the sign with the atom (f = 0 on half the samples) at the bottom
            if np.quantile(si, 0.4) - si.min() > si.max() - np.quantile(si, 0.6):
                si = -si
            h = si - si.min()
            act = h > np.quantile(h, 0.6)
            v[i], *_ = np.linalg.lstsq(x[act], h[act] ** (1.0 / power), rcond=None)
        f = np.maximum(x @ v.T, 0.0) ** power
        u, *_ = np.linalg.lstsq(f, a, rcond=None)
        net = Network((v, u.T.copy()), activation=activation)
        rec["seconds"] = time.perf_counter() - t0
        rec["parameter_error"] = compare_two_layer(teacher, net).relative_error
        rec["status"] = "ok"
    except Exception as err:
        rec.update(status="error", error=f"{type(err).__name__}: {err}", seconds=time.perf_counter() - t0)
    return rec


def slope(xs: list[float], ys: list[float]) -> float | None:
    pts = [(np.log(a), np.log(b)) for a, b in zip(xs, ys) if a and b and b > 0]
    if len(pts) < 2:
        return None
    p = np.polyfit([a for a, _ in pts], [b for _, b in pts], 1)
    return float(p[0])


# ------------------------------------------------------------------ parts


def part_noiseless(client: Any, workdir: Path, quick: bool, mlp_seconds: float) -> list[dict[str, Any]]:
    sizes = [(20, 4, 5, 100_000)] if quick else [(100, 8, 10, 1_000_000)]
    points = []
    for d, k, m, n in sizes:
        for act in ("relu", "relu2", "relu3"):
            points.append(dict(d=d, k=k, m=m, activation=act, n=n))
    big = (40, 6, 8, 200_000) if quick else (500, 16, 20, 1_000_000)
    points.append(dict(d=big[0], k=big[1], m=big[2], activation="relu", n=big[3]))
    out = []
    for p in points:
        tag = f"noiseless_d{p['d']}_{p['activation']}"
        print(f"[noiseless] {tag}", flush=True)
        cfg = two_layer_config(p["d"], p["k"], p["m"], p["activation"], p["n"])
        rec = dict(p, relulearn=run_fit(cfg, workdir, client, tag))
        source = make_source(config_from_dict(cfg))
        if rec["relulearn"]["status"] == "ok":
            rec["tensor_step"] = tensor_step_vs_parafac(rec["relulearn"]["store"], source.network, RUN_SEED)
        x_test, y_test = draw(source, RUN_SEED, Stream.TEST, 20_000)
        rec["mlp"] = run_mlp(source, p["k"], p["n"], x_test, y_test, mlp_seconds)
        out.append(rec)
        print(json.dumps({k: v for k, v in rec.items()}, default=str)[:600], flush=True)
    return out


def part_ica(client: Any, workdir: Path, quick: bool) -> dict[str, Any]:
    d, k, m, n = (20, 4, 5, 100_000) if quick else (100, 8, 10, 1_000_000)
    n_ica = min(n, 200_000)
    rng = np.random.default_rng(7)
    q, _ = np.linalg.qr(rng.standard_normal((d, k)))
    teacher = Network((q.T.copy(), rng.standard_normal((m, k))), activation="relu")
    path = workdir / "orthonormal_teacher.npz"
    teacher.save(path)
    cfg = two_layer_config(d, k, m, "relu", n, file=str(path))
    print("[ica] orthonormal V", flush=True)
    rec: dict[str, Any] = {"d": d, "k": k, "m": m, "n": n}
    rec["relulearn"] = run_fit(cfg, workdir, client, "ica_exact")
    source = make_source(config_from_dict(cfg))
    x, a = run_samples(source, RUN_SEED, n_ica, CHUNK)
    rec["fastica"] = fastica_route(x, a, k, 1, "relu", teacher, RUN_SEED)
    return rec


def noise_point(
    d: int, k: int, m: int, n: int, sigma: float, seeds: int, client: Any, workdir: Path, tag: str
) -> dict[str, Any]:
    """One (σ, n) point: ``seeds`` runs with independent samples (run seeds), their parameter errors
    and its root mean square (one draw fluctuates by ≈ 20 %; the slopes use the RMS)."""
    runs = [
        run_fit(
            two_layer_config(d, k, m, "relu", n, sigma=sigma, run_seed=RUN_SEED + s), workdir, client, f"{tag}_s{s}"
        )
        for s in range(seeds)
    ]
    ok = [r["parameter_error"] for r in runs if r.get("status") == "ok"]
    rms = float(np.sqrt(np.mean(np.square(ok)))) if ok else None
    return dict(sigma=sigma, n=n, parameter_errors=ok, rms_parameter_error=rms, relulearn=runs[0])


def part_noise(client: Any, workdir: Path, quick: bool, seeds: int = 3) -> dict[str, Any]:
    d, k, m = (10, 3, 4) if quick else (20, 4, 6)
    n_fixed = 100_000 if quick else 1_000_000
    sigmas = [0.01, 0.03, 0.1, 0.3]
    ns = [100_000, 200_000] if quick else [100_000, 300_000, 1_000_000, 3_000_000, 10_000_000]
    res: dict[str, Any] = {"d": d, "k": k, "m": m, "seeds": seeds, "by_sigma": [], "by_n": []}
    for s in sigmas:
        print(f"[noise] sigma={s}", flush=True)
        res["by_sigma"].append(noise_point(d, k, m, n_fixed, s, seeds, client, workdir, f"sigma{s}"))
    for n in ns:
        print(f"[noise] n={n}", flush=True)
        res["by_n"].append(noise_point(d, k, m, n, 0.1, seeds, client, workdir, f"n{n}"))

    def errs(rows: list, key: str) -> tuple[list, list]:
        ok = [r for r in rows if r["rms_parameter_error"] is not None]
        return [r[key] for r in ok], [r["rms_parameter_error"] for r in ok]

    res["slope_sigma"] = slope(*errs(res["by_sigma"], "sigma"))
    res["slope_n"] = slope(*errs(res["by_n"], "n"))
    return res


# ------------------------------------------------------------------ output


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    noise = result.get("noise", {})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, key, xkey, target, label in (
        (axes[0], "by_sigma", "sigma", 1.0, "label noise σ (n fixed)"),
        (axes[1], "by_n", "n", -0.5, "samples n (σ = 0.1)"),
    ):
        rows = [r for r in noise.get(key, []) if r.get("rms_parameter_error") is not None]
        if not rows:
            continue
        xs = np.array([r[xkey] for r in rows], dtype=float)
        ys = np.array([r["rms_parameter_error"] for r in rows])
        for r in rows:
            ax.loglog([r[xkey]] * len(r["parameter_errors"]), r["parameter_errors"], ".", color="C0", alpha=0.4)
        fitted = noise.get("slope_sigma" if xkey == "sigma" else "slope_n")
        ax.loglog(
            xs, ys, "o-", label="exact, RMS over run seeds" + ("" if fitted is None else f" (slope {fitted:.2f})")
        )
        ax.loglog(xs, ys[0] * (xs / xs[0]) ** target, "k--", lw=0.8, label=f"slope {target:g}")
        ax.set_xlabel(label)
        ax.set_ylabel("relative parameter error (up to symmetries)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"relulearn 'exact' with label noise: d = {noise.get('d')}, k = {noise.get('k')}, m = {noise.get('m')}, ReLU",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    def f(v: Any, fmt: str = ".1e") -> str:
        return "" if v is None else format(v, fmt)

    lines = [
        "| d | k | m | f | n | param. error | test error | learn s | tensor-step angle (s) | parafac angle (s) "
        "| MLP test error (passes) |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in result.get("noiseless", []):
        r, t, mlp = p["relulearn"], p.get("tensor_step", {}), p.get("mlp", {})
        tr, pf = t.get("relulearn", {}), t.get("parafac", {})
        lines.append(
            f"| {p['d']} | {p['k']} | {p['m']} | {p['activation']} | {p['n']:.0e} | {f(r.get('parameter_error'))} "
            f"| {f(r.get('relative_test_error'))} | {f(r.get('learn_seconds'), '.0f')} "
            f"| {f(tr.get('angle'), '.3f')} ({f(tr.get('seconds'), '.2f')}) | {f(pf.get('angle'), '.3f')} "
            f"({f(pf.get('seconds'), '.1f')}) | {f(mlp.get('relative_test_error'))} ({mlp.get('passes', '')}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes")
    ap.add_argument("--parts", default="noiseless,ica,noise", help="comma-separated parts to run")
    ap.add_argument("--mlp-seconds", type=float, default=60.0, help="MLPRegressor training time cap (≥ 1 pass)")
    ap.add_argument("--seeds", type=int, default=3, help="run seeds per noise point (default 3)")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"started": utc_now(), "machine": machine_info(), "quick": args.quick}
    if args.out.exists() and parts != {"noiseless", "ica", "noise"}:
        # a partial rerun keeps the other parts of the previous result
        previous = json.loads(args.out.read_text())
        result.update({k: v for k, v in previous.items() if k in {"noiseless", "ica", "noise"} - parts})
        result["partial_rerun"] = sorted(parts)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="relulearn-bench-exact-") as tmp, connect(workers=2) as client:
        workdir = Path(tmp)
        if "noiseless" in parts:
            result["noiseless"] = part_noiseless(client, workdir, args.quick, args.mlp_seconds)
        if "ica" in parts:
            result["ica"] = part_ica(client, workdir, args.quick)
        if "noise" in parts:
            result["noise"] = part_noise(client, workdir, args.quick, args.seeds)
    result["seconds"] = time.perf_counter() - t0
    result["finished"] = utc_now()
    save_json(result, args.out)
    if "noise" in result:
        plot(result, args.out.with_suffix(".png"))
    print(table(result))
    if "noise" in result:
        print(f"slope vs σ: {result['noise']['slope_sigma']}, slope vs n: {result['noise']['slope_n']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
