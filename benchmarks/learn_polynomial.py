"""The ``polynomial`` method (the Hermite expansion truncated at degree L; Daniely–Srebro–Vardi 2023) on
random Xavier networks, against the Hermite tail, and side by side with what a user would pick instead
(a script, not a test).

Run it as ``python benchmarks/learn_polynomial.py`` (about 40 min on 2 shared cores: 23 min nets, 14 min
side by side) or ``python benchmarks/learn_polynomial.py --quick`` (2 min, small sizes, ``*_quick.json``).
``--parts nets`` or ``--parts side_by_side`` runs one part and keeps the other from the result file;
``--resume`` also keeps the finished nets and sweeps of the parts it runs; ``--report`` only redraws the
figure and prints the tables. The result file is rewritten after every net and every side-by-side row, so a
crash keeps what finished.

Part **nets** (one two-worker cluster from ``relulearn.pipeline.cluster.connect``): 12 ``random_xavier``
teachers — depth 2 (widths [512]) and depth 3 ([256, 256]), activations relu, erf and erf_relu, d = 20
(L_max = 6) and d = 50 (L_max = 4), noiseless. For each: ``api.fit(..., "polynomial", degree=L_max,
residual=True, shrink="none")``; every degree L ≤ L_max is read from the model's ``.terms`` on fresh test
samples (``Stream.TEST``, never used by estimation), so one run gives the whole curve. Per (net, L):

* relative test error ``mean((y − f̂_L)²) / E[y²]`` ± its SE (SE of the mean of squared residuals);
* the true Hermite tail ``1 − Σ_{l≤L} ‖T_l‖²/(l! E[y²])``. Depth 2, ``y = Σ_i a_i f(|w_i| u_i·x)``:
  closed form, ``‖T_l‖²/l! = Σ_ij a_i a_j b_l(s_i) b_l(s_j) ρ_ij^l`` with ``b_l(s) = E[f(s z) h_l(z)]``
  (orthonormal ``h_l``; Gauss–Legendre split at the kink 0) and ``E[y²]`` from the same series to order
  150 (diagonal integrated directly), checked against a Monte Carlo of the teacher. Depth 3: a separate,
  larger run (another seed, 2× the samples): ``T_0..T_2`` on the labels, then ``T_3..T_L`` on residual
  labels (the method's own residual pass), bias-corrected ``Σ (‖T̂_l‖² − V_l)``, delta-method SE
  ``Var ‖T̂_l‖² ≈ 4 Σ mult² T̂² se² + 2 Σ mult² se⁴`` plus the error of ``E[y²]`` (that run's ``basic``
  statistic on 2n samples; the same ``E[y²]`` normalises the test error);
* the predicted variance ``Σ_{l≤L} V_l / (l! E[y²])`` (``V_l = Σ mult · se²``, from the stored SEs);
* the measured excess (test error − tail) and its z-score against the predicted variance, with the
  combined SE ``sqrt(SE_test² + SE_tail² + SE_fluct²)``, ``SE_fluct² = 2 Σ_l Σ_entries (mult se²/l!)² / E[y²]²``
  (the fluctuation of ``Σ ‖T̂_l − T_l‖²/l!`` about its mean), times ``1 + 1/(K−1)`` for the error of the
  predicted variance itself (each se² comes from K chunk means); "within" = |z| ≤ 3;
* depth 2 only: the exact excess ``Σ_{l≤L} ‖T̂_l − T_l‖²/(l! E[y²])`` (no test noise), and its z-score
  against the predicted variance with ``SE_fluct`` alone;
* the method's own held-out choice of degree (``api.learn`` without ``degree`` on the same store, which
  reuses the stored statistics and the residual pass), and the samples/s of both passes.

Part **side_by_side** (no cluster; every (method, n) in a fresh subprocess, forked by ``sh`` so that it does
not inherit the driver's peak, that reports its peak RSS after the fit — ``VmHWM``, and
``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which agree): d = 20, depth 2, relu (and erf at the largest
n each method managed), degrees 3 and 4, on the run's own samples (the first n samples of the run's chunks)
and scored on the same test samples as part nets: scikit-learn ``PolynomialFeatures`` + ``Ridge``,
chaospy's ``fit_regression`` on ``generate_expansion(L, Iid(Normal(0, 1), d))``, ``MLPRegressor`` of the
teacher's shape (relu, or tanh for erf; Adam, early stopping, epochs until ~120 s) and relulearn itself
in-process (``client="local"``) at n = 10⁴ … 10⁷ (its peak RSS must not grow with n). A sweep stops at the
first n whose design matrix (n × C(d+L, L) float64) would exceed ``--memory-limit-gb`` (reported as
"out of memory at n, needs X GiB", not run) or whose fit exceeds ``--cap`` seconds (run under an alarm, or
not run when the time measured at a smaller n, or at a lower degree and the same n, predicts over 1.5× the cap).

Writes ``benchmarks/results/learn_polynomial.json`` and ``learn_polynomial.png``; prints two markdown tables.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
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

from relulearn import api, hermite  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.network import ACTIVATIONS, Network  # noqa: E402
from relulearn.pipeline.sources import Stream, draw, make_source  # noqa: E402
from relulearn.polynomial import load_model  # noqa: E402
from relulearn.shadow import normal_rule, orthonormal_hermite  # noqa: E402
from relulearn.storage import open_store  # noqa: E402

from _common import run_samples, save_json, utc_now  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "learn_polynomial.json"
RUN_SEED, TRUTH_SEED, MC_SEED, TEACHER_SEED = 5, 6, 7, 0
CHUNK = 50_000
ACTS = ("relu", "erf", "erf_relu")
DEPTHS = {2: [512], 3: [256, 256]}
#: series order of the depth-2 E[y²] (off-diagonal ρ^l; the diagonal is integrated directly)
SERIES_TERMS = 150


# ----------------------------------------------------------------------------- configs and samples


def run_cfg(
    d: int, widths: list[int], act: str, n: int, seed: int = RUN_SEED, statistics: dict | None = None
) -> dict[str, Any]:
    cfg = {
        "seed": seed,
        "samples": int(n),
        "chunk_size": int(min(CHUNK, n)),
        "source": {
            "d": d,
            "noise_std": 0.0,
            "teacher": {"kind": "random_xavier", "widths": list(widths), "activation": act, "seed": TEACHER_SEED},
        },
    }
    if statistics is not None:
        cfg["statistics"] = statistics
    return cfg


def source_of(d: int, widths: list[int], act: str) -> Any:
    return make_source(config_from_dict(run_cfg(d, widths, act, CHUNK)))


def test_samples(source: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    return draw(source, RUN_SEED, Stream.TEST, n)


def relative_error(y: np.ndarray, pred: np.ndarray, ey2: float) -> tuple[float, float]:
    """``mean((y − pred)²) / E[y²]`` and the SE of that mean."""
    r2 = (np.asarray(y, dtype=np.float64).reshape(-1) - np.asarray(pred, dtype=np.float64).reshape(-1)) ** 2
    return float(r2.mean() / ey2), float(r2.std(ddof=1) / math.sqrt(len(r2)) / ey2)


# ----------------------------------------------------------------------------- depth-2 truth (closed form)


def unit_coefficients(activation: str, scales: np.ndarray, lmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``b_l(s_i) = E[f(s_i z) h_l(z)]`` (shape (units, lmax+1)) and ``E f(s_i z)²`` for the activation f the
    network file computes (the paper's normalisation is folded into the weights)."""
    f = ACTIVATIONS[activation]
    nodes, weights = normal_rule(lmax)
    vals = f(np.outer(scales, nodes).copy())  # (units, nodes); relu works in place: a copy
    return (vals * weights) @ orthonormal_hermite(nodes, lmax).T, (vals**2) @ weights


def depth2_truth(net: Network, lmax: int) -> dict[str, Any]:
    """Closed-form Hermite norms ``‖T_l‖²/l!`` (l ≤ lmax), ``E[y²]`` and the tail of a one-hidden-layer net."""
    w, a = net.weights[0], net.weights[1][0]
    s = np.linalg.norm(w, axis=1)
    u = w / s[:, None]
    b, diag = unit_coefficients(net.activation, s, SERIES_TERMS)
    rho = u @ u.T
    power = np.ones_like(rho)
    norms, off = [], 0.0
    for l in range(SERIES_TERMS + 1):
        c = a * b[:, l]
        full = float(c @ power @ c)  # Σ_ij a_i a_j b_l b_l ρ^l, diagonal included (ρ_ii = 1)
        if l <= lmax:
            norms.append(full)
        off += full - float(c @ c)
        power *= rho
    ey2 = float(a**2 @ diag) + off
    offdiag = np.abs(rho[~np.eye(len(a), dtype=bool)])
    amp = np.abs(a) * np.sqrt(diag)
    cut = float(offdiag.max() ** (SERIES_TERMS + 1) * (amp.sum() ** 2 - (amp**2).sum()))
    norms = np.array(norms)
    return {
        "ey2": ey2,
        "ey2_series_cut_bound": cut,
        "norms": norms.tolist(),
        "tail": (1.0 - np.cumsum(norms) / ey2).tolist(),
        "tail_se": [0.0] * (lmax + 1),
        "max_offdiagonal_cosine": float(offdiag.max()),
        "_b": b[:, : lmax + 1],
        "_s": s,
    }


def exact_excess(net: Network, truth: dict[str, Any], tensors: tuple[np.ndarray, ...], d: int) -> list[float]:
    """``‖T̂_l − T_l‖² / l!`` per order for a one-hidden-layer net: ``‖T̂_l‖² − 2<T̂_l, T_l> + ‖T_l‖²`` with
    ``<T̂_l, T_l> = Σ_i a_i c_l(s_i) <T̂_l, u_i^{⊗l}>`` (packed entries, multiplicities)."""
    w, a = net.weights[0], net.weights[1][0]
    u = w / truth["_s"][:, None]
    out = []
    for l, t in enumerate(tensors):
        mt = hermite.multiplicities(d, l) * t
        idx = hermite.unique_indices(d, l)
        proj = np.empty(len(a))
        step = max(1, int(4e6 // max(1, len(t))))
        for i in range(0, len(a), step):
            p = np.ones((min(step, len(a) - i), len(t)))
            for j in range(l):
                p *= u[i : i + step][:, idx[:, j]]
            proj[i : i + step] = p @ mt
        cross = float((a * truth["_b"][:, l]) @ proj) / math.sqrt(math.factorial(l))
        out.append(float(mt @ t) / math.factorial(l) - 2 * cross + truth["norms"][l])
    return out


def monte_carlo_ey2(source: Any, n: int, batch: int = 500_000) -> tuple[float, float]:
    """``E[y²]`` of the teacher and its SE from n samples of an independent stream."""
    sums = []
    for p in range(-(-n // batch)):
        _, y = draw(source, MC_SEED, Stream.TEST, min(batch, n - p * batch), part=p)
        sums.append((float(np.sum(y**2)), float(np.sum(y**4)), len(y)))
    s2, s4, m = (sum(v[i] for v in sums) for i in range(3))
    mean = s2 / m
    return mean, math.sqrt(max(s4 / m - mean**2, 0.0) / m)


# ----------------------------------------------------------------------------- depth-3 truth (larger run)


def _stored(store: str, orders: range) -> tuple[list[np.ndarray], list[np.ndarray]]:
    h = open_store(store).arrays("hermite")
    return (
        [np.asarray(h[f"T{l}"], dtype=np.float64).reshape(-1) for l in orders],
        [np.asarray(h[f"T{l}_se"], dtype=np.float64).reshape(-1) for l in orders],
    )


def truth_run(d: int, widths: list[int], act: str, n: int, lmax: int, client: Any, workdir: Path) -> dict[str, Any]:
    """The bias-corrected Hermite tail from a separate run (seed TRUTH_SEED, n samples): T_0..T_2 and E[y²] on
    the labels, then T_0..T_L on labels less their degree-≤2 expansion (orders ≥ 3 kept), with delta-method SEs
    (the error of E[y²] included)."""
    t0 = time.perf_counter()
    first, second = str(workdir / f"truth-{d}-{act}-low.zarr"), str(workdir / f"truth-{d}-{act}-res.zarr")
    api.estimate(
        config_from_dict(run_cfg(d, widths, act, n, TRUTH_SEED, {"basic": {}, "hermite": {"max_order": 2}})),
        first,
        client=client,
        progress=None,
    )
    (c0, c1, c2), _ = _stored(first, range(3))
    basic = open_store(first).arrays("basic")
    ey2, ey2_se = (float(np.asarray(basic[k]).reshape(())) for k in ("yy", "yy_se"))
    expansion = {"t0": float(c0[0]), "t1": c1.tolist(), "t2": hermite.unpack(c2, d, 2).tolist()}
    stats = {"basic": {}, "hermite": {"max_order": lmax, "expansion": expansion}}
    summary = api.estimate(
        config_from_dict(run_cfg(d, widths, act, n, TRUTH_SEED, stats)), second, client=client, progress=None
    )
    low, low_se = _stored(first, range(3))
    high, high_se = _stored(second, range(3, lmax + 1))
    signal, var = [], []
    for l, (t, s) in enumerate(zip(low + high, low_se + high_se)):
        mult, fact = hermite.multiplicities(d, l), math.factorial(l)
        signal.append(float(mult @ (t**2 - s**2)) / fact)  # ‖T̂‖² − V_l, bias-corrected
        var.append(float(4 * (mult**2) @ (t**2 * s**2) + 2 * (mult**2) @ s**4) / fact**2)
    cum, cum_var = np.cumsum(signal), np.cumsum(var)
    tail = 1.0 - cum / ey2
    tail_se = np.sqrt(cum_var / ey2**2 + (cum / ey2**2 * ey2_se) ** 2)
    return {
        "samples": n,
        "seed": TRUTH_SEED,
        "seconds": time.perf_counter() - t0,
        "samples_per_second_residual_pass": summary.samples / summary.seconds if summary.seconds else None,
        "norms": list(signal),
        "tail": tail.tolist(),
        "tail_se": tail_se.tolist(),
        "ey2": ey2,
        "ey2_se": ey2_se,
    }


# ----------------------------------------------------------------------------- one net


def expansion_ses(res: dict[str, Any], store: str, lmax: int) -> list[np.ndarray]:
    """The SEs of the model's tensors: T_0..T_2 from the store, T_3..T_L from the residual pass."""
    _, low = _stored(store, range(min(3, lmax + 1)))
    if lmax < 3:
        return low
    _, high = _stored(res["passes"][0]["store"], range(3, lmax + 1))
    return low + high


def degree_rows(
    d: int,
    lmax: int,
    errors: list[tuple[float, float]],
    ses: list[np.ndarray],
    truth: dict[str, Any],
    ey2: float,
    report: dict[str, Any],
    excess_exact: list[float] | None,
    chunks: int,
) -> list[dict[str, Any]]:
    """Per degree: test error vs tail, predicted variance, measured excess and z-scores.

    ``fluct_se`` is the spread of ``Σ ‖T̂_l − T_l‖²`` about its mean (``2 Σ (mult se²)²``) and of the
    predicted variance itself (each se² comes from ``chunks`` chunk means: relative variance ``2/(chunks−1)``).
    """
    rows, pv, fluct2, exact = [], 0.0, 0.0, 0.0
    own = 1.0 + 1.0 / max(chunks - 1, 1)
    for L in range(lmax + 1):
        mult, fact = hermite.multiplicities(d, L), math.factorial(L)
        pv += float(mult @ ses[L] ** 2) / fact / ey2
        fluct2 += 2 * own * float((mult * ses[L] ** 2) @ (mult * ses[L] ** 2)) / fact**2 / ey2**2
        test, test_se = errors[L]
        tail, tail_se = truth["tail"][L], truth["tail_se"][L]
        excess = test - tail
        combined = math.sqrt(test_se**2 + tail_se**2 + fluct2)
        row = {
            "L": L,
            "test_error": test,
            "test_se": test_se,
            "tail": tail,
            "tail_se": tail_se,
            "predicted_variance": pv,
            "fluct_se": math.sqrt(fluct2),
            "excess": excess,
            "combined_se": combined,
            "z": (excess - pv) / combined,
            "entries": math.comb(d + L, L),
            "method_tail_same_run": report["tail"][L],
            "method_predicted_variance": report["predicted_variance"][L],
            "method_held_out_error": report["held_out_error"][L],
        }
        row["within"] = abs(row["z"]) <= 3.0
        if excess_exact is not None:
            exact += excess_exact[L] / ey2
            row.update(excess_exact=exact, z_exact=(exact - pv) / math.sqrt(fluct2))
        rows.append(row)
    return rows


def run_net(
    d: int, depth: int, act: str, n: int, lmax: int, n_test: int, mc_samples: int, client: Any, workdir: Path
) -> dict[str, Any]:
    widths = DEPTHS[depth]
    tag = f"d{d}-depth{depth}-{act}"
    rec: dict[str, Any] = {
        "net": tag,
        "d": d,
        "depth": depth,
        "widths": widths,
        "activation": act,
        "samples": n,
        "L_max": lmax,
        "test_samples": n_test,
    }
    t_start = time.perf_counter()
    source = source_of(d, widths, act)
    net = source.network
    # the truth first: depth 2 closed form, depth 3 a larger run
    t0 = time.perf_counter()
    if depth == 2:
        truth = depth2_truth(net, lmax)
        ey2 = truth["ey2"]
        mc, mc_se = monte_carlo_ey2(source, mc_samples)  # a check of the series
        truth.update(ey2_monte_carlo=mc, ey2_monte_carlo_se=mc_se, ey2_z=(mc - ey2) / mc_se)
    else:
        truth = truth_run(d, widths, act, 2 * n, lmax, client, workdir)
        ey2 = truth["ey2"]
    truth["seconds"] = time.perf_counter() - t0
    rec["truth"] = {k: v for k, v in truth.items() if not k.startswith("_")}

    store, model_path = str(workdir / f"{tag}.zarr"), str(workdir / f"{tag}.npz")
    t0 = time.perf_counter()
    res = api.fit(
        config_from_dict(run_cfg(d, widths, act, n)),
        store,
        "polynomial",
        degree=lmax,
        shrink="none",
        residual=True,
        out=model_path,
        client=client,
        progress=None,
    )
    wall = time.perf_counter() - t0
    passes = res["passes"]
    rec["fit"] = {
        "seconds": wall,
        "estimate_seconds": res["estimate"]["seconds"],
        "samples_per_second": res["estimate"]["samples_per_second"],
        "residual_pass_seconds": passes[0]["seconds"] if passes else None,
        "residual_pass_samples_per_second": n / passes[0]["seconds"] if passes else None,
        "learn_seconds": res["seconds"],
        "report_degree": res["report"]["degree"],
    }

    model = load_model(model_path)
    x, y = test_samples(source, n_test)
    t0 = time.perf_counter()
    cum = np.cumsum(model.terms(x), axis=1)
    rec["test_seconds"] = time.perf_counter() - t0
    errors = [relative_error(y, cum[:, L], ey2) for L in range(lmax + 1)]
    ses = expansion_ses(res, store, lmax)
    excess = exact_excess(net, truth, model.tensors, d) if depth == 2 else None
    rec["rows"] = degree_rows(d, lmax, errors, ses, truth, ey2, res["report"], excess, -(-n // CHUNK))

    # the method's own choice of degree, from the same store (statistics and residual pass reused)
    t0 = time.perf_counter()
    chosen = api.learn(
        store, "polynomial", shrink="none", out=str(workdir / f"{tag}-chosen.npz"), client=client, progress=None
    )
    deg = chosen["report"]["degree"]
    rec["held_out_choice"] = {
        "degree": deg,
        "seconds": time.perf_counter() - t0,
        "passes_run": len(chosen["passes"]),
        "held_out_error": chosen["report"]["held_out_error"],
        "test_error": errors[deg][0],
        "test_se": errors[deg][1],
        "best_test_degree": int(np.argmin([e[0] for e in errors])),
    }
    # the same tensors shrunk per order by their SEs (--shrink order): the curve no longer rises where an
    # order's noise exceeds its signal
    shrunk_path = str(workdir / f"{tag}-order.npz")
    shrunk = api.learn(store, "polynomial", degree=lmax, shrink="order", out=shrunk_path, client=client, progress=None)
    cum = np.cumsum(load_model(shrunk_path).terms(x), axis=1)
    order_errors = [relative_error(y, cum[:, L], ey2) for L in range(lmax + 1)]
    rec["shrink_order"] = {
        "test_error": [e[0] for e in order_errors],
        "test_se": [e[1] for e in order_errors],
        "factors": shrunk["report"]["shrink_factors"],
    }
    rec["seconds"] = time.perf_counter() - t_start
    return rec


def summarise_net(rec: dict[str, Any]) -> str:
    cells = " ".join(f"L{r['L']}:{r['test_error']:.4f}/{r['tail']:.4f}(z{r['z']:+.1f})" for r in rec["rows"])
    return (
        f"{rec['net']}: n={rec['samples']:.0e} fit {rec['fit']['seconds']:.0f}s "
        f"({rec['fit']['samples_per_second']:.0f}/s) chosen L={rec['held_out_choice']['degree']} | {cells}"
    )


# ----------------------------------------------------------------------------- side by side (subprocesses)


def _design_bytes(method: str, n: int, d: int, L: int) -> float:
    """Bytes of the n × features float64 design matrix of an in-memory regression (0 for the others)."""
    if method in ("ridge", "chaospy"):
        return 8.0 * n * math.comb(d + L, L)
    return 0.0


def baseline_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in a fresh subprocess: one (method, n) fit, its wall time, peak RSS and test errors."""
    import resource
    import signal

    limit = int(spec["address_space_gb"] * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a safety net: MemoryError, not a swamped machine

    def rss_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    def hwm_mib() -> float:
        """VmHWM: the peak RSS of this process's address space since its exec (Linux)."""
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024.0
        return float("nan")

    d, L, n, method = spec["d"], spec["L"], spec["n"], spec["method"]
    source = source_of(d, spec["widths"], spec["activation"])
    out: dict[str, Any] = {"method": method, "n": n, "L": L, "activation": spec["activation"]}
    if method != "relulearn":
        x, y = run_samples(source, RUN_SEED, n, CHUNK)
    out["rss_before_fit_mib"] = hwm_mib()

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"fit exceeded {spec['cap']} s")

    signal.signal(signal.SIGALRM, on_alarm)
    t0 = time.perf_counter()
    signal.alarm(int(spec["cap"]) if method != "relulearn" else 0)
    try:
        predict, extra = _fit_baseline(
            method, spec, source, x if method != "relulearn" else None, y if method != "relulearn" else None
        )
    except TimeoutError as err:
        out.update(
            status="out of time",
            error=str(err),
            seconds=time.perf_counter() - t0,
            peak_rss_mib=hwm_mib(),
            ru_maxrss_mib=rss_mib(),
        )
        return out
    except MemoryError as err:
        out.update(
            status="out of memory",
            error=f"MemoryError {err}",
            seconds=time.perf_counter() - t0,
            peak_rss_mib=hwm_mib(),
            ru_maxrss_mib=rss_mib(),
        )
        return out
    finally:
        signal.alarm(0)
    out.update(status="ok", seconds=time.perf_counter() - t0, peak_rss_mib=hwm_mib(), ru_maxrss_mib=rss_mib(), **extra)
    xt, yt = test_samples(source, spec["n_test"])
    preds = predict(xt)  # {L: prediction}
    out["test"] = {str(k): relative_error(yt, p, spec["ey2"]) for k, p in preds.items()}
    return out


def _batched(fn: Any, x: np.ndarray, rows: int = 4000) -> np.ndarray:
    return np.concatenate([np.asarray(fn(x[i : i + rows])).reshape(-1) for i in range(0, len(x), rows)])


def _fit_baseline(
    method: str, spec: dict[str, Any], source: Any, x: np.ndarray | None, y: np.ndarray | None
) -> tuple[Any, dict[str, Any]]:
    L, d = spec["L"], spec["d"]
    if method == "ridge":
        from sklearn.linear_model import Ridge
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import PolynomialFeatures

        model = make_pipeline(PolynomialFeatures(L, include_bias=False), Ridge())
        model.fit(x, y)
        return (lambda xt: {L: _batched(model.predict, xt)}), {"features": math.comb(d + L, L)}
    if method == "chaospy":
        import chaospy

        expansion = chaospy.generate_expansion(L, chaospy.Iid(chaospy.Normal(0, 1), d))
        fitted = chaospy.fit_regression(expansion, x.T, y)
        return (lambda xt: {L: _batched(lambda b: fitted(*b.T), xt)}), {"features": len(expansion)}
    if method == "mlp":
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPRegressor

        act = "relu" if spec["activation"] == "relu" else "tanh"
        mlp = MLPRegressor(
            hidden_layer_sizes=tuple(spec["widths"]),
            activation=act,
            solver="adam",
            early_stopping=True,
            random_state=0,
            max_iter=1,
            warm_start=True,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            t0 = time.perf_counter()
            mlp.fit(x, y)  # one epoch: its time sets how many more fit in the cap
            epoch = time.perf_counter() - t0
            more = max(0, int(0.9 * (spec["cap"] - epoch) / epoch))
            if more:
                mlp.set_params(max_iter=more)
                mlp.fit(x, y)
        epochs = 1 + (mlp.n_iter_ if more else 0)
        return (lambda xt: {L: mlp.predict(xt)}), {
            "epochs": epochs,
            "epoch_seconds": epoch,
            "mlp_activation": act,
            "stopped_early": bool(more and mlp.n_iter_ < more),
        }
    if method == "relulearn":
        with tempfile.TemporaryDirectory(dir=spec["tmp"]) as tmp:
            cfg = config_from_dict(run_cfg(d, spec["widths"], spec["activation"], spec["n"]))
            res = api.fit(
                cfg,
                f"{tmp}/s.zarr",
                "polynomial",
                degree=L,
                residual=True,
                shrink="none",
                out=f"{tmp}/m.npz",
                client="local",
                progress=None,
            )
            model = load_model(f"{tmp}/m.npz")
        extra = {
            "samples_per_second": res["estimate"]["samples_per_second"],
            "residual_pass_seconds": res["passes"][0]["seconds"] if res["passes"] else None,
        }
        return (lambda xt: {k: v for k, v in enumerate(np.cumsum(model.terms(xt), axis=1).T)}), extra
    raise ValueError(method)


def run_baseline(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One (method, n) in a fresh subprocess of this script; its JSON line back.

    Started through ``sh``, which forks it: Linux carries a process's peak RSS across ``exec``, so a
    child exec'd straight from this (large) driver would report the driver's peak as its ``ru_maxrss``."""
    cmd = [
        "/bin/sh",
        "-c",
        '"$@"; exit $?',
        "sh",
        sys.executable,
        str(Path(__file__).resolve()),
        "--baseline",
        json.dumps(spec),
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {
            "method": spec["method"],
            "n": spec["n"],
            "L": spec["L"],
            "activation": spec["activation"],
            "status": "out of time",
            "error": f"killed after {timeout:.0f} s (subprocess)",
            "seconds": time.perf_counter() - t0,
        }
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        err = proc.stderr.strip().splitlines()[-3:]
        status = "out of memory" if any("MemoryError" in e for e in err) or proc.returncode in (-9, 137) else "error"
        return {
            "method": spec["method"],
            "n": spec["n"],
            "L": spec["L"],
            "activation": spec["activation"],
            "status": status,
            "error": " | ".join(err)[:600],
            "returncode": proc.returncode,
            "seconds": time.perf_counter() - t0,
        }
    return json.loads(lines[-1][len("RESULT ") :])


def _predicted_seconds(
    method: str, n: int, L: int, d: int, rows: list[dict[str, Any]], lower: list[dict[str, Any]]
) -> tuple[float | None, str]:
    """A fit's time predicted from the last one that finished: linear in n, and (for the in-memory
    regressions, whose cost is dominated by building and multiplying the design) at least linear in the
    number of features when only a lower degree was measured at this n."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if method == "relulearn":
        return None, ""
    if ok:
        return ok[-1]["seconds"] * n / ok[-1]["n"], f"n = {ok[-1]['n']:.0e}"
    same = [r for r in lower if r.get("status") == "ok" and r["n"] == n and method in ("ridge", "chaospy")]
    if same:
        r = same[-1]
        return r["seconds"] * math.comb(d + L, L) / math.comb(d + r["L"], r["L"]), f"degree {r['L']} at the same n"
    return None, ""


def sweep(
    method: str,
    L: int,
    grid: list[int],
    base: dict[str, Any],
    args: argparse.Namespace,
    save: Any,
    lower: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Fits at growing n until the design matrix would exceed the memory limit or a fit exceeds the cap."""
    rows: list[dict[str, Any]] = []
    for n in grid:
        spec = dict(base, method=method, L=L, n=int(n))
        need = _design_bytes(method, n, base["d"], L)
        predicted, basis = _predicted_seconds(method, n, L, base["d"], rows, lower or [])
        if need > args.memory_limit_gb * 2**30:
            rows.append(
                {
                    "method": method,
                    "n": int(n),
                    "L": L,
                    "activation": base["activation"],
                    "status": "out of memory",
                    "needs_gb": need / 2**30,
                    "error": f"design matrix needs {need / 2**30:.1f} GiB (limit {args.memory_limit_gb} GiB): not run",
                }
            )
        elif predicted is not None and predicted > 1.5 * args.cap:
            rows.append(
                {
                    "method": method,
                    "n": int(n),
                    "L": L,
                    "activation": base["activation"],
                    "status": "out of time",
                    "predicted_seconds": predicted,
                    "error": f"predicted {predicted:.0f} s from {basis} (cap {args.cap:.0f} s): not run",
                }
            )
        else:
            rows.append(run_baseline(spec, timeout=args.cap + 600 if method != "relulearn" else 3600))
            rows[-1]["design_gb"] = need / 2**30
        r = rows[-1]
        print(
            f"  {method} L={L} n={n:.0e} {base['activation']}: {r['status']} {r.get('seconds', 0):.0f}s "
            f"rss {r.get('peak_rss_mib', float('nan')):.0f} MiB test {r.get('test')} {r.get('error', '')[:120]}",
            flush=True,
        )
        save(rows)
        if r["status"] != "ok":
            break
    return rows


def part_side_by_side(args: argparse.Namespace, result: dict[str, Any], out: Path, tmp: str) -> None:
    d, widths = args.side_d, DEPTHS[2]
    side = result.setdefault(
        "side_by_side",
        {
            "d": d,
            "widths": widths,
            "degrees": args.side_degrees,
            "cap_seconds": args.cap,
            "memory_limit_gb": args.memory_limit_gb,
            "test_samples": args.test_samples[0],
            "runs": {},
        },
    )
    runs = side["runs"]
    ey2 = {act: depth2_truth(source_of(d, widths, act).network, 0)["ey2"] for act in ("relu", "erf")}

    def base(act: str) -> dict[str, Any]:
        return {
            "d": d,
            "widths": widths,
            "activation": act,
            "n_test": args.test_samples[0],
            "ey2": ey2[act],
            "cap": args.cap,
            "address_space_gb": args.address_space_gb,
            "tmp": tmp,
        }

    def keeper(key: str) -> Any:
        def save(rows: list[dict[str, Any]]) -> None:
            runs[key] = rows
            save_json(result, out)

        return save

    top = max(args.side_degrees)
    plan = [("relulearn", top, args.relulearn_grid)]
    for L in args.side_degrees:
        plan += [("ridge", L, args.ridge_grid), ("chaospy", L, args.chaospy_grid)]
    plan.append(("mlp", 0, args.mlp_grid))
    for method, L, grid in plan:
        key = f"{method}-L{L}-relu"
        if key in runs and args.resume:
            continue
        print(f"side by side: {key}", flush=True)
        lower = runs.get(f"{method}-L{L - 1}-relu")
        sweep(method, L, grid, base("relu"), args, keeper(key), lower)
    # erf: each in-memory method at the largest n it managed on relu; the MLP at its largest n
    for key in [k for k in list(runs) if k.endswith("-relu") and not k.startswith("relulearn")]:
        done = [r for r in runs[key] if r.get("status") == "ok"]
        ekey = key.replace("-relu", "-erf")
        if not done or (ekey in runs and args.resume):
            continue
        r = done[-1]
        print(f"side by side: {ekey} at n = {r['n']:.0e}", flush=True)
        sweep(r["method"], r["L"], [r["n"]], base("erf"), args, keeper(ekey))


# ----------------------------------------------------------------------------- report


def fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.{digits}g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.{max(digits - 1, 1)}e}"


def nets_table(result: dict[str, Any]) -> str:
    lines = []
    for d in sorted({r["d"] for r in result.get("nets", [])}):
        nets = [r for r in result["nets"] if r["d"] == d]
        lmax = max(r["L_max"] for r in nets)
        head = " | ".join(f"L = {L}" for L in range(lmax + 1))
        lines += [
            "",
            f"d = {d}: test error / tail (measured excess − predicted variance, in combined SEs)",
            "",
            f"| net | samples (samples/s) | {head} | within (abs z ≤ 3) | held-out choice |",
            "|---|---|" + "---|" * (lmax + 1) + "---|---|",
        ]
        for r in nets:
            cells = " | ".join(f"{fmt(x['test_error'])} / {fmt(x['tail'])} ({x['z']:+.1f})" for x in r["rows"])
            within = sum(x["within"] for x in r["rows"])
            ch = r["held_out_choice"]
            lines.append(
                f"| depth {r['depth']} {r['activation']} | {r['samples']:.0e} "
                f"({r['fit']['samples_per_second'] / 1e3:.0f} k/s) | {cells} | {within}/{len(r['rows'])} | "
                f"L = {ch['degree']}: {fmt(ch['test_error'])} |"
            )
        shrunk = [r for r in nets if "shrink_order" in r]
        if shrunk:
            lines += [
                "",
                f"d = {d}: test error with --shrink order (same tensors, each order scaled by max(0, 1 − V_l/‖T̂_l‖²))",
                "",
                f"| net | {head} |",
                "|---|" + "---|" * (lmax + 1),
            ]
            lines += [
                f"| depth {r['depth']} {r['activation']} | "
                + " | ".join(fmt(e) for e in r["shrink_order"]["test_error"])
                + " |"
                for r in shrunk
            ]
    return "\n".join(lines)


def side_table(result: dict[str, Any]) -> str:
    side = result.get("side_by_side")
    if not side:
        return ""
    lines = [
        "",
        f"side by side, d = {side['d']}, depth 2 (widths {side['widths']}):",
        "",
        "| method | teacher | L | n | test error | fit seconds | peak RSS (MiB) | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    nets = [
        r
        for r in result.get("nets", [])
        if r.get("d") == side["d"] and r.get("depth") == 2 and "rows" in r and r["activation"] in ("relu", "erf")
    ]
    for r in nets:  # relulearn on the cluster: the nets part's run of the same teacher (same samples and test set)
        err = "; ".join(f"L{L}: {fmt(r['rows'][L]['test_error'])}" for L in side["degrees"] if L <= r["L_max"])
        lines.append(
            f"| relulearn (nets part, 2 workers, degree {r['L_max']} cut) | {r['activation']} | "
            f"{'/'.join(map(str, side['degrees']))} | {r['samples']:.0e} | {err} | "
            f"{fmt(r['fit']['seconds'])} | "
            "– | ok |"
        )
    for rows in side["runs"].values():
        for r in rows:
            tests = r.get("test") or {}
            err = "; ".join(
                f"L{k}: {fmt(v[0])}"
                for k, v in tests.items()
                if r["method"] != "relulearn" or int(k) in side["degrees"]
            )
            lines.append(
                f"| {r['method']} | {r['activation']} | {r['L'] if r['method'] != 'mlp' else '–'} | "
                f"{r['n']:.0e} | {err or '–'} | {fmt(r.get('seconds'))} | {fmt(r.get('peak_rss_mib'))} | "
                f"{r['status']}{(': ' + r['error'][:80]) if r['status'] != 'ok' else ''} |"
            )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets = result.get("nets", [])
    cols = 4
    panels = len(nets) + (2 if result.get("side_by_side") else 0)
    rows = max(1, -(-panels // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, r in zip(axes.flat, nets):
        L = [x["L"] for x in r["rows"]]
        test = np.array([x["test_error"] for x in r["rows"]])
        se = np.array([x["test_se"] for x in r["rows"]])
        tail = np.array([x["tail"] for x in r["rows"]])
        pv = np.array([x["predicted_variance"] for x in r["rows"]])
        ax.errorbar(L, test, yerr=se, fmt="o-", ms=4, label="test error")
        ax.plot(L, np.maximum(tail, 1e-6), "k--", label="tail (truth)")
        ax.plot(L, tail + pv, "r:", label="tail + predicted variance")
        if "shrink_order" in r:
            ax.plot(
                L, r["shrink_order"]["test_error"], "s-", ms=3, color="tab:purple", label="test error, shrink order"
            )
        ch = r["held_out_choice"]
        ax.plot([ch["degree"]], [ch["test_error"]], "g*", ms=12, label="held-out choice")
        ax.set_yscale("log")
        ax.set_title(f"d={r['d']} depth {r['depth']} {r['activation']} n={r['samples']:.0e}", fontsize=9)
        ax.set_xlabel("degree L", fontsize=8)
    if nets:
        axes.flat[0].legend(fontsize=6)
    side = result.get("side_by_side")
    if side:
        for ax, L in zip(list(axes.flat)[len(nets) :], side["degrees"]):
            for key, rws in side["runs"].items():
                if not key.endswith("-relu"):
                    continue
                degree = "0" if key.startswith("mlp") else str(L)  # the MLP has no degree: on both panels
                pts = [
                    (r["n"], r["test"][degree][0])
                    for r in rws
                    if r.get("status") == "ok" and degree in (r.get("test") or {})
                ]
                if pts:
                    n, e = zip(*pts)
                    name = key.split("-")[0]
                    ax.loglog(n, e, "o-", label="MLPRegressor (teacher's shape)" if name == "mlp" else name)
            ax.set_title(f"side by side, relu d={side['d']}, L={L}", fontsize=9)
            ax.set_xlabel("samples n", fontsize=8)
            ax.set_ylabel("relative test error", fontsize=8)
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def part_nets(args: argparse.Namespace, result: dict[str, Any], out: Path, workdir: Path) -> None:
    from relulearn.pipeline.cluster import connect

    done = {r["net"] for r in result.get("nets", []) if "rows" in r} if args.resume else set()
    if not args.resume:
        result["nets"] = []
    result.setdefault("nets", [])
    with connect(workers=2) as client:
        for d, n, lmax, n_test in zip(args.dims, args.samples, args.degrees, args.test_samples):
            for depth in args.depths:
                for act in ACTS:
                    tag = f"d{d}-depth{depth}-{act}"
                    if tag in done:
                        continue
                    try:
                        rec = run_net(d, depth, act, n, lmax, n_test, args.mc_samples, client, workdir)
                    except Exception as err:  # noqa: BLE001 - recorded, so that the other nets still run
                        rec = {
                            "net": tag,
                            "d": d,
                            "depth": depth,
                            "activation": act,
                            "status": "error",
                            "error": f"{type(err).__name__}: {err}"[:600],
                            "traceback": traceback.format_exc(limit=6),
                        }
                        print(rec["traceback"], flush=True)
                    else:
                        print(summarise_net(rec), flush=True)
                    result["nets"] = [r for r in result["nets"] if r["net"] != tag] + [rec]
                    save_json(result, out)
    result["nets"] = [r for r in result["nets"] if "rows" in r] + [r for r in result["nets"] if "rows" not in r]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true", help="smoke run: small d, widths and sample counts")
    ap.add_argument("--parts", default="nets,side_by_side")
    ap.add_argument("--resume", action="store_true", help="keep the nets and side-by-side runs the result file holds")
    ap.add_argument(
        "--report", action="store_true", help="only redraw the figure and print the tables of the result file"
    )
    ap.add_argument("--baseline", help=argparse.SUPPRESS)  # internal: one side-by-side fit in a subprocess
    ap.add_argument("--cap", type=float, default=120.0, help="seconds per baseline fit")
    ap.add_argument("--memory-limit-gb", type=float, default=6.0, help="largest design matrix a sweep runs (GiB)")
    ap.add_argument("--address-space-gb", type=float, default=16.0, help="RLIMIT_AS of each baseline subprocess (GiB)")
    ap.add_argument("--mc-samples", type=int, default=300_000, help="Monte Carlo samples checking the depth-2 E[y²]")
    args = ap.parse_args(argv)
    if args.quick:
        args.dims, args.samples, args.degrees, args.test_samples = [8, 12], [200_000, 200_000], [5, 4], [20_000, 20_000]
        args.depths = [2, 3]
        args.side_d, args.side_degrees = 8, [3, 4]
        args.relulearn_grid = [10_000, 100_000]
        args.ridge_grid, args.chaospy_grid, args.mlp_grid = [10_000, 30_000], [2_000], [20_000]
        args.cap, args.mc_samples = min(args.cap, 20.0), 100_000
        DEPTHS.update({2: [64], 3: [32, 32]})
    else:
        args.dims, args.samples, args.degrees, args.test_samples = (
            [20, 50],
            [1_000_000, 1_000_000],
            [6, 4],
            [60_000, 30_000],
        )
        args.depths = [2, 3]
        args.side_d, args.side_degrees = 20, [3, 4]
        args.relulearn_grid = [10_000, 100_000, 1_000_000, 10_000_000]
        args.ridge_grid = [10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000]
        args.chaospy_grid = [3_000, 10_000, 30_000]
        args.mlp_grid = [1_000_000]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.baseline:
        spec = json.loads(args.baseline)
        print("RESULT " + json.dumps(baseline_worker(spec), default=lambda o: o.item()), flush=True)
        return 0
    from learn_one_hidden import machine_info

    out = args.out if not args.quick else args.out.with_name(args.out.stem + "_quick.json")
    # parts not run this time are kept from the result file; --resume also keeps finished items of the parts run
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if args.report:
        plot(result, out.with_suffix(".png"))
        print(nets_table(result))
        print(side_table(result))
        return 0
    result.update(
        benchmark="learn_polynomial",
        started=utc_now(),
        machine=machine_info(),
        quick=args.quick,
        settings={
            "dims": args.dims,
            "samples": args.samples,
            "degrees": args.degrees,
            "test_samples": args.test_samples,
            "depth_widths": DEPTHS,
            "activations": ACTS,
            "run_seed": RUN_SEED,
            "truth_seed": TRUTH_SEED,
            "teacher_seed": TEACHER_SEED,
            "chunk_size": CHUNK,
            "mc_samples": args.mc_samples,
            "shrink": "none",
            "residual": True,
        },
    )
    parts = set(args.parts.split(","))
    t_start = time.perf_counter()
    Path("/tmp/polybench").mkdir(parents=True, exist_ok=True)
    timing = result.setdefault("part_seconds", {})
    with tempfile.TemporaryDirectory(dir="/tmp/polybench") as tmp:
        if "nets" in parts:
            t0 = time.perf_counter()
            part_nets(args, result, out, Path(tmp))
            timing["nets"] = time.perf_counter() - t0
        if "side_by_side" in parts:
            if not args.resume:
                result.pop("side_by_side", None)
            t0 = time.perf_counter()
            part_side_by_side(args, result, out, tmp)
            timing["side_by_side"] = time.perf_counter() - t0
    result["seconds"] = time.perf_counter() - t_start
    result["finished"] = utc_now()
    save_json(result, out)
    plot(result, out.with_suffix(".png"))
    print(nets_table(result))
    print(side_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
