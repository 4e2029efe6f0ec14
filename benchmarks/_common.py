"""What the benchmark scripts share: timestamps and writing results as JSON."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def utc_now() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def json_default(obj: Any) -> Any:
    """JSON for numpy scalars and arrays."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def save_json(result: dict[str, Any], path: Path) -> None:
    """Write a benchmark's result (creating its folder), with the load average at this moment."""
    result.setdefault("machine", {})["load_average_at_end"] = list(os.getloadavg())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=json_default) + "\n")


def run_samples(source: Any, seed: int, n: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` samples a run of ``source`` with ``seed`` and chunk size ``chunk`` estimated on
    (its own chunk stream, in order): what a baseline fits on to see the same samples."""
    from relulearn.pipeline.sources import chunk_batches

    xs, ys = [], []
    for c in range(-(-n // chunk)):
        for x, y in chunk_batches(source, seed, c, chunk):
            xs.append(x)
            ys.append(y)
    return np.concatenate(xs)[:n], np.concatenate(ys)[:n]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        return ""
