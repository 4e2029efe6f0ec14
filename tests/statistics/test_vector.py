"""Vector-output teachers ``A = U f(V x) + e`` and per-output statistics (docs/design.md §3, §5).

1. the planted ``two_layer`` teacher has the promised structure, and its config errors name the key;
2. ``output_moments`` matches the closed forms for relu, relu2, relu3 with non-unit rows of V
   (``T1``, ``T2``, ``A``, ``AA``), within its stored standard errors, which are calibrated;
3. every per-output family of a vector source is, bit for bit, the scalar family of that output:
   the run with ``source.output = j`` when noiseless, and the scalar source of column j
   (:class:`OutputColumn`) with noise (noise is drawn per batch with shape (rows, m), so the
   scalar source ``output = j`` has other noise draws than column j of the vector source);
4. ``output_moments`` and per-output families at d = 20 are bitwise equal in-process, on one
   and on two worker processes, and after interruptions (SIGTERM) and resumes; merge and status work.
"""

from __future__ import annotations

import math
import os
import signal

import numpy as np
import pytest
from scipy.special import gamma
from stores import assert_bitwise_equal, residual_section, store_arrays

from relulearn import open_store
from relulearn.api import estimate, merge, status
from relulearn.config import ConfigError, config_from_dict
from relulearn.network import RELU_POWERS
from relulearn.pipeline.families import build_statistics
from relulearn.pipeline.sources import OutputColumn, SourceDataError, Stream, check_finite, draw, make_source
from relulearn.pipeline.stats.partial import accumulate_chunks
from relulearn.pipeline.stats.per_output import PerOutput


def run_config(
    d: int,
    teacher: dict,
    statistics: dict,
    *,
    seed: int = 5,
    samples: int = 20_000,
    chunk_size: int = 2_000,
    noise_std: float = 0.0,
    output: int | None = None,
    per_block: int = 2,
):
    source = {"d": d, "teacher": teacher, "noise_std": noise_std}
    if output is not None:
        source["output"] = output
    return config_from_dict(
        {
            "seed": seed,
            "samples": samples,
            "chunk_size": chunk_size,
            "source": source,
            "statistics": statistics,
            "run": {"chunks_per_block": per_block, "commit_interval": 0},
        }
    )


# ============================================================ 1. the teacher and its config


def test_planted_two_layer_structure():
    teacher = {
        "kind": "two_layer",
        "width": 5,
        "outputs": 4,
        "activation": "relu3",
        "weights_seed": 7,
        "v_norms": [0.5, 2.0],
        "output_rank": 2,
    }
    source = make_source(run_config(9, teacher, {"basic": {}}))
    V, U = source.network.weights
    assert source.network.activation == "relu3" and V.shape == (5, 9) and U.shape == (4, 5)
    norms = np.linalg.norm(V, axis=1)
    assert np.all((norms >= 0.5) & (norms <= 2.0)) and np.ptp(norms) > 0.3
    assert np.linalg.matrix_rank(U) == 2
    np.testing.assert_array_equal(U[:, -1], -U[:, 0])  # the antipodal pair
    cos = (U.T @ U) / np.outer(np.linalg.norm(U, axis=0), np.linalg.norm(U, axis=0))
    assert np.all(cos[np.triu_indices(5, 1)] < 1 - 1e-6)  # no two columns positively parallel
    assert source.outputs == 4
    x, y = draw(source, 3, Stream.TEST, 5000)
    assert y.shape == (5000, 4)
    np.testing.assert_array_equal(y, source.network.forward(x))
    # full rank by default, one output selected, and a one-output teacher: scalar labels
    full = make_source(run_config(9, dict(teacher, output_rank=None), {"basic": {}})).network.weights[1]
    assert np.linalg.matrix_rank(full) == 4
    assert make_source(run_config(9, teacher, {"basic": {}}, output=2)).outputs is None
    one = make_source(run_config(9, dict(teacher, outputs=1, output_rank=None), {"basic": {}}, noise_std=0.1))
    assert one.outputs is None and draw(one, 3, Stream.TEST, 100)[1].shape == (100,)


@pytest.mark.parametrize(
    "teacher, needles",
    [
        (
            {"kind": "two_layer", "width": 3, "outputs": 2, "output_rnak": 1},
            ["unknown key 'source.teacher.output_rnak'", "did you mean 'output_rank'?"],
        ),
        ({"kind": "two_layer", "widht": 3, "outputs": 2}, ["did you mean 'width'?"]),
        (
            {"kind": "two_layer", "width": 3, "outputs": 2, "output_rank": 3},
            ["output_rank is 3", "min(outputs, width) = 2"],
        ),
        ({"kind": "two_layer", "width": 3, "outputs": 2, "v_norms": [2.0, 1.0]}, ["v_norms", "0 < lo <= hi"]),
        ({"kind": "two_layer", "width": 3, "outputs": 2, "activation": "tanh"}, ["source.teacher.activation"]),
    ],
)
def test_two_layer_config_errors_name_the_key(teacher, needles):
    with pytest.raises(ConfigError) as err:
        run_config(4, teacher, {"basic": {}})
    assert all(n in str(err.value) for n in needles), str(err.value)


def test_two_layer_config_round_trips():
    cfg = run_config(
        4,
        {"kind": "two_layer", "width": 3, "outputs": 3, "output_rank": 2, "activation": "relu2"},
        {"basic": {}, "output_moments": {}},
    )
    assert config_from_dict(cfg.to_dict()) == cfg
    assert list(cfg.statistics.enabled()) == ["basic", "output_moments"]


def test_check_finite_names_the_output():
    x, y = np.zeros((10, 3)), np.zeros((10, 4))
    y[7, 2] = np.inf
    with pytest.raises(SourceDataError, match=r"inf in label y \(output 2 of 4\) at chunk 3, row 4103"):
        check_finite(x, y, 3, 4096)


# ================================================================ 2. closed forms


def abs_moment(p: float) -> float:
    """``E|z|^p`` for a standard normal z."""
    return 2 ** (p / 2) * gamma((p + 1) / 2) / math.sqrt(math.pi)


def arccos_kernel(c: int, rho: np.ndarray) -> np.ndarray:
    """``E[relu(z1)^c relu(z2)^c]`` for standard normals of correlation ρ (Cho–Saul ``J_c(θ)/2π``)."""
    t = np.arccos(np.clip(rho, -1.0, 1.0))
    s, co = np.sin(t), np.cos(t)
    j = {
        1: s + (np.pi - t) * co,
        2: 3 * s * co + (np.pi - t) * (1 + 2 * co**2),
        3: 4 * s**3 + 15 * s * co**2 + (np.pi - t) * (9 * s**2 * co + 15 * co**3),
    }[c]
    return j / (2 * np.pi)


def output_moments_truth(network, noise_std: float) -> dict[str, np.ndarray]:
    """Population ``A, AA, T1, T2`` of ``A = U f(V x) + e``, ``f = max(z, 0)^c``: with
    ``ν_i = v_i/|v_i|``, ``f(<v_i, x>) = |v_i|^c relu(<ν_i, x>)^c``."""
    V, U = network.weights
    c = RELU_POWERS[network.activation]
    norms = np.linalg.norm(V, axis=1)
    nu, s = V / norms[:, None], norms**c
    k1 = 0.5 * abs_moment(c + 1)  # E[relu(z)^c z]
    k2 = 0.5 * (abs_moment(c + 2) - abs_moment(c))  # E[relu(z)^c (z² − 1)]
    us = U * s
    return {
        "A": us @ np.full(len(s), 0.5 * abs_moment(c)),
        "AA": us @ arccos_kernel(c, nu @ nu.T) @ us.T + noise_std**2 * np.eye(U.shape[0]),
        "T1": k1 * us @ nu,
        "T2": k2 * np.einsum("ji,ia,ib->jab", us, nu, nu),
    }


def test_output_moments_match_closed_forms(tmp_path):
    """relu, relu2, relu3 with row norms of V in [0.4, 1.6], noise on one: every entry of
    A, AA, T1, T2 within 5 stored SEs of the truth, and the z-scores have spread ≈ 1."""
    zs = []
    for c, (act, noise) in enumerate((("relu", 0.3), ("relu2", 0.0), ("relu3", 0.0))):
        teacher = {
            "kind": "two_layer",
            "width": 3,
            "outputs": 3,
            "activation": act,
            "weights_seed": 11 + c,
            "v_norms": [0.4, 1.6],
        }
        cfg = run_config(
            8,
            teacher,
            {"output_moments": {}},
            seed=40 + c,
            samples=300_000,
            chunk_size=5_000,
            noise_std=noise,
            per_block=6,
        )
        url = str(tmp_path / f"{act}.zarr")
        estimate(cfg, url, client="local", progress=None, commit_interval=1e9)
        arrays = open_store(url).arrays("output_moments")
        assert arrays["count"] == 300_000
        truth = output_moments_truth(make_source(cfg).network, noise)
        iu = np.triu_indices(8)
        for name, t in truth.items():
            est, se = arrays[name], arrays[f"{name}_se"]
            assert est.shape == t.shape and np.all(se > 0), name
            z = (est - t) / se
            z = z[:, iu[0], iu[1]] if name == "T2" else z[np.triu_indices(3)] if name == "AA" else z
            assert np.max(np.abs(z)) < 5, f"{act} {name}: max |z| = {np.max(np.abs(z)):.2f}"
            zs.append(z.ravel())
        # the truth is far from zero: a wrong factor or power of |v| could not pass
        assert np.max(np.abs(truth["T2"])) > 20 * np.max(arrays["T2_se"])
    z = np.concatenate(zs)
    assert 0.7 < np.sqrt(np.mean(z**2)) < 1.3, f"z-scores have rms {np.sqrt(np.mean(z**2)):.2f}"


# ======================================================== 3. per output ≡ scalar, bitwise

D = 6
TEACHER = {"kind": "two_layer", "width": 3, "outputs": 2, "activation": "relu", "weights_seed": 2}
ALL_FAMILIES = {
    "basic": {},
    "hermite": {"max_order": 3},
    "contracted": {"orders": [2, 4], "directions": 2},
    "filtered": {"quantiles": [0.5, 0.9], "pilot_samples": 10_000},
    "residual": residual_section(D),
}


def test_per_output_families_equal_the_scalar_runs_of_each_output(tmp_path):
    """Noiseless: the store of the vector source holds, at ``output = j`` of every array, the
    bits the run with ``source.output = j`` stores (τ grids from each output's pilot quantiles
    stacked along ``output``; shared coordinates stored once)."""
    vec_url = str(tmp_path / "vector.zarr")
    estimate(run_config(D, TEACHER, ALL_FAMILIES), vec_url, client="local", progress=None, commit_interval=1e9)
    vec = open_store(vec_url)
    assert vec.statistics == ["basic", "hermite", "contracted", "filtered", "residual"]
    for j in range(2):
        url = str(tmp_path / f"output{j}.zarr")
        estimate(
            run_config(D, TEACHER, ALL_FAMILIES, output=j), url, client="local", progress=None, commit_interval=1e9
        )
        scalar = open_store(url)
        for stat in scalar.statistics:
            v_arrays, s_arrays = vec.arrays(stat), scalar.arrays(stat)
            v_ds, s_ds = vec.dataset(stat), scalar.dataset(stat)
            assert set(v_arrays) == set(s_arrays) | {"output"}, stat
            for k, s in s_arrays.items():
                v = v_arrays[k]
                if v_ds[k].dims[:1] == ("output",):
                    assert v_ds[k].dims[1:] == s_ds[k].dims, f"{stat}/{k}"
                    v = v[j]
                else:
                    assert v_ds[k].dims == s_ds[k].dims, f"{stat}/{k}"
                assert v.shape == s.shape and np.array_equal(v, s, equal_nan=True), f"{stat}/{k}, output {j}"
    # the τ grids differ between outputs (their own quantiles); the direction bank is shared
    for stat in ("filtered", "residual"):
        tau = vec.arrays(stat)["tau"]
        assert tau.shape[0] == 2 and not np.array_equal(tau[0], tau[1])
    assert vec.dataset("contracted")["direction"].dims == ("direction", "i")
    assert vec.dataset("basic")["xx"].dims == ("output", "i", "j")


def test_per_output_families_with_noise_equal_the_scalar_source_of_each_column():
    """With noise: per-output sums, error terms, estimates and τ grids of the vector source are
    those of the scalar source ``(x, y[:, j])`` (:class:`OutputColumn`), bit for bit."""
    cfg = run_config(D, TEACHER, ALL_FAMILIES, noise_std=0.2)
    source = make_source(cfg)
    stats = build_statistics(cfg, source)
    assert all(isinstance(s, PerOutput) and s.outputs == 2 for s in stats)
    part = accumulate_chunks(stats, source, cfg.seed, cfg.chunk_size, 0, 3)
    for j in range(2):
        column = OutputColumn(source, j)
        stats_j = build_statistics(cfg, column)
        part_j = accumulate_chunks(stats_j, column, cfg.seed, cfg.chunk_size, 0, 3)
        for s, s_j in zip(stats, stats_j):
            for k, v in part_j.sums[s.name].items():
                assert np.array_equal(part.sums[s.name][k][j], v), f"{s.name} sum_{k}, output {j}"
            for k, v in part_j.sumsq[s.name].items():
                assert np.array_equal(part.sumsq[s.name][k][j], v), f"{s.name} sumsq_{k}, output {j}"
            est = s.finalize(part.sums[s.name], part.sumsq[s.name], 3, cfg.chunk_size)
            for k, e in s_j.finalize(part_j.sums[s.name], part_j.sumsq[s.name], 3, cfg.chunk_size).items():
                assert np.array_equal(est[k].mean[j], e.mean) and np.array_equal(est[k].se[j], e.se), k
            coords = s.coords()
            for k, (_dims, c) in s_j.coords().items():
                stacked = coords[k][0][:1] == ("output",)
                assert np.array_equal(coords[k][1][j] if stacked else coords[k][1], c), f"{s.name}/{k}"


# =================================================== 4. clusters, resume, merge, status


def arrays_in(obj, seen=None) -> list[np.ndarray]:
    """Every numpy array reachable from ``obj`` through lists, tuples, dicts and attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type(None))):
        return []
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return [obj]
    items = (
        obj.values()
        if isinstance(obj, dict)
        else obj
        if isinstance(obj, (list, tuple))
        else vars(obj).values()
        if hasattr(obj, "__dict__")
        else ()
    )
    return [a for v in items for a in arrays_in(v, seen)]


def test_tasks_compute_with_aligned_copies_of_per_output_statistics():
    """What a block task computes with (docs/design.md §4): every array of the per-output
    statistics (each output's τ grids, bases, candidates) and of the source, freshly aligned."""
    from transport import unaligned

    from relulearn.aligned import fresh, is_aligned

    cfg = run_config(20, TEACHER, dict(ALL_FAMILIES, residual=residual_section(20), output_moments={}))
    source = make_source(cfg)
    stats = build_statistics(cfg, source)
    filtered = next(s for s in stats if s.name == "filtered")
    for inner in filtered.inner:  # as a worker may receive them
        inner.tau = unaligned(inner.tau)
    new = fresh((stats, source))
    found = arrays_in(new)
    assert len(found) >= 10 and all(is_aligned(a) for a in found)  # shared arrays stay shared
    new_taus = [s.tau for s in next(s for s in new[0] if s.name == "filtered").inner]
    assert all(np.array_equal(a, b.tau) for a, b in zip(new_taus, filtered.inner))


VECTOR_D20 = dict(
    d=20,
    teacher={"kind": "two_layer", "width": 4, "outputs": 3, "activation": "relu2", "weights_seed": 3, "output_rank": 2},
    statistics={"basic": {}, "output_moments": {}, "filtered": {"quantiles": [0.5, 0.9], "pilot_samples": 10_000}},
    seed=21,
    samples=48_000,
    chunk_size=4_000,
    noise_std=0.1,
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    """The uninterrupted in-process run of VECTOR_D20."""
    url = str(tmp_path_factory.mktemp("vector") / "ref.zarr")
    estimate(run_config(**VECTOR_D20), url, client="local", progress=None, commit_interval=1e9)
    return url


def test_one_and_two_workers_equal_in_process(reference, client, tmp_path):
    cfg = run_config(**VECTOR_D20)
    two = str(tmp_path / "two.zarr")
    estimate(cfg, two, client=client, progress=None)
    assert_bitwise_equal(two, reference)
    one = str(tmp_path / "one.zarr")
    estimate(cfg, one, workers=1, progress=None)
    assert_bitwise_equal(one, reference)
    arrays = store_arrays(reference)
    assert arrays["output_moments/T2"].shape == (3, 20, 20) and np.all(arrays["output_moments/T2_se"] > 0)


class StopOnFirstWrite:
    """A terminal-like progress stream that sends SIGTERM to this process (as a batch system
    stopping the job would) when the first progress line appears: right after the run merged
    its first block, while ``estimate``'s own SIGTERM handler (commit, then stop) is installed."""

    def __init__(self) -> None:
        self.sent = False
        self.outside = signal.getsignal(signal.SIGTERM)

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> None:
        if not self.sent:
            self.sent = True
            if signal.getsignal(signal.SIGTERM) is self.outside:  # never kill the test process itself
                raise RuntimeError("estimate's SIGTERM handler is not installed while blocks are merged")
            os.kill(os.getpid(), signal.SIGTERM)

    def flush(self) -> None:
        pass


def test_interrupted_and_resumed_equals_uninterrupted(reference, tmp_path):
    """Each attempt merges one block, is stopped (SIGTERM), commits it, and the next resumes from
    the store (statistics rebuilt from the stored per-output τ grids): the final bits are those
    of the uninterrupted run."""
    cfg = run_config(**VECTOR_D20)
    url, done = str(tmp_path / "resumed.zarr"), []
    while not done or done[-1] < cfg.samples:
        with pytest.raises(KeyboardInterrupt):
            estimate(cfg, url, client="local", progress=StopOnFirstWrite())
        done.append(open_store(url).samples)
    assert done == list(range(8_000, 48_001, 8_000))  # one block of two chunks per attempt
    assert_bitwise_equal(url, reference)


def test_merge_and_status_of_vector_runs(tmp_path):
    """Two seeds of one vector source merge into their summed sums; status reports the run."""
    spec = dict(
        VECTOR_D20,
        d=8,
        samples=8_000,
        chunk_size=2_000,
        statistics={"basic": {}, "output_moments": {}, "filtered": {"thresholds": [0.5, 1.0]}},
    )
    urls = [str(tmp_path / f"s{seed}.zarr") for seed in (1, 2)]
    for seed, url in zip((1, 2), urls):
        estimate(run_config(**dict(spec, seed=seed)), url, client="local", progress=None)
    out = str(tmp_path / "merged.zarr")
    assert merge(*urls, out)["samples"] == 16_000
    a, b, m = (store_arrays(u) for u in (*urls, out))
    for k in a:
        if "/sum_" in k:
            assert np.array_equal(m[k], a[k] + b[k]), k
    assert m["filtered/tau"].shape == (2,)  # given thresholds: one grid for all outputs
    assert m["output_moments/A"].shape == (3,) and m["basic/yx"].shape == (3, 8)
    info = status(out)
    assert info["samples"] == 16_000 and info["seeds"] == [1, 2]
    assert info["statistics"] == ["basic", "output_moments", "filtered"]
