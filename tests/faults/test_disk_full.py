"""A full disk: every write names the path it could not write, leaves no temporary file, and changes nothing it
was not done writing. The disk is a real tmpfs of a few kB, mounted for the test (root only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from relulearn.network import Network

from conftest import relulearn

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")

RUN = {
    "seed": 3,
    "samples": 20_000,
    "chunk_size": 10_000,
    "source": {"d": 4, "teacher": {"kind": "one_hidden_relu", "width": 2}},
    "statistics": {"basic": {}},
}


@pytest.fixture
def small_disk(tmp_path):
    """A 64 kB tmpfs: room for a lease and the start of a store, not for a store."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def fill(disk: Path) -> None:
    """Every byte of the disk taken by one file."""
    with open(disk / "filler", "wb") as f, pytest.raises(OSError, match="No space left"):
        f.write(bytes(1 << 20))


def left(disk: Path) -> list[str]:
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*"))


@pytest.fixture
def two_stores(tmp_path) -> tuple[Path, Path]:
    stores = []
    for seed in (3, 4):
        cfg = tmp_path / f"run{seed}.yaml"
        cfg.write_text(yaml.safe_dump(dict(RUN, seed=seed)))
        store = tmp_path / f"s{seed}.zarr"
        assert relulearn("estimate", cfg, "--store", store, "--in-process", "-q").returncode == 0
        stores.append(store)
    return stores[0], stores[1]


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relulearn: error: "), done.stderr
    return lines[0]


def test_a_merge_on_a_full_disk_names_the_lease_and_leaves_nothing(small_disk, two_stores):
    """Not even the lease fits: it was `[Errno 28] No space left on device` and an empty lease.json.*.tmp in a
    new folder; now the lease's path is named, and neither the file nor the folder made for it stays."""
    fill(small_disk)
    out = small_disk / "m.zarr"
    line = one_line(relulearn("merge", *two_stores, "--out", out))
    assert f"cannot write the lease {out / 'lease.json'}: no space left on its device; free space there" in line
    assert left(small_disk) == ["filler"]


def test_a_merge_whose_store_does_not_fit_names_the_store_and_leaves_nothing(small_disk, two_stores):
    """The lease fits, the merged store does not: the store is named, and the lease, its temporary files, the
    unfinished generation and the folder made for them are gone: the disk is as the merge found it."""
    out = small_disk / "m.zarr"
    line = one_line(relulearn("merge", *two_stores, "--out", out))
    assert line.endswith(
        f"cannot write the store at {out}: no space left on its device; free space there and run the same command "
        "again (nothing was merged)"
    ), line
    assert left(small_disk) == []


def test_an_estimate_on_a_full_disk_names_the_lease_and_leaves_nothing(small_disk, tmp_path):
    """(A store's commit on a full disk: tests/pipeline/test_resume.py.)"""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(RUN))
    fill(small_disk)
    store = small_disk / "s.zarr"
    line = one_line(relulearn("estimate", cfg, "--store", store, "--in-process", "-q"))
    assert f"cannot write the lease {store / 'lease.json'}: no space left on its device" in line
    assert left(small_disk) == ["filler"]


def test_a_first_commit_that_does_not_fit_names_the_store_and_leaves_nothing(small_disk, tmp_path):
    """The lease fits, the first commit does not: the store is named with what is safe (nothing yet), and its
    unfinished generation, the lease and the folder made for them are gone: the disk is as the run found it."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(dict(RUN, source=dict(RUN["source"], d=16), statistics={"hermite": {"max_order": 4}}))
    )
    store = small_disk / "s.zarr"
    line = one_line(relulearn("estimate", cfg, "--store", store, "--in-process", "-q"))
    assert f"The store {store} is intact at its last commit: 0 samples are committed" in line, line
    assert "No space left on device" in line and "run the same command to resume" in line, line
    assert left(small_disk) == []


def test_a_prediction_on_a_full_disk_names_its_file_and_keeps_the_old_one(small_disk, tmp_path):
    model = tmp_path / "m.npz"
    Network((np.eye(4), np.ones((1, 4))), activation="relu").save(model)
    x = tmp_path / "x.npy"
    np.save(x, np.ones((10_000, 4)))  # 80 kB of predictions: more than the disk
    out = small_disk / "p.npy"
    out.write_bytes(b"the old predictions")
    line = one_line(relulearn("predict", model, "--input", x, "--out", out))
    assert (
        line == f"relulearn: error: could not write {out} (it is unchanged): No space left on device; free space there"
    )
    assert out.read_bytes() == b"the old predictions"
    assert left(small_disk) == ["p.npy"]
