"""The work per sample a family declares (:class:`Work`), and the counts every family's cost is made of: the
Gram updates of d × d sums, and a configuration section's options read alike from a mapping or its model.

Here, not in :mod:`relulearn.pipeline.cost` (which prices the work by measured rates), so that each family's
module declares its own cost without importing the cost model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Work", "F", "syrk", "gram_work", "option", "count", "grid_size"]

F = 8  # bytes of a float64


@dataclass(frozen=True)
class Work:
    """Work per sample: BLAS-3 flops by product size, memory-bound bytes (in place, and written into fresh
    temporaries), Gaussian numbers drawn."""

    gemm: tuple[tuple[float, int], ...] = ()
    stream: float = 0.0
    normals: float = 0.0
    fresh: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(
            self.gemm + other.gemm, self.stream + other.stream, self.normals + other.normals, self.fresh + other.fresh
        )

    def scaled(self, c: float) -> Work:
        """The work of ``c`` copies (``c`` outputs computed one after the other)."""
        return Work(tuple((f * c, s) for f, s in self.gemm), self.stream * c, self.normals * c, self.fresh * c)

    @property
    def flops(self) -> float:
        return float(sum(f for f, _ in self.gemm))


def syrk(d: int) -> tuple[float, int]:
    """A Gram ``Xᵀ X`` (or two signed ones, rows of positive and of negative weight): d(d + 1) flops per sample."""
    return (float(d) * (d + 1), d)


def gram_work(d: int, matrices: int, *, weighted: bool = True) -> Work:
    """``matrices`` d × d sums of ``w x xᵀ``: a syrk each above d = 64 (the rows gathered or weighted once per
    matrix, in place), one GEMM per row batch for all below it (2 d² flops each, on a fresh weighted copy of
    the rows for every matrix, which the GEMM then reads)."""
    from ...hermite.contracted import _SYRK_MIN_D

    if d >= _SYRK_MIN_D:
        return Work(((matrices * float(d) * (d + 1), d),), stream=(2 if weighted else 1) * F * d * matrices)
    flops = (2.0 * matrices * d * d, min(d, matrices * d))
    if not weighted:
        return Work((flops,), stream=F * d * matrices)
    return Work((flops,), stream=F * d * matrices, fresh=F * d * matrices)


def option(section: Any, name: str) -> Any:
    """Option ``name`` of a configuration section given as a mapping or as its pydantic model (None: unset)."""
    return section.get(name) if isinstance(section, Mapping) else getattr(section, name, None)


def count(directions: Any) -> int:
    """Directions of a ``directions`` option: a count, or the list of them."""
    return directions if isinstance(directions, int) else len(directions)


def grid_size(section: Any) -> int:
    """Thresholds of a τ grid: its ``quantiles`` or its ``thresholds``."""
    return len(option(section, "quantiles") or option(section, "thresholds") or [0])
