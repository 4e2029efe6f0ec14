"""Row-range readers of users' arrays: ``.npy`` files, zarr arrays and Parquet columns, local or at fsspec URLs.

A reader is opened from a path or URL and reads rows ``[start, stop)`` as float64, so workers read only their
chunks' rows and nothing passes through the driver. Readers hold no open handles when pickled (a worker
reopens what it reads, once per process). A reader carries the stamps of its files taken when it was opened
(:mod:`.stamps`) and checks the objects a read touches against them before and after the read: a file that
changed under a run is refused, never mixed into its rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..filekind import not_a_file
from ..npyfile import ArrayHeaderError, check_data_bytes, read_npy_header
from .stamps import DataChangedError, Stamp, check_stamps, take_stamps

__all__ = ["ArrayFileError", "ArrayReader", "DataChangedError", "array_kind", "open_reader"]

PARQUET_SUFFIXES = (".parquet", ".pq")


class ArrayFileError(ValueError):
    """A data file that cannot be read as the rows of an array; the message names the file and the fix."""


def array_kind(url: str) -> str:
    """``npy``, ``parquet`` or ``zarr`` (anything else: a zarr array's folder or URL) from the name."""
    name = url.rstrip("/").lower()
    if name.endswith(".npy"):
        return "npy"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return "zarr"


@dataclass(frozen=True)
class ArrayReader:
    """Rows of one array: ``url`` (``kind``: npy, zarr or parquet), ``columns`` of a Parquet file.

    ``shape`` is ``(rows,)`` or ``(rows, cols)`` of what :meth:`read` returns.
    """

    url: str
    kind: str
    shape: tuple[int, ...]
    columns: tuple[str, ...] | None = None
    #: the fsspec options as canonical JSON (:func:`_options`): hashable, nested options included
    storage_options: str = "{}"
    #: a digest of :attr:`stamps`: a rewritten file is another reader (caches key on it)
    stamp: str = ""
    #: the stamps of the file (key ``""``), or of each file of a zarr array's folder, when it was opened
    stamps: Mapping[str, Stamp] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def rows(self) -> int:
        return int(self.shape[0])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a float64 array."""
        start, stop = int(start), int(min(stop, self.rows))
        if stop <= start:
            return np.empty((0,) + tuple(self.shape[1:]))
        # the objects this read touches are checked against their stamps before the read (a file changed since
        # the reader was opened) and after it (changed during the read): rows of another version are never used
        if self.kind == "zarr":
            arr = _zarr(self.url, self.storage_options, self.stamp)
            keys = _chunk_keys(arr, start, stop)
            _check_chunks(self.url, arr, _present(self.url, self.storage_options, self.stamp), keys)
            objects = [k for k in _METADATA if k in self.stamps] + [k for _, k in keys]
        else:
            objects = [""]
        if self.stamps:
            check_stamps(self.url, self.storage_options, self.stamps, objects)
        try:
            if self.kind == "npy":
                out = _read_npy(self.url, self.storage_options, self.stamp, start, stop)
            elif self.kind == "zarr":
                out = np.asarray(arr[start:stop])
            else:
                out = _read_parquet(self.url, self.storage_options, self.stamp, self.columns, start, stop)
        except DataChangedError:
            raise
        except Exception as err:  # a damaged chunk or page: zarr's codecs and pyarrow raise many kinds
            if self.stamps:  # a file rewritten in place reads as damaged half-way: the change is the cause
                check_stamps(self.url, self.storage_options, self.stamps, objects)
            if isinstance(err, (ArrayFileError, ArrayHeaderError)):
                raise
            if self.kind == "zarr":
                raise _damaged_chunk(self.url, arr, keys, err) from None
            raise ArrayFileError(
                f"{self.url}: rows {start:,}..{stop - 1:,} cannot be read ({type(err).__name__}: {err}); the file is "
                "damaged there: write it again"
            ) from None
        if self.stamps:
            check_stamps(self.url, self.storage_options, self.stamps, objects)
        return np.ascontiguousarray(out, dtype=np.float64)


def _options(storage_options: dict | None) -> str:
    """The fsspec options as canonical JSON: a key of the readers' caches that nested options
    (``{client_kwargs: {endpoint_url: ...}}``) can be, and one that equal options always give."""
    return json.dumps(storage_options or {}, sort_keys=True, separators=(",", ":"))


def _kwargs(opts: str) -> dict[str, Any]:
    """The fsspec options :func:`_options` encoded."""
    return dict(json.loads(opts))


def open_reader(
    url: str, *, columns: list[str] | None = None, storage_options: dict | None = None, what: str = "source.data.x"
) -> ArrayReader:
    """Open ``url`` (a path or fsspec URL) and check it holds a numeric array of rows.

    Raises
    ------
    ArrayFileError
        Naming ``what`` (the config key), the file and what to change: a missing file, a pickle, a dtype that
        is not numeric, an array of more than two dimensions, Parquet columns that do not exist.
    """
    kind = array_kind(url)
    opts = _options(storage_options)
    if columns is not None and kind != "parquet":
        raise ArrayFileError(f"{what}: columns apply to Parquet files; {url} is read as a {kind} array")
    # a folder where a file is expected, or a device (never opened: /dev/zero is read for ever); a zarr array is
    # a folder, and a missing path is said below
    found = not_a_file(url)
    if found is not None and not found.startswith("does not exist") and (kind != "zarr" or found != "is a directory"):
        raise ArrayFileError(f"{what}: {url} {found}; give a .npy file, a Parquet file or a zarr array's folder")
    try:
        stamps = take_stamps(url, opts)
        stamp = _digest(stamps)
        if kind == "npy":
            shape, dtype, _ = _npy_header(url, opts, stamp)
        elif kind == "zarr":
            arr = _zarr(url, opts, stamp)
            shape, dtype = tuple(arr.shape), np.dtype(arr.dtype)
        else:
            rows, names, types = _parquet_schema(url, opts, stamp)
    except ArrayFileError as err:
        raise ArrayFileError(f"{what}: {err}") from None
    except FileNotFoundError:
        if kind == "zarr" and _is_file(url, opts):  # a file named neither .npy nor .parquet (a CSV, an .npz, …)
            raise ArrayFileError(
                f"{what}: {url} is a file but not a .npy file, a Parquet file or a zarr array "
                "(read by its name: .npy, .parquet/.pq, else a zarr array's folder); save the "
                'array with np.save("x.npy", x) and give that file'
            ) from None
        if not_a_file(url) == "is a directory":
            raise ArrayFileError(
                f"{what}: {url} is a directory but not a zarr array (no .zarray or zarr.json in it); give a .npy "
                "file, a Parquet file or a zarr array's folder"
            ) from None
        raise ArrayFileError(
            f"{what}: {url} does not exist; a relative path is read from the configuration file's folder"
        ) from None
    except Exception as err:  # zarr, pyarrow and fsspec raise many kinds; name the file
        raise ArrayFileError(
            f"{what}: {url} cannot be read as a {kind} array ({type(err).__name__}: {err}); "
            "give a .npy file, a zarr array or a Parquet file"
        ) from None
    if kind == "parquet":
        cols = list(names) if columns is None else list(columns)
        missing = [c for c in cols if c not in names]
        if missing:
            raise ArrayFileError(f"{what}: {url} has no column(s) {missing}; its columns are {list(names)}")
        # a column is read by its name: a name the file holds twice is ambiguous, one selected twice a copy
        twice = [c for c in dict.fromkeys(cols) if names.count(c) > 1]
        if twice:
            raise ArrayFileError(
                f"{what}: {url} has the column name '{twice[0]}' twice; rename one of them in the file (columns "
                "are read by name), or choose other columns (source.data.x_columns, y_column)"
            )
        twice = [c for c in dict.fromkeys(cols) if cols.count(c) > 1]
        if twice:
            raise ArrayFileError(f"{what}: the column '{twice[0]}' of {url} is chosen twice; name each column once")
        bad = [c for c in cols if not types[c]]
        if bad:
            raise ArrayFileError(f"{what}: column(s) {bad} of {url} are not numeric; choose numeric columns")
        return ArrayReader(url, kind, (rows, len(cols)), tuple(cols), opts, stamp, stamps)
    if dtype.kind not in "iuf" or len(shape) not in (1, 2):
        raise ArrayFileError(
            f"{what}: {url} holds a {dtype} array of shape {shape}; give a numeric array of "
            "rows, (rows,) or (rows, columns)"
        )
    return ArrayReader(url, kind, tuple(int(s) for s in shape), None, opts, stamp, stamps)


def _is_file(url: str, opts: str) -> bool:
    """Whether ``url`` is an existing file (not a folder)."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url, **_kwargs(opts))
        return bool(fs.isfile(path))
    except Exception:  # noqa: BLE001 - only to choose the message
        return False


def _digest(stamps: Mapping[str, Stamp]) -> str:
    """A digest of a reader's stamps: the key of the caches of what was read of one version of its files."""
    import hashlib

    return hashlib.sha256(repr(sorted(stamps.items())).encode()).hexdigest()


# ------------------------------------------------------------------------- npy


def _open(url: str, opts: str):
    import fsspec

    return fsspec.open(url, "rb", **_kwargs(opts)).open()


@lru_cache(maxsize=64)
def _npy_header(url: str, opts: str, stamp: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset of a ``.npy`` file (C order only: rows are contiguous), its header checked
    against the file's size: a truncated file is refused here, not met as a short read in some chunk."""
    with _open(url, opts) as f:
        if f.read(6) != b"\x93NUMPY":
            raise ArrayFileError(f"{url} is not a .npy file (no NUMPY magic); save it with numpy.save")
        f.seek(0)
        try:
            header = read_npy_header(f, url)
            size = f.seek(0, 2)  # the file's size: rows are read by offset, never the whole array at once
            check_data_bytes(header, size - header.offset, url, None, "")
        except ArrayHeaderError as err:
            raise ArrayFileError(str(err)) from None
    dtype, offset = header.dtype, header.offset
    if header.fortran_order and len(header.shape) == 2:
        raise ArrayFileError(
            f"{url} is stored in Fortran order: its rows are not contiguous; save numpy.ascontiguousarray(x)"
        )
    if dtype.hasobject:
        raise ArrayFileError(
            f"{url} holds Python objects (a pickle inside the .npy); relulearn never loads "
            "pickles: save a numeric array"
        )
    return header.shape, dtype, offset


def _read_npy(url: str, opts: str, stamp: str, start: int, stop: int) -> np.ndarray:
    shape, dtype, offset = _npy_header(url, opts, stamp)
    row_items = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    row_bytes = row_items * dtype.itemsize
    with _open(url, opts) as f:
        f.seek(offset + start * row_bytes)
        buf = f.read((stop - start) * row_bytes)
    return np.frombuffer(buf, dtype=dtype).reshape((stop - start,) + tuple(shape[1:]))


# ------------------------------------------------------------------------ zarr


@lru_cache(maxsize=64)
def _zarr(url: str, opts: str, stamp: str):
    import zarr

    options = _kwargs(opts)
    kwargs: dict[str, Any] = {"storage_options": options} if options else {}
    return zarr.open_array(url, mode="r", **kwargs)


@lru_cache(maxsize=64)
def _present(url: str, opts: str, stamp: str) -> set[str]:
    """The chunk keys of one array (one version: ``stamp``) already seen to exist: each is asked of the store once."""
    return set()


#: a zarr array's metadata document (v3, v2): its shape, chunks, dtype and codecs
_METADATA = ("zarr.json", ".zarray")


def _chunk_keys(arr: Any, start: int, stop: int) -> list[tuple[tuple[int, ...], str]]:
    """The chunks (shards, when sharded: the chunks that are files) holding rows ``[start, stop)``: their
    coordinates and their keys inside the array's folder."""
    import itertools

    meta = arr.metadata
    grid = meta.chunks if meta.zarr_format == 2 else meta.chunk_grid.chunk_shape
    rows = grid[0]
    spans = [range(start // rows, (stop - 1) // rows + 1)]
    spans += [range(-(-n // c)) for n, c in zip(arr.shape[1:], grid[1:])]
    return [(coords, meta.encode_chunk_key(coords)) for coords in itertools.product(*spans)]


def _damaged_chunk(url: str, arr: Any, keys: list[tuple[tuple[int, ...], str]], err: Exception) -> ArrayFileError:
    """The error naming the first chunk of ``keys`` that does not decode (each read alone), its rows and why."""
    rows = (arr.metadata.chunks if arr.metadata.zarr_format == 2 else arr.metadata.chunk_grid.chunk_shape)[0]
    for coords, _ in keys:
        lo = coords[0] * rows
        try:
            arr[lo : min(lo + rows, arr.shape[0])]
        except Exception as one:  # noqa: BLE001 - the damaged one found
            err = one
            break
    else:
        coords = keys[0][0]
    lo = coords[0] * rows
    return ArrayFileError(
        f"{url}: chunk {tuple(coords)} (rows {lo}..{min(lo + rows, arr.shape[0]) - 1}) cannot be decoded "
        f"({type(err).__name__}: {err}); the array is damaged there: write those rows again"
    )


def _check_chunks(url: str, arr: Any, present: set[str], keys: list[tuple[tuple[int, ...], str]]) -> None:
    """Refuse the rows of ``keys`` (:func:`_chunk_keys`) if a chunk holding them has no file: zarr would read
    it as its fill value, rows that were never written."""
    from zarr.core.sync import sync

    meta = arr.metadata
    rows = (meta.chunks if meta.zarr_format == 2 else meta.chunk_grid.chunk_shape)[0]
    for coords, key in keys:
        if key in present:
            continue
        if not sync((arr.store_path / key).exists()):
            first = coords[0] * rows
            last = min(first + rows, arr.shape[0]) - 1
            raise ArrayFileError(
                f"{url}: chunk {coords} (file {key}, rows {first}..{last}) is missing: the data is incomplete "
                "(zarr would read it as its fill value); write those rows again, or write the array with "
                "zarr's config array.write_empty_chunks=True if they are all the fill value"
            )
        present.add(key)


# --------------------------------------------------------------------- parquet


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ArrayFileError("Parquet data needs pyarrow: pip install 'relulearn[data]' (or pyarrow)") from None
    return pq


@lru_cache(maxsize=64)
def _parquet_file(url: str, opts: str, stamp: str):
    return _pyarrow().ParquetFile(_open(url, opts))


@lru_cache(maxsize=64)
def _parquet_schema(url: str, opts: str, stamp: str) -> tuple[int, tuple[str, ...], dict[str, bool]]:
    import pyarrow as pa

    pf = _parquet_file(url, opts, stamp)
    schema = pf.schema_arrow
    numeric = {f.name: bool(pa.types.is_integer(f.type) or pa.types.is_floating(f.type)) for f in schema}
    return int(pf.metadata.num_rows), tuple(schema.names), numeric


def _read_parquet(
    url: str, opts: str, stamp: str, columns: tuple[str, ...] | None, start: int, stop: int
) -> np.ndarray:
    """Rows ``[start, stop)`` of ``columns``: the row groups that overlap them, sliced."""
    pf = _parquet_file(url, opts, stamp)
    meta = pf.metadata
    parts, first = [], 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        lo, hi = max(start, first), min(stop, first + n)
        if lo < hi:
            table = pf.read_row_group(g, columns=list(columns) if columns else None)
            block = np.column_stack(
                [table.column(c).to_numpy(zero_copy_only=False).astype(np.float64) for c in table.column_names]
            )
            parts.append(block[lo - first : hi - first])
        first += n
        if first >= stop:
            break
    return np.concatenate(parts) if len(parts) > 1 else parts[0]
