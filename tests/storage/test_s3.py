"""Stores on S3: a real moto server on 127.0.0.1, spoken to over HTTP by s3fs (no mocks).

Estimate, status, resume, extend, merge and learn against ``s3://`` URLs; SIGKILL of the
driver at random moments and inside a commit (the store reads as the previous commit, and
resuming gives the bits of an uninterrupted local run); missing credentials and unreachable
endpoints as one-line errors; xarray opening a statistic from the consolidated metadata.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import PYTHON, TWO_UNITS, cli_env, relulearn, require

require("s3")

import boto3  # noqa: E402
from stores import assert_bitwise_equal, assert_each_chunk_once, store_arrays  # noqa: E402

from relulearn import api, open_store  # noqa: E402
from relulearn.config import config_from_dict  # noqa: E402
from relulearn.storage import RunStore  # noqa: E402

BUCKET = "relulearn-test"
#: the path of a chunk object (zarr's default key encoding with separator ".": c.0.1, or c for a 0-d array)
CHUNK = re.compile(r"/c(\.\d+)*(\?|$)")

#: several statistics (coordinates of several kinds), d >= 20 for bitwise claims
RUN = {
    "seed": 5,
    "samples": 24_000,
    "chunk_size": 4_000,
    "source": {"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 2}, "noise_std": 0.1},
    "statistics": {
        "basic": {},
        "contracted": {"orders": [2, 4], "directions": 2, "directions_seed": 3},
        "filtered": {"quantiles": [0.5, 0.9]},
    },
    "run": {"chunks_per_block": 2, "commit_interval": 1e9},
}

#: many small blocks: commits (~80 objects each, `basic` is always included) dominate the run time
KILL = {
    "seed": 7,
    "samples": 24_000,
    "chunk_size": 2_000,
    "source": {"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 2}, "noise_std": 0.1},
    "statistics": {"filtered": {"quantiles": [0.3, 0.6, 0.9]}},
    "run": {"chunks_per_block": 1, "commit_interval": 0},
}


class S3:
    """The moto server: its endpoint, the environment that reaches it, and what it was asked."""

    def __init__(self, endpoint: str, env: dict[str, str], log: Path):
        self.endpoint, self.env, self.log = endpoint, env, log
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def url(self, name: str) -> str:
        return f"s3://{BUCKET}/{name}"

    def objects(self, prefix: str) -> dict[str, str]:
        """``{key below prefix: ETag}`` of every object under ``prefix/``."""
        out, token = {}, None
        while True:
            kw = {"ContinuationToken": token} if token else {}
            page = self.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/", **kw)
            out.update({o["Key"][len(prefix) + 1 :]: o["ETag"] for o in page.get("Contents", [])})
            if not page.get("IsTruncated"):
                return out
            token = page["NextContinuationToken"]

    def generations(self, prefix: str) -> dict[str, int]:
        """Objects per generation prefix ``gNNNNNN`` of the store at ``prefix``."""
        gens: dict[str, int] = {}
        for key in self.objects(prefix):
            top = key.split("/", 1)[0]
            if re.fullmatch(r"g\d{6}", top):
                gens[top] = gens.get(top, 0) + 1
        return gens

    def requests(self, since: int) -> list[tuple[str, str, int]]:
        """``(method, path, status)`` of the requests the server logged after line ``since``."""
        out = []
        for line in self.log.read_text().splitlines()[since:]:
            m = re.search(r'"(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/[\d.]+" (\d+)', line)
            if m:
                out.append((m.group(1), m.group(2), int(m.group(3))))
        return out

    def mark(self) -> int:
        return len(self.log.read_text().splitlines())


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    d = tmp_path_factory.mktemp("s3")
    log = d / "moto.log"
    with open(log, "w") as f:
        server = subprocess.Popen(
            [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"], stdout=f, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        port = None
        while port is None:
            m = re.search(r"Running on http://127\.0\.0\.1:(\d+)", log.read_text())
            if m:
                port = int(m.group(1))
            elif server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the moto server did not start: {log.read_text()}")
            else:
                time.sleep(0.05)
        (d / "aws").mkdir()
        for name in ("config", "credentials"):  # nothing from the user's ~/.aws
            (d / "aws" / name).write_text("")
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": str(d / "aws" / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(d / "aws" / "credentials"),
        }
        with pytest.MonkeyPatch.context() as mp:
            for k in [k for k in os.environ if k.startswith("AWS_")]:
                mp.delenv(k)
            for k, v in env.items():
                mp.setenv(k, v)
            s = S3(env["AWS_ENDPOINT_URL"], env, log)
            s.client.create_bucket(Bucket=BUCKET)
            yield s
    finally:
        server.kill()
        server.wait()


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def cli(*args) -> subprocess.CompletedProcess:
    return relulearn(*args)


def cli_parallel(*commands: tuple[dict, tuple]) -> list[subprocess.CompletedProcess]:
    """Run ``(env, args)`` commands concurrently (interpreter starts dominate their time)."""
    procs = [
        subprocess.Popen(
            [PYTHON, "-m", "relulearn.cli", *map(str, args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env, args in commands
    ]
    out = []
    for p, (_, args) in zip(procs, commands):
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(args, p.returncode, stdout, stderr))
    return out


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """Uninterrupted local-directory runs (in-process), to compare S3 stores with bit for bit."""
    d = tmp_path_factory.mktemp("local")
    refs = {}
    for name, data in (("run", RUN), ("kill", KILL)):
        url = str(d / f"{name}.zarr")
        api.estimate(config_from_dict(data), url, client="local", progress=None)
        refs[name] = url
    return refs


@pytest.fixture(scope="module")
def base(s3) -> str:
    """A committed S3 store of RUN (12,000 samples), made in-process; tests only read it."""
    url = s3.url("base")
    api.estimate(config_from_dict(RUN), url, samples=12_000, client="local", progress=None)
    return url


# ---------------------------------------------------------------- the commands on s3://


def test_estimate_status_extend_on_s3(s3, local_reference, tmp_path):
    cfg = write_yaml(tmp_path / "run.yaml", RUN)
    url = s3.url("cli/run")
    first = api.estimate(config_from_dict(RUN), url, samples=16_000, client="local", progress=None)
    assert first.samples == 16_000 and first.store == url
    status = cli("status", url, "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert (
        info["store"] == url and info["samples"] == 16_000 and info["statistics"] == ["basic", "contracted", "filtered"]
    )
    # the CLI without --samples extends the run to the configuration's 24,000 samples
    again = cli("estimate", cfg, "--store", url, "--in-process", "--json", "--quiet")
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["resumed_from_samples"] == 16_000 and summary["samples"] == 24_000
    assert_bitwise_equal(url, local_reference["run"])
    assert_each_chunk_once(url, 6)
    # one generation, the root document, nothing else (no probe object, no older generation)
    keys = s3.objects("cli/run")
    assert {k.split("/", 1)[0] for k in keys} == {"zarr.json", open_store(url).head}


def test_merge_on_s3(s3, tmp_path):
    """Two seeds, one on S3 and one in a local directory, merged into a new S3 store."""
    stats = {
        "basic": {},
        "contracted": {"orders": [2, 4], "directions": 2, "directions_seed": 5},
        "filtered": {"thresholds": [0.1, 0.5]},
    }
    a, b, out = s3.url("merge/a"), str(tmp_path / "b.zarr"), s3.url("merge/ab")
    for seed, url in ((1, a), (2, b)):
        api.estimate(
            config_from_dict(dict(RUN, seed=seed, samples=8_000, statistics=stats)), url, client="local", progress=None
        )
    proc = cli("merge", a, b, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["seeds"] == [1, 2]
    ra, rb, rc = open_store(a), open_store(b), open_store(out)
    assert rc.samples == 16_000
    for stat in ("basic", "contracted", "filtered"):
        xa, xb, xc = ra.arrays(stat), rb.arrays(stat), rc.arrays(stat)
        for k in xa:
            if k.startswith(("sum_", "sumsq_")):
                assert np.array_equal(xc[k], xa[k] + xb[k]), f"{stat}/{k}"


def test_learn_from_s3_with_a_pass_stored_under_the_store(s3, tmp_path):
    data = {
        "seed": 10,
        "samples": 100_000,
        "chunk_size": 25_000,
        "source": {"d": 8, "teacher": {"kind": "one_hidden_relu", "width": 2, "seed": 10}, "noise_std": 0.0},
        "statistics": {"contracted": {"orders": [2, 4], "directions": 8}},
        "run": {"commit_interval": 1e9},
    }
    cfg = write_yaml(tmp_path / "planted.yaml", data)
    url = s3.url("learn")
    api.estimate(config_from_dict(data), url, client="local", progress=None)
    # width 2 (CLI): learned exactly from the statistics on S3
    exact = cli(
        "learn", url, "--method", "moments", "--width", 2, "--in-process", "--json", "--out", tmp_path / "m2.npz"
    )
    assert exact.returncode == 0, exact.stderr
    assert json.loads(exact.stdout)["passes"] == []
    ev = api.evaluate(str(tmp_path / "m2.npz"), cfg, samples=20_000)
    assert ev["parameter_error"] <= 1e-8, ev
    # width 3, more than the noise floor supports: one extra pass, estimated into STORE/passes/ on S3
    wide = api.learn(url, "moments", width=3, out=str(tmp_path / "m3.npz"), client="local", progress=None)
    (p,) = wide["passes"]
    assert p["store"].startswith(url + "/passes/adaptive-1-")
    pass_prefix = p["store"].removeprefix(f"s3://{BUCKET}/")
    assert open_store(p["store"]).samples == 100_000
    assert set(s3.generations(pass_prefix)) == {open_store(p["store"]).head}
    # the main store is untouched by the pass below it, and still reads
    assert open_store(url).samples == 100_000 and len(s3.generations("learn")) == 1


@pytest.mark.parametrize("fmt", ["npy", pytest.param("parquet", marks=pytest.mark.extra("data"))])
def test_a_data_file_on_s3_read_through_nested_storage_options(s3, fmt, tmp_path, monkeypatch):
    """``source.data.storage_options: {client_kwargs: {endpoint_url: ...}}`` (nested: the usual way to reach an S3
    endpoint) reaches the server with no AWS_ENDPOINT_URL set; the statistics equal bit for bit those of the same
    file read from a local path."""
    from datafiles import planted_data, write

    *_, x, y = planted_data(seed=4, rows=20_000, d=4)
    local = write(fmt, tmp_path, x, y)
    remote = dict(local)
    for key in ("x", "y"):
        name = f"nested-{fmt}/{Path(local[key]).name}"
        s3.client.put_object(Bucket=BUCKET, Key=name, Body=Path(local[key]).read_bytes())
        remote[key] = s3.url(name)
    remote["storage_options"] = {"client_kwargs": {"endpoint_url": s3.endpoint}}
    run = {"seed": 0, "samples": 20_000, "chunk_size": 5_000, "source": {"d": 4}}
    api.estimate(
        config_from_dict({**run, "source": {"d": 4, "data": local}}),
        str(tmp_path / "local.zarr"),
        client="local",
        progress=None,
    )
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the endpoint comes from the nested options only
    cfg = config_from_dict({**run, "source": {"d": 4, "data": remote}})
    got = api.estimate(cfg, str(tmp_path / "s3.zarr"), client="local", progress=None)
    assert got.samples == 20_000
    remote_arrays, local_arrays = store_arrays(str(tmp_path / "s3.zarr")), store_arrays(str(tmp_path / "local.zarr"))
    assert sorted(remote_arrays) == sorted(local_arrays)
    for name, arr in local_arrays.items():  # (the fingerprints differ: they stamp an object's ETag, a file's mtime)
        assert np.array_equal(remote_arrays[name], arr, equal_nan=True), name


def test_a_store_inside_a_store_on_s3_is_refused_and_its_objects_unchanged(s3, base, tmp_path):
    """``--store s3://bucket/base/g000099`` (a generation-like name the outer store's next commit deletes): exit 2,
    one line naming the outer store; not an object of the bucket changed."""
    cfg = write_yaml(tmp_path / "run.yaml", RUN)
    prefix = base.removeprefix(f"s3://{BUCKET}/")
    before = s3.objects(prefix)
    done = cli("estimate", cfg, "--store", f"{base}/g000099", "--samples", 12_000, "--in-process")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and f"inside the relulearn store {base}" in done.stderr
    assert s3.objects(prefix) == before


# ------------------------------------------------------------- outputs on s3:// and file://

# the networks compared are learned from the same local store (conftest.TWO_UNITS), so equal bit for bit


def _object(s3, url: str) -> bytes:
    return s3.client.get_object(Bucket=BUCKET, Key=url.removeprefix(f"s3://{BUCKET}/"))["Body"].read()


def _same_network(a, b) -> bool:
    return a.activation == b.activation and all(np.array_equal(x, y) for x, y in zip(a.weights, b.weights))


def test_models_predictions_and_reports_are_written_to_urls_and_read_back(s3, tmp_path):
    """fit and learn --out s3://, --report s3://, predict of a model on S3 to s3:// and file://: each object's
    bytes load back to the network (or the predictions) of a local run, bit for bit."""
    import io

    from relulearn.network import Network

    cfg = write_yaml(tmp_path / "run.yaml", TWO_UNITS)
    store = str(tmp_path / "run.zarr")
    fit = cli("fit", cfg, "--store", store, "--width", 2, "--in-process", "--quiet", "--out", s3.url("out/fit.npz"))
    assert fit.returncode == 0, fit.stderr
    local = cli("learn", store, "--width", 2, "--in-process", "--quiet", "--out", tmp_path / "local.npz")
    assert local.returncode == 0, local.stderr
    net = Network.load(tmp_path / "local.npz")
    learned = cli(
        "learn", store, "--width", 2, "--in-process", "--json", "--out", s3.url("out/learn.npz"),
        "--report", s3.url("out/learn.json"),
    )  # fmt: skip
    assert learned.returncode == 0, learned.stderr
    for name in ("fit.npz", "learn.npz"):
        with np.load(io.BytesIO(_object(s3, s3.url(f"out/{name}")))) as arrays:
            assert _same_network(Network.from_arrays(dict(arrays)), net), name
    assert json.loads(_object(s3, s3.url("out/learn.json"))) == json.loads(learned.stdout)
    # predict reads the model and its inputs from S3 and writes to s3:// and to file://
    x = np.random.default_rng(0).standard_normal((50, 6))
    np.save(tmp_path / "x.npy", x)
    s3.client.put_object(Bucket=BUCKET, Key="out/x.npy", Body=(tmp_path / "x.npy").read_bytes())
    for out in (s3.url("out/y.npy"), f"file://{tmp_path}/y.npy"):
        done = cli("predict", s3.url("out/learn.npz"), "--input", s3.url("out/x.npy"), "--out", out)
        assert done.returncode == 0, done.stderr
    expected = net.forward(x)[:, 0]
    assert np.array_equal(np.load(io.BytesIO(_object(s3, s3.url("out/y.npy")))), expected)
    assert np.array_equal(np.load(tmp_path / "y.npy"), expected)
    # a model at a file:// URL, written and read
    assert (
        cli("learn", store, "--width", 2, "--in-process", "--quiet", "--out", f"file://{tmp_path}/f.npz").returncode
        == 0
    )
    assert _same_network(Network.load(f"file://{tmp_path}/f.npz"), net)


@pytest.mark.extra("report")
def test_a_report_is_written_to_s3(s3, tmp_path):
    """The report of a model on S3, written to s3://, is the bytes of the same report written locally."""
    model, store = s3.url("report/model.npz"), str(tmp_path / "run.zarr")
    api.fit(config_from_dict(TWO_UNITS), store, "moments", width=2, out=model, client="local", progress=None)
    for out in (s3.url("report/report.html"), str(tmp_path / "report.html")):
        done = cli("report", store, "--model", model, "--out", out)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"wrote {out} ("), done.stdout
    assert _object(s3, s3.url("report/report.html")) == (tmp_path / "report.html").read_bytes()


WRITER = """
import sys
import numpy as np
from relulearn.network import Network
rng = np.random.default_rng(7)
nets = [Network((rng.standard_normal((1500, 1500)), np.ones((1, 1500))), activation="relu") for _ in range(2)]
nets[0].save(sys.argv[1])
print("ready", flush=True)
while True:
    for net in nets[::-1]:
        net.save(sys.argv[1])
"""


def test_a_model_upload_killed_mid_put_leaves_a_whole_object(s3, tmp_path):
    """A process saving two 18 MB networks in turn to s3:// is SIGKILLed at 4 moments (each upload takes about
    0.2 s): after each kill the object loads and is bitwise one of the two networks, never a part of one."""
    from relulearn.network import Network

    url = s3.url("killed/model.npz")
    rng = np.random.default_rng(7)
    written = [rng.standard_normal((1500, 1500)) for _ in range(2)]
    for trial in range(4):
        proc = subprocess.Popen([PYTHON, "-c", WRITER, url], stdout=subprocess.PIPE, env=cli_env())
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(0.05 + 0.2 * trial)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        got = Network.load(url).weights[0]
        assert any(np.array_equal(got, w) for w in written), trial


# ------------------------------------------------------------------------ crashes


@pytest.mark.slow
def test_sigkill_at_random_moments_resumes_bitwise(s3, local_reference, tmp_path):
    cfg = write_yaml(tmp_path / "kill.yaml", KILL)
    url, prefix = s3.url("kill/random"), "kill/random"
    # a killed driver leaves its lease behind: each new driver breaks it (the previous one is dead)
    cmd = [
        PYTHON,
        "-m",
        "relulearn.cli",
        "estimate",
        str(cfg),
        "--store",
        url,
        "--in-process",
        "--quiet",
        "--commit-interval",
        "0",
        "--break-lock",
    ]
    rng = np.random.default_rng(20261203)
    kills, in_commit, progress, failure = 0, 0, [], ""
    for _ in range(6):
        proc = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # wait for this process's first commit, then a random moment (a commit takes ~0.5 s here)
        start = (RunStore(url).meta() or {}).get("commits", -1)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if (RunStore(url).meta() or {}).get("commits", -1) > start:
                break
            time.sleep(0.1)
        time.sleep(float(rng.uniform(0.0, 1.0)))
        if proc.poll() is not None:
            failure = proc.stderr.read().decode() if proc.returncode else ""
            break  # finished (or failed) before the kill
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        kills += 1
        progress.append(open_store(url).samples)
        # a generation newer than the head: the kill landed inside a commit's write (the one before the head is
        # kept until the next commit)
        in_commit += any(g > open_store(url).head for g in s3.generations(prefix))
        if kills >= 3:
            break
    assert kills >= 3, f"the run ended before it could be killed 3 times (progress {progress}) {failure}"
    assert 0 < progress[-1] < KILL["samples"]
    print(f"{kills} kills, {in_commit} inside a commit; committed samples after each: {progress}")
    # resume (in-process: the code of the CLI's --in-process without another interpreter start; one
    # commit at the end, which changes only the ledger's commit numbers, not the statistics)
    api.estimate(config_from_dict(KILL), url, client="local", progress=None, commit_interval=1e9, break_lock=True)
    assert_bitwise_equal(url, local_reference["kill"])
    assert_each_chunk_once(url, KILL["samples"] // KILL["chunk_size"])
    # only the committed generation is left: leftovers of killed commits were removed
    assert set(s3.generations(prefix)) == {open_store(url).head}


#: runs the CLI with object PUTs patched to stall (the process is then SIGKILLed by the test)
STALLING_DRIVER = textwrap.dedent("""
    import re, sys, time
    from zarr.storage import FsspecStore

    # stall in this process's commit-th commit, once `after` objects of its generation are
    # stored (after < 0: once the generation is complete, before the root zarr.json is written)
    commit, after = int(sys.argv[1]), int(sys.argv[2])
    state = {"commits": 0, "started": 0, "stored": 0}
    put = FsspecStore.set

    def stall(where):
        print("STALLED", where, flush=True)
        time.sleep(600)  # blocks zarr's I/O loop: no further request is sent

    async def stalling_set(self, key, value, byte_range=None):
        in_generation = re.match(r"g\\d{6}/", key) is not None
        if key == "zarr.json":
            if state["commits"] == commit and after < 0:
                stall("switch")
            state["started"] = state["stored"] = 0
        elif in_generation:
            if state["started"] == 0:
                state["commits"] += 1
            state["started"] += 1
        await put(self, key, value, byte_range)
        if in_generation:
            state["stored"] += 1
            if state["commits"] == commit and state["stored"] == after:
                stall(key.split("/")[0])

    FsspecStore.set = stalling_set
    from relulearn.cli import main
    sys.exit(main(sys.argv[3:]))
""")


@pytest.mark.slow
def test_sigkill_inside_a_commit_leaves_the_previous_commit(s3, local_reference, tmp_path):
    """Kill the driver (1) with a generation half written, (2) with it complete but ``head``
    not yet switched: each time the store reads as the previous commit; resuming completes
    bit for bit."""
    cfg = write_yaml(tmp_path / "kill.yaml", KILL)
    url, prefix = s3.url("kill/commit"), "kill/commit"
    driver = tmp_path / "stalling_driver.py"
    driver.write_text(STALLING_DRIVER)
    args = ["estimate", str(cfg), "--store", url, "--in-process", "--quiet", "--commit-interval", "0", "--break-lock"]
    objects_per_generation = None
    for commit, after in ((2, 12), (1, -1)):
        proc = subprocess.Popen(
            [PYTHON, str(driver), str(commit), str(after), *args],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = proc.stdout.readline()
        assert line.startswith("STALLED"), (line, proc.stderr.read() if proc.poll() is not None else "")
        committed = open_store(url)
        gens = s3.generations(prefix)
        orphans = {g: n for g, n in gens.items() if g != committed.head}
        assert len(orphans) == 1, gens
        ((orphan, n_orphan),) = orphans.items()
        objects_per_generation = gens[committed.head]
        if after >= 0:  # a generation partly written: some of its objects, not all
            assert 0 < n_orphan < objects_per_generation, gens
        else:  # a complete generation that head does not name yet
            assert n_orphan == objects_per_generation, gens
        assert orphan > committed.head
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        # the store reads as its last commit: that many samples, bitwise a local run of them
        after_kill = open_store(url)
        assert after_kill.head == committed.head and after_kill.samples == committed.samples > 0
        ref = str(tmp_path / f"ref{commit}.zarr")
        api.estimate(
            config_from_dict(KILL), ref, samples=after_kill.samples, client="local", progress=None, commit_interval=1e9
        )
        assert_bitwise_equal(url, ref)
    api.estimate(
        config_from_dict(KILL), url, client="local", progress=None, commit_interval=1e9, break_lock=True
    )  # resume (the killed driver left its lease)
    assert_bitwise_equal(url, local_reference["kill"])
    assert_each_chunk_once(url, KILL["samples"] // KILL["chunk_size"])
    assert s3.generations(prefix) == {open_store(url).head: objects_per_generation}


# -------------------------------------------------------------------------- bad input


def _bare_env(s3, **extra) -> dict[str, str]:
    """The CLI environment without any AWS credentials or endpoint (and no ~/.aws files)."""
    env = {k: v for k, v in cli_env().items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=s3.env["AWS_CONFIG_FILE"],
        AWS_EC2_METADATA_DISABLED="true",
        AWS_SHARED_CREDENTIALS_FILE=s3.env["AWS_SHARED_CREDENTIALS_FILE"],
        **extra,
    )
    return env


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


def _assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("relulearn: error: "), proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def test_refused_commands_are_one_line_errors_and_leave_the_store_intact(s3, base, tmp_path):
    """No credentials, an unreachable endpoint, a missing bucket, another configuration."""
    cfg = write_yaml(tmp_path / "run.yaml", RUN)
    other = write_yaml(tmp_path / "other.yaml", dict(RUN, chunk_size=2_000))
    before = s3.objects("base")
    closed = f"http://127.0.0.1:{_closed_port()}"
    # no credentials anywhere; the endpoint is a closed loopback port, so nothing can reach AWS
    no_credentials = _bare_env(s3, AWS_ENDPOINT_URL=closed)
    # credentials, but nothing listens at the endpoint (one attempt per request keeps this short)
    unreachable = _bare_env(
        s3, AWS_ENDPOINT_URL=closed, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_MAX_ATTEMPTS="1"
    )
    missing_bucket = f"s3://no-such-bucket-{os.getpid()}/run"
    t0 = time.perf_counter()
    procs = cli_parallel(
        (no_credentials, ("estimate", cfg, "--store", base, "--in-process", "--samples", 24_000)),
        (unreachable, ("estimate", cfg, "--store", base, "--in-process", "--samples", 24_000)),
        (cli_env(), ("estimate", cfg, "--store", missing_bucket, "--in-process")),
        (cli_env(), ("estimate", other, "--store", base, "--in-process")),
    )
    assert time.perf_counter() - t0 < 45
    _assert_one_line_error(
        procs[0], base, "no S3 credentials", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"
    )
    _assert_one_line_error(procs[1], base, f"endpoint {closed} is unreachable", "AWS_ENDPOINT_URL")
    _assert_one_line_error(procs[2], missing_bucket, "does not exist", "create it")
    _assert_one_line_error(procs[3], base, "different fingerprint", "chunk_size", "not modified")
    # the existing store is intact (every object, by ETag) and still reads
    assert s3.objects("base") == before
    assert open_store(base).samples == 12_000


def test_the_lease_on_s3_is_taken_with_a_conditional_put(s3, base, tmp_path):
    """On S3 the lease is one PUT with If-None-Match: *: the server refuses it when lease.json exists. A second
    writer is refused naming the holder, a refused writer leaves every object as it was, and `status` names
    the holder."""
    import fsspec

    from relulearn.storage.lease import Lease, StoreLockedError

    before = s3.objects("base")
    with Lease.acquire(base, heartbeat=0) as lease:
        fs, path = fsspec.core.url_to_fs(base + "/lease.json")
        with pytest.raises(OSError):  # the server's answer to a second exclusive PUT: 412 Precondition Failed
            with fs.open(path, "xb") as f:
                f.write(b"{}")
        assert json.loads(fs.cat_file(path))["holder"] == lease.info.holder
        with pytest.raises(StoreLockedError, match=f"is locked: process {os.getpid()}"):
            api.estimate(config_from_dict(RUN), base, samples=24_000, client="local", progress=None)
        assert api.status(base)["lease"]["holder"] == lease.info.holder
    assert s3.objects("base") == before  # the lease is gone again, and nothing else was touched


# --------------------------------------------------------------------------- xarray


def test_xarray_opens_a_statistic_with_one_metadata_read(s3, base):
    import dask
    import xarray as xr

    # xarray's lazy arrays are computed by dask; another test module's LocalCluster may be the
    # default scheduler, and its workers do not have this test's S3 credentials
    with dask.config.set(scheduler="synchronous"):
        _check_xarray(s3, base, xr)


def _check_xarray(s3, base, xr):
    run = open_store(base)
    root = f"/{BUCKET}/base/zarr.json"
    for stat in run.statistics:
        mark = s3.mark()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "failed to open consolidated metadata" warning
            ds = xr.open_zarr(base, group=f"{run.head}/{stat}")
        reqs = s3.requests(mark)
        # metadata: the root's zarr.json is the only object read (s3fs HEADs it before the GET)...
        metadata_reads = [r for r in reqs if r[0] == "GET" and r[2] == 200 and r[1].endswith(".json")]
        assert metadata_reads == [("GET", root, 200)], reqs
        assert not [r for r in reqs if r[1].endswith("zarr.json") and r[1] != root], reqs
        # ...the rest is zarr probing for zarr v2 keys (absent), and the chunks of index coordinates
        for method, path, status in reqs:
            if path == root:
                continue
            if status == 404 or "list-type=2" in path:
                assert re.search(r"\.(zgroup|zattrs|zmetadata)", path), (method, path, status)
            else:
                assert path.startswith(f"/{BUCKET}/base/{run.head}/{stat}/") and CHUNK.search(path), path
                name = path.split("/")[5]
                assert name in ds.indexes, path
        # StoredRun.dataset (zarr_format=3, s3fs reading whole objects): no metadata read at all, the handle's
        # pinned root document describes its commit; only the chunks of index coordinates
        mark = s3.mark()
        ds3 = run.dataset(stat)
        reqs = [r for r in s3.requests(mark) if not CHUNK.search(r[1])]
        assert reqs == [], reqs
        assert set(ds3.variables) == set(ds.variables)
    # coordinates: what describes a statistic (grids, banks), not what estimates it
    filtered = run.dataset("filtered")
    assert set(filtered.coords) == {"tau", "quantile"}
    assert {"tau", "quantile"} <= set(filtered["M"].coords) and "tau" in filtered.indexes
    np.testing.assert_array_equal(filtered["quantile"].values, [0.5, 0.9])
    contracted = run.dataset("contracted")
    assert set(contracted.coords) == {"direction", "pair_order", "pair_direction"}
    assert contracted["direction"].dims == ("direction", "i")
    assert set(contracted["M"].coords) == {"pair_order", "pair_direction"}
    assert not run.dataset("basic").coords
    assert {"M", "M_se", "prob", "count", "sum_bin_xx"} <= set(filtered.data_vars)
    # values through xarray are the stored values
    np.testing.assert_array_equal(filtered["M"].values, run.arrays("filtered")["M"])


# ---------------------------------------------------------------- data on s3://


def _put_npy(s3, key: str, arr: np.ndarray) -> None:
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    s3.client.put_object(Bucket=BUCKET, Key=key, Body=buf.getvalue())


def test_a_data_object_overwritten_on_s3_is_refused_naming_it_and_its_etag(s3):
    """An object of the same size written over a data file: its ETag differs from the one the reader was opened
    with, and the read is refused in one line naming the object, the ETag and the fix."""
    from relulearn.pipeline.arrays import open_reader
    from relulearn.pipeline.stamps import DataChangedError

    x = np.arange(400.0).reshape(100, 4)
    _put_npy(s3, "stamps/x.npy", x)
    reader = open_reader(s3.url("stamps/x.npy"))
    assert np.array_equal(reader.read(20, 40), x[20:40])
    _put_npy(s3, "stamps/x.npy", -x)
    with pytest.raises(DataChangedError) as err:
        reader.read(20, 40)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{s3.url('stamps/x.npy')} changed while this run read it (ETag") and "size" not in line
    assert line.endswith("restore the file, or start a new store for the new data"), line


def test_a_zarr_data_array_on_s3_with_one_chunk_rewritten_is_refused_for_that_chunks_rows(s3):
    """A zarr array's objects are stamped from one listing and checked by HEAD requests (the same ETag either way:
    no false alarm); a chunk object rewritten refuses its rows, naming the object and its ETag."""
    import zarr

    from relulearn.pipeline.arrays import open_reader
    from relulearn.pipeline.stamps import DataChangedError

    x = np.arange(300.0).reshape(100, 3)
    zarr.create_array(s3.url("stamps/x.zarr"), data=x, chunks=(25, 3))
    reader = open_reader(s3.url("stamps/x.zarr"))
    assert np.array_equal(reader.read(0, 100), x)
    zarr.open_array(s3.url("stamps/x.zarr"), mode="r+")[60:70] = -1.0
    assert np.array_equal(reader.read(0, 50), x[:50])
    with pytest.raises(DataChangedError) as err:
        reader.read(40, 80)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{s3.url('stamps/x.zarr')}/c/2/0 changed while this run read it (") and "ETag" in line


def test_a_run_reading_data_from_s3_stops_when_an_object_is_overwritten(s3, tmp_path):
    """Data on S3, the store on a local disk: y.npy overwritten after the first commit stops the run with exit 2
    in one line naming the object; what was committed holds the old labels only."""
    from datafiles import RUN, after_first_commit, samples

    x, y = samples(7)
    _put_npy(s3, "run-data/x.npy", x)
    _put_npy(s3, "run-data/y.npy", y)
    source = {"d": 4, "data": {"x": s3.url("run-data/x.npy"), "y": s3.url("run-data/y.npy")}}
    cfg = write_yaml(tmp_path / "c.yaml", {**RUN, "source": source})
    store = tmp_path / "s.zarr"
    thread = after_first_commit(store, lambda: _put_npy(s3, "run-data/y.npy", y[::-1].copy()))
    done = cli("estimate", cfg, "--store", store, "--in-process", "--quiet")
    thread.join()
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"relulearn: error: {s3.url('run-data/y.npy')} changed while this run read it (ETag"), line
    committed = api.status(str(store))["samples"]
    assert 0 < committed < RUN["samples"]
    _put_npy(s3, "run-data/y.npy", y)  # restored: the committed part is that of the old labels
    ref = tmp_path / "r.zarr"
    api.estimate(
        config_from_dict({**RUN, "source": source}), str(ref), samples=committed, client="local", progress=None
    )
    assert_bitwise_equal(str(store), str(ref))
