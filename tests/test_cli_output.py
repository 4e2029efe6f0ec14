"""What the command line prints for people, and the full report it writes on request."""

from __future__ import annotations

import json
import subprocess

import yaml

from conftest import PYTHON, cli_env, relulearn

CONFIG = {
    "seed": 1,
    "samples": 400_000,
    "chunk_size": 25_000,
    "source": {"d": 10, "teacher": {"kind": "one_hidden_relu", "width": 3, "seed": 2}},
}


def cli(*args: str) -> subprocess.CompletedProcess:
    return relulearn(*args)


def test_fit_prints_a_short_summary_and_writes_the_full_report(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    store, model, report = str(tmp_path / "s.zarr"), str(tmp_path / "m.npz"), tmp_path / "r.json"
    done = cli(
        "fit",
        str(tmp_path / "c.yaml"),
        "--store",
        store,
        "--method",
        "moments",
        "--out",
        model,
        "--in-process",
        "--quiet",
        "--report",
        str(report),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) < 25, done.stdout
    assert lines[0] == f"moments: a one-hidden-layer network of width 3 written to {model}"
    text = done.stdout
    for needle in (
        "samples",
        "400,000",
        "subspace",
        "rank 3 of d = 10",
        "strengths",
        "held-out loss",
        "(chosen: polish)",
        "polish",
        "time",
        "--report PATH",
    ):
        assert needle in text, (needle, text)
    full = json.loads(report.read_text())
    assert full["method"] == "moments" and full["out"] == model and full["report"]["subspace"]["rank"] == 3
    # the report is the --json output of the same command
    again = cli(
        "learn",
        store,
        "--method",
        "moments",
        "--out",
        str(tmp_path / "m2.npz"),
        "--in-process",
        "--quiet",
        "--json",
        "--report",
        str(tmp_path / "r2.json"),
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == json.loads((tmp_path / "r2.json").read_text())


def test_a_report_path_in_a_missing_folder_is_refused_before_any_work(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    done = cli(
        "fit",
        str(tmp_path / "c.yaml"),
        "--store",
        str(tmp_path / "s.zarr"),
        "--out",
        str(tmp_path / "m.npz"),
        "--in-process",
        "--report",
        str(tmp_path / "nope" / "r.json"),
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"the folder {tmp_path / 'nope'} does not exist" in done.stderr
    assert not (tmp_path / "s.zarr").exists()


def test_an_out_path_in_a_missing_folder_or_naming_a_folder_is_refused_before_any_work(tmp_path):
    """`--out` of fit, learn, predict, report and exact-arbitrary is written when the work is done: a missing folder
    (or a folder given as the file) is refused first, exit code 2, nothing written."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    done = cli(
        "fit",
        str(tmp_path / "c.yaml"),
        "--store",
        str(tmp_path / "s.zarr"),
        "--out",
        str(tmp_path / "nope" / "m.npz"),
        "--in-process",
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"--out {tmp_path / 'nope' / 'm.npz'}: the folder {tmp_path / 'nope'} does not exist" in done.stderr
    assert not (tmp_path / "s.zarr").exists()
    done = cli("learn", str(tmp_path / "s.zarr"), "--method", "tensor", "--out", str(tmp_path))
    assert done.returncode == 2 and f"--out {tmp_path} is a folder; give a file path" in done.stderr, done.stderr
    for command in (
        ["predict", "m.npz", "--input", "x.npy"],
        ["report", str(tmp_path / "s.zarr")],
        ["exact-arbitrary", "x.npy", "a.npy", "--width", "2"],
    ):
        done = cli(*command, "--out", str(tmp_path / "nope" / "f"))
        assert done.returncode == 2 and "does not exist; create it" in done.stderr, (command, done.stderr)


def test_version():
    from relulearn import __version__

    done = cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"relulearn {__version__}"


def test_the_version_is_the_builds_generated_file_else_the_fallback(tmp_path):
    """relulearn._version reads the module setuptools-scm writes at build time (gitignored), and without it (a
    tree never built) the fallback, which is also the build's fallback_version for a tree without git."""
    import re
    import shutil
    import sys
    from pathlib import Path

    from relulearn import _version

    root = Path(__file__).resolve().parents[1]
    pyproject = (root / "pyproject.toml").read_text()  # (tomllib is Python 3.11+)
    assert re.findall(r'^fallback_version = "(.*)"$', pyproject, re.M) == [_version.FALLBACK]
    assert re.findall(r'^version_file = "(.*)"$', pyproject, re.M) == ["relulearn/_scm_version.py"]
    assert "relulearn/_scm_version.py" in (root / ".gitignore").read_text().splitlines()
    pkg = tmp_path / "relulearn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(_version.__file__, pkg)
    read = [sys.executable, "-c", "from relulearn._version import __version__; print(__version__)"]
    env = {"PYTHONPATH": str(tmp_path)}  # and the folder run in: `python -c` reads the current folder first
    assert (
        subprocess.run(read, env=env, cwd=tmp_path, capture_output=True, text=True).stdout == f"{_version.FALLBACK}\n"
    )
    (pkg / "_scm_version.py").write_text('version = "0.2.0.dev7+g1234abc"\n')
    assert subprocess.run(read, env=env, cwd=tmp_path, capture_output=True, text=True).stdout == "0.2.0.dev7+g1234abc\n"


def test_python_dash_m_relulearn_is_the_command_line(tmp_path):
    """``python -m relulearn`` runs the same ``main`` as the ``relulearn`` script: its version, and a user's
    mistake as the one-line error with exit code 2."""
    from relulearn import __version__

    version = subprocess.run([PYTHON, "-m", "relulearn", "--version"], env=cli_env(), capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout == f"relulearn {__version__}\n", version
    missing = tmp_path / "missing.zarr"
    status = subprocess.run(
        [PYTHON, "-m", "relulearn", "status", str(missing)], env=cli_env(), capture_output=True, text=True
    )
    assert status.returncode == 2 and status.stdout == "", status
    assert status.stderr.startswith("relulearn: error: ") and str(missing) in status.stderr, status.stderr
    assert status.stderr == cli("status", str(missing)).stderr


def test_status_and_verify_read_a_store_without_importing_what_runs_passes(tmp_path):
    """`relulearn status` and `verify` need the store (zarr) and the configuration, not the pipeline: neither
    imports Dask, scipy or the statistic families (a third of a command's start)."""
    from relulearn import api
    from relulearn.config import config_from_dict

    store = str(tmp_path / "s.zarr")
    api.estimate(config_from_dict(dict(CONFIG, samples=50_000)), store, client="local", progress=None)
    script = (
        "import sys\nfrom relulearn.cli import main\n"
        f"codes = [main(['status', {store!r}]), main(['verify', {store!r}])]\n"
        "print(codes, ' '.join(sorted(sys.modules)), file=sys.stderr)"
    )
    done = subprocess.run([PYTHON, "-c", script], env=cli_env(), capture_output=True, text=True, timeout=120)
    codes, modules = done.stderr.strip().splitlines()[-1].split("] ")
    assert codes == "[0, 0", done.stderr
    assert "samples" in done.stdout and "zarr" in modules.split()
    imported = [m for m in modules.split() if m.split(".")[0] in ("dask", "distributed", "scipy")]
    imported += [m for m in modules.split() if m.startswith(("relulearn.pipeline.stats", "relulearn.hermite"))]
    assert not imported, imported


def test_the_packages_that_import_on_first_use_still_give_every_name_and_module():
    """`relulearn.api` and `relulearn.storage` import their names on first use: in a fresh interpreter each
    public name resolves, and so does each of their modules as an attribute (`api.execution`)."""
    script = (
        "import relulearn.api as api, relulearn.storage as storage\n"
        "assert all(callable(getattr(api, n)) for n in api.__all__ if n != 'METHODS')\n"
        "assert all(getattr(storage, n) is not None for n in storage.__all__)\n"
        "assert api.execution.HeldOut and api.learning.checked_options and storage.verify.verify_store\n"
        "try:\n    api.nothing\nexcept AttributeError as err:\n    print(err)\n"
    )
    done = subprocess.run([PYTHON, "-c", script], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "module 'relulearn.api' has no attribute 'nothing'"


def test_a_vacuous_angle_bound_is_not_printed_as_an_angle():
    """The two-layer (exact) summary of an exact recovery said "angle bound 1.57 rad": a bound of a radian or more
    says nothing, and the summary says so instead of printing it as an error."""
    from relulearn.summary import summary_lines

    base = {"method": "exact", "out": "m.npz", "report": {"subspace": {"rank": 3, "angle_bound": 1.5707963}}}
    assert any("angle bound vacuous (≥ 1 rad)" in line for line in summary_lines(base))
    assert not any("1.57" in line for line in summary_lines(base))
    base["report"]["subspace"]["angle_bound"] = 0.0625
    assert any("angle bound 0.0625 rad" in line for line in summary_lines(base))


def test_the_demo_mentions_merged_units_only_when_a_teacher_unit_is_missing(capsys):
    from relulearn.cli.output import print_demo

    unit = {"unit": 0, "teacher_lambda": 1.0, "learned_lambda": 1.0, "angle": 1e-15, "relative_error": 1e-15}
    result = {
        "d": 20,
        "width": 2,
        "samples": 10**6,
        "units": [unit, dict(unit, unit=1)],
        "parameter_error": 1e-15,
        "relative_test_error": 1e-30,
        "merged_units": [{"into": 1, "reason": "same direction"}],
        "estimate_seconds": 1.0,
        "learn_seconds": 1.0,
        "seconds": 2.0,
    }
    print_demo(result)
    assert "merged" not in capsys.readouterr().out  # every unit came out: the search's merges did not matter
    result["units"][1] = dict(unit, unit=1, learned_lambda=None, angle=None)
    print_demo(result)
    assert "teacher unit 1 not found" in capsys.readouterr().out


def test_report_without_matplotlib_is_the_documented_error(tmp_path):
    """After the main install (no matplotlib) `relulearn report` says what to install, as `relulearn: error:`
    with exit code 2 (and the same message as JSON with --json), before it reads the store."""
    blocked = tmp_path / "blocked" / "matplotlib"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    env = cli_env()
    env["PYTHONPATH"] = str(tmp_path / "blocked") + ":" + env["PYTHONPATH"]
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [
                PYTHON,
                "-m",
                "relulearn.cli",
                "report",
                str(tmp_path / "s.zarr"),
                "--out",
                str(tmp_path / "r.html"),
                *extra,
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "relulearn: error: relulearn report draws with matplotlib" in done.stderr
        assert "pip install 'relulearn[report]'" in done.stderr
        if extra:
            assert json.loads(done.stdout)["kind"] == "MissingDependencyError"
