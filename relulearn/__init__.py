"""relulearn: learn hidden neural networks from samples with moment and spectral methods.

The public API: :func:`estimate` streams samples through Dask into a zarr store of
sufficient statistics; :func:`open_store` reads them back with standard errors (:func:`open_datatree`: as an
xarray DataTree at stable paths, every array described); :func:`verify`
checks every chunk of a store against its checksums.
"""

from ._version import __version__
from .methods import METHODS

#: the public names and the modules they live in, imported on first use: `relulearn.cli` starts (and refuses a
#: locked store) without importing numpy, zarr, dask and the methods first
_PUBLIC = {
    **dict.fromkeys(
        ("curve", "estimate", "evaluate", "fit", "learn", "merge", "open_store", "predict", "status", "verify"), "api"
    ),
    **dict.fromkeys(("ConfigError", "RunConfig", "load_config"), "config"),
    "Network": "network",
    "open_datatree": "datatree",
    **dict.fromkeys(("PolynomialModel", "load_model"), "polynomial"),
    **dict.fromkeys(("StoreDamagedError", "StoreError", "StoreMovedError", "StoredRun"), "storage"),
}

#: scikit-learn estimators (relulearn.regressors, one per method), imported on first use: scikit-learn is an
#: optional dependency
REGRESSORS = tuple(m.regressor for m in METHODS.values())

__all__ = [
    "estimate",
    "merge",
    "open_store",
    "open_datatree",
    "status",
    "verify",
    "learn",
    "fit",
    "curve",
    "evaluate",
    "predict",
    "load_config",
    "RunConfig",
    "ConfigError",
    "Network",
    "PolynomialModel",
    "load_model",
    "StoreError",
    "StoreDamagedError",
    "StoreMovedError",
    "StoredRun",
    "__version__",
    *REGRESSORS,
]


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    if name in REGRESSORS:
        try:
            from . import regressors
        except ImportError as err:
            raise ImportError(
                f"relulearn.{name} needs scikit-learn: pip install 'relulearn[sklearn]' ({err})"
            ) from None
        return getattr(regressors, name)
    raise AttributeError(f"module 'relulearn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
