"""The README is the front door: short, current, and every command in it runs.

Its set-up commands run elsewhere (``relulearn demo`` in the CLI tests, the test command in CI, the docs
build in CI); its example is ``examples/small.yaml``'s own commands, which ``test_examples.py`` runs and
holds to that file's time and result; its Python lines run here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from conftest import PYTHON, cli_env, relulearn

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(lang: str = "") -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def test_the_readme_is_short_and_names_no_issue():
    assert len(README.splitlines()) <= 200
    assert not re.search(r"\bissues? ?#?\d|#\d+\b", README, flags=re.I)


def test_the_set_up_commands_are_the_ones_ci_and_the_docs_run():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(b.strip() for b in blocks() if "pytest" in b)
    assert test_command in ci
    assert any(b.strip() == "pip install -e . && relulearn demo" for b in blocks())


def test_the_example_is_small_yaml():
    example = next(b for b in blocks() if b.startswith("relulearn fit"))
    stated = [
        line[1:].strip()
        for line in (ROOT / "examples" / "small.yaml").read_text().splitlines()
        if line.startswith("#   relulearn")
    ]
    assert example.strip().splitlines() == stated


def test_the_python_example_saved_as_a_script_runs_and_evaluate_prints_what_the_readme_shows(tmp_path):
    """As a user saves and runs it, ``python snippet.py`` (test_scripts runs it from standard input)."""
    code = blocks("python")[0]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "snippet.py").write_text(code)
    out = subprocess.run(
        [PYTHON, "snippet.py"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-12
    printed = relulearn("evaluate", "small.npz", "--teacher", "examples/small.yaml", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr[-3000:]
    shown = next(b for b in blocks() if b.startswith("samples"))
    assert [line.split()[0] for line in shown.splitlines()] == [line.split()[0] for line in printed.stdout.splitlines()]
    for line in shown.splitlines():  # the errors within two orders of magnitude of what the README shows
        key, value = line.split(maxsplit=1)
        if key in ("relative_test_error", "parameter_error"):
            got = float(dict(x.split(maxsplit=1) for x in printed.stdout.splitlines())[key])
            assert got < 100 * float(value), (key, got, value)
