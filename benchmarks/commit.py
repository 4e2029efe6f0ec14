"""What a commit costs on a local disk, with the store's layout and with the one it replaced (a script, not a test).

A commit writes a whole generation (every statistic's arrays, their chunks and metadata documents), switches the
root document to it and deletes the previous one. Two stores of every second-moment family are committed over and
over, interleaved, so that both layouts meet the same load of a shared machine:

- ``current``: chunks named ``c.0.1`` (one folder per array), a generation's files written in place in folders
  made once, the root document on one line;
- ``previous``: how relulearn wrote before: chunks named ``c/0/1`` (three folders per array), every object through
  zarr's LocalStore (folders made per object, a temporary file renamed), the root document indented.

Timed: CPU and wall time per commit, and per checked read of the whole generation (``RunStore.read_head``), as
medians of ``--rounds`` rounds of three. ``d = 20`` is the store of the fault-injection runs (a commit after every
block), ``d = 300`` one whose chunks are large.

Usage: ``python benchmarks/commit.py [--rounds 15] [--out benchmarks/results/commit.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import relulearn.storage.generation as generation
import relulearn.storage.integrity as integrity
import relulearn.storage.store as store_module
from relulearn import api
from relulearn.config import config_from_dict
from relulearn.storage import RunStore

from _common import save_json, utc_now


def config(d: int) -> dict[str, Any]:
    return {
        "seed": 1,
        "samples": 4_000,
        "chunk_size": 2_000,
        "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": 3}, "noise_std": 0.1},
        "statistics": {
            "basic": {},
            "contracted": {"orders": [2, 4], "directions": 4},
            "filtered": {"quantiles": [0.5, 0.9], "pilot_samples": 2_000},
        },
        "run": {"chunks_per_block": 1, "commit_interval": 1e9},
    }


@contextlib.contextmanager
def previous_layout() -> Iterator[None]:
    """The writer as it was: ``c/0/1`` chunk names, every object through zarr's LocalStore, an indented root."""
    saved = generation._array_doc, integrity.chunk_key, generation.LocalStore, store_module._json_buffer
    slash = {"name": "default", "configuration": {"separator": "/"}}
    array_doc, json_buffer = saved[0], saved[3]
    generation._array_doc = lambda *a, **k: dict(array_doc(*a, **k), chunk_key_encoding=slash)
    integrity.chunk_key = lambda coords: "/".join(["c", *map(str, coords)])
    generation.LocalStore = type("NoLocalStore", (), {})  # no isinstance match: every object through store.set
    store_module._json_buffer = lambda doc, indent=1: json_buffer(doc, 1)
    try:
        yield
    finally:
        generation._array_doc, integrity.chunk_key, generation.LocalStore, store_module._json_buffer = saved


def timed(fn: Any, repeat: int = 3) -> tuple[float, float]:
    c, t = time.process_time(), time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.process_time() - c) / repeat, (time.perf_counter() - t) / repeat


def measure(d: int, rounds: int, tmp: Path) -> dict[str, Any]:
    source = str(tmp / f"source-{d}.zarr")
    api.estimate(config_from_dict(config(d)), source, client="local", progress=None)
    meta, groups = RunStore(source).read_head(list(RunStore(source).meta()["statistics"]) + ["ledger"])
    meta = {k: v for k, v in meta.items() if k not in ("head", "commits", "integrity")}
    layouts = {"current": contextlib.nullcontext, "previous": previous_layout}
    stores = {}
    for name, layout in layouts.items():
        with layout():
            stores[name] = RunStore(str(tmp / f"{name}-{d}.zarr"))
            stores[name].commit(meta, groups)
    measures = ("commit_cpu", "commit_wall", "read_cpu")
    times: dict[str, dict[str, list[float]]] = {n: {m: [] for m in measures} for n in layouts}
    for _ in range(rounds):
        for name, layout in layouts.items():
            with layout():
                cpu, wall = timed(lambda s=stores[name]: s.commit(meta, groups))
                read, _ = timed(lambda s=stores[name]: s.read_head(list(groups)))
            times[name]["commit_cpu"].append(cpu)
            times[name]["commit_wall"].append(wall)
            times[name]["read_cpu"].append(read)
    head = Path(stores["current"].url) / stores["current"].meta()["head"]
    old = Path(stores["previous"].url) / stores["previous"].meta()["head"]
    out: dict[str, Any] = {
        "d": d,
        "arrays": sum(len(g) for g in groups.values()),
        "generation_bytes": sum(p.stat().st_size for p in head.rglob("*") if p.is_file()),
        "files": {"current": sum(1 for p in head.rglob("*")), "previous": sum(1 for p in old.rglob("*"))},
    }
    for name in layouts:
        out[name] = {k: statistics.median(v) for k, v in times[name].items()}
    out["commit_cpu_ratio"] = out["previous"]["commit_cpu"] / out["current"]["commit_cpu"]
    out["commit_wall_ratio"] = out["previous"]["commit_wall"] / out["current"]["commit_wall"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--d", type=int, nargs="+", default=[20, 300])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "commit.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relulearn-commit-") as tmp:
        results = [measure(d, args.rounds, Path(tmp)) for d in args.d]
    save_json({"benchmark": "commit", "date": utc_now(), "rounds": args.rounds, "stores": results}, args.out)
    for r in results:
        c, p = r["current"], r["previous"]
        print(
            f"d = {r['d']}: {r['arrays']} arrays, {r['generation_bytes'] / 2**20:.1f} MiB; files+folders "
            f"{r['files']['current']} (was {r['files']['previous']}); commit CPU {c['commit_cpu'] * 1e3:.0f} ms "
            f"(was {p['commit_cpu'] * 1e3:.0f}, x{r['commit_cpu_ratio']:.1f}), wall {c['commit_wall'] * 1e3:.0f} ms "
            f"(was {p['commit_wall'] * 1e3:.0f}); checked read CPU {c['read_cpu'] * 1e3:.0f} ms "
            f"(was {p['read_cpu'] * 1e3:.0f})"
        )


if __name__ == "__main__":
    main()
