"""The ``projected_contracted`` family: the contracted matrices of ``z = B x`` for directions g of the subspace.

For orthonormal rows ``B`` (k × d) every sample's summand is the full family's along the lifted direction
``Bᵀg``, restricted to the subspace: ``M_proj(g) = B M_full(Bᵀg) Bᵀ``, ``v_proj(g) = B v_full(Bᵀg)``,
``s_proj(g) = s_full(Bᵀg)``. The tests check that identity on the same samples (both families in one run, so
the two differ by rounding only), the estimates against the closed form within their standard errors at
d = 24, a label vector (one set per output), the planner's price and partial size, and the store's xarray view.
"""

from __future__ import annotations

import numpy as np
import pytest
from stores import assert_bitwise_equal

import relulearn
from relulearn.config import config_from_dict
from relulearn.pipeline.cost import Rates, family_work, sums_entries
from relulearn.pipeline.families import build_statistics
from relulearn.pipeline.plan import partial_bytes
from relulearn.pipeline.run import estimate
from relulearn.pipeline.sources import make_source
from relulearn.runplan import plan_run

from conftest import make_config
from test_statistics import (
    assert_powerful,
    check_within,
    contracted_truth,
    run_config,
    run_in_process,
    teacher_units,
    unit_rows,
)

D, K = 24, 4
ORDERS = [2, 3, 4]
RNG = np.random.default_rng(20261207)
U = unit_rows(RNG, 3, D)
LAM = [1.0, -0.8, 0.6]
# a subspace holding two of the teacher's units, and two random axes
B = np.linalg.qr(np.vstack([U[:2], RNG.standard_normal((2, D))]).T)[0].T.copy()
# directions of the subspace: the first unit seen in it, and two random ones
G = np.vstack([B @ U[0], RNG.standard_normal((2, K))])
G = G / np.linalg.norm(G, axis=1, keepdims=True)
RATES = Rates(peak=4e10, half=25.0, memory=1.5e10, normals=9e7, disk=1e9)


def _statistics(basis: np.ndarray, g: np.ndarray) -> dict:
    """Both families on the same samples: the full one along the lifted directions Bᵀg, the projected one."""
    return {
        "basic": None,
        "contracted": {"orders": ORDERS, "directions": (g @ basis).tolist()},
        "projected_contracted": {"basis": basis.tolist(), "orders": ORDERS, "directions": g.tolist()},
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = run_config(
        seed=11,
        samples=200_000,
        chunk_size=2_000,
        d=D,
        teacher={"kind": "one_hidden_relu", "width": 3, "weights": U.tolist(), "output_weights": LAM},
        statistics=_statistics(B, G),
    )
    return cfg, run_in_process(cfg, tmp_path_factory.mktemp("projected") / "store")


def _lifted(full: dict[str, np.ndarray], basis: np.ndarray) -> dict[str, np.ndarray]:
    """The full family's estimates restricted to the subspace: B M Bᵀ, B v, s (a leading output axis kept)."""
    return {
        "M": np.einsum("ai,...ij,bj->...ab", basis, full["M"], basis),
        "v": np.einsum("ai,...i->...a", basis, full["v"]),
        "s": full["s"],
    }


def test_projected_matrices_are_the_full_family_along_the_lifted_directions_on_the_same_samples(run):
    _, store = run
    arrays = store.arrays("projected_contracted")
    np.testing.assert_allclose(arrays["basis"], B, rtol=0, atol=0)
    np.testing.assert_allclose(arrays["direction"], G, rtol=1e-15)
    full = {name: store.estimate("contracted", name)[0] for name in ("M", "v", "s")}
    for name, want in _lifted(full, B).items():
        got = store.estimate("projected_contracted", name)[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * float(np.abs(want).max()), err_msg=name)


def test_projected_matrices_match_the_closed_form_within_their_standard_errors(run):
    cfg, store = run
    lam, units = teacher_units(make_source(cfg))
    arrays = store.arrays("projected_contracted")
    # the teacher seen in the subspace: rows B u_i (not unit), the same closed form in k coordinates
    truth = contracted_truth(lam, units @ B.T, arrays["direction"], arrays["pair_order"], arrays["pair_direction"])
    for name in ("M", "v", "s"):
        mean, se = store.estimate("projected_contracted", name)
        check_within(f"projected_contracted.{name}", mean, se, truth[name])
        assert_powerful(f"projected_contracted.{name}", truth[name], se)


def test_a_label_vector_has_one_set_per_output(tmp_path):
    d = 20
    basis = np.linalg.qr(RNG.standard_normal((d, K)))[0].T.copy()
    cfg = run_config(
        seed=3,
        samples=20_000,
        chunk_size=2_000,
        d=d,
        teacher={"kind": "two_layer", "width": 3, "outputs": 2},
        statistics=_statistics(basis, G),
    )
    store = run_in_process(cfg, tmp_path / "store")
    p = len(ORDERS) * len(G)
    full = {name: store.estimate("contracted", name)[0] for name in ("M", "v", "s")}
    for name, want in _lifted(full, basis).items():
        got = store.estimate("projected_contracted", name)[0]
        assert got.shape == {"M": (2, p, K, K), "v": (2, p, K), "s": (2, p)}[name]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * float(np.abs(want).max()), err_msg=name)


def _expansion(rng, d: int, basis: np.ndarray) -> dict:
    """A degree-≤2 expansion in the full x: its T_2 of low rank inside the subspace, as the tensor method asks."""
    theta, q = np.linalg.eigh(np.diag(rng.standard_normal(len(basis))))
    return {
        "t0": float(rng.standard_normal()),
        "t1": (0.3 * rng.standard_normal(d)).tolist(),
        "t2_vectors": (q.T @ basis).tolist(),
        "t2_values": (0.4 * theta).tolist(),
    }


def _with_expansion(statistics: dict, expansion) -> dict:
    """Both families of ``statistics`` on the same residual labels."""
    return {k: v if v is None else {**v, "expansion": expansion} for k, v in statistics.items()}


@pytest.mark.parametrize("outputs", [None, 3])
def test_with_an_expansion_the_projected_matrices_are_the_full_familys_on_the_same_residual_labels(tmp_path, outputs):
    d = 21
    rng = np.random.default_rng(5)
    basis = np.linalg.qr(rng.standard_normal((d, K)))[0].T.copy()
    expansion = _expansion(rng, d, basis) if outputs is None else [_expansion(rng, d, basis) for _ in range(outputs)]
    teacher = (
        {"kind": "one_hidden_relu", "width": 3}
        if outputs is None
        else {"kind": "two_layer", "width": 3, "outputs": outputs}
    )
    cfg = run_config(
        seed=8,
        samples=12_000,
        chunk_size=2_000,
        d=d,
        teacher=teacher,
        statistics=_with_expansion(_statistics(basis, G), expansion),
    )
    store = run_in_process(cfg, tmp_path / "store")
    full = {name: store.estimate("contracted", name)[0] for name in ("M", "v", "s")}
    for name, want in _lifted(full, basis).items():
        got = store.estimate("projected_contracted", name)[0]
        assert got.shape[0] == (outputs or got.shape[0])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * float(np.abs(want).max()), err_msg=name)
    # the residual labels differ from the raw ones: the expansion was subtracted
    raw = run_in_process(
        run_config(seed=8, samples=12_000, chunk_size=2_000, d=d, teacher=teacher, statistics=_statistics(basis, G)),
        tmp_path / "raw",
    )
    assert not np.allclose(raw.estimate("projected_contracted", "s")[0], store.estimate("projected_contracted", "s")[0])


@pytest.mark.parametrize("m", [3, None])
def test_with_an_expansion_the_same_bits_are_stored_in_process_and_on_one_or_two_workers(tmp_path, client, m):
    from distributed import Client, LocalCluster

    d = 22
    rng = np.random.default_rng(9)
    basis = np.linalg.qr(rng.standard_normal((d, K)))[0].T.copy()
    section = {
        "basis": basis.tolist(),
        "orders": [3, 4, 5, 6],
        "directions": G.tolist(),
        "expansion": _expansion(rng, d, basis) if m is None else [_expansion(rng, d, basis) for _ in range(m)],
    }
    teacher = {"kind": "one_hidden_relu", "width": 3} if m is None else {"kind": "two_layer", "width": 3, "outputs": m}
    cfg = make_config(
        seed=4,
        samples=24_000,
        chunk_size=2_000,
        source={"d": d, "teacher": teacher},
        statistics={"basic": None, "projected_contracted": section},
        run={"chunks_per_block": 2, "commit_interval": 3600},
    )
    ref = str(tmp_path / "local")
    estimate(cfg, ref, client=None, progress=None)
    estimate(cfg, str(tmp_path / "two"), client=client, progress=None)
    assert_bitwise_equal(str(tmp_path / "two"), ref)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40) as one,
        Client(one) as c,
    ):
        estimate(cfg, str(tmp_path / "one"), client=c, progress=None)
    assert_bitwise_equal(str(tmp_path / "one"), ref)


def test_the_planner_prices_one_projection_and_one_gemm_for_all_outputs():
    section = {"basis": B.tolist(), "orders": ORDERS, "directions": 5}
    mp = 2 * len(ORDERS) * 5
    work = family_work("projected_contracted", section, D, outputs=2)
    want = 2.0 * D * K + 2.0 * K * 5 + mp * K * (K + 1) + 4.0 * mp * K
    assert work.flops == pytest.approx(want, rel=1e-15)
    # an expansion adds the residual labels' GEMM: x [t1 | V] of every output
    rng = np.random.default_rng(1)
    expanded = {**section, "expansion": [_expansion(rng, D, B) for _ in range(2)]}
    assert family_work("projected_contracted", expanded, D, outputs=2).flops == pytest.approx(
        want + 2.0 * D * (2 + 2 * K), rel=1e-15
    )
    cfg = config_from_dict(
        {
            "seed": 1,
            "samples": 1_000_000,
            "chunk_size": 50_000,
            "source": {"d": D, "teacher": {"kind": "one_hidden_relu", "width": 4}},
            "statistics": {"basic": None, "projected_contracted": section},
        }
    )
    # the model's partial is the built statistic's, to the byte
    model = {k: 8 * (a + b) for k, (a, b) in sums_entries(cfg.statistics, D).items()}
    assert model == partial_bytes(build_statistics(cfg, make_source(cfg)))
    plan = plan_run(cfg, None, workers=1, rates=RATES)
    (family,) = plan.passes[0].families
    assert (family.name, family.form) == ("projected_contracted", "projected_contracted dense")
    assert family.flops_per_sample == pytest.approx(family_work("projected_contracted", section, D).flops)


def test_the_xarray_view_describes_every_array(run):
    _, store = run
    tree = relulearn.open_datatree(store.url)
    ds = tree["projected_contracted"].dataset
    assert {"M", "M_se", "v", "s", "direction", "basis", "pair_order"} <= set(ds.variables)
    for name, var in ds.variables.items():
        assert var.attrs.get("long_name") and var.attrs.get("description"), name
        assert not var.attrs["description"].startswith(("array ", "dimension ")), (name, var.attrs)
    assert "subspace" in ds["M"].attrs["long_name"]
    assert ds["M"].dims == ("pair", "rank", "rank2") and ds["basis"].dims == ("rank", "i")
