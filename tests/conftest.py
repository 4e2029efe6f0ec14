"""Shared fixtures: a real multi-process LocalCluster, small configurations."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from relulearn.config import RunConfig, config_from_dict


def _temporary_folders_in_memory() -> None:
    """Put the suite's temporary folders (pytest's ``tmp_path``, and those of its subprocesses and Dask workers)
    on a memory file system where the machine has one and ``TMPDIR`` is not set. The suite writes and deletes
    tens of thousands of files (stores committed after every block); on the CI machines' disk (ext4 mounted
    with ``discard``) a file costs 5 times what it costs in memory, and a commit 2 to 3 times. The stores are
    real zarr stores either way; ``benchmarks/commit.py`` measures commits on a disk."""
    import shutil
    import tempfile

    shm = Path("/dev/shm")
    if "TMPDIR" in os.environ or not (shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)):
        return
    if shutil.disk_usage(shm).free < 4 << 30:  # a container's small /dev/shm (64 MB by default): the disk then
        return
    folder = shm / f"relulearn-tests-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = str(folder)  # inherited by xdist's workers and every subprocess
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


_temporary_folders_in_memory()

#: what a Dask worker process of the tests' LocalClusters imports before its first task (the forkserver's preload)
WORKER_PRELOAD = (
    "distributed",
    "numpy",
    "scipy.optimize",
    "scipy.spatial",
    "zarr",
    "relulearn.api",
    "relulearn.pipeline.blocks",
    "relulearn.pipeline.worker",
    "relulearn.estimators.filtered_pca.deepfit",
    "relulearn.estimators.filtered_pca.deepstream",
    "relulearn.estimators.enumeration.relu_units",
)


def _local_workers_forked_from_a_preloaded_server() -> None:
    """Start the worker processes of the LocalClusters this process creates from a forkserver that has imported
    :data:`WORKER_PRELOAD` once, as ``distributed``'s own test suite does, instead of a fresh interpreter each.

    The suite starts about 55 such workers; each spent ~1.5 s of CPU importing numpy, scipy, zarr, distributed
    and relulearn before its first task. A forked worker is still a process of its own that receives its tasks
    pickled, gets the path and ``__main__`` of its parent at the moment it starts (as a spawned one does) and the
    ``pre-spawn-environ`` Dask sets, since the server starts when the first worker does. What users run by default,
    spawned workers, is still what every command line started in a process of its own runs (``--workers``)."""
    import dask
    from distributed.utils import get_mp_context

    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    get_mp_context().set_forkserver_preload(list(WORKER_PRELOAD))  # after Dask's own preload, which it sets once


_local_workers_forked_from_a_preloaded_server()


@pytest.fixture(scope="session")
def client():
    """A real ``distributed`` LocalCluster with two single-threaded worker processes."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def make_config(**overrides) -> RunConfig:
    """A small, fast configuration; keyword overrides replace top-level sections."""
    data = {
        "seed": 3,
        "samples": 40_000,
        "chunk_size": 5_000,
        "source": {"d": 6, "teacher": {"kind": "one_hidden_relu", "width": 2, "output_weights": [1.0, -0.6]}},
        "statistics": {
            "basic": {},
            "hermite": {"max_order": 4},
            "contracted": {"orders": [2, 4], "directions": 3},
            "filtered": {"quantiles": [0.3, 0.7]},
        },
        "run": {"chunks_per_block": 2, "commit_interval": 0},
    }
    data.update(overrides)
    return config_from_dict(data)


#: a planted run of two units in d = 6 that moments learns exactly in a second (20,000 samples): for the tests of
#: what commands print and where they write, not of the methods
TWO_UNITS = {
    "seed": 3,
    "samples": 20_000,
    "chunk_size": 10_000,
    "source": {"d": 6, "teacher": {"kind": "one_hidden_relu", "width": 2, "seed": 3}, "noise_std": 0.0},
    "statistics": {"contracted": {"orders": [2, 4], "directions": 6}},
    "run": {"commit_interval": 1e9},
}


@pytest.fixture
def small_config() -> RunConfig:
    return make_config()


def cli_env() -> dict[str, str]:
    """Environment for running ``python -m relulearn.cli`` in a subprocess from the source tree."""
    env = dict(os.environ)
    root = str(ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


PYTHON = sys.executable

#: the repository, and the files the tests read
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def relulearn(*args: object, cwd: Path | str | None = None) -> subprocess.CompletedProcess[str]:
    """``relulearn ARGS`` run by :func:`relulearn.cli.main` in this process: its exit code and what it printed.

    The command's own code runs from argument parsing to the exit code, with argparse's exits (``--help``, a
    usage error) caught as the interpreter would; what a fresh interpreter adds is its start, about a second of
    imports per command, which over the suite's command lines was a sixth of its CPU. Tests of what only a
    process of its own shows (a signal, a SIGKILL, settings read when a module is imported, a cluster's
    workers) still start one with ``subprocess``. A bug that raises escapes here as the exception itself."""
    from relulearn.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        # the interpreter's own filters (pytest's would keep warnings from stderr, where a process prints them)
        warnings.simplefilter("default")
        for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", quiet)
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
    return subprocess.CompletedProcess(["relulearn", *argv], code, out.getvalue(), shown + err.getvalue())


_SLOW = frozenset(
    line.strip()
    for line in (Path(__file__).parent / "slow.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)


def pytest_configure(config):
    """Byte-compile the package once, before the suite's ~300 Python processes (command lines, Dask workers)
    import it: where ``PYTHONDONTWRITEBYTECODE`` is set (as on this project's CI machines) no process writes
    the compiled modules, and each would compile the package from source again (~0.1 s of CPU per process)."""
    if not hasattr(config, "workerinput"):  # once, in the controller (xdist workers start after it)
        import compileall

        import relulearn

        compileall.compile_dir(str(Path(relulearn.__file__).parent), quiet=1)


#: the optional features (pyproject.toml's extras) and the modules each needs in the tests; `test-optional` installs
#: them all with the tools their tests use (s3: a loopback moto server; onnx: skl2onnx exports scikit-learn's MLPs)
EXTRAS = {
    "s3": ("s3fs", "moto", "boto3", "flask"),
    "onnx": ("onnxruntime", "onnx", "skl2onnx"),
    "data": ("pyarrow",),
    "sklearn": ("sklearn",),
    "report": ("matplotlib",),
    "wide": ("fpylll",),
}


def _missing(extra: str) -> list[str]:
    from importlib.util import find_spec

    return [m for m in EXTRAS[extra] if find_spec(m) is None]


def _reason(lacking: dict[str, list[str]]) -> str:
    """Why a test skips: every optional feature it needs that is not installed, with the modules missing."""
    named = [f"{extra!r} ({', '.join(missing)} missing)" for extra, missing in lacking.items()]
    which = f"feature {named[0]} is" if len(named) == 1 else f"features {', '.join(named[:-1])} and {named[-1]} are"
    return f"the optional {which} not installed: pip install -e '.[test-optional]'"


def require(extra: str) -> None:
    """Skip the calling test module unless the optional ``extra`` is installed (for a module that imports it at its
    top; a test that needs it is marked ``@pytest.mark.extra(extra)`` instead)."""
    missing = _missing(extra)
    if missing:
        pytest.skip(_reason({extra: missing}), allow_module_level=True)


def pytest_collection_modifyitems(config, items):
    """Mark the tests listed in ``slow.txt`` (measured at a second or more) ``slow``; skip the tests of an optional
    feature (``@pytest.mark.extra("onnx", ...)``) whose modules are not installed, naming the extra."""
    missing = {extra: _missing(extra) for extra in EXTRAS}
    for item in items:
        if f"{item.path.name}::{getattr(item, 'originalname', item.name)}" in _SLOW:
            item.add_marker(pytest.mark.slow)
        lacking = {}
        for mark in item.iter_markers("extra"):
            for extra in mark.args:
                if extra not in EXTRAS:
                    raise pytest.UsageError(f"{item.nodeid}: unknown extra {extra!r}; the extras are {sorted(EXTRAS)}")
                if missing[extra]:
                    lacking[extra] = missing[extra]
        if lacking:  # one reason that names them all
            item.add_marker(pytest.mark.skip(reason=_reason(lacking)))
