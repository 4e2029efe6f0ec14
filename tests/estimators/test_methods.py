"""The method declarations (relulearn.methods) and the code that reads them agree: every method's module,
estimator class, options, figures, command-line flags and documentation rows."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from relulearn import api
from relulearn.cli.parser import build_parser
from relulearn.methods import METHODS, OPTIONS, Method, method_module
from relulearn.report.methods import FIGURES, METHOD_FIGURES

from conftest import relulearn

ROOT = Path(__file__).resolve().parents[2]
#: estimator parameters that are not method options (the data, the run, the cluster)
RUN_PARAMETERS = {"whiten", "seed", "chunk_size", "client", "store"}


@pytest.mark.parametrize("name", list(METHODS))
def test_each_declaration_names_a_module_that_implements_it(name):
    mod = method_module(name)
    learn = inspect.signature(mod.learn).parameters
    for option in METHODS[name].options:  # learn takes every declared option by keyword
        assert option in learn and learn[option].kind is inspect.Parameter.KEYWORD_ONLY, (name, option)
    assert isinstance(mod.MAX_PASSES, int) and mod.MAX_PASSES >= 0
    planned = inspect.signature(mod.required_statistics).parameters
    for key in (*METHODS[name].fit_options, *METHODS[name].source_options):
        assert key in planned, (name, key)
    check = getattr(mod, "check_setting", None)
    assert check is None or list(inspect.signature(check).parameters) == ["source", "options", "outputs"]


@pytest.mark.parametrize("name", list(METHODS))
def test_each_declaration_names_its_figures(name):
    m = METHODS[name]
    assert all(f in FIGURES for f in m.figures)
    assert METHOD_FIGURES[name] == tuple(FIGURES[f] for f in m.figures)


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.extra("sklearn")
def test_each_declaration_names_its_estimator(name):
    from relulearn import regressors

    m = METHODS[name]
    cls = getattr(regressors, m.regressor)
    assert cls._method == name and m.regressor in regressors.__all__
    params = set(cls._get_param_names())
    assert params - RUN_PARAMETERS <= {"width", *m.options}, (name, params - RUN_PARAMETERS)
    assert RUN_PARAMETERS <= params


@pytest.mark.extra("sklearn")
def test_every_estimator_class_is_declared():
    from relulearn import regressors

    declared = {m.regressor for m in METHODS.values()}
    assert declared == set(regressors.__all__)


def test_options_of_another_method_are_refused_naming_the_methods_that_take_them():
    with pytest.raises(ValueError, match=r"--depth applies to --method filtered-pca only, not to moments"):
        api.keywords.checked_options("moments", width=3, depth=2)
    with pytest.raises(ValueError, match=r"--no-residual applies to --method polynomial only, not to tensor"):
        api.keywords.checked_options("tensor", residual=False)
    with pytest.raises(ValueError, match=r"--budget applies to --method moments or filtered-pca only"):
        api.keywords.checked_options("exact", budget=10)
    assert api.keywords.checked_options("polynomial", width=None, degree=3, shrink=None) == {"width": None, "degree": 3}


def test_fit_learn_and_curve_show_every_option_and_refuse_a_misspelled_keyword_naming_the_closest():
    """The method options and execution keywords of fit, learn and curve come from the declarations: each is in
    the signature (keyword-only, default None for an option) and in the parameter list."""
    execution = ("workers", "scheduler", "client", "progress", "break_lock", "dashboard")
    for fn in (api.fit, api.learn, api.curve):
        params = inspect.signature(fn).parameters
        for name in OPTIONS:
            assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None, name
            assert f"\n{name} : " in fn.__doc__, name
        assert all(name in params and f"\n{name} : " in fn.__doc__ for name in execution)
    with pytest.raises(TypeError, match=r"fit\(\) got an unexpected keyword argument 'widht'; did you mean 'width'\? "
                       r"\(--method tensor takes width, refine_samples;"):  # fmt: skip
        api.fit("no.yaml", "no.zarr", "tensor", widht=3)
    with pytest.raises(ValueError, match=r"--depth applies to --method filtered-pca only, not to moments"):
        api.learn("no.zarr", depth=2)


def test_plan_refuses_a_misspelled_option_and_options_without_a_method_before_reading_the_configuration():
    """`relulearn.api.plan` checks its method options as fit does (it used to say `--widht applies to --method
    only`), and refuses method options when it plans an `estimate` (no method), where they would be ignored."""
    with pytest.raises(TypeError, match=r"plan\(\) got an unexpected keyword argument 'widht'; did you mean "
                       r"'width'\? .*help\(relulearn\.api\.plan\)"):  # fmt: skip
        api.plan("no.yaml", "tensor", widht=3)
    with pytest.raises(TypeError, match=r"plan\(\) takes method options \(depth, width\) only with a method"):
        api.plan("no.yaml", width=3, depth=2)
    done = relulearn("plan", ROOT / "examples" / "small.yaml", "--width", "3")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "relulearn: error: --width is an option of a method's plan: add --method M (relulearn plan CONFIG --method M)"
    ], done.stderr


def test_a_declaration_with_an_unknown_option_is_refused():
    with pytest.raises(ValueError, match=r"unknown options \['colour'\]"):
        Method("x", "x", "s", "l", "f", "p", "i", {"colour": "?"}, "XRegressor")


def test_the_command_line_takes_every_option_with_each_methods_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100000")  # wide columns: argparse would break words at their hyphens
    done = relulearn("learn", "--help")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    text = " ".join(out.split())
    for m in METHODS.values():
        assert f"{m.name} = {' '.join(m.summary.split())}" in text
    learn = next(a for a in build_parser()._actions if a.dest == "command").choices["learn"]
    flags = {s: a for a in learn._actions for s in a.option_strings}
    for o in OPTIONS.values():
        users = [m for m in METHODS.values() if o.name in m.options]
        assert users, f"{o.name} is declared by no method"
        help_text = flags[o.flag].help

        def group(name: str) -> str:  # a list of method names containing `name`, before a colon
            return rf"(?:^|; )(?:[a-z-]+, )*{re.escape(name)}(?:, [a-z-]+)*: "

        for m in users:  # each method's own words for the option, right after a list of names holding it
            assert re.search(group(m.name) + re.escape(m.options[o.name]), help_text), (o.flag, m.name, help_text)
        for m in METHODS.values():
            if o.name not in m.options:
                assert not re.search(group(m.name), help_text), (o.flag, m.name, help_text)


def test_the_readme_table_is_the_declarations():
    rows = re.findall(r"^\| `([a-z-]+)` \| (.*) \| (.*) \| (.*) \|$", (ROOT / "README.md").read_text(), flags=re.M)
    assert rows[1:] == [(m.name, m.learns, m.source, m.paper) for m in METHODS.values()]  # after the header


@pytest.mark.parametrize("fn", [api.learn, api.fit])
def test_the_python_api_takes_every_option_by_keyword(fn):
    params = inspect.signature(fn).parameters
    for name in OPTIONS:
        assert name in params and params[name].kind is inspect.Parameter.KEYWORD_ONLY, (fn.__name__, name)
        assert params[name].default is None  # the method's default applies
