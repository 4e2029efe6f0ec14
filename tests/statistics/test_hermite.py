"""Tests for relulearn.hermite."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss, hermeval
from scipy import integrate

from relulearn.hermite import (
    activation_hermite_coefficients,
    contracted_coefficients,
    contracted_matrix_sums,
    contracted_scalar_sums,
    contracted_vector_sums,
    hermite_e,
    hermite_tensor,
    pack,
    packed_index,
    partial_matchings,
    raw_moment_flops,
    raw_moment_sums,
    raw_moment_sums_upto,
    raw_to_hermite,
    relu_hermite_coefficient,
    unique_indices,
    unpack,
)

SQRT_FACT = np.sqrt([float(math.factorial(k)) for k in range(41)])


def relu(z):
    return np.maximum(z, 0.0)


def unit_rows(rng, k, d):
    g = rng.standard_normal((k, d))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def outer_power(u, l):
    out = np.ones(())
    for _ in range(l):
        out = np.multiply.outer(out, u)
    return out


def symmetrize(t):
    perms = list(itertools.permutations(range(t.ndim)))
    return sum(np.transpose(t, p) for p in perms) / len(perms)


def contract_leading(t, g, times):
    for _ in range(times):
        t = np.tensordot(g, t, axes=(0, 0))
    return t


# ---------------------------------------------------------------- 1-d polynomials


def test_hermite_e_matches_numpy():
    z = np.linspace(-6, 6, 41).reshape(1, 41)
    h = hermite_e(z, 30)
    assert h.shape == (31, 1, 41)
    for k in range(31):
        ref = hermeval(z, np.eye(31)[k])
        np.testing.assert_allclose(h[k], ref, rtol=1e-11, atol=1e-11 * SQRT_FACT[k])


def test_hermite_e_orthogonality():
    nodes, weights = hermegauss(40)  # exact for degree <= 79
    weights = weights / math.sqrt(2 * math.pi)
    h = hermite_e(nodes, 30)
    gram = (h * weights) @ h.T
    scaled = gram / np.outer(SQRT_FACT[:31], SQRT_FACT[:31])
    np.testing.assert_allclose(scaled, np.eye(31), atol=1e-10)


def test_relu_coefficients_closed_form_values():
    s = math.sqrt(2 * math.pi)
    expected = [1 / s, 0.5, 1 / s, 0, -1 / s, 0, 3 / s, 0, -15 / s, 0, 105 / s]
    got = [relu_hermite_coefficient(l) for l in range(11)]
    np.testing.assert_allclose(got, expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("l", range(0, 21))
def test_relu_coefficients_against_adaptive_quadrature(l):
    # relu(z) He_l(z) phi(z) is smooth on [0, inf): scipy's adaptive quad is reliable there.
    coef = np.eye(l + 1)[l]
    val, err = integrate.quad(
        lambda z: z * hermeval(z, coef) * math.exp(-z * z / 2) / math.sqrt(2 * math.pi),
        0,
        np.inf,
        epsabs=1e-13 * SQRT_FACT[l],
        epsrel=1e-13,
        limit=200,
    )
    assert abs(relu_hermite_coefficient(l) - val) <= 1e-11 * SQRT_FACT[l]


def test_activation_coefficients_relu_with_breakpoint_is_exact():
    ref = np.array([relu_hermite_coefficient(l) for l in range(31)])
    got = activation_hermite_coefficients(relu, 30, breakpoints=(0.0,))
    np.testing.assert_allclose(got / SQRT_FACT[:31], ref / SQRT_FACT[:31], rtol=0, atol=1e-13)


def test_activation_coefficients_relu_plain_hermegauss_converges():
    # Across a kink Gauss-HermiteE is only O(1/N): check agreement and convergence.
    ref = np.array([relu_hermite_coefficient(l) for l in range(7)])
    err100 = np.abs(activation_hermite_coefficients(relu, 6, 100) - ref)
    err300 = np.abs(activation_hermite_coefficients(relu, 6, 300) - ref)
    assert err300.max() < 1e-2
    assert np.all(err300[::2] < 0.5 * err100[::2])
    np.testing.assert_allclose(err300[1::2], 0, atol=1e-13)  # odd part z/2 is smooth


@pytest.mark.parametrize("breakpoints", [None, ()])
def test_activation_coefficients_smooth_exact(breakpoints):
    # E[exp(a z) He_l(z)] = a^l exp(a^2/2)
    a = 0.7
    got = activation_hermite_coefficients(lambda z: np.exp(a * z), 20, breakpoints=breakpoints)
    ref = a ** np.arange(21) * math.exp(a * a / 2)
    np.testing.assert_allclose(got / SQRT_FACT[:21], ref / SQRT_FACT[:21], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- packing


@pytest.mark.parametrize("d,l", [(1, 0), (3, 0), (1, 3), (4, 1), (4, 2), (3, 3), (5, 4), (3, 6)])
def test_unique_indices_and_packed_index(d, l):
    idx = unique_indices(d, l)
    ref = np.array(list(itertools.combinations_with_replacement(range(d), l)), dtype=np.int64)
    assert idx.dtype == np.int64
    assert idx.shape == (math.comb(d + l - 1, l), l)
    np.testing.assert_array_equal(idx, ref.reshape(idx.shape))
    np.testing.assert_array_equal(packed_index(idx, d), np.arange(idx.shape[0]))
    # Any permutation of a multi-index maps to the same position.
    rng = np.random.default_rng(0)
    shuffled = rng.permuted(idx, axis=1)
    np.testing.assert_array_equal(packed_index(shuffled, d), np.arange(idx.shape[0]))


@pytest.mark.parametrize("d,l", [(3, 0), (4, 1), (4, 2), (3, 3), (3, 4), (2, 5)])
def test_pack_unpack_round_trip(d, l):
    rng = np.random.default_rng(1)
    # Exactly symmetric tensor: each entry is a function of its sorted multi-index.
    table = {c: rng.standard_normal() for c in itertools.combinations_with_replacement(range(d), l)}
    t = np.empty((d,) * l)
    for i in itertools.product(range(d), repeat=l):
        t[i] = table[tuple(sorted(i))]
    p = pack(t)
    assert p.shape == (math.comb(d + l - 1, l),)
    np.testing.assert_array_equal(unpack(p, d, l), t)
    q = rng.standard_normal(p.shape)
    np.testing.assert_array_equal(pack(unpack(q, d, l)), q)


def test_partial_matching_counts():
    # Telephone numbers.
    assert [len(partial_matchings(l)) for l in range(9)] == [1, 1, 2, 4, 10, 26, 76, 232, 764]


# ---------------------------------------------------------------- Hermite tensors


@pytest.mark.parametrize("l", range(0, 6))
def test_hermite_tensor_projection_identity(l):
    rng = np.random.default_rng(2 + l)
    for _ in range(5):
        x, u = rng.standard_normal(3), 1.7 * rng.standard_normal(3)
        t = hermite_tensor(x, l)
        assert t.shape == (3,) * l
        np.testing.assert_allclose(t, symmetrize(t), atol=1e-13)
        lhs = np.tensordot(t, outer_power(u, l), axes=l)
        nu = np.linalg.norm(u)
        rhs = nu**l * hermite_e(np.array(u @ x / nu), l)[l]
        np.testing.assert_allclose(lhs, rhs, rtol=1e-12, atol=1e-12)


def test_hermite_tensor_order4_formula():
    rng = np.random.default_rng(3)
    d = 3
    x, eye = rng.standard_normal(d), np.eye(d)
    ref = (
        outer_power(x, 4)
        - 6 * symmetrize(np.multiply.outer(outer_power(x, 2), eye))
        + 3 * symmetrize(np.multiply.outer(eye, eye))
    )
    np.testing.assert_allclose(hermite_tensor(x, 4), ref, atol=1e-12)


# ---------------------------------------------------------------- raw moments


@pytest.mark.parametrize("d,m", [(4, 0), (4, 1), (4, 2), (4, 3), (4, 4), (3, 5), (2, 6)])
def test_raw_moment_sums_against_einsum(d, m):
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((300, d)), rng.standard_normal(300)
    full = np.einsum("s,s...->...", y, np.stack([outer_power(xs, m) for xs in x]))
    got = raw_moment_sums(x, y, m)
    np.testing.assert_allclose(got, pack(full), rtol=1e-12, atol=1e-12 * np.abs(full).max())


def test_raw_moment_sums_row_batches(monkeypatch):
    import relulearn.hermite.batching as H

    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((97, 3)), rng.standard_normal(97)
    ref = raw_moment_sums(x, y, 4)
    monkeypatch.setattr(H, "_TEMP_ELEMENTS", 100)  # forces many small row batches
    np.testing.assert_allclose(raw_moment_sums(x, y, 4), ref, rtol=1e-12)


@functools.cache
def _direct_raw_moments(d, lmax, n, seed):
    """A sample (x, y) and its packed Σ y x^{⊗m}, m ≤ lmax, as y-weighted products of the
    gathered columns, entry by entry (no GEMM, no splitting of tuples)."""
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((n, d)), rng.standard_normal(n)
    ref = []
    for m in range(lmax + 1):
        idx = unique_indices(d, m)
        out = np.empty(len(idx))
        for s in range(0, len(idx), 8192):
            out[s : s + 8192] = y @ np.prod(x[:, idx[s : s + 8192]], axis=-1)
        ref.append(out)
    return x, y, ref


def _assert_raw_close(got, ref, rtol=1e-12):
    assert len(got) == len(ref)
    for m, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape, m
        err = np.abs(g - r).max() / np.abs(r).max()
        assert err <= rtol, (m, err)


@pytest.mark.parametrize("d,lmax", [(1, 8), (2, 8), (7, 6), (20, 6), (100, 3)])
def test_raw_moment_sums_upto_against_direct_products(d, lmax):
    # every L <= lmax on one sample; y of both signs; d = 100 plans on a grid of boundaries (D > 64)
    x, y, ref = _direct_raw_moments(d, lmax, 40, 21 + d)
    assert (y > 0).any() and (y < 0).any()
    for L in range(lmax + 1):
        _assert_raw_close(raw_moment_sums_upto(x, y, L), ref[: L + 1])


def test_raw_moment_sums_upto_row_batches():
    # several row batches, uneven last one: by the default operand budget (d = 20, L = 4:
    # 271 rows per batch) and by a small private budget (d = 7, L = 6: 37 rows per batch)
    for d, L, n, budget in [(20, 4, 600, None), (7, 6, 300, 37 * (8 + 2 * 120))]:
        x, y, ref = _direct_raw_moments(d, L, n, 3)
        got = raw_moment_sums_upto(x, y, L, _temp_elements=budget)
        _assert_raw_close(got, ref)
        one_batch = raw_moment_sums_upto(x, y, L, _temp_elements=10**9)
        _assert_raw_close(got, one_batch)


def test_raw_moment_sums_upto_matches_single_orders_and_is_deterministic():
    import relulearn.hermite.moments as H

    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((500, 5)), rng.standard_normal(500)
    got = raw_moment_sums_upto(x, y, 5)
    _assert_raw_close(got, [raw_moment_sums(x, y, m) for m in range(6)])
    _assert_raw_close(got, [H._raw_moment_sums_pairs(x, y, m) for m in range(6)])
    again = raw_moment_sums_upto(x.copy(order="F"), y.copy(), 5)
    assert all(np.array_equal(a, b) for a, b in zip(got, again))  # same bits


def test_raw_moment_sums_upto_edge_cases():
    x, y = np.zeros((0, 3)), np.zeros(0)
    assert [r.tolist() for r in raw_moment_sums_upto(x, y, 2)] == [[0.0], [0.0] * 3, [0.0] * 6]
    with pytest.raises(ValueError):
        raw_moment_sums_upto(np.zeros((4, 3)), np.zeros(5), 2)
    with pytest.raises(ValueError):
        raw_moment_sums_upto(np.zeros((4, 3)), np.zeros(4), -1)


@pytest.mark.parametrize("d", [8, 20, 50])
def test_raw_moment_flops_within_packed_bound(d):
    # the plan's executed GEMM flops per sample, against the packed count 2 Σ_m C(d+m-1, m)
    for L in range(7):
        if math.comb(d + L, L) > 2_000_000:  # HermiteConfig.max_entries refuses these
            continue
        packed = 2 * sum(math.comb(d + m - 1, m) for m in range(L + 1))
        assert packed == 2 * math.comb(d + L, L)
        assert packed <= raw_moment_flops(d, L) <= 1.5 * packed, (L, raw_moment_flops(d, L) / packed)


@pytest.mark.parametrize("l", range(0, 6))
def test_raw_to_hermite_against_direct_sum(l):
    rng = np.random.default_rng(6 + l)
    d, n = 3, 40
    x, y = rng.standard_normal((n, d)), rng.standard_normal(n)
    direct = sum(ys * hermite_tensor(xs, l) for xs, ys in zip(x, y))
    raw = {m: raw_moment_sums(x, y, m) for m in range(0, 7)}  # extra orders are ignored
    got = raw_to_hermite(raw, d, l)
    scale = np.abs(direct).max()
    np.testing.assert_allclose(got, pack(direct), rtol=1e-10, atol=1e-10 * scale)


def test_raw_to_hermite_missing_order():
    with pytest.raises(KeyError):
        raw_to_hermite({4: np.zeros(15)}, 3, 4)


# ---------------------------------------------------------------- contractions


@pytest.fixture(scope="module")
def small_sample():
    rng = np.random.default_rng(7)
    d, n = 4, 25
    x, y = rng.standard_normal((n, d)), rng.standard_normal(n)
    G = unit_rows(rng, 3, d)
    full = {l: sum(ys * hermite_tensor(xs, l) for xs, ys in zip(x, y)) for l in range(7)}
    return x, y, G, full


def test_contracted_matrix_sums_against_full_tensor(small_sample):
    x, y, G, full = small_sample
    orders = [2, 3, 4, 5, 6]
    got = contracted_matrix_sums(x, y, G, orders)
    assert got.shape == (len(orders) * len(G), 4, 4)
    for i, l in enumerate(orders):
        for j, g in enumerate(G):
            ref = contract_leading(full[l], g, l - 2)
            np.testing.assert_allclose(got[i * len(G) + j], ref, rtol=1e-11, atol=1e-11 * np.abs(ref).max())


def test_contracted_matrix_sums_row_batches(small_sample, monkeypatch):
    import relulearn.hermite.batching as H

    x, y, G, _ = small_sample
    ref = contracted_matrix_sums(x, y, G, [2, 4, 6])
    monkeypatch.setattr(H, "_TEMP_ELEMENTS", 50)
    np.testing.assert_allclose(contracted_matrix_sums(x, y, G, [2, 4, 6]), ref, rtol=1e-12)


def test_contracted_matrix_sums_signed_rank_k_updates(monkeypatch):
    """The syrk path (rows split by the sign of their weight, gathered in blocks) against plain
    numpy at d >= 20: y > 0 makes every order-2 weight positive (no negative rows for those pairs),
    zero labels give rows of zero weight; the result is exactly symmetric and does not depend on the
    gather block or on the input's memory alignment."""
    import relulearn.hermite.contracted as H

    rng = np.random.default_rng(11)
    n, d = 700, 24
    monkeypatch.setattr(H, "_SYRK_MIN_D", 1)  # the syrk path at a small d (it serves d >= 64)
    x, y = rng.standard_normal((n, d)), np.abs(rng.standard_normal(n))
    y[::7] = 0.0
    G, orders = unit_rows(rng, 2, d), [2, 4, 5]
    ref = []
    for l in orders:
        for g in G:
            a, b, c = (t * y for t in contracted_coefficients(x @ g, l))
            v = x.T @ b
            ref.append(
                (x * a[:, None]).T @ x
                - a.sum() * np.eye(d)
                - np.outer(g, v)
                - np.outer(v, g)
                + c.sum() * np.outer(g, g)
            )
    got = contracted_matrix_sums(x, y, G, orders)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    assert np.array_equal(got, got.transpose(0, 2, 1))
    raw = np.empty(x.nbytes + 64, dtype=np.uint8)
    shifted = raw[8 : 8 + x.nbytes].view(np.float64).reshape(x.shape)  # 8 bytes off the copy's start
    shifted[...] = x
    assert np.array_equal(contracted_matrix_sums(shifted, y, G, orders), got)
    monkeypatch.setattr(H, "_GRAM_BLOCK", 50 * d)  # several gather blocks per sign
    np.testing.assert_allclose(contracted_matrix_sums(x, y, G, orders), got, rtol=1e-12, atol=1e-12 * np.abs(got).max())
    monkeypatch.setattr(H, "_SYRK_MIN_D", 10**6)  # and the one-GEMM path of small d: the same sums
    small = contracted_matrix_sums(x, y, G, orders)
    np.testing.assert_allclose(small, got, rtol=1e-12, atol=1e-12 * np.abs(got).max())
    assert np.array_equal(small, small.transpose(0, 2, 1))


def test_contracted_coefficients_single_sample(small_sample):
    x, _, G, _ = small_sample
    g, xs, d = G[0], x[0], x.shape[1]
    for l in range(2, 7):
        a, b, c = contracted_coefficients(np.array(g @ xs), l)
        got = a * (np.outer(xs, xs) - np.eye(d)) - b * (np.outer(g, xs) + np.outer(xs, g)) + c * np.outer(g, g)
        np.testing.assert_allclose(got, contract_leading(hermite_tensor(xs, l), g, l - 2), atol=1e-11)


def test_vector_contraction_identity():
    # He_l(x)[g^(l-1), .] = He_{l-1}(z) x - (l-1) He_{l-2}(z) g on the full tensor.
    rng = np.random.default_rng(8)
    x, g = rng.standard_normal(4), unit_rows(rng, 1, 4)[0]
    h = hermite_e(np.array(g @ x), 6)
    for l in range(1, 7):
        ref = contract_leading(hermite_tensor(x, l), g, l - 1)
        got = h[l - 1] * x - (l - 1) * (h[l - 2] if l >= 2 else 0.0) * g
        np.testing.assert_allclose(got, ref, atol=1e-11)


def test_contracted_vector_and_scalar_sums_against_full_tensor(small_sample):
    x, y, G, full = small_sample
    vec_orders, sc_orders = [1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6]
    vec = contracted_vector_sums(x, y, G, vec_orders)
    sc = contracted_scalar_sums(x, y, G, sc_orders)
    assert vec.shape == (len(vec_orders) * len(G), 4) and sc.shape == (len(sc_orders) * len(G),)
    for i, l in enumerate(vec_orders):
        for j, g in enumerate(G):
            ref = contract_leading(full[l], g, l - 1)
            np.testing.assert_allclose(vec[i * len(G) + j], ref, rtol=1e-11, atol=1e-11 * np.abs(ref).max())
    for i, l in enumerate(sc_orders):
        for j, g in enumerate(G):
            ref = contract_leading(full[l], g, l)
            np.testing.assert_allclose(sc[i * len(G) + j], ref, rtol=1e-11, atol=1e-11)


def test_contractions_reject_non_unit_directions(small_sample):
    x, y, G, _ = small_sample
    with pytest.raises(ValueError):
        contracted_matrix_sums(x, y, 2 * G, [2])


# ---------------------------------------------------------------- population check


def test_population_moments_of_relu_network():
    rng = np.random.default_rng(2024)
    d, n, blocks = 5, 400_000, 20
    U = unit_rows(rng, 2, d)
    lam = np.array([1.0, -0.6])
    x = rng.standard_normal((n, d))
    y = relu(x @ U.T) @ lam
    per_block = {l: [] for l in range(5)}
    for xb, yb in zip(np.split(x, blocks), np.split(y, blocks)):
        raw = {m: raw_moment_sums(xb, yb, m) / len(yb) for m in range(5)}
        for l in range(5):
            per_block[l].append(raw_to_hermite(raw, d, l))
    for l in range(5):
        est = np.array(per_block[l])
        mean, se = est.mean(axis=0), est.std(axis=0, ddof=1) / math.sqrt(blocks)
        truth = relu_hermite_coefficient(l) * pack(sum(li * outer_power(u, l) for li, u in zip(lam, U)))
        assert np.all(np.abs(mean - truth) <= 5 * se), (l, np.abs(mean - truth) / se)
        if l in (2, 4):
            # The check has power: a sign error in c_l would be caught.
            assert np.max(np.abs(mean + truth) / se) > 5
