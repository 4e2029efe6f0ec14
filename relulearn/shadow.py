"""Shadow networks of random Xavier networks (Daniely, Srebro, Vardi 2023).

A *paper network* of depth ``i`` (``i`` weight matrices, ``i − 1`` hidden layers, no biases) is

    N(x) = W_i σ(W_{i−1} σ(… σ(W_1 x)))

with Xavier weights (entries of ``W_j`` i.i.d. ``N(0, 1/d_{j−1})``, ``d_{j−1}`` the fan-in, the scalar
output layer included) and an activation normalised so that ``E σ(z)² = 1`` for ``z ~ N(0, 1)``.
Its *shadow* ``Ψ_n`` replaces ``σ`` by the Hermite truncation

    σ_n(z) = Σ_{l ≤ n} a_l h_l(z),   a_l = E[σ(z) h_l(z)],   h_l = He_l / √(l!)

(docs/design.md §3 conventions); ``ε_σ(n) = Σ_{l > n} a_l² = 1 − Σ_{l ≤ n} a_l²`` is what one layer loses
at a standard Gaussian pre-activation. ``Ψ_n`` is a polynomial of degree ``n^{i−1}``.

Activations and their scales
----------------------------
A network file holds an unscaled activation ``f`` (``relu``, ``erf``, ``erf_relu``, ``tanh``) and the
paper's normalisation folded into its weights. The paper's activation is ``σ(z) = f(s z) / ‖f(s·)‖``
with the input scale ``s = 1`` for relu, erf_relu and tanh, and ``s = 1/√2`` for erf (the paper's
erf is ``√2 erf(z/√2)``, normalised: ``σ = √3 erf(z/√2)``). In a file, layer ``j`` of the paper's
network appears as ``s · W_j · ‖f(s·)‖^{-1}`` (input scale folded into its rows, except for the output
layer; output scale into the next layer's columns, except for the first layer).

**The shadow of a network file** (:func:`shadow_network`): every hidden activation ``f`` is replaced by

    f_n(y) = ‖f(s·)‖ · σ_n(y / s) = Σ_{l ≤ n} E[f(s z) h_l(z)] h_l(y / s),

the degree-``n`` Hermite truncation of ``f`` in ``L²(N(0, s²))``, at the fixed scale ``s`` of its
activation name (not at the empirical scale of the pre-activations). For a network planted by a
``random_xavier`` teacher this is exactly the paper's ``Ψ_n``, whatever the folding. For any other
bias-free network it is the same well-defined polynomial network; the bound below then assumes that
each pre-activation is close to ``N(0, s²)`` (Xavier-like scaling: true of ``random_xavier`` and
``deep_relu`` teachers), and :func:`shadow_report` prints the measured pre-activation scales
(``preactivation_scales``, RMS of each hidden layer's pre-activations divided by ``s``) so the
assumption can be checked. Networks with biases and other activations are refused
(:class:`ShadowError`).

The bound
---------
Per hidden unit, RMS over the inputs and the random weights, ``e_j = ‖h_j − g_j‖ / √d_j`` (``h_j``,
``g_j``: hidden vectors of ``N`` and ``Ψ_n``) satisfies ``e_j ≤ Lip · e_{j−1} + √ε̄_j``: the first term
because ``σ`` is ``Lip``-Lipschitz and ``E_W |W_j v|²/d_j = |v|²/d_{j−1}``, the second is the truncation
error at layer ``j``'s pre-activations. The output layer gives ``E_W (N − Ψ_n)² = e_{i−1}²``, so

    ‖N − Ψ_n‖_{L²} ≲ B_n = Σ_{j=1}^{i−1} Lip^{i−1−j} √ε̄_j(n).                         (1)

In the paper's setting (inputs on ``√d S^{d−1}``) every pre-activation is exactly ``N(0, 1)`` over the
weights, ``ε̄_j = ε_σ(n)`` and (1) reads

    B_n = √ε_σ(n) · Σ_{k=0}^{i−2} Lip^k                                                  (2)

(``bound_sphere`` in the report). relulearn's inputs are ``x ~ N(0, I_d)``: layer 1's pre-activation is
``N(0, τ²)`` with ``τ² = |x|²/d ~ χ²_d/d``, and deeper layers follow the length map
``τ_{j+1}² = E_z σ(τ_j z)²`` (infinite width); ``ε̄_j(n) = E_τ E_z[(σ − σ_n)(τ_j z)²]`` is computed
exactly by quadrature (``bound``; it exceeds (2) by ``O(1/d)``, and it grows again with ``n`` once the
truncation's coefficients amplify the ``O(1/√d)`` spread of ``τ``: at ``d = 20`` relu's ``ε̄_1`` is
0.0146 at ``n = 4`` but 0.044 at ``n = 8``). ``Lip`` is the Lipschitz constant of the normalised ``σ``
(relu √2, erf √(6/π), erf_relu 2/‖erf_relu‖, tanh 1/‖tanh‖). The constants, the use of the network's
(not the shadow's) length map, and the infinite-width length map are ours, not the paper's.

(1) is a root-mean-square statement over the random weights, in the units where ``E_W N² = 1``. A
network is compared with it through ``scaled_distance = ‖N − Ψ_n‖ / S`` with
``S² = Σ_k v_k² E_x h_k²`` (``v``: the output weights, ``h_k``: the last hidden layer's values), which is
``≈ 1`` for a Xavier network and makes the comparison invariant to rescaling the output. For depth 2,
``B_n² = ε̄_1(n)`` is not an upper bound but the exact value of ``E_W E_x (N − Ψ_n)²``: one draw of the
weights sits at ``scaled_distance / B_n = 1 ± 0.1`` (over 20 draws at ``d = 20``, width 512: mean
0.97–1.01, standard deviation 0.01–0.08), so :func:`shadow_report` gives instead, for depth 2, the exact
``E_x (N − Ψ_n)²`` of the given weights (:func:`depth2_exact_distance`) and leaves ``within_bound``
undecided (``None``). For depth ≥ 3 the Lipschitz factors leave room (measured ratios 0.5–0.8) and
``within_bound`` is ``scaled_distance <= bound``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from .activations import (
    SUPPORTED_ACTIVATIONS,
    PaperActivation,
    ShadowError,
    _check_activation,
    paper_activation,
)
from .network import ACTIVATIONS, Network

__all__ = [
    "SUPPORTED_ACTIVATIONS",
    "MAX_DEGREE",
    "ShadowError",
    "PaperActivation",
    "paper_activation",
    "normalized_hermite_coefficients",
    "epsilon_sigma",
    "hermite_series",
    "ShadowNetwork",
    "shadow_network",
    "truncation_error_at_scale",
    "length_map",
    "layer_epsilons",
    "shadow_bound",
    "sphere_bound",
    "expected_depth2_distance",
    "depth2_exact_distance",
    "shadow_report",
    "EXACT_MAX_WIDTH",
]

#: largest truncation degree: the coefficients are tabulated up to it (ε_σ(100) is 8e-5 for relu and at
#: rounding level for the smooth activations)
MAX_DEGREE = 100
_LEGENDRE_NODES = 800  # Gauss–Legendre nodes on each side of 0


# --------------------------------------------------------------------------- activations


def _check_degree(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ShadowError(f"the degree must be a whole number, got {n!r}")
    if n < 0:
        raise ShadowError(f"the degree n of the Hermite truncation must be >= 0, got {n}")
    if n > MAX_DEGREE:
        raise ShadowError(
            f"degree {n} is above {MAX_DEGREE}, the largest supported (ε_σ({MAX_DEGREE}) is 8e-5 for "
            f"relu and at rounding level for erf, erf_relu and tanh); use a degree up to {MAX_DEGREE}"
        )
    return int(n)


@cache
def _legendre() -> tuple[np.ndarray, np.ndarray]:
    from scipy.special import roots_legendre  # O(n) asymptotic nodes: 0.1 s where numpy's eigensolver takes 2 s

    return roots_legendre(_LEGENDRE_NODES)


@cache
def normal_rule(lmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights integrating against the N(0, 1) density: Gauss–Legendre (800 nodes each) on
    ``[−L, 0]`` and ``[0, L]`` (every supported activation is smooth except at 0), ``L = 14 + 2√(lmax+1)``
    far in the Gaussian tail for ``h_lmax`` (as :func:`relulearn.hermite.activation_hermite_coefficients`)."""
    edge = 14.0 + 2.0 * math.sqrt(lmax + 1)
    t, wt = _legendre()
    half = edge / 2
    nodes = np.concatenate([-half + half * t, half + half * t])
    weights = np.concatenate([half * wt, half * wt]) * np.exp(-(nodes**2) / 2) / math.sqrt(2.0 * math.pi)
    nodes.flags.writeable = weights.flags.writeable = False
    return nodes, weights


def orthonormal_hermite(z: np.ndarray, lmax: int) -> np.ndarray:
    """``h_0 .. h_lmax`` at ``z`` by the normalised recurrence ``h_{l+1} = (z h_l − √l h_{l−1}) / √(l+1)``
    (no factorials: no overflow for large orders). Shape ``(lmax + 1, *z.shape)``."""
    out = np.empty((lmax + 1,) + z.shape)
    out[0] = 1.0
    if lmax >= 1:
        out[1] = z
    for l in range(1, lmax):
        out[l + 1] = (z * out[l] - math.sqrt(l) * out[l - 1]) / math.sqrt(l + 1)
    return out


@cache
def _all_coefficients(activation: str) -> np.ndarray:
    """``a_0 .. a_MAX_DEGREE``: the rule of :func:`relulearn.hermite.activation_hermite_coefficients` with
    ``breakpoints=(0,)``, evaluated with orthonormal ``h_l`` (no ``He_l / √(l!)`` overflow)."""
    act = paper_activation(activation)
    nodes, weights = normal_rule(MAX_DEGREE)
    a = orthonormal_hermite(nodes, MAX_DEGREE) @ (weights * act(nodes))
    a.flags.writeable = False
    return a


def _coefficients(activation: str, n: int) -> np.ndarray:
    return _all_coefficients(activation)[: n + 1]


def normalized_hermite_coefficients(activation: str, n: int) -> np.ndarray:
    """``a_0 .. a_n``, ``a_l = E[σ(z) h_l(z)]``, of the paper's normalised activation ``σ``.

    Parameters
    ----------
    activation
        File activation name: ``relu``, ``erf``, ``erf_relu`` or ``tanh`` (``σ`` as in :func:`paper_activation`).
    n
        Highest order, ``0 <= n <= MAX_DEGREE``.

    Returns
    -------
    np.ndarray
        Shape ``(n + 1,)``; accurate to about 1e-13 (Gauss–Legendre on both sides of the kink at 0,
        as :func:`relulearn.hermite.activation_hermite_coefficients` with ``breakpoints=(0,)``).
    """
    _check_activation(activation)
    return _coefficients(activation, _check_degree(n)).copy()


def epsilon_sigma(activation: str, n: int) -> float:
    """``ε_σ(n) = Σ_{l > n} a_l² = 1 − Σ_{l ≤ n} a_l²`` for the normalised activation (absolute accuracy ~1e-14)."""
    a = normalized_hermite_coefficients(activation, n)
    return float(max(1.0 - math.fsum(a**2), 0.0))


def hermite_series(z: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """``Σ_l coefficients[l] h_l(z)`` (orthonormal Hermite polynomials), elementwise, by the recurrence
    ``h_{l+1} = (z h_l − √l h_{l−1}) / √(l+1)`` in place (three arrays the size of ``z``)."""
    z = np.asarray(z, dtype=np.float64)
    a = np.asarray(coefficients, dtype=np.float64)
    out = np.full(z.shape, a[0])
    if len(a) == 1:
        return out
    prev, cur, tmp = np.ones_like(z), z.copy(), np.empty_like(z)
    if a[1] != 0:
        out += a[1] * cur
    for l in range(1, len(a) - 1):
        np.multiply(z, cur, out=tmp)
        tmp *= 1.0 / math.sqrt(l + 1)
        prev *= -math.sqrt(l / (l + 1))
        prev += tmp  # prev now holds h_{l+1}
        prev, cur = cur, prev
        if a[l + 1] != 0:  # parity: half the coefficients of relu, erf, erf_relu and tanh vanish
            np.multiply(cur, a[l + 1], out=tmp)
            out += tmp
    return out


# --------------------------------------------------------------------------- the shadow network


def _check_network(net: Network) -> PaperActivation:
    if net.biases is not None:
        raise ShadowError(
            "the network has biases; the shadow network and its bound are defined for bias-free networks "
            "(the paper's random networks have none): use a bias-free network such as a random_xavier teacher"
        )
    if net.depth < 1:
        raise ShadowError("the network has no hidden layer (a linear map is its own shadow)")
    _check_activation(net.activation)
    return paper_activation(net.activation)


@dataclass(frozen=True)
class ShadowNetwork:
    """``Ψ_n`` of a network: each hidden activation ``f`` replaced by
    ``f_n(y) = ‖f(s·)‖ σ_n(y/s)`` (module docstring).

    Attributes
    ----------
    network
        The original network.
    degree
        ``n``.
    activation
        The paper's activation ``σ`` the network's ``f`` stands for.
    coefficients
        ``a_0 .. a_n`` of ``σ``.
    """

    network: Network
    degree: int
    activation: PaperActivation
    coefficients: np.ndarray

    @property
    def polynomial_degree(self) -> int:
        """Degree of ``Ψ_n`` as a polynomial of the input: ``n^{hidden layers}``."""
        return int(self.degree**self.network.depth)

    def hidden(self, y: np.ndarray) -> np.ndarray:
        """``f_n(y)`` for the file's pre-activations ``y``."""
        act = self.activation
        y = np.asarray(y, dtype=np.float64)
        out = hermite_series(y if act.scale == 1.0 else y / act.scale, self.coefficients)
        out *= act.norm
        return out

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Outputs ``(rows, output_dim)`` for inputs ``x`` of shape ``(rows, d)``."""
        h = np.asarray(x, dtype=np.float64)
        for w in self.network.weights[:-1]:
            h = self.hidden(h @ w.T)
        return h @ self.network.weights[-1].T

    __call__ = forward


def shadow_network(net: Network, degree: int) -> ShadowNetwork:
    """The shadow ``Ψ_n`` of a bias-free network with activation relu, erf, erf_relu or tanh.

    Raises
    ------
    ShadowError
        For a network with biases, another activation, no hidden layer, or a degree outside
        ``0..MAX_DEGREE``.
    """
    act = _check_network(net)
    n = _check_degree(degree)
    return ShadowNetwork(net, n, act, _coefficients(act.name, n))


# --------------------------------------------------------------------------- exact expectations


def _residual_on_grid(act: PaperActivation, n: int, y: np.ndarray) -> np.ndarray:
    """``(σ − σ_n)(y)``."""
    return act(y) - hermite_series(y, _coefficients(act.name, n))


def truncation_error_at_scale(activation: str, n: int, tau: np.ndarray | float) -> np.ndarray:
    """``E_z[(σ − σ_n)(τ z)²]``, ``z ~ N(0, 1)``, for each scale ``τ`` (``ε_σ(n)`` at ``τ = 1``)."""
    act = paper_activation(activation)
    n = _check_degree(n)
    tau = np.asarray(tau, dtype=np.float64)
    nodes, weights = normal_rule(n)
    r = _residual_on_grid(act, n, tau.reshape(-1, 1) * nodes)
    return (r**2 @ weights).reshape(tau.shape)


def length_map(activation: str, tau: np.ndarray | float) -> np.ndarray:
    """``τ' = sqrt(E_z σ(τ z)²)``: the RMS of the next layer's pre-activations over Xavier weights
    (infinite width) when this layer's are ``N(0, τ²)``. ``τ' = τ`` for relu; 1 at ``τ = 1`` for all."""
    act = paper_activation(activation)
    tau = np.asarray(tau, dtype=np.float64)
    nodes, weights = normal_rule(0)
    return np.sqrt(act(tau.reshape(-1, 1) * nodes) ** 2 @ weights).reshape(tau.shape)


@cache
def _chi_rule(d: int, points: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``τ`` and weights for ``τ² = |x|²/d ~ χ²_d/d`` (generalised Gauss–Laguerre in ``|x|²/2``)."""
    from scipy.special import roots_genlaguerre

    t, w = roots_genlaguerre(points, d / 2 - 1)
    return np.sqrt(2 * t / d), w / w.sum()


def layer_epsilons(activation: str, n: int, hidden_layers: int, d: int | None = None) -> np.ndarray:
    """``ε̄_j(n) = E_τ E_z[(σ − σ_n)(τ_j z)²]`` for hidden layers ``j = 1..hidden_layers``.

    ``τ_1² = |x|²/d`` with ``x ~ N(0, I_d)`` (``d=None``: the paper's sphere, ``τ_1 = 1``, and then every
    ``ε̄_j = ε_σ(n)``), ``τ_{j+1} = length_map(τ_j)``.
    """
    if d is None:
        tau, weights = np.ones(1), np.ones(1)
    else:
        tau, weights = _chi_rule(int(d))
    out = []
    for _ in range(hidden_layers):
        out.append(float(weights @ truncation_error_at_scale(activation, n, tau)))
        tau = length_map(activation, tau)
    return np.array(out)


def shadow_bound(activation: str, n: int, depth: int, d: int | None = None) -> float:
    """``B_n = Σ_{j=1}^{i−1} Lip^{i−1−j} √ε̄_j(n)`` for a depth-``i`` network (``i`` weight matrices),
    equation (1) of the module docstring; ``d=None`` gives the paper's (2), ``√ε_σ(n) Σ_{k≤i−2} Lip^k``."""
    if depth < 2:
        raise ShadowError(f"depth counts weight matrices and must be at least 2 (one hidden layer), got {depth}")
    lip = paper_activation(activation).lipschitz
    eps = layer_epsilons(activation, n, depth - 1, d)
    return float(sum(lip ** (depth - 1 - j) * math.sqrt(e) for j, e in enumerate(eps, start=1)))


def sphere_bound(activation: str, n: int, depth: int) -> float:
    """The paper's-setting bound (2): ``√ε_σ(n) · Σ_{k=0}^{i−2} Lip^k``."""
    lip = paper_activation(activation).lipschitz
    return float(math.sqrt(epsilon_sigma(activation, n)) * sum(lip**k for k in range(depth - 1)))


def expected_depth2_distance(activation: str, n: int, d: int) -> float:
    """``E_W E_x (N − Ψ_n)²`` for a depth-2 Xavier network on ``x ~ N(0, I_d)`` (any width): the unit's
    pre-activation is ``N(0, τ²)``, ``τ² = |x|²/d ~ χ²_d/d``, and the output weights have variance
    ``1/width``, so it is ``ε̄_1(n) = E_τ E_z[(σ − σ_n)(τ z)²]``."""
    return float(layer_epsilons(activation, n, 1, d)[0])


def depth2_exact_distance(net: Network, degree: int, *, terms: int = 200) -> tuple[float, float]:
    """``E_x (N(x) − Ψ_n(x))²`` exactly, for ``x ~ N(0, I_d)`` and the given one-hidden-layer network.

    With ``N(x) = Σ_k u_k f(w_k·x)``, ``r_k = |w_k|/s``, ``ρ_kk' = cos(w_k, w_k')`` and
    ``b_l(r) = E[(σ − σ_n)(r z) h_l(z)]`` (Mehler's formula for the correlated pair):

        E_x (N − Ψ_n)² = ‖f(s·)‖² [ Σ_k u_k² E_z (σ − σ_n)(r_k z)² + Σ_{k≠k'} u_k u_k' Σ_l b_l(r_k) b_l(r_k') ρ_kk'^l ].

    The diagonal is integrated directly; the series over ``l`` is cut after ``terms`` orders.

    Returns
    -------
    (value, truncation)
        The value and a bound on what the cut series leaves out,
        ``ρ_max^{terms+1} Σ_{k≠k'} |u_k u_k'| ‖δ_k‖ ‖δ_k'‖``.
    """
    act = _check_network(net)
    if net.depth != 1 or net.output_dim != 1:
        raise ShadowError("the exact distance is implemented for one hidden layer and one output")
    n = _check_degree(degree)
    w, u = net.weights[0], net.weights[1][0] * act.norm
    norms = np.linalg.norm(w, axis=1)
    r = norms / act.scale
    unit = w / np.where(norms > 0, norms, 1.0)[:, None]
    nodes, weights = normal_rule(terms)
    delta = _residual_on_grid(act, n, r[:, None] * nodes)  # (k, nodes)
    diag = delta**2 @ weights  # E δ(r_k z)²
    b = (delta * weights) @ orthonormal_hermite(nodes, terms).T  # (k, terms + 1)
    g = unit @ unit.T
    np.fill_diagonal(g, 0.0)
    power = np.ones_like(g)
    np.fill_diagonal(power, 0.0)
    cross = 0.0
    for l in range(terms + 1):
        c = u * b[:, l]
        cross += float(c @ power @ c)
        power *= g
    rho = float(np.abs(g).max(initial=0.0))
    amp = np.abs(u) * np.sqrt(diag)
    tail = rho ** (terms + 1) * float(amp.sum() ** 2 - (amp**2).sum())
    return float(u**2 @ diag + cross), tail


# --------------------------------------------------------------------------- report


def _ratio(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """``mean(a) / mean(b)`` and its standard error (delta method, with the covariance of the two means)."""
    n = len(a)
    ma, mb = float(a.mean()), float(b.mean())
    c = np.cov(a, b) / n
    r = ma / mb
    var = (c[0, 0] - 2 * r * c[0, 1] + r * r * c[1, 1]) / mb**2
    return r, math.sqrt(max(float(var), 0.0))


#: widest layer for which depth2_exact_distance runs in a report (it costs width² × 200 flops)
EXACT_MAX_WIDTH = 2048


def shadow_report(net: Network, degree: int, samples: int = 200_000, seed: int = 0) -> dict[str, Any]:
    """Compare a network with its shadow ``Ψ_n`` on fresh Gaussian inputs, next to the bound.

    Parameters
    ----------
    net
        A bias-free network with one output and activation relu, erf, erf_relu or tanh.
    degree
        ``n``, the degree of the Hermite truncation of the activation.
    samples
        Inputs ``x ~ N(0, I_d)``, drawn from ``generator(seed, Stream.TEST)`` (keyed by the seed; never the
        global random state).
    seed
        Seed of the inputs.

    Returns
    -------
    dict
        JSON-ready, with keys

        - ``activation``, ``depth`` (weight matrices: the paper's ``i``), ``hidden_layers`` (``i − 1``),
          ``widths`` (hidden), ``input_dim``, ``degree`` (``n``), ``polynomial_degree`` (``n^{i−1}``),
          ``lipschitz`` (of the normalised ``σ``);
        - ``epsilon_sigma`` (``ε_σ(n)``), ``layer_epsilons`` (``ε̄_j(n)``, Gaussian inputs), ``bound``
          (``B_n``, equation (1) of the module docstring), ``bound_sphere`` (equation (2));
        - ``samples``, ``seed``; ``mean_square_output`` (``E N²``), ``distance_squared``
          (``E (N − Ψ_n)²``), ``distance`` (its square root), ``relative_distance``
          (``distance / sqrt E N²``), ``output_scale`` (``S``), ``scaled_distance`` (``distance / S``),
          each with a standard error ``<key>_se``;
        - ``ratio_to_bound`` (``scaled_distance / bound``), ``within_bound`` (``scaled_distance <= bound``
          for depth ≥ 3; ``None`` for depth 2, where the bound is the mean over the weights);
        - ``preactivation_scales``: per hidden layer, the RMS of its pre-activations divided by ``s`` (≈ 1
          when the Xavier assumption holds);
        - for depth 2 (widths up to ``EXACT_MAX_WIDTH``): ``exact_distance_squared``, the exact
          ``E_x (N − Ψ_n)²`` of these weights (:func:`depth2_exact_distance`), which
          ``distance_squared`` estimates.

    Raises
    ------
    ShadowError
        For networks or degrees the shadow does not apply to (the message says which and why).
    """
    from .pipeline.batches import Stream, generator

    shadow = shadow_network(net, degree)
    if net.output_dim != 1:
        raise ShadowError(
            f"the network has {net.output_dim} outputs; the report compares a scalar output "
            "(for a configuration, set source.output to pick one)"
        )
    if samples < 2:
        raise ShadowError(f"need at least 2 samples for a standard error, got {samples}")
    act, n, d = shadow.activation, shadow.degree, net.input_dim
    depth = net.depth + 1
    widths = [int(w.shape[0]) for w in net.weights[:-1]]
    v2 = net.weights[-1][0] ** 2
    rng = generator(seed, Stream.TEST)
    diff2, out2, scale2 = np.empty(samples), np.empty(samples), np.empty(samples)
    pre2 = np.zeros(net.depth)
    rows = max(256, min(8192, 2**22 // max(widths + [d])))
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, samples, rows):
            x = rng.standard_normal((min(rows, samples - start), d))
            part = slice(start, start + len(x))
            h, g = x, x
            for j, w in enumerate(net.weights[:-1]):
                y = h @ w.T
                pre2[j] += float(np.sum(y**2)) / y.shape[1]
                h = ACTIVATIONS[net.activation](y)
                g = shadow.hidden(g @ w.T)
            out = h @ net.weights[-1][0]
            diff2[part] = (out - g @ net.weights[-1][0]) ** 2
            out2[part] = out**2
            scale2[part] = h**2 @ v2
    if not np.all(np.isfinite(diff2)):
        raise ShadowError(f"the shadow of degree {n} overflowed on Gaussian inputs; use a lower degree")
    m_d, m_y, m_s = float(diff2.mean()), float(out2.mean()), float(scale2.mean())
    se_d = float(diff2.std(ddof=1) / math.sqrt(samples))
    rel2, rel2_se = _ratio(diff2, out2)
    sc2, sc2_se = _ratio(diff2, scale2)
    dist, rel, scaled = math.sqrt(m_d), math.sqrt(rel2), math.sqrt(sc2)

    def root_se(value: float, se_of_square: float) -> float:  # se of sqrt(q) from se of q
        return se_of_square / (2 * value) if value > 0 else 0.0

    bound = shadow_bound(act.name, n, depth, d)
    report: dict[str, Any] = {
        "activation": act.name,
        "depth": depth,
        "hidden_layers": net.depth,
        "widths": widths,
        "input_dim": d,
        "degree": n,
        "polynomial_degree": shadow.polynomial_degree,
        "lipschitz": act.lipschitz,
        "epsilon_sigma": epsilon_sigma(act.name, n),
        "layer_epsilons": [float(e) for e in layer_epsilons(act.name, n, net.depth, d)],
        "bound": bound,
        "bound_sphere": sphere_bound(act.name, n, depth),
        "samples": int(samples),
        "seed": int(seed),
        "mean_square_output": m_y,
        "mean_square_output_se": float(out2.std(ddof=1) / math.sqrt(samples)),
        "distance_squared": m_d,
        "distance_squared_se": se_d,
        "distance": dist,
        "distance_se": root_se(dist, se_d),
        "relative_distance": rel,
        "relative_distance_se": root_se(rel, rel2_se),
        "output_scale": math.sqrt(m_s),
        "output_scale_se": root_se(math.sqrt(m_s), float(scale2.std(ddof=1) / math.sqrt(samples))),
        "scaled_distance": scaled,
        "scaled_distance_se": root_se(scaled, sc2_se),
        "ratio_to_bound": scaled / bound if bound > 0 else None,
        "within_bound": bool(scaled <= bound) if depth >= 3 else None,
        "preactivation_scales": [float(math.sqrt(p / samples)) / act.scale for p in pre2],
    }
    if net.depth == 1 and widths[0] <= EXACT_MAX_WIDTH:
        report["exact_distance_squared"] = depth2_exact_distance(net, n)[0]
    return report
