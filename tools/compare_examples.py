#!/usr/bin/env python
"""Show that two commits behave the same: run every example of ``examples/`` on both and compare the bits.

Each revision is checked out into a temporary ``git worktree``. Every example runs there as
``tests/docs/test_examples.py`` runs it: the ``relulearn`` commands of its leading comment, from a folder holding a
copy of that revision's ``examples/`` (the commands that name an object store or a scheduler skipped, ``evaluate``
given ``--json``), here in one process per example and revision (``relulearn.cli.main``) with ``PYTHONPATH`` at
the worktree and one BLAS thread (``OMP_NUM_THREADS`` and its kin set to 1, so a multi-threaded BLAS's order of
sums cannot differ between the sides). The seeds are the examples' own.

The two sides are then compared:

- **store**: every relulearn store the commands wrote (nested ones included): the data of every array of its
  head generation, bit for bit (dtype, shape and bytes, read with zarr), every array's and group's metadata
  document, the root's ``relulearn`` document and the run records (``records/*.json``);
- **model**: every other file the commands wrote: a ``.npz`` member by member (names, dtype, shape, bytes: the
  archive's own bytes hold the time it was written), any other file byte for byte;
- **output**: what each command printed on stdout (stderr holds progress lines only).

What legitimately differs between two runs of one commit is ignored, and only that (:data:`IGNORED`):

- the store's ``created`` and ``updated`` timestamps, a record's ``recorded`` and its time in its file name, and
  the root document's own digest (``integrity.digest``: it covers those timestamps);
- ``seconds`` in a record and, in what a command prints, every duration, rate and ETA (wall time): a number
  followed by ``s``, ``ms``, ``min``, ``h`` or ``samples/s``, an ``ETA``, the value of a field named
  ``*seconds*`` or ``*per_second*``;
- the store's ``head`` (its generation's name), ``commits`` (their count) and the ledger's ``commit`` array
  (which commit took each chunk) with its checksum: a run commits every ``commit_interval`` seconds of wall
  time, so how many commits a run makes depends on the machine's speed; the head generation's contents are
  compared whatever its name;
- the store's ``platforms`` (numpy's and the BLAS libraries' versions): software versions;
- the two folders' own paths, wherever a document or a line names them (written as ``<work>`` and ``<tree>``).

Run from the repository::

    python tools/compare_examples.py                       # HEAD~1 against HEAD
    python tools/compare_examples.py --base 54016a1 --head c839e75 --jobs 2 --json report.json

It prints one line per example and exits 1 if anything differs (naming what), 0 if nothing does.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = ".compare_outputs.json"  # what the runner writes next to the example's files
#: what is ignored, and why (printed by --help and put in the --json report)
IGNORED = {
    "store created, updated; record recorded": "timestamps",
    "store integrity digest": "the digest of the root document, which holds its timestamps (the chunks' and the "
    "documents' digests are compared)",
    "store head, commits; ledger array commit and its checksum": "commits follow commit_interval seconds of "
    "wall time: their number depends on the machine's speed (the head generation is compared whatever its name)",
    "store platforms": "software versions (numpy, BLAS)",
    "record seconds; the time in a record's file name": "wall time",
    "durations, rates and ETAs in what a command prints (a number followed by s, ms, min, h or samples/s; "
    "the value of a field named *seconds* or *per_second*)": "wall time",
    "the worktree's and the run folder's paths": "paths (written <tree> and <work>)",
}
_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
_RECORD_TIME = re.compile(r"-\d{8}T\d{6}(\.\d+)?Z")
# a number followed by a unit of time or a rate, and an ETA, as the command line prints them
_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?"
_WALL_TIME = re.compile(rf"{_NUMBER} ?(?:s|ms|min|h|samples/s)\b|ETA(?: at most)? \d\d:\d\d:\d\d")
# a field of a table or a JSON document that holds one (`seconds  18.4`, `"samples_per_second": 5.4e4`)
_WALL_TIME_FIELD = re.compile(rf"(\b\w*(?:seconds|per_second)\b\"?:?\s+)-?{_NUMBER}")


# ----------------------------------------------------------------- the examples' commands
def commands(example: Path) -> list[list[str]]:
    """The commands of an example's leading comment that ``tests/docs/test_examples.py`` runs, as argument lists:
    not those for a cluster (an object store, a scheduler), ``evaluate`` with ``--json``."""
    lines = []
    for line in example.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    out = []
    for cmd in (shlex.split(line) for line in lines if line.startswith("relulearn ")):
        if any(a.startswith(("s3://", "gs://", "tcp://")) for a in cmd) or "--scheduler" in cmd:
            continue
        out.append([*cmd, "--json"] if cmd[1] == "evaluate" else cmd)
    return out


def run_commands(cmds: list[list[str]]) -> list[dict[str, Any]]:
    """Run each command with ``relulearn.cli.main`` in this process (the runner's side): its exit code and stdout."""
    from relulearn.cli import main

    done = []
    for cmd in cmds:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                code = main(cmd[1:])
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        done.append({"command": shlex.join(cmd), "code": code, "stdout": out.getvalue()})
        if code != 0:
            break
    return done


# ----------------------------------------------------------------- one side
def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def run_example(tree: Path, name: str, work: Path) -> float:
    """Run example ``name`` of the worktree ``tree`` in the empty folder ``work``; the seconds it took."""
    shutil.copytree(tree / "examples", work / "examples")
    env = dict(os.environ, PYTHONPATH=str(tree), **dict.fromkeys(_THREADS, "1"))
    cmds = commands(work / "examples" / f"{name}.yaml")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--run", json.dumps(cmds)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if not (work / OUTPUTS).exists():  # a command that fails is a difference; a runner that fails is an error
        raise RuntimeError(f"{name} at {tree}: the runner failed\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


# ----------------------------------------------------------------- reading what a side wrote
def _masked(value: Any, work: Path, tree: Path) -> Any:
    """A JSON value with the run folder's and the worktree's paths written as placeholders."""
    if isinstance(value, str):
        return value.replace(str(work), "<work>").replace(str(tree), "<tree>")
    if isinstance(value, list):
        return [_masked(v, work, tree) for v in value]
    if isinstance(value, dict):
        return {k: _masked(v, work, tree) for k, v in value.items()}
    return value


def _without(doc: Any, key: str) -> Any:
    """A JSON value without ``key`` at any depth."""
    if isinstance(doc, list):
        return [_without(v, key) for v in doc]
    if isinstance(doc, dict):
        return {k: _without(v, key) for k, v in doc.items() if k != key}
    return doc


def _stores(work: Path) -> list[Path]:
    """Every relulearn store under ``work``: a folder whose root document has a ``relulearn`` head."""
    found = []
    for doc in sorted(work.rglob("zarr.json")):
        attrs = json.loads(doc.read_text()).get("attributes", {})
        if isinstance(attrs.get("relulearn"), dict) and "head" in attrs["relulearn"]:
            found.append(doc.parent)
    return found


def _array_bits(path: Path) -> tuple[str, tuple[int, ...], bytes]:
    import numpy as np
    import zarr

    values = np.asarray(zarr.open_array(str(path), mode="r")[...])
    return str(values.dtype), values.shape, values.tobytes()


def store_facts(store: Path, work: Path, tree: Path) -> dict[str, Any]:
    """What a store holds, with what is ignored taken out: the root's document, every node of the head
    generation (its metadata document, and an array's bits), the records."""
    root = json.loads((store / "zarr.json").read_text())
    meta = dict(root["attributes"]["relulearn"])
    head = store / meta["head"]
    for key in ("created", "updated", "head", "commits", "platforms"):
        meta.pop(key, None)
    if "integrity" in meta:
        chunks = {k: v for k, v in meta["integrity"].get("chunks", {}).items() if k != "ledger/commit"}
        meta["integrity"] = {k: v for k, v in meta["integrity"].items() if k != "digest"} | {"chunks": chunks}
    other = {k: v for k, v in root.items() if k != "attributes"}
    other["attributes"] = {k: v for k, v in root["attributes"].items() if k != "relulearn"}
    facts: dict[str, Any] = {"root": _masked(meta, work, tree), "root document": other}
    for doc in sorted(head.rglob("zarr.json")):
        node = doc.parent.relative_to(head).as_posix()
        if node == "ledger/commit":
            continue
        meta_doc = json.loads(doc.read_text())
        facts[f"node {node}"] = _masked(meta_doc, work, tree)
        if meta_doc.get("node_type") == "array":
            facts[f"data {node}"] = _array_bits(doc.parent)
    for rec in sorted((store / "records").glob("*.json")) if (store / "records").is_dir() else []:
        body = _without(json.loads(rec.read_text()), "seconds")
        body.pop("recorded", None)
        facts[f"record {_RECORD_TIME.sub('', rec.name)}"] = _masked(body, work, tree)
    return facts


def file_facts(path: Path) -> Any:
    """A model or output file: a ``.npz`` member by member, any other file its bytes."""
    if path.suffix == ".npz":
        import numpy as np

        with np.load(path, allow_pickle=False) as z:
            return {k: (str(z[k].dtype), z[k].shape, z[k].tobytes()) for k in z.files}
    return path.read_bytes()


def side_facts(work: Path, tree: Path) -> dict[str, dict[str, Any]]:
    """Everything a side's commands wrote and printed, by kind (store, model, output)."""
    stores = _stores(work)
    store = {f"{s.relative_to(work).as_posix()}: {k}": v for s in stores for k, v in store_facts(s, work, tree).items()}
    model = {}
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        rel = path.relative_to(work)
        if rel.parts[0] == "examples" or rel.name == OUTPUTS or any(path.is_relative_to(s) for s in stores):
            continue
        model[rel.as_posix()] = file_facts(path)
    output = {}
    for i, done in enumerate(json.loads((work / OUTPUTS).read_text())):
        printed = _WALL_TIME.sub("<time>", _WALL_TIME_FIELD.sub(r"\1<time>", _masked(done["stdout"], work, tree)))
        output[f"{i}: {done['command']}"] = (done["code"], printed)
    return {"store": store, "model": model, "output": output}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys whose facts differ or that one side lacks."""
    return [
        k if k in a and k in b else f"{k} ({'only in base' if k in a else 'only in head'})"
        for k in sorted(a.keys() | b.keys())
        if a.get(k, None) != b.get(k, None) or (k in a) != (k in b)
    ]


# ----------------------------------------------------------------- the comparison
@contextlib.contextmanager
def worktree(rev: str, folder: Path) -> Iterator[Path]:
    """``rev`` checked out (detached) into ``folder``, removed afterwards."""
    git("worktree", "add", "--detach", "--quiet", str(folder), rev)
    try:
        yield folder
    finally:
        git("worktree", "remove", "--force", str(folder))


def compare(base: str, head: str, names: list[str] | None, jobs: int, keep: Path | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="relulearn-compare-")) if keep is None else keep
    revs = {"base": git("rev-parse", base), "head": git("rev-parse", head)}
    report: dict[str, Any] = {"base": revs["base"], "head": revs["head"], "ignored": IGNORED, "examples": {}}
    try:
        with worktree(revs["base"], tmp / "tree-base") as tb, worktree(revs["head"], tmp / "tree-head") as th:
            trees = {"base": tb, "head": th}
            available = {s: sorted(p.stem for p in (t / "examples").glob("*.yaml")) for s, t in trees.items()}
            wanted = names or sorted(set(available["base"]) | set(available["head"]))
            runs = [(name, side) for name in wanted for side in trees if name in available[side]]

            def one(run: tuple[str, str]) -> float:
                name, side = run
                work = tmp / side / name
                work.mkdir(parents=True)
                return run_example(trees[side], name, work)

            with ThreadPoolExecutor(max(1, jobs)) as pool:
                seconds = dict(zip(runs, pool.map(one, runs), strict=True))
            for name in wanted:
                row: dict[str, Any] = {"seconds": {s: round(seconds.get((name, s), 0.0), 1) for s in trees}}
                if not all(name in available[s] for s in trees):
                    row.update(
                        store=False, model=False, output=False, missing=[s for s in trees if name not in available[s]]
                    )
                    report["examples"][name] = row
                    continue
                facts = {s: side_facts(tmp / s / name, trees[s]) for s in trees}
                for kind in ("store", "model", "output"):
                    diff = differences(facts["base"][kind], facts["head"][kind])
                    row[kind] = not diff
                    if diff:
                        row[f"{kind} differences"] = diff
                report["examples"][name] = row
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    report["equal"] = all(r["store"] and r["model"] and r["output"] for r in report["examples"].values())
    return report


def table(report: dict[str, Any]) -> str:
    lines = [f"base {report['base'][:10]}  head {report['head'][:10]}", ""]
    lines.append(f"{'example':<12} {'store equal':<12} {'model equal':<12} {'output equal':<13} seconds (base, head)")
    for name, row in report["examples"].items():
        yes = {True: "yes", False: "NO"}
        secs = f"{row['seconds']['base']:.0f}, {row['seconds']['head']:.0f}"
        lines.append(f"{name:<12} {yes[row['store']]:<12} {yes[row['model']]:<12} {yes[row['output']]:<13} {secs}")
        for kind in ("store", "model", "output"):
            for what in row.get(f"{kind} differences", [])[:20]:
                lines.append(f"    {kind} differs: {what}")
        if "missing" in row:
            lines.append(f"    missing on: {', '.join(row['missing'])}")
    lines.append("")
    lines.append("equal" if report["equal"] else "DIFFERENT")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ignored = "\n".join(f"  - {what}: {why}" for what, why in IGNORED.items())
    parser = argparse.ArgumentParser(
        prog="tools/compare_examples.py",
        description="Run every example of examples/ at two git revisions and compare their stores, models and "
        "outputs bit for bit; exit 1 on any difference.",
        epilog=f"Ignored, as what legitimately differs between two runs of one commit:\n{ignored}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", default="HEAD~1", help="the revision compared against (default: HEAD~1)")
    parser.add_argument("--head", default="HEAD", help="the revision compared (default: HEAD)")
    parser.add_argument("--example", action="append", metavar="NAME", help="only this example (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="examples run at once (default 1; the runs are timed)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    parser.add_argument("--keep", metavar="DIR", type=Path, help="work in DIR (new) and keep it: worktrees removed")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # the runner inside one side's folder
    args = parser.parse_args(argv)
    if args.run is not None:
        done = run_commands(json.loads(args.run))
        Path(OUTPUTS).write_text(json.dumps(done))
        return 0 if all(d["code"] == 0 for d in done) else 1
    if args.keep is not None:
        args.keep.mkdir(parents=True)
    start = time.perf_counter()
    report = compare(args.base, args.head, args.example, args.jobs, args.keep)
    report["seconds"] = round(time.perf_counter() - start, 1)
    text = json.dumps(report, indent=1, default=repr)
    if args.json == "-":
        print(text)
    else:
        print(table(report))
        print(f"({report['seconds']:.0f} s)")
        if args.json:
            Path(args.json).write_text(text + "\n")
    return 0 if report["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
