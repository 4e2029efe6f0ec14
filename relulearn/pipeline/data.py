"""Data sources: a user's samples ``(x, y)`` in files instead of a teacher (docs/design.md §5).

``source: {d: D, data: {x: PATH_OR_URL, y: PATH_OR_URL}}`` reads rows of ``.npy`` files, zarr arrays or Parquet
columns (:mod:`.arrays`), local or at fsspec URLs. Rows are laid out as a run needs them:

- chunk ``i`` is rows ``[i·chunk_size, (i+1)·chunk_size)`` of the usable rows, read by the worker that computes
  it (so ``samples`` is bounded by the rows the data holds);
- the pilot pass reads the first rows; held-out part 0 (a method's training sample) the first rows, part 1
  (validation) and test samples the last rows; parts 2, 3, … (the streamed refinement) consecutive windows
  from row 0, so a refinement over the store's sample count reads every row of the statistics. A draw larger
  than the data gets all its rows (training and validation samples then overlap).

A scan of the data before the source is made (one read in blocks, by the workers of a run's cluster —
:func:`scan_on` — or in process; O(d²) memory; the same bits either way) finds the rows with NaN or inf
(refused by row number, or skipped and counted with ``nan_rows: skip``) and the mean and covariance of ``x``;
with ``whiten: true`` (the default) every batch is whitened on the fly, ``z = A (x − μ)`` with ``A = L⁻¹``
for the Cholesky factor ``L`` of the covariance, so the methods see inputs of mean 0 and identity
covariance, and :meth:`DataSource.to_raw` maps a learned network back to raw coordinates.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..aligned import one_blas_thread
from ..network import Network
from .arrays import ArrayFileError, ArrayReader, open_reader
from .stamps import DataChangedError

__all__ = ["DataSource", "DataSizeError", "data_source", "open_data", "whitening_map", "check_rows", "READ_BYTES"]

#: rows are read in blocks of about this many bytes of inputs (a Parquet row group is read once per block)
READ_BYTES = 64 * 2**20


class DataSizeError(ValueError):
    """The data holds fewer usable rows than a run or a method asks for."""


@dataclass(frozen=True)
class Scan:
    """What one read of the data found: rows with NaN / inf, and the mean and covariance of the other rows' x."""

    bad_rows: np.ndarray
    mean: np.ndarray
    cov: np.ndarray
    digest: str


@dataclass(frozen=True, eq=False)
class DataSource:
    """Samples read from files (see the module's docstring).

    Attributes
    ----------
    x, y
        Readers of the inputs (rows, d) and labels (rows,) or (rows, 1).
    bad_rows
        Sorted raw row numbers skipped (NaN or inf; empty unless ``nan_rows: skip``).
    whitening
        ``(μ, A)`` with ``z = A (x − μ)``, or None (the inputs are used as they are).
    """

    x: ArrayReader
    y: ArrayReader
    bad_rows: np.ndarray
    whitening: tuple[np.ndarray, np.ndarray] | None
    digest: str
    noise_std: float = 0.0
    outputs: None = None
    _shift: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # raw row of usable row v: v + (number of bad rows at or before it) = v + searchsorted(B − j, v, right)
        object.__setattr__(self, "_shift", np.asarray(self.bad_rows, dtype=np.int64) - np.arange(len(self.bad_rows)))

    @property
    def d(self) -> int:
        return int(self.x.shape[1])

    @property
    def rows(self) -> int:
        """Usable rows (the raw rows less the skipped ones)."""
        return self.x.rows - len(self.bad_rows)

    @property
    def skipped_rows(self) -> int:
        return int(len(self.bad_rows))

    def fingerprint(self) -> str:
        """Identifies the data (shapes, a hash of its rows' bytes from the scan, columns, options)."""
        return self.digest

    # ------------------------------------------------------------------ rows

    def _raw(self, v: int) -> int:
        return int(v + np.searchsorted(self._shift, v, side="right"))

    def row_batches(self, start: int, n: int, batch: int, raw: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Usable rows ``[start, start + n)`` as ``(x, y)`` batches of ``batch`` rows, whitened when set (and
        not ``raw``). Callers run it on one BLAS thread (a block task, a method's learn, a pilot pass), so the
        whitening product gives the same bits everywhere."""
        if start < 0 or start + n > self.rows:
            raise DataSizeError(
                f"rows {start:,}..{start + n:,} were asked of data with {self.rows:,} usable rows "
                f"({self.x.url}); use fewer samples or more data"
            )
        block = max(batch, (READ_BYTES // (8 * self.d)) // batch * batch)
        for lo in range(start, start + n, block):
            hi = min(lo + block, start + n)
            raw_lo, raw_hi = self._raw(lo), self._raw(hi - 1) + 1
            x, y = self.x.read(raw_lo, raw_hi), self.y.read(raw_lo, raw_hi).reshape(raw_hi - raw_lo)
            bad = self.bad_rows[np.searchsorted(self.bad_rows, raw_lo) : np.searchsorted(self.bad_rows, raw_hi)]
            if len(bad):
                keep = np.ones(raw_hi - raw_lo, dtype=bool)
                keep[bad - raw_lo] = False
                x, y = x[keep], y[keep]
            if self.whitening is not None and not raw:
                mu, a = self.whitening
                x = (x - mu) @ a.T
            for b in range(0, len(y), batch):
                yield np.ascontiguousarray(x[b : b + batch]), np.ascontiguousarray(y[b : b + batch])

    def window(self, stream: str, part: int, n: int) -> int:
        """First usable row of an auxiliary draw of ``n`` rows, ``n`` at most :attr:`rows` (the callers clip
        larger draws to all rows; see the module's docstring)."""
        if n > self.rows:
            raise DataSizeError(
                f"a {stream} sample of {n:,} rows was asked of data with {self.rows:,} usable rows "
                f"({self.x.url}); use more data"
            )
        if stream == "pilot" or (stream == "held_out" and part == 0):
            return 0
        if stream == "test" or part == 1:
            return self.rows - n
        return ((part - 2) * n) % (self.rows - n + 1)

    def test_rows(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The last ``n`` usable rows, raw: where ``evaluate`` measures a model of raw inputs."""
        parts = list(self.row_batches(self.window("test", 0, n), n, max(1, n), raw=True))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    # --------------------------------------------------------------- models

    def to_raw(self, net: Network) -> Network:
        """``net`` of whitened inputs as a network of raw inputs: ``W0 A x + (b0 − W0 A μ)``."""
        if self.whitening is None:
            return net
        mu, a = self.whitening
        w0 = net.weights[0] @ a
        b0 = (net.biases[0] if net.biases is not None else np.zeros(w0.shape[0])) - w0 @ mu
        rest = tuple(net.biases[1:]) if net.biases is not None else tuple(np.zeros(w.shape[0]) for w in net.weights[1:])
        return Network((w0,) + tuple(net.weights[1:]), (b0,) + rest, activation=net.activation)


def data_source(
    x_url: str,
    y_url: str,
    d: int,
    *,
    x_columns: list[str] | None = None,
    y_column: str | None = None,
    whiten: bool = True,
    nan_rows: str = "refuse",
    storage_options: dict | None = None,
    samples: int | None = None,
    chunk_size: int | None = None,
) -> DataSource:
    """Open the data a configuration names, scan it and check it against ``d`` and ``samples``.

    Raises
    ------
    ArrayFileError, DataSizeError, ValueError
        Naming the key, the file and the fix: a width other than ``d``, labels of another row count or more
        than one column, a NaN row (with ``nan_rows: refuse``), fewer usable rows than ``samples``, a singular
        covariance.
    """
    x, y = open_data(x_url, y_url, d, x_columns=x_columns, y_column=y_column, storage_options=storage_options)
    scan = _scan(x, y)
    if len(scan.bad_rows) and nan_rows != "skip":
        r = int(scan.bad_rows[0])
        raise ValueError(
            f"source.data: row {r} (counting from 0) of the data has NaN or inf ({len(scan.bad_rows)} "
            f"such row(s), in {x_url} or {y_url}); remove them, or set source.data.nan_rows: skip to "
            "leave them out (counted in the store's fingerprint)"
        )
    if samples is not None:
        check_rows(x.rows - len(scan.bad_rows), samples, chunk_size or 1, x_url)
    whitening = (
        whitening_map(scan.mean, scan.cov, f"source.data.x: the covariance of {x_url}", "set source.data.whiten: false")
        if whiten
        else None
    )
    opts = {"whiten": bool(whiten), "nan_rows": nan_rows, "x_columns": x_columns, "y_column": y_column}
    digest = hashlib.sha256((scan.digest + repr(sorted(opts.items()))).encode()).hexdigest()
    return DataSource(x, y, scan.bad_rows if nan_rows == "skip" else np.empty(0, np.int64), whitening, digest)


def open_data(
    x_url: str,
    y_url: str,
    d: int,
    *,
    x_columns: list[str] | None = None,
    y_column: str | None = None,
    storage_options: dict | None = None,
) -> tuple[ArrayReader, ArrayReader]:
    """Readers of the inputs and labels, checked against each other and ``d`` (messages name key and file)."""
    x = open_reader(x_url, columns=x_columns, storage_options=storage_options, what="source.data.x")
    y = open_reader(
        y_url,
        columns=[y_column] if y_column is not None else None,
        storage_options=storage_options,
        what="source.data.y",
    )
    shared = set(x.columns or ()) & set(y.columns or ()) if x.url == y.url else set()
    if shared:  # the label among the inputs: a model would learn to copy it
        raise ValueError(
            f"source.data: column {sorted(shared)[0]!r} of {y_url} is the label (y_column) and also an input "
            "(x_columns); leave it out of source.data.x_columns"
        )
    if len(x.shape) != 2 or x.shape[1] != d:
        width = x.shape[1] if len(x.shape) == 2 else 1
        raise ValueError(f"source.data.x: {x_url} has {width} column(s) per row but source.d is {d}; make them agree")
    if len(y.shape) == 2 and y.shape[1] != 1:
        raise ValueError(
            f"source.data.y: {y_url} has {y.shape[1]} columns; give one label per row (for Parquet: "
            "source.data.y_column)"
        )
    if y.rows != x.rows:
        raise ValueError(f"source.data: {x_url} has {x.rows:,} rows but {y_url} has {y.rows:,}; give one label per row")
    return x, y


def whitening_map(mean: np.ndarray, cov: np.ndarray, what: str, instead: str) -> tuple[np.ndarray, np.ndarray]:
    """``(μ, A)`` with ``z = A (x − μ)`` of identity covariance: ``A = L⁻¹`` for the Cholesky factor ``L`` of
    ``cov`` (one BLAS thread: the same map in any process). A singular ``cov`` is refused: ``what`` names it,
    ``instead`` says what else to do."""
    try:
        with one_blas_thread():
            return np.asarray(mean, dtype=np.float64), np.linalg.inv(np.linalg.cholesky(cov))
    except np.linalg.LinAlgError:
        raise ValueError(
            f"{what} is singular (a column is constant or a combination of others); drop such columns, or {instead}"
        ) from None


def check_rows(usable: int, samples: int, chunk_size: int, url: str) -> None:
    """Refuse a sample count the data cannot give: a run reads whole chunks of ``chunk_size`` rows."""
    needed = -(-int(samples) // int(chunk_size)) * int(chunk_size)
    if needed > usable:
        most = usable // chunk_size * chunk_size
        raise DataSizeError(
            f"samples is {samples:,}, which takes {needed:,} rows (whole chunks of chunk_size {chunk_size:,}), but the "
            f"data ({url}) holds {usable:,} usable rows; set samples to at most {most:,}, or a smaller chunk_size, "
            "or give more data"
        )


@dataclass(frozen=True)
class BlockScan:
    """One block's part of a :class:`Scan`: usable rows, ``Σ (x − shift)``, ``Σ (x − shift)(x − shift)ᵀ``, the
    raw numbers of its NaN / inf rows and the SHA-256 of its bytes."""

    count: int
    s1: np.ndarray
    s2: np.ndarray
    bad: np.ndarray
    digest: str


def scan_blocks(x: ArrayReader) -> list[tuple[int, int]]:
    """The row ranges a scan reads, one :data:`READ_BYTES` of inputs each (a function of the data only)."""
    block = max(1, READ_BYTES // (8 * x.shape[1]))
    return [(lo, min(lo + block, x.rows)) for lo in range(0, x.rows, block)]


def scan_block(x: ArrayReader, y: ArrayReader, lo: int, hi: int, shift: np.ndarray) -> BlockScan:
    """The scan of rows ``[lo, hi)``: what a worker computes of its block (one BLAS thread, so the same bits
    anywhere)."""
    xb, yb = x.read(lo, hi), y.read(lo, hi).reshape(hi - lo)
    sha = hashlib.sha256(xb.tobytes())
    sha.update(yb.tobytes())
    ok = np.isfinite(xb).all(axis=1) & np.isfinite(yb)
    xc = xb[ok] - shift
    with one_blas_thread():
        s2 = xc.T @ xc
    return BlockScan(len(xc), xc.sum(axis=0), s2, (lo + np.flatnonzero(~ok)).astype(np.int64), sha.hexdigest())


def first_finite_row(x: ArrayReader, y: ArrayReader) -> np.ndarray:
    """The first row of ``x`` with finite x and y: the shift of the scan's sums (a large mean costs no
    precision); zeros when there is none (the scan then refuses the data)."""
    for lo in range(0, x.rows, 1024):
        hi = min(lo + 1024, x.rows)
        xb, yb = x.read(lo, hi), y.read(lo, hi).reshape(hi - lo)
        ok = np.flatnonzero(np.isfinite(xb).all(axis=1) & np.isfinite(yb))
        if len(ok):
            return xb[ok[0]].copy()
    return np.zeros(x.shape[1])


def combine_scan(x: ArrayReader, y: ArrayReader, shift: np.ndarray, blocks: list[BlockScan]) -> Scan:
    """The :class:`Scan` of the blocks, added in row order (so it does not depend on where they ran)."""
    d = x.shape[1]
    count, s1, s2 = 0, np.zeros(d), np.zeros((d, d))
    sha = hashlib.sha256(repr((x.url, x.shape, x.columns, y.url, y.shape, y.columns)).encode())
    for b in blocks:
        count, s1, s2 = count + b.count, s1 + b.s1, s2 + b.s2
        sha.update(b.digest.encode())
    if count < 2:
        raise DataSizeError(f"source.data: {x.url} has {count} usable rows; give more data")
    m = s1 / count
    cov = s2 / count - np.outer(m, m)
    bad = np.concatenate([b.bad for b in blocks]) if blocks else np.empty(0, np.int64)
    return Scan(bad, shift + m, (cov + cov.T) / 2, sha.hexdigest())


#: scans made in this process, by reader pair (the readers carry the files' stamps: a rewritten file is new)
_SCANS: dict[tuple[ArrayReader, ArrayReader], Scan] = {}


def _scan(x: ArrayReader, y: ArrayReader, mapper: Any = None) -> Scan:
    """The scan of the data: one read of every row in blocks (:func:`scan_block`), through ``mapper`` (a
    cluster's map: the workers read the blocks) or in this process; kept for the process."""
    key = (x, y)
    if key not in _SCANS:
        shift = first_finite_row(x, y)
        items = scan_blocks(x)
        if mapper is None:
            blocks = [scan_block(x, y, lo, hi, shift) for lo, hi in items]
        else:
            blocks = list(mapper(lambda item: scan_block(x, y, item[0], item[1], shift), items))
        if len(_SCANS) >= 8:
            _SCANS.pop(next(iter(_SCANS)))
        _SCANS[key] = combine_scan(x, y, shift, blocks)
    return _SCANS[key]


def scan_on(client: Any, spec: Any, d: int, where: Any) -> None:
    """Scan a config's data on the workers of ``client`` before the source is made (which then finds the scan
    made): the driver reads one row, the workers every block. ``where`` resolves a path of the config."""
    from ..aligned import fresh

    x, y = open_data(
        where(spec.x),
        where(spec.y),
        d,
        x_columns=spec.x_columns,
        y_column=spec.y_column,
        storage_options=spec.storage_options,
    )

    def mapper(fn, items):
        futures = client.map(_as_value(fn), items, pure=False)
        out = [fresh(f.result()) for f in futures]
        for r in out:  # a file missing a chunk or changed under the scan: its one line, no worker traceback
            if isinstance(r, (ArrayFileError, DataChangedError)):
                raise r
        return out

    _scan(x, y, mapper)


def _as_value(fn: Any) -> Any:
    """``fn`` returning a data file's error (:class:`ArrayFileError`, :class:`DataChangedError`) instead of
    raising it: a task that raises is logged by its worker with a traceback."""

    def task(item: Any) -> Any:
        try:
            return fn(item)
        except (ArrayFileError, DataChangedError) as err:
            return err

    return task


def describe(source: DataSource) -> dict[str, Any]:
    """What a run reports of its data: rows, skipped rows, whether whitened."""
    return {"rows": source.rows, "skipped_rows": source.skipped_rows, "whitened": source.whitening is not None}
