"""The figures every store may have, whatever the method: spectra of its second-moment families, the filter's τ
grid, the stages of the last learn, and the learns against the samples held (the units figure: :mod:`.units`)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from ._plot import Figure, drawn, integer_axis, panels

#: the spectra figure shows at most this many matrices (the strongest evidence first)
MAX_SPECTRA = 6


def second_moments(stats: dict) -> tuple[list, list, list[str]]:
    """Every stored symmetric d × d estimate with its standard errors: contracted ``M_l^g``, filtered ``M_τ``,
    the Hermite ``T_2`` (of ``hermite``, or of each output in ``output_moments``); a store of a label vector
    gives each output's (named ``y<j>:``)."""
    from ..estimators.spectral.stored_matrices import filtered_matrices, matrices_from_store
    from ..hermite import unpack

    mats: list = []
    ses: list = []
    names: list[str] = []
    if "contracted" in stats:
        for label, arrays in _outputs(stats["contracted"], {"M": 3, "M_se": 3}):
            m, s, n = matrices_from_store(arrays)
            mats, ses, names = mats + m, ses + s, names + [label + x for x in n]
    if "filtered" in stats:
        try:  # a vector's M_τ[j][i] are named by output j, then threshold i
            m, s, n, _ = filtered_matrices(stats["filtered"], "M_tau", "")
            mats, ses, names = mats + m, ses + s, names + n
        except ValueError:
            pass
    if "hermite" in stats and "T2" in stats["hermite"]:
        d = int(np.asarray(stats["hermite"]["T1"]).shape[-1])
        for label, arrays in _outputs(stats["hermite"], {"T2": 1, "T2_se": 1}):
            mats.append(unpack(np.asarray(arrays["T2"], dtype=float), d, 2))
            ses.append(unpack(np.asarray(arrays["T2_se"], dtype=float), d, 2))
            names.append(label + "T_2")
    if "output_moments" in stats:
        t2 = np.asarray(stats["output_moments"]["T2"], dtype=float)
        se = np.asarray(stats["output_moments"]["T2_se"], dtype=float)
        for j in range(t2.shape[0]):
            mats.append(t2[j])
            ses.append(se[j])
            names.append(f"T_2 of output {j}")
    return mats, ses, names


def _outputs(arrays: dict, ndim: dict[str, int]) -> list[tuple[str, dict]]:
    """A family's arrays per output, with a name prefix: one ``("", arrays)`` for a scalar label; for a label
    vector (the arrays in ``ndim`` stacked along a leading output axis) one ``("y<j>:", arrays of output j)``
    per output."""
    key = next(iter(ndim))
    stacked = np.asarray(arrays[key])
    if stacked.ndim == ndim[key]:
        return [("", arrays)]
    return [(f"y{j}:", {**arrays, **{k: np.asarray(arrays[k])[j] for k in ndim}}) for j in range(stacked.shape[0])]


def spectra(stats: dict) -> Figure:
    from ..estimators.spectral import stage as spectral

    title = "Eigenvalue spectra with error bars and noise floor"
    mats, ses, names = second_moments(stats)
    if not mats:
        return Figure(
            "spectra", title, "no second-moment family in the store (contracted, filtered, hermite or output_moments)"
        )
    found = spectral.relevant_subspace(mats, ses, names=names).to_dict().get("spectra", [])
    # the strongest evidence first (the largest |λ| over its floor): in store order a label vector's first
    # output alone could fill the figure
    found = sorted(found, key=lambda sp: -float(np.max(np.abs(sp["eigenvalues"]))) / max(sp["floor"], 1e-300))
    found = found[:MAX_SPECTRA]
    fig, axes = panels(len(found))
    for ax, sp in zip(axes, found):
        ev = np.asarray(sp["eigenvalues"], dtype=float)
        order = np.argsort(-np.abs(ev))[:20]
        ev, err = ev[order], np.asarray(sp["error_bar"], dtype=float)[order]
        ax.errorbar(np.arange(1, len(ev) + 1), ev, yerr=err, fmt="o", ms=3, capsize=2, color="C0")
        for sign in (1, -1):
            ax.axhline(sign * sp["floor"], color="C3", ls="--", lw=1)
        ax.axhline(0, color="0.6", lw=0.5)
        ax.set_title(f"{sp['name']} (rank {sp['rank']})", fontsize=9)
        ax.set_xlabel("eigenvalue index (by |λ|)", fontsize=8)
        ax.set_ylabel("eigenvalue ± error bar", fontsize=8)
        integer_axis(ax.xaxis)
    chosen = " (those with the largest |λ| over their noise floor)" if len(found) < len(mats) else ""
    caption = (
        f"{len(found)} of {len(mats)} matrices{chosen}; dashed: ± the noise floor; points outside it are the "
        "directions the spectral stage keeps"
    )
    return Figure("spectra", title, caption, *drawn(fig))


def tau(stats: dict) -> Figure:
    title = "Filter thresholds τ and P[|y| > τ]"
    if "filtered" not in stats:
        return Figure("tau", title, "no filtered statistic in the store (statistics.filtered)")
    arrays = stats["filtered"]
    # a label vector's grid is one row per output (τ from each output's |y| quantiles)
    prob = np.atleast_2d(np.asarray(arrays["prob"], dtype=float))
    grid = np.broadcast_to(np.asarray(arrays["tau"], dtype=float), prob.shape)
    se = np.broadcast_to(np.asarray(arrays["prob_se"], dtype=float), prob.shape) if "prob_se" in arrays else None
    fig, axes = panels(1, width=5.0)
    ax = axes[0]
    for j in range(len(prob)):
        label = f"output {j}" if len(prob) > 1 else None
        err = None if se is None else se[j]
        ax.errorbar(grid[j], prob[j], yerr=err, fmt="o-", ms=4, capsize=2, color=f"C{(2 + j) % 10}", label=label)
    ax.set_xlabel("threshold τ")
    ax.set_ylabel("P[|y| > τ]")
    ax.set_ylim(0, 1)
    if len(prob) > 1:
        ax.legend(fontsize=7)
    outputs = f", for each of {len(prob)} outputs" if len(prob) > 1 else ""
    return Figure(
        "tau",
        title,
        f"{grid.shape[1]} thresholds of the filtered second moment M_τ = E[1{{|y| > τ}} (xxᵀ − I)]{outputs}",
        *drawn(fig),
    )


def curves(record: dict | None) -> list[tuple[str, list[float]]]:
    """(label, losses) of the stages of a learn report: enumeration stages, candidate answers, refinement."""
    if record is None:
        return []
    rep = record.get("report", {})
    out = []
    enum = rep.get("enumeration") or {}
    stages = [s.get("heldout_loss") for s in enum.get("stages", []) if s.get("heldout_loss") is not None]
    if stages:
        out.append(("enumeration stages (held-out)", stages))
    models = [m.get("heldout_loss") for m in enum.get("models", []) if m.get("heldout_loss") is not None]
    if models:
        out.append(("candidate answers (held-out)", models))
    ref = rep.get("refinement") or {}
    steps = cast(list, ref.get("iterations") or (ref.get("passes") if isinstance(ref.get("passes"), list) else []))
    passes = [p.get("relative_loss", p.get("loss")) for p in steps if isinstance(p, dict)]
    passes = [v for v in passes if v is not None]
    if passes:
        out.append(("refinement passes", passes))
    rounds = rep.get("validation_relative_loss")
    if isinstance(rounds, dict) and len(rounds) > 1:  # e.g. an answer and its polish, in turn
        out.append(("answers in turn: " + ", ".join(rounds), [v for v in rounds.values() if v is not None]))
    residuals = _stage_residuals(rep)
    if residuals:
        out.append(("stages: " + ", ".join(residuals), list(residuals.values())))
    cands = [c.get("heldout_loss") for c in rep.get("candidates", []) if c.get("heldout_loss") is not None]
    if cands:
        out.append(("candidate networks (held-out)", cands))
    return out


def _stage_residuals(rep: dict) -> dict[str, float]:
    """The relative residual of each stage of a decomposition's learn (tensor): the CP decomposition, then the
    network's orientation and polishes on samples, in turn."""
    out: dict[str, float] = {}
    residual = (rep.get("decomposition") or {}).get("relative_residual")
    if residual is not None:
        out["decomposition"] = float(residual)
    network = rep.get("network")
    if not isinstance(network, dict):  # a learn that records the network's weights under this key
        return {}
    for key in ("orientation", "affine_polish", "polish"):
        residual = (network.get(key) or {}).get("relative_residual")
        if residual is not None:
            out[key.replace("_", " ")] = float(residual)
    return out if len(out) > 1 else {}


def learning(record: dict | None) -> Figure:
    title = "Learning curves of the last learn"
    shown = [(label, [v for v in vals if v is not None and v > 0]) for label, vals in curves(record)]
    shown = [(label, vals) for label, vals in shown if vals]
    if not shown or record is None:
        return Figure("learning", title, "no learn with stage losses recorded in this store (relulearn learn / fit)")
    fig, axes = panels(1, width=6.0, height=3.2)
    ax = axes[0]
    for i, (label, vals) in enumerate(shown):
        ax.semilogy(np.arange(1, len(vals) + 1), vals, "o-", ms=3, label=label, color=f"C{i}")
    ax.set_xlabel("stage / pass")
    ax.set_ylabel("relative loss")
    integer_axis(ax.xaxis)
    ax.legend(fontsize=8)
    return Figure(
        "learning", title, f"method {record.get('method')}, {record.get('samples', 0):,} samples", *drawn(fig)
    )


def recorded_network(record: dict) -> Any:
    from ..network import Network

    arrays = record.get("network")
    if not arrays:
        return None
    return Network.from_arrays(
        {k: (np.asarray(v, dtype=np.float64) if isinstance(v, list) else np.asarray(v)) for k, v in arrays.items()},
        origin="a learn record",
    )


def _heldout(record: dict) -> float | None:
    """The held-out loss a learn reported (a network's validation loss, a polynomial's held-out error)."""
    if record.get("validation_relative_loss") is not None:
        return float(record["validation_relative_loss"])
    summary = (record.get("report") or {}).get("summary") or {}
    got = summary.get("held_out_error")
    return None if got is None else float(got)


def samples(records: list[dict], teacher: Any | None, test: tuple[np.ndarray, np.ndarray] | None) -> Figure:
    """Test error of every recorded network on the teacher's fresh samples (with ``--teacher``), else the
    held-out loss each learn reported, against the samples the store held."""
    title = "Test error against samples, as the store was extended"
    pts, kind = [], "held-out relative loss (the learn's validation samples)"
    if teacher is not None and test is not None:
        x, y = test
        for r in records:
            net = recorded_network(r)
            if net is not None and net.input_dim == x.shape[1] and r.get("samples"):
                pred = net.forward(x)
                pred = pred[:, 0] if y.ndim == 1 else pred
                pts.append((r["samples"], float(np.mean((y - pred) ** 2) / np.mean(y**2))))
        kind = f"relative test error ({len(y):,} fresh samples of the teacher)"
    if not pts:
        pts = [
            (r["samples"], cast(float, _heldout(r))) for r in records if _heldout(r) is not None and r.get("samples")
        ]
    if not pts:
        return Figure("samples", title, "no learn recorded on this store yet")
    pts.sort()
    fig, axes = panels(1, width=5.0)
    ax = axes[0]
    n, loss = np.array(pts, dtype=float).T
    exact = loss <= 1e-30
    ax.loglog(n, np.maximum(loss, 1e-30), "o-", color="C1")
    if exact.any():
        ax.scatter(n[exact], np.full(exact.sum(), 1e-30), marker="v", color="C1", label="≤ 10⁻³⁰ (exact)")
        ax.legend(fontsize=7)
    ax.set_xlabel("samples in the store")
    ax.set_ylabel(kind.split(" (")[0])
    return Figure("samples", title, f"{len(pts)} learn(s) on this store, one point each; {kind}", *drawn(fig))
