"""Network files, symmetry-aware comparison, and exact polish."""

from __future__ import annotations

import numpy as np
import pytest

from relulearn.estimators.polish.dense import polish
from relulearn.network import Network, compare


def planted(d: int, k: int, seed: int) -> Network:
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((k, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    lam = rng.choice([-1.0, 1.0], k) * rng.uniform(0.5, 1.5, k)
    return Network((u, lam[None, :]))


def test_npz_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    net = Network(
        (rng.standard_normal((4, 3)), rng.standard_normal((2, 4)), rng.standard_normal((1, 2))),
        (rng.standard_normal(4), rng.standard_normal(2), rng.standard_normal(1)),
        "tanh",
    )
    net.save(tmp_path / "n.npz")
    back = Network.load(tmp_path / "n.npz")
    x = rng.standard_normal((10, 3))
    assert back.activation == "tanh" and back.depth == 2
    assert np.array_equal(back.forward(x), net.forward(x))
    with np.load(tmp_path / "n.npz", allow_pickle=False) as f:  # no pickled objects in the file
        assert sorted(f.files) == ["W0", "W1", "W2", "activation", "b0", "b1", "b2"]


def test_compare_is_invariant_to_permutation_and_positive_rescaling():
    net = planted(7, 4, 1)
    u, lam = net.weights[0], net.weights[1][0]
    perm = np.array([2, 0, 3, 1])
    s = np.array([0.3, 2.0, 5.0, 1.7])
    other = Network((u[perm] * s[:, None], (lam[perm] / s)[None, :]))
    x = np.random.default_rng(2).standard_normal((100, 7))
    np.testing.assert_allclose(other.forward(x), net.forward(x), rtol=1e-13, atol=1e-13)
    cmp = compare(net, other)
    assert cmp.relative_error < 1e-15
    assert [int(np.flatnonzero(perm == i)[0]) for i in range(4)] == list(cmp.matching)


def test_compare_sees_the_sign_symmetry_break():
    """-relu(<u,x>) and relu(<-u,x>) have the same product λu but are different functions."""
    net = planted(5, 2, 3)
    u, lam = net.weights[0], net.weights[1][0]
    flipped = Network((-u, -lam[None, :]))
    assert compare(net, flipped).relative_error > 1.0
    perturbed = Network((u + 1e-6, lam[None, :]))
    assert compare(net, perturbed).relative_error < 1e-5


@pytest.mark.parametrize("d,k", [(10, 1), (10, 3), (50, 5)])
def test_polish_reaches_machine_precision_on_noiseless_labels(d, k):
    teacher = planted(d, k, 10 + k)
    rng = np.random.default_rng(d * k)
    x = rng.standard_normal((max(4000, 30 * k * d), d))
    y = teacher.forward(x)[:, 0]
    u, lam = teacher.weights[0], teacher.weights[1][0]
    start = Network((u + 0.03 * rng.standard_normal(u.shape), 1.2 * lam[None, :]))
    assert compare(teacher, start).relative_error > 1e-2
    out, report = polish(start, x, y)
    assert report.converged and report.relative_residual < 1e-13
    assert compare(teacher, out).relative_error < 1e-12
    xt = rng.standard_normal((20_000, d))
    yt = teacher.forward(xt)[:, 0]
    assert np.mean((yt - out.forward(xt)[:, 0]) ** 2) / np.mean(yt**2) < 1e-24


def test_polish_with_noise_is_least_squares():
    """With label noise, polish converges to the least-squares fit: error ~ σ²·kd/n."""
    d, k, sigma = 20, 3, 0.1
    teacher = planted(d, k, 4)
    rng = np.random.default_rng(5)
    n = 40_000
    x = rng.standard_normal((n, d))
    y = teacher.forward(x)[:, 0] + sigma * rng.standard_normal(n)
    out, report = polish(teacher, x, y)
    assert report.converged
    xt = rng.standard_normal((50_000, d))
    yt = teacher.forward(xt)[:, 0]
    excess = np.mean((yt - out.forward(xt)[:, 0]) ** 2)
    # E[excess] = σ² k d / n for least squares with k·d unknowns; allow 3× for the pattern set
    assert excess < 3 * sigma**2 * k * d / n


def test_least_squares_by_the_normal_equations_is_the_minimum_norm_solution():
    """polish's solve (normal equations, one refinement) against numpy's SVD-based lstsq on a polish design at
    d = 30 (BLAS-3 sizes): the same solution to 1e-13 where the design has full rank, a noiseless fit to the
    labels' rounding, and the minimum-norm solution where it has not (a unit active on every sample makes its
    block equal to the affine part's columns; a unit active on none, a zero block)."""
    from relulearn.estimators.polish.dense import least_squares

    rng = np.random.default_rng(30)
    n, d, k = 20_000, 30, 6
    x = rng.standard_normal((n, d))
    pattern = x @ rng.standard_normal((d, k)) > 0
    phi = np.column_stack([(pattern[:, :, None] * x[:, None, :]).reshape(n, k * d), np.ones(n), x])
    truth = rng.standard_normal(phi.shape[1])
    truth[-d:] = 0.0
    y = phi @ truth
    noisy = y + 0.1 * rng.standard_normal(n)
    full = phi[:, : k * d + 1]
    ref = np.linalg.lstsq(full, noisy, rcond=None)[0]
    assert np.linalg.norm(least_squares(full, noisy) - ref) <= 1e-13 * np.linalg.norm(ref)
    s = least_squares(full, y)
    assert np.linalg.norm(full @ s - y) <= 1e-15 * np.linalg.norm(y)
    # rank-deficient: unit 0 always active (its block repeats the affine columns), unit 1 never
    deficient = phi.copy()
    deficient[:, :d] = x
    deficient[:, d : 2 * d] = 0.0
    ref = np.linalg.lstsq(deficient, noisy, rcond=None)[0]
    got = least_squares(deficient, noisy)
    assert np.linalg.norm(got - ref) <= 1e-12 * np.linalg.norm(ref)
    assert np.abs(got[d : 2 * d]).max() <= 1e-14 * np.linalg.norm(ref)


def test_the_polish_system_updated_where_patterns_moved_equals_the_one_summed_again():
    """The single-output polish's normal matrix, updated on the samples whose patterns (or trust) changed over
    three steps, equals the matrix summed from scratch to rounding (d = 30, k = 8: BLAS-3 sizes), and its solve
    is the minimum-norm least squares of the explicit design, full rank or not."""
    from relulearn.estimators.polish.products import ProductsSystem

    rng = np.random.default_rng(31)
    n, d, k = 20_000, 30, 8
    xt = np.column_stack([rng.standard_normal((n, d)), np.ones(n)])
    rows = rng.standard_normal((k, d + 1))
    y = rng.standard_normal(n)
    system = ProductsSystem(xt, k, biased=True, affine=True, d_in=d)
    for turn in (0.0, 0.05, 0.01, 0.0):
        rows = rows + turn * rng.standard_normal(rows.shape)
        proj = xt @ rows.T
        trusted = np.all(np.abs(proj) >= 0.05, axis=1)
        got = system.solve(trusted, proj > 0, y)
        fresh = ProductsSystem(xt, k, biased=True, affine=True, d_in=d)
        fresh.solve(trusted, proj > 0, y)
        assert np.abs(system._gram - fresh._gram).max() <= 1e-12 * np.abs(fresh._gram).max()
        design = fresh._design(np.flatnonzero(trusted), (proj > 0)[trusted])
        ref = np.linalg.lstsq(design, y[trusted], rcond=None)[0]
        assert np.linalg.norm(got - ref) <= 1e-12 * np.linalg.norm(ref)
    # unit 0 active on every trusted sample: its block repeats the affine columns, and the solve splits them as
    # the minimum-norm solution does
    rows[0] = np.r_[np.zeros(d), 10.0]
    proj = xt @ rows.T
    trusted = np.all(np.abs(proj) >= 0.05, axis=1)
    got = system.solve(trusted, proj > 0, y)
    design = system._design(np.flatnonzero(trusted), (proj > 0)[trusted])
    ref = np.linalg.lstsq(design, y[trusted], rcond=None)[0]
    assert np.linalg.norm(got - ref) <= 1e-12 * np.linalg.norm(ref)


def test_input_gradients_match_finite_differences():
    from relulearn.network import input_gradients

    rng = np.random.default_rng(3)
    net = Network(
        (rng.standard_normal((5, 4)), rng.standard_normal((3, 5)), rng.standard_normal((1, 3))),
        biases=(rng.standard_normal(5), rng.standard_normal(3), rng.standard_normal(1)),
    )
    x = rng.standard_normal((50, 4))
    g = input_gradients(net, x)
    h = 1e-6
    fd = np.stack([(net.forward(x + h * e)[:, 0] - net.forward(x - h * e)[:, 0]) / (2 * h) for e in np.eye(4)], 1)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_subspace_angle_sees_the_function_not_the_parametrization():
    from relulearn.network import subspace_angle

    rng = np.random.default_rng(4)
    u = np.linalg.qr(rng.standard_normal((6, 2)))[0].T
    teacher = Network((u, rng.standard_normal((3, 2)), rng.standard_normal((1, 3))))
    x = rng.standard_normal((20_000, 6))
    assert subspace_angle(teacher, teacher, x) < 1e-12
    # the same function with its units permuted and rescaled, plus a first-layer row in another
    # direction whose outgoing weights are zero: the row space grows, the function does not
    s = np.array([2.0, 0.5])
    w0 = np.vstack([(u * s[:, None])[::-1], rng.standard_normal((1, 6))])
    w1 = np.hstack([(teacher.weights[1] / s[None, :])[:, ::-1], np.zeros((3, 1))])
    same = Network((w0, w1, teacher.weights[2]))
    np.testing.assert_allclose(same.forward(x[:10]), teacher.forward(x[:10]), atol=1e-12)
    assert subspace_angle(teacher, same, x) < 1e-10
    # a network that depends on one of the two directions only misses one: π/2
    one = Network((u[:1], np.ones((1, 1))))
    assert subspace_angle(teacher, one, x) == pytest.approx(np.pi / 2)
    # a tilted subspace: the angle of the tilt
    t = 0.03
    tilted = u.copy()
    tilted[1] = np.cos(t) * u[1] + np.sin(t) * np.linalg.qr(np.vstack([u, rng.standard_normal(6)]).T)[0][:, 2]
    tilted_net = Network((tilted, teacher.weights[1], teacher.weights[2]))
    assert subspace_angle(teacher, tilted_net, x) == pytest.approx(t, rel=1e-6)


def test_compare_counts_biases_up_to_permutation_and_rescaling():
    """Units relu(u·x + b) with output weight λ, output bias c: (λ, u, b) -> (λ s, u / s, b / s) and permutations
    leave the network unchanged; a change of a hidden or the output bias is counted in closed form."""
    rng = np.random.default_rng(3)
    u, b, lam, c = rng.standard_normal((3, 5)), rng.standard_normal(3), np.array([1.5, -0.7, 0.9]), 0.4
    ref = Network((u, lam[None, :]), (b, np.array([c])))
    perm, s = np.array([2, 0, 1]), np.array([0.5, 2.0, 3.0])
    same = Network((u[perm] / s[:, None], (lam[perm] * s)[None, :]), (b[perm] / s, np.array([c])))
    x = rng.standard_normal((100, 5))
    assert np.allclose(ref.forward(x), same.forward(x), rtol=0, atol=1e-12)
    cmp = compare(ref, same)
    assert cmp.relative_error <= 1e-15 and cmp.matching == (1, 2, 0)
    norm2 = float((lam[:, None] ** 2 * (np.column_stack([u, b]) ** 2)).sum()) + c**2
    b2 = b.copy()
    b2[1] += 0.1
    moved = compare(ref, Network((u, lam[None, :]), (b2, np.array([c]))))
    assert np.isclose(moved.relative_error, abs(lam[1]) * 0.1 / np.sqrt(norm2), rtol=1e-12)
    shifted = compare(ref, Network((u, lam[None, :]), (b, np.array([c + 0.2]))))
    assert np.isclose(shifted.relative_error, 0.2 / np.sqrt(norm2), rtol=1e-12)
    # a bias-free learned network against a biased teacher: the biases are missed, not ignored
    free = compare(ref, Network((u, lam[None, :])))
    assert np.isclose(free.relative_error, np.sqrt((lam**2 * b**2).sum() + c**2) / np.sqrt(norm2), rtol=1e-12)


def test_polish_recovers_a_network_with_biases_exactly():
    """Units relu(u·x + b), output bias c: patterns on [x, 1], the output bias solved with the products;
    from hidden rows and biases 0.05 rad off, noiseless labels give the teacher to machine precision."""
    rng = np.random.default_rng(11)
    k, d = 3, 8
    u = rng.standard_normal((k, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    b, lam, c = np.array([0.3, -0.5, 0.8]), np.array([1.2, -0.8, 1.0]), -0.25
    teacher = Network((u, lam[None, :]), (b, np.array([c])))
    x = rng.standard_normal((4000, d))
    y = teacher.forward(x)[:, 0]
    rows = np.column_stack([u, b])
    turn = rng.standard_normal(rows.shape)
    turn -= (turn * rows).sum(1, keepdims=True) * rows / (rows**2).sum(1, keepdims=True)  # orthogonal to each row
    turn *= np.tan(0.05) * np.linalg.norm(rows, axis=1, keepdims=True) / np.linalg.norm(turn, axis=1, keepdims=True)
    start = Network((rows[:, :d] + turn[:, :d], 1.1 * lam[None, :]), (rows[:, d] + turn[:, d], np.array([0.0])))
    out, report = polish(start, x, y)
    assert report.converged and report.stop_reason == "fixed point", report
    assert report.relative_residual <= 1e-13, report
    assert out.biases is not None and compare(teacher, out).relative_error <= 1e-12
