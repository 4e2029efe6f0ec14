"""The getting-started page runs as written: its shell blocks, in order, in one shell, in a fresh virtual environment
made by the page's own first lines from a copy of this source tree (``pip install '.[report]'``: the page installs
the extras it uses), with its Python block run by that environment's interpreter as the script the page says it
is. Nothing of the test environment leaks in (no PYTHONPATH, no editable install): it is what a new user with a
checkout or a wheel does. pip may use its cache and PyPI.

72 s on two cores with pip's cache warm, 16 min on two cores loaded by other jobs (load average about 20): it
runs with the examples, alone (``-m examples``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"

pytestmark = [pytest.mark.examples, pytest.mark.slow]


def page_script(text: str) -> str:
    """The page's ``bash`` blocks as they stand, and its ``python`` block as the script ``run.py`` it says it is,
    run with ``python run.py`` where it stands."""
    parts = ["set -euo pipefail"]
    for lang, body in re.findall(r"^```(bash|python)\n(.*?)^```", text, flags=re.S | re.M):
        parts.append(body if lang == "bash" else f"cat > run.py <<'PYTHON'\n{body}PYTHON\npython run.py\n")
    return "\n".join(parts)


def test_the_page_names_the_extras_it_uses_and_runs_report():
    text = PAGE.read_text()
    script = page_script(text)
    assert "pip install '.[report]'" in script and "relulearn report " in script
    assert "relulearn example small > small.yaml" in script  # a wheel's user has no examples/ folder
    assert "standard error" not in text  # `status` prints none


def test_the_getting_started_page_runs_literally_in_a_fresh_environment(tmp_path):
    checkout = tmp_path / "relulearn"
    shutil.copytree(
        ROOT,
        checkout,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "*.zarr", "_build", "build", "dist", "*.egg-info", "__pycache__"
        ),
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    start = time.perf_counter()
    out = subprocess.run(
        ["bash", "-c", page_script(PAGE.read_text())],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    seconds = time.perf_counter() - start
    assert out.returncode == 0, f"the page failed after {seconds:.0f} s:\n{out.stdout[-3000:]}\n{out.stderr[-4000:]}"
    venv_python = checkout / ".venv" / "bin" / "python"
    where = subprocess.run(  # from outside the checkout, whose source folder would come first on sys.path
        [str(venv_python), "-c", "import relulearn; print(relulearn.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert ".venv" in where.stdout, where.stdout  # the page's environment ran it, not the test's
    assert (checkout / "small.yaml").read_bytes() == (ROOT / "relulearn" / "examples" / "small.yaml").read_bytes()
    evaluated = dict(
        line.split(maxsplit=1) for line in out.stdout.splitlines() if line.startswith(("relative_test_error", "param"))
    )
    assert float(evaluated["relative_test_error"]) < 1e-25 and float(evaluated["parameter_error"]) < 1e-12
    assert "<img" in (checkout / "report.html").read_text()
    # the learning curve of the noiseless example: exact from its first count on, drawn
    assert "exact recovery from 100,000 samples" in out.stdout
    assert (checkout / "curve.png").read_bytes().startswith(b"\x89PNG")
    alone = [line for line in out.stdout.splitlines() if re.fullmatch(r"[0-9.e+-]+", line.strip())]
    assert alone and float(alone[-1]) < 1e-12  # the Python block's parameter error
    print(f"the getting-started page ran in {seconds:.0f} s")
