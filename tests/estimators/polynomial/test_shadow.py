"""Shadow networks (Daniely–Srebro–Vardi 2023): normalised activations, Hermite truncations, the planted
random_xavier teacher, the bound, and `relulearn shadow`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermeval
from scipy import integrate
from scipy.special import erf

from relulearn import shadow as S
from relulearn.cli import main
from relulearn.config import ConfigError, RandomXavierTeacher, config_from_dict
from relulearn.hermite import activation_hermite_coefficients, relu_hermite_coefficient
from relulearn.network import ACTIVATIONS, Network
from relulearn.pipeline.sources import Stream, generator, make_source, planted_xavier

ACTS = ("relu", "erf", "erf_relu", "tanh")


def _gauss_mean(g) -> float:
    """E g(z), z ~ N(0, 1), by adaptive quadrature (independent of relulearn's rules)."""
    import warnings

    dens = lambda z: g(z) * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    with warnings.catch_warnings():  # "roundoff error detected": it has reached double precision
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        return sum(
            integrate.quad(dens, a, b, epsabs=1e-15, epsrel=1e-14, limit=200)[0]
            for a, b in ((-np.inf, 0.0), (0.0, np.inf))
        )


def _erf_relu_formula(z):
    return z * erf(z) + (np.exp(-z * z) - 1) / np.sqrt(np.pi) + z


def paper_sigma(name: str):
    """The paper's normalised activation, written out independently of relulearn."""
    if name == "relu":
        return lambda z: math.sqrt(2.0) * np.maximum(z, 0.0)
    if name == "erf":  # √2 erf(z/√2) normalised: E erf(z/√2)² = (2/π) arcsin(1/2) = 1/3
        return lambda z: math.sqrt(3.0) * erf(np.asarray(z) / math.sqrt(2.0))
    f = {"erf_relu": _erf_relu_formula, "tanh": np.tanh}[name]
    norm = math.sqrt(_gauss_mean(lambda z: float(f(z)) ** 2))
    return lambda z: f(np.asarray(z, dtype=float)) / norm


def paper_weights(d: int, widths: list[int], seed: int) -> list[np.ndarray]:
    """The paper's Xavier weights, drawn in layer order from the teacher stream (as planted_xavier's spec says)."""
    rng = generator(seed, Stream.TEACHER)
    dims = [d, *widths, 1]
    return [rng.standard_normal((o, i)) / math.sqrt(i) for i, o in zip(dims[:-1], dims[1:])]


def paper_forward(weights, sigma, x):
    h = x
    for w in weights[:-1]:
        h = sigma(h @ w.T)
    return h @ weights[-1].T


def xavier(act: str, widths: list[int], d: int = 20, seed: int = 0) -> Network:
    return planted_xavier(RandomXavierTeacher(kind="random_xavier", widths=widths, activation=act, seed=seed), d)


# --------------------------------------------------------------------------- activations and coefficients


def test_erf_relu_is_the_integral_of_erf_plus_one():
    f = ACTIVATIONS["erf_relu"]
    z = np.linspace(-6, 6, 241)
    np.testing.assert_allclose(f(z.copy()), _erf_relu_formula(z), rtol=1e-14, atol=1e-14)
    h = 1e-5
    derivative = (f(z + h) - f(z - h)) / (2 * h)
    np.testing.assert_allclose(derivative, erf(z) + 1, atol=1e-9)
    assert f(np.zeros(1))[0] == 0.0
    # no cancellation far left: → −1/√π, and ≈ 2z − 1/√π far right
    np.testing.assert_allclose(
        f(np.array([-40.0, 40.0])), [-1 / math.sqrt(math.pi), 80 - 1 / math.sqrt(math.pi)], rtol=1e-15
    )


@pytest.mark.parametrize("act", ACTS)
def test_normalised_activation_has_unit_second_moment(act):
    sigma = S.paper_activation(act)
    assert _gauss_mean(lambda z: float(sigma(np.array([z]))[0]) ** 2) == pytest.approx(1.0, abs=1e-12)
    nodes, weights = S.normal_rule(S.MAX_DEGREE)  # the module's own rule agrees with its stored norm
    assert float(weights @ sigma(nodes) ** 2) == pytest.approx(1.0, abs=1e-12)
    # and it is the paper's σ
    z = np.linspace(-5, 5, 101)
    np.testing.assert_allclose(sigma(z), paper_sigma(act)(z), rtol=1e-12, atol=1e-13)
    # Parseval: the coefficients carry all of E σ² (up to the tail beyond order 100)
    a = S.normalized_hermite_coefficients(act, S.MAX_DEGREE)
    assert 1 - 2e-4 < float(np.sum(a**2)) <= 1 + 1e-12


def test_relu_coefficients_are_design_c_l_orthonormalised():
    a = S.normalized_hermite_coefficients("relu", 60)
    # docs/design.md §3: c_l = E[relu He_l]; h_l = He_l/√(l!); ‖relu‖² = 1/2
    ref = [relu_hermite_coefficient(l) / math.exp(math.lgamma(l + 1) / 2) / math.sqrt(0.5) for l in range(61)]
    np.testing.assert_allclose(a, ref, rtol=0, atol=1e-12)
    assert S.paper_activation("relu").lipschitz == pytest.approx(math.sqrt(2), rel=1e-12)


@pytest.mark.parametrize("act", ["erf_relu", "tanh"])
def test_coefficients_agree_with_hermite_module(act):
    sigma = paper_sigma(act)
    raw = activation_hermite_coefficients(sigma, 30, quad_points=200, breakpoints=(0.0,))
    ref = raw / np.sqrt([float(math.factorial(l)) for l in range(31)])
    np.testing.assert_allclose(S.normalized_hermite_coefficients(act, 30), ref, rtol=0, atol=1e-12)


def test_parity_zeros():
    """relu and erf_relu: odd part is a multiple of z, so odd orders ≥ 3 vanish; erf and tanh are odd."""
    for act, zero in (
        ("relu", slice(3, None, 2)),
        ("erf_relu", slice(3, None, 2)),
        ("erf", slice(0, None, 2)),
        ("tanh", slice(0, None, 2)),
    ):
        assert np.abs(S.normalized_hermite_coefficients(act, 40)[zero]).max() < 1e-13, act


def test_relu_epsilon_decays_like_n_to_the_minus_three_halves():
    # a_l² = ((l−3)!!)²/(π l!) ~ √2 π^{−3/2} l^{−5/2} for even l, so Σ_{l>n} a_l² → C n^{−3/2} with
    # C = √2/(3 π^{3/2}) = 0.0847. For even n the sum over the even l > n approaches C from below (measured
    # 0.94 C at n = 8, 0.993 C at n = 64); an odd n has ε(n) = ε(n − 1), up to (n/(n−1))^{3/2} ≤ 1.2 more.
    c = math.sqrt(2) / (3 * math.pi**1.5)
    scaled = {n: S.epsilon_sigma("relu", n) * n**1.5 / c for n in range(8, 65)}
    even = [scaled[n] for n in range(8, 65, 2)]
    assert all(0.93 < s < 1.0 for s in even), even
    assert np.all(np.diff(even) > 0)  # monotone towards C
    assert all(0.93 < s < 1.2 for s in scaled.values())


def test_erf_epsilon_decays_geometrically():
    # a_l = √(3/π) (−1/2)^{(l−1)/2} (l−2)!! / √(l!) for odd l (Stein's identity on erf(z/√2) = 2Φ(z) − 1), so
    # a_{l+2}²/a_l² = l²/(4 (l+1)(l+2)) → 1/4: every step of 2 in n multiplies ε by between 0.1 and 1/4.
    def dfact(m):
        return math.prod(range(m, 0, -2)) if m > 0 else 1

    closed = [
        0.0
        if l % 2 == 0
        else math.sqrt(3 / math.pi) * (-0.5) ** ((l - 1) // 2) * dfact(l - 2) / math.sqrt(math.factorial(l))
        for l in range(41)
    ]
    np.testing.assert_allclose(S.normalized_hermite_coefficients("erf", 40), closed, rtol=0, atol=1e-12)
    eps = np.array([S.epsilon_sigma("erf", n) for n in range(1, 22, 2)])
    ratio = eps[1:] / eps[:-1]
    assert np.all((ratio > 0.1) & (ratio <= 0.25)), ratio
    assert np.all(np.diff(ratio) > 0)  # tends to 1/4 from below
    assert eps[-1] < 1e-8


def test_degree_and_activation_errors():
    with pytest.raises(S.ShadowError, match=">= 0"):
        S.epsilon_sigma("relu", -1)
    with pytest.raises(S.ShadowError, match="softplus"):
        S.paper_activation("softplus")
    with pytest.raises(S.ShadowError, match="biases"):
        S.shadow_network(Network((np.ones((2, 3)), np.ones((1, 2))), (np.ones(2), np.ones(1))), 2)


# --------------------------------------------------------------------------- the planted network and its shadow


@pytest.mark.parametrize("act", ACTS)
def test_planted_random_xavier_is_the_papers_network(act):
    d, widths, seed = 7, [9, 6, 5], 3
    net = xavier(act, widths, d, seed)
    assert net.biases is None and net.activation == act and [w.shape[0] for w in net.weights] == [9, 6, 5, 1]
    x = np.random.default_rng(1).standard_normal((500, d)) * 1.5
    ref = paper_forward(paper_weights(d, widths, seed), paper_sigma(act), x)
    got = net.forward(x)
    assert np.abs(got - ref).max() <= 1e-12 * np.abs(ref).max()


@pytest.mark.parametrize("act", ACTS)
def test_shadow_is_the_papers_psi_n(act):
    d, widths, seed = 6, [8, 5], 2
    net = xavier(act, widths, d, seed)
    weights = paper_weights(d, widths, seed)
    x = np.random.default_rng(4).standard_normal((300, d))
    scale = np.abs(paper_forward(weights, paper_sigma(act), x)).max()  # Ψ_0 of an odd σ is 0: compare on N's scale
    # σ_n from the hermite module's quadrature and numpy's HermiteE series: independent of relulearn.shadow
    coef = activation_hermite_coefficients(paper_sigma(act), 5, quad_points=200, breakpoints=(0.0,))
    for n in range(0, 6):
        he = coef[: n + 1] / np.array([float(math.factorial(l)) for l in range(n + 1)])  # a_l h_l = (c_l/l!) He_l
        ref = paper_forward(weights, lambda z, he=he: hermeval(z, he), x)
        got = S.shadow_network(net, n).forward(x)
        assert np.abs(got - ref).max() <= 1e-10 * max(np.abs(ref).max(), scale), (act, n)
        assert S.shadow_network(net, n).polynomial_degree == n**2


def test_random_xavier_config():
    cfg = config_from_dict(
        {
            "seed": 0,
            "samples": 10,
            "source": {"d": 5, "teacher": {"kind": "random_xavier", "widths": [4, 3], "activation": "erf", "seed": 2}},
        }
    )
    assert isinstance(cfg.source.teacher, RandomXavierTeacher)
    net = make_source(cfg).network
    assert net.fingerprint() == xavier("erf", [4, 3], 5, 2).fingerprint()
    with pytest.raises(ConfigError, match="at least 1"):
        config_from_dict(
            {"seed": 0, "samples": 10, "source": {"d": 5, "teacher": {"kind": "random_xavier", "widths": [4, 0]}}}
        )
    with pytest.raises(ConfigError, match="activation"):
        config_from_dict(
            {
                "seed": 0,
                "samples": 10,
                "source": {"d": 5, "teacher": {"kind": "random_xavier", "widths": [4], "activation": "softplus"}},
            }
        )


# --------------------------------------------------------------------------- distances and the bound


@pytest.mark.parametrize("act,n", [("relu", 4), ("erf", 3), ("erf_relu", 2)])
def test_depth2_expectation_over_weights_and_gaussian_inputs(act, n):
    """E_W E_x (N − Ψ_n)² = E δ(w·x)² for one Xavier unit w ~ N(0, I/d) and x ~ N(0, I_d): Monte Carlo over
    both against the χ²-quadrature, which exceeds the sphere's ε_σ(n) (the paper's setting) at d = 20."""
    d, m = 20, 400_000
    rng = np.random.default_rng(7)
    t = np.einsum("ij,ij->i", rng.standard_normal((m, d)) / math.sqrt(d), rng.standard_normal((m, d)))
    sigma = S.paper_activation(act)
    delta2 = (sigma(t) - S.hermite_series(t, S.normalized_hermite_coefficients(act, n))) ** 2
    mean, se = delta2.mean(), delta2.std() / math.sqrt(m)
    expected = S.expected_depth2_distance(act, n, d)
    assert abs(mean - expected) < 4 * se
    assert expected > S.epsilon_sigma(act, n) + 4 * se
    assert S.shadow_bound(act, n, 2, d) == pytest.approx(math.sqrt(expected), rel=1e-14)
    assert S.shadow_bound(act, n, 2) == pytest.approx(math.sqrt(S.epsilon_sigma(act, n)), rel=1e-10)


# degrees where the truncation changes (σ_3 = σ_2 for relu and erf_relu, σ_2 = σ_1 and σ_4 = σ_3 for erf)
CASES = [
    ("relu", 1),
    ("relu", 2),
    ("relu", 4),
    ("erf", 1),
    ("erf", 3),
    ("erf_relu", 1),
    ("erf_relu", 2),
    ("erf_relu", 4),
]


@pytest.mark.parametrize("act,n", CASES)
def test_depth2_measured_distance_is_the_exact_one(act, n):
    net = xavier(act, [256])
    r = S.shadow_report(net, n, samples=20_000, seed=1)
    assert r["depth"] == 2 and r["within_bound"] is None and r["polynomial_degree"] == n
    assert abs(r["distance_squared"] - r["exact_distance_squared"]) < 4 * r["distance_squared_se"]
    # and the comparison is sharp enough to tell the exact value from the sphere's ε_σ(n)
    assert 4 * r["distance_squared_se"] < abs(r["exact_distance_squared"] - r["epsilon_sigma"])
    # one draw of the weights near the mean over weights (bound² = E_W E_x); at width 512, 20 draws gave
    # ratios 0.97–1.01 on average, standard deviation ≤ 0.08: these weights are a fixed, typical draw
    assert 0.8 < r["ratio_to_bound"] < 1.2


@pytest.mark.parametrize("act,n", CASES)
def test_depth3_measured_distance_is_within_the_bound(act, n):
    net = xavier(act, [256, 256])
    r = S.shadow_report(net, n, samples=10_000, seed=1)
    assert r["depth"] == 3 and r["polynomial_degree"] == n**2
    assert r["within_bound"] is True
    assert r["scaled_distance"] + 4 * r["scaled_distance_se"] < r["bound"]
    assert all(0.9 < s < 1.1 for s in r["preactivation_scales"])  # the Xavier assumption, measured


def test_report_uses_the_test_stream_not_global_state():
    net = xavier("relu", [16])
    np.random.seed(0)
    a = S.shadow_report(net, 2, samples=2000, seed=5)
    np.random.seed(1)
    b = S.shadow_report(net, 2, samples=2000, seed=5)
    assert a == b
    assert S.shadow_report(net, 2, samples=2000, seed=6)["distance_squared"] != a["distance_squared"]


# --------------------------------------------------------------------------- the command line

KEYS = {
    "teacher",
    "activation",
    "depth",
    "hidden_layers",
    "widths",
    "input_dim",
    "degree",
    "polynomial_degree",
    "lipschitz",
    "epsilon_sigma",
    "layer_epsilons",
    "bound",
    "bound_sphere",
    "samples",
    "seed",
    "mean_square_output",
    "mean_square_output_se",
    "distance_squared",
    "distance_squared_se",
    "distance",
    "distance_se",
    "relative_distance",
    "relative_distance_se",
    "output_scale",
    "output_scale_se",
    "scaled_distance",
    "scaled_distance_se",
    "ratio_to_bound",
    "within_bound",
    "preactivation_scales",
}


def _config(tmp_path, teacher: dict, d: int = 12) -> str:
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"seed": 1, "samples": 1000, "source": {"d": d, "teacher": teacher}}))
    return str(path)


def test_cli_shadow_on_a_config(tmp_path, capsys):
    cfg = _config(tmp_path, {"kind": "random_xavier", "widths": [64], "activation": "erf_relu", "seed": 4})
    assert main(["shadow", cfg, "--degree", "2", "--samples", "3000", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert KEYS | {"exact_distance_squared"} == set(r)
    assert (r["activation"], r["depth"], r["widths"], r["degree"], r["input_dim"]) == ("erf_relu", 2, [64], 2, 12)
    assert r["epsilon_sigma"] == pytest.approx(S.epsilon_sigma("erf_relu", 2))
    # people: a short table
    assert main(["shadow", cfg, "--degree", "2", "--samples", "3000"]) == 0
    out = capsys.readouterr().out
    for word in ("activation", "depth", "ε_σ(n)", "bound", "distance", "within bound"):
        assert word in out


def test_cli_shadow_on_a_network_file(tmp_path, capsys):
    path = tmp_path / "teacher.npz"
    xavier("erf", [32, 32], d=8).save(path)
    assert main(["shadow", str(path), "--degree", "3", "--samples", "3000", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert KEYS == set(r) and r["depth"] == 3 and r["polynomial_degree"] == 9 and r["within_bound"] is True
    assert main(["shadow", str(path), "--degree", "3", "--samples", "3000"]) == 0
    assert "within bound  yes" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "negative", "softplus", "biases", "too_high"])
def test_cli_shadow_bad_input(tmp_path, capsys, case):
    net = tmp_path / "net.npz"
    degree, expect = "2", ""
    if case == "missing":
        net, expect = tmp_path / "absent.npz", "does not exist"
    elif case == "negative":
        xavier("relu", [4], d=3).save(net)
        degree, expect = "-1", ">= 0"
    elif case == "softplus":
        Network((np.ones((2, 3)), np.ones((1, 2))), activation="softplus").save(net)
        expect = "not 'softplus'"
    elif case == "biases":
        Network((np.ones((2, 3)), np.ones((1, 2))), (np.ones(2), np.ones(1))).save(net)
        expect = "biases"
    else:
        xavier("relu", [4], d=3).save(net)
        degree, expect = "101", "up to 100"
    assert main(["shadow", str(net), "--degree", degree, "--samples", "100"]) == 2
    captured = capsys.readouterr()
    assert expect in captured.err and "Traceback" not in captured.err + captured.out
