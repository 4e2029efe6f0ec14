"""What each stored array estimates, in words: the ``long_name`` and ``description`` attributes of the store's
xarray view (:func:`relulearn.datatree.open_datatree`), for every statistic family, its accumulators, standard
errors and coordinates, and for every dimension.

Estimates are means over all samples of the store; a ``<name>_se`` is the standard error of ``<name>``: the
sample standard deviation of the chunk means over √(chunks).
"""

from __future__ import annotations

import re

__all__ = ["describe_array", "describe_dimension"]

_SE = (
    "standard error of {name}: the sample standard deviation of its chunk means over √(chunks) (NaN with "
    "fewer than two chunks)"
)

#: estimands and coordinates, per family: name -> (long_name, description)
_ESTIMANDS: dict[str, dict[str, tuple[str, str]]] = {
    "basic": {
        "y": ("mean label", "E[y]"),
        "yy": ("mean squared label", "E[y²]"),
        "x": ("mean input", "E[x] (0 for standard Gaussian inputs)"),
        "xx": ("second moment of the inputs", "E[x xᵀ] (the identity for standard Gaussian inputs)"),
        "yx": ("first Hermite coefficient", "E[y x]: the label's first Hermite coefficient T_1"),
    },
    "output_moments": {
        "A": ("mean output", "E[A_j] per output j"),
        "AA": ("outputs' second moment", "E[A_j A_k] per pair of outputs"),
        "T1": ("first Hermite coefficient per output", "E[A_j x]"),
        "T2": ("second Hermite coefficient per output", "E[A_j (x xᵀ − I)]"),
    },
    "contracted": {
        "M": (
            "contracted Hermite moment",
            "M_l^g = T_l(g, …, g, ·, ·): the order-l Hermite tensor of the label "
            "contracted l − 2 times with the unit direction g, per (order, direction) pair",
        ),
        "v": ("contracted Hermite vector", "T_l(g, …, g, ·): contracted l − 1 times, per pair"),
        "s": ("contracted Hermite scalar", "T_l(g, …, g): contracted l times, per pair"),
        "direction": ("direction bank", "the unit directions g the tensors are contracted with"),
        "pair_order": ("order of each pair", "the Hermite order l of pair p"),
        "pair_direction": ("direction of each pair", "the index into `direction` of pair p"),
        "control_mean": ("control variate: mean label", "ȳ of the pilot pass, subtracted from the labels"),
        "control_beta": (
            "control variate: linear part",
            "β = E[y x] of the pilot pass; the labels summed are "
            "y − ȳ − βᵀx, whose moments of order ≥ 2 are those of y",
        ),
    },
    "filtered": {
        "M": ("filtered second moment", "M_τ = E[1{|y| > τ} (x xᵀ − I)] per threshold τ"),
        "prob": ("filter probability", "P[|y| > τ] per threshold τ"),
        "tau": ("threshold τ", "the thresholds of |y|"),
        "quantile": ("quantile of |y|", "the quantile of |y| (in the pilot pass) each τ was taken at"),
    },
    "residual": {
        "M": (
            "residual-filtered second moment",
            "M[c, t] = E[1{|y − F̃_c(Bx)| > τ_{c,t}} (x⊥x⊥ᵀ − (I − BᵀB))], "
            "x⊥ = x − BᵀBx: per candidate network c and threshold t",
        ),
        "prob": ("residual filter probability", "P[|y − F̃_c(Bx)| > τ_{c,t}]"),
        "tau": ("threshold τ", "the thresholds of each candidate's |residual|"),
        "quantile": ("quantile of the residual", "the quantile of |residual| each τ was taken at"),
        "basis": ("basis found so far", "orthonormal rows B of the subspace the candidates act on"),
    },
    "sketch": {
        "t0_second": ("mean label of the sketch", "E[y] (less the control expansion's constant, if any)"),
        "t1_second": ("first Hermite coefficient", "E[y x] (less the control expansion's linear part, if any)"),
        "Y_second": ("sketch of T_2", "T_2 Ω = E[y (x xᵀ − I)] Ω: the second Hermite moment times the test matrix"),
        "BMB_second": ("T_2 on the basis", "Ωᵀ T_2 Ω for the orthonormal basis Ω of a subspace pass"),
        "Y_contracted": ("sketch of M_l^g", "M_l^g Ω per (order, direction) pair"),
        "BMB_contracted": ("M_l^g on the basis", "Ωᵀ M_l^g Ω per pair, on the orthonormal basis Ω"),
        "Y_filtered": ("sketch of M_τ", "M_τ Ω per threshold τ"),
        "BMB_filtered": ("M_τ on the basis", "Ωᵀ M_τ Ω per threshold τ"),
        "prob_filtered": ("filter probability", "P[|y| > τ] per threshold τ"),
        "Y_residual": ("sketch of the residual-filtered moments", "M[c, t] Ω per candidate and threshold"),
        "BMB_residual": ("residual-filtered moments on the basis", "Ωᵀ M[c, t] Ω per candidate and threshold"),
        "prob_residual": ("residual filter probability", "P[|y − F̃_c(Bx)| > τ_{c,t}]"),
        "omega": (
            "test matrix Ω",
            "the Gaussian test matrix (d × rank) of the sketch, or the orthonormal basis of a subspace pass",
        ),
        "direction": ("direction bank", "the unit directions g of the contracted family"),
        "pair_order": ("order of each pair", "the Hermite order l of pair p"),
        "pair_direction": ("direction of each pair", "the index into `direction` of pair p"),
        "tau": ("threshold τ", "the thresholds of |y|"),
        "quantile": ("quantile of |y|", "the quantile of |y| each τ was taken at"),
        "residual_basis": ("basis found so far", "orthonormal rows B of the residual family"),
        "residual_tau": ("residual thresholds", "the thresholds of each candidate's |residual|"),
        "residual_quantile": ("quantile of the residual", "the quantile of |residual| each residual τ was taken at"),
    },
}

_HERMITE = {
    "T": (
        "Hermite coefficients of order {l}",
        "E[y He_α(x)] for the sorted multi-indices α of `index{l}` (one "
        "entry per multiset of {l} input axes; a symmetric tensor packed)",
    ),
    "index": ("multi-indices of order {l}", "the sorted input axes (α_1 ≤ … ≤ α_{l}) of each packed entry"),
    "expansion_t0": ("expansion: constant", "t0 of the degree-≤2 expansion subtracted from the labels"),
    "expansion_t1": ("expansion: linear part", "t1 of the degree-≤2 expansion subtracted from the labels"),
    "expansion_t2": (
        "expansion: quadratic part",
        "t2 of the degree-≤2 expansion subtracted from the labels (y − t0 − <t1, x> − ½<t2, xxᵀ − I>)",
    ),
    "basis": ("subspace basis", "orthonormal rows P: the tensors are those of z = P x"),
}

#: dimensions: name (or pattern) -> (long_name, description)
_DIMENSIONS: list[tuple[str, tuple[str, str]]] = [
    (r"i", ("input axis", "an axis of the input x (first)")),
    (r"j", ("input axis", "an axis of the input x (second)")),
    (r"output", ("output", "an output of the label vector")),
    (r"output2", ("output", "an output of the label vector (second)")),
    (r"pair", ("(order, direction) pair", "pair p = (pair_order[p], pair_direction[p])")),
    (r"direction", ("direction", "a unit direction of the bank")),
    (r"tau", ("threshold", "an entry of the τ grid")),
    (r"rank", ("sketch column", "a column of the test matrix Ω (or of the basis)")),
    (r"rank2", ("sketch column", "a column of the test matrix Ω (second)")),
    (r"candidate", ("candidate network", "a candidate network of the residual family")),
    (r"residual_rank", ("basis row", "a row of the residual family's basis")),
    (r"residual_tau", ("threshold", "an entry of a candidate's τ grid")),
    (r"scalar", ("scalar", "a single value")),
    (r"entry(\d+)", ("packed entry of order {0}", "a multiset of {0} input axes (see `index{0}`)")),
    (r"axis(\d+)", ("position in a multi-index of order {0}", "the k-th smallest axis of the multi-index")),
    (r"candidate(\d+)_W(\d+)_out", ("unit of layer {1}", "a row of candidate {0}'s weight matrix W{1}")),
    (r"candidate(\d+)_W(\d+)_in", ("input of layer {1}", "a column of candidate {0}'s weight matrix W{1}")),
]


def _estimand(family: str, name: str) -> tuple[str, str] | None:
    fam = "residual" if family.startswith("residual") else family
    if name in _ESTIMANDS.get(fam, {}):
        return _ESTIMANDS[fam][name]
    if fam in ("hermite", "projected_hermite"):
        m = re.fullmatch(r"(T|index)(\d+)", name)
        if m:
            long_name, text = _HERMITE[m.group(1)]
            return long_name.format(l=m.group(2)), text.format(l=m.group(2))
        if name in _HERMITE:
            return _HERMITE[name]
    m = re.fullmatch(r"candidate(\d+)_W(\d+)", name)
    if m:
        return (
            f"candidate {m.group(1)}: weights W{m.group(2)}",
            "a weight matrix of a candidate network F̃_c, on the coordinates z = B x",
        )
    return None


def describe_array(family: str, name: str) -> tuple[str, str] | None:
    """``(long_name, description)`` of the array ``name`` of a statistic ``family``: an estimand, its standard
    error, an accumulator (``sum_*``, ``sumsq_*``, ``count``) or a coordinate; None for a name it does not know."""
    if name == "count":
        return "samples", "the samples the sums hold"
    if name.endswith("_se"):
        base = name[: -len("_se")]
        long_name = (describe_array(family, base) or (base, ""))[0]
        return f"standard error of {long_name}", _SE.format(name=base)
    for prefix, what in (
        ("sumsq_", "sum over chunks of the squared chunk sums of {0} (its standard error's accumulator)"),
        ("sum_", "sum over samples of {0}'s summand (its estimate's accumulator)"),
    ):
        if name.startswith(prefix):
            base = name[len(prefix) :]
            return f"accumulator of {base}", what.format(base)
    return _estimand(family, name)


def describe_dimension(name: str) -> tuple[str, str] | None:
    """``(long_name, description)`` of a dimension of the store's arrays; None for a name it does not know."""
    for pattern, (long_name, text) in _DIMENSIONS:
        m = re.fullmatch(pattern, name)
        if m:
            return long_name.format(*m.groups()), text.format(*m.groups())
    return None
