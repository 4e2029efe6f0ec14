"""Sketched second moments and subspace passes against the dense family (a script, not a test).

Planted one-hidden-layer teacher ``y = Σ λ_i relu(<u_i, x>)`` (k = 4, unit u_i), so that
``M_2 = E[y (xxᵀ − I)] = c_2 Σ λ_i u_i u_iᵀ`` with ``c_2 = 1/√(2π)``: its nonzero eigenvalues
and eigenvectors are known.

Part ``a`` (d = 512, 10⁶ samples, r = 32), on ONE shared two-worker ``LocalCluster``:

- the dense ``M_2`` (``output_moments``' ``T2``) and its sketch ``Y = M_2 Ω`` in two runs of
  the same seed (the same chunks), then subspace passes (``M_2 B``, ``Bᵀ M_2 B``) on those
  chunks, started from ``orth(Y)``: after ONE pass, the largest principal angle between the
  dense top-k eigenvectors and the pass's refined top-k estimate (``range(M̂ V)``, V the top-k
  Ritz vectors; the Ritz vectors themselves lie in the sketch's range), next to the pass's
  Davis–Kahan angle bound (and both angles to the planted span); two more passes show the
  iteration;
- throughput of the statistic's update (single BLAS thread, the same generated batches,
  interleaved repetitions): dense ``M_2`` (two symmetric rank-k updates, d (d + 1) flops per
  sample) vs sketch and subspace pass at r = 32 and r = 16 (4 d r flops), and a bare numpy
  product of the sketch's flops (roofline ratio); and end-to-end samples/s of the runs (Gaussian
  generation, teacher and update on two workers).

Part ``c`` (d = 3000, 2·10⁶ samples, r = 16): sketch, then several passes; per pass the Ritz
values against the true eigenvalues, the angle to the planted span against the bound, the
noise floor, and the move of the next pass (the stop rule).

Writes ``benchmarks/results/sketch.json`` (after each part). ``--parts a`` or ``--parts c`` runs
one part (the other part's stored results are kept); ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from relulearn import open_store  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.estimators.spectral import stage as spectral  # noqa: E402
from relulearn.estimators.spectral.subspace import sketch_basis, subspace_iteration  # noqa: E402
from relulearn.estimators.spectral.subspace_geometry import principal_angles  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.refines import refine_record  # noqa: E402
from relulearn.pipeline.run import estimate  # noqa: E402
from relulearn.pipeline.sources import chunk_batches, make_source  # noqa: E402
from relulearn.pipeline.stats.output_moments import OutputMoments  # noqa: E402
from relulearn.pipeline.stats.sketch import SketchMoments, gaussian_test_matrix  # noqa: E402

from _common import save_json, utc_now  # noqa: E402
from learn_one_hidden import machine_info  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "sketch.json"
RUN_SEED = 11
LAMBDA = [1.2, -1.0, 0.9, -0.7]
C2 = 1.0 / math.sqrt(2.0 * math.pi)
CHUNK = 50_000


def run_config(d: int, samples: int, statistics: dict) -> dict[str, Any]:
    return {
        "seed": RUN_SEED,
        "samples": samples,
        "chunk_size": CHUNK,
        "source": {
            "d": d,
            "teacher": {"kind": "one_hidden_relu", "width": len(LAMBDA), "output_weights": LAMBDA, "seed": 0},
        },
        "statistics": statistics,
        "run": {"chunks_per_block": 2, "commit_interval": 1e9},
    }


def truth(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (by |value|) and eigenvectors of the population M_2 of the planted teacher."""
    source = make_source(config_from_dict(run_config(d, CHUNK, {})))
    u, lam = source.network.weights[0], source.network.weights[1][0]  # unit rows u_i, output weights λ_i
    m2 = C2 * (u.T * lam) @ u
    w, v = np.linalg.eigh(m2)
    top = np.argsort(-np.abs(w))[: len(lam)]
    return w[top], v[:, top]


def top_eigen(m: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    w, v = np.linalg.eigh(0.5 * (m + m.T))
    top = np.argsort(-np.abs(w))[:k]
    return w[top], v[:, top]


def angle(a: np.ndarray, b: np.ndarray) -> float:
    return float(principal_angles(a, b).max())


def pass_runner(base: dict, workdir: Path, client: Any, log: list, tag: str) -> Callable[[dict], dict]:
    """``run_pass`` for the iteration driver: the stored configuration with the pass's statistics."""

    def run_pass(statistics: dict) -> dict:
        url = str(workdir / f"{tag}-pass{len(log)}.zarr")
        summary = estimate(config_from_dict(dict(base, statistics=statistics)), url, client=client, progress=None)
        log.append({"seconds": summary.seconds, "samples_per_second": summary.samples_per_second})
        print(f"  pass {len(log)}: {summary.seconds:.0f} s", flush=True)
        return open_store(url).arrays("sketch")

    return run_pass


def iteration_rows(it, lam_true: np.ndarray, v_true: np.ndarray, dense_v: np.ndarray | None, log: list) -> list:
    rows = []
    for t, (step, change) in enumerate(zip(it.steps, it.changes)):
        k = step.k
        row = {
            "pass": t + 1,
            "ritz_values": step.eigenvalues[:k].tolist(),
            "true_eigenvalues": lam_true.tolist(),
            # sorted by value: the |θ| order of an unconverged pass may differ from the true one
            "eigenvalue_error_max": float(np.abs(np.sort(step.eigenvalues[:k]) - np.sort(lam_true)).max()),
            "eigenvalue_floor": step.eigenvalue_floor,
            "noise_floor": step.floor,
            "subspace_noise": step.subspace_noise,
            "gap": step.gap,
            "angle_bound": step.angle_bound,
            "angle_to_truth": angle(v_true, step.refined_vectors),
            "ritz_angle_to_truth": angle(v_true, step.vectors[:, :k]),
            "next_pass_move": change,
            "stop_rule_fires": bool(t + 1 >= 2 and change <= step.angle_bound),
            "significant": step.significant,
            **log[t],
        }
        if dense_v is not None:
            row["angle_to_dense"] = angle(dense_v, step.refined_vectors)
            row["ritz_angle_to_dense"] = angle(dense_v, step.vectors[:, :k])
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- throughput


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def update_throughput(d: int, r: int, rows: int, reps: int) -> dict[str, Any]:
    """Update samples/s of dense M_2 and of its sketch and subspace pass at rank r, on the same
    batches, one BLAS thread, interleaved repetitions (best of ``reps``)."""
    from threadpoolctl import threadpool_limits

    cfg = config_from_dict(run_config(d, rows, {}))
    batches = list(chunk_batches(make_source(cfg), RUN_SEED, 0, rows))
    basis = np.linalg.qr(gaussian_test_matrix(d, r, 1))[0]
    stats = {
        "dense_M2": OutputMoments(d),
        "sketch_r": SketchMoments(gaussian_test_matrix(d, r, 0), second=True),
        "pass_r": SketchMoments(basis, is_basis=True, second=True),
    }
    om = stats["sketch_r"].omega

    def run(stat) -> None:
        acc = stat.init()
        for x, y in batches:
            stat.update(acc, x, y)

    def bare() -> None:  # the sketch's flops as two bare GEMMs: Z = X Ω, Xᵀ Z
        for x, _ in batches:
            x.T @ (x @ om)

    times: dict[str, list[float]] = {k: [] for k in [*stats, "bare_gemm"]}
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(reps):
            for name, stat in stats.items():
                times[name].append(_time(lambda stat=stat: run(stat)))
            times["bare_gemm"].append(_time(bare))
    rate = {k: rows / min(v) for k, v in times.items()}
    return {
        "d": d,
        "rank": r,
        "rows": rows,
        "reps": reps,
        "samples_per_second": rate,
        "ratio_sketch_vs_dense": rate["sketch_r"] / rate["dense_M2"],
        "ratio_pass_vs_dense": rate["pass_r"] / rate["dense_M2"],
        "roofline_ratio_sketch": rate["sketch_r"] / rate["bare_gemm"],
        "flops_per_sample": {"dense_M2": d * (d + 1), "sketch": 4 * d * r},
        "flop_ratio": d * (d + 1) / (4 * d * r),
    }


# ----------------------------------------------------------------------------------- parts


def part_a(client: Any, workdir: Path, quick: bool) -> dict[str, Any]:
    d, n, r, k = (64, 200_000, 16, 4) if quick else (512, 1_000_000, 32, 4)
    lam_true, v_true = truth(d)
    dense_url, sketch_url = str(workdir / "dense.zarr"), str(workdir / "sketch.zarr")
    t = time.perf_counter()
    dense_sum = estimate(
        config_from_dict(run_config(d, n, {"basic": None, "output_moments": {}})),
        dense_url,
        client=client,
        progress=None,
    )
    print(f"dense M_2: {time.perf_counter() - t:.0f} s", flush=True)
    t = time.perf_counter()
    sketch_sum = estimate(
        config_from_dict(run_config(d, n, {"basic": None, "sketch": {"rank": r, "second": {}}})),
        sketch_url,
        client=client,
        progress=None,
    )
    print(f"sketch: {time.perf_counter() - t:.0f} s", flush=True)
    dense_run, sketch_run = open_store(dense_url), open_store(sketch_url)
    assert np.array_equal(dense_run.ledger(), sketch_run.ledger())  # the same chunks, the same blocks

    t2, t2_se = (a[0] for a in dense_run.estimate("output_moments", "T2"))
    dense_w, dense_v = top_eigen(t2, k)
    dense_floor = spectral.noise_floor(t2_se)
    w_all = np.sort(np.abs(np.linalg.eigvalsh(0.5 * (t2 + t2.T))))[::-1]
    sk = sketch_run.arrays("sketch")
    initial = sketch_basis(sk["Y_second"], sk["Y_second_se"])

    log: list = []
    it = subspace_iteration(
        pass_runner(sketch_run.meta["config"], workdir, client, log, "a"),
        sk,
        sketch_run.meta["config"]["statistics"]["sketch"],
        k=k,
        refines=refine_record(sketch_run.meta),
        max_passes=1 if quick else 3,
        rtol=0.0,
    )
    one = it.steps[0]
    result = {
        "d": d,
        "samples": n,
        "rank": r,
        "k": k,
        "lambda": LAMBDA,
        "true_eigenvalues": lam_true.tolist(),
        "dense": {
            "seconds": dense_sum.seconds,
            "samples_per_second": dense_sum.samples_per_second,
            "top_eigenvalues": dense_w.tolist(),
            "noise_floor": dense_floor,
            "gap": float(w_all[k - 1] - w_all[k]),
            "angle_to_truth": angle(v_true, dense_v),
            "angle_bound_full_floor": spectral_bound(dense_floor, float(w_all[k - 1] - w_all[k])),
        },
        "sketch": {
            "seconds": sketch_sum.seconds,
            "samples_per_second": sketch_sum.samples_per_second,
            "floor": initial.floor,
            "significant": initial.significant,
            "singular_values": initial.singular_values.tolist(),
            "top_k_angle_to_truth": angle(v_true, initial.basis[:, :k]),
            "top_k_angle_to_dense": angle(dense_v, initial.basis[:, :k]),
        },
        "one_pass": {
            "angle_to_dense": angle(dense_v, one.refined_vectors),
            "angle_bound": one.angle_bound,
            "within_bound": angle(dense_v, one.refined_vectors) <= one.angle_bound,
            "angle_to_truth": angle(v_true, one.refined_vectors),
            "ritz_angle_to_dense": angle(dense_v, one.vectors[:, :k]),
            "ritz_values": one.eigenvalues[:k].tolist(),
            "refined_values": one.refined_values.tolist(),
            "noise_floor": one.floor,
            "dense_noise_floor": dense_floor,
            "subspace_noise": one.subspace_noise,
            "gap": one.gap,
        },
        "passes": iteration_rows(it, lam_true, v_true, dense_v, log),
        "end_to_end_ratio_sketch_vs_dense": sketch_sum.samples_per_second / dense_sum.samples_per_second,
    }
    rows, reps = (8 * 4096, 2) if quick else (16 * 4096, 3)
    result["update_throughput"] = update_throughput(d, r, rows, reps)
    # at half the rank: the flop ratio of a pass to the symmetric dense update is d (d + 1) / (4 d r)
    result["update_throughput_half_rank"] = update_throughput(d, r // 2, rows, reps)
    return result


def spectral_bound(noise: float, gap: float) -> float:
    return math.pi / 2 if gap <= 2 * noise else math.asin(noise / (gap - noise))


def part_c(client: Any, workdir: Path, quick: bool, max_passes: int) -> dict[str, Any]:
    d, n, r, k = (200, 200_000, 16, 4) if quick else (3000, 2_000_000, 16, 4)
    lam_true, v_true = truth(d)
    url = str(workdir / "sketch_c.zarr")
    t = time.perf_counter()
    summary = estimate(
        config_from_dict(run_config(d, n, {"basic": None, "sketch": {"rank": r, "second": {}}})),
        url,
        client=client,
        progress=None,
    )
    print(f"sketch d={d}: {time.perf_counter() - t:.0f} s", flush=True)
    run = open_store(url)
    sk = run.arrays("sketch")
    initial = sketch_basis(sk["Y_second"], sk["Y_second_se"])
    log: list = []
    it = subspace_iteration(
        pass_runner(run.meta["config"], workdir, client, log, "c"),
        sk,
        run.meta["config"]["statistics"]["sketch"],
        k=k,
        refines=refine_record(run.meta),
        max_passes=max_passes,
        rtol=0.0,
    )
    fired = [row["pass"] for row in iteration_rows(it, lam_true, v_true, None, log) if row["stop_rule_fires"]]
    return {
        "d": d,
        "samples": n,
        "rank": r,
        "k": k,
        "lambda": LAMBDA,
        "true_eigenvalues": lam_true.tolist(),
        "sketch": {
            "seconds": summary.seconds,
            "samples_per_second": summary.samples_per_second,
            "floor": initial.floor,
            "significant": initial.significant,
            "singular_values": initial.singular_values.tolist(),
            "top_k_angle_to_truth": angle(v_true, initial.basis[:, :k]),
        },
        "passes": iteration_rows(it, lam_true, v_true, None, log),
        "stop_rule_would_stop_after_pass": fired[0] if fired else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="ac", help="which parts to run: a, c or ac")
    ap.add_argument("--passes", type=int, default=3, help="subspace passes of part c")
    ap.add_argument("--quick", action="store_true", help="smoke run at small d")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    if args.quick and args.out == DEFAULT_OUT:
        args.out = Path(tempfile.gettempdir()) / "relulearn-sketch-quick.json"  # never over the real results
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() and not args.quick else {}
    result.update(
        {
            "benchmark": "sketch",
            "started": utc_now(),
            "quick": args.quick,
            "machine": machine_info(),
            "runner": "relulearn.pipeline.run.estimate on a shared two-worker LocalCluster",
        }
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="relulearn-bench-sketch-") as tmp, connect(workers=2) as client:
        if "a" in args.parts:
            result["a"] = part_a(client, Path(tmp), args.quick)
            save_json(result, args.out)
        if "c" in args.parts:
            result["c"] = part_c(client, Path(tmp), args.quick, args.passes)
    result["finished"] = utc_now()
    result["total_seconds"] = time.perf_counter() - t0
    save_json(result, args.out)
    print(json.dumps({k: result[k] for k in ("a", "c") if k in result}, indent=1, default=str)[:6000])


if __name__ == "__main__":
    main()
