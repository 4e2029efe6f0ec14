"""The learning methods (``relulearn learn --method``), each declared once.

A :class:`Method` says what a method learns, from which paper, its options and what each does for it, the
options that shape the statistics a fit estimates, the scikit-learn class over it and the report's figures of
its learn. The command line, the keywords, option checks and planning of :mod:`relulearn.api` (the signatures of
``fit``, ``learn`` and ``curve`` are generated from :data:`OPTIONS`), the scikit-learn layer (each estimator's
parameters), the report and the documentation read these declarations; none spells a method out. This module imports
nothing heavy, so that ``relulearn --help`` does not load numpy or the methods.

A method's implementation is the sub-package :attr:`Method.module` of :mod:`relulearn.estimators`; its ``entry``
module, imported when the method runs (:func:`method_module`), provides

- ``learn(stats, passes, samples, *, width, mapper, seed, **options)``: the method on stored statistics (the
  options are the keys of :attr:`Method.options`), returning the model and its report or the extra pass it needs;
- ``MAX_PASSES``: the extra estimation passes a learn may ask for;
- ``required_statistics(d, width, ...)``: the statistics ``fit`` estimates for it (with the
  :attr:`Method.fit_options` and :attr:`Method.source_options` as keywords), and for methods with a sketched
  form ``DENSE_FAMILIES``, ``sketch_rank`` and ``sketch_passes``, which :mod:`relulearn.runplan` prices;
- ``check_setting(source, options, outputs) -> options`` (optional): refuses, before any work, a teacher
  outside the paper's setting, naming why and what to use instead, and completes options from the source.

Adding a method is one sub-package in :mod:`relulearn.estimators`, one :class:`Method` in :data:`METHODS` and one
estimator class in :mod:`relulearn.regressors`; see the contributing page of the documentation.
"""

from __future__ import annotations

import importlib
import textwrap
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

__all__ = ["METHODS", "OPTIONS", "Method", "Option", "method_module", "option_help", "parameter_lines"]


@dataclass(frozen=True)
class Option:
    """A method option as the command line and the Python API take it.

    Parameters
    ----------
    name
        The keyword (``refine_samples``); the flag is ``--refine-samples``.
    kind
        ``count`` (a whole number ≥ 1, ``1e6`` allowed), ``count0`` (≥ 0), ``choice`` (one of ``choices``),
        ``yes_no`` (``--x`` / ``--no-x``, default: the method decides), ``switch`` (``--x`` turns it on),
        ``switch_off`` (``--no-x`` turns it off).
    choices
        The values of a ``choice``.
    """

    name: str
    kind: Literal["count", "count0", "choice", "yes_no", "switch", "switch_off"]
    choices: tuple[str, ...] = ()

    @property
    def annotation(self) -> str:
        """Its type as the Python API's signatures show it (None: the method's default)."""
        return {"count": "int | None", "count0": "int | None", "choice": "str | None"}.get(self.kind, "bool | None")

    @property
    def flag(self) -> str:
        """The command-line flag (``--no-residual`` for a ``switch_off``)."""
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.kind == "switch_off" else f"--{dashed}"


#: every method option, in the order the command line lists them (a method declares which it takes)
OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("width", "count"),
        Option("depth", "count"),
        Option("budget", "count"),
        Option("activation", "choice", ("relu", "relu2", "relu3")),
        Option("exact_samples", "count"),
        Option("refine_samples", "count0"),
        Option("biases", "yes_no"),
        Option("starts", "count"),
        Option("route", "choice", ("moments", "stream")),
        Option("degree", "count0"),
        Option("shrink", "choice", ("none", "order", "entry")),
        Option("subspace", "switch"),
        Option("residual", "switch_off"),
    )
}


@dataclass(frozen=True)
class Method:
    """One learning method: what it learns and how it is reached.

    Parameters
    ----------
    name
        ``--method NAME``; also the store's record of the learn.
    module
        Its implementation, the sub-package ``relulearn.estimators.<module>`` (its entry: ``<module>.entry``).
    summary
        What it learns and how, in one clause (the ``--method`` help).
    learns, source, paper, instead
        The methods table of the documentation: the networks it learns, from which statistics, its seed paper,
        and what to pick instead when.
    options
        The options it takes, each with what it does for this method (the command line's help joins them).
    fit_options
        Options that also shape the statistics ``fit`` estimates (the planning reads them).
    source_options
        Attributes of the source that shape the statistics (``outputs``: one family per output).
    vector_labels
        Whether it learns several outputs at once; the others refuse a source with vector labels.
    regressor
        Its scikit-learn estimator in :mod:`relulearn.regressors`.
    figures
        The report's figures of its learn (names in :data:`relulearn.report.methods.FIGURES`), after the common
        ones.
    """

    name: str
    module: str
    summary: str
    learns: str
    source: str
    paper: str
    instead: str
    options: dict[str, str]
    regressor: str
    fit_options: tuple[str, ...] = ()
    source_options: tuple[str, ...] = ()
    vector_labels: bool = False
    figures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"method {self.name!r} declares unknown options {unknown}; add them to OPTIONS")
        if not set(self.fit_options) <= set(self.options):
            raise ValueError(f"method {self.name!r}: fit_options must be among its options")


_REFINE_GN = (
    "samples streamed through the refinement (preconditioned Gauss-Newton, 3·k·d flops per sample and pass; "
    "one output whose labels polish does not fit exactly), each pass regenerating them on the workers; 0 turns "
    "it off (default: as many as the store holds)"
)
_WIDTH_RANK = "hidden units wanted (default: the rank the noise floor supports)"

#: the methods, by name, in the order the command line and the documentation list them
METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            name="moments",
            module="moments",
            summary="one-hidden-layer ReLU nets from Hermite moments (narrow: the enumeration grows as exp(width))",
            learns="one hidden ReLU layer, any output signs, biases; narrow (up to ~7 units)",
            source="Hermite moments, enumeration on their subspace",
            paper="Chen, Dou, Goel, Klivans, Meka 2023",
            instead="wider than ~7 units: `tensor`",
            options={
                "width": _WIDTH_RANK,
                "budget": "directions scored over the k+1 stages of its search (default 200000; a width whose "
                "search needs more is refused with the budget it needs)",
                "refine_samples": _REFINE_GN,
                "biases": "learn hidden biases and an output bias, y = Σ λ_i relu(u_i·x + b_i) + c (default: yes "
                "for black-box teachers and network files with biases, no for bias-free planted and file "
                "networks); the enumeration then searches directions and offsets",
            },
            regressor="MomentsRegressor",
        ),
        Method(
            name="tensor",
            module="tensor",
            summary="wide one-hidden-layer ReLU nets with biases and any number of outputs, by a CP decomposition "
            "of Hermite moments of orders 2-6 (widths up to d, and up to d(d+1)/2 for d <= 50 on symmetric "
            "matrices)",
            learns="one hidden ReLU layer of any width up to d (up to d(d+1)/2 for d ≤ 50), biases, several outputs",
            source="a joint CP decomposition of Hermite moments of orders 2–6",
            paper="Chen, Dou, Goel, Klivans, Meka 2023",
            instead="a few units and little data: `moments`",
            options={
                "width": _WIDTH_RANK + "; a width the floor does not support is refused, naming the samples that would",
                "refine_samples": _REFINE_GN,
            },
            regressor="TensorRegressor",
            source_options=("outputs",),
            vector_labels=True,
        ),
        Method(
            name="filtered-pca",
            module="filtered_pca",
            summary="deep ReLU nets by iterative filtered PCA and enumeration on the found subspace",
            learns="deep ReLU networks whose first layer has few rows",
            source="filtered second moments, residual passes, enumeration on the subspace",
            paper="Chen, Klivans, Meka 2021",
            instead="one hidden layer: `moments` or `tensor`",
            options={
                "width": "largest hidden width of the candidate networks (default: the subspace rank for "
                "--depth 1, else twice it, at least 4)",
                "depth": "hidden layers of the candidate networks; architectures of depth 1..DEPTH are "
                "enumerated (default 1)",
                "budget": "candidate networks fitted (default 256; a larger --depth/--width is refused before "
                "any work)",
                "refine_samples": "samples of the refinement at depth >= 2 (Levenberg-Marquardt on the network and "
                "its subspace basis, 4·d·r + P^2 flops per sample and pass for P weights; default: as many as the "
                "store holds, at most 10^7); 0 turns it off",
            },
            regressor="FilteredPCARegressor",
            figures=("filtered", "passes"),
        ),
        Method(
            name="exact",
            module="exact",
            summary="two-layer rectified nets with vector outputs A = U f(Vx), recovered exactly (tensor step, "
            "signs, null vectors of the row span, refinement)",
            learns="two-layer rectified networks `A = U f(Vx)` with vector outputs, exactly",
            source="output moments, a tensor step, null vectors of the row span",
            paper="Bakshi, Jayaram, Woodruff 2019",
            instead="one output: `moments` or `tensor`",
            options={
                "width": "hidden units k (default: the rank the noise floor supports)",
                "activation": "the rectified activation f(z) = max(z,0)^c of the network learned (default: the "
                "teacher's, relu for other sources)",
                "exact_samples": "samples of the bounded exact step (default: chosen from d and the width; too few "
                "is refused with the number needed)",
                "refine_samples": "samples of the refinement (Levenberg-Marquardt, (k·d)^2 flops per sample and "
                "pass; default: as many as the store holds, at most 10^7 and at most 2e13/(k·d)^2); 0 turns it off",
            },
            regressor="ExactRegressor",
            vector_labels=True,
            figures=("decomposition", "outputs"),
        ),
        Method(
            name="landscape",
            module="landscape",
            summary="one-hidden-layer ReLU nets with non-negative output weights and B of full row rank, up to "
            "width d, by minimizing Ge–Lee–Ma's designed objective G (no spurious local minima) on the whitened "
            "4th moment",
            learns="one hidden ReLU layer with non-negative output weights and full-rank B, up to width d",
            source="Ge–Lee–Ma's designed objective G, minimized from random starts",
            paper="Ge, Lee, Ma 2017",
            instead="output weights of both signs: `moments`, `tensor`",
            options={
                "width": _WIDTH_RANK,
                "starts": "random starts of G (default 8); the lowest G with m distinct rows is kept",
                "route": "moments = G from the 4th moment on the subspace (one extra pass, C(m+3,4) entries per "
                "sample); stream = the paper's stochastic gradient of G on fresh samples, O(m·d) per sample "
                "(default: stream above 32 units)",
            },
            regressor="LandscapeRegressor",
            figures=("objective", "angles"),
        ),
        Method(
            name="polynomial",
            module="polynomial",
            summary="any network (e.g. random Xavier nets) by its Hermite expansion truncated at a degree L, read "
            "off the stored T_0..T_L (Daniely–Srebro–Vardi; the model is a polynomial, not a network)",
            learns="any network (e.g. a random Xavier net), as a polynomial (improper)",
            source="the Hermite expansion up to the degree with the least held-out error",
            paper="Daniely, Srebro, Vardi 2023",
            instead="when the weights themselves are wanted: a proper method above",
            options={
                "degree": "degree L of the expansion (default: the degree of least error on held-out samples, up "
                "to the stored order; fit estimates up to 4, or 6 with --subspace); a degree whose tensors exceed "
                "the entry budget is refused with the largest that fits",
                "shrink": "shrink coefficients by their standard errors: order = James–Stein factor max(0, 1 − "
                "V_l/‖T_l‖²) per order (default), entry = max(0, 1 − se²/T²) per coefficient, none = plain "
                "projection; shrinking helps where an order's signal is comparable with its noise",
                "subspace": "find the relevant subspace first (T_2, filtered matrices, T_1) and expand the "
                "projected inputs to a higher degree (one projected_hermite pass); for teachers whose first layer "
                "has few rows",
                "residual": "use the stored T_3..T_L as they are instead of re-estimating them on residual labels "
                "in one more pass (half the estimation work, more variance)",
            },
            regressor="PolynomialRegressor",
            fit_options=("degree", "subspace", "residual"),
            figures=("degree",),
        ),
    )
}


def option_help(name: str) -> str:
    """What option ``name`` does for each method that takes it, methods saying the same thing together (the
    command line's help and the Python API's parameter lists)."""
    said: dict[str, list[str]] = {}
    for m in METHODS.values():
        if name in m.options:
            said.setdefault(m.options[name], []).append(m.name)
    return "; ".join(f"{', '.join(names)}: {text}" for text, names in said.items())


def parameter_lines(name: str, kind: str, text: str) -> list[str]:
    """A numpydoc parameter entry: ``name : kind``, then ``text`` wrapped and indented (the parameter lists
    generated for the Python API and the scikit-learn estimators)."""
    wrapped = textwrap.wrap(text, 112, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)
    return [f"{name} : {kind}", *wrapped]


def method_module(name: str) -> ModuleType:
    """The entry module of the ``relulearn.estimators`` sub-package that implements method ``name`` (see the module
    docstring).

    Raises
    ------
    ValueError
        For a name not in :data:`METHODS`.
    """
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    return importlib.import_module(f"relulearn.estimators.{METHODS[name].module}.entry")
