"""A family computed for each output of a label vector (:class:`PerOutput`), and reading an output's part
of what is stored for all of them (its grids, the output count of a stored run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import overload

import numpy as np

from .base import Statistic, Var

__all__ = ["PerOutput", "stored_outputs", "of_output"]


def _at(arrays: Mapping[str, np.ndarray], j: int) -> dict[str, np.ndarray]:
    """Views of entry ``j`` along the leading axis (``a[j, ...]``: a 0-d view, not a copy, when
    ``a`` is 1-d, so that in-place updates reach the stacked accumulator)."""
    return {k: a[j, ...] for k, a in arrays.items()}


class PerOutput(Statistic):
    """A family computed for each output ``j`` of a label vector, as if ``y = A_j``.

    Holds one inner statistic per output (they differ only in what was fitted to their
    output, e.g. the τ grid from per-output quantiles). Every array of the inner schemas
    gets a leading dimension ``output``; each output's sums are updated in place through
    views of the stacked accumulator, so they are the bits the inner statistic computes
    on the scalar source of that output. Coordinates equal for all outputs are stored
    once, the others stacked along ``output``; ``output`` itself is a coordinate.
    """

    def __init__(self, inner: Iterable[Statistic]):
        self.inner = list(inner)
        if not self.inner or len({s.name for s in self.inner}) != 1:
            raise ValueError("PerOutput needs one or more statistics of the same family")
        self.name = self.inner[0].name

    @property
    def outputs(self) -> int:
        return len(self.inner)

    def _stacked(self, schema: Mapping[str, Var]) -> dict[str, Var]:
        return {k: Var(("output",) + v.dims, (self.outputs,) + v.shape) for k, v in schema.items()}

    def sums_schema(self):
        return self._stacked(self.inner[0].sums_schema())

    def terms_schema(self):
        return self._stacked(self.inner[0].terms_schema())

    def coords(self):
        out = {"output": (("output",), np.arange(self.outputs, dtype=np.int64))}
        per = [s.coords() for s in self.inner]
        for k, (dims, _first) in per[0].items():
            values = [np.asarray(c[k][1]) for c in per]
            if all(v.shape == values[0].shape and np.array_equal(v, values[0]) for v in values[1:]):
                out[k] = (dims, values[0])
            else:
                out[k] = (("output",) + tuple(dims), np.stack(values))
        return out

    def update(self, acc, x, y):
        first = self.inner[0]
        if hasattr(first, "update_outputs"):
            # a family that computes all outputs together (projected_contracted: one projection of the
            # batch, one GEMM for every output's sums) gets the stacked accumulator whole
            first.update_outputs(self.inner, acc, x, y)
            return
        if hasattr(first, "label_free_sums"):
            # sums that do not involve the label (basic's x, xxᵀ) once for all outputs, not m times:
            # the same batch arrays are added to every output, so each output's bits are unchanged
            shared = first.label_free_sums(x)
            for j, s in enumerate(self.inner):
                out = _at(acc, j)
                s.label_update(out, x, y[:, j])
                for k, v in shared.items():
                    out[k] += v
            return
        for j, s in enumerate(self.inner):
            s.update(_at(acc, j), x, y[:, j])

    def terms(self, acc):
        per = [s.terms(_at(acc, j)) for j, s in enumerate(self.inner)]
        return {k: np.stack([p[k] for p in per]) for k in per[0]}

    def config(self):
        return {"per_output": [s.config() for s in self.inner]}


def stored_outputs(names: Iterable[str], stored: Callable[[str], Mapping[str, np.ndarray]]) -> int | None:
    """The number of outputs of a stored run's label vector (None: scalar label), read from
    the ``output`` coordinate of one of its statistics: every statistic of a vector run has
    it (the scalar ``output_moments`` has one of length 1, the scalar families none)."""
    # one group tells; not the Hermite tensors (the largest) unless they are all there is
    name = min(names, key=lambda n: n == "hermite", default=None)
    if name is None:
        return None
    arrays = stored(name)
    return int(len(arrays["output"])) if "output" in arrays and len(arrays["output"]) > 1 else None


@overload
def of_output(values: np.ndarray, j: int | None, ndim: int) -> np.ndarray: ...


@overload
def of_output(values: np.ndarray | None, j: int | None, ndim: int) -> np.ndarray | None: ...


def of_output(values: np.ndarray | None, j: int | None, ndim: int) -> np.ndarray | None:
    """Output ``j``'s part of a grid stored once for all outputs (``ndim`` dims) or stacked
    along a leading output axis (``ndim + 1``)."""
    if values is None or j is None:
        return values
    values = np.asarray(values)
    return values[j] if values.ndim == ndim + 1 else values
