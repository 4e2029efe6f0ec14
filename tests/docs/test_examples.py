"""Every example in ``examples/`` does what its comment says, in the time it says.

Each example's leading comment shows the commands a user runs and a line
``# Expected on 2 cores: <time>; <name> < <bound>, <name> = <value>``. The test runs those commands as a
user would, from a folder holding a copy of ``examples/``: the commands that do the work (``fit``,
``estimate``) in a subprocess each, timed (the time a user waits, the interpreter's start included), the others
(``evaluate``, ``shadow``) with ``relulearn.cli.main`` in this process (``conftest.relulearn``: the same code,
without an interpreter's start); it reads the results from ``relulearn evaluate --json``.
A time must hold within ×1.5. Commands that name an object store or a scheduler address are for a cluster and
are not run here (stores on S3 and external schedulers have their own tests).

These tests time whole runs, so they run in a pytest process of their own, after the rest of the suite
(``-m examples``; the README's test command does both): next to another test process, the two cores they
are timed on would be shared.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, cli_env, relulearn

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMED = {"fit", "estimate"}
# the names the "Expected" line uses -> the keys of `relulearn evaluate --json`
RESULTS = {
    "relative test error": "relative_test_error",
    "parameter error": "parameter_error",
    "subspace angle": "subspace_angle",
    "degree": "model_degree",
}

pytestmark = [pytest.mark.examples, pytest.mark.slow]


def header(path: Path) -> tuple[list[list[str]], float, list[tuple[str, str, float]]]:
    """The example's commands (argument lists), its stated seconds and its stated results
    ``(evaluate key, '<' or '=', value)``."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    commands = [shlex.split(line) for line in lines if line.startswith("relulearn ")]
    expected = [line for line in lines if line.startswith("Expected on 2 cores:")]
    assert len(expected) == 1, f"{path.name}: one 'Expected on 2 cores:' line, found {len(expected)}"
    m = re.fullmatch(r"Expected on 2 cores: (\d+(?:\.\d+)?) (s|min)(?: \([^)]*\))?(?:; (.*))?", expected[0])
    assert m, f"{path.name}: cannot read {expected[0]!r}"
    seconds = float(m.group(1)) * (60 if m.group(2) == "min" else 1)
    results = []
    for clause in filter(None, (m.group(3) or "").split(", ")):
        c = re.fullmatch(r"(.+?) ([<=]) (\S+)", clause)
        assert c and c.group(1) in RESULTS, f"{path.name}: cannot read the result {clause!r}"
        results.append((RESULTS[c.group(1)], c.group(2), float(c.group(3))))
    assert commands, f"{path.name}: no command in its comment"
    return commands, seconds, results


def for_a_cluster(cmd: list[str]) -> bool:
    return any(a.startswith(("s3://", "gs://", "tcp://")) for a in cmd) or "--scheduler" in cmd


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    if cmd[1] not in TIMED:  # untimed: nothing in them needs a process of their own
        out = relulearn(*cmd[1:], cwd=cwd)
    else:
        out = subprocess.run(
            [PYTHON, "-m", "relulearn.cli", *cmd[1:]],
            cwd=cwd,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert out.returncode == 0, f"{shlex.join(cmd)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("*.yaml")))
def test_the_example_delivers_its_comment_in_its_time(tmp_path, name):
    commands, seconds, results = header(EXAMPLES / f"{name}.yaml")
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    spent, measured = 0.0, {}
    for cmd in commands:
        if for_a_cluster(cmd):
            continue
        if cmd[1] == "evaluate":
            cmd = [*cmd, "--json"]
        start = time.perf_counter()
        out = run(cmd, tmp_path)
        if cmd[1] in TIMED:
            spent += time.perf_counter() - start
        if cmd[1] == "evaluate":
            measured.update(json.loads(out.stdout))
    assert spent > 0, f"{name}: none of its commands does work here"
    assert spent <= 1.5 * seconds, f"{name}: {spent:.1f} s, its comment says {seconds:.0f} s"
    for key, op, value in results:
        got = measured.get(key)
        assert got is not None, f"{name}: evaluate reported no {key}"
        assert (got < value) if op == "<" else (got == value), f"{name}: {key} = {got}, its comment says {op} {value}"
