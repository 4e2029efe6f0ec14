"""Fault injection: what a store and a run survive, counted.

Every trial asserts its outcome — a result bitwise equal to an uninterrupted run, or a refusal that names the
cause with the store byte-for-byte unchanged — and the script counts them:

- **driver kills**: ``relulearn estimate`` on a 2-worker LocalCluster, its process group sent SIGKILL or SIGINT
  (a terminal's Ctrl-C) at random moments, resumed by the same command (no flag) until done; then
  ``relulearn fit`` killed the same way and run again: the store and the model file bitwise equal to
  uninterrupted runs;
- **a holder on another host**: SIGKILL, then the lease made another host's with a fresh heartbeat: the same
  command refused naming that host until the heartbeat is older than ``RELULEARN_LEASE_TIMEOUT``, then taken over
  and resumed, bitwise equal;
- **worker kills** on an external cluster (``dask scheduler`` and two ``dask worker`` processes): a worker
  SIGKILLed mid-run and another started; the store bitwise equal;
- **two writers**: a second ``relulearn estimate`` on a store being written, 20 times: refused within 1 s naming
  the holder; the first run's store bitwise equal;
- **corruption**: a flipped byte, a truncated and a deleted chunk in each kind of array, the ledger, deleted and
  damaged metadata: ``relulearn verify`` names each, ``estimate`` and ``learn`` refuse it, the store unchanged;
- **bad inputs**: 40+ mistakes in configurations, files and commands: one line naming the cause, exit code 2,
  no traceback, the store unchanged;
- **full disk** (root only: a small tmpfs): the failed commit named with the samples safe, resumed bitwise.
- **readers** against a live writer and a writer SIGKILLed mid-commit, for 60 s (15 s with ``--quick``):
  ``open_store().all_arrays()``, ``open_datatree().load()`` and ``relulearn report``, each read one whole commit or
  refused in one line (the store moved on), counted: 0 mixed;
- **generated cases** (:mod:`fault_cases`): about 360 bad configurations, ``.npy``/``.npz`` headers on every route,
  lease documents, data files, misbehaving callables and full disks, each classified as refused, correct, silent
  wrong, lost, untidy, unclear, traceback or hang, every case listed in the JSON.

Writes ``benchmarks/results/faults.json`` and prints the README's reliability table. ``--quick``: fewer kills and
trials (a minute or two).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _common import save_json, utc_now  # noqa: E402

PYTHON = sys.executable
OUT = Path(__file__).parent / "results" / "faults.json"

#: every statistic family, d = 16, a commit after each block of two chunks
CONFIG = {
    "seed": 5,
    "samples": 2_000_000,
    "chunk_size": 10_000,
    "source": {"d": 16, "teacher": {"kind": "one_hidden_relu", "width": 3, "seed": 1}, "noise_std": 0.05},
    "statistics": {
        "basic": {},
        "hermite": {"max_order": 3},
        "contracted": {"orders": [2, 4], "directions": 2},
        "filtered": {"quantiles": [0.25, 0.5, 0.9]},
    },
    "run": {"chunks_per_block": 2, "commit_interval": 0},
}


# ------------------------------------------------------------------------------------------- helpers


def env() -> dict[str, str]:
    out = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    out["PYTHONPATH"] = root + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    return out


def cli(*args: Any, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "relulearn.cli", *map(str, args)], env=env(), capture_output=True, text=True, timeout=timeout
    )


def popen(*args: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-m", "relulearn.cli", *map(str, args)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path``, its bytes (the store byte for byte)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def arrays(url: str) -> dict[str, np.ndarray]:
    from relulearn import open_store

    run = open_store(url)
    return {f"{s}/{k}": v for s in run.statistics for k, v in run.arrays(s).items()}


def bitwise_equal(a: str, b: str) -> bool:
    x, y = arrays(a), arrays(b)
    return sorted(x) == sorted(y) and all(np.array_equal(x[k], y[k], equal_nan=True) for k in x)


def committed(url: str) -> int:
    from relulearn import open_store

    try:
        return int(open_store(url).samples)
    except Exception:  # noqa: BLE001 - not yet a store
        return 0


def wait_for(cond: Callable[[], bool], proc: subprocess.Popen, seconds: float = 120) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def one_line_refusal(proc: subprocess.CompletedProcess) -> bool:
    """Exit code 2, no traceback, and the cause in one ``relulearn…: error:`` line (after argparse's usage, for a
    mistake on the command line)."""
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("relulearn") and "error:" in ln]
    return proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1


# --------------------------------------------------------------------------------------------- kills


def driver_kills(work: Path, cfg: Path, ref: str, kills: int, rng: np.random.Generator) -> dict:
    """SIGKILL or SIGINT to the process group of `relulearn estimate` at random moments, then resume."""
    url = str(work / "killed.zarr")
    cmd = ["estimate", cfg, "--store", url, "--workers", "2", "--quiet"]  # the same command, no flag
    done, signals = 0, []
    while done < kills:
        before = committed(url)
        proc = popen(*cmd)
        # a moment while blocks run: after this run's first commit, then up to 1.5 s more (a block or two)
        wait_for(lambda before=before: committed(url) > before, proc)
        time.sleep(float(rng.uniform(0.0, 1.5)))
        if proc.poll() is not None:
            break
        sig = signal.SIGKILL if done % 2 == 0 else signal.SIGINT
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
        signals.append(
            {
                "signal": sig.name,
                "committed": committed(url),
                "returncode": proc.returncode,
                "one_line": sig == signal.SIGKILL or len(err.strip().splitlines()) == 1,
                "stderr": err.strip()[-300:],
            }
        )
        done += 1
    final = cli(*cmd)
    ok = final.returncode == 0 and bitwise_equal(url, ref) and all(s["one_line"] for s in signals)
    return {
        "kills": len(signals),
        "survived": len(signals) if ok else 0,
        "trials": signals,
        "final": {"returncode": final.returncode, "stderr": final.stderr[-600:]},
    }


def other_host_kills(work: Path, cfg: Path, ref: str, kills: int, rng: np.random.Generator) -> dict:
    """SIGKILL at a random moment, the lease then made another host's with a fresh heartbeat (its machine died just
    now): the same command is refused naming that host until the heartbeat is older than RELULEARN_LEASE_TIMEOUT
    (here 4 s), then it takes the lease over and resumes, until the run is done: bitwise equal."""
    url = str(work / "elsewhere.zarr")
    timeout = 4.0
    extra = {"RELULEARN_LEASE_TIMEOUT": str(timeout)}
    cmd = ["estimate", cfg, "--store", url, "--workers", "2", "--quiet"]
    trials = []
    for _ in range(kills):
        before = committed(url)
        proc = subprocess.Popen(
            [PYTHON, "-m", "relulearn.cli", *map(str, cmd)],
            env=dict(env(), **extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        wait_for(lambda before=before: committed(url) > before, proc)
        time.sleep(float(rng.uniform(0.0, 1.5)))
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=120)
        lease = Path(url) / "lease.json"
        doc = json.loads(lease.read_text())
        doc.update(host="node-elsewhere", heartbeat=dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"))
        lease.write_text(json.dumps(doc))
        before_bytes = snapshot(Path(url))
        early = subprocess.run(
            [PYTHON, "-m", "relulearn.cli", *map(str, cmd)], env=dict(env(), **extra), capture_output=True, text=True
        )
        refused = one_line_refusal(early) and "node-elsewhere" in early.stderr and snapshot(Path(url)) == before_bytes
        time.sleep(timeout)
        trials.append({"committed": committed(url), "refused_while_recent": refused, "stderr": early.stderr[-300:]})
    final = subprocess.run(
        [PYTHON, "-m", "relulearn.cli", *map(str, cmd)], env=dict(env(), **extra), capture_output=True, text=True
    )
    ok = final.returncode == 0 and bitwise_equal(url, ref) and all(t["refused_while_recent"] for t in trials)
    return {
        "kills": len(trials),
        "survived": len(trials) if ok else 0,
        "trials": trials,
        "final": {"returncode": final.returncode, "stderr": final.stderr[-600:]},
    }


def fit_kills(work: Path, cfg: Path, kills: int, rng: np.random.Generator) -> dict:
    """`relulearn fit --method moments` killed at random moments and run again: the model file bitwise equal."""
    ref_model = work / "fit_ref.npz"
    ref = cli(
        "fit",
        cfg,
        "--store",
        work / "fit_ref.zarr",
        "--method",
        "moments",
        "--out",
        ref_model,
        "--workers",
        "2",
        "--quiet",
    )
    assert ref.returncode == 0, ref.stderr
    url, model = work / "fit.zarr", work / "fit.npz"
    cmd = [
        "fit",
        cfg,
        "--store",
        url,
        "--method",
        "moments",
        "--out",
        model,
        "--workers",
        "2",
        "--quiet",
        "--break-lock",
    ]
    trials = []
    for i in range(kills):
        proc = popen(*cmd)
        time.sleep(float(rng.uniform(3.0, 10.0)))
        if proc.poll() is not None:
            trials.append({"finished_first": True, "returncode": proc.returncode, "stderr": proc.stderr.read()[-300:]})
            break
        os.killpg(proc.pid, signal.SIGKILL if i % 2 == 0 else signal.SIGINT)
        proc.wait()
        trials.append({"signal": "SIGKILL" if i % 2 == 0 else "SIGINT", "committed": committed(str(url))})
    final = cli(*cmd)
    ok = final.returncode == 0 and model.read_bytes() == ref_model.read_bytes()
    return {
        "kills": len(trials),
        "survived": len(trials) if ok else 0,
        "trials": trials,
        "final": {"returncode": final.returncode, "stderr": final.stderr[-600:]},
    }


def _dask(*args: str) -> list[str]:
    exe = Path(PYTHON).parent / "dask"
    return [str(exe), *args] if exe.exists() else [PYTHON, "-m", "dask", *args]


def worker_kills(work: Path, cfg: Path, ref: str, kills: int) -> dict:
    """An external cluster (scheduler file, two workers); during `estimate --scheduler`, a worker is SIGKILLed
    and another started, ``kills`` times."""
    sched_file = str(work / "scheduler.json")
    procs = []

    def spawn(cmd: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(
            cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        procs.append(p)
        return p

    def worker() -> subprocess.Popen:
        return spawn(
            _dask(
                "worker",
                "--scheduler-file",
                sched_file,
                "--nthreads",
                "1",
                "--host",
                "127.0.0.1",
                "--preload",
                "relulearn.pipeline.worker",
            )
        )

    try:
        spawn(
            _dask(
                "scheduler",
                "--scheduler-file",
                sched_file,
                "--port",
                "0",
                "--dashboard-address",
                "127.0.0.1:0",
                "--host",
                "127.0.0.1",
            )
        )
        workers = [worker(), worker()]
        url = str(work / "external.zarr")
        run = popen("estimate", cfg, "--store", url, "--scheduler", sched_file, "--quiet")
        killed = 0
        for _ in range(kills):
            if not wait_for(
                lambda killed=killed: committed(url) > (killed + 1) * CONFIG["samples"] // (kills + 2), run, 300
            ):
                break
            victim = workers.pop(0)
            os.killpg(victim.pid, signal.SIGKILL)
            workers.append(worker())
            killed += 1
        _, err = run.communicate(timeout=600)
        ok = run.returncode == 0 and bitwise_equal(url, ref)
        return {"kills": killed, "survived": killed if ok else 0, "error": None if ok else err[-500:]}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def two_writers(work: Path, cfg_data: dict, trials: int) -> dict:
    """A second writer against a live one, ``trials`` times: refused within 1 s naming the holder."""
    from relulearn.api import estimate
    from relulearn.config import config_from_dict

    long_cfg = write_config(work / "long.yaml", dict(cfg_data, samples=4_000_000))
    url = str(work / "two.zarr")
    first = popen("estimate", long_cfg, "--store", url, "--workers", "1", "--quiet")
    assert wait_for(lambda: (Path(url) / "lease.json").exists(), first), "the first writer never took the lease"
    times, named = [], 0
    for _ in range(trials):
        t = time.perf_counter()
        second = cli("estimate", long_cfg, "--store", url, "--in-process", "--quiet")
        times.append(time.perf_counter() - t)
        named += int(
            second.returncode == 2 and "is locked" in second.stderr and f"process {first.pid}" in second.stderr
        )
    # the interpreter's start is most of a refusal's wall time: the refusal itself, measured in this process
    from relulearn.cli import main as cli_main

    inner = []
    for _ in range(trials):
        t = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):
            rc = cli_main(["estimate", str(long_cfg), "--store", url, "--in-process", "--quiet"])
        inner.append(time.perf_counter() - t)
        named += 0 if rc == 2 else -1
    os.killpg(first.pid, signal.SIGINT)
    first.communicate(timeout=120)
    # the first writer's store, resumed to its end, against one uninterrupted run of the same samples
    short = dict(cfg_data, samples=committed(url))
    ref = str(work / "two_ref.zarr")
    estimate(config_from_dict(short), ref, client="local", progress=None)
    ok = bitwise_equal(url, ref)
    return {
        "trials": trials,
        "refused_naming_holder": named,
        "max_seconds_cli": max(times),
        "max_seconds_in_process": max(inner),
        "first_bitwise_equal": ok,
    }


# ---------------------------------------------------------------------------------------- corruption


def _chunk_files(store: Path) -> dict[str, Path]:
    """A chunk of one array of each kind in the committed generation — each statistic's largest array of sums,
    and the ledger (array path → chunk file)."""
    from relulearn import open_store

    head = store / open_store(str(store)).head
    out = {}
    for group in sorted(p for p in head.iterdir() if p.is_dir()):
        arrays = [m.parent for m in group.rglob("zarr.json") if m.parent != group]
        # chunk objects: `c.0.1` (this store's key encoding) or `c/0/1` (zarr's default), `c` for a scalar
        chunked = {a: sorted(p for p in a.rglob("*") if p.is_file() and p.name != "zarr.json") for a in arrays}
        if not any(chunked.values()):
            continue
        sums = [a for a in chunked if a.name.startswith("sum_") and chunked[a]] or [a for a in chunked if chunked[a]]
        largest = max(sums, key=lambda a: sum(p.stat().st_size for p in chunked[a]))
        out[str(largest.relative_to(head))] = chunked[largest][0]
    return out


def corruption(work: Path, cfg: Path, ref: str) -> dict:
    """Flip, truncate, delete a chunk of each array; delete and damage metadata: `verify` names it, `estimate`
    and `learn` refuse it, the store unchanged."""
    targets = _chunk_files(Path(ref))
    cases: list[tuple[str, str, Callable[[Path], None]]] = []
    for name, chunk in targets.items():
        rel = chunk.relative_to(Path(ref))

        def flip(s: Path, rel=rel) -> None:
            data = bytearray((s / rel).read_bytes())
            data[len(data) // 2] ^= 0x01
            (s / rel).write_bytes(bytes(data))

        def truncate(s: Path, rel=rel) -> None:
            data = (s / rel).read_bytes()
            (s / rel).write_bytes(data[: len(data) // 2])

        def delete(s: Path, rel=rel) -> None:
            (s / rel).unlink()

        cases += [(name, "flip", flip), (name, "truncate", truncate), (name, "delete", delete)]

    some_array = next(iter(targets))
    head = Path(targets[some_array]).relative_to(Path(ref)).parts[0]

    def no_array_meta(s: Path) -> None:
        (s / head / some_array / "zarr.json").unlink()

    def bad_array_meta(s: Path) -> None:
        (s / head / some_array / "zarr.json").write_text("{not json")

    def no_root(s: Path) -> None:
        (s / "zarr.json").unlink()

    def bad_root(s: Path) -> None:
        (s / "zarr.json").write_text("{not json")

    cases += [
        (some_array, "delete its metadata", no_array_meta),
        (some_array, "damage its metadata", bad_array_meta),
        ("root metadata", "delete", no_root),
        ("root metadata", "damage", bad_root),
    ]
    rows = []
    for name, kind, inject in cases:
        store = work / "corrupt.zarr"
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(ref, store)
        inject(store)
        before = snapshot(store)
        verify = cli("verify", store)
        extend = cli(
            "estimate", cfg, "--store", store, "--samples", CONFIG["samples"] + 100_000, "--in-process", "--quiet"
        )
        learn = cli("learn", store, "--method", "moments", "--out", work / "m.npz", "--in-process", "--quiet")
        unchanged = snapshot(store) == before
        leaf = name.split("/")[-1]
        rows.append(
            {
                "array": name,
                "damage": kind,
                "verify_named": verify.returncode != 0
                and (leaf in verify.stdout + verify.stderr or name == "root metadata"),
                "estimate_refused": one_line_refusal(extend),
                "learn_refused": one_line_refusal(learn),
                "unchanged": unchanged,
            }
        )
    detected = sum(r["verify_named"] and r["estimate_refused"] and r["learn_refused"] and r["unchanged"] for r in rows)
    return {
        "injected": len(rows),
        "detected_and_refused": detected,
        "silent_uses": sum(not (r["estimate_refused"] and r["learn_refused"]) for r in rows),
        "cases": rows,
    }


# ---------------------------------------------------------------------------------------- bad inputs


def bad_inputs(work: Path, cfg_data: dict, store: Path) -> dict:
    """Mistakes a user makes, each refused in one line naming the cause (exit 2, no traceback), the store
    unchanged."""

    def conf(name: str, **changes: Any) -> Path:
        data = json.loads(json.dumps(cfg_data))
        for dotted, value in changes.items():
            *parents, last = dotted.split("__")
            node = data
            for p in parents:
                node = node.setdefault(p, {})
            if value is None:
                node.pop(last, None)
            else:
                node[last] = value
        return write_config(work / f"{name}.yaml", data)

    base = write_config(work / "base.yaml", cfg_data)
    text = base.read_text()
    (work / "twice.yaml").write_text(text + "seed: 99\n")
    (work / "binary.yaml").write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x08\x00\xb7\xac")
    (work / "broken.yaml").write_text("seed: 3\nsource: {d: 4\n")
    (work / "list.yaml").write_text("- 1\n- 2\n")
    (work / "x.csv").write_text("1,2\n3,4\n")
    (work / "notes.txt").write_text("hello")
    np.save(work / "wide.npy", np.zeros((5, 7)))
    np.save(work / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (work / "broken.npz").write_bytes(b"not a zip")
    from relulearn.network import Network

    Network((np.eye(16)[:3], np.ones((1, 3))), activation="relu").save(work / "model.npz")
    data_x = np.random.default_rng(0).standard_normal((1000, 16))
    np.save(work / "x.npy", data_x)
    nan_y = np.ones(1000)
    nan_y[17] = np.nan
    np.save(work / "y_nan.npy", nan_y)
    s, other = str(store), str(work / "fresh.zarr")
    cases: list[tuple[str, list]] = [
        ("unknown key", ["estimate", conf("k1", chunksize=5), "--store", other]),
        ("misspelled teacher key", ["estimate", conf("k2", source__teacher__widht=3), "--store", other]),
        ("samples not a number", ["estimate", conf("k3", samples="many"), "--store", other]),
        ("negative samples", ["estimate", conf("k4", samples=-5), "--store", other]),
        ("chunk size 1", ["estimate", conf("k5", chunk_size=1), "--store", other]),
        ("d not a number", ["estimate", conf("k6", source__d="x"), "--store", other]),
        ("statistics a scalar", ["estimate", conf("k7", statistics=5), "--store", other]),
        ("no source", ["estimate", conf("k8", source=None), "--store", other]),
        (
            "quantiles and thresholds",
            ["estimate", conf("k9", statistics__filtered={"quantiles": [0.5], "thresholds": [1.0]}), "--store", other],
        ),
        (
            "repeated contracted orders",
            ["estimate", conf("k10", statistics__contracted={"orders": [2, 2]}), "--store", other],
        ),
        (
            "zero directions",
            ["estimate", conf("k11", statistics__contracted={"orders": [2], "directions": 0}), "--store", other],
        ),
        (
            "10^12 directions",
            ["estimate", conf("k12", statistics__contracted={"orders": [2], "directions": 10**12}), "--store", other],
        ),
        ("huge d", ["estimate", conf("k13", source__d=10_000_000), "--store", other]),
        ("duplicate YAML key", ["estimate", work / "twice.yaml", "--store", other]),
        ("binary configuration", ["estimate", work / "binary.yaml", "--store", other]),
        ("broken YAML", ["estimate", work / "broken.yaml", "--store", other]),
        ("YAML list", ["estimate", work / "list.yaml", "--store", other]),
        ("missing configuration", ["estimate", work / "nothere.yaml", "--store", other]),
        ("another configuration on a store", ["estimate", conf("k14", seed=6), "--store", s]),
        ("another teacher on a store", ["estimate", conf("k15", source__noise_std=0.5), "--store", s]),
        ("store under a regular file", ["estimate", base, "--store", work / "notes.txt" / "s.zarr"]),
        ("a folder that is not a store", ["estimate", base, "--store", work]),
        ("--samples not a number", ["estimate", base, "--store", s, "--samples", "many"]),
        ("--samples negative", ["estimate", base, "--store", s, "--samples", "-3"]),
        ("--workers 0", ["estimate", base, "--store", s, "--workers", "0"]),
        ("unreachable scheduler", ["estimate", base, "--store", s, "--scheduler", "tcp://127.0.0.1:1"]),
        ("dashboard address", ["estimate", base, "--store", s, "--dashboard", "nowhere"]),
        (
            "data file missing",
            [
                "estimate",
                conf("k16", source={"d": 16, "data": {"x": str(work / "no.npy"), "y": str(work / "no.npy")}}),
                "--store",
                other,
            ],
        ),
        (
            "data file a CSV",
            [
                "estimate",
                conf("k17", source={"d": 16, "data": {"x": str(work / "x.csv"), "y": str(work / "x.csv")}}),
                "--store",
                other,
            ],
        ),
        (
            "data of another width",
            [
                "estimate",
                conf("k18", source={"d": 16, "data": {"x": str(work / "wide.npy"), "y": str(work / "x.npy")}}),
                "--store",
                other,
            ],
        ),
        (
            "data holding objects",
            [
                "estimate",
                conf("k19", source={"d": 16, "data": {"x": str(work / "objects.npy"), "y": str(work / "x.npy")}}),
                "--store",
                other,
            ],
        ),
        (
            "a NaN label",
            [
                "estimate",
                conf(
                    "k20",
                    samples=1000,
                    chunk_size=500,
                    source={"d": 16, "data": {"x": str(work / "x.npy"), "y": str(work / "y_nan.npy")}},
                ),
                "--store",
                other,
            ],
        ),
        (
            "teacher file missing",
            ["estimate", conf("k21", source__teacher={"file": str(work / "no.npz")}), "--store", other],
        ),
        (
            "teacher file broken",
            ["estimate", conf("k22", source__teacher={"file": str(work / "broken.npz")}), "--store", other],
        ),
        (
            "ONNX teacher missing",
            ["estimate", conf("k23", source__teacher={"onnx": str(work / "no.onnx")}), "--store", other],
        ),
        ("status of a folder", ["status", work]),
        ("status of nothing", ["status", work / "nothere.zarr"]),
        ("report of nothing", ["report", work / "nothere.zarr", "--out", work / "r.html"]),
        ("learn: unknown method", ["learn", s, "--method", "magic", "--out", work / "m.npz"]),
        ("learn: width 0", ["learn", s, "--method", "moments", "--width", "0", "--out", work / "m.npz"]),
        ("learn: report path a folder", ["learn", s, "--method", "moments", "--out", work / "m.npz", "--report", work]),
        ("merge: a store with itself", ["merge", s, s, "--out", work / "merged.zarr"]),
        ("merge: a missing store", ["merge", s, work / "nothere.zarr", "--out", work / "merged.zarr"]),
        ("evaluate: a pickle teacher", ["evaluate", work / "model.npz", "--teacher", work / "t.pkl"]),
        ("evaluate: a missing model", ["evaluate", work / "nothere.npz", "--teacher", base]),
        ("evaluate: a broken model", ["evaluate", work / "broken.npz", "--teacher", base]),
        (
            "predict: inputs of another width",
            ["predict", work / "model.npz", "--input", work / "wide.npy", "--out", work / "p.npy"],
        ),
        (
            "predict: inputs not .npy",
            ["predict", work / "model.npz", "--input", work / "x.csv", "--out", work / "p.npy"],
        ),
        (
            "fit: tensor on a deep teacher",
            [
                "fit",
                conf("k24", source__teacher={"kind": "deep_relu", "widths": [3, 3]}),
                "--store",
                other,
                "--method",
                "tensor",
                "--out",
                work / "m.npz",
            ],
        ),
    ]
    (work / "t.pkl").write_bytes(b"\x80\x04K\x01.")
    before = snapshot(store)
    rows = []
    for label, argv in cases:
        shutil.rmtree(other, ignore_errors=True)
        done = (
            cli(*argv, "--in-process")
            if argv[0] in ("estimate", "fit", "learn") and "--scheduler" not in argv and "--workers" not in argv
            else cli(*argv)
        )
        rows.append(
            {
                "input": label,
                "refused": one_line_refusal(done),
                "stderr": done.stderr.strip()[:300],
                "nothing_written": not Path(other).exists(),
            }
        )
    unchanged = snapshot(store) == before
    return {
        "inputs": len(rows),
        "refused": sum(r["refused"] and r["nothing_written"] for r in rows),
        "store_unchanged": unchanged,
        "cases": rows,
    }


# ------------------------------------------------------------------------------------------- readers


def _read_once(kind: str, url: str, chunk_size: int) -> tuple[str, int, str]:
    """One read of ``url`` by one reader kind, the samples of the commit it read and what went wrong: ``whole``
    (every family's ``count``, the ledger's rows for a handle, and the handle's or tree's ``samples`` agree, and the
    sums are not zeros), ``refused`` (one line saying the store moved on), ``mixed`` (two commits, or zeros) or
    ``traceback`` (anything else raised)."""
    from relulearn import StoreMovedError, open_datatree, open_store

    try:
        if kind == "handle":  # open_store().all_arrays(), and the ledger through the same handle
            run = open_store(url)
            stats = run.all_arrays()
            samples, basic = run.samples, stats["basic"]
            counts = {int(a["count"]) for a in stats.values()}
            ledger = run.ledger()
            counts.add(int((ledger[:, 2] - ledger[:, 1]).sum()) * chunk_size)
        else:  # open_datatree(...).load()
            tree = open_datatree(url).load()
            samples = int(tree.attrs["samples"])
            counts = {int(tree[name]["count"].values) for name in tree.children}
            basic = {k: tree["basic"][k].values for k in ("sum_xx", "xx")}
        ok = counts == {samples} and np.any(basic["sum_xx"]) and np.array_equal(basic["xx"], basic["sum_xx"] / samples)
        return ("whole", samples, "") if ok else ("mixed", samples, f"{samples} samples, counts {sorted(counts)}")
    except StoreMovedError as err:
        clear = "moved on to a newer commit" in str(err) and "\n" not in str(err)
        return ("refused" if clear else "traceback"), 0, str(err)
    except Exception as err:  # noqa: BLE001 - counted: a reader must never see one
        return "traceback", 0, f"{type(err).__name__}: {err}"


def readers(work: Path, cfg_data: dict, seconds: float) -> dict:
    """Reader loops for ``seconds`` against a live writer committing after every chunk, and a second store whose
    writer is SIGKILLed at random moments (mid-commit, most of its time) and started again, taking over the dead
    writer's lease: every read through ``open_store().all_arrays()`` (with the ledger), ``open_datatree(...).load()``
    and the ``relulearn report`` command is one whole commit or a clear one-line refusal, counted; mixed reads and
    tracebacks must be 0."""
    rng = np.random.default_rng(51)
    chunk = int(cfg_data["chunk_size"])  # a commit after every chunk
    data = dict(cfg_data, samples=10**8, run={"chunks_per_block": 1, "commit_interval": 0})
    cfg = write_config(work / "readers.yaml", data)
    live, killed = str(work / "readers-live.zarr"), str(work / "readers-killed.zarr")
    writer = popen("estimate", cfg, "--store", live, "--in-process", "--quiet")
    victim = popen("estimate", cfg, "--store", killed, "--in-process", "--quiet")
    assert wait_for(lambda: committed(live) > 0, writer), writer.stderr.read()
    outcomes = ("whole", "refused", "mixed", "traceback")
    counts = {
        f"{kind} {store}": dict.fromkeys(outcomes, 0) for kind in ("handle", "tree") for store in ("live", "killed")
    }
    reports = dict.fromkeys(("whole", "refused", "traceback"), 0)
    commits: set[int] = set()
    failures: list[str] = []
    kills, base, kill_at = 0, 0, None
    report: subprocess.Popen | None = None
    next_report = time.monotonic()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        now = time.monotonic()
        if kill_at is None and committed(killed) > base:  # the second writer (again) commits: kill it soon
            kill_at = now + rng.uniform(0, 1)
        if kill_at is not None and now >= kill_at:  # wherever it is (mostly inside a commit), then start it again
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            kills += 1
            base, kill_at = committed(killed), None
            victim = popen("estimate", cfg, "--store", killed, "--in-process", "--quiet")
        if victim.poll() is not None:  # a restarted writer must resume the killed one's store (no flag)
            failures.append(f"the restarted writer stopped: {victim.stderr.read().strip()[-300:]}")
            victim = popen("estimate", cfg, "--store", killed, "--in-process", "--quiet")
        if report is None and now >= next_report:  # `relulearn report` a few times, beside the reads
            report = subprocess.Popen(
                [PYTHON, "-m", "relulearn.cli", "report", live, "--out", str(work / "readers-report.html")],
                env=env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            next_report = now + seconds / 4
        if report is not None and report.poll() is not None:
            err = report.stderr.read()
            if report.returncode == 0:
                reports["whole"] += 1
            elif report.returncode == 2 and "Traceback" not in err and "moved on to a newer commit" in err:
                reports["refused"] += 1
            else:
                reports["traceback"] += 1
            report = None
        kind = ("handle", "tree")[i % 2]
        store = "killed" if (i // 2) % 2 and committed(killed) > 0 else "live"
        outcome, samples, detail = _read_once(kind, live if store == "live" else killed, chunk)
        counts[f"{kind} {store}"][outcome] += 1
        if outcome in ("mixed", "traceback") and len(failures) < 10:
            failures.append(f"{kind} {store}: {detail}")
        if store == "live" and samples:
            commits.add(samples)
        i += 1
    if report is not None:
        report.wait()
        reports["whole" if report.returncode == 0 else "refused" if report.returncode == 2 else "traceback"] += 1
    for p in (writer, victim):
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    total = {k: sum(c[k] for c in counts.values()) for k in outcomes}
    return {
        "seconds_of_reads": seconds,
        "reads": sum(total.values()),
        **total,
        "by_reader": counts,
        "reports": reports,
        "writer_kills": kills,
        "live_commits_read": len(commits),
        "failures": failures,
    }


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--quick", action="store_true", help="fewer kills and trials")
    parser.add_argument(
        "--only",
        nargs="*",
        help="sections to run (default all): driver elsewhere fit workers writers "
        "corruption inputs readers generated; the other sections' results in --out are kept",
    )
    args = parser.parse_args()
    quick = args.quick
    sections = set(
        args.only
        or ["driver", "elsewhere", "fit", "workers", "writers", "corruption", "inputs", "readers", "generated"]
    )
    rng = np.random.default_rng(20261205)
    from relulearn.api import estimate
    from relulearn.config import config_from_dict

    result: dict[str, Any] = {"date": utc_now(), "config": CONFIG, "quick": quick}
    if args.only and Path(args.out).exists():  # some sections again: keep the others' results
        result = dict(json.loads(Path(args.out).read_text()), **result)
    with tempfile.TemporaryDirectory(prefix="relulearn-faults-") as tmp:
        work = Path(tmp)
        cfg = write_config(work / "run.yaml", CONFIG)
        ref = str(work / "ref.zarr")
        estimate(config_from_dict(CONFIG), ref, client="local", progress=None)
        steps: list[tuple[str, Callable[[], dict]]] = [
            ("driver", lambda: driver_kills(work, cfg, ref, 4 if quick else 16, rng)),
            ("elsewhere", lambda: other_host_kills(work, cfg, ref, 2 if quick else 6, rng)),
            ("fit", lambda: fit_kills(work, cfg, 2 if quick else 8, rng)),
            ("workers", lambda: worker_kills(work, cfg, ref, 1 if quick else 3)),
            ("writers", lambda: two_writers(work, CONFIG, 5 if quick else 20)),
            ("corruption", lambda: corruption(work, cfg, ref)),
            ("inputs", lambda: bad_inputs(work, CONFIG, Path(ref))),
            ("readers", lambda: readers(work, CONFIG, 15 if quick else 60)),
            ("generated", lambda: generated_cases(work / "generated")),
        ]
        for name, step in steps:
            if name not in sections:
                continue
            t = time.perf_counter()
            result[name] = step()
            result[name]["seconds"] = time.perf_counter() - t
            print(name, json.dumps({k: v for k, v in result[name].items() if k not in ("cases", "trials")}), flush=True)
            save_json(result, Path(args.out))
    table(result)


def generated_cases(work: Path) -> dict:
    """The generated bad inputs and faults of :mod:`fault_cases` (about 360 cases)."""
    from fault_cases import generated

    return generated(work)


def table(r: dict) -> None:
    print("| fault | trials | outcome |")
    print("|---|---:|---|")
    if "driver" in r:
        print(
            f"| driver killed during `estimate` (SIGKILL / Ctrl-C to the process group) | {r['driver']['kills']} | "
            f"{r['driver']['survived']} resumed to a store bitwise equal to an uninterrupted run |"
        )
    if "elsewhere" in r:
        e = r["elsewhere"]
        print(
            f"| driver SIGKILLed, its lease then another host's with a fresh heartbeat | {e['kills']} | "
            f"{sum(t['refused_while_recent'] for t in e['trials'])} refused naming that host while the heartbeat was "
            f"recent, then taken over by the same command after the timeout; {e['survived']} resumed bitwise equal |"
        )
    if "fit" in r:
        print(
            f"| driver killed during `fit` | {r['fit']['kills']} | {r['fit']['survived']} rerun to a model file "
            "bitwise equal |"
        )
    if "workers" in r:
        print(
            f"| worker killed on an external cluster | {r['workers']['kills']} | {r['workers']['survived']} "
            "finished bitwise equal |"
        )
    if "writers" in r:
        w = r["writers"]
        print(
            f"| a second writer on a live store | {w['trials']} (+{w['trials']} in-process) | "
            f"{w['refused_naming_holder']} refused naming the holder, at most {w['max_seconds_in_process']:.2f} s "
            f"({w['max_seconds_cli']:.1f} s with the interpreter's start); first run bitwise equal: "
            f"{w['first_bitwise_equal']} |"
        )
    if "corruption" in r:
        c = r["corruption"]
        print(
            f"| flipped / truncated / deleted chunk of each array, damaged metadata | {c['injected']} | "
            f"{c['detected_and_refused']} named by `verify` and refused by `estimate` and `learn`, store "
            f"unchanged; {c['silent_uses']} silent uses |"
        )
    if "inputs" in r:
        b = r["inputs"]
        print(
            f"| bad inputs (configurations, files, commands) | {b['inputs']} | {b['refused']} refused in one "
            f"line naming the cause, nothing written; store unchanged: {b['store_unchanged']} |"
        )
    if "readers" in r:
        d = r["readers"]
        n = d["reports"]
        print(
            f"| readers for {d['seconds_of_reads']:.0f} s against a live writer and one SIGKILLed mid-commit "
            f"({d['writer_kills']} kills): `open_store().all_arrays()`, `open_datatree().load()`, `relulearn report` "
            f"| {d['reads']} (+{sum(n.values())} reports) | {d['whole']} one whole commit, {d['refused']} refused in "
            f"one line (the store moved on); {d['mixed']} mixed, {d['traceback']} tracebacks; reports: {n['whole']} "
            f"whole, {n['refused']} refused, {n['traceback']} tracebacks |"
        )
    if "generated" in r:
        g = r["generated"]
        for group, counts in g["by_group"].items():
            shown = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
            print(f"| generated: {group} | {sum(counts.values())} | {shown} |")
        o = g["outcomes"]
        print(
            f"| **all generated cases** | **{g['cases_total']}** | {o['refused']} refused in one line, {o['ok']} "
            f"correct; **{o['silent']} silent wrong, {o['lost']} lost, {o['traceback']} tracebacks, {o['hang']} "
            f"hangs**, {o['untidy']} untidy, {o['unclear']} unclear |"
        )


if __name__ == "__main__":
    main()
