"""scikit-learn estimators: the estimator checks, and the same network as `relulearn fit` on the same rows."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import yaml

from conftest import relulearn, require

require("sklearn")

from relulearn import regressors as R  # noqa: E402
from relulearn.methods import METHODS, OPTIONS  # noqa: E402
from relulearn.network import Network  # noqa: E402


@pytest.mark.parametrize(
    "cls",
    [
        R.MomentsRegressor,
        R.TensorRegressor,
        R.FilteredPCARegressor,
        R.ExactRegressor,
        R.PolynomialRegressor,
        R.LandscapeRegressor,
    ],
    ids=lambda c: c.__name__,
)
@pytest.mark.slow
def test_scikit_learn_estimator_checks(cls):
    """A plain `check_estimator` passes, no check declared as expected to fail: on the checks' 20-200 rows the
    statistics support only the mean (a warning and the constant model), and their standard errors come from
    16 chunks (with two, a noise floor had one degree of freedom, and random labels read as a negative output
    weight or parallel columns of U: a refusal of the method's setting)."""
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(cls())


def _set(option: str):
    """A value of ``option`` other than its default (None: the method decides)."""
    o = OPTIONS[option]
    return o.choices[-1] if o.choices else 5 if o.kind.startswith("count") else False


@pytest.mark.parametrize("name", list(METHODS))
def test_every_option_round_trips_through_get_params_and_clone(name):
    """Each estimator's parameters are its method's declared options (the first also by position) and the run's;
    every option set survives get_params and clone, and the construction conventions hold."""
    from sklearn.base import clone
    from sklearn.utils import estimator_checks as ec

    cls = getattr(R, METHODS[name].regressor)
    given = {k: _set(k) for k in METHODS[name].options}
    est = cls(**given, seed=3, whiten=False)
    assert {k: est.get_params()[k] for k in given} == given
    copy = clone(est)
    assert type(copy) is cls and copy.get_params() == est.get_params()
    first = next(iter(given))
    assert cls(given[first]).get_params()[first] == given[first]
    with pytest.raises(TypeError, match=rf"{cls.__name__}.__init__\(\) got an unexpected keyword argument 'colour'"):
        cls(colour=1)
    for check in (
        ec.check_parameters_default_constructible,
        ec.check_get_params_invariance,
        ec.check_set_params,
        ec.check_no_attributes_set_in_init,
        ec.check_estimator_repr,
        ec.check_do_not_raise_errors_in_init_or_set_params,
    ):
        check(cls.__name__, cls())


def planted(rows: int = 200_000, d: int = 10):
    rng = np.random.default_rng(12)
    teacher = Network(
        (rng.standard_normal((3, d)) / np.sqrt(d), np.array([[1.1, -0.9, 0.8]])),
        (0.4 * rng.standard_normal(3), np.array([-0.2])),
    )
    x = rng.standard_normal((rows, d))
    return teacher, x, teacher.forward(x)[:, 0]


def test_moments_regressor_matches_the_cli_on_the_same_rows(tmp_path):
    """`MomentsRegressor().fit(X, y).predict(X)` equals the CLI's network on a config reading the rows the
    estimator wrote (its `run_config`), bit for bit; and both recover the planted network."""
    teacher, x, y = planted()
    est = R.MomentsRegressor(width=3, store=str(tmp_path / "est")).fit(x, y)
    cfg = est.run_config(str(tmp_path / "est" / "x.npy"), str(tmp_path / "est" / "y.npy"), *x.shape)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "cli.npz"
    method = ["--method", "moments", "--width", "3"]
    store = ["--store", str(tmp_path / "cli.zarr")]
    done = relulearn("fit", str(tmp_path / "c.yaml"), *store, *method, "--out", str(out), "--in-process", "--quiet")
    assert done.returncode == 0, done.stderr
    cli = Network.load(out)
    assert all(np.array_equal(a, b) for a, b in zip(est.model_.to_arrays().values(), cli.to_arrays().values()))
    assert np.array_equal(est.predict(x), cli.forward(x)[:, 0])
    assert est.score(x, y) >= 1 - 1e-12 and est.width_ == 3 and est.n_features_in_ == 10
    assert np.max(np.abs(est.predict(x[:1000]) - y[:1000])) <= 1e-10


def test_partial_fit_learns_from_every_row_seen_and_a_client_gives_the_same_network(client):
    """Two halves through partial_fit give the network fit gives on all rows; on two worker processes the
    same bits as in process."""
    _, x, y = planted(rows=120_000)
    whole = R.MomentsRegressor(width=3).fit(x, y)
    parts = R.MomentsRegressor(width=3).partial_fit(x[:60_000], y[:60_000]).partial_fit(x[60_000:], y[60_000:])
    assert parts.n_samples_seen_ == 120_000
    assert np.array_equal(whole.predict(x[:5000]), parts.predict(x[:5000]))
    on_cluster = R.MomentsRegressor(width=3, client=client).fit(x, y)
    assert np.array_equal(whole.predict(x[:5000]), on_cluster.predict(x[:5000]))
    with pytest.raises(ValueError, match=r"X has 9 features, but MomentsRegressor is expecting 10"):
        whole.predict(x[:10, :9])


def test_the_tensor_regressor_keeps_the_conventions_and_learns_a_network_wider_than_its_input():
    """TensorRegressor shares the others' machinery (checked in full above); its own parameters pass the
    checks of construction, get_params/set_params and repr, and it learns from rows a planted network of 8 units
    on d = 6 inputs (the lifted route), to machine precision on the rows."""
    from sklearn.utils import estimator_checks as ec

    est = R.TensorRegressor()
    for check in (
        ec.check_parameters_default_constructible,
        ec.check_get_params_invariance,
        ec.check_set_params,
        ec.check_no_attributes_set_in_init,
        ec.check_estimator_repr,
        ec.check_do_not_raise_errors_in_init_or_set_params,
    ):
        check(type(est).__name__, est)
    rng = np.random.default_rng(3)
    teacher = Network(
        (rng.standard_normal((8, 6)) / np.sqrt(6), rng.choice([-1.0, 1.0], (1, 8))),
        (0.5 * rng.standard_normal(8), np.array([0.3])),
    )
    x = rng.standard_normal((400_000, 6))
    y = teacher.forward(x)[:, 0]
    fitted = R.TensorRegressor(width=8).fit(x, y)
    assert fitted.width_ == 8 and fitted.report_["route"] == "lifted"
    assert np.max(np.abs(fitted.predict(x[:2000]) - y[:2000])) <= 1e-9 * np.max(np.abs(y))


def test_too_few_rows_warn_in_scikit_learn_terms():
    """Rows of pure noise: the warning says the model is the mean and to fit on more rows, not to run a command of
    the command line."""
    from relulearn import MomentsRegressor

    rng = np.random.default_rng(0)
    with pytest.warns(UserWarning, match=r"constant mean\(y\) \(n_samples = 50: fit on more rows") as got:
        MomentsRegressor().fit(rng.standard_normal((50, 4)), rng.standard_normal(50))
    assert not any("relulearn estimate" in str(w.message) for w in got)
