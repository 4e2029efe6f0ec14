"""Using and measuring models: ``evaluate`` against a teacher, ``predict``, exact recovery from arbitrary
inputs (``exact_arbitrary``) and a teacher's Hermite shadows (``shadow``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..atomic import read_bytes, save_npy
from ..config import ConfigError, RunConfig, load_config
from ..filekind import not_a_file
from ..network import Network
from ..npyfile import ArrayHeaderError, load_npy_bytes
from ..pipeline.sources import data_of
from .learning import model_shape

if TYPE_CHECKING:
    from ..pipeline.data import DataSource
    from ..pipeline.sources import RunSource


def evaluate(model: str | Path | Network, teacher: str | Path | RunConfig, *, samples: int = 200_000) -> dict[str, Any]:
    """Relative test error ``E[|y − f̂(x)|²] / E[|y|²]`` on fresh samples (per output too, for
    vector labels); the largest principal angle between the subspace a scalar ReLU teacher
    depends on (row space of its first layer) and the one the model depends on
    (:func:`relulearn.network.subspace_angle`); and the parameter error up to the networks'
    symmetries: permutation and positive rescaling of hidden units, for one-hidden-layer ReLU
    networks with one output (:func:`~relulearn.network.compare`) and for two-layer networks
    ``U f(V x)`` with ``f = max(z, 0)^c`` and any number of outputs, where rescaling ``v_i`` by
    ``s`` scales ``u_i`` by ``s^{-c}`` (:func:`~relulearn.network.compare_two_layer`).

    ``teacher`` is a run configuration (a path or a :class:`~relulearn.config.RunConfig`: its source, noise
    included, with samples from a stream the estimation never uses) or a network ``.npz`` (noiseless, every
    output).
    """
    from ..pipeline.sources import Stream, draw
    from ..polynomial import PolynomialModel, load_model

    net = model if isinstance(model, (Network, PolynomialModel)) else load_model(model)
    source, seed = _teacher_source(teacher if isinstance(teacher, RunConfig) else Path(teacher))
    if net.input_dim != source.d:
        raise ValueError(f"the model has input dimension {net.input_dim} but the teacher has {source.d}")
    if data_of(source) is not None:  # data: its last rows, raw (the model maps raw inputs)
        samples = min(samples, cast("DataSource", source).rows)
        x, y = cast("DataSource", source).test_rows(samples)
    else:
        x, y = draw(source, seed, Stream.TEST, samples)
    y2 = y.reshape(len(y), -1)
    if net.output_dim != y2.shape[1]:
        raise ValueError(
            f"the model has {net.output_dim} outputs but the teacher's labels have {y2.shape[1]}; "
            "learn a model of the same source (or set source.output to compare one output)"
        )
    err2, ey2 = np.mean((y2 - net.forward(x)) ** 2, axis=0), np.mean(y2**2, axis=0)
    out: dict[str, Any] = {
        "samples": samples,
        "relative_test_error": float(err2.sum() / ey2.sum()),
        "noise_floor": float(y2.shape[1] * source.noise_std**2 / ey2.sum()),
    }
    if getattr(source, "precision", None) == "float32":
        # an ONNX model in float32 sees its inputs rounded to float32 and answers in float32: a learned
        # float64 network can match it only to that level
        out.update(teacher_precision="float32", teacher_relative_rounding=2.0**-24)
    t_net = getattr(source, "network", None)  # None for a black-box teacher
    if t_net is not None:
        out.update(teacher_width=int(t_net.weights[0].shape[0]), teacher_depth=int(t_net.depth))
    if y2.shape[1] > 1:
        out["outputs"] = int(y2.shape[1])
        out["relative_test_error_per_output"] = [float(e) for e in err2 / ey2]
    if isinstance(net, PolynomialModel):
        # an improper model: no weights to compare, no first layer whose span could be measured
        out.update(
            {
                "model_kind": "polynomial",
                "model_degree": net.degree,
                "model_subspace_rank": None if net.basis is None else net.dim,
                "parameter_error": None,
                "parameter_error_note": "the model is a polynomial (improper learner): compare by test error",
            }
        )
        return out
    out.update({"model_kind": "network", "model_width": int(net.weights[0].shape[0]), "model_depth": int(net.depth)})
    out.update(_parameter_errors(net, source, x, y2.shape[1], samples))
    return out


def _teacher_source(teacher: Path | RunConfig) -> tuple[RunSource, int]:
    """The source ``evaluate`` draws its test samples from, and its seed: a network file (noiseless) or a run
    configuration's source."""
    from ..pipeline.sources import TeacherSource, make_source

    if isinstance(teacher, RunConfig):
        return make_source(teacher), teacher.seed
    if teacher.suffix == ".npz":
        return TeacherSource(Network.load(teacher)), 0
    if teacher.suffix.lower() in (".yaml", ".yml", ".json", ""):
        cfg = load_config(teacher)
        return make_source(cfg), cfg.seed
    raise ConfigError(
        f"teacher {teacher}: a {teacher.suffix} file is not a teacher; give a network file (.npz) "
        "or a run configuration (.yaml) whose source is the teacher (an ONNX model or a callable "
        "goes in its `teacher:` section)"
    )


def _parameter_errors(net: Network, source: RunSource, x: np.ndarray, outputs: int, samples: int) -> dict[str, Any]:
    """The learned network against the teacher's weights: the subspace angle and the parameter error up to the
    symmetries (or why there is none: data, a black box, one output of a vector teacher)."""
    from ..network import compare, compare_two_layer, subspace_angle

    t_net = getattr(source, "network", None)
    if t_net is None and data_of(source) is not None:
        return {
            "parameter_error": None,
            "parameter_error_note": f"the source is data: the test error is on its last {samples:,} rows (held out "
            "only if the run used fewer rows); no teacher weights to compare with",
        }
    if t_net is None:
        return {
            "parameter_error": None,
            "parameter_error_note": f"the teacher is a black box ({getattr(source, 'label', 'no weights')}): no "
            "weights to compare with; compare by test error",
        }
    out: dict[str, Any] = {}
    scalar_relu = (
        t_net.activation == "relu"
        and net.activation == "relu"
        and outputs == 1
        and getattr(source, "output", None) is None
    )
    if scalar_relu and t_net.biases is None:
        # the subspace the teacher depends on against the one the model depends on (π/2: a direction is missing)
        out["subspace_angle"] = subspace_angle(t_net, net, x[:20_000])
    if getattr(source, "output", None) is not None:
        out["parameter_error"] = None
        out["parameter_error_note"] = (
            "the label is one output of a vector-output teacher; parameter errors compare "
            "whole networks (compare by test error)"
        )
        return out
    try:
        cmp = compare(t_net, net) if scalar_relu else compare_two_layer(t_net, net)
    except ValueError as err:
        return dict(out, parameter_error=None, parameter_error_note=str(err))
    out.update(parameter_error=cmp.relative_error, matching=list(cmp.matching), unit_errors=list(cmp.unit_errors))
    if scalar_relu:
        # teacher units left without a learned unit were merged into the nearest one
        u_t = t_net.weights[0] / np.linalg.norm(t_net.weights[0], axis=1, keepdims=True)
        u_l = net.weights[0] / np.linalg.norm(net.weights[0], axis=1, keepdims=True)
        out["merged_teacher_units"] = [
            {
                "teacher_unit": i,
                "into_learned_unit": int(np.argmax(u_l @ u_t[i])),
                "angle": float(np.arccos(np.clip(np.max(u_l @ u_t[i]), -1.0, 1.0))),
            }
            for i, j in enumerate(cmp.matching)
            if j < 0
        ]
    return out


def predict(model: str | Path, inputs: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Evaluate a model file of any kind (network or polynomial) on the rows of ``inputs`` (``.npy``,
    n × d) and write the predictions to ``out`` (``.npy``: shape (n,) for one output, (n, m) for m).

    Returns the model kind, the shapes and the path written.
    """
    from ..polynomial import load_model

    t0 = time.perf_counter()
    net = load_model(model)
    x = _load_matrix(inputs, "inputs")
    if x.shape[1] != net.input_dim:
        raise ValueError(
            f"inputs {inputs} have {x.shape[1]} columns but the model {model} takes d = {net.input_dim} "
            f"inputs; give an n × {net.input_dim} array (one sample per row)"
        )
    y = net.forward(x)
    y = y[:, 0] if y.shape[1] == 1 else y
    if out is not None:
        save_npy(out, y)
    return {
        "model": str(model),
        "kind": model_shape(net)["kind"],
        "samples": int(x.shape[0]),
        "input_dim": int(x.shape[1]),
        "outputs": int(net.output_dim),
        "out": None if out is None else str(out),
        "seconds": time.perf_counter() - t0,
    }


def _load_matrix(path: str | Path, what: str) -> np.ndarray:
    """A 2-d float array from a ``.npy`` file (a vector becomes one column), or an error naming the file."""
    found = not_a_file(path)  # a folder or a device is said as what it is, never opened
    if found is not None:
        raise ValueError(f"{what} file {path} {found}; give a .npy file (np.save)")
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise ValueError(f"{what} file {path} does not exist") from None
    except OSError as err:  # a folder, no permission, an unreachable store
        raise ValueError(f"{what} file {path} cannot be read: {err}") from None
    if not raw.startswith(b"\x93NUMPY"):  # np.load reads any other bytes as a pickle, and says so
        raise ValueError(
            f"{what} file {path} is not a .npy file (it lacks numpy's header); save the array with "
            "np.save(PATH, x) and give that file"
        )
    try:
        arr = load_npy_bytes(raw, f"{what} file {path}")  # sized from its header before numpy allocates
    except ArrayHeaderError as err:
        raise ValueError(str(err)) from None
    except (OSError, ValueError) as err:
        raise ValueError(f"{what} file {path} is not a readable .npy array of numbers: {err}") from None
    if not isinstance(arr, np.ndarray) or arr.ndim not in (1, 2) or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(
            f"{what} file {path} must hold a 1-d or 2-d numeric array, got "
            f"{getattr(arr, 'shape', '?')} of {getattr(arr, 'dtype', type(arr).__name__)}"
        )
    arr = np.asarray(arr, dtype=np.float64)
    arr = arr[:, None] if arr.ndim == 1 else arr
    bad = ~np.isfinite(arr)
    if bad.any():
        r, c = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(f"{what} file {path} has a non-finite value at row {r}, column {c}")
    return arr


def exact_arbitrary(
    inputs: str | Path, labels: str | Path, width: int, *, activation: str = "relu", out: str | None = None
) -> dict[str, Any]:
    """Recover ``A = U f(V X)`` exactly from arbitrary inputs (files ``inputs`` X, n × d, and
    ``labels`` A, n × m, ``.npy``) with :func:`relulearn.estimators.exact.entry.recover`; write the
    network to ``out``. Returns the width, shapes, the check on the given samples and the report."""
    from ..estimators.exact import entry as exact

    t0 = time.perf_counter()
    x, a = _load_matrix(inputs, "inputs"), _load_matrix(labels, "labels")
    if len(x) != len(a):
        raise ValueError(
            f"inputs {inputs} have {len(x)} rows but labels {labels} have {len(a)}; one label row per input row"
        )
    result = exact.recover(x, a, width, activation=activation)
    net = cast(Network, result.network)  # (a network: only the polynomial method learns another model)
    if out is not None:
        net.save(out)
    pred = net.forward(x)
    return {
        "out": out,
        "samples": int(len(x)),
        "input_dim": int(x.shape[1]),
        "outputs": int(a.shape[1]),
        "width": int(net.weights[0].shape[0]),
        "activation": activation,
        "relative_error": float(np.sum((a - pred) ** 2) / max(np.sum(a**2), 1e-300)),
        "seconds": time.perf_counter() - t0,
        "report": result.report,
    }


def shadow(teacher: str | Path | Network, degree: int, *, samples: int = 200_000, seed: int = 0) -> dict[str, Any]:
    """How far a network is from its shadow ``Ψ_n`` (Daniely–Srebro–Vardi 2023), next to the bound.

    ``teacher`` is a network ``.npz`` or a run configuration (YAML; its teacher, e.g. a
    ``random_xavier`` one, and its ``source.output`` for a vector-output teacher). Returns
    :func:`relulearn.shadow.shadow_report` (``samples`` fresh Gaussian inputs of stream ``TEST``,
    seed ``seed``) plus ``teacher``.

    Raises
    ------
    ValueError
        A missing or unreadable file, a degree outside ``0..MAX_DEGREE``, or a network the shadow
        does not apply to (biases, another activation), with the cause and the fix.
    """
    from ..pipeline.sources import make_source
    from ..shadow import shadow_report

    net: Network | None
    if isinstance(teacher, Network):
        net, name = teacher, "network"
    else:
        path = Path(teacher)
        found = not_a_file(path)
        if found is not None:
            raise ValueError(
                f"{path} {found}; give a network file (.npz) or a run "
                "configuration (.yaml) whose source.teacher to compare with its shadow"
            )
        if path.suffix == ".npz":
            net = Network.load(path)
        else:
            cfg = load_config(path)
            source = make_source(cfg)
            net = getattr(source, "network", None)
            if net is None:
                raise ValueError(
                    f"{path}: shadow needs the teacher's weights (a planted or file teacher), but "
                    f"{getattr(source, 'label', 'its teacher')} is a black box"
                )
            if cfg.source.output is not None:  # the scalar label the configuration learns
                net = Network(
                    net.weights[:-1] + (net.weights[-1][cfg.source.output : cfg.source.output + 1],),
                    None
                    if net.biases is None
                    else net.biases[:-1] + (net.biases[-1][cfg.source.output : cfg.source.output + 1],),
                    net.activation,
                )
        name = str(path)
    return {"teacher": name, **shadow_report(net, degree, samples=samples, seed=seed)}
