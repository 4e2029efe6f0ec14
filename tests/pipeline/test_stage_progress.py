"""Progress of a learn's long stages (enumeration, refinement, polish) on the command's stream: in process and
on the distributed scheduler, nothing when no stream is given."""

from __future__ import annotations

import io

import pytest

from relulearn import api, progress
from relulearn.config import config_from_dict

CFG = {
    "seed": 2,
    "samples": 200_000,
    "chunk_size": 25_000,
    "source": {"d": 10, "teacher": {"kind": "one_hidden_relu", "width": 3}, "noise_std": 0.0},
    "statistics": {"basic": {}, "contracted": {"orders": [2, 4], "directions": 4}},
}


@pytest.mark.parametrize("where", ["in process", "cluster"])
def test_a_learn_reports_its_stages(tmp_path, where, request):
    client = "local" if where == "in process" else request.getfixturevalue("client")
    store = str(tmp_path / "s.zarr")
    api.estimate(config_from_dict(CFG), store, client=client, progress=None)
    out = io.StringIO()
    api.learn(store, "moments", width=3, client=client, progress=out)
    lines = out.getvalue().splitlines()
    stages = [line for line in lines if line.startswith(("enumeration: stages", "exact polish"))]
    assert any(line.startswith("enumeration: stages: 1 ") for line in stages), lines
    assert any(line.startswith("exact polish") and "/30" in line for line in stages), lines
    quiet = io.StringIO()
    api.learn(store, "moments", width=3, client=client, progress=None)
    assert quiet.getvalue() == ""


def test_a_stage_line_says_how_far_with_an_upper_bound_eta():
    out = io.StringIO()
    with progress.reporting(out):
        progress.step("refinement: passes over the samples", 1, 40, "relative loss 0.01")
        progress.step("refinement: passes over the samples", 2, 40)  # within the interval: not printed
        progress.step("refinement: passes over the samples", 40, 40)  # the last step always is
    progress.step("outside", 1, 2)  # no reporter: nothing
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("refinement: passes over the samples: 1/40  ETA at most ")
    assert (
        lines[0].endswith("(relative loss 0.01)")
        and len(lines) == 2
        and lines[1].startswith("refinement: passes over the samples: 40/40")
    )


def test_a_stage_that_stops_early_shows_where_it_stopped():
    """A polish that converges in 3 of 30 steps: a log shows its first line and, when the next stage starts (or
    the learn ends), its last one; nothing in between."""
    out = io.StringIO()
    with progress.reporting(out):
        for i in range(4):
            progress.step("exact polish: Gauss–Newton steps", i, 30, f"step {i}")
        progress.step("refinement: passes over the samples", 1, 5)
        progress.step("refinement: passes over the samples", 2, 5)  # the learn ends here
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "exact polish: Gauss–Newton steps: 0/30",
        "exact polish: Gauss–Newton steps: 3/30",
        "refinement: passes over the samples: 1/5",
        "refinement: passes over the samples: 2/5",
    ], lines
    assert lines[1].endswith("(step 3)")
