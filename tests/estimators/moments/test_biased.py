"""Networks with biases, Σ λ_i relu(u_i·x + b_i) + c, in the moments method: the lifted search and its answer."""

from __future__ import annotations

import numpy as np
import pytest

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.estimators.moments import biased
from relulearn.network import Network, compare


def lifted_function(z: np.ndarray, a: np.ndarray, lam: np.ndarray) -> np.ndarray:
    return np.maximum(biased.lift(z) @ a.T, 0.0) @ lam


def test_folding_mirrored_pairs_and_affine_units_keeps_the_function():
    """The lifted search may hold a network with a unit mirrored (``λ relu(s) = λ relu(−s) + λ s``) and the
    affine term that makes up for it spread over a mirrored pair and an always-on unit: folded, it is the
    network's ``width`` biased units and output bias again, computing the same function (exactly where the
    always-on unit is on, which the test's inputs are)."""
    rng = np.random.default_rng(0)
    r, width, c = 3, 3, 0.4
    units = rng.standard_normal((width, r + 1))
    lam = np.array([1.3, -0.7, 0.9])
    q = np.r_[0.05 * rng.standard_normal(r), 1.0]  # β / ‖w‖ > 3.09: on for all but a sliver
    gamma, alpha = -1.1, 0.8
    affine = lam[1] * units[1] + c * np.eye(r + 1)[r]  # what mirroring unit 1 leaves, and the output bias
    p = (affine - gamma * q) / alpha  # held as alpha relu(p·z̃) − alpha relu(−p·z̃) + gamma relu(q·z̃)
    a = np.vstack([units[0], p, -units[1], -p, units[2], q])
    w = np.r_[lam[0], alpha, lam[1], -alpha, lam[2], gamma]
    basis = np.linalg.qr(rng.standard_normal((7, r)))[0]
    net = biased.to_biased(a, w, basis, width)
    assert net.weights[0].shape == (width, 7) and net.biases is not None
    z = rng.standard_normal((5000, r))
    z = z[biased.lift(z) @ q > 0]
    want = lifted_function(z, units, lam) + c
    assert np.allclose(lifted_function(z, a, w), want, rtol=0, atol=1e-12)  # the answer as constructed
    got = net.forward(z @ basis.T)[:, 0]
    assert np.max(np.abs(got - want)) <= 1e-12 * np.max(np.abs(want))
    assert abs(net.biases[1][0] - c) <= 1e-12


def planted(seed: int, d: int, k: int) -> Network:
    """A random biased network: unit-scale rows, offsets of order one, signed output weights, output bias."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((k, d)) / np.sqrt(d)
    lam = rng.choice([-1.0, 1.0], k) * rng.uniform(0.5, 1.5, k)
    return Network((u, lam[None, :]), (0.8 * rng.standard_normal(k), np.array([rng.standard_normal()])))


@pytest.mark.slow
@pytest.mark.parametrize("seed, d, k", [(11, 20, 3), (12, 30, 5)])
def test_a_biased_network_file_is_learned_exactly(seed, d, k, tmp_path):
    """A teacher file with b0, b1: biases are learned by default (the file says the network has them) and
    every parameter (units, hidden and output biases) comes out to machine precision."""
    teacher = planted(seed, d, k)
    teacher.save(tmp_path / "t.npz")
    cfg = {
        "seed": seed,
        "samples": 400_000,
        "chunk_size": 50_000,
        "source": {"d": d, "teacher": {"file": str(tmp_path / "t.npz")}},
    }
    out = str(tmp_path / "m.npz")
    got = api.fit(config_from_dict(cfg), str(tmp_path / "s.zarr"), "moments", out=out, client="local", progress=None)
    assert got["width"] == k
    assert compare(teacher, Network.load(out)).relative_error <= 1e-10


def test_a_bias_free_planted_teacher_is_learned_without_biases(tmp_path):
    cfg = {
        "seed": 3,
        "samples": 200_000,
        "chunk_size": 50_000,
        "source": {"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 3}},
    }
    out = str(tmp_path / "m.npz")
    api.fit(config_from_dict(cfg), str(tmp_path / "s.zarr"), "moments", out=out, client="local", progress=None)
    assert Network.load(out).biases is None


def test_biases_are_an_option_of_moments_only(tmp_path):
    with pytest.raises(ValueError, match=r"--biases applies to --method moments only"):
        api.learn(str(tmp_path / "s.zarr"), "filtered-pca", biases=True, client="local", progress=None)


def rotated(net: Network, angle: float, seed: int) -> Network:
    """``net`` with every [u_i, b_i] turned ``angle`` radians in a random direction and the output bias moved."""
    rng = np.random.default_rng(seed)
    rows = np.column_stack([net.weights[0], net.biases[0]])
    out = []
    for r in rows:
        v = rng.standard_normal(len(r))
        v -= (v @ r) / (r @ r) * r
        out.append(np.cos(angle) * r + np.sin(angle) * np.linalg.norm(r) * v / np.linalg.norm(v))
    out = np.array(out)
    return Network((out[:, :-1], net.weights[1]), (out[:, -1], net.biases[1] + 0.1))


def test_the_streamed_refinement_fits_biases_to_machine_precision_from_a_start_off():
    """Noiseless: from every unit 0.15 rad off (directions and offsets) and the output bias 0.1 off, the
    refinement on streamed parts reaches the teacher to rounding."""
    from relulearn.api.execution import HeldOut
    from relulearn.estimators.polish.streamed import refine_streamed
    from relulearn.pipeline.sources import TeacherSource

    teacher = planted(21, 20, 3)
    draw = HeldOut(TeacherSource(teacher), 5)
    start = rotated(teacher, 0.15, 1)
    x_gram, _ = draw.part(0, 20_000)
    got, rep = refine_streamed(start, draw, 100_000, gram_x=x_gram)
    assert compare(teacher, got).relative_error <= 1e-10, rep["stop"]
    assert rep["passes"] <= 40


def test_with_noise_the_biased_refinement_error_falls_as_one_over_root_n():
    """Its fixed point is the least-squares fit on every streamed sample: with label noise the parameter error
    falls as n^{-1/2} — 8× the samples, √8 = 2.8× less error (the error's norm over 49 parameters varies by about
    10 %, so the ratio is above 1.6 with room) — and at 4·10⁵ samples it is below the bounded sample's polish."""
    from relulearn.api.execution import HeldOut
    from relulearn.estimators.polish.dense import polish
    from relulearn.estimators.polish.streamed import refine_streamed
    from relulearn.pipeline.sources import TeacherSource

    teacher = planted(22, 15, 3)
    draw = HeldOut(TeacherSource(teacher, noise_std=0.1), 6)
    x_gram, y_gram = draw.part(0, 20_000)
    start, _ = polish(rotated(teacher, 0.05, 2), x_gram, y_gram)
    errors = {}
    for n in (50_000, 400_000):
        got, rep = refine_streamed(start, draw, n, gram_x=x_gram)
        errors[n] = compare(teacher, got).relative_error
    assert errors[50_000] / errors[400_000] >= 1.6, errors
    assert errors[400_000] < compare(teacher, start).relative_error, errors


def test_the_linear_control_variate_keeps_m2_and_cuts_its_standard_error():
    """`contracted.control`: labels less their pilot expansion ȳ + βᵀx estimate the same M_2 (closed form for
    biased units: Σ λ_i ‖u_i‖ φ(b_i/‖u_i‖) û_i û_iᵀ) within their standard errors, with errors several times
    smaller when the label's mean is large next to its spread (here E[y]² ≈ 10 Var y: 13× smaller)."""
    from scipy.stats import norm

    from relulearn import open_store

    teacher = planted(13, 10, 3)
    teacher = Network(teacher.weights, (teacher.biases[0] + 1.0, teacher.biases[1] + 2.0))
    u, lam, b = teacher.weights[0], teacher.weights[1][0], teacher.biases[0]
    s = np.linalg.norm(u, axis=1)
    want = np.einsum("k,ki,kj->ij", lam * s * norm.pdf(b / s), u / s[:, None], u / s[:, None])
    got = {}
    for control in (None, True):
        cfg = {
            "seed": 4,
            "samples": 200_000,
            "chunk_size": 5_000,  # 40 chunks: the SEs hold to z ~ normal
            "source": {"d": 10, "teacher": {"file": "t.npz"}},
            "statistics": {"contracted": {"orders": [2], "directions": 1, "control": control}},
        }
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as tmp:
            teacher.save(Path(tmp) / "t.npz")
            conf = config_from_dict(cfg, base_dir=tmp)
            api.estimate(conf, str(Path(tmp) / "s.zarr"), client="local", progress=None)
            arr = open_store(str(Path(tmp) / "s.zarr")).arrays("contracted")
            got[control] = (np.asarray(arr["M"])[0], np.asarray(arr["M_se"])[0])
    for m, se in got.values():
        iu = np.triu_indices(10)
        assert np.max(np.abs((m - want)[iu] / se[iu])) <= 4.5  # 55 entries
    assert np.median(got[None][1] / got[True][1]) >= 3.0
