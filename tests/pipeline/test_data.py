"""Data sources: users' samples in .npy, zarr and Parquet files (local or fsspec URLs), whitened on the fly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from datafiles import ROWS, D, K, planted_data, write

from relulearn import api, open_store
from relulearn.config import config_from_dict
from relulearn.network import Network, compare
from relulearn.pipeline.arrays import ArrayFileError, open_reader
from relulearn.pipeline.data import DataSizeError
from relulearn.pipeline.sources import make_source

from conftest import relulearn


def data_config(data: dict, samples: int = ROWS, d: int = D, chunk_size: int = 50_000, **extra) -> dict:
    return {"seed": 0, "samples": samples, "chunk_size": chunk_size, "source": {"d": d, "data": data}, **extra}


def raw_test_error(teacher: Network, learned: Network, mean: np.ndarray, chol: np.ndarray) -> float:
    g = np.random.default_rng(99).standard_normal((100_000, len(mean)))
    x = mean + g @ chol.T
    y = teacher.forward(x)[:, 0]
    return float(np.mean((y - learned.forward(x)[:, 0]) ** 2) / np.mean(y**2))


@pytest.mark.parametrize("fmt", ["npy", "zarr", pytest.param("parquet", marks=pytest.mark.extra("data"))])
def test_correlated_data_is_learned_exactly_in_raw_coordinates(fmt, client, tmp_path):
    """Read by two worker processes in chunk ranges, whitened on the fly with the scanned mean and covariance;
    the network mapped back to raw coordinates matches the teacher on fresh raw inputs."""
    teacher, mean, chol, x, y = planted_data()
    data = write(fmt, tmp_path, x, y)
    out = str(tmp_path / "m.npz")
    got = api.fit(
        config_from_dict(data_config(data)),
        str(tmp_path / "s.zarr"),
        "moments",
        width=K,
        out=out,
        client=client,
        progress=None,
    )
    assert got["estimate"]["data"] == {"rows": ROWS, "skipped_rows": 0, "whitened": True}
    learned = Network.load(out)
    assert raw_test_error(teacher, learned, mean, chol) <= 1e-8
    assert compare(teacher, learned).relative_error <= 1e-8


def test_a_dataset_at_an_fsspec_memory_url(tmp_path):
    import fsspec

    teacher, mean, chol, x, y = planted_data(seed=2)
    fs = fsspec.filesystem("memory")
    for name, arr in (("x", x), ("y", y)):
        with fs.open(f"/relulearn-test-{id(tmp_path)}/{name}.npy", "wb") as f:
            np.save(f, arr)
    data = {"x": f"memory://relulearn-test-{id(tmp_path)}/x.npy", "y": f"memory://relulearn-test-{id(tmp_path)}/y.npy"}
    out = str(tmp_path / "m.npz")
    api.fit(
        config_from_dict(data_config(data)),
        str(tmp_path / "s.zarr"),
        "moments",
        width=K,
        out=out,
        client="local",
        progress=None,
    )  # a memory filesystem lives in one process
    assert raw_test_error(teacher, Network.load(out), mean, chol) <= 1e-8


def test_chunks_read_on_workers_are_the_bytes_read_in_process(client, tmp_path):
    """The statistics of a data source (d = 24, where BLAS blocks) are bitwise equal in process and on two
    workers: the scan (mean, covariance) is the same whether the driver or the workers read the blocks, and a
    chunk is the same rows, whitened the same way, wherever it is read."""
    rng = np.random.default_rng(3)
    x = 0.5 + rng.standard_normal((60_000, 24)) @ np.diag(np.linspace(1, 3, 24))
    y = np.maximum(x[:, :3].sum(axis=1), 0)
    data = write("npy", tmp_path, x, y)
    cfg = config_from_dict(
        {
            "seed": 0,
            "samples": 60_000,
            "chunk_size": 10_000,
            "source": {"d": 24, "data": data},
            "statistics": {"basic": {}, "contracted": {"orders": [2], "directions": 2}},
            "run": {"chunks_per_block": 1},
        }
    )
    from relulearn.pipeline import data as data_module
    from relulearn.pipeline.sources import prime_data_scan

    api.estimate(cfg, str(tmp_path / "a.zarr"), client="local", progress=None)  # scanned in this process
    here = dict(data_module._SCANS)
    data_module._SCANS.clear()
    prime_data_scan(cfg, client)  # the workers read the blocks
    ((key, on_workers),) = data_module._SCANS.items()
    for field in ("bad_rows", "mean", "cov"):
        assert np.array_equal(getattr(here[key], field), getattr(on_workers, field))
    assert here[key].digest == on_workers.digest
    data_module._SCANS.clear()
    api.estimate(cfg, str(tmp_path / "b.zarr"), client=client, progress=None)
    a, b = open_store(str(tmp_path / "a.zarr")), open_store(str(tmp_path / "b.zarr"))
    for name in ("basic", "contracted"):
        for key, arr in a.arrays(name).items():
            assert np.array_equal(np.asarray(arr), np.asarray(b.arrays(name)[key])), (name, key)


def test_nan_rows_are_refused_by_number_or_skipped_and_counted(tmp_path):
    teacher, mean, chol, x, y = planted_data(seed=4, rows=200_000)
    x[123_456, 4] = np.nan
    y[7_000] = np.inf
    x = np.vstack([x, mean + np.random.default_rng(5).standard_normal((2, D)) @ chol.T])  # 200,000 usable rows
    y = np.r_[y, teacher.forward(x[-2:])[:, 0]]
    data = write("npy", tmp_path, x, y)
    with pytest.raises(
        ValueError,
        match=r"row 7000 \(counting from 0\) of the data has NaN or inf \(2 such row"
        r".*source.data.nan_rows: skip",
    ):
        api.estimate(
            config_from_dict(data_config(data, samples=200_000)),
            str(tmp_path / "s.zarr"),
            client="local",
            progress=None,
        )
    assert not (tmp_path / "s.zarr").exists()
    out = str(tmp_path / "m.npz")
    got = api.fit(
        config_from_dict(data_config(dict(data, nan_rows="skip"), samples=200_000)),
        str(tmp_path / "s.zarr"),
        "moments",
        width=K,
        out=out,
        client="local",
        progress=None,
    )
    assert got["estimate"]["data"]["skipped_rows"] == 2 and got["samples"] == 200_000
    assert raw_test_error(teacher, Network.load(out), mean, chol) <= 1e-8


def test_fewer_rows_than_samples_is_refused_before_any_work(tmp_path):
    _, _, _, x, y = planted_data(seed=6, rows=120_000)
    data = write("npy", tmp_path, x, y)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data_config(data, samples=200_000)))
    done = relulearn("estimate", str(cfg), "--store", str(tmp_path / "s.zarr"), "--in-process", "--quiet")
    assert done.returncode != 0
    assert "samples is 200,000" in done.stderr and "holds 120,000 usable rows" in done.stderr
    assert "set samples to at most 100,000" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s.zarr").exists()
    # extending a store past the data is refused the same way
    api.estimate(
        config_from_dict(data_config(data, samples=100_000)), str(tmp_path / "t.zarr"), client="local", progress=None
    )
    with pytest.raises(DataSizeError, match=r"samples is 150,000.*holds 120,000 usable rows"):
        api.estimate(
            config_from_dict(data_config(data, samples=100_000)),
            str(tmp_path / "t.zarr"),
            samples=150_000,
            client="local",
            progress=None,
        )


@pytest.mark.parametrize(
    "case, message",
    [
        ("width", r"source.data.x: .*x.npy has 10 column\(s\) per row but source.d is 8; make them agree"),
        ("rows", r"source.data: .*x.npy has 120,000 rows but .*y.npy has 119,999; give one label per row"),
        ("missing", r"source.data.y: .*nothere.npy does not exist"),
        ("csv", r"source.data.x: .*x.csv is a file but not a .npy file, a Parquet file or a zarr array.*np.save"),
        ("objects", r"source.data.x: .*holds Python objects .*never loads pickles"),
        pytest.param(
            "column",
            r"source.data.x: .*d.parquet has no column\(s\) \['g0'\]; its columns are",
            marks=pytest.mark.extra("data"),
        ),
        ("teacher", r"source.data gives the samples; source.teacher applies to teachers only"),
        pytest.param(
            "label",
            r"source.data: column 'target' of .*d.parquet is the label \(y_column\) and also an input",
            marks=pytest.mark.extra("data"),
        ),
    ],
)
def test_bad_data_names_the_key_the_file_and_the_fix(case, message, tmp_path):
    _, _, _, x, y = planted_data(seed=7, rows=120_000)
    data = write("npy", tmp_path, x, y)
    cfg = data_config(data, samples=100_000)
    if case == "width":
        cfg["source"]["d"] = 8
    elif case == "rows":
        np.save(tmp_path / "y.npy", y[:-1])
    elif case == "missing":
        cfg["source"]["data"]["y"] = str(tmp_path / "nothere.npy")
    elif case == "csv":
        np.savetxt(tmp_path / "x.csv", x[:10], delimiter=",")
        cfg["source"]["data"]["x"] = str(tmp_path / "x.csv")
    elif case == "objects":
        np.save(tmp_path / "x.npy", np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
    elif case == "column":
        cfg["source"]["data"] = dict(write("parquet", tmp_path, x, y), x_columns=["f0", "g0"])
    elif case == "label":
        data = write("parquet", tmp_path, x, y)
        cfg["source"]["data"] = dict(data, x_columns=[*data["x_columns"][:-1], "target"])
    else:
        cfg["source"]["teacher"] = {"kind": "one_hidden_relu", "width": 2}
    with pytest.raises((ValueError, ArrayFileError), match=message):
        make_source(config_from_dict(cfg))


def test_fit_on_data_through_the_cli_reads_relative_paths_and_writes_raw_coordinates(tmp_path):
    teacher, mean, chol, x, y = planted_data(seed=8, rows=200_000)
    write("npy", tmp_path, x, y)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data_config({"x": "x.npy", "y": "y.npy"}, samples=200_000)))  # relative paths
    out = tmp_path / "m.npz"
    method = ["--method", "moments", "--width", "3"]
    store = ["--store", str(tmp_path / "s.zarr")]
    done = relulearn("fit", str(cfg), *store, *method, "--out", str(out), "--in-process", "--quiet", "--json", cwd="/")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["estimate"]["data"]["whitened"] is True
    assert raw_test_error(teacher, Network.load(out), mean, chol) <= 1e-8
    ev = api.evaluate(out, cfg, samples=50_000)  # on the data's last rows, in raw coordinates
    assert ev["relative_test_error"] <= 1e-8 and ev["samples"] == 50_000 and "data" in ev["parameter_error_note"]


def test_a_rewritten_dataset_cannot_resume_its_store(tmp_path):
    """The store's fingerprint holds a hash of the rows' bytes: data changed in place is another source, refused
    naming the data files (not the fingerprint's field) and the fix."""
    from relulearn.storage import StoreError

    _, _, _, x, y = planted_data(seed=9, rows=150_000)
    data = write("npy", tmp_path, x, y)
    api.estimate(
        config_from_dict(data_config(data, samples=100_000)), str(tmp_path / "s.zarr"), client="local", progress=None
    )
    y[5] += 1e-9
    np.save(tmp_path / "y.npy", y)
    with pytest.raises(StoreError) as err:
        api.estimate(
            config_from_dict(data_config(data, samples=150_000)),
            str(tmp_path / "s.zarr"),
            client="local",
            progress=None,
        )
    (line,) = str(err.value).splitlines()
    assert f"the rows of {tmp_path / 'x.npy'} and {tmp_path / 'y.npy'} are not those" in line, line
    assert "teacher_sha256" not in line and "start a new store" in line and "not modified" in line, line


@pytest.mark.extra("data")
@pytest.mark.parametrize("x_columns", [None, ["f0"], ["f1", "f1"]])
def test_duplicate_parquet_columns_are_refused_in_one_line_naming_the_file_and_the_column(x_columns, tmp_path):
    """A Parquet file with two columns of one name (pandas and pyarrow write them), or x_columns naming one
    column twice: `estimate` exits 2 with one line naming the file and the column; no store is made."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    cols = [pa.array(rng.standard_normal(100)) for _ in range(3)]
    names = ["f0", "f0", "target"] if x_columns != ["f1", "f1"] else ["f0", "f1", "target"]
    pq.write_table(pa.Table.from_arrays(cols, names=names), tmp_path / "d.parquet")
    data = {"x": str(tmp_path / "d.parquet"), "y": str(tmp_path / "d.parquet"), "y_column": "target"}
    if x_columns is not None:
        data["x_columns"] = x_columns
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data_config(data, samples=100, d=len(x_columns or names), chunk_size=50)))
    done = relulearn("estimate", cfg, "--store", tmp_path / "s.zarr", "--in-process", "--quiet")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    column = "f1" if x_columns == ["f1", "f1"] else "f0"
    assert "d.parquet" in line and f"'{column}'" in line and "twice" in line, line
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_array_with_a_missing_chunk_file_is_refused_naming_the_chunk_and_rows(zarr_format, tmp_path):
    """A zarr data array whose chunk file is gone reads as zeros (zarr's fill value); the reader refuses the
    rows of that chunk in one line naming the array, the chunk and the rows, and still reads the others."""
    import zarr

    x = np.arange(1.0, 1.0 + 100 * 3).reshape(100, 3)
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(25, 3), zarr_format=zarr_format)
    chunk = tmp_path / "x.zarr" / ("1.0" if zarr_format == 2 else "c/1/0")
    chunk.unlink()
    reader = open_reader(str(tmp_path / "x.zarr"))
    assert np.array_equal(reader.read(0, 25), x[:25])  # the chunks that exist are read as written
    assert np.array_equal(reader.read(50, 100), x[50:])
    with pytest.raises(ArrayFileError) as err:
        reader.read(10, 60)
    (line,) = str(err.value).splitlines()
    assert "x.zarr" in line and "chunk (1, 0)" in line and "rows 25..49" in line and "incomplete" in line, line


def test_estimate_on_a_zarr_array_with_a_missing_chunk_exits_2_in_one_line(tmp_path):
    import zarr

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((400, 4)), rng.standard_normal(400)
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(100, 4))
    zarr.create_array(str(tmp_path / "y.zarr"), data=y, chunks=(100,))
    (tmp_path / "x.zarr" / "c" / "2" / "0").unlink()
    cfg = tmp_path / "c.yaml"
    data = {"x": str(tmp_path / "x.zarr"), "y": str(tmp_path / "y.zarr")}
    cfg.write_text(yaml.safe_dump(data_config(data, samples=400, d=4, chunk_size=400)))
    done = relulearn("estimate", cfg, "--store", tmp_path / "s.zarr", "--in-process", "--quiet")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "x.zarr" in line and "chunk (2, 0)" in line and "rows 200..299" in line, line
    assert not (tmp_path / "s.zarr").exists()  # refused by the scan before any work


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_array_with_a_damaged_chunk_is_refused_naming_the_chunk_and_rows(zarr_format, tmp_path):
    """A chunk file whose bytes do not decode (zstd's "Src size is incorrect" from deep inside the codec) is
    refused in one line naming the array, the chunk and its rows; the other chunks still read as written, and
    `estimate` exits 2 in one line with no store made."""
    import zarr

    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((400, 4)), rng.standard_normal(400)
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(100, 4), zarr_format=zarr_format)
    zarr.create_array(str(tmp_path / "y.zarr"), data=y, chunks=(100,), zarr_format=zarr_format)
    chunk = tmp_path / "x.zarr" / ("2.0" if zarr_format == 2 else "c/2/0")
    chunk.write_bytes(chunk.read_bytes()[:-7] + b"garbage")
    reader = open_reader(str(tmp_path / "x.zarr"))
    assert np.array_equal(reader.read(0, 200), x[:200]) and np.array_equal(reader.read(300, 400), x[300:])
    with pytest.raises(ArrayFileError) as err:
        reader.read(150, 350)
    (line,) = str(err.value).splitlines()
    assert "x.zarr" in line and "chunk (2, 0)" in line and "rows 200..299" in line and "damaged" in line, line
    cfg = tmp_path / "c.yaml"
    data = {"x": str(tmp_path / "x.zarr"), "y": str(tmp_path / "y.zarr")}
    cfg.write_text(yaml.safe_dump(data_config(data, samples=400, d=4, chunk_size=400)))
    done = relulearn("estimate", cfg, "--store", tmp_path / "s.zarr", "--in-process", "--quiet")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "x.zarr" in line and "chunk (2, 0)" in line and "rows 200..299" in line, line
    assert not (tmp_path / "s.zarr").exists()
