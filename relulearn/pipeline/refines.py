"""The record a subspace pass keeps of the sketch store it refines, and the checks that refuse a pass (or a
stored pass) that would not see that store's chunks (``statistics.sketch.refines``; the family itself is
:mod:`.stats.sketch`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..storage import StoreError, diff_fields

__all__ = ["refine_record", "check_refines", "check_pass_store"]


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def refine_record(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a subspace pass records of the store it refines (``statistics.sketch.refines``).

    The store's fingerprint without its statistics (format, seed, chunk size, blocks, source
    and teacher digest: what fixes the bytes of every chunk and the order of the sums), its
    sample count, and a digest of its whole fingerprint (which sketch was refined).
    """
    fp = dict(meta["fingerprint"])
    return {
        "fingerprint": {k: v for k, v in fp.items() if k != "statistics"},
        "samples": int(meta["samples"]),
        "digest": _digest(fp),
    }


def check_refines(
    record: Mapping[str, Any], fingerprint: Mapping[str, Any], samples: int, where: str = "this run"
) -> None:
    """Refuse a subspace pass that would not draw the chunks of the store it refines.

    Parameters
    ----------
    record
        The pass's ``statistics.sketch.refines`` (:func:`refine_record` of the refined store).
    fingerprint
        The pass run's own fingerprint (``state.fingerprint``).
    samples
        The samples the pass run is asked for (whole chunks).

    Raises
    ------
    StoreError
        Naming every differing field (``seed``, ``source.d``, ``chunk_size``, ``samples``, ...).
    """
    own = {"fingerprint": {k: v for k, v in fingerprint.items() if k != "statistics"}, "samples": int(samples)}
    theirs = {"fingerprint": dict(record.get("fingerprint", {})), "samples": record.get("samples")}
    differing = [f.removeprefix("fingerprint.") for f in diff_fields(theirs, own)]
    if differing:
        raise StoreError(
            f"{where} is a subspace pass of a store with a different fingerprint (digest "
            f"{record.get('digest', '?')}); differing fields: {', '.join(differing)}. A pass must draw the same "
            "chunks as the store it refines: run it with that store's configuration (seed, source, chunk_size, "
            "run.chunks_per_block) and sample count, or sketch this setup afresh."
        )


def check_pass_store(pass_meta: Mapping[str, Any], sketch_meta: Mapping[str, Any], where: str = "the pass") -> None:
    """Refuse to combine a stored subspace pass with a sketch store it does not refine.

    Compares the pass's recorded ``statistics.sketch.refines`` with :func:`refine_record` of the
    sketch store (``meta`` of ``open_store``): fingerprint without statistics, samples and digest.

    Raises
    ------
    StoreError
        When the pass records no refined store, or another one (naming the differing fields).
    """
    section = pass_meta.get("config", {}).get("statistics", {}).get("sketch") or {}
    record = section.get("refines")
    if record is None:
        raise StoreError(
            f"{where} records no refined store (statistics.sketch.refines); run passes with "
            "relulearn.estimators.spectral.subspace.subspace_iteration and refines=refine_record(meta)"
        )
    differing = [f.removeprefix("fingerprint.") for f in diff_fields(record, refine_record(sketch_meta))]
    if differing:
        raise StoreError(
            f"{where} refines another store (digest {record.get('digest', '?')}); differing fields: "
            f"{', '.join(differing)}. Use the passes stored for this sketch store, or run new ones."
        )
