"""One writer at a time: the store's lease (relulearn.storage.lease), and readers that see whole commits.

Real processes throughout: `relulearn estimate` subprocesses on a LocalCluster or in-process, SIGKILL and
SIGINT, real zarr stores in tmp_path.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from relulearn import api, cli, open_store
from relulearn.config import load_config
from relulearn.storage import RunStore, StoreError
from relulearn.storage.lease import Lease, LeaseLostError, StoreLockedError, read_lease

from conftest import PYTHON, cli_env, make_config, relulearn
from test_resume import assert_bitwise_equal, assert_each_chunk_once, write_config

#: d = 20 (bitwise claims), one chunk per block and a commit after each: a run of many commits, whose
#: statistics alone take a fraction of a second in process
BUSY = {
    "seed": 11,
    "samples": 32_000,
    "chunk_size": 2_000,
    "source": {"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 3}, "noise_std": 0.1},
    "statistics": {
        "basic": {},
        "contracted": {"orders": [2, 4], "directions": 2},
        "filtered": {"quantiles": [0.5, 0.9]},
    },
    "run": {"chunks_per_block": 1, "commit_interval": 0, "max_blocks_in_flight": 2},
}

#: the CLI's main() in a process of its own, timed from its call to its return (imports excluded)
TIMED_MAIN = (
    "import sys, time\nfrom relulearn.cli import main\nt = time.perf_counter()\nrc = main(sys.argv[1:])\n"
    "print(f'MAIN_SECONDS {time.perf_counter() - t:.4f}', file=sys.stderr)\nsys.exit(rc)\n"
)


def _lease_doc(url: str) -> dict | None:
    path = Path(url) / "lease.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(
                f"the writer exited (code {proc.returncode}) before {what}: {proc.stderr.read() if proc.stderr else ''}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _committed(url: str) -> int:
    return (RunStore(url).meta() or {}).get("samples", 0) if (Path(url) / "zarr.json").exists() else 0


def _holder_named(message: str, pid: int) -> None:
    assert "is locked" in message, message
    assert f"process {pid}" in message and f"on {socket.gethostname()}" in message, message
    assert "since 20" in message and "last heartbeat 20" in message, message


def test_a_second_writer_is_refused_at_once_and_the_first_run_is_untouched(tmp_path, capsys):
    """While `relulearn estimate` runs on a LocalCluster, a second `relulearn estimate` process and 20
    more attempts (the CLI's main() in this process) are each refused within 1 s, naming the holder;
    the first run's store is then bitwise the store of an uninterrupted run, and its lease is gone."""
    cfg_path = write_config(tmp_path / "busy.yaml", BUSY)
    url, ref = str(tmp_path / "run.zarr"), str(tmp_path / "ref.zarr")
    first = subprocess.Popen(
        [
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
            "--json",
        ],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the run has taken the lease and is committing: both writers would start from its commits
        _wait_for(
            lambda: (_lease_doc(url) or {}).get("pid") == first.pid and _committed(url) > 0, first, "the first commit"
        )
        t0 = time.perf_counter()
        second = subprocess.run(
            [PYTHON, "-c", TIMED_MAIN, "estimate", str(cfg_path), "--store", url, "--workers", "2", "--json"],
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        second_wall = time.perf_counter() - t0
        assert second.returncode == 2, second.stderr
        err = json.loads(second.stdout)
        assert err["kind"] == "StoreLockedError"
        _holder_named(err["error"], first.pid)
        assert "stale" not in err["error"]
        main_seconds = float(second.stderr.split("MAIN_SECONDS ")[1].split()[0])
        assert main_seconds <= 1.0, second.stderr
        times = []
        for _ in range(20):
            t = time.perf_counter()
            rc = cli.main(["estimate", str(cfg_path), "--store", url, "--json"])
            times.append(time.perf_counter() - t)
            out = capsys.readouterr()
            assert rc == 2
            _holder_named(json.loads(out.out)["error"], first.pid)
        assert max(times) <= 1.0, times
        assert first.poll() is None, "the first run ended before the attempts did: they did not race it"
        print(
            f"second writer: refused in {main_seconds:.3f} s of main() ({second_wall:.2f} s wall, interpreter "
            f"and imports included); 20 attempts: max {max(times) * 1e3:.1f} ms, median "
            f"{np.median(times) * 1e3:.1f} ms; first run committed {_committed(url):,} samples by then"
        )
        out, errs = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, errs
    assert json.loads(out)["samples"] == BUSY["samples"] and json.loads(out)["resumed_from_samples"] == 0
    assert not (Path(url) / "lease.json").exists()
    api.estimate(load_config(cfg_path), ref, client="local", progress=None, commit_interval=1e9)
    assert_bitwise_equal(url, ref)
    assert_each_chunk_once(url, BUSY["samples"] // BUSY["chunk_size"])


def test_a_killed_writers_lease_is_stale_and_broken_by_break_lock(tmp_path, capsys):
    """SIGKILL leaves the lease of a dead process: the next writer is refused with "stale" (and `status`
    shows it), `--break-lock` breaks it, and the resumed run is bitwise an uninterrupted one."""
    cfg_path = write_config(tmp_path / "busy.yaml", BUSY)
    url, ref = str(tmp_path / "run.zarr"), str(tmp_path / "ref.zarr")
    args = ["estimate", str(cfg_path), "--store", url, "--in-process", "--quiet"]
    writer = subprocess.Popen(
        [PYTHON, "-m", "relulearn.cli", *args],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(lambda: _committed(url) > 0, writer, "the first commit")
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    writer.stderr.close()
    assert _lease_doc(url)["pid"] == writer.pid
    committed = _committed(url)
    assert 0 < committed < BUSY["samples"]

    refused = relulearn(*args)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert (
        "stale" in refused.stderr
        and f"process {writer.pid} on {socket.gethostname()} is no longer running" in refused.stderr
    )
    assert "--break-lock" in refused.stderr
    assert _committed(url) == committed  # refused: nothing written
    capsys.readouterr()
    assert cli.main(["status", url, "--json"]) == 0
    lease = json.loads(capsys.readouterr().out)["lease"]
    assert lease["pid"] == writer.pid and "no longer running" in lease["stale"]
    assert cli.main(["status", url]) == 0
    text = capsys.readouterr().out
    assert f"locked       by process {writer.pid}" in text and "stale: " in text

    done = relulearn(*args, "--break-lock", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resumed_from_samples"] == committed
    assert not (Path(url) / "lease.json").exists()
    api.estimate(load_config(cfg_path), ref, client="local", progress=None, commit_interval=1e9)
    assert_bitwise_equal(url, ref)
    assert_each_chunk_once(url, BUSY["samples"] // BUSY["chunk_size"])


def test_the_lease_is_released_after_ctrl_c(tmp_path):
    """Ctrl-C as a terminal sends it (SIGINT to the whole process group: the driver and the LocalCluster's worker
    processes) during `relulearn estimate`: one line on stderr (the workers leave the signal to the driver, no
    tracebacks), merged blocks committed, exit 130, no lease left, and the next writer starts without
    --break-lock."""
    cfg_path = write_config(tmp_path / "long.yaml", dict(BUSY, samples=10_000_000))
    url = str(tmp_path / "run.zarr")
    proc = subprocess.Popen(
        [PYTHON, "-m", "relulearn.cli", "estimate", str(cfg_path), "--store", url, "--workers", "1", "--quiet"],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _wait_for(lambda: _committed(url) > 0, proc, "the first commit")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.splitlines() == [
        "relulearn: interrupted; every merged block was committed. Run the same command to resume."
    ], err
    assert not (Path(url) / "lease.json").exists() and read_lease(url) is None
    assert 0 < _committed(url) < 10_000_000
    more = api.estimate(load_config(cfg_path), url, samples=_committed(url) + 2_000, client="local", progress=None)
    assert more.blocks_run == 1 and read_lease(url) is None


def test_the_lease_is_released_after_an_error_and_a_failed_first_run_leaves_no_folder(tmp_path):
    """An exception inside a first or a resumed run and a refused resume all give the lease back; a first run
    that fails before its first commit also removes the folders its lease created."""
    url = str(tmp_path / "deep" / "er" / "run.zarr")

    def fail(info: dict) -> None:
        assert _lease_doc(url)["pid"] == os.getpid()  # held while the run is live
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        api.estimate(make_config(), url, client="local", progress=None, on_start=fail)
    assert not (tmp_path / "deep").exists()  # nothing committed: the folders made for the lease are gone too
    api.estimate(make_config(), url, client="local", progress=None)
    with pytest.raises(StoreError, match="different fingerprint"):
        api.estimate(make_config(seed=4), url, client="local", progress=None)
    assert sorted(p.name for p in Path(url).iterdir()) == [open_store(url).head, "zarr.json"]
    with pytest.raises(RuntimeError, match="boom"):  # an error in a resumed run
        api.estimate(make_config(), url, samples=50_000, client="local", progress=None, on_start=fail)
    assert read_lease(url) is None and open_store(url).samples == 40_000


def _write_lease(url: str, **fields) -> None:
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    doc = {"holder": "f" * 32, "host": socket.gethostname(), "pid": os.getpid(), "started": now, "heartbeat": now}
    doc.update(fields)
    Path(url).mkdir(parents=True, exist_ok=True)
    (Path(url) / "lease.json").write_text(json.dumps(doc))


def test_live_leases_are_never_broken_and_silent_or_unreadable_ones_are_stale(tmp_path):
    url = str(tmp_path / "run.zarr")
    api.estimate(make_config(), url, client="local", progress=None)
    # a live writer on another host (recent heartbeat): refused, even with break_lock
    _write_lease(url, host="node-7", pid=4242)
    for brk in (False, True):
        with pytest.raises(StoreLockedError, match="is locked: process 4242 on node-7") as info:
            api.estimate(make_config(), url, samples=50_000, client="local", progress=None, break_lock=brk)
        assert info.value.stale is None
    # no heartbeat for 11 minutes: stale (the 10-minute timeout), broken on request
    old = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=11)).isoformat()
    _write_lease(url, host="node-7", pid=4242, heartbeat=old)
    with pytest.raises(
        StoreLockedError, match=r"stale because no heartbeat for 66\d s \(a lease is stale after 600 s\)"
    ):
        api.estimate(make_config(), url, samples=50_000, client="local", progress=None)
    assert api.status(url)["lease"]["stale"].startswith("no heartbeat")
    assert (
        api.estimate(make_config(), url, samples=50_000, client="local", progress=None, break_lock=True).samples
        == 50_000
    )
    assert read_lease(url) is None
    # a lease document that cannot be read (a writer killed while writing it on a file system without links)
    (Path(url) / "lease.json").write_text("{")
    with pytest.raises(StoreLockedError, match="cannot be read"):
        api.estimate(make_config(), url, samples=60_000, client="local", progress=None)
    assert (
        api.estimate(make_config(), url, samples=60_000, client="local", progress=None, break_lock=True).samples
        == 60_000
    )
    # a process id now used by another process (this one: its start time differs from the lease's)
    _write_lease(url, process_start=1)
    with pytest.raises(StoreLockedError, match=f"process {os.getpid()} on .* has ended"):
        api.estimate(make_config(), url, samples=60_000, client="local", progress=None)


def test_heartbeat_and_a_lease_taken_over_mid_run(tmp_path):
    """The heartbeat moves while the lease is held; a writer whose lease another writer broke and took commits
    nothing more (its generation never becomes the head) and leaves the other's lease in place."""
    url = str(tmp_path / "run.zarr")
    lease = Lease.acquire(url, heartbeat=0.1)
    first = read_lease(url).heartbeat
    time.sleep(0.5)
    assert read_lease(url).heartbeat > first and read_lease(url).holder == lease.info.holder
    lease.release()
    assert read_lease(url) is None

    def take_over(info: dict) -> None:
        _write_lease(url, holder="e" * 32, host="node-9", pid=99)

    with pytest.raises(LeaseLostError, match="is now held by process 99 on node-9"):
        api.estimate(make_config(), url, client="local", progress=None, on_start=take_over)
    assert RunStore(url).meta() is None  # no head was switched
    assert read_lease(url).holder == "e" * 32  # the other writer's lease stays


def test_merge_takes_the_lease_of_its_output(tmp_path):
    stats = {"basic": {}, "filtered": {"thresholds": [0.1, 0.5]}}
    a, b, c = (str(tmp_path / f"{n}.zarr") for n in "abc")
    api.estimate(make_config(seed=1, statistics=stats), a, client="local", progress=None)
    api.estimate(make_config(seed=2, statistics=stats), b, client="local", progress=None)
    with Lease.acquire(c, heartbeat=0):
        with pytest.raises(StoreLockedError, match=f"process {os.getpid()}"):
            api.merge(a, b, c)
    _write_lease(c, pid=_dead_pid())
    with pytest.raises(StoreLockedError, match="stale"):
        api.merge(a, b, c)
    assert api.merge(a, b, c, break_lock=True)["samples"] == 80_000 and read_lease(c) is None


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_fsspec_store_takes_the_lease_exclusively():
    """On an fsspec store the lease is written in exclusive mode ("xb"); memory:// refuses an existing object."""
    url = "memory://relulearn-lease-test/run.zarr"
    with Lease.acquire(url, heartbeat=0):
        with pytest.raises(StoreLockedError, match=f"process {os.getpid()}"):
            api.estimate(make_config(samples=10_000), url, client="local", progress=None)
    api.estimate(make_config(samples=10_000), url, client="local", progress=None)
    assert open_store(url).samples == 10_000 and read_lease(url) is None
