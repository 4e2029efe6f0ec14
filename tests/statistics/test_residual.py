"""The residual-filtered statistic (filtered-pca's extra pass) against closed forms.

``M[c, t] = E[1{|y − F̃_c(Bx)| > τ} (x⊥x⊥ᵀ − (I − BᵀB))]`` for a teacher
``y = λ1 relu(<u1,x>) + λ2 relu(<u2,x>)`` with orthonormal ``u1, u2``, basis ``B = u1``:

- candidate 0 is the exact part ``λ1 relu(z)``: the residual is ``λ2 relu(<u2,x>)``, so with
  ``t = τ/|λ2|``: ``prob = Q(t)`` and ``M = t φ(t) u2 u2ᵀ`` (closed form);
- candidate 1 is the zero network: the residual is ``y`` itself, so ``M`` is the filtered
  matrix of the teacher (by the quadrature of tests/statistics/test_statistics.py) projected off ``u1``.
"""

from __future__ import annotations

import numpy as np
import pytest
from closeness import assert_powerful, check_within
from scipy import special

from relulearn import open_store
from relulearn.config import ConfigError
from relulearn.network import Network
from relulearn.pipeline.run import estimate
from relulearn.pipeline.sources import make_source, pilot_batches
from relulearn.storage import RunStore

from test_statistics import _phi, filtered_truth, orthonormal_rows, run_config

U = orthonormal_rows(np.random.default_rng(5), 2, 6)
LAM = [1.0, -0.8]
TAU = [0.05, 0.3, 0.8]  # τ > 0: at τ = 0 rounding (~1e-16) in y − F̃ would pass the filter


def residual_config(seed: int, samples: int, grid: dict, candidates=None, basis=None):
    if candidates is None:
        candidates = [{"weights": [[[1.0]], [[LAM[0]]]]}, {"weights": [[[0.0]], [[0.0]]]}]
    return run_config(
        seed=seed,
        samples=samples,
        chunk_size=2_000,
        d=6,
        teacher={"kind": "one_hidden_relu", "width": 2, "weights": U.tolist(), "output_weights": LAM},
        statistics={
            "residual": {"basis": (U[:1] if basis is None else basis).tolist(), "candidates": candidates, **grid}
        },
    )


def test_residual_filtered_matches_closed_form(tmp_path):
    cfg = residual_config(303, 200_000, {"thresholds": TAU})
    estimate(cfg, str(tmp_path / "s"), client=None, progress=None)
    run = open_store(str(tmp_path / "s"))
    m, m_se = run.estimate("residual", "M")
    p, p_se = run.estimate("residual", "prob")
    assert m.shape == (2, 3, 6, 6) and p.shape == (2, 3)

    t = np.asarray(TAU) / abs(LAM[1])
    exact_m = (t * _phi(t))[:, None, None] * np.outer(U[1], U[1])
    check_within("residual.M[exact candidate]", m[0], m_se[0], exact_m)
    check_within("residual.prob[exact candidate]", p[0], p_se[0], special.ndtr(-t))
    assert_powerful("residual.M[exact candidate]", exact_m, m_se[0])

    off = np.eye(6) - np.outer(U[0], U[0])
    quad = filtered_truth(np.asarray(LAM), U, TAU)
    zero_m = off @ quad["M"] @ off
    check_within("residual.M[zero candidate]", m[1], m_se[1], zero_m)
    check_within("residual.prob[zero candidate]", p[1], p_se[1], quad["prob"])
    assert_powerful("residual.M[zero candidate]", zero_m, m_se[1])
    # projected off the basis: nothing along u1, in any entry, exactly (up to rounding)
    assert np.abs(np.einsum("ctij,j->cti", m, U[0])).max() < 1e-12


def test_candidates_and_basis_are_stored_with_the_pass(tmp_path):
    cand = Network((np.array([[0.5], [-1.0]]), np.array([[1.0, 2.0]])))
    cfg = residual_config(7, 20_000, {"thresholds": TAU}, candidates=[{"weights": [w.tolist() for w in cand.weights]}])
    estimate(cfg, str(tmp_path / "s"), client=None, progress=None)
    arrays = open_store(str(tmp_path / "s")).arrays("residual")
    np.testing.assert_array_equal(arrays["basis"], U[:1])
    np.testing.assert_array_equal(arrays["candidate0_W0"], cand.weights[0])
    np.testing.assert_array_equal(arrays["candidate0_W1"], cand.weights[1])
    np.testing.assert_array_equal(arrays["tau"], [TAU])
    # readable by xarray with named dimensions
    ds = open_store(str(tmp_path / "s")).dataset("residual")
    assert ds["M"].dims == ("candidate", "tau", "i", "j")


def test_quantile_grid_per_candidate(tmp_path, client):
    """(Bitwise equality of cluster and in-process residual passes is tested at d = 20 in test_cluster.)"""
    q = [0.5, 0.9]
    cfg = residual_config(11, 40_000, {"quantiles": q, "pilot_samples": 50_000})
    estimate(cfg, str(tmp_path / "cluster"), client=client, progress=None)
    a = open_store(str(tmp_path / "cluster")).arrays("residual")
    # τ of each candidate: the pilot's quantiles of that candidate's |residual|
    source = make_source(cfg)
    x, y = (np.concatenate(v) for v in zip(*pilot_batches(source, cfg.seed, 50_000)))
    res = [np.abs(y - LAM[0] * np.maximum(x @ U[0], 0.0)), np.abs(y)]
    np.testing.assert_allclose(a["tau"], np.stack([np.quantile(r, q) for r in res]), rtol=1e-12)
    np.testing.assert_allclose(a["prob"], [[0.5, 0.1], [0.5, 0.1]], atol=0.01)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"basis": np.array([[1.0, 1, 0, 0, 0, 0]])}, "orthonormal"),
        ({"basis": np.array([[1.0, 0, 0]])}, "d=6"),
        ({"candidates": [{"weights": [[[1.0, 0.0]], [[1.0]]]}]}, "candidates[0] maps 2 inputs"),
    ],
)
def test_bad_residual_sections_name_the_key(tmp_path, bad, message):
    cfg = residual_config(1, 4_000, {"thresholds": TAU}, **bad)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        estimate(cfg, str(tmp_path / "s"), client=None, progress=None)
    assert "statistics.residual" in str(err.value)
    assert RunStore(str(tmp_path / "s")).meta() is None  # nothing half-written is left to resume


def test_residual_grid_must_be_one_increasing_grid():
    with pytest.raises(ConfigError, match="strictly increasing"):
        residual_config(1, 4_000, {"quantiles": [0.9, 0.5]})
    with pytest.raises(ConfigError, match="exactly one"):
        residual_config(1, 4_000, {})
