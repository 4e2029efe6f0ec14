"""Bad input gets a clear error, and nothing is lost.

Every case goes through the command line (``relulearn.cli.main``; in a process of its own where a cluster runs) and
checks:
exit code 2, a message on stderr that names the cause and the fix, no Python traceback,
and — where a store existed before — that the store is bitwise intact (every file under
its directory) and still readable by ``relulearn status``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from relulearn.api import estimate, status
from relulearn.config import load_config
from relulearn.network import Network
from relulearn.pipeline.batches import SourceDataError
from relulearn.pipeline.sources import BATCH_ROWS, chunk_batches, make_source
from relulearn.storage import FORMAT_VERSION

from conftest import PYTHON, cli_env
from conftest import relulearn as cli

# A small run with all four statistic families (explicit direction seed and thresholds, so
# stores of different seeds can be merged).
BASE = {
    "seed": 3,
    "samples": 20_000,
    "chunk_size": 5_000,
    "source": {"d": 4, "teacher": {"kind": "one_hidden_relu", "width": 2, "output_weights": [1.0, -0.6]}},
    "statistics": {
        "basic": {},
        "hermite": {"max_order": 3},
        "contracted": {"orders": [2, 4], "directions": 2, "directions_seed": 1},
        "filtered": {"thresholds": [0.1, 0.5]},
    },
    "run": {"chunks_per_block": 2, "commit_interval": 0},
}


# ------------------------------------------------------------------ helpers


def config(**changes) -> dict:
    """A deep copy of BASE with dotted keys set (``{"source.noise_std": 0.1}``); None deletes."""
    data = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def cli_process(*args) -> subprocess.CompletedProcess:
    """In an interpreter of its own: the cluster's workers log to the process's stderr."""
    return subprocess.run(
        [PYTHON, "-m", "relulearn.cli", *map(str, args)], env=cli_env(), capture_output=True, text=True, timeout=120
    )


def cli_each(*argvs) -> list[subprocess.CompletedProcess]:
    return [cli(*argv) for argv in argvs]


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit code 2, each needle on stderr, no traceback; returns stderr."""
    err = proc.stderr
    assert proc.returncode == 2, f"exit code {proc.returncode}\nstdout: {proc.stdout}\nstderr: {err}"
    assert "Traceback" not in err, err
    assert "error:" in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in stderr:\n{err}"
    return err


def snapshot(path: Path) -> dict[str, bytes | None]:
    """Every file's bytes (and every directory, as None) under ``path``, by relative path."""
    out: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(path):
        rel = Path(root).relative_to(path)
        for d in dirs:
            out[str(rel / d) + "/"] = None
        for f in files:
            out[str(rel / f)] = (Path(root) / f).read_bytes()
    return out


def assert_intact(path: Path, before: dict[str, bytes | None]) -> None:
    """The store is bitwise what it was, and ``relulearn status`` still reads it."""
    after = snapshot(path)
    assert sorted(after) == sorted(before), f"files added/removed: {set(after) ^ set(before)}"
    changed = [k for k in before if before[k] != after[k]]
    assert not changed, f"files modified: {changed}"
    assert status(str(path))["samples"] > 0  # what `relulearn status` prints


def status_json(path: Path) -> dict:
    proc = cli("status", path, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """Committed stores made once (in-process); tests copy the ones they run commands against."""
    d = tmp_path_factory.mktemp("stores")
    out = {}
    for name, data in {
        "base": config(),
        "seed4": config(seed=4),
        "other_setup": config(**{"seed": 4, "source.noise_std": 0.5, "statistics.hermite.max_order": 2}),
    }.items():
        cfg = write_yaml(d / f"{name}.yaml", data)
        out[name] = d / f"{name}.zarr"
        estimate(load_config(cfg), str(out[name]), client="local", progress=None)
    return out


@pytest.fixture
def store(stores, tmp_path) -> tuple[Path, dict]:
    """A private copy of the base store, and its snapshot."""
    path = tmp_path / "run.zarr"
    shutil.copytree(stores["base"], path)
    return path, snapshot(path)


# ------------------------------------------------------------- configuration

UNKNOWN_KEYS = [  # (changes, the key as named, the suggestion)
    ({"chunk_size": None, "chunksize": 5_000}, "'chunksize'", "did you mean 'chunk_size'?"),
    ({"source.teacher.widht": 3}, "'source.teacher.widht'", "did you mean 'width'?"),
    ({"statistics.hermite": {"max_ordr": 3}}, "'statistics.hermite.max_ordr'", "did you mean 'max_order'?"),
    ({"statistics.filtered": {"quantile": [0.5]}}, "'statistics.filtered.quantile'", "did you mean 'quantiles'?"),
    ({"run.chunks_per_blok": 2}, "'run.chunks_per_blok'", "did you mean 'chunks_per_block'?"),
    # a file teacher given a planted teacher's key: the valid keys named are the file teacher's
    (
        {"source.teacher": {"file": "t.npz", "kind": "one_hidden_relu"}},
        "'source.teacher.kind'",
        "(valid keys here: file)",
    ),
]


def test_unknown_or_mistyped_keys_name_the_key_and_the_closest_valid_one(store, tmp_path):
    path, before = store
    cfgs = [write_yaml(tmp_path / f"bad{i}.yaml", config(**changes)) for i, (changes, _, _) in enumerate(UNKNOWN_KEYS)]
    procs = cli_each(*(("estimate", cfg, "--store", path, "--in-process") for cfg in cfgs))
    for cfg, proc, (changes, key, suggestion) in zip(cfgs, procs, UNKNOWN_KEYS):
        err = assert_user_error(proc, f"invalid configuration in {cfg}", f"unknown key {key}", suggestion)
        assert err.count("unknown key") == 1, (changes, err)
    assert_intact(path, before)


WRONG_VALUES = [  # (changes, needles)
    ({"samples": "many"}, ["'samples'", "valid integer", "'many'"]),
    ({"source": {"d": "x"}}, ["'source.d'", "valid integer", "'x'"]),
    ({"samples": -5}, ["'samples'", "greater than or equal to 1", "-5"]),
    ({"chunk_size": 1}, ["'chunk_size'", "greater than or equal to 2", "(got 1)"]),
    # the store's ledger keeps seeds and counts in int64 columns: a larger one failed at the first commit
    ({"seed": 2**63}, ["'seed'", "less than or equal to 9223372036854775807", "(got 9223372036854775808)"]),
    ({"samples": 10**30}, ["'samples'", "less than or equal to 9223372036854775807"]),
    ({"source.teacher.seed": -1}, ["'source.teacher.seed'", "greater than or equal to 0"]),
    ({"statistics": 5}, ["'statistics' must be a mapping of keys (got 5)"]),
    ({"statistics.hermite": 4}, ["'statistics.hermite' must be a mapping of keys (got 4)"]),
    ({"source.teacher": 5}, ["'source.teacher' must be a mapping of keys (got 5)"]),
    ({"source": None}, ["missing required key 'source'"]),
    (
        {"statistics.filtered": {"quantiles": [0.5], "thresholds": [1.0]}},
        ["'statistics.filtered'", "exactly one of `quantiles`"],
    ),
    (
        {"source.teacher": {"kind": "mlp", "width": 3}},
        [
            "'source.teacher.kind': unknown teacher kind 'mlp'",
            "kinds: one_hidden_relu, deep_relu, two_layer, random_xavier",
            "file, onnx or callable",
        ],
    ),
    ({"source.teacher": {"kind": "deep_rel"}}, ["unknown teacher kind 'deep_rel' — did you mean 'deep_relu'?"]),
    # every number of a configuration is finite: a NaN threshold was stored as a real statistic
    ({"statistics.filtered": {"thresholds": [math.nan]}}, ["'statistics.filtered.thresholds", "finite number"]),
    ({"source.noise_std": math.inf}, ["'source.noise_std'", "finite number"]),
]


def test_wrong_types_and_values_name_the_key(store, tmp_path):
    path, before = store
    cfgs = [write_yaml(tmp_path / f"bad{i}.yaml", config(**changes)) for i, (changes, _) in enumerate(WRONG_VALUES)]
    procs = cli_each(*(("estimate", cfg, "--store", path, "--in-process") for cfg in cfgs))
    for cfg, proc, (changes, needles) in zip(cfgs, procs, WRONG_VALUES):
        err = assert_user_error(proc, f"invalid configuration in {cfg}", *needles)
        # one line per problem, no pydantic internals (union member tags, model class names)
        assert len(err.strip().splitlines()) == 2, (changes, err)
        assert not any(w in err for w in ("function-after", "FileTeacher", "Config", "pydantic")), (changes, err)
    assert_intact(path, before)


def test_a_count_of_directions_past_the_memory_budget_is_refused_before_the_bank_is_drawn(tmp_path):
    """10¹² contracted directions (a 116 TiB bank) are refused by the key, with the count that fits; nothing is
    written."""
    cfg = write_yaml(tmp_path / "run.yaml", config(**{"statistics.contracted.directions": 10**12}))
    target = tmp_path / "new.zarr"
    proc = cli("estimate", cfg, "--store", target, "--in-process")
    assert_user_error(
        proc,
        "statistics.contracted.directions = 1,000,000,000,000",
        "run.worker_memory",
        "at most 16,777,216 fit",
        "Nothing was written",
    )
    assert not target.exists()


def test_sizes_no_machine_holds_are_refused_before_allocation_naming_the_bytes(store, tmp_path):
    """source.d = 10^9 (the d × d sums: 16 EB; it grew to 14.7 GB before it was killed) and 10^12 (one row of
    inputs: 8 TB) are refused from the configuration, before a teacher, a batch or a store is made; `plan` refuses
    what a worker would hold; a store given stays bitwise intact."""
    path, before = store
    huge = write_yaml(tmp_path / "huge.yaml", config(**{"source.d": 10**9}))
    wide = write_yaml(tmp_path / "wide.yaml", config(**{"source.d": 10**12}))
    new = tmp_path / "new.zarr"
    # a hidden layer of 10^8 units is 3.3 TB on one batch of 4096 rows
    deep = write_yaml(tmp_path / "deep.yaml", config(**{"source.teacher": {"kind": "deep_relu", "widths": [3, 10**8]}}))
    # a budget no machine has: the plan's projection of what a worker holds is what refuses
    roomy = write_yaml(tmp_path / "roomy.yaml", config(**{"source.d": 10**6, "run.worker_memory": 10**20}))
    procs = cli_each(
        ("estimate", huge, "--store", new, "--in-process"),
        ("estimate", wide, "--store", new),
        ("plan", huge),
        ("plan", roomy),
        ("plan", deep),
        ("estimate", huge, "--store", path, "--in-process"),
    )
    d = 10**9  # BASE's families: float64 sums and error terms of He_0..He_3, 2 × 2 M_l^g, 2 thresholds, basic
    entries = sum(math.comb(d + j - 1, j) for j in range(4)) + 4 * (d * d + d + 1) + 2 * (d * d + 1) + d * d + 2 * d + 2
    hermite = sum(math.comb(d + j - 1, j) for j in range(4))
    partial = f"needs {16 * entries:,} bytes (hermite: {16 * hermite:,}, "
    assert_user_error(procs[0], str(new), partial, "run.worker_memory", "lower source.d", "Nothing was written")
    batch = "one batch of inputs (1 row × source.d = 1,000,000,000,000, 3 copies) would take 24,000,000,000,000 bytes"
    assert_user_error(procs[1], batch, "this machine's memory", "lower source.d")
    assert_user_error(procs[2], partial)
    assert_user_error(procs[3], "the estimate pass at source.d = 1,000,000 would hold ", "this machine's memory")
    hidden = (
        "the teacher's hidden units on one batch (4,096 rows × 100,000,000 units) would take 3,276,800,000,000 bytes"
    )
    assert_user_error(procs[4], hidden, "lower source.teacher.widths")
    assert_user_error(procs[5], partial)
    assert all(len(p.stderr.strip().splitlines()) == 1 for p in procs), [p.stderr for p in procs]
    assert not new.exists()
    assert_intact(path, before)


def test_a_planted_teacher_too_wide_for_the_machine_is_refused_by_plan_and_estimate(tmp_path):
    """`width: 10^9` (its weights: 40 GB at d = 4) and `widths: [3, 10^8]` (3.3 TB of hidden units on a batch):
    `plan` and `estimate` each refuse in one line naming the key and the bytes; nothing is allocated or written."""
    wide = write_yaml(tmp_path / "wide.yaml", config(**{"source.teacher": {"kind": "one_hidden_relu", "width": 10**9}}))
    deep = write_yaml(tmp_path / "deep.yaml", config(**{"source.teacher": {"kind": "deep_relu", "widths": [3, 10**8]}}))
    store = tmp_path / "s.zarr"
    weights = "the planted teacher's weights (5,000,000,000 numbers) would take 40,000,000,000 bytes (40 GB)"
    hidden = "the teacher's hidden units on one batch (4,096 rows × 100,000,000 units) would take 3,276,800,000,000"
    for cfg, said, key in ((wide, weights, "lower source.d or source.teacher.width"),
                           (deep, hidden, "lower source.teacher.widths")):  # fmt: skip
        for args in (("plan", cfg), ("estimate", cfg, "--store", store)):
            err = assert_user_error(cli(*args), said, key, "Nothing was written")
            assert len(err.strip().splitlines()) == 1, err
    assert not store.exists()


class _Started(Exception):
    pass


def test_the_blocks_of_a_huge_run_are_planned_lazily(tmp_path):
    """10^11 samples are 500,000 blocks: planned as a lazy sequence (a list of their ranges took 6 GB at 10^13
    samples and ended in MemoryError before the first block); the plan is the blocks the run would make."""
    import tracemalloc

    from relulearn.pipeline.blocks import plan_blocks

    started: list[dict] = []

    def stop(info: dict) -> None:
        started.append(info)
        raise _Started

    cfg = load_config(write_yaml(tmp_path / "c.yaml", config()))
    estimate(cfg, str(tmp_path / "warm.zarr"), client="local", progress=None)  # the modules a run imports
    tracemalloc.start()
    try:
        with pytest.raises(_Started):
            estimate(cfg, str(tmp_path / "s.zarr"), samples=10**11, client="local", progress=None, on_start=stop)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert started[0]["blocks"] == 10**11 // 5_000 // 2 and started[0]["target_samples"] == 10**11
    assert peak < 2**20, f"{peak:,} bytes"  # a list of the blocks' ranges alone is 60 MB
    blocks = plan_blocks(3, 12, 4)
    assert list(blocks) == [(3, 7), (7, 11), (11, 12)] and blocks[-1] == (11, 12) and blocks[1:] == [(7, 11), (11, 12)]


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads a process's memory from /proc")
def test_a_run_of_ten_trillion_samples_says_its_projection_and_holds_flat_memory_until_ctrl_c(tmp_path):
    """`estimate --samples 1e13`: its first line states the projected time and how to stop and resume; its memory
    stays flat over hundreds of commits (no per-block or per-chunk structure grows); Ctrl-C ends it with its
    samples committed."""
    import signal

    from relulearn import open_store

    cfg = write_yaml(tmp_path / "c.yaml", config())
    url = tmp_path / "s.zarr"
    proc = subprocess.Popen(
        [PYTHON, "-m", "relulearn.cli", "estimate", str(cfg), "--store", str(url), "--samples", "1e13",
         "--in-process", "--commit-interval", "0.2"],
        env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = proc.stderr.readline()
        assert first.startswith(f"starting run in {url}: 0 -> 10,000,000,000,000 samples in 1,000,000,000 blocks; "
                                "projected "), first  # fmt: skip
        assert first.rstrip().endswith(" h: stop at any moment with Ctrl-C and resume with the same command"), first

        def committed() -> int:
            try:
                return open_store(str(url)).samples
            except Exception:  # noqa: BLE001 - no first commit yet
                return 0

        deadline = time.monotonic() + 60
        while committed() < 200_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        before, at = _rss(proc.pid), committed()
        while committed() < 20 * at and time.monotonic() < deadline:  # (measured: 0.8 MB over 20 commits)
            time.sleep(0.05)
        after = _rss(proc.pid)
        assert committed() >= 20 * at > 0
        assert after - before < 16 * 2**20, f"{before:,} -> {after:,} bytes over {at:,} -> {committed():,} samples"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    held = open_store(str(url)).samples
    assert held >= 20 * at and held % 5_000 == 0


def test_bad_sample_counts_on_the_command_line(store, tmp_path):
    path, before = store
    cfg = write_yaml(tmp_path / "run.yaml", config())
    cases = [
        ("-5", "must be at least 1, got -5"),
        ("many", "expected a whole number, got 'many'"),
        ("1e999", "expected a whole number, got '1e999'"),
        ("1e30", "must be at most 9,223,372,036,854,775,807, got 1e30"),
    ]
    procs = cli_each(*(("estimate", cfg, "--store", path, "--in-process", "--samples", v) for v, _ in cases))
    for proc, (_, needle) in zip(procs, cases):
        assert_user_error(proc, "argument --samples", needle)
    assert_intact(path, before)


def test_seeds_on_the_command_line_are_bounded_as_in_a_configuration():
    """`--seed` of `demo` and `shadow` takes 0 to 2^63 - 1, as every seed of a configuration does."""
    cases = [("demo", "-1", "must be at least 0, got -1"), ("shadow", str(2**63), "must be at most 9,223,372,036")]
    for command, seed, needle in cases:
        extra = ["teacher.npz", "--degree", "2"] if command == "shadow" else []
        assert_user_error(cli(command, *extra, "--seed", seed), "argument --seed", needle)


def test_unreadable_configuration_files(store, tmp_path):
    path, before = store
    missing = tmp_path / "nothere.yaml"
    broken = tmp_path / "broken.yaml"
    broken.write_text("seed: 3\nsource: {d: 4\n")
    scalar = write_yaml(tmp_path / "scalar.yaml", [1, 2, 3])
    twice = tmp_path / "twice.yaml"
    twice.write_text(write_yaml(tmp_path / "ok.yaml", config()).read_text() + "seed: 99\n")
    model = tmp_path / "model.npz"
    Network((np.eye(4), np.ones((1, 4))), activation="relu").save(model)
    binary = tmp_path / "model.yaml"
    binary.write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x08\x00\xb7\xac")
    procs = cli_each(
        *(("estimate", c, "--store", path, "--in-process") for c in (missing, broken, scalar, twice, binary)),
        ("evaluate", model, "--teacher", tmp_path / "teacher.pkl"),
    )
    assert_user_error(procs[0], "cannot read configuration file", str(missing))
    assert_user_error(procs[1], str(broken), "not valid YAML")
    assert_user_error(procs[2], str(scalar), "expected a mapping of keys, got list")
    assert_user_error(procs[3], str(twice), "the key 'seed' is given twice")  # YAML alone keeps the last silently
    assert_user_error(procs[4], str(binary), "not a text file", "byte 10")
    assert_user_error(procs[5], "teacher.pkl", "a .pkl file is not a teacher", ".npz", ".yaml")
    assert_intact(path, before)


@pytest.fixture
def not_files(tmp_path) -> dict[str, tuple[Path, str]]:
    """A folder, a character device and a named pipe, each where a file is expected, with what it is."""
    folder = tmp_path / "folder.npy"
    folder.mkdir()
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    return {
        "folder": (folder, "is a directory"),
        "device": (Path("/dev/zero"), "is not a regular file (a character device)"),
        "fifo": (fifo, "is not a regular file (a named pipe)"),
    }


@pytest.mark.parametrize("kind", ["folder", "device", "fifo"])
def test_a_folder_or_device_where_a_file_is_expected_is_named_as_what_it_is(not_files, tmp_path, kind):
    """Each route that reads a file (a configuration, a data file, a teacher file, an ONNX file, predict's model and
    inputs, evaluate's model) says what the path is: "does not exist" was said of a folder, and /dev/zero or a
    named pipe was read for ever (or waited for a writer). Nothing is opened, no store is written."""
    path, words = not_files[kind]
    model = tmp_path / "m.npz"
    Network((np.eye(4), np.ones((1, 4))), activation="relu").save(model)
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((10, 4)))
    store = tmp_path / "s.zarr"
    routes = {
        "configuration file": ("plan", path),
        "source.data.x:": (
            "estimate",
            write_yaml(
                tmp_path / "data.yaml", config(**{"source.teacher": None, "source.data": {"x": str(path), "y": str(x)}})
            ),
            "--store",
            store,
        ),
        "teacher file": (
            "estimate",
            write_yaml(tmp_path / "file.yaml", config(**{"source.teacher": {"file": str(path)}})),
            "--store",
            store,
        ),
        "source.teacher.onnx": (
            "estimate",
            write_yaml(tmp_path / "onnx.yaml", config(**{"source.teacher": {"onnx": str(path)}})),
            "--store",
            store,
        ),
        "model file": ("predict", path, "--input", x, "--out", tmp_path / "p.npy"),
        "inputs file": ("predict", model, "--input", path, "--out", tmp_path / "p.npy"),
    }
    for what, args in routes.items():
        done = cli(*args)
        err = assert_user_error(done, f"{what} {path} {words};")
        assert len(err.strip().splitlines()) == 1, err
    evaluated = cli("evaluate", path, "--teacher", write_yaml(tmp_path / "t.yaml", config()))
    assert_user_error(evaluated, f"model file {path} {words};")
    assert not store.exists() and not (tmp_path / "p.npy").exists()


@pytest.mark.slow
def test_a_closed_port_given_as_the_scheduler_is_named_as_such(tmp_path, monkeypatch):
    """`--scheduler tcp://127.0.0.1:PORT` where nothing listens: "nothing listens there", not a connection timeout."""
    import socket

    from relulearn.pipeline import cluster

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", 1)  # the retries for a scheduler still starting: 1 s
    with socket.socket() as s:  # a port that was free a moment ago, and closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tmp_path / "s.zarr"
    done = cli("estimate", write_yaml(tmp_path / "c.yaml", config()), "--store", store, "--scheduler",
               f"tcp://127.0.0.1:{port}")  # fmt: skip
    err = assert_user_error(
        done,
        f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}: nothing listens there (the connection was "
        "refused for 1 s); start the scheduler there",
    )
    assert len(err.strip().splitlines()) == 1, err
    assert not store.exists()


@pytest.mark.parametrize("flow", [False, True])
def test_a_configuration_nested_thousands_deep_is_refused_naming_the_file_and_the_depth(flow, store, tmp_path):
    """YAML nested 5,000 deep (block mappings or flow lists) is refused in one line naming the file and the depth,
    before the parser recurses into it (it raised RecursionError)."""
    path, before = store
    deep = tmp_path / "deep.yaml"
    depth = 5_000
    if flow:
        deep.write_text("seed: 3\nsamples: " + "[" * depth + "]" * depth + "\n")
    else:
        deep.write_text("seed: 3\nsource:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, depth)) + "\n")
    proc = cli("estimate", deep, "--store", path, "--in-process")
    err = assert_user_error(proc, str(deep), "nested more than 100 levels deep", "line ")
    assert len(err.strip().splitlines()) == 1, err
    assert_intact(path, before)


# -------------------------------------------------------------------- stores


def test_store_with_another_fingerprint_names_the_differing_fields(store, tmp_path):
    path, before = store
    cfg = write_yaml(tmp_path / "changed.yaml", config(**{"source.noise_std": 0.1, "chunk_size": 2_500}))
    proc = cli("estimate", cfg, "--store", path, "--in-process", "--json")
    # exactly the two fields (the list ends after them)
    assert_user_error(
        proc,
        str(path),
        "different fingerprint",
        "differing fields: chunk_size, source.noise_std. ",
        "relulearn status",
        "new --store path",
        "not modified",
    )
    # --json also reports the error on stdout
    assert json.loads(proc.stdout)["kind"] == "StoreError"
    assert "source.noise_std" in json.loads(proc.stdout)["error"]
    assert_intact(path, before)
    # the original configuration still resumes/extends the intact store
    good = write_yaml(tmp_path / "good.yaml", config())
    proc = cli("estimate", good, "--store", path, "--in-process", "--samples", 30_000, "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["resumed_from_samples"] == 20_000


def test_store_of_a_newer_format_version_is_refused(store, tmp_path, stores):
    path, _ = store
    meta_file = path / "zarr.json"
    doc = json.loads(meta_file.read_text())
    assert doc["attributes"]["relulearn"]["format_version"] == FORMAT_VERSION
    doc["attributes"]["relulearn"]["format_version"] = 99
    meta_file.write_text(json.dumps(doc, indent=2))
    before = snapshot(path)  # after our edit

    cfg = write_yaml(tmp_path / "run.yaml", config())
    procs = cli_each(
        ("estimate", cfg, "--store", path, "--in-process", "--samples", 40_000),
        ("status", path),
        ("merge", path, stores["seed4"], "--out", tmp_path / "merged.zarr"),
        ("status", path, "--json"),
    )
    for proc in procs:
        assert_user_error(proc, str(path), "newer relulearn", "store format 99", "upgrade relulearn")
    # status --json: the error also as JSON on stdout
    assert "store format 99" in json.loads(procs[-1].stdout)["error"]
    assert not (tmp_path / "merged.zarr").exists()
    assert snapshot(path) == before


def test_damaged_format_version_is_a_clear_error(store):
    path, _ = store
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"]["relulearn"]["format_version"] = "one"
    (path / "zarr.json").write_text(json.dumps(doc))
    assert_user_error(cli("status", path), str(path), "format version 'one'", "damaged")


def test_store_of_an_older_format_version_is_refused(store):
    # format 1 drew its samples with Philox: resuming it would mix two generators' chunks
    path, _ = store
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"]["relulearn"]["format_version"] = FORMAT_VERSION - 1
    (path / "zarr.json").write_text(json.dumps(doc))
    before = snapshot(path)
    assert_user_error(
        cli("status", path),
        str(path),
        f"store format {FORMAT_VERSION - 1}",
        "older",
        "re-run the estimation into a new store",
    )
    assert snapshot(path) == before


def _huge_run(tmp_path: Path) -> Path:
    """A configuration that would compute for hours: an error must come before any computation."""
    return write_yaml(
        tmp_path / "huge.yaml",
        config(samples=2_000_000_000, **{"statistics.filtered": {"quantiles": [0.5, 0.9], "pilot_samples": 5_000_000}}),
    )


def test_store_path_under_a_regular_file(tmp_path, stores):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory\n")
    target = blocker / "store.zarr"
    t0 = time.perf_counter()
    proc = cli("estimate", _huge_run(tmp_path), "--store", target, "--in-process")
    elapsed = time.perf_counter() - t0
    assert_user_error(proc, f"cannot write the store at {target}", f"{blocker} is a file, not a directory", "--store")
    assert elapsed < 20, f"the error came after {elapsed:.1f} s: computation ran before the path was checked"
    assert blocker.read_text() == "not a directory\n"
    # merge checks its output path the same way
    proc = cli("merge", stores["base"], stores["seed4"], "--out", target)
    assert_user_error(proc, f"cannot write the store at {target}", "is a file, not a directory")
    assert blocker.read_text() == "not a directory\n"


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="permission bits do not stop root from writing"
)
def test_store_path_in_a_read_only_directory(tmp_path, stores):
    locked = tmp_path / "locked"
    locked.mkdir()
    shutil.copytree(stores["base"], locked / "run.zarr")
    before = snapshot(locked / "run.zarr")
    locked.chmod(0o500)
    (locked / "run.zarr").chmod(0o500)
    try:
        target = locked / "new.zarr"
        t0 = time.perf_counter()
        proc = cli("estimate", _huge_run(tmp_path), "--store", target, "--in-process")
        assert time.perf_counter() - t0 < 20
        assert_user_error(proc, f"cannot write the store at {target}", "not writable", "--store")
        assert not target.exists()
        # extending an existing store that cannot be written
        cfg = write_yaml(tmp_path / "run.yaml", config())
        proc = cli("estimate", cfg, "--store", locked / "run.zarr", "--in-process", "--samples", 40_000)
        assert_user_error(proc, "cannot write the store at", "not writable")
        assert_intact(locked / "run.zarr", before)
    finally:
        (locked / "run.zarr").chmod(0o700)
        locked.chmod(0o700)


def test_status_of_something_that_is_not_a_store(tmp_path):
    import zarr

    missing = tmp_path / "nothere.zarr"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "data.csv").write_text("1,2\n")
    foreign = tmp_path / "foreign.zarr"  # someone else's zarr group, holding only attributes
    zarr.open_group(str(foreign), mode="w", zarr_format=3).attrs["owner"] = "someone else"
    with_array = tmp_path / "with_array.zarr"
    zarr.open_group(str(with_array), mode="w", zarr_format=3).create_array("data", shape=(3,), dtype="f8")
    damaged = tmp_path / "damaged.zarr"
    damaged.mkdir()
    (damaged / "zarr.json").write_text("{not json")
    paths = [missing, a_file, folder, foreign, with_array, damaged]
    procs = cli_each(*(("status", p) for p in paths))
    assert_user_error(procs[0], f"no relulearn store at {missing}", "relulearn estimate")
    assert_user_error(procs[1], str(a_file), "is a file, not a store")
    assert_user_error(procs[2], str(folder), "not a relulearn store")
    assert_user_error(procs[3], str(foreign), "not a relulearn store")
    assert_user_error(procs[4], str(with_array), "not a relulearn store")
    assert_user_error(procs[5], str(damaged), "not a readable zarr group")

    # estimate refuses to write into something that is not a store, and leaves it alone
    cfg = write_yaml(tmp_path / "run.yaml", config())
    others = [folder, foreign]
    befores = [snapshot(p) for p in others]
    procs = cli_each(*(("estimate", cfg, "--store", p, "--in-process") for p in others))
    for p, proc, before in zip(others, procs, befores):
        assert_user_error(proc, str(p))
        assert snapshot(p) == before, p


# ------------------------------------------------------------------- merging


def test_merge_errors(stores, tmp_path):
    base, seed4, other = stores["base"], stores["seed4"], stores["other_setup"]
    snaps = {p: snapshot(p) for p in (base, seed4, other)}
    out = tmp_path / "merged.zarr"

    copy = tmp_path / "copy.zarr"
    shutil.copytree(base, copy)
    procs = cli_each(
        ("merge", base, other, "--out", out),
        ("merge", base, base, "--out", out),
        ("merge", base, copy, "--out", out),
        ("merge", base, tmp_path / "nothere.zarr", "--out", out),
        ("merge", base, seed4, "--out", other),
    )
    assert_user_error(procs[0], "different setups", "differing fields: source.noise_std, statistics.hermite.max_order")
    assert_user_error(procs[1], "both contain seed(s) [3]", "count twice")
    assert_user_error(procs[2], "both contain seed(s) [3]", "count twice")
    assert_user_error(procs[3], "nothere.zarr holds no run", "relulearn estimate")
    assert_user_error(procs[4], f"{other} already holds a run", "new path")  # into an existing store
    assert not out.exists()
    for p, snap in snaps.items():
        assert_intact(p, snap)


# ------------------------------------------------------------- teacher files


BAD_TEACHERS = [  # (arrays, source.d, needles)
    ({"W0": np.ones((3, 5)), "W1": np.ones((1, 4))}, 5, ["W1 has shape (1, 4)", "W0 has shape (3, 5)", "3 columns"]),
    ({"W0": np.ones((3, 7)), "W1": np.ones((1, 3))}, 4, ["input dimension 7", "source.d is 4", "make them agree"]),
    ({"W0": np.array([[np.nan, 1.0, 1.0, 1.0]]), "W1": np.ones((1, 1))}, 4, ["W0 contains NaN or inf"]),
    (None, 4, ["does not exist", "source.teacher.file"]),
    ("text", 4, ["is not an .npz network file"]),
    # numpy would drop the imaginary parts with only a warning, and parse strings as numbers
    ({"W0": np.ones((3, 4)) + 1j, "W1": np.ones((1, 3))}, 4, ["W0 holds complex128 values", "real numbers"]),
    (
        {"W0": np.ones((3, 4)), "W1": np.ones((1, 3)), "b0": np.array(["1", "1", "1"]), "b1": np.zeros(1)},
        4,
        ["b0 holds <U1 values"],
    ),
]


def test_bad_teacher_files_name_the_file_and_the_arrays(store, tmp_path):
    path, before = store
    argvs, teachers, paths = [], [], []
    for i, (arrays, d, _) in enumerate(BAD_TEACHERS):
        case = tmp_path / f"case{i}"
        case.mkdir()
        teacher = case / "teacher.npz"
        if isinstance(arrays, dict):
            np.savez(teacher, **arrays)
        elif arrays == "text":
            teacher.write_text("W0 = [[1, 2]]\n")
        # a relative path, read from the configuration's folder
        cfg = write_yaml(case / "run.yaml", config(**{"source.d": d, "source.teacher": {"file": "teacher.npz"}}))
        # a copy of the store per command: they run at once, and a store takes one writer at a time
        shutil.copytree(path, case / "run.zarr")
        paths.append(case / "run.zarr")
        argvs.append(("estimate", cfg, "--store", case / "run.zarr", "--in-process"))
        teachers.append(teacher)
    for proc, teacher, (_, _, needles) in zip(cli_each(*argvs), teachers, BAD_TEACHERS):
        err = assert_user_error(proc, *needles)
        assert str(teacher) in err, err
        assert "pickle" not in err, err
    for p in paths:
        assert_intact(p, before)


# --------------------------------------------------------- NaN / inf in samples

# y = 1e-300 · relu(b · relu(1e154 · x_0)): finite (|y| < 2e8) unless x_0 > 3.9, where the
# hidden layer overflows to inf. With seed 12 and chunks of 5000, chunks 0 and 1 are clean and
# the first overflow is in chunk 2, in its second batch (row > BATCH_ROWS).
_T = 3.9
_B = 1.7976931348623157e308 / (1e154 * _T)


def overflow_teacher(path: Path, nan: bool = False) -> Path:
    if nan:  # two overflowing units subtracted: inf - inf = nan
        arrays = {
            "W0": np.array([[1e154, 0.0, 0.0, 0.0]]),
            "W1": np.array([[_B], [_B]]),
            "W2": np.array([[1e-300, -1e-300]]),
        }
    else:
        arrays = {"W0": np.array([[1e154, 0.0, 0.0, 0.0]]), "W1": np.array([[_B]]), "W2": np.array([[1e-300]])}
    np.savez(path, **arrays)
    return path


def overflow_config(tmp_path: Path, nan: bool = False, **changes) -> Path:
    overflow_teacher(tmp_path / "deep.npz", nan=nan)
    data = config(
        **{
            "seed": 12,
            "source.teacher": {"file": "deep.npz"},
            "run.chunks_per_block": 1,
            "run.commit_interval": 3600,
            **changes,
        }
    )
    return write_yaml(tmp_path / "deep.yaml", data)


def first_bad_row(cfg_path: Path) -> tuple[int, int, str]:
    """(chunk, row, value) of the first non-finite label, found by regenerating the chunks."""
    cfg = load_config(cfg_path)
    source = make_source(cfg)
    for chunk in range(cfg.n_chunks):
        row = 0
        for x, y in chunk_batches(source, cfg.seed, chunk, cfg.chunk_size):
            assert np.isfinite(x).all()
            bad = ~np.isfinite(y)
            if bad.any():
                r = int(np.argmax(bad))
                assert np.isfinite(y[:r]).all() and not np.isfinite(y[r])
                return chunk, row + r, str(y[r])
            assert np.abs(y).max() < 1e9  # finite labels are moderate: no overflow in the statistics
            row += len(y)
    raise AssertionError("the overflow teacher produced no non-finite label")


def _files_without_root_meta(path: Path) -> dict:
    return {k: v for k, v in snapshot(path).items() if k != "zarr.json"}


def _meta(path: Path) -> dict:
    meta = json.loads((path / "zarr.json").read_text())["attributes"]["relulearn"]
    meta["integrity"].pop("digest")  # the root document's own digest covers the times and the target too
    return {k: v for k, v in meta.items() if k not in ("updated", "created")}


@pytest.mark.parametrize("nan", [False, True], ids=["inf", "nan"])
def test_non_finite_labels_name_chunk_and_row_and_merged_blocks_are_kept(tmp_path, nan):
    cfg = overflow_config(tmp_path, nan=nan)
    chunk, row, value = first_bad_row(cfg)
    assert (chunk, value) == (2, "nan" if nan else "inf") and row >= BATCH_ROWS  # the case is what it claims

    failed = tmp_path / "failed.zarr"
    err = assert_user_error(
        cli("estimate", cfg, "--store", failed, "--in-process"),
        f"{value} in label y at chunk {chunk}, row {row}",
        "teacher's weights",
    )
    assert "RuntimeWarning" not in err, err
    # blocks merged before the failing one were committed: the store holds exactly chunks 0..1,
    # bitwise what a clean run of those chunks gives
    st = status_json(failed)
    assert (st["samples"], st["chunks"], st["complete"]) == (chunk * 5_000, chunk, False)
    clean = tmp_path / "clean.zarr"
    proc = cli("estimate", cfg, "--store", clean, "--in-process", "--samples", chunk * 5_000, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert _files_without_root_meta(failed) == _files_without_root_meta(clean)
    ma, mb = _meta(failed), _meta(clean)
    assert ma.pop("target_samples") == 20_000 and mb.pop("target_samples") == chunk * 5_000
    assert ma == mb


def test_a_run_that_fails_after_several_commits_leaves_one_generation(tmp_path):
    """Commits after every block, then a non-finite label: the store holds its last commit alone (the
    generation that commit replaced, kept for readers while commits came, is removed as after a finished run)."""
    path = overflow_config(tmp_path, **{"run.commit_interval": 0})
    chunk, row, _ = first_bad_row(path)
    cfg = load_config(path)
    url = tmp_path / "run.zarr"
    with pytest.raises(SourceDataError, match=f"at chunk {chunk}, row {row}"):
        estimate(cfg, str(url), client="local", progress=None)
    st = status(str(url))
    assert (st["samples"], st["commits"]) == (chunk * 5_000, chunk)
    assert [p.name for p in url.glob("g*")] == [st["head"]] == [f"g{chunk - 1:06d}"]


def test_extending_into_non_finite_chunks_leaves_the_store_intact(tmp_path):
    cfg = overflow_config(tmp_path)
    chunk, row, _ = first_bad_row(cfg)
    path = tmp_path / "run.zarr"
    proc = cli("estimate", cfg, "--store", path, "--in-process", "--samples", chunk * 5_000, "--quiet")
    assert proc.returncode == 0, proc.stderr
    before = snapshot(path)
    assert_user_error(cli("estimate", cfg, "--store", path, "--in-process"), f"chunk {chunk}, row {row}")
    assert_intact(path, before)
    assert status_json(path)["samples"] == chunk * 5_000


def test_non_finite_in_the_first_chunk_creates_no_store(tmp_path):
    np.savez(tmp_path / "huge.npz", W0=np.full((3, 4), 1e200), W1=np.full((3, 3), 1e200), W2=np.full((1, 3), 1e200))
    cfg = write_yaml(tmp_path / "huge.yaml", config(**{"source.teacher": {"file": "huge.npz"}}))
    path = tmp_path / "run.zarr"
    assert_user_error(cli("estimate", cfg, "--store", path, "--in-process"), "in label y at chunk 0, row ")
    assert not path.exists()  # nothing was merged, so nothing was written
    assert_user_error(cli("status", path), "no relulearn store")


def test_non_finite_on_a_cluster_is_reported_like_in_process(tmp_path):
    """On the distributed path the worker's error travels back: same message, same committed store,
    whatever the scheduling; no worker traceback on stderr."""
    cfg = overflow_config(tmp_path)
    chunk, row, value = first_bad_row(cfg)
    local, dist = tmp_path / "local.zarr", tmp_path / "dist.zarr"
    err_local = assert_user_error(cli("estimate", cfg, "--store", local, "--in-process", "--quiet"))
    err = assert_user_error(
        cli_process("estimate", cfg, "--store", dist, "--workers", 2, "--quiet"),
        f"{value} in label y at chunk {chunk}, row {row}",
    )
    assert "Compute Failed" not in err and "RuntimeWarning" not in err, err
    assert err.strip().splitlines()[-1] == err_local.strip().splitlines()[-1]
    assert _files_without_root_meta(dist) == _files_without_root_meta(local)
    assert _meta(dist) == _meta(local)


def test_every_chunk_bad_on_a_cluster_reports_the_first(tmp_path):
    """Blocks fail concurrently on two workers; the error is always the first bad row of chunk 0."""
    np.savez(tmp_path / "huge.npz", W0=np.full((3, 4), 1e200), W1=np.full((3, 3), 1e200), W2=np.full((1, 3), 1e200))
    cfg = write_yaml(
        tmp_path / "huge.yaml", config(**{"source.teacher": {"file": "huge.npz"}, "run.chunks_per_block": 1})
    )
    chunk, row, value = first_bad_row(cfg)
    assert chunk == 0
    path = tmp_path / "run.zarr"
    assert_user_error(
        cli_process("estimate", cfg, "--store", path, "--workers", 2, "--quiet"),
        f"{value} in label y at chunk 0, row {row}",
    )
    assert not path.exists()


@pytest.mark.parametrize(
    "method, statistic, section",
    [
        ("moments", "contracted", "{orders: [2, 4], directions: 8}"),
        ("tensor", "contracted", "{orders: [2, 4], directions: 8, control: true}"),
        ("filtered-pca", "filtered", "{quantiles: [0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.97]}"),
        ("exact", "output_moments", "{}"),
        ("landscape", "hermite", "{max_order: 2}"),
        ("polynomial", "hermite", "{max_order: 4}"),
    ],
)
def test_fit_refuses_a_statistics_section_lacking_what_the_method_needs_before_writing(
    tmp_path, method, statistic, section
):
    """`fit --method M` with `statistics: {basic: {}}` estimated the whole store, then refused; it refuses first,
    naming the statistic and the section to add, in one line; `plan --method M` says the same."""
    # output weights of one sign: inside every method's setting (landscape assumes them ≥ 0)
    cfg = write_yaml(
        tmp_path / "c.yaml",
        config(**{"statistics": {"basic": {}}, "source.teacher.output_weights": [1.0, 0.6]}),
    )
    store = tmp_path / "s.zarr"
    for args in (("fit", cfg, "--store", store, "--method", method, "--out", tmp_path / "m.npz"), ("plan", cfg,
                 "--method", method)):  # fmt: skip
        err = assert_user_error(
            cli(*args),
            f"the '{method}' method needs the '{statistic}' statistic",
            f"which the configuration's statistics section lacks; add `{statistic}: {section}` under statistics",
            "Nothing was written",
        )
        assert len(err.strip().splitlines()) == 1, err
    assert not store.exists() and not (tmp_path / "m.npz").exists()


def test_a_chunk_larger_than_the_samples_is_refused_naming_both(store, tmp_path):
    """A run counts whole chunks: a chunk_size above samples would silently draw a chunk's worth (10^20 samples
    for a 4,000-sample run), so it is refused naming both numbers; nothing is written."""
    path, before = store
    for size, drawn in ((5_000, "5,000"), (10**20, "100,000,000,000,000,000,000")):
        cfg = write_yaml(tmp_path / f"c{size}.yaml", dict(config(), samples=4_000, chunk_size=size))
        new = tmp_path / f"new{size}.zarr"
        for command in (("plan", cfg), ("estimate", cfg, "--store", new, "--in-process")):
            done = cli(*command)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            assert f"chunk_size ({drawn}) is larger than samples (4,000)" in done.stderr
            assert f"would draw {drawn} samples" in done.stderr and not new.exists()
    assert_intact(path, before)
