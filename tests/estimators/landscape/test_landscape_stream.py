"""``landscape.stream``: G of Ge–Lee–Ma from stochastic gradients on fresh samples. The per-sample
estimator against the explicit sample tensor ``(1/n) Σ ỹ He_4(x)``, its gradient against finite
differences, the residual labels, the radial proximal map, and a small noiseless teacher whose rows
the streamed minimization finds."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest

from relulearn import hermite
from relulearn.estimators.landscape.objective_g import row_angles
from relulearn.estimators.landscape.stream import GProblem, StreamSizes, prox_radial, streamed_g
from relulearn.estimators.landscape.sums import SIGN_C4, batch_sums, batch_terms, part_sums, residual_labels

C = [hermite.relu_hermite_coefficient(l) for l in range(5)]


@dataclass(frozen=True)
class Teacher:
    """Noiseless ``y = Σ a_i relu(<u_i, x>)``; part p is drawn from ``default_rng([seed, p])``."""

    u: np.ndarray
    a: np.ndarray
    seed: int

    def part(self, p: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, p])
        x = rng.standard_normal((n, self.u.shape[1]))
        return x, np.maximum(x @ self.u.T, 0.0) @ self.a


def _sample_tensor(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return sum(yi * hermite.hermite_tensor(xi, 4) for xi, yi in zip(x, y)) / len(y)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    d, m, n = 5, 3, 40
    return rng.standard_normal((n, d)), rng.standard_normal(n), rng.standard_normal((m, d))


# ------------------------------------------------------------------ the estimator


def test_value_is_g_of_the_sample_tensor(batch):
    x, y, v = batch
    mu = 0.3
    t = _sample_tensor(x, y)
    pair = np.einsum("abcd,ja,jb,kc,kd->jk", t, v, v, v, v)  # T(v_j, v_j, v_k, v_k)
    expected = SIGN_C4 * (pair.sum() - np.trace(pair) - mu * np.trace(pair))
    value, _ = batch_sums(x, y, v, mu)
    assert value / len(y) == pytest.approx(expected, rel=1e-12, abs=1e-12 * np.abs(pair).max())
    terms = batch_terms(x, y, v, mu)
    np.testing.assert_allclose(terms.own / len(y), SIGN_C4 * np.diag(pair), rtol=1e-11)
    np.testing.assert_allclose(terms.rows / len(y), SIGN_C4 * pair.sum(axis=1), rtol=1e-11)


def test_gradient_matches_finite_differences(batch):
    x, y, v = batch
    mu, eps = 0.3, 1e-6
    _, grad = batch_sums(x, y, v, mu)
    num = np.zeros_like(v)
    for idx in np.ndindex(*v.shape):
        e = np.zeros_like(v)
        e[idx] = eps
        num[idx] = (batch_sums(x, y, v + e, mu)[0] - batch_sums(x, y, v - e, mu)[0]) / (2 * eps)
    np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-7 * np.abs(grad).max())


def test_part_sums_is_batch_terms_on_the_drawn_part_and_pickles():
    rng = np.random.default_rng(1)
    teacher = Teacher(np.linalg.qr(rng.standard_normal((4, 4)))[0], np.ones(4), 5)
    t0, t1, t2 = 4 * C[0], C[1] * teacher.u.sum(0), C[2] * teacher.u.T @ teacher.u
    v = rng.standard_normal((4, 4))
    fn = pickle.loads(pickle.dumps(partial(part_sums, teacher, t0, t1, t2, v, 0.1)))
    got = fn((7, 5000))  # more than one block of rows
    x, y = teacher.part(7, 5000)
    want = batch_terms(x, residual_labels(x, y, t0, t1, t2), v, 0.1)
    assert got.value == pytest.approx(want.value, rel=1e-11)
    np.testing.assert_allclose(got.grad, want.grad, rtol=1e-10, atol=1e-12 * np.abs(want.grad).max())


def test_residual_labels_remove_the_expansion_up_to_order_two():
    rng = np.random.default_rng(2)
    d, n = 4, 50
    x = rng.standard_normal((n, d))
    t0, t1 = 0.7, rng.standard_normal(d)
    s = rng.standard_normal((d, d))
    t2 = s + s.T
    quad = t0 + x @ t1 + 0.5 * np.array([xi @ t2 @ xi - np.trace(t2) for xi in x])
    extra = np.sin(x[:, 0])
    np.testing.assert_allclose(residual_labels(x, quad + extra, t0, t1, t2), extra, atol=1e-12)


def test_prox_radial_solves_its_problem():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, 4)) * rng.uniform(0.05, 3.0, (6, 1))
    for eta_lam in (0.01, 0.25, 2.5):
        b = prox_radial(z, eta_lam)
        r = np.linalg.norm(b, axis=1, keepdims=True)
        # stationary point of ½|b − z|² + ηλ (|b|² − 1)², along z
        np.testing.assert_allclose(b - z + 4 * eta_lam * (r**2 - 1) * b, 0.0, atol=1e-12)
        np.testing.assert_allclose(b / r, z / np.linalg.norm(z, axis=1, keepdims=True), atol=1e-14)


# ------------------------------------------------------------------ the streamed minimization


def _problem(d: int, seed: int):
    """A noiseless teacher with orthonormal rows and a in [0.7, 1.3], its population first pass,
    whitening and μ, λ as ``landscape.g_parameters`` sets them (β_i = |c_4| / (c_2² a_i))."""
    rng = np.random.default_rng(seed)
    u = np.linalg.qr(rng.standard_normal((d, d)))[0]
    a = rng.uniform(0.7, 1.3, d)
    t0, t1, t2 = C[0] * a.sum(), C[1] * a @ u, C[2] * (u.T * a) @ u
    eig, q = np.linalg.eigh(t2)
    w = (q / np.sqrt(eig)).T
    beta = abs(C[4]) / (C[2] ** 2 * a)
    mu, lam = 0.1 * beta.min() / beta.max(), beta.max() / 0.1
    return Teacher(u, a, seed), GProblem(w=w, t0=t0, t1=t1, t2=t2, m=d, mu=mu, lam=lam), q, eig


def test_streamed_g_finds_the_rows_of_a_small_teacher():
    teacher, problem, q, eig = _problem(6, 11)
    res = streamed_g(teacher, map, problem=problem, seed=4)
    assert res.report["converged"] and res.report["stop"] == "target"
    u = (res.b * np.sqrt(eig)) @ q.T  # un-whitened: u ∝ Q Λ^{1/2} b̃
    angles = row_angles(u, teacher.u)
    assert angles.max() <= 0.1, angles
    assert res.report["final"]["align_min"] >= 0.8
    # the rows' own weights are the β_i = |c_4| / (c_2² a_i) of the whitened tensor
    beta = abs(C[4]) / (C[2] ** 2 * teacher.a)
    matched = np.abs((u / np.linalg.norm(u, axis=1, keepdims=True)) @ teacher.u.T).argmax(axis=1)
    np.testing.assert_allclose(res.report["row_betas"], beta[matched], rtol=0.1)
    assert res.report["samples"] == sum(t["batch"] for t in res.report["trace"])


def test_streamed_g_is_deterministic_and_uses_fresh_parts():
    teacher, problem, _, _ = _problem(5, 12)
    seen: list[int] = []

    def mapper(fn, items):
        items = list(items)
        seen.extend(p for p, _ in items)
        return [fn(i) for i in items]

    one = streamed_g(teacher, mapper, problem=problem, seed=1, sizes=StreamSizes(steps=3))
    two = streamed_g(teacher, map, problem=problem, seed=1, sizes=StreamSizes(steps=3))
    assert np.array_equal(one.b, two.b)
    assert len(seen) == len(set(seen)) and min(seen) == 2
    assert one.report["parts"] == [2, 2 + len(seen)]
