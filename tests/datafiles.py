"""Users' data files a run reads, shared by the data-source, stamp and S3 tests: a planted teacher's correlated
samples written as .npy, zarr or Parquet, and a run of many small committed blocks over a small .npy pair."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from relulearn.network import Network

D, K, ROWS = 10, 3, 400_000


def planted_data(seed: int = 1, rows: int = ROWS, d: int = D):
    """A biased one-hidden-layer teacher and correlated inputs (covariance of condition number 10, a nonzero
    mean): ``teacher, mean, L`` with ``x = mean + L g``, and the samples ``x, y`` (noiseless)."""
    rng = np.random.default_rng(seed)
    teacher = Network(
        (rng.standard_normal((K, d)) / np.sqrt(d), np.array([[1.2, -0.8, 1.0]])),
        (0.5 * rng.standard_normal(K), np.array([0.3])),
    )
    q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    chol = np.linalg.cholesky(q @ np.diag(np.geomspace(1.0, 10.0, d)) @ q.T)
    mean = rng.standard_normal(d)
    x = mean + rng.standard_normal((rows, d)) @ chol.T
    return teacher, mean, chol, x, teacher.forward(x)[:, 0]


def write(fmt: str, folder, x: np.ndarray, y: np.ndarray) -> dict:
    """The samples in format ``fmt``; returns the ``source.data`` section that reads them."""
    if fmt == "npy":
        np.save(folder / "x.npy", x)
        np.save(folder / "y.npy", y)
        return {"x": str(folder / "x.npy"), "y": str(folder / "y.npy")}
    if fmt == "zarr":
        import zarr

        zarr.create_array(str(folder / "x.zarr"), data=x, chunks=(30_000, x.shape[1]))
        zarr.create_array(str(folder / "y.zarr"), data=y, chunks=(30_000,))
        return {"x": str(folder / "x.zarr"), "y": str(folder / "y.zarr")}
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [f"f{j}" for j in range(x.shape[1])]
    table = pa.table({**{n: x[:, j] for j, n in enumerate(names)}, "target": y})
    pq.write_table(table, folder / "d.parquet", row_group_size=65_536)  # row groups across chunk boundaries
    return {"x": str(folder / "d.parquet"), "y": str(folder / "d.parquet"), "x_columns": names, "y_column": "target"}


#: many small blocks, each committed: a file replaced after the first commit is met by a later block
RUN = {
    "seed": 0,
    "samples": 24_000,
    "chunk_size": 400,
    "statistics": {"basic": {}},
    "run": {"chunks_per_block": 1, "commit_interval": 0},
}


def samples(seed: int, rows: int = 24_000, d: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, d))
    return x, np.maximum(x @ rng.standard_normal(d), 0.0)


def after_first_commit(store: Path, action) -> threading.Thread:
    """Run ``action`` in a thread once the store's first commit is there (its root document)."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not (store / "zarr.json").exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread
