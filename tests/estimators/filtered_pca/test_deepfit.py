"""Deep bias-free ReLU networks fitted inside a found subspace.

Planted deep teachers ``y = W_L relu(... relu(W_0 z))`` with ``z ~ N(0, I_r)`` (the projected
samples the spectral stage hands over). Every case checks a truth — the gradient against
finite differences, the lifted network against the composition, the held-out loss of the
fit, bitwise determinism across mappers — not only that the code ran. All seeds are fixed.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from relulearn.estimators.filtered_pca.deep_local import _loss_grad, _pack
from relulearn.estimators.filtered_pca.deepfit import (
    Candidate,
    CandidateBudgetError,
    FitStages,
    architectures,
    candidate_count,
    fit_candidates,
    fit_network,
    init_network,
    lift,
    relative_loss,
)
from relulearn.network import Network

# ------------------------------------------------------------------ helpers


def teacher(r: int, widths: tuple[int, ...], seed: int) -> Network:
    """Unit-norm random first-layer rows, then Gaussian layers scaled by ``1/sqrt(fan_in)``."""
    rng = np.random.default_rng([seed, 777])
    w0 = rng.standard_normal((widths[0], r))
    ws = [w0 / np.linalg.norm(w0, axis=1, keepdims=True)]
    dims = list(widths) + [1]
    for j in range(1, len(dims)):
        ws.append(rng.standard_normal((dims[j], dims[j - 1])) / np.sqrt(dims[j - 1]))
    return Network(tuple(ws))


def samples(net: Network, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    z = np.random.default_rng([seed, 5]).standard_normal((n, net.input_dim))
    return z, net.forward(z)[:, 0]


# ------------------------------------------------------------------ enumeration


def test_architectures_ladder_and_order():
    assert architectures(2, 8) == [(2,), (4,), (8,), (2, 2), (4, 4), (8, 8)]
    assert architectures(3, 6) == [(3,), (6,), (3, 3), (6, 6), (3, 3, 3), (6, 6, 6)]
    assert architectures(1, 5) == [(2,), (5,)]
    assert architectures(1, 3) == [(3,)]
    assert architectures(2, 2) == [(2,), (2, 2)]
    assert architectures(3, 1) == [(1,), (1, 1), (1, 1, 1)]
    assert candidate_count(2, 8, 4) == 24
    assert candidate_count(3, 64, 4) == 3 * 6 * 4
    with pytest.raises(ValueError):
        architectures(0, 4)


def test_budget_exceeded_before_any_work():
    def no_work(*args):  # the mapper must not be called
        raise AssertionError("work was done before the budget check")

    count = candidate_count(3, 64, 4)
    assert count == 72
    with pytest.raises(CandidateBudgetError) as err:
        # the data are not even arrays: the budget is checked first
        fit_candidates(None, None, None, None, depth=3, width=64, starts=4, budget=50, mapper=no_work)
    msg = str(err.value)
    assert "--depth 3" in msg and "--width 64" in msg
    assert re.search(r"\b72 candidates\b", msg) and re.search(r"budget of 50\b", msg)
    assert "raise --budget" in msg
    assert isinstance(err.value, ValueError)


def test_init_network_deterministic_and_in_ball():
    a = init_network((8, 8), 3, seed=5, start=2)
    b = init_network((8, 8), 3, seed=5, start=2)
    c = init_network((8, 8), 3, seed=5, start=3)
    assert [w.shape for w in a.weights] == [(8, 3), (8, 8), (1, 8)]
    assert all(np.array_equal(u, v) for u, v in zip(a.weights, b.weights))
    assert not np.array_equal(a.weights[0], c.weights[0])
    small = init_network((8, 8), 3, seed=5, start=2, radius=0.5)
    for w, _fan_in, var in zip(small.weights, (3, 8, 8), (2 / 3, 2 / 8, 1 / 8)):
        assert np.linalg.norm(w) <= 0.5 * np.sqrt(w.size * var) * (1 + 1e-12)
    assert a.biases is None and a.activation == "relu" and a.output_dim == 1


# ------------------------------------------------------------------ loss, gradient, fit


def test_backprop_gradient_matches_finite_differences():
    rng = np.random.default_rng(11)
    net = init_network((5, 4, 3), 3, seed=1, start=0)
    z = rng.standard_normal((300, 3))
    y = rng.standard_normal(300)
    shapes = [w.shape for w in net.weights]
    theta = _pack(net.weights)
    zt = np.ascontiguousarray(z.T)  # the pass takes the transposed sample (r, n)
    loss, grad = _loss_grad(theta, zt, y, shapes)
    assert loss == pytest.approx(np.mean((net.forward(z)[:, 0] - y) ** 2), rel=1e-12)
    h = 1e-6
    fd = np.empty_like(theta)
    for i in range(len(theta)):
        e = np.zeros_like(theta)
        e[i] = h
        fd[i] = (_loss_grad(theta + e, zt, y, shapes)[0] - _loss_grad(theta - e, zt, y, shapes)[0]) / (2 * h)
    assert np.linalg.norm(grad - fd) <= 1e-6 * np.linalg.norm(fd)
    # more rows than one block of the vectorised pass: the blocks add up to the same gradient
    zb = rng.standard_normal((3, 9000))
    yb = rng.standard_normal(9000)
    loss_b, grad_b = _loss_grad(theta, zb, yb, shapes)
    halves = [_loss_grad(theta, zb[:, s], yb[s], shapes) for s in (slice(0, 4500), slice(4500, None))]
    assert loss_b == pytest.approx((halves[0][0] + halves[1][0]) / 2, rel=1e-12)
    assert np.allclose(grad_b, (halves[0][1] + halves[1][1]) / 2, rtol=1e-10, atol=1e-14)


def test_fit_network_is_scale_free():
    t = teacher(3, (3, 3), seed=2)
    z, y = samples(t, 3000, seed=2)
    start = init_network((4, 4), 3, seed=0, start=0)
    # a power-of-two scale is exact in floating point: the normalised problems are identical
    big = Network(start.weights[:-1] + (start.weights[-1] * 1024.0,))
    a, ia = fit_network(start, z, y, max_iter=40)
    b, ib = fit_network(big, z, 1024.0 * y, max_iter=40)
    assert ia["loss"] < 0.5 and ia["iterations"] > 0
    assert ib["loss"] == ia["loss"] and ib["iterations"] == ia["iterations"]
    assert relative_loss(b, z, 1024.0 * y) == pytest.approx(ia["loss"], rel=1e-12)
    assert np.array_equal(b.forward(z), 1024.0 * a.forward(z))
    # any other scale: the same fit up to rounding of the first steps
    c, ic = fit_network(Network(start.weights[:-1] + (start.weights[-1] * 1e4,)), z, 1e4 * y, max_iter=10)
    a10, ia10 = fit_network(start, z, y, max_iter=10)
    assert ic["loss"] == pytest.approx(ia10["loss"], rel=1e-6)


def test_a_fit_stops_on_a_plateau_at_the_iterate_of_a_fit_without_the_rule():
    """A depth-3 fit that creeps stops once 25 iterations gained less than 2 %: its network is, bit for bit, that of
    the same fit run to exactly as many iterations without the rule, and those last 25 iterations did gain less
    than 2 % (while the fit still had more to gain)."""
    t = teacher(4, (4, 8, 8), seed=1)
    z, y = samples(t, 3000, seed=1)
    start = init_network((8, 8, 8), 4, seed=0, start=0)
    net, info = fit_network(start, z, y, max_iter=600, plateau=(25, 0.02))
    k = info["iterations"]
    assert 25 < k < 600 and info["message"].startswith("plateau: the last 25 iterations") and not info["converged"]
    same, same_info = fit_network(start, z, y, max_iter=k, plateau=None)
    assert all(np.array_equal(a, b) for a, b in zip(net.weights, same.weights))
    assert same_info["loss"] == info["loss"]
    _, before = fit_network(start, z, y, max_iter=k - 25, plateau=None)
    assert 0.98 * before["loss"] < info["loss"] <= before["loss"]
    _, longer = fit_network(start, z, y, max_iter=600, plateau=None)
    assert longer["iterations"] > k and longer["loss"] < info["loss"]


def test_non_relu_network_refused():
    net = init_network((4,), 3, seed=0, start=0)
    z = np.random.default_rng(0).standard_normal((50, 3))
    with pytest.raises(ValueError, match="relu"):
        fit_network(Network(net.weights, activation="tanh"), z, z[:, 0])
    with pytest.raises(ValueError, match="bias"):
        fit_network(Network(net.weights, biases=(np.zeros(4), np.zeros(1))), z, z[:, 0])


# ------------------------------------------------------------------ lifting


def test_lift_composes_with_basis():
    rng = np.random.default_rng(3)
    d, r = 12, 3
    basis, _ = np.linalg.qr(rng.standard_normal((d, r)))
    net = init_network((6, 5), r, seed=4, start=1)
    x = rng.standard_normal((500, d))
    lifted = lift(net, basis)
    assert lifted.input_dim == d and lifted.weights[0].shape == (6, d)
    ref = net.forward(x @ basis)
    assert np.max(np.abs(lifted.forward(x) - ref)) <= 1e-12 * max(1.0, float(np.max(np.abs(ref))))
    with pytest.raises(ValueError):
        lift(net, basis[:, :2])


# ------------------------------------------------------------------ candidates


def test_planted_depth_two_teacher_is_fitted():
    t = teacher(3, (4, 4), seed=1)
    z, y = samples(t, 12_000, seed=1)
    z_val, y_val = samples(t, 4_000, seed=101)
    y, y_val = 3.0 * y, 3.0 * y_val  # any scale
    cands = fit_candidates(
        z,
        y,
        z_val,
        y_val,
        depth=2,
        width=8,
        starts=2,
        stages=FitStages(screen_samples=6_000, screen_iter=200, refine=2, refine_iter=1500),
        seed=0,
    )
    assert len(cands) == candidate_count(2, 8, 2)
    assert [c.val_loss for c in cands] == sorted(c.val_loss for c in cands)
    best = cands[0]
    assert best.refined and best.val_loss <= 1e-3, best.to_dict()
    # the reported loss is the loss of the returned network, on fresh samples too
    assert relative_loss(best.network, z_val, y_val) == pytest.approx(best.val_loss, rel=1e-9)
    z_test, y_test = samples(t, 4_000, seed=202)
    assert relative_loss(best.network, z_test, 3.0 * y_test) <= 2e-3
    assert best.network.input_dim == 3 and best.network.weights[0].shape == (best.widths[0], 3)
    assert json.loads(json.dumps(best.to_dict()))["widths"] == list(best.widths)
    assert sum(c.refined for c in cands) == 2


def _list_map(fn, items):
    return list(map(fn, items))


def test_deterministic_whatever_the_mapper():
    t = teacher(3, (3, 3), seed=4)
    z, y = samples(t, 3000, seed=4)
    z_val, y_val = samples(t, 1000, seed=104)
    stages = FitStages(screen_samples=2000, screen_iter=40, refine=2, refine_iter=60)
    kw = dict(depth=2, width=4, starts=2, stages=stages, seed=7)
    a = fit_candidates(z, y, z_val, y_val, mapper=map, **kw)
    with ProcessPoolExecutor(2) as pool:
        b = fit_candidates(z, y, z_val, y_val, mapper=pool.map, **kw)
    c = fit_candidates(z, y, z_val, y_val, mapper=lambda f, xs: _list_map(f, xs), **kw)
    assert all(isinstance(x, Candidate) for x in a)
    for other in (b, c):
        assert [(x.widths, x.start, x.val_loss, x.train_loss, x.iterations) for x in a] == [
            (x.widths, x.start, x.val_loss, x.train_loss, x.iterations) for x in other
        ]
        for x, y_ in zip(a, other):
            assert all(np.array_equal(u, v) for u, v in zip(x.network.weights, y_.network.weights))


def test_a_warm_start_on_an_extended_basis_is_the_same_function_and_only_improves():
    """filtered-pca's repeated fit also starts from the last round's best network, re-expressed on the extended
    basis (any orthonormal basis of a span that holds the old one): the same function of x, fitted without the
    screen to a training loss no higher than where it started, and the answer when the random starts miss."""
    from relulearn.estimators.filtered_pca.entry import _warm_starts

    rng = np.random.default_rng(21)
    d = 10
    span, _ = np.linalg.qr(rng.standard_normal((d, 5)))
    old = span[:, :3]
    new = span @ np.linalg.qr(rng.standard_normal((5, 5)))[0]  # the same span in other coordinates
    t = teacher(5, (4, 4), seed=6)
    x = rng.standard_normal((6_000, d))
    y = t.forward(x @ span)[:, 0]
    z_old = x @ old  # the last round: candidates on 3 of the 5 directions
    last = fit_candidates(
        z_old[:4_000],
        y[:4_000],
        z_old[4_000:],
        y[4_000:],
        depth=2,
        width=4,
        starts=2,
        stages=FitStages(refine_iter=100),
    )[0].network
    stored = {"basis": old.T} | {f"candidate0_W{j}": w for j, w in enumerate(last.weights)}
    (warm,) = _warm_starts([{"residual": stored}], new)
    assert warm.input_dim == 5 and [w.shape for w in warm.weights[1:]] == [w.shape for w in last.weights[1:]]
    before = lift(last, old).forward(x)
    assert np.max(np.abs(lift(warm, new).forward(x) - before)) <= 1e-12 * float(np.max(np.abs(before)))

    z, z_val, y_val = x[:4_000] @ new, x[4_000:] @ new, y[4_000:]
    start_loss = relative_loss(warm, z, y[:4_000])
    cands = fit_candidates(
        z,
        y[:4_000],
        z_val,
        y_val,
        depth=2,
        width=4,
        starts=1,
        stages=FitStages(screen_iter=3, refine=0, refine_iter=200),
        warm=[warm],
    )
    (w,) = [c for c in cands if c.start == -1]
    assert w.refined and w.widths == tuple(a.shape[0] for a in last.weights[:-1]) and w.train_loss <= start_loss
    assert cands[0] is w  # the random starts, screened for 3 iterations and not refined, do worse
    with pytest.raises(ValueError, match="warm start"):
        fit_candidates(z, y[:4_000], z_val, y_val, depth=2, width=4, starts=1, warm=[lift(warm, new)])
