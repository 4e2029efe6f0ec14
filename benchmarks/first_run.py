"""A new user's first commands, timed as they run them (a script, not a test).

Each command is a fresh process, as typed at a terminal, timed by its wall clock; where the plan chooses this
process, the same command with ``--workers 2`` (a local cluster) is timed beside it, interleaved round by round
so that both meet the same load of a shared machine:

- ``learn``: ``relulearn learn`` on the finished store of ``examples/small.yaml`` (10⁶ samples, d = 20);
- ``demo``: ``relulearn demo``;
- ``readme``: the README's Python example saved as a file and run with ``python FILE`` (a fresh store each time;
  no ``--workers`` variant: the example has none).

Written: the medians of ``--rounds`` rounds and every round's times, with the network each variant learned
compared bitwise (the learn's two models).

Usage: ``python benchmarks/first_run.py [--rounds 5] [--out benchmarks/results/first_run.json]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import cpu_model, save_json, utc_now

ROOT = Path(__file__).resolve().parents[1]


def timed(args: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every command (default 5)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "first_run.json")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "relulearn.cli"]
    code = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)[0]
    times: dict[str, list[float]] = {
        k: [] for k in ("learn", "learn --workers 2", "demo", "demo --workers 2", "readme python FILE")
    }
    with tempfile.TemporaryDirectory(prefix="relulearn-first-run-") as tmp:
        work = Path(tmp)
        shutil.copytree(ROOT / "examples", work / "examples")
        readme = work / "readme"  # the example writes small.zarr and small.npz where it runs
        shutil.copytree(ROOT / "examples", readme / "examples")
        (readme / "snippet.py").write_text(code)
        timed([*cli, "estimate", "examples/small.yaml", "--store", "small.zarr"], work)
        for _ in range(args.rounds):
            times["learn"].append(timed([*cli, "learn", "small.zarr", "--out", "a.npz"], work))
            times["learn --workers 2"].append(
                timed([*cli, "learn", "small.zarr", "--out", "b.npz", "--workers", "2"], work)
            )
            times["demo"].append(timed([*cli, "demo"], work))
            times["demo --workers 2"].append(timed([*cli, "demo", "--workers", "2"], work))
            shutil.rmtree(readme / "small.zarr", ignore_errors=True)
            times["readme python FILE"].append(timed([sys.executable, "snippet.py"], readme))
        a, b = (np.load(work / f) for f in ("a.npz", "b.npz"))
        same = sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
    result: dict[str, Any] = {
        "benchmark": "first_run",
        "when": utc_now(),
        "machine": {"cpu": cpu_model()},
        "rounds": args.rounds,
        "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "seconds": times,
        "learn_models_bitwise_equal": same,
    }
    save_json(result, args.out)
    for k, v in result["median_seconds"].items():
        print(f"{k:<22}{v:8.2f} s")
    print(f"learn's models bitwise equal in process and on 2 workers: {same}")


if __name__ == "__main__":
    main()
