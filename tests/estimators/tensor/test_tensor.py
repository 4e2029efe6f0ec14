"""Method ``tensor``: wide one-hidden-layer ReLU networks (biases, vector outputs) by a joint CP decomposition of
contracted Hermite moments of several orders, then polish."""

from __future__ import annotations

import io

import numpy as np
import pytest
import yaml
from numpy.polynomial.hermite_e import hermeval

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.estimators.base import BudgetError, PassRequest, TooFewSamplesError
from relulearn.estimators.polish.cg import matrix_free, polish_outputs_cg
from relulearn.estimators.polish.dense import polish_outputs
from relulearn.estimators.spectral import stage as spectral
from relulearn.estimators.tensor.outputs import MISFIT_MAX, _from_outputs
from relulearn.estimators.tensor.plan import OUTPUTS_ROUTE_MIN_D, WidthError
from relulearn.estimators.tensor.profile import BETA_GRID, profile
from relulearn.estimators.tensor.slices import _decompose, _lifted_slices
from relulearn.network import Network, compare
from relulearn.pipeline.sources import Stream, generator


def test_the_offset_profile_is_the_hermite_coefficient_of_a_shifted_relu():
    """f_l(β) = E[relu(z + β) He_l(z)] (docs/design.md §3) against adaptive quadrature from the kink (z = −β) on,
    orders 1–7 (f_1 = Φ)."""
    from scipy.integrate import quad

    for beta in (-1.3, 0.0, 0.4, 2.0):
        for order in range(1, 8):
            he = np.eye(order + 1)[order]
            want = quad(
                lambda z, beta=beta, he=he: (z + beta) * hermeval(z, he) * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi),
                -beta,
                np.inf,
                epsabs=1e-12,
                epsrel=1e-12,
                limit=200,
            )[0]
            assert abs(profile(order, beta) - want) <= 1e-11, (beta, order)


def planted(seed: int, d: int, k: int, m: int) -> Network:
    """A random network with biases: unit-scale rows, offsets of order one, signed output weights on m outputs,
    output biases."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((k, d)) / np.sqrt(d)
    a = rng.choice([-1.0, 1.0], (m, k)) * rng.uniform(0.5, 1.5, (m, k))
    return Network((u, a), (0.6 * rng.standard_normal(k), rng.standard_normal(m)))


def turned_start(net: Network, rng: np.random.Generator, angle: float) -> Network:
    """``net`` with every hidden row ``[u, b]`` turned by ``angle`` rad, output weights up to 10 % off and output
    biases 0.1 off."""
    rows = np.column_stack([net.weights[0], net.biases[0]])
    noise = rng.standard_normal(rows.shape)
    noise -= np.sum(noise * rows, axis=1, keepdims=True) * rows / np.sum(rows**2, axis=1, keepdims=True)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    turned = np.cos(angle) * rows + np.sin(angle) * noise * np.linalg.norm(rows, axis=1, keepdims=True)
    return Network(
        (turned[:, :-1], net.weights[1] * rng.uniform(0.9, 1.1, net.weights[1].shape)),
        (turned[:, -1], net.biases[1] + 0.1),
        activation="relu",
    )


@pytest.mark.parametrize("d, k, m, n, matrix_free_expected", [(15, 7, 4, 30_000, False), (90, 64, 10, 3_000, True)])
def test_polish_with_several_outputs_reaches_machine_precision_from_a_start_off(d, k, m, n, matrix_free_expected):
    """Hidden rows shared by m outputs, biases everywhere: from every row turned by 0.1 rad, output weights
    10 % off and output biases 0.1 off, Gauss–Newton on fixed patterns converges to the teacher's rounding —
    with a dense normal matrix, and past :func:`matrix_free` (6,474 unknowns here, from 3,000 samples of 10
    outputs) by conjugate gradients."""
    net = planted(3, d, k, m)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, d))
    y = net.forward(x)
    start = turned_start(net, rng, 0.1)
    assert compare(net, start).relative_error > 0.05
    assert matrix_free(k * (d + 1) + m * (k + 1), m) == matrix_free_expected
    out, rep = polish_outputs(start, x, y)
    assert rep.converged and compare(net, out).relative_error <= 1e-12
    assert np.max(np.abs(out.forward(x) - y)) <= 1e-12 * np.max(np.abs(y))
    assert bool(rep.cg_iterations) == matrix_free_expected
    x_test = np.random.default_rng(5).standard_normal((20_000, d))
    assert np.linalg.norm(out.forward(x_test) - net.forward(x_test)) <= 1e-13 * np.linalg.norm(net.forward(x_test))


_POLISH_SCRIPT = """
import os, sys
import numpy as np
sys.path.insert(0, {tests!r})
if {pin}:
    os.sched_setaffinity(0, {{0}})
from test_tensor import planted, turned_start
from relulearn.aligned import one_blas_thread
from relulearn.estimators.polish.cg import polish_outputs_cg
net = planted(3, 40, 12, 3)
rng = np.random.default_rng(4)
x = rng.standard_normal((24_000, 40))
with one_blas_thread():
    out, _ = polish_outputs_cg(turned_start(net, rng, 0.05), x, net.forward(x), affine=True)
sys.stdout.write(b"".join(np.ascontiguousarray(w).tobytes() for w in (*out.weights, *out.biases)).hex())
"""


def test_the_matrix_free_polish_gives_the_same_bits_on_one_core_and_on_all():
    """Each CG iteration's two products run on two fixed row halves at once: the split does not follow the
    machine's cores, so a process pinned to one core gets the bits of one that has them all."""
    import os
    import subprocess
    from pathlib import Path

    from conftest import PYTHON, cli_env

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to compare with one")
    tests = str(Path(__file__).resolve().parent)
    runs = [
        subprocess.run(
            [PYTHON, "-c", _POLISH_SCRIPT.format(tests=tests, pin=pin)], env=cli_env(), capture_output=True, text=True
        )
        for pin in (False, True)
    ]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    assert len(runs[0].stdout) > 1000 and runs[0].stdout == runs[1].stdout


def test_rarely_active_units_get_their_rows_and_the_polish_then_reaches_machine_precision():
    """A unit active on 1 % of Gaussian inputs (β = −2.3) has ~20 of 2,000 samples for its 61 unknowns: its row
    is not determined and polish stops far off. :func:`.coverage.cover` streams further queries of the source and
    keeps those on the rarer side of each short unit (active for β < 0, inactive for the always-on unit β = 2.3)
    until each has 4(d+1); on that sample polish from 0.1 rad reaches the teacher's rounding."""
    from relulearn.api.execution import HeldOut
    from relulearn.estimators.tensor.coverage import cover, side_counts
    from relulearn.pipeline.sources import TeacherSource

    d, k, m = 60, 8, 3
    rng = np.random.default_rng(3)
    u = rng.standard_normal((k, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    beta = np.array([-2.3, 2.3, -0.5, 0.0, 0.4, 1.0, -1.0, 0.2])
    net = Network((1.5 * u, rng.standard_normal((m, k))), (1.5 * beta, rng.standard_normal(m)), activation="relu")
    draw = HeldOut(TeacherSource(net), 7)
    smp = draw(2_000, 10)
    start = turned_start(net, np.random.default_rng(4), 0.1)
    _, have = side_counts(smp.x_train, u, beta)
    assert have[:2].max() < d + 1 <= have[2:].min()
    x_test = rng.standard_normal((20_000, d))

    def errors(x, y):
        out, _ = polish_outputs(start, x, y)
        return compare(net, out).relative_error, (
            np.linalg.norm(out.forward(x_test) - net.forward(x_test)) / np.linalg.norm(net.forward(x_test))
        )

    assert errors(smp.x_train, smp.y_train)[0] > 1e-3  # rank-deficient rows: no exact answer on this sample
    x_add, y_add, cov = cover(draw, smp.x_train, u, beta)
    assert cov.needed == 4 * (d + 1) and not cov.short_units and cov.rows_added == len(x_add) == len(y_add)
    assert cov.queries <= 1.2 * cov.needed / 0.0107 + 1_000  # the rarer side of |β| = 2.3 holds 1.07 %
    x, y = np.vstack([smp.x_train, x_add]), np.vstack([smp.y_train, y_add])
    assert side_counts(x, u, beta)[1].min() >= cov.needed
    # the source's own labels for the kept queries (to the rounding of a product over another batch)
    assert np.max(np.abs(y_add - net.forward(x_add))) <= 1e-14 * np.max(np.abs(y_add))
    param, test = errors(x, y)
    assert param <= 1e-13 and test <= 1e-13
    # a unit on the smaller side of 10⁻⁹ of the inputs (β = −6) would need 10¹¹ queries: reported short, not drawn
    far = np.vstack([u, u[:1]]), np.r_[beta, -6.0]
    _, _, cov2 = cover(draw, smp.x_train, *far)
    assert cov2.short_units == [k] and cov2.queries == cov.queries


def test_the_matrix_free_polish_takes_the_affine_part_and_matches_the_dense_one():
    """With a free linear term (the units' orientation not known yet) both solvers reach the same fit: the
    labels of a network with some units flipped (``relu(s) = relu(−s) + s``) to the teacher's rounding."""
    net = planted(7, 12, 6, 3)  # 135 unknowns with the affine part: below matrix_free's crossover
    rng = np.random.default_rng(8)
    x = rng.standard_normal((12_000, 12))
    y = net.forward(x)
    assert not matrix_free(6 * 13 + 3 * 7 + 3 * 12, 3)
    flip = np.array([1, 0, 0, 1, 0, 1], bool)
    s = np.where(flip, -1.0, 1.0)
    flipped = Network(
        (s[:, None] * net.weights[0], net.weights[1]), (s * net.biases[0], net.biases[1]), activation="relu"
    )
    start = turned_start(flipped, rng, 0.05)
    dense, rep_dense = polish_outputs(start, x, y, affine=True)
    free, rep_free = polish_outputs_cg(start, x, y, affine=True)
    assert rep_free.cg_iterations and not rep_dense.cg_iterations
    for out, rep in [(dense, rep_dense), (free, rep_free)]:
        assert rep.converged and rep.relative_residual <= 1e-13
        fit = out.forward(x) + x @ rep.linear.T
        assert np.max(np.abs(fit - y)) <= 1e-12 * np.max(np.abs(y))
        # the linear term is exactly the flipped units' linear parts
        want = net.weights[1][:, flip] @ net.weights[0][flip]
        assert np.max(np.abs(rep.linear - want)) <= 1e-10 * np.max(np.abs(want))


def test_compare_counts_every_output_and_is_blind_to_the_symmetries():
    """Permuted, positively rescaled units and the same output biases: error 0; one output weight changed by
    δ: the closed-form error δ²|u,b|² / (Σ|A_ji [u_i, b_i]|² + |c|²), square-rooted."""
    net = planted(5, 8, 4, 3)
    perm, s = np.array([2, 0, 3, 1]), np.array([0.5, 2.0, 1.5, 3.0])
    same = Network(
        (net.weights[0][perm] * s[:, None], net.weights[1][:, perm] / s[None, :]),
        (net.biases[0][perm] * s, net.biases[1]),
        activation="relu",
    )
    assert compare(net, same).relative_error <= 1e-15
    a = net.weights[1].copy()
    a[1, 2] += 0.3
    off = Network((net.weights[0], a), net.biases, activation="relu")
    rows = np.column_stack([net.weights[0], net.biases[0]])
    norm = np.sum((net.weights[1].T[:, :, None] * rows[:, None, :]) ** 2) + np.sum(net.biases[1] ** 2)
    want = np.sqrt(0.09 * np.sum(rows[2] ** 2) / norm)
    assert np.isclose(compare(net, off).relative_error, want, rtol=1e-12)


def file_config(path, d: int, samples: int, **extra) -> dict:
    return {
        "seed": 2,
        "samples": samples,
        "chunk_size": 50_000,
        "source": {"d": d, "teacher": {"file": str(path)}, **extra},
        "run": {"commit_interval": 1e9},
    }


def test_a_planted_network_with_biases_and_three_outputs_is_learned_exactly(tmp_path):
    """Width 6 at d = 12, three outputs of mixed signs, biases: the fit's own statistics, the higher-order pass,
    the decomposition and polish give every parameter to machine precision."""
    teacher = planted(7, 12, 6, 3)
    teacher.save(tmp_path / "t.npz")
    out = str(tmp_path / "m.npz")
    done = api.fit(
        config_from_dict(file_config(tmp_path / "t.npz", 12, 400_000)),
        str(tmp_path / "s.zarr"),
        "tensor",
        out=out,
        client="local",
        progress=None,
    )
    learned = Network.load(out)
    assert done["report"]["width_found"] == 6 and [p["name"] for p in done["passes"]] == ["tensor-1"]
    assert compare(teacher, learned).relative_error <= 1e-10
    x = generator(9, Stream.TEST, 0).standard_normal((50_000, 12))
    y = teacher.forward(x)
    assert np.sum((y - learned.forward(x)) ** 2) / np.sum(y**2) <= 1e-20


def _population_output_moments(net: Network) -> dict:
    """Closed-form ``output_moments`` of a one-hidden-layer ReLU network with biases (docs/design.md §3):
    ``T_1[j] = Σ_i A_ji Φ(β_i) û_i``, ``T_2[j] = Σ_i A_ji φ(β_i) û_i û_iᵀ`` with ``A = a|u|``, ``β = b/|u|``; unit
    standard errors."""
    u, a, b = net.weights[0], net.weights[1], net.biases[0]
    norms = np.linalg.norm(u, axis=1)
    uh, beta, amp = u / norms[:, None], b / norms, a * norms[None, :]
    t1 = (amp * profile(1, beta)) @ uh
    t2 = np.einsum("ji,ia,ib->jab", amp * profile(2, beta), uh, uh)
    return {
        "T1": t1,
        "T1_se": np.full(t1.shape, 1e-6),
        "T2": t2,
        "T2_se": np.full(t2.shape, 1e-6),
        "count": np.asarray(10**12),
    }


def test_the_outputs_route_reads_every_unit_its_offset_and_orientation_off_the_population_moments():
    """With m outputs the m slices T_2[j] separate k > m units (the outputs are the third mode), and T_1 tells
    each unit from its flip (û, β) ↔ (−û, −β), which every order ≥ 2 leaves unchanged: on the closed-form
    moments of a planted network (d = 70, k = 24, m = 5) every direction comes out with its sign to 1e-8 and
    every offset to the β grid's step."""
    net = planted(11, 70, 24, 5)
    units, overcomplete, report = _from_outputs({"output_moments": _population_output_moments(net)}, None, 0)
    assert not overcomplete and report["route"] == "outputs" and report["subspace"]["rank"] == 24
    u, b = net.weights[0], net.biases[0]
    norms = np.linalg.norm(u, axis=1)
    cos = units.directions @ (u / norms[:, None]).T  # signed: the orientation must be right
    match = np.argmax(np.abs(cos), axis=1)
    assert sorted(match.tolist()) == list(range(24))
    assert np.all(cos[np.arange(24), match] >= 1 - 1e-8), np.min(cos[np.arange(24), match])
    step = BETA_GRID[1] - BETA_GRID[0]
    assert np.max(np.abs(units.beta - b[match] / norms[match])) <= step
    assert report["decomposition"]["flipped_by_order_1"] > 0  # some came out of the decomposition reversed


def test_a_wide_input_with_several_outputs_is_learned_from_the_outputs_second_moments_in_one_pass(tmp_path):
    """At d ≥ OUTPUTS_ROUTE_MIN_D with several outputs, `fit` estimates only basic and output_moments (no
    contracted orders, no higher-order pass), and the decomposition of the outputs' T_2 with T_1's orientations,
    then polish, give every parameter to machine precision (d = 64, width 12, 4 outputs)."""
    d, k, m = OUTPUTS_ROUTE_MIN_D, 12, 4
    teacher = planted(5, d, k, m)
    teacher.save(tmp_path / "t.npz")
    out = str(tmp_path / "m.npz")
    done = api.fit(
        config_from_dict(file_config(tmp_path / "t.npz", d, 300_000)),
        str(tmp_path / "s.zarr"),
        "tensor",
        out=out,
        client="local",
        progress=None,
    )
    assert done["passes"] == [] and done["report"]["route"] == "outputs"
    assert set(done["estimate"]["statistics"]) == {"basic", "output_moments"}, done["estimate"]
    learned = Network.load(out)
    assert done["report"]["width_found"] == k
    assert compare(teacher, learned).relative_error <= 1e-10
    x = generator(9, Stream.TEST, 0).standard_normal((50_000, d))
    y = teacher.forward(x)
    assert np.sum((y - learned.forward(x)) ** 2) / np.sum(y**2) <= 1e-20


def test_units_under_the_noise_floor_are_lifted_by_control_variate_rounds(tmp_path):
    """Width 16 at d = 64 with 4 outputs, four units at a quarter of the others' output weights, 10^5 samples:
    the stored T_2 holds only about half the directions above its floor, and the weak units mixed into them leave
    a decomposition misfit far above its noise. The control rounds (fresh samples of what the labels' degree-two
    expansion leaves) raise all 16 above the floor, and polish gives every parameter to machine precision."""
    d, k, m = OUTPUTS_ROUTE_MIN_D, 16, 4
    teacher = planted(5, d, k, m)
    a = teacher.weights[1].copy()
    a[:, :4] *= 0.25
    teacher = Network((teacher.weights[0], a), teacher.biases)
    teacher.save(tmp_path / "t.npz")
    out = str(tmp_path / "m.npz")
    done = api.fit(
        config_from_dict(file_config(tmp_path / "t.npz", d, 100_000)),
        str(tmp_path / "s.zarr"),
        "tensor",
        out=out,
        client="local",
        progress=None,
    )
    rep = done["report"]
    assert rep["first_decomposition"]["rank"] < k and rep["first_decomposition"]["misfit"] > MISFIT_MAX
    assert rep["control_rounds"][0]["noise_ratio"] < 0.5 and rep["subspace"]["rank"] == k
    assert rep["decomposition"]["misfit"] <= MISFIT_MAX
    learned = Network.load(out)
    assert compare(teacher, learned).relative_error <= 1e-10


def test_an_enumeration_past_its_budget_names_the_budget_it_needs_and_the_tensor_method(tmp_path):
    """moments takes --budget; a search that does not fit it is refused with the budget that would do, and the
    same store is then learned by --method tensor, which needs no enumeration."""
    teacher = planted(8, 10, 6, 1)
    teacher.save(tmp_path / "t.npz")
    cfg = config_from_dict(file_config(tmp_path / "t.npz", 10, 200_000))
    with pytest.raises(
        BudgetError,
        match=r"needs a budget of [\d,]+ .*this run has 1,000\. Give --budget \d+ .*"
        r"--method tensor",
    ):
        api.fit(cfg, str(tmp_path / "s.zarr"), "moments", budget=1000, client="local", progress=None)
    done = api.learn(str(tmp_path / "s.zarr"), "tensor", out=str(tmp_path / "m.npz"), client="local", progress=None)
    assert done["width"] == 6 and compare(teacher, Network.load(tmp_path / "m.npz")).relative_error <= 1e-10


def wine_mlp(width: int, folder) -> Network:
    """scikit-learn's MLPRegressor of ``width`` ReLU units trained on its wine data (d = 13, standardised, with
    intercepts), exported by skl2onnx (float32) to ``folder / 'wine.onnx'``; returns its float64 network."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_wine
    from sklearn.neural_network import MLPRegressor

    x, y = load_wine(return_X_y=True)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    mlp = MLPRegressor(hidden_layer_sizes=(width,), max_iter=3000, random_state=0).fit(x, (y - y.mean()) / y.std())
    (folder / "wine.onnx").write_bytes(to_onnx(mlp, x[:1].astype(np.float32)).SerializeToString())
    return Network(
        (mlp.coefs_[0].T.copy(), mlp.coefs_[1].T.copy()), (mlp.intercepts_[0].copy(), mlp.intercepts_[1].copy())
    )


def extract_wine(width: int, samples: int, client, folder) -> tuple[dict, Network, Network]:
    """``fit --method tensor`` on :func:`wine_mlp`'s ONNX file: the result, the teacher and the network learned,
    checked against the teacher's float64 weights: parameter error ≤ 1e-6 (biases and output weights included,
    up to permutation and positive rescaling) and relative test error ≤ 1e-10 on Gaussian inputs."""
    net = wine_mlp(width, folder)
    cfg = {
        "seed": 1,
        "samples": samples,
        "chunk_size": samples // 20,
        "source": {"d": 13, "teacher": {"onnx": str(folder / "wine.onnx")}},
        "run": {"commit_interval": 1e9},
    }
    out = str(folder / "m.npz")
    done = api.fit(config_from_dict(cfg), str(folder / "s.zarr"), "tensor", out=out, client=client, progress=None)
    learned = Network.load(out)
    assert learned.weights[0].shape == (width, 13)
    assert compare(net, learned).relative_error <= 1e-6
    xt = generator(9, Stream.TEST, 0).standard_normal((100_000, 13))
    yt = net.forward(xt)
    assert np.sum((yt - learned.forward(xt)) ** 2) / np.sum(yt**2) <= 1e-10
    return done, net, learned


@pytest.mark.extra("onnx", "sklearn")
@pytest.mark.slow
def test_a_scikit_learn_mlp_of_width_8_on_the_wine_data_is_extracted_on_two_workers(client, tmp_path):
    """Width 8 < d = 13 (the complete route: contracted orders 2–6 in the subspace), from 5·10⁵ samples: the
    float32 model's floor (parameter error 4.3·10⁻⁸, test error 2.1·10⁻¹⁵ when last measured)."""
    done, _, _ = extract_wine(8, 500_000, client, tmp_path)
    assert done["report"]["route"] == "complete" and [p["name"] for p in done["passes"]] == ["tensor-1"]


def test_settings_outside_the_method_are_refused_before_any_store_is_written(tmp_path):
    """A deep teacher names filtered-pca (a network file with two hidden layers); another activation names exact;
    nothing is written."""
    rng = np.random.default_rng(0)
    Network((rng.standard_normal((4, 6)), rng.standard_normal((3, 4)), rng.standard_normal((1, 3)))).save(
        tmp_path / "deep.npz"
    )
    with pytest.raises(ValueError, match=r"one hidden ReLU layer.*2 hidden layer.*--method filtered-pca"):
        api.fit(
            config_from_dict(file_config(tmp_path / "deep.npz", 6, 100_000)),
            str(tmp_path / "a.zarr"),
            "tensor",
            client="local",
            progress=None,
        )
    Network((rng.standard_normal((4, 6)), rng.standard_normal((1, 4))), activation="relu2").save(tmp_path / "r2.npz")
    with pytest.raises(ValueError, match=r"activation 'relu2'.*--method exact"):
        api.fit(
            config_from_dict(file_config(tmp_path / "r2.npz", 6, 100_000)),
            str(tmp_path / "b.zarr"),
            "tensor",
            client="local",
            progress=None,
        )
    assert not any((tmp_path / n).exists() for n in ("a.zarr", "b.zarr"))


@pytest.mark.extra("onnx")
def test_an_onnx_model_with_two_activation_layers_is_refused_naming_filtered_pca(tmp_path):
    deep_onnx(tmp_path / "deep.onnx", 6)
    cfg = {
        "seed": 1,
        "samples": 100_000,
        "chunk_size": 50_000,
        "source": {"d": 6, "teacher": {"onnx": str(tmp_path / "deep.onnx")}},
    }
    with pytest.raises(
        ValueError,
        match=r"the ONNX model .*deep.onnx has 2 activation layer\(s\) \(Relu, Relu\).*"
        r"--method filtered-pca",
    ):
        api.fit(config_from_dict(cfg), str(tmp_path / "c.zarr"), "tensor", client="local", progress=None)
    assert not (tmp_path / "c.zarr").exists()


def deep_onnx(path, d: int) -> None:
    """A float64 ONNX graph of two hidden ReLU layers (MatMul, Relu, MatMul, Relu, MatMul)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    ws = [rng.standard_normal((d, 5)), rng.standard_normal((5, 4)), rng.standard_normal((4, 1))]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"]),
        helper.make_node("Relu", ["h0"], ["r0"]),
        helper.make_node("MatMul", ["r0", "w1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "deep",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [None, d])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [None, 1])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


# ------------------------------------------------------------------------------ wider than d


def unit_rows(rng: np.random.Generator, k: int, d: int) -> np.ndarray:
    u = rng.standard_normal((k, d))
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def largest_angle(found: np.ndarray, truth: np.ndarray) -> float:
    """The largest angle between a true unit direction and the nearest found one (signs ignored)."""
    return float(np.max(np.arccos(np.clip(np.max(np.abs(found @ truth.T), axis=0), 0.0, 1.0))))


def test_the_subspace_power_method_separates_more_units_than_dimensions():
    """20 units in d = 8 (Sym² has dimension 36): from the exact T_4 flattening, SPM gives every direction to
    rounding and the weights, of both signs."""
    from relulearn.estimators.tensor import lifted

    rng = np.random.default_rng(1)
    u, w = unit_rows(rng, 20, 8), rng.choice([-1.0, 1.0], 20) * rng.uniform(0.5, 1.5, 20)
    v = lifted.embed(u)
    m = (v.T * w) @ v
    mu, vec = np.linalg.eigh(m)
    q = vec[:, np.argsort(-np.abs(mu))[:20]]
    dirs, lam = lifted.spm(q.T @ m @ q, q, 8, seed=0)
    assert largest_angle(dirs, u) <= 1e-6
    match = np.argmax(np.abs(dirs @ u.T), axis=0)
    assert np.allclose(lam[match], w, rtol=1e-6)


def test_lifted_slices_of_full_tensors_decompose_an_overcomplete_network_exactly():
    """A network of width 15 at d = 5 (k ≤ d(d+1)/2 = 15): its exact T_4, T_5 and T_6, flattened and contracted
    on symmetric matrices, decompose into its directions, and the profile over orders 2–6 gives every offset
    and output weight (docs/design.md §3's f_l)."""
    from relulearn import hermite

    rng = np.random.default_rng(2)
    k, d = 15, 5
    u, beta = unit_rows(rng, k, d), rng.uniform(-1.0, 1.0, k)
    amp = rng.choice([-1.0, 1.0], k) * rng.uniform(0.5, 1.5, k)
    arrays = {}
    for l in range(3, 7):
        idx = hermite.unique_indices(d, l)
        arrays[f"T{l}"] = np.einsum("i,ip->p", amp * profile(l, beta), np.prod(u[:, idx], axis=2))
        arrays[f"T{l}_se"] = np.full(len(idx), 1e-9)
    m2 = (u.T * (amp * profile(2, beta))) @ u
    sl = _lifted_slices([(m2, np.full((d, d), 1e-9))], [arrays], d, seed=0)
    sub = spectral.relevant_subspace(list(sl.matrices), list(sl.ses))
    assert sub.rank == k
    units, report = _decompose(sl.matrices, sl, sub.basis, 0, d, 1)
    assert report["algorithm"].startswith("Jennrich") and largest_angle(units.directions, u) <= 1e-6
    match = np.argmax(np.abs(units.directions @ u.T), axis=0)
    sign = np.sign(np.sum(units.directions[match] * u, axis=1))  # a direction found as −û has offset −β
    assert np.allclose(sign * units.beta[match], beta, atol=2e-3)  # the β grid's step is 2.5e-3
    assert np.allclose(units.amp[0, match], amp, rtol=1e-2)


@pytest.mark.parametrize(
    "k, d, m, route",
    [
        (8, 12, 1, "least squares"),
        (20, 10, 1, "enumeration"),
        pytest.param(40, 10, 1, "lattice", marks=pytest.mark.extra("wide")),
        (12, 5, 3, "least squares"),
    ],
)
def test_orientation_finds_the_flipped_units_from_the_linear_term(k, d, m, route):
    """Σ_{i ∈ F} A_i u_iᵀ = −L for a random F, with the weights known to 10⁻⁷ (a float32 teacher's rounding):
    the set F comes back exactly, by least squares when m·d ≥ k, enumeration for a few more unknowns, and the
    lattice search for many more."""
    from relulearn.estimators.tensor.orient import orient

    rng = np.random.default_rng(k + d)
    u, a = rng.standard_normal((k, d)), rng.standard_normal((m, k))
    flip = rng.random(k) < 0.5
    lin = -(a[:, flip] @ u[flip])
    lin += 1e-7 * np.linalg.norm(lin) * rng.standard_normal(lin.shape)
    got = orient(a, u, lin, precision=1e-7)
    assert got.method == route and np.array_equal(got.flip, flip), got.to_dict()


@pytest.mark.extra("onnx", "sklearn")
@pytest.mark.slow
def test_a_trained_mlp_wider_than_its_input_is_extracted(client, tmp_path):
    """Width 16 > d = 13: fit finds the full rank, asks for the Hermite tensors to order 6, separates the units on
    symmetric matrices, orients them (16 unknowns, 13 equations: enumeration) and polishes, from 5·10⁵ samples:
    the float32 model's floor (parameter error 4.7·10⁻⁸, test error 1.6·10⁻¹⁵ when last measured)."""
    done, _, _ = extract_wine(16, 500_000, client, tmp_path)
    assert done["report"]["route"] == "lifted" and [p["name"] for p in done["passes"]] == ["tensor-lifted"]
    assert done["report"]["network"]["orientation"]["method"] == "enumeration"


def test_a_width_past_the_identifiable_limit_is_refused_before_any_store_is_written(tmp_path):
    """d = 4: at most d(d+1)/2 = 10 units; width 11 is refused naming the limit and the orders that would lift
    it, and nothing is written."""
    teacher = planted(9, 4, 3, 1)
    teacher.save(tmp_path / "t.npz")
    with pytest.raises(
        WidthError,
        match=r"at most d\(d\+1\)/2 = 10 units at d = 4 \(width 11 asked\).*"
        r"orders 6 and 8",
    ):
        api.fit(
            config_from_dict(file_config(tmp_path / "t.npz", 4, 100_000)),
            str(tmp_path / "s.zarr"),
            "tensor",
            width=11,
            client="local",
            progress=None,
        )
    assert not (tmp_path / "s.zarr").exists()


def test_without_the_lattice_extra_a_width_past_its_equations_is_refused_before_any_sample(tmp_path, monkeypatch):
    """The default install (no fplll): a teacher of 3d = 36 units in d = 12 (more than d + 20: its orientation
    takes the lattice search) is refused by `plan` and `fit` in one line naming the extra, before any store is
    written; so is `--width 33` for a network of unknown width. 36 units of 3 outputs (36 equations) orient
    without it, and the search itself, reached with the extra missing, names it in one line."""
    import sys

    from relulearn.errors import MissingDependencyError
    from relulearn.estimators.tensor.orient import orient

    from conftest import relulearn

    monkeypatch.setitem(sys.modules, "fpylll", None)  # what `import fpylll` does where it is not installed
    planted(5, 12, 36, 1).save(tmp_path / "t.npz")
    cfg = _yaml(tmp_path / "t.yaml", tmp_path / "t.npz")
    for argv in (
        ("plan", cfg, "--method", "tensor"),
        ("fit", cfg, "--store", tmp_path / "s.zarr", "--method", "tensor", "--out", tmp_path / "m.npz"),
    ):
        done = relulearn(*argv)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "orienting 36 units" in line and "pip install 'relulearn[wide]'" in line, line
    assert not (tmp_path / "s.zarr").exists()
    with pytest.raises(MissingDependencyError, match=r"orienting 33 units .*relulearn\[wide\]"):
        api.fit(
            config_from_dict(file_config(tmp_path / "t.npz", 12, 100_000)),
            str(tmp_path / "s.zarr"),
            "tensor",
            width=33,
            client="local",
            progress=None,
        )
    assert not (tmp_path / "s.zarr").exists()
    planted(5, 12, 36, 3).save(tmp_path / "t3.npz")
    done = relulearn("plan", _yaml(tmp_path / "t3.yaml", tmp_path / "t3.npz"), "--method", "tensor")
    assert done.returncode == 0, done.stderr
    rng = np.random.default_rng(40)
    u, a = rng.standard_normal((40, 10)), rng.standard_normal((1, 40))
    with pytest.raises(
        MissingDependencyError, match=r"orienting 40 units from 10 equations .*relulearn\[wide\].*learn again"
    ):
        orient(a, u, -(a[:, :20] @ u[:20]), precision=1e-7)


def _yaml(path, teacher):
    """A configuration of the network file ``teacher`` in d = 12."""
    path.write_text(yaml.safe_dump(file_config(teacher, 12, 100_000)))
    return path


def test_a_width_the_noise_floor_does_not_support_names_the_samples_needed_and_writes_no_pass(tmp_path):
    """One unit of six has output weight 0.01: at 10⁵ samples it is under the noise floor, so --width 6 is
    refused before the higher-order pass, with the count of samples at which it would clear the floor."""
    teacher = planted(4, 12, 6, 1)
    a = teacher.weights[1].copy()
    a[0, 0] = 0.01
    Network((teacher.weights[0], a), teacher.biases).save(tmp_path / "t.npz")
    with pytest.raises(
        TooFewSamplesError,
        match=r"--width 6 asks for more units than the noise floor supports at "
        r"100,000 samples: 5 directions .*Estimate with about [\d,]+ samples",
    ):
        api.fit(
            config_from_dict(file_config(tmp_path / "t.npz", 12, 100_000)),
            str(tmp_path / "s.zarr"),
            "tensor",
            width=6,
            client="local",
            progress=None,
        )
    assert not (tmp_path / "s.zarr" / "passes").exists()


def test_noisy_labels_reach_the_least_squares_ideal(tmp_path):
    """Labels with noise σ = 0.1 (d = 12, width 6, biases): the answer of the decomposition and polish is refined
    on every sample; its excess test error E[(f̂ − f)²] is within 2× of the least-squares ideal σ²·p/n (p = 85
    parameters, n = 4·10⁵ samples)."""
    teacher = planted(7, 12, 6, 1)
    teacher.save(tmp_path / "t.npz")
    sigma, n = 0.1, 400_000
    cfg = config_from_dict(file_config(tmp_path / "t.npz", 12, n, noise_std=sigma))
    done = api.fit(cfg, str(tmp_path / "s.zarr"), "tensor", out=str(tmp_path / "m.npz"), client="local", progress=None)
    assert done["report"]["refinement"]["samples"] == n and done["report"]["chosen"] == "refined"
    learned = Network.load(tmp_path / "m.npz")
    x = generator(9, Stream.TEST, 0).standard_normal((400_000, 12))
    excess = float(np.mean((teacher.forward(x) - learned.forward(x)) ** 2))
    p = 6 * (12 + 1) + 6 + 1
    assert excess <= 2 * sigma**2 * p / n


def _full_family_pass(cfg: dict, projected: dict, url: str) -> dict:
    """The pass an earlier version stored: the full ``contracted`` family along the same directions (lifted
    out of the subspace, ``Bᵀg``) with the same residual labels, on the same samples."""
    from relulearn import open_store
    from relulearn.pipeline.run import estimate

    basis, g = np.asarray(projected["basis"]), np.asarray(projected["directions"])
    section = {"orders": projected["orders"], "directions": (g @ basis).tolist(), "expansion": projected["expansion"]}
    estimate(config_from_dict({**cfg, "statistics": {"contracted": section}}), url, client=None, progress=None)
    return open_store(url).all_arrays()


@pytest.mark.parametrize(("seed", "k", "m", "biased"), [(3, 6, 3, True), (4, 5, 1, False)])
def test_a_planted_network_at_d_20_is_learned_exactly_from_the_pass_in_the_subspace_and_from_a_full_one(
    tmp_path, seed, k, m, biased
):
    """d = 20 (the subspace's products are real BLAS calls), width k < d: the pass is estimated in the
    subspace (``projected_contracted``, k × k) and gives every parameter to machine precision; a store whose
    pass holds the full family (estimated before the pass moved into the subspace) still does."""
    from relulearn import open_store
    from relulearn.api.execution import HeldOut
    from relulearn.estimators.tensor import entry
    from relulearn.pipeline.cost import family_work
    from relulearn.pipeline.sources import make_source

    d = 20
    teacher = planted(seed, d, k, m)
    if not biased:
        teacher = Network(teacher.weights, None, activation="relu")
    teacher.save(tmp_path / "t.npz")
    cfg = file_config(tmp_path / "t.npz", d, 400_000)
    said = io.StringIO()
    done = api.fit(
        config_from_dict(cfg), str(tmp_path / "s.zarr"), "tensor", out=str(tmp_path / "m.npz"), progress=said
    )
    (line,) = [ln for ln in said.getvalue().splitlines() if ln.startswith("pass 'tensor-1'")]
    assert f"inside the {k}-dimensional subspace" in line and "(projected " in line
    (tensor_pass,) = done["passes"]
    run = open_store(tensor_pass["store"])
    assert tensor_pass["name"] == "tensor-1" and "contracted" not in run.statistics
    projected = run.meta["config"]["statistics"]["projected_contracted"]  # the pass in the subspace
    # the plan read the file's width: it priced the pass the learn asked for, per sample to the flop
    planned = done["plan"]["passes"][1]["families"][0]
    assert planned["flops_per_sample"] == family_work("projected_contracted", projected, d, m).flops
    assert np.asarray(run.arrays("projected_contracted")["M"]).shape[-2:] == (k, k)
    assert compare(teacher, Network.load(tmp_path / "m.npz")).relative_error <= 1e-10
    # the same fit from a pass of the full family (d × d slices)
    stored = open_store(str(tmp_path / "s.zarr"))
    full = _full_family_pass({**stored.meta["config"]}, projected, str(tmp_path / "full.zarr"))
    store_cfg = config_from_dict(stored.meta["config"])
    result = entry.learn(stored.all_arrays(), [full], HeldOut(make_source(store_cfg), store_cfg.seed), seed=2)
    assert not isinstance(result, PassRequest)
    assert compare(teacher, result.network).relative_error <= 1e-10


def test_a_pass_projected_again_says_when_it_moved_from_the_plan():
    """Within 30 % of the plan's projection (on the plan's workers) a pass's line gives its projection where it
    runs; past it, both."""
    from relulearn.api.learning import _moved

    assert _moved(10.0, 10.0, 12.0) == "projected 10 s"
    assert _moved(10.0, 10.0, None) == "projected 10 s"
    assert _moved(10.0, 10.0, 40.0) == "projected 10 s at the shapes it has; the plan said 40 s"
    assert _moved(30.0, 30.0, 10.0) == "projected 30 s at the shapes it has; the plan said 10 s"
    # run in process (10 s) where the plan projected two workers (40 s, as the pass is projected there now)
    assert _moved(10.0, 39.0, 40.0) == "projected 10 s"


def test_two_nearly_parallel_units_are_told_apart_by_a_residual_round_on_noiseless_labels(tmp_path):
    """Five units at d = 12, two of them 0.2 rad apart: the first pass sees one direction for the pair (rank 4),
    the network of four units leaves 2·10⁻³ of the labels, and the residual round finds the fifth in what it
    leaves (the tensors of the residual labels on fresh samples: far less noise than the stored ones). With noise
    on the labels no round runs (what the network leaves is then noise)."""
    rng = np.random.default_rng(1)
    d = 12
    u = rng.standard_normal((4, d))
    u /= np.linalg.norm(u, axis=1)[:, None]
    v = rng.standard_normal(d)
    v -= (v @ u[0]) * u[0]
    u = np.vstack([u, np.cos(0.2) * u[0] + np.sin(0.2) * v / np.linalg.norm(v)])
    teacher = Network((u, np.array([[1.0, -0.8, 0.7, 1.2, 0.9]])), (np.array([0.3, -0.2, 0.1, 0.4, -0.5]), [0.1]))
    teacher.save(tmp_path / "t.npz")
    done = api.fit(
        config_from_dict(file_config(tmp_path / "t.npz", d, 400_000)),
        str(tmp_path / "s.zarr"),
        "tensor",
        out=str(tmp_path / "m.npz"),
        client="local",
        progress=None,
    )
    report = done["report"]
    assert report["subspace"]["rank"] == 4 and report["validation_relative_loss"]["decomposition"] > 1e-4
    assert report["chosen"] == "residual-1" and report["residual_rounds"][0]["new"] == 1
    assert compare(teacher, Network.load(tmp_path / "m.npz")).relative_error <= 1e-10
    noisy = api.fit(
        config_from_dict(file_config(tmp_path / "t.npz", d, 400_000, noise_std=0.01)),
        str(tmp_path / "n.zarr"),
        "tensor",
        client="local",
        progress=None,
    )
    assert noisy["report"]["residual_rounds"] == []


def test_units_an_exact_network_does_not_need_are_dropped_and_a_constant_one_goes_into_the_output_bias():
    """A float32 teacher's rounding can be fitted by spare units of output weight near the floor, a polish with a
    free output bias can leave part of it in a unit that is on for every input (offset 10⁶ times its slope), and a
    unit can be off for every input: the exact network keeps the teacher's units bit for bit, the constant moves
    into the output bias; units that carry signal stay."""
    from relulearn.estimators.tensor.finish import FIT_LOSS, _spare_units_dropped

    rng = np.random.default_rng(3)
    teacher = planted(5, 20, 12, 1)
    spare = planted(6, 20, 3, 1)
    slopes = np.vstack([spare.weights[0], 1e-6 * spare.weights[0][:1], spare.weights[0][1:2]])
    offsets = np.r_[spare.biases[0], 0.4, -9.0 * np.linalg.norm(spare.weights[0][1])]
    grown = Network(
        (
            np.vstack([teacher.weights[0], slopes]),
            np.hstack([teacher.weights[1], 1e-7 * spare.weights[1], [[1.5, 2.0]]]),
        ),
        (np.r_[teacher.biases[0], offsets], teacher.biases[1] - 1.5 * 0.4),
    )
    x = rng.standard_normal((20_000, 20))
    y = teacher.forward(x).astype(np.float32).astype(np.float64)

    def loss(net: Network) -> float:
        return float(np.mean((y - net.forward(x)) ** 2) / np.mean(y**2))

    assert loss(grown) < FIT_LOSS
    slim, dropped = _spare_units_dropped(grown, loss)
    assert dropped == [12, 13, 14, 15, 16]
    assert np.array_equal(slim.weights[0], teacher.weights[0]) and np.array_equal(slim.weights[1], teacher.weights[1])
    assert np.array_equal(slim.biases[0], teacher.biases[0])
    assert abs(slim.biases[1][0] - teacher.biases[1][0]) <= 1e-15 * abs(teacher.biases[1][0]) + 1e-15
    # the same units with weights under the floor's fraction that still matter to labels they are part of: the
    # network without them no longer fits, and they stay
    heavy = Network((grown.weights[0][:15], np.hstack([teacher.weights[1], 1e-4 * spare.weights[1]])), None)
    heavy = Network(heavy.weights, (grown.biases[0][:15], teacher.biases[1]))
    y = heavy.forward(x)
    assert _spare_units_dropped(heavy, loss)[1] == []


def test_an_exact_network_with_antiparallel_pairs_is_narrowed_to_the_teacher():
    """A residual round can fit a misoriented unit exactly by adding units antiparallel to others, whose linear
    parts (``A' relu(−s) = A' relu(s) − A' s``) make up the missing ``A s``: the function is the teacher's, the
    network 21 units wider. Merging the pairs, orienting and polishing again gives the teacher's network (d = 20,
    30 units: the orientation has 10 unknowns past its 20 equations)."""
    from relulearn.estimators.tensor.finish import FIT_LOSS, _narrowed

    d, k = 20, 30
    teacher = planted(7, d, k, 1)
    rows = np.column_stack([teacher.weights[0], teacher.biases[0]])
    a = teacher.weights[1][0]
    # unit 0 misoriented: a0 relu(−h0) needs + a0 h0·x̃, made of d + 1 antiparallel partners of units 1..21
    partners = np.arange(1, d + 2)
    coef = np.linalg.solve(rows[partners].T, -a[0] * rows[0])  # Σ −c_j h_j = a0 h0
    wide_rows = np.vstack([-rows[:1], rows[1:], -rows[partners]])
    moved = np.isin(np.arange(1, k), partners) * np.r_[coef, np.zeros(k - 1 - len(partners))]
    wide_a = np.r_[a[0], a[1:] - moved, coef]
    wide = Network((wide_rows[:, :-1], wide_a[None, :]), (wide_rows[:, -1], teacher.biases[1]))
    rng = np.random.default_rng(8)
    x, x_val = rng.standard_normal((30_000, d)), rng.standard_normal((10_000, d))
    y, y_val = teacher.forward(x), teacher.forward(x_val)

    def loss(net: Network) -> float:
        return float(np.mean((y_val - net.forward(x_val)) ** 2) / np.mean(y_val**2))

    assert loss(wide) < 1e-20 and wide.weights[0].shape[0] == k + d + 1
    report: dict = {"validation_relative_loss": {"decomposition": loss(wide)}, "chosen": "decomposition"}
    narrow = _narrowed(wide, x, y, loss, None, report)
    assert report["chosen"] == "merged" and report["validation_relative_loss"]["merged"] == loss(narrow)
    assert narrow.weights[0].shape[0] == k
    assert loss(narrow) < FIT_LOSS
    assert compare(teacher, narrow).relative_error <= 1e-10


def test_a_teacher_wider_than_its_input_is_learned_at_its_width_on_the_lifted_route(tmp_path):
    """Without --width, a teacher whose width the source tells and which is wider than d is learned at that width
    (the lifted route), whatever rank the first pass finds; a --width asked for, and a teacher no wider than d,
    leave the options as they are (the noise floor chooses)."""
    from relulearn.estimators.tensor.entry import check_setting
    from relulearn.pipeline.sources import make_source

    planted(5, 12, 30, 1).save(tmp_path / "wide.npz")
    planted(5, 12, 10, 1).save(tmp_path / "narrow.npz")
    wide = make_source(config_from_dict(file_config(tmp_path / "wide.npz", 12, 100_000)))
    narrow = make_source(config_from_dict(file_config(tmp_path / "narrow.npz", 12, 100_000)))
    assert check_setting(wide, {}, None) == {"width": 30}
    assert check_setting(wide, {"width": 24}, None) == {"width": 24}
    assert check_setting(narrow, {}, None) == {}
