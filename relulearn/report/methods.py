"""The figures of each method's learn, drawn from the report it recorded in the store: polynomial (error against
degree), landscape (the objective G over the optimisation, the units' angles), exact (the decomposition, the
weights of every output), filtered-pca (the filtered spectra per τ, the residual passes). The moments method's
pictures are the common ones (spectra, learning curves, units)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..methods import METHODS
from ._plot import EXACT, Figure, drawn, from_records, integer_axis, log_bars, matched_angles, panels
from .common import recorded_network

#: how many residual passes and τ matrices a figure shows at most
MAX_PANELS = 6


def _report(record: dict | None) -> dict:
    return (record or {}).get("report") or {}


# ------------------------------------------------------------------------------------------- polynomial


def degree(record: dict | None) -> Figure:
    title = "Held-out error against degree, with the Hermite tail and the variance term"
    rep = _report(record)
    if not rep.get("degrees") or not rep.get("held_out_error"):
        return Figure("degree", title, "no polynomial learn with errors by degree recorded on this store")
    deg = np.asarray(rep["degrees"], dtype=float)
    fig, axes = panels(1, width=5.5, height=3.4)
    ax = axes[0]
    for key, label, style in (
        ("held_out_error", "held-out error", "o-"),
        ("tail", "Hermite tail past the degree", "s--"),
        ("predicted_variance", "variance of the estimated coefficients", "^:"),
    ):
        vals = np.asarray(rep.get(key) or [np.nan] * len(deg), dtype=float)
        ax.semilogy(deg, np.maximum(vals, 1e-30), style, ms=4, label=label)
    chosen = rep.get("degree")
    if chosen is not None:
        ax.axvline(chosen, color="0.5", lw=0.8, ls="--")
    ax.set_xlabel("degree of the polynomial")
    ax.set_ylabel("relative error")
    integer_axis(ax.xaxis)
    ax.legend(fontsize=8)
    return Figure(
        "degree",
        title,
        f"degree {chosen} chosen by {rep.get('degree_chosen_by', 'held-out error')} "
        f"({rep.get('held_out_samples', 0):,} held-out samples); tail: the label energy the degree leaves "
        "out; variance: what estimating the coefficients adds",
        *drawn(fig),
    )


# -------------------------------------------------------------------------------------------- landscape


def objective(record: dict | None) -> Figure:
    title = "The objective G over the optimisation, every start"
    rounds = _report(record).get("rounds") or []
    traced = [r for r in rounds if any(s.get("trace") for s in r.get("starts", []))]
    if not traced:
        return Figure("objective", title, "no landscape learn with G traced recorded on this store")
    fig, axes = panels(len(traced), width=4.6, height=3.2)
    for i, (ax, rnd) in enumerate(zip(axes, traced)):
        traces = [np.asarray(s.get("trace") or [], dtype=float).reshape(-1, 2) for s in rnd["starts"]]
        lowest = min(float(t[:, 1].min()) for t in traces if len(t))
        floor = 1e-15 * max(1.0, abs(lowest))  # G's rounding level: the starts that reach it have met
        for s, tr in zip(rnd["starts"], traces):
            if len(tr):
                best = s.get("start") == rnd.get("best_start")
                ax.plot(
                    tr[:, 0],
                    np.maximum(tr[:, 1] - lowest, floor),
                    lw=1.6 if best else 0.8,
                    color="C3" if best else "0.55",
                    label="chosen start" if best else None,
                )
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yscale("log")
        ax.set_xlabel("L-BFGS iteration")
        ax.set_ylabel(f"G(B) − lowest G ({lowest:.4g})")
        p = rnd.get("parameters", {})
        ax.set_title(
            f"round {i + 1}: μ = {p.get('mu', float('nan')):.3g}, λ = {p.get('lambda', float('nan')):.3g}", fontsize=9
        )
        ax.legend(fontsize=7)
    starts = len(traced[-1]["starts"])
    return Figure(
        "objective",
        title,
        f"{starts} random starts per round, G above the lowest value any start "
        "reached (floored at its rounding level); every start ending at the floor is the landscape showing "
        "no spurious local minimum",
        *drawn(fig),
    )


def landscape_angles(record: dict | None) -> Figure:
    title = "The landscape's units and the polished network's"
    rep = _report(record)
    before = rep.get("before_polish")
    final = recorded_network(record or {})
    if not before or final is None:
        return Figure("angles", title, "no landscape learn with its answer before the polish recorded")
    w0 = final.weights[0]
    angles = matched_angles(w0, np.asarray(before["W0"], dtype=np.float64))
    k = w0.shape[0]
    unit = w0 / np.linalg.norm(w0, axis=1, keepdims=True)
    cross = np.abs(unit @ unit.T)[~np.eye(k, dtype=bool)]
    fig, (a1, a2) = panels(2, width=4.4, height=3.2)
    clipped = log_bars(a1, angles, color="C0")
    a1.set_xlabel("unit of the learned network")
    a1.set_ylabel("angle moved by the polish (rad)")
    if clipped:
        a1.legend(fontsize=7)
    a2.hist(np.degrees(np.arccos(np.clip(cross, 0, 1))), bins=30, range=(0.0, 90.0), color="C0")
    a2.set_xlabel("angle between two learned units (degrees)")
    a2.set_ylabel("pairs of units")
    return Figure(
        "angles",
        title,
        f"{k} units; left: how far the exact polish moved each unit of G's minimum "
        f"(hatched: ≤ {EXACT:.0e} rad); right: the units' pairwise angles",
        *drawn(fig),
    )


# ------------------------------------------------------------------------------------------------ exact


def decomposition(record: dict | None) -> Figure:
    title = "The decomposition: spectrum of the subspace and the tensor's residuals"
    rep = _report(record)
    sub, ten = rep.get("subspace") or {}, rep.get("tensor") or {}
    if not sub.get("eigenvalues"):
        return Figure("decomposition", title, "no two-layer (exact) learn with its spectrum recorded")
    ev = np.abs(np.asarray(sub["eigenvalues"], dtype=float))
    res = np.asarray(ten.get("jennrich_residuals") or [], dtype=float)
    fig, axes = panels(2 if len(res) else 1, width=4.4, height=3.2)
    ax = axes[0]
    ax.semilogy(np.arange(1, len(ev) + 1), np.maximum(ev, 1e-30), "o", color="C0", label="|eigenvalue|")
    ax.axhline(sub.get("floor", np.nan), color="C3", ls="--", lw=1, label="noise floor")
    ax.axvline(sub.get("rank", 0) + 0.5, color="0.5", lw=0.8)
    ax.set_xlabel("eigenvalue index")
    ax.set_ylabel("|eigenvalue| of the output moments")
    integer_axis(ax.xaxis)
    ax.legend(fontsize=7)
    if len(res):
        log_bars(axes[1], res, color="C2")
        axes[1].set_xlabel("Jennrich step")
        axes[1].set_ylabel("relative residual")
    return Figure(
        "decomposition",
        title,
        f"rank {sub.get('rank')} (vertical line) above the floor; tensor path "
        f"{rep.get('path', '?')}, relative residual {ten.get('relative_residual', float('nan')):.3g}",
        *drawn(fig),
    )


def outputs(record: dict | None) -> Figure:
    title = "Output weights and the exactness check of every output"
    net = recorded_network(record or {})
    if net is None:
        return Figure("outputs", title, "no network recorded by a learn on this store")
    w1 = np.asarray(net.weights[-1], dtype=float)
    errs = np.asarray((_report(record).get("check") or {}).get("relative_error_per_output") or [], dtype=float)
    fig, axes = panels(2 if len(errs) else 1, width=4.4, height=3.2)
    lim = float(np.max(np.abs(w1))) or 1.0
    im = axes[0].imshow(w1, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    axes[0].set_xlabel("hidden unit")
    axes[0].set_ylabel("output")
    integer_axis(axes[0].xaxis)
    integer_axis(axes[0].yaxis)
    axes[0].figure.colorbar(im, ax=axes[0], shrink=0.8)
    if len(errs):
        clipped = log_bars(axes[1], errs, color="C1")
        axes[1].set_xlabel("output")
        axes[1].set_ylabel("relative error on check samples")
        if clipped:
            axes[1].legend(fontsize=7)
    return Figure(
        "outputs",
        title,
        f"{w1.shape[0]} output(s) × {w1.shape[1]} units; right: each output's relative "
        "error on fresh check samples (hatched: exact to double precision)",
        *drawn(fig),
    )


# ----------------------------------------------------------------------------------------- filtered-pca


def filtered_spectra(record: dict | None) -> Figure:
    title = "Filtered spectra per threshold τ"
    steps = _report(record).get("steps") or []
    first = next((s for s in steps if s.get("pass") == "filtered"), None)
    spectra = ((first or {}).get("subspace") or {}).get("spectra") or []
    if not spectra:
        return Figure("filtered", title, "no filtered-pca learn with its filtered spectra recorded")
    assert first is not None  # the spectra came from it
    grid = first.get("grid") or []
    prob = [g.get("prob", np.nan) for g in grid][: len(spectra)]
    top = 8
    ratio = np.full((len(spectra), top), np.nan)
    for i, sp in enumerate(spectra):
        ev = np.sort(np.abs(np.asarray(sp["eigenvalues"], dtype=float)))[::-1][:top]
        ratio[i, : len(ev)] = ev / max(float(sp["floor"]), 1e-300)
    fig, axes = panels(1, width=5.5, height=3.4)
    ax = axes[0]
    x = np.asarray(prob, dtype=float) if len(prob) == len(spectra) else np.arange(len(spectra))
    for j in range(top):
        ax.semilogy(x, ratio[:, j], "o-", ms=3, lw=0.8, color=f"C{j % 10}", label=f"|λ_{j + 1}|" if j < 5 else None)
    ax.axhline(1.0, color="C3", ls="--", lw=1, label="noise floor")
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks of a short log range collide
    ax.set_xlabel("P[|y| > τ] (the filter keeps this share of samples)")
    ax.set_ylabel("|eigenvalue| / noise floor")
    ax.legend(fontsize=7, ncol=2)
    return Figure(
        "filtered",
        title,
        f"{len(spectra)} thresholds; the {top} largest eigenvalues of each M_τ in "
        f"units of its noise floor; {first.get('added', 0)} direction(s) kept from this pass",
        *drawn(fig),
    )


def residual_passes(record: dict | None) -> Figure:
    title = "The passes: stacked singular values against the threshold"
    steps = [s for s in (_report(record).get("steps") or []) if (s.get("subspace") or {}).get("threshold")]
    if not steps:
        return Figure("passes", title, "no filtered-pca learn with its passes recorded")
    shown = steps[:MAX_PANELS]
    fig, axes = panels(len(shown), width=3.6, height=3.0)
    for ax, s in zip(axes, shown):
        sub = s["subspace"]
        sv = np.asarray(sub.get("singular_values") or [], dtype=float)[:16]
        ax.set_title(f"{s.get('pass')}: {s.get('added', 0)} added", fontsize=9)
        if not len(sv):  # no matrix of the pass had an eigenvalue past its floor
            ax.text(
                0.5,
                0.5,
                "no eigenvalue past\nits noise floor",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=9,
            )
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.bar(np.arange(1, len(sv) + 1), np.maximum(sv, 1e-30), color="C2")
        ax.axhline(sub["threshold"], color="C3", ls="--", lw=1)
        ax.set_yscale("log")
        # limits from the values and the threshold (autoscaling spreads a single bar over the whole panel)
        heights = np.append(sv[sv > 0], float(sub["threshold"]))
        ax.set_ylim(heights.min() / 3, heights.max() * 3)
        ax.set_xlim(0.4, max(len(sv), 4) + 0.6)
        ax.set_xlabel("singular value index")
        ax.set_ylabel("singular value")
        integer_axis(ax.xaxis)
    total = sum(int(s.get("added", 0)) for s in steps)
    return Figure(
        "passes",
        title,
        f"{len(steps)} pass(es), {total} direction(s) in all; dashed: the threshold a "
        "direction must pass (the union bound over the pass's matrices)",
        *drawn(fig),
    )


#: the methods' own figures by name (:attr:`relulearn.methods.Method.figures` names them)
FIGURES: dict[str, Callable[[dict | None], Figure]] = {
    "degree": degree,
    "objective": objective,
    "angles": landscape_angles,
    "decomposition": decomposition,
    "outputs": outputs,
    "filtered": filtered_spectra,
    "passes": residual_passes,
}

#: each method's own figures, after the common ones
METHOD_FIGURES: dict[str, tuple[Callable[[dict | None], Figure], ...]] = {
    m.name: tuple(FIGURES[f] for f in m.figures) for m in METHODS.values()
}


def method_figures(record: dict | None) -> list[Figure]:
    """The figures of the method of ``record`` (a learn's record; none for a method without its own)."""
    method = METHODS.get(str((record or {}).get("method")))
    return [from_records(f, functools.partial(FIGURES[f], record), record) for f in (method.figures if method else ())]
