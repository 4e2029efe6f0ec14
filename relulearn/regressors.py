"""scikit-learn estimators over the learning methods: ``fit(X, y)``, ``predict``, ``score``, ``partial_fit``.

Each estimator streams its in-memory arrays through the same statistics as ``relulearn fit`` on a data source
(:mod:`relulearn.pipeline.data`): ``fit`` writes ``X`` and ``y`` as ``.npy`` files in a working folder, runs
:func:`relulearn.api.fit` on them (in process, or on the Dask cluster of ``client``) and keeps the learned model in
raw coordinates (``model_``). A ``MomentsRegressor(seed=s)`` fitted on ``X, y`` gives the network that
``relulearn fit`` gives on a config reading the same rows with the same seed and chunk size
(:meth:`_Regressor.run_config` is that config).

The methods need many samples (10⁴–10⁷ rows). On fewer rows than a method's bounded samples, those samples
are all the rows (training and validation overlap); when the statistics then hold nothing above their noise
floor, ``fit`` warns and the model is the constant ``mean(y)``.
"""

from __future__ import annotations

import inspect
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from .methods import METHODS, OPTIONS, parameter_lines

__all__ = [
    "MomentsRegressor",
    "TensorRegressor",
    "FilteredPCARegressor",
    "ExactRegressor",
    "PolynomialRegressor",
    "LandscapeRegressor",
]

#: rows per chunk at most; fewer so that every row is used when the data is small (chunks are equal)
CHUNK_ROWS = 50_000


#: rows a fit needs at least: two chunks of two rows (standard errors are taken over chunks)
MIN_ROWS = 4


#: chunks a fit's statistics are taken over at least (rows permitting: chunks of two rows or more): a standard
#: error over K chunks has K − 1 degrees of freedom, and the methods' noise floors and setting checks rest on them
MIN_CHUNKS = 16


def chunking(rows: int) -> tuple[int, int]:
    """``(chunk_size, samples)``: equal chunks, at least :data:`MIN_CHUNKS` where the rows allow chunks of two
    rows (at least two chunks), of at most :data:`CHUNK_ROWS` rows, covering all but fewer than one row per
    chunk."""
    chunks = max(2, min(MIN_CHUNKS, int(rows) // 2), -(-int(rows) // CHUNK_ROWS))
    size = int(rows) // chunks
    return size, size * chunks


#: the parameters every estimator takes after its method's options: the data, the run, the cluster
_RUN_PARAMETERS = (
    (
        "whiten",
        True,
        "bool",
        "Whiten the inputs with their mean and covariance (the model is mapped back to raw inputs).",
    ),
    ("seed", 0, "int", "The run's seed."),
    (
        "chunk_size",
        None,
        "int | None",
        "Rows per chunk (default: equal chunks of at most 50,000 rows covering the data).",
    ),
    ("client", None, "Any", "A ``distributed.Client`` to compute on (default: in process)."),
    (
        "store",
        None,
        "str | None",
        "A folder that keeps the data files and the statistics (default: a temporary folder, removed).",
    ),
)

_ATTRIBUTES = """Attributes
----------
model_ : relulearn.Network or relulearn.PolynomialModel
    The learned model, of raw inputs.
width_ : int
    Its hidden units (a network).
report_ : dict
    The method's report (as ``relulearn fit --json``).
n_features_in_, n_samples_seen_, samples_used_ : int
    Input width, rows given, rows the statistics used (whole chunks)."""


def _signature(method: str) -> inspect.Signature:
    """An estimator's ``__init__`` signature: its method's options (:attr:`relulearn.methods.Method.options`; the
    first may be given by position), then :data:`_RUN_PARAMETERS`."""
    kinds = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    options = [
        inspect.Parameter(name, kinds[i > 0], default=None, annotation=OPTIONS[name].annotation)
        for i, name in enumerate(METHODS[method].options)
    ]
    run = [inspect.Parameter(n, kinds[1], default=v, annotation=a) for n, v, a, _ in _RUN_PARAMETERS]
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.Signature([self, *options, *run], return_annotation="None")


def _docstring(summary: str, method: str) -> str:
    """An estimator's docstring: ``summary``, then its parameters as its method declares them, then its attributes."""
    lines = ["Parameters", "----------"]
    for name, text in METHODS[method].options.items():
        lines += parameter_lines(name, _doc_type(OPTIONS[name].annotation), text)
    for name, _, annotation, text in _RUN_PARAMETERS:
        lines += parameter_lines(name, _doc_type(annotation), text)
    return "\n\n".join([inspect.cleandoc(summary), "\n".join(lines), _ATTRIBUTES]) + "\n"


def _doc_type(annotation: str) -> str:
    """A parameter's type as numpydoc lists it: ``int, optional`` for ``int | None``."""
    return {"Any": "distributed.Client, optional"}.get(annotation, annotation.replace(" | None", ", optional"))


class _Regressor(RegressorMixin, BaseEstimator):
    """Shared machinery; a subclass sets ``_method``, and its ``__init__`` and parameter list are made from the
    method's declaration (:func:`_signature`, :func:`_docstring`: scikit-learn reads the signature)."""

    _method = "moments"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        signature = _signature(cls._method)

        def __init__(self: _Regressor, *args: Any, **params: Any) -> None:
            try:
                bound = signature.bind(self, *args, **params)
            except TypeError as err:  # as Python words it for a written-out __init__
                raise TypeError(f"{type(self).__name__}.__init__() {err}") from None
            bound.apply_defaults()
            for name, value in list(bound.arguments.items())[1:]:  # kept unchanged (scikit-learn's convention)
                setattr(self, name, value)

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        __init__.__qualname__ = f"{cls.__name__}.__init__"
        cls.__init__ = __init__  # type: ignore[assignment]
        cls.__doc__ = _docstring(cls.__doc__ or "", cls._method)

    # ----------------------------------------------------------------- config

    def run_config(self, x_path: str, y_path: str, rows: int, d: int) -> dict[str, Any]:
        """The run configuration ``fit`` uses for ``rows`` rows of width ``d`` in the given files."""
        size, samples = (
            chunking(rows) if self.chunk_size is None else (self.chunk_size, rows // self.chunk_size * self.chunk_size)
        )
        return {
            "seed": int(self.seed),
            "samples": int(samples),
            "chunk_size": int(size),
            "source": {"d": int(d), "data": {"x": x_path, "y": y_path, "whiten": bool(self._whiten_source())}},
        }

    def _whiten_source(self) -> bool:
        return self.whiten

    def _method_options(self) -> dict[str, Any]:
        """The parameters that are the method's options (:attr:`relulearn.methods.Method.options`)."""
        taken = {"width", *METHODS[self._method].options}
        return {k: getattr(self, k) for k in self._get_param_names() if k in taken}

    # ---------------------------------------------------------------- fitting

    def fit(self, X: Any, y: Any) -> _Regressor:
        """Estimate the method's statistics on the rows of ``X`` (n, d) and ``y`` (n,) and learn the model.

        Returns
        -------
        self
        """
        X, y = validate_data(self, X, y, y_numeric=True, dtype=np.float64)
        self._rows = [(X, y)]
        return self._fit_rows(X, y)

    def partial_fit(self, X: Any, y: Any) -> _Regressor:
        """Add the rows of ``X, y`` to those seen so far and learn again on all of them.

        The statistics are sums over rows, but a store is tied to its data's bytes, so every call estimates
        them afresh on all rows seen (kept in memory): the cost of a call grows with the rows seen.
        """
        first = not hasattr(self, "_rows")
        X, y = validate_data(self, X, y, y_numeric=True, dtype=np.float64, reset=first)
        self._rows = ([] if first else self._rows) + [(X, y)]
        return self._fit_rows(np.concatenate([r[0] for r in self._rows]), np.concatenate([r[1] for r in self._rows]))

    def _fit_rows(self, X: np.ndarray, y: np.ndarray) -> _Regressor:
        from . import api
        from .config import config_from_dict
        from .estimators.base import NoSignalError
        from .network import Network
        from .polynomial import load_model

        n, d = X.shape
        if y.ndim != 1:
            raise ValueError(f"{type(self).__name__} learns one label per row; y has shape {y.shape}")
        if n < MIN_ROWS:
            raise ValueError(
                f"n_samples = {n}: {type(self).__name__} needs at least {MIN_ROWS} rows (standard errors "
                "come from two chunks or more), and the methods need 10⁴ rows or more to learn"
            )
        with tempfile.TemporaryDirectory(prefix="relulearn-") as tmp:
            work = Path(self.store) if self.store is not None else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            x_path, y_path = work / "x.npy", work / "y.npy"
            X_in, self.whitening_ = self._prepare(X)
            np.save(x_path, np.ascontiguousarray(X_in))  # rows contiguous, as the data source reads them
            np.save(y_path, y)
            cfg = config_from_dict(self.run_config(str(x_path), str(y_path), n, d))
            store = work / "statistics.zarr"
            if store.exists():  # a refit of other rows: a fresh store
                import shutil

                shutil.rmtree(store)
            try:
                result = api.fit(
                    cfg,
                    str(store),
                    self._method,
                    client=self.client or "local",
                    progress=None,
                    out=str(work / "model.npz"),
                    **self._method_options(),
                )
                self.model_ = load_model(work / "model.npz")
            except NoSignalError as err:  # nothing above the noise floor: the mean is all these rows support
                # the error speaks to command-line users (`relulearn estimate ... --samples N`); here the fix is rows
                why = str(err).split("; estimate with more samples")[0]
                more = "fit on more rows to learn the network" if err.more_samples else "more rows will not help"
                warnings.warn(
                    f"{type(self).__name__}: {why}; the model is the constant mean(y) (n_samples = {n:,}: {more})",
                    UserWarning,
                    stacklevel=3,
                )
                result = {"report": {"unresolved": str(err)}, "samples": cfg.samples, "kind": "network", "width": 0}
                self.model_ = Network(
                    (np.zeros((0, d)), np.zeros((1, 0))), (np.zeros(0), np.array([float(np.mean(y))]))
                )
        self.report_ = result["report"]
        self.n_samples_seen_ = int(n)
        self.samples_used_ = int(result["samples"])
        if result.get("kind") == "network":
            self.width_ = int(result["width"])
        return self

    def _prepare(self, X: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """The rows written for the run, and a whitening ``predict`` must apply itself (None: the model maps
        raw inputs)."""
        return X, None

    # ------------------------------------------------------------- predicting

    def predict(self, X: Any) -> np.ndarray:
        """The learned model's output for each row of ``X`` (n, d)."""
        check_is_fitted(self, "model_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        if self.whitening_ is not None:
            mu, a = self.whitening_
            X = (X - mu) @ a.T
        return self.model_.forward(X)[:, 0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # the methods learn networks of Gaussian-like inputs from 10⁴ rows and more; scikit-learn's score check
        # fits 200 rows of a linear target (degree 1: no second-moment signal), where they find only the mean
        tags.regressor_tags.poor_score = True
        return tags


class MomentsRegressor(_Regressor):
    """One hidden ReLU layer, ``Σ λ_i relu(u_i·x + b_i) + c``, from Hermite moments (``--method moments``).

    On rows of data the hidden and output biases are learned unless ``biases=False``; the samples of its options
    are rows.
    """

    _method = "moments"


class TensorRegressor(_Regressor):
    """Wide one-hidden-layer ReLU networks with biases, ``Σ λ_i relu(u_i·x + b_i) + c``, by a joint CP
    decomposition of Hermite moments (``--method tensor``): widths up to d, and on symmetric matrices up to
    d(d+1)/2 where d is small; the biases are always learned.
    """

    _method = "tensor"


class FilteredPCARegressor(_Regressor):
    """Deep ReLU networks with a low-dimensional relevant subspace (``--method filtered-pca``)."""

    _method = "filtered-pca"


class ExactRegressor(_Regressor):
    """Two-layer rectified networks ``Σ_i a_i f(v_i·x)`` recovered exactly (``--method exact``)."""

    _method = "exact"


class LandscapeRegressor(_Regressor):
    """``y = aᵀ relu(B x)``, ``a ≥ 0``, by the designed objective with no spurious local minima
    (``--method landscape``)."""

    _method = "landscape"


class PolynomialRegressor(_Regressor):
    """The Hermite expansion of degree ``degree`` (``--method polynomial``, an improper learner).

    With ``whiten`` the estimator whitens the rows itself (a polynomial of raw inputs would be of higher
    degree in nothing but name: it keeps the whitening and applies it in ``predict``).
    """

    _method = "polynomial"

    def _whiten_source(self) -> bool:
        return False

    def _prepare(self, X: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        if not self.whiten:
            return X, None
        from .pipeline.data import whitening_map

        mu, a = whitening_map(
            X.mean(axis=0),
            np.cov(X, rowvar=False, bias=True).reshape(X.shape[1], X.shape[1]),
            "the covariance of X",
            "set whiten=False",
        )
        return (X - mu) @ a.T, (mu, a)
