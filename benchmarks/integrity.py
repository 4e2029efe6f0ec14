"""What checksums cost: verifying a store, and the checks a resume makes, at d = 300 (a script, not a test).

One store with the four statistic families at d = 300 (Hermite to order 2, contracted orders 2 and 4 along 8
directions, 8 filter thresholds; 2 chunks of 1,000 samples: the statistics' size does not depend on the
samples). Timed, each the median of 5 runs in this process after one warm-up:

- ``verify``: ``relulearn.verify`` (every chunk's crc32c and sha256, every metadata document);
- ``read_checked``: ``RunStore.read_head`` of every statistic and the ledger, as a resume or learn reads
  them (the checks, then the values through zarr);
- ``read_plain``: the same arrays read through zarr alone, without any check (what a read cost before);
- ``encode_and_hash``: encoding every chunk with its crc32c and hashing it, the work a commit adds.

Usage: ``python benchmarks/integrity.py [--d 300] [--out benchmarks/results/integrity.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr.api.asynchronous as zasync
from zarr.core.sync import sync

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.storage import RunStore
from relulearn.storage.integrity import digest, encode_chunks

from _common import save_json, utc_now


def median_seconds(fn: Callable[[], Any], repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read_plain(url: str, head: str, names: list[str]) -> None:
    async def read() -> None:
        root = await zasync.open_group(RunStore(url)._store(read_only=True), mode="r", zarr_format=3)
        for name in names:
            grp = await root.getitem(f"{head}/{name}")
            arrays = [arr async for _, arr in grp.arrays()]
            await asyncio.gather(*(arr.getitem(Ellipsis) for arr in arrays))

    sync(read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "integrity.json")
    args = parser.parse_args()
    cfg = config_from_dict(
        {
            "seed": 1,
            "samples": 2_000,
            "chunk_size": 1_000,
            "source": {"d": args.d, "teacher": {"kind": "one_hidden_relu", "width": 4}},
            "statistics": {
                "basic": {},
                "hermite": {"max_order": 2},
                "contracted": {"orders": [2, 4], "directions": 8},
                "filtered": {"thresholds": [0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 1.6, 2.0]},
            },
            "run": {"chunks_per_block": 1, "commit_interval": 1e9},
        }
    )
    with tempfile.TemporaryDirectory(prefix="relulearn-integrity-") as tmp:
        url = str(Path(tmp) / "run.zarr")
        api.estimate(cfg, url, client="local", progress=None)
        store = RunStore(url)
        meta = store.meta()
        head, names = meta["head"], list(meta["statistics"]) + ["ledger"]
        files = [p for p in Path(url).rglob("*") if p.is_file()]
        _, groups = store.read_head(names)
        arrays = [np.asarray(v) for g in groups.values() for _, v in g.values()]

        def encode_and_hash() -> None:
            for values in arrays:
                shape = [max(s, 1) for s in values.shape]
                for _, data in encode_chunks(values, shape, 0):
                    digest(data)

        result = {
            "benchmark": "integrity",
            "date": utc_now(),
            "d": args.d,
            "statistics": meta["statistics"],
            "store_bytes": sum(p.stat().st_size for p in files),
            "store_files": len(files),
            "arrays": len(arrays),
            "chunks": sum(len(v) for v in meta["integrity"]["chunks"].values()),
            "seconds": {
                "verify": median_seconds(lambda: api.verify(url)),
                "read_checked": median_seconds(lambda: store.read_head(names)),
                "read_plain": median_seconds(lambda: read_plain(url, head, names)),
                "encode_and_hash": median_seconds(encode_and_hash),
            },
        }
    s = result["seconds"]
    result["check_overhead_seconds"] = s["read_checked"] - s["read_plain"]
    save_json(result, args.out)
    print(
        f"d = {args.d}: {result['store_bytes'] / 2**20:.1f} MiB in {result['arrays']} arrays; "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in s.items())
    )


if __name__ == "__main__":
    main()
