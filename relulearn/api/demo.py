"""``relulearn demo``: plant a small network, estimate, learn it back and compare."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import numpy as np

from ..network import Comparison, Network
from .fitting import fit

if TYPE_CHECKING:
    from ..pipeline.sources import TeacherSource


def demo(
    *,
    d: int = 20,
    width: int = 3,
    samples: int = 1_000_000,
    seed: int = 0,
    store: str | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: TextIO | None = sys.stderr,
    dashboard: str | None = None,
) -> dict[str, Any]:
    """Plant a one-hidden-layer ReLU network, estimate, learn, polish, evaluate.

    Returns the teacher's and the learned network's units side by side (matched up to
    permutation and positive rescaling), the errors, and the time of each step.
    """
    import tempfile

    from ..config import config_from_dict
    from ..network import compare
    from ..pipeline.sources import make_source

    cfg = config_from_dict(
        {
            "seed": seed,
            "samples": samples,
            "chunk_size": 50_000,
            "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": width, "seed": seed}},
            "run": {"commit_interval": 30},
        }
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="relulearn-demo-") as tmp:
        url = store or str(Path(tmp) / "demo.zarr")
        model = str(Path(tmp) / "model.npz")
        fitted = fit(
            cfg,
            url,
            "moments",
            out=model,
            workers=workers,
            scheduler=scheduler,
            client=client,
            progress=progress,
            dashboard=dashboard,
        )
        learned = Network.load(model)
    teacher = cast("TeacherSource", make_source(cfg)).network
    cmp = compare(teacher, learned)
    from ..pipeline.sources import Stream, draw

    x, y = draw(make_source(cfg), seed, Stream.TEST, 200_000)
    rel = float(np.mean((y - learned.forward(x)[:, 0]) ** 2) / np.mean(y**2))
    units = _unit_rows(teacher, learned, cmp)
    return {
        "d": d,
        "width": width,
        "samples": fitted["samples"],
        "parameter_error": cmp.relative_error,
        "relative_test_error": rel,
        "units": units,
        "seconds": time.perf_counter() - t0,
        "estimate_seconds": fitted["estimate"]["seconds"],
        "learn_seconds": fitted["seconds"],
        "passes": fitted["passes"],
        "merged_units": fitted["report"].get("merged_units", []),
    }


def _unit_rows(teacher: Network, learned: Network, cmp: Comparison) -> list[dict[str, Any]]:
    """Each teacher unit beside the learned unit matched to it (``cmp.matching``; -1: none): both output weights
    in the scale-free form ``λ ‖u‖``, the angle between their directions and the unit's relative error."""
    units = []
    u_t, lam_t = teacher.weights[0], teacher.weights[1][0]
    u_l, lam_l = learned.weights[0], learned.weights[1][0]
    for i, j in enumerate(cmp.matching):
        row = {
            "unit": i,
            "teacher_lambda": float(lam_t[i]),
            "learned_lambda": None,
            "angle": None,
            "relative_error": cmp.unit_errors[i],
        }
        if j >= 0:
            scale = float(np.linalg.norm(u_l[j]))
            row["learned_lambda"] = float(lam_l[j] * scale)
            a, b = u_l[j] / scale, u_t[i] / np.linalg.norm(u_t[i])
            # atan2 of sine and cosine stays accurate for tiny angles (arccos does not)
            row["angle"] = float(np.arctan2(np.linalg.norm(a - (a @ b) * b), a @ b))
        units.append(row)
    return units
