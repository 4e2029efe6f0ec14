"""The cost model and the planner that chooses by projected time: tested on the model (given rates), not on
timings. The projection's accuracy against measured runs is a benchmark (``benchmarks/plan.py``)."""

import json
import math

import numpy as np
import pytest

from relulearn.cli import main
from relulearn.config import config_from_dict
from relulearn.pipeline.cost import Rates, Work, family_work, sums_entries
from relulearn.pipeline.families import build_statistics
from relulearn.pipeline.plan import MemoryBudgetError, partial_bytes
from relulearn.pipeline.projection import project_pass
from relulearn.pipeline.sources import make_source
from relulearn.runplan import TooLongError, plan_run

#: a machine like this one (one core: 40 Gflop/s on large products, 90 M normals/s)
RATES = Rates(peak=4e10, half=25.0, memory=1.5e10, normals=9e7, disk=1e9)


def cfg_of(d: int, samples: int = 1_000_000, statistics: dict | None = None, **run) -> object:
    raw = {
        "seed": 1,
        "samples": samples,
        "chunk_size": 50_000,
        "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": 4}},
    }
    if statistics is not None:
        raw["statistics"] = statistics
    if run:
        raw["run"] = run
    return config_from_dict(raw)


def test_a_blas_product_runs_at_half_its_peak_at_the_calibrated_size():
    assert RATES.blas(25) == pytest.approx(RATES.peak / 2)
    assert RATES.blas(10**6) == pytest.approx(RATES.peak, rel=1e-4)
    w = Work(((2e9, 10**9),), stream=1.5e10, normals=9e7)
    assert RATES.seconds(w) == pytest.approx(0.05 + 1.0 + 1.0, rel=1e-6)


@pytest.mark.parametrize(
    "statistics",
    [
        {"basic": {}, "contracted": {"orders": [2, 4], "directions": 3}},
        {"basic": None, "sketch": {"rank": 7, "second": {}}},
        {
            "basic": None,
            "sketch": {
                "rank": 5,
                "contracted": {"orders": [2], "directions": 2},
                "filtered": {"thresholds": [0.1, 0.5]},
            },
        },
        {"output_moments": {}, "hermite": {"max_order": 3}},
        {"filtered": {"thresholds": [0.1, 0.3, 0.9]}},
    ],
)
def test_the_projected_block_partial_is_the_built_statistics_partial_to_the_byte(statistics):
    """The model's partial bytes (what run.worker_memory bounds, and what the driver merges) equal those of the
    statistics the run builds (their schemas), family by family."""
    cfg = cfg_of(21, statistics=statistics)
    built = partial_bytes(build_statistics(cfg, make_source(cfg)))
    model = {k: 8 * (a + b) for k, (a, b) in sums_entries(cfg.statistics, 21).items()}
    assert model == built


def test_dense_work_is_the_syrk_count_and_the_sketch_work_is_linear_in_d():
    d = 1000
    assert family_work("basic", {}, d).flops == d * (d + 1)
    contracted = family_work("contracted", {"orders": [2, 4], "directions": 8}, d)
    assert contracted.flops >= 16 * d * (d + 1)
    sketch = [family_work("sketch", {"rank": 32, "second": {}}, dd).flops for dd in (1000, 2000, 4000)]
    assert sketch[1] == pytest.approx(2 * sketch[0]) and sketch[2] == pytest.approx(4 * sketch[0])
    # a label vector of m outputs: every family but output_moments once per output
    assert family_work("contracted", {"orders": [2], "directions": 1}, 300, outputs=3).flops == pytest.approx(
        3 * family_work("contracted", {"orders": [2], "directions": 1}, 300).flops
    )


def test_a_pass_projects_linearly_in_samples_and_inversely_in_workers():
    cfg = cfg_of(200, statistics={"basic": {}, "contracted": {"orders": [2, 4], "directions": 8}})
    one = project_pass(cfg, RATES, workers=1, samples=1_600_000)
    two = project_pass(cfg, RATES, workers=2, samples=1_600_000)  # 32 chunks, 8 blocks: 4 on each worker
    big = project_pass(cfg, RATES, workers=2, samples=6_400_000)
    for part in ("generation", "teacher", "update", "chunks"):
        assert two.seconds[part] == pytest.approx(one.seconds[part] / 2)
        assert big.seconds[part] == pytest.approx(4 * two.seconds[part])
    assert big.blocks == math.ceil(128 / cfg.run.chunks_per_block)
    # 5 blocks on two workers: the pass lasts 3 blocks, not 2.5
    five = project_pass(cfg, RATES, workers=2, samples=1_000_000)
    alone = project_pass(cfg, RATES, workers=1, samples=1_000_000)
    assert five.seconds["update"] == pytest.approx(alone.seconds["update"] * 3 / 5)
    # one commit per commit_interval of work, and the last: each writes the block partial's bytes
    worker_wall = sum(big.seconds[p] for p in ("generation", "teacher", "update", "chunks"))
    commits = 1 + int(worker_wall // cfg.run.commit_interval)
    partial = sum(f.partial_bytes for f in big.families)
    each = partial / RATES.disk + RATES.seconds(Work(stream=2 * partial))
    assert big.seconds["commit"] == pytest.approx(commits * each)
    assert partial == 8 * 2 * ((200 * 200 + 2 * 200 + 2) + 16 * (200 * 200 + 200 + 1))


def test_the_planner_sketches_a_large_d_where_dense_would_take_hours():
    """d = 3000, 8·10⁶ samples, moments: the dense contracted family is 16 Grams of d² per sample (hours); the
    sketch of M_2 and its subspace passes are minutes."""
    plan = plan_run(cfg_of(3000, 8_000_000), "moments", workers=2, rates=RATES)
    assert plan.choice["form"] == "sketch"
    forms = plan.choice["forms"]
    assert forms["dense"]["projected_seconds"] > 10 * forms["sketch"]["projected_seconds_max"]
    assert forms["dense"]["fits"]  # chosen by time, not by memory: 16 · 3000² · 16 B = 2.3 GB < 4 GiB
    assert [p.name for p in plan.passes][:4] == ["estimate", "subspace-1", "subspace-2", "subspace-3"]
    assert plan.projected_seconds < plan.projected_seconds_max  # passes 4 and 5 run only when asked for


def test_the_planner_stays_dense_at_small_d_and_where_products_are_cheap():
    small = plan_run(cfg_of(20), "moments", workers=2, rates=RATES)
    assert small.choice["form"] == "dense"
    # a machine whose products are 100× faster (the same normals): dense at d = 512 as well
    fast = Rates(peak=4e12, half=25.0, memory=1.5e10, normals=9e7, disk=1e9)
    assert plan_run(cfg_of(512), "moments", workers=2, rates=RATES).choice["form"] == "sketch"
    assert plan_run(cfg_of(512), "moments", workers=2, rates=fast).choice["form"] == "dense"


@pytest.mark.parametrize("d,samples", [(50, 400_000), (50, 2_000_000), (100, 10**7), (50, 10**8)])
def test_the_pilot_pass_is_a_small_share_of_the_run(d, samples):
    """The control variate's pilot (on the driver, before the first block) is sized to the run: within 5 % of the
    projected pass on two workers, never above its default, and the same whatever the machine's speed (a share
    of the samples: the statistics' bits must not depend on the rates)."""
    plan = plan_run(cfg_of(d, samples), "moments", workers=2, rates=RATES)
    assert plan.choice["form"] == "dense" and plan.statistics["contracted"]["control"]
    est = plan.passes[0]
    assert est.seconds["pilot"] <= 0.05 * est.projected_seconds
    pilot = plan.statistics["contracted"]["control_samples"]
    assert max(10_000, 20 * d) <= pilot <= 100_000
    fast = Rates(peak=4e12, half=25.0, memory=1.5e11, normals=9e8, disk=1e10)
    assert plan_run(cfg_of(d, samples), "moments", workers=2, rates=fast).statistics == plan.statistics
    # a pilot the configuration gives is kept
    given = {
        "basic": {},
        "contracted": {"orders": [2, 4], "directions": 8, "control": True, "control_samples": 123_000},
    }
    assert (
        plan_run(cfg_of(d, samples, given), "moments", workers=2, rates=RATES).statistics["contracted"][
            "control_samples"
        ]
        == 123_000
    )


def test_the_planner_sketches_when_the_dense_partial_does_not_fit_the_worker_memory():
    cheap = Rates(peak=4e13, half=25.0, memory=1.5e10, normals=9e7, disk=1e9)  # dense would be faster
    roomy = plan_run(cfg_of(600), "moments", workers=2, rates=cheap)
    assert roomy.choice["form"] == "dense"
    dense_bytes = roomy.choice["forms"]["dense"]["partial_bytes"]
    tight = plan_run(cfg_of(600, worker_memory=dense_bytes - 1), "moments", workers=2, rates=cheap)
    assert tight.choice["form"] == "sketch"
    assert "run.worker_memory" in tight.choice["reason"]


def test_a_budget_no_form_fits_is_refused_with_the_bytes_of_each_form():
    with pytest.raises(MemoryBudgetError) as err:
        plan_run(cfg_of(600, worker_memory=1000), "moments", workers=2, rates=RATES)
    msg = str(err.value)
    assert "dense needs" in msg and "sketch needs" in msg and "run.worker_memory" in msg


def test_a_run_past_max_hours_is_refused_with_the_samples_that_would_fit(tmp_path):
    cfg = cfg_of(
        3000, 8_000_000, statistics={"basic": {}, "contracted": {"orders": [2, 4], "directions": 8}}, max_hours=0.5
    )
    with pytest.raises(TooLongError) as err:
        plan_run(cfg, None, workers=2, rates=RATES)
    msg = str(err.value)
    assert "run.max_hours = 0.5 h" in msg and "samples per pass would fit" in msg and "contracted dense" in msg
    fit = int(msg.split("about ")[1].split(" samples")[0].replace(",", ""))
    ok = plan_run(
        cfg_of(3000, fit, statistics={"basic": {}, "contracted": {"orders": [2, 4], "directions": 8}}, max_hours=0.5),
        None,
        workers=2,
        rates=RATES,
    )
    assert ok.projected_seconds <= 1800


def test_plan_and_fit_dry_run_print_the_plan_and_write_nothing(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("seed: 1\nsamples: 400000\nchunk_size: 50000\nsource:\n  d: 30\n  teacher: {width: 3}\n")
    assert main(["plan", str(cfg), "--method", "moments"]) == 0
    out = capsys.readouterr().out
    assert "projected:" in out and "contracted dense" in out and "where the time goes" in out
    assert len(out.splitlines()) < 25  # a table, not a dump
    assert main(["plan", str(cfg), "--method", "moments", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["projected_seconds"] > 0 and all(p["projected_seconds"] > 0 for p in got["passes"])
    assert np.isclose(got["projected_seconds"], sum(p["projected_seconds"] for p in got["passes"] if not p["optional"]))
    store = tmp_path / "s.zarr"
    assert main(["fit", str(cfg), "--store", str(store), "--method", "moments", "--dry-run"]) == 0
    assert "projected:" in capsys.readouterr().out
    assert not store.exists()
    assert main(["fit", str(cfg), "--store", str(store), "--method", "moments"]) == 2
    assert "needs --out" in capsys.readouterr().err


def test_fit_on_an_existing_store_keeps_the_statistics_it_was_started_with(tmp_path):
    """The form chosen by projected time depends on the machine: a run resumed or extended elsewhere keeps the
    statistics its store holds instead of planning them again (another choice would not match the store)."""
    from relulearn import api

    raw = {"seed": 1, "samples": 100_000, "chunk_size": 25_000, "source": {"d": 20, "teacher": {"width": 3}}}
    sketched = dict(raw, statistics={"basic": None, "sketch": {"rank": 12, "second": {}}})
    store = str(tmp_path / "s.zarr")
    api.estimate(config_from_dict(sketched), store, client="local", progress=None)
    fresh = api.fit(config_from_dict(raw), str(tmp_path / "new.zarr"), "moments", client="local", dry_run=True)
    assert fresh["plan"]["choice"]["form"] == "dense"  # at d = 20 a new run is planned dense
    kept = api.fit(config_from_dict(raw), store, "moments", client="local", dry_run=True)
    assert kept["plan"]["statistics"] == {"basic": None, "sketch": {"rank": 12, "second": {}}}
    assert kept["plan"]["choice"] is None and "as the store holds them" in " ".join(kept["plan"]["notes"])


def _tensor_section(d: int, k: int, m: int) -> dict:
    """A second pass as the tensor learn asks for it (``_pass_request``'s shapes: a k-row basis, 2k directions in
    its coordinates, one expansion of k eigenpairs per output), with values."""
    rng = np.random.default_rng(k)
    one = {"t0": 0.1, "t1": [0.0] * d, "t2_vectors": rng.standard_normal((k, d)).tolist(), "t2_values": [0.5] * k}
    return {
        "basis": rng.standard_normal((k, d)).tolist(),
        "orders": [3, 4, 5, 6],
        "directions": rng.standard_normal((max(8, 2 * k), k)).tolist(),
        "expansion": [one] * m if m > 1 else one,
    }


@pytest.mark.parametrize("d,width,m,k", [(20, 7, 1, 7), (61, 16, 10, 16), (40, None, 3, 40)])
def test_the_tensor_plan_projects_the_second_pass_in_the_subspace(d, width, m, k):
    """``fit --method tensor`` always runs a second pass (``projected_contracted`` in the k-dimensional subspace):
    the plan projects it, priced as the pass the learn asks for, at k = width (or d, the most it reads, when no
    width is given), and counts it in the projected total (it was missing: plans 4× short on trained networks)."""
    raw = {"seed": 1, "samples": 1_000_000, "chunk_size": 50_000}
    raw["source"] = {"d": d, "teacher": {"kind": "two_layer", "width": 5, "outputs": m}}
    plan = plan_run(
        config_from_dict(raw), "tensor", width=width, workers=1, rates=RATES, extra={"outputs": m}, outputs=m
    )
    assert [(p.name, p.optional) for p in plan.passes] == [("estimate", False), ("tensor-1", False)]
    second = plan.passes[1]
    assert [f.name for f in second.families] == ["projected_contracted"]
    real = family_work("projected_contracted", _tensor_section(d, k, m), d, m)
    assert second.families[0].seconds_per_sample == pytest.approx(RATES.seconds(real), rel=1e-12)
    assert second.families[0].partial_bytes == 8 * sum(
        sums_entries({"projected_contracted": _tensor_section(d, k, m)}, d, m)["projected_contracted"]
    )
    passes = sum(p.projected_seconds for p in plan.passes)
    assert plan.learn is not None and plan.projected_seconds == pytest.approx(passes + plan.learn.seconds)


def test_the_tensor_plan_projects_the_full_hermite_tensors_for_a_width_past_d_and_no_pass_on_the_outputs_route():
    wide = plan_run(cfg_of(10), "tensor", width=32, workers=1, rates=RATES)
    assert [p.name for p in wide.passes] == ["estimate", "tensor-lifted"]
    assert [f.form for f in wide.passes[1].families] == ["hermite dense"]
    assert wide.passes[1].families[0].flops_per_sample == family_work("hermite", {"max_order": 6}, 10).flops
    raw = {"seed": 1, "samples": 1_000_000, "chunk_size": 50_000}
    raw["source"] = {"d": 784, "teacher": {"kind": "two_layer", "width": 5, "outputs": 10}}
    outputs = plan_run(config_from_dict(raw), "tensor", workers=1, rates=RATES, extra={"outputs": 10}, outputs=10)
    assert [p.name for p in outputs.passes] == ["estimate"]


def test_where_the_tensor_run_goes_is_chosen_by_its_first_pass_and_the_plan_states_the_learns_costs():
    """The learn chooses where its own pass runs (a cluster only for one that pays for its start): the plan's
    choice of this process or a local cluster is the first pass's, as before the second pass was projected; the
    notes state the learn's bounded sample and, with one output, the refinement's passes over the samples; the
    learn's steps are priced and added to the passes' time (the refinement only to the bound)."""
    cfg = cfg_of(40, 2_000_000)
    plan = plan_run(cfg, "tensor", workers=2, rates=RATES, choose_where=True)
    first = plan_run(
        cfg_of(40, 2_000_000, {"basic": {}, "contracted": plan.statistics["contracted"]}),
        "tensor",
        workers=2,
        rates=RATES,
        choose_where=True,
    )
    assert [p.name for p in plan.passes] == ["estimate", "tensor-1"]
    assert (plan.runs_in, plan.runs_in_reason) == (first.runs_in, first.runs_in_reason)
    # 1,721 unknowns: 20,000 training rows (10 an unknown, at least 20,000) and 17,210 validation rows
    assert any(n.startswith("the learn after the passes draws 37,210 bounded samples") for n in plan.notes)
    assert any("up to 40 passes over the 2,000,000 samples" in n for n in plan.notes)
    learn = plan.learn
    names = [s[0] for s in learn.steps] if learn is not None else []
    assert learn is not None and names == ["decomposition", "residual rounds", "normal matrix", "polish", "refinement"]
    passes = sum(p.projected_seconds for p in plan.passes)
    assert plan.projected_seconds == pytest.approx(passes + learn.seconds, rel=1e-12)
    assert plan.projected_seconds_max == pytest.approx(passes + learn.seconds_max, rel=1e-12)
    rounds, refinement = learn.steps[1], learn.steps[4]
    assert rounds[3] == 0 and rounds[4] == 4  # noiseless labels the network misses: in the bound only
    assert refinement[3] == 0 and refinement[4] == 40 and learn.seconds_max > learn.seconds + 39 * refinement[2]
    assert any(line.startswith("polish ") for line in plan.lines())
    assert "learning after the passes is not projected" not in plan.lines()


def test_the_memory_of_the_tensor_second_pass_is_left_to_the_learn_that_knows_its_subspace(monkeypatch):
    """Without a width the second pass is projected at k = d, an upper bound: a machine that holds the first pass
    but not that bound is not refused by the plan (the pass's memory is checked when the learn asks for it)."""
    import relulearn.pipeline.sizes as sizes

    raw = {"seed": 1, "samples": 1_000_000, "chunk_size": 50_000}
    raw["source"] = {"d": 60, "teacher": {"kind": "two_layer", "width": 5, "outputs": 10}}
    cfg = config_from_dict(raw)
    free = plan_run(cfg, "tensor", workers=1, rates=RATES, extra={"outputs": 10}, outputs=10)
    first, second = free.passes
    assert second.worker_bytes > 10 * first.worker_bytes
    monkeypatch.setattr(sizes, "machine_memory", lambda: 2 * first.worker_bytes + first.driver_bytes)
    kept = plan_run(cfg, "tensor", workers=1, rates=RATES, extra={"outputs": 10}, outputs=10)
    assert [p.name for p in kept.passes] == ["estimate", "tensor-1"]
