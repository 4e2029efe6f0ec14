"""Row batches that bound the temporaries of every sum over samples."""

from __future__ import annotations

from collections.abc import Iterator

# Temporaries (in float64 elements) are kept below ~64 MB by processing rows in batches.
_TEMP_ELEMENTS = 64 * 2**20 // 8


def _row_batches(n: int, row_elements: int, budget: int | None = None) -> Iterator[slice]:
    """Row slices so that a temporary of ``rows * row_elements`` stays under budget
    (``_TEMP_ELEMENTS`` unless ``budget`` is given)."""
    budget = _TEMP_ELEMENTS if budget is None else budget
    rows = max(1, budget // max(1, row_elements))
    for start in range(0, n, rows):
        yield slice(start, min(n, start + rows))
