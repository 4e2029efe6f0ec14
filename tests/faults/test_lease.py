"""One writer at a time: the store's lease (relulearn.storage.lease), and readers that see whole commits.

Real processes throughout: `relulearn estimate` subprocesses on a LocalCluster or in-process, SIGKILL and
SIGINT, real zarr stores in tmp_path.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from stores import assert_bitwise_equal, assert_each_chunk_once, write_config

from relulearn import api, cli, open_store
from relulearn.config import load_config
from relulearn.storage import RunStore, StoreError
from relulearn.storage.lease import Lease, LeaseLostError, StoreLockedError, read_lease

from conftest import PYTHON, cli_env, make_config, relulearn

#: d = 20 (bitwise claims), one chunk per block and a commit after each: a run of many commits, whose
#: statistics alone take a fraction of a second in process
BUSY = {
    "seed": 11,
    "samples": 96_000,  # 48 committed blocks: the run outlasts a second writer and 20 attempts on a busy machine
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


def test_a_killed_writer_resumes_with_the_same_command(tmp_path, capsys):
    """SIGKILL (the OOM killer, a lost node) leaves the lease of a dead process: `status` shows it stale and
    taken over by the next writer, the same command (no flag) takes it over saying so in one warning line, and
    the resumed run is bitwise an uninterrupted one."""
    cfg_path = write_config(tmp_path / "busy.yaml", BUSY)
    url, ref = str(tmp_path / "run.zarr"), str(tmp_path / "ref.zarr")
    args = ["estimate", str(cfg_path), "--store", url, "--in-process"]
    writer = subprocess.Popen(
        [PYTHON, "-m", "relulearn.cli", *args, "--quiet"],
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

    capsys.readouterr()
    assert cli.main(["status", url, "--json"]) == 0
    lease = json.loads(capsys.readouterr().out)["lease"]
    assert lease["pid"] == writer.pid and "no longer running" in lease["stale"] and lease["holder_gone"] is True
    assert cli.main(["status", url]) == 0
    text = capsys.readouterr().out
    assert f"locked       by process {writer.pid}" in text and "(the next writer takes it over)" in text

    done = relulearn(*args, "--json")
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("relulearn: warning:")]
    assert len(warned) == 1, done.stderr
    assert f"took over the lease of process {writer.pid}" in warned[0], warned
    assert f"process {writer.pid} on {socket.gethostname()} is no longer running" in warned[0], warned
    assert json.loads(done.stdout)["resumed_from_samples"] == committed
    assert not (Path(url) / "lease.json").exists()
    api.estimate(load_config(cfg_path), ref, client="local", progress=None, commit_interval=1e9)
    assert_bitwise_equal(url, ref)
    assert_each_chunk_once(url, BUSY["samples"] // BUSY["chunk_size"])


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # a process of its own: the lease timeout is read from the environment when relulearn is imported
    return subprocess.run([PYTHON, "-m", "relulearn.cli", *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_writer_killed_on_another_host_is_resumed_after_the_heartbeat_timeout(tmp_path):
    """SIGKILL once 1 (then 9) of 32 commits are made, the lease then made another host's with a fresh heartbeat (its
    machine died just now): the same command is refused naming that host and both ways out (the store unchanged),
    and once the heartbeat is older than RELULEARN_LEASE_TIMEOUT the same command (no flag) takes it over and
    resumes bitwise equal to an uninterrupted run; --break-lock takes it at once."""
    run = dict(BUSY, samples=64_000)  # 32 commits: the writer is still running when it is killed
    cfg_path = write_config(tmp_path / "busy.yaml", run)
    ref = str(tmp_path / "ref.zarr")
    api.estimate(load_config(cfg_path), ref, client="local", progress=None, commit_interval=1e9)
    timeout = 3.0
    env = dict(cli_env(), RELULEARN_LEASE_TIMEOUT=str(timeout))
    for how, commits in (("wait", 1), ("break", 9)):
        url = str(tmp_path / f"{how}.zarr")
        args = ["estimate", str(cfg_path), "--store", url, "--in-process"]
        writer = subprocess.Popen(
            [PYTHON, "-m", "relulearn.cli", *args, "--quiet"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for(lambda url=url, n=commits * run["chunk_size"]: _committed(url) >= n, writer, f"commit {commits}")
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stderr.close()
        doc = _lease_doc(url)
        assert doc is not None and doc["pid"] == writer.pid
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
        (Path(url) / "lease.json").write_text(json.dumps(dict(doc, host="node-elsewhere", heartbeat=now)))
        stale_at = time.monotonic() + timeout + 0.5  # the heartbeat is older than the timeout from then on
        before = {p: p.read_bytes() for p in sorted(Path(url).rglob("*")) if p.is_file()}
        committed = _committed(url)
        assert 0 < committed < run["samples"]
        if how == "wait":
            refused = _run(args, env)
            assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
            assert f"process {writer.pid}" in refused.stderr and "on node-elsewhere" in refused.stderr
            assert "RELULEARN_LEASE_TIMEOUT" in refused.stderr and "--break-lock" in refused.stderr
            assert {p: p.read_bytes() for p in sorted(Path(url).rglob("*")) if p.is_file()} == before
            time.sleep(max(0.0, stale_at - time.monotonic()))  # (the refused command took part of the wait)
            done = _run([*args, "--json"], env)
        else:
            done = _run([*args, "--json", "--break-lock"], env)
        assert done.returncode == 0, done.stderr
        warned = [line for line in done.stderr.splitlines() if line.startswith("relulearn: warning:")]
        assert len(warned) == 1 and f"took over the lease of process {writer.pid}" in warned[0], done.stderr
        assert "node-elsewhere" in warned[0], warned
        assert json.loads(done.stdout)["resumed_from_samples"] == committed
        assert not (Path(url) / "lease.json").exists()
        assert_bitwise_equal(url, ref)
        assert_each_chunk_once(url, run["samples"] // run["chunk_size"])


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


def test_live_leases_are_never_broken_and_silent_or_unreadable_ones_are_stale(tmp_path, caplog):
    url = str(tmp_path / "run.zarr")
    api.estimate(make_config(), url, client="local", progress=None)
    # a writer on another host with a recent heartbeat: refused, saying when it is taken over and that
    # break_lock takes it now (from here it cannot be told alive from a machine that just died)
    _write_lease(url, host="node-7", pid=4242)
    with pytest.raises(StoreLockedError, match="is locked: process 4242 on node-7") as info:
        api.estimate(make_config(), url, samples=45_000, client="local", progress=None)
    assert info.value.stale is None
    assert "heartbeat is 600 s old (RELULEARN_LEASE_TIMEOUT)" in str(info.value) and "--break-lock" in str(info.value)
    assert (
        api.estimate(make_config(), url, samples=45_000, client="local", progress=None, break_lock=True).samples
        == 45_000
    )
    assert read_lease(url) is None
    # a live writer on this host is never broken, even with break_lock
    _write_lease(url)
    with pytest.raises(StoreLockedError, match=f"is locked: process {os.getpid()} on") as info:
        api.estimate(make_config(), url, samples=50_000, client="local", progress=None, break_lock=True)
    assert info.value.stale is None and "never broken" in str(info.value)
    # no heartbeat for 11 minutes: stale (the 10-minute timeout), its holder gone: taken over, saying so
    old = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=11)).isoformat()
    _write_lease(url, host="node-7", pid=4242, heartbeat=old)
    assert api.status(url)["lease"]["stale"].startswith("no heartbeat")
    with caplog.at_level(logging.WARNING, logger="relulearn"):
        assert api.estimate(make_config(), url, samples=50_000, client="local", progress=None).samples == 50_000
    assert re.search(
        r"took over the lease of process 4242 on node-7.*stale because no heartbeat for 66\d s \(a lease is stale "
        r"after 600 s\); its last commit is resumed",
        caplog.text,
    ), caplog.text
    assert read_lease(url) is None
    # a lease document that cannot be read (a writer killed while writing it on a file system without links)
    (Path(url) / "lease.json").write_text("{")
    with pytest.raises(StoreLockedError, match="is not a JSON document, so its holder is unknown|holder is unknown"):
        api.estimate(make_config(), url, samples=60_000, client="local", progress=None)
    assert (
        api.estimate(make_config(), url, samples=60_000, client="local", progress=None, break_lock=True).samples
        == 60_000
    )
    # a process id now used by another process (this one: its start time differs from the lease's): gone
    _write_lease(url, process_start=1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="relulearn"):
        assert api.estimate(make_config(), url, samples=70_000, client="local", progress=None).samples == 70_000
    assert re.search(f"process {os.getpid()} on .* has ended", caplog.text), caplog.text
    assert read_lease(url) is None


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
    _write_lease(c, pid=_dead_pid())  # a merge killed before: the same command takes its lease over
    assert api.merge(a, b, c)["samples"] == 80_000 and read_lease(c) is None


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


# ---------------------------------------------------------------- malformed, special and foreign lease files


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` but its lease: a file's bytes, anything else its kind."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        if p.name == "lease.json":
            continue
        out[str(p.relative_to(root))] = p.read_bytes() if p.is_file() and not p.is_symlink() else "other"
    return out


def _bad_lease(url: str, kind: str) -> None:
    path = Path(url) / "lease.json"
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    doc = {"holder": "f" * 32, "host": socket.gethostname(), "pid": os.getpid(), "started": now, "heartbeat": now}
    if kind.startswith("pid="):
        doc["pid"] = json.loads(kind[4:])
    elif kind == "host=5":
        doc["host"] = 5
    elif kind == "heartbeat=garbage":
        doc["heartbeat"] = "yesterday"
    elif kind == "a list":
        doc = [1, 2]  # type: ignore[assignment]
    if kind == "deeply nested":
        path.write_text("[" * 20_000 + "]" * 20_000)
    elif kind == "over 64 kB":
        path.write_text(json.dumps(dict(doc, command="x" * 70_000)))
    elif kind == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text(json.dumps(doc))


#: two commits of a few milliseconds each
TINY = dict(BUSY, samples=4_000, source={"d": 4, "teacher": {"kind": "one_hidden_relu", "width": 2}})

BAD_LEASES = [
    'pid="4711"',
    "pid=4711.5",
    "pid=null",
    f"pid={2**70}",
    "pid=-3",
    "pid=true",
    "host=5",
    "heartbeat=garbage",
    "a list",
    "deeply nested",
    "over 64 kB",
    "symlink to /dev/zero",
    "fifo",
    "directory",
]


@pytest.mark.parametrize("kind", BAD_LEASES)
def test_a_malformed_or_special_lease_is_a_stale_lease_of_an_unknown_holder(tmp_path, kind):
    """A lease.json that is no writer's document (wrong types, out of range, too big, too deep, a symlink, a
    FIFO, a directory) is read without hanging or allocating, never with a traceback: `status` shows it as
    stale with its holder unknown, a writer is refused in one line naming the file and --break-lock (the store
    byte-for-byte unchanged), and --break-lock takes it and resumes the run."""
    cfg = write_config(tmp_path / "c.yaml", TINY)
    url = str(tmp_path / "run.zarr")
    assert relulearn("estimate", cfg, "--store", url, "--in-process", "--quiet", "--samples", 2_000).returncode == 0
    _bad_lease(url, kind)
    before = _tree(Path(url))

    shown = relulearn("status", url, "--json")
    assert shown.returncode == 0, shown.stderr
    lease = json.loads(shown.stdout)["lease"]
    assert lease["holder"] is None and "holder is unknown" in lease["stale"], lease

    refused = relulearn("estimate", cfg, "--store", url, "--in-process", "--quiet")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("relulearn: error: "), refused.stderr
    assert str(Path(url) / "lease.json") in lines[0] and "holder is unknown" in lines[0], lines[0]
    assert "--break-lock" in lines[0]
    assert _tree(Path(url)) == before

    done = relulearn("estimate", cfg, "--store", url, "--in-process", "--quiet", "--break-lock", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resumed_from_samples"] == 2_000 and open_store(url).samples == 4_000
    assert not os.path.lexists(Path(url) / "lease.json")
    assert sorted(p.name for p in Path(url).iterdir()) == [open_store(url).head, "zarr.json"]


def test_a_heartbeat_far_in_the_future_is_stale_and_breakable(tmp_path):
    """A heartbeat beyond the timeout in the future (another host's clock, or no writer's document) is not
    a live lease forever: it is stale, and --break-lock takes it."""
    url = str(tmp_path / "run.zarr")
    api.estimate(make_config(), url, client="local", progress=None)
    future = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=400)).isoformat()
    _write_lease(url, host="node-7", pid=4242, heartbeat=future)
    with pytest.raises(StoreLockedError, match=r"stale because its heartbeat is \d+ s in the future") as info:
        api.estimate(make_config(), url, samples=50_000, client="local", progress=None)
    assert "--break-lock" in str(info.value) and "(-" not in str(info.value)
    assert (
        api.estimate(make_config(), url, samples=50_000, client="local", progress=None, break_lock=True).samples
        == 50_000
    )


def test_status_of_a_first_run_whose_writer_died_says_so(tmp_path):
    """A folder holding only the lease of a dead writer's first run: status does not say it "is being
    written" by that process, but that its writer is gone and the same command resumes it."""
    url = str(tmp_path / "run.zarr")
    _write_lease(url, pid=_dead_pid())
    with pytest.raises(StoreError) as info:
        api.status(url)
    assert "being written" not in str(info.value) and "no longer running" in str(info.value), info.value
    assert "run the same command" in str(info.value)


#: one contender: takes the lease of argv[1] (breaking a stale one) at time argv[2], holds it until argv[3] exists
CONTENDER = """
import os, sys, time
from relulearn.storage.lease import Lease, StoreLockedError
import relulearn.storage.store  # imported before the start: the contenders race the lease, not imports
while time.time() < float(sys.argv[2]):
    pass
try:
    lease = Lease.acquire(sys.argv[1], break_lock=True, heartbeat=0)
except StoreLockedError as err:
    print("LOCKED", err)
else:
    print("WON", flush=True)
    while not os.path.exists(sys.argv[3]):  # held until every other contender has given up
        time.sleep(0.01)
    lease.release()
"""


@pytest.mark.slow
def test_two_writers_breaking_one_stale_lease_never_both_take_it(tmp_path):
    """Taking a stale lease is a compare-and-swap: six processes breaking the same stale lease at the same
    moment, three times over: exactly one takes it each time, the others are refused naming the winner."""
    for attempt in range(3):
        url = str(tmp_path / f"run{attempt}.zarr")
        _write_lease(url, pid=_dead_pid(), holder="d" * 32)
        start = time.time() + 1.2
        done = tmp_path / f"done{attempt}"
        procs = [
            subprocess.Popen(
                [PYTHON, "-c", CONTENDER, url, str(start), str(done)], env=cli_env(), stdout=subprocess.PIPE, text=True
            )
            for _ in range(6)
        ]
        deadline = time.monotonic() + 60
        while sum(p.poll() is None for p in procs) > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        done.touch()
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        won = [o for o in outs if o.startswith("WON")]
        assert len(won) == 1, (attempt, outs)
        assert all(o.startswith("LOCKED") and "is locked: process" in o for o in outs if o not in won), outs
        assert read_lease(url) is None
        assert sorted(p.name for p in Path(url).iterdir()) == [], list(Path(url).iterdir())


def test_taking_a_stale_lease_is_a_compare_and_swap(tmp_path):
    """A writer that read a stale lease takes it only if lease.json is still that document: not when another
    writer replaced it since (nor while another writer is taking the same stale lease)."""
    from relulearn.storage.lease import _document

    url = str(tmp_path / "run.zarr")
    _write_lease(url, pid=_dead_pid(), holder="d" * 32)
    stale = read_lease(url)
    assert stale.holder_gone()
    _write_lease(url, holder="e" * 32)  # another writer took it (this process: live)
    fresh = (Path(url) / "lease.json").read_bytes()
    doc = _document(url)
    assert not doc.take(stale, b"{}", "1" * 32)
    assert (Path(url) / "lease.json").read_bytes() == fresh
    assert sorted(p.name for p in Path(url).iterdir()) == ["lease.json"]  # nothing left behind
    with pytest.raises(StoreLockedError, match=f"is locked: process {os.getpid()}"):
        Lease.acquire(url, heartbeat=0)
    # while one writer takes the stale lease (its guard is there), a second one does not
    _write_lease(url, pid=_dead_pid(), holder="d" * 32)
    stale = read_lease(url)
    with Lease.acquire(url, heartbeat=0) as won:
        assert read_lease(url).holder == won.info.holder
        assert not doc.take(stale, b"{}", "2" * 32)
        assert read_lease(url).holder == won.info.holder


@pytest.mark.slow
def test_a_frozen_writer_whose_lease_was_taken_says_so(tmp_path):
    """A writer frozen (SIGSTOP) past the heartbeat timeout loses its lease to the next writer, which resumes
    the run; woken up, the frozen writer stops in one line saying its lease was taken (not that a file could
    not be written), and the store is bitwise an uninterrupted run's."""
    # a commit every 0.1 s: the freeze lands in a block's computation, not between a commit's last lease check
    # and its head switch (a writer frozen there switches the head when it wakes; leases cannot fence that).
    # 960,000 samples: a second or more of blocks on an idle machine (96,000 took 0.12 s, less than two commit
    # intervals: the first commit was the last, and the freeze came after the run's work)
    cfg_path = write_config(
        tmp_path / "busy.yaml", dict(BUSY, samples=960_000, run=dict(BUSY["run"], commit_interval=0.1))
    )
    url, ref = str(tmp_path / "run.zarr"), str(tmp_path / "ref.zarr")
    args = [PYTHON, "-m", "relulearn.cli", "estimate", str(cfg_path), "--store", url, "--in-process", "--quiet"]
    env = dict(cli_env(), RELULEARN_LEASE_TIMEOUT="1")
    frozen = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _committed(url) > 0, frozen, "the first commit")
        frozen.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # past the timeout: its heartbeat is stale
        second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 0, second.stderr
        frozen.send_signal(signal.SIGCONT)
        _, err = frozen.communicate(timeout=60)
    finally:
        if frozen.poll() is None:
            frozen.kill()
    assert frozen.returncode == 2, err
    assert err.count("\n") == 1 and "this writer's lease was taken by another writer" in err, err
    assert "could not write" not in err and "Traceback" not in err, err
    api.estimate(load_config(cfg_path), ref, client="local", progress=None, commit_interval=1e9)
    assert_bitwise_equal(url, ref)


def test_a_stale_lease_on_an_fsspec_store_is_taken_over_by_compare_and_swap():
    """On an fsspec store (memory://) too: a dead writer's lease is taken over by the same command, and only if
    lease.json is still the stale document read (another writer's lease in its place stays); no guard is left."""
    import fsspec

    from relulearn.storage.lease import _document

    url = "memory://relulearn-lease-stale/run.zarr"
    fs = fsspec.filesystem("memory")
    try:
        api.estimate(make_config(samples=10_000), url, client="local", progress=None)
        now = dt.datetime.now(dt.timezone.utc).isoformat()

        def put(**fields) -> None:
            doc = {"holder": "d" * 32, "host": socket.gethostname(), "pid": os.getpid(), "started": now}
            fs.pipe_file(
                "/relulearn-lease-stale/run.zarr/lease.json", json.dumps(dict(doc, heartbeat=now, **fields)).encode()
            )

        put(pid=_dead_pid())
        stale = read_lease(url)
        assert stale.holder_gone()
        put(holder="e" * 32)  # another writer took it meanwhile
        assert not _document(url).take(stale, b"{}", "1" * 32)
        assert read_lease(url).holder == "e" * 32
        put(pid=_dead_pid())
        assert api.estimate(make_config(samples=20_000), url, client="local", progress=None).samples == 20_000
        assert read_lease(url) is None
        assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/relulearn-lease-stale/run.zarr", detail=False)) == [
            open_store(url).head,
            "zarr.json",
        ]
    finally:
        fs.rm("/relulearn-lease-stale", recursive=True)
