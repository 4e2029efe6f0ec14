"""The tensor method's second pass: the full ``contracted`` family against ``projected_contracted`` (a script,
not a test).

Measures, in one process and one run:

1. samples/s of ``Statistic.update`` of the second pass's statistic as the complete route asks for it
   (orders 3–6, ``max(8, 2k)`` directions inside a k-dimensional subspace, residual labels of a degree-≤2
   expansion per output): the full family (d × d matrices per order, direction and output) against the
   projected one (k × k), timed interleaved (A, B, A, B, …) on the same batches, BLAS single-threaded as in a
   pipeline worker; the ratio of their rates. Cases: d = 61, k = 16, 10 outputs (32 directions) and d = 100,
   k = 50, one output (100 directions).
2. with ``--fit TREE ...``: an end-to-end ``relulearn fit --method tensor`` of a planted d = 61, width-16,
   10-output network with biases (``--fit-samples`` samples, in process), once per source tree given
   (``PYTHONPATH`` set to it: e.g. the main checkout, before, and this one, after): the second pass's
   seconds from the fit's JSON, and whether the network came out exact.

Run ``python benchmarks/tensor_pass.py`` (about a minute), ``--fit /path/to/main /path/to/this`` for the
end-to-end part (a few minutes); results go to ``benchmarks/results/tensor_pass.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from relulearn.pipeline.stats.contracted import ContractedMoments
from relulearn.pipeline.stats.per_output import PerOutput
from relulearn.pipeline.stats.projected_contracted import ProjectedContracted

from _common import cpu_model, save_json, utc_now

ORDERS = (3, 4, 5, 6)
CASES = ((61, 16, 10), (100, 50, 1))
BATCH = 2_000
OUT = Path(__file__).parent / "results" / "tensor_pass.json"


def _setting(d: int, k: int, m: int, rng: np.random.Generator) -> tuple:
    """A subspace (rows B), directions of it (in x and in z coordinates) and one expansion per output."""
    basis = np.linalg.qr(rng.standard_normal((d, k)))[0].T.copy()
    g_k = rng.standard_normal((max(8, 2 * k), k))
    g_k /= np.linalg.norm(g_k, axis=1, keepdims=True)
    expansions = []
    for _ in range(m):
        theta, q = np.linalg.eigh(np.diag(rng.standard_normal(k)))
        expansions.append((float(rng.standard_normal()), 0.3 * rng.standard_normal(d), basis.T @ q, 0.4 * theta))
    return basis, g_k, expansions


def _accumulator(stat) -> dict:
    return {name: np.zeros(var.shape) for name, var in stat.sums_schema().items()}


def throughput(d: int, k: int, m: int, rounds: int) -> dict:
    """Samples/s of one batch's update, full family against projected, interleaved."""
    rng = np.random.default_rng(d * 1000 + k)
    basis, g_k, expansions = _setting(d, k, m, rng)
    full = [ContractedMoments(g_k @ basis, ORDERS, expansion=e) for e in expansions]
    proj = [ProjectedContracted(basis, g_k, ORDERS, e) for e in expansions]
    stats = {
        "contracted": full[0] if m == 1 else PerOutput(full),
        "projected_contracted": proj[0] if m == 1 else PerOutput(proj),
    }
    x = rng.standard_normal((BATCH, d))
    y = rng.standard_normal(BATCH) if m == 1 else rng.standard_normal((BATCH, m))
    times: dict[str, list[float]] = {name: [] for name in stats}
    with threadpool_limits(1):
        for stat in stats.values():  # warm-up
            stat.update(_accumulator(stat), x[:200], y[:200])
        for _ in range(rounds):
            for name, stat in stats.items():
                acc = _accumulator(stat)
                t0 = time.perf_counter()
                stat.update(acc, x, y)
                times[name].append(time.perf_counter() - t0)
    rate = {name: BATCH / float(np.median(t)) for name, t in times.items()}
    pairs = len(ORDERS) * len(g_k)
    return {
        "d": d,
        "k": k,
        "outputs": m,
        "directions": len(g_k),
        "orders": list(ORDERS),
        "batch_rows": BATCH,
        "rounds": rounds,
        "samples_per_second": rate,
        "seconds_per_batch": times,
        "model_flops_per_sample": {
            "contracted": m * pairs * d * (d + 1),
            "projected_contracted": 2 * m * pairs * k * k,
        },
        "ratio": rate["projected_contracted"] / rate["contracted"],
    }


def _teacher(path: Path) -> None:
    """A planted network with biases: d = 61, width 16, 10 outputs of mixed signs."""
    from relulearn.network import Network

    rng = np.random.default_rng(61)
    d, k, m = 61, 16, 10
    u = rng.standard_normal((k, d)) / np.sqrt(d)
    a = rng.choice([-1.0, 1.0], (m, k)) * rng.uniform(0.5, 1.5, (m, k))
    Network((u, a), (0.6 * rng.standard_normal(k), rng.standard_normal(m))).save(path)


def fit(tree: str, samples: int, folder: Path) -> dict:
    """``relulearn fit --method tensor`` in process with ``PYTHONPATH=tree``: the second pass's seconds, the
    whole command's, and the fit's error against the teacher."""
    teacher = folder / "teacher.npz"
    if not teacher.exists():
        _teacher(teacher)
    config = folder / "fit.yaml"
    config.write_text(
        json.dumps(
            {
                "seed": 3,
                "samples": samples,
                "chunk_size": 20_000,
                "source": {"d": 61, "teacher": {"file": str(teacher)}},
                "run": {"commit_interval": 1e9},
            }
        )
    )
    store, model = folder / f"s-{abs(hash(tree))}.zarr", folder / f"m-{abs(hash(tree))}.npz"
    # run from the scratch folder: ``python -m`` puts the working directory first on the path
    env, cwd = {**os.environ, "PYTHONPATH": tree}, str(folder)
    imported = subprocess.run(
        [sys.executable, "-c", "import relulearn; print(relulearn.__file__)"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
    ).stdout.strip()
    argv = [sys.executable, "-m", "relulearn", "fit", str(config), "--store", str(store), "--method", "tensor"]
    t0 = time.perf_counter()
    done = subprocess.run(
        [*argv, "--out", str(model), "--in-process", "--json", "-q"], env=env, cwd=cwd, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        return {"tree": tree, "imported": imported, "returncode": done.returncode, "stderr": done.stderr[-2000:]}
    out = json.loads(done.stdout)
    from relulearn.network import Network, compare

    return {
        "tree": tree,
        "imported": imported,
        "samples": samples,
        "wall_seconds": wall,
        "passes": [{k: p.get(k) for k in ("name", "seconds")} for p in out.get("passes", [])],
        "relative_error": compare(Network.load(teacher), Network.load(model)).relative_error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fit", nargs="*", default=[], metavar="TREE", help="source trees to fit with")
    parser.add_argument("--fit-samples", type=int, default=200_000)
    args = parser.parse_args()
    result: dict = {"when": utc_now(), "machine": {"cpu": cpu_model(), "cores": os.cpu_count()}}
    result["throughput"] = [throughput(d, k, m, args.rounds) for d, k, m in CASES]
    for case in result["throughput"]:
        rate = case["samples_per_second"]
        print(
            f"d={case['d']} k={case['k']} m={case['outputs']}: contracted {rate['contracted']:.0f}/s, "
            f"projected {rate['projected_contracted']:.0f}/s, ratio {case['ratio']:.1f}"
        )
    if args.fit:
        with tempfile.TemporaryDirectory() as tmp:
            result["fit"] = [fit(tree, args.fit_samples, Path(tmp)) for tree in args.fit]
        for run in result["fit"]:
            print(run)
    save_json(result, OUT)


if __name__ == "__main__":
    main()
