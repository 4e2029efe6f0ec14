"""The plan is what ``fit`` runs: the passes a real fit records in its store (their names, statistics, samples and
forms) are those of the plan ``fit(..., dry_run=True)`` returns for the same arguments."""

import pytest

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.pipeline.cost import Rates
from relulearn.pipeline.projection import project_pass
from relulearn.storage import RunStore

#: any rates: only the forms of the families are read from the projections here
RATES = Rates(peak=4e10, half=25.0, memory=1.5e10, normals=9e7, disk=1e9)


def config(worker_memory: int):
    return config_from_dict(
        {
            "seed": 3,
            "samples": 40_000,
            "chunk_size": 10_000,
            "source": {"d": 64, "teacher": {"kind": "one_hidden_relu", "width": 3, "seed": 3}, "noise_std": 0.0},
            "run": {"chunks_per_block": 2, "commit_interval": 0, "worker_memory": worker_memory},
        }
    )


def forms(cfg, statistics: dict) -> list[tuple[str, str]]:
    """Each family of a statistics section with its form, as a plan shows it."""
    return [(f.name, f.form) for f in project_pass(cfg, RATES, workers=1, statistics=statistics).families]


def recorded_passes(store: str, learned: dict) -> list[tuple[str, dict, int]]:
    """``(name, statistics, samples)`` of each pass the fit ran: the store's own, then each extra pass's."""
    stores = [("estimate", store)] + [(p["name"], p["store"]) for p in learned["passes"]]
    out = []
    for name, url in stores:
        meta = RunStore(url).meta()
        out.append((name, meta["config"]["statistics"], int(meta["samples"])))
    return out


# dense: the d × d families fit run.worker_memory, one pass; sketch: they do not, and the sketch's subspace passes
# follow (the last two of them optional: run only if the subspace iteration asks for them)
@pytest.mark.parametrize(("worker_memory", "form"), [(10**9, "dense"), (600_000, "sketch")])
def test_fit_runs_the_passes_of_the_plan_its_dry_run_shows(tmp_path, worker_memory, form):
    cfg = config(worker_memory)
    store = str(tmp_path / "s.zarr")
    plan = api.fit(cfg, store, "moments", width=3, dry_run=True, progress=None)["plan"]
    assert plan["choice"]["form"] == form
    learned = api.fit(cfg, store, "moments", width=3, progress=None)

    ran = recorded_passes(store, learned)
    planned = plan["passes"]
    required = [p for p in planned if not p["optional"]]
    assert len(required) <= len(ran) <= len(planned)
    assert (len(planned) > 1) == (form == "sketch")
    assert ran[0][1] == plan["statistics"]  # the estimate pass: the statistics the plan chose, exactly
    for (name, statistics, samples), p in zip(ran, planned):
        assert name == p["name"]
        assert samples == p["samples"] == plan["samples"]
        assert forms(cfg, statistics) == [(f["name"], f["form"]) for f in p["families"]]
    assert learned["runs_in"] == plan["runs_in"] == "in process"
