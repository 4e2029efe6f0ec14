"""A store as an xarray DataTree: the statistics at stable paths (the same after the store is extended), every
array and dimension described, the run's configuration and fingerprint on the root."""

from __future__ import annotations

import json

import numpy as np
import pytest

import relulearn
from relulearn import api
from relulearn.config import config_from_dict

STATISTICS = {
    "basic": {},
    "hermite": {"max_order": 3},
    "contracted": {"orders": [2, 4], "directions": 3, "control": True, "control_samples": 10_000},
    "filtered": {"quantiles": [0.5, 0.9], "pilot_samples": 10_000},
}


def _cfg(statistics: dict, samples: int, **source) -> object:
    return config_from_dict(
        {
            "seed": 5,
            "samples": samples,
            "chunk_size": 10_000,
            "source": {"d": 6, "teacher": {"kind": "one_hidden_relu", "width": 2}, **source},
            "statistics": statistics,
        }
    )


def _assert_described(tree) -> None:
    for node in tree.subtree:
        ds = node.dataset
        for name, var in ds.variables.items():
            assert var.attrs.get("long_name") and var.attrs.get("description"), (node.path, name)
            # a real description, not the fallback that names the array only
            assert not var.attrs["description"].startswith(("array ", "dimension ")), (node.path, name, var.attrs)
        for dim in ds.dims:
            assert dim in ds.coords, (node.path, dim)


@pytest.mark.parametrize(
    "statistics",
    [
        STATISTICS,
        {
            "basic": None,
            "sketch": {
                "rank": 3,
                "second": {},
                "contracted": {"orders": [2], "directions": 2},
                "filtered": {"thresholds": [0.1]},
            },
        },
    ],
)
def test_the_tree_has_every_statistic_at_a_stable_path_and_every_array_described(tmp_path, statistics):
    store = str(tmp_path / "s.zarr")
    api.estimate(_cfg(statistics, 40_000), store, client="local", progress=None)
    tree = relulearn.open_datatree(store)
    families = sorted(k for k, v in statistics.items() if v is not None)
    assert sorted(tree.children) == families
    _assert_described(tree)
    assert json.loads(tree.attrs["configuration"])["statistics"].keys() >= set(families)
    assert json.loads(tree.attrs["fingerprint"])["seed"] == 5 and tree.attrs["samples"] == 40_000
    head = relulearn.open_store(store).head

    # extended: a new generation under the hood, the same paths in the tree, the new samples in its values
    api.estimate(_cfg(statistics, 80_000), store, client="local", progress=None)
    assert relulearn.open_store(store).head != head
    again = relulearn.open_datatree(store)
    assert sorted(again.children) == families and again.attrs["samples"] == 80_000
    assert {n.path: sorted(n.dataset.variables) for n in again.subtree} == {
        n.path: sorted(n.dataset.variables) for n in tree.subtree
    }
    fam = families[0]
    est = [k for k in again[fam].dataset.data_vars if k + "_se" in again[fam].dataset][0]
    np.testing.assert_array_equal(again[fam].dataset[est].values, relulearn.open_store(store).arrays(fam)[est])


def test_a_vector_label_store_is_described_too(tmp_path):
    """Per-output families (a leading `output` dimension; per-output τ grids) and the output moments."""
    store = str(tmp_path / "s.zarr")
    cfg = config_from_dict(
        {
            "seed": 1,
            "samples": 40_000,
            "chunk_size": 10_000,
            "source": {"d": 6, "teacher": {"kind": "two_layer", "width": 2, "outputs": 3}},
            "statistics": {
                "basic": {},
                "output_moments": {},
                "filtered": {"quantiles": [0.5, 0.9], "pilot_samples": 10_000},
            },
        }
    )
    api.estimate(cfg, store, client="local", progress=None)
    tree = relulearn.open_datatree(store)
    assert sorted(tree.children) == ["basic", "filtered", "output_moments"]
    _assert_described(tree)
    assert tree["output_moments"].dataset["T2"].dims == ("output", "i", "j")
