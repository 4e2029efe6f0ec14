"""Hermite polynomials, Hermite tensors and their moment estimators.

Conventions (docs/design.md section 3): probabilists' Hermite polynomials ``He_k``;
the Hermite tensor ``He_l(x)`` is the sum over partial matchings of the ``l``
index positions (matched pair -> ``-delta``, unmatched position -> ``x_i``);
``T_l = E[y He_l(x)]``.  Symmetric tensors are stored *packed*: the entries with
``i1 <= ... <= il`` in ``itertools.combinations_with_replacement`` order.

The modules, each with one job: :mod:`~relulearn.hermite.polynomials` (``He_k`` and the coefficients of
activations), :mod:`~relulearn.hermite.packing` (packed symmetric tensors), :mod:`~relulearn.hermite.tensors`
(Hermite tensors by their matching sum), :mod:`~relulearn.hermite.plan` (the blocked GEMM plan over sorted
tuples), :mod:`~relulearn.hermite.moments` (raw moments by that plan), :mod:`~relulearn.hermite.contracted`
(tensors contracted with directions), :mod:`~relulearn.hermite.contracted_labels` (their sums for several label
columns at once), :mod:`~relulearn.hermite.expansion` (Hermite expansions) and
:mod:`~relulearn.hermite.batching` (row batches under a memory budget). The public names are re-exported here.
"""

from __future__ import annotations

from .contracted import contracted_coefficients, contracted_matrix_sums, contracted_scalar_sums, contracted_vector_sums
from .contracted_labels import contracted_sums_of_labels
from .expansion import expansion_coefficients, expansion_terms, subtract_expansion
from .moments import raw_moment_flops, raw_moment_sums, raw_moment_sums_upto
from .packing import multiplicities, pack, packed_index, packed_trace, unique_indices, unpack
from .polynomials import activation_hermite_coefficients, hermite_e, relu_hermite_coefficient
from .tensors import hermite_tensor, partial_matchings, raw_to_hermite

__all__ = [
    "subtract_expansion",
    "hermite_e",
    "relu_hermite_coefficient",
    "activation_hermite_coefficients",
    "unique_indices",
    "packed_index",
    "pack",
    "unpack",
    "partial_matchings",
    "raw_moment_sums",
    "raw_moment_sums_upto",
    "raw_moment_flops",
    "raw_to_hermite",
    "hermite_tensor",
    "contracted_coefficients",
    "contracted_matrix_sums",
    "contracted_vector_sums",
    "contracted_scalar_sums",
    "contracted_sums_of_labels",
    "multiplicities",
    "packed_trace",
    "expansion_coefficients",
    "expansion_terms",
]
