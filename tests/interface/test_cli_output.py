"""What the command line prints for people, and the full report it writes on request."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import yaml

from conftest import PYTHON, TWO_UNITS, cli_env, relulearn

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

    root = Path(__file__).resolve().parents[2]
    pyproject = (root / "pyproject.toml").read_text()  # (tomllib is Python 3.11+)
    assert re.findall(r'^fallback_version = "(.*)"$', pyproject, re.M) == [_version.FALLBACK]
    assert re.findall(r'^version_file = "(.*)"$', pyproject, re.M) == ["relulearn/_scm_version.py"]
    assert "relulearn/_scm_version.py" in (root / ".gitignore").read_text().splitlines()
    pkg = tmp_path / "relulearn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(_version.__file__, pkg)
    # -S: without site-packages, whose editable install of this tree (a finder by name) would find the
    # checkout's own generated file for the copy
    read = [sys.executable, "-S", "-c", "from relulearn._version import __version__; print(__version__)"]
    env = {"PYTHONPATH": str(tmp_path)}  # and the folder run in: `python -c` reads the current folder first
    assert (
        subprocess.run(read, env=env, cwd=tmp_path, capture_output=True, text=True).stdout == f"{_version.FALLBACK}\n"
    )
    (pkg / "_scm_version.py").write_text('version = "0.2.0.dev7+g1234abc"\n')
    assert subprocess.run(read, env=env, cwd=tmp_path, capture_output=True, text=True).stdout == "0.2.0.dev7+g1234abc\n"


def test_a_reader_that_closes_the_pipe_early_gets_no_error(tmp_path):
    """`relulearn status STORE | head -1`: the reader closed its end before the command printed; the command ends
    quietly with exit code 0, as `cat` does (its stdout is closed before it prints: the import takes a second)."""
    store = tmp_path / "s.zarr"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(TWO_UNITS))
    assert relulearn("estimate", tmp_path / "c.yaml", "--store", store, "--in-process", "-q").returncode == 0
    proc = subprocess.Popen(
        [PYTHON, "-m", "relulearn", "status", str(store)],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and err == "", err


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
        "assert api.execution.HeldOut and api.keywords.checked_options and storage.verify.verify_store\n"
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


# ------------------------------------------------------------------ -v / -q and the logging of the library


def test_every_command_takes_verbose_and_quiet_but_not_both():
    from relulearn.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    for name, p in sub.choices.items():
        flags = {s for a in p._actions for s in a.option_strings}
        assert {"-v", "--verbose", "-q", "--quiet"} <= flags, name
    both = cli("status", "x.zarr", "-v", "-q")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr, both.stderr


def test_verbose_logs_what_the_run_does_and_quiet_prints_the_result_only(tmp_path):
    """-v: the commit (store, generation, samples) and the model written (its size in bytes), as log lines; -vv:
    the lease too; -q: nothing on stderr and the same result on stdout; the logger is left as it was found."""
    import logging

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(TWO_UNITS))
    store, model = tmp_path / "s.zarr", tmp_path / "m.npz"
    fit = cli("fit", tmp_path / "c.yaml", "--store", store, "--width", 2, "--in-process", "--out", model, "-vv")
    assert fit.returncode == 0, fit.stderr
    err = fit.stderr.splitlines()
    assert f"relulearn: committed {store}: generation g000000, 20,000 samples" in err, fit.stderr
    assert f"relulearn: wrote {model} ({model.stat().st_size:,} bytes)" in err, fit.stderr
    assert f"relulearn.storage.lease: took the lease of {store}" in err, fit.stderr
    default = cli("learn", store, "--width", 2, "--in-process", "--out", model, "--json")
    verbose = cli("learn", store, "--width", 2, "--in-process", "--out", model, "--json", "-v")
    quiet = cli("learn", store, "--width", 2, "--in-process", "--out", model, "--json", "-q")
    assert default.stderr and "relulearn: wrote" not in default.stderr  # progress only
    assert f"relulearn: wrote {model}" in verbose.stderr and "relulearn.storage" not in verbose.stderr
    assert quiet.returncode == 0 and quiet.stderr == ""
    drop = ("seconds", "report")  # timings
    results = [{k: v for k, v in json.loads(p.stdout).items() if k not in drop} for p in (default, verbose, quiet)]
    assert results[0] == results[1] == results[2]
    log = logging.getLogger("relulearn")
    assert log.handlers == [] and log.level == logging.NOTSET and log.propagate


def test_the_library_configures_no_logging_handlers():
    """Only the command line (relulearn/cli/logs.py) attaches a handler to the library's loggers."""
    from pathlib import Path

    import relulearn

    root = Path(relulearn.__file__).parent
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "logs.py" and any(s in p.read_text() for s in ("addHandler", "basicConfig", "dictConfig"))
    ]
    assert offenders == []


def test_a_finished_store_is_learned_from_at_once_and_verify_of_it_is_a_summary(tmp_path):
    """fit on a store that holds the samples says so (no plan of a pass, no progress line at 0 samples/s) and
    learns the same network; estimate says there is nothing to do; verify of an intact store is two lines,
    its table with -v (a row per array --json lists)."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(TWO_UNITS))
    store, model = tmp_path / "s.zarr", tmp_path / "m.npz"
    first = cli("fit", tmp_path / "c.yaml", "--store", store, "--width", 2, "--in-process", "--out", model)
    assert first.returncode == 0 and first.stderr.startswith("plan: 1 pass of 20,000 samples"), first.stderr
    from relulearn.network import Network

    before = Network.load(model)
    again = cli("fit", tmp_path / "c.yaml", "--store", store, "--width", 2, "--in-process", "--out", model)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines()[0] == f"{store} already holds 20,000 samples: learning from them"
    assert "plan:" not in again.stderr and "samples/s" not in again.stderr, again.stderr
    assert again.stdout.splitlines()[1] == "  samples        20,000 (all in the store already)", again.stdout
    assert again.stdout.splitlines()[2:-2] == first.stdout.splitlines()[2:-2]  # all but the samples and the time
    after = Network.load(model)
    assert all(np.array_equal(a, b) for a, b in zip(before.weights, after.weights))
    estimate = cli("estimate", tmp_path / "c.yaml", "--store", store, "--in-process")
    assert estimate.stderr == f"{store} already holds 20,000 samples: nothing to estimate\n", estimate.stderr
    verify, verbose, as_json = (cli("verify", store, *flags) for flags in ((), ("-v",), ("--json",)))
    arrays = json.loads(as_json.stdout)["arrays"]
    lines = verify.stdout.splitlines()
    assert verify.returncode == 0 and len(lines) == 2 and lines[1].startswith(f"intact: {len(arrays)} chunks of "), (
        lines
    )
    rows = {line.split()[0] for line in verbose.stdout.splitlines()[2:] if line.endswith("  ok")}
    assert {a["array"] for a in arrays} <= rows and verbose.stdout.splitlines()[-1].startswith("intact: ")


def test_plan_shows_each_pass_s_families_whole(tmp_path):
    """The families column is as wide as its longest entry (it was cut at 39 characters)."""
    import pathlib

    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "small.yaml"
    table, as_json = cli("plan", example), cli("plan", example, "--json")
    assert table.returncode == 0, table.stderr
    for p in json.loads(as_json.stdout)["passes"]:
        forms = ", ".join(f["form"] for f in p["families"])
        (row,) = [line for line in table.stdout.splitlines() if line.startswith(p["name"] + " ")]
        assert f"  {forms}  " in row, (forms, row)
    assert len(forms) > 39


def test_estimate_names_the_dashboard_while_the_cluster_runs_not_after(tmp_path):
    """The dashboard's address once on stderr when the local cluster starts, not in the result table printed
    after it stopped (--json keeps it, as a record); -q: nothing on stderr."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(TWO_UNITS))
    store = tmp_path / "s.zarr"
    done = cli("estimate", tmp_path / "c.yaml", "--store", store, "--workers", 1, "--samples", 10_000)
    assert done.returncode == 0, done.stderr
    shown = [line for line in done.stderr.splitlines() if "dashboard" in line]
    assert len(shown) == 1 and shown[0].startswith("dashboard: http://127.0.0.1:"), done.stderr
    assert "dashboard" not in done.stdout and "samples" in done.stdout, done.stdout
    quiet = cli("estimate", tmp_path / "c.yaml", "--store", store, "--workers", 1, "-q", "--json")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert json.loads(quiet.stdout)["dashboard"].startswith("http://127.0.0.1:")
