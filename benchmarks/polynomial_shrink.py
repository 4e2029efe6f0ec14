"""When shrinking by the standard errors beats plain projection (a script, not a test).

The ``polynomial`` method's ``--shrink`` options on one teacher at two sample counts: a
one-hidden-layer ReLU network (d = 20, 8 units) expanded to degree 6, where the degree-6 tensor
has 177,100 packed entries and its estimation noise rivals its signal. For each sample count
and each of ``none``, ``order`` (James–Stein factor per order) and ``entry`` (Wiener factor per
coefficient): the relative test error of the expansion cut at every degree 0..6 on fresh test
samples, the shrink factors, the predicted variance, and the degree the method picks on
held-out samples. Same store and residual pass for the three options (only the final step
differs).

Run ``python benchmarks/polynomial_shrink.py`` (about 10 minutes on 2 cores) or ``--quick``;
results go to ``benchmarks/results/polynomial_shrink.json``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import save_json, utc_now

OPTIONS = ("none", "order", "entry")


def run(samples: list[int], degree: int, d: int, width: int, test_samples: int) -> dict:
    from relulearn import api
    from relulearn.config import config_from_dict
    from relulearn.pipeline.sources import Stream, draw, make_source
    from relulearn.polynomial import load_model

    out: dict = {
        "benchmark": "polynomial_shrink",
        "started": utc_now(),
        "settings": {"d": d, "width": width, "degree": degree, "samples": samples, "test_samples": test_samples},
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="polyshrink-") as tmp:
        for n in samples:
            cfg = config_from_dict(
                {
                    "seed": 5,
                    "samples": n,
                    "chunk_size": 50_000,
                    "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": width, "seed": 2}},
                }
            )
            store = str(Path(tmp) / f"s{n}")
            x, y = draw(make_source(cfg), cfg.seed, Stream.TEST, test_samples)
            ey2 = float(np.mean(y**2))
            for how in OPTIONS:
                t0 = time.perf_counter()
                model_path = str(Path(tmp) / f"{how}{n}.npz")
                res = api.fit(
                    cfg, store, "polynomial", degree=degree, shrink=how, out=model_path, client="local", progress=None
                )
                chosen = api.learn(store, "polynomial", shrink=how, out=None, client="local", progress=None)
                sq = (y[:, None] - np.cumsum(load_model(model_path).terms(x), axis=1)) ** 2
                rec = {
                    "samples": n,
                    "shrink": how,
                    "test_error": (sq.mean(axis=0) / ey2).tolist(),
                    "test_error_se": (sq.std(axis=0) / np.sqrt(len(y)) / ey2).tolist(),
                    "shrink_factors": res["report"]["shrink_factors"],
                    "predicted_variance": res["report"]["predicted_variance"],
                    "held_out_degree": chosen["degree"],
                    "seconds": time.perf_counter() - t0,
                }
                out["runs"].append(rec)
                print(
                    f"n={n:>9,} {how:>5}: test error by degree "
                    + " ".join(f"{e:.4f}" for e in rec["test_error"])
                    + f"; picks degree {rec['held_out_degree']}",
                    flush=True,
                )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sample counts (a smoke run)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "polynomial_shrink.json")
    args = p.parse_args()
    samples = [100_000] if args.quick else [200_000, 1_000_000]
    result = run(samples, degree=6, d=20, width=8, test_samples=20_000 if args.quick else 100_000)
    result["quick"] = args.quick
    save_json(result, args.out)


if __name__ == "__main__":
    main()
