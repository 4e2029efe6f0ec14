"""Stores compared bit for bit, the configurations the resume tests write, and the checks many test folders share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from relulearn import open_store


def residual_section(d: int) -> dict:
    """A residual pass over a 2-dim basis with one depth-1 candidate (fixed numbers)."""
    from relulearn.pipeline.sources import generator

    rng = generator(99, 0)
    basis = np.linalg.qr(rng.standard_normal((d, 2)))[0].T
    return {
        "basis": basis.tolist(),
        "candidates": [{"weights": [rng.standard_normal((3, 2)).tolist(), rng.standard_normal((1, 3)).tolist()]}],
        "quantiles": [0.3, 0.8],
        "pilot_samples": 20_000,
    }


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def store_arrays(url: str) -> dict[str, np.ndarray]:
    run = open_store(url)
    out = {}
    for stat in run.statistics:
        for k, v in run.arrays(stat).items():
            out[f"{stat}/{k}"] = v
    return out


def assert_bitwise_equal(a_url: str, b_url: str) -> None:
    a, b = store_arrays(a_url), store_arrays(b_url)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k], equal_nan=True), f"{k} differs"
    ma, mb = open_store(a_url).meta, open_store(b_url).meta
    assert (ma["samples"], ma["chunks"], ma["fingerprint"]) == (mb["samples"], mb["chunks"], mb["fingerprint"])


def assert_each_chunk_once(url: str, n_chunks: int) -> None:
    ledger = open_store(url).ledger()
    starts, stops = ledger[:, 1], ledger[:, 2]
    order = np.argsort(starts)
    starts, stops = starts[order], stops[order]
    assert starts[0] == 0 and stops[-1] == n_chunks
    assert np.array_equal(starts[1:], stops[:-1]), "ledger ranges overlap or leave a gap"
