"""Readers of a store being written: every read through one handle (``open_store``, ``open_datatree``, ``report``)
is one whole commit, or a clear refusal when later commits deleted it; never two commits mixed, never zeros."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from stores import write_config

from relulearn import open_datatree, open_store
from relulearn.pipeline.run import estimate
from relulearn.storage import RunStore, StoreDamagedError, StoreMovedError, read_one_commit

from conftest import PYTHON, cli_env, make_config, relulearn


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    url = str(tmp_path_factory.mktemp("readers") / "run.zarr")
    estimate(make_config(samples=20_000), url, progress=None, commit_interval=1e9)
    return url


def _commit_doubled(url: str) -> str:
    """A commit of the store's statistics with every ``basic`` array and the sample count doubled (what an
    extension by as many samples would commit, in shape): each commit's values differ from the one before."""
    store = RunStore(url)
    meta, groups = store.read_head(["basic", "hermite", "contracted", "filtered", "ledger"])
    meta = {k: v for k, v in meta.items() if k != "head"}
    meta["samples"] *= 2
    groups["basic"] = {k: (dims, v * 2) for k, (dims, v) in groups["basic"].items()}
    return store.commit(meta, groups)


def test_a_handle_reads_the_commit_it_opened_then_refuses_once_later_commits_deleted_it(small, tmp_path):
    """A handle opened before a commit reads the commit it opened (the generation a commit replaced stays until
    the next one), its lazy xarray views too, bitwise; after a second commit deleted it, every read through the
    handle — arrays, all_arrays, estimate, ledger, platforms, a dataset or a tree loaded late — refuses in one
    line naming the commits, where it used to read the newer commit's arrays under the older ``samples``, or
    zeros, or raise a bare KeyError. A store opened again reads the newest commit."""
    url = str(tmp_path / "run.zarr")
    shutil.copytree(small, url)
    run = open_store(url)
    tree = open_datatree(url)  # lazy: its values are read on use
    before = run.all_arrays()
    ledger = run.ledger()
    assert int(before["basic"]["count"]) == run.samples == 20_000

    first = _commit_doubled(url)  # the handle's generation is kept until the next commit
    assert run.head == "g000000" and first == "g000001"
    got = run.arrays("basic")
    assert sorted(got) == sorted(before["basic"])
    assert all(np.array_equal(got[k], before["basic"][k]) for k in got)
    assert np.array_equal(run.ledger(), ledger)
    assert np.array_equal(tree["basic"]["sum_xx"].values, before["basic"]["sum_xx"])
    assert int(tree["basic"]["count"].values) == tree.attrs["samples"] == 20_000

    _commit_doubled(url)  # deletes g000000
    assert not (Path(url) / "g000000").exists()
    expected = f"the store at {url} moved on to a newer commit (g000000, 20,000 samples → g000002, 80,000 samples)"
    reads = {
        "arrays": lambda: run.arrays("filtered"),
        "all_arrays": run.all_arrays,
        "estimate": lambda: run.estimate("basic", "xx"),
        "ledger": run.ledger,
        "platforms": run.platforms,
        "dataset": lambda: run.dataset("contracted").load(),
        "tree": lambda: tree["hermite"].to_dataset().load(),
    }
    for name, read in reads.items():
        with pytest.raises(StoreMovedError) as err:
            read()
        assert str(err.value).startswith(expected), (name, str(err.value))
        assert "\n" not in str(err.value)
    # the refusal crosses processes (a dask worker loading a view raises it)
    again = pickle.loads(pickle.dumps(err.value))
    assert type(again) is StoreMovedError and str(again) == str(err.value)

    now = open_store(url)
    assert now.head == "g000002" and now.samples == 80_000
    assert np.array_equal(now.arrays("basic")["sum_xx"], 4 * before["basic"]["sum_xx"])
    assert np.array_equal(open_datatree(url)["basic"]["sum_xx"].values, 4 * before["basic"]["sum_xx"])


@pytest.mark.slow
def test_a_tree_loaded_on_dask_workers_reads_its_commit_or_refuses_there(small, tmp_path, client):
    """With a distributed client, a tree's values are read on the workers (the pinned view travels with the
    tasks): the commit it opened, bitwise, then the refusal raised on a worker once later commits deleted it."""
    url = str(tmp_path / "run.zarr")
    shutil.copytree(small, url)
    expected = open_store(url).arrays("contracted")
    tree = open_datatree(url)
    _commit_doubled(url)
    got = client.compute(tree["contracted"].to_dataset()["M"].data).result()
    assert np.array_equal(got, expected["M"])
    _commit_doubled(url)
    with pytest.raises(StoreMovedError, match=r"moved on to a newer commit \(g000000, 20,000 samples"):
        client.compute(tree["contracted"].to_dataset()["M_se"].data).result()


def test_a_damaged_chunk_of_the_pinned_commit_is_damage_not_a_move(small, tmp_path):
    """While the store is still at the pinned commit, a chunk missing from it is damage: the lazy view and the
    handle name the chunk (StoreDamagedError), never zeros."""
    url = str(tmp_path / "run.zarr")
    shutil.copytree(small, url)
    run = open_store(url)
    tree = open_datatree(url)
    chunk = next((Path(url) / run.head / "basic" / "sum_xx").glob("c*"))
    chunk.unlink()
    for read in (lambda: run.arrays("basic"), lambda: tree["basic"]["sum_xx"].values):
        with pytest.raises(StoreDamagedError, match=f"array basic/sum_xx, chunk {chunk.name}"):
            read()


def test_a_read_of_one_commit_opens_the_store_again_when_it_moves_on(small, tmp_path):
    """``read_one_commit`` (how ``report``, ``status`` and ``learn`` read) opens the store again when a read
    finds it moved on, a bounded number of times, then says so in one line."""
    url = str(tmp_path / "run.zarr")
    shutil.copytree(small, url)
    opened: list[str] = []

    def read(run):
        opened.append(run.head)
        if len(opened) == 1:  # two commits land between the opening and the read
            _commit_doubled(url)
            _commit_doubled(url)
        return run.samples, run.all_arrays()

    samples, stats = read_one_commit(url, read)
    assert opened == ["g000000", "g000002"] and samples == 80_000 == int(stats["basic"]["count"])

    def always_moving(run):
        _commit_doubled(url)
        _commit_doubled(url)
        return run.all_arrays()

    with pytest.raises(StoreMovedError, match="moved on to a newer commit during each of 3 reads") as err:
        read_one_commit(url, always_moving, attempts=3)

    assert "\n" not in str(err.value)  # (the last read's refusal)


def test_status_lists_no_damage_for_a_generation_a_later_commit_deleted(small, tmp_path):
    """``status`` lists the objects of its commit that one listing shows missing: those of a generation that later
    commits deleted under the listing are the store moving on (read again), not damage; a chunk missing from the
    commit the store is at is."""
    from relulearn.api.runs import _sizes

    url = str(tmp_path / "run.zarr")
    shutil.copytree(small, url)
    run = open_store(url)
    _commit_doubled(url)
    _commit_doubled(url)
    with pytest.raises(StoreMovedError, match="moved on to a newer commit"):
        _sizes(run)
    now = open_store(url)
    chunk = next((Path(url) / now.head / "filtered" / "M").glob("c*"))
    chunk.unlink()
    assert [d.key for d in _sizes(now)[1]] == [f"{now.head}/filtered/M/{chunk.name}"]
    from relulearn import api

    assert [d["key"] for d in api.status(url)["damaged"]] == [f"{now.head}/filtered/M/{chunk.name}"]


@pytest.mark.slow
def test_report_and_status_read_the_commit_their_figures_and_facts_come_from(small, tmp_path):
    """``report`` draws the spectra and states the samples of one commit, and ``status`` lists the damage of the
    commit it names: after later commits, the newest one (read again, not the one a handle opened)."""
    pytest.importorskip("matplotlib", reason="the report's figures need the report extra")
    from relulearn import api

    url = str(tmp_path / "run.zarr")
    shutil.copytree(small, url)
    for _ in range(3):
        _commit_doubled(url)
    result = relulearn("report", url, "--out", tmp_path / "report.html")
    assert result.returncode == 0, result.stderr
    assert "<td>samples</td><td>160,000</td>" in (tmp_path / "report.html").read_text()
    st = api.status(url)
    assert st["head"] == "g000003" and st["samples"] == 160_000 and st["damaged"] == []


#: a writer that commits after every chunk (d = 20: BLAS runs), many small chunks, each answered by a teacher that
#: takes a tenth of a second: commits land a little apart, so a reader meets both whole commits and refusals
#: however loaded the machine is
COMMITS = {
    "seed": 17,
    "samples": 40_000,
    "chunk_size": 1_000,
    "source": {"d": 20, "teacher": {"callable": "slow_teacher:teacher"}, "noise_std": 0.1},
    "statistics": {"basic": {}, "contracted": {"orders": [2, 4], "directions": 2}, "filtered": {"quantiles": [0.5]}},
    "run": {"chunks_per_block": 1, "commit_interval": 0},
}

SLOW_TEACHER = """
import time

import numpy as np

W = np.random.default_rng(3).standard_normal((3, 20)) / np.sqrt(20)


def teacher(x):
    time.sleep(0.1)
    return np.maximum(x @ W.T, 0.0).sum(axis=1)
"""


def _writer(cfg: Path, url: str, samples: int) -> subprocess.Popen:
    env = cli_env()
    env["PYTHONPATH"] = str(cfg.parent) + os.pathsep + env["PYTHONPATH"]  # the slow teacher beside the config
    return subprocess.Popen(
        [PYTHON, "-m", "relulearn.cli", "estimate", str(cfg), "--store", url, "--in-process", "--quiet"]
        + ["--samples", str(samples)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_handle(url: str, rng: np.random.Generator, heads: set[int]) -> bool:
    """One reader through one handle, its reads spread over commits: samples, then each family, then the
    ledger. True when they are one whole commit; raises AssertionError for a mixed read."""
    run = open_store(url)
    samples = run.samples
    counts = {}
    for family in run.statistics:
        time.sleep(rng.uniform(0, 0.01))  # commits land between the reads
        arrays = run.arrays(family)
        counts[family] = int(arrays["count"])
        if family == "basic":
            assert arrays["sum_xx"].any() and np.array_equal(arrays["xx"], arrays["sum_xx"] / samples)
    rows = run.ledger()
    ledger = int((rows[:, 2] - rows[:, 1]).sum()) * COMMITS["chunk_size"]
    assert set(counts.values()) == {samples} == {ledger}, (samples, counts, ledger)
    heads.add(samples)
    return True


def _read_tree(url: str, rng: np.random.Generator, heads: set[int]) -> bool:
    """One tree opened, then loaded a little later: the values of the commit it opened."""
    tree = open_datatree(url)
    time.sleep(rng.uniform(0, 0.02))
    samples = tree.attrs["samples"]
    for family in ("basic", "contracted", "filtered"):
        node = tree[family].to_dataset().load()
        assert int(node["count"].values) == samples, (family, int(node["count"].values), samples)
    basic = tree["basic"].to_dataset()
    assert basic["sum_xx"].values.any() and np.array_equal(basic["xx"].values, basic["sum_xx"].values / samples)
    heads.add(samples)
    return True


def _reads_while(url: str, writer: subprocess.Popen, rng: np.random.Generator, tally: dict, heads: set[int]) -> None:
    """Readers of both kinds in turn while ``writer`` runs, tallied: whole commits and refusals (a mixed read
    fails the test where it is found)."""
    while writer.poll() is None:
        read = _read_handle if (tally["whole"] + tally["refused"]) % 2 else _read_tree
        try:
            read(url, rng, heads)
            tally["whole"] += 1
        except StoreMovedError as err:
            assert "moved on to a newer commit" in str(err) and "\n" not in str(err)
            tally["refused"] += 1


@pytest.mark.slow
def test_readers_see_one_whole_commit_or_a_refusal_while_writers_commit_and_one_is_killed(small, tmp_path):
    """While ``relulearn estimate`` commits after every chunk, readers through one handle (samples, each family,
    the ledger, with pauses between the reads) and trees loaded late read one whole commit: every family's
    ``count`` and the ledger's rows equal the handle's ``samples`` and the sums are not zeros, or the read is
    refused in one line. Then a second writer extending the store is SIGKILLed at a random moment: the readers
    around the kill, and the store after it, read one whole commit."""
    rng = np.random.default_rng(51)
    cfg = write_config(tmp_path / "run.yaml", COMMITS)
    (tmp_path / "slow_teacher.py").write_text(SLOW_TEACHER)
    url = str(tmp_path / "run.zarr")
    tally, heads = {"whole": 0, "refused": 0}, set()
    _read_tree(small, rng, set())  # (the first read imports xarray's backends: a second)
    writer = _writer(cfg, url, COMMITS["samples"])
    deadline = time.monotonic() + 60
    while not (Path(url) / "zarr.json").exists():
        assert writer.poll() is None and time.monotonic() < deadline, writer.stderr.read()
        time.sleep(0.02)
    _reads_while(url, writer, rng, tally, heads)
    assert writer.returncode == 0, writer.stderr.read()
    during = dict(tally)

    killed = _writer(cfg, url, 4 * COMMITS["samples"])  # resumes the store: commits at once
    committed = open_store(url).samples
    deadline = time.monotonic() + 60
    while open_store(url).samples == committed:
        assert killed.poll() is None and time.monotonic() < deadline, killed.stderr.read()
        time.sleep(0.01)
    time.sleep(rng.uniform(0, 0.5))  # a random moment of its commits
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    for _ in range(4):  # readers around and after the kill
        assert _read_handle(url, rng, heads) and _read_tree(url, rng, heads)
    print(f"{tally['whole']} whole reads and {tally['refused']} refusals of {len(heads)} commits")
    # the reads met several commits, and some were whole while the writer committed (a read outlasting two
    # commits is refused: the writer commits every few tens of milliseconds here)
    assert during["whole"] >= 1 and sum(during.values()) >= 10 and len(heads) >= 3, (during, heads)
