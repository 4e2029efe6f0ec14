"""``relulearn report``: one self-contained HTML file with PNG figures of a store and what was learned from it.

Figures (each drawn when its inputs exist, else a line saying what would draw it):

1. **Spectra**: eigenvalues of the stored second-moment families (``M_2`` and contracted ``M_l^g``, filtered
   ``M_τ``), largest in magnitude first, with their error bars and the noise floor.
2. **τ grid**: the thresholds of the filtered family against ``P[|y| > τ]``.
3. **Learning curves**: the stages of the last learn on the store — held-out loss of the enumeration's stages,
   loss of the refinement's passes.
4. **Units** (``--model`` and ``--teacher``): per teacher unit, the angle to its matched learned unit and the
   output weights side by side.
5. **Samples**: every learn on the store against the samples it held (the store extended): the test error of the
   network it learned on fresh samples of ``--teacher``, or else the held-out loss it reported.

Pure plotting on numpy arrays read from the store; the figures are PNG bytes embedded as base64.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .atomic import write_text

__all__ = ["Figure", "FIGURES", "report_figures", "render_html", "write_report"]

#: the figures of a report, in order: (name, title)
FIGURES = (("spectra", "Eigenvalue spectra with error bars and noise floor"),
           ("tau", "Filter thresholds τ and P[|y| > τ]"),
           ("learning", "Learning curves of the last learn"),
           ("units", "Learned vs teacher units"),
           ("samples", "Test error against samples, as the store was extended"))

#: fresh teacher samples on which every recorded network's test error is measured
TEST_SAMPLES = 50_000

#: a distinct frame colour per figure (a screenshot test finds every figure by it)
FRAME_COLOURS = {"spectra": "#d62728", "tau": "#2ca02c", "learning": "#1f77b4", "units": "#9467bd",
                 "samples": "#ff7f0e"}


@dataclass(frozen=True)
class Figure:
    """One figure: its name, title, a caption, and its PNG bytes (None: not drawn, ``caption`` says why)."""

    name: str
    title: str
    caption: str
    png: Optional[bytes] = None


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from .errors import MissingDependencyError

        raise MissingDependencyError("relulearn report draws with matplotlib, which is not installed: "
                                     "pip install 'relulearn[report]' (or pip install matplotlib)") from None
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


# ----------------------------------------------------------------- figures


def _spectra(stats: dict) -> Figure:
    from .estimators import spectral

    title = dict(FIGURES)["spectra"]
    mats, ses, names = [], [], []
    if "contracted" in stats:
        m, s, n = spectral.matrices_from_store(stats["contracted"])
        mats, ses, names = mats + m, ses + s, names + n
    if "filtered" in stats:
        try:
            m, s, n, _ = spectral.filtered_matrices(stats["filtered"], "M_tau", "")
            mats, ses, names = mats + m, ses + s, names + n
        except ValueError:
            pass
    if not mats:
        return Figure("spectra", title, "no second-moment family in the store (contracted or filtered)")
    spectra = spectral.relevant_subspace(mats, ses, names=names).to_dict().get("spectra", [])[:6]
    plt = _plt()
    fig, axes = plt.subplots(1, len(spectra), figsize=(3.2 * len(spectra), 3.0), squeeze=False)
    for ax, sp in zip(axes[0], spectra):
        ev = np.asarray(sp["eigenvalues"], dtype=float)
        order = np.argsort(-np.abs(ev))[:20]
        ev, err = ev[order], np.asarray(sp["error_bar"], dtype=float)[order]
        ax.errorbar(np.arange(1, len(ev) + 1), ev, yerr=err, fmt="o", ms=3, capsize=2, color="C0")
        for sign in (1, -1):
            ax.axhline(sign * sp["floor"], color="C3", ls="--", lw=1)
        ax.axhline(0, color="0.6", lw=0.5)
        ax.set_title(f"{sp['name']} (rank {sp['rank']})", fontsize=9)
        ax.set_xlabel("eigenvalue index (by |λ|)", fontsize=8)
    axes[0][0].set_ylabel("eigenvalue ± error bar", fontsize=8)
    caption = (f"{len(spectra)} of {len(mats)} matrices; dashed: ± the noise floor; points outside it are the "
               "directions the spectral stage keeps")
    return Figure("spectra", title, caption, _png(fig))


def _tau(stats: dict) -> Figure:
    title = dict(FIGURES)["tau"]
    if "filtered" not in stats:
        return Figure("tau", title, "no filtered statistic in the store (statistics.filtered)")
    arrays = stats["filtered"]
    tau = np.asarray(arrays["tau"], dtype=float).reshape(-1)
    prob = np.asarray(arrays["prob"], dtype=float).reshape(-1)
    se = np.asarray(arrays["prob_se"], dtype=float).reshape(-1) if "prob_se" in arrays else None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.errorbar(tau, prob, yerr=se, fmt="o-", ms=4, capsize=2, color="C2")
    ax.set_xlabel("threshold τ")
    ax.set_ylabel("P[|y| > τ]")
    ax.set_ylim(0, 1)
    return Figure("tau", title, f"{len(tau)} thresholds of the filtered second moment M_τ = E[1{{|y| > τ}} (xxᵀ − I)]",
                  _png(fig))


def _curves(record: Optional[dict]) -> list[tuple[str, list[float]]]:
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
    steps = ref.get("iterations") or (ref.get("passes") if isinstance(ref.get("passes"), list) else [])
    passes = [p.get("relative_loss", p.get("loss")) for p in steps if isinstance(p, dict)]
    passes = [v for v in passes if v is not None]
    if passes:
        out.append(("refinement passes", passes))
    rounds = rep.get("validation_relative_loss")
    if isinstance(rounds, dict) and len(rounds) > 1:  # e.g. tensor's decomposition and its residual rounds
        out.append(("answers in turn: " + ", ".join(rounds), [v for v in rounds.values() if v is not None]))
    cands = [c.get("heldout_loss") for c in rep.get("candidates", []) if c.get("heldout_loss") is not None]
    if cands:
        out.append(("candidate networks (held-out)", cands))
    return out


def _learning(record: Optional[dict]) -> Figure:
    title = dict(FIGURES)["learning"]
    curves = [(label, [v for v in vals if v is not None and v > 0]) for label, vals in _curves(record)]
    curves = [(label, vals) for label, vals in curves if vals]
    if not curves:
        return Figure("learning", title, "no learn with stage losses recorded in this store (relulearn learn / fit)")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for i, (label, vals) in enumerate(curves):
        ax.semilogy(np.arange(1, len(vals) + 1), vals, "o-", ms=3, label=label, color=f"C{i}")
    ax.set_xlabel("stage / pass")
    ax.set_ylabel("relative loss")
    ax.legend(fontsize=8)
    return Figure("learning", title, f"method {record.get('method')}, {record.get('samples', 0):,} samples", _png(fig))


def _units(model: Optional[Any], teacher: Optional[Any]) -> Figure:
    title = dict(FIGURES)["units"]
    if model is None or teacher is None:
        return Figure("units", title, "give --model and --teacher (a network .npz or a config with a network "
                      "teacher) to compare units")
    from .network import Network, compare

    if not isinstance(model, Network) or model.depth != 1 or teacher.depth != 1:
        return Figure("units", title, "units are compared for one-hidden-layer networks")
    cmp = compare(teacher, model)
    k = teacher.weights[0].shape[0]

    def rows(net: Network) -> np.ndarray:
        w = net.weights[0] if net.biases is None else np.column_stack([net.weights[0], net.biases[0]])
        return w / np.linalg.norm(w, axis=1, keepdims=True)

    ut, ul = rows(teacher), rows(model)
    lt = teacher.weights[1][0] * np.linalg.norm(teacher.weights[0], axis=1)
    ll = model.weights[1][0] * np.linalg.norm(model.weights[0], axis=1)
    angles, lam_l = np.full(k, np.nan), np.full(k, np.nan)
    for i, j in enumerate(cmp.matching):
        if j >= 0:
            angles[i] = float(np.arccos(np.clip(ut[i] @ ul[j], -1.0, 1.0)))
            lam_l[i] = ll[j]
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3))
    a1.bar(np.arange(k), np.maximum(angles, 1e-17), color="C4")
    a1.set_yscale("log")
    a1.set_xlabel("teacher unit")
    a1.set_ylabel("angle to learned unit (rad)")
    lim = float(np.nanmax(np.abs(np.r_[lt, lam_l]))) * 1.15
    a2.plot([-lim, lim], [-lim, lim], color="0.6", lw=0.8)
    a2.scatter(lt, lam_l, color="C4", zorder=3)
    a2.set_xlabel("teacher λ‖u‖")
    a2.set_ylabel("learned λ‖u‖")
    return Figure("units", title, f"parameter error {cmp.relative_error:.3g} (up to permutation and positive "
                  "rescaling); unmatched units have no bar", _png(fig))


def _recorded_network(record: dict):
    from .network import Network

    arrays = record.get("network")
    if not arrays:
        return None
    return Network.from_arrays({k: (np.asarray(v, dtype=np.float64) if isinstance(v, list) else np.asarray(v))
                                for k, v in arrays.items()}, origin="a learn record")


def _samples(records: list[dict], teacher: Optional[Any], test: Optional[tuple[np.ndarray, np.ndarray]]) -> Figure:
    """Test error of every recorded network on the teacher's fresh samples (with ``--teacher``), else the
    held-out loss each learn reported, against the samples the store held."""
    title = dict(FIGURES)["samples"]
    pts, kind = [], "held-out relative loss (the learn's validation samples)"
    if teacher is not None and test is not None:
        x, y = test
        for r in records:
            net = _recorded_network(r)
            if net is not None and net.input_dim == x.shape[1] and r.get("samples"):
                pts.append((r["samples"], float(np.mean((y - net.forward(x)[:, 0]) ** 2) / np.mean(y**2))))
        kind = f"relative test error ({len(y):,} fresh samples of the teacher)"
    if not pts:
        pts = [(r["samples"], r["validation_relative_loss"]) for r in records
               if r.get("validation_relative_loss") is not None and r.get("samples")]
    if not pts:
        return Figure("samples", title, "no learn recorded on this store yet")
    pts.sort()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3))
    n, loss = np.array(pts, dtype=float).T
    ax.loglog(n, np.maximum(loss, 1e-32), "o-", color="C1")
    ax.set_xlabel("samples in the store")
    ax.set_ylabel(kind.split(" (")[0])
    return Figure("samples", title, f"{len(pts)} learn(s) on this store, one point each; {kind}", _png(fig))


# ------------------------------------------------------------------- html


def render_html(figures: list[Figure], heading: str, facts: list[tuple[str, str]]) -> str:
    """One self-contained page: a table of facts, then every figure (PNG as a data URL) with its caption."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(heading)}</title>",
             "<style>body{font-family:sans-serif;margin:24px;max-width:1100px}td{padding:2px 12px}"
             "figure{margin:18px 0}img{display:block;max-width:100%}figcaption{color:#444;font-size:90%}"
             "</style></head><body>", f"<h1>{html.escape(heading)}</h1><table>"]
    parts += [f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in facts]
    parts.append("</table>")
    for f in figures:
        parts.append(f"<h2>{html.escape(f.title)}</h2>")
        if f.png is None:
            parts.append(f"<p><em>Not drawn: {html.escape(f.caption)}</em></p>")
            continue
        data = base64.b64encode(f.png).decode()
        parts.append(f"<figure id='{f.name}'><img alt='{html.escape(f.title)}' src='data:image/png;base64,{data}' "
                     f"style='border:6px solid {FRAME_COLOURS[f.name]}'><figcaption>{html.escape(f.caption)}"
                     "</figcaption></figure>")
    parts.append("</body></html>")
    return "".join(parts)


def report_figures(store: str, *, model: Optional[Any] = None, teacher: Optional[Any] = None,
                   test: Optional[tuple[np.ndarray, np.ndarray]] = None) -> list[Figure]:
    """The figures of :data:`FIGURES` for ``store`` (and a learned ``model`` against a ``teacher`` network, whose
    samples ``test`` measure every recorded network)."""
    from .storage import RunStore, open_store

    run = open_store(store)
    stats = {name: run.arrays(name) for name in run.statistics}
    records = RunStore(store).records("learn")
    return [_spectra(stats), _tau(stats), _learning(records[-1] if records else None), _units(model, teacher),
            _samples(records, teacher, test)]


def write_report(store: str, out: str | Path, *, model: Optional[str] = None,
                 teacher: Optional[str] = None) -> dict[str, Any]:
    """Write the HTML report of ``store`` to ``out``; returns what was drawn and what was not (and why)."""
    from .api import status
    from .polynomial import load_model

    net = load_model(model) if model is not None else None
    t_net = _teacher_network(teacher) if teacher is not None else None
    test = None
    if t_net is not None:  # noiseless fresh samples of the teacher (the test stream, never used to learn)
        from .pipeline.sources import Stream, generator

        x = generator(0, Stream.TEST, 0).standard_normal((TEST_SAMPLES, t_net.input_dim))
        test = (x, t_net.forward(x)[:, 0])
    figs = report_figures(store, model=net, teacher=t_net, test=test)
    st = status(store)
    facts = [("store", store), ("samples", f"{st.get('samples', 0):,}"),
             ("statistics", ", ".join(st.get("statistics", []))), ("seeds", str(st.get("seeds")))]
    if model is not None:
        facts.append(("model", str(model)))
    if teacher is not None:
        facts.append(("teacher", str(teacher)))
    page = render_html(figs, f"relulearn report: {Path(store).name}", facts)
    write_text(out, page)
    return {"out": str(out), "bytes": len(page.encode()),
            "figures": [f.name for f in figs if f.png is not None],
            "not_drawn": {f.name: f.caption for f in figs if f.png is None}}


def _teacher_network(teacher: str):
    """The network of a ``.npz`` teacher, or of a config's planted/file teacher (None for a black box or data)."""
    from .config import load_config
    from .network import Network
    from .pipeline.sources import make_source

    if str(teacher).endswith(".npz"):
        return Network.load(teacher)
    return getattr(make_source(load_config(teacher)), "network", None)
