"""Control variates for the outputs' moments: the controlled estimate of T_1 and T_2 is unbiased (within its
standard errors of the closed form) whatever the model, and the labels' degree-two expansion cuts its noise."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.estimators.tensor import control
from relulearn.estimators.tensor.profile import profile
from relulearn.network import Network
from relulearn.pipeline.sources import make_source


def _teacher(tmp_path, d: int = 24, k: int = 8, m: int = 3) -> tuple[Network, api.execution.HeldOut]:
    rng = np.random.default_rng(4)
    net = Network(
        (rng.standard_normal((k, d)) / np.sqrt(d), rng.choice([-1.0, 1.0], (m, k)) * rng.uniform(0.5, 1.5, (m, k))),
        (0.6 * rng.standard_normal(k), rng.standard_normal(m)),
    )
    net.save(tmp_path / "t.npz")
    cfg = config_from_dict(
        {
            "seed": 5,
            "samples": 1000,
            "chunk_size": 1000,
            "source": {"d": d, "teacher": {"file": str(tmp_path / "t.npz")}},
        }
    )
    return net, api.execution.HeldOut(make_source(cfg), cfg.seed)


def _population(net: Network) -> tuple[np.ndarray, np.ndarray]:
    u, a, b = net.weights[0], net.weights[1], net.biases[0]
    norms = np.linalg.norm(u, axis=1)
    uh, beta, amp = u / norms[:, None], b / norms, a * norms[None, :]
    return (amp * profile(1, beta)) @ uh, np.einsum("ji,ia,ib->jab", amp * profile(2, beta), uh, uh)


def _zeros(m: int, d: int) -> control.Quadratic:
    return control.Quadratic(np.zeros(m), np.zeros((m, d)), np.zeros((d, 1)), np.zeros((m, 1, 1)))


def test_controlled_moments_are_unbiased_and_the_degree_two_expansion_cuts_their_noise(tmp_path, client):
    """On a real cluster, 2.4·10^5 fresh samples in 24 parts (d = 24, k = 8, m = 3): with no model (the plain
    estimate) and with the expansion built from the closed-form moments, every entry of T_1 and T_2 is within its
    standard errors of the closed form (mean squared z-score as Student's t gives it), the standard errors (the
    parts' spread) are those of the per-sample variance, and the expansion's are under 0.7 of the plain ones (its
    residual holds only the labels' part of degree ≥ 3)."""
    net, draw = _teacher(tmp_path)
    t1, t2 = _population(net)
    m, d = t1.shape
    mapper = api.execution.mapper(client)
    parts = control.residual_parts(240_000, first=7)
    assert len(parts) == control.PARTS and sum(n for _, n in parts) == 240_000
    basis = np.linalg.svd(t2.transpose(1, 0, 2).reshape(d, m * d))[0][:, :8]  # the span of the 8 units
    quad = control.quadratic(np.zeros(m), t1, t2, basis)
    np.testing.assert_allclose(quad.moments()[1], t2, atol=1e-12)  # the model's own moments: itself
    got = {}
    for name, model in (("plain", _zeros(m, d)), ("expansion", quad)):
        est = control.controlled(control.residual_moments(draw, model, parts, mapper), model)
        for key, pop, distinct in (("T1", t1, d), ("T2", t2, d * (d + 1) // 2)):
            z = (est[key] - pop) / est[f"{key}_se"]
            # z is Student's t with 23 degrees of freedom (24 parts): E z² = 23/21, var z² = 3·23²/(21·19) − (E z²)²;
            # the outputs share their samples, so only one output's entries count as independent
            mean, var = 23 / 21, 3 * 23**2 / (21 * 19) - (23 / 21) ** 2
            bound = 4 * np.sqrt(var / distinct)
            assert abs(float(np.mean(z**2)) - mean) <= bound, (name, key, float(np.mean(z**2)), bound)
            assert float(np.max(np.abs(z))) <= 7.0, (name, key)
        got[name] = est
    # the parts' spread against the per-sample variance: se² = (E[r² x_a² x_b²] − E[r x_a x_b]²) / n (a ≠ b), from
    # 10⁵ other samples; and the expansion's noise well under the labels' (its residual is the labels' part of
    # degree ≥ 3)
    x, y = draw.part(99, 100_000)
    off = ~np.eye(d, dtype=bool)
    for name, model in (("plain", _zeros(m, d)), ("expansion", quad)):
        r = y.reshape(len(y), -1) - model.forward(x)
        second = np.einsum("nj,na,nb->jab", r**2, x**2, x**2, optimize=True) / len(x)
        first = np.einsum("nj,na,nb->jab", r, x, x, optimize=True) / len(x)
        predicted = np.sqrt((second - first**2) / 240_000)
        spread = float(np.median(got[name]["T2_se"][:, off] / predicted[:, off]))
        assert 0.9 <= spread <= 1.1, (name, spread)
    ratio = float(np.median(got["expansion"]["T2_se"]) / np.median(got["plain"]["T2_se"]))
    assert ratio <= 0.7, ratio


@dataclass(frozen=True)
class _Weighted:
    """A mapped function that carries 16 MB (as a control model at d = 784 carries 20 MB)."""

    w: np.ndarray

    def __call__(self, item: int) -> float:
        return float(self.w[item::7].sum())


def test_a_mapped_function_of_megabytes_goes_to_the_workers_once_and_gives_the_same_answers(client):
    """The cluster's map sends a large function to each worker once (scattered), not inside each task graph:
    distributed's "large graph" warning is not raised, and the answers are those of the builtin map."""
    fn = _Weighted(np.random.default_rng(0).standard_normal(2_000_000))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = api.execution.mapper(client)(fn, range(6))
    assert got == list(map(fn, range(6)))
