"""Generated bad inputs and faults for ``benchmarks/faults.py --only generated``: configurations, file headers,
leases, data files, callables and full disks, each run as a user runs it (``relulearn`` in a fresh process, under
a memory limit and a timeout) and classified by what it proves:

- ``refused``: exit code 2, one ``relulearn: error:`` line, no traceback, and nothing written (a new store not
  created, a given store byte for byte unchanged, an output file unchanged or absent);
- ``ok``: exit code 0 and the case's truth holds (a store bitwise equal to the one the same samples give, a
  prediction equal to the reference one, a resumed run bitwise equal to an uninterrupted one);
- ``silent``: exit code 0 and the truth fails, or a bad input accepted: a wrong result nobody was told about;
- ``lost``: a refusal (or a crash) that changed or damaged a store or an output it was given;
- ``untidy``: refused, the given paths unchanged, but a new store or output left behind half made;
- ``unclear``: exit code 2 but not one line (or the wrong exit code for a refusal);
- ``traceback``: a Python traceback, a crash or runaway memory (the memory limit hit);
- ``hang``: no answer within the case's timeout.

Every case is listed in the JSON with its outcome and the first line of its message.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

#: the address-space limit of every case's process (runaway memory ends as a crash, not the machine's)
MEMORY_LIMIT = 6 * 2**30
OUTCOMES = ("refused", "ok", "silent", "lost", "untidy", "unclear", "traceback", "hang")

D = 6
#: a small run: in process, two blocks, every family a case may touch
BASE: dict[str, Any] = {
    "seed": 3,
    "samples": 4000,
    "chunk_size": 1000,
    "source": {"d": D, "teacher": {"kind": "one_hidden_relu", "width": 2, "seed": 1}, "noise_std": 0.1},
    "statistics": {"basic": {}, "hermite": {"max_order": 3}},
    "run": {"chunks_per_block": 1, "commit_interval": 0},
}


@dataclass
class Case:
    """One generated input or fault: ``argv`` run in ``work`` after ``setup``; ``truth`` decides an exit code 0
    (``None``: the input is bad, so exit 0 is a silent acceptance); ``guarded`` are the paths that must be byte for
    byte unchanged when the command refuses (``new``: paths a refusal must not create)."""

    group: str
    label: str
    argv: list[str]
    setup: Callable[[], None] | None = None
    truth: Callable[[subprocess.CompletedProcess], bool] | None = None
    guarded: list[Path] = field(default_factory=list)
    new: list[Path] = field(default_factory=list)
    timeout: float = 120.0
    #: a Ctrl-C is what it stands for (a KeyboardInterrupt raised by a teacher in this process is one): exit 130 with
    #: the one line saying what was committed is its correct answer
    interrupt: bool = False
    env: dict[str, str] = field(default_factory=dict)
    cleanup: Callable[[], None] | None = None


# ------------------------------------------------------------------------------------------------- running


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _env(work: Path, extra: dict[str, str]) -> dict[str, str]:
    out = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    out["PYTHONPATH"] = os.pathsep.join([root, str(work)] + ([out["PYTHONPATH"]] if out.get("PYTHONPATH") else []))
    out.update(extra)
    return out


def _state(paths: list[Path]) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            got[str(p)] = {str(q.relative_to(p)): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file()}
        elif p.is_file():
            got[str(p)] = p.read_bytes()
        else:
            got[str(p)] = None
    return got


def run_case(case: Case, work: Path) -> dict[str, Any]:
    """Run one case and classify it (see the module's docstring)."""
    if case.setup is not None:
        case.setup()
    before = _state(case.guarded)
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "relulearn.cli", *case.argv],
            cwd=work,
            env=_env(work, case.env),
            capture_output=True,
            text=True,
            timeout=case.timeout,
            preexec_fn=_limits,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as e:
        outcome, rc, err = "hang", None, (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else str(e.stderr)
    else:
        rc, err = done.returncode, done.stderr
        errors = [ln for ln in err.strip().splitlines() if ln.startswith("relulearn") and "error:" in ln]
        kept = _state(case.guarded) == before
        tidy = not any(p.exists() for p in case.new)
        if case.interrupt and rc == 130 and len(err.strip().splitlines()) == 1 and "interrupted" in err:
            outcome = "refused" if kept and tidy else "lost" if not kept else "untidy"
        elif "Traceback" in err or "MemoryError" in err or rc not in (0, 2):
            outcome = "traceback" if kept else "lost"
        elif rc == 2:
            outcome = "lost" if not kept else "untidy" if not tidy else "refused" if len(errors) == 1 else "unclear"
        else:
            try:
                good = case.truth is not None and case.truth(done)
            except Exception as exc:  # noqa: BLE001 - a truth that cannot be read is a failed truth
                err += f"\n[truth failed: {exc!r}]"
                good = False
            outcome = "ok" if good else "silent"
    seconds = time.perf_counter() - start
    if case.cleanup is not None:
        case.cleanup()
    message = [ln for ln in (err or "").strip().splitlines() if "error:" in ln or "Error" in ln][:1]
    return {
        "group": case.group,
        "case": case.label,
        "argv": [str(a) for a in case.argv],
        "outcome": outcome,
        "returncode": rc,
        "seconds": round(seconds, 2),
        "message": (message[0] if message else (err or "").strip()[-300:])[:400],
    }


def run_all(cases: list[Case], work: Path, parallel: int = 2) -> list[dict[str, Any]]:
    """Run the cases, ``parallel`` at a time (cases of one group share no files but their own)."""
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda c: run_case(c, work), cases))


# ------------------------------------------------------------------------------------------------- helpers


def _must(work: Path, *argv: Any) -> None:
    """``relulearn ARGV`` for a case's reference (a store, a prediction): it must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", "relulearn.cli", *map(str, argv)], env=_env(work, {}), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def _yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _changed(data: dict, dotted: str, value: Any) -> dict:
    out = json.loads(json.dumps(data))
    *parents, last = dotted.split(".")
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return out


def _arrays(url: Path) -> dict[str, np.ndarray]:
    from relulearn import open_store

    run = open_store(str(url))
    return {f"{s}/{k}": v for s, g in run.all_arrays().items() for k, v in g.items()}


def _same_arrays(a: Path, b: Path) -> bool:
    x, y = _arrays(a), _arrays(b)
    return sorted(x) == sorted(y) and all(np.array_equal(x[k], y[k], equal_nan=True) for k in x)


def _complete(url: Path, samples: int) -> bool:
    """The store verifies and holds the samples asked for."""
    from relulearn import open_store, verify

    return bool(verify(str(url))["intact"]) and open_store(str(url)).samples == samples


def _npy_header(shape: Any, descr: str = "<f8", fortran: bool = False, raw: str | None = None) -> bytes:
    """The bytes of a version-1 .npy header (as numpy writes it, or ``raw`` as its dictionary text)."""
    text = raw if raw is not None else repr({"descr": descr, "fortran_order": fortran, "shape": shape})
    body = text.encode("latin1")
    pad = 64 - (10 + len(body) + 1) % 64
    body = body + b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body


# ------------------------------------------------------------------------------------------------ the cases


def config_cases(work: Path) -> list[Case]:
    """Every key of a run's configuration given values it cannot take, and documents that are not one."""
    root = work / "configs"
    root.mkdir()
    bad: dict[str, list[Any]] = {
        "seed": [-1, 2**64, 1.5, "x", float("nan"), [], {}],
        "samples": [0, -1, 1.5, float("inf"), float("nan"), "many", 10**30, []],
        "chunk_size": [0, 1, -5, float("nan"), 10**20, "big", 2.5],
        "source.d": [0, -3, 10**9, 10**30, float("nan"), 2.5, "six"],
        "source.noise_std": [-1, float("nan"), float("inf"), "loud", 1e308],
        "source.teacher.width": [0, -1, 10**9, float("nan"), 1.5],
        "source.teacher.seed": [-1, 2**70, float("nan")],
        "source.teacher.kind": ["magic", 5, None],
        "statistics.hermite.max_order": [-1, 100, float("nan"), "four"],
        "statistics.hermite.max_entries": [0, -1],
        "statistics.contracted": [
            {"orders": []},
            {"orders": [1]},
            {"orders": [-2]},
            {"orders": [2, 2]},
            {"orders": [100]},
            {"orders": [2], "directions": 0},
            {"orders": [2], "directions": -1},
            {"orders": [2], "directions": 10**12},
            {"orders": [2], "directions": float("nan")},
        ],
        "statistics.filtered": [
            {"quantiles": []},
            {"quantiles": [1]},
            {"quantiles": [1.5]},
            {"quantiles": [-0.1]},
            {"quantiles": [float("nan")]},
            {"quantiles": [0.5, 0.5]},
            {"thresholds": [float("nan")]},
            {"thresholds": [float("inf")]},
            {"quantiles": [0.5], "thresholds": [1.0]},
            {"quantiles": [0.5], "pilot_samples": 0},
        ],
        "run.chunks_per_block": [0, -1, float("nan")],
        "run.commit_interval": [-1, float("nan"), float("-inf")],
        "run.worker_memory": [0, -1, float("nan")],
        "run.max_hours": [0, -1, float("nan")],
        "run.max_blocks_in_flight": [0, -1],
        "statistics.sketch": [{"rank": 0}, {"rank": -1}, {"rank": 10**9}],
        "source.output": [-1, 5, "first"],
        "statistcs": [{}],
        "source.teachr": [{}],
        "statistics.basik": [{}],
        "run.chunk_per_block": [1],
    }
    cases = []
    for key, values in bad.items():
        for i, value in enumerate(values):
            store = root / f"{key}-{i}.zarr"
            cfg = _yaml(root / f"{key}-{i}.yaml", _changed(BASE, key, value))
            cases.append(
                Case(
                    "configs",
                    f"{key}: {value!r}"[:80],
                    ["estimate", str(cfg), "--store", str(store), "--in-process"],
                    new=[store],
                )
            )
    # values at the edge of what is allowed: accepted, and the store holds what was asked for
    fine: dict[str, Any] = {
        "statistics.hermite.max_entries": 10**30,
        "statistics.filtered": {"quantiles": [0]},
        "run.chunks_per_block": 10**12,
        "run.commit_interval": float("inf"),
        "source.noise_std": 0,
        "run.max_hours": 1e300,
    }
    for i, (key, value) in enumerate(fine.items()):
        store = root / f"fine-{i}.zarr"
        cfg = _yaml(root / f"fine-{i}.yaml", _changed(BASE, key, value))
        cases.append(
            Case(
                "configs",
                f"{key}: {value!r} (allowed)",
                ["estimate", str(cfg), "--store", str(store), "--in-process"],
                truth=lambda _p, store=store: _complete(store, BASE["samples"]),
            )
        )
    comment = root / "comment.yaml"
    comment.write_bytes(b"#" + b"x" * (20 * 2**20) + b"\n" + yaml.safe_dump(BASE).encode())
    cases.append(
        Case(
            "configs",
            "a 20 MB comment (allowed)",
            ["estimate", str(comment), "--store", str(root / "comment.zarr"), "--in-process"],
            truth=lambda _p: _complete(root / "comment.zarr", BASE["samples"]),
        )
    )
    # documents that are not a configuration
    docs: dict[str, bytes] = {
        "empty file": b"",
        "null": b"null\n",
        "a number": b"42\n",
        "a list": b"- 1\n- 2\n",
        "broken YAML": b"seed: 3\nsource: {d: 4\n",
        "a tab indent": b"seed: 3\n\tsamples: 4\n",
        "duplicate key": yaml.safe_dump(BASE).encode() + b"seed: 99\n",
        "binary": bytes(range(256)) * 4,
        "UTF-16": yaml.safe_dump(BASE).encode("utf-16"),
        "5000 levels of lists": b"[" * 5000 + b"]" * 5000,
        "5000 levels of mappings": b"a: " + b"{a: " * 5000 + b"1" + b"}" * 5000,
        "an alias bomb": b"a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + b"".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n".encode() for i in range(8)
        )
        + b"seed: *i\n",
        "a python tag": b"seed: !!python/object/apply:os.system ['true']\n",
        "NUL bytes": b"seed: 3\x00\n",
    }
    for i, (label, text) in enumerate(docs.items()):
        cfg = root / f"doc-{i}.yaml"
        cfg.write_bytes(text)
        store = root / f"doc-{i}.zarr"
        cases.append(Case("configs", label, ["estimate", str(cfg), "--store", str(store), "--in-process"], new=[store]))
    for label, target in {"a directory": root, "/dev/zero": Path("/dev/zero"), "missing": root / "no.yaml"}.items():
        store = root / f"special-{label}.zarr"
        cases.append(
            Case(
                "configs",
                f"configuration is {label}",
                ["estimate", str(target), "--store", str(store), "--in-process"],
                new=[store],
                timeout=60,
            )
        )
    return cases


#: .npy variants: (label, bytes builder from the canonical array, whether a correct reader accepts it)
def _npy_variants(a: np.ndarray) -> list[tuple[str, bytes, bool]]:
    data = a.astype("<f8").tobytes()
    n, d = a.shape
    good = _npy_header((n, d)) + data
    return [
        ("a huge claimed shape", _npy_header((10**12, d)) + data, False),
        ("a negative shape", _npy_header((-n, d)) + data, False),
        ("a shape of strings", _npy_header(("a", d)) + data, False),
        ("object dtype", _npy_header((n, d), "|O") + data, False),
        ("complex dtype", _npy_header((n, d // 2), "<c16") + data, False),
        ("string dtype", _npy_header((n, d), "<U2") + data[: n * d * 8], False),
        (
            "structured dtype",
            _npy_header((n,), raw=f"{{'descr': [('a', '<f8'), ('b', '<f8')], 'fortran_order': False, 'shape': ({n},)}}")
            + data[: n * 16],
            False,
        ),
        ("truncated data", good[: len(good) - 8 * d * 3 - 5], False),
        ("truncated header", good[:40], False),
        ("bad magic", b"\x93NUMPX" + good[6:], False),
        ("version 9", good[:6] + b"\x09\x00" + good[8:], False),
        ("header length beyond the file", good[:8] + struct.pack("<H", 65000) + good[10:], False),
        ("header not a dict", _npy_header((n, d), raw="[1, 2, 3]") + data, False),
        ("header without shape", _npy_header((n, d), raw="{'descr': '<f8', 'fortran_order': False}") + data, False),
        ("header with code", _npy_header((n, d), raw="__import__('os').system('true')") + data, False),
        ("zero-dimensional", _npy_header(()) + data[:8], False),
        ("no rows", _npy_header((0, d)), False),
        ("three dimensions", _npy_header((n, d, 1)) + data, False),
        ("an empty file", b"", False),
        (
            "Fortran order (valid)",
            _npy_header((n, d), fortran=True) + np.asfortranarray(a).T.astype("<f8").tobytes(),
            True,
        ),
        ("big-endian (valid)", _npy_header((n, d), ">f8") + a.astype(">f8").tobytes(), True),
        ("float32 (valid)", _npy_header((n, d), "<f4") + a.astype("<f4").tobytes(), True),
        ("trailing bytes", good + b"\x00" * 64, False),
    ]


def header_cases(work: Path) -> list[Case]:
    """Crafted .npy and .npz files on every route that reads one: a data source's x and y, `predict --input`,
    and network files (a teacher file, `predict`'s model)."""
    from relulearn.network import Network

    root = work / "headers"
    root.mkdir()
    rng = np.random.default_rng(7)
    n = 4000
    x = rng.standard_normal((n, D)).astype(np.float32).astype(np.float64)  # float32 values: every dtype agrees
    w = rng.standard_normal((2, D))
    y = np.maximum(x @ w.T, 0).sum(1).astype(np.float32).astype(np.float64)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    data_cfg = dict(
        BASE, source={"d": D, "data": {"x": str(root / "x.npy"), "y": str(root / "y.npy"), "whiten": False}}
    )
    ref = root / "ref.zarr"
    _must(work, "estimate", str(_yaml(root / "ref.yaml", data_cfg)), "--store", str(ref), "--in-process", "--quiet")
    model = root / "model.npz"
    Network((w, np.ones((1, 2))), activation="relu").save(model)
    px = x[:50]
    np.save(root / "px.npy", px)
    _must(work, "predict", str(model), "--input", str(root / "x.npy"), "--out", str(root / "ref_pred.npy"))
    expected_pred = np.load(root / "ref_pred.npy")

    cases = []
    for i, (label, raw, valid) in enumerate(_npy_variants(x)):
        valid_predict = valid or label == "no rows"  # no rows to predict: no predictions
        f = root / f"x-{i}.npy"
        f.write_bytes(raw)
        store = root / f"x-{i}.zarr"
        cfg = _yaml(root / f"x-{i}.yaml", _changed(data_cfg, "source.data.x", str(f)))
        truth = (lambda _p, store=store: _same_arrays(store, ref)) if valid else None
        cases.append(
            Case(
                "headers",
                f"data x: {label}",
                ["estimate", str(cfg), "--store", str(store), "--in-process"],
                truth=truth,
                new=[] if valid else [store],
            )
        )
        out = root / f"pred-{i}.npy"
        out.write_bytes(b"old predictions")

        def same_pred(_p: Any, out: Path = out, rows: bool = label != "no rows") -> bool:
            return np.array_equal(np.load(out), expected_pred if rows else expected_pred[:0])

        cases.append(
            Case(
                "headers",
                f"predict --input: {label}",
                ["predict", str(model), "--input", str(f), "--out", str(out)],
                truth=same_pred if valid_predict else None,
                guarded=[] if valid_predict else [out],
            )
        )
    for i, (label, raw, valid) in enumerate(_npy_variants(y.reshape(-1, 1))):
        if "complex" in label or "structured" in label or "three" in label:
            continue
        f = root / f"y-{i}.npy"
        f.write_bytes(raw)
        store = root / f"y-{i}.zarr"
        cfg = _yaml(root / f"y-{i}.yaml", _changed(data_cfg, "source.data.y", str(f)))
        cases.append(
            Case(
                "headers",
                f"data y: {label}",
                ["estimate", str(cfg), "--store", str(store), "--in-process"],
                truth=(lambda _p, store=store: _same_arrays(store, ref)) if valid else None,
                new=[] if valid else [store],
            )
        )

    # network files (.npz): a teacher file and predict's model
    def npz(path: Path, members: dict[str, bytes], compress: int = zipfile.ZIP_STORED) -> None:
        with zipfile.ZipFile(path, "w", compress) as z:
            for name, raw in members.items():
                z.writestr(name, raw)

    def arr(a: np.ndarray) -> bytes:
        return _npy_header(a.shape, a.dtype.str) + a.tobytes()

    w0, w1 = w, np.ones((1, 2))
    net = {"W0.npy": arr(w0), "W1.npy": arr(w1)}
    variants: dict[str, dict[str, bytes] | bytes] = {
        "not a zip": b"PK\x03\x04 not really",
        "an empty zip": {},
        "a W0 of huge claimed shape": {"W0.npy": _npy_header((10**9, 10**6)) + w0.tobytes(), "W1.npy": arr(w1)},
        "a W0 holding objects": {"W0.npy": _npy_header(w0.shape, "|O") + w0.tobytes(), "W1.npy": arr(w1)},
        "a complex W0": {"W0.npy": arr(w0.astype(complex)), "W1.npy": arr(w1)},
        "a NaN weight": {"W0.npy": arr(np.where(np.eye(2, D) > 0, np.nan, w0)), "W1.npy": arr(w1)},
        "an infinite weight": {"W0.npy": arr(np.where(np.eye(2, D) > 0, np.inf, w0)), "W1.npy": arr(w1)},
        "widths that do not chain": {"W0.npy": arr(w0), "W1.npy": arr(np.ones((1, 3)))},
        "a truncated member": {"W0.npy": arr(w0)[:-20], "W1.npy": arr(w1)},
        "a member with a path": {"../W0.npy": arr(w0), "W1.npy": arr(w1)},
        "a 1-D W0": {"W0.npy": arr(w0.ravel()), "W1.npy": arr(w1)},
        "a string activation array": {**net, "activation.npy": arr(np.array(["nope"]))},
    }
    linear = root / "linear.npz"
    npz(linear, {"W0.npy": arr(w0)})  # one weight matrix: the linear network x -> W0 x, a network too
    store = root / "linear.zarr"
    cases.append(
        Case(
            "headers",
            "teacher file: only W0 (a linear network)",
            [
                "estimate",
                str(_yaml(root / "linear.yaml", _changed(BASE, "source.teacher", {"file": str(linear)}))),
                "--store",
                str(store),
                "--in-process",
            ],
            truth=lambda _p, store=store: _complete(store, BASE["samples"]),
        )
    )
    out = root / "linear-pred.npy"
    cases.append(
        Case(
            "headers",
            "predict model: only W0 (a linear network)",
            ["predict", str(linear), "--input", str(root / "x.npy"), "--out", str(out)],
            truth=lambda _p, out=out: np.allclose(np.load(out), x @ w0.T, rtol=1e-14, atol=1e-14),
        )
    )
    for i, (label, members) in enumerate(variants.items()):
        f = root / f"net-{i}.npz"
        if isinstance(members, bytes):
            f.write_bytes(members)
        else:
            npz(f, members)
        store = root / f"net-{i}.zarr"
        cfg = _yaml(root / f"net-{i}.yaml", _changed(BASE, "source.teacher", {"file": str(f)}))
        cases.append(
            Case(
                "headers",
                f"teacher file: {label}",
                ["estimate", str(cfg), "--store", str(store), "--in-process"],
                new=[store],
            )
        )
        out = root / f"netpred-{i}.npy"
        cases.append(
            Case(
                "headers",
                f"predict model: {label}",
                ["predict", str(f), "--input", str(root / "px.npy"), "--out", str(out)],
                new=[out],
            )
        )
    # a zip bomb: one member claiming 8 GB, its zip entry small
    bomb = root / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("W0.npy", "w", force_zip64=True) as member:
            member.write(_npy_header((2**15, 2**15)))
            zero = bytes(2**20)
            for _ in range(64):  # 64 MB of zeros inflated; the header claims 8 GB
                member.write(zero)
        z.writestr("W1.npy", arr(w1))
    store = root / "bomb.zarr"
    cases.append(
        Case(
            "headers",
            "teacher file: a zip bomb claiming 8 GB",
            [
                "estimate",
                str(_yaml(root / "bomb.yaml", _changed(BASE, "source.teacher", {"file": str(bomb)}))),
                "--store",
                str(store),
                "--in-process",
            ],
            new=[store],
        )
    )
    return cases


def lease_cases(work: Path, half: Path, ref: Path) -> list[Case]:
    """A store half written, and every lease document a writer may meet at its root: the same command either
    takes the lease over and finishes bitwise equal to an uninterrupted run, or refuses with the store unchanged."""
    root = work / "leases"
    root.mkdir()
    cfg = root / "run.yaml"
    shutil.copy(half.parent / "run.yaml", cfg)
    host = socket.gethostname()
    now = time.time()

    def iso(t: float) -> str:
        import datetime as dt

        return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds")

    def doc(**changes: Any) -> bytes:
        d: dict[str, Any] = {
            "holder": "f" * 32,
            "host": host,
            "pid": 999_999,
            "user": "ana",
            "command": "relulearn estimate",
            "started": iso(now - 100),
            "heartbeat": iso(now - 1),
            "process_start": 1,
        }
        for k, v in changes.items():
            if v is None:
                d.pop(k, None)
            else:
                d[k] = v
        return json.dumps(d).encode()

    def fifo(p: Path) -> None:
        os.mkfifo(p)

    docs: dict[str, Any] = {
        "pid a string": doc(pid="abc"),
        "pid a float": doc(pid=1.5),
        "pid null": doc(pid=None),
        "pid 2**70": doc(pid=2**70),
        "pid negative": doc(pid=-5),
        "pid 0": doc(pid=0),
        "pid 1 (a live process, another start time)": doc(pid=1),
        "pid of a dead process": doc(),
        "no host": doc(host=None),
        "host a number": doc(host=5),
        "heartbeat not a time": doc(heartbeat="yesterday"),
        "heartbeat 10 days ahead": doc(heartbeat=iso(now + 864_000)),
        "heartbeat NaN": doc(heartbeat=float("nan")),
        "another host, recent heartbeat": doc(host="elsewhere-7"),
        "another host, heartbeat 2 hours old": doc(host="elsewhere-7", heartbeat=iso(now - 7200)),
        "extra fields": doc(extra={"a": [1, 2]}),
        "a JSON list": b"[1, 2, 3]",
        "JSON null": b"null",
        "an empty file": b"",
        "binary bytes": bytes(range(256)),
        "a 200 kB document": b'{"holder": "' + b"h" * 200_000 + b'"}',
        "deeply nested JSON": b"[" * 100_000 + b"]" * 100_000,
        "a symbolic link to /dev/zero": Path("/dev/zero"),
        "a symbolic link to nowhere": Path("/nonexistent/lease.json"),
        "a FIFO": fifo,
        "a folder": "dir",
    }
    cases = []
    for i, (label, content) in enumerate(docs.items()):
        for command in ("estimate", "estimate --break-lock", "status"):
            store = root / f"s-{i}-{command.replace(' ', '')}.zarr"
            lease = store / "lease.json"

            def setup(store: Path = store, lease: Path = lease, content: Any = content) -> None:
                shutil.copytree(half, store, symlinks=True)
                if isinstance(content, bytes):
                    lease.write_bytes(content)
                elif isinstance(content, Path):
                    lease.symlink_to(content)
                elif content == "dir":
                    lease.mkdir()
                else:
                    content(lease)

            argv = (
                ["status", str(store)]
                if command == "status"
                else ["estimate", str(cfg), "--store", str(store), "--in-process", *command.split()[1:]]
            )

            def truth(p: subprocess.CompletedProcess, store: Path = store, command: str = command) -> bool:
                if command == "status":
                    return "lease" in p.stdout or "lock" in p.stdout
                return _same_arrays(store, ref) and not (store / "lease.json").exists()

            cases.append(
                Case(
                    "leases",
                    f"{command}: lease {label}",
                    argv,
                    setup=setup,
                    truth=truth,
                    guarded=[store],
                    timeout=90,
                    cleanup=lambda store=store: shutil.rmtree(store, ignore_errors=True),
                )
            )
    return cases


def data_cases(work: Path) -> list[Case]:
    """Data sources holding what they should not: NaN and inf, the wrong kinds of files, zarr arrays with missing or
    damaged chunks, Parquet files with duplicate or missing columns."""
    import zarr

    root = work / "data"
    root.mkdir()
    rng = np.random.default_rng(8)
    n = 4000
    x = rng.standard_normal((n, D))
    y = np.maximum(x[:, 0], 0)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)

    def src(xp: Any, yp: Any, **more: Any) -> dict:
        return dict(BASE, source={"d": D, "data": {"x": str(xp), "y": str(yp), **more}})

    files: dict[str, tuple[Path, Path]] = {}
    for label, (xa, ya) in {
        "a NaN in x": (np.where(np.arange(n)[:, None] == 17, np.nan, x), y),
        "an inf in y": (x, np.where(np.arange(n) == 3000, np.inf, y)),
        "fewer rows in y": (x, y[:-10]),
        "x of the wrong width": (x[:, :-1], y),
        "x of integers (allowed)": (np.round(x).astype(np.int64), y),
        "x of booleans": (x > 0, y),
        "x complex": (x + 1j, y),
        "y of two columns": (x, np.stack([y, y], 1)),
        "x 1-D": (x[:, 0].copy(), y),
        "x all equal rows": (np.ones_like(x), y),
        "too few rows": (x[:10], y[:10]),
    }.items():
        xp, yp = root / f"{len(files)}-x.npy", root / f"{len(files)}-y.npy"
        np.save(xp, xa)
        np.save(yp, ya)
        files[label] = (xp, yp)
    cases = []
    for i, (label, (xp, yp)) in enumerate(files.items()):
        store = root / f"f-{i}.zarr"
        cfg = _yaml(root / f"f-{i}.yaml", src(xp, yp))
        if "(allowed)" in label:
            cases.append(
                Case(
                    "data",
                    label,
                    ["estimate", str(cfg), "--store", str(store), "--in-process"],
                    truth=lambda _p, store=store: _complete(store, BASE["samples"]),
                )
            )
            continue
        cases.append(Case("data", label, ["estimate", str(cfg), "--store", str(store), "--in-process"], new=[store]))
    # zarr data arrays: a missing chunk, a damaged chunk, NaN fill
    za = zarr.create_array(str(root / "x.zarr"), shape=x.shape, chunks=(500, D), dtype="f8")
    za[:] = x
    broken_chunk = root / "x-broken.zarr"
    missing_chunk = root / "x-missing.zarr"
    for p in (broken_chunk, missing_chunk):
        shutil.copytree(root / "x.zarr", p)
    chunk = sorted((missing_chunk / "c").rglob("*"))
    chunk_files = [c for c in chunk if c.is_file()]
    chunk_files[3].unlink()
    damaged = [c for c in sorted((broken_chunk / "c").rglob("*")) if c.is_file()][2]
    damaged.write_bytes(damaged.read_bytes()[:-7] + b"garbage")
    for label, xp in {
        "a zarr array missing a chunk": missing_chunk,
        "a zarr array with a damaged chunk": broken_chunk,
        "a zarr group, not an array": root,
    }.items():
        store = root / f"z-{label.replace(' ', '_')}.zarr"
        cfg = _yaml(root / f"z-{label.replace(' ', '_')}.yaml", src(xp, root / "y.npy"))
        cases.append(Case("data", label, ["estimate", str(cfg), "--store", str(store), "--in-process"], new=[store]))
    # Parquet (the `data` extra: without pyarrow these cases are not generated, and the JSON says so by its count)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        pa = None
    if pa is not None:
        cols = {f"x{j}": x[:, j] for j in range(D)}
        pq.write_table(pa.table({**cols, "y": y}), root / "ok.parquet")
        dup = pa.Table.from_arrays([pa.array(x[:, 0]), pa.array(x[:, 0]), pa.array(y)], names=["a", "a", "y"])
        pq.write_table(dup, root / "dup.parquet")
        pq.write_table(pa.table({**cols, "y": pa.array([str(v) for v in y])}), root / "stringy.parquet")
        nully = pa.array([None if i == 5 else float(v) for i, v in enumerate(y)], type=pa.float64())
        pq.write_table(pa.table({**cols, "y": nully}), root / "nully.parquet")
        xcols = [f"x{j}" for j in range(D)]
        for label, (path, more) in {
            "Parquet with duplicate columns": (root / "dup.parquet", {"x_columns": ["a", "a"], "y_column": "y"}),
            "Parquet missing a named column": (
                root / "ok.parquet",
                {"x_columns": [*xcols[:-1], "nope"], "y_column": "y"},
            ),
            "Parquet labels as strings": (root / "stringy.parquet", {"x_columns": xcols, "y_column": "y"}),
            "Parquet with a null label": (root / "nully.parquet", {"x_columns": xcols, "y_column": "y"}),
            "Parquet, y column among x": (root / "ok.parquet", {"x_columns": [*xcols[:-1], "y"], "y_column": "y"}),
        }.items():
            store = root / f"p-{label.replace(' ', '_')}.zarr"
            cfg = _yaml(root / f"p-{label.replace(' ', '_')}.yaml", src(path, path, **more))
            cases.append(
                Case("data", label, ["estimate", str(cfg), "--store", str(store), "--in-process"], new=[store])
            )
    # special files
    os.mkfifo(root / "fifo.npy")
    (root / "dir.npy").mkdir()
    (root / "loop.npy").symlink_to(root / "loop.npy")
    for label, xp in {
        "x a FIFO": root / "fifo.npy",
        "x a folder": root / "dir.npy",
        "x /dev/zero": Path("/dev/zero"),
        "x a symlink loop": root / "loop.npy",
        "x a missing file": root / "none.npy",
        "x an unreachable URL": "s3://no-such-bucket-relulearn/x.npy",
    }.items():
        store = root / f"sp-{label.replace(' ', '_').replace('/', '')}.zarr"
        cfg = _yaml(root / f"sp-{label.replace(' ', '_').replace('/', '')}.yaml", src(xp, root / "y.npy"))
        cases.append(
            Case(
                "data",
                label,
                ["estimate", str(cfg), "--store", str(store), "--in-process"],
                new=[store],
                timeout=90,
                env={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
            )
        )
    return cases


CALLABLES = """
import numpy as np, sys, time
W = np.random.default_rng(1).standard_normal((2, {d}))
def good(x):
    return np.maximum(x @ W.T, 0).sum(1)
def in_place(x):
    y = np.maximum(x @ W.T, 0).sum(1)
    x -= x.mean(0)
    x /= 10
    return y
def wrong_rows(x):
    return good(x)[:-1]
def nan_out(x):
    y = good(x)
    y[::7] = np.nan
    return y
def inf_out(x):
    y = good(x)
    y[3] = np.inf
    return y
def raises(x):
    raise ValueError("the model is not loaded")
def exits(x):
    sys.exit(4)
def exits_zero(x):
    sys.exit(0)
def interrupts(x):
    raise KeyboardInterrupt
def a_list(x):
    return good(x).tolist()
def ints(x):
    return np.round(good(x)).astype(int)
def complex_out(x):
    return good(x) + 1j
def strings(x):
    return good(x).astype(str)
def nothing(x):
    return None
def huge(x):
    return np.zeros((len(x), 100_000))
def three_d(x):
    return good(x)[:, None, None]
def global_state(x):
    np.random.seed(123)
    np.random.rand(5)
    return good(x)
def float32(x):
    return good(x).astype(np.float32)
def noisy_stdout(x):
    print("hello from the teacher" * 10)
    return good(x)
def alias(x):
    return x[:, 0]
def recursion(x):
    return recursion(x)
NOT_CALLABLE = 3
"""


def callable_cases(work: Path) -> list[Case]:
    """Black-box teachers that misbehave, in process and on two workers."""
    (work / "fault_teacher.py").write_text(CALLABLES.format(d=D))
    root = work / "callables"
    root.mkdir()

    def cfg_of(spec: str) -> dict:
        return dict(BASE, source={"d": D, "teacher": {"callable": spec}, "noise_std": 0.0})

    ref = root / "ref.zarr"
    _must(
        work,
        "estimate",
        str(_yaml(root / "ref.yaml", cfg_of("fault_teacher:good"))),
        "--store",
        str(ref),
        "--in-process",
        "--quiet",
    )
    # the same values as `good` (bitwise): then the statistics must be the reference's
    same = {"in_place", "global_state", "noisy_stdout"}
    # a teacher of 10^5 outputs is a teacher: its plan counts them (6.6 GB here) and it runs where they fit
    valid_other = {"ints", "float32", "alias", "a_list", "huge"}
    names = [
        "in_place",
        "wrong_rows",
        "nan_out",
        "inf_out",
        "raises",
        "exits",
        "exits_zero",
        "interrupts",
        "a_list",
        "ints",
        "complex_out",
        "strings",
        "nothing",
        "huge",
        "three_d",
        "global_state",
        "float32",
        "noisy_stdout",
        "alias",
        "recursion",
        "NOT_CALLABLE",
        "missing_function",
    ]
    cases = []
    for where in ("--in-process", "--workers=2"):
        for name in names:
            if where != "--in-process" and name in ("huge", "recursion", "NOT_CALLABLE", "missing_function"):
                continue
            store = root / f"{name}{where}.zarr"
            cfg = _yaml(root / f"{name}{where}.yaml", cfg_of(f"fault_teacher:{name}"))
            if name in same:

                def truth(_p: Any, store: Path = store) -> bool:
                    return _same_arrays(store, ref)

            elif name in valid_other:

                def truth(_p: Any, store: Path = store) -> bool:
                    from relulearn import verify

                    return bool(verify(str(store))["intact"])

            else:
                truth = None  # type: ignore[assignment]
            cases.append(
                Case(
                    "callables",
                    f"{name} {where.lstrip('-')}",
                    ["estimate", str(cfg), "--store", str(store), where],
                    truth=truth,
                    new=[] if truth else [store],
                    timeout=180,
                    interrupt=name == "interrupts",
                )
            )
    return cases


def disk_cases(work: Path, ref_model: Path, store: Path) -> list[Case]:
    """A full disk (a 3 MB tmpfs; root only): stores, models, predictions, reports and merges written there fail
    naming the path, and nothing already there is destroyed."""
    if os.geteuid() != 0:
        return []
    mnt = work / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], check=True)
    root = work / "disk"
    root.mkdir()
    cfg = _yaml(
        root / "big.yaml",
        dict(
            BASE,
            samples=400_000,
            chunk_size=20_000,
            source=dict(BASE["source"], d=24),
            statistics={"basic": {}, "hermite": {"max_order": 4}},
        ),
    )
    x = np.random.default_rng(2).standard_normal((300_000, D))
    np.save(root / "x.npy", x)

    def fill(keep: int) -> Callable[[], None]:
        def setup() -> None:
            for p in mnt.iterdir():
                if p.name != "keep":
                    (shutil.rmtree if p.is_dir() else os.remove)(p)
            free = shutil.disk_usage(mnt).free
            (mnt / "filler").write_bytes(b"\0" * max(free - keep, 0))

        return setup

    def prior(path: Path, keep: int) -> Callable[[], None]:
        def setup() -> None:
            fill(10**9)()
            (mnt / "keep").mkdir(exist_ok=True)
            path.write_bytes(b"the old file: must survive")
            fill(keep)()

        return setup

    old_pred, old_report, merged = mnt / "keep" / "pred.npy", mnt / "keep" / "report.html", mnt / "merged.zarr"
    cases = [
        Case(
            "disk",
            "a store on a full disk",
            ["estimate", str(cfg), "--store", str(mnt / "s.zarr"), "--in-process"],
            setup=fill(200_000),
            new=[mnt / "s.zarr"],
        ),
        Case(
            "disk",
            "predict --out over an old file on a full disk",
            ["predict", str(ref_model), "--input", str(root / "x.npy"), "--out", str(old_pred)],
            setup=prior(old_pred, 4096),
            guarded=[old_pred],
        ),
        Case(
            "disk",
            "a report written over an old one on a full disk",
            ["report", str(store), "--out", str(old_report)],
            setup=prior(old_report, 1000),
            guarded=[old_report],
        ),
        Case(
            "disk",
            "a merge into a full disk",
            ["merge", str(store), str(store.parent / "other.zarr"), "--out", str(merged)],
            setup=fill(20_000),
            guarded=[store, store.parent / "other.zarr"],
            new=[merged],
        ),
    ]

    def umount() -> None:
        subprocess.run(["umount", str(mnt)], check=False)

    cases[-1].cleanup = umount
    return cases


def generated(work: Path, parallel: int = 2, groups: list[str] | None = None) -> dict[str, Any]:
    """Build every group's cases in ``work`` and run them; the counts per outcome and every case."""
    from relulearn.network import Network

    work.mkdir(parents=True, exist_ok=True)
    # a half-written store and its uninterrupted twin, for the leases
    halfdir = work / "half"
    halfdir.mkdir()
    cfg = _yaml(halfdir / "run.yaml", dict(BASE, samples=8000))
    _yaml(halfdir / "other.yaml", dict(BASE, seed=4, samples=8000))
    runs = [(cfg, halfdir / "ref.zarr", []), (cfg, halfdir / "half.zarr", ["--samples", "4000"])]
    for cfg_, store, extra in [*runs, (halfdir / "other.yaml", halfdir / "other.zarr", [])]:
        _must(work, "estimate", str(cfg_), "--store", str(store), "--in-process", "--quiet", *extra)
    model = work / "model.npz"
    Network((np.random.default_rng(3).standard_normal((2, D)), np.ones((1, 2))), activation="relu").save(model)
    builders: dict[str, Callable[[], list[Case]]] = {
        "configs": lambda: config_cases(work),
        "headers": lambda: header_cases(work),
        "leases": lambda: lease_cases(work, halfdir / "half.zarr", halfdir / "ref.zarr"),
        "data": lambda: data_cases(work),
        "callables": lambda: callable_cases(work),
        "disk": lambda: disk_cases(work, model, halfdir / "ref.zarr"),
    }
    rows: list[dict[str, Any]] = []
    for name, build in builders.items():
        if groups and name not in groups:
            continue
        cases = build()
        # the full-disk cases share one tmpfs: one at a time
        got = run_all(cases, work, 1 if name == "disk" else parallel)
        rows += got
        counts = {o: sum(r["outcome"] == o for r in got) for o in OUTCOMES}
        print(f"  {name}: {len(got)} cases {json.dumps({k: v for k, v in counts.items() if v})}", flush=True)
    return {
        "cases_total": len(rows),
        "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES},
        "by_group": {
            g: {o: sum(r["outcome"] == o for r in rows if r["group"] == g) for o in OUTCOMES}
            for g in dict.fromkeys(r["group"] for r in rows)
        },
        "cases": rows,
    }


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", nargs="*", help="configs headers leases data callables disk (default all)")
    parser.add_argument("--out", default=None, help="a JSON file for the cases")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = generated(Path(tmp), groups=args.groups)
    print(json.dumps(result["outcomes"]))
    for r in result["cases"]:
        if r["outcome"] not in ("refused", "ok"):
            print(f"{r['outcome']:9s} {r['group']}: {r['case']}: {r['message'][:200]}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
