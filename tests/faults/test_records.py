"""A store's records (``records/<kind>-<time>.json``) and its place: a damaged record, one that is not a JSON object
and a write left unfinished by a kill are named and skipped by every reader (``report``, the curve's points), never a
crash; a store is never created inside another store (whose commits would delete it)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.storage import RunStore, StoreError
from relulearn.storage.nesting import check_not_inside_a_store

from conftest import TWO_UNITS, relulearn


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def learned_once(tmp_path_factory) -> Path:
    """A store of TWO_UNITS with two learn records and one curve record, learned once for the module: the tests
    damage and write into copies of it (:func:`learned`)."""
    store = tmp_path_factory.mktemp("learned") / "s.zarr"
    cfg = config_from_dict(TWO_UNITS)
    for n in (20_000, 40_000):
        api.fit(cfg, str(store), "moments", width=2, samples=n, client="local", progress=None)
    RunStore(str(store)).add_record("curve", {"key": {"method": "moments"}, "samples": 20_000})
    return store


@pytest.fixture
def learned(learned_once, tmp_path) -> Path:
    """A copy of :func:`learned_once` of the test's own (the store holds no path of its folder)."""
    return Path(shutil.copytree(learned_once, tmp_path / "s.zarr"))


def _damage(store: Path) -> dict[str, str]:
    """A truncated learn record, a learn record that is a JSON list, and the temporary file a learn killed while
    writing its record leaves (zarr writes ``<key>.<uuid hex>.partial``, then renames it); their names."""
    records = store / "records"
    good = sorted(records.glob("learn-*.json"))
    text = good[-1].read_text()
    truncated = records / "learn-20990101T000000.000001Z.json"
    truncated.write_text(text[: len(text) // 2])
    listed = records / "learn-20990101T000000.000002Z.json"
    listed.write_text(json.dumps([1, 2, 3]))
    partial = records / f"learn-20990101T000000.000003Z.{'a' * 32}.partial"
    partial.write_text(text[:100])
    typed = records / "learn-20990101T000000.000004Z.json"
    typed.write_text(json.dumps({"method": "moments", "samples": "many", "report": 5}))
    curve = records / "curve-20990101T000000.000001Z.json"
    curve.write_text('{"samples": ')
    return {
        "truncated": truncated.name,
        "listed": listed.name,
        "partial": partial.name,
        "typed": typed.name,
        "curve": curve.name,
    }


def test_damaged_records_are_named_and_skipped_and_a_partial_write_is_ignored(learned, caplog):
    """The store's reader returns the whole records only, in order, and warns once per damaged record naming its
    file and what is wrong with it; the leftover of a killed write is not a record at all."""
    before = RunStore(str(learned)).records("learn")
    curves = RunStore(str(learned)).records("curve")
    names = _damage(learned)
    with caplog.at_level(logging.WARNING, logger="relulearn"):
        assert RunStore(str(learned)).records("learn") == before
        assert RunStore(str(learned)).records("curve") == curves
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 4, warned
    assert any(names["truncated"] in w and "not readable JSON" in w for w in warned)
    assert any(names["listed"] in w and "not a JSON object" in w and "a list" in w for w in warned)
    assert any(names["typed"] in w and "field 'samples' is not a whole number" in w for w in warned)
    assert any(names["curve"] in w for w in warned)
    assert not any(names["partial"] in w for w in warned)
    assert all(str(learned) in w and "skipped" in w for w in warned)


@pytest.mark.slow
@pytest.mark.extra("report")
def test_report_reads_past_damaged_records_naming_each(learned, tmp_path):
    """`relulearn report` on a store with damaged records: exit 0, the figures of the last whole learn record, one
    warning line per damaged record naming its file; no traceback. A last record whose fields are right at the top
    but whose report holds something else: its figures not drawn, naming the record; the others drawn."""
    names = _damage(learned)
    out = tmp_path / "r.html"
    done = relulearn("report", learned, "--out", out)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    warnings = [line for line in done.stderr.strip().splitlines() if line.startswith("relulearn: warning:")]
    assert len(warnings) == 3, done.stderr
    assert all(any(names[k] in w for w in warnings) for k in ("truncated", "listed", "typed"))
    assert "figures spectra, learning, samples" in done.stdout  # the learn records that are whole are drawn

    stamp = "20990101T000000.000005Z"  # (add_record keeps the time of a record's name in it)
    odd = learned / "records" / f"learn-{stamp}.json"
    odd.write_text(
        json.dumps({"method": "moments", "samples": 40_000, "report": {"enumeration": 5}, "recorded": stamp})
    )
    done = relulearn("report", learned, "--out", out)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "figures spectra, samples" in done.stdout
    assert f"not drawn: learning: the learn record records/{odd.name} does not hold what the learning figure" in (
        done.stdout
    )


def test_verify_mentions_an_unfinished_record_write(learned):
    """`verify` of a store whose records hold the leftover of a killed write: intact (the statistics are), and the
    leftover named as an unfinished write that readers ignore."""
    names = _damage(learned)
    done = relulearn("verify", learned, "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["intact"] is True
    assert got["unfinished"] == [f"records/{names['partial']}"]
    text = relulearn("verify", learned)
    assert text.returncode == 0 and f"records/{names['partial']}" in text.stdout


# ------------------------------------------------------------------ a store inside another store


@pytest.mark.parametrize("inner", ["g000099", "records/x.zarr", "deep/er/run.zarr", "passes/a/b"])
def test_a_store_inside_another_store_is_refused_and_the_outer_store_unchanged(learned, inner):
    """`estimate --store OUTER/...` (a generation-like name the outer store's next commit would delete, or any
    path below it): exit 2, one line naming the outer store and the fix; not a byte of the outer store changed."""
    (learned.parent / "c.json").write_text(json.dumps(TWO_UNITS))
    before = _files(learned)
    done = relulearn("estimate", learned.parent / "c.json", "--store", learned / inner)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"inside the relulearn store {learned}" in done.stderr and f"choose a path outside {learned}" in done.stderr
    assert _files(learned) == before


def test_the_extra_passes_of_a_store_are_allowed_under_it(learned):
    """``STORE/passes/<name>`` is where a learning method keeps its extra passes (stores of their own): allowed;
    the same check refuses a path below a pass and a path beside the passes."""
    check_not_inside_a_store(f"{learned}/passes/sketch-0123456789ab")
    check_not_inside_a_store(str(learned.parent / "elsewhere.zarr"))
    with pytest.raises(StoreError, match="inside the relulearn store"):
        check_not_inside_a_store(f"{learned}/passes")
    with pytest.raises(StoreError, match="inside the relulearn store"):
        check_not_inside_a_store(f"{learned}/../{learned.name}/g000001")


def test_a_first_run_under_way_is_a_store_and_another_tool_s_lease_json_is_not(tmp_path):
    """A folder holding a writer's lease and no root document yet (its first commit not done) is a store: refused
    below it. A ``lease.json`` that is not a relulearn lease (another tool's) does not make its folder one."""
    from relulearn.storage.lease import Lease

    first = tmp_path / "first.zarr"
    with Lease.acquire(str(first), heartbeat=0):
        with pytest.raises(StoreError, match=f"inside the relulearn store {first}"):
            check_not_inside_a_store(str(first / "g000001"))
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "lease.json").write_text(json.dumps({"owner": "someone", "until": 5}))
    check_not_inside_a_store(str(tmp_path / "tool" / "run.zarr"))


@pytest.mark.slow
def test_the_curve_learns_a_point_again_whose_record_is_damaged(tmp_path):
    """`relulearn curve` run again on its store after one of its point records was truncated: exit 0, a warning
    naming that record, the point learned again with the same numbers bit for bit, the other point reused."""
    (tmp_path / "c.json").write_text(json.dumps(TWO_UNITS))
    store = tmp_path / "s.zarr"
    args = ("curve", tmp_path / "c.json", "--method", "moments", "--width", 2, "--samples", "2e4,4e4")
    first = relulearn(*args, "--store", store, "--in-process", "--quiet", "--json")
    assert first.returncode == 0, first.stderr
    damaged = sorted((store / "records").glob("curve-*.json"))[-1]  # the point at 40,000 samples
    damaged.write_text(damaged.read_text()[:40])
    again = relulearn(*args, "--store", store, "--in-process", "--json")
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert f"skipped the damaged curve record {store}/records/{damaged.name}" in again.stderr
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert b["learned"] == 1 and [p["reused"] for p in b["points"]] == [True, False]
    timing = ("reused", "seconds", "estimate_seconds", "learn_seconds", "evaluate_seconds")
    same = [{k: v for k, v in p.items() if k not in timing} for p in a["points"]]
    assert [{k: v for k, v in p.items() if k not in timing} for p in b["points"]] == same
