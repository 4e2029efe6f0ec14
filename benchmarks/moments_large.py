"""``moments`` end to end at large d (a script, not a test).

A planted noiseless one-hidden-layer teacher (``one_hidden_relu``, ``--width`` unit rows in
``--d`` dimensions). ``api.fit(..., "moments")`` on a two-worker ``LocalCluster``: the per-worker budget
(4 GiB) makes ``fit`` sketch ``M_2`` (r = 32) at this d; subspace passes on the same chunks, each on
labels less the degree-≤2 expansion found so far (a control variate: ``moments._control``); enumeration
on samples projected on the found subspace; the streamed refinement on ``--refine-samples`` samples
per pass from the lift (polish, a dense ``k d``-unknown solve, is skipped at this d).

``--raw-labels`` runs the same with the control variate off (every pass on raw labels, as before it
existed): the comparison the README gives.

Reported: wall time of every pass, the subspace angle to the teacher after the spectral stage and
at the end, the parameter error (``api.evaluate`` on 10⁴ fresh samples), and peak memory per
process (``ru_maxrss`` of the driver and of each worker). Writes ``benchmarks/results/moments_large.json``
(``--out``).
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from relulearn import api  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.estimators.moments import entry as moments  # noqa: E402
from relulearn.network import Network  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.sources import make_source  # noqa: E402

from _common import cpu_model, save_json, utc_now  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "moments_large.json"


def _peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _angle(teacher: Network, basis: list | None) -> float | None:
    if basis is None:
        return None
    b = np.asarray(basis, dtype=np.float64)
    k = teacher.weights[0].shape[0]
    q, _ = np.linalg.qr(teacher.weights[0].T)
    s = np.linalg.svd(q.T @ np.linalg.qr(b)[0][:, :k], compute_uv=False)
    return float(np.arccos(np.clip(s.min(), -1.0, 1.0)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=10_000, help="input dimension (default 10^4)")
    p.add_argument("--width", type=int, default=5, help="hidden units k of the teacher (default 5)")
    p.add_argument("--samples", type=int, default=1_000_000, help="samples of the store (default 10^6)")
    p.add_argument(
        "--refine-samples",
        type=int,
        default=200_000,
        help="samples per pass of the streamed refinement (default 2·10^5: 4 k d rows at d = 10^4)",
    )
    p.add_argument("--chunk-size", type=int, default=20_000, help="rows per chunk (default 20,000)")
    p.add_argument("--seed", type=int, default=3, help="teacher and run seed (default 3)")
    p.add_argument(
        "--worker-memory",
        type=int,
        default=None,
        help="run.worker_memory in bytes (default 4 GiB, which sketches M_2 from d ≈ 4,000; 10^8 sketches "
        "it at smaller d)",
    )
    p.add_argument("--raw-labels", action="store_true", help="subspace passes on raw labels (no control variate)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = p.parse_args(argv)
    if args.raw_labels:
        moments._control = lambda sketch, step=None: {}  # the comparison: passes as they were before the control
    cfg = {
        "seed": args.seed,
        "samples": args.samples,
        "chunk_size": args.chunk_size,
        "source": {"d": args.d, "teacher": {"kind": "one_hidden_relu", "width": args.width, "seed": args.seed}},
        "run": {"commit_interval": 120},
    }
    if args.worker_memory is not None:
        cfg["run"]["worker_memory"] = args.worker_memory
    result: dict[str, Any] = {
        "started": utc_now(),
        "cpu": cpu_model(),
        "config": cfg,
        "refine_samples": args.refine_samples,
        "control_variate": not args.raw_labels,
    }
    teacher = make_source(config_from_dict(cfg)).network
    with tempfile.TemporaryDirectory() as tmp, connect(workers=2) as client:
        work = Path(tmp)
        (work / "c.json").write_text(json.dumps(cfg))
        t0 = time.perf_counter()
        res = api.fit(
            config_from_dict(cfg),
            str(work / "s.zarr"),
            "moments",
            width=args.width,
            refine_samples=args.refine_samples,
            out=str(work / "a.npz"),
            client=client,
            progress=sys.stderr,
        )
        seconds = time.perf_counter() - t0
        workers = client.run(_peak_rss)
        learned = Network.load(work / "a.npz")
        ev = api.evaluate(learned, work / "c.json", samples=10_000)
    rep = res["report"]
    sub = rep.get("subspace", {})
    refinement = {k: v for k, v in rep.get("refinement", {}).items() if k != "iterations"}
    result.update(
        {
            "seconds": seconds,
            "estimate_seconds": res["estimate"]["seconds"],
            "statistics_plan": res.get("statistics_plan"),
            "passes": [{"name": q["name"], "seconds": q["seconds"]} for q in res["passes"]],
            "subspace": {k: sub.get(k) for k in ("kind", "rank", "passes", "converged", "last_change", "angle_bound")},
            "spectral_angle": _angle(teacher, sub.get("basis")),
            "refinement": refinement,
            "parameter_error": ev.get("parameter_error"),
            "relative_test_error": ev["relative_test_error"],
            "subspace_angle": ev["subspace_angle"],
            "peak_rss_bytes": {"driver": _peak_rss(), "workers": sorted(workers.values())},
            "finished": utc_now(),
        }
    )
    save_json(result, args.out)
    print(
        f"d = {args.d}, k = {args.width}, n = {args.samples}: {seconds:.0f} s; spectral angle "
        f"{result['spectral_angle']:.3g} rad; parameter error {result['parameter_error']:.3g}; peak RSS driver "
        f"{result['peak_rss_bytes']['driver'] / 2**30:.2f} GiB, workers "
        f"{max(workers.values()) / 2**30:.2f} GiB",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
