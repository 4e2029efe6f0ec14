"""What the data source's stamp checks cost: a pass over a ``.npy`` data source at d = 64 with them and without
(a script, not a test).

One data source of ``--rows`` rows at ``--d`` (a local ``.npy`` pair, in the page cache after the first round),
read as a run reads it (chunks of ``--chunk-size`` rows, whitened). Each round times, in this process and
alternating so that machine noise hits both alike:

- ``pass``: ``compute_block`` over every chunk (what a worker does of a run's blocks), for two statistic
  configurations: ``basic`` alone (the cheapest pass there is: the check weighs most there) and ``moments``
  (basic and contracted orders 2 and 4 along 8 directions, a typical pass);
- ``read``: the rows alone (``DataSource.row_batches``, no statistic): the check against the bare read;
  ``read_control`` the same with both sides unchecked (what the machine's noise alone gives).

Wall time and the thread's CPU time are both recorded: on a shared machine the CPU time is the steadier.

each with the readers as opened (every read checks the stamps of the files it touches, before and after) and
with their stamps dropped (the same code, unchecked). Reported: the medians of ``--rounds`` rounds, their ratio
``checked / unchecked − 1``, the median of the rounds' own ratios (``paired_overhead``), and the direct figure:
the stamp checks a pass makes times the median time of one check (timed apart), over the unchecked pass.

Usage: ``python benchmarks/data_read.py [--d 64] [--rows 400000] [--rounds 9]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from relulearn.config import config_from_dict
from relulearn.pipeline.blocks import compute_block
from relulearn.pipeline.families import build_statistics
from relulearn.pipeline.sources import batch_rows, make_source
from relulearn.pipeline.stamps import check_stamps

from _common import cpu_model, save_json, utc_now

STATISTICS = {
    "basic": {"basic": {}},
    "moments": {"basic": {}, "contracted": {"orders": [2, 4], "directions": 8}},
}


def unchecked(source: Any) -> Any:
    """The same data source with its readers' stamps dropped: reads without the check."""
    return dataclasses.replace(
        source, x=dataclasses.replace(source.x, stamps={}), y=dataclasses.replace(source.y, stamps={})
    )


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--chunk-size", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "data_read.json")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    folder = Path(tempfile.mkdtemp(prefix="relulearn-data-read-"))
    x = rng.standard_normal((args.rows, args.d))
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", np.maximum(x[:, :3].sum(axis=1), 0.0))
    chunks = args.rows // args.chunk_size
    result: dict[str, Any] = {
        "when": utc_now(),
        "machine": {"cpu": cpu_model()},
        "d": args.d,
        "rows": args.rows,
        "chunk_size": args.chunk_size,
        "rounds": args.rounds,
        "file": "local .npy (page cache)",
        "passes": {},
    }
    data = {"x": str(folder / "x.npy"), "y": str(folder / "y.npy")}
    for name, families in STATISTICS.items():
        cfg = config_from_dict(
            {
                "seed": 0,
                "samples": args.rows,
                "chunk_size": args.chunk_size,
                "source": {"d": args.d, "data": data},
                "statistics": families,
            }
        )
        checked = make_source(cfg)
        plain = unchecked(checked)
        stats = build_statistics(cfg, checked)

        def run_pass(source: Any, stats: Any = stats) -> None:
            compute_block(stats, source, 0, args.chunk_size, 0, chunks)

        result["passes"][name] = measure(run_pass, checked, plain, args.rounds)

    def read_all(source: Any) -> None:
        for _ in source.row_batches(0, source.rows, batch_rows(source.d)):
            pass

    result["passes"]["read"] = measure(read_all, checked, plain, args.rounds)
    # the noise floor: the unchecked source against itself, timed the same way
    result["passes"]["read_control"] = measure(read_all, unchecked(checked), plain, args.rounds)

    # the direct figure: how many checks a pass makes (two per read of x and of y) and what one costs
    reads = chunks * 2 * 2  # a chunk is one read of x and one of y (under READ_BYTES), each checked twice
    reader = checked.x
    one = statistics.median(
        timed(lambda: check_stamps(reader.url, reader.storage_options, reader.stamps, [""])) for _ in range(2001)
    )
    result["one_check_seconds"] = one
    result["checks_per_pass"] = reads
    for name, entry in result["passes"].items():
        entry["direct_overhead"] = 0.0 if name == "read_control" else reads * one / entry["unchecked_seconds"]
    save_json(result, args.out)
    shutil.rmtree(folder)
    for name, entry in result["passes"].items():
        print(
            f"{name:8s} checked {entry['checked_seconds']:.4f} s  unchecked {entry['unchecked_seconds']:.4f} s  "
            f"ratio {entry['overhead']:+.2%}  paired {entry['paired_overhead']:+.2%}  "
            f"CPU ratio {entry['cpu_overhead']:+.2%}  paired {entry['cpu_paired_overhead']:+.2%}  "
            f"direct {entry['direct_overhead']:.3%}"
        )
    print(f"one check {one * 1e6:.1f} µs, {reads} per pass; written to {args.out}")


def measure(fn: Callable[[Any], None], checked: Any, plain: Any, rounds: int) -> dict[str, float]:
    """Medians of ``rounds`` alternating rounds of ``fn`` on the checked and the unchecked source (one warm-up), in
    wall time and in this thread's CPU time (user and system: the reads' copies from the page cache count; other
    processes on a shared machine do not)."""
    fn(checked)
    fn(plain)
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            source = checked if on else plain
            w0, c0 = time.perf_counter(), time.thread_time()
            fn(source)
            cpu[on].append(time.thread_time() - c0)
            wall[on].append(time.perf_counter() - w0)
    out: dict[str, float] = {}
    for name, times in (("", wall), ("cpu_", cpu)):
        a, b = statistics.median(times[True]), statistics.median(times[False])
        out[f"{name}checked_seconds"], out[f"{name}unchecked_seconds"] = a, b
        out[f"{name}overhead"] = a / b - 1
        # each round's pair ran back to back: the median of their ratios
        out[f"{name}paired_overhead"] = statistics.median(p / q for p, q in zip(times[True], times[False])) - 1
    return out


if __name__ == "__main__":
    main()
