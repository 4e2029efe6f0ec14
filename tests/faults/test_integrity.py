"""Trust the store: damage is found, named and refused, and the store is left as it was.

One committed store with all four statistic families (d = 16) is copied for every case; a fault is injected
into one object — a flipped byte, a truncated file, a deleted file — of each kind the store has: a chunk of
``basic``, ``hermite``, ``contracted``, ``filtered`` and the ``ledger``, an array's metadata document, and the
root metadata. Each time ``verify`` names the array and the chunk (or document), ``estimate`` (extend) and
``learn`` refuse naming them, and every file of the store is bitwise what it was. Everything runs in-process
(real zarr stores in tmp_path); a few cases go through the command line to check exit codes and messages.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from stores import assert_bitwise_equal

from relulearn import api, open_store
from relulearn.config import config_from_dict
from relulearn.storage import FORMAT_VERSION, NotAStoreError, RunStore, StoreDamagedError
from relulearn.storage.integrity import _crc32c

from test_errors import assert_user_error, cli, cli_each, config, snapshot, write_yaml

#: the errors tests' run (all four statistic families) at d = 16: 4 chunks in 2 blocks, a commit after each
RUN = config(**{"seed": 5, "samples": 8_000, "chunk_size": 2_000, "source.d": 16})
MORE = 12_000  # samples asked for by an extension

#: one object of each kind the store has: (array or document owner, key relative to the head generation;
#: None for the root document)
TARGETS = {
    "basic": ("basic/sum_xx", "basic/sum_xx/c.0.0"),
    "hermite": ("hermite/sum_raw3", "hermite/sum_raw3/c.0"),
    "contracted": ("contracted/sum_M", "contracted/sum_M/c.0.0.0"),
    "filtered": ("filtered/sum_bin_xx", "filtered/sum_bin_xx/c.0.0.0"),
    "ledger": ("ledger/chunk_stop", "ledger/chunk_stop/c.0"),
    "array-metadata": ("basic/sum_xx", "basic/sum_xx/zarr.json"),
    "root-metadata": ("root", None),
}
MODES = ("flip", "truncate", "delete")


def damage(path: Path, mode: str) -> None:
    """Flip one bit in the middle of the file, cut it to half its length, or delete it."""
    if mode == "delete":
        path.unlink()
        return
    data = bytearray(path.read_bytes())
    if mode == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """The committed store of RUN, and one of another seed (for merges); tests copy them."""
    d = tmp_path_factory.mktemp("integrity")
    out = {}
    for name, seed in (("base", 5), ("seed6", 6)):
        out[name] = d / f"{name}.zarr"
        api.estimate(config_from_dict(dict(RUN, seed=seed)), str(out[name]), client="local", progress=None)
    return out


@pytest.fixture
def copy(stores, tmp_path) -> Path:
    path = tmp_path / "run.zarr"
    shutil.copytree(stores["base"], path)
    return path


def _head(path: Path) -> str:
    return json.loads((path / "zarr.json").read_text())["attributes"]["relulearn"]["head"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(TARGETS))
def test_damage_is_named_and_refused_and_the_store_is_left_as_it_was(copy, tmp_path, kind, mode):
    array, rel = TARGETS[kind]
    head = _head(copy)
    key = "zarr.json" if rel is None else f"{head}/{rel}"
    chunk = "" if rel is None or rel.endswith("zarr.json") else rel.removeprefix(f"{array}/")
    assert (copy / key).is_file()
    damage(copy / key, mode)
    before = snapshot(copy)
    url = str(copy)

    # verify names the array and the chunk (or the document) and its file
    report = api.verify(url)
    assert report["intact"] is False
    named = [d for d in report["damaged"] if d["array"] == array and d["key"] == key and d["chunk"] == chunk]
    assert named, report["damaged"]
    if kind != "root-metadata" or mode == "flip":  # (no other object is reported damaged)
        assert {(d["array"], d["key"]) for d in report["damaged"]} == {(array, key)}, report["damaged"]
    if chunk:
        assert [a["status"] for a in report["arrays"] if a["array"] == array] == ["damaged"]
        assert all(a["status"] == "ok" for a in report["arrays"] if a["array"] != array)
        expected = {"delete": "is missing", "truncate": "is truncated", "flip": "fails its crc32c"}[mode]
        assert named[0]["problem"].startswith(expected), named

    # status: a lost or damaged root is a damaged store; a missing or truncated object shows in one listing
    if kind == "root-metadata":
        with pytest.raises(StoreDamagedError, match="root metadata"):
            api.status(url)
    elif mode != "flip":  # (a flipped byte needs every byte read: verify)
        assert [(d["array"], d["key"]) for d in api.status(url)["damaged"]] == [(array, key)]

    # estimate (extend) and learn refuse, naming the same object; nothing is used, nothing is written
    needles = [f"file {key}", "restore the store from a copy", f"relulearn verify {url}"]
    needles += [f"array {array}, chunk {chunk}"] if chunk else []
    with pytest.raises(StoreDamagedError) as refused:
        api.estimate(config_from_dict(RUN), url, samples=MORE, client="local", progress=None)
    assert all(n in str(refused.value) for n in needles), str(refused.value)
    assert "\n" not in str(refused.value)
    out = tmp_path / "model.npz"
    with pytest.raises(StoreDamagedError) as refused:
        api.learn(url, "moments", out=str(out), client="local", progress=None)
    assert all(n in str(refused.value) for n in needles), str(refused.value)
    assert not out.exists()
    after = snapshot(copy)
    assert sorted(after) == sorted(before) and all(after[k] == before[k] for k in before)


def test_an_intact_store_verifies_and_extends(copy):
    url = str(copy)
    report = api.verify(url)
    assert report["intact"] and report["checksums"] and report["root"] == "ok" and not report["damaged"]
    arrays = {a["array"] for a in report["arrays"]}
    assert {a for a, _ in TARGETS.values()} - {"root"} <= arrays
    assert {a.split("/")[0] for a in arrays} == {"basic", "hermite", "contracted", "filtered", "ledger"}
    # chunk files c.0.1 (c alone for a 0-d array)
    chunks = [p for p in copy.glob(f"{_head(copy)}/*/*/c*") if re.fullmatch(r"c(\.\d+)*", p.name) and p.is_file()]
    assert sum(a["chunks"] for a in report["arrays"]) == len(chunks)
    # every chunk ends with the CRC-32C of its bytes
    chunk = copy / _head(copy) / "basic" / "sum_xx" / "c.0.0"
    data = chunk.read_bytes()
    assert len(data) == 16 * 16 * 8 + 4 and _crc32c(data[:-4]) == data[-4:]
    # a checked read decodes the chunk bytes it checked: every array, dtype and shape as zarr itself reads it
    groups = ["ledger", "basic", "hermite", "contracted", "filtered"]
    meta, read = RunStore(url).read_head(groups)
    head = zarr.open_group(url, mode="r")[meta["head"]]
    for g in groups:
        assert sorted(read[g]) == sorted(head[g].array_keys())
        for name, (_, values) in read[g].items():
            want = head[g][name][...]
            assert values.dtype == want.dtype and np.array_equal(values, want, equal_nan=True), (g, name)
    summary = api.estimate(config_from_dict(RUN), url, samples=MORE, client="local", progress=None)
    assert summary.resumed_from_samples == RUN["samples"] and summary.samples == MORE
    assert api.verify(url)["intact"] and api.status(url)["checksums"] is True


def test_merge_refuses_a_damaged_store_and_writes_nothing(stores, copy, tmp_path):
    damage(copy / _head(copy) / "ledger" / "seed" / "c.0", "delete")
    before = snapshot(copy)
    out = tmp_path / "merged.zarr"
    with pytest.raises(
        StoreDamagedError,
        match=r"array ledger/seed, chunk c\.0 \(file g\d{6}/ledger/seed/c\.0\) "
        r"is missing",
    ):
        api.merge(str(copy), str(stores["seed6"]), str(out))
    assert not out.exists() and snapshot(copy) == before


def test_the_command_line_names_the_damage(copy, tmp_path):
    """verify: a table naming the array and chunk, exit code 1 (0 when intact); estimate and learn: one line on
    stderr, exit code 2; status of a store without its root metadata says it is damaged."""
    intact = tmp_path / "intact.zarr"
    shutil.copytree(copy, intact)
    head = _head(copy)
    damage(copy / head / "contracted" / "sum_M" / "c.0.0.0", "truncate")
    rootless = tmp_path / "rootless.zarr"
    shutil.copytree(intact, rootless)
    (rootless / "zarr.json").unlink()
    before = {p: snapshot(p) for p in (copy, rootless)}
    cfg = write_yaml(tmp_path / "run.yaml", RUN)
    procs = cli_each(
        ("verify", copy),
        ("verify", intact),
        ("verify", copy, "--json"),
        ("estimate", cfg, "--store", copy, "--in-process", "--samples", MORE),
        ("learn", copy, "--in-process", "--out", tmp_path / "m.npz"),
        ("status", rootless),
        ("estimate", cfg, "--store", rootless, "--in-process"),
        ("verify", rootless),
    )
    verify_bad, verify_ok, verify_json, extend, learn, status, start, verify_rootless = procs
    assert verify_bad.returncode == 1, verify_bad.stderr
    row = [line for line in verify_bad.stdout.splitlines() if line.startswith("contracted/sum_M ")]
    assert len(row) == 1 and "DAMAGED: chunk c.0.0.0" in row[0] and f"{head}/contracted/sum_M/c.0.0.0" in row[0]
    assert "is truncated" in row[0] and "restore the store from a copy" in verify_bad.stdout
    assert sum(" ok" in line for line in verify_bad.stdout.splitlines()) > 70  # every other array: ok
    assert verify_ok.returncode == 0 and "intact:" in verify_ok.stdout, verify_ok.stdout + verify_ok.stderr
    report = json.loads(verify_json.stdout)
    assert verify_json.returncode == 1 and report["intact"] is False
    assert [(d["array"], d["chunk"]) for d in report["damaged"]] == [("contracted/sum_M", "c.0.0.0")]
    for proc in (extend, learn):
        err = assert_user_error(
            proc,
            "is a damaged relulearn store",
            "array contracted/sum_M, chunk c.0.0.0",
            f"file {head}/contracted/sum_M/c.0.0.0",
            "is truncated",
            "restore the store",
        )
        assert len(err.strip().splitlines()) == 1, err
    for proc in (status, start):
        err = assert_user_error(
            proc,
            f"{rootless} is a damaged relulearn store",
            f"it holds {head}/",
            "root metadata (file zarr.json) is missing",
            "--new-store-here",
        )
        assert "no relulearn store" not in err and len(err.strip().splitlines()) == 1
    assert verify_rootless.returncode == 1 and "zarr.json is missing" in verify_rootless.stdout
    status = cli("status", copy)
    assert (
        status.returncode == 0
        and "DAMAGED      1 object(s) missing or truncated, e.g. array contracted/sum_M, "
        f"chunk c.0.0.0 (file {head}/contracted/sum_M/c.0.0.0) is truncated"
        in status.stdout
    ), status.stdout
    assert not (tmp_path / "m.npz").exists()
    for p, snap in before.items():
        assert snapshot(p) == snap, p


# -------------------------------------------------------------- a lost root document


def test_a_lost_root_is_refused_then_set_aside_never_deleted(copy, tmp_path):
    """Without its root zarr.json a committed store is refused (not restarted from 0, which deleted its
    generation); --new-store-here starts over and keeps the old data, byte for byte, under set-aside-*/."""
    url = str(copy)
    head = _head(copy)
    (copy / "zarr.json").unlink()
    before = snapshot(copy)
    for call in (
        lambda: api.status(url),
        lambda: open_store(url),
        lambda: api.estimate(config_from_dict(RUN), url, client="local", progress=None),
    ):
        with pytest.raises(StoreDamagedError, match="root metadata .file zarr.json. is missing"):
            call()
    assert snapshot(copy) == before
    summary = api.estimate(config_from_dict(RUN), url, client="local", progress=None, new_store_here=True)
    assert summary.resumed_from_samples == 0 and summary.samples == RUN["samples"]
    folder = Path(summary.set_aside["folder"])
    assert folder.parent == copy and folder.name.startswith("set-aside-") and summary.set_aside["moved"] == [head]
    kept = {
        k.removeprefix(f"{folder.name}/"): v
        for k, v in snapshot(copy).items()
        if k.startswith(f"{folder.name}/") and k != f"{folder.name}/"
    }
    assert kept == before  # the damaged store's data, as it was
    assert api.verify(url)["intact"] and open_store(url).samples == RUN["samples"]
    # the new store is bitwise the store of a clean run
    clean = tmp_path / "clean.zarr"
    api.estimate(config_from_dict(RUN), str(clean), client="local", progress=None)
    assert_bitwise_equal(url, str(clean))


def test_the_command_line_warns_of_what_it_set_aside_unless_quiet(copy, tmp_path):
    """estimate --new-store-here on a store without its root: a warning names what was moved and where
    (the progress lines beside it); with -q, nothing on stderr."""
    head = _head(copy)
    (copy / "zarr.json").unlink()
    quiet = tmp_path / "quiet.zarr"
    shutil.copytree(copy, quiet)
    cfg = write_yaml(tmp_path / "run.yaml", RUN)
    loud = cli("estimate", cfg, "--store", copy, "--in-process", "--new-store-here")
    assert loud.returncode == 0, loud.stderr
    (folder,) = [p for p in copy.iterdir() if p.name.startswith("set-aside-")]
    warning = f"relulearn: warning: set aside the damaged store's data ({head}) in {folder}; nothing was deleted"
    assert loud.stderr.splitlines()[0] == warning, loud.stderr
    done = cli("estimate", cfg, "--store", quiet, "--in-process", "--new-store-here", "-q")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert len([p for p in quiet.iterdir() if p.name.startswith("set-aside-")]) == 1


def test_a_single_commit_store_without_root_is_damaged_but_an_interrupted_first_commit_is_not(tmp_path):
    """A store with one commit holds only g000000: without its root it is refused. A first commit that
    never completed (its generation's group document is written last) or whose writer left its lease (killed
    during the first commit) still reads as no run, and the next run starts over."""
    url = tmp_path / "one.zarr"
    api.estimate(config_from_dict(RUN), str(url), client="local", progress=None, commit_interval=1e9)
    assert sorted(p.name for p in url.iterdir()) == ["g000000", "zarr.json"]
    (url / "zarr.json").unlink()
    with pytest.raises(StoreDamagedError, match=r"it holds g000000/"):
        RunStore(str(url)).meta()
    (url / "lease.json").write_text("{}")  # a writer killed during its first commit leaves its lease
    assert RunStore(str(url)).meta() is None
    (url / "lease.json").unlink()
    # --new-store-here sets it aside (under its own lease, which is no sign of a first commit under way)
    kept = snapshot(url / "g000000")
    summary = api.estimate(config_from_dict(RUN), str(url), client="local", progress=None, new_store_here=True)
    assert summary.set_aside["moved"] == ["g000000"]
    assert snapshot(Path(summary.set_aside["folder"]) / "g000000") == kept
    shutil.rmtree(url)
    api.estimate(config_from_dict(RUN), str(url), client="local", progress=None, commit_interval=1e9)
    (url / "zarr.json").unlink()
    (url / "g000000" / "zarr.json").unlink()  # the first commit did not finish its generation
    assert RunStore(str(url)).meta() is None
    api.estimate(config_from_dict(RUN), str(url), client="local", progress=None)
    assert open_store(str(url)).samples == RUN["samples"] and api.verify(str(url))["intact"]


def test_a_folder_of_other_files_needs_the_flag_and_keeps_them(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    with pytest.raises(NotAStoreError, match="--new-store-here"):
        api.estimate(config_from_dict(RUN), str(folder), client="local", progress=None)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    summary = api.estimate(config_from_dict(RUN), str(folder), client="local", progress=None, new_store_here=True)
    assert summary.set_aside is None and (folder / "notes.txt").read_text() == "mine\n"
    assert api.verify(str(folder))["intact"] and open_store(str(folder)).samples == RUN["samples"]


# ------------------------------------------------------------ stores written before checksums


def _strip_checksums(path: Path) -> None:
    """Rewrite a store as relulearn wrote it before checksums: codecs [bytes], chunks without their crc32c,
    no manifest in the root metadata."""
    head = _head(path)
    for doc_path in (path / head).rglob("zarr.json"):
        doc = json.loads(doc_path.read_text())
        if doc["node_type"] == "array":
            doc["codecs"] = doc["codecs"][:1]
            doc_path.write_text(json.dumps(doc, indent=1))
            for chunk in (doc_path.parent).rglob("*"):
                if chunk.is_file() and chunk.name != "zarr.json":
                    chunk.write_bytes(chunk.read_bytes()[:-4])
    root = json.loads((path / "zarr.json").read_text())
    del root["attributes"]["relulearn"]["integrity"]
    for doc in root["consolidated_metadata"]["metadata"].values():
        if doc["node_type"] == "array":
            doc["codecs"] = doc["codecs"][:1]
    (path / "zarr.json").write_text(json.dumps(root, indent=1))


def test_a_store_written_before_checksums_is_read_checked_for_missing_chunks_and_upgraded(copy, stores, tmp_path):
    legacy = tmp_path / "legacy.zarr"
    shutil.copytree(copy, legacy)
    _strip_checksums(legacy)
    head = _head(legacy)
    assert open_store(str(legacy)).meta["format_version"] == FORMAT_VERSION and not api.status(str(legacy))["checksums"]
    report = api.verify(str(legacy))
    assert report["intact"] and report["checksums"] is False
    np.testing.assert_array_equal(
        open_store(str(legacy)).arrays("basic")["sum_xx"], open_store(str(copy)).arrays("basic")["sum_xx"]
    )
    # what can be found without checksums: missing and truncated chunks
    for mode, problem in (("delete", "is missing"), ("truncate", "is truncated")):
        broken = tmp_path / f"legacy-{mode}.zarr"
        shutil.copytree(legacy, broken)
        damage(broken / head / "filtered" / "sum_bin_xx" / "c.0.0.0", mode)
        before = snapshot(broken)
        assert [(d["array"], d["chunk"], d["problem"].split(" (")[0]) for d in api.verify(str(broken))["damaged"]] == [
            ("filtered/sum_bin_xx", "c.0.0.0", problem)
        ]
        with pytest.raises(StoreDamagedError, match=rf"array filtered/sum_bin_xx, chunk c\.0\.0\.0 .* {problem}"):
            api.estimate(config_from_dict(RUN), str(broken), samples=MORE, client="local", progress=None)
        assert snapshot(broken) == before
    # extending it writes a generation with checksums, bitwise the extension of a store that had them
    api.estimate(config_from_dict(RUN), str(legacy), samples=MORE, client="local", progress=None)
    api.estimate(config_from_dict(RUN), str(copy), samples=MORE, client="local", progress=None)
    report = api.verify(str(legacy))
    assert report["intact"] and report["checksums"] is True
    assert_bitwise_equal(str(legacy), str(copy))
