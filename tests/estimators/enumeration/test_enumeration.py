"""Enumeration of one-hidden-layer ReLU networks inside a found subspace.

Planted networks ``y = Σ_i λ_i relu(<a_i, z>)`` with ``z ~ N(0, I_r)`` (the projected samples
the spectral stage hands over). Every case checks a truth — the recovered weights up to the
network's symmetries, the relative loss on fresh test samples, the noise floor — not only
that the search ran. All seeds are fixed.
"""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
import pytest

from relulearn.estimators.enumeration.network import enumerate_network
from relulearn.estimators.enumeration.relu_units import fit_units, score_candidates
from relulearn.estimators.enumeration.search import EnumerationResult, stage_cost
from relulearn.estimators.enumeration.sphere_nets import covering_radius, sphere_net
from relulearn.estimators.polish.dense import polish
from relulearn.network import Network, compare

# ------------------------------------------------------------------ helpers


def unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def on_circle(*angles: float) -> np.ndarray:
    return np.array([[np.cos(t), np.sin(t)] for t in angles])


def planted(k: int, r: int, seed: int, min_angle: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Random unit directions, pairwise at least ``min_angle`` apart, and mixed-sign weights."""
    rng = np.random.default_rng([seed, 99])
    while True:
        a = unit_rows(rng.standard_normal((k, r)))
        ang = np.arccos(np.clip(a @ a.T, -1, 1))
        np.fill_diagonal(ang, np.inf)
        if ang.min() >= min_angle:
            break
    lam = rng.uniform(0.5, 1.5, k) * rng.choice([-1.0, 1.0], k)
    return a, lam


def samples(a: np.ndarray, lam: np.ndarray, n: int, seed: int, sigma: float = 0.0):
    rng = np.random.default_rng([seed, 5])
    z = rng.standard_normal((n, a.shape[1]))
    y = np.maximum(z @ a.T, 0.0) @ lam
    return z, y + sigma * rng.standard_normal(n)


def rel_loss(net: Network, z: np.ndarray, y: np.ndarray) -> float:
    e = y - net.forward(z)[:, 0]
    return float(e @ e / (y @ y))


def learn(a, lam, *, n=30_000, sigma=0.0, k=None, budget=20_000, seed=1, **kw):
    """Train / held-out / test samples of a planted network, and the enumeration's result."""
    z, y = samples(a, lam, n, seed, sigma)
    zv, yv = samples(a, lam, 20_000, seed + 1000, sigma)
    zt, yt = samples(a, lam, 50_000, seed + 2000, sigma)
    res = enumerate_network(z, y, zv, yv, k=k or len(lam), budget=budget, **kw)
    return res, (z, y), (zv, yv), (zt, yt)


def truth(a, lam) -> Network:
    return Network((a, lam[None, :]))


# ------------------------------------------------------------------ nets of the sphere


def test_sphere_net_is_antipodal_unit_and_seeded():
    for r, count in [(1, 2), (2, 10), (3, 64), (5, 200)]:
        net = sphere_net(r, count, seed=3)
        assert net.shape == (count, r)
        np.testing.assert_allclose(np.linalg.norm(net, axis=1), 1.0, atol=1e-12)
        np.testing.assert_array_equal(net[count // 2 :], -net[: count // 2])  # both signs of every direction
        np.testing.assert_array_equal(net, sphere_net(r, count, seed=3))
    assert not np.array_equal(sphere_net(3, 64, seed=3), sphere_net(3, 64, seed=4))
    with pytest.raises(ValueError, match="even"):
        sphere_net(3, 63)


@pytest.mark.parametrize("r, count", [(2, 40), (3, 300), (4, 800), (5, 1500)])
def test_covering_radius_covers_random_points(r, count):
    net = sphere_net(r, count, seed=0)
    rad = covering_radius(net)
    g = unit_rows(np.random.default_rng([r, 17]).standard_normal((40_000, r)))
    worst = float(np.arccos(np.clip(g @ net.T, -1, 1)).min(axis=1).max())
    assert worst <= rad
    # and the radius is not a loose bound: random points come close to it
    assert worst >= 0.8 * rad
    if r == 2:
        assert rad == pytest.approx(np.pi / count, rel=1e-9)  # equally spaced points


def test_covering_radius_estimate_matches_exact_hull():
    net = sphere_net(4, 1000, seed=1)
    exact = covering_radius(net, exact=True)
    estimate = covering_radius(net, exact=False)
    assert 0.95 * exact <= estimate <= exact + 1e-12


# ------------------------------------------------------------------ scoring


def test_score_candidates_equals_direct_computation():
    rng = np.random.default_rng(4)
    z = rng.standard_normal((3000, 4))
    res = np.maximum(z @ rng.standard_normal(4), 0.0) - 0.3 * z[:, 1] + 0.1 * rng.standard_normal(3000)
    cand = unit_rows(rng.standard_normal((37, 4)))
    out = score_candidates((z, res, cand))
    assert out.shape == (37, 2)
    for b, a in enumerate(cand):
        phi = np.maximum(z @ a, 0.0)
        lam = (phi @ res) / (phi @ phi)
        reduction = res @ res - ((res - lam * phi) @ (res - lam * phi))
        assert out[b, 1] == pytest.approx(lam, rel=1e-12)
        assert out[b, 0] == pytest.approx(reduction, rel=1e-9)


def test_fit_units_converges_from_a_perturbed_start():
    a, lam = planted(3, 3, seed=2)
    z, y = samples(a, lam, 20_000, seed=2)
    rng = np.random.default_rng(2)
    start = unit_rows(a + 0.15 * rng.standard_normal(a.shape))
    fit = fit_units(z, y, start)
    assert fit.converged
    assert compare(truth(a, lam), Network((fit.directions, fit.weights[None]))).relative_error < 1e-10
    assert fit.loss < 1e-20


# ------------------------------------------------------------------ planted networks


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_planted_exact_recovery_then_polish(k):
    a, lam = planted(k, k, seed=k)
    res, (z, y), _, (zt, yt) = learn(a, lam, seed=k)
    net = res.network()
    err = compare(truth(a, lam), net).relative_error
    assert res.units == k
    assert err <= 1e-3
    assert rel_loss(net, zt, yt) <= 1e-6
    assert res.candidates_evaluated <= 20_000
    # the starting point is good enough for exact polishing (lifted as is: r = d)
    polished, report = polish(net, z, y)
    assert compare(truth(a, lam), polished).relative_error <= 1e-10
    assert report.relative_residual <= 1e-10


def test_clump_of_two_close_units():
    a = on_circle(0.3, 0.31, 2.3)  # units 0 and 1 at angle 1e-2
    lam = np.array([1.0, 0.8, -0.7])
    res, _, _, (zt, yt) = learn(a, lam)
    assert rel_loss(res.network(), zt, yt) <= 1e-4
    recovered = res.units == 3 and compare(truth(a, lam), res.network()).relative_error <= 1e-3
    if not recovered:  # then the clump must be named as merged
        centre = unit_rows(a[:1] + a[1:2])
        near = int(np.argmin(np.arccos(np.clip(res.directions @ centre[0], -1, 1))))
        assert any(g["into"] == near and g["angle_to_into"] < 0.05 for g in res.merged), res.merged


@pytest.mark.parametrize("r", [2, 3])
def test_near_cancellation(r):
    a = np.zeros((2, r))
    a[0, 0] = 1.0
    a[1, :2] = np.cos(0.3), np.sin(0.3)
    lam = np.array([1.0, -0.98])
    res, _, _, (zt, yt) = learn(a, lam)
    assert rel_loss(res.network(), zt, yt) <= 1e-4


def test_unit_with_hundredfold_smaller_weight_is_kept_by_the_heldout_loss():
    a = unit_rows(np.random.default_rng(5).standard_normal((3, 3)))
    lam = np.array([1.0, -0.8, 0.01])
    res, _, (zv, yv), (zt, yt) = learn(a, lam)
    assert rel_loss(res.network(), zt, yt) <= 1e-4
    cmp = compare(truth(a, lam), res.network())
    assert res.units == 3 and cmp.unit_errors[2] < 1e-3  # the small unit itself
    # the held-out loss is what kept it: the best 2-unit model is much worse
    two = [m for m in res.models if m["units"] == 2 and m["accepted"]]
    assert two and min(m["heldout_loss"] for m in two) > 1e3 * res.heldout_loss


def test_noise_floor():
    sigma = 0.1
    a, lam = planted(3, 3, seed=6)
    res, _, (zv, yv), (zt, yt) = learn(a, lam, n=50_000, sigma=sigma)
    floor_val = rel_loss(truth(a, lam), zv, yv)  # the true network's held-out loss
    floor_test = rel_loss(truth(a, lam), zt, yt)
    assert floor_val == pytest.approx(sigma**2 / np.mean(yv**2), rel=0.05)
    assert res.heldout_loss <= 1.1 * floor_val
    assert rel_loss(res.network(), zt, yt) <= 1.1 * floor_test
    assert res.units == 3


# ------------------------------------------------------------------ mapper, budget, result


def test_mapper_sees_batches_and_order_does_not_matter():
    a, lam = planted(2, 3, seed=8)
    calls: list[int] = []

    def counting(fn, iterable):
        items = list(iterable)
        assert fn is score_candidates
        for z, res, cand in items:
            assert isinstance(z, np.ndarray) and isinstance(res, np.ndarray) and isinstance(cand, np.ndarray)
            assert len(cand) <= 128
        calls.append(sum(len(item[2]) for item in items))
        return map(fn, items)

    def reversed_map(fn, iterable):
        return list(reversed(list(map(fn, reversed(list(iterable))))))

    base, *_ = learn(a, lam, batch=128, mapper=map)
    counted, *_ = learn(a, lam, batch=128, mapper=counting)
    shuffled, *_ = learn(a, lam, batch=128, mapper=reversed_map)
    assert calls and sum(calls) == counted.candidates_evaluated > 0
    for other in (counted, shuffled):
        np.testing.assert_array_equal(other.directions, base.directions)
        np.testing.assert_array_equal(other.weights, base.weights)
        assert other.heldout_loss == base.heldout_loss and other.to_dict() == base.to_dict()
    pickle.dumps(score_candidates)  # top level: a Dask client can ship it


def test_budget_too_small_says_which_budget_to_give():
    a, lam = planted(2, 4, seed=9)
    z, y = samples(a, lam, 5000, seed=9)
    zv, yv = samples(a, lam, 5000, seed=10)
    with pytest.raises(ValueError, match="budget") as info:
        enumerate_network(z, y, zv, yv, k=2, budget=100)
    need = int(re.search(r"give budget >= (\d+)", str(info.value)).group(1))
    assert need == stage_cost(4) > 100
    res = enumerate_network(z, y, zv, yv, k=2, budget=need)  # that budget is enough for one stage
    assert res.candidates_evaluated <= need and res.units >= 1


def test_result_to_dict_is_json():
    a, lam = planted(2, 2, seed=11)
    res, *_ = learn(a, lam, n=10_000)
    assert isinstance(res, EnumerationResult)
    d = json.loads(json.dumps(res.to_dict()))
    assert np.array_equal(np.array(d["directions"]), res.directions)
    assert d["candidates_evaluated"] == res.candidates_evaluated
    assert all({"stage", "net", "scale"} <= set(s) for s in d["stages"])
    lifted = res.network(basis=np.eye(4)[:, :2])  # lifted to R^4 through an orthonormal basis
    assert lifted.input_dim == 4


def test_noisy_clump_reaches_noise_floor_and_records_rejected_units():
    """With noise the clump cannot be resolved: fewer units, the floor, and a consistent record."""
    a = on_circle(0.3, 0.31, 2.3)
    lam = np.array([1.0, 0.8, -0.7])
    res, _, (zv, yv), (zt, yt) = learn(a, lam, sigma=0.1)
    assert res.heldout_loss <= 1.1 * rel_loss(truth(a, lam), zv, yv)
    assert rel_loss(res.network(), zt, yt) <= 1.1 * rel_loss(truth(a, lam), zt, yt)
    assert res.units <= 3
    if res.units < 3:
        assert res.merged
    for g in res.merged:  # each record points at its nearest final unit, at the stated angle
        d = np.array(g["merged_direction"])
        ang = np.arccos(np.clip(res.directions @ d, -1, 1))
        assert g["into"] == int(np.argmin(ang)) and g["angle_to_into"] == pytest.approx(ang.min(), abs=1e-12)
