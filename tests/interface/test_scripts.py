"""A user's own script: the Python API from a saved file, from standard input and from a guarded main; an
unguarded script that would start worker processes refused in one line; small work run in process by the plan.

The scripts run as users run them, ``python FILE`` and ``python - < FILE`` in processes of their own (what a
worker process re-imports depends on how the interpreter was started); the clusters are real LocalClusters.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

import relulearn
from relulearn.pipeline.calibration import calibrate
from relulearn.runplan import local_cluster_seconds, plan_run, where_to_run

from conftest import PYTHON, cli_env, make_config

ROOT = Path(__file__).resolve().parents[2]

#: a small run in d = 20 (BLAS-sized), fast on one core
TINY = textwrap.dedent(
    """\
    seed: 5
    samples: 60000
    chunk_size: 20000
    source:
      d: 20
      teacher: {kind: one_hidden_relu, width: 2, output_weights: [1.0, -0.8]}
    statistics:
      basic: {}
      contracted: {orders: [2, 4], directions: 4}
    run: {commit_interval: 0}
    """
)


def _run(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, *args], cwd=cwd, env=cli_env(), input=stdin, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY)
    return tmp_path


def test_an_unguarded_script_that_needs_workers_stops_in_one_line_before_anything_is_written(tiny):
    script = tiny / "unguarded.py"
    script.write_text(
        "import relulearn\n\nconfig = relulearn.load_config('tiny.yaml')\n"
        "relulearn.estimate(config, 'run.zarr', workers=2)\nprint('not reached')\n"
    )
    out = _run([str(script)], tiny)
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert "unguarded.py, line 4" in lines[0] and 'if __name__ == "__main__":' in lines[0]
    assert out.stdout == ""
    assert not (tiny / "run.zarr").exists()  # no lease, no store: refused before anything


def test_a_guarded_script_and_one_from_standard_input_run_on_a_local_cluster(tiny):
    guarded = (
        "import relulearn\n\n\ndef main(store):\n"
        "    relulearn.estimate(relulearn.load_config('tiny.yaml'), store, workers=2, progress=None)\n"
        "    print(relulearn.open_store(store).samples)\n\n\n"
        "if __name__ == '__main__':\n    main('file.zarr')\n"
    )
    (tiny / "guarded.py").write_text(guarded)
    from_file = _run(["guarded.py"], tiny)
    assert from_file.returncode == 0, from_file.stderr[-3000:]
    # standard input: no file for the workers to re-run (multiprocessing would try to open '<stdin>')
    from_stdin = _run(["-"], tiny, stdin=guarded.replace("file.zarr", "stdin.zarr"))
    assert from_stdin.returncode == 0, from_stdin.stderr[-3000:]
    assert from_file.stdout.split() == from_stdin.stdout.split() == ["60000"]
    a, b = (relulearn_store(tiny / name) for name in ("file.zarr", "stdin.zarr"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def relulearn_store(path: Path) -> dict[str, np.ndarray]:
    run = relulearn.open_store(str(path))
    return {f"{fam}/{k}": np.asarray(v) for fam in run.statistics for k, v in run.arrays(fam).items()}


def test_the_plan_runs_small_work_in_process_and_large_work_on_the_cluster():
    cfg = make_config()
    rates = calibrate()
    small = plan_run(cfg, None, samples=40_000, workers=2, rates=rates, choose_where=True)
    assert small.runs_in == "in process" and small.workers == 1
    assert "in process" in small.summary() and small.runs_in_reason
    large = plan_run(cfg, None, samples=400_000_000, workers=2, rates=rates, choose_where=True)
    assert large.runs_in == "local cluster" and large.workers == 2
    # the rule itself: a cluster only where the time it saves exceeds its start
    start = local_cluster_seconds(2)
    assert where_to_run(10.0, 10.0 - start + 1e-9, 2)
    assert not where_to_run(10.0, 10.0 - start - 1e-6, 2)
    assert where_to_run(1e6, 1.0, 1)  # one worker: nothing to gain


def test_learn_on_a_finished_store_runs_in_process_with_the_bits_of_a_cluster(tmp_path):
    store = tmp_path / "s.zarr"
    cfg = make_config(source={"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 2}}, samples=60_000)
    relulearn.estimate(cfg, str(store), client="local", progress=None)
    alone = relulearn.learn(str(store), "moments", width=2, out=str(tmp_path / "a.npz"), progress=None)
    assert alone["runs_in"] == "in process" and alone["passes"] == []
    on_workers = relulearn.learn(str(store), "moments", width=2, out=str(tmp_path / "b.npz"), workers=2, progress=None)
    assert on_workers["runs_in"] == "cluster"
    a, b = (relulearn.Network.load(str(tmp_path / f)) for f in ("a.npz", "b.npz"))
    assert all(np.array_equal(x, y) for x, y in zip(a.weights, b.weights))


def test_the_readme_example_runs_from_standard_input(tmp_path):
    """``python - < FILE`` (``test_readme`` runs it as ``python FILE``): the plan runs it in process."""
    import re

    code = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)[0]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    out = _run(["-"], tmp_path, stdin=code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-12
    assert " in process " in out.stderr.splitlines()[0]  # the plan's choice, printed before the work
