"""Exact resume: killed, resumed, extended and differently-parallel runs give the same bits."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from stores import assert_bitwise_equal, assert_each_chunk_once, residual_section, store_arrays, write_config

from relulearn import open_store
from relulearn.api import estimate
from relulearn.config import load_config

from conftest import PYTHON, cli_env, relulearn

# Fast blocks, committed after every block: kills land in computation and in commits alike.
# d = 20 and every family: bitwise claims are only tested where BLAS really runs.
KILL_CONFIG = {
    "seed": 11,
    "samples": 360_000,
    "chunk_size": 4_000,
    "source": {"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 3}, "noise_std": 0.1},
    "statistics": {
        "basic": {},
        "hermite": {"max_order": 3},
        "contracted": {"orders": [2, 3, 4], "directions": 3},
        "filtered": {"quantiles": [0.25, 0.5, 0.9]},
        "residual": residual_section(20),
    },
    "run": {"chunks_per_block": 2, "commit_interval": 0},
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, str]:
    """An uninterrupted run of KILL_CONFIG, computed in-process (no Dask)."""
    d = tmp_path_factory.mktemp("reference")
    cfg_path = write_config(d / "run.yaml", KILL_CONFIG)
    url = str(d / "ref.zarr")
    estimate(load_config(cfg_path), url, client="local", progress=None, commit_interval=1e9)
    return cfg_path, url


@pytest.mark.slow
def test_sigkill_resume_is_bitwise_exact(reference, tmp_path):
    """SIGKILL the `relulearn estimate` process group at random moments, resume, compare bits."""
    cfg_path, ref_url = reference
    url = str(tmp_path / "killed.zarr")
    # a killed driver leaves its lease behind: each new driver breaks it (the previous one is dead)
    cmd = [
        PYTHON,
        "-m",
        "relulearn.cli",
        "estimate",
        str(cfg_path),
        "--store",
        url,
        "--workers",
        "2",
        "--quiet",
        "--break-lock",
    ]
    rng = np.random.default_rng(20261202)
    kills, progress = 0, []
    for _attempt in range(8):
        proc = subprocess.Popen(
            cmd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        # wait until the run has started committing (or a short random time on the first try)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not (Path(url) / "zarr.json").exists():
            time.sleep(0.05)
        time.sleep(float(rng.uniform(0.2, 2.5)))
        if proc.poll() is not None:
            break  # finished before the kill
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its cluster, all at once
        proc.wait()
        kills += 1
        committed = open_store(url).samples if (Path(url) / "zarr.json").exists() else 0
        progress.append(committed)
        if kills >= 4:
            break
    assert kills >= 3, f"the run finished before it could be killed 3 times (progress {progress})"
    assert progress[-1] > 0, "no block was ever committed before a kill"
    done = subprocess.run(cmd + ["--json"], env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_bitwise_equal(url, ref_url)
    n_chunks = KILL_CONFIG["samples"] // KILL_CONFIG["chunk_size"]
    assert_each_chunk_once(url, n_chunks)
    assert open_store(url).samples == KILL_CONFIG["samples"]
    # the store holds only the committed generation: no leftovers of killed commits, and no lease
    gens = [p.name for p in Path(url).iterdir() if p.is_dir()]
    assert gens == [open_store(url).head] and not (Path(url) / "lease.json").exists()


def test_extend_equals_one_long_run(client, tmp_path):
    """Estimating N then extending to 2N gives the bits of one 2N run (N on a block boundary)."""
    data = dict(KILL_CONFIG, samples=64_000)
    cfg = load_config(write_config(tmp_path / "c.yaml", data))
    short, long = str(tmp_path / "short.zarr"), str(tmp_path / "long.zarr")
    kw = dict(client=client, progress=None, commit_interval=1e9)
    first = estimate(cfg, short, **kw)
    assert first.samples == 64_000
    ext = estimate(cfg, short, samples=128_000, **kw)
    assert ext.resumed_from_samples == 64_000 and ext.samples == 128_000
    estimate(cfg, long, samples=128_000, **kw)
    assert_bitwise_equal(short, long)
    assert_each_chunk_once(short, 128_000 // 4_000)
    # asking for fewer samples than the store holds does nothing and changes nothing
    before = store_arrays(short)
    again = estimate(cfg, short, samples=10_000, **kw)
    assert again.blocks_run == 0 and again.samples == 128_000
    after = store_arrays(short)
    assert all(np.array_equal(before[k], after[k], equal_nan=True) for k in before)


def test_a_signal_inside_a_commit_is_raised_when_the_commit_ends():
    """A SIGTERM or Ctrl-C that arrives while a commit writes is held: raised in the waiting thread, it
    would leave zarr's writer thread filling a generation that the commit after the interrupt deletes."""
    from relulearn.pipeline.interrupts import Interrupts

    interrupts = Interrupts()
    old = signal.signal(signal.SIGTERM, interrupts.handler)
    try:
        steps = []
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler runs here, in the main thread, and holds the signal
                steps.append("commit ended")
        assert steps == ["commit ended"]
        with pytest.raises(KeyboardInterrupt, match="signal 15"):  # outside a commit: raised at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)
        with pytest.raises(OSError, match="disk full"):  # a failing commit's own error is what propagates
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                raise OSError("disk full")
    finally:
        signal.signal(signal.SIGTERM, old)


class _SignalAfterTheFirstFamily(dict):
    """A block's sums that deliver SIGTERM to this process once the first family's arrays are added."""

    def items(self):
        first, *rest = super().items()
        yield first
        os.kill(os.getpid(), signal.SIGTERM)
        yield from rest


def test_a_signal_while_a_block_is_merged_commits_whole_blocks(tmp_path, monkeypatch):
    """A SIGTERM or Ctrl-C that arrives while a block's sums are added to the run's is raised once the block is
    merged. Raised between two families, it left the block added to some arrays only, and the commit on the
    interrupt stored those sums under the sample count of the blocks before it (seen once in the suite, under
    load, as a SIGTERM run that was not bitwise the run of its sample count)."""
    import relulearn.pipeline.run as run_module

    cfg = load_config(write_config(tmp_path / "c.yaml", dict(KILL_CONFIG, samples=48_000)))
    real = run_module.compute_block

    def third_block_signals(stats, source, seed, chunk_size, a, b):
        part = real(stats, source, seed, chunk_size, a, b)
        if a == 4:  # the third block of two chunks
            part.sums = _SignalAfterTheFirstFamily(part.sums)
        return part

    monkeypatch.setattr(run_module, "compute_block", third_block_signals)
    url = str(tmp_path / "term.zarr")
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        estimate(cfg, url, client="local", progress=None, commit_interval=1e9)
    assert open_store(url).samples == 3 * 2 * 4_000  # the block the signal arrived in is merged and committed
    monkeypatch.setattr(run_module, "compute_block", real)
    ref = str(tmp_path / "ref.zarr")
    estimate(cfg, ref, samples=24_000, client="local", progress=None, commit_interval=1e9)
    assert_bitwise_equal(url, ref)
    assert_each_chunk_once(url, 6)


def test_sigterm_commits_merged_blocks(tmp_path):
    """SIGTERM (like Ctrl-C) stops the run cleanly after committing what was merged.

    The run asks for far more samples than it can do, so SIGTERM always lands mid-run; what
    it committed must be bitwise the uninterrupted run of that many samples.
    """
    cfg_path = write_config(tmp_path / "long.yaml", dict(KILL_CONFIG, samples=400_000_000))
    url = str(tmp_path / "term.zarr")
    cmd = [
        PYTHON,
        "-m",
        "relulearn.cli",
        "estimate",
        str(cfg_path),
        "--store",
        url,
        "--in-process",
        "--quiet",
        "--commit-interval",
        "1000",
    ]
    proc = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the run has started once it holds the store's lease; a second later it has merged blocks (a block takes
    # milliseconds here). A fixed 4 s from the start spent most of them in blocks the reference then computed again
    deadline = time.monotonic() + 60
    while not (Path(url) / "lease.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, f"the run did not stop on SIGTERM (exit {proc.returncode}): {err}"
    assert "resume" in err and "Traceback" not in err
    # no commit happened on the interval, so what is stored was committed on SIGTERM
    done = open_store(url).samples
    assert 0 < done < 400_000_000
    ref_url = str(tmp_path / "ref.zarr")
    estimate(load_config(cfg_path), ref_url, samples=done, client="local", progress=None, commit_interval=1e9)
    arrays, ref = store_arrays(url), store_arrays(ref_url)
    assert sorted(arrays) == sorted(ref)
    assert all(np.array_equal(arrays[k], ref[k], equal_nan=True) for k in ref)
    assert_each_chunk_once(url, done // KILL_CONFIG["chunk_size"])


def _mount_tmpfs(path: Path, size: int) -> bool:
    """A tmpfs of ``size`` bytes at ``path`` (root only); False where it cannot be mounted."""
    if os.geteuid() != 0:
        return False
    path.mkdir()
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_a_full_disk_names_the_store_keeps_its_last_commit_and_resumes_bitwise(reference, tmp_path):
    """A store on a tmpfs with room for one generation and a half: the second commit fails for want of space.
    The error names the store, the samples committed and how to resume, in one line; the store reads as its
    first commit; with the file system grown the same command resumes, and the result is bitwise the
    uninterrupted run."""
    cfg_path, ref_url = reference
    generation = sum(-(-p.stat().st_size // 4096) * 4096 for p in Path(ref_url).rglob("*") if p.is_file())
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, int(1.5 * generation)):
        pytest.skip("a small tmpfs needs root (mount -t tmpfs)")
    try:
        url = str(disk / "run.zarr")
        args = ["estimate", str(cfg_path), "--store", url, "--in-process", "--quiet"]
        full = relulearn(*args)
        assert full.returncode == 2, full.stderr
        per_block = KILL_CONFIG["chunk_size"] * KILL_CONFIG["run"]["chunks_per_block"]
        assert full.stderr.splitlines() == [
            f"relulearn: error: could not write {url}: No space left on device. The store {url} is intact at its "
            f"last commit: {per_block:,} samples are committed and safe ({per_block:,} merged samples since were "
            "not saved). Free space there, then run the same command to resume"
        ], full.stderr
        assert open_store(url).samples == per_block and not (Path(url) / "lease.json").exists()
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        done = relulearn(*args)
        assert done.returncode == 0, done.stderr
        assert_bitwise_equal(url, ref_url)
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
