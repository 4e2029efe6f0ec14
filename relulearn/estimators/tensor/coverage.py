"""Enough samples on both sides of every unit: rows added to a polish's sample for its rarely active (or rarely
inactive) units.

A unit's hidden row ``[u_i, b_i]`` (d+1 unknowns) is fitted from the samples where it is active, and told apart
from the affine part and the output bias by the samples where it is not. For Gaussian inputs the smaller side holds
a fraction ``Φ(−|β_i|)`` of the samples (``β_i = b_i/|u_i|``): 1.8 % at ``|β| = 2.1``. A sample sized by the
unknowns alone (as matrix-free polish draws it, 8 rows per unknown over all outputs) then gives such a unit fewer
rows than unknowns: at d = 784 its row is underdetermined, its misfit leaks into every other unit and the
Gauss–Newton polish stalls near 10⁻⁴ instead of converging quadratically.

:func:`cover` draws further samples (an independent part of the source, streamed in batches) and keeps only
those on the smaller side of a unit still short of :data:`SIDE_ROWS` ``(d+1)`` rows, until every unit has them or
the draw reaches its cap (a unit that would need more queries than the cap at its Gaussian rate is not drawn for,
and stays short). The polish's least squares is exact on any design of full rank, so a sample enriched
this way recovers a noiseless teacher as a Gaussian one does, with a design sized for its rarest unit at the cost
of queries, not of polish time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtr

__all__ = ["COVER_PART", "COVER_QUERIES", "SIDE_ROWS", "Coverage", "cover", "side_counts"]

#: rows wanted on each unit's smaller side, per unknown of its hidden row (d+1): with 1 the row is just
#: determined; at 4 the polish from 0.1 rad converged quadratically at d = 784 (k = 32 and 128, 10 outputs) where
#: the Gaussian sample alone gave the rarest unit 0.6 and 1.0 and stalled
SIDE_ROWS = 4

#: the part of the source the added samples come from (parts 0 and 1 are training and validation, the residual
#: rounds use parts from 2 upwards)
COVER_PART = 1_000_000

#: queries :func:`cover` draws at most
COVER_QUERIES = 2**21

#: rows per batch where the draw does not stream its parts itself (held at once: ``rows × d`` inputs)
BATCH_ROWS = 50_000


def _batches(draw: Any, part: int, n: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``n`` samples of ``draw``'s part ``part`` batch by batch when it streams them (``part_batches``), else its
    parts ``part, part + 1, …`` of :data:`BATCH_ROWS` each."""
    if hasattr(draw, "part_batches"):
        yield from draw.part_batches(int(part), int(n))
        return
    i = 0
    while n > 0:
        rows = min(n, BATCH_ROWS)
        yield draw.part(int(part) + i, rows)
        i, n = i + 1, n - rows


@dataclass
class Coverage:
    """What :func:`cover` did: queries drawn, rows kept, and the units still short of their rows."""

    queries: int = 0
    rows_added: int = 0
    needed: int = 0
    short_units: list[int] = field(default_factory=list)
    smallest_side: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def side_counts(x: np.ndarray, directions: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether each sample is on each unit's smaller side (n, k), for unit directions and offsets ``β`` (either
    orientation: the smaller side of ``s = û·x + β`` is where its sign differs from that of ``β``), and the count
    per unit."""
    side = (x @ directions.T + beta > 0) != (beta > 0)
    return side, side.sum(axis=0)


def cover(
    draw: Any,
    x: np.ndarray,
    directions: np.ndarray,
    beta: np.ndarray,
    *,
    rows: int = SIDE_ROWS,
    max_queries: int = COVER_QUERIES,
    part: int = COVER_PART,
) -> tuple[np.ndarray, np.ndarray, Coverage]:
    """Samples to add to ``x`` so that each unit has ``rows · (d+1)`` of them on its smaller side.

    Parameters
    ----------
    draw
        A :class:`~.base.SampleDraw`; its part ``part`` is streamed in batches.
    x
        The samples the polish has, (n, d).
    directions, beta
        The units as found: unit directions (k, d) and offsets ``β = b/|u|`` (k,).
    rows
        Rows wanted per unknown of a hidden row.
    max_queries
        Samples drawn at most.
    part
        The source's part to draw from (draws without ``part_batches``: the parts from ``part`` on).

    Returns
    -------
    x_added, y_added, Coverage
        The kept samples (empty when every unit already has its rows) and what was done.
    """
    d = x.shape[1]
    need = rows * (d + 1)
    _, have = side_counts(x, directions, beta)
    deficit = np.maximum(need - have, 0)
    report = Coverage(needed=need)
    kept_x: list[np.ndarray] = []
    kept_y: list[np.ndarray] = []
    # the queries each short unit needs at its side's Gaussian rate; a unit that needs more than the cap (|β| past
    # about 4.5 at d = 784) stays short without a draw: its rows would not be reached anyway
    expected = 1.2 * deficit / np.maximum(ndtr(-np.abs(beta)), 1e-300)
    reachable = (deficit > 0) & (expected <= max_queries)
    if reachable.any():
        wanted = int(min(max_queries, np.max(expected[reachable]) + 1_000))
        for xb, yb in _batches(draw, part, wanted):
            report.queries += len(xb)
            side, _ = side_counts(xb, directions, beta)
            take = np.flatnonzero((side & reachable[None, :]).any(axis=1))
            # a sample counts for every short unit it sits on the smaller side of
            deficit = np.maximum(deficit - side[take].sum(axis=0), 0)
            kept_x.append(xb[take])
            kept_y.append(yb[take])
            reachable &= deficit > 0
            if not reachable.any():
                break
    x_add = np.concatenate(kept_x) if kept_x else np.empty((0, d))
    y_add = np.concatenate(kept_y) if kept_y else np.empty((0,))
    report.rows_added = len(x_add)
    report.short_units = np.flatnonzero(deficit > 0).tolist()
    report.smallest_side = int(np.min(need - deficit)) if len(deficit) else 0
    return x_add, y_add, report
