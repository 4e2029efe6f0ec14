"""Polish at scale: the matrix-free Gauss–Newton polish (conjugate gradients on the structured design) of a
one-hidden-layer ReLU network with biases and m outputs, from a start whose every hidden row is turned off the
teacher's, against the dense normal-matrix polish where that one fits.

For each case: a planted teacher (unit rows times a scale in [0.5, 2], offsets β ~ N(0, 0.8²), Gaussian output
weights and biases), noiseless labels on n Gaussian inputs, a start with every row ``[u, b]`` turned by
``angle`` rad, output weights up to 10 % off, output biases 0.1 off. Records the wall time, Gauss–Newton steps,
conjugate-gradient iterations per step, the parameter error against the teacher (up to permutation and
positive rescaling) and the relative test error on 2·10⁴ fresh inputs; for the cases marked ``dense`` the dense
polish on the same samples in the same process, for the time ratio. The samples are those the tensor method
polishes on: n Gaussian queries of the teacher, and the queries :func:`relulearn.estimators.tensor.coverage.cover` adds
so that each unit has 4(d+1) on its rarer side (recorded: the queries drawn and rows added).

Writes ``benchmarks/results/polish_scale.json`` and prints the README table. ``--quick``: the smallest case only;
``--large``: also d = 784, k = 128, m = 10.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from relulearn.api.execution import HeldOut
from relulearn.estimators.polish.cg import polish_outputs_cg
from relulearn.estimators.polish.dense import polish_outputs
from relulearn.estimators.tensor.coverage import cover
from relulearn.network import Network, compare
from relulearn.pipeline.sources import TeacherSource

#: (d, k, m, n, angle, dense too)
CASES = [(60, 40, 10, 8_000, 0.1, True), (300, 64, 10, 20_000, 0.1, False)]
#: the size of a width-128 network on 28×28 images with 10 outputs, n as :func:`relulearn.estimators.
#: tensor_plan.sample_sizes` draws (``--large``)
LARGE = [(784, 128, 10, 80_000, 0.1, False)]
QUICK = CASES[:1]


def teacher(d: int, k: int, m: int, seed: int) -> Network:
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((k, d))
    u *= rng.uniform(0.5, 2.0, (k, 1)) / np.linalg.norm(u, axis=1, keepdims=True)
    b = 0.8 * rng.standard_normal(k) * np.linalg.norm(u, axis=1)
    return Network((u, rng.standard_normal((m, k))), (b, rng.standard_normal(m)), activation="relu")


def start_from(net: Network, angle: float, seed: int) -> Network:
    rng = np.random.default_rng(seed)
    rows = np.column_stack([net.weights[0], net.biases[0]])
    e = rng.standard_normal(rows.shape)
    e -= np.sum(e * rows, axis=1, keepdims=True) * rows / np.sum(rows**2, axis=1, keepdims=True)
    e *= np.linalg.norm(rows, axis=1, keepdims=True) / np.linalg.norm(e, axis=1, keepdims=True)
    turned = np.cos(angle) * rows + np.sin(angle) * e
    a = net.weights[1] * (1 + 0.1 * rng.uniform(-1, 1, net.weights[1].shape))
    return Network((turned[:, :-1], a), (turned[:, -1], net.biases[1] + 0.1), activation="relu")


def run(polisher, start: Network, net: Network, x: np.ndarray, y: np.ndarray, x_test: np.ndarray) -> dict:
    t = time.perf_counter()
    out, rep = polisher(start, x, y)
    seconds = time.perf_counter() - t
    truth = net.forward(x_test)
    return {
        "seconds": seconds,
        "steps": rep.iterations,
        "converged": rep.converged,
        "cg_iterations": list(rep.cg_iterations),
        "relative_residual": rep.relative_residual,
        "parameter_error": compare(net, out).relative_error,
        "relative_test_error": float(np.linalg.norm(out.forward(x_test) - truth) / np.linalg.norm(truth)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "polish_scale.json"))
    parser.add_argument("--quick", action="store_true", help="the smallest case only")
    parser.add_argument("--large", action="store_true", help="also d = 784, k = 128, m = 10 (10⁵ unknowns)")
    args = parser.parse_args()
    rows = []
    for d, k, m, n, angle, dense in QUICK if args.quick else CASES + (LARGE if args.large else []):
        net = teacher(d, k, m, seed=d + k)
        draw = HeldOut(TeacherSource(net), 1)
        x, y = draw.part(0, n)
        x_test = draw.part(1, 20_000)[0]
        start = start_from(net, angle, seed=2)
        # the rows the tensor method adds for rarely active units (found from the start, as it does)
        hidden = np.column_stack([start.weights[0], start.biases[0]])
        hidden /= np.linalg.norm(hidden[:, :-1], axis=1, keepdims=True)
        x_add, y_add, cov = cover(draw, x, hidden[:, :-1], hidden[:, -1])
        x, y = np.vstack([x, x_add]), np.vstack([y, y_add.reshape(len(x_add), -1)])
        row = {
            "d": d,
            "k": k,
            "m": m,
            "n": n,
            "angle": angle,
            "unknowns": k * (d + 1) + m * (k + 1),
            "coverage": cov.to_dict(),
            "start_parameter_error": compare(net, start).relative_error,
            "matrix_free": run(polish_outputs_cg, start, net, x, y, x_test),
        }
        if dense:
            row["dense"] = run(lambda s, x_, y_: polish_outputs(s, x_, y_, max_iter=30), start, net, x, y, x_test)
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"cases": rows}, indent=1))
    print(
        "| d | k | m | unknowns | n | rows added (queries) | start | steps | CG iterations | s | param. error | "
        "test error | dense s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        f = r["matrix_free"]
        dense = f"{r['dense']['seconds']:.0f}" if "dense" in r else "–"
        cov = r["coverage"]
        print(
            f"| {r['d']} | {r['k']} | {r['m']} | {r['unknowns']:,} | {r['n']:,} | {cov['rows_added']:,} "
            f"({cov['queries']:,}) | {r['angle']} rad | {f['steps']} | "
            f"{sum(f['cg_iterations'])} ({', '.join(map(str, f['cg_iterations']))}) | {f['seconds']:.0f} | "
            f"{f['parameter_error']:.1e} | {f['relative_test_error']:.1e} | {dense} |"
        )


if __name__ == "__main__":
    main()
