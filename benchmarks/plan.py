"""Projected against measured time, pass by pass: the planner's projection (``relulearn plan``) next to what
``relulearn fit --method moments`` then takes, on a two-worker ``LocalCluster``.

Each run: a planted noiseless one-hidden-layer teacher (width 4) in ``d`` dimensions and a configuration without a
``statistics`` section (the documented way), so the planner chooses the form (dense or sketched) by projected
time. For every pass the projected and the measured wall time (the estimate's own clock: statistics set up, pilot
passes, blocks, merges and commits); for the run the form chosen, the end-to-end time and the parameter error
against the teacher.

The grid (``--grid``, default ``50:2000000,512:1000000,2048:1000000,512:4000000``) holds the small runs;
``--big`` adds d = 3000 with 8·10⁶ samples and d = 10⁴ with 2·10⁶ (about 20 and 40 minutes). ``--merge`` adds the
runs of other result files (each keeps the rates measured with it); ``--reproject`` projects the runs of
``--out`` again with today's cost model (no runs). Writes
``benchmarks/results/plan.json`` (``--out``) and a plot of measured against projected seconds per pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from relulearn import api  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.network import Network, compare  # noqa: E402
from relulearn.pipeline.calibration import calibrate  # noqa: E402
from relulearn.pipeline.cluster import connect  # noqa: E402
from relulearn.pipeline.cost import Rates  # noqa: E402
from relulearn.pipeline.sources import make_source  # noqa: E402
from relulearn.runplan import plan_run  # noqa: E402

from _common import cpu_model, save_json, utc_now  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "plan.json"
GRID = "50:2000000,512:1000000,2048:1000000,512:4000000"
BIG = "3000:8000000,10000:2000000"
WORKERS = 2


def config_of(d: int, samples: int) -> Any:
    return config_from_dict(
        {
            "seed": 7,
            "samples": samples,
            "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": 4, "seed": 3}},
        }
    )


def reproject(path: Path) -> dict[str, Any]:
    """The runs of a result file projected again by today's cost model, from the rates measured with them (the
    measured seconds are those of the runs; a projection is a pure function of the configuration and rates)."""
    result = json.loads(path.read_text())
    for run in result["runs"]:
        measured = {k: v for k, v in run.get("rates", result["rates"]).items() if k != "task"}  # task: a constant
        rates = Rates(**measured)
        plan = plan_run(config_of(run["d"], run["samples"]), "moments", workers=WORKERS, rates=rates)
        projected = {p.name: p.projected_seconds for p in plan.passes}
        for p in run["passes"]:
            p["projected"] = projected[p["name"]]
            p["ratio"] = p["measured"] / p["projected"]
        run.update(
            form=(plan.choice or {}).get("form"),
            projected_seconds=plan.projected_seconds,
            projected_seconds_max=plan.projected_seconds_max,
        )
    result["reprojected"] = utc_now()
    return result


def run_one(d: int, samples: int, client: Any, folder: Path) -> dict[str, Any]:
    cfg = config_of(d, samples)
    plan = api.plan(cfg, "moments", workers=WORKERS)
    store, out = folder / f"d{d}-n{samples}.zarr", folder / f"d{d}-n{samples}.npz"
    t0 = time.perf_counter()
    done = api.fit(cfg, str(store), "moments", out=str(out), client=client, progress=None)
    seconds = time.perf_counter() - t0
    measured = {"estimate": done["estimate"]["seconds"], **{p["name"]: p["seconds"] for p in done["passes"]}}
    passes = []
    for p in plan["passes"]:
        if p["name"] in measured:
            passes.append(
                {
                    "name": p["name"],
                    "projected": p["projected_seconds"],
                    "measured": measured[p["name"]],
                    "ratio": measured[p["name"]] / p["projected_seconds"],
                    "optional": p["optional"],
                }
            )
    teacher: Network = make_source(cfg).network
    learned = Network.load(out)
    try:
        error: float | None = float(compare(teacher, learned).relative_error)
    except ValueError:
        error = None
    return {
        "d": d,
        "samples": samples,
        "form": (plan["choice"] or {}).get("form"),
        "choice": plan["choice"],
        "projected_seconds": plan["projected_seconds"],
        "projected_seconds_max": plan["projected_seconds_max"],
        "passes": passes,
        "seconds": seconds,
        "passes_seconds": sum(measured.values()),
        "learn_seconds": seconds - sum(measured.values()),
        "parameter_error": error,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    lo, hi = 1e9, 0.0
    for run in result["runs"]:
        xs = [p["projected"] for p in run["passes"]]
        ys = [p["measured"] for p in run["passes"]]
        ax.scatter(xs, ys, label=f"d = {run['d']}, n = {run['samples']:.0e} ({run['form']})", s=28, zorder=3)
        lo, hi = min([lo] + xs + ys), max([hi] + xs + ys)
    grid = [lo / 1.5, hi * 1.5]
    ax.plot(grid, grid, "k-", lw=0.8)
    ax.fill_between(grid, [g * 0.7 for g in grid], [g * 1.3 for g in grid], color="0.9", label="±30 %")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="projected seconds per pass",
        ylabel="measured seconds per pass",
        title="relulearn plan: projected vs measured, per pass",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pairs(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (item.split(":") for item in text.split(",") if item)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--grid", default=GRID, help="d:samples pairs, comma-separated")
    ap.add_argument("--big", action="store_true", help=f"add {BIG}")
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="*",
        default=[],
        help="result files whose runs are added to this one's (each run keeps the rates it was run with)",
    )
    ap.add_argument(
        "--reproject",
        action="store_true",
        help="no runs: project the runs of --out again with today's cost model, and plot",
    )
    args = ap.parse_args(argv)
    if args.reproject:
        result = reproject(args.out)
        save_json(result, args.out)
        plot(result, args.out.with_suffix(".png"))
        return 0
    runs = _pairs(args.grid) + (_pairs(BIG) if args.big else [])
    rates = calibrate(refresh=True)  # measured now, on the machine of this run
    result: dict[str, Any] = {
        "started": utc_now(),
        "machine": {"cpu": cpu_model(), "workers": WORKERS},
        "rates": rates.to_dict(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="relulearn-bench-plan-") as tmp, connect(workers=WORKERS) as client:
        for d, n in runs:
            rec = run_one(d, n, client, Path(tmp))
            result["runs"].append(rec)
            print(
                {k: rec[k] for k in ("d", "samples", "form", "projected_seconds", "seconds", "parameter_error")},
                [(p["name"], round(p["projected"], 1), round(p["measured"], 1)) for p in rec["passes"]],
                flush=True,
            )
            save_json(result, args.out)
    for other in args.merge:  # e.g. the long runs, measured on their own
        more = json.loads(other.read_text())
        result["runs"] += [dict(run, rates=run.get("rates", more["rates"])) for run in more["runs"]]
    result["finished"] = utc_now()
    save_json(result, args.out)
    plot(result, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
