"""The units figure: each unit of a one-hidden-layer teacher matched with a learned unit, and what the two have
in common up to the network's symmetries — the direction of ``u``, the output weights ``λ‖u‖^c`` (every output),
the offset ``b/‖u‖`` and the output biases ``c`` (where either network has biases)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._plot import Figure, drawn, log_bars, panels, unit_angle

TITLE = "Learned vs teacher units"

#: superscripts of the activation's degree in the axis labels
_SUPERSCRIPT = {1: "", 2: "²", 3: "³"}


@dataclass(frozen=True)
class UnitPairs:
    """Per teacher unit ``i`` and its matched learned unit (NaN where none is matched).

    Attributes
    ----------
    matching
        ``matching[i]``: the learned unit matched with teacher unit ``i`` (−1: none).
    angles
        The angle between the teacher's ``u_i`` and the matched learned row's (radians, accurate near zero).
    teacher_weights, learned_weights
        ``λ_ji ‖u_i‖^c`` per output ``j`` (shape outputs × teacher units): what a unit of a positively
        homogeneous activation of degree ``c`` contributes, invariant under its rescaling.
    teacher_offsets, learned_offsets
        ``b_i / ‖u_i‖`` (0 without biases); None when neither network has biases.
    teacher_output_bias, learned_output_bias
        ``c`` per output (0 without biases); None when neither network has biases.
    power
        The degree ``c`` of the activation (1 for ReLU).
    how
        How the units were matched, with the parameter error where one is defined.
    """

    matching: tuple[int, ...]
    angles: np.ndarray
    teacher_weights: np.ndarray
    learned_weights: np.ndarray
    teacher_offsets: np.ndarray | None
    learned_offsets: np.ndarray | None
    teacher_output_bias: np.ndarray | None
    learned_output_bias: np.ndarray | None
    power: int
    how: str


def _rows(net: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hidden rows ``u``, hidden biases ``b`` and output biases ``c`` of a one-hidden-layer network (zeros
    where it has no biases)."""
    u = net.weights[0]
    if net.biases is None:
        return u, np.zeros(len(u)), np.zeros(net.output_dim)
    return u, net.biases[0], net.biases[1]


def _matching(teacher: Any, model: Any) -> tuple[tuple[int, ...], str]:
    """The learned unit matched with each teacher unit: the symmetry-aware comparison where one is defined
    (:func:`~relulearn.network.compare` for ReLU, biases included; :func:`~relulearn.network.compare_two_layer`
    for bias-free ``max(z, 0)^c``), else the matching of largest total cosine between the rows ``[u, b]``."""
    from scipy.optimize import linear_sum_assignment

    from ..network import RELU_POWERS, compare, compare_two_layer

    symmetric = "(up to permutation and positive rescaling)"
    if teacher.activation == model.activation == "relu":
        cmp = compare(teacher, model)
        return cmp.matching, f"parameter error {cmp.relative_error:.3g} {symmetric}"
    biased = teacher.biases is not None or model.biases is not None
    if teacher.activation == model.activation and teacher.activation in RELU_POWERS and not biased:
        cmp = compare_two_layer(teacher, model)
        return cmp.matching, f"parameter error {cmp.relative_error:.3g} {symmetric}"
    rt, rl = (np.column_stack(_rows(net)[:2]) for net in (teacher, model))
    rt = rt / np.linalg.norm(rt, axis=1, keepdims=True)
    rl = rl / np.linalg.norm(rl, axis=1, keepdims=True)
    matching = [-1] * len(rt)
    for i, j in zip(*linear_sum_assignment(-(rt @ rl.T))):
        matching[int(i)] = int(j)
    return tuple(matching), f"{teacher.activation} units matched by angle"


def pairs(teacher: Any, model: Any) -> UnitPairs:
    """The units of ``teacher`` matched with those of ``model`` (two one-hidden-layer networks of the same input
    and output dimensions) and the quantities the figure draws for each pair.

    Raises
    ------
    ValueError
        When the two networks do not map the same dimensions.
    """
    from ..network import RELU_POWERS

    if (teacher.input_dim, teacher.output_dim) != (model.input_dim, model.output_dim):
        raise ValueError(
            f"the model maps {model.input_dim} inputs to {model.output_dim} output(s), the teacher "
            f"{teacher.input_dim} to {teacher.output_dim}: give the teacher the model was learned from"
        )
    matching, how = _matching(teacher, model)
    power = RELU_POWERS.get(teacher.activation, 1)
    (ut, bt, ct), (ul, bl, cl) = _rows(teacher), _rows(model)
    nt, nl = (np.maximum(np.linalg.norm(u, axis=1), 1e-300) for u in (ut, ul))
    k = len(ut)
    angles = np.full(k, np.nan)
    learned_weights = np.full((teacher.output_dim, k), np.nan)
    learned_offsets = np.full(k, np.nan)
    for i, j in enumerate(matching):
        if j >= 0:
            angles[i] = unit_angle(ut[i], ul[j])
            learned_weights[:, i] = model.weights[1][:, j] * nl[j] ** power
            learned_offsets[i] = bl[j] / nl[j]
    biased = teacher.biases is not None or model.biases is not None
    return UnitPairs(
        matching=tuple(matching),
        angles=angles,
        teacher_weights=teacher.weights[1] * nt**power,
        learned_weights=learned_weights,
        teacher_offsets=bt / nt if biased else None,
        learned_offsets=learned_offsets if biased else None,
        teacher_output_bias=np.asarray(ct, dtype=float) if biased else None,
        learned_output_bias=np.asarray(cl, dtype=float) if biased else None,
        power=power,
        how=how,
    )


def _against(ax: Any, teacher: np.ndarray, learned: np.ndarray) -> None:
    """The diagonal ``learned = teacher`` over the values' range (a range at rounding level is drawn as ±1)."""
    top = float(np.nanmax(np.abs(np.r_[teacher.ravel(), learned.ravel()])))
    lim = top * 1.15 if top > 1e-8 else 1.0
    ax.plot([-lim, lim], [-lim, lim], color="0.6", lw=0.8)


def figure(model: Any | None, teacher: Any | None) -> Figure:
    """The units figure of a learned ``model`` against its ``teacher`` (both networks), or the line saying why it
    is not drawn."""
    if model is None or teacher is None:
        return Figure(
            "units",
            TITLE,
            "give --model and --teacher (a network .npz or a config with a network teacher) to compare units",
        )
    from ..network import Network

    if not isinstance(model, Network) or model.depth != 1 or teacher.depth != 1:
        return Figure("units", TITLE, "units are compared for one-hidden-layer networks")
    try:
        p = pairs(teacher, model)
    except ValueError as err:
        return Figure("units", TITLE, str(err))
    biased = p.teacher_offsets is not None and p.learned_offsets is not None
    fig, axes = panels(3 if biased else 2, width=3.6 if biased else 4.2, height=3.2)
    clipped = log_bars(axes[0], p.angles, color="C4")
    axes[0].set_xlabel("teacher unit")
    axes[0].set_ylabel("angle of u to the learned unit's (rad)")
    if clipped:
        axes[0].legend(fontsize=7, loc="upper right")
    sup = _SUPERSCRIPT.get(p.power, f"^{p.power}")
    ax = axes[1]
    _against(ax, p.teacher_weights, p.learned_weights)
    ax.scatter(p.teacher_weights.ravel(), p.learned_weights.ravel(), color="C4", zorder=3, s=14, label=f"λ‖u‖{sup}")
    if p.teacher_output_bias is not None and p.learned_output_bias is not None:
        ax.scatter(p.teacher_output_bias, p.learned_output_bias, color="C1", marker="x", zorder=4, s=30, label="c")
        ax.legend(fontsize=7, loc="upper left")
        ax.set_xlabel(f"teacher λ‖u‖{sup}, output bias c")
        ax.set_ylabel(f"learned λ‖u‖{sup}, output bias c")
    else:
        ax.set_xlabel(f"teacher λ‖u‖{sup}")
        ax.set_ylabel(f"learned λ‖u‖{sup}")
    if biased:
        assert p.teacher_offsets is not None and p.learned_offsets is not None  # for mypy: biased says so
        _against(axes[2], p.teacher_offsets, p.learned_offsets)
        axes[2].scatter(p.teacher_offsets, p.learned_offsets, color="C4", zorder=3, s=14)
        axes[2].set_xlabel("teacher offset b/‖u‖")
        axes[2].set_ylabel("learned offset b/‖u‖")
    outputs = f" of each of the {teacher.output_dim} outputs" if teacher.output_dim > 1 else ""
    if biased:
        right = f"; middle: output weights{outputs} and output biases (×); right: offsets"
    else:
        right = f"; right: output weights{outputs}"
    return Figure(
        "units",
        TITLE,
        f"{p.how}; {len(p.angles)} teacher units, unmatched ones have no bar; {clipped} angle(s) at or below "
        f"10⁻¹⁵ drawn hatched{right}",
        *drawn(fig),
    )
