"""The store: atomic generations, xarray readability, fsspec URLs, merging, status."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from stores import write_config

from relulearn import open_store
from relulearn.pipeline.run import estimate
from relulearn.storage import FORMAT_VERSION, RunStore

from conftest import PYTHON, cli_env, make_config, relulearn


@pytest.fixture(scope="module")
def run_url(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("store") / "run.zarr")
    estimate(make_config(), url, progress=None, commit_interval=1e9)
    return url


def test_every_array_has_dimension_names_and_opens_in_xarray(run_url):
    run = open_store(run_url)
    root = zarr.open_group(run_url, mode="r")
    for stat in run.statistics + ["ledger"]:
        for name, arr in root[f"{run.head}/{stat}"].arrays():
            if arr.ndim:
                names = arr.metadata.dimension_names
                assert names is not None and len(names) == arr.ndim and all(names), f"{stat}/{name}"
        ds = xr.open_zarr(run_url, group=f"{run.head}/{stat}", consolidated=False)
        assert len(ds.data_vars) > 0
    ds = run.dataset("filtered")
    assert ds["M"].dims == ("tau", "i", "j") and ds["M_se"].dims == ("tau", "i", "j")
    np.testing.assert_array_equal(ds["tau"].values, run.arrays("filtered")["tau"])
    # the stored estimate is the stored sum over the sample count (basic terms are the sums)
    arrays = run.arrays("basic")
    assert np.array_equal(arrays["xx"], arrays["sum_xx"] / run.samples)


def test_xarray_opens_from_consolidated_metadata_with_coordinates(run_url):
    """The root's consolidated metadata describes the head generation: xarray opens a statistic
    without a warning, and the arrays that describe a statistic are its coordinates."""
    import warnings

    run = open_store(run_url)
    doc = json.loads((Path(run_url) / "zarr.json").read_text())
    consolidated = doc["consolidated_metadata"]["metadata"]
    assert {k.split("/")[0] for k in consolidated} == {run.head}  # exactly the committed generation
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for stat in run.statistics:
            ds = xr.open_zarr(run_url, group=f"{run.head}/{stat}")
            assert set(ds.variables) == set(run.arrays(stat)), stat
    filtered = run.dataset("filtered")
    assert set(filtered.coords) == {"tau", "quantile"} and {"tau", "quantile"} <= set(filtered["M"].coords)
    assert set(run.dataset("hermite").coords) == {f"index{m}" for m in range(1, 5)}
    assert set(run.dataset("contracted").coords) == {"direction", "pair_order", "pair_direction"}
    assert not run.dataset("basic").coords


def test_metadata_is_json_only_and_records_the_config(run_url):
    meta = json.loads((Path(run_url) / "zarr.json").read_text())["attributes"]["relulearn"]
    assert meta["config"]["source"]["d"] == 6 and meta["samples"] == 40_000
    assert meta["fingerprint"]["seed"] == 3 and meta["head"] in {p.name for p in Path(run_url).iterdir()}
    # no pickled objects anywhere: every file is zarr JSON metadata or raw chunk bytes (a pickle of
    # protocol 2-5 opens with PROTO, 0x80 and its protocol, and ends with STOP "."; raw floats may
    # open with 0x80 too)
    for p in Path(run_url).rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert not (
                data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") and data.endswith(b".")
            ), f"{p} looks like a pickle"


def test_interrupted_commit_leaves_previous_generation_readable(run_url, tmp_path):
    """A crash between writing a generation and flipping the head: the old head still rules."""
    import shutil

    url = str(tmp_path / "copy.zarr")
    shutil.copytree(run_url, url)
    before = open_store(url)
    expected = before.arrays("basic")
    # simulate step (1) of a commit that never reached step (2): a complete new generation
    store = RunStore(url)
    from zarr.core.sync import sync

    import relulearn.storage.generation as st

    sync(st._write_generation(url, "g999999", {"basic": {"xx": (("i", "j"), np.zeros((6, 6)))}}))
    after = open_store(url)
    assert after.head == before.head
    got = after.arrays("basic")
    assert all(np.array_equal(got[k], expected[k]) for k in expected)
    # a commit killed even earlier leaves chunk files without group metadata
    stray = Path(url) / "g999998" / "basic" / "xx" / "c"
    stray.mkdir(parents=True)
    (stray / "0").write_bytes(b"partial")
    assert open_store(url).head == before.head
    # the next writer removes both leftovers
    store.clean()
    assert not (Path(url) / "g999999").exists() and not (Path(url) / "g999998").exists()


def test_a_commit_keeps_the_generation_it_replaced_until_the_next_commit(run_url, tmp_path):
    """Each commit deletes the generations before the one it replaced: that one stays (a reader that started
    on it has a whole commit to finish) and is still whole and readable; ``clean`` (the writer, when done)
    leaves the head alone, as a finished run leaves its store."""
    import shutil

    url = tmp_path / "copy.zarr"
    shutil.copytree(run_url, url)
    store = RunStore(str(url))
    first = store.head()
    assert [p.name for p in url.glob("g*")] == [first]  # a finished run: one generation
    meta = {k: v for k, v in store.meta().items() if k != "head"}
    _, groups = store.read_head(["basic", "ledger"])
    heads = [first]
    for _ in range(3):
        heads.append(store.commit(meta, groups))
        assert sorted(p.name for p in url.glob("g*")) == heads[-2:]
    # the kept generation is whole: each of its arrays as committed
    kept = xr.open_zarr(url, group=f"{heads[-2]}/basic", consolidated=False)
    assert np.array_equal(kept["sum_xx"].values, groups["basic"]["sum_xx"][1])
    store.clean()
    assert [p.name for p in url.glob("g*")] == [heads[-1]]


def test_fsspec_memory_url_store():
    """Any fsspec URL zarr accepts is a store location (here the in-memory filesystem)."""
    cfg = make_config(samples=20_000)
    url = "memory://relulearn-test/run.zarr"
    estimate(cfg, url, progress=None)
    estimate(cfg, url, samples=40_000, progress=None)
    run = open_store(url)
    assert run.samples == 40_000
    mean, se = run.estimate("basic", "xx")
    assert mean.shape == (6, 6) and np.all(se > 0)


def test_merge_adds_sums_and_shrinks_standard_errors(tmp_path):
    stats = {
        "basic": {},
        "contracted": {"orders": [2, 4], "directions": 2, "directions_seed": 5},
        "filtered": {"thresholds": [0.1, 0.5]},
    }
    a, b, c = (str(tmp_path / f"{n}.zarr") for n in "abc")
    estimate(make_config(seed=1, statistics=stats), a, progress=None)
    estimate(make_config(seed=2, statistics=stats), b, progress=None)
    out = relulearn("merge", a, b, "--out", c, "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["seeds"] == [1, 2] and info["samples"] == 80_000
    ra, rb, rc = open_store(a), open_store(b), open_store(c)
    for stat in ("basic", "contracted", "filtered"):
        xa, xb, xc = ra.arrays(stat), rb.arrays(stat), rc.arrays(stat)
        for k in xa:
            if k.startswith(("sum_", "sumsq_")):
                assert np.array_equal(xc[k], xa[k] + xb[k]), f"{stat}/{k}"
    # twice the samples: standard errors shrink by about sqrt(2) (median over entries)
    se_a = ra.estimate("basic", "xx")[1]
    se_c = rc.estimate("basic", "xx")[1]
    assert 1.15 < np.median(se_a / se_c) < 1.75
    # the merged ledger holds both seeds' chunks, each once
    ledger = rc.ledger()
    for seed in (1, 2):
        rows = ledger[ledger[:, 0] == seed]
        assert rows[:, 1].min() == 0 and (rows[:, 2] - rows[:, 1]).sum() == 8
    status = relulearn("status", c, "--json")
    assert json.loads(status.stdout)["seeds"] == [1, 2]
    # a merged store cannot be extended (it has no single seed), and is left as it was
    from relulearn.storage import StoreError

    with pytest.raises(StoreError, match="merge of runs with seeds"):
        estimate(make_config(seed=1, statistics=stats), c, samples=100_000, progress=None)
    assert open_store(c).samples == 80_000


def test_status_json(run_url):
    out = relulearn("status", run_url, "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["samples"] == 40_000 and info["chunks"] == 8 and info["complete"] is True
    assert info["statistics"] == ["basic", "hermite", "contracted", "filtered"]
    assert info["format_version"] == FORMAT_VERSION and info["blocks"] == 4


def test_first_commit_in_progress_reads_as_an_empty_store(tmp_path):
    """While the first commit writes the root document, zarr's LocalStore holds it in a
    temporary ``zarr.<hex>.partial`` file: a reader (``status``, a polling script) must see
    an empty store, not "not a relulearn store", and the next writer removes a stale one."""
    url = tmp_path / "s.zarr"
    (url / "g000000").mkdir(parents=True)
    stale = url / "zarr.93a0e48307894e8a9dd64cadc8de9dd0.partial"
    stale.write_text("{")
    assert RunStore(str(url)).meta() is None
    (url / "notes.txt").write_text("mine")  # anything else is still refused
    with pytest.raises(Exception, match="not a relulearn store"):
        RunStore(str(url)).meta()
    (url / "notes.txt").unlink()
    estimate(make_config(samples=10_000), str(url), client=None, progress=None)
    assert open_store(str(url)).samples == 10_000
    assert not stale.exists() and sorted(p.name for p in url.iterdir()) == ["g000000", "zarr.json"]


#: d = 20, a commit after every one-chunk block: 24 commits, so that a reader slowed by a loaded machine still
#: reads while several of them happen
COMMITS = {
    "seed": 11,
    "samples": 48_000,
    "chunk_size": 2_000,
    "source": {"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 3}, "noise_std": 0.1},
    "statistics": {
        "basic": {},
        "contracted": {"orders": [2, 4], "directions": 2},
        "filtered": {"quantiles": [0.5, 0.9]},
    },
    "run": {"chunks_per_block": 1, "commit_interval": 0},
}


def test_readers_see_whole_commits_while_a_writer_commits(tmp_path):
    """While `relulearn estimate` commits after every block, the root document always parses (it is replaced
    by rename), and every read of a generation, taken while commits delete the one before, holds the arrays
    its head claims: the sample count, the ledger and the sums agree (a chunk deleted under a reader would
    read as zeros). A commit on a memory file system takes less time than a read: every read still returns a
    whole committed generation (checked against its manifest), where it used to be refused after ten tries."""
    cfg_path = write_config(tmp_path / "run.yaml", COMMITS)
    url = str(tmp_path / "run.zarr")
    heads: set[str] = set()
    reads = 0
    # the run is extended (a writer again, 24 more commits) until the reads have met three distinct commits: a
    # reader slowed by a loaded machine may see only the first and the last of one writer's
    for extension in range(4):
        samples = COMMITS["samples"] * (extension + 1)
        writer = subprocess.Popen(
            [PYTHON, "-m", "relulearn.cli", "estimate", str(cfg_path), "--store", url, "--in-process", "--quiet"]
            + ["--samples", str(samples)],
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        reads += _read_while_writing(url, writer, first=extension == 0, heads=heads)
        assert writer.returncode == 0, writer.stderr.read()
        if len(heads) >= 3:
            break
    print(f"{reads} reads of {len(heads)} distinct commits")
    assert len(heads) >= 3, heads


def _read_while_writing(url: str, writer: subprocess.Popen, *, first: bool, heads: set[str]) -> int:
    """Reads of the store while ``writer`` runs, each checked whole (the heads read added to ``heads``)."""
    from relulearn import api

    root = Path(url) / "zarr.json"
    deadline = time.monotonic() + 120
    while not root.exists():
        assert writer.poll() is None and time.monotonic() < deadline, writer.stderr.read()
        time.sleep(0.02)
    if first:
        lease = api.status(url)["lease"]
        if writer.poll() is None:  # running after the status, so during it, holding its lease: status names it
            assert lease is not None and lease["pid"] == writer.pid, lease
    reads = 0
    while writer.poll() is None:
        json.loads(root.read_bytes())  # never a half-written document
        meta, groups = RunStore(url).read_head(["basic", "filtered", "ledger"])
        ledger = groups["ledger"]
        chunks = int((ledger["chunk_stop"][1] - ledger["chunk_start"][1]).sum())
        assert chunks * COMMITS["chunk_size"] == meta["samples"] > 0
        for stat in ("basic", "filtered"):
            assert int(groups[stat]["count"][1]) == meta["samples"]
        basic = groups["basic"]
        assert basic["sum_xx"][1].any() and np.array_equal(basic["xx"][1], basic["sum_xx"][1] / meta["samples"])
        heads.add(meta["head"])
        reads += 1
    return reads
    # the writer, done, removed the generation its last commit replaced
    assert [p.name for p in Path(url).glob("g*")] == [RunStore(url).head()]


def test_a_store_whose_chunks_are_named_with_slashes_reads_verifies_and_extends(tmp_path, monkeypatch):
    """Stores written before chunks were named ``c.0.1`` name them ``c/0/1`` (zarr's default key encoding with
    separator "/", a folder per index). Such a store (its first commit written that way here) verifies intact,
    reads, and extends; the extension's generation names them with "."; the arrays are bitwise those of a run
    never written the old way."""
    from stores import assert_bitwise_equal

    import relulearn.storage.generation as generation
    import relulearn.storage.integrity as integrity
    from relulearn import api

    cfg = make_config(samples=40_000)
    old, new = str(tmp_path / "old.zarr"), str(tmp_path / "new.zarr")
    array_doc = generation._array_doc

    def slash_doc(*args, **kwargs):
        return dict(
            array_doc(*args, **kwargs), chunk_key_encoding={"name": "default", "configuration": {"separator": "/"}}
        )

    with monkeypatch.context() as m:  # the writer as it was
        m.setattr(generation, "_array_doc", slash_doc)
        m.setattr(integrity, "chunk_key", lambda coords: "/".join(["c", *map(str, coords)]))
        estimate(cfg, old, samples=20_000, progress=None, commit_interval=1e9)
    head = open_store(old).head
    assert (Path(old) / head / "basic" / "sum_xx" / "c" / "0" / "0").is_file()
    report = api.verify(old)
    assert report["intact"] and report["checksums"] and not report["damaged"], report
    estimate(cfg, old, progress=None, commit_interval=1e9)  # extended to 40,000 samples by the current writer
    head = open_store(old).head
    assert (Path(old) / head / "basic" / "sum_xx" / "c.0.0").is_file()
    assert not (Path(old) / head / "basic" / "sum_xx" / "c").exists()
    estimate(cfg, new, progress=None, commit_interval=1e9)
    assert_bitwise_equal(old, new)
    assert api.verify(old)["intact"]
