"""Method ``exact`` (Bakshi–Jayaram–Woodruff 2019) against planted networks ``A = U f(V x)``.

Statistics are computed here from numpy samples (chunk means and their standard errors, as the
store keeps them) or from their population formulas; the sample draw is a small frozen dataclass
drawing part ``p`` from ``np.random.default_rng((seed, p))``. Every case checks a truth: the weights
up to the network's symmetries (``compare_two_layer``), the relative test error on fresh samples,
the population decomposition, the scaling of the error with the noise, the Gauss–Newton matrix
against a finite-difference Jacobian. All seeds are fixed.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass

import numpy as np
import pytest

from relulearn.estimators.base import MissingStatisticError, Samples
from relulearn.estimators.exact import entry as exact
from relulearn.estimators.exact.fixed_parameter import samples_needed
from relulearn.estimators.polish.refine import normal_equations, parts, refine
from relulearn.estimators.rectified import check_activation, kappas
from relulearn.estimators.spectral.cp import decompose
from relulearn.estimators.spectral.stage import relevant_subspace
from relulearn.methods import METHODS
from relulearn.network import Network, compare_two_layer

# ------------------------------------------------------------------ helpers

STATS_PART = 10_000  # part ids of the statistics' samples: apart from the method's parts 0, 1, 2, …


@dataclass(frozen=True)
class Draw:
    """A picklable sample draw (:class:`~relulearn.estimators.base.SampleDraw`) from a planted network."""

    net: Network
    noise: float = 0.0
    seed: int = 0

    def part(self, p: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng((self.seed, p))
        x = rng.standard_normal((n, self.net.input_dim))
        y = self.net.forward(x)
        if self.noise:
            y = y + self.noise * rng.standard_normal(y.shape)
        return x, y

    def __call__(self, n_train: int, n_val: int) -> Samples:
        x, y = self.part(0, n_train)
        xv, yv = self.part(1, n_val)
        return Samples(x, y, xv, yv)


def output_moments(draw: Draw, n: int, chunks: int = 20) -> dict[str, np.ndarray]:
    """``T1``, ``T2``, ``A``, ``AA`` as chunk means with their standard errors, like the store's."""
    size = n // chunks
    means: dict[str, list] = {"T1": [], "T2": [], "A": [], "AA": []}
    for c in range(chunks):
        x, y = draw.part(STATS_PART + c, size)
        mean = y.mean(0)
        means["A"].append(mean)
        means["AA"].append(y.T @ y / size)
        means["T1"].append(y.T @ x / size)
        t2 = np.stack([(x * y[:, j : j + 1]).T @ x / size for j in range(y.shape[1])])
        means["T2"].append(t2 - mean[:, None, None] * np.eye(x.shape[1]))
    out = {"count": np.array(size * chunks)}
    for name, vals in means.items():
        a = np.array(vals)
        out[name] = a.mean(0)
        out[name + "_se"] = a.std(0, ddof=1) / np.sqrt(chunks)
    return out


def planted(d: int, k: int, m: int, activation: str, seed: int) -> Network:
    """Gaussian hidden rows of norms 0.5–2 and Gaussian output weights."""
    rng = np.random.default_rng((seed, 77))
    v = rng.standard_normal((k, d)) * rng.uniform(0.5, 2.0, (k, 1))
    return Network((v, rng.standard_normal((m, k))), activation=activation)


def test_error(net: Network, learned: Network, n: int = 5_000) -> float:
    x = np.random.default_rng(12345).standard_normal((n, net.input_dim))
    y = net.forward(x)
    return float(np.sum((learned.forward(x) - y) ** 2) / np.sum(y**2))


test_error.__test__ = False  # a helper, not a test


def population(net: Network) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``T1`` (m, d) and ``T2`` (m, d, d) of ``U f(V x)`` for ``x ~ N(0, I)``."""
    v, u = net.weights
    c = {"relu": 1, "relu2": 2, "relu3": 3}[net.activation]
    k1, k2 = kappas(c)
    norms = np.linalg.norm(v, axis=1)
    nu = v / norms[:, None]
    w = u * norms**c
    return k1 * w @ nu, k2 * np.einsum("ji,ia,ib->jab", w, nu, nu)


# ------------------------------------------------------------------ tensor path, noiseless


@pytest.mark.parametrize("activation", ["relu", "relu2", "relu3"])
def test_noiseless_is_exact(activation):
    net = planted(20, 4, 5, activation, seed=1)
    draw = Draw(net)
    res = exact.learn({"output_moments": output_moments(draw, 100_000)}, [], draw, width=4, activation=activation)
    assert compare_two_layer(net, res.network).relative_error <= 1e-12
    assert test_error(net, res.network) <= 1e-20
    rep = res.report
    assert rep["path"] == "tensor" and rep["chosen"] == "exact step"
    assert rep["check"]["exact"] and rep["check"]["samples"] > 0 and len(rep["check"]["relative_error_per_output"]) == 5
    assert "skipped" in rep["refinement"]
    assert all(u["clean"] for u in rep["exact_step"]["units"])
    # the moments got every sign right, and the projection test agrees
    assert all(abs(abs(r) - 1) < 0.1 for r in rep["signs"]["coefficient"])
    assert all(abs(z) > 10 for z in rep["signs"]["z_score"])
    assert min(rep["projection_test"]) > 0.99
    json.dumps(rep)  # JSON-ready


def test_width_from_the_noise_floor():
    net = planted(12, 3, 4, "relu", seed=2)
    draw = Draw(net)
    res = exact.learn({"output_moments": output_moments(draw, 60_000)}, [], draw)
    assert res.report["width"] == 3 and res.report["subspace"]["rank"] == 3
    assert compare_two_layer(net, res.network).relative_error <= 1e-12


@pytest.mark.parametrize("activation", ["relu", "relu3"])
def test_tensor_step_on_population_moments(activation):
    net = planted(20, 4, 5, activation, seed=3)
    t1, t2 = population(net)
    sub = relevant_subspace(list(t2), [np.zeros_like(t) for t in t2], rank=4)
    dec = decompose(t2, sub.basis, seed=0)
    v, u = net.weights
    nu = v / np.linalg.norm(v, axis=1, keepdims=True)
    match = np.argmax(np.abs(dec.directions @ nu.T), axis=1)
    assert sorted(match) == [0, 1, 2, 3]
    for i, j in enumerate(match):
        err = min(np.linalg.norm(dec.directions[i] - nu[j]), np.linalg.norm(dec.directions[i] + nu[j]))
        assert err <= 1e-10
    c = {"relu": 1, "relu3": 3}[activation]
    alpha = kappas(c)[1] * u * np.linalg.norm(v, axis=1) ** c
    assert np.allclose(dec.weights, alpha[:, match], rtol=0, atol=1e-10 * np.abs(alpha).max())
    from relulearn.estimators.exact.signs import signs_from_first_moments

    sg = signs_from_first_moments(t1, None, dec.weights, dec.directions, c)
    truth = np.sign(np.sum(dec.directions * nu[match], axis=1))
    assert np.array_equal(sg.signs, truth) and np.allclose(np.abs(sg.ratio), 1.0, atol=1e-10)


# ------------------------------------------------------------------ noise and refinement


def test_error_scales_with_noise():
    net = planted(10, 3, 4, "relu", seed=2)
    errors = []
    for sigma in (0.05, 0.2):
        draw = Draw(net, noise=sigma, seed=5)
        res = exact.learn({"output_moments": output_moments(draw, 200_000)}, [], draw, width=3)
        assert res.report["chosen"] == "refined" and not res.report["check"]["exact"]
        assert res.report["refinement"]["samples"] == 200_000 and res.report["refinement"]["parts"] == 4
        errors.append(compare_two_layer(net, res.network).relative_error)
    assert errors[1] < 0.01
    assert 4 * 0.7 < errors[1] / errors[0] < 4 * 1.3


def test_normal_equations_match_the_jacobian():
    rng = np.random.default_rng(8)
    n, d, k, m = 200, 4, 3, 2
    x, y = rng.standard_normal((n, d)), rng.standard_normal((n, m))
    v, u = rng.standard_normal((k, d)), rng.standard_normal((m, k))
    for power in (1, 2, 3):

        def pred(theta, power=power):
            vv, uu = theta[: k * d].reshape(k, d), theta[k * d :].reshape(m, k)
            return (np.maximum(x @ vv.T, 0) ** power @ uu.T).ravel()

        theta = np.concatenate([v.ravel(), u.ravel()])
        h = 1e-6
        jac = np.stack([(pred(theta + h * e) - pred(theta - h * e)) / (2 * h) for e in np.eye(len(theta))], axis=1)
        eq = normal_equations(x, y, v, u, power, block_entries=50)  # several blocks
        assert np.allclose(eq.h, jac.T @ jac, rtol=1e-6, atol=1e-6 * np.abs(eq.h).max())
        assert np.allclose(eq.g, jac.T @ (y.ravel() - pred(theta)), rtol=1e-6, atol=1e-6 * np.abs(eq.g).max())


def test_refinement_is_deterministic_through_a_pickling_mapper():
    import cloudpickle

    def pickling_map(fn, items):  # what a cluster does: fn and items travel as bytes
        fn = cloudpickle.loads(cloudpickle.dumps(fn))
        return [fn(pickle.loads(pickle.dumps(i))) for i in items]

    net = planted(6, 2, 3, "relu2", seed=4)
    draw = Draw(net, noise=0.1, seed=1)
    v, u = net.weights
    start = Network((v + 0.05, u), activation="relu2")
    a, rep = refine(start, draw, 30_000, part_rows=8_000)
    b, _ = refine(start, draw, 30_000, part_rows=8_000, mapper=pickling_map)
    assert all(np.array_equal(p, q) for p, q in zip(a.weights, b.weights))
    assert rep["parts"] == 4 and rep["samples"] == 30_000
    assert parts(30_000, 8_000) == [(2, 7_500), (3, 7_500), (4, 7_500), (5, 7_500)]
    losses = [it["relative_loss"] for it in rep["iterations"] if it["accepted"]]
    assert losses == sorted(losses, reverse=True)
    assert compare_two_layer(net, a).relative_error < compare_two_layer(net, start).relative_error / 10


# ------------------------------------------------------------------ rank-deficient U: fixed-parameter path


def _rank_deficient(activation: str, seed: int = 11) -> Network:
    net = planted(20, 6, 3, activation, seed=seed)
    v, u = net.weights
    u = u.copy()
    u[:, 5] = -0.6 * u[:, 4]  # an opposite pair (u, −s u): allowed
    return Network((v, u), activation=activation)


@pytest.mark.parametrize("activation", ["relu", "relu3"])
def test_rank_deficient_is_exact(activation):
    net = _rank_deficient(activation)
    draw = Draw(net)
    res = exact.learn({"output_moments": output_moments(draw, 40_000)}, [], draw, width=6, activation=activation)
    assert res.report["path"] == "fixed-parameter"
    assert compare_two_layer(net, res.network).relative_error <= 1e-12
    assert test_error(net, res.network) <= 1e-20
    assert res.report["check"]["exact"]
    pairs = [u for u in res.report["fixed_parameter"]["units"] if u["partner"] is not None]
    assert len(pairs) == 2


def test_positively_parallel_columns_are_refused():
    net = _rank_deficient("relu")
    v, u = net.weights
    u = u.copy()
    u[:, 1] = 2.0 * u[:, 0]
    draw = Draw(Network((v, u), activation="relu"))
    with pytest.raises(ValueError, match="positively parallel"):
        exact.learn({"output_moments": output_moments(draw, 40_000)}, [], draw, width=6)


def test_too_few_exact_samples_names_the_number():
    draw = Draw(_rank_deficient("relu"))
    need = samples_needed(20, 6)
    with pytest.raises(ValueError, match=f"about {need} samples are needed"):
        exact.learn({"output_moments": output_moments(draw, 40_000)}, [], draw, width=6, exact_samples=1_000)
    draw = Draw(planted(20, 4, 5, "relu", seed=1))  # the tensor path's exact step
    with pytest.raises(ValueError, match="at least 80 samples are needed"):
        exact.learn({"output_moments": output_moments(draw, 40_000)}, [], draw, width=4, exact_samples=50)
    res = exact.learn({"output_moments": output_moments(draw, 40_000)}, [], draw, width=4, exact_samples=400)
    assert res.report["check"]["exact"]


# ------------------------------------------------------------------ arbitrary inputs


def _diabetes() -> np.ndarray:
    from sklearn.datasets import load_diabetes

    x = load_diabetes().data[:300, :5]
    return (x - x.mean(0)) / x.std(0)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("inputs", ["cube", pytest.param("diabetes", marks=pytest.mark.extra("sklearn"))])
@pytest.mark.parametrize("activation", ["relu", "relu3"])
def test_recover_on_arbitrary_inputs(k, inputs, activation):
    rng = np.random.default_rng((k, 3))
    x = rng.uniform(-1.0, 1.0, (300, 5)) if inputs == "cube" else _diabetes()
    net = Network((rng.standard_normal((k, 5)), rng.standard_normal((k + 1, k))), activation=activation)
    res = exact.recover(x, net.forward(x), k, activation=activation)
    assert compare_two_layer(net, res.network).relative_error <= 1e-12
    assert res.report["check"]["exact"]


def test_recover_refuses_what_it_cannot_do():
    rng = np.random.default_rng(5)
    x = rng.uniform(-1.0, 1.0, (300, 5))
    net = Network((rng.standard_normal((3, 5)), rng.standard_normal((4, 3))), activation="relu")
    with pytest.raises(ValueError, match=r"rank\(A\) = 3 but k = 2"):
        exact.recover(x, net.forward(x), 2)
    wide = Network((rng.standard_normal((9, 5)), rng.standard_normal((10, 9))), activation="relu")
    with pytest.raises(ValueError, match="too large.*candidate rows"):
        exact.recover(x, wide.forward(x), 9)
    with pytest.raises(ValueError, match="too few samples"):
        exact.recover(x[:12], net.forward(x[:12]), 3)


# ------------------------------------------------------------------ setting and statistics


@pytest.mark.parametrize(
    "name, reason", [("tanh", "f(-1) = -0.76"), ("softplus", "f(-1) = 0.31"), ("erf", "f(-1) = -0.84")]
)
def test_activations_outside_the_setting_are_refused(name, reason):
    with pytest.raises(ValueError, match=rf"not rectified: {re.escape(reason)}"):
        check_activation(name)


def test_rectified_activations_that_are_not_injective_or_continuous_are_refused():
    with pytest.raises(ValueError, match=r"not injective.*φ\(1\) = φ\(1.005\) = 1"):
        check_activation(lambda z: np.minimum(np.maximum(z, 0.0), 1.0))
    with pytest.raises(ValueError, match="not continuous: it jumps by 1"):
        check_activation(lambda z: np.where(z > 0, z + 1.0, 0.0))
    with pytest.raises(ValueError, match="only φ\\(z\\) = z\\^c"):
        check_activation(lambda z: np.sqrt(np.maximum(z, 0.0)))
    assert check_activation(lambda z: np.maximum(z, 0.0) ** 2).power == 2
    assert check_activation("relu3").power == 3


def test_missing_statistic_names_the_config_lines():
    with pytest.raises(MissingStatisticError, match="output_moments: {}"):
        exact.learn({"basic": {}}, [], Draw(planted(4, 2, 2, "relu", 0)))
    with pytest.raises(ValueError, match="'tanh'.*not rectified"):
        exact.learn({"output_moments": {}}, [], Draw(planted(4, 2, 2, "relu", 0)), activation="tanh")
    assert exact.required_statistics(10) == {"basic": {}, "output_moments": {}}
    assert exact.MAX_PASSES == 0
    assert set(METHODS["exact"].options) == {"width", "activation", "exact_samples", "refine_samples"}
