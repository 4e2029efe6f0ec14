"""Real clusters: bitwise equality across in-process, LocalCluster and external `dask worker`
processes at d = 20 with every statistic family, and the run surviving (or cleanly stopping at)
the death of the driver, a worker or the scheduler."""

from __future__ import annotations

import contextlib
import json
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
from relulearn.storage import RunStore

from conftest import PYTHON, cli_env, relulearn
from external import ExternalCluster

# the tests poll stores that another process is writing; zarr warns about its in-flight temp files
pytestmark = pytest.mark.filterwarnings("ignore:Object at .* is not recognized as a component")


def all_families(d: int = 20, **over) -> dict:
    """Every statistic family at d = 20 (BLAS-sized products), a noisy 3-unit teacher."""
    data = {
        "seed": 11,
        "samples": 80_000,
        "chunk_size": 10_000,
        "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": 3, "seed": 5}, "noise_std": 0.1},
        "statistics": {
            "basic": {},
            "hermite": {"max_order": 4},
            "contracted": {"orders": [2, 4], "directions": 4},
            "filtered": {"quantiles": [0.5, 0.9], "pilot_samples": 20_000},
            "residual": residual_section(d),
        },
        "run": {"chunks_per_block": 1, "commit_interval": 0},
    }
    data.update(over)
    return data


#: a longer run (no order-4 tensors) that lasts long enough to kill processes inside it
LONG = all_families(
    samples=960_000,
    chunk_size=20_000,
    statistics={
        "basic": {},
        "contracted": {"orders": [2, 4], "directions": 4},
        "filtered": {"quantiles": [0.5, 0.9], "pilot_samples": 20_000},
        "residual": residual_section(20),
    },
)


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> tuple[Path, str]:
    """The all-families configuration and its in-process reference store."""
    d = tmp_path_factory.mktemp("families")
    cfg_path = write_config(d / "run.yaml", all_families())
    url = str(d / "ref.zarr")
    estimate(load_config(cfg_path), url, client="local", progress=None, commit_interval=1e9)
    return cfg_path, url


@pytest.fixture(scope="module")
def long_run(tmp_path_factory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("long")
    cfg_path = write_config(d / "long.yaml", LONG)
    url = str(d / "ref.zarr")
    estimate(load_config(cfg_path), url, client="local", progress=None, commit_interval=1e9)
    return cfg_path, url


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    with ExternalCluster(tmp_path_factory.mktemp("external"), workers=2) as cluster:
        yield cluster


def committed(url: str) -> int:
    """Samples committed in the store at ``url`` (0 before the first commit)."""
    meta = RunStore(url).meta()
    return 0 if meta is None else int(meta["samples"])


def test_reference_uses_blas_sized_arrays(families):
    """The claim is only worth testing where BLAS really runs: d ≥ 20 and every family present."""
    _, url = families
    run = open_store(url)
    assert run.meta["fingerprint"]["source"]["d"] >= 20
    assert set(run.statistics) == {"basic", "hermite", "contracted", "filtered", "residual"}
    assert len(run.platforms()) == len(run.ledger()) == 8


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_local_cluster_equals_in_process(families, tmp_path, workers):
    cfg_path, ref = families
    url = str(tmp_path / f"w{workers}.zarr")
    estimate(load_config(cfg_path), url, workers=workers, progress=None, commit_interval=0)
    assert_bitwise_equal(url, ref)


@pytest.mark.slow
def test_external_cluster_equals_in_process(families, external, tmp_path):
    """`dask scheduler` + two `dask worker` processes, through the command line."""
    cfg_path, ref = families
    url = str(tmp_path / "ext.zarr")
    done = relulearn("estimate", str(cfg_path), "--store", url, "--scheduler", external.file, "--quiet", "--json")
    assert done.returncode == 0, done.stderr
    assert_bitwise_equal(url, ref)
    # and by address instead of scheduler file
    url2 = str(tmp_path / "ext2.zarr")
    done = relulearn("estimate", str(cfg_path), "--store", url2, "--scheduler", external.address, "--quiet")
    assert done.returncode == 0, done.stderr
    assert_bitwise_equal(url2, ref)
    status = relulearn("status", url, "--json")
    assert '"mixed_platforms": false' in status.stdout


def test_fit_on_external_cluster_equals_in_process(external, tmp_path):
    """`fit --scheduler`: estimation, the learning stage's candidate maps and its extra passes
    run on the external cluster and give the network the in-process run gives, bit for bit."""
    data = {
        "seed": 4,
        "samples": 400_000,
        "chunk_size": 50_000,
        "run": {"commit_interval": 0},
        "source": {"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 3, "seed": 2}, "noise_std": 0.05},
    }
    cfg_path = write_config(tmp_path / "fit.yaml", data)
    outs = {}
    for where, flags in (("local", ["--in-process"]), ("external", ["--scheduler", external.file])):
        model = str(tmp_path / f"{where}.npz")
        done = relulearn(
            "fit",
            str(cfg_path),
            "--store",
            str(tmp_path / f"{where}.zarr"),
            "--method",
            "moments",
            "--out",
            model,
            "--quiet",
            "--json",
            *flags,
        )
        assert done.returncode == 0, done.stderr
        outs[where] = np.load(model)
    assert outs["local"]["W0"].shape == (3, 20)
    for k in ("W0", "W1"):
        assert np.array_equal(outs["local"][k], outs["external"][k]), k


@pytest.mark.slow
def test_driver_started_before_the_scheduler_and_env_address(families, tmp_path):
    """A driver waits for its scheduler file like `dask worker` does; without --scheduler it uses
    DASK_SCHEDULER_ADDRESS (as in a Kubernetes DaskJob) instead of starting a local cluster."""
    cfg_path, ref = families
    cluster = ExternalCluster(tmp_path / "cluster", workers=2)
    url = str(tmp_path / "early.zarr")
    early = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "relulearn.cli",
            "estimate",
            str(cfg_path),
            "--store",
            url,
            "--scheduler",
            cluster.file,
            "--quiet",
            "--json",
        ],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2.0)
        assert early.poll() is None, early.communicate()
        cluster.start()
        out, err = early.communicate(timeout=180)
        assert early.returncode == 0, err
        assert_bitwise_equal(url, ref)
        from distributed import Client

        with Client(scheduler_file=cluster.file) as c:
            dashboard = c.dashboard_link
        url2 = str(tmp_path / "env.zarr")
        done = subprocess.run(
            [PYTHON, "-m", "relulearn.cli", "estimate", str(cfg_path), "--store", url2, "--quiet", "--json"],
            env=dict(cli_env(), DASK_SCHEDULER_ADDRESS=cluster.address),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["dashboard"] == dashboard  # the external cluster's, not a new one
        assert_bitwise_equal(url2, ref)
    finally:
        early.kill()
        cluster.stop()


def _kill_driver_until(cmd: list[str], url: str, kills: int, rng: np.random.Generator) -> list[int]:
    """Run ``cmd`` and SIGKILL its driver (only the driver: an external cluster lives on) each
    time the store has advanced by at least one commit since the last kill."""
    progress = [0]
    for _ in range(kills):
        proc = subprocess.Popen(
            cmd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if committed(url) > progress[-1]:
                break
            time.sleep(0.05)
        time.sleep(float(rng.uniform(0.0, 0.5)))  # land inside a block or a commit
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        progress.append(committed(url))
    return progress[1:]


@pytest.mark.slow
def test_driver_sigkill_with_external_cluster_resumes_bitwise(long_run, external, tmp_path):
    """Three SIGKILLs of the driver with commits in between; a new driver on the same cluster resumes."""
    cfg_path, ref = long_run
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
        "--scheduler",
        external.file,
        "--quiet",
        "--commit-interval",
        "0",
        "--break-lock",
    ]
    progress = _kill_driver_until(cmd, url, 3, np.random.default_rng(8))
    assert len(progress) == 3 and 0 < progress[0] < progress[1] < progress[2] < LONG["samples"], progress
    done = subprocess.run(cmd + ["--json"], env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_bitwise_equal(url, ref)
    assert_each_chunk_once(url, LONG["samples"] // LONG["chunk_size"])
    assert [p.name for p in Path(url).iterdir() if p.is_dir()] == [open_store(url).head]


@pytest.mark.slow
def test_worker_sigkill_twice_run_completes(long_run, tmp_path):
    """SIGKILL a `dask worker` process twice mid-run: Dask recomputes its blocks, each is merged once."""
    cfg_path, ref = long_run
    url = str(tmp_path / "wk.zarr")
    with ExternalCluster(tmp_path / "cluster", workers=2) as cluster:
        proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "relulearn.cli",
                "estimate",
                str(cfg_path),
                "--store",
                url,
                "--scheduler",
                cluster.file,
                "--quiet",
                "--json",
                "--commit-interval",
                "0",
            ],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        killed, seen = [], 0
        deadline = time.monotonic() + 240
        while len(killed) < 2 and proc.poll() is None and time.monotonic() < deadline:
            samples = committed(url)
            if samples > seen + 200_000:  # let blocks run between the kills
                victims = cluster.worker_processes()
                if victims:
                    victim = victims[len(killed) % len(victims)]
                    victim.send_signal(signal.SIGKILL)
                    killed.append((victim.pid, samples))
                    seen = samples
            time.sleep(0.1)
        out, err = proc.communicate(timeout=300)
    assert len(killed) == 2, f"the run ended before two workers could be killed: {killed}"
    assert killed[-1][1] < LONG["samples"]
    assert proc.returncode == 0, err
    assert_bitwise_equal(url, ref)
    assert_each_chunk_once(url, LONG["samples"] // LONG["chunk_size"])
    assert len(open_store(url).ledger()) == LONG["samples"] // LONG["chunk_size"]  # one row per block


@pytest.mark.slow
def test_scheduler_death_commits_and_resumes_on_a_new_scheduler(long_run, tmp_path):
    cfg_path, ref = long_run
    url = str(tmp_path / "sk.zarr")
    cluster = ExternalCluster(tmp_path / "cluster", workers=2).start()
    try:
        cmd = [
            PYTHON,
            "-m",
            "relulearn.cli",
            "estimate",
            str(cfg_path),
            "--store",
            url,
            "--scheduler",
            cluster.file,
            "--quiet",
            "--commit-interval",
            "0",
        ]
        proc = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and committed(url) < 200_000:
            time.sleep(0.05)
        cluster.kill_scheduler()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        assert "Traceback" not in err, err
        saved = open_store(url).samples
        assert 0 < saved < LONG["samples"]
        line = err.strip().splitlines()[-1]
        assert line.startswith("relulearn: error: lost the connection to the Dask scheduler"), line
        assert f"{saved:,} of {LONG['samples']:,} samples" in line and url in line
        assert "run the same command to resume: relulearn estimate" in line
        # every merged block was committed: the store holds a clean prefix of the run
        assert_each_chunk_once(url, saved // LONG["chunk_size"])
        cluster.stop()
        # a new scheduler (new address, same scheduler file) and new workers; the same command resumes
        cluster = ExternalCluster(tmp_path / "cluster", workers=2).start()
        done = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    finally:
        cluster.stop()
    assert_bitwise_equal(url, ref)
    assert_each_chunk_once(url, LONG["samples"] // LONG["chunk_size"])


# ------------------------------------------------------------------ bad input


def _intact(url: str, before: dict) -> None:
    after = store_arrays(url)
    assert sorted(after) == sorted(before)
    assert all(np.array_equal(before[k], after[k], equal_nan=True) for k in before)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory, families) -> tuple[Path, str, dict]:
    """A committed half-run to check that refused commands leave it as it was: made once for the module, as the
    commands of the tests that use it are all refused (a change by one fails it and every later one)."""
    cfg_path, _ = families
    url = str(tmp_path_factory.mktemp("half") / "half.zarr")
    estimate(load_config(cfg_path), url, samples=40_000, client="local", progress=None)
    return cfg_path, url, store_arrays(url)


def test_unreachable_scheduler(small_store):
    cfg_path, url, before = small_store
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(cli_env(), RELULEARN_CONNECT_TIMEOUT="1")
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "relulearn.cli",
            "estimate",
            str(cfg_path),
            "--store",
            url,
            "--scheduler",
            f"tcp://127.0.0.1:{port}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in done.stderr
    _intact(url, before)
    missing = subprocess.run(
        [
            PYTHON,
            "-m",
            "relulearn.cli",
            "estimate",
            str(cfg_path),
            "--store",
            url,
            "--scheduler",
            str(Path(url).parent / "nope.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "no such scheduler file" in missing.stderr, missing.stderr
    _intact(url, before)


def _shadow(tmp_path: Path, body: str) -> dict:
    """A PYTHONPATH whose `relulearn` package is ``body`` (a worker with another or no relulearn)."""
    pkg = tmp_path / "shadow" / "relulearn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return {"PYTHONPATH": str(pkg.parent)}


@pytest.mark.parametrize("case", ["other-version", "missing"])
def test_workers_with_another_or_no_relulearn_are_refused_before_any_block(small_store, tmp_path, case):
    from relulearn import __version__

    cfg_path, url, before = small_store
    body = (
        '__version__ = "0.0.7"\n'
        if case == "other-version"
        else 'raise ModuleNotFoundError("No module named \'relulearn\'", name="relulearn")\n'
    )
    worker_env = [{}, _shadow(tmp_path, body)]
    with ExternalCluster(tmp_path / "cluster", workers=2, worker_env=worker_env, preload=False) as cluster:
        from distributed import Client

        with Client(scheduler_file=cluster.file) as c:
            bad = [addr for addr, info in c.scheduler_info()["workers"].items() if info["name"] == "w1"][0]
        done = relulearn("estimate", str(cfg_path), "--store", url, "--scheduler", cluster.file)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"worker {bad}" in done.stderr, done.stderr
    if case == "other-version":
        assert "has relulearn 0.0.7" in done.stderr
        assert f"this driver has relulearn {__version__}" in done.stderr
    else:
        assert "cannot import relulearn" in done.stderr
    assert "no block was run" in done.stderr
    _intact(url, before)
    assert open_store(url).samples == 40_000


def test_status_names_the_platforms_of_a_mixed_store(families, tmp_path, monkeypatch):
    """A store extended on a node with another BLAS kernel says so. (This machine has one CPU
    type, so the other node's platform id is set by hand for the first half of the run.)"""
    import relulearn.pipeline.blocks as blocks_module

    cfg_path, ref = families
    url = str(tmp_path / "mixed.zarr")
    other = "numpy 2.4.6; openblas 0.3.31 Haswell"
    with monkeypatch.context() as m:
        m.setattr(blocks_module, "platform_id", lambda: other)
        estimate(load_config(cfg_path), url, samples=40_000, client="local", progress=None)
    assert open_store(url).platforms() == [other] * 4
    estimate(load_config(cfg_path), url, client="local", progress=None)
    status = json.loads(relulearn("status", url, "--json").stdout)
    here = open_store(ref).platforms()[0]
    assert status["platforms"] == [other, here] and status["mixed_platforms"] is True
    assert open_store(url).platforms() == [other] * 4 + [here] * 4
    human = relulearn("status", url).stdout
    assert "different numpy versions or BLAS kernels" in human and other in human and here in human
    assert "different" not in relulearn("status", ref).stdout


def test_symmetric_dense_and_blocked_sketch_updates_are_bitwise_equal_in_process_and_on_workers(client, tmp_path):
    """`output_moments` runs two symmetric rank-k updates per output from d = 64 and the `second` sketch
    works in row blocks of at least 512 rows: both paths at sizes where they run, with signed labels."""
    from relulearn.config import config_from_dict

    data = {
        "seed": 5,
        "samples": 100_000,
        "chunk_size": 25_000,
        "source": {"d": 80, "teacher": {"kind": "one_hidden_relu", "width": 3, "seed": 1}, "noise_std": 0.1},
        "statistics": {"output_moments": {}, "sketch": {"rank": 16, "second": {}}},
        "run": {"commit_interval": 1e9},
    }
    ref, url = str(tmp_path / "ref.zarr"), str(tmp_path / "w2.zarr")
    estimate(config_from_dict(data), ref, client="local", progress=None)
    estimate(config_from_dict(data), url, client=client, progress=None)
    assert_bitwise_equal(url, ref)
    t2 = open_store(ref).estimate("output_moments", "T2")[0]
    assert np.array_equal(t2, np.swapaxes(t2, -1, -2))  # exactly symmetric


def _listeners(pid: int) -> dict[int, list[tuple[str, int]]]:
    """The listening TCP sockets of process ``pid`` and its descendants (scheduler, nannies, workers)."""
    import psutil  # a dependency of distributed

    root = psutil.Process(pid)
    out = {}
    for p in [root] + root.children(recursive=True):
        try:
            conns = p.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out[p.pid] = [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip == "::1"


def _listeners_of_a_running_estimate(tmp_path: Path, *extra: str) -> tuple[dict[int, list[tuple[str, int]]], str]:
    """Start `relulearn estimate --workers 2` as a user would, read the sockets its process tree listens on
    once the cluster is up (the dashboard line is printed), then kill its process group: how a run stops is
    not what this reads (Ctrl-C has its tests), and a graceful stop of the cluster took seconds per run."""
    tmp_path.mkdir()
    cfg = write_config(tmp_path / "run.yaml", all_families(samples=100_000_000, statistics={"basic": {}}))
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "relulearn.cli",
            "estimate",
            str(cfg),
            "--store",
            str(tmp_path / "s.zarr"),
            "--workers",
            "2",
            *extra,
        ],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the driver, its nannies and workers are killed at once
    )
    try:
        line = ""
        while not line.startswith("dashboard: "):
            line = proc.stderr.readline()
            assert line or proc.poll() is None, f"the run ended: {proc.stderr.read()}"
        listening = _listeners(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):  # (a run that ended early left no group to kill)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    return listening, line.split("dashboard: ", 1)[1].strip()


def test_the_local_cluster_listens_on_loopback_only_unless_the_dashboard_is_exposed(tmp_path):
    """By default no process of a local run (driver with its scheduler and dashboard, nannies, workers) listens
    on an address other than 127.0.0.1; `--dashboard 0.0.0.0:0` exposes the dashboard alone."""
    from urllib.parse import urlsplit

    listening, link = _listeners_of_a_running_estimate(tmp_path / "default")
    # the driver (scheduler, dashboard, the two nannies) and the two worker processes
    assert sum(bool(addrs) for addrs in listening.values()) >= 3, listening
    exposed = {pid: [a for a in addrs if not _loopback(a[0])] for pid, addrs in listening.items()}
    assert not any(exposed.values()), exposed
    port = urlsplit(link).port
    assert ("127.0.0.1", port) in next(iter(listening.values())), (link, listening)  # the driver's dashboard

    listening, link = _listeners_of_a_running_estimate(tmp_path / "exposed", "--dashboard", "0.0.0.0:0")
    exposed = [(pid, a) for pid, addrs in listening.items() for a in addrs if not _loopback(a[0])]
    driver = next(iter(listening))
    assert len(exposed) == 1 and exposed[0][0] == driver and exposed[0][1][1] == urlsplit(link).port, exposed


@pytest.mark.slow
def test_a_dashboard_on_every_interface_is_printed_as_such(tmp_path):
    """`--dashboard :0` listens on 0.0.0.0: the printed line says so, with the port it listens on (it printed
    http://127.0.0.1:PORT/status alone, as if on loopback)."""
    from urllib.parse import urlsplit

    listening, line = _listeners_of_a_running_estimate(tmp_path / "every", "--dashboard", ":0")
    exposed = [a for addrs in listening.values() for a in addrs if not _loopback(a[0])]
    assert len(exposed) == 1 and exposed[0][0] == "0.0.0.0", exposed
    port = exposed[0][1]
    assert line == f"http://127.0.0.1:{port}/status (listening on every interface: 0.0.0.0:{port})", line
    assert urlsplit(line).port == port


def test_a_dashboard_address_is_checked():
    from relulearn.config import ConfigError, config_from_dict
    from relulearn.pipeline.cluster import check_dashboard

    base = all_families()
    assert config_from_dict(dict(base, run={"dashboard": "0.0.0.0:8787"})).run.dashboard == "0.0.0.0:8787"
    with pytest.raises(ConfigError, match="dashboard"):
        config_from_dict(dict(base, run={"dashboard": "8787"}))
    for bad in ("8787", "localhost:http", "host:99999"):
        with pytest.raises(ValueError, match="expected HOST:PORT"):
            check_dashboard(bad)
    proc = subprocess.run(
        [PYTHON, "-m", "relulearn.cli", "estimate", "x.yaml", "--store", "s.zarr", "--dashboard", "8787"],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "expected HOST:PORT" in proc.stderr, proc.stderr
