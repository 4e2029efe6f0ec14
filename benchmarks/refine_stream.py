"""The streamed refinement (``relulearn.estimators.polish.streamed``) from a start 0.2 rad off, noiseless
(a script, not a test).

For each d, a planted one-hidden-layer ReLU teacher (k unit rows, output weights of both signs, the
``one_hidden_relu`` source) and a start whose every row is turned 0.2 rad away from the teacher's (and
whose output weights are 10 % too large). The refinement streams ``n`` samples of the run's held-out
stream per pass on a 2-worker LocalCluster (the map ``relulearn fit`` uses). Recorded: passes, the stop
rule that ended it, the relative loss after every pass, the final parameter error (up to the network's
symmetries), wall time and the peak resident memory of the driver and of each worker.

Run ``python benchmarks/refine_stream.py`` (about 15 minutes on 2 cores); writes
``benchmarks/results/refine_stream.json``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from relulearn.api.execution import HeldOut, mapper  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.estimators.polish.streamed import refine_streamed  # noqa: E402
from relulearn.network import Network, compare  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.sources import make_source  # noqa: E402

from _common import save_json, utc_now  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "refine_stream.json"
ANGLE = 0.2


def start_network(teacher: Network, angle: float, seed: int) -> Network:
    """Every row of the teacher turned by ``angle`` in a random direction; output weights × 1.1."""
    u, lam = teacher.weights
    e = np.random.default_rng(seed).standard_normal(u.shape)
    e -= np.sum(e * u, axis=1, keepdims=True) * u
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    return Network((np.cos(angle) * u + np.sin(angle) * e, 1.1 * lam), activation="relu")


def peak_rss_mib(client: Any) -> dict[str, float]:
    """Peak resident memory (MiB) of this process and of every worker."""

    def peak() -> float:
        import resource as r

        return r.getrusage(r.RUSAGE_SELF).ru_maxrss / 1024

    workers = client.run(peak)
    return {"driver": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "workers": sorted(workers.values())}


def one(d: int, k: int, n: int, client: Any) -> dict[str, Any]:
    cfg = config_from_dict(
        {
            "seed": 3,
            "samples": n,
            "chunk_size": 50_000,
            "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": k, "seed": 17}},
        }
    )
    source = make_source(cfg)
    teacher = source.network
    start = start_network(teacher, ANGLE, seed=d)
    t0 = time.perf_counter()
    net, rep = refine_streamed(start, HeldOut(source, cfg.seed), n, mapper=mapper(client))
    seconds = time.perf_counter() - t0
    return {
        "d": d,
        "k": k,
        "samples_per_pass": n,
        "start_angle": ANGLE,
        "start_parameter_error": compare(teacher, start).relative_error,
        "parameter_error": compare(teacher, net).relative_error,
        "passes": rep["passes"],
        "stop": rep["stop"],
        "relative_loss": rep["relative_loss"],
        "per_pass_relative_loss": [h["relative_loss"] for h in rep["iterations"]],
        "seconds": seconds,
        "seconds_per_pass": seconds / rep["passes"],
        "peak_rss_mib": peak_rss_mib(client),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true", help="d = 50 only")
    args = p.parse_args(argv)
    plan = [(50, 3, 1_000_000)] if args.quick else [(50, 3, 1_000_000), (2000, 4, 500_000)]
    result: dict[str, Any] = {"benchmark": "refine_stream", "started": utc_now(), "runs": []}
    with connect(workers=2) as client:
        for d, k, n in plan:
            r = one(d, k, n, client)
            result["runs"].append(r)
            print(
                f"d={d} k={k} n={n:.0e}: {r['passes']} passes ({r['stop']}), parameter error "
                f"{r['start_parameter_error']:.2e} -> {r['parameter_error']:.2e}, {r['seconds']:.0f} s "
                f"({r['seconds_per_pass']:.1f} s/pass), peak RSS {r['peak_rss_mib']}",
                flush=True,
            )
    save_json(result, args.out)
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
