"""Merging the stores of two runs of the same source with different seeds into a new store."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..config import config_from_dict
from ..storage import RunStore, StoreError, diff_fields
from ..storage.lease import writing
from ..storage.location import disk_full_named
from .state import commit_groups, commit_meta, load_partial, statistics_from_store

__all__ = ["merge_stores"]


def merge_stores(a_url: str, b_url: str, out_url: str, *, break_lock: bool = False) -> dict[str, Any]:
    """Merge the stores of two runs of the same source with different seeds into ``out_url``.

    The sums of A come first, then B's (the order fixes the bits). Both must agree on
    everything but the seed: source, statistics with their direction banks and τ grids,
    chunk size. A and B are only read, each as one of its commits; once they are checked,
    the lease of ``out_url`` is taken (``break_lock``: break a stale one first) and held
    until the merged store is committed.
    """
    a, b, out = RunStore(a_url), RunStore(b_url), RunStore(out_url)
    ma, mb = a.meta(), b.meta()
    for url, m in ((a_url, ma), (b_url, mb)):
        if m is None:
            raise StoreError(f"{url} holds no run; run `relulearn estimate` into it first")
    if out.meta() is not None:
        raise StoreError(f"{out_url} already holds a run; merge into a new path")
    assert ma is not None and mb is not None  # checked above
    fa = {k: v for k, v in ma["fingerprint"].items() if k != "seed"}
    fb = {k: v for k, v in mb["fingerprint"].items() if k != "seed"}
    differing = diff_fields(fa, fb)
    if differing:
        raise StoreError(f"{a_url} and {b_url} are runs of different setups; differing fields: {', '.join(differing)}")
    overlap = set(ma["seeds"]) & set(mb["seeds"])
    if overlap:
        raise StoreError(f"{a_url} and {b_url} both contain seed(s) {sorted(overlap)}: their samples would count twice")
    cfg = config_from_dict(ma["config"], where=f"stored in {a_url}")
    stats_a, stats_b = statistics_from_store(cfg, a), statistics_from_store(cfg, b)
    for sa, sb in zip(stats_a, stats_b):
        for k, (_, va) in sa.coords().items():
            vb = sb.coords()[k][1]
            if va.shape != vb.shape or not np.array_equal(va, vb):
                hint = {
                    "direction": "give the same statistics.contracted.directions_seed (or directions) to both runs",
                    "tau": "give statistics.filtered.thresholds explicitly (same values) to both runs",
                    "quantile": "give statistics.filtered.thresholds explicitly to both runs",
                    "omega": "give statistics.sketch.seed explicitly (same value) to both runs",
                }.get(k, "")
                raise StoreError(f"cannot merge: the '{sa.name}' statistic's {k} differs between the stores; {hint}")
    with writing(out_url, break_lock=break_lock) as lease:
        if out.meta() is not None:  # (a merge into the same path that finished meanwhile)
            raise StoreError(f"{out_url} already holds a run; merge into a new path")
        pa, la = load_partial(a, stats_a)
        pb, lb = load_partial(b, stats_b)
        # The ledgers are per-seed ranges; the sums simply add.
        pb.chunk_start, pb.chunk_stop = pa.chunk_stop, pa.chunk_stop + pb.n_chunks
        pa.add(pb)
        ledger = [r[:3] + [0, r[4]] for r in la + lb]
        meta = commit_meta(
            cfg, dict(ma["fingerprint"], seed=sorted(ma["seeds"] + mb["seeds"])), stats_a, ledger, pa.chunk_stop
        )
        meta["merged_from"] = [a_url, b_url]
        with disk_full_named(out_url, after="nothing was merged"):
            try:
                out.commit(meta, commit_groups(stats_a, pa, cfg.chunk_size, ledger), lease=lease)
            except BaseException:
                # nothing was committed: its unfinished generation goes, and the folder with the lease's release
                with contextlib.suppress(Exception):
                    out.discard_unfinished()
                raise
    return {"store": out_url, "seeds": meta["seeds"], "samples": meta["samples"], "chunks": meta["chunks"]}
