"""``relulearn report``: one self-contained HTML file with PNG figures of a store and what was learned from it.

Every store gets the common figures (each drawn when its inputs exist, else a line saying what would draw it):

1. **Spectra**: eigenvalues of the stored second-moment estimates (contracted ``M_l^g``, filtered ``M_τ``, the
   Hermite ``T_2``, the output moments' ``T_2``), largest in magnitude first, with error bars and the noise floor.
2. **τ grid**: the thresholds of the filtered family against ``P[|y| > τ]``.
3. **Learning curves**: the stages of the last learn on the store.
4. **Units** (``--model`` and ``--teacher``, one-hidden-layer networks; :mod:`.units`): per teacher unit, the
   angle to its matched learned unit, the output weights of every output side by side, and where either network
   has biases the offsets ``b/‖u‖`` and the output biases.
5. **Samples**: every learn on the store against the samples it held (the store extended): the test error of the
   network it learned on fresh samples of ``--teacher``, or else the held-out loss it reported.

and the figures of the method of its last learn (:mod:`.methods`): polynomial (error against degree), landscape
(the objective G over the optimisation, the units' angles), exact (the decomposition, the weights of every
output), filtered-pca (the filtered spectra per τ, the residual passes).

Pure plotting on numpy arrays read from the store; the figures are PNG bytes embedded as base64.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_text
from . import common, units
from ._plot import Figure, from_records, plt
from .methods import METHOD_FIGURES, method_figures

__all__ = [
    "Figure",
    "FIGURES",
    "METHOD_FIGURES",
    "method_figures",
    "report_figures",
    "render_html",
    "write_report",
    "plt",
]

#: the common figures of every report, in order: (name, title)
FIGURES = (
    ("spectra", "Eigenvalue spectra with error bars and noise floor"),
    ("tau", "Filter thresholds τ and P[|y| > τ]"),
    ("learning", "Learning curves of the last learn"),
    ("units", "Learned vs teacher units"),
    ("samples", "Test error against samples, as the store was extended"),
)

#: fresh teacher samples on which every recorded network's test error is measured
TEST_SAMPLES = 50_000

# ------------------------------------------------------------------- html


def render_html(figures: list[Figure], heading: str, facts: list[tuple[str, str]]) -> str:
    """One self-contained page: a table of facts, then every figure (PNG as a data URL) with its caption, each
    drawn in a ``<figure>`` whose id is the figure's name."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(heading)}</title>",
        "<style>body{font-family:sans-serif;margin:24px;max-width:1100px}td{padding:2px 12px}"
        "figure{margin:18px 0}img{display:block;max-width:100%}figcaption{color:#444;font-size:90%}"
        "</style></head><body>",
        f"<h1>{html.escape(heading)}</h1><table>",
    ]
    parts += [f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in facts]
    parts.append("</table>")
    for f in figures:
        parts.append(f"<h2>{html.escape(f.title)}</h2>")
        if f.png is None:
            parts.append(f"<p><em>Not drawn: {html.escape(f.caption)}</em></p>")
            continue
        data = base64.b64encode(f.png).decode()
        parts.append(
            f"<figure id='{f.name}'><img alt='{html.escape(f.title)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(f.caption)}</figcaption></figure>"
        )
    parts.append("</body></html>")
    return "".join(parts)


def report_figures(
    store: str,
    *,
    model: Any | None = None,
    teacher: Any | None = None,
    test: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[Figure]:
    """The figures of :data:`FIGURES` and of the last learn's method for ``store`` (and a learned ``model``
    against a ``teacher`` network, whose samples ``test`` measure every recorded network)."""
    return _figures(store, model=model, teacher=teacher, test=test)[0]


def _figures(
    store: str,
    *,
    model: Any | None,
    teacher: Any | None,
    test: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[list[Figure], dict[str, Any]]:
    """:func:`report_figures` and the summary of the commit they draw: every family and the ledger are read
    through one handle, so from one commit (the store opened again when a writer's commits delete it meanwhile:
    :func:`~relulearn.storage.read_one_commit`)."""
    from ..storage import RunStore, read_one_commit

    run, stats = read_one_commit(store, lambda run: (run, run.all_arrays()))
    records = RunStore(store).records("learn")  # (kept beside the generations: no commit touches them)
    last = records[-1] if records else None
    figures = [
        common.spectra(stats),
        common.tau(stats),
        *method_figures(last),
        from_records("learning", lambda: common.learning(last), last),
        units.figure(model, teacher),
        from_records("samples", lambda: common.samples(records, teacher, test)),
    ]
    return figures, run.summary()


def write_report(
    store: str, out: str | Path, *, model: str | None = None, teacher: str | None = None
) -> dict[str, Any]:
    """Write the HTML report of ``store`` to ``out``; returns what was drawn and what was not (and why)."""
    from ..polynomial import load_model

    net = load_model(model) if model is not None else None
    t_net = _teacher_network(teacher) if teacher is not None else None
    test = None
    if t_net is not None:  # noiseless fresh samples of the teacher (the test stream, never used to learn)
        from ..pipeline.sources import Stream, generator

        x = generator(0, Stream.TEST, 0).standard_normal((TEST_SAMPLES, t_net.input_dim))
        y = t_net.forward(x)
        test = (x, y[:, 0] if y.shape[1] == 1 else y)
    figs, st = _figures(store, model=net, teacher=t_net, test=test)
    facts = [
        ("store", store),
        ("samples", f"{st['samples']:,}"),
        ("statistics", ", ".join(st["statistics"])),
        ("seeds", str(st["seeds"])),
    ]
    if model is not None:
        facts.append(("model", str(model)))
    if teacher is not None:
        facts.append(("teacher", str(teacher)))
    page = render_html(figs, f"relulearn report: {Path(store).name}", facts)
    write_text(out, page)
    return {
        "out": str(out),
        "bytes": len(page.encode()),
        "figures": [f.name for f in figs if f.png is not None],
        "not_drawn": {f.name: f.caption for f in figs if f.png is None},
        "overlaps": {f.name: list(f.overlaps) for f in figs if f.overlaps},
    }


def _teacher_network(teacher: str):
    """The network of a ``.npz`` teacher, or of a config's planted/file teacher (None for a black box or data)."""
    from ..config import load_config
    from ..network import Network
    from ..pipeline.sources import make_source

    if str(teacher).endswith(".npz"):
        return Network.load(teacher)
    return getattr(make_source(load_config(teacher)), "network", None)
