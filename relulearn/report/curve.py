"""The figure of ``relulearn curve``: the parameter error against the samples on log-log axes with the fitted slope
beside the papers' rate and the exact-recovery point, and the relative test error beside the noise floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_bytes
from ._plot import drawn, plt

__all__ = ["curve_axes", "curve_png", "write_curve_png", "COLOURS"]

#: the colour of each drawn element (a test finds the exact-recovery marker by its colour)
COLOURS = {"points": "#1f77b4", "fit": "#ff7f0e", "stated": "#7f7f7f", "exact": "#d62728", "test": "#2ca02c"}

#: an exact point is drawn at its error, but not below these (an error of 0 has no place on a log axis): a
#: parameter error at rounding, and a relative test error, its square
BOTTOM, TEST_BOTTOM = 1e-17, 1e-33


def _log_ticks(axis: Any, values: np.ndarray) -> None:
    """Ticks at 1, 2 and 5 times the powers of ten when ``values`` span less than two decades (a log axis labels
    only its decades, of which so short a range may hold none), with at least a factor 4 of room."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    vals = values[np.isfinite(values) & (values > 0)]
    if not len(vals) or vals.max() / vals.min() >= 100:
        return
    lo, hi = vals.min(), vals.max()
    pad = max(1.5, np.sqrt(4.0 / (hi / lo)))
    lo, hi = lo / pad, hi * pad
    (axis.axes.set_xlim if axis is axis.axes.xaxis else axis.axes.set_ylim)(lo, hi)
    decades = np.arange(np.floor(np.log10(lo)), np.ceil(np.log10(hi)) + 1)
    ticks = [m * 10**k for k in decades for m in (1.0, 2.0, 5.0) if lo <= m * 10**k <= hi]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(_power_label))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _power_label(value: float, _: Any = None) -> str:
    """``m × 10^k`` in mathtext (``10^k`` for m = 1)."""
    k = int(np.floor(np.log10(value) + 1e-9))
    m = round(value / 10**k)
    return f"$10^{{{k}}}$" if m == 1 else f"${m}\\times10^{{{k}}}$"


def curve_axes(result: dict[str, Any]) -> Any:
    """The curve's matplotlib figure (not yet drawn): left the parameter error, right the relative test error.

    Lines, by label: ``parameter error`` (every point measured), ``fit`` (the least-squares line over the
    points fitted), ``paper's rate`` (slope ``stated_slope`` through the fitted points' geometric centre),
    ``exact recovery`` (one marker at the first count below the floor), ``exact floor`` (the floor);
    ``relative test error`` and ``noise floor`` on the right."""
    fig, (left, right) = plt().subplots(1, 2, figsize=(10.0, 3.8), layout="constrained")
    pts = result["points"]
    fit = result["fit"]
    n = np.array([p["samples"] for p in pts], dtype=float)
    err = np.array([np.nan if p["parameter_error"] is None else p["parameter_error"] for p in pts], dtype=float)
    shown = np.isfinite(err)
    left.loglog(
        n[shown], np.maximum(err[shown], BOTTOM), "o", color=COLOURS["points"], label="parameter error", zorder=3
    )
    if fit["slope"] is not None:
        nf = np.array(fit["fitted"], dtype=float)
        line = np.geomspace(nf.min(), nf.max(), 50)
        se = "" if fit["slope_se"] is None else f" ± {fit['slope_se']:.2f}"
        label = f"fit: slope {fit['slope']:.2f}{se}"
        left.loglog(line, fit["constant"] * line ** fit["slope"], "-", color=COLOURS["fit"], label=label)
        centre = np.exp(np.mean(np.log(nf)))
        at = np.exp(np.mean(np.log(err[np.isin(n, nf)])))
        left.loglog(
            line,
            at * (line / centre) ** result["stated_slope"],
            "--",
            color=COLOURS["stated"],
            label=f"paper's rate: slope {result['stated_slope']:g}",
        )
    exact = result.get("exact_recovery_samples")
    if exact is not None:
        e = float(err[n == exact][0])
        left.loglog(
            [exact],
            [max(e, BOTTOM)],
            "*",
            ms=14,
            color=COLOURS["exact"],
            label=f"exact recovery at {exact:,}",
            zorder=4,
        )
        left.axhline(fit["floor"], color=COLOURS["exact"], lw=0.8, ls=":", label="exact floor")
    _log_ticks(left.xaxis, n)
    _log_ticks(left.yaxis, err if exact is None else np.r_[err, fit["floor"]])
    if exact is not None:  # the floor in view: the exact points lie decades under it
        lo, hi = left.get_ylim()
        left.set_ylim(min(lo, fit["floor"] / 3), max(hi, fit["floor"] * 3))
    left.set_xlabel("samples")
    left.set_ylabel("parameter error (up to symmetries)")
    left.set_title(f"{result['method']}: parameter error", fontsize=10)
    if shown.any():
        left.legend(fontsize=7)
    test = np.array([np.nan if p["relative_test_error"] is None else p["relative_test_error"] for p in pts])
    ok = np.isfinite(test)
    right.loglog(
        n[ok], np.maximum(test[ok], TEST_BOTTOM), "o-", color=COLOURS["test"], label="relative test error", zorder=3
    )
    floors = [p["noise_floor"] for p in pts if p.get("noise_floor")]
    if floors:
        right.axhline(max(floors), color=COLOURS["stated"], ls="--", lw=0.8, label="noise floor")
    _log_ticks(right.xaxis, n)
    _log_ticks(right.yaxis, np.r_[test, floors])
    right.set_xlabel("samples")
    right.set_ylabel("relative test error")
    right.set_title("test error on fresh samples", fontsize=10)
    if ok.any():
        right.legend(fontsize=7)
    return fig


def curve_png(result: dict[str, Any]) -> bytes:
    """The curve's figure as PNG bytes."""
    return drawn(curve_axes(result))[0]


def write_curve_png(result: dict[str, Any], path: str | Path) -> int:
    """Write the curve's figure to ``path`` (PNG, whole or not at all); returns its size in bytes."""
    png = curve_png(result)
    write_bytes(path, png)
    return len(png)
