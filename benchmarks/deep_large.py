"""A deep teacher at large d: ``filtered-pca`` with and without the streamed deep refinement
(a script, not a test).

The teacher: ``deep_relu`` with widths (4, 8) (first layer 4 unit rows) in d = 2048. One store of
``--samples`` samples with the method's own statistics — dense ``basic`` and seven ``M_τ`` (537 MB per
block partial at d = 2048, under the 4 GiB default), or with ``--worker-memory 100000000`` the ``M_τ``
sketched at r = 32 (7.3 MB; 60× fewer flops per sample, subspace passes instead of residual passes) —
on one two-worker ``LocalCluster``:

1. ``api.fit(..., "filtered-pca", depth=2, width=8)``: filtered PCA, residual passes, candidates on
   the subspace, then the streamed refinement of the network and its basis on every sample
   (:mod:`relulearn.estimators.filtered_pca.deepstream`);
2. ``api.learn`` on the same store with ``refine_samples=0`` (the passes are reused): the answer
   without the refinement, i.e. the subspace as the spectral stage and the residual passes left it.

Both evaluated on 10⁵ fresh samples (``api.evaluate``: the largest principal angle between the
teacher's first-layer rows and the subspace the learned network depends on, and the relative
test error). Peak memory: the driver's ``ru_maxrss``, and the workers' largest RSS sampled by the
cluster. Writes ``benchmarks/results/deep_large.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from relulearn import api  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402

from _common import cpu_model, save_json, utc_now  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "deep_large.json"


def _worker_rss(client: Any) -> int:
    import psutil

    def rss() -> int:
        return int(psutil.Process().memory_info().rss)

    return max(client.run(rss).values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=2048, help="input dimension (default 2048)")
    p.add_argument("--samples", type=int, default=1_000_000, help="samples of the store (default 10^6)")
    p.add_argument("--seed", type=int, default=3, help="teacher and run seed (default 3)")
    p.add_argument(
        "--worker-memory",
        type=int,
        default=None,
        help="run.worker_memory in bytes (default 4 GiB: dense M_τ at d = 2048; 10^8 sketches them)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = p.parse_args(argv)
    cfg = {
        "seed": args.seed,
        "samples": args.samples,
        "chunk_size": 50_000,
        "source": {"d": args.d, "teacher": {"kind": "deep_relu", "widths": [4, 8], "seed": args.seed}},
        "run": {"commit_interval": 120},
    }
    if args.worker_memory is not None:
        cfg["run"]["worker_memory"] = args.worker_memory
    result: dict[str, Any] = {"started": utc_now(), "cpu": cpu_model(), "config": cfg}
    with tempfile.TemporaryDirectory() as tmp, connect(workers=2) as client:
        work = Path(tmp)
        (work / "c.json").write_text(json.dumps(cfg))
        store = str(work / "s.zarr")
        peak_workers = 0
        t0 = time.perf_counter()
        res = api.fit(
            config_from_dict(cfg),
            store,
            "filtered-pca",
            depth=2,
            width=8,
            out=str(work / "a.npz"),
            client=client,
            progress=sys.stderr,
        )
        peak_workers = max(peak_workers, _worker_rss(client))
        fit_seconds = time.perf_counter() - t0
        ev = api.evaluate(str(work / "a.npz"), work / "c.json", samples=100_000)
        rep = res["report"]
        refinement = {k: v for k, v in rep.get("refinement", {}).items() if k != "iterations"}
        refinement["iterations"] = rep.get("refinement", {}).get("iterations", [])
        result["statistics_plan"] = res.get("statistics_plan")
        result["refined"] = {
            "seconds": fit_seconds,
            "estimate_seconds": res["estimate"]["seconds"],
            "passes": [{"name": q["name"], "seconds": q["seconds"]} for q in res["passes"]],
            "steps": [{"pass": s["pass"], "added": s["added"]} for s in rep["steps"]],
            "architecture": rep.get("architecture"),
            "stop_reason": rep.get("stop_reason"),
            "refinement": refinement,
            "angle": ev["subspace_angle"],
            "relative_test_error": ev["relative_test_error"],
        }
        print(
            f"refined: angle {ev['subspace_angle']:.3g}, test error {ev['relative_test_error']:.3g}, "
            f"{fit_seconds:.0f} s",
            file=sys.stderr,
        )
        t1 = time.perf_counter()
        plain = api.learn(
            store,
            "filtered-pca",
            depth=2,
            width=8,
            refine_samples=0,
            out=str(work / "b.npz"),
            client=client,
            progress=None,
        )
        peak_workers = max(peak_workers, _worker_rss(client))
        ev0 = api.evaluate(str(work / "b.npz"), work / "c.json", samples=100_000)
        result["spectral_only"] = {
            "seconds": time.perf_counter() - t1,
            "angle": ev0["subspace_angle"],
            "relative_test_error": ev0["relative_test_error"],
            "architecture": plain["report"].get("architecture"),
        }
        print(
            f"without refinement: angle {ev0['subspace_angle']:.3g}, test error {ev0['relative_test_error']:.3g}",
            file=sys.stderr,
        )
        result["peak_rss_bytes"] = {
            "driver": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "worker_sampled_at_ends": peak_workers,
        }
    result["finished"] = utc_now()
    save_json(result, args.out)
    print(json.dumps({k: result[k] for k in ("refined", "spectral_only")}, default=str)[:2000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
