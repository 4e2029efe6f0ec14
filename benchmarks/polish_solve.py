"""The single-output polish's least-squares steps: the normal matrix summed once and updated on the samples whose
patterns moved, solved by Cholesky where well conditioned (what :func:`relulearn.estimators.polish.polish` does),
against the matrix summed again at every step and solved on its eigenvectors (what it did before).

For each case: a planted one-hidden-layer ReLU teacher with biases and one output (:func:`polish_scale.teacher`),
noiseless labels on ``n = max(20000, 40·k(d+1))`` Gaussian inputs, a start whose rows are turned by 0.05 rad
(:func:`polish_scale.start_from`). Both ways polish the same start on the same samples, interleaved, ``--rounds``
times; recorded: the median wall time, the Gauss–Newton steps, the final relative residual, the parameter error
against the teacher and the relative test error on 2·10⁴ fresh inputs.

Usage: ``python benchmarks/polish_solve.py [--rounds 3] [--large] [--out benchmarks/results/polish_solve.json]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from polish_scale import start_from, teacher

import relulearn.estimators.polish.products as products
from relulearn.estimators.polish.dense import polish
from relulearn.network import compare

from _common import save_json, utc_now

#: (d, k): the wine MLP's width 16 at d = 13, and wider ones
CASES = [(13, 16), (20, 8), (30, 16), (50, 5), (40, 30)]
#: ``--large``: 2,081 and 2,521 unknowns on 83,200 and 100,840 rows (10 more minutes)
LARGE = [(64, 32), (24, 96)]

#: name → (RESUM, CHOLESKY_RCOND) of :mod:`relulearn.estimators.polish.products`
WAYS = {
    "updated": (products.RESUM, products.CHOLESKY_RCOND),
    "summed each step": (-1.0, np.inf),
}


def case(d: int, k: int, rounds: int) -> dict:
    net = teacher(d, k, 1, seed=d * k)
    rng = np.random.default_rng(d + k)
    n = max(20_000, 40 * k * (d + 1))
    x = rng.standard_normal((n, d))
    y = net.forward(x)[:, 0]
    x_test = rng.standard_normal((20_000, d))
    truth = net.forward(x_test)[:, 0]
    start = start_from(net, 0.05, seed=1)
    out: dict = {"d": d, "k": k, "n": n, "unknowns": k * (d + 1) + 1}
    times: dict[str, list[float]] = {name: [] for name in WAYS}
    for _ in range(rounds):
        for name, (resum, rcond) in WAYS.items():
            products.RESUM, products.CHOLESKY_RCOND = resum, rcond
            try:
                t = time.perf_counter()
                got, rep = polish(start, x, y)
                times[name].append(time.perf_counter() - t)
            finally:
                products.RESUM, products.CHOLESKY_RCOND = WAYS["updated"]
            out[name] = {
                "steps": rep.iterations,
                "stop": rep.stop_reason,
                "relative_residual": rep.relative_residual,
                "parameter_error": compare(net, got).relative_error,
                "relative_test_error": float(np.linalg.norm(got.forward(x_test)[:, 0] - truth) / np.linalg.norm(truth)),
            }
    for name in WAYS:
        out[name]["seconds"] = statistics.median(times[name])
    out["speedup"] = out["summed each step"]["seconds"] / out["updated"]["seconds"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions per case (default 3)")
    parser.add_argument("--large", action="store_true", help="also d = 64, k = 32 and d = 24, k = 96 (10 more minutes)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "polish_solve.json"))
    args = parser.parse_args()
    rows = []
    print("| d | k | n | unknowns | summed each step s | updated s | × | residual (each step / updated) |")
    print("|---|---|---|---|---|---|---|---|")
    for d, k in CASES + (LARGE if args.large else []):
        r = case(d, k, args.rounds)
        rows.append(r)
        old, new = r["summed each step"], r["updated"]
        print(
            f"| {d} | {k} | {r['n']:,} | {r['unknowns']} | {old['seconds']:.2f} | {new['seconds']:.2f} | "
            f"{r['speedup']:.1f} | {old['relative_residual']:.1e} / {new['relative_residual']:.1e} |",
            flush=True,
        )
    save_json({"started": utc_now(), "rounds": args.rounds, "large": args.large, "cases": rows}, Path(args.out))


if __name__ == "__main__":
    main()
