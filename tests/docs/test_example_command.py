"""``relulearn example``: the shipped example configurations, so that a wheel's user has the files the documentation
runs. The package holds them (``relulearn/examples/*.yaml``) and ``examples/`` in a checkout is the same folder, so
the README's ``examples/small.yaml`` and ``relulearn example small > small.yaml`` are the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from conftest import relulearn

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = ROOT / "relulearn" / "examples"


def test_the_checkout_examples_folder_is_the_packaged_one():
    assert (ROOT / "examples").resolve() == PACKAGED.resolve()
    names = sorted(p.name for p in PACKAGED.iterdir())
    assert names and all(n.endswith(".yaml") for n in names), names  # data only: nothing else ships there
    assert "py.typed" in (ROOT / "pyproject.toml").read_text()
    assert '"examples/*.yaml"' in (ROOT / "pyproject.toml").read_text()  # the package data that ships them


def test_without_a_name_it_lists_every_example_with_its_first_sentence():
    out = relulearn("example")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    listed = [line.split()[0] for line in lines[:-1]]
    assert listed == sorted(p.stem for p in PACKAGED.glob("*.yaml"))
    small = next(line for line in lines if line.startswith("small "))
    assert small.split(maxsplit=1)[1] == (
        "A small run: a planted one-hidden-layer ReLU network in d = 20, all four statistic families."
    )
    as_json = json.loads(relulearn("example", "--json").stdout)["examples"]
    assert sorted(as_json) == listed


def test_with_a_name_it_prints_the_file_byte_for_byte(tmp_path):
    for path in sorted(PACKAGED.glob("*.yaml")):
        out = relulearn("example", path.stem)
        assert out.returncode == 0, out.stderr
        assert out.stdout == path.read_text(encoding="utf-8")
        assert yaml.safe_load(out.stdout)["source"]["d"] > 0
    assert json.loads(relulearn("example", "small", "--json").stdout) == {
        "name": "small",
        "text": (PACKAGED / "small.yaml").read_text(encoding="utf-8"),
    }


def test_an_unknown_name_is_refused_in_one_line_naming_the_examples():
    out = relulearn("example", "smal")
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "relulearn: error: no example named 'smal': the examples are deep, landscape, large, polynomial, small, "
        "two_layer (`relulearn example`)"
    ]
