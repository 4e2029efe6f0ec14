"""A store as an :class:`xarray.DataTree` at stable paths: ``/basic``, ``/contracted``, … hold the statistics of
the committed head when it was opened, whatever its generation; every array and dimension says what it is.

The store itself keeps each commit in a generation group (``g000007/basic``: a commit writes a new generation
and switches one pointer, so that readers never see half a commit); this view hides that mechanism, so the
same path reads the same statistic before and after the store is extended.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .pipeline.describe import describe_array, describe_dimension

__all__ = ["open_datatree", "described"]


def open_datatree(url: str) -> Any:
    """The committed statistics of the store at ``url`` as an :class:`xarray.DataTree`.

    The root node's attributes hold the run: ``configuration`` and ``fingerprint`` (JSON), ``samples``,
    ``chunks``, ``chunk_size``, ``seeds``, ``format_version``, ``created`` and ``last_commit``. Each statistic is
    a child node (``tree["basic"]``, ``tree["contracted"]``) whose arrays (lazy, read on use) carry ``long_name``
    and ``description`` attributes, and every dimension has a coordinate.

    A view of one commit, the last one when it was opened, however many commits a writer makes meanwhile: the
    tree's metadata and every value it reads (lazily, when used) are of that commit, each chunk checked against
    the commit's manifest. A commit keeps the generation it replaced until the next one, and a writer that
    finishes removes it: values read after that (the store extended meanwhile) raise
    :class:`~relulearn.storage.errors.StoreMovedError` — never zeros, never another commit's values. Load what
    you need (``tree.load()``) soon after opening a store that is being written, or open it again.

    Raises
    ------
    relulearn.StoreError
        When there is no committed run at ``url``.
    relulearn.StoreMovedError
        When values are read after later commits deleted the commit the tree opened: open it again.
    """
    import xarray as xr

    from .storage import open_store

    run = open_store(url)
    meta = run.meta
    root = {
        "configuration": json.dumps(meta.get("config", {})),
        "fingerprint": json.dumps(meta.get("fingerprint")),
        "samples": int(meta["samples"]),
        "chunks": int(meta["chunks"]),
        "chunk_size": int(meta["chunk_size"]),
        "seeds": json.dumps(meta.get("seeds", [])),
        "format_version": int(meta["format_version"]),
        "created": str(meta.get("created")),
        "last_commit": str(meta.get("updated")),
        "description": f"relulearn statistics of {int(meta['samples']):,} samples; each child node is one "
        "statistic family, each array an estimate (mean over the samples) with its standard "
        "error `<name>_se`, or the sums they come from",
    }
    nodes = {"/": xr.Dataset(attrs=root)}
    for name in run.statistics:
        nodes[f"/{name}"] = described(name, run.dataset(name))
    return xr.DataTree.from_dict(nodes)


def described(family: str, ds: Any) -> Any:
    """``ds`` (one statistic's dataset) with ``long_name``/``description`` on every variable and a coordinate on
    every dimension (its index, where the store keeps none)."""
    missing = {dim: np.arange(size) for dim, size in ds.sizes.items() if dim not in ds.variables}
    ds = ds.assign_coords(missing)
    for name, var in ds.variables.items():
        # the family's own words, else those of the dimension it indexes, else a plain name
        got = describe_array(family, str(name)) or (describe_dimension(str(name)) if name in ds.dims else None)
        long_name, text = got or (str(name), f"array {name} of the {family} statistic")
        var.attrs.update(long_name=long_name, description=text)
    ds.attrs.update(long_name=f"statistic {family}", description=f"the {family} statistic family")
    return ds
