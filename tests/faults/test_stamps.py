"""A data source's files are what they claimed when the run opened them: stamps checked around every read."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from datafiles import RUN, after_first_commit, samples
from stores import assert_bitwise_equal

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.pipeline.arrays import open_reader
from relulearn.pipeline.stamps import DataChangedError

from conftest import relulearn

FIX = "restore the file, or start a new store for the new data"


def config(folder: Path, d: int = 4) -> Path:
    data = {"x": str(folder / "x.npy"), "y": str(folder / "y.npy")}
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump({**RUN, "source": {"d": d, "data": data}}))
    return path


def rewrite(path: Path, arr: np.ndarray, how: str) -> None:
    """Another array of the same shape at ``path``: written over the file (``save``), then with its modification
    time set back (``save+utime``), or a new file renamed over it with the old times (``rename+utime``)."""
    before = os.stat(path)
    if how == "rename+utime":
        np.save(path.with_name("new.npy"), arr)
        os.utime(path.with_name("new.npy"), ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(path.with_name("new.npy"), path)
        return
    np.save(path, arr)
    if how == "save+utime":
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert after.st_size == before.st_size and (how == "save" or after.st_mtime_ns == before.st_mtime_ns)


# ------------------------------------------------------------------ a reader's checks


@pytest.mark.parametrize(
    "how, what",
    [
        ("save", "modification time"),
        ("save+utime", "status-change time"),  # a faked mtime: ctime cannot be set back
        ("rename+utime", "inode"),
    ],
)
def test_a_npy_file_rewritten_after_it_was_opened_is_refused_naming_it_and_what_changed(how, what, tmp_path):
    x, _ = samples(1, rows=100)
    np.save(tmp_path / "x.npy", x)
    reader = open_reader(str(tmp_path / "x.npy"))
    assert np.array_equal(reader.read(10, 20), x[10:20])
    rewrite(tmp_path / "x.npy", x[::-1].copy(), how)
    with pytest.raises(DataChangedError) as err:
        reader.read(10, 20)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{tmp_path / 'x.npy'} changed while this run read it (") and what in line, line
    assert "size" not in line and line.endswith(FIX), line
    assert np.array_equal(open_reader(str(tmp_path / "x.npy")).read(10, 20), x[::-1][10:20])  # opened anew: read


def test_a_file_grown_or_deleted_under_a_reader_is_refused_with_its_sizes(tmp_path):
    x, _ = samples(2, rows=100)
    np.save(tmp_path / "x.npy", x)
    reader = open_reader(str(tmp_path / "x.npy"))
    size = os.path.getsize(tmp_path / "x.npy")
    np.save(tmp_path / "x.npy", np.concatenate([x, x]))
    with pytest.raises(DataChangedError, match=rf"size {size} → {size + x.nbytes} bytes"):
        reader.read(0, 10)
    (tmp_path / "x.npy").unlink()
    with pytest.raises(DataChangedError, match=r"\(it is gone\)"):
        reader.read(0, 10)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_array_with_one_chunk_rewritten_is_refused_for_that_chunks_rows_only(zarr_format, tmp_path):
    """Each chunk file is stamped: the rows of a rewritten chunk are refused naming its file; rows of the other
    chunks are still those the run opened; a new metadata document refuses every read."""
    import zarr

    x = np.arange(300.0).reshape(100, 3)
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(25, 3), zarr_format=zarr_format)
    reader = open_reader(str(tmp_path / "x.zarr"))
    zarr.open_array(str(tmp_path / "x.zarr"), mode="r+")[60:70] = -1.0  # rows of chunk 2 only
    key = "2.0" if zarr_format == 2 else "c/2/0"
    assert np.array_equal(reader.read(0, 50), x[:50]) and np.array_equal(reader.read(75, 100), x[75:])
    with pytest.raises(DataChangedError) as err:
        reader.read(40, 80)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{tmp_path / 'x.zarr'}/{key} changed while this run read it") and FIX in line, line
    zarr.open_array(str(tmp_path / "x.zarr"), mode="r+").resize((120, 3))  # its metadata document rewritten
    meta = ".zarray" if zarr_format == 2 else "zarr.json"
    with pytest.raises(DataChangedError, match=rf"x.zarr/{meta} changed while this run read it"):
        reader.read(0, 10)


@pytest.mark.extra("data")
def test_a_parquet_file_rewritten_after_it_was_opened_is_refused_for_x_and_y_alike(tmp_path):
    """x and y read from one Parquet file: both readers carry its stamp, and both refuse it once rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"f0": np.arange(50.0), "target": np.arange(50.0) ** 2})
    pq.write_table(table, tmp_path / "d.parquet")
    x = open_reader(str(tmp_path / "d.parquet"), columns=["f0"])
    y = open_reader(str(tmp_path / "d.parquet"), columns=["target"], what="source.data.y")
    assert np.array_equal(y.read(0, 5)[:, 0], np.arange(5.0) ** 2)
    pq.write_table(pa.table({"f0": -np.arange(50.0), "target": np.arange(50.0)}), tmp_path / "d.parquet")
    for reader in (x, y):
        with pytest.raises(DataChangedError, match="^" + re.escape(f"{tmp_path / 'd.parquet'} changed while this run")):
            reader.read(0, 5)


# ------------------------------------------------------------------ a run


@pytest.mark.parametrize(
    "where, how",
    [("in-process", "save"), ("in-process", "save+utime"), ("in-process", "rename+utime"), ("workers", "save")],
)
def test_a_npy_file_replaced_during_a_run_is_refused_and_nothing_of_it_is_committed(where, how, client, tmp_path):
    """x.npy is replaced by another of the same shape after the first commit: the run stops with exit 2 and one
    line naming the file and the fix; what it committed holds the old rows only (restored, the same command
    resumes to the bits of an uninterrupted run)."""
    x, y = samples(3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    cfg, store = config(tmp_path), tmp_path / "s.zarr"
    flags = ["--in-process"] if where == "in-process" else ["--scheduler", client.scheduler.address]
    thread = after_first_commit(store, lambda: rewrite(tmp_path / "x.npy", samples(4)[0], how))
    done = relulearn("estimate", cfg, "--store", store, *flags, "--quiet")
    thread.join()
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"relulearn: error: {tmp_path / 'x.npy'} changed while this run read it"), line
    assert line.endswith(FIX), line
    committed = api.status(str(store))["samples"]
    assert 0 < committed < RUN["samples"]

    rewrite(tmp_path / "x.npy", x, "save")  # restored: the store's rows are those of the restored file
    again = relulearn("estimate", cfg, "--store", store, *flags, "--quiet")
    assert again.returncode == 0, again.stderr
    api.estimate(
        config_from_dict({**RUN, "source": yaml.safe_load(cfg.read_text())["source"]}),
        str(tmp_path / "r.zarr"),
        client="local",
        progress=None,
    )
    assert_bitwise_equal(str(store), str(tmp_path / "r.zarr"))


def test_a_npy_file_replaced_between_commands_is_refused_naming_the_files_and_the_store_is_unchanged(tmp_path):
    x, y = samples(5)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    cfg, store = config(tmp_path), tmp_path / "s.zarr"
    first = relulearn("estimate", cfg, "--store", store, "--samples", 8_000, "--in-process", "--quiet")
    assert first.returncode == 0, first.stderr
    rewrite(tmp_path / "y.npy", samples(6)[1], "save+utime")
    before = {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}
    done = relulearn("estimate", cfg, "--store", store, "--in-process", "--quiet")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"the rows of {tmp_path / 'x.npy'} and {tmp_path / 'y.npy'} are not those" in line, line
    assert "teacher_sha256" not in line and "start a new store" in line, line
    assert {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()} == before
