"""What each stored array estimates, in words: the ``long_name`` and ``description`` attributes of the store's
xarray view (:func:`relulearn.datatree.open_datatree`), for every statistic family (the words its class
declares), its accumulators, standard errors and coordinates, and for every dimension.

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
    """An estimand's or coordinate's words, as its family declares them
    (:meth:`~.stats.family.Family.describe`); a candidate network's weights in any family."""
    from .stats.registry import FAMILIES  # here: reading a store's view loads the families' modules on first use

    fam = FAMILIES.get(family)
    got = None if fam is None else fam.describe(name)
    if got is not None:
        return got
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
