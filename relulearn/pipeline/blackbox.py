"""Black-box teachers: labels from a user's Python function, queried at the run's Gaussian inputs.

A callable teacher ``package.module:function`` maps a batch of inputs ``x`` (rows, d) to labels
(rows,) or (rows, m). Inputs are drawn exactly as for a planted teacher (the same chunk bytes);
only the labels come from the function, so a run is as deterministic as the function is. The
source holds the function's *name*, not the function: it is imported where the labels are made
(on every worker), which :func:`relulearn.pipeline.cluster.check_imports` checks before any block.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..filekind import not_a_file
from .batches import LabelShapeError, gaussian_batches

__all__ = ["CallableSource", "OnnxSource", "load_callable", "callable_source", "onnx_source"]

WHERE = "source.teacher.callable"


@functools.cache
def load_callable(name: str) -> Callable[[np.ndarray], Any]:
    """Import ``package.module:function`` (the function may be a dotted attribute path).

    Raises
    ------
    ValueError
        Naming the config key, the module and what to do when the module does not import, lacks
        the attribute, or the attribute is not callable.
    """
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{WHERE} is '{name}'; write it as 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - any import failure (a SystemExit too) is the user's module's
        raise ValueError(
            f"{WHERE} '{name}': module '{module_name}' cannot be imported ({type(err).__name__}: {err}); install "
            "it or put its folder on PYTHONPATH, on the driver and on every worker"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{WHERE} '{name}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(
            f"{WHERE} '{name}' is not callable (an object of type {type(obj).__name__}); name a "
            "function of a batch of inputs"
        )
    return obj


def _fingerprint(name: str) -> str:
    """sha256 of the name and of the module's source file (when it has one): a store built with
    one version of the function refuses to be resumed or extended with another."""
    h = hashlib.sha256(f"callable:{name}".encode())
    module = importlib.import_module(name.partition(":")[0])
    try:
        path = inspect.getsourcefile(module)
    except TypeError:  # a built-in or extension module: its name is all there is
        path = None
    if path is not None and Path(path).is_file():
        h.update(Path(path).read_bytes())
    return h.hexdigest()


def _ending(err: BaseException, label: str, on: str) -> str:
    """The message for a black box that tried to end the program (``SystemExit``, or another ``BaseException``
    that is not Ctrl-C) instead of answering: relulearn would otherwise end with the function's exit code and
    no word."""
    if isinstance(err, SystemExit):
        what = f"exited with code {err.code}" if err.code is not None else "exited (SystemExit)"
    else:
        what = f"raised {type(err).__name__}, which ends a program,"
    return (
        f"{label} {what} {on}; a teacher must return its labels, not end the process: remove the exit (or "
        "raise an Exception) in the function. The store is as its last commit left it"
    )


class _BlackBox:
    """What every black-box source shares: labels from :meth:`answers`, Gaussian inputs by batch.

    Subclasses are frozen dataclasses with ``d``, ``width`` (outputs of the black box), ``noise_std``,
    ``output`` and a ``raw_answers(x)`` that returns the black box's answers as an array.
    """

    d: int
    width: int
    noise_std: float
    output: int | None
    #: how the black box is named in errors
    label = "the teacher"

    @property
    def outputs(self) -> int | None:
        """None for a scalar label; the number of outputs ``m`` for a label vector."""
        return self.width if self.output is None and self.width > 1 else None

    def raw_answers(self, x: np.ndarray) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def answers(self, x: np.ndarray) -> np.ndarray:
        """The black box's answers as float64 (rows, width), checked: a wrong shape or type, or an
        exception of the black box, raises :class:`LabelShapeError` naming the batch (the caller adds
        the chunk and row)."""
        rows = len(x)
        try:
            with np.errstate(all="ignore"):  # NaN / inf are named by chunk and row by check_finite
                out = np.asarray(self.raw_answers(x))
        except (LabelShapeError, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001 - the user's model failed: say where and on what
            raise LabelShapeError(
                f"{self.label} raised {type(err).__name__}: {err} on a batch x of shape {x.shape}"
            ) from err
        except BaseException as err:  # SystemExit(4) in the user's code would end relulearn with 4, silently
            raise LabelShapeError(_ending(err, self.label, f"on a batch x of shape {x.shape}")) from None
        if not (np.issubdtype(out.dtype, np.number) or out.dtype == bool) or np.iscomplexobj(out):
            raise LabelShapeError(f"{self.label} returned {out.dtype} values; it must return real numbers")
        shape = out.shape
        if out.ndim == 1:
            out = out[:, None]
        if out.ndim != 2 or out.shape[0] != rows or out.shape[1] != self.width:
            want = "(rows,)" if self.width == 1 else f"(rows, {self.width})"
            raise LabelShapeError(
                f"{self.label} returned shape {shape} for a batch of {rows} rows; it "
                f"must return {want}, one label per row, as it did for the probe batch"
            )
        # a copy: an array the black box keeps (a buffer it reuses for every batch) cannot change the labels later
        return np.array(out, dtype=np.float64)

    def labels(self, x: np.ndarray) -> np.ndarray:
        out = self.answers(x)
        if self.outputs is not None:
            return out
        return out[:, self.output if self.output is not None else 0]

    def batches(
        self, gen_x: np.random.Generator, gen_noise: np.random.Generator, n: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return gaussian_batches(self, gen_x, gen_noise, n)


@dataclass(frozen=True)
class CallableSource(_BlackBox):
    """``y = F(x) + σ ε`` with ``x ~ N(0, I_d)`` and a black-box function ``F`` (a :class:`Source`).

    ``width`` is the number of outputs of ``F`` (1 for a function returning (rows,)); the label is
    output ``output``, or with ``output=None`` the only output, or the vector of all outputs.
    """

    name: str
    d: int
    width: int = 1
    noise_std: float = 0.0
    output: int | None = None

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{WHERE} '{self.name}'"

    @property
    def required_modules(self) -> list[str]:
        return [self.name.partition(":")[0]]

    def fingerprint(self) -> str:
        return _fingerprint(self.name)

    def raw_answers(self, x: np.ndarray) -> Any:
        # The statistics accumulate from x: the function gets a copy it may change in place. Measured at d = 64
        # (batches of 4096 rows): the copy costs 47 µs a batch, 1.2 % of a pass of `basic` (a block of 200,000
        # samples, 49 batches: 190 ms with it and without it, best of 5); a read-only view costs 0.3 µs but
        # refuses functions that work in place, and checking the batch afterwards (copy and compare) 103 µs.
        return load_callable(self.name)(x.copy())


def _probe_width(call: Callable[[np.ndarray], Any], label: str, d: int, output: int | None) -> int:
    """The number of outputs of a black box, from its answer to two rows of zeros (d columns), checked
    against ``source.output``."""
    try:
        with np.errstate(all="ignore"):
            probe = np.asarray(call(np.zeros((2, d))))
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - the user's model failed: say on what
        raise ValueError(
            f"{label} raised {type(err).__name__}: {str(err).strip()[:300]} when called on a probe "
            f"batch x of shape (2, {d}); it must take a (rows, d) array with d = source.d = {d}"
        ) from None
    except BaseException as err:  # SystemExit in the user's code: named, not relulearn's own exit
        raise ValueError(_ending(err, label, f"when called on a probe batch x of shape (2, {d})")) from None
    if probe.ndim == 2 and probe.shape[1] == 1 and probe.shape[0] > 2 and probe.shape[0] % 2 == 0:
        m = probe.shape[0] // 2
        raise ValueError(
            f"{label} returned shape {probe.shape} for a probe batch x of shape (2, {d}): its {m} outputs per row come "
            f"flattened into one column (skl2onnx exports a multi-output MLPRegressor this way), and rows cannot be "
            f"told apart safely; export the model so that it returns (rows, {m}) — a final Reshape to [-1, {m}] in "
            "the graph, or the same weights exported by torch.onnx"
        )
    if probe.ndim not in (1, 2) or probe.shape[0] != 2 or (probe.ndim == 2 and probe.shape[1] < 1):
        raise ValueError(
            f"{label} returned shape {probe.shape} for a probe batch x of shape (2, {d}); it must "
            "return (rows,) or (rows, m): one label (or m outputs) per row"
        )
    width = 1 if probe.ndim == 1 else int(probe.shape[1])
    if output is not None and output >= width:
        raise ValueError(
            f"source.output is {output} but {label} has only {width} output(s); choose an output below {width}"
        )
    return width


def callable_source(name: str, d: int, noise_std: float, output: int | None) -> CallableSource:
    """The source of ``source.teacher.callable``, its number of outputs read from a probe call."""
    from .sizes import check_answer_sizes

    width = _probe_width(load_callable(name), f"{WHERE} '{name}'", d, output)
    check_answer_sizes(f"{WHERE} '{name}'", d, width)  # before it is asked for a whole batch
    return CallableSource(name, d, width, float(noise_std), output)


# ------------------------------------------------------------------------------ ONNX

ONNX_WHERE = "source.teacher.onnx"
_ONNX_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64}


@functools.lru_cache(maxsize=8)
def _session(model: bytes) -> Any:
    """An onnxruntime session of the model's bytes, one per process and model: one thread (a worker
    is one core), so its answers are the same bits on every worker of the same platform."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # errors only: its warnings are not the user's business
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class OnnxSource(_BlackBox):
    """``y = F(x) + σ ε`` with ``x ~ N(0, I_d)`` and ``F`` an ONNX model run by onnxruntime.

    The model's bytes travel with the source (no path has to exist on the workers). Inputs are cast to
    the model's input type: a float32 model answers the float32-rounded inputs, in float32, so its
    labels carry float32 rounding (``precision``); everything downstream stays float64.
    """

    path: str
    model: bytes = field(repr=False)
    d: int = 0
    width: int = 1
    noise_std: float = 0.0
    output: int | None = None
    input_name: str = "X"
    output_name: str = "variable"
    input_type: str = "float32"  # what the model's input takes: "float32" or "float64"
    precision: str = "float32"  # of the labels: float32 when the input or the output is float32

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{ONNX_WHERE} {self.path}"

    @property
    def required_modules(self) -> list[str]:
        return ["onnxruntime"]

    def fingerprint(self) -> str:
        return hashlib.sha256(self.model).hexdigest()

    def raw_answers(self, x: np.ndarray) -> Any:
        # astype copies (always, even to the same type): the model never holds the array the statistics read
        return _session(self.model).run([self.output_name], {self.input_name: x.astype(self.input_type)})[0]

    def activations(self) -> list[str] | None:
        """The activation nodes of the model's graph in order (``["Relu"]`` for one hidden ReLU layer), or None
        where the ``onnx`` package that reads graphs is not installed."""
        try:
            import onnx
        except ImportError:
            return None
        return [n.op_type for n in onnx.load_from_string(self.model).graph.node if n.op_type in _ACTIVATIONS]

    def hidden_widths(self) -> list[int | None] | None:
        """The width of each activation layer's output in graph order (None for one whose width the graph's
        shapes leave open), read by ONNX shape inference; None where the ``onnx`` package is not installed or the
        graph's shapes cannot be inferred. What planning reads of a black box; the learn never uses it."""
        try:
            import onnx
            from onnx import shape_inference
        except ImportError:
            return None
        try:
            graph = shape_inference.infer_shapes(onnx.load_from_string(self.model)).graph
        except Exception:  # noqa: BLE001 - an exotic graph: its widths are simply not known
            return None
        shapes = {v.name: v.type.tensor_type.shape for v in [*graph.value_info, *graph.output]}
        out: list[int | None] = []
        for node in graph.node:
            if node.op_type not in _ACTIVATIONS:
                continue
            dims = shapes[node.output[0]].dim if node.output[0] in shapes else []
            last = dims[-1] if len(dims) else None
            out.append(int(last.dim_value) if last is not None and last.HasField("dim_value") else None)
        return out


#: ONNX operators that are a network's nonlinearity (one per hidden layer)
_ACTIVATIONS = {
    "Relu",
    "LeakyRelu",
    "PRelu",
    "Sigmoid",
    "Tanh",
    "Elu",
    "Selu",
    "Celu",
    "Softplus",
    "Softsign",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "Mish",
    "ThresholdedRelu",
    "Erf",
}


def onnx_source(path: Path, d: int, noise_std: float, output: int | None) -> OnnxSource:
    """The source of ``source.teacher.onnx``: the model read, its one input checked against ``d``, its
    first output's width read from the model (or from a probe call where the graph leaves it open).

    Raises
    ------
    ValueError
        Naming the file and what does not match: a missing or unreadable file, onnxruntime missing, an
        input width other than ``source.d``, an input type other than float / double, several inputs, or
        ``source.output`` beyond the model's outputs.
    """
    where = f"{ONNX_WHERE} {path}"
    found = not_a_file(path)  # a folder or a device is said as what it is, never opened
    if found is not None:
        raise ValueError(
            f"{where} {found}; set source.teacher.onnx to an .onnx model file (a relative "
            "path is read from the configuration file's folder)"
        )
    try:
        import onnxruntime  # noqa: F401 - only to say what is missing
    except ImportError:
        raise ValueError(
            f"{where}: ONNX teachers need onnxruntime; pip install onnxruntime (on every worker too)"
        ) from None
    model = path.read_bytes()
    try:
        sess = _session(model)
    except Exception as err:  # noqa: BLE001 - onnxruntime's own errors: name the file
        raise ValueError(
            f"{where} is not a model onnxruntime can load ({type(err).__name__}: "
            f"{str(err).strip()[:300]}); export it with skl2onnx or torch.onnx"
        ) from None
    inputs, outputs = sess.get_inputs(), sess.get_outputs()
    if len(inputs) != 1:
        raise ValueError(
            f"{where} has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); a teacher takes "
            "one input, a batch x of shape (rows, d)"
        )
    inp = inputs[0]
    if inp.type not in _ONNX_TYPES:
        raise ValueError(f"{where}: its input '{inp.name}' is a {inp.type}; a teacher takes float or double inputs")
    shape = list(inp.shape)
    width_in = shape[1] if len(shape) == 2 else None
    if len(shape) != 2 or (isinstance(width_in, int) and width_in != d):
        raise ValueError(
            f"{where} takes inputs of shape {shape} but source.d is {d}; the model's input must be "
            f"(rows, {d}): make source.d and the model agree"
        )
    if isinstance(shape[0], int):  # torch.onnx.export without dynamic_axes fixes the batch at the example's size
        raise ValueError(
            f"{where} takes batches of exactly {shape[0]} rows (input '{inp.name}' has shape {shape}); "
            f"export it with a variable batch axis, e.g. torch.onnx.export(..., dynamic_axes="
            f"{{'{inp.name}': {{0: 'rows'}}}}) or skl2onnx's default [None, {d}]"
        )
    out = outputs[0]
    input_type = "float32" if _ONNX_TYPES[inp.type] == np.float32 else "float64"
    width = _probe_width(lambda x: sess.run([out.name], {inp.name: x.astype(input_type)})[0], where, d, output)
    from .sizes import check_answer_sizes

    check_answer_sizes(where, d, width)
    # a float32 input rounds the inputs, a float32 output the answers: either limits the labels to float32
    precision = "float32" if input_type == "float32" or out.type == "tensor(float)" else "float64"
    return OnnxSource(str(path), model, d, width, float(noise_std), output, inp.name, out.name, input_type, precision)
