"""The plotting helpers every figure shares: matplotlib (or the documented refusal), PNG bytes, panels in rows of
at most three, integer axes for counts, and log bars that say where they are clipped."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: a log bar below this is drawn at it and labelled exact: double precision cannot tell it from zero
EXACT = 1e-15
#: the resolution of the figures' PNGs
DPI = 90


@dataclass(frozen=True)
class Figure:
    """One figure: its name, title, a caption, and its PNG bytes (None: not drawn, ``caption`` says why)."""

    name: str
    title: str
    caption: str
    png: bytes | None = None
    overlaps: tuple[str, ...] = ()  # pairs of texts drawn over each other (none in a good figure)


def from_records(name: str, draw: Callable[[], Figure], record: dict | None = None) -> Figure:
    """``draw()``, a figure drawn from learn records; or, when the records do not hold what it reads (a record
    edited or written by another tool: the store checks their top-level fields only), the figure not drawn,
    saying which record (``record``, else the store's learn records) and why, with a warning."""
    try:
        return draw()
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as err:
        stamp = record.get("recorded") if isinstance(record, dict) else None
        which = f"the learn record records/learn-{stamp}.json" if stamp else "the store's learn records"
        why = f"{which} does not hold what the {name} figure reads ({type(err).__name__}: {err})"
        log.warning("%s; the figure is not drawn", why)
        return Figure(name, name, why)


def plt(user: str = "relulearn report") -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or :class:`~relulearn.errors.MissingDependencyError` naming the
    extra that installs it (and ``user``, what draws)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        from ..errors import MissingDependencyError

        raise MissingDependencyError(
            f"{user} draws with matplotlib, which is not installed: "
            "pip install 'relulearn[report]' (or pip install matplotlib)"
        ) from None
    return pyplot


def drawn(fig: Any) -> tuple[bytes, tuple[str, ...]]:
    """The figure as PNG bytes and the texts that overlap in it (labels, ticks, titles, legends: each pair as
    ``'a' / 'b'``); the figure is closed.

    The figure is laid out and drawn once at the PNG's resolution, its texts checked on that drawing, and the
    layout then kept for the PNG, which ``savefig`` draws once more: constrained layout and text measurement are
    most of a figure's time (three draws, each laying the figure out, took a landscape report 3.9 s; now 2.3 s).
    The constrained layout already fits the figure, so no tight box is cut from it."""
    fig.set_dpi(DPI)
    fig.canvas.draw()
    overlaps = text_overlaps(fig)
    fig.set_layout_engine("none")  # the axes keep the positions the constrained layout gave them
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt().close(fig)
    return buf.getvalue(), overlaps


def text_overlaps(fig: Any) -> tuple[str, ...]:
    """Pairs of drawn, non-empty texts of ``fig`` (titles, axis labels, tick labels in view, legends, notes)
    whose boxes intersect by more than a pixel each way."""
    renderer = fig.canvas.get_renderer()
    texts = [t for t in _drawn_texts(fig) if t.get_visible() and t.get_text().strip()]
    boxes = [t.get_window_extent(renderer) for t in texts]
    out = []
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            a, b = boxes[i], boxes[j]
            if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1:
                out.append(f"{texts[i].get_text()!r} / {texts[j].get_text()!r}")
    return tuple(out)


def _drawn_texts(fig: Any) -> list[Any]:
    out = list(fig.texts)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            # the ticks drawn (those in view): the axis keeps labels of others, not drawn
            for tick in axis._update_ticks():
                out += [tick.label1, tick.label2]
            out.append(axis.offsetText)
        legend = ax.get_legend()
        if legend is not None:
            out += list(legend.get_texts())
    return out


def panels(count: int, *, width: float = 3.6, height: float = 3.0, columns: int = 3) -> tuple[Any, list[Any]]:
    """A figure of ``count`` panels in rows of at most ``columns``, each ``width × height`` inches; the unused
    cells of the last row are hidden."""
    cols = max(1, min(columns, count))
    rows = -(-count // cols)
    fig, axes = plt().subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained")
    flat = list(axes.ravel())
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def integer_axis(axis: Any) -> None:
    """Ticks on whole numbers only (a count of stages or passes has no 2.5)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def log_bars(ax: Any, values: np.ndarray, *, color: str, label: str | None = None) -> int:
    """Bars of ``values`` on a log axis; a bar at or below :data:`EXACT` is drawn at it, hatched, and the axis
    says so. NaN values (nothing to compare) get no bar. Returns how many bars were clipped."""
    vals = np.asarray(values, dtype=float)
    idx = np.arange(len(vals))
    clipped = np.isfinite(vals) & (vals <= EXACT)
    shown = np.where(clipped, EXACT, vals)
    ax.bar(idx[~clipped], shown[~clipped], color=color, label=label)
    if clipped.any():
        ax.bar(idx[clipped], shown[clipped], color="white", edgecolor=color, hatch="///", label="exact (≤ 10⁻¹⁵)")
    ax.set_yscale("log")
    top = np.nanmax(np.r_[shown[np.isfinite(shown)], EXACT * 10])
    ax.set_ylim(EXACT / 10, max(top * 10, EXACT * 100))
    integer_axis(ax.xaxis)
    return int(clipped.sum())


def unit_angle(u: np.ndarray, v: np.ndarray) -> float:
    """The angle between two directions, accurate near zero (``arccos`` of a cosine cannot go below ~10⁻⁸)."""
    a, b = u / np.linalg.norm(u), v / np.linalg.norm(v)
    return float(2.0 * np.arcsin(min(1.0, np.linalg.norm(a - b) / 2.0)))


def matched_angles(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per row of ``reference``, the angle to the row of ``other`` it is matched with (the matching of largest total
    cosine between unit rows; NaN for a row left unmatched, or for rows of another length)."""
    angles = np.full(len(reference), np.nan)
    if reference.shape[1:] != other.shape[1:] or not len(other):
        return angles
    from scipy.optimize import linear_sum_assignment

    a = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    b = other / np.linalg.norm(other, axis=1, keepdims=True)
    for i, j in zip(*linear_sum_assignment(-(a @ b.T))):
        angles[i] = unit_angle(a[i], b[j])
    return angles
